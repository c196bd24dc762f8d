"""The straggler radar against real jobs: two real MultiWorkerMirroredStrategy
workers (tests/scripts/steady_train.py, `--local 2`, or simulated hosts with a
spare) training until the test stops them. A worker made slow for real is
named (task, host, slowdown, evidence) in the terminal, in events.jsonl and in
summary.json, and with `restart.on_straggler: replace` a spare host takes its
host's place at the next checkpoint; a balanced job names nobody.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.agent.health import HEALTH_EVERY_S
from launcher.job.detect.stragglers import AGREE, WARMUP_S
from tests.conftest import SCRIPTS, read_events, read_summary, start_cli, wait_for

pytestmark = pytest.mark.e2e

STEADY = str(SCRIPTS / "steady_train.py")
# The brief's bound: named within 60 s of steady training (TF's start comes first).
START_S, NAMED_WITHIN_S = 120.0, 60.0


class Run:
    def __init__(self, workdir: Path, *script_args: str, cluster: Path | None = None,
                 **env: str) -> None:
        self.run_dir = workdir / "run"
        hosts = [str(cluster)] if cluster else ["--local", "2"]
        self.proc = start_cli(["--run-dir", str(self.run_dir), *hosts, STEADY, *script_args],
                              cwd=workdir, **env)

    def events(self, kind: str) -> list[dict]:
        return [e for e in read_events(self.run_dir) if e["event"] == kind]

    def first_step(self) -> dict:
        return wait_for(lambda: next((e for e in self.events("progress") if e.get("step")),
                                     None), START_S, "the first step")

    def stop(self) -> tuple[str, dict]:
        """Ctrl-C, as a user would; the launcher's output and summary.json."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        output, _ = self.proc.communicate(timeout=60)
        return output, read_summary(self.run_dir)


def _hogs(n: int, cpu: int) -> list[subprocess.Popen]:
    """`n` busy loops on `cpu`, each in a session of its own, as other users'
    processes are: the kernel's autogroups share a CPU between sessions first,
    so twelve loops of one session would weigh as one neighbour, not twelve."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
            for _ in range(n)]


def _stop(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()
    hogs.clear()


SPARE_CLUSTER = """\
name: replace
transport: local
keras: tf_keras
ports: {{base: auto}}
checkpoint: {{dir: {checkpoints}}}
hosts:
  - {{address: 127.0.0.1, name: host0}}
  - {{address: 127.0.0.1, name: host1}}
  - {{address: 127.0.0.1, name: host2, spare: true}}
restart: {{on_straggler: replace, backoff_s: 0, grace_s: 0.5}}
"""
# A BackupAndRestore save (and an evaluation) every 120 steps: ~20 s of
# contended steps. Under MultiWorkerMirroredStrategy each epoch's end is a
# pause of 10-25 s on this machine with worker1 starved (both tasks asleep in
# TensorFlow's evaluation iterator and its collectives), and a paused round is
# not judged: epochs of 40 steps left ~2 judged rounds between pauses, and the
# naming took 30-70 s of wall time.
EPOCH_STEPS = 120


@pytest.mark.straggler_expected
def test_a_contended_worker_is_named_and_a_spare_replaces_its_host(workdir: Path):
    """worker1 pinned to CPU 0 beside twelve busy loops (a noisy neighbour) is
    named from its host signals; with `restart.on_straggler: replace` the job
    restarts at its next checkpoint with the spare host2 in host1's place, and
    resumes from that checkpoint."""
    checkpoints = workdir / "checkpoints"
    cluster = workdir / "cluster.yaml"
    cluster.write_text(SPARE_CLUSTER.format(checkpoints=checkpoints))
    run = Run(workdir, "--pin", "worker1:0,worker0:1", "--epoch-steps", str(EPOCH_STEPS),
              "--backup", str(checkpoints / "backup"), cluster=cluster)
    hogs: list[subprocess.Popen] = []
    try:
        first = run.first_step()
        hogs = _hogs(12, 0)  # worker1 (on CPU 0 only) beside twelve busy loops
        named = wait_for(lambda: run.events("straggler"), NAMED_WITHIN_S, "a straggler event")
        # The pin follows the task's name: worker1 on the spare is on CPU 0 too.
        failure = wait_for(lambda: run.events("failure_detected"), START_S, "the replacement")
        _stop(hogs)
        # Generation 1's worker1, on the spare, restores the checkpoint and says
        # where it begins (tests/scripts/steady_train.py).
        log = run.run_dir / "logs" / "host2-worker1.log"
        began = wait_for(lambda: log.is_file() and re.search(r"worker1 begins at step (\d+)",
                                                             log.read_text()),
                         START_S, "generation 1's worker1 on host2 beginning")
    finally:
        _stop(hogs)
        output, summary = run.stop()
    (event,) = named
    assert (event["task"], event["host"], event["generation"]) == ("worker1", "host1", 0)
    assert (event["action"], event["spare"], event["source"]) == ("replace", "host2", "host")
    assert event["slowdown"] > 1 and event["t"] - first["t"] < NAMED_WITHIN_S
    own, peers = event["evidence"]["task"], event["evidence"]["peers"]
    assert own["waiting_for_cpu"] > peers["waiting_for_cpu"]
    assert "straggler: host1/worker1 is" in output and "waiting for a CPU" in output
    (entry,) = summary["stragglers"]
    assert (entry["task"], entry["host"], entry["slowdown"]) == \
        ("worker1", "host1", event["slowdown"])
    assert json.dumps(entry["evidence"]) == json.dumps(event["evidence"])
    # Replaced at its next checkpoint, by the spare, and said so.
    (failure,) = failure
    assert (failure["task"], failure["host"], failure["kind"]) == ("worker1", "host1", "straggler")
    assert failure["t"] > event["t"]
    assert "host2 replaces host1 at the next checkpoint (restart.on_straggler: replace)" \
        in output  # said when named
    assert "replaced by a spare host at a checkpoint" in output
    assert re.search(r"^mgpu-launch +\| host2 replaces host1$", output, re.M)  # as it happens
    assert [f["kind"] for f in summary["failures"]] == ["straggler"]
    (restart,) = run.events("restart")
    assert restart["counted"] is False  # the checkpoint advanced: free of max_restarts
    placed = {t["task"]: t["host"] for t in run.events("launch")[-1]["tasks"]}
    assert placed == {"worker0": "host0", "worker1": "host2"}
    # Generation 1 resumed from the checkpoint saved after worker1 was named.
    named_at = max(e["step"] for e in run.events("progress")
                   if e["generation"] == 0 and e.get("step") and e["t"] <= event["t"])
    resumed_at = int(began.group(1))
    assert resumed_at % EPOCH_STEPS == 0 and resumed_at >= max(named_at, EPOCH_STEPS), \
        (resumed_at, named_at)


def test_a_balanced_job_names_nobody(workdir: Path):
    """Its epochs end every 150 steps with an evaluation and a checkpoint save.
    Host signals only (the radar's default): traces are opt-in, since TF 2.21's
    profiler may crash a task when a trace stops (docs/profiles.md); the traces'
    own judgement of a balanced job is unit-tested on recorded ones."""
    run = Run(workdir, "--epoch-steps", "150", "--backup", str(workdir / "backup"))
    try:
        first = run.first_step()
        # Past the warm-up and one round more than a straggler needs to be named.
        steady_s = WARMUP_S + (AGREE + 1) * HEALTH_EVERY_S
        wait_for(lambda: any(e["t"] - first["t"] >= steady_s for e in run.events("progress")),
                 steady_s + 30, f"{steady_s:g} s of training")
    finally:
        output, summary = run.stop()
    assert run.events("straggler") == [] and summary["stragglers"] == []
    assert "straggler" not in output
    assert run.events("health")  # sampled, and written at its bounded rate
    assert (workdir / "backup").is_dir()  # it saved


@pytest.mark.straggler_expected
def test_a_worker_whose_input_waits_is_named(workdir: Path):
    """worker1's tf.data map sleeps 0.1 s a batch (a slow disk or share): it wants
    no CPU, but one of its busy threads is always blocked in a sleep (or a read)
    while its peers wait for it inside the all-reduce, which is no input wait.
    The radar's default: host signals, no trace."""
    run = Run(workdir, "--slow-input", "worker1:0.1")
    try:
        first = run.first_step()
        named = wait_for(lambda: run.events("straggler"), NAMED_WITHIN_S, "a straggler event")
    finally:
        output, summary = run.stop()
    (event,) = named
    assert (event["task"], event["host"], event["source"]) == ("worker1", "host1", "host")
    assert event["slowdown"] > 1 and event["t"] - first["t"] < NAMED_WITHIN_S
    own, peers = event["evidence"]["task"], event["evidence"]["peers"]
    assert own["waiting_for_io"] > peers["waiting_for_io"] + 50  # ms per step
    assert "straggler: host1/worker1 is" in output and "waiting for input" in output
    assert [e["task"] for e in summary["stragglers"]] == ["worker1"]
