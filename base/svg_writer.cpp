// The SVG writer (base/svg_writer.h).
#include "base/svg_writer.h"

#include "base/strings.h"

#include <cmath>
#include <cstdio>

namespace tandem {

namespace {

// Coordinates with at most two decimals, trailing zeros dropped: small files, sub-pixel places.
void number(std::string& out, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f", std::isfinite(v) ? v : 0.0);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  out += s;
}

void attribute(std::string& out, const char* name, double v) {
  out += ' ';
  out += name;
  out += "=\"";
  number(out, v);
  out += '"';
}

void attributes(std::string& out, std::string_view attrs) {
  if (attrs.empty()) return;
  out += ' ';
  out += attrs;
}

}  // namespace

void SvgWriter::rect(double x, double y, double width, double height, std::string_view attrs,
                     std::string_view tooltip) {
  out_ += "<rect";
  attribute(out_, "x", x);
  attribute(out_, "y", y);
  attribute(out_, "width", width);
  attribute(out_, "height", height);
  attributes(out_, attrs);
  if (tooltip.empty()) {
    out_ += "/>\n";
    return;
  }
  out_ += "><title>" + strings::xml_escape(tooltip) + "</title></rect>\n";
}

void SvgWriter::text(double x, double y, std::string_view content, std::string_view attrs) {
  out_ += "<text";
  attribute(out_, "x", x);
  attribute(out_, "y", y);
  attributes(out_, attrs);
  out_ += '>' + strings::xml_escape(content) + "</text>\n";
}

void SvgWriter::line(double x1, double y1, double x2, double y2, std::string_view attrs) {
  out_ += "<line";
  attribute(out_, "x1", x1);
  attribute(out_, "y1", y1);
  attribute(out_, "x2", x2);
  attribute(out_, "y2", y2);
  attributes(out_, attrs);
  out_ += "/>\n";
}

std::string SvgWriter::finish(double width, double height, std::string_view attrs,
                              std::string_view style) const {
  std::string doc = "<svg xmlns=\"http://www.w3.org/2000/svg\"";
  attribute(doc, "width", width);
  attribute(doc, "height", height);
  doc += " font-family=\"sans-serif\"";
  attributes(doc, attrs);
  doc += ">\n";
  if (!style.empty()) {
    doc += "<style>";
    doc += style;
    doc += "</style>\n";
  }
  doc += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  doc += out_;
  doc += "</svg>\n";
  return doc;
}

}  // namespace tandem
