// The RDMA backend on real hardware through the dlopen'd libibverbs (transfer/rdma/verbs_loader.cc).
// Hosts without a device (CI, this build machine) skip with the reason, except for the check that
// start() then reports "rdma unavailable: ..." so the engine can leave the backend out.
#include <gtest/gtest.h>

#include <string>

#include "transfer/rdma/rdma_backend.h"
#include "transfer/rdma/verbs_api.h"

namespace pdr::transfer {
namespace {

TEST(RdmaDevice, LoaderReportsAClearReason) {
  const rdma::VerbsApi* api = nullptr;
  const Status s = rdma::load_verbs_api(&api);
  if (!s) {
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_TRUE(s.message().starts_with("rdma unavailable: ")) << s.message();
    GTEST_SKIP() << "no RDMA device: " << s.message();
  }
  ASSERT_NE(api, nullptr);
  EXPECT_NE(api->post_send, nullptr);
  EXPECT_NE(api->poll_cq, nullptr);
}

TEST(RdmaDevice, StartWithoutDeviceIsUnavailable) {
  const rdma::VerbsApi* api = nullptr;
  const Status loaded = rdma::load_verbs_api(&api);
  if (loaded) GTEST_SKIP() << "an RDMA device exists; covered by RdmaDevice.StartsAndRegisters";
  auto backend = make_rdma_backend({}, &rdma::load_verbs_api);
  const Status s = backend->start(BackendContext{});
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), loaded.message());
}

TEST(RdmaDevice, StartsAndRegisters) {
  const rdma::VerbsApi* api = nullptr;
  if (const Status s = rdma::load_verbs_api(&api); !s) {
    GTEST_SKIP() << "no RDMA device: " << s.message();
  }
  RegionTable regions;
  EngineCounters counters;
  BackendContext context;
  context.agent = "device-test";
  context.regions = &regions;
  context.counters = &counters;
  auto backend = make_rdma_backend({}, &rdma::load_verbs_api);
  const Status started = backend->start(context);
  if (!started) GTEST_SKIP() << "no usable RDMA device: " << started.message();
  std::string memory(1 << 20, '\0');
  RegionId id = kInvalidRegion;
  ASSERT_TRUE(regions.register_region(memory.data(), memory.size(), MemKind::kHostDram, &id));
  ASSERT_TRUE(backend->on_region_registered(
      id, Region{reinterpret_cast<std::uintptr_t>(memory.data()), memory.size(), MemKind::kHostDram}));
  EXPECT_EQ(backend->region_keys(id).size(), 13u);
  EXPECT_FALSE(backend->local_address().empty());
  backend->on_region_unregistered(id);
  backend->stop();
}

}  // namespace
}  // namespace pdr::transfer
