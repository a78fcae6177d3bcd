#include "transfer/shm/shm_backend.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "transfer/shm/cma_grant.h"
#include "transfer/shm/copy_pool.h"
#include "transfer/shm/remote_region.h"
#include "transfer/shm/serving_connection.h"
#include "transfer/shm/shm_wire.h"
#include "transfer/shm/unix_channel.h"

namespace pdr::transfer {
namespace {

using shm::CopyPool;
using shm::Frame;
using shm::MsgType;
using shm::ReceiveBuffer;
using shm::RemoteRegion;
using shm::ServingConnection;

constexpr std::uint64_t kChunkBytes = 4u << 20;       // cancel is checked between chunks
constexpr std::uint64_t kSplitBytes = 8u << 20;       // segments this large use every worker
constexpr std::chrono::seconds kAnswerTimeout{5};     // HELLO / region query answers (local peer)
constexpr std::chrono::milliseconds kSendTimeout{2000};
// How long unregister_region() waits for CMA peers to acknowledge a revoke; one that has not by
// then is disconnected.
constexpr std::chrono::milliseconds kRevokeTimeout{2000};
constexpr std::uint64_t kListenToken = 1;
constexpr std::uint64_t kWakeToken = 2;

// One outgoing connection: our view of a peer we initiate transfers to.
struct Peer {
  PeerId id = kInvalidPeer;
  std::string address;
  pid_t pid = 0;
  std::uint64_t token = 0;  // epoll token, fixed

  // send_mu guards fd for writers; the I/O thread closes it under send_mu. Region queries take a
  // ticket under send_mu so tickets follow send order (answers come back in that order).
  std::mutex send_mu;
  UniqueFd fd;

  std::mutex mu;
  std::condition_variable cv;  // answers_received moved, gone, or a waiter's task was cancelled
  bool gone = false;
  std::unordered_map<std::uint32_t, std::shared_ptr<RemoteRegion>> regions;
  std::uint64_t queries_sent = 0;
  std::uint64_t answers_received = 0;
  std::uint64_t next_seq = 1;
  std::unordered_map<std::uint64_t, std::uint64_t> pending_acks;  // notify seq -> xfer id
  bool cma_refusal_logged = false;
  std::atomic<bool> gone_flag{false};  // mirrors gone for the copy loop's cheap check

  // I/O thread only.
  ReceiveBuffer rx;
};

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(const ShmBackendOptions& options) : options_(options) {}
  ~ShmBackend() override { stop(); }

  BackendKind kind() const override { return BackendKind::kShm; }
  Status start(const BackendContext& context) override;
  void stop() override;
  std::string local_address() const override { return address_; }

  Status on_region_registered(RegionId id, const Region& /*region*/) override {
    exported_.add(id);
    return {};
  }
  void on_region_unregistered(RegionId id) override;

  bool can_reach(const proto::TransferDescriptor& local,
                 const proto::TransferDescriptor& peer) const override;
  Status add_peer(PeerId peer, const proto::TransferDescriptor& descriptor) override;
  void remove_peer(PeerId peer) override;
  Status submit(XferTask* task) override;
  void cancel(std::uint64_t xfer_id) override;

 private:
  struct Live {
    XferTask* task = nullptr;
    std::shared_ptr<Peer> peer;
    bool awaiting_ack = false;
  };
  // One unregister_region() waiting for the CMA peers that knew the region's address.
  struct RevokeWait {
    std::mutex mu;
    std::condition_variable cv;
    bool started = false;  // the I/O thread sent every revoke (pending is final from below)
    std::uint32_t pending = 0;
  };
  struct Command {
    enum class Kind { kAdd, kDrop, kCancel, kRevoke, kRevokeExpired } kind;
    std::shared_ptr<Peer> peer;
    std::uint64_t xfer_id = 0;
    RegionId region = kInvalidRegion;
    std::shared_ptr<RevokeWait> wait;
  };

  // ---- tasks ----
  void run_task(std::uint64_t id);
  // Copies one segment; kNone or the cause that stopped it. *done grows by the bytes copied.
  XferCause copy_segment(XferTask* task, Peer& peer, const XferSegment& segment,
                         std::uint64_t* done);
  XferCause find_region(XferTask* task, Peer& peer, std::uint32_t id,
                        std::shared_ptr<RemoteRegion>* out);
  XferCause stop_cause(const XferTask* task, const Peer& peer) const;
  void finish(std::uint64_t id, XferResult result);
  // Finishes with the task's own cancel cause (the I/O thread's answer to cancel()).
  void finish_cancelled(std::uint64_t id);

  // ---- I/O thread ----
  void post(Command command);
  void run_io();
  void on_peer_readable(const std::shared_ptr<Peer>& peer);
  bool on_peer_frame(Peer& peer, const Frame& frame);
  // Marks the peer gone, closes its socket, fails its notifications awaiting an ack.
  void drop_peer(std::shared_ptr<Peer> peer, bool established);  // by value: may erase the caller's reference
  void accept_all();
  // kRevoke: sends kRegionRevoke to every connection that was told the region's address.
  void start_revoke(RegionId id, std::shared_ptr<RevokeWait> wait);
  void revoke_done(RegionId id);  // a peer acknowledged, or its connection closed
  void expire_revoke(RegionId id);  // closes the connections that did not acknowledge in time
  // Whether a local peer process of this uid may talk to us (ShmBackendOptions::allowed_uids).
  bool uid_allowed(uid_t uid) const;
  // Counts a peer refused for its uid and logs it, at most once a second (I/O thread or caller).
  void refuse_peer(pid_t pid, uid_t uid, std::string_view side);

  const ShmBackendOptions options_;
  BackendContext context_;
  std::string address_;
  bool started_ = false;
  std::atomic<bool> stopping_{false};
  shm::ExportedRegions exported_;
  std::unique_ptr<CopyPool> pool_;

  std::mutex peers_mu_;
  std::unordered_map<PeerId, std::shared_ptr<Peer>> peers_;
  std::atomic<std::uint64_t> next_token_{16};

  std::mutex live_mu_;
  std::unordered_map<std::uint64_t, Live> live_;

  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;
  std::mutex commands_mu_;
  std::vector<Command> commands_;
  std::thread io_thread_;
  // I/O thread only.
  std::unordered_map<std::uint64_t, std::shared_ptr<Peer>> outgoing_;
  shm::CmaGrant cma_;  // before serving_: connections release it when destroyed
  std::unordered_map<std::uint64_t, std::unique_ptr<ServingConnection>> serving_;
  std::unordered_map<RegionId, std::shared_ptr<RevokeWait>> revokes_;  // I/O thread only
  std::mutex refusal_log_mu_;
  std::chrono::steady_clock::time_point refusal_logged_{};
  std::uint64_t refusals_unlogged_ = 0;
};

std::string default_socket_name(std::string_view agent) {
  std::string clean;
  for (char c : agent.substr(0, 48)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    clean.push_back(ok ? c : '_');
  }
  std::random_device random;
  char suffix[17];
  std::snprintf(suffix, sizeof(suffix), "%08x%08x", random(), random());
  return "pdr-shm-" + clean + "-" + std::to_string(::getpid()) + "-" + suffix;
}

Status ShmBackend::start(const BackendContext& context) {
  if (started_) return Status(StatusCode::kRejected, "shm backend already started");
  if (context.regions == nullptr || context.counters == nullptr) {
    return Status(StatusCode::kInvalidValue, "shm backend needs regions and counters");
  }
  context_ = context;
  address_ = "@" + (options_.socket_name.empty() ? default_socket_name(context.agent)
                                                 : options_.socket_name);
  if (Status s = shm::listen_unix(address_, &listen_fd_); !s) return s;
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (epoll_fd_.get() < 0 || wake_fd_.get() < 0) {
    return Status(StatusCode::kIoError, "shm: cannot create epoll/eventfd");
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenToken;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  ev.data.u64 = kWakeToken;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev);
  // No process-wide PR_SET_PTRACER_ANY: the Yama exception is granted to one peer pid at a time,
  // when it needs cross-memory attach (cma_grant.h).
  unsigned threads = options_.copy_threads;
  if (threads == 0) threads = std::thread::hardware_concurrency() >= 2 ? 2 : 1;
  pool_ = std::make_unique<CopyPool>(threads);
  started_ = true;
  io_thread_ = std::thread([this] { run_io(); });
  return {};
}

void ShmBackend::stop() {
  if (!started_ || stopping_.exchange(true)) return;
  // Wake copy workers waiting for region answers; queued and running tasks see stopping_ and end.
  {
    std::lock_guard lock(peers_mu_);
    for (auto& [id, peer] : peers_) {
      std::lock_guard peer_lock(peer->mu);
      peer->cv.notify_all();
    }
  }
  pool_->stop();
  post(Command{Command::Kind::kDrop, nullptr, 0, kInvalidRegion, nullptr});  // wakes the I/O thread, which sees stopping_
  io_thread_.join();
  // Notifications still awaiting an ack, and anything else left.
  std::vector<std::uint64_t> left;
  {
    std::lock_guard lock(live_mu_);
    for (auto& [id, live] : live_) left.push_back(id);
  }
  for (std::uint64_t id : left) finish(id, {XferState::kFailed, XferCause::kPeerGone, 0});
  std::lock_guard lock(peers_mu_);
  peers_.clear();
}

bool ShmBackend::can_reach(const proto::TransferDescriptor& local,
                           const proto::TransferDescriptor& peer) const {
  const bool has_endpoint =
      std::any_of(peer.endpoints.begin(), peer.endpoints.end(), [](const auto& endpoint) {
        return endpoint.backend == proto::EndpointBackend::kShm && !endpoint.address.empty();
      });
  return has_endpoint && !local.hostname.empty() && !local.boot_id.empty() &&
         local.hostname == peer.hostname && local.boot_id == peer.boot_id;
}

Status ShmBackend::add_peer(PeerId id, const proto::TransferDescriptor& descriptor) {
  if (!started_ || stopping_) return Status(StatusCode::kRejected, "shm backend is not running");
  std::string address;
  for (const auto& endpoint : descriptor.endpoints) {
    if (endpoint.backend == proto::EndpointBackend::kShm) address = endpoint.address;
  }
  if (address.empty()) {
    return Status(StatusCode::kNotFound, "peer '" + descriptor.agent + "' has no shm endpoint");
  }
  {
    std::lock_guard lock(peers_mu_);
    if (peers_.count(id) != 0) {
      return Status(StatusCode::kInvalidValue, "shm peer " + std::to_string(id) + " already added");
    }
  }
  auto fail = [&](Status status) {
    context_.counters->connect_failures.fetch_add(1, std::memory_order_relaxed);
    return Status(status.code(), "shm peer '" + descriptor.agent + "': " + status.message());
  };
  auto peer = std::make_shared<Peer>();
  peer->id = id;
  peer->address = address;
  peer->token = next_token_.fetch_add(1);
  if (Status s = shm::connect_unix(address, &peer->fd); !s) return fail(s);
  uid_t peer_uid = 0;
  if (Status s = shm::peer_credentials(peer->fd.get(), &peer->pid, &peer_uid); !s) return fail(s);
  if (!uid_allowed(peer_uid)) {
    // Someone else's socket under that name: never hand it our memory or map its fds.
    refuse_peer(peer->pid, peer_uid, "listener");
    return fail(Status(StatusCode::kRejected, "the process listening on " + address + " runs as uid " +
                                                  std::to_string(peer_uid) + ", which is not allowed"));
  }
  {
    std::lock_guard send_lock(peer->send_mu);
    {
      std::lock_guard lock(peer->mu);
      peer->queries_sent = 1;  // the HELLO answer is ticket 1
    }
    if (Status s = shm::send_frame(peer->fd.get(), shm::encode_hello(context_.agent), -1,
                                   kSendTimeout);
        !s) {
      return fail(s);
    }
  }
  post(Command{Command::Kind::kAdd, peer, 0, kInvalidRegion, nullptr});
  bool answered;
  {
    std::unique_lock lock(peer->mu);
    answered = peer->cv.wait_for(lock, kAnswerTimeout, [&] {
      return peer->answers_received >= 1 || peer->gone;
    }) && !peer->gone;
  }
  if (!answered) {
    post(Command{Command::Kind::kDrop, peer, 0, kInvalidRegion, nullptr});
    return fail(Status(StatusCode::kIoError, "no answer to HELLO on " + address));
  }
  context_.counters->connects.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(peers_mu_);
  peers_[id] = std::move(peer);
  return {};
}

void ShmBackend::remove_peer(PeerId id) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(id);
    if (it == peers_.end()) return;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  {
    std::lock_guard lock(peer->mu);
    peer->gone = true;
    peer->gone_flag.store(true, std::memory_order_release);
    peer->cv.notify_all();
  }
  post(Command{Command::Kind::kDrop, peer, 0, kInvalidRegion, nullptr});
}

Status ShmBackend::submit(XferTask* task) {
  if (!started_ || stopping_) return Status(StatusCode::kRejected, "shm backend is not running");
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(task->peer());
    if (it == peers_.end()) {
      return Status(StatusCode::kNotFound, "shm peer " + std::to_string(task->peer()) + " unknown");
    }
    peer = it->second;
  }
  if (task->notify().size() > shm::kMaxNotifyBytes) {
    return Status(StatusCode::kTooLarge, "notify message exceeds 65536 bytes");
  }
  const std::uint64_t id = task->id();
  {
    std::lock_guard lock(live_mu_);
    if (!live_.emplace(id, Live{task, std::move(peer), false}).second) {
      return Status(StatusCode::kInvalidValue, "xfer id " + std::to_string(id) + " in flight");
    }
  }
  if (!pool_->post([this, id] { run_task(id); })) {
    std::lock_guard lock(live_mu_);
    live_.erase(id);
    return Status(StatusCode::kRejected, "shm backend is stopping");
  }
  return {};
}

void ShmBackend::cancel(std::uint64_t xfer_id) {
  std::shared_ptr<Peer> peer;
  bool awaiting_ack = false;
  {
    std::lock_guard lock(live_mu_);
    auto it = live_.find(xfer_id);
    if (it == live_.end()) return;
    peer = it->second.peer;
    awaiting_ack = it->second.awaiting_ack;
  }
  if (awaiting_ack) {
    post(Command{Command::Kind::kCancel, nullptr, xfer_id, kInvalidRegion, nullptr});
  } else {
    // A copy loop sees cancel_cause() at its next chunk; a region-answer wait needs a wake-up.
    std::lock_guard lock(peer->mu);
    peer->cv.notify_all();
  }
}

// ---------------------------------------------------------------------------------------------
// Copy workers

XferCause ShmBackend::stop_cause(const XferTask* task, const Peer& peer) const {
  const XferCause cancel = task->cancel_cause();
  if (cancel != XferCause::kNone) return cancel;
  if (stopping_.load(std::memory_order_relaxed) || peer.gone_flag.load(std::memory_order_acquire)) {
    return XferCause::kPeerGone;
  }
  return XferCause::kNone;
}

XferResult failed(XferCause cause, std::uint64_t bytes_done) {
  return {cause == XferCause::kCancelled ? XferState::kCancelled : XferState::kFailed, cause,
          bytes_done};
}

void ShmBackend::run_task(std::uint64_t id) {
  XferTask* task;
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(live_mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return;
    task = it->second.task;
    peer = it->second.peer;
  }
  std::uint64_t done = 0;
  for (const XferSegment& segment : task->segments()) {
    if (XferCause cause = copy_segment(task, *peer, segment, &done); cause != XferCause::kNone) {
      return finish(id, failed(cause, done));
    }
  }
  if (XferCause cause = stop_cause(task, *peer); cause != XferCause::kNone) {
    return finish(id, failed(cause, done));
  }
  if (task->notify().empty()) return finish(id, {XferState::kDone, XferCause::kNone, done});

  const std::string frame_without_seq(task->notify());
  std::uint64_t seq;
  {
    std::lock_guard lock(live_mu_);
    live_[id].awaiting_ack = true;
  }
  {
    std::lock_guard lock(peer->mu);
    if (peer->gone) return finish(id, failed(XferCause::kPeerGone, done));
    seq = peer->next_seq++;
    peer->pending_acks[seq] = id;
  }
  // From here the I/O thread may finish the task at any moment: use only `id`. Counted before the
  // send, so a finished task's notification is always counted (taken back if the send fails).
  context_.counters->notifications_sent.fetch_add(1, std::memory_order_relaxed);
  Status sent;
  {
    std::lock_guard lock(peer->send_mu);
    sent = peer->fd.get() < 0 ? Status(StatusCode::kIoError, "closed")
                              : shm::send_frame(peer->fd.get(),
                                                shm::encode_notify(seq, frame_without_seq), -1,
                                                kSendTimeout);
  }
  if (!sent) {
    context_.counters->notifications_sent.fetch_sub(1, std::memory_order_relaxed);
    // A broken connection: later tasks must not copy into a peer that is going away.
    {
      std::lock_guard lock(peer->mu);
      peer->gone = true;
      peer->gone_flag.store(true, std::memory_order_release);
      peer->cv.notify_all();
    }
    post(Command{Command::Kind::kDrop, peer, 0, kInvalidRegion, nullptr});
    return finish(id, failed(XferCause::kPeerGone, done));
  }
  // A cancel that raced the hand-over saw awaiting_ack == false and only poked the worker.
  bool cancelled = false;
  {
    std::lock_guard lock(live_mu_);
    auto it = live_.find(id);
    cancelled = it != live_.end() && it->second.task->cancel_cause() != XferCause::kNone;
  }
  if (cancelled) post(Command{Command::Kind::kCancel, nullptr, id, kInvalidRegion, nullptr});
}

XferCause ShmBackend::find_region(XferTask* task, Peer& peer, std::uint32_t id,
                                  std::shared_ptr<RemoteRegion>* out) {
  {
    std::lock_guard lock(peer.mu);
    auto it = peer.regions.find(id);
    if (it != peer.regions.end()) {
      *out = it->second;
      return XferCause::kNone;
    }
  }
  // Registered after we connected, perhaps: ask once.
  std::uint64_t ticket;
  {
    std::lock_guard send_lock(peer.send_mu);
    if (peer.fd.get() < 0) return XferCause::kPeerGone;
    {
      std::lock_guard lock(peer.mu);
      ticket = ++peer.queries_sent;
    }
    if (!shm::send_frame(peer.fd.get(), shm::encode_region_query(id), -1, kSendTimeout)) {
      return XferCause::kPeerGone;
    }
  }
  std::unique_lock lock(peer.mu);
  const bool answered = peer.cv.wait_for(lock, kAnswerTimeout, [&] {
    return peer.answers_received >= ticket || peer.gone || stop_cause(task, peer) != XferCause::kNone;
  });
  if (!answered || peer.gone) return XferCause::kPeerGone;
  if (XferCause cause = stop_cause(task, peer); cause != XferCause::kNone) return cause;
  auto it = peer.regions.find(id);
  if (it == peer.regions.end()) return XferCause::kAccess;
  *out = it->second;
  return XferCause::kNone;
}

XferCause ShmBackend::copy_segment(XferTask* task, Peer& peer, const XferSegment& segment,
                                   std::uint64_t* done) {
  std::shared_ptr<RemoteRegion> region;  // keeps the mapping alive while we copy
  if (XferCause cause = find_region(task, peer, segment.remote_region, &region);
      cause != XferCause::kNone) {
    return cause;
  }
  if (!region->contains(segment.remote_offset, segment.length)) return XferCause::kAccess;
  const unsigned parts =
      segment.length >= kSplitBytes ? std::max(pool_->threads(), 1u) : 1u;
  const std::uint64_t part_bytes = (segment.length + parts - 1) / parts;
  std::vector<XferCause> causes(parts, XferCause::kNone);
  std::vector<std::string> errors(parts);
  std::atomic<std::uint64_t> copied{0};
  std::atomic<bool> abort{false};
  const std::function<void(unsigned)> copy_part = [&](unsigned part) {
    const std::uint64_t begin = std::min<std::uint64_t>(part * part_bytes, segment.length);
    const std::uint64_t end = std::min<std::uint64_t>(begin + part_bytes, segment.length);
    for (std::uint64_t at = begin; at < end; at += kChunkBytes) {
      if (abort.load(std::memory_order_relaxed)) return;
      if (XferCause cause = stop_cause(task, peer); cause != XferCause::kNone) {
        causes[part] = cause;
        abort.store(true, std::memory_order_relaxed);
        return;
      }
      const std::uint64_t n = std::min(kChunkBytes, end - at);
      XferCause cause = region->copy(task->op(), segment.remote_offset + at, segment.local_addr + at,
                                     n, &errors[part]);
      if (cause != XferCause::kNone) {
        causes[part] = cause;
        abort.store(true, std::memory_order_relaxed);
        return;
      }
      copied.fetch_add(n, std::memory_order_relaxed);
    }
  };
  pool_->parallel(parts, copy_part);
  *done += copied.load(std::memory_order_relaxed);
  for (unsigned part = 0; part < parts; ++part) {
    if (causes[part] == XferCause::kNone) continue;
    if (!errors[part].empty()) {
      std::lock_guard lock(peer.mu);
      if (!peer.cma_refusal_logged) {
        peer.cma_refusal_logged = true;
        std::fprintf(stderr, "pdr shm: transfer to %s failed: %s\n", peer.address.c_str(),
                     errors[part].c_str());
      }
    }
    return causes[part];
  }
  return XferCause::kNone;
}

void ShmBackend::finish(std::uint64_t id, XferResult result) {
  XferTask* task;
  {
    std::lock_guard lock(live_mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return;  // already finished by the other thread
    task = it->second.task;
    live_.erase(it);
  }
  if (result.state == XferState::kDone) {
    auto& counter = task->op() == XferOp::kWrite ? context_.counters->bytes_written
                                                 : context_.counters->bytes_read;
    counter.fetch_add(result.bytes_done, std::memory_order_relaxed);
  }
  task->finish(result);
}

void ShmBackend::finish_cancelled(std::uint64_t id) {
  XferTask* task;
  XferCause cause;
  {
    std::lock_guard lock(live_mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return;
    task = it->second.task;
    cause = task->cancel_cause();
    if (cause == XferCause::kNone) return;
    live_.erase(it);
  }
  task->finish(failed(cause, 0));
}

// ---------------------------------------------------------------------------------------------
// I/O thread

void ShmBackend::post(Command command) {
  {
    std::lock_guard lock(commands_mu_);
    commands_.push_back(std::move(command));
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

void ShmBackend::run_io() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  for (;;) {
    const int n = ::epoll_wait(epoll_fd_.get(), events, kMaxEvents, -1);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < n; ++i) {
      const std::uint64_t token = events[i].data.u64;
      if (token == kListenToken) {
        accept_all();
      } else if (token == kWakeToken) {
        std::uint64_t value;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &value, sizeof(value));
        std::vector<Command> commands;
        {
          std::lock_guard lock(commands_mu_);
          commands.swap(commands_);
        }
        for (Command& command : commands) {
          switch (command.kind) {
            case Command::Kind::kAdd: {
              epoll_event ev{};
              ev.events = EPOLLIN | EPOLLRDHUP;
              ev.data.u64 = command.peer->token;
              outgoing_[command.peer->token] = command.peer;
              ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, command.peer->fd.get(), &ev);
              break;
            }
            case Command::Kind::kDrop:
              if (command.peer) drop_peer(command.peer, /*established=*/true);
              break;
            case Command::Kind::kCancel:
              finish_cancelled(command.xfer_id);
              break;
            case Command::Kind::kRevoke:
              start_revoke(command.region, std::move(command.wait));
              break;
            case Command::Kind::kRevokeExpired:
              expire_revoke(command.region);
              break;
          }
        }
      } else if (auto out = outgoing_.find(token); out != outgoing_.end()) {
        on_peer_readable(out->second);
      } else if (auto in = serving_.find(token); in != serving_.end()) {
        if (!in->second->on_readable()) {
          if (in->second->said_hello()) {
            context_.counters->disconnects.fetch_add(1, std::memory_order_relaxed);
          }
          ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, in->second->fd(), nullptr);
          serving_.erase(in);
        }
      }
    }
    if (stopping_.load()) break;
  }
  // Shut down: every connection closes, tasks awaiting an ack fail (stop() finishes the rest).
  while (!outgoing_.empty()) drop_peer(outgoing_.begin()->second, true);
  serving_.clear();  // reports every revoke in progress done
  // Revokes posted but never started: no connection is left to revoke from.
  std::vector<Command> left;
  {
    std::lock_guard lock(commands_mu_);
    left.swap(commands_);
  }
  for (Command& command : left) {
    if (command.kind != Command::Kind::kRevoke) continue;
    std::lock_guard lock(command.wait->mu);
    command.wait->started = true;
    command.wait->cv.notify_all();
  }
}

void ShmBackend::on_region_unregistered(RegionId id) {
  exported_.remove(id);
  if (!started_ || stopping_.load() || !options_.allow_cma) return;
  // Security review 14: a peer that reaches this region by cross-memory attach cached its address;
  // it must stop using it before the caller frees the memory.
  auto wait = std::make_shared<RevokeWait>();
  post(Command{Command::Kind::kRevoke, nullptr, 0, id, wait});
  std::unique_lock lock(wait->mu);
  const bool acknowledged =
      wait->cv.wait_for(lock, kRevokeTimeout, [&] { return wait->started && wait->pending == 0; });
  if (acknowledged) return;
  lock.unlock();
  std::fprintf(stderr,
               "pdr shm: a peer did not acknowledge the revoke of region %u within %lld ms; "
               "disconnecting it\n",
               id, static_cast<long long>(kRevokeTimeout.count()));
  post(Command{Command::Kind::kRevokeExpired, nullptr, 0, id, nullptr});
}

void ShmBackend::start_revoke(RegionId id, std::shared_ptr<RevokeWait> wait) {
  std::uint32_t pending = 0;
  for (auto it = serving_.begin(); it != serving_.end();) {
    bool send_failed = false;
    if (it->second->start_revoke(id, &send_failed)) ++pending;
    if (send_failed) {
      ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->second->fd(), nullptr);
      context_.counters->disconnects.fetch_add(1, std::memory_order_relaxed);
      it = serving_.erase(it);
      continue;
    }
    ++it;
  }
  {
    std::lock_guard lock(wait->mu);
    wait->pending += pending;  // acks cannot have arrived yet: this thread handles them
    wait->started = true;
    if (wait->pending == 0) wait->cv.notify_all();
  }
  if (pending > 0) revokes_[id] = std::move(wait);
}

void ShmBackend::revoke_done(RegionId id) {
  auto it = revokes_.find(id);
  if (it == revokes_.end()) return;
  std::shared_ptr<RevokeWait> wait = it->second;
  std::lock_guard lock(wait->mu);
  if (wait->pending > 0 && --wait->pending == 0) {
    wait->cv.notify_all();
    revokes_.erase(it);
  }
}

void ShmBackend::expire_revoke(RegionId id) {
  auto wait = revokes_.find(id);
  if (wait == revokes_.end()) return;  // acknowledged meanwhile
  std::shared_ptr<RevokeWait> keep = wait->second;
  for (auto it = serving_.begin(); it != serving_.end();) {
    if (it->second->revoking(id)) {
      ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->second->fd(), nullptr);
      context_.counters->disconnects.fetch_add(1, std::memory_order_relaxed);
      it = serving_.erase(it);  // its destructor reports revoke_done(id)
      continue;
    }
    ++it;
  }
}

void ShmBackend::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    // Security review 9: the abstract socket is reachable by every process in our network
    // namespace; only allowed uids get an answer (and so memfds or addresses), before any frame.
    pid_t pid = 0;
    uid_t uid = 0;
    if (!shm::peer_credentials(fd, &pid, &uid) || !uid_allowed(uid)) {
      refuse_peer(pid, uid, "connection");
      ::close(fd);
      continue;
    }
    const std::uint64_t token = next_token_.fetch_add(1);
    auto conn = std::make_unique<ServingConnection>(
        UniqueFd(fd),
        shm::ServingContext{&context_, &exported_, options_.allow_cma, &cma_,
                            [this](RegionId id) { revoke_done(id); }},
        pid);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = token;
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
    serving_[token] = std::move(conn);
  }
}

bool ShmBackend::uid_allowed(uid_t uid) const {
  if (options_.allowed_uids.empty()) return uid == ::geteuid();
  return std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(), uid) !=
         options_.allowed_uids.end();
}

void ShmBackend::refuse_peer(pid_t pid, uid_t uid, std::string_view side) {
  context_.counters->shm_peers_refused.fetch_add(1, std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(refusal_log_mu_);
  if (now - refusal_logged_ < std::chrono::seconds(1)) {
    ++refusals_unlogged_;
    return;
  }
  refusal_logged_ = now;
  std::fprintf(stderr,
               "pdr shm: refused %.*s of pid %d uid %u (not an allowed uid)%s\n",
               static_cast<int>(side.size()), side.data(), static_cast<int>(pid),
               static_cast<unsigned>(uid),
               refusals_unlogged_ > 0
                   ? (" (+" + std::to_string(refusals_unlogged_) + " not logged)").c_str()
                   : "");
  refusals_unlogged_ = 0;
}

void ShmBackend::on_peer_readable(const std::shared_ptr<Peer>& peer) {
  for (;;) {
    const ReceiveBuffer::ReadResult read = peer->rx.read_once(peer->fd.get());
    if (read == ReceiveBuffer::ReadResult::kError) return drop_peer(peer, true);
    for (;;) {
      Frame frame;
      std::size_t consumed = 0;
      if (Status s = shm::decode_frame(peer->rx.data(), &frame, &consumed); !s) {
        context_.counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
        return drop_peer(peer, true);
      }
      if (consumed == 0) break;
      if (!on_peer_frame(*peer, frame)) {
        context_.counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
        return drop_peer(peer, true);
      }
      peer->rx.consume(consumed);
    }
    if (read == ReceiveBuffer::ReadResult::kClosed) return drop_peer(peer, true);
    if (read == ReceiveBuffer::ReadResult::kWouldBlock) return;
  }
}

bool ShmBackend::on_peer_frame(Peer& peer, const Frame& frame) {
  switch (frame.type) {
    case MsgType::kRegion: {
      std::shared_ptr<RemoteRegion> region;
      if ((frame.region.flags & shm::kRegionHasFd) != 0) {
        const int fd = peer.rx.take_fd();
        if (fd < 0) return false;  // announced an fd that did not come
        if (Status s = RemoteRegion::map_fd(frame.region.id, frame.region.length, fd, &region); !s) {
          std::fprintf(stderr, "pdr shm: cannot map region %u of %s: %s\n", frame.region.id,
                       peer.address.c_str(), s.message().c_str());
          region.reset();  // unknown: its transfers fail kAccess
        }
      } else if (options_.allow_cma) {
        region = RemoteRegion::attach(frame.region.id, frame.region.length, frame.region.addr,
                                      peer.pid);
      }
      std::lock_guard lock(peer.mu);
      if (region) {
        peer.regions[frame.region.id] = std::move(region);
      } else {
        peer.regions.erase(frame.region.id);
      }
      return true;
    }
    case MsgType::kRegionsEnd: {
      std::lock_guard lock(peer.mu);
      if (peer.answers_received >= peer.queries_sent) return false;  // unsolicited
      ++peer.answers_received;
      peer.cv.notify_all();
      return true;
    }
    case MsgType::kNotifyAck: {
      std::uint64_t id;
      {
        std::lock_guard lock(peer.mu);
        auto it = peer.pending_acks.find(frame.seq);
        if (it == peer.pending_acks.end()) return true;  // its task was cancelled meanwhile
        id = it->second;
        peer.pending_acks.erase(it);
      }
      std::uint64_t bytes = 0;
      {
        std::lock_guard lock(live_mu_);
        auto it = live_.find(id);
        if (it != live_.end()) bytes = it->second.task->total_bytes();
      }
      finish(id, {XferState::kDone, XferCause::kNone, bytes});
      return true;
    }
    case MsgType::kRegionRevoke: {
      // The peer unregistered a region we reach by address: drop it, let copies in progress end,
      // then acknowledge (its unregister_region() waits for this).
      std::shared_ptr<RemoteRegion> region;
      {
        std::lock_guard lock(peer.mu);
        auto it = peer.regions.find(frame.region_id);
        if (it != peer.regions.end()) {
          region = std::move(it->second);
          peer.regions.erase(it);
        }
      }
      if (region) region->revoke();
      std::lock_guard send_lock(peer.send_mu);
      return peer.fd.get() >= 0 &&
             shm::send_frame(peer.fd.get(), shm::encode_revoke_ack(frame.region_id), -1,
                             kSendTimeout)
                 .is_ok();
    }
    case MsgType::kHello:
    case MsgType::kRegionQuery:
    case MsgType::kNotify:
    case MsgType::kRevokeAck:
      return false;  // client -> server messages
  }
  return false;
}

void ShmBackend::drop_peer(std::shared_ptr<Peer> peer, bool established) {
  if (outgoing_.erase(peer->token) == 0 && peer->fd.get() < 0) return;
  std::vector<std::uint64_t> pending;
  {
    std::lock_guard lock(peer->mu);
    peer->gone = true;
    peer->gone_flag.store(true, std::memory_order_release);
    peer->regions.clear();  // copies in progress hold their own references
    for (auto& [seq, id] : peer->pending_acks) pending.push_back(id);
    peer->pending_acks.clear();
    peer->cv.notify_all();
  }
  {
    std::lock_guard lock(peer->send_mu);
    if (peer->fd.get() >= 0) {
      ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, peer->fd.get(), nullptr);
      peer->fd.reset();
      if (established) context_.counters->disconnects.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (std::uint64_t id : pending) finish(id, {XferState::kFailed, XferCause::kPeerGone, 0});
}

}  // namespace

std::unique_ptr<Backend> make_shm_backend(const ShmBackendOptions& options) {
  return std::make_unique<ShmBackend>(options);
}

}  // namespace pdr::transfer
