// A timeline as a self-contained SVG picture (tandem-trace svg, tandemrun --trace-dir). Torch-free.
//
// One band per rank; inside it one lane per thread (named from the trace's thread_name metadata)
// and one lane for the rank's asynchronous spans (bucket reduces), nested spans stacked below
// their parent. Spans are coloured by category (compute, comm, codec, wait, pipeline,
// checkpoint; legend at the top), carry a tooltip (<title>: name, duration, arguments) and are
// placed on a millisecond axis from the trace's first event. Spans narrower than a third of a pixel
// are left out and counted in the caption, so the file stays small for long runs: narrow the window
// (from_ms/to_ms) to see them.
//
// Thread-safety: pure function. Errors: Error when the value is not a Chrome trace or the window
// is empty.
#pragma once

#include "base/json.h"

#include <string>

namespace tandem::trace {

struct SvgOptions {
  double from_ms = 0;  // window start, ms after the first event
  double to_ms = 0;    // window end; 0: the last event's end
  int width = 1400;    // pixels of the time axis
};

std::string timeline_svg(const JsonValue& trace, const SvgOptions& options = {});

}  // namespace tandem::trace
