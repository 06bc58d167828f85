// Fast CPU kernels: AVX2+FMA+F16C with runtime dispatch and a generic fallback.
// Same semantics as kernels/ref/ops.h (see there for shapes); the first argument
// is the thread pool that runs the work.
//
// Batch invariance: every output row depends only on its own inputs. MatMul splits
// work over output features and activation rows, never over the reduction, and a
// multi-row tile accumulates each (t, n) in exactly the order of the single-row
// path; PagedAttention computes each (token, head) alone, over key chunks whose bounds
// depend only on the position, folded in chunk order. So results are bitwise
// identical whatever T is, whatever else is in the batch, and however many threads
// run (for a given ISA path).
#ifndef SPECD_KERNELS_CPU_OPS_H_
#define SPECD_KERNELS_CPU_OPS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_types.h"

namespace specd::kernels::cpu {

void MatMul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t T, float* y);
// ys[i] = ws[i] x for n weights that read the same x (e.g. q/k/v, gate/up): x is
// quantized once and all products share one parallel region. Bitwise the same as n
// MatMul calls.
void MatMulShared(ThreadPool& pool, const WeightMatrix* ws, int n, const float* x, int64_t T,
                  float* const* ys);
void RmsNorm(ThreadPool& pool, const float* x, int64_t T, int64_t D, const float* w, float eps,
             float* out);
void Rope(ThreadPool& pool, float* x, int64_t T, int32_t num_heads, int32_t head_dim,
          const int32_t* positions, const RopeParams& p);
// Rope in two steps, for callers that rotate many tensors at the same positions (every layer's
// q and k of a step): the angles' cos and sin once, cs, sn: [T, p.rope_dim / 2], then the
// rotation. Bitwise Rope's result.
void RopeAngles(ThreadPool& pool, int64_t T, const int32_t* positions, const RopeParams& p,
                float* cs, float* sn);
void RopeRotate(ThreadPool& pool, float* x, int64_t T, int32_t num_heads, int32_t head_dim,
                const float* cs, const float* sn, const RopeParams& p);
void SwiGlu(ThreadPool& pool, const float* gate, const float* up, int64_t T, int64_t F,
            float* out);
void Softmax(ThreadPool& pool, float* x, int64_t n);
void AddInPlace(ThreadPool& pool, float* x, const float* y, int64_t n);
void AddBias(ThreadPool& pool, float* x, int64_t T, int64_t N, const float* b);
void EmbeddingLookup(ThreadPool& pool, const WeightMatrix& table, const int32_t* ids, int64_t T,
                     float* out);
void WriteKv(ThreadPool& pool, const float* k, const float* v, int64_t T, const int64_t* slots,
             const PagedKvLayer& kv);
void PagedAttention(ThreadPool& pool, const float* q, int64_t T, int32_t num_q_heads,
                    const int32_t* positions, const int32_t* const* block_tables,
                    const PagedKvLayer& kv, float scale, float* out);

// Packed weights: Q4_1, Q4_0 and Q8_0 matrices repacked once (at load) into the layout the MatMul
// kernels compute in (kernels/cpu/isa_kernels.h, kPackRows-row groups whose blocks are
// contiguous), so a step reads them with plain loads instead of transposing every block of
// every row group again. Results are bitwise those of the unpacked matrix.
// PackedWeightBytes: the size of w's packed copy, 0 if w's type has no packed layout.
// PackWeight: writes it to out (64-byte aligned); set w.packed = out to use it (w.data must
// stay valid: paths without a packed kernel, e.g. the generic ISA, read it).
// PackingEnabled: whether the active ISA reads packed weights and SPECD_KERNELS_PACK is not
// "0" (the switch that lets one binary measure packed against unpacked).
// PackWeightCopy: allocates w's packed copy (64-byte aligned), writes it and points w->packed
// at it; returns the buffer that owns it, or nullptr (w unchanged) for a type without one.
int64_t PackedWeightBytes(const WeightMatrix& w);
void PackWeight(const WeightMatrix& w, uint8_t* out);
std::unique_ptr<uint8_t[]> PackWeightCopy(WeightMatrix* w);
bool PackingEnabled();

// Benchmarks: the float multiply-add rate (GFLOP/s) all of pool's threads reach with the
// attention kernels' vectors (independent FMA chains, best of 3 runs of ~0.1 s): the floor
// attention's arithmetic is held against.
double MeasureFloatGflops(ThreadPool& pool);

// Instruction-set path in use. The default is the best the CPU supports (AVX-512 VNNI, then
// AVX-VNNI, then AVX2, then generic); SPECD_KERNELS_ISA=<IsaName> or SetIsa picks another
// supported one (not thread-safe against running kernels). kVnniEmulated runs the AVX-512
// VNNI code with the VNNI instruction emulated in AVX2, and kAvxVnniEmulated the AVX-VNNI
// code likewise, so tests check that code on any AVX2 CPU; they are slower and never the
// default. AllIsas lists every one, supported or not.
enum class Isa { kGeneric, kAvx2, kAvx512Vnni, kVnniEmulated, kAvxVnni, kAvxVnniEmulated };
const std::vector<Isa>& AllIsas();
Isa ActiveIsa();
bool IsaSupported(Isa isa);
// The CPU has AVX-512 BF16: bf16 attention (KvDtype::kBF16) on the VNNI path uses vdpbf16ps.
bool Avx512Bf16Supported();
void SetIsa(Isa isa);  // ignored if unsupported
const char* IsaName(Isa isa);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_OPS_H_
