// The Mooncake bootstrap server's GET /query answer (docs/design/wire-formats.md section 4): a JSON object
// keyed by DP rank as a decimal string ("0", "1", ...), each value an object with a string
// "engine_id" (and other fields pdrouter ignores: worker_addr, tp_size, pp_size, ...).
// Pure; the router fetches the bytes and keeps the result per prefill instance.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

struct MooncakeEngines {
  // engine_ids[rank]; ranks are dense from 0 (a gap is an error: the proxy could not pin it).
  std::vector<std::string> engine_ids;
};

// Errors: kTooLarge (over 1 MiB), kMalformed (not JSON), kWrongType (not an object, a value not
// an object, engine_id not a string), kInvalidValue (a key that is not a rank below 4096, ranks
// not dense from 0, empty object), kMissingKey (engine_id absent). `out` is untouched on error.
Status parse_mooncake_query(std::string_view json, MooncakeEngines* out);

}  // namespace pdr::proto
