"""One agent's pipe, whatever carries it: JSON lines out, JSON lines in.

A reader thread turns each line from the agent into an `AgentMessage` on the
supervisor's queue; when the pipe ends it queues `agent_lost`. Writes are
serialised by a lock. Used by every transport.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

_LINK_IDS = itertools.count(1)


@dataclass(frozen=True)
class AgentMessage:
    host: str
    message: dict[str, Any]
    # Which pipe it came through: after a host reconnects, a late message of
    # its old link (e.g. its `agent_lost`) must not be taken for the new one.
    link_id: int = 0

    @property
    def event(self) -> str:
        return str(self.message.get("ev", ""))


class AgentLink:
    def __init__(
        self,
        host: str,
        to_agent: IO[bytes],
        from_agent: IO[bytes],
        events: queue.Queue[AgentMessage],
        on_close: Callable[[], None] = lambda: None,
        diagnostics: Callable[[], str] = lambda: "",
    ) -> None:
        self.host = host
        self._to_agent = to_agent
        self._from_agent = from_agent
        self._events = events
        self._on_close = on_close
        # Why the pipe ended (exit code, stderr tail), for error messages.
        self.diagnostics = diagnostics
        self._lock = threading.Lock()
        self.hello: dict[str, Any] | None = None
        self.hello_seen = threading.Event()
        self.last_seen = time.monotonic()
        self.closed = False  # True once we closed it or the agent's side ended
        self.link_id = next(_LINK_IDS)
        self._reader = threading.Thread(target=self._read, name=f"agent-{host}", daemon=True)

    def start_reading(self) -> None:
        self._reader.start()

    def _read(self) -> None:
        try:
            for raw in iter(self._from_agent.readline, b""):
                self.last_seen = time.monotonic()
                try:
                    message = json.loads(raw)
                except ValueError:
                    message = None
                if not isinstance(message, dict):
                    message = {"ev": "log", "text": raw.decode("utf-8", "replace").rstrip()}
                if message.get("ev") == "hello":
                    self.hello = message
                    self.hello_seen.set()
                self._events.put(AgentMessage(self.host, message, self.link_id))
        except (OSError, ValueError):
            pass
        finally:
            # Whatever ended the pipe, the supervisor must hear of it.
            self.closed = True
            self.hello_seen.set()  # wake anyone waiting: the agent is gone
            self._events.put(
                AgentMessage(self.host, {"ev": "agent_lost", "t": time.time(),
                                         "detail": self._safe_diagnostics()}, self.link_id)
            )

    def _safe_diagnostics(self) -> str:
        try:
            return self.diagnostics()
        except Exception as exc:  # noqa: BLE001 - a diagnostic must never hide the loss
            return f"(no diagnostics: {exc})"

    def send(self, message: dict[str, Any]) -> bool:
        """Send one command; False when the agent is no longer reachable."""
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                self._to_agent.write(data)
                self._to_agent.flush()
                return True
            except (OSError, ValueError):
                return False

    def close(self) -> None:
        """Close the agent's stdin: it stops its tasks and exits."""
        self.closed = True
        with self._lock:
            try:
                self._to_agent.close()
            except OSError:
                pass
        self._on_close()
