"""One agent's pipe, whatever carries it: JSON lines out, JSON lines in.

A reader thread turns each line from the agent into an `AgentMessage` on the
supervisor's queue; when the pipe ends it queues `agent_lost`. A line that is
not a JSON object, is not UTF-8, or is longer than `MAX_LINE_BYTES` becomes a
`log` message (an oversized line is skipped unread, never parsed): whatever
the far end sends, the reader only ever queues dicts and never dies of it.

A frame (launcher/agent/protocol.py: a header line `{"raw":N,...}`, then N
raw bytes) is read whole: its bytes, at most `MAX_FRAME_BYTES`, replace `raw`
in the header's dict. Only FRAME_EVENTS carry bytes; any other frame, or one
too large, is read and dropped (a `log`): the stream stays in step. `send_frame`
sends one the other way, the bytes written as they are (the relay's chunks).

A writer thread owns the other direction: `send` only queues the command, so
a write that blocks (a full SSH window behind a cut link, a stopped agent)
never blocks the supervisor. While nothing else goes out, the writer sends
`{"op": "ping"}` every `ping_every_s`: the agent's lease (`--lease`) runs out
when it hears nothing, and it then stops its tasks. Used by every transport.
"""

from __future__ import annotations

import collections
import itertools
import json
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any

from ..agent.protocol import MAX_FRAME_BYTES, frame_head, frame_size, read_frame

_LINK_IDS = itertools.count(1)

# The longest line accepted from an agent. The agent's own messages stay far
# below it: an output line is cut at 8 KiB, a stack dump at 256 KiB, an exit
# report carries 30 such lines.
MAX_LINE_BYTES = 4 * 2**20
PING_EVERY_S = 1.0
# Commands queued for a pipe that does not take them; past this `send` says no.
MAX_PENDING = 10_000
# How long `close` waits for a writer that is not stuck in a write to deliver
# what is queued and the EOF.
CLOSE_WAIT_S = 1.0
_SKIP_CHUNK = 2**16
_LOG_TEXT_MAX = 2000
# Events only the link itself makes: an agent sending one gets a `log` instead.
_RESERVED_EVENTS = frozenset({"agent_lost"})
# The events that come with bytes (a frame): a piece of a checkpoint file.
FRAME_EVENTS = frozenset({"peer_chunk"})
PING = b'{"op":"ping"}\n'


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


def parse_message(raw: bytes) -> dict[str, Any]:
    """One line from an agent as a dict: its JSON object, else a `log` message."""
    try:
        message = json.loads(raw)
    except Exception:  # noqa: BLE001 - bad JSON, bad UTF-8, absurd nesting: all the same
        message = None
    if isinstance(message, dict):
        event = message.get("ev")
        if not (isinstance(event, str) and event in _RESERVED_EVENTS):
            return message
    return {"ev": "log", "text": raw[:_LOG_TEXT_MAX].decode("utf-8", "replace").rstrip()}


class AgentLink:
    def __init__(
        self,
        host: str,
        to_agent: IO[bytes],
        from_agent: IO[bytes],
        events: queue.Queue[AgentMessage],
        on_close: Callable[[], None] = lambda: None,
        diagnostics: Callable[[], str] = lambda: "",
        ping_every_s: float | None = PING_EVERY_S,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.host = host
        self._to_agent = to_agent
        self._from_agent = from_agent
        self._events = events
        self._on_close = on_close
        # Why the pipe ended (exit code, stderr tail), for error messages.
        self.diagnostics = diagnostics
        self._ping_every_s = ping_every_s
        self._max_line = max_line_bytes
        self._max_frame = max_frame_bytes
        self.hello: dict[str, Any] | None = None
        self.hello_seen = threading.Event()
        self.last_seen = time.monotonic()
        self.closed = False  # True once we closed it or the agent's side ended
        self.write_failed = False  # a write raised: the agent cannot hear us any more
        self.link_id = next(_LINK_IDS)
        # Each a command's line, or a frame's header and its bytes.
        self._pending: collections.deque[bytes | tuple[bytes, bytes]] = collections.deque()
        self._closing = False
        self._in_write = False
        self._wake = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"agent-{host}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"agent-{host}-writer",
                                        daemon=True)
        self._writer.start()

    def start_reading(self) -> None:
        self._reader.start()

    # ------------------------------------------------------------------ reading

    def _read(self) -> None:
        try:
            while True:
                raw = self._from_agent.readline(self._max_line + 1)
                if not raw:
                    break
                self.last_seen = time.monotonic()
                if len(raw) > self._max_line and not raw.endswith(b"\n"):
                    size = len(raw) + self._skip_rest_of_line()
                    message = {"ev": "log", "text": f"dropped a message of {size} bytes "
                               f"from the agent (longer than {self._max_line})"}
                elif (size := frame_size(raw)) is not None:
                    message = self._frame(raw, size)
                else:
                    message = parse_message(raw)
                if message.get("ev") == "hello":
                    self.hello = message
                    self.hello_seen.set()
                self._events.put(AgentMessage(self.host, message, self.link_id))
        except (OSError, ValueError, EOFError):
            pass
        finally:
            # Whatever ended the pipe, the supervisor must hear of it.
            self.closed = True
            self.hello_seen.set()  # wake anyone waiting: the agent is gone
            self._events.put(
                AgentMessage(self.host, {"ev": "agent_lost", "t": time.time(),
                                         "detail": self._safe_diagnostics()}, self.link_id)
            )

    def _frame(self, head: bytes, size: int) -> dict[str, Any]:
        """A frame's message, its bytes read (EOFError: the pipe ended in it)."""
        payload = read_frame(self._from_agent, size, self._max_frame, self._seen)
        if isinstance(payload, str):
            return {"ev": "log", "text": f"{payload} from the agent"}
        message = parse_message(head)
        if message.get("ev") not in FRAME_EVENTS:
            return {"ev": "log", "text": f"dropped a frame of {size} bytes from the agent: "
                    f"only {', '.join(sorted(FRAME_EVENTS))} carry bytes; its header: "
                    + head[:_LOG_TEXT_MAX].decode("utf-8", "replace").rstrip()}
        message["raw"] = payload
        return message

    def _seen(self) -> None:
        self.last_seen = time.monotonic()

    def _skip_rest_of_line(self) -> int:
        """Read and drop up to the next newline without keeping it; bytes dropped."""
        skipped = 0
        while True:
            chunk = self._from_agent.readline(_SKIP_CHUNK)
            skipped += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                return skipped
            self.last_seen = time.monotonic()

    def _safe_diagnostics(self) -> str:
        try:
            return self.diagnostics()
        except Exception as exc:  # noqa: BLE001 - a diagnostic must never hide the loss
            return f"(no diagnostics: {exc})"

    # ------------------------------------------------------------------ writing

    def send(self, message: dict[str, Any]) -> bool:
        """Queue one command; False when the agent is no longer reachable (the
        link is closed, a write failed, or the pipe has stopped taking them)."""
        return self._queue((json.dumps(message, separators=(",", ":")) + "\n").encode())

    def send_frame(self, command: dict[str, Any], payload: bytes) -> bool:
        """`send` of a command with bytes: its header line, then the bytes as
        they are (no copy, no base64)."""
        return self._queue((frame_head(len(payload), command), payload))

    def _queue(self, item: bytes | tuple[bytes, bytes]) -> bool:
        with self._wake:
            if self.closed or self._closing or self.write_failed:
                return False
            if len(self._pending) >= MAX_PENDING:
                return False
            self._pending.append(item)
            self._wake.notify()
        return True

    def _next_write(self) -> bytes | tuple[bytes, bytes] | None:
        """What to write next: a command, a ping when idle, None to close."""
        idle_since = time.monotonic()
        with self._wake:
            while not self._pending and not self._closing:
                if self._ping_every_s is None:
                    self._wake.wait()
                    continue
                left = idle_since + self._ping_every_s - time.monotonic()
                if left <= 0:
                    return PING
                self._wake.wait(left)
            return self._pending.popleft() if self._pending else None

    def _write_loop(self) -> None:
        while True:
            data = self._next_write()
            if data is None:
                break
            self._in_write = True
            try:
                for part in data if isinstance(data, tuple) else (data,):
                    self._to_agent.write(part)
                self._to_agent.flush()
            except Exception:  # noqa: BLE001 - any failure: the agent cannot hear us
                self.write_failed = True
                with self._wake:
                    self._pending.clear()
                break
            finally:
                self._in_write = False
        try:
            self._to_agent.close()  # EOF: the agent stops its tasks and exits
        except Exception:  # noqa: BLE001, S110 - already broken: nothing to tell
            pass

    def begin_close(self) -> None:
        """`close` without the wait: the writer sends what is queued, then the
        EOF, on its own (`close_links` starts every link's at once)."""
        self.closed = True
        with self._wake:
            self._closing = True
            self._wake.notify()

    def close(self) -> None:
        """Close the agent's stdin after what is queued: it stops its tasks and
        exits. Waits at most CLOSE_WAIT_S: a stalled pipe is left to the
        transport's `on_close`, which ends the connection or the agent."""
        self.begin_close()
        if not self._in_write:  # a write in progress may never end: do not wait for it
            self._writer.join(timeout=CLOSE_WAIT_S)
        self._on_close()


def close_links(links: Iterable[AgentLink]) -> None:
    """Close every link, their EOFs sent at once: one by one, each close waits
    for its writer's EOF to go out over a connection shared by ~130 threads
    (at 32 SSH hosts ~75 ms in all, after the last task had exited)."""
    links = list(links)
    for link in links:
        link.begin_close()
    for link in links:
        link.close()
