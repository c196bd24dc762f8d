"""The job's firewall rules (launcher/firewall.py): rendering, the agent's side
with real nftables in a throwaway network namespace, and the launch's refusal
under `security: {tf_ports: cluster}` where an agent cannot install them.

The multi-host tests (an outsider kept out while the job trains) are in
tests/test_firewall_netns.py.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import firewall, fwregistry, fwrules
from launcher.fwrules import Seal, seal_for
from launcher.job.run import fwreport
from tests.agentproc import AgentProc, agent_env
from tests.conftest import PYTHON, run_cli, wait_for
from tests.sshcluster import netns_available

SEAL = Seal("mgpu_train_0123456789", "MGPU-0123456789", (23456, 23457),
            ("10.0.0.2", "10.0.0.3", "fd00::2", "gpu9"), "cluster",
            (("10.0.0.2", 23456), ("10.0.0.3", 23458), ("fd00::2", 23456), ("gpu9", 23459)))


# ---------------------------------------------------------------- rendering


def test_the_nft_table_drops_only_new_connections_to_the_jobs_ports_from_strangers():
    text = fwrules.render_nft(SEAL)
    # Replaced atomically: create-if-missing, delete, create, in one `nft -f`.
    assert text.startswith("table inet mgpu_train_0123456789\n"
                           "delete table inet mgpu_train_0123456789\n")
    assert "type filter hook input priority -10; policy accept;" in text
    # Only SYNs to the job's ports are looked at; everything else passes untouched.
    assert "set ports { type inet_service; elements = { 23456, 23457 }; }" in text
    assert "tcp dport @ports tcp flags & (fin|syn|rst|ack) == syn jump guard" in text
    guard = text.split("chain guard {")[1]
    assert guard.index('iifname "lo" return') < guard.index("counter drop")
    assert "ip saddr { 10.0.0.2, 10.0.0.3 } return" in guard
    assert "ip6 saddr { fd00::2 } return" in guard
    assert "gpu9" not in text  # names are resolved on the host, then passed as addresses
    resolved = fwrules.render_nft(SEAL, ["10.0.0.2", "10.9.9.9"])
    assert "ip saddr { 10.0.0.2, 10.9.9.9 } return" in resolved and "ip6 saddr" not in resolved
    # Loopback is the host's own users: only the job's (the agent's uid) and root.
    mine = fwrules.render_nft(SEAL, uid=1000)
    assert "type filter hook output priority -10; policy accept;" in mine
    assert ('oifname "lo" tcp dport @ports tcp flags & (fin|syn|rst|ack) == syn '
            "jump local") in mine
    # Every host's TF ports, at each of its addresses: the host's other users are
    # refused there too, before the SYN leaves (every host of the job has this table).
    assert ("set cluster4 { type ipv4_addr . inet_service; elements = { 10.0.0.2 . 23456, "
            "10.0.0.3 . 23458 }; }") in mine
    assert "set cluster6 { type ipv6_addr . inet_service; elements = { fd00::2 . 23456 }; }" in mine
    for family in ("ip daddr . tcp dport @cluster4", "ip6 daddr . tcp dport @cluster6"):
        assert f"{family} tcp flags & (fin|syn|rst|ack) == syn jump local" in mine
    local = mine.split("chain local {")[1]
    assert local.index("meta skuid { 0, 1000 } return") < local.index("reject with tcp reset")
    assert "meta skuid { 0 } return" in fwrules.render_nft(SEAL, uid=0)


def test_nft_accepts_the_rendered_table(tmp_path):
    # `nft -c`: parsed and checked by the kernel's rules, installed nowhere.
    done = subprocess.run(["nft", "-c", "-f", "-"], input=fwrules.render_nft(SEAL, uid=1000),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # A 10,000-host cluster: the agent takes its seal, nft its set of addresses.
    many = seal_for("big", "/runs/big", "h1", [30000],
                    [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(10000)], "auto")
    assert Seal.from_json(many.to_json()) == many
    done = subprocess.run(["nft", "-c", "-f", "-"], input=fwrules.render_nft(many, uid=0),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]


def test_iptables_fallback_is_a_chain_jumped_to_for_new_connections_to_the_ports():
    ports = tuple(range(30000, 30020))  # 20 ports: two multiport rules of at most 15
    seal = Seal("mgpu_x_0123456789", "MGPU-0123456789", ports, ("10.0.0.2",), "auto",
                (("10.0.0.2", 30000), ("10.0.0.3", 30001), ("10.0.0.3", 30002)))
    commands = [" ".join(c) for c in fwrules.iptables_commands(seal, ip6=False)]
    # Every SYN leaving goes through the chain of the job's hosts' ports, which
    # sends those to the job's hosts to the guard of local users.
    assert commands[10:14] == [
        "iptables -w -N MGPU-0123456789-C", "iptables -w -F MGPU-0123456789-C",
        "iptables -w -A MGPU-0123456789-C -d 10.0.0.2 -p tcp -m multiport --dports 30000 "
        "-j MGPU-0123456789-L",
        "iptables -w -A MGPU-0123456789-C -d 10.0.0.3 -p tcp -m multiport --dports "
        "30001,30002 -j MGPU-0123456789-L"]
    assert "iptables -w -I OUTPUT 1 -p tcp --syn -j MGPU-0123456789-C" in commands
    assert commands[:4] == ["iptables -w -N MGPU-0123456789", "iptables -w -F MGPU-0123456789",
                            "iptables -w -A MGPU-0123456789 -i lo -j RETURN",
                            "iptables -w -A MGPU-0123456789 -s 10.0.0.2 -j RETURN"]
    assert commands[4] == "iptables -w -A MGPU-0123456789 -j DROP"
    assert commands[5:10] == [
        "iptables -w -N MGPU-0123456789-L", "iptables -w -F MGPU-0123456789-L",
        "iptables -w -A MGPU-0123456789-L -m owner --uid-owner 0 -j RETURN",
        "iptables -w -A MGPU-0123456789-L -m owner --uid-owner JOB_UID -j RETURN",
        "iptables -w -A MGPU-0123456789-L -p tcp -j REJECT --reject-with tcp-reset"]
    assert ("iptables -w -I OUTPUT 1 -o lo -p tcp --syn -m multiport --dports "
            + ",".join(map(str, ports[:15])) + " -j MGPU-0123456789-L") in commands
    jumps = [c for c in commands if " INPUT " in c]
    assert jumps == [
        "iptables -w -I INPUT 1 -p tcp --syn -m multiport --dports "
        + ",".join(map(str, ports[:15])) + " -j MGPU-0123456789",
        "iptables -w -I INPUT 1 -p tcp --syn -m multiport --dports "
        + ",".join(map(str, ports[15:])) + " -j MGPU-0123456789"]
    removal = [" ".join(c) for c in fwrules.iptables_removal(seal, ip6=False)]
    assert removal[-6:] == ["iptables -w -F MGPU-0123456789", "iptables -w -X MGPU-0123456789",
                            "iptables -w -F MGPU-0123456789-C",
                            "iptables -w -X MGPU-0123456789-C",
                            "iptables -w -F MGPU-0123456789-L",
                            "iptables -w -X MGPU-0123456789-L"]
    assert all(r.replace(" -D INPUT ", " -I INPUT 1 ") in jumps for r in removal[:4]
               if " INPUT " in r)


def test_nft_removals_take_turns_per_ruleset_and_never_wait_for_long(tmp_path, monkeypatch):
    """Agents sharing a kernel (simulated hosts, jobs side by side) remove their
    tables in turn: 32 racing removals cost ~5x the CPU of 32 in a row. A lock
    held too long is waited for a bounded time, then nft runs anyway."""
    import fcntl
    import time

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(firewall, "NFT_LOCK_WAIT_S", 0.3)
    holder = firewall._nft_lock()
    assert holder is not None and str(tmp_path) in os.readlink(f"/proc/self/fd/{holder}")
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        code, out = firewall._run_in_turn(["nft", "--version"], None)
        assert code == 0 and "nftables" in out
        assert time.monotonic() - started >= 0.3  # it waited its turn, then went on
        # A wait too long to take by chance: what follows did not wait for the lock.
        monkeypatch.setattr(firewall, "NFT_LOCK_WAIT_S", 60.0)
        started = time.monotonic()
        assert firewall._run(["nft", "--version"], None)[0] == 0  # an install goes at once
        assert time.monotonic() - started < 30
    finally:
        os.close(holder)
    started = time.monotonic()
    assert firewall._run_in_turn(["nft", "--version"], None)[0] == 0  # a free lock: at once
    assert time.monotonic() - started < 30


def test_each_job_and_host_gets_its_own_table():
    one = seal_for("my-job", "/runs/a", "gpu1", [5001, 5000, 5000], ["10.0.0.1"], "auto")
    assert one is not None and one.ports == (5000, 5001)
    assert one.table.startswith("mgpu_my_job_") and fwrules.Seal.from_json(one.to_json()) == one
    other_host = seal_for("my-job", "/runs/a", "gpu2", [5000], [], "auto")
    other_job = seal_for("my-job", "/runs/b", "gpu1", [5000], [], "auto")
    assert len({one.table, other_host.table, other_job.table}) == 3
    assert len({one.chain, other_host.chain, other_job.chain}) == 3
    assert seal_for("my-job", "/runs/a", "gpu1", [5000], [], "open") is None
    assert seal_for("my-job", "/runs/a", "gpu1", [], [], "cluster") is None  # no port


@pytest.mark.parametrize("field,value", [
    ("table", "filter"), ("table", "mgpu_x; flush ruleset"), ("chain", "INPUT"),
    ("ports", [0]), ("ports", "22"), ("allow", ["10.0.0.1 accept"]), ("mode", "open"),
])
def test_the_agent_refuses_a_malformed_seal(field, value):
    with pytest.raises(ValueError, match=field):
        Seal.from_json({**SEAL.to_json(), field: value})


def test_preflight_refuses_under_cluster_and_notes_under_auto():
    hellos = {"gpu1": {"firewall": {"backend": "nft", "why": ""}},
              "gpu2": {"firewall": {"backend": None,
                                    "why": "the agent runs as a user without CAP_NET_ADMIN"}}}
    refusals, notices = fwreport.preflight("cluster", hellos)
    assert notices == [] and len(refusals) == 1
    assert refusals[0].startswith("host gpu2 cannot keep the job's TF ports to the cluster "
                                  "(security.tf_ports: cluster): the agent runs as a user "
                                  "without CAP_NET_ADMIN\n  fix: give the agent CAP_NET_ADMIN")
    refusals, notices = fwreport.preflight("auto", hellos)
    assert refusals == [] and len(notices) == 1 and notices[0].startswith(
        "host gpu2: TF ports open to its whole network (the agent runs as a user without")
    assert fwreport.preflight("open", hellos) == ([], [])


def test_dry_run_shows_the_rules_each_host_would_get(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "c.yaml").write_text(
        "name: fw\ntransport: ssh\nhosts:\n  - {address: 10.1.0.1, name: a}\n"
        "  - {address: 10.1.0.2, name: b}\nports: {base: 23000}\ncheckpoint: {dir: /ck}\n"
        "security: {tf_ports: cluster}\n")
    done = run_cli(["--dry-run", "c.yaml", "train.py"], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    text = done.stdout.split("firewall (security.tf_ports: cluster)")[1]
    a, b = text.split("\n  a:\n")[1].split("\n  b: ")  # b: the same rules, its own ports
    assert "set ports { type inet_service; elements = { 23000 }; }" in a
    assert b.startswith("table inet mgpu_fw_") and "set ports { 23001 }" in b.splitlines()[0]
    # Each host keeps its other users off every host's TF port (the same set everywhere).
    assert "elements = { 10.1.0.1 . 23000, 10.1.0.2 . 23001 }" in a
    assert "ip saddr { 10.1.0.1, 10.1.0.2 } return" in a and text.count("10.1.0.2 }") == 1
    plan = json.loads(run_cli(["--dry-run", "--json", "c.yaml", "train.py"], cwd=tmp_path,
                              timeout=60).stdout)
    assert plan["firewall"]["hosts"]["b"]["ports"] == [23001]
    assert plan["firewall"]["allow"] == ["10.1.0.1", "10.1.0.2"]
    assert plan["firewall"]["targets"] == [["10.1.0.1", 23000], ["10.1.0.2", 23001]]
    (tmp_path / "c.yaml").write_text(
        (tmp_path / "c.yaml").read_text().replace("tf_ports: cluster", "tf_ports: open"))
    done = run_cli(["--dry-run", "c.yaml", "train.py"], cwd=tmp_path, timeout=60)
    assert "firewall: none (security.tf_ports: open)" in done.stdout


def test_a_bad_tf_ports_value_is_named(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "c.yaml").write_text("transport: local\nhosts: [{address: 127.0.0.1}]\n"
                                     "security: {tf_ports: sealed}\n")
    done = run_cli(["--dry-run", "c.yaml", "train.py"], cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "security.tf_ports" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------- the agent, for real


@pytest.fixture
def netns():
    """A bare network namespace: its nftables ruleset is its own, nobody else's."""
    why = netns_available()
    if why:  # .ci/run runs as root with iproute2: a failure to fix, not a skip
        pytest.fail(f"needs network namespaces (root, iproute2): {why}")
    name = f"firewall-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def tables(netns: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "tables"],
                         capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if "mgpu_" in line]


class NetnsAgent(AgentProc):
    """AgentProc, inside a network namespace (`ip netns exec` execs the agent)."""

    def __init__(self, netns: str, run_dir: Path, lease_s: float = 0) -> None:
        super().__init__(run_dir, lease_s=lease_s, prefix=["ip", "netns", "exec", netns])


def start_sealed(agent: AgentProc, seal: Seal, name: str = "t0") -> dict:
    agent.send({"op": "start", "task": name, "generation": 0,
                "argv": [PYTHON, "-c", "import time; time.sleep(60)"], "cwd": "/",
                "env": {}, "tf_config": "{}", "firewall": seal.to_json()})
    return agent.wait_event("started", task=name)


def said(seal: Seal) -> str:
    return (f"TF port(s) 23456 accept only root on this host and 1 cluster address(es) "
            f"(nft table inet {seal.table})")


def test_the_agent_seals_before_its_task_and_unseals_when_it_ends(netns, tmp_path):
    seal = seal_for("fw", str(tmp_path / "run"), "h1", [23456], ["10.0.0.2"], "cluster")
    agent = NetnsAgent(netns, tmp_path / "run")
    try:
        assert agent.hello()["firewall"] == {"backend": "nft", "why": "", "uid": os.getuid()}
        # The launch sends the rules as soon as the hello is in (a `seal`), the
        # start the same rules again: installed once, before the task.
        agent.send({"op": "seal", "firewall": seal.to_json()})
        agent.wait_event("log", text=f"firewall: {said(seal)}")
        assert tables(netns) == [seal.table]
        start_sealed(agent, seal)
        assert tables(netns) == [seal.table]
        assert [m["text"] for m in agent.events("log")] == [f"firewall: {said(seal)}"]
    finally:
        agent.close()  # stdin closed: the launcher is gone
    # Removed as the agent exits: started, not waited for (the kernel's time).
    wait_for(lambda: tables(netns) == [], timeout=10, what="the table removed")
    assert not (tmp_path / "run" / firewall.RECORD).exists()


# Who connects: root, the job's user (here nobody, as if the agent ran as
# nobody), and another local user (daemon, uid 1). Stdlib only: the system python,
# which every user may run (the venv may be under root's home).
SYSTEM_PYTHON = "/usr/bin/python3"
USERS = {"root": [], "job": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],
         "other": ["setpriv", "--reuid=1", "--regid=1", "--clear-groups"]}
CONNECT = ("import socket, sys\ntry:\n"
           "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
           "except OSError as exc:\n    sys.exit(f'{type(exc).__name__}')\n")


def test_another_local_user_is_refused_the_jobs_ports_the_jobs_user_and_root_are_not(netns):
    seal = seal_for("fw", "/runs/local", "h1", [23456], ["10.0.0.2"], "cluster")

    def ns(*argv: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", netns, *argv], capture_output=True,
                              text=True, **kwargs)

    # The host's own non-loopback address: a connection to it leaves on lo too.
    for step in (["ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                 ["ip", "addr", "add", "10.77.0.1/24", "dev", "d0"],
                 ["ip", "link", "set", "d0", "up"], ["ip", "link", "set", "d1", "up"]):
        assert ns(*step).returncode == 0
    assert ns("nft", "-f", "-", input=fwrules.render_nft(seal, uid=65534)).returncode == 0
    server = subprocess.Popen(
        ["ip", "netns", "exec", netns, SYSTEM_PYTHON, "-c",
         "import socket, time\n"
         "s = [socket.create_server(('', p), backlog=64) for p in (23456, 23457)]\n"
         "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline() == "up\n"

        def connects(user: str, address: str, port: int) -> str:
            done = ns(*USERS[user], SYSTEM_PYTHON, "-c", CONNECT, address, str(port), timeout=30)
            return done.stderr.strip() or "connected"

        for address in ("127.0.0.1", "10.77.0.1"):
            assert connects("root", address, 23456) == "connected"
            assert connects("job", address, 23456) == "connected"
            # Refused at once (a TCP reset), not left to time out.
            assert connects("other", address, 23456) == "ConnectionRefusedError"
            assert connects("other", address, 23457) == "connected"  # not the job's port
    finally:
        server.kill()
        server.wait()


def test_an_agent_whose_lease_runs_out_removes_the_rules(netns, tmp_path):
    # A partition closes no pipe: the agent hears nothing for its lease, stops
    # its task, removes the rules and exits (EXIT_LEASE).
    seal = seal_for("fw", str(tmp_path / "run"), "h1", [23456], [], "cluster")
    agent = NetnsAgent(netns, tmp_path / "run", lease_s=2)
    try:
        agent.hello()
        start_sealed(agent, seal)
        assert tables(netns) == [seal.table]
        assert agent.proc.wait(timeout=30) == 3
        wait_for(lambda: tables(netns) == [], timeout=10, what="the table removed")
    finally:
        agent.close()


def test_iptables_fallback_installs_and_removes_its_chain(netns, tmp_path):
    # The fallback's commands against the real iptables, in the namespace.
    seal = seal_for("fw", str(tmp_path), "h1", list(range(24000, 24017)), ["10.0.0.2"],
                    "cluster")
    code = ("import json, sys\nfrom launcher import firewall, fwrules\n"
            "seal = fwrules.Seal.from_json(json.loads(sys.argv[1]))\n"
            "if sys.argv[2] == 'apply': print(firewall.apply(seal, 'iptables', sys.argv[3]))\n"
            "else: print(firewall.reap(sys.argv[3]))\n")

    def run(step: str) -> str:
        done = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code,
                               json.dumps(seal.to_json()), step, str(tmp_path)],
                              capture_output=True, text=True, env=agent_env())
        assert done.returncode == 0, done.stderr
        return done.stdout

    def rules() -> str:
        return subprocess.run(["ip", "netns", "exec", netns, "iptables", "-w", "-S"],
                              capture_output=True, text=True, check=True).stdout

    assert f"(iptables chain {seal.chain})" in run("apply")
    run("apply")  # a second generation: replaced, not doubled
    listed = rules()
    # 17 ports: two multiport jumps to each chain (INPUT; OUTPUT on lo)
    assert listed.count(f"-j {seal.chain}\n") == 2, listed
    assert listed.count(f"-j {seal.chain}-L\n") == 2, listed
    assert f"-A {seal.chain}-L -m owner --uid-owner 0 -j RETURN" in listed
    assert f"-A {seal.chain} -s 10.0.0.2/32 -j RETURN" in listed
    assert f"-A {seal.chain} -j DROP" in listed
    assert run("reap").strip() == f"chain {seal.chain}"
    assert seal.chain not in rules()


# In a namespace: the table `nft -f` makes of render_nft, and nftlink's, as the
# kernel lists them (expressions, sets, elements, handles); then a replacement
# and removals; then a 10,000-host cluster's seal (20,000 addresses).
NETLINK_AS_NFT = """\
import json, subprocess, sys
from launcher import fwrules, nftlink
seal = fwrules.Seal.from_json(json.loads(sys.argv[1]))
v4, v6 = fwrules.split_families(seal.allow)
targets = fwrules.split_targets(seal.targets)
def listing(debug="--debug=netlink"):
    return subprocess.run(["nft", debug, "list", "table", "inet", seal.table],
                          capture_output=True, text=True, check=True).stdout
def kernel():  # a set's elements in any order: its hash's seed is random
    blocks = [[]]
    for line in listing().splitlines():
        if not line.startswith("\\telement"):
            blocks.append([])
        blocks[-1].append(line)
    return [sorted(block) for block in blocks]
checks = {}
for uid in (0, 1000):
    subprocess.run(["nft", "-f", "-"], input=fwrules.render_nft(seal, uid=uid), text=True,
                   check=True)
    by_nft, text = kernel(), listing("-nn")
    assert nftlink.delete(seal.table)
    nftlink.install(seal.table, seal.ports, v4, v6, (0, uid), fwrules.PRIORITY, targets)
    checks[f"uid {uid}: as nft"] = kernel() == by_nft
    nftlink.install(seal.table, seal.ports, v4, v6, (0, uid), fwrules.PRIORITY, targets)
    checks[f"uid {uid}: replaced"] = listing("-nn") == text
    checks[f"uid {uid}: removed"] = nftlink.delete(seal.table) and not nftlink.delete(seal.table)
v4 = [f"10.{i // 250}.{i % 250}.1" for i in range(10000)]
v6 = [f"fd00::{i:x}" for i in range(10000)]
nftlink.install(seal.table, seal.ports, v4, v6, (0, 1000), fwrules.PRIORITY)
checks["20,000 addresses"] = listing().count("element ") == 20000 + len(seal.ports) + 2
print(json.dumps(checks))
"""


def test_nftlink_installs_the_very_table_nft_makes_of_the_rules(netns):
    """The agent sends the table over netlink (no `nft` reading every table
    first): the same expressions and sets, rule for rule, as `nft -f` of the
    rendered rules, which the tests above and the netns tests check for real."""
    seal = Seal(SEAL.table, SEAL.chain, SEAL.ports, ("10.0.0.2", "10.0.0.3", "fd00::2"),
                "cluster", SEAL.targets)  # a set of one (fd00::2): nft makes a comparison
    done = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", NETLINK_AS_NFT,
                           json.dumps(seal.to_json())],
                          capture_output=True, text=True, env=agent_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    checks = json.loads(done.stdout)
    assert checks == {key: True for key in checks} and len(checks) == 7, checks


def test_the_next_agent_removes_the_rules_a_killed_agent_left(netns, tmp_path):
    run_dir = tmp_path / "run"
    seal = seal_for("fw", str(run_dir), "h1", [23456, 23457], ["10.0.0.2"], "cluster")
    first = NetnsAgent(netns, run_dir)
    try:
        first.hello()
        task = start_sealed(first, seal)["pid"]
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
        assert tables(netns) == [seal.table]  # nobody left to remove them
    finally:
        first.close()
    wait_for(lambda: not os.path.exists(f"/proc/{task}") or _zombie(task), timeout=10,
             what="the task to die with its agent")
    second = NetnsAgent(netns, run_dir)
    try:
        second.hello()
        assert tables(netns) == []  # removed before the hello: before any task can start
        said = second.wait_event("log")["text"]
        assert said == (f"removed the firewall rules (table inet {seal.table}) of an earlier "
                        "agent of this run directory")
    finally:
        second.close()


@pytest.fixture
def netns2():
    name = f"firewall-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_killed_agents_rules_that_no_agent_of_its_run_reaps_go_with_any_later_agent(
        netns, netns2, tmp_path):
    # The launcher gave up on the host: no agent of that run comes back. The
    # next agent of any run on the same machine and namespace removes them.
    seal = seal_for("fw", str(tmp_path / "old"), "h1", [23470], [], "cluster")
    dead = NetnsAgent(netns, tmp_path / "old")
    try:
        dead.hello()
        start_sealed(dead, seal)
        dead.proc.send_signal(signal.SIGKILL)
        dead.proc.wait(timeout=10)
    finally:
        dead.close()
    elsewhere = NetnsAgent(netns2, tmp_path / "other-namespace")
    try:
        elsewhere.hello()  # another namespace (another simulated host): not its rules
        assert tables(netns) == [seal.table]
    finally:
        elsewhere.close()
    later = NetnsAgent(netns, tmp_path / "new")
    try:
        later.hello()
        assert tables(netns) == []
        said = later.wait_event("log")["text"]
        assert said.startswith(f"removed the firewall rules (table inet {seal.table}, agent "
                               f"pid {dead.proc.pid}, gone) of another run"), said
    finally:
        later.close()
    # Its entry is gone from the registry (the folder of that machine and namespace).
    assert not list(Path(fwregistry.root()).rglob(f"{seal.table}.json"))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_two_jobs_on_one_host_keep_their_own_tables(netns, tmp_path):
    seals = [seal_for("fw", str(tmp_path / f"run{i}"), "h1", [23460 + i], [], "cluster")
             for i in range(2)]
    agents = [NetnsAgent(netns, tmp_path / f"run{i}") for i in range(2)]
    try:
        for agent, seal in zip(agents, seals, strict=True):
            agent.hello()
            start_sealed(agent, seal)
        assert sorted(tables(netns)) == sorted(s.table for s in seals)
        agents[0].close()
        wait_for(lambda: tables(netns) == [seals[1].table], timeout=10,
                 what="the first job's table removed, the second's kept")
    finally:
        for agent in agents:
            agent.close()
    wait_for(lambda: tables(netns) == [], timeout=10, what="both tables removed")


# ---------------------------------------------------------------- the launch


def _no_net_admin_python(tmp_path: Path) -> Path:
    """A python for the hosts that runs without CAP_NET_ADMIN, even as root."""
    wrapper = tmp_path / "python-no-net-admin"
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --bounding-set -net_admin {PYTHON} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def _local_config(tmp_path: Path, mode: str, python: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"name: fwlocal\ntransport: local\npython: {python}\n"
                    "hosts: [{address: 127.0.0.1}, {address: 127.0.0.1}]\n"
                    f"checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n"
                    f"security: {{tf_ports: {mode}}}\n")
    (tmp_path / "train.py").write_text("print('trained', flush=True)\n")
    return path


def test_cluster_refuses_to_start_where_an_agent_cannot_seal(tmp_path):
    config = _local_config(tmp_path, "cluster", _no_net_admin_python(tmp_path))
    done = run_cli([str(config), "train.py"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert ("mgpu-launch: host host0 cannot keep the job's TF ports to the cluster "
            "(security.tf_ports: cluster): the agent runs as root without CAP_NET_ADMIN") in out
    assert "fix: give the agent CAP_NET_ADMIN" in out
    assert "trained" not in out


def test_auto_runs_open_with_a_one_line_notice_where_an_agent_cannot_seal(tmp_path):
    config = _local_config(tmp_path, "auto", _no_net_admin_python(tmp_path))
    done = run_cli([str(config), "train.py"], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if "TF ports open" in line]
    assert len(notes) == 2 and "host host0: TF ports open to its whole network" in notes[0]
    assert done.stdout.count("trained") == 2


def test_check_says_per_host_whether_the_ports_would_be_sealed_and_where_they_listen(tmp_path):
    sealed = _local_config(tmp_path, "cluster", Path(PYTHON))
    done = run_cli(["check", str(sealed), "--no-collective"], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.split("TF ports (who can connect):\n")[1].splitlines()
    assert lines[0].startswith("  host0  sealed (nft): listening on lo 127.0.0.1")
    assert lines[0].endswith("; only root on the host and the job's hosts may connect")
    _local_config(tmp_path, "cluster", _no_net_admin_python(tmp_path))
    done = run_cli(["check", str(sealed), "--no-collective"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("  host0  OPEN (the agent runs as root without CAP_NET_ADMIN): anyone reaching "
            "lo 127.0.0.1") in done.stdout
    assert ("  host1: TF ports cannot be sealed (security.tf_ports: cluster): the agent runs "
            "as root without CAP_NET_ADMIN; fix: give the agent CAP_NET_ADMIN") in done.stdout
    assert "verdict: NOT READY" in done.stdout


def _failing_nft(tmp_path: Path) -> dict[str, str]:
    """PATH with an `nft` first that refuses every ruleset (as a kernel without
    nf_tables does), for the agents of local hosts."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    fake = folder / "nft.new"  # renamed into place: the last run's agents may still run
    fake.write_text("#!/bin/sh\necho 'Error: Could not process rule: Operation not supported' "
                    ">&2\nexit 1\n")  # it (a detached removal), and a rewrite is ETXTBSY
    fake.chmod(0o755)
    fake.replace(folder / "nft")
    # The agents use `nft` (not netlink), which refuses.
    return {"PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}", "MGPU_NFT_NETLINK": "0"}


def test_rules_the_host_refuses_are_a_notice_under_auto_and_stop_the_task_under_cluster(
        tmp_path):
    config = _local_config(tmp_path, "auto", Path(PYTHON))
    done = run_cli([str(config), "train.py"], cwd=tmp_path, timeout=120, **_failing_nft(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if "open to the network" in line]
    assert len(notes) == 2, done.stdout
    assert notes[0].split("| ", 1)[1].startswith("host host")
    assert ("open to the network (security.tf_ports: auto): nft refused the rules: Error: "
            "Could not process rule: Operation not supported") in notes[0]
    config.write_text(config.read_text().replace("tf_ports: auto", "tf_ports: cluster")
                      + "restart: {max_restarts: 0}\n")
    done = run_cli([str(config), "train.py"], cwd=tmp_path, timeout=120, **_failing_nft(tmp_path))
    assert done.returncode != 0, done.stdout + done.stderr
    assert ("cannot keep the TF ports to the cluster (security.tf_ports: cluster): nft refused "
            "the rules") in done.stdout
    assert "trained" not in done.stdout
