"""Drive headless Chromium over the DevTools protocol (CDP) through ``--remote-debugging-pipe``, stdlib only.

For machines without playwright (its driver is ~160 MB): a GPU box that only has Python and a Chromium folder.
Chromium reads commands from file descriptor 3 and writes replies and events to descriptor 4, one JSON message
per NUL-terminated frame (the pipe transport of ``chrome://inspect``). One page per :class:`Page`, attached
with flattened sessions; coordinates are CSS pixels of the page's viewport.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path


class CdpError(RuntimeError):
    """A CDP command failed, timed out, or the browser went away."""


class Chromium:
    """One headless Chromium process and its CDP pipe.

    ``exe``: the executable; ``args``: extra switches (the caller's GPU / camera / quiet flags); ``env``: the
    process environment (None: inherit). ``close()`` (or ``with``) ends the process and removes its profile.
    """

    def __init__(self, exe: str | Path, args: list[str], env: dict | None = None) -> None:
        self.profile = tempfile.mkdtemp(prefix="sam2edge-cdp-")
        cmd_r, self._cmd_w = os.pipe()  # we write commands; chromium reads fd 3
        self._out_r, out_w = os.pipe()  # chromium writes fd 4; we read
        hi_r, hi_w = _high(cmd_r), _high(out_w)

        def child() -> None:  # runs in the child between fork and exec
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        argv = [str(exe), "--headless", "--remote-debugging-pipe", f"--user-data-dir={self.profile}", *args]
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            argv + ["about:blank"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            close_fds=False,  # fds 3 and 4 must survive exec; Python's own fds are non-inheritable anyway
            preexec_fn=child,
        )
        for fd in (cmd_r, out_w, hi_r, hi_w):
            os.close(fd)
        self._next = 0
        self._lock = threading.Lock()
        self._replies: dict[int, dict] = {}
        self._cond = threading.Condition()
        self.events: list[dict] = []  # every event, in arrival order (method, params, sessionId)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._out_r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._replies[-1] = {}  # the browser is gone: wake every waiter
                    self._cond.notify_all()
                return
            buf += chunk
            *frames, buf = buf.split(b"\0")
            with self._cond:
                for f in frames:
                    msg = json.loads(f)
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self._cond.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        """One command -> its result; CdpError on an error reply, a timeout or a closed browser."""
        with self._lock:
            self._next += 1
            mid = self._next
            msg = {"id": mid, "method": method, "params": params or {}}
            if session:
                msg["sessionId"] = session
            try:
                os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
            except OSError as e:  # the browser closed its end: it exited
                raise CdpError(f"{method}: the browser exited ({self.stderr_tail()})") from e
        end = time.monotonic() + timeout
        with self._cond:
            while mid not in self._replies:
                if -1 in self._replies:
                    raise CdpError(f"{method}: the browser exited ({self.stderr_tail()})")
                left = end - time.monotonic()
                if left <= 0:
                    raise CdpError(f"{method}: no reply in {timeout:.0f} s")
                self._cond.wait(left)
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def new_page(self, width: int = 1000, height: int = 800, init_script: str | None = None) -> Page:
        """A fresh tab of ``width`` x ``height`` CSS pixels, attached; ``init_script`` runs before any page script."""
        target = self.send("Target.createTarget", {"url": "about:blank"})
        session = self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime"):
            page.send(f"{domain}.enable")
        page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        if init_script:
            page.send("Page.addScriptToEvaluateOnNewDocument", {"source": init_script})
        return page

    def version(self) -> str:
        """e.g. "Chrome/156.0.8078.108" (the browser's product string)."""
        return self.send("Browser.getVersion")["product"]

    def stderr_tail(self, n: int = 2000) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-n:]

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except CdpError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    """One attached tab: evaluate, wait, click, screenshot; ``console()`` lists what the page logged."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session

    def send(self, method: str, params: dict | None = None, timeout: float = 60) -> dict:
        return self.browser.send(method, params, self.session, timeout)

    def goto(self, url: str, timeout: float = 120) -> None:
        self.send("Page.navigate", {"url": url}, timeout)
        self.wait_for("document.readyState === 'complete'", timeout)

    def evaluate(self, expression: str, timeout: float = 120):
        """The JSON value of ``expression`` (promises awaited); CdpError naming a thrown exception."""
        r = self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            timeout,
        )
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CdpError(f"{expression[:80]}: {d.get('exception', {}).get('description') or d.get('text')}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float, poll: float = 0.05):
        """Poll ``expression`` until it is truthy -> its value; CdpError after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while True:
            v = self.evaluate(expression)
            if v:
                return v
            if time.monotonic() > end:
                raise CdpError(f"waited {timeout:.0f} s for {expression}")
            time.sleep(poll)

    def box(self, selector: str) -> dict:
        """{x, y, width, height} of the first element matching ``selector`` (viewport CSS pixels)."""
        sel = json.dumps(selector)
        return self.evaluate(
            f"(() => {{ const r = document.querySelector({sel}).getBoundingClientRect(); "
            "return {x: r.x, y: r.y, width: r.width, height: r.height}; })()"
        )

    def click(self, x: float, y: float, button: str = "left") -> None:
        """A real mouse press and release at (x, y): a user gesture, as a tap is."""
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": button, "clickCount": 1},
            )

    def click_selector(self, selector: str) -> None:
        r = self.box(selector)
        self.click(r["x"] + r["width"] / 2, r["y"] + r["height"] / 2)

    def screenshot(self) -> bytes:
        """The viewport as PNG bytes."""
        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])

    def console(self) -> list[str]:
        """``type: text`` of each console call and uncaught exception of this page so far."""
        out = []
        for e in list(self.browser.events):
            if e.get("sessionId") != self.session:
                continue
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                out.append(f"{p.get('type')}: {text}")
            elif e["method"] == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"pageerror: {d.get('exception', {}).get('description') or d.get('text')}")
        return out


def _high(fd: int) -> int:
    """A non-inheritable duplicate of ``fd`` numbered >= 10 (so dup2 onto 3 and 4 cannot clobber it)."""
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


def static_server(folder: Path, isolate: bool = True):
    """``python -m http.server`` on 127.0.0.1 (a free port) serving ``folder`` in a daemon thread, with the two
    cross-origin isolation headers threaded wasm needs when ``isolate``; ``.shutdown()`` stops it."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Handler(SimpleHTTPRequestHandler):
        extensions_map = {
            **SimpleHTTPRequestHandler.extensions_map,
            ".wasm": "application/wasm",
            ".js": "text/javascript",
            ".mjs": "text/javascript",
        }

        def end_headers(self) -> None:
            if isolate:
                self.send_header("Cross-Origin-Opener-Policy", "same-origin")
                self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            super().end_headers()

        def log_message(self, *args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv
