// Parsing a request ourselves instead of letting gRPC do it: a payload that is not a valid
// message (truncated varint, a length past the end, invalid UTF-8 in a `string` field, random
// bytes) becomes INVALID_ARGUMENT naming the field where the bytes went wrong, instead of the
// gRPC layer's bare refusal.
#ifndef SPECD_SERVICES_COMMON_WIRE_PARSE_H_
#define SPECD_SERVICES_COMMON_WIRE_PARSE_H_

#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace specd::services {

// Parses `bytes` into `message` (cleared first). On failure: INVALID_ARGUMENT
// "<Type>: <field path>: <what>", e.g. "GenerateRequest: chat.messages[1].role: invalid UTF-8
// (byte 3)"; the path is "" where the bytes fail before any field.
absl::Status ParseMessage(std::string_view bytes, google::protobuf::Message* message);

// Walks `bytes` as the wire form of `type` and names the first problem (OK when there is
// none). Exposed for tests; ParseMessage uses it to explain a failed parse.
absl::Status DiagnoseWire(std::string_view bytes, const google::protobuf::Descriptor& type);

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_WIRE_PARSE_H_
