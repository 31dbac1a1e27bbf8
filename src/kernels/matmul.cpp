// matmul driver: argument checks, ISA dispatch, activation quantization,
// splitting output rows across the pool, and the scalar references.
#include "kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/amx_rows.h"
#include "kernels/cpu.h"
#include "kernels/huge_pages.h"
#include "kernels/matmul_internal.h"
#include "kernels/ops.h"
#include "kernels/threadpool.h"

namespace kvs {
namespace {

using mm::IsaKernels;
using mm::XBlock;
using mm::XTile;

const IsaKernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Amx: return mm::amx_kernels();
    case Isa::Avx512: return mm::avx512_kernels();
    case Isa::Avx2: return mm::avx2_kernels();
    default: return mm::scalar_kernels();
  }
}

void check_args(const WeightView& w, const float* x, int64_t ldx, int64_t n, const float* y,
                int64_t ldy) {
  if (n < 0 || w.rows < 0 || w.cols <= 0) throw std::invalid_argument("matmul: bad shape");
  if (!w.data && w.rows > 0) throw std::invalid_argument("matmul: null weights");
  if (n > 0 && (!x || !y)) throw std::invalid_argument("matmul: null x or y");
  if (ldx < w.cols || ldy < w.rows) throw std::invalid_argument("matmul: leading dimension too small");
  if (!mm::is_float_type(w.type) && !mm::is_quant_type(w.type))
    throw std::invalid_argument("matmul: unsupported weight type " + type_name(w.type));
  const int be = type_traits(w.type).block_elems;
  if (w.cols % be != 0)
    throw std::invalid_argument("matmul: cols not a multiple of the block size");
  if (w.row_stride < row_bytes(w.type, w.cols))
    throw std::invalid_argument("matmul: row_stride smaller than a row");
}

// 64-byte aligned per-thread scratch (GEMM weight panels).
mm::Scratch thread_scratch() {
  struct Buf {
    uint8_t* p = nullptr;
    ~Buf() { std::free(p); }
  };
  thread_local Buf buf;
  if (!buf.p) {
    buf.p = static_cast<uint8_t*>(std::aligned_alloc(64, mm::kScratchBytes));
    if (!buf.p) throw std::bad_alloc();
  }
  return {buf.p, mm::kScratchBytes};
}

// Activations (XBlock, XTile, bf16 rows) for this call, reused across calls
// on the caller thread; page-aligned, huge pages where large (every panel
// reads them again).
template <class T, int Tag = 0>
T* x_buffer(size_t count) {
  struct Buf {
    T* p = nullptr;
    size_t bytes = 0;
    ~Buf() { unmap_large(p, bytes); }
  };
  thread_local Buf buf;
  if (count * sizeof(T) > buf.bytes) {
    unmap_large(buf.p, buf.bytes);
    buf.p = nullptr, buf.bytes = 0;
    const size_t bytes = std::max<size_t>(count, 1024) * sizeof(T);
    buf.p = static_cast<T*>(map_large(bytes));
    buf.bytes = bytes;
  }
  return buf.p;
}

int64_t m_tiles(int64_t n) { return (n + 15) / 16; }

// xq [count][n, nb] XBlock -> out [count][ceil(n / 16), nb] XTile, one task
// per M tile; copy c's format is f[c].
void tile_activations(const IsaKernels& k, const XBlock* xq, const mm::QFormat* f, int count, int64_t n, int64_t nb,
                      XTile* out, ThreadPool& pool) {
  const int64_t mt = m_tiles(n), tasks = count * mt;
  const auto one = [&](int64_t t) {
    const int64_t c = t / mt;
    k.tile_x(xq + c * n * nb, n, nb, t % mt, t % mt + 1, f[c], out + c * mt * nb);
  };
  if (tasks > 1 && pool.size() > 1) pool.parallel_for(tasks, [&](int64_t t, int) { one(t); });
  else for (int64_t t = 0; t < tasks; ++t) one(t);
}

// Where a row of X comes from: read as it is, or made as act(x, u) of two
// rows (a gated FFN's down projection), a piece at a time as it is
// quantized, so the product's input is never written out.
struct XSource {
  const float* x;
  int64_t ldx;
  const float* u = nullptr;  // [n, cols] at ldx: act(x, u); null: x itself
  Glu act = Glu::SwiGlu;
};

// Pieces of this many elements (whole K-quant super-blocks) stay in L1
// between the activation and the quantizing.
constexpr int64_t kGluPiece = 512;

void glu_piece(Glu act, float* g, const float* u, int n) {
  if (act == Glu::GeGlu) geglu_inplace(g, u, n);
  else swiglu_inplace(g, u, n);
}

// Row i of the source quantized (cols % 32 == 0, super formats % 256):
// the quantizers work per block or super-block, so pieces give the bits
// of the whole row.
void quantize_row(const IsaKernels& k, const XSource& s, int64_t i, int64_t cols, mm::QFormat f, XBlock* out) {
  const float* x = s.x + i * s.ldx;
  if (!s.u) return k.quantize_x(x, cols, f, out);
  alignas(64) float piece[kGluPiece];
  for (int64_t c = 0; c < cols; c += kGluPiece) {
    const int64_t len = std::min(kGluPiece, cols - c);
    std::memcpy(piece, x + c, size_t(len) * sizeof(float));
    glu_piece(s.act, piece, s.u + i * s.ldx + c, int(len));
    k.quantize_x(piece, len, f, out + c / mm::kQBlock);
  }
}

// X quantized into xq [count][n, nb] (copy c in format f[c]), rows across the pool.
void quantize_rows(const IsaKernels& k, const XSource& s, const mm::QFormat* f, int count, int64_t n, int64_t cols,
                   XBlock* xq, ThreadPool& pool) {
  const int64_t nb = cols / mm::kQBlock;
  const auto one = [&](int64_t i) { quantize_row(k, s, i % n, cols, f[i / n], xq + i * nb); };
  if (n >= 8 && pool.size() > 1) pool.parallel_for(count * n, [&](int64_t i, int) { one(i); });
  else for (int64_t i = 0; i < count * n; ++i) one(i);
}

// Whether quantize_tiles() keeps the pool busy: it runs one task per M tile.
bool tiles_direct(int64_t n, const ThreadPool& pool) { return m_tiles(n) >= 2 * int64_t(pool.size()); }

// X quantized straight into XTiles out [count][ceil(n / 16), nb], one task
// per (copy, M tile): the tile's rows go through a thread's own [16, nb]
// XBlocks, which stay cached, instead of an [n, nb] array through memory.
// The same bits as quantize_rows() then tile_activations().
void quantize_tiles(const IsaKernels& k, const XSource& s, const mm::QFormat* f, int count, int64_t n, int64_t cols,
                    XTile* out, ThreadPool& pool) {
  const int64_t nb = cols / mm::kQBlock, mt = m_tiles(n);
  pool.parallel_for(count * mt, [&](int64_t task, int) {
    const int64_t c = task / mt, t = task % mt, rows = std::min<int64_t>(16, n - 16 * t);
    XBlock* xq = x_buffer<XBlock, 1>(size_t(16 * nb));  // [16, nb]
    for (int64_t m = 0; m < rows; ++m) quantize_row(k, s, 16 * t + m, cols, f[c], xq + m * nb);
    k.tile_x(xq, rows, nb, 0, 1, f[c], out + (c * mt + t) * nb);
  });
}

// Output rows per task: a multiple of the kernel's panel height, ~8 tasks per
// thread so dynamic claiming evens out uneven progress.
int64_t row_chunk(int64_t rows, int threads, int align) {
  if (threads <= 1) return rows;
  const int64_t target = int64_t(threads) * 8;
  int64_t c = (rows + target - 1) / target;
  c = (c + align - 1) / align * align;
  return std::max<int64_t>(c, align);
}

// Whether w runs on the AMX-BF16 tiles; throws where it must but cannot
// (its copy is bfloat16 tiles and the tiles are not usable now).
bool runs_bf16(const IsaKernels& k, const WeightView& w) {
  if (w.pack != PackLayout::AmxBf16) return false;
  if (!k.bf16_rows || !amx_bf16_active())
    throw std::runtime_error("matmul: these weights were loaded for bf16 matmuls (AMX-BF16 tiles), which the "
                             "active ISA (" + isa_name(active_isa()) + ") cannot run; load them with fp32 precision");
  return true;
}

// X [n, cols] as bfloat16 rows of kp = bf16_x_stride(cols) elements for the bf16 kernels, rows
// past n up to a whole M tile zero; reused across calls on the caller thread.
const uint16_t* bf16_activations(const IsaKernels& k, const float* x, int64_t ldx, int64_t n, int64_t cols,
                                 ThreadPool& pool) {
  const int64_t kp = mm::bf16_x_stride(cols), rows = m_tiles(n) * 16;
  uint16_t* xb = x_buffer<uint16_t>(size_t(rows * kp));  // [rows, kp]
  if (n >= 8 && pool.size() > 1) pool.parallel_for(n, [&](int64_t i, int) { k.bf16_x(x, ldx, cols, i, i + 1, kp, xb); });
  else k.bf16_x(x, ldx, cols, 0, n, kp, xb);
  std::memset(xb + n * kp, 0, size_t((rows - n) * kp) * sizeof(uint16_t));
  return xb;
}

void run_rows(const WeightView& w, int64_t n, ThreadPool& pool, int align,
              const std::function<void(int64_t, int64_t, mm::Scratch)>& body) {
  const int64_t chunk = row_chunk(w.rows, pool.size(), align);
  const int64_t tasks = (w.rows + chunk - 1) / chunk;
  if (tasks <= 1) {
    body(0, w.rows, thread_scratch());
    return;
  }
  pool.parallel_for(tasks, [&](int64_t t, int) {
    const int64_t r0 = t * chunk, r1 = std::min(w.rows, r0 + chunk);
    body(r0, r1, thread_scratch());
  });
}

// Quantized weights: X quantized once (every weight row reuses it), on
// the tiles where they apply, then the weight rows across the pool.
void quant_product(const IsaKernels& k, const WeightView& w, const XSource& s, int64_t n, float* y, int64_t ldy,
                   ThreadPool& pool) {
  const mm::QFormat f = mm::qformat(w.type, k.signed_q8);
  const int64_t nb = w.cols / mm::kQBlock;
  if (k.quant_rows_tiles && amx_tiles_apply(w, n)) {
    XTile* xt = x_buffer<XTile>(size_t(m_tiles(n) * nb));  // [ceil(n / 16), nb]
    if (tiles_direct(n, pool)) {
      quantize_tiles(k, s, &f, 1, n, w.cols, xt, pool);
    } else {
      XBlock* xq = x_buffer<XBlock>(size_t(n * nb));  // [n, nb]
      quantize_rows(k, s, &f, 1, n, w.cols, xq, pool);
      tile_activations(k, xq, &f, 1, n, nb, xt, pool);
    }
    run_rows(w, n, pool, k.row_align, [&](int64_t r0, int64_t r1, mm::Scratch sc) {
      k.quant_rows_tiles(w, r0, r1, xt, n, y, ldy, sc);
    });
    return;
  }
  XBlock* xq = x_buffer<XBlock>(size_t(n * nb));  // [n, nb]
  quantize_rows(k, s, &f, 1, n, w.cols, xq, pool);
  run_rows(w, n, pool, k.row_align, [&](int64_t r0, int64_t r1, mm::Scratch sc) {
    k.quant_rows(w, r0, r1, xq, n, y, ldy, sc);
  });
}

}  // namespace

void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
            ThreadPool& pool) {
  check_args(w, x, ldx, n, y, ldy);
  if (n == 0 || w.rows == 0) return;
  const IsaKernels& k = kernels_for(active_isa());
  if (runs_bf16(k, w)) {
    const uint16_t* xb = bf16_activations(k, x, ldx, n, w.cols, pool);
    run_rows(w, n, pool, 16, [&](int64_t r0, int64_t r1, mm::Scratch s) { k.bf16_rows(w, r0, r1, xb, n, y, ldy, s); });
    return;
  }
  if (mm::is_float_type(w.type)) {
    run_rows(w, n, pool, k.row_align, [&](int64_t r0, int64_t r1, mm::Scratch s) {
      k.float_rows(w, r0, r1, x, ldx, n, y, ldy, s);
    });
    return;
  }
  quant_product(k, w, XSource{x, ldx}, n, y, ldy, pool);
}

void matmul_glu(const WeightView& w, float* g, const float* u, int64_t ldx, Glu act, int64_t n, float* y,
                int64_t ldy, ThreadPool& pool) {
  check_args(w, g, ldx, n, y, ldy);
  if (n > 0 && !u) throw std::invalid_argument("matmul_glu: null u");
  if (n == 0 || w.rows == 0) return;
  const IsaKernels& k = kernels_for(active_isa());
  if (runs_bf16(k, w) || mm::is_float_type(w.type)) {  // float products read X as it is
    const auto one = [&](int64_t i) { glu_piece(act, g + i * ldx, u + i * ldx, int(w.cols)); };
    if (n >= 8 && pool.size() > 1) pool.parallel_for(n, [&](int64_t i, int) { one(i); });
    else for (int64_t i = 0; i < n; ++i) one(i);
    return matmul(w, g, ldx, n, y, ldy, pool);
  }
  quant_product(k, w, XSource{g, ldx, u, act}, n, y, ldy, pool);
}

void matmul_multi(const MatmulOut* outs, int count, const float* x, int64_t ldx, int64_t n, ThreadPool& pool) {
  constexpr int kMaxOuts = 8;
  if (count < 0 || count > kMaxOuts) throw std::invalid_argument("matmul_multi: 0 to 8 outputs");
  for (int j = 0; j < count; ++j) {
    if (!outs[j].w) throw std::invalid_argument("matmul_multi: null weights");
    check_args(*outs[j].w, x, ldx, n, outs[j].y, outs[j].ldy);
    if (outs[j].w->cols != outs[0].w->cols) throw std::invalid_argument("matmul_multi: inputs differ in width");
  }
  if (n == 0 || count == 0) return;
  const IsaKernels& k = kernels_for(active_isa());
  const int64_t cols = outs[0].w->cols, nb = cols / mm::kQBlock;
  // One quantized copy of X per distinct weight format, [n, nb] each. Fixed
  // arrays: this runs several times per token and allocates nothing.
  mm::QFormat formats[kMaxOuts];
  int n_formats = 0, fmt_of[kMaxOuts];
  bool bf16[kMaxOuts] = {}, any_bf16 = false;
  for (int j = 0; j < count; ++j) {
    fmt_of[j] = -1;
    if (runs_bf16(k, *outs[j].w)) bf16[j] = any_bf16 = true;
    if (mm::is_float_type(outs[j].w->type)) continue;
    const mm::QFormat f = mm::qformat(outs[j].w->type, k.signed_q8);
    int i = 0;
    while (i < n_formats && !mm::same_activations(formats[i], f)) ++i;
    if (i == n_formats) formats[n_formats++] = f;
    fmt_of[j] = i;
  }
  // Tile layouts of every format when any of its outputs runs on tiles;
  // the XBlocks too where an output runs without.
  bool tiles[kMaxOuts] = {};
  bool any_tiles = false, any_blocks = false;
  for (int j = 0; j < count; ++j) {
    if (fmt_of[j] < 0) continue;
    tiles[j] = k.quant_rows_tiles && amx_tiles_apply(*outs[j].w, n);
    any_tiles |= tiles[j];
    any_blocks |= !tiles[j];
  }
  const XSource src{x, ldx};
  XBlock* xq = nullptr;  // [n_formats][n, nb]
  XTile* xt = nullptr;   // [n_formats][ceil(n / 16), nb]
  if (any_tiles) xt = x_buffer<XTile>(size_t(n_formats) * size_t(m_tiles(n) * nb));
  if (any_tiles && !any_blocks && tiles_direct(n, pool)) {
    quantize_tiles(k, src, formats, n_formats, n, cols, xt, pool);
  } else if (n_formats > 0) {
    xq = x_buffer<XBlock>(size_t(n_formats) * size_t(n * nb));
    quantize_rows(k, src, formats, n_formats, n, cols, xq, pool);
    if (any_tiles) tile_activations(k, xq, formats, n_formats, n, nb, xt, pool);
  }
  const uint16_t* xb = any_bf16 ? bf16_activations(k, x, ldx, n, cols, pool) : nullptr;
  // Tasks: output j's row chunks, in order; task t belongs to the output
  // whose first task index is the largest one <= t.
  int64_t total = 0, first[kMaxOuts + 1];
  for (int j = 0; j < count; ++j) total += outs[j].w->rows;
  const int64_t chunk = row_chunk(total, pool.size(), k.row_align);
  first[0] = 0;
  for (int j = 0; j < count; ++j) first[j + 1] = first[j] + (outs[j].w->rows + chunk - 1) / chunk;
  pool.parallel_for(first[count], [&](int64_t t, int) {
    int j = 0;
    while (first[j + 1] <= t) ++j;
    const MatmulOut& o = outs[j];
    const int64_t r0 = (t - first[j]) * chunk, r1 = std::min(o.w->rows, r0 + chunk);
    if (bf16[j])
      k.bf16_rows(*o.w, r0, r1, xb, n, o.y, o.ldy, thread_scratch());
    else if (fmt_of[j] < 0)
      k.float_rows(*o.w, r0, r1, x, ldx, n, o.y, o.ldy, thread_scratch());
    else if (tiles[j])
      k.quant_rows_tiles(*o.w, r0, r1, xt + int64_t(fmt_of[j]) * m_tiles(n) * nb, n, o.y, o.ldy, thread_scratch());
    else
      k.quant_rows(*o.w, r0, r1, xq + int64_t(fmt_of[j]) * n * nb, n, o.y, o.ldy, thread_scratch());
  });
}

namespace {

// Where matmul_grouped keeps a group's activations.
struct GroupPlan {
  int64_t xq = -1;       // first XBlock of its quantized X; -1: float weights or n = 0
  int64_t xt = -1;       // first XTile of its tile layout; -1: no tiles
  int64_t xb = -1;       // first bf16 element of its bf16 X (AmxBf16 weights); -1: none
  bool owner = false;    // quantizes its X (else shares the previous group's)
  mm::QFormat f{};
};

// Index of the last prefix entry <= i (prefix[0] = 0, non-decreasing).
int group_of(const std::vector<int64_t>& prefix, int64_t i) {
  return int(std::upper_bound(prefix.begin(), prefix.end(), i) - prefix.begin()) - 1;
}

// The work items of one preparation stage (quantize rows, lay out M tiles,
// convert rows to bf16): the j-th group added, group[j], owns items
// [first[j], first[j + 1]).
struct Stage {
  std::vector<int64_t> first, group;
  void reset() { first.assign(1, 0), group.clear(); }
  void add(int g, int64_t items) { group.push_back(g), first.push_back(first.back() + items); }
  // fn(g, i) for item i of group g: on the pool from `parallel` items on.
  template <class F>
  void run(ThreadPool& pool, int64_t parallel, F fn) const {
    const auto one = [&](int64_t i) {
      const int j = group_of(first, i);
      fn(int(group[size_t(j)]), i - first[size_t(j)]);
    };
    if (first.back() >= parallel && pool.size() > 1) pool.parallel_for(first.back(), [&](int64_t i, int) { one(i); });
    else for (int64_t i = 0; i < first.back(); ++i) one(i);
  }
};

}  // namespace

void matmul_grouped(const MatmulGroup* groups, int count, ThreadPool& pool) {
  if (count < 0) throw std::invalid_argument("matmul_grouped: negative count");
  for (int g = 0; g < count; ++g) {
    if (!groups[g].w) throw std::invalid_argument("matmul_grouped: null weights");
    check_args(*groups[g].w, groups[g].x, groups[g].ldx, groups[g].n, groups[g].y, groups[g].ldy);
  }
  const IsaKernels& k = kernels_for(active_isa());
  // Reused across calls on the caller thread (a MoE layer calls this twice
  // per step). The pool's workers must see the caller's copies, so the
  // lambdas below capture references, never name the thread_locals.
  thread_local std::vector<GroupPlan> plan_tls;
  thread_local Stage stages_tls[3];
  thread_local std::vector<int64_t> task_first_tls;
  std::vector<GroupPlan>& plan = plan_tls;
  Stage &qs = stages_tls[0], &ts = stages_tls[1], &bs = stages_tls[2];  // quantize, tile, bf16 rows
  std::vector<int64_t>& task_first = task_first_tls;
  plan.assign(size_t(count), GroupPlan{});
  for (Stage* st : {&qs, &ts, &bs}) st->reset();
  task_first.assign(1, 0);
  int64_t xq_total = 0, xt_total = 0, xb_total = 0, total_rows = 0;
  for (int g = 0; g < count; ++g) {
    const MatmulGroup& G = groups[g];
    if (G.n == 0 || G.w->rows == 0) continue;
    total_rows += G.w->rows;
    GroupPlan& p = plan[size_t(g)];
    if (runs_bf16(k, *G.w)) {
      p.xb = xb_total, xb_total += m_tiles(G.n) * 16 * mm::bf16_x_stride(G.w->cols);
      bs.add(g, m_tiles(G.n) * 16);
    }
    if (mm::is_float_type(G.w->type)) continue;
    const int64_t nb = G.w->cols / mm::kQBlock;
    p.f = mm::qformat(G.w->type, k.signed_q8);
    const GroupPlan* prev = g > 0 ? &plan[size_t(g - 1)] : nullptr;
    const MatmulGroup* pg = g > 0 ? &groups[g - 1] : nullptr;
    if (prev && prev->xq >= 0 && pg->x == G.x && pg->ldx == G.ldx && pg->n == G.n && pg->w->cols == G.w->cols &&
        mm::same_activations(prev->f, p.f)) {
      p.xq = prev->xq;  // same X, same format: quantized once (gate and up of an expert)
    } else {
      p.xq = xq_total, p.owner = true, xq_total += G.n * nb;
      qs.add(g, G.n);
    }
    if (k.quant_rows_tiles && amx_tiles_apply(*G.w, G.n)) {
      p.xt = xt_total, xt_total += m_tiles(G.n) * nb;
      ts.add(g, m_tiles(G.n));
    }
  }
  if (total_rows == 0) return;
  XBlock* xq = x_buffer<XBlock>(size_t(std::max<int64_t>(xq_total, 1)));  // per owner group: [n, nb]
  qs.run(pool, 8, [&](int g, int64_t r) {
    const MatmulGroup& G = groups[g];
    k.quantize_x(G.x + r * G.ldx, G.w->cols, plan[size_t(g)].f, xq + plan[size_t(g)].xq + r * (G.w->cols / mm::kQBlock));
  });
  XTile* xt = xt_total > 0 ? x_buffer<XTile>(size_t(xt_total)) : nullptr;  // per tiled group: [ceil(n / 16), nb]
  ts.run(pool, 2, [&](int g, int64_t t) {
    const GroupPlan& p = plan[size_t(g)];
    k.tile_x(xq + p.xq, groups[g].n, groups[g].w->cols / mm::kQBlock, t, t + 1, p.f, xt + p.xt);
  });
  uint16_t* xb = xb_total > 0 ? x_buffer<uint16_t>(size_t(xb_total)) : nullptr;  // per bf16 group: [ceil(n / 16) * 16, kp]
  bs.run(pool, 8, [&](int g, int64_t r) {
    const MatmulGroup& G = groups[g];
    const int64_t kp = mm::bf16_x_stride(G.w->cols);
    uint16_t* out = xb + plan[size_t(g)].xb;
    if (r < G.n) k.bf16_x(G.x, G.ldx, G.w->cols, r, r + 1, kp, out);
    else std::memset(out + r * kp, 0, size_t(kp) * sizeof(uint16_t));
  });
  // Tasks: group g's row chunks, in order.
  const int64_t chunk = row_chunk(total_rows, pool.size(), k.row_align);
  for (int g = 0; g < count; ++g)
    task_first.push_back(task_first.back() + (groups[g].n > 0 ? (groups[g].w->rows + chunk - 1) / chunk : 0));
  pool.parallel_for(task_first.back(), [&](int64_t t, int) {
    const int g = group_of(task_first, t);
    const MatmulGroup& G = groups[g];
    const GroupPlan& p = plan[size_t(g)];
    const int64_t r0 = (t - task_first[size_t(g)]) * chunk, r1 = std::min(G.w->rows, r0 + chunk);
    if (p.xb >= 0)
      k.bf16_rows(*G.w, r0, r1, xb + p.xb, G.n, G.y, G.ldy, thread_scratch());
    else if (p.xq < 0)
      k.float_rows(*G.w, r0, r1, G.x, G.ldx, G.n, G.y, G.ldy, thread_scratch());
    else if (p.xt >= 0)
      k.quant_rows_tiles(*G.w, r0, r1, xt + p.xt, G.n, G.y, G.ldy, thread_scratch());
    else
      k.quant_rows(*G.w, r0, r1, xq + p.xq, G.n, G.y, G.ldy, thread_scratch());
  });
}

double chain_ops_per_block(GgmlType t) {
  if (mm::is_float_type(t) || !mm::is_quant_type(t)) return 0;
  const mm::QFormat f = mm::qformat(t);
  // K-quants, per super-block: Q6_K a shift, an add, a conversion, a scale
  // and an FMA; Q4_K / Q5_K also the mins' four vpdpwssd, a conversion, a
  // scale and an FMA.
  if (f.super) return (f.has_min ? 12.0 : 5.0) / mm::kSuperBlocks;
  return 3 + (f.has_min ? 1 : 0);
}

std::string precision_name(MatmulPrecision p) { return p == MatmulPrecision::Bf16 ? "bf16" : "fp32"; }

MatmulPrecision parse_precision(const std::string& s) {
  if (s == "fp32") return MatmulPrecision::Fp32;
  if (s == "bf16") return MatmulPrecision::Bf16;
  throw std::invalid_argument("unknown matmul precision '" + s + "' (choose fp32 or bf16)");
}

void matmul_q8_reference(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y,
                         int64_t ldy) {
  check_args(w, x, ldx, n, y, ldy);
  if (n == 0 || w.rows == 0) return;
  const IsaKernels& k = mm::scalar_kernels();
  if (mm::is_float_type(w.type)) {
    k.float_rows(w, 0, w.rows, x, ldx, n, y, ldy, {});
    return;
  }
  const mm::QFormat f = mm::qformat(w.type, false);
  const int64_t nb = w.cols / mm::kQBlock;
  std::vector<XBlock> xq(size_t(n * nb));  // [n, nb]
  for (int64_t i = 0; i < n; ++i) mm::quantize_x_scalar(x + i * ldx, w.cols, f, xq.data() + i * nb);
  k.quant_rows(w, 0, w.rows, xq.data(), n, y, ldy, {});
}

void matmul_reference(const WeightView& w, const float* x, int64_t ldx, int64_t n, float* y,
                      int64_t ldy) {
  check_args(w, x, ldx, n, y, ldy);
  std::vector<float> row(size_t(w.cols));  // [cols]
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, w.row(r), row.data(), w.cols);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * ldx;
      // double accumulation: the reference should carry no ordering error of its own
      double acc = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) acc += double(row[size_t(c)]) * double(xi[c]);
      y[i * ldy + r] = float(acc);
    }
  }
}

void dequantize_weight_row(const WeightView& w, int64_t r, float* out) {
  if (r < 0 || r >= w.rows) throw std::out_of_range("dequantize_weight_row: row out of range");
  dequantize_row(w.type, w.row(r), out, w.cols);
}

}  // namespace kvs
