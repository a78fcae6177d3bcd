// The admin API; endpoints, authentication and threading are described in admin_routes.h.
#include "router/admin_routes.h"

#include "proto/base/log.h"

#include <algorithm>
#include <memory>
#include <string>

#include "proto/base/secure_compare.h"
#include "proto/json_splice.h"
#include "router/admin_request.h"
#include "router/proxy/node_endpoints.h"
#include "router/http/json_error.h"
#include "router/status_page.h"

namespace pdr::router {
namespace {

using Result = AdminCounters::Result;
using discovery::AdminOutcome;
using discovery::AdminResult;

constexpr std::string_view kInstances = "/admin/instances";

http::Response error(int status, std::string_view message, std::string_view code) {
  return http::error_response(status, message,
                              status >= 500 ? "server_error" : "invalid_request_error", code);
}

http::Response instance_response(int status, const discovery::Instance& inst) {
  return http::Response::json(status, render_instance_json(inst, discovery::Clock::now()));
}

// 400 for what the caller sent, 413 for a body over the limit.
http::Response bad_request(const Status& s) {
  if (s.code() == StatusCode::kTooLarge && s.message().starts_with("body is")) {
    return error(413, s.message(), "body_too_large");
  }
  return error(400, s.message(), std::string(code_label(s.code())));
}

// The registry's refusals, shared by every admin operation.
AdminRoutes::Reply refusal(const AdminOutcome& outcome) {
  switch (outcome.result) {
    case AdminResult::kNotFound: return {Result::kNotFound, error(404, outcome.message, "not_found")};
    case AdminResult::kConflict: return {Result::kConflict, error(409, outcome.message, "conflict")};
    case AdminResult::kRejectedFull:
      return {Result::kUnavailable, error(503, outcome.message, "registry_full")};
    default: return {Result::kOk, instance_response(200, *outcome.instance)};
  }
}

bool added(const AdminOutcome& outcome) {
  return outcome.result == AdminResult::kCreated || outcome.result == AdminResult::kReplaced;
}

// The demo proxy only knew the two roles' lists by these names.
std::string seed_list_name(proto::Role role) {
  return role == proto::Role::kPrefill ? "prefill_instances" : "decode_instances";
}

}  // namespace

std::string_view AdminCounters::label(Result r) {
  switch (r) {
    case kOk: return "ok";
    case kUnauthorized: return "unauthorized";
    case kDisabled: return "disabled";
    case kBadRequest: return "bad_request";
    case kNotFound: return "not_found";
    case kConflict: return "conflict";
    case kUnavailable: return "unavailable";
    case kThrottled: return "throttled";
    case kResultCount: break;
  }
  return "unknown";
}

AdminRoutes::AdminRoutes(AdminContext context)
    : context_(context), workers_(std::max(1u, context.workers)) {}

AdminRoutes::Auth AdminRoutes::authorize(const http::Request& request, AdminThrottle::Scope* throttled_scope) const {
  const auto topology = context_.topology != nullptr ? context_.topology->current() : nullptr;
  if (topology == nullptr || topology->admin.api_key.empty()) return Auth::kDisabled;
  std::string_view presented;
  if (auto key = request.header("X-API-Key")) {
    presented = *key;
  } else if (auto auth = request.header("Authorization")) {
    constexpr std::string_view kBearer = "Bearer ";
    if (auth->size() > kBearer.size() && iequals(auth->substr(0, kBearer.size()), kBearer)) {
      presented = auth->substr(kBearer.size());
    }
  }
  // A right key is let in even while its source is throttled (admin_throttle.h: a shared
  // address or network must not let a guesser lock the operator out); the comparison takes
  // the same time whatever the key.
  const bool right = !presented.empty() && secure_equals(presented, topology->admin.api_key);
  const std::string_view address = AdminThrottle::address_of(request.peer);
  const auto now = AdminThrottle::Clock::now();
  const AdminThrottle::Scope scope = throttle_.throttled(address, now);
  if (right) return Auth::kOk;
  if (scope != AdminThrottle::Scope::kNone) {
    if (throttled_scope != nullptr) *throttled_scope = scope;
    return Auth::kThrottled;
  }
  throttle_.failed(address, now);
  if (workers_.at(request.worker).auth_log.allow(now)) {
    pdr::log::warn("admin: failed authentication for {} {} from {}", request.method,
                 std::string_view(request.path).substr(0, 200), request.peer);
  }
  return Auth::kUnauthorized;
}

bool AdminRoutes::admit(const http::Request& request, http::ResponseWriter& writer) const {
  AdminThrottle::Scope scope = AdminThrottle::Scope::kAddress;
  switch (authorize(request, &scope)) {
    case Auth::kDisabled:
      send(writer, {Result::kDisabled,
                    error(403,
                          "the admin API is disabled: set admin.api_key_env (the name of an "
                          "environment variable holding the key) or admin.api_key_file in the "
                          "topology file to enable it",
                          "admin_disabled")});
      return false;
    case Auth::kUnauthorized: {
      auto response = error(401,
                            "missing or wrong admin key: send 'Authorization: Bearer <key>' or "
                            "'X-API-Key: <key>'",
                            "invalid_api_key");
      response.headers.push_back({"WWW-Authenticate", "Bearer realm=\"pdrouter-admin\""});
      send(writer, {Result::kUnauthorized, std::move(response)});
      return false;
    }
    case Auth::kThrottled:
      send(writer, throttled_reply(scope));
      return false;
    case Auth::kOk:
      break;
  }
  return true;
}

bool AdminRoutes::admit_profile(const http::Request& request, http::ResponseWriter& writer) const {
  if (!admit(request, writer)) return false;
  if (request.body.size() > proxy::kMaxProfileBodyBytes) {
    send(writer, {Result::kBadRequest,
                  error(413,
                        "body is " + std::to_string(request.body.size()) + " bytes (limit " +
                            std::to_string(proxy::kMaxProfileBodyBytes) + " for " + request.path + ")",
                        "body_too_large")});
    return false;
  }
  return true;
}

AdminRoutes::Reply AdminRoutes::throttled_reply(AdminThrottle::Scope scope) const {
  counters_.auth_throttled.fetch_add(1, std::memory_order_relaxed);
  auto response = http::error_response(
      429, "too many failed admin authentications from " + std::string(AdminThrottle::describe(scope)) +
               "; retry later",
      "rate_limit_error", "auth_throttled");
  response.headers.push_back({"Retry-After", "1"});
  return {Result::kThrottled, std::move(response)};
}

void AdminRoutes::send(http::ResponseWriter& writer, Reply reply) const {
  counters_.by_result[reply.result].fetch_add(1, std::memory_order_relaxed);
  writer.send(std::move(reply.response));
}

void AdminRoutes::list_instances(const http::Request&, http::ResponseWriter writer,
                                 const discovery::RegistrySnapshot& snapshot) const {
  send(writer, {Result::kOk, http::Response::json(200, render_instances_json(snapshot, discovery::Clock::now()))});
}

void AdminRoutes::add_instance(http::Request&& request, http::ResponseWriter writer) const {
  add_parsed(std::move(request), std::move(writer), &parse_admin_instance,
             [](const AdminOutcome& outcome) -> Reply {
               if (!added(outcome)) return refusal(outcome);
               const auto& inst = *outcome.instance;
               auto response = instance_response(outcome.result == AdminResult::kCreated ? 201 : 200, inst);
               response.headers.push_back({"Location", std::string(kInstances) + "/" + inst.key});
               return {Result::kOk, std::move(response)};
             });
}

bool AdminRoutes::instance_key(std::string_view address, http::ResponseWriter& writer, std::string* key) const {
  if (Status s = parse_instance_key(address, key); !s) {
    send(writer, {Result::kBadRequest, error(400, "instance address: " + s.message(), "bad_address")});
    return false;
  }
  return true;
}

void AdminRoutes::get_instance(const http::Request&, http::ResponseWriter writer, std::string_view address,
                               const discovery::RegistrySnapshot& snapshot) const {
  std::string key;
  if (!instance_key(address, writer, &key)) return;
  const discovery::Instance* inst = snapshot.find(key);
  send(writer, inst != nullptr
                   ? Reply{Result::kOk, instance_response(200, *inst)}
                   : Reply{Result::kNotFound, error(404, key + " is not in the registry", "not_found")});
}

void AdminRoutes::remove_instance(const http::Request& request, http::ResponseWriter writer,
                                  std::string_view address) const {
  std::string key;
  if (!instance_key(address, writer, &key)) return;
  change_instance(request, std::move(writer), "removed",
                  [key](discovery::Registry& registry) { return registry.remove(key); });
}

void AdminRoutes::set_drain(const http::Request& request, http::ResponseWriter writer, std::string_view address,
                            bool drain) const {
  std::string key;
  if (!instance_key(address, writer, &key)) return;
  change_instance(request, std::move(writer), drain ? "drained" : "undrained",
                  [key, drain](discovery::Registry& registry) { return registry.set_operator_drain(key, drain); });
}

void AdminRoutes::change_instance(const http::Request& request, http::ResponseWriter writer, std::string what,
                                  Operation operation) const {
  change_registry(request.worker, std::move(writer), std::move(operation),
                  [peer = request.peer, what = std::move(what)](const AdminOutcome& outcome) {
                    if (outcome.result == AdminResult::kOk) {
                      pdr::log::info("admin: {} {} (from {})", what, outcome.instance->key, peer);
                    }
                    return refusal(outcome);
                  });
}

void AdminRoutes::no_route(const http::Request& request, http::ResponseWriter writer) const {
  // Under /admin/instances/{host:port}/ only the instance actions exist.
  const bool instance_action = request.path.starts_with(std::string(kInstances) + "/");
  send(writer, {Result::kNotFound,
                error(404, "no admin route for " + request.method + " " + request.path +
                               (instance_action ? " (instance actions: drain, undrain)"
                                                : " (see GET /admin/instances)"),
                      "not_found")});
}

void AdminRoutes::seed_add(http::Request&& request, http::ResponseWriter writer) const {
  AdminThrottle::Scope scope = AdminThrottle::Scope::kAddress;
  switch (authorize(request, &scope)) {
    case Auth::kDisabled:
      send(writer, {Result::kDisabled,
                    error(403,
                          "the admin API is disabled: set admin.api_key_env or admin.api_key_file "
                          "in the topology file to enable /instances/add",
                          "admin_disabled")});
      return;
    case Auth::kUnauthorized:
      send(writer, {Result::kUnauthorized, error(403, "Forbidden: Invalid API Key.", "invalid_api_key")});
      return;
    case Auth::kThrottled:
      send(writer, throttled_reply(scope));
      return;
    case Auth::kOk:
      break;
  }
  add_parsed(std::move(request), std::move(writer), &parse_seed_add_instance,
             [](const AdminOutcome& outcome) -> Reply {
               if (outcome.result == AdminResult::kConflict) {
                 return {Result::kConflict, error(400, "Instance already exists. " + outcome.message, "conflict")};
               }
               if (!added(outcome)) return refusal(outcome);
               const auto& inst = *outcome.instance;
               std::string body = "{\"message\":";
               proto::append_json_string(body, "Added " + inst.key + " to " + seed_list_name(inst.role) + ".");
               body += "}";
               return {Result::kOk, http::Response::json(200, std::move(body))};
             });
}

void AdminRoutes::add_parsed(http::Request&& request, http::ResponseWriter writer, SpecParser parse,
                             Answer answer) const {
  const auto topology = context_.topology->current();
  config::StaticInstance spec;
  if (Status s = parse(request.body, topology->connectors, &spec); !s) {
    send(writer, {Result::kBadRequest, bad_request(s)});
    return;
  }
  change_registry(
      request.worker, std::move(writer),
      [spec](discovery::Registry& registry) { return registry.add_admin(spec, discovery::Clock::now()); },
      [via = request.path, peer = request.peer, answer = std::move(answer)](const AdminOutcome& outcome) {
        if (added(outcome)) {
          pdr::log::info("admin: {} {} {} via {} (from {})",
                       outcome.result == AdminResult::kCreated ? "added" : "took over registered",
                       proto::to_string(outcome.instance->role), outcome.instance->key, via, peer);
        }
        return answer(outcome);
      });
}

void AdminRoutes::change_registry(uint32_t worker, http::ResponseWriter writer, Operation operation,
                                  Answer answer) const {
  if (context_.discovery == nullptr || context_.server == nullptr) {
    send(writer, {Result::kUnavailable, error(503, "admin API unavailable", "admin_unavailable")});
    return;
  }
  WorkerState& state = workers_.at(worker);
  const uint64_t id = state.next_id++;
  state.pending.emplace(id, std::move(writer));
  // The outcome is written on the discovery thread and read on the worker; the two posts' queue
  // locks order the accesses.
  auto outcome = std::make_shared<AdminOutcome>();
  context_.discovery->post(
      [operation = std::move(operation), outcome](discovery::Registry& registry) {
        *outcome = operation(registry);
      },
      [this, worker, id, outcome, answer = std::move(answer)]() mutable {
        context_.server->post(worker, [this, worker, id, outcome, answer = std::move(answer)] {
          finish(worker, id, answer, *outcome);
        });
      });
}

void AdminRoutes::finish(uint32_t worker, uint64_t id, const Answer& answer,
                         const AdminOutcome& outcome) const {
  WorkerState& state = workers_.at(worker);
  auto it = state.pending.find(id);
  if (it == state.pending.end()) return;
  http::ResponseWriter writer = std::move(it->second);
  state.pending.erase(it);
  send(writer, answer(outcome));
}

}  // namespace pdr::router
