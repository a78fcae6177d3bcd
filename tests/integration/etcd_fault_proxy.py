"""A fault-injecting HTTP proxy between pdrouter and etcd's JSON gateway, for tests: real sockets
on loopback, one thread pair per connection.

It reads each HTTP/1.1 request pdrouter sends (request line, headers, a Content-Length body: what
pdrouter's etcd client sends) and either forwards it to etcd or fails it:
  * put_fail_every=N: every Nth POST /v3/kv/put is answered 503 by the proxy (never reaches etcd);
  * watch_close_after_s=T: a connection that carries a POST /v3/watch is closed T seconds after
    the watch was forwarded (both sides: pdrouter sees the watch stream end);
  * watch_delay_s=D: what etcd streams on a watch connection after its first read (the answer's
    head and the watch's creation) reaches pdrouter D seconds after it reached the proxy (a slow
    watch: its events arrive after the answers of later calls).
Other answers of etcd are relayed as they arrive (pdrouter sends one request at a time per connection,
so an injected answer never interleaves with a relayed one).
"""

import queue
import socket
import threading
import time

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024


class EtcdFaultProxy:
    def __init__(self, etcd_port, put_fail_every=0, watch_close_after_s=None, watch_delay_s=0):
        self.etcd_port = etcd_port
        self.put_fail_every = put_fail_every
        self.watch_close_after_s = watch_close_after_s
        self.watch_delay_s = watch_delay_s
        self.watch_pairs = set()  # connections that carry a watch
        self.lock = threading.Lock()
        self.puts = 0
        self.puts_failed = 0
        self.watches = 0
        self.watches_closed = 0
        self.requests = []  # paths, in order
        self.closing = False
        self.conns = set()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, name="etcd-fault-proxy", daemon=True)
        self.thread.start()

    def counters(self):
        with self.lock:
            return {"puts": self.puts, "puts_failed": self.puts_failed, "watches": self.watches,
                    "watches_closed": self.watches_closed}

    def close(self):
        with self.lock:
            self.closing = True
            conns = list(self.conns)
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for pair in conns:
            self._close_pair(pair)
        self.thread.join(10)

    # --- internals ---

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.etcd_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # etcd down: pdrouter sees a connection that closes
                continue
            pair = (client, upstream)
            with self.lock:
                if self.closing:
                    client.close()
                    upstream.close()
                    return
                self.conns.add(pair)
            threading.Thread(target=self._requests, args=(pair,), daemon=True).start()
            threading.Thread(target=self._answers, args=(pair,), daemon=True).start()

    def _close_pair(self, pair):
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self.lock:
            self.conns.discard(pair)
            self.watch_pairs.discard(pair)

    def _answers(self, pair):
        client, upstream = pair
        delayed = None  # (due time, bytes) for the sender thread of a delayed watch
        watch_reads = 0
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                with self.lock:
                    delay = self.watch_delay_s if pair in self.watch_pairs else 0
                if delay > 0:
                    watch_reads += 1
                if delay <= 0 or watch_reads == 1:
                    client.sendall(data)
                    continue
                if delayed is None:
                    delayed = queue.Queue()
                    threading.Thread(target=self._send_delayed, args=(pair, delayed), daemon=True).start()
                delayed.put((time.monotonic() + delay, data))
        except OSError:
            pass
        if delayed is not None:
            delayed.put((0, None))  # the sender closes once everything before is sent
            return
        self._close_pair(pair)

    def _send_delayed(self, pair, delayed):
        client, _ = pair
        try:
            while True:
                due, data = delayed.get()
                if data is None:
                    break
                time.sleep(max(0.0, due - time.monotonic()))  # the injected latency itself
                client.sendall(data)
        except OSError:
            pass
        self._close_pair(pair)

    def _requests(self, pair):
        client, upstream = pair
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise OSError("request head too large")
                    data = client.recv(65536)
                    if not data:
                        raise OSError("client closed")
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length > MAX_BODY_BYTES:
                    raise OSError("request body too large")
                while len(buffer) < length:
                    data = client.recv(65536)
                    if not data:
                        raise OSError("client closed")
                    buffer += data
                body, buffer = buffer[:length], buffer[length:]
                self._one(pair, method, path, head + b"\r\n\r\n" + body)
        except (OSError, ValueError, IndexError):
            pass
        self._close_pair(pair)

    def _one(self, pair, method, path, raw):
        client, upstream = pair
        with self.lock:
            self.requests.append(path)
            fail_put = False
            if method == "POST" and path == "/v3/kv/put":
                self.puts += 1
                fail_put = self.put_fail_every > 0 and self.puts % self.put_fail_every == 0
                if fail_put:
                    self.puts_failed += 1
            is_watch = method == "POST" and path == "/v3/watch"
            if is_watch:
                self.watches += 1
                self.watch_pairs.add(pair)
        if fail_put:
            body = b'{"error":"injected by etcd_fault_proxy","code":14,"message":"unavailable"}'
            client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            return
        upstream.sendall(raw)
        if is_watch and self.watch_close_after_s is not None:
            def close_watch():
                with self.lock:
                    self.watches_closed += 1
                self._close_pair(pair)
            timer = threading.Timer(self.watch_close_after_s, close_watch)
            timer.daemon = True
            timer.start()
