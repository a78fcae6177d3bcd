// The state machine's decisions that do not depend on I/O, as pure functions (tested alone):
// how an upstream failure is classified, what a failed decode may be retried as, and which
// status the client gets when the retry budget is spent.
#pragma once

#include <string>

#include "proto/dialects/dialect.h"
#include "router/http/upstream_client.h"
#include "router/proxy/proxy_counters.h"

namespace pdr::router::proxy {

// Cause of a transport-level failure (the call's on_error).
LegFailure classify(http::UpstreamFailure failure);
// Cause of an answered non-2xx status (4xx or 5xx; anything else under 400 counts as 5xx: a
// node that answers 3xx to a POST is broken).
LegFailure classify_status(int status);

enum class DecodeRetry {
  kNone,        // not retryable: fail the request
  kDecodeOnly,  // resend the same decode body to another decode (the prefill's KV stays valid)
  kWholePair,   // abandon both legs and start over with a new pair and fresh ids
};

// What a decode failure *before its first response byte reached the client* may be retried as,
// by the dialect's decode_alone_retry (proto/dialects/dialect.h):
//  - NIXL (kIfNeverSent): the decode pulls KV by the prefill's returned params, which any decode can use, so
//    another decode may take them (kDecodeOnly), but only when the failed decode never got the
//    request (connect failure). A decode that got it may have pulled the blocks already, and
//    closing it (how pdrouter aborts) makes it tell the prefill to free them (docs/design/wire-formats.md 6):
//    a second decode could then read freed or reused blocks. Any other failure: kWholePair.
//  - The others (kNever). MoRIIO READ/WRITE, P2P-NCCL: the request id embeds the decode's address, and in WRITE mode
//    the prefill pushes to that decode: a new decode needs a new prefill (kWholePair).
//  - Mooncake, SGLang: the prefill pushes to the decode that the bootstrap pairing named
//    (kWholePair).
// 4xx answers are the client's fault: never retried (kNone). `attempts_left` == 0: kNone.
DecodeRetry decode_retry(const proto::Dialect& dialect, LegFailure cause, uint32_t attempts_left);

// Prefill failures are retried on another prefill with fresh ids, unless the node refused the
// request itself (4xx) or the budget is spent.
bool prefill_retryable(LegFailure cause, uint32_t attempts_left);

// Status for a request that failed for `cause` after its retries: 504 for timeouts, 503 when
// pdrouter itself lacked the resources (kLocalResources: never retried, since another node
// would fail the same way, and never counted against the node), else 502.
int failure_status(LegFailure cause);

}  // namespace pdr::router::proxy
