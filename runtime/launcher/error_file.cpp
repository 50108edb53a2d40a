#include "error_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <memory>

namespace tandem::launcher {
namespace {

// Just enough JSON for error files: objects, strings, numbers and literals; arrays are skipped.
struct Value {
  enum class Kind { kNull, kString, kNumber, kObject, kOther } kind = Kind::kNull;
  std::string text;  // string contents, or the number's spelling
  std::map<std::string, std::shared_ptr<Value>> members;
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  bool parse(Value& out) {
    if (!value(out, 0)) return false;
    skip_ws();
    return pos_ == s_.size();
  }

 private:
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool hex4(unsigned& cp) {
    if (pos_ + 4 > s_.size()) return false;
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      cp <<= 4;
      if (c >= '0' && c <= '9')
        cp |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        cp |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        cp |= static_cast<unsigned>(c - 'A' + 10);
      else
        return false;
    }
    return true;
  }

  bool string(std::string& out) {
    if (pos_ >= s_.size() || s_[pos_] != '"') return false;
    ++pos_;
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) return false;
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && pos_ + 6 <= s_.size() && s_[pos_] == '\\' &&
              s_[pos_ + 1] == 'u') {
            pos_ += 2;
            unsigned low = 0;
            if (!hex4(low)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }

  bool value(Value& out, int depth) {
    if (depth > 64) return false;
    skip_ws();
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    if (c == '"') {
      out.kind = Value::Kind::kString;
      return string(out.text);
    }
    if (c == '{') {
      out.kind = Value::Kind::kObject;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      for (;;) {
        skip_ws();
        std::string key;
        if (!string(key)) return false;
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != ':') return false;
        ++pos_;
        auto member = std::make_shared<Value>();
        if (!value(*member, depth + 1)) return false;
        out.members[key] = member;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          return true;
        }
        return false;
      }
    }
    if (c == '[') {
      out.kind = Value::Kind::kOther;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      for (;;) {
        Value element;
        if (!value(element, depth + 1)) return false;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          return true;
        }
        return false;
      }
    }
    // Numbers and literals: one token of plain characters.
    const std::size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '-' || s_[pos_] == '+' || s_[pos_] == '.'))
      ++pos_;
    if (pos_ == start) return false;
    out.text = s_.substr(start, pos_ - start);
    out.kind = (c == '-' || (c >= '0' && c <= '9')) ? Value::Kind::kNumber : Value::Kind::kOther;
    return true;
  }

  const std::string& s_;
  std::size_t pos_ = 0;
};

const Value* member(const Value& v, const char* key) {
  if (v.kind != Value::Kind::kObject) return nullptr;
  const auto it = v.members.find(key);
  return it == v.members.end() ? nullptr : it->second.get();
}

long long to_seconds(const Value* v) {
  if (v == nullptr || (v->kind != Value::Kind::kString && v->kind != Value::Kind::kNumber))
    return 0;
  return std::atoll(v->text.c_str());
}

}  // namespace

std::optional<WorkerError> parse_error_file(const std::string& text) {
  Value root;
  if (!Parser(text).parse(root)) return std::nullopt;
  const Value* message = member(root, "message");
  if (message == nullptr) return std::nullopt;
  WorkerError error;
  if (message->kind == Value::Kind::kString) {  // the older flat form
    error.message = message->text;
    error.timestamp = to_seconds(member(root, "timestamp"));
    return error;
  }
  const Value* inner = member(*message, "message");
  if (inner == nullptr || inner->kind != Value::Kind::kString) return std::nullopt;
  error.message = inner->text;
  if (const Value* extra = member(*message, "extraInfo")) {
    const Value* stack = member(*extra, "py_callstack");
    if (stack != nullptr && stack->kind == Value::Kind::kString) error.callstack = stack->text;
    error.timestamp = to_seconds(member(*extra, "timestamp"));
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
