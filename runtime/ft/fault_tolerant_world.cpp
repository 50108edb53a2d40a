// FaultTolerantWorld (include/tandem/runtime/fault_tolerance.h): the vote that ends each step and
// the quorum that re-forms the world after an abort, both decided by one compare-and-set in the
// launcher's store.
#include <tandem/runtime/fault_tolerance.h>
#include <tandem/runtime/step_scope.h>

#include <tandem/base/errors.h>
#include <tandem/runtime/run_main.h>

#include "base/launch_contract.h"
#include "runtime/ft/membership.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <sstream>
#include <thread>

namespace tandem {

namespace {

using detail::contains;
using detail::join_ids;
using detail::Membership;
using detail::MemberId;
using detail::parse_id;
using Clock = std::chrono::steady_clock;

constexpr const char* kCommit = "commit";
constexpr const char* kAbort = "abort";

std::string get_text(c10d::Store& store, const std::string& key) {
  const std::vector<uint8_t> v = store.get(key);
  return std::string(v.begin(), v.end());
}

bool has(c10d::Store& store, const std::string& key) { return store.check({key}); }

// Whether the launcher reported `member` ("rank.incarnation") dead: dead/<member>, or
// dead/any/<rank> for every rank of a node that was lost (tandemrun's ft_reporter.h).
// Whether the launcher reported `member` dead, itself or its whole node (launch contract keys).
bool reported_dead(c10d::Store& store, const std::string& ft_keys, const std::string& member) {
  const MemberId id = parse_id(member);
  return has(store, launch::ft_dead_key(ft_keys, id.rank, id.incarnation)) ||
         has(store, launch::ft_dead_any_key(ft_keys, id.rank));
}

// Polls `done` about every millisecond (a step's vote takes a few store round trips; the step
// itself takes far longer) until it is true or `deadline` passed. False on the deadline. Beats
// the launcher's heartbeat meanwhile: a rank waiting for a quorum or a replacement is not hung.
Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

template <class Done>
bool poll_until(Clock::time_point deadline, Done done) {
  for (auto pause = std::chrono::microseconds(50);; pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    heartbeat();
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace

FaultTolerantWorld::FaultTolerantWorld(const Distributed& dist, const InitOptions& comm,
                                       FaultToleranceOptions options)
    : store_(dist.store), comm_(comm), options_(options), world_(dist.world) {
  if (options_.min_replicas < 1) {
    throw ConfigError("tandem: ft.min_replicas = " + std::to_string(options_.min_replicas) +
                      " must be at least 1 (--set ft.min_replicas=1).");
  }
  if (!(options_.quorum_timeout_s > 0)) {
    throw ConfigError("tandem: ft.quorum_timeout_s must be positive (--set ft.quorum_timeout_s=10).");
  }
  if (!(options_.replacement_wait_s >= 0)) {
    throw ConfigError("tandem: ft.replacement_wait_s must be 0 or more (--set ft.replacement_wait_s=0).");
  }
  // A member that dies while a new world connects holds the others up this long, not for the op
  // timeout; the next epoch then leaves it out.
  comm_.connect_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(options_.quorum_timeout_s));
  launch_rank_ = dist.env.rank;
  launch_size_ = dist.env.world_size;
  incarnation_ = dist.env.ft_join;
  if (incarnation_ > 0 && !options_.enabled) {
    throw ConfigError("tandem: this worker replaces a failed one (tandemrun --ft-replace), but "
                      "ft.enabled is false: it cannot join a running group; --set ft.enabled=true.");
  }
  if (!store_ || (!world_ && incarnation_ == 0))
    throw ConfigError("tandem: FaultTolerantWorld needs a connected world.");
  for (int r = 0; r < dist.env.world_size; ++r) {
    members_.push_back(r);
    incarnations_.push_back(0);
  }
  active_ = options_.enabled && !dist.env.ft_keys.empty() && dist.env.world_size > 1;
  if (options_.enabled && dist.env.ft_keys.empty() && launch_rank_ == 0) {
    std::fprintf(stderr,
                 "tandem: ft.enabled is set, but the launcher reports no failures to the workers "
                 "(start with tandemrun --ft); a failure restarts the group as without it.\n");
  }
  prefix_ = comm_.store_prefix + "/ft";
  ft_keys_ = dist.env.ft_keys;
  group_failed_ = launch::ft_group_failed_key(ft_keys_);
  if (incarnation_ > 0) await_admission();
}

FaultTolerantWorld::~FaultTolerantWorld() {
  // A replacement still waiting to be admitted learns that no step is left to join. Rank 0 says
  // so when the training ends (not any rank leaving: a test's "dead" rank returns normally).
  if (!active_ || rank() != 0 || std::uncaught_exceptions() > 0) return;
  try {
    store_->set(prefix_ + "/finished", "1");
  } catch (const std::exception&) {  // the launcher's store is gone: nobody is waiting
  }
}

void FaultTolerantWorld::fail_group(const std::string& why) {
  failed_ = true;
  if (active_) store_->set(group_failed_, why);  // tandemrun restarts the group, replacing nobody
  throw CommError(why);
}

std::string FaultTolerantWorld::members_text() const {
  std::string s;
  for (std::size_t i = 0; i < members_.size(); ++i) s += (s.empty() ? "" : ",") + id(i);
  return s;
}

std::vector<int> FaultTolerantWorld::heal_sources(int group_size) {
  const int n = world_size();
  if (group_size < 0) {
    throw ConfigError("tandem: FaultTolerantWorld::heal_sources: group size " +
                      std::to_string(group_size) + " must be 0 (the launch world) or more.");
  }
  if (group_size == 0) group_size = launch_size_;
  const std::string layout = "sharded state (shard groups of " + std::to_string(group_size) +
                             " ranks, sharding.group_size) ";
  const std::string restart = "; the group fails and the launcher restarts it from its "
                              "checkpoint. Under tandemrun --ft-replace with --set "
                              "ft.replacement_wait_s=<seconds>, a replacement takes a lost rank's "
                              "place and heals from its replica instead.";
  // Every shard keeps its position: the world lost whole groups at most, or was made whole again.
  bool kept = n % group_size == 0;
  for (int i = 0; kept && i < n; ++i) kept = members_[i] % group_size == i % group_size;
  if (!kept) {
    fail_group("tandem: " + layout + "cannot go on with the " + std::to_string(n) + " members " +
               members_text() + " of epoch " + std::to_string(epoch_) +
               ": a lost rank's shard has no member in its place" + restart);
  }
  std::vector<int> sources;
  for (int r : receivers_) {
    int source = -1;
    for (int i = 0; i < n && source < 0; ++i) {
      const bool receives = std::find(receivers_.begin(), receivers_.end(), i) != receivers_.end();
      if (!receives && i % group_size == r % group_size) source = i;
    }
    if (source < 0) {
      fail_group("tandem: " + layout + "has no live replica of shard " +
                 std::to_string(r % group_size) + " to heal rank " + std::to_string(r) +
                 " from (members " + members_text() + " of epoch " + std::to_string(epoch_) +
                 "; without hybrid sharding no other rank holds a shard)" + restart);
    }
    sources.push_back(source);
  }
  return sources;
}

int FaultTolerantWorld::rank() const {
  for (std::size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] == launch_rank_ && incarnations_[i] == incarnation_) return static_cast<int>(i);
  }
  return -1;
}

std::string FaultTolerantWorld::id(std::size_t member) const {
  return MemberId{members_[member], incarnations_[member]}.text();
}

void FaultTolerantWorld::await_admission() {
  c10d::Store& store = *store_;
  const std::string self = MemberId{launch_rank_, incarnation_}.text();
  const int64_t request = store.add(prefix_ + "/join/count", 1);
  store.set(prefix_ + "/join/" + std::to_string(request), self);
  // The members admit it at the start of their next step: at most one step (whose collectives
  // comm.timeout_s bounds) plus a re-formation away.
  const double limit_s = std::chrono::duration<double>(comm_.timeout).count() + options_.quorum_timeout_s;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(limit_s));
  const std::string admitted = prefix_ + "/admitted/" + self;
  poll_until(deadline, [&] {
    return has(store, admitted) || has(store, prefix_ + "/finished") || has(store, group_failed_);
  });
  if (has(store, group_failed_)) throw CommError("tandem: the group failed: " + get_text(store, group_failed_));
  if (!has(store, admitted)) {
    throw CommError("tandem: replacement " + self + " (launch rank " + std::to_string(launch_rank_) +
                    ") was not admitted within " + std::to_string(limit_s) + " s: " +
                    (has(store, prefix_ + "/finished") ? "the group finished training first"
                                                       : "no member began a step meanwhile") +
                    ".");
  }
  const int64_t epoch = std::stoll(get_text(store, admitted));
  const std::string membership = get_text(store, prefix_ + "/e" + std::to_string(epoch) + "/members");
  if (!enter(epoch, membership)) reform("a member failed while admitting this replacement", admitted_step_);
}

bool FaultTolerantWorld::begin_step(int64_t& step, const std::function<void()>& rebuild) {
  if (active_ && !changed_) {
    // Which join requests to admit at this step: the first proposal written is every member's.
    c10d::Store& store = *store_;
    const std::string base = prefix_ + "/e" + std::to_string(epoch_) + "/s" + std::to_string(step);
    const int64_t seen = store.add(prefix_ + "/join/count", 0);
    const int64_t decided = std::stoll(store.compareSet(base + "/admit", "", std::to_string(seen)));
    if (decided > joins_seen_) {
      std::vector<std::string> alive;
      for (std::size_t i = 0; i < members_.size(); ++i) alive.push_back(id(i));
      const int64_t epoch = epoch_ + 1;
      if (!enter(epoch, decide(epoch, alive, decided, step))) {
        reform("a member failed while admitting a replacement", step);
      }
    }
  }
  bool rebuilt = false;
  while (changed_) {
    changed_ = false;
    if (replacement() && admitted_step_ >= 0) step = admitted_step_;
    try {
      rebuild();  // heals heal_receivers(): a member may die meanwhile
      rebuilt = true;
    } catch (const CommError& e) {
      if (!active_ || failed_) throw;  // the group failed (fail_group()): it restarts
      const std::string base = prefix_ + "/e" + std::to_string(epoch_) + "/s" + std::to_string(step);
      store_->compareSet(base + "/decision", "", kAbort);  // nobody may commit this step now
      ++aborted_;
      reform(std::string("rebuilding the world failed: ") + e.what(), step);
    }
  }
  return rebuilt;
}

StepOutcome FaultTolerantWorld::step(int64_t step, const std::function<void()>& work) {
  if (!active_) {
    work();
    return StepOutcome::kCommitted;
  }
  std::string failure;
  detail::StepScope scope;  // what the work touches before the decision (step_scope.h)
  try {
    work();
  } catch (const CommError& e) {  // a peer died or went silent: this step cannot complete
    failure = e.what();
  }
  c10d::Store& store = *store_;
  const std::string base = prefix_ + "/e" + std::to_string(epoch_) + "/s" + std::to_string(step);
  const std::string decision_key = base + "/decision";
  if (failure.empty()) failure = wait_for_device(decision_key);
  std::string decision;
  if (!failure.empty()) {
    decision = store.compareSet(decision_key, "", kAbort);
  } else {
    const auto size = static_cast<int64_t>(members_.size());
    if (store.add(base + "/ok", 1) == size) {
      decision = store.compareSet(decision_key, "", kCommit);
    } else {
      // Until every member is in, someone decided, a member was reported dead, or the bound.
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(options_.quorum_timeout_s));
      bool any_dead = false;
      const bool settled = poll_until(deadline, [&] {
        if (has(store, decision_key)) return true;
        if (store.add(base + "/ok", 0) == size) return true;
        any_dead = member_reported_dead();
        return any_dead;
      });
      const bool all_in = settled && !any_dead && !has(store, decision_key) &&
                          store.add(base + "/ok", 0) == size;
      decision = store.compareSet(decision_key, "", all_in ? kCommit : kAbort);
      if (!settled) failure = "a peer's vote did not arrive within ft.quorum_timeout_s";
      if (any_dead) failure = "the launcher reported a member of this epoch dead";
    }
  }
  if (decision == kCommit) {
    committed_in_epoch_ = true;
    // Keys of the step before are read by nobody now: every member voted on this one.
    if (rank() == 0 && step > 0) {
      const std::string before = prefix_ + "/e" + std::to_string(epoch_) + "/s" + std::to_string(step - 1);
      for (const char* key : {"/ok", "/decision", "/admit"}) store.deleteKey(before + key);
    }
    return StepOutcome::kCommitted;
  }
  ++aborted_;
  // The old world is aborted first, so codec stages still in its collectives fail and the
  // wrappers can drop what the step did.
  reform(failure.empty() ? "a peer voted to abort step " + std::to_string(step) : failure, step);
  scope.drop();
  return StepOutcome::kAborted;
}

bool FaultTolerantWorld::member_reported_dead() {
  c10d::Store& store = *store_;
  // One read while no death was reported since the members were last looked at; a member found
  // dead keeps the count unseen, so it is found again until the world is re-formed without it.
  const int64_t count = store.add(launch::ft_dead_count_key(ft_keys_), 0);
  if (count == dead_seen_) return false;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    if (reported_dead(store, ft_keys_, id(i))) return true;
  }
  dead_seen_ = count;
  return false;
}

std::string FaultTolerantWorld::wait_for_device(const std::string& decision_key) {
  // On a GPU an op has not happened when its wait returned (NCCL's only orders the caller's
  // stream), so a vote now could commit sums that a peer's death still breaks. The world's fence
  // completes once every op of the step has (on Gloo at once: its waits blocked). It is polled
  // beside the launcher's reports and the step's decision (a peer whose work failed votes to
  // abort without joining a fence that is a barrier), so either is noticed as soon as in the vote.
  try {
    WorkPtr done = world_->fence();
    bool any_dead = false, decided = false;
    const bool finished = poll_until(Clock::now() + world_->timeout(), [&] {
      if (done->is_completed()) return true;
      any_dead = member_reported_dead();
      decided = has(*store_, decision_key);
      return any_dead || decided;
    });
    if (any_dead) return "the launcher reported a member of this epoch dead";
    if (decided) return "a peer decided the step before this rank's collectives completed";
    // Rethrows the fence's (or an earlier op's) error; past the bound, a TimeoutError.
    done->wait(finished ? world_->timeout() : std::chrono::milliseconds(1));
    return "";
  } catch (const CommError& e) {
    return e.what();
  }
}

std::string FaultTolerantWorld::decide(int64_t epoch, const std::vector<std::string>& alive,
                                       int64_t requests, int64_t step) {
  c10d::Store& store = *store_;
  Membership m;
  for (const std::string& a : alive) {
    // A member the launcher reported dead meanwhile (a second failure before anyone noticed it)
    // would hold up the new world's rendezvous until comm.timeout_s.
    if (!reported_dead(store, ft_keys_, a)) m.members.push_back(parse_id(a));
  }
  m.requests = requests;
  m.step = step;
  // Members that still need the state: nobody healed them while no step committed since.
  if (!committed_in_epoch_) {
    for (const std::string& r : receiver_ids_) {
      if (contains(m.members, parse_id(r))) m.receivers.push_back(parse_id(r));
    }
  }
  for (int64_t i = joins_seen_ + 1; i <= requests; ++i) {
    const MemberId joiner = parse_id(get_text(store, prefix_ + "/join/" + std::to_string(i)));
    if (reported_dead(store, ft_keys_, joiner.text())) continue;  // died before it was admitted
    // One process per launch rank: a request for a rank whose member is as new is stale; a newer
    // one replaces the member (the launcher replaces only a dead process).
    if (std::any_of(m.members.begin(), m.members.end(), [&](const MemberId& x) {
          return x.rank == joiner.rank && x.incarnation >= joiner.incarnation;
        }))
      continue;
    auto drop = [&](std::vector<MemberId>& v) {
      v.erase(std::remove_if(v.begin(), v.end(), [&](const MemberId& x) { return x.rank == joiner.rank; }),
              v.end());
    };
    drop(m.members);
    drop(m.receivers);
    m.members.push_back(joiner);
    m.receivers.push_back(joiner);
  }
  std::sort(m.members.begin(), m.members.end(),
            [](const MemberId& a, const MemberId& b) { return a.rank < b.rank; });
  return store.compareSet(prefix_ + "/e" + std::to_string(epoch) + "/members", "", m.text());
}

bool FaultTolerantWorld::enter(int64_t epoch, const std::string& text) {
  c10d::Store& store = *store_;
  const Membership m = Membership::parse(text);
  members_.clear();
  incarnations_.clear();
  for (const MemberId& x : m.members) {
    members_.push_back(x.rank);
    incarnations_.push_back(x.incarnation);
  }
  joins_seen_ = m.requests;
  receiver_ids_.clear();
  for (const MemberId& r : m.receivers) receiver_ids_.push_back(r.text());
  admitted_step_ = m.step;
  epoch_ = epoch;
  committed_in_epoch_ = false;
  changed_ = true;
  const std::string self = MemberId{launch_rank_, incarnation_}.text();
  if (rank() < 0) {
    throw CommError("tandem: rank " + self + " reached the quorum of epoch " + std::to_string(epoch) +
                    " after the others had closed it without it (members " + join_ids(m.members) +
                    "); it leaves the job. Raise ft.quorum_timeout_s (--set ft.quorum_timeout_s=...) "
                    "if ranks are this slow to notice a failure.");
  }
  if (static_cast<int64_t>(members_.size()) < options_.min_replicas) {
    fail_group("tandem: only " + std::to_string(members_.size()) + " rank(s) remain (" +
               join_ids(m.members) + "), fewer than ft.min_replicas = " +
               std::to_string(options_.min_replicas) +
               "; the group fails and the launcher restarts it from its checkpoint.");
  }
  receivers_.clear();
  source_ = -1;
  for (std::size_t i = 0; i < m.members.size(); ++i) {
    if (contains(m.receivers, m.members[i])) {
      receivers_.push_back(static_cast<int>(i));
    } else if (source_ < 0) {
      source_ = static_cast<int>(i);
    }
  }
  if (source_ < 0) {
    fail_group("tandem: no member of epoch " + std::to_string(epoch) + " (" + join_ids(m.members) +
               ") holds the training state: every one that did died before healing the "
               "replacements; the group fails and the launcher restarts it from its checkpoint.");
  }
  // The replacements learn their epoch (the membership key holds the rest).
  for (const MemberId& r : m.receivers) store.set(prefix_ + "/admitted/" + r.text(), std::to_string(epoch));
  try {
    world_ = connect_world(store_, rank(), world_size(), comm_, prefix_ + "/e" + std::to_string(epoch));
    return true;
  } catch (const CommError&) {
    return false;  // a member died during the rendezvous: the next epoch leaves it out
  }
}

void FaultTolerantWorld::reform(const std::string& why, int64_t step) {
  c10d::Store& store = *store_;
  // Peers still blocked in the old world's collectives fail now instead of at their timeout.
  if (world_) world_->abort("tandem: step aborted (" + why + "); re-forming without the lost ranks");
  for (;;) {
    const int64_t epoch = epoch_ + 1;
    const std::string base = prefix_ + "/e" + std::to_string(epoch);
    const std::string self = MemberId{launch_rank_, incarnation_}.text();
    store.set(base + "/joined/" + self, "1");
    std::vector<std::string> last;
    for (std::size_t i = 0; i < members_.size(); ++i) last.push_back(id(i));
    auto joined = [&](const std::string& m) { return has(store, base + "/joined/" + m); };
    auto dead = [&](const std::string& m) { return reported_dead(store, ft_keys_, m); };
    poll_until(Clock::now() + seconds(options_.quorum_timeout_s), [&] {
      return std::all_of(last.begin(), last.end(), [&](const std::string& m) { return joined(m) || dead(m); });
    });
    std::vector<std::string> alive;
    std::vector<int> lost;  // launch ranks
    for (std::size_t i = 0; i < last.size(); ++i) {
      if (joined(last[i])) {
        alive.push_back(last[i]);
      } else {
        lost.push_back(members_[i]);
      }
    }
    // Join requests so far, and, for up to ft.replacement_wait_s, replacements of the lost ranks
    // (tandemrun --ft-replace).
    int64_t requests = joins_seen_;
    std::vector<int> missing = options_.replacement_wait_s > 0 ? lost : std::vector<int>();
    auto scan = [&] {
      for (const int64_t n = store.add(prefix_ + "/join/count", 0); requests < n; ++requests) {
        const MemberId j = parse_id(get_text(store, prefix_ + "/join/" + std::to_string(requests + 1)));
        missing.erase(std::remove(missing.begin(), missing.end(), j.rank), missing.end());
      }
      return missing.empty();
    };
    if (!scan()) poll_until(Clock::now() + seconds(options_.replacement_wait_s), scan);
    if (enter(epoch, decide(epoch, alive, requests, step))) return;
  }
}

}  // namespace tandem
