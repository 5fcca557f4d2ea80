// spillway-bench: one program, one subcommand per benchmark (tiers, plan, replay, train, ...).
// Each subcommand prints a table, can write JSON, and reports its targets against baselines.
#include <algorithm>
#include <iostream>

#include "bench/command.hpp"
#include "device/error.hpp"

namespace spillway::bench {
std::vector<command_entry>& command_registry() {
  static std::vector<command_entry> registry;
  return registry;
}
}  // namespace spillway::bench

int main(int argc, char** argv) {
  using namespace spillway::bench;
  CLI::App app{"spillway-bench: measure Spillway's allocators, tiers, planners and training"};
  app.require_subcommand(1);
  int exit_code = 0;
  auto& entries = command_registry();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& e : entries) e.factory(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const spillway::error& e) {
    std::cerr << "spillway-bench: " << e.what() << "\n";
    return 2;
  }
  return exit_code;
}
