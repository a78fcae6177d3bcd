// pdrouter's routes and the matching, dispatch and --help rendering derived from them
// (contracts in route_table.h).
#include "router/route_table.h"

#include <algorithm>
#include <array>

#include "router/http/json_error.h"
#include "router/http/request_path.h"
#include "router/clients/client_gate.h"
#include "router/control_routes.h"
#include "router/proxy/client_api.h"
#include "router/proxy/proxy_service.h"

namespace pdr::router {
namespace {

// --- handlers: each answers one route through the service that owns the endpoint -----------

void health(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  writer.send(e.control->health(request.worker));
}

void status(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.control->serve_status(request, std::move(writer));
}

void metrics(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  writer.send(e.control->metrics(request.worker));
}

void debug_cache(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  writer.send(e.control->debug_cache(request));
}

void debug_route(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  writer.send(e.control->debug_route(request));
}

void completions(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->admit(request, writer, e.client);
}

void models(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->models(request, std::move(writer), e.client);
}

void render(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->one_node(request, std::move(writer), proxy::OneNodeClass::kRender, e.client);
}

void audio(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->one_node(request, std::move(writer), proxy::OneNodeClass::kAudio, e.client);
}

void any_node(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->one_node(request, std::move(writer), proxy::OneNodeClass::kAnyNode, e.client);
}

void pooling(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->one_node(request, std::move(writer), proxy::OneNodeClass::kPooling, e.client);
}

void ready(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->ready(request, std::move(writer));
}

void profile(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->profile(request, std::move(writer));
}

void engine_metrics(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->engine_metrics(request, std::move(writer));
}

void health_generate(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.proxy->health_generate(request, std::move(writer));
}

void list_instances(const Endpoints& e, http::Request&& request, http::ResponseWriter writer,
                    std::string_view) {
  e.control->admin().list_instances(request, std::move(writer), e.control->registry(request.worker));
}

void add_instance(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.control->admin().add_instance(std::move(request), std::move(writer));
}

void get_instance(const Endpoints& e, http::Request&& request, http::ResponseWriter writer,
                  std::string_view address) {
  e.control->admin().get_instance(request, std::move(writer), address, e.control->registry(request.worker));
}

void remove_instance(const Endpoints& e, http::Request&& request, http::ResponseWriter writer,
                     std::string_view address) {
  e.control->admin().remove_instance(request, std::move(writer), address);
}

void drain_instance(const Endpoints& e, http::Request&& request, http::ResponseWriter writer,
                    std::string_view address) {
  e.control->admin().set_drain(request, std::move(writer), address, true);
}

void undrain_instance(const Endpoints& e, http::Request&& request, http::ResponseWriter writer,
                      std::string_view address) {
  e.control->admin().set_drain(request, std::move(writer), address, false);
}

void seed_add(const Endpoints& e, http::Request&& request, http::ResponseWriter writer, std::string_view) {
  e.control->admin().seed_add(std::move(request), std::move(writer));
}

void admin_no_route(const Endpoints& e, http::Request&& request, http::ResponseWriter writer,
                    std::string_view) {
  e.control->admin().no_route(request, std::move(writer));
}

// --- the table -------------------------------------------------------------------------------

constexpr Listener kClient = Listener::kClient;
constexpr Listener kAdmin = Listener::kAdmin;
constexpr Listener kBoth = Listener::kBoth;

constexpr std::array kRoutes = {
    Route{"POST", "/v1/completions", kClient, Guard::kClientKey, Refusals::kProxy,
          "OpenAI completion, split into a prefill and a decode leg", &completions},
    Route{"POST", "/v1/chat/completions", kClient, Guard::kClientKey, Refusals::kProxy,
          "OpenAI chat completion, split into legs the same way", &completions},
    Route{"POST", "/inference/v1/generate", kClient, Guard::kClientKey, Refusals::kProxy,
          "vLLM tokens in, tokens out (a render answer + sampling_params), split into legs the same way",
          &completions},
    Route{"GET", "/v1/models", kClient, Guard::kClientKey, Refusals::kUncounted,
          "a decode node's model list (cached 5 s)", &models},
    Route{"POST", "/v1/chat/completions/render", kClient, Guard::kClientKey, Refusals::kUncounted,
          "chat prompt to token ids + features: one node (serves=render first), streamed", &render},
    Route{"POST", "/v1/completions/render", kClient, Guard::kClientKey, Refusals::kUncounted,
          "completion prompt to token ids: one node (serves=render first), streamed", &render},
    Route{"POST", "/tokenize", kClient, Guard::kClientKey, Refusals::kUncounted,
          "vLLM's tokenizer, one node", &any_node},
    Route{"POST", "/detokenize", kClient, Guard::kClientKey, Refusals::kUncounted,
          "vLLM's detokenizer, one node", &any_node},
    Route{"POST", "/v1/embeddings", kClient, Guard::kClientKey, Refusals::kUncounted,
          "one node labelled serves=pooling, else 501", &pooling},
    Route{"POST", "/pooling", kClient, Guard::kClientKey, Refusals::kUncounted,
          "one node labelled serves=pooling, else 501", &pooling},
    Route{"POST", "/classify", kClient, Guard::kClientKey, Refusals::kUncounted,
          "one node labelled serves=pooling, else 501", &pooling},
    Route{"POST", "/score", kClient, Guard::kClientKey, Refusals::kUncounted,
          "one node labelled serves=pooling, else 501", &pooling},
    Route{"POST", "/rerank", kClient, Guard::kClientKey, Refusals::kUncounted,
          "one node labelled serves=pooling, else 501", &pooling},
    Route{"POST", "/v1/rerank", kClient, Guard::kClientKey, Refusals::kUncounted,
          "one node labelled serves=pooling, else 501", &pooling},
    Route{"POST", "/v1/score", kClient, Guard::kClientKey, Refusals::kUncounted,
          "one node labelled serves=pooling, else 501", &pooling},
    Route{"POST", "/v1/audio/**", kClient, Guard::kClientKey, Refusals::kUncounted,
          "transcriptions, translations: one node labelled serves=audio, else 501", &audio},
    Route{"POST", "/v1/responses", kClient, Guard::kClientKey, Refusals::kProxy,
          "OpenAI Responses API, split into legs (prefill max_output_tokens 1)", &completions},
    Route{"POST", "/v1/messages", kClient, Guard::kClientKey, Refusals::kProxy,
          "Anthropic Messages API, split into legs like chat (501 with SGLang)", &completions},
    Route{"POST", "/v1/messages/count_tokens", kClient, Guard::kClientKey, Refusals::kUncounted,
          "Anthropic Messages API token count, one node", &any_node},
    Route{"GET", "/ready", kClient, Guard::kNone, Refusals::kUncounted,
          "200 only when a compatible P/D pair is up (readiness probe)", &ready},
    Route{"GET", "/health", kBoth, Guard::kNone, Refusals::kUncounted,
          "200 while the process is up (liveness probe)", &health},
    Route{"GET", "/health_generate", kClient, Guard::kClientKey, Refusals::kUncounted,
          "one 1-token completion through one real pair: 200, or 503 naming the failing leg", &health_generate},
    Route{"GET", "/status", kAdmin, Guard::kNone, Refusals::kUncounted,
          "the live registry as JSON (admin key with admin.protect_status)", &status},
    Route{"GET", "/metrics", kAdmin, Guard::kNone, Refusals::kUncounted, "Prometheus text", &metrics},
    Route{"GET", "/engine_metrics", kAdmin, Guard::kNone, Refusals::kUncounted,
          "every up node's Prometheus page merged, samples labelled pdrouter_node, pdrouter_role", &engine_metrics},
    Route{"GET", "/debug/cache", kAdmin, Guard::kAdminKey, Refusals::kAdmin,
          "which nodes hold the longest prefix of ?tokens=1,2,3[&lora=NAME] (admin key)", &debug_cache},
    Route{"GET", "/debug/route", kAdmin, Guard::kAdminKey, Refusals::kAdmin,
          "the predicted_latency policy's last decisions, ?limit=N (admin key)", &debug_route},
    Route{"POST", "/start_profile", kAdmin, Guard::kAdminKeyProfile, Refusals::kUncounted,
          "start profiling on every up instance (admin key)", &profile},
    Route{"POST", "/stop_profile", kAdmin, Guard::kAdminKeyProfile, Refusals::kUncounted,
          "stop profiling on every up instance (admin key)", &profile},
    Route{"POST", "/reset_prefix_cache", kAdmin, Guard::kAdminKeyProfile, Refusals::kUncounted,
          "reset the prefix cache of every up instance (admin key)", &profile},
    Route{"GET", "/admin/instances", kAdmin, Guard::kAdminKey, Refusals::kAdmin,
          "admin API: the instances", &list_instances},
    Route{"POST", "/admin/instances", kAdmin, Guard::kAdminKey, Refusals::kAdmin,
          "admin API: add an instance", &add_instance},
    Route{"GET", "/admin/instances/{host:port}", kAdmin, Guard::kAdminKey, Refusals::kAdmin,
          "admin API: one instance", &get_instance},
    Route{"DELETE", "/admin/instances/{host:port}", kAdmin, Guard::kAdminKey, Refusals::kAdmin,
          "admin API: remove an instance (not a static one)", &remove_instance},
    Route{"POST", "/admin/instances/{host:port}/drain", kAdmin, Guard::kAdminKey, Refusals::kAdmin,
          "admin API: operator drain, no new requests", &drain_instance},
    Route{"POST", "/admin/instances/{host:port}/undrain", kAdmin, Guard::kAdminKey, Refusals::kAdmin,
          "admin API: end an operator drain", &undrain_instance},
    Route{"POST", "/instances/add", kAdmin, Guard::kNone, Refusals::kAdmin,
          "vLLM demo-proxy compatible add (X-API-Key)", &seed_add},
    // The admin API's own 404, after the key check, for anything else under /admin.
    Route{"*", "/admin", kAdmin, Guard::kAdminKey, Refusals::kAdmin, "", &admin_no_route},
    Route{"*", "/admin/**", kAdmin, Guard::kAdminKey, Refusals::kAdmin, "", &admin_no_route},
};

constexpr RouteTable kPdrouter{kRoutes};

// HEAD is GET without the body (RFC 9110 9.3.2): every route that takes GET takes HEAD and runs
// the GET handler; the HTTP layer (http_connection.cc) sends the head of its answer only, with
// the Content-Length the body would have had, so the connection stays usable.
bool accepts(const Route& route, std::string_view method) {
  return route.method == "*" || route.method == method || (method == "HEAD" && route.method == "GET");
}

// request.path becomes its normalised spelling and request.target that spelling re-encoded plus
// the query; a refused path leaves the request untouched and the status says why.
Status normalize_request_path(http::Request& request) {
  std::string path;
  if (Status st = http::normalize_path(request.path, &path); !st.is_ok()) return st;
  if (path != request.path) {
    request.target = http::encode_path(path);
    if (!request.query.empty()) request.target.append("?").append(request.query);
    request.path = std::move(path);
  }
  return Status::ok();
}

// Runs the resource's guard; false once it has answered.
bool admitted(Guard guard, const Endpoints& e, const http::Request& request, http::ResponseWriter& writer) {
  switch (guard) {
    case Guard::kNone: return true;
    case Guard::kAdminKey: return e.control->admin().admit(request, writer);
    case Guard::kAdminKeyProfile: return e.control->admin().admit_profile(request, writer);
    case Guard::kClientKey: return true;  // dispatch() runs it: it has an identity to hand on
  }
  return true;
}

}  // namespace

std::string_view listener_label(Listener listener) {
  switch (listener) {
    case Listener::kClient: return "client";
    case Listener::kAdmin: return "admin";
    case Listener::kBoth: return "both";
  }
  return "?";
}

bool serves(Surface surface, Listener listener) {
  switch (surface) {
    case Surface::kAll: return true;
    case Surface::kClient: return listener != Listener::kAdmin;
    case Surface::kAdmin: return listener != Listener::kClient;
  }
  return false;
}

bool path_matches(std::string_view pattern, std::string_view path, std::string_view* param) {
  // Segment by segment; both start with '/' (the parser only hands on origin-form targets).
  for (;;) {
    if (pattern.empty() || path.empty()) return pattern.empty() && path.empty();
    if (pattern.front() != '/' || path.front() != '/') return false;
    pattern.remove_prefix(1);
    path.remove_prefix(1);
    const size_t pattern_end = pattern.find('/');
    const std::string_view want = pattern.substr(0, pattern_end);
    if (want == "**" && pattern_end == std::string_view::npos) return true;
    const size_t path_end = path.find('/');
    const std::string_view got = path.substr(0, path_end);
    if (want.size() >= 2 && want.front() == '{' && want.back() == '}') {
      if (got.empty()) return false;
      if (param != nullptr) *param = got;
    } else if (want != got) {
      return false;
    }
    pattern = pattern_end == std::string_view::npos ? std::string_view() : pattern.substr(pattern_end);
    path = path_end == std::string_view::npos ? std::string_view() : path.substr(path_end);
  }
}

const RouteTable& RouteTable::pdrouter() { return kPdrouter; }

RouteTable::Lookup RouteTable::lookup(Surface surface, std::string_view method, std::string_view path) const {
  Lookup found;
  for (const Route& route : routes_) {
    if (!serves(surface, route.listener)) continue;
    if (found.resource == nullptr) {
      if (!path_matches(route.path, path, &found.param)) continue;
      found.resource = &route;
    } else if (route.path != found.resource->path) {
      continue;
    }
    if (accepts(route, method)) {
      found.route = &route;
      return found;
    }
  }
  return found;
}

std::string RouteTable::allow(Surface surface, std::string_view path) const {
  const Lookup found = lookup(surface, "", path);
  std::string methods;
  if (found.resource == nullptr) return methods;
  for (const Route& route : routes_) {
    if (route.path != found.resource->path || !serves(surface, route.listener)) continue;
    if (!methods.empty()) methods += ", ";
    methods += route.method;
    if (route.method == "GET") methods += ", HEAD";  // see accepts()
  }
  return methods;
}

void RouteTable::dispatch(Surface surface, const Endpoints& endpoints, http::Request&& request,
                          http::ResponseWriter writer) const {
  // Every lookup, guard and handler below reads the one normalised spelling of the path, the one
  // a node behind pdrouter would route on (router/http/request_path.h): "/start%5Fprofile" is
  // "/start_profile" here too. What is relayed is that spelling, re-encoded.
  if (Status st = normalize_request_path(request); !st.is_ok()) {
    if (endpoints.proxy != nullptr) endpoints.proxy->count_refusal(proxy::Refusal::kBadPath);
    writer.send(http::error_response(400, st.message(), "invalid_request_error", "invalid_path"));
    return;
  }
  const Lookup found = lookup(surface, request.method, request.path);
  if (found.resource == nullptr) {
    // routing.pass_through_unknown: a path no route of any listener names goes to one decode
    // (the proxy's own checks decide which may: router/proxy/pass_through.h).
    if (surface != Surface::kAdmin && endpoints.proxy != nullptr) {
      if (lookup(Surface::kAll, request.method, request.path).resource != nullptr) {
        // A route of the other listener (an admin path asked on the client port) is never
        // relayed; counted as a refused pass-through when pass-through is on.
        endpoints.proxy->count_pass_through_refused(request);
      } else if (endpoints.proxy->pass_through(request, writer)) {
        return;
      }
    }
    writer.send(not_found(request));
    return;
  }
  Endpoints handler_endpoints = endpoints;
  clients::ClientIdentity client;
  if (found.resource->guard == Guard::kClientKey && endpoints.proxy != nullptr) {
    if (!endpoints.proxy->authenticate(request, writer, &client)) return;
    handler_endpoints.client = &client;
  } else if (!admitted(found.resource->guard, endpoints, request, writer)) {
    return;
  }
  if (found.route == nullptr) {
    http::Response response = method_not_allowed(request, allow(surface, request.path));
    switch (found.resource->refusals) {
      case Refusals::kUncounted: break;
      case Refusals::kAdmin:
        endpoints.control->admin().send(writer, {AdminCounters::kBadRequest, std::move(response)});
        return;
      case Refusals::kProxy: endpoints.proxy->count_wrong_method(); break;
    }
    writer.send(std::move(response));
    return;
  }
  // found.param views request.path, which the handler may move.
  found.route->handler(handler_endpoints, std::move(request), std::move(writer), found.param);
}

std::string RouteTable::help_text() const {
  size_t path_width = 0;
  for (const Route& route : routes_) {
    if (!route.help.empty()) path_width = std::max(path_width, route.path.size());
  }
  std::string out;
  for (const Route& route : routes_) {
    if (route.help.empty()) continue;
    out += "  ";
    out += route.method;
    out.append(8 - std::min<size_t>(route.method.size(), 7), ' ');
    out += route.path;
    out.append(path_width + 2 - route.path.size(), ' ');
    const std::string_view where = listener_label(route.listener);
    out += where;
    out.append(8 - where.size(), ' ');
    out += route.help;
    out += '\n';
  }
  return out;
}

http::Response not_found(const http::Request& request) {
  return http::error_response(404, "no route for " + request.method + " " + request.path,
                              "invalid_request_error", "not_found");
}

http::Response method_not_allowed(const http::Request& request, std::string_view allow) {
  http::Response response = proxy::api_error_response(  // Anthropic's shape on its paths
      request.path, 405, "method " + request.method + " is not allowed on " + request.path + "; use " + std::string(allow),
      "invalid_request_error", "method_not_allowed");
  response.headers.push_back({"Allow", std::string(allow)});
  return response;
}

}  // namespace pdr::router
