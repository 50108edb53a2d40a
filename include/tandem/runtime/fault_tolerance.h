// Step-level fault tolerance for data-parallel training (docs/fault_tolerance.md): a worker that
// dies costs the step it died in, not a restart. The survivors keep their state, agree to drop
// the step, re-form their communicator without the dead rank and redo the step at the smaller
// world size.
//
//   tandem::FaultTolerantWorld ft(ctx.distributed(), ctx.config().comm, ctx.config().ft);
//   auto ddp = std::make_unique<tandem::DistributedDataParallel<Net>>(model, ft.communicator());
//   for (int64_t step = 0; step < steps;) {
//     opt.zero_grad();
//     auto work = [&] { torch::mse_loss((*ddp)(x(step, ft.rank(), ft.world_size())), y).backward(); };
//     if (ft.step(step, work) == tandem::StepOutcome::kAborted) {  // a peer died: redo the step
//       ddp = std::make_unique<tandem::DistributedDataParallel<Net>>(model, ft.communicator());
//       continue;
//     }
//     opt.step();  // only after the commit: an aborted step changes nothing
//     ++step;
//   }
//
// Protocol: every step ends with a vote in the rendezvous store (the launcher's, which outlives
// any worker): each rank that finished the step's collectives counts itself in, a rank whose
// collective failed votes to abort, and the first decision written (compare-and-set on one key)
// is every rank's. After an abort the survivors join the next epoch; they wait for each member of
// the last one to join or be reported dead by the launcher (or for ft.quorum_timeout_s), the
// first membership written is the new world, ranked by launch rank, and its communicator
// rendezvouses under a prefix of its own. One key decides each question, so ranks never disagree
// (no split brain).
//
// Active only with ft.enabled, under `tandemrun --ft` (which serves the store and reports deaths:
// DistEnv::ft_keys) and more than one rank; otherwise step() runs the work and commits, and a
// failure propagates as before (the launcher restarts the group from its checkpoint).
//
// Ownership: shares the store; owns the communicator of the current epoch (the Context's world is
// epoch 0's and is aborted at the first failure). Thread-safety: one training thread.
// Errors: step() propagates every exception of `work` other than CommError (TimeoutError and
// PeerLostError included); CommError when this rank was left out of the new membership (it joined
// too late) or fewer than ft.min_replicas ranks remain: the program then fails, and the launcher
// restarts the group from the checkpoint.
#pragma once

#include <tandem/collectives/communicator.h>
#include <tandem/runtime/init.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

// ft.*: off by default.
struct FaultToleranceOptions {
  bool enabled = false;          // ft.enabled
  int64_t min_replicas = 1;      // ft.min_replicas: fewer survivors fail the group (restart)
  // ft.quorum_timeout_s: how long survivors wait for a rank that neither joins the next epoch nor
  // is reported dead (a hung rank without heartbeats), and for a peer's vote on a step.
  double quorum_timeout_s = 10.0;
};

enum class StepOutcome {
  kCommitted,  // every rank of the epoch finished the step: apply it (optimizer, scaler, ...)
  kAborted,    // the step is dropped everywhere; the world was re-formed: redo the step
};

class FaultTolerantWorld {
 public:
  // `dist` and `comm` as the Context has them; `dist.world` is epoch 0's communicator.
  FaultTolerantWorld(const Distributed& dist, const InitOptions& comm, FaultToleranceOptions options);
  ~FaultTolerantWorld();
  FaultTolerantWorld(const FaultTolerantWorld&) = delete;
  FaultTolerantWorld& operator=(const FaultTolerantWorld&) = delete;

  // Whether failures inside a step are tolerated (see the top of this file).
  bool active() const { return active_; }
  // The current epoch's communicator, rank and size (they change after an abort).
  const std::shared_ptr<Communicator>& communicator() const { return world_; }
  int rank() const;
  int world_size() const { return static_cast<int>(members_.size()); }
  int64_t epoch() const { return epoch_; }
  // The launch ranks (RANK) of the current epoch's members, ascending; rank() indexes it.
  const std::vector<int>& members() const { return members_; }
  // Steps aborted so far on this rank.
  int64_t aborted_steps() const { return aborted_; }

  // Runs `work` (the step's forward and backward, every collective of the step) and returns the
  // outcome the live ranks agreed on. Every member calls it with the same `step`.
  StepOutcome step(int64_t step, const std::function<void()>& work);

 private:
  void reform(const std::string& why);

  c10::intrusive_ptr<c10d::Store> store_;
  InitOptions comm_;
  FaultToleranceOptions options_;
  bool active_ = false;
  int launch_rank_ = 0;
  std::string prefix_;  // this attempt's keys
  std::string dead_prefix_;  // the launcher's reports
  std::shared_ptr<Communicator> world_;
  std::vector<int> members_;
  int64_t epoch_ = 0;
  int64_t aborted_ = 0;
};

}  // namespace tandem
