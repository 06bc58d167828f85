#include "common/gguf/gguf_value.h"

namespace specd::gguf {

const char* ValueTypeName(ValueType t) {
  switch (t) {
    case ValueType::kUint8: return "uint8";
    case ValueType::kInt8: return "int8";
    case ValueType::kUint16: return "uint16";
    case ValueType::kInt16: return "int16";
    case ValueType::kUint32: return "uint32";
    case ValueType::kInt32: return "int32";
    case ValueType::kFloat32: return "float32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "uint64";
    case ValueType::kInt64: return "int64";
    case ValueType::kFloat64: return "float64";
  }
  return "?";
}

}  // namespace specd::gguf
