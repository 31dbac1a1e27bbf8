// SVG rendering for Plot (see plot_svg.h). Layout: title on top, plot area
// with grid and ticks, axis labels, legend in a column to the right so it
// never hides data.
#include "tools/plot_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace kvs::tools {
namespace {

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Shortest of %.0f / %.1f / %.2f that shows v faithfully.
std::string short_num(double v) {
  for (const char* f : {"%.0f", "%.1f", "%.2f"}) {
    const std::string s = fmt(f, v);
    if (std::fabs(std::stod(s) - v) <= 1e-9 * std::max(1.0, std::fabs(v))) return s;
  }
  return fmt("%.3g", v);
}

// pow2: ticks sit at powers of two, so SI prefixes step by 1024 (a "4K"
// context is 4096 tokens) and labels stay short.
std::string tick_label(double v, TickFormat f, bool pow2) {
  if (v == 0) return "0";
  if (f == TickFormat::Bytes) {
    static const char* n[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int k = 0;
    while (std::fabs(v) >= 1024 && k < 5) v /= 1024, ++k;
    return short_num(v) + " " + n[k];
  }
  if (f == TickFormat::SI) {
    static const char* n[] = {"", "K", "M", "G", "T", "P"};
    const double base = pow2 ? 1024 : 1000;
    int k = 0;
    while (std::fabs(v) >= base && k < 5) v /= base, ++k;
    return short_num(v) + n[k];
  }
  if (std::fabs(v) >= 1e6 || std::fabs(v) < 1e-3) return fmt("%.3g", v);
  return short_num(v);
}

struct Axis {
  bool log = false;
  double lo = 0, hi = 1;  // in data units
  double p0 = 0, p1 = 1;  // pixels for lo and hi
  double map(double v) const {
    const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    return p0 + t * (p1 - p0);
  }
  bool inside(double v) const { return log ? v > 0 : std::isfinite(v); }
};

double nice_step(double range, int target) {
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

// Fits the axis range to [dmin, dmax] (rounded outwards) and returns tick positions.
std::vector<double> fit_axis(Axis& a, double dmin, double dmax, bool pow2) {
  std::vector<double> ticks;
  if (a.log) {
    if (pow2) {
      int e0 = int(std::floor(std::log2(dmin) + 1e-9)), e1 = int(std::ceil(std::log2(dmax) - 1e-9));
      if (e1 <= e0) e1 = e0 + 1;
      int step = 1;
      while ((e1 - e0) / step > 10) ++step;
      e0 -= ((e0 % step) + step) % step;  // align ticks to multiples of step (1 KiB, 1 MiB ...)
      a.lo = std::ldexp(1.0, e0);
      a.hi = std::ldexp(1.0, e1);
      for (int e = e0; e <= e1; e += step) ticks.push_back(std::ldexp(1.0, e));
    } else {
      int e0 = int(std::floor(std::log10(dmin) + 1e-9)), e1 = int(std::ceil(std::log10(dmax) - 1e-9));
      if (e1 <= e0) e1 = e0 + 1;
      a.lo = std::pow(10.0, e0);
      a.hi = std::pow(10.0, e1);
      const int step = (e1 - e0) > 8 ? 2 : 1;
      for (int e = e0; e <= e1; e += step) {
        ticks.push_back(std::pow(10.0, e));
        if (e1 - e0 <= 2 && e < e1)
          for (double m : {2.0, 5.0}) ticks.push_back(m * std::pow(10.0, e));
      }
    }
  } else {
    if (dmax <= dmin) dmax = dmin + (dmin == 0 ? 1 : std::fabs(dmin) * 0.1);
    const double step = nice_step(dmax - dmin, 6);
    a.lo = std::floor(dmin / step + 1e-9) * step;
    a.hi = std::ceil(dmax / step - 1e-9) * step;
    for (double v = a.lo; v <= a.hi + step * 1e-6; v += step) ticks.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  }
  std::sort(ticks.begin(), ticks.end());
  return ticks;
}

}  // namespace

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string Plot::render() const {
  // Data extent over every series (and reference lines, so they stay visible).
  const double inf = std::numeric_limits<double>::infinity();
  double xmin = inf, xmax = -inf, ymin = inf, ymax = -inf;
  for (const auto& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if (log_x && x <= 0) throw std::invalid_argument("plot '" + title + "': series '" + s.name + "' has x <= 0 on a log axis");
      if (log_y && y <= 0) throw std::invalid_argument("plot '" + title + "': series '" + s.name + "' has y <= 0 on a log axis");
      xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  if (!(xmin <= xmax)) throw std::invalid_argument("plot '" + title + "': no finite data points");
  for (const auto& l : lines) {
    if (!std::isfinite(l.at) || ((l.vertical ? log_x : log_y) && l.at <= 0)) continue;
    if (l.vertical) xmin = std::min(xmin, l.at), xmax = std::max(xmax, l.at);
    else ymin = std::min(ymin, l.at), ymax = std::max(ymax, l.at);
  }
  if (x_min < x_max) xmin = x_min, xmax = x_max;
  if (y_min < y_max) ymin = y_min, ymax = y_max;

  const double L = 92, R = 230, T = 48, B = 64;
  Axis ax{log_x, 0, 1, L, double(width) - R}, ay{log_y, 0, 1, double(height) - B, T};
  const std::vector<double> xt = fit_axis(ax, xmin, xmax, pow2_x);
  const std::vector<double> yt = fit_axis(ay, ymin, ymax, pow2_y);
  if (x_min < x_max) ax.lo = x_min, ax.hi = x_max;
  if (y_min < y_max) ay.lo = y_min, ay.hi = y_max;
  const double px0 = ax.p0, px1 = ax.p1, py0 = ay.p1, py1 = ay.p0;  // plot box (py0 top)
  const auto clampx = [&](double v) { return std::clamp(v, px0, px1); };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << ' ' << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height << "\" fill=\"white\"/>\n";
  o << "<defs><clipPath id=\"area\"><rect x=\"" << px0 << "\" y=\"" << py0 << "\" width=\"" << px1 - px0
    << "\" height=\"" << py1 - py0 << "\"/></clipPath></defs>\n";
  o << "<text x=\"" << (px0 + px1) / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">"
    << svg_escape(title) << "</text>\n";

  // Shaded regions first so grid, lines and data draw over them.
  for (const auto& r : regions) {
    double a = r.x0, b = r.x1;
    if (log_x) a = std::max(a, ax.lo), b = std::max(b, ax.lo);
    const double xa = clampx(ax.map(a)), xb = clampx(ax.map(b));
    if (xb - xa < 0.5) continue;
    o << "<rect x=\"" << xa << "\" y=\"" << py0 << "\" width=\"" << xb - xa << "\" height=\"" << py1 - py0
      << "\" fill=\"" << svg_escape(r.color) << "\" fill-opacity=\"0.25\"/>\n";
    if (!r.label.empty())
      o << "<text x=\"" << (xa + xb) / 2 << "\" y=\"" << py0 + 16 << "\" text-anchor=\"middle\" fill=\"#333\">"
        << svg_escape(r.label) << "</text>\n";
  }

  // Grid and ticks.
  for (double t : xt) {
    if (t < ax.lo * (1 - 1e-9) || t > ax.hi * (1 + 1e-9)) continue;
    const double x = ax.map(t);
    o << "<line x1=\"" << x << "\" y1=\"" << py0 << "\" x2=\"" << x << "\" y2=\"" << py1
      << "\" stroke=\"#e5e5e5\"/>\n";
    o << "<line x1=\"" << x << "\" y1=\"" << py1 << "\" x2=\"" << x << "\" y2=\"" << py1 + 5 << "\" stroke=\"black\"/>\n";
    o << "<text x=\"" << x << "\" y=\"" << py1 + 19 << "\" text-anchor=\"middle\">" << svg_escape(tick_label(t, x_format, pow2_x && log_x))
      << "</text>\n";
  }
  for (double t : yt) {
    if (t < ay.lo * (1 - 1e-9) || t > ay.hi * (1 + 1e-9)) continue;
    const double y = ay.map(t);
    o << "<line x1=\"" << px0 << "\" y1=\"" << y << "\" x2=\"" << px1 << "\" y2=\"" << y << "\" stroke=\"#e5e5e5\"/>\n";
    o << "<line x1=\"" << px0 - 5 << "\" y1=\"" << y << "\" x2=\"" << px0 << "\" y2=\"" << y << "\" stroke=\"black\"/>\n";
    o << "<text x=\"" << px0 - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << svg_escape(tick_label(t, y_format, pow2_y && log_y))
      << "</text>\n";
  }
  o << "<rect x=\"" << px0 << "\" y=\"" << py0 << "\" width=\"" << px1 - px0 << "\" height=\"" << py1 - py0
    << "\" fill=\"none\" stroke=\"black\"/>\n";
  o << "<text x=\"" << (px0 + px1) / 2 << "\" y=\"" << height - 18 << "\" text-anchor=\"middle\" font-size=\"13\">"
    << svg_escape(x_label) << "</text>\n";
  o << "<text x=\"20\" y=\"" << (py0 + py1) / 2 << "\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 20 "
    << (py0 + py1) / 2 << ")\">" << svg_escape(y_label) << "</text>\n";

  // Reference lines.
  std::vector<double> bottom_label_x;
  for (const auto& l : lines) {
    if (!std::isfinite(l.at) || ((l.vertical ? log_x : log_y) && l.at <= 0)) continue;
    if (l.vertical) {
      if (l.at < ax.lo || l.at > ax.hi) continue;
      const double x = ax.map(l.at);
      o << "<line x1=\"" << x << "\" y1=\"" << py0 << "\" x2=\"" << x << "\" y2=\"" << py1 << "\" stroke=\""
        << svg_escape(l.color) << "\" stroke-dasharray=\"2,3\"/>\n";
      if (!l.label.empty()) {
        // Labels read upwards from the bottom; one that would overprint an
        // earlier bottom label hangs down from the top instead.
        bool top = false;
        for (double bx : bottom_label_x) top = top || std::fabs(bx - x) < 14;
        const double ly = top ? py0 + 8 : py1 - 8;
        if (!top) bottom_label_x.push_back(x);
        o << "<text x=\"" << x + 4 << "\" y=\"" << ly << "\" fill=\"" << svg_escape(l.color) << "\""
          << (top ? " text-anchor=\"end\"" : "") << " transform=\"rotate(-90 " << x + 4 << ' ' << ly << ")\">"
          << svg_escape(l.label) << "</text>\n";
      }
    } else {
      if (l.at < ay.lo || l.at > ay.hi) continue;
      const double y = ay.map(l.at);
      o << "<line x1=\"" << px0 << "\" y1=\"" << y << "\" x2=\"" << px1 << "\" y2=\"" << y << "\" stroke=\""
        << svg_escape(l.color) << "\" stroke-dasharray=\"2,3\"/>\n";
      if (!l.label.empty())
        o << "<text x=\"" << px0 + 6 << "\" y=\"" << y - 5 << "\" fill=\"" << svg_escape(l.color) << "\">"
          << svg_escape(l.label) << "</text>\n";
    }
  }

  // Series, clipped to the plot box; a point outside a log domain breaks the line.
  int ci = 0;
  std::vector<std::string> colors;
  for (const auto& s : series) {
    const std::string color = s.color.empty() ? kPalette[ci++ % 8] : s.color;
    colors.push_back(color);
    std::ostringstream d;
    bool pen = false;
    for (auto [x, y] : s.points) {
      if (!ax.inside(x) || !ay.inside(y)) { pen = false; continue; }
      d << (pen ? " L" : " M") << fmt("%.2f", ax.map(x)) << ',' << fmt("%.2f", ay.map(y));
      pen = true;
    }
    o << "<g clip-path=\"url(#area)\">";
    if (!d.str().empty())
      o << "<path d=\"" << d.str().substr(1) << "\" fill=\"none\" stroke=\"" << svg_escape(color)
        << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/>";
    if (s.markers)
      for (auto [x, y] : s.points)
        if (ax.inside(x) && ay.inside(y))
          o << "<circle cx=\"" << fmt("%.2f", ax.map(x)) << "\" cy=\"" << fmt("%.2f", ay.map(y)) << "\" r=\"3\" fill=\""
            << svg_escape(color) << "\"/>";
    o << "</g>\n";
  }

  // Legend column to the right of the plot.
  double ly = py0 + 10;
  for (size_t i = 0; i < series.size(); ++i, ly += 20) {
    const double lx = px1 + 16;
    o << "<line x1=\"" << lx << "\" y1=\"" << ly << "\" x2=\"" << lx + 24 << "\" y2=\"" << ly << "\" stroke=\""
      << svg_escape(colors[i]) << "\" stroke-width=\"2\"" << (series[i].dashed ? " stroke-dasharray=\"6,4\"" : "")
      << "/>\n";
    o << "<text x=\"" << lx + 30 << "\" y=\"" << ly + 4 << "\">" << svg_escape(series[i].name) << "</text>\n";
  }
  for (const auto& r : regions) {
    if (r.label.empty()) continue;
    const double lx = px1 + 16;
    o << "<rect x=\"" << lx << "\" y=\"" << ly - 7 << "\" width=\"24\" height=\"12\" fill=\"" << svg_escape(r.color)
      << "\" fill-opacity=\"0.25\"/>\n";
    o << "<text x=\"" << lx + 30 << "\" y=\"" << ly + 4 << "\">" << svg_escape(r.label) << "</text>\n";
    ly += 20;
  }
  o << "</svg>\n";
  return o.str();
}

void Plot::write(const std::string& path) const {
  const std::string s = render();
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write plot to '" + path + "'");
  f << s;
  if (!f.flush()) throw std::runtime_error("error writing plot to '" + path + "'");
}

}  // namespace kvs::tools
