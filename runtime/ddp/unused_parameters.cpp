// Unused parameters (ddp.find_unused_parameters): after forward the autograd graph is
// walked from the outputs; parameters it does not reach contribute their current gradient once
// backward starts, and a used-map all-reduced over the ranks keeps `.grad` untouched for
// parameters no rank used (runtime/ddp/reducer_state.h).
#include "runtime/ddp/reducer_state.h"

#include <ATen/ops/empty.h>

namespace tandem::detail {

void ReducerState::find_unused(const std::vector<at::Tensor>& outputs) {
  const std::vector<char> reached = accumulators.reachable(outputs);
  used_map = at::empty({static_cast<int64_t>(params.size())}, at::kInt);
  int32_t* used = used_map.data_ptr<int32_t>();
  for (size_t p = 0; p < params.size(); ++p) used[p] = reached[p] || locally_used[p];
  // First collective of the iteration on every rank, before any bucket.
  used_work = comm->allreduce(used_map, ReduceOp::kMax);
  // Unreached parameters contribute their current gradient (accumulated under no_sync, or zeros)
  // once backward starts. Not before: a forward without backward must launch nothing that other
  // ranks (with other unused sets) would not launch, and must not touch `.grad`.
  for (size_t p = 0; p < params.size(); ++p) {
    if (!reached[p]) deferred_unused.push_back(static_cast<int64_t>(p));
  }
}

void ReducerState::mark_deferred_ready() {
  // Backward really runs: now the parameters this forward did not reach join their buckets.
  for (int64_t unused : deferred_unused) {
    copy_into_bucket(unused);
    mark_ready(unused);
  }
  deferred_unused.clear();
}

bool ReducerState::used_anywhere(int64_t p) const {
  return !used_map.defined() || used_map.data_ptr<int32_t>()[p] != 0;
}

}  // namespace tandem::detail
