#include "base/strings.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

namespace tandem::strings {
namespace {

using V = std::vector<std::string>;

TEST(Strings, SplitKeepsEmptyFields) {
  EXPECT_EQ(split("a,,b", ','), (V{"a", "", "b"}));
  EXPECT_EQ(split("", ','), (V{""}));
  EXPECT_EQ(split("a,", ','), (V{"a", ""}));
  EXPECT_EQ(split("ddp.bucket_cap_mb", '.'), (V{"ddp", "bucket_cap_mb"}));
}

TEST(Strings, SplitLinesAndWords) {
  EXPECT_EQ(split_lines("a\nb\n"), (V{"a", "b"}));
  EXPECT_EQ(split_lines("a\n\nb"), (V{"a", "", "b"}));
  EXPECT_EQ(split_lines(""), V{});
  EXPECT_EQ(split_words("  a b\tc\n"), (V{"a", "b", "c"}));
  EXPECT_EQ(split_words(" \t"), V{});
}

TEST(Strings, TrimJoinAffixes) {
  EXPECT_EQ(trim(" \t x y \r\n"), "x y");
  EXPECT_EQ(trim("   "), "");
  EXPECT_EQ(join({"a", "b", "c"}, ", "), "a, b, c");
  EXPECT_EQ(join({}, ","), "");
  EXPECT_TRUE(starts_with("step_10.tmp", "step_"));
  EXPECT_FALSE(starts_with("st", "step_"));
  EXPECT_TRUE(ends_with("step_10.tmp", ".tmp"));
  EXPECT_FALSE(ends_with("tmp", ".tmp"));
}

TEST(Strings, ParseIntIsStrict) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("-7"), -7);
  EXPECT_EQ(parse_int("+7"), 7);
  EXPECT_EQ(parse_int("9223372036854775807"), std::numeric_limits<int64_t>::max());
  for (const char* bad : {"", " 1", "1 ", "1.5", "0x10", "12a", "9223372036854775808", "-"}) {
    EXPECT_FALSE(parse_int(bad).has_value()) << bad;
  }
}

TEST(Strings, ParseDoubleIsStrict) {
  EXPECT_EQ(parse_double("0.5"), 0.5);
  EXPECT_EQ(parse_double("1e-3"), 1e-3);
  EXPECT_EQ(parse_double("inf"), std::numeric_limits<double>::infinity());
  for (const char* bad : {"", "nan", "1e999", " 1", "1.0x"}) {
    EXPECT_FALSE(parse_double(bad).has_value()) << bad;
  }
}

TEST(Strings, XmlEscapeAndDemangle) {
  EXPECT_EQ(xml_escape("a<b&\"c\"'"), "a&lt;b&amp;&quot;c&quot;&#39;");
  EXPECT_EQ(demangle(typeid(std::vector<int>).name()).substr(0, 11), "std::vector");
  EXPECT_EQ(demangle("not mangled"), "not mangled");
  EXPECT_EQ(demangle(nullptr), "unknown");
}

TEST(Strings, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("stesp", "steps"), 2u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
}

}  // namespace
}  // namespace tandem::strings
