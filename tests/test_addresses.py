"""TF_CONFIG addresses other hosts can reach (docs/cluster-file.md, "Addresses").

On simulated SSH hosts whose cluster file names them by ssh config aliases
(`Host gpu0` -> `HostName 127.0.0.2`): the job trains to the end on the
HostNames, which `--dry-run --json` shows. On simulated local hosts (cheaper,
no TensorFlow): a named interface's address, and a missing interface refused
before any task starts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import read_events, run_cli
from tests.sshcluster import TINY_TRAIN, sim_cluster, write_script, write_yaml


@pytest.fixture(scope="module")
def aliased(tmp_path_factory):
    """Two simulated SSH hosts, and a cluster file that knows them only by aliases."""
    directory = tmp_path_factory.mktemp("aliases")
    with sim_cluster(directory / "sim", 2) as sim:
        ssh_config = directory / "ssh_config"
        ssh_config.write_text("".join(f"Host gpu{h.index}\n  HostName {h.address}\n"
                                      f"  Port {h.port}\n" for h in sim.hosts))
        ssh_config.chmod(0o600)
        config = sim.config_dict()
        config["ssh"]["config_file"] = str(ssh_config)
        config["hosts"] = [{"address": f"gpu{h.index}"} for h in sim.hosts]
        yield sim, write_yaml(directory / "aliases.yaml", config)


@pytest.mark.e2e
def test_hosts_named_by_ssh_aliases_train_on_their_hostnames(aliased, tmp_path):
    sim, yaml_path = aliased
    script = write_script(tmp_path, "tiny_train.py", TINY_TRAIN)
    expected = [f"{h.address}:{sim.port_base + h.index}" for h in sim.hosts]

    shown = run_cli(["--dry-run", "--json", str(yaml_path), str(script)], cwd=tmp_path,
                    timeout=60)
    assert shown.returncode == 0, shown.stderr
    plan = json.loads(shown.stdout)
    assert plan["tf_config"]["cluster"]["worker"] == expected
    assert [(h["name"], h["tf_address"], h["address_rule"]) for h in plan["hosts"]] == [
        (f"gpu{h.index}", h.address, "ssh_config") for h in sim.hosts]

    run_dir = tmp_path / "run"
    done = run_cli(["--run-dir", str(run_dir), str(yaml_path), str(script)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    digests = dict(re.findall(r"(gpu\d)/worker\d\s*\| weights digest (\w+)", done.stdout))
    assert set(digests) == {"gpu0", "gpu1"} and len(set(digests.values())) == 1, done.stdout
    (launch,) = [e for e in read_events(run_dir) if e["event"] == "launch"]
    assert [(t["address"], t["address_rule"]) for t in launch["tasks"]] == [
        (h.address, "ssh_config") for h in sim.hosts]


LOCAL = """\
name: {name}
transport: local
{top}hosts:
  - {{address: localhost{own}}}
  - {{address: localhost}}
"""
PRINT_TF_CONFIG = "import os\nprint('TF_CONFIG', os.environ['TF_CONFIG'], flush=True)\n"


def test_a_named_interface_puts_its_address_into_tf_config(tmp_path: Path):
    yaml_path = tmp_path / "lo.yaml"
    yaml_path.write_text(LOCAL.format(name="lo", top="network_interface: lo\n", own=""))
    script = write_script(tmp_path, "show.py", PRINT_TF_CONFIG)
    shown = run_cli(["--dry-run", str(yaml_path), str(script)], cwd=tmp_path, timeout=60)
    assert "host0  <address of lo on host0>  [network_interface:" in shown.stdout, shown.stdout

    run_dir = tmp_path / "run"
    done = run_cli(["--run-dir", str(run_dir), str(yaml_path), str(script)], cwd=tmp_path,
                   timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    configs = [json.loads(line.split("TF_CONFIG ", 1)[1])
               for line in done.stdout.splitlines() if "| TF_CONFIG " in line]
    assert len(configs) == 2
    # The loopback interface's address, not the `localhost` the hosts are listed by.
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", a)
               for c in configs for a in c["cluster"]["worker"]), configs


def test_a_missing_interface_is_refused_before_any_task_starts(tmp_path: Path):
    yaml_path = tmp_path / "eth9.yaml"
    yaml_path.write_text(LOCAL.format(name="eth9", top="", own=", network_interface: eth9"))
    script = write_script(tmp_path, "mark.py", "open('ran', 'w').write('x')\n")
    done = run_cli(["--run-dir", str(tmp_path / "run"), str(yaml_path), str(script)],
                   cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(r"host0: it has no network interface eth9 \(the host's "
                     r"network_interface\); it has lo \(127\.0\.0\.1\)", done.stderr), done.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.e2e
def test_check_tests_aliased_hosts_on_their_hostnames(aliased, tmp_path):
    """`check` reaches peers and runs its collective on the TF_CONFIG addresses
    (the ssh config's HostNames), not on the aliases the cluster file lists."""
    sim, yaml_path = aliased
    done = run_cli(["check", str(yaml_path)], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for h in sim.hosts:
        line = next(line.split() for line in done.stdout.splitlines()
                    if line.split()[:1] == [f"gpu{h.index}/worker{h.index}"])
        assert line[1:3] == [f"{h.address}:{sim.port_base + h.index}", "ok"], done.stdout
    assert "verdict: ready" in done.stdout, done.stdout
