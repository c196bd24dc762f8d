"""A task's progress report, heard: what it means for the generation and
every detector that reads progress, then told.

The one path of every progress report a task's runtime or bootstrap sends
(`runtime.write_progress`): read once into a `ProgressReport`
(job/record/reports.py); the end of the script's code or of the program
noted for the tail cut (job/detect/tailcut.py); the cluster forming moves the
generation's phase; then, in this order, the workers' positions (lockstep),
the NaN sentinel, where a restart resumed (with the job's absolute step
added), the straggler radar, and the story. What a detector finds goes to the
supervisor's `act`. Owned by the supervisor thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..detect.findings import Finding
from ..detect.generation import Generation
from ..detect.radar import Radar
from ..detect.resumes import Resumes
from ..detect.sentinel import Sentinel
from ..detect.watch import Watch
from ..record import events as ev
from ..record.phases import Phase
from ..record.reports import ProgressReport
from ..record.states import TaskRecord


class Intake:
    """Progress reports heard, for the supervisor (its detectors are its own)."""

    def __init__(self, clock: Callable[[], float], tell: Callable[[ev.Event], None],
                 act: Callable[[Generation, Finding | None], None], watch: Watch,
                 sentinel: Sentinel, resumes: Resumes, radar: Radar) -> None:
        self._clock, self._tell, self._act = clock, tell, act
        self._watch, self._sentinel, self._resumes, self._radar = watch, sentinel, resumes, radar

    def hear(self, gen: Generation, record: TaskRecord, data: dict[str, Any]) -> None:
        record.last_activity = self._clock()
        ids = {"generation": gen.plan.generation, "task": record.task.name,
               "host": record.task.host}
        said = ProgressReport.read(data)  # what it means, read once
        if said.returned:  # its script's code ended cleanly (job/detect/tailcut.py)
            record.returned_at = record.last_activity
            return
        if said.over:  # the program ended cleanly, not told to stop
            record.over_at = record.last_activity if gen.phase.running else None
            self._tell(ev.ProgramOver(**ids))
            return
        if said.cluster is not None:
            self._forming(gen, record, said.cluster, ids)
            return
        if gen.phase in (Phase.STARTING, Phase.FORMING):
            gen.enter(Phase.TRAINING)
        self._act(gen, self._watch.position(gen, record, data))  # where it is (lockstep)
        self._act(gen, self._sentinel.hear(gen, record, said))  # gone NaN
        data = self._resumes.with_job_step(gen.plan.generation, record.task.name, data)
        if said.has_step:  # a save, a resume point or a position alone is no step report
            record.last_progress, gen.stepped = data, True
        elif said.position_only:
            return  # a position alone: nothing to show or count
        for told in self._resumes.told(gen.plan.generation, record.task.name, data):
            gen.resumed_past |= isinstance(told, ev.Resumed) and told.past is not None
            self._tell(told)  # a resume point, or a resume behind the last save
        if said.checkpoint:  # the runtime saw a checkpoint saved: training moved
            gen.advanced = True
        self._act(gen, self._radar.progress(gen, data))
        self._tell(ev.Progress(**ids, metrics=dict(data)))

    def _forming(self, gen: Generation, record: TaskRecord, cluster: Any,
                 ids: dict[str, Any]) -> None:
        """A task's cluster state (MWMS forming): the generation is FORMING."""
        record.cluster = cluster
        if gen.forming_since is None:
            gen.forming_since = self._clock()
        if gen.phase is Phase.STARTING:
            gen.enter(Phase.FORMING)
        self._tell(ev.Cluster(**ids, state=record.cluster))
