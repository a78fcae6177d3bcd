#include "discovery/config/client_key_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace pdr::config {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::string_view kKeyA = "sk-alpha-0123456789abcdef";
constexpr std::string_view kKeyB = "sk-bravo-0123456789abcdef";

std::string hex(const KeyDigest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : d) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string error_of(std::string_view text) {
  ClientKeySet set;
  Status s = parse_client_key_file(text, &set);
  EXPECT_FALSE(s.is_ok()) << "accepted: " << text;
  return s.message();
}

TEST(ClientKeyFile, PlainKeysDigestsCommentsAndBlankLines) {
  const std::string text = "# team keys\n\n" + std::string(kKeyA) + " team-a\n  \t\n" + "sha256:" +
                           hex(digest_of_key(kKeyB)) + "\tteam_b  \r\n" + "# end\n";
  ClientKeySet set;
  ASSERT_TRUE(parse_client_key_file(text, &set).is_ok());
  ASSERT_EQ(set.keys.size(), 2u);
  EXPECT_EQ(set.tenants, (std::vector<std::string>{"team-a", "team_b"}));
  ASSERT_NE(set.find(kKeyA), nullptr);
  EXPECT_EQ(*set.find(kKeyA), "team-a");
  ASSERT_NE(set.find(kKeyB), nullptr);
  EXPECT_EQ(*set.find(kKeyB), "team_b");
  EXPECT_EQ(set.find("sk-charlie-0123456789abcdef"), nullptr);
  EXPECT_EQ(set.find(""), nullptr);
  // A prefix or an extension of a key is another key.
  EXPECT_EQ(set.find(kKeyA.substr(0, kKeyA.size() - 1)), nullptr);
  EXPECT_EQ(set.find(std::string(kKeyA) + "x"), nullptr);
  // The digest written in the file is not itself a key.
  EXPECT_EQ(set.find("sha256:" + hex(digest_of_key(kKeyB))), nullptr);
}

TEST(ClientKeyFile, UpperCaseDigestAndNoFinalNewline) {
  std::string digest = hex(digest_of_key(kKeyA));
  for (char& c : digest) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ClientKeySet set;
  ASSERT_TRUE(parse_client_key_file("sha256:" + digest + " t", &set).is_ok());
  EXPECT_NE(set.find(kKeyA), nullptr);
}

TEST(ClientKeyFile, EmptyFileHoldsNoKey) {
  ClientKeySet set;
  ASSERT_TRUE(parse_client_key_file("", &set).is_ok());
  EXPECT_TRUE(set.keys.empty());
  EXPECT_EQ(set.find(kKeyA), nullptr);
}

TEST(ClientKeyFile, ErrorsNameTheLineNeverTheKey) {
  const std::string secret = "sk-short";
  std::string message = error_of("\n" + secret + " team\n");
  EXPECT_THAT(message, HasSubstr("line 2"));
  EXPECT_THAT(message, HasSubstr("shorter than 16"));
  EXPECT_THAT(message, Not(HasSubstr(secret)));

  message = error_of(std::string(kKeyA) + "\n");
  EXPECT_THAT(message, HasSubstr("line 1: expected '<key> <tenant>'"));
  EXPECT_THAT(message, Not(HasSubstr(kKeyA)));
  message = error_of(std::string(kKeyA) + " team extra\n");
  EXPECT_THAT(message, HasSubstr("more than two fields"));
  EXPECT_THAT(error_of(std::string(kKeyA) + " team/a"), HasSubstr("not a name"));
  EXPECT_THAT(error_of(std::string(kKeyA) + " " + std::string(65, 't')), HasSubstr("not a name"));
  EXPECT_THAT(error_of(std::string(kKeyA) + " other"), HasSubstr("reserved"));
  EXPECT_THAT(error_of("sha256:abc team"), HasSubstr("64 hex digits"));
  EXPECT_THAT(error_of("sha256:" + std::string(63, 'a') + "g team"), HasSubstr("64 hex digits"));
  EXPECT_THAT(error_of(std::string(1025, 'k') + " team"), HasSubstr("longer than 1024"));
  message = error_of("sk-\x01" "0123456789abcdef team");
  EXPECT_THAT(message, HasSubstr("not printable ASCII"));
  message = error_of("sk-caf\xc3\xa9-0123456789abcdef team");
  EXPECT_THAT(message, HasSubstr("not printable ASCII"));
}

TEST(ClientKeyFile, TheSameKeyTwiceIsAnErrorEvenAsItsDigest) {
  const std::string text = std::string(kKeyA) + " a\n" + std::string(kKeyB) + " b\n" + "sha256:" +
                           hex(digest_of_key(kKeyA)) + " c\n";
  EXPECT_THAT(error_of(text), HasSubstr("line 3: the same key as line 1"));
}

TEST(ClientKeyFile, TenantsAreBounded) {
  std::string text;
  for (size_t i = 0; i <= kMaxTenants; ++i) text += "sk-key-0123456789-" + std::to_string(i) + " t" + std::to_string(i) + "\n";
  ClientKeySet set;
  Status s = parse_client_key_file(text, &set);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge);
  EXPECT_THAT(s.message(), HasSubstr("tenants"));
}

TEST(ClientKeyFile, ManyKeysOfOneTenantShareIt) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += "sk-key-0123456789-" + std::to_string(i) + " shared\n";
  ClientKeySet set;
  ASSERT_TRUE(parse_client_key_file(text, &set).is_ok());
  EXPECT_EQ(set.keys.size(), 500u);
  EXPECT_EQ(set.tenants.size(), 1u);
  for (int i = 0; i < 500; i += 37) EXPECT_NE(set.find("sk-key-0123456789-" + std::to_string(i)), nullptr) << i;
}

TEST(ClientKeyFile, DigestsAreTheSameOnEveryThread) {
  // Workers hash keys at once, each with its own digest context: a known answer (SHA-256 of
  // "abc", FIPS 180-2), and the same digest of each key on every thread, interleaved with lookups.
  EXPECT_EQ(hex(digest_of_key("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  ClientKeySet set;
  ASSERT_TRUE(parse_client_key_file(std::string(kKeyA) + " a\n" + std::string(kKeyB) + " b\n", &set).is_ok());
  std::vector<KeyDigest> expected;
  for (int i = 0; i < 200; ++i) expected.push_back(digest_of_key("sk-thread-key-" + std::to_string(i)));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (int i = 0; i < 200; ++i) {
          if (digest_of_key("sk-thread-key-" + std::to_string(i)) != expected[i]) ++mismatches[t];
        }
        const std::string* a = set.find(kKeyA);
        if (a == nullptr || *a != "a" || set.find("sk-not-a-key-0123456789") != nullptr) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(ClientKeyFile, TenantNames) {
  EXPECT_TRUE(is_tenant_name("team-a.prod_1"));
  EXPECT_FALSE(is_tenant_name(""));
  EXPECT_FALSE(is_tenant_name("a b"));
  EXPECT_FALSE(is_tenant_name("a\"b"));
  EXPECT_TRUE(is_tenant_name(std::string(64, 'x')));
  EXPECT_FALSE(is_tenant_name(std::string(65, 'x')));
}

}  // namespace
}  // namespace pdr::config
