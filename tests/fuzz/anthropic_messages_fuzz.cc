// Fuzzes proto/anthropic_messages: a client's /v1/messages body (untrusted bytes) through the
// checks pdrouter makes before any leg, then build_legs() on the Messages path for every dialect
// that serves it, and Anthropic's error shape around arbitrary message text. Properties: no
// crash; a refused body says why; an accepted body builds in every dialect but SGLang (which
// refuses it), each leg renders a JSON object on /v1/messages whose max_tokens is 1 on the prefill
// (every serving dialect caps it) and the client's own (MoRIIO: one less, never below 1) on the
// decode; an error body and event are well-formed, whatever the message holds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "proto/anthropic_messages.h"
#include "proto/request_legs.h"

namespace {

using namespace pdr::proto;

LegInstance Node(Connector c, TransferMode mode, const char* host, uint16_t port) {
  LegInstance inst;
  inst.connector = c;
  inst.transfer_mode = mode;
  inst.http_address = {host, port};
  inst.zmq_address = std::string(host) + ":" + std::to_string(port + 1000);
  if (c == Connector::kMoriio) {
    inst.moriio_zmq = MoriioZmqAddress{host, static_cast<uint16_t>(port + 1), static_cast<uint16_t>(port + 2)};
    inst.zmq_address = inst.moriio_zmq->to_string();
  }
  if (c == Connector::kMooncake) inst.mooncake_engine_id = "engine-1";
  inst.bootstrap_port = 8998;
  return inst;
}

int64_t int_of(const JsonObjectBody& body, std::string_view key) {
  std::optional<int64_t> v;
  if (!body.get_int(key, &v).is_ok() || !v) std::abort();
  return *v;
}

// `text` parses as one JSON object.
JsonObjectBody object_of(const std::string& text) {
  JsonObjectBody parsed;
  if (!JsonObjectBody::parse(text, JsonLimits(), &parsed).is_ok()) std::abort();
  return parsed;
}

void check_error_shape(int status, std::string_view message) {
  const JsonObjectBody body = object_of(anthropic_error_body(status, message));
  if (body.get_raw("type") != std::optional<std::string_view>("\"error\"")) std::abort();
  const std::optional<std::string_view> error = body.get_raw("error");
  if (!error) std::abort();
  const JsonObjectBody inner = object_of(std::string(*error));
  std::optional<std::string> type, text;
  if (!inner.get_string("type", &type).is_ok() || !type || *type != anthropic_error_type(status)) std::abort();
  if (!inner.get_string("message", &text).is_ok() || !text || *text != message) std::abort();
  const std::string event = anthropic_error_event(status, message);
  if (event.rfind("event: error\ndata: {", 0) != 0 || !event.ends_with("}\n\n")) std::abort();
  if (event.find('\n', 13) != event.size() - 2) std::abort();  // one data line: nothing splits it
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  // The message may hold anything a node or a client put there (invalid UTF-8 included: the
  // shape must stay one well-formed line whether or not a strict reader would take the bytes).
  const int status = 400 + data[0] % 200;
  const std::string_view message = body.substr(0, 64);
  bool valid_utf8_ascii = true;
  for (char c : message) valid_utf8_ascii = valid_utf8_ascii && static_cast<unsigned char>(c) < 0x80;
  if (valid_utf8_ascii) check_error_shape(status, message);

  JsonObjectBody client;
  if (!JsonObjectBody::parse(body, JsonLimits(), &client).is_ok()) return 0;
  const pdr::Status checked = check_messages_request(client);
  if (!checked.is_ok()) {
    if (checked.message().empty()) std::abort();
    return 0;
  }
  const int64_t asked = int_of(client, "max_tokens");
  if (asked < 1) std::abort();
  struct Pair {
    Connector connector;
    TransferMode mode;
  };
  for (const Pair pair : {Pair{Connector::kNixl, TransferMode::kNone}, Pair{Connector::kMoriio, TransferMode::kRead},
                          Pair{Connector::kMoriio, TransferMode::kWrite}, Pair{Connector::kMooncake, TransferMode::kNone},
                          Pair{Connector::kP2pNccl, TransferMode::kNone}, Pair{Connector::kSglang, TransferMode::kNone}}) {
    uint64_t state = size;
    const RandomSource random = [&state] { return state = state * 6364136223846793005ULL + 1442695040888963407ULL; };
    LegBuild legs;
    const pdr::Status built = build_legs({kMessagesPath, body, "", &client}, Node(pair.connector, pair.mode, "127.0.22.1", 8100),
                                         Node(pair.connector, pair.mode, "127.0.22.2", 8200), std::nullopt,
                                         std::nullopt, LegOptions(), random, &legs);
    if (pair.connector == Connector::kSglang) {
      if (built.code() != pdr::StatusCode::kRejected) std::abort();
      continue;
    }
    if (!built.is_ok()) std::abort();
    if (legs.prefill.path != kMessagesPath || legs.decode.path != kMessagesPath) std::abort();
    const JsonObjectBody prefill = object_of(legs.prefill.body_text());
    const JsonObjectBody decode = object_of(legs.decode.body_text());
    if (int_of(prefill, "max_tokens") != 1) std::abort();
    const int64_t want = pair.connector == Connector::kMoriio && asked > 1 ? asked - 1 : asked;
    if (int_of(decode, "max_tokens") != want) std::abort();
  }
  return 0;
}
