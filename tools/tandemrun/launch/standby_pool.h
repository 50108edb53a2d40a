// Standby workers: processes started ahead of the next attempt, one per local rank, that load the
// program and its libraries and wait in tandem::run_main for their worker environment
// (TANDEM_STANDBY_FD; docs/launcher.md "Standby workers"). A restart hands each its environment
// instead of starting a process, so it costs no process start and no library loading.
//
// Also the two checks behind the default (standby on with --max-restarts > 0): whether a program
// waits in run_main at all (read from its ELF symbols, before anything is started), and whether
// the machine has the memory to spare.
//
// Ownership: the pool owns its processes; an unused one is SIGKILLed and reaped by discard() or
// the destructor. Thread-safety: one thread. Errors: none thrown; a standby that cannot be
// started or activated is logged and the worker is started normally.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "tools/tandemrun/launch/fd_io.h"
#include "tools/tandemrun/launch/process_launch.h"

namespace tandem::launcher {

class StandbyPool {
 public:
  StandbyPool() = default;
  ~StandbyPool() { discard(); }
  StandbyPool(const StandbyPool&) = delete;
  StandbyPool& operator=(const StandbyPool&) = delete;

  // Discards what is left, then starts `count` standbys of `program` (its env as they load:
  // tandemrun's own plus what libraries read while loading; TANDEM_STANDBY_FD is added). On a
  // failure it logs why and keeps none.
  void start(int count, const LaunchSpec& program);
  // Hands `env` to local rank's standby: its process once it acknowledged, nullopt (the standby
  // is discarded) when there is none or it died or did not answer (the program does not wait in
  // tandem::run_main).
  std::optional<LaunchedProcess> activate(int local_rank, const std::vector<std::string>& env);
  // Starts a new standby for `local_rank` when its own was activated (--ft-replace: the rank's
  // next replacement is as fast as the first). Nothing when the pool holds none for it.
  void restock(int local_rank);
  // SIGKILLs and reaps every unused standby.
  void discard();
  std::size_t size() const { return standby_.size(); }

 private:
  struct Standby {
    LaunchedProcess process;
    UniqueFd control;  // our end of a socket pair; closing it unused tells the process to exit
    bool used = false;  // activated: the slot may be restocked
  };
  // Starts the standby of `local_rank` with program_; throws tandem::Error.
  Standby launch(int local_rank) const;

  std::vector<Standby> standby_;  // by local rank
  LaunchSpec program_;            // what start() was given
};

// True when the ELF file at `path` refers to tandem::run_main (either overload) in its dynamic
// or static symbol table: the program then waits for a standby's environment. False for scripts,
// stripped static programs and anything unreadable (the default then keeps no standby).
bool program_calls_run_main(const std::string& path);

// Why `count` standbys should not be kept now, or nullopt when memory allows them: the memory
// available (MemAvailable, or this cgroup's limit minus its usage when lower) must stay above a
// tenth of the total after `count` × 256 MiB (a parked libtorch program measured 159 MB resident,
// 58 MB of it private).
std::optional<std::string> standby_memory_shortage(int count);

}  // namespace tandem::launcher
