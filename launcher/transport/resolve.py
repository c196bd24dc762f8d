"""Each host's TF_CONFIG address, from the cluster file, the ssh config and the
agents' hellos: the rules of launcher/spec/addresses.py, fed with what only the
launcher's side can read.

`tf_addresses` is the one entry point: the CLI calls it before the first plan
(`--dry-run` included, with no hellos) and again once the agents said hello;
`check` calls it to test reachability on exactly these addresses. The ssh
config is read by `ssh_endpoint`'s own parser and lookup, so the TF address and
the connection can never disagree on what an alias means.

Must not import: supervisor, cli.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..spec.addresses import AddressError, TFAddress, choose, host_name, with_interfaces
from ..spec.config import LoadedConfig
from ..spec.target import HostTarget
from ..spec.transports import traits

if TYPE_CHECKING:  # paramiko is imported only for SSH hosts that need it
    from .ssh_endpoint import SSHConfigs


def tf_addresses(loaded: LoadedConfig, targets: Sequence[HostTarget],
                 hellos: Mapping[str, Mapping[str, Any] | None] | None = None, *,
                 ssh_configs: SSHConfigs | None = None) -> dict[str, TFAddress]:
    """Host name -> its TF_CONFIG address and the rule that chose it, for `targets`.

    `hellos` (host name -> its agent's hello, e.g. `link.hello`) fill in the
    addresses of named network interfaces; without them (`--dry-run`) those
    stay unknown (`TFAddress.address` None, shown as `<address of IF on HOST>`).
    Raises AddressError naming every host whose address cannot be had (an
    unreadable ssh config, a missing interface); its `addresses` hold the rest.
    """
    config = loaded.config
    specs = {host_name(h): h for h in config.hosts}
    out: dict[str, TFAddress] = {}
    problems: dict[str, str] = {}
    for target in targets:
        spec = specs[target.name]
        tf = choose(config, spec)
        if traits(config.transport).ssh and tf.rule == "address":  # ~/.ssh/config's HostName
            from .ssh_endpoint import Refused, SSHConfigs, target_hostname

            ssh_configs = ssh_configs or SSHConfigs()
            try:
                options = ssh_configs.lookup(target.ssh_config_file, target.address)
            except Refused as exc:
                problems[target.name] = str(exc)
            else:
                tf = choose(config, spec, target_hostname(target, options),
                            target.ssh_config_file or "the ssh config")
        out[target.name] = tf
    try:
        out = with_interfaces(out, hellos or {})
    except AddressError as exc:
        problems.update(exc.problems)
        out = exc.addresses
    if problems:
        raise AddressError(problems, out)
    return out
