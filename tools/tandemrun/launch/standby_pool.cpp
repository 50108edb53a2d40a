#include "tools/tandemrun/launch/standby_pool.h"

#include <elf.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>

#include <tandem/base/errors.h>

#include "base/strings.h"

namespace tandem::launcher {
namespace {

// A standby acknowledges its environment with one byte once it has set it. It may still be loading
// its libraries when a restart comes early, hence the generous limit; a program that never waits
// in tandem::run_main costs this much once, then the worker is started normally.
constexpr int kStandbyAckMs = 10'000;

bool acknowledged(int fd) {
  pollfd p{fd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, kStandbyAckMs);
  } while (ready < 0 && errno == EINTR);
  char ack = 0;
  return ready == 1 && ::read(fd, &ack, 1) == 1 && ack == 'A';
}

void kill_and_reap(pid_t pid) {
  ::killpg(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// The mangled names of both tandem::run_main overloads start with this.
constexpr const char kRunMainPrefix[] = "_ZN6tandem8run_mainE";

bool elf_names_run_main(const unsigned char* data, std::size_t size) {
  if (size < sizeof(Elf64_Ehdr) || std::memcmp(data, ELFMAG, SELFMAG) != 0 ||
      data[EI_CLASS] != ELFCLASS64) {
    return false;
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, data, sizeof eh);
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > size ||
      eh.e_shnum > (size - eh.e_shoff) / sizeof(Elf64_Shdr)) {
    return false;
  }
  auto section = [&](std::size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, data + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof sh);
    return sh;
  };
  for (std::size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr symbols = section(i);
    if ((symbols.sh_type != SHT_DYNSYM && symbols.sh_type != SHT_SYMTAB) ||
        symbols.sh_entsize != sizeof(Elf64_Sym) || symbols.sh_link >= eh.e_shnum ||
        symbols.sh_offset > size || symbols.sh_size > size - symbols.sh_offset) {
      continue;
    }
    const Elf64_Shdr names = section(symbols.sh_link);
    if (names.sh_offset > size || names.sh_size > size - names.sh_offset) continue;
    const char* strtab = reinterpret_cast<const char*>(data + names.sh_offset);
    for (std::size_t k = 0; k < symbols.sh_size / sizeof(Elf64_Sym); ++k) {
      Elf64_Sym sym;
      std::memcpy(&sym, data + symbols.sh_offset + k * sizeof(Elf64_Sym), sizeof sym);
      const std::size_t room = sizeof kRunMainPrefix - 1;
      if (sym.st_name < names.sh_size && names.sh_size - sym.st_name > room &&
          std::memcmp(strtab + sym.st_name, kRunMainPrefix, room) == 0) {
        return true;
      }
    }
  }
  return false;
}

// "Key:   123 kB" from /proc/meminfo, in bytes.
std::optional<uint64_t> meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!strings::starts_with(line, key + ":")) continue;
    const auto words = strings::split_words(line.substr(key.size() + 1));
    const auto kb = words.empty() ? std::nullopt : strings::parse_int(words[0]);
    if (kb) return static_cast<uint64_t>(*kb) * 1024;
  }
  return std::nullopt;
}

// A cgroup v2 file of this process's cgroup holding one number ("max": nullopt).
std::optional<uint64_t> cgroup_value(const std::string& file) {
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  if (!std::getline(cgroup, line) || !strings::starts_with(line, "0::")) return std::nullopt;
  std::ifstream in("/sys/fs/cgroup" + line.substr(3) + "/" + file);
  std::string text;
  if (!(in >> text)) return std::nullopt;
  const auto v = strings::parse_int(text);
  if (!v) return std::nullopt;
  return static_cast<uint64_t>(*v);
}

}  // namespace

StandbyPool::Standby StandbyPool::launch(int local_rank) const {
  // A socket pair, not a pipe: the standby acknowledges its environment on the same channel.
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    throw Error(std::string("socketpair() failed: ") + std::strerror(errno));
  UniqueFd ours(fds[0]);
  UniqueFd theirs(fds[1]);
  LaunchSpec spec = program_;
  spec.env.push_back("TANDEM_STANDBY_FD=" + std::to_string(theirs.get()));
  spec.keep_fd = theirs.get();
  spec.who = "the standby of local rank " + std::to_string(local_rank);
  return Standby{launch_process(std::move(spec)), std::move(ours)};
}

void StandbyPool::start(int count, const LaunchSpec& program) {
  discard();
  program_ = program;
  try {
    for (int local_rank = 0; local_rank < count; ++local_rank) standby_.push_back(launch(local_rank));
  } catch (const Error& e) {
    log_line(std::string("standby workers: ") + e.what() +
             "; restarts will start workers normally");
    discard();
  }
}

std::optional<LaunchedProcess> StandbyPool::activate(int local_rank,
                                                     const std::vector<std::string>& env) {
  if (static_cast<std::size_t>(local_rank) >= standby_.size()) return std::nullopt;
  Standby& standby = standby_[static_cast<std::size_t>(local_rank)];
  if (standby.process.pid <= 0) return std::nullopt;
  std::string message;
  for (const auto& e : env) message.append(e).push_back('\0');
  message.push_back('\0');
  const bool alive = ::waitpid(standby.process.pid, nullptr, WNOHANG) == 0;
  if (alive && write_all(standby.control.get(), message.data(), message.size()) &&
      acknowledged(standby.control.get())) {
    standby.control.reset();
    LaunchedProcess process = std::move(standby.process);
    standby.process.pid = -1;
    standby.used = true;
    return process;
  }
  log_line("the standby of local rank " + std::to_string(local_rank) +
           (alive ? " did not take its environment" : " exited before it was needed") +
           " (does the program call tandem::run_main?); starting the worker normally");
  kill_and_reap(standby.process.pid);
  standby.process.pid = -1;
  return std::nullopt;
}

void StandbyPool::restock(int local_rank) {
  if (static_cast<std::size_t>(local_rank) >= standby_.size()) return;
  Standby& standby = standby_[static_cast<std::size_t>(local_rank)];
  if (standby.process.pid > 0 || !standby.used) return;  // one that failed would fail again
  try {
    standby = launch(local_rank);
  } catch (const Error& e) {
    log_line("the standby of local rank " + std::to_string(local_rank) + " was not restocked: " +
             e.what() + "; its next replacement starts normally");
  }
}

void StandbyPool::discard() {
  for (auto& standby : standby_) {
    if (standby.process.pid > 0) kill_and_reap(standby.process.pid);
  }
  standby_.clear();
}

bool program_calls_run_main(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool found = false;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const auto size = static_cast<std::size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      found = elf_names_run_main(static_cast<const unsigned char*>(map), size);
      ::munmap(map, size);
    }
  }
  ::close(fd);
  return found;
}

std::optional<std::string> standby_memory_shortage(int count) {
  constexpr uint64_t kMiB = 1024 * 1024;
  constexpr uint64_t kPerStandby = 256 * kMiB;
  std::optional<uint64_t> total = meminfo_bytes("MemTotal");
  std::optional<uint64_t> available = meminfo_bytes("MemAvailable");
  if (!total || !available) return std::nullopt;  // cannot tell: no reason to refuse
  const auto limit = cgroup_value("memory.max");
  const auto usage = cgroup_value("memory.current");
  if (limit && usage && *limit < *total) {
    total = *limit;
    available = std::min(*available, *limit > *usage ? *limit - *usage : 0);
  }
  const uint64_t needed = *total / 10 + static_cast<uint64_t>(count) * kPerStandby;
  if (*available >= needed) return std::nullopt;
  return "only " + std::to_string(*available / kMiB) + " MiB of " + std::to_string(*total / kMiB) +
         " MiB are available, and " + std::to_string(count) + " standby worker(s) need about " +
         std::to_string(static_cast<uint64_t>(count) * 256) + " MiB while a tenth stays free";
}

}  // namespace tandem::launcher
