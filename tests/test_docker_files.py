"""docker/: what can be checked without a Docker engine (none runs on our machines).

The compose file and the cluster YAML must agree (hosts, user, shared checkpoint
volume, paths in the image), and the image's entry script must really work: it
runs here under plain bash against temporary directories, creates the keys,
writes an sshd config that `sshd -t` accepts, and serves a real SSH login.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath

import yaml

from launcher.spec.config import load_config
from tests.conftest import REPO, wait_for

DOCKER = REPO / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n", "", (DOCKER / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_compose_hosts_match_the_cluster_yaml():
    loaded = load_config(DOCKER / "cluster.yaml")  # must validate as is
    config = loaded.config
    compose = _compose()
    services = compose["services"]
    ssh_hosts = {name: s for name, s in services.items() if s.get("command") == ["sshd"]}
    assert sorted(s["hostname"] for s in ssh_hosts.values()) == ["node1", "node2", "node3"]
    assert sorted(h.address for h in config.hosts) == sorted(s["hostname"] for s in
                                                             ssh_hosts.values())
    assert config.transport == "ssh" and config.ssh.host_key_policy == "strict"

    checkpoint = PurePosixPath(config.checkpoint.dir)
    for name, service in ssh_hosts.items():
        mounts = dict(reversed(v.split(":")[:2]) for v in service["volumes"])
        shared = [target for target in mounts if checkpoint.is_relative_to(target)]
        assert shared, f"{name}: no volume holds checkpoint.dir {checkpoint}"
        # The same named volume on every host: that is what makes it shared.
        assert mounts[shared[0]] in compose["volumes"], name
        assert mounts.get("/keys") == "keys", name
        assert service["depends_on"]["keygen"]["condition"] == "service_completed_successfully"
        env = service["environment"]
        assert env["MGPU_HOSTS"].split(",") == [h.address for h in config.hosts]
        build = service["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == \
            (DOCKER / "Dockerfile").resolve()
    keygen = services["keygen"]
    assert keygen["command"] == ["keygen"] and "keys:/keys" in keygen["volumes"]
    assert keygen["environment"]["MGPU_HOSTS"] == ssh_hosts["node1"]["environment"]["MGPU_HOSTS"]


def test_image_matches_the_cluster_yaml():
    config = load_config(DOCKER / "cluster.yaml").config
    steps = _dockerfile()
    # The base is a build argument whose public default is python:3.11-slim
    # (tests/test_docker_build.py builds on one made from Debian's packages).
    assert steps[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    assert steps[1] == ("FROM", "${BASE_IMAGE}")
    runs = " ".join(args for word, args in steps if word == "RUN")
    assert "openssh-server" in runs
    assert f"useradd --create-home --shell /bin/bash {config.ssh.user}" in runs
    assert ("WORKDIR", config.workdir) in steps
    # The entry script installs the user's key and known_hosts where the YAML looks.
    script = ENTRYPOINT.read_text()
    assert config.ssh.identity_file == "~/.ssh/id_ed25519" and '"$home/.ssh/id_ed25519"' in script
    assert config.ssh.known_hosts == "~/.ssh/known_hosts" and '"$home/.ssh/known_hosts"' in script
    # Everything the image copies is in the repository; README.md because pyproject names it.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for word, args in steps:
        if word == "COPY":
            *sources, _dest = args.split()
            for source in sources:
                if source == pyproject["project"]["readme"]:
                    continue  # the project's README
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    entry = next(args for word, args in steps if word == "ENTRYPOINT")
    assert entry == '["mgpu-entrypoint"]'
    assert "docker/entrypoint.sh /usr/local/bin/mgpu-entrypoint" in runs


def test_dockerfile_installs_the_project_dependencies():
    """Run the Dockerfile's own requirement step here: TF, the launcher's and examples' deps."""
    run = next(args for word, args in _dockerfile()
               if word == "RUN" and "tomllib" in args)
    command = run.split(">")[0].strip()  # python -c "..." before the redirect
    argv = shlex.split(command)
    assert argv[:2] == ["python3", "-c"]
    done = subprocess.run([sys.executable, "-c", argv[2]], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names = {re.split(r"[<>=\[ ]", line)[0] for line in done.stdout.splitlines()}
    assert {"tensorflow", "tf-keras", "paramiko", "pyyaml", "pydantic",
            "scikit-learn"} <= names


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_entry_script_serves_ssh_with_the_generated_keys(tmp_path: Path):
    assert subprocess.run(["bash", "-n", str(ENTRYPOINT)]).returncode == 0
    port = _free_port()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "MGPU_KEYS_DIR": str(tmp_path / "keys"), "MGPU_SSHD_DIR": str(tmp_path / "sshd"),
        "MGPU_USER": getpass.getuser(), "MGPU_USER_HOME": str(home),
        "MGPU_HOSTS": "127.0.0.1", "MGPU_SSH_PORT": str(port), "MGPU_LISTEN": "127.0.0.1",
        # pytest's tmp dirs sit under the world-writable /tmp, which StrictModes refuses.
        "MGPU_SSHD_STRICT_MODES": "no",
    }

    def entry(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ENTRYPOINT), *args], env=env, capture_output=True,
                              text=True, timeout=60)

    missing = entry("sshd", "--check")
    assert missing.returncode == 2 and "run `entrypoint.sh keygen` first" in missing.stderr

    made = entry("keygen")
    assert made.returncode == 0, made.stderr
    keys = tmp_path / "keys"
    assert stat.S_IMODE((keys / "id_ed25519").stat().st_mode) == 0o600
    host_pub = (keys / "ssh_host_ed25519_key.pub").read_text().split()
    assert (keys / "known_hosts").read_text().split() == [f"[127.0.0.1]:{port}", *host_pub[:2]]
    again = entry("keygen")  # idempotent: a restarted keygen keeps the keys
    assert again.returncode == 0 and (keys / "ssh_host_ed25519_key.pub").read_text().split() \
        == host_pub

    checked = entry("sshd", "--check")
    assert checked.returncode == 0, checked.stderr
    assert "config ok" in checked.stdout
    assert stat.S_IMODE((home / ".ssh" / "id_ed25519").stat().st_mode) == 0o600

    sshd = subprocess.Popen(["bash", str(ENTRYPOINT), "sshd"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, 30, f"the entry script's sshd on port {port}")
        login = subprocess.run(
            ["ssh", "-F", "/dev/null", "-p", str(port), "-i", str(home / ".ssh" / "id_ed25519"),
             "-o", f"UserKnownHostsFile={home / '.ssh' / 'known_hosts'}",
             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
             "-o", "IdentitiesOnly=yes", f"{getpass.getuser()}@127.0.0.1", "echo", "logged-in"],
            capture_output=True, text=True, timeout=60)
        assert login.returncode == 0, login.stderr
        assert login.stdout.strip() == "logged-in"
    finally:
        sshd.terminate()
        sshd.wait(timeout=30)
