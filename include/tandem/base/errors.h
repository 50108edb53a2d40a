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
};

// A configuration, option or environment value is missing, malformed or out of range.
class ConfigError : public Error {
 public:
  using Error::Error;
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

// A training-state checkpoint could not be written, read or verified.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// An allocation could not be satisfied even after releasing cached memory.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

}  // namespace tandem
