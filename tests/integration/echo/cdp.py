"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
commands on the child's fd 3, answers on its fd 4, each a JSON message ending in NUL).

For what ``--dump-dom`` cannot do: one browser session that goes from page to page keeping
its cookies (sign in, then visit another site), and a look at the cookie jar itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium")


class Browser:
    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # the child's fds 3 and 4 are the pipe's ends (kept: pass_fds)
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             f"--user-data-dir={profile}", "--remote-debugging-pipe", "--no-first-run",
             "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4, to_child_r, from_child_w),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command; its result (events in between are skipped)."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self._buf += chunk
            raw, _, self._buf = self._buf.partition(b"\0")
            answer = json.loads(raw)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return dict(answer.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", self.session, expression=expression,
                           returnByValue=True)  # fmt: skip
        return result["result"].get("value")

    def goto(self, url: str, lands_on: str | Callable[[str], bool], timeout: float = 60) -> str:
        """Open ``url``; the page's HTML once the tab has loaded a page at ``lands_on`` (a URL,
        or a test of one), after the redirects and auto-posts in between."""
        self.call("Page.navigate", self.session, url=url)
        return self.wait_for(lands_on, timeout)

    def wait_for(self, lands_on: str | Callable[[str], bool], timeout: float = 60) -> str:
        at = (lambda href: href == lands_on) if isinstance(lands_on, str) else lands_on
        deadline = time.monotonic() + timeout
        state: list[str] = ["", ""]
        while True:
            try:
                state = self.evaluate("[location.href, document.readyState]") or ["", ""]
                if at(state[0]) and state[1] == "complete":
                    page = self.evaluate("document.documentElement.outerHTML")
                    if page is not None:  # None: the document went away meanwhile
                        return str(page)
            except RuntimeError:  # the page navigated under the call: ask the next one
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the tab never loaded {lands_on}: it is at {state}")
            time.sleep(0.1)

    def cookies(self) -> dict[str, str]:
        """The browser's whole cookie jar, name -> value."""
        return {c["name"]: c["value"] for c in self.call("Storage.getCookies")["cookies"]}

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
