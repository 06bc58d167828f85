// Non-x86 builds: no AVX2 backend.
#include "kernels/cpu/backend.h"

namespace specd::kernels::cpu::internal {
const Backend* Avx2Backend() { return nullptr; }
}  // namespace specd::kernels::cpu::internal
