"""The deployment documentation stays runnable: every topology under deploy/ and every ```yaml block
in README.md and docs/*.md is loaded by the real pdrouter (which rejects unknown keys), /status lists
exactly the static instances the text declares, and every `pdnode register ...` command in them
registers a node (its flags run unchanged, only --router and --http-address point at a test router
and a local /health server)."""

import glob
import os
import re
import shlex
import shutil
import ssl
import subprocess
import tempfile
import unittest

from pdr_testlib import HealthServer, ProcessHandle, doc_blocks, free_port, pdnode_path
from pdrouter_fixture import Router

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOPOLOGIES = sorted(glob.glob(os.path.join(ROOT, "deploy", "topologies", "*.yaml"))) + [
    os.path.join(ROOT, "deploy", "topology.example.yaml")]
EXPECTED_DIALECT_FILES = {"moriio", "nixl", "mooncake", "p2p-nccl", "sglang", "nixl-push"}
# The documentation's node network (docs/'s and deploy/'s private /24 that DOC_NETWORK matches)
# is moved onto loopback (127.0.10.0/24) before a test router loads or registers it: a registered address receives
# real traffic, so every address a test uses is in 127.0.0.0/8. Only the host part changes; ports,
# roles and counts stay as documented.
DOC_NETWORK = re.compile(r"\b10\.0\.0\.(\d{1,3})\b")


def on_loopback(text):
    return DOC_NETWORK.sub(r"127.0.10.\1", text)


# The documentation's TLS files (/etc/pdrouter/tls/NAME) are made for real before a test router
# loads a text naming them: one self-signed certificate (no key usage limits, so it serves as a
# server, client and CA certificate alike) and its key, every *.crt the certificate and every
# *.key the key.
DOC_TLS_FILE = re.compile(r"/etc/pdrouter/tls/[\w.-]+")


def with_tls_files(text, directory):
    """`text` with its documentation TLS paths pointing at real files in `directory`; and whether
    it names any (the listeners then speak TLS)."""
    names = set(DOC_TLS_FILE.findall(text))
    if not names:
        return text, False
    crt, key = os.path.join(directory, "doc.crt"), os.path.join(directory, "doc.key")
    if not os.path.exists(crt):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    for name in names:
        text = text.replace(name, crt if name.endswith(".crt") else key)
    return text, True


def tls_client_context(directory):
    """Trusts nothing in particular (the documentation's certificate is made here) and presents
    that certificate, for operator listeners that ask for one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(os.path.join(directory, "doc.crt"), os.path.join(directory, "doc.key"))
    return context


# pdnode register flags whose value /status shows under this key.
NUMERIC_FLAGS = {"--dp-size": "dp_size", "--tp-size": "tp_size", "--bootstrap-port": "bootstrap_port"}


# --- what a text declares, read without a YAML library (pdrouter's loader is yaml-cpp; PyYAML,
# installed for the tests by deploy/install-deps.sh --tests, only cross-checks this reader) ---

def _scalar(text):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def declared_instances(yaml_text):
    """[(role, http_address)] of the top-level `instances:` list. Understands the two styles the
    docs use: block items (`- role: x` / `  http_address: "..."`) and flow items
    (`- {role: x, http_address: "..."}`); anything else in an item fails the test loudly."""
    lines = yaml_text.splitlines()
    items, current, inside = [], None, False
    for line in lines:
        stripped = line.split(" #")[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not stripped:
            continue
        if not line.startswith((" ", "-")):
            inside = re.match(r"instances\s*:\s*(\[\s*\])?\s*$", stripped) is not None
            continue
        if not inside:
            continue
        item = re.match(r"\s*-\s+(.*)$", stripped)
        if item:
            current = {}
            items.append(current)
            body = item.group(1)
        else:
            body = stripped.strip()
        if body.startswith("{"):
            assert body.endswith("}"), "flow item must fit on one line: " + line
            parts = [p for p in body[1:-1].split(",") if p.strip()]
        else:
            parts = [body]
        for part in parts:
            key, sep, value = part.partition(":")
            if sep and key.strip() in ("role", "http_address"):
                current[key.strip()] = _scalar(value)
    result = []
    for item in items:
        assert "role" in item and "http_address" in item, "cannot read instance %r" % item
        result.append((item["role"], item["http_address"]))
    return result


def readme_pdnode_register_commands():
    """(line, argv after `pdnode`) of every `pdnode register ...` command in the documentation's
    code blocks, with backslash continuations joined and shell comments dropped."""
    commands = []
    for start, text in doc_blocks("bash") + doc_blocks("sh") + doc_blocks(""):
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            if re.match(r"\s*pdnode\s+register\b", lines[i]):
                joined, first = lines[i], start + 1 + i
                while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    joined = joined.rstrip()[:-1] + " " + lines[i]
                argv = shlex.split(joined, comments=True)
                commands.append((first, argv[1:]))
            i += 1
    return commands


def instance_keys(router):
    """The static instances the router lists. A node left running by another test on this machine
    may still beat to a discovery port this router now holds and show up as registered: that is
    not the topology's doing, so only the static entries are compared."""
    return sorted((i["role"], i["http_address"]) for i in static_instances(router))


def static_instances(router):
    return [i for i in router.status()["instances"] if i["source"] == "static"]


class DeclaredInstancesParserTest(unittest.TestCase):
    """The reader above agrees with a real YAML parser where one is installed."""

    def test_matches_pyyaml(self):
        import yaml  # python3-yaml, from deploy/install-deps.sh --tests
        texts = []
        for path in TOPOLOGIES:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        texts += [text for _, text in doc_blocks("yaml")]
        for text in texts:
            doc = yaml.safe_load(text) or {}
            expected = [(i["role"], i["http_address"]) for i in (doc.get("instances") or [])]
            self.assertEqual(declared_instances(text), expected)


def readme_key_file():
    """The README's example client key file (the ```text block that starts `# clients.keys`)."""
    return next(text for _, text in doc_blocks("text") if text.startswith("# clients.keys"))


class TopologyFilesTest(unittest.TestCase):
    def check_topology(self, text, label):
        text = on_loopback(text)
        match = re.search(r"(?<![a-z_])keys_file: ([^\s\"]+)", text)
        if match:  # a client key file the text names: the README's example, in a directory of its own
            keys_dir = tempfile.mkdtemp(prefix="pdr-readme-keys-")
            self.addCleanup(shutil.rmtree, keys_dir, True)
            path = os.path.join(keys_dir, os.path.basename(match.group(1)))
            with open(path, "w", encoding="utf-8") as f:
                f.write(readme_key_file())
            text = text.replace(match.group(0), "keys_file: " + path)
        expected = sorted(declared_instances(text))
        tls_dir = tempfile.mkdtemp(prefix="pdr-doc-tls-")
        self.addCleanup(shutil.rmtree, tls_dir, True)
        text, tls = with_tls_files(text, tls_dir)
        context = tls_client_context(tls_dir) if tls else None
        try:
            client_tls = re.search(r"^listeners:\n(?:[ #].*\n)*?  tls:", text, re.M) is not None
            router = Router(topology_yaml=text, ssl_context=context if client_tls else None,
                            admin_ssl_context=context)
        except RuntimeError as e:
            self.fail("%s is not a valid topology:\n%s" % (label, e))
        try:
            self.assertEqual(instance_keys(router), expected, label)
            for inst in static_instances(router):
                self.assertEqual(inst["state"], "up", label)
        finally:
            self.assertEqual(router.stop(), 0, label)
            router.dir.cleanup()

    def test_one_topology_per_dialect_exists(self):
        names = {os.path.basename(p)[:-len(".yaml")] for p in TOPOLOGIES[:-1]}
        self.assertEqual(names & EXPECTED_DIALECT_FILES, EXPECTED_DIALECT_FILES)

    def test_deploy_topologies_load_and_list_their_static_instances(self):
        for path in TOPOLOGIES:
            with self.subTest(path=os.path.relpath(path, ROOT)):
                with open(path, encoding="utf-8") as f:
                    self.check_topology(f.read(), os.path.relpath(path, ROOT))

    def test_static_dialect_files_declare_their_connector(self):
        # Dialects whose nodes cannot register themselves must come with static instances of
        # that connector, so the file on its own routes something.
        for dialect in ("nixl", "mooncake", "sglang", "nixl-push"):
            path = os.path.join(ROOT, "deploy", "topologies", dialect + ".yaml")
            with open(path, encoding="utf-8") as f:
                text = f.read()
            self.assertTrue(declared_instances(text), path)
            with Router(topology_yaml=on_loopback(text)) as router:
                dialects = {i["dialect"] for i in router.status()["instances"]}
                self.assertEqual(dialects, {dialect}, path)
            router.dir.cleanup()

    def test_readme_yaml_blocks_are_valid_topologies(self):
        blocks = doc_blocks("yaml")
        self.assertTrue(blocks, "the documentation has no ```yaml block")
        for line, text in blocks:
            with self.subTest(readme_line=line):
                self.check_topology(text, str(line))


class ReadmeSidecarCommandsTest(unittest.TestCase):
    def test_every_pdnode_register_command_registers(self):
        commands = readme_pdnode_register_commands()
        self.assertGreaterEqual(len(commands), 1, "the documentation has no `pdnode register` command")
        for line, argv in commands:
            with self.subTest(readme_line=line):
                self.run_command(line, argv)

    def run_command(self, line, argv):
        self.assertEqual(argv[0], "register")
        health = HealthServer(status=200)
        self.addCleanup(health.close)
        curve = "--curve-server-key" in argv
        replacements = {"--http-address": health.address, "--health-url": "http://%s/health" % health.address}
        if curve:
            # The documentation's CURVE sidecar: real keys from `pdnode keygen`, a router with a CURVE
            # endpoint that lists the node's key, and the command's key flags pointed at them.
            keys = tempfile.mkdtemp(prefix="pdr-readme-keys-")
            self.addCleanup(shutil.rmtree, keys, True)
            for name in ("router", "node"):
                keygen = ProcessHandle([pdnode_path(), "keygen", os.path.join(keys, name)], name="keygen")
                self.assertEqual(keygen.wait(10), 0, keygen.output())
            shutil.copy(os.path.join(keys, "node.pub"), os.path.join(keys, "clients.txt"))
            port = free_port()
            router = Router('listeners: {discovery_curve: "tcp://127.0.0.1:%d"}\n'
                            "discovery: {curve: {secret_key_file: %s/router.key, "
                            "allowed_client_keys_file: %s/clients.txt}}\n" % (port, keys, keys))
            replacements.update({"--router": "tcp://127.0.0.1:%d" % port,
                                 "--curve-server-key": os.path.join(keys, "router.pub"),
                                 "--curve-key": os.path.join(keys, "node.key")})
        else:
            router = Router()
            replacements["--router"] = router.discovery
        self.addCleanup(router.dir.cleanup)  # cleanups run last-in first-out: after stop()
        self.addCleanup(router.stop)
        # The documentation's own flags, except where the node and the router are.
        args, i, role, connector, model, numeric = [], 1, None, None, None, {}
        while i < len(argv):
            flag = argv[i]
            value = argv[i + 1] if i + 1 < len(argv) else None
            if flag in replacements:
                self.assertIsNotNone(value, "%s: %s without a value" % (line, flag))
                args += [flag, replacements[flag]]
                i += 2
                continue
            if flag == "--zmq-address" and value and re.fullmatch(r"[0-9.]+:[0-9]+", value):
                # A host:port side channel (NIXL push) is on the node's own host, here loopback:
                # a node that does not authenticate may name only its own address.
                args += [flag, "%s:%s" % (health.address.rsplit(":", 1)[0], value.rsplit(":", 1)[1])]
                i += 2
                continue
            if flag == "--role":
                role = {"P": "prefill", "D": "decode"}.get(value, value)
            elif flag == "--connector":
                connector = value
            elif flag == "--model":
                model = value
            elif flag in NUMERIC_FLAGS:
                numeric[NUMERIC_FLAGS[flag]] = int(value)
            args.append(flag)
            i += 1
        self.assertIn("--router", args, "%s: no --router" % line)
        self.assertIn("--http-address", args, "%s: no --http-address" % line)
        sidecar = ProcessHandle([pdnode_path(), "register"] + args, name="pdnode",
                                log_dir=router.dir.name)
        self.addCleanup(sidecar.stop)

        def registered():
            if sidecar.returncode is not None:
                raise AssertionError("%s: pdnode exited %d:\n%s" % (
                    line, sidecar.returncode, sidecar.output()))
            return router.instance(health.address)

        inst, _ = router.wait_for(registered, timeout=10.0, interval=0.05)
        self.assertEqual(inst["role"], role, "%s" % line)
        self.assertEqual(inst["state"], "up", "%s" % line)
        if connector is not None:
            self.assertEqual(inst["dialect"], connector, "%s" % line)
        if model is not None:
            self.assertEqual(inst["model"], model, "%s" % line)
        for key, value in numeric.items():
            self.assertEqual(inst[key], value, "%s: %s" % (line, key))
        self.assertEqual(inst["admission"], "curve" if curve else "address", "%s" % line)
        self.assertEqual(sidecar.stop(), 0, "%s:\n%s" % (line, sidecar.output()))


if __name__ == "__main__":
    unittest.main()
