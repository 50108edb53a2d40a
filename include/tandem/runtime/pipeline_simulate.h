// Simulating a pipeline schedule and drawing it (SVG, Chrome trace / Perfetto JSON).
//
// simulate() executes a schedule's actions on an idealised machine: each rank runs its list in
// order; a compute action takes its stage's cost; a SEND holds its sender for `send_overhead`
// seconds (handing the tensor to the transport) and its tensor arrives `send_latency` seconds
// after the SEND started; a RECV takes `recv_overhead` seconds and ends no earlier than its
// tensor's arrival. With the three communication terms at zero (the default), sends are free and
// instantaneous. Compute-only schedules are lowered first. Per rank it reports busy time, the
// bubble fraction two ways (1 - busy / makespan, and 1 - busy / the rank's own finish time, which
// is what PipelineParallel::measured_bubble() measures) and the peak number of live activations
// (microbatches whose F ran on that rank and whose B, or I, has not), summed over the rank's
// stages: the memory model of the zero-bubble paper, where I frees the activations only the input
// path needs and W keeps the smaller set its weight gradients need (counted apart, as
// peak_pending_weight_grads).
//
// With unit costs the textbook figures come out exactly (tests/pipeline/schedule_test.cpp):
// GPipe and 1F1B bubble (p-1)/(m+p-1); 1F1B peak activations min(p-i, m) on rank i, GPipe m;
// interleaved with v chunks per rank (per-chunk costs 1/v) has (makespan - ideal) / ideal
// = (p-1)/(v m); ZB-H1 (F = I = W = 1) has a third of 1F1B's bubble time at equal peak memory.
//
// Costs can be measured: PipelineParallel::measured_costs() for F/B/I/W per stage,
// measured_comm_costs() on the gathered timelines for the communication terms and
// measured_action_costs() for one step's own duration of each action; the exports then show real
// durations. All pure C++, no torch. Errors: ConfigError for costs that do not fit the
// schedule or are negative; ScheduleError (via validate) for a broken schedule.
// Thread-safety: reentrant.
#pragma once

#include <tandem/runtime/pipeline_schedule.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace tandem::pipeline {

// Seconds each point-to-point transfer costs, the same for every stage (zero: free).
struct CommCosts {
  double send_latency = 0.0;   // from a SEND's start until its tensor can be received
  double send_overhead = 0.0;  // how long a SEND holds its sender
  double recv_overhead = 0.0;  // how long a RECV takes when its tensor has already arrived
};

// Seconds per action, per stage (vectors of size num_stages), and the communication terms.
struct Costs {
  std::vector<double> forward;
  std::vector<double> backward_input;   // I
  std::vector<double> backward_weight;  // W
  // Full backward B; empty: I + W.
  std::vector<double> backward;
  CommCosts comm;
  // Optional: seconds of single compute actions, keyed (op, stage, microbatch), each overriding
  // its stage's figure above. A step's costs differ by microbatch: the first backward of a stage
  // allocates the parameters' gradients (zero_grad() sets them to none) and can take twice as long
  // as the others. Where that backward is on the critical path (1F1B: the next forward of the
  // stage after it waits for it), per-stage means under-estimate the bubble; a step's own
  // durations come from measured_action_costs().
  std::map<std::tuple<Op, int, int>, double> per_action;

  // Every stage the same.
  static Costs uniform(int num_stages, double f, double i, double w, double latency = 0.0);
  double b(int stage) const;
  // Seconds of compute action `a`: its per_action entry, else its stage's figure.
  double of(const Action& a) const;
};

struct TimedAction {
  int rank = 0;
  Action action;
  double start = 0;
  double end = 0;
};

struct SimResult {
  double makespan = 0;
  std::vector<double> busy;                    // per rank: seconds of compute
  std::vector<double> bubble;                  // per rank: 1 - busy / makespan
  double mean_bubble = 0;                      // mean over ranks
  std::vector<double> finish;                  // per rank: when its last action ends
  std::vector<double> own_bubble;              // per rank: 1 - busy / finish
  double mean_own_bubble = 0;                  // mean over ranks
  std::vector<int> peak_activations;           // per rank: F done, B or I not done
  std::vector<int> peak_pending_weight_grads;  // per rank: I done, W not done (zero-bubble only)
  std::vector<TimedAction> timeline;           // every action, with its simulated start and end
};

// Validates (ScheduleError) and simulates `schedule` (lowered first if needed).
SimResult simulate(const Schedule& schedule, const Costs& costs);

// Bubble of a measured (or simulated) timeline: per rank 1 - busy / span, where span runs from the
// earliest start to the latest end over all ranks and busy sums compute actions.
std::vector<double> bubble_fractions(const std::vector<TimedAction>& timeline, int num_ranks);

// The communication terms seen in measured timelines whose ranks share one clock (one per step,
// e.g. PipelineParallel::gather_timeline() after each step), pooled over all of them, each
// SEND matched with its RECV in the same timeline:
//   send_latency:  RECV end - SEND start, over receives that began waiting before their SEND began;
//   send_overhead: SEND duration, over all sends;
//   recv_overhead: RECV duration, over receives that began send_latency or more after their
//                  SEND began (their tensor had, on average, arrived).
// Means, not medians: a simulated step adds these terms up, and on a busy machine the rare long
// ones (a thread that waits for a core) carry much of the time. A term without samples is 0.
// Feed the result to Costs::comm to simulate a measured run.
CommCosts measured_comm_costs(const std::vector<std::vector<TimedAction>>& timelines);

// The duration of every compute action in one measured step's timeline, for Costs::per_action.
std::map<std::tuple<Op, int, int>, double> measured_action_costs(
    const std::vector<TimedAction>& timeline);

// A picture a person reads: one row per rank, one box per compute action (F blue, B/I green,
// W orange; label = microbatch), time axis in ms, title with name, makespan and bubble.
std::string to_svg(const Schedule& schedule, const std::vector<TimedAction>& timeline,
                   const std::string& title = "");
// Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one thread per rank, complete events
// ("ph":"X") in microseconds, args {stage, microbatch}.
std::string to_chrome_trace(const Schedule& schedule, const std::vector<TimedAction>& timeline);
// Writes `text` to `path` (ConfigError when it cannot).
void write_text_file(const std::string& path, const std::string& text);

}  // namespace tandem::pipeline
