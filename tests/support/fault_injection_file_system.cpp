// Fault-injecting FileSystem for tests (see fault_injection_file_system.h). No torch headers.
#include "tests/support/fault_injection_file_system.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>

namespace tandem {
namespace {

const char* op_name(FaultInjectionFileSystem::Op op) {
  using Op = FaultInjectionFileSystem::Op;
  switch (op) {
    case Op::kCreate: return "create";
    case Op::kAppend: return "append";
    case Op::kSync: return "sync";
    case Op::kClose: return "close";
    case Op::kRename: return "rename";
    case Op::kSyncDir: return "sync_dir";
    case Op::kCreateDirs: return "create_dirs";
    case Op::kRemoveFile: return "remove_file";
    case Op::kRemoveDir: return "remove_dir";
  }
  return "?";
}

bool has_prefix(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultInjectionFileSystem* fs, std::string path, std::unique_ptr<WritableFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}

  void append(const void* data, size_t n) override {
    const auto verdict =
        fs_->begin_op(FaultInjectionFileSystem::Op::kAppend, path_ + " " + std::to_string(n));
    if (verdict == FaultInjectionFileSystem::Verdict::kTorn) {
      const size_t part = n / 2;
      base_->append(data, part);
      {
        std::lock_guard<std::mutex> lock(fs_->mutex_);
        fs_->files_[path_].size += part;
        fs_->crashed_ = true;
      }
      throw CrashError("tandem: fault injection: torn write of " + std::to_string(part) + " of " +
                       std::to_string(n) + " bytes to '" + path_ + "', then a crash.");
    }
    base_->append(data, n);
    std::lock_guard<std::mutex> lock(fs_->mutex_);
    fs_->files_[path_].size += n;
  }

  void sync() override {
    fs_->begin_op(FaultInjectionFileSystem::Op::kSync, path_);
    base_->sync();
    std::lock_guard<std::mutex> lock(fs_->mutex_);
    auto& st = fs_->files_[path_];
    st.synced = st.size;
  }

  void close() override {
    fs_->begin_op(FaultInjectionFileSystem::Op::kClose, path_);
    base_->close();
  }

 private:
  FaultInjectionFileSystem* fs_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
};

namespace {

class FaultReadableFile final : public ReadableFile {
 public:
  FaultReadableFile(std::unique_ptr<ReadableFile> base, std::function<void()> check)
      : base_(std::move(base)), check_(std::move(check)) {}
  uint64_t size() const override { return base_->size(); }
  void read(uint64_t offset, size_t n, void* dst) override {
    check_();
    base_->read(offset, n, dst);
  }

 private:
  std::unique_ptr<ReadableFile> base_;
  std::function<void()> check_;
};

}  // namespace

FaultInjectionFileSystem::FaultInjectionFileSystem(std::shared_ptr<FileSystem> base)
    : base_(std::move(base)) {}

void FaultInjectionFileSystem::fail_op(int64_t n, int error) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_at_ = n;
  fail_errno_ = error;
}

void FaultInjectionFileSystem::crash_at(int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  crash_at_ = n;
}

void FaultInjectionFileSystem::torn_write_at(int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  torn_at_ = n;
}

void FaultInjectionFileSystem::fail_all(Op kind, int error) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_all_[kind] = error;
}

int64_t FaultInjectionFileSystem::ops() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ops_;
}

bool FaultInjectionFileSystem::crashed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return crashed_;
}

std::vector<std::string> FaultInjectionFileSystem::log() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_;
}

void FaultInjectionFileSystem::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_ = 0;
  crashed_ = false;
  fail_at_ = crash_at_ = torn_at_ = -1;
  fail_errno_ = 0;
  fail_all_.clear();
  log_.clear();
}

void FaultInjectionFileSystem::check_alive_locked() const {
  if (crashed_) {
    throw CrashError("tandem: fault injection: the process crashed earlier; no more file system calls.");
  }
}

FaultInjectionFileSystem::Verdict FaultInjectionFileSystem::begin_op(Op op, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_alive_locked();
  const int64_t n = ops_++;
  log_.push_back(std::to_string(n) + " " + op_name(op) + " " + what);
  if (n == crash_at_ || (n == torn_at_ && op != Op::kAppend)) {
    crashed_ = true;
    throw CrashError("tandem: fault injection: crash before op " + std::to_string(n) + " (" +
                     op_name(op) + " " + what + ").");
  }
  if (n == torn_at_) return Verdict::kTorn;
  int err = 0;
  if (n == fail_at_) err = fail_errno_;
  const auto it = fail_all_.find(op);
  if (it != fail_all_.end()) err = it->second;
  if (err != 0) {
    throw FileError("tandem: checkpoint: " + std::string(op_name(op)) + " '" + what +
                    "' failed: " + std::strerror(err) + " (errno " + std::to_string(err) +
                    ", injected at op " + std::to_string(n) + ").");
  }
  return Verdict::kProceed;
}

void FaultInjectionFileSystem::note_entry_locked(const std::string& path, bool created) {
  unsynced_dirs_[parent_path(path)].push_back({DirEvent::kCreated, path, "", next_seq_++});
  if (created) files_[path] = FileState{};
}

void FaultInjectionFileSystem::rekey_locked(const std::string& from, const std::string& to) {
  std::map<std::string, FileState> moved;
  for (auto it = files_.begin(); it != files_.end();) {
    if (it->first == from || has_prefix(it->first, from + "/")) {
      moved[to + it->first.substr(from.size())] = it->second;
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& kv : moved) files_[kv.first] = kv.second;
  std::map<std::string, std::vector<DirEvent>> dirs;
  for (auto& kv : unsynced_dirs_) {
    std::string dir = kv.first;
    if (dir == from || has_prefix(dir, from + "/")) dir = to + dir.substr(from.size());
    for (auto& e : kv.second) {
      if (e.path == from || has_prefix(e.path, from + "/")) e.path = to + e.path.substr(from.size());
      dirs[dir].push_back(e);
    }
  }
  unsynced_dirs_ = std::move(dirs);
}

std::unique_ptr<WritableFile> FaultInjectionFileSystem::new_writable_file(const std::string& path) {
  begin_op(Op::kCreate, path);
  const bool existed = base_->exists(path);
  auto f = base_->new_writable_file(path);
  std::lock_guard<std::mutex> lock(mutex_);
  if (existed) {
    files_[path] = FileState{};  // truncated; the directory entry was already durable
  } else {
    note_entry_locked(path, true);
  }
  return std::make_unique<FaultWritableFile>(this, path, std::move(f));
}

std::unique_ptr<ReadableFile> FaultInjectionFileSystem::open_readable(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_alive_locked();
  }
  return std::make_unique<FaultReadableFile>(base_->open_readable(path), [this] {
    std::lock_guard<std::mutex> lock(mutex_);
    check_alive_locked();
  });
}

void FaultInjectionFileSystem::rename(const std::string& from, const std::string& to) {
  begin_op(Op::kRename, from + " -> " + to);
  base_->rename(from, to);
  std::lock_guard<std::mutex> lock(mutex_);
  rekey_locked(from, to);
  unsynced_dirs_[parent_path(to)].push_back({DirEvent::kRenamed, to, from, next_seq_++});
}

void FaultInjectionFileSystem::sync_dir(const std::string& path) {
  begin_op(Op::kSyncDir, path);
  base_->sync_dir(path);
  std::lock_guard<std::mutex> lock(mutex_);
  unsynced_dirs_.erase(path);
}

void FaultInjectionFileSystem::create_dirs(const std::string& path) {
  begin_op(Op::kCreateDirs, path);
  // Record each directory level that does not exist yet.
  std::vector<std::string> missing;
  for (std::string p = path; !p.empty() && p != "." && p != "/" && !base_->exists(p);
       p = parent_path(p)) {
    missing.push_back(p);
  }
  base_->create_dirs(path);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) note_entry_locked(*it, false);
}

std::vector<std::string> FaultInjectionFileSystem::list_dir(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_alive_locked();
  }
  return base_->list_dir(path);
}

bool FaultInjectionFileSystem::exists(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_alive_locked();
  }
  return base_->exists(path);
}

bool FaultInjectionFileSystem::is_directory(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_alive_locked();
  }
  return base_->is_directory(path);
}

void FaultInjectionFileSystem::remove_file(const std::string& path) {
  begin_op(Op::kRemoveFile, path);
  base_->remove_file(path);
  std::lock_guard<std::mutex> lock(mutex_);
  files_.erase(path);
}

void FaultInjectionFileSystem::remove_dir(const std::string& path) {
  begin_op(Op::kRemoveDir, path);
  base_->remove_dir(path);
}

void FaultInjectionFileSystem::lose_unsynced() {
  std::lock_guard<std::mutex> lock(mutex_);
  // 1. File data past the last sync is gone.
  for (auto& kv : files_) {
    FileState& st = kv.second;
    if (st.size == st.synced || !base_->exists(kv.first)) continue;
    std::string keep;
    {
      auto f = base_->open_readable(kv.first);
      const uint64_t n = std::min<uint64_t>(st.synced, f->size());
      keep.resize(static_cast<size_t>(n));
      if (n > 0) f->read(0, keep.size(), keep.data());
    }
    auto w = base_->new_writable_file(kv.first);
    w->append(keep.data(), keep.size());
    w->sync();
    w->close();
    st.size = st.synced = keep.size();
  }
  // 2. Directory changes not made durable by sync_dir are undone, newest first.
  std::vector<DirEvent> events;
  for (auto& kv : unsynced_dirs_) events.insert(events.end(), kv.second.begin(), kv.second.end());
  unsynced_dirs_.clear();
  std::sort(events.begin(), events.end(),
            [](const DirEvent& a, const DirEvent& b) { return a.seq > b.seq; });
  for (size_t i = 0; i < events.size(); ++i) {
    const DirEvent e = events[i];
    if (e.kind == DirEvent::kRenamed) {
      if (!base_->exists(e.path) || base_->exists(e.from)) continue;
      base_->rename(e.path, e.from);
      rekey_locked(e.path, e.from);
      for (size_t j = i + 1; j < events.size(); ++j) {  // older events under the reverted name
        for (std::string* p : {&events[j].path, &events[j].from}) {
          if (*p == e.path || has_prefix(*p, e.path + "/")) *p = e.from + p->substr(e.path.size());
        }
      }
    } else if (base_->exists(e.path)) {
      base_->remove_all(e.path);
      for (auto it = files_.begin(); it != files_.end();) {
        it = (it->first == e.path || has_prefix(it->first, e.path + "/")) ? files_.erase(it) : std::next(it);
      }
    }
  }
}

}  // namespace tandem
