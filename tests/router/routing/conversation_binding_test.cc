#include "router/routing/conversation_binding.h"

#include <gtest/gtest.h>

#include <string>

#include "proto/etcd_conversation.h"

namespace pdr::router::routing {
namespace {

using BindTo = config::Topology::MultiTurn::BindTo;

config::Topology::MultiTurn config(BindTo bind_to, std::string header = {}, std::string secret = {}) {
  config::Topology::MultiTurn mt;
  mt.enabled = true;
  mt.bind_to = bind_to;
  mt.bind_header = std::move(header);
  mt.binding_secret = std::move(secret);
  return mt;
}

std::string hex(const std::optional<std::string>& binding) {
  return binding ? proto::conversation_binding_text(*binding) : "(none)";
}

TEST(ConversationBinding, TheSameCredentialGivesTheSameBindingAnotherOneAnother) {
  const auto mt = config(BindTo::kAuthorization);
  const auto alice = conversation_binding(mt, "Bearer alice-token", "");
  const auto mallory = conversation_binding(mt, "Bearer mallory-token", "");
  ASSERT_TRUE(alice && mallory);
  EXPECT_EQ(alice->size(), kBindingBytes);
  EXPECT_EQ(conversation_binding(mt, "Bearer alice-token", "tenant-ignored"), alice);
  EXPECT_NE(alice, mallory);
  EXPECT_EQ(alice->find("alice"), std::string::npos);
  // Known answer: replicas of any build must agree, so the digest's input is fixed (a change
  // of it must be a new version of the label, never a silent one).
  EXPECT_EQ(hex(alice), "4f5ebfa17b92dd56028ae3bd92f30f8985063c23bad228cf280ea738446b51b5");
}

TEST(ConversationBinding, NoCredentialIsTheAnonymousBinding) {
  EXPECT_EQ(conversation_binding(config(BindTo::kAuthorization), "", "tenant-7"), std::string());
  EXPECT_EQ(conversation_binding(config(BindTo::kHeader, "x-tenant-id"), "Bearer alice-token", ""), std::string());
  EXPECT_EQ(conversation_binding(config(BindTo::kNone), "Bearer alice-token", "tenant-7"), std::string());
}

TEST(ConversationBinding, AHeaderBindingUsesThatHeaderAndItsNameAndASecretKeysIt) {
  const auto by_header = conversation_binding(config(BindTo::kHeader, "x-tenant-id"), "Bearer alice-token", "tenant-7");
  ASSERT_TRUE(by_header);
  EXPECT_EQ(conversation_binding(config(BindTo::kHeader, "x-tenant-id"), "Bearer other", "tenant-7"), by_header);
  EXPECT_NE(conversation_binding(config(BindTo::kHeader, "x-tenant-id"), "", "tenant-8"), by_header);
  // The same bytes from another source are another binding.
  EXPECT_NE(conversation_binding(config(BindTo::kHeader, "x-org-id"), "", "tenant-7"), by_header);
  EXPECT_NE(conversation_binding(config(BindTo::kAuthorization), "tenant-7", ""), by_header);
  // HMAC-SHA256 with the deployment's secret: deterministic, and another digest than without.
  const auto keyed = conversation_binding(config(BindTo::kHeader, "x-tenant-id", "deployment-secret"), "", "tenant-7");
  EXPECT_EQ(hex(keyed), "b9891822cdd86d8a53832d68bd8dede7cae2f69b88bb91152bf6f7ee8cb04481");
  EXPECT_NE(keyed, by_header);
  EXPECT_NE(conversation_binding(config(BindTo::kHeader, "x-tenant-id", "other-secret"), "", "tenant-7"), keyed);
}

}  // namespace
}  // namespace pdr::router::routing
