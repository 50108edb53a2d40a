#include "collectives/shm/peer_memory.h"

#include <tandem/base/errors.h>

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

namespace tandem::detail {

namespace {

// One process_vm_readv until all `bytes` arrived (the kernel may stop early at a page it
// cannot read from the peer); errno is left set when it returns false.
bool read_all(int pid, uint64_t from, char* to, size_t bytes) {
  while (bytes > 0) {
    iovec local{to, bytes};
    iovec remote{reinterpret_cast<void*>(from), bytes};
    const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EFAULT;
      return false;
    }
    to += n;
    from += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void read_peer_memory(int pid, uint64_t from, void* to, size_t bytes, const std::string& whom) {
  if (read_all(pid, from, static_cast<char*>(to), bytes)) return;
  const int err = errno;
  const std::string what = "shared-memory allgather: reading " + std::to_string(bytes) +
                           " bytes of " + whom + "'s input (pid " + std::to_string(pid) +
                           ") failed: " + std::strerror(err);
  if (err == ESRCH) throw PeerLostError(what + " (its process is gone)");
  throw CommError(what);
}

PeerReadProbe::PeerReadProbe() {
  std::random_device rd;
  word_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::string PeerReadProbe::published() const {
  return std::to_string(::getpid()) + " " +
         std::to_string(reinterpret_cast<uintptr_t>(const_cast<uint64_t*>(&word_))) + " " +
         std::to_string(word_);
}

bool PeerReadProbe::can_read(const std::string& published) {
  std::istringstream in(published);
  int pid = 0;
  uint64_t address = 0, value = 0;
  uint64_t seen = 0;
  return (in >> pid >> address >> value) &&
         read_all(pid, address, reinterpret_cast<char*>(&seen), sizeof seen) && seen == value;
}

}  // namespace tandem::detail
