// The tiny-model writer: files load as models, their synthetic tokenizer works, and every
// option changes what it should.
#include "testing/tiny_model.h"

#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd::testing {
namespace {

TEST(TinyModelTest, WritesALoadableModelWithAWorkingTokenizer) {
  TinyModelSpec spec;
  spec.num_layers = 3;
  spec.embedding_dim = 96;
  spec.ffn_dim = 160;
  spec.num_heads = 6;
  spec.num_kv_heads = 2;
  spec.vocab_size = 512;
  spec.weight_type = gguf::GgmlType::kQ4_1;
  const std::string path = ::testing::TempDir() + "/tiny_model_test.gguf";
  ASSERT_TRUE(WriteTinyModel(spec, path).ok());
  auto f = gguf::GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  engine::LocalCommunicator comm;
  auto be = engine::MakeCpuBackend(1);
  auto m = engine::LlamaModel::Load(**f, be.get(), &comm, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().num_layers, 3);
  EXPECT_EQ((*m)->config().embedding_dim, 96);
  EXPECT_EQ((*m)->config().num_kv_heads, 2);
  EXPECT_EQ((*m)->config().head_dim, 16);
  EXPECT_EQ((*m)->vocab_size(), 512);
  EXPECT_TRUE((*m)->config().tied_output);
  EXPECT_EQ((*f)->FindTensor("blk.0.ffn_up.weight")->type, gguf::GgmlType::kQ4_1);

  auto tk = tok::Tokenizer::FromGguf(**f);
  ASSERT_TRUE(tk.ok()) << tk.status();
  EXPECT_EQ((*tk)->vocab_size(), 512);
  auto ids = (*tk)->Encode("the cat sat on the mat\n\n", false, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_LT(ids->size(), 24u);  // merges shorten it below one token per byte
  EXPECT_EQ((*tk)->Decode(*ids), "the cat sat on the mat\n\n");
  auto chat = (*tk)->Encode("<|im_start|>user\nhi<|im_end|>", false, true);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->front(), (*tk)->TokenId("<|im_start|>"));
  EXPECT_TRUE((*tk)->IsEndOfGeneration((*tk)->eos_id()));
  EXPECT_TRUE(tok::ChatTemplate::FromGguf(**f).ok());
}

TEST(TinyModelTest, SeedsChangeWeightsButNotTheVocabulary) {
  TinyModelSpec a, b;
  b.seed = 2;
  const std::string pa = ::testing::TempDir() + "/tiny_a.gguf";
  const std::string pb = ::testing::TempDir() + "/tiny_b.gguf";
  ASSERT_TRUE(WriteTinyModel(a, pa).ok());
  ASSERT_TRUE(WriteTinyModel(b, pb).ok());
  auto fa = gguf::GgufFile::Open(pa);
  auto fb = gguf::GgufFile::Open(pb);
  ASSERT_TRUE(fa.ok() && fb.ok());
  const gguf::TensorInfo* ta = (*fa)->FindTensor("blk.0.attn_q.weight");
  const gguf::TensorInfo* tb = (*fb)->FindTensor("blk.0.attn_q.weight");
  ASSERT_TRUE(ta && tb);
  EXPECT_NE(std::vector<uint8_t>(ta->data, ta->data + ta->num_bytes),
            std::vector<uint8_t>(tb->data, tb->data + tb->num_bytes));
  auto ka = tok::Tokenizer::FromGguf(**fa);
  auto kb = tok::Tokenizer::FromGguf(**fb);
  ASSERT_TRUE(ka.ok() && kb.ok());
  EXPECT_EQ((*ka)->Fingerprint(), (*kb)->Fingerprint());
}

TEST(TinyModelTest, BadShapesAreInvalidArgument) {
  TinyModelSpec spec;
  spec.num_heads = 5;  // 64 is not divisible by 5
  EXPECT_EQ(WriteTinyModel(spec, ::testing::TempDir() + "/bad.gguf").code(),
            absl::StatusCode::kInvalidArgument);
  spec = {};
  spec.vocab_size = 10;  // below what the synthetic tokenizer needs
  EXPECT_EQ(WriteTinyModel(spec, ::testing::TempDir() + "/bad.gguf").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd::testing
