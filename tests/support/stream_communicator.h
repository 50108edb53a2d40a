// A CPU stand-in for the way a GPU backend (NCCL) runs communication, over a real communicator,
// for CPU tests of what CPU backends hide: every op of the wrapper runs on one thread of its own
// (its "stream"), in issue order, one at a time, no sooner than `lag` after its issue and taking
// `per_kib` for each KiB of its tensors (a wire of that speed); a send_recv() batch runs its ops
// together. Without tags (tags = false) it is NCCL's point to
// point: a tag other than 0 is refused (CommError), p2p_tags() is false, a pair's ops match in
// posting order, and a send holds the stream until the peer's receive has run (each receive
// answers its send on a tag of its own). Work::wait() returns at once (rethrowing an error the op
// already had) as NCCL's, which only orders the caller's stream - unless `host_waits`, which
// makes it block until the op ran, as a consumer stream would. wait(timeout) always blocks until
// the op ran, and throws TimeoutError past `timeout`.
// Ownership: shares the inner communicator. Thread-safety: as communicator.h; `on_start` runs on
// the stream thread. Errors: those of the inner communicator, delivered through the ops' Work.
#pragma once

#include <tandem/collectives/communicator.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace tandem::testing {

struct StreamOptions {
  std::chrono::milliseconds lag{0};  // how long an op waits after its issue before it runs
  std::chrono::nanoseconds per_kib{0};  // how long each KiB of an op's tensors takes
  bool host_waits = true;            // Work::wait() blocks until the op ran
  bool tags = true;                  // false: no message tags, rendezvous sends (NCCL)
  // Called on the stream thread before each op runs, with its name ("allreduce", "send_recv").
  std::function<void(const std::string& op)> on_start;
};

std::shared_ptr<Communicator> make_stream_communicator(std::shared_ptr<Communicator> inner,
                                                       StreamOptions options);

}  // namespace tandem::testing
