"""The memory tier's copies on other hosts: relayed by the launcher, placed for restores.

With `checkpoint: {memory: true}` each save that goes to the shared directory
is also copied to one other host's memory (launcher/agent/peercopy.py). Hosts
usually reach each other only on the job's TensorFlow ports, so the copy goes
the one path every transport gives, SSH, --local and Slurm alike: agent A ->
launcher -> agent B over the agents' own channels. This module is the
launcher's part:

- **A worker's own save is the second copy.** Under MultiWorkerMirroredStrategy
  every worker saves the same weights (its own `workertemp_<n>` save, kept in
  its memory: runtime/memtier.py). A chief's save that another live host
  already holds byte for byte (the same checkpoint, step and directory; each
  file's size and crc32 equal: `fingerprint` in `memory_held`) is not sent:
  that host's save covers it (`covers`; `memory_copy` says `covered_by`).
  A chief's offer (`peer_begin`) waits for the other hosts' saves of it at
  most HOLD_S, and not at all once a save of that directory came uncovered
  (a script whose workers save something else, or nothing).
- **Relay.** A copy's chunks (`peer_begin`, `peer_chunk`, `peer_end`) go on
  to the next host in the plan's host order (once the launcher said go to the
  sender: `peer_ack` with n -1); the receiver's `peer_ack` goes
  back to the sender, which keeps at most peercopy.WINDOW chunks (4 MiB) not
  yet acknowledged: the launcher holds that much per copy at most.
- **What each host holds.** Every slot a host gains is said (`memory_held`:
  its checkpoint's directory key, kind, name, step, time); a host lost or
  reconnected (its agent's folder swept) holds nothing.
- **Before a restart** (`prepare`): for each checkpoint directory, the newest
  save of the chief that a live host holds complete is the one every worker
  restores. A holder copies it to the shared directory when that names an
  older one (the chief's host died before its copy ended: `peer_publish`),
  and each host of the new plan that holds no copy of it gets one placed in
  its memory from a holder (`peer_send`, relayed as above, sha256 checked).
  The tasks start once that is done (at most PREPARE_S); each restores the
  checkpoint the directory names, from its own memory, a placed copy, or the
  directory (runtime/memtier.py), and says which (`resumed`).

Runs on the supervisor's thread: `take` is fed every message of a `peer_*` or
`memory_held` kind before anything else sees it.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from ...transport import AgentLink, AgentMessage
from ..record import events as ev

PREPARE_S = 120.0  # at most, before a restart, for copies placed and published
HOLD_S = 10.0  # at most, a chief's save waits for another host's save to cover it
KINDS = frozenset({"memory_held", "peer_begin", "peer_chunk", "peer_end", "peer_ack",
                   "peer_stored", "peer_done"})
_FORWARD = {"peer_begin", "peer_chunk", "peer_end"}  # source -> destination
SaveId = tuple[str, str, str]  # (directory key, kind, checkpoint name)


def _save(info: dict[str, Any]) -> SaveId:
    return (str(info.get("key")), str(info.get("kind")), str(info.get("pointer")))


def _newness(info: dict[str, Any]) -> tuple[float, float]:
    step = info.get("step")
    return (float(step) if isinstance(step, int | float) else -1.0,
            float(info.get("time") or 0.0))


def _same_save(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two held slots are one checkpoint: the same save of the same directory,
    each file's size and crc32 equal (the pointer files apart)."""
    return bool(a.get("fingerprint")) and a.get("fingerprint") == b.get("fingerprint") and all(
        a.get(k) == b.get(k) for k in ("key", "kind", "pointer", "step", "target"))


def _chiefs(info: dict[str, Any], host: str) -> bool:
    """A chief's own save, on its own host (not a copy of one)."""
    return bool(info.get("copy")) and info.get("origin") in (None, host)


def checkpoint_name(kind: object, pointer: object) -> str:
    """A save as a person names it: `ckpt-3`, or a Keras backup's `epoch 2`."""
    text = str(pointer or "")
    if kind == "keras" and text.startswith("{"):
        try:
            return f"epoch {json.loads(text).get('epoch')}"
        except (ValueError, AttributeError):
            return "a backup"
    return os.path.basename(text) or "a save"


class PeerRelay:
    """The launcher's side of the copies in another host's memory."""

    def __init__(self, links: Callable[[], dict[str, AgentLink]],
                 tell: Callable[[ev.Event], None],
                 clock: Callable[[], float] = time.monotonic, hold_s: float = HOLD_S) -> None:
        self._links = links
        self._tell = tell
        self._clock = clock
        self._hold_s = hold_s
        # directory key -> whether the other hosts' own saves covered its last
        # chief save (absent: not known yet); False: its offers go at once
        self._covering: dict[str, bool] = {}
        self._chief_saves: dict[SaveId, tuple[str, str]] = {}  # the chief's own, held: where
        self.held: dict[str, dict[str, dict[str, Any]]] = {}  # host -> slot -> what it holds
        self._xfers: dict[str, dict[str, Any]] = {}  # xfer -> source, dest, placed, ...
        self._answers: dict[str, dict[str, Any]] = {}  # placements and publishes answered
        self._order: list[str] = []
        self._keep = 2
        self._ids = itertools.count(1)

    # --- the plan -------------------------------------------------------------

    def use_plan(self, hosts: Iterable[str], keep: int) -> None:
        """The hosts in the plan's order (the copies' ring) and memory_copies."""
        self._order = list(dict.fromkeys(hosts))
        self._keep = max(1, keep)

    def forget(self, host: str) -> None:
        """A host lost, or a new agent there (it swept its folder): it holds nothing."""
        self.held.pop(host, None)
        for xfer, info in list(self._xfers.items()):
            if host in (info["source"], info["dest"]):
                self._finish(xfer, ok=False, error=f"host {host} lost")

    def _alive(self, host: str) -> AgentLink | None:
        link = self._links().get(host)
        return None if link is None or link.closed else link

    def neighbour(self, host: str) -> str | None:
        """The next live host after `host` in the plan's order (around)."""
        order = self._order
        start = order.index(host) + 1 if host in order else 0
        for other in order[start:] + order[:start]:
            if other != host and self._alive(other):
                return other
        return None

    # --- messages --------------------------------------------------------------

    def consumed(self, message: AgentMessage) -> bool:
        """True when `message` is the relay's (taken). A new agent on a host,
        or a lost one, holds no copies (its folder is swept)."""
        event = message.event
        if event not in KINDS and event != "hello" and event != "agent_lost":
            return False  # the cost of the relay for any other message
        link = self._links().get(message.host)
        current = link is None or not message.link_id or message.link_id == link.link_id
        if event in KINDS:
            if current:
                self.take(message)
            return True
        if event == "hello":  # a new agent there: it swept the old one's folder
            self.held.pop(message.host, None)
        elif current:
            self.forget(message.host)
        return False

    def take(self, message: AgentMessage) -> None:
        """One `memory_held` or `peer_*` message from an agent."""
        body, host, event = message.message, message.host, message.event
        xfer = str(body.get("xfer") or "")
        if event == "memory_held":
            self._held(host, body)
        elif event == "peer_begin" and xfer not in self._xfers:
            dest = self.neighbour(host)
            self._xfers[xfer] = {"source": host, "dest": dest, "placed": False,
                                 "began": self._clock(), "forwarded": False}
            self._begin(xfer, body)
        elif event == "peer_begin":
            self._begin(xfer, body)
        elif event in _FORWARD and xfer in self._xfers:
            self._forward(xfer, body)
        elif event == "peer_ack" and xfer in self._xfers:
            self._send(self._xfers[xfer]["source"], {"op": "peer_ack", "xfer": xfer,
                                                     "n": body.get("n")})
        elif event == "peer_stored" and xfer in self._xfers:
            self._finish(xfer, ok=bool(body.get("ok")), error=str(body.get("error") or ""))
        elif event == "peer_done":
            self._answers[xfer] = {"ok": bool(body.get("ok")), "done": body.get("done")}

    def _held(self, host: str, body: dict[str, Any]) -> None:
        slot = body.get("slot")
        if not isinstance(slot, str) or not isinstance(body.get("key"), str):
            return
        slots = self.held.setdefault(host, {})
        slots[slot] = {k: body.get(k) for k in ("key", "kind", "pointer", "step", "time",
                                                "copy", "origin", "target", "fingerprint")}
        # The agent keeps memory_copies slots per folder: so does this picture.
        folder = [s for s in slots if os.path.dirname(s) == os.path.dirname(slot)]
        for old in sorted(folder, key=lambda s: _newness(slots[s]))[:-self._keep]:
            slots.pop(old, None)
        if slot in slots:
            self._compare(host, slot)

    def _compare(self, host: str, slot: str) -> None:
        """A slot said: a worker's save that is a chief's on another host covers
        it (the chief's offer, waiting or under way, ends); one that differs lets
        the offers of its directory go without waiting. Each slot is compared
        with the chief's save of its step only: a few per save, at any scale."""
        info, save = self.held[host][slot], _save(self.held[host][slot])
        if _chiefs(info, host):
            self._chief_saves[save] = (host, slot)
            for gone in [s for s, (h, sl) in self._chief_saves.items()
                         if sl not in self.held.get(h, {})]:
                del self._chief_saves[gone]  # pruned: as many as the chief's slots
            workers = [(h, s) for h, slots in self.held.items() if h != host
                       for s, i in slots.items() if not i.get("copy") and _save(i) == save]
        elif not info.get("copy") and save in self._chief_saves:
            workers = [(host, slot)]
        else:
            return
        chief_host, chief_slot = self._chief_saves[save]
        chief = self.held.get(chief_host, {}).get(chief_slot)
        if chief is None or _save(chief) != save:  # pruned, or its path taken again
            return
        for worker_host, worker_slot in workers:
            worker = self.held[worker_host][worker_slot]
            if worker_host == chief_host:
                continue
            if _same_save(chief, worker):
                worker["covers"] = chief_host  # the chief's host: what a copy of it says
                chief.setdefault("covered_by", []).append((worker_host, worker_slot))
                self._covering[save[0]] = True
            elif chief.get("fingerprint") and worker.get("fingerprint"):
                self._covering[save[0]] = False
        self.tick()

    def _cover(self, offer: dict[str, Any]) -> tuple[str, str] | None:
        """A live host other than the offer's source holding its save, verified."""
        mine = self.held.get(offer["source"], {}).get(offer["slot"]) or {}
        for host, slot in mine.get("covered_by", ()):
            if self._alive(host) and slot in self.held.get(host, {}):
                return host, slot
        return None

    def _begin(self, xfer: str, body: dict[str, Any]) -> None:
        info = self._xfers[xfer]
        manifest = body.get("manifest") if isinstance(body.get("manifest"), dict) else {}
        files = body.get("files") if isinstance(body.get("files"), list) else []
        info.update(manifest=manifest, bytes=sum(int(f[1]) for f in files
                                                 if isinstance(f, list) and len(f) == 2
                                                 and isinstance(f[1], int)),
                    body=body, slot=str(body.get("slot") or ""))
        if info["dest"] is None:
            self._cancel(xfer)
            return
        if info["placed"]:
            self._go(xfer)
            return
        info["hold_until"] = self._clock() + self._hold_s
        self._decide(xfer)

    def _decide(self, xfer: str) -> None:
        """A chief's offer: covered (it ends, under way or not), sent, or left
        waiting for a worker's save (HOLD_S at most: then its directory's next
        offers go at once, until a cover is seen again)."""
        info = self._xfers[xfer]
        key = str(info["manifest"].get("key"))
        cover = self._cover(info)
        if cover is not None and not info.get("sent_all"):  # its bytes all went: it ends
            self._covered(xfer, cover)
        elif not info["forwarded"] and self._clock() >= info["hold_until"]:
            self._covering[key] = False
            self._go(xfer)
        elif not info["forwarded"] and self._covering.get(key) is False:
            self._go(xfer)

    def tick(self) -> None:
        """Each chief's offer decided again (told every ~0.5 s, and as slots are said)."""
        for xfer, info in list(self._xfers.items()):
            if not info["placed"] and "hold_until" in info and xfer in self._xfers:
                self._decide(xfer)

    def _go(self, xfer: str) -> None:
        """The copy begins at the destination, then the source is told to send."""
        info = self._xfers[xfer]
        info["forwarded"] = True
        if self._forward(xfer, {**info.pop("body"), "from_host": info["source"],
                                "keep": self._keep}):
            self._send(info["source"], {"op": "peer_ack", "xfer": xfer, "n": -1})

    def _covered(self, xfer: str, cover: tuple[str, str]) -> None:
        """Another host holds the save already: the copy is not made (what of it
        reached the destination is dropped)."""
        info = self._xfers.pop(xfer)
        host, slot = cover
        self._end_both(xfer, info, f"{host} holds the same save")
        manifest = info.get("manifest") or {}
        self._tell(ev.MemoryCopy(
            host=host, source=info["source"], origin=str(manifest.get("origin") or info["source"]),
            checkpoint=checkpoint_name(manifest.get("kind"), manifest.get("pointer")),
            seconds=round(self._clock() - info["began"], 3),
            covered_by=os.path.basename(os.path.dirname(slot))))

    def _forward(self, xfer: str, body: dict[str, Any]) -> bool:
        """On to the destination; a chunk's bytes (a frame, transport/link.py)
        as they came, after a header made of its few other fields."""
        info = self._xfers[xfer]
        command = {k: v for k, v in body.items() if k not in ("ev", "t", "raw")}
        command["op"] = body["ev"]
        info["sent_all"] = command["op"] == "peer_end"  # the source's last word on it
        if command["op"] != "peer_chunk":
            sent = self._send(info["dest"], command)
        elif isinstance(body.get("raw"), bytes):
            link = self._alive(info["dest"])
            sent = link is not None and link.send_frame(command, body["raw"])
        else:  # a chunk without its bytes (a line, not a frame): the copy is broken
            sent = False
        if not sent:
            self._cancel(xfer)
        return sent

    def _send(self, host: str | None, command: dict[str, Any]) -> bool:
        link = self._alive(host) if host else None
        return link is not None and link.send(command)

    def _cancel(self, xfer: str) -> None:
        info = self._xfers.get(xfer)
        if info is not None:
            self._send(info["source"], {"op": "peer_ack", "xfer": xfer, "cancel": True})
            self._finish(xfer, ok=False, error="no host to copy to" if info["dest"] is None
                         else f"host {info['dest']} does not answer")

    def _finish(self, xfer: str, ok: bool, error: str) -> None:
        info = self._xfers.pop(xfer, None)
        if info is None:
            return
        if not ok:
            self._end_both(xfer, info, error)
        if info["dest"] is None and not info["placed"]:
            return  # one host: nowhere to copy, nothing to say
        manifest = info.get("manifest") or {}
        self._tell(ev.MemoryCopy(
            host=str(info["dest"]), source=info["source"],
            origin=str(manifest.get("origin") or info["source"]),
            checkpoint=checkpoint_name(manifest.get("kind"), manifest.get("pointer")),
            bytes=int(info.get("bytes") or 0), placed=info["placed"],
            seconds=round(self._clock() - info["began"], 3), error=None if ok else error))

    # --- before a restart ---------------------------------------------------------

    def prepare(self, hosts: list[str], pump: Callable[[], bool]) -> None:
        """The newest save every host of the next generation can read: published
        to its directory, and placed in the memory of each host without it.

        Sent ahead of the starts, on the same links: a holder's publish is
        queued before its task's start, its directory marked while the copy is
        queued or under way, and every restore waits for that marker
        (agent/memcopy.py, runtime/memslots.py: so before any worker reads the
        directory: they do after every task started); a
        placement is announced (`peer_expect`) before the start, and the
        restore waits for it (runtime/memslots.py), so the copy runs while
        TensorFlow starts. Only a publish on a host outside the plan is waited
        for here (at most PREPARE_S)."""
        waiting: list[str] = []
        for holders in self._newest().values():
            holder = holders[0]  # a chief's save (the newest is one)
            xfer = self._ask(holder[0], {"op": "peer_publish", "slot": holder[1]})
            if holder[0] not in hosts:
                waiting.append(xfer)
            for host in hosts:
                if self._alive(host) and not self._holds(host, holders) \
                        and host not in [x["dest"] for x in self._xfers.values() if x["placed"]]:
                    self._place(holder, host)
        deadline = self._clock() + PREPARE_S
        while any(x not in self._answers for x in waiting) and self._clock() < deadline:
            if pump():
                return  # a stop came

    def _place(self, holder: tuple[str, str], host: str) -> None:
        xfer = f"L{next(self._ids)}"
        self._xfers[xfer] = {"source": holder[0], "dest": host, "placed": True,
                             "began": self._clock(), "forwarded": True}
        send: dict[str, Any] = {"op": "peer_send", "xfer": xfer, "slot": holder[1]}
        covers = self.held.get(holder[0], {}).get(holder[1], {}).get("covers")
        if isinstance(covers, str):  # a worker's save: placed as a copy of the chief's
            send["as_copy_of"] = covers
        if not self._send(host, {"op": "peer_expect", "xfer": xfer}) or not self._send(
                holder[0], send):
            self._finish(xfer, ok=False, error="a host does not answer")

    def _ask(self, host: str, command: dict[str, Any]) -> str:
        xfer = f"L{next(self._ids)}"
        if not self._send(host, {**command, "xfer": xfer}):
            self._answers[xfer] = {"ok": False, "done": f"host {host} does not answer"}
        return xfer

    def _end_both(self, xfer: str, info: dict[str, Any], why: str) -> None:
        """A copy ended early: the sender stops (it would wait ACK_WAIT_S), the
        receiver, if it heard of it, drops what it has (a restore waiting for
        it goes on)."""
        self._send(info["source"], {"op": "peer_ack", "xfer": xfer, "cancel": True, "why": why})
        if info.get("forwarded", True):
            self._send(info["dest"], {"op": "peer_end", "xfer": xfer, "error": why})

    def _newest(self) -> dict[str, list[tuple[str, str]]]:
        """Per directory key: (host, slot) of each live holder of its newest
        complete save of the chief, or of a worker's save that covers one (the
        chief's own slots first)."""
        best: dict[str, tuple[tuple[float, float], SaveId]] = {}
        for host, slots in self.held.items():
            if not self._alive(host):
                continue
            for info in slots.values():
                key = str(info.get("key"))
                if (info.get("copy") or info.get("covers")) \
                        and (key not in best or _newness(info) > best[key][0]):
                    best[key] = (_newness(info), _save(info))
        holders: dict[str, list[tuple[str, str]]] = {}
        for key, (_when, save) in best.items():
            # The chief's own save first, then its copies on other hosts (the bytes
            # the directory gets), a worker's save that covers it; other workers'
            # saves of the same step last.
            found = [(not info.get("copy"), info.get("origin") != host, not info.get("covers"),
                      host, slot)
                     for host, slots in self.held.items() if self._alive(host)
                     for slot, info in slots.items() if _save(info) == save]
            holders[key] = [(host, slot) for *_rank, host, slot in sorted(found)]
        return {key: found for key, found in holders.items() if found}

    def _holds(self, host: str, holders: Iterable[tuple[str, str]]) -> bool:
        wanted = {_save(self.held[h][s]) for h, s in holders}
        return any(_save(info) in wanted for info in self.held.get(host, {}).values())
