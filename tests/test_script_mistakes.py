"""A mistake in the script itself (a syntax error, a failed import of its own,
the script missing on a host) ends the job at its first occurrence: no restart,
no backoff, and a message that says what to fix.

The task side is real: `python -m launcher.bootstrap` writes the error report
the launcher judges; the end-to-end tests run the real CLI with `--local`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from launcher.job.policy.recovery import Budget, decide_restart
from launcher.job.record.classify import script_mistake
from tests.conftest import PYTHON, REPO, read_summary, run_cli

SCRIPTS = {
    "syntax.py": "import os\nx = (\n",
    "indent.py": "if True:\nprint('x')\n",
    "own_import.py": "import os\nimport no_such_module_mgpu\n",
    "own_import_in_main.py": ("def main():\n    from os import no_such_name\n\n"
                              "main()\n"),
    "deep_import.py": "import helper_mgpu\n",
    "helper_mgpu.py": "raise ImportError('a library failed to load its extension')\n",
    "runtime_error.py": "raise ValueError('bad data')\n",
    "eval_syntax.py": "eval('1 +')\n",
}


def error_report(folder: Path, script: str) -> dict:
    """Run a script as a task does and return the error report it leaves."""
    for name, text in SCRIPTS.items():
        (folder / name).write_text(text)
    report = folder / "error.json"
    env = {**os.environ, "MGPU_ERROR_FILE": str(report), "PYTHONPATH": str(REPO)}
    subprocess.run([PYTHON, "-m", "launcher.bootstrap", script], cwd=folder, env=env,
                   capture_output=True, timeout=60)
    return json.loads(report.read_text())


@pytest.mark.parametrize("script, expected", [
    ("syntax.py", "SyntaxError in the script"),
    ("indent.py", "IndentationError in the script"),
    ("own_import.py", "the script's own import failed: ModuleNotFoundError"),
    ("own_import_in_main.py", "the script's own import failed: ImportError"),
    ("missing.py", "the script cannot be run on this host: FileNotFoundError"),
    (".", "the script cannot be run on this host: ImportError"),  # a folder, no __main__
])
def test_a_mistake_in_the_script_itself_is_deterministic(tmp_path: Path, script, expected):
    assert expected in script_mistake(error_report(tmp_path, script))


@pytest.mark.parametrize("script", ["deep_import.py", "runtime_error.py", "eval_syntax.py"])
def test_a_failure_inside_a_library_or_at_run_time_may_be_transient(tmp_path: Path, script):
    # An import failing inside a library (a half-done install, a network file
    # system) or an error of the data is left to the same-failure-twice rule.
    assert script_mistake(error_report(tmp_path, script)) == ""


def test_a_mistake_stops_at_once_even_with_restarts_left():
    decision = decide_restart(Budget(max_restarts=3), advanced=False, preempted=False,
                              mistake="SyntaxError in the script: invalid syntax")
    assert not decision.restart and decision.stopped_by == "deterministic"
    assert "first failure" in decision.message and "fix it" in decision.message


@pytest.mark.e2e
@pytest.mark.parametrize("script, what", [
    ("syntax.py", "SyntaxError in the script: '(' was never closed (syntax.py, line 2)"),
    ("own_import.py", "ModuleNotFoundError: No module named 'no_such_module_mgpu'"),
])
def test_a_broken_script_runs_once_and_says_why(tmp_path: Path, script, what):
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(text)
    done = run_cli(["--run-dir", str(tmp_path / "run"), "--local", "2", script], cwd=tmp_path,
                   timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    summary = read_summary(tmp_path / "run")
    assert summary["restarts"] == 0 and summary["stopped_by"] == "deterministic", summary
    assert what in summary["message"] and "not restarted" in summary["message"]
    assert what in output and "restarting" not in output, output[-3000:]


@pytest.mark.e2e
def test_a_script_missing_on_an_ssh_host_stops_at_once(tmp_path: Path):
    # The script is here, but the hosts run it in `workdir`, where it is not.
    from tests.sshcluster import sim_cluster, write_yaml

    (tmp_path / "train.py").write_text("print('trained')\n")
    (tmp_path / "elsewhere").mkdir()
    with sim_cluster(tmp_path / "sim", 2, first_address="127.0.93.2") as cluster:
        config = cluster.config_dict()
        config["workdir"] = str(tmp_path / "elsewhere")
        config["restart"] = {"max_restarts": 3, "backoff_s": 0}
        path = write_yaml(tmp_path / "cluster.yaml", config)
        done = run_cli(["--run-dir", str(tmp_path / "run"), str(path), "train.py"],
                       cwd=tmp_path, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    summary = read_summary(tmp_path / "run")
    assert summary["restarts"] == 0 and summary["stopped_by"] == "deterministic", summary
    assert "the script cannot be run on this host: FileNotFoundError" in summary["message"]
    assert "train.py" in summary["message"] and "restarting" not in output
