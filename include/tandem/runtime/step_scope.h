// Internal (detail): what a fault-tolerant step touched before its commit decision, so that an
// aborted step leaves nothing half-applied (docs/fault_tolerance.md).
//
// FaultTolerantWorld::step() opens a StepScope on its thread around the step's work. A
// data-parallel wrapper whose forward runs inside it joins the scope: DistributedDataParallel's
// codec then keeps the state it had before each step. When the step aborts, the scope has every
// participant drop what the step did (a codec's error feedback, warm-start factors, step count;
// ShardedDataParallel's in-flight collectives and gradients), after the step's communicator was
// aborted.
// Ownership: the scope holds its participants by pointer; they outlive the step's work (a program
// rebuilds them only after step() returned). Thread-safety: one thread; scopes nest per thread.
// Errors: drop() lets through what a participant's drop_step() throws.
#pragma once

#include <vector>

namespace tandem::detail {

class StepParticipant {
 public:
  // Forgets what the step of the scope it joined did.
  virtual void drop_step() = 0;

 protected:
  ~StepParticipant() = default;
};

class StepScope {
 public:
  StepScope();  // current on this thread until destroyed
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

  // The innermost scope open on this thread, or null.
  static StepScope* current();
  // Adds `participant` once; true when it was not in yet.
  bool join(StepParticipant* participant);
  // Calls drop_step() on every participant, the last to join first.
  void drop();

 private:
  StepScope* outer_;
  std::vector<StepParticipant*> participants_;
};

}  // namespace tandem::detail
