// How long a checkpoint save of the model and AdamW's state keeps a GPU training loop from
// training, sync against async (bench_gpu's checkpoint mode). The model trains under
// DistributedDataParallel (bench_model.h's ddp mode), whose staging fence lets an async save copy
// the parameters and AdamW's state off the GPU while the next step's forward and backward run.
//   sync_save_ms       save() of a synchronous CheckpointManager: copy, write, fsync, commit
//   async_call_ms      save() of an asynchronous one: what it copies at once
//   async_blocking_ms  async_call_ms + how much longer the step after it took than a step
//                      without a save (it waits for the deferred copy at the end of backward)
// Each figure is the median over `repeats` saves; every save writes to `directory` (keep_last 1),
// the async writer finishing (wait()) before the next one starts.
// Thread-safety: one thread. Errors: CheckpointError from the saves.
#pragma once

#include <tandem/collectives/communicator.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::bench_gpu {

struct CheckpointBlocking {
  double step_ms = 0;           // median step without a save
  double sync_save_ms = 0;
  double async_call_ms = 0;
  double async_blocking_ms = 0;
  uint64_t bytes = 0;           // bytes one save writes
};

CheckpointBlocking measure_checkpoint_blocking(std::shared_ptr<Communicator> world, int64_t batch,
                                               const std::string& directory, int repeats);

// The median of `v` (0 when empty).
double median(std::vector<double> v);

}  // namespace tandem::bench_gpu
