// Engine::unregister_region() fences off the serving side. A raw TCP peer in
// the middle of a WRITE frame, or with a READ answer still queued, must not touch the region's
// memory after unregister_region() returned (the caller may free it then). Each test poisons the
// memory after the unregister and checks the peer's remaining bytes went nowhere / the poison never
// reached the peer. Before the fence (region pins, region_table.h) the rest of the WRITE landed in
// the poisoned memory and the READ answer carried the poison.
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <sodium.h>

#include "proto/transfer_descriptor.h"
#include "proto/transfer_frame.h"
#include "tests/support/time_scale.h"
#include "transfer/engine.h"
#include "transfer/tcp/frame_io.h"
#include "transfer/tcp/tcp_backend.h"

namespace pdr::transfer {
namespace {

using namespace std::chrono_literals;
using pdr::test::scaled;

constexpr std::byte kPoison{0xEE};

// An engine serving TCP on 127.0.0.1, port 0.
std::unique_ptr<Engine> make_engine(std::uint16_t* port) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_tcp_backend(TcpBackendOptions{.lanes = 1}));
  std::unique_ptr<Engine> engine;
  const Status s = Engine::create({.agent = "target"}, std::move(backends), &engine);
  EXPECT_TRUE(s) << s.to_string();
  if (!s) return nullptr;
  const std::string address = engine->started_backends().at(0);  // "tcp 127.0.0.1:40123"
  *port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  return engine;
}

// Anonymous memory the test owns and unmaps at the end.
struct Memory {
  explicit Memory(std::size_t n) : length(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    data = static_cast<std::byte*>(p);
  }
  ~Memory() { ::munmap(data, length); }
  bool all(std::byte value) const {
    for (std::size_t i = 0; i < length; ++i) {
      if (data[i] != value) return false;
    }
    return true;
  }
  std::size_t length;
  std::byte* data;
};

int connect_raw(std::uint16_t port, int rcvbuf = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const auto timeout = scaled(10s);
  timeval tv{static_cast<time_t>(timeout.count() / 1000000), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    const ssize_t rc = ::send(fd, p, n, MSG_NOSIGNAL);
    ASSERT_GT(rc, 0) << std::strerror(errno);
    p += rc;
    n -= static_cast<std::size_t>(rc);
  }
}

std::vector<std::byte> header_bytes(const proto::TransferFrameHeader& header) {
  std::vector<std::byte> bytes(proto::kTransferFrameHeaderBytes);
  proto::encode_frame_header(header, std::span<std::byte, proto::kTransferFrameHeaderBytes>(bytes.data(),
                                                                                         bytes.size()));
  return bytes;
}

// The engine's descriptor secret, as a peer that imported its descriptor holds it.
std::string engine_secret(const Engine& engine) {
  const std::string blob = engine.export_local();
  proto::TransferDescriptor descriptor;
  const Status s = proto::decode_descriptor(std::as_bytes(std::span(blob)), proto::DescriptorLimits{}, &descriptor);
  EXPECT_TRUE(s) << s.to_string();
  return descriptor.secret;
}

// Reads the server's CHALLENGE on `fd` and returns the HELLO frame that answers it with a proof
// of `secret` (the handshake every peer must pass before anything is served).
std::vector<std::byte> hello(int fd, std::string_view agent, const std::string& secret) {
  std::array<std::byte, proto::kTransferFrameHeaderBytes + proto::kTransferNonceBytes> challenge{};
  EXPECT_EQ(::recv(fd, challenge.data(), challenge.size(), MSG_WAITALL), static_cast<ssize_t>(challenge.size()));
  std::array<std::byte, proto::kTransferNonceBytes> nonce{};
  std::memcpy(nonce.data(), challenge.data() + proto::kTransferFrameHeaderBytes, nonce.size());
  const std::vector<std::byte> message = proto::hello_proof_message(nonce, agent);
  std::array<std::byte, proto::kTransferProofBytes> proof{};
  EXPECT_EQ(secret.size(), static_cast<size_t>(crypto_auth_hmacsha256_KEYBYTES));
  crypto_auth_hmacsha256(reinterpret_cast<unsigned char*>(proof.data()),
                         reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                         reinterpret_cast<const unsigned char*>(secret.data()));
  const std::vector<std::byte> payload = proto::encode_hello_payload(proof, agent);
  proto::TransferFrameHeader header;
  header.opcode = proto::FrameOpcode::kHello;
  header.length = payload.size();
  std::vector<std::byte> bytes = header_bytes(header);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

// Reads one answer header (and a READ_DATA payload into *payload, if given).
bool read_answer(int fd, proto::TransferFrameHeader* header, std::vector<std::byte>* payload = nullptr) {
  std::array<std::byte, proto::kTransferFrameHeaderBytes> bytes;
  if (::recv(fd, bytes.data(), bytes.size(), MSG_WAITALL) != static_cast<ssize_t>(bytes.size())) return false;
  if (!proto::decode_frame_header(bytes, 64u << 20, header).is_ok()) return false;
  if (header->opcode != proto::FrameOpcode::kReadData) return true;
  std::vector<std::byte> data(header->length);
  if (::recv(fd, data.data(), data.size(), MSG_WAITALL) != static_cast<ssize_t>(data.size())) return false;
  if (payload != nullptr) *payload = std::move(data);
  return true;
}

TEST(RegionFence, WriteFrameHalfReceivedWhenTheRegionIsUnregisteredLandsNowhere) {
  std::uint16_t port = 0;
  std::unique_ptr<Engine> engine = make_engine(&port);
  ASSERT_NE(engine, nullptr);
  constexpr std::size_t kLen = 32 * 1024;
  Memory memory(kLen);
  std::memset(memory.data, 0x33, kLen);
  RegionId region = kInvalidRegion;
  ASSERT_TRUE(engine->register_region(memory.data, kLen, MemKind::kHostDram, &region));

  const int fd = connect_raw(port);
  // One send: HELLO, a small READ_REQ (its answer tells us the server ran through what we sent),
  // then the WRITE header and the first half of its payload.
  std::vector<std::byte> bytes = hello(fd, "raw", engine_secret(*engine));
  proto::TransferFrameHeader read;
  read.opcode = proto::FrameOpcode::kReadReq;
  read.xfer_id = 1;
  read.region_id = region;
  read.length = 16;
  for (std::byte b : header_bytes(read)) bytes.push_back(b);
  proto::TransferFrameHeader write;
  write.opcode = proto::FrameOpcode::kWrite;
  write.flags = tcp::kFlagAckRequested;
  write.xfer_id = 2;
  write.region_id = region;
  write.length = kLen;
  for (std::byte b : header_bytes(write)) bytes.push_back(b);
  bytes.insert(bytes.end(), kLen / 2, std::byte{0x11});
  send_all(fd, bytes.data(), bytes.size());
  proto::TransferFrameHeader answer;
  ASSERT_TRUE(read_answer(fd, &answer));
  ASSERT_EQ(answer.opcode, proto::FrameOpcode::kReadData);

  ASSERT_TRUE(engine->unregister_region(region));
  std::memset(memory.data, static_cast<int>(kPoison), kLen);  // "freed": reused for something else
  const std::vector<std::byte> rest(kLen / 2, std::byte{0x22});
  send_all(fd, rest.data(), rest.size());
  ASSERT_TRUE(read_answer(fd, &answer));
  EXPECT_EQ(answer.xfer_id, 2u);
  EXPECT_EQ(answer.opcode, proto::FrameOpcode::kError);  // the WRITE is refused, not acknowledged
  EXPECT_EQ(answer.flags, static_cast<std::uint32_t>(XferCause::kAccess));
  EXPECT_TRUE(memory.all(kPoison)) << "the peer's WRITE reached memory after unregister_region()";
  EXPECT_GE(engine->counters().access_refused.load(), 1u);

  // The connection stays in sync and usable: a READ of the gone region is refused.
  read.xfer_id = 3;
  const std::vector<std::byte> again = header_bytes(read);
  send_all(fd, again.data(), again.size());
  ASSERT_TRUE(read_answer(fd, &answer));
  EXPECT_EQ(answer.xfer_id, 3u);
  EXPECT_EQ(answer.opcode, proto::FrameOpcode::kError);
  ::close(fd);
}

TEST(RegionFence, QueuedReadAnswersNeverSendFromAnUnregisteredRegion) {
  std::uint16_t port = 0;
  std::unique_ptr<Engine> engine = make_engine(&port);
  ASSERT_NE(engine, nullptr);
  // A READ far larger than the socket buffers stays half sent while the client does not read.
  constexpr std::size_t kBig = 48u << 20;
  constexpr std::size_t kSmall = 4096;
  Memory big(kBig);
  Memory small(kSmall);
  std::memset(big.data, 0x33, kBig);
  std::memset(small.data, 0x44, kSmall);
  RegionId big_id = kInvalidRegion;
  RegionId small_id = kInvalidRegion;
  ASSERT_TRUE(engine->register_region(big.data, kBig, MemKind::kHostDram, &big_id));
  ASSERT_TRUE(engine->register_region(small.data, kSmall, MemKind::kHostDram, &small_id));

  const int fd = connect_raw(port, /*rcvbuf=*/64 * 1024);
  std::vector<std::byte> bytes = hello(fd, "raw", engine_secret(*engine));
  proto::TransferFrameHeader read;
  read.opcode = proto::FrameOpcode::kReadReq;
  read.xfer_id = 1;
  read.region_id = big_id;
  read.length = kBig;
  for (std::byte b : header_bytes(read)) bytes.push_back(b);
  read.xfer_id = 2;
  read.region_id = small_id;
  read.length = kSmall;
  for (std::byte b : header_bytes(read)) bytes.push_back(b);
  send_all(fd, bytes.data(), bytes.size());
  // The big answer has started (bytes are waiting for us); it cannot have finished.
  const auto deadline = std::chrono::steady_clock::now() + scaled(10s);
  int waiting = 0;
  while ((::ioctl(fd, FIONREAD, &waiting) != 0 || waiting == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GT(waiting, 0);

  // The not-yet-started answer: its region goes away first; then the half-sent one's.
  ASSERT_TRUE(engine->unregister_region(small_id));
  std::memset(small.data, static_cast<int>(kPoison), kSmall);
  ASSERT_TRUE(engine->unregister_region(big_id));
  std::memset(big.data, static_cast<int>(kPoison), kBig);

  // Read everything the server still sends: never a poisoned byte; the half-sent answer is cut
  // short by the server closing the connection.
  std::vector<std::byte> got(1u << 20);
  std::size_t total = 0;
  bool poisoned = false;
  for (;;) {
    const ssize_t rc = ::recv(fd, got.data(), got.size(), 0);
    if (rc <= 0) break;
    for (ssize_t i = 0; i < rc; ++i) poisoned = poisoned || got[static_cast<std::size_t>(i)] == kPoison;
    total += static_cast<std::size_t>(rc);
  }
  EXPECT_FALSE(poisoned) << "a READ answer was sent from memory after unregister_region()";
  EXPECT_LT(total, proto::kTransferFrameHeaderBytes + kBig);
  EXPECT_GE(engine->counters().access_refused.load(), 1u);
  ::close(fd);
}

}  // namespace
}  // namespace pdr::transfer
