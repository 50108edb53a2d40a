// Worker log files and console routing: torchrun's --log-dir, --redirects, --tee and
// --local-ranks-filter.
//
// Contract (torchrun's semantics, torch 1.13 + 2.x): per local rank and stream, "redirect" sends
// the stream to <attempt dir>/<local_rank>/{stdout,stderr}.log only, "tee" to the file and the
// console; ranks outside --local-ranks-filter never reach the console (their files are still
// written). Layout: <log_dir>/<run_id>_<random>/attempt_<restart>/<local_rank>/{stdout.log,
// stderr.log,error.json}, like torchrun's agent (the random suffix keeps runs that reuse a run id
// apart). Files hold the worker's bytes unchanged; the console copy carries "[rank R]: ".
//
// Errors: parse_std_spec()/parse_ranks_filter() throw tandem::ConfigError naming the option and
// the value; directory creation throws tandem::Error naming the path and errno text.
// Thread-safety: plain values and free functions; RunLogDir is used by one thread.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::launcher {

// Which standard streams: torchrun's Std flags (0 none, 1 stdout, 2 stderr, 3 both).
enum StdStreams : int { kStdNone = 0, kStdOut = 1, kStdErr = 2, kStdAll = 3 };

// A --redirects / --tee value: one flag for all local ranks ("3") or a per-rank map ("0:1,1:2";
// ranks not named get 0), exactly torchrun's Std.from_str() syntax.
struct StdSpec {
  std::optional<int> all;    // set for the single-value form
  std::map<int, int> ranks;  // the map form
  int for_local_rank(int local_rank) const;
  bool any() const;  // true when some rank gets a file
};
StdSpec parse_std_spec(const std::string& text, const std::string& option);

// --local-ranks-filter "0,2": local ranks whose output is shown on the console. Empty text: all.
// Each rank must be in [0, nproc_per_node).
std::vector<int> parse_ranks_filter(const std::string& text, int nproc_per_node);

// Where one worker stream goes.
struct StreamRoute {
  bool console = true;
  std::string file;  // empty: no log file
};

struct WorkerRoutes {
  StreamRoute out;
  StreamRoute err;
};

// The console/file routing of one local rank. `rank_dir` is that rank's directory of this
// attempt (unused when neither stream is redirected or tee'd).
WorkerRoutes route_worker(const StdSpec& redirects, const StdSpec& tee,
                          const std::vector<int>& ranks_filter, int local_rank,
                          const std::string& rank_dir);

// The per-run log directory: <base>/<run_id>_XXXXXX, created on construction. `base` is created
// when missing; an empty `base` means a fresh $TMPDIR/tandemrun_XXXXXX (torchrun uses a temp dir
// too). Never removed by tandemrun: the logs are for the user.
class RunLogDir {
 public:
  RunLogDir(const std::string& base, const std::string& run_id);
  const std::string& path() const { return path_; }
  // Empties and creates attempt_<restart_count>/<local_rank>/ for ranks 0..nproc-1; returns the
  // attempt directory.
  std::string prepare_attempt(int restart_count, int nproc_per_node) const;
  // <path>/attempt_<restart_count>/<local_rank>
  std::string rank_dir(int restart_count, int local_rank) const;

 private:
  std::string path_;
};

// mkdir -p; throws tandem::Error naming the path.
void make_directories(const std::string& path);
// rm -rf of `path` (no error when missing); throws tandem::Error when something stays.
void remove_tree(const std::string& path);

}  // namespace tandem::launcher
