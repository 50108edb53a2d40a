#include <tandem/runtime/init.h>

#include <tandem/collectives/gloo_communicator.h>
#include <tandem/errors.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <cstdlib>

namespace tandem {

namespace {

std::string this_host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  return name;
}

c10::intrusive_ptr<c10d::Store> connect_store(const InitOptions& o) {
  const DistEnv& env = o.env;
  if (env.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = env.world_size;
  store_options.waitWorkers = false;
  store_options.timeout = o.timeout;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (env.rank == 0 && (what.find("in use") != std::string::npos ||
                          what.find("EADDRINUSE") != std::string::npos ||
                          what.find("bind") != std::string::npos)) {
      throw ConfigError("tandem: rank 0 cannot host the rendezvous store on port " +
                        std::to_string(env.master_port) +
                        ": the port is already in use on this host (" + what +
                        "). Pick a free MASTER_PORT or start with tandemrun --standalone.");
    }
    if (env.rank == 0) {
      throw CommError("tandem: rank 0 cannot host the rendezvous store at " + where + ": " + what);
    }
    throw TimeoutError("tandem: rank " + std::to_string(env.rank) +
                       " could not reach the rendezvous store at " + where + " within " +
                       std::to_string(o.timeout.count()) + " ms (" + what +
                       "). Is rank 0 running, and is MASTER_ADDR reachable from this host?");
  }
}

}  // namespace

Distributed::Distributed() = default;
Distributed::~Distributed() = default;
Distributed::Distributed(const Distributed&) = default;
Distributed::Distributed(Distributed&&) noexcept = default;
Distributed& Distributed::operator=(const Distributed&) = default;
Distributed& Distributed::operator=(Distributed&&) noexcept = default;

InitOptions InitOptions::from_env() {
  InitOptions o;
  o.env = DistEnv::from_env();
  if (const char* t = std::getenv("TANDEM_TIMEOUT_S")) {
    char* end = nullptr;
    const double seconds = std::strtod(t, &end);
    if (*t == '\0' || *end != '\0' || !(seconds > 0)) {
      throw ConfigError(std::string("tandem: TANDEM_TIMEOUT_S='") + t +
                        "' must be a positive number of seconds.");
    }
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  if (const char* shm = std::getenv("TANDEM_SHM")) {
    const std::string v = shm;
    if (v != "0" && v != "1") {
      throw ConfigError("tandem: TANDEM_SHM='" + v + "' must be 0 (off) or 1 (on).");
    }
    o.shared_memory = v == "1";
  }
  if (const char* h = std::getenv("TANDEM_GLOO_HOSTNAME")) o.gloo_hostname = h;
  if (const char* i = std::getenv("TANDEM_GLOO_IFNAME")) o.gloo_interface = i;
  if (!o.env.run_id.empty()) o.store_prefix = "tandem/" + o.env.run_id;
  o.store_prefix += "/restart" + std::to_string(o.env.restart_count);
  return o;
}

Distributed init(const InitOptions& options) {
  options.env.validate();
  Distributed d;
  d.env = options.env;
  d.store = connect_store(options);
  GlooOptions gloo;
  gloo.timeout = options.timeout;
  gloo.interface = options.gloo_interface;
  gloo.hostname = !options.gloo_hostname.empty() ? options.gloo_hostname
                  : is_loopback_address(options.env.master_addr) ? "127.0.0.1"
                                                                : this_host_name();
  gloo.store_prefix = options.store_prefix;
  gloo.shared_memory = options.shared_memory;
  d.world = connect_gloo(d.store, options.env.rank, options.env.world_size, gloo);
  return d;
}

Distributed init() { return init(InitOptions::from_env()); }

}  // namespace tandem
