// A request's token reservation and its refusal (contracts in tenant_tokens.h).
#include "router/proxy/tenant_tokens.h"

#include <algorithm>
#include <string>
#include <vector>

#include "router/routing/cache_routing.h"
#include "router/proxy/client_api.h"
#include "proto/token_ids.h"

namespace pdr::router::proxy {

namespace {

uint64_t cap_of(const proto::JsonObjectBody& body, std::initializer_list<std::string_view> keys) {
  for (std::string_view key : keys) {
    std::optional<int64_t> value;
    if (body.get_int(key, &value).is_ok() && value && *value > 0) return static_cast<uint64_t>(*value);
  }
  return 0;
}

}  // namespace

uint64_t requested_tokens(const proto::JsonObjectBody& body, const proto::GenerateView* generate, int64_t choices) {
  const std::string_view prompt = generate != nullptr ? proto::generate_token_ids(body) : routing::request_prompt(body);
  thread_local std::vector<uint32_t> ids;
  const uint64_t prompt_tokens = proto::parse_token_id_array(prompt, 1u << 24, &ids)
                                     ? ids.size()
                                     : std::max<uint64_t>(1, body.original().size() / 4);
  const uint64_t cap = generate != nullptr ? cap_of(generate->sampling_params, {"max_tokens"})
                                           : cap_of(body, {"max_tokens", "max_completion_tokens", "max_output_tokens"});
  return prompt_tokens + cap * static_cast<uint64_t>(std::max<int64_t>(1, choices));
}

http::Response tenant_tokens_refusal(std::string_view path, std::string_view tenant, uint64_t tokens,
                                     clients::TenantRefusal why, double wait_seconds, const config::Topology& topology) {
  const uint32_t per_minute = topology.tenants.limits_of(tenant).tokens_per_minute;
  std::string message;
  if (why == clients::TenantRefusal::kTooLarge) {
    message = "the request needs " + std::to_string(tokens) + " tokens (prompt and max_tokens), more than tenant '" +
              std::string(tenant) + "' may use in a minute (tenants: tokens_per_minute = " +
              std::to_string(per_minute) + "); send a shorter prompt or a lower max_tokens";
  } else {
    message = "tenant '" + std::string(tenant) + "' is over its token rate (tenants: tokens_per_minute = " +
              std::to_string(per_minute) + "); this request needs " + std::to_string(tokens) + " tokens";
  }
  http::Response r = api_error_response(path, 429, message, "tokens", "rate_limit_exceeded");
  const long retry = clients::TokenBucket::retry_after_seconds(wait_seconds);
  if (retry > 0) r.headers.push_back({"Retry-After", std::to_string(retry)});
  return r;
}

}  // namespace pdr::router::proxy
