"""What a drill found: each fault's verdict, the checkpoint cost and interval, and the report.

Pure values and arithmetic over what `drill_faults` observed; the words of
every verdict are here, in the script's terms ("restarted from step 0:
nothing was restored — ..."). `drill.json`'s layout and the table printed
come from `report()` and `render()`.

The interval rule is Young/Daly's first-order optimum, `sqrt(2 · C · M)`,
with C the seconds one checkpoint costs and M the job's mean time between
failures: the per-host MTBF divided by the hosts (any host's failure stops
the job). The expected goodput at an interval τ (the share of wall time that
trains and is kept) is `τ / (τ + C) · (1 − (R + (τ + C) / 2) / M)`, with R the
recovery time the drill measured: each failure costs the restart and, on
average, half an interval of work trained again.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..strategy import Strategy

FAULTS = ("kill", "preempt", "hang", "host", "nan")
OPT_IN = ("nan",)  # drilled when asked only (`drill --nan`, or named in --faults)
DEFAULT_MTBF_HOURS = 1000.0  # per host; docs/drill.md says where it comes from
SAVE_HINT = "use BackupAndRestore or runtime.callbacks()"


@dataclass
class Observed:
    """One fault as the drill saw it (times are Unix seconds)."""

    fault: str
    victim: str = ""  # host/task, or the host for `host`
    generation: int = 0
    t0: float | None = None  # when the fault was injected; None: it was not
    not_injected: str = ""  # why not
    again: bool = False  # the job finished first: inject it again, in a job of its own
    step_at_fault: int | None = None  # the furthest step the job had trained to
    last_checkpoint_step: int | None = None
    detected_t: float | None = None
    recovered_t: float | None = None  # first step of the next generation
    resumed_from_step: int | None = None
    ended: str = ""  # the job ended instead of recovering: how
    behind: str = ""  # a task resumed behind the last save (a directory not shared)
    unknown: str = ""  # why the step it resumed at cannot be read: no verdict on it
    # preempt only
    grace_s: float = 0.0
    term_exit_t: float | None = None  # the victim's exit after SIGTERM
    term_saved: bool = False  # it exited 42: saved, restart me
    still_saving_s: float | None = None  # neither trained nor exited for this long
    steps_per_s: float | None = None
    # What saved the script's checkpoints (runtime/saves.py: keras3, keras2,
    # tf_keras, tensorflow; "": unknown), runtime.callbacks()' own or not, and
    # the job's strategy: how to save on SIGTERM depends on them.
    saved_with: str = ""
    saved_by_runtime: bool = False
    strategy: str = ""
    # nan only: the step whose loss the sentinel saw go bad in the fault's
    # generation, or why none was seen; the replay after the rollback.
    bad_step: int | None = None
    unseen: str = ""
    replay_bad: bool = False  # the replay's loss went bad again
    replay_past: bool = False  # the replay trained past bad_step


@dataclass
class Verdict:
    fault: str
    verdict: str  # pass | fail | cannot_tell (a fact it rests on could not be read)
    reason: str
    detected_s: float | None = None
    recovered_s: float | None = None
    resumed_from_step: int | None = None
    last_checkpoint_step: int | None = None
    lost_steps: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # victim, generation: not in the JSON

    def to_json(self) -> dict[str, Any]:
        return {"fault": self.fault, "verdict": self.verdict, "reason": self.reason,
                "detected_s": self.detected_s, "recovered_s": self.recovered_s,
                "resumed_from_step": self.resumed_from_step,
                "last_checkpoint_step": self.last_checkpoint_step,
                "lost_steps": self.lost_steps}


def _since(t: float | None, t0: float | None) -> float | None:
    return None if t is None or t0 is None else round(max(0.0, t - t0), 2)


def judge(o: Observed) -> Verdict:
    """The verdict on one observed fault, with its reason in the script's terms."""
    lost = None
    if o.unknown:  # the step counted after such a restore is no resume point
        o.resumed_from_step = None
    if o.step_at_fault is not None and o.resumed_from_step is not None:
        lost = max(0, o.step_at_fault - o.resumed_from_step)
    verdict = Verdict(o.fault, "fail", "", _since(o.detected_t, o.t0),
                      _since(o.recovered_t, o.t0), o.resumed_from_step,
                      o.last_checkpoint_step, lost,
                      extra={"victim": o.victim, "generation": o.generation})
    verdict.verdict, verdict.reason = _verdict(o, lost)
    return verdict


def _verdict(o: Observed, lost: int | None) -> tuple[str, str]:
    if o.t0 is None:
        return "fail", o.not_injected or "the fault could not be injected"
    preempt = _preempt_failure(o)
    if preempt:
        return "fail", preempt
    if o.fault == "nan" and o.unseen:
        return "cannot_tell", o.unseen
    if o.unknown and o.recovered_t is not None:
        return "cannot_tell", (f"the job resumed after the {o.fault}, but from which step "
                               f"cannot be told: {o.unknown}")
    if o.recovered_t is None or o.resumed_from_step is None:
        why = o.ended or "no step of a new generation was seen"
        return "fail", f"the job did not resume after the {o.fault}: {why}"
    resumed, checkpoint = o.resumed_from_step, o.last_checkpoint_step
    if checkpoint is None:
        return "fail", (f"no checkpoint was saved before the {o.fault} (none reported by the "
                        "script, none seen in checkpoint.dir): the job restarted from step "
                        f"{resumed} and trained {lost or 0} steps again — {SAVE_HINT}")
    if o.behind:
        return "fail", (f"{o.behind}: the script saves into a directory that is not shared "
                        "by every host — keep checkpoints in checkpoint.dir "
                        "(runtime.checkpoint_dir()) or another shared directory")
    if resumed == 0 and checkpoint > 0:
        return "fail", f"restarted from step 0: nothing was restored — {SAVE_HINT}"
    if resumed < checkpoint:
        return "fail", (f"resumed from step {resumed} but the last checkpoint was at step "
                        f"{checkpoint}: is checkpoint.dir shared by every host?")
    if o.fault == "nan" and (nan := _nan_verdict(o, resumed)):
        return nan
    said = (f"resumed from step {resumed} (last checkpoint: step {checkpoint}); "
            f"{lost or 0} step(s) trained again")
    if o.fault == "nan":
        said = (f"the loss went bad at step {o.bad_step}; rolled back to step {resumed}, the "
                f"last save before it, and the replay trained past it; {lost or 0} step(s) "
                "trained again")
    if o.fault == "preempt":
        said += "; " + _sigterm_note(o, lost)
    return "pass", said


def _nan_verdict(o: Observed, resumed: int) -> tuple[str, str] | None:
    """A NaN's rollback judged: the resume point before the bad step, and a
    replay that passes it (None: both hold)."""
    if o.bad_step is None:
        return "cannot_tell", ("the loss went bad, but at which step was not read: whether "
                               "the restart rolled back before it cannot be told")
    if resumed >= o.bad_step:
        return "fail", (f"resumed from step {resumed}, not before the bad step {o.bad_step}: "
                        "weights trained past the NaN were restored")
    if o.replay_bad:
        return "fail", (f"the replay from step {resumed} went bad again at step "
                        f"{o.bad_step}: the drill's NaN was one-off, the rollback did not "
                        "undo it")
    if not o.replay_past:
        return "cannot_tell", (f"rolled back to step {resumed}, before the bad step "
                               f"{o.bad_step}, but the job ended before its replay reached "
                               "that step: give it more steps")
    return None


def _preempt_failure(o: Observed) -> str:
    """A save on SIGTERM that outlasted the grace (a real preemption kills it then)."""
    if o.fault != "preempt" or o.t0 is None:
        return ""
    grace = f"grace_s ({o.grace_s:g} s)"
    if o.term_saved and o.term_exit_t is not None and o.term_exit_t - o.t0 > o.grace_s:
        return (f"the SIGTERM save did not finish within {grace}: it took "
                f"{o.term_exit_t - o.t0:.0f} s — raise restart.grace_s, or save less")
    if o.still_saving_s is not None:
        return (f"the SIGTERM save did not finish within {grace}: after SIGTERM the task "
                f"neither trained nor exited for {o.still_saving_s:.0f} s")
    return ""


def _sigterm_note(o: Observed, lost: int | None) -> str:
    if o.term_saved:
        return (f"the script saved on SIGTERM in {o.term_exit_t - o.t0:.1f} s "
                f"(grace_s {o.grace_s:g} s)" if o.term_exit_t and o.t0 else
                "the script saved on SIGTERM")
    spared = ""
    if lost:
        seconds = (f" (~{lost / o.steps_per_s:.1f} s)"
                   if o.steps_per_s and lost / o.steps_per_s >= 0.1 else "")
        spared = f": a save then would have spared the {lost} step(s) trained again{seconds}"
    return "the script did not save on SIGTERM" + spared + " — " + _how_to_save_on_sigterm(o)


def _how_to_save_on_sigterm(o: Observed) -> str:
    """What saves on SIGTERM for what the script saves with (runtime.callbacks'
    `save_on_sigterm` is TensorFlow's PreemptionCheckpointHandler: tf_keras
    under MultiWorkerMirroredStrategy only, docs/runtime.md)."""
    callback = "runtime.callbacks" if o.saved_by_runtime else "BackupAndRestore"
    more_often = f"save more often instead: {callback}(save_freq=STEPS)"
    if o.saved_with == "keras3":
        return ("Keras 3 has no save on SIGTERM (runtime.callbacks' "
                f"save_on_sigterm is tf_keras's): {more_often}")
    if o.saved_with == "tf_keras" and o.strategy not in ("", Strategy.MULTI_WORKER_MIRRORED):
        return (f"tf_keras saves on SIGTERM under MultiWorkerMirroredStrategy only, not "
                f"{o.strategy}: {more_often}")
    if o.saved_with == "tf_keras":
        return ("turn it on with runtime.callbacks(save_on_sigterm=True)" if o.saved_by_runtime
                else "tf_keras saves on SIGTERM with runtime.callbacks(save_on_sigterm=True) "
                "in place of its own BackupAndRestore") + \
            ", or save in a SIGTERM handler and exit 42"
    if o.saved_with == "tensorflow":
        return "save in a SIGTERM handler (its CheckpointManager's save) and exit 42"
    return ("under tf_keras and MultiWorkerMirroredStrategy runtime.callbacks("
            "save_on_sigterm=True) does it; or save in a SIGTERM handler and exit 42")


# ------------------------------------------------------------- checkpoint cost


Point = tuple[float, int, bool]  # (t, step, a checkpoint was saved by then)


def cost_and_rate(series: list[list[Point]]) -> tuple[float | None, float | None,
                                                        float | None]:
    """(seconds per checkpoint save, steps/s between saves, seconds between saves)
    from each generation's progress reports (one task's, in order).

    The steps/s come from consecutive reports with no save between (else from
    all of them); a report
    that says a checkpoint was saved took that save's time on top of its
    steps: what it took beyond its steps at that rate is the save's cost.
    A generation's first report (start-up, tracing) is left out, unless no
    generation has two reports besides it (each fault right after the first
    save of a short generation): then it is counted, a little low."""
    spans = _spans(series, skip=1)
    if not spans.all_time:
        spans = _spans(series, skip=0)
    # No two reports without a save between (a save every report or so): the
    # rate with the saves in it, a little low.
    rate = spans.pure_steps / spans.pure_time if spans.pure_time > 0 else (
        spans.all_steps / spans.all_time if spans.all_time > 0 else None)
    cost = None
    if spans.saves and rate:
        cost = max(0.0, statistics.median(dt - ds / rate for dt, ds in spans.saves))
    interval = statistics.median(spans.gaps) if spans.gaps else None
    return (_round(cost, 3), _round(rate, 2), _round(interval, 2))


class _Spans(NamedTuple):
    """Steps and seconds between consecutive reports: with no save between
    (`pure_`), in all (`all_`); the saves' (seconds, steps) spans; the
    seconds between saves."""

    pure_steps: float
    pure_time: float
    all_steps: float
    all_time: float
    saves: list[tuple[float, int]]
    gaps: list[float]


def _spans(series: list[list[Point]], skip: int) -> _Spans:
    """The spans of each generation's reports, its first `skip` left out."""
    pure_steps = pure_time = all_steps = all_time = 0.0
    saves: list[tuple[float, int]] = []
    gaps: list[float] = []
    for points in map(_one_per_step, series):
        last_save: float | None = None
        for (ta, sa, _), (tb, sb, saved) in zip(points[skip:], points[skip + 1:], strict=False):
            if sb <= sa or tb <= ta:
                continue
            all_steps, all_time = all_steps + sb - sa, all_time + tb - ta
            if saved:
                saves.append((tb - ta, sb - sa))
                if last_save is not None:
                    gaps.append(tb - last_save)
                last_save = tb
            else:
                pure_steps += sb - sa
                pure_time += tb - ta
    return _Spans(pure_steps, pure_time, all_steps, all_time, saves, gaps)


def _one_per_step(points: list[Point]) -> list[Point]:
    """Reports of the same step as one, the last (Keras reports a step, then
    the same step again at its epoch's end, after the save)."""
    out: list[Point] = []
    for t, step, saved in points:
        if out and out[-1][1] == step:
            saved = saved or out[-1][2]
            out.pop()
        out.append((t, step, saved))
    return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def young_daly(cost_s: float, mtbf_job_s: float) -> float:
    """The checkpoint interval that loses least: sqrt(2 · cost · MTBF)."""
    return math.sqrt(2.0 * cost_s * mtbf_job_s)


def goodput(interval_s: float, cost_s: float, mtbf_job_s: float, recovery_s: float) -> float:
    """The expected share of wall time that trains and is kept (module docstring)."""
    useful = interval_s / (interval_s + cost_s)
    lost = (recovery_s + (interval_s + cost_s) / 2.0) / mtbf_job_s
    return round(max(0.0, min(1.0, useful * (1.0 - lost))), 4)


# -------------------------------------------------------------------- report


def report(verdicts: list[Verdict], series: list[list[Point]], hosts: int,
           mtbf_hours: float, timed: list[float] | None = None,
           save_steps: list[int] | None = None,
           copies: dict[str, float] | None = None) -> dict[str, Any]:
    """drill.json: the issue's fields first, then how the interval was reached.

    `timed`: each save's seconds as the bootstrap timed them (preferred to the
    cost inferred from the reports); `save_steps`: the steps of the saves, in
    order, for the interval when no generation saved twice; `copies`: the
    memory tier's background copies to the directory (commands/drill_memory.py),
    None when the tier was off."""
    cost, rate, current = cost_and_rate(series)
    if timed:
        cost = round(statistics.median(timed), 3)
    steps = save_steps or []
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False) if b > a]
    if current is None and gaps and rate:
        current = round(statistics.median(gaps) / rate, 2)
    mtbf_job_s = mtbf_hours * 3600.0 / max(1, hosts)
    recoveries = [v.recovered_s for v in verdicts if v.recovered_s is not None]
    recovery = statistics.mean(recoveries) if recoveries else 0.0
    recommended = None
    if cost is not None:
        recommended = round(young_daly(max(cost, 0.001), mtbf_job_s), 1)
    out: dict[str, Any] = {
        "faults": [v.to_json() for v in verdicts],
        "checkpoint_cost_s": cost, "steps_per_s": rate,
        "current_interval_s": current, "recommended_interval_s": recommended,
        "passed": all(v.verdict == "pass" for v in verdicts),
        "hosts": hosts, "mtbf_hours_per_host": mtbf_hours,
        "mtbf_job_hours": round(mtbf_job_s / 3600.0, 2),
        "recovery_s": round(recovery, 2),
        "goodput_at_current": None, "goodput_at_recommended": None,
    }
    if cost is not None and recommended is not None:
        out["goodput_at_recommended"] = goodput(recommended, cost, mtbf_job_s, recovery)
        if current is not None:
            out["goodput_at_current"] = goodput(current, cost, mtbf_job_s, recovery)
    out["memory"] = memory_advice(copies, cost, rate, mtbf_job_s, recovery)
    return out


def memory_advice(copies: dict[str, float] | None, stall_s: float | None,
                  rate: float | None, mtbf_job_s: float,
                  recovery_s: float) -> dict[str, Any] | None:
    """The memory tier's cost and the `memory_interval` it advises: a save's
    stall to memory (the saves timed with the tier on) against the same save
    written to the directory (the agent's copy); Young/Daly with the memory
    stall as the cost, in steps at the measured rate. Beside it, the goodput
    the directory alone would give at its own best interval, a save there
    costing the stall plus the copy (the same serialization, then the bytes
    written to the directory instead of memory). None: the tier was off (no
    copy seen)."""
    if copies is None:
        return None
    direct = copies["directory_s"]
    out: dict[str, Any] = {
        "save_stall_s": stall_s, "directory_s": direct, "copy_mb": copies.get("copy_mb"),
        "recommended_interval_s": None, "recommended_memory_interval_steps": None,
        "goodput_at_recommended": None, "directory_stall_s": None, "directory_interval_s": None,
        "goodput_saving_to_directory": None}
    if stall_s is None:
        return out
    tau = young_daly(max(stall_s, 0.001), mtbf_job_s)
    out["recommended_interval_s"] = round(tau, 1)
    if rate:
        out["recommended_memory_interval_steps"] = max(1, round(tau * rate))
    out["goodput_at_recommended"] = goodput(tau, stall_s, mtbf_job_s, recovery_s)
    to_directory = stall_s + direct
    out["directory_stall_s"] = round(to_directory, 3)
    own = young_daly(max(to_directory, 0.001), mtbf_job_s)
    out["directory_interval_s"] = round(own, 1)
    out["goodput_saving_to_directory"] = goodput(own, to_directory, mtbf_job_s, recovery_s)
    return out


def _num(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def render(data: dict[str, Any]) -> str:
    """The readable table of a drill.json, then the checkpoint interval advice."""
    head = ("fault", "verdict", "detected", "recovered", "resumed", "checkpoint", "lost")
    rows = [head] + [
        (f["fault"], f["verdict"].replace("_", " ").upper(), _num(f["detected_s"], " s"),
         _num(f["recovered_s"], " s"), _num(f["resumed_from_step"]),
         _num(f["last_checkpoint_step"]), _num(f["lost_steps"]))
        for f in data["faults"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [f"  {f['fault']}: {f['reason']}" for f in data["faults"]]
    lines.append(_advice(data))
    lines.append(_memory_advice(data.get("memory")))
    return "\n".join(lines)


def _memory_advice(memory: dict[str, Any] | None) -> str:
    if memory is None:
        return ("memory tier: off (drill --memory measures a save to host memory against "
                "the directory and advises checkpoint.memory_interval)")
    stall, direct = memory["save_stall_s"], memory["directory_s"]
    size = f"{memory['copy_mb']:g} MB, " if memory.get("copy_mb") is not None else ""
    said = (f"memory tier: a save blocks training {_num(stall, ' s')} in memory; the agent "
            f"wrote it to the directory in {direct:g} s ({size}in the background)")
    steps, tau = memory["recommended_memory_interval_steps"], memory["recommended_interval_s"]
    if tau is None:
        return said + "; no interval advice (no save was timed)"
    every = f"{steps} steps ({tau:g} s" if steps else f"{tau:g} s of training (no step rate"
    said += (f"\nrecommended memory_interval: {every}; Young/Daly with the stall to memory); "
             f"expected goodput {memory['goodput_at_recommended']:.2%}")
    if memory["goodput_saving_to_directory"] is not None:
        said += (f", {memory['goodput_saving_to_directory']:.2%} saving to the directory "
                 f"every {memory['directory_interval_s']:g} s (its own best)")
    if direct < 0.1 * (stall or 0.0):
        said += "; the directory is fast here: the memory tier spares little"
    if tau < direct:
        said += ("; shorter than a copy: the directory gets one copy after another (the "
                 "newest only)")
    return said


def _advice(data: dict[str, Any]) -> str:
    cost, current = data["checkpoint_cost_s"], data["current_interval_s"]
    recommended = data["recommended_interval_s"]
    said = (f"checkpoint: {_num(cost, ' s')} per save, every {_num(current, ' s')}; "
            f"{_num(data['steps_per_s'])} steps/s")
    if recommended is None:
        return said + "; no interval advice (no save was timed)"
    said += (f"\nrecommended interval: {recommended:g} s (Young/Daly, sqrt(2 x cost x MTBF); "
             f"MTBF {data['mtbf_hours_per_host']:g} h per host / {data['hosts']} hosts = "
             f"{data['mtbf_job_hours']:g} h)")
    if data["goodput_at_recommended"] is not None:
        now = data["goodput_at_current"]
        said += (f"; expected goodput {data['goodput_at_recommended']:.2%} at it"
                 + (f", {now:.2%} at the current {current:g} s" if now is not None else ""))
    return said
