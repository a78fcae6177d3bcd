// router/proxy/client_api.h: pdrouter's error shape per path and the client's credential for
// the nodes.
#include "router/proxy/client_api.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdr::router::proxy {
namespace {

using nlohmann::json;

http::Request Post(const char* path, std::vector<http::Header> headers) {
  http::Request r;
  r.method = "POST";
  r.path = path;
  r.target = path;
  r.headers = std::move(headers);
  return r;
}

TEST(ClientApi, ErrorsOnAnthropicsPathsAreAnthropicsShape) {
  for (const char* path : {"/v1/messages", "/v1/messages/count_tokens"}) {
    const http::Response r = api_error_response(path, 429, "too many", "rate_limit_error", "too_many_requests");
    EXPECT_EQ(r.status, 429);
    EXPECT_EQ(json::parse(r.body),
              (json{{"type", "error"}, {"error", {{"type", "rate_limit_error"}, {"message", "too many"}}}}));
    bool json_type = false;
    for (const auto& h : r.headers) json_type = json_type || (h.name == "Content-Type" && h.value == "application/json");
    EXPECT_TRUE(json_type);
  }
  const http::Response busy = api_error_response("/v1/messages", 503, "draining", "server_error", "shutting_down");
  EXPECT_EQ(json::parse(busy.body)["error"]["type"], "overloaded_error");
}

TEST(ClientApi, ErrorsElsewhereStayOpenAiShaped) {
  const http::Response r = api_error_response("/v1/chat/completions", 503, "no pair", "server_error", "no_pair");
  const json doc = json::parse(r.body);
  EXPECT_EQ(doc["error"]["code"], "no_pair");
  EXPECT_EQ(doc["error"]["type"], "server_error");
  EXPECT_EQ(doc["error"]["message"], "no pair");
  EXPECT_EQ(json::parse(api_error_response("", 503, "m", "server_error", "x").body)["error"]["code"], "x");
}

TEST(ClientApi, AuthorizationWinsThenAnthropicsXApiKeyAsABearerToken) {
  EXPECT_EQ(client_authorization(Post("/v1/messages", {{"x-api-key", "k1"}})), "Bearer k1");
  EXPECT_EQ(client_authorization(Post("/v1/messages/count_tokens", {{"X-Api-Key", "k2"}})), "Bearer k2");
  EXPECT_EQ(client_authorization(Post("/v1/messages", {{"x-api-key", "k1"}, {"Authorization", "Bearer own"}})),
            "Bearer own");
  EXPECT_EQ(client_authorization(Post("/v1/messages", {})), "");
  EXPECT_EQ(client_authorization(Post("/v1/messages", {{"x-api-key", ""}})), "");
  // Only on Anthropic's paths: an X-API-Key elsewhere (the admin API's header) never reaches a node.
  EXPECT_EQ(client_authorization(Post("/v1/chat/completions", {{"x-api-key", "admin"}})), "");
  EXPECT_EQ(client_authorization(Post("/v1/chat/completions", {{"Authorization", "Bearer c"}})), "Bearer c");
}

}  // namespace
}  // namespace pdr::router::proxy
