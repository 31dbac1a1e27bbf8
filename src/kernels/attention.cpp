#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/attention_tile.h"
#include "kernels/cpu.h"
#include "kernels/flash_attention.h"

namespace kvs {

namespace {

using attn::kTile;

// Bits of the tile at p0 that lie in [lo, hi).
unsigned range_bits(int p0, int lo, int hi) {
  const int a = std::clamp(lo - p0, 0, kTile), b = std::clamp(hi - p0, 0, kTile);
  return ((1u << b) - 1u) & ~((1u << a) - 1u);
}

// The first key a token with context ctx passes through the layer's window.
int window_lo(const AttnSeq& seq, int ctx) { return seq.window > 0 && ctx > seq.window ? ctx - seq.window : 0; }

// The tile's keys a token with context ctx sees.
unsigned visible_bits(const AttnSeq& seq, int p0, int ctx) {
  const int lo = window_lo(seq, ctx);
  if (seq.sink_end >= seq.win_start) return range_bits(p0, lo, ctx);
  return range_bits(p0, lo, std::min(seq.sink_end, ctx)) | range_bits(p0, std::max(seq.win_start, lo), ctx);
}

// Calls fn(p0) for every tile holding a visible key of a token of the block
// (contexts ctx_first .. seq.n_ctx), in position order: the sinks' tiles,
// then the window's. The first token's layer window reaches furthest back.
template <class Fn>
void for_each_tile(const AttnSeq& seq, int ctx_first, Fn&& fn) {
  const int last = (seq.n_ctx + kTile - 1) / kTile;
  int j = window_lo(seq, ctx_first) / kTile;
  if (seq.sink_end < seq.win_start) {
    const int sink_tiles = (seq.sink_end + kTile - 1) / kTile;
    for (; j < sink_tiles; ++j) fn(j * kTile);
    j = std::max(j, seq.win_start / kTile);
  }
  for (; j < last; ++j) fn(j * kTile);
}

const attn::FlashKernel& kernel_for(const AttnShape& s) {
  if (!s.bf16 || !attn::flash_bf16_fits(s.head_dim)) return attn::flash_kernel();
  if (!amx_bf16_active()) throw std::invalid_argument("bf16 attention needs AMX-BF16 tiles, which this CPU does not offer");
  return attn::flash_kernel_amx_bf16();
}

float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

}  // namespace

size_t attention_scratch_floats(int rows, int head_dim, bool bf16) {
  const size_t nb = bf16 ? attn::kTileBatch : 1;
  return 16 + attn::flash_state_floats(rows, head_dim, bf16) + nb * (2 * size_t(kTile) * head_dim + size_t(rows));
}

void attention_group_block(const float* q, size_t ldq, int T, const KvStorage& kv, int layer, const AttnSeq& seq,
                           int g, const AttnShape& s, float* out, size_t ldo, float* scratch) {
  if (T > 1 && (seq.sink_end < seq.win_start || seq.rope_cos))
    throw std::invalid_argument("attention: a query block needs every key visible and unrotated");
  const int r = s.n_heads / s.n_kv_heads, hd = s.head_dim, h0 = g * r;
  const attn::FlashQuery fq{q + size_t(h0) * hd, ldq, T, r, hd, s.scale, s.softcap, s.sinks ? s.sinks + h0 : nullptr};
  const attn::FlashKernel& fk = kernel_for(s);
  // Kernels with tiles() take up to kTileBatch tiles per call (s.bf16 sized the scratch for them).
  const int nb = fk.tiles ? attn::kTileBatch : 1;
  float* state = align64(scratch);                                                     // the rows' state
  float* kt = state + attn::flash_state_floats(fq.rows(), hd, s.bf16);                 // [nb, kTile, hd] keys
  float* vt = kt + size_t(nb) * kTile * hd;                                            // [nb, kTile, hd] values
  auto* vis = reinterpret_cast<uint16_t*>(vt + size_t(nb) * kTile * hd);               // [nb, T] keys each token sees
  const uint16_t* tile_vis[attn::kTileBatch];
  int held = 0;  // tiles loaded, not yet run
  auto run = [&] {
    if (fk.tiles) fk.tiles(fq, state, held, kt, vt, tile_vis);
    else fk.tile(fq, state, kt, vt, tile_vis[0]);
    held = 0;
  };
  const int ctx_first = seq.n_ctx - (T - 1), lo_last = window_lo(seq, seq.n_ctx);
  fk.begin(fq, state);
  for_each_tile(seq, ctx_first, [&](int p0) {
    // Tiles every token sees whole (all but the last one or two of a block,
    // and the first ones of a windowed layer) skip the masks.
    const bool whole = seq.sink_end >= seq.win_start && p0 >= lo_last && p0 + kTile <= ctx_first;
    uint16_t* tv = vis + size_t(held) * T;
    unsigned any = 0xFFFFu;
    if (!whole) {
      any = 0;
      for (int i = 0; i < T; ++i) any |= tv[i] = uint16_t(visible_bits(seq, p0, ctx_first + i));
    }
    const size_t at = size_t(held) * kTile * hd;
    load_attention_tile(kv, layer, seq, g, p0, any, kt + at, vt + at);
    // The next tile's rows arrive while this one is computed (a head's rows
    // are strided by whole token rows, which the hardware prefetchers miss).
    prefetch_attention_tile(kv, layer, seq, g, p0 + kTile);
    tile_vis[held] = whole ? nullptr : tv;
    if (++held == nb) run();
  });
  if (held > 0) run();
  fk.finish(fq, state, out + size_t(h0) * hd, ldo);
}

void attention_group(const float* q, const KvStorage& kv, int layer, const AttnSeq& seq, int g,
                     const AttnShape& s, float* out, float* scratch) {
  attention_group_block(q, 0, 1, kv, layer, seq, g, s, out, 0, scratch);
}

void attention_reference(const float* q, const float* k, const float* v, int n_ctx,
                         const AttnShape& s, float* out) {
  const int r = s.n_heads / s.n_kv_heads;
  const int hd = s.head_dim;
  std::vector<double> p(n_ctx);
  for (int h = 0; h < s.n_heads; ++h) {
    const int g = h / r;
    double mx = -1e300;
    for (int t = 0; t < n_ctx; ++t) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += double(q[h * hd + i]) * k[(size_t(t) * s.n_kv_heads + g) * hd + i];
      p[t] = d * s.scale;
      if (s.softcap > 0) p[t] = s.softcap * std::tanh(p[t] / s.softcap);
      mx = p[t] > mx ? p[t] : mx;
    }
    if (s.sinks) mx = std::max(mx, double(s.sinks[h]));
    double sum = s.sinks ? std::exp(double(s.sinks[h]) - mx) : 0.0;
    for (int t = 0; t < n_ctx; ++t) sum += (p[t] = std::exp(p[t] - mx));
    for (int i = 0; i < hd; ++i) {
      double o = 0;
      for (int t = 0; t < n_ctx; ++t) o += p[t] / sum * v[(size_t(t) * s.n_kv_heads + g) * hd + i];
      out[h * hd + i] = float(o);
    }
  }
}

}  // namespace kvs
