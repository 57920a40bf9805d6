"""Where a run trains, from its flags, on either Keras backend (docs/DESIGN.md section 7,
docs/backends.md, docs/distributed.md).

`get_distribution(name, tpu, ...)` is the entry point the tools use (through
`DistributionOptions.distribution`, the flags they share): a `Distribution` whose `scope()`
the model is built, compiled and trained under, on TensorFlow and on JAX.

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
    multi_worker_mirrored  the same over the devices of several processes (a TPU pod slice,
                           several GPU hosts): `keras.distribution.initialize` (which calls
                           `jax.distributed.initialize`) joins them first, with the
                           coordinator's address, the number of processes and this process's
                           index from --coordinator_address, --num_processes, --process_id,
                           else from Keras' KERAS_DISTRIBUTION_JOB_ADDRESSES,
                           KERAS_DISTRIBUTION_NUM_PROCESSES, KERAS_DISTRIBUTION_PROCESS_ID,
                           else as JAX finds them on Cloud TPU and under SLURM
    tpu                    a tf.distribute strategy: a one-line `StrategyError` (JAX reaches
                           a TPU's cores through "mirrored", a pod slice's through
                           "multi_worker_mirrored")

The TPU path never contacts the cloud metadata server: TPUClusterResolver resolves a bare
TPU *name* through it, so only local TPUs and explicit `grpc://host:port` addresses are
accepted, and without a TPU it fails with a one-line `StrategyError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import zlib

import keras
import tensorflow as tf
from absl import logging

from data_prep import files
from data_prep.cli import ToolError, option

STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "tpu")
JAX_STRATEGIES = ("default", "mirrored", "multi_worker_mirrored")
# Keras' environment variables for `keras.distribution.initialize`, by the flag they stand for.
PROCESS_ENVIRONMENT = {"coordinator_address": "KERAS_DISTRIBUTION_JOB_ADDRESSES",
                       "num_processes": "KERAS_DISTRIBUTION_NUM_PROCESSES",
                       "process_id": "KERAS_DISTRIBUTION_PROCESS_ID"}


class StrategyError(ToolError):
    """The requested strategy cannot run here; the message is one line, meant for users."""


class Preempted(StrategyError):
    """Training stopped in every process at once on a preemption notice (SIGTERM)."""


class StopOnPreemption(keras.callbacks.Callback):
    """Across processes: ends training at the step every process agrees on once any of
    them got a preemption notice (SIGTERM).

    JAX's preemption service (started by `jax.distributed.initialize`) and TensorFlow's
    coordination service (started by MultiWorkerMirroredStrategy) each take SIGTERM over
    from Python, whose default ends the process: a SIGTERM to any process of a job (a
    scheduler preempting or stopping it, `kill`) was noted and nothing else, and training
    went on to its end (measured on both) until the scheduler's SIGKILL. At its training
    calls this asks `reached(call)` whether the processes reached the call they agreed on
    (JAX: `multihost_utils.reached_preemption_sync_point`; TensorFlow:
    `_TfPreemptionAgreement`) and there raises `Preempted` in every process, so none waits
    for another at a collective. Nothing of the unfinished interval is saved: `then` tells
    the user what the run left (run_pretraining: the newest backup).
    """

    def __init__(self, then: str, reached):
        super().__init__()
        self._then = then
        self._reached = reached
        self._calls = 0  # The step id: training calls of this run, the same in every process.

    def on_train_batch_end(self, batch, logs=None):
        self._calls += 1
        if self._reached(self._calls):
            raise Preempted(
                f"stopped on a preemption notice (SIGTERM to a process of this job): every "
                f"process stopped after training call {self._calls} of this run; {self._then}")


class _TfPreemptionAgreement:
    """The call at which TensorFlow's workers stop after a SIGTERM, agreed through the
    coordination service's key-value store.

    On SIGTERM TensorFlow's handler writes `NOTICE_KEY` (the preempted task's name) to the
    store, which every worker can read. Every `every` calls each worker reads the store: a
    worker that finds the notice and no agreed call yet inserts "stop after call c + 2 *
    every" (the first insert wins), and every worker stops at the agreed call. That call
    is past every worker's next reading: each call's all-reduce holds the workers within
    one call of each other, so the worker that inserted it is at most one call ahead of
    the others' last reading. A read of a missing key waits its 1 ms timeout, hence not
    every call.
    """

    NOTICE_KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"
    STOP_KEY = "bert_keras/stop_after_call"

    def __init__(self, every: int = 10):
        self.every = every
        self._stop_after = None

    def __call__(self, call: int) -> bool:
        from tensorflow.python.eager import context

        def read(key):
            try:
                return context.context().get_config_key_value(key, 1)
            except tf.errors.DeadlineExceededError:
                return None

        if self._stop_after is None and call % self.every == 0:
            agreed = read(self.STOP_KEY)
            if agreed is None and read(self.NOTICE_KEY) is not None:
                try:
                    context.context().set_config_key_value(
                        self.STOP_KEY, str(call + 2 * self.every))
                except tf.errors.AlreadyExistsError:
                    pass  # Another worker's insert came first.
                agreed = read(self.STOP_KEY)
            if agreed is not None:
                self._stop_after = int(agreed)
        return self._stop_after is not None and call >= self._stop_after


def kept_by_a_resume(resuming: str | None, kept: str, resume_on: str, otherwise: str) -> str:
    """The advice that ends a refusal of the replica count: `otherwise` (change a flag) for
    a new run; for a run that resumes an interrupted one (`resuming`: its --output_dir),
    whose training flags a resumed run must keep (`kept`), where to resume it instead
    (`resume_on`). Changing the flag there was refused in turn, as a run with other flags."""
    if not resuming:
        return otherwise
    return (f"{resuming} holds an interrupted run with {kept}, which a resumed run keeps: "
            f"resume it on {resume_on}, or choose a new --output_dir")


def batch_refusal(flag: str, batch: int, num_replicas: int, resuming: str | None = None,
                  resumable: bool = False) -> str | None:
    """Why the global batch `batch` of `flag` (--train_batch_size, --eval_batch_size) cannot
    be split over `num_replicas` replicas (one line), or None where it can. `resuming`: the
    --output_dir whose interrupted run this one resumes (`kept_by_a_resume`), unless the
    flag may change on a resume (`resumable`, the evaluation's batch)."""
    if batch % num_replicas == 0:
        return None
    return (f"--{flag}={batch} is not divisible by the {num_replicas} replicas; "
            + kept_by_a_resume(None if resumable else resuming, f"--{flag}={batch}",
                               f"a number of replicas that divides {batch} "
                               "(--distribution_strategy=default: one device)",
                               f"use a multiple of {num_replicas}"))


def accumulation_refusal(steps: int, num_replicas: int, tf_distribute: bool,
                         resuming: str | None = None) -> str | None:
    """Why Keras 3.15.1 cannot train with gradient accumulation over `steps` micro-batches
    on `num_replicas` replicas (a one-line message naming --gradient_accumulation_steps),
    or None where it can: one replica, or several of Keras' DataParallel on JAX
    (`tf_distribute` False), which accumulates the weights of one device
    (tests/test_run_pretraining_jax.py). run_pretraining and the fine-tuning tools refuse
    with it; `resuming` as in `batch_refusal`.

    Keras applies an accumulated update inside a cond; tf.distribute cannot synchronize
    replicas (merge_call) inside control flow, so fit fails while tracing.
    """
    if steps <= 1 or num_replicas <= 1 or not tf_distribute:
        return None
    return (f"--gradient_accumulation_steps={steps} works with one replica only on TensorFlow "
            f"in Keras 3.15.1 (here: {num_replicas}); "
            + kept_by_a_resume(resuming, f"--gradient_accumulation_steps={steps}",
                               "one replica (--distribution_strategy=default) or on "
                               "KERAS_BACKEND=jax, whose mirrored strategy accumulates",
                               "raise --train_batch_size instead, the replicas already "
                               "multiply the batch (or train on KERAS_BACKEND=jax, whose "
                               "mirrored strategy accumulates)"))


@dataclasses.dataclass(frozen=True)
class DistributionOptions:
    """The flags that say where a tool trains (run_pretraining and the fine-tuning tools)."""

    distribution_strategy: str = option(
        "default", "Where to train: default (one device), mirrored (the local devices), "
        "multi_worker_mirrored (several workers: TF_CONFIG on TensorFlow; on JAX several "
        "processes joined by keras.distribution.initialize, see --coordinator_address), tpu "
        "(TensorFlow). On JAX, mirrored and multi_worker_mirrored are "
        "keras.distribution.DataParallel.", enum=list(STRATEGIES))
    tpu: str = option("", "For --distribution_strategy=tpu: empty/'local' on a TPU VM, or "
                      "grpc://host:port.")
    num_cpu_devices: int = option(1, "Split the CPU into this many logical devices (mirrored "
                                  "on CPU).")
    coordinator_address: str = option(
        "", "KERAS_BACKEND=jax with --distribution_strategy=multi_worker_mirrored: HOST:PORT "
        "of process 0 (the coordinator), the same on every process. Empty: "
        "$KERAS_DISTRIBUTION_JOB_ADDRESSES, else as JAX finds it (Cloud TPU, SLURM).")
    num_processes: int | None = option(
        None, "JAX, multi_worker_mirrored: processes in the job (default: "
        "$KERAS_DISTRIBUTION_NUM_PROCESSES, else as JAX finds it).")
    process_id: int | None = option(
        None, "JAX, multi_worker_mirrored: this process's index, 0 to num_processes - 1; "
        "process 0 writes the outputs (default: $KERAS_DISTRIBUTION_PROCESS_ID, else as JAX "
        "finds it).")

    def check_distribution(self) -> None:
        """Raises StrategyError for values no backend accepts (before anything is built)."""
        if self.num_cpu_devices < 1:
            raise StrategyError(f"--num_cpu_devices must be >= 1, got {self.num_cpu_devices}")
        _check_processes(self.coordinator_address, self.num_processes, self.process_id)

    def distribution(self) -> "Distribution":
        """`configure_cpu_devices` and `get_distribution` for these flags: call it before
        anything touches a device (loading weights does), as JAX's processes must be joined
        before JAX computes anything.

        Raises:
          StrategyError: see `get_distribution`.
        """
        self.check_distribution()
        configure_cpu_devices(self.num_cpu_devices)
        return get_distribution(self.distribution_strategy, self.tpu,
                                coordinator_address=self.coordinator_address,
                                num_processes=self.num_processes, process_id=self.process_id)


def _check_processes(coordinator_address: str, num_processes, process_id,
                     names: dict | None = None) -> None:
    """Raises StrategyError for process flags that cannot name a process of a job.

    `names`: what to call each value in the message, by flag name (Keras' variables when
    the values came from them); the flags by default.
    """
    names = {**{flag: f"--{flag}" for flag in PROCESS_ENVIRONMENT}, **(names or {})}
    if num_processes is not None and num_processes < 1:
        raise StrategyError(f"{names['num_processes']} must be >= 1, got {num_processes}")
    if process_id is not None and (process_id < 0 or (
            num_processes is not None and process_id >= num_processes)):
        upper = f"num_processes - 1 = {num_processes - 1}" if num_processes else \
            "num_processes - 1"
        raise StrategyError(f"{names['process_id']}={process_id}: expected 0 to {upper} (each "
                            "process of the job its own index; process 0 is the coordinator)")
    if coordinator_address:
        host, _, port = coordinator_address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StrategyError(f"{names['coordinator_address']}={coordinator_address!r}: "
                                "expected HOST:PORT of process 0 (e.g. 10.0.0.1:8476)")


def _resolve_processes(coordinator_address: str, num_processes, process_id):
    """The process settings from the flags, else from Keras' variables
    (`PROCESS_ENVIRONMENT`, whose address list starts with process 0's), checked as the
    flags are (JAX's own error for an address without a port was an IndexError traceback).

    Returns:
      (process 0's HOST:PORT or "" for JAX to find, the number of processes or None, this
      process's index or None, what to call each value in a message by flag name).
    """
    values = {"coordinator_address": coordinator_address or None,
              "num_processes": num_processes, "process_id": process_id}
    names = {flag: f"--{flag}" for flag in PROCESS_ENVIRONMENT}
    for flag, variable in PROCESS_ENVIRONMENT.items():
        raw = os.environ.get(variable, "").strip()
        if values[flag] is not None or not raw:
            continue
        names[flag] = f"${variable}"
        if flag == "coordinator_address":
            values[flag] = raw.split(",")[0].strip()  # Keras' job addresses: process 0's first.
        elif raw.lstrip("-").isdigit():
            values[flag] = int(raw)
        else:
            meaning = ("the number of processes" if flag == "num_processes" else
                       "this process's index")
            raise StrategyError(f"${variable}={raw!r}: expected an integer ({meaning})")
    _check_processes(values["coordinator_address"], values["num_processes"],
                     values["process_id"], names)
    return (values["coordinator_address"] or "", values["num_processes"],
            values["process_id"], names)


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


def _tf_config_task() -> tuple[str, int, int] | None:
    """This process's (task type, index, number of tasks) from $TF_CONFIG; None if unset
    (MultiWorkerMirroredStrategy is then one worker).

    TensorFlow's own errors for a TF_CONFIG it cannot use are tracebacks from deep inside
    the strategy (a JSON decoding error, "The `task_id` 3 exceeds the maximum id of
    worker", "Could not parse port for local server"); these are one line.

    Raises:
      StrategyError: TF_CONFIG is not JSON with a "cluster" of HOST:PORT addresses by task
        type and a "task" naming one of them.
    """
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return None
    expected = ('expected JSON {"cluster": {"worker": ["HOST:PORT", ...]}, "task": {"type": '
                f'"worker", "index": I}}}} ({files.doc_path("distributed.md")})')
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise StrategyError(f"TF_CONFIG: {expected}, found text that is not JSON ({e})"
                            ) from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not cluster:
        raise StrategyError(f"TF_CONFIG: {expected}, found no \"cluster\"")
    tasks = 0
    for kind, addresses in cluster.items():
        listed = list(addresses.values()) if isinstance(addresses, dict) else addresses
        if not isinstance(listed, list) or not all(
                isinstance(a, str) and a.rpartition(":")[2].isdigit() for a in listed):
            raise StrategyError(f"TF_CONFIG: {expected}, found cluster {kind!r}: "
                                f"{addresses!r} (every address HOST:PORT)")
        tasks += len(listed)
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise StrategyError(f"TF_CONFIG: {expected}, found no \"task\" with a type and an "
                            f"index (this process's place in the cluster): {task!r}")
    kind, index = task["type"], task["index"]
    index = int(index) if str(index).isdigit() else index
    if kind not in cluster or not isinstance(index, int) or not (
            0 <= index < len(cluster[kind])):
        raise StrategyError(f"TF_CONFIG: task {kind!r} index {index!r} is not in the cluster "
                            f"({', '.join(f'{k}: {len(v)}' for k, v in cluster.items())})")
    return str(kind), index, tasks


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
        task = _tf_config_task()
        if task is not None and task[2] > 1:
            logging.info("TF_CONFIG: this is %s:%d of %d tasks; waiting for all of them to "
                         "start (TensorFlow waits without a time limit)", *task)
        try:
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
        except (ValueError, tf.errors.OpError) as e:
            found = " ".join(str(e).split())[:300] or type(e).__name__
            raise StrategyError(f"TF_CONFIG: TensorFlow could not start this worker of the "
                                f"cluster: {found}") from None
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


def digest(*parts) -> int:
    """A CRC-32 of arrays (anything numpy takes: a model's weights, feature arrays) and of
    JSON values, in order, for `Distribution.check_same_inputs`. Arrays count by dtype,
    shape and bytes; BERT-base's weights take 0.15 s on JAX, 0.3 s on TensorFlow (a 2-core
    CPU, BUILD_NOTES 8.12)."""
    import numpy as np

    code = 0
    for part in parts:
        if hasattr(part, "shape") and hasattr(part, "dtype"):
            array = np.ascontiguousarray(keras.ops.convert_to_numpy(part))
            code = zlib.crc32(f"{array.dtype}{array.shape}".encode(), code)
            code = zlib.crc32(array.reshape(-1).view(np.uint8), code)
        else:
            code = zlib.crc32(json.dumps(part, sort_keys=True, default=str).encode(), code)
    return code & 0x7FFFFFFF


def weights_read(weights) -> tuple[int, str]:
    """(digest, description) of a model's weights, for `Distribution.check_same_inputs`."""
    code = digest(*weights)
    return code, f"{len(weights)} weight arrays, CRC {code:08x}"


def vocabulary_read(path: str, *also) -> tuple[int, str]:
    """(digest, description) of a vocabulary file (and of `also`, e.g. the tokenizer
    settings used with it), for `Distribution.check_same_inputs`."""
    text = files.read_bytes(path)
    return digest(text.decode("utf-8", "replace"), *also), f"{len(text.splitlines())} tokens"


def _traced_gather(strategy):
    """A tf.function gathering an int32 [1, n] row from every replica of `strategy` into
    [replicas, n], in replica order, traced once for rows of any length. `strategy.gather`
    called eagerly builds a new tf.function each call: from the fifth call of a run's checks
    on, every worker logged TensorFlow's retracing warning (twice: TensorFlow's logger and
    absl's)."""

    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32)])
    def gather_rows(row):
        per_replica = strategy.experimental_distribute_values_from_function(lambda _: row)
        return strategy.gather(per_replica, axis=0)

    return gather_rows


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
        self._gather_rows = None  # TensorFlow: the traced gather (`gather_from_processes`)

    @property
    def num_replicas_in_sync(self) -> int:
        """Devices each global batch is split over (every process's, on JAX)."""
        if self.strategy is not None:
            return self.strategy.num_replicas_in_sync
        if self.keras_distribution is not None:
            return len(self.keras_distribution.device_mesh.devices.flatten())
        return 1

    @property
    def num_processes(self) -> int:
        """Processes training together: JAX's joined processes (1 unless
        multi_worker_mirrored), TensorFlow's multi-worker cluster's workers (chief included),
        else 1."""
        if self.strategy is not None:
            resolver = getattr(self.strategy, "cluster_resolver", None)
            if resolver is None or not isinstance(self.strategy,
                                                  tf.distribute.MultiWorkerMirroredStrategy):
                return 1
            cluster = resolver.cluster_spec().as_dict()
            return sum(len(cluster.get(job, ())) for job in ("chief", "worker")) or 1
        if self.keras_distribution is None:
            return 1
        import jax

        return jax.process_count()

    def gather_from_processes(self, row) -> list:
        """Every process's `row` (a list of ints, as long in every process), one row per
        process in process order (TensorFlow: one per replica, in replica order): a
        collective, which every process must call. JAX's processes exchange them with
        `multihost_utils.process_allgather`, TensorFlow's workers with the strategy's
        `gather`; a single process gets [row]."""
        row = [int(v) for v in row]
        if self.num_processes == 1:
            return [row]
        import numpy as np

        if self.strategy is not None:
            if self._gather_rows is None:
                self._gather_rows = _traced_gather(self.strategy)
            return self._gather_rows(tf.constant([row], tf.int32)).numpy().tolist()
        from jax.experimental import multihost_utils

        rows = multihost_utils.process_allgather(np.asarray(row, np.int32))
        return np.asarray(rows).reshape(self.num_processes, len(row)).tolist()

    def check_same_flags(self, flags: dict) -> None:
        """Raises StrategyError, in every process, if the processes were started with other
        values of any of `flags` (flag name -> this process's value, every flag of the
        tool): a collective that every process calls once, right after the processes are
        joined.

        Processes on several hosts are started by several commands. One that differs in,
        say, --learning_rate trains its own copy of the "replicated" weights with other
        updates, silently (process 0 saves its own); one that differs in a shape stalls the
        job at its first collective. Each flag's value is hashed and the hashes exchanged
        (`gather_from_processes`), so every process stops at once with the same flags
        named. What may differ between processes is left out: the process flags and
        --output_dir (a local path). A single process returns at once.
        """
        if self.num_processes == 1:
            return
        names = sorted(set(flags) - set(PROCESS_ENVIRONMENT) - {"output_dir"})
        differing = self._differing({name: flags[name] for name in names})
        if differing:
            mine = ", ".join(f"--{name}={flags[name]!r}" for name in differing)
            raise StrategyError(
                f"the {self.num_processes} processes of this job were started with different "
                f"values of {', '.join('--' + name for name in differing)} (here, "
                f"{self.worker_name}: {mine}); start every process with the same flags, "
                "only the process flags (--process_id, or TF_CONFIG's task) and --output_dir "
                "may differ")

    def check_same_inputs(self, read) -> None:
        """Raises StrategyError, in every process, if the processes read other contents
        from the same flags: a collective that every process calls once, after each has
        read (and accepted) its own host's files.

        The same command on several hosts reads each host's copy of the files. A copy that
        differs (another version of the checkpoint, a training file with other rows) made
        the processes train on other data or other weights: silently, or stalled at a
        collective when the shapes or step counts differed. `read()` (called only when
        several processes train) gives {what was read, as the message names it (a flag:
        "--init_checkpoint"): (a digest of what this process read, see `digest`; a short
        description of it for the message)}.
        """
        if self.num_processes == 1:
            return
        inputs = read()
        differing = self._differing({name: code for name, (code, _) in inputs.items()})
        if differing:
            mine = "; ".join(f"{name}: {inputs[name][1]}" for name in differing)
            raise StrategyError(
                f"the {self.num_processes} processes of this job read other contents from "
                f"{', '.join(differing)} on their hosts (here, "
                f"{self.worker_name}: {mine}); give every host the same files")

    def _differing(self, values: dict) -> list[str]:
        """The names in `values` whose value is not the same in every process (a collective:
        each value's hash is exchanged), in sorted order."""
        names = sorted(values)
        rows = self.gather_from_processes([digest(values[name]) for name in names])
        return [name for i, name in enumerate(names) if len({r[i] for r in rows}) > 1]

    @contextlib.contextmanager
    def stop_together(self):
        """Runs the block in every process; if it raises in any, it raises in every one.

        For what one process can fail alone, before training: its own files (--output_dir's
        contents, which the chief alone checks; an --init_checkpoint missing on one host).
        A process that stopped alone left the others waiting at their next collective, and
        JAX's coordination service aborted them all from C++ five minutes later (status -6,
        a stack dump; TensorFlow's workers wait without limit). The block ends with one
        collective (`gather_from_processes`), which every process reaches whether its block
        raised or not; the block itself must hold none. This process's error is raised as
        it was; a process whose block passed raises a StrategyError that points at the
        other's output.
        """
        failure = None
        try:
            yield
        except Exception as e:  # Re-raised below, once the others know.
            failure = e
        stopped = []
        if self.num_processes > 1:
            rows = self.gather_from_processes([int(failure is not None)])
            stopped = [i for i, (bad,) in enumerate(rows) if bad]
        if failure is not None:
            raise failure
        if stopped:
            raise StrategyError(
                f"another process of this job stopped on an error before training (its "
                f"output says which); this one ({self.worker_name}) stops with it")

    @property
    def is_chief(self) -> bool:
        """True on the process that writes shared outputs (`is_chief`; JAX: process 0)."""
        if self.strategy is not None:
            return is_chief(self.strategy)
        import jax

        return jax.process_index() == 0

    @property
    def worker_name(self) -> str:
        """This worker's name among several, for its own files (a non-chief's backup):
        TensorFlow "<task type>-<task id>" from the cluster, JAX "process-<index>"."""
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if resolver is not None and resolver.task_type is not None:
            return f"{resolver.task_type}-{resolver.task_id}"
        import jax

        return f"process-{jax.process_index()}"

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
        context.num_input_pipelines on both backends. With several JAX processes, Keras'
        DataParallel (`auto_shard_dataset`, `distribute_dataset`) gives each process its
        share of every global batch, sharded by process index: the global batch of B rows
        is cut into batches of B / num_processes rows and process p keeps the p-th of each
        num_processes, so the processes together train on the global batches of one
        process, in the same order (each process reads and parses them all).
        """
        if self.strategy is not None:
            return self.strategy.distribute_datasets_from_function(dataset_fn)
        return dataset_fn(tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                                     num_replicas_in_sync=1))

    def preemption_callbacks(self, then: str) -> list:
        """[`StopOnPreemption`] where SIGTERM no longer ends a process (the class says
        why): JAX's multi_worker_mirrored (joined processes, even one) with JAX's preemption
        service on (its default), and TensorFlow's MultiWorkerMirroredStrategy; else [] (the
        process ends on SIGTERM, as Python's default has it; backups are whole files,
        written under a temporary name)."""
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return [StopOnPreemption(then, _TfPreemptionAgreement())]
        if self.keras_distribution is None:
            return []
        import jax
        from jax.experimental import multihost_utils

        # Joined (multi_worker_mirrored, even as one process): the service runs.
        if not (jax.distributed.is_initialized() and jax.config.jax_enable_preemption_service):
            return []
        return [StopOnPreemption(then, multihost_utils.reached_preemption_sync_point)]

    @property
    def places_variables(self) -> bool:
        """Whether variables made under `scope()` are the distribution's own (replicated
        or sharded): every strategy but "default", whose variables are made as outside."""
        return self.name != "default"

    def on_one_device(self, model):
        """`model` as one process can run it alone, for evaluation and prediction.

        Under a JAX DataParallel the variables live on every device of the mesh, every
        process's on multi_worker_mirrored, so each step would need all processes: this
        returns a copy made outside any distribution, with the trained weights, on the
        default device. TensorFlow's strategies and "default": `model` itself.
        """
        if self.keras_distribution is None:
            return model
        assert keras.distribution.distribution() is None, "call outside scope()"
        copy = type(model).from_config(model.get_config())
        copy.set_weights(model.get_weights())
        return copy

    def __repr__(self):
        kind = type(self.strategy or self.keras_distribution).__name__ if (
            self.strategy or self.keras_distribution) else "one device"
        processes = f" over {self.num_processes} processes" if self.num_processes > 1 else ""
        return f"{self.name} ({kind}) with {self.num_replicas_in_sync} replica(s){processes}"


def get_distribution(name: str = "default", tpu: str = "", *, coordinator_address: str = "",
                     num_processes: int | None = None,
                     process_id: int | None = None) -> Distribution:
    """The `Distribution` for a --distribution_strategy value on Keras' backend.

    TensorFlow: `get_strategy(name, tpu)`. JAX: `JAX_STRATEGIES` (module docstring); for
    multi_worker_mirrored this joins the job's processes first (`keras.distribution.
    initialize`), which must happen before JAX computes anything in this process.

    Args:
      name: one of `STRATEGIES`.
      tpu: for "tpu" on TensorFlow: "" or "local" (TPU VM) or "grpc://host:port".
      coordinator_address, num_processes, process_id: for multi_worker_mirrored on JAX:
        HOST:PORT of process 0, the number of processes, this process's index; "" / None
        for Keras' environment variables (`PROCESS_ENVIRONMENT`) or JAX's cluster detection.

    Raises:
      StrategyError: an unknown name; on TensorFlow no TPU for "tpu", or JAX's process flags;
        on JAX "tpu", process flags without multi_worker_mirrored, or processes that cannot
        be joined (one line naming the flag, what was expected and what was found).
    """
    backend = keras.backend.backend()
    process_flags = [f"--{k}" for k, v in (("coordinator_address", coordinator_address),
                                          ("num_processes", num_processes),
                                          ("process_id", process_id)) if v not in ("", None)]
    if backend == "tensorflow":
        if process_flags:
            raise StrategyError(
                f"{', '.join(process_flags)}: JAX's (KERAS_BACKEND=jax with "
                "--distribution_strategy=multi_worker_mirrored); on TensorFlow "
                "multi_worker_mirrored reads the cluster from TF_CONFIG")
        strategy = get_strategy(name, tpu)
        if name == "multi_worker_mirrored":
            _local_saving()  # After the strategy: TensorFlow configures collectives first.
        return Distribution(name, strategy=strategy)
    if name not in STRATEGIES:
        raise StrategyError(f"unknown distribution_strategy {name!r}; expected one of "
                            f"{JAX_STRATEGIES} on KERAS_BACKEND={backend}")
    if name not in JAX_STRATEGIES:
        raise StrategyError(
            f"--distribution_strategy: expected default, mirrored or multi_worker_mirrored on "
            f"KERAS_BACKEND={backend} (keras.distribution.DataParallel over the local devices, "
            f"or over several processes': a TPU VM's cores are mirrored, a pod slice's "
            f"multi_worker_mirrored), found {name} (a tf.distribute strategy: run with "
            "KERAS_BACKEND=tensorflow)")
    if process_flags and name != "multi_worker_mirrored":
        raise StrategyError(f"{', '.join(process_flags)}: for processes joined by "
                            "--distribution_strategy=multi_worker_mirrored, found "
                            f"--distribution_strategy={name}")
    if name == "default":
        return Distribution(name)
    if name == "multi_worker_mirrored":
        _join_processes(coordinator_address, num_processes, process_id)
        _local_saving()
    devices = keras.distribution.list_devices()  # Every process's, once they are joined.
    return Distribution(name, keras_distribution=keras.distribution.DataParallel(devices=devices))


# JAX waits 300 s (jax.distributed.initialize's initialization_timeout, which
# keras.distribution.initialize leaves at its default) for every process to join, then
# aborts the process from C++ with a stack trace; the watchdog below speaks first.
JOIN_TIMEOUT_S = 290


def _reachable(address: str, timeout: float = 3.0) -> bool:
    """Whether something accepts TCP connections at HOST:PORT."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


def _check_port_free(coordinator_address: str, name: str = "--coordinator_address") -> None:
    """Raises StrategyError if process 0 cannot listen on the coordinator's port.

    JAX's coordination service binds [::]:PORT; on a port another program listens on, the
    process dies of a segmentation fault (jax 0.10.2). The probe binds as gRPC does
    (SO_REUSEADDR: a port left in TIME_WAIT by an earlier job is free) and lets go.
    """
    import errno
    import socket

    port = int(coordinator_address.rpartition(":")[2])
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # No IPv6 on this host: JAX's bind falls back the same way.
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
            return
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                continue  # IPv6 switched off, say: try IPv4, as JAX's bind would.
            raise StrategyError(
                f"{name}={coordinator_address}: process 0 serves the job on "
                f"port {port} of this host, and cannot listen there ({e.strerror or e}): "
                "another program (an earlier job?) holds it; choose another port for every "
                "process") from None
        finally:
            probe.close()


def _join_watchdog(address: str, num_processes, process_id, timeout_s: float):
    """Starts a thread that ends this process with one line if the join takes `timeout_s`.

    A job whose processes do not all join (a wrong --coordinator_address or
    --num_processes, a host that never started) leaves jax.distributed.initialize waiting
    in C++, which then aborts with a stack trace; Python cannot interrupt that call. The
    thread writes the tools' one-line error (`error: ...`, as data_prep.cli.report_errors
    does) and exits with status 1 before JAX's own timeout. Nothing is written before the
    processes join, so there is nothing to clean up.

    Args:
      address, num_processes, process_id: as `_resolve_processes` returns them.
      timeout_s: seconds to wait.

    Returns:
      A threading.Event to set once joined (the thread then ends).
    """
    import sys
    import threading

    joined = threading.Event()
    count = f"the {num_processes} processes" if num_processes else "the processes"

    def watch():
        if joined.wait(timeout_s):
            return
        where = address or "the address JAX found"
        this = f"this is process {process_id}" if process_id is not None else "this process"
        if process_id == 0:
            found = f"{this}, the coordinator, at {where}; not every other process registered"
        elif address and not _reachable(address):
            found = (f"{this}; nothing answers at {address} (process 0 not started, another "
                     "address, or a firewall)")
        else:
            found = f"{this}; process 0 answers at {where} but not every process registered"
        sys.stderr.write(
            f"error: --distribution_strategy=multi_worker_mirrored: {count} of this job did "
            f"not all join within {timeout_s:.0f} s ({found}); start every process with the "
            "same --coordinator_address (HOST:PORT of process 0, reachable from every host) "
            "and --num_processes, each with its own --process_id\n")
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=watch, name="join-watchdog", daemon=True).start()
    return joined


def _join_processes(coordinator_address: str, num_processes, process_id,
                    timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """`keras.distribution.initialize` (jax.distributed.initialize), once per process.

    Raises:
      StrategyError: bad process flags, no coordinator address given or found, or JAX could
        not join (already computing); one line. Processes that do not all join within
        `timeout_s` end this process with one line and status 1 (`_join_watchdog`).
    """
    import jax

    address, count, me, names = _resolve_processes(coordinator_address, num_processes,
                                                   process_id)
    if jax.distributed.is_initialized():
        return  # Joined by an earlier run in this process (a script, a notebook).
    if me == 0 and address and not os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
        _check_port_free(address, names["coordinator_address"])
    joined = _join_watchdog(address, count, me, timeout_s)
    try:
        keras.distribution.initialize(coordinator_address or None, num_processes, process_id)
    except (ValueError, RuntimeError) as e:
        found = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not address:
            raise StrategyError(
                "--coordinator_address: expected HOST:PORT of process 0 for "
                "--distribution_strategy=multi_worker_mirrored on JAX (or "
                f"${PROCESS_ENVIRONMENT['coordinator_address']}), found none, and JAX found "
                f"no cluster (Cloud TPU, SLURM) to take it from: {found}") from None
        raise StrategyError(f"--distribution_strategy=multi_worker_mirrored: JAX could not "
                            f"join the processes: {found}") from None
    finally:
        joined.set()
    logging.info("JAX process %d of %d: %d local device(s), %d in all", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())


def _local_saving() -> None:
    """Makes Keras' saving local to each process when several processes train together.

    Keras' saving lists the attributes to skip per object type from a reference object
    (`saving_lib.get_attr_skipset`); an optimizer's makes two variables, and made under a
    multi-process DataParallel each is a collective (jax.device_put compares the value across
    processes), under TensorFlow's multi-worker strategy too (each variable's initial value
    is broadcast from the chief). Keras 3.15.1 means to make each list once per process, but
    stores it under "saving_attr_skipset_<type>" and looks for "saving_attr_skiplist_<type>",
    so it makes it at every save: a save that process 0 alone makes (a checkpoint) was a
    collective the others never joined, and failed (JAX: "passed to device_put is not the
    same on each process"; TensorFlow: "Collective instance ... expected type 0 ... but got
    type 1" in the next backup). The list is made here, outside any distribution's scope,
    and stored under both names, so that every later save (and load) only reads the
    variables.
    """
    from keras.src.backend.common import global_state
    from keras.src.saving import saving_lib

    skipset = saving_lib.get_attr_skipset("Optimizer")
    global_state.set_global_attribute("saving_attr_skiplist_Optimizer", skipset)
