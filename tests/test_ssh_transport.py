"""The SSH transport against real OpenSSH sshds on loopback (simulated hosts).

Everything goes through the real CLI in a subprocess, except the upload and
ProxyJump checks, which use the transport's API to look at what it did.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from launcher.spec.config import load_config
from launcher.spec.plan import HostTarget, host_run_dir, host_targets
from launcher.tools.sshsim import generate_key
from launcher.transport import TransportError
from launcher.transport._paramiko import paramiko
from launcher.transport.shipping import bundle_id
from launcher.transport.ssh import SSHTransport
from launcher.transport.ssh_connect import Connector, _aead_first
from launcher.transport.ssh_endpoint import Refused, SSHConfigs, merge_endpoint, parse_jump
from launcher.transport.sshbundle import agent_command
from tests.conftest import read_events, run_cli, start_cli, wait_for
from tests.sshcluster import (
    MARKER,
    SLEEPER,
    TINY_TRAIN,
    make_venv,
    sim_cluster,
    write_script,
    write_yaml,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sim_cluster(tmp_path_factory.mktemp("sim"), 2) as sim:
        yield sim


@pytest.fixture
def marker_dir(tmp_path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


def run_marker(cluster, tmp_path: Path, config: dict, marker_dir: Path):
    yaml_path = write_yaml(tmp_path / "cluster.yaml", config)
    script = write_script(tmp_path, "marker.py", MARKER)
    run_dir = tempfile.mkdtemp(prefix="run-", dir=tmp_path)  # a fresh one per launch
    return run_cli(["--run-dir", run_dir, str(yaml_path), str(script),
                    str(marker_dir)], cwd=tmp_path)


def fingerprint_of(public_key_file: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(public_key_file)], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[1]


# --------------------------------------------------------------------- a real job


@pytest.mark.e2e
def test_two_host_training_over_ssh_ends_with_identical_weights(cluster, tmp_path):
    script = write_script(tmp_path, "tiny_train.py", TINY_TRAIN)
    done = run_cli(["--run-dir", str(tmp_path / "run"), str(cluster.yaml_path), str(script)],
                   cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    digests = dict(re.findall(r"(host\d)/worker\d\s*\| weights digest (\w+)", done.stdout))
    assert set(digests) == {"host0", "host1"}, done.stdout
    assert digests["host0"] == digests["host1"]


# --------------------------------------------------------------------- host keys


def test_unknown_host_key_is_refused_under_strict(cluster, tmp_path, marker_dir):
    config = cluster.config_dict()
    config["ssh"]["known_hosts"] = str(tmp_path / "empty_known_hosts")
    done = run_marker(cluster, tmp_path, config, marker_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    host = cluster.hosts[0]
    assert "host0: unknown host key" in done.stderr
    assert "ssh-ed25519" in done.stderr
    assert fingerprint_of(host.dir / "ssh_host_ed25519_key.pub") in done.stderr
    assert f"ssh-keyscan -p {host.port} {host.address} >> " in done.stderr
    assert "host1: unknown host key" in done.stderr  # every bad host is named
    assert list(marker_dir.iterdir()) == []


def test_accept_new_records_unknown_keys_then_strict_accepts_them(cluster, tmp_path,
                                                                  marker_dir):
    known = tmp_path / "ssh" / "known_hosts"  # neither the file nor its folder exist yet
    config = cluster.config_dict()
    config["ssh"].update(known_hosts=str(known), host_key_policy="accept-new")
    done = run_marker(cluster, tmp_path, config, marker_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = set(known.read_text().splitlines())
    assert recorded == {f"[{h.address}]:{h.port} {h.host_key_line}" for h in cluster.hosts}
    assert known.stat().st_mode & 0o777 == 0o600
    config["ssh"]["host_key_policy"] = "strict"
    again = run_marker(cluster, tmp_path, config, marker_dir)
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_changed_host_key_is_refused_under_every_policy(cluster, tmp_path, marker_dir, policy):
    impostor = generate_key(tmp_path / "impostor", "impostor")
    host0, host1 = cluster.hosts
    known = tmp_path / "known_hosts"
    known.write_text(f"[{host0.address}]:{host0.port} {impostor}\n"
                     f"[{host1.address}]:{host1.port} {host1.host_key_line}\n")
    config = cluster.config_dict()
    config["ssh"].update(known_hosts=str(known), host_key_policy=policy)
    done = run_marker(cluster, tmp_path, config, marker_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"host0: HOST KEY CHANGED for [{host0.address}]:{host0.port}" in done.stderr
    assert fingerprint_of(host0.dir / "ssh_host_ed25519_key.pub") in done.stderr
    assert f"ssh-keygen -f {known} -R '[{host0.address}]:{host0.port}'" in done.stderr
    assert "host1" not in done.stderr
    assert known.read_text().count("\n") == 2  # nothing was recorded
    assert list(marker_dir.iterdir()) == []


# --------------------------------------------------------------------- bad hosts


def _with_bad_host(cluster, tmp_path: Path, kind: str) -> tuple[dict, str, str]:
    """(config, bad host's name, expected words) for one kind of bad host."""
    config = copy.deepcopy(cluster.config_dict())
    host1 = config["hosts"][1]
    if kind == "wrong-python":
        host1["python"] = "/usr/bin/pythn"
        return config, "host1", "python '/usr/bin/pythn' not found on host1 (127.0.0.3)"
    if kind == "unreachable":
        # Nothing listens on this loopback address: the connection is refused.
        config["hosts"].append({"address": "127.0.0.250", "name": "ghost"})
        return config, "ghost", "connection refused by 127.0.0.250"
    if kind == "rejected-key":
        generate_key(tmp_path / "stranger_key", "stranger")
        host1["identity_file"] = str(tmp_path / "stranger_key")
        return config, "host1", f"authentication as {cluster.user!r} rejected by 127.0.0.3"
    if kind == "no-tensorflow":
        host1["python"] = str(make_venv(tmp_path / "bare-venv"))
        return config, "host1", "TensorFlow is not installed for python"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["wrong-python", "unreachable", "rejected-key",
                                  "no-tensorflow"])
def test_a_bad_host_is_named_before_anything_runs(cluster, tmp_path, marker_dir, kind):
    config, bad, words = _with_bad_host(cluster, tmp_path, kind)
    done = run_marker(cluster, tmp_path, config, marker_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "1 host not ready" in done.stderr
    assert f"{bad}: " in done.stderr and words in done.stderr, done.stderr
    assert list(marker_dir.iterdir()) == []  # no task started anywhere


def test_two_bad_hosts_are_both_named(cluster, tmp_path, marker_dir):
    config = cluster.config_dict()
    config["hosts"][1]["python"] = "/usr/bin/pythn"
    config["hosts"].append({"address": "127.0.0.250", "name": "ghost"})
    done = run_marker(cluster, tmp_path, config, marker_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "2 hosts not ready" in done.stderr
    assert "host1: python '/usr/bin/pythn' not found" in done.stderr
    assert "ghost: connection refused by 127.0.0.250" in done.stderr
    assert "host0" not in done.stderr.split("not ready")[1]
    assert list(marker_dir.iterdir()) == []


def test_ctrl_c_while_a_host_hangs_in_the_handshake_stops_at_once(cluster, tmp_path,
                                                                   marker_dir):
    host1 = cluster.hosts[1]
    listener = host1.listener_pid()
    config = cluster.config_dict()
    config["ssh"]["connect_timeout_s"] = 30
    yaml_path = write_yaml(tmp_path / "cluster.yaml", config)
    script = write_script(tmp_path, "marker.py", MARKER)
    # host1's sshd is frozen: the kernel accepts the TCP connection, no SSH
    # banner ever comes, and the handshake would wait 15 s before giving up.
    os.kill(listener, signal.SIGSTOP)
    try:
        run_dir = tmp_path / f"run-{tmp_path.name}"
        proc = start_cli(["--run-dir", str(run_dir), str(yaml_path), str(script),
                          str(marker_dir)], cwd=tmp_path)
        wait_for(lambda: agents_of(run_dir.name), timeout=30, what="host0's agent up")

        def handshaking_with_host1() -> bool:
            return any(c.status == psutil.CONN_ESTABLISHED and c.raddr
                       and (c.raddr.ip, c.raddr.port) == (host1.address, host1.port)
                       for c in psutil.Process(proc.pid).net_connections("tcp"))

        wait_for(handshaking_with_host1, timeout=30, what="the launcher stuck on host1's sshd")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=12)  # under the 15 s of the handshake (a loaded CI)
        assert proc.returncode == 130, output
        # host0's agent, up and waiting, went with the launcher's connection.
        wait_for(lambda: not agents_of(run_dir.name), timeout=10, what="host0's agent gone")
    finally:
        os.kill(listener, signal.SIGCONT)


def agents_of(run_name: str) -> list[int]:
    marker = f"/.mgpu-launch/runs/{run_name}-"
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "launcher.agent" in (p.info["cmdline"] or [])
            and any(marker in a for a in p.info["cmdline"])]


# --------------------------------------------------------------------- dropped connection


def test_killing_a_hosts_ssh_session_kills_its_tasks(cluster, tmp_path):
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    run_dir = tmp_path / "run"
    cli = start_cli(["--run-dir", str(run_dir), "--max-restarts", "0", str(cluster.yaml_path),
                     str(script)], cwd=tmp_path)
    try:
        def started() -> dict[str, int]:
            found = {e["host"]: e["pid"] for e in read_events(run_dir)
                     if e["event"] == "task_started"}
            return found if len(found) == 2 else {}

        pids = wait_for(started, 60, "both tasks to start")
        task = psutil.Process(pids["host1"])
        wait_for(lambda: task.children(), 10, "the task's own child process")
        victims = [task, *task.children(recursive=True)]
        agent = task.parent()
        session = agent.parent()
        assert "launcher.agent" in " ".join(agent.cmdline())
        assert session.name().startswith("sshd") and session.pid in cluster.session_pids(1)
        session.send_signal(signal.SIGKILL)

        def all_gone() -> bool:
            return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
                       for p in victims)

        wait_for(all_gone, 30, "host1's task processes to die")
        assert cli.wait(timeout=60) == 1  # the host is reported lost; the job fails
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    output = cli.stdout.read()
    assert "host1" in output and "lost its host" in output, output


# --------------------------------------------------------------------- API-level checks


def agent_pids(run_dir: str) -> list[int]:
    """The agents started for the run in `run_dir` (the simulated hosts' are
    this machine's processes), by their command line."""
    prefix = host_run_dir(run_dir, "ssh", "")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "launcher.agent" in argv and "--run-dir" in argv and \
                argv[argv.index("--run-dir") + 1].startswith(prefix):
            found.append(int(pid))
    return found


def _targets(cluster) -> tuple[HostTarget, ...]:
    return host_targets(load_config(cluster.yaml_path).config, "python3")


def test_bundle_is_uploaded_once_private_and_reused(cluster, tmp_path):
    cache = f"mgpu-test-cache-{tmp_path.name}"
    root = Path.home() / cache
    events: queue.Queue = queue.Queue()
    # What earlier launcher versions left: one bundle unused for 40 days (dropped
    # when a new bundle is uploaded), one used yesterday (kept), a stray folder.
    month_ago, yesterday = time.time() - 40 * 86400, time.time() - 86400
    for name, when in (("0.0.8-aaaaaaaaaaaa", month_ago), ("0.0.9-bbbbbbbbbbbb", yesterday),
                       ("notes", month_ago)):
        (root / name / "launcher").mkdir(parents=True)
        os.utime(root / name, (when, when))
    # A symlink named like an old bundle: never followed into its target.
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "launcher").mkdir(parents=True)
    (elsewhere / "launcher" / "keep.txt").write_text("mine")
    (root / "0.0.7-cccccccccccc").symlink_to(elsewhere)
    os.utime(root / "0.0.7-cccccccccccc", (month_ago, month_ago), follow_symlinks=False)
    try:
        for _ in range(2):
            transport = SSHTransport(remote_cache=cache)
            links = transport.connect(_targets(cluster), str(tmp_path / "run"), events)
            assert set(links) == {"host0", "host1"}
            for link in links.values():
                link.close()
            transport.close()
            agent = root / bundle_id() / "launcher" / "agent" / "__main__.py"
            if _ == 0:
                first_inode = agent.stat().st_ino
        assert agent.stat().st_ino == first_inode  # reused, not uploaded again
        assert agent.stat().st_mode & 0o777 == 0o600
        assert (root / bundle_id()).stat().st_mode & 0o777 == 0o700
        # No staging left over; the stale bundle is gone, the rest untouched.
        assert sorted(p.name for p in root.iterdir()) == sorted(
            [bundle_id(), "0.0.9-bbbbbbbbbbbb", "notes", "0.0.7-cccccccccccc"])
        assert (elsewhere / "launcher" / "keep.txt").read_text() == "mine"
        assert (root / bundle_id() / ".mgpu-bundle").stat().st_mode & 0o777 == 0o600
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=True)


def test_the_connection_to_an_openssh_host_is_aes_gcm(cluster):
    # A bulk stream (the memory tier's peer copies) costs half the CPU on both
    # ends with AES-GCM than with paramiko's own first choice, aes128-ctr + HMAC.
    connector = Connector()
    try:
        transport, _ = connector.open(_targets(cluster)[0])
    finally:
        connector.close()
    try:
        assert (transport.local_cipher, transport.remote_cipher) == (
            "aes128-gcm@openssh.com", "aes128-gcm@openssh.com")
    finally:
        transport.close()


def test_the_aead_ciphers_go_first_and_the_rest_keep_paramikos_order():
    assert _aead_first(("aes128-ctr", "aes256-ctr")) == ("aes128-ctr", "aes256-ctr")
    assert _aead_first(("aes128-ctr", "aes256-gcm@openssh.com", "aes128-gcm@openssh.com")) == (
        "aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr")


def test_proxy_jump_goes_through_the_jump_host(cluster, tmp_path):
    host0, host1 = cluster.hosts
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host behind-the-bastion\n  HostName {host1.address}\n  Port {host1.port}\n"
        f"  ProxyJump {cluster.user}@{host0.address}:{host0.port}\n")
    target = _targets(cluster)[1]
    target = dataclasses.replace(target, address="behind-the-bastion",
                                 ssh_config_file=str(ssh_config))
    transport = SSHTransport()
    events: queue.Queue = queue.Queue()
    links = transport.connect([target], str(tmp_path / "run"), events)
    try:
        # The connection to host1's sshd is held by host0's sshd, not by us.
        jump_pids = set(cluster.session_pids(0))
        held = [c for pid in jump_pids for c in psutil.Process(pid).net_connections("tcp")
                if c.raddr and (c.raddr.ip, c.raddr.port) == (host1.address, host1.port)]
        assert held, "no connection from the jump host to host1"
        assert links["host1"].hello["host"] == "host1"
    finally:
        for link in links.values():
            link.close()
        transport.close()


def test_a_host_defined_in_an_included_ssh_config_is_reached(cluster, tmp_path):
    host1 = cluster.hosts[1]
    (tmp_path / "hosts.d").mkdir()
    (tmp_path / "hosts.d" / "lab.conf").write_text(
        f"Host lab-node\n  HostName {host1.address}\n  Port {host1.port}\n")
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Include {tmp_path}/hosts.d/*.conf\n")
    target = dataclasses.replace(_targets(cluster)[1], address="lab-node",
                                 ssh_config_file=str(ssh_config))
    transport = SSHTransport()
    links = transport.connect([target], str(tmp_path / "run"), queue.Queue())
    try:
        assert links["host1"].hello["host"] == "host1"
        assert links["host1"].hello["run_dir"].startswith(str(Path.home()))
    finally:
        for link in links.values():
            link.close()
        transport.close()


def test_transport_error_names_the_host_and_keeps_the_others_closed(cluster, tmp_path):
    targets = list(_targets(cluster))
    targets[0] = dataclasses.replace(targets[0], python="/nonexistent/python")
    with pytest.raises(TransportError) as caught:
        SSHTransport().connect(targets, str(tmp_path / "run"), queue.Queue())
    assert [p.host for p in caught.value.problems] == ["host0"]


def test_a_launch_refused_before_it_reaches_the_hosts_says_only_the_refusal(
        cluster, tmp_path, marker_dir):
    # A refusal found after the cluster file is read (a bad --metrics-port)
    # is said alone, exit 2, and a host that cannot be reached is not named:
    # the launch never got to it. A run directory in use is refused too.
    config = cluster.config_dict()
    config["hosts"].append({"address": "127.0.0.250", "name": "ghost"})
    yaml_path = write_yaml(tmp_path / "cluster.yaml", config)
    script = write_script(tmp_path, "marker.py", MARKER)
    run_dir = tmp_path / "run"
    done = run_cli(["--run-dir", str(run_dir), "--metrics-port", "70000", str(yaml_path),
                    str(script), str(marker_dir)], cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == ("mgpu-launch: --metrics-port 70000: give a port from 1 "
                                   "to 65535 (or 0 for any free port)"), done.stderr
    assert not run_dir.exists()
    # No host was reached: no agent, no run folder on a host.
    assert not agent_pids(str(run_dir))
    remote = Path(os.path.expanduser(host_run_dir(str(run_dir), "ssh", "host0"))).parent
    assert not remote.exists(), sorted(remote.rglob("*"))
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("an earlier run's")
    done = run_cli(["--run-dir", str(run_dir), str(yaml_path), str(script), str(marker_dir)],
                   cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"run directory {run_dir} is not empty" in done.stderr
    assert "ghost" not in done.stderr
    assert list(marker_dir.iterdir()) == []


# --------------------------------------------------------------------- pure pieces


def test_agent_command_quotes_every_value():
    command = agent_command("/opt/my python/bin/python3", "x/0.1.0-abc", "h; rm -rf /",
                            "~/.mgpu-launch/runs/r/h", 2.0)
    # One process: the interpreter checks the cache, then runs the agent (light start).
    assert command.startswith("exec '/opt/my python/bin/python3' -S -c 'import os,sys\n")
    assert "' launcher.agent --host 'h; rm -rf /' " in command
    assert 'c=b+"/"+"x/0.1.0-abc"' in command and "sys.exit(98)" in command
    assert 'b="" or os.environ.get("HOME","")' in command  # the cache under $HOME
    uploaded = agent_command("python3", "x/v", "h", "~/r", 2.0, home="/srv/home dir")
    assert 'b="/srv/home dir" or ' in uploaded  # where SFTP put the bundle
    assert "--run-dir '~/.mgpu-launch/runs/r/h'" in command  # the agent expands ~
    for tool in ("find", "id -u", "head", "$(", "env "):
        assert tool not in command  # no process but the interpreter per login


def test_the_agent_command_runs_no_code_from_a_cache_others_could_write(tmp_path: Path):
    """The remote command's check, run by a real bash with HOME in a temp folder
    and a real interpreter; the bundle's stand-in agent prints its argv."""
    cache = ".cache/mgpu-launch/code/0.1.0-abc"
    bundle = tmp_path / cache
    (bundle / "launcher" / "agent").mkdir(parents=True, mode=0o700)
    for folder in (tmp_path / ".cache/mgpu-launch", tmp_path / ".cache/mgpu-launch/code"):
        folder.chmod(0o700)
    agent = bundle / "launcher" / "agent" / "__main__.py"
    for path in (bundle / "launcher" / "__init__.py", bundle / "launcher" / "agent" / "__init__.py",
                 agent):
        path.write_text(
            "import os, sys\n\n\ndef run():\n"
            "    print('agent', sys.argv[1:], os.environ['PYTHONPATH'])\n"
            if path == agent else "")
        path.chmod(0o600)
    command = agent_command(sys.executable, cache, "h", "~/r", 2.0)

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], env={**os.environ, "HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=30)

    ran = run()
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[:2] == ["agent", "['--host',"], ran.stdout  # its run()
    assert ran.stdout.rstrip().endswith(str(bundle))  # the tasks' PYTHONPATH
    agent.chmod(0o620)  # group-writable: someone else could plant code there
    refused = run()
    assert refused.returncode == 97 and str(agent) in refused.stderr, refused.stderr
    assert "agent" not in refused.stdout
    agent.chmod(0o600)
    os.chown(tmp_path / ".cache/mgpu-launch/code", 65534, 65534)  # another user's folder
    refused = run()
    assert refused.returncode == 97 and "mgpu-launch/code" in refused.stderr, refused.stderr
    os.chown(tmp_path / ".cache/mgpu-launch/code", os.getuid(), os.getgid())
    agent.unlink()
    missing = run()
    assert missing.returncode == 98 and f"no bundle; HOME={tmp_path}" in missing.stderr


def _target(**changes) -> HostTarget:
    base = dict(name="n1", address="node1", python="python3", gpus=(), ssh_user=None,
                ssh_port=22, identity_file=None, known_hosts="~/.ssh/known_hosts",
                host_key_policy="strict", ssh_config_file=None, connect_timeout_s=10.0)
    return HostTarget(**{**base, **changes})


def test_yaml_values_win_over_the_ssh_config():
    options = {"hostname": "10.0.0.5", "user": "cfguser", "port": "2200",
               "identityfile": ["~/.ssh/cfg_key"], "proxyjump": "bastion"}
    ep = merge_endpoint(_target(), options, "me")
    assert (ep.hostname, ep.user, ep.port, ep.proxy_jump) == ("10.0.0.5", "cfguser", 2200,
                                                              "bastion")
    ep = merge_endpoint(_target(ssh_user="yamluser", ssh_port=2222, identity_file="/k"),
                        options, "me")
    assert (ep.user, ep.port) == ("yamluser", 2222)
    assert ep.identity_files[0] == "/k" and ep.identity_files[1].endswith("/.ssh/cfg_key")
    assert merge_endpoint(_target(), {}, "me").user == "me"
    assert merge_endpoint(_target(), {}, "me").known_hosts_name == "node1"
    assert merge_endpoint(_target(ssh_port=2222), {}, "me").known_hosts_name == "[node1]:2222"


def test_a_proxy_command_is_refused_not_skipped(tmp_path):
    config = tmp_path / "config"
    config.write_text("Host node1\n  ProxyCommand ssh -W %h:%p bastion\n"
                      "Host both\n  ProxyCommand ssh -W %h:%p bastion\n  ProxyJump other\n"
                      "Host off\n  ProxyCommand none\n")
    configs = SSHConfigs()
    for name in ("node1", "both"):  # with a ProxyJump too, OpenSSH takes the first one
        with pytest.raises(Refused, match=r"a ProxyCommand.*use `ProxyJump BASTION`"):
            merge_endpoint(_target(address=name), configs.lookup(str(config), name), "me")
    off = merge_endpoint(_target(address="off"), configs.lookup(str(config), "off"), "me")
    assert off.proxy_jump is None and off.hostname == "off"


def test_parse_jump():
    assert parse_jump("bastion") == (None, "bastion", None)
    assert parse_jump("me@bastion:2222") == ("me", "bastion", 2222)
    assert parse_jump("[::1]:22") == (None, "::1", 22)


def test_ssh_config_includes_follow_globs_home_relative_paths_and_block_scope(
        tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh = tmp_path / ".ssh"
    (ssh / "config.d").mkdir(parents=True)
    (ssh / "extra").mkdir()
    (ssh / "config.d" / "a.conf").write_text("Host gpu-1\n  HostName 10.0.0.1\n")
    (ssh / "config.d" / "b.conf").write_text("Host gpu-2\n  HostName 10.0.0.2\n")
    (ssh / "extra" / "port.conf").write_text("Port 2200\n")
    (ssh / "config").write_text(
        "Include config.d/*.conf\n"
        "ServerAliveInterval 7\n"  # top level again after the Include: every host
        "Host gpu-*\n"
        "  User trainer\n"
        "  Include extra/port.conf\n"  # inside the block: for gpu-* only
        "  IdentityFile ~/.ssh/gpu_key\n")  # still the gpu-* block after the Include
    configs = SSHConfigs()
    gpu1 = configs.lookup("~/.ssh/config", "gpu-1")
    assert gpu1["hostname"] == "10.0.0.1" and gpu1["user"] == "trainer"
    assert gpu1["port"] == "2200" and gpu1["serveraliveinterval"] == "7"
    assert gpu1["identityfile"] == [str(ssh / "gpu_key")]
    assert configs.lookup("~/.ssh/config", "gpu-2")["hostname"] == "10.0.0.2"
    other = configs.lookup("~/.ssh/config", "other")
    assert other["hostname"] == "other" and other["serveraliveinterval"] == "7"
    assert not {"user", "port", "identityfile"} & other.keys()


def test_each_globbed_include_starts_in_the_including_block(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "1.conf").write_text("Host a\n  HostName 10.0.0.1\n")
    (tmp_path / "d" / "2.conf").write_text("User shared\nHost b\n  HostName 10.0.0.2\n")
    config = tmp_path / "config"
    config.write_text(f"Include {tmp_path}/d/*.conf\n")
    configs = SSHConfigs()
    # 2.conf's first line is top level: every host, not only the `Host a` of 1.conf.
    assert configs.lookup(str(config), "b")["user"] == "shared"
    assert configs.lookup(str(config), "elsewhere")["user"] == "shared"


# (extra files, the config, the host looked up, what the refusal says)
BAD_SSH_CONFIGS = {
    # OpenSSH would nest foo.conf's blocks under `Host bar`; paramiko cannot.
    "block-in-a-scoped-include": (
        {"foo.conf": "Host foo\n  User fromfoo\n"}, "Host bar\n  Include {dir}/foo.conf\n",
        "foo", r"foo.conf opens `Host foo` but is included inside `Host bar`.*"
               r"include it at top level"),
    "writable-by-others": (
        {"hosts.conf": "Host a\n  HostName 10.0.0.1\n"}, "Include {dir}/hosts.conf\n",
        "a", r"hosts.conf may be written by other users.*chmod go-w"),
    "includes-itself": (
        {}, "Include {dir}/config\n",
        "a", r"cannot read the ssh config .*config: Include nested more than 16 deep"),
}


@pytest.mark.parametrize("case", sorted(BAD_SSH_CONFIGS))
def test_a_bad_ssh_config_is_refused_not_misread(tmp_path, case):
    files, text, host, message = BAD_SSH_CONFIGS[case]
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    if case == "writable-by-others":
        (tmp_path / "hosts.conf").chmod(0o666)
    (tmp_path / "config").write_text(text.format(dir=tmp_path))
    with pytest.raises(Refused, match=message):
        SSHConfigs().lookup(str(tmp_path / "config"), host)


def test_match_exec_in_the_ssh_config_is_refused_with_a_way_out(tmp_path):
    assert paramiko.config.invoke is None  # the launcher imported paramiko without it
    config = tmp_path / "config"
    config.write_text("Match exec \"test -f /nonexistent\"\n  User someone\n")
    with pytest.raises(Refused, match=r"uses `Match exec`, which mgpu-launch does not support"):
        SSHConfigs().lookup(str(config), "node1")


def test_a_host_whose_sftp_home_is_not_the_shells_home_still_runs(tmp_path_factory, tmp_path,
                                                                    marker_dir):
    """The shell's $HOME (set by sshd) and SFTP's start directory differ: the
    bundle goes where SFTP puts it and the agent runs from there, by its
    absolute path. Today's launcher failed with "exited with 98"."""
    shell_home, sftp_home = (tmp_path_factory.mktemp(name) for name in ("shell", "sftp"))
    for home in (shell_home, sftp_home):
        home.chmod(0o700)
    with sim_cluster(tmp_path_factory.mktemp("sim-homes"), 1, sftp_start_dir=str(sftp_home),
                     session_home=str(shell_home)) as sim:
        done = run_marker(sim, tmp_path, sim.config_dict(), marker_dir)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (marker_dir / "host0").read_text() == "ran"
        assert list(sftp_home.glob(".cache/mgpu-launch/code/*/launcher/agent/__main__.py"))
        assert not (shell_home / ".cache").exists()
        again = run_marker(sim, tmp_path, sim.config_dict(), marker_dir)  # uploaded already
        assert again.returncode == 0, again.stdout + again.stderr
