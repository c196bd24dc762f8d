"""Building the strategy of a task, including several logical CPU devices per worker.

Owns `build_strategy(...)`, behind `runtime.strategy()`. The part that needs
TensorFlow internals is the CPU split: MultiWorkerMirroredStrategy picks its
local devices in `CollectiveAllReduceExtended._initialize_local_devices`, which
takes every GPU, or else exactly one CPU device, whatever logical CPU devices
exist. To run the multi-replica code paths without GPUs (2 workers x 2 logical
CPUs = 4 replicas in sync), the strategy here uses an extended object whose
only change is to return the N logical CPU devices instead of one.

TensorFlow is imported inside the functions. Must not import the launcher side.
"""

from __future__ import annotations

import os


def cpu_devices_wanted(cpu_devices: int | None) -> int:
    """The logical CPU device count asked for (argument, else `MGPU_CPU_DEVICES`), >= 1."""
    if cpu_devices is None:
        raw = os.environ.get("MGPU_CPU_DEVICES", "").strip()
        cpu_devices = int(raw) if raw else 1
    if cpu_devices < 1:
        raise ValueError(f"cpu_devices must be at least 1, got {cpu_devices}")
    return cpu_devices


def split_cpu(count: int) -> list[str]:
    """Split the first physical CPU into `count` logical devices; return their names.

    Must run before TensorFlow initializes its devices (before the first op).
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if not existing or len(existing) != count:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
            )
        except RuntimeError as exc:  # devices already initialized
            raise RuntimeError(
                f"cannot split the CPU into {count} logical devices: TensorFlow already "
                "initialized its devices. Call runtime.strategy(cpu_devices=...) before "
                "running any TensorFlow op."
            ) from exc
    return [f"/device:CPU:{i}" for i in range(count)]


def multi_worker_mirrored(options, cpu_devices: int = 1):
    """`MultiWorkerMirroredStrategy`, with `cpu_devices` local replicas when no GPU."""
    import tensorflow as tf

    if cpu_devices <= 1 or tf.config.list_physical_devices("GPU"):
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    split_cpu(cpu_devices)
    return _logical_cpu_mwms(options, cpu_devices)


def _logical_cpu_mwms(options, cpu_devices: int):
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars
    from tensorflow.python.distribute import distribute_lib

    class LogicalCpuExtended(cars.CollectiveAllReduceExtended):
        def _initialize_local_devices(self, cluster_resolver, worker_device):
            devices, kind = super()._initialize_local_devices(cluster_resolver, worker_device)
            if kind != "CPU":
                return devices, kind
            return tuple(f"{worker_device}/device:CPU:{i}" for i in range(cpu_devices)), "CPU"

    class LogicalCpuMultiWorkerMirroredStrategy(cars.CollectiveAllReduceStrategy):
        """MultiWorkerMirroredStrategy over N logical CPU devices per worker."""

        def __init__(self) -> None:
            # Strategy.__init__ directly: the parent's would build the stock extended.
            distribute_lib.Strategy.__init__(
                self, LogicalCpuExtended(self, cluster_resolver=None,
                                         communication_options=options)
            )

    LogicalCpuMultiWorkerMirroredStrategy.__name__ = "MultiWorkerMirroredStrategy"
    return LogicalCpuMultiWorkerMirroredStrategy()


def mirrored_over_cpus(cpu_devices: int):
    """One host, no GPU: MirroredStrategy over `cpu_devices` logical CPU devices."""
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(split_cpu(cpu_devices))
