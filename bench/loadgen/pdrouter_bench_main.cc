// pdrouter-bench: a load benchmark for OpenAI-compatible servers (pdrouter, vLLM, pdnode sim),
// measuring what `vllm bench serve` measures with the same flag names, and replaying request
// traces (--trace) with SLO attainment and goodput. main() parses flags, resolves the targets,
// finds the model, sends vLLM's initial test request, runs, reports.
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "proto/base/log.h"

#include "bench/loadgen/bench_report.h"
#include "bench/loadgen/bench_runner.h"
#include "bench/loadgen/cache_workloads.h"
#include "bench/loadgen/metrics_scrape.h"
#include "bench/loadgen/resolve_host.h"
#include "bench/loadgen/slo_metrics.h"
#include "bench/loadgen/trace_workload.h"

namespace {

using namespace pdr;
using namespace pdr::loadgen;

constexpr int kExitFailedRequests = 1;
constexpr int kExitBadFlags = 2;
constexpr int kExitInterrupted = 130;

struct Flags {
  std::vector<std::string> base_urls;
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  std::string endpoint;
  std::string backend = "vllm";
  std::string model;
  std::string dataset = "random";
  std::string request_rate = "inf";
  double burstiness = 1.0;
  uint32_t max_concurrency = 0;
  std::string prompt_format = "words";
  std::vector<std::string> headers;
  std::string percentiles = "99";
  double timeout_s = 600;
  bool no_ignore_eos = false;
  bool no_test_request = false;
  bool no_progress = false;
  double progress_interval_s = 1.0;
  std::string json_path;
  uint32_t oracle_block_tokens = 16;
  std::string trace_path;
  double trace_speedup = 1.0;
  uint32_t trace_block_size = 512;
  bool num_prompts_given = false;  // with --trace: replay only the first --num-prompts
  double slo_ttft_ms = 10'000;
  double slo_tbt_ms = 100;
  double slo_scale = 1.0;
  std::vector<std::string> router_metrics_urls;
  std::vector<std::string> engine_metrics_urls;
  WorkloadOptions workload;
  PrefixRepetitionOptions prefix;
  MultiTurnOptions multi_turn;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--base-url", f.base_urls,
                 "Server URL, http://HOST:PORT (overrides --host/--port). Hostnames are resolved once. "
                 "Repeatable: requests go to each URL in turn (e.g. pdrouter replicas); the model "
                 "lookup and the test request go to the first.")
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("--host", f.host, "Server host.")->capture_default_str();
  app.add_option("--port", f.port, "Server port.")->capture_default_str();
  app.add_option("--backend", f.backend,
                 "vllm or openai: /v1/completions with a prompt; openai-chat: /v1/chat/completions with one user message; "
                 "generate: vLLM's tokens-in /inference/v1/generate (token_ids, sampling_params; token-id prompts only).")
      ->check(CLI::IsMember({"vllm", "openai", "openai-chat", "generate"}))
      ->capture_default_str();
  app.add_option("--endpoint", f.endpoint,
                 "Request path (default /v1/completions, or /v1/chat/completions for openai-chat).");
  app.add_option("--model", f.model, "Model name sent in every request (default: the first id of GET /v1/models).");
  app.add_option("--dataset-name", f.dataset,
                 "Prompt source: random (distinct random prompts, --random-*), prefix_repetition (a few shared prefixes + random suffixes, --prefix-repetition-*), multi_turn (conversations whose turns extend the last prompt and answer, --multi-turn-*).")
      ->check(CLI::IsMember({"random", "prefix_repetition", "multi_turn"}))
      ->capture_default_str();
  app.add_option("--prefix-repetition-prefix-len", f.prefix.prefix_len,
                 "prefix_repetition: tokens of each shared prefix.")
      ->check(CLI::Range(1u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--prefix-repetition-suffix-len", f.prefix.suffix_len,
                 "prefix_repetition: tokens of each request's random suffix (prompt = prefix + suffix).")
      ->check(CLI::Range(0u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--prefix-repetition-num-prefixes", f.prefix.num_prefixes,
                 "prefix_repetition: distinct prefixes; --num-prompts are spread evenly over them, shuffled.")
      ->check(CLI::Range(1u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--prefix-repetition-output-len", f.prefix.output_len,
                 "prefix_repetition: max_tokens of each request.")
      ->check(CLI::Range(1u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--multi-turn-num-conversations", f.multi_turn.num_conversations,
                 "multi_turn: conversations, run concurrently (--num-prompts is ignored: conversations x turns requests).")
      ->check(CLI::Range(1u, 1'000'000u))
      ->capture_default_str();
  app.add_option("--multi-turn-num-turns", f.multi_turn.num_turns,
                 "multi_turn: turns per conversation, sent in order, each once the previous one answered.")
      ->check(CLI::Range(1u, 10'000u))
      ->capture_default_str();
  app.add_option("--multi-turn-input-len", f.multi_turn.input_len,
                 "multi_turn: tokens of each new user message (a turn's prompt: the previous prompt + its answer + this).")
      ->check(CLI::Range(1u, 10'000'000u))
      ->capture_default_str();
  app.add_flag("--multi-turn-conversation-id", f.multi_turn.conversation_ids,
               "multi_turn: send each turn with a top-level conversation_id (\"conv-N\"), for pdrouter's "
               "multi-turn KV reuse (multi_turn.enabled).");
  app.add_option("--multi-turn-output-len", f.multi_turn.output_len,
                 "multi_turn: max_tokens of each turn.")
      ->check(CLI::Range(1u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--oracle-block-tokens", f.oracle_block_tokens,
                 "Block size, in tokens, of the oracle prefix-cache hit rate reported (share of prompt tokens, in whole blocks, already sent in an earlier request).")
      ->check(CLI::Range(1u, 1'000'000u))
      ->capture_default_str();
  app.add_option("--random-input-len", f.workload.input_len, "Prompt length in tokens.")
      ->check(CLI::Range(1u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--random-output-len", f.workload.output_len, "max_tokens of each request.")
      ->check(CLI::Range(1u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--random-range-ratio", f.workload.range_ratio,
                 "Lengths drawn uniformly from [len*(1-r), len*(1+r)], 0 <= r < 1.")
      ->capture_default_str();
  app.add_option("--num-prompts", f.workload.num_prompts, "Requests to send.")
      ->check(CLI::Range(1u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--prompt-format", f.prompt_format,
                 "words: text of random common words (~1 token each on real tokenizers, exactly 1 on pdnode sim); token-ids: an array of random token ids (exact length on any model; completions only).")
      ->check(CLI::IsMember({"words", "token-ids"}))
      ->capture_default_str();
  app.add_option("--vocab-size", f.workload.vocab_size,
                 "token-ids: ids are drawn from [1000, vocab-size).")
      ->capture_default_str();
  app.add_option("--request-rate", f.request_rate,
                 "Requests per second, or inf to send all at once.")
      ->capture_default_str();
  app.add_option("--burstiness", f.burstiness,
                 "Gamma shape of the arrival gaps: 1 is a Poisson process, higher is more regular, lower burstier.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-concurrency", f.max_concurrency,
                 "At most this many requests in flight (arrivals wait); with --request-rate inf: a fixed concurrency. 0: no cap.")
      ->capture_default_str();
  app.add_option("--seed", f.workload.seed, "Seed of the prompts and the arrival times.")->capture_default_str();
  app.add_option("--header", f.headers,
                 "Extra request header 'Name: value' (repeatable). $OPENAI_API_KEY, when set, is sent as 'Authorization: Bearer ...'.");
  app.add_option("--metric-percentiles", f.percentiles,
                 "Comma-separated percentiles reported for TTFT, TPOT, ITL and E2EL (median always).")
      ->capture_default_str();
  app.add_option("--timeout", f.timeout_s,
                 "Seconds a request may wait for its first byte, and a stream may stall, before it fails.")
      ->check(CLI::Range(0.001, 604800.0))
      ->capture_default_str();
  app.add_flag("--no-ignore-eos", f.no_ignore_eos,
               "Do not send ignore_eos (vLLM then stops at EOS, so outputs may be shorter than --random-output-len).");
  app.add_flag("--no-test-request", f.no_test_request,
               "Skip the initial test request (the first prompt sent alone, to fail fast on a wrong URL, model or flag).");
  app.add_flag("--no-progress,--disable-tqdm", f.no_progress, "No progress lines on stderr.");
  app.add_option("--progress-interval", f.progress_interval_s, "Seconds between progress lines.")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  app.add_option("--json", f.json_path,
                 "Also write the result as JSON (vLLM's keys) to this file; '-' prints it on stdout and the table on stderr.");
  CLI::Option* trace =
      app.add_option("--trace", f.trace_path,
                     "Replay a request trace in the Mooncake format (JSON lines: timestamp ms, input_length, "
                     "output_length, hash_ids of --trace-block-size token blocks): requests go out at the trace's "
                     "times (/ --trace-speedup) with token-id prompts in which equal hash ids are equal blocks "
                     "and everything else is unique to the request, max_tokens = output_length. --num-prompts, "
                     "when given, replays only the first N requests.");
  app.add_option("--trace-speedup", f.trace_speedup,
                 "--trace: arrival times divided by this (2: twice the trace's request rate).")
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  app.add_option("--trace-block-size", f.trace_block_size, "--trace: tokens per hash id (Mooncake: 512).")
      ->check(CLI::Range(1u, 1'000'000u))
      ->capture_default_str();
  app.add_option("--slo-ttft-ms", f.slo_ttft_ms,
                 "TTFT objective of the SLO attainment and goodput reported (before --slo-scale).")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--slo-tbt-ms", f.slo_tbt_ms,
                 "TBT objective (a request's TBT: the mean of its slowest 10% inter-token gaps), before --slo-scale.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--slo-scale", f.slo_scale,
                 "Both objectives are multiplied by this (e.g. the time scale of simulated nodes that run faster than real GPUs).")
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  app.add_option("--router-metrics-url", f.router_metrics_urls,
                 "pdrouter's /metrics URL (repeatable, summed): its prefix-cache hit rate over the run is reported "
                 "(pdrouter_cache_routing_*_units_total, read before and after).")
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("--engine-metrics-url", f.engine_metrics_urls,
                 "A node's /metrics URL (repeatable, summed): the engines' prefix-cache hit rate over the run is "
                 "reported (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, read before and after).")
      ->take_all()
      ->allow_extra_args(false);
  for (const char* name : {"--dataset-name", "--request-rate", "--burstiness", "--random-input-len",
                           "--random-output-len", "--random-range-ratio", "--prompt-format"}) {
    trace->excludes(app.get_option(name));
  }
}

Status parse_percentiles(const std::string& text, std::vector<double>* out) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    const double p = std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(p > 0 && p < 100)) {
      return {StatusCode::kInvalidValue,
              fmt::format("--metric-percentiles: '{}' is not a number in (0, 100)", item)};
    }
    out->push_back(p);
    start = comma + 1;
  }
  return {};
}

Status parse_rate(const std::string& text, double* rate) {
  if (text == "inf") {
    *rate = std::numeric_limits<double>::infinity();
    return {};
  }
  char* end = nullptr;
  *rate = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(*rate > 0) || std::isinf(*rate)) {
    return {StatusCode::kInvalidValue,
            fmt::format("--request-rate: '{}' is not a positive number or inf", text)};
  }
  return {};
}

Status parse_header(const std::string& text, http::Header* out) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0) {
    return {StatusCode::kInvalidValue, fmt::format("--header: '{}' is not 'Name: value'", text)};
  }
  if (text.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
    return {StatusCode::kInvalidValue, "--header: a header may not contain CR, LF or NUL"};
  }
  out->name = text.substr(0, colon);
  size_t value = colon + 1;
  while (value < text.size() && text[value] == ' ') ++value;
  out->value = text.substr(value);
  return {};
}

// vLLM's servers answer {"object": "list", "data": [{"id": ...}, ...]}.
Status discover_model(const proto::HostPort& target, const EndpointOptions& endpoint,
                      const http::UpstreamTimeouts& timeouts, std::string* model) {
  http::UpstreamRequest request;
  request.method = "GET";
  request.path = "/v1/models";
  request.headers = endpoint.headers;
  const FetchResult got = fetch(target, std::move(request), timeouts);
  if (!got.error) return {got.error.code(), "GET /v1/models: " + got.error.message()};
  if (got.http_status != 200) {
    return {StatusCode::kRejected,
            fmt::format("GET /v1/models answered {}: {} (pass --model)", got.http_status,
                        got.body.substr(0, 300))};
  }
  const nlohmann::json body = nlohmann::json::parse(got.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("data") && body["data"].is_array() &&
      !body["data"].empty() && body["data"][0].is_object() && body["data"][0].contains("id") &&
      body["data"][0]["id"].is_string()) {
    *model = body["data"][0]["id"].get<std::string>();
    return {};
  }
  return {StatusCode::kMalformed, "GET /v1/models: no data[0].id in the answer (pass --model)"};
}

std::string local_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &tm);
  return text;
}

// --trace: the trace's requests (the first --num-prompts when given) and arrival times.
// Sets workload's num_prompts / input_len (the mean) / output_len (the mean) for the report.
Status load_trace(const Flags& f, WorkloadOptions* workload, std::vector<BenchRequest>* requests,
                  std::vector<double>* offsets, double* span_s) {
  std::ifstream file(f.trace_path, std::ios::binary);
  if (!file) return {StatusCode::kNotFound, fmt::format("--trace: cannot open {}", f.trace_path)};
  TraceReadOptions options{.block_tokens = f.trace_block_size,
                           .max_requests = f.num_prompts_given ? workload->num_prompts : 0};
  std::vector<TraceEntry> entries;
  if (Status s = read_trace(file, f.trace_path, options, &entries); !s) return s;
  *requests = make_trace_requests(entries, {.block_tokens = f.trace_block_size,
                                            .vocab_size = workload->vocab_size,
                                            .seed = workload->seed});
  *offsets = trace_arrival_offsets(entries, f.trace_speedup);
  *span_s = offsets->back();
  uint64_t input = 0, output = 0;
  for (const TraceEntry& e : entries) {
    input += e.input_length;
    output += e.output_length;
  }
  workload->num_prompts = static_cast<uint32_t>(entries.size());
  workload->input_len = static_cast<uint32_t>(input / entries.size());
  workload->output_len = static_cast<uint32_t>(output / entries.size());
  return {};
}

// The initial test request of a trace run: a short prompt of its own (ids no trace request
// uses), so the replay's first request does not find its prefix already cached.
BenchRequest trace_test_request() {
  BenchRequest test;
  test.input_len = 16;
  test.output_len = 2;
  test.block_tokens = 16;
  test.block_seeds = {0x7465737400000000ULL};
  return test;
}

int run(const Flags& f) {
  const auto fail_flags = [](const Status& s) {
    fmt::print(stderr, "pdrouter-bench: {}\n", s.message());
    return kExitBadFlags;
  };
  const bool trace = !f.trace_path.empty();
  const std::string dataset = trace ? "mooncake_trace" : f.dataset;
  WorkloadOptions workload = f.workload;
  workload.format = f.prompt_format == "token-ids" || trace ? PromptFormat::kTokenIds : PromptFormat::kWords;
  std::vector<BenchRequest> requests;
  ScheduleOptions schedule;
  double trace_span_s = 0;
  if (trace) {
    if (workload.vocab_size <= kFirstTokenId) {
      return fail_flags({StatusCode::kOutOfRange, fmt::format("--vocab-size must be > {}", kFirstTokenId)});
    }
    if (Status s = load_trace(f, &workload, &requests, &schedule.arrival_offsets, &trace_span_s); !s) {
      return fail_flags(s);
    }
  } else if (f.dataset == "prefix_repetition") {
    if (Status s = validate(workload, f.prefix); !s) return fail_flags(s);
    requests = make_prefix_repetition_requests(workload, f.prefix);
    workload.input_len = f.prefix.prefix_len + f.prefix.suffix_len;
    workload.output_len = f.prefix.output_len;
  } else if (f.dataset == "multi_turn") {
    if (Status s = validate(workload, f.multi_turn); !s) return fail_flags(s);
    requests = make_multi_turn_requests(workload, f.multi_turn);
    workload.num_prompts = static_cast<uint32_t>(requests.size());
    workload.input_len = f.multi_turn.input_len;  // the first turn's; later turns grow
    workload.output_len = f.multi_turn.output_len;
  } else {
    if (Status s = validate(workload); !s) return fail_flags(s);
    requests = make_random_requests(workload);
  }
  const bool chat = f.backend == "openai-chat";
  const bool generate = f.backend == "generate";
  if (chat && workload.format == PromptFormat::kTokenIds) {
    return fail_flags({StatusCode::kInvalidValue,
                       trace ? "--trace sends token ids: it needs a completions or generate backend"
                             : "--prompt-format token-ids needs a completions backend"});
  }
  if (generate && workload.format != PromptFormat::kTokenIds) {
    return fail_flags({StatusCode::kInvalidValue, "--backend generate needs --prompt-format token-ids (or --trace)"});
  }
  if (generate && f.dataset == "multi_turn") {
    return fail_flags({StatusCode::kInvalidValue, "--backend generate does not compose multi_turn conversations"});
  }
  if (!trace) {
    if (Status s = parse_rate(f.request_rate, &schedule.request_rate); !s) return fail_flags(s);
  }
  schedule.burstiness = f.burstiness;
  schedule.seed = workload.seed;
  schedule.format = workload.format;
  schedule.vocab_size = workload.vocab_size;
  schedule.oracle_block_tokens = f.oracle_block_tokens;
  if (f.max_concurrency != 0) schedule.max_concurrency = f.max_concurrency;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1e3));
  schedule.timeouts = {.connect = std::chrono::milliseconds(10'000), .first_byte = timeout,
                       .idle = timeout};
  std::vector<double> percentiles;
  if (Status s = parse_percentiles(f.percentiles, &percentiles); !s) return fail_flags(s);
  const SloOptions slo{.ttft_s = f.slo_ttft_ms / 1e3 * f.slo_scale,
                       .tbt_s = f.slo_tbt_ms / 1e3 * f.slo_scale};

  std::vector<proto::HostPort> targets;
  std::vector<std::string> urls;
  if (f.base_urls.empty()) {
    targets.push_back({f.host, f.port});
  }
  for (const std::string& text : f.base_urls) {
    proto::HttpUrl url;
    if (Status s = proto::parse_http_url(text, &url); !s) {
      return fail_flags({s.code(), "--base-url: " + s.message()});
    }
    targets.push_back(url.address);
  }
  for (proto::HostPort& target : targets) {
    urls.push_back("http://" + target.to_string());
    if (Status s = resolve_host(&target); !s) return fail_flags(s);
  }
  std::string base_url = urls.front();
  for (size_t i = 1; i < urls.size(); ++i) base_url += "," + urls[i];
  std::vector<ScrapeTarget> router_pages(f.router_metrics_urls.size());
  std::vector<ScrapeTarget> engine_pages(f.engine_metrics_urls.size());
  for (size_t i = 0; i < router_pages.size(); ++i) {
    if (Status s = parse_scrape_target(f.router_metrics_urls[i], &router_pages[i]); !s) {
      return fail_flags({s.code(), "--router-metrics-url " + s.message()});
    }
  }
  for (size_t i = 0; i < engine_pages.size(); ++i) {
    if (Status s = parse_scrape_target(f.engine_metrics_urls[i], &engine_pages[i]); !s) {
      return fail_flags({s.code(), "--engine-metrics-url " + s.message()});
    }
  }

  EndpointOptions endpoint;
  endpoint.chat = chat;
  endpoint.generate = generate;
  endpoint.path = !f.endpoint.empty() ? f.endpoint
                  : chat              ? "/v1/chat/completions"
                  : generate          ? "/inference/v1/generate"
                                      : "/v1/completions";
  endpoint.ignore_eos = !f.no_ignore_eos;
  if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr && *key != '\0') {
    endpoint.headers.push_back({"Authorization", fmt::format("Bearer {}", key)});
  }
  for (const std::string& text : f.headers) {
    http::Header header;
    if (Status s = parse_header(text, &header); !s) return fail_flags(s);
    endpoint.headers.push_back(std::move(header));
  }
  endpoint.model = f.model;
  if (endpoint.model.empty()) {
    if (Status s = discover_model(targets.front(), endpoint, schedule.timeouts, &endpoint.model); !s) {
      fmt::print(stderr, "pdrouter-bench: {}: {}\n", urls.front(), s.message());
      return kExitFailedRequests;
    }
  }

  if (trace) {
    fmt::print(stderr,
               "pdrouter-bench: replaying {} requests of {} ({:.1f} s at speed-up {}; mean {} -> {} "
               "tokens) to {}{} (model {})\n",
               requests.size(), f.trace_path, trace_span_s, f.trace_speedup, workload.input_len,
               workload.output_len, base_url, endpoint.path, endpoint.model);
  } else {
    fmt::print(stderr, "pdrouter-bench: {} {} {} requests of {}{} -> {} tokens to {}{} (model {})\n",
               requests.size(), f.dataset, f.backend, workload.input_len,
               f.dataset == "multi_turn" ? "+ earlier turns" : "", workload.output_len, base_url,
               endpoint.path, endpoint.model);
  }
  if (!f.no_test_request) {
    const RunOutcome test = run_benchmark(targets.front(), endpoint,
                                          {trace ? trace_test_request() : requests.front()},
                                          {.timeouts = schedule.timeouts,
                                           .vocab_size = schedule.vocab_size}, {});
    if (test.interrupted) return kExitInterrupted;
    const RequestResult& r = test.results.front();
    if (!r.success) {
      fmt::print(stderr,
                 "pdrouter-bench: the initial test request failed, check the URL, model and "
                 "flags: {}\n",
                 r.error);
      return kExitFailedRequests;
    }
    fmt::print(stderr, "pdrouter-bench: test request OK (TTFT {:.1f} ms, {} tokens)\n",
               r.ttft_s * 1e3, r.output_tokens);
  }

  const http::UpstreamTimeouts scrape_timeouts{.connect = std::chrono::milliseconds(5'000),
                                               .first_byte = std::chrono::milliseconds(10'000),
                                               .idle = std::chrono::milliseconds(10'000)};
  const bool scraping = !router_pages.empty() || !engine_pages.empty();
  CacheSnapshot before;
  if (scraping) before = take_snapshot(router_pages, engine_pages, scrape_timeouts);

  ProgressOptions progress;
  if (!f.no_progress) {
    progress.out = stderr;
    progress.interval = std::chrono::milliseconds(static_cast<int64_t>(f.progress_interval_s * 1e3));
    progress.overwrite = isatty(STDERR_FILENO) != 0;
  }
  const RunOutcome outcome = run_benchmark(targets, endpoint, requests, schedule, progress);

  CacheReport cache;
  if (scraping) {
    cache = compare_snapshots(!router_pages.empty(), !engine_pages.empty(), before,
                              take_snapshot(router_pages, engine_pages, scrape_timeouts));
    cache.prompt_tokens = static_cast<double>(outcome.oracle_prompt_tokens);
  }
  RunInfo info{.date = local_date(), .backend = f.backend, .base_url = base_url,
               .endpoint = endpoint.path, .model = endpoint.model,
               .num_prompts = workload.num_prompts, .input_len = workload.input_len,
               .output_len = workload.output_len, .range_ratio = workload.range_ratio,
               .request_rate = schedule.request_rate, .burstiness = schedule.burstiness,
               .max_concurrency = schedule.max_concurrency, .seed = workload.seed,
               .interrupted = outcome.interrupted};
  // A trace's own rate, as sent: its requests over its span after the speed-up.
  if (trace && trace_span_s > 0) info.request_rate = (requests.size() - 1) / trace_span_s;
  const BenchSummary summary =
      summarize(outcome.results, outcome.duration_s, percentiles, outcome.max_in_flight);
  const SloSummary slo_summary = summarize_slo(outcome.results, outcome.duration_s, slo, percentiles);
  const bool json_on_stdout = f.json_path == "-";
  const double oracle_rate =
      outcome.oracle_prompt_tokens == 0
          ? 0.0
          : static_cast<double>(outcome.oracle_hit_tokens) / outcome.oracle_prompt_tokens;
  std::FILE* table = json_on_stdout ? stderr : stdout;
  fmt::print(table, "{}", render_table(info, summary));
  // The workload's own reuse, what no router can beat: see prefix_oracle.h.
  fmt::print(table, "{:<40}{:<10}\n{:<40}{:<10}\n{:<40}{:<10.2f}\n", "Dataset:", dataset,
             "Oracle block size (tokens):", f.oracle_block_tokens, "Oracle prefix hit rate (%):",
             oracle_rate * 100);
  if (trace) {
    fmt::print(table, "{:<40}{:<10}\n{:<40}{:<10.3f}\n{:<40}{:<10.3f}\n", "Trace speed-up:",
               f.trace_speedup, "Trace span after speed-up (s):", trace_span_s,
               "Max send lag (s):", outcome.max_send_lag_s);
  }
  fmt::print(table, "{}{}", render_slo_table(slo_summary), render_cache_table(cache));
  if (!f.json_path.empty()) {
    nlohmann::json result = result_json(info, summary, outcome.results);
    result["dataset_name"] = dataset;
    result["oracle_block_tokens"] = f.oracle_block_tokens;
    result["oracle_prompt_tokens"] = outcome.oracle_prompt_tokens;
    result["oracle_hit_tokens"] = outcome.oracle_hit_tokens;
    result["oracle_prefix_hit_rate"] = oracle_rate;
    result["max_send_lag_s"] = outcome.max_send_lag_s;
    result["mean_send_lag_s"] = outcome.mean_send_lag_s;
    if (trace) {
      result["trace_file"] = f.trace_path;
      result["trace_speedup"] = f.trace_speedup;
      result["trace_block_size"] = f.trace_block_size;
      result["trace_span_s"] = trace_span_s;
      result["slo_scale"] = f.slo_scale;
    }
    add_slo_json(slo_summary, outcome.results, &result);
    if (scraping) add_cache_json(cache, &result);
    const std::string json = result.dump(2) + "\n";
    if (json_on_stdout) {
      fmt::print(stdout, "{}", json);
    } else {
      std::ofstream file(f.json_path);
      file << json;
      if (!file.flush()) {
        fmt::print(stderr, "pdrouter-bench: cannot write {}\n", f.json_path);
        return kExitFailedRequests;
      }
    }
  }
  if (outcome.interrupted) return kExitInterrupted;
  return summary.failed == 0 ? 0 : kExitFailedRequests;
}

}  // namespace

int main(int argc, char** argv) {
  // A server closing a stream mid-write must not kill the benchmark.
  std::signal(SIGPIPE, SIG_IGN);
  pdr::log::set_level(pdr::log::Level::kWarn);
  CLI::App app{
      "pdrouter-bench: load benchmark for OpenAI-compatible servers (pdrouter, vLLM, pdnode sim), "
      "measuring what `vllm bench serve` measures, with its flag names: random prompts, shared-prefix "
      "prompts (prefix_repetition) or multi-turn conversations, Poisson "
      "(gamma) arrivals or a fixed concurrency, or a Mooncake request trace replayed at its own "
      "times (--trace), streamed answers; reports request and token "
      "throughput, TTFT, TPOT, ITL and end-to-end latency (mean, median, percentiles) and the "
      "failures with their reasons, SLO attainment and goodput (TTFT and TBT objectives), the "
      "prefix-cache hit rate an oracle would reach on the workload and, given their /metrics, "
      "the router's and the engines' own, as a table on stdout and optionally JSON (--json). Progress "
      "goes to stderr. Exit codes: 0 every request succeeded, 1 some failed (or the initial test "
      "request, the model lookup or writing --json did), 2 bad flags, 130 interrupted "
      "(SIGINT/SIGTERM: in-flight requests are cancelled and the table covers what finished).",
      "pdrouter-bench"};
  app.set_version_flag("--version", "pdrouter-bench " PDR_VERSION);
  Flags flags;
  add_flags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitBadFlags;
  }
  flags.num_prompts_given = app.count("--num-prompts") > 0;
  return run(flags);
}
