// Tests of the TCP backend over real loopback sockets: two backends in one process, each with its
// own RegionTable, counters and secret; tasks built by hand the way the engine would (segments
// resolved and cut to <= 4 MiB), each finishing into a Completion. Raw-socket peers speak the
// protocol by hand, including the CHALLENGE / HELLO proof (or fail to).
#include <sodium.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <thread>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/time_scale.h"
#include "proto/transfer_frame.h"
#include "transfer/core/completion.h"
#include "transfer/tcp/serving_connection.h"
#include "transfer/tcp/tcp_backend.h"

namespace pdr::transfer::tcp_test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline void finish_into_completion(void* owner, XferTask* task, const XferResult& result) {
  delete task;
  static_cast<Completion*>(owner)->complete(result);
}

inline std::vector<std::byte> random_bytes(std::size_t size, std::uint32_t seed) {
  std::vector<std::byte> out(size);
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i + 8 <= size; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  return out;
}

inline std::string random_secret() {
  EXPECT_GE(sodium_init(), 0);
  std::string secret(proto::kTransferSecretBytes, '\0');
  randombytes_buf(secret.data(), secret.size());
  return secret;
}

struct Side {
  // `secret` empty: a fresh random one (a restarted engine reusing its descriptor passes the old).
  Side(std::string name, std::uint32_t lanes, std::size_t bytes, std::uint16_t port = 0,
       TcpBackendOptions options = {}, std::string secret_bytes = {})
      : agent(std::move(name)),
        secret(secret_bytes.empty() ? random_secret() : std::move(secret_bytes)),
        memory(bytes) {
    EXPECT_TRUE(regions.register_region(memory.data(), memory.size(), MemKind::kHostDram, &region).is_ok());
    options.lanes = lanes;
    options.port = port;
    start(options);
  }
  ~Side() { backend->stop(); }

  void start(const TcpBackendOptions& options) {
    backend = make_tcp_backend(options);
    BackendContext context;
    context.agent = agent;
    context.secret = secret;
    context.regions = &regions;
    context.counters = &counters;
    context.on_notification = [this](std::string_view from, std::string_view message) {
      std::function<void(std::string_view, std::string_view)> hook;
      {
        std::lock_guard<std::mutex> lock(mu);
        notes.emplace_back(std::string(from), std::string(message));
        hook = on_note;
      }
      if (hook) hook(from, message);
    };
    const Status status = backend->start(context);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
  }

  std::uint16_t port() const {
    const std::string address = backend->local_address();
    return static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  }

  proto::TransferDescriptor descriptor() const {
    proto::TransferDescriptor d;
    d.agent = agent;
    d.endpoints.push_back({proto::EndpointBackend::kTcp, backend->local_address()});
    d.regions.push_back({region, memory.size(), proto::RegionKind::kDram});
    d.secret = secret;
    return d;
  }

  std::vector<std::pair<std::string, std::string>> notifications() {
    std::lock_guard<std::mutex> lock(mu);
    return notes;
  }

  std::string agent;
  std::string secret;
  std::vector<std::byte> memory;
  RegionTable regions;
  RegionId region = kInvalidRegion;
  EngineCounters counters;
  std::unique_ptr<Backend> backend;
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> notes;
  void set_hook(std::function<void(std::string_view, std::string_view)> hook) {
    std::lock_guard<std::mutex> lock(mu);
    on_note = std::move(hook);
  }
  std::function<void(std::string_view, std::string_view)> on_note;  // guarded by mu
};

struct Piece {
  std::uint64_t local_offset;
  std::uint64_t remote_offset;
  std::uint64_t length;
};

// Builds a task from `local` to the peer's region; the caller owns `done`.
class TaskMaker {
 public:
  XferTask* make(XferOp op, PeerId peer, Side& local, RegionId remote_region,
                 const std::vector<Piece>& pieces, std::string_view notify, Completion* done) {
    auto* task = new XferTask(next_id_.fetch_add(1), op, peer, &finish_into_completion, done);
    std::uint64_t total = 0;
    for (const Piece& piece : pieces) {
      XferSegment segment;
      segment.local_region = local.region;
      segment.local_offset = piece.local_offset;
      segment.local_addr = local.memory.data() + piece.local_offset;
      segment.remote_region = remote_region;
      segment.remote_offset = piece.remote_offset;
      segment.length = piece.length;
      task->mutable_segments().push_back(segment);
      total += piece.length;
    }
    task->set_total_bytes(total);
    task->set_notify(notify);
    return task;
  }

  // Submits; on error deletes the task and returns the status.
  Status submit(Backend& backend, XferTask* task) {
    Status status = backend.submit(task);
    if (!status.is_ok()) delete task;
    return status;
  }

 private:
  std::atomic<std::uint64_t> next_id_{1};
};

// Contiguous pieces of at most `piece` bytes covering [offset, offset + length) on both sides.
inline std::vector<Piece> cut(std::uint64_t local_offset, std::uint64_t remote_offset, std::uint64_t length,
                              std::uint64_t piece = 4u << 20) {
  std::vector<Piece> out;
  for (std::uint64_t done = 0; done < length; done += piece) {
    out.push_back({local_offset + done, remote_offset + done, std::min(piece, length - done)});
  }
  return out;
}

// A raw listening socket on loopback that never answers (the kernel completes the handshake).
struct SilentListener {
  SilentListener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(fd, 16), 0);
    socklen_t length = sizeof address;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    port = ntohs(address.sin_port);
  }
  ~SilentListener() { ::close(fd); }
  proto::TransferDescriptor descriptor() const {
    proto::TransferDescriptor d;
    d.agent = "silent";
    d.endpoints.push_back({proto::EndpointBackend::kTcp, "127.0.0.1:" + std::to_string(port)});
    d.regions.push_back({1, 1u << 20, proto::RegionKind::kDram});
    d.secret = std::string(proto::kTransferSecretBytes, 's');
    return d;
  }
  int fd = -1;
  std::uint16_t port = 0;
};

// A blocking client socket connected to 127.0.0.1:port.
inline int connect_raw(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  timeval timeout{static_cast<time_t>(pdr::test::scaled(std::chrono::seconds(5)).count() / 1000000), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  return fd;
}

inline bool equal_bytes(const std::byte* a, const std::byte* b, std::size_t n) {
  return std::memcmp(a, b, n) == 0;
}

// (tests follow)

constexpr PeerId kPeerB = 7;

auto bound(std::chrono::milliseconds ms) { return pdr::test::scaled(ms); }

void expect_done(const XferResult& result, std::uint64_t bytes) {
  EXPECT_EQ(result.state, XferState::kDone) << xfer_cause_label(result.cause);
  EXPECT_EQ(result.bytes_done, bytes);
}

// Runs one task to completion and returns its result (kPending if it did not finish in time).
XferResult run(TaskMaker& maker, Side& a, XferOp op, Side& b, const std::vector<Piece>& pieces,
               std::string_view notify = {}, std::chrono::milliseconds limit = 10s) {
  Completion done;
  const Status status = maker.submit(*a.backend, maker.make(op, kPeerB, a, b.region, pieces, notify, &done));
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  if (!status.is_ok()) return {};
  return done.wait_for(bound(limit));
}

class TcpLanes : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(TcpLanes, WriteThenReadRandomData) {
  const std::uint32_t lanes = GetParam();
  Side a("a", lanes, 4u << 20);
  Side b("b", lanes, 4u << 20);
  ASSERT_TRUE(a.backend->can_reach(a.descriptor(), b.descriptor()));
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;

  const auto data = random_bytes(1u << 20, lanes);
  std::memcpy(a.memory.data(), data.data(), data.size());
  // Eight 128 KiB pieces, scattered on the remote side.
  std::vector<Piece> pieces;
  for (std::uint64_t i = 0; i < 8; ++i) pieces.push_back({i << 17, (7 - i) << 17, 1u << 17});
  expect_done(run(maker, a, XferOp::kWrite, b, pieces), 1u << 20);
  for (std::uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(equal_bytes(b.memory.data() + ((7 - i) << 17), data.data() + (i << 17), 1u << 17)) << i;
  }
  EXPECT_EQ(a.counters.bytes_written.load(), 1u << 20);
  EXPECT_EQ(b.counters.bytes_served.load(), 1u << 20);

  // Read it back into [2 MiB, 3 MiB) of a.
  std::vector<Piece> back;
  for (std::uint64_t i = 0; i < 8; ++i) back.push_back({(2u << 20) + (i << 17), (7 - i) << 17, 1u << 17});
  expect_done(run(maker, a, XferOp::kRead, b, back), 1u << 20);
  EXPECT_TRUE(equal_bytes(a.memory.data() + (2u << 20), data.data(), data.size()));
  EXPECT_EQ(a.counters.bytes_read.load(), 1u << 20);
  EXPECT_EQ(a.counters.connects.load(), std::min<std::uint64_t>(lanes, 8));
  EXPECT_EQ(a.counters.bad_frames.load() + b.counters.bad_frames.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(OneToFour, TcpLanes, ::testing::Values(1u, 2u, 3u, 4u));

TEST(TcpBackend, LocalAddressHasTheBoundPort) {
  Side a("a", 1, 4096);
  const std::string address = a.backend->local_address();
  EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  EXPECT_NE(a.port(), 0);
  proto::TransferDescriptor none;
  EXPECT_FALSE(a.backend->can_reach(a.descriptor(), none));
}

TEST(TcpBackend, SixtyFourMebibytesStripedOverFourLanes) {
  constexpr std::uint64_t kBytes = 64u << 20;
  Side a("a", 4, kBytes);
  Side b("b", 4, kBytes);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;
  const auto data = random_bytes(kBytes, 64);
  std::memcpy(a.memory.data(), data.data(), kBytes);
  expect_done(run(maker, a, XferOp::kWrite, b, cut(0, 0, kBytes), {}, 60s), kBytes);
  EXPECT_TRUE(equal_bytes(b.memory.data(), data.data(), kBytes));
  EXPECT_EQ(a.counters.connects.load(), 4u);  // every lane carried part of it

  std::memset(a.memory.data(), 0, kBytes);
  expect_done(run(maker, a, XferOp::kRead, b, cut(0, 0, kBytes), {}, 60s), kBytes);
  EXPECT_TRUE(equal_bytes(a.memory.data(), data.data(), kBytes));
}

TEST(TcpBackend, ManyConcurrentTasksFromSeveralThreads) {
  constexpr int kThreads = 4;
  constexpr int kTasksPerThread = 64;
  constexpr std::uint64_t kChunk = 16 * 1024;
  constexpr std::uint64_t kBytes = kThreads * kTasksPerThread * kChunk;
  Side a("a", 3, kBytes);
  Side b("b", 3, kBytes);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;
  const auto data = random_bytes(kBytes, 99);
  std::memcpy(a.memory.data(), data.data(), kBytes);

  std::vector<std::unique_ptr<Completion>> done(kThreads * kTasksPerThread);
  for (auto& d : done) d = std::make_unique<Completion>();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kTasksPerThread; ++i) {
        const int n = t * kTasksPerThread + i;
        const std::uint64_t offset = static_cast<std::uint64_t>(n) * kChunk;
        // Alternate one-piece and two-piece tasks.
        std::vector<Piece> pieces = (n % 2 == 0) ? std::vector<Piece>{{offset, offset, kChunk}}
                                                 : cut(offset, offset, kChunk, kChunk / 2);
        EXPECT_TRUE(maker.submit(*a.backend, maker.make(XferOp::kWrite, kPeerB, a, b.region, pieces, {},
                                                        done[n].get())).is_ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& d : done) expect_done(d->wait_for(bound(20s)), kChunk);
  EXPECT_TRUE(equal_bytes(b.memory.data(), data.data(), kBytes));
  EXPECT_EQ(a.counters.bytes_written.load(), kBytes);
}

TEST(TcpBackend, NotifyArrivesOnlyAfterAllTheData) {
  constexpr std::uint64_t kBytes = 24u << 20;
  Side a("sender", 4, kBytes);
  Side b("receiver", 4, kBytes);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;
  const auto data = random_bytes(kBytes, 5);
  std::memcpy(a.memory.data(), data.data(), kBytes);
  std::atomic<int> checked{0};
  b.set_hook([&](std::string_view from, std::string_view message) {
    EXPECT_EQ(from, "sender");
    EXPECT_EQ(message, "req-7 done");
    // T-10: every byte is already in place when the notification is delivered.
    EXPECT_TRUE(equal_bytes(b.memory.data(), data.data(), kBytes));
    checked.fetch_add(1);
  });
  expect_done(run(maker, a, XferOp::kWrite, b, cut(0, 0, kBytes, 1u << 20), "req-7 done", 30s), kBytes);
  EXPECT_EQ(checked.load(), 1);
  EXPECT_EQ(a.counters.notifications_sent.load(), 1u);
  EXPECT_EQ(b.counters.notifications_received.load(), 1u);

  // READ with notify: the peer hears about it after our read landed.
  b.set_hook(nullptr);
  expect_done(run(maker, a, XferOp::kRead, b, cut(0, 0, 1u << 20), "read done"), 1u << 20);
  EXPECT_EQ(b.notifications().size(), 2u);
}

TEST(TcpBackend, BareNotification) {
  Side a("a", 2, 4096);
  Side b("b", 2, 4096);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;
  const XferResult result = run(maker, a, XferOp::kWrite, b, {}, "hello there");
  expect_done(result, 0);
  const auto notes = b.notifications();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].first, "a");
  EXPECT_EQ(notes[0].second, "hello there");
}

TEST(TcpBackend, CancelReadToSilentPeerFinishesPromptly) {
  Side a("a", 1, 1u << 20);
  SilentListener silent;
  ASSERT_TRUE(a.backend->add_peer(kPeerB, silent.descriptor()).is_ok());
  TaskMaker maker;
  Completion done;
  XferTask* task = maker.make(XferOp::kRead, kPeerB, a, 1, cut(0, 0, 1u << 20), {}, &done);
  const std::uint64_t id = task->id();
  ASSERT_TRUE(maker.submit(*a.backend, task).is_ok());
  EXPECT_EQ(done.wait_for(50ms).state, XferState::kPending);  // the peer never answers
  task->request_cancel(XferCause::kCancelled);  // still ours: not finished
  const auto started = Clock::now();
  a.backend->cancel(id);
  const XferResult result = done.wait_for(bound(2s));
  EXPECT_EQ(result.state, XferState::kCancelled);
  EXPECT_EQ(result.cause, XferCause::kCancelled);
  EXPECT_LT(Clock::now() - started, bound(1s));
  a.backend->cancel(id);  // no-op for a finished task
}

TEST(TcpBackend, DeadlineCancelReportsTimeout) {
  Side a("a", 1, 1u << 20);
  SilentListener silent;
  ASSERT_TRUE(a.backend->add_peer(kPeerB, silent.descriptor()).is_ok());
  TaskMaker maker;
  Completion done;
  XferTask* task = maker.make(XferOp::kWrite, kPeerB, a, 1, cut(0, 0, 4096), {}, &done);
  const std::uint64_t id = task->id();
  ASSERT_TRUE(maker.submit(*a.backend, task).is_ok());
  task->request_cancel(XferCause::kTimeout);
  a.backend->cancel(id);
  const XferResult result = done.wait_for(bound(2s));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kTimeout);
}

TEST(TcpBackend, PeerClosingMidTransferFailsPeerGone) {
  Side a("a", 2, 8u << 20);
  SilentListener raw;
  ASSERT_TRUE(a.backend->add_peer(kPeerB, raw.descriptor()).is_ok());
  TaskMaker maker;
  Completion done;
  ASSERT_TRUE(maker.submit(*a.backend, maker.make(XferOp::kWrite, kPeerB, a, 1, cut(0, 0, 8u << 20, 1u << 20),
                                                  {}, &done)).is_ok());
  // Accept both lanes, challenge them, read a little of what they send, then drop them.
  for (int i = 0; i < 2; ++i) {
    const int fd = ::accept(raw.fd, nullptr, nullptr);
    ASSERT_GE(fd, 0);
    proto::TransferFrameHeader challenge;
    challenge.opcode = proto::FrameOpcode::kChallenge;
    challenge.length = proto::kTransferNonceBytes;
    std::array<std::byte, proto::kTransferFrameHeaderBytes + proto::kTransferNonceBytes> frame{};
    proto::encode_frame_header(challenge, std::span(frame).first<proto::kTransferFrameHeaderBytes>());
    ASSERT_EQ(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
    char buffer[4096];
    EXPECT_GT(::recv(fd, buffer, sizeof buffer, 0), 0);
    ::close(fd);
  }
  const XferResult result = done.wait_for(bound(5s));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  EXPECT_GE(a.counters.disconnects.load(), 1u);
}

TEST(TcpBackend, PeerStoppedMidTransferNeverHangs) {
  constexpr std::uint64_t kBytes = 32u << 20;
  Side a("a", 4, kBytes);
  auto b = std::make_unique<Side>("b", 4, kBytes);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b->descriptor()).is_ok());
  TaskMaker maker;
  std::vector<std::unique_ptr<Completion>> done;
  for (int i = 0; i < 8; ++i) {
    done.push_back(std::make_unique<Completion>());
    ASSERT_TRUE(maker.submit(*a.backend, maker.make(XferOp::kWrite, kPeerB, a, b->region, cut(0, 0, kBytes),
                                                    {}, done.back().get())).is_ok());
  }
  b.reset();  // stops the peer while (most of) the writes are in flight
  int failed = 0;
  for (auto& d : done) {
    const XferResult result = d->wait_for(bound(10s));
    ASSERT_TRUE(is_final(result.state));
    if (result.state != XferState::kDone) {
      EXPECT_EQ(result.cause, XferCause::kPeerGone);
      ++failed;
    }
  }
  EXPECT_GT(failed, 0);
}

TEST(TcpBackend, OutOfBoundsIsRefusedAndTheConnectionStaysUsable) {
  Side a("a", 1, 1u << 20);
  Side b("b", 1, 1u << 20);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;
  // WRITE past the end of b's region (the engine would refuse it; a buggy or hostile one may not).
  XferResult result = run(maker, a, XferOp::kWrite, b, {{0, (1u << 20) - 100, 4096}});
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kAccess);
  // READ from a region id b never registered.
  Completion done;
  ASSERT_TRUE(maker.submit(*a.backend, maker.make(XferOp::kRead, kPeerB, a, b.region + 1, {{0, 0, 4096}}, {},
                                                  &done)).is_ok());
  result = done.wait_for(bound(5s));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kAccess);
  EXPECT_EQ(b.counters.access_refused.load(), 2u);
  // A multi-piece WRITE with one bad piece: the good pieces' payload is applied, the task fails.
  result = run(maker, a, XferOp::kWrite, b, {{0, 0, 4096}, {4096, 1u << 30, 4096}, {8192, 8192, 4096}});
  EXPECT_EQ(result.cause, XferCause::kAccess);

  // Same connection, still in sync.
  const auto data = random_bytes(64 * 1024, 3);
  std::memcpy(a.memory.data(), data.data(), data.size());
  expect_done(run(maker, a, XferOp::kWrite, b, {{0, 4096, data.size()}}), data.size());
  EXPECT_TRUE(equal_bytes(b.memory.data() + 4096, data.data(), data.size()));
  EXPECT_EQ(a.counters.connects.load(), 1u);
  EXPECT_EQ(a.counters.disconnects.load() + b.counters.bad_frames.load(), 0u);
}

// Reads until the server closes the connection (recv returns 0) or the receive timeout expires.
bool closed_by_peer(int fd) {
  char buffer[256];
  for (;;) {
    const ssize_t rc = ::recv(fd, buffer, sizeof buffer, 0);
    if (rc == 0) return true;
    if (rc < 0) return errno == ECONNRESET;
  }
}

void send_all(int fd, const void* data, std::size_t size) {
  ASSERT_EQ(::send(fd, data, size, MSG_NOSIGNAL), static_cast<ssize_t>(size));
}

void send_header(int fd, const proto::TransferFrameHeader& header) {
  std::array<std::byte, proto::kTransferFrameHeaderBytes> bytes;
  proto::encode_frame_header(header, bytes);
  send_all(fd, bytes.data(), bytes.size());
}

// A frame sent right after a HELLO the server refuses: the server may have closed the
// connection already (that is the point of the test), so the send may fail with EPIPE or
// ECONNRESET; what the server does with the frame is checked by reading, not by the send.
void send_header_after_refusal(int fd, const proto::TransferFrameHeader& header) {
  std::array<std::byte, proto::kTransferFrameHeaderBytes> bytes;
  proto::encode_frame_header(header, bytes);
  const ssize_t rc = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  if (rc < 0) {
    EXPECT_TRUE(errno == EPIPE || errno == ECONNRESET) << std::strerror(errno);
  }
}

using Nonce = std::array<std::byte, proto::kTransferNonceBytes>;
using Proof = std::array<std::byte, proto::kTransferProofBytes>;

// Reads the CHALLENGE the server sends on accept and returns its nonce.
Nonce read_challenge(int fd) {
  std::array<std::byte, proto::kTransferFrameHeaderBytes + proto::kTransferNonceBytes> frame{};
  Nonce nonce{};
  const ssize_t got = ::recv(fd, frame.data(), frame.size(), MSG_WAITALL);
  EXPECT_EQ(got, static_cast<ssize_t>(frame.size())) << "no CHALLENGE from the server";
  if (got != static_cast<ssize_t>(frame.size())) return nonce;
  proto::TransferFrameHeader header;
  EXPECT_TRUE(proto::decode_frame_header(std::span(frame).first(proto::kTransferFrameHeaderBytes),
                                         proto::kTransferNonceBytes, &header).is_ok());
  EXPECT_EQ(header.opcode, proto::FrameOpcode::kChallenge);
  EXPECT_EQ(header.length, proto::kTransferNonceBytes);
  std::memcpy(nonce.data(), frame.data() + proto::kTransferFrameHeaderBytes, nonce.size());
  return nonce;
}

Proof hello_proof(const Nonce& nonce, std::string_view agent, const std::string& secret) {
  const std::vector<std::byte> message = proto::hello_proof_message(nonce, agent);
  Proof proof{};
  crypto_auth_hmacsha256(reinterpret_cast<unsigned char*>(proof.data()),
                         reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                         reinterpret_cast<const unsigned char*>(secret.data()));
  return proof;
}

void send_hello_frame(int fd, std::span<const std::byte> payload) {
  proto::TransferFrameHeader hello;
  hello.opcode = proto::FrameOpcode::kHello;
  hello.length = payload.size();
  send_header(fd, hello);
  send_all(fd, payload.data(), payload.size());
}

// The whole handshake of an honest client that holds `secret`.
void send_hello(int fd, std::string_view agent, const std::string& secret) {
  const Nonce nonce = read_challenge(fd);
  send_hello_frame(fd, proto::encode_hello_payload(hello_proof(nonce, agent, secret), agent));
}

TEST(TcpBackend, BadFramesCloseOnlyThatConnection) {
  Side a("a", 2, 1u << 20);
  Side b("b", 2, 1u << 20);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;
  expect_done(run(maker, a, XferOp::kWrite, b, cut(0, 0, 1u << 20, 256 * 1024)), 1u << 20);

  {  // Garbage instead of a header.
    const int fd = connect_raw(b.port());
    const std::string garbage(64, 'Z');
    send_all(fd, garbage.data(), garbage.size());
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // A well-formed HELLO, then a header with an unknown opcode.
    const int fd = connect_raw(b.port());
    send_hello(fd, "raw", b.secret);
    std::array<std::byte, proto::kTransferFrameHeaderBytes> bytes;
    proto::TransferFrameHeader header;
    header.opcode = proto::FrameOpcode::kWrite;
    proto::encode_frame_header(header, bytes);
    bytes[3] = std::byte{99};
    send_all(fd, bytes.data(), bytes.size());
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // A payload above max_frame_payload.
    const int fd = connect_raw(b.port());
    send_hello(fd, "raw", b.secret);
    proto::TransferFrameHeader header;
    header.opcode = proto::FrameOpcode::kWrite;
    header.region_id = b.region;
    header.length = 1ull << 40;
    send_header(fd, header);
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // No HELLO first.
    const int fd = connect_raw(b.port());
    proto::TransferFrameHeader header;
    header.opcode = proto::FrameOpcode::kReadReq;
    header.region_id = b.region;
    header.length = 16;
    send_header(fd, header);
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  EXPECT_EQ(b.counters.bad_frames.load(), 3u);
  EXPECT_EQ(b.counters.auth_failures.load(), 1u);  // the READ_REQ without a HELLO

  // The existing lanes from a were not affected.
  expect_done(run(maker, a, XferOp::kRead, b, cut(0, 0, 1u << 20, 256 * 1024)), 1u << 20);
  EXPECT_EQ(a.counters.connects.load(), 2u);
  EXPECT_EQ(a.counters.disconnects.load(), 0u);
}

TEST(TcpBackend, ServesARawClientThatSpeaksTheProtocol) {
  Side b("b", 1, 1u << 20);
  const auto data = random_bytes(4096, 11);
  std::memcpy(b.memory.data() + 100, data.data(), data.size());
  const int fd = connect_raw(b.port());
  send_hello(fd, "raw", b.secret);
  proto::TransferFrameHeader request;
  request.opcode = proto::FrameOpcode::kReadReq;
  request.xfer_id = 42;
  request.region_id = b.region;
  request.offset = 100;
  request.length = data.size();
  send_header(fd, request);
  std::vector<std::byte> answer(proto::kTransferFrameHeaderBytes + data.size());
  ASSERT_EQ(::recv(fd, answer.data(), answer.size(), MSG_WAITALL), static_cast<ssize_t>(answer.size()));
  proto::TransferFrameHeader header;
  ASSERT_TRUE(proto::decode_frame_header(std::span(answer).first(proto::kTransferFrameHeaderBytes), 1u << 20,
                                         &header).is_ok());
  EXPECT_EQ(header.opcode, proto::FrameOpcode::kReadData);
  EXPECT_EQ(header.xfer_id, 42u);
  EXPECT_EQ(header.length, data.size());
  EXPECT_TRUE(equal_bytes(answer.data() + proto::kTransferFrameHeaderBytes, data.data(), data.size()));
  ::close(fd);
}

TEST(TcpBackend, AClientThatDoesNotReadItsAnswersGetsThemAllInTheEnd) {
  // The server stops reading while many answers wait (bounded queue), and resumes as they drain.
  constexpr int kRequests = 20000;
  constexpr std::uint64_t kLength = 4096;
  Side b("b", 1, 1u << 20);
  const int fd = connect_raw(b.port());
  send_hello(fd, "raw", b.secret);  // reads the CHALLENGE: before this thread starts reading answers
  std::thread sender([&] {
    proto::TransferFrameHeader request;
    request.opcode = proto::FrameOpcode::kReadReq;
    request.region_id = b.region;
    request.length = kLength;
    for (int i = 0; i < kRequests; ++i) {
      request.xfer_id = static_cast<std::uint64_t>(i) + 1;
      send_header(fd, request);
    }
  });
  std::vector<std::byte> answer(proto::kTransferFrameHeaderBytes + kLength);
  int received = 0;
  for (; received < kRequests; ++received) {
    if (::recv(fd, answer.data(), answer.size(), MSG_WAITALL) != static_cast<ssize_t>(answer.size())) break;
    proto::TransferFrameHeader header;
    ASSERT_TRUE(proto::decode_frame_header(std::span(answer).first(proto::kTransferFrameHeaderBytes), kLength,
                                           &header).is_ok());
    ASSERT_EQ(header.xfer_id, static_cast<std::uint64_t>(received) + 1);
  }
  sender.join();
  EXPECT_EQ(received, kRequests);
  ::close(fd);
}

TEST(TcpBackend, ReconnectsAfterThePeerRestartsOnTheSamePort) {
  Side a("a", 2, 1u << 20);
  auto b = std::make_unique<Side>("b", 2, 1u << 20);
  const std::uint16_t port = b->port();
  const proto::TransferDescriptor descriptor = b->descriptor();
  ASSERT_TRUE(a.backend->add_peer(kPeerB, descriptor).is_ok());
  TaskMaker maker;
  expect_done(run(maker, a, XferOp::kWrite, *b, cut(0, 0, 1u << 20, 256 * 1024)), 1u << 20);
  b.reset();

  b = std::make_unique<Side>("b", 2, 1u << 20, port, TcpBackendOptions{}, descriptor.secret);
  ASSERT_EQ(b->descriptor(), descriptor);
  const auto data = random_bytes(1u << 20, 8);
  std::memcpy(a.memory.data(), data.data(), data.size());
  // The lanes may not have seen the old connection drop yet: a first attempt may fail kPeerGone.
  XferResult result;
  for (int attempt = 0; attempt < 5; ++attempt) {
    result = run(maker, a, XferOp::kWrite, *b, cut(0, 0, 1u << 20, 256 * 1024));
    if (result.state == XferState::kDone) break;
    EXPECT_EQ(result.cause, XferCause::kPeerGone);
  }
  expect_done(result, 1u << 20);
  EXPECT_TRUE(equal_bytes(b->memory.data(), data.data(), data.size()));
  EXPECT_GE(a.counters.connects.load(), 4u);
}

TEST(TcpBackend, WorkForAnUnreachablePeerFailsAfterConnectTimeout) {
  // A port nobody listens on: connects are refused, retried with backoff, then the work fails.
  std::uint16_t port = 0;
  {
    SilentListener probe;
    port = probe.port;
  }
  RegionTable regions;
  std::vector<std::byte> memory(4096);
  RegionId region = kInvalidRegion;
  ASSERT_TRUE(regions.register_region(memory.data(), memory.size(), MemKind::kHostDram, &region).is_ok());
  EngineCounters counters;
  TcpBackendOptions options;
  options.lanes = 1;
  options.connect_timeout = 300ms;
  auto backend = make_tcp_backend(options);
  BackendContext context;
  context.agent = "a";
  context.secret = random_secret();
  context.regions = &regions;
  context.counters = &counters;
  ASSERT_TRUE(backend->start(context).is_ok());
  proto::TransferDescriptor peer;
  peer.agent = "nobody";
  peer.endpoints.push_back({proto::EndpointBackend::kTcp, "127.0.0.1:" + std::to_string(port)});
  peer.secret = random_secret();
  ASSERT_TRUE(backend->add_peer(kPeerB, peer).is_ok());
  Completion done;
  auto* task = new XferTask(1, XferOp::kWrite, kPeerB, &finish_into_completion, &done);
  task->mutable_segments().push_back({region, 0, memory.data(), 1, 0, 4096});
  task->set_total_bytes(4096);
  ASSERT_TRUE(backend->submit(task).is_ok());
  const XferResult result = done.wait_for(bound(3s));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  EXPECT_GE(counters.connect_failures.load(), 2u);  // retried with backoff before giving up
  backend->stop();
}

TEST(TcpBackend, StopFinishesEveryInFlightTask) {
  Side a("a", 2, 1u << 20);
  SilentListener silent;
  ASSERT_TRUE(a.backend->add_peer(kPeerB, silent.descriptor()).is_ok());
  TaskMaker maker;
  std::vector<std::unique_ptr<Completion>> done;
  for (int i = 0; i < 10; ++i) {
    done.push_back(std::make_unique<Completion>());
    ASSERT_TRUE(maker.submit(*a.backend, maker.make(XferOp::kRead, kPeerB, a, 1, cut(0, 0, 4096), "n",
                                                    done.back().get())).is_ok());
  }
  a.backend->stop();
  for (auto& d : done) {
    const XferResult result = d->poll();  // stop() returned: every task is already final
    EXPECT_EQ(result.state, XferState::kFailed);
    EXPECT_EQ(result.cause, XferCause::kPeerGone);
  }
  Completion late;
  XferTask* task = maker.make(XferOp::kRead, kPeerB, a, 1, cut(0, 0, 4096), {}, &late);
  EXPECT_FALSE(maker.submit(*a.backend, task).is_ok());
}

TEST(TcpBackend, RemovePeerFailsItsTasks) {
  Side a("a", 1, 1u << 20);
  SilentListener silent;
  ASSERT_TRUE(a.backend->add_peer(kPeerB, silent.descriptor()).is_ok());
  TaskMaker maker;
  Completion done;
  ASSERT_TRUE(maker.submit(*a.backend, maker.make(XferOp::kRead, kPeerB, a, 1, cut(0, 0, 4096), {}, &done)).is_ok());
  a.backend->remove_peer(kPeerB);
  const XferResult result = done.wait_for(bound(2s));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  Completion other;
  EXPECT_EQ(maker.submit(*a.backend, maker.make(XferOp::kRead, kPeerB, a, 1, cut(0, 0, 4096), {}, &other)).code(),
            StatusCode::kNotFound);
}

// ---- authentication and serving limits: unauthenticated peers, connection floods ----

// Everything the server sends until it closes the connection (or the receive timeout expires:
// then *closed is false).
std::vector<std::byte> read_until_close(int fd, bool* closed) {
  std::vector<std::byte> out;
  std::byte buffer[4096];
  for (;;) {
    const ssize_t rc = ::recv(fd, buffer, sizeof buffer, 0);
    if (rc > 0) {
      out.insert(out.end(), buffer, buffer + rc);
      continue;
    }
    *closed = rc == 0 || errno == ECONNRESET;
    return out;
  }
}

// True when `bytes` is nothing, or exactly the CHALLENGE frame: the server answered no request.
bool only_a_challenge(const std::vector<std::byte>& bytes) {
  if (bytes.empty()) return true;
  if (bytes.size() != proto::kTransferFrameHeaderBytes + proto::kTransferNonceBytes) return false;
  proto::TransferFrameHeader header;
  return proto::decode_frame_header(std::span(bytes).first(proto::kTransferFrameHeaderBytes),
                                    proto::kTransferNonceBytes, &header)
             .is_ok() &&
         header.opcode == proto::FrameOpcode::kChallenge;
}

proto::TransferFrameHeader read_request(std::uint32_t region, std::uint64_t length) {
  proto::TransferFrameHeader request;
  request.opcode = proto::FrameOpcode::kReadReq;
  request.xfer_id = 42;
  request.region_id = region;
  request.length = length;
  return request;
}

// Polls `counter` until it reaches `value` or the (scaled) limit passes.
bool wait_counter(const std::atomic<std::uint64_t>& counter, std::uint64_t value,
                  std::chrono::milliseconds limit = 5s) {
  const auto deadline = Clock::now() + bound(limit);
  while (counter.load() < value && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  return counter.load() >= value;
}

TEST(TcpAuth, HelloWithoutProofThenReadGetsNothingButAClose) {
  // The reproduction: HELLO "attacker" (a bare name, the old format), then READ_REQ of
  // the first region. Before authentication existed this answered READ_DATA with the region's bytes.
  Side b("b", 1, 1u << 20);
  std::memset(b.memory.data(), 0x5a, 4096);
  const int fd = connect_raw(b.port());
  const std::string agent = "attacker";
  send_hello_frame(fd, std::as_bytes(std::span(agent.data(), agent.size())));
  send_header_after_refusal(fd, read_request(b.region, 4096));
  bool closed = false;
  const std::vector<std::byte> got = read_until_close(fd, &closed);
  ::close(fd);
  EXPECT_TRUE(closed);
  EXPECT_TRUE(only_a_challenge(got)) << got.size() << " bytes came back";
  EXPECT_TRUE(wait_counter(b.counters.auth_failures, 1));
  EXPECT_EQ(b.counters.bytes_served.load(), 0u);
  EXPECT_EQ(b.counters.bad_frames.load(), 0u);
}

TEST(TcpAuth, WrongProofThenReadOrWriteGetsNothingButAClose) {
  Side b("b", 1, 1u << 20);
  const std::string wrong = random_secret();
  {  // A proof made with another key.
    const int fd = connect_raw(b.port());
    const Nonce nonce = read_challenge(fd);
    send_hello_frame(fd, proto::encode_hello_payload(hello_proof(nonce, "mallory", wrong), "mallory"));
    send_header_after_refusal(fd, read_request(b.region, 4096));
    bool closed = false;
    const std::vector<std::byte> got = read_until_close(fd, &closed);
    ::close(fd);
    EXPECT_TRUE(closed);
    EXPECT_TRUE(got.empty()) << got.size() << " bytes came back after the HELLO";
  }
  {  // The right key, but a proof for another nonce (a replayed HELLO).
    const int fd = connect_raw(b.port());
    Nonce other = read_challenge(fd);
    other[0] ^= std::byte{1};
    send_hello_frame(fd, proto::encode_hello_payload(hello_proof(other, "mallory", b.secret), "mallory"));
    send_header_after_refusal(fd, read_request(b.region, 4096));
    bool closed = false;
    EXPECT_TRUE(read_until_close(fd, &closed).empty());
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  {  // The right proof for one name, presented under another.
    const int fd = connect_raw(b.port());
    const Nonce nonce = read_challenge(fd);
    send_hello_frame(fd, proto::encode_hello_payload(hello_proof(nonce, "decode-0", b.secret), "mallory"));
    bool closed = false;
    EXPECT_TRUE(read_until_close(fd, &closed).empty());
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  {  // A WRITE right after a wrong proof changes nothing.
    const int fd = connect_raw(b.port());
    const Nonce nonce = read_challenge(fd);
    send_hello_frame(fd, proto::encode_hello_payload(hello_proof(nonce, "mallory", wrong), "mallory"));
    proto::TransferFrameHeader write;
    write.opcode = proto::FrameOpcode::kWrite;
    write.flags = 1;  // ACK requested
    write.xfer_id = 5;
    write.region_id = b.region;
    write.length = 4096;
    send_header_after_refusal(fd, write);
    const std::vector<std::byte> payload(4096, std::byte{0x77});
    (void)::send(fd, payload.data(), payload.size(), MSG_NOSIGNAL);  // may fail: already closed
    bool closed = false;
    EXPECT_TRUE(read_until_close(fd, &closed).empty());
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  EXPECT_TRUE(wait_counter(b.counters.auth_failures, 4));
  EXPECT_EQ(b.counters.auth_failures.load(), 4u);
  EXPECT_EQ(b.counters.bytes_served.load(), 0u);
  for (std::size_t i = 0; i < 4096; ++i) ASSERT_EQ(b.memory[i], std::byte{0}) << i;

  // The same server still serves an honest client.
  const int fd = connect_raw(b.port());
  send_hello(fd, "honest", b.secret);
  send_header(fd, read_request(b.region, 16));
  std::array<std::byte, proto::kTransferFrameHeaderBytes + 16> answer{};
  ASSERT_EQ(::recv(fd, answer.data(), answer.size(), MSG_WAITALL), static_cast<ssize_t>(answer.size()));
  proto::TransferFrameHeader header;
  ASSERT_TRUE(proto::decode_frame_header(std::span(answer).first(proto::kTransferFrameHeaderBytes), 16,
                                         &header).is_ok());
  EXPECT_EQ(header.opcode, proto::FrameOpcode::kReadData);
  ::close(fd);
}

TEST(TcpAuth, PeerWithAForgedDescriptorIsRefused) {
  Side a("a", 2, 1u << 20);
  Side b("b", 2, 1u << 20);
  std::memset(a.memory.data(), 0x33, 1u << 20);
  proto::TransferDescriptor forged = b.descriptor();
  forged.secret = random_secret();  // right address and regions, wrong secret
  ASSERT_TRUE(a.backend->add_peer(kPeerB, forged).is_ok());
  TaskMaker maker;
  XferResult result = run(maker, a, XferOp::kWrite, b, cut(0, 0, 64 * 1024));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  result = run(maker, a, XferOp::kRead, b, cut(0, 0, 64 * 1024));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  EXPECT_GE(b.counters.auth_failures.load(), 2u);
  EXPECT_EQ(b.counters.bytes_served.load(), 0u);
  for (std::size_t i = 0; i < 64 * 1024; ++i) ASSERT_EQ(b.memory[i], std::byte{0}) << i;

  // A descriptor with no secret at all is refused up front.
  proto::TransferDescriptor bare = b.descriptor();
  bare.secret.clear();
  EXPECT_EQ(a.backend->add_peer(kPeerB + 1, bare).code(), StatusCode::kRejected);

  // The genuine descriptor works.
  a.backend->remove_peer(kPeerB);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  expect_done(run(maker, a, XferOp::kWrite, b, cut(0, 0, 64 * 1024)), 64 * 1024);
  EXPECT_EQ(b.memory[0], std::byte{0x33});
}

TEST(TcpAuth, BackendWithoutASecretDoesNotStart) {
  RegionTable regions;
  EngineCounters counters;
  auto backend = make_tcp_backend({});
  BackendContext context;
  context.agent = "a";
  context.regions = &regions;
  context.counters = &counters;
  EXPECT_EQ(backend->start(context).code(), StatusCode::kInvalidValue);
  context.secret = "short";
  EXPECT_EQ(backend->start(context).code(), StatusCode::kInvalidValue);
}

TEST(TcpAuth, SilentConnectionIsClosedAfterTheHelloDeadline) {
  TcpBackendOptions options;
  options.hello_timeout = 300ms;
  Side b("b", 1, 4096, 0, options);
  const auto started = Clock::now();
  const int fd = connect_raw(b.port());  // receive timeout 5 s (scaled)
  (void)read_challenge(fd);
  bool closed = false;
  EXPECT_TRUE(read_until_close(fd, &closed).empty());
  ::close(fd);
  EXPECT_TRUE(closed);
  EXPECT_GE(Clock::now() - started, 300ms);  // not before the deadline (lower bounds stay exact)
  EXPECT_EQ(b.counters.hello_timeouts.load(), 1u);
  EXPECT_EQ(b.counters.auth_failures.load(), 0u);

  // A connection that sends half a HELLO and stalls is closed the same way.
  const int slow = connect_raw(b.port());
  (void)read_challenge(slow);
  proto::TransferFrameHeader hello;
  hello.opcode = proto::FrameOpcode::kHello;
  hello.length = proto::kTransferProofBytes + 4;
  send_header(slow, hello);
  EXPECT_TRUE(read_until_close(slow, &closed).empty());
  EXPECT_TRUE(closed);
  ::close(slow);
  EXPECT_EQ(b.counters.hello_timeouts.load(), 2u);
}

TEST(TcpAuth, AuthenticatedConnectionOutlivesTheHelloDeadline) {
  TcpBackendOptions options;
  options.hello_timeout = 200ms;
  Side a("a", 1, 1u << 20);
  Side b("b", 1, 1u << 20, 0, options);
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;
  expect_done(run(maker, a, XferOp::kWrite, b, cut(0, 0, 4096)), 4096);
  std::this_thread::sleep_for(400ms);  // the quantity under test: time past the deadline
  expect_done(run(maker, a, XferOp::kRead, b, cut(0, 0, 4096)), 4096);
  EXPECT_EQ(a.counters.connects.load(), 1u);
  EXPECT_EQ(b.counters.hello_timeouts.load(), 0u);
}

TEST(TcpAuth, ConnectionsOverTheCapAreClosedAtOnce) {
  TcpBackendOptions options;
  options.max_connections = 4;
  Side b("b", 1, 4096, 0, options);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(connect_raw(b.port()));
    (void)read_challenge(held.back());  // adopted and counted
  }
  const int over = connect_raw(b.port());
  bool closed = false;
  EXPECT_TRUE(read_until_close(over, &closed).empty());  // no CHALLENGE: closed at accept
  EXPECT_TRUE(closed);
  ::close(over);
  EXPECT_EQ(b.counters.connections_refused.load(), 1u);

  // Closing one makes room again (the server notices the close asynchronously: poll).
  ::close(held.back());
  held.pop_back();
  bool served = false;
  const auto deadline = Clock::now() + bound(5s);
  while (!served && Clock::now() < deadline) {
    const int fd = connect_raw(b.port());
    std::array<std::byte, proto::kTransferFrameHeaderBytes> header{};
    served = ::recv(fd, header.data(), header.size(), MSG_WAITALL) == static_cast<ssize_t>(header.size());
    if (served) held.push_back(fd); else ::close(fd);
    if (!served) std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(served);
  for (int fd : held) ::close(fd);
}

TEST(TcpAuth, NoDrainBufferBeforeAuthentication) {
  Side b("b", 1, 1u << 20);
  const std::uint64_t before = tcp::ServingConnection::scratch_allocations();
  std::vector<int> idle;
  for (int i = 0; i < 32; ++i) {
    idle.push_back(connect_raw(b.port()));
    (void)read_challenge(idle.back());
  }
  {  // An unauthenticated refused WRITE does not allocate it either: it closes the connection.
    const int fd = connect_raw(b.port());
    proto::TransferFrameHeader write;
    write.opcode = proto::FrameOpcode::kWrite;
    write.region_id = b.region + 1;
    write.length = 1u << 20;
    send_header(fd, write);
    bool closed = false;
    (void)read_until_close(fd, &closed);
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  EXPECT_EQ(tcp::ServingConnection::scratch_allocations(), before);

  // After authentication, a refused WRITE is drained: that is when the buffer appears.
  const int fd = connect_raw(b.port());
  send_hello(fd, "raw", b.secret);
  proto::TransferFrameHeader write;
  write.opcode = proto::FrameOpcode::kWrite;
  write.flags = 1;  // ACK requested
  write.xfer_id = 9;
  write.region_id = b.region + 1;  // never registered
  write.length = 4096;
  send_header(fd, write);
  const std::vector<std::byte> payload(4096, std::byte{1});
  send_all(fd, payload.data(), payload.size());
  std::array<std::byte, proto::kTransferFrameHeaderBytes> answer{};
  ASSERT_EQ(::recv(fd, answer.data(), answer.size(), MSG_WAITALL), static_cast<ssize_t>(answer.size()));
  proto::TransferFrameHeader header;
  ASSERT_TRUE(proto::decode_frame_header(answer, 0, &header).is_ok());
  EXPECT_EQ(header.opcode, proto::FrameOpcode::kError);
  EXPECT_EQ(tcp::ServingConnection::scratch_allocations(), before + 1);
  ::close(fd);
  for (int idle_fd : idle) ::close(idle_fd);
}

TEST(TcpAuth, DeviceRegionsAreRefused) {
  Side a("a", 1, 1u << 20);
  Side b("b", 1, 1u << 20);
  // Host memory registered as a device region: were it served, the bytes would really move.
  std::vector<std::byte> device(8192, std::byte{0x44});
  RegionId device_region = kInvalidRegion;
  ASSERT_TRUE(b.regions.register_region(device.data(), device.size(), MemKind::kDevice, &device_region).is_ok());
  ASSERT_TRUE(a.backend->add_peer(kPeerB, b.descriptor()).is_ok());
  TaskMaker maker;
  Completion read_done;
  ASSERT_TRUE(maker.submit(*a.backend, maker.make(XferOp::kRead, kPeerB, a, device_region, {{0, 0, 4096}},
                                                  {}, &read_done)).is_ok());
  XferResult result = read_done.wait_for(bound(5s));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kAccess);
  Completion write_done;
  ASSERT_TRUE(maker.submit(*a.backend, maker.make(XferOp::kWrite, kPeerB, a, device_region, {{0, 0, 4096}},
                                                  {}, &write_done)).is_ok());
  result = write_done.wait_for(bound(5s));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kAccess);
  EXPECT_EQ(b.counters.access_refused.load(), 2u);
  EXPECT_EQ(b.counters.bytes_served.load(), 0u);
  for (std::byte value : device) ASSERT_EQ(value, std::byte{0x44});
  EXPECT_EQ(a.counters.bytes_read.load(), 0u);
  // The lane stays usable for host regions.
  expect_done(run(maker, a, XferOp::kRead, b, cut(0, 0, 4096)), 4096);
  EXPECT_EQ(a.counters.connects.load(), 1u);
}

}  // namespace
}  // namespace pdr::transfer::tcp_test
