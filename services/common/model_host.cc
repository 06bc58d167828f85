#include "services/common/model_host.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"

namespace specd::services {

absl::StatusOr<std::unique_ptr<ModelHost>> ModelHost::Load(const ModelHostOptions& options,
                                                           engine::Communicator* comm) {
  if (options.model_path.empty()) return absl::InvalidArgumentError("model path is required");
  if (options.kv_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_blocks must be > 0, got ", options.kv_blocks));
  }
  if (options.max_batch_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_tokens must be > 0, got ", options.max_batch_tokens));
  }
  std::unique_ptr<ModelHost> h(new ModelHost());
  h->options_ = options;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(options.model_path);
  if (!file.ok()) return file.status();
  h->file_ = std::move(*file);
  absl::StatusOr<std::unique_ptr<tok::Tokenizer>> tk = tok::Tokenizer::FromGguf(*h->file_);
  if (!tk.ok()) return tk.status();
  h->tokenizer_ = std::move(*tk);
  h->backend_ = engine::MakeCpuBackend(options.threads);
  engine::ModelOptions mo;
  mo.max_batch_tokens = options.max_batch_tokens;
  mo.max_logit_rows = options.max_batch_tokens;
  mo.num_layers = options.num_layers;
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> model = engine::LlamaModel::Load(
      *h->file_, h->backend_.get(), comm != nullptr ? comm : &h->local_comm_, mo);
  if (!model.ok()) return model.status();
  h->model_ = std::move(*model);
  engine::KvCacheConfig kc =
      h->model_->MakeKvCacheConfig(options.kv_blocks, options.kv_block_size, options.kv_dtype);
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(kc);
  if (!kv.ok()) return kv.status();
  h->kv_ = std::move(*kv);
  for (int32_t id = 0; id < h->tokenizer_->vocab_size(); ++id) {
    if (h->tokenizer_->IsEndOfGeneration(id)) h->eos_ids_.push_back(id);
  }
  std::random_device rd;
  h->instance_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return h;
}

std::vector<int32_t>* ModelHost::History(engine::SeqId seq) {
  auto it = history_.find(seq);
  return it == history_.end() ? nullptr : &it->second;
}

absl::Status ModelHost::AddSequence(engine::SeqId seq) {
  if (absl::Status s = kv_->AddSequence(seq); !s.ok()) return s;
  history_[seq].clear();
  return absl::OkStatus();
}

void ModelHost::Release(engine::SeqId seq) {
  kv_->FreeSequence(seq);
  history_.erase(seq);
}

specd::internal::v1::ServiceInfo ModelHost::Info() const {
  specd::internal::v1::ServiceInfo info;
  info.set_model(std::filesystem::path(options_.model_path).filename().string());
  info.set_architecture(model_->config().architecture);
  info.set_vocab_size(model_->vocab_size());
  info.set_vocab_fingerprint(tokenizer_->Fingerprint());
  info.set_context_length(model_->config().context_length);
  info.set_kv_block_size(kv_->config().block_size);
  info.set_kv_num_blocks(kv_->num_blocks());
  info.set_kv_used_blocks(kv_->num_used_blocks());
  info.set_max_batch_tokens(options_.max_batch_tokens);
  info.set_num_sequences(static_cast<int32_t>(kv_->num_sequences()));
  info.set_instance_id(instance_id_);
  info.set_world_size(1);
  info.set_num_layers(model_->num_layers());
  info.set_model_layers(model_->config().num_layers);
  return info;
}

specd::internal::v1::KvUsage ModelHost::Usage() const {
  specd::internal::v1::KvUsage u;
  u.set_used_blocks(kv_->num_used_blocks());
  u.set_free_blocks(kv_->num_free_blocks());
  u.set_num_sequences(static_cast<int32_t>(kv_->num_sequences()));
  return u;
}

}  // namespace specd::services
