"""The deployment artifacts under deploy/ stay honest: the systemd unit passes
`systemd-analyze verify` (and its offline security review), the Kubernetes manifests render with
`kubectl kustomize` and agree with pdrouter (probe paths and ports, the topology in the ConfigMap
loads in the real binary), and the container image builds offline and serves /health when its
file system is run with chroot, and the Grafana dashboard takes its data source from a variable.
Every address the tests use is on loopback."""

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import unittest

import yaml  # python3-yaml (deploy/install-deps.sh --tests)

from pdr_testlib import ProcessHandle, pdrouter_help_routes, pdrouter_path
from pdrouter_fixture import LISTENING, Router, TIME_SCALE
from sim_fixture import SimNode

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
UNIT = os.path.join(DEPLOY, "systemd", "pdrouter.service")
KUBE = os.path.join(DEPLOY, "kubernetes")
CONTAINER = os.path.join(DEPLOY, "container")
DASHBOARD = os.path.join(DEPLOY, "grafana", "pdrouter.json")
# Default timeouts.drain_ms (deploy/topology.example.yaml).
DEFAULT_DRAIN_MS = 30000


def run(args, timeout, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def unit_settings(text):
    """{key: [values]} of a unit file (sections merged: keys are unique across ours)."""
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


class SystemdUnitTest(unittest.TestCase):
    def setUp(self):
        with open(UNIT, encoding="utf-8") as f:
            self.text = f.read()
        self.settings = unit_settings(self.text)
        self.dir = tempfile.mkdtemp(prefix="pdr-unit-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        # verify needs ExecStart's binary to exist: point it at this build's pdrouter.
        self.assertIn("/usr/local/bin/pdrouter ", self.text)
        self.copy = os.path.join(self.dir, "pdrouter.service")
        with open(self.copy, "w", encoding="utf-8") as f:
            f.write(self.text.replace("/usr/local/bin/pdrouter ", os.path.abspath(pdrouter_path()) + " "))

    def test_verify_is_clean(self):
        # Unknown keys and bad values are only warnings (exit 0): any output fails the test.
        done = run(["systemd-analyze", "verify", self.copy], timeout=60, cwd=self.dir)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual((done.stdout + done.stderr).strip(), "")

    def test_security_exposure_is_low(self):
        done = run(["systemd-analyze", "security", "--offline=yes", "--no-pager", self.copy],
                   timeout=60, cwd=self.dir)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
        self.assertIsNotNone(level, done.stdout)
        self.assertLessEqual(float(level.group(1)), 2.0, done.stdout)

    def test_runs_the_topology_as_a_non_root_user(self):
        self.assertEqual(self.settings["ExecStart"],
                         ["/usr/local/bin/pdrouter --config /etc/pdrouter/topology.yaml"])
        self.assertEqual(self.settings["DynamicUser"], ["yes"])
        self.assertNotIn("User", self.settings)
        self.assertEqual(self.settings["CapabilityBoundingSet"], [""])
        self.assertEqual(self.settings["NoNewPrivileges"], ["yes"])
        self.assertEqual(self.settings["RestrictAddressFamilies"], ["AF_INET AF_INET6 AF_UNIX"])

    def test_stop_outlasts_the_drain_and_reload_is_sighup(self):
        # pdrouter drains for timeouts.drain_ms on SIGTERM (--help says so): systemd must not
        # SIGKILL it earlier. And it reloads on SIGHUP, which ExecReload sends.
        help_text = run([pdrouter_path(), "--help"], timeout=30).stdout
        self.assertIn("SIGTERM/SIGINT stop gracefully (in-flight requests drain for timeouts.drain_ms)",
                      help_text)
        self.assertIn("SIGHUP reloads the topology file", help_text)
        stop = re.fullmatch(r"(\d+)s", self.settings["TimeoutStopSec"][0])
        self.assertIsNotNone(stop)
        self.assertGreater(int(stop.group(1)) * 1000, DEFAULT_DRAIN_MS)
        self.assertEqual(self.settings["ExecReload"], ["/bin/kill -HUP $MAINPID"])
        self.assertEqual(self.settings["Restart"], ["on-failure"])
        # Sized by docs/topology.md's formula for the default limits.max_connections (16384 streams
        # at most): 3N + 256.
        self.assertGreaterEqual(int(self.settings["LimitNOFILE"][0]), 3 * 16384 + 256)

    def test_syscall_filter_allows_what_pdrouter_calls(self):
        # No systemd runs here to start the unit, so the filter is checked against the system
        # calls pdrouter makes (strace) while it starts, serves /health and /ready, reloads on
        # SIGHUP and drains on SIGTERM: a call outside the filter would kill the service.
        sets, current = {}, None
        for line in run(["systemd-analyze", "syscall-filter", "--no-pager"], timeout=60).stdout.splitlines():
            if line.startswith("@"):
                current = sets.setdefault(line.strip(), set())
            elif current is not None and line.strip() and not line.strip().startswith("#"):
                current.add(line.strip())

        def expand(name):
            return set().union(*[expand(m) if m.startswith("@") else {m} for m in sets[name]])

        allowed, denied = set(), set()
        for value in self.settings["SystemCallFilter"]:
            target = denied if value.startswith("~") else allowed
            for name in value.lstrip("~").split():
                target |= expand(name) if name.startswith("@") else {name}
        allowed = (allowed | expand("@default")) - denied

        # Not in the topology's directory: pdrouter watches it, and every line strace wrote
        # there would wake pdrouter into another system call to trace.
        trace = os.path.join(self.dir, "strace.out")
        os.mkdir(os.path.join(self.dir, "etc"))
        topology = os.path.join(self.dir, "etc", "topology.yaml")
        with open(topology, "w") as f:
            f.write("workers: 2\n")
        proc = ProcessHandle(["strace", "-f", "-qq", "-o", trace, pdrouter_path(), "--config", topology,
                              "--http", "127.0.0.1:0", "--discovery", "tcp://127.0.0.1:0"], name="strace",
                             # LeakSanitizer cannot run under ptrace (the ASan stage's builds).
                             env={"ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0"})
        self.addCleanup(proc.stop)
        line = proc.wait_for_line(LISTENING, timeout=20 * TIME_SCALE, streams=("stdout",))
        self.assertIsNotNone(line, proc.output())
        host, port = re.search(LISTENING, line).group(1).rsplit(":", 1)
        for path in ("/health", "/ready"):
            conn = http.client.HTTPConnection(host, int(port), timeout=10 * TIME_SCALE)
            conn.request("GET", path)
            conn.getresponse().read()
            conn.close()
        # strace forwards no signals: signal pdrouter itself (strace's only child).
        with open("/proc/%d/task/%d/children" % (proc.proc.pid, proc.proc.pid)) as f:
            (child,) = [int(p) for p in f.read().split()]
        os.kill(child, signal.SIGHUP)
        self.assertIsNotNone(proc.wait_for_line(r"topology reloaded from", timeout=10 * TIME_SCALE,
                                                streams=("stderr",)), proc.output())
        os.kill(child, signal.SIGTERM)
        self.assertEqual(proc.wait(20 * TIME_SCALE), 0, proc.output())
        with open(trace) as f:
            called = set(re.findall(r"^\d+\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]", f.read(), re.M))
        called -= {"exit", "exit_group", "execve"}  # strace's own exec of pdrouter, and the exits
        self.assertTrue(called, "strace recorded nothing")
        self.assertEqual(called - allowed, set())

    def test_admin_key_credential_path_is_a_valid_topology(self):
        # The README's pattern: LoadCredential copies the key where admin.api_key_file reads it.
        self.assertIn("#LoadCredential=admin-api-key:/etc/pdrouter/admin-api-key", self.text)
        key = os.path.join(self.dir, "admin-api-key")
        with open(key, "w") as f:
            f.write("k" * 32 + "\n")
        with Router("admin: {api_key_file: %s}\n" % key) as router:
            code, _, _ = router.request("GET", "/admin/instances",
                                        headers={"Authorization": "Bearer " + "k" * 32})
            self.assertEqual(code, 200)
        router.dir.cleanup()


def rendered_manifests():
    """The objects `kubectl kustomize deploy/kubernetes` renders (offline), by (kind, name)."""
    done = run(["kubectl", "kustomize", KUBE], timeout=60)
    assert done.returncode == 0, done.stderr
    objects = {}
    for doc in yaml.safe_load_all(done.stdout):
        if doc:
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def port_of(listener):
    """Port of a listener value: "0.0.0.0:10001" or "tcp://*:36367"."""
    return int(listener.rsplit(":", 1)[1])


class KubernetesManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objects = rendered_manifests()
        cls.deployment = cls.objects[("Deployment", "pdrouter")]
        cls.pod = cls.deployment["spec"]["template"]["spec"]
        (cls.container,) = cls.pod["containers"]
        cls.ports = {p["name"]: p["containerPort"] for p in cls.container["ports"]}
        (cls.configmap,) = [o for (kind, _), o in cls.objects.items() if kind == "ConfigMap"]
        cls.topology_text = cls.configmap["data"]["topology.yaml"]
        cls.topology = yaml.safe_load(cls.topology_text)

    def test_every_object_is_there_in_one_namespace(self):
        kinds = sorted(kind for kind, _ in self.objects)
        self.assertEqual(kinds, ["ConfigMap", "Deployment", "Namespace", "PodDisruptionBudget", "Role",
                                 "RoleBinding", "Service", "Service", "Service", "Service", "ServiceAccount",
                                 "StatefulSet"])
        for (kind, name), obj in self.objects.items():
            if kind != "Namespace":
                self.assertEqual(obj["metadata"].get("namespace"), "pdrouter", (kind, name))

    def test_two_replicas_share_the_registry_through_etcd(self):
        # Both replicas see the same nodes only through the etcd registry: a node
        # registering through the discovery Service reaches one pod.
        self.assertEqual(self.deployment["spec"]["replicas"], 2)
        registry = self.topology["registry"]
        self.assertEqual(registry["backend"], "etcd")
        host, port = registry["etcd_endpoints"][0].rsplit(":", 1)
        etcd_service = self.objects[("Service", host)]["spec"]
        self.assertIn(int(port), [p["port"] for p in etcd_service["ports"]])
        etcd = self.objects[("StatefulSet", host)]["spec"]
        self.assertTrue(set(etcd_service["selector"].items())
                        <= set(etcd["template"]["metadata"]["labels"].items()))
        self.assertNotIn("replica_id", registry)  # default hostname-pid: the pod name, unique
        # A new pod is ready from etcd's view at once: roll one at a time, never below 2.
        strategy = self.deployment["spec"]["strategy"]
        self.assertEqual(strategy["type"], "RollingUpdate")
        self.assertEqual(strategy["rollingUpdate"]["maxUnavailable"], 0)
        pdb = self.objects[("PodDisruptionBudget", "pdrouter")]["spec"]
        self.assertEqual(pdb.get("minAvailable"), 1, "one replica keeps serving through a node drain")
        self.assertLess(pdb["minAvailable"], self.deployment["spec"]["replicas"], "a PDB allowing no eviction blocks node drains")
        self.assertEqual(pdb["selector"]["matchLabels"], self.deployment["spec"]["selector"]["matchLabels"])

    def test_container_ports_are_the_topology_listeners(self):
        listeners = self.topology["listeners"]
        self.assertEqual(self.ports, {"http": port_of(listeners["http"]),
                                      "discovery": port_of(listeners["discovery"]),
                                      "admin": port_of(listeners["admin"])})

    def test_probes_use_routes_pdrouter_serves_on_that_listener(self):
        # --help lists each route with its listener: /ready only on the client one.
        routes = {(method, path): listener for method, path, listener in pdrouter_help_routes()}
        for probe, path in (("livenessProbe", "/health"), ("readinessProbe", "/ready")):
            get = self.container[probe]["httpGet"]
            self.assertEqual(get["path"], path, probe)
            self.assertEqual(get["port"], "http", probe)
            self.assertIn(routes[("GET", path)], ("client", "both"), probe)
        self.assertEqual(routes[("GET", "/metrics")], "admin")

    def test_runs_non_root_read_only_without_capabilities(self):
        pod_ctx, ctx = self.pod["securityContext"], self.container["securityContext"]
        self.assertTrue(pod_ctx["runAsNonRoot"])
        self.assertEqual((pod_ctx["runAsUser"], pod_ctx["runAsGroup"]), (65532, 65532))
        self.assertFalse(ctx["allowPrivilegeEscalation"])
        self.assertTrue(ctx["readOnlyRootFilesystem"])
        self.assertEqual(ctx["capabilities"]["drop"], ["ALL"])
        self.assertIn("limits", self.container["resources"])

    def test_grace_period_outlasts_the_drain(self):
        drain_ms = self.topology.get("timeouts", {}).get("drain_ms", DEFAULT_DRAIN_MS)
        self.assertGreater(self.pod["terminationGracePeriodSeconds"] * 1000, drain_ms)

    def test_config_path_is_the_mounted_configmap(self):
        args = self.container["args"]
        config = args[args.index("--config") + 1]
        mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        (name,) = [n for n, v in volumes.items() if "configMap" in v]
        self.assertEqual(volumes[name]["configMap"]["name"], self.configmap["metadata"]["name"])
        self.assertEqual(config, os.path.join(mounts[name], "topology.yaml"))

    def test_services_point_at_named_container_ports(self):
        labels = self.deployment["spec"]["template"]["metadata"]["labels"]
        services = {name: o["spec"] for (kind, name), o in self.objects.items()
                    if kind == "Service" and name != "pdrouter-etcd"}
        self.assertEqual(set(services), {"pdrouter", "pdrouter-discovery", "pdrouter-admin"})
        for name, spec in services.items():
            self.assertTrue(set(spec["selector"].items()) <= set(labels.items()), name)
            for port in spec["ports"]:
                self.assertEqual(port["port"], self.ports[port["targetPort"]], name)
        # Nodes must reach a pod that is not ready yet: it becomes ready once they registered.
        self.assertTrue(services["pdrouter-discovery"]["publishNotReadyAddresses"])
        self.assertNotIn("publishNotReadyAddresses", services["pdrouter"])

    def test_rbac_reads_pods_of_its_namespace(self):
        role = self.objects[("Role", "pdrouter-pod-reader")]
        self.assertEqual(role["rules"], [{"apiGroups": [""], "resources": ["pods"],
                                          "verbs": ["get", "list", "watch"]}])
        binding = self.objects[("RoleBinding", "pdrouter-pod-reader")]
        self.assertEqual(binding["roleRef"]["name"], "pdrouter-pod-reader")
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount", "name": "pdrouter",
                                                "namespace": "pdrouter"}])
        self.assertEqual(self.pod["serviceAccountName"], "pdrouter")
        # Pod discovery reads the mounted service-account token (kubernetes.token_file default).
        self.assertTrue(self.pod.get("automountServiceAccountToken", True))

    def test_servicemonitor_scrapes_the_admin_service(self):
        with open(os.path.join(KUBE, "servicemonitor.yaml"), encoding="utf-8") as f:
            monitor = yaml.safe_load(f)
        admin = self.objects[("Service", "pdrouter-admin")]
        selector = monitor["spec"]["selector"]["matchLabels"]
        self.assertTrue(set(selector.items()) <= set(admin["metadata"]["labels"].items()))
        (endpoint,) = monitor["spec"]["endpoints"]
        self.assertEqual(endpoint["path"], "/metrics")
        self.assertIn(endpoint["port"], [p["name"] for p in admin["spec"]["ports"]])

    def test_configmap_topology_loads_and_serves(self):
        # The file as shipped goes through the loader (admission rules included: it listens on
        # every address, so allowed_peers must not admit everyone); only the listen addresses
        # move to loopback (--http/--discovery flags, and listeners.admin in the text).
        text, count = re.subn(r'(?m)^(\s*admin:\s*)"0\.0\.0\.0:\d+"', r'\g<1>"127.0.0.1:0"',
                              self.topology_text)
        self.assertEqual(count, 1)
        with Router(topology_yaml=text) as router:
            self.assertNotEqual(router.admin_http, router.http)
            code, _, body = router.request("GET", "/health")
            self.assertEqual((code, json.loads(body)), (200, {"status": "ok"}))
            code, _, _ = router.request("GET", "/ready")
            self.assertEqual(code, 503)  # no nodes: not ready, as the readiness probe expects
            self.assertIn("pdrouter_discovery_frames_total", router.request(
                "GET", "/metrics", admin=True)[2].decode())
            status = router.status()
            self.assertFalse(status.get("discovery_open", False))
        router.dir.cleanup()


class GrafanaDashboardTest(unittest.TestCase):
    """deploy/grafana/pdrouter.json imports into any Grafana with a Prometheus data source: every
    panel and query takes its data source from the ${datasource} variable, ids and query refIds are
    unique, panels fit the 24-column grid. test_prometheus.py runs its queries on a real Prometheus
    against a live pdrouter."""

    @classmethod
    def setUpClass(cls):
        with open(DASHBOARD, encoding="utf-8") as f:
            cls.dashboard = json.load(f)

    def panels(self):
        def walk(panels):
            for panel in panels:
                yield panel
                yield from walk(panel.get("panels", []))
        return list(walk(self.dashboard["panels"]))

    def test_datasource_is_a_prometheus_variable(self):
        self.assertGreaterEqual(self.dashboard["schemaVersion"], 37)
        (variable,) = [v for v in self.dashboard["templating"]["list"] if v["name"] == "datasource"]
        self.assertEqual((variable["type"], variable["query"]), ("datasource", "prometheus"))
        for panel in self.panels():
            if panel["type"] == "row":
                continue
            self.assertEqual(panel["datasource"], {"type": "prometheus", "uid": "${datasource}"},
                             panel["title"])
            self.assertTrue(panel["targets"], panel["title"])
            for target in panel["targets"]:
                self.assertEqual(target["datasource"], panel["datasource"], panel["title"])
                self.assertTrue(target["expr"].strip(), panel["title"])

    def test_ids_refids_and_layout(self):
        panels = self.panels()
        ids = [p["id"] for p in panels]
        self.assertEqual(len(ids), len(set(ids)))
        taken = {}  # grid cell -> the panel covering it: no two panels overlap
        for panel in panels:
            self.assertIn(panel["type"], ("row", "timeseries", "stat"))
            grid = panel["gridPos"]
            self.assertLessEqual(grid["x"] + grid["w"], 24, panel["title"])
            for x in range(grid["x"], grid["x"] + grid["w"]):
                for y in range(grid["y"], grid["y"] + grid["h"]):
                    self.assertFalse((x, y) in taken, "%r overlaps %r" % (panel["title"],
                                                                          taken.get((x, y))))
                    taken[(x, y)] = panel["title"]
            refs = [t["refId"] for t in panel.get("targets", [])]
            self.assertEqual(len(refs), len(set(refs)), panel["title"])


class ContainerImageTest(unittest.TestCase):
    """build-image.sh builds the image offline; containers cannot run on this machine kind (the
    runtime has no cgroup support), so the image's exported file system is run with chroot as
    the image's user: only what the image holds is there (no host library can leak in)."""

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise AssertionError("chroot needs root (CI runs the tests as root)")
        build_dir = os.path.normpath(os.path.join(os.path.abspath(pdrouter_path()), "..", ".."))
        cls.tag = "localhost/pdrouter-test:%d" % os.getpid()
        done = run([os.path.join(CONTAINER, "build-image.sh"), "--build-dir", build_dir,
                    "--tag", cls.tag], timeout=120 * TIME_SCALE)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip().splitlines()[-1] == cls.tag, done.stdout
        cls.rootfs = tempfile.mkdtemp(prefix="pdr-image-")
        os.chmod(cls.rootfs, 0o755)  # it becomes "/" for uid 65532 (mkdtemp makes it 0700)
        try:
            created = run(["podman", "create", cls.tag], timeout=60)
            assert created.returncode == 0, created.stderr
            container = created.stdout.strip()
            try:
                tar = os.path.join(cls.rootfs, "..", os.path.basename(cls.rootfs) + ".tar")
                exported = run(["podman", "export", "-o", tar, container], timeout=60)
                assert exported.returncode == 0, exported.stderr
                untar = run(["tar", "-xf", tar, "-C", cls.rootfs], timeout=60)
                os.unlink(tar)
                assert untar.returncode == 0, untar.stderr
            finally:
                run(["podman", "rm", "-f", container], timeout=60)
            inspect = run(["podman", "image", "inspect", cls.tag], timeout=60)
            assert inspect.returncode == 0, inspect.stderr
            cls.config = json.loads(inspect.stdout)[0]["Config"]
            cls.size = json.loads(inspect.stdout)[0]["Size"]
            cls.files = sorted(os.path.relpath(os.path.join(d, f), cls.rootfs)
                               for d, _, names in os.walk(cls.rootfs) for f in names)
            cls.files_bytes = sum(os.path.getsize(os.path.join(cls.rootfs, f)) for f in cls.files)
            os.mkdir(os.path.join(cls.rootfs, "proc"))  # the runtime's mount point
            cls.sanitizer_env = cls.sanitizer_files_inside(cls.rootfs)
        finally:
            run(["podman", "rmi", "-f", cls.tag], timeout=60)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.rootfs, True)

    @staticmethod
    def sanitizer_files_inside(rootfs):
        """Sanitizer builds (the suite's ASan and TSan stages) name suppression files on the host
        (`suppressions=/path` in *SAN_OPTIONS), which a chrooted process cannot open: the runtime
        then exits at start. Copies each into the tree, after the image's file list was taken, and
        returns the options rewritten to the copies."""
        env = {}
        for name in ("ASAN_OPTIONS", "TSAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
            options = os.environ.get(name)
            if not options:
                continue

            def inside(match):
                host = match.group(1)
                target_dir = os.path.join(rootfs, "sanitizer")
                os.makedirs(target_dir, mode=0o755, exist_ok=True)
                copy = os.path.join(target_dir, name.lower() + ".supp")
                shutil.copyfile(host, copy)
                os.chmod(copy, 0o644)
                return "suppressions=/sanitizer/" + os.path.basename(copy)

            env[name] = re.sub(r"suppressions=([^: ]+)", inside, options)
        return env

    def chroot(self, *args):
        """argv running args inside the image tree as its user, with /proc mounted as a container
        runtime would (sanitizer builds read /proc/self/maps at start). The mount lives in a
        private mount namespace: it goes away with the process, whatever happens to the test.
        unshare, sh and chroot each exec the next: signals and the exit code are pdrouter's."""
        script = 'mount --bind /proc "$1/proc" && root=$1 && shift && exec chroot --userspec="$0" "$root" "$@"'
        sanitizers = ["%s=%s" % kv for kv in sorted(self.sanitizer_env.items())]
        return (["env"] + sanitizers + ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                                        self.config["User"], self.rootfs] + list(args))

    def test_image_config(self):
        self.assertEqual(self.config["User"], "65532:65532")
        self.assertEqual(self.config["Entrypoint"], ["/usr/local/bin/pdrouter"])
        self.assertEqual(self.config["Cmd"], ["--config", "/etc/pdrouter/topology.yaml"])
        self.assertEqual(set(self.config["ExposedPorts"]), {"10001/tcp", "36367/tcp", "10002/tcp"})
        # Exactly the two binaries, the libraries the loader resolves for them (ldd, as the
        # build script; here from the test's side), four /etc files and the system CA bundle
        # with OpenSSL's default link to it: no shell, nothing else.
        binaries = [pdrouter_path(), os.path.join(os.path.dirname(pdrouter_path()), "..", "node", "pdnode")]
        done = run(["ldd"] + binaries, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        libraries = set(re.findall(r"=> (/\S+)", done.stdout)) | set(re.findall(r"^\t(/\S+) \(", done.stdout, re.M))
        expected = {"usr/local/bin/pdrouter", "usr/local/bin/pdnode", "etc/pdrouter/topology.yaml",
                    "etc/nsswitch.conf", "etc/passwd", "etc/group",
                    "etc/ssl/certs/ca-certificates.crt", "usr/lib/ssl/cert.pem"} | {lib[1:] for lib in libraries}
        self.assertEqual(set(self.files), expected)
        # OpenSSL in the image finds the bundle through its default path (https etcd and API
        # servers verify without a ca_file): the link resolves inside the image to the host's bundle.
        self.assertEqual(os.readlink(os.path.join(self.rootfs, "usr/lib/ssl/cert.pem")),
                         "/etc/ssl/certs/ca-certificates.crt")
        with open(os.path.join(self.rootfs, "etc/ssl/certs/ca-certificates.crt"), "rb") as f:
            bundle = f.read()
        with open("/etc/ssl/certs/ca-certificates.crt", "rb") as f:
            self.assertEqual(bundle, f.read())
        self.assertIn(b"-----BEGIN CERTIFICATE-----", bundle)
        # One layer of those files (~15 MB in a Release build): no base, no leftovers.
        self.assertLess(self.size, self.files_bytes + 1024 * 1024)

    def test_binaries_run_from_the_image_alone(self):
        for binary in ("pdrouter", "pdnode"):
            done = run(self.chroot("/usr/local/bin/" + binary, "--help"), timeout=30)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("Usage", done.stdout)

    def test_default_topology_loads(self):
        # The image's own /etc/pdrouter/topology.yaml, only the listeners moved to loopback.
        router = ProcessHandle(self.chroot(*self.config["Entrypoint"], *self.config["Cmd"],
                                           "--http", "127.0.0.1:0", "--discovery", "tcp://127.0.0.1:0"),
                               name="pdrouter-image")
        self.addCleanup(router.stop)
        self.assertIsNotNone(router.wait_for_line(LISTENING, timeout=10 * TIME_SCALE,
                                                  streams=("stdout",)), router.output())
        self.assertEqual(router.stop(), 0, router.output())

    def test_serves_health_and_a_proxied_request(self):
        prefill = SimNode("--role", "prefill", "--connector", "nixl")
        self.addCleanup(prefill.stop)
        decode = SimNode("--role", "decode", "--connector", "nixl")
        self.addCleanup(decode.stop)
        topology = ('instances:\n'
                    '  - {role: prefill, http_address: "127.0.0.1:%d", connector: nixl}\n'
                    '  - {role: decode, http_address: "127.0.0.1:%d", connector: nixl}\n'
                    % (prefill.port, decode.port))
        # Written inside the image tree, where the chrooted process (uid 65532) can read it.
        path = os.path.join(self.rootfs, "tmp-topology-%d.yaml" % os.getpid())
        with open(path, "w") as f:
            f.write(topology)
        os.chmod(path, 0o644)
        self.addCleanup(os.unlink, path)
        router = ProcessHandle(self.chroot("/usr/local/bin/pdrouter", "--config", "/" + os.path.basename(path),
                                           "--http", "127.0.0.1:0", "--discovery", "tcp://127.0.0.1:0"),
                               name="pdrouter-image")
        self.addCleanup(router.stop)
        line = router.wait_for_line(LISTENING, timeout=10 * TIME_SCALE, streams=("stdout",))
        self.assertIsNotNone(line, router.output())
        host, port = re.search(LISTENING, line).group(1).rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10 * TIME_SCALE)
        self.addCleanup(conn.close)
        conn.request("GET", "/health")
        response = conn.getresponse()
        self.assertEqual((response.status, json.loads(response.read())), (200, {"status": "ok"}))
        body = json.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 4}).encode()
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        self.assertEqual(response.status, 200, answer)
        self.assertTrue(json.loads(answer)["choices"], answer)
        self.assertEqual(len(prefill.sim_requests()["requests"]), 1)  # the prefill leg ran too
        self.assertEqual(router.stop(), 0, router.output())


if __name__ == "__main__":
    unittest.main()
