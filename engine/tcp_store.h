// The rendezvous of tensor-parallel rank processes: a small key-value store that rank 0 serves
// over TCP and every rank (rank 0 included) reads and writes through Gloo's Store interface,
// so the ranks can exchange their transport addresses (gloo::rendezvous::Context).
//
// It doubles as the group's liveness line: each rank keeps its connection to rank 0 open for
// the life of the group, so when a rank process dies the kernel closes its socket and the
// other side learns at once (rank 0: "rank r lost"; rank r: "rank 0 lost"), idle or not. A
// group that stops on purpose disarms the line first.
#ifndef SPECD_ENGINE_TCP_STORE_H_
#define SPECD_ENGINE_TCP_STORE_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <utility>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gloo/rendezvous/store.h"

namespace specd::engine {

// "host:port" (or "[v6]:port") -> host, port; INVALID_ARGUMENT naming the address otherwise.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

// Called (from a store thread) with the rank whose connection closed while armed.
using PeerLostHandler = std::function<void(int rank)>;

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any; see port()).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port);
  ~TcpStoreServer();
  int port() const { return port_; }
  // After the rendezvous: a rank's connection closing calls `handler` (until Disarm()).
  void Arm(PeerLostHandler handler);
  void Disarm();

 private:
  TcpStoreServer() = default;
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  absl::Mutex mu_;
  std::map<std::string, std::vector<char>> data_ ABSL_GUARDED_BY(mu_);
  std::vector<int> conns_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> conn_threads_ ABSL_GUARDED_BY(mu_);
  PeerLostHandler on_lost_ ABSL_GUARDED_BY(mu_);
};

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Connects to rank 0's server at host:port, retrying until `timeout` (rank 0 may start
  // later), and says which rank this is.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port,
                                                           int rank,
                                                           std::chrono::milliseconds timeout);
  ~TcpStore() override;

  // gloo::rendezvous::Store (throws std::runtime_error on failure, as Gloo expects).
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // After the rendezvous (no more requests): rank 0's end of the connection closing calls
  // `handler(0)` (until Disarm()).
  void WatchServer(PeerLostHandler handler);
  void Disarm() { armed_ = false; }

 private:
  TcpStore(int fd, std::chrono::milliseconds timeout) : fd_(fd), timeout_(timeout) {}
  std::vector<char> Request(char op, const std::vector<std::string>& keys,
                            const std::vector<char>& data, std::chrono::milliseconds timeout);

  int fd_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> armed_{false};
  std::thread watch_thread_;
};

// What every rank-process communicator (Gloo, NCCL) starts from: rank 0 serves the store, every
// rank joins it, and once the communicator is up, Arm() turns the connections into the
// group's liveness line. ReportBroken() calls the handler at most once, never after Disarm().
class Rendezvous {
 public:
  using BrokenHandler = std::function<void(const std::string& reason)>;
  // INVALID_ARGUMENT for a rank outside [0, world_size) or an address that is not host:port.
  static absl::StatusOr<std::unique_ptr<Rendezvous>> Join(int rank, int world_size,
                                                          const std::string& address,
                                                          const std::string& bind_address,
                                                          std::chrono::milliseconds timeout,
                                                          BrokenHandler on_broken);
  ~Rendezvous();

  TcpStore& store() { return *store_; }
  // `what` names the communicator in reports ("Gloo", "NCCL").
  void Arm(const std::string& what);
  void Disarm();
  // "tensor-parallel group (rank r of n, <what>): <reason>" to the handler, once.
  void ReportBroken(const std::string& what, const std::string& reason);

 private:
  Rendezvous(int rank, int world_size, BrokenHandler on_broken)
      : rank_(rank), world_size_(world_size), on_broken_(std::move(on_broken)) {}

  const int rank_, world_size_;
  BrokenHandler on_broken_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0
  std::unique_ptr<TcpStore> store_;
  std::atomic<bool> armed_{true};
  std::atomic<bool> reported_{false};
  std::string what_;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_TCP_STORE_H_
