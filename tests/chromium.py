"""Headless Chromium driven over the DevTools protocol on a pipe, for the report tests.

Why a pipe and hand-written CDP rather than selenium or ``--dump-dom``: ``--dump-dom``
cannot tell whether an image decoded nor report console errors, and selenium needs a
chromedriver matching the browser plus a dependency. ``--remote-debugging-pipe`` needs
neither a port nor a WebSocket library: Chromium reads NUL-terminated JSON commands on
fd 3 and writes replies and events on fd 4. The few commands used are stable parts of the
protocol (Page, Runtime, Log, Emulation).

Run as a script to screenshot pages (used for the images in docs/loadtest.md)::

    python -m tests.chromium report.html out.png [WIDTH [HEIGHT | CSS-SELECTOR]]
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe")


def find_chromium() -> str | None:
    for c in CHROMIUM_CANDIDATES:
        found = shutil.which(c)
        if found:
            return found
    return None


class CdpError(Exception):
    pass


class Browser:
    """One headless Chromium with one page; every wait is bounded by ``timeout``."""

    def __init__(self, executable: str | None = None, timeout: float = 30.0) -> None:
        exe = executable or find_chromium()
        if exe is None:
            raise CdpError("chromium is not installed")
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="gr-chromium-")
        # fds 3 and 4 in the child: its command input and its output.
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        os.set_inheritable(to_child_r, True)
        os.set_inheritable(from_child_w, True)

        def _fds() -> None:  # in the child, before exec
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_fds, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None
        self.session = self._attach()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(CdpError, OSError):
            self.call("Browser.close", session=None)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()

    # -- protocol ---------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("timed out waiting for chromium")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise CdpError(f"chromium exited (status {self.proc.poll()})")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def call(self, method: str, session: str | None = "", **params: Any) -> dict[str, Any]:
        """Send a command (to the page's session unless ``session`` is None) and return its
        result; events received meanwhile are kept in :attr:`events`."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        sid = self.session if session == "" else session
        if sid:
            msg["sessionId"] = sid
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        for ev in self.events:
            if ev["method"] == method:
                return ev
        while True:
            msg = self._read_message(deadline)
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg

    def _attach(self) -> str:
        self.session = None
        targets = self.call("Target.getTargets", session=None)["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        sid = str(self.call("Target.attachToTarget", session=None, targetId=page["targetId"],
                            flatten=True)["sessionId"])
        self.session = sid
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        return sid

    # -- helpers ----------------------------------------------------------------------

    def open(self, url: str, width: int = 1280, height: int = 900) -> None:
        """Load ``url`` in a ``width`` x ``height`` viewport and wait for its load event."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise CdpError(f"evaluate: {result['exceptionDetails']}")
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        out: list[str] = []
        for ev in self.events:
            p = ev.get("params", {})
            if ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error",
                                                                                "assert"):
                out.append(" ".join(str(a.get("value", a.get("description")))
                                    for a in p.get("args", [])))
            elif ev["method"] == "Runtime.exceptionThrown":
                out.append(str(p.get("exceptionDetails", {}).get("text")))
            elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(str(p["entry"].get("text")))
        return out

    def screenshot(self, path: Path, height: int | None = None) -> bytes:
        """A PNG of the page's top ``height`` pixels (the whole page if None)."""
        width = int(self.evaluate("document.documentElement.clientWidth"))
        full = int(self.evaluate("document.documentElement.scrollHeight"))
        clip = {"x": 0, "y": 0, "width": width, "height": min(full, height or full),
                "scale": 1}
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png", clip=clip,
                                          captureBeyondViewport=True)["data"])
        path.write_bytes(data)
        return data


def _main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    page, out = Path(argv[0]).resolve(), Path(argv[1])
    width = int(argv[2]) if len(argv) > 2 else 1280
    until = argv[3] if len(argv) > 3 else None
    with Browser() as b:
        b.open(page.as_uri(), width=width)
        height: int | None = None
        if until is not None:
            # A height in pixels, or a CSS selector: down to the bottom of that element.
            height = int(until) if until.isdigit() else int(b.evaluate(
                f"Math.ceil(document.querySelector({json.dumps(until)})"
                ".getBoundingClientRect().bottom + window.scrollY + 16)"))
        b.screenshot(out, height)
        errors = b.console_errors()
    # For the docs: a 256-colour palette makes the PNG several times smaller, and the
    # report's flat colours survive it. (Pillow comes with matplotlib.)
    from PIL import Image

    Image.open(out).convert("RGB").quantize(256).save(out, optimize=True)
    if errors:
        print("console errors: " + "; ".join(errors), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
