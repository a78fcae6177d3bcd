#include "router/routing/cache_tokenize.h"

#include <algorithm>
#include <memory>
#include <tuple>
#include <string>
#include <utility>

#include "discovery/load_charge.h"
#include "proto/dialects/dialect.h"
#include "proto/token_ids.h"
#include "router/policies/policy.h"
#include "router/routing/ejection.h"
#include "router/routing/buffer_budget.h"
#include "router/routing/cache_routing_counters.h"
#include "router/routing/pairing.h"
#include "router/routing/session_timer.h"

namespace pdr::router::routing {

static_assert(std::tuple_size_v<CacheTokenizeCounters> == kTokenizeResultCount);

namespace {

// Chat fields that change what the node's chat template makes of the messages (vLLM's
// TokenizeChatRequest accepts them); forwarded as sent so the ids are the ones the engine hashes.
constexpr std::string_view kChatFields[] = {"tools",         "add_generation_prompt", "continue_final_message",
                                            "chat_template", "chat_template_kwargs",  "add_special_tokens"};

// Appends the prefills a request for `model` could be paired with (pairing.h: up, a known
// connector whose dialect has a compatible decode up, both serving the model).
void pairable_prefills(const discovery::RoutableIndex& index, std::string_view model,
                       std::vector<const InstancePtr*>* out) {
  thread_local std::vector<const InstancePtr*> decodes;
  for (const discovery::RoutableGroup& prefills : index.groups) {
    if (prefills.role != proto::Role::kPrefill || proto::dialect_for(prefills.connector, prefills.transfer_mode) == nullptr) {
      continue;
    }
    const discovery::RoutableGroup* dg = index.find(proto::Role::kDecode, prefills.connector, prefills.transfer_mode);
    if (dg == nullptr) continue;
    decodes.clear();
    dg->serving(model, &decodes);
    if (!decodes.empty()) prefills.serving(model, out);
  }
}

// The node that tokenizes (see the header): labelled for it, else a prefill this request could
// be paired with; the least loaded, ties rotating from a random start.
InstancePtr pick_node(RoutingWorker& worker, std::string_view model) {
  const auto& snapshot = worker.registry();
  thread_local std::vector<const InstancePtr*> nodes;
  nodes.clear();
  for (const auto& inst : snapshot->instances) {
    if (routable(*inst) && serves_model(*inst, model) && serves_capability(inst->labels, kServesTokenize)) {
      nodes.push_back(&inst);
    }
  }
  discovery::RoutableIndex local;  // a hand-made snapshot (tests) has none built
  if (nodes.empty()) {
    if (!snapshot->routable.built) local = discovery::RoutableIndex::build(snapshot->instances);
    pairable_prefills(snapshot->routable.built ? snapshot->routable : local, model, &nodes);
    const auto now = discovery::Clock::now();
    auto is_ejected = [now](const InstancePtr* i) { return ejected(*(*i)->liveness, now); };
    if (!std::all_of(nodes.begin(), nodes.end(), is_ejected)) std::erase_if(nodes, is_ejected);
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

// One call's state, shared by its callbacks; what it holds (the node's outstanding count, the
// answer's bytes of the buffered-bytes budget, the deadline) is given back by release(), at the
// latest when the call lets go of its callbacks (done or cancelled).
struct TokenizeCall {
  TokenizeDone done;
  InstancePtr node;
  discovery::LoadCharge charge;  // a request in flight on `node` while the call runs
  BufferBudget* buffered = nullptr;
  size_t max_bytes = 0;
  uint64_t budget = 0;  // limits.max_buffered_bytes (0: none)
  int status = 0;
  std::string answer;
  size_t reserved = 0;  // answer bytes taken from *buffered
  std::weak_ptr<NodeCalls::Call> call;
  SessionTimer deadline;

  ~TokenizeCall() { release(); }

  void release() {
    deadline.stop();
    charge.release();
    node.reset();
    if (reserved != 0) {
      buffered->release(static_cast<int64_t>(reserved));
      reserved = 0;
    }
    answer = std::string();
  }

  // Ends the call early (deadline, size, budget): the connection is closed, `done` told why.
  void abandon(TokenizeResult why) {
    if (auto c = call.lock()) c->cancel();
    finish(false, why, {});
  }

  void finish(bool ok, TokenizeResult why_not, std::vector<uint32_t>&& tokens) {
    release();
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
    case TokenizeResult::kMemoryBudget: return "memory_budget";
  }
  return "unknown";
}

bool wants_tokenize(const proto::JsonObjectBody& body, const config::Topology& topology,
                    const RoutingShared& shared) {
  if (!topology.policies.cache_aware.tokenize_by_node || shared.block_index == nullptr) return false;
  if (auto prompt = body.get_raw("prompt")) return !prompt->empty() && prompt->front() == '"';
  auto messages = body.get_raw("messages");
  return messages && !messages->empty() && messages->front() == '[';
}

NodeCalls::CallPtr start_tokenize(RoutingWorker& worker, const proto::JsonObjectBody& body, std::string_view model,
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
  state->buffered = &worker.buffered();
  state->budget = topology.limits.max_buffered_bytes;
  http::UpstreamCallbacks cb;
  cb.on_head = [state](int status, const std::vector<http::Header>&) { state->status = status; };
  cb.on_body = [state](std::string_view chunk) {
    if (!state->done) return;
    if (state->answer.size() + chunk.size() > state->max_bytes) return state->abandon(TokenizeResult::kTooLarge);
    // The answer is held in memory until it is whole: it takes its share of the budget every
    // request body and buffered answer shares.
    if (!state->buffered->reserve(chunk.size(), state->budget)) {
      return state->abandon(TokenizeResult::kMemoryBudget);
    }
    state->reserved += chunk.size();
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
  // Each step is bounded by the whole call's time too; the deadline below bounds their sum (a
  // node answering a byte at a time never trips a per-read timeout).
  const http::UpstreamTimeouts timeouts{std::min(topology.timeouts.connect, config.tokenize_timeout),
                                        config.tokenize_timeout, config.tokenize_timeout};
  state->charge = discovery::LoadCharge(*node, std::nullopt);
  state->node = std::move(node);
  request.tls = worker.node_tls(state->node->http_address);
  NodeCalls::CallPtr call =
      worker.upstream().start(state->node->http_address, std::move(request), timeouts, std::move(cb));
  state->call = call;
  std::weak_ptr<TokenizeCall> weak = state;
  state->deadline.start(worker.timers(), config.tokenize_timeout, [weak] {
    if (auto self = weak.lock()) self->abandon(TokenizeResult::kTimeout);
  });
  return call;
}

}  // namespace pdr::router::routing
