// FaultTolerantWorld (include/tandem/runtime/fault_tolerance.h): the vote that ends each step and
// the quorum that re-forms the world after an abort, both decided by one compare-and-set in the
// launcher's store.
#include <tandem/runtime/fault_tolerance.h>

#include <tandem/base/errors.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kCommit = "commit";
constexpr const char* kAbort = "abort";

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) ranks.push_back(std::stoi(item));
  return ranks;
}

bool has(c10d::Store& store, const std::string& key) { return store.check({key}); }

// Polls `done` about every millisecond (a step's vote takes a few store round trips; the step
// itself takes far longer) until it is true or `deadline` passed. False on the deadline.
template <class Done>
bool poll_until(Clock::time_point deadline, Done done) {
  for (auto pause = std::chrono::microseconds(50);; pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
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
  if (!world_ || !store_) throw ConfigError("tandem: FaultTolerantWorld needs a connected world.");
  launch_rank_ = dist.env.rank;
  for (int r = 0; r < dist.env.world_size; ++r) members_.push_back(r);
  active_ = options_.enabled && !dist.env.ft_keys.empty() && dist.env.world_size > 1;
  if (options_.enabled && dist.env.ft_keys.empty() && launch_rank_ == 0) {
    std::fprintf(stderr,
                 "tandem: ft.enabled is set, but the launcher reports no failures to the workers "
                 "(start with tandemrun --ft); a failure restarts the group as without it.\n");
  }
  prefix_ = comm_.store_prefix + "/ft";
  dead_prefix_ = dist.env.ft_keys + "/dead/";
}

FaultTolerantWorld::~FaultTolerantWorld() = default;

int FaultTolerantWorld::rank() const {
  const auto it = std::find(members_.begin(), members_.end(), launch_rank_);
  return static_cast<int>(it - members_.begin());
}

StepOutcome FaultTolerantWorld::step(int64_t step, const std::function<void()>& work) {
  if (!active_) {
    work();
    return StepOutcome::kCommitted;
  }
  std::string failure;
  try {
    work();
  } catch (const CommError& e) {  // a peer died or went silent: this step cannot complete
    failure = e.what();
  }
  c10d::Store& store = *store_;
  const std::string base = prefix_ + "/e" + std::to_string(epoch_) + "/s" + std::to_string(step);
  const std::string decision_key = base + "/decision";
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
      const int64_t dead_before = store.add(dead_prefix_ + "count", 0);
      bool any_dead = false;
      const bool settled = poll_until(deadline, [&] {
        if (has(store, decision_key)) return true;
        if (store.add(base + "/ok", 0) == size) return true;
        if (store.add(dead_prefix_ + "count", 0) != dead_before) {
          for (int m : members_) any_dead = any_dead || has(store, dead_prefix_ + std::to_string(m));
        }
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
    // Keys of the step before are read by nobody now: every member voted on this one.
    if (rank() == 0 && step > 0) {
      const std::string before = prefix_ + "/e" + std::to_string(epoch_) + "/s" + std::to_string(step - 1);
      store.deleteKey(before + "/ok");
      store.deleteKey(before + "/decision");
    }
    return StepOutcome::kCommitted;
  }
  ++aborted_;
  reform(failure.empty() ? "a peer voted to abort step " + std::to_string(step) : failure);
  return StepOutcome::kAborted;
}

void FaultTolerantWorld::reform(const std::string& why) {
  c10d::Store& store = *store_;
  // Peers still blocked in the old world's collectives fail now instead of at their timeout.
  world_->abort("tandem: step aborted (" + why + "); re-forming without the lost ranks");
  for (;;) {
    const int64_t epoch = epoch_ + 1;
    const std::string base = prefix_ + "/e" + std::to_string(epoch);
    const auto start = Clock::now();
    store.set(base + "/joined/" + std::to_string(launch_rank_), "1");
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(options_.quorum_timeout_s));
    const std::vector<int> last = members_;
    poll_until(deadline, [&] {
      return std::all_of(last.begin(), last.end(), [&](int m) {
        return has(store, base + "/joined/" + std::to_string(m)) ||
               has(store, dead_prefix_ + std::to_string(m));
      });
    });
    std::vector<int> joined;
    for (int m : last) {
      if (has(store, base + "/joined/" + std::to_string(m))) joined.push_back(m);
    }
    members_ = parse_ranks(store.compareSet(base + "/members", "", join_ranks(joined)));
    epoch_ = epoch;
    if (std::find(members_.begin(), members_.end(), launch_rank_) == members_.end()) {
      throw CommError("tandem: rank " + std::to_string(launch_rank_) + " reached the quorum of epoch " +
                      std::to_string(epoch) + " after the others had closed it without it (members " +
                      join_ranks(members_) + "); it leaves the job. Raise ft.quorum_timeout_s "
                      "(--set ft.quorum_timeout_s=...) if ranks are this slow to notice a failure.");
    }
    if (static_cast<int64_t>(members_.size()) < options_.min_replicas) {
      throw CommError("tandem: after " + why + ", only " + std::to_string(members_.size()) +
                      " rank(s) remain (" + join_ranks(members_) + "), fewer than ft.min_replicas = " +
                      std::to_string(options_.min_replicas) +
                      "; the group fails and the launcher restarts it from its checkpoint.");
    }
    try {
      world_ = connect_world(store_, rank(), world_size(), comm_, base);
      return;
    } catch (const CommError&) {
      // Another member died during the rendezvous: the next epoch leaves it out as well.
    }
  }
}

}  // namespace tandem
