// The rounds of tandemrun's multi-node agents (docs/launcher.md "Multi-node").
//
// What: all agents join numbered rounds (round number = TORCHELASTIC_RESTART_COUNT), learn the
// round's members, the workers' MASTER_ADDR/PORT and their node rank, report failures and
// successes, and see each other's keep-alives; the store underneath, its job token and the
// keep-alives are rendezvous_store.h's.
//
// Ownership: owns its RendezvousStore. Thread-safety: one thread calls the methods. Errors:
// RendezvousError (a tandem::Error) for a foreign store, an unreachable endpoint, a lost store
// host or a malformed record, with the endpoint and what to do.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tools/tandemrun/launch/launcher_options.h"
#include "tools/tandemrun/elastic/rendezvous_store.h"

namespace tandem::launcher {

// One node of a closed round.
struct RoundMember {
  int node_rank = 0;   // in this round
  std::string agent_id;
  std::string addr;    // where its workers are reachable
  int nproc = 0;
  int free_port = 0;   // a port it found free on addr (used when it is node rank 0)
};

struct Round {
  int number = 0;              // also TORCHELASTIC_RESTART_COUNT
  int node_rank = 0;           // this node's
  std::vector<RoundMember> members;  // ordered by node rank
  // The workers' store: served by global rank 0 (on node rank 0); with --ft by the agent that
  // hosts the rendezvous, so that the side of a partition that keeps both is the one that goes on.
  std::string master_addr;
  int master_port = 0;
  bool serves_workers_store = false;  // --ft: this agent serves it
};

// A failure as reported to all agents (the first report of a round wins).
struct RoundFailure {
  int round = 0;
  int node_rank = -1;   // the node it happened on (or the lost node)
  std::string host;
  int rank = -1;        // the worker's global rank; -1 for a lost node
  long pid = -1;
  bool node_lost = false;
  std::string what;     // "exited with code 3", "was lost: ..."
  std::string error;    // the worker's error-file message, may be empty
  std::string final_reason;  // why a restart cannot fix it (root_cause.h); "" if it may
};

class Rendezvous {
 public:
  // Hosts or connects to the store and verifies the job token; `token` must not be empty.
  Rendezvous(const LauncherOptions& options, std::string token)
      : options_(options), store_(options, std::move(token)) {}

  bool is_host() const { return store_.is_host(); }
  const std::string& endpoint() const { return store_.endpoint(); }
  const std::string& agent_id() const { return store_.agent_id(); }

  enum class JoinOutcome { kJoined, kJobSucceeded, kJobFailed, kInterrupted, kTimedOut };
  // Joins the open round (>= `min_round`) and waits until a round that includes this node
  // closes. A node that arrives after the open round closed waits for the next one (opened by
  // a restart). `interrupted()` is polled (a stop signal). kTimedOut after --rdzv-join-timeout-s
  // without a round; `status` then says how many nodes had joined.
  JoinOutcome join(int min_round, const std::function<bool()>& interrupted, Round* round,
                   std::string* status);

  // The first failure reported for `round`, if any.
  std::optional<RoundFailure> failure(int round);
  // Reports a failure; returns the one that counts (the first reported, maybe another node's).
  RoundFailure report_failure(const RoundFailure& failure);
  // Members of `round` (other than this node) whose keep-alive is older than the node timeout.
  std::vector<RoundMember> lost_members(const Round& round);
  // Opens round `number` for joining (after a failure of round number - 1).
  void open_round(int number);

  // This node's workers all exited 0 in `round`; returns how many nodes have said so.
  int report_success(int round);
  int successes(int round);

  // The job's end, once decided: set by the agent that decides it, seen by all.
  void set_job_state(bool succeeded);
  std::optional<bool> job_state();

  // Polls until every agent that ever connected has left or gone silent (bounded by the node
  // timeout + 2 s): the host calls it before exiting so that no agent loses the store early.
  void linger() { store_.linger(); }

  // Checks that the keep-alive thread still reaches the store; throws RendezvousError if not.
  // On the host, also logs agents of another job that were turned away since the last call.
  void check_store() { store_.check(); }

 private:
  // Closes `round` if no other agent does (an atomic counter picks one): publishes its members.
  bool try_close(int round);
  std::optional<std::vector<RoundMember>> read_members(int round);

  LauncherOptions options_;
  RendezvousStore store_;
  int last_node_rank_ = -1;  // this node's rank in the last round it ran (-1: none yet)
};

}  // namespace tandem::launcher
