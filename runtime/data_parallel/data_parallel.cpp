// The data-parallel seam's functions (tandem/runtime/data_parallel.h).
#include <tandem/runtime/data_parallel.h>

#include <tandem/base/errors.h>

#include "base/launch_contract.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdlib>
#include <thread>

namespace tandem {

BucketCaps bucket_caps(const DistributedDataParallelOptions& options, const char* who) {
  const auto bytes = [](double mb) { return static_cast<int64_t>(mb * 1024 * 1024); };
  const bool good = options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0 &&
                    std::isfinite(options.bucket_cap_mb) &&
                    std::isfinite(options.first_bucket_cap_mb) &&
                    bytes(options.bucket_cap_mb) > 0 && bytes(options.first_bucket_cap_mb) > 0;
  if (!good) {
    throw ConfigError(std::string("tandem: ") + who + ": ddp.bucket_cap_mb (" +
                      std::to_string(options.bucket_cap_mb) + ") and ddp.first_bucket_cap_mb (" +
                      std::to_string(options.first_bucket_cap_mb) +
                      ") must be positive sizes in MiB (--set ddp.bucket_cap_mb=25).");
  }
  return {bytes(options.first_bucket_cap_mb), bytes(options.bucket_cap_mb)};
}

void check_parameter_devices(const std::vector<at::Tensor>& params,
                             const std::vector<std::string>& names,
                             const DistributedDataParallelOptions& options, const char* who) {
  for (size_t i = 0; i < params.size(); ++i) {
    const c10::Device d = params[i].device();
    if (options.device && d != *options.device) {
      throw ConfigError(std::string("tandem: ") + who + ": parameter '" + names[i] + "' is on " +
                        d.str() + " but train.device is " + options.device->str() +
                        ": move the model there before wrapping it (model->to(ctx.device())), "
                        "or --set train.device=" + d.str() + ".");
    }
    if (d != params[0].device()) {
      throw ConfigError(std::string("tandem: ") + who + ": parameter '" + names[i] + "' is on " +
                        d.str() + ", parameter '" + names[0] + "' on " +
                        params[0].device().str() +
                        "; a wrapped model lives on one device: move it with model->to(device).");
    }
  }
}

bool overlap_pays(DistributedDataParallelOptions::Overlap overlap, const Communicator& comm,
                  c10::Device device) {
  if (overlap != DistributedDataParallelOptions::Overlap::kAuto) {
    return overlap == DistributedDataParallelOptions::Overlap::kOn;
  }
  // On a GPU the backward's kernels need no host core: NCCL's stream, or Gloo's host threads for
  // staged tensors, run beside them.
  if (!device.is_cpu()) return true;
  const unsigned cores = std::thread::hardware_concurrency();
  const long local = launch::env_int(launch::kEnvLocalWorldSize, 0);
  const long ranks_here = local > 0 ? local : comm.size();
  return cores == 0 || static_cast<unsigned>(ranks_here * at::get_num_threads()) < cores;
}

}  // namespace tandem
