// tandem::run_main and tandem::heartbeat: the worker side of tandemrun's fault tolerance.
//
//   int main(int argc, char** argv) {
//     return tandem::run_main(argc, argv, [](int argc, char** argv) {
//       auto dist = tandem::init(tandem::InitOptions::from_env());
//       for (...) { train_step(); tandem::heartbeat(); }
//       return 0;
//     });
//   }
//
// run_main() records why a worker died where the launcher can read it: TORCHELASTIC_ERROR_FILE,
// in TorchElastic's JSON format (the one torch.distributed.elastic's @record writes):
//
//   {"message": {"message": "<Type>: <what>",
//                "extraInfo": {"py_callstack": "<text>", "timestamp": "<unix seconds>",
//                              "kind": "<what failed>", "restartable": <bool>}}}
//
// tandemrun sets that variable per worker, prints the message as the failure's root cause, and
// restarts only what `restartable` allows (tandem::Error::restartable(); base/launch_contract.h);
// torchrun reads the same file. See docs/launcher.md.
//
// Ownership: run_main owns the fatal-signal handlers (and their alternate stack) for the duration
// of the call; the error file is replaced atomically (written beside it, then renamed).
// Thread-safety: call run_main once, from main(); heartbeat() is thread-safe.
// Errors: run_main throws nothing: exceptions become exit code 1 (2 for configuration errors)
// and an error file; heartbeat() throws nothing; write_error_file() returns false on failure.
#pragma once

#include <functional>
#include <string>
#include <type_traits>

namespace tandem {

class Context;  // tandem/runtime/context.h

// Runs `fn(argc, argv)` and returns its exit code.
//  - An exception escaping fn: "<Type>: <what>" goes to stderr and to TORCHELASTIC_ERROR_FILE (when
//    set); returns 1. When that exception is a CommError other than a TimeoutError (a peer left
//    or died) and TORCHELASTIC_ERROR_FILE is set, the error file is written and run_main returns
//    2 s later, so the launcher sees the peer that failed first as the root cause.
//  - A fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) while fn runs: an async-signal-safe
//    handler writes an error file naming the signal, then the signal is re-raised with its default
//    action (the process still dies of it, core dump included).
//  - Under `tandemrun --standby`, a process started ahead of a restart waits here, before fn and
//    before anything reads the environment, until tandemrun hands it its worker environment
//    (TANDEM_STANDBY_FD); it exits 0 quietly when tandemrun does not need it. Without that
//    variable nothing waits. Code in main() before run_main runs before the environment is set.
// Call it once, from main(). Handlers are installed for the duration of the call only.
int run_main(int argc, char** argv, const std::function<int(int, char**)>& fn);

// The same, with a Context (tandem/runtime/context.h): tandem's flags (--config FILE, --set K=V,
// --print-config, --help-config; docs/config.md) are taken out of argv, the config is loaded from
// them and the TANDEM_* environment, the world is connected, then fn(ctx) runs.
//  - --help-config prints every key with its default and doc; --print-config prints the effective
//    config as YAML with each value's source (rank 0 only); both return 0 without running fn.
//  - A config error (InvalidConfigError, or a ConfigError while the Context is built) is reported
//    like an exception above but returns 2, so scripts tell "fix the config" from a crash.
int run_main(int argc, char** argv, const std::function<int(Context&)>& fn);

// For `[](tandem::Context& ctx) { ... }` with no return value: returns 0 when fn returns.
template <class F, std::enable_if_t<std::is_invocable_v<F&, Context&> &&
                                        std::is_void_v<std::invoke_result_t<F&, Context&>>,
                                    int> = 0>
int run_main(int argc, char** argv, F fn) {
  return run_main(argc, argv, std::function<int(Context&)>([&fn](Context& ctx) {
                    fn(ctx);
                    return 0;
                  }));
}

// Tells the launcher this worker makes progress. Call it every training step: it costs one clock
// read, and touches the file named by TANDEM_HEARTBEAT_FILE at most every 100 ms (nothing at all
// when the variable is unset, i.e. without `tandemrun --heartbeat-timeout`). After a worker's
// first heartbeat, tandemrun treats it as hung (failed) when no heartbeat follows within
// --heartbeat-timeout seconds. Thread-safe. Throws nothing (a failing touch is ignored: the
// launcher then sees silence and restarts the group, the safe side).
void heartbeat() noexcept;

// Writes `message` (e.g. "RuntimeError: what went wrong") to TORCHELASTIC_ERROR_FILE in the format
// above, for programs that end themselves without an exception. Returns false when the variable is
// unset or the file cannot be written.
bool write_error_file(const std::string& message, const std::string& callstack = "");

}  // namespace tandem
