#include "bench/loadgen/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>
#include <sstream>

namespace pdr::loadgen {
namespace {

size_t word_count(const std::string& text) {
  std::istringstream in(text);
  return static_cast<size_t>(std::distance(std::istream_iterator<std::string>(in),
                                           std::istream_iterator<std::string>()));
}

TEST(Workload, WordPromptsHaveExactlyInputLenWordsAndAreDistinct) {
  WorkloadOptions options{.num_prompts = 50, .input_len = 300, .output_len = 20, .seed = 7};
  ASSERT_TRUE(validate(options));
  const auto requests = make_random_requests(options);
  ASSERT_EQ(requests.size(), 50u);
  std::set<std::string> prompts;
  for (const BenchRequest& r : requests) {
    EXPECT_EQ(r.input_len, 300u);
    EXPECT_EQ(r.output_len, 20u);
    EXPECT_EQ(word_count(r.prompt_text), 300u);
    EXPECT_EQ(r.prompt_json, "\"" + r.prompt_text + "\"");
    prompts.insert(r.prompt_text.substr(0, 40));
  }
  EXPECT_EQ(prompts.size(), 50u) << "prompts share a 40-character prefix";
}

TEST(Workload, SameSeedSamePromptsOtherSeedOthers) {
  WorkloadOptions options{.num_prompts = 5, .input_len = 64, .seed = 1};
  const auto a = make_random_requests(options);
  const auto b = make_random_requests(options);
  options.seed = 2;
  const auto c = make_random_requests(options);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt_json, b[i].prompt_json);
    EXPECT_NE(a[i].prompt_json, c[i].prompt_json);
  }
}

TEST(Workload, TokenIdPromptsAreArraysOfIdsInTheVocabulary) {
  WorkloadOptions options{.num_prompts = 3, .input_len = 100, .format = PromptFormat::kTokenIds,
                          .vocab_size = 1200};
  ASSERT_TRUE(validate(options));
  for (const BenchRequest& r : make_random_requests(options)) {
    ASSERT_EQ(r.prompt_json.front(), '[');
    ASSERT_EQ(r.prompt_json.back(), ']');
    std::istringstream in(r.prompt_json.substr(1, r.prompt_json.size() - 2));
    std::string item;
    size_t count = 0;
    while (std::getline(in, item, ',')) {
      const long id = std::stol(item);
      EXPECT_GE(id, static_cast<long>(kFirstTokenId));
      EXPECT_LT(id, 1200);
      ++count;
    }
    EXPECT_EQ(count, 100u);
  }
}

TEST(Workload, RangeRatioBoundsTheLengths) {
  WorkloadOptions options{.num_prompts = 400, .input_len = 100, .output_len = 10,
                          .range_ratio = 0.5};
  uint32_t low = UINT32_MAX, high = 0;
  for (const BenchRequest& r : make_random_requests(options)) {
    low = std::min(low, r.input_len);
    high = std::max(high, r.input_len);
    EXPECT_GE(r.output_len, 5u);
    EXPECT_LE(r.output_len, 15u);
    EXPECT_EQ(word_count(r.prompt_text), r.input_len);
  }
  EXPECT_GE(low, 50u);
  EXPECT_LE(high, 150u);
  EXPECT_LT(low, 60u) << "400 draws should reach near the bottom of [50, 150]";
  EXPECT_GT(high, 140u);
}

TEST(Workload, ValidateNamesTheBadOption) {
  EXPECT_NE(validate({.num_prompts = 0}).message().find("--num-prompts"), std::string::npos);
  EXPECT_NE(validate({.input_len = 0}).message().find("--random-input-len"), std::string::npos);
  EXPECT_NE(validate({.output_len = 0}).message().find("--random-output-len"), std::string::npos);
  EXPECT_NE(validate({.range_ratio = 1.0}).message().find("--random-range-ratio"), std::string::npos);
  EXPECT_NE(validate({.range_ratio = std::nan("")}).message().find("--random-range-ratio"),
            std::string::npos);
  EXPECT_NE(validate({.format = PromptFormat::kTokenIds, .vocab_size = 10}).message().find("--vocab-size"),
            std::string::npos);
  EXPECT_NE(validate({.num_prompts = 1'000'000, .input_len = 1'000}).message().find("at most"),
            std::string::npos);
  EXPECT_TRUE(validate({.num_prompts = 200, .input_len = 7'500}));
}

TEST(Arrivals, InfiniteRateSendsEverythingAtOnce) {
  for (double rate : {0.0, static_cast<double>(INFINITY)}) {
    const auto offsets = arrival_offsets(10, rate, 1.0, 0);
    EXPECT_EQ(offsets, std::vector<double>(10, 0.0));
  }
}

// Mean gap 1/rate; the gaps' coefficient of variation is 1/sqrt(burstiness) for a gamma.
void check_gaps(double rate, double burstiness) {
  const uint32_t n = 20000;
  const auto offsets = arrival_offsets(n, rate, burstiness, 42);
  ASSERT_EQ(offsets.front(), 0.0);
  std::vector<double> gaps;
  for (uint32_t i = 1; i < n; ++i) gaps.push_back(offsets[i] - offsets[i - 1]);
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  const double cv = std::sqrt(var / gaps.size()) / mean;
  EXPECT_NEAR(mean, 1.0 / rate, 0.03 / rate) << "rate " << rate << " burstiness " << burstiness;
  EXPECT_NEAR(cv, 1.0 / std::sqrt(burstiness), 0.05) << "rate " << rate << " burstiness " << burstiness;
}

TEST(Arrivals, PoissonAndGammaGapsHaveTheRequestedMeanAndSpread) {
  check_gaps(2.0, 1.0);    // Poisson: exponential gaps, cv 1
  check_gaps(2.0, 100.0);  // the seed scenario: nearly regular, cv 0.1
  check_gaps(10.0, 0.5);   // burstier than Poisson
}

TEST(Arrivals, DeterministicForASeed) {
  EXPECT_EQ(arrival_offsets(50, 3.0, 1.0, 9), arrival_offsets(50, 3.0, 1.0, 9));
  EXPECT_NE(arrival_offsets(50, 3.0, 1.0, 9), arrival_offsets(50, 3.0, 1.0, 10));
}

}  // namespace
}  // namespace pdr::loadgen
