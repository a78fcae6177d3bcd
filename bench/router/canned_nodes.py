"""Canned-answer vLLM nodes for bench/router: one private nginx that plays a prefill node, a decode
node and (for Mooncake) the prefill's bootstrap server, each on its own 127.0.0.x address, answering
every request with a fixed body (`return 200`). No tokenizer, no KV, no timing model: what is left
is HTTP, so pdrouter's and the nginx baseline's CPU per request are not blurred by the sims' cost.

What each answer must carry (docs/design/wire-formats.md):
- prefill (POST /v1/completions, /v1/chat/completions, /inference/v1/generate): a vLLM JSON answer whose top-level
  `kv_transfer_params` is what a NIXL prefill returns (serial dialects copy it into the decode leg;
  a null one would send pdrouter down the no-KV fallback). Concurrent dialects (MoRIIO WRITE,
  Mooncake) only look at its status.
- decode: /v1/completions a JSON completion (non-streaming); /inference/v1/generate a JSON
  GenerateResponse (token ids); /v1/chat/completions an SSE stream of
  a role chunk, four content chunks, a finish chunk and `data: [DONE]` (`default_type
  text/event-stream`; `return` cannot stream, so the events arrive in one body, which pdrouter and
  nginx relay the same way).
- Mooncake bootstrap (GET /query on the prefill's bootstrap port): DP rank -> engine_id, read by
  router/routing/mooncake_cache before the first request to that prefill.

The request bodies are read and discarded by nginx; the answers do not depend on them.

Standard library only.
"""
import json

MODEL = "sim-model"
PREFILL_HOST = "127.0.0.2"
DECODE_HOST = "127.0.0.3"

NIXL_PARAMS = {"do_remote_prefill": True, "do_remote_decode": False,
               "remote_block_ids": [1, 2, 3], "remote_engine_id": "canned-prefill-engine",
               "remote_request_id": "cmpl-canned-prefill-0", "remote_host": PREFILL_HOST,
               "remote_port": 5600, "tp_size": 1}


def _usage(completion_tokens):
    return {"prompt_tokens": 10, "total_tokens": 10 + completion_tokens,
            "completion_tokens": completion_tokens}


def prefill_completion():
    return {"id": "cmpl-canned-prefill", "object": "text_completion", "created": 1764115200,
            "model": MODEL, "choices": [{"index": 0, "text": " The", "logprobs": None,
                                         "finish_reason": "length", "stop_reason": None}],
            "usage": _usage(1), "kv_transfer_params": NIXL_PARAMS}


def prefill_chat():
    return {"id": "chatcmpl-canned-prefill", "object": "chat.completion", "created": 1764115200,
            "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                         "logprobs": None, "finish_reason": "length", "stop_reason": None}],
            "usage": _usage(1), "kv_transfer_params": NIXL_PARAMS}


def decode_completion():
    return {"id": "cmpl-canned-decode", "object": "text_completion", "created": 1764115200,
            "model": MODEL,
            "choices": [{"index": 0, "text": " quick brown fox jumps", "logprobs": None,
                         "finish_reason": "length", "stop_reason": None}],
            "usage": _usage(4), "kv_transfer_params": None}


def prefill_generate():
    """vLLM's GenerateResponse (POST /inference/v1/generate) of a prefill capped at one token."""
    return {"request_id": "generate-tokens-canned-prefill",
            "choices": [{"index": 0, "logprobs": None, "finish_reason": "length", "token_ids": [464]}],
            "prompt_logprobs": None, "kv_transfer_params": NIXL_PARAMS}


def decode_generate():
    return {"request_id": "generate-tokens-canned-decode",
            "choices": [{"index": 0, "logprobs": None, "finish_reason": "length",
                         "token_ids": [2068, 7586, 21831, 18045]}],
            "prompt_logprobs": None, "kv_transfer_params": None}


def decode_chat_stream():
    def chunk(delta, finish=None):
        return {"id": "chatcmpl-canned-decode", "object": "chat.completion.chunk",
                "created": 1764115200, "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": word}) for word in ("Hello", " there", ",", " friend")]
    events.append(chunk({}, "length"))
    return "".join("data: %s\n\n" % _compact(e) for e in events) + "data: [DONE]\n\n"


def bootstrap_query():
    return {"0": {"engine_id": "canned-mooncake-engine-dp0",
                  "worker_addr": {"0": {"0": "tcp://%s:17000" % PREFILL_HOST}}}}


def _compact(value):
    return json.dumps(value, separators=(",", ":"))


def _nginx_string(text):
    """An nginx single-quoted string: backslash and quote escaped, newline as \\n."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def nginx_conf(directory, ports, workers=1):
    """Private nginx config for the canned nodes; `ports`: dict with prefill, decode, bootstrap."""
    def answer(path, content_type, body):
        return ("    location = %s {\n      default_type %s;\n      return 200 %s;\n    }\n"
                % (path, content_type, _nginx_string(body)))

    health = "    location = /health { return 200; }\n"
    return CANNED_CONF.format(
        dir=directory, workers=workers,
        prefill="%s:%d" % (PREFILL_HOST, ports["prefill"]),
        decode="%s:%d" % (DECODE_HOST, ports["decode"]),
        bootstrap="%s:%d" % (PREFILL_HOST, ports["bootstrap"]),
        prefill_locations=health
        + answer("/v1/completions", "application/json", _compact(prefill_completion()))
        + answer("/v1/chat/completions", "application/json", _compact(prefill_chat()))
        + answer("/inference/v1/generate", "application/json", _compact(prefill_generate())),
        decode_locations=health
        + answer("/v1/completions", "application/json", _compact(decode_completion()))
        + answer("/v1/chat/completions", "text/event-stream", decode_chat_stream())
        + answer("/inference/v1/generate", "application/json", _compact(decode_generate())),
        bootstrap_locations=answer("/query", "application/json", _compact(bootstrap_query())))


CANNED_CONF = """\
# Private nginx for bench/router: canned-answer vLLM prefill, decode and Mooncake bootstrap nodes.
worker_processes {workers};
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/tmp/body;
  proxy_temp_path {dir}/tmp/proxy;
  fastcgi_temp_path {dir}/tmp/fastcgi;
  uwsgi_temp_path {dir}/tmp/uwsgi;
  scgi_temp_path {dir}/tmp/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  server {{
    listen {prefill} backlog=4096;
{prefill_locations}  }}
  server {{
    listen {decode} backlog=4096;
{decode_locations}  }}
  server {{
    listen {bootstrap} backlog=4096;
{bootstrap_locations}  }}
}}
"""


def topology_yaml(dialect, ports):
    """pdrouter topology listing the canned nodes as static instances of `dialect`
    ("nixl", "moriio-write", "mooncake")."""
    prefill = "%s:%d" % (PREFILL_HOST, ports["prefill"])
    decode = "%s:%d" % (DECODE_HOST, ports["decode"])
    if dialect == "nixl":
        extra = {"prefill": ["connector: nixl"], "decode": ["connector: nixl"]}
    elif dialect == "moriio-write":
        # zmq_address is advertised to the other side only; nothing listens there.
        extra = {role: ["connector: moriio", "transfer_mode: WRITE",
                        'zmq_address: "host:%s,handshake:6301,notify:61005"' % host]
                 for role, host in (("prefill", PREFILL_HOST), ("decode", DECODE_HOST))}
    elif dialect == "mooncake":
        extra = {"prefill": ["connector: mooncake", "bootstrap_port: %d" % ports["bootstrap"]],
                 "decode": ["connector: mooncake"]}
    else:
        raise ValueError("no canned topology for dialect %r" % dialect)
    lines = ["# Written by bench/router for the canned-answer nginx nodes (%s)." % dialect,
             "instances:"]
    for role, address in (("prefill", prefill), ("decode", decode)):
        lines.append("  - role: %s" % role)
        lines.append('    http_address: "%s"' % address)
        lines += ["    " + item for item in extra[role]]
    return "\n".join(lines) + "\n"
