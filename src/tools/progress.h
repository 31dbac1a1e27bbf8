// A progress bar with ETA for long command-line work (model repack, eval and
// perplexity chunks, bench repetitions). It draws on stderr only when stderr
// is a terminal, redrawing one line in place; otherwise it writes nothing,
// so logs and CI output stay as they were.
//
//   tools::Progress bar("repack", n_tensors);
//   ... bar.update(done); ...          // any thread
//   bar.finish();                      // ends the line (also on destruction)
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace kvs::tools {

class Progress {
 public:
  // Draws on stderr when it is a terminal.
  Progress(std::string label, int64_t total);
  // Draws on `fd` when `enabled` (tests: a pipe, a pseudo-terminal).
  Progress(std::string label, int64_t total, int fd, bool enabled);
  ~Progress();  // finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return enabled_; }
  // `done` of `total` units are finished; `note` follows the bar. Thread-
  // safe; redraws at most every tenth of a second, and always at the end.
  void update(int64_t done, const std::string& note = "");
  // The same when the total is learnt along the way (a callback that passes it).
  void update_total(int64_t done, int64_t total, const std::string& note = "");
  // Ends the line (once; nothing when not drawing).
  void finish();

  // One frame: "label [#####-----]  12/40  30%  ETA 1m05s  note".
  static std::string render(const std::string& label, int64_t done, int64_t total, double elapsed_s,
                            const std::string& note, int width = 30);

 private:
  std::string label_;
  std::atomic<int64_t> total_;
  int fd_;
  bool enabled_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_draw_{};
  bool drawn_ = false, finished_ = false;
};

// "45s", "3m07s", "1h02m".
std::string format_duration(double seconds);

}  // namespace kvs::tools
