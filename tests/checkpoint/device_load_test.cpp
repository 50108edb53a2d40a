// Where resumed state lives (issue 26 item 2), on the CPU: optimizer state follows its parameter's
// device and dtype on load, as torch.optim's load_state_dict does, so a model moved to a device
// steps there after a resume; a tensor with no data (the meta device) is refused by name. The
// same with CUDA tensors: gpu_test.cpp.
#include "tests/checkpoint/checkpoint_test_util.h"

#include <ATen/ops/empty.h>

namespace tandem::ckpt_test {
namespace {

// Two parameters with AdamW state after one step (the state a checkpoint then holds).
struct Stepped {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::AdamW> opt;
};

Stepped stepped_adamw() {
  at::manual_seed(3);
  Stepped s;
  s.params = {at::randn({4, 3}).requires_grad_(), at::randn({5}).requires_grad_()};
  s.opt = std::make_unique<torch::optim::AdamW>(s.params, torch::optim::AdamWOptions(1e-2));
  for (auto& p : s.params) p.mutable_grad() = at::randn(p.sizes());
  s.opt->step();
  return s;
}

const torch::optim::AdamWParamState& state_of(torch::optim::AdamW& opt, const at::Tensor& p) {
  return static_cast<const torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

void save_adamw(const std::string& dir, torch::optim::AdamW& opt) {
  CheckpointManager m(options(dir, /*async=*/false));
  m.add_optimizer("optim", opt);
  m.save(1);
}

TEST(CheckpointDevices, OptimizerStateLoadsOntoTheParametersDevice) {
  TempDir dir("state_device");
  Stepped saved = stepped_adamw();
  save_adamw(dir.path, *saved.opt);
  // The same shapes on another device (meta: one every CPU build has; CUDA in gpu_test.cpp).
  std::vector<at::Tensor> params = {at::empty({4, 3}, at::device(at::kMeta)).requires_grad_(),
                                    at::empty({5}, at::device(at::kMeta)).requires_grad_()};
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2));
  CheckpointManager m(options(dir.path, false));
  m.add_optimizer("optim", opt);
  ASSERT_EQ(m.resume(), 1);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& s = state_of(opt, params[i]);
    EXPECT_EQ(s.exp_avg().device(), params[i].device()) << "exp_avg of parameter " << i;
    EXPECT_EQ(s.exp_avg_sq().device(), params[i].device()) << "exp_avg_sq of parameter " << i;
    EXPECT_EQ(s.exp_avg().sizes(), params[i].sizes());
    EXPECT_EQ(s.step(), 1);
  }
}

TEST(CheckpointDevices, OptimizerStateTakesTheParametersDtypeAndStaysOnTheCpuWithIt) {
  TempDir dir("state_dtype");
  Stepped saved = stepped_adamw();
  save_adamw(dir.path, *saved.opt);
  std::vector<at::Tensor> params = {at::zeros({4, 3}, at::kDouble).requires_grad_(),
                                    at::zeros({5}, at::kDouble).requires_grad_()};
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2));
  CheckpointManager m(options(dir.path, false));
  m.add_optimizer("optim", opt);
  ASSERT_EQ(m.resume(), 1);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& got = state_of(opt, params[i]);
    const auto& want = state_of(*saved.opt, saved.params[i]);
    EXPECT_EQ(got.exp_avg().scalar_type(), at::kDouble) << "parameter " << i;
    EXPECT_TRUE(got.exp_avg().device().is_cpu());
    // float32 -> float64 is exact: the values are the saved ones.
    EXPECT_TRUE(bitwise_equal(got.exp_avg(), want.exp_avg().to(at::kDouble))) << "parameter " << i;
    EXPECT_TRUE(bitwise_equal(got.exp_avg_sq(), want.exp_avg_sq().to(at::kDouble))) << "parameter " << i;
  }
}

TEST(CheckpointDevices, ATensorOnTheMetaDeviceIsRefusedByName) {
  TempDir dir("meta_save");
  for (const bool async : {false, true}) {
    CheckpointManager m(options(dir.path, async));
    m.add_tensors(
        "lazy", [] { return std::map<std::string, at::Tensor>{{"w", at::empty({2}, at::device(at::kMeta))}}; },
        [](const std::map<std::string, at::Tensor>&) {});
    try {
      m.save(1);
      FAIL() << "a meta tensor was saved";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("\"lazy/w\" is on the meta device"), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(m.committed_steps().empty());
  }
}

}  // namespace
}  // namespace tandem::ckpt_test
