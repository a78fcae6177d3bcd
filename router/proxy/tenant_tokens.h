// A P/D request's share of its tenant's tokens_per_minute (router/clients/tenant_registry.h):
// what it reserves when it is admitted, and the 429 when that does not fit.
//
// The reservation is the prompt plus the answer's cap, before any node has seen the request:
//   prompt   a prompt of token ids (/v1/completions' integer array, /inference/v1/generate's
//            token_ids): their count; anything else: the request body's bytes / 4 (the JSON text
//            of the prompt or messages and the rest of the body, an over-estimate that the
//            answer's usage settles)
//   answer   max_tokens, else max_completion_tokens, else max_output_tokens (/v1/responses);
//            /inference/v1/generate: sampling_params.max_tokens; times n. None given: 0 (the
//            usage settles what the answer took, possibly into debt: the tenant's next requests
//            wait until the bucket refills past it)
// Pure.
#pragma once

#include <cstdint>
#include <string_view>

#include "discovery/config/topology.h"
#include "router/http/http_message.h"
#include "proto/generate_request.h"
#include "proto/json_splice.h"
#include "router/clients/tenant_registry.h"

namespace pdr::router::proxy {

// `generate`: the checked view of an /inference/v1/generate body, else null. `choices`: n.
uint64_t requested_tokens(const proto::JsonObjectBody& body, const proto::GenerateView* generate, int64_t choices);

// 429 for a reservation of `tokens` the tenant's bucket refused (`why`: kTokensPerMinute, with
// Retry-After the seconds until it fits; kTooLarge, which never fits: no Retry-After), in the
// path's error shape (client_api.h).
http::Response tenant_tokens_refusal(std::string_view path, std::string_view tenant, uint64_t tokens,
                                     clients::TenantRefusal why, double wait_seconds, const config::Topology& topology);

}  // namespace pdr::router::proxy
