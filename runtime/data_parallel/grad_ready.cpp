#include "runtime/data_parallel/grad_ready.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

namespace tandem::detail {
namespace {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<GradReadyListener> listener, int64_t index)
      : listener_(std::move(listener)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto listener = listener_.lock()) listener->on_grad_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<GradReadyListener> listener_;
  int64_t index_;
};

}  // namespace

GradAccumulators::GradAccumulators(const std::vector<at::Tensor>& params,
                                   std::weak_ptr<GradReadyListener> listener) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto node = torch::autograd::impl::grad_accumulator(params[i]);
    node->add_post_hook(std::make_unique<ReadyHook>(listener, static_cast<int64_t>(i)));
    index_[node.get()] = static_cast<int64_t>(i);
    nodes_.push_back(std::move(node));
  }
}

std::vector<char> GradAccumulators::reachable(const std::vector<at::Tensor>& outputs) const {
  std::vector<char> reached(nodes_.size(), 0);
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    if (auto fn = out.grad_fn()) {
      stack.push_back(fn.get());
    } else if (auto acc = torch::autograd::impl::try_get_grad_accumulator(out)) {
      stack.push_back(acc.get());  // the output is a parameter itself
    }
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto it = index_.find(node); it != index_.end()) reached[it->second] = 1;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return reached;
}

}  // namespace tandem::detail
