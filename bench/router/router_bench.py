#!/usr/bin/python3
"""pdrouter's proxy benchmark (run through bench/router/run.sh, which owns the temp directory).

Targets, all on loopback against the same `pdnode sim` decode node (zero simulated compute, so the
numbers are HTTP plumbing only):
  (a) direct   wrk -> decode sim
  (b) pdrouter wrk -> pdrouter -> prefill sim (max_tokens=1 leg), then -> decode sim (MoRIIO WRITE)
  (c) nginx    wrk -> nginx (plain reverse proxy, upstream keepalive) -> decode sim
Measured per target: requests/s and p50/p99 at 100 connections (non-streaming completions and
streaming chat), p50/p99 at 1 connection, TTFT with a small asyncio client, and CPU seconds per
1,000 requests of the proxy process(es) from /proc/PID/stat.

Standard library only (Debian's /usr/bin/python3). See bench/router/RESULTS.md.
"""
import argparse
import asyncio
import ctypes
import datetime
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import machine  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import canned_nodes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CLK_TCK = os.sysconf("SC_CLK_TCK")
KEEP_MARKER = "<!-- Everything below this line is hand-written and kept when run.sh rewrites the file. -->"

COMPLETION = {"model": "sim-model", "prompt": "The quick brown fox jumps over the lazy dog",
              "max_tokens": 4}
# vLLM's tokens-in endpoint (POST /inference/v1/generate): token counts inside sampling_params.
GENERATE = {"model": "sim-model", "token_ids": [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290],
            "sampling_params": {"max_tokens": 4, "temperature": 0}}
CHAT_STREAM = {"model": "sim-model", "messages": [{"role": "user", "content": "Say hello"}],
               "max_tokens": 4, "stream": True}

# --------------------------------------------------------------------------------------------
# Processes: every child dies with us (PR_SET_PDEATHSIG) and is listed in WORK/pids for run.sh.

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_children = []


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Child:
    def __init__(self, name, args, work, env=None):
        self.name = name
        self.out_path = os.path.join(work, name + ".out")
        self.err_path = os.path.join(work, name + ".err")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=open(self.out_path, "w"),
                                     stderr=open(self.err_path, "w"),
                                     preexec_fn=_die_with_parent, env=env)
        self.pid = self.proc.pid
        with open(os.path.join(work, "pids"), "a") as f:
            f.write("%d\n" % self.pid)
        _children.append(self)

    def wait_line(self, pattern, timeout=10.0):
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            with open(self.out_path) as f:
                for line in f:
                    match = regex.search(line)
                    if match:
                        return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("%s did not print %r:\n%s" % (self.name, pattern, self.log()))

    def log(self):
        text = ""
        for path in (self.out_path, self.err_path):
            with open(path) as f:
                text += f.read()[-3000:]
        return text

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def stop_all():
    for child in reversed(_children):
        try:
            child.stop()
        except Exception as e:  # keep stopping the others
            print("stopping %s: %s" % (child.name, e), file=sys.stderr)
    _children.clear()


def cpu_seconds(pids):
    """utime+stime of each process (all its threads), summed, in seconds."""
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat(5))
    return total / CLK_TCK


def children_of(pid):
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                pids.append(int(entry))
    return pids


def active_opens():
    """TCP connections opened (connect) in this network namespace so far; None if unknown. Only
    meaningful in the private namespace main() re-executes into (nothing else connects there)."""
    if os.environ.get("PDR_BENCH_NETNS") != "1":
        return None
    with open("/proc/net/snmp") as f:
        lines = [line.split() for line in f if line.startswith("Tcp:")]
    return int(lines[1][lines[0].index("ActiveOpens")])


def free_port(host="127.0.0.1"):
    return free_ports([host])[0]


def free_ports(hosts):
    """One free TCP port per entry of `hosts` (all held open while picking, so no two repeat)."""
    socks = []
    try:
        for host in hosts:
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def http_request(addr, method, path, body=None, timeout=5):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# The system under test


def binaries(args):
    """(pdrouter, pdnode) paths; raises if one of them or wrk / nginx is missing."""
    pdrouter = os.path.join(args.bin_dir, "router", "pdrouter")
    pdnode = os.path.join(args.bin_dir, "node", "pdnode")
    for path in (pdrouter, pdnode):
        if not os.access(path, os.X_OK):
            raise RuntimeError("missing %s (build pdrouter and pdnode, or pass --bin-dir)" % path)
    for tool in ("wrk", "nginx"):
        if not any(os.access(os.path.join(d, tool), os.X_OK)
                   for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin"]):
            raise RuntimeError("%s not found: deploy/install-deps.sh --tests installs it" % tool)
    return pdrouter, pdnode


def start_router(args, tag, extra=(), env=None):
    """pdrouter on ephemeral ports; returns (Child, http address, discovery endpoint)."""
    pdrouter = binaries(args)[0]
    router = Child("pdrouter-" + tag, [pdrouter, "--http", "127.0.0.1:0", "--discovery",
                                       "tcp://127.0.0.1:0", "--workers", str(args.router_workers),
                                       "--log-level", "warn", *extra], args.work_dir, env)
    match = router.wait_line(r"pdrouter listening http=(\S+) discovery=(\S+)")
    return router, match.group(1), match.group(2)


def start_nginx(args, tag, conf_text, env=None):
    """A private nginx (config, pid file, logs in WORK/TAG; never the system service).
    `conf_text` is formatted with dir=. Returns (Child, its directory)."""
    directory = os.path.join(args.work_dir, tag)
    os.makedirs(os.path.join(directory, "tmp"))
    conf = os.path.join(directory, "nginx.conf")
    with open(conf, "w") as f:
        f.write(conf_text)
    # daemon off: the master is our child; -e: even start-up errors go to the temp dir.
    child = Child(tag, ["nginx", "-e", os.path.join(directory, "error.log"), "-p", directory,
                        "-c", conf], args.work_dir, env)
    child.nginx_dir = directory
    return child, directory


def nginx_worker_pids(args, nginx, expected):
    workers = children_of(nginx.pid)
    with open(os.path.join(args.work_dir, "pids"), "a") as f:  # for run.sh's cleanup, if we die hard
        f.write("".join("%d\n" % pid for pid in workers))
    if len(workers) != expected:
        raise RuntimeError("expected %d nginx workers, found %r" % (expected, workers))
    return workers


def wait_up(checks, nginxes, router, timeout=15):
    """Until every (addr, path) in `checks` answers GET 200; fails early if an nginx exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if all(http_request(addr, "GET", path)[0] == 200 for addr, path in checks):
                return
        except OSError:
            pass
        for nginx in nginxes:
            if nginx.proc.poll() is not None:
                with open(os.path.join(nginx.nginx_dir, "error.log")) as f:
                    raise RuntimeError("%s exited:\n%s" % (nginx.name, f.read()))
        if time.monotonic() > deadline:
            raise RuntimeError("not up within %d s: %r\n%s" % (timeout, checks, router.log()))
        time.sleep(0.05)


def check_answers(targets, streaming=True):
    """One request of each kind through each (name, addr), checked by hand."""
    for name, addr in targets:
        status, body = http_request(addr, "POST", "/v1/completions", COMPLETION)
        try:
            ok = status == 200 and json.loads(body).get("choices")
        except ValueError:
            ok = False
        if not ok:
            raise RuntimeError("%s: /v1/completions answered %d %r" % (name, status, body[:300]))
        if streaming:
            status, body = http_request(addr, "POST", "/v1/chat/completions", CHAT_STREAM)
            text = body.decode(errors="replace")
            if status != 200 or not text.rstrip().endswith("data: [DONE]") or '"error"' in text:
                raise RuntimeError("%s: streaming /v1/chat/completions answered %d %r"
                                   % (name, status, body[:300]))


class Setup:
    def __init__(self, args, decode_us=0, tag="nginx"):
        self.args = args
        work = args.work_dir
        pdnode = binaries(args)[1]
        self.router, self.router_addr, discovery = start_router(args, tag)

        sim_flags = ["--connector", "moriio", "--transfer-mode", "WRITE",
                     "--prefill-us-per-token", "0", "--decode-us-per-token", str(decode_us),
                     "--workers", str(args.sim_workers), "--log-level", "warn",
                     "--register", discovery, "--register-interval-ms", "1000"]
        self.prefill = Child("prefill-sim-" + tag, [pdnode, "sim", "--role", "prefill",
                                             "--handshake-port", "26301", "--notify-port", "26302",
                                             *sim_flags], work)
        self.decode = Child("decode-sim-" + tag, [pdnode, "sim", "--role", "decode",
                                           "--handshake-port", "26303", "--notify-port", "26304",
                                           *sim_flags], work)
        self.prefill_addr = self.prefill.wait_line(r"listening http=(127\.0\.0\.1:\d+)").group(1)
        self.decode_addr = self.decode.wait_line(r"listening http=(127\.0\.0\.1:\d+)").group(1)

        self.nginx_addr = "127.0.0.1:%d" % free_port()
        self.nginx, self.nginx_dir = start_nginx(args, tag, NGINX_CONF.format(
            dir=os.path.join(work, tag), workers=args.router_workers, listen=self.nginx_addr,
            upstream=self.decode_addr))
        wait_up([(self.router_addr, "/ready"), (self.nginx_addr, "/health")], [self.nginx],
                self.router)
        self.nginx_workers = nginx_worker_pids(args, self.nginx, args.router_workers)
        check_answers(self.targets(), streaming=False)

    def targets(self):
        return [("direct", self.decode_addr), ("pdrouter", self.router_addr),
                ("nginx", self.nginx_addr)]

    def proxy_pids(self, name):
        if name == "pdrouter":
            return [self.router.pid]
        if name == "nginx":
            return [self.nginx.pid] + self.nginx_workers
        return []

    def upstream_pids(self):
        return [self.decode.pid, self.prefill.pid]

    def children(self):
        return [self.router, self.prefill, self.decode, self.nginx]

    def router_5xx(self):
        return router_5xx(self.router_addr)


def router_5xx(router_addr):
    status, body = http_request(router_addr, "GET", "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("pdrouter_http_responses_total") and re.search(r'"5\d\d"|"5xx"', line):
            total += float(line.rsplit(" ", 1)[1])
    return total


# The CPU comparison's dialects: (name, family, pdnode sim flags).
DIALECTS = (("nixl", "serial", ["--connector", "nixl"]),
            ("moriio-write", "concurrent", ["--connector", "moriio", "--transfer-mode", "WRITE"]),
            ("mooncake", "concurrent", ["--connector", "mooncake"]))


class DialectSetup:
    """pdrouter and the nginx baseline in front of one prefill and one decode node speaking
    `dialect`: pdnode sims that register over discovery (upstream "sim"; real KV moves between
    them over TCP, so a concurrent dialect's decode waits for the prefill's push as on real nodes)
    or canned-answer nginx nodes listed as static instances (upstream "canned", canned_nodes.py).
    The baseline nginx proxies to the same decode node pdrouter uses. `router_env` / `nginx_env`:
    the environment of pdrouter / the baseline nginx (count_syscalls.py preloads a counter);
    `suffix` makes the processes' names and directories unique when a setup is started again."""

    def __init__(self, args, upstream, dialect, router_env=None, nginx_env=None, suffix=""):
        self.args = args
        self.upstream = upstream
        self.dialect = dialect
        tag = "%s-%s%s" % (upstream, dialect, suffix)
        pdnode = binaries(args)[1]
        self.node_children = []
        nginxes = []
        if upstream == "canned":
            hosts = (canned_nodes.PREFILL_HOST, canned_nodes.DECODE_HOST, canned_nodes.PREFILL_HOST)
            ports = dict(zip(("prefill", "decode", "bootstrap"), free_ports(hosts)))
            nodes, node_dir = start_nginx(args, "nodes-" + tag, canned_nodes.nginx_conf(
                os.path.join(args.work_dir, "nodes-" + tag), ports))
            self.node_children = [nodes]
            nginxes.append(nodes)
            topology = os.path.join(node_dir, "topology.yaml")
            with open(topology, "w") as f:
                f.write(canned_nodes.topology_yaml(dialect, ports))
            self.decode_addr = "%s:%d" % (canned_nodes.DECODE_HOST, ports["decode"])
            wait_up([(self.decode_addr, "/health")], nginxes, nodes)
            self.node_pids = [nodes.pid] + nginx_worker_pids(args, nodes, 1)
            self.router, self.router_addr, _ = start_router(args, tag, ["--config", topology],
                                                            router_env)
        else:
            self.router, self.router_addr, discovery = start_router(args, tag, (), router_env)
            flags = dict((d[0], d[2]) for d in DIALECTS)[dialect]
            for role in ("prefill", "decode"):
                extra = ["--bootstrap-port", "0"] if dialect == "mooncake" and role == "prefill" else []
                self.node_children.append(Child("%s-sim-%s" % (role, tag), [
                    pdnode, "sim", "--role", role, *flags, *extra,
                    "--handshake-port", "0", "--notify-port", "0", "--kv-port", "0",
                    "--prefill-us-per-token", "0", "--decode-us-per-token", "0",
                    "--workers", str(args.sim_workers), "--log-level", "warn",
                    "--register", discovery, "--register-interval-ms", "1000"], args.work_dir))
            self.decode_addr = self.node_children[1].wait_line(
                r"listening http=(127\.0\.0\.1:\d+)").group(1)
            self.node_children[0].wait_line(r"listening http=")
            self.node_pids = [c.pid for c in self.node_children]
        self.nginx_addr = "127.0.0.1:%d" % free_port()
        self.nginx, _ = start_nginx(args, "proxy-" + tag, NGINX_CONF.format(
            dir=os.path.join(args.work_dir, "proxy-" + tag), workers=args.router_workers,
            listen=self.nginx_addr, upstream=self.decode_addr), nginx_env)
        nginxes.append(self.nginx)
        wait_up([(self.router_addr, "/ready"), (self.nginx_addr, "/health")], nginxes, self.router)
        self.nginx_workers = nginx_worker_pids(args, self.nginx, args.router_workers)
        check_answers(self.targets())

    def targets(self):
        return [("pdrouter", self.router_addr), ("nginx", self.nginx_addr)]

    def proxy_pids(self, name):
        return [self.router.pid] if name == "pdrouter" else [self.nginx.pid] + self.nginx_workers

    def upstream_pids(self):
        return self.node_pids

    def children(self):
        return [self.router, self.nginx] + self.node_children

    def router_5xx(self):
        return router_5xx(self.router_addr)


NGINX_CONF = """\
# Private nginx for bench/router: a plain reverse proxy in front of one decode sim.
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
  upstream decode {{
    server {upstream};
    keepalive 256;
    keepalive_requests 1000000;
  }}
  server {{
    listen {listen} backlog=4096;
    location / {{
      proxy_pass http://decode;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""

# --------------------------------------------------------------------------------------------
# wrk

WRK_LUA = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[{body}]==]
{pacing}done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('BENCHJSON {{"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d,"mean":%.1f}}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
end
"""


def new_legs(setup, name):
    """pdrouter's upstream legs answered on a new connection so far (/metrics); None for the
    other targets."""
    if name != "pdrouter":
        return None
    body = http_request(setup.router_addr, "GET", "/metrics")[1].decode()
    match = re.search(r'^pdrouter_upstream_legs_total\{connection="new"\} (\S+)$', body, re.M)
    return float(match.group(1)) if match else None


# Paced runs (the equal-rate comparison): before each request a connection waits a random time,
# uniform in [0, 2 x mean] ms (wrk has no open-loop mode; wrk2 is not in Debian). A connection's
# cycle is that wait plus the answer's latency plus wrk's timer slack, so the mean wait is
# calibrated per target (paced_wait_ms). The rate reached is measured, not assumed: it is what the
# table reports.
WRK_PACING = """\
math.randomseed({seed})
delay = function()
  return math.floor(math.random() * {twice_mean_ms} + 0.5)
end
"""


def run_wrk(setup, target, path, body, connections, seconds, work, wait_ms=None, scheme="http",
            close=False):
    """One wrk run against `target`; `wait_ms`: paced, each connection waiting that long on
    average before each request. `scheme` https: over TLS; `close`: every request asks for
    Connection: close (a new connection, and with https a handshake, per request)."""
    name, addr = target
    script = os.path.join(work, "wrk-%d%s%s.lua" % (connections, "-paced" if wait_ms else "",
                                                     "-close" if close else ""))
    pacing = 'wrk.headers["Connection"] = "close"\n' if close else ""
    if wait_ms:
        pacing += WRK_PACING.format(seed=connections, twice_mean_ms="%.3f" % (2.0 * wait_ms))
    with open(script, "w") as f:
        f.write(WRK_LUA.format(body=json.dumps(body), pacing=pacing))
    pids = setup.proxy_pids(name)
    cpu_before = cpu_seconds(pids) if pids else 0.0
    sim_before = cpu_seconds(setup.upstream_pids())
    opens_before = active_opens()
    legs_before = new_legs(setup, name)
    threads = min(connections, setup.args.wrk_threads)
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", "%ds" % max(1, round(seconds)),
           "--timeout", "5s", "--latency", "-s", script, "%s://%s%s" % (scheme, addr, path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60,
                         preexec_fn=_die_with_parent)
    cpu = (cpu_seconds(pids) - cpu_before) if pids else None
    sim_cpu = cpu_seconds(setup.upstream_pids()) - sim_before
    opens = None if opens_before is None else active_opens() - opens_before
    if legs_before is not None:
        # pdrouter counts its own legs on new connections: exact, and the sims' KV connections
        # (real KV moves over TCP between them) are not in it.
        opens = new_legs(setup, name) - legs_before + connections
    match = re.search(r"^BENCHJSON (.*)$", out.stdout, re.M)
    if out.returncode != 0 or not match:
        raise RuntimeError("wrk failed (%d):\n%s\n%s" % (out.returncode, out.stdout, out.stderr))
    r = json.loads(match.group(1))
    r["errors"] = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    r["cpu_s"] = cpu
    r["cpu_per_1k"] = None if cpu is None or not r["requests"] else cpu / r["requests"] * 1000
    r["sim_cpu_per_1k"] = sim_cpu / r["requests"] * 1000 if r["requests"] else None
    # New connections the proxy opened to the sims: everything opened during the run but wrk's
    # own `connections` (wrk reconnects only when the server closes, which none of them does).
    r["upstream_opens_per_1k"] = (None if opens is None or not r["requests"] or name == "direct"
                                  else max(0, opens - connections) / r["requests"] * 1000)
    return r


# --------------------------------------------------------------------------------------------
# TTFT: wrk only sees whole responses, so a small asyncio client measures the time from sending a
# streaming chat request to the first data: event that carries generated text.


async def _read_response(reader, on_data):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = head.decode("latin-1").lower()
    if "transfer-encoding: chunked" in headers:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status
            on_data(await reader.readexactly(size))
            await reader.readexactly(2)
    length = int(re.search(r"content-length: *(\d+)", headers).group(1))
    on_data(await reader.readexactly(length))
    return status


async def _ttft_client(host, port, path, seconds, results):
    reader, writer = await asyncio.open_connection(host, port)
    body = json.dumps(CHAT_STREAM).encode()
    request = (b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
               b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n"
               % (path.encode(), host.encode(), port, len(body))) + body
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            state = {"first": None, "buf": b""}
            start = time.perf_counter()

            def on_data(chunk):
                state["buf"] += chunk
                if state["first"] is None and b'"content":"' in chunk and \
                        re.search(rb'"content":"[^"]', chunk):
                    state["first"] = time.perf_counter()

            writer.write(request)
            status = await asyncio.wait_for(_read_response(reader, on_data), 10)
            end = time.perf_counter()
            text = state["buf"].decode()
            ok = (status == 200 and text.rstrip().endswith("data: [DONE]") and
                  '"finish_reason":"' in text and '"error"' not in text and
                  state["first"] is not None)
            if ok:
                results["ttft"].append(state["first"] - start)
                results["total"].append(end - start)
            else:
                results["errors"] += 1
    finally:
        writer.close()


def run_ttft(addr, connections, seconds):
    host, port = addr.rsplit(":", 1)
    results = {"ttft": [], "total": [], "errors": 0}

    async def main():
        await asyncio.gather(*[_ttft_client(host, int(port), "/v1/chat/completions", seconds,
                                            results) for _ in range(connections)])

    asyncio.run(main())
    ttft = sorted(results["ttft"])
    return {"requests": len(ttft), "errors": results["errors"],
            "p50": pct(ttft, 50) * 1e6 if ttft else 0, "p99": pct(ttft, 99) * 1e6 if ttft else 0}


def pct(sorted_values, p):
    index = min(len(sorted_values) - 1, max(0, int(round(p / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[index]


# --------------------------------------------------------------------------------------------
# CPU comparison: pdrouter's CPU per P/D request vs nginx's per proxied request, per upstream kind
# (sims, canned nginx nodes) and dialect, at each of --cpu-connections.

UPSTREAMS = ("sim", "canned")


def cpu_workloads(args):
    """(label, path, body, connections) of each measurement; smoke: completions at the first
    connection count only (the streaming answer of every setup is still checked by hand)."""
    conns = [int(c) for c in args.cpu_connections.split(",")]
    out = [("completions", "/v1/completions", COMPLETION, c) for c in conns]
    if not args.smoke:
        out.append(("streaming chat", "/v1/chat/completions", CHAT_STREAM, max(conns)))
    return out[:1] if args.smoke else out


def run_cpu_matrix(args, seconds, warm_seconds):
    """Each upstream kind x dialect on a fresh set of processes; pdrouter and nginx runs alternate.
    Returns a list of rows (dicts) and the number of pdrouter 5xx answers seen."""
    rows, fivexx = [], 0
    wanted = args.cpu_dialects.split(",")
    for upstream in UPSTREAMS:
        for dialect, family, _ in DIALECTS:
            if dialect not in wanted:
                continue
            setup = DialectSetup(args, upstream, dialect)
            try:
                if warm_seconds:  # pools filled, Mooncake's /query read, caches warm
                    for target in setup.targets():
                        run_wrk(setup, target, "/v1/completions", COMPLETION,
                                max(w[3] for w in cpu_workloads(args)), warm_seconds,
                                args.work_dir)
                for label, path, body, conns in cpu_workloads(args):
                    row = {"upstream": upstream, "dialect": dialect, "family": family,
                           "workload": label, "connections": conns}
                    runs = {}
                    for _ in range(1 if args.smoke else args.cpu_repeat):
                        for target in setup.targets():  # alternating: load drifts alike
                            runs.setdefault(target[0], []).append(run_wrk(
                                setup, target, path, body, conns, seconds, args.work_dir))
                    for name, parts in runs.items():
                        row[name] = combine_runs(parts)
                    r, n = row["pdrouter"], row["nginx"]
                    row["ratio"] = (r["cpu_per_1k"] / n["cpu_per_1k"] if n["cpu_per_1k"]
                                    else float("inf"))
                    rows.append(row)
                    print("  cpu %-6s %-12s %-14s c%-3d pdrouter %6.1f us/req %6.0f req/s  "
                          "nginx %6.1f us/req %6.0f req/s  ratio %.2fx  errors %d/%d" % (
                              upstream, dialect, label, conns, r["cpu_per_1k"] * 1000, r["rps"],
                              n["cpu_per_1k"] * 1000, n["rps"], row["ratio"], r["errors"],
                              n["errors"]), flush=True)
                    # Smoke: the equal-rate run of the first dialect per kind of node only (quick).
                    paced_here = not args.smoke or dialect == wanted[0]
                    if args.equal_rate > 0 and r["rps"] and paced_here:
                        # Both proxies at the same request rate, a fraction of what pdrouter
                        # sustained just now: the same number of events per wakeup for both.
                        row["rate"] = args.equal_rate * r["rps"]
                        waits = {target[0]: paced_wait_ms(setup, target, path, body, conns, seconds,
                                                          args.work_dir, row["rate"])
                                 for target in setup.targets()}
                        paced = {}
                        for _ in range(1 if args.smoke else args.cpu_repeat):
                            for target in setup.targets():
                                paced.setdefault(target[0], []).append(run_wrk(
                                    setup, target, path, body, conns, seconds, args.work_dir,
                                    wait_ms=waits[target[0]]))
                        row["paced"] = {name: combine_runs(parts) for name, parts in paced.items()}
                        pr, pn = row["paced"]["pdrouter"], row["paced"]["nginx"]
                        row["paced_ratio"] = (pr["cpu_per_1k"] / pn["cpu_per_1k"]
                                              if pn["cpu_per_1k"] else float("inf"))
                        print("  cpu %-6s %-12s %-14s c%-3d at %6.0f req/s: pdrouter %6.1f us/req "
                              "%6.0f req/s  nginx %6.1f us/req %6.0f req/s  ratio %.2fx  "
                              "errors %d/%d" % (
                                  upstream, dialect, label, conns, row["rate"],
                                  pr["cpu_per_1k"] * 1000, pr["rps"], pn["cpu_per_1k"] * 1000,
                                  pn["rps"], row["paced_ratio"], pr["errors"], pn["errors"]),
                              flush=True)
                fivexx += setup.router_5xx()
                for child in setup.children():
                    if child.proc.poll() is not None:
                        raise RuntimeError("%s exited early:\n%s" % (child.name, child.log()))
            finally:
                stop_all()
    return rows, fivexx


def paced_wait_ms(setup, target, path, body, conns, seconds, work, rate):
    """The mean wait per request that brings `conns` connections of `target` to about `rate`
    requests/s: one calibration run (not counted) at conns / rate, then that minus the rest of
    the cycle it showed (latency and timer slack)."""
    cycle_ms = 1000.0 * conns / rate
    probe = run_wrk(setup, target, path, body, conns, seconds, work, wait_ms=cycle_ms)
    if not probe["rps"]:
        return cycle_ms
    rest_ms = 1000.0 * conns / probe["rps"] - cycle_ms
    return max(0.5, cycle_ms - max(0.0, rest_ms))


def combine_runs(parts):
    """Several wrk runs of one target as one: totals of requests, errors, CPU and time."""
    requests = sum(p["requests"] for p in parts)
    cpu = sum(p["cpu_s"] for p in parts)
    node_cpu = sum(p["sim_cpu_per_1k"] * p["requests"] / 1000 for p in parts if p["requests"])
    return {"requests": requests, "errors": sum(p["errors"] for p in parts), "cpu_s": cpu,
            "rps": requests / (sum(p["duration_us"] for p in parts) / 1e6),
            "cpu_per_1k": cpu / requests * 1000 if requests else None,
            "sim_cpu_per_1k": node_cpu / requests * 1000 if requests else None,
            "runs": len(parts)}


def geometric_mean(values):
    product = 1.0
    for v in values:
        product *= v
    return product ** (1.0 / len(values)) if values else float("nan")


def cpu_matrix_failures(rows):
    failures = []
    for row in rows:
        for name in ("pdrouter", "nginx"):
            for kind, r in (("", row[name]), (" equal rate", row.get("paced", {}).get(name))):
                if r is None:
                    continue
                where = "cpu%s %s %s %s c%d %s" % (kind, row["upstream"], row["dialect"],
                                                   row["workload"], row["connections"], name)
                if r["requests"] == 0:
                    failures.append(where + ": no requests completed")
                if r["errors"]:
                    failures.append("%s: %d errors" % (where, r["errors"]))
    return failures


CPU_HEADER = ("upstream nodes", "dialect (family)", "workload, conns",
              "pdrouter CPU µs per P/D request", "nginx CPU µs per proxied request",
              "pdrouter / nginx", "within {t}x", "req/s pdrouter / nginx",
              "node CPU µs per request pdrouter / nginx")


def cpu_matrix_table(rows, target):
    header = [h.format(t=target) for h in CPU_HEADER]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        r, n = row["pdrouter"], row["nginx"]
        lines.append("| " + " | ".join((
            "pdnode sims" if row["upstream"] == "sim" else "canned nginx",
            "%s (%s)" % (row["dialect"], row["family"]),
            "%s, %d" % (row["workload"], row["connections"]),
            "%.1f" % (r["cpu_per_1k"] * 1000), "%.1f" % (n["cpu_per_1k"] * 1000),
            "%.2fx" % row["ratio"], met(row["ratio"] <= target),
            "%.0f / %.0f" % (r["rps"], n["rps"]),
            "%.1f / %.1f" % (r["sim_cpu_per_1k"] * 1000, n["sim_cpu_per_1k"] * 1000))) + " |")
    return "\n".join(lines)


PACED_HEADER = ("upstream nodes", "dialect (family)", "workload, conns", "rate asked, req/s",
                "req/s reached pdrouter / nginx", "pdrouter CPU µs per P/D request",
                "nginx CPU µs per proxied request", "pdrouter / nginx", "target <= {t}x",
                "nginx at full speed: µs per request (req/s)")


def paced_table(rows, target):
    """The equal-rate rows (those measured with --equal-rate), or '' when there are none."""
    paced = [row for row in rows if "paced" in row]
    if not paced:
        return ""
    header = [h.format(t=target) for h in PACED_HEADER]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in paced:
        r, n = row["paced"]["pdrouter"], row["paced"]["nginx"]
        lines.append("| " + " | ".join((
            "pdnode sims" if row["upstream"] == "sim" else "canned nginx",
            "%s (%s)" % (row["dialect"], row["family"]),
            "%s, %d" % (row["workload"], row["connections"]), "%.0f" % row["rate"],
            "%.0f / %.0f" % (r["rps"], n["rps"]),
            "%.1f" % (r["cpu_per_1k"] * 1000), "%.1f" % (n["cpu_per_1k"] * 1000),
            "%.2fx" % row["paced_ratio"], met(row["paced_ratio"] <= target),
            "%.1f (%.0f)" % (row["nginx"]["cpu_per_1k"] * 1000, row["nginx"]["rps"]))) + " |")
    return "\n".join(lines)


PACED_SECTION = """\
### The target, judged at equal request rates

Both proxies are driven at the same request rate: {frac:.0f}% of the rate pdrouter sustained at full
speed in that row (wrk, the same connections, each waiting a random 0-2x mean time before each
request, the mean calibrated per proxy by one uncounted run so that wait plus latency gives that
rate; the rate reached is measured and shown). **Met in {met} of {total} rows**; geometric mean of the
ratios {gm_sim:.2f}x on the sims, {gm_canned:.2f}x on the canned nodes.

Why this is the comparison the target is judged on: an event-driven proxy's CPU per request
depends on its request rate (the busier it is, the more events share one wakeup of its loop and
the fewer times it sleeps and is woken), and at full speed the two proxies run at very different
rates. On the sims pdrouter's rate is capped by the sims moving real KV, not by pdrouter. The last
column shows the effect on nginx alone: its own CPU per proxied request is a geometric mean of
{n_full:.1f} µs at its full speed and {n_paced:.1f} µs at the equal rates, {n_factor:.2f}x more for the same
work. Comparing two proxies at the same rate is also what an operator pays: the CPU each burns for
the traffic it is given.

{table}"""

FULL_SPEED_SECTION = """\
### At full speed (reported; each proxy at its own rate)

Each proxy as fast as it goes. Within 2.0x in {met} of {total} rows; worst {worst:.2f}x, best
{best:.2f}x; geometric mean of the ratios {gm_sim:.2f}x on the sims, {gm_canned:.2f}x on the canned
nodes. The rates differ by up to {max_rate_factor:.0f}x (req/s column), so these ratios mix each
proxy's cost per request with the rate it ran at (see above); a single row is noisy when other
jobs load the machine, the means less so.

{table}"""


CPU_BEGIN = "<!-- BEGIN cpu-comparison (rewritten by run.sh; --cpu-only rewrites only this block) -->"
CPU_END = "<!-- END cpu-comparison -->"

CPU_SECTION = """\
{begin}
## CPU per request: pdrouter vs nginx, sim and canned-answer nodes ({date})

**Target: pdrouter's CPU per P/D request <= {target}x nginx's CPU per proxied request**, measured
in the same run against the same upstream nodes, at {conns} concurrent connections, both proxies
at the same request rate: {verdict}.

Each row is a fresh set of processes: pdrouter (`--workers {rw}`) in front of one prefill and one
decode node of that dialect, and nginx (`worker_processes {rw}`, the proxy config above) in front
of the same decode node. wrk (`-t{wt}`, {repeat} x {secs} s per target and row{warm})
alternates between the two; CPU is utime+stime of the proxy's processes from `/proc/PID/stat`,
summed over the runs, divided by the requests wrk completed in them. "node CPU" is the same for
the prefill and decode nodes' processes during pdrouter's and during nginx's runs.
Two kinds of nodes:
- **pdnode sims**: `pdnode sim` with zero simulated compute, registered over discovery; real KV
  moves between them over TCP (`--kv-backends tcp`), so in the concurrent dialects the decode
  waits for the prefill's push as real nodes do. The sims' own CPU shares the cores.
- **canned nginx**: one private nginx playing the prefill ({ph}), the decode ({dh}) and the Mooncake
  bootstrap server (`GET /query`), listed to pdrouter as static instances in a topology the
  driver writes; every answer is a fixed body (`return 200`: the prefill's JSON carries a NIXL
  `kv_transfer_params`, the decode answers a JSON completion or a 7-event SSE body;
  `bench/router/canned_nodes.py`). Nearly no CPU per request on the node side.

Dialect families: **serial** (NIXL: the decode leg is sent after the prefill's answer, with its
`kv_transfer_params`) and **concurrent** (MoRIIO WRITE, Mooncake: both legs at once; Mooncake
reads the prefill's bootstrap `/query` once per 30 s). nginx proxies one exchange per request.

{sections}

Source: {commit}; pdrouter/pdnode build type {build_type}. Load average at start {load}, at the
end {load_after}: CPU per request from the same run is comparable between pdrouter and nginx;
requests/s on these shared, loaded cores is not a capacity figure.
{end}"""


def paced_section(rows, args):
    paced = [row for row in rows if "paced" in row]
    if not paced:
        return ""
    n_full = geometric_mean([row["nginx"]["cpu_per_1k"] * 1000 for row in paced])
    n_paced = geometric_mean([row["paced"]["nginx"]["cpu_per_1k"] * 1000 for row in paced])
    return PACED_SECTION.format(
        frac=100 * args.equal_rate, table=paced_table(rows, args.target_cpu_ratio),
        met=sum(1 for row in paced if row["paced_ratio"] <= args.target_cpu_ratio),
        total=len(paced), n_full=n_full, n_paced=n_paced, n_factor=n_paced / n_full,
        gm_sim=geometric_mean([r["paced_ratio"] for r in paced if r["upstream"] == "sim"]),
        gm_canned=geometric_mean([r["paced_ratio"] for r in paced if r["upstream"] == "canned"]))


def cpu_verdict(rows, target):
    """(met, text): the CPU target judged on the equal-rate rows, every one within `target`; without
    them (--equal-rate 0, smoke) it cannot be judged."""
    paced = [row for row in rows if "paced" in row]
    if not paced:
        return None, "not judged (no equal-rate rows: run without --equal-rate 0)"
    n = sum(1 for row in paced if row["paced_ratio"] <= target)
    ok = n == len(paced)
    return ok, "**%s** (%d of %d rows within %.1fx, worst %.2fx)" % (
        met(ok), n, len(paced), target, max(row["paced_ratio"] for row in paced))


def cpu_section(rows, info, args, load_after, seconds, warm_seconds):
    ratios = [row["ratio"] for row in rows]
    conns = sorted({row["connections"] for row in rows})
    rates = [max(row["pdrouter"]["rps"], row["nginx"]["rps"]) /
             max(1.0, min(row["pdrouter"]["rps"], row["nginx"]["rps"])) for row in rows]
    full = FULL_SPEED_SECTION.format(
        met=sum(1 for x in ratios if x <= args.target_cpu_ratio), total=len(ratios),
        worst=max(ratios), best=min(ratios), max_rate_factor=max(rates),
        gm_sim=geometric_mean([r["ratio"] for r in rows if r["upstream"] == "sim"]),
        gm_canned=geometric_mean([r["ratio"] for r in rows if r["upstream"] == "canned"]),
        table=cpu_matrix_table(rows, args.target_cpu_ratio))
    sections = "\n\n".join(x for x in (paced_section(rows, args), full) if x)
    return CPU_SECTION.format(sections=sections,
        verdict=cpu_verdict(rows, args.target_cpu_ratio)[1],
        begin=CPU_BEGIN, end=CPU_END, date=info["date"], target=args.target_cpu_ratio,
        conns=" and ".join(str(c) for c in conns), rw=args.router_workers, wt=args.wrk_threads,
        repeat=1 if args.smoke else args.cpu_repeat,
        secs=seconds, warm=(", after %d s of warm-up per target" % warm_seconds) if warm_seconds else "",
        ph=canned_nodes.PREFILL_HOST, dh=canned_nodes.DECODE_HOST,
        commit=info["commit"], build_type=build_type(args.bin_dir), load=info["load"],
        load_after=load_after)


def replace_cpu_section(path, section):
    """Rewrites only the cpu-comparison block of an existing results file (--cpu-only)."""
    with open(path) as f:
        text = f.read()
    if CPU_BEGIN in text and CPU_END in text:
        head, rest = text.split(CPU_BEGIN, 1)
        text = head + section + rest.split(CPU_END, 1)[1]
    elif "\n## Targets\n" in text:
        head, rest = text.split("\n## Targets\n", 1)
        text = head + "\n" + section + "\n\n## Targets\n" + rest
    else:
        text += "\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)


# --------------------------------------------------------------------------------------------
# TLS and tracing: pdrouter's CPU per request with TLS on its client listener (on keep-alive
# connections, and with a handshake per request) and with tracing on, beside a plain pdrouter, all
# in front of the same canned NIXL nodes (no node CPU to blur the figures).

TLS_BEGIN = "<!-- BEGIN tls-tracing (rewritten by run.sh; --tls-only rewrites only this block) -->"
TLS_END = "<!-- END tls-tracing -->"
TLS_CONNECTIONS = 32

COLLECTOR_CONF = """\
# Private nginx for bench/router: an OTLP/HTTP collector stand-in that takes every export.
worker_processes 1;
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {dir}/tmp/body;
  client_max_body_size 64m;
  server {{
    listen {listen};
    location / {{ return 200 "{{}}"; }}
  }}
}}
"""


def bench_certificate(work):
    """A self-signed EC certificate for 127.0.0.1 (wrk does not verify it); (crt, key) paths."""
    crt, key = os.path.join(work, "bench-tls.crt"), os.path.join(work, "bench-tls.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return crt, key


class TlsTracingSetup:
    """Canned NIXL nodes (one private nginx), a collector stand-in (another), and four pdrouters
    on the same nodes: plain; TLS on the client listener; tracing every request to the
    collector; tracing configured but sampling none (sampling_ratio 0)."""

    VARIANTS = ("plain", "tls", "tracing", "tracing-ratio-0")

    def __init__(self, args):
        self.args = args
        hosts = (canned_nodes.PREFILL_HOST, canned_nodes.DECODE_HOST, canned_nodes.PREFILL_HOST,
                 "127.0.0.1")
        ports = dict(zip(("prefill", "decode", "bootstrap", "collector"), free_ports(hosts)))
        nodes, node_dir = start_nginx(args, "nodes-tls", canned_nodes.nginx_conf(
            os.path.join(args.work_dir, "nodes-tls"), ports))
        collector_addr = "127.0.0.1:%d" % ports["collector"]
        collector, _ = start_nginx(args, "collector-tls", COLLECTOR_CONF.format(
            dir=os.path.join(args.work_dir, "collector-tls"), listen=collector_addr))
        self.nginxes = [nodes, collector]
        wait_up([("%s:%d" % (canned_nodes.DECODE_HOST, ports["decode"]), "/health")], self.nginxes, nodes)
        crt, key = bench_certificate(args.work_dir)
        base = canned_nodes.topology_yaml("nixl", ports)
        tracing = ('tracing:\n  endpoint: "http://%s/v1/traces"\n  sampling_ratio: %s\n'
                   "  max_queue_spans: 1000000\n  batch_ms: 200\n  max_batch_spans: 4096\n")
        extra = {"plain": "",
                 "tls": 'listeners:\n  tls:\n    cert_file: "%s"\n    key_file: "%s"\n' % (crt, key),
                 "tracing": tracing % (collector_addr, 1),
                 "tracing-ratio-0": tracing % (collector_addr, 0)}
        self.routers, self.addrs = {}, {}
        for name in self.VARIANTS:
            topology = os.path.join(node_dir, "topology-%s.yaml" % name)
            with open(topology, "w") as f:
                f.write(base + extra[name])
            self.routers[name], self.addrs[name], _ = start_router(args, "tls-" + name,
                                                                   ["--config", topology])
        for name in self.VARIANTS:
            if name != "tls":
                wait_up([(self.addrs[name], "/ready")], self.nginxes, self.routers[name])
        probe = subprocess.run(["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}",
                                "https://%s/ready" % self.addrs["tls"]], capture_output=True, text=True,
                               timeout=30)
        if probe.stdout != "200":
            raise RuntimeError("pdrouter with TLS: /ready answered %r\n%s" % (probe.stdout,
                                                                             self.routers["tls"].log()))
        check_answers([(n, self.addrs[n]) for n in self.VARIANTS if n != "tls"])

    def target(self, name):
        return (name, self.addrs[name])

    def scheme(self, name):
        return "https" if name == "tls" else "http"

    def proxy_pids(self, name):
        return [self.routers[name].pid]

    def upstream_pids(self):
        return [self.nginxes[0].pid]

    def children(self):
        return list(self.routers.values()) + self.nginxes

    def router_5xx(self):
        return sum(router_5xx(self.addrs[n]) for n in self.VARIANTS if n != "tls")


def tls_workloads(args):
    """(label, path, body, close, variants) of each row; smoke: the first two."""
    rows = [("completions, keep-alive", "/v1/completions", COMPLETION, False, TlsTracingSetup.VARIANTS),
            ("completions, a new connection per request", "/v1/completions", COMPLETION, True,
             ("plain", "tls")),
            ("streaming chat, keep-alive", "/v1/chat/completions", CHAT_STREAM, False, ("plain", "tls"))]
    return rows[:2] if args.smoke else rows


def run_tls_tracing(args, seconds):
    """Rows of pdrouter's CPU per request per variant; the runs alternate between variants."""
    setup = TlsTracingSetup(args)
    rows, failures = [], []
    try:
        for label, path, body, close, variants in tls_workloads(args):
            runs = {}
            for _ in range(1 if args.smoke else args.cpu_repeat):
                for name in variants:
                    runs.setdefault(name, []).append(run_wrk(
                        setup, setup.target(name), path, body, TLS_CONNECTIONS, seconds,
                        args.work_dir, scheme=setup.scheme(name), close=close))
            row = {"workload": label, "close": close,
                   "variants": {name: combine_runs(parts) for name, parts in runs.items()}}
            rows.append(row)
            print("  tls/tracing %-42s %s" % (label, "  ".join(
                "%s %.1f us/req %.0f req/s err %d" % (name, r["cpu_per_1k"] * 1000, r["rps"], r["errors"])
                for name, r in row["variants"].items())), flush=True)
            for name, r in row["variants"].items():
                if not r["requests"]:
                    failures.append("tls/tracing %s %s: no requests completed" % (label, name))
                if r["errors"]:
                    failures.append("tls/tracing %s %s: %d errors" % (label, name, r["errors"]))
        fivexx = setup.router_5xx()
        if fivexx:
            failures.append("tls/tracing: pdrouter answered %d 5xx (/metrics)" % fivexx)
        for child in setup.children():
            if child.proc.poll() is not None:
                failures.append("%s exited early:\n%s" % (child.name, child.log()))
    finally:
        stop_all()
    return rows, failures


TLS_SECTION = """\
{begin}
## TLS and tracing: pdrouter's CPU per request ({date})

{label}pdrouter (`--workers {rw}`) in front of canned NIXL nodes (one private nginx, as in the CPU
comparison), four processes side by side: **plain** (the default), **tls** (`listeners.tls`, an
EC P-256 certificate; wrk over https: TLS 1.3, AES-GCM), **tracing** (`tracing.endpoint` to an
nginx that takes every export, `sampling_ratio: 1`: every request records and exports its five
spans) and **tracing-ratio-0** (tracing configured, nothing sampled: what requests pay with it
on but not chosen). wrk `-c{conns}` (`-t{wt}`), {repeat} x {secs} s per variant and row, the
variants alternating; CPU is utime+stime of that pdrouter process per completed request (µs),
so the exporter thread's work is in the tracing figure. "a new connection per request": every
request asks `Connection: close`, so with https each pays a full handshake (no session
resumption by wrk). With tracing off (no `tracing:` section) no tracing code runs at all:
the plain column.

| workload | variant | pdrouter CPU per request | vs plain | req/s |
| --- | --- | --- | --- | --- |
{table}

Source: {commit}; build type {build_type}. Load average at start {load}, at the end {load_after}
(a shared, loaded machine: CPU per request is comparable within a row; req/s is not a capacity
figure).
{end}"""


def tls_section(rows, info, args, load_after, seconds, label=""):
    lines = []
    for row in rows:
        plain = row["variants"]["plain"]
        for name, r in row["variants"].items():
            vs = "-" if name == "plain" else "%.2fx (%+.1f µs)" % (
                r["cpu_per_1k"] / plain["cpu_per_1k"], (r["cpu_per_1k"] - plain["cpu_per_1k"]) * 1000)
            lines.append("| %s | %s | %.1f µs | %s | %.0f |" % (
                row["workload"], name, r["cpu_per_1k"] * 1000, vs, r["rps"]))
    return TLS_SECTION.format(
        begin=TLS_BEGIN, end=TLS_END, date=info["date"], label=label, rw=args.router_workers,
        conns=TLS_CONNECTIONS, wt=args.wrk_threads, repeat=1 if args.smoke else args.cpu_repeat,
        secs=seconds, table="\n".join(lines), commit=info["commit"], build_type=build_type(args.bin_dir),
        load=info["load"], load_after=load_after)


def replace_block(path, begin, end, section):
    """Rewrites the block between `begin` and `end` of an existing results file (appended before
    the hand-written part when it has none yet)."""
    with open(path) as f:
        text = f.read()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    elif KEEP_MARKER in text:
        head, rest = text.split(KEEP_MARKER, 1)
        text = head + section + "\n\n" + KEEP_MARKER + rest
    else:
        text += "\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)


# --------------------------------------------------------------------------------------------
# Report


def us(value):
    return "%.0f us" % value


def build_rows(res, args):
    d, r, n = res["c100"]["direct"], res["c100"]["pdrouter"], res["c100"]["nginx"]
    rows = []
    c = args.connections
    rows.append(("requests/s, completions, %d conns" % c, "%.0f" % d["rps"], "%.0f" % r["rps"],
                 "%.0f" % n["rps"], "%.2fx" % (r["rps"] / d["rps"]), "%.2fx" % (n["rps"] / d["rps"]),
                 "direct = ceiling"))
    for key, label, target in (("p50", "p50", args.target_p50), ("p99", "p99", args.target_p99)):
        rows.append(("%s latency, completions, %d conns" % (label, c), us(d[key]), us(r[key]),
                     us(n[key]), "%+.0f us" % (r[key] - d[key]), "%+.0f us" % (n[key] - d[key]),
                     "added <= %d us: %s" % (target, met(r[key] - d[key] <= target))))
    for key in ("p50", "p99"):
        d1, r1, n1 = (res["c1"][t] for t in ("direct", "pdrouter", "nginx"))
        rows.append(("%s latency, completions, 1 conn" % key, us(d1[key]), us(r1[key]), us(n1[key]),
                     "%+.0f us" % (r1[key] - d1[key]), "%+.0f us" % (n1[key] - d1[key]), "-"))
    sd, sr, sn = (res["stream"][t] for t in ("direct", "pdrouter", "nginx"))
    rows.append(("requests/s, streaming chat, %d conns" % c, "%.0f" % sd["rps"], "%.0f" % sr["rps"],
                 "%.0f" % sn["rps"], "%.2fx" % (sr["rps"] / sd["rps"]),
                 "%.2fx" % (sn["rps"] / sd["rps"]), "-"))
    for key in ("p50", "p99"):
        rows.append(("%s whole stream, streaming chat, %d conns" % (key, c), us(sd[key]),
                     us(sr[key]), us(sn[key]), "%+.0f us" % (sr[key] - sd[key]),
                     "%+.0f us" % (sn[key] - sd[key]), "-"))
    td, tr, tn = (res["ttft"][t] for t in ("direct", "pdrouter", "nginx"))
    for key in ("p50", "p99"):
        rows.append(("%s TTFT, streaming chat, %d conns (python client)" % (key, args.ttft_connections),
                     us(td[key]), us(tr[key]), us(tn[key]), "%+.0f us" % (tr[key] - td[key]),
                     "%+.0f us" % (tn[key] - td[key]), "-"))
    ratio = r["cpu_per_1k"] / n["cpu_per_1k"] if n["cpu_per_1k"] else float("inf")
    rows.append(("proxy CPU s per 1,000 requests, completions, %d conns" % c, "-",
                 "%.3f" % r["cpu_per_1k"], "%.3f" % n["cpu_per_1k"], "-", "-",
                 "pdrouter/nginx %.2fx <= %.1fx: %s" % (ratio, args.target_cpu_ratio,
                                                        met(ratio <= args.target_cpu_ratio))))
    ratio_s = sr["cpu_per_1k"] / sn["cpu_per_1k"] if sn["cpu_per_1k"] else float("inf")
    rows.append(("proxy CPU s per 1,000 requests, streaming chat, %d conns" % c, "-",
                 "%.3f" % sr["cpu_per_1k"], "%.3f" % sn["cpu_per_1k"], "-", "-",
                 "pdrouter/nginx %.2fx" % ratio_s))
    def opens(x):
        return "n/a" if x["upstream_opens_per_1k"] is None else "%.0f" % x["upstream_opens_per_1k"]

    rn1, nn1 = res["c1"]["pdrouter"], res["c1"]["nginx"]
    rows.append(("new upstream TCP connections per 1,000 requests: completions %d conns / "
                 "1 conn / streaming %d conns" % (c, c), "-",
                 "%s / %s / %s" % (opens(r), opens(rn1), opens(sr)),
                 "%s / %s / %s" % (opens(n), opens(nn1), opens(sn)), "-", "-",
                 "2,000 = every leg on a new connection"))
    rows.append(("sim CPU s per 1,000 requests (prefill+decode), completions", "%.3f" % d["sim_cpu_per_1k"],
                 "%.3f" % r["sim_cpu_per_1k"], "%.3f" % n["sim_cpu_per_1k"], "-", "-", "-"))
    if "variant" in res:
        vd, vr, vn = (res["variant"][t] for t in ("direct", "pdrouter", "nginx"))
        vratio = vr["cpu_per_1k"] / vn["cpu_per_1k"] if vn["cpu_per_1k"] else float("inf")
        label = "decode sim %d us/token:" % args.variant_decode_us
        rows.append(("%s requests/s, completions, %d conns" % (label, c), "%.0f" % vd["rps"],
                     "%.0f" % vr["rps"], "%.0f" % vn["rps"], "%.2fx" % (vr["rps"] / vd["rps"]),
                     "%.2fx" % (vn["rps"] / vd["rps"]), "-"))
        for key in ("p50", "p99"):
            rows.append(("%s %s latency, completions, %d conns" % (label, key, c), us(vd[key]),
                         us(vr[key]), us(vn[key]), "%+.0f us" % (vr[key] - vd[key]),
                         "%+.0f us" % (vn[key] - vd[key]), "-"))
        rows.append(("%s proxy CPU s per 1,000 requests" % label, "-", "%.3f" % vr["cpu_per_1k"],
                     "%.3f" % vn["cpu_per_1k"], "-", "-", "pdrouter/nginx %.2fx" % vratio))
        rows.append(("%s new upstream TCP connections per 1,000 requests" % label, "-",
                     opens(vr), opens(vn), "-", "-", "-"))
    groups = [g for g in ("c100", "c1", "stream", "ttft", "variant") if g in res]
    total = sum(x["requests"] for group in groups for x in res[group].values())
    errors = sum(x["errors"] for group in groups for x in res[group].values())
    rows.append(("requests / errors, all runs", "-", "-", "-", "-", "-", "%d / %d" % (total, errors)))
    verdict = {"p50": r["p50"] - d["p50"] <= args.target_p50,
               "p99": r["p99"] - d["p99"] <= args.target_p99,
               "cpu": ratio <= args.target_cpu_ratio, "ratio": ratio}
    return rows, verdict


def git_commit():
    try:
        out = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %s"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return "git HEAD `%s`%s at the start of the run" % (
            out.stdout.strip()[:70], " (plus uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def build_type(bin_dir):
    try:
        with open(os.path.join(bin_dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    return line.split("=", 1)[1].strip() or "(none)"
    except OSError:
        pass
    return "unknown"


def met(ok):
    return "MET" if ok else "MISSED"


HEADER = ("measurement", "(a) direct", "(b) pdrouter", "(c) nginx", "(b) vs (a)", "(c) vs (a)",
          "target")


def markdown_table(rows):
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(rows):
    widths = [max(len(str(row[i])) for row in rows + [HEADER]) for i in range(len(HEADER))]
    out = []
    for row in [HEADER] + rows:
        out.append("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)))
    return "\n".join(out)


def write_results(path, rows, verdict, info, args, load_after, durations, cpu_text, cpu_rows):
    kept = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
        if KEEP_MARKER in text:
            kept = text.split(KEEP_MARKER, 1)[1]
    c = args.connections
    md = RESULTS_TEMPLATE.format(
        c=c, rw=args.router_workers, sw=args.sim_workers, wt=args.wrk_threads, d=durations["c100"],
        d1=durations["c1"], dt=durations["ttft"], tc=args.ttft_connections,
        nproc=info["nproc"], cpu=info["cpu"], kernel=info["kernel"], date=info["date"],
        load=info["load"], load_after=load_after, table=markdown_table(rows),
        p50=args.target_p50, p99=args.target_p99, ratio_target=args.target_cpu_ratio,
        v_p50=met(verdict["p50"]), v_p99=met(verdict["p99"]),
        cpu_verdict=cpu_verdict(cpu_rows, args.target_cpu_ratio)[1],
        ratio=verdict["ratio"], marker=KEEP_MARKER, vus=args.variant_decode_us,
        build_type=build_type(args.bin_dir), commit=info["commit"], cpu_section=cpu_text)
    with open(path, "w") as f:
        f.write(md + kept)


RESULTS_TEMPLATE = """\
# bench/router: what pdrouter adds per request

`bench/router/run.sh` (driver: `router_bench.py`, Python standard library + wrk + nginx) measures
pdrouter's proxy path on loopback against `pdnode sim` nodes that do no simulated work
(`--prefill-us-per-token 0 --decode-us-per-token 0`, MoRIIO WRITE), so what is left is HTTP
plumbing. Three targets, the same decode sim behind each:

- **(a) direct**: wrk → decode sim. The ceiling: requests/s pdrouter cannot exceed, and the
  latency baseline.
- **(b) pdrouter**: wrk → pdrouter (`--workers {rw}`) → prefill sim (the `max_tokens=1` leg,
  answered in full) → decode sim (the client's request with `kv_transfer_params`). One P/D request
  is two upstream HTTP exchanges.
- **(c) nginx**: wrk → nginx 1.22 as a plain reverse proxy (`worker_processes {rw}`, upstream
  `keepalive 256`, `proxy_http_version 1.1`, `proxy_buffering off`, access log off) → decode sim.
  One upstream exchange. nginx runs with a private config, pid file and logs in a temp directory
  (`nginx -e … -p DIR -c CONF`, `daemon off`), never as the system service, and is stopped on exit.

The section "CPU per request: pdrouter vs nginx" further down repeats the CPU comparison per
dialect family (serial NIXL; concurrent MoRIIO WRITE and Mooncake) against two kinds of nodes:
the sims, and canned-answer nginx nodes that cost nearly nothing per request.
`bench/router/count_syscalls.sh` counts pdrouter's syscalls and allocations per request (the
section at the end).

## What is measured, and how

1. **Throughput and latency at {c} connections**: `wrk -t{wt} -c{c} -d{d}s --latency` with a Lua
   script POSTing a non-streaming `/v1/completions` (`max_tokens` 4). requests/s, p50 and p99 from
   wrk's histogram (printed by the script's `done()`). **Added latency = (b) − (a)**, with
   nginx's (c) − (a) beside it.
2. **The same at 1 connection** ({d1} s each): the unloaded per-request cost, without queueing.
3. **Streaming**: the same wrk run with a streaming `/v1/chat/completions` (`stream: true`,
   `max_tokens` 4); wrk times the whole stream.
4. **TTFT**: wrk cannot see the first event, so an asyncio client (raw sockets, keep-alive,
   chunked decoding) runs {tc} connections for {dt} s each, timing from writing the request to the
   first `data:` event carrying generated text. Each stream must end in `data: [DONE]` with a
   `finish_reason` and no error event. The Python client adds its own tens of microseconds
   equally to every target.
5. **CPU per 1,000 requests**: utime+stime from `/proc/PID/stat` before and after each wrk run
   (pdrouter: its process, all threads; nginx: master + workers), divided by the requests wrk
   completed. The ratio compares pdrouter per **P/D request** (two upstream legs) with nginx per
   **proxied request** (one).
6. **Variant** (full runs only): item 1 again on a fresh set of processes whose decode sim paces
   tokens ({vus} µs per token, prefill still 0), so the prefill's answer normally arrives before
   the decode's, as with real MoRIIO WRITE nodes where the decode waits for the pushed KV. With
   zero-latency sims the decode often answers first, and pdrouter then finishes the prefill
   leg after the client's answer (see the notes below).
7. **New upstream TCP connections per 1,000 requests**: the driver re-executes itself in a
   private network namespace (`unshare -n`, loopback only; skipped without root, then "n/a"), so
   `ActiveOpens` in `/proc/net/snmp` counts only the benchmark's connects; per run, minus wrk's
   own connections (nginx). pdrouter's figure is its own count of legs answered on a new
   connection (`pdrouter_upstream_legs_total{{connection="new"}}`), since the sims' KV transfers
   open connections too. 0 means every upstream leg reused a pooled connection; 2,000 (pdrouter)
   or 1,000 (nginx) means none did.

Every run must finish with zero socket errors, zero non-2xx answers and zero pdrouter 5xx.
`--smoke` (the CTest `bench.router_proxy`, label `bench`) runs each measurement ~2 s and checks
only that (non-zero requests, zero errors). Targets are reported, not enforced.

## Reproduce

```bash
cmake -S . -B build-rb -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-rb pdrouter pdnode
bench/router/run.sh --bin-dir build-rb            # ~13 min, rewrites this file
bench/router/run.sh --bin-dir build-rb --cpu-only # ~10 min, rewrites only the CPU comparison
bench/router/run.sh --bin-dir build-rb --cpu-only --equal-rate 0  # ~4 min, without equal rates
bench/router/run.sh --bin-dir build-rb --tls-only # ~2 min, rewrites only the TLS and tracing block
bench/router/run.sh --bin-dir build-rb --smoke    # ~1 min, checks only
bench/router/run.sh --help                        # durations, connections, workers
bench/router/count_syscalls.sh --bin-dir build-rb --column after   # syscalls/allocations
bench/router/profile_instructions.py --bin-dir build-rb             # user-space instructions per request, by function (callgrind)
```

## Machine

{nproc} vCPU, `{cpu}`, {kernel}, Debian 12, g++ 12, pdrouter/pdnode build type {build_type},
nginx 1.22.1, wrk 4.1.0.
Everything (wrk, pdrouter, both sims, nginx) shares these {nproc} cores, so each target competes
with its own load generator; absolute numbers are far below what a separate client machine would
show, and the comparison between targets is what matters. Load average at start {load}, at the
end {load_after}: other jobs were running on this machine, so expect run-to-run noise.

## Results ({date})

pdrouter `--workers {rw}`, nginx `worker_processes {rw}`, sims `--workers {sw}` each, wrk
`-t{wt}`. Source: {commit}.

{table}

## Targets

- p50 added latency at {c} connections ≤ {p50} µs: **{v_p50}**
- p99 added latency at {c} connections ≤ {p99} µs: **{v_p99}**
- pdrouter CPU per P/D request ≤ {ratio_target}× nginx CPU per proxied request, at equal request
  rates: {cpu_verdict} (the CPU section below; at full speed in the table above, each proxy at
  its own rate: {ratio:.2f}×)

At {c} connections on a closed loop, latency is mostly queueing (p50 ≈ connections ÷
requests/s), so the "added latency" there is dominated by the throughput each target reaches on
cores it shares with wrk and the sims; the 1-connection rows show the unloaded cost per request.

{cpu_section}

{marker}
"""


# --------------------------------------------------------------------------------------------


def run_targets(args, durations, failures):
    """The direct / pdrouter / nginx measurements against the MoRIIO WRITE sims (the first table);
    appends to `failures`, returns the results by measurement."""
    setup = Setup(args)
    res = {"c100": {}, "c1": {}, "stream": {}, "ttft": {}}
    for target in setup.targets():
        name = target[0]
        if durations["warm"]:
            run_wrk(setup, target, "/v1/completions", COMPLETION, args.connections,
                    durations["warm"], args.work_dir)
        for key, path, body, conns, secs in (
                ("c100", "/v1/completions", COMPLETION, args.connections, durations["c100"]),
                ("c1", "/v1/completions", COMPLETION, 1, durations["c1"]),
                ("stream", "/v1/chat/completions", CHAT_STREAM, args.connections,
                 durations["c100"])):
            r = run_wrk(setup, target, path, body, conns, secs, args.work_dir)
            res[key][name] = r
            print("  %-8s %-6s %8.0f req/s  p50 %6.0f us  p99 %6.0f us  errors %d%s" % (
                name, key, r["rps"], r["p50"], r["p99"], r["errors"],
                ("" if r["cpu_per_1k"] is None else "  cpu %.3f s/1k" % r["cpu_per_1k"]) +
                ("" if r["upstream_opens_per_1k"] is None else
                 "  upstream connects %.0f/1k" % r["upstream_opens_per_1k"])),
                flush=True)
        r = run_ttft(target[1], args.ttft_connections, durations["ttft"])
        res["ttft"][name] = r
        print("  %-8s ttft   %8d reqs   p50 %6.0f us  p99 %6.0f us  errors %d" % (
            name, r["requests"], r["p50"], r["p99"], r["errors"]), flush=True)
    fivexx = setup.router_5xx()
    for child in setup.children():
        if child.proc.poll() is not None:
            failures.append("%s exited early:\n%s" % (child.name, child.log()))
    if not args.smoke and args.variant_decode_us:
        # Variant: the decode sim paces tokens, so the prefill's answer always arrives before
        # the decode's and pdrouter can pool the prefill connection (see RESULTS.md).
        stop_all()
        setup = Setup(args, decode_us=args.variant_decode_us, tag="nginx-variant")
        res["variant"] = {}
        for target in setup.targets():
            r = run_wrk(setup, target, "/v1/completions", COMPLETION, args.connections,
                        durations["c100"], args.work_dir)
            res["variant"][target[0]] = r
            print("  %-8s var    %8.0f req/s  p50 %6.0f us  p99 %6.0f us  errors %d%s%s" % (
                target[0], r["rps"], r["p50"], r["p99"], r["errors"],
                "" if r["cpu_per_1k"] is None else "  cpu %.3f s/1k" % r["cpu_per_1k"],
                "" if r["upstream_opens_per_1k"] is None else
                "  upstream connects %.0f/1k" % r["upstream_opens_per_1k"]), flush=True)
        fivexx += setup.router_5xx()
    for group, by_target in res.items():
        for name, r in by_target.items():
            if r["requests"] == 0:
                failures.append("%s %s: no requests completed" % (name, group))
            if r["errors"]:
                failures.append("%s %s: %d errors" % (name, group, r["errors"]))
    if fivexx:
        failures.append("pdrouter answered %d 5xx (/metrics)" % fivexx)
    for child in setup.children():
        if child.proc.poll() is not None:
            failures.append("%s exited early:\n%s" % (child.name, child.log()))
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", required=True, help="temp directory (run.sh makes it)")
    parser.add_argument("--bin-dir", default=None,
                        help="build directory with router/pdrouter and node/pdnode "
                             "(default $PDR_BUILD_DIR, else build-rb, else build/release)")
    parser.add_argument("--smoke", action="store_true", help="~2 s per measurement, checks only")
    parser.add_argument("--duration", type=int, default=10, help="seconds per loaded run")
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--ttft-connections", type=int, default=4)
    parser.add_argument("--router-workers", type=int, default=1,
                        help="pdrouter --workers and nginx worker_processes (default 1)")
    parser.add_argument("--sim-workers", type=int, default=1)
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--variant-decode-us", type=int, default=500,
                        help="full runs: repeat the completions run with the decode sim at this "
                             "many us per token (0 = skip)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="run only the CPU comparison (sim and canned nodes x dialects) and "
                             "rewrite only its block of the results file")
    parser.add_argument("--tls-only", action="store_true",
                        help="run only the TLS and tracing rows and rewrite only their block of "
                             "the results file")
    parser.add_argument("--tls-label", default="",
                        help="a line put before the TLS and tracing block (e.g. 'Short run: ...')")
    parser.add_argument("--cpu-connections", default="32,100",
                        help="CPU comparison: concurrent connections, comma-separated")
    parser.add_argument("--cpu-dialects", default=",".join(d[0] for d in DIALECTS),
                        help="CPU comparison: dialects, comma-separated (default all)")
    parser.add_argument("--cpu-duration", type=int, default=3,
                        help="CPU comparison: seconds per run (smoke: 1)")
    parser.add_argument("--cpu-repeat", type=int, default=2,
                        help="CPU comparison: runs per target and row, alternating pdrouter and "
                             "nginx, summed (smoke: 1)")
    parser.add_argument("--equal-rate", type=float, default=0.7,
                        help="CPU comparison: also run pdrouter and nginx at the same request "
                             "rate, this fraction of the rate pdrouter sustained in the row "
                             "(0 = skip)")
    parser.add_argument("--no-netns", action="store_true",
                        help="do not re-run inside a private network namespace")
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"),
                        help="markdown file to write (full runs only; '' = none)")
    parser.add_argument("--json", default="", help="also write raw results here")
    parser.add_argument("--target-p50", type=int, default=50)
    parser.add_argument("--target-p99", type=int, default=250)
    parser.add_argument("--target-cpu-ratio", type=float, default=2.0)
    args = parser.parse_args()
    if args.bin_dir is None:
        candidates = [os.environ.get("PDR_BUILD_DIR", ""), os.path.join(ROOT, "build-rb"),
                      os.path.join(ROOT, "build", "release")]
        args.bin_dir = next((c for c in candidates
                             if c and os.path.exists(os.path.join(c, "router", "pdrouter"))),
                            candidates[1])
    args.bin_dir = os.path.abspath(args.bin_dir)
    if os.environ.get("PDR_BENCH_NETNS") is None and not args.no_netns:
        # A private network namespace (loopback only): /proc/net/snmp then counts only this
        # benchmark's TCP connects, and other loopback traffic on the machine stays out.
        probe = subprocess.run(["unshare", "-n", "--", "ip", "link", "set", "lo", "up"],
                               capture_output=True)
        if probe.returncode == 0:
            argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
            env = dict(os.environ, PDR_BENCH_NETNS="1")
            script = 'ip link set lo up && exec "$@"'
            os.execvpe("unshare", ["unshare", "-n", "--", "sh", "-c", script, "sh", *argv,
                                   "--bin-dir", args.bin_dir], env)
        print("router bench: no private network namespace (needs root: unshare -n); "
              "upstream connection counts are not reported", flush=True)
        os.environ["PDR_BENCH_NETNS"] = "0"
    durations = ({"c100": 2, "c1": 1, "ttft": 1.5, "warm": 0} if args.smoke else
                 {"c100": args.duration, "c1": max(2, args.duration // 2),
                  "ttft": max(2, args.duration // 2), "warm": 2})

    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_signal)
    info = machine()
    info["commit"] = git_commit()
    pdrouter = os.path.join(args.bin_dir, "router", "pdrouter")
    if os.path.exists(pdrouter):
        info["commit"] += "; pdrouter binary built %s" % datetime.datetime.fromtimestamp(
            os.path.getmtime(pdrouter), datetime.timezone.utc).strftime("%H:%M UTC")
    print("router bench: %s, %d cores, load %s, bin %s%s" % (info["cpu"], info["nproc"], info["load"],
                                                             args.bin_dir, " (smoke)" if args.smoke else ""),
          flush=True)
    failures = []
    cpu_seconds_run = 1 if args.smoke else args.cpu_duration
    cpu_warm = 0 if args.smoke else 1
    try:
        if args.tls_only:
            tls_rows, tls_failures = run_tls_tracing(args, cpu_seconds_run)
            failures += tls_failures
            load_after = " ".join(open("/proc/loadavg").read().split()[:3])
            text = tls_section(tls_rows, info, args, load_after, cpu_seconds_run,
                               label=(args.tls_label + "\n\n") if args.tls_label else "")
            print(text)
            if args.results and not failures and not args.smoke:
                replace_block(args.results, TLS_BEGIN, TLS_END, text)
                print("wrote " + args.results)
            return finish(failures, args.smoke)
        res = {} if args.cpu_only else run_targets(args, durations, failures)
        tls_rows = []
        if not args.cpu_only:
            tls_rows, tls_failures = run_tls_tracing(args, cpu_seconds_run)
            failures += tls_failures
        cpu_rows, cpu_5xx = run_cpu_matrix(args, cpu_seconds_run, cpu_warm)
        failures += cpu_matrix_failures(cpu_rows)
        if cpu_5xx:
            failures.append("pdrouter answered %d 5xx in the CPU comparison (/metrics)" % cpu_5xx)
        load_after = " ".join(open("/proc/loadavg").read().split()[:3])
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": info, "results": res, "cpu_comparison": cpu_rows}, f,
                          indent=1)
        cpu_text = cpu_section(cpu_rows, info, args, load_after, cpu_seconds_run, cpu_warm)
        if not args.smoke:
            if not args.cpu_only:
                rows, verdict = build_rows(res, args)
                print()
                print(text_table(rows))
                print("\ntargets: p50 added %s, p99 added %s, CPU ratio at full speed %.2fx; "
                      "load %s -> %s" % (met(verdict["p50"]), met(verdict["p99"]), verdict["ratio"],
                                         info["load"], load_after))
            print()
            print(cpu_matrix_table(cpu_rows, args.target_cpu_ratio))
            if paced_table(cpu_rows, args.target_cpu_ratio):
                print()
                print(paced_table(cpu_rows, args.target_cpu_ratio))
            print("\nCPU target at equal request rates: " +
                  cpu_verdict(cpu_rows, args.target_cpu_ratio)[1].replace("**", ""))
            if args.results and not failures:
                if args.cpu_only:
                    replace_cpu_section(args.results, cpu_text)
                else:
                    write_results(args.results, rows, verdict, info, args, load_after, durations,
                                  cpu_text, cpu_rows)
                    replace_block(args.results, TLS_BEGIN, TLS_END,
                                  tls_section(tls_rows, info, args, load_after, cpu_seconds_run))
                print("wrote " + args.results)
    except KeyboardInterrupt as e:
        failures.append("interrupted (%s)" % e)
    except Exception as e:
        failures.append("%s: %s" % (type(e).__name__, e))
        for child in _children:
            if child.proc.poll() is not None:
                failures.append("%s exited with %d:\n%s" % (child.name, child.proc.returncode,
                                                            child.log()))
    finally:
        stop_all()
    return finish(failures, args.smoke)


def finish(failures, smoke=False):
    if failures:
        print("router bench: FAILED\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("router bench: %s passed" % ("smoke" if smoke else "run"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
