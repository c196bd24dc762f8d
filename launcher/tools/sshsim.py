"""Simulated SSH hosts: one real OpenSSH `sshd` per loopback address.

`mgpu-launch simulate N [--dir DIR] [--python PY]` starts N private `sshd`s on
127.0.0.2, 127.0.0.3, ... (all of 127.0.0.0/8 is loopback on Linux), each with
its own generated host key, all accepting one generated client key, and writes
a known_hosts file and a matching cluster YAML into DIR. Nothing of the
machine's own SSH setup is read or changed: every file lives in DIR and every
`sshd` runs with `-f DIR/hostN/sshd_config`. (OpenSSH insists on its compiled-in
privilege-separation directory `/run/sshd`; it is created, empty, if missing.)

The same code is the test fixture: `start_cluster(...)` returns a `SimCluster`
that can stop, restart or kill single hosts.

Owns: sshd configs, key generation, the simulated cluster YAML. Must not
import: transport, supervisor, cli.
"""

from __future__ import annotations

import fcntl
import getpass
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

DEFAULT_SSHD = "/usr/sbin/sshd"  # MGPU_SSHD names another (read when a host starts)
PRIVSEP_DIR = "/run/sshd"
START_TIMEOUT_S = 10.0  # an sshd binds its port in a few ms; a loaded machine is slower
STOP_GRACE_S = 5.0  # sshd exits at once on SIGTERM; what a session runs may take a moment

SSHD_CONFIG = """\
# Private sshd of simulated host {name} (mgpu-launch simulate). Not the system's.
ListenAddress {address}:{port}
HostKey {host_key}
# The pid is tracked by the simulator itself.
PidFile none
AuthorizedKeysFile {authorized_keys}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# Simulated hosts log in as the current user, root included, by key only.
PermitRootLogin prohibit-password
# The key files live in a user-chosen directory whose parents may be group-writable.
StrictModes no
# PAM would read the machine's own login configuration.
UsePAM no
# SFTP uploads of the agent bundle need an sftp subsystem; this one needs no binary.
Subsystem sftp internal-sftp{sftp_options}
{session_env}# ProxyJump through a simulated host opens a direct-tcpip channel.
AllowTcpForwarding yes
# Many launchers may connect at once (bench/fanout.py); the default drops beyond 10.
MaxStartups 200:30:400
PrintMotd no
PrintLastLog no
LogLevel {log_level}
"""


@dataclass
class SimHost:
    index: int
    name: str
    address: str
    port: int
    dir: Path
    host_key_line: str  # `ssh-ed25519 AAAA...`
    private_mounts: tuple[str, ...] = ()
    netns: str | None = None  # a network namespace its sshd (and all under it) runs in
    proc: subprocess.Popen | None = None

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.dir / "sshd.pid"

    def listener_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


@dataclass
class SimCluster:
    dir: Path
    hosts: list[SimHost]
    python: str
    client_key: Path
    known_hosts: Path
    yaml_path: Path
    port_base: int
    user: str = field(default_factory=getpass.getuser)

    # ------------------------------------------------------------ configuration

    def config_dict(self) -> dict:
        """The cluster YAML as a dict (tests edit it and write variants)."""
        return {
            "name": "sim",
            "transport": "ssh",
            "python": self.python,
            "ssh": {
                "user": self.user,
                "port": self.hosts[0].port,
                "identity_file": str(self.client_key),
                "known_hosts": str(self.known_hosts),
                "host_key_policy": "strict",
                # Never read the user's own ~/.ssh/config for simulated hosts.
                "config_file": None,
                "connect_timeout_s": 10,
            },
            "hosts": [
                {"address": h.address, "name": h.name,
                 **({"port": h.port} if h.port != self.hosts[0].port else {})}
                for h in self.hosts
            ],
            # Every simulated host shares this machine's filesystem.
            "checkpoint": {"dir": str(self.dir / "checkpoints")},
            # Fixed ports: the launcher cannot ask remote hosts for free ones.
            "ports": {"base": self.port_base},
        }

    def write_yaml(self, path: Path | None = None, config: dict | None = None) -> Path:
        path = path or self.yaml_path
        path.write_text(yaml.safe_dump(config or self.config_dict(), sort_keys=False))
        return path

    # ------------------------------------------------------------ processes

    def start_host(self, index: int) -> None:
        host = self.hosts[index]
        if host.proc is not None and host.proc.poll() is None:
            return
        host.proc = _start_sshd(host)
        host.pid_file.write_text(f"{host.proc.pid}\n")
        _wait_listening(host)

    def stop_host(self, index: int, sig: int = signal.SIGTERM) -> None:
        """Stop a host's sshd listener (open sessions are left alone)."""
        host = self.hosts[index]
        pid = host.proc.pid if host.proc is not None else host.listener_pid()
        if pid is not None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if host.proc is not None:
            try:
                host.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                host.proc.kill()
                host.proc.wait()
            host.proc = None
        host.pid_file.unlink(missing_ok=True)

    def kill_host(self, index: int) -> list[int]:
        """The host dies: SIGKILL its sshd listener and every process under it
        (sessions, the agents they run, their tasks). Returns the pids killed.

        Every process is frozen (SIGSTOP) before any is killed, so none of them
        sees another die and cleans up after it (an agent killing its tasks on
        stdin EOF): a dead machine does nothing either.
        """
        import psutil

        host = self.hosts[index]
        pid = host.proc.pid if host.proc is not None else host.listener_pid()
        victims: list[psutil.Process] = []
        if pid is not None:
            try:
                listener = psutil.Process(pid)
                victims = [listener, *listener.children(recursive=True)]
            except psutil.Error:
                victims = []
        frozen: set[int] = set()
        while len(frozen) < len(victims):  # a child forked before its parent froze
            for proc in victims:
                if proc.pid not in frozen:
                    frozen.add(proc.pid)
                    _signal(proc, signal.SIGSTOP)
            known = {p.pid for p in victims}
            for proc in list(victims):
                try:
                    victims += [c for c in proc.children() if c.pid not in known]
                except psutil.Error:
                    pass
        for proc in victims:
            _signal(proc, signal.SIGKILL)
        if host.proc is not None:
            host.proc.wait(timeout=10)  # reap the listener (our child)
            host.proc = None
        host.pid_file.unlink(missing_ok=True)
        return [p.pid for p in victims]

    def session_pids(self, index: int) -> list[int]:
        """Pids of the sshd processes serving this host's open connections."""
        import psutil

        pid = self.hosts[index].listener_pid()
        if pid is None:
            return []
        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []

    def stop(self) -> None:
        for host in self.hosts:
            self.stop_host(host.index)


def _signal(proc, sig: int) -> None:
    import psutil

    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


def _free_on_all(addresses: list[str], port: int) -> bool:
    for address in [*addresses, ""]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address, port))
            except OSError:
                return False
    return True


def pick_ssh_port(addresses: list[str], start: int = 2222) -> int:
    """The first port from `start` on that is free on every simulated address."""
    for port in range(start, start + 2000):
        if _free_on_all(addresses, port):
            return port
    raise RuntimeError(f"no free port in {start}..{start + 2000} on {addresses}")


def pick_port_base(count: int, start: int = 21000, avoid: tuple[int, ...] = ()) -> int:
    """A base for `count` consecutive task ports free on every interface.

    Below the kernel's ephemeral range (32768+) and above where `ports: auto`
    picks (launcher/transport/ports.py: AUTO_PORTS), so neither outgoing
    connections nor other jobs' auto ports take them before the launch.
    """
    base = start
    while base + count < 32768:
        span = range(base, base + count)
        if not any(p in avoid for p in span) and all(_free_on_all([], p) for p in span):
            return base
        base += count + 1
    raise RuntimeError(f"no {count} consecutive free ports between {start} and 32768")


def generate_key(path: Path, comment: str) -> str:
    """Write an ed25519 private key (0600) and its `.pub`; return `type base64`."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                               serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    Path(f"{path}.pub").write_text(f"{public} {comment}\n")
    return public


def sshd_path() -> str:
    """The sshd every simulated host runs: `MGPU_SSHD`, else /usr/sbin/sshd."""
    return os.environ.get("MGPU_SSHD", DEFAULT_SSHD)


def _start_sshd(host: SimHost) -> subprocess.Popen:
    os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
    argv = [sshd_path(), "-D", "-f", str(host.dir / "sshd_config"),
            "-E", str(host.dir / "sshd.log")]
    if host.private_mounts:
        # This host gets its own mount namespace with an empty tmpfs over each
        # path: the same path names a different directory there, exactly like
        # a directory that is local to each machine instead of shared.
        mounts = " && ".join(f"mkdir -p {_q(p)} && mount -t tmpfs mgpu-private {_q(p)}"
                             for p in host.private_mounts)
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f"{mounts} && exec {' '.join(_q(a) for a in argv)}"]
    if host.netns:
        # A host behind its own network link (tests cut it); `ip netns exec`
        # execs sshd, so the listener's pid is still the Popen's.
        argv = ["ip", "netns", "exec", host.netns, *argv]
    # Own session: a Ctrl-C meant for the simulator's terminal is handled by it.
    # Its stdout/stderr go to a file, never to ours: a detached sshd holding the
    # caller's pipe would keep `simulate --detach | tail` or `$(...)` waiting
    # until the hosts are stopped.
    out = os.open(host.dir / "sshd.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    finally:
        os.close(out)


def _q(value: str) -> str:
    import shlex

    return shlex.quote(value)


def _wait_listening(host: SimHost) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if host.proc is not None and host.proc.poll() is not None:
            log = "".join(path.read_text(errors="replace")[-2000:]
                          for path in (host.dir / "sshd.out", host.dir / "sshd.log")
                          if path.exists())
            raise RuntimeError(f"sshd of {host.name} exited with {host.proc.returncode}: {log}")
        try:
            with socket.create_connection((host.address, host.port), timeout=1.0) as sock:
                if sock.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"sshd of {host.name} is not listening on {host.address}:{host.port}")


def _check_private(directory: Path) -> None:
    """Keys and authorized_keys go here, and an sshd trusts them: refuse a folder
    another user could write to (they could plant a key and log in)."""
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise SystemExit(f"mgpu-launch simulate: {directory} must be yours and not writable by "
                         "others (chmod 700 it, or give a new --dir)")


def start_cluster(
    count: int,
    directory: Path,
    python: str | None = None,
    *,
    first_address: str = "127.0.0.2",
    port: int | None = None,
    port_base: int | None = None,
    private_mounts: dict[int, tuple[str, ...]] | None = None,
    addresses: list[str] | None = None,
    netns: dict[int, str] | None = None,
    log_level: str = "ERROR",
    sftp_start_dir: str | None = None,
    session_home: str | None = None,
) -> SimCluster:
    """Generate keys and configs in `directory` and start `count` sshds.

    `private_mounts` gives some hosts an empty private directory over the given
    paths (see `_start_sshd`); used to simulate a checkpoint dir that is not
    shared. `addresses` replaces the consecutive loopback addresses; `netns`
    runs some hosts' sshd inside an existing network namespace (root only),
    whose address must be reachable from here (a veth pair the caller made).
    `sftp_start_dir` starts SFTP sessions there instead of the home directory,
    `session_home` sets the shells' HOME (as on hosts whose shell and SFTP
    disagree on the home: an sshd that sets HOME, a login script that moves it).
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    _check_private(directory)
    # Held while the hosts start: two `simulate` on one folder never interleave.
    lock = os.open(directory / ".simulate.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another `mgpu-launch simulate` is starting hosts in "
                               f"{directory}; give another --dir") from None
        _refuse_running(directory)
        return _start_cluster(count, directory, python, first_address=first_address,
                              port=port, port_base=port_base, private_mounts=private_mounts,
                              addresses=addresses, netns=netns, log_level=log_level,
                              sftp_start_dir=sftp_start_dir, session_home=session_home)
    finally:
        os.close(lock)


def _start_cluster(count: int, directory: Path, python: str | None, *, first_address: str,
                   port: int | None, port_base: int | None,
                   private_mounts: dict[int, tuple[str, ...]] | None,
                   addresses: list[str] | None, netns: dict[int, str] | None,
                   log_level: str, sftp_start_dir: str | None,
                   session_home: str | None) -> SimCluster:
    netns = netns or {}
    if addresses is None:
        prefix, last = first_address.rsplit(".", 1)
        addresses = [f"{prefix}.{int(last) + i}" for i in range(count)]
        if int(last) + count - 1 > 254:
            raise ValueError(f"{count} hosts from {first_address} run past .254")
    if len(addresses) != count:
        raise ValueError(f"{count} hosts but {len(addresses)} addresses")
    # A namespace's own address cannot be bound from here; its ports are its own.
    port = port or pick_ssh_port([a for i, a in enumerate(addresses) if i not in netns])
    client_key = directory / "client_key"
    client_public = generate_key(client_key, "mgpu-launch-simulate")
    authorized = directory / "authorized_keys"
    authorized.write_text(client_public + "\n")
    os.chmod(authorized, 0o600)
    (directory / "checkpoints").mkdir(exist_ok=True)
    hosts = []
    for i, address in enumerate(addresses):
        host_dir = directory / f"host{i}"
        host_dir.mkdir(exist_ok=True, mode=0o700)
        host_key = host_dir / "ssh_host_ed25519_key"
        line = generate_key(host_key, f"simulated-host{i}")
        (host_dir / "sshd_config").write_text(SSHD_CONFIG.format(
            name=f"host{i}", address=address, port=port, host_key=host_key,
            authorized_keys=authorized, log_level=log_level,
            sftp_options=f" -d {sftp_start_dir}" if sftp_start_dir else "",
            session_env=f"SetEnv HOME={session_home}\n" if session_home else ""))
        hosts.append(SimHost(i, f"host{i}", address, port, host_dir, line,
                             tuple((private_mounts or {}).get(i, ())), netns.get(i)))
    known_hosts = directory / "known_hosts"
    known_hosts.write_text("".join(f"{h.known_hosts_name} {h.host_key_line}\n" for h in hosts))
    os.chmod(known_hosts, 0o600)
    cluster = SimCluster(
        dir=directory, hosts=hosts, python=python or sys.executable, client_key=client_key,
        known_hosts=known_hosts, yaml_path=directory / "cluster.yaml",
        port_base=port_base or pick_port_base(count, avoid=(port,)),
    )
    cluster.write_yaml()
    try:
        for host in hosts:
            cluster.start_host(host.index)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def directory_sshds(directory: Path) -> list:
    """Every process of the simulated cluster in `directory` (psutil.Process):
    the sshds started with one of its `hostN/sshd_config` (found by their
    command line, not by pid files, which a second start could overwrite and
    a reused pid could make point elsewhere) and every process under them
    (open sessions, what they run). The listeners come first."""
    import psutil

    config = re.compile(re.escape(str(Path(directory).resolve())) + r"/host\d+/sshd_config\b")
    matched = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and any(config.search(arg)
                                           for arg in proc.info.get("cmdline") or ()):
            matched.append(proc)
    listeners = _listeners(matched)
    tree, seen = [*listeners, *matched], set()
    for proc in listeners:
        try:
            tree += proc.children(recursive=True)
        except psutil.Error:
            pass
    return [p for p in tree if not (p.pid in seen or seen.add(p.pid))]


def _listeners(processes: list) -> list:
    """The processes whose parent is none of `processes`: each host's sshd."""
    import psutil

    pids = {p.pid for p in processes}
    out = []
    for proc in processes:
        try:
            if proc.ppid() not in pids:
                out.append(proc)
        except psutil.Error:  # gone meanwhile
            pass
    return out


def stop_directory(directory: Path) -> int:
    """Stop a simulated cluster started with --detach: its sshds, their open
    sessions and what those run (SIGTERM, then SIGKILL after STOP_GRACE_S).
    Returns how many hosts (listening sshds) it stopped."""
    import psutil

    processes = directory_sshds(directory)
    hosts = len(_listeners(processes))
    for proc in processes:
        _signal(proc, signal.SIGTERM)
    _, left = psutil.wait_procs(processes, timeout=STOP_GRACE_S)
    for proc in left:
        _signal(proc, signal.SIGKILL)
    psutil.wait_procs(left, timeout=STOP_GRACE_S)
    for pid_file in Path(directory).glob("host*/sshd.pid"):
        pid_file.unlink(missing_ok=True)
    return hosts


def _refuse_running(directory: Path) -> None:
    """A second `simulate` on a folder whose hosts still run would overwrite
    their keys and pid files and start a second set beside them."""
    running = _listeners(directory_sshds(directory))
    if running:
        raise RuntimeError(
            f"{directory} already has {len(running)} simulated host(s) running (sshd pid "
            f"{', '.join(str(p.pid) for p in running)}): use them ({directory / 'cluster.yaml'}),"
            f" or stop them first with `mgpu-launch simulate stop --dir {directory}`, or give "
            "another --dir")
