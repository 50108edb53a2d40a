#include "tools/tandemrun/error_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <tandem/base/errors.h>

#include "base/json.h"

namespace tandem::launcher {
namespace {

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

}  // namespace

std::optional<WorkerError> parse_error_file(const std::string& text) {
  JsonValue root;
  try {
    root = parse_json(text, JsonErrors::kPlain);  // the strict reader (base/json.h); never executes
  } catch (const Error&) {
    return std::nullopt;
  }
  const JsonValue* message = root.find("message");
  if (message == nullptr) return std::nullopt;
  WorkerError error;
  if (message->is_string()) {  // the older flat form
    error.message = message->as_string("message");
    error.timestamp = to_seconds(root.find("timestamp"));
    return error;
  }
  const JsonValue* inner = string_member(*message, "message");
  if (inner == nullptr) return std::nullopt;
  error.message = inner->as_string("message.message");
  if (const JsonValue* extra = message->find("extraInfo")) {
    if (const JsonValue* stack = string_member(*extra, "py_callstack"))
      error.callstack = stack->as_string("py_callstack");
    error.timestamp = to_seconds(extra->find("timestamp"));
  }
  return error;
}

std::optional<WorkerError> read_error_file(const std::string& path) {
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

}  // namespace tandem::launcher
