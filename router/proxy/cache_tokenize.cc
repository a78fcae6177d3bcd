#include "router/proxy/cache_tokenize.h"

#include <algorithm>
#include <memory>
#include <tuple>
#include <string>
#include <utility>

#include "proto/token_ids.h"
#include "router/policies/policy.h"
#include "router/proxy/node_endpoints.h"
#include "router/proxy/pairing.h"

namespace pdr::router::proxy {

static_assert(std::tuple_size_v<decltype(ProxyCounters::cache_tokenize)> == kTokenizeResultCount);

namespace {

// Chat fields that change what the node's chat template makes of the messages (vLLM's
// TokenizeChatRequest accepts them); forwarded as sent so the ids are the ones the engine hashes.
constexpr std::string_view kChatFields[] = {"tools",         "add_generation_prompt", "continue_final_message",
                                            "chat_template", "chat_template_kwargs",  "add_special_tokens"};

// The least loaded up node serving `model`, any role (every vLLM node tokenizes); ties rotate.
InstancePtr pick_node(WorkerContext& worker, std::string_view model) {
  const auto& snapshot = worker.registry();
  std::vector<const InstancePtr*> nodes;
  for (const auto& inst : snapshot->instances) {
    if (routable(*inst) && serves_model(*inst, model)) nodes.push_back(&inst);
  }
  if (nodes.empty()) return nullptr;
  return *least_loaded_node(nodes, worker.random() % nodes.size());
}

// {"model":..,"prompt":..} or {"model":..,"messages":..,<chat fields>}: raw values of the client's
// body, which is valid JSON, so the result is too.
std::string tokenize_body(const proto::JsonObjectBody& body) {
  std::string out = "{";
  auto member = [&](std::string_view key, std::string_view raw) {
    if (out.size() > 1) out += ',';
    out += '"';
    out += key;
    out += "\":";
    out += raw;
  };
  if (auto model = body.get_raw("model")) member("model", *model);
  if (auto prompt = body.get_raw("prompt")) {
    member("prompt", *prompt);
    if (auto special = body.get_raw("add_special_tokens")) member("add_special_tokens", *special);
  } else if (auto messages = body.get_raw("messages")) {
    member("messages", *messages);
    for (std::string_view key : kChatFields) {
      if (auto raw = body.get_raw(key)) member(key, *raw);
    }
  }
  out += '}';
  return out;
}

struct TokenizeCall {
  TokenizeDone done;
  size_t max_bytes = 0;
  int status = 0;
  std::string answer;
  std::weak_ptr<UpstreamPort::Call> call;

  void finish(bool ok, TokenizeResult why_not, std::vector<uint32_t>&& tokens) {
    if (!done) return;
    TokenizeDone d = std::move(done);
    done = nullptr;
    d(ok, why_not, std::move(tokens));
  }
};

}  // namespace

std::string_view to_string(TokenizeResult result) {
  switch (result) {
    case TokenizeResult::kMatched: return "matched";
    case TokenizeResult::kNoMatch: return "no_match";
    case TokenizeResult::kNoNode: return "no_node";
    case TokenizeResult::kTimeout: return "timeout";
    case TokenizeResult::kFailed: return "failed";
    case TokenizeResult::kTooLarge: return "too_large";
    case TokenizeResult::kBadAnswer: return "bad_answer";
    case TokenizeResult::kCancelled: return "cancelled";
  }
  return "unknown";
}

bool wants_tokenize(const proto::JsonObjectBody& body, const config::Topology& topology,
                    const ProxyShared& shared) {
  if (!topology.policies.cache_aware.tokenize_by_node || shared.block_index == nullptr) return false;
  if (auto prompt = body.get_raw("prompt")) return !prompt->empty() && prompt->front() == '"';
  auto messages = body.get_raw("messages");
  return messages && !messages->empty() && messages->front() == '[';
}

UpstreamPort::CallPtr start_tokenize(WorkerContext& worker, const proto::JsonObjectBody& body, std::string_view model,
                                     std::string_view authorization, TokenizeDone done) {
  InstancePtr node = pick_node(worker, model);
  if (!node) return nullptr;
  const config::Topology& topology = *worker.topology();
  const auto& config = topology.policies.cache_aware;

  http::UpstreamRequest request;
  request.method = "POST";
  request.path = "/tokenize";
  request.headers.push_back({"Content-Type", "application/json"});
  std::string auth = upstream_authorization(topology, authorization);
  if (!auth.empty()) request.headers.push_back({"Authorization", std::move(auth)});
  request.body = tokenize_body(body);

  auto state = std::make_shared<TokenizeCall>();
  state->done = std::move(done);
  state->max_bytes = config.tokenize_max_answer_bytes;
  http::UpstreamCallbacks cb;
  cb.on_head = [state](int status, const std::vector<http::Header>&) { state->status = status; };
  cb.on_body = [state](std::string_view chunk) {
    if (!state->done) return;
    if (state->answer.size() + chunk.size() > state->max_bytes) {
      if (auto call = state->call.lock()) call->cancel();
      state->answer = std::string();
      state->finish(false, TokenizeResult::kTooLarge, {});
      return;
    }
    state->answer.append(chunk);
  };
  cb.on_complete = [state] {
    if (state->status != 200) return state->finish(false, TokenizeResult::kFailed, {});
    // Bounded: the answer is at most max_bytes, the depth at the JSON limits' default.
    proto::JsonLimits limits;
    limits.max_bytes = state->max_bytes;
    proto::JsonObjectBody answer;
    if (!proto::JsonObjectBody::parse_borrowed(state->answer, limits, &answer).is_ok()) {
      return state->finish(false, TokenizeResult::kBadAnswer, {});
    }
    std::vector<uint32_t> tokens;
    auto raw = answer.get_raw("tokens");
    if (!raw || !proto::parse_token_id_array(*raw, kMaxTokenizedIds, &tokens)) {
      return state->finish(false, TokenizeResult::kBadAnswer, {});
    }
    state->finish(true, TokenizeResult::kMatched, std::move(tokens));
  };
  cb.on_error = [state](const Status&) {
    auto call = state->call.lock();
    const bool timeout = call && http::is_timeout(call->failure());
    state->finish(false, timeout ? TokenizeResult::kTimeout : TokenizeResult::kFailed, {});
  };
  const http::UpstreamTimeouts timeouts{std::min(topology.timeouts.connect, config.tokenize_timeout),
                                        config.tokenize_timeout, config.tokenize_timeout};
  UpstreamPort::CallPtr call =
      worker.upstream().start(node->http_address, std::move(request), timeouts, std::move(cb));
  state->call = call;
  return call;
}

}  // namespace pdr::router::proxy
