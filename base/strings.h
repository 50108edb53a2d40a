// String helpers shared by every layer: splitting, trimming, strict number parsing, escaping,
// demangling and the edit distance behind "did you mean".
//
// Pure functions over their arguments; no locale, no allocation beyond the result. Thread-safe.
// Parsers return std::nullopt instead of throwing, so each caller words its own error (naming
// the config key or file it was reading).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::strings {

// Every field between separators, empty ones included: split("a,,b", ',') = {"a", "", "b"};
// split("", ',') = {""}.
std::vector<std::string> split(std::string_view text, char separator);

// Lines without their '\n' (a final newline does not add an empty line); "\r\n" keeps the '\r'.
std::vector<std::string> split_lines(std::string_view text);

// Runs of non-whitespace, in order: split_words("  a b\tc\n") = {"a", "b", "c"}.
std::vector<std::string> split_words(std::string_view text);

// `text` without leading and trailing spaces, tabs, carriage returns and newlines.
std::string trim(std::string_view text);

// parts[0] + separator + parts[1] + ...
std::string join(const std::vector<std::string>& parts, std::string_view separator);

bool starts_with(std::string_view text, std::string_view prefix);
bool ends_with(std::string_view text, std::string_view suffix);

// The whole of `text` as a base-10 integer ("-12", "+7"; no spaces, no trailing bytes), or nullopt
// when it is not one or does not fit.
std::optional<int64_t> parse_int(std::string_view text);
// The whole of `text` as a finite or infinite double ("1e-3", "0.5", "inf"), or nullopt.
std::optional<double> parse_double(std::string_view text);

// Text safe inside XML/SVG/HTML element content and attribute values (& < > " ' as entities;
// control characters XML 1.0 forbids, all below 0x20 but tab, newline and return, as '?').
std::string xml_escape(std::string_view text);

// The readable C++ name of a mangled one (typeid(x).name()); the input itself when it is not
// mangled; "unknown" for nullptr.
std::string demangle(const char* mangled);

// Levenshtein distance (insertions, deletions, substitutions cost 1).
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace tandem::strings
