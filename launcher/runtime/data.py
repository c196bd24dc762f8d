"""Input pipelines that give each worker its own share of the data, once per epoch.

Owns: which input pipeline this process is (from a `tf.distribute.InputContext`
or `TF_CONFIG`), sharding a file list or a dataset's elements across pipelines,
the explicit `AutoShardPolicy`, global versus per-replica batch sizes, and the
one-call `distribute()` from a file pattern to a distributed dataset. Also the
sanity checks for the classic input mistakes (AUTO silently falling back to
DATA, fewer files than workers, a global batch that does not divide, a
ParameterServerStrategy input that every worker reads whole).

Shipped to hosts with the runtime: standard library only at import time,
TensorFlow imported lazily inside functions. Must not import the launcher side.
"""

from __future__ import annotations

import glob as _glob
import json
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "InputPipeline",
    "ShardingError",
    "ShardingWarning",
    "check_dataset",
    "check_ps_input",
    "dataset_fn",
    "distribute",
    "global_batch_size",
    "input_pipeline",
    "list_files",
    "make_dataset",
    "per_replica_batch_size",
    "shard",
    "shard_files",
]

SHARD_BY = ("auto", "file", "element")
# tf.data source ops that read files: AUTO can shard by file only above one of these.
_READER_OPS = frozenset({
    "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset",
    "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2",
})
_SHUFFLE_OPS = frozenset({
    "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2",
})


class ShardingError(ValueError):
    """The input cannot be split as asked; the message says what to change."""


class ShardingWarning(UserWarning):
    """The input works but wastes I/O or repeats data; the message says what to change."""


# ------------------------------------------------------------ who reads what


@dataclass(frozen=True)
class InputPipeline:
    """This process's input pipeline: `index` of `count` pipelines reading in sync."""

    count: int
    index: int
    replicas_in_sync: int | None = None  # known only from an InputContext


def input_pipeline(input_context: Any = None) -> InputPipeline:
    """Which share of the data this process reads.

    From `input_context` (a `tf.distribute.InputContext`, as passed to a
    dataset function) when given, else from `TF_CONFIG`: under
    MultiWorkerMirroredStrategy one pipeline per worker, the chief first, the
    same numbering TensorFlow uses. Without `TF_CONFIG`, one pipeline.
    """
    if input_context is not None:
        return InputPipeline(int(input_context.num_input_pipelines),
                             int(input_context.input_pipeline_id),
                             int(input_context.num_replicas_in_sync))
    raw = os.environ.get("TF_CONFIG", "")
    config = json.loads(raw) if raw.strip() else {}
    cluster = config.get("cluster", {})
    task = config.get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if cluster.get("ps"):
        raise ShardingError(
            "under ParameterServerStrategy the dataset is built once on the coordinator "
            "and copied to every worker, so TF_CONFIG cannot tell workers apart here. "
            "Pass a dataset function instead: runtime.dataset_fn(files, parse_fn, batch) "
            "to coordinator.create_per_worker_dataset(...) (see docs/input.md)")
    chiefs, workers = len(cluster.get("chief", [])), len(cluster.get("worker", []))
    if kind == "chief":
        return InputPipeline(max(1, chiefs + workers), 0)
    if kind == "worker" and chiefs + workers > 1:
        return InputPipeline(chiefs + workers, chiefs + index)
    return InputPipeline(1, 0)  # alone, or an evaluator: read everything


# ------------------------------------------------------------------- files


def list_files(pattern_or_files: str | Iterable[str]) -> list[str]:
    """Sorted, de-duplicated files matching a glob pattern or a list of patterns/paths.

    Sorted so that every worker sees the same list in the same order (a glob
    on two hosts need not agree on order), which sharding relies on.
    """
    patterns = [pattern_or_files] if isinstance(pattern_or_files, str) else list(pattern_or_files)
    if not patterns:
        raise ShardingError("no input files given")
    found: set[str] = set()
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matches = _match(pattern)
        if not matches:
            raise ShardingError(f"no input file matches {pattern!r} (cwd {os.getcwd()})")
        found.update(matches)
    return sorted(found)


def _match(pattern: str) -> list[str]:
    if "://" in pattern:  # gs://, hdfs://: only TensorFlow's filesystems know them
        import tensorflow as tf

        return [str(p) for p in tf.io.gfile.glob(pattern)]
    return _glob.glob(pattern) if _glob.has_magic(pattern) else (
        [pattern] if os.path.exists(pattern) else [])


def shard_files(files: Sequence[str], input_context: Any = None) -> list[str]:
    """This pipeline's files: every `count`-th file starting at `index`.

    Together the pipelines' lists are the whole list, with no file twice.
    Raises when there are fewer files than pipelines: some worker would read
    nothing, and a collective strategy would wait on it forever.
    """
    pipeline = input_pipeline(input_context)
    files = list(files)
    if len(files) < pipeline.count:
        raise ShardingError(
            f"{len(files)} input file(s) for {pipeline.count} workers: with file sharding "
            f"worker {len(files)} and beyond would get no data. Split the data into at least "
            f"{pipeline.count} files (best a multiple of {pipeline.count}), or shard by "
            "element (shard_by='element': every worker reads every file and keeps 1/"
            f"{pipeline.count} of the records)")
    return files[pipeline.index::pipeline.count]


# --------------------------------------------------------------- datasets


def _with_policy(dataset, policy_name: str):
    """Set the AutoShardPolicy explicitly (OFF once we sharded, so TF never shards twice)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, policy_name)
    return dataset.with_options(options)


def shard(dataset, input_context: Any = None):
    """Keep this pipeline's share of `dataset`'s elements (every `count`-th one).

    For data that cannot be split by file (in memory, one big file). The
    dataset must yield the same elements in the same order on every worker:
    shard before any unseeded shuffle or non-deterministic interleave. The
    result's AutoShardPolicy is OFF, so a strategy does not shard it again.
    """
    pipeline = input_pipeline(input_context)
    if pipeline.count > 1:
        dataset = dataset.shard(pipeline.count, pipeline.index)
    return _with_policy(dataset, "OFF")


def global_batch_size(per_replica_batch: int, strategy: Any = None) -> int:
    """The batch of one training step over all replicas: per-replica batch × replicas."""
    if per_replica_batch < 1:
        raise ShardingError(f"per-replica batch must be >= 1, got {per_replica_batch}")
    return per_replica_batch * _replicas(strategy)


def per_replica_batch_size(global_batch: int, strategy_or_replicas: Any = None) -> int:
    """What each replica gets of `global_batch`; raises when it does not divide."""
    replicas = (strategy_or_replicas if isinstance(strategy_or_replicas, int)
                else _replicas(strategy_or_replicas))
    if global_batch < replicas or global_batch % replicas:
        lower = max(replicas, global_batch // replicas * replicas)
        raise ShardingError(
            f"global batch {global_batch} does not divide among {replicas} replicas in sync "
            f"(each step splits it evenly). Use a multiple of {replicas}, e.g. {lower} or "
            f"{lower + replicas}, or give the per-replica batch instead "
            "(per_replica_batch=..., global = per-replica × replicas)")
    return global_batch // replicas


def _replicas(strategy: Any) -> int:
    if strategy is None:
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
    return int(strategy.num_replicas_in_sync)


def _tfrecord_reader(filename):
    import tensorflow as tf

    return tf.data.TFRecordDataset(filename)


def _resolve_shard_by(shard_by: str, files: int, pipelines: int) -> str:
    if shard_by not in SHARD_BY:
        raise ShardingError(f"shard_by must be one of {SHARD_BY}, got {shard_by!r}")
    if shard_by != "auto":
        return shard_by
    if files >= pipelines:
        return "file"
    warnings.warn(
        f"shard_by='auto' falls back to element sharding: {files} file(s) for {pipelines} "
        f"workers, so every worker reads every file and keeps 1/{pipelines} of the records "
        f"({pipelines}× the I/O of file sharding). Split the data into at least {pipelines} "
        "files, or pass shard_by='element' to say this is intended",
        ShardingWarning, stacklevel=3)
    return "element"


def make_dataset(
    files: str | Iterable[str],
    parse_fn: Callable | None = None,
    per_replica_batch: int | None = None,
    input_context: Any = None,
    *,
    shard_by: str = "auto",
    shuffle_buffer: int = 0,
    seed: int | None = None,
    repeat: bool = False,
    cache: bool | str = False,
    reader_fn: Callable | None = None,
    cycle_length: int = 4,
    drop_remainder: bool = False,
):
    """This worker's pipeline: its share of `files`, parsed, batched per replica, prefetched.

    Order: list and shard the files (or the records, with element sharding)
    → read (`reader_fn(filename) -> Dataset`, TFRecord by default) → parse →
    cache (parsed records of this share, reused every epoch) → shuffle →
    repeat → batch → prefetch. The AutoShardPolicy is OFF: the sharding is
    done. `per_replica_batch=None` leaves the dataset unbatched.
    """
    import tensorflow as tf

    autotune = tf.data.AUTOTUNE
    pipeline = input_pipeline(input_context)
    names = list_files(files)
    mode = _resolve_shard_by(shard_by, len(names), pipeline.count)
    reader = reader_fn or _tfrecord_reader
    if mode == "file":
        mine = shard_files(names, input_context)
        dataset = tf.data.Dataset.from_tensor_slices(mine)
        if shuffle_buffer:  # a new file order each epoch; harmless, this worker owns them
            dataset = dataset.shuffle(len(mine), seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.interleave(reader, cycle_length=min(cycle_length, len(mine)),
                                     num_parallel_calls=autotune,
                                     deterministic=not shuffle_buffer)
    else:
        # Every worker must see the records in the same order for shard() to split
        # them: a deterministic interleave, and the shard before any shuffle.
        dataset = tf.data.Dataset.from_tensor_slices(names).interleave(
            reader, cycle_length=min(cycle_length, len(names)), num_parallel_calls=autotune,
            deterministic=True)
        if pipeline.count > 1:
            dataset = dataset.shard(pipeline.count, pipeline.index)  # before parsing
    if parse_fn is not None:
        dataset = dataset.map(parse_fn, num_parallel_calls=autotune)
    if cache:
        dataset = dataset.cache(cache if isinstance(cache, str) else "")
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    if per_replica_batch is not None:
        if per_replica_batch < 1:
            raise ShardingError(f"per-replica batch must be >= 1, got {per_replica_batch}")
        dataset = dataset.batch(per_replica_batch, drop_remainder=drop_remainder)
    return _with_policy(dataset.prefetch(autotune), "OFF")


def dataset_fn(
    files: str | Iterable[str],
    parse_fn: Callable | None = None,
    per_replica_batch: int | None = None,
    *,
    global_batch: int | None = None,
    **options: Any,
) -> Callable:
    """A `dataset_fn(input_context)` for `strategy.distribute_datasets_from_function`,
    tf_keras' `DatasetCreator`, or a ParameterServerStrategy coordinator.

    Give `per_replica_batch`, or `global_batch` (checked to divide among the
    replicas in sync). Other keyword arguments go to `make_dataset`.
    """
    if (per_replica_batch is None) == (global_batch is None):
        raise ShardingError("give exactly one of per_replica_batch and global_batch")

    def build(input_context=None):
        batch = per_replica_batch
        if global_batch is not None:
            replicas = (input_context.num_replicas_in_sync if input_context is not None
                        else _replicas(None))
            batch = per_replica_batch_size(global_batch, int(replicas))
        return make_dataset(files, parse_fn, batch, input_context, **options)

    return build


def distribute(
    files: str | Iterable[str],
    parse_fn: Callable | None = None,
    per_replica_batch: int | None = None,
    strategy: Any = None,
    *,
    global_batch: int | None = None,
    **options: Any,
):
    """From a file pattern to a distributed dataset in one call.

    Each worker reads only its share (by file, or by record when there are
    too few files), parsed and batched so that one step takes
    `per_replica_batch × strategy.num_replicas_in_sync` examples over all
    replicas. Iterate it in a custom loop (`strategy.run`) or pass it to
    `model.fit(..., steps_per_epoch=...)`. Under ParameterServerStrategy pass
    the result to `coordinator.create_per_worker_dataset(...)`.
    """
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    if _is_parameter_server(strategy):
        # TF gives every PS worker the same InputContext (1 pipeline, id 0): the
        # only per-worker difference is randomness, so shuffle unseeded and repeat.
        options.setdefault("shuffle_buffer", 1024)
        options.setdefault("repeat", True)
        if options.get("seed") is not None:
            raise ShardingError(
                "a fixed seed under ParameterServerStrategy makes every worker read the same "
                "records in the same order; leave seed=None")
    build = dataset_fn(files, parse_fn, per_replica_batch, global_batch=global_batch, **options)
    if _is_parameter_server(strategy):
        check_ps_input(build)  # a global tf.random seed would still fix the shuffle order
    return strategy.distribute_datasets_from_function(build)


def _is_parameter_server(strategy: Any) -> bool:
    return "ParameterServerStrategy" in type(strategy).__name__


# ---------------------------------------------------------------- checks


def _dataset_ops(dataset) -> list[tuple[str, dict]]:
    """(op type, attrs) of every node of `dataset`'s graph, functions included."""
    import tensorflow as tf

    serialized = tf.raw_ops.DatasetToGraphV2(
        input_dataset=dataset._variant_tensor,  # noqa: SLF001 - no public graph accessor
        external_state_policy=0, strip_device_assignment=True)
    graph = tf.compat.v1.GraphDef.FromString(serialized.numpy())
    nodes = list(graph.node)
    for function in graph.library.function:
        nodes += list(function.node_def)
    return [(node.op, node) for node in nodes]


def check_dataset(dataset, num_workers: int | None = None):
    """Warn when distributing `dataset` as it is would shard it badly; return it.

    Checks a dataset you built yourself before `strategy.experimental_distribute_dataset`
    or `model.fit` under MultiWorkerMirroredStrategy: with the default AUTO
    policy and no file reader in the pipeline, TensorFlow silently falls back
    to DATA sharding, where every worker produces the whole dataset and keeps
    1/N of it. Say what you mean (runtime.shard, or an explicit policy) or read
    from files with runtime.distribute.
    """
    import tensorflow as tf

    workers = num_workers if num_workers is not None else input_pipeline().count
    policy = dataset.options().experimental_distribute.auto_shard_policy
    if workers < 2 or policy != tf.data.experimental.AutoShardPolicy.AUTO:
        return dataset
    ops = {op for op, _ in _dataset_ops(dataset)}
    if not ops & _READER_OPS:
        warnings.warn(
            f"this dataset has AutoShardPolicy AUTO but reads no files, so TensorFlow will "
            f"fall back to DATA sharding: each of the {workers} workers computes the whole "
            f"pipeline and keeps 1/{workers} of the elements. For in-memory data say so with "
            "runtime.shard(dataset) (or policy DATA); for files use "
            "runtime.distribute(pattern, parse_fn, per_replica_batch)",
            ShardingWarning, stacklevel=2)
    return dataset


def check_ps_input(dataset_or_fn: Any):
    """Check an input meant for a ParameterServerStrategy coordinator; return it.

    A `tf.data.Dataset` is copied as is to every worker, and the workers of a
    dataset function all get the same InputContext (one pipeline), so nothing
    is sharded: every worker trains on the same records unless the pipeline
    shuffles with no fixed seed. Raises for a plain dataset; for a function,
    builds it once and warns when no unseeded shuffle makes the workers differ.
    """
    import tensorflow as tf

    if isinstance(dataset_or_fn, tf.data.Dataset):
        raise ShardingError(
            "a tf.data.Dataset given to a ParameterServerStrategy job is copied unchanged to "
            "every worker: each trains on the whole dataset in the same order. Pass a dataset "
            "function instead, e.g. runtime.distribute(pattern, parse_fn, per_replica_batch, "
            "strategy) to coordinator.create_per_worker_dataset(...)")
    if not callable(dataset_or_fn):
        return dataset_or_fn  # a DistributedDataset: built by distribute() or by the user
    dataset = dataset_or_fn(tf.distribute.InputContext())
    if not _has_unseeded_shuffle(dataset):
        warnings.warn(
            "this ParameterServerStrategy dataset function has no shuffle without a fixed seed: "
            "TensorFlow builds the same pipeline on every worker (one input pipeline, id 0), "
            "so all workers read the same records in the same order. Shuffle with seed=None "
            "and repeat (runtime.dataset_fn does both), or use tf.data service for "
            "exactly-once visitation",
            ShardingWarning, stacklevel=2)
    return dataset_or_fn


def _has_unseeded_shuffle(dataset) -> bool:
    import tensorflow as tf

    nodes = {node.name: node for _, node in _dataset_ops(dataset)}
    for op, node in _dataset_ops(dataset):
        if op not in _SHUFFLE_OPS:
            continue
        seeds = []
        for name in list(node.input)[2:4]:  # inputs: dataset, buffer_size, seed, seed2
            const = nodes.get(name.split(":")[0].lstrip("^"))
            if const is None or const.op != "Const":
                seeds.append(None)
            else:
                seeds.append(int(tf.make_ndarray(const.attr["value"].tensor)))
        if seeds == [0, 0]:  # both zero: the kernel draws a fresh random seed
            return True
    return False
