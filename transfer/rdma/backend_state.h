// State: what every thread of one RDMA backend shares, and the operations on it that more than one
// of them needs (finishing tasks, creating and breaking connections). The threads are the I/O
// thread (io_thread.h), the connector thread (connector_thread.h), the control thread
// (control_thread.h) and the callers of the Backend methods (rdma_backend.cc).
//
// Locking: one mutex, `mu`, guards every field declared after it, and every method below requires
// it held unless it says otherwise. Verbs calls made under it only take the verbs layer's own locks,
// never ours, so there is no inversion. XferTask::finish() and on_notification run with `mu`
// released (the engine may call back into cancel()/submit() from them): the methods collect
// Finished entries and the caller runs them after unlocking (run_finished). Network waits (connect
// and handshake) also run with `mu` released, so two backends that connect to each other at the
// same moment cannot deadlock.
//
// The fields before `mu` are written by the constructor and by start() before any thread runs, and
// by stop() after every thread has been joined; in between they are read-only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "proto/base/status.h"
#include "transfer/backend.h"
#include "transfer/rdma/connection.h"
#include "transfer/rdma/control_socket.h"
#include "transfer/rdma/device.h"
#include "transfer/rdma/rdma_backend.h"
#include "transfer/rdma/task_state.h"

namespace pdr::transfer::rdma {

struct RemoteRegion {
  std::uint32_t rkey = 0;
  std::uint64_t addr = 0;
};

struct PeerState {
  std::string address;  // the peer's control listener, "host:port"
  std::unordered_map<std::uint32_t, RemoteRegion> regions;
  std::uint32_t conn_gen = 0;  // 0: no connection (or one being torn down)
  std::deque<std::uint64_t> waiting;  // submitted before the connection was ready
  ControlClock::time_point retry_after{};  // after a failed connect, with backoff
  std::chrono::milliseconds backoff{0};
};

struct State {
  // Normalises the options (ranges in rdma_backend.h) and derives the connection limits.
  State(const RdmaBackendOptions& backend_options, VerbsLoader loader);

  RdmaBackendOptions options;
  ConnectionLimits limits;
  VerbsLoader load_verbs = nullptr;  // injected (rdma_backend.h); called in start()
  BackendContext context;
  Device device;
  int listen_fd = -1;  // the control listener
  int wake_fd = -1;    // eventfd the control thread polls next to its sockets
  std::string address;  // local_address()

  mutable std::mutex mu;
  std::condition_variable io_cv;  // the I/O thread naps on it
  bool io_wake_pending = false;
  std::condition_variable connect_cv;  // the connector thread waits on it
  bool connect_pending = false;
  bool started = false;
  bool stopping = false;
  std::unordered_map<RegionId, ibv_mr*> mrs;
  std::unordered_map<RegionId, Region> pending_regions;  // registered before start()
  std::unordered_map<PeerId, PeerState> peers;
  std::unordered_map<std::uint32_t, std::unique_ptr<Connection>> conns;  // by generation
  std::unordered_map<std::uint64_t, TaskState> tasks;                    // by xfer id
  std::vector<std::uint64_t> cancels;                  // for the I/O thread
  std::vector<std::pair<int, std::uint32_t>> watch_adds;  // (fd, gen) for the control thread
  std::vector<std::uint32_t> broken_gens;  // connections a refused post_send condemned
  std::uint32_t next_gen = 1;
  std::uint64_t qp_budget_used = 0;  // CQ entries the live connections may need
  std::mt19937 rng{std::random_device{}()};

  // A new connection in `conns`, if the CQ can take its QPs' worst-case CQEs (kRejected if not).
  Status create_conn(bool server, std::size_t qp_count, Connection** out);
  // Tears connection `gen` down (no-op if gone): its control socket is shut down (closed, unless
  // the control thread watches it), its QPs destroyed, and each of its tasks finished: a cancel
  // cause first, then the task's own failure, else `cause`. Its peer may connect again.
  void break_conn(std::uint32_t gen, XferCause cause, std::vector<Finished>* finished);
  // Finishes every task waiting on `peer` (kFailed with `cause`, or its cancel cause).
  void fail_waiting(PeerState& peer, XferCause cause, std::vector<Finished>* finished);
  void finish_task(std::uint64_t id, const XferResult& result, std::vector<Finished>* finished);
  // kDone with the task's total bytes, counted in bytes_written / bytes_read.
  void finish_done(std::uint64_t id, std::vector<Finished>* finished);
  // Wakes the I/O thread from its nap.
  void wake_io();

  // Any thread, lock not needed.
  void wake_control() const;  // the control thread re-reads watch_adds and `stopping`
  void count(std::atomic<std::uint64_t> EngineCounters::*counter) const;
  static void run_finished(std::vector<Finished>& finished);  // without `mu` held
};

// One of the backend's threads: start() runs run() on a new thread, join() waits for it to return
// (run() returns once it sees State::stopping). Both are called by the backend's start() and
// stop() only.
class BackendThread {
 public:
  explicit BackendThread(State& state) : state_(state) {}
  virtual ~BackendThread() = default;
  BackendThread(const BackendThread&) = delete;
  BackendThread& operator=(const BackendThread&) = delete;

  void start() {
    thread_ = std::thread([this] { run(); });
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 protected:
  virtual void run() = 0;
  State& state_;

 private:
  std::thread thread_;
};

}  // namespace pdr::transfer::rdma
