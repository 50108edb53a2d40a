// tandem::Context (include/tandem/runtime/context.h) and the run_main overload that builds it
// (include/tandem/runtime/run_main.h). Here rather than in run_main.cpp, which stays free of
// torch headers.
#include <tandem/runtime/context.h>

#include <tandem/base/trace.h>
#include <tandem/collectives/nccl_communicator.h>
#include <tandem/memory/cpu_allocator.h>
#include <tandem/runtime/config_keys.h>
#include <tandem/runtime/run_main.h>

#include "base/launch_contract.h"
#include "base/strings.h"
#include "runtime/error_report.h"

#include <cstdio>
#include <typeinfo>
#include <utility>

namespace tandem {

c10::Device resolve_train_device(const std::string& spec, int local_rank, int cuda_devices) {
  if (spec == "cpu" || (spec == "auto" && cuda_devices == 0)) return c10::Device(c10::kCPU);
  if (cuda_devices == 0) {
    throw ConfigError("tandem: train.device is " + spec + ", but this process has no usable CUDA "
                      "device (none on this machine, or no CUDA part in this build of tandem); "
                      "--set train.device=cpu (or auto).");
  }
  int index = local_rank % cuda_devices;
  if (spec != "auto" && spec != "cuda") {
    const auto parsed = spec.rfind("cuda:", 0) == 0 ? strings::parse_int(spec.substr(5))
                                                    : std::optional<int64_t>();
    if (!parsed || *parsed < 0) {
      throw ConfigError("tandem: train.device '" + spec + "' is not auto, cpu, cuda or cuda:N "
                        "(--set train.device=auto).");
    }
    if (*parsed >= cuda_devices) {
      throw ConfigError("tandem: train.device is " + spec + ", but this machine has " +
                        std::to_string(cuda_devices) + " CUDA device(s), cuda:0 to cuda:" +
                        std::to_string(cuda_devices - 1) + "; --set train.device=cuda (the "
                        "rank's own, cuda:LOCAL_RANK) or auto.");
    }
    index = static_cast<int>(*parsed);
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::vector<MeshDim> mesh_dims(const Config& config, int world_size) {
  const int pp = config.parallel.pp;
  if (pp < 1 || world_size % pp != 0) {
    throw ConfigError("tandem: parallel.pp " + std::to_string(pp) + " does not divide the world of " +
                      std::to_string(world_size) + " ranks; --set parallel.pp=1, or a divisor of " +
                      std::to_string(world_size) + ".");
  }
  std::vector<MeshDim> dims = sharding_mesh_dims(config.sharding, world_size / pp, "parallel mesh");
  dims.push_back({"pp", pp});
  return dims;
}

std::shared_ptr<DeviceMesh> Context::mesh() const {
  if (!dist_.world) return nullptr;
  std::call_once(mesh_once_, [this] {
    mesh_ = std::make_shared<DeviceMesh>(dist_.world, mesh_dims(loaded_.config, dist_.world->size()));
  });
  return mesh_;
}

Context::Context(LoadedConfig loaded, std::vector<std::string> args)
    : loaded_(std::move(loaded)), args_(std::move(args)) {
  for (auto& a : args_) argv_.push_back(a.data());
  argv_.push_back(nullptr);
  const std::string& spec = loaded_.config.train.device;
  device_ = resolve_train_device(spec, loaded_.config.comm.env.local_rank,
                                 spec == "cpu" ? 0 : cuda_device_count());
  loaded_.config.ddp.device = device_;  // the wrappers refuse a model left elsewhere
  dist_ = init(loaded_.config.comm);
  if (loaded_.config.allocator.install) {
    allocator_ = memory::install_host_cpu_allocator(loaded_.config.allocator.stack);
    if (allocator_ == nullptr) {
      throw ConfigError(
          "tandem: allocator.install = true, but another CPU allocator with a higher priority is "
          "installed; set allocator.install = false or remove the other allocator.");
    }
  }
  trace::start(loaded_.config.trace, dist_.env.rank);  // nothing unless trace.enabled
}

Context::~Context() {
  // The timeline is written even when the program failed: that is when it is wanted most.
  try {
    trace::stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: the timeline was not written: %s\n", e.what());
  }
  // Tensors allocated meanwhile keep the stack alive and free into it wherever they die.
  if (allocator_ != nullptr) memory::uninstall_cpu_allocator();
  // The world communicator goes before the store it rendezvoused through.
  mesh_.reset();
  dist_.world.reset();
}

int run_main(int argc, char** argv, const std::function<int(Context&)>& fn) {
  return run_main(argc, argv, [&fn](int ac, char** av) -> int {
    std::vector<char*> args(av, av + ac);
    args.push_back(nullptr);
    int n = ac;
    std::unique_ptr<Context> ctx;
    try {
      const ConfigArgs flags = take_config_args(n, args.data());
      if (flags.help_config) {
        std::fputs(config_defaults_text().c_str(), stdout);
        return 0;
      }
      LoadedConfig loaded = load_config({flags.files, process_environment(), flags.sets});
      if (flags.print_config) {
        if (loaded.config.comm.env.rank == 0)
          std::fputs(config_to_yaml(loaded.config, &loaded.source).c_str(), stdout);
        return 0;
      }
      ctx = std::make_unique<Context>(std::move(loaded), std::vector<std::string>(args.begin(), args.begin() + n));
    } catch (const ConfigError& e) {
      // Exit code 2: the run cannot succeed until the config changes (restarting will not help).
      const launch::ErrorReport report = detail::error_report(e, "C++ exception (configuration)");
      std::fprintf(stderr, "tandem::run_main: configuration error: %s\n", report.message.c_str());
      detail::write_error_report(report);
      return launch::kExitFinal;
    }
    return fn(*ctx);
  });
}

}  // namespace tandem
