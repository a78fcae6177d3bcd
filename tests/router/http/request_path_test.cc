// Request path normalisation: the one spelling route lookups and pass-through checks read.
#include "router/http/request_path.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::http {
namespace {

std::string normal(std::string_view raw) {
  std::string out = "untouched";
  Status s = normalize_path(raw, &out);
  EXPECT_TRUE(s.is_ok()) << raw << ": " << s.to_string();
  return out;
}

std::string refused(std::string_view raw) {
  std::string out = "untouched";
  Status s = normalize_path(raw, &out);
  EXPECT_FALSE(s.is_ok()) << raw << " -> " << out;
  EXPECT_EQ(out, "untouched");
  return s.message();
}

TEST(NormalizePath, DecodesEscapes) {
  EXPECT_EQ(normal("/start%5Fprofile"), "/start_profile");
  EXPECT_EQ(normal("/%73tart_profile"), "/start_profile");
  EXPECT_EQ(normal("/reset%5fprefix%5Fcache"), "/reset_prefix_cache");
  EXPECT_EQ(normal("/a%20b"), "/a b");
  EXPECT_EQ(normal("/a%25b"), "/a%b");  // decoded once only
  EXPECT_EQ(normal("/v1/completions"), "/v1/completions");
}

TEST(NormalizePath, DropsEmptyAndDotSegments) {
  EXPECT_EQ(normal("/"), "/");
  EXPECT_EQ(normal("//start_profile"), "/start_profile");
  EXPECT_EQ(normal("/v1//models"), "/v1/models");
  EXPECT_EQ(normal("/./v1/./models"), "/v1/models");
  EXPECT_EQ(normal("/x/../start_profile"), "/start_profile");
  EXPECT_EQ(normal("/x/%2E%2E/start_profile"), "/start_profile");
  EXPECT_EQ(normal("/x/%2e/y"), "/x/y");
  EXPECT_EQ(normal("/a/"), "/a/");
  EXPECT_EQ(normal("/a//"), "/a/");
  EXPECT_EQ(normal("/a/."), "/a/");
  EXPECT_EQ(normal("/a/b/.."), "/a/");
  EXPECT_EQ(normal("/a/.."), "/");
}

TEST(NormalizePath, RefusesWhatDecodersDisagreeOn) {
  EXPECT_NE(refused("/a%2Fb").find("encoded '/'"), std::string::npos);
  EXPECT_NE(refused("/a%2fb").find("encoded '/'"), std::string::npos);
  EXPECT_NE(refused("/a%00b").find("NUL"), std::string::npos);
  EXPECT_NE(refused("/a%0Ab").find("printable ASCII"), std::string::npos);
  EXPECT_NE(refused("/a%7Fb").find("printable ASCII"), std::string::npos);
  EXPECT_NE(refused("/a%C3%A9").find("printable ASCII"), std::string::npos);
  EXPECT_NE(refused(std::string_view("/a\x01z", 4)).find("printable ASCII"), std::string::npos);
  EXPECT_NE(refused("/a%zz").find("invalid percent escape"), std::string::npos);
  EXPECT_NE(refused("/a%4").find("invalid percent escape"), std::string::npos);
  EXPECT_NE(refused("/a%").find("invalid percent escape"), std::string::npos);
  EXPECT_NE(refused("/..").find("above the root"), std::string::npos);
  EXPECT_NE(refused("/a/../..").find("above the root"), std::string::npos);
  EXPECT_NE(refused("*").find("start with '/'"), std::string::npos);
  EXPECT_NE(refused("http://host/x").find("start with '/'"), std::string::npos);
  EXPECT_NE(refused("").find("start with '/'"), std::string::npos);
}

TEST(EncodePath, SpellsBytesThatWouldChangeMeaning) {
  EXPECT_EQ(encode_path("/v1/completions"), "/v1/completions");
  EXPECT_EQ(encode_path("/a b"), "/a%20b");
  EXPECT_EQ(encode_path("/a%b"), "/a%25b");
  EXPECT_EQ(encode_path("/a?b#c"), "/a%3Fb%23c");
  EXPECT_EQ(encode_path("/x:y@z!$&'()*+,;=-._~"), "/x:y@z!$&'()*+,;=-._~");
  // Round trip: the encoded form normalises back to itself.
  for (const char* p : {"/a b", "/a%b", "/a?b", "/start_profile", "/x\"y<z>"}) {
    std::string back;
    ASSERT_TRUE(normalize_path(encode_path(p), &back).is_ok()) << p;
    EXPECT_EQ(back, p);
  }
}

}  // namespace
}  // namespace pdr::http
