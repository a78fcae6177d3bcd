// Tenants, their limits and tickets (router/clients/tenant_registry.h) and the key check in front
// of them (router/clients/client_gate.h).
#include "router/clients/tenant_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "router/clients/client_gate.h"

namespace pdr::router::clients {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::string_view kKeyA = "sk-team-a-0123456789abcdef";
constexpr std::string_view kKeyB = "sk-team-b-0123456789abcdef";

std::shared_ptr<config::Topology> topology_with_keys(bool keys = true) {
  auto t = std::make_shared<config::Topology>();
  if (keys) {
    t->client_auth.keys_file = "clients.keys";
    EXPECT_TRUE(config::parse_client_key_file(std::string(kKeyA) + " team-a\n" + std::string(kKeyB) + " team-b\n",
                                              &t->client_auth.keys)
                    .is_ok());
  }
  return t;
}

http::Request request_with(std::vector<http::Header> headers, std::string peer = "127.0.0.1:5000") {
  http::Request r;
  r.method = "POST";
  r.path = "/v1/completions";
  r.headers = std::move(headers);
  r.peer = std::move(peer);
  return r;
}

TEST(TenantTable, KnownTenantsAndOther) {
  auto t = topology_with_keys();
  t->tenants.limits.push_back({"listed", config::Topology::TenantLimits{}});
  TenantRegistry registry;
  auto table = registry.table_for(t);
  std::vector<std::string> names;
  for (const auto& [name, state] : table->all()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"default", "listed", "other", "team-a", "team-b"}));
  EXPECT_EQ(table->resolve("team-a")->name, "team-a");
  EXPECT_EQ(table->resolve("nobody")->name, "other");
  EXPECT_EQ(table->resolve("nobody"), table->resolve("someone else"));
  EXPECT_EQ(registry.table_for(t), table);  // the same configuration: the same table
}

TEST(TenantTable, AReloadKeepsStatesOfTenantsThatRemain) {
  auto t1 = topology_with_keys();
  t1->tenants.defaults.max_in_flight = 1;
  TenantRegistry registry;
  auto a = registry.table_for(t1)->resolve("team-a");
  a->in_flight = 1;
  auto t2 = std::make_shared<config::Topology>(*t1);
  t2->tenants.defaults.max_in_flight = 5;
  config::ClientKeySet only_b;
  ASSERT_TRUE(config::parse_client_key_file(std::string(kKeyB) + " team-b\n", &only_b).is_ok());
  t2->client_auth.keys = only_b;
  auto table2 = registry.table_for(t2);
  EXPECT_EQ(table2->resolve("team-b")->max_in_flight.load(), 5u);
  EXPECT_EQ(table2->resolve("team-a")->name, "other");  // gone from the configuration
  auto t3 = std::make_shared<config::Topology>(*t1);
  EXPECT_EQ(registry.table_for(t3)->resolve("team-a")->name, "team-a");
  EXPECT_NE(registry.table_for(t3)->resolve("team-a"), a);  // a new state once it was dropped
  // A tenant kept across reloads keeps its state (its in-flight count, its buckets).
  auto t4 = std::make_shared<config::Topology>(*t3);
  auto kept = registry.table_for(t3)->resolve("team-b");
  EXPECT_EQ(registry.table_for(t4)->resolve("team-b"), kept);
}

TEST(TenantState, RequestBucket) {
  TenantState s("t");
  const auto t0 = TenantState::Clock::now();
  config::Topology::TenantLimits limits;
  limits.requests_per_second = 2;
  s.apply(limits, t0);
  double wait = 0;
  EXPECT_TRUE(s.take_request(t0, &wait));
  EXPECT_TRUE(s.take_request(t0, &wait));
  EXPECT_FALSE(s.take_request(t0, &wait));
  EXPECT_DOUBLE_EQ(wait, 0.5);
  EXPECT_TRUE(s.take_request(t0 + 500ms, &wait));
  limits.burst = 5;  // a reload with a larger burst: the bucket keeps what it holds
  s.apply(limits, t0 + 500ms);
  EXPECT_FALSE(s.take_request(t0 + 500ms, &wait));
  limits.requests_per_second = 0;  // no limit
  s.apply(limits, t0 + 500ms);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(s.take_request(t0 + 500ms, &wait));
}

TEST(TenantTicket, InFlightCapAndRelease) {
  auto s = std::make_shared<TenantState>("t");
  config::Topology::TenantLimits limits;
  limits.max_in_flight = 2;
  s->apply(limits, TenantState::Clock::now());
  TenantTicket a, b, c;
  EXPECT_TRUE(TenantTicket::acquire(s, &a));
  EXPECT_TRUE(TenantTicket::acquire(s, &b));
  EXPECT_FALSE(TenantTicket::acquire(s, &c));
  EXPECT_FALSE(c);
  EXPECT_EQ(s->in_flight.load(), 2);
  EXPECT_EQ(s->refusals[static_cast<size_t>(TenantRefusal::kInFlight)].load(), 1u);
  a.release();
  a.release();  // once
  EXPECT_EQ(s->in_flight.load(), 1);
  {
    TenantTicket moved = std::move(b);
    EXPECT_EQ(s->in_flight.load(), 1);
  }
  EXPECT_EQ(s->in_flight.load(), 0);  // given back by the destructor of the ticket it moved to
  EXPECT_TRUE(TenantTicket::acquire(nullptr, &c));  // no tenant: nothing to hold
}

TEST(TenantTicket, TokensReservedThenSettledFromUsage) {
  auto s = std::make_shared<TenantState>("t");
  config::Topology::TenantLimits limits;
  limits.tokens_per_minute = 600;  // 10 a second
  const auto t0 = TenantState::Clock::now();
  s->apply(limits, t0);
  TenantRefusal why{};
  double wait = 0;
  {
    TenantTicket ticket;
    ASSERT_TRUE(TenantTicket::acquire(s, &ticket));
    ASSERT_TRUE(ticket.reserve(500, t0, &why, &wait));
    // 100 left: a second request of 200 waits 10 s for the other 100.
    TenantTicket second;
    ASSERT_TRUE(TenantTicket::acquire(s, &second));
    EXPECT_FALSE(second.reserve(200, t0, &why, &wait));
    EXPECT_EQ(why, TenantRefusal::kTokensPerMinute);
    EXPECT_DOUBLE_EQ(wait, 10);
    // The first used 50 (prompt 20 + output 30): 450 come back.
    proto::TokenUsage usage{20, 30};
    ticket.finish(usage, true);
    EXPECT_TRUE(second.reserve(200, t0, &why, &wait));
    second.finish({}, false);  // refused before any node work: all 200 back
  }
  EXPECT_EQ(s->prompt_tokens.load(), 20u);
  EXPECT_EQ(s->output_tokens.load(), 30u);
  TenantTicket big;
  ASSERT_TRUE(TenantTicket::acquire(s, &big));
  EXPECT_TRUE(big.reserve(550, t0, &why, &wait));  // 550 of the 550 back
  // A stream without usage: the reservation stands.
  big.finish({}, true);
  TenantTicket after;
  ASSERT_TRUE(TenantTicket::acquire(s, &after));
  EXPECT_FALSE(after.reserve(100, t0, &why, &wait));
  EXPECT_FALSE(after.reserve(601, t0, &why, &wait));
  EXPECT_EQ(why, TenantRefusal::kTooLarge);
  EXPECT_EQ(s->refusals[static_cast<size_t>(TenantRefusal::kTooLarge)].load(), 1u);
}

TEST(TenantTicket, UsageAboveTheReservationIsOwed) {
  auto s = std::make_shared<TenantState>("t");
  config::Topology::TenantLimits limits;
  limits.tokens_per_minute = 600;
  const auto t0 = TenantState::Clock::now();
  s->apply(limits, t0);
  TenantRefusal why{};
  double wait = 0;
  TenantTicket ticket;
  ASSERT_TRUE(TenantTicket::acquire(s, &ticket));
  ASSERT_TRUE(ticket.reserve(100, t0, &why, &wait));
  ticket.finish(proto::TokenUsage{300, 400}, true);  // no max_tokens was sent: 700 used
  TenantTicket next;
  ASSERT_TRUE(TenantTicket::acquire(s, &next));
  EXPECT_FALSE(next.reserve(1, t0, &why, &wait));
  EXPECT_NEAR(wait, 10.1, 1e-3);  // 100 owed (600 - 700), then 1: 101 tokens at 10 a second
}

TEST(ClientGate, KeysByEitherHeaderAndTheSameAnswerForMissingAndWrong) {
  auto t = topology_with_keys();
  ClientGate gate;
  auto table = gate.tenants().table_for(t);
  ClientIdentity id;
  GateVerdict v = gate.admit(request_with({{"Authorization", "Bearer " + std::string(kKeyA)}}), *t, *table, &id);
  ASSERT_TRUE(v.ok);
  EXPECT_EQ(id.name, "team-a");
  EXPECT_EQ(id.tenant->name, "team-a");
  EXPECT_FALSE(id.forward_credential);
  v = gate.admit(request_with({{"authorization", "bearer   " + std::string(kKeyB) + " "}}), *t, *table, &id);
  ASSERT_TRUE(v.ok);
  EXPECT_EQ(id.name, "team-b");
  // An OpenAI SDK's placeholder Authorization beside the real key in x-api-key.
  v = gate.admit(request_with({{"Authorization", "Bearer EMPTY"}, {"x-api-key", std::string(kKeyA)}}), *t, *table,
                 &id);
  ASSERT_TRUE(v.ok);
  EXPECT_EQ(id.name, "team-a");

  GateVerdict missing = gate.admit(request_with({}), *t, *table, &id);
  GateVerdict wrong = gate.admit(request_with({{"Authorization", "Bearer sk-wrong-0123456789abcdef"}}), *t, *table, &id);
  GateVerdict scheme = gate.admit(request_with({{"Authorization", "Basic " + std::string(kKeyA)}}), *t, *table, &id);
  for (const GateVerdict* r : {&missing, &wrong, &scheme}) {
    EXPECT_FALSE(r->ok);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(r->message, missing.message);  // nothing tells which part failed
    EXPECT_EQ(r->code, "invalid_api_key");
    EXPECT_THAT(r->message, ::testing::Not(HasSubstr("sk-")));
  }
  EXPECT_EQ(gate.counters().missing_key.load(), 1u);
  EXPECT_EQ(gate.counters().invalid_key.load(), 2u);
}

TEST(ClientGate, WrongKeysAreThrottledButTheRightKeyPasses) {
  auto t = topology_with_keys();
  ClientGate gate;
  auto table = gate.tenants().table_for(t);
  ClientIdentity id;
  int unauthorized = 0, throttled = 0;
  for (int i = 0; i < 30; ++i) {
    GateVerdict v = gate.admit(request_with({{"x-api-key", "sk-guess-" + std::to_string(i) + "-0123456789"}}), *t,
                               *table, &id);
    (v.status == 401 ? unauthorized : throttled) += 1;
    if (v.status == 429) {
      EXPECT_EQ(v.code, "auth_throttled");
      EXPECT_EQ(v.retry_after, 1);
    }
  }
  EXPECT_EQ(unauthorized, static_cast<int>(AdminThrottle::kAddressLimits.burst));
  EXPECT_EQ(throttled, 30 - unauthorized);
  EXPECT_EQ(gate.counters().throttled.load(), static_cast<uint64_t>(throttled));
  EXPECT_TRUE(gate.admit(request_with({{"x-api-key", std::string(kKeyA)}}), *t, *table, &id).ok);
  // Another network is not throttled by this one's failures.
  EXPECT_EQ(gate.admit(request_with({{"x-api-key", "sk-guess-0123456789abc"}}, "127.0.9.1:1"), *t, *table, &id).status,
            401);
}

TEST(ClientGate, TenantHeaderWithoutKeys) {
  auto t = topology_with_keys(false);
  t->tenants.header = "x-tenant";
  t->tenants.limits.push_back({"listed", config::Topology::TenantLimits{}});
  ClientGate gate;
  auto table = gate.tenants().table_for(t);
  ClientIdentity id;
  ASSERT_TRUE(gate.admit(request_with({{"X-Tenant", "listed"}}), *t, *table, &id).ok);
  EXPECT_EQ(id.name, "listed");
  EXPECT_EQ(id.tenant->name, "listed");
  EXPECT_TRUE(id.forward_credential);
  ASSERT_TRUE(gate.admit(request_with({{"X-Tenant", "unlisted"}}), *t, *table, &id).ok);
  EXPECT_EQ(id.name, "unlisted");     // logged as sent
  EXPECT_EQ(id.tenant->name, "other");  // limited and counted as other
  ASSERT_TRUE(gate.admit(request_with({{"X-Tenant", "not a name\x01"}}), *t, *table, &id).ok);
  EXPECT_EQ(id.name, "other");
  ASSERT_TRUE(gate.admit(request_with({}), *t, *table, &id).ok);
  EXPECT_EQ(id.name, "default");
  // With keys the header names nobody.
  auto keyed = topology_with_keys();
  keyed->tenants.header = "x-tenant";
  auto keyed_table = gate.tenants().table_for(keyed);
  ASSERT_TRUE(gate.admit(request_with({{"X-Tenant", "team-b"}, {"x-api-key", std::string(kKeyA)}}), *keyed,
                         *keyed_table, &id)
                  .ok);
  EXPECT_EQ(id.name, "team-a");
}

TEST(ClientGate, RequestRateIs429WithRetryAfter) {
  auto t = topology_with_keys();
  t->tenants.limits.push_back({"team-a", config::Topology::TenantLimits{1, 1, 0, 0}});
  ClientGate gate;
  auto table = gate.tenants().table_for(t);
  ClientIdentity id;
  const http::Request r = request_with({{"x-api-key", std::string(kKeyA)}});
  EXPECT_TRUE(gate.admit(r, *t, *table, &id).ok);
  GateVerdict v = gate.admit(r, *t, *table, &id);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.status, 429);
  EXPECT_EQ(v.code, "rate_limit_exceeded");
  EXPECT_EQ(v.retry_after, 1);
  EXPECT_THAT(v.message, HasSubstr("team-a"));
  // team-b has no limit.
  EXPECT_TRUE(gate.admit(request_with({{"x-api-key", std::string(kKeyB)}}), *t, *table, &id).ok);
  EXPECT_EQ(table->resolve("team-a")->requests.load(), 1u);
  EXPECT_EQ(table->resolve("team-a")->refusals[0].load(), 1u);
}

TEST(ClientGate, BearerToken) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("  BEARER\tabc  "), "abc");
  EXPECT_EQ(bearer_token("Bearerabc"), "");
  EXPECT_EQ(bearer_token("Bearer "), "");
  EXPECT_EQ(bearer_token("Basic abc"), "");
  EXPECT_EQ(bearer_token(""), "");
}

TEST(TenantState, ConcurrentWorkersShareOneBucket) {
  auto s = std::make_shared<TenantState>("t");
  config::Topology::TenantLimits limits;
  limits.requests_per_second = 1;
  limits.burst = 1000;
  limits.max_in_flight = 1'000'000;
  s->apply(limits, TenantState::Clock::now());
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        double wait;
        if (s->take_request(TenantState::Clock::now(), &wait)) ++admitted;
        TenantTicket ticket;
        EXPECT_TRUE(TenantTicket::acquire(s, &ticket));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(admitted.load(), 1000);
  EXPECT_LE(admitted.load(), 1010);  // the burst, plus what a second (at most) refilled
  EXPECT_EQ(s->in_flight.load(), 0);
}

}  // namespace
}  // namespace pdr::router::clients
