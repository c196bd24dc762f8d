"""`check`'s verdict on the versions the agents' hellos report (a pure function)."""

from __future__ import annotations

import pytest

from launcher.commands.check_verdict import HostReport, judge_versions
from launcher.spec.plan import HostTarget


def report(name: str, **packages: str | None) -> HostReport:
    target = HostTarget(name=name, address=name, python="python3", gpus=(), ssh_user=None,
                        ssh_port=22, identity_file=None, known_hosts="", host_key_policy="",
                        ssh_config_file=None, connect_timeout_s=5.0)
    return HostReport(target, hello={"python_version": "3.11.7", "python": "python3",
                                     "packages": packages})


@pytest.mark.parametrize("mode, flagged", [("auto", False), ("keras3", False),
                                           ("tf_keras", True)])
def test_tf_keras_is_needed_only_when_the_job_asks_for_it(mode: str, flagged: bool):
    # `keras: auto` keeps TensorFlow's default (Keras 3 where installed): no tf-keras needed.
    reports = [report(f"h{i}", tensorflow="2.21.0", keras="3.15.1", tf_keras=None)
               for i in range(2)]
    judge_versions(reports, mode)
    for r in reports:
        assert any("tf-keras is not installed" in p for p in r.problems) == flagged, r.problems
        if flagged:
            assert "`pip install tf-keras~=2.21.0`" in r.problems[0]


def test_a_host_with_another_keras_is_named():
    reports = [report("h0", tensorflow="2.21.0", keras="3.15.1"),
               report("h1", tensorflow="2.21.0", keras="3.10.0")]
    judge_versions(reports, "auto")
    assert not reports[0].problems
    assert any("Keras 3.10.0" in p for p in reports[1].problems), reports[1].problems
