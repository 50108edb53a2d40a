// tandem::init: from the launcher environment to a connected world communicator.
//
// Rank 0 hosts a c10d::TCPStore at MASTER_ADDR:MASTER_PORT, every rank connects to it, and the
// ranks rendezvous into a Gloo communicator (a world of one uses an in-process HashStore and
// opens no port); with GPUs (comm.backend) an NCCL communicator joins it for CUDA tensors.
// Ownership: the returned Distributed owns the store and the world communicator; destroy the
// communicator before the store's host (rank 0) exits if peers still use it.
// Thread-safety: init() is called once per process, from one thread; the communicator is then
// thread-safe as communicator.h says.
// Errors: ConfigError for a bad environment (before any connection) and for a port already in
// use on rank 0; TimeoutError when rank 0's store cannot be reached or a rank never arrives
// within `timeout`.
#pragma once

#include <tandem/collectives/communicator.h>
#include <tandem/runtime/dist_env.h>

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>

namespace c10d {
class Store;
}

namespace tandem {

struct InitOptions {
  DistEnv env;
  // Rendezvous, store and op timeout (comm.timeout_s).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // When positive, bounds the communicator's rendezvous alone (GlooOptions::connect_timeout);
  // FaultTolerantWorld re-forms worlds with ft.quorum_timeout_s. Not a config key.
  std::chrono::milliseconds connect_timeout{0};
  // Address peers use to reach this rank. Empty: 127.0.0.1 when MASTER_ADDR is a loopback
  // address, else this machine's host name (comm.gloo_hostname).
  std::string gloo_hostname;
  // Network interface for Gloo, wins over gloo_hostname when set (comm.gloo_interface).
  std::string gloo_interface;
  // All-reduce through shared memory when every rank is on this host (comm.shared_memory).
  bool shared_memory = true;
  // comm.backend: "gloo" (every op over Gloo), "nccl" (ops on CUDA tensors over NCCL on device
  // LOCAL_RANK % device count, CPU ops over Gloo: a DeviceRoutingCommunicator; ConfigError without
  // NCCL support or a GPU), or "auto" (nccl when this build has NCCL and the machine a GPU, else
  // gloo).
  std::string backend = "auto";
  // Store key prefix (distinct per restart so a restarted group never reads stale keys).
  std::string store_prefix = "tandem";

  // The comm.* config keys from the environment, as a Context reads them (TANDEM_COMM_TIMEOUT_S or
  // TANDEM_TIMEOUT_S, ...: load_comm_config in config.h), with DistEnv::from_env(). Throws
  // ConfigError (an InvalidConfigError) naming each bad variable.
  static InitOptions from_env();
};

// The connected world. `store` is a c10d store: include
// <torch/csrc/distributed/c10d/Store.hpp> to use it (kept out of this header: it is heavy).
struct Distributed {
  // Out of line because c10d::Store is incomplete here.
  Distributed();
  ~Distributed();
  Distributed(const Distributed&);
  Distributed(Distributed&&) noexcept;
  Distributed& operator=(const Distributed&);
  Distributed& operator=(Distributed&&) noexcept;

  DistEnv env;
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<Communicator> world;  // null in a replacement (DistEnv::ft_join): see
                                        // FaultTolerantWorld::communicator()
};

Distributed init(const InitOptions& options);
// The communicator part of init(): `size` ranks, this one `rank`, rendezvous under `store_prefix`
// in `store` (Gloo, plus NCCL for CUDA tensors as comm.backend says). Step-level fault tolerance
// re-forms the survivors' world with it under a prefix per epoch. Errors as init()'s.
std::shared_ptr<Communicator> connect_world(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const InitOptions& options,
                                            const std::string& store_prefix);
// init(InitOptions::from_env()).
Distributed init();

}  // namespace tandem
