#include "bench/loadgen/cache_workloads.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "bench/loadgen/prefix_oracle.h"
#include "bench/loadgen/stream_request.h"

namespace pdr::loadgen {
namespace {

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

std::vector<uint32_t> ids(const std::string& json) {
  return nlohmann::json::parse(json).get<std::vector<uint32_t>>();
}

TEST(PrefixRepetition, RequestsShareOneOfTheFewPrefixesAndEndInDistinctSuffixes) {
  const WorkloadOptions workload{.num_prompts = 40, .seed = 3};
  const PrefixRepetitionOptions options{
      .prefix_len = 50, .suffix_len = 10, .num_prefixes = 4, .output_len = 7};
  ASSERT_TRUE(validate(workload, options));
  const auto requests = make_prefix_repetition_requests(workload, options);
  ASSERT_EQ(requests.size(), 40u);
  std::map<std::string, int> per_prefix;
  std::set<std::string> suffixes;
  for (const BenchRequest& r : requests) {
    const auto w = words(r.prompt_text);
    ASSERT_EQ(w.size(), 60u);
    EXPECT_EQ(r.input_len, 60u);
    EXPECT_EQ(r.output_len, 7u);
    EXPECT_EQ(nlohmann::json::parse(r.prompt_json).get<std::string>(), r.prompt_text);
    EXPECT_FALSE(r.previous_turn);
    std::string prefix, suffix;
    for (size_t i = 0; i < w.size(); ++i) (i < 50 ? prefix : suffix) += w[i] + " ";
    ++per_prefix[prefix];
    suffixes.insert(suffix);
  }
  ASSERT_EQ(per_prefix.size(), 4u);
  for (const auto& [prefix, count] : per_prefix) EXPECT_EQ(count, 10);
  EXPECT_EQ(suffixes.size(), 40u);
  // Shuffled: the first num_prefixes requests do not simply walk the prefixes in order every
  // time; at least the sequence differs from a round robin somewhere.
  bool round_robin = true;
  for (size_t i = 4; i < requests.size(); ++i) {
    round_robin &=
        requests[i].prompt_text.substr(0, 200) == requests[i - 4].prompt_text.substr(0, 200);
  }
  EXPECT_FALSE(round_robin);
}

TEST(PrefixRepetition, TokenIdsAndDeterminism) {
  const WorkloadOptions workload{
      .num_prompts = 6, .seed = 9, .format = PromptFormat::kTokenIds, .vocab_size = 5000};
  const PrefixRepetitionOptions options{.prefix_len = 32, .suffix_len = 8, .num_prefixes = 2};
  const auto a = make_prefix_repetition_requests(workload, options);
  const auto b = make_prefix_repetition_requests(workload, options);
  std::set<std::vector<uint32_t>> prefixes;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt_json, b[i].prompt_json);
    const auto v = ids(a[i].prompt_json);
    ASSERT_EQ(v.size(), 40u);
    for (uint32_t id : v) {
      EXPECT_GE(id, kFirstTokenId);
      EXPECT_LT(id, 5000u);
    }
    prefixes.insert(std::vector<uint32_t>(v.begin(), v.begin() + 32));
  }
  EXPECT_EQ(prefixes.size(), 2u);
  WorkloadOptions other = workload;
  other.seed = 10;
  EXPECT_NE(make_prefix_repetition_requests(other, options)[0].prompt_json, a[0].prompt_json);
}

TEST(PrefixRepetition, ValidateNamesTheBadFlag) {
  const WorkloadOptions workload{.num_prompts = 10};
  EXPECT_NE(
      validate(workload, PrefixRepetitionOptions{.prefix_len = 0}).message().find("prefix-len"),
      std::string::npos);
  EXPECT_NE(validate(workload, PrefixRepetitionOptions{.num_prefixes = 11})
                .message()
                .find("num-prefixes"),
            std::string::npos);
  EXPECT_NE(
      validate(workload, PrefixRepetitionOptions{.output_len = 0}).message().find("output-len"),
      std::string::npos);
  EXPECT_NE(
      validate(WorkloadOptions{.num_prompts = 1'000'000},
               PrefixRepetitionOptions{.prefix_len = 1000, .suffix_len = 0, .num_prefixes = 1})
          .message()
          .find("at most"),
      std::string::npos);
}

TEST(MultiTurn, TurnsAreOrderedTurnByTurnAndPointAtTheirPreviousTurn) {
  const WorkloadOptions workload{.seed = 5};
  const MultiTurnOptions options{
      .num_conversations = 3, .num_turns = 4, .input_len = 12, .output_len = 6};
  ASSERT_TRUE(validate(workload, options));
  const auto requests = make_multi_turn_requests(workload, options);
  ASSERT_EQ(requests.size(), 12u);
  std::set<std::string> messages;
  for (uint32_t i = 0; i < requests.size(); ++i) {
    const BenchRequest& r = requests[i];
    EXPECT_EQ(r.index, i);
    EXPECT_EQ(r.output_len, 6u);
    EXPECT_EQ(words(r.prompt_text).size(), 12u) << "only the new user message";
    if (i < 3) {
      EXPECT_FALSE(r.previous_turn);
    } else {
      ASSERT_TRUE(r.previous_turn);
      EXPECT_EQ(*r.previous_turn, i - 3);
    }
    messages.insert(r.prompt_text);
  }
  EXPECT_EQ(messages.size(), 12u);
  // A conversation's messages do not depend on how many conversations follow it.
  const auto fewer = make_multi_turn_requests(
      workload, {.num_conversations = 1, .num_turns = 4, .input_len = 12, .output_len = 6});
  EXPECT_EQ(fewer[0].prompt_text, requests[0].prompt_text);
  EXPECT_EQ(fewer[1].prompt_text, requests[3].prompt_text);
}

TEST(MultiTurn, ConversationIdsAreSentWhenAskedFor) {
  const WorkloadOptions workload{.seed = 5};
  MultiTurnOptions options{.num_conversations = 2, .num_turns = 2, .input_len = 4, .output_len = 2};
  for (const BenchRequest& r : make_multi_turn_requests(workload, options)) EXPECT_EQ(r.conversation_id, "");
  options.conversation_ids = true;
  const auto requests = make_multi_turn_requests(workload, options);
  EXPECT_EQ(requests[0].conversation_id, "conv-0");
  EXPECT_EQ(requests[3].conversation_id, "conv-1");  // turn 1 of conversation 1
  const BenchRequest sent = compose_turn(requests[1], "ok", requests[3], PromptFormat::kWords, true, 0);
  EXPECT_EQ(sent.conversation_id, "conv-1");
  const nlohmann::json body = nlohmann::json::parse(
      build_request({.path = "/v1/chat/completions", .chat = true, .model = "m"}, sent).body);
  EXPECT_EQ(body["conversation_id"], "conv-1");
  const BenchRequest plain{.prompt_json = "\"a\"", .prompt_text = "a"};
  EXPECT_FALSE(nlohmann::json::parse(build_request({.model = "m"}, plain).body).contains("conversation_id"));
}

TEST(MultiTurn, CompletionsTextGrowsByTheAnswerAndTheNewMessage) {
  BenchRequest first{.index = 0,
                     .prompt_json = "\"a b c\"",
                     .prompt_text = "a b c",
                     .input_len = 3,
                     .output_len = 2};
  BenchRequest turn{.index = 1,
                    .prompt_json = "\"d e\"",
                    .prompt_text = "d e",
                    .input_len = 2,
                    .output_len = 2,
                    .previous_turn = 0};
  const BenchRequest sent = compose_turn(first, "x \"y\"", turn, PromptFormat::kWords, false, 0);
  EXPECT_EQ(sent.prompt_text, "a b c x \"y\" d e");
  EXPECT_EQ(nlohmann::json::parse(sent.prompt_json).get<std::string>(), sent.prompt_text);
  EXPECT_EQ(sent.input_len, 3u + 2u + 2u);
  EXPECT_EQ(sent.index, 1u);
  EXPECT_TRUE(sent.messages_json.empty());
  // A failed turn (no answer): the next turn extends the prompt alone.
  EXPECT_EQ(compose_turn(first, "", turn, PromptFormat::kWords, false, 0).prompt_text, "a b c d e");
  // Invalid UTF-8 from a server does not throw.
  EXPECT_NO_THROW(compose_turn(first, "\xff\xfe", turn, PromptFormat::kWords, true, 0));
}

TEST(MultiTurn, ChatMessagesGrowAndTheRequestCarriesThem) {
  BenchRequest first{
      .prompt_json = "\"hello there\"", .prompt_text = "hello there", .input_len = 2};
  BenchRequest second{.index = 1, .prompt_text = "and more", .input_len = 2, .previous_turn = 0};
  BenchRequest third{.index = 2, .prompt_text = "last one", .input_len = 2, .previous_turn = 1};
  const BenchRequest s2 = compose_turn(first, "hi", second, PromptFormat::kWords, true, 0);
  const BenchRequest s3 = compose_turn(s2, "ok then", third, PromptFormat::kWords, true, 0);
  const nlohmann::json expected = nlohmann::json::array({
      {{"role", "user"}, {"content", "hello there"}},
      {{"role", "assistant"}, {"content", "hi"}},
      {{"role", "user"}, {"content", "and more"}},
      {{"role", "assistant"}, {"content", "ok then"}},
      {{"role", "user"}, {"content", "last one"}},
  });
  EXPECT_EQ(nlohmann::json::parse(s3.messages_json), expected);
  EXPECT_EQ(s3.input_len, 2u + 1u + 2u + 2u + 2u);
  const http::UpstreamRequest http =
      build_request({.path = "/v1/chat/completions", .chat = true, .model = "m"}, s3);
  EXPECT_EQ(nlohmann::json::parse(http.body)["messages"], expected);
}

TEST(MultiTurn, TokenIdsAppendAStableStandInForTheAnswer) {
  BenchRequest first{.prompt_json = "[1001,1002]", .input_len = 2};
  BenchRequest turn{.index = 1, .prompt_json = "[1003]", .input_len = 1, .previous_turn = 0};
  const BenchRequest a =
      compose_turn(first, "two words", turn, PromptFormat::kTokenIds, false, 2000);
  const BenchRequest b =
      compose_turn(first, "two words", turn, PromptFormat::kTokenIds, false, 2000);
  EXPECT_EQ(a.prompt_json, b.prompt_json);
  const auto v = ids(a.prompt_json);
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[0], 1001u);
  EXPECT_EQ(v[1], 1002u);
  EXPECT_EQ(v[4], 1003u);
  for (uint32_t id : v) {
    EXPECT_GE(id, kFirstTokenId);
    EXPECT_LT(id, 2000u);
  }
  EXPECT_EQ(a.input_len, 5u);
  EXPECT_EQ(ids(compose_turn(first, "", turn, PromptFormat::kTokenIds, false, 2000).prompt_json),
            (std::vector<uint32_t>{1001, 1002, 1003}));
}

TEST(MultiTurn, ValidateNamesTheBadFlagAndBoundsTheGrowingPrompts) {
  const WorkloadOptions workload;
  EXPECT_NE(
      validate(workload, MultiTurnOptions{.num_conversations = 0}).message().find("conversations"),
      std::string::npos);
  EXPECT_NE(validate(workload, MultiTurnOptions{.num_turns = 0}).message().find("num-turns"),
            std::string::npos);
  EXPECT_NE(validate(workload, MultiTurnOptions{.input_len = 0}).message().find("input-len"),
            std::string::npos);
  // 1000 turns of 1000 + 1000 tokens: ~1e9 tokens per conversation.
  EXPECT_NE(validate(workload, MultiTurnOptions{.num_conversations = 1,
                                                .num_turns = 1000,
                                                .input_len = 1000,
                                                .output_len = 1000})
                .message()
                .find("at most"),
            std::string::npos);
  EXPECT_TRUE(validate(workload, MultiTurnOptions{}));
}

TEST(PrefixOracle, CountsWholeBlocksOfAPrefixSentBefore) {
  PrefixOracle oracle(4);
  std::vector<uint64_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(oracle.add(a), 0u);
  EXPECT_EQ(oracle.add(a), 8u) << "two full blocks; the ninth token is a partial block";
  std::vector<uint64_t> b = {1, 2, 3, 4, 5, 6, 7, 0, 9, 9, 9, 9};
  EXPECT_EQ(oracle.add(b), 4u) << "the second block differs";
  std::vector<uint64_t> c = {0, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(oracle.add(c), 0u) << "blocks are chained: a later block matches only after its prefix";
  EXPECT_EQ(oracle.prompt_tokens(), 9u + 9u + 12u + 8u);
  EXPECT_EQ(oracle.hit_tokens(), 12u);
  EXPECT_DOUBLE_EQ(oracle.hit_rate(), 12.0 / 38.0);
}

TEST(PrefixOracle, KeysOfWordsAndTokenIds) {
  BenchRequest words_request{.prompt_text = "the cat  the"};
  const auto w = prompt_token_keys(words_request, PromptFormat::kWords);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], w[2]);
  EXPECT_NE(w[0], w[1]);
  BenchRequest ids_request{.prompt_json = "[1000,42,7]"};
  EXPECT_EQ(prompt_token_keys(ids_request, PromptFormat::kTokenIds),
            (std::vector<uint64_t>{1000, 42, 7}));
}

TEST(PrefixOracle, SharedPrefixWorkloadReachesTheExpectedRate) {
  // 4 prefixes of 64 tokens (4 blocks of 16), 40 requests: the first request over each prefix
  // misses, the other 36 hit its 64 tokens; suffixes of 16 never hit.
  const WorkloadOptions workload{.num_prompts = 40, .seed = 1};
  const auto requests = make_prefix_repetition_requests(
      workload, {.prefix_len = 64, .suffix_len = 16, .num_prefixes = 4, .output_len = 1});
  PrefixOracle oracle(16);
  for (const BenchRequest& r : requests) oracle.add(prompt_token_keys(r, PromptFormat::kWords));
  EXPECT_EQ(oracle.hit_tokens(), 36u * 64u);
  EXPECT_EQ(oracle.prompt_tokens(), 40u * 80u);
}

}  // namespace
}  // namespace pdr::loadgen
