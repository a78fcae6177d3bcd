// Endpoints served by ONE node, no KV, no P/D (docs/endpoints.md "Endpoints"): the render endpoints,
// /tokenize, /detokenize and Anthropic's /v1/messages/count_tokens, the pooling and audio
// endpoints (embeddings, pooling, classify, score, rerank, /v1/audio/*), and unknown paths when
// routing.pass_through_unknown is on.
//
// Which nodes are eligible: a node declares what it serves beyond generation with the label
// `serves` (kServesLabel), a comma-separated list of kServesRender, kServesPooling, kServesAudio
// (topology `instances[].labels`, POST /admin/instances, or a pdrouter-format registration:
// `pdnode register --label serves=pooling`). By OneNodeClass:
//   kRender      the up nodes that serve "render"; none: every up node (render needs no GPU)
//   kAnyNode     every up (routable) node, prefill or decode: /tokenize, /detokenize,
//                /v1/messages/count_tokens
//   kPooling     the up nodes that serve "pooling"; none declared: 501 not_supported
//   kAudio       the up nodes that serve "audio"; none declared: 501 not_supported
//   kPassThrough decode nodes (routing.pass_through_unknown; off: the route table's 404; which
//                paths may go is pass_through.h's)
// 501 is answered only when no node at all (up or not) declares the capability; declared but none
// up is 503 no_node.
// Admission is a P/D request's (admission.h): 503 shutting_down while pdrouter drains, 429 beyond
// limits.max_concurrent_requests (one-node and P/D requests count together in
// pdrouter_requests_in_flight), 503 memory_budget when the body would take
// limits.max_buffered_bytes over; each refusal is counted as outcome `refused` too. The slot
// and the body's bytes are held until the answer ends (relayed, failed, client gone) and given
// back at once for a 501 or 503 no_node.
// Among the eligible, the least loaded (pdrouter's in-flight count / dp_size, the number the
// least_outstanding policy reads; ties rotate from a random start) is picked; the request counts
// as in flight on it until the answer ends.
//
// The request goes out with its method, path (normalised by the route table, re-encoded; and the
// query), body, Content-Type, Accept, X-Request-Id and Authorization (the client's, on Anthropic's
// paths its x-api-key as a Bearer token when it sent no Authorization (client_api.h), else
// connectors.upstream_api_key; a pass-through request only ever carries the client's own: the
// router's key is never lent to a path pdrouter does not know). The answer is relayed AS IT
// ARRIVES: status, Content-Type and the body streamed chunk by chunk (Transfer-Encoding: chunked
// to the client), with back-pressure: reading from the node pauses while the client has
// kRelayHighWater bytes queued and resumes on drain, so a large answer (a 1 MB+ render) never sits
// whole in the router; a client that reads nothing for timeouts.client_write_ms while reading is
// paused is cut and the node's call closed (pdrouter_client_write_stalls_total). A node's error status is relayed as it is. A node that cannot be reached
// or fails before its head: 502 (504 on a timeout) JSON in the path's error shape (client_api.h:
// OpenAI's, Anthropic's on /v1/messages/count_tokens, as are the refusals above); after the head, the client
// stream is cut (no terminating chunk), as when the node dies. Each outcome is counted
// (pdrouter_one_node_requests_total{endpoint,outcome}).
//
// Worker thread only.
#pragma once

#include <string_view>

#include "router/http/http_message.h"
#include "router/http/response_writer.h"
#include "router/clients/access_record.h"
#include "router/proxy/admission.h"
#include "router/proxy/proxy_shared.h"
#include "router/routing/pairing.h"

namespace pdr::router::proxy {

enum class OneNodeClass { kRender, kAnyNode, kPooling, kAudio, kPassThrough };
inline constexpr size_t kOneNodeClassCount = 5;

inline constexpr std::string_view kServesRender = "render";
inline constexpr std::string_view kServesPooling = "pooling";
inline constexpr std::string_view kServesAudio = "audio";

// The client's queued bytes at which reading from the node pauses.
inline constexpr size_t kRelayHighWater = 256 * 1024;

// `ticket`: the request's hold on its tenant (an in-flight slot), kept until the answer ends;
// `record`: its access log record (null: log off), logged when the answer ends (outcome done for a
// relayed answer, failed otherwise; refused for an admission refusal); `place`: where it waits
// in the admission queue when every slot is in flight (admission.h).
void serve_one_node(WorkerContext& worker, http::Request& request, http::ResponseWriter writer,
                    OneNodeClass node_class, clients::TenantTicket ticket = {},
                    std::unique_ptr<clients::AccessRecord> record = nullptr, QueuePlace place = {});

}  // namespace pdr::router::proxy
