// exp_poly_scalar (exp_poly.h) for 16 and 8 lanes: the same clamp,
// rounding, Cody-Waite reduction, polynomial and scaling, so every lane
// gives the scalar definition's bits. Include it only inside a
// KVS_TARGET_BEGIN region, after <immintrin.h> and exp_poly.h, with
// KVS_EXP_POLY_512 (AVX-512: exp_poly512) or KVS_EXP_POLY_256 (AVX2:
// exp_poly256) defined; it includes nothing itself, so no std code is
// compiled for the wider ISA.

#if defined(KVS_EXP_POLY_512)
inline __m512 exp_poly512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kvs::poly::kExpLo));
  x = _mm512_min_ps(x, _mm512_set1_ps(kvs::poly::kExpHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kvs::poly::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kvs::poly::kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kvs::poly::kLn2Lo), r);
  __m512 y = _mm512_set1_ps(kvs::poly::kExpR[0]);
  for (int i = 1; i < 8; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kvs::poly::kExpR[i]));
  return _mm512_scalef_ps(y, n);
}
#endif

#if defined(KVS_EXP_POLY_256)
inline __m256 exp_poly256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kvs::poly::kExpLo));
  x = _mm256_min_ps(x, _mm256_set1_ps(kvs::poly::kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kvs::poly::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kvs::poly::kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kvs::poly::kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kvs::poly::kExpR[0]);
  for (int i = 1; i < 8; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kvs::poly::kExpR[i]));
  // 2^n by building the exponent: n is in [-126, 127] after the clamp, so
  // the scale is a normal float and the product is exact-rounded like scalef.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif
