// tandem-trace: merge the ranks' timelines and summarise where the time went (docs/timeline.md).
//
//   tandem-trace merge DIR [-o DIR/timeline.json]   rank*.json -> one Chrome trace (pid = rank)
//   tandem-trace summary TIMELINE.json              compute / comm / overlap / bubble table
//   tandem-trace svg TIMELINE.json [-o F.svg]       a picture: lanes per rank and thread
//   tandem-trace flight DIR                         flight-recorder dumps: who is behind, where
//                                                   the ranks disagree, what each waited on
//
// Exit status: 0 done, 1 the files could not be read or written, 2 bad command line.
#include <CLI/CLI.hpp>
#include <tandem/base/errors.h>

#include <cstdio>
#include <string>

#include "base/json.h"
#include "tools/trace-tools/flight_analysis.h"
#include "tools/trace-tools/trace_merge.h"
#include "tools/trace-tools/trace_summary.h"
#include "tools/trace-tools/trace_svg.h"

int main(int argc, char** argv) {
  CLI::App app{"Merge and summarise tandem timelines (Chrome-trace JSON, opens in Perfetto)",
               "tandem-trace"};
  app.require_subcommand(1);
  std::string dir, out, timeline;
  auto* merge = app.add_subcommand("merge", "Merge DIR/rank*.json into one timeline");
  merge->add_option("DIR", dir, "Directory the ranks wrote (trace.dir)")->required();
  merge->add_option("-o,--output", out, "Output file (default: DIR/timeline.json)");
  auto* summary = app.add_subcommand("summary", "Print compute/comm/overlap/bubble fractions");
  summary->add_option("TIMELINE", timeline, "A merged timeline or one rank's file")->required();
  std::string svg_in, svg_out;
  tandem::trace::SvgOptions svg_options;
  auto* svg = app.add_subcommand("svg", "Draw a timeline as a self-contained SVG picture");
  svg->add_option("TIMELINE", svg_in, "A merged timeline or one rank's file")->required();
  svg->add_option("-o,--output", svg_out, "Output file (default: TIMELINE with .svg)");
  svg->add_option("--from-ms", svg_options.from_ms, "Window start, ms after the first event")
      ->check(CLI::NonNegativeNumber);
  svg->add_option("--to-ms", svg_options.to_ms, "Window end (default: the end)")
      ->check(CLI::NonNegativeNumber);
  svg->add_option("--width", svg_options.width, "Pixels of the time axis")
      ->check(CLI::Range(200, 100000));
  std::string flight_dir;
  auto* flight = app.add_subcommand("flight", "Read DIR/flight_rank*.json: who is behind, where ranks disagree");
  flight->add_option("DIR", flight_dir, "Directory the ranks dumped to (TANDEM_FLIGHT_RECORDER_DIR)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (merge->parsed()) {
      if (out.empty()) out = dir + "/timeline.json";
      const auto merged = tandem::trace::merge_trace_dir(dir, out);
      const auto s = tandem::trace::summarize(merged);
      std::printf("merged %zu rank(s), %lld spans into %s\n", s.ranks.size(),
                  static_cast<long long>(s.overall.spans), out.c_str());
    } else if (flight->parsed()) {
      const auto dumps = tandem::trace::read_flight_dir(flight_dir);
      std::fputs(tandem::trace::format_flight_report(tandem::trace::analyze_flight(dumps)).c_str(), stdout);
    } else if (svg->parsed()) {
      if (svg_out.empty()) {
        const auto dot = svg_in.rfind(".json");
        svg_out = (dot == std::string::npos ? svg_in : svg_in.substr(0, dot)) + ".svg";
      }
      tandem::trace::write_text_file(
          svg_out, tandem::trace::timeline_svg(tandem::trace::read_trace_file(svg_in), svg_options));
      std::printf("drew %s\n", svg_out.c_str());
    } else {
      const auto s = tandem::trace::summarize(tandem::trace::read_trace_file(timeline));
      std::fputs(tandem::trace::format_summary(s).c_str(), stdout);
    }
  } catch (const tandem::JsonError& e) {  // base/json's bare sentence about a value in the file
    std::fprintf(stderr, "tandem-trace: the file is not a timeline or dump it can read: %s.\n", e.what());
    return 1;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // messages start with "tandem-trace:"
    return 1;
  }
  return 0;
}
