"""Read what went wrong: classify task exits and spot fatal TensorFlow errors in output.

Pure functions over exit codes, signals, error reports and output lines; no I/O.
Used by the supervisor to act on the *first* sign of failure (a peer of a dead
worker prints its collective abort seconds before it exits) and to name the
root cause in words a user can act on.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

from .failkinds import Kind, say

# A restore found no readable checkpoint (the runtime's words; recovery.py stops on it).
NO_READABLE_CHECKPOINT = "no readable checkpoint is left"

# Exit code a task uses to say "restart me" (TensorFlow's preemption handling
# and our runtime exit with it after saving a checkpoint on SIGTERM).
RESTART_ME_EXIT = 42

# A collective was aborted: MultiWorkerMirroredStrategy cannot continue.
_COLLECTIVE_ABORT = re.compile(r"BaseCollectiveExecutor::StartAbort (\w+)")
# TF's coordination service names the culprit on the following line(s).
_UNHEALTHY = re.compile(r"following tasks are unhealthy \(stopped sending heartbeats\)")
_TASK_NAME = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
_PROCESS_ID = re.compile(r"^\s*(\d+)\s*$")  # JAX names an unhealthy process by its id
_DEADLINE = re.compile(r"DEADLINE_EXCEEDED|DeadlineExceededError")
_UNAVAILABLE = re.compile(r"UNAVAILABLE|UnavailableError")
# TF's gRPC server could not bind its port (something else took it since the plan):
# `add_port.cc:83] Failed to add port to server: No address added out of total 1
# resolved for '0.0.0.0:40395'`, then UnknownError "Could not start gRPC server".
_ADD_PORT = re.compile(r"Failed to add port to server.*?resolved for '[^']*?:(\d+)'")
_NO_SERVER = re.compile(r"Could not start gRPC server")


# tf_keras (Keras 2) code that Keras 3 refuses: what `tf.keras` is under
# TensorFlow 2.16+ unless TF_USE_LEGACY_KERAS=1 (`keras: tf_keras`).
_TF_KERAS_ONLY = re.compile(
    r"is not supported in Keras 3"                     # keras.optimizers.legacy, ...
    r"|module 'keras\._tf_keras\.[\w.]+' has no attribute"  # tf.keras.backend.get_session, ...
    r"|object has no attribute '(?:reset_states|lr|_make_train_function|_train_counter)'"
    r"|filename must end in `\.weights\.h5`"             # save_weights("ckpt") (TF format)
    r"|Invalid filepath extension for saving"           # model.save("dir") (SavedModel)
)
TF_KERAS_HINT = ("this is tf_keras (Keras 2) code running under Keras 3: set `keras: "
                 "tf_keras` in the cluster file (tf.keras is then tf_keras)")


def tf_keras_hint(error: dict | None, last_lines: list[str] | tuple[str, ...]) -> str | None:
    """The hint to set `keras: tf_keras` when a task died of a tf_keras-only API."""
    error = error or {}
    text = "\n".join([str(error.get("type", "")), str(error.get("message", "")),
                      str(error.get("traceback", "")), *last_lines])
    return TF_KERAS_HINT if _TF_KERAS_ONLY.search(text) else None


@dataclass(frozen=True)
class OutputAlarm:
    """A fatal error seen in a task's output before the task exits."""

    kind: str  # collective_abort | peer_unhealthy
    code: str  # TF status code, e.g. UNAVAILABLE, DEADLINE_EXCEEDED
    line: str


class OutputWatcher:
    """Feeds on one task's lines; reports the first fatal TF error, and the
    peer TF blamed for it when TF names one (`culprit`, e.g. ("worker", 1)).

    `jax`: the task runs Keras 3 on JAX, whose coordination service prints
    "The following tasks are unhealthy (stopped sending heartbeats):" without
    a collective abort, and names the culprit by its process id alone on the
    next line (`culprit` ("process", 1)): that line is the alarm."""

    def __init__(self, jax: bool = False) -> None:
        self.alarm: OutputAlarm | None = None
        self.culprit: tuple[str, int] | None = None
        self._expect_culprit = 0
        self._jax = jax

    def feed(self, line: str) -> OutputAlarm | None:
        """Returns an alarm the first time one is seen, else None."""
        if self._expect_culprit:
            self._expect_culprit -= 1
            match = _TASK_NAME.search(line)
            process = _PROCESS_ID.match(line) if self._jax else None
            if match and self.culprit is None:
                self.culprit = (match.group(1), int(match.group(2)))
            elif process and self.culprit is None:
                self.culprit = ("process", int(process.group(1)))
        if _UNHEALTHY.search(line):
            self._expect_culprit = 2
            match = _TASK_NAME.search(line.split("heartbeats)", 1)[-1])
            if match:
                self.culprit = (match.group(1), int(match.group(2)))
            if self._jax and self.alarm is None:
                self.alarm = OutputAlarm("peer_unhealthy", "UNAVAILABLE", line.strip())
                return self.alarm
        if self.alarm is not None:
            return None
        abort = _COLLECTIVE_ABORT.search(line)
        if abort:
            self.alarm = OutputAlarm("collective_abort", abort.group(1), line.strip())
            if _UNHEALTHY.search(line):
                self.alarm = OutputAlarm("peer_unhealthy", abort.group(1), line.strip())
            return self.alarm
        return None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_kind(exit_code: int | None, signum: int | None) -> Kind:
    """A task's exit as a failure kind: preempted (exit 42), signal or exit."""
    if exit_code == RESTART_ME_EXIT:
        return Kind.PREEMPTED
    return Kind.SIGNAL if signum is not None else Kind.EXIT


def exit_of(body: dict[str, Any], host: str = "", port: int | None = None,
            chosen: bool = False) -> tuple[Kind, str, dict[str, Any]]:
    """A task's `exited` report (launcher/job/run/protocol.py's, checked) as its
    failure kind and the words of it, most specific first: its host's
    evidence (launcher/agent/evidence.py) before its code and signal; a port
    taken before its TF server bound it (`port`: the plan's, where TF's line
    names none; `chosen`: the launcher picks the ports, a restart takes fresh ones)."""
    code, signum = body.get("code"), body.get("signal")
    taken = port_taken(body.get("error"), tuple(body.get("tail") or ())) \
        if code not in (0, RESTART_ME_EXIT) and signum is None else None
    if taken is not None:
        return Kind.PORT_TAKEN, "chosen" if chosen else "fixed", {
            "port": taken or port or "(its port)", "host": host or "its host"}
    how, facts = exit_words(code, signum, body.get("error"), tuple(body.get("tail") or ()),
                            body.get("signalled") or ())
    oom = (body.get("evidence") or {}).get("oom") or {}
    if how == "sigkill" and oom.get("in_cgroup"):
        limit = oom.get("limit_bytes")
        return Kind.OOM, "cgroup", {"limit": f"{limit // 2**20} MiB" if isinstance(limit, int)
                                    and 0 < limit < 2**62 else "unknown"}
    if how == "sigkill" and isinstance(oom.get("on_host"), int):
        # The host's counter counts every process's kills: a clue, not a verdict.
        return exit_kind(code, signum), "sigkill_oom_on_host", {"count": oom["on_host"]}
    return exit_kind(code, signum), how, facts


def port_taken(error: dict | None, last_lines: tuple[str, ...]) -> int | None:
    """The port TF's gRPC server could not bind (0: it did not say which), or None
    when the task did not fail so."""
    error = error or {}
    said = "\n".join([str(error.get("message", "")), str(error.get("traceback", "")),
                      *last_lines])
    found = _ADD_PORT.search(said)
    if found:
        return int(found.group(1))
    return 0 if _NO_SERVER.search(said) else None


def classify_exit(exit_code: int | None, signum: int | None, error: dict | None,
                  last_lines: list[str] | tuple[str, ...]) -> str:
    """One phrase for why a task ended, most specific first."""
    how, facts = exit_words(exit_code, signum, error, last_lines)
    return say(exit_kind(exit_code, signum), how, facts)


def exit_words(exit_code: int | None, signum: int | None, error: dict | None,
               last_lines: list[str] | tuple[str, ...],
               signalled: list[dict] | tuple[dict, ...] = ()) -> tuple[str, dict[str, Any]]:
    """Which words of its kind say why a task ended (job/record/failkinds.py), most
    specific first, and the facts that fill them in. `signalled`: the signals
    its agent sent it when asked (`signal`, `t`, `by`: the drill's faults)."""
    text = "\n".join(last_lines)
    sent = _sent_by(signalled, signum if signum is not None else
                    signal.SIGKILL if exit_code == 137 else None)
    if sent is not None:
        return sent
    if signum == signal.SIGKILL or exit_code == 137:
        return "sigkill", {}
    if signum is not None:
        return "signal", {"signal": signum, "name": signal_name(signum)}
    if exit_code == RESTART_ME_EXIT:
        return "restart_me", {}
    error_type = (error or {}).get("type", "")
    if _DEADLINE.search(error_type) or (not error and _DEADLINE.search(text)):
        return "deadline", {}
    if _UNAVAILABLE.search(error_type) or (not error and _UNAVAILABLE.search(text)):
        return "unavailable", {}
    hint = tf_keras_hint(error, last_lines)
    hint = f" — {hint}" if hint else ""
    if error:
        return "exception", {"type": error_type, "message": str(error.get("message", ""))[:200],
                             "hint": hint}
    return "code", {"exit_code": exit_code, "hint": hint}


def _sent_by(signalled: list[dict] | tuple[dict, ...],
             died_of: int | None) -> tuple[str, dict[str, Any]] | None:
    """A death by a signal someone asked the agent to send (the drill's kill or
    preemption), said as that: not "by a user, or the OOM killer"."""
    fatal = next((s for s in reversed(signalled) if s.get("signal") == died_of and s.get("by")),
                 None)
    if fatal is None:
        return None
    term = next((s for s in signalled if s.get("signal") == signal.SIGTERM), None)
    if died_of == signal.SIGTERM:
        return "preempted_term", {"by": fatal["by"]}
    if died_of != signal.SIGKILL:
        return None
    if term is None:
        return "killed_by", {"by": fatal["by"]}
    after = (fatal.get("t") or 0.0) - (term.get("t") or 0.0)
    return "preempted_kill", {"by": term.get("by") or fatal["by"], "after_s": max(0.0, after)}


# A mistake in the script itself fails the same way on every try, on every
# host: it stops the job at its first occurrence instead of after restarts.
_SYNTAX = ("SyntaxError", "IndentationError", "TabError")
_IMPORT = ("ImportError", "ModuleNotFoundError")
_UNREADABLE = ("FileNotFoundError", "PermissionError", "IsADirectoryError",
               "NotADirectoryError")
_FRAME_FILE = re.compile(r'File "([^"]+)", line \d+, in ')


def script_mistake(error: dict | None) -> str:
    """Why a task's uncaught exception is a mistake in the script itself that
    no restart can mend ("" when it is not, or may be transient).

    The task's error report lists the frames below runpy, so its first frame
    is the script's own and an empty traceback means the exception came
    before the script's first line ran. The boundary:
    - a SyntaxError (IndentationError, TabError) with no frame: raised
      compiling the script itself;
    - the script missing or unreadable on the host (FileNotFoundError... with
      no frame: runpy could not open it; ImportError with no frame: a folder
      without __main__.py);
    - an ImportError/ModuleNotFoundError raised by an `import` in the script
      file (its innermost frame is in the script): a typo or a package not
      installed on that host.
    Not an ImportError raised inside a library (its innermost frame is the
    library's): a library's own import can fail for transient reasons (a
    half-finished install, a network file system, a compiled extension or a
    CUDA library not loadable at that moment); a repeat of it is caught by
    the same-failure-twice rule instead. Nor a SyntaxError with frames
    (`eval`, `compile` or an imported module: data or files that may change).
    Not the script's but no more mendable: a restore that found no checkpoint
    of its directory readable (runtime/readable.py's NoReadableCheckpoint).
    """
    if not isinstance(error, dict):
        return ""
    kind, message = str(error.get("type", "")), str(error.get("message", ""))[:300]
    if kind == "NoReadableCheckpoint":  # runtime/readable.py: not the script's, nor mendable
        return f"{NO_READABLE_CHECKPOINT}: {str(error.get('message', ''))[:600]}"
    files = _FRAME_FILE.findall(str(error.get("traceback") or ""))
    if kind in _SYNTAX and not files:
        return f"{kind} in the script: {message}"
    if (kind in _UNREADABLE or kind in _IMPORT) and not files:  # ImportError: no __main__
        return f"the script cannot be run on this host: {kind}: {message}"
    # (Twelve frames: the report may have dropped the outer ones, the script's.)
    if kind in _IMPORT and 0 < len(files) < 12 and files[-1] == files[0]:
        return f"the script's own import failed: {kind}: {message}"
    return ""
