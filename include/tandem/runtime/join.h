// Join: uneven inputs under data parallelism (PyTorch's torch.distributed.algorithms.Join,
// pytorch#38174), for DistributedDataParallel and ShardedDataParallel.
//
//   tandem::Join join(ddp, [&] { opt.step(); });      // what the loop does after backward
//   for (auto& batch : my_batches) {                   // as many as this rank has
//     opt.zero_grad();
//     loss_fn(ddp(batch.x), batch.y).backward();
//     opt.step();
//   }
//   join.finish();   // shadows the other ranks' steps until every rank has run out
//
// While a Join lives, each training forward (grad mode on) of the wrapper first all-reduces a
// flag saying that this rank still has data and whether the step synchronises. A rank that ran out
// calls finish(): it keeps answering that all-reduce with "no data" and, while some rank still
// trains, issues the collectives of one forward and backward with nothing of its own (a zero
// gradient: the others' average is divided by the whole world size, PyTorch's default), then runs
// `after_backward` (the optimizer step, and the GradScaler's step/update and clipping if the loop
// has them) on the averaged gradients every rank received. So a joined rank's parameters, its
// optimizer state and its shards stay identical to the others', step for step; no final
// broadcast is needed. finish() returns on every rank once every rank has called it.
// Limits: under a Join every forward of the wrapper is a training forward (evaluate outside the
// Join); collectives of the loop's own (a loss all-reduce for logging) are not shadowed - do them
// after finish(); no_sync() micro-batches are shadowed as forwards without reduction.
// Ownership: refers to the wrapper (it must outlive the Join) and owns `after_backward`.
// Thread-safety: one training thread. Errors: CommError/TimeoutError from the collectives, and
// whatever `after_backward` throws; the destructor calls finish() unless an exception is
// unwinding, and reports (stderr) rather than throws.
#pragma once

#include <tandem/collectives/communicator.h>

#include <cstdint>
#include <functional>

namespace tandem {

namespace detail {

// What Join needs of a data-parallel wrapper's core.
class Joinable {
 public:
  virtual ~Joinable() = default;
  // The communicator of the join flag (the wrapper's world).
  virtual Communicator& join_communicator() = 0;
  // While true, each training forward first calls notify_join().
  virtual void set_join_active(bool active) = 0;
  // The collectives of one step of the wrapper with no data of this rank: a forward, and its
  // backward's reduction when `sync`.
  virtual void shadow_step(bool sync) = 0;
};

// A training forward's contribution to the join flag: {1 rank with data, 1 if it synchronises}.
void notify_join(Communicator& comm, bool sync);

}  // namespace detail

class Join {
 public:
  Join(detail::Joinable& joinable, std::function<void()> after_backward);
  // `wrapper`: a DistributedDataParallel or ShardedDataParallel.
  template <class Wrapper>
  Join(Wrapper& wrapper, std::function<void()> after_backward)
      : Join(static_cast<detail::Joinable&>(wrapper.core()), std::move(after_backward)) {}
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank has no more data: shadows the others' steps until every rank has called finish().
  // Collective. Idempotent.
  void finish();
  // Steps this rank shadowed in finish().
  int64_t shadowed_steps() const { return shadowed_; }

 private:
  detail::Joinable& joinable_;
  std::function<void()> after_backward_;
  int uncaught_ = 0;  // std::uncaught_exceptions() at construction
  bool finished_ = false;
  int64_t shadowed_ = 0;
};

}  // namespace tandem
