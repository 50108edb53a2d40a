#include "tools/tandemrun/launch/output_pump.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tandem::launcher {
namespace {

constexpr std::size_t kReadChunk = 64 * 1024;
// drain_worker() reads at most this much per stream: enough for everything an exited worker left
// in its pipe (64 KiB by default), small enough that a chatty leftover child cannot stall us.
constexpr std::size_t kDrainLimit = 4 * 1024 * 1024;

}  // namespace

OutputPump::OutputPump(int stdout_fd, int stderr_fd, std::size_t max_line)
    : stdout_fd_(stdout_fd), stderr_fd_(stderr_fd), max_line_(std::max<std::size_t>(max_line, 1)) {}

void OutputPump::add_worker(int key, int rank, UniqueFd stdout_read, UniqueFd stderr_read,
                            StreamSink stdout_sink, StreamSink stderr_sink) {
  const std::string prefix = "[rank " + std::to_string(rank) + "]: ";
  set_nonblocking(stdout_read.get());
  set_nonblocking(stderr_read.get());
  streams_.push_back(Stream{key, std::move(stdout_read), stdout_fd_, stdout_sink.console,
                            std::move(stdout_sink.file), prefix, {}});
  streams_.push_back(Stream{key, std::move(stderr_read), stderr_fd_, stderr_sink.console,
                            std::move(stderr_sink.file), prefix, {}});
}

void OutputPump::append_poll_fds(std::vector<pollfd>& fds) const {
  for (const auto& s : streams_) fds.push_back(pollfd{s.fd.get(), POLLIN, 0});
}

void OutputPump::on_ready(int fd) {
  auto it = std::find_if(streams_.begin(), streams_.end(),
                         [fd](const Stream& s) { return s.fd.get() == fd; });
  if (it == streams_.end()) return;
  bool got_data = false;
  if (!read_some(*it, &got_data)) {
    flush_partial(*it);
    streams_.erase(it);
  }
}

void OutputPump::drain_worker(int key) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    if (it->key != key) {
      ++it;
      continue;
    }
    std::size_t budget = kDrainLimit;
    bool got_data = true;
    while (got_data && budget > 0 && read_some(*it, &got_data)) {
      budget = budget > kReadChunk ? budget - kReadChunk : 0;
    }
    flush_partial(*it);
    it = streams_.erase(it);
  }
}

void OutputPump::drain_all() {
  while (!streams_.empty()) drain_worker(streams_.front().key);
}

bool OutputPump::read_some(Stream& stream, bool* got_data) {
  char buffer[kReadChunk];
  *got_data = false;
  for (;;) {
    const ssize_t n = ::read(stream.fd.get(), buffer, sizeof(buffer));
    if (n > 0) {
      *got_data = true;
      emit(stream, buffer, static_cast<std::size_t>(n));
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // nothing now, still open
    return false;                                                         // EOF or error
  }
}

void OutputPump::emit(Stream& stream, const char* data, std::size_t size) {
  if (stream.file.valid() && !write_all(stream.file.get(), data, size)) {
    log_line("cannot write a worker log file (" + std::string(std::strerror(errno)) +
             "); dropping the rest of that stream's file copy");
    stream.file.reset();
  }
  if (!stream.console) return;
  out_.clear();
  std::size_t start = 0;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] != '\n') continue;
    out_ += stream.prefix;
    out_.append(stream.pending);
    out_.append(data + start, i - start + 1);
    stream.pending.clear();
    start = i + 1;
  }
  stream.pending.append(data + start, size - start);
  while (stream.pending.size() >= max_line_) {  // cut an over-long line
    out_ += stream.prefix;
    out_.append(stream.pending, 0, max_line_);
    out_ += '\n';
    stream.pending.erase(0, max_line_);
  }
  if (!out_.empty()) write_all(stream.dest, out_);  // one write per batch of whole lines
}

void OutputPump::flush_partial(Stream& stream) {
  if (stream.pending.empty() || !stream.console) return;
  write_all(stream.dest, stream.prefix + stream.pending + "\n");
  stream.pending.clear();
}

}  // namespace tandem::launcher
