"""Records which examples and which files each worker sees, for tests/test_data_sharding.py.

Run under `mgpu-launch --local N data_shard_probe.py OUT_DIR PATTERN`: for each
sharding mode, iterates one epoch of `runtime.data.distribute(...)` under a real
MultiWorkerMirroredStrategy and writes OUT_DIR/<mode>-<pipeline index>.json with
the example ids this worker got and the files its reader opened.
"""

import json
import os
import sys

import tensorflow as tf

from launcher.runtime import data

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64),
            "payload": tf.io.FixedLenFeature([], tf.string)}


def one_epoch(mode: str, pattern: str, strategy) -> tuple[list[int], list[str]]:
    """Example ids this worker got in one epoch, and every file its reader opened."""
    opened: list[str] = []

    def record_open(name):
        opened.append(name.numpy().decode())
        return name

    def reader(name):  # every file open goes through here, on this worker
        name = tf.py_function(record_open, [name], tf.string)
        return tf.data.TFRecordDataset(tf.reshape(name, []))

    def parse(record):
        return tf.io.parse_single_example(record, FEATURES)["id"]

    dist = data.distribute(pattern, parse, per_replica_batch=4, strategy=strategy,
                           shard_by=mode, reader_fn=reader)
    ids: list[int] = []
    for batch in dist:
        for local in strategy.experimental_local_results(batch):
            ids += [int(i) for i in local.numpy()]
    return ids, opened


def main() -> None:
    out_dir, pattern = sys.argv[1], sys.argv[2]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # the real cluster, from TF_CONFIG
    pipeline = data.input_pipeline()
    for mode in ("file", "element"):
        ids, opened = one_epoch(mode, pattern, strategy)
        result = {"mode": mode, "pipelines": pipeline.count, "index": pipeline.index,
                  "replicas_in_sync": strategy.num_replicas_in_sync,
                  "ids": ids, "opened": opened}
        with open(os.path.join(out_dir, f"{mode}-{pipeline.index}.json"), "w") as handle:
            json.dump(result, handle)
        print(f"{mode}: pipeline {pipeline.index}/{pipeline.count} saw {len(ids)} examples "
              f"from {len(set(opened))} files", flush=True)


if __name__ == "__main__":
    main()
