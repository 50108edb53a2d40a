// Internal: one POSIX shared-memory object (shm_open + fallocate + mmap), RAII.
//
// The creator makes a new object under a unique name; the other processes (or threads) open it by
// that name; once every party has mapped it, anyone unlinks the name, so nothing is left in
// /dev/shm when a party dies later (the mappings stay valid until each party unmaps).
//
// Each party also takes a shared OFD lock on one byte of the object (its "presence byte"); the
// kernel drops it when the party's descriptor closes, on a clean close or when the process dies
// (SIGKILL included). A peer tests that byte to tell "alive" from "gone" without any protocol
// of its own; OFD locks belong to the open file description, so this works between processes in
// different PID namespaces and between threads of one process (each opens its own descriptor).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace tandem::detail {

class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates a new object of `bytes` bytes (zero-filled, memory reserved up front so a full
  // /dev/shm fails here, not with SIGBUS later) and maps it. `name` starts with '/'. The creator
  // holds presence byte 0 from the start. Throws CommError naming the object and the errno text.
  // The destructor unlinks a created object whose name was not unlinked yet.
  static ShmSegment create(const std::string& name, size_t bytes);
  // Unlinks the objects whose names start with `prefix` (with its '/'), that are older than
  // `min_age` and whose presence byte 0 nobody holds: their creator died before every party had
  // mapped them (a SIGKILL inside connect), so no one else would ever remove the name. Objects of
  // other users are left alone. Returns how many it removed; throws nothing.
  static int remove_abandoned(const std::string& prefix, std::chrono::seconds min_age);
  // Opens and maps an existing object, which must be exactly `bytes` long.
  static ShmSegment open(const std::string& name, size_t bytes);

  // Removes the name (idempotent; a name already gone is fine). The mapping stays valid.
  void unlink();

  // Takes this party's presence lock on byte `index` (shared, so it never blocks).
  void hold_presence(size_t index);
  // True when some other party holds its presence lock on byte `index`.
  bool presence_held_by_other(size_t index) const;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }

 private:
  void reset() noexcept;

  std::string name_;
  int fd_ = -1;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owns_name_ = false;  // created by us and not yet unlinked
};

}  // namespace tandem::detail
