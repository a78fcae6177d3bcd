"""The official Anthropic TypeScript SDK as a real client of pdrouter's /v1/messages
(tests/integration/anthropic_client.mjs).

The SDK is installed from npm once per build tree into <build>/npm-cache, beside the OpenAI SDK
(test_openai_node.py; deploy/install-deps.sh --tests installs node and npm). A missing npm is a
failure, not a skip. The SDK talks to pdrouter, which splits each message over a NIXL prefill and
decode sim; it sends its key as x-api-key, which the nodes must get as a Bearer token.
"""
import fcntl
import json
import os
import shutil
import subprocess
import time
import unittest

from pdr_testlib import bin_dir
from pd_fixture import PdCluster

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_SCRIPT = os.path.join(HERE, "anthropic_client.mjs")
SDK_PACKAGE = "@anthropic-ai/sdk"
SDK_MAJOR = "1"
SDK_SPEC = SDK_PACKAGE + "@" + SDK_MAJOR
NPM_INSTALL_TIMEOUT_S = 80  # inside CTest's per-test limit (tests/integration/CMakeLists.txt)
CLIENT_TIMEOUT_S = 30
MAX_TOKENS = 8
PROMPT_WORDS = 6 + 5  # the system prompt's and the message's words (the sim counts words)


def sdk_dir():
    """<build>/npm-cache: PDR_BIN_DIR is <build>/router."""
    return os.path.normpath(os.path.join(bin_dir(), "..", "npm-cache"))


def sdk_installed(prefix):
    manifest = os.path.join(prefix, "node_modules", SDK_PACKAGE, "package.json")
    try:
        with open(manifest, encoding="utf-8") as f:
            return json.load(f).get("version", "").startswith(SDK_MAJOR + ".")
    except (OSError, ValueError):
        return False


def ensure_anthropic_sdk():
    """Installs the SDK into sdk_dir() unless it is already there; returns the directory. Raises
    AssertionError with npm's output when node/npm are missing or the install fails."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise AssertionError(
                "%s is not installed; the Anthropic SDK test needs node and npm "
                "(run deploy/install-deps.sh --tests)" % tool)
    prefix = sdk_dir()
    os.makedirs(prefix, exist_ok=True)
    # The OpenAI SDK test installs into the same prefix: one npm at a time.
    with open(os.path.join(prefix, ".install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if sdk_installed(prefix):
            return prefix
        try:
            result = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--prefix", prefix, SDK_SPEC],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                timeout=NPM_INSTALL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise AssertionError("npm install %s timed out after %ds:\n%s" % (
                SDK_SPEC, NPM_INSTALL_TIMEOUT_S, (e.output or b"").decode(errors="replace")))
        output = result.stdout.decode(errors="replace")
        if result.returncode != 0 or not sdk_installed(prefix):
            raise AssertionError("npm install %s into %s failed (exit %d):\n%s" % (
                SDK_SPEC, prefix, result.returncode, output))
    return prefix


class AnthropicSdkTest(unittest.TestCase):
    def setUp(self):
        self.sdk = ensure_anthropic_sdk()
        # 20 ms per decoded token, so streamed deltas are visibly spread over time.
        self.cluster = PdCluster("nixl", decode_flags=("--decode-us-per-token", "20000"))
        self.addCleanup(self.cluster.close)
        self.prefill, self.decode = self.cluster.prefills[0], self.cluster.decodes[0]

    def run_client(self, mode="basic"):
        """Runs anthropic_client.mjs; returns its events (parsed JSON lines)."""
        args = ["node", CLIENT_SCRIPT, "--sdk-dir", self.sdk, "--base-url", "http://" + self.cluster.router.http,
                "--model", "sim-model", "--max-tokens", str(MAX_TOKENS), "--mode", mode,
                "--timeout-ms", str((CLIENT_TIMEOUT_S - 5) * 1000)]
        try:
            result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, timeout=CLIENT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            self.fail("anthropic_client.mjs did not finish in %ds:\n%s\n%s" % (
                CLIENT_TIMEOUT_S, (e.stdout or b"").decode(errors="replace"),
                (e.stderr or b"").decode(errors="replace")))
        stdout = result.stdout.decode(errors="replace")
        report = "exit %d\nstdout:\n%s\nstderr:\n%s" % (
            result.returncode, stdout, result.stderr.decode(errors="replace"))
        self.assertEqual(result.returncode, 0, report)
        try:
            events = [json.loads(line) for line in stdout.splitlines() if line.strip()]
        except ValueError:
            self.fail("anthropic_client.mjs printed a line that is not JSON:\n" + report)
        self.assertEqual(events[-1]["event"], "ok", report)
        by_kind = {}
        for event in events:
            by_kind.setdefault(event["event"], []).append(event)
        return by_kind

    def test_create_stream_count_and_a_refusal(self):
        started = time.monotonic()
        by_kind = self.run_client()

        message = by_kind["message"][0]
        self.assertEqual((message["type"], message["role"]), ("message", "assistant"))
        self.assertEqual(len(message["text"].split()), MAX_TOKENS, message)
        self.assertEqual(message["stop_reason"], "max_tokens")
        self.assertEqual(message["usage"]["output_tokens"], MAX_TOKENS)
        self.assertEqual(message["usage"]["input_tokens"], PROMPT_WORDS)

        deltas, end = by_kind["delta"], by_kind["stream_end"][0]
        self.assertEqual(len(deltas), MAX_TOKENS)
        self.assertEqual([d["index"] for d in deltas], list(range(MAX_TOKENS)))
        self.assertEqual("".join(d["text"] for d in deltas), end["text"])
        # The SDK saw every named event in order (it skips ping itself) and built the message.
        self.assertEqual(end["types"], ["message_start", "content_block_start"] + ["content_block_delta"] * MAX_TOKENS
                         + ["content_block_stop", "message_delta", "message_stop"])
        self.assertEqual(end["stop_reason"], "max_tokens")
        self.assertEqual(end["usage"]["output_tokens"], MAX_TOKENS)
        # Deltas arrived as they were produced (20 ms apart), not all at the end.
        self.assertGreaterEqual(deltas[-1]["t_ms"] - deltas[0]["t_ms"], 0.5 * 20 * (MAX_TOKENS - 1))

        self.assertEqual(by_kind["count"][0]["input_tokens"], PROMPT_WORDS)
        bad = by_kind["bad_request"][0]
        self.assertEqual((bad["name"], bad["status"], bad["type"]), ("BadRequestError", 400, "invalid_request_error"))
        self.assertIn("max_tokens must be at least 1", bad["message"])

        # The nodes got the SDK's key as the Bearer token vLLM's --api-key reads, on every leg.
        log = self.decode.wait_for_requests(
            lambda log: len([r for r in log["requests"] if r["path"] == "/v1/messages"]) == 2
            and all(r["status"] == 200 for r in log["requests"]),
            timeout=max(1.0, CLIENT_TIMEOUT_S - (time.monotonic() - started)))
        self.assertEqual(log["counters"]["aborts"], 0)
        legs = [r for node in (self.prefill, self.decode) for r in node.sim_requests()["requests"]]
        self.assertTrue(legs)
        for leg in legs:
            self.assertEqual(leg["headers"]["authorization"], "Bearer sk-ant-test", leg["path"])
        self.assertEqual(sorted(r["path"] for r in legs).count("/v1/messages/count_tokens"), 1)

    def test_a_stream_cut_mid_way_throws_the_sdks_api_error(self):
        self.decode.set_fault(path="/v1/messages", close_after_tokens=3)
        by_kind = self.run_client("cut")
        error = by_kind["stream_error"][0]
        self.assertEqual(error["deltas"], 3)
        self.assertEqual((error["name"], error["type"]), ("APIError", "api_error"), error)
        self.assertIn("decode", error["message"])


if __name__ == "__main__":
    unittest.main()
