#!/usr/bin/python3
"""etcd write rate and cross-replica visibility of the shared registry (registry.backend: etcd).

Starts a real etcd (Debian's etcd-server) on bind-probed loopback ports and two pdrouter replicas
A and B sharing it, then N simulated nodes (pdrouter-format registrations with the discovery auth
token, addresses 127.2.x.y:8000) that register with A and heartbeat every --interval seconds, spread
evenly. The nodes are sent by --senders processes (node i by process i % senders, up to 100 ZMQ
DEALER connections each), so that one Python process is not the bottleneck at 10,000 nodes; the
topology raises discovery.max_instances and the token class cap to N + 100. Measures:
  * registration-to-visible on B: for each node, from its first registration sent to A until a
    /status poll of B lists it (polls --poll-ms apart; the poll's time is taken after its answer is
    parsed, so it includes rendering and parsing a /status of N entries: the mean poll time is
    printed): p50 / p99 / max;
  * etcd writes/s in steady state: etcd's own counters (etcd_mvcc_put_total +
    etcd_mvcc_delete_total from etcd's /metrics) over --window seconds of heartbeats, starting one
    interval after all nodes are visible on B, next to the heartbeat rate the senders achieved and
    how many heartbeats were sent more than 0.5 s late (0 = the senders kept up).
Usage: bench/etcd/write_rate.py --bin-dir BUILD [--nodes 1000] [--interval 3] [--window 15]
       [--senders 4] [--poll-ms 20] [--lease-ttl 10] [--etcd-tmpfs]
"""
import argparse
import json
import multiprocessing
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


def start_etcd(workdir, data_dir):
    for _ in range(5):
        client, peer = probe_port(), probe_port()
        c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        log = open(os.path.join(workdir, "etcd.log"), "a")
        proc = subprocess.Popen(["/usr/bin/etcd", "--data-dir", data_dir,
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


def start_router(bin_dir, workdir, name, etcd_port, nodes, lease_ttl_s):
    path = os.path.join(workdir, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""
connectors:
  default: nixl
discovery:
  ttl_ms: 10000
  max_instances: {nodes + 100}
  max_instances_per_class: {{token: {nodes + 100}}}
  auth_token_env: PDR_BENCH_TOKEN
registry:
  backend: etcd
  etcd_endpoints: ["127.0.0.1:{etcd_port}"]
  replica_id: "{name}"
  lease_ttl_s: {lease_ttl_s}
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


def message(addr, i, interval, round_=0):
    return msgpack.packb({"type": "P" if i % 2 == 0 else "D", "http_address": addr, "pdr_v": 1,
                          "connector": "nixl", "instance_id": "n" + addr, "epoch": 1,
                          "zmq_address": addr.split(":")[0] + ":5600",
                          "ttl_ms": int(interval * 3000), "auth": TOKEN,
                          "load": {"running": (i + round_) % 7, "waiting": 0, "free_kv_blocks": 1000}})


def sender(w, nsenders, endpoint, addresses, interval, start, stop, beats, late, out):
    """Sender process w: nodes w, w + nsenders, ...; node i registers at start + i * step (step =
    interval / N, so the whole set is spread over one interval) and then heartbeats every interval
    with a changed load. Counts beats and beats sent more than 0.5 s behind their schedule."""
    ctx = zmq.Context()
    mine = list(range(w, len(addresses), nsenders))
    socks = []
    # The auth token lets one connection speak for many addresses: a few connections per process.
    for _ in range(min(100, len(mine))):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    step = interval / len(addresses)
    sent_at = {}
    k = 0
    while not stop.is_set():
        now = time.monotonic()
        while True:  # everything due now, in one batch
            i, round_ = mine[k % len(mine)], k // len(mine)
            due = start + i * step + round_ * interval
            if due > now:
                break
            socks[k % len(socks)].send(message(addresses[i], i, interval, round_))
            if round_ == 0:
                sent_at[addresses[i]] = time.monotonic()
            beats.value += 1
            if now - due > 0.5:
                late.value += 1
            k += 1
        # Wait for acks (drained so they do not pile up) or until the next beat is due.
        for s, _ in poller.poll(max(1, min(100, int((due - time.monotonic()) * 1000)))):
            while s.poll(0):
                s.recv()
    out.put(sent_at)
    ctx.destroy(linger=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--senders", type=int, default=4, help="sender processes")
    ap.add_argument("--poll-ms", type=float, default=20.0, help="pause between /status polls of B")
    ap.add_argument("--lease-ttl", type=int, default=10, help="registry.lease_ttl_s of both replicas")
    ap.add_argument("--etcd-tmpfs", action="store_true",
                    help="etcd's data dir on tmpfs (/dev/shm): its WAL fsyncs cost ~nothing; the number "
                         "of writes is the same, only their latency changes")
    args = ap.parse_args()
    args.senders = max(1, min(args.senders, args.nodes))
    workdir = tempfile.mkdtemp(prefix="pdr-etcd-bench-")
    etcd_dir = (tempfile.mkdtemp(prefix="pdr-etcd-bench-", dir="/dev/shm") if args.etcd_tmpfs
                else os.path.join(workdir, "etcd"))
    load_at_start = os.getloadavg()
    procs, workers = [], []
    mp = multiprocessing.get_context("spawn")  # no ZMQ context inherited by the senders
    stop = mp.Event()
    out = mp.Queue()
    beats = [mp.Value("q", 0) for _ in range(args.senders)]
    late = [mp.Value("q", 0) for _ in range(args.senders)]
    total = lambda vs: sum(v.value for v in vs)
    try:
        etcd, etcd_port = start_etcd(workdir, etcd_dir)
        procs.append(etcd)
        a, a_http, a_disc = start_router(args.bin_dir, workdir, "a", etcd_port, args.nodes, args.lease_ttl)
        procs.append(a)
        b, b_http, _ = start_router(args.bin_dir, workdir, "b", etcd_port, args.nodes, args.lease_ttl)
        procs.append(b)
        time.sleep(1.0)  # both replicas in sync with etcd (their /status says so; kept simple)
        addresses = [f"127.2.{i // 250}.{i % 250 + 1}:8000" for i in range(args.nodes)]

        # Phase 1: registration, spread over one interval by the senders; B polled for visibility.
        # A poll's time is taken when its answer is parsed (an upper bound: it includes up to one
        # poll period plus rendering and parsing B's /status).
        start = time.monotonic() + 1.0  # senders started and connected
        for w in range(args.senders):
            p = mp.Process(target=sender, args=(w, args.senders, a_disc, addresses, args.interval, start,
                                                stop, beats[w], late[w], out))
            p.start()
            workers.append(p)
        seen_at, polls, poll_s = {}, 0, 0.0
        while len(seen_at) < len(addresses) and time.monotonic() - start < 60 + args.nodes / 100:
            t_req = time.monotonic()
            up = visible(b_http)
            t = time.monotonic()
            polls, poll_s = polls + 1, poll_s + (t - t_req)
            for addr in up:
                seen_at.setdefault(addr, t)
            time.sleep(args.poll_ms / 1000)
        visible_after = time.monotonic() - start

        # Phase 2: steady heartbeats (senders keep going); etcd's own write counters.
        time.sleep(args.interval)
        w0, b0, l0, t0 = etcd_writes(etcd_port), total(beats), total(late), time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - t0
        writes, nbeats, nlate = etcd_writes(etcd_port) - w0, total(beats) - b0, total(late) - l0
        up_end = len(visible(b_http))
        stop.set()
        sent_at = {}
        for _ in workers:
            sent_at.update(out.get(timeout=30))
        lat = sorted((seen_at[a] - sent_at[a]) * 1000 for a in seen_at if a in sent_at)
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")
        a_metrics = http_get(f"http://{a_http}/metrics").decode()
        puts = [l for l in a_metrics.splitlines() if l.startswith("pdrouter_etcd_puts_total")]
        a_etcd = {l.split()[0]: float(l.split()[1]) for l in a_metrics.splitlines()
                  if l.startswith(("pdrouter_etcd_inflight_max", "pdrouter_etcd_lease_grants_total",
                                   "pdrouter_etcd_leases_lost_total", "pdrouter_etcd_failures_total"))}
        backend = {n: json.loads(http_get(f"http://{h}/status", 10)).get("registry_backend")
                   for n, h in (("a", a_http), ("b", b_http))}
        print(json.dumps({
            "nodes": args.nodes, "heartbeat_interval_s": args.interval, "senders": args.senders,
            "visible_on_b": len(seen_at), "all_visible_after_s": round(visible_after, 1),
            "visible_ms_p50": round(pct(0.50), 1), "visible_ms_p99": round(pct(0.99), 1),
            "visible_ms_max": round(lat[-1], 1) if lat else None,
            "status_polls": polls, "status_poll_ms_mean": round(poll_s / max(1, polls) * 1000, 1),
            "window_s": round(elapsed, 1), "heartbeats_per_s": round(nbeats / elapsed, 1),
            "heartbeats_late_0_5s_in_window": nlate, "up_on_b_at_end": up_end,
            "etcd_writes_per_s": round(writes / elapsed, 2),
            "replica_a": puts[0] if puts else None, "replica_a_etcd": a_etcd, "lease_ttl_s": args.lease_ttl, "registry_backend_at_end": backend,
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
            "loadavg_at_start": load_at_start, "loadavg": os.getloadavg(),
            "etcd_data_dir": "tmpfs (/dev/shm)" if args.etcd_tmpfs else "disk (" + tempfile.gettempdir() + ")",
        }, indent=1))
    finally:
        stop.set()
        for p in workers:
            p.join(5)
            if p.is_alive():
                p.kill()
        for p in reversed(procs):
            p.send_signal(signal.SIGKILL)
            p.wait()
        shutil.rmtree(workdir, ignore_errors=True)
        if args.etcd_tmpfs:
            shutil.rmtree(etcd_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
