"""The host bundle's cache: which old bundles go, and that using one keeps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from launcher.transport.shipping import (
    STAGING_STALE_S,
    UNUSED_FOR_S,
    USE_MARKER,
    bundle_id,
    install_local,
    stale_bundles,
)

DAY = 86400.0


def test_only_bundles_unused_for_a_month_and_old_staging_folders_are_stale():
    now = 1_000_000_000.0
    entries = [
        ("0.1.0-0123456789ab", now - UNUSED_FOR_S - DAY),  # stale bundle
        ("0.1.0-ba9876543210", now - UNUSED_FOR_S + DAY),  # used within the month
        ("0.2.0rc1-aaaaaaaaaaaa", now - 90 * DAY),  # stale, pre-release version
        ("0.3.0-cccccccccccc", now - 90 * DAY),  # old, but the one in use: kept
        (".staging-1f2e3d", now - STAGING_STALE_S - 60),  # a crashed upload
        (".staging-9a8b7c", now - 60),  # an upload in progress
        ("my-notes", now - 900 * DAY),  # not ours
        ("0.1.0-XYZ", now - 900 * DAY),  # not a digest
    ]
    assert stale_bundles(entries, keep="0.3.0-cccccccccccc", now=now) == [
        ".staging-1f2e3d", "0.1.0-0123456789ab", "0.2.0rc1-aaaaaaaaaaaa"]


def test_installing_a_new_bundle_drops_stale_ones_and_keeps_the_rest(tmp_path):
    root = tmp_path / "code"
    old = time.time() - UNUSED_FOR_S - DAY
    for name in ("0.0.1-0123456789ab", "0.0.2-0123456789ab", "unrelated"):
        (root / name).mkdir(parents=True)
    os.utime(root / "0.0.1-0123456789ab", (old, old))
    os.utime(root / "unrelated", (old, old))
    target = install_local(root)
    assert target == root / bundle_id() and (target / USE_MARKER).exists()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [bundle_id(), "0.0.2-0123456789ab", "unrelated"])


def test_an_agent_started_from_a_bundle_marks_it_used(tmp_path):
    bundle = install_local(tmp_path / "code")
    month_ago = time.time() - UNUSED_FOR_S - DAY
    os.utime(bundle, (month_ago, month_ago))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(bundle)
    done = subprocess.run(
        [sys.executable, "-S", "-m", "launcher.agent", "--host", "h1",
         "--run-dir", str(tmp_path / "run"), "--eof-grace", "0"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["ev"] == "hello"
    assert bundle.stat().st_mtime > time.time() - 600  # no longer a month old



def test_a_local_code_cache_others_could_write_is_refused(tmp_path):
    import os

    import pytest

    from launcher.transport.shipping import UnsafeCache, install_local

    root = tmp_path / "mgpu-launch" / "code"
    bundle = install_local(root)
    install_local(root)  # ours alone: used as it is
    os.chmod(root, 0o770)  # group-writable
    with pytest.raises(UnsafeCache, match=f"{root} is writable by others"):
        install_local(root)
    os.chmod(root, 0o700)
    agent = bundle / "launcher" / "agent" / "__main__.py"
    os.chown(agent, 65534, 65534)  # a file of another user in the bundle
    with pytest.raises(UnsafeCache, match=f"{agent} belongs to uid 65534"):
        install_local(root)


def test_a_launch_with_an_unsafe_cache_stops_before_running_anything(tmp_path):
    import os

    from tests.conftest import run_cli

    cache_home = tmp_path / "shared-tmp"
    (cache_home / "mgpu-launch").mkdir(parents=True)
    os.chmod(cache_home / "mgpu-launch", 0o777)  # as on a shared /tmp
    (tmp_path / "job.py").write_text("open('ran', 'w').write('x')\n")
    done = run_cli(["--local", "1", "job.py"], cwd=tmp_path, timeout=60,
                   XDG_CACHE_HOME=str(cache_home))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"the code cache {cache_home / 'mgpu-launch'} is writable by others" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_the_agent_and_the_shipping_list_the_same_bundle():
    from launcher.agent import bundle
    from launcher.transport import shipping

    assert bundle.BUNDLE_FILES == shipping.BUNDLE and bundle.BUNDLE_DIRS == shipping.BUNDLE_DIRS


def test_an_agent_refuses_a_changed_bundle_or_a_run_dir_others_can_write(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    from launcher.transport.shipping import install_local

    bundle = install_local(tmp_path / "cache" / "code")
    run_dir = tmp_path / "run"

    def start_agent() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-S", "-m", "launcher.agent", "--host", "h",
             "--run-dir", str(run_dir)], input="", capture_output=True, text=True,
            timeout=60, cwd=bundle, env={**os.environ, "PYTHONPATH": str(bundle)})

    fine = start_agent()
    assert fine.returncode == 0 and '"ev":"hello"' in fine.stdout, fine.stderr
    os.chmod(run_dir, 0o777)
    refused = start_agent()
    assert refused.returncode == 96 and '"ev":"hello"' not in refused.stdout
    assert f"the run directory {run_dir} belongs to uid" in refused.stderr
    os.chmod(run_dir, 0o700)
    tampered = tmp_path / "other" / bundle.name  # a copy, so the real cache stays intact
    shutil.copytree(bundle, tampered)
    with open(tampered / "launcher" / "runtime" / "guards.py", "a") as handle:
        handle.write("\nPLANTED = True\n")
    bundle = tampered
    refused = start_agent()
    assert refused.returncode == 96, refused.stderr
    assert "does not match the digest in its name" in refused.stderr
