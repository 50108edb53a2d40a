#include "tools/tandemrun/launch/launcher_options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>

#include <tandem/base/errors.h>

#include "base/strings.h"
#include "tools/tandemrun/launch/cluster_env.h"
#include "tools/tandemrun/launch/free_port.h"
#include "tools/tandemrun/launch/log_files.h"
#include "tools/tandemrun/launch/standby_pool.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif

namespace tandem::launcher {
namespace {

constexpr const char* kDescription =
    "tandemrun: start a tandem (or any torchrun-style) program as N local worker processes.\n"
    "Each worker gets the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
    "GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), its "
    "output\n"
    "lines are prefixed with \"[rank R]: \", and when one worker fails the others are stopped\n"
    "(and, with --max-restarts, all are started again).";

constexpr const char* kFooter =
    "Everything from PROGRAM on is passed to the program unchanged (use -- before PROGRAM if its\n"
    "name starts with '-'). Options also read torchrun's PET_<NAME> environment variables.\n"
    "OMP_NUM_THREADS is set to 1 for every worker when it is unset and --nproc-per-node > 1.\n"
    "Multi-node (--nnodes MAX > 1): every node needs the same job token, from TANDEM_JOB_TOKEN\n"
    "or --rdzv-token-file; agents of another job are turned away.\n"
    "\n"
    "Exit status: 0 all workers exited 0 (possibly after restarts); 1 a worker failed and no\n"
    "restart was left (a summary names the root cause); 2 bad command line;\n"
    "128+N tandemrun was stopped by signal N (forwarded to the workers first).\n"
    "See docs/launcher.md.";

// Shows PROGRAM [ARGS...] in the usage line; CLI11 knows nothing about the prefix-command part.
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string usage = CLI::Formatter::make_usage(app, std::move(name));
    const auto newline = usage.rfind('\n');
    if (newline != std::string::npos) usage.insert(newline, " PROGRAM [ARGS...]");
    return usage;
  }
};

// --nnodes takes torchrun's "N" or "MIN:MAX" (multi-node when MAX > 1: docs/launcher.md).
void parse_nnodes(const std::string& text, LauncherOptions& o) {
  const auto colon = text.find(':');
  auto parse_count = [&](const std::string& part) {
    const auto v = strings::parse_int(part);
    if (!v || *v < 1 || *v > 1'000'000)
      throw ConfigError("--nnodes must be a positive integer or MIN:MAX (got '" + text + "')");
    return static_cast<int>(*v);
  };
  o.min_nodes = parse_count(text.substr(0, colon));
  o.max_nodes = colon == std::string::npos ? o.min_nodes : parse_count(text.substr(colon + 1));
  if (o.min_nodes > o.max_nodes) {
    throw ConfigError("--nnodes " + text + ": MIN is larger than MAX; write MIN:MAX, e.g. 1:" +
                      std::to_string(o.min_nodes));
  }
  o.nnodes = o.multi_node() ? o.min_nodes : 1;
}

// The multi-node options (docs/launcher.md "Multi-node").
void validate_multi_node(const LauncherOptions& o) {
  auto seconds = [](const char* name, double v, double low, double high) {
    if (!std::isfinite(v) || v < low || v > high) {
      std::ostringstream text;
      text << name << " must be between " << low << " and " << high << " seconds (got " << v
           << ")";
      throw ConfigError(text.str());
    }
  };
  seconds("--rdzv-last-call-s", o.rdzv_last_call_s, 0, 86400);
  seconds("--rdzv-join-timeout-s", o.rdzv_join_timeout_s, 1, 86400);
  seconds("--rdzv-node-timeout-s", o.rdzv_node_timeout_s, 0.5, 3600);
  if (o.rdzv_backend != "c10d" && o.rdzv_backend != "static") {
    throw ConfigError("--rdzv-backend " + o.rdzv_backend +
                      " is not supported; tandemrun's rendezvous is c10d (a TCPStore)");
  }
  if (o.rdzv_id.empty()) throw ConfigError("--rdzv-id must not be empty");
  for (const char c : o.rdzv_id) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '-' && c != '_' && c != '.') {
      throw ConfigError("--rdzv-id '" + o.rdzv_id +
                        "' may contain only letters, digits, '-', '_' and '.'");
    }
  }
  if (!o.multi_node()) return;
  if (o.standalone) {
    throw ConfigError("--standalone is a single-node option; drop it for --nnodes " +
                      std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes));
  }
  if (o.node_rank < 0 || o.node_rank >= o.max_nodes) {
    throw ConfigError("--node-rank must be in 0.." + std::to_string(o.max_nodes - 1) + " (got " +
                      std::to_string(o.node_rank) + ")");
  }
}

void validate(const LauncherOptions& o, bool port_given) {
  if (o.nproc_per_node < 1) {
    throw ConfigError("--nproc-per-node must be at least 1 (got " +
                      std::to_string(o.nproc_per_node) + ")");
  }
  if (o.nproc_per_node > 4096) {
    throw ConfigError("--nproc-per-node " + std::to_string(o.nproc_per_node) +
                      " is more workers than one node can run; use at most 4096");
  }
  if (!o.multi_node() && o.node_rank != 0) {
    throw ConfigError("--node-rank must be 0 for a single-node run (got " +
                      std::to_string(o.node_rank) + ")");
  }
  validate_multi_node(o);
  if (o.master_port < 1 || o.master_port > 65535) {
    throw ConfigError("--master-port must be in 1..65535 (got " + std::to_string(o.master_port) +
                      ")");
  }
  if (o.standalone && port_given) {
    throw ConfigError(
        "--standalone picks a free port itself; drop --master-port (or drop --standalone)");
  }
  if (o.master_addr.empty()) throw ConfigError("--master-addr must not be empty");
  if (!std::isfinite(o.grace_period_s) || o.grace_period_s < 0 || o.grace_period_s > 3600) {
    std::ostringstream v;
    v << o.grace_period_s;
    throw ConfigError("--grace-period-s must be between 0 and 3600 seconds (got " + v.str() + ")");
  }
  if (o.max_restarts < 0 || o.max_restarts > 1'000'000) {
    throw ConfigError("--max-restarts must be between 0 and 1000000 (got " +
                      std::to_string(o.max_restarts) + ")");
  }
  if (o.standby_mode == StandbyMode::kOn && o.max_restarts == 0) {
    throw ConfigError("--standby needs --max-restarts > 0: a standby worker takes over a "
                      "restarted one, and without restarts it would only hold memory; add "
                      "--max-restarts N or drop --standby");
  }
  if (!std::isfinite(o.monitor_interval_s) || o.monitor_interval_s < 0.001 ||
      o.monitor_interval_s > 60) {
    std::ostringstream v;
    v << o.monitor_interval_s;
    throw ConfigError("--monitor-interval must be between 0.001 and 60 seconds (got " + v.str() +
                      ")");
  }
  if (!std::isfinite(o.heartbeat_timeout_s) || o.heartbeat_timeout_s < 0 ||
      o.heartbeat_timeout_s > 86400) {
    std::ostringstream v;
    v << o.heartbeat_timeout_s;
    throw ConfigError("--heartbeat-timeout must be between 0 (off) and 86400 seconds (got " +
                      v.str() + ")");
  }
}

bool is_executable_file(const std::string& path, int* error) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *error = errno;
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    *error = EISDIR;
    return false;
  }
  if (::access(path.c_str(), X_OK) != 0) {
    *error = errno;
    return false;
  }
  return true;
}

// torchrun's variable for an option: PET_ and its first long name, upper case, '-' as '_'.
std::string pet_variable(const std::string& names) {
  std::string name = names.substr(names.find("--") + 2);
  name = name.substr(0, name.find(','));
  std::string out = "PET_";
  for (char c : name)
    out += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// An option as torchrun has it: `names` as CLI11 spells them ("--master-port,--master_port"),
// also read from its PET_ variable, with its default shown in --help unless `show_default` is
// false.
template <class T>
CLI::Option* torchrun_option(CLI::App& app, const std::string& names, T& value,
                             const std::string& help, bool show_default = true) {
  CLI::Option* option = app.add_option(names, value, help)->envname(pet_variable(names));
  return show_default ? option->capture_default_str() : option;
}

CLI::Option* torchrun_flag(CLI::App& app, const std::string& names, bool& value,
                           const std::string& help) {
  return app.add_flag(names, value, help)->envname(pet_variable(names));
}

}  // namespace

std::string resolve_program(const std::string& program, const std::string& path_env) {
  if (program.empty()) throw ConfigError("the program name is empty");
  int error = 0;
  if (program.find('/') != std::string::npos) {
    if (is_executable_file(program, &error)) return program;
    if (error == ENOENT || error == ENOTDIR) {
      throw ConfigError("program '" + program + "' not found (" + std::strerror(error) +
                        "); check the path");
    }
    if (error == EISDIR)
      throw ConfigError("program '" + program + "' is a directory, not an executable");
    throw ConfigError("program '" + program + "' is not executable (" + std::strerror(error) +
                      "); `chmod +x` it or run it through its interpreter");
  }
  // Search PATH like execvp: first executable regular file wins; remember a non-executable match
  // so the message can say "found but not executable" instead of "not found".
  std::string non_executable;
  std::size_t start = 0;
  while (start <= path_env.size()) {
    const auto end = std::min(path_env.find(':', start), path_env.size());
    std::string dir = path_env.substr(start, end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + program;
    if (is_executable_file(candidate, &error)) return candidate;
    if (error == EACCES && non_executable.empty()) non_executable = candidate;
    start = end + 1;
  }
  if (!non_executable.empty()) {
    throw ConfigError("program '" + program + "' found as " + non_executable +
                      " but it is not executable");
  }
  throw ConfigError("program '" + program + "' not found in PATH (" + path_env +
                    "); give a path such as ./" + program);
}

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine result;
  LauncherOptions& o = result.options;
  std::string nnodes = "1";

  CLI::App app{kDescription, "tandemrun"};
  app.formatter(std::make_shared<UsageFormatter>());
  app.get_formatter()->column_width(40);
  app.footer(kFooter);
  app.prefix_command();  // the first positional is PROGRAM; everything after it is the program's
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.set_version_flag("--version", std::string("tandemrun (tandem) ") + TANDEM_VERSION,
                       "Print the version and exit");

  auto* nnodes_option = torchrun_option(
      app, "--nnodes", nnodes,
      "Number of nodes, N or MIN:MAX; MAX > 1 runs the multi-node rendezvous (a late node "
      "joins at the next restart, the job goes on with >= MIN nodes)");
  auto* node_rank_option =
      torchrun_option(app, "--node-rank,--node_rank", o.node_rank,
                      "Rank of this node (GROUP_RANK); 0 on a single node. Multi-node: the node "
                      "with rank 0 hosts the rendezvous store when there is no --rdzv-endpoint, "
                      "and given ranks order the nodes of a round (else join order)");
  auto* nproc = torchrun_option(app, "--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                                "Number of worker processes to start on this node (required unless "
                                "Slurm's SLURM_GPUS_ON_NODE/SLURM_NTASKS_PER_NODE give it)",
                                false);
  auto* master_addr = torchrun_option(app, "--master-addr,--master_addr", o.master_addr,
                                      "Address of rank 0's store (MASTER_ADDR)");
  auto* port = torchrun_option(app, "--master-port,--master_port", o.master_port,
                               "Port of rank 0's store (MASTER_PORT)");
  torchrun_flag(app, "--standalone", o.standalone,
                "Pick a free port on --master-addr instead of --master-port (single-node runs)");
  auto* run_id =
      torchrun_option(app, "--run-id,--run_id", o.run_id,
                      "Run id given to workers as TORCHELASTIC_RUN_ID (default: random)", false);
  torchrun_option(app, "--grace-period-s,--grace_period_s", o.grace_period_s,
                  "Seconds stopping workers get between SIGTERM and SIGKILL");
  torchrun_option(app, "--max-restarts,--max_restarts", o.max_restarts,
                  "Restarts of all workers after a worker failure before giving up");
  torchrun_option(app, "--monitor-interval,--monitor_interval", o.monitor_interval_s,
                  "Seconds between heartbeat checks (exits are noticed at once)");
  torchrun_option(app, "--heartbeat-timeout,--heartbeat_timeout", o.heartbeat_timeout_s,
                  "Seconds without tandem::heartbeat() after the first one before a worker counts "
                  "as hung and failed (0: off)");
  torchrun_flag(app, "--ft", o.ft,
                "Step-level fault tolerance (docs/fault_tolerance.md): tandemrun serves the "
                "rendezvous store and reports a worker that dies; the others drop the step, go on "
                "without it (ft.enabled in the program) and the group restarts only when they fail "
                "too. On several nodes the agent hosting the rendezvous serves the store; a node "
                "cut off from it stops its workers");
  torchrun_flag(app, "--ft-replace", o.ft_replace,
                "With --ft (implied): start a replacement for each worker that dies (a standby's "
                "process when there is one); it joins the others at their next step and receives "
                "the training state from a live peer. Each replacement uses one of --max-restarts");
  torchrun_option(app, "--trace-dir,--trace_dir", o.trace_dir,
                  "Workers record timelines into DIR (TANDEM_TRACE_DIR); merged into "
                  "DIR/timeline.json with a summary after the run (docs/timeline.md)",
                  false);
  torchrun_option(
      app, "--metrics-port,--metrics_port", o.metrics_port,
      "Serve the local ranks' live metrics (steps, samples/s, loss, step and "
      "communication time, bytes on the wire, allocator bytes, restarts, checkpoint age) "
      "in Prometheus's text format at http://HOST:PORT/metrics (0: off)",
      false)
      ->check(CLI::Range(0, 65535));
  torchrun_option(
      app, "--metrics-host,--metrics_host", o.metrics_host,
      "Address the metrics endpoint binds (default loopback; 0.0.0.0 for every interface)");
  bool standby = false;
  auto* standby_option =
      torchrun_flag(app, "--standby,!--no-standby", standby,
                    "Keep the next attempt's workers started ahead, waiting in tandem::run_main "
                    "for their environment, so a restart skips process start and library "
                    "loading (needs --max-restarts > 0). Default: on when --max-restarts > 0, "
                    "the program calls tandem::run_main and memory allows it");
  std::string ranks_filter;
  torchrun_option(app, "--log-dir,--log_dir", o.log_dir,
                  "Base directory for worker log files: <dir>/<run id>_XXXXXX/attempt_<restart>/"
                  "<local rank>/{stdout,stderr}.log and error.json (default: a temp dir, made "
                  "only when --redirects/--tee ask for files)",
                  false);
  torchrun_option(app, "-r,--redirects", o.redirects,
                  "Send worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both, for "
                  "all local ranks, or per local rank as 0:3,1:2");
  torchrun_option(app, "-t,--tee", o.tee,
                  "Send worker streams to log files and the console (syntax of --redirects)");
  torchrun_option(app, "--local-ranks-filter,--local_ranks_filter", ranks_filter,
                  "Comma-separated local ranks whose output is shown on the console, e.g. 0 "
                  "(log files are written for all; default: all)",
                  false);

  // Multi-node rendezvous (docs/launcher.md "Multi-node").
  torchrun_option(app, "--rdzv-backend,--rdzv_backend", o.rdzv_backend,
                  "Rendezvous backend: c10d (or static, the same here): a TCPStore of the agents");
  torchrun_option(app, "--rdzv-endpoint,--rdzv_endpoint", o.rdzv_endpoint,
                  "HOST[:PORT] of the agents' rendezvous store; the agent that can bind it hosts "
                  "it (default: --master-addr:--master-port, hosted by node rank 0)",
                  false);
  torchrun_option(app, "--rdzv-id,--rdzv_id", o.rdzv_id,
                  "Job id shared by all nodes; namespaces the rendezvous keys");
  torchrun_option(app, "--rdzv-token-file,--rdzv_token_file", o.rdzv_token_file,
                  "File whose first line is the job token (when TANDEM_JOB_TOKEN is unset); "
                  "agents with another token are rejected",
                  false);
  torchrun_option(app, "--rdzv-last-call-s,--rdzv_last_call_s", o.rdzv_last_call_s,
                  "Seconds a round with >= MIN nodes stays open for more (it closes at once with "
                  "MAX)");
  torchrun_option(app, "--rdzv-join-timeout-s,--rdzv_join_timeout_s", o.rdzv_join_timeout_s,
                  "Seconds an agent waits for a round to gather MIN nodes before giving up");
  torchrun_option(app, "--rdzv-node-timeout-s,--rdzv_node_timeout_s", o.rdzv_node_timeout_s,
                  "Seconds without a keep-alive after which a node counts as lost");
  torchrun_option(app, "--local-addr,--local_addr", o.local_addr,
                  "Address other nodes use to reach this node's workers (default: 127.0.0.1 when "
                  "the rendezvous is on loopback, else the host name)",
                  false);

  try {
    app.parse(argc, const_cast<char**>(argv));  // CLI11 does not modify argv
  } catch (const CLI::CallForHelp&) {
    result.action = CommandLine::Action::kPrintAndExit;
    result.text = app.help();
    return result;
  } catch (const CLI::CallForVersion& e) {
    result.action = CommandLine::Action::kPrintAndExit;
    result.text = std::string(e.what()) + "\n";
    return result;
  } catch (const CLI::ParseError& e) {
    throw ConfigError(e.what());
  }

  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
    throw ConfigError("unknown option '" + rest.front() +
                      "' (options go before PROGRAM; see --help)");
  }
  if (rest.empty())
    throw ConfigError("no PROGRAM given; usage: tandemrun --nproc-per-node N PROGRAM [ARGS...]");
  // Cluster variables fill what neither the command line nor PET_* gave (cluster_env.h).
  const ClusterEnv cluster = detect_cluster_env([](const char* name) { return std::getenv(name); });
  std::string from_cluster;
  auto fill = [&](CLI::Option* option, auto& field, const auto& value, const char* name) {
    if (option->count() > 0 || !value) return;
    field = *value;
    std::ostringstream text;
    text << " " << name << "=" << *value;
    from_cluster += text.str();
  };
  std::optional<std::string> cluster_nnodes;
  if (cluster.nnodes) cluster_nnodes = std::to_string(*cluster.nnodes);
  fill(nnodes_option, nnodes, cluster_nnodes, "nnodes");
  fill(node_rank_option, o.node_rank, cluster.node_rank, "node_rank");
  fill(nproc, o.nproc_per_node, cluster.nproc_per_node, "nproc_per_node");
  fill(master_addr, o.master_addr, cluster.master_addr, "master_addr");
  fill(port, o.master_port, cluster.master_port, "master_port");
  fill(run_id, o.run_id, cluster.run_id, "run_id");
  if (!cluster.source.empty()) {
    o.launch_sources = "launch settings from " + cluster.source +
                       (from_cluster.empty() ? std::string(": none (all given)")
                                             : ":" + from_cluster) +
                       "; the rest from the command line, PET_* or defaults";
  }
  if (nproc->count() == 0 && !cluster.nproc_per_node) {
    throw ConfigError(
        "--nproc-per-node is required (how many workers to start), e.g. --nproc-per-node 2");
  }
  parse_nnodes(nnodes, o);
  o.node_rank_given = node_rank_option->count() > 0 || cluster.node_rank.has_value();
  if (standby_option->count() > 0) o.standby_mode = standby ? StandbyMode::kOn : StandbyMode::kOff;
  if (o.ft_replace) o.ft = true;  // --ft-replace implies --ft
  validate(o, port->count() > 0);
  parse_std_spec(o.redirects, "--redirects");  // validated here; applied per worker
  parse_std_spec(o.tee, "--tee");
  o.local_ranks_filter = parse_ranks_filter(ranks_filter, o.nproc_per_node);

  o.program = rest.front();
  o.program_args.assign(rest.begin() + 1, rest.end());
  const char* path = std::getenv("PATH");
  o.program_path = resolve_program(o.program, path != nullptr ? path : "/bin:/usr/bin");
  return result;
}

void resolve_launch_values(LauncherOptions& options) {
  // Multi-node: every node's workers must see the same run id (torchrun uses the rdzv id).
  if (options.run_id.empty() && options.multi_node()) options.run_id = options.rdzv_id;
  if (options.run_id.empty()) options.run_id = generate_run_id();
  if (options.standalone) options.master_port = pick_free_port(options.master_addr);
  options.standby = options.max_restarts > 0 &&
                    (options.standby_mode == StandbyMode::kOn ||
                     (options.standby_mode == StandbyMode::kAuto &&
                      program_calls_run_main(options.program_path)));
}

std::string generate_run_id() {
  std::random_device device;
  std::uniform_int_distribution<unsigned> digit(0, 15);
  std::string id;
  for (int i = 0; i < 16; ++i) id += "0123456789abcdef"[digit(device)];
  return id;
}

}  // namespace tandem::launcher
