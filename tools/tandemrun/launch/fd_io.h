// Small POSIX file-descriptor helpers used by tandemrun: an owning fd, full writes, pipes.
//
// Not thread-safe by themselves; tandemrun is single-threaded (one poll loop), so nothing here
// needs locking.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace tandem::launcher {

// Owns one file descriptor and closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the current descriptor (if any) and takes `fd`.
  void reset(int fd = -1);
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// The two ends of a pipe, both close-on-exec (a child keeps only what it dup2()s onto 0/1/2).
struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// Creates a close-on-exec pipe; throws tandem::Error on failure.
Pipe make_pipe();

// Sets O_NONBLOCK on `fd`; throws tandem::Error on failure.
void set_nonblocking(int fd);

// Writes all of `data` to `fd`, retrying on EINTR and waiting (bounded) on EAGAIN. Returns false
// when the reader is gone or the write fails; callers drop output then rather than die
// (tandemrun must keep supervising workers even when nobody reads its output).
bool write_all(int fd, const char* data, std::size_t size);
inline bool write_all(int fd, const std::string& text) {
  return write_all(fd, text.data(), text.size());
}

// Prints "tandemrun: <message>\n" to stderr in one write.
void log_line(const std::string& message);

// Makes sure descriptors 0, 1 and 2 are open (on /dev/null if they were closed), so pipes created
// later never land on them and confuse the dup2() calls in a child.
void ensure_standard_fds();

}  // namespace tandem::launcher
