// Pipeline schedules as data: actions, builders, lowering, validation and a text format.
//
// A Schedule says, for every rank of a pipeline group, the ordered list of actions it runs in one
// training step. Compute actions are F (forward), B (full backward), I (backward to the input only)
// and W (backward to the weights only); each names a stage and a microbatch. Communication
// actions move a stage's output forward (SEND_F / RECV_F: the activation of `stage`, from the
// rank of `stage` to the rank of `stage + 1`) or an input gradient backward (SEND_B / RECV_B: the
// input gradient produced by B or I of `stage`, from the rank of `stage` to the rank of
// `stage - 1`). Comm actions always name the *producing* stage; the peer follows from
// `stage_to_rank`.
//
// Builders (gpipe, one_f_one_b, interleaved_1f1b, zero_bubble_h1) return compute-only schedules;
// lower() inserts the SEND/RECV actions: a SEND right after the action that produces the tensor
// (sends are asynchronous, they never block) and a RECV right before the action that consumes it,
// so no rank waits on a receive whose send is queued behind a receive of its own peer.
// Everything here is pure C++ (no torch): it builds, validates, simulates and draws schedules
// without running a model (see pipeline_simulate.h); PipelineParallel only executes them.
//
// Errors: builders throw ConfigError for impossible parameters (what was asked and what would
// work); validate() throws ScheduleError whose message prints the step x rank grid with the
// failing step marked; parse_schedule() throws ScheduleError naming the line; the file functions
// throw ConfigError for a file they cannot read or write.
// Ownership: schedules are plain values the caller owns; the file functions open and close their
// file within the call. Thread-safety: plain values; all functions are reentrant.
#pragma once

#include <tandem/base/errors.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::pipeline {

// A schedule that breaks a rule (see validate()). A ConfigError: the schedule is an input.
class ScheduleError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

enum class Op : uint8_t {
  kForward,
  kBackward,
  kBackwardInput,
  kBackwardWeight,
  kSendForward,
  kRecvForward,
  kSendBackward,
  kRecvBackward
};

// "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B" (also what parse_op accepts).
const char* to_string(Op op);
Op parse_op(const std::string& text);  // ScheduleError for anything else
bool is_compute(Op op);
bool is_comm(Op op);

struct Action {
  Op op = Op::kForward;
  int stage = 0;
  int microbatch = 0;
  bool operator==(const Action& o) const {
    return op == o.op && stage == o.stage && microbatch == o.microbatch;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

// Short form used in grids and pictures: "F2:3" (stage 2, microbatch 3), "SF2:3", "RB1:0", ...
std::string to_string(const Action& a);

struct Schedule {
  std::string name;
  int num_ranks = 0;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<int> stage_to_rank;            // size num_stages
  std::vector<std::vector<Action>> actions;  // per rank, in execution order

  // Stages of `rank`, ascending.
  std::vector<int> stages_of(int rank) const;
  // True when the schedule holds SEND/RECV actions.
  bool lowered() const;
  // Step x rank grid (one row per step), `mark_rank`/`mark_step` (when >= 0) flagged with ">>".
  std::string grid(int mark_rank = -1, int mark_step = -1) const;
  // Order-sensitive 64-bit digest of everything above (ranks compare it to agree on a schedule).
  uint64_t fingerprint() const;
  bool operator==(const Schedule& o) const;
};

// ---- builders (compute actions only; call lower() before running or simulating) ----------------
// `p` ranks, one stage per rank (stage i on rank i), `m` microbatches; all need p >= 1, m >= 1.

// All forwards, then all backwards (microbatch order). Peak live activations: m on every stage.
Schedule gpipe(int p, int m);
// One forward, one backward: rank i runs min(p - i - 1, m) warm-up forwards, then alternates
// F and B. Peak live activations p - i. ConfigError when m < p (no steady state: use gpipe).
Schedule one_f_one_b(int p, int m);
// Interleaved 1F1B (Megatron-LM): v stages per rank, stage s on rank s % p (p * v stages).
// ConfigError unless m >= p and m % p == 0 (the schedule advances p microbatches per chunk).
// v == 1 is one_f_one_b(p, m).
Schedule interleaved_1f1b(int p, int m, int v);
// Zero-bubble ZB-H1: backward split into I and W; W passes fill what would be bubbles while
// live activations (F done, I not done) on rank i never exceed 1F1B's min(p - i, m) and at most
// p W passes wait. Built by a greedy list scheduler on unit costs (F = I = W = 1): bubble time
// (p - 1) vs 1F1B's 3 (p - 1). Any m >= 1.
Schedule zero_bubble_h1(int p, int m);
// By name: "gpipe", "1f1b", "interleaved" (uses v), "zbh1" (ConfigError for other names).
Schedule build_schedule(const std::string& name, int p, int m, int v = 1);

// Inserts SEND/RECV actions (see the top of this file). Idempotent on a lowered schedule.
Schedule lower(const Schedule& compute_only);

// Checks, in order: shape (ranks, stages, stage_to_rank), every action's stage belongs to its rank
// and indices are in range; for every (stage, microbatch) exactly one F and either one B or one I
// and one W; F before B/I and I before W on the rank (and, for stages sharing a rank, a stage's F
// after the previous stage's F, its B/I after the next stage's B/I); then, on a lowered schedule,
// every cross-rank dependency is received before it is used and sent after it is produced, every
// SEND has exactly one RECV, and executing the schedule (sends asynchronous, receives blocking)
// cannot deadlock. A compute-only schedule is checked as lower() would lower it.
// Throws ScheduleError: what is wrong, then grid() with the failing step marked.
void validate(const Schedule& schedule);

// ---- without message tags (NCCL) ---------------------------------------------------------------
// A backend without message tags matches a pair's sends and receives in posting order only, and
// an op may hold its rank's queue until the peer posts its match. lower()'s placement (a RECV
// right before its consumer) then deadlocks some schedules (interleaved 1F1B: a rank's lone send
// waits for a receive its peer queued behind a send of its own). PipelineParallel therefore runs
// lower_untagged()'s placement there and posts each maximal run of consecutive SEND/RECV actions
// of a rank as one batch (Communicator::send_recv: one NCCL group), nothing ahead of its action.

// Inserts SEND/RECV actions for a backend without tags: the ranks take turns running their next
// compute action once its inputs have arrived, and each send and its receive enter the two ranks'
// lists at that moment. Every rank then posts its point-to-point ops in one global order, in which
// the earliest op not done always has both sides posted: no deadlock, grouped or not, and a
// pair's messages in one order on both sides. A lowered schedule's own SEND/RECV actions are
// dropped and placed anew. Throws ScheduleError when no rank can go on (a malformed schedule;
// validate() says where).
Schedule lower_untagged(const Schedule& schedule);
// The runs of consecutive SEND/RECV actions of a lowered schedule, per rank, as indices into
// actions[rank]: the batches PipelineParallel posts together without tags.
std::vector<std::vector<std::vector<int>>> untagged_batches(const Schedule& lowered);
// validate(), then, for a lowered schedule as its actions place the sends and receives (a
// compute-only one as lower_untagged() places them): every pair of ranks posts its messages in the
// same order on both sides, and running the batches (each rank's in order; an op completes once
// the batch holding its match is posted, a batch once all its ops did) cannot deadlock. Throws
// ScheduleError naming the pair or the stuck batch, with the grid.
void validate_untagged(const Schedule& schedule);

// ---- text format --------------------------------------------------------------------------------
// Lines (CSV; '#' starts a comment line; blank lines ignored):
//   tandem-pipeline-schedule,1
//   name,<name>
//   shape,<ranks>,<stages>,<microbatches>
//   stage_to_rank,<rank of stage 0>,<rank of stage 1>,...
//   <rank>,<op>,<stage>,<microbatch>          one per action, in order per rank
// parse_schedule() does not validate (call validate()); it throws ScheduleError with the line
// number for syntax errors.
std::string to_text(const Schedule& schedule);
Schedule parse_schedule(const std::string& text);
// Files: ConfigError when the file cannot be read or written.
void write_schedule_file(const Schedule& schedule, const std::string& path);
Schedule read_schedule_file(const std::string& path);

}  // namespace tandem::pipeline
