"""A real agent process driven by hand: `python -S -m launcher.agent`, as the
transports start it, with its JSON lines on stdin/stdout held by the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from launcher.agent.protocol import MAX_FRAME_BYTES, frame_size, read_frame
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent


def agent_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(REPO)
    return env


class AgentProc:
    def __init__(self, run_dir: Path, *, lease_s: float = 0.0, eof_grace_s: float = 0.5,
                 host: str = "h1", prefix: Sequence[str] = (),
                 on_message: Callable[[dict[str, Any]], None] | None = None,
                 new_session: bool = True) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-S", "-m", "launcher.agent", "--host", host,
             "--run-dir", str(run_dir), "--eof-grace", str(eof_grace_s),
             "--lease", str(lease_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=agent_env(), start_new_session=new_session)
        self.messages: list[dict[str, Any]] = []  # each with "_at": when it was read
        self.on_message = on_message  # on the reader's thread, as each comes
        # Cleared, the test reads nothing: the agent's writes block, as behind
        # a launcher slow to read (a full SSH window).
        self.reading = threading.Event()
        self.reading.set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Lines, and frames (a header line, then its raw bytes, kept as `raw`)."""
        stdout = self.proc.stdout
        assert stdout is not None
        for line in stdout:
            self.reading.wait()
            message = json.loads(line)
            size = frame_size(line)
            if size is not None:
                message["raw"] = read_frame(stdout, size, MAX_FRAME_BYTES)
            message["_at"] = time.monotonic()
            self.messages.append(message)
            if self.on_message is not None:
                self.on_message(message)

    def send(self, message: dict[str, Any] | bytes) -> None:
        assert self.proc.stdin is not None
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def events(self, ev: str, **match: Any) -> list[dict[str, Any]]:
        return [m for m in list(self.messages)
                if m.get("ev") == ev and all(m.get(k) == v for k, v in match.items())]

    def wait_event(self, ev: str, timeout: float = 20, **match: Any) -> dict[str, Any]:
        found = wait_for(lambda: self.events(ev, **match), timeout=timeout,
                         what=f"agent event {ev} {match}; got {self.messages[-5:]}")
        return found[0]  # type: ignore[index]

    def hello(self) -> dict[str, Any]:
        return self.wait_event("hello", timeout=30)

    def start_task(self, name: str, argv: list[str], env: dict[str, str] | None = None,
                   generation: int = 0) -> int:
        self.send({"op": "start", "task": name, "generation": generation, "argv": argv,
                   "cwd": str(self.run_dir.parent), "env": env or {}, "tf_config": "{}"})
        return self.wait_event("started", task=name, generation=generation)["pid"]

    def output(self, task: str) -> list[str]:
        return [m["text"] for m in self.events("output", task=task)]

    def close(self) -> None:
        """EOF, then make sure it is gone."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
