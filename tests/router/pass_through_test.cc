// Which unknown paths routing.pass_through_unknown may relay (router/proxy/pass_through.h).
#include "router/proxy/pass_through.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pdr::router::proxy {
namespace {

using V = PassThroughVerdict;
const std::vector<std::string> kNoList;

TEST(PassThrough, NodeAdminPathsAreDenied) {
  for (const char* path : {"/start_profile", "/stop_profile", "/reset_prefix_cache", "/sleep", "/wake_up",
                           "/is_sleeping", "/collective_rpc", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
                           "/scale_elastic_ep", "/abort_requests", "/reset_mm_cache", "/pause", "/pause/step",
                           "/resume", "/update_weights", "/fault_tolerance/apply", "/flush_cache",
                           "/update_weights_from_disk", "/release_memory_occupation", "/sleep/"}) {
    EXPECT_EQ(check_pass_through(path, kNoList), V::kNodeAdmin) << path;
  }
  // Even when the allow-list names them.
  EXPECT_EQ(check_pass_through("/sleep", {"/sleep"}), V::kNodeAdmin);
  EXPECT_EQ(check_pass_through("/pause/step", {"/**"}), V::kNodeAdmin);
}

TEST(PassThrough, OtherPathsFollowTheAllowList) {
  EXPECT_EQ(check_pass_through("/v1/new_endpoint", kNoList), V::kAllowed);
  EXPECT_EQ(check_pass_through("/sleeper", kNoList), V::kAllowed);  // whole segments only
  EXPECT_EQ(check_pass_through("/pauses", kNoList), V::kAllowed);
  EXPECT_EQ(check_pass_through("/Sleep", kNoList), V::kAllowed);  // Starlette is case-sensitive
  const std::vector<std::string> allow{"/v1/extra", "/v2/**"};
  EXPECT_EQ(check_pass_through("/v1/extra", allow), V::kAllowed);
  EXPECT_EQ(check_pass_through("/v1/extra/", allow), V::kAllowed);
  EXPECT_EQ(check_pass_through("/v1/extra/more", allow), V::kNotListed);
  EXPECT_EQ(check_pass_through("/v2", allow), V::kAllowed);
  EXPECT_EQ(check_pass_through("/v2/a/b", allow), V::kAllowed);
  EXPECT_EQ(check_pass_through("/v2x", allow), V::kNotListed);
  EXPECT_EQ(check_pass_through("/v1/other", allow), V::kNotListed);
}

TEST(PassThrough, EntryMatching) {
  EXPECT_TRUE(pass_through_entry_matches("/a/**", "/a"));
  EXPECT_TRUE(pass_through_entry_matches("/a/**", "/a/"));
  EXPECT_TRUE(pass_through_entry_matches("/a/**", "/a/b"));
  EXPECT_FALSE(pass_through_entry_matches("/a/**", "/ab"));
  EXPECT_TRUE(pass_through_entry_matches("/", "/"));
  EXPECT_TRUE(pass_through_entry_matches("/**", "/anything/at/all"));
}

}  // namespace
}  // namespace pdr::router::proxy
