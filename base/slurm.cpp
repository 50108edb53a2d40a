#include <tandem/base/errors.h>

#include "base/slurm.h"

#include <algorithm>
#include <cstddef>

namespace tandem::slurm {
namespace {

constexpr std::size_t kMaxHosts = 1'000'000;

[[noreturn]] void bad_nodelist(const std::string& list, const std::string& why) {
  throw ConfigError("Slurm node list '" + list + "': " + why +
                    "; expected Slurm's syntax such as node[01-03,07],gpu5 (check "
                    "SLURM_JOB_NODELIST, or set MASTER_ADDR yourself)");
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Splits at commas outside brackets.
std::vector<std::string> split_top_level(const std::string& list) {
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) bad_nodelist(list, "a ']' without its '['");
    if (c == ',' && depth == 0) {
      items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0) bad_nodelist(list, "a '[' without its ']'");
  items.push_back(current);
  return items;
}

// "01-03,07" -> {"01","02","03","07"}; stops after `limit` numbers (first_host needs one).
std::vector<std::string> expand_ranges(const std::string& list, const std::string& ranges,
                                       std::size_t limit) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const auto comma = ranges.find(',', start);
    const std::string part =
        ranges.substr(start, comma == std::string::npos ? comma : comma - start);
    const auto dash = part.find('-');
    const std::string lo = part.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi))
      bad_nodelist(list, "'" + part + "' is not a number range");
    const long long a = std::stoll(lo);
    const long long b = std::stoll(hi);
    if (b < a) bad_nodelist(list, "range '" + part + "' runs backwards");
    if (limit >= kMaxHosts && static_cast<unsigned long long>(b - a) + out.size() >= kMaxHosts)
      bad_nodelist(list, "more than 1000000 hosts");
    for (long long v = a; v <= b && out.size() < limit; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(digits);
    }
    if (comma == std::string::npos || out.size() >= limit) return out;
    start = comma + 1;
  }
}

void expand_item(const std::string& list, const std::string& item, std::vector<std::string>& out,
                 std::size_t limit) {
  const auto open = item.find('[');
  if (open == std::string::npos) {
    if (item.empty()) bad_nodelist(list, "an empty host name");
    out.push_back(item);
    return;
  }
  const auto close = item.find(']', open);
  if (close == std::string::npos) bad_nodelist(list, "a '[' without its ']'");
  const std::string prefix = item.substr(0, open);
  const std::string rest = item.substr(close + 1);
  const std::size_t left = limit > out.size() ? limit - out.size() : 0;
  for (const auto& number : expand_ranges(list, item.substr(open + 1, close - open - 1), left)) {
    expand_item(list, prefix + number + rest, out, limit);
    if (out.size() >= limit) return;
    if (out.size() >= kMaxHosts) bad_nodelist(list, "more than 1000000 hosts");
  }
}

std::vector<std::string> expand(const std::string& nodelist, std::size_t limit) {
  std::vector<std::string> hosts;
  if (nodelist.empty()) bad_nodelist(nodelist, "it is empty");
  for (const auto& item : split_top_level(nodelist)) {
    expand_item(nodelist, item, hosts, limit);
    if (hosts.size() >= limit) break;
  }
  return hosts;
}

}  // namespace

std::vector<std::string> expand_nodelist(const std::string& nodelist) {
  return expand(nodelist, kMaxHosts);
}

std::string first_host(const std::string& nodelist) { return expand(nodelist, 1).front(); }

int tasks_on_node(const std::string& tasks_per_node, int node_index) {
  auto fail = [&](const std::string& why) -> int {
    throw ConfigError("Slurm tasks-per-node list '" + tasks_per_node + "': " + why +
                      "; expected Slurm's syntax such as 2(x3),1 (check SLURM_TASKS_PER_NODE)");
  };
  if (node_index < 0) return fail("negative node index " + std::to_string(node_index));
  long long node = 0;
  std::size_t start = 0;
  while (start <= tasks_per_node.size()) {
    const auto comma = tasks_per_node.find(',', start);
    const std::string part =
        tasks_per_node.substr(start, comma == std::string::npos ? comma : comma - start);
    std::string count = part;
    long long repeat = 1;
    const auto paren = part.find("(x");
    if (paren != std::string::npos) {
      if (part.back() != ')') return fail("'" + part + "' lacks its ')'");
      const std::string times = part.substr(paren + 2, part.size() - paren - 3);
      if (!all_digits(times)) return fail("'" + part + "' has a bad repeat count");
      repeat = std::stoll(times);
      count = part.substr(0, paren);
    }
    if (!all_digits(count)) return fail("'" + part + "' is not a task count");
    if (node_index < node + repeat) return static_cast<int>(std::stoll(count));
    node += repeat;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return fail("it describes " + std::to_string(node) + " nodes, not node " +
              std::to_string(node_index));
}

}  // namespace tandem::slurm
