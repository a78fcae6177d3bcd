#include "proto/mooncake_query.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

TEST(MooncakeQuery, ParsesEngineIdsByRankIgnoringOtherFields) {
  MooncakeEngines e;
  ASSERT_TRUE(parse_mooncake_query(R"({"1":{"engine_id":"b","tp_size":2},
      "0":{"engine_id":"a","worker_addr":{"0":{"0":"tcp://127.0.10.1:17000"}}}})", &e).is_ok());
  ASSERT_EQ(e.engine_ids.size(), 2u);
  EXPECT_EQ(e.engine_ids[0], "a");
  EXPECT_EQ(e.engine_ids[1], "b");
}

TEST(MooncakeQuery, RefusesWhatCannotBePinned) {
  struct Case {
    const char* json;
    StatusCode code;
    const char* words;
  } cases[] = {
      {"[1]", StatusCode::kWrongType, "not a JSON object"},
      {"{", StatusCode::kMalformed, "not JSON"},
      {"{}", StatusCode::kInvalidValue, "no engine registered"},
      {R"({"x":{"engine_id":"a"}})", StatusCode::kInvalidValue, "not a DP rank"},
      {R"({"-1":{"engine_id":"a"}})", StatusCode::kInvalidValue, "not a DP rank"},
      {R"({"4096":{"engine_id":"a"}})", StatusCode::kInvalidValue, "not a DP rank"},
      {R"({"1":{"engine_id":"a"}})", StatusCode::kInvalidValue, "DP rank 0 is missing"},
      {R"({"0":"a"})", StatusCode::kWrongType, "not an object"},
      {R"({"0":{}})", StatusCode::kMissingKey, "no engine_id"},
      {R"({"0":{"engine_id":7}})", StatusCode::kWrongType, "not a string"},
  };
  for (const Case& c : cases) {
    MooncakeEngines e;
    e.engine_ids = {"untouched"};
    Status st = parse_mooncake_query(c.json, &e);
    EXPECT_EQ(st.code(), c.code) << c.json << ": " << st.message();
    EXPECT_NE(st.message().find(c.words), std::string::npos) << st.message();
    EXPECT_EQ(e.engine_ids, std::vector<std::string>{"untouched"});
  }
}

TEST(MooncakeQuery, RefusesOversizedAnswers) {
  MooncakeEngines e;
  std::string big = R"({"0":{"engine_id":")" + std::string(2 << 20, 'a') + "\"}}";
  EXPECT_EQ(parse_mooncake_query(big, &e).code(), StatusCode::kTooLarge);
}

}  // namespace
}  // namespace pdr::proto
