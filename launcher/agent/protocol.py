"""The agent's side of the wire: events written, commands' fields checked.

Newline-delimited JSON, one object per line; docs/design.md ("The agent
protocol") describes every message and its fields, in one place. One kind of
message carries bytes (`peer_chunk`: a piece of a checkpoint file) as a frame:
a JSON header line that starts `{"raw":N` (the size first, so it is read
without the rest of the line), then exactly N raw bytes; no base64, no JSON
pass over them. Both readers (the launcher's, launcher/transport/link.py, and
the agent's command reader) read those N bytes, at most MAX_FRAME_BYTES: a
larger frame is read and dropped, the stream stays in step either way.

supervisor -> agent (`op`): start, seal, signal, stop, exec_check, stacks, profile,
ping; with the memory tier peer_begin, peer_chunk, peer_end, peer_ack, peer_send,
peer_publish (launcher/agent/peercopy.py).
agent -> supervisor (`ev`, each with `t`): hello, started, start_failed,
output, progress, exited, heartbeat, exec_result, stacks, log, bye; with the
memory tier memory_held, peer_begin, peer_chunk, peer_end, peer_ack,
peer_stored, peer_done.

A bad command (not JSON, not an object, wrong types, a task name that is not
a plain file name, longer than MAX_COMMAND_BYTES) is refused with a `log` (or
`start_failed`) and never ends the agent or writes outside the run directory
(launcher/agent/commands.py); a task's output line longer than
MAX_OUTPUT_LINE is cut, with a marker (launcher/agent/tasks.py).

Standard library only; imports nothing of the launcher.
"""

from __future__ import annotations

import collections
import json
import re
import threading
import time

MAX_COMMAND_BYTES = 2**20
MAX_FRAME_BYTES = 2**20  # raw bytes after one frame's header (a chunk is 512 KiB)
FRAME_PIECE = 2**16  # read at a time: paramiko's read joins its packets per call
_FRAME_START = re.compile(rb'\{"raw":(\d{1,18})[,}]')
MAX_OUTPUT_LINE = 8192  # bytes of one output line; the rest is counted, not sent
MAX_PROGRESS_LINE = 2**16
MAX_ERROR_FILE = 2**16
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:\-]{0,252}")  # an IP or a host name
MAX_TARGETS = 4096
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a plain file name: no / or ..
CHUNK = 2**16
HANDOFF_EVENTS = 2  # a low-priority thread's events queued for the writer (Emitter)


class Emitter:
    """Writes events to the supervisor; one lock so lines never interleave.

    A thread at a lowered priority (the memory tier's copiers,
    memcopy.low_priority: `lowered_thread`) does not take that lock: once `start_handoff` has
    run, its events are made on its own thread (their CPU at its priority),
    queued, and written by a writer thread of normal priority. Taking the lock
    itself, such a thread held every other event (the heartbeats, the tasks'
    output, the answers to commands) behind its 512 KiB frames: niced, it took
    the lock back before a woken heartbeat thread ran, for a whole copy (25 s
    of no heartbeat in tests/test_agent_busy_host.py); at SCHED_IDLE, taken off
    the CPU while holding it, for seconds at a time. The launcher gives up on
    an agent silent for 10 s (restart.heartbeat_timeout_s).
    """

    def __init__(self, stream) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._handoff: _Handoff | None = None

    def start_handoff(self) -> None:
        """The writer of the low-priority threads' events; call it from a thread
        of normal priority (a new thread takes its creator's), before such a
        thread starts. Once is enough."""
        with self._lock:
            if self._handoff is None:
                self._handoff = _Handoff(self._write)

    def drain_handoff(self, timeout_s: float) -> bool:
        """Wait until the events handed off so far are written (False: timed out).
        They come in order per thread, not with the other threads' events: the
        agent drains before a task's `exited` and before its `bye`."""
        return self._handoff is None or self._handoff.drain(timeout_s)

    def __call__(self, event: str, **fields: object) -> None:
        fields["ev"] = event
        fields.setdefault("t", time.time())
        self.line((json.dumps(fields, separators=(",", ":")) + "\n").encode())

    def frame(self, event: str, payload: bytes, **fields: object) -> None:
        """An event with bytes: its header line, then the bytes (under the lock)."""
        fields["ev"] = event
        fields.setdefault("t", time.time())
        self.line(frame_head(len(payload), fields), payload)

    def line(self, data: bytes, payload: bytes = b"") -> None:
        """One event's line, already made (a JSON object and its newline)."""
        if self._handoff is not None and _lowered():
            self._handoff.put(data, payload)
        else:
            self._write(data, payload)

    def _write(self, data: bytes, payload: bytes) -> None:
        with self._lock:
            try:
                self._stream.write(data)
                if payload:
                    self._stream.write(payload)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the supervisor is gone; stdin EOF will stop us


_LOWERED = threading.local()


def lowered_thread() -> None:
    """The calling thread runs at a lowered CPU priority from now on
    (memcopy.low_priority): its events go through the Emitter's handoff."""
    _LOWERED.on = True


def _lowered() -> bool:
    return getattr(_LOWERED, "on", False)


class _Handoff:
    """Events queued by low-priority threads, written in order by a thread of
    normal priority; at most HANDOFF_EVENTS wait (a frame is 512 KiB), then
    the caller waits."""

    def __init__(self, write) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._events: collections.deque[tuple[bytes, bytes]] = collections.deque()
        threading.Thread(target=self._run, daemon=True, name="emit-handoff").start()

    def put(self, data: bytes, payload: bytes) -> None:
        with self._cond:
            while len(self._events) >= HANDOFF_EVENTS:
                self._cond.wait()
            self._events.append((data, payload))
            self._cond.notify_all()

    def drain(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._events, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._events:
                    self._cond.wait()
                data, payload = self._events[0]
            self._write(data, payload)
            with self._cond:
                self._events.popleft()  # only now: `drain` waits for the write
                self._cond.notify_all()


class BadCommand(ValueError):
    """A command whose fields are missing or of the wrong type."""


def task_name(value: object) -> str:
    if not isinstance(value, str) or not TASK_NAME.fullmatch(value):
        raise BadCommand(f"task name {str(value)[:80]!r} is not a plain name "
                         "(letters, digits, '_', '.', '-'; no '/', not starting with '.')")
    return value


def targets(value: object) -> list[tuple[str, int]]:
    """`seal_ports`' (address or host name, port) pairs."""
    if not isinstance(value, list) or len(value) > MAX_TARGETS or not all(
            isinstance(t, list) and len(t) == 2 and isinstance(t[0], str)
            and _ADDRESS.fullmatch(t[0]) and isinstance(t[1], int) and not isinstance(t[1], bool)
            and 1 <= t[1] <= 65535 for t in value):
        raise BadCommand(f"targets must be a list of [address, port], not {str(value)[:80]!r}")
    return [(t[0], t[1]) for t in value]


def names(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadCommand(f"tasks must be null or a list of names, not {str(value)[:80]!r}")
    return value


def integer(message: dict, key: str, default: int | None = None, low: int | None = None,
            high: int | None = None) -> int:
    value = message.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadCommand(f"{key} must be an integer, not {str(value)[:80]!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadCommand(f"{key}={value} is out of range")
    return value


def seconds(message: dict, key: str, default: float) -> float:
    value = message.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 <= value < float("inf"):
        raise BadCommand(f"{key} must be a number of seconds, not {str(value)[:80]!r}")
    return float(value)


def opt_str(message: dict, key: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise BadCommand(f"{key} must be a string, not {str(value)[:80]!r}")
    return value


def str_list(message: dict, key: str) -> list[str]:
    value = message.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise BadCommand(f"{key} must be a non-empty list of strings, not {str(value)[:80]!r}")
    return value


def start_spec(message: dict) -> dict:
    """A `start` command's argv, cwd, env, tf_config and standby, checked."""
    env = message.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise BadCommand("env must be an object of strings")
    tf_config = message.get("tf_config")
    if not isinstance(tf_config, str):
        raise BadCommand("tf_config must be a string")
    standby = message.get("standby", "off")
    if standby not in ("auto", "off"):
        raise BadCommand(f"standby must be 'auto' or 'off', not {str(standby)[:40]!r}")
    return {"argv": str_list(message, "argv"), "cwd": opt_str(message, "cwd") or None,
            "env": env, "tf_config": tf_config, "standby": standby}


def skip_line(stream, on_chunk=lambda: None) -> int:
    """Read and drop the rest of a line; its length without the newline."""
    skipped = 0
    while True:
        chunk = stream.readline(CHUNK)
        if not chunk:
            return skipped
        on_chunk()
        if chunk.endswith(b"\n"):
            return skipped + len(chunk) - 1
        skipped += len(chunk)


def frame_head(size: int, fields: dict) -> bytes:
    """A frame's header line: `{"raw":size,...}` and its newline; `size` raw
    bytes are to follow it."""
    head: dict = {"raw": size}
    head.update((k, v) for k, v in fields.items() if k != "raw")
    return (json.dumps(head, separators=(",", ":")) + "\n").encode()


def frame_size(line: bytes) -> int | None:
    """The bytes a frame's header line says follow it; None: a plain line."""
    found = _FRAME_START.match(line)
    return int(found.group(1)) if found else None


def read_frame(stream, size: int, limit: int, on_piece=lambda: None) -> bytes | str:
    """The `size` bytes that follow a frame's header; more than `limit`: read
    and dropped, and a str says so. EOFError when the stream ends first."""
    pieces = []
    left = size
    while left:
        piece = stream.read(min(left, FRAME_PIECE))
        if not piece:
            raise EOFError(f"the stream ended {left} bytes into a frame of {size}")
        left -= len(piece)
        on_piece()
        if size <= limit:
            pieces.append(piece)
    if size > limit:
        return f"dropped a frame of {size} bytes (more than {limit})"
    return b"".join(pieces)
