"""A small, safe HTTP layer on the standard library, shared by ``sam2edge serve`` and ``sam2edge sweep``.

- ``Mounts``: URL prefix -> folder; a request resolves only to a regular file *inside* its folder
  (no ``..``, no symlink escape, no hidden files), else 404.
- Every response carries the cross-origin isolation headers LiteRT.js threads need
  (COOP same-origin, COEP require-corp) and ``X-Content-Type-Options: nosniff``; MIME types come from
  ``MIME`` (Python 3.11 gets ``.mjs`` wrong and may not know ``.wasm``).
- Handlers answer errors as JSON ``{"error": "<one line: problem and fix>"}`` with a 4xx status.
"""

from __future__ import annotations

import json
import posixpath
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MIME: dict[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".wasm": "application/wasm",
    ".tflite": "application/octet-stream",
    ".bin": "application/octet-stream",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".svg": "image/svg+xml",
    ".map": "application/json",
}
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


LOOPBACK = ("127.0.0.1", "localhost", "::1")
SOCKET_TIMEOUT_S = 30.0  # seconds a client may stay silent mid-request
DRAIN_LIMIT = 256_000_000  # an oversized upload up to this size is read and dropped before the 413 answer


class HttpError(Exception):
    """An error answer: status code + one-line message naming the problem and the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Mounts:
    """URL prefix ("/static/") -> folder. ``resolve(url_path)`` -> a file inside the folder, or None."""

    def __init__(self, mounts: dict[str, Path]) -> None:
        self.mounts = {p if p.endswith("/") else p + "/": Path(d).resolve() for p, d in mounts.items()}

    def resolve(self, url_path: str) -> Path | None:
        for prefix, root in self.mounts.items():
            if not url_path.startswith(prefix):
                continue
            rel = url_path[len(prefix) :]
            parts = rel.split("/")
            if not rel or any(p in ("", ".", "..") or p.startswith(".") or "\\" in p or "\0" in p for p in parts):
                return None
            if posixpath.normpath(rel) != rel:
                return None
            target = (root / rel).resolve()
            if not target.is_relative_to(root) or not target.is_file():
                return None
            return target
        return None


Route = Callable[["Handler", str, dict[str, list[str]]], None]  # fn(handler, unquoted path, query)


class Handler(BaseHTTPRequestHandler):
    """Dispatches ``GET``/``POST`` to ``server.routes`` (exact path, or a prefix written "prefix*"), then mounts."""

    server_version = "sam2edge"
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S  # a silent client is dropped, not waited on forever (StreamRequestHandler)

    def version_string(self) -> str:
        return self.server_version

    # ---- responses ------------------------------------------------------------------------
    def send_body(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in {**ISOLATION_HEADERS, **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, obj: dict, status: int = 200) -> None:
        self.send_body(status, json.dumps(obj).encode(), "application/json")

    def send_error_json(self, status: int, message: str) -> None:
        self.send_json({"error": message}, status)

    def send_file(self, path: Path) -> None:
        ctype = MIME.get(path.suffix.lower(), "application/octet-stream")
        self.send_body(200, path.read_bytes(), ctype)

    # ---- request plumbing -----------------------------------------------------------------
    def read_body(self, limit: int) -> bytes:
        """The request body, refusing a missing length (411) or one above ``limit`` bytes (413) unread."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise HttpError(411, "chunked uploads are not accepted; send the file with a Content-Length")
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            raise HttpError(411, "the request has no Content-Length; send the file as the request body")
        n = int(length)
        if n > limit:
            # read (and drop) a moderately oversized body so the client gets the answer, not a reset
            left = n if n <= DRAIN_LIMIT else 0
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
            self.close_connection = True  # anything unread must not be parsed as the next request
            raise HttpError(
                413,
                f"upload is {n / 1e6:.1f} MB; the limit is {limit / 1e6:.1f} MB (start serve with a "
                "larger --max-upload-mb, or send a smaller file)",
            )
        return self._read_exactly(n)

    def _read_exactly(self, n: int) -> bytes:
        """Exactly ``n`` body bytes, or HttpError (the client stopped early, or went silent) and the
        connection is closed: a short body is never taken for a complete one."""
        buf = bytearray()
        try:
            while len(buf) < n:
                chunk = self.rfile.read(min(n - len(buf), 1 << 20))
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            self.close_connection = True
            raise HttpError(408, f"the body stopped after {len(buf)} of {n} bytes (timeout); send it again") from None
        if len(buf) < n:
            self.close_connection = True
            raise HttpError(400, f"the body ended after {len(buf)} of {n} bytes (Content-Length); send it again")
        return bytes(buf)

    def _dispatch(self, method: str) -> None:
        try:
            self.server.check_host(self.headers.get("Host", ""))
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            query = urllib.parse.parse_qs(url.query)
            route = self.server.find_route(method, path)
            if route is not None:
                route(self, path, query)
                return
            if method in ("GET", "HEAD"):
                f = self.server.mounts.resolve(path)
                if f is not None:
                    self.send_file(f)
                    return
            raise HttpError(404, f"no such page or file: {url.path[:120]}")
        except HttpError as e:
            if method == "POST":
                self.close_connection = True  # a body may be left unread: never parse it as a request
            try:
                self.send_error_json(e.status, e.message)
            except OSError:  # the client is gone: nothing to answer, nothing to log
                self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as e:  # a bug or a runtime failure: answer, log, keep serving
            self.log_error("%s failed: %r", self.path[:120], e)
            self.close_connection = True
            try:
                self.send_error_json(500, f"internal error ({type(e).__name__}); see the server's log")
            except OSError:
                pass

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (stdlib signature)
        if self.server.verbose:
            super().log_message(format, *args)

    def log_error(self, format: str, *args) -> None:  # noqa: A002
        super().log_message(format, *args)  # errors are always logged


class WebServer(ThreadingHTTPServer):
    """ThreadingHTTPServer + routes {(method, exact path | "prefix*"): fn(handler, path, query)} + static mounts."""

    daemon_threads = True

    def __init__(self, host: str, port: int, mounts: Mounts, routes: dict, verbose: bool = False) -> None:
        super().__init__((host, port), Handler)
        self.mounts, self.routes, self.verbose = mounts, routes, verbose

    def check_host(self, host_header: str) -> None:
        """On a loopback address, answer only requests for a loopback host name: a web page that re-binds
        its own DNS name to 127.0.0.1 (DNS rebinding) must not reach the API."""
        if self.server_address[0] not in LOOPBACK:
            return
        name = urllib.parse.urlsplit(f"//{host_header}").hostname or ""
        if name not in LOOPBACK:
            raise HttpError(403, f"unexpected Host {host_header[:60]!r}; open the app as http://127.0.0.1:PORT/")

    def find_route(self, method: str, path: str):
        fn = self.routes.get((method, path))
        if fn is not None:
            return fn
        best = None
        for (m, p), f in self.routes.items():
            prefix = p[:-1]
            if m == method and p.endswith("*") and path.startswith(prefix) and (best is None or len(p) > len(best[0])):
                best = (p, f)
        return best[1] if best else None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"
