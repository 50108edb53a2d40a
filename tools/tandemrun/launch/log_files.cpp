#include "tools/tandemrun/launch/log_files.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <tandem/base/errors.h>

#include "base/strings.h"

namespace tandem::launcher {
namespace {

// A non-negative decimal integer without a sign (torchrun's syntax has none); nullopt otherwise.
std::optional<int> parse_index(const std::string& text) {
  if (text.empty() || text.size() > 7 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return static_cast<int>(*strings::parse_int(text));
}

using strings::split;

}  // namespace

int StdSpec::for_local_rank(int local_rank) const {
  if (all) return *all;
  const auto it = ranks.find(local_rank);
  return it == ranks.end() ? kStdNone : it->second;
}

bool StdSpec::any() const {
  if (all) return *all != kStdNone;
  return std::any_of(ranks.begin(), ranks.end(), [](const auto& r) { return r.second != 0; });
}

StdSpec parse_std_spec(const std::string& text, const std::string& option) {
  auto fail = [&] {
    throw ConfigError(option + " '" + text +
                      "' is not a stream choice: use 0 (none), 1 (stdout), 2 (stderr), 3 (both) "
                      "for every local rank, or LOCAL_RANK:VALUE pairs such as 0:3,1:2");
  };
  auto parse_value = [&](const std::string& v) {
    const auto value = parse_index(v);
    if (!value || *value > kStdAll) fail();
    return *value;
  };
  StdSpec spec;
  if (text.find(':') == std::string::npos) {
    spec.all = parse_value(text);
    return spec;
  }
  for (const auto& pair : split(text, ',')) {
    const auto parts = split(pair, ':');
    if (parts.size() != 2) fail();
    const auto rank = parse_index(parts[0]);
    if (!rank) fail();
    if (!spec.ranks.emplace(*rank, parse_value(parts[1])).second) {
      throw ConfigError(option + " '" + text + "' names local rank " + parts[0] +
                        " twice; give each local rank once");
    }
  }
  return spec;
}

std::vector<int> parse_ranks_filter(const std::string& text, int nproc_per_node) {
  std::vector<int> ranks;
  if (text.empty()) return ranks;
  for (const auto& part : split(text, ',')) {
    const auto rank = parse_index(part);
    if (!rank) {
      throw ConfigError("--local-ranks-filter '" + text +
                        "' must be a comma-separated list of local ranks, e.g. 0,1");
    }
    if (*rank >= nproc_per_node) {
      throw ConfigError("--local-ranks-filter names local rank " + part + " but only " +
                        std::to_string(nproc_per_node) +
                        " workers run per node (--nproc-per-node); use ranks 0.." +
                        std::to_string(nproc_per_node - 1));
    }
    if (std::find(ranks.begin(), ranks.end(), *rank) == ranks.end()) ranks.push_back(*rank);
  }
  return ranks;
}

WorkerRoutes route_worker(const StdSpec& redirects, const StdSpec& tee,
                          const std::vector<int>& ranks_filter, int local_rank,
                          const std::string& rank_dir) {
  const int redirect = redirects.for_local_rank(local_rank);
  const int teed = tee.for_local_rank(local_rank);
  const bool shown = ranks_filter.empty() || std::find(ranks_filter.begin(), ranks_filter.end(),
                                                       local_rank) != ranks_filter.end();
  auto route = [&](int flag, const char* name) {
    StreamRoute r;
    const bool to_file = ((redirect | teed) & flag) != 0;
    if (to_file) r.file = rank_dir + "/" + name;
    // A redirected stream leaves the console unless it is also tee'd (torchrun adds tee to
    // redirects); the filter hides a rank's console output, never its files.
    r.console = shown && (!(redirect & flag) || (teed & flag));
    return r;
  };
  return WorkerRoutes{route(kStdOut, "stdout.log"), route(kStdErr, "stderr.log")};
}

// A filesystem call on a log directory, or an Error that says what to do.
void on_log_dir(bool create, const std::string& path) {
  std::error_code error;
  if (create) {
    std::filesystem::create_directories(path, error);
  } else {
    std::filesystem::remove_all(path, error);
  }
  if (error) {
    throw Error("cannot " + std::string(create ? "create" : "empty") + " the log directory " +
                path + ": " + error.message() +
                (create ? "; choose a writable --log-dir"
                        : "; remove it by hand or choose another --log-dir"));
  }
}

void make_directories(const std::string& path) { on_log_dir(true, path); }
void remove_tree(const std::string& path) { on_log_dir(false, path); }

RunLogDir::RunLogDir(const std::string& base, const std::string& run_id) {
  std::string parent = base;
  std::string name = run_id + "_XXXXXX";
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    name = "tandemrun_" + name;
  }
  make_directories(parent);
  std::string path = parent + "/" + name;
  if (::mkdtemp(path.data()) == nullptr) {
    throw Error("cannot create the run's log directory " + path + ": " + std::strerror(errno) +
                "; choose a writable --log-dir");
  }
  path_ = path;
}

std::string RunLogDir::rank_dir(int restart_count, int local_rank) const {
  return path_ + "/attempt_" + std::to_string(restart_count) + "/" + std::to_string(local_rank);
}

std::string RunLogDir::prepare_attempt(int restart_count, int nproc_per_node) const {
  const std::string attempt = path_ + "/attempt_" + std::to_string(restart_count);
  remove_tree(attempt);
  for (int local_rank = 0; local_rank < nproc_per_node; ++local_rank)
    make_directories(rank_dir(restart_count, local_rank));
  return attempt;
}

}  // namespace tandem::launcher
