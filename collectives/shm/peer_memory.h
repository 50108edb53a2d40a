// Internal: reading another process's memory on this host (Linux cross-memory attach,
// process_vm_readv), so that a shared-memory all-gather copies each element once, straight from
// the peer's input into this rank's output, instead of through the segment.
//
// The kernel allows it when this process may ptrace the peer (same user; with Yama's ptrace_scope
// 1, Ubuntu's default, only from an ancestor, which sibling ranks are not; containers may also
// refuse the call). probe_peer_reads() finds out at connect time by reading a word whose value
// the peer published; the caller keeps the two-copy path when any rank cannot read every peer.
//
// Thread-safety: free functions, any thread. Errors: read_peer_memory() throws PeerLostError when
// the peer process is gone and CommError for any other failure (the peer's buffer unmapped, or
// permission withdrawn); a retry cannot fix either within the op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::detail {

// Copies `bytes` at address `from` in process `pid` into `to`. `whom` names the peer in errors.
void read_peer_memory(int pid, uint64_t from, void* to, size_t bytes, const std::string& whom);

// A word this process publishes for peers to probe: "<pid> <address> <value>", valid while
// the returned object lives.
class PeerReadProbe {
 public:
  PeerReadProbe();
  std::string published() const;
  // Whether this process can read the word that `published` (a peer's published()) describes
  // and finds the value it names (not so when the peer's pid is from another pid namespace).
  static bool can_read(const std::string& published);

 private:
  volatile uint64_t word_;
};

}  // namespace tandem::detail
