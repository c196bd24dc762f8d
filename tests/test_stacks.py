"""Hang forensics on the host side: a real agent, real tasks, real signals.

The bootstrap registers faulthandler on MGPU_STACKS_SIGNAL; the agent's
`stacks` op signals the task's main process and sends back what it wrote.
A signal whose default action would kill the task is never sent unhandled.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from launcher.bootstrap import stacks_signal
from tests.agentproc import AgentProc
from tests.conftest import alive, wait_for

HUNG = """\
import threading

def wait_forever():
    print("ready", flush=True)
    threading.Event().wait()

wait_forever()
"""


@pytest.fixture
def agent(tmp_path):
    agent = AgentProc(tmp_path / "run")
    agent.hello()
    yield agent
    agent.close()


def start_hung(agent: AgentProc, tmp_path: Path, name: str = "worker0",
               env: dict[str, str] | None = None) -> int:
    script = tmp_path / "hung_script.py"
    script.write_text(HUNG)
    pid = agent.start_task(name, [sys.executable, "-m", "launcher.bootstrap", str(script)], env)
    wait_for(lambda: "ready" in agent.output(name), timeout=30, what="the task to be ready")
    return pid


def test_stacks_of_a_hung_task_name_its_function_and_file(agent, tmp_path):
    pid = start_hung(agent, tmp_path)
    agent.send({"op": "stacks", "tasks": None})
    reply = agent.wait_event("stacks", task="worker0")
    assert reply["error"] is None, reply
    assert reply["generation"] == 0
    assert "wait_forever" in reply["text"] and "hung_script.py" in reply["text"], reply["text"]
    # The file the bootstrap writes: the agent's run dir, private to the user.
    path = tmp_path / "run" / "stacks" / "worker0-gen0.txt"
    assert path.stat().st_mode & 0o777 == 0o600
    assert alive([pid]) == [pid]  # asking for stacks does not hurt the task
    # A second request gets a fresh dump, not the first one twice.
    agent.send({"op": "stacks", "tasks": ["worker0"]})
    wait_for(lambda: len(agent.events("stacks", task="worker0")) == 2, timeout=10,
             what="a second stacks reply")
    second = agent.events("stacks", task="worker0")[1]["text"]
    assert second.count("wait_forever") == reply["text"].count("wait_forever")


def test_another_signal_can_be_chosen(agent, tmp_path):
    start_hung(agent, tmp_path, env={"MGPU_STACKS_SIGNAL": "usr2"})
    agent.send({"op": "stacks", "tasks": ["worker0"]})
    reply = agent.wait_event("stacks", task="worker0")
    assert reply["error"] is None and "wait_forever" in reply["text"], reply


def test_a_stopped_task_gets_an_error_not_a_hang(agent, tmp_path):
    pid = start_hung(agent, tmp_path)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED,
             timeout=10, what="the task stopped")
    agent.send({"op": "stacks", "tasks": ["worker0"]})
    reply = agent.wait_event("stacks", task="worker0")
    assert "stopped" in reply["error"] and reply["text"] == "", reply
    os.kill(pid, signal.SIGCONT)


def test_a_task_without_the_handler_is_not_killed_by_the_signal(agent, tmp_path):
    # Not started through the bootstrap: SIGUSR1's default action would kill it.
    pid = agent.start_task("plain", [sys.executable, "-c",
                                     "print('ready', flush=True); import time; time.sleep(300)"])
    wait_for(lambda: "ready" in agent.output("plain"), timeout=30, what="the task to be ready")
    agent.send({"op": "stacks", "tasks": ["plain", "nobody"]})
    reply = agent.wait_event("stacks", task="plain")
    assert "SIGUSR1 is not handled" in reply["error"], reply
    assert "no such task" in agent.wait_event("stacks", task="nobody")["error"]
    assert alive([pid]) == [pid]


def test_stacks_off(agent, tmp_path):
    start_hung(agent, tmp_path, env={"MGPU_STACKS_SIGNAL": "off"})
    agent.send({"op": "stacks", "tasks": ["worker0"]})
    assert "off" in agent.wait_event("stacks", task="worker0")["error"]


def test_a_bad_signal_is_refused_and_said_by_the_task(agent, tmp_path):
    pid = start_hung(agent, tmp_path, env={"MGPU_STACKS_SIGNAL": "SIGTERM"})
    assert any("SIGTERM cannot be used" in line for line in agent.output("worker0"))
    agent.send({"op": "stacks", "tasks": ["worker0"]})
    assert "SIGTERM cannot be used" in agent.wait_event("stacks", task="worker0")["error"]
    assert alive([pid]) == [pid]


@pytest.mark.parametrize("value, expected", [
    (None, signal.SIGUSR1), ("", signal.SIGUSR1), ("SIGUSR2", signal.SIGUSR2),
    ("usr2", signal.SIGUSR2), (str(int(signal.SIGUSR2)), signal.SIGUSR2),
    (str(signal.SIGRTMIN + 2), signal.SIGRTMIN + 2), ("off", None), ("OFF", None),
])
def test_stacks_signal_values(value, expected):
    assert stacks_signal(value) == expected


@pytest.mark.parametrize("value", ["SIGKILL", "9", "term", "SIGNOPE", "999", "-1", "1.5"])
def test_stacks_signal_refuses(value):
    with pytest.raises(ValueError):
        stacks_signal(value)


def test_a_script_may_take_the_signal_for_itself(agent, tmp_path):
    script = tmp_path / "own_handler.py"
    script.write_text(
        "import signal, threading\n"
        "signal.signal(signal.SIGUSR1, lambda *_: print('mine', flush=True))\n"
        "print('ready', flush=True)\n"
        "threading.Event().wait()\n")
    pid = agent.start_task("w", [sys.executable, "-m", "launcher.bootstrap", str(script)])
    wait_for(lambda: "ready" in agent.output("w"), timeout=30, what="the task to be ready")
    agent.send({"op": "stacks", "tasks": ["w"]})
    reply = agent.wait_event("stacks", task="w")
    assert "no stacks written" in reply["error"] and "its own handler" in reply["error"], reply
    wait_for(lambda: "mine" in agent.output("w"), timeout=10, what="the script's own handler")
    assert alive([pid]) == [pid]
