// PipelineParallel over a communicator without message tags, as NCCL is (issue 37): every op on
// one in-order stream per rank, a send holding it until the peer's receive ran, tags refused
// (tests/support/stream_communicator.h). Every schedule runs there - shapes, then data - and
// ends with the gradients of the tagged run over Gloo, bit for bit. Ranks as threads.
#include <gtest/gtest.h>
#include <tandem/runtime/pipeline_parallel.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/stream_communicator.h"
#include "tests/support/test_support.h"

namespace tandem {
namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 12), torch::nn::Sigmoid(),
                               torch::nn::Linear(12, 4), torch::nn::Tanh());
}

struct Config {
  std::string schedule;
  int world, m, v;
};

// Every rank's gradients after two steps (the first sends shapes, the second does not), by
// "rank/name".
std::map<std::string, at::Tensor> train(const Config& c, bool untagged) {
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < c.world; ++r) models.push_back(make_model());
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({16, 8}), y = torch::randn({16, 4});
  std::map<std::string, at::Tensor> grads;
  std::mutex mutex;
  testing::run_ranks(c.world, [&](Communicator& comm) {
    std::shared_ptr<Communicator> wire(&comm, [](Communicator*) {});
    if (untagged) {
      testing::StreamOptions o;
      o.tags = false;
      wire = testing::make_stream_communicator(wire, o);
    }
    PipelineOptions o;
    o.schedule = c.schedule;
    o.num_microbatches = c.m;
    o.virtual_stages = c.v;
    PipelineParallel pipe(models[comm.rank()], wire, o);
    auto loss = [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); };
    pipe.train_step(x, y, loss);
    pipe.train_step(x * 0.5, y, loss);  // same shapes: no shape messages
    std::lock_guard<std::mutex> lock(mutex);
    for (int s : pipe.local_stages()) {
      for (const auto& p : pipe.stage_module(s)->named_parameters()) {
        grads[std::to_string(comm.rank()) + "/" + p.key()] = p.value().grad().clone();
      }
    }
  });
  return grads;
}

class UntaggedPipeline : public ::testing::TestWithParam<Config> {};

TEST_P(UntaggedPipeline, EndsBitwiseWhereTheTaggedRunEnds) {
  const auto tagged = train(GetParam(), false);
  const auto untagged = train(GetParam(), true);
  ASSERT_EQ(untagged.size(), tagged.size());
  for (const auto& [name, g] : tagged) {
    EXPECT_TRUE(untagged.at(name).equal(g)) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, UntaggedPipeline,
                         ::testing::Values(Config{"gpipe", 2, 4, 1}, Config{"1f1b", 2, 4, 1},
                                           Config{"zbh1", 2, 4, 1}, Config{"interleaved", 2, 4, 2},
                                           Config{"1f1b", 4, 8, 1}, Config{"interleaved", 4, 4, 2}),
                         [](const auto& info) {
                           return info.param.schedule + "_p" + std::to_string(info.param.world) +
                                  "_m" + std::to_string(info.param.m) + "_v" +
                                  std::to_string(info.param.v);
                         });

}  // namespace
}  // namespace tandem
