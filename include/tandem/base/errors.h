// Exception types thrown by tandem.
//
// Every error tandem raises derives from tandem::Error (itself a std::runtime_error), so
// `catch (const tandem::Error&)` catches all of them. Messages follow one rule: say what happened,
// the value seen, and what to do about it.
// Ownership: plain exception values that own their message (copyable).
// Thread-safety: immutable once constructed; readable from any thread.
// Errors: none of its own; every other header names which of these it throws.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // False when running the same program on the same inputs again cannot succeed. tandem::run_main
  // records it in the error file, and tandemrun then stops the job instead of restarting it
  // (docs/launcher.md "Failures a restart cannot fix"). A program's own error type may override it.
  virtual bool restartable() const noexcept { return true; }
};

// A configuration, option or environment value is missing, malformed or out of range. Never
// restartable: the config must change first.
class ConfigError : public Error {
 public:
  using Error::Error;
  bool restartable() const noexcept override { return false; }
};

// A collective, point-to-point op or rendezvous failed (peer died, connection reset, bad input).
class CommError : public Error {
 public:
  using Error::Error;
};

// An operation did not complete within its timeout (a hung or missing peer). A CommError, so
// code that handles communication failures generically catches it too.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A peer rank is gone mid-op: its process died, or it closed or aborted its communicator. Usually
// the consequence of that rank's own failure, which its log names; tandem::run_main reports it a
// little after the peer's (the bad-input CommError of a call is reported at once).
class PeerLostError : public CommError {
 public:
  using CommError::CommError;
};

// A file could not be created, written, synced, renamed or read (FileSystem, base/file_system.h):
// the message names the operation, the path and the OS error. Not restartable when trying again
// cannot help: permissions, a read-only file system, a file where a directory should be.
class FileError : public Error {
 public:
  explicit FileError(const std::string& what, bool restartable = true)
      : Error(what), restartable_(restartable) {}
  bool restartable() const noexcept override { return restartable_; }

 private:
  bool restartable_;
};

// A training-state checkpoint could not be written, read or verified; the checkpoint layer's own
// I/O errors reach its callers as this type too. Not restartable when trying again cannot help: a
// checkpoint that does not fit this run, a directory that cannot be written.
class CheckpointError : public FileError {
 public:
  using FileError::FileError;
};

// An allocation could not be satisfied even after releasing cached memory.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

}  // namespace tandem
