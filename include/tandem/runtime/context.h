// tandem::Context: what a training program gets from tandem::run_main — its validated Config, the
// connected world, and the command-line arguments that were not tandem's.
//
//   int main(int argc, char** argv) {
//     return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
//       tandem::DistributedDataParallel ddp(model, ctx.world(), ctx.config().ddp);
//       for (int64_t step = 0; step < ctx.config().train.steps; ++step) { ... }
//     });
//   }
//
// Construction order: config loaded and validated (nothing connects before that), then
// tandem::init(config.comm) (collective: every rank constructs its Context), then, with
// allocator.install, tandem's host stack becomes libtorch's CPU allocator until the Context dies;
// with trace.enabled the timeline recorder starts (tandem/base/trace.h) and the Context's
// destructor writes <trace.dir>/rank<R>.json, also when the program failed.
// Mesh: mesh() lays the world out once, from parallel.pp and sharding.* (mesh_dims()), and hands
// every component the same groups: the pipeline (make_pipeline_groups(mesh)), ShardedDataParallel
// (its mesh constructor), and what tensor parallelism adds as a `tp` dimension.
// Ownership: the Context owns the Distributed (store + world communicator), the mesh and the
// allocator stack.
// Device: train.device resolved once (resolve_train_device()); config().ddp.device is set to it,
// so both data-parallel wrappers refuse a model left elsewhere.
// Thread-safety: const accessors may be called from any thread; not copyable or movable.
// Errors: InvalidConfigError for the config, ConfigError for a train.device this machine lacks,
// ConfigError/TimeoutError from tandem::init; mesh() throws ConfigError for sizes that do not
// divide the world.
#pragma once

#include <tandem/collectives/device_mesh.h>
#include <tandem/runtime/config.h>
#include <tandem/runtime/init.h>

#include <c10/core/Device.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tandem {
namespace memory {
class HostMemoryStack;
}

// train.device `spec` (auto | cpu | cuda | cuda:N) for the rank with `local_rank` on a machine
// with `cuda_devices` usable CUDA devices: auto is cuda:local_rank (modulo the count) when there
// is one, else cpu; cuda is cuda:local_rank (modulo). ConfigError, naming the key, for cuda
// without a device or an index out of range.
c10::Device resolve_train_device(const std::string& spec, int local_rank, int cuda_devices);

// The mesh `config` asks of a world of `world_size` ranks, outermost first: {{"dp_replicate", r},
// {"dp_shard", s}, {"pp", p}}, p = parallel.pp (consecutive ranks form one pipeline), s the ranks
// one shard spans (sharding_mesh_dims() of the world_size / p data-parallel ranks). ConfigError,
// naming the key, for sizes that do not divide.
std::vector<MeshDim> mesh_dims(const Config& config, int world_size);

class Context {
 public:
  // Connects and installs as described above. `args`: argv without tandem's flags (args[0] is
  // the program).
  Context(LoadedConfig loaded, std::vector<std::string> args);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Config& config() const { return loaded_.config; }
  // Where each key's value came from ("train.yaml:3:5", "TANDEM_X", "--set"; absent: default).
  const std::map<std::string, std::string>& config_sources() const { return loaded_.source; }

  // Where this rank trains (train.device resolved): move the model and the batches there.
  const c10::Device& device() const { return device_; }

  const Distributed& distributed() const { return dist_; }
  // Null in a replacement worker of tandemrun --ft-replace: it joins through FaultTolerantWorld.
  const std::shared_ptr<Communicator>& world() const { return dist_.world; }
  // The world laid out by mesh_dims(config()), made on the first call (not collective; its groups
  // are, on first use). Null where world() is.
  std::shared_ptr<DeviceMesh> mesh() const;
  int rank() const { return dist_.env.rank; }
  int world_size() const { return dist_.env.world_size; }
  // This rank's index among the ranks of its node, and how many there are (LOCAL_RANK,
  // LOCAL_WORLD_SIZE): pick the GPU with local_rank().
  int local_rank() const { return dist_.env.local_rank; }
  int local_world_size() const { return dist_.env.local_world_size; }
  // How many times the launcher restarted the worker group before this attempt
  // (TORCHELASTIC_RESTART_COUNT; 0 on the first).
  int restart_count() const { return dist_.env.restart_count; }

  // The program's own arguments, for its own parser (CLI11 takes argc()/argv()).
  const std::vector<std::string>& args() const { return args_; }
  int argc() const { return static_cast<int>(args_.size()); }
  char** argv() { return argv_.data(); }

  // The installed host allocator stack (stats, snapshots, a LeakDetector over tracking() with
  // config().allocator.leaks), or nullptr without allocator.install.
  memory::HostMemoryStack* allocator() const { return allocator_.get(); }

 private:
  LoadedConfig loaded_;
  std::vector<std::string> args_;
  std::vector<char*> argv_;
  Distributed dist_;
  mutable std::once_flag mesh_once_;
  mutable std::shared_ptr<DeviceMesh> mesh_;
  std::shared_ptr<memory::HostMemoryStack> allocator_;
  c10::Device device_{c10::kCPU};
};

}  // namespace tandem
