"""A trace's xplane.pb in figures: time in collectives, waiting for input, computing.

`summarise(bytes, steps)` reads one task's trace, as TensorFlow's profiler
writes it (`<host>.xplane.pb`, the XSpace proto TF ships in
`tensorflow.tsl.profiler.protobuf.xplane_pb2`), and returns a `TraceSummary`:
over the traced window, the wall time during which a collective op ran
(CollectiveReduceV2 and kin, NCCL and XLA collectives: on a synchronous job,
mostly waiting for the slowest peer), during which the input pipeline's
`get_next` ran (waiting for input), and the rest (computing). Overlapping
events count once. Used in the task (launcher/runtime/trace.py) and on
recorded traces (tests, the straggler radar).

Standard library only at import time; the protos are imported on first use.
Must not import the launcher side.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass

_STANDALONE = "_mgpu_xplane_pb2"  # the protos loaded without importing TensorFlow

# Op types of collective communication (CPU and GPU collectives, NCCL, XLA's
# collective HLOs); an event name is `<tf op name>:<op type>` on the host.
_COLLECTIVE = re.compile(r"^(Collective\w*|Nccl\w*)$")
_COLLECTIVE_WORDS = ("all-reduce", "allreduce", "all-gather", "allgather", "reduce-scatter",
                     "all-to-all", "collective-permute", "nccl")
# Where a step waits for its input: the iterator's get_next, as an op and as
# the kernel's own trace event (its duration covers the wait for the element).
_INPUT_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
                        "MultiDeviceIteratorGetNextFromShard", "OptionalGetValue"})
_INPUT_EVENTS = frozenset({"IteratorGetNextOp::DoCompute"})
_STEP_FUNCTION = re.compile(r"^EagerLocalExecute: (__inference_\w+?)_\d+$")


@dataclass(frozen=True)
class TraceSummary:
    """One task's trace in figures: totals over the traced window, in seconds.

    `steps` trained during the window (the optimizer's counter when known,
    else the step function's calls in the trace); `step_s` is window / steps
    (None: no step seen). `collective_s`, `input_s` are the wall time during
    which any collective op, any input wait ran (overlaps counted once);
    `compute_s` is the rest of the window."""

    window_s: float
    steps: int
    step_s: float | None
    collective_s: float
    input_s: float
    compute_s: float

    def to_json(self) -> dict:
        return {key: (round(value, 6) if isinstance(value, float) else value)
                for key, value in asdict(self).items()}


def _xplane_pb2():
    """TensorFlow's XSpace protos (TF 2.13 and later ship them in `tensorflow.tsl`).

    Where TensorFlow is not imported (the launcher, a test), the generated module
    is loaded by itself from TensorFlow's folder: it needs only protobuf, and
    `import tensorflow` would cost seconds. The descriptor registered is the
    same one TensorFlow registers if it is imported later."""
    if "tensorflow" in sys.modules:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
        return xplane_pb2
    loaded = sys.modules.get(_STANDALONE)
    if loaded is not None:
        return loaded
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        raise ImportError("reading a trace needs TensorFlow's xplane protos: "
                          "TensorFlow is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "tsl", "profiler", "protobuf",
                        "xplane_pb2.py")
    module_spec = importlib.util.spec_from_file_location(_STANDALONE, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"TensorFlow's xplane protos are not at {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    sys.modules[_STANDALONE] = module
    return module


def summarise(xspace: bytes, steps: int | None = None) -> TraceSummary:
    """Summarise one xplane.pb's bytes; `steps`: steps trained while it ran, if known."""
    space = _xplane_pb2().XSpace()
    space.ParseFromString(xspace)
    start_ps, stop_ps = _window(space)
    collective: list[tuple[int, int]] = []
    waiting: list[tuple[int, int]] = []
    calls: dict[str, int] = {}
    first, last = None, None
    for plane in space.planes:
        if not (plane.name.startswith("/host:") or plane.name.startswith("/device:")):
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for event in line.events:
                name = names.get(event.metadata_id, "")
                begin = base + event.offset_ps
                end = begin + event.duration_ps
                first = begin if first is None else min(first, begin)
                last = end if last is None else max(last, end)
                if _is_collective(name):
                    collective.append((begin, end))
                elif _is_input(name):
                    waiting.append((begin, end))
                elif line.name == "python":
                    match = _STEP_FUNCTION.match(name)
                    if match:
                        calls[match.group(1)] = calls.get(match.group(1), 0) + 1
    if start_ps is None or stop_ps is None:
        start_ps, stop_ps = first or 0, last or 0
    elif last is not None and last < start_ps // 2:
        # The saved trace counts its events from the session's start (TF
        # normalises host times when it writes the file).
        start_ps, stop_ps = 0, stop_ps - start_ps
    window = max(stop_ps - start_ps, 0)
    if steps is None:
        steps = max(calls.values()) if calls else 0
    coll = _covered(collective, start_ps, stop_ps)
    inp = _covered(waiting, start_ps, stop_ps)
    both = _covered(collective + waiting, start_ps, stop_ps)
    window_s = window / 1e12
    return TraceSummary(window_s=window_s, steps=steps,
                        step_s=window_s / steps if steps > 0 else None,
                        collective_s=coll / 1e12, input_s=inp / 1e12,
                        compute_s=max(window - both, 0) / 1e12)


def _window(space) -> tuple[int | None, int | None]:
    """The profiling session's start and stop (ps), from its `Task Environment` plane."""
    for plane in space.planes:
        stats = {plane.stat_metadata[s.metadata_id].name: s for s in plane.stats}
        start, stop = stats.get("profile_start_time"), stats.get("profile_stop_time")
        if start is not None and stop is not None:
            value = lambda s: s.uint64_value or s.int64_value  # noqa: E731
            return value(start) * 1000, value(stop) * 1000
    return None, None


def _is_collective(name: str) -> bool:
    if "::" in name:
        return False  # the executor's own trace events (CollectiveExecutor::...), not ops
    if ":" in name and _COLLECTIVE.match(name.rsplit(":", 1)[1]):
        return True
    lowered = name.lower()
    return any(word in lowered for word in _COLLECTIVE_WORDS)


def _is_input(name: str) -> bool:
    if name in _INPUT_EVENTS:
        return True
    return "::" not in name and ":" in name and name.rsplit(":", 1)[1] in _INPUT_OPS


def _covered(spans: list[tuple[int, int]], low: int, high: int) -> int:
    """Length of the union of `spans`, clipped to [low, high]."""
    total, reach = 0, low
    for begin, end in sorted(spans):
        begin, end = max(begin, reach), min(end, high)
        if end > begin:
            total += end - begin
            reach = end
    return total
