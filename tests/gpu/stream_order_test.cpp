// Stream order on a GPU (issue 37). On a CPU, or on the legacy default stream, a missing stream
// dependency cannot show; here training runs on a side stream that a chain of large matmuls holds
// before each backward, so work that does not wait for that stream reads buffers before they are
// written - every time, not in a rare race. Each case must end bit for bit as the same run on the
// default stream without the delay:
//  - every compressing codec under DistributedDataParallel (world 1 over NCCL): the codec's thread
//    waits for the stream that filled the bucket, and the optimizer's stream for the codec's;
//  - top-k's decode over three ranks (threads over Gloo, host-staged; no backward, so threads are
//    safe): the same bits in 100 runs, although the ranks pick many of the same entries;
//  - no codec stage reads back to the host, so backward() does not wait for the GPU.
// Both need a GPU: the CPU rehearsal skips them.
#include "tests/gpu/gpu_trainer.h"
#include "tests/support/test_support.h"

#include <tandem/collectives/compression.h>
#include <tandem/runtime/distributed_data_parallel.h>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace tandem::gpu_test {
namespace {

bool rehearsal() { return test_device().is_cpu(); }

// Queues `matmuls` float32 4096 x 4096 products on the current stream: 40 are about 100 ms on
// an H100 or H200 (no TF32: libtorch's default).
void delay_current_stream(int matmuls = 40) {
  const at::Tensor a = at::randn({4096, 4096}, at::TensorOptions(test_device()));
  at::Tensor b = a;
  for (int i = 0; i < matmuls; ++i) b = at::mm(a, b).div_(4096);
}

using CodecFactory = std::function<std::shared_ptr<GradCodec>()>;

// The model's parameters after 3 AdamW steps under DDP with `codec`, on a side stream held before
// each backward (`side`), or on the default stream.
std::map<std::string, at::Tensor> train_with_codec(const CodecFactory& codec, bool side) {
  Recipe recipe;
  recipe.size = kOdd;
  auto model = make_net(recipe.size, recipe.seed);
  Distributed dist = nccl_world_of_one();
  const c10::impl::VirtualGuardImpl guard(c10::kCUDA);
  std::optional<c10::StreamGuard> on_side;
  if (side) {
    // The side stream starts after everything queued so far (the model's initialisation).
    c10::Event made(c10::kCUDA);
    made.record(guard.getStream(test_device()));
    const c10::Stream stream = guard.getStreamFromGlobalPool(test_device());
    made.block(stream);
    on_side.emplace(stream);
  }
  DistributedDataParallelOptions options;
  options.codec = codec();
  options.bucket_cap_mb = 1;  // several buckets, so stages overlap backward
  DistributedDataParallel<NetImpl> ddp(model, dist.world, options);
  torch::optim::AdamW opt(ddp.parameters(), torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    const Batch b = batch_of(recipe.size, 0, step);
    at::Tensor loss = torch::mse_loss(ddp(b.x), b.y);
    if (side) delay_current_stream();
    loss.backward();
    opt.step();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().cpu();
  return out;
}

class CodecStreams : public GpuTestWithParam<std::string> {};

TEST_P(CodecStreams, ACodecOnItsThreadWaitsForTheStreamThatFilledTheBucket) {
  if (rehearsal()) GTEST_SKIP() << "stream order needs a GPU";
  const std::string name = GetParam();
  const CodecFactory make = [&]() -> std::shared_ptr<GradCodec> {
    if (name == "powersgd") return make_powersgd_codec({.rank = 2, .start_iter = 0});
    if (name == "topk") return make_topk_codec({.ratio = 0.05});
    return make_sign_codec();
  };
  const auto plain = train_with_codec(make, false);
  const auto held = train_with_codec(make, true);
  EXPECT_EQ(difference(held, plain), "") << name;
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecStreams, ::testing::Values("powersgd", "topk", "sign"),
                         [](const auto& info) { return info.param; });

// A codec's stage reads nothing back to the host once its bucket layouts exist (issue 37: the
// sign codec read every tensor's scale back, PowerSGD copied each fresh Q from pageable memory),
// so backward() returns while the GPU still works: with about 400 ms of kernels queued before it,
// its host time stays far below that. A host read would wait for the whole queue.
TEST_P(CodecStreams, AStageReadsNothingBackToTheHost) {
  if (rehearsal()) GTEST_SKIP() << "host reads of device values need a GPU";
  const std::string name = GetParam();
  Recipe recipe;
  recipe.size = kOdd;
  auto model = make_net(recipe.size, recipe.seed);
  Distributed dist = nccl_world_of_one();
  DistributedDataParallelOptions options;
  if (name == "powersgd") {
    options.codec = make_powersgd_codec({.rank = 2, .start_iter = 0, .warm_start = false});
  } else if (name == "topk") {
    options.codec = make_topk_codec({.ratio = 0.05});
  } else {
    options.codec = make_sign_codec();
  }
  DistributedDataParallel<NetImpl> ddp(model, dist.world, options);
  torch::optim::AdamW opt(ddp.parameters(), torch::optim::AdamWOptions(1e-3));
  double seconds = 0;
  for (int step = 0; step < 4; ++step) {  // the first two make the layouts and the allocator warm
    opt.zero_grad();
    const Batch b = batch_of(recipe.size, 0, step);
    at::Tensor loss = torch::mse_loss(ddp(b.x), b.y);
    if (step >= 2) delay_current_stream(160);
    const auto start = std::chrono::steady_clock::now();
    loss.backward();
    if (step >= 2) seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    opt.step();
  }
  EXPECT_LT(seconds, 0.1) << name << ": backward() waited " << seconds << " s for the GPU";
}

class TopKBits : public GpuTest {};

TEST_F(TopKBits, ThreeRanksDecodeTheSameBitsInAHundredRuns) {
  if (rehearsal()) GTEST_SKIP() << "CUDA's atomics are what this checks";
  constexpr int64_t kNumel = 1 << 18;
  std::vector<at::Tensor> first(3);
  testing::run_ranks(3, [&](Communicator& comm) {
    // Shared large entries (every rank picks them) plus a little of the rank's own.
    const auto gen = at::detail::createCPUGenerator(42);
    const at::Tensor shared = at::randn({kNumel}, gen);
    const auto own = at::detail::createCPUGenerator(100 + comm.rank());
    const at::Tensor grad = (shared + 0.01 * at::randn({kNumel}, own)).to(test_device());
    for (int run = 0; run < 100; ++run) {
      auto codec = make_topk_codec({.ratio = 0.05, .error_feedback = false});
      GradBucket bucket;
      bucket.buffer = grad.clone();
      bucket.param_indices = {0};
      bucket.offsets = {0};
      bucket.shapes = {{kNumel}};
      codec->reduce(comm, bucket)->wait();
      const at::Tensor decoded = bucket.buffer.cpu();
      if (run == 0) {
        first[comm.rank()] = decoded;
      } else if (!decoded.equal(first[comm.rank()])) {
        ADD_FAILURE() << "rank " << comm.rank() << ": run " << run << " decoded other bits";
        return;
      }
    }
  });
  EXPECT_TRUE(first[1].equal(first[0]) && first[2].equal(first[0])) << "the ranks disagree";
}

}  // namespace
}  // namespace tandem::gpu_test
