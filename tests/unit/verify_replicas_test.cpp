// verify_replicas (issue 19): identical replicas pass; a parameter, a buffer or a structure that
// differs on one rank makes every rank throw, naming the tensor, the kind of difference and the
// rank.
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/verify_replicas.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

struct Net : torch::nn::Module {
  explicit Net(int64_t width = 6) {
    fc = register_module("fc", torch::nn::Linear(4, width));
    bn = register_module("bn", torch::nn::BatchNorm1d(width));
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

// Every rank's error message ("" when verify_replicas passed); `edit` changes rank `r`'s model.
std::vector<std::string> verify(int world, const std::function<void(Net&, int)>& edit,
                                const std::function<int64_t(int)>& width = [](int) { return 6; }) {
  std::vector<std::shared_ptr<Net>> nets;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(1);
    nets.push_back(std::make_shared<Net>(width(r)));
  }
  std::vector<std::string> messages(world);
  testing::run_ranks(world, [&](Communicator& comm) {
    Net& net = *nets[comm.rank()];
    edit(net, comm.rank());
    try {
      verify_replicas(net, comm);
    } catch (const Error& e) {
      messages[comm.rank()] = e.what();
    }
  });
  return messages;
}

TEST(VerifyReplicas, IdenticalReplicasPass) {
  for (const auto& m : verify(3, [](Net&, int) {})) EXPECT_EQ(m, "");
}

TEST(VerifyReplicas, ADifferentParameterIsNamedOnEveryRank) {
  const auto messages = verify(3, [](Net& net, int rank) {
    if (rank == 2) {
      torch::NoGradGuard g;
      net.fc->bias[1] += 1e-6;
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("rank(s) 2 hold other parameters or buffers than rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("parameter 'fc.bias' holds different values"), std::string::npos) << m;
  }
}

TEST(VerifyReplicas, ABufferAndAShapeAreNamedToo) {
  auto messages = verify(2, [](Net& net, int rank) {
    if (rank == 1) net.bn->running_mean.add_(1);
  });
  EXPECT_NE(messages[0].find("buffer 'bn.running_mean' holds different values"), std::string::npos) << messages[0];
  messages = verify(2, [](Net&, int) {}, [](int rank) { return rank == 0 ? 6 : 7; });
  EXPECT_NE(messages[1].find("parameter 'fc.weight' has another shape"), std::string::npos) << messages[1];
}

}  // namespace
}  // namespace tandem
