"""The live status view: a table redrawn in place on a terminal, plain lines elsewhere.

Unit tests drive `Printer` with events (the run's model it folds: states,
steps, losses) and the supervisor's own figures beside them, `live.render`
with `TaskRow`s, and read the result through a small model of a terminal
screen. End-to-end tests run the
real CLI on a 2-worker local job: under tmux (a real terminal) the table shows
steps advancing; through a pipe the output stays plain prefixed lines.
"""

from __future__ import annotations

import io
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.commands.foreground import _print_outcome
from launcher.job.record import events as ev
from launcher.job.record.states import Failure, RunResult
from launcher.job.record.story import Beside, TaskRow
from launcher.outlets.printer import STATUS_EVERY_S, Printer
from launcher.views.live import clean_for_screen, render
from tests.conftest import PYTHON, cli_env, read_events, start_cli, wait_for

# --------------------------------------------------------------------- helpers


class Terminal(io.StringIO):
    """Text written to it, as a terminal would show it: it understands what the
    live view emits (text, newline, carriage return, cursor up, erase below,
    colours) and fails on any other escape sequence."""

    def isatty(self) -> bool:
        return True

    def screen(self) -> list[str]:
        lines, row, col = [""], 0, 0
        for token in re.split(r"(\x1b\[[0-9;]*[A-Za-z]|\n|\r)", self.getvalue()):
            if not token:
                continue
            if token == "\n":
                row, col = row + 1, 0
                lines += [""] * (row + 1 - len(lines))
            elif token == "\r":
                col = 0
            elif token.startswith("\x1b["):
                code, arg = token[-1], token[2:-1]
                if code == "A":
                    row = max(0, row - int(arg or 1))
                elif code == "J":
                    lines[row] = lines[row][:col]
                    del lines[row + 1:]
                else:
                    assert code == "m", f"unexpected escape sequence {token!r}"
            else:
                line = lines[row].ljust(col)
                lines[row] = line[:col] + token + line[col + len(token):]
                col += len(token)
        return [line.rstrip() for line in lines if line.strip()]


def row(task: str = "worker0", state: str = "running", step: int | None = 120,
        generation: int = 0, restarts: int = 0, **extra) -> TaskRow:
    host = f"host{task[-1]}"
    values = dict(steps_per_s=12.5, loss=0.25, cpu_percent=97.0, rss_mb=512.0, silent_s=0.4)
    values.update(extra)
    return TaskRow(label=f"{host}/{task}", host=host, task=task, state=state,
                   generation=generation, restarts=restarts, step=step, **values)


def beside(task: str = "worker0", **figures) -> Beside:
    """What the supervisor alone knows of a task (the launcher's table shows it beside)."""
    values = dict(cpu_percent=97.0, rss_mb=512.0, silent_s=0.4)
    values.update(figures)
    return Beside(label=f"host{task[-1]}/{task}", generation=0, **values)


def tell(printer: Printer, name: str, *events: type[ev.TaskEvent], **fields) -> None:
    """Tell `printer` each of `events` (task events of `name`, generation 0)."""
    for kind in events:
        printer.tell(kind(generation=0, task=name, host=f"host{name[-1]}", **fields))


def launched(printer: Printer, *names: str) -> None:
    """Generation 0 placed and every task of it running (as the events tell it)."""
    printer.tell(ev.Launch(generation=0, tasks=tuple(
        ev.Placed(task=name, host=f"host{name[-1]}") for name in names)))
    for name in names:
        tell(printer, name, ev.TaskStarting, ev.TaskStarted)


def stepped(printer: Printer, name: str, step: int, t: float, loss: float = 0.25) -> None:
    printer.tell(ev.Progress(generation=0, task=name, host=f"host{name[-1]}", t=t,
                             metrics={"step": step, "loss": loss}))


def live_printer(out: io.StringIO, colour: bool = False, **kwargs) -> Printer:
    return Printer(["host0/worker0", "host1/worker1"], stream=out, colour=colour, live=True,
                   size=lambda: (100, 30), **kwargs)


# ------------------------------------------------------------------ unit tests


def test_the_launchers_table_draws_the_runs_model_with_the_supervisors_figures_beside():
    """State (from `task_starting` on), step and loss (kept across a report without a step),
    loss and slowdown are the model's (launcher/job/record/story.py, told the events);
    CPU, memory and silence the supervisor's own."""
    out = Terminal()
    printer = live_printer(out)
    ids = {"generation": 0, "task": "worker1", "host": "host1"}
    printer.tell(ev.Launch(generation=0, tasks=(ev.Placed(task="worker0", host="host0"),
                                                ev.Placed(task="worker1", host="host1"))))
    tell(printer, "worker0", ev.TaskStarting)  # sent; no answer yet
    tell(printer, "worker1", ev.TaskStarting, ev.TaskStarted)
    printer.tell(ev.Progress(**ids, metrics={"step": 41, "loss": 0.5}))
    printer.tell(ev.Progress(**ids, metrics={"saved": 41}))  # a save report: no step, no loss
    printer.tell(ev.Straggler(**ids, slowdown=1.5))
    printer.refresh([beside("worker0", cpu_percent=None), beside("worker1", cpu_percent=55.0)])
    assert printer.flush(timeout=10)
    table = out.screen()
    assert any(re.search(r"host1\s+worker1\s+running \(straggler 1.5x\)\s+41\s+-\s+0.5\s+55%",
                         line) for line in table), table
    assert any(re.search(r"host0\s+worker0\s+starting\s+-", line) for line in table), table
    printer.finish()


def test_render_fits_the_terminal_and_says_what_each_task_does():
    rows = [row("worker0", step=1200, loss=0.0312, rss_mb=2048.0),
            row("worker1", state="starting", step=None, silent_s=75.0)]
    lines = render(rows, width=60, height=20, elapsed_s=83.0, colour=False)
    assert all(len(line) <= 59 for line in lines)
    assert "1:23" in lines[0] and "generation 0 (0 restarts)" in lines[0]
    wide = render(rows, width=200, height=20, elapsed_s=83.0, colour=False)
    assert "1 running, 1 starting" in wide[0]
    assert wide[1].split() == ["HOST", "TASK", "STATE", "STEP", "STEPS/S", "LOSS", "CPU",
                               "MEM", "LAST", "OUTPUT"]
    assert wide[2].split() == ["host0", "worker0", "running", "1200", "12.5", "0.0312",
                               "97%", "2.0", "GB", "now"]
    # A task that has not reported a step yet shows dashes, not zeros.
    assert wide[3].split()[:5] == ["host1", "worker1", "starting", "-", "12.5"]


def test_render_on_a_short_terminal_keeps_the_tasks_needing_attention():
    rows = [row(f"worker{i}", step=10) for i in range(20)]
    rows[13] = row("worker13", state="failed", step=10)
    lines = render(rows, width=120, height=8, elapsed_s=1.0, colour=False)
    assert len(lines) <= 7
    assert any("worker13" in line and "failed" in line for line in lines)
    assert "... 16 more: 16 running" in lines[-1]


def test_task_output_cannot_move_the_cursor_over_the_table():
    assert clean_for_screen("\x1b[2A\x1b[Kloss 0.1", colour=True) == "loss 0.1"
    assert clean_for_screen("\x1b[31mred", colour=True) == "\x1b[31mred\x1b[0m"
    assert clean_for_screen("\x1b[31mred", colour=False) == "red"
    assert clean_for_screen("1/10 [==>..]\r10/10 [=====]", colour=False) == "10/10 [=====]"


def test_plain_output_is_prefixed_lines_without_escape_codes():
    out = io.StringIO()  # not a terminal
    printer = Printer(["host0/worker0", "host1/worker1"], stream=out)
    assert not printer.live
    printer.notice("job 'x': 2 tasks")
    launched(printer, "worker0", "worker1")
    printer.refresh([beside("worker0"), beside("worker1")])
    printer.task_line("host0/worker0", "epoch 1")
    printer.task_line("host1/worker1", "epoch 1")
    printer.close()  # waits (bounded) for the printer's writer thread
    assert out.getvalue() == (
        "mgpu-launch   | job 'x': 2 tasks\n"
        "host0/worker0 | epoch 1\n"
        "host1/worker1 | epoch 1\n"
    )


def test_live_lines_scroll_above_one_table():
    out = Terminal()
    printer = live_printer(out)
    printer.notice("job 'x': 2 tasks")
    launched(printer, "worker0", "worker1")
    stepped(printer, "worker0", 5, t=1.0)
    stepped(printer, "worker1", 4, t=1.0)
    printer.refresh([beside("worker0"), beside("worker1")])
    printer.task_line("host0/worker0", "epoch 1 done")
    stepped(printer, "worker0", 9, t=2.0)
    stepped(printer, "worker1", 8, t=2.0)
    printer.refresh([beside("worker0"), beside("worker1")])
    printer.task_line("host1/worker1", "epoch 1 done")
    assert printer.flush(timeout=10)  # the writer thread has written all of it
    screen = out.screen()
    assert screen[:3] == ["mgpu-launch   | job 'x': 2 tasks",
                          "host0/worker0 | epoch 1 done",
                          "host1/worker1 | epoch 1 done"]
    assert "generation 0" in screen[3] and screen[4].startswith("HOST")
    assert [line.split()[3] for line in screen[5:]] == ["9", "8"]  # the newest snapshot
    assert len(screen) == 7  # exactly one table, at the bottom
    assert "\x1b[" in out.getvalue() and not re.search(r"\x1b\[[0-9;]*m", out.getvalue())

    printer.close()
    printer.notice("job succeeded")
    printer.finish()
    assert out.screen()[-2:] == ["host1/worker1 | epoch 1 done", "mgpu-launch   | job succeeded"]


def test_live_quiet_keeps_the_table_and_notices_but_drops_task_lines():
    out = Terminal()
    printer = live_printer(out, colour=True, quiet=True)
    launched(printer, "worker0", "worker1")
    printer.refresh([beside("worker0"), beside("worker1")])
    printer.task_line("host0/worker0", "chatter")
    printer.notice("restarting")
    assert printer.flush(timeout=10)
    screen = out.screen()
    assert "chatter" not in out.getvalue()
    assert screen[0] == "mgpu-launch   | restarting" and screen[2].startswith("HOST")
    assert "\x1b[32mrunning" in out.getvalue()  # colour on a terminal unless NO_COLOR


def test_verbose_reports_state_changes_and_plain_status_lines():
    now = [100.0]
    out = io.StringIO()
    printer = Printer(["host0/worker0"], stream=out, verbose=True, clock=lambda: now[0])
    printer.tell(ev.Launch(generation=0, tasks=(ev.Placed(task="worker0", host="host0"),)))
    tell(printer, "worker0", ev.TaskStarting)
    printer.refresh([beside()])
    tell(printer, "worker0", ev.TaskStarted)
    printer.refresh([beside()])
    stepped(printer, "worker0", 30, t=100.0)
    printer.refresh([beside()])  # no change: no line
    now[0] += STATUS_EVERY_S
    stepped(printer, "worker0", 60, t=102.4)
    printer.refresh([beside()])
    printer.debug("agent host0: hello")
    assert printer.flush(timeout=10)
    assert out.getvalue().splitlines() == [
        "mgpu-launch   | host0/worker0 generation 0: starting",
        "mgpu-launch   | host0/worker0 generation 0: starting -> running",
        "mgpu-launch   | host0/worker0 running, step 60 (12.5 steps/s), loss 0.25, cpu 97%, "
        "512 MB, last output now",
        "mgpu-launch   | agent host0: hello",
    ]
    quiet = io.StringIO()
    quiet_printer = Printer(["host0/worker0"], stream=quiet)
    quiet_printer.debug("not shown")
    quiet_printer.finish()
    assert quiet.getvalue() == ""


def test_end_summary_names_the_root_cause_once_and_where_to_look(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    earlier = Failure(task="host1/worker1", host="host1", generation=0, t=1.0, kind="signal",
                      reason="killed (SIGKILL)", signal=9)
    cause = Failure(
        task="host1/worker1", host="host1", generation=1, t=2.0, kind="exit",
        reason="Python exception KeyError: 'x'", exit_code=1,
        last_lines=("loading data", "Traceback (most recent call last):",
                    '  File "train.py", line 3, in <module>', "KeyError: 'x'"),
        error={"type": "KeyError", "message": "'x'",
               "traceback": '  File "train.py", line 3, in <module>\n'})
    result = RunResult(
        status="failed", restarts=1, wall_s=75.5, root_cause=cause, failures=(earlier, cause),
        tasks={"host0/worker0": {"state": "stopped", "signal": 15, "exit_code": None,
                                 "last_progress": {"step": 40, "loss": 0.5}},
               "host1/worker1": {"state": "failed", "signal": None, "exit_code": 1,
                                 "last_progress": {}}})
    out = io.StringIO()
    printer = Printer(["host0/worker0", "host1/worker1"], stream=out)
    _print_outcome(printer, result, tmp_path / "run")
    printer.finish()
    text = out.getvalue().replace("mgpu-launch   | ", "")
    assert text.splitlines()[:3] == [
        "job failed in 1m 15s (1 restart)",
        "  host0/worker0  stopped    step 40  loss 0.5",
        "  host1/worker1  failed     exit code 1",
    ]
    assert "restarted after:\n  host1/worker1 (host host1, generation 0) killed (SIGKILL)" in text
    assert "its last lines:\n  loading data\ntraceback (most recent call last):" in text
    assert text.count('File "train.py", line 3') == 1 and "KeyError: 'x'\n" in text
    assert "its log: run/logs/host1-worker1.log" in text
    assert "mgpu-launch logs run host1/worker1" in text


# ------------------------------------------------------------------ end to end

# Reports a step every 20 ms through the runtime, prints a line every 25 steps,
# and stops when the test creates the stop file (at the latest after 90 s).
PROGRESS_SCRIPT = """\
import os, sys, time
from launcher import runtime
stop, deadline, step = sys.argv[1], time.monotonic() + 90, 0
while not os.path.exists(stop) and time.monotonic() < deadline:
    step += 1
    runtime.report_progress(step, loss=1.0 / step)
    if step % 25 == 0:
        print(f"at step {step}", flush=True)
    time.sleep(0.02)
print("finished", flush=True)
"""


@pytest.fixture
def progress_job(workdir: Path) -> tuple[list[str], Path]:
    script = workdir / "progress.py"
    script.write_text(PROGRESS_SCRIPT)
    stop = workdir / "stop"
    return ["--local", "2", "--run-dir", str(workdir / "run"), str(script), str(stop)], stop


ROW = re.compile(r"^(host\d)\s+(worker\d)\s+running\s+(\d+)\s")


def read_table(screen: str) -> dict[str, int] | None:
    """Each task's step from a screen showing log lines above one whole table
    (None while the table is incomplete, e.g. captured in the middle of a redraw)."""
    lines = screen.rstrip("\n").splitlines()
    tops = [i for i, line in enumerate(lines) if "generation 0 (0 restarts)" in line]
    if len(tops) != 1 or tops[0] + 4 != len(lines):
        return None
    top = tops[0]
    if lines[top + 1].split()[:4] != ["HOST", "TASK", "STATE", "STEP"]:
        return None
    if not any(re.match(r"host\d/worker\d \| at step \d+$", line) for line in lines[:top]):
        return None
    rows = [ROW.match(line) for line in lines[top + 2:]]
    return {f"{m[1]}/{m[2]}": int(m[3]) for m in rows if m} if all(rows) else None


def test_terminal_shows_a_live_table_with_steps_advancing(workdir, progress_job):
    args, stop = progress_job
    socket = workdir / "tmux.sock"
    conf = workdir / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\n")  # keep the screen to read at the end
    env = cli_env()
    env.pop("NO_COLOR", None)
    env.pop("TMUX", None)  # a tmux server of our own, even when the tests run inside one
    tmux = [shutil.which("tmux") or "tmux", "-S", str(socket), "-f", str(conf)]
    # tmux's own record of a pane's exit status is racy: the shell prints it.
    command = shlex.join([PYTHON, "-m", "launcher", *args]) + '; echo "[exit $?]"'
    subprocess.run([*tmux, "new-session", "-d", "-x", "150", "-y", "40", "-c", str(workdir),
                    command], env=env, check=True, timeout=30)

    def screen() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p"], env=env, capture_output=True,
                              text=True, timeout=30).stdout

    try:
        first = wait_for(lambda: read_table(screen()), 60,
                         "log lines above a table with both workers running")
        later = wait_for(lambda: (s := read_table(screen())) and
                         all(s[k] > first[k] for k in first) and s, 30,
                         f"the steps in the table to advance past {first}")
        assert set(later) == {"host0/worker0", "host1/worker1"}

        stop.touch()
        wait_for(lambda: "[exit " in screen(), 60, "the launcher to exit")
        final = screen()
        assert "mgpu-launch   | job succeeded in" in final, final
        assert "[exit 0]" in final, final
        assert re.search(r"host1/worker1 +succeeded +step \d+ +loss", final), final
        assert "generation 0 (0 restarts)" not in final  # the table left with the run
    finally:
        subprocess.run([*tmux, "kill-server"], env=env, capture_output=True, timeout=30)


def test_piped_output_stays_plain_prefixed_lines(workdir, progress_job):
    args, stop = progress_job
    proc = start_cli(args, cwd=workdir)
    try:
        wait_for(lambda: {e["task"] for e in read_events(workdir / "run")
                          if e["event"] == "progress" and e.get("step", 0) >= 50}
                 == {"worker0", "worker1"},
                 60, "both workers past step 50")
        stop.touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "\x1b" not in out
    for line in out.splitlines():
        assert re.match(r"^(mgpu-launch  |host\d/worker\d) \| ", line), line
    assert re.search(r"^host0/worker0 \| at step 25$", out, re.M)
    assert "HOST" not in out and "generation 0 (" not in out
    assert re.search(r"^mgpu-launch   \| job succeeded in [\d.]+ s \(no restarts\)$", out, re.M)
