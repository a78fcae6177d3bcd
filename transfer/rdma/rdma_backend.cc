// The RDMA backend (contract: rdma_backend.h; design: TRANSFER.md 2.2).
//
// Locking: one mutex (mu_) guards every table below; verbs calls made under it only take the
// verbs layer's own locks, never ours, so there is no inversion. finish() and on_notification are
// called with mu_ released (the engine may call back into cancel()/submit() from them). Network
// waits (connect and handshake) also run with mu_ released, so two backends that connect to each
// other at the same moment cannot deadlock.
#include "transfer/rdma/rdma_backend.h"

#include <net/if.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "proto/rdma_handshake.h"
#include "transfer/rdma/control_socket.h"
#include "transfer/socket_ops.h"
#include "transfer/rdma/gid_rank.h"
#include "transfer/rdma/notify_message.h"
#include "transfer/rdma/qp_attrs.h"
#include "transfer/rdma/verbs_api.h"

namespace pdr::transfer {

namespace {

using rdma::ControlClock;
using rdma::VerbsApi;

constexpr int kPollBatch = 64;
// The I/O thread naps when a round found nothing to do: kIdleNap while recently busy, kLongNap
// after kLongIdle without work. There is no completion channel yet (R-12's armed-CQ blocking is
// future work), so these bound the latency a peer-triggered CQE (an incoming notify, a reply) may
// wait; a local submit or cancel wakes the thread at once.
constexpr auto kIdleNap = std::chrono::microseconds(200);
constexpr auto kLongNap = std::chrono::milliseconds(1);
constexpr auto kLongIdle = std::chrono::milliseconds(50);

// wr_id: kind (2 bits) | connection generation (22 bits) | sequence or receive slot (40 bits).
// The generation makes CQEs of a destroyed connection (whose qpn the NIC may reuse) recognisable.
enum class WrKind : std::uint8_t { kData = 0, kNotify = 1, kReply = 2, kRecv = 3 };
constexpr std::uint32_t kGenMask = (1u << 22) - 1;
constexpr std::uint64_t kLowMask = (std::uint64_t{1} << 40) - 1;

std::uint64_t make_wr_id(WrKind kind, std::uint32_t gen, std::uint64_t low) {
  return (std::uint64_t{static_cast<std::uint8_t>(kind)} << 62) |
         (std::uint64_t{gen & kGenMask} << 40) | (low & kLowMask);
}

struct SendEntry {
  std::uint64_t task_id = 0;
  WrKind kind = WrKind::kData;
  bool read = false;
  std::uint32_t bytes = 0;
  std::uint32_t slot = 0;  // send slot of a notify/reply
};

struct QpState {
  ibv_qp* qp = nullptr;
  std::uint32_t psn = 0;
  std::vector<SendEntry> ring;  // indexed by seq % ring.size(); ring.size() == max_send_wr
  std::uint64_t next_seq = 1;   // seq of the next WR to post
  std::uint64_t retired = 0;    // every seq <= retired has completed
  std::uint32_t reads_out = 0;
  // The chain being built this round (preallocated: no allocation on the data path).
  std::vector<ibv_send_wr> wrs;
  std::vector<ibv_sge> sges;
  std::uint32_t chain = 0;
  std::uint32_t chain_reads = 0;
  std::uint64_t outstanding() const { return next_seq - 1 - retired; }
};

struct Conn {
  std::uint32_t gen = 0;
  bool server = false;
  PeerId peer = kInvalidPeer;  // initiator side
  std::string remote_agent;
  int fd = -1;
  bool fd_watched = false;  // handed to the control thread, which then owns closing it
  bool ready = false;
  std::vector<QpState> qps;
  std::unique_ptr<std::byte[]> slab;  // notify_slots receive slots, then notify_slots send slots
  ibv_mr* slab_mr = nullptr;
  std::vector<std::uint32_t> free_send_slots;
  std::uint32_t notifies_in_flight = 0;
  std::uint32_t rd_atomic = 1;
  std::uint32_t rr = 0;
  std::deque<std::uint64_t> posting;       // initiator: tasks with WRs left to post
  std::deque<std::uint64_t> notify_queue;  // initiator: data done, notify not yet sent
  std::deque<std::pair<std::uint64_t, std::uint8_t>> reply_queue;  // target: replies to send
};

struct RemoteRegion {
  std::uint32_t rkey = 0;
  std::uint64_t addr = 0;
};

struct PeerState {
  std::string address;
  std::unordered_map<std::uint32_t, RemoteRegion> regions;
  std::uint32_t conn_gen = 0;  // 0: no connection (or one being torn down)
  std::deque<std::uint64_t> waiting;  // submitted before the connection was ready
  ControlClock::time_point retry_after{};
  std::chrono::milliseconds backoff{0};
};

enum class Stage : std::uint8_t { kWaiting, kPosting, kNotifyQueued, kNotifySent };

struct TaskState {
  XferTask* task = nullptr;
  PeerId peer = kInvalidPeer;
  std::uint32_t conn_gen = 0;
  Stage stage = Stage::kWaiting;
  std::size_t seg = 0;
  std::uint64_t seg_off = 0;
  std::uint32_t outstanding = 0;
  bool all_posted = false;
  bool stop_posting = false;
  std::uint64_t total = 0;
  std::uint64_t bytes_done = 0;
  XferCause failure = XferCause::kNone;
};

struct Finished {
  XferTask* task;
  XferResult result;
};
struct Delivery {
  std::string from;
  std::string message;
};

// "down" in /sys/class/net/<dev>/operstate; anything else ("up", "unknown" for rxe/loopback-like
// devices, or an unreadable file) counts as up so a missing sysfs never hides every GID.
bool netdev_is_up(const std::string& netdev) {
  std::ifstream in("/sys/class/net/" + netdev + "/operstate");
  std::string state;
  return !(in >> state) || state != "down";
}

XferResult cancel_result(XferCause cause, std::uint64_t bytes) {
  if (cause == XferCause::kTimeout) return {XferState::kFailed, XferCause::kTimeout, bytes};
  return {XferState::kCancelled, XferCause::kCancelled, bytes};
}

class RdmaBackend final : public Backend {
 public:
  RdmaBackend(const RdmaBackendOptions& options, rdma::VerbsLoader load_verbs)
      : options_(options), load_verbs_(load_verbs) {
    options_.qps_per_peer = std::clamp<std::uint32_t>(options_.qps_per_peer, 1,
                                                      proto::kRdmaMaxQps);
    options_.max_send_wr = std::max<std::uint32_t>(options_.max_send_wr, 2);
    if (options_.signal_every == 0) options_.signal_every = std::max<std::uint32_t>(1, options_.max_send_wr / 4);
    options_.slice_bytes = std::clamp<std::uint64_t>(options_.slice_bytes, 4096, 1u << 30);
    options_.notify_slots = std::max<std::uint32_t>(options_.notify_slots, 1);
    slot_bytes_ = rdma::kNotifyHeaderBytes + options_.max_notify_bytes;
    max_chain_ = std::max<std::uint32_t>(1, options_.max_send_wr / 2);
  }
  ~RdmaBackend() override { stop(); }

  BackendKind kind() const override { return BackendKind::kRdma; }

  Status start(const BackendContext& context) override;
  void stop() override;
  std::string local_address() const override { return address_; }
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
  Status open_device();
  void release_device();
  void io_loop();
  void control_loop();
  void connector_loop();
  void accept_one();
  void connect_peer(PeerId peer);

  // ---- all below run with mu_ held ----
  Status create_conn(bool server, std::size_t qp_count, Conn** out);
  void destroy_conn_resources(Conn& conn);
  Status bring_up(Conn& conn, const proto::RdmaHandshake& remote);
  proto::RdmaHandshake local_record(const Conn& conn) const;
  void break_conn(std::uint32_t gen, XferCause cause, std::vector<Finished>* finished);
  void fail_waiting(PeerState& peer, XferCause cause, std::vector<Finished>* finished);
  void finish_task(std::uint64_t id, const XferResult& result, std::vector<Finished>* finished);
  void finish_done(std::uint64_t id, std::vector<Finished>* finished);
  bool post_tasks(Conn& conn, std::vector<Finished>* finished);
  bool flush_chains(Conn& conn);
  bool post_single(Conn& conn, WrKind kind, std::uint64_t task_id, std::uint32_t slot,
                   std::uint32_t length);
  void send_notifies(Conn& conn, std::vector<Finished>* finished);
  void send_replies(Conn& conn);
  void retire(Conn& conn, QpState& qp, std::uint64_t upto, std::vector<Finished>* finished);
  void data_complete(Conn& conn, std::uint64_t id, std::vector<Finished>* finished);
  void handle_wc(const ibv_wc& wc, std::vector<Finished>* finished,
                 std::vector<Delivery>* deliveries);
  void handle_recv(Conn& conn, const ibv_wc& wc, std::uint32_t slot,
                   std::vector<Finished>* finished, std::vector<Delivery>* deliveries);
  bool process_cancels(std::vector<Finished>* finished);
  std::byte* recv_slot(Conn& conn, std::uint32_t slot) {
    return conn.slab.get() + std::size_t{slot} * slot_bytes_;
  }
  std::byte* send_slot(Conn& conn, std::uint32_t slot) {
    return conn.slab.get() + (std::size_t{options_.notify_slots} + slot) * slot_bytes_;
  }
  bool post_recv_slot(Conn& conn, std::uint32_t slot);

  void run_finished(std::vector<Finished>& finished) {
    for (Finished& f : finished) f.task->finish(f.result);
    finished.clear();
  }
  void wake_io() {
    wake_pending_ = true;
    cv_.notify_one();
  }
  void wake_control() const {
    const std::uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
  }

  RdmaBackendOptions options_;
  rdma::VerbsLoader load_verbs_ = nullptr;  // injected (rdma_backend.h); called in open_device()
  std::size_t slot_bytes_ = 0;
  std::uint32_t max_chain_ = 1;
  BackendContext context_;
  const VerbsApi* api_ = nullptr;
  ibv_context* device_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  rdma::LocalPath path_;
  std::array<std::uint8_t, 16> gid_{};
  std::uint16_t lid_ = 0;
  std::uint8_t gid_type_ = 0;
  std::uint64_t max_mr_size_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::string address_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool wake_pending_ = false;
  std::condition_variable connect_cv_;
  bool connect_pending_ = false;
  bool started_ = false;
  bool stopping_ = false;
  std::unordered_map<RegionId, ibv_mr*> mrs_;
  std::unordered_map<RegionId, Region> pending_regions_;  // registered before start()
  std::unordered_map<PeerId, PeerState> peers_;
  std::unordered_map<std::uint32_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::uint64_t, TaskState> tasks_;
  std::vector<std::uint64_t> cancels_;
  std::vector<std::pair<int, std::uint32_t>> watch_adds_;  // (fd, gen) for the control thread
  std::uint32_t next_gen_ = 1;
  std::uint64_t qp_budget_used_ = 0;
  std::mt19937 rng_{std::random_device{}()};

  std::thread io_thread_;
  std::thread control_thread_;
  std::thread connector_thread_;
  std::vector<std::pair<int, std::uint32_t>> watched_;  // control thread only (and stop after join)
  std::vector<std::uint32_t> broken_gens_;  // connections a refused post_send condemned
};

// ---------------------------------------------------------------- start / stop

Status RdmaBackend::open_device() {
  if (load_verbs_ == nullptr) {
    return Status(StatusCode::kInvalidValue, "rdma backend built without a verbs loader");
  }
  if (Status s = load_verbs_(&api_); !s) return s;
  int count = 0;
  ibv_device** list = api_->get_device_list(&count);
  if (list == nullptr || count <= 0) {
    if (list != nullptr) api_->free_device_list(list);
    return Status(StatusCode::kIoError, "rdma unavailable: no RDMA device found");
  }
  ibv_device* chosen = nullptr;
  for (int i = 0; i < count; ++i) {
    if (options_.device.empty() || options_.device == api_->get_device_name(list[i])) {
      chosen = list[i];
      break;
    }
  }
  if (chosen == nullptr) {
    api_->free_device_list(list);
    return Status(StatusCode::kIoError, "rdma unavailable: no device named " + options_.device);
  }
  const std::string name = api_->get_device_name(chosen);
  device_ = api_->open_device(chosen);
  api_->free_device_list(list);
  if (device_ == nullptr) {
    return Status(StatusCode::kIoError, "rdma unavailable: cannot open " + name);
  }
  ibv_device_attr device_attr{};
  ibv_port_attr port_attr{};
  if (api_->query_device(device_, &device_attr) != 0 ||
      api_->query_port(device_, path_.port_num, &port_attr) != 0) {
    return Status(StatusCode::kIoError, "rdma unavailable: cannot query " + name);
  }
  if (port_attr.state != IBV_PORT_ACTIVE) {
    return Status(StatusCode::kIoError, "rdma unavailable: port 1 of " + name + " is not active");
  }
  max_mr_size_ = device_attr.max_mr_size;
  path_.active_mtu = port_attr.active_mtu;
  path_.max_rd_atomic = static_cast<std::uint8_t>(std::clamp(device_attr.max_qp_rd_atom, 1, 255));
  path_.roce = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  lid_ = port_attr.lid;
  // GID: rank the table unless configured.
  std::vector<rdma::GidCandidate> candidates;
  for (int i = 0; i < port_attr.gid_tbl_len && i < 256; ++i) {
    rdma::GidCandidate c;
    c.index = i;
    if (api_->query_gid_ex != nullptr) {
      ibv_gid_entry entry{};
      if (api_->query_gid_ex(device_, path_.port_num, static_cast<std::uint32_t>(i), &entry) != 0) {
        continue;
      }
      std::copy(entry.gid.raw, entry.gid.raw + 16, c.gid.begin());
      c.type = entry.gid_type == IBV_GID_TYPE_ROCE_V2   ? rdma::GidType::kRoceV2
               : entry.gid_type == IBV_GID_TYPE_ROCE_V1 ? rdma::GidType::kRoceV1
                                                        : rdma::GidType::kIb;
      char ifname[IF_NAMESIZE] = {};
      if (entry.ndev_ifindex != 0 && ::if_indextoname(entry.ndev_ifindex, ifname) != nullptr) {
        c.netdev = ifname;
        c.netdev_up = netdev_is_up(c.netdev);
      }
    } else {
      ibv_gid gid{};
      if (api_->query_gid(device_, path_.port_num, i, &gid) != 0) continue;
      std::copy(gid.raw, gid.raw + 16, c.gid.begin());
    }
    candidates.push_back(std::move(c));
  }
  rdma::GidOverride choice;
  if (options_.gid_index >= 0) choice.index = options_.gid_index;
  const auto index = rdma::choose_gid(candidates, choice);
  if (index) {
    path_.sgid_index = static_cast<std::uint8_t>(*index);
    for (const auto& c : candidates) {
      if (c.index != *index) continue;
      gid_ = c.gid;
      gid_type_ = c.type == rdma::GidType::kRoceV2 ? 2 : c.type == rdma::GidType::kRoceV1 ? 1 : 0;
    }
  } else if (path_.roce) {
    return Status(StatusCode::kIoError, "rdma unavailable: no usable RoCE GID on " + name);
  }
  pd_ = api_->alloc_pd(device_);
  if (pd_ == nullptr) return Status(StatusCode::kIoError, "rdma unavailable: ibv_alloc_pd failed");
  cq_ = api_->create_cq(device_, static_cast<int>(options_.cq_depth), nullptr, nullptr, 0);
  if (cq_ == nullptr) return Status(StatusCode::kIoError, "rdma unavailable: ibv_create_cq failed");
  return Status::ok();
}

void RdmaBackend::release_device() {
  for (auto& [id, mr] : mrs_) api_->dereg_mr(mr);
  mrs_.clear();
  if (cq_ != nullptr) api_->destroy_cq(cq_);
  if (pd_ != nullptr) api_->dealloc_pd(pd_);
  if (device_ != nullptr) api_->close_device(device_);
  cq_ = nullptr;
  pd_ = nullptr;
  device_ = nullptr;
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  listen_fd_ = -1;
  wake_fd_ = -1;
}

Status RdmaBackend::start(const BackendContext& context) {
  std::lock_guard lock(mu_);
  if (started_) return Status(StatusCode::kInternal, "rdma backend already started");
  context_ = context;
  if (Status s = open_device(); !s) {
    if (api_ != nullptr) release_device();
    return s;
  }
  std::uint16_t port = 0;
  if (Status s = open_listener(options_.listen_host, options_.control_port, &listen_fd_, &port);
      !s) {
    release_device();
    return Status(StatusCode::kIoError, "rdma control listener: " + s.message());
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  const std::string& host = options_.advertise_host.empty() ? options_.listen_host
                                                            : options_.advertise_host;
  address_ = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
             std::to_string(port);
  for (const auto& [id, region] : pending_regions_) {
    ibv_mr* mr = api_->reg_mr(pd_, reinterpret_cast<void*>(region.addr), region.length,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ);
    if (mr == nullptr) {
      release_device();
      return Status(StatusCode::kIoError, "ibv_reg_mr failed for region " + std::to_string(id));
    }
    mrs_[id] = mr;
  }
  pending_regions_.clear();
  started_ = true;
  io_thread_ = std::thread([this] { io_loop(); });
  control_thread_ = std::thread([this] { control_loop(); });
  connector_thread_ = std::thread([this] { connector_loop(); });
  return Status::ok();
}

void RdmaBackend::stop() {
  {
    std::lock_guard lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    wake_io();
  }
  wake_control();
  connect_cv_.notify_all();
  io_thread_.join();
  control_thread_.join();
  connector_thread_.join();
  std::vector<Finished> finished;
  {
    std::lock_guard lock(mu_);
    std::vector<std::uint32_t> gens;
    for (const auto& [gen, conn] : conns_) gens.push_back(gen);
    for (std::uint32_t gen : gens) break_conn(gen, XferCause::kPeerGone, &finished);
    for (auto& [id, peer] : peers_) fail_waiting(peer, XferCause::kPeerGone, &finished);
    std::vector<std::uint64_t> left;
    for (const auto& [id, task] : tasks_) left.push_back(id);
    for (std::uint64_t id : left) {
      finish_task(id, {XferState::kFailed, XferCause::kPeerGone, 0}, &finished);
    }
    for (const auto& [fd, gen] : watched_) ::close(fd);
    for (const auto& [fd, gen] : watch_adds_) ::close(fd);
    watched_.clear();
    watch_adds_.clear();
    release_device();
  }
  run_finished(finished);
}

// ---------------------------------------------------------------- regions and peers

Status RdmaBackend::on_region_registered(RegionId id, const Region& region) {
  std::lock_guard lock(mu_);
  if (!started_) {
    pending_regions_[id] = region;
    return Status::ok();
  }
  if (stopping_) return Status(StatusCode::kIoError, "rdma backend is stopped");
  if (region.length > max_mr_size_) {
    // R-6 wants such regions chunked into several MRs; until then, refuse them clearly.
    return Status(StatusCode::kTooLarge, "region " + std::to_string(id) + " is " +
                                             std::to_string(region.length) +
                                             " bytes, the device's max_mr_size is " +
                                             std::to_string(max_mr_size_));
  }
  // LOCAL_WRITE is required with REMOTE_WRITE (ibv_reg_mr.3). RELAXED_ORDERING stays off: the
  // notify path relies on completion-implies-visibility only, but a future WRITE_WITH_IMM notify
  // (R-13 option A) would not survive it on every NIC.
  ibv_mr* mr = api_->reg_mr(pd_, reinterpret_cast<void*>(region.addr), region.length,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ);
  if (mr == nullptr) {
    return Status(StatusCode::kIoError, "ibv_reg_mr failed for region " + std::to_string(id) +
                                            ": " + std::strerror(errno));
  }
  mrs_[id] = mr;
  return Status::ok();
}

void RdmaBackend::on_region_unregistered(RegionId id) {
  std::lock_guard lock(mu_);
  pending_regions_.erase(id);
  auto it = mrs_.find(id);
  if (it == mrs_.end()) return;
  api_->dereg_mr(it->second);
  mrs_.erase(it);
}

std::string RdmaBackend::region_keys(RegionId id) const {
  std::lock_guard lock(mu_);
  auto it = mrs_.find(id);
  if (it == mrs_.end()) return {};
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
    state.regions[entry.region_id] = RemoteRegion{key.rkey, key.addr};
  }
  std::lock_guard lock(mu_);
  auto [it, inserted] = peers_.try_emplace(peer, std::move(state));
  if (!inserted) return Status(StatusCode::kRejected, "peer " + std::to_string(peer) + " exists");
  return Status::ok();
}

void RdmaBackend::remove_peer(PeerId peer) {
  std::vector<Finished> finished;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    if (it->second.conn_gen != 0) break_conn(it->second.conn_gen, XferCause::kPeerGone, &finished);
    fail_waiting(it->second, XferCause::kPeerGone, &finished);
    peers_.erase(it);
  }
  run_finished(finished);
}

// ---------------------------------------------------------------- submit / cancel

Status RdmaBackend::submit(XferTask* task) {
  std::lock_guard lock(mu_);
  if (!started_ || stopping_) return Status(StatusCode::kIoError, "rdma backend is not running");
  auto peer_it = peers_.find(task->peer());
  if (peer_it == peers_.end()) {
    return Status(StatusCode::kNotFound, "rdma backend has no peer " + std::to_string(task->peer()));
  }
  PeerState& peer = peer_it->second;
  if (task->notify().size() > options_.max_notify_bytes) {
    return Status(StatusCode::kTooLarge, "notify is " + std::to_string(task->notify().size()) +
                                             " bytes, rdma limit " +
                                             std::to_string(options_.max_notify_bytes));
  }
  std::uint64_t total = 0;
  for (const XferSegment& seg : task->segments()) {
    if (!mrs_.contains(seg.local_region)) {
      return Status(StatusCode::kInvalidValue,
                    "local region " + std::to_string(seg.local_region) + " has no rdma MR");
    }
    if (!peer.regions.contains(seg.remote_region)) {
      return Status(StatusCode::kInvalidValue,
                    "remote region " + std::to_string(seg.remote_region) + " has no rkey");
    }
    total += seg.length;
  }
  TaskState state;
  state.task = task;
  state.peer = task->peer();
  state.total = total;
  if (!tasks_.try_emplace(task->id(), state).second) {
    return Status(StatusCode::kInvalidValue, "xfer id " + std::to_string(task->id()) + " in use");
  }
  auto conn_it = peer.conn_gen != 0 ? conns_.find(peer.conn_gen) : conns_.end();
  if (conn_it != conns_.end() && conn_it->second->ready) {
    TaskState& t = tasks_[task->id()];
    t.stage = Stage::kPosting;
    t.conn_gen = peer.conn_gen;
    conn_it->second->posting.push_back(task->id());
  } else {
    peer.waiting.push_back(task->id());
    connect_pending_ = true;
    connect_cv_.notify_one();
  }
  wake_io();
  return Status::ok();
}

void RdmaBackend::cancel(std::uint64_t xfer_id) {
  std::lock_guard lock(mu_);
  if (!tasks_.contains(xfer_id)) return;
  cancels_.push_back(xfer_id);
  wake_io();
}

bool RdmaBackend::process_cancels(std::vector<Finished>* finished) {
  if (cancels_.empty()) return false;
  for (std::uint64_t id : cancels_) {
    auto it = tasks_.find(id);
    if (it == tasks_.end()) continue;
    TaskState& t = it->second;
    const XferCause cause = t.task->cancel_cause();
    if (cause == XferCause::kNone) continue;
    Conn* conn = nullptr;
    if (auto c = conns_.find(t.conn_gen); t.conn_gen != 0 && c != conns_.end()) conn = c->second.get();
    const XferResult result = cancel_result(cause, t.bytes_done);
    switch (t.stage) {
      case Stage::kWaiting: {
        auto& waiting = peers_[t.peer].waiting;
        waiting.erase(std::remove(waiting.begin(), waiting.end(), id), waiting.end());
        finish_task(id, result, finished);
        break;
      }
      case Stage::kPosting:
        // A posted WR cannot be recalled: stop posting more and finish once the posted ones have
        // completed (or the connection is torn down), so the NIC no longer touches the memory.
        t.stop_posting = true;
        if (t.outstanding == 0) {
          if (conn != nullptr) {
            conn->posting.erase(std::remove(conn->posting.begin(), conn->posting.end(), id),
                                conn->posting.end());
          }
          finish_task(id, result, finished);
        }
        break;
      case Stage::kNotifyQueued:
        if (conn != nullptr) {
          conn->notify_queue.erase(
              std::remove(conn->notify_queue.begin(), conn->notify_queue.end(), id),
              conn->notify_queue.end());
        }
        finish_task(id, result, finished);
        break;
      case Stage::kNotifySent:
        // The data is complete and the notify is out: no local memory is in use any more; the
        // reply, if it comes, finds no task and is dropped.
        finish_task(id, result, finished);
        break;
    }
  }
  cancels_.clear();
  return true;
}

void RdmaBackend::finish_task(std::uint64_t id, const XferResult& result,
                              std::vector<Finished>* finished) {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  finished->push_back({it->second.task, result});
  tasks_.erase(it);
}

void RdmaBackend::finish_done(std::uint64_t id, std::vector<Finished>* finished) {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  const TaskState& t = it->second;
  if (context_.counters != nullptr && t.total > 0) {
    auto& counter = t.task->op() == XferOp::kWrite ? context_.counters->bytes_written
                                                   : context_.counters->bytes_read;
    counter.fetch_add(t.total, std::memory_order_relaxed);
  }
  finish_task(id, {XferState::kDone, XferCause::kNone, t.total}, finished);
}

void RdmaBackend::fail_waiting(PeerState& peer, XferCause cause, std::vector<Finished>* finished) {
  for (std::uint64_t id : peer.waiting) {
    auto it = tasks_.find(id);
    if (it == tasks_.end()) continue;
    const XferCause cancel = it->second.task->cancel_cause();
    finish_task(id, cancel != XferCause::kNone ? cancel_result(cancel, 0)
                                               : XferResult{XferState::kFailed, cause, 0},
                finished);
  }
  peer.waiting.clear();
}

// ---------------------------------------------------------------- connections

Status RdmaBackend::create_conn(bool server, std::size_t qp_count, Conn** out) {
  const std::uint64_t budget =
      qp_count * (std::uint64_t{options_.max_send_wr} + options_.notify_slots);
  if (qp_budget_used_ + budget > options_.cq_depth) {
    return Status(StatusCode::kRejected, "rdma CQ depth " + std::to_string(options_.cq_depth) +
                                             " cannot take another " + std::to_string(qp_count) +
                                             " QPs");
  }
  auto conn = std::make_unique<Conn>();
  conn->server = server;
  conn->gen = next_gen_;
  next_gen_ = (next_gen_ + 1) & kGenMask;
  if (next_gen_ == 0) next_gen_ = 1;
  const std::size_t slab_bytes = 2 * std::size_t{options_.notify_slots} * slot_bytes_;
  conn->slab = std::make_unique<std::byte[]>(slab_bytes);
  conn->slab_mr = api_->reg_mr(pd_, conn->slab.get(), slab_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (conn->slab_mr == nullptr) return Status(StatusCode::kIoError, "ibv_reg_mr (slab) failed");
  conn->qps.resize(qp_count);
  for (std::size_t k = 0; k < qp_count; ++k) {
    QpState& q = conn->qps[k];
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;  // selective signalling
    init.cap.max_send_wr = options_.max_send_wr;
    init.cap.max_recv_wr = k == 0 ? options_.notify_slots : 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    q.qp = api_->create_qp(pd_, &init);
    if (q.qp == nullptr) {
      destroy_conn_resources(*conn);
      return Status(StatusCode::kIoError, "ibv_create_qp failed");
    }
    rdma::QpTransition t = rdma::build_init_transition(path_);
    if (api_->modify_qp(q.qp, &t.attr, t.mask) != 0) {
      destroy_conn_resources(*conn);
      return Status(StatusCode::kIoError, "ibv_modify_qp(INIT) failed");
    }
    q.psn = rng_() & proto::kRdmaMax24Bit;
    q.ring.resize(options_.max_send_wr);
    q.wrs.resize(max_chain_);
    q.sges.resize(max_chain_);
  }
  for (std::uint32_t slot = 0; slot < options_.notify_slots; ++slot) {
    conn->free_send_slots.push_back(slot);
    if (!post_recv_slot(*conn, slot)) {
      destroy_conn_resources(*conn);
      return Status(StatusCode::kIoError, "ibv_post_recv failed");
    }
  }
  qp_budget_used_ += budget;
  *out = conn.get();
  conns_[conn->gen] = std::move(conn);
  return Status::ok();
}

void RdmaBackend::destroy_conn_resources(Conn& conn) {
  for (QpState& q : conn.qps) {
    if (q.qp == nullptr) continue;
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    api_->modify_qp(q.qp, &attr, IBV_QP_STATE);
    // After ibv_destroy_qp returns the NIC no longer accesses the QP's buffers (ibv_destroy_qp.3),
    // which is what lets a broken connection's tasks finish without waiting for flush CQEs.
    api_->destroy_qp(q.qp);
    q.qp = nullptr;
  }
  if (conn.slab_mr != nullptr) api_->dereg_mr(conn.slab_mr);
  conn.slab_mr = nullptr;
}

bool RdmaBackend::post_recv_slot(Conn& conn, std::uint32_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(recv_slot(conn, slot));
  sge.length = static_cast<std::uint32_t>(slot_bytes_);
  sge.lkey = conn.slab_mr->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = make_wr_id(WrKind::kRecv, conn.gen, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return api_->post_recv(conn.qps[0].qp, &wr, &bad) == 0;
}

proto::RdmaHandshake RdmaBackend::local_record(const Conn& conn) const {
  proto::RdmaHandshake record;
  record.gid = gid_;
  record.lid = lid_;
  record.port_num = path_.port_num;
  record.path_mtu = static_cast<std::uint8_t>(path_.active_mtu);
  record.gid_type = gid_type_;
  record.max_rd_atomic = path_.max_rd_atomic;
  for (const QpState& q : conn.qps) {
    record.qpn.push_back(q.qp->qp_num);
    record.psn.push_back(q.psn);
  }
  record.agent = context_.agent.empty() ? std::string("unnamed") : context_.agent;
  if (record.agent.size() > proto::kRdmaMaxAgentBytes) record.agent.resize(proto::kRdmaMaxAgentBytes);
  return record;
}

Status RdmaBackend::bring_up(Conn& conn, const proto::RdmaHandshake& remote) {
  if (remote.qpn.size() != conn.qps.size()) {
    return Status(StatusCode::kInvalidValue, "peer offered " + std::to_string(remote.qpn.size()) +
                                                 " QPs, expected " +
                                                 std::to_string(conn.qps.size()));
  }
  for (std::size_t k = 0; k < conn.qps.size(); ++k) {
    rdma::QpTransition rtr = rdma::build_rtr_transition(path_, remote, k);
    if (api_->modify_qp(conn.qps[k].qp, &rtr.attr, rtr.mask) != 0) {
      return Status(StatusCode::kIoError, "ibv_modify_qp(RTR) failed");
    }
    rdma::QpTransition rts = rdma::build_rts_transition(path_, remote, conn.qps[k].psn);
    if (api_->modify_qp(conn.qps[k].qp, &rts.attr, rts.mask) != 0) {
      return Status(StatusCode::kIoError, "ibv_modify_qp(RTS) failed");
    }
  }
  conn.rd_atomic = rdma::negotiated_rd_atomic(path_, remote);
  conn.remote_agent = remote.agent;
  return Status::ok();
}

void RdmaBackend::break_conn(std::uint32_t gen, XferCause cause, std::vector<Finished>* finished) {
  auto it = conns_.find(gen);
  if (it == conns_.end()) return;
  Conn& conn = *it->second;
  if (conn.ready && context_.counters != nullptr) {
    context_.counters->disconnects.fetch_add(1, std::memory_order_relaxed);
  }
  if (conn.fd >= 0) {
    // The control thread owns a watched fd and closes it on the EOF this causes.
    if (conn.fd_watched) {
      ::shutdown(conn.fd, SHUT_RDWR);
    } else {
      ::close(conn.fd);
    }
  }
  destroy_conn_resources(conn);
  qp_budget_used_ -= conn.qps.size() * (std::uint64_t{options_.max_send_wr} + options_.notify_slots);
  std::vector<std::uint64_t> ids;
  for (const auto& [id, t] : tasks_) {
    if (t.conn_gen == gen) ids.push_back(id);
  }
  for (std::uint64_t id : ids) {
    const TaskState& t = tasks_[id];
    const XferCause cancel = t.task->cancel_cause();
    const XferResult result = cancel != XferCause::kNone
                                  ? cancel_result(cancel, t.bytes_done)
                                  : XferResult{XferState::kFailed,
                                               t.failure != XferCause::kNone ? t.failure : cause,
                                               t.bytes_done};
    finish_task(id, result, finished);
  }
  if (!conn.server) {
    auto peer = peers_.find(conn.peer);
    if (peer != peers_.end() && peer->second.conn_gen == gen) peer->second.conn_gen = 0;
  }
  conns_.erase(it);
}

void RdmaBackend::connect_peer(PeerId peer_id) {
  std::vector<Finished> finished;
  std::uint32_t gen = 0;
  std::string address;
  std::string record;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer_id);
    if (it == peers_.end() || it->second.conn_gen != 0 || stopping_) return;
    Conn* conn = nullptr;
    if (Status s = create_conn(false, options_.qps_per_peer, &conn); !s) {
      if (context_.counters != nullptr) {
        context_.counters->connect_failures.fetch_add(1, std::memory_order_relaxed);
      }
      fail_waiting(it->second, XferCause::kInternal, &finished);
    } else {
      conn->peer = peer_id;
      gen = conn->gen;
      it->second.conn_gen = gen;
      address = it->second.address;
      record = proto::encode_rdma_handshake(local_record(*conn));
    }
  }
  if (gen == 0) {
    run_finished(finished);
    return;
  }
  // Network part, without the lock (see the file comment); blocks the connector thread for at most
  // connect_timeout_ms.
  const auto deadline = ControlClock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
  int fd = -1;
  std::string reply;
  proto::RdmaHandshake remote;
  Status s = rdma::control_connect(address, deadline, &fd);
  if (s) s = rdma::control_send_record(fd, record, deadline);
  if (s) s = rdma::control_recv_record(fd, proto::kRdmaHandshakeMaxBytes, deadline, &reply);
  if (s) {
    s = proto::decode_rdma_handshake(std::as_bytes(std::span(reply)), &remote);
    if (!s && context_.counters != nullptr) {
      context_.counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
    }
  }
  {
    std::lock_guard lock(mu_);
    auto conn_it = conns_.find(gen);
    auto peer_it = peers_.find(peer_id);
    if (conn_it == conns_.end() || peer_it == peers_.end()) {  // removed meanwhile
      if (fd >= 0) ::close(fd);
      if (conn_it != conns_.end()) break_conn(gen, XferCause::kPeerGone, &finished);
    } else {
      Conn& conn = *conn_it->second;
      conn.fd = fd;
      if (s) s = bring_up(conn, remote);
      PeerState& peer = peer_it->second;
      if (!s) {
        if (context_.counters != nullptr) {
          context_.counters->connect_failures.fetch_add(1, std::memory_order_relaxed);
        }
        break_conn(gen, XferCause::kPeerGone, &finished);
        fail_waiting(peer, XferCause::kPeerGone, &finished);
        peer.backoff = std::clamp(peer.backoff * 2, std::chrono::milliseconds(50),
                                  std::chrono::milliseconds(2000));
        peer.retry_after = ControlClock::now() + peer.backoff;
      } else {
        conn.ready = true;
        conn.fd_watched = true;
        watch_adds_.emplace_back(fd, gen);
        peer.backoff = std::chrono::milliseconds(0);
        if (context_.counters != nullptr) {
          context_.counters->connects.fetch_add(1, std::memory_order_relaxed);
        }
        for (std::uint64_t id : peer.waiting) {
          auto t = tasks_.find(id);
          if (t == tasks_.end()) continue;
          t->second.stage = Stage::kPosting;
          t->second.conn_gen = gen;
          conn.posting.push_back(id);
        }
        peer.waiting.clear();
      }
    }
  }
  wake_control();
  run_finished(finished);
}

// ---------------------------------------------------------------- data path

bool RdmaBackend::post_tasks(Conn& conn, std::vector<Finished>* finished) {
  if (conn.posting.empty()) return false;
  auto peer_it = peers_.find(conn.peer);
  if (peer_it == peers_.end()) return false;
  const PeerState& peer = peer_it->second;
  const std::size_t k_count = conn.qps.size();
  bool blocked = false;
  while (!conn.posting.empty() && !blocked) {
    const std::uint64_t id = conn.posting.front();
    auto it = tasks_.find(id);
    if (it == tasks_.end()) {
      conn.posting.pop_front();
      continue;
    }
    TaskState& t = it->second;
    const auto segments = t.task->segments();
    const bool read = t.task->op() == XferOp::kRead;
    while (!t.stop_posting && t.seg < segments.size()) {
      const XferSegment& seg = segments[t.seg];
      if (seg.length == t.seg_off) {
        ++t.seg;
        t.seg_off = 0;
        continue;
      }
      // Round-robin over the QPs that still have room (R-10 bounds).
      QpState* q = nullptr;
      for (std::size_t n = 0; n < k_count; ++n) {
        QpState& cand = conn.qps[(conn.rr + n) % k_count];
        if (cand.outstanding() + cand.chain >= options_.max_send_wr || cand.chain >= max_chain_) {
          continue;
        }
        if (read && cand.reads_out + cand.chain_reads >= conn.rd_atomic) continue;
        q = &cand;
        conn.rr = static_cast<std::uint32_t>((conn.rr + n + 1) % k_count);
        break;
      }
      if (q == nullptr) {
        blocked = true;
        break;
      }
      auto mr = mrs_.find(seg.local_region);
      auto remote = peer.regions.find(seg.remote_region);
      if (mr == mrs_.end() || remote == peer.regions.end()) {
        // Unregistered since submit: the engine must quiesce first; fail rather than touch it.
        t.failure = XferCause::kInternal;
        t.stop_posting = true;
        break;
      }
      const std::uint64_t length = std::min(seg.length - t.seg_off, options_.slice_bytes);
      const std::uint32_t i = q->chain++;
      ibv_sge& sge = q->sges[i];
      sge.addr = reinterpret_cast<std::uintptr_t>(seg.local_addr) + t.seg_off;
      sge.length = static_cast<std::uint32_t>(length);
      sge.lkey = mr->second->lkey;
      ibv_send_wr& wr = q->wrs[i];
      wr = ibv_send_wr{};
      const std::uint64_t seq = q->next_seq + i;
      wr.wr_id = make_wr_id(WrKind::kData, conn.gen, seq);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      wr.wr.rdma.remote_addr = remote->second.addr + seg.remote_offset + t.seg_off;
      wr.wr.rdma.rkey = remote->second.rkey;
      q->ring[seq % q->ring.size()] = SendEntry{id, WrKind::kData, read,
                                                static_cast<std::uint32_t>(length), 0};
      if (read) ++q->chain_reads;
      ++t.outstanding;
      t.seg_off += length;
    }
    if (blocked) break;
    conn.posting.pop_front();
    t.all_posted = true;
    if (t.outstanding == 0) {
      // Nothing in flight for it (bare notify, or stopped before its first WR).
      const XferCause cancel = t.task->cancel_cause();
      if (cancel != XferCause::kNone) {
        finish_task(id, cancel_result(cancel, t.bytes_done), finished);
      } else if (t.failure != XferCause::kNone) {
        finish_task(id, {XferState::kFailed, t.failure, t.bytes_done}, finished);
      } else {
        data_complete(conn, id, finished);
      }
    }
  }
  return flush_chains(conn) || !conn.posting.empty();
}

// Rings one doorbell per QP for the chain built this round, signalling every
// signal_every-th WR and the last WR of each task on the QP: RC retires a send queue in
// order, so the signalled CQE of a task's last WR retires all of its earlier unsignalled ones.
bool RdmaBackend::flush_chains(Conn& conn) {
  bool posted = false;
  for (QpState& q : conn.qps) {
    if (q.chain == 0) continue;
    for (std::uint32_t i = 0; i < q.chain; ++i) {
      const std::uint64_t seq = q.next_seq + i;
      const bool last_of_task =
          i + 1 == q.chain ||
          q.ring[seq % q.ring.size()].task_id != q.ring[(seq + 1) % q.ring.size()].task_id;
      q.wrs[i].send_flags = (last_of_task || seq % options_.signal_every == 0) ? IBV_SEND_SIGNALED : 0;
      q.wrs[i].next = i + 1 < q.chain ? &q.wrs[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    const int rc = api_->post_send(q.qp, q.wrs.data(), &bad);
    // On a refused post, WRs before `bad` went out; count them so their CQEs retire correctly.
    const std::uint32_t accepted =
        rc == 0 ? q.chain : static_cast<std::uint32_t>(bad != nullptr ? bad - q.wrs.data() : 0);
    q.next_seq += accepted;
    q.reads_out += rc == 0 ? q.chain_reads : 0;
    q.chain = 0;
    q.chain_reads = 0;
    posted = true;
    if (rc != 0) {
      // The QP refuses work (it is not in RTS any more): the WRs after `bad` will never complete,
      // so the I/O loop tears the connection down, which finishes its tasks.
      broken_gens_.push_back(conn.gen);
    }
  }
  return posted;
}

bool RdmaBackend::post_single(Conn& conn, WrKind kind, std::uint64_t task_id, std::uint32_t slot,
                              std::uint32_t length) {
  QpState& q = conn.qps[0];
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(send_slot(conn, slot));
  sge.length = length;
  sge.lkey = conn.slab_mr->lkey;
  ibv_send_wr wr{};
  const std::uint64_t seq = q.next_seq;
  wr.wr_id = make_wr_id(kind, conn.gen, seq);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  q.ring[seq % q.ring.size()] = SendEntry{task_id, kind, false, length, slot};
  ibv_send_wr* bad = nullptr;
  if (api_->post_send(q.qp, &wr, &bad) != 0) {
    broken_gens_.push_back(conn.gen);
    conn.free_send_slots.push_back(slot);
    return false;
  }
  ++q.next_seq;
  return true;
}

void RdmaBackend::send_notifies(Conn& conn, std::vector<Finished>* finished) {
  QpState& q = conn.qps[0];
  while (!conn.notify_queue.empty() && conn.notifies_in_flight < options_.notify_slots &&
         !conn.free_send_slots.empty() && q.outstanding() < options_.max_send_wr) {
    const std::uint64_t id = conn.notify_queue.front();
    conn.notify_queue.pop_front();
    auto it = tasks_.find(id);
    if (it == tasks_.end()) continue;
    TaskState& t = it->second;
    if (const XferCause cancel = t.task->cancel_cause(); cancel != XferCause::kNone) {
      finish_task(id, cancel_result(cancel, t.bytes_done), finished);
      continue;
    }
    const std::string& message = t.task->notify();
    const std::uint32_t slot = conn.free_send_slots.back();
    conn.free_send_slots.pop_back();
    const std::size_t size = rdma::encode_notify_message(
        {rdma::NotifyType::kNotify, 0, id, message}, std::span(send_slot(conn, slot), slot_bytes_));
    if (!post_single(conn, WrKind::kNotify, id, slot, static_cast<std::uint32_t>(size))) return;
    t.stage = Stage::kNotifySent;
    ++conn.notifies_in_flight;
  }
}

void RdmaBackend::send_replies(Conn& conn) {
  QpState& q = conn.qps[0];
  while (!conn.reply_queue.empty() && !conn.free_send_slots.empty() &&
         q.outstanding() < options_.max_send_wr) {
    const auto [id, status] = conn.reply_queue.front();
    conn.reply_queue.pop_front();
    const std::uint32_t slot = conn.free_send_slots.back();
    conn.free_send_slots.pop_back();
    const std::size_t size = rdma::encode_notify_message(
        {rdma::NotifyType::kReply, status, id, {}}, std::span(send_slot(conn, slot), slot_bytes_));
    if (!post_single(conn, WrKind::kReply, 0, slot, static_cast<std::uint32_t>(size))) return;
  }
}

void RdmaBackend::retire(Conn& conn, QpState& q, std::uint64_t upto,
                         std::vector<Finished>* finished) {
  while (q.retired < upto) {
    const std::uint64_t seq = ++q.retired;
    const SendEntry& e = q.ring[seq % q.ring.size()];
    if (e.kind != WrKind::kData) {
      conn.free_send_slots.push_back(e.slot);
      continue;
    }
    if (e.read) --q.reads_out;
    auto it = tasks_.find(e.task_id);
    if (it == tasks_.end()) continue;
    TaskState& t = it->second;
    --t.outstanding;
    t.bytes_done += e.bytes;
    if (t.outstanding == 0 && t.all_posted) data_complete(conn, e.task_id, finished);
  }
}

// Every data WR of the task has completed: the bytes are in the peer's memory (WRITE: RC's
// completion follows the responder's ACK) or in ours (READ), so the notify may go now (R-13 B).
void RdmaBackend::data_complete(Conn& conn, std::uint64_t id, std::vector<Finished>* finished) {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  TaskState& t = it->second;
  if (const XferCause cancel = t.task->cancel_cause(); cancel != XferCause::kNone) {
    finish_task(id, cancel_result(cancel, t.bytes_done), finished);
  } else if (t.failure != XferCause::kNone) {
    finish_task(id, {XferState::kFailed, t.failure, t.bytes_done}, finished);
  } else if (t.task->notify().empty()) {
    finish_done(id, finished);
  } else {
    t.stage = Stage::kNotifyQueued;
    conn.notify_queue.push_back(id);
  }
}

void RdmaBackend::handle_wc(const ibv_wc& wc, std::vector<Finished>* finished,
                            std::vector<Delivery>* deliveries) {
  const auto kind = static_cast<WrKind>(wc.wr_id >> 62);
  const auto gen = static_cast<std::uint32_t>(wc.wr_id >> 40) & kGenMask;
  const std::uint64_t low = wc.wr_id & kLowMask;
  auto it = conns_.find(gen);
  if (it == conns_.end()) return;  // a torn-down connection's leftovers
  Conn& conn = *it->second;
  QpState* q = nullptr;
  for (QpState& cand : conn.qps) {
    if (cand.qp != nullptr && cand.qp->qp_num == wc.qp_num) q = &cand;
  }
  if (q == nullptr) return;
  if (kind == WrKind::kRecv) {
    handle_recv(conn, wc, static_cast<std::uint32_t>(low), finished, deliveries);
    return;
  }
  const std::uint64_t seq = low;
  if (seq <= q->retired || seq >= q->next_seq) return;
  if (wc.status == IBV_WC_SUCCESS) {
    retire(conn, *q, seq, finished);
    return;
  }
  // The failed WR's predecessors completed (in-order retirement); it and everything after fail.
  retire(conn, *q, seq - 1, finished);
  const SendEntry& e = q->ring[seq % q->ring.size()];
  if (e.kind == WrKind::kData) {
    auto t = tasks_.find(e.task_id);
    if (t != tasks_.end() && t->second.failure == XferCause::kNone) {
      t->second.failure =
          wc.status == IBV_WC_REM_ACCESS_ERR ? XferCause::kAccess : XferCause::kPeerGone;
    }
  }
  break_conn(gen, XferCause::kPeerGone, finished);
}

void RdmaBackend::handle_recv(Conn& conn, const ibv_wc& wc, std::uint32_t slot,
                              std::vector<Finished>* finished, std::vector<Delivery>* deliveries) {
  if (wc.status != IBV_WC_SUCCESS) {  // flushed: the QP went to ERR
    break_conn(conn.gen, XferCause::kPeerGone, finished);
    return;
  }
  if (slot >= options_.notify_slots) return;
  rdma::NotifyMessage decoded;
  const bool ok = wc.byte_len <= slot_bytes_ &&
                  rdma::decode_notify_message(std::span(recv_slot(conn, slot), wc.byte_len),
                                              &decoded) &&
                  decoded.type == (conn.server ? rdma::NotifyType::kNotify : rdma::NotifyType::kReply);
  if (!ok) {
    if (context_.counters != nullptr) {
      context_.counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
    }
    break_conn(conn.gen, XferCause::kBadFrame, finished);
    return;
  }
  const std::uint64_t id = decoded.xfer_id;
  const std::uint8_t status = decoded.status;
  // Copied out before the slot is reposted (the peer may overwrite it as soon as it is).
  std::string message(decoded.message);
  if (!post_recv_slot(conn, slot)) {
    break_conn(conn.gen, XferCause::kPeerGone, finished);
    return;
  }
  if (conn.server) {
    if (context_.counters != nullptr) {
      context_.counters->notifications_received.fetch_add(1, std::memory_order_relaxed);
    }
    deliveries->push_back({conn.remote_agent, std::move(message)});
    // Sent by a later round, after the delivery above ran: the initiator's kDone then implies the
    // notification was handed to our engine.
    conn.reply_queue.emplace_back(id, 0);
    return;
  }
  if (conn.notifies_in_flight > 0) --conn.notifies_in_flight;
  auto it = tasks_.find(id);
  if (it == tasks_.end() || it->second.stage != Stage::kNotifySent ||
      it->second.conn_gen != conn.gen) {
    return;  // cancelled meanwhile
  }
  if (status != 0) {
    finish_task(id, {XferState::kFailed, XferCause::kAccess, it->second.bytes_done}, finished);
    return;
  }
  if (context_.counters != nullptr) {
    context_.counters->notifications_sent.fetch_add(1, std::memory_order_relaxed);
  }
  finish_done(id, finished);
}

// ---------------------------------------------------------------- threads

void RdmaBackend::io_loop() {
  std::vector<ibv_wc> wcs(kPollBatch);
  std::vector<Finished> finished;
  std::vector<Delivery> deliveries;
  std::vector<Conn*> conns;
  auto last_work = std::chrono::steady_clock::now();
  for (;;) {
    bool worked = false;
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
      worked |= process_cancels(&finished);
      conns.clear();
      for (auto& [gen, conn] : conns_) {
        if (conn->ready) conns.push_back(conn.get());
      }
      for (Conn* conn : conns) {
        if (conn->server) {
          send_replies(*conn);
          worked |= !conn->reply_queue.empty();
        } else {
          worked |= post_tasks(*conn, &finished);
          send_notifies(*conn, &finished);
        }
      }
      for (std::uint32_t gen : broken_gens_) break_conn(gen, XferCause::kPeerGone, &finished);
      broken_gens_.clear();
      const int n = api_->poll_cq(cq_, kPollBatch, wcs.data());
      for (int i = 0; i < n; ++i) handle_wc(wcs[static_cast<std::size_t>(i)], &finished, &deliveries);
      worked |= n > 0;
    }
    worked |= !finished.empty() || !deliveries.empty();
    run_finished(finished);
    for (const Delivery& d : deliveries) {
      if (context_.on_notification) context_.on_notification(d.from, d.message);
    }
    deliveries.clear();
    const auto now = std::chrono::steady_clock::now();
    if (worked) {
      last_work = now;
    } else {
      const auto nap = now - last_work > kLongIdle
                           ? std::chrono::duration_cast<std::chrono::microseconds>(kLongNap)
                           : kIdleNap;
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, nap, [this] { return stopping_ || wake_pending_; });
      wake_pending_ = false;
    }
  }
}

// Connects peers that have queued tasks and no connection, one at a time, so the I/O thread never
// waits on the network (cancels of tasks queued behind a slow connect stay prompt).
void RdmaBackend::connector_loop() {
  for (;;) {
    std::optional<PeerId> to_connect;
    {
      std::unique_lock lock(mu_);
      connect_cv_.wait_for(lock, std::chrono::milliseconds(10), [this] {
        return stopping_ || connect_pending_;
      });
      connect_pending_ = false;
      if (stopping_) return;
      const auto now = ControlClock::now();
      for (auto& [id, peer] : peers_) {
        if (peer.conn_gen == 0 && !peer.waiting.empty() && now >= peer.retry_after) {
          to_connect = id;
          break;
        }
      }
    }
    if (to_connect) connect_peer(*to_connect);
  }
}

void RdmaBackend::accept_one() {
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  const auto deadline = ControlClock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
  std::string bytes;
  proto::RdmaHandshake remote;
  Status s = rdma::control_recv_record(fd, proto::kRdmaHandshakeMaxBytes, deadline, &bytes);
  if (s) {
    s = proto::decode_rdma_handshake(std::as_bytes(std::span(bytes)), &remote);
    if (!s && context_.counters != nullptr) {
      context_.counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!s) {
    ::close(fd);
    return;
  }
  std::uint32_t gen = 0;
  std::string record;
  std::vector<Finished> finished;
  {
    std::lock_guard lock(mu_);
    Conn* conn = nullptr;
    if (stopping_ || !create_conn(true, remote.qpn.size(), &conn)) {
      ::close(fd);
      return;
    }
    gen = conn->gen;
    if (!bring_up(*conn, remote)) {
      break_conn(gen, XferCause::kPeerGone, &finished);
      ::close(fd);
      return;
    }
    conn->fd = fd;
    conn->fd_watched = true;  // this thread watches it below
    conn->ready = true;
    record = proto::encode_rdma_handshake(local_record(*conn));
  }
  if (!rdma::control_send_record(fd, record, deadline)) {
    std::lock_guard lock(mu_);
    break_conn(gen, XferCause::kPeerGone, &finished);  // shuts the fd down; closed via watched_
  }
  watched_.emplace_back(fd, gen);
}

void RdmaBackend::control_loop() {
  std::vector<pollfd> fds;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      watched_.insert(watched_.end(), watch_adds_.begin(), watch_adds_.end());
      watch_adds_.clear();
    }
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& [fd, gen] : watched_) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 1000) <= 0) continue;
    if ((fds[0].revents & POLLIN) != 0) {
      std::uint64_t value = 0;
      (void)!::read(wake_fd_, &value, sizeof(value));
    }
    if ((fds[1].revents & POLLIN) != 0) accept_one();
    std::vector<std::pair<int, std::uint32_t>> closed;
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char byte;
      const ssize_t n = ::recv(fds[i].fd, &byte, 1, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      // EOF, an error, or bytes after the handshake (a protocol violation): the connection ends.
      if (n > 0 && context_.counters != nullptr) {
        context_.counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
      }
      closed.push_back(watched_[i - 2]);
    }
    if (closed.empty()) continue;
    std::vector<Finished> finished;
    {
      std::lock_guard lock(mu_);
      for (const auto& [fd, gen] : closed) {
        auto it = conns_.find(gen);
        if (it != conns_.end() && it->second->fd == fd) {
          it->second->fd = -1;  // we close it below
          break_conn(gen, XferCause::kPeerGone, &finished);
        }
      }
    }
    for (const auto& entry : closed) {
      ::close(entry.first);
      watched_.erase(std::find(watched_.begin(), watched_.end(), entry));
    }
    run_finished(finished);
  }
}

}  // namespace

std::unique_ptr<Backend> make_rdma_backend(const RdmaBackendOptions& options,
                                           rdma::VerbsLoader load_verbs) {
  return std::make_unique<RdmaBackend>(options, load_verbs);
}

}  // namespace pdr::transfer
