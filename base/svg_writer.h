// SVG: the one writer of tandem's pictures. The pipeline schedule drawing
// (runtime/pipeline/simulate.cpp, to_svg) and the timeline drawing (tools/trace-tools/trace_svg.cpp)
// lay out their boxes and put them into an SvgWriter, which owns the markup: the document
// frame, element syntax, number formatting and the escaping of every text and tooltip
// (strings::xml_escape), so a name from a trace or a schedule can never break the file.
//
// Attributes other than geometry are passed as ready markup (`fill="#4e79a7" class="lane"`): the
// callers' constants, never user text.
// Ownership: the writer owns the text. Thread-safety: one writer per thread. Errors: none.
#pragma once

#include <string>
#include <string_view>

namespace tandem {

class SvgWriter {
 public:
  // <rect x y width height attrs>, with <title>tooltip</title> inside when there is a tooltip.
  void rect(double x, double y, double width, double height, std::string_view attrs,
            std::string_view tooltip = {});
  // <text x y attrs>content</text>
  void text(double x, double y, std::string_view content, std::string_view attrs = {});
  // <line x1 y1 x2 y2 attrs/>
  void line(double x1, double y1, double x2, double y2, std::string_view attrs);

  // The document: <svg width height font-family="sans-serif" attrs>, the `style` sheet (may be
  // empty), a white background, the elements in the order they were added (later ones on top).
  std::string finish(double width, double height, std::string_view attrs = {},
                     std::string_view style = {}) const;

 private:
  std::string out_;  // the elements
};

}  // namespace tandem
