// POSIX FileSystem (see include/tandem/base/file_system.h). No torch headers.
#include <tandem/base/file_system.h>

#include "base/strings.h"

#include <atomic>

#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tandem {
namespace {

// File errors in base's own words: the operation, the path and the OS error, nothing about what
// the file is for (a checkpoint, a timeline, an error file): the caller knows that and says it.
// `restartable` false: trying again cannot help (see os_error).
[[noreturn]] void fail(const std::string& message, bool restartable = true) {
  throw FileError(message, restartable);
}

[[noreturn]] void os_error(const std::string& op, const std::string& path, int err) {
  std::string hint;
  if (err == ENOSPC) hint = " Free disk space there or write elsewhere.";
  else if (err == EACCES || err == EPERM) hint = " Check the directory's permissions.";
  else if (err == ENOENT) hint = " Check the path.";
  // Permissions, a read-only file system or a file where a directory should be stay as they are
  // on a restart; a full disk or a flaky mount may not.
  const bool restartable = err != EACCES && err != EPERM && err != EROFS && err != ENOTDIR;
  fail(op + " '" + path + "' failed: " + std::strerror(err) + " (errno " + std::to_string(err) +
       ")." + hint, restartable);
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void append(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      // Linux writes at most 0x7ffff000 bytes per call.
      const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
      const ssize_t w = ::write(fd_, p, chunk);
      if (w < 0) {
        if (errno == EINTR) continue;
        os_error("write", path_, errno);
      }
      if (w == 0) os_error("write", path_, EIO);
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void sync() override {
    if (::fsync(fd_) != 0) os_error("fsync", path_, errno);
  }

  void close() override {
    if (fd_ < 0) return;
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) os_error("close", path_, errno);
  }

 private:
  std::string path_;
  int fd_;
};

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixReadableFile() override { ::close(fd_); }

  uint64_t size() const override { return size_; }

  void read(uint64_t offset, size_t n, void* dst) override {
    if (offset > size_ || n > size_ - offset) {
      fail("read of " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
           " is past the end of '" + path_ + "' (" + std::to_string(size_) +
           " bytes): the file is truncated.");
    }
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
      const ssize_t r = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        os_error("read", path_, errno);
      }
      if (r == 0) {
        fail("'" + path_ + "' ended early at offset " + std::to_string(offset) +
             ": the file is truncated.");
      }
      p += r;
      offset += static_cast<uint64_t>(r);
      n -= static_cast<size_t>(r);
    }
  }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

class PosixFileSystem final : public FileSystem {
 public:
  std::unique_ptr<WritableFile> new_writable_file(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) os_error("create", path, errno);
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  std::unique_ptr<ReadableFile> open_readable(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) os_error("open", path, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      os_error("stat", path, err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("'" + path + "' is not a regular file.");
    }
    return std::make_unique<PosixReadableFile>(path, fd, static_cast<uint64_t>(st.st_size));
  }

  void rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) os_error("rename to '" + to + "' of", from, errno);
  }

  void sync_dir(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) os_error("open directory", path, errno);
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      os_error("fsync directory", path, err);
    }
    ::close(fd);
  }

  void create_dirs(const std::string& path) override {
    if (path.empty()) return;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return;
      fail("'" + path + "' exists and is not a directory.", /*restartable=*/false);
    }
    const std::string parent = parent_path(path);
    if (parent != path && parent != "." && parent != "/") create_dirs(parent);
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) os_error("mkdir", path, errno);
  }

  std::vector<std::string> list_dir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) os_error("list directory", path, errno);
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    return names;
  }

  bool exists(const std::string& path) override {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0;
  }

  bool is_directory(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  void remove_file(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) os_error("remove", path, errno);
  }

  void remove_dir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) os_error("remove directory", path, errno);
  }
};

}  // namespace

std::string FileSystem::read_file(const std::string& path) {
  auto f = open_readable(path);
  std::string s(static_cast<size_t>(f->size()), '\0');
  if (!s.empty()) f->read(0, s.size(), s.data());
  return s;
}

std::string FileSystem::temporary_path(const std::string& path) {
  // A name of its own per process and call, so concurrent writers never share a temporary file.
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
}

int FileSystem::remove_abandoned_temporaries(const std::string& path) {
  const std::string dir = parent_path(path);
  const std::string prefix = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1) + ".tmp.";
  if (!exists(dir)) return 0;
  int removed = 0;
  for (const std::string& name : list_dir(dir)) {
    if (name.rfind(prefix, 0) != 0) continue;
    // "<pid>.<n>" after the prefix; anything else is not ours.
    const std::string rest = name.substr(prefix.size());
    const auto dot = rest.find('.');
    const auto pid = strings::parse_int(rest.substr(0, dot));
    if (dot == std::string::npos || !pid || *pid <= 0 || !strings::parse_int(rest.substr(dot + 1))) continue;
    if (::kill(static_cast<pid_t>(*pid), 0) == 0 || errno != ESRCH) continue;  // its writer lives
    remove_file(join_path(dir, name));
    ++removed;
  }
  return removed;
}

void FileSystem::write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = temporary_path(path);
  try {
    auto f = new_writable_file(tmp);
    f->append(bytes.data(), bytes.size());
    f->sync();
    f->close();
    rename(tmp, path);
  } catch (...) {
    try {
      if (exists(tmp)) remove_file(tmp);
    } catch (const FileError&) {  // the first error is the one to report
    }
    throw;
  }
  sync_dir(parent_path(path));
}

void FileSystem::remove_all(const std::string& path) {
  if (!exists(path)) return;
  if (!is_directory(path)) {
    remove_file(path);
    return;
  }
  for (const auto& name : list_dir(path)) remove_all(join_path(path, name));
  remove_dir(path);
}

std::shared_ptr<FileSystem> posix_file_system() {
  static const std::shared_ptr<FileSystem> fs = std::make_shared<PosixFileSystem>();
  return fs;
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string parent_path(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

}  // namespace tandem
