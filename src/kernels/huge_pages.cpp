#include "kernels/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <string>

namespace kvs {

namespace {

constexpr size_t kHuge = size_t(2) << 20;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

bool huge_pages_requested() {
  static const bool on = [] {
    const char* e = std::getenv("KVS_HUGE_PAGES");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void* map_large(size_t bytes) {
  if (bytes == 0) throw std::bad_alloc();
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t len = round_up(bytes, page);
  const bool huge = huge_pages_requested() && len >= kHuge;
  // Over-map by one huge page and trim both ends, so the buffer starts on
  // a huge-page boundary (an unaligned start would leave its first and
  // last pages, and with them every page in between, at 4 KiB).
  const size_t span = huge ? len + kHuge : len;
  void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  if (!huge) return m;
  const uintptr_t a = reinterpret_cast<uintptr_t>(m), start = round_up(a, kHuge);
  if (start > a) munmap(m, start - a);
  const uintptr_t end = start + len, span_end = a + span;
  if (span_end > end) munmap(reinterpret_cast<void*>(end), span_end - end);
  void* p = reinterpret_cast<void*>(start);
  madvise(p, len, MADV_HUGEPAGE);  // a request: refused (THP off) it changes nothing
  return p;
}

void unmap_large(void* p, size_t bytes) {
  if (!p || bytes == 0) return;
  munmap(p, round_up(bytes, size_t(sysconf(_SC_PAGESIZE))));
}

size_t huge_bytes_in(const void* p, size_t bytes) {
  std::ifstream in("/proc/self/smaps");
  if (!in) return 0;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
  size_t total = 0;
  bool inside = false;
  std::string line;
  while (std::getline(in, line)) {
    uintptr_t s = 0, e = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> s >> dash >> e && dash == '-') {  // a mapping's first line
      inside = s < hi && e > lo;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) total += size_t(std::stoull(line.substr(14))) * 1024;
  }
  return total;
}

}  // namespace kvs
