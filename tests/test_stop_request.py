"""The stop a launch is handed (launcher/job/run/sequence.py): kept until its job
exists, then handed on once each, in order; an interrupt while hosts are reached."""

from __future__ import annotations

import signal

import pytest

from launcher.job.run.sequence import StopRequest


class _Job:
    def __init__(self) -> None:
        self.told: list[int] = []

    def request_stop(self, signum: int) -> None:
        self.told.append(signum)


def test_a_stop_before_the_job_is_kept_then_handed_on_once():
    stop = StopRequest()
    assert stop.first is None
    stop.ask(signal.SIGTERM)
    job = _Job()
    stop.attach(job)  # type: ignore[arg-type]
    stop.ask(signal.SIGINT)
    stop.attach(job)  # type: ignore[arg-type]  # attached again: nothing told twice
    assert job.told == [signal.SIGTERM, signal.SIGINT]
    assert stop.first == signal.SIGTERM
    stop.attach(None)
    stop.ask(signal.SIGINT)  # the job is over: kept, told to nobody
    assert job.told == [signal.SIGTERM, signal.SIGINT] and len(stop.signals) == 3


def test_while_hosts_are_reached_a_stop_interrupts_with_its_signal():
    stop = StopRequest()
    stop.interrupts(True)
    with pytest.raises(KeyboardInterrupt) as raised:
        stop.ask(signal.SIGTERM)
    assert raised.value.args == (signal.SIGTERM,)
    stop.interrupts(False)
    stop.ask(signal.SIGINT)  # no longer interrupts
    assert stop.signals == [signal.SIGTERM, signal.SIGINT]
