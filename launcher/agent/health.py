"""Host signals of each task, sampled at a low rate for the straggler radar.

Why is a task slower than its peers? The host says part of it (docs/stragglers.md):

- `run_delay_s`: the time its threads spent runnable but waiting for a CPU
  (field 2 of `/proc/PID/task/*/schedstat`, summed over the task's threads):
  a noisy neighbour, too few cores;
- `cpu_s`: the CPU time it got (user + system, `/proc/PID/stat`);
- `throttled_s`: the time its cgroup was held back by a CPU quota (`cpu.stat`:
  `throttled_usec` under cgroup v2, `throttled_time` in ns under v1);
- on a GPU host, NVML (`nvidia-ml-py`, imported on first use; absent: no GPU
  figures): `gpu_util` (%), `sm_clock_mhz` and `sm_clock_max_mhz`, and
  `gpu_throttle` (the clocks-throttle-reasons bitmask) of the GPUs the task uses.

Counters are cumulative (the launcher takes the differences), so a sample
lost on the way costs nothing. One sample reads a few small files per thread:
~3 ms of CPU for a process of 120 threads, every `HEALTH_EVERY_S` (0.1 % of a core).

Standard library only; imports nothing of the launcher.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from launcher.agent import hostfacts

HEALTH_EVERY_S = 3.0
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def schedstat(pid: int, proc: str = "/proc") -> tuple[float, float] | None:
    """(on-CPU seconds, run-delay seconds) summed over the process's threads."""
    base = f"{proc}/{pid}/task"
    try:
        threads = os.listdir(base)
    except OSError:
        return None
    on_cpu = delay = 0
    for tid in threads:
        try:
            with open(f"{base}/{tid}/schedstat") as handle:
                fields = handle.read().split()
            on_cpu += int(fields[0])
            delay += int(fields[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return on_cpu / 1e9, delay / 1e9


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

    def due(self, now: float) -> bool:
        with self._lock:
            if self.every_s <= 0 or (self._last is not None and now - self._last < self.every_s):
                return False
            self._last = now
            return True

    def sample(self, pids: dict[str, int]) -> dict[str, dict[str, float]]:
        """Each task's figures (cumulative counters; absent ones left out)."""
        out: dict[str, dict[str, float]] = {}
        for name, pid in pids.items():
            figures: dict[str, float] = {}
            sched = schedstat(pid)
            if sched is not None:
                figures["run_delay_s"] = round(sched[1], 4)
            cpu = cpu_seconds(pid)
            if cpu is not None:
                figures["cpu_s"] = cpu
            throttled = throttled_seconds(pid)
            if throttled is not None:
                figures["throttled_s"] = round(throttled, 4)
            figures.update(self._gpu(pid))
            if figures:
                out[name] = figures
        return out

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
    hostfacts._add_site_dirs()  # noqa: SLF001 - the agent runs with -S: the site dirs first
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no device: no GPU figures
        return None
    return pynvml
