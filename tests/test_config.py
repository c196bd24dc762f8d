"""Unit tests of the cluster YAML: what loads, and what each mistake says."""

from pathlib import Path

import pytest

from launcher.spec.config import ConfigError, load_config, parse_config
from tests.conftest import run_cli

GOOD = """\
name: digits
transport: ssh
python: python3
strategy: multi_worker_mirrored
env: {TF_CPP_MIN_LOG_LEVEL: "2", RETRIES: 3}
ssh:
  user: ubuntu
  port: 22
  host_key_policy: strict
hosts:
  - address: node1
    gpus: [0, 1]
  - address: node2
    port: 2222
    roles: {worker: 1}
checkpoint:
  dir: ckpt/digits
  save_freq: 100
restart:
  max_restarts: 3
  on_host_loss: shrink
ports:
  base: 23456
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="cluster.yaml")
    return info.value.problems


def test_full_config_loads_with_defaults_and_overrides(tmp_path: Path):
    path = tmp_path / "cluster.yaml"
    path.write_text(GOOD)
    loaded = load_config(path)
    config = loaded.config
    assert config.hosts[1].port == 2222 and config.ssh.port == 22
    assert config.checkpoint.save_freq == 100
    assert config.restart.on_host_loss == "shrink" and config.restart.heartbeat_timeout_s == 10
    assert config.env_strings() == {"TF_CPP_MIN_LOG_LEVEL": "2", "RETRIES": "3"}
    # Relative paths resolve against the YAML's folder, not the current directory.
    assert loaded.resolve_path(config.checkpoint.dir) == tmp_path / "ckpt" / "digits"


def test_misspelt_key_names_line_path_and_suggestion():
    text = GOOD.replace("    roles: {worker: 1}", "    rolse: {worker: 1}")
    (problem,) = problems_of(text)
    assert problem.startswith("cluster.yaml:15: hosts[1].rolse: unknown key 'rolse'")
    assert "did you mean 'roles'" in problem


def test_malformed_yaml_names_the_line():
    text = GOOD.replace("  max_restarts: 3", "  max_restarts: [3")
    (problem,) = problems_of(text)
    assert problem == ("cluster.yaml:21: not valid YAML: expected ',' or ']', but got ':' "
                       "(while parsing a flow sequence started at line 20)")


def test_wrong_type_and_enum_say_what_was_expected():
    problems = problems_of(GOOD.replace("on_host_loss: shrink", "on_host_loss: shrnk")
                           .replace("port: 2222", "port: http"))
    joined = "\n".join(problems)
    assert "cluster.yaml:14: hosts[1].port:" in joined and "'http'" in joined
    assert "cluster.yaml:21: restart.on_host_loss:" in joined and "'wait' or 'shrink'" in joined


def test_unknown_role_and_duplicate_key():
    problems = problems_of(GOOD.replace("roles: {worker: 1}", "roles: {wroker: 1}"))
    assert any("hosts[1].roles.wroker: unknown role" in p and "chief, worker, ps" in p
               for p in problems)
    problems = problems_of(GOOD.replace("name: digits\n", "name: digits\nname: again\n"))
    assert problems == ["cluster.yaml:2: name: duplicate key"]


def test_cross_field_rules():
    no_ckpt = GOOD.replace("checkpoint:\n  dir: ckpt/digits\n", "checkpoint:\n")
    assert any("checkpoint.dir is required for a multi-host ssh cluster" in p
               for p in problems_of(no_ckpt))
    ps_in_mwms = GOOD.replace("roles: {worker: 1}", "roles: {ps: 1}")
    assert any("multi_worker_mirrored has no ps tasks" in p for p in problems_of(ps_in_mwms))
    ps_without_chief = ps_in_mwms.replace("strategy: multi_worker_mirrored",
                                          "strategy: parameter_server")
    assert any("parameter_server needs one chief" in p for p in problems_of(ps_without_chief))
    assert any("hosts[1].name" in p or "listed twice" in p
               for p in problems_of(GOOD.replace("address: node2", "address: node1")))
    assert any("TF_CONFIG is set by mgpu-launch" in p
               for p in problems_of(GOOD.replace("RETRIES: 3", "TF_CONFIG: x")))
    assert any("env: MGPU_MEMORY_PEER is a switch: 0 (false) or 1 (true), not 'maybe'" in p
               for p in problems_of(GOOD.replace("RETRIES: 3", "MGPU_MEMORY_PEER: maybe")))
    switched = parse_config(GOOD.replace("RETRIES: 3", "MGPU_MEMORY_PEER: false"))
    assert switched.config.env_strings()["MGPU_MEMORY_PEER"] == "0"


def test_missing_hosts_and_not_a_mapping():
    assert any("hosts: required key is missing" in p for p in problems_of("name: x\n"))
    assert problems_of("- a\n- b\n") == [
        "cluster.yaml:1: expected a mapping of keys (name, hosts, ...)"]


def test_cli_exits_2_and_names_the_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("  max_restarts: 3", "  max_restart: 3"))
    result = run_cli([str(bad), "train.py"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert f"{bad}:20: restart.max_restart: unknown key" in result.stderr
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("hosts:\n  - address: a\n   gpus: [0]\n")
    result = run_cli([str(malformed), "train.py"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert f"{malformed}:3: not valid YAML" in result.stderr


@pytest.mark.parametrize("name", ["local.yaml", "ssh.yaml"])
def test_bundled_cluster_configs_are_valid(name: str):
    from tests.conftest import REPO

    loaded = load_config(REPO / "cluster_configs" / name)
    assert loaded.config.hosts


def test_strategy_example_configs_are_valid():
    from tests.conftest import REPO

    for path in sorted((REPO / "examples").rglob("*.yaml")):
        assert load_config(path).config.hosts, path


LOCAL_TWICE = """\
transport: local
hosts:
  - {address: localhost}
  - {address: localhost}
  - {address: 127.0.0.1, name: solo}
"""


def test_local_hosts_repeating_an_address_are_named_and_ports_default_to_auto():
    config = parse_config(LOCAL_TWICE).config
    assert [h.name for h in config.hosts] == ["host0", "host1", "solo"]
    assert config.ports.base == "auto"
    fixed = parse_config(LOCAL_TWICE + "ports: {base: 25000}\n").config
    assert fixed.ports.base == 25000  # what the user says stays


def test_ssh_hosts_repeating_an_address_still_need_names():
    twice = GOOD.replace("address: node2", "address: node1")
    assert any("listed twice" in p for p in problems_of(twice))
    assert parse_config(GOOD).config.ports.base == 23456


def test_secret_env_values_never_reach_the_dry_run_or_the_run_directory(tmp_path: Path):
    from launcher.spec.config import dump_config, local_config

    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "cluster.yaml").write_text(
        "transport: local\nenv: {HF_TOKEN: abc123, AWS_SECRET_ACCESS_KEY: xyz789, "
        "DB_PASSWORD: pw456, BATCH: 64}\nhosts:\n  - {address: 127.0.0.1}\n")
    for args in (["--dry-run"], ["--dry-run", "--json"]):
        out = run_cli([*args, "cluster.yaml", "train.py"], cwd=tmp_path, timeout=60)
        assert out.returncode == 0, out.stderr
        for secret in ("abc123", "xyz789", "pw456"):
            assert secret not in out.stdout + out.stderr
        assert "HF_TOKEN" in out.stdout and "***" in out.stdout and "64" in out.stdout
    loaded = load_config(tmp_path / "cluster.yaml")
    assert "abc123" not in dump_config(loaded) and "BATCH: 64" in dump_config(loaded)
    assert "abc123" in loaded.config.env_strings()["HF_TOKEN"]  # the tasks still get it
    assert local_config(1).config.ports.base == "auto"


def test_addresses_keys_load_and_bad_values_say_what_was_expected():
    text = GOOD.replace("  - address: node1\n", "  - address: node1\n    tf_address: 10.0.1.5\n"
                        ).replace("name: digits\n", "name: digits\nnetwork_interface: ib0\n")
    config = parse_config(text).config
    assert (config.network_interface, config.hosts[0].tf_address) == ("ib0", "10.0.1.5")
    problems = problems_of(text.replace("tf_address: 10.0.1.5", "tf_address: '10.0.1.5:80'")
                           .replace("network_interface: ib0", "network_interface: eth 1"))
    assert any(p.startswith("cluster.yaml:2: network_interface: expected an interface name")
               for p in problems), problems
    assert any(p.startswith("cluster.yaml:13: hosts[0].tf_address: expected a host name or "
                            "IP address without a port") for p in problems), problems


def test_memory_interval_needs_the_memory_tier_and_is_said_at_start(tmp_path: Path):
    hosts = "transport: local\nhosts: [{address: 127.0.0.1}]\n"
    [problem] = problems_of(hosts + "checkpoint: {memory_interval: 50}\n")
    assert "memory_interval" in problem and "checkpoint.memory: true" in problem
    assert any("memory_interval" in p for p in
               problems_of(hosts + "checkpoint: {memory: true, memory_interval: 0}\n"))
    config = tmp_path / "c.yaml"
    config.write_text(hosts + "checkpoint: {memory: true, memory_copies: 3, memory_interval: 50}\n")
    (tmp_path / "x.py").write_text("")
    shown = run_cli(["--dry-run", str(config), "x.py"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "at most 3 copies of each task's saves" in shown.stdout
    assert "a save to memory every 50 steps for Keras BackupAndRestore" in shown.stdout
    assert "MGPU_MEMORY_INTERVAL=50" in shown.stdout
    assert "no copy in another host's memory" in shown.stdout  # one host: nowhere to copy


def test_memory_peer_turns_the_second_copy_off_and_needs_the_memory_tier(tmp_path: Path):
    hosts = "transport: local\nhosts: [{address: 127.0.0.1}, {address: 127.0.0.2}]\n"
    [problem] = problems_of(hosts + "checkpoint: {memory_peer: false}\n")
    assert "checkpoint.memory_peer" in problem and "checkpoint.memory: true" in problem
    assert any("memory_peer" in p for p in
               problems_of(hosts + "checkpoint: {memory: true, memory_peer: maybe}\n"))
    (tmp_path / "x.py").write_text("")
    config = tmp_path / "c.yaml"
    for peer, said in (("false", True), ("true", False)):
        config.write_text(hosts + f"checkpoint: {{memory: true, memory_peer: {peer}}}\n")
        shown = run_cli(["--dry-run", str(config), "x.py"], cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert ("no copy in another host's memory" in shown.stdout) is said
        assert ("MGPU_MEMORY_PEER=0" in shown.stdout) is said


@pytest.mark.parametrize("value, said", [
    ("maybe", "sentinel: Input should be 'on' or 'off' (got 'maybe')"),
    ("{on_spike: nope}", "sentinel.on_spike: Input should be 'report', 'rollback' or 'off'"),
    ("{max_skips: -1}", "sentinel.max_skips: Input should be greater than or equal to 0"),
    ("{max_skips: two}", "sentinel.max_skips: Input should be a valid integer"),
])
def test_a_bad_sentinel_is_one_message_for_the_shape_given(value: str, said: str):
    problems = problems_of(GOOD + f"sentinel: {value}\n")
    assert len(problems) == 1 and said in problems[0], problems
    assert parse_config(GOOD + "sentinel: off\n").config.sentinel == "off"


def test_max_skips_defaults_to_two_and_none_when_the_sentinel_is_off():
    """`sentinel: {max_skips: N}`: the bad batches a job may skip (0: none)."""
    assert parse_config(GOOD).config.max_skips == 2
    assert parse_config(GOOD + "sentinel: {max_skips: 0}\n").config.max_skips == 0
    assert parse_config(GOOD + "sentinel: {on_spike: rollback}\n").config.max_skips == 2
    assert parse_config(GOOD + "sentinel: off\n").config.max_skips == 0
