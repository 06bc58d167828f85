// Tokenizer tests: goldens from independent references (HF tokenizers, sentencepiece, jinja2;
// see scripts/gen_tokenizer_goldens.py), round trips, streaming and error handling.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd::tok {
namespace {

using ::testing::HasSubstr;

std::string SourceDir() {
  const char* dir = std::getenv("SPECD_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}
std::string DataPath(const std::string& name) {
  return SourceDir() + "/tests/data/tokenizer/" + name;
}
std::string ModelPath() { return SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }
bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

nlohmann::json LoadJson(const std::string& name) {
  std::ifstream in(DataPath(name));
  EXPECT_TRUE(in.good()) << "missing " << DataPath(name);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// Printable form for failure messages.
std::string Escape(std::string_view s, size_t max = 200) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += absl::StrCat("\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (s.size() > max) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

std::string Ids(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&out, i ? "," : "", ids[i]);
  return out + "]";
}

struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

Loaded LoadTokenizer(const std::string& path) {
  Loaded l;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << path << ": " << f.status();
  if (!f.ok()) return l;
  l.file = *std::move(f);
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromGguf(*l.file);
  EXPECT_TRUE(t.ok()) << path << ": " << t.status();
  if (t.ok()) l.tok = *std::move(t);
  return l;
}

// Encodes every golden case; reports the first mismatch in detail and the match count.
void CheckGoldens(const Tokenizer& tok, const std::string& golden_file) {
  const nlohmann::json g = LoadJson(golden_file);
  const bool parse_special = g["parse_special"].get<bool>();
  int matched = 0, total = 0;
  std::string first_mismatch;
  for (const auto& c : g["cases"]) {
    ++total;
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    absl::StatusOr<std::vector<int32_t>> got = tok.Encode(text, false, parse_special);
    if (got.ok() && *got == want) {
      ++matched;
      continue;
    }
    if (first_mismatch.empty()) {
      first_mismatch = absl::StrCat(
          "case ", total - 1, " text=\"", Escape(text), "\"\n  want ", Ids(want), "\n  got  ",
          got.ok() ? Ids(*got) : got.status().ToString());
      if (got.ok()) {
        size_t i = 0;
        while (i < want.size() && i < got->size() && want[i] == (*got)[i]) ++i;
        absl::StrAppend(&first_mismatch, "\n  first difference at index ", i);
      }
    }
  }
  EXPECT_EQ(matched, total) << golden_file << ": first mismatch: " << first_mismatch;
  std::cout << golden_file << ": " << matched << "/" << total << " cases match\n";
  EXPECT_GE(total, 300);
}

// Random valid UTF-8 over all planes (no surrogates), biased towards whitespace and ASCII.
// all_planes = false keeps supplementary code points in planes 1-3 (lead byte 0xF0).
std::string RandomUtf8(std::mt19937& rng, int max_cps, bool all_planes = true) {
  std::uniform_int_distribution<int> len_dist(0, max_cps);
  std::uniform_int_distribution<int> kind(0, 9);
  const char32_t spaces[] = {' ', '\t', '\n', '\r', 0x0B, 0x0C, 0x85, 0xA0, 0x2028, 0x3000};
  std::string s;
  const int n = len_dist(rng);
  for (int i = 0; i < n; ++i) {
    char32_t cp;
    switch (kind(rng)) {
      case 0: case 1: cp = spaces[rng() % 10]; break;
      case 2: case 3: case 4: cp = 0x20 + rng() % 0x5F; break;
      case 5: cp = 0x80 + rng() % 0x780; break;
      case 6: cp = 0x800 + rng() % (0xD800 - 0x800); break;
      case 7: cp = 0xE000 + rng() % 0x2000; break;
      default: cp = 0x10000 + rng() % ((all_planes ? 0x110000 : 0x40000) - 0x10000); break;
    }
    if (cp == 0) cp = ' ';
    AppendUtf8(cp, s);
  }
  return s;
}

// Byte-level vocabularies may lack a few bytes (SmolLM2 has no token for 0xF1, 0x04, ...);
// text containing them cannot round-trip and is skipped.
bool Representable(const Tokenizer& tok, std::string_view s) {
  if (tok.vocab().model != ModelKind::kByteLevelBpe) return true;
  for (char c : s) {
    if (tok.TokenId(ByteLevelEncode(std::string_view(&c, 1))) < 0) return false;
  }
  return true;
}

void CheckRoundTrip(const Tokenizer& tok, int iterations, bool all_planes = true) {
  std::mt19937 rng(42);
  int skipped = 0;
  for (int it = 0; it < iterations; ++it) {
    const std::string s = RandomUtf8(rng, 60, all_planes);
    if (!Representable(tok, s)) {
      ++skipped;
      continue;
    }
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(s, false, false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_EQ(tok.Decode(*ids), s) << "iteration " << it << " text=\"" << Escape(s) << "\" ids "
                                   << Ids(*ids);
  }
  EXPECT_LT(skipped, iterations / 2);
}

// ---------------------------------------------------------------------------------------------
// UTF-8 and byte mapping

TEST(Utf8Test, ValidateNamesOffset) {
  EXPECT_TRUE(ValidateUtf8("héllo 😀").ok());
  absl::Status s = ValidateUtf8("abc\xC3");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("byte offset 3"));
  s = ValidateUtf8("ab\xED\xA0\x80");  // surrogate
  EXPECT_THAT(s.message(), HasSubstr("byte offset 2"));
  EXPECT_FALSE(ValidateUtf8("\xC0\xAF").ok());          // overlong
  EXPECT_FALSE(ValidateUtf8("\xF4\x90\x80\x80").ok());  // > U+10FFFF
  EXPECT_FALSE(ValidateUtf8("\xFF").ok());
}

TEST(Utf8Test, HelpersWork) {
  EXPECT_EQ(ParseByteToken("<0x0A>"), 0x0A);
  EXPECT_EQ(ParseByteToken("<0xfF>"), 0xFF);
  EXPECT_EQ(ParseByteToken("<0xG0>"), -1);
  EXPECT_EQ(ParseByteToken("0x0A"), -1);
  EXPECT_EQ(StripPythonSpace(" \t\u3000x y\n\x1c"), "x y");
  EXPECT_EQ(StripPythonSpace("   "), "");
}

TEST(ByteLevelTest, MappingIsABijection) {
  EXPECT_EQ(ByteLevelEncode(" "), "Ġ");
  EXPECT_EQ(ByteLevelEncode("\n"), "Ċ");
  EXPECT_EQ(ByteLevelEncode("a"), "a");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string mapped = ByteLevelEncode(all);
  EXPECT_TRUE(ValidateUtf8(mapped).ok());
  EXPECT_EQ(ByteLevelDecode(mapped), all);
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer regexes vs HF tokenizers' Split(isolated)

TEST(PreTokenizerTest, MatchesHfSplitGoldens) {
  const nlohmann::json g = LoadJson("pretokenizer_goldens.json");
  for (const auto& [name, pattern] : g["patterns"].items()) {
    absl::StatusOr<std::unique_ptr<PreTokenizer>> pt =
        PreTokenizer::FromPatterns({pattern.get<std::string>()});
    ASSERT_TRUE(pt.ok()) << pt.status();
    int matched = 0, total = 0;
    for (const auto& c : g["cases"]) {
      ++total;
      const std::string text = c["text"].get<std::string>();
      const auto want = c[name].get<std::vector<std::string>>();
      std::vector<std::string_view> pieces;
      (*pt)->Split(text, pieces);
      const std::vector<std::string> got(pieces.begin(), pieces.end());
      if (got == want) {
        ++matched;
      } else if (matched == total - 1) {
        std::string w, o;
        for (const auto& p : want) absl::StrAppend(&w, "\"", Escape(p, 40), "\" ");
        for (const auto& p : got) absl::StrAppend(&o, "\"", Escape(p, 40), "\" ");
        ADD_FAILURE() << name << " case " << total - 1 << " text=\"" << Escape(text)
                      << "\"\n  want " << w << "\n  got  " << o;
      }
    }
    EXPECT_EQ(matched, total) << name;
    EXPECT_GE(total, 300);
    std::cout << "pre-tokenizer " << name << ": " << matched << "/" << total << " match\n";
  }
}

TEST(PreTokenizerTest, NamedPresetsAndUnknownName) {
  for (const char* name : {"default", "gpt2", "smollm", "starcoder", "llama3", "llama-bpe",
                           "qwen2"}) {
    EXPECT_TRUE(PreTokenizer::ForName(name).ok()) << name;
  }
  absl::StatusOr<std::unique_ptr<PreTokenizer>> bad = PreTokenizer::ForName("nonesuch");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("nonesuch"));

  absl::StatusOr<std::unique_ptr<PreTokenizer>> smollm = PreTokenizer::ForName("smollm");
  ASSERT_TRUE(smollm.ok());
  std::vector<std::string_view> pieces;
  (*smollm)->Split("ab 123", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"ab", " ", "1", "2", "3"}));
}

// ---------------------------------------------------------------------------------------------
// Byte-level BPE

TEST(ByteLevelBpeTest, TinyFixtureMatchesHfTokenizers) {
  Loaded l = LoadTokenizer(DataPath("tiny_bpe.gguf"));
  ASSERT_NE(l.tok, nullptr);
  CheckGoldens(*l.tok, "tiny_bpe_goldens.json");
}

TEST(ByteLevelBpeTest, TinyFixtureRoundTrip) {
  Loaded l = LoadTokenizer(DataPath("tiny_bpe.gguf"));
  ASSERT_NE(l.tok, nullptr);
  CheckRoundTrip(*l.tok, 2000);
}

TEST(ByteLevelBpeTest, SpecialAndUserDefinedTokens) {
  Loaded l = LoadTokenizer(DataPath("tiny_bpe.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& tok = *l.tok;
  const int32_t im_start = tok.TokenId("<|im_start|>");
  const int32_t custom = tok.TokenId("<custom>");
  ASSERT_GE(im_start, 0);
  ASSERT_GE(custom, 0);
  auto with = tok.Encode("<|im_start|>user", false, true);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->front(), im_start);
  auto without = tok.Encode("<|im_start|>user", false, false);
  ASSERT_TRUE(without.ok());
  EXPECT_NE(without->front(), im_start);
  EXPECT_EQ(tok.Decode(*without), "<|im_start|>user");
  // User-defined tokens match even without parse_special.
  auto c = tok.Encode("a<custom>b", false, false);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(std::find(c->begin(), c->end(), custom), c->end());
  EXPECT_EQ(tok.Decode(*with, /*skip_special=*/true), "user");
}

TEST(ByteLevelBpeTest, SmolLM2MatchesHfTokenizers) {
  if (!FileExists(ModelPath())) {
    GTEST_SKIP() << "real model not found at " << ModelPath()
                 << " (see docs/DESIGN.md §9 for how to fetch it)";
  }
  Loaded l = LoadTokenizer(ModelPath());
  ASSERT_NE(l.tok, nullptr);
  CheckGoldens(*l.tok, "smollm2_goldens.json");
  CheckRoundTrip(*l.tok, 1000, /*all_planes=*/false);
  const Tokenizer& tok = *l.tok;
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.eot_id(), 2);
  EXPECT_TRUE(tok.IsEndOfGeneration(2));
  EXPECT_TRUE(tok.IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(tok.IsEndOfGeneration(1));
  EXPECT_FALSE(tok.IsEndOfGeneration(100));
  // add_bos_token is false in this file: add_special adds nothing.
  auto ids = tok.Encode("Hello", true, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_NE(ids->front(), tok.bos_id());

  absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromGguf(*l.file);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->kind(), ChatTemplate::Kind::kChatMl);
  EXPECT_EQ(chat->default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

// ---------------------------------------------------------------------------------------------
// SentencePiece BPE

TEST(SentencePieceTest, TinyFixtureMatchesSentencePiece) {
  Loaded l = LoadTokenizer(DataPath("tiny_spm.gguf"));
  ASSERT_NE(l.tok, nullptr);
  CheckGoldens(*l.tok, "tiny_spm_goldens.json");
}

TEST(SentencePieceTest, RoundTripStripsTheDummyPrefix) {
  Loaded l = LoadTokenizer(DataPath("tiny_spm.gguf"));
  ASSERT_NE(l.tok, nullptr);
  // Encode adds "▁" at the start; Decode drops exactly one leading space of the first token,
  // so text that itself starts with spaces survives.
  CheckRoundTrip(*l.tok, 2000);
  auto ids = l.tok->Encode("  two spaces", false, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(l.tok->Decode(*ids), "  two spaces");
}

TEST(SentencePieceTest, BosAndByteFallback) {
  Loaded l = LoadTokenizer(DataPath("tiny_spm.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& tok = *l.tok;
  auto ids = tok.Encode("hello", /*add_special=*/true, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), tok.bos_id());
  EXPECT_EQ(tok.Decode(*ids, /*skip_special=*/true), "hello");
  // A character absent from the training text must fall back to bytes.
  auto rare = tok.Encode("\U0001F9EC", false, false);
  ASSERT_TRUE(rare.ok());
  ASSERT_EQ(rare->size(), 5u);  // "▁" + 4 byte tokens
  EXPECT_EQ(tok.TokenBytes((*rare)[1]), "\xF0");
  EXPECT_EQ(tok.Decode(*rare), "\U0001F9EC");
  EXPECT_TRUE(tok.IsEndOfGeneration(tok.eos_id()));
}

// ---------------------------------------------------------------------------------------------
// Errors, decoding, fingerprint

TEST(TokenizerTest, InvalidUtf8IsRejectedWithOffset) {
  Loaded l = LoadTokenizer(DataPath("tiny_bpe.gguf"));
  ASSERT_NE(l.tok, nullptr);
  auto r = l.tok->Encode("ok \xE2\x82", false, true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("byte offset 3"));
}

TEST(TokenizerTest, OutOfRangeIdsDoNotCrash) {
  Loaded l = LoadTokenizer(DataPath("tiny_bpe.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& tok = *l.tok;
  auto ids = tok.Encode("hi", false, false);
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> bad = *ids;
  bad.push_back(-5);
  bad.push_back(tok.vocab_size());
  EXPECT_EQ(tok.Decode(bad), "hi");
  auto checked = tok.DecodeChecked(bad);
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(checked.status().message(), HasSubstr(absl::StrCat("index ", ids->size())));
  EXPECT_THAT(checked.status().message(), HasSubstr("-5"));
  EXPECT_EQ(tok.TokenBytes(-1), "");
  EXPECT_EQ(tok.TokenBytes(1 << 30), "");
}

TEST(TokenizerTest, MissingMetadataNamesTheKey) {
  gguf::GgufWriter w;
  w.Set("tokenizer.ggml.model", gguf::Value::Str("gpt2"));
  absl::StatusOr<std::string> bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto file = gguf::GgufFile::FromBuffer(absl::Span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()));
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("tokenizer.ggml.tokens"));

  Vocab v;
  v.tokens = {"a", "b", "ab"};
  v.pre = "gpt2";
  auto no_merges = Tokenizer::FromVocab(v);
  ASSERT_FALSE(no_merges.ok());
  EXPECT_THAT(no_merges.status().message(), HasSubstr("tokenizer.ggml.merges"));
  v.merges = {"a b"};
  v.pre = "mystery";
  auto bad_pre = Tokenizer::FromVocab(v);
  ASSERT_FALSE(bad_pre.ok());
  EXPECT_THAT(bad_pre.status().message(), HasSubstr("mystery"));
  v.pre = "gpt2";
  v.eos_id = 7;
  auto bad_id = Tokenizer::FromVocab(v);
  ASSERT_FALSE(bad_id.ok());
  EXPECT_THAT(bad_id.status().message(), HasSubstr("tokenizer.ggml.eos_token_id"));
}

TEST(TokenizerTest, FingerprintIsStableAndSensitive) {
  Vocab v;
  v.tokens = {"a", "b", "ab", "<|end|>"};
  v.types = {TokenType::kNormal, TokenType::kNormal, TokenType::kNormal, TokenType::kControl};
  v.merges = {"a b"};
  auto t1 = Tokenizer::FromVocab(v);
  ASSERT_TRUE(t1.ok()) << t1.status();
  // A fixed value: the fingerprint must not depend on the process, platform or build.
  EXPECT_EQ((*t1)->Fingerprint(), 0xe65332462829f942ULL) << std::hex << (*t1)->Fingerprint();
  EXPECT_EQ((*t1)->eot_id(), 3);
  auto ids = (*t1)->Encode("abab", false, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 2}));
  v.tokens[1] = "c";
  v.merges = {"a c"};
  auto t2 = Tokenizer::FromVocab(v);
  ASSERT_TRUE(t2.ok());
  EXPECT_NE((*t1)->Fingerprint(), (*t2)->Fingerprint());
}

// ---------------------------------------------------------------------------------------------
// Streaming detokenizer

void CheckStreaming(const Tokenizer& tok, uint32_t seed) {
  std::mt19937 rng(seed);
  int valid_cases = 0;
  for (int it = 0; it < 500; ++it) {
    // Half the sequences encode real text (cut at a random point), half are random ids.
    std::vector<int32_t> ids;
    if (it % 2 == 0) {
      auto enc = tok.Encode(RandomUtf8(rng, 40), false, false);
      ASSERT_TRUE(enc.ok());
      ids = *enc;
      if (!ids.empty()) ids.resize(rng() % (ids.size() + 1));
    } else {
      ids.resize(1 + rng() % 30);
      for (int32_t& id : ids) id = static_cast<int32_t>(rng() % tok.vocab_size());
    }
    StreamingDetokenizer stream(tok);
    std::string all;
    for (int32_t id : ids) {
      const std::string chunk = stream.Append(id);
      ASSERT_TRUE(ValidateUtf8(chunk).ok()) << "partial UTF-8 in a chunk: " << Escape(chunk);
      all += chunk;
    }
    const std::string tail = stream.Finish();
    ASSERT_TRUE(ValidateUtf8(tail).ok());
    all += tail;
    const std::string whole = tok.Decode(ids);
    if (ValidateUtf8(whole).ok()) {
      ++valid_cases;
      ASSERT_EQ(all, whole) << "ids " << Ids(ids);
    } else {
      // Nothing is lost silently: the invalid bytes show up as U+FFFD.
      EXPECT_NE(all.find(kReplacementChar), std::string::npos) << "ids " << Ids(ids);
    }
  }
  EXPECT_GT(valid_cases, 100);
}

TEST(StreamingDetokenizerTest, ChunksAreCompleteUtf8AndConcatenateToDecode) {
  for (const char* fixture : {"tiny_bpe.gguf", "tiny_spm.gguf"}) {
    Loaded l = LoadTokenizer(DataPath(fixture));
    ASSERT_NE(l.tok, nullptr);
    CheckStreaming(*l.tok, 7);
  }
}

TEST(StreamingDetokenizerTest, SplitCharacterIsHeldBack) {
  Loaded l = LoadTokenizer(DataPath("tiny_spm.gguf"));
  ASSERT_NE(l.tok, nullptr);
  auto ids = l.tok->Encode("\U0001F9EC!", false, false);  // ▁ + 4 byte tokens + !
  ASSERT_TRUE(ids.ok());
  StreamingDetokenizer stream(*l.tok);
  std::vector<std::string> chunks;
  for (int32_t id : *ids) chunks.push_back(stream.Append(id));
  EXPECT_EQ(chunks[1], "");
  EXPECT_EQ(chunks[2], "");
  EXPECT_EQ(chunks[3], "");
  EXPECT_EQ(chunks[4], "\U0001F9EC");
  EXPECT_EQ(stream.Finish(), "");
}

TEST(StreamingDetokenizerTest, FinishFlushesInvalidTailAsReplacement) {
  std::string out;
  EXPECT_EQ(AppendCompleteUtf8("ab\xE2\x82", /*final=*/false, out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(AppendCompleteUtf8("ab\xE2\x82", /*final=*/true, out), 0u);
  EXPECT_EQ(out, "ab\xEF\xBF\xBD");
  out.clear();
  AppendCompleteUtf8("\xFFx\xE2\x82y", /*final=*/false, out);
  EXPECT_EQ(out, "\xEF\xBF\xBDx\xEF\xBF\xBDy");
}

// ---------------------------------------------------------------------------------------------
// Chat templates vs jinja2

TEST(ChatTemplateTest, MatchesJinjaRenderings) {
  const nlohmann::json g = LoadJson("chat_template_goldens.json");
  int matched = 0, total = 0;
  for (const auto& c : g["cases"]) {
    ++total;
    const std::string name = c["template"].get<std::string>();
    const auto& t = g["templates"][name];
    absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::FromJinja(
        t["template"].get<std::string>(), t["bos"].get<std::string>(),
        t["eos"].get<std::string>());
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status();
    std::vector<ChatMessage> msgs;
    for (const auto& m : c["messages"]) {
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    absl::StatusOr<std::string> got = tmpl->Apply(msgs, c["add_generation_prompt"].get<bool>());
    if (c["expected"].is_null()) {
      EXPECT_FALSE(got.ok()) << name << " case " << total - 1 << " should be refused";
      if (!got.ok()) ++matched;
      continue;
    }
    const std::string want = c["expected"].get<std::string>();
    ASSERT_TRUE(got.ok()) << name << " case " << total - 1 << ": " << got.status();
    EXPECT_EQ(*got, want) << name << " case " << total - 1;
    if (*got == want) ++matched;
  }
  std::cout << "chat templates: " << matched << "/" << total << " match\n";
  EXPECT_EQ(matched, total);
}

TEST(ChatTemplateTest, DetectionAndUnknownTemplates) {
  const nlohmann::json g = LoadJson("chat_template_goldens.json");
  auto kind = [&](const char* name) {
    auto t = ChatTemplate::FromJinja(g["templates"][name]["template"].get<std::string>(), "", "");
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->kind() : ChatTemplate::Kind::kChatMl;
  };
  EXPECT_EQ(kind("smollm"), ChatTemplate::Kind::kChatMl);
  EXPECT_EQ(kind("llama3"), ChatTemplate::Kind::kLlama3);
  EXPECT_EQ(kind("llama2"), ChatTemplate::Kind::kLlama2);
  auto unknown = ChatTemplate::FromJinja("{{ messages[0]['content'] }}", "", "");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(unknown.status().message(), HasSubstr("not recognised"));
  auto tools = ChatTemplate::FromJinja(
      "{% if tools %}x{% endif %}<|start_header_id|><|end_header_id|><|eot_id|>", "", "");
  EXPECT_EQ(tools.status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace specd::tok
