"""A run's SSH hosts reached before its cluster file is validated
(launcher/commands/prereach.py), against real sshds on loopback.

A second run of an unchanged cluster file connects to its hosts before the
launcher has imported pydantic (an audit hook in the launcher's process
records what was loaded at its first connection to an sshd); a changed file,
a record that no longer matches, or a launch refused after the hosts were
reached ahead leave nothing behind and change nothing the user sees.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.commands import prereach
from tests.conftest import PYTHON, REPO, cli_env, wait_for
from tests.sshcluster import MARKER, sim_cluster, write_script, write_yaml

# The launcher as `python -m launcher` runs it, with an audit hook that writes,
# at its first connection to port PORT, whether the cluster file's models
# (pydantic) were loaded by then.
HOOKED = """\
import json, os, sys
out, port = sys.argv[1], int(sys.argv[2])
def hook(event, args):
    if event == "socket.connect" and isinstance(args[1], tuple) and args[1][1:2] == (port,) \\
            and not os.path.exists(out):
        with open(out, "w") as handle:
            json.dump({"pydantic": "pydantic" in sys.modules}, handle)
sys.addaudithook(hook)
sys.argv = ["mgpu-launch", *sys.argv[3:]]
from launcher.__main__ import main
main()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sim_cluster(tmp_path_factory.mktemp("sim"), 2) as sim:
        yield sim


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder / "mgpu-launch" / "reach"


def launch(cluster, tmp_path: Path, yaml_path: Path, *options: str,
           name: str = "run") -> tuple[subprocess.CompletedProcess, dict | None]:
    """One launch of MARKER with the hook: its result, and what the hook saw."""
    markers = tmp_path / f"markers-{name}"
    markers.mkdir()
    script = write_script(tmp_path, "marker.py", MARKER)
    seen = tmp_path / f"seen-{name}.json"
    hooked = write_script(tmp_path, "hooked.py", HOOKED)
    done = subprocess.run(
        [PYTHON, str(hooked), str(seen), str(cluster.hosts[0].port), *options,
         "--run-dir", str(tmp_path / name), str(yaml_path), str(script), str(markers)],
        cwd=tmp_path, env=cli_env(XDG_CACHE_HOME=os.environ["XDG_CACHE_HOME"]),
        capture_output=True, text=True, timeout=300)
    ran = sorted(p.name for p in markers.iterdir())
    if done.returncode == 0:
        assert ran == ["host0", "host1"], done.stdout + done.stderr
    return done, json.loads(seen.read_text()) if seen.exists() else None


def host_folders(run_name: str) -> list[Path]:
    """The run's folders on the (simulated) hosts, under this user's home."""
    return list((Path.home() / ".mgpu-launch" / "runs").glob(f"{run_name}-*"))


def test_a_second_run_of_the_same_file_reaches_its_hosts_before_reading_it(
        cluster, tmp_path, cache):
    yaml_path = cluster.write_yaml(tmp_path / "cluster.yaml")
    first, seen = launch(cluster, tmp_path, yaml_path, name="first")
    assert first.returncode == 0, first.stdout + first.stderr
    assert seen == {"pydantic": True}  # no record yet: the file is read first
    records = list(cache.iterdir())
    assert len(records) == 1
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(records[0].stat().st_mode) == 0o600
    record = json.loads(records[0].read_text())
    assert [t["address"] for t in record["targets"]] == [h.address for h in cluster.hosts]

    (tmp_path / "second").mkdir()  # an empty --run-dir is a new run's too
    second, seen = launch(cluster, tmp_path, yaml_path, "--quiet", name="second")
    assert second.returncode == 0, second.stdout + second.stderr
    assert seen == {"pydantic": False}  # the hosts reached ahead
    assert list(cache.iterdir()) == records  # unchanged: nothing rewritten


def test_a_changed_file_is_read_first_and_recorded_again(cluster, tmp_path, cache):
    yaml_path = cluster.write_yaml(tmp_path / "cluster.yaml")
    assert launch(cluster, tmp_path, yaml_path, name="first")[0].returncode == 0
    config = cluster.config_dict()
    config["restart"] = {"heartbeat_timeout_s": 25}
    write_yaml(yaml_path, config)
    done, seen = launch(cluster, tmp_path, yaml_path, name="changed")
    assert done.returncode == 0, done.stdout + done.stderr
    assert seen == {"pydantic": True}
    (record,) = cache.iterdir()
    assert json.loads(record.read_text())["lease"] == {"lease_s": 25.0}
    done, seen = launch(cluster, tmp_path, yaml_path, name="again")
    assert done.returncode == 0 and seen == {"pydantic": False}


def test_a_record_that_no_longer_matches_is_dropped_and_the_run_goes_on(
        cluster, tmp_path, cache):
    yaml_path = cluster.write_yaml(tmp_path / "cluster.yaml")
    assert launch(cluster, tmp_path, yaml_path, name="first")[0].returncode == 0
    (path,) = cache.iterdir()
    record = json.loads(path.read_text())
    good_python = record["targets"][1]["python"]
    record["targets"][1]["python"] = "/nonexistent/python3"  # as an older launcher made it
    path.write_text(json.dumps(record))
    done, seen = launch(cluster, tmp_path, yaml_path, name="stale")
    assert done.returncode == 0, done.stdout + done.stderr  # the file's own python
    assert seen == {"pydantic": False}  # started ahead, then dropped
    assert "nonexistent" not in done.stdout + done.stderr
    assert json.loads(path.read_text())["targets"][1]["python"] == good_python


def test_a_launch_refused_after_its_hosts_were_reached_leaves_nothing_on_them(
        cluster, tmp_path, cache):
    yaml_path = cluster.write_yaml(tmp_path / "cluster.yaml")
    assert launch(cluster, tmp_path, yaml_path, name="first")[0].returncode == 0
    import socket

    with socket.socket() as busy:  # --metrics-port on a port in use: refused
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done, seen = launch(cluster, tmp_path, yaml_path, "--metrics-port", str(port),
                            name="refused")
    assert done.returncode == 2, done.stdout + done.stderr
    assert seen == {"pydantic": False}
    wait_for(lambda: not host_folders("refused"), timeout=30,
             what="the refused run's folders gone from the hosts")


def test_a_record_writable_by_others_or_a_link_is_not_read(cluster, tmp_path, cache):
    yaml_path = cluster.write_yaml(tmp_path / "cluster.yaml")
    assert launch(cluster, tmp_path, yaml_path, name="first")[0].returncode == 0
    (path,) = cache.iterdir()
    os.chmod(path, 0o620)
    assert launch(cluster, tmp_path, yaml_path, name="group")[1] == {"pydantic": True}
    os.chmod(path, 0o600)
    moved = path.with_name("elsewhere")
    path.rename(moved)
    path.symlink_to(moved)
    assert launch(cluster, tmp_path, yaml_path, name="link")[1] == {"pydantic": True}


def test_a_run_directory_that_cannot_be_written_reaches_no_host(cluster, tmp_path, cache):
    # Refused in one line before any host is reached, even with a record that
    # would reach them ahead: the hook sees no connection at all.
    yaml_path = cluster.write_yaml(tmp_path / "cluster.yaml")
    assert launch(cluster, tmp_path, yaml_path, name="first")[0].returncode == 0
    (tmp_path / "notes").write_text("a file, not a folder\n")
    seen = tmp_path / "seen-unwritable.json"
    done = subprocess.run(
        [PYTHON, str(tmp_path / "hooked.py"), str(seen), str(cluster.hosts[0].port),
         "--run-dir", "notes/run", str(yaml_path), str(tmp_path / "marker.py"), "unused"],
        cwd=tmp_path, env=cli_env(XDG_CACHE_HOME=os.environ["XDG_CACHE_HOME"]),
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (f"mgpu-launch: cannot write the run directory {tmp_path}/notes/run: "
                           f"{tmp_path}/notes is not a directory; choose another --run-dir\n")
    assert not seen.exists()


# ------------------------------------------------------------------ pure parts


@pytest.mark.parametrize("argv, expected", [
    (["c.yaml", "train.py"], ("c.yaml", None, False)),
    (["-q", "--run-dir", "r", "c.yml", "t.py", "--epochs", "3"], ("c.yml", "r", False)),
    (["--run-dir=r", "-v", "--max-restarts", "2", "c.yaml", "t.py"], ("c.yaml", "r", True)),
    (["--local", "2", "t.py"], None),
    (["--dry-run", "c.yaml", "t.py"], None),
    (["--detach", "c.yaml", "t.py"], None),
    (["--slurm", "t.py"], None),
    (["check", "c.yaml"], None),
    (["c.yaml"], None),
    (["--run-dir"], None),
    (["--run", "r", "c.yaml", "t.py"], None),  # argparse's abbreviation: not ours to guess
    # The run command's options between the file and the script are its own;
    # after the script, the script's.
    (["c.yaml", "--no-live", "-v", "--run-dir", "r", "t.py", "--run-dir", "s"],
     ("c.yaml", "r", True)),
    (["--run-dir", "r", "c.yaml", "--run-dir=s", "t.py"], ("c.yaml", "s", False)),
    (["c.yaml", "--dry-run", "t.py"], None),
    (["c.yaml", "--local", "2", "t.py"], None),
    (["c.yaml", "--no-live"], None),
])
def test_only_a_plain_run_is_reached_ahead(argv, expected):
    assert prereach._plain_run(argv) == expected


def test_the_records_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for index in range(prereach.MAX_RECORDS + 6):
        source = tmp_path / f"c{index}.yaml"
        source.write_text(f"name: c{index}\n")
        prereach.remember(source, f"c{index}", (), {"lease_s": 10.0})
    assert len(list(prereach.cache_dir().glob("*.json"))) == prereach.MAX_RECORDS


def test_the_early_path_imports_no_models():
    """What `start` imports (the SSH transport and paramiko) loads neither
    pydantic nor the cluster file's models, or nothing is gained."""
    code = ("import sys, launcher.commands.prereach, launcher.transport.ssh; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic' "
            "or m in ('launcher.spec.config', 'launcher.spec.plan', 'yaml')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert out.strip() == "[]"
