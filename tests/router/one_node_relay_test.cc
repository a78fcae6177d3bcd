// serves_capability: how a node's `serves` label declares the one-node endpoints it serves
// (router/proxy/one_node_relay.h). The relay itself runs against real sims in
// tests/integration/test_endpoints.py.
#include "router/proxy/one_node_relay.h"

#include <gtest/gtest.h>

namespace pdr::router::proxy {
namespace {

TEST(ServesCapability, CommaSeparatedListUnderTheServesKey) {
  const proto::Labels labels = {{"serves", "render, pooling"}, {"zone", "audio"}};
  EXPECT_TRUE(serves_capability(labels, kServesRender));
  EXPECT_TRUE(serves_capability(labels, kServesPooling));
  EXPECT_FALSE(serves_capability(labels, kServesAudio));  // another key's value does not count
}

TEST(ServesCapability, WholeItemsOnly) {
  EXPECT_FALSE(serves_capability({{"serves", "renderer"}}, kServesRender));
  EXPECT_FALSE(serves_capability({{"serves", "pool"}}, kServesPooling));
  EXPECT_FALSE(serves_capability({{"serves", ""}}, kServesRender));
  EXPECT_FALSE(serves_capability({{"serves", ",,"}}, kServesRender));
  EXPECT_TRUE(serves_capability({{"serves", ",audio,"}}, kServesAudio));
  EXPECT_FALSE(serves_capability({}, kServesRender));
  EXPECT_FALSE(serves_capability({{"Serves", "render"}}, kServesRender));  // keys are exact
}

}  // namespace
}  // namespace pdr::router::proxy
