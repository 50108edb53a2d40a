// Pipeline schedules: builders, lowering and text I/O (validation is in validate.cpp).
#include <tandem/runtime/pipeline_schedule.h>

#include "base/strings.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace tandem::pipeline {

namespace {

struct OpName {
  Op op;
  const char* name;
  const char* short_name;
};
constexpr OpName kOps[] = {
    {Op::kForward, "F", "F"},
    {Op::kBackward, "B", "B"},
    {Op::kBackwardInput, "I", "I"},
    {Op::kBackwardWeight, "W", "W"},
    {Op::kSendForward, "SEND_F", "SF"},
    {Op::kRecvForward, "RECV_F", "RF"},
    {Op::kSendBackward, "SEND_B", "SB"},
    {Op::kRecvBackward, "RECV_B", "RB"},
};

void check_shape(int p, int m, const char* what) {
  if (p < 1 || m < 1) {
    throw ConfigError(std::string(what) + ": need at least 1 rank and 1 microbatch, got p=" +
                      std::to_string(p) + " m=" + std::to_string(m));
  }
}

Schedule empty_schedule(const std::string& name, int p, int stages, int m) {
  Schedule s;
  s.name = name;
  s.num_ranks = p;
  s.num_stages = stages;
  s.num_microbatches = m;
  s.stage_to_rank.resize(stages);
  for (int st = 0; st < stages; ++st) s.stage_to_rank[st] = st % p;
  s.actions.resize(p);
  return s;
}

// The comma-separated fields of a schedule line, without the blanks around them.
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields = strings::split(line, ',');
  for (auto& f : fields) f = strings::trim(f);
  return fields;
}

int parse_int(const std::string& text, int line_no) {
  const std::optional<int64_t> v = strings::parse_int(text);
  if (!v || *v < std::numeric_limits<int>::min() || *v > std::numeric_limits<int>::max()) {
    throw ScheduleError("schedule text line " + std::to_string(line_no) + ": '" + text +
                        "' is not an integer");
  }
  return static_cast<int>(*v);
}

}  // namespace

const char* to_string(Op op) {
  for (const auto& o : kOps) {
    if (o.op == op) return o.name;
  }
  return "?";
}

Op parse_op(const std::string& text) {
  for (const auto& o : kOps) {
    if (text == o.name) return o.op;
  }
  throw ScheduleError("unknown pipeline action '" + text +
                      "' (expected F, B, I, W, SEND_F, RECV_F, SEND_B or RECV_B)");
}

bool is_compute(Op op) { return static_cast<int>(op) <= static_cast<int>(Op::kBackwardWeight); }
bool is_comm(Op op) { return !is_compute(op); }

std::string to_string(const Action& a) {
  const char* name = "?";
  for (const auto& o : kOps) {
    if (o.op == a.op) name = o.short_name;
  }
  return std::string(name) + std::to_string(a.stage) + ":" + std::to_string(a.microbatch);
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < static_cast<int>(stage_to_rank.size()); ++s) {
    if (stage_to_rank[s] == rank) out.push_back(s);
  }
  return out;
}

bool Schedule::lowered() const {
  for (const auto& list : actions) {
    for (const auto& a : list) {
      if (is_comm(a.op)) return true;
    }
  }
  return false;
}

std::string Schedule::grid(int mark_rank, int mark_step) const {
  size_t steps = 0;
  for (const auto& list : actions) steps = std::max(steps, list.size());
  std::ostringstream out;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%6s", "step");
  out << buf;
  for (size_t r = 0; r < actions.size(); ++r) {
    std::snprintf(buf, sizeof(buf), " | %-10s", ("rank " + std::to_string(r)).c_str());
    out << buf;
  }
  out << "\n";
  for (size_t j = 0; j < steps; ++j) {
    std::snprintf(buf, sizeof(buf), "%6zu", j);
    out << buf;
    for (size_t r = 0; r < actions.size(); ++r) {
      std::string cell = j < actions[r].size() ? to_string(actions[r][j]) : "";
      if (static_cast<int>(r) == mark_rank && static_cast<int>(j) == mark_step) cell = ">>" + cell;
      std::snprintf(buf, sizeof(buf), " | %-10s", cell.c_str());
      out << buf;
    }
    out << "\n";
  }
  return out.str();
}

uint64_t Schedule::fingerprint() const {
  std::vector<int64_t> words = {num_ranks, num_stages, num_microbatches};
  words.insert(words.end(), stage_to_rank.begin(), stage_to_rank.end());
  for (const auto& list : actions) {
    words.push_back(static_cast<int64_t>(list.size()));
    for (const auto& a : list) {
      words.insert(words.end(), {static_cast<int64_t>(a.op), a.stage, a.microbatch});
    }
  }
  return XXH3_64bits(words.data(), words.size() * sizeof(int64_t));
}

bool Schedule::operator==(const Schedule& o) const {
  return name == o.name && num_ranks == o.num_ranks && num_stages == o.num_stages &&
         num_microbatches == o.num_microbatches && stage_to_rank == o.stage_to_rank &&
         actions == o.actions;
}

// ---- builders --------------------------------------------------------------------------------

Schedule gpipe(int p, int m) {
  check_shape(p, m, "gpipe");
  Schedule s = empty_schedule("gpipe", p, p, m);
  for (int r = 0; r < p; ++r) {
    for (int k = 0; k < m; ++k) s.actions[r].push_back({Op::kForward, r, k});
    for (int k = 0; k < m; ++k) s.actions[r].push_back({Op::kBackward, r, k});
  }
  return s;
}

Schedule one_f_one_b(int p, int m) {
  check_shape(p, m, "1f1b");
  if (m < p) {
    throw ConfigError("1F1B needs at least as many microbatches as stages: got " +
                      std::to_string(m) + " microbatches for " + std::to_string(p) +
                      " stages; use m >= " + std::to_string(p) + " or the gpipe schedule");
  }
  Schedule s = empty_schedule("1f1b", p, p, m);
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[r];
    const int warmup = std::min(p - r - 1, m);
    for (int k = 0; k < warmup; ++k) list.push_back({Op::kForward, r, k});
    for (int k = 0; k < m - warmup; ++k) {
      list.push_back({Op::kForward, r, warmup + k});
      list.push_back({Op::kBackward, r, k});
    }
    for (int k = m - warmup; k < m; ++k) list.push_back({Op::kBackward, r, k});
  }
  return s;
}

Schedule interleaved_1f1b(int p, int m, int v) {
  check_shape(p, m, "interleaved 1f1b");
  if (v < 1)
    throw ConfigError("interleaved 1f1b: v (stages per rank) must be >= 1, got " +
                      std::to_string(v));
  if (v == 1) {
    Schedule s = one_f_one_b(p, m);
    s.name = "interleaved";
    return s;
  }
  if (m < p || m % p != 0) {
    throw ConfigError(
        "interleaved 1F1B needs a multiple of the rank count as microbatches: got m=" +
        std::to_string(m) + " for p=" + std::to_string(p) +
        " ranks; use m = " + std::to_string(p * std::max(1, (m + p - 1) / p)));
  }
  Schedule s = empty_schedule("interleaved", p, p * v, m);
  const int total = m * v;
  auto fwd = [&](int r, int k) {
    const int chunk = (k % (p * v)) / p;
    const int mb = (k / (p * v)) * p + k % p;
    return Action{Op::kForward, chunk * p + r, mb};
  };
  auto bwd = [&](int r, int k) {
    const int chunk = v - 1 - (k % (p * v)) / p;
    const int mb = (k / (p * v)) * p + k % p;
    return Action{Op::kBackward, chunk * p + r, mb};
  };
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[r];
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) list.push_back(fwd(r, k));
    for (int k = 0; k < total - warmup; ++k) {
      list.push_back(fwd(r, warmup + k));
      list.push_back(bwd(r, k));
    }
    for (int k = total - warmup; k < total; ++k) list.push_back(bwd(r, k));
  }
  return s;
}

Schedule zero_bubble_h1(int p, int m) {
  check_shape(p, m, "zbh1");
  Schedule s = empty_schedule("zbh1", p, p, m);
  constexpr double kNever = std::numeric_limits<double>::infinity();
  // Unit-cost greedy list scheduling: per rank, when free, an I whose gradient has arrived, else
  // an F whose input has arrived while live activations (F done, I not) stay under 1F1B's peak
  // min(p - r, m) and at most p W passes are pending, else a W.
  std::vector<std::vector<double>> f_end(p, std::vector<double>(m, kNever));
  std::vector<std::vector<double>> i_end(p, std::vector<double>(m, kNever));
  std::vector<int> next_f(p, 0), next_i(p, 0), next_w(p, 0);
  std::vector<double> free_at(p, 0.0);
  double t = 0;
  int remaining = 3 * p * m;
  while (remaining > 0) {
    double next_event = kNever;
    for (int r = 0; r < p; ++r) {
      if (free_at[r] > t) {
        next_event = std::min(next_event, free_at[r]);
        continue;
      }
      const int cap = std::min(p - r, m);
      const int live = next_f[r] - next_i[r];
      const int held = next_i[r] - next_w[r];  // I done, W pending
      const int held_cap = p;
      auto input_ready = [&](int k) { return r == 0 ? 0.0 : f_end[r - 1][k]; };
      auto grad_ready = [&](int k) { return r == p - 1 ? f_end[r][k] : i_end[r + 1][k]; };
      Action a{};
      bool chosen = false;
      if (next_i[r] < next_f[r] && grad_ready(next_i[r]) <= t) {
        a = {Op::kBackwardInput, r, next_i[r]};
        i_end[r][next_i[r]++] = t + 1;
        chosen = true;
      } else if (next_f[r] < m && input_ready(next_f[r]) <= t && live < cap && held < held_cap) {
        a = {Op::kForward, r, next_f[r]};
        f_end[r][next_f[r]++] = t + 1;
        chosen = true;
      } else if (next_w[r] < next_i[r]) {
        a = {Op::kBackwardWeight, r, next_w[r]++};
        chosen = true;
      }
      if (chosen) {
        s.actions[r].push_back(a);
        free_at[r] = t + 1;
        --remaining;
        next_event = std::min(next_event, free_at[r]);
      } else {
        // Waits for the next arrival (a ready F blocked by the memory cap waits for this rank's
        // own W, which only a later event makes possible).
        const double gi = next_i[r] < next_f[r] ? grad_ready(next_i[r]) : kNever;
        const double fi = next_f[r] < m ? input_ready(next_f[r]) : kNever;
        if (gi > t) next_event = std::min(next_event, gi);
        if (fi > t) next_event = std::min(next_event, fi);
      }
    }
    if (next_event == kNever) throw Error("zbh1 builder: internal scheduling failure");
    t = next_event;
  }
  return s;
}

Schedule build_schedule(const std::string& name, int p, int m, int v) {
  if (name == "gpipe") return gpipe(p, m);
  if (name == "1f1b") return one_f_one_b(p, m);
  if (name == "interleaved") return interleaved_1f1b(p, m, v);
  if (name == "zbh1") return zero_bubble_h1(p, m);
  throw ConfigError("unknown pipeline schedule '" + name +
                    "' (expected gpipe, 1f1b, interleaved or zbh1)");
}

// ---- lowering -----------------------------------------------------------------------------------

Schedule lower(const Schedule& in) {
  if (in.lowered()) return in;
  Schedule out = in;
  const int S = in.num_stages;
  auto rank_of = [&](int stage) { return stage >= 0 && stage < S ? in.stage_to_rank[stage] : -1; };
  for (int r = 0; r < static_cast<int>(in.actions.size()); ++r) {
    auto& list = out.actions[r];
    list.clear();
    for (const auto& a : in.actions[r]) {
      const int s = a.stage, k = a.microbatch;
      const bool fwd = a.op == Op::kForward;
      const bool bwd = a.op == Op::kBackward || a.op == Op::kBackwardInput;
      if (fwd && s > 0 && rank_of(s - 1) != r) list.push_back({Op::kRecvForward, s - 1, k});
      if (bwd && s + 1 < S && rank_of(s + 1) != r) list.push_back({Op::kRecvBackward, s + 1, k});
      list.push_back(a);
      if (fwd && s + 1 < S && rank_of(s + 1) != r) list.push_back({Op::kSendForward, s, k});
      if (bwd && s > 0 && rank_of(s - 1) != r) list.push_back({Op::kSendBackward, s, k});
    }
  }
  return out;
}

// ---- text -----------------------------------------------------------------------------------

std::string to_text(const Schedule& s) {
  std::ostringstream out;
  out << "tandem-pipeline-schedule,1\n";
  out << "name," << s.name << "\n";
  out << "shape," << s.num_ranks << "," << s.num_stages << "," << s.num_microbatches << "\n";
  out << "stage_to_rank";
  for (int r : s.stage_to_rank) out << "," << r;
  out << "\n# rank,op,stage,microbatch\n";
  for (size_t r = 0; r < s.actions.size(); ++r) {
    for (const auto& a : s.actions[r]) {
      out << r << "," << to_string(a.op) << "," << a.stage << "," << a.microbatch << "\n";
    }
  }
  return out.str();
}

Schedule parse_schedule(const std::string& text) {
  Schedule s;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  bool header = false, shape = false;
  auto fail = [&](const std::string& what) {
    throw ScheduleError("schedule text line " + std::to_string(line_no) + ": " + what + " ('" +
                        line + "')");
  };
  while (std::getline(in, line)) {
    ++line_no;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const auto f = split_csv(line);
    if (!header) {
      if (f.size() != 2 || f[0] != "tandem-pipeline-schedule" || f[1] != "1") {
        fail("expected the header 'tandem-pipeline-schedule,1'");
      }
      header = true;
    } else if (f[0] == "name") {
      s.name = f.size() > 1 ? f[1] : "";
    } else if (f[0] == "shape") {
      if (f.size() != 4) fail("expected 'shape,<ranks>,<stages>,<microbatches>'");
      s.num_ranks = parse_int(f[1], line_no);
      s.num_stages = parse_int(f[2], line_no);
      s.num_microbatches = parse_int(f[3], line_no);
      if (s.num_ranks < 1 || s.num_ranks > 65536 || s.num_stages < 1 || s.num_stages > 65536 ||
          s.num_microbatches < 1) {
        fail("ranks, stages and microbatches must be positive (at most 65536 ranks/stages)");
      }
      s.actions.assign(s.num_ranks, {});
      shape = true;
    } else if (f[0] == "stage_to_rank") {
      s.stage_to_rank.clear();
      for (size_t i = 1; i < f.size(); ++i) s.stage_to_rank.push_back(parse_int(f[i], line_no));
    } else {
      if (!shape) fail("action before the 'shape' line");
      if (f.size() != 4) fail("expected '<rank>,<op>,<stage>,<microbatch>'");
      const int r = parse_int(f[0], line_no);
      if (r < 0 || r >= s.num_ranks)
        fail("rank out of range [0, " + std::to_string(s.num_ranks) + ")");
      Action a;
      try {
        a.op = parse_op(f[1]);
      } catch (const ScheduleError& e) {
        fail(e.what());
      }
      a.stage = parse_int(f[2], line_no);
      a.microbatch = parse_int(f[3], line_no);
      s.actions[r].push_back(a);
    }
  }
  if (!header) throw ScheduleError("schedule text: missing header 'tandem-pipeline-schedule,1'");
  if (!shape) throw ScheduleError("schedule text: missing 'shape' line");
  return s;
}

void write_schedule_file(const Schedule& schedule, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << to_text(schedule);
  out.close();
  if (!out) throw ConfigError("cannot write schedule file '" + path + "'");
}

Schedule read_schedule_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError("cannot read schedule file '" + path + "': no such file or unreadable");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_schedule(text.str());
}

}  // namespace tandem::pipeline
