// The step socket: a worker's steps over a plain unix-domain stream socket, for a router on the
// same host (docs/DESIGN.md, "The router hop"). On gRPC's stream a step request passes through
// two or three of gRPC's threads on the worker before the step runs (`perf sched` on the
// services: poller -> executor -> callback thread), and each hand-off is a wake-up, which on a
// VM costs tens of microseconds. Here the worker's thread blocked in read() runs the step, and
// the router's stepping thread blocked in poll() reads the answer: one wake-up each way.
//
// Frames, both ways: [u32 little-endian payload length][u8 kind][payload]. A request is
// kRequest + the serialized StepRequest; an answer is kOk + the serialized StepResponse, or
// kError + [u8 absl::StatusCode][message]. There is no TLS: the socket file's permissions
// guard it, so a worker that serves TLS offers no step socket.
#ifndef SPECD_SERVICES_COMMON_STEP_SOCKET_H_
#define SPECD_SERVICES_COMMON_STEP_SOCKET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace specd::services {

enum class StepFrame : uint8_t { kRequest = 1, kOk = 2, kError = 3 };

// The step socket a worker serves (empty: none) from its --step-socket flag: "auto" is the
// unix --listen path + ".step" when the service speaks plaintext (a TLS deployment keeps every
// step on TLS), "off" or "" none, anything else that path.
std::string StepSocketPath(const std::string& flag, const std::string& listen, bool tls);

// Serves a handler, one request at a time per connection, each on its connection's thread.
class StepSocketServer {
 public:
  struct Reply {
    absl::Status status;
    std::string response;          // the serialized answer when status is OK
    std::function<void()> after;   // runs once the reply is written (bookkeeping); may be empty
  };
  using Handler = std::function<Reply(absl::string_view request)>;

  // Listens on `path` (a stale socket file there is replaced). Frames over `max_frame_bytes` are
  // refused and end their connection.
  static absl::StatusOr<std::unique_ptr<StepSocketServer>> Listen(const std::string& path,
                                                                  int64_t max_frame_bytes,
                                                                  Handler handler);
  ~StepSocketServer();

  // Stops accepting and ends every connection once its current step is answered; returns when
  // all have ended. The socket file is removed.
  void Stop();
  const std::string& path() const { return path_; }
  // Connection threads not yet joined (open connections, and closed ones until the next
  // accept joins them): a router that reconnects often does not pile them up.
  int64_t threads_held();

 private:
  StepSocketServer(std::string path, int listen_fd, int64_t max_frame_bytes, Handler handler);
  void AcceptLoop();
  void Serve(int fd);
  // Moves the threads of connections that have ended into `out` (to be joined unlocked).
  void ReapLocked(std::vector<std::thread>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int listen_fd_;
  const int64_t max_frame_bytes_;
  const Handler handler_;
  std::thread acceptor_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<int> open_ ABSL_GUARDED_BY(mu_);  // connections' fds, until they close
  absl::flat_hash_map<std::thread::id, std::thread> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> ended_ ABSL_GUARDED_BY(mu_);  // returning; not yet joined
};

// The router's end: one connection, one step at a time (the caller serializes).
class StepSocketClient {
 public:
  explicit StepSocketClient(int64_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}
  ~StepSocketClient() { Close(); }
  StepSocketClient(const StepSocketClient&) = delete;
  StepSocketClient& operator=(const StepSocketClient&) = delete;

  // UNAVAILABLE if nothing listens at `path`.
  absl::Status Connect(const std::string& path);
  bool connected() const { return fd_ >= 0; }
  void Close();

  // One step: writes `request`, runs `while_waiting` once it is written (before, if the write
  // fails), and reads the answer until `deadline`. The service's own error comes back as its
  // status. A broken connection is UNAVAILABLE and a passed deadline DEADLINE_EXCEEDED; both
  // close the connection (a late answer must not pass for the next step's). `*unsent` says
  // the connection had ended before the request could be written: no step ran.
  absl::Status Call(absl::string_view request, absl::FunctionRef<void()> while_waiting,
                    absl::Time deadline, std::string* response, bool* unsent);

 private:
  const int64_t max_frame_bytes_;
  int fd_ = -1;
};

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_STEP_SOCKET_H_
