// API keys of the public API (services/router/api_keys.h).
#include "services/router/api_keys.h"

#include "gtest/gtest.h"

namespace specd::router {
namespace {

TEST(ApiKeysTest, FileFormatIsOneKeyALineWithComments) {
  auto k = ApiKeys::FromText("# team keys\nsk-alpha\n\n  sk-beta  # ops\n", "keys.txt");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_TRUE(k->enabled());
  EXPECT_TRUE(k->Check("Bearer sk-alpha").ok());
  EXPECT_TRUE(k->Check("Bearer sk-beta").ok());
  const absl::Status none = ApiKeys::FromText("# nothing\n\n", "keys.txt").status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("keys.txt"), std::string::npos);
  EXPECT_EQ(ApiKeys::FromText("two words\n", "k").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApiKeys::FromFile("/nonexistent/keys").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ApiKeysTest, OnlyTheRightBearerKeyPassesAndErrorsNeverEchoIt) {
  auto k = ApiKeys::FromText("sk-secret-1\n", "k");
  ASSERT_TRUE(k.ok());
  for (const char* bad : {"", "sk-secret-1", "Basic sk-secret-1", "Bearer ", "Bearer sk-secret",
                          "Bearer sk-secret-12", "Bearer SK-SECRET-1", "bearer sk-secret-1"}) {
    const absl::Status s = k->Check(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(s.message().find("sk-secret"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(k->Check("Bearer sk-secret-1").ok());
  EXPECT_TRUE(ApiKeys().Check("").ok()) << "no keys configured: open";
}

}  // namespace
}  // namespace specd::router
