// The dialect table (proto/dialects/dialect.h): complete, every line reachable, its facts
// consistent with one another.
#include "proto/dialects/dialect.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "proto/request_legs.h"

namespace pdr::proto {
namespace {

constexpr Connector kAllConnectors[] = {Connector::kMoriio, Connector::kP2pNccl, Connector::kNixl,
                                        Connector::kMooncake, Connector::kSglang, Connector::kNixlPush};
constexpr TransferMode kAllModes[] = {TransferMode::kNone, TransferMode::kRead, TransferMode::kWrite};

TEST(DialectTable, HasTheSevenDialectsOnce) {
  std::set<std::string> names;
  for (const Dialect* d : all_dialects()) {
    ASSERT_NE(d, nullptr);
    EXPECT_TRUE(names.insert(std::string(d->name)).second) << d->name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"nixl", "moriio-read", "moriio-write", "mooncake", "p2p-nccl",
                                          "sglang", "nixl-push"}));
}

TEST(DialectTable, IndexIsTheTablePosition) {
  const auto table = all_dialects();
  for (size_t i = 0; i < table.size(); ++i) EXPECT_EQ(dialect_index(table[i]), i);
  EXPECT_EQ(dialect_index(nullptr), table.size());
}

TEST(DialectTable, EveryLineIsReachableFromItsConnectorAndMode) {
  for (const Dialect* d : all_dialects()) {
    EXPECT_EQ(dialect_for(d->connector, d->transfer_mode), d) << d->name;
    EXPECT_EQ(any_dialect_of(d->connector)->connector, d->connector);
  }
}

TEST(DialectTable, EveryKnownConnectorHasADialect) {
  for (Connector c : kAllConnectors) {
    EXPECT_NE(any_dialect_of(c), nullptr) << to_string(c);
  }
  EXPECT_EQ(any_dialect_of(Connector::kUnknown), nullptr);
  for (TransferMode m : kAllModes) EXPECT_EQ(dialect_for(Connector::kUnknown, m), nullptr);
}

TEST(DialectTable, ModesMatterOnlyWhereADialectNamesOne) {
  for (Connector c : kAllConnectors) {
    const bool has_modes = pairing_mode(c, TransferMode::kRead) != TransferMode::kNone;
    for (TransferMode m : kAllModes) {
      const Dialect* d = dialect_for(c, m);
      if (!has_modes) {
        ASSERT_NE(d, nullptr) << to_string(c) << "/" << to_string(m);
        EXPECT_EQ(d, dialect_for(c, TransferMode::kNone)) << "mode ignored for " << to_string(c);
      } else if (m == TransferMode::kNone) {
        EXPECT_EQ(d, nullptr) << to_string(c) << " needs a mode";
      } else {
        ASSERT_NE(d, nullptr);
        EXPECT_EQ(d->transfer_mode, m);
      }
    }
  }
  EXPECT_EQ(dialect_for(Connector::kMoriio, TransferMode::kRead)->name, "moriio-read");
  EXPECT_EQ(dialect_for(Connector::kMoriio, TransferMode::kWrite)->name, "moriio-write");
}

TEST(DialectTable, CallbacksMatchTheFacts) {
  for (const Dialect* d : all_dialects()) {
    SCOPED_TRACE(std::string(d->name));
    EXPECT_NE(d->build, nullptr);
    // A decode completed from the prefill's answer is serial, and only such a decode has a
    // no-KV fallback.
    EXPECT_EQ(d->finish_decode != nullptr, d->decode_needs_prefill_params);
    if (d->decode_needs_prefill_params) {
      EXPECT_FALSE(d->concurrent);
    }
    if (d->without_kv != nullptr) {
      EXPECT_TRUE(d->decode_needs_prefill_params);
    }
  }
}

// The facts each dialect had before the table (REQUEST_LEGS.md, retry_rules.h).
TEST(DialectTable, FactsPerDialect) {
  struct Want {
    Connector c;
    TransferMode m;
    bool concurrent, needs_params;
    DecodeAloneRetry retry;
    PreStep pre;
    ZmqAddressForm zmq;
  };
  const Want wants[] = {
      {Connector::kNixl, TransferMode::kNone, false, true, DecodeAloneRetry::kIfNeverSent, PreStep::kNone,
       ZmqAddressForm::kNone},
      {Connector::kMoriio, TransferMode::kRead, false, true, DecodeAloneRetry::kNever, PreStep::kNone,
       ZmqAddressForm::kMoriio},
      {Connector::kMoriio, TransferMode::kWrite, true, false, DecodeAloneRetry::kNever, PreStep::kNone,
       ZmqAddressForm::kMoriio},
      {Connector::kMooncake, TransferMode::kNone, true, false, DecodeAloneRetry::kNever,
       PreStep::kPrefillEngineQuery, ZmqAddressForm::kNone},
      {Connector::kP2pNccl, TransferMode::kNone, false, false, DecodeAloneRetry::kNever, PreStep::kNone,
       ZmqAddressForm::kHostPort},
      {Connector::kSglang, TransferMode::kNone, true, false, DecodeAloneRetry::kNever, PreStep::kNone,
       ZmqAddressForm::kNone},
      {Connector::kNixlPush, TransferMode::kNone, true, false, DecodeAloneRetry::kNever, PreStep::kNone,
       ZmqAddressForm::kPrefillHostPort},
  };
  for (const Want& w : wants) {
    const Dialect* d = dialect_for(w.c, w.m);
    ASSERT_NE(d, nullptr);
    SCOPED_TRACE(std::string(d->name));
    EXPECT_EQ(d->concurrent, w.concurrent);
    EXPECT_EQ(d->decode_needs_prefill_params, w.needs_params);
    EXPECT_EQ(d->decode_alone_retry, w.retry);
    EXPECT_EQ(d->pre_step, w.pre);
    EXPECT_EQ(d->zmq_address, w.zmq);
    EXPECT_EQ(d->prefill_bootstrap_port_default, w.c == Connector::kMooncake);
    EXPECT_EQ(d->prefill_needs_engine_id, w.c == Connector::kNixlPush);
    // Multi-turn KV reuse (router/routing/multi_turn.h) was NIXL's alone.
    EXPECT_EQ(d->multi_turn_reuse, w.c == Connector::kNixl);
  }
}

// build_legs reaches every dialect of the table and records it in the plan.
TEST(DialectTable, BuildLegsUsesTheTableLine) {
  for (const Dialect* d : all_dialects()) {
    SCOPED_TRACE(std::string(d->name));
    LegInstance p, q;
    p.connector = q.connector = d->connector;
    p.transfer_mode = q.transfer_mode = d->transfer_mode;
    p.http_address = {"127.0.0.1", 8100};
    q.http_address = {"127.0.0.2", 8200};
    if (d->zmq_address == ZmqAddressForm::kMoriio) {
      p.moriio_zmq = MoriioZmqAddress{"127.0.0.1", 6301, 61005};
      q.moriio_zmq = MoriioZmqAddress{"127.0.0.2", 6401, 61105};
      p.zmq_address = p.moriio_zmq->to_string();
      q.zmq_address = q.moriio_zmq->to_string();
    } else if (d->zmq_address == ZmqAddressForm::kHostPort || d->zmq_address == ZmqAddressForm::kPrefillHostPort) {
      p.zmq_address = "127.0.0.1:21001";
      q.zmq_address = "127.0.0.2:22001";
      fill_parsed_zmq_address(&p);
      fill_parsed_zmq_address(&q);
    }
    if (d->prefill_needs_engine_id) p.engine_id = "prefill-engine-001";
    if (d->pre_step == PreStep::kPrefillEngineQuery) p.mooncake_engine_id = "engine-0";
    uint64_t n = 0;
    LegBuild b;
    const Status st = build_legs({"/v1/completions", R"({"prompt":"x","max_tokens":4})", ""}, p, q, std::nullopt,
                                 std::nullopt, LegOptions(), [&n] { return ++n; }, &b);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(b.plan.dialect, d);
    EXPECT_EQ(b.plan.concurrent, d->concurrent);
    EXPECT_EQ(b.plan.decode_needs_prefill_params, d->decode_needs_prefill_params);
    EXPECT_FALSE(b.plan.request_id.empty());
  }
}

}  // namespace
}  // namespace pdr::proto
