"""Each task's activity over time, by generation, and the job's restarts: the
spans the report's timeline draws (launcher/views/report.py), kept by the run's
model (launcher/job/record/story.py) as it folds the events.

A task's activity is a function of what the model knows of it
(`activity`): its state (`states.apply`, the one task state machine), whether
it joined its cluster or trained a step, whether its generation's failure is
its. Each change closes the task's open span and opens the next, in O(1).

Pure values; no clock. Must not import ops or cli.
"""

from __future__ import annotations

from dataclasses import dataclass, field

JOB_ROW = "job"  # the job's own row: the restarts between generations


@dataclass(frozen=True)
class Span:
    """One activity of one task (or of the job's row) from `start` to `end` (Unix time)."""

    generation: int  # the job's row: the generation it restarts as
    task: str  # the task's name, or JOB_ROW
    host: str
    activity: str  # starting | joining | training | serving | stopping | failed | restarting
    start: float
    end: float


def activity(state: str, *, gone: bool, failed: bool, stepped: bool, cluster: str,
             service: bool = False) -> str | None:
    """What a task is doing, as the timeline says it (None: over, no span).

    `gone`: its exit (or its loss, or its start's failure) was told; `failed`:
    its generation's failure is its, or its host was lost; `stepped`: it
    reported a step; `cluster`: joining | joined (MultiWorkerMirroredStrategy);
    `service`: a task the launcher stops (a ParameterServerStrategy worker or
    ps, a TF1 ps: they serve, never report a step), serving once it runs."""
    if gone:
        return None
    if failed:
        return "failed"
    if state == "stopping":
        return "stopping"
    if stepped or cluster == "joined":
        return "training"
    if service and state == "running":
        return "serving"
    return "joining" if cluster == "joining" else "starting"


@dataclass
class Timeline:
    """The spans so far: the closed ones, and the open one of each task."""

    done: list[Span] = field(default_factory=list)
    open: dict[tuple[int, str], Span] = field(default_factory=dict)

    def switch(self, generation: int, task: str, to: str | None, t: float,
               host: str = "") -> None:
        """`task`'s open span closes at `t` unless it is already `to`; one in `to` opens."""
        key = (generation, task)
        current = self.open.get(key)
        if current is not None:
            if current.activity == to:
                return
            del self.open[key]
            self.done.append(Span(generation, task, current.host, current.activity,
                                  current.start, t))
            host = host or current.host
        if to is not None:
            self.open[key] = Span(generation, task, host, to, t, t)

    def spans(self, end: float) -> list[Span]:
        """Every span, those still open closed at `end`."""
        return [*self.done, *(Span(s.generation, s.task, s.host, s.activity, s.start, end)
                              for s in self.open.values())]
