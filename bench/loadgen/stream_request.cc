#include "bench/loadgen/stream_request.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "proto/base/ascii.h"

namespace pdr::loadgen {
namespace {

constexpr size_t kMaxQuotedError = 300;

std::string clip(std::string_view text) {
  std::string out(text.substr(0, kMaxQuotedError));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  if (text.size() > kMaxQuotedError) out += "...";
  return out;
}

}  // namespace

http::UpstreamRequest build_request(const EndpointOptions& endpoint, const BenchRequest& request) {
  // The prompt is spliced in already encoded (it can be a 100 KB token-id array): the rest of
  // the body is built by the JSON library.
  nlohmann::json body;
  body["model"] = endpoint.model;
  if (endpoint.generate) {
    body["token_ids"] = nullptr;  // spliced below
    nlohmann::json sampling = {{"max_tokens", request.output_len}, {"temperature", 0.0}};
    if (endpoint.ignore_eos) sampling["ignore_eos"] = true;
    body["sampling_params"] = std::move(sampling);
  } else if (endpoint.chat) {
    if (request.messages_json.empty()) {
      body["messages"] =
          nlohmann::json::array({{{"role", "user"}, {"content", request.prompt_text}}});
    } else {
      body["messages"] = nullptr;  // spliced below: a conversation so far
    }
    body["max_completion_tokens"] = request.output_len;
  } else {
    body["prompt"] = nullptr;
    body["max_tokens"] = request.output_len;
  }
  if (!endpoint.generate) body["temperature"] = 0.0;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (endpoint.ignore_eos && !endpoint.generate) body["ignore_eos"] = true;
  if (!request.conversation_id.empty()) body["conversation_id"] = request.conversation_id;
  std::string text = body.dump();
  if (endpoint.generate) {
    static constexpr std::string_view kPlaceholder = "\"token_ids\":null";
    const size_t at = text.find(kPlaceholder);
    text.replace(at, kPlaceholder.size(), "\"token_ids\":" + request.prompt_json);
  } else if (!endpoint.chat) {
    static constexpr std::string_view kPlaceholder = "\"prompt\":null";
    const size_t at = text.find(kPlaceholder);
    text.replace(at, kPlaceholder.size(), "\"prompt\":" + request.prompt_json);
  } else if (!request.messages_json.empty()) {
    static constexpr std::string_view kPlaceholder = "\"messages\":null";
    const size_t at = text.find(kPlaceholder);
    text.replace(at, kPlaceholder.size(), "\"messages\":" + request.messages_json);
  }
  http::UpstreamRequest out;
  out.method = "POST";
  out.path = endpoint.path;
  out.headers = endpoint.headers;
  out.headers.push_back({"Content-Type", "application/json"});
  out.headers.push_back({"Accept", "text/event-stream"});
  out.body = std::move(text);
  return out;
}

StreamMeasurement::StreamMeasurement(const BenchRequest& request, double start_s,
                                     bool keep_answer, bool token_ids)
    : keep_answer_(keep_answer), token_ids_(token_ids) {
  result_.input_len = request.input_len;
  result_.start_s = start_s;
}

void StreamMeasurement::on_head(int status, const std::vector<http::Header>& headers) {
  result_.http_status = status;
  if (status != 200) return;
  for (const http::Header& h : headers) {
    if (iequals(h.name, "content-type") && h.value.find("text/event-stream") != std::string::npos) {
      streaming_ = true;
    }
  }
  if (!streaming_) fail("HTTP 200 but not text/event-stream (the server ignored \"stream\": true)");
}

void StreamMeasurement::on_body(std::string_view bytes, double now_s) {
  if (!streaming_) {
    if (error_body_.size() < kMaxErrorBody) {
      error_body_.append(bytes.substr(0, kMaxErrorBody - error_body_.size()));
    }
    return;
  }
  if (failed_early()) return;
  Status status = sse_.feed(bytes, [&](const proto::SseEvent& event) { on_event(event, now_s); });
  if (!status && !failed_early()) fail("undecodable event stream: " + status.to_string());
}

void StreamMeasurement::on_event(const proto::SseEvent& event, double now_s) {
  if (failed_early()) return;
  if (saw_done_) return fail("event after [DONE]");
  proto::StreamChunk chunk;
  if (Status status = proto::parse_stream_chunk(event.data, &chunk); !status) {
    return fail("undecodable chunk: " + status.to_string());
  }
  if (chunk.error_message) return fail("error event: " + clip(*chunk.error_message));
  if (chunk.done) {
    saw_done_ = true;
    return;
  }
  if (chunk.prompt_tokens) usage_prompt_ = chunk.prompt_tokens;
  if (chunk.completion_tokens) usage_completion_ = chunk.completion_tokens;
  if (token_ids_) {
    const uint32_t ids = token_ids_in(event.data);
    if (ids == 0) return;  // usage-only last chunk
    streamed_token_ids_ += ids;
  } else if (chunk.content_bytes == 0) {
    return;  // role-only first chat chunk, usage-only last chunk
  }
  if (keep_answer_) keep_text_of(event.data);
  if (!saw_text_) {
    saw_text_ = true;
    result_.ttft_s = now_s - result_.start_s;
  } else {
    result_.itl_s.push_back(now_s - last_text_s_);
  }
  last_text_s_ = now_s;
  ++text_chunks_;
}

// The chunk decoded above (parse_stream_chunk checked its shape); only the first choice's text
// is kept, as a chat client keeps the answer it shows.
void StreamMeasurement::keep_text_of(std::string_view data) {
  const nlohmann::json chunk = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!chunk.is_object() || !chunk.contains("choices") || !chunk["choices"].is_array() ||
      chunk["choices"].empty() || !chunk["choices"][0].is_object()) {
    return;
  }
  const nlohmann::json& choice = chunk["choices"][0];
  const nlohmann::json* text = nullptr;
  if (choice.contains("text")) {
    text = &choice["text"];
  } else if (choice.contains("delta") && choice["delta"].is_object() &&
             choice["delta"].contains("content")) {
    text = &choice["delta"]["content"];
  }
  if (text == nullptr || !text->is_string()) return;
  const std::string& piece = text->get_ref<const std::string&>();
  answer_.append(piece, 0, kMaxAnswerBytes - std::min(kMaxAnswerBytes, answer_.size()));
}

// The chunk decoded above (parse_stream_chunk checked it is a JSON object of at most 4 MiB).
uint32_t StreamMeasurement::token_ids_in(std::string_view data) {
  const nlohmann::json chunk = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!chunk.is_object() || !chunk.contains("choices") || !chunk["choices"].is_array()) return 0;
  uint32_t count = 0;
  for (const nlohmann::json& choice : chunk["choices"]) {
    if (choice.is_object() && choice.contains("token_ids") && choice["token_ids"].is_array()) {
      count += static_cast<uint32_t>(choice["token_ids"].size());
    }
  }
  return count;
}

void StreamMeasurement::on_complete(double now_s) {
  result_.latency_s = now_s - result_.start_s;
  if (failed_early()) return;
  if (result_.http_status != 200) {
    const std::optional<std::string> message = proto::error_message_of(error_body_);
    return fail(fmt::format("HTTP {}: {}", result_.http_status,
                            clip(message ? *message : error_body_)));
  }
  if (sse_.pending_bytes() != 0) return fail("stream ended inside an event");
  if (!saw_done_) return fail("stream ended without [DONE]");
  if (!saw_text_) return fail("stream carried no generated text");
  const uint64_t streamed = token_ids_ ? streamed_token_ids_ : text_chunks_;
  result_.output_tokens = static_cast<uint32_t>(usage_completion_ ? *usage_completion_ : streamed);
  if (usage_prompt_) result_.input_len = static_cast<uint32_t>(*usage_prompt_);
  result_.success = true;
}

void StreamMeasurement::on_error(std::string_view what, double now_s) {
  result_.latency_s = now_s - result_.start_s;
  if (!failed_early()) fail(std::string(what));
}

void StreamMeasurement::fail(std::string error) {
  result_.success = false;
  result_.error = std::move(error);
}

}  // namespace pdr::loadgen
