// A paged KV pool in host memory for the kernel tests (every KvDtype; int8 with its scales).
#ifndef SPECD_TESTS_KERNELS_KV_POOL_H_
#define SPECD_TESTS_KERNELS_KV_POOL_H_

#include <cstdint>
#include <vector>

#include "kernels/kernel_types.h"

namespace specd::kernels {

struct KvPool {
  KvDtype dtype;
  std::vector<uint8_t> k, v;
  std::vector<float> k_scale, v_scale;  // kInt8
  PagedKvLayer layer;
  KvPool(KvDtype dt, int64_t nblk, int32_t bs, int32_t hkv, int32_t d) : dtype(dt) {
    const size_t bytes = static_cast<size_t>(nblk * bs * hkv * d * KvDtypeSize(dt));
    k.assign(bytes, 0);
    v.assign(bytes, 0);
    layer = PagedKvLayer{dt, k.data(), v.data(), nblk, bs, hkv, d};
    if (dt == KvDtype::kInt8) {
      k_scale.assign(static_cast<size_t>(nblk * bs * hkv), 0.0f);
      v_scale.assign(k_scale.size(), 0.0f);
      layer.k_scale = k_scale.data();
      layer.v_scale = v_scale.data();
    }
  }
};

}  // namespace specd::kernels

#endif  // SPECD_TESTS_KERNELS_KV_POOL_H_
