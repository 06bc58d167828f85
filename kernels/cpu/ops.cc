// CPU kernels: work splitting, scratch memory, ISA dispatch and the generic
// (scalar) backend. The AVX2 backend lives in ops_avx2.cc.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/act_quant.h"
#include "kernels/attn_bf16.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/kv_int8.h"
#include "kernels/ref/ops.h"

namespace specd::kernels::cpu {
namespace {

using gguf::GgmlType;
using internal::AttnArgs;
using internal::Backend;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "specd::kernels::cpu: %s\n", what);
  std::abort();
}

bool IsQuantized(GgmlType t) {
  return t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 ||
         t == GgmlType::kQ4_K || t == GgmlType::kQ6_K;
}

// Grow-only per-thread scratch (no allocation once warm).
template <typename T>
T* Scratch(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// ------------------------------------------------------------ generic backend

void GenQuantizeAct(const float* x, int64_t n, ActBlockQ8* out) { QuantizeActRow(x, n, out); }

// Same arithmetic as ref::MatMul, one weight row at a time with T accumulators.
void GenMatMulQ(const WeightMatrix& w, const ActBlockQ8* act, int64_t T, int64_t n0, int64_t n1,
                float* y, float* acc) {
  const int64_t nb = w.cols / 32;
  ref::IntSubBlock sb;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.data + n * w.row_bytes;
    for (int64_t t = 0; t < T; ++t) acc[t] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      ref::DecodeIntSubBlock(w.type, row, b, &sb);
      int32_t wq[32];
      for (int i = 0; i < 32; ++i) wq[i] = sb.sub_scale[i] * sb.q[i];
      for (int64_t t = 0; t < T; ++t) {
        const ActBlockQ8& a = act[t * nb + b];
        int32_t isum = 0;
        for (int i = 0; i < 32; ++i) isum += wq[i] * a.qs[i];
        acc[t] += (sb.scale * a.d) * static_cast<float>(isum);
        if (sb.min != 0.0f) acc[t] += sb.min * a.s;
      }
    }
    for (int64_t t = 0; t < T; ++t) y[t * w.rows + n] = acc[t];
  }
}

void GenMatMulF(const WeightMatrix& w, const float* x, int64_t T, int64_t n0, int64_t n1,
                float* y) {
  const int64_t K = w.cols;
  float buf[256];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.data + n * w.row_bytes;
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += 256) {
        const int64_t len = K - k0 < 256 ? K - k0 : 256;
        // Dequantizing a slice of a float row is exact for F32/F16/BF16.
        const int64_t esize = w.type == GgmlType::kF32 ? 4 : 2;
        ref::DequantizeRow(w.type, row + k0 * esize, len, buf);
        for (int64_t k = 0; k < len; ++k) acc += buf[k] * x[t * K + k0 + k];
      }
      y[t * w.rows + n] = acc;
    }
  }
}

void GenRmsNorm(const float* x, int64_t D, const float* w, float eps, float* out, int64_t t0,
                int64_t t1) {
  ref::RmsNorm(x + t0 * D, t1 - t0, D, w, eps, out + t0 * D);
}

void GenSwiGlu(const float* g, const float* u, float* out, int64_t n) {
  ref::SwiGlu(g, u, 1, n, out);
}

void GenSoftmax(float* x, int64_t n) { ref::Softmax(x, n); }

using internal::AttnItem;
using internal::AttnMerge;
using internal::kAttnChunk;

// Raw partial of keys [j0, j1) for the pair (t, h): part = o[group][d], m[group], l[group].
// s: [kAttnChunk] scores.
void GenAttnChunk(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1, float* s,
                  float* part) {
  const PagedKvLayer& kv = *a.kv;
  const int32_t d = kv.head_dim, hkv = kv.num_kv_heads, group = a.num_q_heads / hkv;
  const int32_t* table = a.block_tables[t];
  float* m = part + static_cast<int64_t>(group) * d;
  float* l = m + group;
  // bf16 attention (kernels/attn_bf16.h; a.q is already rounded): dims and keys in pairs,
  // the odd one first, p rounded. int8 KV (kernels/kv_int8.h; a.q holds q's codes): scores
  // from the codes (exact sums), p V as bf16's with w = p * vs rounded and V's codes.
  const bool bf16 = kv.dtype == KvDtype::kBF16, int8 = kv.dtype == KvDtype::kInt8;
  const int64_t swap = bf16 ? 1 : 0, pv_swap = bf16 || int8 ? 1 : 0;
  for (int32_t g = 0; g < group; ++g) {
    const int64_t qrow = static_cast<int64_t>(t) * a.num_q_heads + static_cast<int64_t>(h) * group + g;
    const float* q = a.q + qrow * d;
    float mx = -INFINITY;
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t slot = static_cast<int64_t>(table[j / kv.block_size]) * kv.block_size + j % kv.block_size;
      if (int8) {
        float isum = 0.0f;  // exact: integers below 2^24
        for (int32_t i = 0; i < d; ++i) isum += q[i] * static_cast<const int8_t*>(kv.k)[kv.KIndex(slot, h, i)];
        s[j - j0] = Int8Score(isum, kv.k_scale[kv.SIndex(slot, h)], a.q_score_scale[qrow]);
        mx = s[j - j0] > mx ? s[j - j0] : mx;
        continue;
      }
      float dot = 0.0f;
      for (int32_t i0 = 0; i0 < d; ++i0) {
        const int32_t i = (i0 ^ swap) < d ? static_cast<int32_t>(i0 ^ swap) : i0;
        dot += q[i] * ref::KAt(kv, slot, h, i);  // bf16: the product is exact, so this is one rounding
      }
      s[j - j0] = dot * a.scale;
      mx = s[j - j0] > mx ? s[j - j0] : mx;
    }
    float sum = 0.0f;
    for (int64_t j = j0; j < j1; ++j) {
      s[j - j0] = std::exp(s[j - j0] - mx);
      sum += s[j - j0];
      if (bf16) s[j - j0] = RoundBf16Attn(s[j - j0]);
    }
    float* o = part + static_cast<int64_t>(g) * d;
    for (int32_t i = 0; i < d; ++i) o[i] = 0.0f;
    for (int64_t jj = j0; jj < j1; ++jj) {
      const int64_t j = ((jj - j0) ^ pv_swap) + j0 < j1 ? ((jj - j0) ^ pv_swap) + j0 : jj;
      const int64_t slot = static_cast<int64_t>(table[j / kv.block_size]) * kv.block_size + j % kv.block_size;
      if (int8) {
        const float w = RoundBf16Attn(s[j - j0] * kv.v_scale[kv.SIndex(slot, h)]);
        const int8_t* vc = static_cast<const int8_t*>(kv.v) + kv.VIndex(slot, h);
        for (int32_t i = 0; i < d; ++i) o[i] += w * static_cast<float>(vc[i]);
        continue;
      }
      for (int32_t i = 0; i < d; ++i) o[i] += s[j - j0] * ref::VAt(kv, slot, h, i);
    }
    m[g] = mx;
    l[g] = sum;
  }
}

// Folds the next chunk's partial into state (the first chunk is copied): rescales both
// to the larger max and adds.
void GenAttnFold(bool first, const float* part, float* state, int32_t group, int32_t d) {
  const int64_t od = static_cast<int64_t>(group) * d;
  if (first) {
    std::memcpy(state, part, sizeof(float) * (od + 2 * group));
    return;
  }
  for (int32_t g = 0; g < group; ++g) {
    float ws, wp;
    internal::AttnFoldScales(part, state, group, d, g, &ws, &wp);
    for (int32_t i = 0; i < d; ++i) state[g * d + i] = state[g * d + i] * ws + part[g * d + i] * wp;
  }
}

// out rows of the pair (t, h) = o / l.
void GenAttnFinish(const AttnArgs& a, int32_t t, int32_t h, const float* state) {
  const int32_t d = a.kv->head_dim, group = a.num_q_heads / a.kv->num_kv_heads;
  for (int32_t g = 0; g < group; ++g) {
    const float inv = 1.0f / state[static_cast<int64_t>(group) * d + group + g];
    float* dst = a.out + (static_cast<int64_t>(t) * a.num_q_heads + static_cast<int64_t>(h) * group + g) * d;
    for (int32_t i = 0; i < d; ++i) dst[i] = state[g * d + i] * inv;
  }
}

void GenAttention(const AttnArgs& a, int64_t i0, int64_t i1, float* scratch) {
  const int32_t d = a.kv->head_dim, group = a.num_q_heads / a.kv->num_kv_heads;
  float* s = scratch;
  float* part = s + kAttnChunk;
  float* state = part + internal::AttnPartialFloats(group, d);
  internal::RunAttnItems(
      a, i0, i1, part, state,
      [&](int32_t t, int32_t h, int64_t j0, int64_t j1, float* p) {
        GenAttnChunk(a, t, h, j0, j1, s, p);
      },
      [&](bool first, const float* p, float* st) { GenAttnFold(first, p, st, group, d); },
      [&](int32_t t, int32_t h, const float* st) { GenAttnFinish(a, t, h, st); });
}

void GenAttentionMerge(const AttnArgs& a, int64_t i0, int64_t i1, float* scratch) {
  const int32_t d = a.kv->head_dim, group = a.num_q_heads / a.kv->num_kv_heads;
  internal::RunAttnMerges(
      a, i0, i1, scratch,
      [&](bool first, const float* p, float* st) { GenAttnFold(first, p, st, group, d); },
      [&](int32_t t, int32_t h, const float* st) { GenAttnFinish(a, t, h, st); });
}

void GenQuantizeKvRows(const float* x, int64_t rows, int32_t d, int8_t* codes, float* code_floats,
                       int32_t* code_sums, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    scales[r] = QuantizeKvRow(x + r * d, d, codes + r * d, 1);
    int32_t sum = 0;
    for (int32_t i = 0; i < d; ++i) {
      if (code_floats != nullptr) code_floats[r * d + i] = static_cast<float>(codes[r * d + i]);
      sum += codes[r * d + i];
    }
    if (code_sums != nullptr) code_sums[r] = sum;
  }
}

void GenToF16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ref::F32ToF16(src[i]);
}

float GenFmaProbe(int64_t iters, int64_t* flops) {
  float acc[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int64_t it = 0; it < iters; ++it) {
    for (float& a : acc) a = a * 0.999f + 1e-3f;
  }
  *flops += iters * 8 * 2;
  float sum = 0;
  for (float a : acc) sum += a;
  return sum;
}

const Backend kGeneric = {
    GenQuantizeAct, GenMatMulQ, GenMatMulF, GenRmsNorm, GenSwiGlu, GenSoftmax, GenAttention,
    GenAttentionMerge, GenToF16, nullptr, GenQuantizeKvRows, GenFmaProbe,
};

// ------------------------------------------------------------ dispatch

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C via cpuid: clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c &&
         internal::Avx2Backend() != nullptr;
#else
  return false;
#endif
}

// AVX-512 VNNI with the AVX512VL forms (the kernels use 256-bit vectors).
bool CpuHasAvx512Vnni() {
#if defined(__x86_64__) || defined(__i386__)
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
         internal::Avx512VnniBackend() != nullptr;
#else
  return false;
#endif
}

// Bit `bit` of CPUID leaf 7, sub-leaf 1, EAX (AVX-VNNI: 4, AVX-512 BF16: 5).
bool CpuidLeaf7Sub1EaxBit(int bit) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << bit)) != 0;
#else
  return false;
#endif
}

// AVX-VNNI (vpdpbusd in its VEX form, on AVX2's vectors). Asked once.
bool CpuHasAvxVnni() {
  static const bool has =
      CpuHasAvx2() && CpuidLeaf7Sub1EaxBit(4) && internal::AvxVnniBackend() != nullptr;
  return has;
}

// AVX-512 BF16 (vdpbf16ps). Asked once.
bool CpuHasAvx512Bf16() {
  static const bool has = CpuHasAvx512Vnni() && CpuidLeaf7Sub1EaxBit(5);
  return has;
}

const internal::Backend* BackendOf(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return CpuHasAvx2() ? internal::Avx2Backend() : nullptr;
    case Isa::kAvx512Vnni: return CpuHasAvx512Vnni() ? internal::Avx512VnniBackend() : nullptr;
    case Isa::kVnniEmulated: return CpuHasAvx2() ? internal::VnniEmulatedBackend() : nullptr;
    case Isa::kAvxVnni: return CpuHasAvxVnni() ? internal::AvxVnniBackend() : nullptr;
    case Isa::kAvxVnniEmulated: return CpuHasAvx2() ? internal::AvxVnniEmulatedBackend() : nullptr;
    case Isa::kGeneric: return &kGeneric;
  }
  return nullptr;
}

// The best the CPU runs natively.
Isa DefaultIsa() {
  if (CpuHasAvx512Vnni()) return Isa::kAvx512Vnni;
  if (CpuHasAvxVnni()) return Isa::kAvxVnni;
  return CpuHasAvx2() ? Isa::kAvx2 : Isa::kGeneric;
}

// The ISA in use and its kernel table, set together (the CPU checks run cpuid, which a VM
// may trap: never on the hot path).
std::atomic<int> g_isa{-1};
std::atomic<const Backend*> g_backend{nullptr};

void UseIsa(Isa isa, const Backend* be) {
  g_backend.store(be, std::memory_order_relaxed);
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

Isa CurrentIsa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    Isa isa = DefaultIsa();
    if (const char* e = std::getenv("SPECD_KERNELS_ISA"); e != nullptr) {
      for (Isa cand : AllIsas()) {
        if (std::strcmp(e, IsaName(cand)) == 0 && BackendOf(cand) != nullptr) isa = cand;
      }
    }
    UseIsa(isa, BackendOf(isa));
    v = static_cast<int>(isa);
  }
  return static_cast<Isa>(v);
}

const Backend& Be() {
  const Backend* be = g_backend.load(std::memory_order_relaxed);
  if (be == nullptr) {
    CurrentIsa();
    be = g_backend.load(std::memory_order_relaxed);
  }
  return *be;
}

// Parallelize elementwise work only when it is big enough to pay for the wake-up.
constexpr int64_t kMinParallelElems = 1 << 15;

}  // namespace

namespace internal {
const Backend& GenericBackend() { return kGeneric; }
}  // namespace internal

const std::vector<Isa>& AllIsas() {
  static const std::vector<Isa> all = {Isa::kGeneric,       Isa::kAvx2,    Isa::kAvx512Vnni,
                                       Isa::kVnniEmulated,  Isa::kAvxVnni, Isa::kAvxVnniEmulated};
  return all;
}
Isa ActiveIsa() { return CurrentIsa(); }
bool IsaSupported(Isa isa) { return BackendOf(isa) != nullptr; }
bool Avx512Bf16Supported() { return CpuHasAvx512Bf16(); }
void SetIsa(Isa isa) {
  if (const Backend* be = BackendOf(isa)) UseIsa(isa, be);
}
const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Vnni: return "avx512vnni";
    case Isa::kVnniEmulated: return "vnni_emulated";
    case Isa::kAvxVnni: return "avxvnni";
    case Isa::kAvxVnniEmulated: return "avxvnni_emulated";
    case Isa::kGeneric: return "generic";
  }
  return "generic";
}

// ------------------------------------------------------------ packed weights

bool PackingEnabled() {
  const char* e = std::getenv("SPECD_KERNELS_PACK");
  return Be().matmul_q_packed != nullptr && !(e != nullptr && std::strcmp(e, "0") == 0);
}

int64_t PackedWeightBytes(const WeightMatrix& w) {
  const internal::PackLayout lay = internal::PackLayoutOf(w.type);
  if (lay.block_bytes == 0 || w.rows <= 0 || w.cols <= 0 || w.cols % 32 != 0) return 0;
  const int64_t groups = (w.rows + internal::kPackRows - 1) / internal::kPackRows;
  return groups * (w.cols / 32) * lay.block_bytes;
}

void PackWeight(const WeightMatrix& w, uint8_t* out) {
  const internal::PackLayout lay = internal::PackLayoutOf(w.type);
  const int64_t code_bytes = 4 * lay.code_vectors, bytes = lay.head_bytes + code_bytes;  // a block's
  const int64_t nb = w.cols / 32, groups = (w.rows + internal::kPackRows - 1) / internal::kPackRows;
  std::memset(out, 0, static_cast<size_t>(groups * nb * lay.block_bytes));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = out + (g * nb + b) * lay.block_bytes;
      for (int32_t i = 0; i < internal::kPackRows; ++i) {
        int64_t row = g * internal::kPackRows + i;
        if (row >= w.rows) row = w.rows - 1;  // the last group repeats the last row
        const uint8_t* blk = w.data + row * w.row_bytes + b * bytes;
        for (int j = 0; j < lay.code_vectors; ++j) std::memcpy(dst + 64 * j + 4 * i, blk + lay.head_bytes + 4 * j, 4);
        std::memcpy(dst + lay.scales_at + 2 * i, blk, 2);
        if (lay.mins_at >= 0) std::memcpy(dst + lay.mins_at + 2 * i, blk + 2, 2);
      }
    }
  }
}

std::unique_ptr<uint8_t[]> PackWeightCopy(WeightMatrix* w) {
  const int64_t bytes = PackedWeightBytes(*w);
  if (bytes == 0) return nullptr;
  auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(bytes) + 63);
  auto* out = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.get()) + 63) & ~uintptr_t{63});
  PackWeight(*w, out);
  w->packed = out;
  return buf;
}

// ------------------------------------------------------------ ops

void MatMul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t T, float* y) {
  float* ys[1] = {y};
  MatMulShared(pool, &w, 1, x, T, ys);
}

void MatMulShared(ThreadPool& pool, const WeightMatrix* ws, int n, const float* x, int64_t T,
                  float* const* ys) {
  if (n <= 0) return;
  bool quantized = true;
  for (int i = 0; i < n; ++i) {
    if (!MatMulSupportsType(ws[i].type)) Fail("MatMul: unsupported weight type");
    if (!IsQuantized(ws[i].type) || ws[i].cols != ws[0].cols) quantized = false;
  }
  if (!quantized && n > 1) {  // float weights (or mixed shapes): one product at a time
    for (int i = 0; i < n; ++i) MatMulShared(pool, ws + i, 1, x, T, ys + i);
    return;
  }
  if (T <= 0) return;
  const Backend& be = Be();
  const int64_t K = ws[0].cols;
  // Packed weights are read by whole 16-row groups; the others by 8-row groups.
  auto reads_packed = [&](const WeightMatrix& w) { return w.packed != nullptr && be.matmul_q_packed != nullptr; };
  bool any_packed = false;
  for (int i = 0; i < n; ++i) any_packed |= reads_packed(ws[i]);
  // weight rows per work unit (the quantized kernels' row group)
  const int64_t kTileRows = any_packed ? internal::kPackRows : 8;
  // Work units: tiles of kTileRows rows of each matrix in turn.
  int64_t tiles = 0;
  for (int i = 0; i < n; ++i) tiles += (ws[i].rows + kTileRows - 1) / kTileRows;
  if (tiles == 0) return;
  // Each chunk of work should be at least ~64K multiply-adds.
  const int64_t per_tile = kTileRows * T * K;
  const int64_t grain = per_tile >= 65536 ? 1 : (65536 + per_tile - 1) / per_tile;
  // Calls fn(i, row0, row1) for the rows of each matrix that units [b, e) cover.
  auto for_rows = [&](int64_t b, int64_t e, auto&& fn) {
    int64_t base = 0;
    for (int i = 0; i < n && b < e; ++i) {
      const int64_t ti = (ws[i].rows + kTileRows - 1) / kTileRows;
      if (b < base + ti) {
        const int64_t lo = b - base, hi = (e < base + ti ? e : base + ti) - base;
        fn(i, lo * kTileRows, hi * kTileRows < ws[i].rows ? hi * kTileRows : ws[i].rows);
        b = base + hi;
      }
      base += ti;
    }
  };
  if (!quantized) {
    pool.ParallelFor(tiles, [&](int64_t b, int64_t e) {
      for_rows(b, e, [&](int i, int64_t r0, int64_t r1) { be.matmul_f(ws[i], x, T, r0, r1, ys[i]); });
    }, grain);
    return;
  }
  for (int i = 0; i < n; ++i) {
    const int64_t block = (ws[i].type == GgmlType::kQ4_K || ws[i].type == GgmlType::kQ6_K) ? 256 : 32;
    if (K % block != 0) Fail("MatMul: cols not a multiple of the block size");
  }
  const int64_t nb = K / 32;
  static thread_local std::vector<ActBlockQ8> act_buf;
  ActBlockQ8* act = Scratch(act_buf, T * nb);
  auto quantize = [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) be.quantize_act(x + t * K, K, act + t * nb);
  };
  if (T * K >= kMinParallelElems) {
    pool.ParallelFor(T, quantize);
  } else {
    quantize(0, T);
  }
  const int64_t scratch_n = internal::MatMulScratchFloats(T, nb);
  pool.ParallelFor(tiles, [&](int64_t b, int64_t e) {
    static thread_local std::vector<float> buf;
    float* scratch = Scratch(buf, scratch_n);
    for_rows(b, e, [&](int i, int64_t r0, int64_t r1) {
      if (reads_packed(ws[i])) {
        be.matmul_q_packed(ws[i], act, T, r0, r1, ys[i], scratch);
      } else {
        be.matmul_q(ws[i], act, T, r0, r1, ys[i], scratch);
      }
    });
  }, grain);
}

void RmsNorm(ThreadPool& pool, const float* x, int64_t T, int64_t D, const float* w, float eps,
             float* out) {
  const Backend& be = Be();
  const int64_t grain = D >= kMinParallelElems ? 1 : kMinParallelElems / (D > 0 ? D : 1);
  pool.ParallelFor(T, [&](int64_t b, int64_t e) { be.rmsnorm(x, D, w, eps, out, b, e); }, grain);
}

namespace {

// cos and sin of token t's angles: cs, sn [half] (the reference's double angles, as floats).
void AnglesOf(int32_t position, const double* inv_freq, int half, float* cs, float* sn) {
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    cs[i] = static_cast<float>(std::cos(angle));
    sn[i] = static_cast<float>(std::sin(angle));
  }
}

// v: one head's [head_dim], rotated by cs, sn [half].
void RotateHead(float* v, const float* cs, const float* sn, int half, RopeLayout layout) {
  if (layout == RopeLayout::kNormal) {
    for (int i = 0; i < half; ++i) {
      const float a0 = v[2 * i], a1 = v[2 * i + 1];
      v[2 * i] = a0 * cs[i] - a1 * sn[i];
      v[2 * i + 1] = a0 * sn[i] + a1 * cs[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float a0 = v[i], a1 = v[i + half];
      v[i] = a0 * cs[i] - a1 * sn[i];
      v[i + half] = a0 * sn[i] + a1 * cs[i];
    }
  }
}

int RopeHalf(const RopeParams& p, int32_t head_dim) {
  const int half = p.rope_dim / 2;
  if (p.rope_dim > head_dim) Fail("Rope: rope_dim > head_dim");
  if (half > 512) Fail("Rope: rope_dim too large");
  return half;
}

}  // namespace

void RopeAngles(ThreadPool& pool, int64_t T, const int32_t* positions, const RopeParams& p,
                float* cs, float* sn) {
  const int half = p.rope_dim / 2;
  if (half <= 0) return;
  if (half > 512) Fail("Rope: rope_dim too large");
  double inv_freq[512];
  ref::RopeInvFreq(p, inv_freq);
  const int64_t grain = half >= kMinParallelElems ? 1 : kMinParallelElems / half;
  pool.ParallelFor(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) AnglesOf(positions[t], inv_freq, half, cs + t * half, sn + t * half);
  }, grain);
}

void RopeRotate(ThreadPool& pool, float* x, int64_t T, int32_t num_heads, int32_t head_dim,
                const float* cs, const float* sn, const RopeParams& p) {
  const int half = RopeHalf(p, head_dim);
  if (half <= 0) return;
  const int64_t per_token = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t grain = per_token >= kMinParallelElems ? 1 : kMinParallelElems / per_token;
  pool.ParallelFor(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      for (int32_t h = 0; h < num_heads; ++h) {
        RotateHead(x + (t * num_heads + h) * head_dim, cs + t * half, sn + t * half, half, p.layout);
      }
    }
  }, grain);
}

void Rope(ThreadPool& pool, float* x, int64_t T, int32_t num_heads, int32_t head_dim,
          const int32_t* positions, const RopeParams& p) {
  const int half = RopeHalf(p, head_dim);
  if (half <= 0) return;
  double inv_freq[512];
  ref::RopeInvFreq(p, inv_freq);
  const int64_t per_token = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t grain = per_token >= kMinParallelElems ? 1 : kMinParallelElems / per_token;
  pool.ParallelFor(T, [&](int64_t b, int64_t e) {
    float cs[512], sn[512];
    for (int64_t t = b; t < e; ++t) {
      AnglesOf(positions[t], inv_freq, half, cs, sn);
      for (int32_t h = 0; h < num_heads; ++h) {
        RotateHead(x + (t * num_heads + h) * head_dim, cs, sn, half, p.layout);
      }
    }
  }, grain);
}

void SwiGlu(ThreadPool& pool, const float* gate, const float* up, int64_t T, int64_t F,
            float* out) {
  const Backend& be = Be();
  const int64_t n = T * F;
  // Chunks are multiples of 8 elements; each element's value does not depend on the split.
  const int64_t units = (n + 7) / 8;
  pool.ParallelFor(units, [&](int64_t b, int64_t e) {
    const int64_t i0 = b * 8, i1 = e * 8 < n ? e * 8 : n;
    be.swiglu(gate + i0, up + i0, out + i0, i1 - i0);
  }, kMinParallelElems / 8);
}

void Softmax(ThreadPool& pool, float* x, int64_t n) { Be().softmax(x, n); }

void AddInPlace(ThreadPool& pool, float* x, const float* y, int64_t n) {
  pool.ParallelFor(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] += y[i];
  }, kMinParallelElems);
}

void AddBias(ThreadPool& pool, float* x, int64_t T, int64_t N, const float* b) {
  const int64_t grain = N >= kMinParallelElems ? 1 : kMinParallelElems / (N > 0 ? N : 1);
  pool.ParallelFor(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t i = 0; i < N; ++i) x[t * N + i] += b[i];
  }, grain);
}

void EmbeddingLookup(ThreadPool& pool, const WeightMatrix& table, const int32_t* ids, int64_t T,
                     float* out) {
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= table.rows) Fail("EmbeddingLookup: id out of range");
  }
  const int64_t grain = table.cols >= kMinParallelElems ? 1 : kMinParallelElems / (table.cols > 0 ? table.cols : 1);
  pool.ParallelFor(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      if (!ref::DequantizeRow(table.type, table.data + ids[t] * table.row_bytes, table.cols,
                              out + t * table.cols)) {
        Fail("EmbeddingLookup: unsupported type");
      }
    }
  }, grain);
}

void WriteKv(ThreadPool& pool, const float* k, const float* v, int64_t T, const int64_t* slots,
             const PagedKvLayer& kv) {
  const Backend& be = Be();
  const int32_t d = kv.head_dim;
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * d;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;  // a padding row of a bucketed step
    if (slots[t] >= kv.num_blocks * kv.block_size) Fail("WriteKv: bad slot");
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const int64_t src = t * row + static_cast<int64_t>(h) * d;
      const int64_t vdst = kv.VIndex(slots[t], h), kdst = kv.KIndex(slots[t], h, 0);
      const int64_t kstride = kv.block_size;  // K is transposed inside its block
      switch (kv.dtype) {
        case KvDtype::kF32:
          std::memcpy(static_cast<float*>(kv.v) + vdst, v + src, d * sizeof(float));
          for (int32_t i = 0; i < d; ++i) static_cast<float*>(kv.k)[kdst + i * kstride] = k[src + i];
          break;
        case KvDtype::kF16: {
          be.to_f16(v + src, static_cast<uint16_t*>(kv.v) + vdst, d);
          uint16_t row_f16[512];  // d <= 512 on this path (PagedAttention's check)
          for (int32_t i0 = 0; i0 < d; i0 += 512) {
            const int32_t n = d - i0 < 512 ? d - i0 : 512;
            be.to_f16(k + src + i0, row_f16, n);
            for (int32_t i = 0; i < n; ++i) static_cast<uint16_t*>(kv.k)[kdst + (i0 + i) * kstride] = row_f16[i];
          }
          break;
        }
        case KvDtype::kBF16:  // bf16 attention's rounding (kernels/attn_bf16.h)
          for (int32_t i = 0; i < d; ++i) {
            static_cast<uint16_t*>(kv.k)[kdst + i * kstride] = ToBf16Attn(k[src + i]);
            static_cast<uint16_t*>(kv.v)[vdst + i] = ToBf16Attn(v[src + i]);
          }
          break;
        case KvDtype::kInt8: {  // the one quantizer (or its vector twin: the same bits)
          int8_t* kcodes = static_cast<int8_t*>(kv.k) + kdst;
          int8_t* vcodes = static_cast<int8_t*>(kv.v) + vdst;
          float* ks = kv.k_scale + kv.SIndex(slots[t], h);
          float* vs = kv.v_scale + kv.SIndex(slots[t], h);
          if (d > 512) {  // longer than the row buffer below
            *ks = QuantizeKvRow(k + src, d, kcodes, kstride);
            *vs = QuantizeKvRow(v + src, d, vcodes, 1);
            break;
          }
          const Backend& qbe = d % 8 == 0 ? be : kGeneric;
          int8_t row_codes[512];
          qbe.quantize_kv_rows(k + src, 1, d, row_codes, nullptr, nullptr, ks);
          for (int32_t i = 0; i < d; ++i) kcodes[i * kstride] = row_codes[i];
          qbe.quantize_kv_rows(v + src, 1, d, vcodes, nullptr, nullptr, vs);
          break;
        }
      }
    }
  }
}

namespace {

// bf16 attention rounds q to bf16 once for every path (kernels/attn_bf16.h): args->q becomes
// the rounded copy, args->q_bf16 its bf16 bits (the native dot products' operand). A prefill
// chunk's q is 512 x Hq x d values: split over the pool, in a loop the compiler vectorizes.
void RoundQueriesToBf16(ThreadPool& pool, const float* q, int64_t n, AttnArgs* args) {
  static thread_local std::vector<float> rounded;
  static thread_local std::vector<uint16_t> bits;
  float* r = Scratch(rounded, n);
  if (static_cast<int64_t>(bits.size()) < n) bits.resize(static_cast<size_t>(n));
  uint16_t* b = bits.data();
  pool.ParallelFor(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      b[i] = ToBf16Attn(q[i]);
      r[i] = Bf16AttnToF32(b[i]);
    }
  }, kMinParallelElems);
  args->q = r;
  args->q_bf16 = b;
  args->bf16_dot = CpuHasAvx512Bf16();
}

// Attention on an int8 KV cache quantizes each q row once for every path (kernels/kv_int8.h):
// args->q becomes the rows' codes as floats, args->q_i8 the same codes, args->q_score_scale
// each row's qs * scale.
void QuantizeQueriesToInt8(ThreadPool& pool, const float* q, int64_t rows, int32_t d, float scale,
                           AttnArgs* args) {
  static thread_local std::vector<float> codes_f32, row_scales;
  static thread_local std::vector<int8_t> codes;
  static thread_local std::vector<int32_t> code_sums;
  float* cf = Scratch(codes_f32, rows * d);
  float* qss = Scratch(row_scales, rows);
  if (static_cast<int64_t>(codes.size()) < rows * d) codes.resize(static_cast<size_t>(rows * d));
  if (static_cast<int64_t>(code_sums.size()) < rows) code_sums.resize(static_cast<size_t>(rows));
  int8_t* c = codes.data();
  int32_t* sums = code_sums.data();
  const Backend& be = d % 8 == 0 ? Be() : kGeneric;
  pool.ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    be.quantize_kv_rows(q + r0 * d, r1 - r0, d, c + r0 * d, cf + r0 * d, sums + r0, qss + r0);
    for (int64_t r = r0; r < r1; ++r) qss[r] *= scale;
  }, kMinParallelElems / (d > 0 ? d : 1));
  args->q = cf;
  args->q_i8 = c;
  args->q_score_scale = qss;
  args->q_code_sum = sums;
}

}  // namespace

void PagedAttention(ThreadPool& pool, const float* q, int64_t T, int32_t num_q_heads,
                    const int32_t* positions, const int32_t* const* block_tables,
                    const PagedKvLayer& kv, float scale, float* out) {
  if (T <= 0) return;
  const int32_t hkv = kv.num_kv_heads, d = kv.head_dim;
  if (hkv <= 0 || num_q_heads % hkv != 0) Fail("PagedAttention: Hq % Hkv != 0");
  const int32_t group = num_q_heads / hkv;
  for (int64_t t = 0; t < T; ++t) {
    if (positions[t] < 0) Fail("PagedAttention: negative position");
  }
  const Backend& be = (d % 8 == 0 && d <= 512) ? Be() : kGeneric;
  // Work items. A tile is a run of consecutive positions of one sequence (a prefill chunk, a
  // verification step; a decode token alone). Many tiles (prefill, batches): one item per
  // (tile, kv head) folds all its chunks. Few small ones (a single sequence's decode or
  // verification): one item per (tile, chunk, kv head) so every thread gets work, then a merge
  // pass folds each query's stored partials in chunk order (bitwise the same result). Only
  // tiles of a verification's size split: a prefill chunk's partials would be its tokens times
  // more floats, for items that already keep the threads busy.
  constexpr int32_t kMaxSplitTileTokens = 16;
  static thread_local std::vector<std::pair<int32_t, int32_t>> tiles;  // (first token, tokens)
  tiles.clear();
  bool long_context = false, small_tiles = true;
  for (int64_t t = 0; t < T;) {
    int32_t tokens = 1;
    while (tokens < internal::kAttnTile && t + tokens < T && block_tables[t + tokens] == block_tables[t] &&
           positions[t + tokens] == positions[t] + tokens) {
      ++tokens;
    }
    tiles.emplace_back(static_cast<int32_t>(t), tokens);
    long_context = long_context || positions[t + tokens - 1] + 1 > kAttnChunk;
    small_tiles = small_tiles && tokens <= kMaxSplitTileTokens;
    t += tokens;
  }
  const bool split = long_context && small_tiles &&
                     static_cast<int64_t>(tiles.size()) * hkv < 4 * static_cast<int64_t>(pool.num_threads());
  static thread_local std::vector<AttnItem> items;
  static thread_local std::vector<AttnMerge> merges;
  static thread_local std::vector<float> partial_buf;
  items.clear();
  merges.clear();
  int64_t num_partials = 0;
  for (const std::pair<int32_t, int32_t>& tile : tiles) {
    const int32_t t = tile.first, tokens = tile.second;
    const auto chunks_of = [&](int32_t k) { return (positions[t + k] + kAttnChunk) / kAttnChunk; };
    if (!split) {
      for (int32_t h = 0; h < hkv; ++h) items.push_back(AttnItem{t, h, 0, chunks_of(tokens - 1), -1, tokens});
      continue;
    }
    // Chunk-major: a thread's run of items reads every kv head of a block in turn, which the
    // pool stores next to each other (one long stream instead of a slab in every few). Query
    // k's partial of chunk c, head h: num_partials + (c * hkv + h) * tokens + k.
    const int32_t chunks = chunks_of(tokens - 1);
    for (int32_t k = 0; k < tokens; ++k) {
      for (int32_t h = 0; h < hkv; ++h) {
        merges.push_back(AttnMerge{t + k, h, num_partials + static_cast<int64_t>(h) * tokens + k, chunks_of(k),
                                   static_cast<int64_t>(hkv) * tokens});
      }
    }
    for (int32_t c = 0; c < chunks; ++c) {
      for (int32_t h = 0; h < hkv; ++h) {
        items.push_back(AttnItem{t, h, c, c + 1, num_partials + (static_cast<int64_t>(c) * hkv + h) * tokens, tokens});
      }
    }
    num_partials += static_cast<int64_t>(chunks) * hkv * tokens;
  }
  float* partials = split ? Scratch(partial_buf, num_partials * internal::AttnPartialFloats(group, d)) : nullptr;
  const int64_t scratch_n = internal::AttnScratchFloats(group, d);
  AttnArgs args{q, num_q_heads, positions, block_tables, &kv, scale, out,
                items.data(), merges.data(), partials};
  if (kv.dtype == KvDtype::kBF16) RoundQueriesToBf16(pool, q, T * num_q_heads * d, &args);
  if (kv.dtype == KvDtype::kInt8) QuantizeQueriesToInt8(pool, q, T * num_q_heads, d, scale, &args);
  pool.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
    static thread_local std::vector<float> buf;
    be.attention(args, b, e, Scratch(buf, scratch_n));
  });
  if (split) {
    pool.ParallelFor(static_cast<int64_t>(merges.size()), [&](int64_t b, int64_t e) {
      static thread_local std::vector<float> buf;
      be.attention_merge(args, b, e, Scratch(buf, scratch_n));
    });
  }
}

double MeasureFloatGflops(ThreadPool& pool) {
  const Backend& be = Be();
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<int64_t> flops(static_cast<size_t>(pool.num_threads()), 0);
    const auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(pool.num_threads(), [&](int64_t b, int64_t e) {
      // The result only keeps the chains alive; the call through the table is not elided.
      for (int64_t i = b; i < e; ++i) static_cast<void>(be.fma_probe(int64_t{1} << 22, &flops[i]));
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double total = 0;
    for (int64_t f : flops) total += static_cast<double>(f);
    best = std::max(best, total / secs / 1e9);
  }
  return best;
}

}  // namespace specd::kernels::cpu
