// GGUF layout (v2/v3, little-endian):
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x { string key | u32 value_type | value }
//   n_tensors x { string name | u32 n_dims | u64 dims[n_dims] | u32 type | u64 offset }
//   padding to `general.alignment` (default 32) | tensor data (each offset aligned)
// where string = { u64 len | bytes } and array = { u32 elem_type | u64 count | elems }.
// Everything read from the file is treated as hostile: each count is checked against the bytes
// that remain before anything is allocated, and every size computation is overflow-checked.
#include "common/gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/str_format.h"

namespace specd::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 8;  // nested arrays deeper than this are rejected (stack safety)
constexpr uint32_t kMaxDims = 4;

#define SPECD_GGUF_RETURN_IF_ERROR(expr) \
  do {                                   \
    absl::Status _st = (expr);           \
    if (!_st.ok()) return _st;           \
  } while (0)

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kFloat64); }

// Smallest encoding of one value of type t, used to bound counts by the bytes left.
uint64_t MinEncodedSize(ValueType t) {
  switch (t) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kBool: return 1;
    case ValueType::kUint16: case ValueType::kInt16: return 2;
    case ValueType::kUint32: case ValueType::kInt32: case ValueType::kFloat32: return 4;
    case ValueType::kUint64: case ValueType::kInt64: case ValueType::kFloat64: return 8;
    case ValueType::kString: return 8;   // u64 length
    case ValueType::kArray: return 12;   // u32 type + u64 count
  }
  return 1;
}

// Bounds-checked little-endian cursor over the file image. Every error names the source, the
// problem and the byte offset where it was found.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, std::string_view source)
      : base_(base), size_(size), source_(source) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Error(uint64_t at, std::string_view msg) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf %s: %s at byte offset %d", source_, msg, at));
  }

  // `what` names the field; `key` (may be empty) the metadata key or tensor it belongs to.
  // Messages are only formatted on failure: this runs once per vocabulary token.
  absl::Status Need(uint64_t n, std::string_view what, std::string_view key) const {
    if (remaining() < n) {
      return Error(pos_, absl::StrFormat("truncated %s%s: need %d bytes, only %d left", what,
                                         Owner(key), n, remaining()));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Read(T* out, std::string_view what, std::string_view key = {}) {
    SPECD_GGUF_RETURN_IF_ERROR(Need(sizeof(T), what, key));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, std::string_view what, std::string_view key = {}) {
    const uint64_t at = pos_;
    uint64_t len;
    SPECD_GGUF_RETURN_IF_ERROR(Read(&len, what, key));
    if (len > remaining()) {
      return Error(at, absl::StrFormat("truncated %s%s: string length %d exceeds the %d bytes left",
                                       what, Owner(key), len, remaining()));
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return absl::OkStatus();
  }

  static std::string Owner(std::string_view key) {
    return key.empty() ? std::string() : absl::StrFormat(" of '%s'", key);
  }

  absl::Status ReadValue(ValueType type, int depth, std::string_view key, Value* out) {
    out->type = type;
    switch (type) {
      case ValueType::kUint8: return ReadInt<uint8_t>(key, out);
      case ValueType::kInt8: return ReadInt<int8_t>(key, out);
      case ValueType::kUint16: return ReadInt<uint16_t>(key, out);
      case ValueType::kInt16: return ReadInt<int16_t>(key, out);
      case ValueType::kUint32: return ReadInt<uint32_t>(key, out);
      case ValueType::kInt32: return ReadInt<int32_t>(key, out);
      case ValueType::kUint64: return ReadInt<uint64_t>(key, out);
      case ValueType::kInt64: return ReadInt<int64_t>(key, out);
      case ValueType::kFloat32: {
        float v;
        SPECD_GGUF_RETURN_IF_ERROR(Read(&v, "value", key));
        out->data = double{v};
        return absl::OkStatus();
      }
      case ValueType::kFloat64: {
        double v;
        SPECD_GGUF_RETURN_IF_ERROR(Read(&v, "value", key));
        out->data = v;
        return absl::OkStatus();
      }
      case ValueType::kBool: {
        const uint64_t at = pos_;
        uint8_t v;
        SPECD_GGUF_RETURN_IF_ERROR(Read(&v, "value", key));
        if (v > 1) return Error(at, absl::StrFormat("invalid bool value %d for key '%s'", v, key));
        out->data = v == 1;
        return absl::OkStatus();
      }
      case ValueType::kString: {
        std::string s;
        SPECD_GGUF_RETURN_IF_ERROR(ReadString(&s, "string value", key));
        out->data = std::move(s);
        return absl::OkStatus();
      }
      case ValueType::kArray: return ReadArray(depth, key, out);
    }
    return Error(pos_, "unreachable value type");
  }

 private:
  template <typename T>
  absl::Status ReadInt(std::string_view key, Value* out) {
    T v;
    SPECD_GGUF_RETURN_IF_ERROR(Read(&v, "value", key));
    if constexpr (std::is_signed_v<T>) {
      out->data = static_cast<int64_t>(v);
    } else {
      out->data = static_cast<uint64_t>(v);
    }
    return absl::OkStatus();
  }

  absl::Status ReadArray(int depth, std::string_view key, Value* out) {
    if (depth >= kMaxArrayDepth) {
      return Error(pos_, absl::StrFormat("arrays nested deeper than %d levels in key '%s'",
                                         kMaxArrayDepth, key));
    }
    const uint64_t type_at = pos_;
    uint32_t raw_type;
    SPECD_GGUF_RETURN_IF_ERROR(Read(&raw_type, "array type", key));
    if (!KnownValueType(raw_type)) {
      return Error(type_at, absl::StrFormat("unknown value type %d for array elements of key '%s'",
                                            raw_type, key));
    }
    const ValueType elem_type = static_cast<ValueType>(raw_type);
    const uint64_t count_at = pos_;
    uint64_t count;
    SPECD_GGUF_RETURN_IF_ERROR(Read(&count, "array length", key));
    // Bound the count by the bytes left before reserving (a hostile 2^60 must not allocate).
    if (count > remaining() / MinEncodedSize(elem_type)) {
      return Error(count_at, absl::StrFormat(
          "truncated array: %d elements of %s for key '%s' cannot fit in the %d bytes left",
          count, ValueTypeName(elem_type), key, remaining()));
    }
    ArrayValue arr;
    arr.element_type = elem_type;
    arr.elements.resize(static_cast<size_t>(count));
    for (Value& v : arr.elements) {
      SPECD_GGUF_RETURN_IF_ERROR(ReadValue(elem_type, depth + 1, key, &v));
    }
    out->data = std::move(arr);
    return absl::OkStatus();
  }

  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string source_;
};

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrFormat("gguf %s: cannot open: %s", path, std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrFormat("gguf %s: cannot stat: %s", path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrFormat("gguf %s: not a regular file", path));
  }
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    // Read-only private mapping: weights are paged in on demand, never copied.
    void* m = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::Status(absl::ErrnoToStatusCode(err),
                          absl::StrFormat("gguf %s: mmap failed: %s", path, std::strerror(err)));
    }
    file->mapping_ = m;
    file->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  SPECD_GGUF_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(absl::Span<const uint8_t> bytes) {
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->path_ = "<buffer>";
  file->base_ = bytes.data();
  file->size_ = bytes.size();
  SPECD_GGUF_RETURN_IF_ERROR(file->Parse());
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

absl::Status GgufFile::Parse() {
  Cursor c(base_, size_, path_);

  // --- Header ---
  uint32_t magic;
  SPECD_GGUF_RETURN_IF_ERROR(c.Read(&magic, "header (magic)"));
  if (magic != kMagic) {
    return c.Error(0, absl::StrFormat("bad magic 0x%08x, expected \"GGUF\" (0x%08x)", magic,
                                      kMagic));
  }
  SPECD_GGUF_RETURN_IF_ERROR(c.Read(&version_, "header (version)"));
  if (version_ != 2 && version_ != 3) {
    const bool swapped = version_ == 0x02000000 || version_ == 0x03000000;
    return c.Error(4, absl::StrFormat("unsupported GGUF version %d (only 2 and 3 are supported%s)",
                                      version_, swapped ? "; big-endian files are not" : ""));
  }
  uint64_t n_tensors, n_kv;
  const uint64_t n_tensors_at = c.pos();
  SPECD_GGUF_RETURN_IF_ERROR(c.Read(&n_tensors, "header (tensor count)"));
  const uint64_t n_kv_at = c.pos();
  SPECD_GGUF_RETURN_IF_ERROR(c.Read(&n_kv, "header (metadata count)"));
  // Each key/value takes >= 13 bytes (u64 key length, u32 type, 1-byte value) and each tensor
  // info >= 24 bytes (u64 name length, u32 n_dims, u32 type, u64 offset).
  if (n_kv > c.remaining() / 13) {
    return c.Error(n_kv_at, absl::StrFormat(
        "metadata count %d exceeds what the remaining %d bytes can hold (truncated or corrupt "
        "file)", n_kv, c.remaining()));
  }
  if (n_tensors > c.remaining() / 24) {
    return c.Error(n_tensors_at, absl::StrFormat(
        "tensor count %d exceeds what the remaining %d bytes can hold (truncated or corrupt "
        "file)", n_tensors, c.remaining()));
  }

  // --- Metadata ---
  metadata_.reserve(static_cast<size_t>(n_kv));
  uint64_t alignment_at = 0;  // where general.alignment's value type was read
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t key_at = c.pos();
    std::string key;
    SPECD_GGUF_RETURN_IF_ERROR(c.ReadString(&key, absl::StrFormat("metadata key #%d", i)));
    if (key_index_.contains(key)) {
      return c.Error(key_at, absl::StrFormat("duplicate metadata key '%s'", key));
    }
    const uint64_t type_at = c.pos();
    uint32_t raw_type;
    SPECD_GGUF_RETURN_IF_ERROR(c.Read(&raw_type, "value type", key));
    if (!KnownValueType(raw_type)) {
      return c.Error(type_at,
                     absl::StrFormat("unknown value type %d for key '%s'", raw_type, key));
    }
    if (key == "general.alignment") alignment_at = type_at;
    Value value;
    SPECD_GGUF_RETURN_IF_ERROR(c.ReadValue(static_cast<ValueType>(raw_type), 0, key, &value));
    key_index_.emplace(key, metadata_.size());
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  alignment_ = kDefaultAlignment;
  if (const Value* a = Find("general.alignment"); a != nullptr) {
    const uint64_t* v = std::get_if<uint64_t>(&a->data);
    if (v == nullptr || a->type == ValueType::kBool || !IsPowerOfTwo(*v) ||
        *v > std::numeric_limits<uint32_t>::max()) {
      return c.Error(alignment_at,
                     "general.alignment must be a nonzero power-of-two unsigned integer");
    }
    alignment_ = *v;
  }

  // --- Tensor infos ---
  tensors_.reserve(static_cast<size_t>(n_tensors));
  std::vector<uint64_t> offset_fields;  // where each tensor's offset was read (for errors)
  offset_fields.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    const uint64_t name_at = c.pos();
    SPECD_GGUF_RETURN_IF_ERROR(c.ReadString(&t.name, absl::StrFormat("tensor name #%d", i)));
    if (tensor_index_.contains(t.name)) {
      return c.Error(name_at, absl::StrFormat("duplicate tensor name '%s'", t.name));
    }
    const char* what = "tensor info";
    const uint64_t ndims_at = c.pos();
    uint32_t n_dims;
    SPECD_GGUF_RETURN_IF_ERROR(c.Read(&n_dims, what, t.name));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return c.Error(ndims_at, absl::StrFormat("tensor '%s' has %d dims, expected 1..%d", t.name,
                                               n_dims, kMaxDims));
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim_at = c.pos();
      uint64_t raw;
      SPECD_GGUF_RETURN_IF_ERROR(c.Read(&raw, what, t.name));
      const int64_t dim = static_cast<int64_t>(raw);
      if (dim <= 0) {
        return c.Error(dim_at, absl::StrFormat("tensor '%s' dim %d is %d, dims must be > 0",
                                               t.name, d, dim));
      }
      if (n_elements > std::numeric_limits<int64_t>::max() / dim) {
        return c.Error(dim_at, absl::StrFormat("tensor '%s' element count overflows (dims product)",
                                               t.name));
      }
      n_elements *= dim;
      t.dims.push_back(dim);
    }
    t.num_elements = n_elements;
    const uint64_t type_at = c.pos();
    uint32_t raw_type;
    SPECD_GGUF_RETURN_IF_ERROR(c.Read(&raw_type, what, t.name));
    absl::StatusOr<GgmlTypeTraits> traits = GetTypeTraits(raw_type);
    if (!traits.ok()) {
      return c.Error(type_at, absl::StrFormat("unknown tensor type id %d for tensor '%s'",
                                              raw_type, t.name));
    }
    t.type = static_cast<GgmlType>(raw_type);
    // Quantized rows are stored block by block, so each row must hold whole blocks.
    if (t.dims[0] % traits->block_size != 0) {
      return c.Error(type_at, absl::StrFormat(
          "tensor '%s' row length %d (dims[0]) is not a multiple of the %s block size %d",
          t.name, t.dims[0], traits->name, traits->block_size));
    }
    absl::StatusOr<uint64_t> bytes = RowBytes(t.type, n_elements);
    if (!bytes.ok()) {
      return c.Error(type_at, absl::StrFormat("tensor '%s': %s", t.name,
                                              std::string(bytes.status().message())));
    }
    t.num_bytes = *bytes;
    const uint64_t offset_at = c.pos();
    SPECD_GGUF_RETURN_IF_ERROR(c.Read(&t.offset, what, t.name));
    if (t.offset % alignment_ != 0) {
      return c.Error(offset_at, absl::StrFormat(
          "tensor '%s' data offset %d is not aligned to %d", t.name, t.offset, alignment_));
    }
    t.data = nullptr;
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
    offset_fields.push_back(offset_at);
  }

  // --- Tensor data ---
  // c.pos() <= size_ and alignment_ <= 2^32, so this cannot overflow.
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > size_) {
    return c.Error(c.pos(), absl::StrFormat(
        "truncated data: tensor data section starts at byte %d but the file has %d bytes",
        data_offset_, size_));
  }
  const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorInfo& t = tensors_[i];
    if (t.offset > data_size || t.num_bytes > data_size - t.offset) {
      return c.Error(offset_fields[i], absl::StrFormat(
          "tensor '%s' data out of bounds: %d bytes at data offset %d, but the data section "
          "(from byte %d) holds only %d bytes; the tensor's offset field is",
          t.name, t.num_bytes, t.offset, data_offset_, data_size));
    }
    t.data = base_ + data_offset_ + t.offset;
  }
  return absl::OkStatus();
}

const Value* GgufFile::Find(std::string_view key) const {
  auto it = key_index_.find(absl::string_view(key.data(), key.size()));
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::Status NotFound(std::string_view key) {
  return absl::NotFoundError(absl::StrFormat("gguf metadata key '%s' not found", key));
}

absl::Status WrongType(std::string_view key, const Value& v, std::string_view want) {
  std::string have = ValueTypeName(v.type);
  if (const auto* arr = std::get_if<ArrayValue>(&v.data)) {
    have = absl::StrFormat("%s of %s", have, ValueTypeName(arr->element_type));
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("gguf metadata key '%s' is %s, expected %s", key, have, want));
}

bool IsIntegerType(ValueType t) {
  switch (t) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kUint16:
    case ValueType::kInt16: case ValueType::kUint32: case ValueType::kInt32:
    case ValueType::kUint64: case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// Integer value as int64 if it fits.
bool AsInt(const Value& v, int64_t* out) {
  if (!IsIntegerType(v.type)) return false;
  if (const auto* u = std::get_if<uint64_t>(&v.data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(*u);
    return true;
  }
  if (const auto* s = std::get_if<int64_t>(&v.data)) {
    *out = *s;
    return true;
  }
  return false;
}

bool AsFloat(const Value& v, double* out) {
  if (v.type == ValueType::kFloat32 || v.type == ValueType::kFloat64) {
    if (const auto* d = std::get_if<double>(&v.data)) {
      *out = *d;
      return true;
    }
    return false;
  }
  if (const auto* u = std::get_if<uint64_t>(&v.data); u && IsIntegerType(v.type)) {
    *out = static_cast<double>(*u);
    return true;
  }
  if (const auto* s = std::get_if<int64_t>(&v.data); s && IsIntegerType(v.type)) {
    *out = static_cast<double>(*s);
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return NotFound(key);
  int64_t out;
  if (!AsInt(*v, &out)) return WrongType(key, *v, "an integer that fits in int64");
  return out;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return NotFound(key);
  double out;
  if (!AsFloat(*v, &out)) return WrongType(key, *v, "a number");
  return out;
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return NotFound(key);
  const bool* b = std::get_if<bool>(&v->data);
  if (v->type != ValueType::kBool || b == nullptr) return WrongType(key, *v, "bool");
  return *b;
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return NotFound(key);
  const std::string* s = std::get_if<std::string>(&v->data);
  if (v->type != ValueType::kString || s == nullptr) return WrongType(key, *v, "string");
  return *s;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return NotFound(key);
  const ArrayValue* arr = std::get_if<ArrayValue>(&v->data);
  if (arr == nullptr || arr->element_type != ValueType::kString) {
    return WrongType(key, *v, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(arr->elements.size());
  for (const Value& e : arr->elements) {
    const std::string* s = std::get_if<std::string>(&e.data);
    if (s == nullptr) return WrongType(key, *v, "array of string");
    out.push_back(*s);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return NotFound(key);
  const ArrayValue* arr = std::get_if<ArrayValue>(&v->data);
  if (arr == nullptr || !IsIntegerType(arr->element_type)) {
    return WrongType(key, *v, "array of integers");
  }
  std::vector<int64_t> out(arr->elements.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!AsInt(arr->elements[i], &out[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "gguf metadata key '%s': element %d does not fit in int64", key, i));
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return NotFound(key);
  const ArrayValue* arr = std::get_if<ArrayValue>(&v->data);
  if (arr == nullptr || arr->element_type == ValueType::kString ||
      arr->element_type == ValueType::kArray || arr->element_type == ValueType::kBool) {
    return WrongType(key, *v, "array of numbers");
  }
  std::vector<float> out(arr->elements.size());
  for (size_t i = 0; i < out.size(); ++i) {
    double d;
    if (!AsFloat(arr->elements[i], &d)) return WrongType(key, *v, "array of numbers");
    out[i] = static_cast<float>(d);
  }
  return out;
}

}  // namespace specd::gguf
