// services/common/wire_parse: requests parsed by the service itself. Every malformed payload
// is INVALID_ARGUMENT with a message naming where it went wrong; valid payloads parse exactly
// as protobuf parses them; random bytes never crash and never disagree with protobuf about
// validity.
#include "services/common/wire_parse.h"

#include <random>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "specd/v1/generation.pb.h"

namespace specd::services {
namespace {

using specd::v1::GenerateRequest;

GenerateRequest ChatRequest() {
  GenerateRequest r;
  auto* chat = r.mutable_chat();
  auto* m0 = chat->add_messages();
  m0->set_role("system");
  m0->set_content("be brief");
  auto* m1 = chat->add_messages();
  m1->set_role("user");
  m1->set_content("hello");
  r.mutable_sampling()->set_max_new_tokens(7);
  r.mutable_sampling()->set_temperature(0.5f);
  r.mutable_speculation()->set_num_draft_tokens(3);
  r.set_request_id("req-1");
  return r;
}

// Replaces the first occurrence of `from` (same length) in the wire bytes.
std::string Patch(std::string bytes, const std::string& from, const std::string& to) {
  const size_t at = bytes.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  EXPECT_EQ(from.size(), to.size());
  if (at != std::string::npos) bytes.replace(at, from.size(), to);
  return bytes;
}

std::string ErrorOf(const std::string& bytes) {
  GenerateRequest r;
  absl::Status s = ParseMessage(bytes, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(WireParseTest, ValidRequestParsesLikeProtobuf) {
  const GenerateRequest want = ChatRequest();
  GenerateRequest got;
  ASSERT_TRUE(ParseMessage(want.SerializeAsString(), &got).ok());
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
  EXPECT_TRUE(ParseMessage("", &got).ok()) << "the empty message is valid";
}

TEST(WireParseTest, InvalidUtf8IsNamedByFieldPath) {
  const std::string bytes = ChatRequest().SerializeAsString();
  EXPECT_NE(ErrorOf(Patch(bytes, "req-1", "re\xff-1")).find(
                "GenerateRequest: request_id: invalid UTF-8"),
            std::string::npos);
  const std::string role = ErrorOf(Patch(bytes, "user", "us\xc3\x28"));
  EXPECT_NE(role.find("chat.messages[1].role: invalid UTF-8"), std::string::npos) << role;
  // content is bytes: the router's validation names it later, the parser lets it through.
  GenerateRequest r;
  EXPECT_TRUE(ParseMessage(Patch(bytes, "hello", "hel\xffo"), &r).ok());
}

TEST(WireParseTest, TruncationsAreNamed) {
  GenerateRequest base;
  base.set_add_special_tokens(true);
  std::string bytes = base.SerializeAsString();  // 0x30 0x01
  bytes.back() = '\x80';                         // the varint never ends
  EXPECT_NE(ErrorOf(bytes).find("add_special_tokens: truncated"), std::string::npos)
      << ErrorOf(bytes);

  const std::string chat = ChatRequest().SerializeAsString();
  const std::string cut = chat.substr(0, chat.size() / 2);
  EXPECT_NE(ErrorOf(cut).find("runs past the end"), std::string::npos) << ErrorOf(cut);

  GenerateRequest sampling;
  sampling.mutable_sampling()->set_max_new_tokens(300);
  std::string inner = sampling.SerializeAsString();  // 0x22 len 0x08 0xac 0x02
  inner[1] = 1;  // the sampling message now ends inside its varint
  inner.resize(3);
  EXPECT_NE(ErrorOf(inner).find("sampling.max_new_tokens: truncated"), std::string::npos)
      << ErrorOf(inner);

  GenerateRequest ids;
  ids.mutable_tokens()->add_ids(5);
  ids.mutable_tokens()->add_ids(300);
  std::string packed = ids.SerializeAsString();  // 0x1a 5 0x0a 3 0x05 0xac 0x02
  packed.back() = '\x82';                        // the last id's varint continues past the end
  EXPECT_NE(ErrorOf(packed).find("tokens.ids"), std::string::npos) << ErrorOf(packed);

  EXPECT_NE(ErrorOf(std::string("\x00\x01", 2)).find("invalid field tag"), std::string::npos);
  EXPECT_NE(ErrorOf("\x0b").find("groups"), std::string::npos) << "wire type 3";
  EXPECT_NE(ErrorOf("\x0f").find("invalid wire type"), std::string::npos);
}

TEST(WireParseTest, RandomBytesNeverCrashAndAgreeWithProtobuf) {
  // protobuf's parser, the reference here, logs every invalid UTF-8 string it meets.
  google::protobuf::SetLogHandler(nullptr);
  std::mt19937 rng(7);
  const std::string valid = ChatRequest().SerializeAsString();
  int invalid = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes;
    if (i % 2 == 0) {  // mutations of a valid request: the interesting neighbourhood
      bytes = valid;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) bytes[rng() % bytes.size()] = static_cast<char>(rng());
      if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    } else {
      bytes.resize(rng() % 64);
      for (char& c : bytes) c = static_cast<char>(rng());
    }
    GenerateRequest ours, theirs;
    const absl::Status s = ParseMessage(bytes, &ours);
    const bool protobuf_ok = theirs.ParseFromString(bytes);
    ASSERT_EQ(s.ok(), protobuf_ok) << i << ": " << s;
    if (!s.ok()) {
      ++invalid;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(s.message().rfind("GenerateRequest: ", 0), 0u) << s;
      EXPECT_GT(s.message().size(), std::string("GenerateRequest: ").size());
    } else {
      EXPECT_EQ(ours.SerializeAsString(), theirs.SerializeAsString());
    }
  }
  EXPECT_GT(invalid, 1000) << "the generator should produce many invalid payloads";
}

}  // namespace
}  // namespace specd::services
