#include "tools/tandemrun/launch/signal_relay.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <tandem/base/errors.h>

namespace tandem::launcher {
namespace {

constexpr int kHandled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
constexpr int kAllTouched[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};

// Written only by the constructor/destructor while no handler can run with a stale value.
volatile sig_atomic_t g_write_fd = -1;
struct sigaction g_previous[sizeof(kAllTouched) / sizeof(kAllTouched[0])];

extern "C" void on_signal(int signo) {
  const int saved_errno = errno;  // the interrupted code may be about to read errno
  const unsigned char byte = static_cast<unsigned char>(signo);
  const int fd = g_write_fd;
  // The pipe is non-blocking: if it is full, a wake-up is already pending and SIGCHLD is
  // re-checked with waitid(), so losing this byte can only drop a duplicate stop request.
  if (fd >= 0) {
    const ssize_t ignored = ::write(fd, &byte, 1);
    (void)ignored;
  }
  errno = saved_errno;
}

}  // namespace

bool is_stop_signal(int signo) {
  return signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT;
}

SignalRelay::SignalRelay() {
  if (g_write_fd >= 0) throw Error("internal: only one SignalRelay may exist at a time");
  Pipe pipe = make_pipe();
  set_nonblocking(pipe.read.get());
  set_nonblocking(pipe.write.get());
  read_ = std::move(pipe.read);
  write_ = std::move(pipe.write);
  g_write_fd = write_.get();

  for (std::size_t i = 0; i < sizeof(kAllTouched) / sizeof(kAllTouched[0]); ++i) {
    struct sigaction action {};
    sigemptyset(&action.sa_mask);
    if (kAllTouched[i] == SIGPIPE) {
      action.sa_handler = SIG_IGN;
    } else {
      action.sa_handler = on_signal;
      action.sa_flags = SA_RESTART | (kAllTouched[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    }
    if (::sigaction(kAllTouched[i], &action, &g_previous[i]) != 0) {
      const int error = errno;
      while (i-- > 0)
        ::sigaction(kAllTouched[i], &g_previous[i], nullptr);  // undo, the destructor won't run
      g_write_fd = -1;
      throw Error(std::string("sigaction() failed: ") + std::strerror(error));
    }
  }
  // A launcher started with these signals blocked (some CI runners do) would never see them.
  sigset_t unblock;
  sigemptyset(&unblock);
  for (int signo : kHandled) sigaddset(&unblock, signo);
  ::sigprocmask(SIG_UNBLOCK, &unblock, nullptr);
}

SignalRelay::~SignalRelay() {
  for (std::size_t i = 0; i < sizeof(kAllTouched) / sizeof(kAllTouched[0]); ++i) {
    ::sigaction(kAllTouched[i], &g_previous[i], nullptr);
  }
  g_write_fd = -1;
}

ReceivedSignals SignalRelay::drain() {
  ReceivedSignals received;
  unsigned char buffer[64];
  for (;;) {
    const ssize_t n = ::read(read_.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] == SIGCHLD) {
        received.child_exited = true;
      } else {
        received.stop_signals.push_back(buffer[i]);
      }
    }
  }
  return received;
}

void SignalRelay::reset_in_child() {
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  for (int signo : kAllTouched) ::sigaction(signo, &action, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace tandem::launcher
