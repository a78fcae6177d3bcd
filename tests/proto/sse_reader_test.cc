#include "proto/sse_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pdr::proto {
namespace {

struct Seen {
  std::string event, data, id;
  bool operator==(const Seen&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Seen& s) {
  return os << "{event=" << s.event << " data=" << s.data << " id=" << s.id << "}";
}

// Feeds `pieces` in order and returns the events seen; *status gets the last feed's status.
std::vector<Seen> read_all(SseReader& reader, const std::vector<std::string_view>& pieces,
                           Status* status = nullptr) {
  std::vector<Seen> seen;
  Status last;
  for (std::string_view piece : pieces) {
    last = reader.feed(piece, [&](const SseEvent& e) {
      seen.push_back({std::string(e.event), std::string(e.data), std::string(e.id)});
    });
  }
  if (status) *status = last;
  return seen;
}

std::vector<Seen> read_whole(std::string_view body, Status* status = nullptr,
                             size_t limit = SseReader::kDefaultMaxEventBytes) {
  SseReader reader(limit);
  return read_all(reader, {body}, status);
}

constexpr std::string_view kStream =
    "\xEF\xBB\xBF"
    ": keep-alive comment\r\n"
    "data: {\"a\":1}\n\n"
    "event: update\r"
    "id: 7\r"
    "data:first\r\n"
    "data:  two spaces\r\n"
    "data\r\n"
    "retry: 1000\n"
    "unknown: x\n"
    "\r\n"
    "data: [DONE]\r\r"
    "data: after\n\n";

const std::vector<Seen> kStreamEvents = {
    {"", "{\"a\":1}", ""},
    {"update", "first\n two spaces\n", "7"},
    {"", "[DONE]", "7"},
    {"", "after", "7"},
};

TEST(SseReader, ReadsAWholeStream) {
  Status st;
  EXPECT_EQ(read_whole(kStream, &st), kStreamEvents);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

TEST(SseReader, EverySplitPointGivesTheSameEvents) {
  for (size_t at = 0; at <= kStream.size(); ++at) {
    SseReader reader;
    Status st;
    EXPECT_EQ(read_all(reader, {kStream.substr(0, at), kStream.substr(at)}, &st), kStreamEvents)
        << "split at " << at;
    EXPECT_TRUE(st.is_ok());
    EXPECT_EQ(reader.events(), kStreamEvents.size());
    EXPECT_EQ(reader.pending_bytes(), 0u);
  }
  for (size_t a = 0; a <= kStream.size(); ++a) {
    for (size_t b = a; b <= kStream.size(); ++b) {
      SseReader reader;
      ASSERT_EQ(read_all(reader, {kStream.substr(0, a), kStream.substr(a, b - a), kStream.substr(b)}),
                kStreamEvents)
          << "split at " << a << " and " << b;
    }
  }
}

TEST(SseReader, ByteAtATimeGivesTheSameEvents) {
  SseReader reader;
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < kStream.size(); ++i) bytes.push_back(kStream.substr(i, 1));
  EXPECT_EQ(read_all(reader, bytes), kStreamEvents);
  EXPECT_EQ(reader.events(), kStreamEvents.size());
}

TEST(SseReader, AcceptsEachLineEnding) {
  for (std::string_view eol : {"\n", "\r\n", "\r"}) {
    const std::string body = "data: x" + std::string(eol) + "data: y" + std::string(eol) + std::string(eol);
    EXPECT_EQ(read_whole(body), (std::vector<Seen>{{"", "x\ny", ""}})) << "eol size " << eol.size();
  }
}

TEST(SseReader, CrAtTheEndOfAFeedPairsWithLfStartingTheNext) {
  SseReader reader;
  // Were the "\n" a second line ending, it would be a blank line and dispatch "x" early.
  auto seen = read_all(reader, {"data: x\r", "\ndata: y\r", "\n\r", "\n"});
  EXPECT_EQ(seen, (std::vector<Seen>{{"", "x\ny", ""}}));
  // A "\r" then a feed starting with something else: the "\r" alone ended the line.
  SseReader other;
  seen = read_all(other, {"data: x\r", "\r"});
  EXPECT_EQ(seen, (std::vector<Seen>{{"", "x", ""}}));
}

TEST(SseReader, DropsOnlyALeadingBom) {
  EXPECT_EQ(read_whole("\xEF\xBB\xBF" "data: a\n\n"), (std::vector<Seen>{{"", "a", ""}}));
  // A BOM split over feeds is still dropped.
  SseReader split;
  EXPECT_EQ(read_all(split, {"\xEF", "\xBB", "\xBF" "data: a\n\n"}), (std::vector<Seen>{{"", "a", ""}}));
  // A second BOM is text: it makes the field name "\xEF\xBB\xBF" "data", which is unknown.
  EXPECT_TRUE(read_whole("\xEF\xBB\xBF\xEF\xBB\xBF" "data: a\n\n").empty());
  // A partial BOM is ordinary text, even when held back across a feed.
  SseReader partial;
  EXPECT_EQ(read_all(partial, {"\xEF", "\xBB:x\ndata: a\n\n"}), (std::vector<Seen>{{"", "a", ""}}));
  EXPECT_EQ(read_whole("\xEF\xBB\n\ndata\n\n"), (std::vector<Seen>{{"", "", ""}}));
}

TEST(SseReader, IgnoresCommentsRetryAndUnknownFields) {
  EXPECT_EQ(read_whole(":data: no\n: also no\nretry: 5\nfoo: bar\ndata: yes\n\n"),
            (std::vector<Seen>{{"", "yes", ""}}));
  // Only comments between blank lines dispatch nothing.
  EXPECT_TRUE(read_whole(": ping\n\n: ping\n\n").empty());
}

TEST(SseReader, FieldValueRules) {
  // One leading space is dropped, not two; a colon inside the value stays; a field without a
  // colon has an empty value, so "data" alone contributes an empty line.
  EXPECT_EQ(read_whole("data:  a:b\n\n"), (std::vector<Seen>{{"", " a:b", ""}}));
  EXPECT_EQ(read_whole("data:no-space\n\n"), (std::vector<Seen>{{"", "no-space", ""}}));
  EXPECT_EQ(read_whole("data\ndata\n\n"), (std::vector<Seen>{{"", "\n", ""}}));
  EXPECT_EQ(read_whole("data:\n\n"), (std::vector<Seen>{{"", "", ""}}));
  // Field names are case-sensitive.
  EXPECT_TRUE(read_whole("Data: x\n\n").empty());
}

TEST(SseReader, MultiLineData) {
  EXPECT_EQ(read_whole("data: {\"a\":\ndata: 1}\n\n"), (std::vector<Seen>{{"", "{\"a\":\n1}", ""}}));
}

TEST(SseReader, EmptyDataIsNotDispatchedAndResetsTheType) {
  // An event with a type but no data is dropped, and its type does not leak into the next event.
  EXPECT_EQ(read_whole("event: ping\n\ndata: x\n\n"), (std::vector<Seen>{{"", "x", ""}}));
  EXPECT_TRUE(read_whole("\n\n\n").empty());
  EXPECT_EQ(read_whole("event: a\nevent: b\ndata: x\n\n"), (std::vector<Seen>{{"b", "x", ""}}));
}

TEST(SseReader, IdPersistsAcrossEventsAndRefusesNul) {
  const std::string body = "id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\nid: 2\nid: x" +
                           std::string(1, '\0') + "y\ndata: d\n\n";
  EXPECT_EQ(read_whole(body), (std::vector<Seen>{{"", "a", "1"}, {"", "b", "1"}, {"", "c", ""},
                                                  {"", "d", "2"}}));
  // An id on an event without data still sets the id for later events.
  EXPECT_EQ(read_whole("id: 9\n\ndata: a\n\n"), (std::vector<Seen>{{"", "a", "9"}}));
}

TEST(SseReader, PendingBytesShowsATruncatedStream) {
  SseReader reader;
  (void)read_all(reader, {"data: a\n\n"});
  EXPECT_EQ(reader.pending_bytes(), 0u);
  (void)read_all(reader, {"data: par"});  // a partial line
  EXPECT_EQ(reader.pending_bytes(), 9u);
  (void)read_all(reader, {"tial\n"});  // a data line but no blank line yet
  EXPECT_GT(reader.pending_bytes(), 0u);
  (void)read_all(reader, {"\n"});
  EXPECT_EQ(reader.pending_bytes(), 0u);
  EXPECT_EQ(reader.events(), 2u);

  SseReader typed;
  (void)read_all(typed, {"event: x\n"});
  EXPECT_GT(typed.pending_bytes(), 0u);
  SseReader comment;
  (void)read_all(comment, {": ping\n"});
  EXPECT_EQ(comment.pending_bytes(), 0u);
  SseReader cr;
  (void)read_all(cr, {"data: a\r\r"});  // ends with a lone "\r": complete, nothing pending
  EXPECT_EQ(cr.pending_bytes(), 0u);
}

TEST(SseReader, OversizeEventFailsAndStaysFailed) {
  SseReader reader(64);
  std::vector<Seen> seen;
  auto collect = [&](const SseEvent& e) {
    seen.push_back({std::string(e.event), std::string(e.data), std::string(e.id)});
  };
  ASSERT_TRUE(reader.feed("data: ok\n\n", collect).is_ok());
  // Many short data lines: no line is long, the event is.
  std::string big;
  for (int i = 0; i < 20; ++i) big += "data: 0123456789\n";
  Status st = reader.feed(big, collect);
  EXPECT_EQ(st.code(), StatusCode::kTooLarge);
  EXPECT_NE(st.message().find("64"), std::string::npos) << st.message();
  EXPECT_EQ(reader.pending_bytes(), 0u);
  Status again = reader.feed("\n\ndata: later\n\n", collect);
  EXPECT_EQ(again.code(), StatusCode::kTooLarge);
  EXPECT_EQ(again.message(), st.message());
  EXPECT_EQ(seen, (std::vector<Seen>{{"", "ok", ""}}));
  EXPECT_EQ(reader.events(), 1u);
}

TEST(SseReader, OversizeUnterminatedLineFailsBeforeItEnds) {
  SseReader reader(64);
  Status st = reader.feed("data: " + std::string(40, 'a'), [](const SseEvent&) {});
  EXPECT_TRUE(st.is_ok());
  st = reader.feed(std::string(40, 'a'), [](const SseEvent&) { ADD_FAILURE(); });
  EXPECT_EQ(st.code(), StatusCode::kTooLarge);
  EXPECT_EQ(reader.feed("\n\n", [](const SseEvent&) { ADD_FAILURE(); }).code(), StatusCode::kTooLarge);
  // A long comment line counts too: the reader would have to buffer it.
  SseReader comment(64);
  EXPECT_EQ(comment.feed(":" + std::string(100, 'x'), [](const SseEvent&) {}).code(),
            StatusCode::kTooLarge);
}

TEST(SseReader, LimitIsTheSameWhateverTheSplit) {
  // Exactly at the limit is fine, one byte over is not, read whole or in pieces.
  const size_t limit = 32;
  const std::string at_limit = "data: " + std::string(limit - 6, 'a') + "\n\n";
  const std::string over = "data: " + std::string(limit - 5, 'a') + "\n\n";
  for (size_t split = 0; split <= over.size(); ++split) {
    SseReader ok(limit), bad(limit);
    Status st_ok, st_bad;
    const std::string_view fits(at_limit), too_big(over);
    auto seen = read_all(ok, {fits.substr(0, split), fits.substr(std::min(split, fits.size()))}, &st_ok);
    EXPECT_TRUE(st_ok.is_ok()) << split;
    EXPECT_EQ(seen.size(), 1u) << split;
    seen = read_all(bad, {too_big.substr(0, split), too_big.substr(split)}, &st_bad);
    EXPECT_EQ(st_bad.code(), StatusCode::kTooLarge) << split;
    EXPECT_TRUE(seen.empty()) << split;
  }
}

TEST(SseReader, EventsBeforeTheOversizeOneAreDelivered) {
  Status st;
  auto seen = read_whole("data: a\n\ndata: " + std::string(100, 'b') + "\n\n", &st, 64);
  EXPECT_EQ(st.code(), StatusCode::kTooLarge);
  EXPECT_EQ(seen, (std::vector<Seen>{{"", "a", ""}}));
}

TEST(SseReader, CrOnlyLinesInOneLargeFeedAreReadInLinearTime) {
  // 4 MiB of "\r" is 4M blank lines and no "\n": a reader that searched for the next "\n" at
  // every line would take hours here, not milliseconds (the CTest timeout catches it).
  std::string body = "data: a\r";
  body.append(4u << 20, '\r');
  body += "data: b\n\n";
  EXPECT_EQ(read_whole(body), (std::vector<Seen>{{"", "a", ""}, {"", "b", ""}}));
}

TEST(SseReader, VllmStreamShape) {
  // What vLLM's OpenAI server writes: one "data: <json>\n\n" per chunk, then "data: [DONE]\n\n".
  std::string body;
  for (int i = 0; i < 3; ++i) body += "data: {\"choices\":[{\"text\":\"t" + std::to_string(i) + "\"}]}\n\n";
  body += "data: [DONE]\n\n";
  auto seen = read_whole(body);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[1].data, "{\"choices\":[{\"text\":\"t1\"}]}");
  EXPECT_EQ(seen[3].data, "[DONE]");
}

}  // namespace
}  // namespace pdr::proto
