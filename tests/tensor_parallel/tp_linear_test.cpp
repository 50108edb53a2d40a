// The Megatron MLP (column-parallel up, row-parallel down) against the plain one, in the style of
// PyTorch's and Megatron's TP tests: the same initial weights, then outputs, gradients (this
// rank's slices) and parameters after 10 AdamW steps compared in float64, with tp = 1, 2, 4 as
// threads; plain TP and sequence parallel; and the exact collectives per step, from the flight
// recorder, against the theory.
//
// Tolerance, from the reduction order: each output element is a dot product of K <= 32 terms of
// magnitude below 1, which the plain model sums in one order and TP in another (each rank's
// part, then the all-reduce). Each order is within gamma_K * sum|a_i b_i| <= 32 * 2^-53 * 32
// ~ 1.1e-13 of the exact sum, so the two differ by at most ~2.3e-13; the ops after it (tanh,
// the mean-squared error and their gradients) add a few ulps. Outputs and gradients: 1e-12.
// AdamW's update lr * m / (sqrt(v) + eps) is scale-free in the gradient, so relative gradient
// differences of ~1e-11 (gradients here are above 1e-3) move each update by ~lr * 1e-11; over 10
// steps at lr 1e-2 that is ~1e-12: parameters 1e-10.
#include "tests/support/test_support.h"

#include <tandem/collectives/flight_recorder.h>
#include <tandem/runtime/tensor_parallel.h>

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <map>
#include <mutex>

namespace tandem {
namespace {

constexpr int kSteps = 10;
constexpr double kOutputTolerance = 1e-12;
constexpr double kParameterTolerance = 1e-10;

struct PlainMlpImpl : torch::nn::Module {
  PlainMlpImpl()
      : up(register_module("up", torch::nn::Linear(16, 32))),
        down(register_module("down", torch::nn::Linear(32, 16))) {}
  at::Tensor forward(const at::Tensor& x) { return down(torch::tanh(up(x))); }
  torch::nn::Linear up, down;
};
TORCH_MODULE(PlainMlp);

ColumnParallelOptions column_options(bool sp) {
  ColumnParallelOptions o;
  o.sequence_parallel = sp;
  return o;
}

RowParallelOptions row_options(bool sp) {
  RowParallelOptions o;
  o.input_is_parallel = true;
  o.sequence_parallel = sp;
  return o;
}

struct TpMlpImpl : torch::nn::Module {
  TpMlpImpl(const PlainMlpImpl& plain, const std::shared_ptr<Communicator>& tp, bool sp)
      : up(register_module("up", ColumnParallelLinear(*plain.up, tp, column_options(sp)))),
        down(register_module("down", RowParallelLinear(*plain.down, tp, row_options(sp)))) {}
  at::Tensor forward(const at::Tensor& x) { return down(torch::tanh(up(x))); }
  ColumnParallelLinear up;
  RowParallelLinear down;
};
TORCH_MODULE(TpMlp);

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a - b).abs().max().item<double>();
}

// What the plain model does over the steps, recorded once in the main thread.
struct Reference {
  at::Tensor out0, x_grad0, up_grad0, down_grad0;  // the first step's
  std::map<std::string, at::Tensor> after;          // parameters after kSteps
};

Reference train_plain(const PlainMlp& init, const at::Tensor& x, const at::Tensor& y) {
  PlainMlp m;
  m->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  const auto from = init->named_parameters();
  for (auto& item : m->named_parameters()) item.value().copy_(from[item.key()]);
  Reference r;
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    torch::AutoGradMode grad(true);
    const at::Tensor input = x.detach().requires_grad_(true);
    opt.zero_grad();
    const at::Tensor out = m->forward(input);
    torch::mse_loss(out, y).backward();
    if (step == 0) {
      r.out0 = out.detach().clone();
      r.x_grad0 = input.grad().clone();
      r.up_grad0 = m->up->weight.grad().clone();
      r.down_grad0 = m->down->weight.grad().clone();
    }
    opt.step();
  }
  for (const auto& item : m->named_parameters()) r.after[item.key()] = item.value().detach().clone();
  return r;
}

size_t count(const std::vector<FlightRecorder::Entry>& entries, const std::string& op) {
  size_t n = 0;
  for (const auto& e : entries) n += e.op == op;
  return n;
}

struct Case {
  int tp;
  bool sequence_parallel;
};

class TensorParallelMlp : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelMlp, MatchesThePlainModelOverTenAdamWSteps) {
  const auto [tp_size, sp] = GetParam();
  torch::manual_seed(11);
  PlainMlp plain;
  plain->to(torch::kDouble);
  // Sequence-major activations [seq 8, batch 2, features 16]: sequence parallel splits dim 0.
  const at::Tensor x = torch::randn({8, 2, 16}, torch::kDouble);
  const at::Tensor y = torch::randn({8, 2, 16}, torch::kDouble);
  const Reference ref = train_plain(plain, x, y);

  FlightRecorder::instance().reset(4096, true);
  testing::run_ranks(tp_size, [&](Communicator& comm) {
    auto tp = testing::borrow(comm);
    TpMlp model(*plain, tp, sp);
    const int64_t n = 8 / tp_size, r = comm.rank();
    // Under sequence parallel each rank holds its slice of the sequence, in and out.
    auto local = [&](const at::Tensor& t) { return sp ? t.narrow(0, r * n, n) : t; };
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < kSteps; ++step) {
      const at::Tensor input = local(x).detach().clone().requires_grad_(true);
      opt.zero_grad();
      const at::Tensor out = model->forward(input);
      // The sum over ranks of each rank's slice of the mean is the plain loss.
      ((out - local(y)).pow(2).sum() / y.numel()).backward();
      for (at::Tensor& p : tensor_parallel_partial_parameters(*model)) {
        comm.allreduce(p.mutable_grad())->wait();
      }
      if (step == 0) {
        EXPECT_LE(max_diff(out, local(ref.out0)), kOutputTolerance);
        EXPECT_LE(max_diff(input.grad(), local(ref.x_grad0)), kOutputTolerance);
        const int64_t up_rows = 32 / tp_size;
        EXPECT_LE(max_diff(model->up->weight.grad(), ref.up_grad0.narrow(0, r * up_rows, up_rows)),
                  kOutputTolerance);
        EXPECT_LE(max_diff(model->down->weight.grad(),
                           ref.down_grad0.narrow(1, r * up_rows, up_rows)),
                  kOutputTolerance);
      }
      opt.step();
    }
    const int64_t k = 32 / tp_size;
    EXPECT_LE(max_diff(model->up->weight, ref.after.at("up.weight").narrow(0, r * k, k)),
              kParameterTolerance);
    EXPECT_LE(max_diff(model->up->bias, ref.after.at("up.bias").narrow(0, r * k, k)),
              kParameterTolerance);
    EXPECT_LE(max_diff(model->down->weight, ref.after.at("down.weight").narrow(1, r * k, k)),
              kParameterTolerance);
    EXPECT_LE(max_diff(model->down->bias, ref.after.at("down.bias")), kParameterTolerance);
  });

  // Per rank and step. Plain TP: the row layer's forward all-reduce and the column layer's
  // backward all-reduce of the input gradient. Sequence parallel: an all-gather in and a
  // reduce-scatter out forward, the opposite backward, and the row bias's partial gradients
  // summed. A group of one sends nothing.
  const auto entries = FlightRecorder::instance().entries();
  const size_t per_step = tp_size > 1 ? static_cast<size_t>(tp_size) * kSteps : 0;
  EXPECT_EQ(count(entries, "allreduce"), (sp ? 1 : 2) * per_step);
  EXPECT_EQ(count(entries, "allgather"), (sp ? 2 : 0) * per_step);
  EXPECT_EQ(count(entries, "reduce_scatter"), (sp ? 2 : 0) * per_step);
  FlightRecorder::instance().reset(2048, true);
}

INSTANTIATE_TEST_SUITE_P(Degrees, TensorParallelMlp,
                         ::testing::Values(Case{1, false}, Case{2, false}, Case{4, false},
                                           Case{2, true}, Case{4, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "tp" + std::to_string(info.param.tp) +
                                  (info.param.sequence_parallel ? "_sequence_parallel" : "");
                         });

// Built with the sizes from the same seed, every rank holds exactly its slice of the plain
// model's weights: bitwise, float32.
TEST(TensorParallelInit, TheSameSeedGivesEachRankItsSliceOfThePlainWeights) {
  torch::manual_seed(5);
  PlainMlp plain;
  std::mutex generator;  // the global generator: one rank draws at a time, from the same seed
  testing::run_ranks(2, [&](Communicator& comm) {
    auto tp = testing::borrow(comm);
    std::unique_lock<std::mutex> lock(generator);
    torch::manual_seed(5);
    ColumnParallelLinear up(16, 32, tp);
    RowParallelLinear down(32, 16, tp);
    lock.unlock();
    const int64_t r = comm.rank();
    EXPECT_TRUE(up->weight.equal(plain->up->weight.narrow(0, r * 16, 16)));
    EXPECT_TRUE(up->bias.equal(plain->up->bias.narrow(0, r * 16, 16)));
    EXPECT_TRUE(down->weight.equal(plain->down->weight.narrow(1, r * 16, 16)));
    EXPECT_TRUE(down->bias.equal(plain->down->bias));
  });
}

TEST(TensorParallelInit, FeaturesTheGroupDoesNotDivideAreAConfigErrorNamingTheKey) {
  testing::run_ranks(3, [&](Communicator& comm) {
    const std::string message =
        testing::config_error_of([&] { ColumnParallelLinear(16, 32, testing::borrow(comm)); });
    EXPECT_NE(message.find("32 features cannot split over 3"), std::string::npos) << message;
    EXPECT_NE(message.find("--set parallel.tp="), std::string::npos) << message;
  });
}

}  // namespace
}  // namespace tandem
