// Shared main of the example programs: parse, train with progress, summarise, report.
// Errors are printed with the program's name and give exit code 2.
#include "examples/common/program.hpp"

#include <cstdio>
#include <exception>
#include <iostream>

#include "device/error.hpp"
#include "device/log.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/report.hpp"
#include "examples/common/shares.hpp"

namespace spillway::examples {

int run_program(int argc, char** argv, const program_spec& spec) {
  CLI::App app{spec.name + ": " + spec.description};
  flag_values flags;
  flags.data = spec.default_data;
  add_common_flags(app, flags, spec.takes_data);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  set_log_sink([](log_level level, const std::string& msg) {
    if (level >= log_level::warning) std::cerr << "spillway " << to_string(level) << ": " << msg << "\n";
  });
  try {
    const example_options o = to_options(flags);
    const auto r = train(
        o, [&] { return spec.make(o); },
        [&](int step, float loss, const iteration_report& rep) {
          std::cout << format_step(step, o.steps, loss, rep) << std::endl;
        },
        [&](const run_result& start) { std::cout << format_header(start) << std::endl; });
    std::cout << "\n" << format_summary(r);
    if (!flags.report.empty()) {
      write_report(r, flags.report);
      std::cout << "report        " << flags.report << "\n";
    }
    std::cout.flush();
    if (!r.chrome_trace_error.empty()) {
      std::cerr << spec.name << ": " << r.chrome_trace_error << "\n";
      end_data_parallel_job(2);
      return 2;
    }
    return 0;
  } catch (const spillway::error& e) {
    std::cout.flush();
    std::cerr << spec.name << ": " << e.what() << "\n";
    end_data_parallel_job(2);  // the other ranks would wait for this one
    return 2;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << spec.name << ": unexpected error: " << e.what() << "\n";
    end_data_parallel_job(2);
    return 2;
  }
}

}  // namespace spillway::examples
