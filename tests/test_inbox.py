"""The supervisor's inbox (launcher.transport.inbox): output bounded and
counted, control never dropped and first in a flood, order kept otherwise."""

from __future__ import annotations

import queue

import pytest

from launcher.transport import AgentMessage
from launcher.transport.inbox import PRIORITY_AFTER, Inbox


def output(task: str, text: str) -> AgentMessage:
    return AgentMessage("h", {"ev": "output", "task": task, "text": text})


def exited(task: str) -> AgentMessage:
    return AgentMessage("h", {"ev": "exited", "task": task, "code": 0})


def drain(inbox: Inbox) -> list[str]:
    events = []
    while True:
        try:
            message = inbox.get(timeout=0)
        except queue.Empty:
            return events
        events.append(message.message.get("text") or message.message["ev"])


def test_order_is_kept_without_a_backlog():
    inbox = Inbox()
    for item in (output("w0", "a"), exited("w0"), output("w0", "b")):
        inbox.put(item)
    assert drain(inbox) == ["a", "exited", "b"]


def test_in_a_flood_control_goes_first_and_output_is_bounded_and_counted():
    inbox = Inbox(output_lines=PRIORITY_AFTER + 10)
    for n in range(PRIORITY_AFTER + 20):
        inbox.put(output("w0", f"line {n}"))
    inbox.put(exited("w0"))
    inbox.put(output("w0", "x" * 9000 + " … [mgpu-launch: line cut, 5 more bytes]"))
    got = drain(inbox)
    assert got[0] == "exited"
    assert len(got) == 1 + PRIORITY_AFTER + 10
    assert inbox.dropped == {"h/w0": 11} and inbox.cut == {"h/w0": 1}
    report = inbox.drop_report()
    assert report.startswith("task output lines dropped: 11 (h/w0: 11); ")
    assert report.endswith("; lines cut at 8 KiB: 1 (h/w0: 1)")


def test_get_waits_with_a_bound():
    with pytest.raises(queue.Empty):
        Inbox().get(timeout=0.01)
