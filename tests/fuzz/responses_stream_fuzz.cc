// Fuzzes proto/responses_stream: ResponsesStreamFollower reads a node's relayed Responses events
// (untrusted bytes). Property: no crash; the id it keeps is bounded and made only of the allowed
// characters; the sequence number never goes backwards and stays non-negative; the failure events
// built from what it learned are two well-formed named events. The input is split in two at its
// first byte's value, as a stream arriving in chunks is.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/responses_stream.h"

namespace {

bool plain_id(const std::string& id) {
  if (id.size() > pdr::proto::ResponsesStreamFollower::kMaxResponseId) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t cut = std::min<size_t>(data[0], all.size());
  pdr::proto::ResponsesStreamFollower follower;
  follower.observe(all.substr(0, cut));
  const int64_t first = follower.next_sequence_number();
  if (first < 0 || !plain_id(follower.response_id())) std::abort();
  follower.observe(all.substr(cut));
  if (follower.next_sequence_number() < 0 || !plain_id(follower.response_id())) std::abort();
  const std::string events = pdr::proto::responses_failure_events(
      follower.response_id().empty() ? "resp_fuzz" : follower.response_id(),
      follower.next_sequence_number(), all.substr(0, std::min<size_t>(all.size(), 64)), "server_error");
  if (events.rfind("event: error\ndata: {", 0) != 0) std::abort();
  if (events.find("\n\nevent: response.failed\ndata: {") == std::string::npos) std::abort();
  if (events.size() < 4 || events.compare(events.size() - 2, 2, "\n\n") != 0) std::abort();
  return 0;
}
