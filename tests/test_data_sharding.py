"""Input sharding (launcher/runtime/data.py): each worker reads its share, exactly once.

Unit tests run the sharding logic in this process with `TF_CONFIG` set or an
`InputContext` built by hand; the end-to-end tests start real workers under
MultiWorkerMirroredStrategy through `python -m launcher --local N`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from launcher.runtime import data  # noqa: E402

PROBE = Path(__file__).parent / "scripts" / "data_shard_probe.py"
FILE_SIZES = (3, 4, 5, 6, 7, 8, 9)  # records per file: uneven on purpose, 42 in all


def write_tfrecords(folder: Path, sizes=FILE_SIZES) -> list[str]:
    """TFRecord files of tf.train.Example {id, payload}; ids 0.. unique over all files."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, next_id = [], 0
    for number, size in enumerate(sizes):
        path = folder / f"part-{number:02d}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for _ in range(size):
                feature = {
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[next_id])),
                    "payload": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x" * 64])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
                next_id += 1
        paths.append(str(path))
    return paths


def parse_id(record):
    return tf.io.parse_single_example(
        record, {"id": tf.io.FixedLenFeature([], tf.int64)})["id"]


def ids_of(dataset) -> list[int]:
    return [int(i) for batch in dataset for i in batch.numpy()]


def context(pipelines: int, index: int, replicas: int | None = None):
    return tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=index,
                                      num_replicas_in_sync=replicas or pipelines)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[str]:
    return write_tfrecords(tmp_path_factory.mktemp("tfrecords"))


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def tf_config(cluster: dict, kind: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


# ------------------------------------------------------------ who reads what


def test_pipeline_numbering_follows_tensorflow(monkeypatch):
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    monkeypatch.setenv("TF_CONFIG", tf_config(cluster, "chief", 0))
    assert data.input_pipeline() == data.InputPipeline(3, 0)
    monkeypatch.setenv("TF_CONFIG", tf_config(cluster, "worker", 1))
    assert data.input_pipeline() == data.InputPipeline(3, 2)
    monkeypatch.setenv("TF_CONFIG", tf_config({"worker": ["b:1", "c:1"]}, "worker", 1))
    assert data.input_pipeline() == data.InputPipeline(2, 1)
    monkeypatch.delenv("TF_CONFIG")
    assert data.input_pipeline() == data.InputPipeline(1, 0)
    assert data.input_pipeline(context(4, 3)) == data.InputPipeline(4, 3, 4)


def test_list_files_is_sorted_and_explains_a_miss(files, tmp_path):
    assert data.list_files(str(Path(files[0]).parent / "*.tfrecord")) == sorted(files)
    assert data.list_files(list(reversed(files)) + files[:1]) == sorted(files)
    with pytest.raises(data.ShardingError, match="no input file matches"):
        data.list_files(str(tmp_path / "*.tfrecord"))


@pytest.mark.parametrize("workers", [2, 3])
def test_file_shards_partition_the_list(files, workers, monkeypatch):
    cluster = {"worker": [f"h{i}:1" for i in range(workers)]}
    shards = []
    for index in range(workers):
        monkeypatch.setenv("TF_CONFIG", tf_config(cluster, "worker", index))
        shards.append(data.shard_files(files))
    flat = [name for shard in shards for name in shard]
    assert sorted(flat) == sorted(files) and len(flat) == len(set(flat))


@pytest.mark.parametrize("shard_by", ["file", "element"])
@pytest.mark.parametrize("workers", [2, 3])
def test_pipelines_see_each_example_once(files, workers, shard_by):
    seen = [ids_of(data.make_dataset(files, parse_id, 5, context(workers, index),
                                     shard_by=shard_by, shuffle_buffer=16, cache=True))
            for index in range(workers)]
    flat = [i for ids in seen for i in ids]
    assert sorted(flat) == list(range(sum(FILE_SIZES)))


def test_policy_is_off_after_sharding(files):
    off = tf.data.experimental.AutoShardPolicy.OFF
    made = data.make_dataset(files, parse_id, 4, context(2, 0))
    assert made.options().experimental_distribute.auto_shard_policy == off
    sharded = data.shard(tf.data.Dataset.range(10), context(2, 1))
    assert sharded.options().experimental_distribute.auto_shard_policy == off
    assert list(sharded.as_numpy_iterator()) == [1, 3, 5, 7, 9]


# ----------------------------------------------------------- sanity checks


def test_fewer_files_than_workers_is_an_error_that_says_what_to_do(files):
    with pytest.raises(data.ShardingError, match=r"2 input file\(s\) for 3 workers.*"
                       r"shard_by='element'"):
        data.make_dataset(files[:2], parse_id, 4, context(3, 0), shard_by="file")


def test_auto_falls_back_to_element_sharding_with_a_warning(files):
    with pytest.warns(data.ShardingWarning, match="falls back to element sharding"):
        seen = [ids_of(data.make_dataset(files[:2], parse_id, 4, context(3, index)))
                for index in range(3)]
    assert sorted(i for ids in seen for i in ids) == list(range(FILE_SIZES[0] + FILE_SIZES[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # enough files: AUTO means file sharding, silently
        data.make_dataset(files, parse_id, 4, context(3, 0))


def test_tensorflow_auto_policy_falling_back_to_data_is_flagged(files):
    in_memory = tf.data.Dataset.from_tensor_slices(list(range(100))).batch(10)
    with pytest.warns(data.ShardingWarning, match="fall back to DATA sharding"):
        data.check_dataset(in_memory, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data.check_dataset(tf.data.TFRecordDataset(files).batch(10), num_workers=2)
        data.check_dataset(data.shard(in_memory, context(2, 0)), num_workers=2)
        data.check_dataset(in_memory, num_workers=1)


def test_global_batch_that_does_not_divide_is_an_error(files):
    with pytest.raises(data.ShardingError, match="global batch 10 does not divide among 3 "
                       "replicas.*e.g. 9 or 12"):
        data.per_replica_batch_size(10, 3)
    build = data.dataset_fn(files, parse_id, global_batch=10)
    with pytest.raises(data.ShardingError, match="does not divide"):
        build(context(3, 0))
    assert data.per_replica_batch_size(12, 3) == 4
    batches = [b.shape[0] for b in data.dataset_fn(files, parse_id, global_batch=12)(
        context(1, 0, replicas=3))]
    assert max(batches) == 4
    assert data.global_batch_size(8, tf.distribute.get_strategy()) == 8


def test_parameter_server_input_without_sharding_is_flagged(files, monkeypatch):
    whole = tf.data.TFRecordDataset(files).map(parse_id).batch(4)
    with pytest.raises(data.ShardingError, match="copied unchanged to every worker"):
        data.check_ps_input(whole)
    with pytest.warns(data.ShardingWarning, match="all workers read the same records"):
        data.check_ps_input(lambda ctx: tf.data.TFRecordDataset(files).shuffle(8, seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data.check_ps_input(data.dataset_fn(files, parse_id, 4, shuffle_buffer=8, repeat=True))
    # Python-side sharding on a PS coordinator would give every worker the same share.
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"], "ps": ["d:1"]}
    monkeypatch.setenv("TF_CONFIG", tf_config(cluster, "chief", 0))
    with pytest.raises(data.ShardingError, match="ParameterServerStrategy"):
        data.shard_files(files)


# ---------------------------------------------------------------- end to end


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [2, 3])
def test_real_workers_see_every_example_exactly_once(tmp_path, workers):
    files = write_tfrecords(tmp_path / "data")
    out = tmp_path / "seen"
    out.mkdir()
    command = [sys.executable, "-m", "launcher", "--local", str(workers),
               "--run-dir", str(tmp_path / "run"), str(PROBE), str(out),
               str(tmp_path / "data" / "*.tfrecord")]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    everything = list(range(sum(FILE_SIZES)))
    for mode in ("file", "element"):
        reports = [json.loads((out / f"{mode}-{i}.json").read_text()) for i in range(workers)]
        assert [r["pipelines"] for r in reports] == [workers] * workers
        assert all(r["replicas_in_sync"] == workers for r in reports)  # a real MWMS cluster
        seen = [i for r in reports for i in r["ids"]]
        assert sorted(seen) == everything, f"{mode}: an example missed or seen twice"
        for report in reports:
            opened = sorted(set(report["opened"]))
            if mode == "file":  # each worker opened exactly its own files, once each
                assert opened == sorted(files)[report["index"]::workers]
                assert len(report["opened"]) == len(opened)
            else:  # element sharding pays with I/O: every worker reads every file
                assert opened == sorted(files)
