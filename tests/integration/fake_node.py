"""A misbehaving upstream node for integration tests: a threaded raw-socket HTTP server on
127.0.0.1 (port 0) that answers every POST the way its mode says, to reproduce upstreams the
simulator does not (yet) imitate.

Modes:
  "sse_head_then_silence": 200 text/event-stream head (chunked), then nothing until the peer
                           closes (a vLLM decode waiting for KV that never comes).
  "endless_body":          200 application/json head (chunked), then 64 KiB chunks for as long as
                           the peer reads (a prefill answering an endless body).
  "trickle":               200 application/json head (chunked), then one byte every
                           `interval` seconds, forever (a prefill that never completes).
  "sse_flood":             200 text/event-stream of 16 KiB completion chunks, sent as fast as the
                           peer reads (blocking sends: TCP back-pressure), until it closes.
  "slow_json":             reads the whole request, waits `interval` seconds, then answers a
                           small 200 JSON completion and closes (a node busy with a long prompt).
  "sse_crlf":              200 text/event-stream whose events end in "\r\n\r\n" (valid SSE):
                           one completion chunk, then waits for `release` (a threading.Event
                           the test sets), then a second one and "data: [DONE]".
  "tokenize_trickle":      200 application/json, a valid vLLM /tokenize answer padded to
                           `trickle_bytes` bytes, sent one byte every `interval` seconds (a node
                           whose answer never trips a per-read timeout but takes seconds).

  node = FakeNode("sse_head_then_silence"); node.http_address -> "127.0.0.1:PORT"
  node.requests, node.closed: how many requests arrived / connections the peer closed.
  node.received: (path, body bytes) of every request, in order of arrival.
  node.close()
"""
import socket
import threading
import time


class FakeNode:
    # Request bodies are kept (in `received`) up to this many bytes each.
    KEEP_BODY_BYTES = 1 << 20

    def __init__(self, mode, interval=0.2, trickle_bytes=80):
        self.mode = mode
        self.interval = interval
        self.trickle_bytes = trickle_bytes
        self.received = []
        self.requests = 0
        self.closed = 0
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.release = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(0.1)
        self.http_address = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()

    def _read_request(self, conn):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        # Counted in full, kept up to KEEP_BODY_BYTES: bodies may be megabytes.
        received = len(body)
        while received < length:
            chunk = conn.recv(1 << 20)
            if not chunk:
                return False
            received += len(chunk)
            if len(body) < self.KEEP_BODY_BYTES:
                body += chunk
        path = head.split(b"\r\n", 1)[0].split(b" ")[1].decode()
        with self._lock:
            self.received.append((path, body[:min(length, self.KEEP_BODY_BYTES)]))
        return True

    def _wait_closed(self, conn):
        conn.settimeout(0.1)
        while not self._stop.is_set():
            try:
                if not conn.recv(65536):
                    return True
            except socket.timeout:
                continue
            except OSError:
                return True
        return False

    def _serve(self, conn):
        peer_closed = False
        try:
            if not self._read_request(conn):
                return
            with self._lock:
                self.requests += 1
            if self.mode == "sse_head_then_silence":
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                peer_closed = self._wait_closed(conn)
            elif self.mode in ("endless_body", "trickle"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                piece = b"x" * (65536 if self.mode == "endless_body" else 1)
                chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
                while not self._stop.is_set():
                    conn.sendall(chunk)
                    with self._lock:
                        self.bytes_sent += len(piece)
                    if self.mode == "trickle":
                        time.sleep(self.interval)
            elif self.mode == "sse_flood":
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                event = (b'data: {"id":"cmpl-fake","object":"text_completion","choices":'
                         b'[{"index":0,"text":"' + b"x" * 16384 + b'","finish_reason":null}]}\n\n')
                chunk = b"%x\r\n%s\r\n" % (len(event), event)
                while not self._stop.is_set():
                    conn.sendall(chunk)
                    with self._lock:
                        self.bytes_sent += len(event)
            elif self.mode == "sse_crlf":
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")

                def send_chunk(payload):
                    conn.sendall(b"%x\r\n%s\r\n" % (len(payload), payload))

                event = (b'data: {"id":"cmpl-fake","object":"text_completion","choices":'
                         b'[{"index":0,"text":"%s","finish_reason":null}]}\r\n\r\n')
                send_chunk(event % b"one")
                while not self.release.wait(0.05):
                    if self._stop.is_set():
                        return
                send_chunk(event % b"two")
                send_chunk(b"data: [DONE]\r\n\r\n")
                conn.sendall(b"0\r\n\r\n")
                self._wait_closed(conn)
            elif self.mode == "tokenize_trickle":
                answer = b'{"count":1,"max_model_len":4096,"tokens":[1]}'
                answer += b" " * max(0, self.trickle_bytes - len(answer))
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(answer))
                for i in range(len(answer)):
                    if self._stop.is_set():
                        return
                    conn.sendall(answer[i:i + 1])
                    with self._lock:
                        self.bytes_sent += 1
                    time.sleep(self.interval)
                self._wait_closed(conn)
            elif self.mode == "slow_json":
                time.sleep(self.interval)
                body = (b'{"id":"cmpl-fake","object":"text_completion","model":"sim-model","choices":'
                        b'[{"index":0,"text":"ok","finish_reason":"length"}],"kv_transfer_params":null}')
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            else:
                raise ValueError(self.mode)
        except OSError:
            peer_closed = True
        finally:
            if peer_closed:
                with self._lock:
                    self.closed += 1
            conn.close()

    def close(self):
        self._stop.set()
        self._listener.close()
