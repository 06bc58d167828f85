// TargetBackend / DraftBackend over gRPC. Steps go over one long-lived StepStream (no call
// set-up per iteration: the router hop of docs/DESIGN.md), each bounded by the step timeout
// through a watchdog that cancels the stream; a broken stream is reopened at the next step, and
// a service without StepStream gets unary Steps. A service on the same host that offers a step
// socket (GetInfo; services/common/step_socket.h) gets its steps there instead, when the
// backend is allowed to use one; one it cannot reach gets them over gRPC. Release and GetInfo
// are unary, with a deadline.
#ifndef SPECD_SERVICES_ROUTER_GRPC_BACKENDS_H_
#define SPECD_SERVICES_ROUTER_GRPC_BACKENDS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

#include "services/common/grpc_server.h"
#include "services/common/step_socket.h"
#include "services/router/backends.h"
#include "specd/internal/v1/draft.grpc.pb.h"
#include "specd/internal/v1/target.grpc.pb.h"

namespace specd::router {

template <typename Stub, typename Base, typename StepReq, typename StepResp>
class GrpcBackend final : public Base {
 public:
  GrpcBackend(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout,
              bool use_stream = true, bool use_step_socket = false,
              int64_t max_message_bytes = 64 << 20)
      : stub_(Stub::NewStub(channel)),
        timeout_(timeout),
        use_step_socket_(use_step_socket),
        use_stream_(use_stream),
        socket_(max_message_bytes) {}
  ~GrpcBackend() override {
    absl::MutexLock call(&call_mu_);
    // Why the stream ended matters to no one once the router is going away.
    CloseStream(/*ended=*/false).IgnoreError();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  absl::StatusOr<StepResp> Step(const StepReq& request) override {
    return StepOverlapping(request, [] {});
  }
  // On the stream, `while_waiting` runs once the request's write has completed (its bytes are
  // with the transport) while the answer is awaited; on a unary call, before the call.
  absl::StatusOr<StepResp> StepOverlapping(const StepReq& request,
                                           absl::FunctionRef<void()> while_waiting) override {
    absl::MutexLock call(&call_mu_);  // one step at a time on the one stream
    bool ran = false;
    auto once = [&] {
      if (!ran) while_waiting();
      ran = true;
    };
    if (std::optional<absl::StatusOr<StepResp>> r = SocketStep(request, once)) {
      once();  // a step that failed before its write
      return *std::move(r);
    }
    if (!use_stream_) {
      once();
      return UnaryStep(request);
    }
    StepResp resp;
    absl::Status st = StreamStep(request, resp, once);
    if (st.code() == absl::StatusCode::kUnimplemented) {  // a service older than StepStream
      use_stream_ = false;
      once();
      return UnaryStep(request);
    }
    once();  // a failed step may never have written
    if (!st.ok()) return st;
    return resp;
  }
  // False once a service without StepStream made this backend fall back to unary Steps.
  bool streaming() {
    absl::MutexLock call(&call_mu_);
    return use_stream_;
  }
  // Whether the last step went over the service's step socket (its connection is open).
  bool on_step_socket() {
    absl::MutexLock call(&call_mu_);
    return socket_.connected();
  }
  absl::StatusOr<iv1::KvUsage> Release(const std::vector<int64_t>& ids) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    iv1::ReleaseRequest req;
    req.mutable_seq_ids()->Assign(ids.begin(), ids.end());
    iv1::ReleaseResponse resp;
    grpc::Status s = stub_->Release(&ctx, req, &resp);
    if (!s.ok()) return services::ToAbsl(s);
    return resp.kv();
  }
  absl::StatusOr<iv1::ServiceInfo> GetInfo() override {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    iv1::ServiceInfo info;
    grpc::Status s = stub_->GetInfo(&ctx, iv1::GetInfoRequest(), &info);
    if (!s.ok()) return services::ToAbsl(s);
    if (use_step_socket_) {  // a restarted service may offer another one, or none
      absl::MutexLock l(&socket_mu_);
      socket_path_ = info.step_socket();
      socket_offered_.store(!socket_path_.empty());
    }
    return info;
  }


 private:
  using Stream = grpc::ClientAsyncReaderWriter<StepReq, StepResp>;
  // Completion-queue tags: what each finished operation was.
  enum Op : intptr_t { kStart = 1, kWrite, kRead, kFinish };
  static void* Tag(Op op) { return reinterpret_cast<void*>(op); }

  // The step over the service's step socket when it offered one (GetInfo) and it can be
  // reached; nullopt sends the step over gRPC instead (nothing of it was sent).
  std::optional<absl::StatusOr<StepResp>> SocketStep(const StepReq& request,
                                                     absl::FunctionRef<void()> once_written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_) {
    // An open connection is used as is (a dead one fails its write and is replaced below); the
    // path is read only to connect.
    if (!socket_.connected() && !socket_offered_.load()) return std::nullopt;
    const absl::Time deadline = absl::Now() + timeout_;
    request.SerializeToString(&request_bytes_);
    for (;;) {
      const bool fresh = !socket_.connected();
      if (fresh && !ConnectSocket()) return std::nullopt;  // none offered now, or another host's
      bool unsent = false;
      absl::Status st = socket_.Call(request_bytes_, once_written, deadline, &response_bytes_,
                                     &unsent);
      if (st.ok()) {
        StepResp resp;
        if (!resp.ParseFromString(response_bytes_)) {
          return absl::InternalError("the service's step answer on the step socket does not parse");
        }
        return resp;
      }
      // The connection had ended while idle (the service drained or restarted): the request
      // reached no step, so it goes once more on a new connection.
      if (unsent && !fresh) continue;
      if (st.code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::DeadlineExceededError(
            absl::StrCat("the step took longer than ", absl::FormatDuration(timeout_)));
      }
      return st;
    }
  }

  bool ConnectSocket() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_) {
    std::string path;
    {
      absl::MutexLock l(&socket_mu_);
      path = socket_path_;
    }
    return !path.empty() && socket_.Connect(path).ok();
  }

  absl::StatusOr<StepResp> UnaryStep(const StepReq& request) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    StepResp resp;
    grpc::Status s = stub_->Step(&ctx, request, &resp);
    if (!s.ok()) return services::ToAbsl(s);
    return resp;
  }

  // One request and its response on the open stream (opened first if there is none), the
  // write and the read in flight together. This thread waits on the stream's own completion
  // queue (no hand-off from another thread), up to the step timeout. Any failure closes the
  // stream and returns the status it ended with, except one: a stream that the service ended
  // while idle (it drained, or its process restarted) refuses the write, so the request never
  // reached a step and goes once more on a new stream.
  absl::Status StreamStep(const StepReq& request, StepResp& resp,
                          absl::FunctionRef<void()> once_written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_) {
    const absl::Time deadline = absl::Now() + timeout_;
    for (int attempt = 0;; ++attempt) {
      const bool fresh = stream_ == nullptr;
      if (fresh) {
        // Opening may wait on a restarting service: the overlapped work does not wait with it.
        once_written();
        ctx_ = std::make_unique<grpc::ClientContext>();
        stream_ = stub_->AsyncStepStream(ctx_.get(), &cq_, Tag(kStart));
        pending_ = 1;
        if (!AwaitAll(deadline, [] {})) return Failed("opening the step stream");
      }
      stream_->Write(request, Tag(kWrite));
      stream_->Read(&resp, Tag(kRead));
      pending_ = 2;
      if (AwaitAll(deadline, once_written)) return absl::OkStatus();
      const bool undelivered = !fresh && write_failed_ && !timed_out_ && attempt == 0;
      absl::Status failed = Failed("the step");
      if (!undelivered) return failed;
    }
  }

  // Waits for every pending operation; false if one failed or the deadline passed (then
  // timed_out_ says which). A write that completes runs `on_write` before the wait goes on.
  bool AwaitAll(absl::Time deadline, absl::FunctionRef<void()> on_write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_) {
    bool all_ok = true;
    while (pending_ > 0) {
      void* tag;
      bool ok;
      switch (cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(deadline))) {
        case grpc::CompletionQueue::GOT_EVENT:
          --pending_;
          all_ok = all_ok && ok;
          if (tag == Tag(kWrite)) {
            write_failed_ = !ok;
            if (ok && pending_ > 0) on_write();
          }
          break;
        case grpc::CompletionQueue::TIMEOUT:
          timed_out_ = true;
          return false;
        case grpc::CompletionQueue::SHUTDOWN:
          return false;
      }
    }
    return all_ok;
  }

  absl::Status Failed(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_) {
    absl::Status ended = CloseStream();
    if (timed_out_) {
      timed_out_ = false;
      return absl::DeadlineExceededError(
          absl::StrCat(what, " took longer than ", absl::FormatDuration(timeout_)));
    }
    return ended;
  }

  // Closes the stream: collects its outstanding operations and the status it ended with
  // (UNAVAILABLE if that is OK or CANCELLED: a step always expects an answer). `ended`: the
  // stream failed (else it is open and idle, and is cancelled).
  absl::Status CloseStream(bool ended = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_) {
    if (stream_ == nullptr) return absl::OkStatus();
    // Operations still out (a step past its timeout) or an open stream (the router going
    // away): cancel, so that a server that never answers cannot hold the close. Otherwise the
    // server ended the stream and Finish brings its status (INVALID_ARGUMENT, ...).
    if (pending_ > 0 || !ended) ctx_->TryCancel();
    grpc::Status s;
    stream_->Finish(&s, Tag(kFinish));
    ++pending_;
    while (pending_ > 0) {  // cancelled: every operation comes back promptly
      void* tag;
      bool ok;
      if (!cq_.Next(&tag, &ok)) break;
      --pending_;
    }
    pending_ = 0;
    stream_.reset();
    ctx_.reset();
    if (s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) {
      return absl::UnavailableError(absl::StrCat("step stream ended: ", s.error_message()));
    }
    return services::ToAbsl(s);
  }

  void SetDeadline(grpc::ClientContext& ctx) {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  }

  std::unique_ptr<typename Stub::Stub> stub_;
  absl::Duration timeout_;
  const bool use_step_socket_;
  absl::Mutex socket_mu_;
  std::string socket_path_ ABSL_GUARDED_BY(socket_mu_);  // the service's step socket, if any
  std::atomic<bool> socket_offered_{false};  // socket_path_ is not empty
  absl::Mutex call_mu_;
  bool use_stream_ ABSL_GUARDED_BY(call_mu_);
  grpc::CompletionQueue cq_;  // the stream's operations only; polled by the stepping thread
  std::unique_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(call_mu_);
  std::unique_ptr<Stream> stream_ ABSL_GUARDED_BY(call_mu_);
  int pending_ ABSL_GUARDED_BY(call_mu_) = 0;  // operations started and not yet completed
  bool timed_out_ ABSL_GUARDED_BY(call_mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(call_mu_) = false;  // the last step's write was refused
  services::StepSocketClient socket_ ABSL_GUARDED_BY(call_mu_);
  std::string request_bytes_ ABSL_GUARDED_BY(call_mu_);   // reused: no allocation per step
  std::string response_bytes_ ABSL_GUARDED_BY(call_mu_);
};

using GrpcTargetBackend = GrpcBackend<iv1::Target, TargetBackend, iv1::TargetStepRequest,
                                      iv1::TargetStepResponse>;
using GrpcDraftBackend = GrpcBackend<iv1::Draft, DraftBackend, iv1::DraftStepRequest,
                                     iv1::DraftStepResponse>;

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_GRPC_BACKENDS_H_
