"""TF1 graph-mode sessions with no MonitoredSession, in a real task process as
the agent starts it (launcher/runtime/sessions.py, saves.py, restores.py): a
plain `Session.run(train_op)` loop's global step counted, its `Saver`'s saves
and restores reported; with no global step, its resume point said as unknown;
a `Saver.save` that did not complete (cut off, a full or read-only disk)
never told as a save (in this process, real TF1 Savers)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from launcher.runtime.restores import NO_GLOBAL_STEP
from tests.test_runtime_restores import run_script


def test_a_plain_session_run_loop_reports_its_global_step_saves_and_resume(tmp_path: Path):
    ckpt = str(tmp_path / "ckpt")
    first, output = run_script(tmp_path, ["tf1_plain_loop.py", ckpt, "40"], 0,
                               MGPU_STEPS_EVERY_S="0.05")
    assert "TRAINED 40" in output, output[-3000:]
    assert [(r["saved"], r["saved_dir"]) for r in first if "saved" in r] == [
        (10, ckpt), (20, ckpt), (30, ckpt), (40, ckpt)], first
    counted = [r["step"] for r in first if r.get("counted")]
    assert counted == sorted(counted) and counted[-1] == 40, first  # the last, as it closed
    assert [step for step in counted if step % 10], counted  # between saves, not at them only
    # The last save torn (a write cut short), the one before it with the index
    # of another save over its data (two savers of the directory wrote its
    # step): Saver.restore passes both over for the one before.
    folder = tmp_path / "ckpt"
    data = folder / "model.ckpt-40.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-8])
    (folder / "model.ckpt-30.index").write_bytes((folder / "model.ckpt-20.index").read_bytes())
    again, output = run_script(tmp_path, ["tf1_plain_loop.py", ckpt, "50"], 1,
                               MGPU_STEPS_EVERY_S="0.05")
    assert "TRAINED 50" in output, output[-3000:]
    torn, mixed = [r for r in again if "passed_over" in r]
    assert torn["passed_over"].endswith("model.ckpt-40") and "torn" in \
        torn["passed_over_why"], torn
    assert mixed["passed_over"].endswith("model.ckpt-30") and "checksum" in \
        mixed["passed_over_why"], mixed
    assert [(r["resumed"], r["resumed_dir"]) for r in again if "resumed" in r] == [(20, ckpt)]


def test_a_restore_with_no_global_step_nor_step_in_its_name_is_said_unknown(tmp_path: Path):
    ckpt = str(tmp_path / "ckpt")
    first, output = run_script(tmp_path, ["tf1_plain_loop.py", ckpt, "20", "nostep"], 0,
                               MGPU_STEPS_EVERY_S="0.05")
    assert "TRAINED 20" in output, output[-3000:]
    assert not [r for r in first if r.get("counted")], first  # no global step: no step guessed
    again, output = run_script(tmp_path, ["tf1_plain_loop.py", ckpt, "10", "nostep"], 1)
    [unknown] = [r for r in again if "resumed_unknown" in r]
    assert (unknown["resumed_unknown"], unknown["resumed_dir"]) == (NO_GLOBAL_STEP, ckpt)
    assert not [r for r in again if "resumed" in r], again  # never a guessed step


def test_a_monitored_session_that_restored_nothing_says_where_it_started(tmp_path: Path):
    """A restarted chief whose `MonitoredTrainingSession` found no checkpoint
    (killed before its first save) initialized: it says it started at global
    step 0, which the launcher words "started from the beginning"."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]},
                         "task": {"type": "worker", "index": 0}})
    records, output = run_script(tmp_path, ["tf1_monitored.py", "--dir", str(tmp_path / "c"),
                                            "--last-step", "5", "--step-s", "0"], 1,
                                 TF_CONFIG=config)
    assert "DONE step=" in output, output[-3000:]
    assert [r["resumed"] for r in records if "resumed" in r] == [0], records


@pytest.fixture
def mounted(tmp_path: Path):
    """mount(name, options): a small tmpfs under tmp_path (needs root), unmounted after."""
    points: list[Path] = []

    def mount(name: str, options: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                              capture_output=True, check=False)
        if done.returncode:
            pytest.fail(f"cannot mount a tmpfs here (the test needs root, as .ci/run runs): "
                        f"{done.stderr.decode().strip()}")
        points.append(point)
        return point

    yield mount
    for point in points:
        subprocess.run(["umount", str(point)], check=False)


def test_a_tf1_saver_save_is_reported_once_written_at_a_step_it_holds(
        monkeypatch, tmp_path: Path, mounted):
    """Issue 57 item 3, with real TF1 Savers in graph mode: a save is told with
    the global step read before it wrote (the other workers move the shared
    step while it writes); one cut off halfway, one on a full disk, one on a
    read-only disk, one with nothing to save: none is told as a save."""
    import tensorflow as tf

    from launcher.runtime import saves

    read_fd, write_fd = os.pipe()
    monkeypatch.setenv("MGPU_PROGRESS_FD", str(write_fd))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    graph = tf.Graph()
    with graph.as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("weight", (64, 64))
        bump = step.assign_add(1)

        class PeersTrainOn(tf.compat.v1.train.Saver):
            def save(self, sess, save_path, global_step=None, **kwargs):
                written = super().save(sess, save_path, global_step, **kwargs)
                sess.run(bump)  # another worker's step, as this one returns
                return written

        class CutOff(tf.compat.v1.train.Saver):
            def save(self, sess, save_path, global_step=None, **kwargs):
                Path(save_path + ".data-00000-of-00001").write_bytes(b"half")
                raise SystemExit(143)  # SIGTERM's handler, halfway through a write

        for cls in (PeersTrainOn, CutOff):
            saves.timed(cls, "save", saves._saver_dir, step=saves._saver_step,
                        first=saves._saver_before)
        saver, cut, empty = PeersTrainOn(), CutOff(), PeersTrainOn(var_list=[], allow_empty=True)
        full, read_only = mounted("full", "size=64k"), mounted("ro", "size=64k")
        (full / "filler").write_bytes(b"\0" * (64 * 1024))
        subprocess.run(["mount", "-o", "remount,ro", str(read_only)], check=True)
        good = tmp_path / "good"
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(step.assign(5))
            assert saver.save(sess, str(good / "model.ckpt")) == str(good / "model.ckpt")
            assert saver.save(sess, str(good / "model.ckpt"), global_step=step).endswith("-6")
            for place in (full, read_only):
                with pytest.raises(Exception):  # noqa: B017, PT011 - TF's own error kinds
                    saver.save(sess, str(place / "model.ckpt"), global_step=step)
            with pytest.raises(SystemExit):
                cut.save(sess, str(good / "cut.ckpt"))
            assert empty.save(sess, str(good / "empty.ckpt")) is None
    os.close(write_fd)
    with os.fdopen(read_fd) as channel:
        records = [json.loads(line) for line in channel]
    saved = [(r["saved"], r["saved_dir"]) for r in records if "saved" in r]
    assert saved == [(5, str(good)), (6, str(good))], records
    # What was told is held: the first save holds step 5, not the 6 read after it.
    assert tf.train.load_variable(str(good / "model.ckpt"), "global_step") == 5
    assert tf.train.load_variable(str(good / "model.ckpt-6"), "global_step") == 6


def test_a_plain_sessions_global_step_is_read_when_due_and_a_slow_failure_backs_off(
        monkeypatch):
    """The `BaseSession.run` wrapper, with fakes: one read per period whatever
    the runs, one as the session closes, none without a global step nor before
    it is initialized (a failed read is logged by TF); a read that failed
    slowly (a ps out of reach) is not tried again for a minute."""
    from launcher.runtime import sessions

    clock = [100.0]
    monkeypatch.setattr(sessions.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(sessions, "_due", 0.0)
    monkeypatch.setattr(sessions, "_last_reported", None)
    told: list[int] = []
    monkeypatch.setattr(sessions, "report_global_step", told.append)

    class GlobalStep:
        _is_initialized_op = "initialized?"

    class Util:
        tensor: object = GlobalStep()

        @classmethod
        def get_global_step(cls, graph):
            return cls.tensor

    class Session:
        graph, value, reads, fail_s, ready, asked = object(), 0, 0, None, False, 0

        def run(self, fetches, options=None):
            if fetches == "initialized?":
                self.asked += 1
                return self.ready
            if fetches is Util.tensor:
                self.reads += 1
                if self.fail_s is not None:
                    clock[0] += self.fail_s
                    raise RuntimeError("unreachable")
                return self.value
            self.value += 1
            return "trained"

        def close(self):
            pass

    wrap_run, wrap_close = sessions._reading(Session.run, Util, None, 2.0)
    run, close = wrap_run(Session.run), wrap_close(Session.close)
    session = Session()
    run(session, "init_op")  # not initialized yet: asked, not read
    assert (session.asked, session.reads, told) == (1, 0, [])
    session.ready, session.value = True, 0
    clock[0] += 2.0
    for _ in range(5):  # five steps within one period: one read, after the first
        assert run(session, "train_op") == "trained"
        clock[0] += 0.1
    clock[0] += 2.0
    run(session, "train_op")
    assert (told, session.reads, session.asked) == ([1, 6], 2, 2)  # asked until read
    run(session, "train_op")
    close(session)  # the last steps, as it closes
    assert told == [1, 6, 7] and session.reads == 3
    session.fail_s = 3.0  # the ps out of reach: the read costs its timeout
    clock[0] += 2.0
    run(session, "train_op")
    for _ in range(30):
        clock[0] += 1.9
        run(session, "train_op")
    assert session.reads == 4  # 57 s later, not tried again
    clock[0] += 10.0
    run(session, "train_op")
    assert session.reads == 5
    Util.tensor, other = None, Session()  # a graph with no global step: nothing read
    clock[0] += 100.0
    run(other, "train_op")
    close(other)
    assert other.reads == 0 and told == [1, 6, 7]
