// ControlRoutes without a server: /status caching (attacks-2026-11 bug 12) and the admin
// throttle's table (bug 17).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "discovery/discovery_counters.h"
#include "router/admin_throttle.h"
#include "router/control_routes.h"

namespace pdr::router {
namespace {

using discovery::Instance;
using discovery::RegistrySnapshot;
using namespace std::chrono_literals;

std::shared_ptr<const RegistrySnapshot> snapshot_with(uint64_t version, int instances) {
  auto s = std::make_shared<RegistrySnapshot>();
  s->version = version;
  for (int i = 0; i < instances; ++i) {
    auto inst = std::make_shared<Instance>();
    inst->key = "127.0.0." + std::to_string(i + 1) + ":8000";
    inst->http_address = proto::HostPort{"127.0.0." + std::to_string(i + 1), 8000};
    s->instances.push_back(inst);
  }
  return s;
}

struct Fixture {
  SnapshotCell<RegistrySnapshot> registry{snapshot_with(1, 3)};
  discovery::DiscoveryCounters counters;
  ControlContext context(std::chrono::milliseconds max_age) {
    ControlContext c;
    c.registry = &registry;
    c.discovery_counters = &counters;
    c.workers = 2;
    c.status_max_age = max_age;
    return c;
  }
};

TEST(StatusCache, RendersOncePerSnapshotVersion) {
  Fixture f;
  ControlRoutes routes(f.context(1h));  // no time-based refresh within the test
  const std::string first = routes.status(0).body;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(routes.status(0).body, first);
  }
  EXPECT_EQ(routes.status_renders(), 1u);
  // Each worker has its own cache (no lock between workers): one render each.
  routes.status(1);  // (its ages may differ from worker 0's by a millisecond)
  EXPECT_EQ(routes.status_renders(), 2u);

  // A new snapshot shows at once.
  f.registry.publish(snapshot_with(2, 4));
  const std::string second = routes.status(0).body;
  EXPECT_NE(second, first);
  EXPECT_NE(second.find("127.0.0.4:8000"), std::string::npos);
  EXPECT_EQ(routes.status(0).body, second);
  EXPECT_EQ(routes.status_renders(), 3u);
}

TEST(StatusCache, DynamicFieldsAreRefreshedAfterMaxAge) {
  Fixture f;
  ControlRoutes routes(f.context(0ms));  // max age 0: every request renders
  routes.status(0);
  routes.status(0);
  EXPECT_EQ(routes.status_renders(), 2u);
}

using Scope = AdminThrottle::Scope;

TEST(AdminThrottle, BurstThenRefill) {
  AdminThrottle t;
  const auto t0 = AdminThrottle::Clock::now();
  const int burst = static_cast<int>(AdminThrottle::kAddressLimits.burst);
  for (int i = 0; i < burst; ++i) {
    EXPECT_EQ(t.throttled("127.0.0.1", t0), Scope::kNone) << i;
    t.failed("127.0.0.1", t0);
  }
  EXPECT_EQ(t.throttled("127.0.0.1", t0), Scope::kAddress);
  EXPECT_EQ(t.throttled("127.0.0.2", t0), Scope::kNone);  // another address of the network
  // One token back after 1 / refill_per_second.
  const auto one_token = std::chrono::duration_cast<AdminThrottle::Clock::duration>(
      std::chrono::duration<double>(1.0 / AdminThrottle::kAddressLimits.refill_per_second));
  EXPECT_EQ(t.throttled("127.0.0.1", t0 + one_token / 2), Scope::kAddress);
  EXPECT_EQ(t.throttled("127.0.0.1", t0 + one_token), Scope::kNone);
  // A full bucket forgets the address.
  EXPECT_EQ(t.throttled("127.0.0.1", t0 + one_token * (burst + 1)), Scope::kNone);
  EXPECT_EQ(t.tracked(), 0u);
}

// Many addresses of one network share its bucket; many networks share the global one.
TEST(AdminThrottle, NetworkAndGlobalBudgets) {
  AdminThrottle t;
  const auto t0 = AdminThrottle::Clock::now();
  const int network_burst = static_cast<int>(AdminThrottle::kNetworkLimits.burst);
  for (int i = 0; i < network_burst; ++i) {
    const std::string address = "10.1.2." + std::to_string(i);
    EXPECT_EQ(t.throttled(address, t0), Scope::kNone) << i;
    t.failed(address, t0);
  }
  EXPECT_EQ(t.throttled("10.1.2.200", t0), Scope::kNetwork);
  EXPECT_EQ(t.throttled("10.1.3.1", t0), Scope::kNone);
  // IPv6: the /64 is the network.
  AdminThrottle v6;
  for (int i = 0; i < network_burst; ++i) v6.failed("2001:db8:1:2::" + std::to_string(i + 1), t0);
  EXPECT_EQ(v6.throttled("2001:db8:1:2:ffff::1", t0), Scope::kNetwork);
  EXPECT_EQ(v6.throttled("2001:db8:1:3::1", t0), Scope::kNone);
  // Every network: the global budget.
  AdminThrottle all;
  const int all_burst = static_cast<int>(AdminThrottle::kAllLimits.burst);
  for (int i = 0; i < all_burst; ++i) all.failed("127." + std::to_string(i) + ".0.1", t0);
  EXPECT_EQ(all.throttled("192.0.2.1", t0), Scope::kAll);
  const auto one_token = std::chrono::duration_cast<AdminThrottle::Clock::duration>(
      std::chrono::duration<double>(1.0 / AdminThrottle::kAllLimits.refill_per_second));
  EXPECT_EQ(all.throttled("192.0.2.1", t0 + one_token), Scope::kNone);
}

TEST(AdminThrottle, NetworkOf) {
  EXPECT_EQ(AdminThrottle::network_of("10.1.2.3"), "10.1.2.0/24");
  EXPECT_EQ(AdminThrottle::network_of("2001:db8:1:2:3::4"), "2001:db8:1:2::/64");
  EXPECT_EQ(AdminThrottle::network_of("::1"), "0:0:0:0::/64");
  EXPECT_EQ(AdminThrottle::network_of("::ffff:10.1.2.3"), "10.1.2.0/24");
  EXPECT_EQ(AdminThrottle::network_of("not-an-ip"), "not-an-ip");
}

TEST(AdminThrottle, TableIsBounded) {
  AdminThrottle t;
  const auto now = AdminThrottle::Clock::now();
  for (size_t i = 0; i < AdminThrottle::kMaxEntries + 100; ++i) {
    t.failed("127.1." + std::to_string(i / 256) + "." + std::to_string(i % 256), now);
  }
  EXPECT_EQ(t.tracked(), AdminThrottle::kMaxEntries);
  for (size_t i = 0; i < AdminThrottle::kMaxEntries + 100; ++i) {
    t.failed("10." + std::to_string(i / 256) + "." + std::to_string(i % 256) + ".1", now);
  }
  EXPECT_EQ(t.tracked_networks(), AdminThrottle::kMaxEntries);
}

TEST(AdminThrottle, AddressOfPeer) {
  EXPECT_EQ(AdminThrottle::address_of("127.0.0.1:53412"), "127.0.0.1");
  EXPECT_EQ(AdminThrottle::address_of("[::1]:53412"), "::1");
  EXPECT_EQ(AdminThrottle::address_of("::1"), "::1");
  EXPECT_EQ(AdminThrottle::address_of(""), "");
}

}  // namespace
}  // namespace pdr::router
