// tandem-tune's logic: grid, trial command lines, throughput from metrics files, table, best YAML.
#include "tools/tandem-tune/tune_plan.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/config.h>

#include <yaml-cpp/yaml.h>

#include "base/json.h"
#include "base/strings.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <iomanip>
#include <sstream>

namespace tandem::tune {
namespace {

std::string trial_label(const Trial& trial) {
  std::string label;
  for (const auto& [key, value] : trial) label += (label.empty() ? "" : " ") + key + "=" + value;
  return label;
}

}  // namespace

Axis parse_axis(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--grid '" + text + "' is not key=v1,v2,... (e.g. --grid ddp.bucket_cap_mb=1,5,25)");
  if (eq + 1 == text.size())
    throw ConfigError("--grid '" + text + "' has no values (e.g. --grid ddp.bucket_cap_mb=1,5,25)");
  Axis axis{text.substr(0, eq), strings::split(text.substr(eq + 1), ',')};
  std::set<std::string> seen;
  for (const auto& v : axis.values) {
    if (v.empty())
      throw ConfigError("--grid '" + text + "' has an empty value; separate values by single commas");
    if (!seen.insert(v).second)
      throw ConfigError("--grid '" + text + "' lists the value '" + v + "' twice");
  }
  return axis;
}

std::vector<Trial> expand(const std::vector<Axis>& axes) {
  std::set<std::string> keys;
  for (const auto& a : axes) {
    if (!keys.insert(a.key).second)
      throw ConfigError("--grid names '" + a.key + "' twice; give all its values in one --grid");
  }
  std::vector<Trial> trials{Trial{}};
  for (const auto& axis : axes) {
    std::vector<Trial> next;
    for (const auto& t : trials) {
      for (const auto& v : axis.values) {
        Trial longer = t;
        longer.emplace_back(axis.key, v);
        next.push_back(std::move(longer));
      }
    }
    trials = std::move(next);
  }
  return trials;
}

void validate(const std::vector<Trial>& trials) {
  for (const auto& trial : trials) {
    ConfigInputs inputs;
    for (const auto& [key, value] : trial) inputs.sets.push_back(key + "=" + value);
    load_config(inputs);  // throws InvalidConfigError naming the --set, key and fix
  }
}

std::vector<std::string> trial_command(const std::vector<std::string>& command, const Trial& trial,
                                       int64_t steps, int64_t log_every,
                                       const std::string& metrics_file) {
  std::vector<std::string> argv = command;
  auto set = [&argv](const std::string& key, const std::string& value) {
    argv.push_back("--set");
    argv.push_back(key + "=" + value);
  };
  for (const auto& [key, value] : trial) set(key, value);
  set("train.steps", std::to_string(steps));
  set("metrics.log_every", std::to_string(log_every));
  set("metrics.file", metrics_file);
  return argv;
}

std::optional<double> throughput(const std::string& metrics_file, int warmup_records) {
  std::ifstream in(metrics_file);
  if (!in) return std::nullopt;
  std::vector<double> rates;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    auto refuse = [&](const std::string& why) {
      return ConfigError("metrics file " + metrics_file + " line " + std::to_string(number) +
                         " is not a tandem::ProgressLogger record (" + why +
                         "); does the program write metrics.file with ProgressLogger?");
    };
    JsonValue record;
    try {
      record = parse_json(line, JsonErrors::kPlain);
    } catch (const JsonError& e) {
      throw refuse(e.what());
    }
    const JsonValue* rate = record.find("samples_per_s");
    if (rate == nullptr || !rate->is_number()) throw refuse("no number samples_per_s");
    rates.push_back(rate->as_double("samples_per_s"));
  }
  if (static_cast<int>(rates.size()) <= warmup_records) return std::nullopt;
  rates.erase(rates.begin(), rates.begin() + warmup_records);
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  return n % 2 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
}

std::optional<size_t> best(const std::vector<TrialResult>& results) {
  std::optional<size_t> index;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].samples_per_s) continue;
    if (!index || *results[i].samples_per_s > *results[*index].samples_per_s) index = i;
  }
  return index;
}

std::string format_table(const std::vector<TrialResult>& results) {
  const auto top = best(results);
  std::vector<std::string> labels;
  size_t width = 5;
  for (const auto& r : results) {
    labels.push_back(trial_label(r.trial));
    width = std::max(width, labels.back().size());
  }
  std::ostringstream out;
  char row[64];
  std::snprintf(row, sizeof row, "  %14s  %8s  ", "samples/s", "vs best");
  out << "trial  " << std::string("grid values").append(width > 11 ? width - 11 : 0, ' ') << row
      << "status\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (r.samples_per_s && top) {
      std::snprintf(row, sizeof row, "  %14.1f  %8.3f  ", *r.samples_per_s,
                    *r.samples_per_s / *results[*top].samples_per_s);
    } else {
      std::snprintf(row, sizeof row, "  %14s  %8s  ", "-", "-");
    }
    char index[32];
    std::snprintf(index, sizeof index, "%5zu  ", i + 1);
    out << index << labels[i] << std::string(width - labels[i].size(), ' ') << row << r.status
        << (top && *top == i ? "  <- best" : "") << "\n";
  }
  return out.str();
}

std::string best_config_yaml(const TrialResult& best, const std::string& comment) {
  // Dotted keys nest: "a.b.c=v" is c: v under b: under a:, sections shared, in grid order.
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& [key, value] : best.trial) {
    const auto parts = strings::split(key, '.');
    std::vector<YAML::Node> path{root};
    for (size_t d = 0; d + 1 < parts.size(); ++d) path.push_back(path.back()[parts[d]]);
    path.back()[parts.back()] = value;
  }
  YAML::Emitter yaml;
  yaml << root;
  std::string out;
  if (!comment.empty()) {
    for (const auto& line : strings::split(comment, '\n')) out += "# " + line + "\n";
  }
  return out + yaml.c_str() + "\n";
}

std::vector<std::string> scale_command(const std::vector<std::string>& command, int ranks) {
  std::vector<std::string> out = command;
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string& a = out[i];
    for (const std::string flag : {"--nproc-per-node", "--nproc_per_node"}) {
      if (a == flag && i + 1 < out.size()) {
        out[i + 1] = std::to_string(ranks);
        return out;
      }
      if (a.rfind(flag + "=", 0) == 0) {
        out[i] = flag + "=" + std::to_string(ranks);
        return out;
      }
    }
  }
  throw ConfigError("--scale: the command has no --nproc-per-node N to vary; give a tandemrun "
                    "command (e.g. -- tandemrun --standalone --nproc-per-node 1 build/bin/train_lm)");
}

std::string format_scaling_table(const std::vector<ScalePoint>& points) {
  std::optional<double> base;
  int base_ranks = 0;
  for (const auto& p : points) {
    if (p.samples_per_s) {
      base = p.samples_per_s;
      base_ranks = p.ranks;
      break;
    }
  }
  std::ostringstream out;
  out << std::left << std::setw(7) << "ranks" << std::right << std::setw(13) << "samples/s"
      << std::setw(11) << "per rank" << std::setw(9) << "speedup" << std::setw(12) << "efficiency"
      << "\n";
  for (const auto& p : points) {
    out << std::left << std::setw(7) << p.ranks << std::right;
    if (!p.samples_per_s) {
      out << "  failed: " << p.status << "\n";
      continue;
    }
    const double rate = *p.samples_per_s;
    const double speedup = rate / *base;
    const double ideal = static_cast<double>(p.ranks) / base_ranks;
    out << std::setw(13) << std::fixed << std::setprecision(1) << rate << std::setw(11) << rate / p.ranks
        << std::setw(8) << std::setprecision(2) << speedup << "x" << std::setw(11) << std::setprecision(1)
        << 100.0 * speedup / ideal << "%\n";
  }
  if (base && base_ranks != 1) out << "(speedup and efficiency relative to " << base_ranks << " ranks)\n";
  return out.str();
}

}  // namespace tandem::tune
