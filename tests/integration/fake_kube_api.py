"""A fake Kubernetes API server for pod discovery tests: real HTTP/1.1 on 127.0.0.1:0, serving
core/v1 pods as the API documents them:

  * GET /api/v1/namespaces/NS/pods?labelSelector=SEL  -> a PodList with
    metadata.resourceVersion; SEL as the API reads it (parse_selector: k, !k, k=v, k==v, k!=v,
    k in (a,b), k notin (a,b), ',' = AND), 400 BadRequest when it does not parse;
  * the same with watch=1&resourceVersion=RV[&allowWatchBookmarks=true][&timeoutSeconds=T] -> a
    chunked stream of JSON lines {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}:
    first every change after RV, then changes as the test makes them; HTTP 410 (a Status body)
    when RV is older than the last compact();
  * a bearer token, when one is set: anything else gets 401 (a Status body).

The test drives it: put_pod / delete_pod (each bumps the resourceVersion), bookmark(),
gone_event() (an ERROR 410 line on open streams), raw_line() (any bytes, e.g. bad JSON),
compact(), close_watches() (ends every open stream cleanly). `requests` records each request's
path and Authorization header.
"""

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def pod(name, ip, role=None, ready=True, phase="Running", labels=None, annotations=None,
        deleting=False, uid=None):
    """A core/v1 Pod with what pod discovery reads (and a few fields it must skip)."""
    all_labels = {"app": "vllm"}
    if role is not None:
        all_labels["pdrouter.io/role"] = role
    all_labels.update(labels or {})
    metadata = {"name": name, "namespace": "llm", "uid": uid or f"uid-{name}",
                "labels": all_labels, "annotations": dict(annotations or {}),
                "creationTimestamp": "2026-11-26T10:00:00Z",
                "ownerReferences": [{"kind": "ReplicaSet", "name": "vllm-abc"}]}
    metadata["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "x" * 5000
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-26T10:05:00Z"
    status = {"phase": phase, "podIP": ip, "hostIP": "127.0.0.1",
              "conditions": [{"type": "Initialized", "status": "True"},
                             {"type": "Ready", "status": "True" if ready else "False"},
                             {"type": "ContainersReady", "status": "True" if ready else "False"}],
              "containerStatuses": [{"name": "vllm", "ready": ready, "restartCount": 0}]}
    return {"kind": "Pod", "apiVersion": "v1", "metadata": metadata,
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            "status": status}


class SelectorError(ValueError):
    pass


_SELECTOR_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|[^\s!=(),<>]+|[<>])")


def parse_selector(text):
    """A label selector as the API server reads labelSelector (apimachinery labels.Parse): terms
    joined by ',' (AND), each `k`, `!k`, `k=v`, `k==v`, `k!=v` (true without k), `k in (a,b)` or
    `k notin (a,b)` (true without k). Returns a list of predicates over a labels dict; raises
    SelectorError where the API answers 400 BadRequest."""
    tokens = []
    pos = 0
    while pos < len(text):
        m = _SELECTOR_TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise SelectorError(f"unexpected {text[pos:]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    out = []
    i = 0

    def take():
        nonlocal i
        if i >= len(tokens):
            raise SelectorError("unexpected end")
        i += 1
        return tokens[i - 1]

    def word(t):
        if t in ("!=", "==", "=", "!", "(", ")", ",", "<", ">"):
            raise SelectorError(f"expected a word, found {t!r}")
        return t

    while tokens and i < len(tokens):
        t = take()
        if t == "!":
            key = word(take())
            out.append(lambda labels, k=key: k not in labels)
        else:
            key = word(t)
            op = tokens[i] if i < len(tokens) else ","
            if op == ",":
                out.append(lambda labels, k=key: k in labels)
            else:
                take()
                if op in ("=", "==", "!="):
                    value = ""
                    if i < len(tokens) and tokens[i] != ",":
                        value = word(take())
                    if op == "!=":
                        out.append(lambda labels, k=key, v=value: labels.get(k) != v)
                    else:
                        out.append(lambda labels, k=key, v=value: labels.get(k) == v)
                elif op in ("in", "notin"):
                    if take() != "(":
                        raise SelectorError("expected (")
                    values = set()
                    while True:
                        values.add(word(take()))
                        sep = take()
                        if sep == ")":
                            break
                        if sep != ",":
                            raise SelectorError("expected , or )")
                    if op == "in":
                        out.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
                    else:
                        out.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
                else:
                    raise SelectorError(f"unsupported operator {op!r}")
        if i < len(tokens):
            if take() != ",":
                raise SelectorError("expected ,")
            if i >= len(tokens):
                raise SelectorError("a selector cannot end with ','")
    return out


def status_object(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeKubeApi:
    def __init__(self, namespace="llm", token=None, tls=None):
        """tls: None for plain HTTP, or (certificate file, key file) to serve https like a real
        API server (the handshake runs in the accepting thread; a client that refuses the
        certificate only ends its own connection)."""
        self.namespace = namespace
        self.token = token
        self.cond = threading.Condition()
        self.rv = 100
        self.pods = {}         # name -> pod dict
        self.log = []          # (seq, rv or None, labels or None, line bytes)
        self.seq = 0
        self.compacted_below = 0
        self.close_generation = 0
        self.requests = []     # (path, authorization header)
        self.watching = 0      # open watch streams
        self.closing = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                fake._serve(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if tls is not None:
            import ssl
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.url = f"https://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    # --- driven by the test ------------------------------------------------------------------
    def _append(self, rv, labels, line):
        self.seq += 1
        self.log.append((self.seq, rv, labels, line))
        self.cond.notify_all()

    def _event(self, kind, obj):
        return (json.dumps({"type": kind, "object": obj}) + "\n").encode()

    def put_pod(self, p):
        with self.cond:
            self.rv += 1
            p = json.loads(json.dumps(p))
            p["metadata"]["resourceVersion"] = str(self.rv)
            kind = "MODIFIED" if p["metadata"]["name"] in self.pods else "ADDED"
            self.pods[p["metadata"]["name"]] = p
            self._append(self.rv, p["metadata"]["labels"], self._event(kind, p))

    def delete_pod(self, name):
        with self.cond:
            p = self.pods.pop(name)
            self.rv += 1
            p["metadata"]["resourceVersion"] = str(self.rv)
            self._append(self.rv, p["metadata"]["labels"], self._event("DELETED", p))

    def bookmark(self):
        with self.cond:
            self.rv += 1
            obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}}
            self._append(None, None, self._event("BOOKMARK", obj))
            return self.rv

    def gone_event(self):
        with self.cond:
            obj = status_object(410, "Expired", "too old resource version")
            self._append(None, None, self._event("ERROR", obj))

    def raw_line(self, data):
        with self.cond:
            self._append(None, None, data)

    def compact(self):
        """Every resourceVersion before the current one is too old for a watch (410 Gone)."""
        with self.cond:
            self.compacted_below = self.rv

    def close_watches(self):
        with self.cond:
            self.close_generation += 1
            self.cond.notify_all()

    def watch_count(self):
        with self.cond:
            return self.watching

    def close(self):
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # --- serving -----------------------------------------------------------------------------
    @staticmethod
    def _matches(selector, labels):
        if labels is None:
            return True
        return all(test(labels) for test in parse_selector(selector or ""))

    def _send_json(self, handler, code, obj):
        body = json.dumps(obj).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _serve(self, handler):
        url = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(url.query)
        auth = handler.headers.get("Authorization")
        with self.cond:
            self.requests.append((handler.path, auth))
        if url.path != f"/api/v1/namespaces/{self.namespace}/pods":
            return self._send_json(handler, 404, status_object(404, "NotFound", "no such path"))
        if self.token is not None and auth != f"Bearer {self.token}":
            return self._send_json(handler, 401, status_object(401, "Unauthorized", "Unauthorized"))
        selector = query.get("labelSelector", [""])[0]
        try:
            parse_selector(selector)
        except SelectorError as e:
            return self._send_json(handler, 400, status_object(400, "BadRequest",
                                                               f"unable to parse requirement: {e}"))
        if query.get("watch", ["0"])[0] not in ("1", "true"):
            with self.cond:
                items = [p for p in self.pods.values()
                         if self._matches(selector, p["metadata"]["labels"])]
                body = {"kind": "PodList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(self.rv)}, "items": items}
            return self._send_json(handler, 200, body)
        self._watch(handler, query, selector)

    def _watch(self, handler, query, selector):
        try:
            since = int(query.get("resourceVersion", ["0"])[0] or "0")
        except ValueError:
            return self._send_json(handler, 400, status_object(400, "BadRequest", "bad resourceVersion"))
        with self.cond:
            if since < self.compacted_below:
                gone = True
            else:
                gone = False
                start_seq = self.seq
                generation = self.close_generation
                backlog = [line for (seq, rv, labels, line) in self.log
                           if rv is not None and rv > since and self._matches(selector, labels)]
                self.watching += 1
        if gone:
            return self._send_json(handler, 410, status_object(410, "Expired", "too old resource version"))
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            handler.wfile.flush()
            sent = start_seq
            pending = backlog
            while True:
                for line in pending:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                handler.wfile.flush()
                with self.cond:
                    while (self.seq == sent and self.close_generation == generation
                           and not self.closing):
                        self.cond.wait(0.5)
                    if self.close_generation != generation or self.closing:
                        break
                    pending = [line for (seq, rv, labels, line) in self.log
                               if seq > sent and self._matches(selector, labels)]
                    sent = self.seq
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:
            handler.close_connection = True
        finally:
            with self.cond:
                self.watching -= 1
