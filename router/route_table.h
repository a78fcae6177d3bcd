// The one list of pdrouter's HTTP endpoints. Each route says its method, its path, which
// listener serves it, what is checked before the method is looked at, how a wrong method is
// counted, one line for `pdrouter --help`, and its handler. Everything else is derived from it:
// the dispatch on both listeners, 404 for a path no route has (on that listener), 405 with an
// `Allow` header naming every method the path accepts (RFC 9110 15.5.6), and the endpoint list
// `pdrouter --help` prints. A new endpoint is one line in route_table.cc.
//
// The request path is normalised before anything else reads it (router/http/request_path.h:
// percent-decoded, empty and dot segments resolved; request.path and request.target are
// rewritten to that spelling), so "/start%5Fprofile" is the /start_profile route, guard and all;
// a path that cannot be normalised is 400 invalid_path (counted as a bad_path refusal).
//
// Paths: literal segments; "{name}" matches one non-empty segment (its text is the handler's
// `param`); a last segment "**" matches whatever follows the slash before it. Routes with the
// same path form one resource: they share listener, guard and counting (route_table_test checks
// it), and the first route (in table order) whose path matches wins, so specific paths go
// before the catch-alls. A route with an empty help line is not listed (the /admin catch-alls,
// which only exist to answer the admin API's own 404 after the key check).
//
// 404 and 405 are OpenAI-style JSON errors (codes "not_found" and "method_not_allowed"; a 405 on
// Anthropic's paths is Anthropic's error shape, router/proxy/client_api.h). HEAD
// is served wherever GET is (the GET handler runs; the HTTP layer sends the head only, with its
// Content-Length) and `Allow` lists it after GET.
//
// Threads: dispatch() runs on HTTP workers concurrently; the table is immutable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "router/http/http_server.h"

namespace pdr::router {

namespace proxy {
class ProxyService;
}
namespace clients {
struct ClientIdentity;
}
class ControlRoutes;

// Where a route is served once listeners.admin splits the endpoints over two listeners.
// Without listeners.admin the one listener serves every route.
enum class Listener : uint8_t {
  kClient,  // the client listener (listeners.http) only
  kAdmin,   // the operator listener (listeners.admin) only
  kBoth,
};
std::string_view listener_label(Listener listener);  // "client", "admin", "both"

// What one listener serves: everything (no listeners.admin), or one side of the split.
enum class Surface : uint8_t { kAll, kClient, kAdmin };
bool serves(Surface surface, Listener listener);

// Checked once the path matched, before its method is looked at (so a caller without the key
// learns nothing about the path's methods).
enum class Guard : uint8_t {
  kNone,
  kAdminKey,         // AdminRoutes::admit: 401/403/429 as /admin/*
  kAdminKeyProfile,  // AdminRoutes::admit_profile: the above, then the profile body cap (413)
  // ProxyService::authenticate: the client key (client_auth.keys_file; 401/429) and the tenant's
  // request rate (429); the handler gets who the client is (Endpoints::client). Every client
  // endpoint but the probes (/health, /ready) has it.
  kClientKey,
};

// Where a 405 on the path is counted.
enum class Refusals : uint8_t {
  kUncounted,
  kAdmin,  // pdrouter_admin_requests_total{result="bad_request"}
  kProxy,  // pdrouter_requests_refused_total{reason="bad_path"}
};

// The services handlers answer with. `proxy` may be null for tables that do not use it (tests).
struct Endpoints {
  const ControlRoutes* control = nullptr;
  proxy::ProxyService* proxy = nullptr;
  // Set by dispatch() for a route guarded by kClientKey, for its handler; null otherwise.
  const clients::ClientIdentity* client = nullptr;
};

// `param`: the text of the path's "{name}" segment ("" without one); it views request.path,
// so it must be read before the handler moves that away.
using RouteHandler = void (*)(const Endpoints& endpoints, http::Request&& request,
                              http::ResponseWriter writer, std::string_view param);

struct Route {
  std::string_view method;  // "GET", "POST", "DELETE"; "*" accepts any method
  std::string_view path;    // see the header comment
  Listener listener;
  Guard guard;
  Refusals refusals;
  std::string_view help;    // one line for --help; "" leaves the route out of it
  RouteHandler handler;
};

// True when `path` matches the route path `pattern`; `param` (optional) gets the "{name}"
// segment's text.
bool path_matches(std::string_view pattern, std::string_view path, std::string_view* param = nullptr);

class RouteTable {
 public:
  explicit constexpr RouteTable(std::span<const Route> routes) : routes_(routes) {}

  // pdrouter's endpoints.
  static const RouteTable& pdrouter();

  std::span<const Route> routes() const { return routes_; }

  // What a request for (method, path) on a listener of `surface` gets.
  struct Lookup {
    const Route* resource = nullptr;  // first route of the matched path; null: 404
    const Route* route = nullptr;     // the route to run; null with a resource: 405
    std::string_view param;           // into the looked-up path
  };
  Lookup lookup(Surface surface, std::string_view method, std::string_view path) const;

  // The methods `path` accepts on `surface`, in table order, HEAD after GET: "GET, HEAD, POST".
  // "" for an unknown path.
  std::string allow(Surface surface, std::string_view path) const;

  // Answers one request: 404, the resource's guard, 405 (counted as the resource says), or the
  // route's handler.
  void dispatch(Surface surface, const Endpoints& endpoints, http::Request&& request,
                http::ResponseWriter writer) const;

  // The endpoint list of `pdrouter --help`: one line per listed route,
  // "  METHOD  PATH  LISTENER  help".
  std::string help_text() const;

 private:
  std::span<const Route> routes_;
};

// The 404 and 405 answers dispatch() sends.
http::Response not_found(const http::Request& request);
http::Response method_not_allowed(const http::Request& request, std::string_view allow);

}  // namespace pdr::router
