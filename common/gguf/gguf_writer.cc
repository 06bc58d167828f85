#include "common/gguf/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/gguf/quants.h"

namespace specd::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr int kMaxDims = 4;

template <typename T>
void Put(std::string* out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

void PutString(std::string* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

void Pad(std::string* out, uint64_t alignment) {
  const uint64_t rem = out->size() % alignment;
  if (rem != 0) out->append(alignment - rem, '\0');
}

absl::Status Mismatch(std::string_view key, const Value& v) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "GgufWriter: value of key '%s' does not match its type %s", key, ValueTypeName(v.type)));
}

template <typename T>
absl::Status PutUnsigned(std::string* out, std::string_view key, const Value& v) {
  const uint64_t* u = std::get_if<uint64_t>(&v.data);
  if (u == nullptr || *u > std::numeric_limits<T>::max()) return Mismatch(key, v);
  Put<T>(out, static_cast<T>(*u));
  return absl::OkStatus();
}

template <typename T>
absl::Status PutSigned(std::string* out, std::string_view key, const Value& v) {
  const int64_t* s = std::get_if<int64_t>(&v.data);
  if (s == nullptr || *s < std::numeric_limits<T>::min() || *s > std::numeric_limits<T>::max()) {
    return Mismatch(key, v);
  }
  Put<T>(out, static_cast<T>(*s));
  return absl::OkStatus();
}

// Writes the payload of `v` (no type tag); arrays recurse with their element type.
absl::Status PutValue(std::string* out, std::string_view key, const Value& v) {
  switch (v.type) {
    case ValueType::kUint8: return PutUnsigned<uint8_t>(out, key, v);
    case ValueType::kUint16: return PutUnsigned<uint16_t>(out, key, v);
    case ValueType::kUint32: return PutUnsigned<uint32_t>(out, key, v);
    case ValueType::kUint64: return PutUnsigned<uint64_t>(out, key, v);
    case ValueType::kInt8: return PutSigned<int8_t>(out, key, v);
    case ValueType::kInt16: return PutSigned<int16_t>(out, key, v);
    case ValueType::kInt32: return PutSigned<int32_t>(out, key, v);
    case ValueType::kInt64: return PutSigned<int64_t>(out, key, v);
    case ValueType::kFloat32:
    case ValueType::kFloat64: {
      const double* d = std::get_if<double>(&v.data);
      if (d == nullptr) return Mismatch(key, v);
      if (v.type == ValueType::kFloat32) {
        Put<float>(out, static_cast<float>(*d));
      } else {
        Put<double>(out, *d);
      }
      return absl::OkStatus();
    }
    case ValueType::kBool: {
      const bool* b = std::get_if<bool>(&v.data);
      if (b == nullptr) return Mismatch(key, v);
      Put<uint8_t>(out, *b ? 1 : 0);
      return absl::OkStatus();
    }
    case ValueType::kString: {
      const std::string* s = std::get_if<std::string>(&v.data);
      if (s == nullptr) return Mismatch(key, v);
      PutString(out, *s);
      return absl::OkStatus();
    }
    case ValueType::kArray: {
      const ArrayValue* arr = std::get_if<ArrayValue>(&v.data);
      if (arr == nullptr) return Mismatch(key, v);
      Put<uint32_t>(out, static_cast<uint32_t>(arr->element_type));
      Put<uint64_t>(out, arr->elements.size());
      for (const Value& e : arr->elements) {
        if (e.type != arr->element_type) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "GgufWriter: array '%s' declares %s elements but holds a %s", key,
              ValueTypeName(arr->element_type), ValueTypeName(e.type)));
        }
        absl::Status st = PutValue(out, key, e);
        if (!st.ok()) return st;
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat("GgufWriter: key '%s' has unknown type", key));
}

}  // namespace

GgufWriter::GgufWriter(uint32_t version, uint64_t alignment)
    : version_(version), alignment_(alignment) {}

void GgufWriter::Set(std::string key, Value value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

absl::Status GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                                   std::vector<uint8_t> bytes) {
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) {
      return absl::AlreadyExistsError(absl::StrFormat("GgufWriter: duplicate tensor '%s'", name));
    }
  }
  absl::StatusOr<GgmlTypeTraits> traits = GetTypeTraits(type);
  if (!traits.ok()) return traits.status();
  if (dims.empty() || dims.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GgufWriter: tensor '%s' needs 1..4 dims, got %d", name, dims.size()));
  }
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0 || n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GgufWriter: tensor '%s' has a bad dim %d", name, d));
    }
    n *= d;
  }
  if (dims[0] % traits->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: tensor '%s' row length %d is not a multiple of the %s block size %d", name,
        dims[0], traits->name, traits->block_size));
  }
  absl::StatusOr<uint64_t> want = RowBytes(type, n);
  if (!want.ok()) return want.status();
  if (*want != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: tensor '%s' needs %d bytes, got %d", name, *want, bytes.size()));
  }
  tensors_.push_back({std::move(name), type, std::move(dims), std::move(bytes)});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorF32(std::string name, GgmlType type, std::vector<int64_t> dims,
                                      const std::vector<float>& values) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0 || n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GgufWriter: tensor '%s' has a bad dim %d", name, d));
    }
    n *= d;
  }
  if (static_cast<uint64_t>(n) != values.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: tensor '%s' has %d elements but %d values were given", name, n,
        values.size()));
  }
  absl::StatusOr<uint64_t> nbytes = RowBytes(type, n);
  if (!nbytes.ok()) return nbytes.status();
  std::vector<uint8_t> bytes(*nbytes);
  absl::Status st = QuantizeRow(type, values.data(), bytes.data(), n);
  if (!st.ok()) return st;
  return AddTensor(std::move(name), type, std::move(dims), std::move(bytes));
}

absl::StatusOr<std::string> GgufWriter::Serialize() const {
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GgufWriter: can only write GGUF v2/v3, not v%d", version_));
  }
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 ||
      alignment_ > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GgufWriter: alignment %d is not a power of two", alignment_));
  }
  // general.alignment, when present, must agree with the layout we write; when absent and
  // not the default, we add it so readers find the data.
  std::vector<std::pair<std::string, Value>> metadata = metadata_;
  bool has_alignment = false;
  for (const auto& [k, v] : metadata) {
    if (k != "general.alignment") continue;
    has_alignment = true;
    const uint64_t* a = std::get_if<uint64_t>(&v.data);
    if (v.type != ValueType::kUint32 || a == nullptr || *a != alignment_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "GgufWriter: general.alignment must be uint32 %d to match the writer", alignment_));
    }
  }
  if (!has_alignment && alignment_ != 32) {
    metadata.emplace_back("general.alignment", Value::U32(static_cast<uint32_t>(alignment_)));
  }

  std::string out;
  Put<uint32_t>(&out, kMagic);
  Put<uint32_t>(&out, version_);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, metadata.size());
  for (const auto& [key, value] : metadata) {
    PutString(&out, key);
    Put<uint32_t>(&out, static_cast<uint32_t>(value.type));
    absl::Status st = PutValue(&out, key, value);
    if (!st.ok()) return st;
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&out, static_cast<uint64_t>(d));
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, offset);
    offset += (t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  Pad(&out, alignment_);
  for (const PendingTensor& t : tensors_) {
    out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    Pad(&out, alignment_);
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  absl::StatusOr<std::string> bytes = Serialize();
  if (!bytes.ok()) return bytes.status();
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (f == nullptr) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err), absl::StrFormat(
        "GgufWriter: cannot create %s: %s", path, std::strerror(err)));
  }
  if (std::fwrite(bytes->data(), 1, bytes->size(), f.get()) != bytes->size()) {
    return absl::DataLossError(absl::StrFormat("GgufWriter: short write to %s", path));
  }
  if (std::fclose(f.release()) != 0) {
    return absl::DataLossError(absl::StrFormat("GgufWriter: cannot close %s", path));
  }
  return absl::OkStatus();
}

}  // namespace specd::gguf
