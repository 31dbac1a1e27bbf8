// Quant formats: type table, fp16/bf16 conversions, hand-built blocks of
// every type with hand-computed values, and quantize -> dequantize error
// bounds for every writable type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/quant.h"

using namespace kvs;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class Block>
std::vector<float> deq(GgmlType t, const Block& b, int n) {
  std::vector<float> y(n);
  dequantize_row(t, &b, y.data(), n);
  return y;
}

// Packs 8 six-bit (scale, min) pairs the way the K-quant formats store them.
void pack_k_scales(const int sc[8], const int mn[8], uint8_t out[12]) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
}

}  // namespace

TEST(QuantTypes, TraitsAndRowBytes) {
  EXPECT_EQ(type_traits(GgmlType::F32).block_bytes, 4u);
  EXPECT_EQ(type_traits(GgmlType::F16).block_bytes, 2u);
  EXPECT_EQ(type_traits(GgmlType::BF16).block_bytes, 2u);
  EXPECT_EQ(type_traits(GgmlType::Q4_0).block_bytes, 18u);
  EXPECT_EQ(type_traits(GgmlType::Q4_1).block_bytes, 20u);
  EXPECT_EQ(type_traits(GgmlType::Q5_0).block_bytes, 22u);
  EXPECT_EQ(type_traits(GgmlType::Q5_1).block_bytes, 24u);
  EXPECT_EQ(type_traits(GgmlType::Q8_0).block_bytes, 34u);
  EXPECT_EQ(type_traits(GgmlType::Q4_K).block_bytes, 144u);
  EXPECT_EQ(type_traits(GgmlType::Q5_K).block_bytes, 176u);
  EXPECT_EQ(type_traits(GgmlType::Q6_K).block_bytes, 210u);
  EXPECT_EQ(type_traits(GgmlType::Q6_K).block_elems, 256);
  EXPECT_EQ(type_traits(GgmlType::MXFP4).block_bytes, 17u);
  EXPECT_EQ(type_traits(GgmlType::MXFP4).block_elems, 32);
  EXPECT_TRUE(type_traits(GgmlType::MXFP4).supported);
  EXPECT_EQ(type_name(GgmlType::MXFP4), "MXFP4");
  EXPECT_TRUE(is_known_type(39));  // ggml's id, the same in llama.cpp and ik_llama.cpp
  EXPECT_EQ(row_bytes(GgmlType::MXFP4, 2880), 90u * 17);  // gpt-oss's expert width
  EXPECT_THROW(row_bytes(GgmlType::MXFP4, 16), std::invalid_argument);
  EXPECT_TRUE(type_traits(GgmlType::Q4_K).supported);
  EXPECT_FALSE(type_traits(GgmlType::Q2_K).supported);
  EXPECT_EQ(type_name(GgmlType::Q5_K), "Q5_K");
  EXPECT_EQ(type_name(GgmlType::BF16), "BF16");
  EXPECT_TRUE(is_known_type(30));
  EXPECT_TRUE(is_known_type(0));
  EXPECT_FALSE(is_known_type(4));  // removed Q4_2
  EXPECT_FALSE(is_known_type(5));
  EXPECT_FALSE(is_known_type(1000));
  EXPECT_THROW(type_traits(static_cast<GgmlType>(77)), std::invalid_argument);

  EXPECT_EQ(row_bytes(GgmlType::F32, 7), 28u);
  EXPECT_EQ(row_bytes(GgmlType::F16, 7), 14u);
  EXPECT_EQ(row_bytes(GgmlType::Q8_0, 64), 68u);
  EXPECT_EQ(row_bytes(GgmlType::Q4_0, 4096), 128u * 18);
  EXPECT_EQ(row_bytes(GgmlType::Q6_K, 512), 420u);
  EXPECT_EQ(row_bytes(GgmlType::Q4_K, 0), 0u);
  EXPECT_THROW(row_bytes(GgmlType::Q4_0, 33), std::invalid_argument);
  EXPECT_THROW(row_bytes(GgmlType::Q4_K, 128), std::invalid_argument);
  EXPECT_THROW(row_bytes(GgmlType::F32, -1), std::invalid_argument);
  float out[32];
  uint8_t buf[64] = {};
  EXPECT_THROW(dequantize_row(GgmlType::Q8_0, buf, out, 16), std::invalid_argument);
  EXPECT_THROW(dequantize_row(GgmlType::Q2_K, buf, out, 256), std::invalid_argument);
  EXPECT_THROW(quantize_row(GgmlType::Q8_1, out, buf, 32), std::invalid_argument);
}

TEST(QuantFp16, KnownValues) {
  EXPECT_EQ(f32_to_fp16(0.f), 0x0000);
  EXPECT_EQ(f32_to_fp16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_fp16(1.f), 0x3C00);
  EXPECT_EQ(f32_to_fp16(-2.f), 0xC000);
  EXPECT_EQ(f32_to_fp16(0.5f), 0x3800);
  EXPECT_EQ(f32_to_fp16(65504.f), 0x7BFF);   // largest finite
  EXPECT_EQ(f32_to_fp16(65519.f), 0x7BFF);   // below the halfway point
  EXPECT_EQ(f32_to_fp16(65520.f), 0x7C00);   // halfway to 65536 rounds (even) to inf
  EXPECT_EQ(f32_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_fp16(INFINITY), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-INFINITY), 0xFC00);
  fp16_t n = f32_to_fp16(NAN);
  EXPECT_EQ(n & 0x7C00, 0x7C00);
  EXPECT_NE(n & 0x3FF, 0);
  // Ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(f32_to_fp16(1.f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(f32_to_fp16(1.f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(f32_to_fp16(1.f + 0x1p-11f + 0x1p-20f), 0x3C01);  // above halfway
  // Subnormals: 2^-24 is the smallest, 2^-14 the smallest normal.
  EXPECT_EQ(f32_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_fp16(0x1p-14f), 0x0400);
  EXPECT_EQ(f32_to_fp16(1023 * 0x1p-24f), 0x03FF);
  EXPECT_EQ(f32_to_fp16(0x1p-25f), 0x0000);         // tie -> even (0)
  EXPECT_EQ(f32_to_fp16(1.5f * 0x1p-25f), 0x0001);  // above the tie
  EXPECT_EQ(f32_to_fp16(3 * 0x1p-25f), 0x0002);     // 1.5 units: tie -> even (2)
  EXPECT_EQ(f32_to_fp16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(f32_to_fp16(from_bits(0x00000001)), 0x0000);  // f32 subnormal
  EXPECT_EQ(f32_to_fp16(1023.5f * 0x1p-24f), 0x0400);    // rounds up into the normals

  EXPECT_EQ(fp16_to_f32(0x3C00), 1.f);
  EXPECT_EQ(fp16_to_f32(0xC000), -2.f);
  EXPECT_EQ(fp16_to_f32(0x7BFF), 65504.f);
  EXPECT_EQ(fp16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_f32(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(fp16_to_f32(0x8001), -0x1p-24f);
  EXPECT_EQ(bits(fp16_to_f32(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isinf(fp16_to_f32(0x7C00)));
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7C01)));
}

TEST(QuantFp16, AllHalvesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = fp16_to_f32(static_cast<fp16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(f)))) << h;
      continue;
    }
    ASSERT_EQ(f32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(QuantFp16, RoundingIsNearest) {
  // Against a double-precision search for the nearest half (ties to even).
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> e(-26.f, 17.f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::exp2(e(rng)) * ((rng() & 1) ? 1.f : -1.f);
    fp16_t h = f32_to_fp16(x);
    if ((h & 0x7FFF) == 0x7C00) {
      EXPECT_GE(std::fabs(x), 65520.f);
      continue;
    }
    double err = std::fabs(double(fp16_to_f32(h)) - double(x));
    fp16_t up = h + 1, dn = h - 1;
    if ((up & 0x7FFF) < 0x7C00) {
      EXPECT_LE(err, std::fabs(double(fp16_to_f32(up)) - x)) << x;
    }
    if ((h & 0x7FFF) != 0) {
      EXPECT_LE(err, std::fabs(double(fp16_to_f32(dn)) - x)) << x;
    }
  }
}

TEST(QuantBf16, KnownValuesAndRoundTrip) {
  EXPECT_EQ(f32_to_bf16(1.f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.f), 0xC000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000)), 0x3F80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001)), 0x3F81);  // above tie
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds to inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x00010000)), 0x0001);  // subnormal kept
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);  // tie -> even (0)
  bf16_t n = f32_to_bf16(from_bits(0x7F800001));          // NaN with a low payload
  EXPECT_TRUE(std::isnan(bf16_to_f32(n)));
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.f);
  EXPECT_EQ(bits(bf16_to_f32(0x8000)), 0x80000000u);
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<bf16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h);
  }
}

TEST(QuantBlocks, F32F16BF16Rows) {
  float src[3] = {1.5f, -0.25f, 3.f};
  float y[3];
  dequantize_row(GgmlType::F32, src, y, 3);
  EXPECT_EQ(y[2], 3.f);
  uint8_t h[6] = {0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38};  // 1, -2, 0.5 little-endian
  dequantize_row(GgmlType::F16, h, y, 3);
  EXPECT_EQ(y[0], 1.f);
  EXPECT_EQ(y[1], -2.f);
  EXPECT_EQ(y[2], 0.5f);
  uint8_t b[6] = {0x80, 0x3F, 0x00, 0xC0, 0x40, 0x40};  // 1, -2, 3
  dequantize_row(GgmlType::BF16, b, y, 3);
  EXPECT_EQ(y[0], 1.f);
  EXPECT_EQ(y[1], -2.f);
  EXPECT_EQ(y[2], 3.f);
}

TEST(QuantBlocks, Q4_0) {
  BlockQ4_0 b{};
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto y = deq(GgmlType::Q4_0, b, 32);
  // Low nibbles are elements 0..15, high nibbles 16..31; value (q - 8) * d.
  EXPECT_EQ(y[0], -4.f);
  EXPECT_EQ(y[8], 0.f);
  EXPECT_EQ(y[15], 3.5f);
  EXPECT_EQ(y[16], 3.5f);  // q = 15
  EXPECT_EQ(y[31], -4.f);  // q = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f);
    EXPECT_EQ(y[16 + j], (7 - j) * 0.5f);
  }
}

TEST(QuantBlocks, Q4_1) {
  BlockQ4_1 b{};
  b.d = 0x3400;  // 0.25
  b.m = 0xBC00;  // -1
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (3 << 4));
  auto y = deq(GgmlType::Q4_1, b, 32);
  EXPECT_EQ(y[0], -1.f);
  EXPECT_EQ(y[4], 0.f);
  EXPECT_EQ(y[15], 2.75f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.25f - 1.f);
    EXPECT_EQ(y[16 + j], -0.25f);
  }
}

TEST(QuantBlocks, Q5_0) {
  // Element i holds the 5-bit value q[i]; 4 low bits in the nibbles (as
  // Q4_0), the 5th bit is bit i of qh.
  int q[32];
  for (int i = 0; i < 32; ++i) q[i] = (i * 7 + 3) % 32;
  BlockQ5_0 b{};
  b.d = 0x4000;  // 2
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  for (int i = 0; i < 32; ++i) qh |= uint32_t(q[i] >> 4) << i;
  std::memcpy(b.qh, &qh, 4);
  auto y = deq(GgmlType::Q5_0, b, 32);
  EXPECT_EQ(y[0], (3 - 16) * 2.f);   // q = 3
  EXPECT_EQ(y[2], (17 - 16) * 2.f);  // q = 17: needs the high bit
  EXPECT_EQ(y[20], (15 - 16) * 2.f); // q = 143 % 32 = 15
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], (q[i] - 16) * 2.f) << i;
}

TEST(QuantBlocks, Q5_1) {
  int q[32];
  for (int i = 0; i < 32; ++i) q[i] = 31 - i;
  BlockQ5_1 b{};
  b.d = 0x3800;  // 0.5
  b.m = 0x4200;  // 3
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  for (int i = 0; i < 32; ++i) qh |= uint32_t(q[i] >> 4) << i;
  std::memcpy(b.qh, &qh, 4);
  auto y = deq(GgmlType::Q5_1, b, 32);
  EXPECT_EQ(y[0], 31 * 0.5f + 3);
  EXPECT_EQ(y[31], 3.f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], q[i] * 0.5f + 3.f);
}

TEST(QuantBlocks, Q8_0) {
  BlockQ8_0 b{};
  b.d = 0x3000;  // 0.125
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
  auto y = deq(GgmlType::Q8_0, b, 32);
  EXPECT_EQ(y[0], -16.f);
  EXPECT_EQ(y[16], 0.f);
  EXPECT_EQ(y[31], 15.f);
}

TEST(QuantBlocks, Q4_K) {
  // 8 sub-blocks of 32; sub-block s: value d*sc[s]*q - dmin*mn[s].
  // Scales above 15 exercise the 6-bit packing of sub-blocks 4..7.
  const int sc[8] = {1, 2, 3, 63, 17, 40, 5, 33};
  const int mn[8] = {0, 1, 10, 63, 18, 2, 45, 7};
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 5 + i / 32) % 16;
  BlockQ4_K b{};
  b.d = 0x3800;     // 0.5
  b.dmin = 0x3400;  // 0.25
  pack_k_scales(sc, mn, b.scales);
  // Chunk c (64 elements) = sub-blocks 2c (low nibbles) and 2c+1 (high).
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      b.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  auto y = deq(GgmlType::Q4_K, b, 256);
  EXPECT_EQ(y[0], 0.f);                          // q 0, sc 1, mn 0
  EXPECT_EQ(y[97], 0.5f * 63 * 8 - 0.25f * 63);  // sub-block 3, q = (97*5 + 3) % 16 = 8
  for (int i = 0; i < 256; ++i) {
    const int s = i / 32;
    EXPECT_EQ(y[i], 0.5f * sc[s] * q[i] - 0.25f * mn[s]) << i;
  }
}

TEST(QuantBlocks, Q5_K) {
  const int sc[8] = {63, 1, 20, 4, 16, 47, 9, 31};
  const int mn[8] = {5, 63, 0, 16, 33, 1, 60, 12};
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 11 + 7) % 32;
  BlockQ5_K b{};
  b.d = 0x3C00;     // 1
  b.dmin = 0x3800;  // 0.5
  pack_k_scales(sc, mn, b.scales);
  // Sub-block s: low 4 bits as Q4_K, 5th bit is bit s of qh[element % 32].
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      b.qs[32 * c + l] = static_cast<uint8_t>((q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4));
  for (int i = 0; i < 256; ++i) b.qh[i % 32] |= static_cast<uint8_t>((q[i] >> 4) << (i / 32));
  auto y = deq(GgmlType::Q5_K, b, 256);
  EXPECT_EQ(y[0], 63.f * 7 - 2.5f);
  for (int i = 0; i < 256; ++i) {
    const int s = i / 32;
    EXPECT_EQ(y[i], 1.f * sc[s] * q[i] - 0.5f * mn[s]) << i;
  }
}

TEST(QuantBlocks, Q6_K) {
  // 16 signed scales (one per 16); 6-bit q with value d*sc*(q-32).
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 13 + 5) % 64;
  BlockQ6_K b{};
  b.d = 0x3400;  // 0.25
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s * 17 - 128);
  // Half h (128 elements): ql[64h + l] low = element l, ql[64h+32+l] low =
  // l+32, high nibbles l+64 / l+96; qh[32h + l] has the top 2 bits of
  // l, l+32, l+64, l+96 at bit 0, 2, 4, 6.
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const int* e = q + 128 * h;
      b.ql[64 * h + l] = static_cast<uint8_t>((e[l] & 15) | ((e[l + 64] & 15) << 4));
      b.ql[64 * h + 32 + l] = static_cast<uint8_t>((e[l + 32] & 15) | ((e[l + 96] & 15) << 4));
      b.qh[32 * h + l] = static_cast<uint8_t>((e[l] >> 4) | ((e[l + 32] >> 4) << 2) |
                                              ((e[l + 64] >> 4) << 4) | ((e[l + 96] >> 4) << 6));
    }
  auto y = deq(GgmlType::Q6_K, b, 256);
  EXPECT_EQ(y[0], 0.25f * -128 * (5 - 32));
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.25f * b.scales[i / 16] * (q[i] - 32)) << i;
}

namespace {

// The e2m1 value of a 4-bit code from the OCP MX spec's definition: sign,
// 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is subnormal.
double e2m1(int c) {
  const int sign = c >> 3, ex = (c >> 1) & 3, man = c & 1;
  const double mag = ex == 0 ? 0.5 * man : std::ldexp(1.0 + 0.5 * man, ex - 1);
  return sign ? -mag : mag;
}

}  // namespace

TEST(QuantMxfp4, ValueTableIsDoubledE2m1) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(kMxfp4Values[c], 2 * e2m1(c)) << c;
  EXPECT_EQ(e2m1(7), 6.0);    // the largest magnitude
  EXPECT_EQ(e2m1(1), 0.5);    // the subnormal step
  EXPECT_EQ(e2m1(15), -6.0);
}

TEST(QuantMxfp4, E8m0HalfScaleEveryByte) {
  for (int e = 0; e < 256; ++e) EXPECT_EQ(e8m0_half(uint8_t(e)), std::ldexp(1.0f, e - 128)) << e;
  EXPECT_EQ(bits(e8m0_half(0)), 0x00200000u);  // 2^-128: subnormal
  EXPECT_EQ(bits(e8m0_half(1)), 0x00400000u);  // 2^-127: subnormal
  EXPECT_EQ(bits(e8m0_half(2)), 0x00800000u);  // 2^-126: the smallest normal
  EXPECT_EQ(e8m0_half(127), 0.5f);
  EXPECT_EQ(e8m0_half(128), 1.0f);
  EXPECT_EQ(bits(e8m0_half(254)), 0x7E800000u);  // 2^126
  EXPECT_EQ(bits(e8m0_half(255)), 0x7F000000u);  // 2^127: ggml reads the OCP NaN code as a number
}

TEST(QuantBlocks, MXFP4) {
  BlockMXFP4 b{};
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  // e = 127: scale 1, the values are e2m1's own; elements 0..15 in the low
  // nibbles, 16..31 in the high ones, as Q4_0.
  b.e = 127;
  auto y = deq(GgmlType::MXFP4, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], e2m1(j)) << j;
    EXPECT_EQ(y[16 + j], e2m1(15 - j)) << j;
  }
  EXPECT_EQ(bits(y[8]), 0u);  // code 8, e2m1's -0, is +0: ggml's table holds the integer 0
  b.e = 130;  // scale 8
  y = deq(GgmlType::MXFP4, b, 32);
  EXPECT_EQ(y[7], 48.f);
  EXPECT_EQ(y[16], -48.f);
  b.e = 0;  // scale 2^-127: every value a subnormal, still exact
  y = deq(GgmlType::MXFP4, b, 32);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(y[j], float(std::ldexp(e2m1(j), -127))) << j;
  EXPECT_EQ(bits(y[1]), 0x00200000u);
  b.e = 255;  // scale 2^128: 0.5 x 2^128 is finite, 6 x 2^128 overflows to inf
  y = deq(GgmlType::MXFP4, b, 32);
  EXPECT_EQ(y[1], 0x1p127f);
  EXPECT_TRUE(std::isinf(y[7]));
}

TEST(QuantMxfp4, QuantizerGridTiesAndClipping) {
  BlockMXFP4 b;
  float x[32], y[32];
  // On the grid: e2m1 values times 2^3 come back exactly (amax 48: e = 130).
  for (int j = 0; j < 32; ++j) x[j] = float(e2m1(j % 16) * 8);
  quantize_row(GgmlType::MXFP4, x, &b, 32);
  EXPECT_EQ(b.e, 130);
  dequantize_row(GgmlType::MXFP4, &b, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]) << j;
  // amax 4 puts the scale at 1 (e = 127). Ties go to the first code in table
  // order: 2.5 -> 2 (code 4), -2.5 -> -2 (code 12), 0.25 and -0.25 -> +0
  // (code 0), never -0. Above the largest value: 6 (code 7), -6 (code 15).
  const float in[8] = {4.f, 2.5f, -2.5f, 0.25f, -0.25f, 5.f, 7.5f, -100.f};
  const int want[8] = {6, 4, 12, 0, 0, 6, 7, 15};
  for (int j = 0; j < 32; ++j) x[j] = j < 8 ? in[j] : 0.f;
  x[7] = -3.9f;  // keep amax at 4 for now
  quantize_row(GgmlType::MXFP4, x, &b, 32);
  EXPECT_EQ(b.e, 127);
  for (int j = 0; j < 7; ++j) EXPECT_EQ(b.qs[j] & 0xF, want[j]) << j;
  x[7] = -7.9f;  // the block's largest magnitude: e stays 127, -7.9 clips to -6
  quantize_row(GgmlType::MXFP4, x, &b, 32);
  EXPECT_EQ(b.e, 127);
  EXPECT_EQ(b.qs[7] & 0xF, 15);
  x[7] = -8.f;  // a power of two moves the scale up: e = 128
  quantize_row(GgmlType::MXFP4, x, &b, 32);
  EXPECT_EQ(b.e, 128);
  // Extremes: zeros give e = 0 and code 0. FLT_MAX gives e = 253, not 252:
  // log2f(FLT_MAX) rounds up to 128 (the peers' glibc does the same), and
  // at that scale only codes up to 6 stay finite, so -FLT_MAX takes -3 x 2^126.
  for (float& v : x) v = 0.f;
  quantize_row(GgmlType::MXFP4, x, &b, 32);
  EXPECT_EQ(b.e, 0);
  for (uint8_t q : b.qs) EXPECT_EQ(q, 0);
  x[3] = -3.4028235e38f;
  quantize_row(GgmlType::MXFP4, x, &b, 32);
  EXPECT_EQ(b.e, 253);
  EXPECT_EQ(b.qs[3] & 0xF, 13);
}

namespace {

uint64_t splitmix(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Input block b of the peer comparison below: edge cases, then random
// blocks of magnitudes 2^-40 .. 2^40 (every fifth with a few subnormals).
void mxfp4_peer_input(int b, float* x) {
  for (int j = 0; j < 32; ++j) x[j] = 0.f;
  switch (b) {
    case 0: return;
    case 1: for (int j = 0; j < 32; ++j) x[j] = float(e2m1(j % 16) * 8); return;
    case 2: for (int j = 0; j < 32; ++j) x[j] = (j - 16) * 0.25f; return;  // ties at scale 1
    case 3: for (int j = 0; j < 32; ++j) x[j] = (j - 16) * 0.5f + 0.125f; return;
    case 4: for (int j = 0; j < 32; ++j) x[j] = j * 0.2f; x[0] = std::nextafter(8.f, 0.f); return;  // log2f rounds up
    case 5: for (int j = 0; j < 32; ++j) x[j] = 7.99f - j * 0.5f; return;
    case 6: for (int j = 0; j < 32; ++j) x[j] = -0.f; x[5] = 1.f; return;
    case 7: for (int j = 0; j < 32; ++j) x[j] = std::ldexp(float(j % 3 - 1), -126); return;  // exponent -1: byte 255
    case 8: for (int j = 0; j < 32; ++j) x[j] = (j & 1) ? std::ldexp(1.f, -149) : 0.f; return;  // -24: byte 232
    case 9: for (int j = 0; j < 32; ++j) x[j] = std::ldexp(float(j % 7 - 3), -127); return;
    case 10: for (int j = 0; j < 32; ++j) x[j] = std::ldexp(float(j % 5 - 2), -124); return;
    case 11: for (int j = 0; j < 32; ++j) x[j] = j * 1e37f; x[3] = -3.4028235e38f; return;
    case 12: for (int j = 0; j < 32; ++j) x[j] = std::ldexp(float(j % 9 - 4), 125); return;
    case 13: for (int j = 0; j < 32; ++j) x[j] = j * 0.1f; x[2] = INFINITY; return;  // byte 0
    case 14: for (int j = 0; j < 32; ++j) x[j] = (j - 10) * 0.3f; x[4] = NAN; return;
    case 15: for (int j = 0; j < 32; ++j) x[j] = -j * 0.01f; x[0] = -INFINITY; return;
    default: break;
  }
  uint64_t s = 0x5EEDull + uint64_t(b);
  const int e = int(splitmix(&s) % 81) - 40;
  for (int j = 0; j < 32; ++j) {
    const float u = float(splitmix(&s) >> 40) * (1.0f / 16777216.f) * 2.f - 1.f;  // [-1, 1)
    x[j] = std::ldexp(u, e);
    if (b % 5 == 0 && j % 7 == 0) x[j] = std::ldexp(u, -140);
  }
}

}  // namespace

// ik_llama.cpp's MXFP4 quantizer (the Aug 2026 snapshot; its
// quantize_row_mxfp4_ref is mainline llama.cpp's algorithm) on the 48
// blocks of mxfp4_peer_input(): the bytes it wrote, block by block. Made by
// a throwaway C program that fills the same inputs and calls the peer's
// libggml: ggml_quantize_chunk(GGML_TYPE_MXFP4, x, q, 0, 1, 32 * 48,
// NULL, NULL), built with GCC 12 -march=native on the Intel Xeon here.
TEST(QuantMxfp4, BytesEqualThePeerQuantizer) {
  static const char* const kPeer[48] = {
    "0000000000000000000000000000000000", "8200112233445566770099aabbccddeeff", "7f0e0e1d1d2d2d3c3c4c4b4b5a5a595960",
    "7f0f1f2f3f4f5f5e6e6e6d7d7c7c7b7a79", "8036304041414141414242525252535353", "7f0797a7b7c7d7d6e6e6e5f5f4f4f3f2f1",
    "7d00000000000600000000000000000000", "ff00000000000000000000000000000000", "e800000000000000000000000000000000",
    "ff00000000000000000000000000000000", "02ce0c4064e6ce0c4064e6ce0c4064e6ce", "fd4040404d414151525252525353535354",
    "fc5e6decdac0a20425465e6decdac0a204", "0000000000000000000000000000000000", "7f4d4d4c5c505b6a6a6969607171727273",
    "0000000000000000000000000000000000", "65f65673df777f7f17b660c174073fb170", "7f1f5670e57f757fe6e5cfe71f073d31b3",
    "7d4352fdf4f7b6257637f7ef3f99df63e4", "58eabfdff0d7965ff0d97d97f55fe056f7", "9440ff72e651007f60d6e6f2ff000d90fe",
    "7e170377efa7ff71bffeeaa366afeef6fe", "557e4dfff6d4afa1f2df765de7dfb6f4fb", "68ba649672cf4523f6fee7d31c5077757d",
    "917efafd6fdb7de66eff6097f147f756ff", "7c40e7ee57f9077fc0c5fc173b077c005f", "70f776f0d6f7736db75df56507277f756c",
    "616fdef66545fce73e577775074efde0f7", "7176df43d74ff64726af4f7e57ff9ffdff", "8606eb7b2e1fec4f1634ebcb0f74ffff04",
    "9af0bcfabdff0f574097456d30025f307f", "55d775b7deae7ffceeef7f2f7e73725f5c", "8e75fe22dafd2ff61f9015ed3ecdf57f7f",
    "701757f763c777d777fe5ff007bdd0657a", "a1f6650272df7f47e1ed53f66ef9dfdd7e", "81e0ef0b7de60fcbf07c7f67370965e07f",
    "7f7df7e1fc4d7770e5c7fe7379cc720f7b", "64ebd7e3af6ad677df79ce6feff7e4777a", "77a7fe62d797da7fe34f75f79fba432f77",
    "a1e4fe05dff2be3766ef790fd2a2fc77f2", "8650ffc6769f0c47f0eab373550ee6b09f", "a1f07afde5dff17c57f5f537f47fd479fe",
    "5d77c64e7456fd76704b79b617416e2d47", "9ced70e76593de1fffc57e6c9adedd6ef4", "8ef2ef7175550a7af0db7f47e753de57ff",
    "81609fd41cee037ff0e24f716f06f7f07f", "86f7ff16e760fd777fbac76fdfbf77aa47", "a0a9dfffd3df0ced7e076fe3eff7763e94",
  };
  for (int b = 0; b < 48; ++b) {
    float x[32];
    mxfp4_peer_input(b, x);
    BlockMXFP4 q;
    quantize_row(GgmlType::MXFP4, x, &q, 32);
    char hex[35];
    const auto* p = reinterpret_cast<const uint8_t*>(&q);
    for (int i = 0; i < 17; ++i) std::snprintf(hex + 2 * i, 3, "%02x", p[i]);
    EXPECT_STREQ(hex, kPeer[b]) << "block " << b;
  }
}

TEST(QuantBlocks, MultipleBlocksInARow) {
  BlockQ8_0 b[2]{};
  b[0].d = 0x3C00;
  b[1].d = 0x4000;
  for (int j = 0; j < 32; ++j) b[0].qs[j] = b[1].qs[j] = static_cast<int8_t>(j);
  std::vector<float> y(64);
  dequantize_row(GgmlType::Q8_0, b, y.data(), 64);
  EXPECT_EQ(y[5], 5.f);
  EXPECT_EQ(y[37], 10.f);
}

TEST(QuantRoundTrip, ExactlyRepresentableInputs) {
  // Inputs on the quantizer's own grid come back unchanged.
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = (j % 16 - 8) * 0.5f;  // min -4 -> d = 0.5
  BlockQ4_0 b4;
  quantize_row(GgmlType::Q4_0, x, &b4, 32);
  EXPECT_EQ(b4.d, 0x3800);
  auto y = deq(GgmlType::Q4_0, b4, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]);

  for (int j = 0; j < 32; ++j) x[j] = (j * 8 - 127) / 4.f;
  x[0] = -127 / 4.f;
  BlockQ8_0 b8;
  quantize_row(GgmlType::Q8_0, x, &b8, 32);
  EXPECT_EQ(fp16_to_f32(b8.d), 0.25f);
  auto y8 = deq(GgmlType::Q8_0, b8, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y8[j], x[j]);
}

TEST(QuantRoundTrip, ZerosStayZero) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                     GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                     GgmlType::Q6_K, GgmlType::MXFP4}) {
    std::vector<float> x(256, 0.f), y(256, 1.f);
    std::vector<uint8_t> buf(row_bytes(t, 256));
    quantize_row(t, x.data(), buf.data(), 256);
    dequantize_row(t, buf.data(), y.data(), 256);
    for (float v : y) EXPECT_EQ(v, 0.f) << type_name(t);
  }
}

namespace {

struct Bound {
  GgmlType t;
  // Per-block max error allowed as a fraction of the block's max |x| (or
  // range for the asymmetric types), and whole-row relative RMSE allowed.
  double max_err_frac;
  double rmse;
};

}  // namespace

TEST(QuantRoundTrip, RandomInputsWithinBounds) {
  const Bound bounds[] = {
      {GgmlType::F32, 0.0, 0.0},
      {GgmlType::F16, 1.0 / 2048, 1.0 / 2048},
      {GgmlType::BF16, 1.0 / 256, 1.0 / 256},
      {GgmlType::Q8_0, 1.15 / 254, 0.01},  // + 127 steps of the fp16 rounding of d
      {GgmlType::Q4_0, 1.01 / 8, 0.12},   // the far side can clamp at +7 by one step
      {GgmlType::Q5_0, 1.01 / 16, 0.06},
      {GgmlType::Q4_1, 0.6 / 15, 0.08},   // range-relative
      {GgmlType::Q5_1, 0.6 / 31, 0.04},
      {GgmlType::Q4_K, 0.15, 0.10},
      {GgmlType::Q5_K, 0.08, 0.05},
      {GgmlType::Q6_K, 0.04, 0.025},
      // The block maximum sits in [4, 8) scale units and e2m1 stops at 6:
      // clipping near 8 and the gap from 4 to 6 each cost at most a quarter.
      {GgmlType::MXFP4, 0.25, 0.13},
  };
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t n : {256, 512, 4096}) {
    std::vector<float> x(n), y(n);
    for (auto& v : x) {
      v = nd(rng) * 0.7f + 0.1f;
      if (v == 0.f) v = 1e-3f;
    }
    for (const Bound& b : bounds) {
      const int qk = type_traits(b.t).block_elems;
      std::vector<uint8_t> buf(row_bytes(b.t, n));
      quantize_row(b.t, x.data(), buf.data(), n);
      dequantize_row(b.t, buf.data(), y.data(), n);
      double se = 0, sx = 0;
      for (int64_t i = 0; i < n; ++i) {
        se += double(y[i] - x[i]) * (y[i] - x[i]);
        sx += double(x[i]) * x[i];
      }
      const double rel_rmse = std::sqrt(se / sx);
      EXPECT_LE(rel_rmse, b.rmse + 1e-12) << type_name(b.t) << " n=" << n;
      const int span = qk == 1 ? 1 : (qk == 256 ? 256 : qk);
      for (int64_t s = 0; s < n; s += span) {
        double amax = 0, mn = 1e30, mx = -1e30, err = 0;
        for (int64_t i = s; i < s + span; ++i) {
          amax = std::max(amax, double(std::fabs(x[i])));
          mn = std::min(mn, double(x[i]));
          mx = std::max(mx, double(x[i]));
          err = std::max(err, double(std::fabs(y[i] - x[i])));
        }
        const bool asym = b.t == GgmlType::Q4_1 || b.t == GgmlType::Q5_1;
        const double ref = qk == 1 ? std::fabs(x[s]) : asym ? (mx - mn) : amax;
        ASSERT_LE(err, b.max_err_frac * ref + 1e-6) << type_name(b.t) << " n=" << n << " block " << s / span;
      }
    }
  }
}

TEST(QuantRoundTrip, LargeAndTinyMagnitudes) {
  // Weights of very different scale per row: the fp16 block scale must still
  // work. (Below ~1e-3 Q6_K's super-block scale d = max/(32*128) underflows
  // fp16 in ggml's format itself, so smaller rows are not a fair test.)
  for (float scale : {1e-3f, 1e-2f, 30.f}) {
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> ud(-1.f, 1.f);
    std::vector<float> x(512), y(512);
    for (auto& v : x) v = ud(rng) * scale;
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q6_K,
                       GgmlType::MXFP4}) {
      std::vector<uint8_t> buf(row_bytes(t, 512));
      quantize_row(t, x.data(), buf.data(), 512);
      dequantize_row(t, buf.data(), y.data(), 512);
      double se = 0, sx = 0;
      for (int i = 0; i < 512; ++i) {
        se += double(y[i] - x[i]) * (y[i] - x[i]);
        sx += double(x[i]) * x[i];
      }
      EXPECT_LT(std::sqrt(se / sx), 0.15) << type_name(t) << " scale " << scale;
    }
  }
}
