#include "tools/tandemrun/launch/fd_io.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <tandem/base/errors.h>

namespace tandem::launcher {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(std::string("pipe2() failed: ") + std::strerror(errno) +
                "; too many open files? raise `ulimit -n`");
  }
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw Error(std::string("fcntl(O_NONBLOCK) failed: ") + std::strerror(errno));
  }
}

bool write_all(int fd, const char* data, std::size_t size) {
  int stalls = 0;
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
      stalls = 0;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && stalls < 100) {
      // Our stdout may be a non-blocking descriptor we inherited; wait a little for room, but
      // never forever (10 s in total), so a stuck reader cannot stop us supervising workers.
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      ++stalls;
      continue;
    }
    return false;  // EPIPE (SIGPIPE is ignored) or another error: drop the rest.
  }
  return true;
}

void log_line(const std::string& message) {
  write_all(STDERR_FILENO, "tandemrun: " + message + "\n");
}

void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    // open() returns the lowest free descriptor, which is `fd` here.
    const int opened = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened >= 0 && opened != fd) ::close(opened);
  }
}

}  // namespace tandem::launcher
