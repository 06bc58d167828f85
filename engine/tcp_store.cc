#include "engine/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace specd::engine {

namespace {

// Wire format, client to server: one op byte, then per op
//   'H' rank:i32                         hello (which rank this connection is)
//   'S' key data                         set
//   'G' timeout_ms:u32 key               get (waits for the key)   -> ok:u8 data
//   'W' timeout_ms:u32 n:u32 key * n     wait for every key        -> ok:u8
// strings and data are u32 length + bytes; integers little-endian (same host kind).
bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteU32(int fd, uint32_t v) { return WriteAll(fd, &v, sizeof v); }
bool ReadU32(int fd, uint32_t* v) { return ReadAll(fd, v, sizeof *v); }

bool WriteBytes(int fd, const char* p, size_t n) {
  return WriteU32(fd, static_cast<uint32_t>(n)) && (n == 0 || WriteAll(fd, p, n));
}

bool ReadBytes(int fd, std::vector<char>* out) {
  uint32_t n = 0;
  if (!ReadU32(fd, &n) || n > (64u << 20)) return false;
  out->resize(n);
  return n == 0 || ReadAll(fd, out->data(), n);
}

bool ReadString(int fd, std::string* out) {
  std::vector<char> b;
  if (!ReadBytes(fd, &b)) return false;
  out->assign(b.begin(), b.end());
  return true;
}

absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host, ":", port, ": ", gai_strerror(rc)));
  }
  return res;
}

}  // namespace

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  int p = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &p) || p <= 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous address must be host:port, got \"", address, "\""));
  }
  *host = address.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);  // [v6]:port
  }
  *port = p;
  return absl::OkStatus();
}

// --- server ---

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host,
                                                                      int port) {
  absl::StatusOr<addrinfo*> res = Resolve(host, port, /*passive=*/true);
  if (!res.ok()) return res.status();
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  std::string last_error = "no address";
  for (addrinfo* a = *res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      s->listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(*res);
  if (s->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous: cannot listen on ", host, ":", port, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  s->port_ = ntohs(bound.ss_family == AF_INET6
                       ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s->accept_thread_ = std::thread(&TcpStoreServer::AcceptLoop, s.get());
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  Disarm();
  {
    absl::MutexLock l(&mu_);  // wakes requests waiting for keys
    stopping_ = true;
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  accept_thread_.join();
  std::vector<std::thread> threads;
  std::vector<int> fds;
  {
    absl::MutexLock l(&mu_);
    for (int fd : conns_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(conn_threads_);
    fds.swap(conns_);
  }
  for (std::thread& t : threads) t.join();
  for (int fd : fds) ::close(fd);
}

void TcpStoreServer::Arm(PeerLostHandler handler) {
  absl::MutexLock l(&mu_);
  on_lost_ = std::move(handler);
}

void TcpStoreServer::Disarm() {
  absl::MutexLock l(&mu_);
  on_lost_ = nullptr;
}

void TcpStoreServer::AcceptLoop() {
  while (!stopping_) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // the listening socket was closed: the server is stopping
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    absl::MutexLock l(&mu_);
    conns_.push_back(fd);
    conn_threads_.emplace_back(&TcpStoreServer::Serve, this, fd);
  }
}

void TcpStoreServer::Serve(int fd) {
  int rank = -1;
  for (;;) {
    char op = 0;
    if (!ReadAll(fd, &op, 1)) break;
    bool ok = true;
    if (op == 'H') {
      int32_t r = -1;
      ok = ReadAll(fd, &r, sizeof r);
      rank = r;
    } else if (op == 'S') {
      std::string key;
      std::vector<char> data;
      ok = ReadString(fd, &key) && ReadBytes(fd, &data);
      if (ok) {
        absl::MutexLock l(&mu_);
        data_[key] = std::move(data);
      }
    } else if (op == 'G' || op == 'W') {
      uint32_t timeout_ms = 0, n = 1;
      ok = ReadU32(fd, &timeout_ms) && (op == 'G' || ReadU32(fd, &n)) && n <= 4096;
      std::vector<std::string> keys(ok ? n : 0);
      for (std::string& k : keys) ok = ok && ReadString(fd, &k);
      if (!ok) break;
      std::vector<char> value;
      bool found = false;
      {
        absl::MutexLock l(&mu_);
        auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (stopping_) return true;
          for (const std::string& k : keys) {
            if (data_.find(k) == data_.end()) return false;
          }
          return true;
        };
        mu_.AwaitWithTimeout(absl::Condition(&all_present), absl::Milliseconds(timeout_ms));
        found = !stopping_ && all_present();
        if (found && op == 'G') value = data_[keys[0]];
      }
      const char status = found ? 1 : 0;
      ok = WriteAll(fd, &status, 1) && (op == 'W' || !found ||
                                        WriteBytes(fd, value.data(), value.size()));
    } else {
      ok = false;
    }
    if (!ok) break;
  }
  PeerLostHandler lost;
  {
    absl::MutexLock l(&mu_);
    if (!stopping_ && rank > 0) lost = on_lost_;
  }
  if (lost) lost(rank);
}

// --- client ---

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                            int rank,
                                                            std::chrono::milliseconds timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  std::string last_error;
  for (;;) {
    absl::StatusOr<addrinfo*> res = Resolve(host, port, /*passive=*/false);
    if (res.ok()) {
      for (addrinfo* a = *res; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(*res);
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          const int32_t r = rank;
          const char op = 'H';
          if (!WriteAll(fd, &op, 1) || !WriteAll(fd, &r, sizeof r)) {
            ::close(fd);
            return absl::UnavailableError("rendezvous: connection closed during hello");
          }
          return std::unique_ptr<TcpStore>(new TcpStore(fd, timeout));
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(*res);
    } else {
      last_error = std::string(res.status().message());
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous: rank 0 at ", host, ":", port, " did not answer within ",
          absl::FormatDuration(absl::FromChrono(timeout)), " (", last_error, ")"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

TcpStore::~TcpStore() {
  Disarm();
  ::shutdown(fd_, SHUT_RDWR);
  if (watch_thread_.joinable()) watch_thread_.join();
  ::close(fd_);
}

std::vector<char> TcpStore::Request(char op, const std::vector<std::string>& keys,
                                    const std::vector<char>& data,
                                    std::chrono::milliseconds timeout) {
  bool ok = WriteAll(fd_, &op, 1);
  if (op == 'S') {
    ok = ok && WriteBytes(fd_, keys[0].data(), keys[0].size()) &&
         WriteBytes(fd_, data.data(), data.size());
    if (!ok) throw std::runtime_error("rendezvous: lost the connection to rank 0's store");
    return {};
  }
  ok = ok && WriteU32(fd_, static_cast<uint32_t>(timeout.count()));
  if (op == 'W') ok = ok && WriteU32(fd_, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) ok = ok && WriteBytes(fd_, k.data(), k.size());
  char found = 0;
  ok = ok && ReadAll(fd_, &found, 1);
  if (!ok) throw std::runtime_error("rendezvous: lost the connection to rank 0's store");
  if (!found) {
    throw std::runtime_error(absl::StrCat("rendezvous: timed out waiting for key ", keys[0],
                                          " (a rank did not start?)"));
  }
  std::vector<char> value;
  if (op == 'G' && !ReadBytes(fd_, &value)) {
    throw std::runtime_error("rendezvous: lost the connection to rank 0's store");
  }
  return value;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  Request('S', {key}, data, timeout_);
}

std::vector<char> TcpStore::get(const std::string& key) { return Request('G', {key}, {}, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  if (!keys.empty()) Request('W', keys, {}, timeout);
}

void TcpStore::WatchServer(PeerLostHandler handler) {
  armed_ = true;
  watch_thread_ = std::thread([this, handler = std::move(handler)] {
    char byte;
    // The server never writes unprompted: any return is the connection closing.
    while (::recv(fd_, &byte, 1, 0) < 0 && errno == EINTR) {
    }
    if (armed_) handler(0);
  });
}

// --- rendezvous ---

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Join(int rank, int world_size,
                                                             const std::string& address,
                                                             const std::string& bind_address,
                                                             std::chrono::milliseconds timeout,
                                                             BrokenHandler on_broken) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in [0, world size ", world_size, ")"));
  }
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(address, &host, &port); !s.ok()) return s;
  std::unique_ptr<Rendezvous> r(new Rendezvous(rank, world_size, std::move(on_broken)));
  if (rank == 0) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::Start(bind_address, port);
    if (!server.ok()) return server.status();
    r->server_ = std::move(*server);
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> store =
      TcpStore::Connect(rank == 0 ? bind_address : host, port, rank, timeout);
  if (!store.ok()) return store.status();
  r->store_ = std::move(*store);
  return r;
}

Rendezvous::~Rendezvous() {
  Disarm();
  store_.reset();
  server_.reset();
}

void Rendezvous::Arm(const std::string& what) {
  what_ = what;
  PeerLostHandler lost = [this](int rank) {
    ReportBroken(what_, absl::StrCat("rank ", rank, "'s process is gone (its connection closed)"));
  };
  if (server_ != nullptr) {
    server_->Arm(lost);
  } else {
    store_->WatchServer(lost);
  }
}

void Rendezvous::Disarm() {
  armed_ = false;
  if (server_ != nullptr) server_->Disarm();
  if (store_ != nullptr) store_->Disarm();
}

void Rendezvous::ReportBroken(const std::string& what, const std::string& reason) {
  if (!armed_ || reported_.exchange(true) || !on_broken_) return;
  on_broken_(absl::StrCat("tensor-parallel group (rank ", rank_, " of ", world_size_, ", ", what,
                          "): ", reason));
}

}  // namespace specd::engine
