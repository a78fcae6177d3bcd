#include "proto/json_splice.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdio>
#include <string>

namespace pdr::proto {
namespace {

JsonObjectBody Parse(std::string_view text) {
  JsonObjectBody body;
  const Status st = JsonObjectBody::parse(text, JsonLimits(), &body);
  EXPECT_TRUE(st.is_ok()) << st.to_string() << " for " << text;
  return body;
}

std::string Edit(std::string_view text, const std::function<void(JsonObjectBody*)>& f) {
  JsonObjectBody body = Parse(text);
  f(&body);
  std::string out = body.render();
  EXPECT_TRUE(nlohmann::json::accept(out)) << out;
  return out;
}

TEST(JsonSplice, NoEditsRoundTripsBytesExactly) {
  const std::string text = " \n{ \"a\" : 1 ,\t\"b\":[1, {\"c\": \"\\u00e9\\n\"}] , \"d\" : {} }\r\n ";
  EXPECT_EQ(Parse(text).render(), text);
}

TEST(JsonSplice, ReplaceInPlaceKeepsWhitespaceAndOthers) {
  EXPECT_EQ(Edit("{ \"max_tokens\" :  100 , \"prompt\": \"hi\" }",
                 [](JsonObjectBody* b) { b->set_raw("max_tokens", "1"); }),
            "{ \"max_tokens\" :  1 , \"prompt\": \"hi\" }");
}

TEST(JsonSplice, AppendBeforeFinalBrace) {
  EXPECT_EQ(Edit("{\"a\":1}\n", [](JsonObjectBody* b) { b->set_raw("stream", "false"); }),
            "{\"a\":1,\"stream\":false}\n");
  EXPECT_EQ(Edit("{\"a\":1 \n}", [](JsonObjectBody* b) {
              b->set_raw("x", "1");
              b->set_raw("y", "[2]");
              b->set_raw("x", "3");  // replaces the appended value
            }),
            "{\"a\":1 \n,\"x\":3,\"y\":[2]}");
}

TEST(JsonSplice, AppendToEmptyObject) {
  EXPECT_EQ(Edit("{}", [](JsonObjectBody* b) { b->set_raw("k", "true"); }), "{\"k\":true}");
  EXPECT_EQ(Edit(" { \n } ", [](JsonObjectBody* b) {
              b->set_raw("k", "true");
              b->set_raw("j", "null");
            }),
            " { \n \"k\":true,\"j\":null} ");
}

TEST(JsonSplice, RemoveFirstMiddleLastOnly) {
  const std::string text = "{\"a\": 1, \"b\": 2, \"c\": 3}";
  EXPECT_EQ(Edit(text, [](JsonObjectBody* b) { b->remove("a"); }), "{\"b\": 2, \"c\": 3}");
  EXPECT_EQ(Edit(text, [](JsonObjectBody* b) { b->remove("b"); }), "{\"a\": 1, \"c\": 3}");
  EXPECT_EQ(Edit(text, [](JsonObjectBody* b) { b->remove("c"); }), "{\"a\": 1, \"b\": 2}");
  EXPECT_EQ(Edit(text, [](JsonObjectBody* b) {
              b->remove("a");
              b->remove("c");
            }),
            "{\"b\": 2}");
  EXPECT_EQ(Edit(text, [](JsonObjectBody* b) {
              b->remove("a");
              b->remove("b");
              b->remove("c");
            }),
            "{}");
  EXPECT_EQ(Edit("{ \"only\" : {\"x\":1} }", [](JsonObjectBody* b) { b->remove("only"); }), "{  }");
  EXPECT_EQ(Edit(text, [](JsonObjectBody* b) { b->remove("zzz"); }), text);
}

TEST(JsonSplice, RemoveAllThenAppend) {
  EXPECT_EQ(Edit("{\"a\":1,\"b\":2}", [](JsonObjectBody* b) {
              b->remove("a");
              b->remove("b");
              b->set_raw("c", "3");
            }),
            "{\"c\":3}");
  EXPECT_EQ(Edit("{\"a\":1,\"b\":2}", [](JsonObjectBody* b) {
              b->remove("b");
              b->set_raw("b", "\"x\"");  // re-added at the end
            }),
            "{\"a\":1,\"b\":\"x\"}");
}

TEST(JsonSplice, RemoveAppendedMember) {
  EXPECT_EQ(Edit("{\"a\":1}", [](JsonObjectBody* b) {
              b->set_raw("x", "1");
              b->remove("x");
            }),
            "{\"a\":1}");
}

TEST(JsonSplice, NestedObjectsAndEscapesUntouched) {
  const std::string text =
      R"({"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/"}],)"
      R"("max_tokens":5,"nested":{"max_tokens":7,"stream":true}})";
  const std::string out = Edit(text, [](JsonObjectBody* b) {
    b->set_raw("max_tokens", "1");
    b->set_raw("stream", "false");
  });
  EXPECT_EQ(out,
            R"({"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/"}],)"
            R"("max_tokens":1,"nested":{"max_tokens":7,"stream":true},"stream":false})");
}

TEST(JsonSplice, EscapedKeysAreMatchedUnescaped) {
  JsonObjectBody b = Parse(R"({"\u006dax_tokens": 9})");
  std::optional<int64_t> v;
  ASSERT_TRUE(b.get_int("max_tokens", &v).is_ok());
  EXPECT_EQ(v, 9);
  b.set_raw("max_tokens", "1");
  EXPECT_EQ(b.render(), R"({"\u006dax_tokens": 1})");
}

TEST(JsonSplice, DuplicateKeysRejected) {
  JsonObjectBody b;
  Status st = JsonObjectBody::parse(R"({"a":1,"b":2,"a":3})", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidValue) << st.to_string();
  EXPECT_NE(st.message().find("duplicate top-level key \"a\""), std::string::npos) << st.message();
  st = JsonObjectBody::parse(R"({"max_tokens":1,"m\u0061x_tokens":3})", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidValue) << st.to_string();
  // Duplicates below the top level are not our business.
  EXPECT_TRUE(JsonObjectBody::parse(R"({"a":{"x":1,"x":2}})", JsonLimits(), &b).is_ok());
}

TEST(JsonSplice, DuplicateReportIsTheSmallestKeyAtItsSecondOccurrence) {
  JsonObjectBody b;
  // Two duplicated keys: "a" (smaller) is reported, at its second occurrence (byte 19).
  Status st = JsonObjectBody::parse(R"({"b":1,"a":2,"b":3,"a":4,"a":5})", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidValue);
  EXPECT_NE(st.message().find("key \"a\" at byte 19 "), std::string::npos) << st.message();
  // The same past the pairwise check's size (sorted there).
  std::string big = "{";
  for (int i = 0; i < 100; ++i) big += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  const size_t second = big.size();
  big += R"("k7":0,"k50":1})";
  st = JsonObjectBody::parse(big, JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidValue);
  EXPECT_NE(st.message().find("key \"k50\" at byte " + std::to_string(second + 7) + " "), std::string::npos)
      << st.message();
  big.replace(second, 6, R"("k7x":0)");  // "k50" is still there twice
  EXPECT_EQ(JsonObjectBody::parse(big, JsonLimits(), &b).code(), StatusCode::kInvalidValue);
  big.replace(big.rfind("k50"), 3, "k5Z");
  EXPECT_TRUE(JsonObjectBody::parse(big, JsonLimits(), &b).is_ok());
  EXPECT_EQ(b.size(), 102u);
}

TEST(JsonSplice, CopiesEditApartAndKeepEscapedKeys) {
  JsonObjectBody client = Parse(R"({"\u006dodel":"m","max_tokens":5,"p":[1]})");
  JsonObjectBody prefill = client;
  JsonObjectBody decode = client;
  prefill.set_raw("max_tokens", "1");
  prefill.set_raw("kv", R"({"x":1})");
  decode.remove("model");
  decode.set_raw("kv", "null");
  client = JsonObjectBody();  // the copies keep the document and the unescaped key
  EXPECT_EQ(prefill.render(), R"({"\u006dodel":"m","max_tokens":1,"p":[1],"kv":{"x":1}})");
  EXPECT_EQ(decode.render(), R"({"max_tokens":5,"p":[1],"kv":null})");
  std::optional<std::string> model;
  ASSERT_TRUE(prefill.get_string("model", &model).is_ok());
  EXPECT_EQ(model, "m");
  EXPECT_EQ(prefill.original().data(), decode.original().data()) << "one shared document";
}

TEST(JsonSplice, SetRawFromItsOwnEditedValue) {
  JsonObjectBody b = Parse(R"({"a":1})");
  b.set_raw("a", R"("a long enough value to live outside any small buffer")");
  for (int i = 0; i < 20; ++i) {  // edits grow their buffer while the value is read from it
    b.set_raw("k" + std::to_string(i), *b.get_raw(i == 0 ? "a" : "k" + std::to_string(i - 1)));
    b.set_raw("a", *b.get_raw("a"));
  }
  EXPECT_EQ(b.get_raw("k19"), R"("a long enough value to live outside any small buffer")");
  EXPECT_EQ(b.get_raw("a"), b.get_raw("k0"));
  EXPECT_TRUE(nlohmann::json::accept(b.render()));
}

TEST(JsonSplice, AppendedRemovedThenSetAgainGoesLast) {
  EXPECT_EQ(Edit(R"({"a":1})",
                 [](JsonObjectBody* b) {
                   b->set_raw("x", "1");
                   b->set_raw("y", "2");
                   b->remove("x");
                   EXPECT_EQ(b->size(), 2u);
                   b->set_raw("x", "3");
                   b->set_raw("y", "4");
                 }),
            R"({"a":1,"y":4,"x":3})");
}

TEST(JsonSplice, MovedFromBodyIsEmpty) {
  JsonObjectBody a = Parse(R"({"a":1})");
  a.set_raw("b", "2");
  JsonObjectBody b = std::move(a);
  EXPECT_EQ(b.render(), R"({"a":1,"b":2})");
  EXPECT_EQ(a.render(), "");  // NOLINT(bugprone-use-after-move): the contract under test
  EXPECT_EQ(a.size(), 0u);
  EXPECT_FALSE(a.has("a"));
  JsonObjectBody c;
  c = std::move(b);
  EXPECT_EQ(c.render(), R"({"a":1,"b":2})");
  EXPECT_EQ(b.render(), "");  // NOLINT(bugprone-use-after-move)
}

TEST(JsonSplice, ParseBorrowedRefersToTheCallersBytes) {
  const std::string text = R"({"kv_transfer_params":{"id":"x"},"n":1})";
  JsonObjectBody b;
  ASSERT_TRUE(JsonObjectBody::parse_borrowed(text, JsonLimits(), &b).is_ok());
  EXPECT_EQ(b.original().data(), text.data());
  EXPECT_EQ(b.get_raw("kv_transfer_params"), R"({"id":"x"})");
  EXPECT_EQ(JsonObjectBody::parse_borrowed(R"({"a":1,"a":2})", JsonLimits(), &b).code(),
            StatusCode::kInvalidValue);
}

TEST(JsonSplice, InvalidJsonReportsOffset) {
  JsonObjectBody b;
  Status st = JsonObjectBody::parse(R"({"model": "m", "x" 1})", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kMalformed);
  EXPECT_NE(st.message().find("invalid JSON at byte 19: expected ':'"), std::string::npos)
      << st.message();
  st = JsonObjectBody::parse("{\"a\":1,}", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kMalformed);
  EXPECT_NE(st.message().find("at byte 7"), std::string::npos) << st.message();
  st = JsonObjectBody::parse("{\"a\":1} x", JsonLimits(), &b);
  EXPECT_NE(st.message().find("at byte 8"), std::string::npos) << st.message();
  st = JsonObjectBody::parse("{\"a\":\"unterminated", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kMalformed);
  st = JsonObjectBody::parse("", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kMalformed);
  st = JsonObjectBody::parse("{\"a\":01}", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kMalformed) << st.to_string();
  st = JsonObjectBody::parse("{\"a\":\"\xff\"}", JsonLimits(), &b);  // bad UTF-8 (simdjson)
  EXPECT_EQ(st.code(), StatusCode::kMalformed) << st.to_string();
  EXPECT_NE(st.message().find("UTF"), std::string::npos) << st.message();
}

TEST(JsonSplice, NotAnObject) {
  JsonObjectBody b;
  Status st = JsonObjectBody::parse(" [1,2]", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kWrongType);
  EXPECT_EQ(st.message(), "JSON body must be an object, got an array");
  st = JsonObjectBody::parse("\"s\"", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kWrongType);
}

TEST(JsonSplice, Limits) {
  JsonLimits limits;
  limits.max_bytes = 10;
  JsonObjectBody b;
  EXPECT_EQ(JsonObjectBody::parse(R"({"abcdefgh":1})", limits, &b).code(), StatusCode::kTooLarge);
  limits = JsonLimits();
  limits.max_depth = 3;
  EXPECT_TRUE(JsonObjectBody::parse(R"({"a":[{"b":1}]})", limits, &b).is_ok());
  const Status st = JsonObjectBody::parse(R"({"a":[{"b":[1]}]})", limits, &b);
  EXPECT_EQ(st.code(), StatusCode::kTooDeep) << st.to_string();
  std::string deep(100000, '[');
  deep = "{\"a\":" + deep;
  EXPECT_EQ(JsonObjectBody::parse(deep, JsonLimits(), &b).code(), StatusCode::kTooDeep);
}

TEST(JsonSplice, TypedGetters) {
  JsonObjectBody b =
      Parse(R"({"i":-42,"f":1.5,"e":1e3,"big":9223372036854775808,"t":true,"n":null,)"
            R"("s":"a\"b\u00e9\ud83d\ude00","o":{}})");
  std::optional<int64_t> i;
  ASSERT_TRUE(b.get_int("i", &i).is_ok());
  EXPECT_EQ(i, -42);
  ASSERT_TRUE(b.get_int("absent", &i).is_ok());
  EXPECT_FALSE(i);
  Status st = b.get_int("f", &i);
  EXPECT_EQ(st.code(), StatusCode::kWrongType);
  EXPECT_EQ(st.message(), "f must be an integer, got 1.5");
  EXPECT_EQ(b.get_int("e", &i).code(), StatusCode::kWrongType);
  EXPECT_EQ(b.get_int("s", &i).code(), StatusCode::kWrongType);
  EXPECT_EQ(b.get_int("n", &i).code(), StatusCode::kWrongType);
  EXPECT_EQ(b.get_int("big", &i).code(), StatusCode::kOutOfRange);
  std::optional<bool> t;
  ASSERT_TRUE(b.get_bool("t", &t).is_ok());
  EXPECT_EQ(t, true);
  EXPECT_EQ(b.get_bool("i", &t).code(), StatusCode::kWrongType);
  std::optional<std::string> s;
  ASSERT_TRUE(b.get_string("s", &s).is_ok());
  EXPECT_EQ(*s, "a\"b\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(b.is_null("n"));
  EXPECT_FALSE(b.is_null("o"));
  EXPECT_EQ(b.get_raw("o"), "{}");
  EXPECT_EQ(b.size(), 8u);
}

TEST(JsonSplice, NumbersBeyond64BitsAreRejectedBySimdjson) {
  JsonObjectBody b;
  const Status st = JsonObjectBody::parse(R"({"seed":99999999999999999999})", JsonLimits(), &b);
  EXPECT_EQ(st.code(), StatusCode::kMalformed);
  EXPECT_NE(st.message().find("number"), std::string::npos) << st.message();
}

TEST(JsonSplice, BuildersEscape) {
  EXPECT_EQ(json_string("a\"b\\c\n\x01\x7f\xc3\xa9"), "\"a\\\"b\\\\c\\n\\u0001\\u007f\xc3\xa9\"");
  const std::string obj = JsonObjectWriter()
                              .string("k\"ey", "v\nal")
                              .integer("i", -3)
                              .boolean("b", false)
                              .null("n")
                              .raw("r", "[1]")
                              .finish();
  const auto j = nlohmann::json::parse(obj);
  EXPECT_EQ(j["k\"ey"], "v\nal");
  EXPECT_EQ(j["i"], -3);
  EXPECT_EQ(j["b"], false);
  EXPECT_TRUE(j["n"].is_null());
  EXPECT_EQ(JsonObjectWriter().finish(), "{}");
  // Appended keys are escaped too.
  EXPECT_EQ(Edit("{}", [](JsonObjectBody* b) { b->set_raw("a\"b", "1"); }), "{\"a\\\"b\":1}");
}

}  // namespace
}  // namespace pdr::proto

namespace pdr::proto {
namespace {

// The string scanner skips 8 bytes at a time: a control character, a quote or an escape at any
// offset of any word must still be found.
TEST(JsonSpliceStrings, SpecialBytesAreFoundAtEveryOffset) {
  for (size_t len = 1; len < 40; ++len) {
    // Non-ASCII bytes (UTF-8 "é" at p, p + 1) are plain too.
    std::string plain(len, 'x');
    const size_t p = len / 2;
    const bool utf8 = p + 1 < len;
    if (utf8) plain.replace(p, 2, "\xc3\xa9");
    for (size_t at = 0; at < len; ++at) {
      if (utf8 && (at == p || at == p + 1)) continue;  // would cut the UTF-8 pair
      std::string with_control = plain;
      with_control[at] = '\x01';
      JsonObjectBody body;
      const Status bad = JsonObjectBody::parse("{\"k\":\"" + with_control + "\"}", JsonLimits{}, &body);
      EXPECT_EQ(bad.code(), StatusCode::kMalformed) << len << " " << at;
      std::string escaped = plain;
      escaped.replace(at, 1, "\\\"");
      ASSERT_TRUE(JsonObjectBody::parse("{\"k\":\"" + escaped + "\",\"n\":1}", JsonLimits{}, &body).is_ok())
          << len << " " << at;
      std::optional<std::string> value;
      ASSERT_TRUE(body.get_string("k", &value).is_ok());
      std::string expected = plain;
      expected[at] = '"';
      EXPECT_EQ(value, expected) << len << " " << at;
      std::optional<int64_t> n;
      ASSERT_TRUE(body.get_int("n", &n).is_ok());
      EXPECT_EQ(n, 1);
    }
  }
}

// The outcome (code and message) of parse() when simdjson runs on every document, as before the
// scanner decided alone on plain ones.
Status ParseWithSimdjsonAlways(std::string_view text, const JsonLimits& limits) {
  set_json_simdjson_on_every_parse(true);
  JsonObjectBody body;
  Status st = JsonObjectBody::parse(text, limits, &body);
  set_json_simdjson_on_every_parse(false);
  return st;
}

TEST(JsonSplice, ScannerAloneDecidesAsSimdjsonWouldOnEdgeCases) {
  // Each: the outcome must not depend on whether simdjson ran (codes and messages).
  const std::string cases[] = {
      "{\"a\":1}", "{\"a\":\"\\ud83d\\ude00\"}", "{\"a\":\"\\ud83d\"}", "{\"a\":\"\\ude00\"}",
      "{\"a\":\"\\uD800x\"}", "{\"a\":\"\\ud7ff\\ue000\"}", "{\"a\":\"\\ud83d\\u0041\"}",
      "{\"a\":\"\\u0000\"}", "{\"a\":\"\xc3\xa9\"}", "{\"a\":\"\xc3\"}", "{\"a\":\"\xed\xa0\x80\"}",
      "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xf4\x90\x80\x80\"}", "{\"a\":\"\xff\"}", "\xef\xbb\xbf{}",
      "{\"a\":9223372036854775807}", "{\"a\":9223372036854775808}", "{\"a\":18446744073709551615}",
      "{\"a\":18446744073709551616}", "{\"a\":-9223372036854775808}", "{\"a\":-9223372036854775809}",
      "{\"a\":123456789012345678}", "{\"a\":1e308}", "{\"a\":1e309}", "{\"a\":-1.8e308}",
      "{\"a\":1e-400}", "{\"a\":0e999999}", "{\"a\":1.7976931348623157e308}", "{\"a\":1.8e308}",
      "{\"a\":1E+99}", "{\"a\":1e100}", "{\"a\":999999999999999999e99}",
      "{\"a\":3.14159265358979323846264338327950288}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":-}",
      "{\"a\":1,\"a\":2}", "{\"a\":1,\"\\u0061\":2}", "[1e400]", "1e400", "\"\\ud800\"", "[]", "",
      "{\"a\":[[[[[[[[1]]]]]]]]}", "{\"a\":\"\t\"}", "{\"a\":\"\\x\"}", "{\"a\":tru}",
      "{\"a\":\"\x7f\"}", std::string("{\"a\":\"\0\"}", 9), std::string("{}\0", 3)};
  for (const std::string& text : cases) {
    for (size_t depth : {size_t{3}, size_t{8}, size_t{9}, size_t{10}, size_t{64}}) {
      JsonLimits limits;
      limits.max_depth = depth;
      JsonObjectBody body;
      const Status fast = JsonObjectBody::parse(text, limits, &body);
      const Status reference = ParseWithSimdjsonAlways(text, limits);
      EXPECT_EQ(fast.code(), reference.code()) << text << " depth " << depth;
      EXPECT_EQ(fast.message(), reference.message()) << text << " depth " << depth;
    }
  }
  // A few the fast path must reject for simdjson's reasons (not the scanner's).
  for (const char* bad : {"{\"a\":\"\\ud83d\"}", "{\"a\":18446744073709551616}", "{\"a\":1e309}",
                          "{\"a\":\"\xed\xa0\x80\"}"}) {
    JsonObjectBody body;
    const Status st = JsonObjectBody::parse(bad, JsonLimits(), &body);
    EXPECT_EQ(st.code(), StatusCode::kMalformed) << bad;
    EXPECT_EQ(st.message().rfind("invalid JSON: ", 0), 0u) << st.message();
  }
}

TEST(JsonSplice, ScannerAloneDecidesAsSimdjsonWouldOnMutatedDocuments) {
  // Deterministic mutations (byte changes, insertions of the bytes that matter, cuts) of bodies
  // with every kind of value: each outcome must equal the one with simdjson on every parse.
  const std::string seeds[] = {
      "{\"model\":\"m\",\"prompt\":\"caf\xc3\xa9 \\ud83d\\ude00 \\n\",\"max_tokens\":16,"
      "\"temperature\":0.7,\"top_p\":1e-2,\"stop\":[\"\\n\"],\"x\":{\"y\":[null,true,false]}}",
      "{\"kv_transfer_params\":{\"remote_block_ids\":[1,2,3],\"remote_engine_id\":\"e\",\"tp_size\":1,"
      "\"n\":-12345678901234567,\"f\":1.5E+30}}"};
  const char inserts[] = {'"', '\\', 'u', 'd', '8', 'e', '9', '0', '.', '-', '[', '{', '}', ']', ',',
                          ':', ' ', '\x80', '\xc3', '\xed', '\xf4', '\x01'};
  uint64_t state = 12345;
  auto next = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>(state >> 33);
  };
  JsonLimits limits;
  limits.max_depth = 4;
  for (int i = 0; i < 20000; ++i) {
    std::string text = seeds[next() % 2];
    for (size_t edits = 1 + next() % 3; edits > 0; --edits) {
      const size_t at = next() % text.size();
      switch (next() % 4) {
        case 0: text[at] = inserts[next() % sizeof(inserts)]; break;
        case 1: text.insert(at, 1, inserts[next() % sizeof(inserts)]); break;
        case 2: text.insert(at, std::string(1 + next() % 25, static_cast<char>('0' + next() % 10))); break;
        default: text.erase(at, 1 + next() % 3); break;
      }
      if (text.empty()) text = "{";
    }
    JsonObjectBody body;
    const Status fast = JsonObjectBody::parse(text, limits, &body);
    const Status reference = ParseWithSimdjsonAlways(text, limits);
    ASSERT_EQ(fast.code(), reference.code()) << text;
    ASSERT_EQ(fast.message(), reference.message()) << text;
  }
}

TEST(JsonSplice, PlainDocumentsAreValidatedWithoutSimdjson) {
  JsonObjectBody body;
  const uint64_t before = json_simdjson_runs();
  ASSERT_TRUE(JsonObjectBody::parse(
                  "{\"model\":\"m\",\"prompt\":\"caf\xc3\xa9 \\u00e9 \\ud83d\\ude00\",\"max_tokens\":16,"
                  "\"temperature\":0.7,\"top_p\":1e-2,\"stop\":[\"\\n\"],\"x\":{\"y\":[null,true]}}",
                  JsonLimits(), &body)
                  .is_ok());
  EXPECT_EQ(json_simdjson_runs(), before) << "a usual request body: the scanner alone";
  ASSERT_FALSE(JsonObjectBody::parse("{\"a\":}", JsonLimits(), &body).is_ok());
  EXPECT_EQ(json_simdjson_runs(), before + 1) << "a rejected one: simdjson too, for the message";
  ASSERT_TRUE(JsonObjectBody::parse("{\"a\":12345678901234567890}", JsonLimits(), &body).is_ok());
  EXPECT_EQ(json_simdjson_runs(), before + 2) << "a long number: simdjson's verdict";
}

TEST(JsonSplice, MemberOfParsedBodyIsIndexedWithoutValidation) {
  JsonObjectBody answer, params;
  ASSERT_TRUE(JsonObjectBody::parse(
                  "{\"kv\":{\"b\":[1,2],\"e\":\"\\ud83d\\ude00\",\"n\":1e300},"
                  "\"d\":{\"x\":1,\"x\":2}}",
                  JsonLimits(), &answer)
                  .is_ok());
  const uint64_t before = json_simdjson_runs();
  ASSERT_TRUE(JsonObjectBody::parse_member_borrowed(*answer.get_raw("kv"), JsonLimits(), &params).is_ok());
  EXPECT_EQ(json_simdjson_runs(), before);
  EXPECT_EQ(params.get_raw("b"), "[1,2]");
  EXPECT_EQ(params.size(), 3u);
  // The rules of parse_borrowed still hold: duplicate keys, not an object.
  const Status dup = JsonObjectBody::parse_member_borrowed(*answer.get_raw("d"), JsonLimits(), &params);
  JsonObjectBody reference;
  const Status dup_reference = JsonObjectBody::parse_borrowed(*answer.get_raw("d"), JsonLimits(), &reference);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidValue);
  EXPECT_EQ(dup.message(), dup_reference.message());
  EXPECT_EQ(JsonObjectBody::parse_member_borrowed("[1]", JsonLimits(), &params).code(),
            StatusCode::kWrongType);
}

// Values of an indexed member are skipped by brackets and quotes: brackets inside strings,
// escaped quotes, nested containers and bare scalars end where parse_borrowed says they do.
TEST(JsonSplice, MemberIndexSkipsNestedValuesLikeTheFullScan) {
  const std::string docs[] = {
      R"({"kv":{"a":"x]}\"{[","b":[1,{"c":"]"},[[]],"}"],"d":-1.5e3,"e":true,"f":null,"g":{}}})",
      R"({"kv":{ "a" : [ 1 , 2 ] , "b" :"\\" ,"c":{ "x" : { "y" : "\"}" } } }})",
      R"({"kv":{"only":0}})",
      R"({"kv":{}})",
  };
  for (const std::string& doc : docs) {
    JsonObjectBody answer, indexed, reference;
    ASSERT_TRUE(JsonObjectBody::parse(doc, JsonLimits(), &answer).is_ok()) << doc;
    const std::string_view kv = *answer.get_raw("kv");
    ASSERT_TRUE(JsonObjectBody::parse_member_borrowed(kv, JsonLimits(), &indexed).is_ok()) << doc;
    ASSERT_TRUE(JsonObjectBody::parse_borrowed(kv, JsonLimits(), &reference).is_ok()) << doc;
    EXPECT_EQ(indexed.size(), reference.size()) << doc;
    for (const char* key : {"a", "b", "c", "d", "e", "f", "g", "only"}) {
      EXPECT_EQ(indexed.get_raw(key), reference.get_raw(key)) << doc << " " << key;
    }
    EXPECT_EQ(indexed.render(), reference.render()) << doc;
  }
}

// Bodies reuse the tables of bodies gone (per-thread spares): copies, edits and parses after one
// another stay independent.
TEST(JsonSplice, BodiesReusingStorageStayIndependent) {
  JsonObjectBody client;
  ASSERT_TRUE(JsonObjectBody::parse(R"({"a":1,"b":"x"})", JsonLimits(), &client).is_ok());
  for (int round = 0; round < 3; ++round) {
    std::vector<JsonObjectBody> legs(3, client);
    legs[0].set_raw("a", "2");
    legs[1].set_raw("c", "[3]");
    legs[2].remove("b");
    EXPECT_EQ(legs[0].render(), R"({"a":2,"b":"x"})");
    EXPECT_EQ(legs[1].render(), R"({"a":1,"b":"x","c":[3]})");
    EXPECT_EQ(legs[2].render(), R"({"a":1})");
    JsonObjectBody copy = legs[1];
    legs.clear();  // their storage goes to the spares
    EXPECT_EQ(copy.render(), R"({"a":1,"b":"x","c":[3]})");
    JsonObjectBody fresh;
    fresh.set_raw("z", "0");  // a body built from nothing takes spare storage too
    EXPECT_EQ(fresh.get_raw("z"), "0");
  }
  EXPECT_EQ(client.render(), R"({"a":1,"b":"x"})");
}

TEST(JsonSplice, StringBuilderEscapesEveryByteAsBefore) {
  // The escaping rules byte by byte (the builder copies unescaped bytes in runs).
  auto reference = [](std::string_view s) {
    std::string out = "\"";
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '"') out += "\\\"";
      else if (c == '\\') out += "\\\\";
      else if (c == '\b') out += "\\b";
      else if (c == '\f') out += "\\f";
      else if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else if (c == '\t') out += "\\t";
      else if (c < 0x20 || c == 0x7f) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "\\u%04x", c);
        out += hex;
      } else {
        out.push_back(ch);
      }
    }
    return out + "\"";
  };
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  for (const std::string& s : {all, std::string("plain text"), std::string(), std::string("a\"b"),
                               std::string("\x01"), std::string("tail\\"), std::string("\"head")}) {
    EXPECT_EQ(json_string(s), reference(s));
    std::string appended = "x";
    append_json_string(appended, s);
    EXPECT_EQ(appended, "x" + reference(s));
  }
  // Every byte at every offset of plain strings up to 17 bytes (the builder looks at 8 at once).
  for (size_t len = 1; len <= 17; ++len) {
    for (size_t at = 0; at < len; ++at) {
      for (int c = 0; c < 256; ++c) {
        std::string s(len, 'a');
        s[at] = static_cast<char>(c);
        ASSERT_EQ(json_string(s), reference(s)) << len << " " << at << " " << c;
      }
    }
  }
}

}  // namespace
}  // namespace pdr::proto
