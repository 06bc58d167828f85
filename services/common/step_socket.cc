#include "services/common/step_socket.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace specd::services {
namespace {

constexpr size_t kHeaderBytes = 5;  // u32 length + u8 kind

void PutHeader(char* h, uint32_t len, StepFrame kind) {
  for (int i = 0; i < 4; ++i) h[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  h[4] = static_cast<char>(kind);
}

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("step socket: ", what, ": ", std::strerror(errno)));
}

// Writes the header and the payload whole. *sent counts the bytes that went out.
absl::Status WriteFrame(int fd, StepFrame kind, absl::string_view payload, size_t* sent) {
  char header[kHeaderBytes];
  PutHeader(header, static_cast<uint32_t>(payload.size()), kind);
  const size_t total = kHeaderBytes + payload.size();
  *sent = 0;
  while (*sent < total) {
    iovec iov[2];
    int n = 0;
    if (*sent < kHeaderBytes) {
      iov[n++] = {header + *sent, kHeaderBytes - *sent};
      iov[n++] = {const_cast<char*>(payload.data()), payload.size()};
    } else {
      const size_t off = *sent - kHeaderBytes;
      iov[n++] = {const_cast<char*>(payload.data()) + off, payload.size() - off};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    const ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);  // a closed peer is EPIPE, not SIGPIPE
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write");
    }
    *sent += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status WriteError(int fd, const absl::Status& status) {
  std::string payload(1, static_cast<char>(status.code()));
  payload.append(status.message().data(), status.message().size());
  size_t sent;
  return WriteFrame(fd, StepFrame::kError, payload, &sent);
}

// Reads exactly n bytes: blocking until they come when `deadline` is infinite, else polling
// until it passes.
absl::Status ReadExact(int fd, char* p, size_t n, absl::Time deadline) {
  const bool bounded = deadline != absl::InfiniteFuture();
  size_t have = 0;
  while (have < n) {
    const ssize_t r = recv(fd, p + have, n - have, bounded ? MSG_DONTWAIT : 0);
    if (r > 0) {
      have += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError("step socket: the connection closed");
    if (errno == EINTR) continue;
    if (!bounded || (errno != EAGAIN && errno != EWOULDBLOCK)) return Errno("read");
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("step socket: no answer before the step's deadline");
    }
    pollfd pfd{fd, POLLIN, 0};
    const double ms = std::ceil(absl::ToDoubleMilliseconds(left));
    if (poll(&pfd, 1, static_cast<int>(std::min(ms, 1e9))) < 0 && errno != EINTR) {
      return Errno("poll");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadFrame(int fd, int64_t max_bytes, absl::Time deadline, StepFrame* kind,
                       std::string* payload) {
  char h[kHeaderBytes];
  if (absl::Status s = ReadExact(fd, h, kHeaderBytes, deadline); !s.ok()) return s;
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len |= static_cast<uint32_t>(static_cast<uint8_t>(h[i])) << (8 * i);
  *kind = static_cast<StepFrame>(h[4]);
  if (static_cast<int64_t>(len) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("step socket: a frame of ", len,
                                                   " bytes exceeds the limit of ", max_bytes));
  }
  payload->resize(len);
  return ReadExact(fd, payload->data(), len, deadline);
}

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(a.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("step socket path \"", path, "\" must have 1 to ",
                                                   sizeof(a.sun_path) - 1, " bytes"));
  }
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

}  // namespace

std::string StepSocketPath(const std::string& flag, const std::string& listen, bool tls) {
  if (flag == "off" || flag.empty()) return "";
  if (flag != "auto") return flag;
  if (tls || listen.rfind("unix:", 0) != 0) return "";
  std::string path = listen.substr(5);
  if (path.rfind("//", 0) == 0) path = path.substr(2);  // unix:///abs/path
  return path + ".step";
}

// ---- StepSocketServer -----------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<StepSocketServer>> StepSocketServer::Listen(
    const std::string& path, int64_t max_frame_bytes, Handler handler) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  unlink(path.c_str());  // a previous process's socket file; absent is fine
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
      listen(fd, 16) != 0) {
    absl::Status s = Errno(absl::StrCat("listening on ", path));
    close(fd);
    return s;
  }
  return std::unique_ptr<StepSocketServer>(
      new StepSocketServer(path, fd, max_frame_bytes, std::move(handler)));
}

StepSocketServer::StepSocketServer(std::string path, int listen_fd, int64_t max_frame_bytes,
                                   Handler handler)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      max_frame_bytes_(max_frame_bytes),
      handler_(std::move(handler)) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

StepSocketServer::~StepSocketServer() { Stop(); }

void StepSocketServer::Stop() {
  if (!acceptor_.joinable()) return;  // stopped already
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    // An idle connection's read returns at once; a busy one's after its answer is written.
    for (int fd : open_) shutdown(fd, SHUT_RD);
  }
  shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  acceptor_.join();
  std::vector<std::thread> connections;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, t] : connections_) connections.push_back(std::move(t));
    connections_.clear();
    ended_.clear();
  }
  for (std::thread& t : connections) t.join();
  close(listen_fd_);
  unlink(path_.c_str());
}

void StepSocketServer::AcceptLoop() {
  for (;;) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    const int accept_errno = errno;
    std::vector<std::thread> ended;  // threads of closed connections, joined outside the lock
    {
      absl::MutexLock l(&mu_);
      if (stopping_) {
        if (fd >= 0) close(fd);
        return;
      }
      ReapLocked(ended);
      if (fd >= 0) {
        // An answer blocked on a router that stopped reading cannot hold Stop() forever.
        timeval tv{30, 0};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        open_.insert(fd);
        std::thread t([this, fd] { Serve(fd); });
        connections_.emplace(t.get_id(), std::move(t));
      }
    }
    for (std::thread& t : ended) t.join();
    // E.g. out of descriptors for a moment: try again shortly.
    if (fd < 0 && accept_errno != EINTR && accept_errno != ECONNABORTED) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
}

void StepSocketServer::ReapLocked(std::vector<std::thread>& out) {
  for (const std::thread::id& id : ended_) {
    auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    out.push_back(std::move(it->second));
    connections_.erase(it);
  }
  ended_.clear();
}

int64_t StepSocketServer::threads_held() {
  absl::MutexLock l(&mu_);
  return static_cast<int64_t>(connections_.size());
}

void StepSocketServer::Serve(int fd) {
  std::string request;
  for (;;) {
    StepFrame kind;
    absl::Status read = ReadFrame(fd, max_frame_bytes_, absl::InfiniteFuture(), &kind, &request);
    if (read.ok() && kind != StepFrame::kRequest) {
      read = absl::InvalidArgumentError(absl::StrCat(
          "step socket: a frame of kind ", static_cast<int>(kind), " where a request belongs"));
    }
    if (!read.ok()) {
      // A malformed frame is answered with why before the connection ends (it cannot be
      // resynchronised); a closed one has no one to answer. Best effort either way.
      if (read.code() == absl::StatusCode::kInvalidArgument) WriteError(fd, read).IgnoreError();
      break;
    }
    Reply reply = handler_(request);
    size_t sent;
    const absl::Status written = reply.status.ok()
                                     ? WriteFrame(fd, StepFrame::kOk, reply.response, &sent)
                                     : WriteError(fd, reply.status);
    if (reply.after) reply.after();
    if (!written.ok()) break;
    absl::MutexLock l(&mu_);
    if (stopping_) break;
  }
  absl::MutexLock l(&mu_);
  open_.erase(fd);  // before close: Stop() must never shut down a reused descriptor
  close(fd);
  ended_.push_back(std::this_thread::get_id());  // the next accept joins this thread
}

// ---- StepSocketClient -----------------------------------------------------------------------

absl::Status StepSocketClient::Connect(const std::string& path) {
  Close();
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  if (connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    absl::Status s = Errno(absl::StrCat("connecting to ", path));
    close(fd);
    return s;
  }
  fd_ = fd;
  return absl::OkStatus();
}

void StepSocketClient::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status StepSocketClient::Call(absl::string_view request,
                                    absl::FunctionRef<void()> while_waiting, absl::Time deadline,
                                    std::string* response, bool* unsent) {
  *unsent = true;
  if (fd_ < 0) {
    while_waiting();
    return absl::UnavailableError("step socket: not connected");
  }
  size_t sent = 0;
  if (absl::Status w = WriteFrame(fd_, StepFrame::kRequest, request, &sent); !w.ok()) {
    *unsent = sent == 0;
    Close();
    while_waiting();
    return w;
  }
  *unsent = false;
  while_waiting();
  StepFrame kind;
  if (absl::Status r = ReadFrame(fd_, max_frame_bytes_, deadline, &kind, response); !r.ok()) {
    Close();
    return r;
  }
  switch (kind) {
    case StepFrame::kOk:
      return absl::OkStatus();
    case StepFrame::kError:
      if (!response->empty()) {
        return absl::Status(static_cast<absl::StatusCode>(static_cast<uint8_t>((*response)[0])),
                            absl::string_view(*response).substr(1));
      }
      break;
    case StepFrame::kRequest:
      break;
  }
  Close();
  return absl::InternalError("step socket: the service answered with a malformed frame");
}

}  // namespace specd::services
