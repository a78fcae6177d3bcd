// A real Anthropic client for integration tests: the official TypeScript SDK (`@anthropic-ai/sdk`
// on npm) against a server of Anthropic's Messages API.
//
//   node anthropic_client.mjs --sdk-dir DIR --base-url http://HOST:PORT --model NAME
//                             [--max-tokens N] [--timeout-ms MS] [--mode basic|cut]
//
// DIR is an `npm install --prefix DIR @anthropic-ai/sdk` directory (the SDK is loaded from
// DIR/node_modules). The base URL is the API root (the SDK adds /v1/messages). Output: one JSON
// object per line on stdout (each also has "t_ms").
// --mode basic (default), in this order:
//   {"event":"message","id","type","role","stop_reason","text","usage"}   messages.create()
//   {"event":"delta","index":I,"text":"..."}                               per streamed text delta,
//                                                                          printed as it arrives
//   {"event":"stream_end","types":[event types in order],"deltas":N,"text","stop_reason","usage"}
//   {"event":"count","input_tokens":N}                                     messages.countTokens()
//   {"event":"bad_request","status","name","type","message"}              max_tokens 0, refused
//   {"event":"ok"}
// --mode cut: one stream the server is expected to end with an error event:
//   {"event":"delta",...} per delta, then
//   {"event":"stream_error","deltas":N,"name","type","message"}, {"event":"ok"}
// Any other error prints {"event":"error","message":...} and exits 1; so does --timeout-ms
// (default 20000) passing for the whole run. The SDK reads the named events itself (it skips
// `ping` and throws on `event: error`): a server that framed them wrongly would surface here.
import { createRequire } from "node:module";
import path from "node:path";
import { parseArgs } from "node:util";

function emit(event) {
  process.stdout.write(JSON.stringify({ ...event, t_ms: Math.round(performance.now()) }) + "\n");
}

function fail(message) {
  emit({ event: "error", message: String(message) });
  process.exit(1);
}

const { values: args } = parseArgs({
  options: {
    "sdk-dir": { type: "string" },
    "base-url": { type: "string" },
    model: { type: "string" },
    "max-tokens": { type: "string", default: "8" },
    "timeout-ms": { type: "string", default: "20000" },
    mode: { type: "string", default: "basic" },
  },
});
for (const required of ["sdk-dir", "base-url", "model"]) {
  if (!args[required]) fail(`--${required} is required`);
}
const timeoutMs = Number(args["timeout-ms"]);
const maxTokens = Number(args["max-tokens"]);
setTimeout(() => fail(`timed out after ${timeoutMs} ms`), timeoutMs).unref();

// The error an SDK call threw, as the caller sees it: class, status and Anthropic's error object.
function describe(error) {
  return {
    name: error?.constructor?.name ?? null,
    status: error?.status ?? null,
    type: error?.error?.error?.type ?? null,
    message: error?.error?.error?.message ?? null,
  };
}

// Streams one message, printing each text delta; returns [events seen, deltas, final message].
async function streamOnce(client, request) {
  const stream = client.messages.stream(request);
  const types = [];
  let deltas = 0;
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === "content_block_delta" && event.delta?.type === "text_delta") {
      emit({ event: "delta", index: deltas, text: event.delta.text });
      deltas += 1;
    }
  }
  return [types, deltas, await stream.finalMessage()];
}

async function main() {
  const require = createRequire(path.join(path.resolve(args["sdk-dir"]), "package.json"));
  const { Anthropic } = require("@anthropic-ai/sdk");
  const client = new Anthropic({
    baseURL: args["base-url"],
    apiKey: "sk-ant-test", // sent as x-api-key
    timeout: timeoutMs,
    maxRetries: 0, // a failure must show, not be retried away
  });
  const request = {
    model: args.model,
    max_tokens: maxTokens,
    system: "You answer in a few words.",
    messages: [{ role: "user", content: "Say something about disaggregated serving." }],
  };

  if (args.mode === "cut") {
    let deltas = 0;
    try {
      const stream = client.messages.stream(request);
      for await (const event of stream) {
        if (event.type === "content_block_delta") {
          emit({ event: "delta", index: deltas, text: event.delta?.text ?? null });
          deltas += 1;
        }
      }
    } catch (error) {
      emit({ event: "stream_error", deltas, ...describe(error) });
      emit({ event: "ok" });
      return;
    }
    fail("the stream ended without an error");
  }

  const message = await client.messages.create(request);
  emit({
    event: "message",
    id: message.id,
    type: message.type,
    role: message.role,
    stop_reason: message.stop_reason,
    text: message.content.map((block) => block.text ?? "").join(""),
    usage: message.usage,
  });

  const [types, deltas, final] = await streamOnce(client, request);
  emit({
    event: "stream_end",
    types,
    deltas,
    text: final.content.map((block) => block.text ?? "").join(""),
    stop_reason: final.stop_reason,
    usage: final.usage,
  });

  const count = await client.messages.countTokens({ model: request.model, system: request.system,
                                                     messages: request.messages });
  emit({ event: "count", input_tokens: count.input_tokens });

  try {
    await client.messages.create({ ...request, max_tokens: 0 });
    fail("max_tokens 0 was accepted");
  } catch (error) {
    emit({ event: "bad_request", ...describe(error) });
  }
  emit({ event: "ok" });
}

main().then(
  () => process.exit(0),
  (error) => fail(error?.stack ?? error),
);
