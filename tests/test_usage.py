"""What a new user trips on first: usage errors, an early Ctrl-C, a launch that
fails before its job starts. The real CLI in a subprocess."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from launcher.commands import usage
from launcher.transport.ports import free_ports
from tests.conftest import run_cli, start_cli, wait_for

# A Ctrl-C delivered while a weakref callback runs (importlib's module locks
# have them) as the launcher's modules load: Python drops the KeyboardInterrupt
# there, printing "Exception ignored in: ..." (CI saw the launch go on after it).
_DROPPED_WHILE_LOADING = """
import importlib.abc, os, signal, sys, weakref
class Box: pass
def callback(_ref):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000): pass  # the handler runs here, inside the callback
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == 'launcher.cli':
            box = Box()
            ref = weakref.ref(box, callback)
            del box
            print('dropped', flush=True)
sys.meta_path.insert(0, Interrupt())
"""


def test_a_usage_error_says_the_error_first(tmp_path: Path):
    for args, error in ((["--local", "x", "train.py"], "argument --local: invalid int value"),
                        (["status"], "the following arguments are required"),
                        (["export", "cluster.yaml"], "the following arguments are required")):
        done = run_cli(args, cwd=tmp_path, timeout=60)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.splitlines()
        assert lines[0].startswith("mgpu-launch") and error in lines[0], done.stderr
        assert any(line.startswith("usage:") for line in lines[1:]), done.stderr


def test_a_commands_usage_text_is_its_help_and_its_usage_line(capsys):
    """`usage.parser_for`: the first line of the text is the usage, the rest
    the description as written; an error names the error first."""
    text = "mgpu-launch demo RUN_DIR\n\nDoes a thing.\n\nexit codes:  0 done;\n  2 not"
    parser = usage.parser_for("mgpu-launch demo", text)
    parser.add_argument("run_dir", metavar="RUN_DIR")
    assert parser.format_help().startswith(
        "usage: mgpu-launch demo RUN_DIR\n\nDoes a thing.\n\nexit codes:  0 done;\n  2 not")
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args([])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("mgpu-launch demo: error: the following arguments are required")
    assert err[1] == "usage: mgpu-launch demo RUN_DIR"


def _loaded(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_ctrl_c_while_the_launcher_loads_exits_130_without_a_traceback(tmp_path: Path):
    # A task that would outlive the test: the Ctrl-C, however late the loaded
    # machine delivers it, always comes before the job could end by itself.
    (tmp_path / "train.py").write_text("import time\nprint('hi', flush=True)\ntime.sleep(600)\n")
    proc = start_cli(["--local", "1", "train.py"], cwd=tmp_path)
    # pydantic's compiled core loads while the launcher's modules are imported.
    wait_for(lambda: _loaded(proc.pid, "pydantic_core") or proc.poll() is not None, 30,
             "the launcher to import pydantic")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


def test_a_ctrl_c_the_interpreter_dropped_while_loading_still_stops_the_launch(tmp_path: Path):
    marker = tmp_path / "started"
    (tmp_path / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                       "import time\ntime.sleep(600)\n")
    (tmp_path / "sitecustomize.py").write_text(_DROPPED_WHILE_LOADING)
    done = run_cli(["--local", "1", "train.py"], cwd=tmp_path, timeout=120,
                   PYTHONPATH=f"{tmp_path}:{Path(__file__).resolve().parents[1]}")
    assert done.stdout.startswith("dropped"), done.stdout  # the Ctrl-C came while loading
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.strip() == "mgpu-launch: interrupted", done.stderr
    assert not marker.exists(), "the task started after the Ctrl-C"


def test_a_launch_that_fails_before_starting_names_no_run_directory(tmp_path: Path):
    closed = free_ports(1)[0]  # nothing listens there: no sshd
    (tmp_path / "cluster.yaml").write_text(
        f"name: early\nhosts:\n  - {{address: 127.0.0.1, port: {closed}}}\n"
        f"checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n")
    done = run_cli(["cluster.yaml", "train.py"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "connection refused" in done.stderr, done.stderr
    assert "run dir" not in done.stdout + done.stderr, done.stdout
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_that_lands_in_a_string_exec_while_loading_still_exits_130(tmp_path: Path):
    # The interrupt the test above sends at a random moment of the import, made
    # certain: it goes through a string exec (as in dataclasses), which under
    # `python -m` made CPython die by SIGINT (-2) after we returned 130.
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Interrupt(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'launcher.cli':\n"
        "            exec('raise KeyboardInterrupt', {})\n"
        "sys.meta_path.insert(0, Interrupt())\n")
    done = run_cli(["--local", "1", "train.py"], cwd=tmp_path, timeout=60,
                   PYTHONPATH=f"{tmp_path}:{Path(__file__).resolve().parents[1]}")
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "mgpu-launch: interrupted", done.stderr


@pytest.mark.parametrize("form", ["local", "cluster file"])
def test_a_run_directory_that_cannot_be_written_is_said_in_one_line(tmp_path: Path, form):
    # Under a regular file (the tests run as root: no permission bit stops them),
    # for the simulated hosts of --local and for a cluster file: one line, exit 2,
    # no host started, nothing made (not the run directory, nor the checkpoints' lock).
    (tmp_path / "train.py").write_text("print('ran')\n")
    (tmp_path / "notes").write_text("a file, not a folder\n")
    (tmp_path / "cluster.yaml").write_text(
        "name: unwritable\ntransport: local\nhosts:\n  - {address: 127.0.0.1, name: host0}\n"
        "  - {address: 127.0.0.1, name: host1}\n")
    cluster = ["--local", "2"] if form == "local" else ["cluster.yaml"]
    before = sorted(tmp_path.rglob("*"))
    for run_dir in ("notes/run", "notes"):
        done = run_cli(["--run-dir", run_dir, *cluster, "train.py"], cwd=tmp_path, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr == (
            f"mgpu-launch: cannot write the run directory {tmp_path / run_dir}: "
            f"{tmp_path / 'notes'} is not a directory; choose another --run-dir\n"), done.stderr
        assert done.stdout == ""
        assert sorted(tmp_path.rglob("*")) == before


def test_the_launchers_options_between_the_cluster_file_and_the_script_are_its_own(
        tmp_path: Path):
    # `mgpu-launch cluster.yaml --no-live train.py` ran "--no-live" as the script.
    # Between the cluster file and the script the options are the launcher's;
    # after the script, the script's, untouched; one the launcher does not
    # know there is refused with where options go.
    (tmp_path / "args.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    (tmp_path / "cluster.yaml").write_text(
        "name: options\ntransport: local\nhosts:\n  - {address: 127.0.0.1, name: host0}\n"
        "  - {address: 127.0.0.1, name: host1}\n")
    done = run_cli(["cluster.yaml", "--no-live", "--run-dir", "run", "args.py",
                    "--epochs", "3", "--run-dir", "elsewhere"], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run dir {tmp_path / 'run'}" in done.stdout, done.stdout
    ran = [line for line in done.stdout.splitlines() if " | args " in line]
    assert sorted(ran) == [f"host{i}/worker{i} | args ['--epochs', '3', '--run-dir', 'elsewhere']"
                           for i in (0, 1)], done.stdout
    assert (tmp_path / "run" / "summary.json").exists()
    assert not (tmp_path / "elsewhere").exists()

    done = run_cli(["cluster.yaml", "--no-such-option", "args.py"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines()[0] == (
        "mgpu-launch: --no-such-option is not a training script: this command's options go "
        "before the cluster file (cluster.yaml), the script's own arguments after the script")


def test_help_lists_every_export_target(tmp_path: Path):
    # `--help` said `export --to slurm|tfjob`: trainjob, the v2 path, was missing.
    from launcher.commands.export import _parser

    choices = next(a.choices for a in _parser()._actions if "--to" in a.option_strings)
    done = run_cli(["--help"], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "mgpu-launch export --to" in line]
    listed = line.split("--to ", 1)[1].split()[0].split("|")
    assert sorted(listed) == sorted(choices), line
