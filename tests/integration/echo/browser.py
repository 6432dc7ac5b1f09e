"""Headless Chromium on the dashboard: a page's DOM after its scripts ran (``--dump-dom``),
through a small reverse proxy that adds the bearer token (Chromium sends no Authorization
header of its own), as docs/echo.md describes for sites that sign users in at a proxy."""

from __future__ import annotations

import http.server as httpserver
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = shutil.which("chromium")
WIDTH, HEIGHT = 1100, 1400


class Loopback(httpserver.ThreadingHTTPServer):
    """An HTTP server of the test's own on a free loopback port, served on a thread."""

    def __init__(self, handler: type[httpserver.BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join()


class Proxy(Loopback):
    """Forwards GETs to Echo with ``Authorization: Bearer <token>`` added."""

    def __init__(self, upstream: str, token: str) -> None:
        self.upstream, self.token = upstream, token
        super().__init__(ProxyHandler)


class ProxyHandler(httpserver.BaseHTTPRequestHandler):
    server: Proxy

    def do_GET(self) -> None:
        request = urllib.request.Request(self.server.upstream + self.path)
        request.add_header("Authorization", f"Bearer {self.server.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                status, headers, body = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            status, headers, body = exc.code, exc.headers, exc.read()
        self.send_response(status)
        for name in ("Content-Type", "Content-Security-Policy"):
            if headers.get(name):
                self.send_header(name, headers[name])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def chromium(tmp: Path, url: str, shot: Path | None = None) -> str:
    """The page's DOM after its scripts ran (and its screenshot to ``shot``)."""
    assert CHROMIUM is not None
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # root in the test container; the page is our own
        "--disable-gpu",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        f"--window-size={WIDTH},{HEIGHT}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        # less than the page's refresh, enough for its scripts
        "--virtual-time-budget=3000",
        f"--screenshot={shot}" if shot else "--dump-dom",
        url,
    ]
    done = subprocess.run(argv, capture_output=True, timeout=120, cwd=tmp, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()
