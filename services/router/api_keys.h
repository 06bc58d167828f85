// API keys for the router's public API (gRPC metadata and the HTTP face alike):
// `authorization: Bearer <key>`. Keys come from a file, one per line ('#' starts a comment).
// Checked in constant time for a given key length; keys are never logged.
#ifndef SPECD_SERVICES_ROUTER_API_KEYS_H_
#define SPECD_SERVICES_ROUTER_API_KEYS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::router {

class ApiKeys {
 public:
  // No keys: every request is let in (local development).
  ApiKeys() = default;
  // INVALID_ARGUMENT naming the file for an unreadable or keyless file, or a key with spaces.
  static absl::StatusOr<ApiKeys> FromFile(const std::string& path);
  static absl::StatusOr<ApiKeys> FromText(std::string_view text, const std::string& where);

  bool enabled() const { return !keys_.empty(); }
  // OK, or UNAUTHENTICATED (the message never echoes what was sent). `authorization` is the
  // header / metadata value ("" when absent).
  absl::Status Check(std::string_view authorization) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_API_KEYS_H_
