// Scalar path: unpacking of every weight format into 32-element level
// blocks, the activation quantizer, and the plain-C++ kernels. This file is
// the executable definition of the arithmetic in matmul_internal.h; the SIMD
// paths are tested bit-exact against it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/matmul_internal.h"

namespace kvs::mm {
namespace {

inline uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// 6-bit scale / min j (0..7) of a Q4_K / Q5_K super-block (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Block b of a Q4_K / Q5_K row (unpack_block).
void unpack_k4(bool five, const uint8_t* row, int64_t b, WBlock* o) {
  // Sub-block j of super-block b/8: j = 2c uses the low nibbles of
  // qs[32c .. 32c+32), j = 2c+1 the high nibbles (+ bit j of qh for Q5_K).
  const int64_t sb = b / 8;
  const int j = int(b % 8);
  const uint8_t* p = row + sb * (five ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
  const float d = fp16_to_f32(rd16(p)), dmin = fp16_to_f32(rd16(p + 2));
  const uint8_t* scales = p + 4;
  const uint8_t* qh = five ? p + 16 : nullptr;
  const uint8_t* qs = p + 16 + (five ? 32 : 0) + 32 * (j / 2);
  int sc, m;
  scale_min_k4(j, scales, &sc, &m);
  o->ws[0] = d;
  o->wm = -dmin;
  o->sc[0] = sc;
  o->sc[1] = m;
  const int shift = (j & 1) ? 4 : 0;
  for (int l = 0; l < 32; ++l) {
    int v = (qs[l] >> shift) & 0xF;
    if (five) v |= ((qh[l] >> j) & 1) << 4;
    o->q[l] = int8_t(v);
  }
}

// Block b of a Q6_K row (unpack_block).
void unpack_q6k(const uint8_t* row, int64_t b, WBlock* o) {
  // Block t (0..7) of a super-block: half = t / 4 picks the 128-element
  // chunk; within it u = t % 4 selects ql[l + 32*(u&1)] nibble (u>>1) and
  // bits 2u..2u+1 of qh[l]. Scales sc[2t], sc[2t+1] cover the halves.
  const int64_t sb = b / 8;
  const int t8 = int(b % 8);
  const auto* blk = reinterpret_cast<const BlockQ6_K*>(row) + sb;
  const float d = fp16_to_f32(blk->d);
  const int chunk = t8 / 4, u = t8 % 4;
  const uint8_t* ql = blk->ql + 64 * chunk + 32 * (u & 1);
  const uint8_t* qh = blk->qh + 32 * chunk;
  const int nshift = (u >> 1) * 4, hshift = 2 * u;
  for (int l = 0; l < 32; ++l) {
    const int v = ((ql[l] >> nshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4);
    o->q[l] = int8_t(v - 32);
  }
  const int8_t* sc = blk->scales + 8 * chunk + 2 * u;
  o->ws[0] = d;
  o->sc[0] = sc[0];
  o->sc[1] = sc[1];
}

}  // namespace

bool is_float_type(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

bool is_quant_type(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
    case GgmlType::MXFP4:
      return true;
    default:
      return false;
  }
}

QFormat qformat(GgmlType t, bool signed_q8) {
  switch (t) {
    case GgmlType::Q4_0: return {8, false, false};
    case GgmlType::Q4_1: return {0, false, true};
    case GgmlType::Q5_0: return {16, false, false};
    case GgmlType::Q5_1: return {0, false, true};
    case GgmlType::Q8_0: return {signed_q8 ? 0 : 128, false, false};
    case GgmlType::Q4_K: return {0, false, true, true};
    case GgmlType::Q5_K: return {0, false, true, true};
    case GgmlType::Q6_K: return {32, true, false, true};
    case GgmlType::MXFP4: return {12, false, false};  // levels = the doubled e2m1 values, -12..12
    default: throw std::invalid_argument("matmul: not a quantized weight type: " + type_name(t));
  }
}

void unpack_block(GgmlType t, const uint8_t* row, int64_t b, WBlock* o) {
  o->ws[1] = 0.0f;
  o->wm = 0.0f;
  switch (t) {
    case GgmlType::Q4_0: {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      o->ws[0] = fp16_to_f32(blk->d);
      for (int j = 0; j < 16; ++j) {
        o->q[j] = int8_t((blk->qs[j] & 0xF) - 8);
        o->q[j + 16] = int8_t((blk->qs[j] >> 4) - 8);
      }
      return;
    }
    case GgmlType::Q4_1: {
      const auto* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
      o->ws[0] = fp16_to_f32(blk->d);
      o->wm = fp16_to_f32(blk->m);
      for (int j = 0; j < 16; ++j) {
        o->q[j] = int8_t(blk->qs[j] & 0xF);
        o->q[j + 16] = int8_t(blk->qs[j] >> 4);
      }
      return;
    }
    case GgmlType::Q5_0: case GgmlType::Q5_1: {
      const bool one = t == GgmlType::Q5_1;
      const uint8_t* p = row + b * (one ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
      o->ws[0] = fp16_to_f32(rd16(p));
      if (one) o->wm = fp16_to_f32(rd16(p + 2));
      const uint8_t* qhp = p + (one ? 4 : 2);
      const uint8_t* qs = qhp + 4;
      uint32_t qh;
      std::memcpy(&qh, qhp, 4);
      const int sub = one ? 0 : 16;
      for (int j = 0; j < 16; ++j) {
        o->q[j] = int8_t(((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - sub);
        o->q[j + 16] = int8_t(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - sub);
      }
      return;
    }
    case GgmlType::MXFP4: {
      // Levels are the doubled e2m1 values and ws half the E8M0 scale, so
      // ws * q is exactly the element's value (ggml's dequantize_row_mxfp4).
      const auto* blk = reinterpret_cast<const BlockMXFP4*>(row) + b;
      o->ws[0] = e8m0_half(blk->e);
      for (int j = 0; j < 16; ++j) {
        o->q[j] = kMxfp4Values[blk->qs[j] & 0xF];
        o->q[j + 16] = kMxfp4Values[blk->qs[j] >> 4];
      }
      return;
    }
    case GgmlType::Q8_0: {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      o->ws[0] = fp16_to_f32(blk->d);
      std::memcpy(o->q, blk->qs, 32);
      return;
    }
    case GgmlType::Q4_K: case GgmlType::Q5_K: return unpack_k4(t == GgmlType::Q5_K, row, b, o);
    case GgmlType::Q6_K: return unpack_q6k(row, b, o);
    default:
      throw std::invalid_argument("matmul: unsupported weight type " + type_name(t));
  }
}

namespace {
float block_amax(const float* xb) {  // [32]
  float amax = 0.0f;
  for (int e = 0; e < kQBlock; ++e) amax = std::max(amax, std::fabs(xb[e]));
  return amax;
}
}  // namespace

void quantize_x_scalar(const float* x, int64_t cols, QFormat f, XBlock* out) {
  const int64_t nb = cols / kQBlock;
  float group = 0.0f;  // K-quants: the super-block's maximum
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQBlock;  // [32]
    XBlock& o = out[b];
    if (f.super && b % kSuperBlocks == 0) {
      group = 0.0f;
      for (int64_t j = b; j < std::min(nb, b + kSuperBlocks); ++j) group = std::max(group, block_amax(x + j * kQBlock));
    }
    const float amax = f.super ? group : block_amax(xb);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum[2] = {0, 0};
    for (int e = 0; e < kQBlock; ++e) {
      float v = round_rne(xb[e] * id);
      v = std::min(127.0f, std::max(-127.0f, v));
      o.q[e] = int8_t(v);
      sum[e / 16] += o.q[e];
    }
    o.d = d;
    o.s = d * float(sum[0] + sum[1]);
    if (f.sub16) {
      o.corr[0] = -f.off * sum[0];
      o.corr[1] = -f.off * sum[1];
    } else {
      o.corr[0] = -f.off * (sum[0] + sum[1]);
      o.corr[1] = f.super ? sum[0] + sum[1] : 0;
    }
  }
}

namespace {

// The quantized-activation algorithm, literally. Per weight block: unpack
// once, then update every activation row's accumulator (kept in y).
void quant_rows_scalar(const WeightView& w, int64_t r0, int64_t r1, const XBlock* xq, int64_t n,
                       float* y, int64_t ldy, Scratch) {
  const QFormat f = qformat(w.type);
  const int64_t nb = w.cols / kQBlock;
  WBlock wb;
  std::vector<int32_t> ssum(size_t(f.super ? n : 0)), msum(ssum.size());  // K-quants: S, M per activation row
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    for (int64_t i = 0; i < n; ++i) y[i * ldy + r] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      unpack_block(w.type, row, b, &wb);
      for (int64_t i = 0; i < n; ++i) {
        const XBlock& xb = xq[i * nb + b];
        int32_t s0 = 0, s1 = 0;
        for (int e = 0; e < 16; ++e) s0 += int32_t(wb.q[e]) * xb.q[e];
        for (int e = 16; e < 32; ++e) s1 += int32_t(wb.q[e]) * xb.q[e];
        if (f.super) {  // the super-block's integer sums, then one float step (two with a min)
          if (b % kSuperBlocks == 0) ssum[i] = msum[i] = 0;
          if (f.sub16) {
            ssum[i] += wb.sc[0] * s0 + wb.sc[1] * s1;
          } else {
            ssum[i] += wb.sc[0] * (s0 + s1);
            msum[i] += wb.sc[1] * xb.corr[1];
          }
          if (b % kSuperBlocks == kSuperBlocks - 1) {
            float acc = std::fma(float(ssum[i]), wb.ws[0] * xb.d, y[i * ldy + r]);
            if (f.has_min) acc = std::fma(float(msum[i]), wb.wm * xb.d, acc);
            y[i * ldy + r] = acc;
          }
          continue;
        }
        float acc = y[i * ldy + r];
        acc = std::fma(float(s0 + s1), wb.ws[0] * xb.d, acc);
        if (f.has_min) acc = std::fma(wb.wm, xb.s, acc);
        y[i * ldy + r] = acc;
      }
    }
  }
}

inline float float_weight(const WeightView& w, const uint8_t* row, int64_t k) {
  if (w.type == GgmlType::F32) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * k, 2);
  return w.type == GgmlType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

// Float weights: 16 lane accumulators (lane = k mod 16) then the fixed tree;
// a packed view runs the k-chain order instead.
void float_rows_scalar(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                       int64_t n, float* y, int64_t ldy, Scratch) {
  if (w.pack != PackLayout::None) return float_rows_chain_scalar(w, r0, r1, x, ldx, n, y, ldy);
  const int64_t cols = w.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * ldx;  // [cols]
      float lane[16] = {};
      for (int64_t k = 0; k < cols; ++k)
        lane[k & 15] = std::fma(float_weight(w, row, k), xi[k], lane[k & 15]);
      y[i * ldy + r] = float_tree_sum(lane);
    }
  }
}

}  // namespace

void float_rows_chain_scalar(const WeightView& w, int64_t r0, int64_t r1, const float* x,
                             int64_t ldx, int64_t n, float* y, int64_t ldy) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * ldx;  // [cols]
      float acc = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) acc = std::fma(float_weight(w, row, k), xi[k], acc);
      y[i * ldy + r] = acc;
    }
  }
}

const IsaKernels& scalar_kernels() {
  static const IsaKernels k{1, quantize_x_scalar, false, quant_rows_scalar, float_rows_scalar};
  return k;
}

}  // namespace kvs::mm
