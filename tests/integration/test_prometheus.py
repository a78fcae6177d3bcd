"""pdrouter's /metrics as a real Prometheus sees it, and the Grafana dashboard built on it.

A P/D cluster (pdrouter and simulated nodes, pd_fixture) and Debian's `prometheus` scraping the
router's /metrics every second, all on loopback. While requests flow, PromQL over the scraped
series must return the request rate, the per-outcome counts and finite latency quantiles from the
histograms, and Prometheus must report the target up with no scrape error (a malformed exposition
shows there). Then every query of
deploy/grafana/pdrouter.json must use only metrics this router exports (its # TYPE lines) and be
PromQL that Prometheus accepts.
"""
import json
import os
import re
import shutil
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from pd_fixture import PdCluster
from pdr_testlib import ProcessHandle, free_port, requires
from pdrouter_fixture import TIME_SCALE

PROMETHEUS = "/usr/bin/prometheus"  # deploy/install-deps.sh --tests
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "pdrouter.json")

# What Grafana puts in place of its variables before a query reaches Prometheus (with a 1 s
# scrape interval $__rate_interval is at least 4 s; any duration is valid PromQL).
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$__interval": "5s", "${datasource}": "prometheus"}

# Words of PromQL the dashboard may use besides metric names (functions, aggregations, keywords).
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "by", "without", "on", "ignoring",
    "group_left", "group_right", "and", "or", "unless", "rate", "irate", "increase", "delta",
    "histogram_quantile", "clamp_min", "clamp_max", "abs", "vector", "scalar", "time", "offset",
    "e", "inf", "nan",
}


def http_get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class Prometheus:
    """Debian's prometheus on a free loopback port scraping one target every second, its TSDB in
    a temporary directory. --web.listen-address cannot be port 0: bind-probe a port, retry on a
    clash (the process exits when the port was taken meanwhile)."""

    def __init__(self, target):
        self.dir = tempfile.mkdtemp(prefix="pdr-prometheus-it-")
        self.proc = None
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: pdrouter
    metrics_path: /metrics
    static_configs:
      - targets: ["{target}"]
""")
        try:
            for attempt in range(5):
                self.port = free_port()
                self.proc = ProcessHandle(
                    [PROMETHEUS, "--config.file", config,
                     "--storage.tsdb.path", os.path.join(self.dir, "data-%d" % attempt),
                     "--web.listen-address", "127.0.0.1:%d" % self.port, "--log.level", "warn"],
                    name="prometheus-%d" % attempt, log_dir=self.dir)
                if self._wait_ready(timeout=30 * TIME_SCALE):
                    return
                self.proc.stop()
                self.proc = None
        except BaseException:
            self.close()
            raise
        self.close()
        raise AssertionError("prometheus did not start")

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                return False  # e.g. the port was taken between the probe and the bind
            try:
                with urllib.request.urlopen(self.url("/-/ready"), timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        return False

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def query(self, expr):
        """The /api/v1/query answer (JSON) for `expr` at now; a 400 (bad PromQL) is returned too."""
        url = self.url("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        try:
            return http_get_json(url)
        except urllib.error.HTTPError as e:
            return json.loads(e.read())

    def targets(self):
        return http_get_json(self.url("/api/v1/targets"))["data"]["activeTargets"]

    def log(self):
        return self.proc.output("stderr")[-3000:] if self.proc else ""

    def close(self):
        """Stops (SIGTERM, then SIGKILL) and reaps prometheus, removes its TSDB."""
        if self.proc is not None:
            self.proc.stop(10)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def exported_types(metrics_text):
    """{family name: type} from the # TYPE lines of a Prometheus text page."""
    types = {}
    for line in metrics_text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == ["#", "TYPE"]:
            types[parts[2]] = parts[3]
    return types


def dashboard_exprs(dashboard):
    """(panel title, expr) of every target of every panel, rows' nested panels included."""
    exprs = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                exprs.append((panel.get("title", ""), target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return exprs


def metric_names(expr):
    """The metric names an expression reads. Raises ValueError on a word that is neither a
    pdrouter metric nor PromQL, so a metric of another exporter cannot slip through."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)          # label values
    text = re.sub(r"\{[^}]*\}", "", text)                    # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)                   # range durations
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    names = set()
    for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if word.startswith("pdrouter_"):
            names.add(word)
        elif word.lower() not in PROMQL_WORDS:
            raise ValueError("%r: %r is not a pdrouter metric or a PromQL word" % (expr, word))
    return names


def family_of(name, types):
    """The family a sample name belongs to: itself, or a histogram's/summary's for the _bucket,
    _sum and _count series; None if the router exports no such family."""
    if name in types:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and types.get(base) in ("histogram", "summary"):
            if suffix != "_bucket" or types[base] == "histogram":
                return base
    return None


@requires(os.access(PROMETHEUS, os.X_OK), "prometheus")
class PrometheusScrapeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("nixl", prefills=1, decodes=1, kv_backends="none")
        cls.addClassCleanup(cls.cluster.close)
        # /metrics is on the admin listener when listeners.admin is set (the same address here).
        cls.prometheus = Prometheus(cls.cluster.router.admin_http)
        cls.addClassCleanup(cls.prometheus.close)
        cls.sent = 0

    def complete(self):
        status, _, body = self.cluster.post(
            "/v1/completions", {"model": "sim-model", "prompt": "Hello Prometheus %d" % self.sent,
                                "max_tokens": 2})
        self.assertEqual(status, 200, body[:300])
        type(self).sent += 1

    def poll_while_sending(self, expr, condition, timeout=60):
        """Sends a completion, then queries `expr`, until condition(result) holds; returns the
        result. Requests keep flowing so a rate over the last seconds is above 0 once Prometheus
        has two scrapes of them."""
        deadline = time.monotonic() + timeout * TIME_SCALE
        answer = None
        while time.monotonic() < deadline:
            self.complete()
            answer = self.prometheus.query(expr)
            self.assertEqual(answer.get("status"), "success", answer)
            if condition(answer["data"]["result"]):
                return answer["data"]["result"]
            time.sleep(0.1)  # pacing of the request flow, not synchronisation
        self.fail("%s: no matching result within %.0fs; last answer %s\nprometheus:\n%s"
                  % (expr, timeout * TIME_SCALE, answer, self.prometheus.log()))

    def test_request_rate_and_outcomes_from_promql(self):
        rate = self.poll_while_sending("sum(rate(pdrouter_requests_total[10s]))",
                                       lambda r: r and float(r[0]["value"][1]) > 0)
        self.assertGreater(float(rate[0]["value"][1]), 0)

        by_outcome = self.poll_while_sending(
            "sum by (outcome) (increase(pdrouter_requests_total[30s]))",
            lambda r: any(s["metric"].get("outcome") == "done" and float(s["value"][1]) > 0
                          for s in r))
        outcomes = {s["metric"].get("outcome"): float(s["value"][1]) for s in by_outcome}
        self.assertGreater(outcomes["done"], 0)
        # Every request here succeeded: the other outcomes exist (pre-created) and stayed at 0.
        self.assertEqual(outcomes.get("failed", 0.0), 0.0, outcomes)

        up = self.prometheus.query('up{job="pdrouter"}')["data"]["result"]
        self.assertEqual([float(s["value"][1]) for s in up], [1.0], up)
        targets = self.prometheus.targets()
        self.assertEqual(len(targets), 1, targets)
        self.assertEqual(targets[0]["health"], "up", targets)
        self.assertEqual(targets[0]["lastError"], "", targets)
        self.assertEqual(targets[0]["scrapeUrl"],
                         "http://%s/metrics" % self.cluster.router.admin_http)

    def test_latency_quantiles_from_promql(self):
        # The histograms' _bucket series as Prometheus reads them: a quantile over the last
        # seconds is a finite positive duration (NaN without buckets, +Inf if le were misordered).
        for expr in ("histogram_quantile(0.5, sum by (le) (rate("
                     'pdrouter_request_duration_seconds_bucket{outcome="done"}[10s])))',
                     "histogram_quantile(0.5, sum by (le) (rate("
                     "pdrouter_time_to_first_byte_seconds_bucket[10s])))",
                     "histogram_quantile(0.5, sum by (le, leg) (rate("
                     "pdrouter_leg_duration_seconds_bucket[10s])))"):
            result = self.poll_while_sending(
                expr, lambda r: r and all(0 < float(s["value"][1]) < float("inf") for s in r))
            if "by (le, leg)" in expr:
                self.assertEqual(sorted(s["metric"].get("leg") for s in result),
                                 ["decode", "prefill"], result)

    def test_dashboard_queries_use_exported_metrics_and_are_valid_promql(self):
        with open(DASHBOARD, encoding="utf-8") as f:
            dashboard = json.load(f)
        self.assertGreaterEqual(dashboard["schemaVersion"], 37)
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        exprs = dashboard_exprs(dashboard)
        self.assertGreater(len(exprs), 10)

        # Each query, with Grafana's variables filled in, is PromQL the real Prometheus accepts.
        for title, expr in exprs:
            query = expr
            for variable, value in GRAFANA_VARIABLES.items():
                query = query.replace(variable, value)
            self.assertNotIn("$", query, "an unknown Grafana variable in panel %r" % title)
            answer = self.prometheus.query(query)
            self.assertEqual(answer.get("status"), "success",
                             "panel %r: %s -> %s" % (title, query, answer))

        code, _, body = self.cluster.router.request("GET", "/metrics", admin=True)
        self.assertEqual(code, 200)
        types = exported_types(body.decode())
        used, missing = set(), []  # missing: in order of first use
        for title, expr in exprs:
            for name in metric_names(expr):
                family = family_of(name, types)
                used.add(family or name)
                if family is None and name not in missing:
                    missing.append(name)
        self.assertEqual(missing, [], "dashboard metrics pdrouter does not export")
        # The areas the dashboard covers: request rate and outcomes, latency
        # histograms, legs and retries, node states, discovery, KV events, etcd.
        for family in ("pdrouter_requests_total", "pdrouter_http_responses_total",
                       "pdrouter_request_duration_seconds", "pdrouter_time_to_first_byte_seconds",
                       "pdrouter_leg_duration_seconds", "pdrouter_upstream_legs_total",
                       "pdrouter_leg_failures_total", "pdrouter_leg_retries_total",
                       "pdrouter_instances", "pdrouter_node_ejections_total",
                       "pdrouter_registrations_accepted_total",
                       "pdrouter_registrations_rejected_total", "pdrouter_instance_expiries_total",
                       "pdrouter_kv_events_batches_total", "pdrouter_etcd_up"):
            self.assertIn(family, used)


if __name__ == "__main__":
    unittest.main()
