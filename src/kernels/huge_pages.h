// Anonymous memory for large, long-lived buffers that kernels stream (the
// packed weights, the KV pool): aligned to a 2 MiB huge page and marked
// for transparent huge pages (madvise), so streaming it walks one page
// table entry per 2 MiB instead of per 4 KiB. Under a hypervisor every TLB
// miss is a two-level walk, and a decode step touches every page of the
// weights (docs/PERFORMANCE.md, "Huge pages").
//
// KVS_HUGE_PAGES=0 in the environment leaves the pages at 4 KiB (the
// kernel's THP setting may also: "never" ignores the request; "madvise"
// with defrag may compact memory while the buffer first faults in, which
// is what makes a load slower).
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace kvs {

// Whether map_large() asks for huge pages (KVS_HUGE_PAGES unset or not "0").
bool huge_pages_requested();

// Zeroed read-write memory of `bytes` (> 0), 2 MiB-aligned when at least
// one huge page long; throws std::bad_alloc. Release with unmap_large(p, bytes).
void* map_large(size_t bytes);
void unmap_large(void* p, size_t bytes);

// How many bytes of [p, p + bytes) the kernel backs with huge pages now
// (from /proc/self/smaps; 0 where that cannot be read). For tests and --verbose.
size_t huge_bytes_in(const void* p, size_t bytes);

// std::vector storage that takes map_large() from one huge page up (the
// engine's activations: a GEMM's outputs are rows a whole row apart, so
// each row is its own 4 KiB page) and the heap below that.
template <class T>
struct LargeAllocator {
  using value_type = T;
  LargeAllocator() = default;
  template <class U>
  LargeAllocator(const LargeAllocator<U>&) {}
  static bool large(size_t n) { return n * sizeof(T) >= (size_t(2) << 20); }
  T* allocate(size_t n) {
    return static_cast<T*>(large(n) ? map_large(n * sizeof(T)) : ::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, size_t n) {
    if (large(n)) unmap_large(p, n * sizeof(T));
    else ::operator delete(p, std::align_val_t(64));
  }
  template <class U>
  bool operator==(const LargeAllocator<U>&) const { return true; }
};
template <class T>
using LargeVec = std::vector<T, LargeAllocator<T>>;

}  // namespace kvs
