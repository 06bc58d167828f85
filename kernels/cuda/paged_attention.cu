// CUDA paged attention in the FlashAttention style, the twin of ref::PagedAttention, with the
// arithmetic of kernels/cpu's: 64-key chunks, each a raw partial (o from zero, max m, exp-sum
// l), folded in chunk order (AttnFoldScales' rule); split pairs store one partial per block
// and a merge pass folds them the same way, so a row's bits depend only on its own query,
// position and keys (attention_plan.h). A block stages one chunk of K in shared memory,
// computes the chunk's scores (never a whole [T, keys] matrix), then the same buffer takes V.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <vector>

#include "kernels/attn_bf16.h"
#include "kernels/kv_int8.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ops.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kChunk = kCudaAttnChunk;
static_assert(kChunk == 64, "a row's max and exp-sum take two keys per lane of one warp");

struct AttnDeviceArgs {
  const float* q;  // [T, Hq, d]
  int32_t num_q_heads, group, head_dim;
  const int32_t* positions;      // [T]
  const int32_t* tables;         // every token's block table, concatenated
  const int64_t* table_offset;   // [T]: where token t's table starts in tables
  KvDtype dtype;
  const void* k;
  const void* v;
  const float* k_scale;  // kInt8
  const float* v_scale;
  int32_t block_size, num_kv_heads;
  float scale;
  float* out;       // [T, Hq, d]
  float* partials;  // [num partials][group][d + 2]
  // Device [items, merges] of the step when the grids are a recording's capacity (a CUDA
  // graph replays one launch size for every step of its shape); null: the grids are exact.
  const int64_t* counts;
};

__device__ __forceinline__ float KvElement(KvDtype dt, const void* base, int64_t index, const float* scales,
                                           int64_t sindex) {
  switch (dt) {
    case KvDtype::kF32: return static_cast<const float*>(base)[index];
    case KvDtype::kF16: return HalfBitsToF32(static_cast<const uint16_t*>(base)[index]);
    case KvDtype::kBF16: return Bf16BitsToF32(static_cast<const uint16_t*>(base)[index]);
    case KvDtype::kInt8: return __fmul_rn(static_cast<float>(static_cast<const int8_t*>(base)[index]), scales[sindex]);
  }
  return 0.0f;
}

__device__ __forceinline__ int64_t SlotOf(const AttnDeviceArgs& a, const int32_t* table, int64_t pos) {
  return static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
}

// Keys [j0, j0 + n) of kv head h into kv [kChunk][d + 1] as f32 (rows past n: 0). K is read
// along keys (the pool keeps it transposed inside each block), V along dims (token rows).
// int8 K (kernels/kv_int8.h): the codes, with each key's scale in its row's last column.
__device__ void StageChunk(const AttnDeviceArgs& a, bool is_k, const int32_t* table, int64_t j0, int32_t n,
                           int32_t h, float* kv) {
  const int32_t d = a.head_dim, dp = d + 1, bs = a.block_size, hkv = a.num_kv_heads;
  for (int idx = threadIdx.x; idx < kChunk * d; idx += blockDim.x) {
    const int i = is_k ? idx / kChunk : idx % d, j = is_k ? idx % kChunk : idx / d;
    float val = 0.0f;
    if (j < n) {
      const int64_t slot = SlotOf(a, table, j0 + j), blk = slot / bs, off = slot % bs;
      const int64_t row = (blk * hkv + h) * bs + off;  // the token's (block, head) row: V and scales
      if (is_k && a.dtype == KvDtype::kInt8) {
        val = static_cast<float>(static_cast<const int8_t*>(a.k)[((blk * hkv + h) * d + i) * bs + off]);
        if (i == 0) kv[j * dp + d] = a.k_scale[row];
      } else {
        val = is_k ? KvElement(a.dtype, a.k, ((blk * hkv + h) * d + i) * bs + off, a.k_scale, row)
                   : KvElement(a.dtype, a.v, row * d + i, a.v_scale, row);
      }
    } else if (is_k && i == 0) {
      kv[j * dp + d] = 0.0f;
    }
    kv[j * dp + i] = val;
  }
}

// Folds a chunk partial (o, mc, lc) into the state (st, ms, ls) of `group` rows by the CPU's
// rule (AttnFoldScales + AttnFold: both scaled to the larger max, then added). Not bitwise
// the CPU's result (expf, and the chunk sums' order, differ); bitwise the same wherever the
// plan splits, since the merge runs this same function on the same partials.
// ws, wp: [group] scratch. All threads of the block call it.
__device__ void FoldPartial(bool first, const float* o, const float* mc, const float* lc, float* st, float* ms,
                            float* ls, float* ws, float* wp, int32_t group, int32_t d) {
  const int tid = threadIdx.x, nt = blockDim.x;
  if (first) {
    for (int idx = tid; idx < group * d; idx += nt) st[idx] = o[idx];
    if (tid < group) {
      ms[tid] = mc[tid];
      ls[tid] = lc[tid];
    }
    __syncthreads();
    return;
  }
  if (tid < group) {
    const float mx = ms[tid] > mc[tid] ? ms[tid] : mc[tid];
    ws[tid] = expf(ms[tid] - mx);
    wp[tid] = expf(mc[tid] - mx);
    ms[tid] = mx;
    ls[tid] = __fadd_rn(__fmul_rn(ls[tid], ws[tid]), __fmul_rn(lc[tid], wp[tid]));
  }
  __syncthreads();
  for (int idx = tid; idx < group * d; idx += nt) {
    const int g = idx / d;
    st[idx] = __fmaf_rn(st[idx], ws[g], __fmul_rn(o[idx], wp[g]));
  }
  __syncthreads();
}

// Output rows of the pair = state / l.
__device__ void WriteRows(const AttnDeviceArgs& a, int32_t t, int32_t h, const float* st, const float* ls) {
  const int32_t d = a.head_dim, G = a.group;
  float* dst = a.out + (static_cast<int64_t>(t) * a.num_q_heads + static_cast<int64_t>(h) * G) * d;
  for (int idx = threadIdx.x; idx < G * d; idx += blockDim.x) {
    dst[idx] = __fmul_rn(st[idx], __fdiv_rn(1.0f, ls[idx / d]));
  }
}

// One block per plan item: the `group` query heads of (it.t, kv head it.h) over chunks
// [it.c0, it.c1). Shared memory: CudaAttnSharedBytes(group, d).
__global__ void __launch_bounds__(kThreads) PagedAttentionKernel(AttnDeviceArgs a, const CudaAttnItem* items) {
  extern __shared__ float sm[];
  if (a.counts != nullptr && blockIdx.x >= a.counts[0]) return;  // past this step's items
  const CudaAttnItem it = items[blockIdx.x];
  const int32_t d = a.head_dim, G = a.group, dp = d + 1;
  float* q = sm;                 // [G][d]
  float* kv = q + G * d;         // [kChunk][d + 1]: K, then V
  float* s = kv + kChunk * dp;   // [G][kChunk]: scores, then p
  float* o = s + G * kChunk;     // [G][d]: the chunk's partial
  float* st = o + G * d;         // [G][d]: the fold state
  float* mc = st + G * d;        // [G] each: chunk max and sum, state max and sum, fold scales,
                                 // int8's qss
  float *lc = mc + G, *ms = mc + 2 * G, *ls = mc + 3 * G, *ws = mc + 4 * G, *wp = mc + 5 * G;
  float* qss = mc + 6 * G;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = nt >> 5;
  const bool bf16 = a.dtype == KvDtype::kBF16;  // bf16 attention: q and p rounded (attn_bf16.h)
  const bool int8 = a.dtype == KvDtype::kInt8;  // int8 KV: scores from q's codes (kv_int8.h)
  const float* qsrc = a.q + (static_cast<int64_t>(it.t) * a.num_q_heads + static_cast<int64_t>(it.h) * G) * d;
  for (int idx = tid; idx < G * d; idx += nt) q[idx] = bf16 ? RoundBf16Attn(qsrc[idx]) : qsrc[idx];
  if (int8) {  // each row's codes in place (QuantizeKvRow's arithmetic), and its qs * scale
    __syncthreads();
    for (int g = tid; g < G; g += nt) {
      float amax = 0.0f;
      for (int i = 0; i < d; ++i) amax = fmaxf(amax, fabsf(q[g * d + i]));
      const float inv = KvInverseScale(amax);
      for (int i = 0; i < d; ++i) q[g * d + i] = KvCode(q[g * d + i], inv);
      qss[g] = __fmul_rn(__fdiv_rn(amax, 127.0f), a.scale);
    }
  }
  const int64_t len = static_cast<int64_t>(a.positions[it.t]) + 1;
  const int32_t* table = a.tables + a.table_offset[it.t];
  for (int32_t c = it.c0; c < it.c1; ++c) {
    const int64_t j0 = static_cast<int64_t>(c) * kChunk;
    const int32_t n = static_cast<int32_t>(len - j0 < kChunk ? len - j0 : kChunk);
    __syncthreads();  // the previous chunk is folded: kv and s are free
    StageChunk(a, /*is_k=*/true, table, j0, n, it.h, kv);
    __syncthreads();
    // Scores: one thread per (row, key), one chain over the dims in order.
    for (int idx = tid; idx < G * kChunk; idx += nt) {
      const int g = idx / kChunk, j = idx % kChunk;
      float acc = -INFINITY;
      if (j < n) {
        acc = 0.0f;
        for (int i = 0; i < d; ++i) acc = __fmaf_rn(q[g * d + i], kv[j * dp + i], acc);
        // int8: the sum of codes is exact; Int8Score scales it.
        acc = int8 ? Int8Score(acc, kv[j * dp + d], qss[g]) : __fmul_rn(acc, a.scale);
      }
      s[idx] = acc;
    }
    __syncthreads();
    // Each row's max and exp-sum: one warp per row, keys lane and lane + 32.
    for (int g = warp; g < G; g += nwarps) {
      float* sr = s + g * kChunk;
      float m = fmaxf(sr[lane], sr[lane + 32]);
      for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const float e0 = lane < n ? expf(sr[lane] - m) : 0.0f;
      const float e1 = lane + 32 < n ? expf(sr[lane + 32] - m) : 0.0f;
      float sum = __fadd_rn(e0, e1);
      for (int off = 16; off > 0; off >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, off));
      sr[lane] = bf16 ? RoundBf16Attn(e0) : e0;
      sr[lane + 32] = bf16 ? RoundBf16Attn(e1) : e1;
      if (lane == 0) {
        mc[g] = m;
        lc[g] = sum;
      }
    }
    __syncthreads();
    StageChunk(a, /*is_k=*/false, table, j0, n, it.h, kv);
    __syncthreads();
    // p V: one thread per (row, column), one chain over the keys in order.
    for (int idx = tid; idx < G * d; idx += nt) {
      const int g = idx / d, i = idx % d;
      float acc = 0.0f;
      for (int j = 0; j < n; ++j) acc = __fmaf_rn(s[g * kChunk + j], kv[j * dp + i], acc);
      o[idx] = acc;
    }
    __syncthreads();
    FoldPartial(c == it.c0, o, mc, lc, st, ms, ls, ws, wp, G, d);
  }
  if (it.partial < 0) {
    WriteRows(a, it.t, it.h, st, ls);
    return;
  }
  float* p = a.partials + it.partial * static_cast<int64_t>(G) * (d + 2);
  for (int idx = tid; idx < G * d; idx += nt) p[idx] = st[idx];
  if (tid < G) {
    p[G * d + tid] = ms[tid];
    p[G * d + G + tid] = ls[tid];
  }
}

// One block per merge: folds the pair's stored chunk partials in order, then writes its rows.
// Shared memory: [G][d] state and partial, 6 floats per row.
__global__ void __launch_bounds__(kThreads) AttentionMergeKernel(AttnDeviceArgs a, const CudaAttnMerge* merges) {
  extern __shared__ float sm[];
  if (a.counts != nullptr && blockIdx.x >= a.counts[1]) return;  // past this step's merges
  const CudaAttnMerge mg = merges[blockIdx.x];
  const int32_t d = a.head_dim, G = a.group;
  float* st = sm;
  float* o = st + G * d;
  float* mc = o + G * d;
  float *lc = mc + G, *ms = mc + 2 * G, *ls = mc + 3 * G, *ws = mc + 4 * G, *wp = mc + 5 * G;
  for (int32_t k = 0; k < mg.count; ++k) {
    const float* p = a.partials + (mg.first + k) * static_cast<int64_t>(G) * (d + 2);
    for (int idx = threadIdx.x; idx < G * d; idx += blockDim.x) o[idx] = p[idx];
    if (threadIdx.x < G) {
      mc[threadIdx.x] = p[G * d + threadIdx.x];
      lc[threadIdx.x] = p[G * d + G + threadIdx.x];
    }
    __syncthreads();
    FoldPartial(k == 0, o, mc, lc, st, ms, ls, ws, wp, G, d);
  }
  WriteRows(a, mg.t, mg.h, st, ls);
}

}  // namespace

namespace {

// The largest dynamic shared memory each attention kernel has been allowed so far: the
// attribute is set once per size class rather than before every launch (every layer).
std::atomic<size_t> g_attention_smem{0}, g_merge_smem{0};

template <class Kernel>
absl::Status AllowSharedMemory(Kernel kernel, size_t bytes, std::atomic<size_t>* allowed) {
  if (bytes <= allowed->load(std::memory_order_relaxed)) return absl::OkStatus();
  absl::Status st = CudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(bytes)), "shared memory attribute");
  if (st.ok()) allowed->store(bytes, std::memory_order_relaxed);
  return st;
}

}  // namespace

absl::Status LaunchPagedAttention(const float* q, int32_t num_q_heads, const PagedKvLayer& kv, float scale,
                                  float* out, const DeviceAttentionPlan& plan, void* stream) {
  // Exact grids, or a recording's capacities with the step's counts read on the device.
  const bool counted = plan.counts != nullptr;
  const int64_t item_grid = counted ? plan.item_grid : plan.num_items;
  const int64_t merge_grid = counted ? plan.merge_grid : plan.num_merges;
  if (counted && (item_grid < plan.num_items || merge_grid < plan.num_merges)) {
    return absl::InternalError("LaunchPagedAttention: the step's counts exceed the recorded grids");
  }
  if (item_grid == 0) return absl::OkStatus();
  const int32_t hkv = kv.num_kv_heads, d = kv.head_dim, group = num_q_heads / hkv;
  const AttnDeviceArgs args{q,        num_q_heads, group, d,          plan.positions, plan.tables,
                            plan.table_offsets, kv.dtype, kv.k, kv.v, kv.k_scale,  kv.v_scale,
                            kv.block_size, hkv, scale, out, plan.partials, plan.counts};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t smem = CudaAttnSharedBytes(group, d);
  if (absl::Status e = AllowSharedMemory(PagedAttentionKernel, smem, &g_attention_smem); !e.ok()) return e;
  PagedAttentionKernel<<<static_cast<unsigned>(item_grid), kThreads, smem, s>>>(args, plan.items);
  if (absl::Status e = CudaCheck(cudaGetLastError(), "PagedAttentionKernel"); !e.ok()) return e;
  if (merge_grid == 0) return absl::OkStatus();
  const size_t merge_smem = sizeof(float) * static_cast<size_t>(2 * group * d + 6 * group);
  if (absl::Status e = AllowSharedMemory(AttentionMergeKernel, merge_smem, &g_merge_smem); !e.ok()) return e;
  AttentionMergeKernel<<<static_cast<unsigned>(merge_grid), kThreads, merge_smem, s>>>(args, plan.merges);
  return CudaCheck(cudaGetLastError(), "AttentionMergeKernel");
}

absl::Status PagedAttentionHost(const float* q, int64_t T, int32_t num_q_heads, const int32_t* positions,
                                const int32_t* const* block_tables, const PagedKvLayer& kv, float scale,
                                float* out, int64_t fill_blocks) {
  const int32_t hkv = kv.num_kv_heads, d = kv.head_dim;
  if (hkv <= 0 || num_q_heads <= 0 || num_q_heads % hkv != 0) {
    return absl::InvalidArgumentError("PagedAttentionHost: Hq % Hkv != 0");
  }
  if (kv.block_size <= 0) return absl::InvalidArgumentError("PagedAttentionHost: block_size must be positive");
  if (kv.dtype == KvDtype::kInt8 && (kv.k_scale == nullptr || kv.v_scale == nullptr)) {
    return absl::InvalidArgumentError("PagedAttentionHost: an int8 pool needs k_scale and v_scale");
  }
  if (d <= 0 || d > 256) return absl::InvalidArgumentError("PagedAttentionHost: head_dim must be in [1, 256]");
  const int32_t group = num_q_heads / hkv;
  if (group > 32) return absl::InvalidArgumentError("PagedAttentionHost: more than 32 query heads per kv head");
  for (int64_t t = 0; t < T; ++t) {
    if (positions[t] < 0) return absl::InvalidArgumentError("PagedAttentionHost: negative position");
  }
  if (T == 0) return absl::OkStatus();
  // Plan on the host: the items, and every token's block table once in one flat array.
  CudaAttentionPlanOptions po;
  if (fill_blocks > 0) po.fill_blocks = fill_blocks;
  const CudaAttentionPlan plan = PlanCudaAttention(positions, T, hkv, po);
  std::map<const int32_t*, int64_t> blocks_needed;
  for (int64_t t = 0; t < T; ++t) {
    int64_t& need = blocks_needed[block_tables[t]];
    need = std::max<int64_t>(need, positions[t] / kv.block_size + 1);
  }
  std::vector<int32_t> tables;
  std::map<const int32_t*, int64_t> start;
  for (const auto& [table, need] : blocks_needed) {
    start[table] = static_cast<int64_t>(tables.size());
    tables.insert(tables.end(), table, table + need);
  }
  std::vector<int64_t> offsets(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) offsets[t] = start[block_tables[t]];

  const int64_t slots = kv.num_blocks * kv.block_size;
  const size_t pool_bytes = static_cast<size_t>(slots * hkv * d * KvDtypeSize(kv.dtype));
  const size_t scales = kv.dtype == KvDtype::kInt8 ? static_cast<size_t>(slots * hkv) : 0;
  const size_t rows = static_cast<size_t>(T * num_q_heads * d);
  DeviceArray<float> dq, dout, dpart, dks, dvs;
  DeviceArray<int32_t> dpos, dtables;
  DeviceArray<int64_t> doff;
  DeviceArray<uint8_t> dk, dv;
  DeviceArray<CudaAttnItem> ditems;
  DeviceArray<CudaAttnMerge> dmerges;
  absl::Status st = dq.Upload(q, rows);
  if (st.ok()) st.Update(dout.Alloc(rows));
  if (st.ok()) st.Update(dpart.Alloc(static_cast<size_t>(plan.num_partials * CudaAttnPartialFloats(group, d))));
  if (st.ok()) st.Update(dpos.Upload(positions, static_cast<size_t>(T)));
  if (st.ok()) st.Update(dtables.Upload(tables.data(), tables.size()));
  if (st.ok()) st.Update(doff.Upload(offsets.data(), offsets.size()));
  if (st.ok()) st.Update(dk.Upload(static_cast<const uint8_t*>(kv.k), pool_bytes));
  if (st.ok()) st.Update(dv.Upload(static_cast<const uint8_t*>(kv.v), pool_bytes));
  if (st.ok() && scales > 0) st.Update(dks.Upload(kv.k_scale, scales));
  if (st.ok() && scales > 0) st.Update(dvs.Upload(kv.v_scale, scales));
  if (st.ok()) st.Update(ditems.Upload(plan.items.data(), plan.items.size()));
  if (st.ok()) st.Update(dmerges.Upload(plan.merges.data(), plan.merges.size()));
  if (!st.ok()) return st;

  PagedKvLayer on_device = kv;
  on_device.k = dk.get();
  on_device.v = dv.get();
  on_device.k_scale = dks.get();
  on_device.v_scale = dvs.get();
  DeviceAttentionPlan dplan;
  dplan.T = T;
  dplan.positions = dpos.get();
  dplan.tables = dtables.get();
  dplan.table_offsets = doff.get();
  dplan.items = ditems.get();
  dplan.num_items = static_cast<int64_t>(plan.items.size());
  dplan.merges = dmerges.get();
  dplan.num_merges = static_cast<int64_t>(plan.merges.size());
  dplan.partials = dpart.get();
  st.Update(LaunchPagedAttention(dq.get(), num_q_heads, on_device, scale, dout.get(), dplan, nullptr));
  if (st.ok()) st.Update(LaunchStatus("PagedAttention"));
  if (!st.ok()) return st;
  return dout.Download(out, rows);
}

}  // namespace specd::kernels::cuda
