// Non-x86 builds: no x86 SIMD backends.
#include "kernels/cpu/isa_kernels.h"

namespace specd::kernels::cpu::internal {
const Backend* Avx2Backend() { return nullptr; }
const Backend* Avx512VnniBackend() { return nullptr; }
const Backend* VnniEmulatedBackend() { return nullptr; }
const Backend* AvxVnniBackend() { return nullptr; }
const Backend* AvxVnniEmulatedBackend() { return nullptr; }
}  // namespace specd::kernels::cpu::internal
