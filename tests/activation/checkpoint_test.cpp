// tandem::checkpoint and CheckpointedSequential on CPU: gradients bitwise equal to the plain
// computation (MLP, transformer blocks, multiple outputs, nested checkpoints, non-tensor
// arguments, inputs without grad, captured parameters), RNG replay for dropout without moving the
// caller's random stream, autocast replay, pipeline-stage style backward, retain_graph and
// torch::autograd::grad through a checkpoint, the misuse errors and the determinism check.
//
// torch::manual_seed is process-global: every test seeds before it builds models and draws data.
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/activation_checkpoint.h>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tandem {
namespace {

using Tensors = std::vector<at::Tensor>;

// ---------------------------------------------------------------------------------------------
// Models

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out, double dropout = 0.0) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, out));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = drop(torch::relu(fc1(x)));
    h = drop(torch::tanh(fc2(h)));
    return fc3(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Mlp);

// Pre-norm transformer block: multi-head self-attention and a GELU MLP, with dropout.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t heads, double dropout) : d_(d), heads_(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", torch::nn::Linear(d, 4 * d));
    fc2 = register_module("fc2", torch::nn::Linear(4 * d, d));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }
  at::Tensor forward(const at::Tensor& x) {  // [B, T, d]
    const int64_t b = x.size(0), t = x.size(1), dh = d_ / heads_;
    auto parts = qkv(ln1(x)).chunk(3, -1);
    auto split = [&](const at::Tensor& y) { return y.view({b, t, heads_, dh}).transpose(1, 2); };
    auto q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
    auto att = torch::softmax(q.matmul(k.transpose(-2, -1)) / std::sqrt(double(dh)), -1);
    auto o = drop(att).matmul(v).transpose(1, 2).reshape({b, t, d_});
    auto h = x + drop(proj(o));
    return h + drop(fc2(torch::gelu(fc1(ln2(h)))));
  }
  int64_t d_, heads_;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

// ---------------------------------------------------------------------------------------------
// Helpers

Tensors grads_of(torch::nn::Module& m) {
  Tensors g;
  for (const auto& p : m.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  return g;
}

void clear_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
}

void expect_bitwise(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::equal(got, want))
      << what << " differs by up to " << (got - want).abs().max().item<double>();
}

void expect_bitwise(const Tensors& got, const Tensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) expect_bitwise(got[i], want[i], what + " #" + std::to_string(i));
}

at::Tensor leaf(at::IntArrayRef sizes) { return torch::randn(sizes).requires_grad_(true); }

// Runs `loss_of(x)` and backward, returning x's gradient followed by m's parameter gradients.
template <class LossOf>
Tensors run_grads(torch::nn::Module& m, const at::Tensor& x0, LossOf loss_of) {
  clear_grads(m);
  auto x = x0.detach().clone().requires_grad_(true);
  loss_of(x).backward();
  Tensors g{x.grad().clone()};
  for (auto& t : grads_of(m)) g.push_back(t);
  clear_grads(m);
  return g;
}

std::string rng_bytes() {
  auto state = at::detail::getDefaultCPUGenerator().get_state();
  return std::string(static_cast<const char*>(state.data_ptr()), state.nbytes());
}

// ---------------------------------------------------------------------------------------------
// Gradients equal to the plain computation

TEST(ActivationCheckpoint, MlpGradientsBitwiseEqual) {
  torch::manual_seed(1);
  Mlp mlp(16, 32, 8);
  auto x = torch::randn({12, 16});
  auto plain = run_grads(*mlp, x, [&](const at::Tensor& in) { return mlp(in).pow(2).sum(); });
  int calls = 0;
  auto ckpt = run_grads(*mlp, x, [&](const at::Tensor& in) {
    auto y = activation_checkpoint(
        [&](const at::Tensor& h) {
          ++calls;
          return mlp(h);
        },
        in);
    // The output hangs off the checkpoint node, whose edges lead straight to the input and the
    // six parameters: none of fn's activations is referenced.
    EXPECT_EQ(y.grad_fn()->name(), "tandem::CheckpointBackward");
    EXPECT_EQ(y.grad_fn()->num_outputs(), 7u);
    for (const auto& e : y.grad_fn()->next_edges()) {
      EXPECT_EQ(e.function->name(), "torch::autograd::AccumulateGrad");
    }
    EXPECT_EQ(calls, 1);
    return y.pow(2).sum();
  });
  EXPECT_EQ(calls, 2) << "backward recomputes fn once";
  expect_bitwise(ckpt, plain, "MLP gradient");
}

TEST(ActivationCheckpoint, TransformerBlocksBitwiseEqual) {
  torch::manual_seed(2);
  torch::nn::Sequential seq(Block(16, 4, 0.0), Block(16, 4, 0.0), Block(16, 4, 0.0));
  auto x = torch::randn({2, 6, 16});
  auto plain = run_grads(*seq, x, [&](const at::Tensor& in) { return seq->forward(in).pow(2).mean(); });
  for (auto policy : {ActivationCheckpointPolicy::every(1),
                      ActivationCheckpointPolicy::every(1).checkpoint_last(true),
                      ActivationCheckpointPolicy::segments(2)}) {
    CheckpointedSequential net(seq, policy);
    auto ckpt = run_grads(*net, x, [&](const at::Tensor& in) { return net(in).pow(2).mean(); });
    expect_bitwise(ckpt, plain, "transformer " + net->describe());
  }
  // The generic function API with the blocks' parameters discovered by the first forward.
  auto fn = run_grads(*seq, x, [&](const at::Tensor& in) {
    auto h = activation_checkpoint(
        [&](const at::Tensor& y) { return seq[0]->as<Block>()->forward(y); }, in);
    h = activation_checkpoint([&](const at::Tensor& y) { return seq[1]->as<Block>()->forward(y); },
                              h);
    return seq[2]->as<Block>()->forward(h).pow(2).mean();
  });
  expect_bitwise(fn, plain, "transformer via activation_checkpoint()");
}

TEST(ActivationCheckpoint, DropoutReplaysRngAndLeavesCallerStreamAlone) {
  torch::manual_seed(3);
  torch::nn::Sequential seq(Block(16, 2, 0.3), Block(16, 2, 0.3), Block(16, 2, 0.3));
  CheckpointedSequential net(seq, ActivationCheckpointPolicy::every(1).checkpoint_last(true));
  auto x = torch::randn({2, 5, 16});

  torch::manual_seed(77);
  auto plain = run_grads(*seq, x, [&](const at::Tensor& in) { return seq->forward(in).pow(2).sum(); });
  const auto after_plain = torch::rand({8});

  torch::manual_seed(77);
  std::string before_backward;
  auto ckpt = run_grads(*net, x, [&](const at::Tensor& in) {
    auto loss = net(in).pow(2).sum();
    before_backward = rng_bytes();
    return loss;
  });
  EXPECT_EQ(rng_bytes(), before_backward) << "backward through checkpoints moved the caller's RNG";
  const auto after_ckpt = torch::rand({8});
  expect_bitwise(ckpt, plain, "dropout gradient");
  expect_bitwise(after_ckpt, after_plain, "caller's random stream after the step");

  // Without RNG preservation the recompute draws different masks: gradients differ.
  ActivationCheckpointOptions off;
  off.preserve_rng_state = false;
  CheckpointedSequential loose(seq, ActivationCheckpointPolicy::every(1).checkpoint_last(true),
                               off);
  torch::manual_seed(77);
  auto unpreserved = run_grads(*loose, x, [&](const at::Tensor& in) { return loose(in).pow(2).sum(); });
  EXPECT_FALSE(at::equal(unpreserved[0], plain[0]));
}

TEST(ActivationCheckpoint, MultipleOutputsSomeWithoutGradient) {
  torch::manual_seed(4);
  torch::nn::Linear lin(6, 6);
  auto x0 = torch::randn({5, 6});
  auto body = [&](const Tensors& in) {
    auto h = lin(in[0]);
    // tanh (used), sigmoid (unused by the loss), argmax (integer), the input itself.
    return Tensors{torch::tanh(h), torch::sigmoid(h), h.argmax(-1), in[0]};
  };
  auto loss_of = [&](const Tensors& out) {
    EXPECT_EQ(out[2].scalar_type(), at::kLong);
    EXPECT_FALSE(out[2].requires_grad());
    return (out[0] * out[3]).sum() + out[0].sum();
  };
  auto plain = run_grads(*lin, x0, [&](const at::Tensor& x) { return loss_of(body({x})); });
  auto ckpt = run_grads(
      *lin, x0, [&](const at::Tensor& x) { return loss_of(activation_checkpoint(body, {x})); });
  expect_bitwise(ckpt, plain, "multiple outputs");
}

TEST(ActivationCheckpoint, NestedCheckpoints) {
  torch::manual_seed(5);
  Mlp a(8, 16, 8, 0.2), b(8, 16, 8, 0.2);
  torch::nn::Sequential both(a, b);
  auto x = torch::randn({4, 8});
  torch::manual_seed(9);
  auto plain = run_grads(*both, x, [&](const at::Tensor& in) { return b(a(in)).pow(2).sum(); });
  torch::manual_seed(9);
  auto nested = run_grads(*both, x, [&](const at::Tensor& in) {
    return activation_checkpoint(
               [&](const at::Tensor& h) {
                 auto inner = activation_checkpoint([&](const at::Tensor& y) { return a(y); }, h);
                 return activation_checkpoint([&](const at::Tensor& y) { return b(y); }, inner);
               },
               in)
        .pow(2)
        .sum();
  });
  expect_bitwise(nested, plain, "nested checkpoints");
}

TEST(ActivationCheckpoint, NonTensorArgumentsCapturedByTheCallable) {
  torch::manual_seed(6);
  torch::nn::Linear lin(4, 4);
  auto x0 = torch::randn({3, 4});
  const double scale = 0.75;
  const int64_t dim = 1;
  const std::string mode = "softplus";
  auto f = [=](const at::Tensor& in) mutable {  // copies of the scalars and the module holder
    auto h = lin(in) * scale;
    h = mode == "softplus" ? torch::softplus(h) : torch::relu(h);
    return torch::cumsum(h, dim);
  };
  auto plain = run_grads(*lin, x0, [&](const at::Tensor& x) { return f(x).sum(); });
  auto ckpt =
      run_grads(*lin, x0, [&](const at::Tensor& x) { return activation_checkpoint(f, x).sum(); });
  expect_bitwise(ckpt, plain, "non-tensor arguments");
}

TEST(ActivationCheckpoint, InputsWithoutGradAndIntegerInputs) {
  torch::manual_seed(7);
  torch::nn::Embedding emb(10, 4);
  torch::nn::Linear lin(4, 4);
  torch::nn::Sequential both(emb, lin);
  auto ids = torch::randint(0, 10, {6});
  auto mask = torch::rand({6, 4});  // no grad
  auto body = [&](const Tensors& in) { return Tensors{lin(emb(in[0]) * in[1])}; };
  clear_grads(*both);
  body({ids, mask})[0].sum().backward();
  auto plain = grads_of(*both);
  clear_grads(*both);
  auto out = activation_checkpoint(body, {ids, mask})[0];
  ASSERT_TRUE(out.requires_grad());
  out.sum().backward();
  expect_bitwise(grads_of(*both), plain, "no-grad inputs");
  EXPECT_FALSE(mask.grad().defined());

  // Nothing requires grad: no checkpoint node, outputs plain.
  torch::NoGradGuard no_grad;
  auto y = activation_checkpoint([&](const at::Tensor& t) { return t * 2; }, mask);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_FALSE(y.grad_fn());
}

// A post hook on AccumulateGrad counting how often it fires.
struct CountHook : torch::autograd::FunctionPostHook {
  explicit CountHook(std::shared_ptr<int> n) : n_(std::move(n)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ++*n_;
    return outputs;
  }
  std::shared_ptr<int> n_;
};

TEST(ActivationCheckpoint, ParametersAccumulateOncePerBackwardInTheOuterGraph) {
  torch::manual_seed(8);
  torch::nn::Linear lin(5, 5);
  std::vector<std::shared_ptr<int>> counts;
  std::vector<std::shared_ptr<torch::autograd::Node>> accs;
  for (auto& p : lin->parameters()) {
    counts.push_back(std::make_shared<int>(0));
    accs.push_back(torch::autograd::impl::grad_accumulator(p));
    accs.back()->add_post_hook(std::make_unique<CountHook>(counts.back()));
  }
  auto x = torch::randn({3, 5});
  // The parameter is used twice inside the checkpoint: still one accumulation.
  auto y = activation_checkpoint([&](const at::Tensor& h) { return lin(torch::tanh(lin(h))); }, x);
  y.sum().backward();
  for (auto& c : counts) EXPECT_EQ(*c, 1);

  // Declared parameters (as CheckpointedSequential does) behave the same.
  ActivationCheckpointOptions declared;
  declared.parameters = lin->parameters();
  auto z = activation_checkpoint([&](const at::Tensor& h) { return lin(h); }, x, declared);
  z.sum().backward();
  for (auto& c : counts) EXPECT_EQ(*c, 2);
}

TEST(ActivationCheckpoint, UndeclaredParameterIsAnError) {
  torch::manual_seed(9);
  torch::nn::Linear a(4, 4), b(4, 4);
  ActivationCheckpointOptions opts;
  opts.name = "ab";
  opts.parameters = a->parameters();  // b's are missing
  auto x = leaf({2, 4});
  auto y = activation_checkpoint([&](const at::Tensor& h) { return b(a(h)); }, x, opts);
  try {
    y.sum().backward();
    FAIL() << "expected ActivationCheckpointError";
  } catch (const ActivationCheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'ab'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("options.parameters"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Backward variants

TEST(ActivationCheckpoint, RetainGraphBackwardTwiceWorksWithoutItThrows) {
  torch::manual_seed(10);
  Mlp mlp(6, 8, 3, 0.25);
  auto x0 = torch::randn({4, 6});
  auto twice = [&](bool ckpt) {
    clear_grads(*mlp);
    torch::manual_seed(11);
    auto x = x0.clone().requires_grad_(true);
    auto y = ckpt ? activation_checkpoint([&](const at::Tensor& h) { return mlp(h); }, x) : mlp(x);
    auto loss = y.sum();
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
    Tensors g{x.grad().clone()};
    for (auto& t : grads_of(*mlp)) g.push_back(t);
    return g;
  };
  expect_bitwise(twice(true), twice(false), "two backwards with retain_graph");

  auto x = x0.clone().requires_grad_(true);
  ActivationCheckpointOptions opts;
  opts.name = "once";
  auto loss = activation_checkpoint([&](const at::Tensor& h) { return mlp(h); }, x, opts).sum();
  loss.backward();
  try {
    loss.backward();
    FAIL() << "expected ActivationCheckpointError";
  } catch (const ActivationCheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'once'"), std::string::npos) << e.what();
  }
}

TEST(ActivationCheckpoint, AutogradGradThroughCheckpointWorksCreateGraphThrows) {
  torch::manual_seed(12);
  torch::nn::Linear lin(5, 5);
  auto x = leaf({3, 5});
  auto w = lin->weight;
  auto want = torch::autograd::grad({torch::tanh(lin(x)).pow(2).sum()}, {x, w});
  auto y = activation_checkpoint([&](const at::Tensor& h) { return torch::tanh(lin(h)); }, x);
  auto got = torch::autograd::grad({y.pow(2).sum()}, {x, w});
  expect_bitwise(got, want, "torch::autograd::grad");
  EXPECT_FALSE(w.grad().defined()) << "grad() must not accumulate into .grad";

  auto y2 = activation_checkpoint([&](const at::Tensor& h) { return torch::tanh(lin(h)); }, x);
  EXPECT_THROW(torch::autograd::grad({y2.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true),
               ActivationCheckpointError);
}

TEST(ActivationCheckpoint, PipelineStageStyleInterleavedMicrobatches) {
  // A stage receives activations, runs forward for two microbatches, then gets the gradient of
  // each output from the next stage (torch::autograd::backward with explicit grad_outputs), in 1F1B
  // order, with dropout.
  torch::manual_seed(13);
  torch::nn::Sequential stage(Block(8, 2, 0.2), Block(8, 2, 0.2));
  CheckpointedSequential ckpt(stage, ActivationCheckpointPolicy::every(1).checkpoint_last(true));
  auto in0 = torch::randn({2, 3, 8}), in1 = torch::randn({2, 3, 8});
  auto g0 = torch::randn({2, 3, 8}), g1 = torch::randn({2, 3, 8});
  auto run = [&](const std::function<at::Tensor(const at::Tensor&)>& f) {
    clear_grads(*stage);
    torch::manual_seed(21);
    auto a = in0.clone().requires_grad_(true), b = in1.clone().requires_grad_(true);
    auto ya = f(a);
    auto yb = f(b);
    torch::autograd::backward({ya}, {g0});
    auto c = in0.clone().requires_grad_(true);
    auto yc = f(c);  // the next microbatch's forward between two backwards
    torch::autograd::backward({yb}, {g1});
    torch::autograd::backward({yc}, {g1});
    Tensors g{a.grad().clone(), b.grad().clone(), c.grad().clone()};
    for (auto& t : grads_of(*stage)) g.push_back(t);
    return g;
  };
  auto plain = run([&](const at::Tensor& x) { return stage->forward(x); });
  auto checkpointed = run([&](const at::Tensor& x) { return ckpt(x); });
  expect_bitwise(checkpointed, plain, "pipeline stage");
}

TEST(ActivationCheckpoint, AutocastStateReplayedAndRestored) {
  torch::manual_seed(14);
  torch::nn::Linear lin(8, 8);
  auto x0 = torch::randn({4, 8});
  auto grads_under_autocast = [&](bool ckpt) {
    clear_grads(*lin);
    auto x = x0.clone().requires_grad_(true);
    at::Tensor y;
    {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      y = ckpt ? activation_checkpoint([&](const at::Tensor& h) { return torch::relu(lin(h)); }, x)
               : torch::relu(lin(x));
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    }
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    y.to(at::kFloat).pow(2).sum().backward();  // backward outside the autocast region
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
    Tensors g{x.grad().clone()};
    for (auto& t : grads_of(*lin)) g.push_back(t);
    return g;
  };
  expect_bitwise(grads_under_autocast(true), grads_under_autocast(false), "autocast");
}

TEST(ActivationCheckpoint, GradModeDisabledRunsFnPlainly) {
  torch::nn::Linear lin(3, 3);
  int calls = 0;
  torch::NoGradGuard no_grad;
  auto y = activation_checkpoint(
      [&](const at::Tensor& h) {
        ++calls;
        return lin(h);
      },
      leaf({2, 3}));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
}

// ---------------------------------------------------------------------------------------------
// Misuse and the determinism check

TEST(ActivationCheckpoint, InputModifiedInPlaceBeforeBackwardThrows) {
  torch::nn::Linear lin(3, 3);
  auto x = torch::randn({2, 3});  // no grad: may be modified in place by the caller
  auto y = activation_checkpoint([&](const at::Tensor& h) { return lin(h); }, x);
  x.add_(1);
  EXPECT_THROW(y.sum().backward(), ActivationCheckpointError);
}

TEST(ActivationCheckpoint, DeterminismCheckCatchesPlantedNondeterminism) {
  torch::nn::Linear lin(4, 4);
  auto x = leaf({3, 4});

  // Shape changes between forward and recompute: caught by the default metadata check.
  int calls = 0;
  ActivationCheckpointOptions opts;
  opts.name = "planted";
  auto y = activation_checkpoint(
      [&](const at::Tensor& h) { return lin(h).narrow(0, 0, 3 - calls++); }, x, opts);
  try {
    y.sum().backward();
    FAIL() << "expected ActivationCheckpointError";
  } catch (const ActivationCheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'planted'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("RecomputeCheck::kNone"), std::string::npos) << msg;
  }

  // Different values, same shapes: only kValues catches it.
  int draws = 0;
  auto noisy = [&](const at::Tensor& h) { return lin(h) + static_cast<double>(draws++); };
  auto quiet = activation_checkpoint(noisy, x);  // kMetadata
  EXPECT_NO_THROW(quiet.sum().backward());
  opts.check = RecomputeCheck::kValues;
  auto loud = activation_checkpoint(noisy, x, opts);
  EXPECT_THROW(loud.sum().backward(), ActivationCheckpointError);

  // A different number of outputs.
  int n = 1;
  auto grow =
      activation_checkpoint([&](const Tensors& in) { return Tensors(n++, lin(in[0])); }, {x});
  EXPECT_THROW(grow[0].sum().backward(), ActivationCheckpointError);

  // The recompute reaches a parameter the forward did not use.
  torch::nn::Linear other(4, 4);
  bool second = false;
  auto branchy = activation_checkpoint(
      [&](const at::Tensor& h) { return (second = !second) ? lin(h) : other(h); }, x);
  EXPECT_THROW(branchy.sum().backward(), ActivationCheckpointError);
}

// ---------------------------------------------------------------------------------------------
// ActivationCheckpointPolicy and CheckpointedSequential

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> children_of(
    const torch::nn::Sequential& seq) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  for (const auto& item : seq->named_children()) out.emplace_back(item.key(), item.value());
  return out;
}

std::string plan_string(const std::vector<ActivationCheckpointSegment>& plan) {
  std::string s;
  for (const auto& seg : plan) {
    s += (s.empty() ? "" : " ") + std::to_string(seg.begin) + "-" + std::to_string(seg.end) +
         (seg.checkpointed ? "c" : "p");
  }
  return s;
}

TEST(ActivationCheckpointPolicy, Plans) {
  torch::nn::Sequential seq;
  for (int i = 0; i < 10; ++i) {
    if (i % 2 == 0) seq->push_back(torch::nn::Linear(2, 2));
    else seq->push_back(torch::nn::ReLU());
  }
  const auto ch = children_of(seq);
  EXPECT_EQ(plan_string(ActivationCheckpointPolicy::none().plan(ch)), "0-10p");
  EXPECT_EQ(plan_string(ActivationCheckpointPolicy::segments(3).plan(ch)), "0-4c 4-7c 7-10p");
  EXPECT_EQ(plan_string(ActivationCheckpointPolicy::segments(3).checkpoint_last(true).plan(ch)),
            "0-4c 4-7c 7-10c");
  EXPECT_EQ(plan_string(ActivationCheckpointPolicy::segments(50).plan(ch)).substr(0, 8),
            "0-1c 1-2");
  EXPECT_EQ(plan_string(ActivationCheckpointPolicy::every(4).plan(ch)), "0-4c 4-8c 8-10p");
  EXPECT_EQ(plan_string(ActivationCheckpointPolicy::sqrt().plan(ch)),
            "0-4c 4-7c 7-10p");  // round(√10) = 3
  EXPECT_EQ(ch[0].second->name(), "torch::nn::LinearImpl");
  EXPECT_EQ(plan_string(ActivationCheckpointPolicy::select([](const std::string&,
                                                              const torch::nn::Module& m) {
                          return m.name() == "torch::nn::LinearImpl";
                        }).plan(ch)),
            "0-1c 1-2p 2-3c 3-4p 4-5c 5-6p 6-7c 7-8p 8-9c 9-10p");
  EXPECT_EQ(plan_string(ActivationCheckpointPolicy::select([](const std::string& name,
                                                              const torch::nn::Module&) {
                          return name == "9";
                        }).plan(ch)),
            "0-9p 9-10c");
  EXPECT_THROW(ActivationCheckpointPolicy::segments(0), ConfigError);
  EXPECT_THROW(ActivationCheckpointPolicy::every(0), ConfigError);
}

TEST(CheckpointedSequential, EveryPolicyMatchesPlainSequentialAndNames) {
  torch::manual_seed(15);
  torch::nn::Sequential seq;
  for (int i = 0; i < 8; ++i) {
    seq->push_back(torch::nn::Linear(6, 6));
    seq->push_back(torch::nn::Tanh());
  }
  auto x = torch::randn({5, 6});
  auto plain = run_grads(*seq, x, [&](const at::Tensor& in) { return seq->forward(in).pow(2).sum(); });
  auto selector =
      ActivationCheckpointPolicy::select([](const std::string&, const torch::nn::Module& m) {
        return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr;
      });
  EXPECT_EQ(CheckpointedSequential(seq, selector)->describe(),
            "select: 16 runs: [0,1) ckpt, [1,2) plain, [2,3) ckpt, [3,4) plain, [4,5) ckpt, [5,6) "
            "plain, [6,7) ckpt, [7,8) plain, [8,9) ckpt, [9,10) plain, [10,11) ckpt, [11,12) plain, "
            "[12,13) ckpt, [13,14) plain, [14,15) ckpt, [15,16) plain");
  for (const auto& policy :
       {ActivationCheckpointPolicy::none(), ActivationCheckpointPolicy::segments(3),
        ActivationCheckpointPolicy::every(3).checkpoint_last(true),
        ActivationCheckpointPolicy::sqrt(), selector}) {
    CheckpointedSequential net(seq, policy);
    auto names = net->named_parameters().keys();
    EXPECT_EQ(names, seq->named_parameters().keys());
    auto got = run_grads(*net, x, [&](const at::Tensor& in) { return net(in).pow(2).sum(); });
    expect_bitwise(got, plain, net->describe());
  }
}

}  // namespace
}  // namespace tandem
