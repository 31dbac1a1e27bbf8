// Scalar reference for the ggml tensor formats: type table, half/bfloat
// conversions and dequantizers (bit-exact with ggml's dequantize_row_*).
// The quantizers are in quantize_ref.cpp; the fast kernels live elsewhere.
// Everything here favours obviously-correct code over speed.
#include "kernels/quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/quant_internal.h"

namespace kvs {

namespace {

using detail::get_scale_min_k4;

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
    {GgmlType::MXFP4, {"MXFP4", QK_MXFP4, sizeof(BlockMXFP4), true}},
};

const TypeRow* find_type(uint32_t raw) {
  for (const auto& r : kTypes)
    if (static_cast<uint32_t>(r.type) == raw) return &r;
  return nullptr;
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

// The product of two exact values: each value is a power of two times a
// small integer, so y is exact unless it falls below the subnormals.
void deq_mxfp4(const BlockMXFP4* b, float* y) {
  const float d = e8m0_half(b->e);
  for (int j = 0; j < QK_MXFP4 / 2; ++j) {
    y[j] = d * kMxfp4Values[b->qs[j] & 0x0F];
    y[j + QK_MXFP4 / 2] = d * kMxfp4Values[b->qs[j] >> 4];
  }
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

template <class Block, class F>
void per_block_deq(const void* src, float* dst, int64_t n, int qk, F f) {
  const Block* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / qk; ++i) f(b + i, dst + i * qk);
}


}  // namespace

namespace detail {

void check_blocks(GgmlType t, int64_t n, const char* what) {
  const TypeTraits& tt = type_traits(t);
  if (n < 0 || n % tt.block_elems != 0)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) +
                                " elements is not a multiple of the " + tt.name + " block size " +
                                std::to_string(tt.block_elems));
}

}  // namespace detail

using detail::check_blocks;

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
    case GgmlType::MXFP4: return per_block_deq<BlockMXFP4>(src, dst, n, QK_MXFP4, deq_mxfp4);
    default:
      throw std::invalid_argument("dequantize_row: type " + type_name(t) + " is not supported");
  }
}

}  // namespace kvs
