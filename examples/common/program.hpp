// The body of every example program: flags, the run with a progress line per step, the summary
// and the JSON report. Program code: it prints (the model library never does).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "examples/common/options.hpp"
#include "examples/common/trainer.hpp"

namespace spillway::examples {

struct program_spec {
  std::string name;         ///< "oversized_gpt"
  std::string description;  ///< one line for --help
  bool takes_data = false;  ///< has --data
  std::string default_data; ///< --data default
  std::function<std::unique_ptr<model>(const example_options&)> make;
};

/// Parses the flags, trains, prints progress and the summary, writes --report. Returns the exit
/// code: 0, 1 on a CLI error, 2 on a Spillway error (its message printed).
int run_program(int argc, char** argv, const program_spec& spec);

}  // namespace spillway::examples
