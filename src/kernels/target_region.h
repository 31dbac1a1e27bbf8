// Compile a region of a SIMD kernel file for an ISA beyond the x86-64
// baseline (run-time dispatch picks it only on CPUs that have it):
//   KVS_TARGET_BEGIN("avx2,fma,f16c")  ...functions...  KVS_TARGET_END()
// Place it after all includes, so no inline std code is compiled for the
// wider ISA. GCC uses target pragmas; clang ignores those and needs an
// attribute region. Also silences GCC's false uninitialised-vector warnings
// on intrinsics inside the region.
#pragma once

#define KVS_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define KVS_TARGET_BEGIN(isa) KVS_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define KVS_TARGET_END() KVS_PRAGMA(clang attribute pop)
#else
#define KVS_TARGET_BEGIN(isa)                              \
  KVS_PRAGMA(GCC diagnostic push)                          \
  KVS_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized") \
  KVS_PRAGMA(GCC diagnostic ignored "-Wuninitialized")     \
  KVS_PRAGMA(GCC push_options)                             \
  KVS_PRAGMA(GCC target(isa))
#define KVS_TARGET_END() KVS_PRAGMA(GCC pop_options) KVS_PRAGMA(GCC diagnostic pop)
#endif
