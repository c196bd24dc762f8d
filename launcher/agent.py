"""The per-host agent: starts, watches and stops the tasks of one host.

Runs on the host (over SSH, or as a plain subprocess for simulated hosts) and
speaks newline-delimited JSON with the supervisor, one object per line.

supervisor -> agent (`op`): start {task, generation, argv, cwd, env, tf_config},
signal {task, signum}, stop {tasks|null, grace_s}, exec_check {id, argv}.
agent -> supervisor (`ev`, each with `t`): hello, started {task, pid},
start_failed {task, error}, output {task, stream, text}, progress {task, data},
exited {task, code|signal, stopping, tail, error}, heartbeat {tasks: {cpu,
rss_mb, status}}, exec_result, log, bye.

Guarantees:
- every task runs in its own session/process group; stopping a task signals
  the whole group (and every descendant psutil can still see);
- TF_CONFIG is written to a 0600 file in the run directory and exported to the
  task; it never appears on a command line;
- when stdin closes (the launcher died, or the SSH connection dropped) every
  task is stopped and the agent exits: no orphan outlives its launcher.

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
import signal
import subprocess
import sys
import threading
import time

from launcher import __version__

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
BUNDLE_MARKER = ".mgpu-bundle"  # launcher.shipping.USE_MARKER (the agent imports no launcher code)
BUNDLE_TOUCH_EVERY_S = 3600.0


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


class RunningTask:
    def __init__(self, name: str, generation: int, proc: subprocess.Popen, error_file: str):
        self.name = name
        self.generation = generation
        self.proc = proc
        self.error_file = error_file
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.readers: list[threading.Thread] = []
        self.stopping = False  # the agent sent SIGTERM
        self.killed = False  # the agent sent SIGKILL
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


class Agent:
    def __init__(self, host: str, run_dir: str, emit: Emitter, eof_grace_s: float) -> None:
        self.host = host
        self.run_dir = os.path.abspath(os.path.expanduser(run_dir))
        self.emit = emit
        self.eof_grace_s = eof_grace_s
        self.tasks: dict[str, RunningTask] = {}
        self.lock = threading.Lock()
        self.code_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.mark_bundle_used()
        self.preexec = _pdeathsig_preexec()
        self.progress_fds: dict[int, str] = {}

    def mark_bundle_used(self) -> None:
        """Touch our bundle's folder: launchers drop bundles nobody used for a
        month (see launcher.shipping). Only a bundle has the marker file."""
        if os.path.exists(os.path.join(self.code_dir, BUNDLE_MARKER)):
            try:
                os.utime(self.code_dir)
            except OSError:
                pass

    # ------------------------------------------------------------------ commands

    def handle(self, message: dict) -> None:
        op = message.get("op")
        if op == "start":
            self.start(message)
        elif op == "signal":
            task = self.tasks.get(message["task"])
            if task is not None and task.alive():
                task.signal_tree(int(message["signum"]))
        elif op == "stop":
            self.stop(message.get("tasks"), float(message.get("grace_s", 3.0)))
        elif op == "exec_check":
            self.exec_check(message)
        else:
            self.emit("log", text=f"unknown op {op!r}")

    def _private_dir(self, *parts: str) -> str:
        path = os.path.join(self.run_dir, *parts)
        _makedirs_private(path)
        return path

    def start(self, message: dict) -> None:
        name = message["task"]
        generation = int(message.get("generation", 0))
        with self.lock:
            old = self.tasks.get(name)
            if old is not None and old.alive():
                self.emit("start_failed", task=name, generation=generation,
                          error=f"task {name} is still running (pid {old.proc.pid})")
                return
        try:
            config_dir = self._private_dir("tf_config")
            tf_config_file = os.path.join(config_dir, f"{name}.json")
            fd = os.open(tf_config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(fd, 0o600)  # the file may predate us with wider bits
            with os.fdopen(fd, "w") as handle:
                handle.write(message["tf_config"])
            error_file = os.path.join(self._private_dir("errors"), f"{name}-gen{generation}.json")
            if os.path.exists(error_file):
                os.unlink(error_file)
            progress_read, progress_write = os.pipe()
            env = dict(os.environ)
            env.update(message.get("env", {}))
            if env.get("MGPU_RUN_DIR", "").startswith("~"):
                env["MGPU_RUN_DIR"] = os.path.expanduser(env["MGPU_RUN_DIR"])
            env["TF_CONFIG"] = message["tf_config"]
            env["MGPU_TF_CONFIG_FILE"] = tf_config_file
            env["MGPU_ERROR_FILE"] = error_file
            env["MGPU_PROGRESS_FD"] = str(progress_write)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self.code_dir, env.get("PYTHONPATH", "")) if p
            )
            proc = subprocess.Popen(
                message["argv"],
                cwd=message.get("cwd") or None,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(progress_write,),
                preexec_fn=self.preexec,
            )
        except (OSError, KeyError, ValueError) as exc:
            if "progress_write" in locals():
                os.close(progress_read)
                os.close(progress_write)
            self.emit("start_failed", task=name, generation=generation,
                      error=f"{type(exc).__name__}: {exc}")
            return
        os.close(progress_write)  # the task holds the only write end now
        self.mark_bundle_used()
        task = RunningTask(name, generation, proc, error_file)
        with self.lock:
            self.tasks[name] = task
        self.emit("started", task=name, generation=generation, pid=proc.pid)
        for stream_name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            reader = threading.Thread(
                target=self._read_output, args=(task, stream_name, stream), daemon=True
            )
            reader.start()
            task.readers.append(reader)
        threading.Thread(target=self._read_progress, args=(task, progress_read),
                         daemon=True).start()
        threading.Thread(target=self._wait, args=(task,), daemon=True).start()

    def _read_output(self, task: RunningTask, stream_name: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            task.tail.append(text)
            self.emit("output", task=task.name, generation=task.generation,
                      stream=stream_name, text=text)
        stream.close()

    def _read_progress(self, task: RunningTask, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            for raw in stream:
                try:
                    data = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(data, dict):
                    self.emit("progress", task=task.name, generation=task.generation, data=data)

    def _wait(self, task: RunningTask) -> None:
        code = task.proc.wait()
        exited_at = time.time()  # before draining: the root cause is the earliest exit
        # Whatever the task left behind in its group (data-loader workers,
        # multiprocessing children) dies with it: no orphan may hold a GPU.
        try:
            os.killpg(task.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for reader in task.readers:
            reader.join(timeout=DRAIN_S)
        error = None
        try:
            with open(task.error_file) as handle:
                error = json.load(handle)
        except (OSError, ValueError):
            pass
        self.emit(
            "exited",
            task=task.name,
            generation=task.generation,
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            stopping=_stopped_by_us(task, code),
            tail=list(task.tail),
            error=error,
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

    def exec_check(self, message: dict) -> None:
        """Run a short command (used by `mgpu-launch check`) and report its output."""
        try:
            done = subprocess.run(message["argv"], capture_output=True, text=True,
                                  timeout=float(message.get("timeout_s", 60)),
                                  cwd=message.get("cwd") or None)
            self.emit("exec_result", id=message.get("id"), code=done.returncode,
                      stdout=done.stdout[-20000:], stderr=done.stderr[-5000:])
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.emit("exec_result", id=message.get("id"), code=None,
                      stdout="", stderr=f"{type(exc).__name__}: {exc}")

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

    def shutdown(self) -> None:
        """stdin closed: stop every task, wait for them, then return."""
        self.stop(None, self.eof_grace_s)
        deadline = time.monotonic() + self.eof_grace_s + 2.0
        for task in list(self.tasks.values()):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                task.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                task.signal_tree(signal.SIGKILL)


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


USAGE = "usage: python -m launcher.agent --host NAME --run-dir DIR [--eof-grace SECONDS]"


def parse_args(argv: list[str]) -> tuple[str, str, float]:
    """(host, run_dir, eof_grace_s). Only the launcher starts the agent; argparse
    would cost ~8 ms of every agent start (it loads re, gettext and shutil)."""
    options = {"--host": None, "--run-dir": None, "--eof-grace": "2.0"}
    rest = list(argv)
    while rest:
        flag = rest.pop(0)
        if flag not in options or not rest:
            raise SystemExit(f"{USAGE}\nbad argument: {flag!r}")
        options[flag] = rest.pop(0)
    if options["--host"] is None or options["--run-dir"] is None:
        raise SystemExit(f"{USAGE}\n--host and --run-dir are required")
    try:
        grace = float(options["--eof-grace"])
    except ValueError:
        raise SystemExit(f"{USAGE}\n--eof-grace wants seconds, "
                         f"got {options['--eof-grace']!r}") from None
    return options["--host"], options["--run-dir"], grace


def main(argv: list[str] | None = None) -> int:
    host, run_dir, eof_grace_s = parse_args(sys.argv[1:] if argv is None else argv)
    # Ctrl-C in the launcher's terminal is the launcher's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    emit = Emitter(sys.stdout.buffer)
    agent = Agent(host, run_dir, emit, eof_grace_s)
    _makedirs_private(agent.run_dir)
    packages = _installed_versions()
    emit("hello", host=host, pid=os.getpid(), version=__version__,
         python=sys.executable, python_version=sys.version.split()[0],
         hostname=os.uname().nodename, run_dir=agent.run_dir,
         psutil=packages.pop("psutil") is not None, packages=packages)
    threading.Thread(target=agent.heartbeat_forever, daemon=True).start()
    # SIGTERM to the agent stops its tasks like a closed stdin does.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        for raw in sys.stdin.buffer:
            try:
                message = json.loads(raw)
                if not isinstance(message, dict):
                    raise ValueError("not a JSON object")
                agent.handle(message)
            except Exception as exc:  # one bad command must not take the tasks' keeper down
                emit("log", text=f"ignored command {raw[:80]!r}: {type(exc).__name__}: {exc}")
    finally:
        agent.shutdown()
        emit("bye")
    return 0


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
