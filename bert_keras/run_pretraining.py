r"""Pretrains BERT (masked LM + next sentence) with Keras `fit` on any tf.distribute strategy.

    python -m bert_keras.run_pretraining \
      --input_file='data/train-*.tfrecord' --eval_input_file=data/heldout.tfrecord \
      --preset=mini --vocab_file=vocab.txt --output_dir=runs/phase1 \
      --max_seq_length=128 --max_predictions_per_seq=20 --train_batch_size=32 \
      --num_train_steps=10000 --num_warmup_steps=1000 --learning_rate=1e-4 \
      --save_checkpoints_steps=1000

Flag names follow Google's run_pretraining.py. Phase 2 (sequence length 512) is a new run
with `--init_checkpoint=runs/phase1` (its weights, not its optimizer state) and the phase-2
data's lengths.

Layout of --output_dir:
    run_config.json           the flags that define the run; a rerun must match them
    bert_config.json          the model config
    logs/                     TensorBoard (train/ and validation/)
    history.csv               train and held-out metrics after every checkpoint interval
    backup/                   Keras BackupAndRestore state: weights + optimizer, every
                              save_checkpoints_steps (removed when the run completes)
    checkpoints/              ckpt-<step>.weights.h5: periodic checkpoints (weights + optimizer),
                              the last --keep_checkpoint_max of them
    pretrainer.weights.h5     final pretrainer weights (encoder + heads, no optimizer state)
    encoder/                  what fine-tuning and export load:
        encoder.weights.h5    BertEncoder weights
        bert_config.json      its config
        vocab.txt             copied from --vocab_file (if given)
    eval_results.json         final held-out metrics (if --eval_input_file)

Resumption: rerunning the same command after a crash (even kill -9) resumes from the last
backup. Epochs are checkpoint intervals (`save_checkpoints_steps` optimizer steps), so the
backup is always at an epoch boundary; the number of finished steps is read from the
restored optimizer, and the input pipeline (deterministic for a given --seed) skips exactly
the batches those steps consumed. Nothing is repeated or skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

from absl import app, flags, logging

# The flags are defined at import; TensorFlow is imported lazily in `train`. Names are
# Google's, shared with other tools (input_file, vocab_file, max_seq_length, ...):
# allow_override lets several tools be imported into one process (a test session) without
# absl's DuplicateFlagError; each process still runs one tool.
_SHARED = {"allow_override": True}
_INPUT_FILE = flags.DEFINE_string(
    "input_file", None, "Training TFRecords: comma-separated files or globs.",
    **_SHARED)
_EVAL_INPUT_FILE = flags.DEFINE_string(
    "eval_input_file", None, "Held-out TFRecords evaluated after every checkpoint interval.",
    **_SHARED)
_BERT_CONFIG_FILE = flags.DEFINE_string(
    "bert_config_file", None, "bert_config.json of the model (or use --preset).", **_SHARED)
_PRESET = flags.DEFINE_string(
    "preset", None, "Model size instead of --bert_config_file: tiny, mini, small, medium, "
    "base, large (vocab_size from --vocab_file if given).", **_SHARED)
_VOCAB_FILE = flags.DEFINE_string(
    "vocab_file", None, "WordPiece vocab; copied into output_dir/encoder/ for fine-tuning.",
    **_SHARED)
_INIT_CHECKPOINT = flags.DEFINE_string(
    "init_checkpoint", None, "Initial weights: a run's output_dir, an encoder/ dir, a "
    ".weights.h5 file (pretrainer or encoder), a .keras file, a Hugging Face BERT dir or a "
    "Google checkpoint (bert_model.ckpt; its MLM/NSP heads are used too). Ignored when "
    "resuming.", **_SHARED)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where checkpoints, logs and the final weights go.",
    **_SHARED)
_MAX_SEQ_LENGTH = flags.DEFINE_integer(
    "max_seq_length", 128, "Sequence length the data was written with.", **_SHARED)
_MAX_PREDICTIONS = flags.DEFINE_integer(
    "max_predictions_per_seq", 20, "Masked positions per sequence the data was written with.",
    **_SHARED)
_TRAIN_BATCH_SIZE = flags.DEFINE_integer(
    "train_batch_size", 32, "Global batch size of one micro-batch (all replicas together).",
    **_SHARED)
_EVAL_BATCH_SIZE = flags.DEFINE_integer("eval_batch_size", 8, "Global evaluation batch size.",
    **_SHARED)
_NUM_TRAIN_STEPS = flags.DEFINE_integer(
    "num_train_steps", 100000, "Optimizer updates in total.", **_SHARED)
_NUM_WARMUP_STEPS = flags.DEFINE_integer(
    "num_warmup_steps", 10000, "Updates of linear learning-rate warmup.", **_SHARED)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 1e-4, "Peak learning rate.", **_SHARED)
_OPTIMIZER = flags.DEFINE_enum("optimizer", "adamw", ["adamw", "lamb"], "Optimizer.", **_SHARED)
_WEIGHT_DECAY = flags.DEFINE_float(
    "weight_decay", 0.01, "Decoupled weight decay (not on LayerNorm and biases).", **_SHARED)
_SAVE_CHECKPOINTS_STEPS = flags.DEFINE_integer(
    "save_checkpoints_steps", 1000, "Updates between checkpoints (and evaluations); must "
    "divide num_train_steps.", **_SHARED)
_KEEP_CHECKPOINT_MAX = flags.DEFINE_integer(
    "keep_checkpoint_max", 3, "Periodic checkpoints kept in output_dir/checkpoints.", **_SHARED)
_STEPS_PER_EXECUTION = flags.DEFINE_integer(
    "steps_per_execution", 1, "Micro-batches run per tf.function call (fewer host round trips).",
    **_SHARED)
_GRADIENT_ACCUMULATION_STEPS = flags.DEFINE_integer(
    "gradient_accumulation_steps", 1, "Micro-batches averaged into one update.", **_SHARED)
_DISTRIBUTION_STRATEGY = flags.DEFINE_enum(
    "distribution_strategy", "default", ["default", "mirrored", "multi_worker_mirrored", "tpu"],
    "tf.distribute strategy (multi_worker_mirrored reads the cluster from TF_CONFIG).", **_SHARED)
_TPU = flags.DEFINE_string(
    "tpu", "", "For --distribution_strategy=tpu: empty/'local' on a TPU VM, or grpc://host:port.",
    **_SHARED)
_NUM_CPU_DEVICES = flags.DEFINE_integer(
    "num_cpu_devices", 1, "Split the CPU into this many logical devices (mirrored on CPU).",
    **_SHARED)
_MIXED_PRECISION = flags.DEFINE_enum(
    "mixed_precision", "float32", ["float32", "mixed_bfloat16", "mixed_float16"],
    "Keras dtype policy.", **_SHARED)
_JIT_COMPILE = flags.DEFINE_bool("jit_compile", False, "Compile the train step with XLA.",
    **_SHARED)
_MAX_EVAL_STEPS = flags.DEFINE_integer(
    "max_eval_steps", 100, "Evaluation batches per evaluation (the eval files are cycled).",
    **_SHARED)
_SEED = flags.DEFINE_integer("seed", 12345, "Seed for initialization, dropout and data order.",
    **_SHARED)
_DETERMINISTIC = flags.DEFINE_bool(
    "deterministic", False, "Enable TF op determinism (bit-reproducible runs; slower).", **_SHARED)
_LOG_STEPS = flags.DEFINE_integer("log_steps", 100, "Micro-batches between TensorBoard points.",
    **_SHARED)


class PretrainingError(ValueError):
    """A problem with the flags, the data or output_dir; the message is meant for users."""


@dataclasses.dataclass(frozen=True)
class PretrainingOptions:
    """Everything a pretraining run needs (one field per flag; see the flag help)."""

    input_file: str
    output_dir: str
    bert_config_file: str | None = None
    preset: str | None = None
    vocab_file: str | None = None
    init_checkpoint: str | None = None
    eval_input_file: str | None = None
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    train_batch_size: int = 32
    eval_batch_size: int = 8
    num_train_steps: int = 100000
    num_warmup_steps: int = 10000
    learning_rate: float = 1e-4
    optimizer: str = "adamw"
    weight_decay: float = 0.01
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 3
    steps_per_execution: int = 1
    gradient_accumulation_steps: int = 1
    distribution_strategy: str = "default"
    tpu: str = ""
    num_cpu_devices: int = 1
    mixed_precision: str = "float32"
    jit_compile: bool = False
    max_eval_steps: int = 100
    seed: int = 12345
    deterministic: bool = False
    log_steps: int = 100
    verbose: int | str = "auto"  # Keras progress: "auto" = bar on a terminal, lines otherwise.
    autotune: bool = True  # tf.data autotuning (tests turn it off; DESIGN.md s9).

    # Fields that may differ between the first run and a resumed one.
    _RESUMABLE_CHANGES = ("verbose", "autotune", "log_steps", "keep_checkpoint_max",
                          "max_eval_steps", "eval_batch_size", "eval_input_file")

    def run_identity(self) -> dict:
        """The fields a resumed run must share with the interrupted one."""
        values = dataclasses.asdict(self)
        return {k: v for k, v in values.items() if k not in self._RESUMABLE_CHANGES}

    def validate(self) -> None:
        """Raises PretrainingError for inconsistent values (before anything is built)."""
        if (self.bert_config_file is None) == (self.preset is None):
            raise PretrainingError("give exactly one of --bert_config_file and --preset")
        positive = ("max_seq_length", "max_predictions_per_seq", "train_batch_size",
                    "eval_batch_size", "num_train_steps", "save_checkpoints_steps",
                    "steps_per_execution", "gradient_accumulation_steps", "keep_checkpoint_max",
                    "max_eval_steps", "num_cpu_devices", "log_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise PretrainingError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.num_warmup_steps <= self.num_train_steps:
            raise PretrainingError(
                f"--num_warmup_steps={self.num_warmup_steps} must be in [0, "
                f"num_train_steps={self.num_train_steps}]")
        if self.num_train_steps % self.save_checkpoints_steps:
            raise PretrainingError(
                f"--save_checkpoints_steps={self.save_checkpoints_steps} must divide "
                f"--num_train_steps={self.num_train_steps} (checkpoints mark the epochs a "
                "resumed run restarts from)")
        micro_per_checkpoint = self.save_checkpoints_steps * self.gradient_accumulation_steps
        if micro_per_checkpoint % self.steps_per_execution:
            raise PretrainingError(
                f"--steps_per_execution={self.steps_per_execution} must divide the "
                f"{micro_per_checkpoint} micro-batches between checkpoints "
                "(save_checkpoints_steps * gradient_accumulation_steps)")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise PretrainingError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} exceeds "
                f"--max_seq_length={self.max_seq_length}")


def check_replicas(options: PretrainingOptions, num_replicas: int) -> None:
    """Raises PretrainingError for settings Keras 3.15.1 cannot run on `num_replicas`.

    Both limits below are Keras bugs seen here with MirroredStrategy on 2 logical CPUs;
    TPUs are not checked (no TPU to test on).
    """
    for name in ("train_batch_size", "eval_batch_size"):
        if getattr(options, name) % num_replicas:
            raise PretrainingError(f"--{name}={getattr(options, name)} is not divisible by "
                                   f"the {num_replicas} replicas")
    if options.gradient_accumulation_steps > 1 and num_replicas > 1:
        # Keras 3.15.1 applies an accumulated update inside a cond; tf.distribute cannot
        # synchronize replicas (merge_call) inside control flow, so fit fails while tracing.
        raise PretrainingError(
            f"--gradient_accumulation_steps={options.gradient_accumulation_steps} works with "
            f"one replica only in Keras 3.15.1 (here: {num_replicas}); raise "
            "--train_batch_size instead, the replicas already multiply the batch")
    if (options.steps_per_execution > 1 and num_replicas > 1
            and options.distribution_strategy != "tpu"):
        # The multi-step loop (tf.while_loop + tf.cond over get_next_as_optional) fails with
        # "You must feed a value for placeholder tensor" under MirroredStrategy:
        # https://github.com/keras-team/keras/issues/19246
        raise PretrainingError(
            f"--steps_per_execution={options.steps_per_execution} fails with "
            f"{num_replicas} replicas in Keras 3.15.1 (keras-team/keras#19246); use 1")


# ---------------------------------------------------------------------------------------
# Model, weights and output directory


def load_bert_config(options: PretrainingOptions):
    """The BertConfig from --bert_config_file, or from --preset (+ vocab size of --vocab_file)."""
    from bert_keras.config import BertConfig

    if options.bert_config_file:
        return BertConfig.from_json_file(options.bert_config_file)
    overrides = {}
    if options.vocab_file:
        overrides["vocab_size"] = _count_vocab(options.vocab_file)
    return BertConfig.from_preset(options.preset, **overrides)


def _count_vocab(path: str) -> int:
    if not os.path.isfile(path):
        raise PretrainingError(f"--vocab_file {path} does not exist")
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _check_vocab_fits(options, config) -> None:
    if options.vocab_file and options.bert_config_file:
        size = _count_vocab(options.vocab_file)
        if size != config.vocab_size:
            raise PretrainingError(
                f"--vocab_file {options.vocab_file} has {size} tokens but "
                f"{options.bert_config_file} says vocab_size={config.vocab_size}")
    if options.max_seq_length > config.max_position_embeddings:
        raise PretrainingError(
            f"--max_seq_length={options.max_seq_length} exceeds the model's "
            f"max_position_embeddings={config.max_position_embeddings}")


def load_initial_weights(pretrainer, path: str) -> str:
    """Loads --init_checkpoint into `pretrainer` (weights only); returns what was loaded.

    A run's output_dir (pretrainer.weights.h5: heads included) and `.weights.h5` files of a
    pretrainer or an encoder load directly; every other form `bert_keras.model_loading`
    resolves (our encoder/ directory, a `.keras` file, a Hugging Face directory, a Google
    TF1 checkpoint such as bert_model.ckpt) is loaded by it and copied in: the whole
    pretrainer when the checkpoint has pretraining heads, else the encoder.
    """
    from bert_keras import model_loading
    from bert_keras.pretrainer import BertPretrainer

    run_state = os.path.join(path, "pretrainer.weights.h5")
    if os.path.isdir(path) and os.path.isfile(run_state):
        pretrainer.load_weights(run_state)
        return run_state
    if path.endswith(".weights.h5"):
        if not os.path.isfile(path):
            raise PretrainingError(f"--init_checkpoint {path}: no such file")
        errors = []
        for target in (pretrainer, pretrainer.encoder):
            try:
                target.load_weights(path)
                return path
            except ValueError as e:  # Keras: the file's layers do not match this model.
                errors.append(str(e).splitlines()[0])
        raise PretrainingError(f"--init_checkpoint {path} fits neither the pretrainer nor "
                               f"its encoder: {errors[-1]}")
    try:
        loaded = model_loading.load_model(path)
    except (FileNotFoundError, ValueError) as e:
        raise PretrainingError(f"--init_checkpoint {path}: {e}") from None
    if isinstance(loaded, BertPretrainer):
        _copy_weights(loaded, pretrainer, path)
        return f"{path} (encoder and pretraining heads)"
    _copy_weights(loaded, pretrainer.encoder, path)
    return f"{path} (encoder only)"


def _copy_weights(source, target, path: str) -> None:
    want = [w.shape for w in target.weights]
    got = [w.shape for w in source.weights]
    if want != got:
        raise PretrainingError(
            f"--init_checkpoint {path}: its {type(source).__name__} does not match this run's "
            f"model ({len(got)} vs {len(want)} weights; compare the bert_config.json files)")
    target.set_weights(source.get_weights())


def prepare_output_dir(options: PretrainingOptions, chief: bool) -> bool:
    """Checks --output_dir and records the run; returns True if resuming.

    A new run needs an empty or missing directory. A directory holding `run_config.json`
    is a previous run of the same command (resumed) and must have matching flags. A
    finished run (encoder/ present) is never touched again.

    Raises:
      PretrainingError: output_dir holds a finished run, another run, or unrelated files.
    """
    out = options.output_dir
    record = os.path.join(out, "run_config.json")
    if os.path.isdir(os.path.join(out, "encoder")):
        raise PretrainingError(f"--output_dir {out} holds a finished run (encoder/ exists); "
                               "choose a new output_dir")
    if os.path.isfile(record):
        with open(record, encoding="utf-8") as f:
            previous = json.load(f)
        current = json.loads(json.dumps(options.run_identity()))
        changed = sorted(k for k in set(previous) | set(current)
                         if previous.get(k) != current.get(k))
        if changed:
            details = ", ".join(f"{k}: {previous.get(k)!r} -> {current.get(k)!r}" for k in changed)
            raise PretrainingError(f"--output_dir {out} holds a run with other flags ({details}); "
                                   "rerun it with its own flags or choose a new output_dir")
        return True
    if not chief:
        return False  # The chief checks and writes; workers only read.
    if os.path.isdir(out) and os.listdir(out):
        raise PretrainingError(f"--output_dir {out} exists and is not a pretraining run; "
                               "choose a new or empty output_dir")
    os.makedirs(out, exist_ok=True)
    _write_json_atomic(record, options.run_identity())
    return False


def _write_json_atomic(path: str, values: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(values, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def save_final_outputs(pretrainer, options: PretrainingOptions) -> str:
    """Writes pretrainer.weights.h5 and encoder/ (weights, bert_config.json, vocab.txt).

    encoder/ is assembled under a temporary name and renamed when complete.
    """
    out = options.output_dir
    tmp_weights = os.path.join(out, "pretrainer.tmp.weights.h5")
    # A fresh, uncompiled copy holds no optimizer state: the final file is weights only.
    clean = type(pretrainer).from_config(pretrainer.get_config())
    clean.set_weights(pretrainer.get_weights())
    clean.save_weights(tmp_weights)
    os.replace(tmp_weights, os.path.join(out, "pretrainer.weights.h5"))

    final = os.path.join(out, "encoder")
    tmp = os.path.join(out, ".encoder.incomplete")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    clean.encoder.save_weights(os.path.join(tmp, "encoder.weights.h5"))
    clean.encoder.to_bert_config().to_json_file(os.path.join(tmp, "bert_config.json"))
    if options.vocab_file:
        shutil.copyfile(options.vocab_file, os.path.join(tmp, "vocab.txt"))
    os.replace(tmp, final)
    return final


# ---------------------------------------------------------------------------------------
# Callbacks


def _updates_done(model) -> int:
    """Optimizer updates so far (works for mirrored variables, which int() rejects)."""
    import keras

    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def _callbacks(options, chief, backup_dir, num_train_steps):
    import keras

    class PeriodicCheckpoint(keras.callbacks.Callback):
        """Saves checkpoints/ckpt-<step>.weights.h5 every epoch (= save_checkpoints_steps),
        keeping the newest `keep`. (ModelCheckpoint names files by epoch and keeps all.)"""

        def __init__(self, directory, keep):
            super().__init__()
            self.directory, self.keep = directory, keep

        def on_epoch_end(self, epoch, logs=None):
            os.makedirs(self.directory, exist_ok=True)
            step = _updates_done(self.model)
            tmp = os.path.join(self.directory, f"tmp-{step}.weights.h5")
            self.model.save_weights(tmp)
            os.replace(tmp, os.path.join(self.directory, f"ckpt-{step:08d}.weights.h5"))
            kept = sorted(n for n in os.listdir(self.directory) if n.startswith("ckpt-"))
            for name in kept[: -self.keep]:
                os.remove(os.path.join(self.directory, name))

    class StopAtStep(keras.callbacks.Callback):
        """Ends training at exactly num_train_steps updates, whatever epoch Keras resumed at
        (BackupAndRestore writes weights and its epoch counter in two steps; a kill between
        them leaves the counter one epoch behind the weights, which hold the true step)."""

        def on_epoch_end(self, epoch, logs=None):
            if _updates_done(self.model) >= num_train_steps:
                self.model.stop_training = True

    backup = keras.callbacks.BackupAndRestore(
        backup_dir, save_freq="epoch", double_checkpoint=True, delete_checkpoint=False)
    callbacks = [backup, StopAtStep()]
    if chief:
        callbacks.append(PeriodicCheckpoint(os.path.join(options.output_dir, "checkpoints"),
                                            options.keep_checkpoint_max))
        callbacks.append(keras.callbacks.TensorBoard(
            log_dir=os.path.join(options.output_dir, "logs"), update_freq=options.log_steps))
        # One row per checkpoint interval (epoch e ends at update (e + 1) * save_steps);
        # appended to on resumption.
        callbacks.append(keras.callbacks.CSVLogger(
            os.path.join(options.output_dir, "history.csv"), append=True))
    return backup, callbacks


# ---------------------------------------------------------------------------------------
# Training


def train(options: PretrainingOptions, extra_callbacks=()) -> dict:
    """Runs (or resumes) pretraining; returns the last epoch's logs (train and validation).

    Args:
      options: the run's settings.
      extra_callbacks: Keras callbacks appended after the built-in ones (tests use one to
        simulate a crash after a backup was written).

    Raises:
      PretrainingError (a ValueError) or distribute.StrategyError: bad flags, data or
        output_dir, with a one-line explanation.
    """
    options.validate()
    import keras
    import tensorflow as tf

    from bert_keras import distribute, multi_worker_fix
    from bert_keras.inputs import pretraining_dataset
    from bert_keras.losses import pretraining_losses_and_metrics
    from bert_keras.optimization import create_optimizer
    from bert_keras.pretrainer import BertPretrainer

    try:
        config = load_bert_config(options)
    except ValueError as e:  # BertConfig names the file and the field.
        raise PretrainingError(str(e)) from None
    _check_vocab_fits(options, config)
    if options.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(options.seed)
    keras.mixed_precision.set_global_policy(options.mixed_precision)
    distribute.configure_cpu_devices(options.num_cpu_devices)
    strategy = distribute.get_strategy(options.distribution_strategy, options.tpu)
    chief = distribute.is_chief(strategy)
    logging.info("Strategy %s (%s) with %d replica(s)", options.distribution_strategy,
                 type(strategy).__name__, strategy.num_replicas_in_sync)
    check_replicas(options, strategy.num_replicas_in_sync)
    resuming = prepare_output_dir(options, chief)
    if chief:
        os.makedirs(options.output_dir, exist_ok=True)
        path = os.path.join(options.output_dir, "bert_config.json")
        if not os.path.exists(path):
            config.to_json_file(path)
        backup_dir = os.path.join(options.output_dir, "backup")
    else:
        # Each non-chief worker keeps its own (identical) backup: two processes writing one
        # file would corrupt it.
        worker_dir = os.path.join(options.output_dir, "workers",
                                  f"{strategy.cluster_resolver.task_type}-"
                                  f"{strategy.cluster_resolver.task_id}")
        backup_dir = os.path.join(worker_dir, "backup")

    accumulation = options.gradient_accumulation_steps
    steps_per_epoch = options.save_checkpoints_steps * accumulation  # micro-batches
    epochs = options.num_train_steps // options.save_checkpoints_steps

    with strategy.scope():
        pretrainer = BertPretrainer.from_bert_config(config)
        pretrainer.compile(
            optimizer=create_optimizer(
                options.learning_rate, options.num_train_steps, options.num_warmup_steps,
                optimizer=options.optimizer, weight_decay=options.weight_decay,
                gradient_accumulation_steps=accumulation),
            steps_per_execution=options.steps_per_execution,
            jit_compile=options.jit_compile,
            **pretraining_losses_and_metrics(),
        )
        multi_worker_fix.apply(pretrainer)
        backup, callbacks = _callbacks(options, chief, backup_dir, options.num_train_steps)
        # Restore now (fit would do it too, later) to know how many steps are done before
        # the input pipeline is built. The optimizer's step counter is saved in the same
        # file as the weights, so it is the source of truth.
        backup.set_model(pretrainer)
        backup.on_train_begin()
    done_steps = _updates_done(pretrainer)
    if done_steps:
        logging.info("Resuming from %s at step %d of %d", backup_dir, done_steps,
                     options.num_train_steps)
    elif options.init_checkpoint:
        logging.info("Initialized from %s",
                     load_initial_weights(pretrainer, options.init_checkpoint))
    elif resuming:
        logging.info("No backup in %s yet: starting from step 0", backup_dir)
    if done_steps % options.save_checkpoints_steps:
        raise PretrainingError(f"backup in {backup_dir} is at step {done_steps}, not at a "
                               f"multiple of save_checkpoints_steps")

    def train_input(context):
        per_replica = context.get_per_replica_batch_size(options.train_batch_size)
        replicas_per_pipeline = strategy.num_replicas_in_sync // context.num_input_pipelines
        return pretraining_dataset(
            options.input_file, per_replica, options.max_seq_length,
            options.max_predictions_per_seq, is_training=True, seed=options.seed,
            input_context=context, autotune=options.autotune,
            skip_batches=done_steps * accumulation * replicas_per_pipeline)

    def eval_input(context):
        per_replica = context.get_per_replica_batch_size(options.eval_batch_size)
        # Repeated, so every worker runs exactly max_eval_steps (uneven shards would hang
        # the collectives of a multi-worker evaluation).
        return pretraining_dataset(
            options.eval_input_file, per_replica, options.max_seq_length,
            options.max_predictions_per_seq, is_training=False, repeat=True,
            input_context=context, autotune=options.autotune)

    # Building the pipelines checks the data (sidecars, shapes) before anything slow runs.
    try:
        train_data = strategy.distribute_datasets_from_function(train_input)
        eval_data = None
        if options.eval_input_file:
            eval_data = strategy.distribute_datasets_from_function(eval_input)
    except ValueError as e:  # data_prep.features and inputs name the file and the lengths.
        raise PretrainingError(str(e)) from None

    logs = {}
    initial_epoch = done_steps // options.save_checkpoints_steps
    if initial_epoch < epochs:
        history = pretrainer.fit(
            train_data,
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            shuffle=False,  # The pipeline shuffles (deterministically, for resumption).
            validation_data=eval_data,
            validation_steps=options.max_eval_steps if eval_data is not None else None,
            callbacks=callbacks + list(extra_callbacks),
            verbose=options.verbose if options.verbose != "auto" else (
                1 if sys.stdout.isatty() else 2),
        )
        logs = {k: v[-1] for k, v in history.history.items()}
    if _updates_done(pretrainer) != options.num_train_steps:
        raise RuntimeError(f"training ended at step {_updates_done(pretrainer)}, "
                           f"expected {options.num_train_steps}")
    if chief:
        if eval_data is not None:
            results = pretrainer.evaluate(eval_data, steps=options.max_eval_steps,
                                          return_dict=True, verbose=0)
            results["global_step"] = options.num_train_steps
            _write_json_atomic(os.path.join(options.output_dir, "eval_results.json"), results)
            logs.update({f"final_val_{k}": v for k, v in results.items()})
        final = save_final_outputs(pretrainer, options)
        logging.info("Encoder for fine-tuning and export: %s", final)
    elif eval_data is not None:
        pretrainer.evaluate(eval_data, steps=options.max_eval_steps, verbose=0)  # Collectives.
    shutil.rmtree(backup_dir if chief else worker_dir, ignore_errors=True)
    if not chief:
        try:
            os.rmdir(os.path.dirname(worker_dir))  # workers/, once the last worker is done.
        except OSError:
            pass
    return logs


def _options_from_flags() -> PretrainingOptions:
    return PretrainingOptions(
        input_file=_INPUT_FILE.value, output_dir=_OUTPUT_DIR.value,
        bert_config_file=_BERT_CONFIG_FILE.value, preset=_PRESET.value,
        vocab_file=_VOCAB_FILE.value, init_checkpoint=_INIT_CHECKPOINT.value,
        eval_input_file=_EVAL_INPUT_FILE.value, max_seq_length=_MAX_SEQ_LENGTH.value,
        max_predictions_per_seq=_MAX_PREDICTIONS.value,
        train_batch_size=_TRAIN_BATCH_SIZE.value, eval_batch_size=_EVAL_BATCH_SIZE.value,
        num_train_steps=_NUM_TRAIN_STEPS.value, num_warmup_steps=_NUM_WARMUP_STEPS.value,
        learning_rate=_LEARNING_RATE.value, optimizer=_OPTIMIZER.value,
        weight_decay=_WEIGHT_DECAY.value, save_checkpoints_steps=_SAVE_CHECKPOINTS_STEPS.value,
        keep_checkpoint_max=_KEEP_CHECKPOINT_MAX.value,
        steps_per_execution=_STEPS_PER_EXECUTION.value,
        gradient_accumulation_steps=_GRADIENT_ACCUMULATION_STEPS.value,
        distribution_strategy=_DISTRIBUTION_STRATEGY.value, tpu=_TPU.value,
        num_cpu_devices=_NUM_CPU_DEVICES.value, mixed_precision=_MIXED_PRECISION.value,
        jit_compile=_JIT_COMPILE.value, max_eval_steps=_MAX_EVAL_STEPS.value,
        seed=_SEED.value, deterministic=_DETERMINISTIC.value, log_steps=_LOG_STEPS.value,
    )


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from bert_keras.distribute import StrategyError

    try:
        train(_options_from_flags())
    except (PretrainingError, StrategyError, FileNotFoundError, FileExistsError) as e:
        # One line naming the file or flag, not a TensorFlow traceback.
        sys.exit(f"run_pretraining: error: {e}")


if __name__ == "__main__":
    flags.mark_flags_as_required(['input_file', 'output_dir'])
    app.run(main)
