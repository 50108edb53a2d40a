// Strict JSON reader/writer (see include/tandem/checkpoint/json.h). No torch headers.
#include "base/json.h"

#include <tandem/base/errors.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace tandem {
namespace {

const char* type_name(JsonValue::Type t) {
  switch (t) {
    case JsonValue::Type::kNull: return "null";
    case JsonValue::Type::kBool: return "boolean";
    case JsonValue::Type::kInt: return "integer";
    case JsonValue::Type::kDouble: return "number";
    case JsonValue::Type::kString: return "string";
    case JsonValue::Type::kArray: return "array";
    case JsonValue::Type::kObject: return "object";
  }
  return "?";
}

[[noreturn]] void type_error(const std::string& what, const char* want, JsonValue::Type got) {
  throw CheckpointError("tandem: checkpoint: " + what + " must be a JSON " + want + ", got " +
                        type_name(got) + "; the file is corrupt or not a tandem checkpoint.");
}

// Length of the UTF-8 sequence starting at s[i] if it is valid, else 0.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto c0 = static_cast<unsigned char>(s[i]);
  if (c0 < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    n = 2;
    cp = c0 & 0x1F;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    n = 3;
    cp = c0 & 0x0F;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    n = 4;
    cp = c0 & 0x07;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
}

void append_utf8(std::string& out, uint32_t cp) {
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

class Parser {
 public:
  Parser(std::string_view text, const JsonLimits& limits) : s_(text), limits_(limits) {}

  JsonValue parse_document() {
    if (s_.size() > limits_.max_input_bytes) {
      fail("input of " + std::to_string(s_.size()) + " bytes exceeds the limit of " +
           std::to_string(limits_.max_input_bytes));
    }
    skip_ws();
    JsonValue v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing bytes after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError("tandem: checkpoint: malformed JSON at byte " + std::to_string(pos_) +
                          ": " + why + ".");
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() {
    while (!at_end()) {
      const char c = s_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  void expect_literal(const char* lit) {
    const size_t n = std::strlen(lit);
    if (s_.size() - pos_ < n || s_.compare(pos_, n, lit) != 0) {
      fail(std::string("expected '") + lit + "'");
    }
    pos_ += n;
  }

  JsonValue parse_value(int depth) {
    if (depth > limits_.max_depth) fail("nesting deeper than " + std::to_string(limits_.max_depth));
    if (at_end()) fail("unexpected end of input, expected a value");
    const char c = s_[pos_];
    switch (c) {
      case '{': return parse_object(depth);
      case '[': return parse_array(depth);
      case '"': return JsonValue(parse_string());
      case 't': expect_literal("true"); return JsonValue(true);
      case 'f': expect_literal("false"); return JsonValue(false);
      case 'n': expect_literal("null"); return JsonValue();
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        fail(std::string("unexpected character '") + (c >= 0x20 && c < 0x7f ? std::string(1, c) : "?") +
             "', expected a value");
    }
  }

  JsonValue parse_object(int depth) {
    ++pos_;  // '{'
    JsonValue obj = JsonValue::object();
    std::unordered_set<std::string> keys;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return obj;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      if (!keys.insert(key).second) fail("duplicate key \"" + key + "\"");
      skip_ws();
      if (peek() != ':') fail("expected ':' after a key");
      ++pos_;
      skip_ws();
      JsonValue v = parse_value(depth + 1);
      obj.set(std::move(key), std::move(v));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return obj;
      }
      fail("expected ',' or '}' in an object");
    }
  }

  JsonValue parse_array(int depth) {
    ++pos_;  // '['
    JsonValue arr = JsonValue::array();
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return arr;
    }
    for (;;) {
      skip_ws();
      arr.push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return arr;
      }
      fail("expected ',' or ']' in an array");
    }
  }

  uint32_t parse_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("bad hex digit in a \\u escape");
    }
    return v;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      if (out.size() > limits_.max_string_bytes) {
        fail("string longer than " + std::to_string(limits_.max_string_bytes) + " bytes");
      }
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("unescaped control character in a string");
      if (c == '\\') {
        ++pos_;
        if (at_end()) fail("unterminated escape");
        const char e = s_[pos_++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            uint32_t cp = parse_hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (s_.size() - pos_ < 2 || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
                fail("unpaired high surrogate");
              }
              pos_ += 2;
              const uint32_t lo = parse_hex4();
              if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired high surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            append_utf8(out, cp);
            break;
          }
          default: fail("bad escape character");
        }
        continue;
      }
      const size_t n = utf8_sequence(s_, pos_);
      if (n == 0) fail("invalid UTF-8 in a string");
      out.append(s_.data() + pos_, n);
      pos_ += n;
    }
  }

  JsonValue parse_number() {
    const size_t start = pos_;
    bool is_integer = true;
    if (peek() == '-') ++pos_;
    if (at_end()) fail("truncated number");
    if (s_[pos_] == '0') {
      ++pos_;
      if (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') fail("leading zero in a number");
    } else if (s_[pos_] >= '1' && s_[pos_] <= '9') {
      while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    } else {
      fail("expected a digit");
    }
    if (!at_end() && s_[pos_] == '.') {
      is_integer = false;
      ++pos_;
      if (at_end() || s_[pos_] < '0' || s_[pos_] > '9') fail("expected a digit after '.'");
      while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    }
    if (!at_end() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      is_integer = false;
      ++pos_;
      if (!at_end() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (at_end() || s_[pos_] < '0' || s_[pos_] > '9') fail("expected a digit in the exponent");
      while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    }
    const size_t len = pos_ - start;
    if (len > 400) fail("number literal too long");
    char buf[512];
    std::memcpy(buf, s_.data() + start, len);
    buf[len] = '\0';
    if (is_integer) {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(buf, &end, 10);
      if (errno == 0 && end == buf + len) return JsonValue(static_cast<int64_t>(v));
      // Out of int64 range: keep it as a double (callers that need an exact integer reject it).
    }
    errno = 0;
    char* end = nullptr;
    const double d = std::strtod(buf, &end);
    if (end != buf + len) fail("malformed number");
    if (!std::isfinite(d)) fail("number out of range");
    return JsonValue(d);
  }

  std::string_view s_;
  const JsonLimits& limits_;
  size_t pos_ = 0;
};

}  // namespace

JsonValue::JsonValue(uint64_t v) : type_(Type::kInt) {
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw CheckpointError("tandem: checkpoint: integer " + std::to_string(v) +
                          " does not fit the JSON integers tandem writes (int64).");
  }
  int_ = static_cast<int64_t>(v);
}

JsonValue JsonValue::array() {
  JsonValue v;
  v.type_ = Type::kArray;
  return v;
}

JsonValue JsonValue::object() {
  JsonValue v;
  v.type_ = Type::kObject;
  return v;
}

bool JsonValue::as_bool(const std::string& what) const {
  if (type_ != Type::kBool) type_error(what, "boolean", type_);
  return bool_;
}

int64_t JsonValue::as_int(const std::string& what) const {
  if (type_ != Type::kInt) type_error(what, "integer", type_);
  return int_;
}

double JsonValue::as_double(const std::string& what) const {
  if (type_ == Type::kInt) return static_cast<double>(int_);
  if (type_ != Type::kDouble) type_error(what, "number", type_);
  return double_;
}

const std::string& JsonValue::as_string(const std::string& what) const {
  if (type_ != Type::kString) type_error(what, "string", type_);
  return string_;
}

const std::vector<JsonValue>& JsonValue::as_array(const std::string& what) const {
  if (type_ != Type::kArray) type_error(what, "array", type_);
  return array_;
}

const std::vector<JsonValue::Member>& JsonValue::as_object(const std::string& what) const {
  if (type_ != Type::kObject) type_error(what, "object", type_);
  return object_;
}

const JsonValue* JsonValue::find(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& m : object_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

const JsonValue& JsonValue::at(std::string_view key, const std::string& what) const {
  as_object(what);
  const JsonValue* v = find(key);
  if (v == nullptr) {
    throw CheckpointError("tandem: checkpoint: " + what + " has no \"" + std::string(key) +
                          "\" member; the file is corrupt or not a tandem checkpoint.");
  }
  return *v;
}

JsonValue& JsonValue::push_back(JsonValue v) {
  if (type_ != Type::kArray) type_error("push_back target", "array", type_);
  array_.push_back(std::move(v));
  return array_.back();
}

JsonValue& JsonValue::set(std::string key, JsonValue v) {
  if (type_ != Type::kObject) type_error("set target", "object", type_);
  object_.emplace_back(std::move(key), std::move(v));
  return object_.back().second;
}

void append_json_string(std::string& out, std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string JsonValue::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

void JsonValue::dump_to(std::string& out, int indent, int level) const {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (type_) {
    case Type::kNull: out += "null"; return;
    case Type::kBool: out += bool_ ? "true" : "false"; return;
    case Type::kInt: out += std::to_string(int_); return;
    case Type::kDouble: {
      if (!std::isfinite(double_)) {
        throw CheckpointError("tandem: checkpoint: cannot write a non-finite number to JSON.");
      }
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.17g", double_);
      std::string s(buf);
      // Keep it a double on re-read ("1" would come back as an integer).
      if (s.find_first_of(".eE") == std::string::npos) s += ".0";
      out += s;
      return;
    }
    case Type::kString: append_json_string(out, string_); return;
    case Type::kArray: {
      out += '[';
      // Arrays of scalars stay on one line (shapes, offsets).
      bool scalars = true;
      for (const auto& v : array_) scalars = scalars && !v.is_array() && !v.is_object();
      for (size_t i = 0; i < array_.size(); ++i) {
        if (i > 0) out += (scalars && indent >= 0) ? ", " : ",";
        if (!scalars) newline(level + 1);
        array_[i].dump_to(out, indent, level + 1);
      }
      if (!scalars && !array_.empty()) newline(level);
      out += ']';
      return;
    }
    case Type::kObject: {
      out += '{';
      for (size_t i = 0; i < object_.size(); ++i) {
        if (i > 0) out += ',';
        newline(level + 1);
        append_json_string(out, object_[i].first);
        out += indent >= 0 ? ": " : ":";
        object_[i].second.dump_to(out, indent, level + 1);
      }
      if (!object_.empty()) newline(level);
      out += '}';
      return;
    }
  }
}

JsonValue parse_json(std::string_view text, const JsonLimits& limits) {
  return Parser(text, limits).parse_document();
}

}  // namespace tandem
