#include "transfer/tcp/serving_connection.h"

#include <sodium.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <span>

#include "transfer/tcp/io_thread.h"

namespace pdr::transfer::tcp {
namespace {

constexpr std::size_t kScratchBytes = 256 * 1024;
constexpr std::uint64_t kReadBudget = 16u << 20;
constexpr int kMaxVectors = 64;  // answers gathered per sendmsg (ACKs are 40 bytes each)
constexpr std::size_t kMaxQueuedResponses = 4096;

std::atomic<std::uint64_t> g_scratch_allocations{0};

}  // namespace

std::uint64_t ServingConnection::scratch_allocations() {
  return g_scratch_allocations.load(std::memory_order_relaxed);
}

ServingConnection::ServingConnection(IoThread& thread, const Shared& shared, int fd)
    : thread_(thread),
      shared_(shared),
      fd_(fd),
      hello_deadline_(Clock::now() + shared.options.hello_timeout) {
  // Nothing sized by the peer is allocated here: buffers grow only once frames ask for them.
  randombytes_buf(nonce_.data(), nonce_.size());
}

ServingConnection::~ServingConnection() { shutdown(); }

void ServingConnection::start() {
  watched_ = EPOLLIN;
  thread_.watch(fd_, this, EPOLLIN);
  respond(proto::FrameOpcode::kChallenge, 0, proto::TransferFrameHeader{}, nonce_.data(),
          nonce_.size());
  flush();
}

void ServingConnection::shutdown() {
  if (fd_ < 0) return;
  thread_.unwatch(fd_);
  ::close(fd_);
  fd_ = -1;
  shared_.serving_connections.fetch_sub(1, std::memory_order_relaxed);
}

void ServingConnection::close_connection(CloseReason reason) {
  std::atomic<std::uint64_t>* counter = nullptr;
  switch (reason) {
    case CloseReason::kBadFrame: counter = &shared_.counters->bad_frames; break;
    case CloseReason::kAuthFailed: counter = &shared_.counters->auth_failures; break;
    case CloseReason::kHelloTimeout: counter = &shared_.counters->hello_timeouts; break;
    case CloseReason::kLost:
      if (said_hello_) counter = &shared_.counters->disconnects;
      break;
  }
  if (counter != nullptr) counter->fetch_add(1, std::memory_order_relaxed);
  shutdown();
  thread_.retire(this);
}

Clock::time_point ServingConnection::hello_deadline() const {
  return said_hello_ || closed() ? Clock::time_point::max() : hello_deadline_;
}

void ServingConnection::on_timer(Clock::time_point now) {
  if (!said_hello_ && !closed() && now >= hello_deadline_) close_connection(CloseReason::kHelloTimeout);
}

bool ServingConnection::verify_hello() {
  proto::HelloPayload hello;
  const auto payload = std::as_bytes(std::span(notify_.data(), notify_.size()));
  if (!proto::decode_hello_payload(payload, shared_.options.max_agent_bytes, &hello).is_ok()) {
    return false;
  }
  const std::vector<std::byte> message = proto::hello_proof_message(nonce_, hello.agent);
  const std::string& secret = shared_.context.secret;
  // Constant time in the proof (libsodium); the secret's size was checked in start().
  if (crypto_auth_hmacsha256_verify(reinterpret_cast<const unsigned char*>(hello.proof.data()),
                                    reinterpret_cast<const unsigned char*>(message.data()),
                                    message.size(),
                                    reinterpret_cast<const unsigned char*>(secret.data())) != 0) {
    return false;
  }
  peer_agent_.assign(hello.agent);
  said_hello_ = true;
  return true;
}

Status ServingConnection::resolve_host(std::byte** out) const {
  // The kind first: ids are generation-tagged, so if the region is unregistered in between,
  // resolve() below fails instead of finding another region under the same id.
  const std::optional<Region> region = shared_.context.regions->lookup(in_.region_id);
  if (region.has_value() && region->kind == MemKind::kDevice) {
    return Status(StatusCode::kRejected,
                  "region " + std::to_string(in_.region_id) + " is device memory");
  }
  return shared_.context.regions->resolve(in_.region_id, in_.offset, in_.length, out);
}

void ServingConnection::on_events(std::uint32_t events) {
  if (closed()) return;
  if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0) read_frames();
  // EPOLLHUP/ERR while reading is paused: read_frames() did not look, so let the send fail and
  // close us (level-triggered epoll would otherwise report the hang-up forever).
  if (!closed() && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) != 0) flush();
}

void ServingConnection::read_frames() {
  std::uint64_t budget = kReadBudget;
  while (!closed() && budget > 0) {
    if (responses_.size() >= kMaxQueuedResponses) {
      reading_paused_ = true;
      break;
    }
    std::byte* into;
    std::size_t want;
    // Region fence (region_table.h Lifetime): the WRITE target is pinned for this one recv only.
    const bool pinned = in_payload_ && sink_ == Sink::kMemory && pin_write_target(&into);
    if (!in_payload_) {
      into = in_header_.data() + in_header_got_;
      want = in_header_.size() - in_header_got_;
    } else if (pinned) {
      want = static_cast<std::size_t>(in_left_);
    } else if (sink_ == Sink::kDiscard) {
      if (scratch_.empty()) {
        scratch_.resize(kScratchBytes);
        g_scratch_allocations.fetch_add(1, std::memory_order_relaxed);
      }
      into = scratch_.data();
      want = static_cast<std::size_t>(std::min<std::uint64_t>(in_left_, scratch_.size()));
    } else {
      into = reinterpret_cast<std::byte*>(notify_.data()) + in_pos_;
      want = static_cast<std::size_t>(in_left_);
    }
    const ssize_t rc = receive_some(fd_, into, want);
    if (pinned) shared_.context.regions->unpin(in_.region_id);
    if (rc == -EAGAIN || rc == -EWOULDBLOCK) break;
    if (rc <= 0) {
      close_connection(CloseReason::kLost);
      return;
    }
    const auto got = static_cast<std::size_t>(rc);
    budget -= std::min<std::uint64_t>(budget, got);
    if (!in_payload_) {
      in_header_got_ += got;
      if (in_header_got_ < in_header_.size()) continue;
      in_header_got_ = 0;
      if (!proto::decode_frame_header(in_header_, shared_.options.max_frame_payload, &in_).is_ok()) {
        close_connection(CloseReason::kBadFrame);
        return;
      }
      if (!on_header()) {
        // Before the proof every refusal is an authentication failure: the peer learns nothing.
        close_connection(said_hello_ ? CloseReason::kBadFrame : CloseReason::kAuthFailed);
        return;
      }
      continue;
    }
    in_pos_ += got;
    in_left_ -= got;
    if (in_left_ == 0) on_payload_done();
  }
  if (!closed()) flush();
  if (!closed()) update_interest();
}

bool ServingConnection::pin_write_target(std::byte** into) {
  if (shared_.context.regions->pin(in_.region_id, in_.offset + in_pos_, in_left_, into).is_ok()) {
    return true;
  }
  // Unregistered since the header was checked: the rest of the frame lands nowhere and the WRITE
  // is refused (its ACK becomes ERROR(kAccess)), as for a region unknown from the start.
  shared_.counters->access_refused.fetch_add(1, std::memory_order_relaxed);
  write_refused_ = true;
  refused_xfer_ = in_.xfer_id;
  sink_ = Sink::kDiscard;
  return false;
}

bool ServingConnection::on_header() {
  const bool hello = in_.opcode == proto::FrameOpcode::kHello;
  if (hello == said_hello_) return false;  // HELLO exactly once, first: nothing is served before it
  in_pos_ = 0;
  in_left_ = in_.length;
  in_dst_ = nullptr;
  switch (in_.opcode) {
    case proto::FrameOpcode::kHello:
      if (in_.length <= proto::kTransferProofBytes ||
          in_.length > proto::kTransferProofBytes + shared_.options.max_agent_bytes) {
        return false;
      }
      sink_ = Sink::kAgent;
      notify_.resize(in_.length);
      break;
    case proto::FrameOpcode::kWrite: {
      const Status status = resolve_host(&in_dst_);
      write_refused_ = !status.is_ok();
      if (write_refused_) {
        shared_.counters->access_refused.fetch_add(1, std::memory_order_relaxed);
        refused_xfer_ = in_.xfer_id;
      }
      sink_ = write_refused_ ? Sink::kDiscard : Sink::kMemory;
      break;
    }
    case proto::FrameOpcode::kReadReq: {
      std::byte* source = nullptr;
      if (resolve_host(&source).is_ok()) {
        shared_.counters->bytes_served.fetch_add(in_.length, std::memory_order_relaxed);
        respond(proto::FrameOpcode::kReadData, 0, in_, source, in_.length);
      } else {
        shared_.counters->access_refused.fetch_add(1, std::memory_order_relaxed);
        respond(proto::FrameOpcode::kError, static_cast<std::uint32_t>(XferCause::kAccess), in_, nullptr, 0);
      }
      return true;  // READ_REQ carries no payload
    }
    case proto::FrameOpcode::kNotify:
      if (in_.length > shared_.options.max_notification_bytes) return false;
      sink_ = Sink::kNotify;
      notify_.resize(in_.length);
      break;
    default:
      return false;  // READ_DATA / ACK / ERROR / CHALLENGE come from a server, never to one
  }
  in_payload_ = true;
  if (in_left_ == 0) on_payload_done();
  return true;
}

void ServingConnection::on_payload_done() {
  in_payload_ = false;
  switch (in_.opcode) {
    case proto::FrameOpcode::kHello:
      if (!verify_hello()) close_connection(CloseReason::kAuthFailed);
      notify_.clear();
      notify_.shrink_to_fit();
      break;
    case proto::FrameOpcode::kWrite:
      if (!write_refused_) shared_.counters->bytes_served.fetch_add(in_.length, std::memory_order_relaxed);
      if ((in_.flags & kFlagAckRequested) != 0) {
        if (refused_xfer_ == in_.xfer_id) {
          refused_xfer_ = 0;
          respond(proto::FrameOpcode::kError, static_cast<std::uint32_t>(XferCause::kAccess), in_, nullptr, 0);
        } else {
          respond(proto::FrameOpcode::kAck, 0, in_, nullptr, 0);
        }
      }
      break;
    case proto::FrameOpcode::kNotify:
      shared_.counters->notifications_received.fetch_add(1, std::memory_order_relaxed);
      if (shared_.context.on_notification) shared_.context.on_notification(peer_agent_, notify_);
      respond(proto::FrameOpcode::kAck, 0, in_, nullptr, 0);
      break;
    default:
      break;
  }
}

void ServingConnection::respond(proto::FrameOpcode opcode, std::uint32_t flags,
                                const proto::TransferFrameHeader& request, const std::byte* payload,
                                std::uint64_t length) {
  Response response;
  const bool has_payload =
      opcode == proto::FrameOpcode::kReadData || opcode == proto::FrameOpcode::kChallenge;
  response.header = make_header(opcode, flags, request.xfer_id, request.region_id, request.offset,
                                has_payload ? length : 0);
  response.payload = payload;
  response.length = length;
  response.xfer_id = request.xfer_id;
  response.region = request.region_id;
  response.offset = request.offset;
  // A CHALLENGE's payload is the connection's own nonce, not registered memory: nothing to pin.
  response.from_region = opcode == proto::FrameOpcode::kReadData;
  responses_.push_back(response);
}

void ServingConnection::flush() {
  while (!responses_.empty()) {
    iovec vectors[kMaxVectors];
    int count = 0;
    std::size_t skip = front_sent_;
    // READ_DATA payloads are pinned for this one send (region_table.h Lifetime).
    RegionId pinned[kMaxVectors];
    int pins = 0;
    auto unpin_all = [&] {
      for (int p = 0; p < pins; ++p) shared_.context.regions->unpin(pinned[p]);
      pins = 0;
    };
    for (std::size_t i = 0; i < responses_.size() && count + 2 <= kMaxVectors; ++i) {
      Response& response = responses_.at(i);
      if (response.from_region && response.length > 0) {
        std::byte* source = nullptr;
        if (shared_.context.regions->pin(response.region, response.offset, response.length, &source)
                .is_ok()) {
          pinned[pins++] = response.region;
        } else if (i == 0 && front_sent_ > 0) {
          // Unregistered while its answer was half sent: the stream cannot be resynchronised.
          unpin_all();
          shared_.counters->access_refused.fetch_add(1, std::memory_order_relaxed);
          close_connection(CloseReason::kLost);
          return;
        } else {
          // Unregistered before a byte of its answer went out: answer ERROR(kAccess) instead.
          shared_.counters->access_refused.fetch_add(1, std::memory_order_relaxed);
          response.header = make_header(proto::FrameOpcode::kError,
                                        static_cast<std::uint32_t>(XferCause::kAccess),
                                        response.xfer_id, response.region, response.offset, 0);
          response.payload = nullptr;
          response.length = 0;
        }
      }
      if (skip < response.header.size()) {
        vectors[count++] = {response.header.data() + skip, response.header.size() - skip};
        skip = 0;
      } else {
        skip -= response.header.size();
      }
      if (response.length > skip) {
        vectors[count++] = {const_cast<std::byte*>(response.payload) + skip,
                            static_cast<std::size_t>(response.length - skip)};
      }
      skip = 0;
    }
    const ssize_t rc = send_vectors(fd_, vectors, count);
    unpin_all();
    if (rc == -EAGAIN || rc == -EWOULDBLOCK) {
      set_write_interest(true);
      return;
    }
    if (rc < 0) {
      close_connection(CloseReason::kLost);
      return;
    }
    auto sent = static_cast<std::size_t>(rc);
    while (sent > 0) {
      const std::size_t whole = responses_.front().header.size() + responses_.front().length;
      const std::size_t step = std::min(sent, whole - front_sent_);
      front_sent_ += step;
      sent -= step;
      if (front_sent_ == whole) {
        responses_.pop_front();
        front_sent_ = 0;
      }
    }
    if (reading_paused_ && responses_.size() <= kMaxQueuedResponses / 2) {
      reading_paused_ = false;
      update_interest();
    }
  }
  set_write_interest(false);
}

void ServingConnection::set_write_interest(bool on) {
  if (on == write_interest_ || closed()) return;
  write_interest_ = on;
  update_interest();
}

void ServingConnection::update_interest() {
  if (closed()) return;
  const std::uint32_t events = (reading_paused_ ? 0u : static_cast<std::uint32_t>(EPOLLIN)) |
                               (write_interest_ ? static_cast<std::uint32_t>(EPOLLOUT) : 0u);
  if (events == watched_) return;
  watched_ = events;
  thread_.rewatch(fd_, this, events);
}

}  // namespace pdr::transfer::tcp
