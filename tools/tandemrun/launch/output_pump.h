// Forwards worker stdout/stderr to tandemrun's own stdout/stderr, one "[rank R]: " prefix per line,
// and/or to a log file per stream (--redirects/--tee: the worker's bytes unchanged).
//
// Single-threaded: the owner polls the descriptors from poll_fds() and calls on_ready() for each
// that is readable. Only whole lines are written (a batch per read), so lines of different workers
// never mix inside a line; their order across workers is the order tandemrun read them in.
#pragma once

#include <poll.h>

#include <cstddef>
#include <string>
#include <vector>

#include "tools/tandemrun/launch/fd_io.h"

namespace tandem::launcher {

// Where one worker stream goes: the console (prefixed lines), a log file (raw bytes), both, or
// nowhere (read and dropped, so the worker never blocks on a full pipe).
struct StreamSink {
  bool console = true;
  UniqueFd file;  // not valid: no file
};

class OutputPump {
 public:
  // Lines longer than `max_line` bytes are cut into several prefixed lines so a worker that never
  // writes a newline cannot grow the buffer without bound.
  explicit OutputPump(int stdout_fd = 1, int stderr_fd = 2, std::size_t max_line = 64 * 1024);

  // Takes the read ends of worker `key`'s stdout and stderr pipes (made non-blocking here).
  // Console lines are prefixed with "[rank <rank>]: ".
  void add_worker(int key, int rank, UniqueFd stdout_read, UniqueFd stderr_read,
                  StreamSink stdout_sink = {}, StreamSink stderr_sink = {});

  // Appends one POLLIN entry per open stream.
  void append_poll_fds(std::vector<pollfd>& fds) const;

  // Reads what is available on `fd` (one of ours, reported readable or hung up by poll) and writes
  // out every complete line; at end-of-file flushes a partial last line and closes the stream.
  void on_ready(int fd);

  // For a worker that has exited: reads everything it left in its pipes (bounded, never blocks),
  // flushes partial last lines (a newline is added) and closes both streams. Whatever a
  // leftover child of the worker writes later is dropped.
  void drain_worker(int key);

  // drain_worker() for every worker still open.
  void drain_all();

  bool has_open_streams() const { return !streams_.empty(); }

 private:
  struct Stream {
    int key;
    UniqueFd fd;
    int dest;             // our stdout or stderr
    bool console;         // write prefixed lines to `dest`
    UniqueFd file;        // log file (raw bytes) when valid
    std::string prefix;   // "[rank R]: "
    std::string pending;  // bytes after the last newline
  };

  // Reads once; returns false at end-of-file or on a read error (the stream is then finished).
  bool read_some(Stream& stream, bool* got_data);
  void emit(Stream& stream, const char* data, std::size_t size);
  void flush_partial(Stream& stream);

  int stdout_fd_;
  int stderr_fd_;
  std::size_t max_line_;
  std::vector<Stream> streams_;
  std::string out_;  // scratch buffer for one batch of prefixed lines
};

}  // namespace tandem::launcher
