// The command line shared by the training workers of the fault tests and the recovery benchmark
// (tests/fault/fault_worker, tests/fault/elastic_worker, bench/recovery/recovery_worker):
//   --ckpt DIR  --out FILE  --steps N  --every K
// parsed with CLI11. A bad flag throws CLI::ParseError (a std::runtime_error): the worker's
// tandem::run_main reports it like any other exception.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace tandem::testing {

struct TrainingArgs {
  std::string ckpt;     // checkpoint directory
  std::string out;      // rank 0 writes the final parameters' raw bytes here ("": nowhere)
  int64_t steps = 12;   // training steps
  int64_t every = 3;    // a checkpoint every this many steps
};

// Adds the shared options to `app`; the defaults are `args`' current values.
inline void add_training_args(CLI::App& app, TrainingArgs& args) {
  app.add_option("--ckpt", args.ckpt, "checkpoint directory");
  app.add_option("--out", args.out, "where rank 0 writes the final parameters' bytes");
  app.add_option("--steps", args.steps, "training steps")->capture_default_str();
  app.add_option("--every", args.every, "checkpoint interval in steps")->capture_default_str();
}

}  // namespace tandem::testing
