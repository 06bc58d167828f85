// A GGUF metadata value: a scalar, a string, or a (possibly nested) array.
#ifndef SPECD_COMMON_GGUF_GGUF_VALUE_H_
#define SPECD_COMMON_GGUF_GGUF_VALUE_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace specd::gguf {

// On-disk ids; never renumber.
enum class ValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5,
  kFloat32 = 6, kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11,
  kFloat64 = 12,
};

struct Value;
struct ArrayValue {
  ValueType element_type = ValueType::kUint8;
  std::vector<Value> elements;
};

struct Value {
  ValueType type = ValueType::kUint8;
  // Integers (signed or unsigned, any width, and bool) are held widened; `type` keeps the
  // on-disk width so a writer reproduces it.
  std::variant<uint64_t, int64_t, double, bool, std::string, ArrayValue> data;

  static Value U8(uint8_t v) { return {ValueType::kUint8, uint64_t{v}}; }
  static Value I8(int8_t v) { return {ValueType::kInt8, int64_t{v}}; }
  static Value U16(uint16_t v) { return {ValueType::kUint16, uint64_t{v}}; }
  static Value I16(int16_t v) { return {ValueType::kInt16, int64_t{v}}; }
  static Value U32(uint32_t v) { return {ValueType::kUint32, uint64_t{v}}; }
  static Value I32(int32_t v) { return {ValueType::kInt32, int64_t{v}}; }
  static Value U64(uint64_t v) { return {ValueType::kUint64, v}; }
  static Value I64(int64_t v) { return {ValueType::kInt64, v}; }
  static Value F32(float v) { return {ValueType::kFloat32, double{v}}; }
  static Value F64(double v) { return {ValueType::kFloat64, v}; }
  static Value Bool(bool v) { return {ValueType::kBool, v}; }
  static Value Str(std::string v) { return {ValueType::kString, std::move(v)}; }
  static Value Array(ValueType element_type, std::vector<Value> elements) {
    return {ValueType::kArray, ArrayValue{element_type, std::move(elements)}};
  }
};

const char* ValueTypeName(ValueType t);

}  // namespace specd::gguf

#endif  // SPECD_COMMON_GGUF_GGUF_VALUE_H_
