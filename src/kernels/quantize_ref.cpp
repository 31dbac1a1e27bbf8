// ggml's reference quantizers (quantize_row_*_ref): what the GGUF writer
// uses to encode weights. Same algorithms as ggml, so files we write are
// what llama.cpp's quantizer would make from the same floats.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "kernels/quant.h"
#include "kernels/quant_internal.h"

namespace kvs {

namespace {

using detail::get_scale_min_k4;

// Round half to even, as ggml's nearest_int (its magic-number trick gives
// RNE for |x| < 2^22; quantizer inputs are always far inside that).
int nearest_int(float x) {
  if (!(std::fabs(x) < 4194303.f)) return x > 0 ? 4194303 : (x < 0 ? -4194303 : 0);
  return static_cast<int>(std::nearbyint(x));
}
// ---- reference quantizers (ggml's *_ref algorithms) ------------------------

// Symmetric: the largest-magnitude value maps to -8 exactly (keeps its sign).
void q_q4_0(const float* x, BlockQ4_0* b) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < QK4_0; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.f;
  const float id = d != 0.f ? 1.0f / d : 0.0f;
  b->d = f32_to_fp16(d);
  for (int j = 0; j < QK4_0 / 2; ++j) {
    const float x0 = x[j] * id, x1 = x[QK4_0 / 2 + j] * id;
    const uint8_t xi0 = std::min<int8_t>(15, static_cast<int8_t>(x0 + 8.5f));
    const uint8_t xi1 = std::min<int8_t>(15, static_cast<int8_t>(x1 + 8.5f));
    b->qs[j] = xi0 | (xi1 << 4);
  }
}

void q_q4_1(const float* x, BlockQ4_1* b) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < QK4_1; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15.f;
  const float id = d != 0.f ? 1.0f / d : 0.0f;
  b->d = f32_to_fp16(d);
  b->m = f32_to_fp16(min);
  for (int j = 0; j < QK4_1 / 2; ++j) {
    const float x0 = (x[j] - min) * id, x1 = (x[QK4_1 / 2 + j] - min) * id;
    const uint8_t xi0 = std::min<int8_t>(15, static_cast<int8_t>(x0 + 0.5f));
    const uint8_t xi1 = std::min<int8_t>(15, static_cast<int8_t>(x1 + 0.5f));
    b->qs[j] = xi0 | (xi1 << 4);
  }
}

void q_q5_0(const float* x, BlockQ5_0* b) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < QK5_0; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -16.f;
  const float id = d != 0.f ? 1.0f / d : 0.0f;
  b->d = f32_to_fp16(d);
  uint32_t qh = 0;
  for (int j = 0; j < QK5_0 / 2; ++j) {
    const float x0 = x[j] * id, x1 = x[QK5_0 / 2 + j] * id;
    const uint8_t xi0 = std::min<int8_t>(31, static_cast<int8_t>(x0 + 16.5f));
    const uint8_t xi1 = std::min<int8_t>(31, static_cast<int8_t>(x1 + 16.5f));
    b->qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
    qh |= ((xi0 & 0x10u) >> 4) << j;
    qh |= ((xi1 & 0x10u) >> 4) << (j + QK5_0 / 2);
  }
  std::memcpy(b->qh, &qh, 4);
}

void q_q5_1(const float* x, BlockQ5_1* b) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < QK5_1; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 31.f;
  const float id = d != 0.f ? 1.0f / d : 0.0f;
  b->d = f32_to_fp16(d);
  b->m = f32_to_fp16(min);
  uint32_t qh = 0;
  for (int j = 0; j < QK5_1 / 2; ++j) {
    const float x0 = (x[j] - min) * id, x1 = (x[QK5_1 / 2 + j] - min) * id;
    const uint8_t xi0 = static_cast<uint8_t>(x0 + 0.5f);
    const uint8_t xi1 = static_cast<uint8_t>(x1 + 0.5f);
    b->qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
    qh |= ((xi0 & 0x10u) >> 4) << j;
    qh |= ((xi1 & 0x10u) >> 4) << (j + QK5_1 / 2);
  }
  std::memcpy(b->qh, &qh, 4);
}

void q_q8_0(const float* x, BlockQ8_0* b) {
  float amax = 0.f;
  for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.0f / d : 0.0f;
  b->d = f32_to_fp16(d);
  for (int j = 0; j < QK8_0; ++j) b->qs[j] = static_cast<int8_t>(std::round(x[j] * id));
}

// Weighted least-squares fit of x ~ scale * L + min with L in [0, nmax]
// (ggml's make_qkx2_quants): start from the min/max grid, then try nstep
// perturbed grids and keep the one with the lowest weighted squared error.
// Returns the scale; *neg_min receives -min (>= 0).
float make_qkx2_quants(int n, int nmax, const float* x, const float* w, uint8_t* L,
                       float* neg_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *neg_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_err = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
    L[i] = static_cast<uint8_t>(l);
    const float diff = scale * L[i] + min - x[i];
    best_err += w[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        err += w[i] * diff * diff;
      }
      if (err < best_err) {
        std::copy(Laux, Laux + n, L);
        best_err = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Symmetric fit x ~ scale * (L - nmax), L in [0, 2*nmax), weights x^2
// (ggml's make_qx_quants with rmse_type 1); tries 18 perturbed grids.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::fill(L, L + n, 0);
    return 0.f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = 0;
    *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  auto assign = [&](float iscale) {
    for (int i = 0; i < n; ++i)
      L[i] = static_cast<int8_t>(nmax + std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1));
  };
  float iscale = -nmax / max;
  float sumlx, suml2;
  fit(iscale, &sumlx, &suml2);
  assign(iscale);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      assign(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Shared by Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scale and min each.
// Fills b's d/dmin/scales and L[256] with values in [0, nmax].
template <class Block>
void quantize_k_scales(const float* x, Block* b, uint8_t* L, int nmax, float rmin, int nstep) {
  float mins[QK_K / 32], scales[QK_K / 32], weights[32];
  uint8_t Laux[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < QK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                                 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(b->scales, 0, K_SCALE_SIZE);
  for (int j = 0; j < QK_K / 32; ++j) {
    const uint8_t ls = static_cast<uint8_t>(std::min(63, nearest_int(inv_scale * scales[j])));
    const uint8_t lm = static_cast<uint8_t>(std::min(63, nearest_int(inv_min * mins[j])));
    if (j < 4) {
      b->scales[j] = ls;
      b->scales[j + 4] = lm;
    } else {
      b->scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
      b->scales[j - 4] |= ((ls >> 4) << 6);
      b->scales[j - 0] |= ((lm >> 4) << 6);
    }
  }
  b->d = f32_to_fp16(max_scale / 63.f);
  b->dmin = f32_to_fp16(max_min / 63.f);
  // Re-quantize against the rounded 6-bit scales actually stored.
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, b->scales, &sc, &m);
    const float d = fp16_to_f32(b->d) * sc;
    if (d == 0.f) continue;
    const float dm = fp16_to_f32(b->dmin) * m;
    for (int ii = 0; ii < 32; ++ii)
      L[32 * j + ii] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax));
  }
}

void q_q4_k(const float* x, BlockQ4_K* b) {
  uint8_t L[QK_K];
  quantize_k_scales(x, b, L, 15, -1.f, 20);
  uint8_t* q = b->qs;
  for (int j = 0; j < QK_K; j += 64) {
    for (int l = 0; l < 32; ++l) q[l] = L[j + l] | (L[j + l + 32] << 4);
    q += 32;
  }
}

void q_q5_k(const float* x, BlockQ5_K* b) {
  uint8_t L[QK_K];
  quantize_k_scales(x, b, L, 31, -0.5f, 15);
  std::memset(b->qh, 0, sizeof b->qh);
  uint8_t* ql = b->qs;
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < QK_K; n += 64) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) {
        l1 -= 16;
        b->qh[j] |= m1;
      }
      if (l2 > 15) {
        l2 -= 16;
        b->qh[j] |= m2;
      }
      ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    m1 <<= 2;
    m2 <<= 2;
    ql += 32;
  }
}

void q_q6_k(const float* x, BlockQ6_K* b) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < QK_K / 16; ++ib) {
    scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
    if (std::fabs(scales[ib]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }
  if (max_abs_scale < 1e-15f) {
    std::memset(b, 0, sizeof *b);
    return;
  }
  const float iscale = -128.f / max_scale;
  b->d = f32_to_fp16(1 / iscale);
  for (int ib = 0; ib < QK_K / 16; ++ib)
    b->scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  for (int j = 0; j < QK_K / 16; ++j) {
    const float d = fp16_to_f32(b->d) * b->scales[j];
    if (d == 0.f) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
  }
  uint8_t* ql = b->ql;
  uint8_t* qh = b->qh;
  for (int j = 0; j < QK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
      const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
      ql[l + 0] = q1 | (q3 << 4);
      ql[l + 32] = q2 | (q4 << 4);
      qh[l] = (L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
              ((L[j + l + 96] >> 4) << 6);
    }
    ql += 64;
    qh += 32;
  }
}
// ggml's quantize_row_mxfp4_ref (mainline), the same as ik_llama.cpp's
// quantize_mxfp4: the scale 2^(e - 127) puts the block's largest magnitude
// in [4, 8) scale units (e2m1 tops out at 6, so the top of that range
// clips), then each element takes the nearest code, the first in table
// order on a tie (0, never -0). log2f is glibc's, as the peers use.
void q_mxfp4(const float* x, BlockMXFP4* b) {
  float amax = 0.f;
  // std::max(amax, NaN) keeps amax, as ggml's loop does.
  for (int j = 0; j < QK_MXFP4; ++j) amax = std::max(amax, std::fabs(x[j]));
  std::memset(b, 0, sizeof *b);
  if (amax == 0.f) return;  // e = 0, every code 0
  // ggml converts this float straight to uint8_t, which C leaves undefined
  // outside [0, 255] (amax below 2^-125, or infinite); x86 builds keep the
  // low byte of the int32 conversion (cvttss2si: 0x80000000 when out of
  // range). Done explicitly here, so files match the peers' bit for bit.
  const float ef = floorf(log2f(amax)) - 2 + 127;
  const int32_t ei = std::fabs(ef) < 2147483648.f ? static_cast<int32_t>(ef) : INT32_MIN;
  b->e = static_cast<uint8_t>(static_cast<uint32_t>(ei) & 0xFF);
  const float d = e8m0_half(b->e);
  auto best = [d](float v) {
    float best_err = std::fabs(v - d * kMxfp4Values[0]);
    int index = 0;
    for (int k = 1; k < 16; ++k) {
      const float err = std::fabs(v - d * kMxfp4Values[k]);
      if (err < best_err) {
        best_err = err;
        index = k;
      }
    }
    return index;
  };
  for (int j = 0; j < QK_MXFP4 / 2; ++j)
    b->qs[j] = static_cast<uint8_t>(best(x[j]) | (best(x[j + QK_MXFP4 / 2]) << 4));
}

template <class Block, class F>
void per_block_q(const float* src, void* dst, int64_t n, int qk, F f) {
  Block* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / qk; ++i) f(src + i * qk, b + i);
}
}  // namespace

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  detail::check_blocks(t, n, "quantize_row");
  switch (t) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16: {
      uint8_t* p = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const fp16_t h = f32_to_fp16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    }
    case GgmlType::BF16: {
      uint8_t* p = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const bf16_t h = f32_to_bf16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    }
    case GgmlType::Q4_0: return per_block_q<BlockQ4_0>(src, dst, n, QK4_0, q_q4_0);
    case GgmlType::Q4_1: return per_block_q<BlockQ4_1>(src, dst, n, QK4_1, q_q4_1);
    case GgmlType::Q5_0: return per_block_q<BlockQ5_0>(src, dst, n, QK5_0, q_q5_0);
    case GgmlType::Q5_1: return per_block_q<BlockQ5_1>(src, dst, n, QK5_1, q_q5_1);
    case GgmlType::Q8_0: return per_block_q<BlockQ8_0>(src, dst, n, QK8_0, q_q8_0);
    case GgmlType::Q4_K: return per_block_q<BlockQ4_K>(src, dst, n, QK_K, q_q4_k);
    case GgmlType::Q5_K: return per_block_q<BlockQ5_K>(src, dst, n, QK_K, q_q5_k);
    case GgmlType::Q6_K: return per_block_q<BlockQ6_K>(src, dst, n, QK_K, q_q6_k);
    case GgmlType::MXFP4: return per_block_q<BlockMXFP4>(src, dst, n, QK_MXFP4, q_mxfp4);
    default:
      throw std::invalid_argument("quantize_row: type " + type_name(t) + " is not supported for writing");
  }
}

}  // namespace kvs
