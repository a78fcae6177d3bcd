#include "proto/k8s_label_selector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

using testing::HasSubstr;

LabelSelector parsed(std::string_view text) {
  LabelSelector s;
  Status st = parse_label_selector(text, &s);
  EXPECT_TRUE(st) << text << ": " << st.to_string();
  return s;
}

bool matches(std::string_view text, const PodMetadataMap& labels) {
  return label_selector_matches(parsed(text), labels);
}

std::string error_of(std::string_view text) {
  LabelSelector s;
  s.text = "untouched";
  Status st = parse_label_selector(text, &s);
  EXPECT_FALSE(st) << text;
  EXPECT_EQ(s.text, "untouched");
  return st.message();
}

const PodMetadataMap kPrefillPod = {{"app", "vllm"}, {"llm-d.ai/role", "prefill"}, {"tier", "gpu"}};

TEST(LabelSelector, EqualityAndInequality) {
  EXPECT_TRUE(matches("app=vllm", kPrefillPod));
  EXPECT_TRUE(matches("app==vllm", kPrefillPod));
  EXPECT_FALSE(matches("app=sglang", kPrefillPod));
  EXPECT_TRUE(matches("app!=sglang", kPrefillPod));
  EXPECT_FALSE(matches("app!=vllm", kPrefillPod));
  EXPECT_TRUE(matches("zone!=a", kPrefillPod));  // != holds for a pod without the label
  EXPECT_FALSE(matches("zone=", kPrefillPod));    // = "" needs the label, with an empty value
  EXPECT_TRUE(matches("zone=", {{"zone", ""}}));
}

TEST(LabelSelector, SetsAndExistence) {
  EXPECT_TRUE(matches("llm-d.ai/role in (prefill,both)", kPrefillPod));
  EXPECT_TRUE(matches("llm-d.ai/role in ( both , prefill )", kPrefillPod));
  EXPECT_FALSE(matches("llm-d.ai/role in (decode)", kPrefillPod));
  EXPECT_TRUE(matches("llm-d.ai/role notin (decode)", kPrefillPod));
  EXPECT_FALSE(matches("llm-d.ai/role notin (decode,prefill)", kPrefillPod));
  EXPECT_TRUE(matches("zone notin (a)", kPrefillPod));  // notin holds without the label
  EXPECT_FALSE(matches("zone in (a)", kPrefillPod));
  EXPECT_TRUE(matches("tier", kPrefillPod));
  EXPECT_FALSE(matches("zone", kPrefillPod));
  EXPECT_TRUE(matches("!zone", kPrefillPod));
  EXPECT_FALSE(matches("! tier", kPrefillPod));
}

TEST(LabelSelector, CommaIsAnd) {
  EXPECT_TRUE(matches("app=vllm,llm-d.ai/role in (prefill),tier,!zone", kPrefillPod));
  EXPECT_FALSE(matches("app=vllm,llm-d.ai/role=decode", kPrefillPod));
  EXPECT_TRUE(matches(" app = vllm , tier ", kPrefillPod));
  EXPECT_TRUE(matches("", kPrefillPod));  // empty: every pod
  EXPECT_TRUE(matches("", {}));
  const LabelSelector s = parsed("a=b,c in (d,e),!f");
  ASSERT_EQ(s.requirements.size(), 3u);
  EXPECT_EQ(s.requirements[1].op, LabelOp::kIn);
  EXPECT_EQ(s.requirements[1].values, (std::vector<std::string>{"d", "e"}));
  EXPECT_EQ(s.requirements[2].op, LabelOp::kNotExists);
  EXPECT_EQ(s.text, "a=b,c in (d,e),!f");
}

TEST(LabelSelector, MalformedSelectorsAreRefusedWithWhereAndWhat) {
  EXPECT_THAT(error_of("app=vllm,"), HasSubstr("label selector at 9: expected a label key, found the end"));
  EXPECT_THAT(error_of(",app"), HasSubstr("at 0: expected a label key, found ','"));
  EXPECT_THAT(error_of("app in (a,b"), HasSubstr("at 11: expected ',' or ')', found the end"));
  EXPECT_THAT(error_of("app in a"), HasSubstr("expected '('"));
  EXPECT_THAT(error_of("app in ()"), HasSubstr("expected a label value in the set, found ')'"));
  EXPECT_THAT(error_of("app vllm"), HasSubstr("at 4: expected '=', '==', '!=', 'in', 'notin', ',' or the end"));
  EXPECT_THAT(error_of("app=a b"), HasSubstr("at 6: expected ',' or the end, found 'b'"));
  EXPECT_THAT(error_of("replicas>1"), HasSubstr("< and > are not supported"));
  EXPECT_THAT(error_of("-app=x"), HasSubstr("not a label key"));
  EXPECT_THAT(error_of("Bad_Prefix.io/app=x"), HasSubstr("not a label key"));
  EXPECT_THAT(error_of("/app=x"), HasSubstr("not a label key"));
  EXPECT_THAT(error_of("app=-x"), HasSubstr("not a label value"));
  EXPECT_THAT(error_of("app=" + std::string(64, 'v')), HasSubstr("not a label value"));
  EXPECT_THAT(error_of(std::string(64, 'k')), HasSubstr("not a label key"));
  EXPECT_THAT(error_of("app=(x)"), HasSubstr("expected a label value, found '('"));
  EXPECT_THAT(error_of("!app=x"), HasSubstr("expected ',' or the end, found '='"));
  LabelSelector s;
  EXPECT_EQ(parse_label_selector(std::string(kMaxLabelSelectorBytes + 1, 'a'), &s).code(), StatusCode::kTooLarge);
}

}  // namespace
}  // namespace pdr::proto
