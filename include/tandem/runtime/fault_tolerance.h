// Step-level fault tolerance for data-parallel training (docs/fault_tolerance.md): a worker that
// dies costs the step it died in, not a restart. The survivors keep their state, agree to drop
// the step and re-form their communicator without the dead rank. They go on at the smaller world
// size, or, under `tandemrun --ft-replace`, take in a replacement that heals from a live peer and
// go on at full size, bit for bit as if nothing had happened.
//
//   tandem::FaultTolerantWorld ft(ctx.distributed(), ctx.config().comm, ctx.config().ft);
//   int64_t step = ft.replacement() ? 0 : ckpt_resume();  // a replacement heals instead
//   while (step < steps) {
//     if (ft.begin_step(step)) {  // the world changed: build what agrees over it again
//       ckpt = make_manager(ft.communicator());  // registers model, optimizer, RNG, ...
//       if (!ft.heal_receivers().empty()) ckpt->heal(ft.heal_source(), ft.heal_receivers());
//       ddp = make_ddp(ft.communicator());  // after healing: its constructor broadcasts rank 0's
//     }
//     opt.zero_grad();
//     auto work = [&] { loss(ddp, batch(step, ft.rank(), ft.world_size())).backward(); };
//     if (ft.step(step, work) == tandem::StepOutcome::kAborted) continue;  // a peer died: redo
//     opt.step();  // only after the commit: an aborted step changes nothing
//     ++step;
//   }
//
// Protocol: every step ends with a vote in the rendezvous store (the launcher's, which outlives
// any worker): each rank that finished the step's collectives - completed on the device, not
// only issued: the world's fence() is waited for on the host first - counts itself in, a rank whose
// collective failed votes to abort, and the first decision written (compare-and-set on one key)
// is every rank's. After an abort the survivors join the next epoch; they wait for each member of
// the last one to join or be reported dead by the launcher (or for ft.quorum_timeout_s), and for
// up to ft.replacement_wait_s for a dead rank's replacement. A replacement asks to join (a
// counter and a key per request); the members admit the requests at the start of a step, by one
// compare-and-set per step. The first membership written is the new world, ranked by launch rank
// (a replacement takes its predecessor's place), and its communicator rendezvouses under a prefix
// of its own. One key decides each question, so ranks never disagree (no split brain).
//
// Sharded state (ShardedDataParallel): survivors reconnect() their wrapper onto the new world and
// keep their shards; a replacement heals its slices from heal_sources(), the rank at its position
// in another replica group (hybrid sharding). Without such a replica the group restarts from its
// checkpoint (docs/fault_tolerance.md, "Sharded state").
//
// Active only with ft.enabled, under `tandemrun --ft` (which serves the store and reports deaths:
// DistEnv::ft_keys) and more than one rank; otherwise begin_step() is false and step() runs the
// work and commits, and a failure propagates as before (the launcher restarts the group from its
// checkpoint).
//
// Ownership: shares the store; owns the communicator of the current epoch (the Context's world is
// epoch 0's and is aborted at the first failure; a replacement's Context has none).
// Thread-safety: one training thread.
// Errors: step() propagates every exception of `work` other than CommError (TimeoutError and
// PeerLostError included); CommError when this rank was left out of the new membership (it joined
// too late) or fewer than ft.min_replicas ranks remain: the program then fails, and the launcher
// restarts the group from the checkpoint (tandemrun --ft-replace then replaces nobody). A
// replacement's constructor throws CommError when it is not admitted within comm.timeout_s +
// ft.quorum_timeout_s, the group finished first, or the group failed.
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
  // ft.replacement_wait_s: after a rank died, how long the survivors wait for its replacement
  // (tandemrun --ft-replace) before going on without it; 0: at once. A replacement that comes
  // later is admitted at the start of the next step.
  double replacement_wait_s = 0.0;
};

enum class StepOutcome {
  kCommitted,  // every rank of the epoch finished the step: apply it (optimizer, scaler, ...)
  kAborted,    // the step is dropped everywhere; the world was re-formed: redo the step
};

class FaultTolerantWorld {
 public:
  // `dist` and `comm` as the Context has them; `dist.world` is epoch 0's communicator. In a
  // replacement (DistEnv::ft_join) it asks to join and blocks until the group admits it.
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
  // This process replaces a failed worker (tandemrun --ft-replace): it must not resume from a
  // checkpoint; its first begin_step() says which step the group is at, and it heals.
  bool replacement() const { return incarnation_ > 0; }

  // Call at the start of every step, every member with the same `step`. Admits replacements that
  // asked to join (all members agree on which, at which step). When the world changed since the
  // last call (a rank was lost, a replacement admitted; in a replacement, at its first call), calls
  // `rebuild`, which builds what agrees over the communicator again and heals heal_receivers()
  // from heal_source(), and returns true. A CommError in `rebuild` (a member died while healing)
  // re-forms the world once more and calls it again. In a replacement the first call sets `step`
  // to the step the group is at.
  bool begin_step(int64_t& step, const std::function<void()>& rebuild);
  // During `rebuild`: the current ranks that need the training state (they joined, and no step
  // has committed since; empty when nobody joined), and the rank that sends it (a member that
  // holds the state).
  const std::vector<int>& heal_receivers() const { return receivers_; }
  int heal_source() const { return source_; }
  // During `rebuild`, for state sliced over shard groups of `group_size` consecutive ranks
  // (sharding.group_size of ShardedDataParallel; 0: the launch world, as there; 1: replicated
  // state): the rank that sends each of heal_receivers() its state, a member at the same position
  // in another group, for CheckpointManager::heal(sources, receivers). Call it in every rebuild:
  // when the sliced state cannot go on - a member's position changed (a rank was lost and nobody
  // took its place), the group size does not divide the world, or no member holds a receiver's
  // slices - it fails the group (the launcher restarts it from its checkpoint) and throws
  // CommError saying why.
  std::vector<int> heal_sources(int group_size);

  // Runs `work` (the step's forward and backward, every collective of the step) and returns the
  // outcome the live ranks agreed on. Every member calls it with the same `step`.
  StepOutcome step(int64_t step, const std::function<void()>& work);

 private:
  void reform(const std::string& why, int64_t step);
  // Makes the membership written under epoch `epoch` the current one and connects its world;
  // false when a member failed during the rendezvous.
  bool enter(int64_t epoch, const std::string& membership);
  // Decides the membership of epoch `epoch` (first write wins) from `alive` (launch ranks that
  // stay) and the join requests up to `requests`.
  std::string decide(int64_t epoch, const std::vector<std::string>& alive, int64_t requests,
                     int64_t step);
  std::string id(std::size_t member) const;
  // The group cannot go on (too few ranks, nobody holds the state): tells tandemrun to restart
  // it from the checkpoint (TANDEM_FT/group_failed) and throws CommError(why).
  [[noreturn]] void fail_group(const std::string& why);
  std::string members_text() const;
  void await_admission();
  // Whether the launcher reported a member of this epoch dead (the members are looked at again only
  // when its count of deaths changed).
  bool member_reported_dead();
  // "" once every op the step issued has completed on its device; else why it cannot (a member
  // was reported dead, `decision_key` was written, an op failed or outlived comm.timeout_s).
  std::string wait_for_device(const std::string& decision_key);

  c10::intrusive_ptr<c10d::Store> store_;
  InitOptions comm_;
  FaultToleranceOptions options_;
  bool active_ = false;
  bool failed_ = false;  // fail_group() ran: the group restarts; nothing to re-form
  int launch_rank_ = 0;
  int launch_size_ = 0;  // WORLD_SIZE
  std::string prefix_;  // this attempt's keys
  std::string ft_keys_;  // where the launcher reports (TANDEM_FT, base/launch_contract.h)
  std::string group_failed_;  // to the launcher: restart the group
  std::shared_ptr<Communicator> world_;
  std::vector<int> members_;
  std::vector<int> incarnations_;  // of each member (the same launch rank returns replaced)
  int incarnation_ = 0;            // this process's (DistEnv::ft_join)
  int64_t joins_seen_ = 0;         // join requests the members have decided on
  int64_t epoch_ = 0;
  int64_t aborted_ = 0;
  int64_t dead_seen_ = -1;         // the launcher's death count when no member was found dead
  int64_t admitted_step_ = -1;     // a replacement: the step the group admitted it at
  bool changed_ = false;           // the world changed since begin_step() last said so
  bool committed_in_epoch_ = false;
  std::vector<std::string> receiver_ids_;  // "rank.incarnation" of the members needing the state
  std::vector<int> receivers_;             // their ranks in the current epoch
  int source_ = 0;
};

}  // namespace tandem
