// Run-time ISA detection with CPUID + XGETBV.
//
// A CPUID feature bit alone is not enough: the OS must also save the wider
// register state on context switches (XCR0), otherwise AVX / AVX-512
// instructions fault. So every level checks both.
//
// Isa::Avx512 means the set our AVX-512 kernels are compiled for:
// F + BW + VL + DQ + VNNI (vpdpbusd is the core of the int8 dot products),
// plus the AVX2 set. A Skylake-X without VNNI therefore runs the AVX2 path.
//
// Isa::Amx adds AMX-TILE + AMX-INT8. Tile state is large, so Linux enables
// it per process on request (arch_prctl ARCH_REQ_XCOMP_PERM): until then the
// first tile instruction faults. The request is made once, at detection; a
// refusal (old kernel, seccomp) leaves the machine at Isa::Avx512.
#include "kernels/cpu.h"

#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace kvs {
namespace {

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  // xgetbv with ecx = 0; encoded as bytes so no -mxsave is needed.
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

// Asks Linux for the tile data state; true when granted (or already held).
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kXfeatureXtiledata = 18;  // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned hw = std::thread::hardware_concurrency();
  f.logical_cores = hw > 0 ? int(hw) : 1;

  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  if (max_leaf < 1) return f;
  __get_cpuid(1, &a, &b, &c, &d);
  const bool osxsave = (c >> 27) & 1;
  const bool avx = (c >> 28) & 1;
  const bool fma = (c >> 12) & 1;
  const bool f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;            // SSE + AVX state
  const bool os_zmm = os_ymm && (xcr0 & 0xE0) == 0xE0;  // opmask + ZMM_Hi256 + Hi16_ZMM
  if (!os_ymm || max_leaf < 7) return f;

  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const unsigned ebx7 = b, ecx7 = c, edx7 = d;
  unsigned eax7_1 = 0;
  if (a >= 1) {
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    eax7_1 = a1;
  }
  f.fma = fma;
  f.f16c = f16c;
  f.avx2 = (ebx7 >> 5) & 1;
  f.avxvnni = (eax7_1 >> 4) & 1;
  if (os_zmm) {
    f.avx512f = (ebx7 >> 16) & 1;
    f.avx512dq = (ebx7 >> 17) & 1;
    f.avx512bw = (ebx7 >> 30) & 1;
    f.avx512vl = (ebx7 >> 31) & 1;
    f.avx512vnni = (ecx7 >> 11) & 1;
    f.avx512vbmi = (ecx7 >> 1) & 1;
    f.avx512bf16 = (eax7_1 >> 5) & 1;
  }
  f.amx_tile = (edx7 >> 24) & 1;
  f.amx_int8 = (edx7 >> 25) & 1;
  f.amx_bf16 = (edx7 >> 22) & 1;
  f.amx_os = (xcr0 & 0x60000) == 0x60000;  // XTILECFG (17) + XTILEDATA (18)
  if (f.amx_tile && f.amx_int8 && f.amx_os) f.amx_permitted = request_amx_permission();
  return f;
}

Isa best_isa(const CpuFeatures& f) {
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
  if (avx512 && f.avx512vbmi && f.amx_tile && f.amx_int8 && f.amx_os && f.amx_permitted) return Isa::Amx;
  if (avx512) return Isa::Avx512;
  if (avx2) return Isa::Avx2;
  return Isa::Scalar;
}

// KVS_ISA, read once. -1 = not set / not recognised.
int env_isa() {
  const char* s = std::getenv("KVS_ISA");
  if (!s) return -1;
  if (!std::strcmp(s, "scalar")) return int(Isa::Scalar);
  if (!std::strcmp(s, "avx2")) return int(Isa::Avx2);
  if (!std::strcmp(s, "avx512")) return int(Isa::Avx512);
  if (!std::strcmp(s, "amx")) return int(Isa::Amx);
  return -1;
}

std::atomic<int> g_override{-1};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

Isa active_isa() {
  static const int best = int(best_isa(cpu_features()));
  static const int env = env_isa();
  int want = g_override.load(std::memory_order_relaxed);
  if (want < 0) want = env;  // an explicit override wins over the environment
  if (want < 0) return Isa(best);
  return Isa(std::min(want, best));
}

void set_isa_override(Isa isa) { g_override.store(int(isa), std::memory_order_relaxed); }
void clear_isa_override() { g_override.store(-1, std::memory_order_relaxed); }

bool amx_bf16_active() {
  const CpuFeatures& f = cpu_features();
  return active_isa() == Isa::Amx && f.amx_bf16 && f.avx512bf16;
}

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Amx: return "amx";
  }
  return "unknown";
}

}  // namespace kvs
