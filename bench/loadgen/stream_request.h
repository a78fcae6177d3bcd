// One streamed OpenAI request of a benchmark, measured the way `vllm bench serve` measures it.
//
// build_request() makes the HTTP request (completions or chat, stream: true with
// include_usage, max_tokens = the request's output length, temperature 0, ignore_eos when asked;
// or vLLM's tokens-in /inference/v1/generate: token_ids, and those settings in sampling_params).
// StreamMeasurement is fed the response's head and body bytes as they arrive and fills a
// RequestResult: TTFT at the first SSE chunk carrying text (generate: token ids), one ITL sample
// per later such chunk, token counts from the final usage chunk (else the count of chunks with
// text; generate: of the token ids).
//
// A request succeeds only if the answer is 200 text/event-stream, every event decodes, no event
// is an error, at least one chunk carries text, and the stream ends with "data: [DONE]" and no
// partial event: a stream cut short (pdrouter ends a failed decode with an error event, a dying
// node just closes) is a failure, never a shorter success. Pure: times are passed in.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "bench/loadgen/bench_metrics.h"
#include "bench/loadgen/workload.h"
#include "proto/openai_stream_chunk.h"
#include "proto/sse_reader.h"
#include "router/http/upstream_client.h"

namespace pdr::loadgen {

struct EndpointOptions {
  std::string path = "/v1/completions";
  bool chat = false;        // /v1/chat/completions body (messages) instead of prompt
  std::string model;
  bool ignore_eos = true;   // vLLM's extension: generate exactly max_tokens
  std::vector<http::Header> headers;  // e.g. Authorization: Bearer ...
  // vLLM's /inference/v1/generate body: {model, token_ids, sampling_params{max_tokens,
  // temperature, ignore_eos}, stream, stream_options}; the prompt must be token ids.
  bool generate = false;
};

http::UpstreamRequest build_request(const EndpointOptions& endpoint, const BenchRequest& request);

class StreamMeasurement {
 public:
  // Bodies of error answers are kept up to this size, for their message.
  static constexpr size_t kMaxErrorBody = 64 * 1024;

  // The generated text kept by keep_answer, at most this many bytes.
  static constexpr size_t kMaxAnswerBytes = 1 << 20;

  // keep_answer: also keep the generated text (choices[0].text or delta.content), for a
  // conversation's next turn. token_ids: the answer is /inference/v1/generate's, whose chunks
  // carry choices[*].token_ids instead of text.
  StreamMeasurement(const BenchRequest& request, double start_s, bool keep_answer = false,
                    bool token_ids = false);

  void on_head(int status, const std::vector<http::Header>& headers);
  void on_body(std::string_view bytes, double now_s);
  // The response ended normally at now_s: decides success.
  void on_complete(double now_s);
  // The call failed (connect refused, reset, timeout...).
  void on_error(std::string_view what, double now_s);

  // Once a failure is certain (error event, undecodable stream): the caller may stop reading.
  bool failed_early() const { return !result_.error.empty(); }
  const RequestResult& result() const { return result_; }
  RequestResult take_result() { return std::move(result_); }
  const std::string& answer() const { return answer_; }

 private:
  void on_event(const proto::SseEvent& event, double now_s);
  void fail(std::string error);
  void keep_text_of(std::string_view data);
  static uint32_t token_ids_in(std::string_view data);

  RequestResult result_;
  proto::SseReader sse_;
  bool streaming_ = false;  // 200 text/event-stream
  bool saw_done_ = false;
  bool saw_text_ = false;
  uint32_t text_chunks_ = 0;
  double last_text_s_ = 0;
  std::optional<uint64_t> usage_prompt_, usage_completion_;
  std::string error_body_;
  bool keep_answer_ = false;
  bool token_ids_ = false;
  uint64_t streamed_token_ids_ = 0;
  std::string answer_;
};

}  // namespace pdr::loadgen
