// Pods found by Kubernetes pod discovery: kKubernetes entries created and refreshed by
// upsert_kubernetes, never expired locally, removed by remove_kubernetes only, outranked by local
// entries, and replacing what another replica published for the same node.
#include <gtest/gtest.h>

#include "discovery/registry.h"

namespace pdr::discovery {
namespace {

using namespace std::chrono_literals;

const Clock::time_point t0 = Clock::time_point(std::chrono::hours(1000));

proto::Registration reg(std::string host, uint16_t port) {
  proto::Registration r;
  r.format = proto::RegistrationFormat::kPdrouter;
  r.schema_version = 1;
  r.role = proto::Role::kDecode;
  r.http_address = {std::move(host), port};
  r.connector = proto::Connector::kNixl;
  return r;
}

TEST(RegistryKubernetes, PodEntriesNeverExpireAndLeaveOnlyWhenRemoved) {
  Registry r{RegistryOptions{}};
  EXPECT_EQ(r.upsert_kubernetes(reg("127.0.30.1", 8000), t0).result, AdminResult::kCreated);
  r.expire_due(t0 + 1h);
  auto snap = r.snapshot(t0 + 1h);
  ASSERT_EQ(snap->instances.size(), 1u);
  EXPECT_EQ(snap->instances[0]->source, InstanceSource::kKubernetes);
  EXPECT_EQ(snap->instances[0]->state, InstanceState::kUp);
  EXPECT_EQ(to_string(InstanceSource::kKubernetes), "kubernetes");

  proto::Registration draining = reg("127.0.30.1", 8000);
  draining.draining = true;
  EXPECT_EQ(r.upsert_kubernetes(draining, t0).result, AdminResult::kOk);
  EXPECT_EQ(r.snapshot(t0)->instances[0]->state, InstanceState::kDraining);

  // Other owners' removals do not touch it.
  EXPECT_EQ(r.remove_replica("127.0.30.1:8000").result, AdminResult::kNotFound);
  EXPECT_EQ(r.remove_kubernetes("127.0.30.1:8000").result, AdminResult::kOk);
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.remove_kubernetes("127.0.30.1:8000").result, AdminResult::kNotFound);
}

TEST(RegistryKubernetes, LocalEntriesWinAndReplicaEntriesGiveWay) {
  Registry r{RegistryOptions{}};
  ASSERT_EQ(r.upsert(reg("127.0.30.2", 8000), t0).result, UpsertResult::kAdded);
  EXPECT_EQ(r.upsert_kubernetes(reg("127.0.30.2", 8000), t0).result, AdminResult::kConflict);
  EXPECT_EQ(r.snapshot(t0)->instances[0]->source, InstanceSource::kRegistered);

  ASSERT_EQ(r.upsert_replica(reg("127.0.30.3", 8000), {}, t0).result, AdminResult::kCreated);
  EXPECT_EQ(r.upsert_kubernetes(reg("127.0.30.3", 8000), t0).result, AdminResult::kCreated);
  auto snap = r.snapshot(t0);
  ASSERT_EQ(snap->instances.size(), 2u);
  EXPECT_EQ(snap->instances[1]->source, InstanceSource::kKubernetes);
  // ... and a replica's later word does not replace what this replica sees itself.
  EXPECT_EQ(r.upsert_replica(reg("127.0.30.3", 8000), {}, t0).result, AdminResult::kConflict);
}

}  // namespace
}  // namespace pdr::discovery
