// libFuzzer target for the GGUF reader: any byte string must either parse or fail with a
// status; on success every tensor's data span must be readable and the first block of each
// dequantizable tensor must decode (ASan/UBSan catch any out-of-bounds or undefined behaviour).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/gguf/ggml_type.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/quants.h"

using specd::gguf::GgufFile;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = GgufFile::FromBuffer({data, size});
  if (!file.ok()) {
    if (file.status().message().empty()) std::abort();  // every error must say something
    return 0;
  }
  const GgufFile& g = **file;
  // Typed getters on whatever keys exist (they must never crash on a type mismatch).
  for (const auto& [key, value] : g.metadata()) {
    (void)g.GetInt(key);
    (void)g.GetFloat(key);
    (void)g.GetString(key);
    (void)g.GetStringArray(key);
    (void)g.GetIntArray(key);
    (void)g.GetFloatArray(key);
  }
  volatile uint8_t sink = 0;
  float block[256];
  for (const specd::gguf::TensorInfo& t : g.tensors()) {
    uint8_t acc = 0;
    for (uint64_t i = 0; i < t.num_bytes; ++i) acc ^= t.data[i];  // touch the whole span
    sink = sink ^ acc;
    auto traits = specd::gguf::GetTypeTraits(t.type);
    if (!traits.ok()) std::abort();  // the reader must have rejected unknown types
    if (traits->can_dequantize && t.num_elements >= traits->block_size) {
      if (!specd::gguf::DequantizeRow(t.type, t.data, block, traits->block_size).ok()) {
        std::abort();
      }
      sink = sink ^ static_cast<uint8_t>(block[0] == block[0]);
    }
  }
  return 0;
}
