// tandemrun <-> worker contract (base/launch_contract.h). No torch headers.
#include "base/launch_contract.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <tandem/base/errors.h>

#include "base/json.h"

namespace tandem::launch {
namespace {

constexpr ErrorKind kKinds[] = {ErrorKind::kException, ErrorKind::kError,      ErrorKind::kConfig,
                                ErrorKind::kComm,      ErrorKind::kTimeout,    ErrorKind::kPeerLost,
                                ErrorKind::kCheckpoint, ErrorKind::kFile,       ErrorKind::kOutOfMemory,
                                ErrorKind::kSignal};

// Unix seconds from a string ("1700000000", as torch writes it) or a number; 0 otherwise.
long long to_seconds(const JsonValue* v) {
  if (v == nullptr) return 0;
  if (v->is_string()) return std::atoll(v->as_string("timestamp").c_str());
  if (v->is_number()) return static_cast<long long>(v->as_double("timestamp"));
  return 0;
}

const JsonValue* string_member(const JsonValue& v, const char* key) {
  const JsonValue* m = v.find(key);
  return m != nullptr && m->is_string() ? m : nullptr;
}

std::string json_string(const std::string& text) {
  std::string out;
  append_json_string(out, text);
  return out;
}

}  // namespace

const char* kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kException: return "exception";
    case ErrorKind::kError: return "error";
    case ErrorKind::kConfig: return "config";
    case ErrorKind::kComm: return "comm";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kPeerLost: return "peer_lost";
    case ErrorKind::kCheckpoint: return "checkpoint";
    case ErrorKind::kFile: return "file";
    case ErrorKind::kOutOfMemory: return "out_of_memory";
    case ErrorKind::kSignal: return "signal";
  }
  return "exception";
}

bool is_consequence(ErrorKind kind) {
  return kind == ErrorKind::kComm || kind == ErrorKind::kTimeout || kind == ErrorKind::kPeerLost;
}

std::string error_file_json(const ErrorReport& report) {
  return "{\"message\": {\"message\": " + json_string(report.message) +
         ", \"extraInfo\": {\"py_callstack\": " + json_string(report.callstack) +
         ", \"timestamp\": \"" + std::to_string(report.timestamp) + "\", \"kind\": \"" +
         kind_name(report.kind) + "\", \"restartable\": " + (report.restartable ? "true" : "false") +
         "}}}\n";
}

std::optional<ErrorReport> parse_error_file(const std::string& text) {
  JsonValue root;
  try {
    root = parse_json(text, JsonErrors::kPlain);  // the strict reader (base/json.h); never executes
  } catch (const Error&) {
    return std::nullopt;
  }
  const JsonValue* message = root.find("message");
  if (message == nullptr) return std::nullopt;
  ErrorReport report;
  if (message->is_string()) {  // the older flat form
    report.message = message->as_string("message");
    report.timestamp = to_seconds(root.find("timestamp"));
    return report;
  }
  const JsonValue* inner = string_member(*message, "message");
  if (inner == nullptr) return std::nullopt;
  report.message = inner->as_string("message.message");
  const JsonValue* extra = message->find("extraInfo");
  if (extra == nullptr) return report;
  if (const JsonValue* stack = string_member(*extra, "py_callstack"))
    report.callstack = stack->as_string("py_callstack");
  report.timestamp = to_seconds(extra->find("timestamp"));
  if (const JsonValue* kind = string_member(*extra, "kind")) {
    for (ErrorKind k : kKinds) {
      if (kind->as_string("kind") == kind_name(k)) report.kind = k;
    }
  }
  if (const JsonValue* restartable = extra->find("restartable"); restartable && restartable->is_bool())
    report.restartable = restartable->as_bool("restartable");
  return report;
}

std::optional<ErrorReport> read_error_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buffer[8192];
  constexpr std::size_t kMaxBytes = 1 << 20;
  while (text.size() < kMaxBytes) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return parse_error_file(text);
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

long env_int(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' ? n : fallback;
}

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) out.emplace(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return out;
}

std::string ft_prefix(const std::string& run_id, int restart_count) {
  return "tandemrun/" + run_id + "/restart" + std::to_string(restart_count) + "/ft";
}

std::string ft_dead_key(const std::string& prefix, int rank, int incarnation) {
  return prefix + "/dead/" + std::to_string(rank) + "." + std::to_string(incarnation);
}

std::string ft_dead_any_key(const std::string& prefix, int rank) {
  return prefix + "/dead/any/" + std::to_string(rank);
}

std::string ft_dead_count_key(const std::string& prefix) { return prefix + "/dead/count"; }

std::string ft_group_failed_key(const std::string& prefix) { return prefix + "/group_failed"; }

}  // namespace tandem::launch
