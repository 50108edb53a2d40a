// Starting one program as a worker process: fork + exec in its own process group, with
// PR_SET_PDEATHSIG=SIGKILL, stdin from `stdin_fd`, stdout and stderr into fresh pipes.
//
// The child makes only async-signal-safe calls between fork() and execve(), so this is safe from
// a process that runs threads (the multi-node store's); it must be called from the main thread
// (PR_SET_PDEATHSIG fires when the forking *thread* exits). Ownership: the caller owns the
// returned pipes and must reap the process. Errors: tandem::Error naming `who`, the program and
// the step that failed (fork, setpgid, prctl, dup2, execve) with what to check.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "tools/tandemrun/launch/fd_io.h"

namespace tandem::launcher {

// A started program: its pid (= its process group id) and the read ends of its output pipes.
struct LaunchedProcess {
  pid_t pid = -1;
  UniqueFd out, err;
};

struct LaunchSpec {
  std::string path;               // what is executed (resolved like execvp)
  std::vector<std::string> argv;  // argv[0] first
  std::vector<std::string> env;   // "KEY=VALUE"
  int stdin_fd = -1;
  int keep_fd = -1;  // >= 0: stays open across exec (the standby's control socket)
  std::string who;   // "rank 3", "the standby of local rank 0": named in errors
};

// Returns once the program has exec'd; throws (see above) when it could not be.
LaunchedProcess launch_process(LaunchSpec spec);

}  // namespace tandem::launcher
