// Internal to runtime/config: the builders the key table (registry.cpp) is written with, one per
// kind of value (a number within a range, a bool, a string, a named choice). Each returns a
// KeySpec whose setter parses and checks text and whose getter prints the member back.
#pragma once

#include "base/strings.h"
#include "runtime/config/key_spec.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem::detail {

// Closed or open bounds; text is what errors and docs show.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  std::string text;
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};

// Shortest text that reads back to `v`.
std::string num_text(double v);
Range any();
Range ge(double lo);
Range gt(double lo);
Range in(double lo, double hi, bool lo_open, bool hi_open);

inline constexpr std::pair<const char*, int> kByteSuffixes[] = {
    {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}};

enum class Parse { kOk, kMalformed, kTooLarge };

template <class T>
Parse parse_number(std::string s, T& out, bool bytes) {
  s = strings::trim(s);
  int shift = 0;
  if (bytes) {
    for (const auto& [suffix, bits] : kByteSuffixes) {
      const std::string suf = suffix;
      if (s.size() > suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0) {
        s = strings::trim(s.substr(0, s.size() - suf.size()));
        shift = bits;
        break;
      }
    }
  }
  if (s.empty()) return Parse::kMalformed;
  if (!std::is_signed_v<T> && s[0] == '-') return Parse::kMalformed;
  if (s[0] == '+') s.erase(0, 1);
  const char* end = s.data() + s.size();
  if constexpr (std::is_floating_point_v<T>) {
    double v = 0;
    const auto r = std::from_chars(s.data(), end, v);
    if (r.ec != std::errc() || r.ptr != end || !std::isfinite(v)) return Parse::kMalformed;
    out = static_cast<T>(v);
  } else {
    T v = 0;
    const auto r = std::from_chars(s.data(), end, v);
    if (r.ec == std::errc::result_out_of_range && r.ptr == end) return Parse::kTooLarge;
    if (r.ec != std::errc() || r.ptr != end) return Parse::kMalformed;
    if (shift > 0) {
      if (v > (std::numeric_limits<T>::max() >> shift)) return Parse::kTooLarge;
      v = static_cast<T>(v << shift);
    }
    out = v;
  }
  return Parse::kOk;
}

// A byte count with the largest binary suffix that divides it ("2MiB"), or plain digits.
std::string bytes_text(std::uint64_t v);
// "true"/"1" or "false"/"0" (blanks around are fine); false when it is neither.
bool parse_bool(const std::string& text, bool& out);

inline SetResult ok() { return {}; }
inline SetResult fail(SetStatus s) { return {s, ""}; }

// The builders take `ref`: a lambda from Config& to the member's reference (TANDEM_REF in
// registry.cpp).
template <class F>
auto& read(const F& ref, const Config& c) {
  return ref(const_cast<Config&>(c));  // ref only selects a member; nothing is written
}

template <class F>
KeySpec number(const std::string& key, F ref, Range range, const std::string& doc,
               bool bytes = false) {
  using T = std::remove_reference_t<decltype(ref(std::declval<Config&>()))>;
  KeySpec s;
  s.info.key = key;
  s.info.type = bytes ? "bytes" : std::is_floating_point_v<T> ? "float" : std::is_signed_v<T> ? "int" : "uint";
  s.info.allowed = range.text;
  s.info.doc = doc;
  s.set = [ref, range, bytes](Config& c, const std::string& text) -> SetResult {
    T v{};
    const Parse p = parse_number<T>(text, v, bytes);
    if (p != Parse::kOk) return fail(p == Parse::kTooLarge ? SetStatus::kRange : SetStatus::kType);
    if (!range.contains(static_cast<double>(v))) return fail(SetStatus::kRange);
    ref(c) = v;
    return ok();
  };
  s.get = [ref, bytes](const Config& c) -> std::string {
    const T v = read(ref, c);
    if constexpr (std::is_floating_point_v<T>) {
      return num_text(static_cast<double>(v));
    } else {
      if (bytes) return bytes_text(static_cast<std::uint64_t>(v));
      return std::to_string(v);
    }
  };
  return s;
}

template <class F>
KeySpec boolean(const std::string& key, F ref, const std::string& doc) {
  KeySpec s;
  s.info.key = key;
  s.info.type = "bool";
  s.info.allowed = "true | false";
  s.info.doc = doc;
  s.set = [ref](Config& c, const std::string& text) -> SetResult {
    bool v = false;
    if (!parse_bool(text, v)) return fail(SetStatus::kType);
    ref(c) = v;
    return ok();
  };
  s.get = [ref](const Config& c) -> std::string { return read(ref, c) ? "true" : "false"; };
  return s;
}

template <class F>
KeySpec text(const std::string& key, F ref, const std::string& doc) {
  KeySpec s;
  s.info.key = key;
  s.info.type = "string";
  s.info.doc = doc;
  s.set = [ref](Config& c, const std::string& t) -> SetResult {
    ref(c) = t;
    return ok();
  };
  s.get = [ref](const Config& c) -> std::string { return read(ref, c); };
  return s;
}

// A member of type E chosen by name; `names[i]` is the name of `values[i]`.
template <class F, class E>
KeySpec choice(const std::string& key, F ref, std::vector<std::pair<std::string, E>> options,
               const std::string& doc) {
  KeySpec s;
  s.info.key = key;
  s.info.type = "choice";
  s.info.doc = doc;
  for (const auto& o : options) s.choices.push_back(o.first);
  s.info.allowed = strings::join(s.choices, " | ");
  const std::vector<std::string> names = s.choices;
  s.set = [ref, options, names](Config& c, const std::string& text) -> SetResult {
    const std::string t = strings::trim(text);
    for (const auto& o : options) {
      if (o.first == t) {
        ref(c) = o.second;
        return ok();
      }
    }
    return {SetStatus::kChoice, closest(t, names)};
  };
  s.get = [ref, options](const Config& c) -> std::string {
    for (const auto& o : options)
      if (o.second == read(ref, c)) return o.first;
    return "?";
  };
  return s;
}

template <class F>
KeySpec string_choice(const std::string& key, F ref, const std::vector<std::string>& names,
                      const std::string& doc) {
  std::vector<std::pair<std::string, std::string>> options;
  for (const auto& n : names) options.emplace_back(n, n);
  return choice(key, ref, options, doc);
}

// comm.timeout_s: seconds in config, milliseconds in InitOptions.
KeySpec timeout_key();
// pipeline.balance: a list of layer counts.
KeySpec balance_key();
// train.device: auto | cpu | cuda | cuda:N.
KeySpec device_key();

}  // namespace tandem::detail
