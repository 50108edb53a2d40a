// base/'s writers and error words: the Chrome-trace writer (its output is valid JSON whatever the
// names hold, one event per line), the SVG writer (every text escaped), and what base/ says when a
// JSON text or a file is bad (its own words unless the caller reads a checkpoint).
#include <gtest/gtest.h>
#include <tandem/base/errors.h>
#include <tandem/base/file_system.h>

#include "base/chrome_trace.h"
#include "base/json.h"
#include "base/svg_writer.h"

#include <limits>
#include <string>

namespace tandem {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ChromeTraceWriter, WritesValidJsonWhateverTheNamesHold) {
  const std::string odd = "q\"b\\c\x01\n\xff<";  // quote, backslash, controls, invalid UTF-8
  ChromeTraceWriter w;
  w.metadata("thread_name", 3, 7, "\"name\":\"main\"");
  ChromeTraceEvent x;
  x.name = odd;
  x.category = "compute";
  x.ts_us = 1700000000000001;  // a wall-clock microsecond stays an exact integer
  x.pid = 3;
  x.tid = 7;
  x.dur_us = 2.5;
  x.args = "\"step\":1";
  w.event(x);
  ChromeTraceEvent b;
  b.name = "bucket";
  b.phase = 'b';
  b.id = 9;
  w.event(b);
  w.event(parse_json("{\"name\":\"copied\",\"ph\":\"i\",\"ts\":5}", JsonErrors::kPlain));
  JsonValue other = JsonValue::object();
  other.set("schedule", JsonValue(std::string("s\"1")));
  w.finish(other);
  const std::string& text = w.text();
  EXPECT_EQ(text.rfind("{\"traceEvents\":[\n", 0), 0u) << text;
  const JsonValue t = parse_json(text, JsonErrors::kPlain);
  const auto& events = t.at("traceEvents", "t").as_array("traceEvents");
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].at("ph", "ph").as_string("ph"), "M");
  EXPECT_EQ(events[1].at("name", "n").as_string("n"), "q\"b\\c\x01\n\xEF\xBF\xBD<");  // U+FFFD
  EXPECT_EQ(events[1].at("ts", "ts").as_int("ts"), 1700000000000001);
  EXPECT_EQ(events[1].at("dur", "dur").as_double("dur"), 2.5);
  EXPECT_EQ(events[1].at("args", "a").at("step", "s").as_int("s"), 1);
  EXPECT_EQ(events[2].at("id", "id").as_int("id"), 9);
  EXPECT_EQ(events[2].find("dur"), nullptr);  // only complete events carry one
  EXPECT_EQ(events[3].at("name", "n").as_string("n"), "copied");
  EXPECT_EQ(t.at("otherData", "o").at("schedule", "s").as_string("s"), "s\"1");
  EXPECT_EQ(t.at("displayTimeUnit", "d").as_string("d"), "ms");
}

TEST(SvgWriter, EscapesEveryTextAndTooltip) {
  SvgWriter svg;
  svg.rect(1.5, 2, 3.25, 4, "fill=\"#123456\"", "tip <&> \"q\" \x02");
  svg.rect(0, 0, 1, 1, "class=\"lane\"");
  svg.text(10, 20, "a<b&c\x1f", "class=\"label\"");
  svg.line(0, 0.254, 5, 5, "stroke=\"#ddd\"");
  const std::string doc = svg.finish(100, 50.5, "font-size=\"11\"", ".lane{fill:#eee}");
  EXPECT_EQ(doc.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100\" height=\"50.5\" "
                      "font-family=\"sans-serif\" font-size=\"11\">\n<style>.lane{fill:#eee}</style>",
                      0),
            0u)
      << doc;
  EXPECT_TRUE(contains(doc, "<rect x=\"1.5\" y=\"2\" width=\"3.25\" height=\"4\" fill=\"#123456\">"
                            "<title>tip &lt;&amp;&gt; &quot;q&quot; ?</title></rect>\n"))
      << doc;
  EXPECT_TRUE(contains(doc, "<rect x=\"0\" y=\"0\" width=\"1\" height=\"1\" class=\"lane\"/>\n"));
  EXPECT_TRUE(contains(doc, ">a&lt;b&amp;c?</text>\n")) << doc;
  EXPECT_TRUE(contains(doc, "<line x1=\"0\" y1=\"0.25\" x2=\"5\" y2=\"5\" stroke=\"#ddd\"/>\n"))
      << doc;
  EXPECT_EQ(doc.substr(doc.size() - 7), "</svg>\n");
}

TEST(JsonErrors, PlainErrorsSayWhatWentWrongAndNothingOfCheckpoints) {
  try {
    parse_json("{\"a\":", JsonErrors::kPlain);
    FAIL() << "malformed JSON accepted";
  } catch (const CheckpointError& e) {
    FAIL() << "a plain reader got a CheckpointError: " << e.what();
  } catch (const JsonError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("malformed JSON at byte ", 0), 0u) << e.what();
  }
  const JsonValue v = parse_json("{\"ts\":\"x\",\"list\":[{\"k\":1}]}", JsonErrors::kPlain);
  try {
    v.at("ts", "event").as_double("event.ts");
    FAIL();
  } catch (const JsonError& e) {
    EXPECT_STREQ(e.what(), "event.ts must be a JSON number, got string");
  }
  // Nested values keep the mode of their parse.
  const JsonValue& item = v.at("list", "v").as_array("list")[0];
  try {
    item.at("missing", "list[0]");
    FAIL();
  } catch (const JsonError& e) {
    EXPECT_STREQ(e.what(), "list[0] has no \"missing\" member");
  }
  // A checkpoint's reader (JsonErrors::kCheckpoint) keeps its words and its error type.
  try {
    parse_json("[1,]", JsonErrors::kCheckpoint);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tandem: checkpoint: malformed JSON at byte", 0), 0u)
        << e.what();
  }
  try {
    parse_json("{}", JsonErrors::kCheckpoint).at("format", "manifest");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "not a tandem checkpoint")) << e.what();
  }
}

// Built in code, a value speaks base's words; a dump says what cannot be written in the mode of
// the value dumped, whatever its members' own.
TEST(JsonErrors, BuiltValuesAreBaseWordsUnlessTheDumpedValueAsksForACheckpoints) {
  JsonValue root = JsonValue::object();
  JsonValue inner = JsonValue::object();
  inner.set("x", std::numeric_limits<double>::infinity());
  root.set("inner", std::move(inner));
  try {
    root.dump();
    FAIL() << "a non-finite number was written";
  } catch (const CheckpointError& e) {
    FAIL() << "a plain value got a CheckpointError: " << e.what();
  } catch (const JsonError& e) {
    EXPECT_STREQ(e.what(), "cannot write a non-finite number to JSON");
  }
  root.set_errors(JsonErrors::kCheckpoint);
  try {
    root.dump();
    FAIL() << "a non-finite number was written";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tandem: checkpoint: cannot write a non-finite", 0), 0u)
        << e.what();
  }
}

TEST(FileSystemErrors, NameTheOperationAndThePathNotACheckpoint) {
  const std::string missing = "/proc/self/no/such/dir/file.json";
  for (int op = 0; op < 2; ++op) {
    try {
      if (op == 0) posix_file_system()->read_file(missing);
      if (op == 1) posix_file_system()->write_file_atomically(missing, "x");
      FAIL() << "op " << op;
    } catch (const CheckpointError& e) {
      FAIL() << "the file system spoke of checkpoints: " << e.what();
    } catch (const FileError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(contains(what, "/proc/self/no/such/dir/file.json")) << what;
      EXPECT_TRUE(contains(what, "No such file or directory")) << what;
      EXPECT_FALSE(contains(what, "checkpoint")) << what;
    }
  }
}

}  // namespace
}  // namespace tandem
