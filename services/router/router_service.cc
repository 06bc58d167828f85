#include "services/router/router_service.h"

#include <deque>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "services/common/event_log.h"
#include "services/common/grpc_server.h"

namespace specd::router {

namespace {

using services::ToGrpc;

absl::Time DeadlineOf(grpc::CallbackServerContext* ctx) {
  const absl::Time d = absl::FromChrono(ctx->deadline());
  // No client deadline shows up as a far-future time point.
  return d > absl::Now() + absl::Hours(24 * 365) ? absl::InfiniteFuture() : d;
}

// Unary: accumulate, answer once.
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(RouterEngine* engine, grpc::ByteBuffer* out) : engine_(engine), out_(out) {}
  // The response the sink fills, serialized into gRPC's buffer on success.
  specd::v1::GenerateResponse& response() { return response_; }
  void FinishWith(const absl::Status& status) {
    if (status.ok()) *out_ = services::SerializeToByteBuffer(response_);
    Finish(ToGrpc(status));
  }
  void set_id(int64_t id) {
    absl::MutexLock l(&mu_);
    id_ = id;
    if (cancelled_) engine_->Cancel(id);
  }
  void OnCancel() override {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    if (id_ >= 0) engine_->Cancel(id_);
  }
  void OnDone() override { delete this; }

 private:
  RouterEngine* engine_;
  grpc::ByteBuffer* out_;
  specd::v1::GenerateResponse response_;
  absl::Mutex mu_;
  int64_t id_ ABSL_GUARDED_BY(mu_) = -1;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class UnarySink final : public RequestSink {
 public:
  explicit UnarySink(UnaryCall* call) : call_(call), resp_(&call->response()) {}
  void OnChunk(specd::v1::GenerateStreamResponse c) override {
    resp_->mutable_text()->append(c.text());
    resp_->mutable_token_ids()->MergeFrom(c.token_ids());
    resp_->mutable_logprobs()->MergeFrom(c.logprobs());
  }
  void OnDone(absl::Status status, specd::v1::Completion completion) override {
    if (status.ok()) {
      *resp_->mutable_completion() = std::move(completion);
    } else {
      resp_->Clear();
    }
    call_->FinishWith(status);
  }

 private:
  UnaryCall* call_;
  specd::v1::GenerateResponse* resp_;
};

// Shared between the stream reactor (deleted by gRPC in OnDone) and the engine's sink (kept
// until the engine's OnDone), so neither outlives what it touches.
class StreamCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  struct State {
    absl::Mutex mu;
    StreamCall* call ABSL_GUARDED_BY(mu) = nullptr;
    std::deque<grpc::ByteBuffer> queue ABSL_GUARDED_BY(mu);  // serialized responses
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;  // the engine is done
    bool finish_called ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
    int64_t id ABSL_GUARDED_BY(mu) = -1;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
  };

  StreamCall(RouterEngine* engine) : engine_(engine), state_(std::make_shared<State>()) {
    absl::MutexLock l(&state_->mu);
    state_->call = this;
  }
  std::shared_ptr<State> state() { return state_; }

  void set_id(int64_t id) {
    absl::MutexLock l(&state_->mu);
    state_->id = id;
    if (state_->cancelled) engine_->Cancel(id);
  }

  // Starts the next write or the Finish, whichever is due. Called without the lock.
  static void Pump(const std::shared_ptr<State>& s) {
    StreamCall* call = nullptr;
    const grpc::ByteBuffer* next = nullptr;
    bool finish = false;
    absl::Status status;
    {
      absl::MutexLock l(&s->mu);
      if (s->call == nullptr || s->writing || s->finish_called) return;
      call = s->call;
      if (!s->queue.empty()) {
        s->writing = true;
        next = &s->queue.front();  // deque: stays put while we push at the back
      } else if (s->finished) {
        s->finish_called = true;
        finish = true;
        status = s->status;
      } else {
        return;
      }
    }
    if (next != nullptr) {
      call->StartWrite(next);
    } else if (finish) {
      call->Finish(ToGrpc(status));
    }
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    {
      absl::MutexLock l(&state_->mu);
      state_->queue.pop_front();
      state_->writing = false;
      if (!ok) {
        // The client went away: drop the rest, the engine gets a Cancel.
        state_->queue.clear();
        state_->cancelled = true;
        if (state_->id >= 0) engine_->Cancel(state_->id);
        finish = !state_->finish_called;
        state_->finish_called = true;
      }
    }
    if (finish) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    if (ok) Pump(state_);
  }
  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock l(&state_->mu);
      state_->cancelled = true;
      if (state_->id >= 0) engine_->Cancel(state_->id);
      // Keep the message being written (if any): gRPC still reads it.
      while (state_->queue.size() > (state_->writing ? 1u : 0u)) state_->queue.pop_back();
      if (!state_->writing && !state_->finish_called) {
        state_->finish_called = true;
        finish = true;
      }
    }
    // gRPC may run reactions inline: never call into the reactor with the lock held.
    if (finish) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }
  void OnDone() override {
    {
      absl::MutexLock l(&state_->mu);
      state_->call = nullptr;
    }
    delete this;
  }

 private:
  RouterEngine* engine_;
  std::shared_ptr<State> state_;
};

class StreamSink final : public RequestSink {
 public:
  explicit StreamSink(std::shared_ptr<StreamCall::State> s) : s_(std::move(s)) {}
  void OnChunk(specd::v1::GenerateStreamResponse c) override {
    {
      absl::MutexLock l(&s_->mu);
      if (s_->call == nullptr || s_->cancelled) return;
      s_->queue.push_back(services::SerializeToByteBuffer(c));
    }
    StreamCall::Pump(s_);
  }
  void OnDone(absl::Status status, specd::v1::Completion completion) override {
    {
      absl::MutexLock l(&s_->mu);
      if (status.ok() && s_->call != nullptr && !s_->cancelled) {
        specd::v1::GenerateStreamResponse last;
        *last.mutable_completion() = std::move(completion);
        s_->queue.push_back(services::SerializeToByteBuffer(last));
      }
      s_->finished = true;
      s_->status = status;
    }
    StreamCall::Pump(s_);
  }

 private:
  std::shared_ptr<StreamCall::State> s_;
};

}  // namespace

absl::Status GenerationService::Refused(absl::Status s) {
  metrics_->router_requests.Add({{"code", absl::StatusCodeToString(s.code())}}).Increment();
  // The reason names a field or a limit, never request text.
  services::LogEvent(services::LogLevel::kInfo, "request_refused",
                     {{"api", "grpc"},
                      {"code", absl::StatusCodeToString(s.code())},
                      {"reason", s.message()}});
  return s;
}

absl::Status GenerationService::Authorize(grpc::CallbackServerContext* ctx) {
  if (keys_ == nullptr || !keys_->enabled()) return absl::OkStatus();
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  const std::string value = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
  absl::Status s = keys_->Check(value);
  if (!s.ok()) return Refused(std::move(s));
  return absl::OkStatus();
}

absl::Status GenerationService::Admit(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer& bytes,
                                      google::protobuf::Message* request) {
  last_call_ns_.store(absl::ToUnixNanos(absl::Now()));
  if (absl::Status a = Authorize(ctx); !a.ok()) return a;
  if (absl::Status p = services::ParseByteBuffer(bytes, request); !p.ok()) return Refused(p);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* GenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* bytes,
                                                      grpc::ByteBuffer* out) {
  auto* call = new UnaryCall(engine_, out);
  specd::v1::GenerateRequest req;
  if (absl::Status a = Admit(ctx, *bytes, &req); !a.ok()) {
    call->FinishWith(a);
    return call;
  }
  absl::StatusOr<ValidatedRequest> v = ValidateRequest(req, *tokenizer_, chat_, engine_->limits());
  if (!v.ok()) {
    call->FinishWith(Refused(v.status()));
    return call;
  }
  absl::StatusOr<int64_t> id =
      engine_->Submit(std::move(*v), std::make_shared<UnarySink>(call), DeadlineOf(ctx));
  if (!id.ok()) {
    call->FinishWith(Refused(id.status()));
    return call;
  }
  call->set_id(*id);
  return call;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::GenerateStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* bytes) {
  auto* call = new StreamCall(engine_);
  auto fail = [&](const absl::Status& s) {
    auto st = call->state();
    {
      absl::MutexLock l(&st->mu);
      st->finished = true;
      st->status = s;
    }
    StreamCall::Pump(st);
    return call;
  };
  specd::v1::GenerateRequest req;
  if (absl::Status a = Admit(ctx, *bytes, &req); !a.ok()) return fail(a);
  absl::StatusOr<ValidatedRequest> v = ValidateRequest(req, *tokenizer_, chat_, engine_->limits());
  if (!v.ok()) return fail(Refused(v.status()));
  absl::StatusOr<int64_t> id = engine_->Submit(
      std::move(*v), std::make_shared<StreamSink>(call->state()), DeadlineOf(ctx));
  if (!id.ok()) return fail(Refused(id.status()));
  call->set_id(*id);
  return call;
}

absl::Status GenerationService::TokenizeRequest(const specd::v1::TokenizeRequest& req,
                                                specd::v1::TokenizeResponse* resp) {
  absl::StatusOr<std::vector<int32_t>> ids;
  const ModelLimits limits = engine_->limits();
  if (req.input_case() == specd::v1::TokenizeRequest::kPrompt) {
    ids = EncodeText("prompt", req.prompt(), req.add_special_tokens(), *tokenizer_, limits);
  } else if (req.input_case() == specd::v1::TokenizeRequest::kChat) {
    ids = EncodeChat(req.chat(), *tokenizer_, chat_, limits);
  } else {
    ids = absl::InvalidArgumentError("input is required: set prompt or chat");
  }
  if (!ids.ok()) return ids.status();
  for (int32_t id : *ids) {
    resp->add_token_ids(id);
    resp->add_pieces(tokenizer_->TokenBytes(id));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* bytes,
                                                      grpc::ByteBuffer* out) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  specd::v1::TokenizeRequest req;
  specd::v1::TokenizeResponse resp;
  absl::Status s = Admit(ctx, *bytes, &req);
  if (s.ok()) s = TokenizeRequest(req, &resp);
  if (s.ok()) *out = services::SerializeToByteBuffer(resp);
  r->Finish(ToGrpc(s));
  return r;
}

void GenerationService::FillModelInfo(specd::v1::ModelInfo* resp) {
  const ModelLimits l = engine_->limits();
  resp->set_target_model(target_model_);
  resp->set_draft_model(draft_model_);
  resp->set_vocab_size(l.vocab_size);
  resp->set_context_length(l.context_length);
  resp->set_vocab_fingerprint(tokenizer_->Fingerprint());
  resp->set_draft_available(l.draft_available);
  resp->set_max_new_tokens_limit(l.max_new_tokens);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* bytes,
                                                          grpc::ByteBuffer* out) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  specd::v1::GetModelInfoRequest req;
  absl::Status s = Admit(ctx, *bytes, &req);
  if (s.ok()) {
    specd::v1::ModelInfo info;
    FillModelInfo(&info);
    *out = services::SerializeToByteBuffer(info);
  }
  r->Finish(ToGrpc(s));
  return r;
}

}  // namespace specd::router
