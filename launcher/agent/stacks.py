"""A task's Python stacks, on request (`stacks`).

The bootstrap registers `faulthandler` on MGPU_STACKS_SIGNAL (SIGUSR1 by
default) to append to MGPU_STACKS_FILE (`RUN_DIR/stacks/<task>-gen<N>.txt`,
0600). `stacks` truncates that file, signals the task's main process (only if
its /proc status shows the signal caught, since its default action kills),
waits until the file stops growing (STACKS_WAIT_S in all) and sends the text.

Standard library only; of the launcher, imports bootstrap (the signal's name),
proctree and the agent's files.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from launcher.agent.files import file_size, private_dir, write_private
from launcher.bootstrap import stacks_signal
from launcher.proctree import proc_stat

STACKS_WAIT_S = 1.0  # for all tasks of one request, in parallel
STACKS_SETTLE_S = 0.1  # a stacks file that did not grow for this long is complete
STACKS_MAX_BYTES = 256 * 1024


def stacks_setup(run_dir: str, name: str, generation: int,
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
    path = os.path.join(private_dir(run_dir, "stacks"), f"{name}-gen{generation}.txt")
    write_private(path, "")
    env["MGPU_STACKS_FILE"] = path
    return path, signum, problem


class Stacks:
    """Answers `stacks` for running tasks (each with `stacks_file`,
    `stacks_signum`, `stacks_problem`, `name`, `generation` and `proc`)."""

    def __init__(self, emit) -> None:
        self.emit = emit

    def request(self, tasks: list, names: list[str] | None) -> None:
        """`tasks`: those of `names` (None: all) that run; the others are said not to."""
        running = {t.name for t in tasks}
        for name in (names or []):
            if name not in running:
                self.emit("stacks", task=name[:200], generation=None, text="",
                          error="no such task running on this host")
        if tasks:
            threading.Thread(target=self._collect, args=(tasks,), daemon=True).start()

    def _collect(self, tasks: list) -> None:
        deadline = time.monotonic() + STACKS_WAIT_S
        waiting: dict[object, list[float]] = {}  # task -> [size seen, when it changed]
        for task in tasks:
            error = _ask_for_stacks(task)
            if error:
                self.emit("stacks", task=task.name, generation=task.generation, text="",
                          error=error)
            else:
                waiting[task] = [0, time.monotonic()]
        while waiting and time.monotonic() < deadline:
            time.sleep(0.02)
            now = time.monotonic()
            for task, seen in list(waiting.items()):
                size = file_size(task.stacks_file)
                if size != seen[0]:
                    seen[0], seen[1] = size, now
                elif size > 0 and now - seen[1] >= STACKS_SETTLE_S:
                    del waiting[task]
                    self._send(task)
        for task in waiting:
            self._send(task)

    def _send(self, task) -> None:
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


def _ask_for_stacks(task) -> str:
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


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
