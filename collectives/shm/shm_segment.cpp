#include "collectives/shm/shm_segment.h"

#include <tandem/base/errors.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>
#include <vector>

namespace tandem::detail {

namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

[[noreturn]] void fail(const std::string& what, const std::string& name, int err) {
  throw CommError("tandem: shared memory: " + what + " '/dev/shm" + name + "' failed: " +
                  errno_text(err));
}

void* map(int fd, size_t bytes, const std::string& name) {
  // MAP_POPULATE: take the page faults now, not in the first allreduce.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) fail("mmap of", name, errno);
  return p;
}

struct flock presence_lock(short type, size_t index) {
  struct flock fl;
  std::memset(&fl, 0, sizeof fl);
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(index);
  fl.l_len = 1;
  fl.l_pid = 0;  // required for OFD locks
  return fl;
}

}  // namespace

ShmSegment::~ShmSegment() { reset(); }

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    reset();
    name_ = std::move(other.name_);
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owns_name_ = std::exchange(other.owns_name_, false);
  }
  return *this;
}

void ShmSegment::reset() noexcept {
  if (owns_name_) unlink();
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);  // drops the presence lock
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  ShmSegment s;
  s.name_ = name;
  s.fd_ = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (s.fd_ < 0) fail("creating", name, errno);
  s.owns_name_ = true;
  s.hold_presence(0);  // at once: an object nobody holds is one remove_abandoned() may take
  if (::ftruncate(s.fd_, static_cast<off_t>(bytes)) != 0) fail("sizing", name, errno);
  // Reserve the pages: tmpfs otherwise allocates on first touch and a full /dev/shm would kill
  // the process with SIGBUS in the middle of an allreduce.
  if (const int err = ::posix_fallocate(s.fd_, 0, static_cast<off_t>(bytes)); err != 0) {
    throw CommError("tandem: shared memory: reserving " + std::to_string(bytes >> 20) +
                    " MiB for '/dev/shm" + name + "' failed: " + errno_text(err) +
                    " (is /dev/shm too small? `df -h /dev/shm`)");
  }
  s.data_ = map(s.fd_, bytes, name);
  s.size_ = bytes;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  ShmSegment s;
  s.name_ = name;
  s.fd_ = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (s.fd_ < 0) fail("opening", name, errno);
  struct stat st;
  if (::fstat(s.fd_, &st) != 0) fail("inspecting", name, errno);
  if (static_cast<size_t>(st.st_size) != bytes) {
    throw CommError("tandem: shared memory: '/dev/shm" + name + "' has " +
                    std::to_string(st.st_size) + " bytes, expected " + std::to_string(bytes));
  }
  s.data_ = map(s.fd_, bytes, name);
  s.size_ = bytes;
  return s;
}

int ShmSegment::remove_abandoned(const std::string& prefix, std::chrono::seconds min_age) {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const std::string stem = prefix.substr(prefix.empty() || prefix[0] != '/' ? 0 : 1);
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    if (std::strncmp(entry->d_name, stem.c_str(), stem.size()) == 0)
      names.push_back(std::string("/") + entry->d_name);
  }
  ::closedir(dir);
  int removed = 0;
  for (const std::string& name : names) {
    const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;  // gone already, or another user's
    struct stat st;
    struct flock fl = presence_lock(F_WRLCK, 0);
    // ctime is set when the object is created and sized: a young object may be one whose creator
    // has not taken its lock yet.
    const bool abandoned = ::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() &&
                           std::time(nullptr) - st.st_ctime >= min_age.count() &&
                           ::fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_UNLCK;
    ::close(fd);
    if (abandoned && ::shm_unlink(name.c_str()) == 0) ++removed;
  }
  return removed;
}

void ShmSegment::unlink() {
  if (name_.empty()) return;
  ::shm_unlink(name_.c_str());  // ENOENT: another party unlinked it first
  owns_name_ = false;
}

void ShmSegment::hold_presence(size_t index) {
  struct flock fl = presence_lock(F_RDLCK, index);
  if (::fcntl(fd_, F_OFD_SETLK, &fl) != 0) fail("locking a presence byte of", name_, errno);
}

bool ShmSegment::presence_held_by_other(size_t index) const {
  struct flock fl = presence_lock(F_WRLCK, index);
  if (::fcntl(fd_, F_OFD_GETLK, &fl) != 0) return true;  // cannot tell: assume alive
  return fl.l_type != F_UNLCK;
}

}  // namespace tandem::detail
