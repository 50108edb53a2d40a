// Checkpoints of CUDA tensors (label gpu; every test skips where torch sees no CUDA device):
// - a CUDA model with AdamW saved synchronously, asynchronously, and asynchronously with the
//   parameters' and moments' copies deferred past save() (a CheckpointStagingFence, as tandem's
//   wrappers hold), resumed bitwise onto the GPU, and its next step bitwise too;
// - the async save's snapshot is the state when save() was called, whatever the GPU still had
//   queued before it (the copy waits for the producer) and whatever the loop queues after it
//   (the loop's stream waits for the copy, or the loop waits for wait_for_checkpoint_staging());
// - a deferred tensor changed before wait_for_checkpoint_staging() fails the save, by name;
// - a checkpoint of a CPU model resumes onto a CUDA one (state on the parameters' device).
// The wrappers at every sharding stage: tests/gpu/checkpoint_round_trip_test.cpp.
#include "tests/checkpoint/checkpoint_test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <optional>

namespace tandem::ckpt_test {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// Linear -> ReLU -> Linear and a buffer the forward changes (what an async save copies before
// save() returns).
struct GpuNet : torch::nn::Module {
  GpuNet()
      : fc1(register_module("fc1", torch::nn::Linear(64, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 8))) {
    calls = register_buffer("calls", at::zeros({1}));
  }
  at::Tensor forward(const at::Tensor& x) {
    calls.add_(1);
    return fc2(at::relu(fc1(x)));
  }
  torch::nn::Linear fc1, fc2;
  at::Tensor calls;
};

struct Trained {
  std::shared_ptr<GpuNet> net;
  std::unique_ptr<torch::optim::AdamW> opt;
};

Trained make(uint64_t seed, c10::Device device) {
  torch::manual_seed(seed);
  Trained t;
  t.net = std::make_shared<GpuNet>();
  t.net->to(device);
  t.opt = std::make_unique<torch::optim::AdamW>(t.net->parameters(),
                                                torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  return t;
}

// One step on batch `s` (the same on every run).
void step(Trained& t, int64_t s) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + s);
  const c10::Device device = t.net->fc1->weight.device();
  const at::Tensor x = at::randn({32, 64}, gen).to(device);
  const at::Tensor y = at::randn({32, 8}, gen).to(device);
  t.opt->zero_grad();
  (t.net->forward(x) - y).pow(2).mean().backward();
  wait_for_checkpoint_staging();  // what tandem's wrappers do at the end of backward
  t.opt->step();
}

// Parameters, buffers and AdamW state, on the host.
std::map<std::string, at::Tensor> state_of(Trained& t) {
  std::map<std::string, at::Tensor> m;
  for (auto& [k, v] : snapshot(t.net->named_parameters(), t.net->named_buffers())) m[k] = v.cpu();
  for (auto& [k, v] : optimizer_snapshot({t.opt.get()})) m[k] = v.cpu();
  return m;
}

// "" when every parameter, buffer and AdamW moment is on `device`.
std::string off_device(Trained& t, c10::Device device) {
  for (const auto& p : t.net->named_parameters()) {
    if (p.value().device() != device) return p.key() + " is on " + p.value().device().str();
  }
  for (const auto& b : t.net->named_buffers()) {
    if (b.value().device() != device) return b.key() + " is on " + b.value().device().str();
  }
  for (const auto& [key, v] : optimizer_snapshot({t.opt.get()})) {
    if (key.size() > 5 && key.substr(key.size() - 5) == ".step") continue;  // a host number
    if (v.device() != device) return "AdamW state " + key + " is on " + v.device().str();
  }
  return "";
}

enum class Mode { kSync, kAsync, kAsyncDeferred };

class CudaCheckpoint : public ::testing::TestWithParam<Mode> {};

TEST_P(CudaCheckpoint, ResumesBitwiseOntoTheGpuAndTheNextStepIsBitwiseToo) {
  SKIP_WITHOUT_CUDA();
  const Mode mode = GetParam();
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  TempDir dir("gpu_round_trip_" + std::to_string(static_cast<int>(mode)));
  std::map<std::string, at::Tensor> saved, next;
  {
    Trained t = make(1, cuda);
    std::optional<CheckpointStagingFence> fence;
    if (mode == Mode::kAsyncDeferred) fence.emplace();
    CheckpointManager m(options(dir.path, mode != Mode::kSync));
    m.add_module("model", t.net);
    m.add_optimizer("optim", *t.opt);
    for (int s = 0; s < 3; ++s) step(t, s);
    saved = state_of(t);
    m.save(3);
    step(t, 3);  // async: while the save still copies
    next = state_of(t);
    m.wait();
    const SaveStats st = m.last_save_stats();
    if (mode == Mode::kAsyncDeferred) {
      uint64_t params = 0;
      for (const auto& p : t.net->parameters()) params += p.numel() * sizeof(float);
      EXPECT_EQ(st.deferred_bytes, 3 * params) << "parameters and moments copied after save()";
    } else {
      EXPECT_EQ(st.deferred_bytes, 0u);
    }
  }
  Trained r = make(2, cuda);
  CheckpointManager m(options(dir.path, mode != Mode::kSync));
  m.add_module("model", r.net);
  m.add_optimizer("optim", *r.opt);
  ASSERT_EQ(m.resume(), 3);
  EXPECT_EQ(off_device(r, cuda), "");
  expect_bitwise(saved, state_of(r), "after resume");
  step(r, 3);
  EXPECT_EQ(off_device(r, cuda), "");
  expect_bitwise(next, state_of(r), "after the next step");
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaCheckpoint,
                         ::testing::Values(Mode::kSync, Mode::kAsync, Mode::kAsyncDeferred),
                         [](const auto& info) {
                           return info.param == Mode::kSync    ? std::string("Sync")
                                  : info.param == Mode::kAsync ? std::string("Async")
                                                               : std::string("AsyncDeferred");
                         });

// Keeps the GPU busy for tens of milliseconds on the current stream.
void queue_slow_work(c10::Device device) {
  at::Tensor a = at::rand({4096, 4096}, at::device(device));
  for (int i = 0; i < 20; ++i) a = at::tanh(at::mm(a, a));
}

// 64 MiB on the GPU, written 7 by a kernel queued behind slow work when save() is called, and 9
// right after: the checkpoint holds 7 (and the save fails instead, naming it, where a deferred
// tensor changes before wait_for_checkpoint_staging()).
class CudaSnapshot : public ::testing::TestWithParam<bool> {};

TEST_P(CudaSnapshot, AnAsyncSaveHoldsTheValuesOfTheMomentItWasCalled) {
  SKIP_WITHOUT_CUDA();
  const bool deferred = GetParam();
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  TempDir dir(deferred ? "gpu_snapshot_deferred" : "gpu_snapshot");
  at::Tensor x = at::zeros({16 << 20}, at::device(cuda)).requires_grad_(deferred);
  std::optional<CheckpointStagingFence> fence;
  if (deferred) fence.emplace();
  at::Tensor loaded;
  auto get = [&] { return std::map<std::string, at::Tensor>{{"x", x}}; };
  auto set = [&](const std::map<std::string, at::Tensor>& l) { loaded = l.at("x"); };
  {
    CheckpointManager m(options(dir.path, true));
    m.add_tensors("t", get, set);
    torch::NoGradGuard no_grad;
    queue_slow_work(cuda);
    x.fill_(7);
    m.save(1);
    if (deferred) wait_for_checkpoint_staging();  // the promise a fence makes
    x.fill_(9);
    m.wait();
  }
  CheckpointManager r(options(dir.path, true));
  r.add_tensors("t", get, set);
  ASSERT_EQ(r.resume(), 1);
  ASSERT_TRUE(loaded.defined());
  EXPECT_TRUE(loaded.device().is_cpu()) << "callbacks get host tensors";
  EXPECT_EQ(at::count_nonzero(loaded != 7).item<int64_t>(), 0) << "elements not 7";
}

INSTANTIATE_TEST_SUITE_P(CopiedBeforeOrAfterSaveReturns, CudaSnapshot, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Deferred" : "Immediate"; });

TEST(CudaCheckpoint, ADeferredTensorChangedBeforeTheFenceFailsTheSaveByName) {
  SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  TempDir dir("gpu_fence_broken");
  at::Tensor w = at::zeros({1 << 20}, at::device(cuda)).requires_grad_();
  CheckpointStagingFence fence;
  CheckpointManager m(options(dir.path, true));
  m.add_tensors(
      "t", [&] { return std::map<std::string, at::Tensor>{{"w", w}}; },
      [](const std::map<std::string, at::Tensor>&) {});
  torch::NoGradGuard no_grad;
  queue_slow_work(cuda);  // the copy cannot have started when w changes below
  m.save(1);
  w.add_(1);  // before wait_for_checkpoint_staging(): a broken promise
  try {
    m.wait();
    FAIL() << "the save committed a tensor that changed while it was copied";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("\"t/w\" changed before the asynchronous save copied it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(m.committed_steps().empty());
}

TEST(CudaCheckpoint, ACheckpointOfACpuModelResumesOntoTheGpu) {
  SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  TempDir dir("cpu_to_gpu");
  std::map<std::string, at::Tensor> saved;
  {
    Trained t = make(1, c10::Device(c10::DeviceType::CPU));
    for (int s = 0; s < 2; ++s) step(t, s);
    saved = state_of(t);
    CheckpointManager m(options(dir.path, false));
    m.add_module("model", t.net);
    m.add_optimizer("optim", *t.opt);
    m.save(2);
  }
  Trained r = make(2, cuda);
  CheckpointManager m(options(dir.path, false));
  m.add_module("model", r.net);
  m.add_optimizer("optim", *r.opt);
  ASSERT_EQ(m.resume(), 2);
  EXPECT_EQ(off_device(r, cuda), "");
  expect_bitwise(saved, state_of(r), "after resume");
  step(r, 2);  // AdamW steps on the GPU with the resumed state
  EXPECT_EQ(off_device(r, cuda), "");
}

}  // namespace
}  // namespace tandem::ckpt_test
