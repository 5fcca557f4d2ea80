// oversized_gpt: trains a GPT-style decoder on a text file (bytes as tokens) through a Spillway
// Session, with a device budget that may be far below the model's footprint.
#include "examples/common/program.hpp"
#include "examples/gpt/gpt_model.hpp"

int main(int argc, char** argv) {
  using namespace spillway::examples;
  program_spec spec;
  spec.name = "oversized_gpt";
  spec.description = "train a GPT-style decoder on text, larger than the device memory it is given";
  spec.takes_data = true;
  spec.default_data = SPILLWAY_EXAMPLES_DATA_DIR "/corpus.txt";
  spec.make = [](const example_options& o) { return make_gpt(o); };
  return run_program(argc, argv, spec);
}
