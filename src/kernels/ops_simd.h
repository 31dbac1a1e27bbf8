// ISA-specific element-wise ops behind ops.h (ops_simd.cpp). Callers use
// ops.h, which picks one by the active ISA.
#pragma once

namespace kvs::simd {

void swiglu_avx512(float* g, const float* u, int n);  // g, u: [n]
void swiglu_avx2(float* g, const float* u, int n);
void geglu_avx512(float* g, const float* u, int n);  // g, u: [n]
void geglu_avx2(float* g, const float* u, int n);
void clamped_swiglu_avx512(float* g, const float* u, int n, float alpha, float limit);  // g, u: [n]
void clamped_swiglu_avx2(float* g, const float* u, int n, float alpha, float limit);
void softcap_avx512(float* x, int n, float cap);  // x: [n]
void softcap_avx2(float* x, int n, float cap);
double sum_squares_avx512(const float* x, int n);  // x: [n]; ops.cpp's order
double sum_squares_avx2(const float* x, int n);

}  // namespace kvs::simd
