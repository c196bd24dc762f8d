"""The agent's one command thread: stdin read, each command run.

A thread reads stdin and renews the lease; the command thread runs the
commands. Reading never waits on a command: one stuck writing to a slow
launcher (a full SSH window) must not leave the pings unread and the lease to
run out. Commands run on the command thread, the agent's main thread, and so
does every other process start (a standby's, queued as a callable): tasks are
started from it, and PR_SET_PDEATHSIG fires when the thread that started a
task ends, so it must live as long as the agent.

A bad command is logged (a `log` event) and ignored; it never ends the agent.
A frame (protocol.py: a header line, then its bytes) is read whole by the
reader; only `peer_chunk` takes bytes, any other is refused.

Standard library only; of the launcher, imports the agent's parts it drives.
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import threading

from launcher.agent.profiles import Profiles
from launcher.agent.protocol import (
    MAX_COMMAND_BYTES,
    MAX_FRAME_BYTES,
    BadCommand,
    frame_size,
    integer,
    names,
    opt_str,
    read_frame,
    seconds,
    skip_line,
    str_list,
    targets,
    task_name,
)
from launcher.agent.stacks import Stacks
from launcher.agent.tasks import Tasks


class Lines:
    """A queue between two threads (the queue module costs ~1 ms of start-up)."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._ready = threading.Semaphore(0)

    def put(self, item) -> None:  # bytes, (bytes, bytes), str, a callable or None
        self._items.append(item)
        self._ready.release()

    def get(self):
        self._ready.acquire()
        return self._items.popleft()


class Commands:
    """Parses, checks and runs one command line at a time."""

    def __init__(self, tasks: Tasks, stacks: Stacks, emit,
                 profiles: Profiles | None = None) -> None:
        self.tasks = tasks
        self.stacks = stacks
        self.emit = emit
        self.profiles = profiles
        self.peers = None  # the memory tier's copies on other hosts (peercopy.PeerCopies)

    def dispatch(self, raw: bytes, payload: bytes | None = None) -> None:
        """One line from stdin (with its frame's bytes, if one): parse, check and
        run it; never raise."""
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            self.emit("log", text=f"ignored a line that is not JSON ({type(exc).__name__}): "
                      f"{raw[:80]!r}")
            return
        if not isinstance(message, dict):
            self.emit("log", text=f"ignored a line that is not a JSON object: {raw[:80]!r}")
            return
        try:
            if payload is not None:
                if message.get("op") != "peer_chunk":
                    raise BadCommand("only peer_chunk carries bytes")
                message["raw"] = payload
            self.handle(message)
        except BadCommand as exc:
            self.emit("log", text=f"refused {str(message.get('op'))[:40]!r}: {exc}")
        except Exception as exc:  # one bad command must not take the tasks' keeper down
            self.emit("log", text=f"ignored command {raw[:80]!r}: {type(exc).__name__}: {exc}")

    def handle(self, message: dict) -> None:
        op = message.get("op")
        if op == "ping":
            return  # reading it renewed the lease
        if op == "start":
            self.tasks.start(message)
        elif op == "seal":
            # The rules ahead of the start, while the other hosts still start
            # their agents; the start's own `firewall` then finds them in place.
            # A failure under `cluster` is the start's to refuse (it tries again).
            self.tasks.seal.seal(message.get("firewall"))
        elif op == "seal_ports":  # ports other hosts' tasks opened (agent/seal.py)
            self.tasks.seal.peer_ports(targets(message.get("targets")))
        elif op == "signal":
            name = task_name(message.get("task"))
            signum = integer(message, "signum", low=1, high=signal.NSIG - 1)
            by = message.get("by")  # who asked (the drill), said with the task's exit
            self.tasks.signal(name, signum, by[:40] if isinstance(by, str) else "")
        elif op == "stop":
            self.tasks.stop(names(message.get("tasks")), seconds(message, "grace_s", 3.0),
                            seconds(message, "settle_s", 0.0))
        elif op == "exec_check":
            self.exec_check_later(message)
        elif op == "stacks":
            wanted = names(message.get("tasks"))
            self.stacks.request(self.tasks.running(wanted), wanted)
        elif op == "profile" and self.profiles is not None:
            wanted = names(message.get("tasks"))
            try:
                self.profiles.request(self.tasks.running(wanted), wanted, message)
            except (TypeError, ValueError) as exc:
                raise BadCommand(str(exc)) from exc
        elif op == "nan" and self.profiles is not None:  # the drill's NaN (`drill --nan`)
            name = task_name(message.get("task"))
            self.profiles.poison(self.tasks.running([name]), name,
                                 seconds(message, "within_s", 10.0))
        elif isinstance(op, str) and op.startswith("peer_") and self.peers is not None:
            try:
                self.peers.handle(op, message)
            except (KeyError, TypeError, ValueError) as exc:
                raise BadCommand(str(exc)) from exc
        else:
            self.emit("log", text=f"unknown op {str(op)[:40]!r}")

    def exec_check_later(self, message: dict) -> None:
        """exec_check in a thread: a slow command must not hold up the pings
        (the lease) or other commands."""
        argv = str_list(message, "argv")
        timeout = seconds(message, "timeout_s", 60.0)
        cwd = opt_str(message, "cwd")
        ident = message.get("id")
        threading.Thread(target=self.exec_check, args=(ident, argv, timeout, cwd),
                         daemon=True).start()

    def exec_check(self, ident: object, argv: list[str], timeout: float,
                   cwd: str | None) -> None:
        """Run a short command (used by `mgpu-launch check`) and report its output."""
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  cwd=cwd or None)
            self.emit("exec_result", id=ident, code=done.returncode,
                      stdout=done.stdout[-20000:], stderr=done.stderr[-5000:])
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self.emit("exec_result", id=ident, code=None,
                      stdout="", stderr=f"{type(exc).__name__}: {exc}")


def read_commands(commands: Commands, lines: Lines, stdin, heard) -> None:
    """Run each command line until EOF, on this thread (see the module
    docstring: it must live as long as the agent)."""
    threading.Thread(target=_read_stdin, args=(stdin, lines, heard), daemon=True).start()
    while True:
        item = lines.get()
        if item is None:
            return
        if callable(item):  # work for this thread (a standby to start)
            item()
        elif isinstance(item, str):
            commands.emit("log", text=item)
        elif isinstance(item, tuple):  # a frame: its header line and its bytes
            commands.dispatch(*item)
        else:
            commands.dispatch(item)


def _read_stdin(stdin, lines: Lines, heard) -> None:
    """Lines for `read_commands` (a str: a log to send instead; a frame's header
    line and bytes as a pair), None at EOF;
    `heard()` renews the lease on every read."""
    try:
        while True:
            raw = stdin.readline(MAX_COMMAND_BYTES + 1)
            if not raw:
                return
            heard()
            if len(raw) > MAX_COMMAND_BYTES and not raw.endswith(b"\n"):
                size = len(raw) + skip_line(stdin, heard)
                lines.put(f"ignored a command of {size} bytes (longer than {MAX_COMMAND_BYTES})")
                continue
            size = frame_size(raw)
            if size is None:
                lines.put(raw)
                continue
            payload = read_frame(stdin, size, MAX_FRAME_BYTES, heard)
            lines.put(f"{payload} from the launcher" if isinstance(payload, str)
                      else (raw, payload))
    except (OSError, ValueError, EOFError):
        return
    finally:
        lines.put(None)
