// DataParallel training with each codec on a fixed synthetic task (2 ranks as threads,
// deterministic data): compressed runs with error feedback end close to the uncompressed loss,
// the same codecs without error feedback end measurably worse, and a run resumed from saved
// codec state follows the uninterrupted trajectory bit for bit.
#include "test_support.h"

#include <tandem/collectives/compression.h>
#include <tandem/runtime/data_parallel.h>

#include <torch/torch.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <mutex>

namespace tandem {
namespace {

using testing::run_ranks;

constexpr int kWorld = 2;
constexpr int64_t kBatch = 32;

// Ranks are threads sharing libtorch's default generator: seeding and drawing the initial weights
// must not interleave between them.
std::mutex init_mutex;

torch::nn::Sequential make_model() {
  std::lock_guard<std::mutex> lock(init_mutex);
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::Tanh(),
                               torch::nn::Linear(128, 128), torch::nn::Tanh(),
                               torch::nn::Linear(128, 16));
}

// The task: a fixed random teacher network plus noise (the noise floor keeps the loss from
// reaching 0, so "within 5%" compares like with like).
struct Task {
  torch::nn::Sequential teacher = [] {
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(99);
    auto t = torch::nn::Sequential(torch::nn::Linear(64, 32), torch::nn::Tanh(),
                                   torch::nn::Linear(32, 16));
    for (auto& p : t->parameters()) p.requires_grad_(false);
    return t;
  }();

  std::pair<at::Tensor, at::Tensor> batch(uint64_t seed, int64_t size) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    at::Tensor x = at::randn({size, 64}, gen);
    at::Tensor y = teacher->forward(x) * 3 + 0.1 * at::randn({size, 16}, gen);
    return {x, y};
  }
};

struct Result {
  double eval_loss = 0;
  std::vector<at::Tensor> params;  // rank 0's, after the last step
};

// Trains `steps` steps of SGD on every rank; `codec` null = uncompressed. With `resume_at` > 0
// the run stops there, and a new model, optimizer, codec and DataParallel continue from copies
// of the parameters and of DataParallel::state() (bucket plan and codec state), as a
// checkpoint would carry them.
Result train(const std::function<std::shared_ptr<GradCodec>()>& make_codec_fn, int steps,
             int resume_at = 0) {
  Result result;
  run_ranks(kWorld, [&](Communicator& comm) {
    at::set_num_threads(1);
    Task task;
    std::shared_ptr<Communicator> shared(&comm, [](Communicator*) {});
    auto model = make_model();
    DataParallelOptions o;
    o.bucket_cap_mb = 0.05;  // a few buckets
    o.first_bucket_cap_mb = 0.01;
    o.codec = make_codec_fn ? make_codec_fn() : nullptr;
    auto ddp = std::make_unique<DataParallel<torch::nn::SequentialImpl>>(model, shared, o);
    auto opt = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05));
    for (int step = 0; step < steps; ++step) {
      if (resume_at > 0 && step == resume_at) {
        // "Restart": fresh objects.
        std::vector<at::Tensor> saved_params;
        for (const auto& p : model->parameters()) saved_params.push_back(p.detach().clone());
        std::map<std::string, at::Tensor> ddp_state;
        for (const auto& [name, t] : ddp->state()) ddp_state[name] = t.clone();
        ddp.reset();
        model = make_model();
        {
          torch::NoGradGuard no_grad;
          for (size_t i = 0; i < saved_params.size(); ++i) model->parameters()[i].copy_(saved_params[i]);
        }
        o.codec = make_codec_fn();
        ddp = std::make_unique<DataParallel<torch::nn::SequentialImpl>>(model, shared, o);
        ddp->load_state(ddp_state);
        opt = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05));
      }
      auto [x, y] = task.batch(1000 * step + comm.rank(), kBatch);
      opt->zero_grad();
      torch::mse_loss((*ddp)(x), y).backward();
      opt->step();
    }
    if (comm.rank() == 0) {
      torch::NoGradGuard no_grad;
      auto [x, y] = task.batch(123456789, 2048);
      result.eval_loss = torch::mse_loss(model->forward(x), y).item<double>();
      for (const auto& p : model->parameters()) result.params.push_back(p.detach().clone());
    }
  });
  return result;
}

constexpr int kSteps = 800;  // measured: 400 leave top-k 1% at 1.12x the uncompressed loss

std::shared_ptr<GradCodec> powersgd(bool error_feedback) {
  PowerSgdOptions o;
  o.rank = 4;
  o.start_iter = 10;
  o.error_feedback = error_feedback;
  return make_powersgd_codec(o);
}

std::shared_ptr<GradCodec> topk(bool error_feedback) {
  TopKOptions o;
  o.ratio = 0.01;
  o.error_feedback = error_feedback;
  return make_topk_codec(o);
}

TEST(Convergence, ErrorFeedbackReachesTheUncompressedLossAndWithoutItTrainingIsWorse) {
  const double plain = train(nullptr, kSteps).eval_loss;
  struct Case {
    const char* name;
    std::function<std::shared_ptr<GradCodec>()> with_ef, without_ef;
  };
  const std::vector<Case> cases = {
      {"powersgd r=4", [] { return powersgd(true); }, [] { return powersgd(false); }},
      {"topk 1%", [] { return topk(true); }, [] { return topk(false); }},
  };
  for (const auto& c : cases) {
    const double with_ef = train(c.with_ef, kSteps).eval_loss;
    const double without_ef = train(c.without_ef, kSteps).eval_loss;
    std::printf("%-13s uncompressed %.5f  with error feedback %.5f (%.3fx)  without %.5f (%.3fx)\n",
                c.name, plain, with_ef, with_ef / plain, without_ef, without_ef / plain);
    EXPECT_LE(with_ef, 1.05 * plain) << c.name;
    EXPECT_GE(without_ef, 1.2 * with_ef) << c.name << ": error feedback made no measurable difference";
  }
}

TEST(Convergence, ResumingFromSavedCodecStateFollowsTheSameTrajectory) {
  const std::vector<std::pair<const char*, std::function<std::shared_ptr<GradCodec>()>>> codecs = {
      {"powersgd", [] { return powersgd(true); }},
      {"topk", [] { return topk(true); }},
      {"sign+bf16", [] { return make_cast_codec(at::kBFloat16, make_sign_codec()); }},
  };
  for (const auto& [name, make] : codecs) {
    const Result straight = train(make, 30);
    const Result resumed = train(make, 30, /*resume_at=*/17);
    ASSERT_EQ(straight.params.size(), resumed.params.size());
    for (size_t i = 0; i < straight.params.size(); ++i) {
      EXPECT_TRUE(at::equal(straight.params[i], resumed.params[i])) << name << " parameter " << i;
    }
  }
}

}  // namespace
}  // namespace tandem
