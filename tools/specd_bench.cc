// specd-bench: engine throughput on one model, with baselines measured in the same run.
//   decode tok/s at batch 1/4/16, prefill tok/s for 128- and 512-token prompts, peak RSS,
//   the machine's memory read bandwidth and the resulting decode roofline
//   (weight bytes per step / bandwidth), and — when llama-cpp-python is importable (by
//   --llama-cpp-python PYTHON, $SPECD_LLAMA_CPP_PYTHON or python3) —
//   llama.cpp's decode (batch 1/4/16) and prefill on the same file and thread count, as ratios.
// --device cuda[:N] runs the decode, --depth and --prefill model on that backend instead.
// --cost-model DRAFT.gguf: the speculation cost model of -m and DRAFT (tools/cost_model_bench.h).
// This is a benchmark, not a test: it prints figures and asserts nothing.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "common/gguf/gguf_file.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "tools/cost_model_bench.h"
#include "tools/spec_bench.h"

namespace specd {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Read bandwidth: each thread sums its share of a 512 MiB buffer; best of 5 passes.
double MeasureReadBandwidth(int threads) {
  const size_t bytes = size_t{512} << 20;
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  kernels::cpu::ThreadPool pool(threads);
  std::vector<uint64_t> sums(1024);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    pool.ParallelFor(
        1024,
        [&](int64_t b, int64_t e) {
          for (int64_t c = b; c < e; ++c) {
            const uint64_t* p = buf.data() + c * (n / 1024);
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = 0; i < n / 1024; i += 4) {
              s0 += p[i];
              s1 += p[i + 1];
              s2 += p[i + 2];
              s3 += p[i + 3];
            }
            sums[c] = s0 + s1 + s2 + s3;
          }
        },
        16);
    const double gbs = bytes / Seconds(t0, Clock::now()) / 1e9;
    best = std::max(best, gbs);
  }
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  if (total == 42) std::printf(" ");  // keep the sums alive
  return best;
}

// Seconds per decode step to read the KV of one sequence at `depth` the way attention reads
// it, with no arithmetic but a sum: per layer one parallel region over items of (chunk, kv
// head) in chunk-major order, each reading its 16-key blocks' K slab and V rows (and int8's
// scales) from a pool laid out as the real one ([block][kv head][...]), and requesting the
// item two ahead into L2 as attention does. Best of 5 passes. The paged pattern reads slower
// than one long stream, so this, not MeasureReadBandwidth, is the floor of attention's reads.
double MeasureKvReadSeconds(const engine::KvCacheConfig& kc, int depth, int threads) {
  constexpr int64_t kChunkKeys = 64;  // the CPU kernels' attention chunk (kAttnChunk)
  const int64_t bs = kc.block_size, heads = kc.num_kv_heads;
  const int64_t chunk_blocks = std::max<int64_t>(1, kChunkKeys / bs);
  const int64_t blocks = (depth + bs - 1) / bs;
  const int64_t chunks = (blocks + chunk_blocks - 1) / chunk_blocks;
  const int64_t row_bytes = kc.head_dim * static_cast<int64_t>(engine::KvDtypeBytes(kc.dtype));
  const int64_t slab_words = bs * row_bytes / 8;  // one block's K (or V) of one kv head
  const int64_t scale_words = kc.dtype == kernels::KvDtype::kInt8 ? bs * 4 / 8 : 0;
  struct Pool {
    std::vector<uint64_t> k, v, ks, vs;
  };
  std::vector<Pool> layers(static_cast<size_t>(kc.num_layers));
  for (Pool& l : layers) {
    const size_t slabs = static_cast<size_t>(blocks * heads);
    l.k.assign(slabs * slab_words, 1);
    l.v.assign(slabs * slab_words, 1);
    l.ks.assign(slabs * scale_words, 1);
    l.vs.assign(slabs * scale_words, 1);
  }
  // fn(words, n) for each contiguous run an item reads.
  const auto for_runs = [&](const Pool& l, int64_t item, auto&& fn) {
    const int64_t c = item / heads, h = item % heads;
    const int64_t end = std::min(blocks, (c + 1) * chunk_blocks);
    for (int64_t at = c * chunk_blocks * heads + h; at < end * heads; at += heads) {
      fn(l.k.data() + at * slab_words, slab_words);
      fn(l.v.data() + at * slab_words, slab_words);
      if (scale_words > 0) {
        fn(l.ks.data() + at * scale_words, scale_words);
        fn(l.vs.data() + at * scale_words, scale_words);
      }
    }
  };
  const auto prefetch = [](const uint64_t* p, int64_t n) {
    for (int64_t w = 0; w < n; w += 8) __builtin_prefetch(p + w, 0, 2);
  };
  kernels::cpu::ThreadPool pool(threads);
  std::vector<uint64_t> sums(static_cast<size_t>(chunks * heads));
  double best = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    for (const Pool& l : layers) {
      pool.ParallelFor(chunks * heads, [&](int64_t b, int64_t e) {
        for (int64_t item = b; item < e; ++item) {
          if (item == b && item + 1 < e) for_runs(l, item + 1, prefetch);
          if (item + 2 < e) for_runs(l, item + 2, prefetch);
          uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
          for_runs(l, item, [&](const uint64_t* p, int64_t n) {
            for (int64_t i = 0; i + 3 < n; i += 4) {  // n: a multiple of 4 (16-key blocks)
              s0 += p[i];
              s1 += p[i + 1];
              s2 += p[i + 2];
              s3 += p[i + 3];
            }
          });
          sums[static_cast<size_t>(item)] = s0 + s1 + s2 + s3;
        }
      }, 1);
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  if (total == 42) std::printf(" ");  // keep the sums alive
  return best;
}

// Runs MeasureReadBandwidth in a child process so its buffer never counts in our peak RSS.
double MeasureReadBandwidthIsolated(int threads) {
  int fds[2];
  if (pipe(fds) != 0) return MeasureReadBandwidth(threads);
  const pid_t pid = fork();
  if (pid == 0) {
    const double gbs = MeasureReadBandwidth(threads);
    if (write(fds[1], &gbs, sizeof gbs) != sizeof gbs) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  double gbs = 0;
  if (read(fds[0], &gbs, sizeof gbs) != sizeof gbs) gbs = 0;
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  return gbs;
}

double PeakRssMiB() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

struct Runner {
  engine::LlamaModel* model;
  engine::PagedKvCache* kv;
  std::vector<float> logits;

  // Decode `steps` tokens for `batch` sequences after a short prompt; returns tok/s.
  double Decode(int batch, int prompt_len, int steps) {
    engine::ForwardBatch b;
    std::vector<int32_t> prompt(prompt_len);
    for (int i = 0; i < prompt_len; ++i) prompt[i] = 100 + i;
    for (int s = 0; s < batch; ++s) {
      Check(kv->AddSequence(s));
      b.Clear();
      b.Add(s, 0, prompt.data(), prompt_len, false);
      Check(model->Forward(b, *kv, logits.data()));
    }
    std::vector<int32_t> next(batch, 300);
    const auto t0 = Clock::now();
    for (int step = 0; step < steps; ++step) {
      b.Clear();
      for (int s = 0; s < batch; ++s) b.Add(s, prompt_len + step, &next[s], 1, false);
      Check(model->Forward(b, *kv, logits.data()));
      for (int s = 0; s < batch; ++s) {
        const float* row = logits.data() + static_cast<size_t>(s) * model->vocab_size();
        next[s] = static_cast<int32_t>(std::max_element(row, row + model->vocab_size()) - row);
      }
    }
    const double secs = Seconds(t0, Clock::now());
    for (int s = 0; s < batch; ++s) kv->FreeSequence(s);
    return batch * steps / secs;
  }

  // Adds sequence `seq` with the KV of its first `len` tokens (prefilled in chunks, untimed).
  void PrefillSequence(engine::SeqId seq, const int32_t* ids, int len) {
    Check(kv->AddSequence(seq));
    engine::ForwardBatch b;
    for (int done = 0; done < len;) {
      const int n = std::min(len - done, model->options().max_batch_tokens);
      b.Clear();
      b.Add(seq, done, ids + done, n, false);
      Check(model->Forward(b, *kv, logits.data()));
      done += n;
    }
  }

  // Decode `steps` tokens of one sequence whose context is already `depth` tokens (prefilled
  // in chunks first, not timed); returns tok/s.
  double DecodeAtDepth(int depth, int steps) {
    std::vector<int32_t> prompt(depth);
    for (int i = 0; i < depth; ++i) prompt[i] = 100 + (i * 7) % 5000;
    constexpr engine::SeqId kSeq = 2000;
    PrefillSequence(kSeq, prompt.data(), depth);
    engine::ForwardBatch b;
    int32_t next = 300;
    const auto t0 = Clock::now();
    for (int step = 0; step < steps; ++step) {
      b.Clear();
      b.Add(kSeq, depth + step, &next, 1, false);
      Check(model->Forward(b, *kv, logits.data()));
      next = static_cast<int32_t>(
          std::max_element(logits.data(), logits.data() + model->vocab_size()) - logits.data());
    }
    const double secs = Seconds(t0, Clock::now());
    kv->FreeSequence(kSeq);
    return steps / secs;
  }

  // Verification at depth: forwards of 1 .. max_rows tokens (every row's logits, as a
  // speculative step asks) at positions depth .. of one sequence, the row counts interleaved
  // `reps` times (the rows truncated after each) so the machine's drift falls on all alike;
  // returns the median seconds a forward, [rows - 1].
  std::vector<double> VerifyAtDepth(int depth, int max_rows, int reps) {
    constexpr engine::SeqId kSeq = 2001;
    std::vector<int32_t> ids(depth + max_rows);
    for (int i = 0; i < depth + max_rows; ++i) ids[i] = 100 + (i * 7) % 5000;
    PrefillSequence(kSeq, ids.data(), depth);
    engine::ForwardBatch b;
    std::vector<std::vector<double>> secs(max_rows);
    for (int rep = 0; rep < reps; ++rep) {
      for (int rows = 1; rows <= max_rows; ++rows) {
        b.Clear();
        b.Add(kSeq, depth, ids.data() + depth, rows, /*all_logits=*/true);
        const auto t0 = Clock::now();
        Check(model->Forward(b, *kv, logits.data()));
        secs[rows - 1].push_back(Seconds(t0, Clock::now()));
        Check(kv->Truncate(kSeq, depth));
      }
    }
    kv->FreeSequence(kSeq);
    std::vector<double> median;
    for (std::vector<double>& v : secs) {
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      median.push_back(v[v.size() / 2]);
    }
    return median;
  }

  double Prefill(int len, int reps) {
    std::vector<int32_t> prompt(len);
    for (int i = 0; i < len; ++i) prompt[i] = 100 + (i * 7) % 5000;
    double best = 0;
    for (int r = 0; r < reps; ++r) {
      Check(kv->AddSequence(1000));
      engine::ForwardBatch b;
      const auto t0 = Clock::now();
      for (int done = 0; done < len;) {
        const int n = std::min(len - done, model->options().max_batch_tokens);
        b.Clear();
        b.Add(1000, done, prompt.data() + done, n, false);
        if (done + n < len) b.logit_rows.clear();
        Check(model->Forward(b, *kv, logits.data()));
        done += n;
      }
      best = std::max(best, len / Seconds(t0, Clock::now()));
      kv->FreeSequence(1000);
    }
    return best;
  }

  static void Check(const absl::Status& st) {
    if (!st.ok()) {
      std::fprintf(stderr, "specd-bench: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
};

// Attention alone, as a prefill of `len` tokens in chunks of `chunk` runs it: each chunk's
// queries against the keys so far, with the model's head shapes on one layer's paged KV
// (f16, bf16 or int8 as kv_dtype says; random values), times the model's layers;
// best of `reps`, in seconds. The engine's own kernel (kernels::cpu::PagedAttention) on the
// threads of `pool`.
double PrefillAttentionSeconds(const engine::ModelConfig& cfg, int len, int chunk, int reps,
                               kernels::KvDtype kv_dtype, kernels::cpu::ThreadPool& pool) {
  const int32_t hq = cfg.num_heads, hkv = cfg.num_kv_heads, d = cfg.head_dim, bs = 16;
  const int64_t blocks = (len + bs - 1) / bs;
  std::vector<uint16_t> k(blocks * hkv * bs * d), v(k.size());
  uint32_t x = 12345;
  const bool bf16 = kv_dtype == kernels::KvDtype::kBF16;  // else f16
  auto next = [&] {  // xorshift: f16 or bf16 values in about [-1, 1)
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    return bf16 ? static_cast<uint16_t>(0x3F00 + (x & 0x7f) + ((x >> 10) & 1) * 0x8000)
                : static_cast<uint16_t>(0x3800 + (x & 0x3ff) + ((x >> 10) & 1) * 0x8000);
  };
  for (auto& e : k) e = next();
  for (auto& e : v) e = next();
  kernels::PagedKvLayer layer{kv_dtype, k.data(), v.data(), blocks, bs, hkv, d};
  // int8: the same bits read as codes (half the pool), scales about 1/127.
  std::vector<float> scales(static_cast<size_t>(blocks) * hkv * bs, 1.0f / 127.0f);
  if (kv_dtype == kernels::KvDtype::kInt8) {
    layer.k_scale = scales.data();
    layer.v_scale = scales.data();
  }
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
  std::vector<float> q(static_cast<size_t>(chunk) * hq * d), out(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(static_cast<int>(i % 17) - 8) / 8.0f;
  std::vector<int32_t> positions(chunk);
  std::vector<const int32_t*> tables(chunk, table.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int done = 0; done < len; done += chunk) {
      const int n = std::min(chunk, len - done);
      for (int i = 0; i < n; ++i) positions[i] = done + i;
      kernels::cpu::PagedAttention(pool, q.data(), n, hq, positions.data(), tables.data(), layer,
                                   scale, out.data());
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return best * cfg.num_layers;
}

struct LlamaCppFigures {
  bool importable = false;  // `python -c 'import llama_cpp'` succeeded
  bool ok = false;          // and the bench printed its figures
  double decode = 0, prefill128 = 0, prefill512 = 0;
  double batch4 = 0, batch16 = 0;  // decode tok/s, 0 when the script did not print them
  std::string version = "?";  // llama-cpp-python's
  std::vector<std::pair<int, double>> prefill_at;  // --prefill mode: (length, tok/s)
};

// Single-quotes `s` for /bin/sh: paths may hold spaces.
std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs tools/llama_cpp_bench.py with `python` (any interpreter that can import llama_cpp,
// e.g. the venv of scripts/install_llama_cpp_python.sh). The script's stderr is left through
// so that a failure is visible; the import probe stays quiet, as "not installed" is normal.
// With prefill_lengths (e.g. "512,4096") the script measures only prefill at those lengths.
LlamaCppFigures RunLlamaCpp(const std::string& python, const std::string& script,
                            const std::string& model, int threads,
                            const std::string& prefill_lengths = "") {
  LlamaCppFigures f;
  const std::string py = ShellQuote(python);
  f.importable = std::system((py + " -c 'import llama_cpp' >/dev/null 2>&1").c_str()) == 0;
  if (!f.importable) return f;
  std::string cmd = absl::StrFormat("%s %s %s %d", py, ShellQuote(script), ShellQuote(model),
                                    threads);
  if (!prefill_lengths.empty()) cmd += " --prefill-lengths " + ShellQuote(prefill_lengths);
  std::fflush(stdout);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return f;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    double a, b, c;
    char version[64];
    if (std::sscanf(line, "llama.cpp decode=%lf prefill128=%lf prefill512=%lf", &a, &b, &c) == 3) {
      f.ok = a > 0 && b > 0 && c > 0;
      f.decode = a;
      f.prefill128 = b;
      f.prefill512 = c;
    } else if (std::sscanf(line, "llama.cpp batch4=%lf batch16=%lf", &a, &b) == 2) {
      f.batch4 = a;
      f.batch16 = b;
    } else if (int n = 0; std::sscanf(line, "llama.cpp prefill_len=%d tok_s=%lf", &n, &a) == 2) {
      f.prefill_at.emplace_back(n, a);
      f.ok = a > 0;
    } else if (std::sscanf(line, "llama-cpp-python version=%63s", version) == 1) {
      f.version = version;
    }
  }
  if (pclose(p) != 0) f.ok = false;
  return f;
}

// Prefill tok/s at each length (one sequence, in max_batch_tokens chunks, best of 2), each as
// a ratio of the first length's figure; attention's share of it (the same shapes timed
// alone) and attention's float-FLOP floor at the FMA rate measured now.
// Returns each length's tok/s.
std::vector<double> PrintPrefillAtLengths(Runner& r, const engine::LlamaModel& model,
                                          const std::vector<int>& lengths, int threads,
                                          kernels::KvDtype kv_dtype) {
  std::vector<double> figures;
  kernels::cpu::ThreadPool pool(threads);
  const double gflops = kernels::cpu::MeasureFloatGflops(pool);
  const engine::ModelConfig& cfg = model.config();
  const int chunk = model.options().max_batch_tokens;
  // Attention timed alone reads the run's KV dtype (f16 for f32).
  const kernels::KvDtype timed = kv_dtype == kernels::KvDtype::kF32 ? kernels::KvDtype::kF16 : kv_dtype;
  std::printf("prefill at length (one sequence, chunks of %d, best of 2, KV %s); attention timed "
              "alone in the same shapes (KV %s); float FMA peak measured now: %.1f GFLOP/s on %d "
              "threads\n",
              chunk, engine::KvDtypeName(kv_dtype), engine::KvDtypeName(timed), gflops, threads);
  double first = 0;
  for (int len : lengths) {
    const double tps = r.Prefill(len, 2);
    figures.push_back(tps);
    if (first == 0) first = tps;
    const double total = len / tps;
    const double attn = PrefillAttentionSeconds(cfg, len, chunk, 2, timed, pool);
    // q.k and p.v: 2 flops per multiply-add, d of each per (query, head, key seen).
    const double flops = 4.0 * cfg.head_dim * cfg.num_heads * cfg.num_layers * 0.5 * len * (len + 1.0);
    const double floor = flops / (gflops * 1e9);
    std::printf("  prefill %5d: %8.1f tok/s (%.2fx of %d) | attention %.2f s of %.2f s (%.0f%%), "
                "its float floor %.2f s: %.0f%% of peak\n",
                len, tps, tps / first, lengths[0], attn, total, 100 * attn / total, floor,
                100 * floor / attn);
  }
  return figures;
}

// Prefill tok/s at each length with two KV dtypes on one model, alternating a, b, a, b (each
// figure the better of its two runs), and b / a from the same run.
void PrintPrefillPaired(Runner& a, kernels::KvDtype a_dtype, Runner& b, kernels::KvDtype b_dtype,
                        const std::vector<int>& lengths) {
  std::printf("prefill at length, KV %s against %s (one sequence, alternating, best of 2 each):\n",
              engine::KvDtypeName(b_dtype), engine::KvDtypeName(a_dtype));
  double a_first = 0, b_first = 0;
  for (int len : lengths) {
    double ta = 0, tb = 0;
    for (int round = 0; round < 2; ++round) {
      ta = std::max(ta, a.Prefill(len, 1));
      tb = std::max(tb, b.Prefill(len, 1));
    }
    if (a_first == 0) a_first = ta, b_first = tb;
    std::printf("  prefill %5d: %s %8.1f tok/s (%.2fx of %d) | %s %8.1f tok/s (%.2fx of %d) | %s / %s = %.3fx\n",
                len, engine::KvDtypeName(a_dtype), ta, ta / a_first, lengths[0], engine::KvDtypeName(b_dtype), tb,
                tb / b_first, lengths[0], engine::KvDtypeName(b_dtype), engine::KvDtypeName(a_dtype), tb / ta);
  }
}

// tools/llama_cpp_bench.py: $SPECD_SOURCE_DIR/tools, else next to the binary, else the
// source tree this binary was configured from (the build dir holds no copy of the script).
std::string FindLlamaCppScript(const std::string& argv0) {
  if (const char* src = std::getenv("SPECD_SOURCE_DIR")) {
    return std::string(src) + "/tools/llama_cpp_bench.py";
  }
  const std::string beside = argv0.substr(0, argv0.rfind('/') + 1) + "llama_cpp_bench.py";
  if (access(beside.c_str(), R_OK) == 0) return beside;
#ifdef SPECD_LLAMA_CPP_BENCH_PY
  return SPECD_LLAMA_CPP_BENCH_PY;
#else
  return beside;
#endif
}

int Main(int argc, char** argv) {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 0, steps = 64;
  bool with_llama_cpp = true;
  // Interpreter for the llama.cpp comparison: --llama-cpp-python, else $SPECD_LLAMA_CPP_PYTHON.
  std::string llama_python = "python3";
  if (const char* py = std::getenv("SPECD_LLAMA_CPP_PYTHON"); py != nullptr && *py != 0) {
    llama_python = py;
  }
  int only_batch = 0;  // --only-decode N: just decode at batch N, for profiling
  std::vector<int> depths;  // --depth N,N,...: decode at these context lengths, bytes per step
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;  // --kv-dtype: of --depth and --prefill
  // --kv-dtype-vs: --prefill also runs this dtype, alternating with --kv-dtype at each length,
  // and prints the ratio from the same run.
  kernels::KvDtype kv_dtype_vs = kernels::KvDtype::kF16;
  bool with_vs = false;
  bool verify_at_depth = false;  // --verify: with --depth, verify(k+1) / verify(1) at each depth
  std::vector<int> prefill_lens;  // --prefill N,N,...: prefill at these prompt lengths
  std::string prefill_arg;
  std::string device = "cpu";  // --device: where the decode / --depth / --prefill model runs
  bool spec_bench = false;  // --spec: speculative decoding figures (tools/spec_bench.h)
  SpecBenchOptions spec;
  std::string cost_model_draft;  // --cost-model DRAFT.gguf (tools/cost_model_bench.h)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "-m" || a == "--model") && i + 1 < argc) {
      model_path = argv[++i];
    } else if ((a == "-t" || a == "--threads") && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &threads)) return 2;
    } else if (a == "--steps" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &steps)) return 2;
    } else if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else if (a == "--only-decode" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &only_batch) || only_batch < 1 || only_batch > 16) {
        std::fprintf(stderr, "specd-bench: --only-decode: expected a batch of 1 to 16\n");
        return 2;
      }
    } else if ((a == "--kv-dtype" || a == "--kv-dtype-vs") && i + 1 < argc) {
      absl::StatusOr<kernels::KvDtype> dt = engine::ParseKvDtype(argv[++i]);
      if (!dt.ok()) {
        std::fprintf(stderr, "specd-bench: %s: %s\n", a.c_str(), std::string(dt.status().message()).c_str());
        return 2;
      }
      (a == "--kv-dtype" ? kv_dtype : kv_dtype_vs) = *dt;
      if (a == "--kv-dtype-vs") with_vs = true;
    } else if (a == "--depth" && i + 1 < argc) {
      for (absl::string_view part : absl::StrSplit(argv[++i], ',')) {
        int d = 0;
        if (!absl::SimpleAtoi(part, &d) || d < 1 || d > 32768) {
          std::fprintf(stderr, "specd-bench: --depth: expected context lengths 1..32768, got %s\n",
                       std::string(part).c_str());
          return 2;
        }
        depths.push_back(d);
      }
    } else if (a == "--verify") {
      verify_at_depth = true;
    } else if (a == "--prefill" && i + 1 < argc) {
      prefill_arg = argv[++i];
      for (absl::string_view part : absl::StrSplit(prefill_arg, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 32768) {
          std::fprintf(stderr, "specd-bench: --prefill: expected prompt lengths 1..32768, got %s\n",
                       std::string(part).c_str());
          return 2;
        }
        prefill_lens.push_back(n);
      }
    } else if (a == "--no-llama-cpp") {
      with_llama_cpp = false;
    } else if (a == "--llama-cpp-python" && i + 1 < argc) {
      llama_python = argv[++i];
    } else if (a == "--spec") {
      spec_bench = true;
    } else if (a == "--spec-tokens" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &spec.new_tokens)) return 2;
    } else if (a == "--spec-prompts" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &spec.prompts)) return 2;
    } else if (a == "--self-draft" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &spec.self_layers)) return 2;
    } else if (a == "--no-pair") {
      spec.pair = false;
    } else if (a == "--distilled-only") {
      spec.distilled_only = true;
    } else if (a == "--no-distilled") {
      spec.distilled = false;
    } else if (a == "--draft" && i + 1 < argc) {
      spec.draft_path = argv[++i];
    } else if (a == "--prompts" && i + 1 < argc) {
      spec.prompts_file = argv[++i];
    } else if (a == "--distilled-k" && i + 1 < argc) {
      spec.distilled_fixed_k.clear();
      for (absl::string_view part : absl::StrSplit(argv[++i], ',')) {
        int k = 0;
        if (!absl::SimpleAtoi(part, &k) || k < 1 || k > 16) {
          std::fprintf(stderr, "specd-bench: --distilled-k: expected k values in [1, 16], got %s\n",
                       argv[i]);
          return 2;
        }
        spec.distilled_fixed_k.push_back(k);
      }
    } else if ((a == "--draft-min-keep" || a == "--draft-min-extend") && i + 1 < argc) {
      double& v = a == "--draft-min-keep" ? spec.draft_min_keep : spec.draft_min_extend;
      if (!absl::SimpleAtod(argv[++i], &v) || !(v >= 0) || v > 1) {
        std::fprintf(stderr, "specd-bench: %s: expected a probability in [0, 1], got %s\n",
                     a.c_str(), argv[i]);
        return 2;
      }
    } else if (a == "--spec-depth-keys" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &spec.depth_keys) || spec.depth_keys < 0) {
        std::fprintf(stderr, "specd-bench: --spec-depth-keys: expected a count >= 0, got %s\n",
                     argv[i]);
        return 2;
      }
    } else if (a == "--spec-batches" && i + 1 < argc) {
      spec.distilled_batches.clear();
      for (absl::string_view part : absl::StrSplit(argv[++i], ',')) {
        int b = 0;
        if (!absl::SimpleAtoi(part, &b) || b < 1 || b > 64) {
          std::fprintf(stderr, "specd-bench: --spec-batches: expected batches in [1, 64], got %s\n",
                       argv[i]);
          return 2;
        }
        spec.distilled_batches.push_back(b);
      }
    } else if (a == "--spec-temps" && i + 1 < argc) {
      spec.distilled_temps.clear();
      for (absl::string_view part : absl::StrSplit(argv[++i], ',')) {
        float t = 0;
        if (!absl::SimpleAtof(part, &t) || !(t >= 0) || t > 2) {
          std::fprintf(stderr, "specd-bench: --spec-temps: expected temperatures in [0, 2], got %s\n",
                       argv[i]);
          return 2;
        }
        spec.distilled_temps.push_back(t);
      }
    } else if (a == "--spec-pairs" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &spec.spec_pairs) || spec.spec_pairs < 0 ||
          spec.spec_pairs > 100) {
        std::fprintf(stderr, "specd-bench: --spec-pairs: expected 0..100 rounds, got %s\n",
                     argv[i]);
        return 2;
      }
    } else if (a == "--cost-model" && i + 1 < argc) {
      cost_model_draft = argv[++i];
    } else if (a == "--pair-only") {
      spec.pair_only = true;
    } else if (a == "--pair-type" && i + 1 < argc) {
      const std::string t = argv[++i];
      if (t != "f16" && t != "bf16" && t != "f32") {
        std::fprintf(stderr, "specd-bench: --pair-type: expected f16, bf16 or f32, got %s\n",
                     t.c_str());
        return 2;
      }
      spec.pair_types = {t};
    } else {
      std::fprintf(stderr,
                   "usage: specd-bench [-m FILE.gguf] [-t THREADS] [--device cpu|cuda[:N]] [--steps N] "
                   "[--no-llama-cpp | --llama-cpp-python PYTHON] [--only-decode BATCH]\n"
                   "       specd-bench --depth N[,N...] [-m FILE.gguf] [-t THREADS] [--steps N] [--kv-dtype f16|bf16|int8]\n"
                   "                   [--verify]  (verify(k+1)/verify(1), k = 1..8, at each depth instead of decode)\n"
                   "       specd-bench --prefill N[,N...] [-m FILE.gguf] [-t THREADS] "
                   "[--kv-dtype f16|bf16|int8] [--kv-dtype-vs DTYPE] [--no-llama-cpp | --llama-cpp-python PYTHON]\n"
                   "       specd-bench --spec [-m FILE.gguf] [-t THREADS] [--spec-tokens N] "
                   "[--spec-prompts N] [--self-draft L]\n"
                   "                    [--no-pair | --pair-only] [--pair-type f16|bf16|f32]\n"
                   "                    [--no-distilled | --distilled-only] [--draft FILE|default]\n"
                   "                    [--prompts FILE.jsonl] [--distilled-k 1,2,4] [--spec-pairs N]\n"
                   "                    [--spec-batches 1,8] [--spec-temps 0,0.8]\n"
                   "                    [--draft-min-keep P] [--draft-min-extend P]\n"
                   "                    [--spec-depth-keys N]  (adaptive k's calibration depth;"
                   " 0: context not priced)\n"
                   "  (the pairs' targets default to f16 and f32)\n"
                   "       specd-bench --cost-model DRAFT.gguf [-m TARGET.gguf] [-t THREADS] [--device D]\n");
      return 2;
    }
  }
  if (threads <= 0) threads = kernels::cpu::ThreadPool::AvailableCpus();
  if (!cost_model_draft.empty()) {
    CostModelOptions cm;
    cm.target_path = model_path;
    cm.draft_path = cost_model_draft;
    cm.device = device;
    cm.threads = threads;
    return RunCostModel(cm);
  }
  if (spec_bench) {
    spec.model_path = model_path;
    spec.threads = threads;
    spec.device = device;
    return RunSpecBench(spec);
  }

  auto file = gguf::GgufFile::Open(model_path);
  if (!file.ok()) {
    std::fprintf(stderr, "specd-bench: %s\n", file.status().ToString().c_str());
    return 1;
  }
  double bandwidth = 0;
  if (device == "cpu") {
    bandwidth = MeasureReadBandwidthIsolated(threads);
  } else {  // the device's own ceilings, this run
    absl::StatusOr<engine::DeviceCeilings> ceilings = engine::MeasureDeviceCeilings(device);
    if (!ceilings.ok()) {
      std::fprintf(stderr, "specd-bench: %s\n", ceilings.status().ToString().c_str());
      return 2;
    }
    std::printf("device %s: copy traffic %.0f GB/s, bf16 GEMM %.1f TFLOP/s (cuBLAS, 8192^3)\n", device.c_str(),
                ceilings->copy_gbs, ceilings->bf16_tflops);
    bandwidth = ceilings->copy_gbs;
  }
  absl::StatusOr<std::unique_ptr<engine::Backend>> made = engine::MakeBackend(device, threads);
  if (!made.ok()) {
    std::fprintf(stderr, "specd-bench: %s\n", made.status().ToString().c_str());
    return 2;
  }
  std::unique_ptr<engine::Backend> backend = std::move(*made);
  engine::LocalCommunicator comm;
  engine::ModelOptions opt;
  opt.max_batch_tokens = 512;
  opt.max_logit_rows = 16;
  auto model = engine::LlamaModel::Load(**file, backend.get(), &comm, opt);
  if (!model.ok()) {
    std::fprintf(stderr, "specd-bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  int max_depth = 0;
  for (int d : depths) max_depth = std::max(max_depth, d);
  for (int n : prefill_lens) max_depth = std::max(max_depth, n);
  const int32_t blocks = 16 * ((32 + steps) / 16 + 2) + 40 + (max_depth + steps) / 16 + 2;
  auto kv = engine::PagedKvCache::Create(
      (*model)->MakeKvCacheConfig(blocks, 16, kv_dtype));
  if (!kv.ok()) return 1;
  Runner r{model->get(), kv->get(), std::vector<float>(16 * (*model)->vocab_size())};
  std::unique_ptr<engine::PagedKvCache> kv_vs;  // --kv-dtype-vs: the same model on a second cache
  if (with_vs) {
    auto c = engine::PagedKvCache::Create((*model)->MakeKvCacheConfig(blocks, 16, kv_dtype_vs));
    if (!c.ok()) return 1;
    kv_vs = std::move(*c);
  }
  Runner r_vs{model->get(), kv_vs.get(), std::vector<float>(16 * (*model)->vocab_size())};

  const double weight_mb = (*model)->weight_bytes() / 1e6;
  const double roofline = bandwidth * 1e9 / (*model)->weight_bytes();
  std::printf("model: %s (%s), weights read per step %.1f MB, file %.1f MB, threads %d, kernels %s\n",
              model_path.c_str(), (*model)->config().name.c_str(), weight_mb,
              (*file)->file_size() / 1e6, threads,
              kernels::cpu::IsaName(kernels::cpu::ActiveIsa()));
  std::printf("memory read bandwidth: %.2f GB/s -> decode roofline %.1f tok/s\n", bandwidth,
              roofline);
  r.Decode(1, 8, 8);  // warm-up: page in the weights
  if (!depths.empty() && verify_at_depth) {
    // A speculative step's verification of k + 1 rows against one row, at each context depth
    // (the calibration the engine runs measures it at depth 0, where attention costs nothing).
    std::printf("verification at depth (batch 1, median of %d forwards, every row's logits, KV %s):\n", steps,
                engine::KvDtypeName((*kv)->config().dtype));
    for (int d : depths) {
      const std::vector<double> t = r.VerifyAtDepth(d, 9, steps);
      std::printf("  depth %5d: verify(1) %.3f ms, verify(k+1)/verify(1), k = 1..8:", d, 1e3 * t[0]);
      for (int rows = 2; rows <= 9; ++rows) std::printf(" %.2f", t[rows - 1] / t[0]);
      std::printf("\n");
    }
    return 0;
  }
  if (!depths.empty()) {
    // Decode at depth: bytes read per step = the weights + the sequence's whole KV (K and V,
    // every layer), against the read bandwidth measured above in this run.
    const engine::KvCacheConfig& kc = (*kv)->config();
    const double kv_bytes_per_token =
        2.0 * kc.num_layers * kc.num_kv_heads *
        (kc.head_dim * engine::KvDtypeBytes(kc.dtype) +
         (kc.dtype == kernels::KvDtype::kInt8 ? sizeof(float) : 0));  // int8: a scale per row
    const double short_ctx = r.DecodeAtDepth(32, steps);
    std::printf("decode at depth (batch 1, %d steps, KV %s %.1f KB/token):\n", steps,
                engine::KvDtypeName(kc.dtype), kv_bytes_per_token / 1e3);
    std::printf("  depth %5d: %8.1f tok/s  (the short-context baseline)\n", 32, short_ctx);
    for (int d : depths) {
      const double tps = r.DecodeAtDepth(d, steps);
      const double kv_mb = kv_bytes_per_token * (d + steps / 2.0) / 1e6;
      const double gbs = tps * ((*model)->weight_bytes() / 1e6 + kv_mb) / 1e3;
      std::printf("  depth %5d: %8.1f tok/s  (%.2fx short) | KV %.1f MB + weights %.1f MB per "
                  "step = %.2f GB/s, %.0f%% of the measured %.2f GB/s\n",
                  d, tps, tps / short_ctx, kv_mb, weight_mb, gbs, 100 * gbs / bandwidth,
                  bandwidth);
      if (device == "cpu") {
        // The floor: the short step plus this depth's KV read alone in attention's order.
        const double kv_read = MeasureKvReadSeconds(kc, d + steps / 2, threads);
        const double floor_tps = 1.0 / (1.0 / short_ctx + kv_read);
        std::printf("               KV read alone in attention's order: %.2f ms a step "
                    "(%.2f GB/s) -> floor %.1f tok/s (%.2fx short); measured %.0f%% of it\n",
                    kv_read * 1e3, kv_mb / 1e3 / kv_read, floor_tps, floor_tps / short_ctx,
                    100 * tps / floor_tps);
      }
    }
    return 0;
  }
  if (!prefill_lens.empty()) {
    if (with_vs) {
      PrintPrefillPaired(r, kv_dtype, r_vs, kv_dtype_vs, prefill_lens);
      return 0;
    }
    const std::vector<double> ours = PrintPrefillAtLengths(r, **model, prefill_lens, threads, kv_dtype);
    if (with_llama_cpp) {
      const LlamaCppFigures l = RunLlamaCpp(llama_python, FindLlamaCppScript(argv[0]), model_path,
                                            threads, prefill_arg);
      if (!l.ok) {
        std::printf("llama.cpp: not measured (%s cannot import llama_cpp or its script failed; "
                    "see scripts/install_llama_cpp_python.sh and --llama-cpp-python)\n",
                    llama_python.c_str());
      }
      for (const auto& [n, tps] : l.prefill_at) {
        double mine = 0;
        for (size_t i = 0; i < prefill_lens.size(); ++i) mine = prefill_lens[i] == n ? ours[i] : mine;
        std::printf("  llama.cpp (llama-cpp-python %s, same file and threads) prefill %5d: "
                    "%8.1f tok/s -> specd/llama.cpp = %.2fx\n", l.version.c_str(), n, tps, mine / tps);
      }
    }
    return 0;
  }
  if (only_batch > 0) {  // a steady decode loop to run under a profiler
    for (int rep = 0; rep < 5; ++rep) {
      std::printf("decode batch %d: %8.1f tok/s\n", only_batch, r.Decode(only_batch, 32, steps));
    }
    return 0;
  }
  // Best of 3, like the prefill figures and the bandwidth (best of 5): on a shared
  // machine the best run is the one least disturbed by other processes.
  auto best_decode = [&](int batch, int n) {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) best = std::max(best, r.Decode(batch, 32, n));
    return best;
  };
  const double d1 = best_decode(1, steps);
  const double d4 = best_decode(4, steps);
  const double d16 = best_decode(16, steps / 2);
  const double p128 = r.Prefill(128, 3);
  const double p512 = r.Prefill(512, 2);
  std::printf("decode batch 1:  %8.1f tok/s  (%.0f%% of roofline)\n", d1, 100 * d1 / roofline);
  std::printf("decode batch 4:  %8.1f tok/s  (%.2fx batch 1)\n", d4, d4 / d1);
  std::printf("decode batch 16: %8.1f tok/s  (%.2fx batch 1)\n", d16, d16 / d1);
  std::printf("prefill 128:     %8.1f tok/s\n", p128);
  std::printf("prefill 512:     %8.1f tok/s\n", p512);
  if (backend->replays_steps()) {  // CUDA graphs (SPECD_CUDA_GRAPHS=off: launch by launch)
    const engine::StepGraphStats g = backend->step_graph_stats();
    std::printf("step graphs: %lld replayed, %lld captured, %lld launched op by op, %lld discarded\n",
                static_cast<long long>(g.replays), static_cast<long long>(g.captures),
                static_cast<long long>(g.eager), static_cast<long long>(g.discarded));
  } else if (device != "cpu") {
    std::printf("step graphs: off\n");
  }
  const double file_mib = (*file)->file_size() / 1048576.0;
  const double kv_mib = (*kv)->pool_bytes() / 1048576.0;
  std::printf("peak RSS: %.1f MiB = model file %.1f MiB + KV pool %.1f MiB + %.1f MiB other "
              "(target: other <= 150 MiB)\n",
              PeakRssMiB(), file_mib, kv_mib, PeakRssMiB() - file_mib - kv_mib);
  if (with_llama_cpp) {
    const std::string script = FindLlamaCppScript(argv[0]);
    const LlamaCppFigures l = RunLlamaCpp(llama_python, script, model_path, threads);
    if (l.ok) {
      std::printf("llama.cpp (llama-cpp-python %s, same file, %d threads):\n", l.version.c_str(),
                  threads);
      std::printf("llama.cpp decode batch 1: %.1f tok/s -> specd/llama.cpp = %.2fx "
                  "(target >= 0.8x)\n",
                  l.decode, d1 / l.decode);
      if (l.batch4 > 0 && l.batch16 > 0) {
        std::printf("llama.cpp decode batch 4: %.1f tok/s (%.2fx its batch 1) -> %.2fx; "
                    "batch 16: %.1f tok/s (%.2fx its batch 1) -> %.2fx\n",
                    l.batch4, l.batch4 / l.decode, d4 / l.batch4, l.batch16, l.batch16 / l.decode,
                    d16 / l.batch16);
      }
      std::printf("llama.cpp prefill 128: %.1f tok/s -> %.2fx; prefill 512: %.1f tok/s -> "
                  "%.2fx\n",
                  l.prefill128, p128 / l.prefill128, l.prefill512, p512 / l.prefill512);
    } else if (!l.importable) {
      std::printf("llama.cpp: not measured (%s cannot import llama_cpp; see "
                  "scripts/install_llama_cpp_python.sh and --llama-cpp-python)\n",
                  llama_python.c_str());
    } else {
      std::printf("llama.cpp: not measured (%s %s failed)\n", llama_python.c_str(),
                  script.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
