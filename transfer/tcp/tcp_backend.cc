// TcpBackend: the glue between backend.h and the I/O threads. It owns the peer table (which lanes
// serve a peer, on which threads), cuts a task into per-lane batches (striping, T-6), keeps the
// live tasks for cancel(), and finishes tasks once their batches settled (task_state.h).
//
// Locking: mu_ guards peers_, tasks_ and stopping_. Commands are posted while holding it, so a
// lane's kAddLane / kSubmit / kRemoveLane reach its thread in the order the backend decided them,
// and nothing is posted after kStop. finish() and engine callbacks never run under mu_.
#include "transfer/tcp/tcp_backend.h"

#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transfer/tcp/io_thread.h"
#include "transfer/tcp/lane.h"
#include "transfer/net/tcp_socket.h"
#include "transfer/tcp/task_state.h"

namespace pdr::transfer {
namespace {

using tcp::Batch;
using tcp::BatchKind;
using tcp::Command;
using tcp::IoThread;
using tcp::TaskState;

class TcpBackend final : public Backend, public tcp::TaskSink {
 public:
  explicit TcpBackend(const TcpBackendOptions& options) { shared_.options = options; }
  ~TcpBackend() override { stop(); }

  BackendKind kind() const override { return BackendKind::kTcp; }

  Status start(const BackendContext& context) override;
  void stop() override;
  std::string local_address() const override { return local_address_; }
  bool can_reach(const proto::TransferDescriptor& local, const proto::TransferDescriptor& peer) const override;
  Status add_peer(PeerId peer, const proto::TransferDescriptor& descriptor) override;
  void remove_peer(PeerId peer) override;
  Status submit(XferTask* task) override;
  void cancel(std::uint64_t xfer_id) override;

  void on_batches_settled(TaskState* state) override;

 private:
  struct LaneSlot {
    tcp::Lane* lane;  // owned by `thread` once posted
    IoThread* thread;
  };
  struct Peer {
    std::vector<LaneSlot> lanes;
    std::uint32_t next_lane = 0;  // round robin start for the next task
  };

  // Posts `batch` to lane `lane` of `peer`; false (batch untouched) when that is impossible.
  bool post_batch_locked(PeerId peer, std::uint32_t lane, Batch* batch);

  tcp::Shared shared_;
  EngineCounters own_counters_;  // when the context brings none
  std::vector<std::unique_ptr<IoThread>> threads_;
  std::string local_address_;
  std::uint32_t lanes_per_peer_ = 1;
  bool started_ = false;

  std::mutex mu_;
  bool stopping_ = false;                                    // guarded by mu_
  std::unordered_map<PeerId, Peer> peers_;                   // guarded by mu_
  std::unordered_map<std::uint64_t, TaskState*> tasks_;      // guarded by mu_
  std::size_t next_thread_ = 0;                              // guarded by mu_
};

Status TcpBackend::start(const BackendContext& context) {
  if (started_) return Status(StatusCode::kRejected, "tcp backend already started");
  const TcpBackendOptions& options = shared_.options;
  if (context.agent.empty() || context.agent.size() > options.max_agent_bytes) {
    return Status(StatusCode::kInvalidValue, "tcp backend: agent name must be 1.." +
                                                 std::to_string(options.max_agent_bytes) + " bytes");
  }
  if (context.regions == nullptr) return Status(StatusCode::kInvalidValue, "tcp backend: no region table");
  if (context.secret.size() != proto::kTransferSecretBytes) {
    return Status(StatusCode::kInvalidValue, "tcp backend: the engine secret must be " +
                                                 std::to_string(proto::kTransferSecretBytes) +
                                                 " bytes (peers authenticate with it)");
  }
  if (options.max_connections == 0) {
    return Status(StatusCode::kInvalidValue, "tcp backend: max_connections must be at least 1");
  }
  if (sodium_init() < 0) return Status(StatusCode::kIoError, "tcp backend: libsodium failed to initialise");
  shared_.context = context;
  shared_.counters = context.counters != nullptr ? context.counters : &own_counters_;
  shared_.sink = this;

  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  lanes_per_peer_ = options.lanes != 0 ? options.lanes : std::min(4u, cores);
  const std::size_t thread_count = std::min<std::size_t>(lanes_per_peer_, cores);

  int listen_fd = -1;
  std::uint16_t port = 0;
  if (Status status = open_listener(options.listen_host, options.port, &listen_fd, &port); !status) {
    return status;
  }
  std::vector<IoThread*> acceptors;
  for (std::size_t i = 0; i < thread_count; ++i) {
    threads_.push_back(std::make_unique<IoThread>(shared_));
    acceptors.push_back(threads_.back().get());
    if (Status status = threads_.back()->init(); !status) {
      ::close(listen_fd);
      threads_.clear();
      return status;
    }
  }
  threads_.front()->set_listener(listen_fd, acceptors);
  for (auto& thread : threads_) thread->start();
  local_address_ = join_host_port(
      options.advertise_host.empty() ? options.listen_host : options.advertise_host, port);
  started_ = true;
  return {};
}

void TcpBackend::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    for (auto& thread : threads_) thread->post({.kind = Command::Kind::kStop});
  }
  for (auto& thread : threads_) thread->join();
  std::lock_guard<std::mutex> lock(mu_);
  peers_.clear();  // the threads destroyed the lanes
}

bool TcpBackend::can_reach(const proto::TransferDescriptor& /*local*/,
                           const proto::TransferDescriptor& peer) const {
  return std::any_of(peer.endpoints.begin(), peer.endpoints.end(), [](const proto::DescriptorEndpoint& e) {
    return e.backend == proto::EndpointBackend::kTcp;
  });
}

Status TcpBackend::add_peer(PeerId peer, const proto::TransferDescriptor& descriptor) {
  auto endpoint = std::find_if(descriptor.endpoints.begin(), descriptor.endpoints.end(),
                               [](const proto::DescriptorEndpoint& e) { return e.backend == proto::EndpointBackend::kTcp; });
  if (endpoint == descriptor.endpoints.end()) {
    return Status(StatusCode::kNotFound, "peer '" + descriptor.agent + "' has no tcp endpoint");
  }
  if (descriptor.secret.size() != proto::kTransferSecretBytes) {
    // Its serving side would refuse every lane: say so now, so the engine can try another backend.
    return Status(StatusCode::kRejected, "peer '" + descriptor.agent +
                                             "' publishes no secret in its descriptor (older than "
                                             "v1.1), so its lanes cannot authenticate");
  }
  std::string host;
  std::uint16_t port = 0;
  if (Status status = split_host_port(endpoint->address, &host, &port); !status) return status;
  SocketAddress address;
  if (Status status = resolve_address(host, port, &address); !status) return status;

  std::lock_guard<std::mutex> lock(mu_);
  if (!started_ || stopping_) return Status(StatusCode::kRejected, "tcp backend is not running");
  if (peers_.count(peer) != 0) return Status(StatusCode::kRejected, "peer " + std::to_string(peer) + " already added");
  Peer& state = peers_[peer];
  for (std::uint32_t i = 0; i < lanes_per_peer_; ++i) {
    IoThread* thread = threads_[next_thread_++ % threads_.size()].get();
    auto* lane = new tcp::Lane(*thread, shared_, address, descriptor.secret);
    thread->post({.kind = Command::Kind::kAddLane, .lane = lane});  // cannot fail before kStop
    state.lanes.push_back({lane, thread});
  }
  return {};
}

void TcpBackend::remove_peer(PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  for (const LaneSlot& slot : it->second.lanes) {
    slot.thread->post({.kind = Command::Kind::kRemoveLane, .lane = slot.lane});
  }
  peers_.erase(it);
}

bool TcpBackend::post_batch_locked(PeerId peer, std::uint32_t lane, Batch* batch) {
  if (stopping_) return false;
  auto it = peers_.find(peer);
  if (it == peers_.end()) return false;
  const LaneSlot& slot = it->second.lanes[lane % it->second.lanes.size()];
  batch->queued_at = tcp::Clock::now();
  return slot.thread->post({.kind = Command::Kind::kSubmit, .lane = slot.lane, .batch = batch});
}

Status TcpBackend::submit(XferTask* task) {
  if (task == nullptr) return Status(StatusCode::kInvalidValue, "null task");
  if (task->notify().size() > shared_.options.max_notification_bytes) {
    return Status(StatusCode::kTooLarge, "notify message is longer than " +
                                             std::to_string(shared_.options.max_notification_bytes) + " bytes");
  }
  const auto segments = task->segments();
  for (const XferSegment& segment : segments) {
    if (segment.length > shared_.options.max_frame_payload) {
      return Status(StatusCode::kTooLarge, "segment of " + std::to_string(segment.length) +
                                               " bytes exceeds max_frame_payload");
    }
  }
  if (segments.empty() && task->notify().empty()) {
    task->finish({XferState::kDone, XferCause::kNone, 0});  // nothing to move
    return {};
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (!started_ || stopping_) return Status(StatusCode::kRejected, "tcp backend is not running");
  auto it = peers_.find(task->peer());
  if (it == peers_.end()) return Status(StatusCode::kNotFound, "unknown tcp peer " + std::to_string(task->peer()));
  Peer& peer = it->second;
  const auto lane_count = static_cast<std::uint32_t>(peer.lanes.size());

  auto* state = new TaskState(task, task->peer());
  std::vector<std::pair<std::uint32_t, Batch*>> batches;
  if (segments.empty()) {
    auto* batch = new Batch;
    batch->kind = BatchKind::kNotify;
    batch->notify = task->notify();
    state->notify_posted = true;
    batches.emplace_back(peer.next_lane++ % lane_count, batch);
  } else {
    // A one-piece task stays on one lane (latency); larger ones spread piece by piece over up to
    // every lane, starting where the previous task stopped so small tasks also spread.
    const auto used = std::min<std::uint32_t>(lane_count, static_cast<std::uint32_t>(segments.size()));
    const std::uint32_t first = peer.next_lane;
    peer.next_lane = (first + used) % lane_count;
    std::vector<Batch*> by_lane(lane_count, nullptr);
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const std::uint32_t lane = (first + static_cast<std::uint32_t>(i % used)) % lane_count;
      Batch*& batch = by_lane[lane];
      if (batch == nullptr) {
        batch = new Batch;
        batch->kind = task->op() == XferOp::kWrite ? BatchKind::kWrite : BatchKind::kRead;
        batches.emplace_back(lane, batch);
      }
      batch->segments.push_back(segments[i]);
      batch->bytes += segments[i].length;
      state->notify_lane = lane;
    }
    for (auto& [lane, batch] : batches) {
      batch->responses_left = static_cast<std::uint32_t>(batch->segments.size());
    }
  }
  state->batches_left.store(static_cast<std::uint32_t>(batches.size()), std::memory_order_relaxed);
  for (auto& [lane, batch] : batches) {
    batch->task = state;
    batch->xfer_id = task->id();
  }
  tasks_[task->id()] = state;
  for (auto& [lane, batch] : batches) {
    // Cannot fail: the peer exists and kStop is only posted under mu_ after stopping_ is set.
    post_batch_locked(task->peer(), lane, batch);
  }
  return {};
}

void TcpBackend::cancel(std::uint64_t xfer_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(xfer_id);
  if (it == tasks_.end() || stopping_) return;
  XferCause cause = it->second->task->cancel_cause();
  if (cause == XferCause::kNone) cause = XferCause::kCancelled;
  for (auto& thread : threads_) {
    thread->post({.kind = Command::Kind::kCancel, .xfer_id = xfer_id, .cause = cause});
  }
}

void TcpBackend::on_batches_settled(TaskState* state) {
  XferTask* task = state->task;
  if (state->failure.load(std::memory_order_acquire) == XferCause::kNone && !state->notify_posted &&
      !task->notify().empty()) {
    // T-10: every data batch is acknowledged (WRITE) or landed (READ); only now may the notify go.
    state->notify_posted = true;
    const XferCause cancel = task->cancel_cause();
    if (cancel != XferCause::kNone) {
      state->failure.store(cancel, std::memory_order_release);
    } else {
      auto* batch = new Batch;
      batch->kind = BatchKind::kNotify;
      batch->notify = task->notify();
      batch->task = state;
      batch->xfer_id = task->id();
      state->batches_left.store(1, std::memory_order_release);
      std::lock_guard<std::mutex> lock(mu_);
      if (post_batch_locked(state->peer, state->notify_lane, batch)) return;
      delete batch;
      state->failure.store(XferCause::kPeerGone, std::memory_order_release);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.erase(task->id());
  }
  const XferResult result = tcp::task_result(*state);
  delete state;
  task->finish(result);
}

}  // namespace

std::unique_ptr<Backend> make_tcp_backend(const TcpBackendOptions& options) {
  return std::make_unique<TcpBackend>(options);
}

}  // namespace pdr::transfer
