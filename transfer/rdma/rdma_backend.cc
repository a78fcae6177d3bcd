// RdmaBackend: the glue between backend.h and the RDMA backend's parts (contract: rdma_backend.h).
// It owns the shared state (backend_state.h: the device, the tables, the lock) and the three
// threads (io_thread.h, connector_thread.h, control_thread.h); its own methods run on the caller's
// thread: start/stop, the region MRs, the peer table, and submit/cancel, which only queue work for
// the threads and wake them.
#include "transfer/rdma/rdma_backend.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "proto/rdma_handshake.h"
#include "transfer/rdma/backend_state.h"
#include "transfer/rdma/connector_thread.h"
#include "transfer/rdma/control_thread.h"
#include "transfer/rdma/io_thread.h"
#include "transfer/net/tcp_socket.h"

namespace pdr::transfer {

namespace {

using rdma::Finished;
using rdma::PeerState;
using rdma::State;
using rdma::TaskState;

// LOCAL_WRITE is required with REMOTE_WRITE (ibv_reg_mr.3). RELAXED_ORDERING stays off: the notify
// path relies on completion-implies-visibility only, but a future WRITE_WITH_IMM notify (R-13
// option A) would not survive it on every NIC.
constexpr int kRegionAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

class RdmaBackend final : public Backend {
 public:
  RdmaBackend(const RdmaBackendOptions& options, rdma::VerbsLoader load_verbs)
      : state_(options, load_verbs), io_(state_), connector_(state_), control_(state_) {}
  ~RdmaBackend() override { stop(); }

  BackendKind kind() const override { return BackendKind::kRdma; }

  Status start(const BackendContext& context) override;
  void stop() override;
  std::string local_address() const override { return state_.address; }
  Status on_region_registered(RegionId id, const Region& region) override;
  void on_region_unregistered(RegionId id) override;
  std::string region_keys(RegionId id) const override;
  bool can_reach(const proto::TransferDescriptor& local,
                 const proto::TransferDescriptor& peer) const override;
  Status add_peer(PeerId peer, const proto::TransferDescriptor& descriptor) override;
  void remove_peer(PeerId peer) override;
  Status submit(XferTask* task) override;
  void cancel(std::uint64_t xfer_id) override;

 private:
  // With the lock held: every region MR, the device, the control listener and the wake-up fd.
  void release_device();
  ibv_mr* register_region(const Region& region) {
    return state_.device.api().reg_mr(state_.device.pd(), reinterpret_cast<void*>(region.addr),
                                      region.length, kRegionAccess);
  }

  State state_;
  rdma::IoThread io_;
  rdma::ConnectorThread connector_;
  rdma::ControlThread control_;
};

// ---------------------------------------------------------------- start / stop

void RdmaBackend::release_device() {
  for (auto& [id, mr] : state_.mrs) state_.device.api().dereg_mr(mr);
  state_.mrs.clear();
  state_.device.close();
  if (state_.listen_fd >= 0) ::close(state_.listen_fd);
  if (state_.wake_fd >= 0) ::close(state_.wake_fd);
  state_.listen_fd = -1;
  state_.wake_fd = -1;
}

Status RdmaBackend::start(const BackendContext& context) {
  std::lock_guard lock(state_.mu);
  if (state_.started) return Status(StatusCode::kInternal, "rdma backend already started");
  state_.context = context;
  if (Status s = state_.device.open(state_.options, state_.load_verbs); !s) return s;
  std::uint16_t port = 0;
  if (Status s = open_listener(state_.options.listen_host, state_.options.control_port,
                               &state_.listen_fd, &port);
      !s) {
    release_device();
    return Status(StatusCode::kIoError, "rdma control listener: " + s.message());
  }
  state_.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  const std::string& host = state_.options.advertise_host.empty() ? state_.options.listen_host
                                                                  : state_.options.advertise_host;
  state_.address = join_host_port(host, port);
  for (const auto& [id, region] : state_.pending_regions) {
    ibv_mr* mr = register_region(region);
    if (mr == nullptr) {
      release_device();
      return Status(StatusCode::kIoError, "ibv_reg_mr failed for region " + std::to_string(id));
    }
    state_.mrs[id] = mr;
  }
  state_.pending_regions.clear();
  state_.started = true;
  io_.start();
  control_.start();
  connector_.start();
  return Status::ok();
}

void RdmaBackend::stop() {
  {
    std::lock_guard lock(state_.mu);
    if (!state_.started || state_.stopping) return;
    state_.stopping = true;
    state_.wake_io();
  }
  state_.wake_control();
  state_.connect_cv.notify_all();
  io_.join();
  control_.join();
  connector_.join();
  std::vector<Finished> finished;
  {
    std::lock_guard lock(state_.mu);
    std::vector<std::uint32_t> gens;
    for (const auto& [gen, conn] : state_.conns) gens.push_back(gen);
    for (std::uint32_t gen : gens) state_.break_conn(gen, XferCause::kPeerGone, &finished);
    for (auto& [id, peer] : state_.peers) state_.fail_waiting(peer, XferCause::kPeerGone, &finished);
    std::vector<std::uint64_t> left;
    for (const auto& [id, task] : state_.tasks) left.push_back(id);
    for (std::uint64_t id : left) {
      state_.finish_task(id, {XferState::kFailed, XferCause::kPeerGone, 0}, &finished);
    }
    control_.close_all();
    release_device();
  }
  State::run_finished(finished);
}

// ---------------------------------------------------------------- regions and peers

Status RdmaBackend::on_region_registered(RegionId id, const Region& region) {
  std::lock_guard lock(state_.mu);
  if (!state_.started) {
    state_.pending_regions[id] = region;
    return Status::ok();
  }
  if (state_.stopping) return Status(StatusCode::kIoError, "rdma backend is stopped");
  if (region.length > state_.device.max_mr_size()) {
    // R-6 wants such regions chunked into several MRs; until then, refuse them clearly.
    return Status(StatusCode::kTooLarge, "region " + std::to_string(id) + " is " +
                                             std::to_string(region.length) +
                                             " bytes, the device's max_mr_size is " +
                                             std::to_string(state_.device.max_mr_size()));
  }
  ibv_mr* mr = register_region(region);
  if (mr == nullptr) {
    return Status(StatusCode::kIoError, "ibv_reg_mr failed for region " + std::to_string(id) +
                                            ": " + std::strerror(errno));
  }
  state_.mrs[id] = mr;
  return Status::ok();
}

void RdmaBackend::on_region_unregistered(RegionId id) {
  std::lock_guard lock(state_.mu);
  state_.pending_regions.erase(id);
  auto it = state_.mrs.find(id);
  if (it == state_.mrs.end()) return;
  state_.device.api().dereg_mr(it->second);
  state_.mrs.erase(it);
}

std::string RdmaBackend::region_keys(RegionId id) const {
  std::lock_guard lock(state_.mu);
  auto it = state_.mrs.find(id);
  if (it == state_.mrs.end()) return {};
  return proto::encode_rdma_region_key(
      {it->second->rkey, reinterpret_cast<std::uintptr_t>(it->second->addr)});
}

bool RdmaBackend::can_reach(const proto::TransferDescriptor& /*local*/,
                            const proto::TransferDescriptor& peer) const {
  const bool has_endpoint =
      std::any_of(peer.endpoints.begin(), peer.endpoints.end(), [](const auto& e) {
        return e.backend == proto::EndpointBackend::kRdma;
      });
  return has_endpoint && !peer.rkeys.empty();
}

Status RdmaBackend::add_peer(PeerId peer, const proto::TransferDescriptor& descriptor) {
  PeerState state;
  for (const auto& e : descriptor.endpoints) {
    if (e.backend == proto::EndpointBackend::kRdma) {
      state.address = e.address;
      break;
    }
  }
  if (state.address.empty()) {
    return Status(StatusCode::kInvalidValue, "peer " + descriptor.agent + " has no rdma endpoint");
  }
  for (std::size_t i = 0; i < descriptor.rkeys.size(); ++i) {
    const auto& entry = descriptor.rkeys[i];
    proto::RdmaRegionKey key;
    if (Status s = proto::decode_rdma_region_key(std::as_bytes(std::span(entry.keys)), &key); !s) {
      return Status(s.code(), "rkeys[" + std::to_string(i) + "]: " + s.message());
    }
    state.regions[entry.region_id] = rdma::RemoteRegion{key.rkey, key.addr};
  }
  std::lock_guard lock(state_.mu);
  auto [it, inserted] = state_.peers.try_emplace(peer, std::move(state));
  if (!inserted) return Status(StatusCode::kRejected, "peer " + std::to_string(peer) + " exists");
  return Status::ok();
}

void RdmaBackend::remove_peer(PeerId peer) {
  std::vector<Finished> finished;
  {
    std::lock_guard lock(state_.mu);
    auto it = state_.peers.find(peer);
    if (it == state_.peers.end()) return;
    if (it->second.conn_gen != 0) {
      state_.break_conn(it->second.conn_gen, XferCause::kPeerGone, &finished);
    }
    state_.fail_waiting(it->second, XferCause::kPeerGone, &finished);
    state_.peers.erase(it);
  }
  State::run_finished(finished);
}

// ---------------------------------------------------------------- submit / cancel

Status RdmaBackend::submit(XferTask* task) {
  std::lock_guard lock(state_.mu);
  if (!state_.started || state_.stopping) {
    return Status(StatusCode::kIoError, "rdma backend is not running");
  }
  auto peer_it = state_.peers.find(task->peer());
  if (peer_it == state_.peers.end()) {
    return Status(StatusCode::kNotFound, "rdma backend has no peer " + std::to_string(task->peer()));
  }
  PeerState& peer = peer_it->second;
  if (task->notify().size() > state_.options.max_notify_bytes) {
    return Status(StatusCode::kTooLarge, "notify is " + std::to_string(task->notify().size()) +
                                             " bytes, rdma limit " +
                                             std::to_string(state_.options.max_notify_bytes));
  }
  std::uint64_t total = 0;
  for (const XferSegment& seg : task->segments()) {
    if (!state_.mrs.contains(seg.local_region)) {
      return Status(StatusCode::kInvalidValue,
                    "local region " + std::to_string(seg.local_region) + " has no rdma MR");
    }
    if (!peer.regions.contains(seg.remote_region)) {
      return Status(StatusCode::kInvalidValue,
                    "remote region " + std::to_string(seg.remote_region) + " has no rkey");
    }
    total += seg.length;
  }
  TaskState task_state;
  task_state.task = task;
  task_state.peer = task->peer();
  task_state.total = total;
  if (!state_.tasks.try_emplace(task->id(), task_state).second) {
    return Status(StatusCode::kInvalidValue, "xfer id " + std::to_string(task->id()) + " in use");
  }
  auto conn_it = peer.conn_gen != 0 ? state_.conns.find(peer.conn_gen) : state_.conns.end();
  if (conn_it != state_.conns.end() && conn_it->second->ready) {
    TaskState& t = state_.tasks[task->id()];
    t.stage = rdma::Stage::kPosting;
    t.conn_gen = peer.conn_gen;
    conn_it->second->posting.push_back(task->id());
  } else {
    peer.waiting.push_back(task->id());
    state_.connect_pending = true;
    state_.connect_cv.notify_one();
  }
  state_.wake_io();
  return Status::ok();
}

void RdmaBackend::cancel(std::uint64_t xfer_id) {
  std::lock_guard lock(state_.mu);
  if (!state_.tasks.contains(xfer_id)) return;
  state_.cancels.push_back(xfer_id);
  state_.wake_io();
}

}  // namespace

std::unique_ptr<Backend> make_rdma_backend(const RdmaBackendOptions& options,
                                           rdma::VerbsLoader load_verbs) {
  return std::make_unique<RdmaBackend>(options, load_verbs);
}

}  // namespace pdr::transfer
