// oversized_mlp: trains a deep, wide MLP to imitate a fixed random teacher network through a
// Spillway Session, with a device budget that may be far below the model's footprint.
#include "examples/common/program.hpp"
#include "examples/mlp/mlp_model.hpp"

int main(int argc, char** argv) {
  using namespace spillway::examples;
  program_spec spec;
  spec.name = "oversized_mlp";
  spec.description = "train a deep, wide MLP on a random teacher, larger than the device memory it is given";
  spec.make = [](const example_options& o) { return make_mlp(o); };
  return run_program(argc, argv, spec);
}
