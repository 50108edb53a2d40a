// GradScaler and AutocastGuard: PyTorch's scale update rule step for step, the inf verdict agreed
// across ranks, calls out of order, state round trip; autocast on and off.
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/grad_scaler.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace tandem {
namespace {

// PyTorch's amp_update_scale_cuda_kernel (aten/src/ATen/native/cuda/AmpKernels.cu), transcribed.
struct ReferenceScale {
  float scale;
  int tracker = 0;
  void update(bool found_inf, float growth, float backoff, int interval) {
    if (found_inf) {
      scale = scale * backoff;
      tracker = 0;
    } else {
      const int successful = tracker + 1;
      if (successful == interval) {
        const float grown = scale * growth;
        if (std::isfinite(grown)) scale = grown;
        tracker = 0;
      } else {
        tracker = successful;
      }
    }
  }
};

TEST(GradScaler, ScaleFollowsPyTorchsUpdateRuleStepForStep) {
  GradScalerOptions o;
  o.init_scale = 3.0e38;  // grows to inf: the growth must then be refused, as PyTorch does
  o.growth_interval = 3;
  o.growth_factor = 2.0;
  o.backoff_factor = 0.5;
  GradScaler scaler(o);
  ReferenceScale ref{static_cast<float>(o.init_scale)};
  auto w = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD opt({w}, 0.0);
  std::mt19937 rng(7);
  for (int step = 0; step < 200; ++step) {
    const bool inf = rng() % 4 == 0;
    opt.zero_grad();
    scaler.scale((w * (inf ? std::numeric_limits<float>::infinity() : 1.0f)).sum()).backward();
    const bool stepped = scaler.step(opt);
    EXPECT_EQ(stepped, !inf) << "step " << step;
    EXPECT_EQ(scaler.found_inf(), inf);
    scaler.update();
    ref.update(inf, 2.0f, 0.5f, 3);
    ASSERT_EQ(static_cast<float>(scaler.get_scale()), ref.scale) << "step " << step;
    ASSERT_EQ(scaler.growth_tracker(), ref.tracker) << "step " << step;
  }
}

TEST(GradScaler, UnscaleDividesByTheScaleAndNaNCountsAsInf) {
  GradScalerOptions o;
  o.init_scale = 1024;
  GradScaler scaler(o);
  auto w = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt({w}, 1.0);
  scaler.scale((w * torch::tensor({1.0f, 2.0f, 3.0f})).sum()).backward();
  scaler.unscale(opt);
  EXPECT_TRUE(w.grad().equal(torch::tensor({1.0f, 2.0f, 3.0f})));
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  opt.zero_grad();
  scaler.scale((w * std::nanf("")).sum()).backward();
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_TRUE(w.equal(torch::ones({3}) - torch::tensor({1.0f, 2.0f, 3.0f})));  // untouched
}

TEST(GradScaler, EveryRankSkipsWhenOneRankFindsAnInf) {
  std::vector<std::vector<bool>> stepped(3);
  std::vector<double> scales(3);
  testing::run_ranks(3, [&](Communicator& comm) {
    auto group = std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
    GradScaler scaler({}, group);
    auto w = torch::ones({2}, torch::requires_grad());
    torch::optim::SGD opt({w}, 0.1);
    for (int step = 0; step < 4; ++step) {
      opt.zero_grad();
      // Only rank 1, and only at step 2, produces an inf (as one shard or one pipeline stage would).
      const float factor = comm.rank() == 1 && step == 2 ? std::numeric_limits<float>::infinity() : 1.0f;
      scaler.scale((w * factor).sum()).backward();
      stepped[comm.rank()].push_back(scaler.step(opt));
      scaler.update();
    }
    scales[comm.rank()] = scaler.get_scale();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(stepped[r], (std::vector<bool>{true, true, false, true})) << "rank " << r;
    EXPECT_EQ(scales[r], 65536.0 * 0.5) << "rank " << r;
  }
}

TEST(GradScaler, CallsOutOfOrderAreNamed) {
  GradScaler scaler;
  auto w = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD opt({w}, 0.1);
  auto expect_error = [](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      FAIL() << "no error; expected: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error([&] { scaler.update(); }, "update() before any step()");
  scaler.scale(w.sum()).backward();
  scaler.unscale(opt);
  expect_error([&] { scaler.unscale(opt); }, "unscale() was already called");
  scaler.step(opt);
  expect_error([&] { scaler.step(opt); }, "step() was already called");
  expect_error([&] { scaler.unscale(opt); }, "unscale() after step()");
  scaler.update();
  EXPECT_THROW(GradScaler({true, -1.0}), ConfigError);
}

TEST(GradScaler, StateRoundTripsExactly) {
  GradScalerOptions o;
  o.growth_interval = 5;
  GradScaler a(o);
  auto w = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD opt({w}, 0.1);
  for (int step = 0; step < 7; ++step) {
    opt.zero_grad();
    a.scale((w * (step == 3 ? std::numeric_limits<float>::infinity() : 1.0f)).sum()).backward();
    a.step(opt);
    a.update();
  }
  GradScaler b(o);
  b.load_state(a.state());
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), a.growth_tracker());
  EXPECT_THROW(b.load_state({{"scale", int64_t{3}}}), ConfigError);
}

TEST(AutocastGuard, MatmulRunsInBf16OnlyInsideTheGuard) {
  auto a = torch::randn({4, 4});
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
  {
    AutocastGuard outer(c10::DeviceType::CPU, at::kBFloat16);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
    {
      AutocastGuard off(c10::DeviceType::CPU, at::kBFloat16, /*enabled=*/false);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
    }
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
  EXPECT_THROW(AutocastGuard(c10::DeviceType::CPU, at::kHalf), ConfigError);
}

}  // namespace
}  // namespace tandem
