// Worker program for the pipeline process tests, started by tandemrun (one process per rank):
//   check-grads <schedule> <microbatches> [v] [--cuda]
// runs one PipelineParallel step over the world communicator and compares every local stage's
// gradient with the full-model full-batch gradient computed in this process; prints
// "PIPE GRADS OK max_rel_error=<e> stages <list>" or "PIPE GRADS MISMATCH ...". With --cuda the
// pipeline runs on cuda:0 (the ranks share it over Gloo, host-staged), on a side stream that a
// chain of matmuls holds before the step: a send or receive that does not wait for that stream
// moves stale values (tests/gpu/pipeline_gpu_test.cpp).
//   mismatch
// builds a 1F1B pipeline with 4 microbatches on rank 0 and 2 on the others: construction must
// fail with ConfigError on every rank, without waiting for a timeout.
// Exit codes: 0 passed, 1 mismatch, 2 usage, 4 ConfigError, 5 TimeoutError, 6 CommError, 7 Error.
#include <tandem/runtime/pipeline_parallel.h>
#include <torch/torch.h>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "tests/multiprocess/worker_main.h"

namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(17);
  return torch::nn::Sequential(
      torch::nn::Linear(10, 24), torch::nn::GELU(), torch::nn::Linear(24, 24), torch::nn::Tanh(),
      torch::nn::Linear(24, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
}

// Queues about 100 ms of matmuls on the current stream of `device`.
void delay_current_stream(const c10::Device& device) {
  const at::Tensor a = torch::randn({4096, 4096}, torch::TensorOptions(device));
  at::Tensor b = a;
  for (int i = 0; i < 40; ++i) b = at::mm(a, b).div_(4096);
}

int check_grads(tandem::Distributed& dist, const std::string& schedule, int m, int v, bool cuda) {
  torch::manual_seed(5);
  const auto x = torch::randn({24, 10}), y = torch::randn({24, 3});
  auto reference = make_model();
  torch::mse_loss(reference->forward(x), y).backward();
  std::map<std::string, at::Tensor> ref;
  for (const auto& p : reference->named_parameters()) ref[p.key()] = p.value().grad();

  tandem::PipelineOptions o;
  o.schedule = schedule;
  o.num_microbatches = m;
  o.virtual_stages = v;
  const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  auto model = make_model();
  model->to(device);
  const at::Tensor dx = x.to(device), dy = y.to(device);
  std::optional<c10::StreamGuard> on_side;
  if (cuda) {  // a side stream, after what the default one holds, then held itself
    const c10::impl::VirtualGuardImpl guard(c10::kCUDA);
    c10::Event made(c10::kCUDA);
    made.record(guard.getStream(device));
    const c10::Stream side = guard.getStreamFromGlobalPool(device);
    made.block(side);
    on_side.emplace(side);
  }
  tandem::PipelineParallel pipe(model, dist.world, o);
  if (cuda) delay_current_stream(device);
  pipe.train_step(
      dx, dy, [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); });
  double worst = 0;
  std::string stages;
  for (int s : pipe.local_stages()) {
    stages += " " + std::to_string(s);
    for (const auto& p : pipe.stage_module(s)->named_parameters()) {
      const auto& r = ref.at(p.key());
      const at::Tensor g = p.value().grad().cpu();
      worst = std::max(worst, (g - r).norm().item<double>() / r.norm().item<double>());
    }
  }
  const bool ok = worst <= 1e-5;
  std::printf("PIPE GRADS %s max_rel_error=%.3g stages%s\n", ok ? "OK" : "MISMATCH", worst,
              stages.c_str());
  return ok ? 0 : 1;
}

int mismatch(tandem::Distributed& dist) {
  tandem::PipelineOptions o;
  o.schedule = "1f1b";
  o.num_microbatches = dist.world->rank() == 0 ? 4 : 2;
  tandem::PipelineParallel pipe(make_model(), dist.world, o);
  std::printf("constructed a pipeline that should have been refused\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("pipeline_worker: a pipeline-parallel test worker");
  app.require_subcommand(1);
  std::string schedule;
  int m = 0, v = 1;
  bool cuda = false;
  auto* grads = app.add_subcommand("check-grads", "gradients equal the unpipelined model's");
  grads->add_option("schedule", schedule, "1f1b, gpipe, interleaved, ...")->required();
  grads->add_option("microbatches", m)->required();
  grads->add_option("v", v, "model chunks per rank")->capture_default_str();
  grads->add_flag("--cuda", cuda, "on cuda:0, on a side stream held before the step");
  app.add_subcommand("mismatch", "ranks that disagree on the microbatches are refused");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  return tandem::testing::run_worker([&](tandem::Distributed& dist) {
    return *grads ? check_grads(dist, schedule, m, v, cuda) : mismatch(dist);
  });
}
