// The multi-node rendezvous of tandemrun's agents, over a c10d::TCPStore (docs/launcher.md
// "Multi-node").
//
// What: one agent hosts the store (node rank 0, or the one that binds --rdzv-endpoint), all join
// numbered rounds (round number = TORCHELASTIC_RESTART_COUNT), learn the round's members, the
// workers' MASTER_ADDR/PORT and their node rank, report failures and successes, and see each
// other's keep-alives. Keys live under "tandemrun/<rdzv-id>/"; the job token is verified by keyed
// digests (job_token.h) and never sent. Only plain numbers and [A-Za-z0-9._:-] words are parsed
// from the store, and failure texts are only printed; nothing received is executed.
//
// Ownership: owns the store (two connections: one for the calling thread, one for the keep-alive
// thread it starts). Thread-safety: one thread calls the methods. Errors: RendezvousError (a
// tandem::Error) for a foreign store, an unreachable endpoint or a lost store host, with the
// endpoint and what to do.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/intrusive_ptr.h>

#include <tandem/base/errors.h>

#include "tools/tandemrun/launcher_options.h"

namespace c10d {
class TCPStore;
}

namespace tandem::launcher {

class RendezvousError : public Error {
 public:
  using Error::Error;
};

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
  std::string master_addr;     // the workers' store: on node rank 0
  int master_port = 0;
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
};

class Rendezvous {
 public:
  // Hosts or connects to the store and verifies the job token; `token` must not be empty.
  Rendezvous(const LauncherOptions& options, std::string token);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  bool is_host() const { return host_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& agent_id() const { return agent_id_; }

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
  void linger();

  // Checks that the keep-alive thread still reaches the store; throws RendezvousError if not.
  // On the host, also logs agents of another job that were turned away since the last call.
  void check_store();

 private:
  std::string key(const std::string& suffix) const { return prefix_ + suffix; }
  std::optional<std::string> try_get(const std::string& key);
  long long counter(const std::string& key, long long delta);
  void verify_host();
  // Closes `round` if no other agent does (an atomic counter picks one): publishes its members.
  bool try_close(int round);
  std::optional<std::vector<RoundMember>> read_members(int round);
  std::string describe_store_error(const std::exception& e) const;
  void keep_alive_loop();
  void put(const std::string& key, const std::string& value);
  std::string record_digest(const std::string& fields) const;
  bool stale(const std::string& agent_id);

  LauncherOptions options_;
  std::string token_;
  std::string endpoint_;
  std::string store_host_;
  int store_port_ = 0;
  bool host_ = false;
  std::string prefix_;
  std::string agent_id_;
  std::string local_addr_;
  int free_port_ = 0;
  std::string host_nonce_;
  long long foreign_seen_ = 0;  // host: agents with another token seen so far
  int last_node_rank_ = -1;     // this node's rank in the last round it ran (-1: none yet)
  c10::intrusive_ptr<c10d::TCPStore> store_;
  c10::intrusive_ptr<c10d::TCPStore> keep_alive_store_;
  std::thread keep_alive_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> keep_alive_failed_{false};
  std::string keep_alive_error_;  // written before keep_alive_failed_ is set
  // agent id -> (last keep-alive count, when it last changed)
  std::map<std::string, std::pair<long long, std::chrono::steady_clock::time_point>> seen_;
};

// "HOST:PORT" -> (host, port); `default_port` when there is no port. Throws ConfigError.
std::pair<std::string, int> parse_endpoint(const std::string& text, int default_port);

}  // namespace tandem::launcher
