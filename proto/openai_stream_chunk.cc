#include "proto/openai_stream_chunk.h"

#include <simdjson.h>

#include <algorithm>

#include "proto/json_splice.h"

namespace pdr::proto {
namespace {

constexpr size_t kMaxDepth = 64;

using simdjson::dom::element;
using simdjson::dom::object;

std::string_view trim_ascii_ws(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r\n") + 1 - begin);
}

std::string capped(std::string_view text) {
  if (text.size() <= kMaxErrorMessageBytes) return std::string(text);
  // Cut at a character start so the result stays valid UTF-8 for logs and JSON reports.
  size_t n = kMaxErrorMessageBytes - 3;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return std::string(text.substr(0, n)) + "...";
}

// The two error shapes in the header. A message that is not a string still makes it an error: a
// benchmark must count the request failed, and the JSON is the most useful text to show.
std::optional<std::string> error_in(object root) {
  element error;
  if (root.at_key("error").get(error) == simdjson::SUCCESS && !error.is_null()) {
    std::string_view text;
    element message;
    if (error.is_object() && error.at_key("message").get(message) == simdjson::SUCCESS &&
        message.get_string().get(text) == simdjson::SUCCESS) {
      return capped(text);
    }
    if (error.get_string().get(text) == simdjson::SUCCESS) return capped(text);
    return capped(simdjson::minify(error));
  }
  element kind;
  std::string_view kind_text;
  if (root.at_key("object").get(kind) == simdjson::SUCCESS &&
      kind.get_string().get(kind_text) == simdjson::SUCCESS && kind_text == "error") {
    element message;
    std::string_view text;
    if (root.at_key("message").get(message) == simdjson::SUCCESS &&
        message.get_string().get(text) == simdjson::SUCCESS) {
      return capped(text);
    }
    return capped(simdjson::minify(root));
  }
  return std::nullopt;
}

// Parses `text` with this thread's parser. The root stays valid until the thread's next parse.
Status parse_root(std::string_view text, element* root) {
  if (text.size() > kMaxStreamChunkBytes) {
    return Status(StatusCode::kTooLarge,
                  "stream chunk over " + std::to_string(kMaxStreamChunkBytes) + " bytes");
  }
  // One parser per thread, reused: a benchmark parses thousands of small chunks per second and
  // allocating the parser's buffers for each would cost more than the parse. It grows to the
  // largest chunk seen (at most 4 MiB). realloc_if_needed copies the text into its padded buffer.
  thread_local simdjson::dom::parser parser;
  simdjson::error_code err = simdjson::SUCCESS;
  if (parser.capacity() < text.size() || parser.max_depth() != kMaxDepth) {
    err = parser.allocate(std::max<size_t>(text.size(), 4096), kMaxDepth);
  }
  if (err == simdjson::SUCCESS) {
    err = parser.parse(text.data(), text.size(), /*realloc_if_needed=*/true).get(*root);
  }
  if (err == simdjson::SUCCESS) return Status::ok();
  if (err == simdjson::DEPTH_ERROR) {
    return Status(StatusCode::kTooDeep,
                  "stream chunk nesting deeper than " + std::to_string(kMaxDepth) + " levels");
  }
  if (err == simdjson::MEMALLOC || err == simdjson::CAPACITY) {
    return Status(StatusCode::kInternal, std::string("stream chunk: ") + simdjson::error_message(err));
  }
  // simdjson's DOM API does not say where the error is; json_splice's validator does. This is the
  // error path only, so parsing a second time costs nothing that matters.
  JsonLimits limits;
  limits.max_bytes = kMaxStreamChunkBytes;
  limits.max_depth = kMaxDepth;
  JsonObjectBody body;
  const Status located = JsonObjectBody::parse(text, limits, &body);
  if (located.code() == StatusCode::kMalformed) {
    return Status(StatusCode::kMalformed, "stream chunk: " + located.message());
  }
  return Status(StatusCode::kMalformed,
                std::string("stream chunk: invalid JSON: ") + simdjson::error_message(err));
}

// Reads an optional string member: absent or null leaves *out empty.
Status optional_string(object parent, std::string_view key, const std::string& path,
                       std::optional<std::string_view>* out) {
  element value;
  if (parent.at_key(key).get(value) != simdjson::SUCCESS || value.is_null()) return Status::ok();
  std::string_view text;
  if (value.get_string().get(text) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, path + " must be a string");
  }
  *out = text;
  return Status::ok();
}

// Reads an optional object member: absent or null leaves *found false.
Status optional_object(object parent, std::string_view key, const std::string& path, object* out,
                       bool* found) {
  *found = false;
  element value;
  if (parent.at_key(key).get(value) != simdjson::SUCCESS || value.is_null()) return Status::ok();
  if (value.get_object().get(*out) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, path + " must be an object");
  }
  *found = true;
  return Status::ok();
}

Status token_count(object usage, std::string_view key, std::optional<uint64_t>* out) {
  element value;
  if (usage.at_key(key).get(value) != simdjson::SUCCESS || value.is_null()) return Status::ok();
  const std::string path = "usage." + std::string(key);
  if (value.is_int64()) {
    int64_t n = 0;
    if (value.get_int64().get(n) == simdjson::SUCCESS && n < 0) {
      return Status(StatusCode::kOutOfRange, path + " must not be negative, got " + std::to_string(n));
    }
  }
  uint64_t n = 0;
  if (value.get_uint64().get(n) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, path + " must be an integer");
  }
  *out = n;
  return Status::ok();
}

Status read_choice(element choice_element, size_t index, StreamChunk* chunk) {
  const std::string path = "choices[" + std::to_string(index) + "]";
  object choice;
  if (choice_element.get_object().get(choice) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, path + " must be an object");
  }
  size_t bytes = 0;
  std::optional<std::string_view> text;
  if (Status st = optional_string(choice, "text", path + ".text", &text); !st.is_ok()) return st;
  if (text) bytes += text->size();

  object delta;
  bool has_delta = false;
  if (Status st = optional_object(choice, "delta", path + ".delta", &delta, &has_delta); !st.is_ok()) {
    return st;
  }
  if (has_delta) {
    std::optional<std::string_view> content, reasoning;
    if (Status st = optional_string(delta, "content", path + ".delta.content", &content); !st.is_ok()) {
      return st;
    }
    if (Status st = optional_string(delta, "reasoning_content", path + ".delta.reasoning_content",
                                    &reasoning);
        !st.is_ok()) {
      return st;
    }
    // vLLM renamed reasoning_content to reasoning; reading it only as a fallback means a server
    // that sends both spellings of the same text is not counted twice.
    if (!reasoning) {
      if (Status st = optional_string(delta, "reasoning", path + ".delta.reasoning", &reasoning);
          !st.is_ok()) {
        return st;
      }
    }
    if (content) bytes += content->size();
    if (reasoning) bytes += reasoning->size();
  }

  std::optional<std::string_view> finish;
  if (Status st = optional_string(choice, "finish_reason", path + ".finish_reason", &finish);
      !st.is_ok()) {
    return st;
  }
  if (finish && !chunk->finish_reason) chunk->finish_reason = std::string(*finish);
  chunk->content_bytes += bytes;
  if (bytes > 0) ++chunk->choices_with_content;
  return Status::ok();
}

}  // namespace

Status parse_stream_chunk(std::string_view data, StreamChunk* out) {
  StreamChunk chunk;
  if (trim_ascii_ws(data) == "[DONE]") {
    chunk.done = true;
    *out = std::move(chunk);
    return Status::ok();
  }
  element root_element;
  if (Status st = parse_root(data, &root_element); !st.is_ok()) return st;
  object root;
  if (root_element.get_object().get(root) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, "stream chunk is not a JSON object");
  }
  if (std::optional<std::string> message = error_in(root)) {
    chunk.error_message = std::move(message);
    *out = std::move(chunk);
    return Status::ok();
  }

  element choices_element;
  if (root.at_key("choices").get(choices_element) == simdjson::SUCCESS && !choices_element.is_null()) {
    simdjson::dom::array choices;
    if (choices_element.get_array().get(choices) != simdjson::SUCCESS) {
      return Status(StatusCode::kWrongType, "choices must be an array");
    }
    size_t index = 0;
    for (element choice : choices) {
      if (Status st = read_choice(choice, index++, &chunk); !st.is_ok()) return st;
    }
  }

  object usage;
  bool has_usage = false;
  if (Status st = optional_object(root, "usage", "usage", &usage, &has_usage); !st.is_ok()) return st;
  if (has_usage) {
    if (Status st = token_count(usage, "prompt_tokens", &chunk.prompt_tokens); !st.is_ok()) return st;
    if (Status st = token_count(usage, "completion_tokens", &chunk.completion_tokens); !st.is_ok()) {
      return st;
    }
  }
  *out = std::move(chunk);
  return Status::ok();
}

std::optional<std::string> error_message_of(std::string_view body) {
  element root_element;
  if (!parse_root(body, &root_element).is_ok()) return std::nullopt;
  object root;
  if (root_element.get_object().get(root) != simdjson::SUCCESS) return std::nullopt;
  return error_in(root);
}

}  // namespace pdr::proto
