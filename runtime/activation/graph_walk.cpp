// Finding where a checkpointed function's autograd graph leaves it
// (runtime/activation/graph_walk.h).
#include "runtime/activation/graph_walk.h"

#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

namespace tandem::detail {

using torch::autograd::Edge;
using torch::autograd::Node;

std::vector<Edge> external_edges(const std::vector<at::Tensor>& outputs, uint64_t first,
                                 uint64_t end) {
  auto internal = [&](const Node* n) {
    return n->sequence_nr() >= first && n->sequence_nr() < end;
  };
  std::vector<Edge> found;
  std::unordered_set<EdgeKey, EdgeKeyHash> seen_edges;
  std::unordered_set<const Node*> seen_nodes;
  std::vector<Node*> stack;
  auto visit = [&](const Edge& e) {
    if (!e.is_valid()) return;
    if (internal(e.function.get())) {
      if (seen_nodes.insert(e.function.get()).second) stack.push_back(e.function.get());
    } else if (seen_edges.insert(key_of(e)).second) {
      found.push_back(e);
    }
  };
  for (const auto& out : outputs) {
    if (out.defined() && out.requires_grad()) visit(torch::autograd::impl::gradient_edge(out));
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges()) visit(e);
  }
  return found;
}


}  // namespace tandem::detail
