// Run-time ISA detection. The binary is built for baseline x86-64; kernels
// pick the best compiled path with cpu_features() at first use.
#pragma once
#include <string>

namespace kvs {

// Ordered levels: each includes the one below. Amx = Avx512 plus AMX-INT8
// tiles for quantized matmuls with enough activation rows (kernels/amx_rows.h).
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Amx = 3 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avxvnni = false;
  bool avx512vbmi = false;  // byte permutes (the AMX Q4_K slice copy; every AMX CPU has them)
  // AMX: CPUID bits, XCR0 enabling XTILECFG + XTILEDATA, and (Linux) the
  // kernel's permission for this process to use tile data; all four needed.
  bool amx_tile = false, amx_int8 = false, amx_os = false, amx_permitted = false;
  bool amx_bf16 = false;  // CPUID only; usable where active_isa() is Isa::Amx
  int logical_cores = 1;
};

const CpuFeatures& cpu_features();
// Best ISA level this machine supports, lowered by the KVS_ISA environment
// variable ("scalar", "avx2", "avx512", "amx") so tests can force every path;
// "avx512" keeps AMX machines on the VNNI kernels.
Isa active_isa();
void set_isa_override(Isa isa);  // tests: force a path (clamped to what the CPU has)
void clear_isa_override();       // back to KVS_ISA / the best the CPU has
std::string isa_name(Isa isa);
// AMX-BF16 tiles usable now: the active ISA is Isa::Amx and the CPU has
// AMX-BF16 and AVX512-BF16 (the activations' conversion).
bool amx_bf16_active();

}  // namespace kvs
