"""A job outlives its terminal: output never steers control.

Unit tests drive `Printer` with injected streams (one that stalls, one that is
closed). End-to-end tests run the real CLI: `| head -3`, SIGHUP mid-run, and a
stdout pipe nobody reads while a worker is killed.
"""

from __future__ import annotations

import fcntl
import io
import os
import signal
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

from launcher.outlets.printer import Printer
from tests.conftest import (
    EXAMPLES,
    PYTHON,
    SCRIPTS,
    cli_env,
    read_events,
    read_summary,
    wait_for,
)

LABELS = ["host0/worker0", "host1/worker1"]

# --------------------------------------------------------------- unit tests


class StalledStream(io.StringIO):
    """A terminal that takes nothing until `release` is set (Ctrl-S, `| less`)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()  # a write is under way (and stuck)

    def write(self, text: str) -> int:
        self.entered.set()
        self.release.wait(30)
        return super().write(text)


class ClosedStream(io.StringIO):
    """A pipe whose reader went away (`| head`) after `accept` writes."""

    def __init__(self, accept: int = 0, error: Exception | None = None) -> None:
        super().__init__()
        self.accept = accept
        self.error = error or BrokenPipeError(32, "Broken pipe")

    def write(self, text: str) -> int:
        if self.accept <= 0:
            raise self.error
        self.accept -= 1
        return super().write(text)


def test_a_stalled_terminal_costs_the_caller_nothing_and_drops_lines_it_counts():
    out = StalledStream()
    printer = Printer(LABELS, stream=out, live=False, buffer_lines=100)
    printer.task_line("host0/worker0", "line first")
    assert out.entered.wait(10)  # the writer thread is stuck on the terminal
    started = time.monotonic()
    for i in range(1000):
        printer.task_line("host0/worker0", f"line {i}")
    printer.notice("failure: host1/worker1 was killed")  # notices are kept
    assert time.monotonic() - started < 1.0  # no call waited for the terminal
    assert printer.dropped == 900  # 100 waited in the buffer
    out.release.set()
    assert printer.flush(timeout=10)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["host0/worker0 | line first", "host0/worker0 | line 0"]
    assert lines[100] == "host0/worker0 | line 99"
    # Said once, where they went missing:
    assert lines[101] == ("mgpu-launch   | ... 900 lines of task output not shown here: the "
                          "terminal did not keep up (the log files have every line)")
    assert lines[102:] == ["mgpu-launch   | failure: host1/worker1 was killed"]
    printer.close()
    printer.finish()
    assert f"{printer.dropped} lines of task output were not shown" in out.getvalue()


def test_close_gives_up_on_a_terminal_that_never_takes_anything():
    out = StalledStream()
    printer = Printer(LABELS, stream=out, live=False)
    printer.task_line("host0/worker0", "stuck")
    started = time.monotonic()
    printer.close(timeout=0.5)
    printer.notice("job succeeded")  # after giving up: dropped, not waited for
    printer.finish(timeout=0.5)
    assert time.monotonic() - started < 10  # gave up: a stalled terminal holds it forever
    assert printer.dropped >= 1
    out.release.set()


def test_a_closed_pipe_is_given_up_once_without_raising():
    lost: list[str] = []
    out = ClosedStream(accept=1)
    printer = Printer(LABELS, stream=out, live=False, on_terminal_lost=lost.append)
    printer.task_line("host0/worker0", "first")
    assert printer.flush(timeout=10)
    for i in range(50):
        printer.task_line("host0/worker0", f"line {i}")
        printer.notice(f"notice {i}")
    wait_for(lambda: printer.terminal_lost, 10, "the printer to see the closed pipe")
    printer.close()
    printer.notice("job succeeded")
    printer.finish()
    assert printer.terminal_lost == "EPIPE" and printer.terminal_lost_t is not None
    assert lost == ["EPIPE"]  # the callback, once
    assert out.getvalue() == "host0/worker0 | first\n"


def test_a_closed_file_and_a_hangup_end_writing_too():
    closed = Printer(LABELS, stream=ClosedStream(error=ValueError("I/O operation on closed "
                                                                  "file")), live=True,
                     size=lambda: (100, 30))
    closed.notice("hello")
    wait_for(lambda: closed.terminal_lost, 10, "the printer to see the closed file")
    assert closed.terminal_lost.startswith("ValueError")
    closed.close()
    closed.finish()

    out = io.StringIO()
    hung_up = Printer(LABELS, stream=out, live=False)
    hung_up.notice("before")
    assert hung_up.flush(timeout=10)
    hung_up.terminal_gone("SIGHUP")
    hung_up.notice("after")
    hung_up.close()
    hung_up.finish()
    assert hung_up.terminal_lost == "SIGHUP"
    assert out.getvalue() == "mgpu-launch   | before\n"


# --------------------------------------------------------------- end to end


def _start(args: list[str], cwd: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "launcher", *args], cwd=cwd, env=cli_env(),
                            stdin=subprocess.DEVNULL, **popen)


def _digits(run_dir: Path) -> list[str]:
    return ["--local", "2", "--run-dir", str(run_dir),
            str(EXAMPLES / "digits" / "train.py"), "--epochs", "2"]


def _assert_finished_for_real(run_dir: Path, stderr: str) -> None:
    assert read_summary(run_dir)["status"] == "succeeded"
    for log in ("host0-worker0.log", "host1-worker1.log"):
        assert "test accuracy" in (run_dir / "logs" / log).read_text(), log
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


def test_piped_into_head_the_job_runs_to_its_end(workdir: Path):
    """`mgpu-launch --local 2 examples/digits/train.py | head -3`"""
    run_dir = workdir / "run"
    proc = _start(_digits(run_dir), workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                  text=True)
    try:
        head = [proc.stdout.readline() for _ in range(3)]
        assert all(head), head
        proc.stdout.close()  # what head does after three lines
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    _assert_finished_for_real(run_dir, stderr)
    summary = read_summary(run_dir)
    assert summary["terminal_lost"]["reason"] == "EPIPE"
    assert any(e["event"] == "terminal_lost" for e in read_events(run_dir))


def test_sighup_mid_run_leaves_the_job_running_to_its_end(workdir: Path):
    run_dir = workdir / "run"
    proc = _start(_digits(run_dir), workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                  text=True)
    try:
        # Read the output meanwhile: this pipe never stalls, only the signal counts.
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        wait_for(lambda: any(e["event"] == "progress" for e in read_events(run_dir)), 180,
                 "the first progress event")
        proc.send_signal(signal.SIGHUP)
        stderr = proc.stderr.read()
        proc.wait(timeout=240)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    _assert_finished_for_real(run_dir, stderr)
    assert read_summary(run_dir)["terminal_lost"]["reason"] == "SIGHUP"
    assert not any("job succeeded" in line for line in output)  # nothing written after it


def _pipe_bytes(pipe) -> int:
    """Bytes written into the pipe and not read yet."""
    raw = fcntl.ioctl(pipe.fileno(), termios.FIONREAD, struct.pack("i", 0))
    return struct.unpack("i", raw)[0]


def test_a_stalled_terminal_does_not_delay_failure_handling(workdir: Path):
    run_dir = workdir / "run"
    proc = _start(["--local", "2", "--run-dir", str(run_dir), "--max-restarts", "2",
                   str(SCRIPTS / "chatty.py"), "3000"], workdir,
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        pids = wait_for(lambda: {e["task"]: e["pid"] for e in read_events(run_dir)
                                 if e["event"] == "task_started"} or None, 60,
                        "the tasks to start")
        # Nobody reads the launcher's stdout: wait until the pipe is full.
        wait_for(lambda: _pipe_bytes(proc.stdout) >= 48 * 1024, 60, "the stdout pipe to fill up")
        worker1 = pids["worker1"] if "worker1" in pids else wait_for(
            lambda: {e["task"]: e["pid"] for e in read_events(run_dir)
                     if e["event"] == "task_started"}.get("worker1"), 60, "worker1 to start")
        killed_at = time.time()
        os.kill(worker1, signal.SIGKILL)
        # As the failure, or as the root cause when a peer's aborted collective
        # was told first (a loaded machine).
        detected = wait_for(lambda: next((e for e in read_events(run_dir)
                                          if e["event"] in ("failure_detected", "root_cause")
                                          and e.get("task") == "worker1"), None), 30,
                            "worker1's failure while the terminal is stalled")
        # Seen while nobody reads the launcher's stdout (the wait above): the
        # stalled terminal held nothing up. Detected from the exit itself.
        assert (detected["kind"], detected["signal"]) == ("signal", 9), detected
        print(f"failure detected {detected['t'] - killed_at:.3f} s after the kill")
        # The whole job, restart included, runs to its end behind the stalled terminal.
        wait_for(lambda: (run_dir / "summary.json").exists(), 180,
                 "the job to end while its stdout is stalled")
        out, _ = proc.communicate(timeout=60)  # the terminal drains at last
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1
    assert summary["terminal_lines_dropped"] > 0
    assert b"Traceback" not in out
    for log in ("host0-worker0.log", "host1-worker1.log"):  # the logs have every line
        lines = (run_dir / "logs" / log).read_text().splitlines()
        assert lines[-1].endswith("DONE")
        assert sum(" gen 1 line " in line for line in lines) == 3000


def test_a_full_non_blocking_pipe_is_waited_for_not_given_up():
    """EAGAIN is not a terminal gone: stdout may be left O_NONBLOCK by a parent."""
    read_end, write_end = os.pipe()
    flags = fcntl.fcntl(write_end, fcntl.F_GETFL)
    fcntl.fcntl(write_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    stream = os.fdopen(write_end, "w")
    printer = Printer(LABELS, stream=stream, live=False, buffer_lines=10000)
    for i in range(2000):  # ~230 KB: several times what the pipe holds
        printer.task_line("host0/worker0", f"{i} " + "x" * 100)
    received = bytearray()

    def read() -> None:
        while chunk := os.read(read_end, 65536):
            received.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert printer.flush(timeout=30)
        assert printer.terminal_lost is None and printer.dropped == 0
    finally:
        printer.finish()
        stream.close()
        reader.join(timeout=10)
        os.close(read_end)
    assert received.count(b"\n") == 2000
