// A worker's orphaned prefill legs per node (router/proxy/orphan_legs.h).
#include "router/proxy/orphan_legs.h"

#include <gtest/gtest.h>

#include <memory>

namespace pdr::router::proxy {
namespace {

// Sessions are only ever held weakly: any object stands in for one here.
std::shared_ptr<ProxySession> fake_session() {
  return std::shared_ptr<ProxySession>(reinterpret_cast<ProxySession*>(new int(0)),
                                       [](ProxySession* p) { delete reinterpret_cast<int*>(p); });
}

TEST(OrphanLegs, PerWorkerLimitRoundsUp) {
  EXPECT_EQ(OrphanLegs::per_worker_limit(0, 4), 0u);
  EXPECT_EQ(OrphanLegs::per_worker_limit(64, 1), 64u);
  EXPECT_EQ(OrphanLegs::per_worker_limit(64, 4), 16u);
  EXPECT_EQ(OrphanLegs::per_worker_limit(10, 4), 3u);
  EXPECT_EQ(OrphanLegs::per_worker_limit(1, 8), 1u);
  EXPECT_EQ(OrphanLegs::per_worker_limit(5, 0), 5u);
}

TEST(OrphanLegs, OverTheLimitTheNodesOldestIsEvicted) {
  OrphanLegs legs;
  auto a = fake_session(), b = fake_session(), c = fake_session(), d = fake_session();
  std::weak_ptr<ProxySession> evicted;
  legs.add("p1", a, 2, &evicted);
  EXPECT_TRUE(evicted.expired());
  legs.add("p2", b, 2, &evicted);  // another node: its own list
  legs.add("p1", c, 2, &evicted);
  EXPECT_TRUE(evicted.expired());
  EXPECT_EQ(legs.size(), 3u);
  legs.add("p1", d, 2, &evicted);
  EXPECT_EQ(evicted.lock(), a);
  EXPECT_EQ(legs.size(), 3u);
}

TEST(OrphanLegs, RemoveTakesOneEntryOnce) {
  OrphanLegs legs;
  auto a = fake_session(), b = fake_session();
  std::weak_ptr<ProxySession> evicted;
  const uint64_t ia = legs.add("p1", a, 1, &evicted);
  const uint64_t ib = legs.add("p1", b, 1, &evicted);  // evicts a
  EXPECT_EQ(evicted.lock(), a);
  legs.remove("p1", ia);  // already off the list: nothing
  EXPECT_EQ(legs.size(), 1u);
  legs.remove("p1", ib);
  legs.remove("p1", ib);
  legs.remove("nowhere", 7);
  EXPECT_EQ(legs.size(), 0u);
}

}  // namespace
}  // namespace pdr::router::proxy
