// Fuzzes proto/sse_reader: a streamed response body is untrusted bytes from the network, and TCP
// splits it anywhere. Property: reading the body in one feed and in three feeds (split points
// taken from the first two input bytes) gives the same events, the same final status, the same
// event count and the same pending bytes; after a failure a further feed returns the same status
// and calls back nothing. A small event limit lets inputs reach it. The relay's SseBoundaryScanner
// fed the same pieces must cut where the byte-by-byte boundary rule does.
// Input layout: byte 0 and byte 1 choose the split points, the rest is the body.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "proto/sse_boundary.h"
#include "proto/sse_reader.h"
#include "tests/support/sse_boundary_reference.h"

namespace {

constexpr size_t kMaxEventBytes = 4096;

struct Run {
  std::vector<std::string> events;  // event, data and id of each, joined with a separator byte
  pdr::Status status;
  uint64_t count = 0;
  size_t pending = 0;
};

Run read(std::string_view body, size_t first, size_t second) {
  Run run;
  pdr::proto::SseReader reader(kMaxEventBytes);
  auto collect = [&](const pdr::proto::SseEvent& e) {
    if (e.data.size() > kMaxEventBytes || e.event.size() > kMaxEventBytes) std::abort();
    std::string joined(e.event);
    joined.push_back('\x01');
    joined.append(e.data);
    joined.push_back('\x01');
    joined.append(e.id);
    run.events.push_back(std::move(joined));
  };
  const std::string_view pieces[] = {body.substr(0, first), body.substr(first, second - first),
                                     body.substr(second)};
  for (std::string_view piece : pieces) {
    run.status = reader.feed(piece, collect);
    if (!run.status.is_ok()) break;
  }
  if (!run.status.is_ok()) {
    const size_t before = run.events.size();
    const pdr::Status again = reader.feed("data: x\n\n", collect);
    if (again.code() != run.status.code() || again.message() != run.status.message()) std::abort();
    if (run.events.size() != before || reader.pending_bytes() != 0) std::abort();
  }
  run.count = reader.events();
  run.pending = reader.pending_bytes();
  if (run.count != run.events.size()) std::abort();
  return run;
}

// The relay's boundary scanner (which skips line text a word at a time) agrees with the rule
// after each of the three pieces arrives.
void check_boundaries(std::string_view body, size_t first, size_t second) {
  pdr::proto::SseBoundaryScanner scan;
  for (size_t end : {first, second, body.size()}) {
    if (scan.scan(body.substr(0, end)) != pdr::test::sse_boundary_reference(body.substr(0, end))) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 2), size - 2);
  size_t first = data[0] % (body.size() + 1);
  size_t second = data[1] % (body.size() + 1);
  if (second < first) std::swap(first, second);

  const Run whole = read(body, body.size(), body.size());
  const Run split = read(body, first, second);
  if (whole.events != split.events) std::abort();
  if (whole.status.code() != split.status.code()) std::abort();
  if (whole.status.message() != split.status.message()) std::abort();
  if (whole.count != split.count || whole.pending != split.pending) std::abort();
  check_boundaries(body, first, second);
  return 0;
}
