"""Host signals of each task, sampled at a low rate for the straggler radar.

Why is a task slower than its peers? The host says part of it (docs/stragglers.md):

- `run_delay_s`: the time its threads spent runnable but waiting for a CPU
  (field 2 of `/proc/PID/task/*/schedstat`, summed over the task's threads):
  a noisy neighbour, too few cores;
- `cpu_s`: the CPU time it got (user + system, `/proc/PID/stat`);
- `throttled_s`: the time its cgroup was held back by a CPU quota (`cpu.stat`:
  `throttled_usec` under cgroup v2, `throttled_time` in ns under v1);
- `io_wait`: how many of its busy threads are blocked reading, opening a
  file or sleeping, on average over a few snapshots ~10 ms apart (the
  syscall each thread is in, `/proc/PID/task/*/syscall`, or state `D`):
  an input pipeline waiting on a slow disk or share, a `time.sleep` in
  `tf.data`. Only threads that woke at least `MIN_WAKEUPS_PER_S` times a
  second since the last sample count (a heartbeat thread sleeping its
  seconds is no input), and the launcher's own (`mgpu-*`) never;
- on a GPU host, NVML (`nvidia-ml-py`, imported on first use; absent: no GPU
  figures): `gpu_util` (%), `sm_clock_mhz` and `sm_clock_max_mhz`, and
  `gpu_throttle` (the clocks-throttle-reasons bitmask) of the GPUs the task uses.

Counters are cumulative (the launcher takes the differences), so a sample
lost on the way costs nothing (`io_wait` is a gauge). One sample reads a few
small files per thread: ~6 ms of CPU for a process of 120 threads, every
`HEALTH_EVERY_S` (0.2 % of a core).

Standard library only; imports nothing of the launcher.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from launcher.agent import hostfacts

# No `typing` or `platform` at run time: every host's agent imports this
# module, and those two cost ~13 ms of CPU per agent start (a fan-out to 32
# hosts pays it 32 times).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HEALTH_EVERY_S = 3.0
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MIN_WAKEUPS_PER_S = 3.0  # a thread that woke less often is no part of the steps
IO_SNAPSHOTS, IO_SNAPSHOT_GAP_S = 5, 0.01
# Syscalls of a thread waiting for its input: reading (files, pipes), opening
# or listing files, sleeping. Not futex/epoll/poll: a thread parked on a lock
# or waiting for the network (a collective) is no input wait.
_IO_SYSCALLS = {
    "x86_64": frozenset({0, 2, 17, 19, 35, 208, 217, 230, 257, 262, 295, 327, 332, 426}),
    "aarch64": frozenset({4, 56, 61, 63, 65, 67, 69, 79, 101, 115, 286, 291, 426}),
}.get(os.uname().machine, frozenset())
OWN_THREAD_PREFIX = "mgpu-"  # the runtime's own threads (runtime/steps.py, trace.py)


def thread_schedstats(pid: int, proc: str = "/proc") -> dict[str, tuple[int, int, int]] | None:
    """Per thread: (on-CPU ns, run-delay ns, times run), `/proc/PID/task/*/schedstat`."""
    base = f"{proc}/{pid}/task"
    try:
        threads = os.listdir(base)
    except OSError:
        return None
    out = {}
    for tid in threads:
        try:
            with open(f"{base}/{tid}/schedstat") as handle:
                fields = handle.read().split()
            out[tid] = (int(fields[0]), int(fields[1]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return out


def schedstat(pid: int, proc: str = "/proc") -> tuple[float, float] | None:
    """(on-CPU seconds, run-delay seconds) summed over the process's threads."""
    threads = thread_schedstats(pid, proc)
    if threads is None:
        return None
    return (sum(t[0] for t in threads.values()) / 1e9,
            sum(t[1] for t in threads.values()) / 1e9)


def busy_threads(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]],
                 span_s: float, pid: int, proc: str = "/proc") -> list[str]:
    """The threads that woke at least MIN_WAKEUPS_PER_S times a second between
    two readings, the launcher's own left out."""
    woke = [tid for tid, now in after.items()
            if now[2] - before.get(tid, (0, 0, 0))[2] >= MIN_WAKEUPS_PER_S * span_s]
    return [tid for tid in woke if not _comm(pid, tid, proc).startswith(OWN_THREAD_PREFIX)]


def _comm(pid: int, tid: str, proc: str) -> str:
    try:
        with open(f"{proc}/{pid}/task/{tid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def waiting_for_io(pid: int, tid: str, proc: str = "/proc") -> bool:
    """The thread is in a reading/opening/sleeping syscall, or in state D
    (a page fault on a mapped file, an NFS wait)."""
    try:
        with open(f"{proc}/{pid}/task/{tid}/syscall") as handle:
            call = handle.read().split(maxsplit=1)[0]
        if call.isdigit():
            return int(call) in _IO_SYSCALLS
        if call == "running":
            return False
    except (OSError, IndexError):
        pass  # not ours to read (ptrace rules), or ended: the state alone then
    try:
        with open(f"{proc}/{pid}/task/{tid}/stat") as handle:
            text = handle.read()
        return text[text.rindex(")") + 2:].startswith("D")
    except (OSError, ValueError):
        return False


def cpu_seconds(pid: int, proc: str = "/proc") -> float | None:
    """User + system CPU seconds of the process (its ended threads included)."""
    try:
        with open(f"{proc}/{pid}/stat") as handle:
            text = handle.read()
        fields = text[text.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def throttled_seconds(pid: int, proc: str = "/proc", root: str = "/sys/fs/cgroup") -> float | None:
    """Seconds the process's cgroup was throttled by a CPU quota (None: unknown)."""
    try:
        with open(f"{proc}/{pid}/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # cgroup v2
            path, key, scale = f"{root}{parts[2]}", "throttled_usec", 1e6
        elif "cpu" in parts[1].split(","):  # cgroup v1's cpu controller
            path, key, scale = f"{root}/{parts[1]}{parts[2]}", "throttled_time", 1e9
        else:
            continue
        value = _stat_value(f"{path.rstrip('/')}/cpu.stat", key)
        if value is not None:
            return value / scale
    return None


def _stat_value(path: str, key: str) -> int | None:
    try:
        with open(path) as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def gpu_figures(nvml: Any, pid: int) -> dict[str, float]:
    """NVML's view of the GPUs `pid` uses (all of them when it shows on none):
    mean utilization, the slowest SM clock, its maximum, the throttle reasons."""
    count = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    mine = [h for h in handles if pid in _gpu_pids(nvml, h)] or handles
    if not mine:
        return {}
    utils, clocks, maxima, reasons = [], [], [], 0
    for handle in mine:
        utils.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        clocks.append(float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
        maxima.append(float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)))
        try:
            reasons |= int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        except nvml.NVMLError:
            pass
    slowest = clocks.index(min(clocks))
    return {"gpu_util": sum(utils) / len(utils), "sm_clock_mhz": clocks[slowest],
            "sm_clock_max_mhz": maxima[slowest], "gpu_throttle": float(reasons)}


def _gpu_pids(nvml: Any, handle: Any) -> set[int]:
    try:
        return {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except nvml.NVMLError:
        return set()


class Health:
    """Samples every `every_s` (the heartbeat asks each beat; most beats get nothing)."""

    def __init__(self, every_s: float = HEALTH_EVERY_S,
                 load_nvml: Callable[[], Any] | None = None) -> None:
        self.every_s = every_s
        self._load_nvml = load_nvml or _load_nvml
        self._nvml: Any = None
        self._nvml_tried = False
        self._last: float | None = None
        self._lock = threading.Lock()
        # pid -> (when, its threads' schedstats): the wakeups since the last sample
        self._threads: dict[int, tuple[float, dict[str, tuple[int, int, int]]]] = {}

    def due(self, now: float) -> bool:
        with self._lock:
            if self.every_s <= 0 or (self._last is not None and now - self._last < self.every_s):
                return False
            self._last = now
            return True

    def sample(self, pids: dict[str, int]) -> dict[str, dict[str, float]]:
        """Each task's figures (cumulative counters; absent ones left out)."""
        out: dict[str, dict[str, float]] = {}
        busy: dict[int, list[str]] = {}
        now = time.monotonic()
        for name, pid in pids.items():
            figures: dict[str, float] = {}
            threads = thread_schedstats(pid)
            if threads is not None:
                figures["run_delay_s"] = round(sum(t[1] for t in threads.values()) / 1e9, 4)
                previous = self._threads.get(pid)
                self._threads[pid] = (now, threads)
                if previous is not None and now > previous[0]:
                    busy[pid] = busy_threads(previous[1], threads, now - previous[0], pid)
            cpu = cpu_seconds(pid)
            if cpu is not None:
                figures["cpu_s"] = cpu
            throttled = throttled_seconds(pid)
            if throttled is not None:
                figures["throttled_s"] = round(throttled, 4)
            figures.update(self._gpu(pid))
            if figures:
                out[name] = figures
        self._threads = {pid: seen for pid, seen in self._threads.items()
                         if pid in pids.values()}
        self._add_io_wait(out, pids, busy)
        return out

    @staticmethod
    def _add_io_wait(out: dict[str, dict[str, float]], pids: dict[str, int],
                     busy: dict[int, list[str]]) -> None:
        """Every task's snapshots at once: the tasks are seen at the same moments."""
        tasks = [(name, pid) for name, pid in pids.items() if pid in busy and name in out]
        counts = dict.fromkeys(tasks, 0)
        for index in range(IO_SNAPSHOTS):
            if index:
                time.sleep(IO_SNAPSHOT_GAP_S)
            for name, pid in tasks:
                counts[(name, pid)] += sum(waiting_for_io(pid, tid) for tid in busy[pid])
        for (name, _), count in counts.items():
            out[name]["io_wait"] = round(count / IO_SNAPSHOTS, 2)

    def _gpu(self, pid: int) -> dict[str, float]:
        if not self._nvml_tried:
            self._nvml_tried = True
            self._nvml = self._load_nvml()
        if self._nvml is None:
            return {}
        try:
            return gpu_figures(self._nvml, pid)
        except Exception:  # noqa: BLE001 - a driver error: no GPU figures this time
            return {}


def _load_nvml() -> Any:
    """pynvml (nvidia-ml-py), initialised; None without it or without a GPU."""
    hostfacts.add_site_dirs()  # the agent runs with -S: the site dirs first
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no device: no GPU figures
        return None
    return pynvml
