// vLLM's POST /abort_requests for the legs of a cancelled tokens-in request.
//
// A vLLM node started with --tokens-only serves POST /abort_requests {"request_ids": [...]} (vLLM
// vllm/entrypoints/serve/disagg/api_router.py: registered only in that mode, the ids handed to the
// engine's abort), meant for "disaggregated everything" setups whose front end may not hold one
// HTTP connection per engine request. pdrouter still closes every open leg (which aborts the
// request on any vLLM node), and for a POST /inference/v1/generate request whose leg is still in
// flight on a node labelled `serves` naming kServesTokensOnly, it also sends that node the abort by
// id, so the request's KV blocks are freed even where the connection close is not seen as an
// abort: when the request is cancelled (client gone, request deadline, stalled client, failure),
// and when one leg's failure closes the other (a concurrent decode waiting for a failed prefill's
// KV, a prefill whose decode failed and is retried with a new pair). The engine id is vLLM's for that endpoint: "generate-tokens-" + the leg's X-Request-Id
// (vllm/entrypoints/serve/disagg/serving.py; the header wins over the body's request_id).
//
// Fire and forget on the worker's upstream pool: the answer is only counted
// (ProxyCounters::abort_requests), never waited for. Worker thread only.
#pragma once

#include <string>
#include <string_view>

#include "discovery/instance.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

// The `serves` capability of a node started with vLLM's --tokens-only.
inline constexpr std::string_view kServesTokensOnly = "tokens-only";

// vLLM's engine request id of a /inference/v1/generate request sent with X-Request-Id `request_id`.
std::string generate_engine_request_id(std::string_view request_id);

// The body of POST /abort_requests for that one id.
std::string abort_requests_body(std::string_view request_id);

// Sends `node` POST /abort_requests for the leg with X-Request-Id `request_id` when the request is
// a tokens-in one (`path` is /inference/v1/generate) and the node is labelled tokens-only; else
// does nothing. True when a call was started.
bool abort_leg_on_node(WorkerContext& worker, const discovery::Instance& node, std::string_view path,
                       std::string_view request_id);

}  // namespace pdr::router::proxy
