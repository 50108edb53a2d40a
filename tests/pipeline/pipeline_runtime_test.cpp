// PipelineParallel with ranks as threads over one HashStore: for every schedule, 2 and 4 ranks,
// the gradients equal the single-process full-model full-batch gradients (relative error <= 1e-5);
// user schedules, uneven microbatches with a sum reduction, gradient accumulation, shape changes;
// 2D (2 pipeline x 2 data parallel); every disagreement is a ConfigError on every rank, not a
// hang; measured costs, bubble, timelines and re-balancing.
//
// Models and data are made on the test's main thread (torch::manual_seed is process-global).
#include <gtest/gtest.h>
#include <tandem/base/errors.h>
#include <tandem/runtime/grad_norm.h>
#include <tandem/runtime/pipeline_parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>

#include "tests/support/test_support.h"

namespace tandem {
namespace {

using testing::run_ranks;
using Clock = std::chrono::steady_clock;

constexpr int64_t kIn = 8, kOut = 4;

// Eight layers of several kinds, no dropout.
torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(
      torch::nn::Linear(kIn, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})), torch::nn::ReLU(),
      torch::nn::Linear(16, 12), torch::nn::Sigmoid(), torch::nn::Linear(12, kOut));
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& y) { return torch::mse_loss(out, y); }
at::Tensor mse_sum(const at::Tensor& out, const at::Tensor& y) {
  return torch::mse_loss(out, y, torch::Reduction::Sum);
}

struct Batch {
  at::Tensor x, y;
};
Batch make_batch(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({n, kIn}), torch::randn({n, kOut})};
}

// name -> gradient of the full model on the full batch.
std::map<std::string, at::Tensor> reference_grads(uint64_t seed, const std::vector<Batch>& batches,
                                                  const LossFn& loss = mse) {
  auto model = make_model(seed);
  for (const auto& b : batches) loss(model->forward(b.x), b.y).backward();
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().grad().clone();
  return out;
}

// Relative error of every local stage's gradients against the reference.
void expect_grads_match(PipelineParallel& pipe, const std::map<std::string, at::Tensor>& ref,
                        const std::string& what) {
  int checked = 0;
  for (int s : pipe.local_stages()) {
    for (const auto& p : pipe.stage_module(s)->named_parameters()) {
      const auto& r = ref.at(p.key());
      ASSERT_TRUE(p.value().grad().defined()) << what << ": " << p.key() << " has no gradient";
      const double err =
          (p.value().grad() - r).norm().item<double>() / std::max(r.norm().item<double>(), 1e-30);
      EXPECT_LE(err, 1e-5) << what << ": " << p.key() << " relative error " << err;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << what;
}

struct Config {
  std::string schedule;
  int world, m, v;
};

class PipelineGradients : public ::testing::TestWithParam<Config> {};

TEST_P(PipelineGradients, EqualTheFullBatchGradients) {
  const Config c = GetParam();
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < c.world; ++r) models.push_back(make_model(7));
  const auto batch = make_batch(16, 99);
  const auto ref = reference_grads(7, {batch});
  const double ref_loss = mse(make_model(7)->forward(batch.x), batch.y).item<double>();
  run_ranks(c.world, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = c.schedule;
    o.num_microbatches = c.m;
    o.virtual_stages = c.v;
    PipelineParallel pipe(models[comm.rank()],
                          std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), o);
    const auto loss = pipe.train_step(batch.x, batch.y, mse);
    if (pipe.local_stages().back() == c.world * c.v - 1) {
      EXPECT_NEAR(loss.item<double>(), ref_loss, 1e-5);
    } else {
      EXPECT_FALSE(loss.defined());
    }
    expect_grads_match(pipe, ref, c.schedule + " rank " + std::to_string(comm.rank()));
  });
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineGradients,
                         ::testing::Values(Config{"gpipe", 2, 4, 1}, Config{"1f1b", 2, 4, 1},
                                           Config{"zbh1", 2, 4, 1}, Config{"interleaved", 2, 4, 2},
                                           Config{"gpipe", 4, 4, 1}, Config{"1f1b", 4, 8, 1},
                                           Config{"zbh1", 4, 4, 1}, Config{"interleaved", 4, 4, 2},
                                           Config{"zbh1", 2, 1, 1}),
                         [](const auto& info) {
                           return info.param.schedule + "_p" + std::to_string(info.param.world) +
                                  "_m" + std::to_string(info.param.m) + "_v" +
                                  std::to_string(info.param.v);
                         });

std::shared_ptr<Communicator> borrow(Communicator& comm) {
  return std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
}

// Issue 18: clip_grad_norm over the pipeline group is the full model's single-process norm.
TEST(PipelineRuntime, ClipGradNormAcrossStagesIsTheSingleProcessNorm) {
  std::vector<torch::nn::Sequential> models = {make_model(5), make_model(5)};
  const auto batch = make_batch(16, 21);
  double want = 0;
  for (const auto& [name, g] : reference_grads(5, {batch})) want += g.to(at::kDouble).pow(2).sum().item<double>();
  want = std::sqrt(want);
  std::vector<double> got(2);
  run_ranks(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = "1f1b";
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
    pipe.train_step(batch.x, batch.y, mse);
    got[comm.rank()] = clip_grad_norm(pipe.parameters(), want / 4, 2.0, &comm);
    // Clipped to a quarter: the global norm after clipping is max_norm.
    EXPECT_NEAR(global_grad_norm(pipe.parameters(), 2.0, &comm), want / 4, want * 1e-6);
  });
  for (double g : got) EXPECT_NEAR(g, want, want * 1e-6);
}

TEST(PipelineRuntime, UserScheduleFromTextRuns) {
  const std::string text =
      "tandem-pipeline-schedule,1\nname,mine\nshape,2,2,3\nstage_to_rank,0,1\n"
      "0,F,0,0\n0,F,0,1\n0,F,0,2\n0,B,0,2\n0,B,0,0\n0,B,0,1\n"
      "1,F,1,0\n1,F,1,1\n1,F,1,2\n1,B,1,2\n1,B,1,0\n1,B,1,1\n";
  std::vector<torch::nn::Sequential> models = {make_model(3), make_model(3)};
  const auto batch = make_batch(12, 5);
  const auto ref = reference_grads(3, {batch});
  run_ranks(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.custom_schedule = pipeline::parse_schedule(text);
    o.balance = {3, 5};
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
    EXPECT_EQ(pipe.balance(), (std::vector<int64_t>{3, 5}));
    pipe.train_step(batch.x, batch.y, mse);
    expect_grads_match(pipe, ref, "user schedule");
  });
}

TEST(PipelineRuntime, UnevenMicrobatchesWithSumReductionAndAccumulationAndShapeChanges) {
  std::vector<torch::nn::Sequential> models = {make_model(4), make_model(4)};
  const auto b1 = make_batch(10, 1);  // 10 rows in 4 microbatches: 3, 3, 2, 2
  const auto b2 = make_batch(7, 2);   // a new shape: re-exchanged
  const auto ref = reference_grads(4, {b1, b2}, mse_sum);
  const auto ref2 = reference_grads(4, {b2}, mse_sum);
  run_ranks(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = "zbh1";
    o.reduction = LossReduction::kSum;
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
    pipe.train_step(b1.x, b1.y, mse_sum);
    pipe.train_step(b2.x, b2.y, mse_sum);  // accumulates, like two loss.backward()
    expect_grads_match(pipe, ref, "accumulated");
    for (auto& p : pipe.parameters()) p.mutable_grad().zero_();
    pipe.train_step(b2.x, b2.y, mse_sum);  // same shape again: cached
    expect_grads_match(pipe, ref2, "cached shapes");
  });
}

TEST(PipelineRuntime, ThreeDimensionalActivationsThroughTheWeightGradientSplit) {
  // Linear on [N, T, C] inputs: the by-hand W of a Linear flattens the leading dimensions.
  auto make = [] {
    torch::manual_seed(8);
    return torch::nn::Sequential(torch::nn::Linear(kIn, 16), torch::nn::GELU(),
                                 torch::nn::Linear(16, 16), torch::nn::Tanh(),
                                 torch::nn::Linear(16, kOut));
  };
  std::vector<torch::nn::Sequential> models = {make(), make()};
  torch::manual_seed(9);
  const auto x = torch::randn({8, 3, kIn}), y = torch::randn({8, 3, kOut});
  auto full = make();
  mse(full->forward(x), y).backward();
  std::map<std::string, at::Tensor> ref;
  for (const auto& p : full->named_parameters()) ref[p.key()] = p.value().grad().clone();
  run_ranks(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = "zbh1";
    o.balance = {2, 3};
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
    pipe.train_step(x, y, mse);
    expect_grads_match(pipe, ref, "3-d zbh1");
  });
}

TEST(PipelineRuntime, TwoDimensionalPipelineTimesDataParallel) {
  // World 4: pipeline groups {0,1} and {2,3}; data groups {0,2} and {1,3}. Replica 1 starts from
  // other weights: construction broadcasts data rank 0's.
  const auto global = make_batch(16, 21);
  const auto ref = reference_grads(11, {global});
  for (const std::string schedule : {"1f1b", "zbh1"}) {
    std::vector<torch::nn::Sequential> models = {make_model(11), make_model(11), make_model(12),
                                                 make_model(12)};
    run_ranks(4, [&](Communicator& world) {
      auto groups = make_pipeline_groups(world, 2);
      ASSERT_TRUE(groups.data);
      EXPECT_EQ(groups.pipeline->size(), 2);
      EXPECT_EQ(groups.data->size(), 2);
      PipelineOptions o;
      o.schedule = schedule;
      o.num_microbatches = 4;
      PipelineParallel pipe(models[world.rank()], groups.pipeline, o, groups.data);
      const int dp = groups.data->rank();
      const auto x = global.x.narrow(0, dp * 8, 8), y = global.y.narrow(0, dp * 8, 8);
      pipe.train_step(x, y, mse);
      expect_grads_match(pipe, ref, schedule + " 2D rank " + std::to_string(world.rank()));
    });
  }
}

// Runs `body` on `world` rank threads with a short timeout; returns each rank's error text
// ("" when it threw nothing) and checks nobody waited for the timeout.
std::vector<std::string> errors_of(int world, const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(world);
  std::mutex mu;
  GlooOptions opts;
  opts.timeout = std::chrono::seconds(20);
  const auto t0 = Clock::now();
  run_ranks(
      world,
      [&](Communicator& comm) {
        try {
          body(comm);
        } catch (const ConfigError& e) {
          std::lock_guard<std::mutex> lock(mu);
          errors[comm.rank()] = std::string("ConfigError: ") + e.what();
        }
      },
      opts);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0) << "took a timeout";
  return errors;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PipelineMismatch, RanksDisagreeingOnTheScheduleFailEverywhere) {
  std::vector<torch::nn::Sequential> models = {make_model(1), make_model(1)};
  const auto errors = errors_of(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = comm.rank() == 0 ? "1f1b" : "gpipe";
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
  });
  for (const auto& e : errors) EXPECT_TRUE(has(e, "ranks disagree on the schedule")) << e;
}

TEST(PipelineMismatch, RanksDisagreeingOnMicrobatchesFailEverywhere) {
  std::vector<torch::nn::Sequential> models = {make_model(1), make_model(1)};
  const auto errors = errors_of(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = "gpipe";
    o.num_microbatches = comm.rank() == 0 ? 4 : 2;
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
  });
  for (const auto& e : errors) {
    EXPECT_TRUE(has(e, "4 microbatches") && has(e, "2 microbatches")) << e;
  }
}

TEST(PipelineMismatch, RanksDisagreeingOnStageCountFailEverywhere) {
  std::vector<torch::nn::Sequential> models = {make_model(1), make_model(1)};
  const auto errors = errors_of(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = "interleaved";
    o.virtual_stages = comm.rank() == 0 ? 1 : 2;
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
  });
  for (const auto& e : errors) EXPECT_TRUE(has(e, "2 stages") && has(e, "4 stages")) << e;
}

TEST(PipelineMismatch, OneFOneBWithFewerMicrobatchesThanStagesFailsEverywhere) {
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < 4; ++r) models.push_back(make_model(1));
  const auto errors = errors_of(4, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = "1f1b";
    o.num_microbatches = 2;
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
  });
  for (const auto& e : errors) {
    EXPECT_TRUE(has(e,
                    "1F1B needs at least as many microbatches as stages: got 2 microbatches "
                    "for 4 stages"))
        << e;
  }
}

TEST(PipelineMismatch, TooSmallABatchAndDisagreeingBalanceFailEverywhere) {
  // The step's checks run (collectively) before any tensor moves, so both ranks fail with the
  // same reason.
  std::vector<torch::nn::Sequential> models = {make_model(1), make_model(1)};
  const auto batch = make_batch(8, 1);
  const auto errors = errors_of(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = "1f1b";
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
    pipe.train_step(batch.x.narrow(0, 0, 3), batch.y.narrow(0, 0, 3), mse);
  });
  for (const auto& e : errors) EXPECT_TRUE(has(e, "cannot be cut into 4 microbatches")) << e;
  const auto errors2 = errors_of(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.balance = comm.rank() == 0 ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{3, 5};
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
  });
  for (const auto& e : errors2) EXPECT_TRUE(has(e, "disagree")) << e;
}

TEST(PipelinePartition, BalancedByParametersOrProfileAndAgreedEverywhere) {
  EXPECT_EQ(partition_balanced({1, 1, 1, 1}, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(partition_balanced({10, 1, 1, 1, 1, 1}, 2), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(partition_balanced({1, 2, 3, 4, 5}, 3), (std::vector<int64_t>{3, 1, 1}));
  EXPECT_THROW(partition_balanced({1, 2}, 3), ConfigError);
  // Parameter counts 144, 0, 272, 32, 0, 204, 0, 52: {3, 5} keeps the larger part smallest.
  std::vector<torch::nn::Sequential> models = {make_model(1), make_model(1)};
  const auto sample = make_batch(16, 3).x;
  std::vector<std::vector<int64_t>> by_profile(2);
  run_ranks(2, [&](Communicator& comm) {
    PipelineOptions o;
    PipelineParallel by_params(models[comm.rank()], borrow(comm), o);
    int64_t sum = 0;
    for (auto b : by_params.balance()) sum += b;
    EXPECT_EQ(sum, 8);
    EXPECT_EQ(by_params.balance(), (std::vector<int64_t>{3, 5}));
    o.partition = Partition::kProfile;
    o.profile_input = sample;
    PipelineParallel profiled(models[comm.rank()], borrow(comm), o);
    by_profile[comm.rank()] = profiled.balance();
  });
  EXPECT_EQ(by_profile[0], by_profile[1]);
}

TEST(PipelineStats, MeasuredCostsBubbleTimelineAndRebalance) {
  std::vector<torch::nn::Sequential> models = {make_model(1), make_model(1)};
  const auto batch = make_batch(32, 3);
  run_ranks(2, [&](Communicator& comm) {
    PipelineOptions o;
    o.schedule = "zbh1";
    o.num_microbatches = 4;
    PipelineParallel pipe(models[comm.rank()], borrow(comm), o);
    for (int i = 0; i < 2; ++i) pipe.train_step(batch.x, batch.y, mse);
    const auto costs = pipe.measured_costs();
    ASSERT_EQ(costs.forward.size(), 2u);
    for (int s = 0; s < 2; ++s) {
      EXPECT_GT(costs.forward[s], 0);
      EXPECT_GT(costs.backward_input[s], 0);
      EXPECT_GT(costs.backward_weight[s], 0);
    }
    const auto sim = pipeline::simulate(pipe.schedule(), costs);
    EXPECT_GT(sim.makespan, 0);
    const auto bubble = pipe.measured_bubble();
    ASSERT_EQ(bubble.size(), 2u);
    for (double b : bubble) {
      EXPECT_GE(b, 0.0);
      EXPECT_LT(b, 1.0);
    }
    const auto timeline = pipe.gather_timeline();
    EXPECT_EQ(timeline.size(),
              pipe.schedule().actions[0].size() + pipe.schedule().actions[1].size());
    // Every SEND of the step is found and paired with its RECV on the shared clock.
    const auto transfers = pipeline::measured_comm_costs({timeline});
    EXPECT_GT(transfers.send_overhead, 0);
    EXPECT_GE(transfers.send_latency, 0);
    EXPECT_GE(transfers.recv_overhead, 0);
    const std::string svg = pipeline::to_svg(pipe.schedule(), timeline, "measured");
    EXPECT_NE(svg.find("<title>W1:3"), std::string::npos);
    for (auto bytes : pipe.peak_activation_bytes()) EXPECT_GT(bytes, 0);
    const auto balance = pipe.suggest_balance();
    int64_t sum = 0;
    for (auto b : balance) sum += b;
    EXPECT_EQ(sum, 8);
    EXPECT_EQ(balance.size(), 2u);
    // Re-balancing: a new pipeline from the suggestion still computes the right gradients.
    o.balance = balance;
    PipelineParallel rebalanced(models[comm.rank()], borrow(comm), o);
    EXPECT_EQ(rebalanced.balance(), balance);
  });
}

}  // namespace
}  // namespace tandem
