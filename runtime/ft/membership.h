// Internal to runtime/ft: who is in an epoch of step-level fault tolerance, as the store's keys
// spell it (fault_tolerant_world.cpp). A member is a launch rank and an incarnation ("2.1":
// launch rank 2's first replacement); an epoch's membership key holds
// "members;requests;receivers;step". Plain values; parse_* expect what text() wrote (the keys
// are written by tandem only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace tandem::detail {

// A member: its launch rank and incarnation ("2.1": launch rank 2's first replacement).
struct MemberId {
  int rank = 0;
  int incarnation = 0;
  std::string text() const { return std::to_string(rank) + "." + std::to_string(incarnation); }
  bool operator==(const MemberId& o) const { return rank == o.rank && incarnation == o.incarnation; }
};

inline MemberId parse_id(const std::string& text) {
  const auto dot = text.find('.');
  return {std::stoi(text.substr(0, dot)), std::stoi(text.substr(dot + 1))};
}

inline std::string join_ids(const std::vector<MemberId>& ids) {
  std::string s;
  for (const MemberId& m : ids) s += (s.empty() ? "" : ",") + m.text();
  return s;
}

inline std::vector<MemberId> parse_ids(const std::string& text) {
  std::vector<MemberId> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) ids.push_back(parse_id(item));
  return ids;
}

inline bool contains(const std::vector<MemberId>& ids, const MemberId& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// The membership of one epoch, as its key holds it: "members;requests;receivers;step". requests:
// the join requests decided on so far; receivers: the members that need the training state (they
// joined, and no step has committed since); step: the step the epoch starts at.
struct Membership {
  std::vector<MemberId> members;
  int64_t requests = 0;
  std::vector<MemberId> receivers;
  int64_t step = 0;

  std::string text() const {
    return join_ids(members) + ";" + std::to_string(requests) + ";" + join_ids(receivers) + ";" +
           std::to_string(step);
  }
  static Membership parse(const std::string& text) {
    std::vector<std::string> parts;
    std::stringstream in(text);
    std::string part;
    while (std::getline(in, part, ';')) parts.push_back(part);
    parts.resize(4);
    return {parse_ids(parts[0]), std::stoll(parts[1]), parse_ids(parts[2]), std::stoll(parts[3])};
  }
};

}  // namespace tandem::detail
