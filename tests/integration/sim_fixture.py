"""`pdnode sim` for integration tests: a running simulated vLLM node with an HTTP client for it,
and SSE helpers (shared by test_sim.py and the router tests that use sim nodes as peers).

  * SimNode(*flags, env=None): starts `pdnode sim --http 127.0.0.1:0 FLAGS...` and waits for its
    "listening" line (a standalone SimNode gets `--kv-backends none` unless FLAGS name
    --kv-backends: alone, it has no peer to move KV from, and tests send it made-up decode
    params; pd_fixture's clusters move real KV); kv_port is its KV side channel (nodes moving
    real KV) and kv_stats() its GET /sim/kv; request/post_json talk to it; sim_requests/reset/set_fault/clear_faults drive
    its test endpoints (node/sim/server.h); wait_for_requests polls its request log with a
    deadline; stop() is a clean SIGTERM, kill() a SIGKILL for "node died" tests.
  * sse_events(raw): the `data:` payloads of a complete SSE body.
  * stream_post(host, port, path, body): a streaming POST whose `data:` payloads are yielded as they
    arrive, so a test can act on the first event before the stream ends.
"""

import http.client
import json
import re
import signal
import time

from pdr_testlib import ProcessHandle, pdnode_path
from pdrouter_fixture import TIME_SCALE

START_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.02


class SimNode:
    """A running `pdnode sim` and an HTTP client for it."""

    def __init__(self, *flags, env=None):
        if "--kv-backends" not in flags:
            # Standalone: no prefill to fetch KV from (and made-up decode params in tests).
            flags = (*flags, "--kv-backends", "none")
        # An --http among the flags (a restart on the same address) replaces the ephemeral one.
        http = () if "--http" in flags else ("--http", "127.0.0.1:0")
        self.proc = ProcessHandle([pdnode_path(), "sim", *http, *flags], name="pdnode-sim", env=env)
        line = self.proc.wait_for_line(r"pdnode sim listening http=", START_TIMEOUT_S * TIME_SCALE,
                                       streams=("stdout",))
        if line is None:
            self.proc.stop()
            raise AssertionError("pdnode sim did not start:\n" + self.proc.output())
        self._port = int(re.search(r"http=127\.0\.0\.1:(\d+)", line).group(1))
        self._advertise_host = (flags[flags.index("--advertise-host") + 1]
                                if "--advertise-host" in flags else "127.0.0.1")
        match = re.search(r"bootstrap=127\.0\.0\.1:(\d+)", line)
        self._bootstrap_port = int(match.group(1)) if match else None
        match = re.search(r" kv=127\.0\.0\.1:(\d+)", line)
        self._kv_port = int(match.group(1)) if match else None

    @property
    def port(self):
        return self._port

    @property
    def bootstrap_port(self):
        """Port of the separate Mooncake bootstrap listener, or None."""
        return self._bootstrap_port

    @property
    def kv_port(self):
        """First port of the KV side channel (a node moving real KV), or None."""
        return self._kv_port

    def kv_stats(self):
        """GET /sim/kv: the KV mover's counters (kv_blocks_held, kv_bytes_moved, ...)."""
        status, raw, _ = self.request("GET", "/sim/kv")
        assert status == 200, (status, raw)
        return json.loads(raw)

    @property
    def http_address(self):
        """"HOST:PORT" as the node registers itself: 127.0.0.1 unless --advertise-host says."""
        return "%s:%d" % (self._advertise_host, self._port)

    def request(self, method, path, body=None, headers=None, port=None, timeout=10):
        """One request on a fresh connection; returns (status, body bytes, Content-Type).
        `body` may be bytes, str or a JSON-serialisable object."""
        # ssl_context: set by a test whose sim serves HTTPS (--ssl-certfile), for its own requests.
        context = getattr(self, "ssl_context", None)
        conn = (http.client.HTTPSConnection("127.0.0.1", port or self._port, timeout=timeout, context=context)
                if context is not None and port is None
                else http.client.HTTPConnection("127.0.0.1", port or self._port, timeout=timeout))
        try:
            data = None if body is None else (body if isinstance(body, (bytes, str))
                                              else json.dumps(body))
            all_headers = {"Content-Type": "application/json"}
            all_headers.update(headers or {})
            conn.request(method, path, body=data, headers=all_headers)
            response = conn.getresponse()
            return response.status, response.read(), response.getheader("Content-Type")
        finally:
            conn.close()

    def post_json(self, path, body, headers=None, timeout=10):
        """POST a JSON body; returns (status, parsed JSON answer)."""
        status, raw, _ = self.request("POST", path, body, headers, timeout=timeout)
        return status, json.loads(raw)

    def sim_requests(self):
        """GET /sim/requests: {"requests": [...], "counters": {...}}."""
        status, raw, _ = self.request("GET", "/sim/requests")
        assert status == 200, (status, raw)
        return json.loads(raw)

    def reset(self):
        """Clears the request log and counters (POST /sim/reset) and any queued faults."""
        status, raw, _ = self.request("POST", "/sim/reset")
        assert status == 200, (status, raw)
        self.clear_faults()

    def set_fault(self, **fields):
        """Queues one fault (POST /sim/faults), e.g. set_fault(status=500, count=2); returns the
        queue. Raises AssertionError if the node refuses the fault."""
        status, raw, _ = self.request("POST", "/sim/faults", fields)
        assert status == 200, "fault %r refused: %d %s" % (fields, status, raw)
        return json.loads(raw)["faults"]

    def clear_faults(self):
        """DELETE /sim/faults."""
        status, raw, _ = self.request("DELETE", "/sim/faults")
        assert status == 200, (status, raw)

    def wait_for_requests(self, predicate, timeout=5.0):
        """Polls /sim/requests until predicate(log) is true; returns that log. Raises
        AssertionError with the last log when `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.sim_requests()
            if predicate(log):
                return log
            if time.monotonic() >= deadline:
                raise AssertionError("sim request log did not match within %.1fs: %s"
                                     % (timeout, json.dumps(log, indent=1)))
            time.sleep(POLL_INTERVAL_S)

    def stop(self):
        """SIGTERM and wait (5 s, scaled); returns the exit code (0 for a clean stop)."""
        return self.proc.stop(5.0 * TIME_SCALE)

    def kill(self):
        """SIGKILL and wait, for "node died" tests; returns the exit code (-9)."""
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(5.0)


def sse_events(raw):
    """The `data:` payloads of a complete SSE body, in order."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-40:]
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        events.append(block[len("data: "):])
    return events


class SseStream:
    """The answer to a streaming POST. `status` and `headers` are known on return from
    stream_post(); iterating yields each event's `data:` payload (str) as it arrives and ends
    after the terminating chunk. A connection cut before that raises http.client.IncompleteRead
    (or an OSError) from the iteration. For a non-200 answer, `body()` returns the whole body."""

    def __init__(self, conn, response):
        self._conn = conn
        self._response = response
        self.status = response.status
        self.headers = response.getheaders()

    def __iter__(self):
        # read1() rather than readline(): on a chunked body cut short, http.client's readline()
        # reports a plain end of file, while read1() raises IncompleteRead. read1() returns what
        # has arrived, so events are still yielded as they come.
        pending = b""
        data = []
        while True:
            received = self._response.read1(65536)
            if not received:
                if data:  # a final event without its blank line
                    yield "\n".join(data)
                return
            pending += received
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                line = raw.decode("utf-8").rstrip("\r")
                if line == "":
                    if data:
                        yield "\n".join(data)
                        data = []
                elif line.startswith("data:"):
                    value = line[len("data:"):]
                    data.append(value[1:] if value.startswith(" ") else value)
                # Other fields (event:, id:, comments) are not used by vLLM's OpenAI server.

    def body(self):
        return self._response.read()

    def close(self):
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def stream_post(host, port, path, body, headers=None, timeout=10, ssl_context=None):
    """POST `body` (a JSON-serialisable object, str or bytes) and return an SseStream once the
    response head arrives. `timeout` bounds the connect and every read. Close it (or use `with`)
    when done; closing early is how a test makes the client go away mid-stream. `ssl_context`:
    over TLS (https)."""
    conn = (http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl_context)
            if ssl_context is not None else http.client.HTTPConnection(host, port, timeout=timeout))
    try:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        all_headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        all_headers.update(headers or {})
        conn.request("POST", path, body=data, headers=all_headers)
        return SseStream(conn, conn.getresponse())
    except BaseException:
        conn.close()
        raise
