// EngineKvMover end to end in one process: a prefill mover and a decode mover on loopback, moving
// real bytes over the tcp backend (READ and WRITE), a mismatch, a timeout and a bad message.
#include "node/sim_kv_mover.h"

#include <gtest/gtest.h>

#include <future>

#include <spdlog/spdlog.h>

#include "node/sim_kv_channel.h"
#include "node/sim_kv_wire.h"
#include "tests/support/time_scale.h"

namespace pdr::node::sim {
namespace {

// spdlog creates its default logger on first use. pdnode's main() does that before any thread
// exists; here the movers' threads would race to do it, which TSan reports because libspdlog is not
// instrumented (it cannot see the function-local static's guard). Create it up front, as main does.
const bool kLoggerReady = [] { return spdlog::default_logger() != nullptr; }();

using nlohmann::json;

struct Pair {
  std::unique_ptr<EngineKvMover> prefill;
  std::unique_ptr<EngineKvMover> decode;
};

// Upper bounds scale with the sanitizer slowdown (tests/support/time_scale.h); the short timeouts
// tests pass on purpose (a WRITE that never comes) stay exact.
Pair make_pair(proto::TransferMode mode,
               std::chrono::milliseconds timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
                   pdr::test::scaled(std::chrono::seconds(10)))) {
  Pair pair;
  for (proto::Role role : {proto::Role::kPrefill, proto::Role::kDecode}) {
    EngineKvMoverOptions o;
    o.node.role = role;
    o.node.connector = proto::Connector::kMoriio;
    o.node.transfer_mode = mode;
    o.node.handshake_port = 0;
    o.node.notify_port = 0;
    o.blocks = 64;
    o.block_bytes = 1024;
    o.io_threads = 4;
    o.transfer_timeout = timeout;
    o.hold = std::chrono::milliseconds(200);
    auto& slot = role == proto::Role::kPrefill ? pair.prefill : pair.decode;
    Status s = EngineKvMover::create(o, &slot);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  return pair;
}

KvBlocks request(const EngineKvMover& prefill, const std::string& key, const std::string& prompt,
                 uint32_t tokens) {
  KvBlocks b;
  b.request_id = "rid-" + key;
  b.transfer_id = key;
  b.prompt = prompt;
  b.prompt_tokens = tokens;
  b.peer_address = proto::MoriioZmqAddress{"127.0.0.1", prefill.node().handshake_port,
                                           prefill.node().notify_port}
                       .to_string();
  return b;
}

std::optional<SimError> import(EngineKvMover& decode, const KvBlocks& b, uint64_t* lease) {
  auto result = std::make_shared<std::promise<std::optional<SimError>>>();
  auto future = result->get_future();
  *lease = decode.import_decode_blocks(b, [result](std::optional<SimError> e) {
    result->set_value(std::move(e));
  });
  EXPECT_EQ(future.wait_for(pdr::test::scaled(std::chrono::seconds(20))), std::future_status::ready);
  return future.get();
}

// Polls `stats()[key]` until it equals `want` (reaping and notifications are asynchronous).
bool eventually(const EngineKvMover& m, const char* key, uint64_t want) {
  const auto deadline = std::chrono::steady_clock::now() + pdr::test::scaled(std::chrono::seconds(10));
  while (std::chrono::steady_clock::now() < deadline) {
    if (m.stats()[key].get<uint64_t>() == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(EngineKvMover, ReadMovesVerifiedBytesAndFreesBothSides) {
  Pair p = make_pair(proto::TransferMode::kRead);
  ASSERT_TRUE(p.prefill && p.decode);
  EXPECT_NE(p.prefill->node().handshake_port, 0);  // ephemeral ports are reported back
  KvBlocks b = request(*p.prefill, "tx-1", "hello world", 40);  // 3 blocks
  std::vector<int64_t> ids;
  ASSERT_FALSE(p.prefill->export_prefill_blocks(b, &ids));
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(p.prefill->stats()["kv_blocks_held"], 3);
  b.block_ids = ids;
  uint64_t lease = 0;
  auto error = import(*p.decode, b, &lease);
  ASSERT_FALSE(error) << error->message;
  EXPECT_EQ(p.decode->stats()["kv_blocks_held"], 3);
  EXPECT_EQ(p.decode->stats()["kv_bytes_moved"], 3 * 2 * 1024);
  p.decode->end_decode(lease);
  EXPECT_EQ(p.decode->stats()["kv_blocks_held"], 0);
  EXPECT_TRUE(eventually(*p.prefill, "kv_blocks_held", 0));  // the READ's notification
  EXPECT_EQ(p.prefill->stats()["kv_transfers"], 1);
}

TEST(EngineKvMover, ReadOfAnotherPromptIsAMismatch) {
  Pair p = make_pair(proto::TransferMode::kRead);
  ASSERT_TRUE(p.prefill && p.decode);
  KvBlocks b = request(*p.prefill, "tx-2", "the real prompt", 20);
  std::vector<int64_t> ids;
  ASSERT_FALSE(p.prefill->export_prefill_blocks(b, &ids));
  b.block_ids = ids;
  b.prompt = "another prompt";
  uint64_t lease = 0;
  auto error = import(*p.decode, b, &lease);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->reason, "kv_mismatch");
  EXPECT_NE(error->message.find("block 0"), std::string::npos) << error->message;
  EXPECT_EQ(p.decode->stats()["kv_mismatches"], 1);
  p.decode->end_decode(lease);
  EXPECT_EQ(p.decode->stats()["kv_blocks_held"], 0);
}

TEST(EngineKvMover, WriteWorksWhicheverSideComesFirst) {
  Pair p = make_pair(proto::TransferMode::kWrite);
  ASSERT_TRUE(p.prefill && p.decode);
  // Prefill first.
  KvBlocks first = request(*p.prefill, "tx-a", "prompt a", 33);
  std::vector<int64_t> ids;
  ASSERT_FALSE(p.prefill->export_prefill_blocks(first, &ids));
  uint64_t lease = 0;
  auto error = import(*p.decode, first, &lease);
  ASSERT_FALSE(error) << error->message;
  p.decode->end_decode(lease);
  // Decode first: its request waits on the prefill until the leg finishes.
  KvBlocks second = request(*p.prefill, "tx-b", "prompt b", 17);
  // Shared: if an assertion below returns early, the callback may still run during teardown.
  auto result = std::make_shared<std::promise<std::optional<SimError>>>();
  lease = p.decode->import_decode_blocks(
      second, [result](std::optional<SimError> e) { result->set_value(std::move(e)); });
  ASSERT_TRUE(eventually(*p.prefill, "kv_pending_requests", 1));
  ids.clear();
  ASSERT_FALSE(p.prefill->export_prefill_blocks(second, &ids));
  auto future = result->get_future();
  ASSERT_EQ(future.wait_for(pdr::test::scaled(std::chrono::seconds(20))), std::future_status::ready);
  error = future.get();
  ASSERT_FALSE(error) << error->message;
  p.decode->end_decode(lease);
  EXPECT_EQ(p.decode->stats()["kv_transfers"], 2);
  EXPECT_EQ(p.decode->stats()["kv_blocks_held"], 0);
  EXPECT_TRUE(eventually(*p.prefill, "kv_blocks_held", 0));
  EXPECT_EQ(p.prefill->stats()["kv_transfers"], 2);
}

TEST(EngineKvMover, WriteThatNeverComesTimesOutAndIsReaped) {
  Pair p = make_pair(proto::TransferMode::kWrite, std::chrono::milliseconds(200));
  ASSERT_TRUE(p.prefill && p.decode);
  uint64_t lease = 0;
  auto error = import(*p.decode, request(*p.prefill, "tx-never", "x", 5), &lease);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->reason, "kv_timeout");
  EXPECT_EQ(error->status, 504);
  p.decode->end_decode(lease);
  // Quarantined (a late WRITE could land), then reaped after --kv-hold-ms.
  EXPECT_TRUE(eventually(*p.decode, "kv_blocks_held", 0));
  EXPECT_EQ(p.decode->stats()["kv_blocks_reaped"], 1);
  // The prefill drops the unmatched write request after its hold time too.
  EXPECT_TRUE(eventually(*p.prefill, "kv_pending_requests", 0));
}

TEST(EngineKvMover, UnreachablePrefillFailsClearly) {
  Pair p = make_pair(proto::TransferMode::kRead, std::chrono::milliseconds(300));
  ASSERT_TRUE(p.decode);
  KvBlocks b = request(*p.prefill, "tx-x", "x", 5);
  b.peer_address = "host:127.0.0.1,handshake:1,notify:2";  // nothing listens there
  b.block_ids = {0};
  uint64_t lease = 0;
  auto error = import(*p.decode, b, &lease);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->reason, "kv_peer_unreachable") << error->message;
  p.decode->end_decode(lease);
  EXPECT_EQ(p.decode->stats()["kv_blocks_held"], 0);
}

TEST(EngineKvMover, SideChannelRefusesAndCountsBadMessages) {
  Pair p = make_pair(proto::TransferMode::kRead);
  ASSERT_TRUE(p.prefill);
  zmq::context_t context;
  std::string raw;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  ASSERT_FALSE(kv_channel_call(context, "127.0.0.1", p.prefill->node().handshake_port,
                               "garbage", deadline, &raw));
  KvMessage reply;
  ASSERT_FALSE(decode_kv_message(raw, &reply));
  EXPECT_EQ(reply.type, KvMessageType::kError);
  EXPECT_NE(reply.error.find("bad magic"), std::string::npos) << reply.error;
  KvMessage ack;
  ack.type = KvMessageType::kAck;  // not a request
  ASSERT_FALSE(kv_channel_call(context, "127.0.0.1", p.prefill->node().notify_port,
                               encode_kv_message(ack), deadline, &raw));
  EXPECT_EQ(p.prefill->stats()["kv_bad_messages"], 2);
  // A decode's side channel describes itself but takes no write requests.
  KvMessage write;
  write.type = KvMessageType::kWriteRequest;
  write.key = "tx";
  ASSERT_FALSE(kv_channel_call(context, "127.0.0.1", p.decode->node().handshake_port,
                               encode_kv_message(write), deadline, &raw));
  ASSERT_FALSE(decode_kv_message(raw, &reply));
  EXPECT_EQ(reply.type, KvMessageType::kError);
  EXPECT_EQ(p.decode->stats()["kv_bad_messages"], 1);
}

}  // namespace
}  // namespace pdr::node::sim
