// ShardedDataParallel's consolidated export: the whole model as one safetensors file, streamed
// one unit at a time (FSDP's full state dict runs out of memory here: pytorch#104143).
#include "runtime/sharded/sharded_state.h"

#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/checkpoint/safetensors.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <map>
#include <optional>

namespace tandem {

using State = ShardedDataParallelCore::State;

void State::for_each_full_tensor(
    const std::function<void(const std::string&, const at::Tensor&)>& fn) {
  torch::autograd::AutoGradMode no_grad(false);
  std::map<const c10::TensorImpl*, int64_t> trainable;
  for (size_t p = 0; p < params.size(); ++p) trainable[params[p].unsafeGetTensorImpl()] = static_cast<int64_t>(p);
  // In the model's order. A unit's parameters are consecutive there (it is one submodule), so
  // one gathered unit at a time suffices: `current` is dropped when the next one is needed.
  int current = -1;
  at::Tensor full;
  for (auto& item : module->named_parameters()) {
    auto it = trainable.find(item.value().unsafeGetTensorImpl());
    if (it == trainable.end()) {
      fn(item.key(), item.value());  // frozen: replicated
      continue;
    }
    const int64_t p = it->second;
    const int u = unit_of[p];
    detail::FlatUnit& unit = units[u];
    if (u != current) {
      current = u;
      full = unit.flat;
      if (mixed.enabled()) {
        // The fp32 masters, not their low-precision copy in the model.
        full = at::empty({unit.padded_numel(shard_size())}, unit.master_options);
        shard_comm->allgather(full, unit.shard.detach())->wait();
      } else if (!shards.parameters) {
        gather(u, false);  // stepped shards first
        wait_gathered(u);
      } else if (!unit.materialized) {
        full = at::empty({unit.padded_numel(shard_size())}, unit.options);
        shard_comm->allgather(full, unit.shard.detach())->wait();
      }
    }
    const auto k = std::find(unit.params.begin(), unit.params.end(), p) - unit.params.begin();
    fn(item.key(), full.narrow(0, unit.offsets[k], params[p].numel()).view(params[p].sizes()));
  }
  full = at::Tensor();
  for (size_t i = 0; i < buffers.size(); ++i) fn(buffer_names[i], buffers[i]);
}

void ShardedDataParallelCore::export_model(const std::string& path, std::shared_ptr<FileSystem> fs) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  const bool writer = s.world->rank() == 0;
  std::string error;
  // Pass 1 hashes (the header comes first in the file), pass 2 writes; one unit at a time.
  std::vector<TensorRecord> records;
  s.for_each_full_tensor([&](const std::string& name, const at::Tensor& t) {
    if (!writer || !error.empty()) return;
    try {
      const at::Tensor c = t.to(at::kCPU).contiguous();
      TensorRecord r;
      r.name = name;
      r.dtype = to_checkpoint_dtype(c.scalar_type());
      r.shape = c.sizes().vec();
      r.xxh3 = xxh3_64(c.data_ptr(), c.nbytes());
      records.push_back(std::move(r));
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::optional<SafetensorsWriter> out;
  if (writer && error.empty()) {
    try {
      out.emplace(fs, path, records, std::map<std::string, CheckpointValue>{{"export", std::string("tandem ShardedDataParallel")}});
    } catch (const Error& e) {
      error = e.what();
    }
  }
  s.for_each_full_tensor([&](const std::string&, const at::Tensor& t) {
    if (!out || !error.empty()) return;
    try {
      out->write(t);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  if (out && error.empty()) {
    try {
      out->commit();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // Every rank learns the outcome and throws alike.
  at::Tensor failed = at::empty({1}, at::kInt);
  failed.data_ptr<int32_t>()[0] = error.empty() ? 0 : 1;
  s.world->broadcast(failed, 0)->wait();
  if (failed.data_ptr<int32_t>()[0] != 0) {
    throw CheckpointError(writer ? error
                                 : "tandem: ShardedDataParallel::export_model('" + path +
                                       "') failed on rank 0 (its error names the cause).");
  }
}

}  // namespace tandem
