"""What an agent may say: every message from an agent is checked here before use.

Owns the shape of agent -> supervisor messages (see `launcher.agent` for the
full protocol). `check_message` returns a clean copy of a message whose fields
have the types the supervisor relies on, or the reason it is refused: a
malformed, oversized or hostile message (a NaN step, a task name with a slash,
a 10 MB line) is logged and ignored by the supervisor, never fatal.

Pure: no I/O. Must not import the launcher's other modules.
"""

from __future__ import annotations

import math
import re
from typing import Any

# A task output line is cut at this many characters (the agent cuts first, at
# 8 KiB of bytes; this bounds what a misbehaving agent could send).
MAX_LINE = 8192
# An output line as the agent sends it: its cut text and its own marker, which
# must survive (it says how many bytes were cut).
MAX_OUTPUT_TEXT = MAX_LINE + 128
MAX_TAIL_LINES = 30
MAX_STACK = 256 * 1024
MAX_ERROR_FIELD = 8000
TASK_NAME = re.compile(r"^(chief|worker|ps|evaluator)\d{1,6}$")

TASK_EVENTS = frozenset({"started", "start_failed", "output", "progress", "exited", "stacks",
                         "profile", "profile_part"})
OTHER_EVENTS = frozenset({"hello", "heartbeat", "log", "bye", "exec_result", "agent_lost",
                          # the memory tier's copies on other hosts (job/run/peerrelay.py
                          # checks them)
                          "memory_held", "peer_begin", "peer_chunk", "peer_end", "peer_ack",
                          "peer_stored", "peer_done",
                          # ports a host's tasks opened, sealed there: told the other hosts
                          "ports_opened"})


class BadMessage(ValueError):
    """Why a message was refused."""


def check_message(message: Any) -> dict[str, Any]:
    """A clean copy of `message`, or BadMessage saying what is wrong with it."""
    if not isinstance(message, dict):
        raise BadMessage("not a JSON object")
    event = message.get("ev")
    if event not in TASK_EVENTS and event not in OTHER_EVENTS:
        raise BadMessage(f"unknown event {_short(event)}")
    clean: dict[str, Any] = {"ev": event, "t": _time(message.get("t"))}
    if event in TASK_EVENTS:
        task = message.get("task")
        if not isinstance(task, str) or not TASK_NAME.match(task):
            raise BadMessage(f"{event}: bad task name {_short(task)}")
        clean["task"] = task
        if event in ("stacks", "profile") and message.get("generation") is None:
            clean["generation"] = None  # the agent runs no such task: nothing to take
        else:
            clean["generation"] = _int(message.get("generation"), f"{event}: generation",
                                       low=0)
    checker = _CHECKS.get(event)
    if checker is not None:
        checker(message, clean)
    else:  # hello, bye, exec_result, agent_lost: read by their own code, kept as they are
        clean = {**message, "t": clean["t"]}
    return clean


def _started(message: dict, clean: dict) -> None:
    clean["pid"] = _int(message.get("pid"), "started: pid", low=1)
    # Warm (a standby took the task) or cold, and why cold (launcher.standby).
    clean["start"] = "warm" if message.get("start") == "warm" else "cold"
    clean["start_reason"] = _text(message.get("start_reason") or "", MAX_ERROR_FIELD)


def _start_failed(message: dict, clean: dict) -> None:
    clean["error"] = _text(message.get("error"), MAX_ERROR_FIELD)


def _output(message: dict, clean: dict) -> None:
    text = message.get("text")
    if not isinstance(text, str):
        raise BadMessage("output: text is not a string")
    clean["text"] = _text(text, MAX_OUTPUT_TEXT)
    clean["stream"] = "stderr" if message.get("stream") == "stderr" else "stdout"


def _progress(message: dict, clean: dict) -> None:
    data = message.get("data")
    if not isinstance(data, dict):
        raise BadMessage("progress: data is not an object")
    kept: dict[str, Any] = {}
    for key, value in list(data.items())[:64]:
        if not isinstance(key, str) or len(key) > 64:
            continue
        if isinstance(value, bool):
            kept[key] = int(value)
        elif _fits(value):
            kept[key] = list(value) if isinstance(value, list) else value
    if "step" in data and "step" not in kept:
        raise BadMessage(f"progress: bad step {_short(data.get('step'))}")
    clean["data"] = kept


def _fits(value: Any) -> bool:
    """A progress value worth keeping: a finite number, a short string, or a
    short list of integers (a position such as [epoch, batch])."""
    if isinstance(value, int | float):
        return math.isfinite(value) and abs(value) < 1e18
    if isinstance(value, str):
        return len(value) <= 200
    return isinstance(value, list) and len(value) <= 4 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value)


def _evidence(given: object) -> dict[str, dict[str, int | str]]:
    """An exit's evidence from its host (launcher/agent/evidence.py): a few
    named facts, numbers or short words; anything else dropped."""
    if not isinstance(given, dict):
        return {}
    return {str(name)[:40]: {str(k)[:40]: v if isinstance(v, int) and not isinstance(v, bool)
                             else _text(v, 200) for k, v in list(facts.items())[:8]
                             if isinstance(v, int | str) and not isinstance(v, bool)}
            for name, facts in list(given.items())[:8] if isinstance(facts, dict)}


def _exited(message: dict, clean: dict) -> None:
    code, signum = message.get("code"), message.get("signal")
    clean["code"] = None if code is None else _int(code, "exited: code", low=-255, high=255)
    clean["signal"] = None if signum is None else _int(signum, "exited: signal", low=1, high=128)
    if clean["code"] is None and clean["signal"] is None:
        raise BadMessage("exited: neither a code nor a signal")
    clean["stopping"] = message.get("stopping") is True
    # The signals the agent sent it when asked (the drill's faults): whose, when.
    signalled = message.get("signalled") or []
    clean["signalled"] = [
        {"signal": s["signal"], "t": _time(s.get("t")), "by": _text(s.get("by") or "", 40)}
        for s in (signalled if isinstance(signalled, list) else [])[:8]
        if isinstance(s, dict) and isinstance(s.get("signal"), int)]
    tail = message.get("tail") or []
    if not isinstance(tail, list):
        raise BadMessage("exited: tail is not a list")
    clean["tail"] = [_text(line, MAX_OUTPUT_TEXT) for line in tail[-MAX_TAIL_LINES:]
                     if isinstance(line, str)]
    clean["evidence"] = _evidence(message.get("evidence"))
    error = message.get("error")
    if isinstance(error, dict):
        clean["error"] = {key: _text(error.get(key), MAX_ERROR_FIELD)
                          for key in ("type", "message", "traceback") if key in error}
        # The bootstrap's facts for `keras: auto` (launcher/job/policy/keras_fallback.py).
        clean["error"].update({key: True for key in KERAS_ERA if error.get(key) is True})
    else:
        clean["error"] = None


def _stacks(message: dict, clean: dict) -> None:
    clean["text"] = _text(message.get("text") or "", MAX_STACK)
    clean["error"] = _text(message.get("error") or "", MAX_ERROR_FIELD)


KERAS_ERA = ("raised_in_keras3", "script_uses_tf_keras")

# A task's host signals in a heartbeat (launcher/agent/health.py); others are dropped.
HEALTH_KEYS = frozenset({"run_delay_s", "cpu_s", "throttled_s", "io_wait", "gpu_util",
                         "sm_clock_mhz", "sm_clock_max_mhz", "gpu_throttle"})

TRACE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_PART = 2 * 2**20  # characters of base64 in one `profile_part` (1 MiB of trace)
TRACE_FIGURES = ("window_s", "steps", "step_s", "collective_s", "input_s", "compute_s")


def _trace_id(message: dict, clean: dict) -> None:
    ident = message.get("id")
    if not isinstance(ident, str) or not TRACE_ID.match(ident):
        raise BadMessage(f"{clean['ev']}: bad trace id {_short(ident)}")
    clean["id"] = ident


def _profile(message: dict, clean: dict) -> None:
    _trace_id(message, clean)
    clean["error"] = _text(message.get("error") or "", MAX_ERROR_FIELD)
    summary = message.get("summary")
    clean["summary"] = None
    if isinstance(summary, dict):
        clean["summary"] = {key: _figure(summary.get(key)) for key in TRACE_FIGURES}


def _figure(value: Any) -> float | int | None:
    """A trace figure: a finite, non-negative number (None: not known)."""
    if isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value) and 0 <= value < 1e12:
        return value
    return None


def _profile_part(message: dict, clean: dict) -> None:
    _trace_id(message, clean)
    clean["offset"] = _int(message.get("offset"), "profile_part: offset", low=0)
    data = message.get("data")
    if not isinstance(data, str) or len(data) > MAX_PART:
        raise BadMessage("profile_part: data is not a string of base64 within bounds")
    clean["data"] = data


def _heartbeat(message: dict, clean: dict) -> None:
    tasks = message.get("tasks") or {}
    if not isinstance(tasks, dict):
        raise BadMessage("heartbeat: tasks is not an object")
    usage: dict[str, dict[str, Any]] = {}
    for name, stats in tasks.items():
        if not isinstance(name, str) or not TASK_NAME.match(name) or not isinstance(stats, dict):
            continue
        entry: dict[str, Any] = {}
        for key in ("cpu", "rss_mb"):
            value = stats.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) \
                    and math.isfinite(value):
                entry[key] = value
        if isinstance(stats.get("status"), str):
            entry["status"] = stats["status"][:20]
        health = stats.get("health")
        if isinstance(health, dict):  # host signals, every few beats (agent/health.py)
            entry["health"] = {key: value for key, value in health.items()
                               if key in HEALTH_KEYS and isinstance(value, int | float)
                               and not isinstance(value, bool) and math.isfinite(value)}
        usage[name] = entry
    clean["tasks"] = usage


def _log(message: dict, clean: dict) -> None:
    clean["text"] = _text(message.get("text") or "", MAX_LINE)
    if message.get("notice") is True:  # for the user, not only for -v (the TF ports open)
        clean["notice"] = True


def _ports_opened(message: dict, clean: dict) -> None:
    ports = message.get("ports")
    if not isinstance(ports, list) or not 0 < len(ports) <= 1024:
        raise BadMessage("ports_opened: ports is not a list of 1 to 1024 ports")
    clean["ports"] = [_int(p, "ports_opened: port", low=1, high=65535) for p in ports]


_CHECKS = {"started": _started, "start_failed": _start_failed, "output": _output,
           "progress": _progress, "exited": _exited, "stacks": _stacks,
           "heartbeat": _heartbeat, "log": _log, "profile": _profile,
           "profile_part": _profile_part, "ports_opened": _ports_opened}


def _int(value: Any, what: str, low: int, high: int = 2**63) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadMessage(f"{what} is {_short(value)}, not an integer in [{low}, {high}]")
    return value


def _time(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value) and value > 0:
        return float(value)
    return None


def _text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    if len(text) > limit:
        return text[:limit] + f" … [mgpu-launch: cut, {len(text) - limit} more characters]"
    return text


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
