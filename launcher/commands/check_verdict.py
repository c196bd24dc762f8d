"""What `mgpu-launch check` concludes from what it found on each host: the
judgments (versions alike, the probe's facts: peers, checkpoint directory,
GPUs) and the table, notes, problems and verdict it prints.

Pure: a `HostReport` per host in, problems and text out
(launcher/commands/check.py gathers the facts, check_json.py says them as JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..job.run import check_collective
from ..job.run.check_collective import CollectiveReport
from ..spec.plan import HostTarget

# One `true` over SSH taking longer: say so (it is mostly the login shell).
SLOW_LOGIN_S = 1.0


@dataclass
class HostReport:
    """What `check` found on one host; `problems` decide the verdict."""

    host: HostTarget
    hello: dict[str, Any] | None = None
    ports: list[int] = field(default_factory=list)
    busy: dict[str, str] = field(default_factory=dict)
    peers: dict[str, str | None] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    gpus: list[str] | None = None
    login_s: float | None = None  # one `true` over SSH: mostly the login shell's rc files
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # warnings that do not fail the check
    jax: dict[str, str | None] = field(default_factory=dict)  # jax and jaxlib versions
    keras_backend: str | None = None  # what Keras 3 runs on in the tasks
    tf_ports: str = ""  # who could connect to the job's TF ports (launcher.firewall)

    def packages(self) -> dict[str, str | None]:
        return (self.hello or {}).get("packages") or {}


# ---------------------------------------------------------------- judging


def judge_versions(reports: list[HostReport], keras_mode: str,
                   backend: str | None = None) -> None:
    """Flag missing packages and versions that differ from the other hosts.

    `backend="jax"` (a keras_distribution job): jax and jaxlib too.
    """
    alive = [r for r in reports if r.hello is not None]
    labels = {"python": "Python", "tensorflow": "TensorFlow", "keras": "Keras",
              "tf_keras": "tf-keras"}
    values = {r.host.name: {"python": ".".join(str(r.hello.get("python_version", "?"))
                                               .split(".")[:2]), **r.packages()}
              for r in alive}
    if backend == "jax":
        labels.update(jax="jax", jaxlib="jaxlib")
        for report in alive:
            values[report.host.name].update(report.jax)
    for report in alive:
        mine = values[report.host.name]
        if backend == "jax":
            _judge_jax(report, mine)
        if not mine.get("tensorflow"):
            report.problems.append(f"TensorFlow is not installed for {report.hello['python']}: "
                                   "install it, or set `python:` for this host")
        # `keras: auto` keeps TensorFlow's own choice (Keras 3 where installed), so
        # only `keras: tf_keras` needs the tf-keras package.
        if keras_mode == "tf_keras" and mine.get("tensorflow") and not mine.get("tf_keras"):
            report.problems.append(
                "tf-keras is not installed: `keras: tf_keras` runs tf.keras as tf_keras; "
                f"`pip install tf-keras~={_minor(mine['tensorflow'])}.0`")
        if keras_mode == "keras3" and not str(mine.get("keras") or "").startswith("3"):
            report.problems.append(f"`keras: keras3` needs Keras 3; found {mine.get('keras')}")
        tf, tfk = mine.get("tensorflow"), mine.get("tf_keras")
        if tf and tfk and _minor(tf) != _minor(tfk):
            report.problems.append(f"tf-keras {tfk} does not match TensorFlow {tf}: "
                                   f"`pip install tf-keras~={_minor(tf)}.0`")
    for key, label in labels.items():
        groups: dict[str | None, list[str]] = {}
        for report in alive:
            groups.setdefault(values[report.host.name].get(key), []).append(report.host.name)
        if len(groups) < 2:
            continue
        order = [r.host.name for r in alive]
        common = max(groups, key=lambda v: (len(groups[v]), -order.index(groups[v][0])))
        for report in alive:
            value = values[report.host.name].get(key)
            if value != common:
                report.problems.append(
                    f"{label} {value or 'missing'} here, but {common or 'missing'} on "
                    f"{', '.join(groups[common])}: every host needs the same versions")


def _judge_jax(report: HostReport, mine: dict[str, str | None]) -> None:
    """Keras 3 on JAX: jax, a jaxlib of the same version, and Keras 3."""
    jax, jaxlib = mine.get("jax"), mine.get("jaxlib")
    if not jax or not jaxlib:
        report.problems.append(f"{'jax' if not jax else 'jaxlib'} is not installed for "
                               f"{report.hello['python']}: keras_distribution runs Keras 3 on "
                               "JAX; `pip install 'mgpu-launch[jax]'` (or jax[cuda12] on GPUs)")
    elif jax != jaxlib:
        report.problems.append(f"jaxlib {jaxlib} does not match jax {jax}: "
                               f"`pip install jaxlib=={jax}`")
    if not str(mine.get("keras") or "").startswith("3"):
        report.problems.append(f"keras_distribution needs Keras 3; found {mine.get('keras')}")


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def judge_probe(report: HostReport, probe: dict[str, Any] | None, names: dict[str, str],
                checkpoint_dir: str, writer: str | None) -> None:
    if probe is None or "error" in probe:
        why = (probe or {}).get("error", "no answer")
        report.problems.append(f"the check probe failed here: {why}")
        return
    report.peers = probe.get("peers", {})
    for peer, error in report.peers.items():
        if error:
            report.problems.append(f"cannot reach {names.get(peer, peer)} at {peer}, its "
                                   f"TF_CONFIG address ({error}): a firewall between the "
                                   "hosts, or an address this host does not route?")
    report.checkpoint = probe.get("checkpoint", {})
    if not report.checkpoint.get("exists"):
        report.problems.append(f"checkpoint dir {checkpoint_dir} does not exist here: it must "
                               "be one directory every host sees (NFS or similar)")
    elif writer is not None and not report.checkpoint.get("nonce_seen"):
        report.problems.append(f"checkpoint dir {checkpoint_dir} is not shared: a file written "
                               f"there from {writer} is not visible here")
    elif not report.checkpoint.get("writable"):
        report.problems.append(f"checkpoint dir {checkpoint_dir} is not writable here")
    report.gpus = probe.get("gpus")
    report.jax = probe.get("jax") or {}
    report.keras_backend = report.keras_backend or probe.get("keras_backend")
    wanted = list(report.host.gpus)
    if wanted and (report.gpus is None or len(report.gpus) < max(wanted) + 1):
        seen = "nvidia-smi not found" if report.gpus is None else f"{len(report.gpus)} visible"
        report.problems.append(f"gpus {wanted} configured but {seen}")


# ---------------------------------------------------------------- output


def _jax_cell(report: HostReport) -> str:
    """`0.10.2`, or `0.10.2/jaxlib 0.10.1` when they differ, or `-`."""
    jax, jaxlib = report.jax.get("jax"), report.jax.get("jaxlib")
    if not jax and not jaxlib:
        return "-"
    return jax if jax == jaxlib else f"{jax or 'MISSING'}/jaxlib {jaxlib or 'MISSING'}"


def _checkpoint_cell(ck: dict[str, Any]) -> str:
    if not ck:
        return "?"
    if not ck.get("exists"):
        return "MISSING"
    shared = "shared" if ck.get("nonce_seen") else "NOT SHARED"
    cell = f"{shared}, {ck.get('free_gb', '?')} GB free"
    if ck.get("memory_free_gb") is not None:  # /dev/shm, for `checkpoint: {memory: true}`
        cell += f", memory {ck['memory_free_gb']} GB"
    return cell


def render(reports: list[HostReport], checkpoint_dir: str, ports_fixed: bool,
           collective: CollectiveReport | None = None) -> str:
    header = ["HOST", "ADDRESS", "SSH", "PYTHON", "TENSORFLOW", "KERAS", "TF-KERAS", "BACKEND",
              "JAX", "PORTS", "PEERS", "CHECKPOINT", "GPUS", "LOGIN"]
    rows = [header]
    for r in reports:
        if r.hello is None:
            rows.append([r.host.name, r.host.address, "FAILED"] + ["-"] * (len(header) - 3))
            continue
        packages = r.packages()
        if not ports_fixed:
            ports = "auto"
        elif not r.ports:
            ports = "none"
        else:
            ports = ",".join(f"{p} BUSY" if str(p) in r.busy else str(p) for p in r.ports)
        bad_peers = sum(1 for e in r.peers.values() if e)
        peers = f"{len(r.peers) - bad_peers}/{len(r.peers)}" if r.peers else "-"
        checkpoint = _checkpoint_cell(r.checkpoint)
        gpus = "none" if not r.gpus else str(len(r.gpus))
        login = "-" if r.login_s is None else f"{r.login_s:.2f}s"
        rows.append([r.host.name, r.host.address, "ok", str(r.hello.get("python_version")),
                     packages.get("tensorflow") or "MISSING", packages.get("keras") or "-",
                     packages.get("tf_keras") or "-", r.keras_backend or "?", _jax_cell(r),
                     ports, peers, checkpoint, gpus, login])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.append(f"checkpoint dir: {checkpoint_dir}")
    if collective is not None:
        lines += check_collective.render(collective)
    sealing = [r for r in reports if r.tf_ports]
    if sealing:
        lines.append("TF ports (who can connect):")
        width = max(len(r.host.name) for r in sealing)
        lines += [f"  {r.host.name:<{width}}  {r.tf_ports}" for r in sealing]
    slow = [r for r in reports if r.login_s is not None and r.login_s > SLOW_LOGIN_S]
    if slow or any(r.notes for r in reports):
        lines.append("notes:")
        lines += [f"  {r.host.name}: every SSH command waits {r.login_s:.1f} s for the login "
                  "shell (a heavy ~/.bashrc?); launches pay it on every host: see README, "
                  "'Fan-out speed'" for r in slow]
        lines += [f"  {r.host.name}: warning: {note}" for r in reports for note in r.notes]
    bad = [r for r in reports if r.problems]
    if bad:
        lines.append("problems:")
        lines += [f"  {r.host.name}: {p}" for r in bad for p in r.problems]
        count = sum(len(r.problems) for r in bad)
        lines.append(f"verdict: NOT READY - {count} problem{'s' if count > 1 else ''} on "
                     f"{len(bad)} host{'s' if len(bad) > 1 else ''} of {len(reports)}")
    else:
        lines.append(f"verdict: ready - all {len(reports)} hosts can start the run")
    return "\n".join(lines)
