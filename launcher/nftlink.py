"""The job's nftables table, installed and removed over netlink: no `nft` process.

`nft` reads the kernel's tables, chains, sets and objects (of every table on
the host) before any command that adds a rule or deletes a table: on a host
with 31 other tables (32 simulated hosts on one kernel) one install or removal
took 12-13 ms of CPU against 2-3 ms alone, and starting `nft` itself 1.5 ms.
This module sends the one transaction (`launcher.fwrules.render_nft`'s rules,
expression for expression as nft 1.0.6 encodes them) itself: it reads nothing.

`send` raises `NetlinkError` (with the kernel's errno) when the kernel refuses
the batch, or OSError where netlink itself is not there; the caller then runs
`nft`. Standard library only (shipped with the agent, like launcher.firewall).
"""

from __future__ import annotations

# _socket, not socket: socket.py pulls in enum and more (~2 ms of every agent start).
import _socket
import contextlib
import errno
import os
import struct
from collections.abc import Sequence

NETLINK_NETFILTER = 12
SUBSYS = 10  # NFNL_SUBSYS_NFTABLES
BATCH_BEGIN, BATCH_END = 0x10, 0x11  # NFNL_MSG_BATCH_*
NEWTABLE, DELTABLE, NEWCHAIN, NEWRULE, NEWSET, NEWSETELEM = 0, 2, 3, 6, 9, 12
REQUEST, ACK, EXCL, CREATE, APPEND = 0x1, 0x4, 0x200, 0x400, 0x800  # NLM_F_*
NESTED = 0x8000  # NLA_F_NESTED
INET, IPV4, IPV6 = 1, 2, 10  # NFPROTO_*
HOOK_INPUT, HOOK_OUTPUT = 1, 3  # NF_INET_LOCAL_IN, NF_INET_LOCAL_OUT
REG = 1  # NFT_REG_1; NFT_REG_VERDICT is 0
REG_2, REG32_01 = 2, 9  # where nft puts a concatenation's port: after an IPv6, an IPv4 address
# nft's user data of an `ipv4_addr . inet_service` set (and of the IPv6 one), as nft 1.0.6 sends it
CONCAT_UDATA = bytes.fromhex("00040000000003080004" "0d0000000100")
NETWORK, TRANSPORT = 1, 2  # NFT_PAYLOAD_*_HEADER
L4PROTO, NFPROTO, IIFNAME, OIFNAME, SKUID = 16, 15, 6, 7, 10  # NFT_META_*
DROP, JUMP, RETURN = 0, -3, -5  # NF_DROP, NFT_JUMP, NFT_RETURN
# nft's datatypes (src/datatype.h), by which `nft list` prints a set's elements
IPADDR, IP6ADDR, INET_SERVICE, UID = 7, 8, 13, 24
HOST, BIG = 1, 2  # their byte order (enum byteorder)
ELEMENTS_PER_MESSAGE = 1000  # an attribute's length is 16 bits: 1,000 IPv6 keys ~28 KB
TIMEOUT_S = 5.0
NLMSG_ERROR, SOL_NETLINK, NETLINK_CAP_ACK, SO_SNDBUFFORCE = 2, 270, 10, 32
MAX_FD = 65536  # closed in a detached child


class NetlinkError(OSError):
    """The kernel refused the batch; `errno` is its reason."""


def _attr(kind: int, payload: bytes) -> bytes:
    head = struct.pack("=HH", 4 + len(payload), kind)
    return head + payload + b"\0" * (-len(payload) % 4)


def _nest(kind: int, *attrs: bytes) -> bytes:
    return _attr(kind | NESTED, b"".join(attrs))


def _u32(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack(">I", value & 0xFFFFFFFF))


def _str(kind: int, text: str) -> bytes:
    return _attr(kind, text.encode() + b"\0")


def _data(kind: int, value: bytes) -> bytes:
    return _nest(kind, _attr(1, value))  # NFTA_DATA_VALUE


# ---------------------------------------------------------------- expressions


def _expr(name: str, *attrs: bytes) -> bytes:
    return _nest(1, _str(1, name), _nest(2, *attrs))  # NFTA_LIST_ELEM{NAME, DATA}


def _meta(key: int) -> bytes:
    return _expr("meta", _u32(2, key), _u32(1, REG))


def _cmp(value: bytes) -> bytes:
    return _expr("cmp", _u32(1, REG), _u32(2, 0), _data(3, value))  # NFT_CMP_EQ


def _payload(base: int, offset: int, length: int, reg: int = REG) -> bytes:
    return _expr("payload", _u32(1, reg), _u32(2, base), _u32(3, offset), _u32(4, length))


def _lookup(set_id: int, name: str = "__set%d") -> bytes:
    return _expr("lookup", _str(1, name), _u32(2, REG), _u32(4, set_id))


def _verdict(code: int, chain: str = "") -> bytes:
    inner = [_u32(1, code)] + ([_str(2, chain)] if chain else [])
    return _expr("immediate", _u32(1, 0), _nest(2, _nest(2, *inner)))


def _tcp_syn() -> list[bytes]:
    """`tcp flags & (fin|syn|rst|ack) == syn`"""
    return [_payload(TRANSPORT, 13, 1),
            _expr("bitwise", _u32(1, REG), _u32(2, REG), _u32(3, 1), _data(4, b"\x17"),
                  _data(5, b"\0")),
            _cmp(b"\x02")]


def _ifname(name: str) -> bytes:
    return name.encode().ljust(16, b"\0")  # IFNAMSIZ


# ---------------------------------------------------------------- the batch


class _Batch:
    def __init__(self, table: str) -> None:
        self.table, self.messages, self.set_id = table, [], 0

    def add(self, kind: int, flags: int, *attrs: bytes, family: int = INET) -> None:
        body = struct.pack("=BBH", family, 0, 0) + b"".join(attrs)
        self.messages.append((kind, flags, body))

    def chain(self, name: str, hook: int | None = None, priority: int = 0) -> None:
        attrs = [_str(1, self.table), _str(3, name)]
        if hook is not None:
            attrs += [_nest(4, _u32(1, hook), _u32(2, priority)), _u32(5, 1),  # NF_ACCEPT
                      _str(7, "filter")]
        self.add(NEWCHAIN, CREATE, *attrs)

    def anonymous_set(self, key_type: int, keys: Sequence[bytes], order: int = BIG) -> int:
        """An anonymous constant set of `keys` (all one length); its id for a lookup."""
        self.set_id += 1
        self.add(NEWSET, CREATE, _str(1, self.table), _str(2, "__set%d"), _u32(3, 0x3),
                 _u32(4, key_type), _u32(5, len(keys[0])), _u32(10, self.set_id),
                 _nest(9, _u32(1, len(keys))),  # ANONYMOUS|CONSTANT; DESC_SIZE
                 # nft's user data: the key's byte order (libnftnl's udata TLV)
                 _attr(13, struct.pack("=BBI", 0, 4, order)))
        for i in range(0, len(keys), ELEMENTS_PER_MESSAGE):
            elements = [_nest(1, _nest(1, _attr(1, key)))  # LIST_ELEM{KEY{VALUE}}
                        for key in keys[i:i + ELEMENTS_PER_MESSAGE]]
            self.add(NEWSETELEM, CREATE, _str(1, self.table), _str(2, "__set%d"),
                     _u32(4, self.set_id), _nest(3, *elements))
        return self.set_id

    def named_set(self, name: str, key_type: int, length: int, keys: Sequence[bytes],
                  udata: bytes) -> int:
        """A named set (its elements may be added later: `add_elements`); its id."""
        self.set_id += 1
        self.add(NEWSET, CREATE, _str(1, self.table), _str(2, name), _u32(3, 0),
                 _u32(4, key_type), _u32(5, length), _u32(10, self.set_id), _attr(13, udata))
        self.elements(name, keys, self.set_id)
        return self.set_id

    def elements(self, name: str, keys: Sequence[bytes], set_id: int | None = None) -> None:
        for i in range(0, len(keys), ELEMENTS_PER_MESSAGE):
            elements = [_nest(1, _nest(1, _attr(1, key)))  # LIST_ELEM{KEY{VALUE}}
                        for key in keys[i:i + ELEMENTS_PER_MESSAGE]]
            self.add(NEWSETELEM, CREATE, _str(1, self.table), _str(2, name),
                     *([] if set_id is None else [_u32(4, set_id)]), _nest(3, *elements))

    def match(self, key_type: int, keys: Sequence[bytes], order: int = BIG) -> bytes:
        """The register equals one of `keys`: a set's lookup, or as nft makes of a
        set of one, a comparison."""
        if len(keys) == 1:
            return _cmp(keys[0])
        return _lookup(self.anonymous_set(key_type, keys, order))

    def rule(self, chain: str, *exprs: bytes) -> None:
        self.add(NEWRULE, CREATE | APPEND, _str(1, self.table), _str(2, chain),
                 _nest(4, *exprs))

    def encode(self, seq: int) -> bytes:
        """The messages between BATCH_BEGIN and BATCH_END; the last asks for an
        ACK. A refused message is answered whether it asked or not, before
        that ACK: the first answer that is not 0 is the kernel's reason."""
        frame = struct.pack("=BBH", 0, 0, _socket.htons(SUBSYS))
        last = len(self.messages)
        out = [_message(BATCH_BEGIN, REQUEST, frame, seq)]
        for i, (kind, flags, body) in enumerate(self.messages, 1):
            out.append(_message(SUBSYS << 8 | kind, REQUEST | flags | (ACK if i == last else 0),
                                body, seq + i))
        out.append(_message(BATCH_END, REQUEST, frame, seq + last + 1))
        return b"".join(out)


def _message(kind: int, flags: int, body: bytes, seq: int) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def install_batch(table: str, ports: Sequence[int], v4: Sequence[str], v6: Sequence[str],
                  uids: Sequence[int], priority: int, replace: bool = True,
                  targets: tuple[Sequence[tuple[str, int]], Sequence[tuple[str, int]]] = ((), ()),
                  ) -> _Batch:
    """The table of `fwrules.render_nft`, replacing one of the same name, or
    (`replace=False`) refused with EEXIST where there is one. `targets`: the
    (IPv4, port) and (IPv6, port) pairs of the sets cluster4 and cluster6."""
    batch = _Batch(table)
    if replace:  # as render_nft: `table inet X`, for the delete to find it there
        batch.add(NEWTABLE, CREATE, _str(1, table))
        batch.add(DELTABLE, 0, _str(1, table))
    batch.add(NEWTABLE, CREATE | (0 if replace else EXCL), _str(1, table))
    batch.chain("input", HOOK_INPUT, priority)
    batch.chain("guard")
    batch.chain("output", HOOK_OUTPUT, priority)
    batch.chain("local")
    ports_id = batch.named_set("ports", INET_SERVICE, 2, [port_key(p) for p in ports],
                               struct.pack("=BBI", 0, 4, BIG))
    cluster_ids = [batch.named_set(name, key_type, length, [target_key(a, p) for a, p in pairs],
                                   CONCAT_UDATA)
                   for name, key_type, length, pairs in (
                       ("cluster4", IPADDR << 6 | INET_SERVICE, 8, targets[0]),
                       ("cluster6", IP6ADDR << 6 | INET_SERVICE, 20, targets[1]))]
    tcp = [_meta(L4PROTO), _cmp(b"\x06")]
    to_ports = [*tcp, _payload(TRANSPORT, 2, 2), _lookup(ports_id, "ports")]
    batch.rule("input", *to_ports, *_tcp_syn(), _verdict(JUMP, "guard"))
    batch.rule("guard", _meta(IIFNAME), _cmp(_ifname("lo")), _verdict(RETURN))
    for family, addresses, key_type, offset, pack in (
            (IPV4, v4, IPADDR, 12, _socket.AF_INET), (IPV6, v6, IP6ADDR, 8, _socket.AF_INET6)):
        if addresses:
            keys = [_socket.inet_pton(pack, a) for a in addresses]
            batch.rule("guard", _meta(NFPROTO), _cmp(bytes([family])),
                       _payload(NETWORK, offset, len(keys[0])), batch.match(key_type, keys),
                       _verdict(RETURN))
    batch.rule("guard", _expr("counter"), _verdict(DROP))
    batch.rule("output", _meta(OIFNAME), _cmp(_ifname("lo")), *to_ports, *_tcp_syn(),
               _verdict(JUMP, "local"))
    # `ip daddr . tcp dport @cluster4`: the address in register 1, the port next to it
    for (family, offset, length, port_reg), set_id, name in zip(
            ((IPV4, 16, 4, REG32_01), (IPV6, 24, 16, REG_2)), cluster_ids,
            ("cluster4", "cluster6"), strict=True):
        batch.rule("output", _meta(NFPROTO), _cmp(bytes([family])), *tcp,
                   _payload(NETWORK, offset, length), _payload(TRANSPORT, 2, 2, port_reg),
                   _lookup(set_id, name), *_tcp_syn(), _verdict(JUMP, "local"))
    uid_keys = [struct.pack("=I", u) for u in sorted(set(uids))]
    batch.rule("local", _meta(SKUID), batch.match(UID, uid_keys, HOST), _verdict(RETURN))
    batch.rule("local", *tcp, _expr("counter"),
               _expr("reject", _u32(1, 1), _attr(2, b"\0")))  # NFT_REJECT_TCP_RST
    return batch


def port_key(port: int) -> bytes:
    return struct.pack(">H", port)


def target_key(address: str, port: int) -> bytes:
    """A cluster set's key: the address, then the port in a register of its own."""
    family = _socket.AF_INET6 if ":" in address else _socket.AF_INET
    return _socket.inet_pton(family, address) + struct.pack(">H", port) + b"\0\0"


def add_elements(table: str, set_name: str, keys: Sequence[bytes]) -> None:
    """Add `keys` to the named set of the job's table (`nft add element`): keys
    already there are no error. OSError when netlink or the kernel refused."""
    if not enabled():
        raise OSError("MGPU_NFT_NETLINK=0")
    batch = _Batch(table)
    batch.elements(set_name, keys)
    send(batch)


def delete_batch(table: str) -> _Batch:
    batch = _Batch(table)
    batch.add(DELTABLE, 0, _str(1, table))
    return batch


def send(batch: _Batch) -> None:
    """Send one transaction; returns once the kernel has committed it."""
    data = batch.encode(int.from_bytes(os.urandom(2), "little") << 8 | 1)
    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        sock.settimeout(TIMEOUT_S)
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)  # an error without our message
        if len(data) > 200_000:  # past the default send buffer (net.core.wmem_default)
            sock.setsockopt(_socket.SOL_SOCKET, SO_SNDBUFFORCE, len(data) + 65536)
        sock.bind((0, 0))
        sock.send(data)
        while True:
            reply = sock.recv(65536)
            offset = 0
            while offset + 20 <= len(reply):
                length, kind = struct.unpack_from("=IH", reply, offset)
                if kind == NLMSG_ERROR:  # errno 0: the ACK
                    error = -struct.unpack_from("=i", reply, offset + 16)[0]
                    if error:
                        raise NetlinkError(error, os.strerror(error))
                    return
                offset += max(16, (length + 3) & ~3)
    finally:
        sock.close()


def enabled() -> bool:
    """`MGPU_NFT_NETLINK=0` in the agent's environment: the `nft` tool instead."""
    return os.environ.get("MGPU_NFT_NETLINK", "1") != "0"


def install(table: str, ports: Sequence[int], v4: Sequence[str], v6: Sequence[str],
            uids: Sequence[int], priority: int,
            targets: tuple[Sequence[tuple[str, int]], Sequence[tuple[str, int]]] = ((), ()),
            ) -> None:
    """Install (or replace) the job's table; OSError when netlink or the kernel
    refused. A transaction that deletes a table waits for the kernel's RCU grace
    period (~10 ms of wall; one transaction at a time: 32 simulated hosts' installs
    waited up to 0.5 s for each other): one that only creates returns at once, so
    the table is replaced only where there is one."""
    if not enabled():
        raise OSError("MGPU_NFT_NETLINK=0")
    try:
        send(install_batch(table, ports, v4, v6, uids, priority, replace=False,
                           targets=targets))
    except NetlinkError as exc:
        if exc.errno != errno.EEXIST:
            raise
        send(install_batch(table, ports, v4, v6, uids, priority, targets=targets))


def delete(table: str, wait: bool = True, nft: str | None = None) -> bool:
    """Delete the table, its chains, rules and sets: True, or False when there
    is none; OSError when the kernel refused. `wait=False` (an agent's exit): a
    child process of its own session sends it, `nft` if that fails; True once
    started. The kernel commits one transaction at a time, ~10 ms each: 32
    agents on one kernel would wait up to 0.3 s for each other's."""
    if not enabled():
        raise OSError("MGPU_NFT_NETLINK=0")
    if not wait:
        if os.fork() == 0:
            _detached(table, nft)
        return True
    try:
        send(delete_batch(table))
    except NetlinkError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def _detached(table: str, nft: str | None) -> None:
    """The forked child: nothing of the agent's but this transaction (its
    SSH channel closed, no lock held), then out."""
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, MAX_FD)
        delete(table)
    except OSError:
        if nft:
            with contextlib.suppress(OSError):
                os.execv(nft, [nft, "delete", "table", "inet", table])
    finally:
        os._exit(0)
