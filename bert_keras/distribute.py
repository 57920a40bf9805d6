"""Where a run trains, from a flag value, on either Keras backend (docs/DESIGN.md section 7,
docs/backends.md).

`get_distribution(name, tpu)` is the entry point the tools use: a `Distribution` whose
`scope()` the model is built, compiled and trained under, on TensorFlow and on JAX.

TensorFlow (`get_strategy`: a tf.distribute strategy):

    default                the default (no-op) strategy: one device
    mirrored               MirroredStrategy over the local GPUs, or over the logical CPU
                           devices if there is no GPU (see `configure_cpu_devices`)
    multi_worker_mirrored  MultiWorkerMirroredStrategy; the cluster comes from TF_CONFIG
    tpu                    TPUStrategy on a local TPU VM or a `grpc://` TPU address

JAX (Keras' backend "jax"; `keras.distribution`):

    default                one device (Keras' default placement)
    mirrored               keras.distribution.DataParallel over the local devices (GPUs, TPU
                           cores, or the host's CPU devices: `configure_cpu_devices`): the
                           variables replicated, each global batch split along its first axis
    multi_worker_mirrored, tpu
                           tf.distribute strategies: a one-line `StrategyError` (JAX reaches
                           a TPU's cores through "mirrored")

The TPU path never contacts the cloud metadata server: TPUClusterResolver resolves a bare
TPU *name* through it, so only local TPUs and explicit `grpc://host:port` addresses are
accepted, and without a TPU it fails with a one-line `StrategyError`.
"""

import contextlib

import keras
import tensorflow as tf
from absl import logging

from data_prep.cli import ToolError

STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "tpu")
JAX_STRATEGIES = ("default", "mirrored")


class StrategyError(ToolError):
    """The requested strategy cannot run here; the message is one line, meant for users."""


def configure_cpu_devices(num_devices: int) -> None:
    """Splits the host CPU into `num_devices` logical devices (before TF initializes).

    Lets `mirrored` run with several replicas on a CPU-only machine (tests, demos). On JAX
    this is `jax_num_cpu_devices` (the same as XLA_FLAGS=--xla_force_host_platform_device_count
    before jax starts).

    Raises:
      StrategyError: if the backend's devices are already initialized differently.
    """
    if num_devices <= 1:
        return
    if keras.backend.backend() == "jax":
        import jax

        try:
            jax.config.update("jax_num_cpu_devices", num_devices)
        except RuntimeError:  # JAX already ran something: its devices are fixed.
            have = len(jax.devices("cpu"))
            if have != num_devices:
                raise StrategyError(
                    f"cannot split the CPU into {num_devices} devices: JAX already initialized "
                    f"{have} CPU device(s)") from None
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


class Distribution:
    """Where a run's model lives and how its batches are split, on either backend.

    Build, compile, train and evaluate under `scope()`. On TensorFlow `strategy` is the
    tf.distribute strategy and `scope()` its scope; on JAX `keras_distribution` is
    `keras.distribution.DataParallel` (None for "default") and `scope()` makes it Keras'
    distribution for what runs inside (fit shards each batch when it runs, so training too
    must run inside).
    """

    def __init__(self, name: str, strategy=None, keras_distribution=None):
        self.name = name
        self.strategy = strategy
        self.keras_distribution = keras_distribution

    @property
    def num_replicas_in_sync(self) -> int:
        """Devices each global batch is split over."""
        if self.strategy is not None:
            return self.strategy.num_replicas_in_sync
        if self.keras_distribution is not None:
            return len(self.keras_distribution.device_mesh.devices.flatten())
        return 1

    @property
    def is_chief(self) -> bool:
        """True on the process that writes shared outputs (`is_chief`; JAX: process 0)."""
        if self.strategy is not None:
            return is_chief(self.strategy)
        import jax

        return jax.process_index() == 0

    def scope(self):
        if self.strategy is not None:
            return self.strategy.scope()
        if self.keras_distribution is not None:
            return self.keras_distribution.scope()
        return contextlib.nullcontext()

    def distribute_datasets_from_function(self, dataset_fn):
        """The training input: `dataset_fn(tf.distribute.InputContext)` -> a tf.data.Dataset.

        TensorFlow: the strategy's (per-replica batches, one pipeline per worker). JAX: one
        pipeline of *global* batches (the context says one replica), which Keras splits
        across the devices; so batches per update = context.num_replicas_in_sync //
        context.num_input_pipelines on both backends.
        """
        if self.strategy is not None:
            return self.strategy.distribute_datasets_from_function(dataset_fn)
        return dataset_fn(tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                                     num_replicas_in_sync=1))

    def __repr__(self):
        kind = type(self.strategy or self.keras_distribution).__name__ if (
            self.strategy or self.keras_distribution) else "one device"
        return f"{self.name} ({kind}) with {self.num_replicas_in_sync} replica(s)"


def get_distribution(name: str = "default", tpu: str = "") -> Distribution:
    """The `Distribution` for a --distribution_strategy value on Keras' backend.

    TensorFlow: `get_strategy(name, tpu)`. JAX: `JAX_STRATEGIES` (module docstring).

    Raises:
      StrategyError: an unknown name; on TensorFlow no TPU for "tpu"; on JAX a tf.distribute
        strategy (one line naming the flag, what JAX runs and what was asked).
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return Distribution(name, strategy=get_strategy(name, tpu))
    if name not in STRATEGIES:
        raise StrategyError(f"unknown distribution_strategy {name!r}; expected one of "
                            f"{JAX_STRATEGIES} on KERAS_BACKEND={backend}")
    if name not in JAX_STRATEGIES:
        raise StrategyError(
            f"--distribution_strategy: expected default or mirrored on KERAS_BACKEND={backend} "
            f"(mirrored: keras.distribution.DataParallel over the local GPUs, TPU cores or CPU "
            f"devices), found {name} (a tf.distribute strategy: run with "
            "KERAS_BACKEND=tensorflow)")
    if name == "default":
        return Distribution(name)
    devices = keras.distribution.list_devices()
    return Distribution(name, keras_distribution=keras.distribution.DataParallel(devices=devices))
