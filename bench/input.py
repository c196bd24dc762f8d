"""Bytes each worker reads per epoch: file-sharded input against an unsharded pipeline.

    python bench/input.py [--workers 2 3] [--files 12] [--file-kb 512]

Writes TFRecord files to a temporary directory, then for each worker count
runs `mgpu-launch --local N` on this same file in worker mode. Each real worker
(MultiWorkerMirroredStrategy) reads one epoch three ways and measures the bytes
read twice: the sizes of the files its reader opened, and the growth of the
process's `rchar` in /proc/self/io (every byte read by any thread, sockets
included, so it carries a little collective-op noise):

- unsharded: the single-machine pipeline, `TFRecordDataset(all files)`, as
  every worker runs it when nobody shards;
- file-sharded: `runtime.data.distribute(..., shard_by="file")`;
- element-sharded: the same with `shard_by="element"` (exactly-once, full I/O).

Prints one row per worker, side by side, and the ratio sharded / unsharded
against the target 1/N.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECORD_BYTES = 4096


def rchar() -> int:
    """Bytes this process has read so far, all threads (Linux); -1 elsewhere."""
    try:
        with open("/proc/self/io") as handle:
            for line in handle:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


# ------------------------------------------------------------------ worker


def measure(name: str, make_dataset, iterate) -> dict:
    opened: list[str] = []
    before = rchar()
    iterate(make_dataset(opened))
    return {"pipeline": name, "rchar": rchar() - before,
            "opened_bytes": sum(os.path.getsize(path) for path in opened),
            "files": len(opened)}


def worker(out_dir: str, pattern: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from launcher import runtime
    from launcher.runtime import data

    strategy = runtime.strategy()

    def recording_reader(opened: list[str]):
        def note(name):
            opened.append(name.numpy().decode())
            return name

        def reader(name):
            name = tf.py_function(note, [name], tf.string)
            return tf.data.TFRecordDataset(tf.reshape(name, []))
        return reader

    def unsharded(opened):  # what a single-machine script does, on every worker
        files = data.list_files(pattern)
        dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
            recording_reader(opened), cycle_length=4)
        return dataset.batch(64)

    def sharded(shard_by):
        def make(opened):
            return data.distribute(pattern, None, 64, strategy, shard_by=shard_by,
                                   reader_fn=recording_reader(opened))
        return make

    def local_epoch(dataset):
        for _ in dataset:
            pass

    def distributed_epoch(dataset):
        for _ in dataset:  # every step agrees across workers on whether data is left
            pass

    index = data.input_pipeline().index
    rows = [measure("unsharded", unsharded, local_epoch),
            measure("file-sharded", sharded("file"), distributed_epoch),
            measure("element-sharded", sharded("element"), distributed_epoch)]
    report = {"index": index, "workers": data.input_pipeline().count, "rows": rows}
    Path(out_dir, f"worker-{index}.json").write_text(json.dumps(report))


# ------------------------------------------------------------------ driver


def write_files(folder: Path, count: int, file_kb: int) -> int:
    import tensorflow as tf

    payload = os.urandom(RECORD_BYTES)
    for number in range(count):
        with tf.io.TFRecordWriter(str(folder / f"part-{number:03d}.tfrecord")) as writer:
            for _ in range(file_kb * 1024 // RECORD_BYTES):
                writer.write(payload)
    return sum(p.stat().st_size for p in folder.glob("*.tfrecord"))


def run(workers: int, pattern: str, scratch: Path) -> list[dict]:
    out = scratch / f"out-{workers}"
    out.mkdir()
    command = [sys.executable, "-m", "launcher", "--local", str(workers),
               "--run-dir", str(scratch / f"run-{workers}"), os.path.abspath(__file__),
               "--worker", str(out), pattern]
    started = time.monotonic()
    done = subprocess.run(command, cwd=scratch, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mgpu-launch --local {workers} failed ({done.returncode}):\n"
                 f"{done.stdout[-3000:]}")
    print(f"  ({workers} workers ran in {time.monotonic() - started:.1f} s)")
    return [json.loads((out / f"worker-{i}.json").read_text()) for i in range(workers)]


def mib(count: int) -> str:
    return f"{count / 2**20:8.2f} MiB"


def print_table(workers: int, reports: list[dict]) -> None:
    print(f"\n{workers} workers — bytes read per worker in one epoch "
          "(files opened / OS rchar), and sharded ÷ unsharded:")
    print(f"{'worker':>6}  {'unsharded':>26}  {'file-sharded':>26}  {'ratio':>11}  "
          f"{'element-sharded':>26}  {'ratio':>5}")
    ratios = []
    for report in reports:
        rows = {row["pipeline"]: row for row in report["rows"]}
        base, mine, elem = rows["unsharded"], rows["file-sharded"], rows["element-sharded"]
        ratio = mine["opened_bytes"] / base["opened_bytes"]
        ratio_os = mine["rchar"] / base["rchar"] if base["rchar"] > 0 else float("nan")
        ratios.append(ratio)
        print(f"{report['index']:>6}  {mib(base['opened_bytes'])} /{mib(base['rchar'])}  "
              f"{mib(mine['opened_bytes'])} /{mib(mine['rchar'])}  "
              f"{ratio:4.2f} /{ratio_os:5.2f}  "
              f"{mib(elem['opened_bytes'])} /{mib(elem['rchar'])}  "
              f"{elem['opened_bytes'] / base['opened_bytes']:5.2f}")
    mean = sum(ratios) / len(ratios)
    print(f"  file sharding: mean ratio {mean:.3f}, target 1/{workers} = {1 / workers:.3f}; "
          f"total over workers {sum(ratios):.2f}× one full read (1.00 = each byte read once)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--file-kb", type=int, default=512)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="mgpu-bench-input-") as tmp:
        scratch = Path(tmp)
        (scratch / "data").mkdir()
        total = write_files(scratch / "data", args.files, args.file_kb)
        print(f"dataset: {args.files} TFRecord files, {mib(total).strip()} in all")
        pattern = str(scratch / "data" / "*.tfrecord")
        for workers in args.workers:
            print_table(workers, run(workers, pattern, scratch))


if __name__ == "__main__":
    main()
