// EngineKvMover end to end in one process: a prefill mover and a decode mover on loopback, moving
// real bytes over the tcp backend (READ and WRITE), a mismatch, a timeout, a bad message, and a
// prefill that goes silent.
#include "node/sim/kv_mover.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include <spdlog/spdlog.h>

#include "node/sim/kv_channel.h"
#include "node/sim/kv_wire.h"
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

std::chrono::milliseconds scaled_ms(std::chrono::milliseconds bound) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(pdr::test::scaled(bound));
}

// Upper bounds scale with the sanitizer slowdown (tests/support/time_scale.h); tests that want a
// short KV timeout on purpose pass their own. `hold` bounds how long a prefill keeps exported
// blocks, or a decode's write request, waiting for the other side: a test that makes one side
// wait on purpose must give the test thread more than that to do the other side's step.
Pair make_pair(proto::TransferMode mode,
               std::chrono::milliseconds timeout = scaled_ms(std::chrono::seconds(10)),
               std::chrono::milliseconds hold = scaled_ms(std::chrono::milliseconds(200))) {
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
    o.hold = hold;
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
  // Each half leaves one side waiting for the test thread's next step: the prefill's exported
  // blocks for the decode's write request, then the decode's write request for the export. The
  // prefill drops either after `hold`; with the old unscaled 200 ms a loaded TSan run could stall
  // longer than that between the steps, the request was dropped, no WRITE came and the decode
  // waited its whole (scaled) KV timeout: the 60 s hang. Hold far longer than any stall here.
  Pair p = make_pair(proto::TransferMode::kWrite, scaled_ms(std::chrono::seconds(10)),
                     scaled_ms(std::chrono::seconds(30)));
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
  // Short, but scaled: the describe and write-request round trips must fit in it for the wait on
  // the prefill's WRITE to be what times out.
  Pair p = make_pair(proto::TransferMode::kWrite, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      pdr::test::scaled(std::chrono::milliseconds(300))));
  ASSERT_TRUE(p.prefill && p.decode);
  uint64_t lease = 0;
  auto error = import(*p.decode, request(*p.prefill, "tx-never", "x", 5), &lease);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->reason, "kv_timeout") << error->message;
  EXPECT_EQ(error->status, 504);
  p.decode->end_decode(lease);
  // Quarantined (a late WRITE could land), then reaped after --kv-hold-ms.
  EXPECT_TRUE(eventually(*p.decode, "kv_blocks_held", 0));
  EXPECT_TRUE(eventually(*p.decode, "kv_blocks_reaped", 1));
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

// Stands in for a prefill that dies after describing itself: describe requests are relayed to a
// real prefill's side channel, write requests are swallowed without a reply.
class SilentOnWrite {
 public:
  explicit SilentOnWrite(uint16_t prefill_port) : prefill_port_(prefill_port) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    const std::string endpoint = socket_.get(zmq::sockopt::last_endpoint);
    port_ = static_cast<uint16_t>(std::stoul(endpoint.substr(endpoint.rfind(':') + 1)));
    thread_ = std::thread([this] { run(); });
  }
  ~SilentOnWrite() {
    stop_ = true;
    thread_.join();
  }
  uint16_t port() const { return port_; }
  // Blocks until a write request arrived (or the bound passed).
  bool wait_write_request() {
    return write_seen_.get_future().wait_for(pdr::test::scaled(std::chrono::seconds(10))) ==
           std::future_status::ready;
  }

 private:
  void run() {
    while (!stop_) {
      zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames = receive_frames(socket_, 4);
      KvMessage message;
      if (frames.size() != 3 || decode_kv_message(frames[2].to_string_view(), &message)) continue;
      if (message.type == KvMessageType::kWriteRequest) {
        if (!write_signalled_.exchange(true)) write_seen_.set_value();
        continue;  // never answered
      }
      std::string reply;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      if (kv_channel_call(context_, "127.0.0.1", prefill_port_, frames[2].to_string_view(),
                          deadline, &reply)) {
        continue;
      }
      socket_.send(frames[0], zmq::send_flags::sndmore);
      socket_.send(zmq::message_t(), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(reply), zmq::send_flags::none);
    }
  }

  uint16_t prefill_port_;
  zmq::context_t context_;
  zmq::socket_t socket_{context_, zmq::socket_type::router};
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> write_signalled_{false};
  std::promise<void> write_seen_;
  std::thread thread_;
};

// A WRITE decode whose prefill never acknowledges the write request must not wait out its whole
// KV deadline (here 10 minutes) when its leg ends or its node stops: both used to hang a stopping
// sim (first seen under TSan in test_proxy_failures).
TEST(EngineKvMover, WriteRequestToASilentPrefillEndsWithTheLegOrTheNode) {
  for (const bool by_stop : {false, true}) {
    SCOPED_TRACE(by_stop ? "node stops" : "leg ends");
    Pair p = make_pair(proto::TransferMode::kWrite, std::chrono::milliseconds(600000));
    ASSERT_TRUE(p.prefill && p.decode);
    SilentOnWrite silent(p.prefill->node().handshake_port);
    KvBlocks b = request(*p.prefill, by_stop ? "tx-silent-stop" : "tx-silent-end", "x y", 2);
    b.peer_address =
        proto::MoriioZmqAddress{"127.0.0.1", silent.port(), p.prefill->node().notify_port}
            .to_string();
    auto result = std::make_shared<std::promise<std::optional<SimError>>>();
    auto future = result->get_future();
    const uint64_t lease = p.decode->import_decode_blocks(
        b, [result](std::optional<SimError> e) { result->set_value(std::move(e)); });
    ASSERT_TRUE(silent.wait_write_request());
    const auto start = std::chrono::steady_clock::now();
    if (by_stop) {
      p.decode->stop();
    } else {
      p.decode->end_decode(lease);
    }
    ASSERT_EQ(future.wait_for(pdr::test::scaled(std::chrono::seconds(2))), std::future_status::ready);
    EXPECT_LT(std::chrono::steady_clock::now() - start, pdr::test::scaled(std::chrono::seconds(2)));
    const std::optional<SimError> error = future.get();
    ASSERT_TRUE(error);
    EXPECT_EQ(error->reason, by_stop ? "kv_stopping" : "kv_abandoned") << error->message;
    if (by_stop) p.decode->end_decode(lease);
  }
}

}  // namespace
}  // namespace pdr::node::sim
