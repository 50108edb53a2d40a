#include "launcher_options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "free_port.h"
#include "tandem/errors.h"

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

// --nnodes takes torchrun's "N" or "MIN:MAX"; this cut runs exactly one node.
int parse_nnodes(const std::string& text) {
  const auto colon = text.find(':');
  auto parse_int = [&](const std::string& part) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || errno != 0 || v < 1 || v > 1'000'000) {
      throw ConfigError("--nnodes must be a positive integer or MIN:MAX (got '" + text + "')");
    }
    return static_cast<int>(v);
  };
  const int min_nodes = parse_int(text.substr(0, colon));
  const int max_nodes = colon == std::string::npos ? min_nodes : parse_int(text.substr(colon + 1));
  if (min_nodes != 1 || max_nodes != 1) {
    throw ConfigError(
        "--nnodes " + text +
        ": multi-node runs come with the fault-tolerant agent; this tandemrun runs a single node "
        "(use --nnodes 1, or torchrun/Slurm for several nodes)");
  }
  return 1;
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
  if (o.node_rank != 0) {
    throw ConfigError("--node-rank must be 0 for a single-node run (got " +
                      std::to_string(o.node_rank) + ")");
  }
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

  app.add_option(
         "--nnodes", nnodes,
         "Number of nodes, N or MIN:MAX; only 1 is supported until the fault-tolerant agent")
      ->envname("PET_NNODES")
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", o.node_rank,
                 "Rank of this node (GROUP_RANK); 0 on a single node")
      ->envname("PET_NODE_RANK")
      ->capture_default_str();
  auto* nproc = app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                               "Number of worker processes to start on this node (required)")
                    ->envname("PET_NPROC_PER_NODE");
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "Address of rank 0's store (MASTER_ADDR)")
      ->envname("PET_MASTER_ADDR")
      ->capture_default_str();
  auto* port = app.add_option("--master-port,--master_port", o.master_port,
                              "Port of rank 0's store (MASTER_PORT)")
                   ->envname("PET_MASTER_PORT")
                   ->capture_default_str();
  app.add_flag("--standalone", o.standalone,
               "Pick a free port on --master-addr instead of --master-port (single-node runs)")
      ->envname("PET_STANDALONE");
  app.add_option("--run-id,--run_id", o.run_id,
                 "Run id given to workers as TORCHELASTIC_RUN_ID (default: random)")
      ->envname("PET_RUN_ID");
  app.add_option("--grace-period-s,--grace_period_s", o.grace_period_s,
                 "Seconds stopping workers get between SIGTERM and SIGKILL")
      ->capture_default_str();
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "Restarts of all workers after a worker failure before giving up")
      ->envname("PET_MAX_RESTARTS")
      ->capture_default_str();
  app.add_option("--monitor-interval,--monitor_interval", o.monitor_interval_s,
                 "Seconds between heartbeat checks (exits are noticed at once)")
      ->envname("PET_MONITOR_INTERVAL")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout,--heartbeat_timeout", o.heartbeat_timeout_s,
                 "Seconds without tandem::heartbeat() after the first one before a worker counts "
                 "as hung and failed (0: off)")
      ->capture_default_str();

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
  if (nproc->count() == 0) {
    throw ConfigError(
        "--nproc-per-node is required (how many workers to start), e.g. --nproc-per-node 2");
  }
  o.nnodes = parse_nnodes(nnodes);
  validate(o, port->count() > 0);

  o.program = rest.front();
  o.program_args.assign(rest.begin() + 1, rest.end());
  const char* path = std::getenv("PATH");
  o.program_path = resolve_program(o.program, path != nullptr ? path : "/bin:/usr/bin");
  return result;
}

void resolve_launch_values(LauncherOptions& options) {
  if (options.run_id.empty()) options.run_id = generate_run_id();
  if (options.standalone) options.master_port = pick_free_port(options.master_addr);
}

std::string generate_run_id() {
  std::random_device device;
  std::uniform_int_distribution<unsigned> digit(0, 15);
  std::string id;
  for (int i = 0; i < 16; ++i) id += "0123456789abcdef"[digit(device)];
  return id;
}

}  // namespace tandem::launcher
