"""A resumed epoch's input continues where its save left it (tf_keras `fit`;
Keras 3 `fit`: runtime/epochinput3.py, with the helpers shared from here).

tf_keras' `BackupAndRestore(save_freq=N)` (and the launcher's own
`memory_interval` saves, runtime/memcadence.py) resume `fit` at the saved
(epoch e, step k): the step counter is right, but the input restarts in the
new process, so without help the epoch trains its first batches again and
never its last ones, and a reshuffled dataset trains them in another order.
Zero code, nothing inside a training step:

- at a resume (`Model._maybe_load_initial_counters_from_ckpt` returned
  (e, k)), the first epoch's iterator reads its first k batches and drops
  them (not trained);
- a dataset iterated anew each epoch (a finite `tf.data.Dataset`) draws its
  shuffle order from a seed generator that advances once per iterator made in
  the process: epoch e's order is the one of the (e - initial_epoch)-th
  iterator after `fit`'s own first one. The resumed process makes (and drops)
  that many iterators of the script's dataset first (lazy: no element is
  read), so a seeded shuffle gives epoch e the very order it had
  uninterrupted, and the k batches dropped are the ones trained before the
  save. Correct for any seeded pipeline; cheap (e iterators made, k batches
  read once per restart); nothing to save with the backup (an iterator's own
  checkpoint would hold its shuffle buffer at every save);
- one stream over the epochs (a repeated dataset with `steps_per_epoch`): the
  epochs before the resumed one are read and dropped too (said: the price of
  a resume there is reading the stream up to it);
- an input whose position cannot be carried (a Python generator, a shuffle or
  random op without a seed, a non-deterministic parallel map, a cache after a
  reshuffling shuffle, arrays shuffled by `fit`, a dataset function): its
  mid-epoch saves
  are not taken, said once at the first one, and the epoch's end is saved
  instead, so a restart trains the epoch again from its start and nothing
  twice (the launcher's extra saves go the same way: `memory_interval` never
  makes a script less exact than it was).

Where the position is carried (here, or by runtime/epochinput3.py for Keras 3
on TensorFlow over a tf.data input) and each step trains one batch, a batch can be
skipped by its position: the launcher names the batches whose loss went bad
at the same step after the restart before it (MGPU_SKIP_BATCHES="2:19:100,...",
epoch:batch from 0, as the sentinel's `nonfinite` report numbers them, and
the step: job/detect/sentinel.py), and in `fit`'s epoch e the step at
position b, when it is the step that went bad (another `fit` of the script
numbers its epochs from 0 too), reads its batch from the epoch's iterator and
drops it (not trained). The step counters move past it (the epoch's and the
optimizer's), so the epoch keeps its length and every later step its number;
a resume past it drops its position with the others, a resume before it
skips it again, a resume with nothing left of its epoch but batches to skip
goes on at the next epoch. Said once per batch, by the chief.

Standard library only at import time; must not import the launcher side.
"""

from __future__ import annotations

import functools
import os
import sys
from types import ModuleType

_MARK = "_mgpu_epoch_input"
SKIP_ENV = "MGPU_SKIP_BATCHES"  # the batches the launcher skips (job/policy/batchskips.py)
_resume: dict = {}  # the next `fit` epoch loop's: {"first": epoch, "epoch": e, "step": k}
_said: set[str] = set()
# Stateful random ops, whose draws restart with the process: not reproducible.
_RANDOM = ("Random", "Stateful", "TruncatedNormal", "Multinomial", "NonDeterministicInts",
           "RngSkip", "RngReadAndSkip")
_FOREIGN = {"GeneratorDataset": "reads a Python generator",
            "PyFunc": "calls Python (tf.numpy_function)",
            "EagerPyFunc": "calls Python (tf.py_function)",
            "PyFuncStateless": "calls Python (tf.numpy_function)"}


def why_not(dataset) -> str:
    """Why `dataset`'s position in an epoch cannot be carried to a new
    process ("" when it can): walks the datasets and their functions."""
    if not hasattr(dataset, "_inputs"):
        return "it is not a tf.data dataset the launcher can follow"
    options = dataset.options()
    if options.deterministic is False:
        return "its options allow a non-deterministic order (deterministic=False)"
    seen: set[int] = set()
    stack = [dataset]
    while stack:
        found = stack.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        reason = _why_not_one(found)
        if reason:
            return reason
        stack.extend(found._inputs())
    return ""


def _why_not_one(dataset) -> str:
    if hasattr(dataset, "_reshuffle_each_iteration") and _unseeded(dataset):
        return "its shuffle has no seed"
    if type(dataset).__name__ == "CacheDataset" and _reshuffles_below(dataset):
        # The cache keeps the order of the first epoch read from it; the
        # iterators the replay makes read nothing, so it would fill in another.
        return "it caches after a shuffle that reshuffles each epoch"
    if getattr(dataset, "_deterministic", None) == "false":
        return "a parallel map or interleave is non-deterministic (deterministic=False)"
    for value in vars(dataset).values():
        graph = getattr(getattr(value, "function", None), "graph", None)
        for op in graph.get_operations() if graph is not None else ():
            if op.type in _FOREIGN:
                return _FOREIGN[op.type]
            if op.type.startswith(("Shuffle", "RandomDataset")):
                return "it shuffles inside a function (interleave, flat_map)"
            if not op.type.startswith("Stateless") and any(r in op.type for r in _RANDOM):
                return f"a random op without a stateless seed ({op.type}) reads its data"
    return ""


def _reshuffles_below(dataset) -> bool:
    stack, seen = list(dataset._inputs()), set()
    while stack:
        found = stack.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        if getattr(found, "_reshuffle_each_iteration", False):
            return True
        stack.extend(found._inputs())
    return False


def _unseeded(dataset) -> bool:
    try:
        return int(dataset._seed) == 0 and int(dataset._seed2) == 0
    except (TypeError, ValueError):  # symbolic seeds: cannot be read here
        return True


def say_once(message: str) -> None:
    """Once per process, by the chief only (every worker would say the same)."""
    from launcher import runtime

    if message not in _said:
        _said.add(message)
        if runtime.is_chief():
            print(message, file=sys.stderr, flush=True)


def _tell(key: str, epoch: int, position: int, step: int | None) -> None:
    """A skip done (`skip_done`) or a batch trained in place of one
    (`skip_not`), to the launcher: [step, epoch, batch], as `nonfinite` is."""
    if os.environ.get("MGPU_PROGRESS_FD"):
        import time

        from launcher import runtime

        # int(): a position read from the input may be numpy's int64, which JSON refuses.
        runtime.write_progress({key: [-1 if step is None else int(step), int(epoch),
                                      int(position)], "time": time.time()})


def wrap(cls: type, name: str, make) -> None:
    original = getattr(cls, name, None)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


# --- the resume: where `fit` continues --------------------------------------

def _counters(original):
    """`fit` asks where to start (after BackupAndRestore restored): kept for
    its epoch loop, which comes next. An input of unknown length (no
    steps_per_epoch) is backed up at epoch ends only (`_backup`), which
    tf_keras cannot tell from a save in the middle (`batch == None - 1`:
    a TypeError on every restore): the next epoch."""
    def load(self, steps_per_epoch, initial_epoch, *args, **kwargs):
        try:
            epoch, step = original(self, steps_per_epoch, initial_epoch, *args, **kwargs)
        except TypeError:
            state = getattr(self, "_training_state", None)
            if steps_per_epoch is not None or state is None \
                    or int(state._ckpt_saved_batch.numpy()) < 0:
                raise
            epoch, step = int(state._ckpt_saved_epoch.numpy()) + 1, 0
        _resume.clear()
        _resume.update(first=int(initial_epoch), epoch=int(epoch), step=int(step), model=self)
        return epoch, step
    return load


def _verdict(handler) -> str:
    """Why this `fit`'s input cannot be carried ("" when it can)."""
    try:
        return why_not(handler._adapter.get_dataset())
    except Exception as exc:  # noqa: BLE001 - an input of a shape not known here
        return f"the launcher cannot follow it ({type(exc).__name__})"


def _skip(handler, plan: dict, carried: bool) -> int:
    """The batches of the resumed epoch's iterator trained before the save;
    a dataset iterated anew each epoch first replays the iterators made
    before that epoch's (its seed generator's draws)."""
    step, epochs = plan.get("step", 0), max(0, plan.get("epoch", 0) - plan.get("first", 0))
    adapter = handler._adapter
    if not carried or type(adapter).__name__ == "TensorLikeDataAdapter":
        return step  # arrays: every epoch one pass, alike unless fit shuffles them
    if adapter.should_recreate_iterator():
        dataset = adapter.get_dataset()
        for _ in range(epochs):
            iter(dataset)  # made and dropped: the seed generator advances (no read)
        return step
    # One stream over the epochs (a repeated dataset, steps_per_epoch): the
    # epochs before the resumed one were read from it too.
    steps = handler._inferred_steps
    if not isinstance(steps, int) or not epochs:
        return step
    say_once(f"mgpu-launch: this fit's input is one stream over its epochs (a repeated "
              f"dataset): {epochs * steps + step} batches of it are read and dropped to "
              f"continue where the save left it")
    return epochs * steps + step


def _epochs(original):
    """DataHandler's epochs: the resumed first epoch's input continues where
    the save left it (its batches trained before the save read and dropped)."""
    def enumerate_epochs(self, *args, **kwargs):
        plan = dict(_resume)
        _resume.clear()  # only `fit`'s loop (evaluate's handlers come later)
        model = plan.pop("model", None)
        skip = 0
        if model is not None:
            model._mgpu_input = _verdict(self)
            plan = _past_a_skipped_tail(self, model, plan)
            skip = _skip(self, plan, not model._mgpu_input)
            self._mgpu_fit = model  # fit's own handler: the skips are its (`_steps`)
        for epoch, iterator in original(self, *args, **kwargs):
            _drop(iterator, skip)
            skip = 0
            if model is not None:
                self._mgpu_epoch = (epoch, iterator)
            try:
                yield epoch, iterator
            finally:
                self._mgpu_epoch = (None, None)
    return enumerate_epochs


def _drop(iterator, batches: int) -> None:
    """Read `batches` batches and drop them (trained before the save)."""
    try:
        for _ in range(batches):
            next(iterator)
    except StopIteration:
        pass  # the data ran out: tf_keras' own check ends the epoch
    except Exception as exc:
        if type(exc).__name__ != "OutOfRangeError":
            raise


# --- a bad batch skipped: read and dropped at its position -------------------

def skip_list(text: str) -> dict[tuple[int, int], int | None]:
    """What MGPU_SKIP_BATCHES names ("2:19:100,3:5:126"): each (epoch, batch)
    position, from 0, and the step it went bad at (None where not given); a
    malformed entry is left out."""
    found: dict[tuple[int, int], int | None] = {}
    for part in text.split(","):
        fields = part.strip().split(":")
        if len(fields) in (2, 3) and all(f.isdigit() for f in fields):
            found[int(fields[0]), int(fields[1])] = int(fields[2]) if len(fields) == 3 else None
    return found


def skips_of(text: str) -> frozenset[tuple[int, int]]:
    """The (epoch, batch) positions MGPU_SKIP_BATCHES names."""
    return frozenset(skip_list(text))


def skip_blocker(model) -> str:
    """Why one batch of this `fit` cannot be skipped alone ("" when it can):
    its input's position must be carried (tf_keras, or Keras 3 on TensorFlow
    (runtime/epochinput3.py), an input the launcher follows) and each step
    must train one batch."""
    reason = getattr(model, "_mgpu_input", None)
    if reason is None:
        backend = _keras3_backend(model)
        return (f"the input's position is not carried on Keras 3's {backend} backend"
                if backend not in ("", "tensorflow")
                else "the input's position is not carried here (Keras 3)")
    if reason:
        return f"the input's position cannot be carried ({reason})"
    if getattr(model, "_autotune_steps_per_execution", False):
        return "steps_per_execution is tuned: a step may train several batches"
    per = getattr(model, "_steps_per_execution", None)  # tf_keras: a variable
    per = getattr(model, "steps_per_execution", 1) if per is None else per  # Keras 3: an int
    per = int(per.numpy()) if hasattr(per, "numpy") else int(per or 1)
    return f"steps_per_execution is {per}: a step trains {per} batches" if per != 1 else ""


def _keras3_backend(model) -> str:
    """The Keras 3 backend whose trainer `model` is ("" where none)."""
    for cls in type(model).__mro__:
        parts = cls.__module__.split(".")
        if parts[:3] == ["keras", "src", "backend"] and parts[-1] == "trainer" and len(parts) > 4:
            return parts[3]
    return ""


def skipped_in(model, epoch: int, first: int, last: int) -> int:
    """The batches of `epoch` skipped at positions first..last (Keras' running
    mean of the loss counts only those trained: runtime/sentinel.py)."""
    return sum(1 for e, b in getattr(model, "_mgpu_skipped", ()) if e == epoch
               and first <= b <= last)


def _steps(original):
    """DataHandler's steps: in `fit`, a position the launcher skips is not
    yielded; its batch is read and dropped, and the original generator counts
    past it, so the epoch still ends at its full length."""
    def steps(self, *args, **kwargs):
        model = getattr(self, "_mgpu_fit", None)
        epoch, iterator = getattr(self, "_mgpu_epoch", (None, None))
        wanted = skips_in(model, epoch)
        for step in original(self, *args, **kwargs):
            if step in wanted and is_the_one(model, epoch, step, wanted[step]):
                _drop(iterator, 1)
                count_skip(model, epoch, step)
                continue
            yield step
    return steps


def skips_in(model, epoch: int | None) -> dict[int, int | None]:
    """The positions of `fit`'s epoch to skip, and the step each went bad at
    (none, said once, where a skip could drop another batch than the one named)."""
    if model is None or epoch is None:
        return {}
    wanted = {b: s for (e, b), s in skip_list(os.environ.get(SKIP_ENV, "")).items() if e == epoch}
    why = skip_blocker(model) if wanted else ""
    if why:
        say_once(f"mgpu-launch: the batches the launcher skips ({SKIP_ENV}) are trained "
                  f"instead: {why}")
        return {}
    return wanted


def _iterations(model):
    return getattr(getattr(model, "optimizer", None), "iterations", None)


def is_the_one(model, epoch: int, position: int, bad_step: int | None) -> bool:
    """The batch named is this `fit`'s: the step about to train it is the one
    that went bad (another `fit` of the script, a fine-tuning phase, numbers
    its epochs from 0 too: its batch at that position is trained, said once)."""
    iterations = _iterations(model)
    if bad_step is None or iterations is None:
        return True
    at = int(iterations.numpy()) + 1
    if at != bad_step:
        _tell("skip_not", epoch, position, at)
        say_once(f"mgpu-launch: batch {position + 1} of epoch {epoch + 1} is trained, not "
                  f"skipped: the launcher skips the one that went bad at step {bad_step}, "
                  f"this fit is at step {at} there")
    return at == bad_step


def count_skip(model, epoch: int, position: int) -> None:
    """A batch dropped at `position`: the optimizer's step counter moves past
    it too, so every later step keeps the number it had (the sentinel's, the
    saves', memory_interval's, a learning-rate schedule's)."""
    iterations = _iterations(model)
    step = None
    if iterations is not None:
        iterations.assign_add(1)
        step = int(iterations.numpy())
    model._mgpu_skipped = frozenset({*getattr(model, "_mgpu_skipped", ()), (epoch, position)})
    _tell("skip_done", epoch, position, step)
    at = f" at step {step}" if step is not None else ""
    say_once(f"mgpu-launch: skipped batch {position + 1} of epoch {epoch + 1} (its loss went "
              f"bad{at} twice): not trained")


def _past_a_skipped_tail(handler, model, plan: dict) -> dict:
    """A resume whose epoch has nothing left but batches to skip (the bad one
    was its last, the save just before it) goes on at the next epoch: tf_keras
    would end an epoch that trained no step with "Empty logs", on every restart."""
    steps, epoch, step = handler._inferred_steps, plan.get("epoch"), plan.get("step", 0)
    if not isinstance(steps, int) or epoch is None or not 0 < step < steps:
        return plan
    wanted = skips_in(model, epoch)
    iterations = _iterations(model)
    done = int(iterations.numpy()) if iterations is not None else None  # steps before `step`

    def named(position: int) -> bool:  # to skip, and (where known) at the step that went bad
        if position not in wanted:
            return False
        bad = wanted[position]
        return bad is None or done is None or bad == done + position - step + 1

    if not all(named(position) for position in range(step, steps)):
        return plan
    for position in range(step, steps):
        count_skip(model, epoch, position)
    handler._initial_epoch, handler._initial_step = epoch + 1, 0
    return {**plan, "epoch": epoch + 1, "step": 0}


# --- the saves: mid-epoch only where the position can be carried ------------

def _backup(original):
    """tf_keras' `BackupAndRestore._backup`: a mid-epoch save of an input
    that cannot be carried is not taken (said once); its epoch's end is."""
    def backup(self, epoch, batch=None, *args, **kwargs):
        if batch is None:  # an epoch's end (save_freq="epoch"): nothing owed
            self._mgpu_owed = None
            return original(self, epoch, *args, **kwargs)
        steps = (getattr(self, "params", None) or {}).get("steps")
        reason = getattr(getattr(self, "model", None), "_mgpu_input", "")
        if not isinstance(steps, int):  # tf_keras cannot resume it in the middle (`_counters`)
            reason = "its length is unknown and fit was given no steps_per_epoch"
        if reason and (not isinstance(steps, int) or batch < steps - 1):
            say_once(f"mgpu-launch: a save in the middle of an epoch (BackupAndRestore's "
                      f"save_freq, the launcher's memory_interval) is not taken: this fit's "
                      f"input cannot continue there after a restart ({reason}); saves are "
                      f"taken at epoch ends instead, and a restart trains its epoch again "
                      f"from the start (nothing twice)")
            self._mgpu_owed = epoch
            return None
        self._mgpu_owed = None
        return original(self, epoch, batch, *args, **kwargs)
    return backup


def _epoch_end(original):
    def end(self, epoch, *args, **kwargs):
        result = original(self, epoch, *args, **kwargs)
        steps = (getattr(self, "params", None) or {}).get("steps")
        if getattr(self, "_mgpu_owed", None) == epoch and isinstance(steps, int):
            # tf_keras saves the batch its last batch-end told (with
            # steps_per_execution, a chunk's start): the whole epoch, so the
            # restart resumes at the next one.
            state = getattr(self, "_training_state", None)
            if state is not None:
                state._ckpt_saved_batch.assign(steps - 1)
            self._backup(epoch=epoch, batch=steps - 1)
        elif getattr(self, "_mgpu_owed", None) == epoch:  # unknown length: `_counters` reads
            self._backup(epoch=epoch)  # its last batch as the epoch's end
        return result
    return end


def on_tf_keras(module: ModuleType) -> None:
    engine = module.src.engine
    wrap(engine.training.Model, "_maybe_load_initial_counters_from_ckpt", _counters)
    wrap(engine.data_adapter.DataHandler, "enumerate_epochs", _epochs)
    wrap(engine.data_adapter.DataHandler, "steps", _steps)
    backup = getattr(module.callbacks, "BackupAndRestore", None)
    if backup is not None and "_backup" in backup.__dict__:
        wrap(backup, "_backup", _backup)
        wrap(backup, "on_epoch_end", _epoch_end)


HOOKS = {"tf_keras": on_tf_keras}
