"""A stop reaches an MWMS script as a SIGTERM it can act on (the bootstrap
gives SIGTERM back to Python after TensorFlow's cluster setup took it:
launcher/runtime/guards.py). Before, TensorFlow's own handler swallowed it:
every stop (Ctrl-C, `mgpu-launch stop`, a teardown) waited out the grace for
a SIGKILL, and a script's own handler never ran. Two tutorial-shaped `fit`
jobs side by side, stopped with `mgpu-launch stop` while they train."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, read_events, read_summary, run_cli, wait_for

pytestmark = pytest.mark.e2e

SCRIPT = str(SCRIPTS / "sigterm_fit.py")


def test_a_stop_ends_an_mwms_fit_by_sigterm_and_runs_the_scripts_own_handler(
        workdir: Path, monkeypatch):
    runs = {}
    for name, own in (("plain", "0"), ("own_handler", "1")):
        folder = workdir / name
        folder.mkdir()
        monkeypatch.setenv("OWN_HANDLER", own)  # read as each job starts
        started = run_cli(["--detach", "--local", "2", "--run-dir", str(folder / "run"),
                           SCRIPT, str(folder)], cwd=folder, timeout=60)
        assert started.returncode == 0, started.stderr
        runs[name] = folder
    try:
        for folder in runs.values():
            wait_for(lambda f=folder: sum(e["event"] == "progress"
                                          for e in read_events(f / "run")) >= 2,
                     180, f"{folder.name}'s training")
        for folder in runs.values():
            stopped = run_cli(["stop", str(folder / "run")], cwd=folder, timeout=120)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        # No handler: each task ended by the SIGTERM itself, not the grace's SIGKILL.
        stop = read_summary(runs["plain"] / "run")["stop"]
        assert sorted(u["signal"] for u in stop["did_not_save"]) == ["SIGTERM", "SIGTERM"], stop
        # Its own handler: run in every task, which exited 0 at the stop.
        own = runs["own_handler"]
        assert sorted(p.name for p in own.glob("handled-*")) == ["handled-0", "handled-1"]
        exits = [e for e in read_events(own / "run") if e["event"] == "task_exited"]
        assert [e["exit_code"] for e in exits] == [0, 0], exits
    finally:
        for folder in runs.values():
            if not (folder / "run" / "summary.json").exists():
                run_cli(["stop", str(folder / "run"), "--timeout", "30"], cwd=folder,
                        timeout=60)
