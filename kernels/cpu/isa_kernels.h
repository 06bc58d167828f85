// Internal: the per-ISA kernel table behind kernels/cpu/ops.h. Each function does
// one thread's share of the work; ops.cc splits work and owns all scratch memory,
// so the ISA-specific translation units use no standard-library templates (their
// instantiations would be compiled for the wider ISA and might be picked by the
// linker for the generic path).
#ifndef SPECD_KERNELS_CPU_ISA_KERNELS_H_
#define SPECD_KERNELS_CPU_ISA_KERNELS_H_

#include <cmath>
#include <cstdint>

#include "kernels/act_quant.h"
#include "kernels/kernel_types.h"

namespace specd::kernels::cpu::internal {

// Attention splits each (token, kv head) pair's keys into fixed chunks of kAttnChunk
// keys (chunk c = keys [c * kAttnChunk, (c + 1) * kAttnChunk)). Each chunk yields a raw
// partial (unnormalised output o, its score max m and exp-sum l); the pair's output is
// the fold of its partials in chunk order. Chunk bounds depend only on the position,
// so the result is the same however pairs are batched or split over threads.
inline constexpr int32_t kAttnChunk = 64;

// Prefill tiles: up to this many consecutive queries of one sequence share one item, so a
// backend may load (and convert) each key chunk once for all of them. Every query is still
// computed alone, in the same order, so the tile changes no bit of any output.
inline constexpr int32_t kAttnTile = 64;

// One attention work item: chunks [c0, c1) of the pairs (t .. t + tokens - 1, kv head h), a
// tile of consecutive positions of one sequence (tokens == 1: one query). Each query takes
// the chunks it sees (causal).
struct AttnItem {
  int32_t t;
  int32_t h;
  int32_t c0;
  int32_t c1;
  // -1: fold every chunk of each query and write the outputs (c0 == 0, c1 the last query's
  // chunk count); otherwise (c1 == c0 + 1) store query k's raw partial at partials +
  // (partial + k) * AttnPartialFloats(group, d) for a later merge.
  int64_t partial;
  int32_t tokens = 1;
};

// Stored partials first, first + stride, ... (count of them) of the pair (t, h), in chunk
// order.
struct AttnMerge {
  int32_t t;
  int32_t h;
  int64_t first;
  int64_t count;
  int64_t stride = 1;
};

struct AttnArgs {
  const float* q;                      // [T, Hq, d]
  int32_t num_q_heads;
  const int32_t* positions;            // [T]
  const int32_t* const* block_tables;  // [T] -> table
  const PagedKvLayer* kv;
  float scale;
  float* out;                          // [T, Hq, d]
  const AttnItem* items;
  const AttnMerge* merges;
  // [num partials][group][d + 2]: o[group][d], m[group], l[group]
  float* partials;
  // KvDtype::kBF16 (kernels/attn_bf16.h): q above is rounded to bf16, q_bf16 [T, Hq, d] is
  // the same as bf16 bits, and bf16_dot says the CPU has AVX-512 BF16 (the VNNI backend then
  // uses vdpbf16ps; every other path emulates it, with the same bits).
  const uint16_t* q_bf16 = nullptr;
  bool bf16_dot = false;
  // KvDtype::kInt8 (kernels/kv_int8.h): q above holds each row's int8 codes as floats, q_i8
  // [T, Hq, d] the same codes, q_score_scale [T, Hq] each row's qs * scale (Int8Score's qss),
  // q_code_sum [T, Hq] the sum of each row's codes (vpdpbusd takes K as unsigned, code + 128).
  const int8_t* q_i8 = nullptr;
  const float* q_score_scale = nullptr;
  const int32_t* q_code_sum = nullptr;
};

inline int64_t AttnPartialFloats(int32_t group, int32_t head_dim) {
  return static_cast<int64_t>(group) * (head_dim + 2);
}
// Bytes a backend may keep per query row of a tile (a row descriptor).
inline constexpr int32_t kAttnRowBytes = 64;
// Scratch floats one thread needs for attention items: K/V rows of one chunk
// [kAttnChunk][d] and their int8 scales [2][kAttnChunk], scores [kAttnTile][group][kAttnChunk],
// per query of a tile one chunk's partial and its fold state ([kAttnTile] each; a single
// query uses the first), and kAttnRowBytes per query row of a tile, 64-byte aligned.
inline int64_t AttnScratchFloats(int32_t group, int32_t head_dim) {
  return static_cast<int64_t>(kAttnChunk) * (head_dim + 2) +
         static_cast<int64_t>(kAttnTile) * group * kAttnChunk +
         2 * kAttnTile * AttnPartialFloats(group, head_dim) +
         static_cast<int64_t>(kAttnTile) * group * (kAttnRowBytes / 4) + 16 + 64;
}

// Folding the next chunk's partial into state, the part every backend shares: moves the
// pair's max and exp-sum in state to the larger max and returns in ws / wp the factors by
// which group g's output rows are rescaled: o_state = o_state * ws + o_part * wp.
// (static: each ISA's translation unit keeps its own copy, see the comment at the top.)
static inline void AttnFoldScales(const float* part, float* state, int32_t group, int32_t d,
                                  int32_t g, float* ws, float* wp) {
  const int64_t od = static_cast<int64_t>(group) * d;
  const float ms = state[od + g], mp = part[od + g];
  const float mx = ms > mp ? ms : mp;
  // One of the two differences is 0 (and both when the maxes tie): exp(0) is 1 exactly, so
  // the call is skipped for it (a third of the fold's time in a long prefill went to expf).
  const float ds = ms - mx, dp = mp - mx;
  *ws = ds == 0.0f ? 1.0f : std::exp(ds);
  *wp = dp == 0.0f ? 1.0f : std::exp(dp);
  state[od + g] = mx;
  state[od + group + g] = state[od + group + g] * *ws + part[od + group + g] * *wp;
}

// The work-item loops every backend's attention shares, so all split and fold alike; each
// backend passes its own kernels (lambdas local to its translation unit, so every
// instantiation is distinct):
//   chunk(t, h, j0, j1, part)   raw partial of keys [j0, j1) of the pair (t, h) into part
//   fold(first, part, state)    folds the next chunk's partial into state
//   finish(t, h, state)         writes the pair's output rows
template <class ChunkFn, class FoldFn, class FinishFn>
inline void RunAttnItems(const AttnArgs& a, int64_t i0, int64_t i1, float* part, float* state,
                         ChunkFn chunk, FoldFn fold, FinishFn finish) {
  const int64_t pf = AttnPartialFloats(a.num_q_heads / a.kv->num_kv_heads, a.kv->head_dim);
  for (int64_t i = i0; i < i1; ++i) {
    const AttnItem& it = a.items[i];
    for (int32_t t = it.t; t < it.t + it.tokens; ++t) {  // a tile: each query alone
      const int64_t len = static_cast<int64_t>(a.positions[t]) + 1;
      const int32_t c1 = it.tokens > 1 && it.partial < 0
                             ? static_cast<int32_t>((len + kAttnChunk - 1) / kAttnChunk)
                             : it.c1;
      for (int32_t c = it.c0; c < c1; ++c) {
        const int64_t j0 = static_cast<int64_t>(c) * kAttnChunk;
        if (j0 >= len) break;  // a split tile's chunk past this query (causal)
        const int64_t j1 = j0 + kAttnChunk < len ? j0 + kAttnChunk : len;
        if (it.partial >= 0) {
          chunk(t, it.h, j0, j1, a.partials + (it.partial + (t - it.t)) * pf);
        } else {
          chunk(t, it.h, j0, j1, part);
          fold(c == it.c0, part, state);
        }
      }
      if (it.partial < 0) finish(t, it.h, state);
    }
  }
}

template <class FoldFn, class FinishFn>
inline void RunAttnMerges(const AttnArgs& a, int64_t i0, int64_t i1, float* state, FoldFn fold,
                          FinishFn finish) {
  const int64_t pf = AttnPartialFloats(a.num_q_heads / a.kv->num_kv_heads, a.kv->head_dim);
  for (int64_t i = i0; i < i1; ++i) {
    const AttnMerge& mg = a.merges[i];
    for (int64_t c = 0; c < mg.count; ++c) fold(c == 0, a.partials + (mg.first + c * mg.stride) * pf, state);
    finish(mg.t, mg.h, state);
  }
}

// Scratch floats matmul_q needs per thread. The SIMD kernels keep T x nb integer
// activation sums, then decode a group of 8 or 16 weight rows (16: the VNNI backends):
// per 32-value block at most 16 x 8 (AVX2) or 11 x 16 (VNNI) code floats and 2 x 16
// scale floats, 64-byte aligned. The generic path needs T floats.
inline int64_t MatMulScratchFloats(int64_t T, int64_t nb) {
  const int64_t x8 = T * nb + nb * (11 * 16 + 2 * 16) + 16;
  return x8 > T ? x8 : T;
}

struct Backend {
  // Same output as QuantizeActRow (bitwise).
  void (*quantize_act)(const float* x, int64_t n, ActBlockQ8* out);
  // Quantized weights: y[t, n] for t < T and n0 <= n < n1.  act: [T, nb] with
  // nb = cols / 32. scratch: MatMulScratchFloats(T, nb) floats.
  void (*matmul_q)(const WeightMatrix& w, const ActBlockQ8* act, int64_t T, int64_t n0,
                   int64_t n1, float* y, float* scratch);
  // F32 / F16 / BF16 weights: y[t, n] for t < T and n0 <= n < n1.
  void (*matmul_f)(const WeightMatrix& w, const float* x, int64_t T, int64_t n0, int64_t n1,
                   float* y);
  // Rows [t0, t1) of RmsNorm.
  void (*rmsnorm)(const float* x, int64_t D, const float* w, float eps, float* out, int64_t t0,
                  int64_t t1);
  // out[i] = silu(g[i]) * u[i] for i < n.
  void (*swiglu)(const float* g, const float* u, float* out, int64_t n);
  void (*softmax)(float* x, int64_t n);
  // Work items a.items[i0, i1). scratch: AttnScratchFloats(group, d) floats.
  void (*attention)(const AttnArgs& a, int64_t i0, int64_t i1, float* scratch);
  // Merges a.merges[i0, i1): folds each pair's stored partials and writes its output,
  // bitwise as an item covering all its chunks would. scratch: as for attention.
  void (*attention_merge)(const AttnArgs& a, int64_t i0, int64_t i1, float* scratch);
  // dst[i] = f16(src[i]) (round to nearest even).
  void (*to_f16)(const float* src, uint16_t* dst, int64_t n);
  // matmul_q over w.packed (PackWeight's layout: Q4_1, Q4_0, Q8_0): bitwise matmul_q's y, read
  // as a stream of whole 16-row groups; n0 a multiple of kPackRows. nullptr: no packed path
  // (callers use matmul_q on w.data). scratch: as for matmul_q.
  void (*matmul_q_packed)(const WeightMatrix& w, const ActBlockQ8* act, int64_t T, int64_t n0,
                          int64_t n1, float* y, float* scratch);
  // Rows [0, rows) of x ([rows][d]) quantized by kernels/kv_int8.h's QuantizeKvRow (the same
  // codes and scales, bitwise): codes [rows][d], scales [rows]; where not null, code_floats
  // [rows][d] the codes as floats and code_sums [rows] each row's sum of codes. The SIMD
  // backends take d % 8 == 0 only (callers use the generic one otherwise).
  void (*quantize_kv_rows)(const float* x, int64_t rows, int32_t d, int8_t* codes, float* code_floats,
                           int32_t* code_sums, float* scales);
  // Benchmarks only: `iters` rounds of independent float FMA chains at the attention
  // kernels' vector width, the float floor attention is held against. Adds the flops done
  // to *flops; returns a value that depends on every chain (so none is optimised away).
  float (*fma_probe)(int64_t iters, int64_t* flops);
};

// The packed weight layout (cpu::PackWeight). Rows go in groups of kPackRows (the last
// group repeats the matrix's last row); a group's blocks are contiguous, group after group:
// group g, block b at packed + (g * nb + b) * PackLayout::block_bytes, holding code vectors
// of [16 rows][4 bytes] (64 bytes each, lane i = row 16g + i) and then the rows' f16 values:
//   Q4_1, Q4_0 (320 bytes): vectors j < 4 = bytes 4j .. 4j+3 of the row's 16 code bytes (low
//              nibbles = codes 4j.., high nibbles = codes 16+4j..); at 256 the 16 scales d,
//              at 288 the 16 mins m (Q4_1; zero for Q4_0)
//   Q8_0 (576 bytes): vectors j < 8 = int8 codes 4j .. 4j+3; at 512 the 16 scales d, then 32
//              bytes of padding (every block starts on a cache line)
// These are the vectors the unpacked kernels build with Transpose8x16 for every block of
// every step; packed once at load, a step reads them with plain loads.
inline constexpr int32_t kPackRows = 16;
struct PackLayout {
  int64_t block_bytes;  // 0: the type has no packed layout
  int64_t head_bytes;   // in the file's block: bytes before the codes
  int32_t code_vectors;
  int64_t scales_at, mins_at;  // mins_at < 0: none
};
inline PackLayout PackLayoutOf(gguf::GgmlType t) {
  switch (t) {
    case gguf::GgmlType::kQ4_1: return {320, 4, 4, 256, 288};
    case gguf::GgmlType::kQ4_0: return {320, 2, 4, 256, -1};
    case gguf::GgmlType::kQ8_0: return {576, 2, 8, 512, -1};
    default: return {0, 0, 0, 0, -1};
  }
}

const Backend& GenericBackend();
// nullptr when not compiled in. All five are built from ops_avx2.cc (see there).
const Backend* Avx2Backend();
const Backend* Avx512VnniBackend();
const Backend* VnniEmulatedBackend();  // tests: the VNNI code, vpdpbusd emulated in AVX2
const Backend* AvxVnniBackend();
const Backend* AvxVnniEmulatedBackend();  // tests: the AVX-VNNI code, vpdpbusd emulated in AVX2

}  // namespace specd::kernels::cpu::internal

#endif  // SPECD_KERNELS_CPU_ISA_KERNELS_H_
