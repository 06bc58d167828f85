// A stand-in for a GPU backend on the CPU: a Backend whose memory the host cannot touch.
// Its memory is one mapped arena kept PROT_NONE except while one of the backend's own calls
// runs (an op, Upload, Download, Copy2D), so a model that reads or writes an activation, a
// weight or the KV pool from host code crashes instead of passing; and every pointer an op
// is handed must lie in the arena, or the call is recorded as a violation. The ops themselves
// are the reference backend's. What a model does right here it does right on a device whose
// memory is not the host's (tests/unit/device_resident_test.cc). It also records steps as
// CUDA graphs do (below), so a model that hands a recorded op anything a later step changes
// gets a wrong answer here too.
#ifndef SPECD_TESTING_FENCED_BACKEND_H_
#define SPECD_TESTING_FENCED_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace specd::testing {

class FencedBackend;

// Keeps the arena open (readable and writable) while it lives; nests.
class FenceOpening {
 public:
  explicit FenceOpening(FencedBackend& backend);
  ~FenceOpening();
  FenceOpening(const FenceOpening&) = delete;
  FenceOpening& operator=(const FenceOpening&) = delete;

 private:
  FencedBackend& backend_;
};

// capacity: bytes of address space reserved for the arena (freed memory is not reused).
// replays_steps: steps are recorded and replayed as the CUDA backend's graphs are
// (Backend::RunStep): a shape's first step runs op by op, the second is recorded, then every
// step of that shape replays the recorded ops with the arguments they were recorded with.
// Uploads, downloads, allocations, plans and verification refuse while a step is recorded.
std::unique_ptr<FencedBackend> MakeFencedBackend(size_t capacity = size_t{1} << 30,
                                                 bool replays_steps = true);

class FencedBackend : public engine::Backend {
 public:
  // Ops handed a pointer outside the arena: "Op: argument" each.
  virtual std::vector<std::string> violations() const = 0;
  // Bytes of the arena in use.
  virtual size_t used() const = 0;
  // Steps verified where their logits are (VerifyBlockwise).
  virtual int64_t blockwise_verifications() const = 0;
  // Draft forwards proposed where their logits are (ProposeBlockwise).
  virtual int64_t blockwise_proposals() const = 0;

 protected:
  friend class FenceOpening;
  virtual void Open() = 0;
  virtual void Close() = 0;
};

}  // namespace specd::testing

#endif  // SPECD_TESTING_FENCED_BACKEND_H_
