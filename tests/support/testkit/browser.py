"""Debian's ``chromium``, headless, driven over the DevTools protocol (a websocket): the status
page tests load the page as a technician's browser does, run its script, and read the DOM.

Chromium runs as its own process with a fresh profile (removed on `close`) and
``--remote-debugging-port=0``; the port it picked is read from its ``DevToolsActivePort`` file.
One `Page` per test is enough. Skips the test when chromium is not installed
(``apt-get install chromium``; scripts/setup.sh dev installs it).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from testkit.needs import missing

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root in CI
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
]


class NavigatedAway(AssertionError):
    """A command's page was replaced by a navigation before it answered (e.g. a form the page
    submitted itself): the command can be sent again to the new page."""


def _navigated(error: dict[str, Any]) -> bool:
    message = str(error.get("message", ""))
    return any(s in message for s in ("navigated or closed", "context was destroyed", "Cannot find context"))


class Page:
    """One browser tab: `send` a DevTools command and get its result; events are kept."""

    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        self._socket.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == self._id:
                if "error" in message:
                    error = NavigatedAway if _navigated(message["error"]) else AssertionError
                    raise error(f"{method}: {message['error']}")
                return message.get("result", {})  # type: ignore[no-any-return]
            self.events.append(message)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first event named `method` since `events` was last cleared, read from the socket
        as it arrives (no command is sent meanwhile, so a navigation cannot cut one short)."""
        deadline = time.monotonic() + timeout
        while (event := next((e for e in self.events if e.get("method") == method), None)) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {method} within {timeout:.0f} s")
            try:
                self.events.append(json.loads(self._socket.recv(timeout=remaining)))
            except TimeoutError:
                continue
        return event

    def headers(self, headers: dict[str, str]) -> None:
        """Send `headers` with every request of this tab (e.g. HTTP Basic credentials)."""
        self.send("Network.enable")
        self.send("Network.setExtraHTTPHeaders", headers=headers)

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate and wait for the load event."""
        self.events.clear()
        self.send("Page.enable")
        self.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited when it is a promise)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate `expression` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except NavigatedAway:  # the page was replaced while evaluating: ask the new one
                continue
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {expression}")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            metrics = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": metrics["width"], "height": metrics["height"], "scale": 1}
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", **params)["data"]))
        return path


class Chromium:
    """A headless chromium process with a fresh profile; `page()` is its first tab."""

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        if CHROMIUM is None:
            missing("chromium", "chromium is not installed (apt-get install chromium)")
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-"))
        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.port = self._devtools_port()
        self._sockets = ExitStack()

    def _devtools_port(self, timeout: float = 30.0) -> int:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"chromium exited with status {self.process.returncode}")
            text = active.read_text() if active.exists() else ""
            if text.strip():
                return int(text.split()[0])
            time.sleep(0.05)
        raise AssertionError("chromium did not open its DevTools port")

    def page(self) -> Page:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as response:
            targets = json.loads(response.read())
        target = next(t for t in targets if t["type"] == "page")
        socket = self._sockets.enter_context(
            connect(target["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=10)
        )
        return Page(socket)

    def close(self) -> None:
        self._sockets.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)
