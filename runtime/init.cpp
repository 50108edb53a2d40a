#include <tandem/runtime/init.h>

#include <tandem/base/errors.h>
#include <tandem/collectives/device_routing_communicator.h>
#include <tandem/collectives/flight_recorder.h>
#include <tandem/collectives/gloo_communicator.h>
#include <tandem/collectives/nccl_communicator.h>
#include <tandem/runtime/config.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

namespace tandem {

namespace {

std::string this_host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  return name;
}

// Whether something accepts TCP connections at host:port right now (one non-blocking connect per
// address, at most 200 ms each).
bool accepts_connections(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* a = found; a != nullptr && !ok; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof error;
      ok = ::poll(&p, 1, 200) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 &&
           error == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return ok;
}

// libtorch's TCPStore client sleeps a whole second after a refused connect before it retries
// (1.13; measured with strace during restarts, where the other ranks usually start before rank 0
// listens). Waiting for the listener with cheap probes first turns that second into milliseconds.
// The server drops a probe that closes without a request.
// False when nothing listened by `deadline`.
bool wait_for_store_listener(const std::string& host, int port,
                             std::chrono::steady_clock::time_point deadline) {
  while (!accepts_connections(host, port)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

c10::intrusive_ptr<c10d::Store> connect_store(const InitOptions& o) {
  const DistEnv& env = o.env;
  if (env.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(env.master_port);
  // Rank 0 hosts the store, unless the launcher's agent serves it already (torchrun 2.x).
  const bool host = env.rank == 0 && !env.agent_store;
  store_options.isServer = host;
  store_options.numWorkers = env.world_size;
  store_options.waitWorkers = false;
  store_options.timeout = o.timeout;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  auto unreachable = [&](const std::string& what) {
    return TimeoutError("tandem: rank " + std::to_string(env.rank) +
                        " could not reach the rendezvous store at " + where + " within " +
                        std::to_string(o.timeout.count()) + " ms (" + what +
                        "). Is rank 0 running, and is MASTER_ADDR reachable from this host?");
  };
  if (!host) {
    // The wait and the client's connect share one timeout (each took all of it before).
    const auto deadline = std::chrono::steady_clock::now() + o.timeout;
    if (!wait_for_store_listener(env.master_addr, env.master_port, deadline))
      throw unreachable("nothing accepted connections there");
    store_options.timeout = std::max(std::chrono::milliseconds(1),
                                     std::chrono::duration_cast<std::chrono::milliseconds>(
                                         deadline - std::chrono::steady_clock::now()));
  }
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    store->setTimeout(o.timeout);  // the store's operations get the whole timeout again
    return store;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (host && (what.find("in use") != std::string::npos ||
                          what.find("EADDRINUSE") != std::string::npos ||
                          what.find("bind") != std::string::npos)) {
      throw ConfigError("tandem: rank 0 cannot host the rendezvous store on port " +
                        std::to_string(env.master_port) +
                        ": the port is already in use on this host (" + what +
                        "). Pick a free MASTER_PORT or start with tandemrun --standalone.");
    }
    if (host) {
      throw CommError("tandem: rank 0 cannot host the rendezvous store at " + where + ": " + what);
    }
    throw unreachable(what);
  }
}

}  // namespace

Distributed::Distributed() = default;
Distributed::~Distributed() = default;
Distributed::Distributed(const Distributed&) = default;
Distributed::Distributed(Distributed&&) noexcept = default;
Distributed& Distributed::operator=(const Distributed&) = default;
Distributed& Distributed::operator=(Distributed&&) noexcept = default;

InitOptions InitOptions::from_env() { return load_comm_config(process_environment()); }

std::shared_ptr<Communicator> connect_world(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const InitOptions& options,
                                            const std::string& store_prefix) {
  GlooOptions gloo;
  gloo.timeout = options.timeout;
  gloo.connect_timeout = options.connect_timeout;
  gloo.interface = options.gloo_interface;
  gloo.hostname = !options.gloo_hostname.empty() ? options.gloo_hostname
                  : is_loopback_address(options.env.master_addr) ? "127.0.0.1"
                                                                : this_host_name();
  gloo.store_prefix = store_prefix;
  gloo.shared_memory = options.shared_memory;
  std::shared_ptr<Communicator> world = connect_gloo(store, rank, size, gloo);
  if (options.backend != "auto" && options.backend != "gloo" && options.backend != "nccl") {
    throw ConfigError("tandem: comm.backend = '" + options.backend +
                      "' is not auto, gloo or nccl (--set comm.backend=auto).");
  }
  const int devices = options.backend == "gloo" ? 0 : cuda_device_count();
  if (options.backend == "nccl" && devices == 0) {
    throw ConfigError("tandem: comm.backend = nccl, but this process has no usable CUDA device "
                      "(or this build of tandem has no CUDA part, or libtandem_cuda's CUDA runtime "
                      "and NCCL are missing); use --set comm.backend=gloo (or auto).");
  }
  if (devices > 0) {
    NcclOptions nccl;
    nccl.timeout = options.timeout;
    nccl.connect_timeout = options.connect_timeout;
    nccl.device = options.env.local_rank % devices;
    nccl.store_prefix = store_prefix;
    world = std::make_shared<DeviceRoutingCommunicator>(
        world, connect_nccl(store, rank, size, nccl));
  }
  return world;
}

Distributed init(const InitOptions& options) {
  options.env.validate();
  FlightRecorder::instance().install_signal_handler();  // SIGUSR1 dumps the recent ops
  Distributed d;
  d.env = options.env;
  d.store = connect_store(options);
  // A replacement (tandemrun --ft-replace) joins the running group's epoch, not epoch 0.
  if (options.env.ft_join > 0) return d;
  d.world = connect_world(d.store, options.env.rank, options.env.world_size, options,
                          options.store_prefix);
  return d;
}

Distributed init() { return init(InitOptions::from_env()); }

}  // namespace tandem
