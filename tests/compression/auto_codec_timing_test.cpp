// The auto codec times what a transfer takes, not its enqueue (issue 37): over a communicator
// whose wait() returns before the op ran, as NCCL's does (tests/support/stream_communicator.h),
// on a wire where each KiB takes 10 us, the bf16 probe takes half the fp32 one, and the codec must
// see that. Timing the enqueue, both took nothing and the choice was noise.
#include <tandem/collectives/compression.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tests/support/stream_communicator.h"
#include "tests/support/test_support.h"

namespace tandem {
namespace {

TEST(AutoCodecTiming, MeasuresTheTransferOnACommunicatorWhoseWaitDoesNotBlock) {
  std::vector<std::string> names(2);
  testing::run_ranks(2, [&](Communicator& comm) {
    testing::StreamOptions o;
    o.host_waits = false;
    o.per_kib = std::chrono::microseconds(10);  // 4 MiB of fp32: 41 ms; as bf16: 20 ms
    auto wire = testing::make_stream_communicator(
        std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), o);
    auto codec = make_auto_codec({.wire = at::kBFloat16, .min_speedup = 1.5});
    GradBucket bucket;
    bucket.buffer = torch::ones({256});
    bucket.param_indices = {0};
    bucket.offsets = {0};
    bucket.shapes = {{256}};
    codec->reduce(*wire, bucket)->wait(wire->timeout());
    names[comm.rank()] = codec->name();
  });
  EXPECT_EQ(names[0], "auto(bf16)");
  EXPECT_EQ(names[1], names[0]);
}

}  // namespace
}  // namespace tandem
