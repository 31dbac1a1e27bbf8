// Test helpers for the run-time ISA dispatch (kernels/cpu.h): force a path
// for a scope, and ask whether this CPU has one.
#pragma once
#include "kernels/cpu.h"

namespace kvs {

// Every dispatch level, lowest first.
inline constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx};

// Forces `isa` (clamped to what the CPU has) until the end of the scope.
struct IsaGuard {
  explicit IsaGuard(Isa isa) { set_isa_override(isa); }
  ~IsaGuard() { clear_isa_override(); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;
};

// Whether forcing `isa` gives exactly that level here.
inline bool isa_available(Isa isa) {
  set_isa_override(isa);
  const bool ok = active_isa() == isa;
  clear_isa_override();
  return ok;
}

}  // namespace kvs
