// Simulating a pipeline schedule and drawing it (SVG, Chrome trace / Perfetto JSON).
//
// simulate() executes a schedule's actions on an idealised machine: each rank runs its list in
// order; a compute action takes its stage's cost; a SEND costs nothing on the sender (it is
// asynchronous) and its tensor arrives `send_latency` seconds later; a RECV ends when its tensor
// has arrived. Compute-only schedules are lowered first. Per rank it reports busy time, bubble
// fraction (1 - busy / makespan) and the peak number of live activations (microbatches whose F ran
// on that rank and whose B, or I, has not), summed over the rank's stages: the memory model of the
// zero-bubble paper, where I frees the activations only the input path needs and W keeps the
// smaller set its weight gradients need (counted apart, as peak_pending_weight_grads).
//
// With unit costs the textbook figures come out exactly (tests/pipeline/schedule_test.cpp):
// GPipe and 1F1B bubble (p-1)/(m+p-1); 1F1B peak activations min(p-i, m) on rank i, GPipe m;
// interleaved with v chunks per rank (per-chunk costs 1/v) has (makespan - ideal) / ideal
// = (p-1)/(v m); ZB-H1 (F = I = W = 1) has a third of 1F1B's bubble time at equal peak memory.
//
// Costs can be measured (PipelineParallel::measured_costs()); the exports then show real
// durations. All pure C++, no torch. Errors: ConfigError for costs that do not fit the schedule;
// ScheduleError (via validate) for a broken schedule. Thread-safety: reentrant.
#pragma once

#include <tandem/runtime/pipeline_schedule.h>

#include <string>
#include <vector>

namespace tandem::pipeline {

// Seconds per action, per stage (vectors of size num_stages).
struct Costs {
  std::vector<double> forward;
  std::vector<double> backward_input;   // I
  std::vector<double> backward_weight;  // W
  // Full backward B; empty: I + W.
  std::vector<double> backward;
  double send_latency = 0.0;

  // Every stage the same.
  static Costs uniform(int num_stages, double f, double i, double w, double latency = 0.0);
  double b(int stage) const;
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
  std::vector<int> peak_activations;           // per rank: F done, B or I not done
  std::vector<int> peak_pending_weight_grads;  // per rank: I done, W not done (zero-bubble only)
  std::vector<TimedAction> timeline;           // every action, with its simulated start and end
};

// Validates (ScheduleError) and simulates `schedule` (lowered first if needed).
SimResult simulate(const Schedule& schedule, const Costs& costs);

// Bubble of a measured (or simulated) timeline: per rank 1 - busy / span, where span runs from the
// earliest start to the latest end over all ranks and busy sums compute actions.
std::vector<double> bubble_fractions(const std::vector<TimedAction>& timeline, int num_ranks);

// Send latency seen in a timeline whose ranks share one clock: the median, over receives that
// started waiting before their send was posted, of (receive end - send end); 0 when there are none.
// Feed it to Costs::send_latency to simulate a measured run.
double measured_send_latency(const std::vector<TimedAction>& timeline);

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
