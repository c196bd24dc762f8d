"""The task processes of one host: start, output, progress, exit, stop.

- every task runs in its own session/process group; stopping a task signals
  the whole group and its whole tree (launcher.proctree: its cgroup, or the
  tree recorded while it lived, which keeps a `setsid` child whose parent is
  gone); when a task exits, whatever is left of its tree is killed;
- TF_CONFIG is written to a 0600 file in the run directory and exported to the
  task; it never appears on a command line;
- a task's output is cut into lines (launcher.outlines: a run of carriage
  returns, a progress bar, is one line, its last state); a line longer than
  MAX_OUTPUT_LINE is cut, with a marker;
- a start is handed to the task's standby when one can serve it
  (launcher/agent/standbys.py), else started cold, always on the command
  thread (launcher/agent/spawn.py: PR_SET_PDEATHSIG).

Standard library only; of the launcher, imports outlines, proctree and the
agent's parts it drives (standbys, stacks, seal, pid records, files, spawn).
"""

from __future__ import annotations

import collections
import io
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from launcher.agent import evidence, hostfacts
from launcher.agent.bundle import CODE_DIR, mark_used
from launcher.agent.files import private_dir, read_json, unlink, write_private
from launcher.agent.leftovers import PidRecords
from launcher.agent.profiles import REQUEST_ENV as PROFILE_REQUEST_ENV
from launcher.agent.profiles import clear_requests, request_path
from launcher.agent.protocol import (
    CHUNK,
    MAX_ERROR_FILE,
    MAX_OUTPUT_LINE,
    MAX_PROGRESS_LINE,
    BadCommand,
    integer,
    skip_line,
    start_spec,
    task_name,
)
from launcher.agent.seal import Seal
from launcher.agent.spawn import TOKEN_VAR, Spawner
from launcher.agent.stacks import stacks_setup
from launcher.agent.standbys import Standbys, Want
from launcher.outlines import LineSplitter
from launcher.proctree import TaskTree

TAIL_LINES = 30
MAX_SIGNALLED = 8  # signals a task's exit report lists (a SIGTERM, then a SIGKILL: two)
# After a task exits (and what was left of its tree was killed), its output is
# read to the end before the exit is reported: the launcher ends a job on its
# last exit and would lose lines reported after it. The end is EOF, or DRAIN_S
# without a byte (a process that escaped the tree holds the pipe open), or
# DRAIN_MAX_S after the exit (one that keeps writing).
DRAIN_S = 1.0
DRAIN_MAX_S = 10.0
# How often a reader with nothing to read looks whether its task has exited.
READ_POLL_MS = 250
# A task's heartbeat figures start this long after its start: psutil's first
# CPU reading of a process says nothing (0.0), and loading psutil (~17 ms of
# CPU) and a health sample would fall on every host at once, while the job's
# processes start: 32 simulated hosts paid ~19 ms of agent CPU each for a
# trivial task. A training task is seen from its second heartbeat on.
FIRST_FIGURES_S = 2.0


class RunningTask:
    def __init__(self, name: str, generation: int, proc: subprocess.Popen, error_file: str,
                 tree: TaskTree):
        self.name = name
        self.tree = tree  # every process it started, even one that left its session
        self.generation = generation
        self.proc = proc
        self.error_file = error_file
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.readers: list[threading.Thread] = []
        self.waiter: threading.Thread | None = None  # reports its exit (Tasks._wait)
        self.progress_reader: threading.Thread | None = None
        self.stopping = False  # the agent sent SIGTERM
        self.killed = False  # the agent sent SIGKILL
        # The signals a `signal` op sent it (signal, time, who asked): told with its exit.
        self.signalled: list[dict] = []
        self.stacks_file: str | None = None
        self.stacks_signum: int | None = None
        self.stacks_problem = ""  # why there are no stacks for this task, if so
        self.standby: Want | None = None  # its next standby, not started yet
        self.pid_file: str | None = None
        self._ps = None
        self.born = time.monotonic()
        self.evidence = evidence.at_start(proc.pid)  # why it ended, as its host tells (evidence.py)
        self.reaped_at: float | None = None  # monotonic; its output is drained from then on

    @property
    def ps(self):
        """The task's psutil.Process (None without psutil, or once it is gone)."""
        psutil = hostfacts.load_psutil() if self._ps is None else None
        if psutil is not None:
            try:
                self._ps = psutil.Process(self.proc.pid)
            except psutil.Error:
                return None
        return self._ps

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_tree(self, signum: int) -> None:
        """Signal the task's process group and any descendant that left it."""
        victims = []
        if self.ps is not None:
            try:
                victims = self.ps.children(recursive=True)
            except hostfacts.psutil.Error:
                victims = []
        group = self.proc.pid
        try:
            os.killpg(group, signum)
        except (ProcessLookupError, PermissionError):
            pass
        # Each process once: a second SIGTERM that lands while the script's
        # handler runs calls it again (a save on SIGTERM made twice, outlasting
        # the grace: CI saw a 5 s save take 10 s).
        for child in victims:
            try:
                if _group_of(child.pid) != group:
                    child.send_signal(signum)
            except hostfacts.psutil.Error:
                pass
        self.tree.signal(signum, but_group=group)  # its orphans too (setsid, then the parent died)


class Tasks:
    """The host's tasks by name; `start`, `signal` and `stop` come from commands."""

    def __init__(self, run_dir: str, spawner: Spawner, standbys: Standbys, seal: Seal,
                 records: PidRecords, emit) -> None:
        self.run_dir = run_dir
        self.spawner = spawner
        self.lock = spawner.lock
        self.standbys = standbys
        self.seal = seal
        self.records = records
        self.emit = emit
        self.tasks: dict[str, RunningTask] = {}
        self.on_profile = None  # (task, record): a trace's answer (main wires profiles.py)
        self.memory = None  # the memory tier's copies (memcopy.MemoryCopies, wired by main)
        self.asked = False  # a `start` came: the host folder may hold the job's files

    def start(self, message: dict) -> None:
        self.asked = True
        raw_name = message.get("task")
        if not isinstance(raw_name, str):
            raise BadCommand(f"task must be a string, not {type(raw_name).__name__}")
        name = raw_name[:200]
        generation = message.get("generation", 0)
        try:
            task_name(name)
            generation = integer(message, "generation", default=0, low=0)
            spec = start_spec(message)
        except BadCommand as exc:
            self.emit("start_failed", task=name,
                      generation=generation if isinstance(generation, int) else None,
                      error=f"refused: {exc}")
            return
        with self.lock:
            old = self.tasks.get(name)
            busy = (f"task {name} is still running (pid {old.proc.pid})"
                    if old is not None and old.alive() else
                    "the agent is stopping" if self.spawner.closing else "")
        if busy:
            self.emit("start_failed", task=name, generation=generation, error=busy)
            return
        refusal = self.seal.seal(message.get("firewall"))  # before the task opens its port
        if refusal:
            self.emit("start_failed", task=name, generation=generation, error=refusal)
            return
        self._launch(name, generation, spec)

    def _launch(self, name: str, generation: int, spec: dict) -> None:
        """Hand the task to its standby, or start it cold; then watch it."""
        if self.memory is not None:
            self._copies_done()
        standby = self.standbys.take(name)
        try:
            env = self._task_env(name, generation, spec)
            why_cold = self.standbys.why_cold(name, spec, env, standby)
            if not why_cold:
                assert standby is not None
                env[TOKEN_VAR], env["MGPU_PROGRESS_FD"] = standby.token, str(standby.progress_fd)
                stacks = stacks_setup(self.run_dir, name, generation, env)
                why_cold = self.standbys.hand_off(standby, spec, env)
            if why_cold:
                if standby is not None:
                    self.standbys.drop(standby)
                    standby = None
                stacks = stacks_setup(self.run_dir, name, generation, env)
                proc, tree, progress_read = self._start_cold(spec, env)
            else:
                assert standby is not None
                proc, progress_read, tree = standby.proc, standby.progress_read, standby.tree
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            if standby is not None:
                self.standbys.drop(standby)
            self.emit("start_failed", task=name, generation=generation,
                      error=f"{type(exc).__name__}: {exc}")
            return
        mark_used()
        task = RunningTask(name, generation, proc, env["MGPU_ERROR_FILE"], tree)
        task.stacks_file, task.stacks_signum, task.stacks_problem = stacks
        task.pid_file = self.records.write(task.name, task.generation, proc.pid, env[TOKEN_VAR])
        with self.lock:
            self.tasks[name] = task
        self.emit("started", task=name, generation=generation, pid=proc.pid,
                  start="cold" if why_cold else "warm", start_reason=why_cold)
        self._follow(task, progress_read)
        task.standby = self.standbys.want(name, spec, env)

    def _copies_done(self) -> None:
        """The memory tier: the saves the tasks that ran here made are queued
        for their copy, each directory marked while its copy is under way,
        before a task starts: a restarted task waits for the marker before it
        reads that directory (runtime/memslots.py), so every worker of the new
        generation restores the newest checkpoint (the workers' restores come
        after the cluster formed: after this start), and the start, the imports
        and the model's build overlap the copy (memcopy.py)."""
        with self.lock:
            readers = [t.progress_reader for t in self.tasks.values() if t.progress_reader]
        for reader in readers:  # their last `memory_saved` lines read: marked
            reader.join(timeout=DRAIN_S)

    def _start_cold(self, spec: dict,
                    env: dict[str, str]) -> tuple[subprocess.Popen, TaskTree, int]:
        """A new interpreter for the task, with its own token and progress pipe."""
        env[TOKEN_VAR] = os.urandom(8).hex()
        progress_read, progress_write = os.pipe()
        env["MGPU_PROGRESS_FD"] = str(progress_write)
        try:
            proc, tree = self.spawner.popen(spec["argv"], spec["cwd"], env,
                                            subprocess.DEVNULL, progress_write)
        except BaseException:
            os.close(progress_read)
            raise
        finally:
            os.close(progress_write)  # the task holds the only write end now
        return proc, tree, progress_read

    def _task_env(self, name: str, generation: int, spec: dict) -> dict[str, str]:
        """The task's environment but for its token, progress fd and stacks file;
        writes its TF_CONFIG file and clears its error file."""
        tf_config_file = os.path.join(private_dir(self.run_dir, "tf_config"), f"{name}.json")
        write_private(tf_config_file, spec["tf_config"])
        error_file = os.path.join(private_dir(self.run_dir, "errors"),
                                  f"{name}-gen{generation}.json")
        if os.path.exists(error_file):
            os.unlink(error_file)
        env = dict(os.environ)
        env.update(spec["env"])
        if env.get("MGPU_RUN_DIR", "").startswith("~"):
            env["MGPU_RUN_DIR"] = os.path.expanduser(env["MGPU_RUN_DIR"])
        env["TF_CONFIG"] = spec["tf_config"]
        env["MGPU_TF_CONFIG_FILE"] = tf_config_file
        env["MGPU_ERROR_FILE"] = error_file
        env[PROFILE_REQUEST_ENV] = request_path(self.run_dir, name)  # runtime/trace.py
        clear_requests(self.run_dir, name)  # none of an earlier generation's
        if self.memory is not None:
            self.memory.task_env(name, env)  # the memory tier's folder (memcopy.py)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (CODE_DIR, env.get("PYTHONPATH", "")) if p
        )
        return env

    def _follow(self, task: RunningTask, progress_read: int) -> None:
        """A thread per output stream, one for progress, one for the exit."""
        for stream_name, stream in (("stdout", task.proc.stdout), ("stderr", task.proc.stderr)):
            reader = threading.Thread(
                target=self._read_output, args=(task, stream_name, stream), daemon=True
            )
            reader.start()
            task.readers.append(reader)
        task.progress_reader = threading.Thread(target=self._read_progress,
                                                args=(task, progress_read), daemon=True)
        task.progress_reader.start()
        task.waiter = threading.Thread(target=self._wait, args=(task,), daemon=True)
        task.waiter.start()

    def _read_output(self, task: RunningTask, stream_name: str, stream) -> None:
        # Lines end at "\n"; a "\r" run (a progress bar) keeps its last state.
        splitter = LineSplitter(MAX_OUTPUT_LINE)
        pipe = _DrainedPipe(task, stream.fileno())
        while True:
            data = pipe.read(CHUNK)
            texts = splitter.feed(data) if data else splitter.close()
            for text in texts:
                task.tail.append(text)
                self.emit("output", task=task.name, generation=task.generation,
                          stream=stream_name, text=text)
            if not data:
                break
        stream.close()

    def _read_progress(self, task: RunningTask, fd: int) -> None:
        with io.BufferedReader(_DrainedPipe(task, fd, owned=True)) as stream:
            while True:
                raw = stream.readline(MAX_PROGRESS_LINE + 1)
                if not raw:
                    break
                if len(raw) > MAX_PROGRESS_LINE and not raw.endswith(b"\n"):
                    skip_line(stream)
                    continue
                try:
                    data = json.loads(raw)
                except (ValueError, RecursionError):
                    continue
                if isinstance(data, dict) and "profile" in data and self.on_profile:
                    self.on_profile(task, data["profile"])  # a trace's answer (profiles.py)
                elif isinstance(data, dict) and "memory_saved" in data and self.memory:
                    self.memory.saved(data["memory_saved"], task.name,  # in the background
                                      task.generation)
                elif isinstance(data, dict):
                    self.emit("progress", task=task.name, generation=task.generation, data=data)
                    if task.standby is not None and "step" in data:
                        task.standby.trained()  # it trains: its start is behind it

    def _wait(self, task: RunningTask) -> None:
        code = task.proc.wait()
        exited_at = time.time()  # before draining: the root cause is the earliest exit
        if code != 0 and task.standby is not None:
            task.standby.now()  # a restart is likely to follow
        # Whatever the task left behind in its group (data-loader workers,
        # multiprocessing children) dies with it: no orphan may hold a GPU.
        try:
            os.killpg(task.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        # And so does what left the group (setsid) or lost its parent.
        self.spawner.reaped(task.tree)
        if task.pid_file:
            unlink(task.pid_file)  # nothing left to reap
        task.reaped_at = time.monotonic()
        # Its last lines and progress reports first (DRAIN_S above): a probe's
        # result (check) or a checksum printed last must not come after it.
        for reader in [*task.readers, task.progress_reader]:
            if reader is not None:
                reader.join(timeout=DRAIN_MAX_S + DRAIN_S)
        drain = getattr(self.emit, "drain_handoff", None)  # its copies' reports too
        if drain is not None:
            drain(DRAIN_S)
        self.emit(
            "exited",
            task=task.name,
            generation=task.generation,
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            stopping=_stopped_by_us(task, code),
            signalled=task.signalled,
            tail=list(task.tail),
            error=read_json(task.error_file, MAX_ERROR_FILE),
            evidence=evidence.at_exit(task.evidence),
            t=exited_at,
        )

    def signal(self, name: str, signum: int, by: str = "") -> None:
        task = self.tasks.get(name)
        if task is not None and task.alive():
            if len(task.signalled) < MAX_SIGNALLED:
                task.signalled.append({"signal": signum, "t": time.time(), "by": by})
            task.signal_tree(signum)

    def running(self, names: list[str] | None) -> list[RunningTask]:
        """The live tasks of `names` (None: all)."""
        with self.lock:
            return [t for n, t in self.tasks.items()
                    if (names is None or n in names) and t.alive()]

    def stop(self, names: list[str] | None, grace_s: float, settle_s: float = 0.0) -> None:
        """SIGTERM after `settle_s` (a task that ends by itself meanwhile ends
        as it did: its own error is heard), SIGKILL whatever is left after the
        grace period."""
        with self.lock:
            victims = [t for n, t in self.tasks.items() if (names is None or n in names)]
        victims = [t for t in victims if t.alive()]
        if not victims:
            return
        if settle_s > 0:
            _later(settle_s, _terminate, victims, grace_s)
        else:
            _terminate(victims, grace_s)

    def wait_all(self, timeout_s: float) -> None:
        """Wait for every task to exit (SIGKILL the trees of those that do not),
        and for its exit to be reported."""
        deadline = time.monotonic() + timeout_s
        for task in list(self.tasks.values()):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                task.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                task.signal_tree(signal.SIGKILL)
        for task in list(self.tasks.values()):
            # Its exit reported before the agent exits (the waiter drains its output
            # first: at EOF, DRAIN_MAX_S at most): otherwise the agent's end could beat it.
            if task.waiter is not None:
                task.waiter.join(timeout=DRAIN_MAX_S + 1.0)

    def tree_pids(self) -> set[int]:
        """Every process of the live tasks (their trees): whose listening ports are the job's."""
        with self.lock:
            tasks = [t for t in self.tasks.values() if t.alive()]
        return {pid for t in tasks for pid in (t.proc.pid, *t.tree.known())}

    def pids(self) -> dict[str, int]:
        """Per running task past its first seconds: its process id (the training
        process), for the health samples."""
        return {task.name: task.proc.pid for task in self._settled()}

    def usage(self) -> dict[str, dict]:
        """Per running task past its first seconds: CPU, RSS and status (empty
        without psutil)."""
        return {task.name: hostfacts.tree_usage(task.ps) for task in self._settled()
                if task.ps is not None}

    def _settled(self) -> list[RunningTask]:
        """The live tasks older than FIRST_FIGURES_S."""
        with self.lock:
            tasks = list(self.tasks.values())
        now = time.monotonic()
        return [t for t in tasks if now - t.born >= FIRST_FIGURES_S and t.alive()]


def _later(delay_s: float, call: Callable[..., None], *args: object) -> None:
    timer = threading.Timer(delay_s, call, args=args)
    timer.daemon = True
    timer.start()


def _terminate(victims: list[RunningTask], grace_s: float) -> None:
    """SIGTERM the live ones, SIGKILL what is left after `grace_s`."""
    for task in victims:
        if task.alive():
            task.stopping = True
            task.signal_tree(signal.SIGTERM)
            # A stopped (SIGSTOP) process acts on SIGTERM only once continued.
            task.signal_tree(signal.SIGCONT)
    _later(grace_s, _kill_leftovers, victims)


def _kill_leftovers(victims: list[RunningTask]) -> None:
    for task in victims:
        if task.alive():
            task.killed = True
        task.signal_tree(signal.SIGKILL)  # the group, even if its leader is gone


def _stopped_by_us(task: RunningTask, code: int) -> bool:
    """Did our stop end it? A SIGKILL we never sent means someone else killed it
    (the stop may have raced with an exit not yet reaped)."""
    if not task.stopping:
        return False
    return not (code == -signal.SIGKILL and not task.killed)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None



class _DrainedPipe(io.RawIOBase):
    """The read end of a task's output or progress pipe, ended (b"") at EOF,
    or, once the task's tree is reaped, after DRAIN_S without a byte (capped
    at DRAIN_MAX_S). Only its reader takes bytes from the pipe, so a poll that
    finds none means none are waiting, however late that thread runs."""

    def __init__(self, task: RunningTask, fd: int, owned: bool = False) -> None:
        super().__init__()
        self.task, self.fd, self.owned = task, fd, owned
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)  # POLLHUP comes unasked

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        size = CHUNK if size is None or size < 0 else size
        quiet_since = None
        while True:
            ready = self.poller.poll(READ_POLL_MS)
            reaped_at, now = self.task.reaped_at, time.monotonic()
            if reaped_at is not None and now - reaped_at >= DRAIN_MAX_S:
                return b""
            if ready:
                try:
                    return os.read(self.fd, size)  # b"" at EOF
                except OSError:
                    return b""
            if reaped_at is not None:
                quiet_since = quiet_since or now
                if now - quiet_since >= DRAIN_S:
                    return b""

    def close(self) -> None:
        if self.owned and not self.closed:
            os.close(self.fd)
        super().close()
