#include "kernels/attention_tile.h"

#include <algorithm>
#include <cstring>

#include "kernels/flash_attention.h"
#include "kernels/kv_codec.h"
#include "kernels/ops.h"

namespace kvs {

namespace {

using attn::kTile;

// Length of the run of loaded rows from tile row t: consecutive set bits
// that stay in one block and on one side of n_stored.
int run_length(unsigned rows, int t, int p, int bs, int n_stored) {
  const int limit = p < n_stored ? std::min((p / bs + 1) * bs, n_stored) : p + kTile;
  int n = 1;
  while (t + n < kTile && (rows >> (t + n) & 1u) && p + n < limit) ++n;
  return n;
}

// Keys stored before RoPE: rotated to i (sinks) or i - shift (the window).
void rotate_keys(const AttnSeq& seq, int hd, int p, int n, float* k) {
  const int half = seq.n_rot / 2;
  for (int i = 0; i < n; ++i) {
    const int pos = p + i < seq.sink_end ? p + i : p + i - seq.shift;
    rope_apply(k + size_t(i) * hd, 1, hd, seq.n_rot, seq.neox, seq.rope_cos + size_t(pos) * half,
               seq.rope_sin + size_t(pos) * half);
  }
}

}  // namespace

void load_attention_tile(const KvStorage& kv, int layer, const AttnSeq& seq, int g, int p0, unsigned rows, float* k,
                         float* v) {
  const int hd = kv.layout.head_dim, bs = kv.layout.block_size;
  const size_t kvdim = kv.layout.row_floats();
  for (int t = 0; t < kTile;) {
    float* kt = k + size_t(t) * hd;  // [n, hd] of this run
    float* vt = v + size_t(t) * hd;
    if (!(rows >> t & 1u)) {
      std::memset(kt, 0, size_t(hd) * sizeof(float));
      std::memset(vt, 0, size_t(hd) * sizeof(float));
      ++t;
      continue;
    }
    const int p = p0 + t, n = run_length(rows, t, p, bs, seq.n_stored);
    if (p < seq.n_stored) {
      const int32_t b = seq.block_table[p / bs];
      kvc::load_k(kv, b, layer, g, p % bs, n, kt);
      kvc::load_v(kv, b, layer, g, p % bs, n, vt);
    } else {
      // The residual group's rows, in full precision.
      const size_t own = size_t(p - seq.n_stored) * kvdim + size_t(g) * hd;
      for (int i = 0; i < n; ++i) {
        std::memcpy(kt + size_t(i) * hd, seq.own_k + own + i * kvdim, size_t(hd) * sizeof(float));
        std::memcpy(vt + size_t(i) * hd, seq.own_v + own + i * kvdim, size_t(hd) * sizeof(float));
      }
    }
    if (seq.rope_cos) rotate_keys(seq, hd, p, n, kt);
    t += n;
  }
}

void prefetch_attention_tile(const KvStorage& kv, int layer, const AttnSeq& seq, int g, int p0) {
  const int bs = kv.layout.block_size, end = std::min(p0 + kTile, seq.n_stored);
  for (int p = p0; p < end;) {
    const int n = std::min(end, (p / bs + 1) * bs) - p;
    const int32_t b = seq.block_table[p / bs];
    if (b >= 0) kvc::prefetch_rows(kv, b, layer, g, p % bs, n);
    p += n;
  }
}

}  // namespace kvs
