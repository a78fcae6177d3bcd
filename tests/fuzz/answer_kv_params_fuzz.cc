// Fuzzes proto/answer_kv_params: the relay's removal of a decode's kv_transfer_params from the
// answers clients get (the decode's bytes are untrusted). Properties: no crash; a JSON answer the
// relay lets through (edited or not) that parses as an object has no non-null kv_transfer_params
// at its top level nor in its "response" object; the same for every event of a stream it lets
// through, read back with an SSE reader. Only the key's plain spelling is looked for (vLLM writes
// it so): inputs with a backslash are checked for crashes only. The input's first byte chooses
// whether the event bytes start inside an event (the relay's flag after an oversized event).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/answer_kv_params.h"
#include "proto/json_splice.h"
#include "proto/sse_reader.h"

namespace {

using pdr::proto::JsonObjectBody;

bool null_or_absent(const JsonObjectBody& body) {
  const auto raw = body.get_raw("kv_transfer_params");
  return !raw || *raw == "null";
}

// A JSON object text holds no non-null params where the relay removes them.
void check_clean(std::string_view json) {
  JsonObjectBody body;
  pdr::proto::JsonLimits limits;
  limits.max_depth = 128;
  if (!JsonObjectBody::parse_borrowed(json, limits, &body).is_ok()) return;
  if (!null_or_absent(body)) std::abort();
  const auto response = body.get_raw("response");
  if (!response || response->empty() || response->front() != '{') return;
  JsonObjectBody inner;
  if (JsonObjectBody::parse_member_borrowed(*response, limits, &inner).is_ok() && !null_or_absent(inner)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool starts_mid_event = (data[0] & 1) != 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool plain = input.find('\\') == std::string_view::npos;

  std::string out;
  switch (pdr::proto::redact_kv_params_json(input, &out)) {
    case pdr::proto::KvParamsEdit::kNone:
      if (plain) check_clean(input);
      break;
    case pdr::proto::KvParamsEdit::kRedacted:
      if (plain) check_clean(out);
      break;
    case pdr::proto::KvParamsEdit::kRefused:
      break;
  }

  out.clear();
  const pdr::proto::KvParamsEdit edit = pdr::proto::redact_kv_params_events(input, starts_mid_event, &out);
  if (edit == pdr::proto::KvParamsEdit::kRefused || !plain) return 0;
  const std::string_view relayed = edit == pdr::proto::KvParamsEdit::kRedacted ? std::string_view(out) : input;
  // An event the relay took for the rest of an earlier one is not read as an event here.
  std::string_view events = relayed;
  if (starts_mid_event) {
    const size_t blank = events.find("\n\n");
    if (blank == std::string_view::npos || events.find('\r') != std::string_view::npos) return 0;
    events.remove_prefix(blank + 2);
  }
  pdr::proto::SseReader reader;
  (void)reader.feed(events, [](const pdr::proto::SseEvent& event) { check_clean(event.data); });
  // The last event without its blank line (the stream ended there) is relayed as one too.
  (void)reader.feed("\n\n", [](const pdr::proto::SseEvent& event) { check_clean(event.data); });
  return 0;
}
