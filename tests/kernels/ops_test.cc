// Op-vs-reference harness for the compute kernels.
//
// 1. The reference ops (kernels/ref) are checked against obvious math: double-precision
//    loops, dequantize-then-dot, dense softmax(QK^T)V, rotation invariants, the
//    Llama-3 frequency formula, and the GGUF component's independent dequantizer.
// 2. Every backend in Backends() (today: the CPU kernels on each ISA path and thread
//    count; a CUDA backend can be added by implementing OpsBackend) is run against
//    the reference on awkward shapes, with a NaN/Inf check on every output.
// 3. Batch invariance (bitwise) of MatMul on every weight type and of PagedAttention, and
//    attention bitwise across the SIMD paths (its arithmetic is vector-width independent).
//
// Error budgets (|fast - ref| per output element):
//   MatMul F32/F16/BF16:         1e-5 * sum_k |w_k x_k| + 1e-30   (summation order only)
//   MatMul quantized:            1e-5 * sum_k |w_k x_k| + 1e-30   (same int8 math; the
//                                fast path sums 8 lanes before the float reduction)
//   ref int8 MatMul vs dequantized float dot: sum_b (d_b / 2) * sum_{k in b} |w_k|
//                                (activation rounding) + 1e-5 * sum |w_k x_k|
//   RmsNorm:                     1e-5 * |ref| + 1e-6
//   Rope:                        1e-6 * |x| (identical math; cpu is bitwise today)
//   SwiGlu:                      2e-6 * |ref| + 1e-7 (vector exp, rel. error ~1e-7)
//   Softmax:                     2e-6 * |ref| + 1e-9
//   Add / AddBias / Embedding:   exact
//   WriteKv:                     exact (same rounding: nearest even)
//   PagedAttention:              2e-5 * max|v| (exp and summation order); bf16 KV: 2^-8 * max|v|
//                                (kernels/attn_bf16.h: the kernels round each p to bf16,
//                                relative error <= 2^-9; the reference keeps it exact); int8
//                                KV: 2^-7 * max|v| (kernels/kv_int8.h: each weight p * V's
//                                scale as an 8-bit code of its chunk row's largest)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "common/gguf/quants.h"
#include "gtest/gtest.h"
#include "kernels/act_quant.h"
#include "kernels/attn_bf16.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_types.h"
#include "kernels/kv_int8.h"
#include "kernels/ref/ops.h"
#include "tests/kernels/kv_pool.h"

namespace specd::kernels {
namespace {

using gguf::GgmlType;

// ------------------------------------------------------------------ backends

// One implementation of the ops under test (same signatures as kernels/ref).
class OpsBackend {
 public:
  virtual ~OpsBackend() = default;
  virtual std::string Name() const = 0;
  virtual void MatMul(const WeightMatrix& w, const float* x, int64_t T, float* y) = 0;
  virtual void RmsNorm(const float* x, int64_t T, int64_t D, const float* w, float eps,
                       float* out) = 0;
  virtual void Rope(float* x, int64_t T, int32_t H, int32_t d, const int32_t* pos,
                    const RopeParams& p) = 0;
  virtual void SwiGlu(const float* g, const float* u, int64_t T, int64_t F, float* out) = 0;
  virtual void Softmax(float* x, int64_t n) = 0;
  virtual void AddInPlace(float* x, const float* y, int64_t n) = 0;
  virtual void AddBias(float* x, int64_t T, int64_t N, const float* b) = 0;
  virtual void EmbeddingLookup(const WeightMatrix& t, const int32_t* ids, int64_t T,
                               float* out) = 0;
  virtual void WriteKv(const float* k, const float* v, int64_t T, const int64_t* slots,
                       const PagedKvLayer& kv) = 0;
  virtual void PagedAttention(const float* q, int64_t T, int32_t Hq, const int32_t* pos,
                              const int32_t* const* bt, const PagedKvLayer& kv, float scale,
                              float* out) = 0;
};

class CpuBackend : public OpsBackend {
 public:
  CpuBackend(cpu::Isa isa, int threads) : isa_(isa), pool_(threads) {}
  cpu::Isa isa() const { return isa_; }
  std::string Name() const override {
    return std::string("cpu_") + cpu::IsaName(isa_) + "_t" + std::to_string(pool_.num_threads());
  }
  void MatMul(const WeightMatrix& w, const float* x, int64_t T, float* y) override {
    Use();
    cpu::MatMul(pool_, w, x, T, y);
  }
  void RmsNorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* out) override {
    Use();
    cpu::RmsNorm(pool_, x, T, D, w, eps, out);
  }
  void Rope(float* x, int64_t T, int32_t H, int32_t d, const int32_t* pos, const RopeParams& p) override {
    Use();
    cpu::Rope(pool_, x, T, H, d, pos, p);
  }
  void SwiGlu(const float* g, const float* u, int64_t T, int64_t F, float* out) override {
    Use();
    cpu::SwiGlu(pool_, g, u, T, F, out);
  }
  void Softmax(float* x, int64_t n) override {
    Use();
    cpu::Softmax(pool_, x, n);
  }
  void AddInPlace(float* x, const float* y, int64_t n) override {
    Use();
    cpu::AddInPlace(pool_, x, y, n);
  }
  void AddBias(float* x, int64_t T, int64_t N, const float* b) override {
    Use();
    cpu::AddBias(pool_, x, T, N, b);
  }
  void EmbeddingLookup(const WeightMatrix& t, const int32_t* ids, int64_t T, float* out) override {
    Use();
    cpu::EmbeddingLookup(pool_, t, ids, T, out);
  }
  void WriteKv(const float* k, const float* v, int64_t T, const int64_t* slots,
               const PagedKvLayer& kv) override {
    Use();
    cpu::WriteKv(pool_, k, v, T, slots, kv);
  }
  void PagedAttention(const float* q, int64_t T, int32_t Hq, const int32_t* pos,
                      const int32_t* const* bt, const PagedKvLayer& kv, float scale,
                      float* out) override {
    Use();
    cpu::PagedAttention(pool_, q, T, Hq, pos, bt, kv, scale, out);
  }

 private:
  void Use() { cpu::SetIsa(isa_); }
  cpu::Isa isa_;
  cpu::ThreadPool pool_;
};

// The SIMD paths compared bitwise against AVX2: the int8 dot's other forms (vpdpbusd at 512
// and at 256 bits), native and emulated.
constexpr cpu::Isa kIsasBesideAvx2[] = {cpu::Isa::kAvx512Vnni, cpu::Isa::kVnniEmulated,
                                        cpu::Isa::kAvxVnni, cpu::Isa::kAvxVnniEmulated};

// All backends under test. Add e.g. a CUDA backend here (copying inputs to the device).
std::vector<std::unique_ptr<OpsBackend>>& Backends() {
  static auto* list = [] {
    auto* v = new std::vector<std::unique_ptr<OpsBackend>>();
    for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512Vnni, cpu::Isa::kAvxVnni}) {
      if (cpu::IsaSupported(isa)) {
        v->push_back(std::make_unique<CpuBackend>(isa, 1));
        v->push_back(std::make_unique<CpuBackend>(isa, 3));
      } else {
        std::printf("NOT RUN: backend %s (this CPU lacks it)\n", cpu::IsaName(isa));
      }
    }
    // The VNNI and AVX-VNNI code on any AVX2 CPU (vpdpbusd emulated): slower, so one thread
    // count each.
    for (cpu::Isa isa : {cpu::Isa::kVnniEmulated, cpu::Isa::kAvxVnniEmulated}) {
      if (cpu::IsaSupported(isa)) v->push_back(std::make_unique<CpuBackend>(isa, 3));
    }
    v->push_back(std::make_unique<CpuBackend>(cpu::Isa::kGeneric, 2));
    return v;
  }();
  return *list;
}

// ------------------------------------------------------------------ helpers

std::vector<float> RandVec(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

void Put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

struct TypeInfo {
  GgmlType type;
  const char* name;
  int64_t block;  // values per block
  int64_t bytes;  // bytes per block
};

const std::vector<TypeInfo>& AllTypes() {
  static const std::vector<TypeInfo> v = {
      {GgmlType::kF32, "F32", 1, 4},       {GgmlType::kF16, "F16", 1, 2},
      {GgmlType::kBF16, "BF16", 1, 2},     {GgmlType::kQ8_0, "Q8_0", 32, 34},
      {GgmlType::kQ4_0, "Q4_0", 32, 18},   {GgmlType::kQ4_1, "Q4_1", 32, 20},
      {GgmlType::kQ4_K, "Q4_K", 256, 144}, {GgmlType::kQ6_K, "Q6_K", 256, 210},
  };
  return v;
}

// Random weights in the stored format. Quantized blocks get random codes (every
// bit pattern, including Q8_0's -128) and random, realistic scales.
struct Weights {
  std::vector<uint8_t> bytes;
  WeightMatrix m;
};

Weights RandWeights(std::mt19937& rng, const TypeInfo& ti, int64_t rows, int64_t cols) {
  Weights w;
  const uint64_t row_bytes = static_cast<uint64_t>(cols / ti.block * ti.bytes);
  w.bytes.resize(row_bytes * rows + 64);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> uf(-1.0f, 1.0f), scale(0.002f, 0.02f);
  for (auto& b : w.bytes) b = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + r * row_bytes;
    for (int64_t b = 0; b < cols / ti.block; ++b) {
      uint8_t* blk = row + b * ti.bytes;
      switch (ti.type) {
        case GgmlType::kF32: {
          const float f = uf(rng);
          std::memcpy(blk, &f, 4);
          break;
        }
        case GgmlType::kF16: Put16(blk, ref::F32ToF16(uf(rng))); break;
        case GgmlType::kBF16: Put16(blk, ref::F32ToBF16(uf(rng))); break;
        case GgmlType::kQ8_0:
        case GgmlType::kQ4_0: Put16(blk, ref::F32ToF16(scale(rng))); break;
        case GgmlType::kQ4_1:
          Put16(blk, ref::F32ToF16(scale(rng)));
          Put16(blk + 2, ref::F32ToF16(-8.0f * scale(rng)));
          break;
        case GgmlType::kQ4_K:
          Put16(blk, ref::F32ToF16(scale(rng) / 16));
          Put16(blk + 2, ref::F32ToF16(scale(rng) / 8));
          break;
        case GgmlType::kQ6_K: Put16(blk + 208, ref::F32ToF16(scale(rng) / 16)); break;
        default: break;
      }
    }
  }
  w.m = WeightMatrix{ti.type, w.bytes.data(), rows, cols, row_bytes};
  return w;
}

std::vector<float> DequantAll(const WeightMatrix& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    EXPECT_TRUE(ref::DequantizeRow(w.type, w.data + r * w.row_bytes, w.cols, out.data() + r * w.cols));
  }
  return out;
}

bool AllFinite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// Cols to sweep for a type: not multiples of 256 where the block size allows.
std::vector<int64_t> ColsFor(const TypeInfo& ti) {
  if (ti.block == 256) return {256, 768};
  if (ti.block == 32) return {32, 96, 576, 608};
  return {1, 7, 33, 100, 576};
}

// ------------------------------------------------------------------ reference checks

TEST(RefOps, F16AndBF16ConversionsMatchGguf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = ref::F16ToF32(static_cast<uint16_t>(h));
    const float b = gguf::F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(a)) {
      ASSERT_TRUE(std::isnan(b)) << h;
      continue;
    }
    ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << h;
    ASSERT_EQ(ref::F32ToF16(a), h) << h;  // round trip
    ASSERT_EQ(ref::BF16ToF32(static_cast<uint16_t>(h)), gguf::BF16ToF32(static_cast<uint16_t>(h)));
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(ref::F32ToF16(f), gguf::F32ToF16(f)) << f;
    ASSERT_EQ(ref::F32ToBF16(f), gguf::F32ToBF16(f)) << f;
  }
}

TEST(RefOps, DequantizeMatchesGgufComponent) {
  std::mt19937 rng(2);
  for (const TypeInfo& ti : AllTypes()) {
    const int64_t cols = ti.block == 256 ? 512 : 96;
    Weights w = RandWeights(rng, ti, 3, cols);
    std::vector<float> a(cols), b(cols);
    for (int64_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(ref::DequantizeRow(ti.type, w.m.data + r * w.m.row_bytes, cols, a.data()));
      ASSERT_TRUE(gguf::DequantizeRow(ti.type, w.m.data + r * w.m.row_bytes, b.data(), cols).ok());
      for (int64_t k = 0; k < cols; ++k) {
        ASSERT_NEAR(a[k], b[k], 1e-6f * std::fabs(b[k]) + 1e-30f) << ti.name << " k=" << k;
      }
    }
  }
}

TEST(RefOps, ActQuantFormat) {
  std::mt19937 rng(3);
  std::vector<float> x = RandVec(rng, 96, -3.0f, 3.0f);
  for (int i = 32; i < 64; ++i) x[i] = 0.0f;  // an all-zero block
  ActBlockQ8 blk[3];
  QuantizeActRow(x.data(), 96, blk);
  EXPECT_EQ(blk[1].d, 0.0f);
  EXPECT_EQ(blk[1].s, 0.0f);
  for (int b : {0, 2}) {
    int amax_code = 0, sum = 0;
    for (int i = 0; i < 32; ++i) {
      EXPECT_LE(std::fabs(blk[b].qs[i] * blk[b].d - x[b * 32 + i]), blk[b].d * 0.5f + 1e-6f);
      amax_code = std::max(amax_code, std::abs(static_cast<int>(blk[b].qs[i])));
      sum += blk[b].qs[i];
    }
    EXPECT_EQ(amax_code, 127);
    EXPECT_EQ(blk[b].s, blk[b].d * static_cast<float>(sum));
  }
}

TEST(RefOps, MatMulF32MatchesDouble) {
  std::mt19937 rng(4);
  const int64_t rows = 13, cols = 77, T = 5;
  Weights w = RandWeights(rng, AllTypes()[0], rows, cols);
  std::vector<float> x = RandVec(rng, T * cols), y(T * rows);
  ref::MatMul(w.m, x.data(), T, y.data());
  const float* wf = reinterpret_cast<const float*>(w.m.data);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < rows; ++n) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < cols; ++k) {
        acc += static_cast<double>(wf[n * cols + k]) * x[t * cols + k];
        mag += std::fabs(static_cast<double>(wf[n * cols + k]) * x[t * cols + k]);
      }
      EXPECT_NEAR(y[t * rows + n], acc, 1e-6 * mag);
    }
  }
}

TEST(RefOps, QuantizedMatMulWithinActivationRoundingOfFloatDot) {
  std::mt19937 rng(5);
  for (const TypeInfo& ti : AllTypes()) {
    if (ti.block == 1) continue;
    const int64_t rows = 9, cols = ti.block == 256 ? 512 : 160, T = 3;
    Weights w = RandWeights(rng, ti, rows, cols);
    std::vector<float> wf = DequantAll(w.m);
    std::vector<float> x = RandVec(rng, T * cols, -2.0f, 2.0f), y(T * rows);
    ref::MatMul(w.m, x.data(), T, y.data());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<ActBlockQ8> act(cols / 32);
      QuantizeActRow(x.data() + t * cols, cols, act.data());
      for (int64_t n = 0; n < rows; ++n) {
        double dot = 0, mag = 0, bound = 0;
        for (int64_t k = 0; k < cols; ++k) {
          const double wk = wf[n * cols + k];
          dot += wk * x[t * cols + k];
          mag += std::fabs(wk * x[t * cols + k]);
          bound += std::fabs(wk) * act[k / 32].d * 0.5;
        }
        EXPECT_NEAR(y[t * rows + n], dot, bound * 1.001 + 1e-5 * mag) << ti.name;
      }
    }
  }
}

// The pool layout the attention kernels rely on: [block][kv head][offset][dim] for V, so
// one head's values of a block are contiguous, and each (block, head) slab of K transposed
// to [dim][offset], so one dim of a block's keys is contiguous.
TEST(RefOps, WriteKvLaysBlocksOutHeadMajor) {
  std::mt19937 rng(5);
  const int32_t hkv = 3, d = 8, bs = 4;
  const int64_t nblk = 3, T = 5;
  std::vector<float> k = RandVec(rng, T * hkv * d), v = RandVec(rng, T * hkv * d);
  std::vector<float> kp(nblk * hkv * bs * d, 0.0f), vp(kp.size(), 0.0f);
  PagedKvLayer kv{KvDtype::kF32, kp.data(), vp.data(), nblk, bs, hkv, d};
  const std::vector<int64_t> slots = {0, 3, 4, 9, 11};  // blocks 0, 0, 1, 2, 2
  ref::WriteKv(k.data(), v.data(), T, slots.data(), kv);
  int64_t written = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t block = slots[t] / bs, offset = slots[t] % bs;
    for (int32_t h = 0; h < hkv; ++h) {
      const int64_t at = ((block * hkv + h) * bs + offset) * d;
      EXPECT_EQ(kv.VIndex(slots[t], h), at);
      for (int32_t i = 0; i < d; ++i) {
        const int64_t kat = ((block * hkv + h) * d + i) * bs + offset;
        EXPECT_EQ(kv.KIndex(slots[t], h, i), kat);
        ASSERT_EQ(kp[kat], k[(t * hkv + h) * d + i]) << "t " << t << " h " << h << " i " << i;
        ASSERT_EQ(vp[at + i], v[(t * hkv + h) * d + i]) << "t " << t << " h " << h << " i " << i;
        ++written;
      }
    }
  }
  // Nothing else was touched.
  EXPECT_EQ(std::count(kp.begin(), kp.end(), 0.0f), static_cast<int64_t>(kp.size()) - written);
}

// Dense attention in double over contiguous K/V.
TEST(RefOps, PagedAttentionMatchesDenseSoftmax) {
  std::mt19937 rng(6);
  const int32_t Hq = 6, Hkv = 2, d = 64, bs = 16;
  const int64_t L = 37;
  std::vector<float> k = RandVec(rng, L * Hkv * d), v = RandVec(rng, L * Hkv * d);
  // Pool with blocks in scrambled order.
  const int64_t nblk = 5;
  std::vector<float> kp(nblk * bs * Hkv * d), vp(kp.size());
  PagedKvLayer kv{KvDtype::kF32, kp.data(), vp.data(), nblk, bs, Hkv, d};
  std::vector<int32_t> table = {3, 0, 4};
  std::vector<int64_t> slots(L);
  for (int64_t j = 0; j < L; ++j) slots[j] = table[j / bs] * bs + j % bs;
  ref::WriteKv(k.data(), v.data(), L, slots.data(), kv);
  const int64_t T = 4;
  std::vector<int32_t> pos = {0, 16, 20, 36};
  std::vector<const int32_t*> bt(T, table.data());
  std::vector<float> q = RandVec(rng, T * Hq * d, -2.0f, 2.0f), out(T * Hq * d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ref::PagedAttention(q.data(), T, Hq, pos.data(), bt.data(), kv, scale, out.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < Hq; ++h) {
      const int32_t kh = h / (Hq / Hkv);
      std::vector<double> s(pos[t] + 1);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= pos[t]; ++j) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += static_cast<double>(q[(t * Hq + h) * d + i]) * k[(j * Hkv + kh) * d + i];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int i = 0; i < d; ++i) {
        double o = 0;
        for (int64_t j = 0; j <= pos[t]; ++j) o += s[j] / sum * v[(j * Hkv + kh) * d + i];
        EXPECT_NEAR(out[(t * Hq + h) * d + i], o, 2e-6);
      }
    }
  }
}

TEST(RefOps, RopePreservesNormsAndMatchesFormula) {
  std::mt19937 rng(7);
  for (RopeLayout layout : {RopeLayout::kNormal, RopeLayout::kNeox}) {
    const int32_t H = 3, d = 64;
    RopeParams p{d, 10000.0f, layout};
    std::vector<int32_t> pos = {0, 1, 77, 5000};
    const int64_t T = pos.size();
    std::vector<float> x = RandVec(rng, T * H * d), y = x;
    ref::Rope(y.data(), T, H, d, pos.data(), p);
    for (int64_t t = 0; t < T; ++t) {
      for (int32_t h = 0; h < H; ++h) {
        const float* a = x.data() + (t * H + h) * d;
        const float* b = y.data() + (t * H + h) * d;
        for (int i = 0; i < d / 2; ++i) {
          const int i0 = layout == RopeLayout::kNormal ? 2 * i : i;
          const int i1 = layout == RopeLayout::kNormal ? 2 * i + 1 : i + d / 2;
          const double th = pos[t] * std::pow(10000.0, -2.0 * i / d);
          EXPECT_NEAR(b[i0], a[i0] * std::cos(th) - a[i1] * std::sin(th), 2e-6);
          EXPECT_NEAR(b[i1], a[i0] * std::sin(th) + a[i1] * std::cos(th), 2e-6);
          EXPECT_NEAR(std::hypot(b[i0], b[i1]), std::hypot(a[i0], a[i1]), 2e-6);
        }
      }
    }
  }
  // Partial rotary: dims past rope_dim pass through.
  RopeParams p{32, 10000.0f, RopeLayout::kNeox};
  std::vector<float> x = RandVec(rng, 64), y = x;
  const int32_t pos = 9;
  ref::Rope(y.data(), 1, 1, 64, &pos, p);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(x[i], y[i]);
}

TEST(RefOps, Llama3FrequencyScaling) {
  RopeParams p{128, 500000.0f, RopeLayout::kNormal};
  p.llama3_scaling = true;
  p.factor = 8;
  p.low_freq_factor = 1;
  p.high_freq_factor = 4;
  p.original_context = 8192;
  std::vector<double> f(64);
  ref::RopeInvFreq(p, f.data());
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 128);
    const double wavelen = 2 * std::numbers::pi / base;
    if (wavelen < 8192.0 / 4) {
      EXPECT_DOUBLE_EQ(f[i], base);
      ++kept;
    } else if (wavelen > 8192.0 / 1) {
      EXPECT_DOUBLE_EQ(f[i], base / 8);
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(f[i], (1 - smooth) * base / 8 + smooth * base, 1e-15);
      EXPECT_LT(f[i], base);
      EXPECT_GT(f[i], base / 8);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  // Linear scaling divides positions.
  RopeParams lin{64, 10000.0f, RopeLayout::kNormal};
  lin.linear_scale = 4;
  std::vector<double> g(32);
  ref::RopeInvFreq(lin, g.data());
  for (int i = 0; i < 32; ++i) EXPECT_DOUBLE_EQ(g[i], std::pow(10000.0, -2.0 * i / 64) / 4);
}

TEST(RefOps, SmallOps) {
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<float> w = {1, 1, 2, 0.5f}, out(4);
  ref::RmsNorm(x.data(), 1, 4, w.data(), 0.0f, out.data());
  const float rms = std::sqrt((1 + 4 + 9 + 16) / 4.0f);
  EXPECT_NEAR(out[2], 3 / rms * 2, 1e-6);
  std::vector<float> s = {1, 2, 3};
  ref::Softmax(s.data(), 3);
  const double z = std::exp(1) + std::exp(2) + std::exp(3);
  EXPECT_NEAR(s[2], std::exp(3) / z, 1e-7);
  float g = 2.0f, u = 3.0f, o;
  ref::SwiGlu(&g, &u, 1, 1, &o);
  EXPECT_NEAR(o, 2.0 / (1 + std::exp(-2.0)) * 3.0, 1e-6);
}

// ------------------------------------------------------------------ backend vs ref

class BackendTest : public ::testing::TestWithParam<int> {
 protected:
  OpsBackend& B() { return *Backends()[GetParam()]; }
};

std::string BackendName(const ::testing::TestParamInfo<int>& info) {
  return Backends()[info.param]->Name();
}

// The SIMD backends' kernel tables (the generic one is the reference's own code).
const cpu::internal::Backend* SimdTable(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::kAvx2: return cpu::internal::Avx2Backend();
    case cpu::Isa::kAvx512Vnni: return cpu::internal::Avx512VnniBackend();
    case cpu::Isa::kVnniEmulated: return cpu::internal::VnniEmulatedBackend();
    case cpu::Isa::kAvxVnni: return cpu::internal::AvxVnniBackend();
    case cpu::Isa::kAvxVnniEmulated: return cpu::internal::AvxVnniEmulatedBackend();
    case cpu::Isa::kGeneric: return nullptr;
  }
  return nullptr;
}

TEST_P(BackendTest, ActQuantBitwiseEqualsReference) {
  const auto* cpu_backend = dynamic_cast<const CpuBackend*>(&B());
  const auto* be = cpu_backend != nullptr ? SimdTable(cpu_backend->isa()) : nullptr;
  if (be == nullptr) GTEST_SKIP() << "the generic backend quantizes with the reference's code";
  std::mt19937 rng(8);
  // Block counts around the AVX-512 path's groups of 16 blocks and its block-by-block rest.
  for (int64_t blocks : {1, 15, 16, 17, 40, 48}) {
    for (float range : {1e-3f, 1.0f, 300.0f}) {
      std::vector<float> x = RandVec(rng, 32 * blocks, -range, range);
      if (blocks > 2) {
        for (int i = 64; i < 96; ++i) x[i] = 0;  // a block of zeros: d = 0
        x[33] = -0.0f;
        x[40] = 1e-40f;  // a denormal
      }
      if (blocks > 6) {
        x[100] = range * 2;  // a dominant value
        x[200] = 0.5f * range * 2 / 127 * 3;  // near a rounding tie
      }
      std::vector<ActBlockQ8> a(blocks), b(blocks);
      QuantizeActRow(x.data(), x.size(), a.data());
      be->quantize_act(x.data(), x.size(), b.data());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), sizeof(ActBlockQ8) * blocks), 0)
          << "blocks=" << blocks << " range=" << range;
    }
  }
}

TEST_P(BackendTest, MatMulMatchesReference) {
  std::mt19937 rng(9);
  for (const TypeInfo& ti : AllTypes()) {
    for (int64_t cols : ColsFor(ti)) {
      for (int64_t rows : {1, 6, 7, 8, 9, 17, 37}) {  // around the 8-row groups
        Weights w = RandWeights(rng, ti, rows, cols);
        const std::vector<float> wf = DequantAll(w.m);
        for (int64_t T : {1, 3, 5, 9, 15, 16, 17, 64}) {
          if (cols > 600 && T > 17) continue;  // keep the runtime down
          std::vector<float> x = RandVec(rng, T * cols, -2.0f, 2.0f);
          std::vector<float> y(T * rows), yr(T * rows);
          B().MatMul(w.m, x.data(), T, y.data());
          ref::MatMul(w.m, x.data(), T, yr.data());
          ASSERT_TRUE(AllFinite(y)) << ti.name;
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t n = 0; n < rows; ++n) {
              double mag = 0;
              for (int64_t k = 0; k < cols; ++k) mag += std::fabs(wf[n * cols + k] * x[t * cols + k]);
              ASSERT_NEAR(y[t * rows + n], yr[t * rows + n], 1e-5 * mag + 1e-30)
                  << ti.name << " rows=" << rows << " cols=" << cols << " T=" << T << " t=" << t
                  << " n=" << n;
            }
          }
        }
      }
    }
  }
}

// The largest integer sums the kernels can meet: every code byte at an extreme (Q4 code
// 15, Q8_0 code -128 or 127, Q6_K code 63) against activations that all quantize to
// +-127. The fast kernels keep partial sums in int16 where they can; none may saturate.
TEST_P(BackendTest, MatMulExtremeCodesDoNotOverflow) {
  std::mt19937 rng(19);
  for (const TypeInfo& ti : AllTypes()) {
    int64_t begin, end;  // the code bytes of a block
    switch (ti.type) {
      case GgmlType::kQ8_0: begin = 2, end = 34; break;
      case GgmlType::kQ4_0: begin = 2, end = 18; break;
      case GgmlType::kQ4_1: begin = 4, end = 20; break;
      case GgmlType::kQ4_K: begin = 16, end = 144; break;
      case GgmlType::kQ6_K: begin = 0, end = 192; break;
      default: continue;  // float types
    }
    const int64_t rows = 9, cols = ti.block == 256 ? 512 : 96, T = 3;
    for (uint8_t code : {uint8_t{0xFF}, uint8_t{0x80}, uint8_t{0x7F}, uint8_t{0x00}}) {
      Weights w = RandWeights(rng, ti, rows, cols);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < cols / ti.block; ++b) {
          uint8_t* blk = w.bytes.data() + r * w.m.row_bytes + b * ti.bytes;
          std::memset(blk + begin, code, static_cast<size_t>(end - begin));
        }
      }
      const std::vector<float> wf = DequantAll(w.m);
      std::vector<float> x(T * cols), y(T * rows), yr(T * rows);
      for (int64_t i = 0; i < T * cols; ++i) x[i] = (i / cols) % 2 == 0 ? 1.5f : -0.75f;
      B().MatMul(w.m, x.data(), T, y.data());
      ref::MatMul(w.m, x.data(), T, yr.data());
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t n = 0; n < rows; ++n) {
          double mag = 0;
          for (int64_t k = 0; k < cols; ++k) mag += std::fabs(wf[n * cols + k] * x[t * cols + k]);
          ASSERT_NEAR(y[t * rows + n], yr[t * rows + n], 1e-5 * mag + 1e-30)
              << ti.name << " code=" << int{code} << " t=" << t << " n=" << n;
        }
      }
    }
  }
}

// y[t] must be bitwise the same whatever else is in the batch and however it is split.
TEST_P(BackendTest, MatMulIsBatchInvariant) {
  std::mt19937 rng(10);
  for (const TypeInfo& ti : AllTypes()) {
    const int64_t cols = ti.block == 256 ? 512 : (ti.block == 32 ? 160 : 101);
    const int64_t rows = 43;
    Weights w = RandWeights(rng, ti, rows, cols);
    const int64_t T = 21;
    std::vector<float> x = RandVec(rng, T * cols, -2.0f, 2.0f), y(T * rows);
    B().MatMul(w.m, x.data(), T, y.data());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> y1(rows);
      B().MatMul(w.m, x.data() + t * cols, 1, y1.data());
      ASSERT_EQ(std::memcmp(y1.data(), y.data() + t * rows, rows * 4), 0) << ti.name << " t=" << t;
    }
    // Row 5 placed at each position of batches of several sizes, among other rows.
    std::vector<float> y5(rows);
    B().MatMul(w.m, x.data() + 5 * cols, 1, y5.data());
    for (int64_t bt : {2, 3, 4, 5, 8, 9, 16}) {
      for (int64_t at = 0; at < bt; at += 3) {
        std::vector<float> xb = RandVec(rng, bt * cols, -3.0f, 3.0f), yb(bt * rows);
        std::copy(x.begin() + 5 * cols, x.begin() + 6 * cols, xb.begin() + at * cols);
        B().MatMul(w.m, xb.data(), bt, yb.data());
        ASSERT_EQ(std::memcmp(y5.data(), yb.data() + at * rows, rows * 4), 0)
            << ti.name << " batch=" << bt << " at=" << at;
      }
    }
  }
}

TEST_P(BackendTest, ElementwiseOpsMatchReference) {
  std::mt19937 rng(11);
  for (int64_t T : {1, 3, 17, 64}) {
    for (int64_t D : {7, 64, 576, 1000}) {
      std::vector<float> x = RandVec(rng, T * D, -4.0f, 4.0f), w = RandVec(rng, D);
      std::vector<float> a(T * D), b(T * D);
      B().RmsNorm(x.data(), T, D, w.data(), 1e-5f, a.data());
      ref::RmsNorm(x.data(), T, D, w.data(), 1e-5f, b.data());
      ASSERT_TRUE(AllFinite(a));
      for (int64_t i = 0; i < T * D; ++i) ASSERT_NEAR(a[i], b[i], 1e-5 * std::fabs(b[i]) + 1e-6) << "rmsnorm";

      std::vector<float> g = RandVec(rng, T * D, -30.0f, 30.0f), u = RandVec(rng, T * D);
      g[0] = -100.0f;
      B().SwiGlu(g.data(), u.data(), T, D, a.data());
      ref::SwiGlu(g.data(), u.data(), T, D, b.data());
      ASSERT_TRUE(AllFinite(a));
      for (int64_t i = 0; i < T * D; ++i) ASSERT_NEAR(a[i], b[i], 2e-6 * std::fabs(b[i]) + 1e-7) << "swiglu";

      std::vector<float> s = RandVec(rng, D, -20.0f, 20.0f), sr = s;
      B().Softmax(s.data(), D);
      ref::Softmax(sr.data(), D);
      ASSERT_TRUE(AllFinite(s));
      for (int64_t i = 0; i < D; ++i) ASSERT_NEAR(s[i], sr[i], 2e-6 * sr[i] + 1e-9) << "softmax";

      a = x;
      b = x;
      B().AddInPlace(a.data(), g.data(), T * D);
      ref::AddInPlace(b.data(), g.data(), T * D);
      ASSERT_EQ(a, b);
      B().AddBias(a.data(), T, D, w.data());
      ref::AddBias(b.data(), T, D, w.data());
      ASSERT_EQ(a, b);
    }
  }
  // Big enough to run on several threads.
  std::vector<float> g = RandVec(rng, 64 * 1536, -10, 10), u = RandVec(rng, 64 * 1536);
  std::vector<float> a(g.size()), b(g.size());
  B().SwiGlu(g.data(), u.data(), 64, 1536, a.data());
  ref::SwiGlu(g.data(), u.data(), 64, 1536, b.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-6 * std::fabs(b[i]) + 1e-7);
  // Row results do not depend on the batch (SwiGlu over 3 rows vs 1 row).
  std::vector<float> one(1536);
  B().SwiGlu(g.data() + 2 * 1536, u.data() + 2 * 1536, 1, 1536, one.data());
  ASSERT_EQ(std::memcmp(one.data(), a.data() + 2 * 1536, 1536 * 4), 0);
}

TEST_P(BackendTest, RopeMatchesReference) {
  std::mt19937 rng(12);
  for (RopeLayout layout : {RopeLayout::kNormal, RopeLayout::kNeox}) {
    for (int32_t d : {64, 128}) {
      for (bool l3 : {false, true}) {
        RopeParams p{d, 500000.0f, layout};
        p.llama3_scaling = l3;
        p.factor = 32;
        const int32_t H = 9;
        std::vector<int32_t> pos = {0, 1, 2, 1000, 131000, 17, 5};
        const int64_t T = pos.size();
        std::vector<float> a = RandVec(rng, T * H * d), b = a;
        B().Rope(a.data(), T, H, d, pos.data(), p);
        ref::Rope(b.data(), T, H, d, pos.data(), p);
        ASSERT_TRUE(AllFinite(a));
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-6);
      }
    }
  }
}

// The CPU backend turns a step's q and k of every layer by angles computed once
// (cpu::RopeAngles, then cpu::RopeRotate per tensor): bitwise cpu::Rope, for both layouts,
// Llama-3 scaling and a rope_dim below head_dim.
TEST(CpuRope, AnglesOnceThenRotateIsBitwiseRope) {
  std::mt19937 rng(14);
  cpu::ThreadPool pool(2);
  for (RopeLayout layout : {RopeLayout::kNormal, RopeLayout::kNeox}) {
    for (int32_t rope_dim : {48, 64}) {
      for (bool l3 : {false, true}) {
        RopeParams p{rope_dim, 500000.0f, layout};
        p.llama3_scaling = l3;
        p.factor = 32;
        const int32_t d = 64;
        std::vector<int32_t> pos = {0, 1, 2, 1000, 131000, 17, 5, 4095, 8191};
        const int64_t T = pos.size();
        std::vector<float> cs(T * rope_dim / 2), sn(cs.size());
        cpu::RopeAngles(pool, T, pos.data(), p, cs.data(), sn.data());
        for (int32_t H : {9, 3}) {
          std::vector<float> a = RandVec(rng, T * H * d), b = a;
          cpu::Rope(pool, a.data(), T, H, d, pos.data(), p);
          cpu::RopeRotate(pool, b.data(), T, H, d, cs.data(), sn.data(), p);
          ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "H " << H << " rope_dim " << rope_dim;
        }
      }
    }
  }
}

TEST_P(BackendTest, EmbeddingLookupMatchesReference) {
  std::mt19937 rng(13);
  for (const TypeInfo& ti : AllTypes()) {
    const int64_t D = ti.block == 256 ? 512 : 96;
    Weights w = RandWeights(rng, ti, 50, D);
    std::vector<int32_t> ids = {0, 49, 7, 7, 23};
    std::vector<float> a(ids.size() * D), b(a.size());
    B().EmbeddingLookup(w.m, ids.data(), ids.size(), a.data());
    ref::EmbeddingLookup(w.m, ids.data(), ids.size(), b.data());
    ASSERT_TRUE(AllFinite(a));
    ASSERT_EQ(a, b) << ti.name;
  }
}

// ------------------------------------------------------------------ attention

// Every KV storage type the backends implement.
const std::vector<KvDtype>& AllKvDtypes() {
  static const std::vector<KvDtype> all = {KvDtype::kF16, KvDtype::kBF16, KvDtype::kF32,
                                           KvDtype::kInt8};
  return all;
}

// A set of sequences in a paged pool with (scrambled) block tables, KV written.
struct SeqSet {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> lens;
};

SeqSet MakeSeqs(std::mt19937& rng, KvPool& pool, const std::vector<int64_t>& lens) {
  const int32_t bs = pool.layer.block_size;
  std::vector<int32_t> free_blocks(pool.layer.num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  SeqSet s;
  s.lens = lens;
  size_t next = 0;
  const int64_t row = static_cast<int64_t>(pool.layer.num_kv_heads) * pool.layer.head_dim;
  for (int64_t L : lens) {
    std::vector<int32_t> table((L + bs - 1) / bs);
    for (auto& b : table) b = free_blocks.at(next++);
    std::vector<float> k = RandVec(rng, L * row), v = RandVec(rng, L * row);
    std::vector<int64_t> slots(L);
    for (int64_t j = 0; j < L; ++j) slots[j] = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
    ref::WriteKv(k.data(), v.data(), L, slots.data(), pool.layer);
    s.tables.push_back(std::move(table));
  }
  return s;
}

TEST_P(BackendTest, WriteKvMatchesReference) {
  std::mt19937 rng(14);
  for (KvDtype dt : AllKvDtypes()) {
    KvPool a(dt, 4, 16, 3, 64), b(dt, 4, 16, 3, 64);
    const int64_t T = 5;
    std::vector<float> k = RandVec(rng, T * 3 * 64, -70000.0f, 70000.0f), v = RandVec(rng, T * 3 * 64);
    k[1] = 1e-6f;  // f16 subnormal
    k[2] = 65519.0f;
    std::vector<int64_t> slots = {0, 17, 63, 5, 30};
    B().WriteKv(k.data(), v.data(), T, slots.data(), a.layer);
    ref::WriteKv(k.data(), v.data(), T, slots.data(), b.layer);
    ASSERT_EQ(a.k, b.k);
    ASSERT_EQ(a.v, b.v);
    ASSERT_EQ(a.k_scale, b.k_scale);
    ASSERT_EQ(a.v_scale, b.v_scale);
  }
}

// A bucketed step's padding rows (slot -1) store nothing: the pool is what the real rows
// alone leave, on every backend and KV dtype.
TEST_P(BackendTest, WriteKvStoresNothingForPaddingRows) {
  std::mt19937 rng(16);
  for (KvDtype dt : AllKvDtypes()) {
    KvPool padded(dt, 4, 16, 3, 64), real_only(dt, 4, 16, 3, 64);
    const int64_t T = 5, row = 3 * 64;
    std::vector<float> k = RandVec(rng, T * row), v = RandVec(rng, T * row);
    const std::vector<int64_t> slots = {-1, 17, -1, 5, -1};
    B().WriteKv(k.data(), v.data(), T, slots.data(), padded.layer);
    const std::vector<float> k_real = [&] {
      std::vector<float> r(k.begin() + row, k.begin() + 2 * row);
      r.insert(r.end(), k.begin() + 3 * row, k.begin() + 4 * row);
      return r;
    }();
    const std::vector<float> v_real = [&] {
      std::vector<float> r(v.begin() + row, v.begin() + 2 * row);
      r.insert(r.end(), v.begin() + 3 * row, v.begin() + 4 * row);
      return r;
    }();
    const std::vector<int64_t> real_slots = {17, 5};
    ref::WriteKv(k_real.data(), v_real.data(), 2, real_slots.data(), real_only.layer);
    ASSERT_EQ(padded.k, real_only.k) << static_cast<int>(dt);
    ASSERT_EQ(padded.v, real_only.v);
    ASSERT_EQ(padded.k_scale, real_only.k_scale);
    ASSERT_EQ(padded.v_scale, real_only.v_scale);
  }
}

// The SIMD backends' int8 KV quantizer (quantize_kv_rows: K and V writes, and q for attention
// on an int8 cache) against kernels/kv_int8.h's QuantizeKvRow, bitwise: codes, scales, the
// codes as floats and their sums. Rows with ties at .5 (amax 127, so codes are the values
// rounded to even), NaN (ignored by the max, code 0), an infinity (scale inf, codes 0), zeros
// and -0, values near the clamp, and random rows at d = 8, 64, 72 and 128.
TEST(KvInt8Test, SimdQuantizerIsBitwiseQuantizeKvRow) {
  std::mt19937 rng(33);
  int compared = 0;
  for (int32_t d : {8, 64, 72, 128}) {
    std::vector<std::vector<float>> rows;
    std::vector<float> ties(d);
    for (int32_t i = 0; i < d; ++i) ties[i] = (i % 2 == 0 ? 1.0f : -1.0f) * (0.5f + static_cast<float>(i % 7));
    ties[d - 1] = 127.0f;
    rows.push_back(ties);
    std::vector<float> nan_row = RandVec(rng, d, -2.0f, 2.0f);
    nan_row[1] = std::numeric_limits<float>::quiet_NaN();
    rows.push_back(nan_row);
    std::vector<float> inf_row = RandVec(rng, d, -2.0f, 2.0f);
    inf_row[d / 2] = -std::numeric_limits<float>::infinity();
    rows.push_back(inf_row);
    rows.push_back(std::vector<float>(d, 0.0f));
    std::vector<float> neg_zero(d, -0.0f);
    neg_zero[3] = 1e-30f;
    rows.push_back(neg_zero);
    for (int i = 0; i < 12; ++i) rows.push_back(RandVec(rng, d, -8.0f, 8.0f));
    std::vector<float> x;
    for (const auto& r : rows) x.insert(x.end(), r.begin(), r.end());
    const int64_t n = static_cast<int64_t>(rows.size());
    std::vector<int8_t> want(n * d);
    std::vector<float> want_scale(n), want_floats(n * d);
    std::vector<int32_t> want_sums(n);
    for (int64_t r = 0; r < n; ++r) {
      want_scale[r] = QuantizeKvRow(x.data() + r * d, d, want.data() + r * d, 1);
      want_sums[r] = 0;
      for (int32_t i = 0; i < d; ++i) {
        want_floats[r * d + i] = want[r * d + i];
        want_sums[r] += want[r * d + i];
      }
    }
    for (cpu::Isa isa : cpu::AllIsas()) {
      const auto* be = SimdTable(isa);
      if (be == nullptr || !cpu::IsaSupported(isa)) continue;
      std::vector<int8_t> got(n * d, 99);
      std::vector<float> got_scale(n, -1.0f), got_floats(n * d, -1.0f);
      std::vector<int32_t> got_sums(n, -1);
      be->quantize_kv_rows(x.data(), n, d, got.data(), got_floats.data(), got_sums.data(), got_scale.data());
      ASSERT_EQ(got, want) << cpu::IsaName(isa) << " d=" << d;
      ASSERT_EQ(std::memcmp(got_scale.data(), want_scale.data(), n * 4), 0) << cpu::IsaName(isa) << " d=" << d;
      ASSERT_EQ(std::memcmp(got_floats.data(), want_floats.data(), n * d * 4), 0) << cpu::IsaName(isa);
      ASSERT_EQ(got_sums, want_sums) << cpu::IsaName(isa) << " d=" << d;
      ++compared;
    }
  }
  if (compared == 0) GTEST_SKIP() << "NOT RUN: no SIMD backend on this CPU";
}

// int8 KV: each (token, head) row reads back within half a step of its scale (absmax / 127)
// of what was written, an all-zero row as zeros, and a row's largest value as a full code.
// p V's weight codes (kernels/kv_int8.h): the row's largest weight is code 255, the others
// nearest (ties to even), never past [0, 255]; NaN and an all-zero row give code 0, and a
// code times PWeightScale is within half a step of its weight.
TEST(KvInt8Test, WeightCodesSpanTheRowsLargestWeight) {
  const float wmax = 0.37f, inv = PWeightInverse(wmax);
  EXPECT_EQ(PWeightCode(wmax, inv), 255.0f);
  EXPECT_EQ(PWeightCode(0.0f, inv), 0.0f);
  EXPECT_EQ(PWeightCode(2.5f / inv, inv), 2.0f);  // 2.5 steps: a tie, to even
  EXPECT_EQ(PWeightCode(3.5f / inv, inv), 4.0f);
  EXPECT_EQ(PWeightCode(2.0f * wmax, inv), 255.0f);  // past the row's max: clamped
  EXPECT_EQ(PWeightCode(-1.0f, inv), 0.0f);
  EXPECT_EQ(PWeightCode(std::nanf(""), inv), 0.0f);
  EXPECT_EQ(PWeightInverse(0.0f), 0.0f);  // an all-zero row: every code 0
  EXPECT_EQ(PWeightCode(0.0f, PWeightInverse(0.0f)), 0.0f);
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> u(0.0f, wmax);
  for (int i = 0; i < 10000; ++i) {
    const float w = u(rng);
    const float back = PWeightCode(w, inv) * PWeightScale(wmax);
    EXPECT_LE(std::fabs(back - w), 0.5f * PWeightScale(wmax) * 1.0001f) << w;
  }
}

TEST(KvInt8Test, RowsReadBackWithinHalfAStep) {
  std::mt19937 rng(15);
  const int32_t d = 64, bs = 16, hkv = 2;
  KvPool pool(KvDtype::kInt8, 3, bs, hkv, d);
  const int64_t T = 4;
  std::vector<float> k = RandVec(rng, T * hkv * d, -3.0f, 3.0f), v = RandVec(rng, T * hkv * d);
  for (int32_t i = 0; i < d; ++i) k[i] = 0.0f;  // token 0, head 0: all zero
  k[d + 5] = -40.0f;                            // token 0, head 1: one large value
  std::vector<int64_t> slots = {0, 17, 47, 31};
  ref::WriteKv(k.data(), v.data(), T, slots.data(), pool.layer);
  const auto* kq = reinterpret_cast<const int8_t*>(pool.k.data());
  const auto* vq = reinterpret_cast<const int8_t*>(pool.v.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < hkv; ++h) {
      const float ks = pool.k_scale[pool.layer.SIndex(slots[t], h)];
      const float vs = pool.v_scale[pool.layer.SIndex(slots[t], h)];
      float amax = 0;
      for (int32_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(k[(t * hkv + h) * d + i]));
      EXPECT_EQ(ks, amax / 127.0f);
      for (int32_t i = 0; i < d; ++i) {
        const float kw = k[(t * hkv + h) * d + i], vw = v[(t * hkv + h) * d + i];
        const float kr = kq[pool.layer.KIndex(slots[t], h, i)] * ks;
        const float vr = vq[pool.layer.VIndex(slots[t], h) + i] * vs;
        ASSERT_LE(std::fabs(kr - kw), 0.5f * ks + 1e-7f) << t << " " << h << " " << i;
        ASSERT_LE(std::fabs(vr - vw), 0.5f * vs + 1e-7f) << t << " " << h << " " << i;
        if (amax > 0 && std::fabs(kw) == amax) {  // the row's largest value: a full code
          EXPECT_EQ(std::abs(kq[pool.layer.KIndex(slots[t], h, i)]), 127);
        }
      }
    }
  }
  EXPECT_EQ(pool.k_scale[pool.layer.SIndex(slots[0], 0)], 0.0f);
  EXPECT_EQ(kq[pool.layer.KIndex(slots[0], 1, 5)], -127);
}

// How far the CPU's attention may stray from the reference (which keeps every product
// exact) where |v| <= 1. bf16 KV rounds p to bf16, a relative 2^-9 per weight. int8 KV codes
// each chunk row's weights w = p * vs against the row's largest (kernels/kv_int8.h): a weight
// errs by up to 1/510 of the largest, so a sharp softmax's many small weights each err by
// up to 4x their bf16 rounding; the test data's sharp rows measured 0.0042.
double ReducedPrecisionAttentionTolerance(KvDtype dt) {
  if (dt == KvDtype::kInt8) return 0x1p-7;
  return dt == KvDtype::kBF16 ? 0x1p-8 : 2e-5;
}

// Runs the backend's PagedAttention on the batch (q: [T, hq, d]), checks it against the
// reference and that every query alone gives bitwise the same row; returns the batch output.
std::vector<float> AttentionMatchesReferenceAndAlone(OpsBackend& be, const std::vector<float>& q,
                                                     const std::vector<int32_t>& pos,
                                                     const std::vector<const int32_t*>& bt,
                                                     const KvPool& pool, int32_t hq, int32_t d) {
  const int64_t T = pos.size();
  std::vector<float> a(q.size()), b(q.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  be.PagedAttention(q.data(), T, hq, pos.data(), bt.data(), pool.layer, scale, a.data());
  ref::PagedAttention(q.data(), T, hq, pos.data(), bt.data(), pool.layer, scale, b.data());
  EXPECT_TRUE(AllFinite(a));
  const double tol = ReducedPrecisionAttentionTolerance(pool.dtype);
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i] - b[i]) > tol) {
      ADD_FAILURE() << "i=" << i << ": " << a[i] << " vs reference " << b[i];
      return a;
    }
  }
  // Batch invariance: every query alone gives bitwise the same output.
  const int64_t row = static_cast<int64_t>(hq) * d;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> one(row);
    be.PagedAttention(q.data() + t * row, 1, hq, &pos[t], &bt[t], pool.layer, scale, one.data());
    if (std::memcmp(one.data(), a.data() + t * row, row * 4) != 0) {
      ADD_FAILURE() << "t=" << t << " alone differs from the batch";
      return a;
    }
  }
  return a;
}

TEST_P(BackendTest, PagedAttentionMatchesReference) {
  std::mt19937 rng(15);
  struct Heads {
    int32_t hq, hkv, d;
  };
  // d = 72: nine 8-float columns, so the AVX2 path's 64-column register blocks split.
  for (Heads hs : {Heads{9, 3, 64}, Heads{7, 1, 128}, Heads{4, 4, 64}, Heads{6, 2, 72}}) {
    for (KvDtype dt : AllKvDtypes()) {
      const int32_t bs = 16;
      // Sequence lengths around the KV block size and the attention key chunk
      // (kAttnChunk = 64, bs ± 1 and chunk ± 1), plus a long one.
      const std::vector<int64_t> lens = {1, 15, 16, 17, 63, 64, 65, 129, 1000};
      KvPool pool(dt, 100, bs, hs.hkv, hs.d);
      SeqSet seqs = MakeSeqs(rng, pool, lens);
      // Ragged batch: each sequence contributes its last few positions as queries.
      std::vector<int32_t> pos;
      std::vector<const int32_t*> bt;
      for (size_t s = 0; s < lens.size(); ++s) {
        const int64_t nq = std::min<int64_t>(lens[s], s % 2 == 0 ? 1 : 5);
        for (int64_t i = lens[s] - nq; i < lens[s]; ++i) {
          pos.push_back(static_cast<int32_t>(i));
          bt.push_back(seqs.tables[s].data());
        }
      }
      const int64_t T = pos.size();
      std::vector<float> q = RandVec(rng, T * hs.hq * hs.d, -3.0f, 3.0f);
      const std::vector<float> a =
          AttentionMatchesReferenceAndAlone(B(), q, pos, bt, pool, hs.hq, hs.d);
      if (HasFailure()) return;
      const int64_t row = static_cast<int64_t>(hs.hq) * hs.d;
      const float scale = 1.0f / std::sqrt(static_cast<float>(hs.d));
      // And reversed batch order.
      std::vector<float> qr(q.size()), ar(q.size());
      std::vector<int32_t> posr(pos.rbegin(), pos.rend());
      std::vector<const int32_t*> btr(bt.rbegin(), bt.rend());
      for (int64_t t = 0; t < T; ++t) std::copy_n(q.begin() + t * row, row, qr.begin() + (T - 1 - t) * row);
      B().PagedAttention(qr.data(), T, hs.hq, posr.data(), btr.data(), pool.layer, scale, ar.data());
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(std::memcmp(ar.data() + (T - 1 - t) * row, a.data() + t * row, row * 4), 0);
      }
    }
  }
}

// Prefill: whole runs of consecutive positions of one sequence (the backends may share each
// key chunk across a tile of them, kAttnTile), a chunked prefill that starts mid-sequence,
// and a second sequence right after (a tile must not cross it). Every query must match the
// reference and be bitwise what it gives alone.
TEST_P(BackendTest, PagedAttentionPrefillTilesAreBitwiseSingleQueries) {
  std::mt19937 rng(19);
  struct Heads {
    int32_t hq, hkv, d;
  };
  for (Heads hs : {Heads{9, 3, 64}, Heads{6, 2, 72}}) {
    for (KvDtype dt : AllKvDtypes()) {
      const int32_t bs = 16;
      KvPool pool(dt, 64, bs, hs.hkv, hs.d);
      SeqSet seqs = MakeSeqs(rng, pool, {300, 70, 200});
      std::vector<int32_t> pos;
      std::vector<const int32_t*> bt;
      auto add = [&](size_t seq, int32_t from, int32_t to) {
        for (int32_t p = from; p < to; ++p) {
          pos.push_back(p);
          bt.push_back(seqs.tables[seq].data());
        }
      };
      add(0, 0, 300);    // a whole prompt: 18 full tiles and a ragged one
      add(1, 50, 70);    // the next sequence: a new tile
      add(2, 100, 163);  // a later chunk of a chunked prefill
      add(2, 199, 200);  // a lone query of the same sequence, not consecutive
      std::vector<float> q = RandVec(rng, static_cast<int64_t>(pos.size()) * hs.hq * hs.d,
                                     -3.0f, 3.0f);
      AttentionMatchesReferenceAndAlone(B(), q, pos, bt, pool, hs.hq, hs.d);
      if (HasFailure()) return;
    }
  }
}

// Long contexts: a query at each of the awkward positions (1, 63, 64, 65, 1000, 4096
// and 8192 keys) and a run of verify-like consecutive queries at the end of the longest,
// against the reference, finite, and each query bitwise what it gives alone.
struct LongContextCase {
  KvPool pool;
  SeqSet seqs;
  std::vector<int32_t> pos;
  std::vector<const int32_t*> bt;
  std::vector<float> q;
};
LongContextCase MakeLongContextCase(std::mt19937& rng, KvDtype dt, int32_t hq, int32_t hkv,
                                    int32_t d) {
  const std::vector<int64_t> lens = {1, 63, 64, 65, 1000, 4096, 8192};
  LongContextCase c{KvPool(dt, 14000 / 16 + 8, 16, hkv, d), {}, {}, {}, {}};
  c.seqs = MakeSeqs(rng, c.pool, lens);
  for (size_t s = 0; s < lens.size(); ++s) {
    const int64_t nq = s + 1 == lens.size() ? 20 : 1;
    for (int64_t i = lens[s] - nq; i < lens[s]; ++i) {
      c.pos.push_back(static_cast<int32_t>(i));
      c.bt.push_back(c.seqs.tables[s].data());
    }
  }
  c.q = RandVec(rng, static_cast<int64_t>(c.pos.size()) * hq * d, -3.0f, 3.0f);
  return c;
}

TEST_P(BackendTest, PagedAttentionLongContexts) {
  std::mt19937 rng(23);
  for (KvDtype dt : AllKvDtypes()) {
    LongContextCase c = MakeLongContextCase(rng, dt, 9, 3, 64);
    AttentionMatchesReferenceAndAlone(B(), c.q, c.pos, c.bt, c.pool, 9, 64);
    if (HasFailure()) return;
  }
}

// Verification steps: one or two sequences' runs of consecutive queries at the end of a long
// context. So few tiles are split over the threads by key chunk, each query's partials merged
// afterwards; every query must still match the reference, be bitwise what it gives alone (a
// split decode), and bitwise what the same run gives inside a batch too big to split.
TEST_P(BackendTest, PagedAttentionVerificationStepsSplitByChunkAreBitwise) {
  std::mt19937 rng(29);
  struct Heads {
    int32_t hq, hkv, d;
  };
  struct Case {
    size_t seq;  // of lens' first four
    int64_t run;
    bool pair;   // with the next long sequence's run beside it (two tiles)
  };
  // (A run of 17 is past the split limit, kMaxSplitTileTokens: folded unsplit, the same bits.)
  const Case cases[] = {{0, 2, false}, {0, 9, true}, {1, 5, false}, {2, 5, true}, {2, 9, false}, {3, 5, false}, {2, 17, false}};
  for (Heads hs : {Heads{9, 3, 64}, Heads{6, 2, 72}}) {
    for (KvDtype dt : AllKvDtypes()) {
      // Lengths around the key chunk, a long one, and 16 short ones to fill the big batch.
      std::vector<int64_t> lens = {66, 129, 1000, 4096};
      for (int i = 0; i < 16; ++i) lens.push_back(20 + 7 * i);
      KvPool pool(dt, 600, 16, hs.hkv, hs.d);
      SeqSet seqs = MakeSeqs(rng, pool, lens);
      const int64_t row = static_cast<int64_t>(hs.hq) * hs.d;
      const float scale = 1.0f / std::sqrt(static_cast<float>(hs.d));
      for (const Case& c : cases) {
        std::vector<int32_t> pos;
        std::vector<const int32_t*> bt;
        for (size_t u : {c.seq, (c.seq + 1) % 4}) {
          for (int64_t i = lens[u] - c.run; i < lens[u]; ++i) {
            pos.push_back(static_cast<int32_t>(i));
            bt.push_back(seqs.tables[u].data());
          }
          if (!c.pair) break;
        }
        std::vector<float> q = RandVec(rng, static_cast<int64_t>(pos.size()) * row, -3.0f, 3.0f);
        const std::vector<float> split = AttentionMatchesReferenceAndAlone(B(), q, pos, bt, pool, hs.hq, hs.d);
        if (HasFailure()) return;
        // The same queries after 16 lone queries of other sequences: too many tiles to split.
        std::vector<int32_t> bpos;
        std::vector<const int32_t*> bbt;
        for (size_t u = 4; u < lens.size(); ++u) {
          bpos.push_back(static_cast<int32_t>(lens[u] - 1));
          bbt.push_back(seqs.tables[u].data());
        }
        const int64_t lone = static_cast<int64_t>(bpos.size());
        bpos.insert(bpos.end(), pos.begin(), pos.end());
        bbt.insert(bbt.end(), bt.begin(), bt.end());
        std::vector<float> bq = RandVec(rng, lone * row, -3.0f, 3.0f);
        bq.insert(bq.end(), q.begin(), q.end());
        std::vector<float> batched(bq.size());
        B().PagedAttention(bq.data(), static_cast<int64_t>(bpos.size()), hs.hq, bpos.data(), bbt.data(),
                           pool.layer, scale, batched.data());
        ASSERT_EQ(std::memcmp(batched.data() + lone * row, split.data(), split.size() * 4), 0)
            << "run " << c.run << " of sequence " << c.seq << (c.pair ? " (two runs)" : "") << " d=" << hs.d
            << " kv " << static_cast<int>(dt);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendTest,
                         ::testing::Range(0, static_cast<int>(Backends().size())), BackendName);

// ------------------------------------------------------------------ cross-backend and pool

// Different thread counts and ISA paths are each batch invariant; the same ISA with
// different thread counts must agree bitwise.
TEST(CrossBackend, ThreadCountDoesNotChangeResults) {
  std::mt19937 rng(16);
  for (const TypeInfo& ti : AllTypes()) {
    const int64_t cols = ti.block == 256 ? 512 : 576, rows = 200, T = 16;
    Weights w = RandWeights(rng, ti, rows, cols);
    std::vector<float> x = RandVec(rng, T * cols);
    std::vector<float> y1(T * rows), y3(T * rows);
    cpu::ThreadPool p1(1), p3(3);
    cpu::MatMul(p1, w.m, x.data(), T, y1.data());
    cpu::MatMul(p3, w.m, x.data(), T, y3.data());
    ASSERT_EQ(y1, y3) << ti.name;
  }
}

// MatMulShared (one quantized input, several weights, one parallel region) must give
// bitwise what separate MatMul calls give, on every ISA path.
TEST(CrossBackend, MatMulSharedEqualsSeparateMatMuls) {
  std::mt19937 rng(18);
  cpu::ThreadPool pool(3);
  const cpu::Isa saved = cpu::ActiveIsa();
  for (cpu::Isa isa : cpu::AllIsas()) {
    if (!cpu::IsaSupported(isa)) continue;
    cpu::SetIsa(isa);
    for (const TypeInfo& ti : AllTypes()) {
      const int64_t cols = ti.block == 256 ? 512 : 160;
      const int64_t rows[3] = {37, 6, 13};
      std::vector<Weights> w;
      for (int64_t r : rows) w.push_back(RandWeights(rng, ti, r, cols));
      const WeightMatrix ws[3] = {w[0].m, w[1].m, w[2].m};
      for (int64_t T : {1, 5, 17}) {
        std::vector<float> x = RandVec(rng, T * cols, -2.0f, 2.0f);
        std::vector<std::vector<float>> shared(3), separate(3);
        float* ys[3];
        for (int i = 0; i < 3; ++i) {
          shared[i].assign(T * rows[i], 0.0f);
          separate[i].assign(T * rows[i], 1.0f);
          ys[i] = shared[i].data();
          cpu::MatMul(pool, ws[i], x.data(), T, separate[i].data());
        }
        cpu::MatMulShared(pool, ws, 3, x.data(), T, ys);
        for (int i = 0; i < 3; ++i) {
          ASSERT_EQ(std::memcmp(shared[i].data(), separate[i].data(), shared[i].size() * 4), 0)
              << cpu::IsaName(isa) << " " << ti.name << " T=" << T << " matrix " << i;
        }
      }
    }
  }
  cpu::SetIsa(saved);
}

// The VNNI backends compute the same exact integer block sums as AVX2 and then the same
// float steps, so their quantized MatMul must equal AVX2's bitwise, at every T (the T = 1
// path, full and partial 4-token tiles) and row count (full and partial groups of 8 rows,
// and of the 16 rows per 512-bit vector the VNNI backends take for T > 1).
TEST(CrossBackend, VnniMatMulIsBitwiseAvx2) {
  if (!cpu::IsaSupported(cpu::Isa::kAvx2)) GTEST_SKIP() << "no AVX2: no SIMD backends to compare";
  std::mt19937 rng(20);
  cpu::ThreadPool pool(2);
  const cpu::Isa saved = cpu::ActiveIsa();
  int compared = 0;
  for (const TypeInfo& ti : AllTypes()) {
    if (ti.block == 1) continue;  // float types
    const int64_t cols = ti.block == 256 ? 512 : 160;
    for (int64_t rows : {5, 8, 12, 16, 37}) {
      Weights w = RandWeights(rng, ti, rows, cols);
      for (int64_t T : {1, 3, 4, 9, 16}) {
        std::vector<float> x = RandVec(rng, T * cols, -2.0f, 2.0f), want(T * rows);
        cpu::SetIsa(cpu::Isa::kAvx2);
        cpu::MatMul(pool, w.m, x.data(), T, want.data());
        for (cpu::Isa isa : kIsasBesideAvx2) {
          if (!cpu::IsaSupported(isa)) continue;
          cpu::SetIsa(isa);
          std::vector<float> got(T * rows, -1.0f);
          cpu::MatMul(pool, w.m, x.data(), T, got.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
              << cpu::IsaName(isa) << " " << ti.name << " rows=" << rows << " T=" << T;
          ++compared;
        }
      }
    }
  }
  cpu::SetIsa(saved);
  EXPECT_GT(compared, 0);  // the emulated backend is always built on x86
}

// Attention's arithmetic does not depend on the vector width: every score is one FMA chain
// over the head dims in order and every output column one over the keys, with vectors
// across keys or columns. So the AVX2, AVX-512 and emulated paths agree bitwise, decode
// queries, prefill tiles, verification steps and long contexts alike (and head_dim 72 takes a 256-bit column
// tail on the AVX-512 path).
// The CPU kernels' software prefetch is in the compiled code. GCC counts _mm_prefetch as free of
// side effects: it found helpers that did nothing but prefetch (the KV cache's PrefetchKvChunk,
// MatMulFT's rows) pure and deleted every call to them, so for sessions decode at depth ran
// with no prefetch at all (docs/PERFORMANCE.md, "The KV prefetch that was never emitted").
// Disassembles this test binary, which links every SIMD backend. The packed MatMul's far
// prefetch (into L2, prefetcht1, for steps of several tokens) is checked the same way.
TEST(KernelCode, KernelsKeepTheirSoftwarePrefetch) {
#if defined(__x86_64__)
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  FILE* f = popen(("objdump -d -C --no-show-raw-insn '" + std::string(self) + "' 2>/dev/null").c_str(), "r");
  ASSERT_NE(f, nullptr) << "could not run objdump (binutils)";
  std::string fn;
  int attention = 0, matmul_ft = 0, packed_far = 0;
  char line[8192];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    const std::string l(line);
    if (!l.empty() && l[0] != ' ' && l.find(">:") != std::string::npos) {  // "addr <function>:"
      fn = l;
      continue;
    }
    if (l.find("prefetch") == std::string::npos || fn.find("specd::kernels::cpu::") == std::string::npos) continue;
    for (const char* name : {"PrefetchKvChunk", "::Attention(", "AttnTile", "AttnChunk", "AttnRowsChunk"}) {
      if (fn.find(name) != std::string::npos) {
        ++attention;
        break;
      }
    }
    matmul_ft += fn.find("MatMulFT") != std::string::npos;
    // The far prefetch is in PackedTileX, inlined into its callers in optimized builds.
    packed_far += l.find("prefetcht1") != std::string::npos &&
                  (fn.find("PackedTileX") != std::string::npos ||
                   fn.find("MatMulPackedX") != std::string::npos ||
                   fn.find("TokensX") != std::string::npos);
  }
  ASSERT_EQ(pclose(f), 0) << "objdump failed on this binary";
  // Three backends (AVX2, AVX-512 VNNI, its emulation), each with at least one prefetch in its
  // attention and in its float MatMul.
  EXPECT_GE(attention, 3) << "the attention kernels' KV prefetch was compiled away";
  EXPECT_GE(matmul_ft, 3) << "MatMulFT's row prefetch was compiled away";
  EXPECT_GE(packed_far, 3) << "the packed MatMul's far prefetch was compiled away";
#else
  GTEST_SKIP() << "NOT RUN: x86-64 only (the prefetch is x86 code)";
#endif
}

TEST(CrossBackend, AttentionIsBitwiseAcrossSimdPaths) {
  if (!cpu::IsaSupported(cpu::Isa::kAvx2)) GTEST_SKIP() << "no AVX2: no SIMD backends to compare";
  std::mt19937 rng(24);
  cpu::ThreadPool pool(2);
  const cpu::Isa saved = cpu::ActiveIsa();
  int compared = 0, native_bf16 = 0, native_int8 = 0;
  struct Heads {
    int32_t hq, hkv, d;
  };
  for (Heads hs : {Heads{9, 3, 64}, Heads{6, 2, 72}}) {
    for (KvDtype dt : {KvDtype::kF16, KvDtype::kF32, KvDtype::kInt8, KvDtype::kBF16}) {
      LongContextCase c = MakeLongContextCase(rng, dt, hs.hq, hs.hkv, hs.d);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hs.d));
      const int64_t all = c.pos.size(), row = static_cast<int64_t>(hs.hq) * hs.d;
      // Every query, then the longest sequence's last 5 alone: a verification step, split by
      // key chunk over the threads (on AVX-512 its 15 query rows read K and V from the pool).
      for (int64_t first : {int64_t{0}, all - 5}) {
        const int64_t T = all - first;
        const float* q = c.q.data() + first * row;
        std::vector<float> want(T * row);
        cpu::SetIsa(cpu::Isa::kAvx2);
        cpu::PagedAttention(pool, q, T, hs.hq, c.pos.data() + first, c.bt.data() + first, c.pool.layer,
                            scale, want.data());
        for (cpu::Isa isa : kIsasBesideAvx2) {
          if (!cpu::IsaSupported(isa)) continue;
          cpu::SetIsa(isa);
          std::vector<float> got(T * row, -1.0f);
          cpu::PagedAttention(pool, q, T, hs.hq, c.pos.data() + first, c.bt.data() + first, c.pool.layer,
                              scale, got.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
              << cpu::IsaName(isa) << " d=" << hs.d << " kv " << static_cast<int>(dt) << " from query " << first;
          ++compared;
          // bf16 KV on the VNNI path with AVX-512 BF16 runs vdpbf16ps itself (d % 16 == 0);
          // int8 KV runs vpdpbusd for its scores and p V (d % 64 == 0; d = 72 takes f32 FMAs).
          native_bf16 += dt == KvDtype::kBF16 && isa == cpu::Isa::kAvx512Vnni &&
                         cpu::Avx512Bf16Supported() && hs.d % 16 == 0;
          native_int8 += dt == KvDtype::kInt8 && isa == cpu::Isa::kAvx512Vnni && hs.d % 64 == 0;
        }
      }
    }
  }
  cpu::SetIsa(saved);
  EXPECT_GT(compared, 0);  // the emulated backend is always built on x86
  if (native_bf16 > 0) {
    std::printf("bf16 KV attention: the native path matched its f32 emulation bitwise\n");
  } else {
    std::printf("NOT RUN: bf16 KV attention's native path (this CPU has no AVX-512 BF16); its "
                "emulation was compared across the other SIMD paths\n");
  }
  if (native_int8 > 0) {
    std::printf("int8 KV attention: the native vpdpbusd path matched its f32 emulation bitwise\n");
  } else {
    std::printf("NOT RUN: int8 KV attention's native path (this CPU has no AVX-512 VNNI); its "
                "emulation was compared across the other SIMD paths\n");
  }
}

// bf16 attention's one rounding (kernels/attn_bf16.h, branch-free) against its definition:
// nearest even bf16 (ref::F32ToBF16), magnitudes below 2^-30 to +0, NaN stays NaN, infinities
// and overflow to infinity kept.
TEST(Bf16Attn, RoundingMatchesItsDefinition) {
  std::mt19937 rng(32);
  std::vector<float> xs = {0.0f, -0.0f, 0x1p-30f, -0x1p-30f, std::nextafter(0x1p-30f, 0.0f), 1e-38f, 1e-45f,
                           1.0f, 1.00390625f, 1.01171875f, -3.5f, 3.4028235e38f, -3.4028235e38f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    xs.push_back(f);
  }
  for (float x : xs) {
    const uint16_t got = ToBf16Attn(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(Bf16AttnToF32(got))) << x;
      continue;
    }
    const uint16_t want = std::fabs(x) < kBf16AttnFlush ? 0 : ref::F32ToBF16(x);
    ASSERT_EQ(got, want) << x;
  }
}

// bf16 attention and attention on the int8 KV cache (kernels/kv_int8.h) on shapes the
// long-context case does not reach, bitwise across the SIMD paths (on a CPU with AVX-512 BF16
// the VNNI path runs vdpbf16ps itself; on AVX-512 VNNI int8's scores and p V run vpdpbusd, at
// d = 64 and 128): head dims 64, 112 (a 48-column pass) and 128; rows of different lengths
// in one small tile (R <= 6: K and V read from the pool's blocks) and a large tile (the chunk
// staged); odd key counts; K and V with exact zeros, values below the flush threshold and an
// all-zero row (an int8 scale of 0); queries scaled up so most p underflow or flush.
TEST(CrossBackend, ReducedPrecisionAttentionIsBitwiseAcrossSimdPathsOnAwkwardShapes) {
  if (!cpu::IsaSupported(cpu::Isa::kAvx2)) GTEST_SKIP() << "no AVX2: no SIMD backends to compare";
  std::mt19937 rng(31);
  cpu::ThreadPool pool(2);
  const cpu::Isa saved = cpu::ActiveIsa();
  int compared = 0;
  struct Heads {
    int32_t hq, hkv, d;
  };
  for (KvDtype dt : {KvDtype::kBF16, KvDtype::kInt8}) {
    for (Heads hs : {Heads{9, 3, 64}, Heads{4, 2, 112}, Heads{7, 1, 128}}) {
      const int32_t bs = 16;
      KvPool kv(dt, 64, bs, hs.hkv, hs.d);
      const std::vector<int64_t> lens = {1, 2, 3, 17, 65, 131, 300};
      std::vector<int32_t> free_blocks(kv.layer.num_blocks);
      std::iota(free_blocks.begin(), free_blocks.end(), 0);
      std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
      std::vector<std::vector<int32_t>> tables;
      size_t next = 0;
      const int64_t row = static_cast<int64_t>(hs.hkv) * hs.d;
      for (int64_t L : lens) {
        std::vector<int32_t> table((L + bs - 1) / bs);
        for (auto& b : table) b = free_blocks.at(next++);
        std::vector<float> k = RandVec(rng, L * row), v = RandVec(rng, L * row);
        for (size_t i = 0; i < k.size(); i += 7) k[i] = (i % 2 == 0) ? 0.0f : 3e-10f;  // 0, < 2^-30
        for (size_t i = 3; i < v.size(); i += 11) v[i] = (i % 2 == 0) ? 0.0f : -2e-10f;
        if (L == 300) {  // token 5: K and V rows of zeros
          std::fill_n(k.begin() + 5 * row, row, 0.0f);
          std::fill_n(v.begin() + 5 * row, row, 0.0f);
        }
        std::vector<int64_t> slots(L);
        for (int64_t j = 0; j < L; ++j) slots[j] = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
        ref::WriteKv(k.data(), v.data(), L, slots.data(), kv.layer);
        tables.push_back(std::move(table));
      }
      std::vector<int32_t> pos;
      std::vector<const int32_t*> bt;
      auto add = [&](size_t seq, int32_t from, int32_t to) {
        for (int32_t p = from; p < to; ++p) {
          pos.push_back(p);
          bt.push_back(tables[seq].data());
        }
      };
      add(0, 0, 1);      // one key
      add(1, 0, 2);      // a tile of 2 queries: rows that see 1 and 2 keys
      add(2, 1, 3);      // 2 and 3 keys
      add(3, 16, 17);    // 17 keys: a last key without its pair
      add(4, 63, 65);    // across a chunk boundary
      add(5, 0, 131);    // a whole prompt: staged tiles with ragged diagonal chunks
      add(6, 250, 252);  // decode-like queries deep in a sequence
      add(6, 299, 300);
      std::vector<float> q = RandVec(rng, static_cast<int64_t>(pos.size()) * hs.hq * hs.d, -3.0f, 3.0f);
      for (size_t i = 0; i < q.size(); i += 2) q[i] *= 20.0f;  // sharp softmax: many p flush to 0
      const float scale = 1.0f / std::sqrt(static_cast<float>(hs.d));
      const int64_t T = pos.size();
      std::vector<float> want(q.size()), reference(q.size());
      cpu::SetIsa(cpu::Isa::kAvx2);
      cpu::PagedAttention(pool, q.data(), T, hs.hq, pos.data(), bt.data(), kv.layer, scale, want.data());
      ASSERT_TRUE(AllFinite(want));
      ref::PagedAttention(q.data(), T, hs.hq, pos.data(), bt.data(), kv.layer, scale, reference.data());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(want[i], reference[i], ReducedPrecisionAttentionTolerance(dt))
            << "i=" << i << " d=" << hs.d << " kv " << static_cast<int>(dt);
      }
      for (cpu::Isa isa : kIsasBesideAvx2) {
        if (!cpu::IsaSupported(isa)) continue;
        cpu::SetIsa(isa);
        std::vector<float> got(q.size(), -1.0f);
        cpu::PagedAttention(pool, q.data(), T, hs.hq, pos.data(), bt.data(), kv.layer, scale, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << cpu::IsaName(isa) << " d=" << hs.d << " kv " << static_cast<int>(dt);
        ++compared;
      }
    }
  }
  cpu::SetIsa(saved);
  EXPECT_GT(compared, 0);
  std::printf("%s\n%s\n",
              cpu::Avx512Bf16Supported()
                  ? "bf16 KV attention: vdpbf16ps matched the f32 path on every shape"
                  : "NOT RUN: bf16 KV's native vdpbf16ps path (no AVX-512 BF16 here); the f32 "
                    "path was compared across the other SIMD paths",
              cpu::IsaSupported(cpu::Isa::kAvx512Vnni)
                  ? "int8 KV attention: vpdpbusd scores and p V matched the f32 path (d = 64, 128)"
                  : "NOT RUN: int8 KV's native vpdpbusd path (no AVX-512 VNNI here); the f32 path "
                    "was compared across the other SIMD paths");
}

// Packed weights (cpu::PackWeight: 16-row groups, blocks contiguous, read with plain loads)
// give bitwise what the same matrix gives unpacked, on every SIMD path, at every T (the
// 8-token passes and their remainders of 1-7) and row count (partial last groups; thread
// ranges of whole groups), through MatMul and through MatMulShared with packed and unpacked
// matrices side by side; and they stay finite and within the reference's tolerance.
TEST(CrossBackend, PackedMatMulIsBitwiseUnpacked) {
  if (!cpu::IsaSupported(cpu::Isa::kAvx2)) GTEST_SKIP() << "no AVX2: no packed kernels to compare";
  std::mt19937 rng(21);
  cpu::ThreadPool pool(3);
  const cpu::Isa saved = cpu::ActiveIsa();
  int compared = 0;
  for (const TypeInfo& ti : AllTypes()) {
    const bool packable = ti.type == GgmlType::kQ4_0 || ti.type == GgmlType::kQ4_1 || ti.type == GgmlType::kQ8_0;
    if (!packable) {
      if (ti.block > 1) {
        EXPECT_EQ(cpu::PackedWeightBytes(RandWeights(rng, ti, 16, 512).m), 0) << ti.name;
      }
      continue;
    }
    for (int64_t cols : {32, 160, 576}) {
      for (int64_t rows : {1, 5, 15, 16, 17, 40, 67}) {
        Weights w = RandWeights(rng, ti, rows, cols);
        const int64_t bytes = cpu::PackedWeightBytes(w.m);
        ASSERT_EQ(bytes, (rows + 15) / 16 * (cols / 32) * (ti.type == GgmlType::kQ8_0 ? 576 : 320)) << ti.name;
        WeightMatrix wp = w.m;
        const std::unique_ptr<uint8_t[]> buf = cpu::PackWeightCopy(&wp);
        ASSERT_NE(wp.packed, nullptr);
        const std::vector<float> wf = DequantAll(w.m);
        for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17}) {
          std::vector<float> x = RandVec(rng, T * cols, -2.0f, 2.0f), yr(T * rows);
          ref::MatMul(w.m, x.data(), T, yr.data());
          for (cpu::Isa isa : cpu::AllIsas()) {
            if (isa == cpu::Isa::kGeneric) continue;  // unpacked only
            if (!cpu::IsaSupported(isa)) continue;
            cpu::SetIsa(isa);
            std::vector<float> want(T * rows), got(T * rows, -1.0f);
            cpu::MatMul(pool, w.m, x.data(), T, want.data());
            cpu::MatMul(pool, wp, x.data(), T, got.data());
            ASSERT_TRUE(AllFinite(got));
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
                << cpu::IsaName(isa) << " " << ti.name << " rows=" << rows << " cols=" << cols << " T=" << T;
            for (int64_t t = 0; t < T; ++t) {
              for (int64_t n = 0; n < rows; ++n) {
                double mag = 0;
                for (int64_t k = 0; k < cols; ++k) mag += std::fabs(wf[n * cols + k] * x[t * cols + k]);
                ASSERT_NEAR(got[t * rows + n], yr[t * rows + n], 1e-5 * mag + 1e-30) << ti.name;
              }
            }
            // Shared with an unpacked matrix of the same shape: each keeps its own path.
            const WeightMatrix ws[2] = {wp, w.m};
            std::vector<float> y0(T * rows), y1(T * rows);
            float* ys[2] = {y0.data(), y1.data()};
            cpu::MatMulShared(pool, ws, 2, x.data(), T, ys);
            ASSERT_EQ(y0, want) << cpu::IsaName(isa) << " shared, packed";
            ASSERT_EQ(y1, want) << cpu::IsaName(isa) << " shared, unpacked";
            ++compared;
          }
        }
      }
    }
  }
  cpu::SetIsa(saved);
  EXPECT_GT(compared, 0);
}

TEST(CrossBackend, GenericMatMulIsBitwiseReference) {
  std::mt19937 rng(17);
  cpu::ThreadPool pool(2);
  const cpu::Isa saved = cpu::ActiveIsa();
  cpu::SetIsa(cpu::Isa::kGeneric);
  for (const TypeInfo& ti : AllTypes()) {
    const int64_t cols = ti.block == 256 ? 512 : 96, rows = 11, T = 6;
    Weights w = RandWeights(rng, ti, rows, cols);
    std::vector<float> x = RandVec(rng, T * cols), a(T * rows), b(T * rows);
    cpu::MatMul(pool, w.m, x.data(), T, a.data());
    ref::MatMul(w.m, x.data(), T, b.data());
    EXPECT_EQ(a, b) << ti.name;
  }
  cpu::SetIsa(saved);
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 5, 64, 1000, 100003}) {
      for (int64_t grain : {1, 7, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.ParallelFor(n, [&](int64_t b, int64_t e) {
          ASSERT_LE(0, b);
          ASSERT_LT(b, e);
          ASSERT_LE(e, n);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        }, grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << grain;
      }
    }
    // Nested calls run inline; many short calls in a row (decode-like).
    std::atomic<int64_t> total{0};
    for (int rep = 0; rep < 500; ++rep) {
      pool.ParallelFor(8, [&](int64_t b, int64_t e) {
        pool.ParallelFor(3, [&](int64_t b2, int64_t e2) { total += (e - b) * (e2 - b2); });
      });
    }
    EXPECT_EQ(total.load(), 500 * 8 * 3);
  }
  EXPECT_GE(cpu::ThreadPool::AvailableCpus(), 1);
}

// Each thread runs its own share of the chunks front to back and helps with the other's from
// its back, so with two threads every share is one thread's run, then (perhaps) the other's,
// whatever the timing. A shared counter interleaves them.
TEST(ThreadPool, ThreadsKeepTheirSharesContiguous) {
  cpu::ThreadPool pool(2);
  const int64_t n = 16;  // one item per chunk: 8 chunks a thread
  int interleaved = 0, helped = 0;
  for (int rep = 0; rep < 300; ++rep) {
    std::vector<std::thread::id> by(static_cast<size_t>(n));
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) by[i] = std::this_thread::get_id();
      if (rep % 3 == 0) std::this_thread::yield();  // let the shares' ends meet elsewhere
    });
    for (int64_t lo : {int64_t{0}, n / 2}) {
      int switches = 0;
      for (int64_t i = lo + 1; i < lo + n / 2; ++i) switches += by[i] != by[i - 1];
      interleaved += switches > 1;
      helped += switches == 1;
    }
  }
  EXPECT_EQ(interleaved, 0) << "a share's chunks alternated between the threads";
  std::printf("shares finished by the other thread: %d of 600\n", helped);
}

// The spin budget as a timeline: steps one hop apart teach the workers to spin across the hop;
// an idle spell brings the budget back down; nothing leaves [kMinSpin, kMaxSpin].
TEST(ThreadPool, SpinBudgetFollowsTheGapsBetweenJobs) {
  using std::chrono::microseconds;
  using std::chrono::nanoseconds;
  const nanoseconds lo = cpu::kMinSpinBudget, hi = cpu::kMaxSpinBudget;
  nanoseconds b = lo;
  // A service's steps 0.35 ms apart: the first sleep teaches 0.7 ms, which covers the next.
  b = cpu::NextSpinBudget(b, microseconds(350));
  EXPECT_EQ(b, microseconds(700));
  // A shorter gap than the budget (the worker slept a moment before the job) never shrinks it.
  EXPECT_EQ(cpu::NextSpinBudget(b, microseconds(320)), microseconds(700));
  // Gaps near kMaxSpin / 2 grow it to the cap, and no further.
  b = cpu::NextSpinBudget(b, hi / 2);
  EXPECT_EQ(b, hi);
  EXPECT_EQ(cpu::NextSpinBudget(b, hi / 2), hi);
  // Idle spells (the service had nothing to do): halve back to the floor and stay there.
  b = cpu::NextSpinBudget(b, std::chrono::milliseconds(50));
  EXPECT_EQ(b, hi / 2);
  for (int i = 0; i < 10; ++i) b = cpu::NextSpinBudget(b, std::chrono::seconds(1));
  EXPECT_EQ(b, lo);
  // Waiting out another model's step (a gap above kMaxSpin / 2) never teaches a long spin.
  EXPECT_EQ(cpu::NextSpinBudget(lo, hi / 2 + microseconds(1)), lo);
  // A wake-up right after the budget ran out keeps at least the floor.
  EXPECT_EQ(cpu::NextSpinBudget(lo, microseconds(10)), lo);
}

// Workers that slept through idle spells of varied length still take every job.
TEST(ThreadPool, JobsAfterIdleSpellsAllRun) {
  cpu::ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int gap_us : {0, 100, 400, 900, 2000, 5000, 250}) {
    std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    for (int rep = 0; rep < 20; ++rep) {
      pool.ParallelFor(64, [&](int64_t b, int64_t e) { total += e - b; });
    }
  }
  EXPECT_EQ(total.load(), 7 * 20 * 64);
}

}  // namespace
}  // namespace specd::kernels
