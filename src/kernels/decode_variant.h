// Decode (n = 1) kernel variants of the packed layouts, chosen per machine.
//
// The same kernels run at very different speeds on different CPUs: how many
// panels stream at once and how far ahead software prefetch reaches decide
// whether DRAM stays busy, and the best values differ between an Intel Xeon,
// an AMD EPYC with AVX-512 and one with AVX2 only. Every variant computes the
// same bits (the float chain per output row is fixed); only speed differs.
// `kvserve probe` times the candidates and stores the choice in the profile;
// the CLI applies it before serving (tools/kernel_choice.h).
#pragma once
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/quant.h"

namespace kvs {

struct DecodeVariant {
  int panels = 4;      // panels per pass (1, 2 or 4): independent memory streams
  int prefetch = 1024;  // software prefetch distance in bytes, 0 = none (not the Panel16 float decode)
  bool operator==(const DecodeVariant& o) const { return panels == o.panels && prefetch == o.prefetch; }
};

// Whether the decode kernel of packed weights of type t in `layout` reads the
// variant: every packed quantized type; the float types on Panel8 only (the
// AVX-512 Panel16 float decode has one fixed form), so `kvserve probe` does
// not time candidates that change nothing.
bool decode_variants_apply(GgmlType t, PackLayout layout);

// The candidates the packed decode kernels accept, the default first.
const std::vector<DecodeVariant>& decode_variants();
bool is_decode_variant(const DecodeVariant& v);
// The variant the kernels use for weights of type t (the default until set).
DecodeVariant decode_variant(GgmlType t);
// Throws std::invalid_argument when v is not a candidate.
void set_decode_variant(GgmlType t, const DecodeVariant& v);
void reset_decode_variants();
std::string to_string(const DecodeVariant& v);  // "panels=4 prefetch=1024"

}  // namespace kvs
