// A small self-contained SVG line-plot writer for the planning tools: axes
// with ticks and labels, linear or log scales, several series with a legend,
// shaded x-ranges and reference lines. Output is plain SVG 1.1 text that any
// browser or GitHub renders; no plotting dependency is needed.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace kvs::tools {

enum class TickFormat { Plain, Bytes, SI };  // 1500 / "1.46 KiB" / "1.5K"

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); need not be sorted
  std::string color;   // CSS colour; empty = next from the palette
  bool dashed = false;
  bool markers = false;  // draw a dot at each point
};

struct PlotRegion {  // shaded vertical band x0..x1 with a label at its top
  double x0 = 0, x1 = 0;
  std::string color = "#cccccc";
  std::string label;
};

struct PlotLine {  // reference line: vertical at x (vertical=true) or horizontal at y
  double at = 0;
  bool vertical = true;
  std::string label;
  std::string color = "#555555";
};

struct Plot {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  // On a log axis, put ticks at powers of two (1, 2, 4 ... or 1 KiB, 4 KiB ...)
  // instead of powers of ten; natural for batch sizes, contexts and bytes.
  bool pow2_x = false, pow2_y = false;
  TickFormat x_format = TickFormat::Plain, y_format = TickFormat::Plain;
  int width = 820, height = 520;
  // Axis ranges; when min >= max the range is fitted to the data.
  double x_min = 0, x_max = 0, y_min = 0, y_max = 0;
  std::vector<PlotSeries> series;
  std::vector<PlotRegion> regions;
  std::vector<PlotLine> lines;

  // Throws std::invalid_argument when a log axis meets a value <= 0 or no
  // finite data is present.
  std::string render() const;
  void write(const std::string& path) const;  // throws std::runtime_error on I/O failure
};

// Escapes &, <, >, " for SVG text and attributes.
std::string svg_escape(const std::string& s);

}  // namespace kvs::tools
