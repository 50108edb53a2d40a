// FaultInjectionFileSystem: a FileSystem wrapper that fails on command (tests).
//
// It forwards every call to a base FileSystem and numbers the mutating operations (create,
// append, sync, close, rename, sync_dir, create_dirs, remove_file, remove_dir) from 0. A test
// arms one fault at operation number n:
//   - fail_op(n, errno):  op n throws FileError with that errno (ENOSPC, EIO, ...) without
//                         doing anything; later ops work again (a transient error).
//   - crash_at(n):        op n and every later call (reads included) throw CrashError: the
//                         process "died" just before op n.
//   - torn_write_at(n):   if op n is an append, half of its bytes reach the file, then the
//                         process dies as with crash_at; any other op kind crashes before it.
//   - fail_all(kind, errno): every op of one kind fails (e.g. every fsync with EIO).
// After a crash, lose_unsynced() simulates the power going out too: file data appended since the
// file's last sync() is cut off, and directory entries created or renamed since their directory's
// last sync_dir() are undone (renames are reverted, new files and directories are removed).
// Removals count as durable at once, and a rename that replaced an existing file cannot restore
// the old contents (the checkpoint protocol never renames onto an existing name). reset() disarms and clears the crash
// so the same object can be reused as the "restarted" process's file system.
//
// log() lists every op attempted, e.g. "3 append /tmp/x/step_0000000010.tmp/rank_00000.safetensors
// 4096", which tests print when an invariant breaks.
//
// Thread-safety: all methods lock one mutex (ops of concurrent ranks get distinct numbers).
#pragma once

#include <tandem/base/file_system.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tandem {

class FaultInjectionFileSystem final : public FileSystem {
 public:
  enum class Op { kCreate, kAppend, kSync, kClose, kRename, kSyncDir, kCreateDirs, kRemoveFile,
                  kRemoveDir };

  explicit FaultInjectionFileSystem(std::shared_ptr<FileSystem> base = posix_file_system());

  void fail_op(int64_t n, int error);
  void crash_at(int64_t n);
  void torn_write_at(int64_t n);
  void fail_all(Op kind, int error);

  // Mutating ops attempted so far (the next op gets this number).
  int64_t ops() const;
  bool crashed() const;
  std::vector<std::string> log() const;
  void lose_unsynced();
  // Disarms every fault, clears the crash, the op counter and the log; keeps durability tracking.
  void reset();

  std::unique_ptr<WritableFile> new_writable_file(const std::string& path) override;
  std::unique_ptr<ReadableFile> open_readable(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  void sync_dir(const std::string& path) override;
  void create_dirs(const std::string& path) override;
  std::vector<std::string> list_dir(const std::string& path) override;
  bool exists(const std::string& path) override;
  bool is_directory(const std::string& path) override;
  void remove_file(const std::string& path) override;
  void remove_dir(const std::string& path) override;

 private:
  friend class FaultWritableFile;
  enum class Verdict { kProceed, kTorn };
  // Numbers the op, logs it, and throws the armed fault if it is this op.
  Verdict begin_op(Op op, const std::string& what);
  void check_alive_locked() const;
  void note_entry_locked(const std::string& path, bool created);
  void rekey_locked(const std::string& from, const std::string& to);

  struct FileState {
    uint64_t size = 0;    // bytes appended so far
    uint64_t synced = 0;  // bytes durable (at the last sync)
  };
  struct DirEvent {       // an unsynced change of a directory's entries
    enum Kind { kCreated, kRenamed } kind;
    std::string path;     // created path, or rename target
    std::string from;     // rename source
    int64_t seq = 0;      // global order of the events
  };

  std::shared_ptr<FileSystem> base_;
  mutable std::mutex mutex_;
  int64_t ops_ = 0;
  bool crashed_ = false;
  int64_t fail_at_ = -1;
  int fail_errno_ = 0;
  int64_t crash_at_ = -1;
  int64_t torn_at_ = -1;
  std::map<Op, int> fail_all_;
  std::vector<std::string> log_;
  std::map<std::string, FileState> files_;
  std::map<std::string, std::vector<DirEvent>> unsynced_dirs_;  // directory -> events, in order
  int64_t next_seq_ = 0;
};

}  // namespace tandem
