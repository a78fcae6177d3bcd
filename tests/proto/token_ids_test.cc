#include "proto/token_ids.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pdr::proto {
namespace {

std::vector<uint32_t> ids(std::string_view raw, size_t max = 100) {
  std::vector<uint32_t> out;
  EXPECT_TRUE(parse_token_id_array(raw, max, &out)) << raw;
  return out;
}

bool refused(std::string_view raw, size_t max = 100) {
  std::vector<uint32_t> out;
  return !parse_token_id_array(raw, max, &out);
}

TEST(TokenIds, ParsesIntegerArraysWithJsonWhitespace) {
  EXPECT_EQ(ids("[1,2,3]"), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(ids(" [ 0 ,\n\t4294967295\r] "), (std::vector<uint32_t>{0, 4294967295u}));
  EXPECT_EQ(ids("[7]"), (std::vector<uint32_t>{7}));
}

TEST(TokenIds, AnythingElseIsNotTokenIds) {
  for (std::string_view raw : {"", "[]", "\"text\"", "[\"a\",\"b\"]", "[[1,2],[3]]", "[1,-2]", "[1.5]", "[1e3]",
                               "[4294967296]", "[99999999999999999999]", "[01]", "[1,]", "[,1]", "[1 2]", "[1",
                               "[1]x", "{\"a\":1}", "null", "[1,null]", "[+1]"}) {
    EXPECT_TRUE(refused(raw)) << raw;
  }
}

TEST(TokenIds, MoreThanTheLimitIsRefused) {
  EXPECT_EQ(ids("[1,2,3]", 3).size(), 3u);
  EXPECT_TRUE(refused("[1,2,3,4]", 3));
}

}  // namespace
}  // namespace pdr::proto
