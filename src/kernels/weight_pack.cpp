// Panel16 / Panel8 repacking (layout in weight_pack.h) and the arena that holds it.
#include "kernels/weight_pack.h"

#include <emmintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "kernels/cpu.h"
#include "kernels/huge_pages.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant_internal.h"

namespace kvs {
namespace {

// Rows per panel: one per lane of the layout's vectors.
int64_t lanes_of(PackLayout l) { return l == PackLayout::Panel8 ? 8 : 16; }

// Unit sizes in bytes per lane (weight_pack.h): Q4_K 148, Q5_K 180, Q6_K 212.
int64_t q4k_unit(int64_t lanes) { return 148 * lanes; }
int64_t q5k_unit(int64_t lanes) { return 180 * lanes; }
int64_t q6k_unit(int64_t lanes) { return 212 * lanes; }

// The 32-element formats (Q8_0, Q4_0, MXFP4): blocks per unit, level and
// scale bytes per block, bytes per unit.
int64_t unit_blocks(GgmlType t) { return t == GgmlType::MXFP4 ? 4 : 2; }
int64_t level_bytes(GgmlType t, int64_t lanes) { return lanes * (t == GgmlType::Q8_0 ? 32 : 16); }
int64_t scale_bytes(GgmlType t, int64_t lanes) { return lanes * (t == GgmlType::MXFP4 ? 1 : 2); }
int64_t unit_bytes(GgmlType t, int64_t lanes) {
  return unit_blocks(t) * (level_bytes(t, lanes) + scale_bytes(t, lanes));
}
// AmxBf16: cols rounded up to whole 32-element chunks, 2 bytes each, 16 rows.
int64_t bf16_cols(const WeightView& w) { return mm::bf16_chunks(w.cols) * 32; }

int64_t panel_bytes(const WeightView& w, int64_t lanes) {
  if (mm::is_float_type(w.type)) return w.cols * lanes * (w.type == GgmlType::F32 ? 4 : 2);
  if (w.type == GgmlType::Q4_K) return w.cols / QK_K * q4k_unit(lanes);
  if (w.type == GgmlType::Q5_K) return w.cols / QK_K * q5k_unit(lanes);
  if (w.type == GgmlType::Q6_K) return w.cols / QK_K * q6k_unit(lanes);
  const int64_t nb = w.cols / mm::kQBlock, per = unit_blocks(w.type);
  return (nb + per - 1) / per * unit_bytes(w.type, lanes);
}

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

bool repack_enabled() {
  const char* v = std::getenv("KVS_REPACK");
  return !(v && std::string(v) == "0");
}

PackLayout pack_layout_for(Isa isa) {
  switch (isa) {
    case Isa::Amx:  // the AMX kernels read the same copy
    case Isa::Avx512: return PackLayout::Panel16;
    case Isa::Avx2: return PackLayout::Panel8;
    default: return PackLayout::None;
  }
}

bool packable(const WeightView& w, PackLayout layout) {
  if (layout == PackLayout::AmxBf16)  // the conversion runs vcvtneps2bf16
    return w.rows > 0 && w.cols > 0 && mm::is_float_type(w.type) && cpu_features().avx512bf16;
  const bool quant = w.type == GgmlType::Q8_0 || w.type == GgmlType::Q4_0 || w.type == GgmlType::Q4_K ||
                     w.type == GgmlType::Q5_K || w.type == GgmlType::Q6_K || w.type == GgmlType::MXFP4;
  if (w.rows <= 0 || w.cols <= 0 || w.cols % type_traits(w.type).block_elems != 0) return false;
  return layout != PackLayout::None && (quant || mm::is_float_type(w.type));
}

bool packable(const WeightView& w) { return packable(w, pack_layout_for(active_isa())); }

size_t packed_size(const WeightView& w, PackLayout layout) {
  const int64_t lanes = lanes_of(layout);
  const int64_t pb = layout == PackLayout::AmxBf16 ? bf16_cols(w) * lanes * 2 : panel_bytes(w, lanes);
  return size_t((w.rows + lanes - 1) / lanes) * size_t(pb);
}

size_t packed_size(const WeightView& w) { return packed_size(w, pack_layout_for(active_isa())); }

namespace {

// One Q4_K-shaped unit's lane (the Q4_K unit; Q5_K's begins with it): the
// nibble bytes as 4 pairs x 8 vectors, then d[L], dmin[L] (fp16), then the
// decoded 6-bit scales [8][L] and mins [8][L] as bytes (L = lanes).
void pack_k4_lane(uint8_t* unit, int64_t lane, int64_t L, const uint8_t* qs, fp16_t d, fp16_t dmin,
                  const uint8_t* scales) {
  const int64_t vb = 4 * L;
  for (int c = 0; c < 4; ++c)
    for (int k = 0; k < 8; ++k) std::memcpy(unit + (8 * c + k) * vb + 4 * lane, qs + 32 * c + 4 * k, 4);
  std::memcpy(unit + 32 * vb + 2 * lane, &d, 2);
  std::memcpy(unit + 32 * vb + 2 * L + 2 * lane, &dmin, 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    detail::get_scale_min_k4(j, scales, &sc, &m);
    unit[132 * L + L * j + lane] = sc;
    unit[140 * L + L * j + lane] = m;
  }
}

// Q4_K (B = BlockQ4_K) or Q5_K (BlockQ5_K) panels [p_begin, p_end), one
// unit per super-block (pack_k4_lane); Q5_K's then qh as 8 vectors.
template <class B>
void pack_panels_qk(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end, int64_t L) {
  constexpr bool kFive = std::is_same_v<B, BlockQ5_K>;
  const int64_t nsb = w.cols / QK_K, pb = panel_bytes(w, L), vb = 4 * L;
  for (int64_t p = p_begin; p < p_end; ++p) {
    for (int64_t lane = 0; lane < L; ++lane) {
      const int64_t r = std::min(p * L + lane, w.rows - 1);
      const auto* blocks = reinterpret_cast<const B*>(w.row(r));
      for (int64_t u = 0; u < nsb; ++u) {
        const B& b = blocks[u];
        uint8_t* unit = dst + p * pb + u * (kFive ? q5k_unit(L) : q4k_unit(L));
        pack_k4_lane(unit, lane, L, b.qs, b.d, b.dmin, b.scales);
        if constexpr (kFive)
          for (int k = 0; k < 8; ++k) std::memcpy(unit + 148 * L + k * vb + 4 * lane, b.qh + 4 * k, 4);
      }
    }
  }
}

// Q6_K panels [p_begin, p_end): per super-block, ql as 2 halves x 16
// vectors, qh as 2 halves x 8 vectors, the 16 int8 scales per lane, d.
void pack_panels_q6k(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end, int64_t L) {
  const int64_t nsb = w.cols / QK_K, pb = panel_bytes(w, L), vb = 4 * L;
  for (int64_t p = p_begin; p < p_end; ++p) {
    for (int64_t lane = 0; lane < L; ++lane) {
      const int64_t r = std::min(p * L + lane, w.rows - 1);
      const auto* blocks = reinterpret_cast<const BlockQ6_K*>(w.row(r));
      for (int64_t u = 0; u < nsb; ++u) {
        const BlockQ6_K& b = blocks[u];
        uint8_t* unit = dst + p * pb + u * q6k_unit(L);
        for (int v = 0; v < 32; ++v) std::memcpy(unit + v * vb + 4 * lane, b.ql + 4 * v, 4);
        for (int v = 0; v < 16; ++v) std::memcpy(unit + 32 * vb + v * vb + 4 * lane, b.qh + 4 * v, 4);
        for (int i = 0; i < 16; ++i) unit[192 * L + L * i + lane] = uint8_t(b.scales[i]);
        std::memcpy(unit + 208 * L + 2 * lane, &b.d, 2);
        if (lane == 0) std::memset(unit + 210 * L, 0, size_t(2 * L));  // padding to whole vectors
      }
    }
  }
}

// 8 x 8 transpose of 16-bit values: in[r] holds elements k..k+7 of row r,
// out[j] element k+j of the 8 rows. SSE2, so every x86-64 build has it.
inline void transpose8x16(const __m128i in[8], __m128i out[8]) {
  __m128i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm_unpacklo_epi16(in[2 * i], in[2 * i + 1]);      // elements 0..3 of rows 2i, 2i+1
    t[2 * i + 1] = _mm_unpackhi_epi16(in[2 * i], in[2 * i + 1]);  // elements 4..7
  }
  for (int h = 0; h < 2; ++h) {  // h = 0: rows 0..3, h = 1: rows 4..7
    u[4 * h + 0] = _mm_unpacklo_epi32(t[4 * h], t[4 * h + 2]);      // elements 0, 1
    u[4 * h + 1] = _mm_unpackhi_epi32(t[4 * h], t[4 * h + 2]);      // 2, 3
    u[4 * h + 2] = _mm_unpacklo_epi32(t[4 * h + 1], t[4 * h + 3]);  // 4, 5
    u[4 * h + 3] = _mm_unpackhi_epi32(t[4 * h + 1], t[4 * h + 3]);  // 6, 7
  }
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = _mm_unpacklo_epi64(u[j], u[4 + j]);
    out[2 * j + 1] = _mm_unpackhi_epi64(u[j], u[4 + j]);
  }
}

// Float panels [p_begin, p_end): element k of the `lanes` rows is `lanes`
// values in the file's type, lane order. A panel (`lanes` rows x cols) is at
// most a few hundred KB, so the strided writes stay in cache. 16-bit types
// go 8 rows x 8 elements at a time through a register transpose.
void pack_panels_float(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end, int64_t lanes) {
  const int64_t es = w.type == GgmlType::F32 ? 4 : 2, pb = panel_bytes(w, lanes);
  const int64_t k8 = es == 2 ? w.cols / 8 * 8 : 0;  // columns the transpose covers
  for (int64_t p = p_begin; p < p_end; ++p) {
    uint8_t* pan = dst + p * pb;
    for (int64_t g = 0; g < lanes; g += 8) {  // 8 lanes: one transpose's rows
      const uint8_t* rows[8];
      for (int r = 0; r < 8; ++r) rows[r] = w.row(std::min(p * lanes + g + r, w.rows - 1));
      for (int64_t k = 0; k < k8; k += 8) {
        __m128i in[8], out[8];
        for (int r = 0; r < 8; ++r) in[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + 2 * k));
        transpose8x16(in, out);
        for (int j = 0; j < 8; ++j)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(pan + ((k + j) * lanes + g) * 2), out[j]);
      }
      for (int r = 0; r < 8; ++r) {
        uint8_t* d = pan + (g + r) * es;
        for (int64_t k = k8; k < w.cols; ++k) std::memcpy(d + k * lanes * es, rows[r] + es * k, size_t(es));
      }
    }
  }
}

// AmxBf16 panels [p_begin, p_end) (layout in weight_pack.h): per 32-column
// chunk c, 32-bit word 16j + r holds elements 32c + 2j, 32c + 2j + 1 of row
// r (low half first). Missing rows and columns are zero.
void pack_panels_bf16(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end) {
  const int64_t kp = bf16_cols(w), pb = kp * 32;
  std::vector<uint16_t> bf(static_cast<size_t>(kp));  // [kp] one weight row as bf16
  for (int64_t p = p_begin; p < p_end; ++p) {
    uint8_t* pan = dst + p * pb;
    std::memset(pan, 0, size_t(pb));
    for (int64_t r = 0; r < 16 && 16 * p + r < w.rows; ++r) {
      mm::row_to_bf16_avx512(w.type, w.row(16 * p + r), w.cols, kp, bf.data());
      for (int64_t k2 = 0; k2 < kp / 2; ++k2)  // pair k2 = chunk k2 / 16, word row k2 % 16
        std::memcpy(pan + (k2 / 16) * 1024 + (k2 % 16) * 64 + 4 * r, bf.data() + 2 * k2, 4);
    }
  }
}

// Panels [p_begin, p_end) of the copy in `layout`.
void pack_panels(const WeightView& w, PackLayout layout, uint8_t* dst, int64_t p_begin, int64_t p_end) {
  const int64_t L = lanes_of(layout), vb = 4 * L;
  if (layout == PackLayout::AmxBf16) return pack_panels_bf16(w, dst, p_begin, p_end);
  if (mm::is_float_type(w.type)) return pack_panels_float(w, dst, p_begin, p_end, L);
  if (w.type == GgmlType::Q4_K) return pack_panels_qk<BlockQ4_K>(w, dst, p_begin, p_end, L);
  if (w.type == GgmlType::Q5_K) return pack_panels_qk<BlockQ5_K>(w, dst, p_begin, p_end, L);
  if (w.type == GgmlType::Q6_K) return pack_panels_q6k(w, dst, p_begin, p_end, L);
  const int64_t nb = w.cols / mm::kQBlock, lb = level_bytes(w.type, L), ub = unit_bytes(w.type, L);
  const int64_t per = unit_blocks(w.type), sb = scale_bytes(w.type, L), pb = panel_bytes(w, L);
  const bool q8 = w.type == GgmlType::Q8_0, mx = w.type == GgmlType::MXFP4;
  // VNNI takes u8 levels (u = q + 128); AVX2 keeps Q8_0 signed (sign trick).
  const uint8_t flip = q8 && layout == PackLayout::Panel16 ? 0x80 : 0;
  for (int64_t p = p_begin; p < p_end; ++p) {
    uint8_t* pan = dst + p * pb;
    if (const int64_t used = nb % per) {  // the last unit's missing blocks: zero levels and scales
      uint8_t* unit = pan + (nb / per) * ub;
      std::memset(unit + used * lb, 0, size_t((per - used) * lb));
      std::memset(unit + per * lb + used * sb, 0, size_t((per - used) * sb));
    }
    for (int64_t lane = 0; lane < L; ++lane) {
      const int64_t r = std::min(p * L + lane, w.rows - 1);  // tail lanes repeat the last row
      const uint8_t* row = w.row(r);
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* unit = pan + (b / per) * ub;
        uint8_t* lev = unit + (b % per) * lb;            // [LB] levels of block b
        uint8_t* sc = unit + per * lb + (b % per) * sb;  // [L] fp16 scales, or E8M0 bytes
        if (q8) {
          const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
          std::memcpy(sc + 2 * lane, &blk->d, 2);
          for (int k = 0; k < 8; ++k)
            for (int j = 0; j < 4; ++j) lev[vb * k + 4 * lane + j] = uint8_t(blk->qs[4 * k + j]) ^ flip;
          continue;
        }
        // Q4_0 and MXFP4 share the nibble layout; only the scale differs.
        const uint8_t* qs;
        if (mx) {
          const auto* blk = reinterpret_cast<const BlockMXFP4*>(row) + b;
          sc[lane] = blk->e;
          qs = blk->qs;
        } else {
          const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
          std::memcpy(sc + 2 * lane, &blk->d, 2);
          qs = blk->qs;
        }
        for (int k = 0; k < 4; ++k)
          for (int j = 0; j < 4; ++j) lev[vb * k + 4 * lane + j] = qs[4 * k + j];
      }
    }
  }
}

}  // namespace

void pack_panels_into(const WeightView& w, PackLayout layout, uint8_t* dst) {
  if (!packable(w, layout))
    throw std::invalid_argument("pack: type " + type_name(w.type) + " has no kernels in this layout");
  const int64_t L = lanes_of(layout);
  pack_panels(w, layout, dst, 0, (w.rows + L - 1) / L);
}

void pack_panel16(const WeightView& w, uint8_t* dst) { pack_panels_into(w, PackLayout::Panel16, dst); }

PackedArena::PackedArena(size_t bytes) {
  if (bytes == 0) return;
  base_ = static_cast<uint8_t*>(map_large(bytes));
  size_ = bytes;
}

PackedArena::PackedArena(PackedArena&& o) noexcept : base_(o.base_), size_(o.size_) {
  o.base_ = nullptr;
  o.size_ = 0;
}

PackedArena& PackedArena::operator=(PackedArena&& o) noexcept {
  if (this != &o) {
    unmap_large(base_, size_);
    base_ = o.base_;
    size_ = o.size_;
    o.base_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

PackedArena::~PackedArena() { unmap_large(base_, size_); }

void release_mapped_pages(const void* p, size_t n) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = round_up(a, page), hi = (a + n) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

PackedArena pack_weights(const std::vector<PackItem>& items,
                         const std::function<void(int64_t done, int64_t total)>& on_matrix,
                         MatmulPrecision precision) {
  if (precision == MatmulPrecision::Bf16 && !amx_bf16_active())
    throw std::runtime_error("bf16 matmuls need AMX-BF16 tiles, which this CPU (or KVS_ISA) does not offer");
  // Per matrix: its layout, None when it is not packed.
  std::vector<PackLayout> layout(items.size(), PackLayout::None);
  size_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const WeightView& w = *items[i].w;
    const bool bf16 = precision == MatmulPrecision::Bf16 && mm::is_float_type(w.type);
    const PackLayout l = bf16 ? PackLayout::AmxBf16 : pack_layout_for(active_isa());
    if (packable(w, l)) layout[i] = l, total += round_up(packed_size(w, l), 64);
  }
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
    if (layout[i] == PackLayout::None) continue;
    dst[i] = arena.data() + off;
    const int64_t lanes = lanes_of(layout[i]), panels = (w.rows + lanes - 1) / lanes;
    for (int64_t p = 0; p < panels; p += 64) jobs.push_back({i, p, std::min(panels, p + 64)});
    left[i] = (panels + 63) / 64;
    off += round_up(packed_size(w, layout[i]), 64);
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
      pack_panels(*it.w, layout[job.item], dst[job.item], job.p0, job.p1);
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
    items[i].w->pack = layout[i];
  }
  return arena;
}

}  // namespace kvs
