#include "common/gguf/ggml_type.h"

#include <limits>

#include "absl/strings/str_format.h"

namespace specd::gguf {
namespace {

// K-quants group 256 values into one "super-block".
constexpr int64_t kQK_K = 256;

struct Entry {
  uint32_t id;
  GgmlTypeTraits traits;
};

// Byte sizes follow the block structs of the GGUF format (see quants.cc for the layouts).
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, true}},
    {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 2 + 16, true}},          // f16 d, 16 bytes of nibbles
    {3, {"Q4_1", 32, 2 + 2 + 16, true}},      // f16 d, f16 m, nibbles
    {6, {"Q5_0", 32, 2 + 4 + 16, true}},      // f16 d, 32 high bits, nibbles
    {7, {"Q5_1", 32, 2 + 2 + 4 + 16, true}},  // f16 d, f16 m, high bits, nibbles
    {8, {"Q8_0", 32, 2 + 32, true}},          // f16 d, 32 x int8
    // f16 d, f16 s (= d * sum(q)), 32 x int8. The C struct is 36 bytes; note the PyPI `gguf`
    // package still lists 40 (an older float layout) — Q8_1 never appears in model files.
    {9, {"Q8_1", 32, 2 + 2 + 32, true}},
    {10, {"Q2_K", kQK_K, kQK_K / 16 + kQK_K / 4 + 2 + 2, true}},      // 84
    {11, {"Q3_K", kQK_K, kQK_K / 8 + kQK_K / 4 + 12 + 2, true}},      // 110
    {12, {"Q4_K", kQK_K, 2 + 2 + 12 + kQK_K / 2, true}},              // 144
    {13, {"Q5_K", kQK_K, 2 + 2 + 12 + kQK_K / 8 + kQK_K / 2, true}},  // 176
    {14, {"Q6_K", kQK_K, kQK_K / 2 + kQK_K / 4 + kQK_K / 16 + 2, true}},  // 210
    {15, {"Q8_K", kQK_K, 4 + kQK_K + 2 * (kQK_K / 16), true}},           // 292
    {24, {"I8", 1, 1, true}},
    {25, {"I16", 1, 2, true}},
    {26, {"I32", 1, 4, true}},
    {27, {"I64", 1, 8, true}},
    {28, {"F64", 1, 8, true}},
    {30, {"BF16", 1, 2, true}},
};

const GgmlTypeTraits* Lookup(uint32_t id) {
  for (const Entry& e : kTypes) {
    if (e.id == id) return &e.traits;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<GgmlTypeTraits> GetTypeTraits(uint32_t raw_type) {
  const GgmlTypeTraits* t = Lookup(raw_type);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown ggml tensor type id %u", raw_type));
  }
  return *t;
}

std::string_view GgmlTypeName(GgmlType t) {
  const GgmlTypeTraits* traits = Lookup(static_cast<uint32_t>(t));
  return traits == nullptr ? std::string_view("?") : traits->name;
}

absl::StatusOr<uint64_t> RowBytes(GgmlType t, int64_t n) {
  absl::StatusOr<GgmlTypeTraits> traits = GetTypeTraits(t);
  if (!traits.ok()) return traits.status();
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("negative element count %d", n));
  }
  if (n % traits->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("element count %d is not a multiple of the %s block size %d", n,
                        traits->name, traits->block_size));
  }
  const uint64_t blocks = static_cast<uint64_t>(n / traits->block_size);
  const uint64_t size = static_cast<uint64_t>(traits->type_size);
  if (blocks > std::numeric_limits<uint64_t>::max() / size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("byte size of %d %s elements overflows", n, traits->name));
  }
  return blocks * size;
}

}  // namespace specd::gguf
