"""Warm starts, the agent's side: one standby per task (launcher/standby.py).

A standby is an interpreter that has imported TensorFlow and waits for its
task on stdin. A task's next standby is started once the task is past its own
start (STANDBY_AFTER_STEP_S after its first training step: the standby's
import must not slow that start), when it fails (a restart follows), or
STANDBY_AFTER_S after its start. A start is warm only when the standby is
ready and nothing it saw at its start differs from what the task would
(`why_cold` says what did). A standby is recorded, signalled on the agent's
death and reaped like a task; the agent kills its standbys when it stops.

Standard library only; of the launcher, imports standby, strategy (Keras on
JAX has no standby) and the agent's spawn and leftovers (its pid record).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

from launcher.agent.files import unlink
from launcher.agent.leftovers import PidRecords
from launcher.agent.spawn import TOKEN_VAR, Spawner
from launcher.proctree import TaskTree
from launcher.standby import (
    EXIT_NO_TENSORFLOW,
    READY,
    READY_FD,
    env_write_problem,
    leading_presets,
    per_start,
    script_env_writes,
    script_of,
    standby_argv,
    start_env_differences,
    with_presets,
)
from launcher.strategy import ON_JAX

STANDBY_AFTER_STEP_S = 5.0  # a task's next standby starts this long after its first step
STANDBY_AFTER_S = 30.0  # a task that reports no step gets its standby this long after its start


class Standby:
    """An interpreter that has imported TensorFlow and waits for its task on stdin."""

    def __init__(self, proc: subprocess.Popen, argv: list[str], env: dict[str, str],
                 token: str, progress_read: int, progress_fd: int, tree: TaskTree) -> None:
        self.proc = proc
        self.tree = tree  # handed to its task
        self.argv = argv
        self.env = env  # at its interpreter's start
        self.token = token
        self.progress_read = progress_read
        self.progress_fd = progress_fd  # the write end's number, in the standby
        self.pid_file: str | None = None
        self.spawned = time.monotonic()
        self.ready = threading.Event()  # TensorFlow imported: a start may be warm


class Want:
    """A running task's next standby, not started yet (started once)."""

    def __init__(self, standbys: Standbys, name: str, spec: dict, env: dict[str, str]) -> None:
        self._standbys = standbys
        self.name, self.spec, self.env = name, spec, env
        self.pending = True
        self.timed = False  # its first step started the standby's timer

    def trained(self) -> None:
        """The task reported a step: its start is behind it. A job of seconds
        never pays for a standby it would not use."""
        if self.pending and not self.timed:
            self.timed = True
            self._standbys.later(STANDBY_AFTER_STEP_S, self.now)

    def now(self) -> None:
        """Start the standby now (once), on the command thread."""
        with self._standbys.spawner.lock:
            pending, self.pending = self.pending, False
        if pending:
            self._standbys.on_command_thread(
                lambda: self._standbys.spawn(self.name, self.spec, self.env))


class Standbys:
    """Per task name, its standby, or why it has none."""

    def __init__(self, spawner: Spawner, records: PidRecords, emit, on_command_thread) -> None:
        self.spawner = spawner
        self.records = records
        self.emit = emit
        self.on_command_thread = on_command_thread  # runs a callable on the command thread
        self.standbys: dict[str, Standby] = {}
        self.no_standby: dict[str, str] = {}
        self.script_writes: dict[tuple[str, int, int], tuple[list, list]] = {}

    @staticmethod
    def later(delay_s: float, action) -> None:
        timer = threading.Timer(delay_s, action)
        timer.daemon = True
        timer.start()

    def take(self, name: str) -> Standby | None:
        return self.standbys.pop(name, None)

    def want(self, name: str, spec: dict, env: dict[str, str]) -> Want | None:
        """A task just started: its standby to come, if it may have one."""
        if spec["standby"] != "auto" or self.problem(name, spec, env):
            return None
        wanted = Want(self, name, spec, env)
        self.later(STANDBY_AFTER_S, wanted.now)
        return wanted

    def problem(self, name: str, spec: dict, env: dict[str, str]) -> str:
        """Why no standby can serve this task at all ("" if one can)."""
        if spec["standby"] != "auto":
            return "restart.warm_standby is off"
        if name in self.no_standby:
            return self.no_standby[name]
        if standby_argv(spec["argv"]) is None:
            return "not a script run by launcher.bootstrap"
        if spec["env"].get("MGPU_STRATEGY") in ON_JAX:
            return "Keras on JAX: no TensorFlow to import ahead"
        script = script_of(spec["argv"], spec["cwd"])
        if not os.path.exists(script):
            return ""  # the start fails the same way warm or cold
        writes, presets = self._script_env(spec)
        return env_write_problem(script, writes, with_presets(env, presets))

    def _script_env(self, spec: dict) -> tuple[list, list]:
        """The script's environment writes and its leading presets (cached per
        file version); none for a script that cannot be read."""
        script = script_of(spec["argv"], spec["cwd"])
        try:
            info = os.stat(script)
        except OSError:
            return [], []
        key = (script, info.st_mtime_ns, info.st_size)
        if key not in self.script_writes:
            self.script_writes[key] = (script_env_writes(script), leading_presets(script))
        return self.script_writes[key]

    def why_cold(self, name: str, spec: dict, env: dict[str, str],
                 standby: Standby | None) -> str:
        """Why this start cannot use `standby` ("" when it can: a warm start)."""
        problem = self.problem(name, spec, env)
        if problem:
            return problem
        if standby is None:
            return "no standby yet (the first start of this task on this host)"
        code = standby.proc.poll()
        if code is not None:
            self.no_standby[name] = why = (
                "its standby could not import TensorFlow" if code == EXIT_NO_TENSORFLOW
                else f"its standby ended by itself (exit {code})")
            return why
        if standby.argv != standby_argv(spec["argv"]):
            return "the interpreter or its flags changed"
        differ = start_env_differences(standby.env,
                                       with_presets(env, self._script_env(spec)[1]))
        if differ:
            return ("the environment at interpreter start differs in "
                    + ", ".join(differ[:5]) + (" ..." if len(differ) > 5 else ""))
        if not standby.ready.is_set():  # a hand-off would wait for its import: start now
            return (f"its standby was not ready (importing TensorFlow since "
                    f"{time.monotonic() - standby.spawned:.1f} s)")
        return ""

    def hand_off(self, standby: Standby, spec: dict, env: dict[str, str]) -> str:
        """Give the standby its task; why not ("" when done)."""
        at = len(standby.argv) - 1  # the task's argv goes on where the standby's has --standby
        message = {"argv": spec["argv"][at:], "cwd": spec["cwd"], "env": env}
        try:
            standby.proc.stdin.write(json.dumps(message).encode())
            standby.proc.stdin.close()
        except (OSError, ValueError) as exc:
            return f"its standby did not take the task ({type(exc).__name__})"
        standby.pid_file = None  # the task's record replaces the standby's (same path)
        return ""

    def spawn(self, name: str, spec: dict, task_env: dict[str, str]) -> None:
        """Start the standby for this task's next start (on the command thread:
        PR_SET_PDEATHSIG is bound to the thread that starts a process)."""
        argv = standby_argv(spec["argv"])
        if argv is None or self.problem(name, spec, task_env):
            return
        # The script's leading writes made ahead: TensorFlow's import sees them.
        env = {k: v for k, v in with_presets(task_env, self._script_env(spec)[1]).items()
               if not per_start(k)}
        env[TOKEN_VAR] = token = os.urandom(8).hex()
        progress_read, progress_write = os.pipe()
        env[READY_FD] = str(progress_write)
        with self.spawner.lock:
            if self.spawner.closing or name in self.standbys:
                os.close(progress_read)
                os.close(progress_write)
                return
            try:
                proc, tree = self.spawner.popen(argv, spec["cwd"], env, subprocess.PIPE,
                                                progress_write)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                os.close(progress_read)
                self.no_standby[name] = f"its standby could not start: {exc}"
                return
            finally:
                os.close(progress_write)
            standby = Standby(proc, argv, env, token, progress_read, progress_write, tree)
            self.standbys[name] = standby
            ready_read = os.dup(progress_read)  # the watcher's own: closed by it alone
        standby.pid_file = self.records.write(name, None, proc.pid, token)
        threading.Thread(target=self._await_ready, args=(name, standby, ready_read),
                         daemon=True).start()

    def _await_ready(self, name: str, standby: Standby, fd: int) -> None:
        """Mark `standby` ready once it says so (before any hand-off: a start
        is warm only then); a standby that dies first closes the pipe."""
        got = b""
        try:
            while len(got) < len(READY):
                chunk = os.read(fd, len(READY) - len(got))
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        finally:
            os.close(fd)
        if got == READY:
            standby.ready.set()
            took = time.monotonic() - standby.spawned
            self.emit("log", text=f"standby of {name} ready ({took:.1f} s)")

    def drop(self, standby: Standby) -> None:
        """Kill a standby that is not needed (it holds an interpreter's memory)."""
        try:
            os.killpg(standby.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (standby.proc.stdin, standby.proc.stdout, standby.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        try:
            os.close(standby.progress_read)
        except OSError:
            pass

        def wait_and_reap() -> None:
            standby.proc.wait()  # no zombie
            self.spawner.reaped(standby.tree)

        threading.Thread(target=wait_and_reap, daemon=True).start()
        if standby.pid_file:
            unlink(standby.pid_file)

    def drop_all(self) -> None:
        with self.spawner.lock:
            standbys = list(self.standbys.values())
            self.standbys.clear()
        for standby in standbys:
            self.drop(standby)

