// Placeholder: the avx512 kernels land next; until then the scalar path.
#include "kernels/matmul_internal.h"
namespace kvs::mm {
const IsaKernels& avx512_kernels() { return scalar_kernels(); }
}  // namespace kvs::mm
