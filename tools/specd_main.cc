// `specd`: the command-line front end. `specd generate` runs the engine in-process and
// streams text; prompt and generation speeds go to stderr.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "common/gguf/gguf_file.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tools/distill_data.h"
#include "tools/spec_generate.h"

namespace specd {
namespace {

constexpr char kUsage[] =
    "usage: specd generate -m FILE.gguf -p TEXT [options]\n"
    "       specd client generate|tokenize|health|info --server ADDR ... (a running cluster)\n"
    "       specd distill-data -m TARGET.gguf --prompts P.jsonl -o DATA.bin [--temperatures 0,0.8]\n"
    "            [--temperature-mode each|cycle] [-n 128] [--max-prompt-tokens 384] [--top 32]\n"
    "            [--batch 16] [--seed S] [--limit N]\n"
    "            (the target's responses and sparse next-token distributions, for specd-distill)\n"
    "       specd logits -m FILE.gguf [--borrow-from TARGET.gguf] --tokens 1,2,3 [--exact]\n"
    "                    [--kv-dtype f32|f16|bf16|int8] -o OUT\n"
    "            [--features F32FILE] [--hidden-out OUT2]  (a feature-conditioned draft's input\n"
    "            features [tokens, D]; the final hidden state of every token)\n"
    "       specd hidden -m TARGET.gguf --data DATA.bin -o OUT.bin [--max-tokens 256] [-t N]\n"
    "            (the target's final hidden states over a distill-data file, for specd-distill)\n"
    "  -m, --model FILE        GGUF model file\n"
    "  -p, --prompt TEXT       prompt text\n"
    "  --chat                  wrap the prompt as a user message in the model's chat template\n"
    "  -n, --max-new-tokens N  tokens to generate (default 128)\n"
    "  --temp T                temperature, 0 = greedy (default 0)\n"
    "  --top-k K  --top-p P  --min-p P\n"
    "  --repeat-penalty R  --presence-penalty P  --frequency-penalty P\n"
    "  --seed S                sampling seed (default 0)\n"
    "  --ignore-eos            keep generating past end-of-generation tokens\n"
    "  -t, --threads N         CPU threads (default: all cores)\n"
    "  --device cpu|cuda[:N]   where the model runs (default cpu; cuda needs a CUDA build)\n"
    "  --kv-blocks N           KV cache blocks of 16 tokens (default: enough for the request)\n"
    "  --kv-dtype f16|bf16|f32|int8 KV cache storage (default f16; int8: half the bytes;\n"
    "                          bf16: bf16 attention, faster long prompts on AVX-512 BF16)\n"
    "speculative decoding (in-process SpecEngine):\n"
    "  --draft [FILE.gguf]     draft model (same vocabulary as the target); alone or `default`:\n"
    "                          the distilled draft shipped for the target (drafts/<target>.draft.gguf)\n"
    "  --self-draft L          draft with the target's first L layers + its head\n"
    "  --ngram                 draft by prompt/n-gram lookup\n"
    "  --k N|auto              drafts per step (default 4); auto = adaptive, up to 8; with a\n"
    "                          model draft, auto also drafts from the n-gram lookup first\n"
    "  --no-lookup             --k auto: the model draft alone\n"
    "  --draft-min-keep P      a model draft's chain stops before the position that takes the\n"
    "                          product of its confidences below P (default 0.1)\n"
    "  --draft-min-extend P    ... and runs no further draft round once it is below P (default 0.5)\n"
    "  --target-weights f16|bf16|f32  re-encode the target's weights at load\n";

struct GenerateArgs {
  std::string model, prompt;
  bool chat = false;
  int max_new_tokens = 128;
  int threads = 0;
  std::string device = "cpu";
  int kv_blocks = 0;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;
  sampling::SamplingParams params;
  SpecGenerateOptions spec;  // speculation flags (tools/spec_generate.h)
};

absl::StatusOr<GenerateArgs> ParseGenerateArgs(int argc, char** argv) {
  GenerateArgs a;
  a.params.temperature = 0.0f;
  for (int i = 0; i < argc; ++i) {
    const std::string_view f = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(std::string(f), ": missing value"));
      return std::string(argv[++i]);
    };
    auto number = [&](auto* out) -> absl::Status {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      bool ok;
      if constexpr (std::is_same_v<std::remove_pointer_t<decltype(out)>, float>) {
        ok = absl::SimpleAtof(*v, out);
      } else if constexpr (std::is_same_v<std::remove_pointer_t<decltype(out)>, uint64_t>) {
        ok = absl::SimpleAtoi(*v, out);
      } else {
        ok = absl::SimpleAtoi(*v, out);
      }
      if (!ok) return absl::InvalidArgumentError(absl::StrCat(std::string(f), ": not a number: ", *v));
      return absl::OkStatus();
    };
    absl::Status st;
    if (f == "-m" || f == "--model") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      a.model = *v;
    } else if (f == "-p" || f == "--prompt") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      a.prompt = *v;
    } else if (f == "--chat") {
      a.chat = true;
    } else if (f == "--ignore-eos") {
      a.params.ignore_eos = true;
    } else if (f == "-n" || f == "--max-new-tokens") {
      st = number(&a.max_new_tokens);
    } else if (f == "--temp" || f == "--temperature") {
      st = number(&a.params.temperature);
    } else if (f == "--top-k") {
      st = number(&a.params.top_k);
    } else if (f == "--top-p") {
      st = number(&a.params.top_p);
    } else if (f == "--min-p") {
      st = number(&a.params.min_p);
    } else if (f == "--repeat-penalty") {
      st = number(&a.params.repetition_penalty);
    } else if (f == "--presence-penalty") {
      st = number(&a.params.presence_penalty);
    } else if (f == "--frequency-penalty") {
      st = number(&a.params.frequency_penalty);
    } else if (f == "--seed") {
      st = number(&a.params.seed);
    } else if (f == "-t" || f == "--threads") {
      st = number(&a.threads);
    } else if (f == "--device") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      a.device = *v;
      a.spec.device = *v;
    } else if (f == "--kv-blocks") {
      st = number(&a.kv_blocks);
    } else if (f == "--kv-dtype") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      absl::StatusOr<kernels::KvDtype> dt = engine::ParseKvDtype(*v);
      if (!dt.ok()) return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: ", dt.status().message()));
      a.kv_dtype = *dt;
    } else if (absl::StatusOr<bool> spec = ParseSpecFlag(argc, argv, &i, &a.spec); !spec.ok()) {
      return spec.status();
    } else if (!*spec) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", std::string(f)));
    }
    if (!st.ok()) return st;
  }
  if (a.model.empty()) return absl::InvalidArgumentError("-m/--model is required");
  if (a.prompt.empty()) return absl::InvalidArgumentError("-p/--prompt is required and non-empty");
  if (a.max_new_tokens <= 0) {
    return absl::InvalidArgumentError("-n/--max-new-tokens must be > 0");
  }
  return a;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

absl::Status Generate(const GenerateArgs& a) {
  if (a.spec.drafter.kind != spec::DrafterChoice::Kind::kNone || a.spec.target_weights) {
    SpecGenerateOptions o = a.spec;
    o.model = a.model;
    o.prompt = a.prompt;
    o.chat = a.chat;
    o.max_new_tokens = a.max_new_tokens;
    o.threads = a.threads;
    o.kv_blocks = a.kv_blocks;
    o.kv_dtype = a.kv_dtype;
    o.params = a.params;
    return SpecGenerate(o);
  }
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(a.model);
  if (!file.ok()) return file.status();
  absl::StatusOr<std::unique_ptr<tok::Tokenizer>> tokenizer = tok::Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) return tokenizer.status();
  const tok::Tokenizer& tk = **tokenizer;

  std::string text = a.prompt;
  if (a.chat) {
    absl::StatusOr<tok::ChatTemplate> tmpl = tok::ChatTemplate::FromGguf(**file);
    if (!tmpl.ok()) return tmpl.status();
    const tok::ChatMessage msg{"user", a.prompt};
    absl::StatusOr<std::string> applied = tmpl->Apply({&msg, 1}, /*add_generation_prompt=*/true);
    if (!applied.ok()) return applied.status();
    text = *applied;
  }
  absl::StatusOr<std::vector<int32_t>> prompt =
      tk.Encode(text, /*add_special=*/true, /*parse_special=*/a.chat);
  if (!prompt.ok()) return prompt.status();
  if (prompt->empty()) return absl::InvalidArgumentError("prompt encodes to no tokens");

  absl::StatusOr<std::unique_ptr<engine::Backend>> made = engine::MakeBackend(a.device, a.threads);
  if (!made.ok()) return made.status();
  std::unique_ptr<engine::Backend> backend = std::move(*made);
  engine::LocalCommunicator comm;
  engine::ModelOptions opt;
  opt.max_batch_tokens = 256;
  opt.max_logit_rows = 1;
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> model =
      engine::LlamaModel::Load(**file, backend.get(), &comm, opt);
  if (!model.ok()) return model.status();
  engine::LlamaModel& m = **model;
  absl::Status st = sampling::Validate(a.params, m.vocab_size());
  if (!st.ok()) return st;
  const int64_t total = static_cast<int64_t>(prompt->size()) + a.max_new_tokens;
  if (total > m.config().context_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt (%d tokens) + max_new_tokens (%d) exceeds the context length %d",
        prompt->size(), a.max_new_tokens, m.config().context_length));
  }
  const int32_t blocks = a.kv_blocks > 0 ? a.kv_blocks : static_cast<int32_t>((total + 15) / 16);
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv =
      engine::PagedKvCache::Create(m.MakeKvCacheConfig(blocks, 16, a.kv_dtype));
  if (!kv.ok()) return kv.status();
  if (!(st = (*kv)->AddSequence(0)).ok()) return st;

  std::vector<float> logits(m.vocab_size());
  engine::ForwardBatch batch;
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t n_prompt = static_cast<int32_t>(prompt->size());
  for (int32_t done = 0; done < n_prompt;) {
    const int32_t n = std::min(n_prompt - done, opt.max_batch_tokens);
    batch.Clear();
    batch.Add(0, done, prompt->data() + done, n, /*all_logits=*/false);
    if (done + n < n_prompt) batch.logit_rows.clear();
    if (!(st = m.Forward(batch, **kv, logits.data())).ok()) return st;
    done += n;
  }
  const auto t1 = std::chrono::steady_clock::now();

  sampling::PenaltyState history = sampling::PenaltyState::FromTokens(*prompt, {});
  const sampling::CounterRng rng(a.params.seed);
  tok::StreamingDetokenizer detok(tk, /*skip_special=*/true);
  std::vector<int32_t> eos;
  for (int32_t id : {tk.eos_id(), tk.eot_id()}) {
    if (id >= 0) eos.push_back(id);
  }
  int generated = 0;
  int32_t pos = n_prompt;
  std::string reason = "length";
  while (generated < a.max_new_tokens) {
    absl::StatusOr<sampling::SampledToken> s =
        sampling::Sample(logits, history, a.params, rng, pos);
    if (!s.ok()) return s.status();
    ++generated;
    const bool eog = !a.params.ignore_eos && tk.IsEndOfGeneration(s->token);
    if (eog || sampling::IsStopToken(a.params, eos, s->token)) {
      reason = "stop";
      break;
    }
    std::fputs(detok.Append(s->token).c_str(), stdout);
    std::fflush(stdout);
    history.AddGenerated(s->token);
    if (generated == a.max_new_tokens) break;
    batch.Clear();
    batch.Add(0, pos, &s->token, 1, false);
    if (!(st = m.Forward(batch, **kv, logits.data())).ok()) return st;
    ++pos;
  }
  std::fputs(detok.Finish().c_str(), stdout);
  std::fputs("\n", stdout);
  const auto t2 = std::chrono::steady_clock::now();
  std::fprintf(stderr,
               "\n[specd] prompt: %d tokens in %.3f s (%.1f tok/s); generation: %d tokens in "
               "%.3f s (%.1f tok/s); finish: %s\n",
               n_prompt, Seconds(t0, t1), n_prompt / Seconds(t0, t1), generated,
               Seconds(t1, t2), generated / std::max(1e-9, Seconds(t1, t2)), reason.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace specd

namespace specd {
int RunClient(int argc, char** argv);  // specd_client.cc: talks to a running cluster
}  // namespace specd

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(specd::kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string_view cmd = argv[1];
  if (cmd == "client") return specd::RunClient(argc - 2, argv + 2);
  if (cmd == "generate") {
    absl::StatusOr<specd::GenerateArgs> args = specd::ParseGenerateArgs(argc - 2, argv + 2);
    if (!args.ok()) {
      std::fprintf(stderr, "specd generate: %s\n%s", std::string(args.status().message()).c_str(),
                   specd::kUsage);
      return 2;
    }
    absl::Status st = specd::Generate(*args);
    if (!st.ok()) {
      std::fprintf(stderr, "specd generate: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (cmd == "logits") {
    absl::Status st = specd::RunLogits(argc - 2, argv + 2);
    if (!st.ok()) {
      std::fprintf(stderr, "specd logits: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (cmd == "hidden") {
    absl::Status st = specd::RunHidden(argc - 2, argv + 2);
    if (!st.ok()) {
      std::fprintf(stderr, "specd hidden: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (cmd == "distill-data") {
    specd::DistillDataOptions o;
    absl::Status st = specd::ParseDistillDataArgs(argc - 2, argv + 2, &o);
    if (!st.ok()) {
      std::fprintf(stderr, "specd distill-data: %s\n%s", std::string(st.message()).c_str(),
                   specd::kUsage);
      return 2;
    }
    st = specd::RunDistillData(o);
    if (!st.ok()) {
      std::fprintf(stderr, "specd distill-data: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "specd: unknown command '%s'\n%s", argv[1], specd::kUsage);
  return 2;
}
