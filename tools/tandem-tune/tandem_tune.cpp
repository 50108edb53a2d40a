// tandem-tune: short trials over a grid of config values; a throughput table and the best config.
//
//   tandem-tune --grid ddp.bucket_cap_mb=1,5,25 --grid compression.codec=average,fp16
//       --steps 40 -- tandemrun --standalone --nproc-per-node 2 build/bin/train_lm
//
//   tandem-tune --scale 4 --steps 60 -- tandemrun --standalone --nproc-per-node 1 build/bin/train_lm
//
// --scale N runs the same command at 1, 2, ..., N ranks (its --nproc-per-node replaced) and prints
// the throughput and the scaling efficiency (T1/TN)/N of each. Otherwise each trial runs the
// command after "--" with --set KEY=VALUE for its grid point, plus
// --set train.steps, metrics.file and metrics.log_every; its throughput is the median samples/s of
// the progress records after the warm-up. The program must read tandem's config (tandem::Context)
// and log with tandem::ProgressLogger. See docs/tuning.md.
//
// Exit status: 0 at least one trial succeeded (table printed, best config written); 1 every trial
// failed; 2 bad arguments or grid values (nothing run).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <tandem/base/errors.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "tools/tandem-tune/tune_plan.h"

extern char** environ;

namespace {

using tandem::tune::TrialResult;

// Runs argv with stdout and stderr into `log`, in a process group of its own; kills the group
// (SIGTERM, then SIGKILL after 10 s) past `timeout_s`. Returns a status text: "ok" or why not.
std::string run_trial(const std::vector<std::string>& argv, const std::string& log,
                      double timeout_s) {
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &files, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return std::string("cannot start '") + argv[0] + "': " + std::strerror(rc);

  const auto start = std::chrono::steady_clock::now();
  bool terminated = false;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return std::string("waitpid failed: ") + std::strerror(errno);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!terminated && elapsed > timeout_s) {
      ::killpg(pid, SIGTERM);
      terminated = true;
    } else if (terminated && elapsed > timeout_s + 10) {
      ::killpg(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (terminated) return "timed out after " + std::to_string(static_cast<int>(timeout_s)) + " s";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "ok";
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  return std::string("killed by signal ") + std::to_string(WTERMSIG(status));
}

// Runs one trial (its files are `name`.jsonl and `name`.log) and reads its throughput past
// its first `warmup` progress records; `status` becomes "ok" or why there is no figure.
std::optional<double> measure_trial(const std::vector<std::string>& args, const std::string& name,
                                    double timeout_s, int warmup, std::string& status) {
  status = run_trial(args, name + ".log", timeout_s);
  if (status != "ok") {
    status += " (see " + name + ".log)";
    return std::nullopt;
  }
  const std::optional<double> rate = tandem::tune::throughput(name + ".jsonl", warmup);
  if (!rate) status = "no progress records in " + name + ".jsonl";
  return rate;
}

// Median of a trial's rounds (not empty).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The command at 1..max_ranks ranks: median throughput over `repeats` rounds each, and the table.
int scale_main(const std::vector<std::string>& command, int max_ranks, int64_t steps, int64_t log_every,
               int warmup, int repeats, double timeout_s, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<tandem::tune::ScalePoint> points;
  for (int n = 1; n <= max_ranks; ++n) points.push_back({n, std::nullopt, "ok"});
  std::vector<std::vector<double>> rates(points.size());
  const tandem::tune::Trial none;
  for (int round = 1; round <= repeats; ++round) {
    for (size_t i = 0; i < points.size(); ++i) {
      auto& p = points[i];
      if (p.status != "ok") continue;
      const std::string name = dir + "/ranks_" + std::to_string(p.ranks) +
                               (repeats > 1 ? "_round_" + std::to_string(round) : "");
      std::filesystem::remove(name + ".jsonl");
      const auto args = tandem::tune::trial_command(tandem::tune::scale_command(command, p.ranks), none, steps,
                                                    log_every, name + ".jsonl");
      std::cout << p.ranks << " rank(s)" << (repeats > 1 ? " round " + std::to_string(round) : "") << ":" << std::flush;
      const std::optional<double> rate = measure_trial(args, name, timeout_s, warmup, p.status);
      if (rate) rates[i].push_back(*rate);
      std::cout << (rate ? "  " + std::to_string(static_cast<int64_t>(*rate)) + " samples/s" : "  failed: " + p.status)
                << "\n";
    }
  }
  for (size_t i = 0; i < points.size(); ++i) {
    if (!rates[i].empty()) points[i].samples_per_s = median(rates[i]);
  }
  std::cout << "\n" << tandem::tune::format_scaling_table(points);
  const bool any = std::any_of(points.begin(), points.end(), [](const auto& p) { return p.samples_per_s.has_value(); });
  return any ? 0 : 1;
}

int tune_main(int argc, char** argv) {
  // Everything after "--" is the command, verbatim.
  std::vector<std::string> command;
  int own = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      own = i;
      command.assign(argv + i + 1, argv + argc);
      break;
    }
  }
  CLI::App app("tandem-tune: short trials over a grid of config values, or a scaling run (docs/tuning.md)\n"
               "usage: tandem-tune --grid KEY=V1,V2 [--grid ...] [options] -- COMMAND [ARGS...]\n"
               "       tandem-tune --scale N [options] -- tandemrun ... --nproc-per-node 1 PROGRAM [ARGS...]");
  std::vector<std::string> grid;
  int64_t steps = 40, log_every = 10;
  int warmup = 1, repeats = 1;
  double timeout_s = 600;
  std::string dir = "tune_trials", out = "tune_best.yaml";
  int scale = 0;
  auto* grid_option = app.add_option("--grid", grid, "KEY=V1,V2,... (repeatable; every combination is tried)");
  app.add_option("--scale", scale, "instead of a grid: the command at 1, 2, ..., N ranks (its "
                                   "--nproc-per-node replaced): throughput and scaling efficiency")
      ->check(CLI::Range(1, 4096))
      ->excludes(grid_option);
  app.add_option("--steps", steps, "training steps per trial (train.steps)")
      ->check(CLI::PositiveNumber);
  app.add_option("--log-every", log_every, "steps per progress record (metrics.log_every)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup-records", warmup, "progress records ignored at the start of a trial")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", repeats, "rounds over the whole grid (median per trial)")
      ->check(CLI::PositiveNumber);
  app.add_option("--trial-timeout", timeout_s, "seconds before a trial is stopped")
      ->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "where each trial's log and metrics go");
  app.add_option("--out", out, "where the best config (YAML) is written");
  try {
    app.parse(own, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (command.empty())
      throw tandem::ConfigError("no command: put the training command after '--' (e.g. -- "
                                "tandemrun --standalone --nproc-per-node 2 build/bin/train_lm)");
    if (steps / log_every <= warmup)
      throw tandem::ConfigError("--steps " + std::to_string(steps) + " with --log-every " +
                                std::to_string(log_every) + " gives no record after " +
                                std::to_string(warmup) + " warm-up record(s); raise --steps");
    if (scale > 0) return scale_main(command, scale, steps, log_every, warmup, repeats, timeout_s, dir);
    if (grid.empty()) throw tandem::ConfigError("give --grid KEY=V1,V2 (or --scale N)");
    std::vector<tandem::tune::Axis> axes;
    for (const auto& g : grid) axes.push_back(tandem::tune::parse_axis(g));
    const auto trials = tandem::tune::expand(axes);
    tandem::tune::validate(trials);
    std::filesystem::create_directories(dir);

    // With --repeats, the whole grid runs again (a round), so slow drift on a shared machine
    // does not favour the trials that ran first; a trial's figure is its median over rounds.
    std::vector<TrialResult> results;
    std::vector<std::vector<double>> rates(trials.size());
    for (const auto& t : trials) results.push_back({t, std::nullopt, "ok"});
    for (int round = 1; round <= repeats; ++round) {
      for (size_t i = 0; i < trials.size(); ++i) {
        TrialResult& r = results[i];
        if (r.status != "ok") continue;  // failed in an earlier round
        const std::string name = dir + "/trial_" + std::to_string(i + 1) +
                                 (repeats > 1 ? "_round_" + std::to_string(round) : "");
        std::filesystem::remove(name + ".jsonl");
        const auto args =
            tandem::tune::trial_command(command, trials[i], steps, log_every, name + ".jsonl");
        std::cout << "trial " << i + 1 << "/" << trials.size();
        if (repeats > 1) std::cout << " round " << round << "/" << repeats;
        std::cout << ":";
        for (const auto& [key, value] : trials[i]) std::cout << " " << key << "=" << value;
        std::cout << std::flush;
        const std::optional<double> rate = measure_trial(args, name, timeout_s, warmup, r.status);
        if (rate) {
          rates[i].push_back(*rate);
          std::cout << "  " << static_cast<int64_t>(*rate) << " samples/s\n";
        } else {
          std::cout << "  failed: " << r.status << "\n";
        }
      }
    }
    for (size_t i = 0; i < trials.size(); ++i) {
      if (results[i].status == "ok") results[i].samples_per_s = median(rates[i]);
    }
    std::cout << "\n" << tandem::tune::format_table(results);
    const auto top = tandem::tune::best(results);
    if (!top) {
      std::cerr << "tandem-tune: every trial failed; see the logs in " << dir << "/\n";
      return 1;
    }
    std::string comment = "tandem-tune: best of " + std::to_string(trials.size()) + " trials (median " +
                          std::to_string(static_cast<int64_t>(*results[*top].samples_per_s)) +
                          " samples/s, " + std::to_string(steps) + " steps, " + std::to_string(repeats) +
                          " round(s))\ncommand:";
    for (const auto& c : command) comment += " " + c;
    comment += "\nuse it as one more --config after your own";
    std::ofstream(out) << tandem::tune::best_config_yaml(results[*top], comment);
    std::cout << "best config written to " << out << "\n";
    return 0;
  } catch (const tandem::ConfigError& e) {
    std::cerr << "tandem-tune: error: " << e.what() << "\n";
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "tandem-tune: error: " << e.what() << "; check --dir and --out\n";
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) { return tune_main(argc, argv); }
