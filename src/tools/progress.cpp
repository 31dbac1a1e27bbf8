#include "tools/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvs::tools {

std::string format_duration(double s) {
  const int64_t t = int64_t(std::llround(std::max(0.0, s)));
  char buf[32];
  if (t < 60) std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  else if (t < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  return buf;
}

std::string Progress::render(const std::string& label, int64_t done, int64_t total, double elapsed_s,
                             const std::string& note, int width) {
  const double frac = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 0.0;
  const int fill = int(frac * width);
  std::string s = label + " [" + std::string(size_t(fill), '#') + std::string(size_t(width - fill), '-') + "]";
  char buf[96];
  std::snprintf(buf, sizeof buf, " %lld/%lld %3.0f%%", (long long)done, (long long)total, 100 * frac);
  s += buf;
  // The rate so far predicts the rest; nothing to say before the first unit.
  if (done >= total && total > 0) s += "  " + format_duration(elapsed_s);
  else if (done > 0) s += "  ETA " + format_duration(elapsed_s * double(total - done) / double(done));
  if (!note.empty()) s += "  " + note;
  return s;
}

Progress::Progress(std::string label, int64_t total) : Progress(std::move(label), total, 2, isatty(2) == 1) {}

Progress::Progress(std::string label, int64_t total, int fd, bool enabled)
    : label_(std::move(label)), total_(total), fd_(fd), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done, const std::string& note) {
  if (!enabled_) return;
  std::lock_guard lk(mu_);
  if (finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  drawn_ = true;
  // Carriage return and erase-line: the bar overwrites itself in place.
  const std::string line =
      "\r\033[K" + render(label_, done, total_, std::chrono::duration<double>(now - start_).count(), note);
  [[maybe_unused]] const ssize_t n = ::write(fd_, line.data(), line.size());
}

void Progress::update_total(int64_t done, int64_t total, const std::string& note) {
  total_ = total;
  update(done, note);
}

void Progress::finish() {
  if (!enabled_) return;
  std::lock_guard lk(mu_);
  if (finished_) return;
  finished_ = true;
  if (drawn_) [[maybe_unused]] const ssize_t n = ::write(fd_, "\n", 1);
}

}  // namespace kvs::tools
