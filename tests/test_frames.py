"""Frames on the agent's channel: a header line `{"raw":N,...}`, then N raw bytes
(launcher/agent/protocol.py), the way a chunk of the peer copy travels.

Both readers (the launcher's AgentLink, the agent's command reader) read a
frame whole, bytes with newlines and JSON inside included; refuse one that is
too large, of the wrong kind or with a broken header with a `log` and stay in
step with the stream; and end cleanly when the pipe ends inside one. What
`send_frame` and the agent's `Emitter.frame` write, the other side reads back.
"""

from __future__ import annotations

import io
import os
import queue
import sys
import threading

import pytest

from launcher.agent.commands import Lines, _read_stdin
from launcher.agent.protocol import (
    MAX_FRAME_BYTES,
    Emitter,
    frame_head,
    frame_size,
    read_frame,
)
from launcher.transport.link import AgentLink, AgentMessage
from tests.agentproc import AgentProc

# Bytes a frame may hold that would break a line protocol: newlines, JSON, NUL.
TRICKY = b'\n{"ev":"agent_lost"}\n\x00\xff' + bytes(range(256)) * 3 + b"\n"


def test_a_frames_size_is_read_from_its_fixed_start_alone():
    assert frame_head(3, {"ev": "peer_chunk", "raw": "ignored", "n": 1}) == \
        b'{"raw":3,"ev":"peer_chunk","n":1}\n'
    assert frame_size(b'{"raw":3,"ev":"peer_chunk","n":1}\n') == 3
    assert frame_size(b'{"raw":0}\n') == 0
    assert frame_size(b'{"raw":12,not json at all\n') == 12  # the rest is parsed later
    for plain in (b'{"ev":"log","raw":3}\n', b'{"raw":-1}\n', b'{"raw":"3"}\n',
                  b'{"raw":1e3}\n', b'{"raw": 3}\n', b'{"raw":3', b"raw\n", b"",
                  b'{"raw":' + b"9" * 30 + b"}\n"):
        assert frame_size(plain) is None, plain


def test_a_frames_bytes_are_read_exactly_bounded_and_in_step():
    stream = io.BufferedReader(io.BytesIO(TRICKY + b"x" * 200 + b"next\n"), 7)
    assert read_frame(stream, len(TRICKY), 1000) == TRICKY
    pieces: list[int] = []
    said = read_frame(stream, 200, 100, on_piece=lambda: pieces.append(1))
    assert said == "dropped a frame of 200 bytes (more than 100)" and pieces
    assert stream.readline() == b"next\n"  # in step after both
    assert read_frame(stream, 0, 100) == b""
    with pytest.raises(EOFError):
        read_frame(io.BytesIO(b"short"), 10, 100)


def read_all(data: bytes, max_frame: int = MAX_FRAME_BYTES) -> list[dict]:
    """What the launcher's reader makes of `data` from an agent, to its end."""
    read_fd, write_fd = os.pipe()
    events: queue.Queue[AgentMessage] = queue.Queue()
    with open(os.devnull, "wb") as sink, os.fdopen(read_fd, "rb") as source:
        link = AgentLink("h", sink, source, events, ping_every_s=None, max_frame_bytes=max_frame)
        link.start_reading()

        def feed() -> None:
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(data)

        threading.Thread(target=feed, daemon=True).start()
        got: list[dict] = []
        while not got or got[-1]["ev"] != "agent_lost":
            got.append(events.get(timeout=30).message)
        link.close()
    return got


def test_the_launchers_reader_takes_chunks_and_refuses_any_other_frame():
    chunk = frame_head(len(TRICKY), {"ev": "peer_chunk", "xfer": "a-1", "n": 0}) + TRICKY
    data = b"".join([
        chunk,
        frame_head(5, {"ev": "log", "text": "bytes on a log"}) + b"\n\n\n\n\n",
        frame_head(5, {"ev": "agent_lost"}) + b"12345",  # a forged loss, with bytes
        b'{"raw":4,broken header\n' + b"\n{}\n",
        frame_head(1300, {"ev": "peer_chunk"}) + b"\n" * 1300,  # more than the bound
        b'{"raw":"4","ev":"peer_chunk"}\n',  # no size: a plain line
        b'{"ev":"peer_chunk","raw":"AAAA"}\n',  # a line that says raw: not bytes
        chunk,
        frame_head(100, {"ev": "peer_chunk"}) + b"cut short",  # the pipe ends in a frame
    ])
    got = read_all(data, max_frame=1000)
    assert [m["ev"] for m in got] == ["peer_chunk", "log", "log", "log", "log", "peer_chunk",
                                      "peer_chunk", "peer_chunk", "agent_lost"], got
    first, *_, last, lost = got
    assert first == {"raw": TRICKY, "ev": "peer_chunk", "xfer": "a-1", "n": 0} == last
    assert "only peer_chunk carry bytes" in got[1]["text"] and '"ev":"log"' in got[1]["text"]
    assert "only peer_chunk carry bytes" in got[2]["text"]
    assert "only peer_chunk carry bytes" in got[3]["text"]
    assert got[4]["text"] == "dropped a frame of 1300 bytes (more than 1000) from the agent"
    assert got[5]["raw"] == "4" and got[6]["raw"] == "AAAA"  # strings: the relay drops them
    assert lost["ev"] == "agent_lost"


def test_what_the_launcher_sends_the_agents_reader_reads_back():
    read_fd, write_fd = os.pipe()
    lines = Lines()
    with os.fdopen(read_fd, "rb") as agent_stdin, open(os.devnull, "rb") as nothing:
        reader = threading.Thread(target=_read_stdin, args=(agent_stdin, lines, lambda: None),
                                  daemon=True)
        reader.start()
        link = AgentLink("h", os.fdopen(write_fd, "wb"), nothing, queue.Queue(),
                         ping_every_s=None)
        big = os.urandom(512 * 1024)  # more than a pipe holds: written while read
        assert link.send_frame({"op": "peer_chunk", "xfer": "a-1", "n": 0}, big)
        assert link.send({"op": "ping"})
        assert link.send_frame({"op": "peer_chunk", "n": 1}, TRICKY)
        link.close()
        got = [lines.get() for _ in range(4)]
        reader.join(timeout=10)
    assert got[0] == (b'{"raw":524288,"op":"peer_chunk","xfer":"a-1","n":0}\n', big)
    assert got[1] == b'{"op":"ping"}\n'
    assert got[2] == (frame_head(len(TRICKY), {"op": "peer_chunk", "n": 1}), TRICKY)
    assert got[3] is None


def test_what_the_agent_emits_is_a_frame_the_launcher_reads():
    out = io.BytesIO()
    emit = Emitter(out)
    emit.frame("peer_chunk", TRICKY, xfer="a-1", n=0, t=1.0)
    emit("log", text="after", t=2.0)
    got = read_all(out.getvalue())
    assert got[:2] == [{"raw": TRICKY, "ev": "peer_chunk", "xfer": "a-1", "n": 0, "t": 1.0},
                       {"ev": "log", "text": "after", "t": 2.0}]


def test_the_agent_refuses_bad_frames_and_stays_in_step(tmp_path):
    agent = AgentProc(tmp_path / "run")
    try:
        agent.hello()
        too_big = MAX_FRAME_BYTES + 1
        for data in (
            frame_head(len(TRICKY), {"op": "start", "task": "w", "argv": ["true"],
                                     "tf_config": "{}"}) + TRICKY,
            frame_head(too_big, {"op": "peer_chunk"}) + b"\n" * too_big,
            b'{"raw":4,broken\n' + b"\n\n\n\n",
            frame_head(len(TRICKY), {"op": "peer_chunk", "xfer": "nosuch", "n": 0,
                                     "file": "f"}) + TRICKY,
        ):
            agent.send(data)
        agent.send({"op": "start", "task": "fine", "generation": 0, "env": {},
                    "argv": [sys.executable, "-c", "print('still here')"], "tf_config": "{}"})
        agent.wait_event("exited", task="fine")
        assert agent.output("fine") == ["still here"] and agent.proc.poll() is None
        logs = [m["text"] for m in agent.events("log")]
        assert len(logs) == 3, logs  # one each; nothing of the frames' bytes read as a line
        assert "refused 'start': only peer_chunk carries bytes" in logs[0]
        assert logs[1] == (f"dropped a frame of {too_big} bytes (more than {MAX_FRAME_BYTES}) "
                           "from the launcher")
        assert "not JSON" in logs[2]
        # A chunk of a copy that never began: refused by the receiver, said.
        stored = agent.wait_event("peer_stored", xfer="nosuch")
        assert not stored["ok"] and "KeyError" in stored["error"], stored
        assert not agent.events("started", task="w")
    finally:
        agent.close()
