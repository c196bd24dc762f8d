"""The per-host agent: starts, watches and stops the tasks of one host.

Runs on the host (over SSH, or as a plain subprocess for simulated hosts) and
speaks newline-delimited JSON with the supervisor, one object per line.

supervisor -> agent (`op`): start {task, generation, argv, cwd, env, tf_config},
signal {task, signum}, stop {tasks|null, grace_s}, exec_check {id, argv},
stacks {tasks|null}, ping {}.
agent -> supervisor (`ev`, each with `t`): hello, started {task, pid},
start_failed {task, error}, output {task, stream, text}, progress {task, data},
exited {task, code|signal, stopping, tail, error}, heartbeat {tasks: {cpu,
rss_mb, status}}, exec_result, stacks {task, generation, text, error}, log, bye.

Guarantees:
- every task runs in its own session/process group; stopping a task signals
  the whole group and its whole tree (launcher.proctree: its cgroup, or the
  tree recorded while it lived, which keeps a `setsid` child whose parent is
  gone); when a task exits, whatever is left of its tree is killed;
- TF_CONFIG is written to a 0600 file in the run directory and exported to the
  task; it never appears on a command line;
- when stdin closes (the launcher died, or the SSH connection dropped) every
  task is stopped and the agent exits: no orphan outlives its launcher;
- the lease (`--lease SECONDS`, 0 = none): when nothing at all arrives on stdin
  for that long (the launcher pings every second), the launcher is taken for
  gone (a network partition closes no pipe) and the agent does the same as on
  EOF, then exits with EXIT_LEASE;
- every task is recorded in `RUN_DIR/pids/` (pid, start time, a token in its
  environment); an agent started with the same run directory first kills what
  is left of tasks an earlier agent recorded (SIGTERM, REAP_GRACE_S, SIGKILL)
  and lists them in its hello (`reaped`) and in `log` lines;
- a bad command (not JSON, not an object, wrong types, a task name that is not
  a plain file name, longer than MAX_COMMAND_BYTES) is refused with a `log`
  (or `start_failed`) and never ends the agent or writes outside the run dir;
  a task's output line longer than MAX_OUTPUT_LINE is cut, with a marker;
  a run of carriage returns (a progress bar) is one line, its last state
  (launcher.outlines).

Stacks: the bootstrap registers `faulthandler` on MGPU_STACKS_SIGNAL (SIGUSR1
by default) to append to MGPU_STACKS_FILE (`RUN_DIR/stacks/<task>-gen<N>.txt`,
0600). `stacks` truncates that file, signals the task's main process (only if
its /proc status shows the signal caught, since its default action kills),
waits until the file stops growing (STACKS_WAIT_S in all) and sends the text.

Shipped to hosts as-is: standard library only (psutil is used when present).
Must not import anything of the launcher side.

Started with `python -S`: a fan-out to many hosts pays every millisecond of
start-up once per host, and the agent needs none of the user's packages to
start (`site` runs every `.pth` file, e.g. an editable install's finder).
The site-packages folders are found by `site_dirs()` when needed: to report
package versions, and to import psutil on first use.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from launcher import __version__, firewall
from launcher.bootstrap import stacks_signal
from launcher.hostruns import KEEP_RUNS, hold_lock, prune, runs_root
from launcher.netif import ipv4_interfaces
from launcher.outlines import LineSplitter
from launcher.proctree import TaskTree, Tracker, cgroup_home, has_env, proc_stat, processes

# Optional on hosts: adds CPU/RSS to heartbeats and finds escaped children.
# Imported on first use (a heartbeat with a running task, or a stop), not at
# start-up: ~30 ms of CPU that a fan-out to many hosts would pay on each.
psutil = None
_psutil_lock = threading.Lock()
_psutil_tried = False


def _load_psutil():
    global psutil, _psutil_tried
    with _psutil_lock:
        if not _psutil_tried:
            _psutil_tried = True
            _add_site_dirs()
            try:
                import psutil as module
            except ImportError:  # pragma: no cover - depends on the host
                module = None
            psutil = module
    return psutil

HEARTBEAT_EVERY_S = 1.0
TAIL_LINES = 30
# After a task exits, how long to let its output pipes drain (a grandchild
# that inherited them may keep them open forever).
DRAIN_S = 1.0
PR_SET_PDEATHSIG = 1
# launcher.transport.shipping.USE_MARKER (the agent imports no launcher code)
BUNDLE_MARKER = ".mgpu-bundle"
BUNDLE_TOUCH_EVERY_S = 3600.0

# The protocol's bounds (see the module docstring).
MAX_COMMAND_BYTES = 2**20
MAX_OUTPUT_LINE = 8192  # bytes of one output line; the rest is counted, not sent
MAX_PROGRESS_LINE = 2**16
MAX_ERROR_FILE = 2**16
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a plain file name: no / or ..
EXIT_LEASE = 3  # the agent's exit code when its lease ran out
LEASE_CHECK_S = 0.2
STANDBY_AFTER_STEP_S = 5.0  # a task's next standby starts this long after its first step
STANDBY_AFTER_S = 30.0  # a task that reports no step gets its standby this long after its start
REAP_GRACE_S = 1.0  # leftovers of a dead generation have nothing to save
TOKEN_VAR = "MGPU_TASK_TOKEN"  # in each task's environment: finds its tree after a crash
STACKS_WAIT_S = 1.0  # for all tasks of one request, in parallel
STACKS_SETTLE_S = 0.1  # a stacks file that did not grow for this long is complete
STACKS_MAX_BYTES = 256 * 1024
_CHUNK = 2**16


def _pdeathsig_preexec():
    """In the child: own session, and SIGKILL if the agent itself dies abruptly."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not Linux
        libc = None

    def preexec() -> None:
        os.setsid()
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return preexec


class Emitter:
    """Writes events to the supervisor; one lock so lines never interleave."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: object) -> None:
        fields["ev"] = event
        fields.setdefault("t", time.time())
        data = (json.dumps(fields, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                self._stream.write(data)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the supervisor is gone; stdin EOF will stop us


class BadCommand(ValueError):
    """A command whose fields are missing or of the wrong type."""


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
        self.stopping = False  # the agent sent SIGTERM
        self.killed = False  # the agent sent SIGKILL
        self.stacks_file: str | None = None
        self.stacks_signum: int | None = None
        self.stacks_problem = ""  # why there are no stacks for this task, if so
        self.standby_wanted: tuple[dict, dict[str, str]] | None = None  # (spec, env) for it
        self.standby_timed = False  # its first step started the standby's timer
        self.pid_file: str | None = None
        self._ps = None

    @property
    def ps(self):
        """The task's psutil.Process (None without psutil, or once it is gone)."""
        if self._ps is None and _load_psutil() is not None:
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
            except psutil.Error:
                victims = []
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for child in victims:
            try:
                child.send_signal(signum)
            except psutil.Error:
                pass
        self.tree.signal(signum)  # its orphans too (setsid, then the parent died)


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


class Agent:
    def __init__(self, host: str, run_dir: str, emit: Emitter, eof_grace_s: float) -> None:
        self.host = host
        self.run_dir = os.path.abspath(os.path.expanduser(run_dir))
        self.emit = emit
        self.eof_grace_s = eof_grace_s
        self.tasks: dict[str, RunningTask] = {}
        self.lock = threading.Lock()
        self.closing = False  # shutting down: no new task may start
        self.last_heard = time.monotonic()  # anything at all on stdin
        self.code_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.mark_bundle_used()
        self.preexec = _pdeathsig_preexec()
        self.progress_fds: dict[int, str] = {}
        # Warm starts (launcher.standby): per task name, its standby, or why it has none.
        self.standbys: dict[str, Standby] = {}
        self.no_standby: dict[str, str] = {}
        self.script_writes: dict[tuple[str, int, int], tuple[list, list]] = {}
        self.command_queue: _Lines | None = None  # read_commands's: runs work on its thread
        # The job's firewall rules on this host (launcher.firewall): what can, what is.
        self.firewall_backend, self.firewall_why = firewall.probe()
        self.sealed: firewall.Seal | None = None
        self.seal_failed = ""  # `auto` and the rules failed: said once, tasks run open
        self._cgroup_home: str | None | bool = False  # False: not looked for yet
        self.tracker = Tracker()
        self.trees: list[TaskTree] = []  # every tree made: shutdown drops their cgroups

    def new_tree(self, token: str) -> TaskTree:
        """A process tree for a task or standby with this token (launcher.proctree)."""
        if self._cgroup_home is False:
            self._cgroup_home = cgroup_home()
        tree = TaskTree(f"{TOKEN_VAR}={token}".encode(), self._cgroup_home or None)
        self.trees.append(tree)
        return tree

    def mark_bundle_used(self) -> None:
        """Touch our bundle's folder: launchers drop bundles nobody used for a
        month (see launcher.transport.shipping). Only a bundle has the marker file."""
        if os.path.exists(os.path.join(self.code_dir, BUNDLE_MARKER)):
            try:
                os.utime(self.code_dir)
            except OSError:
                pass

    # ------------------------------------------------------------------ commands

    def dispatch(self, raw: bytes) -> None:
        """One line from stdin: parse, check and run it; never raise."""
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
            self.start(message)
        elif op == "signal":
            name = _task_name(message.get("task"))
            signum = _int(message, "signum", low=1, high=signal.NSIG - 1)
            task = self.tasks.get(name)
            if task is not None and task.alive():
                task.signal_tree(signum)
        elif op == "stop":
            self.stop(_names(message.get("tasks")), _number(message, "grace_s", 3.0))
        elif op == "exec_check":
            self.exec_check_later(message)
        elif op == "stacks":
            self.stacks(_names(message.get("tasks")))
        else:
            self.emit("log", text=f"unknown op {str(op)[:40]!r}")

    def _private_dir(self, *parts: str) -> str:
        path = os.path.join(self.run_dir, *parts)
        _makedirs_private(path)
        return path

    def start(self, message: dict) -> None:
        raw_name = message.get("task")
        if not isinstance(raw_name, str):
            raise BadCommand(f"task must be a string, not {type(raw_name).__name__}")
        name = raw_name[:200]
        generation = message.get("generation", 0)
        try:
            _task_name(name)
            generation = _int(message, "generation", default=0, low=0)
            spec = _start_spec(message)
        except BadCommand as exc:
            self.emit("start_failed", task=name,
                      generation=generation if isinstance(generation, int) else None,
                      error=f"refused: {exc}")
            return
        with self.lock:
            old = self.tasks.get(name)
            busy = (f"task {name} is still running (pid {old.proc.pid})"
                    if old is not None and old.alive() else
                    "the agent is stopping" if self.closing else "")
        if busy:
            self.emit("start_failed", task=name, generation=generation, error=busy)
            return
        refusal = self.seal(message.get("firewall"))  # before the task opens its port
        if refusal:
            self.emit("start_failed", task=name, generation=generation, error=refusal)
            return
        self._launch(name, generation, spec)

    def seal(self, raw: object) -> str:
        """Install the job's firewall rules for this host (`start`'s `firewall`)
        unless they are in place; returns why the task must not start, or ""."""
        if raw is None:
            return ""
        try:
            seal = firewall.Seal.from_json(raw)
        except ValueError as exc:
            return f"refused: {exc}"
        done = ""
        with self.lock:  # against shutdown() removing the rules meanwhile
            if self.closing:
                return "the agent is stopping"
            if seal == self.sealed or (self.seal_failed and seal.mode == "auto"):
                return ""
            why = self.firewall_why
            if self.firewall_backend is not None:
                try:
                    done = firewall.apply(seal, self.firewall_backend, self.run_dir)
                    self.sealed = seal
                except firewall.FirewallError as exc:
                    why = str(exc)
            if not done and seal.mode == "auto":
                self.seal_failed = why
        # Said outside the lock: a write to a slow launcher must not hold up heartbeats.
        if done:
            self.emit("log", text=f"firewall: {done}")
            return ""
        if seal.mode == "cluster":
            return (f"cannot keep the TF ports to the cluster (security.tf_ports: cluster): "
                    f"{why}; fix: {firewall.fix_for(why)}")
        self.emit("log", notice=True, text=f"TF port(s) {','.join(map(str, seal.ports))} "
                  f"open to the network (security.tf_ports: auto): {why}")
        return ""

    def _launch(self, name: str, generation: int, spec: dict) -> None:
        standby = self.standbys.pop(name, None)
        progress_read = progress_write = None
        try:
            env = self._task_env(name, generation, spec)
            why_cold = self._why_cold(name, spec, env, standby)
            if not why_cold:
                assert standby is not None
                env[TOKEN_VAR], env["MGPU_PROGRESS_FD"] = standby.token, str(standby.progress_fd)
                stacks = self._stacks_setup(name, generation, env)
                why_cold = self._hand_off(standby, spec, env)
            if why_cold:
                if standby is not None:
                    self._drop_standby(standby)
                    standby = None
                env[TOKEN_VAR] = os.urandom(8).hex()
                stacks = self._stacks_setup(name, generation, env)
                progress_read, progress_write = os.pipe()
                env["MGPU_PROGRESS_FD"] = str(progress_write)
                tree = self.new_tree(env[TOKEN_VAR])
                try:
                    proc = subprocess.Popen(
                        spec["argv"],
                        cwd=spec["cwd"],
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        pass_fds=(progress_write,),
                        preexec_fn=tree.preexec(self.preexec),
                    )
                except BaseException:
                    tree.spawn_failed()
                    raise
                tree.started(proc.pid)
                self.tracker.add(tree)
            else:
                assert standby is not None
                proc, progress_read, tree = standby.proc, standby.progress_read, standby.tree
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            if progress_write is not None:
                os.close(progress_read)
                os.close(progress_write)
            if standby is not None:
                self._drop_standby(standby)
            self.emit("start_failed", task=name, generation=generation,
                      error=f"{type(exc).__name__}: {exc}")
            return
        if progress_write is not None:
            os.close(progress_write)  # the task holds the only write end now
        self.mark_bundle_used()
        task = RunningTask(name, generation, proc, env["MGPU_ERROR_FILE"], tree)
        task.stacks_file, task.stacks_signum, task.stacks_problem = stacks
        task.pid_file = self._record(task.name, task.generation, proc.pid, env[TOKEN_VAR])
        with self.lock:
            self.tasks[name] = task
        self.emit("started", task=name, generation=generation, pid=proc.pid,
                  start="cold" if why_cold else "warm", start_reason=why_cold)
        for stream_name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            reader = threading.Thread(
                target=self._read_output, args=(task, stream_name, stream), daemon=True
            )
            reader.start()
            task.readers.append(reader)
        threading.Thread(target=self._read_progress, args=(task, progress_read),
                         daemon=True).start()
        threading.Thread(target=self._wait, args=(task,), daemon=True).start()
        if spec["standby"] == "auto" and not self._standby_problem(name, spec, env):
            # Its standby is started once the task is past its own start
            # (STANDBY_AFTER_STEP_S after its first training step: the
            # standby's import must not slow that start), when it fails (a
            # restart follows), or STANDBY_AFTER_S after its start.
            task.standby_wanted = (spec, env)
            timer = threading.Timer(STANDBY_AFTER_S, self._want_standby, args=(task,))
            timer.daemon = True
            timer.start()

    def _task_env(self, name: str, generation: int, spec: dict) -> dict[str, str]:
        """The task's environment but for its token, progress fd and stacks file;
        writes its TF_CONFIG file and clears its error file."""
        tf_config_file = os.path.join(self._private_dir("tf_config"), f"{name}.json")
        _write_private(tf_config_file, spec["tf_config"])
        error_file = os.path.join(self._private_dir("errors"), f"{name}-gen{generation}.json")
        if os.path.exists(error_file):
            os.unlink(error_file)
        env = dict(os.environ)
        env.update(spec["env"])
        if env.get("MGPU_RUN_DIR", "").startswith("~"):
            env["MGPU_RUN_DIR"] = os.path.expanduser(env["MGPU_RUN_DIR"])
        env["TF_CONFIG"] = spec["tf_config"]
        env["MGPU_TF_CONFIG_FILE"] = tf_config_file
        env["MGPU_ERROR_FILE"] = error_file
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (self.code_dir, env.get("PYTHONPATH", "")) if p
        )
        return env

    # ------------------------------------------------------------------ standbys

    def _standby_problem(self, name: str, spec: dict, env: dict[str, str]) -> str:
        """Why no standby can serve this task at all ("" if one can)."""
        from launcher.standby import env_write_problem, script_of, standby_argv, with_presets

        if spec["standby"] != "auto":
            return "restart.warm_standby is off"
        if name in self.no_standby:
            return self.no_standby[name]
        if standby_argv(spec["argv"]) is None:
            return "not a script run by launcher.bootstrap"
        if spec["env"].get("MGPU_STRATEGY") == "keras_distribution":
            return "Keras on JAX: no TensorFlow to import ahead"
        script = script_of(spec["argv"], spec["cwd"])
        if not os.path.exists(script):
            return ""  # the start fails the same way warm or cold
        writes, presets = self._script_env(spec)
        return env_write_problem(script, writes, with_presets(env, presets))

    def _script_env(self, spec: dict) -> tuple[list, list]:
        """The script's environment writes and its leading presets (cached per
        file version); none for a script that cannot be read."""
        from launcher.standby import leading_presets, script_env_writes, script_of

        script = script_of(spec["argv"], spec["cwd"])
        try:
            info = os.stat(script)
        except OSError:
            return [], []
        key = (script, info.st_mtime_ns, info.st_size)
        if key not in self.script_writes:
            self.script_writes[key] = (script_env_writes(script), leading_presets(script))
        return self.script_writes[key]

    def _why_cold(self, name: str, spec: dict, env: dict[str, str],
                  standby: Standby | None) -> str:
        """Why this start cannot use `standby` ("" when it can: a warm start)."""
        from launcher.standby import (
            EXIT_NO_TENSORFLOW,
            standby_argv,
            start_env_differences,
            with_presets,
        )

        problem = self._standby_problem(name, spec, env)
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

    def _hand_off(self, standby: Standby, spec: dict, env: dict[str, str]) -> str:
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

    def _want_standby(self, task: RunningTask) -> None:
        """Start `task`'s standby now (once), on the command thread."""
        with self.lock:
            wanted, task.standby_wanted = task.standby_wanted, None
        if wanted is not None and self.command_queue is not None:
            self.command_queue.put(lambda: self._spawn_standby(task.name, *wanted))

    def _spawn_standby(self, name: str, spec: dict, task_env: dict[str, str]) -> None:
        """Start the standby for this task's next start (on the command thread:
        PR_SET_PDEATHSIG is bound to the thread that starts a process)."""
        from launcher.standby import READY_FD, per_start, standby_argv, with_presets

        argv = standby_argv(spec["argv"])
        if argv is None or self._standby_problem(name, spec, task_env):
            return
        # The script's leading writes made ahead: TensorFlow's import sees them.
        env = {k: v for k, v in with_presets(task_env, self._script_env(spec)[1]).items()
               if not per_start(k)}
        env[TOKEN_VAR] = token = os.urandom(8).hex()
        progress_read, progress_write = os.pipe()
        env[READY_FD] = str(progress_write)
        with self.lock:
            if self.closing or name in self.standbys:
                os.close(progress_read)
                os.close(progress_write)
                return
            tree = self.new_tree(token)
            try:
                proc = subprocess.Popen(
                    argv, cwd=spec["cwd"], env=env, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(progress_write,),
                    preexec_fn=tree.preexec(self.preexec))
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                tree.spawn_failed()
                os.close(progress_read)
                self.no_standby[name] = f"its standby could not start: {exc}"
                return
            finally:
                os.close(progress_write)
            tree.started(proc.pid)
            self.tracker.add(tree)
            standby = Standby(proc, argv, env, token, progress_read, progress_write, tree)
            self.standbys[name] = standby
            ready_read = os.dup(progress_read)  # the watcher's own: closed by it alone
        standby.pid_file = self._record(name, None, proc.pid, token)
        threading.Thread(target=self._await_ready, args=(name, standby, ready_read),
                         daemon=True).start()

    def _await_ready(self, name: str, standby: Standby, fd: int) -> None:
        """Mark `standby` ready once it says so (before any hand-off: a start
        is warm only then); a standby that dies first closes the pipe."""
        from launcher.standby import READY

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

    def _drop_standby(self, standby: Standby) -> None:
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
            standby.tree.reap()
            self.tracker.remove(standby.tree)

        threading.Thread(target=wait_and_reap, daemon=True).start()
        if standby.pid_file:
            _unlink(standby.pid_file)

    def drop_standbys(self) -> None:
        with self.lock:
            standbys = list(self.standbys.values())
            self.standbys.clear()
        for standby in standbys:
            self._drop_standby(standby)

    def _stacks_setup(self, name: str, generation: int,
                      env: dict[str, str]) -> tuple[str | None, int | None, str]:
        """(stacks file, signal, why none) for a task, and its MGPU_STACKS_FILE.
        A bad MGPU_STACKS_SIGNAL still gets the file: the bootstrap says what is wrong."""
        env.pop("MGPU_STACKS_FILE", None)
        try:
            signum = stacks_signal(env.get("MGPU_STACKS_SIGNAL"))
        except ValueError as exc:
            signum, problem = None, str(exc)
        else:
            problem = "" if signum is not None else "stack dumps are off (MGPU_STACKS_SIGNAL=off)"
        if signum is None and not problem:
            return None, None, problem
        path = os.path.join(self._private_dir("stacks"), f"{name}-gen{generation}.txt")
        _write_private(path, "")
        env["MGPU_STACKS_FILE"] = path
        return path, signum, problem

    def _record(self, name: str, generation: int | None, pid: int, token: str) -> str | None:
        """Write a task's (or, with generation None, a standby's) pid file, for
        a later agent to reap it if we die."""
        start = proc_stat(pid)
        record = {"task": name, "generation": generation, "pid": pid,
                  "start": start[3] if start else None, "token": token,
                  "agent_pid": os.getpid()}
        path = os.path.join(self.run_dir, "pids", f"{name}-{token}.json")
        try:  # whatever fails here, the task runs on and is watched (a full disk...)
            path = os.path.join(self._private_dir("pids"), f"{name}-{token}.json")
            _write_private(path + ".tmp", json.dumps(record))
            os.replace(path + ".tmp", path)  # a reader never sees half a record
        except OSError as exc:
            self.emit("log", text=f"cannot record {name} in {path}: {exc}")
            return None
        return path

    def _read_output(self, task: RunningTask, stream_name: str, stream) -> None:
        # Lines end at "\n"; a "\r" run (a progress bar) keeps its last state.
        splitter = LineSplitter(MAX_OUTPUT_LINE)
        while True:
            try:
                data = stream.read1(_CHUNK)
            except (OSError, ValueError):
                data = b""
            texts = splitter.feed(data) if data else splitter.close()
            for text in texts:
                task.tail.append(text)
                self.emit("output", task=task.name, generation=task.generation,
                          stream=stream_name, text=text)
            if not data:
                break
        stream.close()

    def _read_progress(self, task: RunningTask, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            while True:
                raw = stream.readline(MAX_PROGRESS_LINE + 1)
                if not raw:
                    break
                if len(raw) > MAX_PROGRESS_LINE and not raw.endswith(b"\n"):
                    _skip_line(stream)
                    continue
                try:
                    data = json.loads(raw)
                except (ValueError, RecursionError):
                    continue
                if isinstance(data, dict):
                    self.emit("progress", task=task.name, generation=task.generation, data=data)
                    if task.standby_wanted is not None and "step" in data \
                            and not task.standby_timed:
                        # It trains: its start is behind it. A job of seconds
                        # never pays for a standby it would not use.
                        task.standby_timed = True
                        timer = threading.Timer(STANDBY_AFTER_STEP_S, self._want_standby,
                                                args=(task,))
                        timer.daemon = True
                        timer.start()

    def _wait(self, task: RunningTask) -> None:
        code = task.proc.wait()
        exited_at = time.time()  # before draining: the root cause is the earliest exit
        if code != 0 and task.standby_wanted is not None:
            self._want_standby(task)  # a restart is likely to follow
        # Whatever the task left behind in its group (data-loader workers,
        # multiprocessing children) dies with it: no orphan may hold a GPU.
        try:
            os.killpg(task.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        task.tree.reap()  # and so does what left the group (setsid) or lost its parent
        self.tracker.remove(task.tree)
        if task.pid_file:
            _unlink(task.pid_file)  # nothing left to reap
        for reader in task.readers:
            reader.join(timeout=DRAIN_S)
        self.emit(
            "exited",
            task=task.name,
            generation=task.generation,
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            stopping=_stopped_by_us(task, code),
            tail=list(task.tail),
            error=_read_error_file(task.error_file),
            t=exited_at,
        )

    def stop(self, names: list[str] | None, grace_s: float) -> None:
        """SIGTERM now, SIGKILL whatever is left after the grace period."""
        with self.lock:
            victims = [t for n, t in self.tasks.items() if (names is None or n in names)]
        victims = [t for t in victims if t.alive()]
        for task in victims:
            task.stopping = True
            task.signal_tree(signal.SIGTERM)
            # A stopped (SIGSTOP) process acts on SIGTERM only once continued.
            task.signal_tree(signal.SIGCONT)
        if victims:
            timer = threading.Timer(grace_s, self._kill_leftovers, args=(victims,))
            timer.daemon = True
            timer.start()

    def _kill_leftovers(self, victims: list[RunningTask]) -> None:
        for task in victims:
            if task.alive():
                task.killed = True
            task.signal_tree(signal.SIGKILL)  # the group, even if its leader is gone

    def exec_check_later(self, message: dict) -> None:
        """exec_check in a thread: a slow command must not hold up the pings
        (the lease) or other commands."""
        argv = _str_list(message, "argv")
        timeout = _number(message, "timeout_s", 60.0)
        cwd = _opt_str(message, "cwd")
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

    # ------------------------------------------------------------------ stacks

    def stacks(self, names: list[str] | None) -> None:
        with self.lock:
            tasks = [t for n, t in self.tasks.items()
                     if (names is None or n in names) and t.alive()]
            running = {t.name for t in tasks}
        for name in (names or []):
            if name not in running:
                self.emit("stacks", task=name[:200], generation=None, text="",
                          error="no such task running on this host")
        if tasks:
            threading.Thread(target=self._collect_stacks, args=(tasks,), daemon=True).start()

    def _collect_stacks(self, tasks: list[RunningTask]) -> None:
        deadline = time.monotonic() + STACKS_WAIT_S
        waiting: dict[RunningTask, list[float]] = {}  # task -> [size seen, when it changed]
        for task in tasks:
            error = self._ask_for_stacks(task)
            if error:
                self.emit("stacks", task=task.name, generation=task.generation, text="",
                          error=error)
            else:
                waiting[task] = [0, time.monotonic()]
        while waiting and time.monotonic() < deadline:
            time.sleep(0.02)
            now = time.monotonic()
            for task, seen in list(waiting.items()):
                size = _file_size(task.stacks_file)
                if size != seen[0]:
                    seen[0], seen[1] = size, now
                elif size > 0 and now - seen[1] >= STACKS_SETTLE_S:
                    del waiting[task]
                    self._send_stacks(task)
        for task in waiting:
            self._send_stacks(task)

    def _ask_for_stacks(self, task: RunningTask) -> str:
        """Truncate the task's stacks file and signal it; why not, if not."""
        if task.stacks_signum is None or task.stacks_file is None:
            return task.stacks_problem or "stack dumps are off for this task"
        pid = task.proc.pid
        name = _signal_name(task.stacks_signum)
        stat = proc_stat(pid)
        if stat is not None and stat[0] in "Tt":
            return "the process is stopped (SIGSTOP or a debugger): it cannot write its stacks"
        caught = _caught_signals(pid)
        if caught is not None and not caught >> (task.stacks_signum - 1) & 1:
            # Its default action would kill the task: never send it unhandled.
            return (f"{name} is not handled by the task: the bootstrap has not registered "
                    "it yet, the script reset it, or the task does not run through "
                    "launcher.bootstrap")
        try:
            os.truncate(task.stacks_file, 0)
            os.kill(pid, task.stacks_signum)
        except OSError as exc:
            return f"cannot ask for stacks: {exc}"
        return ""

    def _send_stacks(self, task: RunningTask) -> None:
        assert task.stacks_file is not None
        try:
            with open(task.stacks_file, "rb") as handle:
                data = handle.read(STACKS_MAX_BYTES + 1)
        except OSError as exc:
            data, error = b"", f"cannot read {task.stacks_file}: {exc}"
        else:
            error = None if data else (
                f"no stacks written within {STACKS_WAIT_S:g} s (the script may have "
                f"installed its own handler for {_signal_name(task.stacks_signum or 0)})")
        text = data[:STACKS_MAX_BYTES].decode("utf-8", "replace")
        if len(data) > STACKS_MAX_BYTES:
            text += f"\n… [mgpu-launch: cut at {STACKS_MAX_BYTES} bytes]"
        self.emit("stacks", task=task.name, generation=task.generation, text=text,
                  error=error)

    # ------------------------------------------------------------------ leftovers

    def reap_leftovers(self) -> list[dict]:
        """Kill what is left of the tasks an earlier agent of this run dir
        recorded (it died, or is cut off and has not noticed yet) before any
        task of ours starts on the same ports. Returns what was found alive."""
        folder = os.path.join(self.run_dir, "pids")
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        except OSError:
            return []
        records = [r for r in (_read_record(os.path.join(folder, n)) for n in names) if r]
        found = _leftovers(records) if records else {}
        reaped = []
        if found:
            killed = _terminate(lambda: _leftovers(records))
            for index, pids in sorted(found.items()):
                record = records[index]
                reaped.append({"task": record["task"], "generation": record["generation"],
                               "agent_pid": record["agent_pid"], "pids": sorted(pids),
                               "sigkilled": sorted(pids & killed)})
        for name in names:
            _unlink(os.path.join(folder, name))
        return reaped

    # ------------------------------------------------------------------ background

    def heartbeat_forever(self) -> None:
        touched = time.monotonic()
        while True:
            if time.monotonic() - touched > BUNDLE_TOUCH_EVERY_S:
                touched = time.monotonic()
                self.mark_bundle_used()  # a job can run for longer than the prune age
            stats = {}
            with self.lock:
                tasks = list(self.tasks.values())
            for task in tasks:
                if task.alive() and task.ps is not None:
                    stats[task.name] = _tree_usage(task.ps)
            self.emit("heartbeat", tasks=stats)
            time.sleep(HEARTBEAT_EVERY_S)

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def watch_lease(self, lease_s: float) -> None:
        """Stop everything and exit when the launcher has said nothing for `lease_s`."""
        while True:
            silent = time.monotonic() - self.last_heard
            if silent > lease_s:
                break
            time.sleep(min(LEASE_CHECK_S, lease_s - silent + 0.01))
        why = (f"nothing from the launcher for {silent:.1f} s (lease {lease_s:g} s): "
               "stopping every task and exiting")
        # The way back may be as dead as the way in, and a write to it may block
        # forever: tell it on the side, stop the tasks first, exit in any case.
        threading.Thread(target=self.emit, args=("log",), kwargs={"text": why},
                         daemon=True).start()
        self.shutdown()
        goodbye = threading.Thread(target=self.emit, args=("bye",),
                                   kwargs={"reason": "lease"}, daemon=True)
        goodbye.start()
        goodbye.join(timeout=1.0)
        os._exit(EXIT_LEASE)

    def shutdown(self) -> None:
        """stdin closed (or the lease ran out): stop every task, wait for them."""
        with self.lock:
            self.closing = True
        self.drop_standbys()
        self.stop(None, self.eof_grace_s)
        deadline = time.monotonic() + self.eof_grace_s + 2.0
        for task in list(self.tasks.values()):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                task.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                task.signal_tree(signal.SIGKILL)
        with self.lock:  # the tasks are gone: so are their ports' rules
            firewall.reap(self.run_dir)
            self.sealed = None
        for tree in list(self.trees):  # tasks' and standbys': their threads may not get to it
            tree.reap()


# ---------------------------------------------------------------- command fields


def _task_name(value: object) -> str:
    if not isinstance(value, str) or not TASK_NAME.fullmatch(value):
        raise BadCommand(f"task name {str(value)[:80]!r} is not a plain name "
                         "(letters, digits, '_', '.', '-'; no '/', not starting with '.')")
    return value


def _names(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadCommand(f"tasks must be null or a list of names, not {str(value)[:80]!r}")
    return value


def _int(message: dict, key: str, default: int | None = None, low: int | None = None,
         high: int | None = None) -> int:
    value = message.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadCommand(f"{key} must be an integer, not {str(value)[:80]!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadCommand(f"{key}={value} is out of range")
    return value


def _number(message: dict, key: str, default: float) -> float:
    value = message.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 <= value < float("inf"):
        raise BadCommand(f"{key} must be a number of seconds, not {str(value)[:80]!r}")
    return float(value)


def _opt_str(message: dict, key: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise BadCommand(f"{key} must be a string, not {str(value)[:80]!r}")
    return value


def _str_list(message: dict, key: str) -> list[str]:
    value = message.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise BadCommand(f"{key} must be a non-empty list of strings, not {str(value)[:80]!r}")
    return value


def _start_spec(message: dict) -> dict:
    env = message.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise BadCommand("env must be an object of strings")
    tf_config = message.get("tf_config")
    if not isinstance(tf_config, str):
        raise BadCommand("tf_config must be a string")
    standby = message.get("standby", "off")
    if standby not in ("auto", "off"):
        raise BadCommand(f"standby must be 'auto' or 'off', not {str(standby)[:40]!r}")
    return {"argv": _str_list(message, "argv"), "cwd": _opt_str(message, "cwd") or None,
            "env": env, "tf_config": tf_config, "standby": standby}


# ---------------------------------------------------------------- files and lines


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # the file may predate us with wider bits
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _file_size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def _read_error_file(path: str) -> object:
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read(MAX_ERROR_FILE))
    except (OSError, ValueError, RecursionError):
        return None


def _skip_line(stream, on_chunk=lambda: None) -> int:
    """Read and drop the rest of a line; its length without the newline."""
    skipped = 0
    while True:
        chunk = stream.readline(_CHUNK)
        if not chunk:
            return skipped
        on_chunk()
        if chunk.endswith(b"\n"):
            return skipped + len(chunk) - 1
        skipped += len(chunk)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ---------------------------------------------------------------- /proc


def _caught_signals(pid: int) -> int | None:
    """The task's SigCgt mask (bit n-1 = signal n has a handler); None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_record(path: str) -> dict | None:
    try:
        with open(path, "rb") as handle:
            record = json.loads(handle.read(4096))
    except (OSError, ValueError, RecursionError):
        return None
    ok = (isinstance(record, dict) and isinstance(record.get("pid"), int)
          and isinstance(record.get("token"), str) and len(record["token"]) >= 8
          and isinstance(record.get("start"), int | None))
    return record if ok else None


def _leftovers(records: list[dict]) -> dict[int, set[int]]:
    """Live processes of each recorded task: record index -> pids.

    A process is the task's when its environment has the task's token (the
    task and every descendant that kept its environment), or when it is in
    the task's process group and that group is proven to be the task's (its
    leader has the recorded start time, or a member has the token): a pid
    reused since then is never touched.
    """
    # pid -> (state, parent, group, start), never us
    table = {pid: stat for pid, stat in processes().items() if pid != os.getpid()}
    found: dict[int, set[int]] = {}
    for index, record in enumerate(records):
        needle = f"{TOKEN_VAR}={record['token']}".encode()
        start = record.get("start")
        pids = {pid for pid, stat in table.items()
                if (start is None or stat[3] >= start) and has_env(pid, needle)}
        leader = table.get(record["pid"])
        if pids or (leader is not None and start is not None and leader[3] == start):
            pids |= {pid for pid, stat in table.items() if stat[2] == record["pid"]}
        if pids:
            found[index] = pids
    return found


def _terminate(find) -> set[int]:
    """SIGTERM (and SIGCONT) what `find()` returns, SIGKILL what is still there
    after REAP_GRACE_S, wait until it is gone; the pids that needed SIGKILL."""
    def signal_all(signum: int) -> set[int]:
        victims = set().union(*find().values())
        for pid in victims:
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        return victims

    signal_all(signal.SIGTERM)
    signal_all(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
    deadline = time.monotonic() + REAP_GRACE_S
    while find() and time.monotonic() < deadline:
        time.sleep(0.02)
    killed = signal_all(signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while killed and find() and time.monotonic() < deadline:
        time.sleep(0.02)
    return killed


def _stopped_by_us(task: RunningTask, code: int) -> bool:
    """Did our stop end it? A SIGKILL we never sent means someone else killed it
    (the stop may have raced with an exit not yet reaped)."""
    if not task.stopping:
        return False
    return not (code == -signal.SIGKILL and not task.killed)


def _tree_usage(proc) -> dict[str, float | str]:
    """CPU and memory of a task's tree, and the task's own process status
    (`stopped` is a SIGSTOPped task: the supervisor blames it for a hang)."""
    cpu, rss = 0.0, 0
    try:
        members = [proc, *proc.children(recursive=True)]
        status = proc.status()
    except psutil.Error:
        return {"cpu": 0.0, "rss_mb": 0.0}
    for member in members:
        try:
            cpu += member.cpu_percent(None)
            rss += member.memory_info().rss
        except psutil.Error:
            continue
    return {"cpu": round(cpu, 1), "rss_mb": round(rss / 2**20, 1), "status": status}


def _installed_versions() -> dict[str, str | None]:
    """Versions of what tasks need, read from the names of `*.dist-info` folders.

    The first match on the path wins, as for an import. Nothing is imported,
    not even importlib.metadata (~20-50 ms of CPU per agent start, which a
    fan-out to dozens of hosts pays on each of them).
    """
    versions = _scan_dist_info([*sys.path, *site_dirs()])
    if versions["tensorflow"] is None and sys.flags.no_site:
        # TensorFlow may sit on a path that only a .pth file adds: let site run
        # them (what every task's interpreter does) before calling it missing.
        import site

        site.main()
        versions = _scan_dist_info(sys.path)
    return versions


def _scan_dist_info(entries: list[str]) -> dict[str, str | None]:
    wanted = {"tensorflow": "tensorflow", "tensorflow_cpu": "tensorflow",
              "keras": "keras", "tf_keras": "tf_keras", "psutil": "psutil"}
    versions: dict[str, str | None] = dict.fromkeys(("tensorflow", "keras", "tf_keras",
                                                     "psutil"))
    for entry in entries:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            parts = name.rsplit(".", 1)[0].split("-")
            key = wanted.get(parts[0].lower().replace(".", "_"))
            if key and len(parts) > 1 and versions[key] is None:
                versions[key] = parts[1]
    return versions


_site_dirs: list[str] | None = None


def site_dirs() -> list[str]:
    """The site-packages folders `site` would add to sys.path, without running
    their `.pth` files; empty when `site` already ran (no `-S`). When they hold
    no TensorFlow, `_installed_versions` runs `site.main()` after all."""
    global _site_dirs
    if not sys.flags.no_site:
        return []
    if _site_dirs is not None:  # the hello and the first psutil import both ask
        return _site_dirs
    import site  # under -S, importing site does not run site.main()

    # What site.main() would add, in its order: the user site, then PREFIXES.
    prefixes, user_site = [sys.prefix, sys.exec_prefix], True
    # A venv: what site.venv() would read from pyvenv.cfg.
    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    for conf in (os.path.join(bin_dir, "pyvenv.cfg"),
                 os.path.join(os.path.dirname(bin_dir), "pyvenv.cfg")):
        if not os.path.isfile(conf):
            continue
        system = "true"
        with open(conf, encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "include-system-site-packages":
                    system = value.strip().lower()
        venv = os.path.dirname(bin_dir)
        prefixes, user_site = ([venv, *prefixes], True) if system == "true" else ([venv], False)
        break
    dirs = [site.getusersitepackages()] if user_site and site.check_enableusersite() else []
    dirs += site.getsitepackages(prefixes)
    _site_dirs = [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]
    return _site_dirs


def _add_site_dirs() -> None:
    for entry in site_dirs():
        if entry not in sys.path:
            sys.path.append(entry)


USAGE = ("usage: python -m launcher.agent --host NAME --run-dir DIR [--eof-grace SECONDS] "
         "[--lease SECONDS]")


def parse_args(argv: list[str]) -> tuple[str, str, float, float]:
    """(host, run_dir, eof_grace_s, lease_s). Only the launcher starts the agent;
    argparse would cost ~8 ms of every agent start (it loads re, gettext and shutil)."""
    options = {"--host": None, "--run-dir": None, "--eof-grace": "2.0", "--lease": "0"}
    rest = list(argv)
    while rest:
        flag = rest.pop(0)
        if flag not in options or not rest:
            raise SystemExit(f"{USAGE}\nbad argument: {flag!r}")
        options[flag] = rest.pop(0)
    if options["--host"] is None or options["--run-dir"] is None:
        raise SystemExit(f"{USAGE}\n--host and --run-dir are required")
    seconds = []
    for flag in ("--eof-grace", "--lease"):
        try:
            value = float(options[flag])
            if not 0 <= value < float("inf"):
                raise ValueError(value)
        except ValueError:
            raise SystemExit(f"{USAGE}\n{flag} wants seconds, got {options[flag]!r}") from None
        seconds.append(value)
    return options["--host"], options["--run-dir"], seconds[0], seconds[1]


def main(argv: list[str] | None = None) -> int:
    host, run_dir, eof_grace_s, lease_s = parse_args(sys.argv[1:] if argv is None else argv)
    # Ctrl-C in the launcher's terminal is the launcher's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    emit = Emitter(sys.stdout.buffer)
    agent = Agent(host, run_dir, emit, eof_grace_s)
    _makedirs_private(agent.run_dir)
    refusal = unsafe_start(agent.code_dir, agent.run_dir)
    if refusal:  # before any task: the launcher shows this stderr line with the exit code
        print(f"mgpu-launch agent: {refusal}", file=sys.stderr, flush=True)
        return EXIT_UNSAFE
    reaped = agent.reap_leftovers()  # before any task of ours can start
    unsealed = firewall.reap(agent.run_dir)  # a killed agent's rules
    swept = firewall.sweep()  # those of killed agents of other runs that nobody reaped
    lock_fd = hold_lock(agent.run_dir)  # held for our life: never pruned meanwhile
    packages = _installed_versions()
    emit("hello", host=host, pid=os.getpid(), version=__version__,
         python=sys.executable, python_version=sys.version.split()[0],
         hostname=os.uname().nodename, run_dir=agent.run_dir,
         psutil=packages.pop("psutil") is not None, packages=packages,
         lease_s=lease_s or None, reaped=reaped,
         firewall={"backend": agent.firewall_backend, "why": agent.firewall_why},
         interfaces=ipv4_interfaces(_load_psutil))  # name -> IPv4s: TF addresses by interface
    for item in reaped:  # after the hello: the SSH transport skips lines before it
        emit("log", text=f"killed leftover task {item['task']} (generation "
             f"{item['generation']}, pids {item['pids']}) of an earlier agent "
             f"(pid {item['agent_pid']}) of this run directory")
    if unsealed:
        emit("log", text=f"removed the firewall rules ({unsealed}) of an earlier agent "
             "of this run directory")
    for item in swept:
        emit("log", text=f"removed the firewall rules ({item}, gone) of another run")
    agent.heard()
    threading.Thread(target=agent.heartbeat_forever, daemon=True).start()
    threading.Thread(target=_prune_runs, args=(emit, agent.run_dir), daemon=True).start()
    if lease_s:
        threading.Thread(target=agent.watch_lease, args=(lease_s,), daemon=True).start()
    # SIGTERM to the agent stops its tasks like a closed stdin does.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        read_commands(agent, sys.stdin.buffer)
    finally:
        agent.shutdown()
        emit("bye")
        if lock_fd is not None:
            os.close(lock_fd)
    return 0


def _prune_runs(emit: Emitter, run_dir: str) -> None:
    """Old run folders of this host's `~/.mgpu-launch/runs` (launcher/hostruns.py)."""
    root = runs_root(run_dir)
    if root is None:
        return
    try:
        keep = int(os.environ.get("MGPU_KEEP_RUNS", KEEP_RUNS))
    except ValueError:
        keep = KEEP_RUNS
    removed = prune(root, current=os.path.dirname(os.path.abspath(run_dir)), keep=keep)
    if removed:
        emit("log", text=f"removed {len(removed)} old run folder(s) from {root} (keeping the "
             f"{keep} most recent and any in use): {', '.join(sorted(removed))}")


def read_commands(agent: Agent, stdin) -> None:
    """Run each command line until EOF.

    A thread reads stdin and renews the lease; this one runs the commands.
    Reading never waits on a command: one stuck writing to a slow launcher
    (a full SSH window) must not leave the pings unread and the lease to run
    out. Commands run on this thread: tasks are started from it, and
    PR_SET_PDEATHSIG fires when the thread that started a task ends, so it
    must live as long as the agent.
    """
    lines = _Lines()
    agent.command_queue = lines
    threading.Thread(target=_read_stdin, args=(agent, stdin, lines), daemon=True).start()
    while True:
        item = lines.get()
        if item is None:
            return
        if callable(item):  # work for this thread (a standby to start)
            item()
        elif isinstance(item, str):
            agent.emit("log", text=item)
        else:
            agent.dispatch(item)


class _Lines:
    """A queue between two threads (the queue module costs ~1 ms of start-up)."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._ready = threading.Semaphore(0)

    def put(self, item) -> None:  # bytes, str, a callable or None
        self._items.append(item)
        self._ready.release()

    def get(self):
        self._ready.acquire()
        return self._items.popleft()


def _read_stdin(agent: Agent, stdin, lines: _Lines) -> None:
    """Lines for `read_commands` (a str: a log to send instead), None at EOF."""
    try:
        while True:
            raw = stdin.readline(MAX_COMMAND_BYTES + 1)
            if not raw:
                return
            agent.heard()
            if len(raw) > MAX_COMMAND_BYTES and not raw.endswith(b"\n"):
                size = len(raw) + _skip_line(stdin, agent.heard)
                lines.put(f"ignored a command of {size} bytes (longer than {MAX_COMMAND_BYTES})")
                continue
            lines.put(raw)
    except (OSError, ValueError):
        return
    finally:
        lines.put(None)


EXIT_UNSAFE = 96  # the run dir is not the user's alone, or the bundle is not what its name says
# The bundle's files, as launcher.transport.shipping lists them (kept in step by a test).
BUNDLE_FILES = ("launcher/__init__.py", "launcher/agent.py", "launcher/bootstrap.py",
                "launcher/netif.py", "launcher/outlines.py", "launcher/proctree.py",
                "launcher/standby.py", "launcher/firewall.py", "launcher/hostruns.py",
                "launcher/strategy.py")
BUNDLE_DIRS = ("launcher/runtime",)


def unsafe_start(code_dir: str, run_dir: str) -> str:
    """Why this agent must not start tasks ("" when it may): its host run
    directory must be the user's alone (TF_CONFIG and error reports live there),
    and a bundle's content must match the digest in its folder's name."""
    info = os.stat(run_dir)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        return (f"the run directory {run_dir} belongs to uid {info.st_uid} with mode "
                f"{info.st_mode & 0o777:o}: it must be yours and writable by nobody else")
    if not os.path.exists(os.path.join(code_dir, BUNDLE_MARKER)):
        return ""  # run from a source tree (tests, development), not from a bundle
    import hashlib

    digest = hashlib.sha256()
    paths = list(BUNDLE_FILES)
    for folder in BUNDLE_DIRS:
        paths += sorted(f"{folder}/{name}" for name in os.listdir(os.path.join(code_dir, folder))
                        if name.endswith(".py"))
    for path in sorted(paths):
        with open(os.path.join(code_dir, path), "rb") as handle:
            digest.update(path.encode() + b"\0" + handle.read() + b"\0")
    expected = os.path.basename(code_dir).rsplit("-", 1)[-1]
    if digest.hexdigest()[:len(expected)] != expected:
        return (f"the code in {code_dir} does not match the digest in its name: changed "
                "after it was installed; remove that folder (the next launch reinstalls it)")
    return ""


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


def _makedirs_private(path: str) -> None:
    """Create `path` and every missing parent with mode 0700 (os.makedirs
    applies the mode to the last folder only)."""
    missing = []
    current = path
    while current and not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass


if __name__ == "__main__":
    sys.exit(main())
