"""tf.distribute strategy from a flag value (docs/DESIGN.md section 7).

    default                the default (no-op) strategy: one device
    mirrored               MirroredStrategy over the local GPUs, or over the logical CPU
                           devices if there is no GPU (see `configure_cpu_devices`)
    multi_worker_mirrored  MultiWorkerMirroredStrategy; the cluster comes from TF_CONFIG
    tpu                    TPUStrategy on a local TPU VM or a `grpc://` TPU address

The TPU path never contacts the cloud metadata server: TPUClusterResolver resolves a bare
TPU *name* through it, so only local TPUs and explicit `grpc://host:port` addresses are
accepted, and without a TPU it fails with a one-line `StrategyError`.
"""

import tensorflow as tf
from absl import logging

STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "tpu")


class StrategyError(ValueError):
    """The requested strategy cannot run here; the message is one line, meant for users."""


def configure_cpu_devices(num_devices: int) -> None:
    """Splits the host CPU into `num_devices` logical devices (before TF initializes).

    Lets `mirrored` run with several replicas on a CPU-only machine (tests, demos).

    Raises:
      StrategyError: if TensorFlow's devices are already initialized differently.
    """
    if num_devices <= 1:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)]
    try:
        tf.config.set_logical_device_configuration(cpu, wanted)
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have != num_devices:
            raise StrategyError(
                f"cannot split the CPU into {num_devices} devices: TensorFlow already "
                f"initialized {have} CPU device(s)"
            ) from None


def _tpu_strategy(tpu: str):
    tpu = (tpu or "").strip()
    if tpu.startswith("grpc://"):
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    elif tpu in ("", "local"):
        if not tf.config.list_physical_devices("TPU"):
            raise StrategyError(
                "distribution_strategy=tpu but no TPU is attached to this machine and "
                "--tpu gives no grpc:// address; use --distribution_strategy=default, "
                "mirrored or multi_worker_mirrored here"
            )
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
    else:
        raise StrategyError(
            f"--tpu={tpu!r}: pass a grpc://HOST:PORT address or run on a TPU VM (a bare TPU "
            "name would be resolved through the cloud metadata server, which this tool "
            "never queries)"
        )
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def get_strategy(name: str = "default", tpu: str = "") -> tf.distribute.Strategy:
    """Returns the tf.distribute strategy for a flag value.

    Args:
      name: one of `STRATEGIES`.
      tpu: for "tpu": "" or "local" (TPU VM) or "grpc://host:port".

    Returns:
      A `tf.distribute.Strategy`; build and compile the model under its `scope()`.

    Raises:
      StrategyError: unknown name, or a TPU was requested and there is none.
    """
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        if tf.config.list_logical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=devices)
    if name == "multi_worker_mirrored":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        resolver = strategy.cluster_resolver
        logging.info(
            "MultiWorkerMirroredStrategy: task %s:%s, cluster %s",
            resolver.task_type, resolver.task_id, resolver.cluster_spec().as_dict(),
        )
        return strategy
    if name == "tpu":
        return _tpu_strategy(tpu)
    raise StrategyError(f"unknown distribution_strategy {name!r}; expected one of {STRATEGIES}")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes shared outputs (final weights, configs, logs).

    Single-worker strategies are always chief. Under MultiWorkerMirroredStrategy the chief
    is task `chief` or, without one, `worker` 0 (TensorFlow's convention).
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None:
        return True
    cluster = resolver.cluster_spec().as_dict()
    if "chief" in cluster:
        return task_type == "chief"
    return task_type == "worker" and task_id == 0
