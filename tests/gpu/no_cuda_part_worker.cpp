// Worker of no_cuda_part_test.cpp: with CUDA tensors at hand (torch sees a GPU), asks tandem for
// everything CUDA a training program asks for and prints one line per request, "<case>: ok" or
// "<case>: <ConfigError message>". Exits 77 when torch sees no GPU, 0 otherwise.
#include "tests/sharded/test_model.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/nccl_communicator.h>
#include <tandem/runtime/config.h>
#include <tandem/runtime/context.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/init.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <string>

namespace {

void report(const std::string& name, const std::function<void()>& request) {
  std::string outcome = "ok";
  try {
    request();
  } catch (const tandem::ConfigError& e) {
    outcome = e.what();
  }
  std::printf("%s: %s\n", name.c_str(), outcome.c_str());
  std::fflush(stdout);
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("torch sees no CUDA device\n");
    return 77;
  }
  std::printf("cuda_device_count: %d\n", tandem::cuda_device_count());
  report("comm.backend=nccl", [] {
    tandem::InitOptions o;
    o.backend = "nccl";
    tandem::init(o);
  });
  report("train.device=cuda", [] {
    tandem::Context ctx(tandem::load_config({{}, {}, {"train.device=cuda"}}), {"worker"});
  });
  // A model a program put on the GPU itself, under the default train.device (auto).
  report("cuda model, train.device=auto", [] {
    tandem::Context ctx(tandem::load_config({}), {"worker"});
    auto model = tandem::sharded_test::make_net(7);
    model->to(torch::kCUDA);
    tandem::DistributedDataParallel ddp(model, ctx.world(), ctx.config().ddp);
    const auto b = tandem::sharded_test::batch_of(0, 0);
    torch::mse_loss(ddp(b.x.to(torch::kCUDA)), b.y.to(torch::kCUDA)).backward();
  });
  return 0;
}
