"""A pdrouter with simulated prefill/decode nodes registered to it: the P/D request path end to
end on loopback (real processes, real ZMQ registration, real HTTP).

  cluster = PdCluster("moriio", transfer_mode="WRITE", prefills=1, decodes=1)
  status, headers, body = cluster.post("/v1/completions", {...})
  with cluster.stream("/v1/chat/completions", {...}) as events: ...
  cluster.close()

Nodes register in their connector's own format (MoRIIO, P2P-NCCL) or pdrouter's (NIXL, Mooncake,
SGLang) every 200 ms; the constructor returns once pdrouter routes to all of them and /ready is
200 (wait_routable() waits for that again, for a test that needs every node).
"""
import http.client
import json
import os
import random
import socket

from pdrouter_fixture import Router, TIME_SCALE
from sim_fixture import SimNode, stream_post

SPARE_PORTS = 8  # after each node's ports: room for per-DP-rank side-channel ports (kv_port + r)
_handed_out = set()  # ports given to this process's nodes (decodes advertise theirs unbound)


# The generation paths and small request bodies the P/D failure and load tests send.
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(max_tokens=4, stream=False, content="hello there"):
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "stream": stream}


def completion(max_tokens=4, prompt="one two three four"):
    return {"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens}


def _ports(n):
    """n consecutive side-channel ports (then SPARE_PORTS more) free right now on 127.0.0.1, from a
    random base below the ephemeral range, so concurrent test processes rarely collide. The
    sims moving real KV bind them (MoRIIO handshake/notify, kv_port + DP rank)."""
    for _ in range(200):
        first = random.randrange(20000, 32000 - n - SPARE_PORTS)
        block = set(range(first, first + n + SPARE_PORTS))
        if block & _handed_out:
            continue
        probes = []
        try:
            for port in range(first, first + n + SPARE_PORTS):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                probes.append(sock)
                sock.bind(("127.0.0.1", port))
            _handed_out.update(block)
            return list(range(first, first + n))
        except OSError:
            continue
        finally:
            for sock in probes:
                sock.close()
    raise AssertionError("no %d free consecutive ports found" % (n + SPARE_PORTS))


class PdCluster:
    def __init__(self, connector, transfer_mode=None, prefills=1, decodes=1, topology=None,
                 prefill_flags=(), decode_flags=(), register=True, router_args=(),
                 router_env=None, kv_backends=None, ephemeral_ports=False, router_nofile=None,
                 ssl_context=None):
        # ssl_context: the client listener speaks TLS (listeners.tls); every request uses it.
        self.ssl_context = ssl_context
        self.connector = connector
        self.transfer_mode = transfer_mode
        # The sims' --kv-backends: "tcp" unless PDR_SIM_KV_BACKENDS says otherwise ("none": no
        # real KV moves, as before the sims had a transfer engine).
        self.kv_backends = kv_backends or os.environ.get("PDR_SIM_KV_BACKENDS", "tcp")
        # True: side-channel ports 0, so each sim binds ephemeral ones and advertises those.
        self.ephemeral_ports = ephemeral_ports
        self.router = Router(topology_yaml=topology, extra_args=router_args, env=router_env,
                             nofile=router_nofile, ssl_context=ssl_context)
        self.prefills, self.decodes = [], []
        try:
            for role, count, flags, nodes in (("prefill", prefills, prefill_flags, self.prefills),
                                              ("decode", decodes, decode_flags, self.decodes)):
                for _ in range(count):
                    nodes.append(self.start_node(role, flags, register))
            if register:
                self.wait_registered(self.prefills + self.decodes)
        except BaseException:
            self.close()
            raise

    def start_node(self, role, flags=(), register=True):
        # The connectors' side channels sit at a base port plus the DP rank, so the ports are
        # chosen here, free a moment ago, not by the kernel: another process (another test
        # module's sims under ctest -j) may bind one first. Then another block is chosen; with
        # ephemeral_ports the kernel picks and nothing can collide.
        attempts = 1 if self.ephemeral_ports else 5
        for attempt in range(1, attempts + 1):
            args = ["--role", role, "--connector", self.connector, "--kv-backends", self.kv_backends]
            if self.transfer_mode:
                args += ["--transfer-mode", self.transfer_mode]
            handshake, notify, kv = (0, 0, 0) if self.ephemeral_ports else _ports(3)
            args += ["--handshake-port", str(handshake), "--notify-port", str(notify),
                     "--kv-port", str(kv)]
            if self.connector == "mooncake" and role == "prefill":
                args += ["--bootstrap-port", "0"]
            if register:
                args += ["--register", self.router.discovery, "--register-interval-ms", "200"]
            try:
                return SimNode(*args, *flags)
            except AssertionError as e:
                if attempt == attempts or "Address already in use" not in str(e):
                    raise

    def wait_registered(self, nodes):
        """Waits until pdrouter routes to every one of `nodes` (Router.wait_routable) and /ready
        is 200."""
        self.router.wait_routable([n.http_address for n in nodes], timeout=10)
        self.router.wait_for(lambda: self.get("/ready")[0] == 200, timeout=10)

    def wait_routable(self):
        """Waits until every node of the cluster is routable again, e.g. before a test that needs
        all of them (an earlier test may have got one ejected or drained)."""
        self.wait_registered(self.prefills + self.decodes)

    # --- client side ----------------------------------------------------------------------------
    def _host_port(self):
        host, port = self.router.http.rsplit(":", 1)
        return host, int(port)

    def request(self, method, path, body=None, headers=None, timeout=10):
        """Returns (status, headers dict with lower-case names, body bytes)."""
        host, port = self._host_port()
        conn = (http.client.HTTPSConnection(host, port, timeout=timeout * TIME_SCALE,
                                            context=self.ssl_context)
                if self.ssl_context is not None
                else http.client.HTTPConnection(host, port, timeout=timeout * TIME_SCALE))
        try:
            data = None if body is None else (body if isinstance(body, (bytes, str))
                                              else json.dumps(body))
            all_headers = {"Content-Type": "application/json"} if data is not None else {}
            all_headers.update(headers or {})
            conn.request(method, path, body=data, headers=all_headers)
            response = conn.getresponse()
            return (response.status, {k.lower(): v for k, v in response.getheaders()},
                    response.read())
        finally:
            conn.close()

    def post(self, path, body, headers=None, timeout=10):
        return self.request("POST", path, body, headers, timeout)

    def get(self, path, headers=None, timeout=10):
        return self.request("GET", path, None, headers, timeout)

    def stream(self, path, body, headers=None, timeout=10):
        """A streaming POST through pdrouter (sim_fixture.SseStream)."""
        host, port = self._host_port()
        return stream_post(host, port, path, body, headers, timeout * TIME_SCALE, self.ssl_context)

    def metric(self, name):
        return self.router.metrics().get(name, 0.0)

    def close(self):
        """Stops every process; raises if one did not exit cleanly (0), e.g. a sanitizer report
        or a leak found at exit."""
        failures = []
        for node in self.prefills + self.decodes:
            code = node.stop()
            if code != 0:
                failures.append("pdnode sim %s exited %s:\n%s" % (node.http_address, code,
                                                                   node.proc.output()[-3000:]))
        code = self.router.stop()
        if code != 0:
            failures.append("pdrouter exited %s:\n%s" % (code, self.router.log()[-3000:]))
        self.router.dir.cleanup()
        if failures:
            raise AssertionError("\n".join(failures))

