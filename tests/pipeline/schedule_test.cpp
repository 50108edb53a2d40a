// Pipeline schedules without torch: every builder for p in {2,3,4}, m in {1..8}, v in {1,2} is
// valid and deadlock-free once lowered; unit-cost simulation reproduces the textbook bubble and
// memory figures; the text format round-trips; broken schedules are rejected with the grid.
#include <gtest/gtest.h>
#include <tandem/runtime/pipeline_schedule.h>
#include <tandem/runtime/pipeline_simulate.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace tandem::pipeline {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every (name, p, m, v) the builders accept, and whether they should.
struct Case {
  std::string name;
  int p, m, v;
};

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (int p = 2; p <= 4; ++p) {
    for (int m = 1; m <= 8; ++m) {
      out.push_back({"gpipe", p, m, 1});
      out.push_back({"1f1b", p, m, 1});
      out.push_back({"zbh1", p, m, 1});
      for (int v = 1; v <= 2; ++v) out.push_back({"interleaved", p, m, v});
    }
  }
  return out;
}

bool should_build(const Case& c) {
  if (c.name == "1f1b") return c.m >= c.p;
  if (c.name == "interleaved") return c.m >= c.p && (c.v == 1 || c.m % c.p == 0);
  return true;
}

std::string label(const Case& c) {
  return c.name + " p=" + std::to_string(c.p) + " m=" + std::to_string(c.m) +
         " v=" + std::to_string(c.v);
}

TEST(ScheduleBuilders, EveryBuilderIsValidAndDeadlockFreeOrRefusedWithAReason) {
  int built = 0;
  for (const auto& c : all_cases()) {
    SCOPED_TRACE(label(c));
    if (!should_build(c)) {
      try {
        build_schedule(c.name, c.p, c.m, c.v);
        ADD_FAILURE() << "expected ConfigError";
      } catch (const ConfigError& e) {
        EXPECT_TRUE(contains(e.what(), "microbatches")) << e.what();
      }
      continue;
    }
    const Schedule s = build_schedule(c.name, c.p, c.m, c.v);
    EXPECT_EQ(s.num_ranks, c.p);
    EXPECT_EQ(s.num_stages, c.p * (c.name == "interleaved" ? c.v : 1));
    EXPECT_FALSE(s.lowered());
    EXPECT_NO_THROW(validate(s));
    const Schedule low = lower(s);
    EXPECT_TRUE(low.lowered());
    EXPECT_NO_THROW(validate(low));
    EXPECT_EQ(lower(low), low);  // idempotent
    // Deadlock freedom also holds in simulation with any latency.
    const auto r = simulate(low, Costs::uniform(s.num_stages, 1, 1, 1, 0.25));
    EXPECT_GT(r.makespan, 0);
    ++built;
  }
  EXPECT_GT(built, 80);
}

TEST(ScheduleBuilders, OneFOneBRefusesFewerMicrobatchesThanStages) {
  try {
    one_f_one_b(4, 3);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "got 3 microbatches for 4 stages")) << e.what();
  }
}

TEST(ScheduleSimulate, GPipeAndOneFOneBBubbleIsTextbook) {
  for (int p = 2; p <= 4; ++p) {
    for (int m = 1; m <= 8; ++m) {
      const double expected = (p - 1.0) / (m + p - 1.0);
      const auto g = simulate(gpipe(p, m), Costs::uniform(p, 1, 1, 1));
      for (int r = 0; r < p; ++r) EXPECT_NEAR(g.bubble[r], expected, 1e-12) << p << " " << m;
      EXPECT_NEAR(g.makespan, (m + p - 1) * 3.0, 1e-12);
      for (int r = 0; r < p; ++r) EXPECT_EQ(g.peak_activations[r], m);
      if (m < p) continue;
      const auto o = simulate(one_f_one_b(p, m), Costs::uniform(p, 1, 1, 1));
      for (int r = 0; r < p; ++r) {
        EXPECT_NEAR(o.bubble[r], expected, 1e-12) << p << " " << m;
        EXPECT_EQ(o.peak_activations[r], p - r) << "1F1B keeps p - i microbatches on stage i";
      }
    }
  }
}

TEST(ScheduleSimulate, InterleavedBubbleShrinksByV) {
  for (int p = 2; p <= 4; ++p) {
    for (int m = p; m <= 8; m += p) {
      for (int v = 1; v <= 2; ++v) {
        // v chunks per rank, each 1/v of a stage's work: the ideal time per rank stays 3m.
        const auto r =
            simulate(interleaved_1f1b(p, m, v), Costs::uniform(p * v, 1.0 / v, 1.0 / v, 1.0 / v));
        const double ideal = 3.0 * m;
        EXPECT_NEAR((r.makespan - ideal) / ideal, (p - 1.0) / (v * m), 1e-9)
            << "p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

TEST(ScheduleSimulate, ZeroBubbleH1HasAThirdOfOneFOneBsBubbleAtEqualMemory) {
  for (int p = 2; p <= 4; ++p) {
    for (int m = p; m <= 8; ++m) {
      const auto costs = Costs::uniform(p, 1, 1, 1);  // B = I + W = 2
      const auto o = simulate(one_f_one_b(p, m), costs);
      const auto z = simulate(zero_bubble_h1(p, m), costs);
      const double ideal = 3.0 * m;
      EXPECT_NEAR(o.makespan - ideal, 3.0 * (p - 1), 1e-12);
      EXPECT_NEAR(z.makespan - ideal, 1.0 * (p - 1), 1e-12) << "p=" << p << " m=" << m;
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(z.peak_activations[r], o.peak_activations[r]) << "rank " << r;
        EXPECT_LE(z.peak_pending_weight_grads[r], p);
        EXPECT_LT(z.bubble[r], o.bubble[r]);
      }
    }
  }
}

TEST(ScheduleSimulate, LatencyAndMeasuredCostsShowUp) {
  Costs c = Costs::uniform(2, 1, 1, 1, 0.5);
  const auto r = simulate(gpipe(2, 1), c);
  // F0, send (0.5), F1, B1, send (0.5), B0.
  EXPECT_NEAR(r.makespan, 1 + 0.5 + 1 + 2 + 0.5 + 2, 1e-12);
  c = Costs::uniform(2, 1, 1, 1);
  c.forward = {1, 3};  // a slow second stage
  const auto slow = simulate(one_f_one_b(2, 4), c);
  EXPECT_GT(slow.bubble[0], slow.bubble[1]);
  EXPECT_THROW(simulate(gpipe(3, 2), Costs::uniform(2, 1, 1, 1)), ConfigError);
  // The latency comes back out of a simulated timeline.
  const auto lat = simulate(one_f_one_b(3, 6), Costs::uniform(3, 1, 1, 1, 0.25));
  EXPECT_NEAR(measured_comm_costs({lat.timeline}).send_latency, 0.25, 1e-12);
  const CommCosts none = measured_comm_costs({});
  EXPECT_EQ(none.send_latency, 0.0);
  EXPECT_EQ(none.send_overhead, 0.0);
  EXPECT_EQ(none.recv_overhead, 0.0);
}

TEST(ScheduleSimulate, EachRanksOwnFinishGivesTheBubbleTheRuntimeMeasures) {
  // Unit costs, no communication cost: the last backwards cascade from rank p-1 to rank 0, 2
  // units apart, so rank r finishes 2r before the makespan.
  for (int p = 2; p <= 4; ++p) {
    for (int m = p; m <= 8; ++m) {
      for (const Schedule& s : {gpipe(p, m), one_f_one_b(p, m)}) {
        const auto r = simulate(s, Costs::uniform(p, 1, 1, 1));
        double mean = 0;
        for (int i = 0; i < p; ++i) {
          EXPECT_NEAR(r.finish[i], 3.0 * (m + p - 1) - 2.0 * i, 1e-12) << s.name << " rank " << i;
          EXPECT_NEAR(r.own_bubble[i], 1 - 3.0 * m / r.finish[i], 1e-12);
          mean += r.own_bubble[i] / p;
        }
        EXPECT_NEAR(r.mean_own_bubble, mean, 1e-12);
        EXPECT_NEAR(r.own_bubble[0], r.bubble[0], 1e-12);  // rank 0 ends last
      }
    }
  }
}

TEST(ScheduleSimulate, SendAndReceiveOverheadsHoldTheirRank) {
  // gpipe(2, 1): F0:0, SEND_F0:0, RECV_B1:0, B0:0 on rank 0; RECV_F0:0, F1:0, B1:0, SEND_B1:0 on
  // rank 1. F = 1, B = 2, latency 0.5 from each send's start, each send holds its rank 0.25.
  Costs c = Costs::uniform(2, 1, 1, 1, 0.5);
  c.comm.send_overhead = 0.25;
  c.comm.recv_overhead = 0.1;  // shorter than the waits: no effect here
  auto r = simulate(gpipe(2, 1), c);
  // Rank 1 receives at 1 + 0.5, computes until 4.5, sends until 4.75; the gradient arrives at 5.
  EXPECT_NEAR(r.finish[1], 4.75, 1e-12);
  EXPECT_NEAR(r.finish[0], 5 + 2, 1e-12);
  EXPECT_NEAR(r.makespan, 7, 1e-12);
  EXPECT_NEAR(r.timeline[1].end - r.timeline[1].start, 0.25, 1e-12);  // SEND_F0:0 on rank 0
  EXPECT_NEAR(r.own_bubble[1], 1 - 3 / 4.75, 1e-12);
  // A receive whose tensor is there already still takes recv_overhead.
  c = Costs::uniform(2, 1, 1, 1);
  c.comm.recv_overhead = 1.5;
  r = simulate(gpipe(2, 1), c);
  EXPECT_NEAR(r.finish[1], 1.5 + 1 + 2, 1e-12);  // RECV_F took 1.5, not 1
  EXPECT_NEAR(r.finish[0], 4.5 + 2, 1e-12);  // RECV_B waits from 1 to the gradient at 4.5
  c.comm.recv_overhead = -1;
  EXPECT_THROW(simulate(gpipe(2, 1), c), ConfigError);
}

TEST(ScheduleSimulate, CommunicationCostsOnlyLengthenAStep) {
  // More cost per transfer never makes a rank finish earlier (the simulation is monotone); with
  // every term at zero the result is exactly the unit-cost one.
  for (const auto& c : all_cases()) {
    if (!should_build(c)) continue;
    SCOPED_TRACE(label(c));
    const Schedule s = build_schedule(c.name, c.p, c.m, c.v);
    const Costs base = Costs::uniform(s.num_stages, 1, 1, 1);
    Costs zero = base;
    zero.comm = CommCosts{};
    EXPECT_EQ(simulate(s, zero).makespan, simulate(s, base).makespan);
    Costs comm = base;
    comm.comm = {0.2, 0.1, 0.05};
    const auto a = simulate(s, base), b = simulate(s, comm);
    for (int r = 0; r < c.p; ++r) {
      EXPECT_GE(b.finish[r], a.finish[r]);
      EXPECT_GE(b.own_bubble[r], a.own_bubble[r]);
    }
  }
}

TEST(ScheduleSimulate, PerActionCostsPlaceASlowFirstBackwardWhereItRan) {
  // 1F1B on 2 stages: rank 1's forward of microbatch 2 waits for rank 0's F0:2, which runs after
  // B0:0. A first backward d longer (it allocates the gradients) delays rank 1's finish by d;
  // spreading d over the stage's mean B delays it by less, so per-stage means under-estimate the
  // bubble. The benchmark's 1F1B gap to the measurement was exactly this.
  const Schedule s = one_f_one_b(2, 8);
  const Costs base = Costs::uniform(2, 1, 2, 0);
  const double d = 4;
  Costs slow = base;
  slow.per_action[{Op::kBackward, 0, 0}] = 2 + d;
  EXPECT_EQ(slow.of(Action{Op::kBackward, 0, 0}), 2 + d);
  EXPECT_EQ(slow.of(Action{Op::kBackward, 0, 1}), 2);
  EXPECT_EQ(slow.of(Action{Op::kForward, 1, 0}), 1);
  Costs means = base;
  means.backward = {2 + d / 8, 2};
  const auto a = simulate(s, base), b = simulate(s, slow), c = simulate(s, means);
  EXPECT_DOUBLE_EQ(b.finish[1], a.finish[1] + d);
  EXPECT_DOUBLE_EQ(b.busy[0], c.busy[0]);  // the same work on rank 0
  EXPECT_LT(c.finish[1], b.finish[1]);
  EXPECT_GT(b.mean_own_bubble, c.mean_own_bubble + 0.01);

  // measured_action_costs() reads each compute action's duration back: simulating with them
  // replays the timeline, whatever the per-stage figures say.
  Costs replay = Costs::uniform(2, 0, 0, 0);
  replay.per_action = measured_action_costs(b.timeline);
  EXPECT_EQ(replay.per_action.size(), 32u);  // F and B of 8 microbatches on 2 stages
  EXPECT_EQ(replay.per_action.at({Op::kBackward, 0, 0}), 2 + d);
  const auto r = simulate(s, replay);
  ASSERT_EQ(r.timeline.size(), b.timeline.size());
  for (size_t i = 0; i < r.timeline.size(); ++i) {
    EXPECT_EQ(r.timeline[i].action, b.timeline[i].action);
    EXPECT_DOUBLE_EQ(r.timeline[i].end, b.timeline[i].end);
  }

  Costs bad = base;
  bad.per_action[{Op::kBackward, 0, 0}] = -1;
  EXPECT_THROW(simulate(s, bad), ConfigError);
  bad.per_action = {{{Op::kSendForward, 0, 0}, 1.0}};
  EXPECT_THROW(simulate(s, bad), ConfigError);
  bad.per_action = {{{Op::kForward, 2, 0}, 1.0}};
  EXPECT_THROW(simulate(s, bad), ConfigError);
}

TEST(ScheduleSimulate, MeasuredCommCostsRecoverTheSimulatedTerms) {
  // A simulated run is a measured run with exact clocks: the fit gives back what went in, pooled
  // over several steps, as long as recv_overhead < send_latency (receives that wait then see the
  // latency alone).
  for (const char* name : {"1f1b", "zbh1", "interleaved"}) {
    SCOPED_TRACE(name);
    const Schedule s = build_schedule(name, 3, 6, std::string(name) == "interleaved" ? 2 : 1);
    Costs c = Costs::uniform(s.num_stages, 1, 1, 1);
    c.comm = {0.3, 0.2, 0.1};
    std::vector<std::vector<TimedAction>> steps;
    for (int i = 0; i < 3; ++i) {
      c.forward[0] = 1 + 0.5 * i;  // the steps differ
      steps.push_back(simulate(s, c).timeline);
    }
    const CommCosts fit = measured_comm_costs(steps);
    EXPECT_NEAR(fit.send_latency, 0.3, 1e-12);
    EXPECT_NEAR(fit.send_overhead, 0.2, 1e-12);
    EXPECT_NEAR(fit.recv_overhead, 0.1, 1e-12);
  }
  // Means over the samples, a receive that waited part of the latency counts for neither term.
  auto at = [](int rank, Op op, double start, double end) {
    return TimedAction{rank, Action{op, 0, 0}, start, end};
  };
  std::vector<std::vector<TimedAction>> steps = {
      {at(0, Op::kSendForward, 1.0, 1.5), at(1, Op::kRecvForward, 0.0, 3.0)},   // latency 2
      {at(0, Op::kSendForward, 1.0, 1.1), at(1, Op::kRecvForward, 0.5, 2.0)},   // latency 1
      {at(0, Op::kSendForward, 1.0, 1.2), at(1, Op::kRecvForward, 9.0, 9.25)},  // there already
      {at(0, Op::kSendForward, 1.0, 1.2), at(1, Op::kRecvForward, 2.0, 2.5)}};  // neither
  const CommCosts fit = measured_comm_costs(steps);
  EXPECT_NEAR(fit.send_latency, 1.5, 1e-12);
  EXPECT_NEAR(fit.send_overhead, (0.5 + 0.1 + 0.2 + 0.2) / 4, 1e-12);
  EXPECT_NEAR(fit.recv_overhead, 0.25, 1e-12);
}

TEST(ScheduleText, RoundTripsEveryBuilderLoweredOrNot) {
  for (const auto& c : all_cases()) {
    if (!should_build(c)) continue;
    const Schedule s = build_schedule(c.name, c.p, c.m, c.v);
    EXPECT_EQ(parse_schedule(to_text(s)), s) << label(c);
    EXPECT_EQ(parse_schedule(to_text(lower(s))), lower(s)) << label(c);
  }
  const std::string path = ::testing::TempDir() + "/tandem_schedule.csv";
  write_schedule_file(lower(zero_bubble_h1(3, 5)), path);
  EXPECT_EQ(read_schedule_file(path), lower(zero_bubble_h1(3, 5)));
  std::remove(path.c_str());
  EXPECT_THROW(read_schedule_file(path), ConfigError);
}

TEST(ScheduleText, UserWrittenScheduleIsAccepted) {
  const std::string text =
      "tandem-pipeline-schedule,1\n"
      "# two stages, two microbatches, hand-made\n"
      "name,mine\nshape,2,2,2\nstage_to_rank,0,1\n"
      "0,F,0,0\n0,F,0,1\n0,B,0,1\n0,B,0,0\n"
      "1,F,1,0\n1,B,1,0\n1,F,1,1\n1,B,1,1\n";
  const Schedule s = parse_schedule(text);
  EXPECT_EQ(s.name, "mine");
  EXPECT_NO_THROW(validate(s));
  EXPECT_NO_THROW(simulate(s, Costs::uniform(2, 1, 1, 1)));
}

TEST(ScheduleText, SyntaxErrorsNameTheLine) {
  auto expect_error = [](const std::string& text, const std::string& part) {
    try {
      parse_schedule(text);
      ADD_FAILURE() << "expected ScheduleError for " << text;
    } catch (const ScheduleError& e) {
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  };
  expect_error("nope\n", "line 1");
  expect_error("tandem-pipeline-schedule,1\n0,F,0,0\n", "line 2: action before the 'shape'");
  expect_error("tandem-pipeline-schedule,1\nshape,2,2,2\n0,X,0,0\n", "unknown pipeline action 'X'");
  expect_error("tandem-pipeline-schedule,1\nshape,2,2,2\n0,F,zero,0\n", "'zero' is not an integer");
  expect_error("tandem-pipeline-schedule,1\nshape,2,2,2\n5,F,0,0\n", "rank out of range");
}

// A broken schedule: expect ScheduleError whose message holds `part` and the marked grid.
void expect_rejected(const Schedule& s, const std::string& part, const std::string& marked = "") {
  try {
    validate(s);
    ADD_FAILURE() << "expected ScheduleError containing '" << part << "'";
  } catch (const ScheduleError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, part)) << msg;
    EXPECT_TRUE(contains(msg, "step | rank 0")) << "the grid is printed\n" << msg;
    if (!marked.empty()) {
      EXPECT_TRUE(contains(msg, ">>" + marked)) << msg;
    }
  }
}

TEST(ScheduleValidate, RejectsBrokenSchedulesAndMarksTheStep) {
  {  // backward before forward
    Schedule s = gpipe(2, 2);
    std::swap(s.actions[0][0], s.actions[0][2]);  // B0:0 first
    expect_rejected(s, "backward of 0:0 runs before its forward", "B0:0");
  }
  {  // a missing backward
    Schedule s = gpipe(2, 2);
    s.actions[1].pop_back();
    expect_rejected(s, "missing B1:1");
  }
  {  // a duplicated forward
    Schedule s = gpipe(2, 2);
    s.actions[0].insert(s.actions[0].begin() + 1, Action{Op::kForward, 0, 0});
    expect_rejected(s, "F0:0 appears twice", "F0:0");
  }
  {  // W before I
    Schedule s = zero_bubble_h1(2, 2);
    auto& l = s.actions[1];
    for (size_t j = 0; j < l.size(); ++j) {
      if (l[j].op == Op::kBackwardInput && l[j].microbatch == 0) {
        for (size_t k = j; k < l.size(); ++k) {
          if (l[k].op == Op::kBackwardWeight && l[k].microbatch == 0) std::swap(l[j], l[k]);
        }
        break;
      }
    }
    expect_rejected(s, "W1:0 runs before I1:0", "W1:0");
  }
  {  // an action on the wrong rank
    Schedule s = gpipe(2, 1);
    s.actions[0].push_back({Op::kForward, 1, 0});
    expect_rejected(s, "F1:0 belongs to rank 1", "F1:0");
  }
  {  // out-of-range microbatch
    Schedule s = gpipe(2, 1);
    s.actions[0][0].microbatch = 7;
    expect_rejected(s, "microbatch index out of range", "F0:7");
  }
  {  // a receive with no send
    Schedule s = lower(gpipe(2, 2));
    auto& l = s.actions[0];
    for (size_t j = 0; j < l.size(); ++j) {
      if (l[j].op == Op::kSendForward && l[j].microbatch == 1) {
        l.erase(l.begin() + static_cast<long>(j));
        break;
      }
    }
    expect_rejected(s, "missing SEND_F0:1 after F0:1", "F0:1");
  }
  {  // deadlock: rank 1 receives microbatch 1's activation before its send happens, and rank 0
     // sends it only after receiving a gradient rank 1 sends later.
    Schedule s;
    s.name = "deadlock";
    s.num_ranks = 2;
    s.num_stages = 2;
    s.num_microbatches = 2;
    s.stage_to_rank = {0, 1};
    s.actions = {
        {{Op::kForward, 0, 0},
         {Op::kSendForward, 0, 0},
         {Op::kRecvBackward, 1, 0},
         {Op::kBackward, 0, 0},
         {Op::kForward, 0, 1},
         {Op::kSendForward, 0, 1},
         {Op::kRecvBackward, 1, 1},
         {Op::kBackward, 0, 1}},
        {{Op::kRecvForward, 0, 0},
         {Op::kForward, 1, 0},
         {Op::kRecvForward, 0, 1},
         {Op::kForward, 1, 1},
         {Op::kBackward, 1, 0},
         {Op::kSendBackward, 1, 0},
         {Op::kBackward, 1, 1},
         {Op::kSendBackward, 1, 1}},
    };
    expect_rejected(s, "deadlock: rank 0 waits at step 2 on RB1:0", "RB1:0");
  }
  {  // a reordering that makes a rank receive a chunk's input before producing what its peer
     // needs first (interleaved): the lowered schedule deadlocks
    Schedule s = interleaved_1f1b(2, 2, 2);
    auto& l = s.actions[0];
    // Put F2:0 (chunk 1 of rank 0) before F0:0.
    for (size_t j = 0; j < l.size(); ++j) {
      if (l[j] == Action{Op::kForward, 2, 0}) {
        const Action a = l[j];
        l.erase(l.begin() + static_cast<long>(j));
        l.insert(l.begin(), a);
        break;
      }
    }
    expect_rejected(s, "deadlock: rank 0 waits at step 0 on RF1:0", "RF1:0");
  }
}

TEST(ScheduleExport, SvgAndChromeTraceCarryEveryActionWithItsDuration) {
  Costs c = Costs::uniform(2, 0.002, 0.001, 0.001);
  const Schedule s = zero_bubble_h1(2, 4);
  const auto r = simulate(s, c);
  const std::string svg = to_svg(s, r.timeline, "zbh1 test");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_TRUE(contains(svg, "</svg>"));
  EXPECT_TRUE(contains(svg, "zbh1 test"));
  EXPECT_TRUE(contains(svg, "<title>W0:3"));
  size_t rects = 0;
  for (size_t pos = 0; (pos = svg.find("<title>", pos)) != std::string::npos; ++pos) ++rects;
  EXPECT_EQ(rects, 2u * 4u * 3u);  // F, I, W per stage and microbatch
  const nlohmann::json trace = nlohmann::json::parse(to_chrome_trace(s, r.timeline));
  const nlohmann::json* f00 = nullptr;
  size_t threads = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["name"] == "F0:0") f00 = &e;
    if (e["name"] == "thread_name" && e["args"]["name"] == "rank " + std::to_string(e["tid"].get<int>())) {
      ++threads;
    }
  }
  ASSERT_NE(f00, nullptr) << trace.dump();
  EXPECT_EQ((*f00)["cat"], "F");
  EXPECT_EQ((*f00)["ph"], "X");
  EXPECT_EQ((*f00)["pid"], 0);
  EXPECT_EQ((*f00)["tid"], 0);
  EXPECT_DOUBLE_EQ((*f00)["ts"].get<double>(), 0.0);
  EXPECT_NEAR((*f00)["dur"].get<double>(), 2000.0, 1e-3);  // microseconds
  EXPECT_EQ((*f00)["args"]["stage"], 0);
  EXPECT_EQ(threads, 2u);  // one named thread per rank
  // Measured bubble of the simulated timeline equals the simulated bubble.
  const auto b = bubble_fractions(r.timeline, 2);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(b[i], r.bubble[i], 1e-12);
}

// A schedule's name is free text. Quotes, backslashes and control characters in it must leave
// the Chrome trace valid JSON (it once went through an XML escaper: '"' became &quot; and a
// backslash or a control character passed through raw) and the SVG well-formed.
TEST(ScheduleExport, ChromeTraceIsValidJsonWhateverTheScheduleIsCalled) {
  Schedule s = one_f_one_b(2, 3);
  s.name = "odd \"name\" \\ with\x01 a control <char>";
  const auto r = simulate(s, Costs::uniform(2, 0.002, 0.001, 0.001));
  const std::string text = to_chrome_trace(s, r.timeline);
  nlohmann::json trace;
  ASSERT_NO_THROW(trace = nlohmann::json::parse(text)) << text;
  EXPECT_EQ(trace["otherData"]["schedule"].get<std::string>(), s.name);
  std::multiset<std::string> names, want;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") names.insert(e["name"].get<std::string>());
  }
  for (const auto& t : r.timeline) want.insert(to_string(t.action));
  EXPECT_EQ(names, want);
  const std::string svg = to_svg(s, r.timeline);
  EXPECT_TRUE(contains(svg, "odd &quot;name&quot; \\ with? a control &lt;char&gt;")) << svg;
}

TEST(ScheduleGrid, FingerprintSeparatesSchedules) {
  EXPECT_EQ(gpipe(2, 4).fingerprint(), gpipe(2, 4).fingerprint());
  EXPECT_NE(gpipe(2, 4).fingerprint(), one_f_one_b(2, 4).fingerprint());
  EXPECT_NE(gpipe(2, 4).fingerprint(), gpipe(2, 5).fingerprint());
  const std::string g = lower(one_f_one_b(2, 2)).grid(1, 0);
  EXPECT_TRUE(contains(g, ">>RF0:0")) << g;
}

}  // namespace
}  // namespace tandem::pipeline
