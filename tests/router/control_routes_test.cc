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

TEST(AdminThrottle, BurstThenRefill) {
  AdminThrottle t;
  const auto t0 = AdminThrottle::Clock::now();
  const int burst = static_cast<int>(AdminThrottle::kBurst);
  for (int i = 0; i < burst; ++i) {
    EXPECT_FALSE(t.throttled("127.0.0.1", t0)) << i;
    t.failed("127.0.0.1", t0);
  }
  EXPECT_TRUE(t.throttled("127.0.0.1", t0));
  EXPECT_FALSE(t.throttled("127.0.0.2", t0));  // per address
  // One token back after 1 / kRefillPerSecond.
  const auto one_token = std::chrono::duration_cast<AdminThrottle::Clock::duration>(
      std::chrono::duration<double>(1.0 / AdminThrottle::kRefillPerSecond));
  EXPECT_TRUE(t.throttled("127.0.0.1", t0 + one_token / 2));
  EXPECT_FALSE(t.throttled("127.0.0.1", t0 + one_token));
  // A full bucket forgets the address.
  EXPECT_FALSE(t.throttled("127.0.0.1", t0 + one_token * (burst + 1)));
  EXPECT_EQ(t.tracked(), 0u);
}

TEST(AdminThrottle, TableIsBounded) {
  AdminThrottle t;
  const auto now = AdminThrottle::Clock::now();
  for (size_t i = 0; i < AdminThrottle::kMaxAddresses + 100; ++i) {
    t.failed("127.1." + std::to_string(i / 256) + "." + std::to_string(i % 256), now);
  }
  EXPECT_EQ(t.tracked(), AdminThrottle::kMaxAddresses);
}

TEST(AdminThrottle, AddressOfPeer) {
  EXPECT_EQ(AdminThrottle::address_of("127.0.0.1:53412"), "127.0.0.1");
  EXPECT_EQ(AdminThrottle::address_of("[::1]:53412"), "::1");
  EXPECT_EQ(AdminThrottle::address_of("::1"), "::1");
  EXPECT_EQ(AdminThrottle::address_of(""), "");
}

}  // namespace
}  // namespace pdr::router
