// FileSystem: the one seam through which tandem writes files that must survive a crash
// (training-state checkpoints, timelines, error files).
//
// Like leveldb's Env, every OS call of the checkpoint writer and loader goes through this
// interface, so tests can inject torn writes, ENOSPC, fsync failures and crashes between any two
// steps of the commit protocol (tests/support/fault_injection_file_system.h), and users can plug
// in another storage layer (CheckpointManagerOptions::file_system). posix_file_system() is the
// real one. Ownership: shared (std::shared_ptr); files are owned by their unique_ptr.
//
// Errors: every method throws FileError naming the operation, the path and the OS error
// (strerror) on failure; it never returns a silent partial result. A "crash" injected by a test
// throws CrashError (a FileError) instead. The checkpoint layer hands its callers these as
// CheckpointError (checkpoint/checkpoint_file_system.h); a crash stays a CrashError.
//
// Thread-safety: a FileSystem may be used from several threads at once (the async writer and the
// training thread); one WritableFile/ReadableFile is used by one thread at a time.
#pragma once

#include <tandem/base/errors.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Thrown by FaultInjectionFileSystem when it simulates the process dying mid-protocol.
class CrashError : public FileError {
 public:
  using FileError::FileError;
};

// A file opened for writing from offset 0 (created or truncated).
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends all `n` bytes (retrying short writes) or throws.
  virtual void append(const void* data, size_t n) = 0;
  // fsync(2): the data written so far is durable when this returns.
  virtual void sync() = 0;
  // Closes the file; errors from close(2) throw. The destructor closes silently if not closed.
  virtual void close() = 0;
};

// A file opened for reading at arbitrary offsets.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly `n` bytes at `offset` into `dst`; a short file throws FileError.
  virtual void read(uint64_t offset, size_t n, void* dst) = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual std::unique_ptr<WritableFile> new_writable_file(const std::string& path) = 0;
  virtual std::unique_ptr<ReadableFile> open_readable(const std::string& path) = 0;
  // rename(2): atomic replace of `to` (files; directories only onto a missing name).
  virtual void rename(const std::string& from, const std::string& to) = 0;
  // fsync on the directory itself, making creations, renames and removals in it durable.
  virtual void sync_dir(const std::string& path) = 0;
  // mkdir -p; an existing directory is fine.
  virtual void create_dirs(const std::string& path) = 0;
  // Entry names (no "." or ".."), unsorted. A missing directory throws.
  virtual std::vector<std::string> list_dir(const std::string& path) = 0;
  virtual bool exists(const std::string& path) = 0;
  virtual bool is_directory(const std::string& path) = 0;
  virtual void remove_file(const std::string& path) = 0;
  // rmdir(2): the directory must be empty.
  virtual void remove_dir(const std::string& path) = 0;

  // Non-virtual helpers built on the primitives above.
  // Reads a whole file.
  std::string read_file(const std::string& path);
  // Replaces `path` with `bytes` so that a reader sees the old file or the whole new one, never a
  // part, even across a crash: a temporary file beside it, fsync, rename, fsync of the directory.
  // On failure the temporary file is removed, `path` is untouched, and the error propagates.
  void write_file_atomically(const std::string& path, std::string_view bytes);
  // The temporary file a writer of `path` uses until it renames it over `path`:
  // "<path>.tmp.<pid>.<n>", a name of its own per process and call.
  static std::string temporary_path(const std::string& path);
  // Removes the temporary files of `path` whose writing process is gone (killed mid-write: a
  // live writer's file is kept). Returns how many were removed.
  int remove_abandoned_temporaries(const std::string& path);
  // Removes `path` and everything under it (files and directories); missing is fine.
  void remove_all(const std::string& path);
};

// The real POSIX file system (open/write/fsync/rename/fsync(dir)/opendir/pread). Shared, stateless.
std::shared_ptr<FileSystem> posix_file_system();

// "a/b" + "c" -> "a/b/c".
std::string join_path(const std::string& dir, const std::string& name);
// Directory part of a path ("a/b/c" -> "a/b", "c" -> ".").
std::string parent_path(const std::string& path);

}  // namespace tandem
