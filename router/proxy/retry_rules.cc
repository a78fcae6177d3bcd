#include "router/proxy/retry_rules.h"

namespace pdr::router::proxy {

LegFailure classify(http::UpstreamFailure failure) {
  using F = http::UpstreamFailure;
  switch (failure) {
    case F::kBadRequest:
    case F::kConnect: return LegFailure::kConnect;
    case F::kConnectTimeout:
    case F::kFirstByteTimeout:
    case F::kIdleTimeout: return LegFailure::kTimeout;
    case F::kBadResponse: return LegFailure::kBadResponse;
    case F::kLocalResources: return LegFailure::kLocalResources;
    case F::kNone:
    case F::kConnectionLost:
    case F::kPoolClosed: return LegFailure::kConnectionLost;
  }
  return LegFailure::kConnectionLost;
}

LegFailure classify_status(int status) {
  return status >= 400 && status < 500 ? LegFailure::kStatus4xx : LegFailure::kStatus5xx;
}

DecodeRetry decode_retry(const proto::Dialect& dialect, LegFailure cause, uint32_t attempts_left) {
  if (attempts_left == 0 || cause == LegFailure::kStatus4xx || cause == LegFailure::kLocalResources) {
    return DecodeRetry::kNone;
  }
  if (dialect.decode_alone_retry == proto::DecodeAloneRetry::kIfNeverSent && cause == LegFailure::kConnect) {
    return DecodeRetry::kDecodeOnly;
  }
  return DecodeRetry::kWholePair;
}

bool prefill_retryable(LegFailure cause, uint32_t attempts_left) {
  return attempts_left > 0 && cause != LegFailure::kStatus4xx && cause != LegFailure::kLocalResources;
}

int failure_status(LegFailure cause) {
  if (cause == LegFailure::kLocalResources) return 503;  // our shortage, not the node's
  return cause == LegFailure::kTimeout ? 504 : 502;
}

}  // namespace pdr::router::proxy
