"""The official OpenAI Node SDK as a real client (tests/integration/openai_client.mjs).

The SDK is installed from npm once per build tree into <build>/npm-cache (deploy/install-deps.sh
--tests installs node and npm). A missing npm is a failure, not a skip: CI machines are expected
to have it. The SDK talks to pdrouter, which splits each request over a prefill and a decode sim.
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
CLIENT_SCRIPT = os.path.join(HERE, "openai_client.mjs")
SDK_SPEC = "openai@6"
NPM_INSTALL_TIMEOUT_S = 80  # inside CTest's 120 s per-test limit (tests/integration/CMakeLists.txt)
CLIENT_TIMEOUT_S = 30
MAX_TOKENS = 8


def sdk_dir():
    """<build>/npm-cache: PDR_BIN_DIR is <build>/router."""
    return os.path.normpath(os.path.join(bin_dir(), "..", "npm-cache"))


def sdk_installed(prefix):
    manifest = os.path.join(prefix, "node_modules", "openai", "package.json")
    try:
        with open(manifest, encoding="utf-8") as f:
            return json.load(f).get("version", "").startswith("6.")
    except (OSError, ValueError):
        return False


def ensure_openai_sdk():
    """Installs the SDK into sdk_dir() unless it is already there; returns the directory. Raises
    AssertionError with npm's output when node/npm are missing or the install fails."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise AssertionError(
                "%s is not installed; the OpenAI Node SDK test needs node and npm "
                "(run deploy/install-deps.sh --tests)" % tool)
    prefix = sdk_dir()
    os.makedirs(prefix, exist_ok=True)
    # Two test processes sharing a build tree must not run npm in the same prefix at once.
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


class OpenAINodeSdkTest(unittest.TestCase):
    def setUp(self):
        self.sdk = ensure_openai_sdk()
        # pdrouter with a NIXL prefill and decode (NIXL keeps max_tokens on the decode leg, so the
        # SDK sees exactly the tokens it asked for); 20 ms per decoded token so the streamed
        # deltas are visibly spread over time.
        self.cluster = PdCluster("nixl", decode_flags=("--decode-us-per-token", "20000"))
        self.addCleanup(self.cluster.close)
        self.node = self.cluster.decodes[0]
        self.model = "sim-model"

    def target_base_url(self):
        """Where the SDK is pointed: the OpenAI API root (…/v1) of the system under test."""
        return "http://%s/v1" % self.cluster.router.http

    def run_client(self):
        """Runs openai_client.mjs; returns its events (parsed JSON lines)."""
        args = ["node", CLIENT_SCRIPT, "--sdk-dir", self.sdk, "--base-url", self.target_base_url(),
                "--model", self.model, "--max-tokens", str(MAX_TOKENS),
                "--timeout-ms", str((CLIENT_TIMEOUT_S - 5) * 1000)]
        try:
            result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, timeout=CLIENT_TIMEOUT_S,
                                    check=False)
        except subprocess.TimeoutExpired as e:
            self.fail("openai_client.mjs did not finish in %ds:\n%s\n%s" % (
                CLIENT_TIMEOUT_S, (e.stdout or b"").decode(errors="replace"),
                (e.stderr or b"").decode(errors="replace")))
        stdout = result.stdout.decode(errors="replace")
        report = "exit %d\nstdout:\n%s\nstderr:\n%s" % (
            result.returncode, stdout, result.stderr.decode(errors="replace"))
        self.assertEqual(result.returncode, 0, report)
        try:
            events = [json.loads(line) for line in stdout.splitlines() if line.strip()]
        except ValueError:
            self.fail("openai_client.mjs printed a line that is not JSON:\n" + report)
        self.assertEqual(events[-1]["event"], "ok", report)
        return events

    def test_chat_non_stream_and_stream(self):
        started = time.monotonic()
        events = self.run_client()
        by_kind = {}
        for event in events:
            by_kind.setdefault(event["event"], []).append(event)

        chat = by_kind["chat"][0]
        self.assertTrue(chat["id"].startswith("chatcmpl-"), chat)
        self.assertEqual(len(chat["content"].split()), MAX_TOKENS, chat)
        self.assertEqual(chat["finish_reason"], "length")
        self.assertEqual(chat["usage"]["completion_tokens"], MAX_TOKENS)
        self.assertEqual(chat["usage"]["total_tokens"],
                         chat["usage"]["prompt_tokens"] + MAX_TOKENS)

        deltas = by_kind["delta"]
        end = by_kind["stream_end"][0]
        self.assertEqual(len(deltas), MAX_TOKENS, events)
        self.assertEqual([d["index"] for d in deltas], list(range(MAX_TOKENS)))
        self.assertEqual(end["deltas"], MAX_TOKENS)
        self.assertEqual("".join(d["content"] for d in deltas), end["content"])
        self.assertEqual(end["role"], "assistant")
        # The SDK ended the stream itself at [DONE], after the finish_reason and the usage chunk.
        self.assertEqual(end["finish_reason"], "length")
        self.assertEqual(end["usage"]["completion_tokens"], MAX_TOKENS)
        self.assertEqual(end["usage"]["prompt_tokens"], chat["usage"]["prompt_tokens"])
        self.assertEqual(end["chunks"], 1 + MAX_TOKENS + 1)  # role, tokens, usage
        # Deltas arrived as they were produced (20 ms apart), not all at the end.
        self.assertGreaterEqual(deltas[-1]["t_ms"] - deltas[0]["t_ms"], 0.5 * 20 * (MAX_TOKENS - 1))

        # The server saw both requests complete: nothing aborted, the stream asked for usage.
        log = self.node.wait_for_requests(
            lambda log: len(log["requests"]) == 2 and all(r["status"] == 200
                                                         for r in log["requests"]),
            timeout=max(1.0, CLIENT_TIMEOUT_S - (time.monotonic() - started)))
        self.assertEqual(log["counters"]["aborts"], 0)
        stream_request = json.loads(log["requests"][1]["body"])
        self.assertIs(stream_request["stream"], True)
        self.assertEqual(stream_request["stream_options"], {"include_usage": True})


if __name__ == "__main__":
    unittest.main()
