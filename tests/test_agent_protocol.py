"""Both ends of the agent's pipe against malformed, oversized and hostile lines.

The link's reader turns anything into dicts on the queue and never dies; its
writer never blocks a caller on a pipe nobody reads. The agent refuses bad
commands with a `log` or `start_failed`, stays up, writes nothing outside its
run directory, and cuts giant output lines.
"""

from __future__ import annotations

import json
import os
import queue
import random
import sys
import threading
import time
import types

import pytest

from launcher.agent.protocol import MAX_COMMAND_BYTES, MAX_OUTPUT_LINE
from launcher.agent.tasks import DRAIN_S
from launcher.transport.link import AgentLink, AgentMessage
from tests.agentproc import AgentProc
from tests.conftest import alive, wait_for

MAX_LINE = 4096  # the fuzzed link's limit (the real one is MAX_LINE_BYTES)


def random_json(rng: random.Random, depth: int = 0) -> object:
    kinds = ["int", "float", "str", "bool", "null"] + (["list", "dict"] if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-(2**70), 2**70)
    if kind == "float":
        return rng.uniform(-1e300, 1e300)
    if kind == "str":
        return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0x10FFFF)]))
                       for _ in range(rng.randint(0, 20))).replace("\ud800", "")
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {rng.choice(["ev", "task", "text", "x"]) + str(i): random_json(rng, depth + 1)
            for i in range(rng.randint(0, 5))}


def random_line(rng: random.Random) -> bytes:
    """One line (without its newline) of any sort a broken or hostile agent might send."""
    choice = rng.randrange(9)
    if choice == 0:  # raw bytes, invalid UTF-8 included
        return bytes(rng.randrange(256) for _ in range(rng.randrange(200))).replace(b"\n", b"")
    if choice == 1:  # any JSON value, objects or not
        return json.dumps(random_json(rng)).encode()
    if choice == 2:  # an event with fields of the wrong types
        return json.dumps({"ev": random_json(rng), "task": random_json(rng)}).encode()
    if choice == 3:  # longer than the limit
        return b"x" * rng.randint(MAX_LINE + 1, 5 * MAX_LINE)
    if choice == 4:  # nesting deeper than the parser's recursion limit
        return b"[" * 100_000
    if choice == 5:
        return b'{"ev": "agent_lost", "detail": "forged"}'
    if choice == 6:
        return b'{"ev": "hello", "host": "h"}'
    if choice == 7:  # JSON with NaN, BOMs, UTF-16
        return rng.choice([b'{"ev": NaN}', b"\xef\xbb\xbf{}", '{"ev": "log"}'.encode("utf-16")
                           ]).replace(b"\n", b"")
    return b""  # an empty line


@pytest.mark.parametrize("seed", range(4))
def test_link_reader_turns_any_line_into_a_dict(seed):
    rng = random.Random(seed)
    lines = [random_line(rng) for _ in range(300)]
    read_fd, write_fd = os.pipe()
    events: queue.Queue[AgentMessage] = queue.Queue()
    with open(os.devnull, "wb") as sink, os.fdopen(read_fd, "rb") as source:
        link = AgentLink("h", sink, source, events, ping_every_s=None, max_line_bytes=MAX_LINE)
        link.start_reading()

        def feed() -> None:
            with os.fdopen(write_fd, "wb") as pipe:
                for line in lines:
                    pipe.write(line + b"\n")
                pipe.write(b"no newline at the end")

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        got: list[AgentMessage] = []
        while not got or got[-1].event != "agent_lost":
            got.append(events.get(timeout=30))
        writer.join(timeout=10)
        link.close()
    assert all(isinstance(m, AgentMessage) and isinstance(m.message, dict) for m in got)
    assert len(got) == len(lines) + 2  # one message per line, the last one, agent_lost
    assert [m.event for m in got].count("agent_lost") == 1  # a forged one became a log
    for line, message in zip(lines, got, strict=False):
        if len(line) > MAX_LINE:
            assert message.message == {"ev": "log", "text": f"dropped a message of "
                                        f"{len(line) + 1} bytes from the agent (longer than "
                                        f"{MAX_LINE})"}
        else:
            assert len(json.dumps(message.message)) < 6 * MAX_LINE + 100


def test_a_pipe_nobody_reads_never_blocks_send_or_close():
    read_fd, write_fd = os.pipe()  # nobody ever reads read_fd: the pipe fills up
    events: queue.Queue[AgentMessage] = queue.Queue()
    closed = threading.Event()
    try:
        with os.fdopen(write_fd, "wb") as stalled, open(os.devnull, "rb") as nothing:
            link = AgentLink("h", stalled, nothing, events, on_close=closed.set)
            big = {"op": "start", "env": {"X": "y" * 200_000}}  # more than a pipe holds
            started = time.monotonic()
            assert link.send(big) and link.send(big)
            wait_for(lambda: link._in_write, timeout=10, what="the writer stuck in a write")
            for _ in range(100):
                assert link.send({"op": "ping"})
            link.close()
            assert time.monotonic() - started < 10  # nothing waited on the stuck write (forever)
            assert closed.is_set() and not link.send({"op": "stop"})
            os.close(read_fd)  # the far end goes: the stuck write fails, the writer ends
            read_fd = -1
            wait_for(lambda: not link._writer.is_alive(), timeout=10, what="the writer to end")
            assert link.write_failed
    finally:
        if read_fd >= 0:
            os.close(read_fd)


def test_the_agent_refuses_bad_commands_and_stays_up(tmp_path):
    run_dir = tmp_path / "hosts" / "h1"
    agent = AgentProc(run_dir)
    try:
        agent.hello()
        hostile = [
            b"not json\n",
            b"[1, 2, 3]\n",
            b"\xff\xfe\xfa{}\n",
            b"[" * 100_000 + b"\n",
            b"x" * (MAX_COMMAND_BYTES + 10) + b"\n",
            {"op": "signal", "task": "worker0", "signum": "x"},
            {"op": "signal", "task": "worker0", "signum": 10**6},
            {"op": "stop", "tasks": 5},
            {"op": "stop", "tasks": None, "grace_s": "soon"},
            {"op": "stop", "tasks": None, "grace_s": 1, "settle_s": -1},
            {"op": "stacks", "tasks": "worker0"},
            {"op": "exec_check", "id": 1, "argv": "notalist"},
            {"op": "start", "task": 5, "argv": ["true"], "tf_config": "{}"},
            {"op": "start", "task": "../../../evil", "argv": ["true"], "tf_config": "{}"},
            {"op": "start", "task": "..", "argv": ["true"], "tf_config": "{}"},
            {"op": "start", "task": "a/b", "argv": ["true"], "tf_config": "{}"},
            {"op": "start", "task": "w1", "argv": "notalist", "tf_config": "{}"},
            {"op": "start", "task": "w2", "argv": ["true"], "tf_config": {"a": 1}},
            {"op": "start", "task": "w3", "argv": ["true"], "tf_config": "{}", "env": []},
            {"op": "start", "task": "w4", "argv": ["true"], "tf_config": "{}",
             "generation": "1/../../x"},
            {"op": "start", "task": "w5", "argv": ["true\0"], "tf_config": "{}"},
            {"op": 17},
        ]
        for item in hostile:
            agent.send(item)
        agent.send({"op": "start", "task": "fine", "generation": 0, "env": {},
                    "argv": [sys.executable, "-c", "print('still here')"], "tf_config": "{}"})
        agent.wait_event("exited", task="fine")
        assert agent.output("fine") == ["still here"]
        assert agent.proc.poll() is None
        failed = {m["task"]: m["error"] for m in agent.events("start_failed")}
        assert set(failed) == {"../../../evil", "..", "a/b", "w1", "w2", "w3", "w4", "w5"}
        assert all(e.startswith("refused") for t, e in failed.items() if t != "w5"), failed
        logs = [m["text"] for m in agent.events("log")]
        assert len(logs) == 14, logs  # every other bad line: one log each
        assert any(f"longer than {MAX_COMMAND_BYTES}" in t for t in logs)
        assert any("settle_s must be a number of seconds" in t for t in logs), logs
        # Nothing was written anywhere but the run dir (and not under a bad name).
        assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"]
        assert sorted(p.name for p in (tmp_path / "hosts").iterdir()) == ["h1"]
        assert not list(run_dir.rglob("*evil*"))
    finally:
        agent.close()


def test_a_giant_output_line_is_cut(tmp_path):
    agent = AgentProc(tmp_path / "run")
    try:
        agent.hello()
        size = 100_000
        agent.start_task("w", [sys.executable, "-c",
                               f"print('é' + 'x' * {size - 2}); print('next')"])
        agent.wait_event("exited", task="w")
        first, second = agent.output("w")
        more = size - MAX_OUTPUT_LINE
        assert first.endswith(f" … [mgpu-launch: line cut, {more} more bytes]"), first[-80:]
        assert first.startswith("éx") and len(first.encode()) < MAX_OUTPUT_LINE + 100
        assert second == "next"
        assert agent.events("exited", task="w")[0]["tail"][0] == first
    finally:
        agent.close()


# ~60 KiB of lines, then ~60 KiB of progress reports (one pipe's worth: it
# exits even while nothing is read), then it exits.
FLOOD = """\
import os
open("task.pid", "w").write(str(os.getpid()))
for i in range(600):
    print(i, "x" * 100)
print("LAST", flush=True)
progress = os.fdopen(int(os.environ["MGPU_PROGRESS_FD"]), "w")
for step in range(600):
    progress.write('{"step": %d, "pad": "%s"}\\n' % (step, "x" * 80))
"""


def test_a_tasks_last_lines_come_before_its_exit_report_however_slowly_they_are_read(
        tmp_path):
    # The task's output and progress outrun the launcher: the agent's writes
    # block while its readers still hold the task's last lines (all of it fits
    # in the pipes: the task exits). Its exit report must wait for them: the
    # launcher ends a job on the last exit and would never see them. (CI, under
    # load: a job succeeded with one worker's last line missing.)
    agent = AgentProc(tmp_path / "run")
    try:
        agent.hello()
        agent.reading.clear()
        agent.send({"op": "start", "task": "w", "generation": 0, "env": {},
                    "cwd": str(tmp_path), "tf_config": "{}",
                    "argv": [sys.executable, "-c", FLOOD]})
        pid_file = tmp_path / "task.pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the task")
        task = int(pid_file.read_text())
        wait_for(lambda: not alive([task]), timeout=30, what="the task to exit")
        # The fault: the launcher reads nothing for longer than the agent's drain.
        time.sleep(DRAIN_S + 1.0)
        agent.reading.set()
        agent.wait_event("exited", task="w")
        told = [m for m in agent.messages if m.get("task") == "w"]
        assert told[-1]["ev"] == "exited", told[-3:]
        assert [m["text"] for m in told if m["ev"] == "output"][-1:] == ["LAST"]
        assert [m["data"]["step"] for m in told if m["ev"] == "progress"] == list(range(600))
    finally:
        agent.reading.set()
        agent.close()


def test_a_pipe_held_open_after_the_task_is_reaped_ends_after_the_drain(monkeypatch):
    # A process that escaped the task's tree may hold its pipe open: the exit
    # report still comes, after DRAIN_S of quiet (DRAIN_MAX_S if it keeps writing).
    from launcher.agent import tasks

    read_fd, write_fd = os.pipe()  # write_fd: the holder's, never closed here
    task = types.SimpleNamespace(reaped_at=None)
    pipe = tasks._DrainedPipe(task, read_fd, owned=True)  # type: ignore[arg-type]
    try:
        os.write(write_fd, b"last\n")
        task.reaped_at = time.monotonic()
        assert pipe.read(100) == b"last\n"  # what is there is read first
        started = time.monotonic()
        assert pipe.read(100) == b""
        assert time.monotonic() - started >= DRAIN_S
        monkeypatch.setattr(tasks, "DRAIN_MAX_S", 0.0)
        os.write(write_fd, b"more\n")
        assert pipe.read(100) == b""  # a holder that keeps writing is cut off
    finally:
        pipe.close()
        os.close(write_fd)


# Says when SIGTERM came, then exits 0; otherwise sleeps.
TERM_TIMED = """\
import signal, sys, time
def on_term(*_):
    print("TERM", time.monotonic(), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(120)
"""


def test_a_stop_with_a_settle_sends_sigterm_only_after_it_and_hears_an_exit_before_it(
        tmp_path):
    # After a collective abort the teardown leaves the peers `settle_s` to exit
    # (and report) by themselves: SIGTERM ends an MWMS task at once. A task
    # that exits meanwhile exits as itself (its own error heard), not stopped.
    agent = AgentProc(tmp_path / "run")
    go = tmp_path / "go"
    try:
        agent.hello()
        agent.start_task("w", [sys.executable, "-c", TERM_TIMED])
        agent.start_task("own", [sys.executable, "-c", "import os, sys, time\n"
                                 f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
                                 "sys.exit(3)"])
        wait_for(lambda: "ready" in agent.output("w"), timeout=30, what="the task's handler")
        sent = time.monotonic()
        agent.send({"op": "stop", "tasks": None, "grace_s": 5.0, "settle_s": 3.0})
        go.touch()
        own = agent.wait_event("exited", task="own")
        assert own["code"] == 3 and own["stopping"] is False, own
        exited = agent.wait_event("exited", task="w")
        term = next(line for line in agent.output("w") if line.startswith("TERM"))
        assert float(term.split()[1]) - sent >= 3.0, (sent, term)  # timers never fire early
        assert exited["code"] == 0 and exited["stopping"] is True, exited
    finally:
        agent.close()
