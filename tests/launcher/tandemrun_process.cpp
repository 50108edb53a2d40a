#include "tests/launcher/tandemrun_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace tandem::launcher_test {
namespace {

using Clock = std::chrono::steady_clock;

bool drop_from_env(const std::string& entry) {
  static const char* const kDropped[] = {
      "OMP_NUM_THREADS=",  "RANK=",        "LOCAL_RANK=",  "WORLD_SIZE=",
      "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=", "PET_",
      "TORCHELASTIC_",     "GROUP_RANK=",  "ROLE_",        "SLURM_"};
  for (const char* prefix : kDropped) {
    if (entry.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
}

}  // namespace

std::string tandemrun_path() { return TANDEMRUN_PATH; }

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw std::runtime_error(std::string("cannot bind a loopback port: ") + std::strerror(errno));
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> clean_env() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!drop_from_env(*e)) env.emplace_back(*e);
  }
  return env;
}

TandemrunProcess::TandemrunProcess(const std::vector<std::string>& args,
                                   const std::vector<std::string>& env, bool through_tandemrun) {
  std::vector<std::string> argv_strings;
  if (through_tandemrun) argv_strings.push_back(tandemrun_path());
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& s : env) envp.push_back(const_cast<char*>(s.c_str()));
  envp.push_back(nullptr);

  int out[2];
  int err[2];
  make_pipe(out);
  make_pipe(err);
  const int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  start_ = Clock::now();
  pid_ = ::fork();
  if (pid_ == 0) {
    // If the test process dies (e.g. ctest's timeout), tandemrun goes too, and with it its workers.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::dup2(dev_null, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(dev_null);
  ::close(out[1]);
  ::close(err[1]);
  if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  out_fd_ = out[0];
  err_fd_ = err[0];
}

TandemrunProcess::~TandemrunProcess() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

void TandemrunProcess::pump(int timeout_ms) {
  pollfd fds[2];
  nfds_t n = 0;
  if (out_fd_ >= 0) fds[n++] = pollfd{out_fd_, POLLIN, 0};
  if (err_fd_ >= 0) fds[n++] = pollfd{err_fd_, POLLIN, 0};
  if (n == 0) {
    ::usleep(static_cast<useconds_t>(std::min(timeout_ms, 20)) * 1000);
    return;
  }
  if (::poll(fds, n, timeout_ms) <= 0) return;
  for (nfds_t i = 0; i < n; ++i) {
    if (fds[i].revents == 0) continue;
    char buffer[65536];
    const ssize_t got = ::read(fds[i].fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    const bool is_out = fds[i].fd == out_fd_;
    if (got > 0) {
      (is_out ? out_ : err_).append(buffer, static_cast<std::size_t>(got));
    } else {
      ::close(fds[i].fd);
      (is_out ? out_fd_ : err_fd_) = -1;
    }
  }
}

bool TandemrunProcess::read_until(const std::function<bool()>& done,
                                  std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (!done()) {
    if (out_fd_ < 0 && err_fd_ < 0) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (left <= 0) return false;
    pump(static_cast<int>(std::min<long long>(left, 100)));
  }
  return true;
}

bool TandemrunProcess::wait_for_stdout_count(const std::string& needle, std::size_t count,
                                             std::chrono::milliseconds timeout) {
  return read_until([&] { return count_occurrences(out_, needle) >= count; }, timeout);
}

void TandemrunProcess::send(int signo) { ::kill(pid_, signo); }

RunResult TandemrunProcess::finish(std::chrono::milliseconds timeout) {
  RunResult result;
  const auto end = start_ + timeout;
  int status = 0;
  bool exited = false;
  while (Clock::now() < end) {
    if (!exited) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited = true;
        result.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
      }
    }
    if (exited && out_fd_ < 0 && err_fd_ < 0) break;
    pump(20);
  }
  if (!exited) {
    result.timed_out = true;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    result.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  }
  reaped_ = true;
  result.exited = WIFEXITED(status);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  result.out = out_;
  result.err = err_;
  return result;
}

RunResult run_tandemrun(const std::vector<std::string>& args, const std::vector<std::string>& env,
                        std::chrono::milliseconds timeout) {
  TandemrunProcess process(args, env);
  return process.finish(timeout);
}

TempDir::TempDir(const std::string& tag) {
  std::string name = "/tmp/tandem-" + tag + "-XXXXXX";
  if (::mkdtemp(name.data()) == nullptr) throw std::runtime_error("mkdtemp " + name + ": " + std::strerror(errno));
  path = name;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::size_t count_occurrences(const std::string& text, const std::string& needle) {
  std::size_t count = 0;
  for (auto pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size()))
    ++count;
  return count;
}

std::map<int, pid_t> ready_pids(const std::string& out) {
  std::map<int, pid_t> pids;
  static const std::regex kReady(R"(^\[rank (\d+)\]: ready pid=(\d+)$)");
  for (const auto& line : split_lines(out)) {
    std::smatch m;
    if (std::regex_match(line, m, kReady))
      pids[std::stoi(m[1])] = static_cast<pid_t>(std::stol(m[2]));
  }
  return pids;
}

std::map<int, pid_t> summary_pids(const std::string& err) {
  std::map<int, pid_t> pids;
  static const std::regex kSummary(R"(rank (\d+) \(pid (\d+)\))");
  for (const auto& line : split_lines(err)) {
    std::smatch m;
    if (std::regex_search(line, m, kSummary))
      pids[std::stoi(m[1])] = static_cast<pid_t>(std::stol(m[2]));
  }
  return pids;
}

std::string flight_dump_dir(const std::string& err) {
  const std::string key = "dumped their recent collectives to ";
  const auto at = err.find(key);
  if (at == std::string::npos) return "";
  const auto begin = at + key.size();
  return err.substr(begin, err.find(';', begin) - begin);
}

bool wait_until_gone(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    ::waitpid(pid, nullptr, WNOHANG);  // reaps it if it was re-parented to us; ECHILD otherwise
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    if (!stat || !std::getline(stat, text)) return true;
    const auto paren = text.rfind(')');
    if (paren != std::string::npos && paren + 2 < text.size()) {
      const char state = text[paren + 2];
      if (state == 'Z' || state == 'X') return true;
    }
    if (Clock::now() >= end) return false;
    ::usleep(20'000);
  }
}

}  // namespace tandem::launcher_test
