// tandem::checkpoint: a hand-written autograd Node that keeps a function's inputs, not its
// activations, and recomputes the function in backward (include/tandem/runtime/activation_checkpoint.h).
//
// Forward: capture RNG and autocast state; run fn on detached aliases of the inputs, either with
// grad enabled (to find what fn captures: the "external" edges of the graph it builds, which is
// then dropped) or under no-grad when the caller declared fn's parameters. The node's next edges
// are the inputs' gradient edges followed by the external edges; its inputs are fn's outputs.
//
// Backward (CheckpointNode::apply): recompute fn on fresh aliases with the captured RNG/autocast
// state, then run the engine on the recomputed graph capturing the gradients at the aliases and at
// the external edges (accumulate_grad = false), and return them through the node's own edges. So
// leaves (parameters) are accumulated by the *outer* backward, exactly once.
//
// The RNG/autocast state capture is in recompute_state.cpp, the graph walk in graph_walk.cpp.
#include <tandem/runtime/activation_checkpoint.h>

#include "runtime/activation/graph_walk.h"
#include "runtime/activation/recompute_state.h"

#include <ATen/SequenceNumber.h>
#include <ATen/ops/equal.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace tandem {
namespace {

using detail::AutocastState;
using detail::EdgeKey;
using detail::EdgeKeyHash;
using detail::RecomputeStateGuard;
using detail::RngState;
using detail::capture_autocast;
using detail::capture_rng;
using detail::external_edges;
using detail::key_of;
using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

std::string where(const std::string& name) {
  return "tandem: activation checkpoint '" + name + "': ";
}

// ---------------------------------------------------------------------------------------------
// Output metadata

struct OutputMeta {
  bool defined = false;
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::kCPU;
};

OutputMeta meta_of(const at::Tensor& t) {
  OutputMeta m;
  if (!t.defined()) return m;
  m.defined = true;
  m.sizes = t.sizes().vec();
  m.dtype = t.scalar_type();
  m.device = t.device();
  return m;
}

std::string describe(const OutputMeta& m) {
  if (!m.defined) return "undefined";
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < m.sizes.size(); ++i) os << (i ? ", " : "") << m.sizes[i];
  os << "] " << c10::toString(m.dtype) << " on " << m.device;
  return os.str();
}

std::string nondeterminism_advice() {
  return " fn is not deterministic given its inputs: look for random numbers from generators other "
         "than the default CPU/CUDA ones (or drawn by other threads while preserve_rng_state is "
         "on), control flow that depends on data or on state outside fn, or state changed between "
         "forward and backward (train()/eval(), parameters or buffers updated before backward). "
         "Make fn deterministic, or set ActivationCheckpointOptions::check = RecomputeCheck::kNone "
         "to skip "
         "this check.";
}

// ---------------------------------------------------------------------------------------------
// The node

class CheckpointNode : public Node {
 public:
  std::string name() const override { return "tandem::CheckpointBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    fn_ = nullptr;
    inputs_.clear();
    values_.clear();
    rng_ = RngState{};
  }

  variable_list apply(variable_list&& grads) override;

  // Set by activation_checkpoint() before any output refers to the node.
  ActivationCheckpointFunction fn_;
  std::string name_;
  RecomputeCheck check_ = RecomputeCheck::kMetadata;
  bool declared_ = false;
  std::vector<at::Tensor> inputs_;       // detached aliases: share storage and version counter
  std::vector<int64_t> versions_;        // inputs' versions after the forward
  std::vector<char> requires_grad_;      // per input
  std::vector<size_t> edge_input_;       // input index of each input edge (the first edges)
  std::unordered_map<EdgeKey, size_t, EdgeKeyHash> external_index_;  // edge -> next-edge index
  std::vector<OutputMeta> meta_;         // every output of the first forward
  std::vector<at::Tensor> values_;       // kValues: copies of the outputs
  std::vector<size_t> output_of_input_;  // node input j carries the gradient of output [j]
  RngState rng_;
  AutocastState autocast_;

 private:
  void check_outputs(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& values,
                     RecomputeCheck check) const;

  bool released_ = false;
};

void CheckpointNode::check_outputs(const std::vector<at::Tensor>& outs,
                                   const std::vector<at::Tensor>& values,
                                   RecomputeCheck check) const {
  if (check == RecomputeCheck::kNone) return;
  if (outs.size() != meta_.size()) {
    throw ActivationCheckpointError(
        where(name_) + "the recompute in backward returned " + std::to_string(outs.size()) +
        " outputs where the first forward returned " + std::to_string(meta_.size()) + "." +
        nondeterminism_advice());
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const OutputMeta now = meta_of(outs[i]);
    const OutputMeta& then = meta_[i];
    if (now.defined != then.defined || now.sizes != then.sizes || now.dtype != then.dtype ||
        now.device != then.device) {
      throw ActivationCheckpointError(where(name_) + "output " + std::to_string(i) +
                                      " of the recompute in backward is " + describe(now) +
                                      " where the first forward's was " + describe(then) + "." +
                                      nondeterminism_advice());
    }
    if (check == RecomputeCheck::kValues && then.defined && !at::equal(outs[i], values[i])) {
      throw ActivationCheckpointError(
          where(name_) + "output " + std::to_string(i) + " (" + describe(now) +
          ") of the recompute in backward has different values from the first forward's "
          "(RecomputeCheck::kValues compares bitwise)." +
          nondeterminism_advice());
    }
  }
}

variable_list CheckpointNode::apply(variable_list&& grads) {
  ActivationCheckpointFunction fn;
  std::vector<at::Tensor> saved, values;
  RngState rng;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (released_) {
      throw ActivationCheckpointError(
          where(name_) + "backward reached this checkpoint a second time, after the first "
          "backward through it released its saved inputs (retain_graph = false). Pass "
          "retain_graph = true to the first backward if you need to backward twice (each "
          "backward then recomputes the checkpointed function), or run forward again.");
    }
    fn = fn_;
    saved = inputs_;
    values = values_;
    rng = rng_;
  }
  if (c10::GradMode::is_enabled()) {
    throw ActivationCheckpointError(
        where(name_) +
        "double backward (backward or torch::autograd::grad with create_graph = "
        "true) through an activation checkpoint is not supported: the gradients it returns "
        "would carry no graph. Compute higher-order gradients without checkpointing this part "
        "(ActivationCheckpointPolicy::none() or call fn directly).");
  }
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].defined() && saved[i]._version() != versions_[i]) {
      throw ActivationCheckpointError(
          where(name_) + "input " + std::to_string(i) + " was modified in place after the "
          "checkpointed forward (its version went from " + std::to_string(versions_[i]) +
          " to " + std::to_string(saved[i]._version()) + "), so the recompute would see "
          "different data. Do not modify a checkpoint's inputs in place before backward; "
          "clone() them first if you must.");
    }
  }

  // Fresh leaves for the recompute, requiring grad as the originals did.
  std::vector<at::Tensor> aliases(saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    if (!saved[i].defined()) continue;
    aliases[i] = saved[i].detach();
    if (requires_grad_[i]) aliases[i].requires_grad_(true);
  }

  std::vector<at::Tensor> outs;
  uint64_t first = 0, end = 0;
  {
    RecomputeStateGuard state(rng, autocast_);
    at::AutoGradMode enable(true);
    first = at::sequence_number::peek();
    outs = fn(aliases);
    end = at::sequence_number::peek();
  }
  check_outputs(outs, values, check_);

  // Where the recomputed graph leaves fn must be where the first forward said it would.
  std::unordered_map<const Node*, size_t> alias_edge;  // alias accumulator -> next-edge index
  edge_list captures(num_outputs());
  for (size_t k = 0; k < edge_input_.size(); ++k) {
    captures[k] = torch::autograd::impl::gradient_edge(aliases[edge_input_[k]]);
    alias_edge[captures[k].function.get()] = k;
  }
  for (size_t k = edge_input_.size(); k < captures.size(); ++k) captures[k] = next_edge(k);
  for (const Edge& e : external_edges(outs, first, end)) {
    if (alias_edge.count(e.function.get()) || external_index_.count(key_of(e))) continue;
    const std::string what = e.function->name();
    if (declared_) {
      throw ActivationCheckpointError(
          where(name_) +
          "the recompute differentiates through a tensor that is neither an "
          "input nor one of the tensors in ActivationCheckpointOptions::parameters (it reaches a " +
          what +
          " node outside fn), so its gradient would be lost. Add that tensor (a parameter of a "
          "module fn uses, or a tensor fn captures) to options.parameters, pass it as an input, "
          "or leave options.parameters unset so the forward discovers it.");
    }
    throw ActivationCheckpointError(
        where(name_) + "the recompute differentiates through a tensor (a " + what +
        " node outside fn) that the first forward did not use, so its gradient would be lost." +
        nondeterminism_advice());
  }

  edge_list roots;
  variable_list root_grads;
  for (size_t j = 0; j < grads.size() && j < output_of_input_.size(); ++j) {
    if (!grads[j].defined()) continue;
    const at::Tensor& out = outs[output_of_input_[j]];
    if (!out.defined() || !out.requires_grad()) continue;
    roots.push_back(torch::autograd::impl::gradient_edge(out));
    root_grads.push_back(grads[j]);
  }
  if (roots.empty()) return variable_list(num_outputs());
  return torch::autograd::Engine::get_default_engine().execute(
      roots, root_grads, /*keep_graph=*/false, /*create_graph=*/false, /*accumulate_grad=*/false,
      captures);
}

}  // namespace

std::vector<at::Tensor> activation_checkpoint(ActivationCheckpointFunction fn,
                                              const std::vector<at::Tensor>& inputs,
                                              ActivationCheckpointOptions options) {
  if (!fn) throw ConfigError(where(options.name) + "fn is empty; pass a callable.");
  if (!c10::GradMode::is_enabled()) return fn(inputs);

  bool any_input_requires_grad = false;
  for (const auto& t : inputs) any_input_requires_grad |= t.defined() && t.requires_grad();
  const bool declared = options.parameters.has_value();
  std::vector<Edge> externals;
  if (declared) {
    std::unordered_set<EdgeKey, EdgeKeyHash> seen;
    for (const auto& p : *options.parameters) {
      if (!p.defined() || !p.requires_grad()) continue;
      Edge e = torch::autograd::impl::gradient_edge(p);
      if (seen.insert(key_of(e)).second) externals.push_back(std::move(e));
    }
    if (!any_input_requires_grad && externals.empty()) return fn(inputs);
  }

  RngState rng;
  if (options.preserve_rng_state) rng = capture_rng(inputs);
  const AutocastState autocast = capture_autocast();

  std::vector<at::Tensor> aliases(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    aliases[i] = inputs[i].detach();
    if (inputs[i].requires_grad()) aliases[i].requires_grad_(true);
  }

  std::vector<at::Tensor> outs;
  std::vector<char> attach;
  if (declared) {
    {
      at::NoGradGuard no_grad;
      outs = fn(aliases);
    }
    for (const auto& o : outs) {
      attach.push_back(o.defined() && torch::autograd::isDifferentiableType(o.scalar_type()));
    }
  } else {
    const uint64_t first = at::sequence_number::peek();
    outs = fn(aliases);
    const uint64_t end = at::sequence_number::peek();
    std::unordered_set<const Node*> alias_fns;
    for (const auto& a : aliases) {
      if (!a.defined() || !a.requires_grad()) continue;
      if (auto acc = torch::autograd::impl::try_get_grad_accumulator(a)) alias_fns.insert(acc.get());
    }
    for (Edge& e : external_edges(outs, first, end)) {
      if (!alias_fns.count(e.function.get())) externals.push_back(std::move(e));
    }
    for (const auto& o : outs) attach.push_back(o.defined() && o.requires_grad());
    // Nothing fn returns depends on anything requiring grad: there is nothing to recompute.
    if (std::none_of(attach.begin(), attach.end(), [](char a) { return a != 0; })) return outs;
  }

  auto node = std::make_shared<CheckpointNode>();
  node->name_ = options.name;
  node->check_ = options.check;
  node->declared_ = declared;
  node->rng_ = std::move(rng);
  node->autocast_ = autocast;
  edge_list edges;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool rg = inputs[i].defined() && inputs[i].requires_grad();
    node->requires_grad_.push_back(rg);
    node->versions_.push_back(inputs[i].defined() ? aliases[i]._version() : 0);
    if (!rg) continue;
    node->edge_input_.push_back(i);
    edges.push_back(torch::autograd::impl::gradient_edge(inputs[i]));
  }
  for (auto& e : externals) {
    node->external_index_.emplace(key_of(e), edges.size());
    edges.push_back(std::move(e));
  }
  node->set_next_edges(std::move(edges));
  for (const auto& o : outs) node->meta_.push_back(meta_of(o));
  if (options.check == RecomputeCheck::kValues) {
    for (const auto& o : outs) node->values_.push_back(o.defined() ? o.detach().clone() : o);
  }

  std::vector<at::Tensor> results(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!attach[i]) {
      results[i] = outs[i].defined() ? outs[i].detach() : outs[i];
      continue;
    }
    results[i] = outs[i].detach();
    torch::autograd::set_history(results[i], node);
    node->output_of_input_.push_back(i);
  }
  // Keep only detached aliases of the inputs (no reference to the caller's autograd graph beyond
  // the node's edges); they share the inputs' version counters for the in-place check.
  for (auto& a : aliases) {
    if (a.defined()) a = a.detach();
  }
  node->inputs_ = std::move(aliases);
  node->fn_ = std::move(fn);
  return results;
}

}  // namespace tandem
