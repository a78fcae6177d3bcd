// EtcdClient against a real etcd (tests/support/etcd_server.h) on loopback ports: put, range,
// delete, leases (grant, keepalive, revoke, expiry), watch (events, compaction, etcd killed),
// and an unreachable endpoint.
#include "discovery/sources/etcd/etcd_client.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/etcd_server.h"
#include "tests/support/http_client.h"
#include "tests/support/time_scale.h"

namespace pdr::discovery::sources::etcd {
namespace {

using Clock = std::chrono::steady_clock;

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A missing etcd fails the test, never skips it: deploy/install-deps.sh --tests installs it.
    ASSERT_TRUE(test::EtcdServer::available())
        << "etcd-server is not installed (/usr/bin/etcd): run deploy/install-deps.sh --tests";
    const std::string why = etcd_.start();
    ASSERT_EQ(why, "");
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    client_ = make_client(etcd_.client_port());
  }
  void TearDown() override {
    if (!client_) return;
    client_.reset();
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (uv_loop_alive(&loop_) && Clock::now() < until) uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  std::unique_ptr<EtcdClient> make_client(uint16_t port, int64_t range_page_limit = 256,
                                          size_t max_answer_bytes = proto::kMaxEtcdAnswerBytes) {
    EtcdClientOptions options;
    options.endpoints.push_back({"127.0.0.1", port});
    options.timeout = std::chrono::milliseconds(1000);
    options.range_page_limit = range_page_limit;
    options.max_answer_bytes = max_answer_bytes;
    return std::make_unique<EtcdClient>(&loop_, options);
  }

  bool run_until(const std::function<bool()>& condition, std::chrono::milliseconds bound = std::chrono::seconds(10)) {
    const auto until = Clock::now() + test::scaled(bound);
    while (!condition()) {
      if (Clock::now() > until) return false;
      uv_run(&loop_, UV_RUN_NOWAIT);
      if (!condition()) uv_sleep(1);
    }
    return true;
  }

  Status put(const std::string& key, const std::string& value, int64_t lease = 0) {
    std::optional<Status> result;
    client_->put(key, value, lease, [&](const Status& st, const proto::EtcdAnswer&) { result = st; });
    if (!run_until([&] { return result.has_value(); })) return Status(StatusCode::kInternal, "no answer");
    return *result;
  }

  proto::EtcdRangeAnswer range(const std::string& prefix) {
    std::optional<proto::EtcdRangeAnswer> result;
    client_->range_prefix(prefix, [&](const Status& st, const proto::EtcdRangeAnswer& r) {
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      result = r;
    });
    EXPECT_TRUE(run_until([&] { return result.has_value(); }));
    return result.value_or(proto::EtcdRangeAnswer{});
  }

  test::EtcdServer etcd_;
  uv_loop_t loop_{};
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, PutRangeAndDeleteUnderAPrefix) {
  ASSERT_TRUE(put("pdr/a", "one").is_ok());
  ASSERT_TRUE(put("pdr/b", std::string("t\0wo", 4)).is_ok());
  ASSERT_TRUE(put("other/c", "three").is_ok());
  proto::EtcdRangeAnswer r = range("pdr/");
  ASSERT_EQ(r.kvs.size(), 2u);
  EXPECT_EQ(r.kvs[0].key, "pdr/a");
  EXPECT_EQ(r.kvs[0].value, "one");
  EXPECT_EQ(r.kvs[1].value, std::string("t\0wo", 4));
  EXPECT_GE(r.answer.revision, 4);
  std::optional<Status> deleted;
  client_->delete_key("pdr/a", [&](const Status& st, const proto::EtcdAnswer&) { deleted = st; });
  ASSERT_TRUE(run_until([&] { return deleted.has_value(); }));
  EXPECT_TRUE(deleted->is_ok());
  EXPECT_EQ(range("pdr/").kvs.size(), 1u);
  EXPECT_EQ(client_->stats().puts, 3u);
}

// A range is read in pages (etcd's limit), all at the first page's revision, and a value over
// the codec's limit is refused alone: the range still succeeds with every other key.
TEST_F(EtcdClientTest, RangesArePagedAtOneRevisionAndAnOversizedValueIsRefusedAlone) {
  for (char c = 'a'; c <= 'e'; ++c) ASSERT_TRUE(put(std::string("pdr/") + c, std::string(1, c)).is_ok());
  // 1.2 MiB: over pdrouter's 1 MiB value limit, under etcd's default 1.5 MiB request limit.
  ASSERT_TRUE(put("pdr/big", std::string(1200 * 1024, 'x')).is_ok());
  client_ = make_client(etcd_.client_port(), /*range_page_limit=*/2);
  const std::optional<proto::EtcdRangeAnswer> result = range("pdr/");
  std::vector<std::string> keys;
  for (const auto& kv : result->kvs) keys.push_back(kv.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"pdr/a", "pdr/b", "pdr/big", "pdr/c", "pdr/d", "pdr/e"}));
  EXPECT_EQ(result->kvs[2].value, "");
  EXPECT_EQ(result->kvs[2].refused, "etcd answer: value over 1048576 bytes");
  EXPECT_EQ(result->kvs[1].value, "b");
  EXPECT_FALSE(result->more);
  EXPECT_EQ(client_->stats().range_pages, 3u);
  EXPECT_EQ(client_->stats().failures, 0u);
}

// A page whose answer is over the answer cap is asked again with half the limit; a key-value too
// large for an answer alone is skipped (its key read with keys_only) and handed back refused. The
// cap is lowered to 64 KiB here so that values a default etcd accepts exercise both.
TEST_F(EtcdClientTest, APageOverTheAnswerCapIsHalvedAndALoneHugeKeyValueSkipped) {
  ASSERT_TRUE(put("pdr/a", std::string(30 * 1024, 'a')).is_ok());
  ASSERT_TRUE(put("pdr/b", std::string(30 * 1024, 'b')).is_ok());
  ASSERT_TRUE(put("pdr/c", std::string(100 * 1024, 'c')).is_ok());  // alone over the cap (base64, JSON)
  ASSERT_TRUE(put("pdr/d", "d").is_ok());
  client_ = make_client(etcd_.client_port(), /*range_page_limit=*/4, /*max_answer_bytes=*/64 * 1024);
  const proto::EtcdRangeAnswer r = range("pdr/");
  std::vector<std::string> keys;
  for (const auto& kv : r.kvs) keys.push_back(kv.key);
  ASSERT_EQ(keys, (std::vector<std::string>{"pdr/a", "pdr/b", "pdr/c", "pdr/d"}));
  EXPECT_EQ(r.kvs[0].value, std::string(30 * 1024, 'a'));
  EXPECT_EQ(r.kvs[1].value, std::string(30 * 1024, 'b'));
  EXPECT_EQ(r.kvs[2].value, "");
  EXPECT_EQ(r.kvs[2].refused, "etcd answer: key-value over 65536 bytes");
  EXPECT_EQ(r.kvs[3].value, "d");
  // 4 (a..d: too large), 2 (a, b: too large), 1 (a), 1 (b), 1 (c: too large), c keys only, then
  // 4 again from d.
  EXPECT_EQ(client_->stats().range_pages, 7u);
}

TEST_F(EtcdClientTest, LeaseGrantKeepaliveRevokeAndExpiry) {
  std::optional<proto::EtcdLeaseAnswer> granted;
  client_->lease_grant(2, [&](const Status& st, const proto::EtcdLeaseAnswer& l) {
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    granted = l;
  });
  ASSERT_TRUE(run_until([&] { return granted.has_value(); }));
  ASSERT_NE(granted->id, 0);
  EXPECT_EQ(granted->ttl, 2);
  ASSERT_TRUE(put("pdr/leased", "x", granted->id).is_ok());
  EXPECT_EQ(range("pdr/").kvs.at(0).lease, granted->id);

  std::optional<Status> kept;
  client_->lease_keepalive(granted->id, [&](const Status& st, const proto::EtcdLeaseAnswer&) { kept = st; });
  ASSERT_TRUE(run_until([&] { return kept.has_value(); }));
  EXPECT_TRUE(kept->is_ok()) << kept->to_string();

  // Not renewed: the key disappears with its lease (TTL 2 s; etcd checks leases every 500 ms).
  ASSERT_TRUE(run_until([&] { return range("pdr/").kvs.empty(); }, std::chrono::seconds(10)));
  kept.reset();
  client_->lease_keepalive(granted->id, [&](const Status& st, const proto::EtcdLeaseAnswer&) { kept = st; });
  ASSERT_TRUE(run_until([&] { return kept.has_value(); }));
  EXPECT_EQ(kept->code(), StatusCode::kNotFound) << kept->to_string();

  // Revoke deletes the lease's keys at once; revoking again is etcd's error, as kRejected.
  granted.reset();
  client_->lease_grant(60, [&](const Status&, const proto::EtcdLeaseAnswer& l) { granted = l; });
  ASSERT_TRUE(run_until([&] { return granted.has_value(); }));
  ASSERT_TRUE(put("pdr/r", "x", granted->id).is_ok());
  std::vector<Status> revoked;
  for (int i = 0; i < 2; ++i) {
    client_->lease_revoke(granted->id, [&](const Status& st, const proto::EtcdAnswer&) { revoked.push_back(st); });
    ASSERT_TRUE(run_until([&] { return revoked.size() == static_cast<size_t>(i + 1); }));
  }
  EXPECT_TRUE(revoked[0].is_ok()) << revoked[0].to_string();
  EXPECT_EQ(revoked[1].code(), StatusCode::kRejected);
  EXPECT_NE(revoked[1].message().find("lease not found"), std::string::npos) << revoked[1].message();
  EXPECT_TRUE(range("pdr/").kvs.empty());
}

TEST_F(EtcdClientTest, WatchStreamsPutsAndDeletesFromARevision) {
  ASSERT_TRUE(put("pdr/before", "0").is_ok());
  const int64_t from = range("pdr/").answer.revision + 1;
  std::vector<proto::EtcdEvent> events;
  bool created = false;
  std::optional<Status> ended;
  auto watch = client_->watch_prefix(
      "pdr/", from,
      [&](const proto::EtcdWatchAnswer& a) {
        created = created || a.created;
        for (const auto& e : a.events) events.push_back(e);
      },
      [&](const Status& st) { ended = st; });
  ASSERT_TRUE(run_until([&] { return created; }));
  ASSERT_TRUE(put("pdr/x", "1").is_ok());
  ASSERT_TRUE(put("elsewhere", "1").is_ok());
  std::optional<Status> deleted;
  client_->delete_key("pdr/x", [&](const Status& st, const proto::EtcdAnswer&) { deleted = st; });
  ASSERT_TRUE(run_until([&] { return events.size() >= 2; }));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[0].is_delete);
  EXPECT_EQ(events[0].kv.key, "pdr/x");
  EXPECT_EQ(events[0].kv.value, "1");
  EXPECT_TRUE(events[1].is_delete);
  EXPECT_EQ(events[1].kv.key, "pdr/x");
  EXPECT_FALSE(ended.has_value());
  watch->cancel();
  EXPECT_TRUE(watch->done());
}

TEST_F(EtcdClientTest, WatchFromACompactedRevisionSaysSo) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(put("pdr/k", std::to_string(i)).is_ok());
  const int64_t now = range("pdr/").answer.revision;
  // Compaction is not part of the client: ask etcd directly.
  test::HttpResponse compacted = test::http_request("127.0.0.1", etcd_.client_port(), "POST", "/v3/kv/compaction",
                                                    {}, "{\"revision\":\"" + std::to_string(now) + "\"}");
  ASSERT_EQ(compacted.status, 200) << compacted.body;
  std::optional<int64_t> compact_revision;
  auto watch = client_->watch_prefix(
      "pdr/", 1,
      [&](const proto::EtcdWatchAnswer& a) {
        if (a.canceled) compact_revision = a.compact_revision;
      },
      [](const Status&) {});
  ASSERT_TRUE(run_until([&] { return compact_revision.has_value(); }));
  EXPECT_EQ(*compact_revision, now);
  watch->cancel();
}

TEST_F(EtcdClientTest, AKilledEtcdEndsTheWatchAndFailsCallsWithIoError) {
  bool created = false;
  std::optional<Status> ended;
  auto watch = client_->watch_prefix(
      "pdr/", 0, [&](const proto::EtcdWatchAnswer& a) { created = created || a.created; },
      [&](const Status& st) { ended = st; });
  ASSERT_TRUE(run_until([&] { return created; }));
  etcd_.stop();
  ASSERT_TRUE(run_until([&] { return ended.has_value(); }));
  EXPECT_EQ(ended->code(), StatusCode::kIoError) << ended->to_string();
  Status st = put("pdr/a", "1");
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
  // Back on the same port with its data: calls work again.
  ASSERT_EQ(etcd_.start(), "");
  EXPECT_TRUE(put("pdr/a", "1").is_ok());
}

}  // namespace
}  // namespace pdr::discovery::sources::etcd
