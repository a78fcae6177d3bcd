#include "node/sim/server.h"

#include <algorithm>
#include <atomic>

#include <uv.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>
#include "proto/base/log.h"

#include "node/sim/aux_api.h"
#include "node/sim/dialect.h"
#include "node/sim/dialects/common.h"
#include "node/sim/faults.h"
#include "node/sim/generation.h"
#include "node/sim/messages.h"
#include "node/sim/prompt_tokens.h"
#include "node/sim/responses.h"
#include "node/sim/request_log.h"
#include "router/http/http_server.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string random_hex32() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

http::Response json_response(int status, std::string body) {
  return http::Response::json(status, std::move(body));
}

}  // namespace

// One in-flight generation, owned by its worker's table.
struct Generation {
  uint64_t seq = 0;  // request log sequence number, also the table key
  uint32_t worker = 0;
  http::ResponseWriter writer;
  GenerationRequest req;
  KvRequest kv;
  std::string request_id;   // X-Request-Id (or generated)
  std::string response_id;  // cmpl-... / chatcmpl-...
  int64_t created = 0;
  std::vector<std::string> tokens;
  size_t next_token = 0;
  Clock::time_point first_token_at;
  std::chrono::nanoseconds per_token{0};
  struct TimerBox* timer = nullptr;
  // Fault injection (faults.h). `held` is set while a delay_ms fault holds the request: the
  // timer fires when the delay is over and `held_fault` (the rest of the fault) runs then. A hang
  // fault parks an entry with neither timer nor request; only the client's close removes it.
  std::optional<http::Request> held;
  FaultSpec held_fault;
  std::optional<uint32_t> close_after_tokens;
  bool stopped = false;  // stop_after_first_token: ends by "stop" (EOS), a prefill exports no KV
  // A decode leg's KV import (KvMover): the lease to end, and whether tokens wait for it.
  uint64_t kv_lease = 0;
  bool kv_waiting = false;
  std::vector<uint32_t> prompt_ids;  // a decode leg's, stored in its prefix cache once imported
  bool counted_running = false;  // in Impl::generations_running until erased
  // A prefill leg reusing the last turn's decode KV (reuse_blocks_of): the prompt tokens its own
  // prefix cache held; the prefill then computes only what neither holds.
  bool reusing = false;
  uint32_t cached_tokens = 0;
  // Engine mode: the engine times the request until it finished there (engine_done); its KV
  // pulls wait for the engine's kLoadRemote (a reuse's blocks are kept here until then).
  bool in_engine = false;
  bool engine_done = false;
  bool remote_logged = false;
  bool hold_handed_over = false;  // its engine blocks wait for the KV mover (release_blocks)
  std::optional<KvBlocks> pending_reuse;
  // A completion or chat stream's token chunk but the last, around the token's JSON text
  // (write_token), built on the first token: the same bytes sse_token_chunk() gives, without
  // building a JSON object per token.
  std::string chunk_head, chunk_tail;
};

struct TimerBox {
  uv_timer_t handle{};
  void* impl = nullptr;  // the SimServer::Impl that armed it
  uint32_t worker = 0;
  uint64_t seq = 0;
};

struct SimServer::Impl {
  SimOptions options;
  const SimDialect* dialect = nullptr;  // find_sim_dialect(options.node); start() needs one
  std::unique_ptr<KvMover> mover;
  http::Server server;
  std::unique_ptr<http::Server> bootstrap;
  SimRequestLog log;
  FaultQueue faults;
  int64_t started_unix = unix_seconds();
  // Per worker, touched only on that worker's thread.
  std::vector<std::unordered_map<uint64_t, std::unique_ptr<Generation>>> in_flight;
  bool running = false;  // start()/stop() thread only
  // Set (release) once the node identity (bound port, engine id) is final; workers check it
  // (acquire) before reading `options`, since they start serving before the port is known.
  std::atomic<bool> identity_ready{false};
  // What GET /metrics reports (any worker writes them).
  std::atomic<int64_t> generations_running{0};
  std::atomic<uint64_t> generations_finished{0}, prompt_tokens_total{0}, generated_tokens_total{0};
  std::string metrics_text() const;
  // Engine mode (options.engine): created by start(), stopped by stop() after the workers.
  std::unique_ptr<SimEngine> engine;
  // A modelled duration of `us` microseconds in wall-clock time (options.time_scale).
  // Engine mode: P/D prefill legs whose finished request keeps its engine blocks until the KV
  // mover says the decode has the KV (by transfer key; any thread).
  std::mutex holds_mu;
  std::unordered_map<std::string, std::vector<uint64_t>> holds;
  void hold_blocks(const std::string& key, uint64_t seq) {
    std::lock_guard<std::mutex> lock(holds_mu);
    holds[key].push_back(seq);
  }
  void release_blocks(const std::string& key) {
    std::vector<uint64_t> seqs;
    {
      std::lock_guard<std::mutex> lock(holds_mu);
      auto it = holds.find(key);
      if (it == holds.end()) return;
      seqs = std::move(it->second);
      holds.erase(it);
    }
    for (uint64_t seq : seqs) engine->cancel(seq);
  }
  std::chrono::nanoseconds scaled_us(double us) const {
    return std::chrono::nanoseconds(static_cast<int64_t>(us * 1000.0 * options.time_scale));
  }

  void handle(http::Request&& request, http::ResponseWriter writer);
  // `fault`: the fault shaping the answer (close_after_tokens, stop_after_first_token), or none.
  void route(http::Request&& request, uint64_t seq, http::ResponseWriter writer,
             const FaultSpec& fault = {});
  void handle_faults_endpoint(const http::Request& request, http::ResponseWriter& writer);
  void handle_abort_requests(const http::Request& request, uint64_t seq, http::ResponseWriter& writer);
  void abort_engine_ids(uint32_t worker, const std::vector<std::string>& ids);
  // The endpoints of aux_api.h; false when `request` is none of them.
  bool handle_aux(const http::Request& request, uint64_t seq, http::ResponseWriter& writer);
  void handle_prefix_cache_endpoint(const http::Request& request, uint64_t seq,
                                    http::ResponseWriter& writer);
  void handle_generation(ApiKind kind, http::Request&& request, uint64_t seq,
                         http::ResponseWriter writer, const FaultSpec& fault);
  void apply_fault(FaultSpec fault, http::Request&& request, uint64_t seq,
                   http::ResponseWriter writer);
  void release_held(Generation& g);
  // The connection ends at once, with nothing (more) sent, as when a server dies.
  static void close_unanswered(http::ResponseWriter writer) { writer.abort(); }
  void cut(Generation& g);
  void answer(http::ResponseWriter& writer, uint64_t seq, http::Response response);
  // `path`: the request's, whose API shapes the error body (messages.h's sim_error_body).
  void answer_error(http::ResponseWriter& writer, uint64_t seq, const SimError& error, std::string_view path = {});
  std::string models_json() const;
  // The dialect's prefill runs a bootstrap server (GET /query) and this node is a prefill.
  bool serves_bootstrap() const {
    return dialect->bootstrap_query != nullptr && options.node.role == proto::Role::kPrefill;
  }

  void arm_timer(Generation& g, Clock::time_point when);
  void arm_first_timer(Generation& g);
  void start_kv_import(Generation& g);
  void on_kv_imported(uint32_t worker, uint64_t seq, std::optional<SimError> error);
  void on_timer(uint32_t worker, uint64_t seq);
  void emit_due_tokens(Generation& g);
  // Streams g.tokens[g.next_token] (with finish_reason when it is the last) and moves on.
  void write_token(Generation& g);
  void submit_to_engine(Generation& g, const json& body);
  void deliver_engine_notices(std::vector<EngineNotice> notices);
  void on_engine_notices(uint32_t worker, const std::vector<EngineNotice>& notices);
  void on_engine_token(Generation& g, bool finished);
  void finish(Generation& g);
  void abort(uint32_t worker, uint64_t seq);
  void erase(uint32_t worker, uint64_t seq);
  Generation* find(uint32_t worker, uint64_t seq);
  KvBlocks blocks_of(const Generation& g) const;
  // Bidirectional NIXL (--bidirectional-kv-xfer): the blocks of the last turn a prefill leg pulls
  // from that turn's decode, when its kv_transfer_params name them (do_remote_decode with
  // remote_block_ids, as the router rewrites a decode's final params); nullopt otherwise.
  std::optional<KvBlocks> reuse_blocks_of(const Generation& g) const;
  void start_kv_reuse(Generation& g, KvBlocks blocks);
  void on_kv_reused(uint32_t worker, uint64_t seq, uint32_t tokens, std::optional<SimError> error);
};

namespace {

void close_timer(TimerBox* box) {
  uv_timer_stop(&box->handle);
  uv_close(reinterpret_cast<uv_handle_t*>(&box->handle),
           [](uv_handle_t* h) { delete static_cast<TimerBox*>(h->data); });
}

}  // namespace

void SimServer::Impl::answer(http::ResponseWriter& writer, uint64_t seq, http::Response response) {
  const int status = response.status;
  writer.send(std::move(response));
  if (seq != 0) log.set_status(seq, status);
}

void SimServer::Impl::answer_error(http::ResponseWriter& writer, uint64_t seq, const SimError& error,
                                   std::string_view path) {
  log.count_error(error.reason);
  pdr::log::debug("sim: {} {}: {}", error.status, error.reason, error.message);
  answer(writer, seq, json_response(error.status, sim_error_body(path, error)));
}

std::string SimServer::Impl::metrics_text() const {
  if (engine) return engine->metrics_text();
  const std::string labels = "{engine=\"0\",model_name=\"" + options.model + "\"}";
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, const std::string& value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    out += std::string(name) + labels + " " + value + "\n";
  };
  family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
         std::to_string(generations_running.load(std::memory_order_relaxed)));
  // The per-token model starts every request at once (no scheduler, no queue: that is --engine
  // vllm's), so none ever waits; routers read the family, as they would vLLM's.
  family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "0");
  family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
         std::to_string(generations_finished.load(std::memory_order_relaxed)));
  family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
         std::to_string(prompt_tokens_total.load(std::memory_order_relaxed)));
  family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
         std::to_string(generated_tokens_total.load(std::memory_order_relaxed)));
  return out;
}

std::string SimServer::Impl::models_json() const {
  json model{{"id", options.model},         {"object", "model"},
             {"created", started_unix},     {"owned_by", "vllm"},
             {"root", options.model},       {"parent", nullptr},
             {"max_model_len", options.max_model_len}};
  return json{{"object", "list"}, {"data", json::array({model})}}.dump();
}

void SimServer::Impl::handle(http::Request&& request, http::ResponseWriter writer) {
  const bool test_path = request.path.starts_with("/sim/");
  const uint64_t seq = test_path ? 0 : log.record(request);
  if (!test_path) {
    if (std::optional<FaultSpec> fault = faults.take(request.path)) {
      log.set_fault(seq, fault->to_json());
      return apply_fault(*std::move(fault), std::move(request), seq, std::move(writer));
    }
  }
  route(std::move(request), seq, std::move(writer));
}

void SimServer::Impl::route(http::Request&& request, uint64_t seq, http::ResponseWriter writer,
                            const FaultSpec& fault) {
  try {
    const bool get = request.method == "GET";
    const bool post = request.method == "POST";
    if (request.path == "/health" && get) return answer(writer, seq, http::Response{200, {}, ""});
    if (request.path == "/metrics" && get) {
      return answer(writer, seq, http::Response{200, {{"Content-Type", "text/plain; version=0.0.4"}}, metrics_text()});
    }
    if (request.path == "/v1/models" && get) {
      return answer(writer, seq, json_response(200, models_json()));
    }
    if (request.path == "/v1/completions" && post) {
      return handle_generation(ApiKind::kCompletion, std::move(request), seq, std::move(writer),
                               fault);
    }
    if (request.path == "/v1/chat/completions" && post) {
      return handle_generation(ApiKind::kChat, std::move(request), seq, std::move(writer), fault);
    }
    if (request.path == "/inference/v1/generate" && post) {
      return handle_generation(ApiKind::kGenerate, std::move(request), seq, std::move(writer), fault);
    }
    if (request.path == "/v1/responses" && post) {
      return handle_generation(ApiKind::kResponses, std::move(request), seq, std::move(writer), fault);
    }
    if (request.path == "/abort_requests" && post && options.tokens_only) {
      return handle_abort_requests(request, seq, writer);
    }
    if (request.path == kSimMessagesPath && post) {
      return handle_generation(ApiKind::kMessages, std::move(request), seq, std::move(writer), fault);
    }
    if (post && handle_aux(request, seq, writer)) return;
    if (request.path == "/query" && get && serves_bootstrap()) {
      return answer(writer, seq, json_response(200, dialect->bootstrap_query(options.node)));
    }
    if (request.path == "/sim/requests" && get) {
      return answer(writer, seq, json_response(200, log.to_json()));
    }
    if (request.path == "/sim/reset" && post) {
      log.reset();
      return answer(writer, seq, json_response(200, "{}"));
    }
    if (request.path == "/sim/faults") return handle_faults_endpoint(request, writer);
    if (request.path == "/sim/prefix_cache" || (request.path == "/reset_prefix_cache" && post)) {
      return handle_prefix_cache_endpoint(request, seq, writer);
    }
    if (request.path == "/sim/kv" && get) {
      return answer(writer, seq, json_response(200, mover->stats().dump()));
    }
    answer_error(writer, seq, SimError{404, "not_found", "Not Found: " + request.path});
  } catch (const std::exception& e) {
    // nlohmann throws on type mismatches inside odd request bodies; the body is the client's fault.
    if (writer) answer_error(writer, seq, SimError{400, "bad_json", e.what()});
  }
}

bool SimServer::Impl::handle_aux(const http::Request& request, uint64_t seq, http::ResponseWriter& writer) {
  using AuxFn = std::optional<SimError> (*)(const json&, const AuxContext&, std::string*);
  AuxFn fn = nullptr;
  if (request.path == "/tokenize") fn = &sim_tokenize;
  else if (request.path == "/detokenize") fn = &sim_detokenize;
  else if (request.path == "/v1/embeddings") fn = &sim_embeddings;
  else if (request.path == "/v1/chat/completions/render") fn = &sim_render_chat;
  else if (request.path == "/v1/completions/render") fn = &sim_render_completions;
  else if (request.path == kSimCountTokensPath) fn = &sim_count_tokens;
  if (fn == nullptr) return false;
  const json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    answer_error(writer, seq, SimError{400, "bad_json", "request body is not valid JSON"}, request.path);
    return true;
  }
  AuxContext ctx;
  ctx.served_model = options.model;
  ctx.max_model_len = options.max_model_len;
  ctx.feature_bytes = options.render_feature_bytes;
  const auto id = request.header("X-Request-Id");
  ctx.request_id = id && !id->empty() ? std::string(*id) : random_hex32();
  ctx.created = unix_seconds();
  std::string out;
  if (auto e = fn(body, ctx, &out)) {
    answer_error(writer, seq, *e, request.path);
  } else {
    answer(writer, seq, json_response(200, std::move(out)));
  }
  return true;
}

void SimServer::Impl::handle_faults_endpoint(const http::Request& request,
                                             http::ResponseWriter& writer) {
  if (request.method == "POST") {
    FaultSpec fault;
    if (auto e = parse_fault(request.body, &fault)) {
      return answer_error(writer, 0, SimError{400, "bad_fault", *e});
    }
    faults.push(std::move(fault));
  } else if (request.method == "DELETE") {
    faults.clear();
  } else if (request.method != "GET") {
    return answer_error(writer, 0, SimError{405, "bad_method", "use GET, POST or DELETE"});
  }
  answer(writer, 0, json_response(200, faults.to_json()));
}

void SimServer::Impl::handle_prefix_cache_endpoint(const http::Request& request, uint64_t seq,
                                                   http::ResponseWriter& writer) {
  if (request.path == "/reset_prefix_cache") {
    if (engine) {
      engine->reset_prefix_cache();
    } else {
      options.cache->reset();
    }
    return answer(writer, seq, http::Response{200, {}, ""});
  }
  if (request.method == "POST") {
    const json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || !body.contains("withhold_batches") ||
        !body["withhold_batches"].is_number_unsigned() ||
        body["withhold_batches"].get<uint64_t>() > 1000000 || options.cache->publisher() == nullptr) {
      return answer_error(writer, seq,
                          SimError{400, "bad_prefix_cache_control",
                                   "expected {\"withhold_batches\": 0..1000000} on a node "
                                   "publishing KV events"});
    }
    options.cache->publisher()->withhold(body["withhold_batches"].get<uint32_t>());
  } else if (request.method != "GET") {
    return answer_error(writer, seq, SimError{405, "bad_method", "use GET or POST"});
  }
  if (engine) {
    json stats = engine->prefix_cache_json();
    SimKvEventsPublisher* publisher = options.cache->publisher();
    stats["kv_events"] = publisher != nullptr ? publisher->stats() : json(nullptr);
    return answer(writer, seq, json_response(200, stats.dump()));
  }
  answer(writer, seq, json_response(200, options.cache->stats_json().dump()));
}

void SimServer::Impl::apply_fault(FaultSpec fault, http::Request&& request, uint64_t seq,
                                  http::ResponseWriter writer) {
  const uint32_t worker = request.worker;
  if (fault.delay_ms > 0) {
    auto g = std::make_unique<Generation>();
    g->seq = seq;
    g->worker = worker;
    g->writer = std::move(writer);
    g->held_fault = fault;
    g->held_fault.delay_ms = 0;
    g->held = std::move(request);
    g->writer.on_client_close([this, worker, seq] { abort(worker, seq); });
    Generation& ref = *g;
    in_flight[worker][seq] = std::move(g);
    return arm_timer(ref, Clock::now() + std::chrono::milliseconds(fault.delay_ms));
  }
  switch (fault.action) {
    case FaultSpec::Action::kNone:
      return route(std::move(request), seq, std::move(writer));
    case FaultSpec::Action::kStatus: {
      const SimError error{fault.status, "fault",
                           "injected fault: HTTP " + std::to_string(fault.status)};
      return answer(writer, seq, json_response(error.status, sim_error_body(request.path, error)));
    }
    case FaultSpec::Action::kHang: {
      auto g = std::make_unique<Generation>();
      g->seq = seq;
      g->worker = worker;
      g->writer = std::move(writer);
      g->writer.on_client_close([this, worker, seq] { abort(worker, seq); });
      in_flight[worker][seq] = std::move(g);
      return;
    }
    case FaultSpec::Action::kCloseImmediately:
      return close_unanswered(std::move(writer));
    case FaultSpec::Action::kCloseAfterTokens:
      if (request.path == "/v1/completions" || request.path == "/v1/chat/completions" ||
          request.path == "/inference/v1/generate" || request.path == "/v1/responses" ||
          request.path == kSimMessagesPath) {
        return route(std::move(request), seq, std::move(writer), fault);
      }
      return close_unanswered(std::move(writer));  // no tokens to count
    case FaultSpec::Action::kStopAfterFirstToken:
      return route(std::move(request), seq, std::move(writer), fault);  // others answer as usual
  }
}

void SimServer::Impl::release_held(Generation& g) {
  const uint32_t worker = g.worker;
  const uint64_t seq = g.seq;
  http::Request request = std::move(*g.held);
  http::ResponseWriter writer = std::move(g.writer);
  FaultSpec fault = std::move(g.held_fault);
  erase(worker, seq);
  apply_fault(std::move(fault), std::move(request), seq, std::move(writer));
}

// A close_after_tokens fault firing: the stream (or the non-stream answer) is cut short.
void SimServer::Impl::cut(Generation& g) {
  const uint32_t worker = g.worker;
  const uint64_t seq = g.seq;
  if (g.req.stream) log.set_status(seq, 200);  // the 200 head was sent
  http::ResponseWriter writer = std::move(g.writer);
  erase(worker, seq);
  close_unanswered(std::move(writer));
}

void SimServer::Impl::handle_generation(ApiKind kind, http::Request&& request, uint64_t seq,
                                        http::ResponseWriter writer, const FaultSpec& fault) {
  const json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return answer_error(writer, seq, SimError{400, "bad_json", "request body is not valid JSON"}, request.path);
  }
  auto g = std::make_unique<Generation>();
  if (auto e = parse_generation_request(kind, body, options.model, &g->req)) {
    return answer_error(writer, seq, *e, request.path);
  }
  const auto request_id_header = request.header("X-Request-Id");
  g->request_id = request_id_header && !request_id_header->empty() ? std::string(*request_id_header)
                                                                   : random_hex32();
  std::optional<std::string> dp_rank;
  if (auto h = request.header("X-data-parallel-rank")) dp_rank = std::string(*h);
  if (g->req.kind == ApiKind::kGenerate) {
    // The connector sees the parameters the generate handler passes on (GenerationRequest).
    json kv_body = json::object();
    for (auto it = body.begin(); it != body.end(); ++it) {
      if (it.key() != "token_ids" && it.key() != "features" && it.key() != "sampling_params") {
        kv_body[it.key()] = it.value();
      }
    }
    kv_body["kv_transfer_params"] = g->req.kv_transfer_params;
    if (auto e = check_kv_request(*dialect, options.node, g->request_id, dp_rank, kv_body, &g->kv)) {
      return answer_error(writer, seq, *e);
    }
  } else if (auto e = check_kv_request(*dialect, options.node, g->request_id, dp_rank, body, &g->kv)) {
    return answer_error(writer, seq, *e, request.path);
  }
  // vLLM's two refusals (serving_engine._validate_input): the prompt alone, then with max_tokens.
  const std::string max_len = std::to_string(options.max_model_len);
  const std::string prompt_len = std::to_string(g->req.prompt_tokens);
  if (g->req.prompt_tokens >= options.max_model_len) {
    return answer_error(writer, seq,
                        SimError{400, "too_long",
                                 "This model's maximum context length is " + max_len +
                                     " tokens. However, your request has " + prompt_len +
                                     " input tokens. Please reduce the length of the input messages."},
                        request.path);
  }
  if (g->req.prompt_tokens + g->req.max_tokens > options.max_model_len) {
    const std::string max_tokens = std::to_string(g->req.max_tokens);
    return answer_error(writer, seq,
                        SimError{400, "too_long",
                                 "'max_tokens' or 'max_completion_tokens' is too large: " + max_tokens +
                                     ". This model's maximum context length is " + max_len +
                                     " tokens and your request has " + prompt_len + " input tokens (" +
                                     max_tokens + " > " + max_len + " - " + prompt_len + ")."},
                        request.path);
  }
  g->seq = seq;
  g->worker = request.worker;
  if (fault.action == FaultSpec::Action::kCloseAfterTokens) g->close_after_tokens = fault.close_after_tokens;
  g->response_id = response_id(kind, g->request_id);
  g->created = unix_seconds();
  g->tokens = generate_tokens(g->request_id, g->req.prompt_text, g->req.max_tokens);
  if (fault.action == FaultSpec::Action::kStopAfterFirstToken) {
    g->tokens.resize(1);  // generate_tokens gives at least one (max_tokens >= 1)
    g->stopped = true;
  }
  // A decode leg's prompt KV arrives from the prefill node, so it pays no prefill time; its
  // blocks enter its prefix cache once they arrived (on_kv_imported). Others compute what their
  // prefix cache does not hold. (The engine keeps its own cache.)
  uint32_t uncached = 0;
  if (engine) {
    // Timed by the engine (submit_to_engine below).
  } else if (g->kv.leg == KvLeg::kDecode) {
    g->prompt_ids = prompt_token_ids(kind, body);
  } else {
    const PrefixCacheUpdate cached =
        options.cache->on_prompt(g->kv.dp_rank, prompt_token_ids(kind, body));
    log.set_prefix_cache(seq, cached.cached_tokens, cached.queried_tokens);
    g->cached_tokens = cached.cached_tokens;
    uncached = g->req.prompt_tokens - std::min(g->req.prompt_tokens, cached.cached_tokens);
  }
  g->per_token = scaled_us(options.decode_us_per_token);
  g->first_token_at = Clock::now() + scaled_us(static_cast<double>(options.prefill_us_per_token) * uncached);
  g->writer = std::move(writer);

  if (g->req.stream) {
    g->writer.start_stream(200, {{"Content-Type", "text/event-stream; charset=utf-8"}});
    if (kind == ApiKind::kChat) {
      g->writer.write(sse_role_chunk(g->req, g->response_id, g->created));
    } else if (kind == ApiKind::kResponses) {
      g->writer.write(responses_open_events(g->req, g->response_id, g->created));
    } else if (kind == ApiKind::kMessages) {
      g->writer.write(messages_open_events(g->req, g->response_id));
    }
  }
  const uint32_t worker = g->worker;
  g->writer.on_client_close([this, worker, seq] { abort(worker, seq); });
  g->counted_running = true;
  generations_running.fetch_add(1, std::memory_order_relaxed);
  Generation& ref = *g;
  in_flight[worker][seq] = std::move(g);
  if (engine) return submit_to_engine(ref, body);
  // A decode leg produces nothing before its prompt's KV has arrived.
  if (ref.kv.leg == KvLeg::kDecode) return start_kv_import(ref);
  // Nor does a prefill reusing the last turn's decode KV before it pulled those blocks.
  if (auto reuse = reuse_blocks_of(ref)) return start_kv_reuse(ref, std::move(*reuse));
  arm_first_timer(ref);
}

void SimServer::Impl::submit_to_engine(Generation& g, const json& body) {
  EngineArrival a;
  a.key = g.seq;
  a.route = g.worker;
  a.rank = g.kv.dp_rank;
  a.arrival = Clock::now();
  a.spec.prompt = prompt_token_ids(g.req.kind, body);
  // The engine counts what the server counts (prompt_tokens.h keeps them equal).
  a.spec.prompt.resize(g.req.prompt_tokens, 0);
  a.spec.outputs.reserve(g.tokens.size());
  for (const std::string& token : g.tokens) {
    a.spec.outputs.push_back(static_cast<uint32_t>(generated_token_id(token)));
  }
  // A prefill keeps its KV until the decode has read it, as vLLM's connectors delay freeing.
  a.spec.hold_blocks_after_finish = g.kv.leg == KvLeg::kPrefill && !g.stopped;
  if (g.kv.leg == KvLeg::kDecode) {
    a.spec.remote_tokens = g.req.prompt_tokens;
  } else if (auto reuse = reuse_blocks_of(g)) {
    a.spec.remote_tokens = std::min(reuse->prompt_tokens, g.req.prompt_tokens);
    g.pending_reuse = std::move(*reuse);
  }
  g.in_engine = true;
  engine->submit(std::move(a));
}

void SimServer::Impl::deliver_engine_notices(std::vector<EngineNotice> notices) {
  // One post per worker that owns one of these requests, in the engine's order.
  const uint32_t workers = static_cast<uint32_t>(in_flight.size());
  if (workers == 1) {
    server.post(0, [this, notices = std::move(notices)] { on_engine_notices(0, notices); });
    return;
  }
  std::vector<std::vector<EngineNotice>> by_worker(workers);
  for (EngineNotice& n : notices) by_worker[n.route < workers ? n.route : 0].push_back(n);
  for (uint32_t w = 0; w < workers; ++w) {
    if (by_worker[w].empty()) continue;
    server.post(w, [this, w, batch = std::move(by_worker[w])] { on_engine_notices(w, batch); });
  }
}

void SimServer::Impl::on_engine_notices(uint32_t worker, const std::vector<EngineNotice>& notices) {
  for (const EngineNotice& n : notices) {
    Generation* g = find(worker, n.key);
    if (g == nullptr || !g->in_engine) continue;  // gone meanwhile (the engine was told)
    try {
      switch (n.kind) {
        case EngineNotice::Kind::kAdmitted:
          if (!g->remote_logged) log.set_prefix_cache(g->seq, n.cached_tokens, n.queried_tokens);
          g->cached_tokens = n.cached_tokens;
          break;
        case EngineNotice::Kind::kLoadRemote:
          log.set_prefix_cache(g->seq, n.cached_tokens, n.queried_tokens);
          g->remote_logged = true;
          if (g->kv.leg == KvLeg::kDecode) {
            start_kv_import(*g);
          } else if (g->pending_reuse) {
            start_kv_reuse(*g, *std::exchange(g->pending_reuse, std::nullopt));
          } else {
            engine->remote_kv_ready(g->seq, false);
          }
          break;
        case EngineNotice::Kind::kToken:
          on_engine_token(*g, n.finished);
          break;
      }
    } catch (const std::exception& e) {
      pdr::log::error("sim: request {} failed: {}", g->request_id, e.what());
      erase(worker, n.key);
    }
  }
}

void SimServer::Impl::on_engine_token(Generation& g, bool finished) {
  if (finished) g.engine_done = true;
  if (!g.req.stream) {
    if (!finished) return;
    if (g.close_after_tokens) return cut(g);
    g.next_token = g.tokens.size();
    return finish(g);
  }
  if (g.close_after_tokens && g.next_token == *g.close_after_tokens) return cut(g);
  if (g.next_token < g.tokens.size()) write_token(g);
  if (finished) finish(g);
}

std::optional<KvBlocks> SimServer::Impl::reuse_blocks_of(const Generation& g) const {
  if (!options.bidirectional_kv_xfer || options.node.connector != proto::Connector::kNixl ||
      g.kv.leg != KvLeg::kPrefill) {
    return std::nullopt;
  }
  const json& p = g.kv.params;
  if (!p.is_object() || !p.contains("remote_block_ids") || !p["remote_block_ids"].is_array() ||
      p["remote_block_ids"].empty() || !p.contains("remote_request_id") || !p["remote_request_id"].is_string() ||
      !p.contains("remote_host") || !p.contains("remote_port")) {
    return std::nullopt;
  }
  KvBlocks blocks;
  // The decode exported them under its internal request id, with content seeded by that id alone
  // (finish(): it does not know the next turn's prompt).
  blocks.request_id = p["remote_request_id"].get<std::string>();
  blocks.peer_address = dialect::scalar_text(p["remote_host"]) + ":" + dialect::scalar_text(p["remote_port"]);
  blocks.dp_rank = g.kv.dp_rank;
  blocks.params = p;
  for (const json& id : p["remote_block_ids"]) {
    if (!id.is_number_integer()) return std::nullopt;
    blocks.block_ids.push_back(id.get<int64_t>());
  }
  if (blocks.block_ids.size() > kv_block_count(g.req.prompt_tokens) + kv_block_count(options.max_model_len)) {
    return std::nullopt;  // more blocks than any sequence this node accepts: not ours to pull
  }
  blocks.prompt_tokens = static_cast<uint32_t>(blocks.block_ids.size()) * kKvBlockTokens;
  return blocks;
}

void SimServer::Impl::start_kv_reuse(Generation& g, KvBlocks blocks) {
  const uint32_t worker = g.worker;
  const uint64_t seq = g.seq;
  const uint32_t tokens = blocks.prompt_tokens;
  g.kv_waiting = true;
  g.reusing = true;
  // The same path a decode takes to pull a prefill's blocks; `done` may run on any thread.
  g.kv_lease = mover->import_decode_blocks(
      blocks, [this, worker, seq, tokens](std::optional<SimError> error) {
        server.post(worker, [this, worker, seq, tokens, error = std::move(error)]() mutable {
          on_kv_reused(worker, seq, tokens, std::move(error));
        });
      });
}

void SimServer::Impl::on_kv_reused(uint32_t worker, uint64_t seq, uint32_t tokens,
                                   std::optional<SimError> error) {
  Generation* g = find(worker, seq);
  if (g == nullptr || !g->kv_waiting) return;  // the leg ended (client gone) meanwhile
  g->kv_waiting = false;
  uint32_t held = g->cached_tokens;
  if (error) {
    // vLLM's prefill recomputes what it could not pull; the request does not fail.
    log.count_error(error->reason);
    pdr::log::warn("sim: request {}: reusing the decode's KV failed, recomputing: {}", g->request_id, error->message);
  } else {
    log.set_kv_reused(seq, tokens);
    held = std::max(held, tokens);
  }
  if (g->in_engine) return engine->remote_kv_ready(seq, !error);
  const uint32_t uncached = g->req.prompt_tokens - std::min(g->req.prompt_tokens, held);
  g->first_token_at = Clock::now() + scaled_us(static_cast<double>(options.prefill_us_per_token) * uncached);
  arm_first_timer(*g);
}

void SimServer::Impl::arm_first_timer(Generation& g) {
  const Clock::time_point first =
      g.req.stream ? g.first_token_at
                   : g.first_token_at + g.per_token * static_cast<int64_t>(g.tokens.size() - 1);
  arm_timer(g, first);
}

void SimServer::Impl::start_kv_import(Generation& g) {
  const uint32_t worker = g.worker;
  const uint64_t seq = g.seq;
  g.kv_waiting = true;
  // `done` may run on any thread (or inline); the result is handled on the request's worker.
  g.kv_lease = mover->import_decode_blocks(
      blocks_of(g), [this, worker, seq](std::optional<SimError> error) {
        server.post(worker, [this, worker, seq, error = std::move(error)]() mutable {
          on_kv_imported(worker, seq, std::move(error));
        });
      });
}

void SimServer::Impl::on_kv_imported(uint32_t worker, uint64_t seq,
                                     std::optional<SimError> error) {
  Generation* g = find(worker, seq);
  if (g == nullptr || !g->kv_waiting) return;  // the leg ended (client gone) meanwhile
  g->kv_waiting = false;
  if (!error && g->in_engine) return engine->remote_kv_ready(seq, true);  // it caches the blocks
  if (!error) {
    const PrefixCacheUpdate cached = options.cache->on_prompt(g->kv.dp_rank, g->prompt_ids);
    log.set_prefix_cache(seq, cached.cached_tokens, cached.queried_tokens);
  }
  if (error) {
    log.count_error(error->reason);
    pdr::log::warn("sim: request {}: {}", g->request_id, error->message);
    if (!g->req.stream) {
      const std::string_view path = g->req.kind == ApiKind::kMessages ? kSimMessagesPath : std::string_view();
      answer(g->writer, seq, json_response(error->status, sim_error_body(path, *error)));
    } else if (g->req.kind == ApiKind::kMessages) {
      g->writer.write(messages_error_event(*error));  // vLLM's Messages stream has no [DONE]
      g->writer.end_stream();
      log.set_status(seq, error->status);
    } else {
      // vLLM's streaming error: an error event, then the end of the stream.
      const json event{{"error", json::parse(vllm_error_body(*error))}};
      g->writer.write("data: " + event.dump() + "\n\n");
      g->writer.write(kSseDone);
      g->writer.end_stream();
      log.set_status(seq, error->status);
    }
    return erase(worker, seq);
  }
  g->first_token_at = std::max(g->first_token_at, Clock::now());
  arm_first_timer(*g);
}

void SimServer::Impl::arm_timer(Generation& g, Clock::time_point when) {
  if (g.timer == nullptr) {
    auto* box = new TimerBox;
    box->impl = this;
    box->worker = g.worker;
    box->seq = g.seq;
    uv_timer_init(server.loop(g.worker), &box->handle);
    box->handle.data = box;
    g.timer = box;
  }
  const auto wait = when - Clock::now();
  // Round up to whole milliseconds (libuv's resolution) so pacing is never faster than asked.
  const auto ms = wait.count() <= 0
                      ? 0
                      : std::chrono::ceil<std::chrono::milliseconds>(wait).count();
  uv_timer_start(
      &g.timer->handle,
      [](uv_timer_t* h) {
        auto* box = static_cast<TimerBox*>(h->data);
        static_cast<Impl*>(box->impl)->on_timer(box->worker, box->seq);
      },
      static_cast<uint64_t>(ms), 0);
}

Generation* SimServer::Impl::find(uint32_t worker, uint64_t seq) {
  auto& table = in_flight[worker];
  auto it = table.find(seq);
  return it == table.end() ? nullptr : it->second.get();
}

KvBlocks SimServer::Impl::blocks_of(const Generation& g) const {
  KvBlocks blocks;
  blocks.request_id = g.request_id;
  blocks.transfer_id = g.kv.transfer_id;
  blocks.peer_address = g.kv.peer_address;
  blocks.prompt_tokens = g.req.prompt_tokens;
  blocks.dp_rank = g.kv.dp_rank;
  blocks.prompt = g.req.prompt_text;
  blocks.params = g.kv.params;
  if (g.kv.params.is_object() && g.kv.params.contains("remote_block_ids") &&
      g.kv.params["remote_block_ids"].is_array()) {
    for (const json& id : g.kv.params["remote_block_ids"]) {
      if (id.is_number_integer()) blocks.block_ids.push_back(id.get<int64_t>());
    }
  }
  return blocks;
}

void SimServer::Impl::on_timer(uint32_t worker, uint64_t seq) {
  Generation* g = find(worker, seq);
  if (g == nullptr) return;
  if (g->held) return release_held(*g);
  try {
    if (!g->req.stream) {
      if (g->close_after_tokens) return cut(*g);
      g->next_token = g->tokens.size();
      return finish(*g);
    }
    emit_due_tokens(*g);
  } catch (const std::exception& e) {
    pdr::log::error("sim: request {} failed: {}", g->request_id, e.what());
    erase(worker, seq);
  }
}

void SimServer::Impl::emit_due_tokens(Generation& g) {
  const Clock::time_point now = Clock::now();
  while (g.next_token < g.tokens.size()) {
    const Clock::time_point due =
        g.first_token_at + g.per_token * static_cast<int64_t>(g.next_token);
    if (due > now) return arm_timer(g, due);
    if (g.close_after_tokens && g.next_token == *g.close_after_tokens) return cut(g);
    write_token(g);
  }
  finish(g);
}

void SimServer::Impl::write_token(Generation& g) {
  const std::string finish_reason = g.stopped ? "stop" : "length";
  const bool last = g.next_token + 1 == g.tokens.size();
  if (!last && (g.req.kind == ApiKind::kCompletion || g.req.kind == ApiKind::kChat)) {
    if (g.chunk_head.empty()) {
      // The token's text is the first string value of the chunk ("choices" sorts first), so the
      // first occurrence of the marker is where each token goes.
      const std::string marker = "\x01pdr-token\x01";
      const std::string chunk = sse_token_chunk(g.req, g.response_id, g.created, marker, nullptr);
      const std::string quoted = json(marker).dump();
      const size_t at = chunk.find(quoted);
      g.chunk_head = chunk.substr(0, at);
      g.chunk_tail = chunk.substr(at + quoted.size());
    }
    g.writer.write(g.chunk_head + json(g.tokens[g.next_token]).dump() + g.chunk_tail);
    ++g.next_token;
    return;
  }
  if (g.req.kind == ApiKind::kResponses) {
    g.writer.write(responses_delta_event(g.response_id, g.tokens[g.next_token], g.next_token));
  } else if (g.req.kind == ApiKind::kMessages) {
    g.writer.write(messages_delta_event(g.tokens[g.next_token]));
  } else {
    g.writer.write(sse_token_chunk(g.req, g.response_id, g.created, g.tokens[g.next_token],
                                   last ? &finish_reason : nullptr));
  }
  ++g.next_token;
}

void SimServer::Impl::finish(Generation& g) {
  const uint32_t worker = g.worker;
  const uint64_t seq = g.seq;
  generations_finished.fetch_add(1, std::memory_order_relaxed);
  prompt_tokens_total.fetch_add(g.req.prompt_tokens, std::memory_order_relaxed);
  generated_tokens_total.fetch_add(g.tokens.size(), std::memory_order_relaxed);
  json kv_params = nullptr;
  if (g.kv.leg == KvLeg::kPrefill && !g.stopped) {  // stopped by EOS: vLLM exports no KV
    // Seam: a finished prefill hands its blocks to the transfer layer.
    const KvBlocks blocks = blocks_of(g);
    const std::string& key = kv_transfer_key(blocks);
    // Before the export: a decode may take the blocks (and the mover say so) before it returns.
    if (g.in_engine) {
      hold_blocks(key, g.seq);
      g.hold_handed_over = true;
    }
    std::vector<int64_t> block_ids;
    if (auto e = mover->export_prefill_blocks(blocks, &block_ids)) {
      log.count_error(e->reason);
      pdr::log::warn("sim: exporting KV for {} failed: {}", g.request_id, e->message);
      if (g.in_engine) release_blocks(key);
    } else {
      const std::string internal_id = internal_request_id(g.req.kind, g.request_id);
      if (block_ids.empty()) {
        if (g.in_engine) release_blocks(key);  // the mover holds nothing: nothing to wait for
        block_ids = synthetic_block_ids(internal_id, g.req.prompt_tokens);
      }
      kv_params = dialect->prefill_answer(options.node, g.kv, internal_id, block_ids);
    }
  } else if (options.bidirectional_kv_xfer && options.node.connector == proto::Connector::kNixl &&
             options.node.role == proto::Role::kDecode) {
    // The blocks this decode keeps for the next turn: the same NIXL fields a prefill answers,
    // naming blocks of its KV pool that hold the prompt's and the answer's KV (the next turn's
    // prompt starts with both) under its internal request id (a
    // mover holds them until pulled or `hold` passes), so the next turn's prefill really pulls
    // them. Their content is seeded by that id alone: the puller does not know this prompt.
    const std::string internal_id = internal_request_id(g.req.kind, g.request_id);
    KvBlocks held;
    held.request_id = internal_id;
    held.prompt_tokens = g.req.prompt_tokens + static_cast<uint32_t>(g.tokens.size());  // and its answer's
    held.dp_rank = g.kv.dp_rank;
    std::vector<int64_t> block_ids;
    if (auto e = mover->export_prefill_blocks(held, &block_ids)) {
      log.count_error(e->reason);
      pdr::log::warn("sim: keeping KV of {} for the next turn failed: {}", g.request_id, e->message);
    } else {
      if (block_ids.empty()) block_ids = synthetic_block_ids(internal_id, held.prompt_tokens);
      kv_params = dialect->prefill_answer(options.node, g.kv, internal_id, block_ids);
    }
  }
  if (g.req.stream && g.req.kind == ApiKind::kResponses) {
    g.writer.write(responses_close_events(g.req, g.response_id, g.created, g.tokens, g.stopped, kv_params));
    g.writer.end_stream();
    log.set_status(seq, 200);
  } else if (!g.req.stream && g.req.kind == ApiKind::kResponses) {
    answer(g.writer, seq,
           json_response(200, responses_full(g.req, g.response_id, g.created, g.tokens, g.stopped, kv_params)));
  } else if (g.req.stream && g.req.kind == ApiKind::kMessages) {
    g.writer.write(messages_close_events(g.req, g.tokens.size(), g.stopped));  // no kv_transfer_params
    g.writer.end_stream();
    log.set_status(seq, 200);
  } else if (!g.req.stream && g.req.kind == ApiKind::kMessages) {
    answer(g.writer, seq, json_response(200, messages_full(g.req, g.response_id, g.tokens, g.stopped, kv_params)));
  } else if (g.req.stream) {
    if (!kv_params.is_null()) g.writer.write(sse_kv_params_chunk(g.req, g.response_id, g.created, kv_params));
    if (g.req.include_usage) {
      g.writer.write(sse_usage_chunk(g.req, g.response_id, g.created,
                                     static_cast<uint32_t>(g.tokens.size())));
    }
    g.writer.write(kSseDone);
    g.writer.end_stream();
    log.set_status(seq, 200);
  } else {
    answer(g.writer, seq,
           json_response(200, full_response(g.req, g.response_id, g.created, g.tokens,
                                            g.stopped ? "stop" : "length",
                                            kv_params)));
  }
  erase(worker, seq);
}

void SimServer::Impl::handle_abort_requests(const http::Request& request, uint64_t seq,
                                            http::ResponseWriter& writer) {
  const json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return answer_error(writer, seq, SimError{400, "bad_json", "JSON decode error"});
  }
  if (!body.contains("request_ids") || body["request_ids"].is_null()) {
    return answer_error(writer, seq, SimError{400, "missing_request_ids", "Missing 'request_ids' in request body"});
  }
  // vLLM hands the value to the engine's abort, which takes one id or a list of them.
  std::vector<std::string> ids;
  const json& given = body["request_ids"];
  for (const json& id : given.is_array() ? given : json::array({given})) {
    if (!id.is_string()) {
      return answer_error(writer, seq, SimError{400, "bad_request_ids", "request_ids must be strings"});
    }
    ids.push_back(id.get<std::string>());
  }
  // Answered at once; the engine aborts in the background (each worker its own requests).
  answer(writer, seq, http::Response{200, {}, ""});
  for (uint32_t worker = 0; worker < in_flight.size(); ++worker) {
    server.post(worker, [this, worker, ids] { abort_engine_ids(worker, ids); });
  }
}

void SimServer::Impl::abort_engine_ids(uint32_t worker, const std::vector<std::string>& ids) {
  std::vector<uint64_t> hit;
  for (const auto& [seq, g] : in_flight[worker]) {
    if (g->req.kind != ApiKind::kGenerate) continue;
    const std::string engine_id = "generate-tokens-" + g->request_id;
    if (std::find(ids.begin(), ids.end(), engine_id) != ids.end()) hit.push_back(seq);
  }
  for (uint64_t seq : hit) {
    Generation* g = find(worker, seq);
    http::ResponseWriter writer = std::move(g->writer);
    log.mark_aborted(seq);
    erase(worker, seq);
    writer.abort();  // the request ends without an answer
  }
}

void SimServer::Impl::abort(uint32_t worker, uint64_t seq) {
  if (find(worker, seq) == nullptr) return;
  log.mark_aborted(seq);
  erase(worker, seq);
}

void SimServer::Impl::erase(uint32_t worker, uint64_t seq) {
  auto& table = in_flight[worker];
  auto it = table.find(seq);
  if (it == table.end()) return;
  std::unique_ptr<Generation> g = std::move(it->second);
  table.erase(it);
  if (g->counted_running) generations_running.fetch_sub(1, std::memory_order_relaxed);
  // A finished request is gone from the engine already (a no-op), unless its blocks are held.
  if (g->in_engine && !g->hold_handed_over) engine->cancel(seq);
  if (g->timer != nullptr) close_timer(std::exchange(g->timer, nullptr));
  if (g->kv_lease != 0) mover->end_decode(g->kv_lease);  // frees the decode's KV blocks
}

SimServer::SimServer(SimOptions options, std::unique_ptr<KvMover> mover)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->dialect = find_sim_dialect(impl_->options.node);
  impl_->mover = mover ? std::move(mover) : std::make_unique<NullKvMover>();
  if (!impl_->options.cache) {
    SimCacheOptions cache;
    cache.ranks = impl_->options.node.dp_size;
    impl_->options.cache = std::make_shared<SimCacheModel>(cache, nullptr);
  }
}

SimServer::~SimServer() { stop(); }

Status SimServer::start() {
  Impl& impl = *impl_;
  if (impl.dialect == nullptr) {
    return Status(StatusCode::kInvalidValue,
                  "no simulated dialect for connector " +
                      std::string(proto::to_string(impl.options.node.connector)) + " mode " +
                      std::string(proto::to_string(impl.options.node.transfer_mode)));
  }
  if (impl.options.bootstrap_port && !impl.serves_bootstrap()) {
    return Status(StatusCode::kInvalidValue,
                  std::string("bootstrap_port: a ") + impl.dialect->name + " " +
                      std::string(proto::to_string(impl.options.node.role)) +
                      " runs no bootstrap server");
  }
  impl.in_flight.resize(std::max<uint32_t>(1, impl.options.workers));
  if (impl.options.engine) {
    impl.mover->set_export_released([&impl](const std::string& key) { impl.release_blocks(key); });
    SimEngineOptions engine_options = *impl.options.engine;
    engine_options.ranks = impl.options.node.dp_size;
    engine_options.model = impl.options.model;
    engine_options.time_scale = impl.options.time_scale;
    std::shared_ptr<SimCacheModel> cache = impl.options.cache;
    impl.engine = std::make_unique<SimEngine>(
        engine_options, [&impl](std::vector<EngineNotice> n) { impl.deliver_engine_notices(std::move(n)); },
        [cache](uint32_t rank, std::vector<PrefixCacheChange> changes) { cache->publish(rank, changes); });
    if (Status es = impl.engine->start(); !es.is_ok()) return es;
  }
  http::ServerOptions server_options;
  server_options.host = impl.options.host;
  server_options.port = impl.options.port;
  server_options.workers = std::max<uint32_t>(1, impl.options.workers);
  server_options.tls = impl.options.tls;
  Status s = impl.server.start(server_options, [&impl](http::Request&& r, http::ResponseWriter w) {
    if (!impl.identity_ready.load(std::memory_order_acquire)) {
      w.send(json_response(503, vllm_error_body(SimError{503, "starting", "the node is starting"})));
      return;
    }
    impl.handle(std::move(r), std::move(w));
  });
  if (!s.is_ok()) return s;
  impl.options.node.http_port = impl.server.port();
  if (impl.options.node.engine_id.empty()) {
    impl.options.node.engine_id =
        "sim-" + impl.options.node.advertise_host + "-" + std::to_string(impl.server.port());
  }
  impl.running = true;
  impl.identity_ready.store(true, std::memory_order_release);
  if (impl.options.bootstrap_port) {
    impl.bootstrap = std::make_unique<http::Server>();
    http::ServerOptions bootstrap_options;
    bootstrap_options.host = impl.options.host;
    bootstrap_options.port = *impl.options.bootstrap_port;
    s = impl.bootstrap->start(bootstrap_options, [&impl](http::Request&& r, http::ResponseWriter w) {
      if (r.method == "GET" && r.path == "/query") {
        w.send(json_response(200, impl.dialect->bootstrap_query(impl.options.node)));
      } else {
        w.send(json_response(404, vllm_error_body(SimError{404, "not_found", "Not Found"})));
      }
    });
    if (!s.is_ok()) return s;
  }
  return Status::ok();
}

uint16_t SimServer::port() const { return impl_->server.port(); }

const std::string& SimServer::engine_id() const { return impl_->options.node.engine_id; }

std::optional<uint16_t> SimServer::bootstrap_port() const {
  if (!impl_->bootstrap) return std::nullopt;
  return impl_->bootstrap->port();
}

void SimServer::stop() {
  Impl& impl = *impl_;
  if (!impl.running) return;
  impl.running = false;
  // Pending KV imports end first: their results are posted to still-running workers (and dropped
  // there with their requests below), never to a stopped server.
  impl.mover->stop();
  // Drop in-flight generations on their own threads first, so no timer keeps a loop alive.
  for (uint32_t w = 0; w < impl.in_flight.size(); ++w) {
    impl.server.post(w, [&impl, w] {
      std::vector<uint64_t> seqs;
      for (const auto& [seq, g] : impl.in_flight[w]) seqs.push_back(seq);
      for (uint64_t seq : seqs) impl.erase(w, seq);
    });
  }
  impl.server.stop(std::chrono::milliseconds(200));
  if (impl.bootstrap) impl.bootstrap->stop(std::chrono::milliseconds(0));
  // After the workers: a notice it hands over now is dropped by the stopped server.
  if (impl.engine) impl.engine->stop();
}

}  // namespace pdr::node::sim
