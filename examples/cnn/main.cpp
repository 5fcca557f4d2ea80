// oversized_cnn: trains a small ResNet-style network on procedurally generated images through a
// Spillway Session, with a device budget that may be far below the model's footprint.
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/program.hpp"

int main(int argc, char** argv) {
  using namespace spillway::examples;
  program_spec spec;
  spec.name = "oversized_cnn";
  spec.description = "train a ResNet-style CNN on generated images, larger than the device memory it is given";
  spec.make = [](const example_options& o) { return make_cnn(o); };
  return run_program(argc, argv, spec);
}
