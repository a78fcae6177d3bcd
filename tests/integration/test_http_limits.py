"""pdrouter's HTTP port and descriptor limits, with real processes (security review 2026-11 #10,
attacks 2026-11 bugs 3 and 4).

- A second pdrouter (or any socket listening with SO_REUSEPORT) on the port pdrouter should use
  makes it exit 1 with `cannot listen on HOST:PORT: ...`, instead of silently sharing the port.
- Out of file descriptors, accept errors are logged through the rate limiter, counted, and do
  not stop the router from serving once descriptors are free again.
"""
import os
import re
import socket
import time
import unittest

from pdr_testlib import ProcessHandle, pdrouter_path
from pdrouter_fixture import TIME_SCALE, Router


def start_router(http, extra=(), prefix=()):
    args = list(prefix) + [pdrouter_path(), "--http", http, "--discovery", "tcp://127.0.0.1:0",
                           "--workers", "2"] + list(extra)
    return ProcessHandle(args, name="pdrouter2")


class PortSharingTest(unittest.TestCase):
    def assert_refused(self, host_port):
        with start_router(host_port) as second:
            code = second.wait(10 * TIME_SCALE)
            self.assertEqual(code, 1, "second pdrouter on %s did not exit 1:\n%s" % (host_port, second.output()))
            err = second.output("stderr")
            self.assertIn("cannot listen on %s: " % host_port, err)
            self.assertIn("Address already in use", err)
            self.assertNotIn("pdrouter listening", second.output("stdout"))

    def test_second_router_on_the_same_port_exits_1(self):
        with Router() as first:
            self.assert_refused(first.http)
            # The first one still owns the port and answers every request.
            for _ in range(20):
                status, _, _ = first.request("GET", "/health")
                self.assertEqual(status, 200)

    def test_socket_listening_with_so_reuseport_is_not_shared(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(4)
            self.assert_refused("127.0.0.1:%d" % s.getsockname()[1])
        finally:
            s.close()


class DescriptorExhaustionTest(unittest.TestCase):
    NOFILE = 96

    def metric(self, router_http, name):
        host, port = router_http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as c:
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
        m = re.search(r"^%s (\S+)$" % re.escape(name), data.decode(), re.M)
        return float(m.group(1)) if m else None

    def health_ok(self, router_http):
        host, port = router_http.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=2) as c:
                c.sendall(b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                return c.recv(100).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def test_accept_errors_are_throttled_and_the_router_recovers(self):
        # RLIMIT_NOFILE soft = hard = NOFILE (pdrouter raises soft to hard at start).
        proc = start_router("127.0.0.1:0", extra=["--log-level", "info"],
                            prefix=["prlimit", "--nofile=%d:%d" % (self.NOFILE, self.NOFILE)])
        with proc:
            line = proc.wait_for_line(r"pdrouter listening http=(\S+)", timeout=10 * TIME_SCALE,
                                      streams=("stdout",))
            self.assertIsNotNone(line, proc.output())
            http = re.search(r"http=(\S+)", line).group(1)
            host, port = http.rsplit(":", 1)
            # The start-up sizing warned that the limits do not fit.
            self.assertIsNotNone(proc.wait_for_line(r"open-file limit %d cannot hold" % self.NOFILE, timeout=1,
                                                    streams=("stderr",)), proc.output())
            # Far more connections than descriptors, held open for about two seconds.
            clients = []
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                try:
                    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    c.setblocking(False)
                    c.connect_ex((host, int(port)))
                    clients.append(c)
                except OSError:
                    break
                if len(clients) >= 600:
                    time.sleep(0.01)  # keep them open; the router keeps failing to accept
            for c in clients:
                c.close()
            # The router serves again once the connections are gone.
            until = time.monotonic() + 20 * TIME_SCALE
            while not self.health_ok(http) and time.monotonic() < until:
                time.sleep(0.05)
            self.assertTrue(self.health_ok(http), proc.output())
            accept_lines = [l for l in proc.output("stderr").splitlines() if "accept error" in l]
            # The log limiter allows 10 lines a second per worker: a few seconds of errors give
            # dozens of lines at most (it was hundreds of thousands).
            self.assertLessEqual(len(accept_lines), 120, "\n".join(accept_lines[:20]))
            errors = self.metric(http, "pdrouter_http_accept_errors_total")
            self.assertIsNotNone(errors)
            if accept_lines:
                self.assertGreater(errors, 0)
            self.assertIsNone(proc.returncode, "pdrouter exited:\n" + proc.output())


if __name__ == "__main__":
    unittest.main()
