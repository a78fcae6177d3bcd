// Fuzzes proto/json_splice: parse untrusted bytes (the outcome must equal that of running simdjson
// on every document), apply edits chosen by the input, render, and require that the result is a
// valid JSON object per simdjson that re-parses (no duplicate keys).
// Input layout: byte 0 = number of edits (low 3 bits), then 2 bytes per edit (op, key/value
// choice), then the JSON text.
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/json_splice.h"

namespace {

constexpr std::string_view kKeys[] = {"max_tokens", "stream", "stream_options", "a", "",
                                      "kv_transfer_params", "min_tokens", "k\"\\\n\x01"};
constexpr std::string_view kValues[] = {"1", "false", "null", "{}", "[1,{\"x\":\"\\u00e9\"}]",
                                        "\"s\\\"\"", "-0.5e3", "{\"do_remote_decode\":true}"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t edits = data[0] & 7;
  if (size < 1 + 2 * edits) return 0;
  const uint8_t* ops = data + 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 1 + 2 * edits),
                              size - 1 - 2 * edits);

  pdr::proto::JsonLimits limits;
  limits.max_depth = 32;
  pdr::proto::JsonObjectBody body;
  const pdr::Status st = pdr::proto::JsonObjectBody::parse(text, limits, &body);
  // simdjson runs only where its verdict could differ from the scanner's: the outcome and the
  // message must be those of running it on every document.
  pdr::proto::set_json_simdjson_on_every_parse(true);
  pdr::proto::JsonObjectBody reference;
  const pdr::Status reference_st = pdr::proto::JsonObjectBody::parse(text, limits, &reference);
  pdr::proto::set_json_simdjson_on_every_parse(false);
  if (st.code() != reference_st.code() || st.message() != reference_st.message()) std::abort();
  if (!st.is_ok()) return 0;
  if (body.render() != text) std::abort();  // no edits: byte-exact

  for (size_t i = 0; i < edits; ++i) {
    const uint8_t op = ops[2 * i];
    const uint8_t arg = ops[2 * i + 1];
    const std::string_view key = kKeys[arg & 7];
    if (op & 1) {
      body.remove(key);
      if (body.has(key)) std::abort();
    } else {
      body.set_raw(key, kValues[(arg >> 3) & 7]);
      if (body.get_raw(key) != kValues[(arg >> 3) & 7]) std::abort();
    }
  }
  const std::string out = body.render();
  if (body.rendered_size() != out.size()) std::abort();  // the size announced before render_into
  const pdr::proto::JsonObjectBody copy = body;            // copies share the text, keep the edits
  if (copy.render() != out) std::abort();
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(out).get(root) != simdjson::SUCCESS) std::abort();
  if (!root.is_object()) std::abort();
  pdr::proto::JsonObjectBody again;
  limits.max_depth = 64;  // edits may add a level or two
  if (!pdr::proto::JsonObjectBody::parse(out, limits, &again).is_ok()) std::abort();
  if (again.size() != body.size()) std::abort();
  return 0;
}
