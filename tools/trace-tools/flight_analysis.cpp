// `tandem-trace flight DIR` (tools/trace-tools/flight_analysis.h).
#include "tools/trace-tools/flight_analysis.h"

#include <tandem/base/errors.h>
#include <tandem/base/file_system.h>

#include "base/json.h"
#include "base/strings.h"

#include <algorithm>
#include <cstdio>
#include <set>

namespace tandem::trace {

namespace {

FlightDump parse_dump(const std::string& path) {
  try {
    const JsonValue doc = parse_json(posix_file_system()->read_file(path), JsonErrors::kPlain);
    if (doc.at("format", "format").as_string("format") != "tandem-flight-recorder") {
      throw Error("not a flight-recorder dump");
    }
    FlightDump d;
    d.rank = static_cast<int>(doc.at("rank", "rank").as_int("rank"));
    d.world_size = static_cast<int>(doc.at("world_size", "world_size").as_int("world_size"));
    d.reason = doc.at("reason", "reason").as_string("reason");
    d.dumped_at = doc.at("dumped_at", "dumped_at").as_double("dumped_at");
    for (const JsonValue& o : doc.at("ops", "ops").as_array("ops")) {
      FlightOp op;
      op.group = o.at("group", "ops[].group").as_string("ops[].group");
      op.backend = o.at("backend", "ops[].backend").as_string("ops[].backend");
      op.op = o.at("op", "ops[].op").as_string("ops[].op");
      op.detail = o.at("detail", "ops[].detail").as_string("ops[].detail");
      op.state = o.at("state", "ops[].state").as_string("ops[].state");
      op.seq = static_cast<uint64_t>(o.at("seq", "ops[].seq").as_int("ops[].seq"));
      op.p2p = o.at("p2p", "ops[].p2p").as_bool("ops[].p2p");
      op.enqueued_s = o.at("enqueued_s", "ops[].enqueued_s").as_double("ops[].enqueued_s");
      op.started_s = o.at("started_s", "ops[].started_s").as_double("ops[].started_s");
      op.ended_s = o.at("ended_s", "ops[].ended_s").as_double("ops[].ended_s");
      if (const JsonValue* e = o.find("error")) op.error = e->as_string("ops[].error");
      d.ops.push_back(std::move(op));
    }
    return d;
  } catch (const std::exception& e) {
    throw Error("tandem-trace: " + path + " is not a readable flight-recorder dump: " + e.what());
  }
}

std::string name_of(const FlightOp& op) {
  return op.op + " #" + std::to_string(op.seq) + (op.detail.empty() ? "" : " (" + op.detail + ")");
}

std::string ago(double since, double now) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f s", std::max(0.0, now - since));
  return buf;
}

// The world ranks of a group string "[0, 1, 2]".
std::vector<int> members(const std::string& group) {
  std::vector<int> out;
  std::string digits;
  for (char c : group + ",") {
    if (c >= '0' && c <= '9') {
      digits += c;
    } else if (!digits.empty()) {
      out.push_back(std::stoi(digits));
      digits.clear();
    }
  }
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

std::map<int, FlightDump> read_flight_dir(const std::string& dir) {
  std::map<int, FlightDump> dumps;
  const auto fs = posix_file_system();
  if (!fs->is_directory(dir)) throw Error("tandem-trace: " + dir + " is not a directory.");
  std::vector<std::string> files;
  for (const std::string& name : fs->list_dir(dir)) {
    if (strings::starts_with(name, "flight_rank") && strings::ends_with(name, ".json")) files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    FlightDump dump = parse_dump(join_path(dir, f));
    dumps[dump.rank] = std::move(dump);
  }
  if (dumps.empty()) {
    throw Error("tandem-trace: " + dir + " holds no flight_rank*.json; the workers dump there on a "
                "collective timeout, on SIGUSR1 and when tandemrun stops a failed group "
                "(TANDEM_FLIGHT_RECORDER_DIR).");
  }
  return dumps;
}

FlightReport analyze_flight(const std::map<int, FlightDump>& dumps) {
  FlightReport report;
  int world = 0;
  for (const auto& [rank, d] : dumps) world = std::max(world, d.world_size);
  for (int r = 0; r < world; ++r) {
    if (dumps.count(r) == 0) {
      report.missing.push_back("rank " + std::to_string(r) +
                               " wrote no dump: it died, was killed before it could, or never "
                               "started a collective");
    }
  }
  // Collectives by group, then rank, then sequence number.
  std::map<std::string, std::map<int, std::map<uint64_t, const FlightOp*>>> by_group;
  for (const auto& [rank, d] : dumps) {
    for (const FlightOp& op : d.ops) {
      if (!op.p2p) by_group[op.group][rank][op.seq] = &op;
    }
  }
  std::string first;
  uint64_t first_seq = UINT64_MAX;
  for (const auto& [group, ranks] : by_group) {
    // Behind: the members whose last issued number is below the others'.
    std::map<int, uint64_t> issued;  // rank -> numbers issued (last seq + 1)
    for (const auto& [rank, ops] : ranks) issued[rank] = ops.rbegin()->first + 1;
    uint64_t most = 0;
    for (const auto& [rank, n] : issued) most = std::max(most, n);
    std::vector<int> late;
    for (int m : members(group)) {
      if (dumps.count(m) == 0) continue;
      const auto it = issued.find(m);
      if (it == issued.end() || it->second < most) late.push_back(m);
    }
    if (!late.empty()) {
      // The collective the others issued and the late ranks never did.
      const FlightOp* next = nullptr;
      std::vector<int> waiting;
      for (const auto& [rank, ops] : ranks) {
        if (issued[rank] != most) continue;
        waiting.push_back(rank);
        for (const auto& [seq, op] : ops) {
          const bool missed_by_late = std::all_of(late.begin(), late.end(), [&](int l) {
            const auto il = issued.find(l);
            return il == issued.end() || seq >= il->second;
          });
          if (missed_by_late) {
            next = op;
            break;
          }
        }
      }
      for (int l : late) {
        const auto il = issued.find(l);
        std::string line = "rank " + std::to_string(l) + " is behind on ranks " + group + ": ";
        if (il == issued.end()) {
          line += "its dump holds no collective of this group";
        } else {
          line += "its last collective there is " + name_of(*ranks.at(l).rbegin()->second) + ", " +
                  ranks.at(l).rbegin()->second->state;
        }
        if (next != nullptr) {
          line += "; rank(s) " + join_ranks(waiting) + " went on to " + name_of(*next) + ", which rank " +
                  std::to_string(l) + " never issued";
        }
        report.behind.push_back(line);
      }
    }
    // Disagreement: the lowest number that two ranks issued as different ops.
    std::set<uint64_t> seqs;
    for (const auto& [rank, ops] : ranks) {
      for (const auto& [seq, op] : ops) seqs.insert(seq);
    }
    for (uint64_t seq : seqs) {
      if (seq >= first_seq) break;
      const FlightOp* ref = nullptr;
      int ref_rank = -1;
      for (const auto& [rank, ops] : ranks) {
        const auto it = ops.find(seq);
        if (it == ops.end()) continue;
        if (ref == nullptr) {
          ref = it->second;
          ref_rank = rank;
        } else if (it->second->op != ref->op || it->second->detail != ref->detail) {
          first_seq = seq;
          first = "collective #" + std::to_string(seq) + " on ranks " + group + ": rank " +
                  std::to_string(ref_rank) + " issued " + ref->op + " (" + ref->detail + "), rank " +
                  std::to_string(rank) + " issued " + it->second->op + " (" + it->second->detail +
                  "). Ranks must issue the same collectives, with the same sizes and dtypes, in "
                  "the same order.";
          break;
        }
      }
    }
  }
  report.first_disagreement = first;
  // Waiting: each rank's oldest op not completed.
  for (const auto& [rank, d] : dumps) {
    const FlightOp* oldest = nullptr;
    for (const FlightOp& op : d.ops) {
      if (!op.done()) {
        oldest = &op;
        break;
      }
    }
    std::string line = "rank " + std::to_string(rank) + " (dumped on " + d.reason + "): ";
    if (oldest == nullptr) {
      line += d.ops.empty() ? "no op recorded" : "idle: its last op, " + name_of(d.ops.back()) + ", completed";
    } else {
      line += (oldest->state == "failed" ? "failed in " : "waiting in ") + name_of(*oldest) + " on ranks " +
              oldest->group + " (" + (oldest->started_s > 0 ? "started " : "enqueued ") +
              ago(oldest->started_s > 0 ? oldest->started_s : oldest->enqueued_s, d.dumped_at) +
              " before the dump)";
    }
    report.waiting.push_back(line);
  }
  return report;
}

std::string format_flight_report(const FlightReport& r) {
  std::string out;
  for (const auto& m : r.missing) out += m + "\n";
  if (r.behind.empty()) {
    out += "no rank is behind: every rank issued the same number of collectives in each group\n";
  }
  for (const auto& b : r.behind) out += b + "\n";
  out += r.first_disagreement.empty()
             ? "the ranks agree on every collective both dumps hold (op, size and dtype)\n"
             : "first disagreement: " + r.first_disagreement + "\n";
  out += "what each rank was doing:\n";
  for (const auto& w : r.waiting) out += "  " + w + "\n";
  return out;
}

}  // namespace tandem::trace
