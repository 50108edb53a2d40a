#include "tests/gpu/gpu_test_util.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace tandem::gpu_test {

namespace {

bool cpu_rehearsal() {
  static const bool on = std::getenv("TANDEM_GPU_TEST_CPU") != nullptr;
  return on;
}

}  // namespace

c10::Device test_device() {
  return cpu_rehearsal() ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
}

void GpuTest::SetUp() {
  if (!cpu_rehearsal() && !torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device (torch::cuda::is_available() is false)";
  }
  // The rank processes run one thread each (tandemrun's OMP_NUM_THREADS=1): so does the CPU
  // reference here, so that no reduction is split differently.
  if (cpu_rehearsal()) at::set_num_threads(1);
}

Distributed nccl_world_of_one() {
  InitOptions options;  // DistEnv's defaults: rank 0 of 1, an in-process store
  options.backend = cpu_rehearsal() ? "gloo" : "nccl";
  return init(options);
}

std::map<std::string, at::Tensor> assemble(const std::vector<std::vector<MasterSlice>>& ranks) {
  std::map<std::string, at::Tensor> full;
  std::map<std::string, at::Tensor> covered;
  for (const auto& slices : ranks) {
    for (const auto& s : slices) {
      auto it = full.find(s.name);
      if (it == full.end()) {
        it = full.emplace(s.name, at::zeros({s.numel}, s.data.options())).first;
        covered[s.name] = at::zeros({s.numel}, at::kBool);
      }
      const int64_t n = s.data.numel();
      if (n == 0) continue;
      it->second.narrow(0, s.begin, n).copy_(s.data.reshape({-1}));
      covered[s.name].narrow(0, s.begin, n).fill_(true);
    }
  }
  for (const auto& [name, mask] : covered) {
    if (!mask.all().item<bool>()) {
      throw std::runtime_error("assemble: parameter '" + name + "' has elements no rank holds");
    }
  }
  return full;
}

namespace {

// "" when equal element for element, else how they differ.
std::string compare(const std::string& what, const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes()) || a.scalar_type() != b.scalar_type()) {
    std::ostringstream s;
    s << what << ": shapes/dtypes differ: " << a.sizes() << " " << a.scalar_type() << " vs "
      << b.sizes() << " " << b.scalar_type();
    return s.str();
  }
  const at::Tensor other = b.to(a.device());
  if (at::equal(a, other)) return "";
  const at::Tensor diff = (a.to(at::kDouble) - other.to(at::kDouble)).abs();
  std::ostringstream s;
  s << what << ": " << diff.ne(0).sum().item<int64_t>() << " of " << a.numel()
    << " elements differ, by up to " << diff.max().item<double>();
  return s.str();
}

}  // namespace

std::string difference(const std::map<std::string, at::Tensor>& a,
                       const std::map<std::string, at::Tensor>& b) {
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end()) return "'" + name + "' is missing from the second";
    const std::string d = compare("'" + name + "'", t, it->second);
    if (!d.empty()) return d;
  }
  if (a.size() != b.size()) return "the second has parameters the first lacks";
  return "";
}

std::string difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) {
    return std::to_string(a.size()) + " tensors vs " + std::to_string(b.size());
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string d = compare("tensor #" + std::to_string(i), a[i], b[i]);
    if (!d.empty()) return d;
  }
  return "";
}

double max_difference(const std::map<std::string, at::Tensor>& a,
                      const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, t] : a) {
    const at::Tensor other = b.at(name).to(t.device(), at::kDouble);
    worst = std::max(worst, (t.to(at::kDouble) - other).abs().max().item<double>());
  }
  return worst;
}

std::vector<at::Tensor> adamw_state(torch::optim::AdamW& opt) {
  std::vector<at::Tensor> out;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      const auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) throw std::runtime_error("adamw_state: a parameter has no state");
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      out.push_back(s.exp_avg().detach().clone());
      out.push_back(s.exp_avg_sq().detach().clone());
      out.push_back(at::tensor({s.step()}, at::kLong));
    }
  }
  return out;
}

}  // namespace tandem::gpu_test
