"""The story of a run as it is told: each event written to the run directory
(progress at a bounded rate: job/run/samples.py) and told to the `Voice` and every
other listener; `happen` also moves the tasks the event concerns
(`states.apply`), and tells the job's phase when that moved it.

The supervisor, its detectors, the teardown and the host waiter all tell
through one `Teller`; it decides nothing. Called from the supervisor thread only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...spec.rundir import RunRecorder
from ..detect.generation import Generation
from ..record import events as ev
from ..record.states import apply
from .samples import ProgressSampler


class Teller:
    def __init__(self, recorder: RunRecorder, voice: ev.Listener,
                 listeners: Sequence[ev.Listener] = ()) -> None:
        self._recorder = recorder
        self._voice = voice
        self._listeners = list(listeners)  # other views of the story (metrics, ...)
        self._samples = ProgressSampler()

    def add(self, listener: ev.Listener) -> None:
        """One more view told every event from now on."""
        self._listeners.append(listener)

    def tell(self, event: ev.Event) -> None:
        """Write `event` to the run directory and tell it to every view."""
        for line, at in self._samples.lines(event):  # progress lines at a bounded rate
            ev.write(self._recorder, line, at)
        self._voice.tell(event)
        for listener in self._listeners:
            listener.tell(event)

    def happen(self, gen: Generation, event: ev.Event) -> None:
        """Tell `event`, and move the tasks it concerns (`states.apply`)."""
        self.tell(event)
        if isinstance(event, ev.TaskEvent):
            record = gen.records.get(event.task)
            targets = [record] if record is not None else []
        else:
            targets = list(gen.records.values())
        for record in targets:
            record.move(apply(record.state, event, host=record.task.host,
                              lifetime=record.task.lifetime))
        gen.tell_phase()  # every task running now: the job's phase moves

    def write_due(self) -> None:
        """Progress lines held back by the rate, now due."""
        for line, at in self._samples.due():
            ev.write(self._recorder, line, at)
