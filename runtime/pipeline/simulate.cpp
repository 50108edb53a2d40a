// simulate(), bubble_fractions() and the SVG / Chrome-trace exports (drawn through base/'s
// SvgWriter and ChromeTraceWriter, the one writer of each).
#include <tandem/runtime/pipeline_simulate.h>

#include <tandem/base/file_system.h>
#include <tandem/base/trace.h>

#include "base/chrome_trace.h"
#include "base/json.h"
#include "base/svg_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>

namespace tandem::pipeline {

Costs Costs::uniform(int num_stages, double f, double i, double w, double latency) {
  Costs c;
  c.forward.assign(num_stages, f);
  c.backward_input.assign(num_stages, i);
  c.backward_weight.assign(num_stages, w);
  c.comm.send_latency = latency;
  return c;
}

double Costs::b(int stage) const {
  if (!backward.empty()) return backward[stage];
  return backward_input[stage] + backward_weight[stage];
}

double Costs::of(const Action& a) const {
  const auto it = per_action.find({a.op, a.stage, a.microbatch});
  if (it != per_action.end()) return it->second;
  switch (a.op) {
    case Op::kForward:
      return forward[a.stage];
    case Op::kBackward:
      return b(a.stage);
    case Op::kBackwardInput:
      return backward_input[a.stage];
    case Op::kBackwardWeight:
      return backward_weight[a.stage];
    default:
      return 0.0;
  }
}

SimResult simulate(const Schedule& input, const Costs& costs) {
  validate(input);
  const Schedule s = lower(input);
  const size_t S = static_cast<size_t>(s.num_stages);
  if (costs.forward.size() != S || costs.backward_input.size() != S ||
      costs.backward_weight.size() != S ||
      (!costs.backward.empty() && costs.backward.size() != S)) {
    throw ConfigError("simulate: costs must have one entry per stage (" + std::to_string(S) +
                      "), got forward " + std::to_string(costs.forward.size()) + ", I " +
                      std::to_string(costs.backward_input.size()) + ", W " +
                      std::to_string(costs.backward_weight.size()));
  }
  const CommCosts& comm = costs.comm;
  if (comm.send_latency < 0 || comm.send_overhead < 0 || comm.recv_overhead < 0) {
    throw ConfigError("simulate: the communication costs must be >= 0, got send_latency " +
                      std::to_string(comm.send_latency) + ", send_overhead " +
                      std::to_string(comm.send_overhead) + ", recv_overhead " +
                      std::to_string(comm.recv_overhead));
  }
  for (const auto& [key, seconds] : costs.per_action) {
    const auto& [op, stage, mb] = key;
    if (!(seconds >= 0) || !is_compute(op) || stage < 0 || stage >= s.num_stages) {
      throw ConfigError("simulate: per_action cost of " + to_string(Action{op, stage, mb}) +
                        " must be a compute action of a stage of the schedule and >= 0, got " +
                        std::to_string(seconds));
    }
  }
  const int R = s.num_ranks;
  SimResult res;
  res.busy.assign(R, 0.0);
  res.peak_activations.assign(R, 0);
  std::vector<double> clock(R, 0.0);
  std::vector<size_t> pc(R, 0);
  std::vector<int> live(R, 0), pending_w(R, 0);
  res.peak_pending_weight_grads.assign(R, 0);
  std::map<std::tuple<int, int, int>, double> arrival;  // (forward?, stage, mb) -> time
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      while (pc[r] < s.actions[r].size()) {
        const Action& a = s.actions[r][pc[r]];
        TimedAction t{r, a, clock[r], clock[r]};
        switch (a.op) {
          case Op::kForward:
            t.end += costs.of(a);
            ++live[r];
            break;
          case Op::kBackward:
            t.end += costs.of(a);
            --live[r];
            break;
          case Op::kBackwardInput:
            t.end += costs.of(a);
            --live[r];
            ++pending_w[r];
            break;
          case Op::kBackwardWeight:
            t.end += costs.of(a);
            --pending_w[r];
            break;
          case Op::kSendForward:
          case Op::kSendBackward:
            arrival[{a.op == Op::kSendForward, a.stage, a.microbatch}] =
                clock[r] + comm.send_latency;
            t.end += comm.send_overhead;
            break;
          case Op::kRecvForward:
          case Op::kRecvBackward: {
            auto it = arrival.find({a.op == Op::kRecvForward, a.stage, a.microbatch});
            if (it == arrival.end()) goto blocked;
            t.end = std::max(clock[r] + comm.recv_overhead, it->second);
            break;
          }
        }
        if (is_compute(a.op)) res.busy[r] += t.end - t.start;
        res.peak_activations[r] = std::max(res.peak_activations[r], live[r]);
        res.peak_pending_weight_grads[r] = std::max(res.peak_pending_weight_grads[r], pending_w[r]);
        clock[r] = t.end;
        res.timeline.push_back(t);
        ++pc[r];
        progress = true;
      }
    blocked:;
    }
  }
  res.makespan = *std::max_element(clock.begin(), clock.end());
  res.finish = clock;
  res.bubble.resize(R);
  res.own_bubble.resize(R);
  for (int r = 0; r < R; ++r) {
    res.bubble[r] = res.makespan > 0 ? 1.0 - res.busy[r] / res.makespan : 0.0;
    res.mean_bubble += res.bubble[r] / R;
    res.own_bubble[r] = clock[r] > 0 ? 1.0 - res.busy[r] / clock[r] : 0.0;
    res.mean_own_bubble += res.own_bubble[r] / R;
  }
  return res;
}

std::vector<double> bubble_fractions(const std::vector<TimedAction>& timeline, int num_ranks) {
  std::vector<double> busy(num_ranks, 0.0), out(num_ranks, 0.0);
  if (timeline.empty()) return out;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& t : timeline) {
    lo = std::min(lo, t.start);
    hi = std::max(hi, t.end);
    if (is_compute(t.action.op) && t.rank >= 0 && t.rank < num_ranks)
      busy[t.rank] += t.end - t.start;
  }
  for (int r = 0; r < num_ranks; ++r) out[r] = hi > lo ? 1.0 - busy[r] / (hi - lo) : 0.0;
  return out;
}

CommCosts measured_comm_costs(const std::vector<std::vector<TimedAction>>& timelines) {
  using Key = std::tuple<bool, int, int>;  // (forward?, producing stage, microbatch)
  auto key = [](const Action& a) {
    return Key{a.op == Op::kSendForward || a.op == Op::kRecvForward, a.stage, a.microbatch};
  };
  auto is_send = [](Op op) { return op == Op::kSendForward || op == Op::kSendBackward; };
  auto is_recv = [](Op op) { return op == Op::kRecvForward || op == Op::kRecvBackward; };
  // Per timeline, each RECV with its SEND's start: (recv start, recv end, send start).
  std::vector<std::tuple<double, double, double>> pairs;
  double send_sum = 0;
  size_t sends = 0;
  for (const auto& timeline : timelines) {
    std::map<Key, double> send_start;
    for (const auto& t : timeline) {
      if (!is_send(t.action.op)) continue;
      send_start[key(t.action)] = t.start;
      send_sum += t.end - t.start;
      ++sends;
    }
    for (const auto& t : timeline) {
      if (!is_recv(t.action.op)) continue;
      auto it = send_start.find(key(t.action));
      if (it != send_start.end()) pairs.emplace_back(t.start, t.end, it->second);
    }
  }
  CommCosts c;
  c.send_overhead = sends ? send_sum / static_cast<double>(sends) : 0.0;
  double sum = 0;
  size_t n = 0;
  for (const auto& [start, end, sent] : pairs) {
    if (start <= sent) {  // waiting before the send began: the whole transfer
      sum += end - sent;
      ++n;
    }
  }
  c.send_latency = n ? std::max(0.0, sum / static_cast<double>(n)) : 0.0;
  sum = 0;
  n = 0;
  for (const auto& [start, end, sent] : pairs) {
    if (start >= sent + c.send_latency) {  // the tensor was (on average) there already
      sum += end - start;
      ++n;
    }
  }
  c.recv_overhead = n ? sum / static_cast<double>(n) : 0.0;
  return c;
}

std::map<std::tuple<Op, int, int>, double> measured_action_costs(
    const std::vector<TimedAction>& timeline) {
  std::map<std::tuple<Op, int, int>, double> out;
  for (const auto& t : timeline) {
    if (is_compute(t.action.op)) {
      out[{t.action.op, t.action.stage, t.action.microbatch}] = t.end - t.start;
    }
  }
  return out;
}

namespace {

const char* color(Op op) {
  switch (op) {
    case Op::kForward:
      return "#4a7fd4";
    case Op::kBackward:
      return "#3aa55d";
    case Op::kBackwardInput:
      return "#7cc48f";
    case Op::kBackwardWeight:
      return "#e8a33d";
    default:
      return "#bbbbbb";
  }
}

std::string fill(Op op) { return std::string("fill=\"") + color(op) + "\""; }

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace

std::string to_svg(const Schedule& s, const std::vector<TimedAction>& timeline,
                   const std::string& title) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const auto& t : timeline) {
    lo = std::min(lo, t.start);
    hi = std::max(hi, t.end);
  }
  if (timeline.empty()) lo = hi = 0;
  const double span = hi > lo ? hi - lo : 1.0;
  const double left = 70, width = 1000, row = 34, top = 50;
  const double height = top + row * s.num_ranks + 60;
  const auto bubbles = bubble_fractions(timeline, s.num_ranks);
  double mean_bubble = 0;
  for (double b : bubbles) mean_bubble += b / std::max(1, s.num_ranks);
  SvgWriter svg;
  svg.text(left, 20,
           (title.empty() ? s.name : title) + ": " + std::to_string(s.num_ranks) + " ranks, " +
               std::to_string(s.num_stages) + " stages, " + std::to_string(s.num_microbatches) +
               " microbatches, makespan " + format("%.3f", span * 1e3) + " ms, bubble " +
               format("%.1f", 100 * mean_bubble) + "%",
           "font-size=\"14\"");
  for (int r = 0; r < s.num_ranks; ++r) {
    svg.text(5, top + r * row + row * 0.6, "rank " + std::to_string(r));
    svg.line(left, top + (r + 1) * row, left + width, top + (r + 1) * row, "stroke=\"#ddd\"");
  }
  for (const auto& t : timeline) {
    if (!is_compute(t.action.op)) continue;
    const double x = left + (t.start - lo) / span * width;
    const double w = std::max(0.5, (t.end - t.start) / span * width);
    const double y = top + t.rank * row + 3;
    svg.rect(x, y, w, row - 6, fill(t.action.op) + " stroke=\"white\" stroke-width=\"0.5\"",
             to_string(t.action) + " " + format("%.3f", (t.start - lo) * 1e3) + "-" +
                 format("%.3f", (t.end - lo) * 1e3) + " ms");
    if (w >= 14) {
      svg.text(x + w / 2, y + (row - 6) * 0.65,
               to_string(t.action.op) + std::to_string(t.action.microbatch),
               "fill=\"white\" text-anchor=\"middle\"");
    }
  }
  // Time axis: 5 ticks.
  const double axis_y = top + row * s.num_ranks + 15;
  for (int i = 0; i <= 5; ++i) {
    const double x = left + width * i / 5;
    svg.line(x, axis_y - 5, x, axis_y, "stroke=\"#888\"");
    svg.text(x, axis_y + 12, format("%.3g", span * 1e3 * i / 5) + " ms", "text-anchor=\"middle\"");
  }
  // Legend.
  const Op legend[] = {Op::kForward, Op::kBackward, Op::kBackwardInput, Op::kBackwardWeight};
  const char* names[] = {"F forward", "B backward", "I input grad", "W weight grad"};
  for (int i = 0; i < 4; ++i) {
    svg.rect(left + i * 140.0, axis_y + 22, 12, 12, fill(legend[i]));
    svg.text(left + i * 140.0 + 16, axis_y + 32, names[i]);
  }
  return svg.finish(left + width + 20, height, "font-size=\"11\"");
}

std::string to_chrome_trace(const Schedule& s, const std::vector<TimedAction>& timeline) {
  double lo = std::numeric_limits<double>::infinity();
  for (const auto& t : timeline) lo = std::min(lo, t.start);
  if (timeline.empty()) lo = 0;
  ChromeTraceWriter out;
  for (int r = 0; r < s.num_ranks; ++r) {
    out.metadata("thread_name", 0, r, trace::Args().add("name", "rank " + std::to_string(r)).body());
  }
  for (const auto& t : timeline) {
    const std::string name = to_string(t.action);
    const trace::Args args =
        trace::Args().add("stage", t.action.stage).add("microbatch", t.action.microbatch);
    ChromeTraceEvent e;
    e.name = name;
    e.category = to_string(t.action.op);
    e.ts_us = (t.start - lo) * 1e6;
    e.tid = t.rank;
    e.dur_us = (t.end - t.start) * 1e6;
    e.args = args.body();
    out.event(e);
  }
  JsonValue other = JsonValue::object();
  other.set("schedule", JsonValue(s.name));
  out.finish(other);
  return std::move(out.text());
}

void write_text_file(const std::string& path, const std::string& text) {
  try {
    posix_file_system()->write_file_atomically(path, text);
  } catch (const Error& e) {
    throw ConfigError(std::string("tandem: pipeline: cannot write '") + path + "': " + e.what());
  }
}

}  // namespace tandem::pipeline
