// Internal to runtime/activation: walking the autograd graph a checkpointed function built, to
// find where it leaves the function (the edges the checkpoint node must route gradients to).
#pragma once

#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace tandem::detail {

// An edge by identity: the node it enters and that node's input number.
struct EdgeKey {
  const torch::autograd::Node* fn;
  uint32_t nr;
  bool operator==(const EdgeKey& o) const { return fn == o.fn && nr == o.nr; }
};
struct EdgeKeyHash {
  size_t operator()(const EdgeKey& k) const {
    return std::hash<const void*>()(k.fn) ^ (static_cast<size_t>(k.nr) * 0x9e3779b97f4a7c15ULL);
  }
};
inline EdgeKey key_of(const torch::autograd::Edge& e) { return {e.function.get(), e.input_nr}; }

// The edges by which the graph that built `outputs` leaves the nodes created on this thread while
// the sequence counter went from `first` to `end` (i.e. inside fn): edges into leaves
// (AccumulateGrad, whose sequence number is UINT64_MAX) and into nodes made before fn ran. An
// output whose own gradient edge is such an edge (fn returned an input or a captured tensor) counts
// too. Deduplicated, in discovery order.
std::vector<torch::autograd::Edge> external_edges(const std::vector<at::Tensor>& outputs,
                                                uint64_t first, uint64_t end);

}  // namespace tandem::detail
