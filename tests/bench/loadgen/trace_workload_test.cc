#include "bench/loadgen/trace_workload.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "bench/loadgen/prefix_oracle.h"
#include "bench/loadgen/stream_request.h"
#include <nlohmann/json.hpp>

namespace pdr::loadgen {
namespace {

TraceEntry entry(double ts, uint32_t in, uint32_t out, std::vector<uint64_t> ids) {
  return {.timestamp_ms = ts, .input_length = in, .output_length = out, .hash_ids = std::move(ids)};
}

std::vector<uint32_t> block(const std::vector<uint32_t>& ids, size_t b, size_t size = 512) {
  const size_t end = std::min(ids.size(), (b + 1) * size);
  return {ids.begin() + static_cast<std::ptrdiff_t>(b * size), ids.begin() + static_cast<std::ptrdiff_t>(end)};
}

std::vector<std::vector<uint32_t>> prompts_of(const std::vector<TraceEntry>& entries, uint64_t seed = 7) {
  std::vector<std::vector<uint32_t>> out;
  for (const BenchRequest& r : make_trace_requests(entries, {.seed = seed})) {
    out.push_back(trace_prompt_ids(r, 32000));
  }
  return out;
}

TEST(TracePrompt, LengthsAreExactAndIdsInTheVocabulary) {
  const auto prompts =
      prompts_of({entry(0, 1, 1, {0}), entry(0, 512, 1, {1}), entry(0, 513, 1, {2, 3}),
                  entry(0, 1500, 1, {4, 5, 6}), entry(0, 2048, 1, {7, 8, 9, 10})});
  const std::vector<size_t> lengths = {1, 512, 513, 1500, 2048};
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(prompts[i].size(), lengths[i]);
    for (uint32_t id : prompts[i]) {
      ASSERT_GE(id, kFirstTokenId);
      ASSERT_LT(id, 32000u);
    }
  }
}

TEST(TracePrompt, EqualHashIdsGiveEqualBlocksDifferentIdsDifferentBlocks) {
  // Requests 0 and 1 share blocks 10 and 11, then part ways (12 vs 13); request 2 starts with 11
  // (never in this position in a real trace, but the block is the id's, wherever it stands).
  const auto p = prompts_of({entry(0, 1536, 1, {10, 11, 12}), entry(5, 1536, 1, {10, 11, 13}),
                             entry(9, 1024, 1, {11, 14})});
  EXPECT_EQ(block(p[0], 0), block(p[1], 0));
  EXPECT_EQ(block(p[0], 1), block(p[1], 1));
  EXPECT_NE(block(p[0], 2), block(p[1], 2));
  EXPECT_EQ(block(p[2], 0), block(p[0], 1));
  EXPECT_NE(block(p[2], 1), block(p[0], 0));
  // Within one prompt every block differs from the others (ids differ).
  EXPECT_NE(block(p[0], 0), block(p[0], 1));
  // A different seed gives other blocks for the same ids.
  const auto other = prompts_of({entry(0, 1536, 1, {10, 11, 12})}, 8);
  EXPECT_NE(block(other[0], 0), block(p[0], 0));
}

TEST(TracePrompt, PartialLastBlockIsUniqueToTheRequest) {
  // Same ids and lengths: the full blocks are equal, the partial last blocks (300 tokens) not,
  // even with the same hash id for it.
  const auto p = prompts_of({entry(0, 812, 1, {20, 21}), entry(0, 812, 1, {20, 21})});
  ASSERT_EQ(p[0].size(), 812u);
  EXPECT_EQ(block(p[0], 0), block(p[1], 0));
  EXPECT_EQ(block(p[0], 1).size(), 300u);
  EXPECT_NE(block(p[0], 1), block(p[1], 1));
  // Blocks with no hash id listed are the request's own too.
  const auto q = prompts_of({entry(0, 1024, 1, {30}), entry(0, 1024, 1, {30})});
  EXPECT_EQ(block(q[0], 0), block(q[1], 0));
  EXPECT_NE(block(q[0], 1), block(q[1], 1));
}

TEST(TracePrompt, SharedTokensAreWhatAPrefixCacheCanHit) {
  // The oracle (16-token blocks, chained) finds exactly the shared full 512-blocks.
  const std::vector<TraceEntry> entries = {entry(0, 1300, 1, {1, 2, 3}), entry(1, 1100, 1, {1, 2, 4}),
                                           entry(2, 700, 1, {1, 5}), entry(3, 600, 1, {6, 7})};
  PrefixOracle oracle(16);
  const std::vector<uint64_t> hits = {0, 1024, 512, 0};
  const auto prompts = prompts_of(entries);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(oracle.add(std::vector<uint64_t>(prompts[i].begin(), prompts[i].end())), hits[i]) << i;
  }
}

TEST(TraceRequests, CarryLengthsAndBuildTheBodyAsTokenIds) {
  const std::vector<BenchRequest> requests =
      make_trace_requests({entry(0, 600, 37, {1, 2})}, {.block_tokens = 512, .seed = 1});
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].input_len, 600u);
  EXPECT_EQ(requests[0].output_len, 37u);
  EXPECT_EQ(requests[0].block_seeds.size(), 2u);
  EXPECT_TRUE(requests[0].prompt_json.empty());
  BenchRequest sent = requests[0];
  sent.prompt_json = token_ids_json(trace_prompt_ids(sent, 32000));
  const nlohmann::json body = nlohmann::json::parse(
      build_request({.path = "/inference/v1/generate", .model = "m", .generate = true}, sent).body);
  EXPECT_EQ(body["token_ids"].size(), 600u);
  EXPECT_EQ(body["sampling_params"]["max_tokens"], 37);
  EXPECT_EQ(body["sampling_params"]["ignore_eos"], true);
  EXPECT_EQ(body["stream"], true);
  EXPECT_FALSE(body.contains("prompt"));
  EXPECT_FALSE(body.contains("max_tokens"));
}

TEST(TraceArrivals, FromTheFirstTimestampOverTheSpeedup) {
  const std::vector<double> offsets =
      trace_arrival_offsets({entry(1000, 1, 1, {}), entry(1000, 1, 1, {}), entry(3000, 1, 1, {}),
                             entry(5000, 1, 1, {})},
                            2.0);
  EXPECT_EQ(offsets, (std::vector<double>{0.0, 0.0, 1.0, 2.0}));
}

Status read(const std::string& text, std::vector<TraceEntry>* out, TraceReadOptions options = {}) {
  std::istringstream in(text);
  return read_trace(in, "t.jsonl", options, out);
}

TEST(TraceRead, ReadsMooncakeLines) {
  std::vector<TraceEntry> entries;
  const Status s = read(
      "{\"timestamp\": 0, \"input_length\": 40160, \"output_length\": 6, \"hash_ids\": [0, 1]}\n"
      "\n"
      "  \r\n"
      "{\"hash_ids\":[5],\"output_length\":2,\"input_length\":100,\"timestamp\":27.5,\"extra\":{\"a\":[1,{\"b\":null}]}}\r\n"
      "{\"timestamp\": 27.5, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": []}",
      &entries);
  ASSERT_TRUE(s) << s.message();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].input_length, 40160u);
  EXPECT_EQ(entries[0].output_length, 6u);
  EXPECT_EQ(entries[0].hash_ids, (std::vector<uint64_t>{0, 1}));
  EXPECT_DOUBLE_EQ(entries[1].timestamp_ms, 27.5);
  EXPECT_EQ(entries[1].hash_ids, (std::vector<uint64_t>{5}));
  EXPECT_TRUE(entries[2].hash_ids.empty());
}

TEST(TraceRead, MaxRequestsStopsBeforeTheRest) {
  std::vector<TraceEntry> entries;
  const Status s = read(
      "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[0]}\n"
      "{\"timestamp\":1,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n"
      "not json: never read\n",
      &entries, {.max_requests = 2});
  ASSERT_TRUE(s) << s.message();
  EXPECT_EQ(entries.size(), 2u);
}

// The message of reading a two-line trace whose second line is `bad`.
std::string refusal(const std::string& bad, TraceReadOptions options = {}) {
  std::vector<TraceEntry> entries;
  const Status s = read("{\"timestamp\":5,\"input_length\":10,\"output_length\":1,\"hash_ids\":[0]}\n" + bad +
                            "\n",
                        &entries, options);
  EXPECT_FALSE(s) << bad;
  EXPECT_TRUE(entries.empty());
  return s.message();
}

TEST(TraceRead, BadLinesAreRefusedWithTheirLineNumber) {
  const std::string ok_tail = "\"output_length\":1,\"hash_ids\":[0]";
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10,\"output_length\":1}"),
            "t.jsonl line 2: hash_ids is missing");
  EXPECT_EQ(refusal("[1,2]"), "t.jsonl line 2: not a JSON object");
  EXPECT_EQ(refusal("42"), "t.jsonl line 2: not a JSON object");
  EXPECT_EQ(refusal("{\"timestamp\":6,"), "t.jsonl line 2: invalid JSON (the parser stopped at byte 16)");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10," + ok_tail + "} trailing"),
            "t.jsonl line 2: invalid JSON (the parser stopped at byte 70)");
  EXPECT_EQ(refusal("{\"timestamp\":-1,\"input_length\":10," + ok_tail + "}"),
            "t.jsonl line 2: timestamp must be a number >= 0");
  EXPECT_EQ(refusal("{\"timestamp\":\"6\",\"input_length\":10," + ok_tail + "}"),
            "t.jsonl line 2: timestamp must be a number >= 0, not a string");
  EXPECT_EQ(refusal("{\"timestamp\":4,\"input_length\":10," + ok_tail + "}"),
            "t.jsonl line 2: timestamp 4 is before the previous line's 5 (a trace lists requests in "
            "arrival order)");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":0," + ok_tail + "}"),
            "t.jsonl line 2: input_length must be in [1, 10000000], got 0");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10.5," + ok_tail + "}"),
            "t.jsonl line 2: input_length must be an integer >= 1");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10,\"output_length\":-3,\"hash_ids\":[0]}"),
            "t.jsonl line 2: output_length must be an integer >= 1");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10,\"output_length\":1,\"hash_ids\":[-1]}"),
            "t.jsonl line 2: hash_ids must hold integers >= 0");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10,\"output_length\":1,\"hash_ids\":[[0]]}"),
            "t.jsonl line 2: hash_ids must hold integers >= 0");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10,\"output_length\":1,\"hash_ids\":{}}"),
            "t.jsonl line 2: hash_ids must be an array of integers, not an object");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10,\"output_length\":1,\"hash_ids\":[1e3]}"),
            "t.jsonl line 2: hash_ids must hold integers >= 0");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10,\"output_length\":1,\"hash_ids\":[9223372036854775808]}"),
            "t.jsonl line 2: hash_ids must hold integers in [0, 2^63)");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"timestamp\":7,\"input_length\":10," + ok_tail + "}"),
            "t.jsonl line 2: timestamp appears twice");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":600,\"output_length\":1,\"hash_ids\":[0,1,2]}"),
            "t.jsonl line 2: hash_ids lists 3 blocks; input_length 600 has 2 of 512 tokens");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10," + ok_tail + ",\"x\":[[[[[[[[[1]]]]]]]]]}"),
            "t.jsonl line 2: nested deeper than 8");
  EXPECT_EQ(refusal(std::string(100, ' ') + "{}", {.limits = {.max_line_bytes = 80}}),
            "t.jsonl line 2: longer than 80 bytes");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10," + ok_tail + "}",
                    {.limits = {.max_entries = 1}}),
            "t.jsonl line 2: more than 1 requests");
  EXPECT_EQ(refusal("{\"timestamp\":6,\"input_length\":10," + ok_tail + "}",
                    {.limits = {.max_total_input_tokens = 15}}),
            "t.jsonl line 2: the prompts read so far total more than 15 tokens (pass --num-prompts "
            "to replay the start of the trace)");
}

TEST(TraceRead, EmptyTraceIsRefused) {
  std::vector<TraceEntry> entries;
  const Status s = read("\n  \n", &entries);
  EXPECT_FALSE(s);
  EXPECT_EQ(s.message(), "t.jsonl: no request in the trace");
}

TEST(TraceRead, MillionsOfNestedBracketsStopAtTheDepthLimit) {
  // A line the parser must refuse without recursing or building anything.
  std::vector<TraceEntry> entries;
  const std::string deep = "{\"x\":" + std::string(500'000, '[') ;
  const Status s = read(deep, &entries);
  EXPECT_FALSE(s);
  EXPECT_EQ(s.message(), "t.jsonl line 1: nested deeper than 8");
}

}  // namespace
}  // namespace pdr::loadgen
