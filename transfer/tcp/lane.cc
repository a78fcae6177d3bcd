#include "transfer/tcp/lane.h"

#include <sodium.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transfer/tcp/io_thread.h"

namespace pdr::transfer::tcp {
namespace {

constexpr std::chrono::milliseconds kFirstBackoff{50};
constexpr std::chrono::milliseconds kMaxBackoff{2000};
constexpr std::size_t kScratchBytes = 256 * 1024;
// Bytes read per readiness event before yielding to the loop's other sockets (level-triggered
// epoll calls us again).
constexpr std::uint64_t kReadBudget = 16u << 20;

}  // namespace

Lane::Lane(IoThread& thread, const Shared& shared, const SocketAddress& address, std::string secret)
    : thread_(thread), shared_(shared), address_(address), secret_(std::move(secret)),
      scratch_(kScratchBytes) {}

Lane::~Lane() { close_socket(); }

void Lane::submit(Batch* batch) {
  ++batch->refs;
  queue_.push_back(batch);
  switch (state_) {
    case State::kIdle: connect(); break;
    case State::kBackoff:
      if (Clock::now() >= next_attempt_) connect();
      break;
    case State::kConnecting:
    case State::kHandshake: break;
    case State::kReady: flush(); break;
  }
}

void Lane::cancel(std::uint64_t xfer_id, XferCause cause) {
  auto matches = [&](Batch* batch) { return batch->xfer_id == xfer_id && !batch->settled; };
  for (std::size_t i = 0; i < staged_count_; ++i) {
    // A staged frame is still written (from zeros once its payload would be the task's memory).
    if (staged(i).batch != nullptr && matches(staged(i).batch)) settle_batch(staged(i).batch, cause, *shared_.sink);
  }
  for (std::size_t i = 0; i < expects_.size(); ++i) {
    // Stays queued as a tombstone: the peer still answers it, and the answer is discarded.
    if (matches(expects_.at(i).batch)) settle_batch(expects_.at(i).batch, cause, *shared_.sink);
  }
  queue_.filter([&](Batch* batch) {
    if (batch->xfer_id != xfer_id) return true;
    settle_batch(batch, cause, *shared_.sink);
    unref_batch(batch);
    return false;
  });
}

void Lane::fail_all(XferCause cause) {
  close_socket();
  fail_everything(cause);
  state_ = State::kIdle;
}

// ---- connection set-up ----

void Lane::connect() {
  int fd = -1;
  const int rc = start_connect(address_, &fd);
  if (rc != 0 && rc != -EINPROGRESS) {
    connect_failed();
    return;
  }
  fd_ = fd;
  connect_started_ = Clock::now();
  state_ = State::kConnecting;
  write_interest_ = true;
  thread_.watch(fd_, this, EPOLLOUT);
  if (rc == 0) on_connected();
}

void Lane::on_connected() {
  // Nothing is sent before the server's CHALLENGE: the HELLO proof covers its nonce. The
  // connect_timeout that ran since connect() also bounds the wait for it.
  state_ = State::kHandshake;
  in_header_got_ = 0;
  in_payload_ = false;
  nonce_got_ = 0;
  write_interest_ = false;
  thread_.rewatch(fd_, this, EPOLLIN);
}

void Lane::read_challenge() {
  while (state_ == State::kHandshake) {
    ssize_t rc;
    if (in_header_got_ < in_header_.size()) {
      rc = receive_some(fd_, in_header_.data() + in_header_got_, in_header_.size() - in_header_got_);
    } else {
      rc = receive_some(fd_, nonce_.data() + nonce_got_, nonce_.size() - nonce_got_);
    }
    if (rc == -EAGAIN || rc == -EWOULDBLOCK) return;
    if (rc <= 0) {
      connect_failed();  // closed before the handshake (e.g. the server is over its cap): retry
      return;
    }
    if (in_header_got_ < in_header_.size()) {
      in_header_got_ += static_cast<std::size_t>(rc);
      if (in_header_got_ < in_header_.size()) continue;
      if (!proto::decode_frame_header(in_header_, proto::kTransferNonceBytes, &in_).is_ok() ||
          in_.opcode != proto::FrameOpcode::kChallenge || in_.length != proto::kTransferNonceBytes) {
        shared_.counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
        connect_failed();
        return;
      }
      continue;
    }
    nonce_got_ += static_cast<std::size_t>(rc);
    if (nonce_got_ < nonce_.size()) continue;
    // proof = HMAC-SHA256(peer secret, "pdr-transfer-hello-v1" 0 nonce agent)
    const std::string& agent = shared_.context.agent;
    const std::vector<std::byte> message = proto::hello_proof_message(nonce_, agent);
    std::array<std::byte, proto::kTransferProofBytes> proof{};
    static_assert(proto::kTransferProofBytes == crypto_auth_hmacsha256_BYTES);
    static_assert(proto::kTransferSecretBytes == crypto_auth_hmacsha256_KEYBYTES);
    crypto_auth_hmacsha256(reinterpret_cast<unsigned char*>(proof.data()),
                           reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                           reinterpret_cast<const unsigned char*>(secret_.data()));
    hello_ = proto::encode_hello_payload(proof, agent);
    shared_.counters->connects.fetch_add(1, std::memory_order_relaxed);
    backoff_ = kFirstBackoff;
    state_ = State::kReady;
    in_header_got_ = 0;
    in_payload_ = false;
    OutFrame& hello = stage_slot();
    hello.header = make_header(proto::FrameOpcode::kHello, 0, 0, 0, 0, hello_.size());
    hello.payload = hello_.data();
    hello.payload_left = hello_.size();
    thread_.rewatch(fd_, this, EPOLLIN | EPOLLOUT);
    write_interest_ = true;
    flush();
  }
}

void Lane::connect_failed() {
  close_socket();
  shared_.counters->connect_failures.fetch_add(1, std::memory_order_relaxed);
  const Clock::time_point now = Clock::now();
  next_attempt_ = now + backoff_;
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  state_ = State::kBackoff;
  expire_waiting(now);
}

void Lane::expire_waiting(Clock::time_point now) {
  const auto timeout = shared_.options.connect_timeout;
  queue_.filter([&](Batch* batch) {
    if (!batch->settled && now - batch->queued_at < timeout) return true;
    settle_batch(batch, XferCause::kPeerGone, *shared_.sink);
    unref_batch(batch);
    return false;
  });
}

Clock::time_point Lane::next_deadline() const {
  Clock::time_point next = Clock::time_point::max();
  const bool connecting = state_ == State::kConnecting || state_ == State::kHandshake;
  if (!connecting && state_ != State::kBackoff) return next;
  if (!queue_.empty()) next = queue_.front()->queued_at + shared_.options.connect_timeout;
  if (connecting) {
    next = std::min(next, connect_started_ + shared_.options.connect_timeout);
  } else if (!queue_.empty()) {
    next = std::min(next, next_attempt_);
  }
  return next;
}

void Lane::on_timer(Clock::time_point now) {
  const bool connecting = state_ == State::kConnecting || state_ == State::kHandshake;
  if (connecting && now - connect_started_ >= shared_.options.connect_timeout) {
    connect_failed();  // also expires waiting work
    return;
  }
  if (!connecting && state_ != State::kBackoff) return;
  expire_waiting(now);
  if (state_ == State::kBackoff && !queue_.empty() && now >= next_attempt_) connect();
}

void Lane::close_socket() {
  if (fd_ < 0) return;
  thread_.unwatch(fd_);
  ::close(fd_);
  fd_ = -1;
  write_interest_ = false;
}

void Lane::connection_lost(XferCause cause, bool count_disconnect) {
  if (count_disconnect) shared_.counters->disconnects.fetch_add(1, std::memory_order_relaxed);
  fail_all(cause);
}

void Lane::fail_everything(XferCause cause) {
  for (; staged_count_ > 0; --staged_count_) {
    OutFrame& frame = staged(0);
    if (frame.batch != nullptr) {
      settle_batch(frame.batch, cause, *shared_.sink);
      unref_batch(frame.batch);
    }
    frame = OutFrame{};
    staged_head_ = (staged_head_ + 1) % kMaxStaged;
  }
  while (!expects_.empty()) {
    Batch* batch = expects_.front().batch;
    expects_.pop_front();
    settle_batch(batch, cause, *shared_.sink);
    unref_batch(batch);
  }
  while (!queue_.empty()) {
    Batch* batch = queue_.front();
    queue_.pop_front();
    settle_batch(batch, cause, *shared_.sink);
    unref_batch(batch);
  }
  in_header_got_ = 0;
  in_payload_ = false;
  in_dst_ = nullptr;
}

void Lane::set_write_interest(bool on) {
  if (on == write_interest_ || fd_ < 0) return;
  write_interest_ = on;
  thread_.rewatch(fd_, this, EPOLLIN | (on ? EPOLLOUT : 0u));
}

void Lane::on_events(std::uint32_t events) {
  if (state_ == State::kConnecting) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
    if (finish_connect(fd_) == 0) {
      on_connected();
    } else {
      connect_failed();
    }
    return;
  }
  if (state_ == State::kHandshake) {
    if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0) read_challenge();
    return;
  }
  if (state_ != State::kReady) return;
  if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0) read_frames();
  if (state_ == State::kReady && (events & EPOLLOUT) != 0) flush();
}

// ---- sending ----

Lane::OutFrame& Lane::stage_slot() {
  OutFrame& frame = staged(staged_count_++);
  frame = OutFrame{};
  frame.active = true;
  return frame;
}

bool Lane::stage_next_frame() {
  while (!queue_.empty() && staged_count_ < kMaxStaged) {
    Batch* batch = queue_.front();
    if (batch->settled) {
      queue_.pop_front();
      unref_batch(batch);
      continue;
    }
    OutFrame& out = stage_slot();
    out.batch = batch;
    ++batch->refs;
    const std::uint32_t index = batch->next_send++;
    bool last = true;
    if (batch->kind == BatchKind::kNotify) {
      out.header = make_header(proto::FrameOpcode::kNotify, 0, batch->xfer_id, 0, 0, batch->notify.size());
      out.payload = reinterpret_cast<const std::byte*>(batch->notify.data());
      out.payload_left = batch->notify.size();
      expects_.push_back({batch, 0, 0});
      ++batch->refs;
    } else {
      const XferSegment& segment = batch->segments[index];
      last = batch->next_send == batch->segments.size();
      if (batch->kind == BatchKind::kWrite) {
        out.header = make_header(proto::FrameOpcode::kWrite, last ? kFlagAckRequested : 0,
                                  batch->xfer_id, segment.remote_region, segment.remote_offset,
                                  segment.length);
        out.payload = segment.local_addr;
        out.payload_left = segment.length;
        out.from_memory = true;
        if (last) {
          expects_.push_back({batch, index, 0});
          ++batch->refs;
        }
      } else {
        out.header = make_header(proto::FrameOpcode::kReadReq, 0, batch->xfer_id,
                                  segment.remote_region, segment.remote_offset, segment.length);
        expects_.push_back({batch, index, segment.length});
        ++batch->refs;
      }
    }
    if (last) {
      queue_.pop_front();
      unref_batch(batch);  // the queue's reference; the frame holds its own
    }
    return true;
  }
  return false;
}

void Lane::flush() {
  while (state_ == State::kReady) {
    while (stage_next_frame()) {
    }
    if (staged_count_ == 0) {
      set_write_interest(false);
      return;
    }
    iovec vectors[2 * kMaxStaged];
    int count = 0;
    for (std::size_t i = 0; i < staged_count_; ++i) {
      OutFrame& frame = staged(i);
      if (frame.header_sent < frame.header.size()) {
        vectors[count++] = {frame.header.data() + frame.header_sent, frame.header.size() - frame.header_sent};
      }
      if (frame.payload_left == 0) continue;
      // Once the batch settled (cancelled, failed elsewhere) its task may be finished: the frame is
      // completed from zeros, keeping the stream in sync without reading the task's memory.
      if (frame.from_memory && frame.batch->settled) {
        const auto chunk = std::min<std::uint64_t>(frame.payload_left, kZeroBlockBytes);
        vectors[count++] = {const_cast<std::byte*>(zero_block()), static_cast<std::size_t>(chunk)};
        if (chunk < frame.payload_left) break;  // the rest of this frame comes first, next round
      } else {
        vectors[count++] = {const_cast<std::byte*>(frame.payload), static_cast<std::size_t>(frame.payload_left)};
      }
    }
    const ssize_t rc = send_vectors(fd_, vectors, count);
    if (rc == -EAGAIN || rc == -EWOULDBLOCK) {
      set_write_interest(true);
      return;
    }
    if (rc < 0) {
      connection_lost(XferCause::kPeerGone, true);
      return;
    }
    auto sent = static_cast<std::uint64_t>(rc);
    while (sent > 0 && staged_count_ > 0) {
      OutFrame& frame = staged(0);
      const std::uint64_t header_part = std::min<std::uint64_t>(sent, frame.header.size() - frame.header_sent);
      frame.header_sent += header_part;
      sent -= header_part;
      const std::uint64_t payload_part = std::min(sent, frame.payload_left);
      frame.payload_left -= payload_part;
      if (!(frame.from_memory && frame.batch->settled)) frame.payload += payload_part;
      sent -= payload_part;
      if (frame.header_sent < frame.header.size() || frame.payload_left > 0) break;
      if (frame.batch != nullptr) unref_batch(frame.batch);
      frame = OutFrame{};
      staged_head_ = (staged_head_ + 1) % kMaxStaged;
      --staged_count_;
    }
  }
}

// ---- receiving ----

void Lane::read_frames() {
  std::uint64_t budget = kReadBudget;
  while (state_ == State::kReady && budget > 0) {
    if (!in_payload_) {
      const ssize_t rc = receive_some(fd_, in_header_.data() + in_header_got_, in_header_.size() - in_header_got_);
      if (rc == -EAGAIN || rc == -EWOULDBLOCK) return;
      if (rc <= 0) {
        connection_lost(XferCause::kPeerGone, true);
        return;
      }
      in_header_got_ += static_cast<std::size_t>(rc);
      budget -= std::min<std::uint64_t>(budget, static_cast<std::uint64_t>(rc));
      if (in_header_got_ < in_header_.size()) continue;
      in_header_got_ = 0;
      if (!proto::decode_frame_header(in_header_, shared_.options.max_frame_payload, &in_).is_ok() ||
          !on_header()) {
        protocol_error();
        return;
      }
      continue;
    }
    Batch* batch = expects_.front().batch;
    std::byte* into = batch->settled ? scratch_.data() : in_dst_;
    const std::size_t want = batch->settled ? std::min<std::uint64_t>(in_left_, scratch_.size())
                                            : static_cast<std::size_t>(in_left_);
    const ssize_t rc = receive_some(fd_, into, want);
    if (rc == -EAGAIN || rc == -EWOULDBLOCK) return;
    if (rc <= 0) {
      connection_lost(XferCause::kPeerGone, true);
      return;
    }
    const auto got = static_cast<std::uint64_t>(rc);
    in_left_ -= got;
    if (!batch->settled) in_dst_ += got;
    budget -= std::min(budget, got);
    if (in_left_ == 0) on_payload_done();
  }
}

bool Lane::on_header() {
  if (expects_.empty() || expects_.front().batch->xfer_id != in_.xfer_id) return false;
  const Expect expect = expects_.front();
  Batch* batch = expect.batch;
  switch (in_.opcode) {
    case proto::FrameOpcode::kAck:
      if (batch->kind == BatchKind::kRead) return false;
      expects_.pop_front();
      if (!batch->settled) {
        if (batch->kind == BatchKind::kWrite) {
          shared_.counters->bytes_written.fetch_add(batch->bytes, std::memory_order_relaxed);
        } else {
          shared_.counters->notifications_sent.fetch_add(1, std::memory_order_relaxed);
        }
        settle_batch(batch, XferCause::kNone, *shared_.sink);
      }
      unref_batch(batch);
      return true;
    case proto::FrameOpcode::kError: {
      expects_.pop_front();
      auto cause = static_cast<XferCause>(in_.flags & 0xffu);
      if (cause == XferCause::kNone || cause > XferCause::kInternal) cause = XferCause::kBadFrame;
      settle_batch(batch, cause, *shared_.sink);
      unref_batch(batch);
      return true;
    }
    case proto::FrameOpcode::kReadData:
      if (batch->kind != BatchKind::kRead || in_.length != expect.length) return false;
      in_dst_ = batch->settled ? nullptr : batch->segments[expect.segment].local_addr;
      in_left_ = in_.length;
      in_payload_ = true;
      if (in_left_ == 0) on_payload_done();
      return true;
    default:
      return false;
  }
}

void Lane::on_payload_done() {
  in_payload_ = false;
  const Expect expect = expects_.front();
  expects_.pop_front();
  Batch* batch = expect.batch;
  if (!batch->settled) {
    shared_.counters->bytes_read.fetch_add(expect.length, std::memory_order_relaxed);
    if (--batch->responses_left == 0) settle_batch(batch, XferCause::kNone, *shared_.sink);
  }
  unref_batch(batch);
}

void Lane::protocol_error() {
  shared_.counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
  connection_lost(XferCause::kBadFrame, false);
}

}  // namespace pdr::transfer::tcp
