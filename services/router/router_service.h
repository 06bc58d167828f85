// The public specd.v1.Generation service: validation, then the RouterEngine. Generate and
// GenerateStream use the callback API; a client disconnect cancels the request. Every method
// is raw (ByteBuffer in and out) so that the service parses requests itself: a payload that is
// not a valid message gets INVALID_ARGUMENT naming the field, like every other bad input.
#ifndef SPECD_SERVICES_ROUTER_ROUTER_SERVICE_H_
#define SPECD_SERVICES_ROUTER_ROUTER_SERVICE_H_

#include <atomic>
#include <string>

#include "absl/time/time.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/common/metrics.h"
#include "services/router/api_keys.h"
#include "services/router/router_engine.h"
#include "specd/v1/generation.grpc.pb.h"

namespace specd::router {

using RawGenerationService = specd::v1::Generation::WithRawCallbackMethod_Generate<
    specd::v1::Generation::WithRawCallbackMethod_GenerateStream<
        specd::v1::Generation::WithRawCallbackMethod_Tokenize<
            specd::v1::Generation::WithRawCallbackMethod_GetModelInfo<
                specd::v1::Generation::Service>>>>;

class GenerationService final : public RawGenerationService {
 public:
  // `chat` may be null. All pointers must outlive the service.
  GenerationService(RouterEngine* engine, const tok::Tokenizer* tokenizer,
                    const tok::ChatTemplate* chat, std::string target_model,
                    std::string draft_model, services::Metrics* metrics)
      : engine_(engine),
        tokenizer_(tokenizer),
        chat_(chat),
        target_model_(std::move(target_model)),
        draft_model_(std::move(draft_model)),
        metrics_(metrics) {}

  // With keys, every call needs `authorization: Bearer <key>` (UNAUTHENTICATED otherwise).
  // `keys` must outlive the service.
  void set_api_keys(const ApiKeys* keys) { keys_ = keys; }

  // When the last call of any method arrived (drain waits for calls to stop coming before it
  // closes the listener: a call that races the close cannot be answered UNAVAILABLE).
  absl::Time last_call() const { return absl::FromUnixNanos(last_call_ns_.load()); }

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* req) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override;

 private:
  RouterEngine* engine_;
  const tok::Tokenizer* tokenizer_;
  const tok::ChatTemplate* chat_;
  // Counts a request refused before it reached the engine (the engine counts the rest).
  absl::Status Refused(absl::Status s);
  // OK, or UNAUTHENTICATED (counted like any refusal).
  absl::Status Authorize(grpc::CallbackServerContext* ctx);
  // Authorize, then parse: OK, or the refusal (counted).
  absl::Status Admit(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& bytes,
                     google::protobuf::Message* request);
  absl::Status TokenizeRequest(const specd::v1::TokenizeRequest& req,
                               specd::v1::TokenizeResponse* resp);
  void FillModelInfo(specd::v1::ModelInfo* info);
  const ApiKeys* keys_ = nullptr;
  std::atomic<int64_t> last_call_ns_{0};

  std::string target_model_, draft_model_;
  services::Metrics* metrics_;
};

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_ROUTER_SERVICE_H_
