// train_mlp: data-parallel training of a small MLP on a synthetic regression task.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_mlp --steps 200
//
// Each rank draws its own shard of a fixed dataset (targets come from a random "teacher"
// network), trains a student with tandem::DistributedDataParallel and SGD, and rank 0 prints a
// progress line every --log-every steps and a final summary. Same seed and world size: same bits.
#include <tandem/tandem.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

#include "examples/cli.h"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("tandem example: data-parallel MLP training (start with tandemrun)");
  int64_t steps = 200, batch = 64, log_every = 20, hidden = 256;
  double lr = 0.05;
  uint64_t seed = 1234;
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "samples per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate")->check(CLI::PositiveNumber);
  app.add_option("--log-every", log_every, "progress line every N steps")->check(CLI::PositiveNumber);
  std::string device_spec = "auto";
  app.add_option("--device", device_spec, "auto | cpu | cuda | cuda:N (auto: cuda:LOCAL_RANK when a GPU exists)");
  app.add_option("--seed", seed, "seed of model init and data");
  if (const int status = examples::parse_flags(app, argc, argv); status >= 0) return status;

  try {
    at::set_num_threads(1);
    auto dist = tandem::init();
    const int rank = dist.world->rank();
    const int world = dist.world->size();
    const c10::Device device = tandem::resolve_train_device(
        device_spec, dist.env.local_rank, device_spec == "cpu" ? 0 : tandem::cuda_device_count());

    // Teacher and data depend on the seed only; each rank takes every world-th sample.
    torch::manual_seed(seed);
    Mlp teacher(32, 64, 8);
    const int64_t samples = batch * world * 16;
    auto inputs = torch::randn({samples, 32});
    torch::Tensor targets;
    {
      torch::NoGradGuard no_grad;
      targets = teacher(inputs) + 0.01 * torch::randn({samples, 8});
    }
    auto shard = torch::arange(rank, samples, world);
    inputs = inputs.index_select(0, shard).to(device);
    targets = targets.index_select(0, shard).to(device);

    torch::manual_seed(seed + 1);
    Mlp model(32, hidden, 8);
    model->to(device);
    tandem::DistributedDataParallel ddp(model, dist.world);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));

    const int64_t per_epoch = inputs.size(0) / batch;
    auto start = Clock::now();
    auto window = start;
    double first_loss = 0, loss_value = 0;
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t b = step % per_epoch;
      auto x = inputs.narrow(0, b * batch, batch);
      auto y = targets.narrow(0, b * batch, batch);
      opt.zero_grad();
      auto loss = torch::mse_loss(ddp(x), y);
      loss.backward();
      opt.step();
      // Mean loss over ranks, for the log only.
      auto reported = loss.detach().clone();
      dist.world->allreduce(reported, tandem::ReduceOp::kAvg)->wait();
      loss_value = reported.item<double>();
      if (step == 0) first_loss = loss_value;
      if (rank == 0 && ((step + 1) % log_every == 0 || step + 1 == steps)) {
        const auto now = Clock::now();
        const double seconds = std::chrono::duration<double>(now - window).count();
        const int64_t window_steps = (step + 1) % log_every == 0 ? log_every : (step + 1) % log_every;
        std::printf("step %5lld  loss %.5f  %8.0f samples/s  overlap %.1f ms\n",
                    static_cast<long long>(step + 1), loss_value,
                    window_steps * batch * world / seconds,
                    ddp.reducer().last_overlap_seconds() * 1e3);
        std::fflush(stdout);
        window = now;
      }
    }
    const double total = std::chrono::duration<double>(Clock::now() - start).count();
    // Proof of determinism across replicas: every rank's parameters hash the same.
    double checksum = 0;
    for (const auto& p : model->parameters()) checksum += p.sum().item<double>();
    std::printf("rank %d parameter checksum %.9f\n", rank, checksum);
    if (rank == 0) {
      std::printf("trained %lld steps on %d ranks in %.2f s: loss %.5f -> %.5f, %.0f samples/s\n",
                  static_cast<long long>(steps), world, total, first_loss, loss_value,
                  steps * batch * world / total);
    }
    return 0;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
