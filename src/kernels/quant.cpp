// Scalar reference for the ggml tensor formats: type table, half/bfloat
// conversions, dequantizers (bit-exact with ggml's dequantize_row_*) and the
// reference quantizers the GGUF writer uses. The fast kernels live elsewhere;
// everything here favours obviously-correct code over speed.
#include "kernels/quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace kvs {

namespace {

// One row per known on-disk id. Q8_1/Q2_K/Q3_K/Q8_K have known sizes (so a
// GGUF holding them can still be parsed and reported) but we cannot run them.
struct TypeRow {
  GgmlType type;
  TypeTraits traits;
};
const TypeRow kTypes[] = {
    {GgmlType::F32, {"F32", 1, 4, true}},
    {GgmlType::F16, {"F16", 1, 2, true}},
    {GgmlType::Q4_0, {"Q4_0", QK4_0, sizeof(BlockQ4_0), true}},
    {GgmlType::Q4_1, {"Q4_1", QK4_1, sizeof(BlockQ4_1), true}},
    {GgmlType::Q5_0, {"Q5_0", QK5_0, sizeof(BlockQ5_0), true}},
    {GgmlType::Q5_1, {"Q5_1", QK5_1, sizeof(BlockQ5_1), true}},
    {GgmlType::Q8_0, {"Q8_0", QK8_0, sizeof(BlockQ8_0), true}},
    {GgmlType::Q8_1, {"Q8_1", 32, 36, false}},  // fp16 d, fp16 s, 32 x int8
    {GgmlType::Q2_K, {"Q2_K", QK_K, 84, false}},   // scales[16], qs[64], d, dmin
    {GgmlType::Q3_K, {"Q3_K", QK_K, 110, false}},  // hmask[32], qs[64], scales[12], d
    {GgmlType::Q4_K, {"Q4_K", QK_K, sizeof(BlockQ4_K), true}},
    {GgmlType::Q5_K, {"Q5_K", QK_K, sizeof(BlockQ5_K), true}},
    {GgmlType::Q6_K, {"Q6_K", QK_K, sizeof(BlockQ6_K), true}},
    {GgmlType::Q8_K, {"Q8_K", QK_K, sizeof(BlockQ8_K), false}},
    {GgmlType::BF16, {"BF16", 1, 2, true}},
};

const TypeRow* find_type(uint32_t raw) {
  for (const auto& r : kTypes)
    if (static_cast<uint32_t>(r.type) == raw) return &r;
  return nullptr;
}

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round half to even, as ggml's nearest_int (its magic-number trick gives
// RNE for |x| < 2^22; quantizer inputs are always far inside that).
int nearest_int(float x) {
  if (!(std::fabs(x) < 4194303.f)) return x > 0 ? 4194303 : (x < 0 ? -4194303 : 0);
  return static_cast<int>(std::nearbyint(x));
}

void check_blocks(GgmlType t, int64_t n, const char* what) {
  const TypeTraits& tt = type_traits(t);
  if (n < 0 || n % tt.block_elems != 0)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) +
                                " elements is not a multiple of the " + tt.name + " block size " +
                                std::to_string(tt.block_elems));
}

// ---- K-quant scale packing -------------------------------------------------
// 8 sub-blocks each have a 6-bit scale and 6-bit min packed into 12 bytes:
// bytes 0..3 low 6 bits of scales 0..3 (top 2 bits carry scale 4..7 high
// bits), bytes 4..7 likewise for mins, bytes 8..11 low nibbles of scales /
// mins 4..7.
void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// ---- dequantizers (one block at a time; ggml's element order) -------------

void deq_q4_0(const BlockQ4_0* b, float* y) {
  const float d = fp16_to_f32(b->d);
  for (int j = 0; j < QK4_0 / 2; ++j) {
    const int x0 = (b->qs[j] & 0x0F) - 8;
    const int x1 = (b->qs[j] >> 4) - 8;
    y[j] = x0 * d;
    y[j + QK4_0 / 2] = x1 * d;
  }
}

void deq_q4_1(const BlockQ4_1* b, float* y) {
  const float d = fp16_to_f32(b->d), m = fp16_to_f32(b->m);
  for (int j = 0; j < QK4_1 / 2; ++j) {
    const int x0 = b->qs[j] & 0x0F;
    const int x1 = b->qs[j] >> 4;
    y[j] = x0 * d + m;
    y[j + QK4_1 / 2] = x1 * d + m;
  }
}

void deq_q5_0(const BlockQ5_0* b, float* y) {
  const float d = fp16_to_f32(b->d);
  uint32_t qh;
  std::memcpy(&qh, b->qh, 4);  // bit j = 5th bit of element j
  for (int j = 0; j < QK5_0 / 2; ++j) {
    const uint8_t h0 = ((qh >> j) << 4) & 0x10;
    const uint8_t h1 = (qh >> (j + 12)) & 0x10;
    const int x0 = ((b->qs[j] & 0x0F) | h0) - 16;
    const int x1 = ((b->qs[j] >> 4) | h1) - 16;
    y[j] = x0 * d;
    y[j + QK5_0 / 2] = x1 * d;
  }
}

void deq_q5_1(const BlockQ5_1* b, float* y) {
  const float d = fp16_to_f32(b->d), m = fp16_to_f32(b->m);
  uint32_t qh;
  std::memcpy(&qh, b->qh, 4);
  for (int j = 0; j < QK5_1 / 2; ++j) {
    const uint8_t h0 = ((qh >> j) << 4) & 0x10;
    const uint8_t h1 = (qh >> (j + 12)) & 0x10;
    const int x0 = (b->qs[j] & 0x0F) | h0;
    const int x1 = (b->qs[j] >> 4) | h1;
    y[j] = x0 * d + m;
    y[j + QK5_1 / 2] = x1 * d + m;
  }
}

void deq_q8_0(const BlockQ8_0* b, float* y) {
  const float d = fp16_to_f32(b->d);
  for (int j = 0; j < QK8_0; ++j) y[j] = b->qs[j] * d;
}

// 256 elements = 4 chunks of 64; each chunk's 32 bytes hold sub-block 2c in
// the low nibbles and sub-block 2c+1 in the high nibbles.
void deq_q4_k(const BlockQ4_K* b, float* y) {
  const float d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
  const uint8_t* q = b->qs;
  int is = 0;
  for (int j = 0; j < QK_K; j += 64) {
    uint8_t sc, m;
    get_scale_min_k4(is + 0, b->scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    get_scale_min_k4(is + 1, b->scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

// As Q4_K plus a 5th bit: qh[l] bit 2c is element l of sub-block 2c, bit 2c+1
// element l of sub-block 2c+1.
void deq_q5_k(const BlockQ5_K* b, float* y) {
  const float d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
  const uint8_t* ql = b->qs;
  const uint8_t* qh = b->qh;
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < QK_K; j += 64) {
    uint8_t sc, m;
    get_scale_min_k4(is + 0, b->scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    get_scale_min_k4(is + 1, b->scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 <<= 2;
    u2 <<= 2;
  }
}

// Two halves of 128; in each, ql[0..31]/ql[32..63] low nibbles are elements
// 0..31/32..63, high nibbles 64..95/96..127; qh[l] holds the top 2 bits of
// the four elements l, l+32, l+64, l+96. 16 signed 8-bit scales, one per 16.
void deq_q6_k(const BlockQ6_K* b, float* y) {
  const float d = fp16_to_f32(b->d);
  const uint8_t* ql = b->ql;
  const uint8_t* qh = b->qh;
  const int8_t* sc = b->scales;
  for (int n = 0; n < QK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
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

template <class Block, class F>
void per_block_deq(const void* src, float* dst, int64_t n, int qk, F f) {
  const Block* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / qk; ++i) f(b + i, dst + i * qk);
}

template <class Block, class F>
void per_block_q(const float* src, void* dst, int64_t n, int qk, F f) {
  Block* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / qk; ++i) f(src + i * qk, b + i);
}

}  // namespace

const TypeTraits& type_traits(GgmlType t) {
  const TypeRow* r = find_type(static_cast<uint32_t>(t));
  if (!r) throw std::invalid_argument("unknown ggml type id " + std::to_string(static_cast<uint32_t>(t)));
  return r->traits;
}

bool is_known_type(uint32_t raw) { return find_type(raw) != nullptr; }

std::string type_name(GgmlType t) {
  const TypeRow* r = find_type(static_cast<uint32_t>(t));
  return r ? r->traits.name : "type#" + std::to_string(static_cast<uint32_t>(t));
}

size_t row_bytes(GgmlType t, int64_t n) {
  check_blocks(t, n, "row_bytes");
  const TypeTraits& tt = type_traits(t);
  return static_cast<size_t>(n / tt.block_elems) * tt.block_bytes;
}

// ---- half / bfloat16 --------------------------------------------------------

float fp16_to_f32(fp16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7F800000u | (mant << 13));  // inf / NaN (payload kept)
  return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));       // rebias 15 -> 127
}

fp16_t f32_to_fp16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7FFFFFFF;
  if (a >= 0x7F800000u) {
    if (a == 0x7F800000u) return sign | 0x7C00;
    // NaN: keep the top payload bits, force quiet so it never turns into inf.
    return sign | 0x7E00 | static_cast<uint16_t>((a >> 13) & 0x3FF);
  }
  const int exp = static_cast<int>(a >> 23) - 127;
  if (exp > 15) return sign | 0x7C00;  // overflow
  if (exp >= -14) {
    // Normal half. Rounding carries into the exponent naturally (0x7BFF+1 = inf).
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | ((a >> 13) & 0x3FF);
    const uint32_t rem = a & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: +-0
  // Subnormal half: units of 2^-24. m carries the implicit bit (24 bits).
  const uint32_t m = (a & 0x7FFFFF) | 0x800000;
  const int shift = -(exp + 1);  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1))) ++h;  // may round up to the smallest normal
  return sign | static_cast<uint16_t>(h);
}

float bf16_to_f32(bf16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

bf16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000u) return static_cast<bf16_t>((u >> 16) | 0x40);  // quiet NaN
  // Round to nearest even on the dropped 16 bits; subnormals round the same
  // way and overflow carries into inf.
  return static_cast<bf16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// ---- row entry points -------------------------------------------------------

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  check_blocks(t, n, "dequantize_row");
  switch (t) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16: {
      const uint8_t* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        fp16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = fp16_to_f32(h);
      }
      return;
    }
    case GgmlType::BF16: {
      const uint8_t* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        bf16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    case GgmlType::Q4_0: return per_block_deq<BlockQ4_0>(src, dst, n, QK4_0, deq_q4_0);
    case GgmlType::Q4_1: return per_block_deq<BlockQ4_1>(src, dst, n, QK4_1, deq_q4_1);
    case GgmlType::Q5_0: return per_block_deq<BlockQ5_0>(src, dst, n, QK5_0, deq_q5_0);
    case GgmlType::Q5_1: return per_block_deq<BlockQ5_1>(src, dst, n, QK5_1, deq_q5_1);
    case GgmlType::Q8_0: return per_block_deq<BlockQ8_0>(src, dst, n, QK8_0, deq_q8_0);
    case GgmlType::Q4_K: return per_block_deq<BlockQ4_K>(src, dst, n, QK_K, deq_q4_k);
    case GgmlType::Q5_K: return per_block_deq<BlockQ5_K>(src, dst, n, QK_K, deq_q5_k);
    case GgmlType::Q6_K: return per_block_deq<BlockQ6_K>(src, dst, n, QK_K, deq_q6_k);
    default:
      throw std::invalid_argument("dequantize_row: type " + type_name(t) + " is not supported");
  }
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  check_blocks(t, n, "quantize_row");
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
    default:
      throw std::invalid_argument("quantize_row: type " + type_name(t) + " is not supported for writing");
  }
}

}  // namespace kvs
