// Panel16 repacking (layout in weight_pack.h) and the arena that holds it.
#include "kernels/weight_pack.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "kernels/cpu.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant_internal.h"

namespace kvs {
namespace {

constexpr int64_t kLanes = 16;

constexpr int64_t kQ4KUnit = 2368;  // one Q4_K super-block of 16 rows (weight_pack.h)
constexpr int64_t kQ6KUnit = 3392;  // one Q6_K super-block of 16 rows

int64_t level_bytes(GgmlType t) { return t == GgmlType::Q8_0 ? 512 : 256; }
int64_t unit_bytes(GgmlType t) { return 2 * level_bytes(t) + 64; }
int64_t panel_bytes(const WeightView& w) {
  if (mm::is_float_type(w.type)) return w.cols * kLanes * (w.type == GgmlType::F32 ? 4 : 2);
  if (w.type == GgmlType::Q4_K) return w.cols / QK_K * kQ4KUnit;
  if (w.type == GgmlType::Q6_K) return w.cols / QK_K * kQ6KUnit;
  const int64_t nb = w.cols / mm::kQBlock;
  return (nb + 1) / 2 * unit_bytes(w.type);
}

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

bool repack_enabled() {
  const char* v = std::getenv("KVS_REPACK");
  return !(v && std::string(v) == "0");
}

bool packable(const WeightView& w) {
  if (w.type != GgmlType::Q8_0 && w.type != GgmlType::Q4_0 && w.type != GgmlType::Q4_K &&
      w.type != GgmlType::Q6_K && !mm::is_float_type(w.type))
    return false;
  if (w.rows <= 0 || w.cols <= 0 || w.cols % type_traits(w.type).block_elems != 0) return false;
  return active_isa() == Isa::Avx512;
}

size_t packed_size(const WeightView& w) {
  return size_t((w.rows + kLanes - 1) / kLanes) * size_t(panel_bytes(w));
}

namespace {

// Q4_K panels [p_begin, p_end): per super-block, the nibble bytes as 4
// pairs x 8 vectors, then d[16], dmin[16] (fp16), then the decoded 6-bit
// scales [8][16] and mins [8][16] as bytes.
void pack_panels_q4k(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end) {
  const int64_t nsb = w.cols / QK_K, pb = panel_bytes(w);
  for (int64_t p = p_begin; p < p_end; ++p) {
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      const int64_t r = std::min(p * kLanes + lane, w.rows - 1);
      const auto* blocks = reinterpret_cast<const BlockQ4_K*>(w.row(r));
      for (int64_t u = 0; u < nsb; ++u) {
        const BlockQ4_K& b = blocks[u];
        uint8_t* unit = dst + p * pb + u * kQ4KUnit;
        for (int c = 0; c < 4; ++c)
          for (int k = 0; k < 8; ++k)
            std::memcpy(unit + (8 * c + k) * 64 + 4 * lane, b.qs + 32 * c + 4 * k, 4);
        std::memcpy(unit + 2048 + 2 * lane, &b.d, 2);
        std::memcpy(unit + 2048 + 32 + 2 * lane, &b.dmin, 2);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          detail::get_scale_min_k4(j, b.scales, &sc, &m);
          unit[2112 + 16 * j + lane] = sc;
          unit[2240 + 16 * j + lane] = m;
        }
      }
    }
  }
}

// Q6_K panels [p_begin, p_end): per super-block, ql as 2 halves x 16
// vectors, qh as 2 halves x 8 vectors, the 16 int8 scales per lane, d.
void pack_panels_q6k(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end) {
  const int64_t nsb = w.cols / QK_K, pb = panel_bytes(w);
  for (int64_t p = p_begin; p < p_end; ++p) {
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      const int64_t r = std::min(p * kLanes + lane, w.rows - 1);
      const auto* blocks = reinterpret_cast<const BlockQ6_K*>(w.row(r));
      for (int64_t u = 0; u < nsb; ++u) {
        const BlockQ6_K& b = blocks[u];
        uint8_t* unit = dst + p * pb + u * kQ6KUnit;
        for (int v = 0; v < 32; ++v) std::memcpy(unit + v * 64 + 4 * lane, b.ql + 4 * v, 4);
        for (int v = 0; v < 16; ++v) std::memcpy(unit + 2048 + v * 64 + 4 * lane, b.qh + 4 * v, 4);
        for (int i = 0; i < 16; ++i) unit[3072 + 16 * i + lane] = uint8_t(b.scales[i]);
        std::memcpy(unit + 3328 + 2 * lane, &b.d, 2);
        if (lane == 0) std::memset(unit + 3360, 0, 32);  // padding to a whole cache line
      }
    }
  }
}

// Float panels [p_begin, p_end): element k of the 16 rows is 16 values
// in the file's type, lane order. A panel (16 rows x cols) is at most a few
// hundred KB, so the strided writes stay in cache.
void pack_panels_float(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end) {
  const int64_t es = w.type == GgmlType::F32 ? 4 : 2, pb = panel_bytes(w);
  for (int64_t p = p_begin; p < p_end; ++p) {
    uint8_t* pan = dst + p * pb;
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      const uint8_t* row = w.row(std::min(p * kLanes + lane, w.rows - 1));
      uint8_t* d = pan + lane * es;
      if (es == 2) {
        for (int64_t k = 0; k < w.cols; ++k) std::memcpy(d + k * kLanes * 2, row + 2 * k, 2);
      } else {
        for (int64_t k = 0; k < w.cols; ++k) std::memcpy(d + k * kLanes * 4, row + 4 * k, 4);
      }
    }
  }
}

// Panels [p_begin, p_end) of the Panel16 copy.
void pack_panels(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end) {
  if (mm::is_float_type(w.type)) return pack_panels_float(w, dst, p_begin, p_end);
  if (w.type == GgmlType::Q4_K) return pack_panels_q4k(w, dst, p_begin, p_end);
  if (w.type == GgmlType::Q6_K) return pack_panels_q6k(w, dst, p_begin, p_end);
  const int64_t nb = w.cols / mm::kQBlock, lb = level_bytes(w.type), ub = unit_bytes(w.type);
  const int64_t pb = panel_bytes(w);
  const bool q8 = w.type == GgmlType::Q8_0;
  for (int64_t p = p_begin; p < p_end; ++p) {
    if (nb % 2) std::memset(dst + p * pb + (nb / 2) * ub + lb, 0, size_t(lb));  // the empty half unit
    uint8_t* pan = dst + p * pb;
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      const int64_t r = std::min(p * kLanes + lane, w.rows - 1);  // tail lanes repeat the last row
      const uint8_t* row = w.row(r);
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* unit = pan + (b / 2) * ub;
        uint8_t* lev = unit + (b % 2) * lb;       // [LB] levels of block b
        uint8_t* sc = unit + 2 * lb + (b % 2) * 32;  // [16] fp16 scales
        uint16_t d;
        if (q8) {
          const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
          std::memcpy(&d, &blk->d, 2);
          for (int k = 0; k < 8; ++k)
            for (int j = 0; j < 4; ++j)
              lev[64 * k + 4 * lane + j] = uint8_t(blk->qs[4 * k + j]) ^ 0x80;  // u = q + 128
        } else {
          const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
          std::memcpy(&d, &blk->d, 2);
          for (int k = 0; k < 4; ++k)
            for (int j = 0; j < 4; ++j) lev[64 * k + 4 * lane + j] = blk->qs[4 * k + j];
        }
        std::memcpy(sc + 2 * lane, &d, 2);
      }
    }
  }
}

}  // namespace

void pack_panel16(const WeightView& w, uint8_t* dst) {
  if (!(w.type == GgmlType::Q8_0 || w.type == GgmlType::Q4_0 || w.type == GgmlType::Q4_K ||
        w.type == GgmlType::Q6_K || mm::is_float_type(w.type)))
    throw std::invalid_argument("pack_panel16: unsupported type " + type_name(w.type));
  pack_panels(w, dst, 0, (w.rows + kLanes - 1) / kLanes);
}

PackedArena::PackedArena(size_t bytes) {
  if (bytes == 0) return;
  const size_t len = round_up(bytes, size_t(sysconf(_SC_PAGESIZE)));
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  // No MADV_HUGEPAGE: measured no decode gain on this VM, and faulting in
  // huge pages doubled the load time (2.3 s vs 1.1 s for 1.2 GB).
  base_ = static_cast<uint8_t*>(m);
  size_ = len;
}

PackedArena::PackedArena(PackedArena&& o) noexcept : base_(o.base_), size_(o.size_) {
  o.base_ = nullptr;
  o.size_ = 0;
}

PackedArena& PackedArena::operator=(PackedArena&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, size_);
    base_ = o.base_;
    size_ = o.size_;
    o.base_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

PackedArena::~PackedArena() {
  if (base_) munmap(base_, size_);
}

void release_mapped_pages(const void* p, size_t n) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = round_up(a, page), hi = (a + n) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

PackedArena pack_weights(const std::vector<PackItem>& items,
                         const std::function<void(int64_t done, int64_t total)>& on_matrix) {
  size_t total = 0;
  for (const PackItem& it : items)
    if (packable(*it.w)) total += round_up(packed_size(*it.w), 64);
  PackedArena arena(total);
  // Jobs of up to 64 panels; the copy is bound by page faults and memory,
  // so every core helps (1.2 GB: ~1.1 s on one thread).
  struct Job {
    size_t item;
    int64_t p0, p1;
  };
  std::vector<Job> jobs;
  std::vector<uint8_t*> dst(items.size(), nullptr);
  std::vector<std::atomic<int64_t>> left(items.size());  // jobs not yet done, per matrix
  size_t off = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const WeightView& w = *items[i].w;
    if (!packable(w)) continue;
    dst[i] = arena.data() + off;
    const int64_t panels = (w.rows + kLanes - 1) / kLanes;
    for (int64_t p = 0; p < panels; p += 64) jobs.push_back({i, p, std::min(panels, p + 64)});
    left[i] = (panels + 63) / 64;
    off += round_up(packed_size(w), 64);
  }
  assert(off == total);
  std::atomic<size_t> next{0};
  int64_t n_matrices = 0;
  for (uint8_t* d : dst) n_matrices += d != nullptr;
  std::atomic<int64_t> matrices_done{0};
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const Job& job = jobs[j];
      const PackItem& it = items[job.item];
      pack_panels(*it.w, dst[job.item], job.p0, job.p1);
      // The last job of a matrix drops its file pages at once, so resident
      // memory peaks near one copy of the weights, not two.
      if (left[job.item].fetch_sub(1) == 1) {
        if (it.release_source) release_mapped_pages(it.w->data, size_t(it.w->rows) * it.w->row_stride);
        if (on_matrix) on_matrix(matrices_done.fetch_add(1) + 1, n_matrices);
      }
    }
  };
  const unsigned nt = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), 8);
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < nt && t < jobs.size(); ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < items.size(); ++i) {
    if (!dst[i]) continue;
    items[i].w->packed = dst[i];
    items[i].w->pack = PackLayout::Panel16;
  }
  return arena;
}

}  // namespace kvs
