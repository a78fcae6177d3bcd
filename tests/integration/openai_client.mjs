// A real OpenAI client for integration tests: the official Node SDK (`openai` on npm) runs one
// non-streaming and one streaming chat completion against an OpenAI-compatible server.
//
//   node openai_client.mjs --sdk-dir DIR --base-url http://HOST:PORT/v1 --model NAME
//                          [--max-tokens N] [--timeout-ms MS]
//
// DIR is an `npm install --prefix DIR openai` directory (the SDK is loaded from DIR/node_modules).
// Output: one JSON object per line on stdout (each also has "t_ms"), in this order:
//   {"event":"chat","id","content","finish_reason","usage"}          the non-streaming answer
//   {"event":"delta","index":I,"content":"..."}                        per streamed content delta,
//                                                                      printed as it arrives
//   {"event":"stream_end","chunks":N,"deltas":N,"content","finish_reason","usage","role"}
//   {"event":"ok"}
// Any error prints {"event":"error","message":...} and exits 1; so does --timeout-ms (default
// 20000) passing for the whole run. The SDK consumes the stream's `data: [DONE]` itself: a server
// that sent it malformed or not at all would surface here as an error or a missing finish_reason.
import { createRequire } from "node:module";
import path from "node:path";
import { parseArgs } from "node:util";

// Every line carries t_ms, milliseconds since start, so a caller can see deltas arrive over time.
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
  },
});
for (const required of ["sdk-dir", "base-url", "model"]) {
  if (!args[required]) fail(`--${required} is required`);
}
const timeoutMs = Number(args["timeout-ms"]);
const maxTokens = Number(args["max-tokens"]);
// A hang anywhere (connect, a stalled stream) fails the run instead of blocking the test.
setTimeout(() => fail(`timed out after ${timeoutMs} ms`), timeoutMs).unref();

async function main() {
  // The SDK lives in the test's npm directory, not next to this script, so resolve it from there.
  const require = createRequire(path.join(path.resolve(args["sdk-dir"]), "package.json"));
  const { OpenAI } = require("openai");
  const client = new OpenAI({
    baseURL: args["base-url"],
    apiKey: "sk-test", // the sim ignores it; the SDK insists on one
    timeout: timeoutMs,
    maxRetries: 0, // a failure must show, not be retried away
  });
  const messages = [{ role: "user", content: "Say something about disaggregated serving." }];

  const chat = await client.chat.completions.create({
    model: args.model,
    messages,
    max_tokens: maxTokens,
  });
  emit({
    event: "chat",
    id: chat.id,
    content: chat.choices[0]?.message?.content ?? null,
    finish_reason: chat.choices[0]?.finish_reason ?? null,
    usage: chat.usage ?? null,
  });

  const stream = await client.chat.completions.create({
    model: args.model,
    messages,
    max_tokens: maxTokens,
    stream: true,
    stream_options: { include_usage: true },
  });
  let chunks = 0;
  let deltas = 0;
  let content = "";
  let role = null;
  let finishReason = null;
  let usage = null;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices?.[0];
    if (!choice) continue;
    if (choice.delta?.role) role = choice.delta.role;
    if (choice.delta?.content) {
      emit({ event: "delta", index: deltas, content: choice.delta.content });
      deltas += 1;
      content += choice.delta.content;
    }
    if (choice.finish_reason) finishReason = choice.finish_reason;
  }
  emit({ event: "stream_end", chunks, deltas, content, finish_reason: finishReason, usage, role });
  emit({ event: "ok" });
}

main().then(
  () => process.exit(0),
  (error) => fail(error?.stack ?? error),
);
