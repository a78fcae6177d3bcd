#!/usr/bin/python3
"""etcd write rate and cross-replica visibility of the shared registry (registry.backend: etcd).

Starts a real etcd (Debian's etcd-server) on bind-probed loopback ports and two pdrouter replicas
A and B sharing it, then N simulated nodes (one ZMQ DEALER per node up to 500, then shared, pdrouter-format registrations
with the discovery auth token, addresses 127.2.x.y:8000) that register with A and heartbeat every
--interval seconds, spread evenly. Measures:
  * registration-to-visible on B: for each node, from its first registration sent to A until B's
    /status lists it (B polled every 20 ms): p50 / p99 / max;
  * etcd writes/s in steady state: etcd's own counters (etcd_mvcc_put_total +
    etcd_mvcc_delete_total from etcd's /metrics) over --window seconds of heartbeats, next to the
    heartbeat rate the nodes send.
Usage: bench/etcd/write_rate.py --bin-dir BUILD [--nodes 1000] [--interval 3] [--window 15]
"""
import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import msgpack
import zmq

TOKEN = "bench-discovery-token"


def probe_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def start_etcd(workdir):
    for _ in range(5):
        client, peer = probe_port(), probe_port()
        c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        log = open(os.path.join(workdir, "etcd.log"), "a")
        proc = subprocess.Popen(["/usr/bin/etcd", "--data-dir", os.path.join(workdir, "etcd"),
                                 "--listen-client-urls", c, "--advertise-client-urls", c,
                                 "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                                 "--initial-cluster", "default=" + p, "--log-level", "warn"],
                                stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if b"true" in http_get(c + "/health", 0.5):
                    return proc, client
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    sys.exit("etcd did not start")


def start_router(bin_dir, workdir, name, etcd_port, nodes):
    path = os.path.join(workdir, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""
connectors:
  default: nixl
discovery:
  ttl_ms: 10000
  max_instances: {nodes + 100}
  auth_token_env: PDR_BENCH_TOKEN
registry:
  backend: etcd
  etcd_endpoints: ["127.0.0.1:{etcd_port}"]
  replica_id: "{name}"
""")
    env = dict(os.environ, PDR_BENCH_TOKEN=TOKEN)
    proc = subprocess.Popen([os.path.join(bin_dir, "router", "pdrouter"), "--config", path, "--http",
                             "127.0.0.1:0", "--discovery", "tcp://127.0.0.1:0", "--workers", "1",
                             "--log-level", "warn"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, text=True)
    line = proc.stdout.readline()
    parts = dict(p.split("=", 1) for p in line.split() if "=" in p)
    return proc, parts["http"], parts["discovery"]


def etcd_writes(port):
    total = 0.0
    for line in http_get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line.startswith(("etcd_mvcc_put_total ", "etcd_mvcc_delete_total ")):
            total += float(line.split()[1])
    return total


def visible(http):
    doc = json.loads(http_get(f"http://{http}/status", 10))
    return {i["http_address"] for i in doc["instances"] if i["state"] == "up"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--window", type=float, default=15.0)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="pdr-etcd-bench-")
    procs = []
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, args.nodes + 64)
    try:
        etcd, etcd_port = start_etcd(workdir)
        procs.append(etcd)
        a, a_http, a_disc = start_router(args.bin_dir, workdir, "a", etcd_port, args.nodes)
        procs.append(a)
        b, b_http, _ = start_router(args.bin_dir, workdir, "b", etcd_port, args.nodes)
        procs.append(b)
        time.sleep(1.0)  # both replicas in sync with etcd (their /status says so; kept simple)
        addresses = [f"127.2.{i // 250}.{i % 250 + 1}:8000" for i in range(args.nodes)]
        socks = []
        # The auth token lets one connection speak for many addresses: at most 500 connections
        # (10,000 would exceed this process's descriptors), node i on connection i % 500.
        for _ in range(min(500, len(addresses))):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(a_disc)
            socks.append(s)

        def message(addr, i, round_=0):
            return msgpack.packb({"type": "P" if i % 2 == 0 else "D", "http_address": addr, "pdr_v": 1,
                                  "connector": "nixl", "instance_id": "n" + addr, "epoch": 1,
                                  "zmq_address": addr.split(":")[0] + ":5600",
                                  "ttl_ms": int(args.interval * 3000), "auth": TOKEN,
                                  "load": {"running": (i + round_) % 7, "waiting": 0, "free_kv_blocks": 1000}})

        # Phase 1: registration, spread over one interval; B polled for visibility.
        sent_at, seen_at = {}, {}
        start = time.monotonic()
        step = args.interval / len(addresses)
        next_poll = start
        i = 0
        while len(seen_at) < len(addresses) and time.monotonic() - start < 60:
            now = time.monotonic()
            while i < len(addresses) and now >= start + i * step:
                socks[i % len(socks)].send(message(addresses[i], i))
                sent_at[addresses[i]] = time.monotonic()
                i += 1
            if now >= next_poll:
                t = time.monotonic()
                for addr in visible(b_http):
                    if addr in sent_at and addr not in seen_at:
                        seen_at[addr] = t
                next_poll = t + 0.02
            for s in socks[:min(i, len(socks))]:
                while s.poll(0):
                    s.recv()  # acks
            time.sleep(0.001)
        lat = sorted((seen_at[a] - sent_at[a]) * 1000 for a in seen_at)
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

        # Phase 2: steady heartbeats; etcd's own write counters.
        w0, t0, beats = etcd_writes(etcd_port), time.monotonic(), 0
        k = 0
        while time.monotonic() - t0 < args.window:
            due = t0 + k * step
            if time.monotonic() >= due:
                j = k % len(addresses)
                socks[j % len(socks)].send(message(addresses[j], j, k // len(addresses)))  # the load changes
                beats += 1
                k += 1
            else:
                time.sleep(max(0.0, min(0.001, due - time.monotonic())))
            s = socks[(k - 1) % len(socks)]
            while s.poll(0):
                s.recv()
        elapsed = time.monotonic() - t0
        writes = etcd_writes(etcd_port) - w0
        a_metrics = http_get(f"http://{a_http}/metrics").decode()
        puts = [l for l in a_metrics.splitlines() if l.startswith("pdrouter_etcd_puts_total")]
        print(json.dumps({
            "nodes": args.nodes, "heartbeat_interval_s": args.interval,
            "visible_on_b": len(seen_at), "visible_ms_p50": round(pct(0.50), 1),
            "visible_ms_p99": round(pct(0.99), 1), "visible_ms_max": round(lat[-1], 1) if lat else None,
            "window_s": round(elapsed, 1), "heartbeats_per_s": round(beats / elapsed, 1),
            "etcd_writes_per_s": round(writes / elapsed, 2),
            "replica_a": puts[0] if puts else None,
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
        }, indent=1))
    finally:
        ctx.destroy(linger=0)
        for p in reversed(procs):
            p.send_signal(signal.SIGKILL)
            p.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
