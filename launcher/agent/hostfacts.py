"""What the agent's hello says of its host, and psutil when the host has it.

The packages tasks need are read from the names of `*.dist-info` folders (no
import, not even importlib.metadata); the site-packages folders come from
`site_dirs()`, since the agent runs with `python -S`. psutil (optional on
hosts: CPU/RSS in heartbeats, escaped children, interfaces) is imported on
first use, not at start-up: ~30 ms of CPU that a fan-out to many hosts would
pay on each.

Standard library only; imports nothing of the launcher.
"""

from __future__ import annotations

import os
import sys
import threading

psutil = None
_psutil_lock = threading.Lock()
_psutil_tried = False
_site_dirs: list[str] | None = None


def load_psutil():
    """The psutil module, imported once from the site dirs; None without it."""
    global psutil, _psutil_tried
    with _psutil_lock:
        if not _psutil_tried:
            _psutil_tried = True
            add_site_dirs()
            try:
                import psutil as module
            except ImportError:  # pragma: no cover - depends on the host
                module = None
            psutil = module
    return psutil


def installed_versions() -> dict[str, str | None]:
    """Versions of what tasks need, read from the names of `*.dist-info` folders.

    The first match on the path wins, as for an import. Nothing is imported,
    not even importlib.metadata (~20-50 ms of CPU per agent start, which a
    fan-out to dozens of hosts pays on each of them).
    """
    versions = _scan_dist_info([*sys.path, *site_dirs()])
    if versions["tensorflow"] is None and sys.flags.no_site:
        # TensorFlow may sit on a path that only a .pth file adds: let site run
        # them (what every task's interpreter does) before calling it missing.
        import site

        site.main()
        versions = _scan_dist_info(sys.path)
    return versions


def _scan_dist_info(entries: list[str]) -> dict[str, str | None]:
    wanted = {"tensorflow": "tensorflow", "tensorflow_cpu": "tensorflow",
              "keras": "keras", "tf_keras": "tf_keras", "psutil": "psutil"}
    versions: dict[str, str | None] = dict.fromkeys(("tensorflow", "keras", "tf_keras",
                                                     "psutil"))
    for entry in entries:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            parts = name.rsplit(".", 1)[0].split("-")
            key = wanted.get(parts[0].lower().replace(".", "_"))
            if key and len(parts) > 1 and versions[key] is None:
                versions[key] = parts[1]
    return versions


def site_dirs() -> list[str]:
    """The site-packages folders `site` would add to sys.path, without running
    their `.pth` files; empty when `site` already ran (no `-S`). When they hold
    no TensorFlow, `installed_versions` runs `site.main()` after all."""
    global _site_dirs
    if not sys.flags.no_site:
        return []
    if _site_dirs is not None:  # the hello and the first psutil import both ask
        return _site_dirs
    import site  # under -S, importing site does not run site.main()

    # What site.main() would add, in its order: the user site, then PREFIXES.
    prefixes, user_site = [sys.prefix, sys.exec_prefix], True
    # A venv: what site.venv() would read from pyvenv.cfg.
    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    for conf in (os.path.join(bin_dir, "pyvenv.cfg"),
                 os.path.join(os.path.dirname(bin_dir), "pyvenv.cfg")):
        if not os.path.isfile(conf):
            continue
        system = "true"
        with open(conf, encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "include-system-site-packages":
                    system = value.strip().lower()
        venv = os.path.dirname(bin_dir)
        prefixes, user_site = ([venv, *prefixes], True) if system == "true" else ([venv], False)
        break
    dirs = [site.getusersitepackages()] if user_site and site.check_enableusersite() else []
    dirs += site.getsitepackages(prefixes)
    _site_dirs = [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]
    return _site_dirs


def add_site_dirs() -> None:
    for entry in site_dirs():
        if entry not in sys.path:
            sys.path.append(entry)


def tree_usage(proc) -> dict[str, float | str]:
    """CPU and memory of a task's tree (a psutil.Process), and the task's own
    process status (`stopped` is a SIGSTOPped task: the supervisor blames it
    for a hang)."""
    cpu, rss = 0.0, 0
    try:
        members = [proc, *proc.children(recursive=True)]
        status = proc.status()
    except psutil.Error:
        return {"cpu": 0.0, "rss_mb": 0.0}
    for member in members:
        try:
            cpu += member.cpu_percent(None)
            rss += member.memory_info().rss
        except psutil.Error:
            continue
    return {"cpu": round(cpu, 1), "rss_mb": round(rss / 2**20, 1), "status": status}
