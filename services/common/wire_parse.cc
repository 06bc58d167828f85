#include "services/common/wire_parse.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace specd::services {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

constexpr int kMaxDepth = 64;  // below protobuf's own recursion limit (100)

// Walks one message body (everything up to the stream's current limit).
class WireWalker {
 public:
  explicit WireWalker(CodedInputStream* in) : in_(in) {}

  absl::Status Message(const Descriptor* type, const std::string& path, int depth) {
    if (depth > kMaxDepth) return Problem(path, "nested too deeply");
    absl::flat_hash_map<int, int> seen;  // field number -> occurrences (repeated indices)
    for (;;) {
      const uint32_t tag = in_->ReadTag();
      if (tag == 0) {
        if (in_->BytesUntilLimit() == 0 || in_->ConsumedEntireMessage()) return absl::OkStatus();
        return Problem(path, "invalid field tag");
      }
      const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
      const FieldDescriptor* field = type != nullptr ? type->FindFieldByNumber(number) : nullptr;
      std::string name = FieldName(path, field, number);
      if (field != nullptr && field->is_repeated()) {
        absl::StrAppend(&name, "[", seen[number]++, "]");
      }
      if (number == 0) return Problem(path, "field number 0");
      if (absl::Status s = Field(WireFormatLite::GetTagWireType(tag), field, name, depth);
          !s.ok()) {
        return s;
      }
    }
  }

 private:
  static std::string FieldName(const std::string& path, const FieldDescriptor* field,
                               int number) {
    const std::string leaf = field != nullptr ? field->name() : absl::StrCat("#", number);
    return path.empty() ? leaf : absl::StrCat(path, ".", leaf);
  }
  static absl::Status Problem(const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(path.empty() ? what : absl::StrCat(path, ": ", what));
  }

  absl::Status Field(WireFormatLite::WireType wire, const FieldDescriptor* field,
                     const std::string& name, int depth) {
    switch (wire) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t v = 0;
        if (!in_->ReadVarint64(&v)) return Problem(name, "truncated or overlong varint");
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_FIXED64: {
        uint64_t v = 0;
        if (!in_->ReadLittleEndian64(&v)) return Problem(name, "truncated 64-bit value");
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_FIXED32: {
        uint32_t v = 0;
        if (!in_->ReadLittleEndian32(&v)) return Problem(name, "truncated 32-bit value");
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
        return LengthDelimited(field, name, depth);
      case WireFormatLite::WIRETYPE_START_GROUP:
      case WireFormatLite::WIRETYPE_END_GROUP:
        return Problem(name, "groups are not used by this API");
    }
    return Problem(name, absl::StrCat("invalid wire type ", static_cast<int>(wire)));
  }

  absl::Status LengthDelimited(const FieldDescriptor* field, const std::string& name,
                               int depth) {
    uint32_t length = 0;
    if (!in_->ReadVarint32(&length)) return Problem(name, "truncated length");
    if (static_cast<int64_t>(length) > in_->BytesUntilLimit() && in_->BytesUntilLimit() >= 0) {
      return Problem(name, absl::StrCat("length ", length, " runs past the end of the message"));
    }
    const bool is_message = field != nullptr &&
                            field->type() == FieldDescriptor::TYPE_MESSAGE;
    if (field != nullptr && field->is_packable()) return Packed(field, name, length);
    if (is_message) {
      const CodedInputStream::Limit limit = in_->PushLimit(static_cast<int>(length));
      absl::Status s = Message(field->message_type(), name, depth + 1);
      in_->PopLimit(limit);
      return s;
    }
    std::string value;
    if (!in_->ReadString(&value, static_cast<int>(length))) {
      return Problem(name, "truncated value");
    }
    if (field != nullptr && field->type() == FieldDescriptor::TYPE_STRING) {
      if (absl::Status s = tok::ValidateUtf8(value); !s.ok()) {
        return Problem(name, absl::StrCat("invalid UTF-8 (", s.message(), ")"));
      }
    }
    return absl::OkStatus();
  }

  // A packed repeated scalar: `length` bytes of varints or fixed-width values.
  absl::Status Packed(const FieldDescriptor* field, const std::string& name, uint32_t length) {
    const CodedInputStream::Limit limit = in_->PushLimit(static_cast<int>(length));
    const WireFormatLite::WireType element = WireFormatLite::WireTypeForFieldType(
        static_cast<WireFormatLite::FieldType>(field->type()));
    absl::Status s = absl::OkStatus();
    while (s.ok() && in_->BytesUntilLimit() > 0) {
      uint64_t v64 = 0;
      uint32_t v32 = 0;
      const bool ok = element == WireFormatLite::WIRETYPE_VARINT  ? in_->ReadVarint64(&v64)
                      : element == WireFormatLite::WIRETYPE_FIXED64 ? in_->ReadLittleEndian64(&v64)
                                                                    : in_->ReadLittleEndian32(&v32);
      if (!ok) s = Problem(name, "malformed packed values");
    }
    in_->PopLimit(limit);
    return s;
  }

  CodedInputStream* in_;
};

}  // namespace

absl::Status DiagnoseWire(std::string_view bytes, const Descriptor& type) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(bytes.size()));
  const CodedInputStream::Limit whole = in.PushLimit(static_cast<int>(bytes.size()));
  WireWalker walker(&in);
  absl::Status s = walker.Message(&type, "", 0);
  in.PopLimit(whole);
  return s;
}

absl::Status ParseMessage(std::string_view bytes, google::protobuf::Message* message) {
  const Descriptor& type = *message->GetDescriptor();
  if (bytes.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(type.name(), ": larger than 2 GiB"));
  }
  message->Clear();
  if (message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::OkStatus();
  }
  // Only a failed parse pays for the walk that names the field.
  message->Clear();
  if (absl::Status s = DiagnoseWire(bytes, type); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(type.name(), ": ", s.message()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(type.name(), ": not a valid ", type.full_name(), " message"));
}

}  // namespace specd::services
