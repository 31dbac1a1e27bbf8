#include "kernels/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <immintrin.h>

#include "kernels/cpu.h"
#include "kernels/quant.h"

namespace kvs::kvc {

namespace {

// fp16 cannot hold more than 65504: keep metadata finite for any input.
float clamp_half(float x) { return std::clamp(x, -65504.f, 65504.f); }

// Row of quantized codes: element i of a row lives in byte i (int8) or in
// nibble i & 1 of byte i / 2 (int4).
inline void put_code(uint8_t* row, int i, int bits, uint8_t c) {
  if (bits == 8) {
    row[i] = c;
  } else {
    uint8_t& b = row[i >> 1];
    b = (i & 1) ? uint8_t((b & 0x0F) | (c << 4)) : uint8_t((b & 0xF0) | c);
  }
}
int bits_of(KvType t) { return t == KvType::Int8 ? 8 : 4; }

// fp16 -> float by table (256 KiB, built once): the cache's loads convert
// every element (f16) or every scale (int8/int4), so a branch-free lookup
// pays. bf16 is a shift.
const float* half_table() {
  static const std::vector<float> t = [] {
    std::vector<float> v(65536);
    for (uint32_t h = 0; h < 65536; ++h) v[h] = fp16_to_f32(uint16_t(h));
    return v;
  }();
  return t.data();
}
inline float bf16f(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Per-token row record: scale [ncg] fp16, min [ncg] fp16, codes [row_q_bytes].
void store_token_row(const KvLayout& L, uint8_t* rec, const float* x) {
  const int n = L.kvdim(), C = L.group_channels, ncg = L.n_cgroups(), bits = bits_of(L.type);
  auto* sc = reinterpret_cast<uint16_t*>(rec);
  auto* mn = sc + ncg;
  uint8_t* q = rec + size_t(ncg) * 4;
  uint8_t codes[256];
  for (int gi = 0; gi < ncg; ++gi) {
    const int c0 = gi * C, m = std::min(C, n - c0);
    // A channel group longer than the local buffer takes a heap one.
    if (m <= 256) {
      quantize_asym(x + c0, m, 1, bits, &sc[gi], &mn[gi], codes);
      for (int i = 0; i < m; ++i) put_code(q, c0 + i, bits, codes[i]);
    } else {
      std::vector<uint8_t> big(static_cast<size_t>(m));
      quantize_asym(x + c0, m, 1, bits, &sc[gi], &mn[gi], big.data());
      for (int i = 0; i < m; ++i) put_code(q, c0 + i, bits, big[size_t(i)]);
    }
  }
}

void load_token_rows(const KvLayout& L, const uint8_t* area, int g, int slot0, int n, float* out) {
  const int hd = L.head_dim, C = L.group_channels, ncg = L.n_cgroups(), bits = bits_of(L.type);
  const size_t rb = L.token_row_bytes();
  const float* h2f = half_table();
  for (int r = 0; r < n; ++r) {
    const uint8_t* rec = area + size_t(slot0 + r) * rb;
    const auto* sc = reinterpret_cast<const uint16_t*>(rec);
    const auto* mn = sc + ncg;
    const uint8_t* q = rec + size_t(ncg) * 4;
    float* o = out + size_t(r) * hd - size_t(g) * hd;  // indexed by channel
    int c = g * hd;
    const int end = c + hd;
    while (c < end) {
      const int gi = c / C, stop = std::min(end, (gi + 1) * C);
      const float d = h2f[sc[gi]], m = h2f[mn[gi]];
      if (bits == 8) {
        for (; c < stop; ++c) o[c] = m + d * float(q[c]);
      } else {
        for (; c < stop; ++c) o[c] = m + d * float((q[c >> 1] >> ((c & 1) * 4)) & 0x0F);
      }
    }
  }
}

void load_half_rows(const uint16_t* d, bool f16, size_t row, int g, int hd, int slot0, int n, float* out) {
  const float* h2f = half_table();
  for (int r = 0; r < n; ++r) {
    const uint16_t* src = d + size_t(slot0 + r) * row + size_t(g) * hd;
    float* o = out + size_t(r) * hd;
    if (f16)
      for (int i = 0; i < hd; ++i) o[i] = h2f[src[i]];
    else
      for (int i = 0; i < hd; ++i) o[i] = bf16f(src[i]);
  }
}

}  // namespace

void quantize_asym(const float* x, int n, int stride, int bits, uint16_t* scale, uint16_t* min, uint8_t* code) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[size_t(i) * stride]);
    hi = std::max(hi, x[size_t(i) * stride]);
  }
  const int qmax = (1 << bits) - 1;
  *min = f32_to_fp16(clamp_half(lo));
  *scale = f32_to_fp16(clamp_half((hi - lo) / float(qmax)));
  const float m = fp16_to_f32(*min), d = fp16_to_f32(*scale);
  const float inv = d > 0 ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) {
    const float v = std::nearbyint((x[size_t(i) * stride] - m) * inv);
    code[i] = uint8_t(std::clamp(v, 0.0f, float(qmax)));
  }
}

void store_group(const KvStorage& kv, int32_t block, int layer, int slot0, const float* k, const float* v) {
  const KvLayout& L = kv.layout;
  if (!L.quantized()) throw std::logic_error("kv codec: store_group on an unquantized cache");
  const int G = L.group_tokens, n = L.kvdim(), bits = bits_of(L.type);
  if (slot0 % G != 0 || slot0 + G > L.block_size) throw std::logic_error("kv codec: group not aligned to its block");
  uint8_t* ka = kv.k_area(block, layer);
  if (L.key_scale == KeyScale::Channel) {
    uint8_t* rec = ka + size_t(slot0 / G) * L.channel_group_bytes();
    auto* sc = reinterpret_cast<uint16_t*>(rec);  // [kvdim]
    auto* mn = sc + n;                            // [kvdim]
    uint8_t* q = rec + size_t(n) * 4;             // [G, row_q_bytes]
    uint8_t codes[256];
    std::vector<uint8_t> big;
    uint8_t* cd = codes;
    if (G > 256) {
      big.resize(size_t(G));
      cd = big.data();
    }
    for (int c = 0; c < n; ++c) {
      quantize_asym(k + c, G, n, bits, &sc[c], &mn[c], cd);
      for (int t = 0; t < G; ++t) put_code(q + size_t(t) * L.row_q_bytes(), c, bits, cd[t]);
    }
  } else {
    for (int t = 0; t < G; ++t) store_token_row(L, ka + size_t(slot0 + t) * L.token_row_bytes(), k + size_t(t) * n);
  }
  uint8_t* va = kv.v_area(block, layer);
  for (int t = 0; t < G; ++t) store_token_row(L, va + size_t(slot0 + t) * L.token_row_bytes(), v + size_t(t) * n);
}

namespace {
void prefetch_span(const uint8_t* p, size_t bytes) {
  for (uintptr_t a = uintptr_t(p) & ~uintptr_t(63); a < uintptr_t(p) + bytes; a += 64)
    _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T1);
}
}  // namespace

void prefetch_rows(const KvStorage& kv, int32_t block, int layer, int g, int slot0, int n) {
  const KvLayout& L = kv.layout;
  const int hd = L.head_dim;
  const uint8_t *ka = kv.k_area(block, layer), *va = kv.v_area(block, layer);
  if (!L.quantized()) {
    const size_t eb = L.elem_bytes(), row = L.row_floats() * eb, off = size_t(g) * hd * eb;
    for (int r = slot0; r < slot0 + n; ++r) {
      prefetch_span(ka + size_t(r) * row + off, size_t(hd) * eb);
      prefetch_span(va + size_t(r) * row + off, size_t(hd) * eb);
    }
    return;
  }
  const size_t rb = L.token_row_bytes(), codes = size_t(L.n_cgroups()) * 4;
  const size_t q0 = L.type == KvType::Int8 ? size_t(g) * hd : size_t(g) * hd / 2, qn = L.type == KvType::Int8 ? hd : hd / 2;
  for (int r = slot0; r < slot0 + n; ++r) {  // per-token rows: scales at the record's start, then the codes
    if (L.key_scale == KeyScale::Token) prefetch_span(ka + size_t(r) * rb, codes), prefetch_span(ka + size_t(r) * rb + codes + q0, qn);
    prefetch_span(va + size_t(r) * rb, codes);
    prefetch_span(va + size_t(r) * rb + codes + q0, qn);
  }
  if (L.key_scale == KeyScale::Token) return;
  const int G = L.group_tokens;
  for (int grp = slot0 / G; grp <= (slot0 + n - 1) / G; ++grp) {  // channel keys: the group's scales, then its code rows
    const uint8_t* rec = ka + size_t(grp) * L.channel_group_bytes();
    prefetch_span(rec + size_t(g) * hd * 2, size_t(hd) * 2);
    prefetch_span(rec + size_t(L.kvdim()) * 2 + size_t(g) * hd * 2, size_t(hd) * 2);
    for (int r = std::max(slot0, grp * G); r < std::min(slot0 + n, grp * G + G); ++r)
      prefetch_span(rec + size_t(L.kvdim()) * 4 + size_t(r % G) * L.row_q_bytes() + q0, qn);
  }
}

static void load_k_generic(const KvStorage& kv, int32_t block, int layer, int g, int slot0, int n, float* out) {
  const KvLayout& L = kv.layout;
  const int hd = L.head_dim;
  const size_t row = L.row_floats();
  switch (L.type) {
    case KvType::F32:
      for (int r = 0; r < n; ++r) std::memcpy(out + size_t(r) * hd, kv.k(block, layer, slot0 + r) + size_t(g) * hd, size_t(hd) * 4);
      return;
    case KvType::F16:
    case KvType::BF16: {
      load_half_rows(reinterpret_cast<const uint16_t*>(kv.k_area(block, layer)), L.type == KvType::F16, row, g, hd,
                     slot0, n, out);
      return;
    }
    default:
      break;
  }
  const uint8_t* ka = kv.k_area(block, layer);
  if (L.key_scale == KeyScale::Token) {
    load_token_rows(L, ka, g, slot0, n, out);
    return;
  }
  const int G = L.group_tokens, bits = bits_of(L.type), n_ch = L.kvdim();
  const float* h2f = half_table();
  float d[512], m[512];  // this head's channel scales for the current group
  if (hd > 512) throw std::invalid_argument("kv codec: head_dim above 512");
  for (int r = 0; r < n;) {
    const int slot = slot0 + r, stop = std::min(n, r + (G - slot % G));  // rows of this group
    const uint8_t* rec = ka + size_t(slot / G) * L.channel_group_bytes();
    const auto* sc = reinterpret_cast<const uint16_t*>(rec) + size_t(g) * hd;
    const auto* mn = reinterpret_cast<const uint16_t*>(rec) + n_ch + size_t(g) * hd;
    for (int i = 0; i < hd; ++i) {
      d[i] = h2f[sc[i]];
      m[i] = h2f[mn[i]];
    }
    for (; r < stop; ++r) {
      const uint8_t* q = rec + size_t(n_ch) * 4 + size_t((slot0 + r) % G) * L.row_q_bytes();
      float* o = out + size_t(r) * hd;  // [head_dim]
      if (bits == 8) {
        const uint8_t* qh = q + size_t(g) * hd;
        for (int i = 0; i < hd; ++i) o[i] = m[i] + d[i] * float(qh[i]);
      } else {
        for (int i = 0; i < hd; ++i) {
          const int c = g * hd + i;
          o[i] = m[i] + d[i] * float((q[c >> 1] >> ((c & 1) * 4)) & 0x0F);
        }
      }
    }
  }
}

static void load_v_generic(const KvStorage& kv, int32_t block, int layer, int g, int slot0, int n, float* out) {
  const KvLayout& L = kv.layout;
  const int hd = L.head_dim;
  const size_t row = L.row_floats();
  switch (L.type) {
    case KvType::F32:
      for (int r = 0; r < n; ++r) std::memcpy(out + size_t(r) * hd, kv.v(block, layer, slot0 + r) + size_t(g) * hd, size_t(hd) * 4);
      return;
    case KvType::F16:
    case KvType::BF16: {
      load_half_rows(reinterpret_cast<const uint16_t*>(kv.v_area(block, layer)), L.type == KvType::F16, row, g, hd,
                     slot0, n, out);
      return;
    }
    default:
      break;
  }
  load_token_rows(L, kv.v_area(block, layer), g, slot0, n, out);
}

// AVX-512: 16 elements per step (needs head_dim and --kv-group multiples
// of 16). Dequantization is fma(scale, code, min), so its results may
// differ from the generic path's in the last bit; each ISA is consistent
// with itself, which is what chunk and batch independence need.
#include "kernels/target_region.h"
KVS_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
namespace {

inline __m512 codes16(const uint8_t* q, int c, int bits) {  // codes of elements c .. c+15 as floats
  if (bits == 8) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c))));
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + c / 2));  // 8 bytes = 16 nibbles (c even)
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}

void load_token_rows_avx512(const KvLayout& L, const uint8_t* area, int g, int slot0, int n, float* out) {
  const int hd = L.head_dim, C = L.group_channels, ncg = L.n_cgroups(), bits = bits_of(L.type);
  const size_t rb = L.token_row_bytes();
  for (int r = 0; r < n; ++r) {
    const uint8_t* rec = area + size_t(slot0 + r) * rb;
    const auto* sc = reinterpret_cast<const uint16_t*>(rec);
    const auto* mn = sc + ncg;
    const uint8_t* q = rec + size_t(ncg) * 4;
    float* o = out + size_t(r) * hd;
    // The head's scales: groups g0 .. g0+15 converted at once (one cvtph).
    const int g0 = g * hd / C, ng = std::min(16, ncg - g0);
    const __mmask16 km = __mmask16((1u << ng) - 1);
    const __m512 ds = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, sc + g0));
    const __m512 ms = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, mn + g0));
    for (int i = 0; i < hd; i += 16) {
      const int c = g * hd + i;
      const __m512i lane = _mm512_set1_epi32(c / C - g0);
      _mm512_storeu_ps(o + i, _mm512_fmadd_ps(_mm512_permutexvar_ps(lane, ds), codes16(q, c, bits),
                                              _mm512_permutexvar_ps(lane, ms)));
    }
  }
}

void load_channel_keys_avx512(const KvLayout& L, const uint8_t* ka, int g, int slot0, int n, float* out) {
  const int hd = L.head_dim, G = L.group_tokens, bits = bits_of(L.type), n_ch = L.kvdim();
  for (int r = 0; r < n;) {
    const int slot = slot0 + r, stop = std::min(n, r + (G - slot % G));
    const uint8_t* rec = ka + size_t(slot / G) * L.channel_group_bytes();
    const auto* sc = reinterpret_cast<const uint16_t*>(rec) + size_t(g) * hd;
    const auto* mn = reinterpret_cast<const uint16_t*>(rec) + n_ch + size_t(g) * hd;
    __m512 d[32], m[32];  // head_dim <= 512
    for (int i = 0; i < hd; i += 16) {
      d[i / 16] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + i)));
      m[i / 16] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mn + i)));
    }
    for (; r < stop; ++r) {
      const uint8_t* q = rec + size_t(n_ch) * 4 + size_t((slot0 + r) % G) * L.row_q_bytes();
      float* o = out + size_t(r) * hd;
      for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(o + i, _mm512_fmadd_ps(d[i / 16], codes16(q, g * hd + i, bits), m[i / 16]));
    }
  }
}

// f32 rows: a plain 16-lane copy (the tiled attention copies every tile;
// a libc call per row cost more than the copy itself).
void load_f32_rows_avx512(const float* src0, size_t row, int g, int hd, int slot0, int n, float* out) {
  for (int r = 0; r < n; ++r) {
    const float* src = src0 + size_t(slot0 + r) * row + size_t(g) * hd;
    float* o = out + size_t(r) * hd;
    for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(o + i, _mm512_loadu_ps(src + i));
  }
}

void load_half_rows_avx512(const uint16_t* src0, bool f16, size_t row, int g, int hd, int slot0, int n, float* out) {
  for (int r = 0; r < n; ++r) {
    const uint16_t* src = src0 + size_t(slot0 + r) * row + size_t(g) * hd;
    float* o = out + size_t(r) * hd;
    for (int i = 0; i < hd; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      const __m512 v = f16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      _mm512_storeu_ps(o + i, v);
    }
  }
}

// f32 to f16, clamped as clamp_half: vcvtps2ph rounds to nearest even
// exactly as f32_to_fp16 does (subnormals and NaN payloads included), and
// max/min return their second operand for a NaN, so NaN passes as in
// std::clamp: the same bits as the scalar loop.
void store_f16_avx512(const float* src, uint16_t* dst, size_t count) {
  const __m512 lo = _mm512_set1_ps(-65504.f), hi = _mm512_set1_ps(65504.f);
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512 x = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_loadu_ps(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < count; ++i) dst[i] = f32_to_fp16(clamp_half(src[i]));
}

}  // namespace
KVS_TARGET_END()

namespace {
bool fast512(const KvLayout& L) {
  // A head spans at most 16 channel groups (one register of scales).
  return active_isa() >= Isa::Avx512 && L.head_dim % 16 == 0 && L.head_dim <= 512 &&
         (!L.quantized() || (L.group_channels % 16 == 0 && L.head_dim <= 16 * L.group_channels));
}
}  // namespace

void store_rows(const KvStorage& kv, int32_t block, int layer, int slot0, int n, const float* k, const float* v) {
  const KvLayout& L = kv.layout;
  const size_t row = L.row_floats();
  switch (L.type) {
    case KvType::F32:
      std::memcpy(kv.k(block, layer, slot0), k, size_t(n) * row * sizeof(float));
      std::memcpy(kv.v(block, layer, slot0), v, size_t(n) * row * sizeof(float));
      return;
    case KvType::F16:
    case KvType::BF16: {
      auto* kd = reinterpret_cast<uint16_t*>(kv.k_area(block, layer)) + size_t(slot0) * row;
      auto* vd = reinterpret_cast<uint16_t*>(kv.v_area(block, layer)) + size_t(slot0) * row;
      const bool h = L.type == KvType::F16;
      if (h && active_isa() >= Isa::Avx512) {
        store_f16_avx512(k, kd, size_t(n) * row);
        store_f16_avx512(v, vd, size_t(n) * row);
        return;
      }
      for (size_t i = 0; i < size_t(n) * row; ++i) {
        kd[i] = h ? f32_to_fp16(clamp_half(k[i])) : f32_to_bf16(k[i]);
        vd[i] = h ? f32_to_fp16(clamp_half(v[i])) : f32_to_bf16(v[i]);
      }
      return;
    }
    default:
      break;
  }
  throw std::logic_error("kv codec: store_rows on a quantized cache (use store_group)");
}

void load_k(const KvStorage& kv, int32_t block, int layer, int g, int slot0, int n, float* out) {
  const KvLayout& L = kv.layout;
  if (L.type == KvType::F32 && fast512(L))
    return load_f32_rows_avx512(kv.k(block, layer, 0), L.row_floats(), g, L.head_dim, slot0, n, out);
  if (L.type != KvType::F32 && fast512(L)) {
    if (!L.quantized())
      return load_half_rows_avx512(reinterpret_cast<const uint16_t*>(kv.k_area(block, layer)), L.type == KvType::F16,
                                   L.row_floats(), g, L.head_dim, slot0, n, out);
    if (L.key_scale == KeyScale::Channel) return load_channel_keys_avx512(L, kv.k_area(block, layer), g, slot0, n, out);
    return load_token_rows_avx512(L, kv.k_area(block, layer), g, slot0, n, out);
  }
  load_k_generic(kv, block, layer, g, slot0, n, out);
}

void load_v(const KvStorage& kv, int32_t block, int layer, int g, int slot0, int n, float* out) {
  const KvLayout& L = kv.layout;
  if (L.type == KvType::F32 && fast512(L))
    return load_f32_rows_avx512(kv.v(block, layer, 0), L.row_floats(), g, L.head_dim, slot0, n, out);
  if (L.type != KvType::F32 && fast512(L)) {
    if (!L.quantized())
      return load_half_rows_avx512(reinterpret_cast<const uint16_t*>(kv.v_area(block, layer)), L.type == KvType::F16,
                                   L.row_floats(), g, L.head_dim, slot0, n, out);
    return load_token_rows_avx512(L, kv.v_area(block, layer), g, slot0, n, out);
  }
  load_v_generic(kv, block, layer, g, slot0, n, out);
}

}  // namespace kvs::kvc
