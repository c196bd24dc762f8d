"""The worker image of docker/, built and run by a real container engine: podman.

No image registry is reachable from the machines this project is tested on, so
the base image is made here from Debian's packages (`mmdebstrap`, with the
machine's own apt sources, `tar | podman import`) and docker/Dockerfile builds on
it through its BASE_IMAGE argument; pip inside the build installs TensorFlow from
PyPI. The base also gets this machine's CA bundle, as a site's own base image
carries its proxy's CA.

Podman here needs two settings (docs/export-and-docker.md): the `runc` runtime
(`crun` refuses this kernel's hybrid cgroups) and no default ulimits (raising
RLIMIT_NOFILE/NPROC is not permitted): a containers.conf passed as CONTAINERS_CONF.

Caching, so that CI builds once per run and a rerun is cheap:
- the base image's tag is a digest of what it is made from (the suite, the
  packages, the CA bundle): when podman already holds that tag, it is used as is;
- the image is built once per pytest session; podman's own layer cache keeps the
  dependency layer (TensorFlow) until pyproject.toml or the base changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
# Python 3.11 with pip, and CA certificates: what docker/Dockerfile needs of a base.
PACKAGES = ("python3", "python3-pip", "ca-certificates")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
IMAGE = "localhost/mgpu-launch-worker:test"
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
runtime = "runc"
"""
BUILD_TIMEOUT_S = 1500  # a cold build downloads TensorFlow and its dependencies
TOOLS = ("podman", "runc", "mmdebstrap")


@dataclass
class Built:
    image: str
    base: str
    base_s: float | None  # seconds to make the base; None: already there
    build_s: float
    env: dict[str, str]


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def podman_env(conf_dir: Path) -> dict[str, str]:
    conf = conf_dir / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(env: dict[str, str], *args: str, timeout: float = 120,
           check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({done.returncode}):\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def base_tag() -> str:
    digest = hashlib.sha256()
    digest.update(f"{SUITE} minbase {' '.join(PACKAGES)}\n".encode())
    digest.update(CA_BUNDLE.read_bytes() if CA_BUNDLE.exists() else b"")
    return f"localhost/mgpu-test-base:{SUITE}-{digest.hexdigest()[:12]}"


def make_base(env: dict[str, str], work: Path) -> tuple[str, float | None]:
    """The base image (its tag), and the seconds it took (None: it was there)."""
    tag = base_tag()
    if podman(env, "image", "exists", tag, check=False).returncode == 0:
        return tag, None
    start = time.monotonic()
    tarball = work / "base.tar"
    hooks = []
    if CA_BUNDLE.exists():
        hooks = [f"--customize-hook=copy-in {CA_BUNDLE} {CA_BUNDLE.parent}"]
    done = subprocess.run(["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                           *hooks, SUITE, str(tarball)], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"mmdebstrap failed:\n{done.stderr[-3000:]}")
    podman(env, "import", str(tarball), tag, timeout=300)
    tarball.unlink()
    return tag, time.monotonic() - start


def build_image(work: Path) -> Built:
    env = podman_env(work)
    base, base_s = make_base(env, work)
    before = podman(env, "image", "inspect", "-f", "{{.Id}}", IMAGE, check=False).stdout.strip()
    start = time.monotonic()
    # --network host: the build's RUN steps reach PyPI and Debian as this machine does.
    podman(env, "build", "--network", "host",
           "--ignorefile", str(REPO / "docker" / "Dockerfile.dockerignore"),
           "--build-arg", f"BASE_IMAGE={base}", "-f", str(REPO / "docker" / "Dockerfile"),
           "-t", IMAGE, str(REPO), timeout=BUILD_TIMEOUT_S)
    build_s = time.monotonic() - start
    after = podman(env, "image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.strip()
    if before and before != after:  # the previous build, untagged now: its own layers go
        podman(env, "rmi", before, check=False)
    return Built(IMAGE, base, base_s, build_s, env)
