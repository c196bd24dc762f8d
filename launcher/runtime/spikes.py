"""Loss spikes: a step's own loss far above its recent window (issue 52 item 3).

The NaN sentinel (runtime/sentinel.py) recovers each step's own loss from the
running mean Keras logs; this judges it against the last `window` steps' losses
with a robust z-score: (loss − median) / (1.4826 · MAD), the median absolute
deviation scaled to a normal's σ (a few bad steps in the window move neither).
A spike is a loss with a z-score of at least `z` **and** at least `ratio` times
the window's median: a loss near zero, where one harder batch is many MADs
away but changes nothing, is no spike. Only upward: a loss that falls is what
training is for. Nothing is judged before `min_steps` steps are in the window
(a restart starts an empty one), and after a spike the next `window` steps are
not reported again (a loss that stays high is one spike, not hundreds; it joins
the window, whose median follows it).

Defaults, measured on healthy runs (docs/fault-tolerance.md, "Loss spikes"):
z 12 and 3x the median over 64 steps gave no spike on the bundled example, the
tutorial-shaped `fit` scripts of the tests and a learning-rate warmup, and saw
a batch of 1e3 in a regression whose loss was near 1.

Pure, standard library only; a few microseconds a step (a sort of `window`
floats, two when the loss is above the window's median).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW, MIN_STEPS, Z, RATIO = 64, 32, 12.0, 3.0
MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution is 0.6745 σ


@dataclass(frozen=True)
class Spike:
    loss: float
    median: float
    z: float  # inf when the window's losses were all equal


class SpikeWatch:
    """The last `window` step losses; `add` says whether the newest is a spike."""

    def __init__(self, window: int = WINDOW, z: float = Z, ratio: float = RATIO,
                 min_steps: int = MIN_STEPS) -> None:
        self.z, self.ratio = z, ratio
        self.min_steps = min(min_steps, window)
        self._losses: deque[float] = deque(maxlen=window)
        self._quiet = 0  # steps left without a report after a spike

    def add(self, loss: float) -> Spike | None:
        """The step's own loss (finite); the spike it is, if one."""
        found = None
        if self._quiet > 0:
            self._quiet -= 1
        elif len(self._losses) >= self.min_steps:
            found = self._judge(loss)
        self._losses.append(loss)
        if found is not None:
            self._quiet = self._losses.maxlen or 0
        return found

    def _judge(self, loss: float) -> Spike | None:
        ordered = sorted(self._losses)
        median = _median(ordered)
        if loss <= median or loss < self.ratio * median:
            return None
        mad = _median(sorted(abs(v - median) for v in ordered)) * MAD_TO_SIGMA
        z = (loss - median) / mad if mad > 0 else math.inf
        return Spike(loss, median, z) if z >= self.z else None


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2
