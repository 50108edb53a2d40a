// How the examples read their own flags (CLI11): --help prints the usage and exits 0; a bad flag
// prints the error and the usage and exits 2, the status tandem::run_main gives a configuration
// error (fix the command line; tandemrun does not restart it), not CLI11's own 1xx codes.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>

namespace examples {

// -1 when the flags parsed (go on), else the exit status to return from main.
inline int parse_flags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    app.exit(e);                                     // the error, on stderr
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
}

}  // namespace examples
