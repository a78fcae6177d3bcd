// The route table: path matching, 404/405 and Allow derived from it, listener placement, the
// --help list, and the dispatch over a real HTTP server (404/405 as OpenAI-style JSON, the
// guard before the method, 405 counted as the route says).
#include "router/route_table.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "discovery/discovery_counters.h"
#include "router/control_routes.h"
#include "router/proxy/proxy_service.h"
#include "tests/support/http_client.h"

namespace pdr::router {
namespace {

using namespace std::chrono_literals;

const RouteTable& table() { return RouteTable::pdrouter(); }

// A concrete request path for a route path ("{host:port}" filled in).
std::string concrete(std::string_view path) {
  std::string out(path);
  if (const size_t open = out.find('{'); open != std::string::npos) {
    out.replace(open, out.find('}') - open + 1, "127.0.0.1:8000");
  }
  return out;
}

TEST(PathMatches, LiteralsParamsAndRest) {
  EXPECT_TRUE(path_matches("/health", "/health"));
  EXPECT_FALSE(path_matches("/health", "/health/"));
  EXPECT_FALSE(path_matches("/health", "/healthz"));
  EXPECT_FALSE(path_matches("/health", "//health"));
  EXPECT_FALSE(path_matches("/health", "/"));
  EXPECT_FALSE(path_matches("/v1/models", "/v1"));

  std::string_view param;
  EXPECT_TRUE(path_matches("/a/{x}/b", "/a/127.0.0.1:80/b", &param));
  EXPECT_EQ(param, "127.0.0.1:80");
  EXPECT_TRUE(path_matches("/a/{x}", "/a/%5B::1%5D:80", &param));
  EXPECT_EQ(param, "%5B::1%5D:80");
  EXPECT_FALSE(path_matches("/a/{x}", "/a/"));       // a parameter is never empty
  EXPECT_FALSE(path_matches("/a/{x}/b", "/a//b"));
  EXPECT_FALSE(path_matches("/a/{x}", "/a/x/y"));    // nor more than one segment

  EXPECT_TRUE(path_matches("/admin/**", "/admin/"));
  EXPECT_TRUE(path_matches("/admin/**", "/admin/x/y/z"));
  EXPECT_FALSE(path_matches("/admin/**", "/admin"));
  EXPECT_FALSE(path_matches("/admin/**", "/administrator"));
}

TEST(RouteTable, EveryRouteIsReachedByItsOwnMethodAndPath) {
  for (const Route& route : table().routes()) {
    if (route.method == "*") continue;
    const auto found = table().lookup(Surface::kAll, route.method, concrete(route.path));
    EXPECT_EQ(found.route, &route) << route.method << " " << route.path;
  }
}

TEST(RouteTable, RoutesOfOnePathAgreeOnListenerGuardAndCounting) {
  std::map<std::string_view, const Route*> first;
  std::set<std::pair<std::string_view, std::string_view>> seen;
  for (const Route& route : table().routes()) {
    EXPECT_TRUE(seen.insert({route.method, route.path}).second) << "twice: " << route.method << " " << route.path;
    EXPECT_TRUE(route.path.starts_with("/")) << route.path;
    EXPECT_NE(route.handler, nullptr) << route.path;
    // Listed routes have a real method; only the hidden catch-alls take any.
    EXPECT_EQ(route.help.empty(), route.method == "*") << route.path;
    auto [it, inserted] = first.emplace(route.path, &route);
    if (inserted) continue;
    EXPECT_EQ(route.listener, it->second->listener) << route.path;
    EXPECT_EQ(route.guard, it->second->guard) << route.path;
    EXPECT_EQ(route.refusals, it->second->refusals) << route.path;
  }
}

TEST(RouteTable, UnknownPathsHaveNoResource) {
  for (const char* path : {"/", "/nope", "/health/", "/v1", "/v1/completion", "/instances", "/statusx"}) {
    const auto found = table().lookup(Surface::kAll, "GET", path);
    EXPECT_EQ(found.resource, nullptr) << path;
    EXPECT_EQ(table().allow(Surface::kAll, path), "") << path;
  }
}

TEST(RouteTable, WrongMethodFindsThePathAndAllowListsItsMethods) {
  const std::map<std::string, std::string> allow = {
      {"/health", "GET, HEAD"},
      {"/status", "GET, HEAD"},
      {"/metrics", "GET, HEAD"},
      {"/ready", "GET, HEAD"},
      {"/v1/models", "GET, HEAD"},
      {"/v1/completions", "POST"},
      {"/v1/chat/completions", "POST"},
      {"/v1/responses", "POST"},
      {"/v1/messages", "POST"},
      {"/v1/messages/count_tokens", "POST"},
      {"/health_generate", "GET, HEAD"},
      {"/engine_metrics", "GET, HEAD"},
      {"/start_profile", "POST"},
      {"/stop_profile", "POST"},
      {"/admin/instances", "GET, HEAD, POST"},
      {"/admin/instances/127.0.0.1:8000", "GET, HEAD, DELETE"},
      {"/admin/instances/127.0.0.1:8000/drain", "POST"},
      {"/admin/instances/127.0.0.1:8000/undrain", "POST"},
      {"/instances/add", "POST"},
  };
  for (const auto& [path, methods] : allow) {
    EXPECT_EQ(table().allow(Surface::kAll, path), methods) << path;
    const auto found = table().lookup(Surface::kAll, "PATCH", path);
    ASSERT_NE(found.resource, nullptr) << path;
    EXPECT_EQ(found.route, nullptr) << path;
  }
  // HEAD on a POST-only path is a wrong method like any other.
  EXPECT_EQ(table().lookup(Surface::kAll, "HEAD", "/v1/completions").route, nullptr);
  // Methods are case-sensitive (RFC 9110 9.1).
  EXPECT_EQ(table().lookup(Surface::kAll, "get", "/health").route, nullptr);
}

TEST(RouteTable, HeadRunsTheGetRouteOfEveryGetPath) {
  size_t get_routes = 0;
  for (const Route& route : table().routes()) {
    if (route.method != "GET") continue;
    ++get_routes;
    const std::string path = concrete(route.path);
    const auto found = table().lookup(Surface::kAll, "HEAD", path);
    EXPECT_EQ(found.route, &route) << path;
    const std::string allow = table().allow(Surface::kAll, path);
    EXPECT_NE(allow.find("GET, HEAD"), std::string::npos) << path << ": " << allow;
  }
  EXPECT_GE(get_routes, 8u);
  // Only where GET is: the Allow of a path without GET never names HEAD.
  for (const Route& route : table().routes()) {
    if (route.method == "*") continue;
    const std::string allow = table().allow(Surface::kAll, concrete(route.path));
    EXPECT_EQ(allow.find("HEAD") != std::string::npos, allow.find("GET") != std::string::npos) << route.path;
  }
}

TEST(RouteTable, MethodNotAllowedOnAnthropicsPathsIsAnthropicsErrorShape) {
  http::Request request;
  request.method = "GET";
  request.path = "/v1/messages";
  const http::Response r = method_not_allowed(request, "POST");
  EXPECT_EQ(r.status, 405);
  const auto doc = nlohmann::json::parse(r.body);
  EXPECT_EQ(doc["type"], "error");
  EXPECT_EQ(doc["error"]["type"], "invalid_request_error");
  EXPECT_NE(doc["error"]["message"].get<std::string>().find("use POST"), std::string::npos);
  EXPECT_FALSE(doc.contains("code"));
  request.path = "/v1/chat/completions";  // OpenAI's paths keep OpenAI's shape
  EXPECT_EQ(nlohmann::json::parse(method_not_allowed(request, "POST").body)["error"]["code"], "method_not_allowed");
}

TEST(RouteTable, DebugCacheNeedsTheAdminKey) {
  const auto found = table().lookup(Surface::kAll, "GET", "/debug/cache");
  ASSERT_NE(found.route, nullptr);
  EXPECT_EQ(found.route->guard, Guard::kAdminKey);
}

TEST(RouteTable, AnythingElseUnderAdminIsTheAdminApisOwn404) {
  for (const char* path : {"/admin", "/admin/", "/admin/nothing", "/admin/instances/", "/admin/instances//drain",
                           "/admin/instances/127.0.0.1:8000/reboot", "/admin/instances/a/drain/x"}) {
    const auto found = table().lookup(Surface::kAll, "GET", path);
    ASSERT_NE(found.route, nullptr) << path;
    EXPECT_EQ(found.route->method, "*") << path;
    EXPECT_EQ(found.route->guard, Guard::kAdminKey) << path;
  }
}

TEST(RouteTable, ListenerPlacement) {
  const std::set<std::string> admin_only = {"/status", "/metrics", "/start_profile", "/stop_profile",
                                            "/reset_prefix_cache",
                                            "/admin/instances", "/admin/instances/127.0.0.1:8000",
                                            "/admin/instances/127.0.0.1:8000/drain",
                                            "/admin/instances/127.0.0.1:8000/undrain", "/instances/add",
                                            "/admin", "/admin/nothing", "/debug/cache", "/debug/route",
                                            "/engine_metrics"};
  const std::set<std::string> client_only = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/ready",
                                             // one-node endpoints (router/proxy/one_node_relay.h)
                                             "/v1/chat/completions/render", "/v1/completions/render", "/tokenize",
                                             "/detokenize", "/v1/embeddings", "/pooling", "/classify", "/score",
                                             "/v1/score", "/rerank", "/v1/rerank", "/v1/audio/**",
                                             "/v1/audio/transcriptions", "/v1/responses", "/health_generate",
                                             "/inference/v1/generate", "/v1/messages",
                                             "/v1/messages/count_tokens"};
  for (const std::string& path : admin_only) {
    EXPECT_NE(table().lookup(Surface::kAll, "", path).resource, nullptr) << path;
    EXPECT_NE(table().lookup(Surface::kAdmin, "", path).resource, nullptr) << path;
    EXPECT_EQ(table().lookup(Surface::kClient, "", path).resource, nullptr) << path;
  }
  for (const std::string& path : client_only) {
    EXPECT_NE(table().lookup(Surface::kAll, "", path).resource, nullptr) << path;
    EXPECT_NE(table().lookup(Surface::kClient, "", path).resource, nullptr) << path;
    EXPECT_EQ(table().lookup(Surface::kAdmin, "", path).resource, nullptr) << path;
  }
  for (Surface s : {Surface::kAll, Surface::kClient, Surface::kAdmin}) {
    EXPECT_NE(table().lookup(s, "GET", "/health").route, nullptr);
  }
  // Every route is in one of the sets above (a new route must say where it goes).
  for (const Route& route : table().routes()) {
    if (route.method == "*") continue;
    const std::string path = concrete(route.path);
    const std::string_view where = listener_label(route.listener);
    if (admin_only.contains(path)) {
      EXPECT_EQ(where, "admin") << path;
    } else if (client_only.contains(path)) {
      EXPECT_EQ(where, "client") << path;
    } else {
      EXPECT_EQ(path, "/health");
      EXPECT_EQ(where, "both");
    }
  }
}

TEST(RouteTable, HelpListsEveryListedRouteOnOneLine) {
  const std::string help = table().help_text();
  size_t listed = 0;
  for (const Route& route : table().routes()) {
    if (route.help.empty()) continue;
    ++listed;
    bool found = false;
    size_t start = 0;
    while (start < help.size()) {
      const size_t end = help.find('\n', start);
      const std::string line = help.substr(start, end - start);
      start = end + 1;
      // "  METHOD  PATH  LISTENER  help"
      if (line.find(" " + std::string(route.path) + " ") == std::string::npos) continue;
      if (!line.starts_with("  " + std::string(route.method) + " ")) continue;
      EXPECT_NE(line.find(" " + std::string(listener_label(route.listener)) + " "), std::string::npos) << line;
      EXPECT_TRUE(line.ends_with(route.help)) << line;
      found = true;
    }
    EXPECT_TRUE(found) << route.method << " " << route.path << "\n" << help;
  }
  EXPECT_EQ(static_cast<size_t>(std::count(help.begin(), help.end(), '\n')), listed);
}

// The real table behind a real server: what a client sees.
class RouteDispatchTest : public ::testing::Test {
 protected:
  void start(Surface surface) {
    proxy_ = std::make_unique<proxy::ProxyService>(registry_, topology_, server_, 1);
    ControlContext context;
    context.registry = &registry_;
    context.discovery_counters = &discovery_counters_;
    context.workers = 1;
    control_ = std::make_unique<ControlRoutes>(context);
    http::ServerOptions options;
    options.host = "127.0.0.1";
    options.on_worker_stop = [this](uint32_t worker) { proxy_->worker_stopped(worker); };
    const Endpoints endpoints{control_.get(), proxy_.get()};
    Status s = server_.start(options, [endpoints, surface](http::Request&& r, http::ResponseWriter w) {
      RouteTable::pdrouter().dispatch(surface, endpoints, std::move(r), std::move(w));
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  void TearDown() override { server_.stop(2s); }

  test::HttpResponse request(std::string_view method, std::string_view path, std::string_view body = {}) {
    test::HttpClient client;
    EXPECT_EQ(client.connect("127.0.0.1", server_.port()), "");
    EXPECT_EQ(client.send_request(method, path, {}, body), "");
    return client.read_response(test::HttpClient::kDefaultTimeout, method == "HEAD");
  }
  static std::string error_code(const test::HttpResponse& r) {
    const auto doc = nlohmann::json::parse(r.body, nullptr, false);
    if (!doc.is_object() || !doc.contains("error")) return "(not an OpenAI error: " + r.body + ")";
    EXPECT_TRUE(doc["error"]["message"].is_string());
    EXPECT_TRUE(doc["error"]["type"].is_string());
    return doc["error"]["code"].get<std::string>();
  }

  SnapshotCell<discovery::RegistrySnapshot> registry_;
  SnapshotCell<config::Topology> topology_;
  discovery::DiscoveryCounters discovery_counters_;
  std::unique_ptr<proxy::ProxyService> proxy_;  // outlives the server's workers
  std::unique_ptr<ControlRoutes> control_;
  http::Server server_;
};

TEST_F(RouteDispatchTest, NotFoundAndMethodNotAllowedAreJsonWithAllow) {
  start(Surface::kAll);
  auto r = request("GET", "/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(error_code(r), "not_found");
  EXPECT_EQ(r.header("Allow"), std::nullopt);

  r = request("POST", "/status", "{}");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.header("Allow"), "GET, HEAD");
  EXPECT_EQ(error_code(r), "method_not_allowed");

  r = request("HEAD", "/v1/chat/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.header("Allow"), "POST");
  EXPECT_EQ(r.body, "");  // a HEAD answer never has a body, an error's neither

  r = request("GET", "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"status":"ok"})");
}

// HEAD is GET's answer without the body: same status, same headers (Content-Length included),
// and no body bytes on the wire, so the next request on the connection is read correctly.
TEST_F(RouteDispatchTest, HeadAnswersTheGetHeadOnAKeptAliveConnection) {
  start(Surface::kAll);
  test::HttpClient client;
  ASSERT_EQ(client.connect("127.0.0.1", server_.port()), "");
  for (const char* path : {"/health", "/ready", "/status"}) {
    SCOPED_TRACE(path);
    ASSERT_EQ(client.send_request("GET", path), "");
    const auto get = client.read_response();
    ASSERT_TRUE(get.ok()) << get.error;
    ASSERT_EQ(client.send_request("HEAD", path), "");
    const auto head = client.read_response(test::HttpClient::kDefaultTimeout, true);
    ASSERT_TRUE(head.ok()) << head.error;
    EXPECT_EQ(head.status, get.status);
    EXPECT_EQ(head.header("Content-Type"), get.header("Content-Type"));
    ASSERT_TRUE(get.header("Content-Length").has_value());
    // /status carries the uptime: its length may move by a digit between the two.
    if (std::string_view(path) != "/status") {
      EXPECT_EQ(head.header("Content-Length"), get.header("Content-Length"));
    } else {
      EXPECT_TRUE(head.header("Content-Length").has_value());
    }
    EXPECT_EQ(head.body, "");
    EXPECT_TRUE(head.keep_alive);
  }
  // Nothing of a body was sent after the heads: the next answer on the connection parses whole.
  ASSERT_EQ(client.send_request("GET", "/health"), "");
  const auto after = client.read_response();
  ASSERT_TRUE(after.ok()) << after.error;
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(after.body, R"({"status":"ok"})");
}

TEST_F(RouteDispatchTest, WrongMethodOnAPdPathIsCountedAsBadPath) {
  start(Surface::kAll);
  const auto& bad_path = proxy_->counters().refusals[static_cast<size_t>(proxy::Refusal::kBadPath)];
  const uint64_t before = bad_path.load();
  auto r = request("GET", "/v1/chat/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.header("Allow"), "POST");
  EXPECT_EQ(bad_path.load(), before + 1);
  r = request("POST", "/v1/models");  // not a P/D path: not counted there
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.header("Allow"), "GET, HEAD");
  EXPECT_EQ(bad_path.load(), before + 1);
}

// The path is read in one spelling before any lookup: encoded and dot-segment spellings of a
// route are that route (its guard included); a path without one spelling is 400 invalid_path.
TEST_F(RouteDispatchTest, PathsAreNormalisedBeforeTheLookup) {
  start(Surface::kAll);
  auto r = request("GET", "/he%61lth");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"status":"ok"})");
  r = request("GET", "//x/../health");
  EXPECT_EQ(r.status, 200);
  r = request("POST", "/start%5Fprofile", "{}");  // the admin route and its key check
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(error_code(r), "admin_disabled");
  const auto& bad_path = proxy_->counters().refusals[static_cast<size_t>(proxy::Refusal::kBadPath)];
  const uint64_t before = bad_path.load();
  for (const char* path : {"/he%2Falth", "/health%00", "/..", "/%zz"}) {
    SCOPED_TRACE(path);
    r = request("GET", path);
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(error_code(r), "invalid_path");
  }
  EXPECT_EQ(bad_path.load(), before + 4);
}

TEST_F(RouteDispatchTest, AdminKeyIsCheckedBeforeTheMethod) {
  start(Surface::kAll);  // no topology: no key, the admin API is disabled
  for (const auto& [method, path] : std::map<std::string, std::string>{
           {"PUT", "/admin/instances"}, {"GET", "/admin/nothing"}, {"GET", "/start_profile"}}) {
    auto r = request(method, path);
    EXPECT_EQ(r.status, 403) << path;
    EXPECT_EQ(error_code(r), "admin_disabled") << path;
    EXPECT_EQ(r.header("Allow"), std::nullopt) << path;
  }
  // /instances/add checks its method first, as the demo proxy did; and counts the 405.
  const auto& bad_request = control_->admin().counters().by_result[AdminCounters::kBadRequest];
  const uint64_t before = bad_request.load();
  auto r = request("GET", "/instances/add");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.header("Allow"), "POST");
  EXPECT_EQ(bad_request.load(), before + 1);
}

TEST_F(RouteDispatchTest, ClientListenerAnswers404ForOperatorRoutes) {
  start(Surface::kClient);
  for (const char* path : {"/status", "/metrics", "/admin/instances", "/admin/nothing", "/instances/add"}) {
    auto r = request("GET", path);
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_EQ(error_code(r), "not_found") << path;
  }
  EXPECT_EQ(request("GET", "/health").status, 200);
  EXPECT_EQ(request("GET", "/ready").status, 503);  // served: no pair
}

TEST_F(RouteDispatchTest, AdminListenerAnswers404ForClientRoutes) {
  start(Surface::kAdmin);
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/ready"}) {
    auto r = request("POST", path, "{}");
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_EQ(error_code(r), "not_found") << path;
  }
  EXPECT_EQ(request("GET", "/health").status, 200);
  EXPECT_EQ(request("GET", "/status").status, 200);
  EXPECT_EQ(request("GET", "/metrics").status, 200);
}

}  // namespace
}  // namespace pdr::router
