"""The documentation (README.md and docs/*.md) cannot rot: every command in its ```bash blocks is
run, or checked against what it claims, here or by another test. Each command line (backslash
continuations joined, leading VAR=value assignments set aside) is sorted by its program; a command
of a kind this file does not know fails the test, so a new kind of documented command needs a
check before it can land.

  pdrouter ...                 started with the documentation's flags (--http / --discovery pointed at
                               ephemeral loopback ports), answers /health, stops cleanly;
                               `pdrouter --help` mentions every flag, endpoint and signal the
                               documentation names
  pdnode register ...          run by test_deploy_examples.ReadmeSidecarCommandsTest; here its
                               flags are checked against `pdnode register --help`
  pdnode sim ...               started (its --http/--register at a test router), registers
  pdnode keygen PREFIX         run with PREFIX moved to a temporary folder: writes PREFIX.key
                               (mode 0600) and PREFIX.pub
  curl ...                     the admin examples run in order against a router with the key
                               source the documentation's comment gives; the client example against a
                               router with simulated nodes, and must stream to [DONE]
  vllm serve / sglang          cannot run here: their --kv-transfer-config must be JSON with the
                               keys pdrouter's references (docs/design/wire-formats.md) give, and the node's
                               --port, http_port, proxy address and its sidecar command agree
  deploy/quickstart.sh         run by CTest integration.quickstart; its --help lists the options
                               the documentation names
  pdrouter-bench ...           run against a simulated node (target flags swapped, load cut to
                               3 short prompts); flags checked against `pdrouter-bench --help`
  tests/run.sh, cmake/ninja/ctest   the development commands tests/run.sh itself runs
Also: inline `pdrouter ...` / `pdnode ...` mentions use only flags their --help lists; the
endpoint tables name exactly the routes `pdrouter --help` lists (the route table) and the
operator-listener paragraph places them as the table does; the Metrics table matches the
families and labels /metrics exports; the error codes the documentation's tables name exist in the
sources.
"""

import json
import os
import re
import shlex
import subprocess
import tempfile
import unittest

from pd_fixture import PdCluster
from pdr_testlib import (ProcessHandle, doc_blocks, doc_file_text, doc_text, http_get, pdnode_path,
                         pdrouter_bench_path, pdrouter_help_routes, pdrouter_path)
from pdrouter_fixture import LISTENING, TIME_SCALE, Router
from sim_fixture import SimNode, sse_events
from test_deploy_examples import ROOT, on_loopback, readme_pdnode_register_commands

TIMEOUT = 20 * TIME_SCALE
# Where the documentation's deployment section puts pdrouter (HTTP 10001, discovery 36367). Not loopback:
# it is compared with the documentation's text only, nothing connects to it (commands that run go through
# on_loopback or have --router/--http-address replaced).
README_ROUTER_HOST = "10.0.0.1"
README_DISCOVERY_PORT = "36367"
README_HTTP = "localhost:10001"

# vLLM connectors: `kv_connector` name -> pdrouter dialect, and the kv_connector_extra_config keys
# docs/design/wire-formats.md documents for each (anything else in a README command is a typo or an
# unverified claim).
VLLM_CONNECTORS = {"MoRIIOConnector": "moriio", "P2pNcclConnector": "p2p-nccl",
                   "NixlConnector": "nixl", "MooncakeConnector": "mooncake",
                   "NixlPushConnector": "nixl-push"}
EXTRA_CONFIG_KEYS = {
    "moriio": {"proxy_ip", "proxy_ping_port", "http_port", "handshake_port", "notify_port",
               "read_mode", "host_ip", "backend", "transfer_timeout", "defer_timeout"},
    "p2p-nccl": {"proxy_ip", "proxy_port", "http_port"},
    "nixl": {"kv_lease_duration"},
    "mooncake": set(),
    "nixl-push": {"kv_lease_duration", "push_registration_timeout"},
}
SELF_REGISTERING = {"moriio": "proxy_ping_port", "p2p-nccl": "proxy_port"}
KV_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": None}


# --- reading the documentation ---------------------------------------------------------------

def readme_text():
    """README.md and docs/*.md, one text."""
    return doc_text()


def readme_commands():
    """[(line, env, argv, raw, context)] for every command in the documentation's bash/sh blocks.
    env: leading VAR=value assignments; context: the comment lines seen so far in the block
    (e.g. "# prefill, 10.0.0.11"); raw: the joined command text."""
    commands = []
    for start, text in doc_blocks("bash") + doc_blocks("sh"):
        lines = text.splitlines()
        i, context = 0, []
        while i < len(lines):
            line = lines[i]
            number = start + 1 + i
            if line.lstrip().startswith("#"):
                context.append(line.strip())
                i += 1
                continue
            if not line.strip():
                i += 1
                continue
            joined = line
            while True:
                if joined.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    joined = joined.rstrip()[:-1] + " " + lines[i]
                    continue
                try:
                    argv = shlex.split(joined, comments=True)
                    break
                except ValueError:  # a quoted argument (e.g. JSON) spanning lines
                    if i + 1 >= len(lines):
                        raise
                    i += 1
                    joined += "\n" + lines[i]
            i += 1
            env = {}
            while argv and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
                key, _, value = argv.pop(0).partition("=")
                env[key] = value
            commands.append((number, env, argv, joined.split(" #")[0].strip(), list(context)))
    return commands


def kind(argv, env):
    if not argv:
        return "env"
    program = argv[0]
    if program == "export":
        return "env"
    if program == "pdrouter":
        return "pdrouter-help" if "--help" in argv else "pdrouter"
    if program == "pdnode":
        sub = argv[1] if len(argv) > 1 else ""
        if "--help" in argv:
            return "pdnode-help"
        return {"register": "pdnode-register", "sim": "pdnode-sim", "keygen": "pdnode-keygen"}.get(sub, "unknown")
    if program == "curl":
        return "curl"
    if program == "pdrouter-bench":
        return "bench"
    if program == "vllm" and argv[1:2] == ["serve"]:
        return "vllm"
    if program in ("python", "python3") and argv[1:3] == ["-m", "sglang.launch_server"]:
        return "sglang"
    if program == "deploy/quickstart.sh":
        return "quickstart"
    if program == "tests/run.sh":
        return "run.sh"
    if program in ("cmake", "ninja", "ctest"):
        return "dev"
    # Run (image build) and rendered (manifests) by test_deploy_artifacts.py; here only their
    # flags and paths are checked (test_deploy_commands_name_real_flags_and_files).
    if program == "deploy/container/build-image.sh":
        return "build-image"
    if program == "kubectl" and argv[1:2] == ["apply"]:
        return "kubectl-apply"
    # The etcd replicas' example: etcd itself is started by test_etcd_replicas.py; here its flags
    # are checked against `etcd --help` (test_etcd_commands_name_real_flags).
    if program == "etcd":
        return "etcd"
    return "unknown"


def flag_value(argv, flag):
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def with_flag(argv, flag, value):
    """argv with `flag value` replaced (or appended)."""
    out, i, done = [], 0, False
    while i < len(argv):
        if argv[i] == flag:
            out += [flag, value]
            i += 2
            done = True
            continue
        out.append(argv[i])
        i += 1
    return out if done else out + [flag, value]


def flags_in(argv):
    return {a.split("=")[0] for a in argv if re.match(r"--[a-z]", a)}


def inline_commands(program):
    """argv of every inline `program ...` code span in the documentation (outside fenced blocks)."""
    text = re.sub(r"```.*?```", "", readme_text(), flags=re.S)
    spans = re.findall(r"`(%s\s[^`]*)`" % re.escape(program), text)
    return [s.split() for s in spans]


def help_text(*args):
    done = subprocess.run(list(args) + ["--help"], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, "%s --help exited %d:\n%s" % (args, done.returncode, done.stderr)
    return done.stdout + done.stderr


# --- the commands -----------------------------------------------------------------------------

class ReadmeCommandInventoryTest(unittest.TestCase):
    def test_every_command_is_of_a_checked_kind(self):
        commands = readme_commands()
        self.assertGreater(len(commands), 20)
        kinds = {}
        for line, env, argv, raw, _ in commands:
            k = kind(argv, env)
            self.assertNotEqual(k, "unknown", "%s: no test exercises %r: teach "
                                "test_readme_commands.py to check it" % (line, raw))
            kinds.setdefault(k, []).append(line)
        for needed in ("pdrouter", "pdrouter-help", "pdnode-register", "pdnode-sim", "curl",
                       "vllm", "sglang", "quickstart"):
            self.assertIn(needed, kinds)

    def test_pdnode_register_commands_are_the_ones_test_deploy_examples_runs(self):
        ours = [line for line, env, argv, _, _ in readme_commands()
                if kind(argv, env) == "pdnode-register"]
        theirs = [line for line, _ in readme_pdnode_register_commands()]
        self.assertEqual(ours, theirs)

    def test_deploy_commands_name_real_flags_and_files(self):
        commands = [(line, argv) for line, env, argv, _, _ in readme_commands()
                    if kind(argv, env) in ("build-image", "kubectl-apply")]
        self.assertTrue(commands)
        script_help = help_text(os.path.join(ROOT, "deploy", "container", "build-image.sh"))
        for line, argv in commands:
            if argv[0] == "kubectl":
                # -k DIR (a kustomization) or -f FILE, relative to the repository.
                for flag in ("-k", "-f"):
                    path = flag_value(argv, flag)
                    if path is not None:
                        self.assertTrue(os.path.exists(os.path.join(ROOT, path)), "%s" % line)
                        if flag == "-k":
                            self.assertTrue(os.path.isfile(os.path.join(ROOT, path, "kustomization.yaml")))
                continue
            for flag in flags_in(argv):
                self.assertIn(flag, script_help, "%s" % line)

    def test_etcd_commands_name_real_flags(self):
        commands = [(line, argv) for line, env, argv, _, _ in readme_commands()
                    if kind(argv, env) == "etcd"]
        self.assertTrue(commands, "the replicas example (docs/deploying.md) starts no etcd")
        etcd_help = help_text("/usr/bin/etcd")
        for line, argv in commands:
            for flag in flags_in(argv):
                self.assertIn(flag, etcd_help, "%s" % line)

    def test_quickstart_and_run_sh_exist(self):
        for path in ("deploy/quickstart.sh", "tests/run.sh"):
            self.assertTrue(os.access(os.path.join(ROOT, path), os.X_OK), path)
        with open(os.path.join(ROOT, "tests", "integration", "CMakeLists.txt")) as f:
            self.assertIn("deploy/quickstart.sh --once", f.read(),
                          "CTest must run the README's first command")

    def test_quickstart_help_lists_the_options_the_readme_names(self):
        text = readme_text()
        paragraph = re.search(r"`deploy/quickstart\.sh --help`[^\n]*(?:\n[^\n]+)*", text).group(0)
        out = help_text(os.path.join(ROOT, "deploy", "quickstart.sh"))
        for flag in set(re.findall(r"--[a-z][a-z-]*", paragraph)) - {"--help"}:
            self.assertIn(flag, out)
        for value in re.findall(r"`--transfer ([^`]+)`", paragraph)[0].split("|"):
            self.assertIn(value, out)

    def test_development_commands_name_real_options_and_targets(self):
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            cmake = f.read()
        with open(os.path.join(ROOT, "tests", "run.sh")) as f:
            run_sh = f.read()
        for line, env, argv, raw, _ in readme_commands():
            if kind(argv, env) != "dev":
                continue
            with self.subTest(readme_line=line):
                self.assertIn(argv[0], run_sh)
                for define in re.findall(r"-D(PDR_[A-Z_]+)=", raw):
                    self.assertIn(define, cmake)


class ReadmePdrouterCommandsTest(unittest.TestCase):
    def test_help_mentions_every_flag_endpoint_and_signal_the_readme_names(self):
        out = help_text(pdrouter_path())
        used = set()
        for _, env, argv, _, _ in readme_commands():
            if argv and argv[0] == "pdrouter":
                used |= flags_in(argv)
        for argv in inline_commands("pdrouter"):
            used |= flags_in(argv)
        self.assertTrue(used)
        for flag in sorted(used):
            self.assertIn(flag, out)
        text = doc_file_text("docs/endpoints.md")
        section = text[text.index("## Endpoints"):text.index("### Admin API")]
        for path in set(re.findall(r"`(?:GET|POST) (/[a-z0-9_/]+)", section)):
            self.assertIn(path, out)
        for sig in ("SIGTERM", "SIGINT", "SIGHUP"):
            self.assertIn(sig, out)

    def test_endpoint_tables_list_exactly_the_routed_endpoints(self):
        """The endpoint tables (docs/endpoints.md) are hand-written; pdrouter's --help list is the route table
        (router/route_table.cc) itself. They must name the same METHOD PATH pairs."""
        documented = set()
        for row in readme_text().splitlines():
            first_cell = re.match(r"\|([^|]*)\|", row)
            if first_cell and re.match(r"\s*`[A-Z]+ /", first_cell.group(1)):
                documented |= set(re.findall(r"`([A-Z]+) (/[^`\s]*)`", first_cell.group(1)))
        routed = {(method, path) for method, path, _ in pdrouter_help_routes()}
        self.assertEqual(sorted(documented - routed), [], "in the endpoint tables, not routed")
        self.assertEqual(sorted(routed - documented), [], "routed, not in the endpoint tables")

    def test_operator_listener_paragraph_matches_the_routes_placement(self):
        text = readme_text()
        paragraph = text[text.index("Operator listener:"):]
        paragraph = paragraph[:paragraph.index("\n\n")]
        admin_part, _, client_part = paragraph.partition("served only")
        _, _, client_part = client_part.partition("it keeps")

        def covered(path, spans):
            return any(path == s or (s.endswith("/*") and path.startswith(s[:-1])) for s in spans)

        admin_spans = re.findall(r"`(/[^`]*)`", admin_part)
        client_spans = re.findall(r"`(/[^`]*)`", client_part)
        self.assertTrue(admin_spans and client_spans, paragraph)
        for method, path, listener in pdrouter_help_routes():
            spans = {"admin": admin_spans, "client": client_spans, "both": client_spans}[listener]
            self.assertTrue(covered(path, spans), "%s %s (%s) is not where docs/endpoints.md puts it"
                            % (method, path, listener))
            if listener == "both":
                self.assertIn(path, paragraph)

    def test_every_pdrouter_command_starts_serves_and_stops(self):
        runs = [(line, argv) for line, env, argv, _, _ in readme_commands()
                if kind(argv, env) == "pdrouter"]
        self.assertGreaterEqual(len(runs), 3)
        for line, argv in runs:
            with self.subTest(readme_line=line):
                args = with_flag(with_flag(argv[1:], "--http", "127.0.0.1:0"),
                                 "--discovery", "tcp://127.0.0.1:0")
                config = flag_value(args, "--config")
                if config is not None:
                    # The file as documented, its node addresses moved onto loopback.
                    with open(os.path.join(ROOT, config), encoding="utf-8") as f:
                        text = on_loopback(f.read())
                    copy = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
                    self.addCleanup(os.unlink, copy.name)
                    with copy:
                        copy.write(text)
                    args = with_flag(args, "--config", copy.name)
                proc = ProcessHandle([pdrouter_path()] + args + ["--workers", "2"], name="pdrouter")
                try:
                    listening = proc.wait_for_line(LISTENING, timeout=TIMEOUT, streams=("stdout",))
                    self.assertIsNotNone(listening, "%s:\n%s" % (line, proc.output()))
                    host, port = re.search(LISTENING, listening).group(1).rsplit(":", 1)
                    code, body = http_get(host, int(port), "/health", timeout=TIMEOUT)
                    self.assertEqual((code, json.loads(body)), (200, {"status": "ok"}))
                finally:
                    code = proc.stop(timeout=TIMEOUT)
                self.assertEqual(code, 0, "%s:\n%s" % (line, proc.output()))


class ReadmePdnodeCommandsTest(unittest.TestCase):
    def test_flags_are_in_the_subcommands_help(self):
        used = {}
        block_argvs = [argv for _, env, argv, _, _ in readme_commands()
                       if argv and argv[0] == "pdnode"]
        for argv in block_argvs + inline_commands("pdnode"):
            used.setdefault(argv[1], set()).update(flags_in(argv))
        self.assertIn("register", used)
        self.assertIn("sim", used)
        for sub, flags in sorted(used.items()):
            with self.subTest(subcommand=sub):
                out = help_text(pdnode_path(), sub)
                for flag in sorted(flags - {"--help"}):
                    self.assertIn(flag, out, "pdnode %s --help" % sub)

    def test_keygen_commands_write_a_key_pair(self):
        runs = [(line, argv) for line, env, argv, _, _ in readme_commands()
                if kind(argv, env) == "pdnode-keygen"]
        self.assertTrue(runs, "the documentation has no `pdnode keygen` command")
        with tempfile.TemporaryDirectory(prefix="pdr-readme-keygen-") as folder:
            for line, argv in runs:
                with self.subTest(readme_line=line):
                    prefix = os.path.join(folder, os.path.basename(argv[-1]))
                    proc = ProcessHandle([pdnode_path(), "keygen"] + argv[2:-1] + [prefix], name="keygen")
                    self.assertEqual(proc.wait(TIMEOUT), 0, "%s:\n%s" % (line, proc.output()))
                    self.assertEqual(os.stat(prefix + ".key").st_mode & 0o777, 0o600)
                    with open(prefix + ".pub") as f:
                        self.assertIn("public-key", f.read())

    def test_sim_commands_register(self):
        runs = [(line, argv) for line, env, argv, _, _ in readme_commands()
                if kind(argv, env) == "pdnode-sim"]
        self.assertTrue(runs)
        for line, argv in runs:
            with self.subTest(readme_line=line):
                with Router() as router:
                    args = with_flag(with_flag(argv[2:], "--http", "127.0.0.1:0"),
                                     "--register", router.discovery)
                    # Side channels on ephemeral ports, so parallel test runs do not collide.
                    for flag in ("--handshake-port", "--notify-port", "--kv-port"):
                        if flag not in args:
                            args += [flag, "0"]
                    sim = ProcessHandle([pdnode_path(), "sim"] + args, name="pdnode-sim",
                                        log_dir=router.dir.name)
                    try:
                        started = sim.wait_for_line(r"pdnode sim listening http=(\S+)",
                                                    timeout=TIMEOUT, streams=("stdout",))
                        self.assertIsNotNone(started, sim.output())
                        address = re.search(r"http=(\S+)", started).group(1)
                        inst, _ = router.wait_for(lambda: router.instance(address), timeout=10)
                        self.assertEqual(inst["role"], flag_value(argv, "--role"))
                        self.assertEqual(inst["dialect"], flag_value(argv, "--connector"))
                        if flag_value(argv, "--transfer-mode"):
                            self.assertEqual(inst["transfer_mode"], flag_value(argv, "--transfer-mode"))
                        self.assertEqual(inst["state"], "up")
                    finally:
                        self.assertEqual(sim.stop(timeout=TIMEOUT), 0, sim.output())
                router.dir.cleanup()


class ReadmeBenchCommandsTest(unittest.TestCase):
    """Every documented `pdrouter-bench` command runs against a simulated node: its target flags point
    at the sim, and the load is cut to a few short prompts (the documented scenario sends 200 prompts
    of 7,500 tokens); every other flag runs as written and the run must succeed."""

    SHRINK = {"--num-prompts": "3", "--random-input-len": "20", "--random-output-len": "4"}

    def test_commands_run_against_a_sim(self):
        argvs = [argv for _, env, argv, _, _ in readme_commands() if kind(argv, env) == "bench"]
        self.assertGreaterEqual(len(argvs), 2, "the documentation shows how to run pdrouter-bench")
        path = pdrouter_bench_path()
        help_out = help_text(path)
        for argv in argvs + inline_commands("pdrouter-bench"):
            for flag in sorted(flags_in(argv) - {"--help"}):
                self.assertIn(flag, help_out, "pdrouter-bench --help")
        sim = SimNode("--role", "decode", "--decode-us-per-token", "100")
        try:
            with tempfile.TemporaryDirectory() as work:
                for argv in argvs:
                    if "--help" in argv:
                        continue
                    args, i = [], 1
                    while i < len(argv):
                        flag = argv[i]
                        if flag in ("--base-url", "--host", "--port"):
                            i += 2
                            continue
                        if flag == "--json":
                            args += [flag, os.path.join(work, os.path.basename(argv[i + 1]))]
                            i += 2
                            continue
                        if flag in self.SHRINK:
                            args += [flag, self.SHRINK[flag]]
                            i += 2
                            continue
                        args.append(flag)
                        i += 1
                    for flag, value in self.SHRINK.items():
                        if flag not in args:
                            args += [flag, value]
                    done = subprocess.run([path, "--port", str(sim.port), "--no-progress", *args],
                                          capture_output=True, text=True, timeout=TIMEOUT)
                    self.assertEqual(done.returncode, 0, "%s\n%s\n%s" % (argv, done.stdout,
                                                                         done.stderr))
                    self.assertIn("Successful requests:                    3", done.stdout)
                    if "--json" in argv:
                        with open(os.path.join(work, os.path.basename(argv[argv.index("--json") + 1]))) as f:
                            self.assertEqual(json.load(f)["completed"], 3)
        finally:
            self.assertEqual(sim.stop(), 0)


class ReadmeNodeLaunchCommandsTest(unittest.TestCase):
    """The vLLM / SGLang commands cannot run here: check them against pdrouter's references."""

    def launches(self):
        """[(line, env, argv, context, sidecar argv or None, exported env)] in documentation order."""
        commands = readme_commands()
        result, exported = [], {}
        for n, (line, env, argv, _, context) in enumerate(commands):
            k = kind(argv, env)
            if k == "env" and argv and argv[0] == "export":
                for assignment in argv[1:]:
                    key, _, value = assignment.partition("=")
                    exported[key] = value
            if k not in ("vllm", "sglang"):
                continue
            # A node's sidecar command directly follows its launch command.
            after = commands[n + 1] if n + 1 < len(commands) else None
            sidecar = after[2] if after and kind(after[2], after[1]) == "pdnode-register" else None
            result.append((line, env, argv, context, sidecar, dict(exported)))
        return result

    def test_every_connector_has_a_prefill_and_a_decode_launch(self):
        seen = set()
        for line, env, argv, context, _, _ in self.launches():
            role, _ = self.role_and_host(line, context)
            if argv[0] == "vllm":
                config = json.loads(flag_value(argv, "--kv-transfer-config"))
                seen.add((VLLM_CONNECTORS[config["kv_connector"]], role))
            else:
                seen.add(("sglang", role))
        for dialect in ("moriio", "p2p-nccl", "nixl", "mooncake", "sglang", "nixl-push"):
            for role in ("prefill", "decode"):
                self.assertIn((dialect, role), seen)

    def role_and_host(self, line, context):
        for comment in reversed(context):
            m = re.match(r"#\s*(prefill|decode),\s*([0-9.]+)", comment)
            if m:
                return m.group(1), m.group(2)
        self.fail("%s: no '# prefill|decode, HOST' comment above the launch" % line)

    def test_launch_commands_agree_with_the_references_and_their_sidecars(self):
        for line, env, argv, context, sidecar, exported in self.launches():
            with self.subTest(readme_line=line):
                role, host = self.role_and_host(line, context)
                port = flag_value(argv, "--port")
                self.assertIsNotNone(port, "%s: no --port" % line)
                model = argv[2] if argv[0] == "vllm" else flag_value(argv, "--model-path")
                if argv[0] == "vllm":
                    dialect = self.check_vllm(line, env, argv, role, host, port, exported)
                else:
                    dialect = "sglang"
                    self.assertEqual(flag_value(argv, "--disaggregation-mode"), role)
                if dialect in SELF_REGISTERING:
                    self.assertIsNone(sidecar, "%s: %s nodes register themselves"
                                      % (line, dialect))
                    continue
                self.assertIsNotNone(sidecar, "%s: a %s node needs `pdnode register`"
                                     % (line, dialect))
                self.assertEqual(flag_value(sidecar, "--role"), role)
                self.assertEqual(flag_value(sidecar, "--connector"), dialect)
                self.assertEqual(flag_value(sidecar, "--http-address"), "%s:%s" % (host, port))
                self.assertEqual(flag_value(sidecar, "--model"), model)
                self.assertEqual(flag_value(sidecar, "--router"),
                                 "tcp://%s:%s" % (README_ROUTER_HOST, README_DISCOVERY_PORT))
                bootstrap = flag_value(sidecar, "--bootstrap-port")
                if dialect == "mooncake" and role == "prefill":
                    self.assertEqual(env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT"), bootstrap)
                if dialect == "sglang" and role == "prefill":
                    self.assertEqual(flag_value(argv, "--disaggregation-bootstrap-port"), bootstrap)
                if role == "decode":
                    self.assertIsNone(bootstrap, "only prefills run a bootstrap server")

    def check_vllm(self, line, env, argv, role, host, port, exported):
        raw = flag_value(argv, "--kv-transfer-config")
        self.assertIsNotNone(raw, "%s: no --kv-transfer-config" % line)
        config = json.loads(raw)
        self.assertIn(config.get("kv_connector"), VLLM_CONNECTORS)
        dialect = VLLM_CONNECTORS[config["kv_connector"]]
        self.assertIn(config.get("kv_role"), KV_ROLES)
        if KV_ROLES[config["kv_role"]] is not None:
            self.assertEqual(KV_ROLES[config["kv_role"]], role)
        extra = config.get("kv_connector_extra_config", {})
        self.assertLessEqual(set(extra), EXTRA_CONFIG_KEYS[dialect],
                             "%s: keys not in the connector's documented set" % line)
        if dialect in SELF_REGISTERING:
            self.assertEqual(extra.get("proxy_ip"), README_ROUTER_HOST)
            self.assertEqual(str(extra.get(SELF_REGISTERING[dialect])), README_DISCOVERY_PORT)
            self.assertEqual(str(extra.get("http_port")), port, "http_port must equal --port")
        if dialect == "p2p-nccl":
            self.assertEqual(exported.get("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"), "1")
        if dialect == "nixl":
            self.assertEqual(env.get("VLLM_NIXL_SIDE_CHANNEL_HOST"), host,
                             "the side channel host must be the node's routable IP")
        return dialect


def readme_curls(admin):
    """[(line, raw)] of the documentation's curl commands: the admin ones or the others."""
    result = []
    for line, env, argv, raw, _ in readme_commands():
        if kind(argv, env) == "curl" and ("/admin/" in raw or "/instances/" in raw) == admin:
            result.append((line, raw))
    return result


def run_curl(test, line, raw, http, env):
    """Runs a documented curl command through bash with localhost:10001 pointed at `http` and the
    documentation's node addresses moved onto loopback (on_loopback), plus -sS,
    a timeout and the status code on a last line. Returns (status, body text)."""
    test.assertIn(README_HTTP, raw, "%s" % line)
    command = on_loopback(raw).replace(README_HTTP, http).replace(
        "curl ", "curl -sS --max-time %d -w '\\n%%{http_code}' " % int(TIMEOUT), 1)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                          timeout=TIMEOUT + 5, env=dict(os.environ, **env))
    test.assertEqual(done.returncode, 0, "%s: %s" % (line, done.stderr))
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


class ReadmeAdminCurlTest(unittest.TestCase):
    KEY = "readme-admin-key"

    def test_admin_examples_run_in_order(self):
        commands = readme_curls(admin=True)
        self.assertGreaterEqual(len(commands), 3)
        # The key source the documentation's `export` line comment gives, as the topology.
        topology = None
        for line, env, argv, raw, context in readme_commands():
            if argv[:1] == ["export"] and "PDR_ADMIN_KEY" in raw:
                source = line.source_line()
                topology = re.search(r"# topology: (.*)$", source).group(1)
        self.assertIsNotNone(topology, "documentation: no `export PDR_ADMIN_KEY=... # topology: ...`")
        env = {"PDR_ADMIN_KEY": self.KEY}
        with Router(topology_yaml=topology + "\n", env=env) as router:
            added = None
            for line, raw in commands:
                with self.subTest(readme_line=line):
                    status, body = run_curl(self, line, raw, router.http, env)
                    self.assertIn(status, (200, 201), "%s: %s" % (line, body))
                    doc = json.loads(body)
                    if " -d " in raw or "-d\n" in raw:
                        self.assertEqual(status, 201)
                        added = doc["http_address"]
                    elif raw.rstrip().endswith("/drain"):
                        inst = router.instance(added)
                        self.assertEqual(inst["state"], "draining")
                    else:
                        self.assertIn("instances", doc)
            self.assertIsNotNone(added)
            self.assertEqual(router.instance(added)["source"], "admin")
        router.dir.cleanup()


class ReadmeClientCurlAndMetricsTest(unittest.TestCase):
    """The client example against a router with simulated nodes, then /metrics against the
    Metrics table (docs/metrics.md)."""

    @classmethod
    def setUpClass(cls):
        curls = readme_curls(admin=False)
        model = json.loads(re.search(r"-d '(\{.*\})'", curls[0][1]).group(1))["model"]
        # The load scrape on (its per-node families have samples only for nodes it read), the
        # decode with its engine model (the KV usage gauges need a node that reports one).
        cls.cluster = PdCluster("moriio", transfer_mode="WRITE", prefills=1, decodes=1,
                                topology="load_signals:\n  scrape_engine_metrics: true\n  interval_ms: 100\n"
                                         "  timeout_ms: 100\n  stale_after_ms: 3600000\n",
                                prefill_flags=("--model", model),
                                decode_flags=("--model", model, "--engine", "vllm"))

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_client_example_streams_to_done(self):
        curls = readme_curls(admin=False)
        self.assertTrue(curls)
        for line, raw in curls:
            with self.subTest(readme_line=line):
                status, body = run_curl(self, line, raw, self.cluster.router.http, {})
                self.assertEqual(status, 200, body)
                events = sse_events(body.encode())
                self.assertEqual(events[-1], "[DONE]")
                self.assertFalse(any("error" in json.loads(e) for e in events[:-1]), body)

    def readme_metrics(self):
        section = doc_file_text("docs/metrics.md")
        documented = {}
        for row in section.splitlines():
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            if len(cells) < 3 or not cells[0].startswith("`pdrouter_"):
                continue
            labels = set(re.findall(r"`([a-z_]+)`", cells[1]))
            for name in re.findall(r"`(pdrouter_[a-z_]+)`", cells[0]):
                documented[name] = labels
        return documented

    def exported_metrics(self):
        code, _, body = self.cluster.get("/metrics")
        self.assertEqual(code, 200)
        exported = {}
        histograms = set()  # their samples (_bucket, _sum, _count) count as the family; `le` is implied
        for line in body.decode().splitlines():
            m = re.match(r"# TYPE (\S+) (\S+)", line)
            if m:
                exported.setdefault(m.group(1), set())
                if m.group(2) == "histogram":
                    histograms.add(m.group(1))
                continue
            if line.startswith("#") or not line:
                continue
            m = re.match(r"([a-z_]+)(?:\{(.*)\})? ", line)
            name = m.group(1)
            labels = set(re.findall(r'([a-z_]+)="', m.group(2) or ""))
            stem = re.sub(r"_(bucket|sum|count)$", "", name)
            if stem != name and stem in histograms:
                name = stem
                labels.discard("le")
            exported.setdefault(name, set()).update(labels)
        return exported

    def test_metrics_table_matches_what_pdrouter_exports(self):
        self.test_client_example_streams_to_done()  # so request-path families have samples
        decode = self.cluster.decodes[0].http_address
        self.cluster.router.wait_for(
            lambda: 'pdrouter_node_rank_engine_kv_cache_usage{node="%s",rank="0"}' % decode in self.cluster.router.metrics(),
            timeout=10)
        documented, exported = self.readme_metrics(), self.exported_metrics()
        self.assertEqual(sorted(set(exported) - set(documented)), [],
                         "exported but not in docs/metrics.md's table")
        self.assertEqual(sorted(set(documented) - set(exported)), [],
                         "in docs/metrics.md's table but not exported")
        for name, labels in sorted(documented.items()):
            self.assertEqual(exported[name], labels, name)

    def test_error_codes_in_the_readme_exist_in_the_sources(self):
        text = readme_text()
        sources = ""
        # router/ holds router/http/, discovery/ holds discovery/config/ and discovery/sidecar/,
        # proto/ holds proto/base/ (os.walk goes down into them).
        for sub in ("router", "discovery", "node", "proto", "transfer/net"):
            for dirpath, _, files in os.walk(os.path.join(ROOT, sub)):
                for name in files:
                    if name.endswith(".cc"):
                        with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                            sources += f.read()
        rows = [r for r in text.splitlines() if re.match(r"\|\s*(\d{3}|`pdnode sim`|503|502|504)", r)]
        codes = set()
        for row in rows:
            codes |= set(re.findall(r"`([a-z]+(?:_[a-z]+)+)`", row))
        self.assertGreater(len(codes), 10)
        for code in sorted(codes):
            self.assertIn('"%s"' % code, sources, "the documentation names error code %s" % code)


if __name__ == "__main__":
    unittest.main()
