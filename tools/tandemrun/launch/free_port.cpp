#include "tools/tandemrun/launch/free_port.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <tandem/base/errors.h>

#include "tools/tandemrun/launch/fd_io.h"

namespace tandem::launcher {

int pick_free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found);
  if (rc != 0) {
    throw ConfigError("--standalone: cannot resolve --master-addr '" + host +
                      "': " + ::gai_strerror(rc) + "; give a local address such as 127.0.0.1");
  }
  std::string last_error = "no addresses";
  int port = -1;
  for (addrinfo* ai = found; ai != nullptr && port < 0; ai = ai->ai_next) {
    UniqueFd sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!sock.valid() || ::bind(sock.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    if (bound.ss_family == AF_INET) {
      port = ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    } else if (bound.ss_family == AF_INET6) {
      port = ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
    }
  }
  ::freeaddrinfo(found);
  if (port <= 0) {
    throw ConfigError("--standalone: cannot bind a free port on --master-addr '" + host +
                      "': " + last_error + "; give an address of this machine such as 127.0.0.1");
  }
  return port;
}

}  // namespace tandem::launcher
