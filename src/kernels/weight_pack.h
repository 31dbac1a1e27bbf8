// Load-time weight repacking: PackLayout::Panel16 (AVX-512) and
// PackLayout::Panel8 (AVX2), each for Q8_0, Q4_0, MXFP4, Q4_K, Q5_K, Q6_K and the
// float types F32, F16, BF16.
//
// The file layout keeps each weight row's blocks together, so a kernel that
// computes 16 rows per zmm (one row per lane) must gather 16 scattered rows
// and transpose them for every 32-element block, every token (decode), or
// every step into scratch (prefill / batched decode). Panel16 does that once
// at load time:
//
//   panel p = rows 16p .. 16p+15 (the last panel repeats its last real row)
//   panel bytes = ceil(nb / 2) pair units, nb = cols / 32
//   pair unit c = blocks 2c and 2c+1 of the 16 rows:
//     [levels of block 2c: LB bytes][levels of block 2c+1: LB][scales: 64]
//   levels, Q8_0 (LB = 512): 8 vectors of 64 B; vector k, lane r (4 bytes)
//     = elements 4k..4k+3 of row r as u8 levels q + 128
//   levels, Q4_0 (LB = 256): 4 vectors of 64 B; vector k, lane r
//     = bytes 4k..4k+3 of row r's nibble array (elements 4k..4k+3 in the low
//     nibbles, 16+4k..16+4k+3 in the high), i.e. u = q + 8 after a mask
//   scales: 16 fp16 for block 2c (lane order), then 16 for block 2c+1
//   An odd nb leaves the last unit's second block zero (never read).
//
// MXFP4: quad units of blocks 4c .. 4c+3, 1088 B (the file's 17 B x 16 x 4):
//   [levels of 4c .. 4c+3: 4 x 256 B, as Q4_0's nibble bytes][4 x 16 E8M0
//   bytes, lane order]; a kernel looks the codes up (u = value + 12) and
//   forms ws = 2^(e - 128) as unpack_block() does. Blocks missing from the
//   last unit (nb % 4) are zero.
//
// Q4_K: the unit is one 256-element super-block of the 16 rows, 2368 B:
//   [0, 2048)     4 pairs c x 8 vectors: vector (c, k), lane r = bytes
//                 32c+4k .. 32c+4k+3 of row r's nibble array (low nibbles:
//                 sub-block 2c, high: 2c+1, elements 4k..4k+3 of each)
//   [2048, 2112)  d[16] then dmin[16], fp16 (lane order)
//   [2112, 2240)  the 6-bit scales, decoded: byte 16j + r = scale j of row r
//   [2240, 2368)  the 6-bit mins, likewise
//   so a kernel reads d, dmin, sc_j and m_j as from the file (3% more bytes
//   than the file's 144 B x 16).
//
// Q5_K: the Q4_K unit, then [2368, 2880) qh as 8 vectors: vector k, lane r
//   = qh bytes 4k .. 4k+3 of row r (bit j of each byte: bit 4 of the level
//   of sub-block j's element), 2880 B (file: 176 B x 16).
//
// Q6_K: one 256-element super-block of the 16 rows, 3392 B (file: 3360):
//   [0, 2048)     ql: half h (0, 1) x 16 vectors: vector (h, v), lane r =
//                 ql bytes 64h+4v .. 64h+4v+3 of row r
//   [2048, 3072)  qh: half h x 8 vectors: lane r = qh bytes 32h+4v .. +3
//   [3072, 3328)  the 16 int8 scales: byte 16i + r = scale i of row r
//   [3328, 3360)  d[16], fp16; [3360, 3392) zero
//
// F32 / F16 / BF16: panel p = cols x 16 values in the file's type, element
//   k of rows 16p .. 16p+15 at [16k, 16k + 16) (lane order), so one vector
//   is one k of 16 rows. Float matrices with this copy switch to the k-chain
//   order (matmul_internal.h): the outer-product kernels it feeds are faster
//   at prefill than the dot-product ones of the file layout (figures in
//   docs/PERFORMANCE.md).
//
// Panel8 (AVX2) is the same layout with 8 lanes: a vector is 32 B (lane r
//   = 4 bytes of row r), every per-lane array holds 8 entries, so with
//   L = lanes: Q8_0 / Q4_0 pair unit = [LB = 32L or 16L][LB][4L scales];
//   MXFP4 quad unit = [4 x 16L levels][4 x L exponents] = 68L;
//   Q4_K unit 148L B (vectors [0, 128L), d at 128L, dmin at 130L, scales at
//   132L, mins at 140L); Q5_K unit 180L B (the Q4_K unit, then qh as 8
//   vectors [148L, 180L)); Q6_K unit 212L B (ql [0, 128L), qh [128L, 192L),
//   scales at 192L, d at 208L, zero to 212L). Q8_0 levels stay signed (the
//   AVX2 kernels use the sign trick, not an offset). A float panel is cols x 8
//   values, element k of the 8 rows at [8k, 8k + 8); its k-chain order is the
//   Panel16 one, so both copies give the same bits.
//
// AmxBf16 (float weights under MatmulPrecision::Bf16 only): panel p = rows
//   16p .. 16p+15, the columns rounded up to kp, a multiple of 32; chunk c
//   (1 KiB) = columns 32c .. 32c+31 as one AMX-BF16 B tile: 32-bit word
//   16j + r holds elements 32c + 2j and 32c + 2j + 1 of row r as bfloat16
//   (round to nearest even from the file's value), the even one first.
//   Missing rows and columns are zero.
//
// Quantized units are multiples of the vector size, so vectors load aligned. The values
// are the file's bit for bit: for the quantized types the kernels' integer
// dots and float chains, hence their results, are unchanged (tests compare
// bit-exactly); float types follow their own documented order.
#pragma once
#include <functional>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/matmul.h"

namespace kvs {

// Model::load (and the probe) repack unless the environment sets
// KVS_REPACK=0: side-by-side benchmarks of the file layout, debugging.
bool repack_enabled();

// The layout whose kernels an ISA has (None for scalar).
PackLayout pack_layout_for(Isa isa);
// True when `layout` has kernels for `w`'s type and shape; without a layout,
// the active ISA's.
bool packable(const WeightView& w, PackLayout layout);
bool packable(const WeightView& w);
size_t packed_size(const WeightView& w, PackLayout layout);  // bytes of the copy
size_t packed_size(const WeightView& w);
// Writes the copy of `w` in `layout` to dst (64-byte aligned, packed_size bytes).
void pack_panels_into(const WeightView& w, PackLayout layout, uint8_t* dst);
void pack_panel16(const WeightView& w, uint8_t* dst);

// Anonymous memory holding packed copies (map_large: huge pages, since a
// decode step streams the whole of it). Move-only.
class PackedArena {
 public:
  PackedArena() = default;
  explicit PackedArena(size_t bytes);
  PackedArena(PackedArena&& o) noexcept;
  PackedArena& operator=(PackedArena&& o) noexcept;
  PackedArena(const PackedArena&) = delete;
  PackedArena& operator=(const PackedArena&) = delete;
  ~PackedArena();
  uint8_t* data() const { return base_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// Packs every packable matrix among `items` into one arena, in the active
// ISA's layout, and points their views at it. Returns the arena (empty when nothing was packed). With
// `release_source`, a packed matrix's file pages are dropped from this
// process (madvise) so resident memory is not doubled; they fault back in
// from the page cache if a non-packed path reads them (an ISA override, an
// embedding row lookup). Set it only for data in a read-only file mapping.
struct PackItem {
  WeightView* w;
  bool release_source;
};
// `on_matrix(done, total)`, when set, runs (on a packing thread, one call at a
// time per count) as each matrix's copy completes: a progress hook.
// MatmulPrecision::Bf16 packs the float matrices as AmxBf16 (throws
// std::runtime_error where amx_bf16_active() is false).
PackedArena pack_weights(const std::vector<PackItem>& items,
                         const std::function<void(int64_t done, int64_t total)>& on_matrix = nullptr,
                         MatmulPrecision precision = MatmulPrecision::Fp32);

// Drops [p, p + n) from this process's resident set (whole pages inside the
// range only). For read-only file mappings.
void release_mapped_pages(const void* p, size_t n);

}  // namespace kvs
