"""`mgpu-launch check --json`: the verdict as one JSON object, exit codes as the text's.

Real checks: simulated local hosts with the collective (real TensorFlow tasks),
SSH hosts nobody serves (connection refused), and a cluster file that does not load.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli


def test_a_ready_cluster_is_one_object_with_a_host_each(tmp_path: Path) -> None:
    done = run_cli(["check", "--local", "2", "--json"], tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads(done.stdout)  # the whole of stdout is the object
    assert verdict["ready"] is True and verdict["verdict"] == "ready"
    assert verdict["problems"] == []
    assert [h["host"] for h in verdict["hosts"]] == ["host0", "host1"]
    for host in verdict["hosts"]:
        assert host["reached"] and host["packages"]["tensorflow"]
        assert host["checkpoint"]["nonce_seen"] and host["problems"] == []
    collective = verdict["collective"]
    assert collective["ok"] is True and len(collective["tasks"]) == 2
    assert all(t["succeeded"] for t in collective["tasks"])


def test_problems_are_one_object_each_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "name: ghosts\nhosts:\n  - {address: 127.0.0.250}\n  - {address: 127.0.0.251}\n"
        f"checkpoint: {{dir: {tmp_path}}}\n")
    done = run_cli(["check", "c.yaml", "--json"], tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["ready"] is False and verdict["verdict"] == "not_ready"
    assert [h["reached"] for h in verdict["hosts"]] == [False, False]
    assert [p["host"] for p in verdict["problems"]] == ["127.0.0.250", "127.0.0.251"]
    assert all("connection refused by" in p["problem"] for p in verdict["problems"])
    # A file that does not load: not ready, why, on stdout too.
    (tmp_path / "bad.yaml").write_text("name: bad\nhosts: 3\n")
    done = run_cli(["check", "bad.yaml", "--json"], tmp_path, timeout=60)
    assert done.returncode == 2
    verdict = json.loads(done.stdout)
    assert verdict["ready"] is False and "bad.yaml" in verdict["error"]
    assert "Traceback" not in done.stderr
