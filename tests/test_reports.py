"""A progress report is read in one place (launcher/job/record/reports.py, issue 53
item 1): each shape the runtime and the bootstrap send, a fact the report does
not hold read as unknown (None), never 0; and no other module reads the keys."""

from __future__ import annotations

import re
from pathlib import Path

from launcher.job.record.reports import ProgressReport
from tests.conftest import REPO


def test_each_shape_the_runtime_sends_reads_as_what_it_means():
    start = ProgressReport.read({"step": 0, "epoch": 1.0, "start_epoch": 1.0,
                                 "start_step": 22.0})
    assert (start.start, start.start_step, start.resume_point, start.own_step) == \
        (True, 22, 22, 0)
    trained = ProgressReport.read({"step": 3, "job_step": 25, "loss": 0.5})
    assert (trained.step, trained.own_step, trained.loss, trained.resume_point) == \
        (25, 3, 0.5, 3)
    old = ProgressReport.read({"step": 7})  # a run directory from before job_step
    assert (old.step, old.own_step) == (7, 7)
    counted = ProgressReport.read({"step": 40, "counted": 1})
    assert counted.counted and counted.resume_point is None  # the optimizer's, mid-training
    saved = ProgressReport.read({"saved": 44, "saved_dir": "/b", "chief": 1, "checkpoint": 1})
    assert (saved.saved, saved.saved_dir, saved.chief, saved.checkpoint) == (44, "/b", True, True)
    assert saved.resume_point is None and not saved.has_step
    resumed = ProgressReport.read({"resumed": 22, "resumed_epoch": 1, "resumed_dir": "/b"})
    assert (resumed.resume_point, resumed.resumed_epoch) == (22, 1)
    unknown = ProgressReport.read({"resumed_unknown": "no optimizer", "at": "train"})
    assert unknown.resume_unknown == "no optimizer" and unknown.resume_point is None
    assert not unknown.position_only  # said, not dropped as a position
    assert ProgressReport.read({"at": "train", "at_step": 3}).position_only
    # A save whose step could not be read is still progress (issue 57), not a position.
    assert not ProgressReport.read({"checkpoint": 1, "saved_dir": "/b", "at": "x"}).position_only
    assert ProgressReport.read({"deleted": "/b", "at": "train"}).deleted == "/b"
    bad = ProgressReport.read({"nonfinite": [100, 2, 19], "nonfinite_loss": "inf"})
    assert (bad.nonfinite, bad.nonfinite_loss, bad.has_step) == ((100, 2, 19), "inf", False)
    assert (bad.nonfinite_exact, bad.nonfinite_inexact) == (False, None)  # not said: no skip
    exact = ProgressReport.read({"nonfinite": [100, 2, 19], "nonfinite_exact": 1})
    assert exact.nonfinite_exact
    why = ProgressReport.read({"nonfinite": [100, 2, 19], "nonfinite_inexact": "Keras 3"})
    assert (why.nonfinite_exact, why.nonfinite_inexact) == (False, "Keras 3")
    refused = ProgressReport.read({"saved_nonfinite": 120, "saved_dir": "/b", "save_skipped": 1})
    assert (refused.saved_nonfinite, refused.saved, refused.save_skipped) == (120, None, True)


def test_the_sentinels_report_passes_the_agent_protocol_whole():
    """What runtime/sentinel.py sends with a loss gone bad (its reason for no
    skip cut at 200 characters there, the most a progress string may hold)."""
    from launcher.job.run.protocol import check_message

    for said in ({"nonfinite_exact": 1}, {"nonfinite_inexact": "x" * 200}):
        data = {"nonfinite": [100, 2, 19], "nonfinite_loss": "inf", **said}
        clean = check_message({"ev": "progress", "task": "worker0", "generation": 1,
                               "data": data})
        assert clean["data"] == data


def test_a_fact_not_in_the_report_is_unknown_not_zero():
    nothing = ProgressReport.read({})
    assert (nothing.step, nothing.saved, nothing.resumed, nothing.save_s, nothing.loss,
            nothing.start_step, nothing.epoch) == (None,) * 7
    assert ProgressReport.read({"step": True, "saved": "x", "loss": "nan"}).step is None


# The keys only job/record/reports.py reads. Other dicts (an entry of summary.json's
# `resumed`, the memory tier's slots) may have keys of the same names.
_KEYS = ("step", "job_step", "saved", "saved_dir", "resumed", "resumed_unknown", "start_epoch",
         "start_step", "counted", "checkpoint", "save_s", "deleted", "epoch_end", "returned",
         "nonfinite", "nonfinite_loss", "nonfinite_exact", "nonfinite_inexact",
         "saved_nonfinite", "save_skipped")
_READ = re.compile(r"\b(?:data|metrics|m|last_progress|progress|reported)"
                   r"(?:\.get\(|\[)\"(?:" + "|".join(_KEYS) + r")\"(?!\] = )")


def test_no_other_module_reads_a_reports_keys():
    readers = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if not relative.startswith(("launcher/job/", "launcher/views/", "launcher/commands/")) \
                or relative == "launcher/job/record/reports.py":
            continue  # the senders (runtime, bootstrap, agent), and the one reader
        for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
            if _READ.search(line):
                readers.append(f"{relative}:{number}: {line.strip()}")
    assert readers == [], "read them through job/record/reports.py:\n" + "\n".join(readers)


def test_a_report_holding_numpy_numbers_reaches_the_launcher_as_numbers(monkeypatch):
    """A batch skipped after a mid-epoch resume told its position as numpy's
    int64, which JSON refused: every task crashed in `fit` (TypeError)."""
    import json
    import os

    import numpy as np

    from launcher.runtime import epochinput

    read_fd, write_fd = os.pipe()
    monkeypatch.setenv("MGPU_PROGRESS_FD", str(write_fd))
    try:
        epochinput._tell("skip_done", np.int64(2), np.int64(19), np.int64(100))
        os.close(write_fd)
        with os.fdopen(read_fd) as channel:
            [line] = channel.read().splitlines()
    finally:
        for fd in (read_fd, write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
    assert json.loads(line)["skip_done"] == [100, 2, 19]
