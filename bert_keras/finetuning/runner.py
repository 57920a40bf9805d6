"""The one train / evaluate / predict skeleton behind run_classifier, run_regressor, run_tagger
and run_squad.

    check flags -> join the processes (JAX across hosts) -> read every input -> load
    model, vocabulary and tokenizer settings -> convert -> (across processes: compare
    what each read) -> train -> save the model directory -> evaluate -> predict

A task (classification.py, tagging.py, squad.py) supplies only what differs: how to read
its files, build its head, convert examples, score and write predictions. Inputs are read
and checked before anything is loaded or trained, so a bad row fails in seconds, and
nothing is written until the inputs are accepted. Results are never replaced without
--overwrite_output.

Tokenizer settings come with the model (`model_loading`): from the tokenizer_config.json
beside the vocabulary in use, else the one saved with the checkpoint, else BERT's uncased
defaults; --do_lower_case / --strip_accents / --tokenize_chinese_chars override them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import math
import os
import random
import shutil
from typing import Any, Sequence

import keras
import tensorflow as tf
from absl import logging

from bert_keras import backends, backup, model_loading
from bert_keras.backup import BackupError
from bert_keras.checkpoints import placeholder_labels, reads_pooler
from bert_keras.config import BertConfig
from bert_keras.distribute import DistributionOptions, accumulation_refusal, batch_refusal
from bert_keras.encoder import BertEncoder
from bert_keras.finetuning import loop
from bert_keras.precision import check_mixed_precision, mixed_precision_option
from bert_keras.tasks import (HEAD_INITIALIZERS, copy_of, with_dtype_policy,
                               with_skip_padding)
from bert_keras.tensorboard import TensorBoard
from data_prep import files, schema, tokenizer_config
from data_prep.cli import check_seed, option, split_values
from data_prep.tokenization import load_tokenizer


LOGS_DIR = "logs"  # TensorBoard event files under --output_dir: train/ and validation/

# --skip_padding of the tasks whose heads ignore padding (classification, tagging).
SKIP_PADDING_HELP = (
    "In training, run the encoder on the real tokens only: the same loss and gradients, "
    "faster when inputs are shorter than --max_seq_length "
    "(bert_keras.layers.padding_free). --noskip_padding runs the padded computation. "
    "Padded under --jit_compile, on TPUs and on Keras' JAX backend (TensorFlow only).")


class FinetuneError(ValueError):
    """Bad flags, inputs or model for a fine-tuning run; the message names the flag or file."""


# On TensorFlow the fine-tuning tools train on one host (tf.distribute's multi-worker and
# TPU strategies are run_pretraining's); on JAX across processes too.
FINETUNE_STRATEGIES = {"tensorflow": ("default", "mirrored"),
                       "jax": ("default", "mirrored", "multi_worker_mirrored")}


@dataclasses.dataclass(frozen=True)
class FinetuneOptions(DistributionOptions):
    """The flags every fine-tuning tool shares (Google's names; where to train:
    `DistributionOptions`)."""

    output_dir: str | None = option(None, "Where the model and results go.", required=True)
    init_checkpoint: str | None = option(
        None, "Initial weights: a run_pretraining output directory, an encoder directory, a "
        "fine-tuned model directory, a .keras or .weights.h5 file, a Hugging Face directory or "
        "a Google checkpoint prefix. Empty: random initialisation of --bert_config_file.")
    bert_config_file: str | None = option(
        None, "bert_config.json: for random initialisation, or for a checkpoint without one "
        "beside it.")
    vocab_file: str | None = option(
        None, "WordPiece vocabulary (default: the one saved with --init_checkpoint, or in "
        "--output_dir when not training).")
    do_train: bool = option(False, "Fine-tune on --train_file.")
    do_eval: bool = option(False, "Score the model on the evaluation data.")
    do_predict: bool = option(False, "Write predictions for --predict_file.")
    max_seq_length: int | None = option(
        None, "WordPieces per sequence, [CLS]/[SEP] included; longer input is truncated (and "
        "counted), but for run_tagger's sentences and run_squad's contexts, read in "
        "overlapping windows (run_tagger's and run_squad's --doc_stride). Default: Google's for training (128; run_squad 384); evaluating or "
        "predicting alone, the length the model was fine-tuned at "
        f"({files.TRAIN_RESULTS_FILE} beside it), else Google's.")
    train_batch_size: int = option(
        32, "Training batch size: with --gradient_accumulation_steps=k, the micro-batch, k "
        "of which make one update.")
    gradient_accumulation_steps: int = option(
        1, "Micro-batches averaged into one update (transformers' flag of the same name): an "
        "update trains on --train_batch_size x this many examples, and every step counted "
        "(--num_train_steps, warmup, --save_checkpoints_steps, --log_steps) is an update. "
        "On TensorFlow one replica only.")
    eval_batch_size: int = option(64, "Batch size for eval and predict.")
    learning_rate: float = option(5e-5, "Peak learning rate of AdamW.")
    num_train_epochs: float = option(3.0, "Training epochs.")
    num_train_steps: int | None = option(
        None, "Optimizer updates; overrides --num_train_epochs when given.")
    warmup_proportion: float = option(0.1, "Fraction of training steps with linear "
                                      "learning-rate warmup.")
    lr_schedule: str = option(
        "linear", "Learning-rate curve: linear = warmup to the peak, then linear decay to 0 "
        "(Model Garden, transformers); google = Google's TF1 curve (decay from step 0; for "
        "exact reproduction).", enum=["linear", "google"])
    epsilon_placement: str = option(
        "adam_paper", "Where Adam's epsilon goes: adam_paper = sqrt(v_hat) + eps (torch, "
        "Adam's algorithm 1); keras = outside the bias correction (Keras' Adam).",
        enum=["adam_paper", "keras"])
    head_initializer: str = option(
        "normal", "How the task head's kernel starts: normal = N(0, initializer_range) "
        "(transformers; about 5 points better on Brown POS, BUILD_NOTES 8.5); "
        "truncated_normal = Google's run_classifier.py (for exact reproduction).",
        enum=list(HEAD_INITIALIZERS))
    seed: int = option(12345, "Seed for initialisation, dropout and shuffling.")
    jit_compile: bool = option(False, "Compile the training step with XLA (faster steps, "
                               "slower start). On KERAS_BACKEND=jax the step is always "
                               "compiled.")
    mixed_precision: str = mixed_precision_option(
        "Keras dtype policy of the model (encoder and head) in training, evaluation and "
        "prediction: mixed_bfloat16 computes in bfloat16 (GPUs, TPUs), mixed_float16 in "
        "float16 with loss scaling; the weights stay float32 and model.keras loads as a "
        "float32 model.")
    overwrite_output: bool = option(False, "Replace results already in --output_dir instead "
                                    "of refusing.")
    log_steps: int = option(50, "Training steps between two points of the loss and learning "
                            "rate in the log and in TensorBoard (--output_dir/logs).")
    save_checkpoints_steps: int = option(
        1000, "Training steps between two backups in --output_dir/backup (weights, optimizer, "
        "dropout state, step): rerunning an interrupted command resumes from the newest, "
        "and ends with the model an uninterrupted run gives. Removed once the model is "
        "saved; none is written at the last step, so a run of at most this many steps "
        "writes none.")
    save_optimizer_state: bool = option(
        False, "Keep the optimizer state in model.keras (to train it further later); by default "
        "the model file holds the weights only.")
    # Tokenizer settings: None = as saved with the vocabulary / model (flags: tokenizer_config).
    do_lower_case: bool | None = None
    strip_accents: Any = None
    tokenize_chinese_chars: bool | None = None

    def tokenizer_overrides(self) -> dict:
        out = {}
        for name in tokenizer_config.SETTINGS:
            value = getattr(self, name)
            if value is not None:
                out[name] = (tokenizer_config.parse_strip_accents(value) if name == "strip_accents"
                             else bool(value))
        return out

    def validate(self) -> None:
        self.check_distribution()
        backend = keras.backend.backend()
        allowed = FINETUNE_STRATEGIES.get(backend, ())
        if self.distribution_strategy not in allowed:
            raise FinetuneError(
                f"--distribution_strategy: expected {' or '.join(allowed)} for fine-tuning on "
                f"KERAS_BACKEND={backend}, found {self.distribution_strategy} (across hosts: "
                "KERAS_BACKEND=jax with multi_worker_mirrored; "
                f"{files.doc_path('distributed.md')})")
        check_mixed_precision(self.mixed_precision)
        check_seed(self.seed)
        if self.log_steps < 1:
            raise FinetuneError(f"--log_steps must be at least 1, got {self.log_steps}")
        if self.save_checkpoints_steps < 1:
            raise FinetuneError(f"--save_checkpoints_steps must be >= 1; received "
                                f"{self.save_checkpoints_steps}")
        if not (self.do_train or self.do_eval or self.do_predict):
            raise FinetuneError("nothing to do: set at least one of --do_train, --do_eval, "
                                "--do_predict")
        if not self.output_dir:
            raise FinetuneError("--output_dir is required")
        for name in ("train_batch_size", "gradient_accumulation_steps", "eval_batch_size",
                     "max_seq_length"):
            if getattr(self, name) < 1:
                raise FinetuneError(f"--{name} must be >= 1; received {getattr(self, name)}")
        if self.do_train:
            if not self.learning_rate > 0:
                raise FinetuneError(f"--learning_rate must be > 0; received {self.learning_rate}")
            if self.num_train_steps is None and not self.num_train_epochs > 0:
                raise FinetuneError(f"--num_train_epochs must be > 0; received "
                                    f"{self.num_train_epochs}")
            if self.num_train_steps is not None and self.num_train_steps < 1:
                raise FinetuneError(f"--num_train_steps must be >= 1; received "
                                    f"{self.num_train_steps}")
            if not 0 <= self.warmup_proportion <= 1:
                raise FinetuneError(f"--warmup_proportion must be in [0, 1]; received "
                                    f"{self.warmup_proportion}")


@dataclasses.dataclass
class Features:
    """A split after conversion: model arrays, what a task needs to map outputs back, stats."""

    arrays: dict
    extra: Any = None
    stats: Any = None


class Task:
    """What a fine-tuning task supplies to `run` (subclasses override every method)."""

    name = "task"
    model_class: type = keras.Model
    # The task's flags that change training beyond its data (a resumed run must keep them).
    training_flags: tuple = ()
    uses_labels = True  # the head has one output per label (classification, tagging)
    default_max_seq_length = 128  # Google's run_classifier.py
    # Options whose None means "as the evaluated model was fine-tuned (predicting or
    # evaluating alone), else this default", as --max_seq_length's does.
    recorded_options: dict = {}

    def options_class(self):
        raise NotImplementedError

    def input_file(self, split: str, opts) -> str | None:
        """The file of a split ("train", "eval", "predict"), or None if not given."""
        raise NotImplementedError

    def input_flag(self, split: str) -> str:
        """The flag naming a split's file (for messages)."""
        return f"--{split}_file"

    def task_settings(self, opts) -> dict:
        """{option: value} a --task_name fixes (run_squad's klue-mrc: SQuAD 2.0 and its
        metric); a flag given otherwise is refused (`run`)."""
        return {}

    def with_defaults(self, common: FinetuneOptions, opts):
        """`opts` with the task's defaults that follow from the common flags filled in
        (run_tagger's --doc_stride: half a window of --max_seq_length), so that what a run
        records (its identity, its results' `made_from`) holds the values it used."""
        return opts

    def validate(self, common: FinetuneOptions, opts) -> None:
        """Checks the task's flags against the common ones (before any input is read)."""

    def output_files(self, common: FinetuneOptions, opts) -> list[str]:
        """Files this run writes into --output_dir (refused if present)."""
        raise NotImplementedError

    def read(self, path: str, split: str, opts):
        raise NotImplementedError

    def labels_from(self, examples) -> list[str] | None:
        return None

    def given_labels(self, opts) -> list[str] | None:
        return None

    def build(self, encoder: BertEncoder, labels: list[str] | None, opts,
              head_initializer: str) -> keras.Model:
        raise NotImplementedError

    def to_train_further(self, model: keras.Model, opts) -> keras.Model:
        """A fine-tuned model of this task, loaded to be trained further, with this run's
        settings."""
        return model

    def convert(self, examples, tokenizer, labels, common: FinetuneOptions, opts,
                split: str) -> Features:
        raise NotImplementedError

    def targets(self, features: Features) -> dict:
        raise NotImplementedError

    def train_summary(self, features: Features, read_info) -> dict:
        return {}

    def epoch_size(self, examples, features: Features) -> int | None:
        """The examples one epoch of --num_train_epochs counts in Google's step count,
        int(N / (train_batch_size x gradient_accumulation_steps) * num_train_epochs); None:
        the training rows."""
        return None

    def export_settings(self, opts) -> dict:
        """Task flags the task's export takes as its defaults (train_results.json)."""
        return {}

    def result_files(self, common: FinetuneOptions, opts) -> list[str]:
        """Every file evaluation and prediction may write into --output_dir (removed when
        --overwrite_output replaces the model they came from)."""
        every = dataclasses.replace(common, do_train=False, do_eval=True, do_predict=True)
        return self.output_files(every, opts)

    def evaluate(self, examples, features: Features, outputs: dict, labels, tokenizer,
                 common: FinetuneOptions, opts) -> dict:
        raise NotImplementedError

    def write_predictions(self, examples, features: Features, outputs: dict, labels, tokenizer,
                          common: FinetuneOptions, opts) -> dict:
        raise NotImplementedError


def under_data_dir(path: str | None, data_dir: str | None) -> str | None:
    """An input file flag's path, relative to --data_dir where one is given."""
    if path and data_dir and not os.path.isabs(path):
        return os.path.join(data_dir, path)
    return path


def benchmark_file(data_dir: str | None, name: str, below: str, task: str, split: str) -> str:
    """The file `name` of a --task_name's `split` set: in --data_dir, else in its download's
    own directory `below` there (KLUE's klue-ner-v1.1/ in klue_benchmark/; "" for none).

    Raises:
      FinetuneError: no --data_dir, or neither place holds the file.
    """
    if not data_dir:
        raise FinetuneError(f"--task_name={task} needs --data_dir (the directory holding its "
                            f"files{f', or the one holding {below}/' if below else ''})")
    path = os.path.join(data_dir, name)
    deeper = os.path.join(data_dir, below, name) if below else None

    def there(p):  # a file, or a FIFO the task's reader reads once (`files.rereadable`)
        return files.isfile(p) or files.is_pipe(p)

    if deeper and not there(path) and there(deeper):
        return deeper
    if not there(path):
        raise FinetuneError(f"--data_dir {data_dir}: no {name} there for the {task} {split} "
                            f"set (expected {path}{f' or {deeper}' if deeper else ''})")
    return path


class LabelledFileTask(Task):
    """A task with one label per example or token, read from --{train,eval,predict}_file
    (relative to --data_dir), whose predictions go to one file (classification, tagging)."""

    predictions_file = "predictions"

    def input_file(self, split, opts):
        return under_data_dir(getattr(opts, f"{split}_file"), opts.data_dir)

    def output_files(self, common, opts):
        return ([files.TASK_MODEL_FILE, *([files.LABELS_FILE] if self.uses_labels else []),
                 files.TRAIN_RESULTS_FILE] if common.do_train else []) + \
            (["eval_results.json"] if common.do_eval else []) + \
            ([self.predictions_file, "predict_results.json"] if common.do_predict else [])

    def targets(self, features):
        return {"logits": features.arrays["label_ids"]}

    def build(self, encoder, labels, opts, head_initializer):
        if labels is None:
            raise FinetuneError(f"no label list to build a {self.name} head")
        return self.model_class(encoder, len(labels), dropout=self.head_dropout(opts),
                                head_initializer=head_initializer,
                                skip_padding=opts.skip_padding)

    def to_train_further(self, model, opts):
        return with_skip_padding(model, opts.skip_padding)

    def head_dropout(self, opts) -> float:
        raise NotImplementedError


def _with_sequence_length(common: FinetuneOptions, default: int) -> FinetuneOptions:
    """`common` with --max_seq_length's default filled in: the task's `default` (Google's)
    for training; evaluating or predicting alone, the length the model evaluated was
    fine-tuned at, as its train_results.json records it (the model in --init_checkpoint's
    directory where that holds a fine-tuned model, else in --output_dir), else `default`.
    Before, such a run cut its texts at 128 whatever the model was trained at: a model
    fine-tuned at 512 lost the rest of every long text, and one fine-tuned at 32 failed on
    its position table. Given, it is used as given; where it differs from the recorded
    length a warning says so, as the exports' `given_or_recorded` does."""
    if common.max_seq_length is not None:
        model_dir, recorded = _recorded(common, "max_seq_length")
        if _of_kind(recorded, default) and recorded != common.max_seq_length:
            logging.warning("--max_seq_length=%d, but %s was fine-tuned with max_seq_length=%d "
                            "(%s)", common.max_seq_length, model_dir, recorded,
                            files.TRAIN_RESULTS_FILE)
        return common
    return dataclasses.replace(common, max_seq_length=_recorded_or(
        common, "max_seq_length", default))


def _recorded_or(common: FinetuneOptions, name: str, default):
    """What the evaluated model's fine-tuning recorded for the setting `name` (evaluating or
    predicting alone: the model in --init_checkpoint's directory where that holds a
    fine-tuned model, else in --output_dir), else `default`. A recorded value counts where
    it is of the default's kind: a positive integer, a boolean, or a finite number; for a
    default of None, a count that may be 0 (run_tagger's --doc_stride, 0 = truncate), the
    task's `with_defaults` filling its own default where nothing is recorded."""
    model_dir, recorded = _recorded(common, name)
    if _of_kind(recorded, default):
        _log_recorded(name, recorded, model_dir)
        return float(recorded) if isinstance(default, float) else recorded
    return default


def recorded_choice(common: FinetuneOptions, name: str, choices) -> str | None:
    """What the evaluated model's fine-tuning recorded for the setting `name` where it is
    one of `choices` (evaluating or predicting alone, as `_recorded_or` reads it), else
    None: run_tagger's --tag_format, a model fine-tuned on KLUE-NER's character tags."""
    model_dir, recorded = _recorded(common, name)
    if isinstance(recorded, str) and recorded in choices:
        _log_recorded(name, recorded, model_dir)
        return recorded
    return None


def _recorded(common: FinetuneOptions, name: str):
    """(the evaluated model's directory, what its train_results.json records under
    `name`), (None, None) for a training run."""
    if common.do_train:
        return None, None
    model_dir = evaluated_model_dir(common)
    return model_dir, files.fine_tuned_with(model_dir or "").get(name)


def _log_recorded(name, value, model_dir):
    logging.info("--%s: %s, as %s was fine-tuned (%s; the flag overrides)", name, value,
                 model_dir, files.TRAIN_RESULTS_FILE)


def evaluated_model_dir(common: FinetuneOptions) -> str:
    """The directory of the fine-tuned model a run that only evaluates or predicts uses:
    --init_checkpoint's where that holds a fine-tuned model, else --output_dir."""
    init = common.init_checkpoint
    if init:
        init_dir = init if files.isdir(init) else os.path.dirname(init)
        if files.isfile(os.path.join(init_dir, files.TASK_MODEL_FILE)):
            return init_dir
    return common.output_dir


def _of_kind(value, default) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if default is None:
        return isinstance(value, int) and value >= 0
    if isinstance(default, int):
        return isinstance(value, int) and value > 0
    return math.isfinite(value)


def _with_task_settings(task, opts):
    """`opts` with what its --task_name fixes (`Task.task_settings`), before anything is
    taken from a recorded run; a flag given with another value is refused."""
    fixed = task.task_settings(opts)
    for name, value in fixed.items():
        given = getattr(opts, name)
        if given is not None and given != value:
            shown = str(value).lower() if isinstance(value, bool) else value
            raise FinetuneError(f"--task_name={opts.task_name} sets --{name}={shown}; drop "
                                f"--{name}")
    return dataclasses.replace(opts, **fixed) if fixed else opts


def _with_recorded_options(task, common: FinetuneOptions, opts):
    """`opts` with the task's `recorded_options` that were not given (None) filled in as
    --max_seq_length is: as the evaluated model was fine-tuned, else the option's default."""
    fill = {name: _recorded_or(common, name, default)
            for name, default in task.recorded_options.items() if getattr(opts, name) is None}
    return dataclasses.replace(opts, **fill) if fill else opts


def _check_segments_fit(task: Task, features: dict, encoder: BertEncoder) -> None:
    """Refuses sentence pairs (segment id 1) for a model with one segment embedding
    (`BertEncoder.pair_refusal`)."""
    for split, data in features.items():
        types = data.arrays.get(schema.SEGMENT_IDS)
        refusal = types is not None and types.size and int(types.max()) >= 1 and (
            encoder.pair_refusal(f"{task.input_flag(split).split(' ')[0]}: its examples are "
                                 "sentence pairs"))
        if refusal:
            raise FinetuneError(refusal)


def _trained_model_file(common: FinetuneOptions, task_name: str) -> str:
    """--output_dir, which must hold a fine-tuned model to evaluate or predict with when
    there is no --init_checkpoint; FinetuneError if it does not."""
    source = common.output_dir
    if not files.isfile(os.path.join(source, files.TASK_MODEL_FILE)):
        raise FinetuneError(
            f"nothing to evaluate: no {files.TASK_MODEL_FILE} in --output_dir {source} (train "
            f"with --do_train, or point --init_checkpoint at a fine-tuned {task_name} model)")
    return source


def _load_model(task: Task, common: FinetuneOptions, opts, labels):
    """(model, checkpoint or None): what to train or run, its layers (encoder and head)
    under the dtype policy --mixed_precision names (float32 variables either way)."""
    init = common.init_checkpoint

    def in_policy(model):  # the model itself at the default float32
        return with_dtype_policy(model, common.mixed_precision)

    if common.do_train:
        if not init:
            if not common.bert_config_file:
                raise FinetuneError("give --init_checkpoint, or --bert_config_file for a randomly "
                                    "initialised encoder")
            logging.info("Random initialisation from %s", common.bert_config_file)
            encoder = BertEncoder.from_bert_config(BertConfig.from_json_file(common.bert_config_file))
            model = task.build(in_policy(encoder), labels, opts, common.head_initializer)
            return _with_dropout_seeded(model, common.seed), None
        ckpt = model_loading.load_checkpoint(init, common.bert_config_file)
        if isinstance(ckpt.model, task.model_class):
            logging.info("Training further the fine-tuned %s of %s", task.model_class.__name__, init)
            model = in_policy(task.to_train_further(ckpt.model, opts))
            return _with_dropout_seeded(model, common.seed), ckpt
        if not isinstance(ckpt.model, BertEncoder):
            logging.info("%s holds a %s: using its encoder", init, type(ckpt.model).__name__)
        # Loading drew from Keras' generators as many times as the checkpoint's form builds
        # layers (a pretraining run builds its heads too), so the new head is drawn from
        # --seed afresh: the same weights from a run, its encoder/ or a converted copy.
        keras.utils.set_random_seed(common.seed)
        model = task.build(in_policy(ckpt.encoder), labels or ckpt.labels, opts,
                           common.head_initializer)
        _initialise_a_missing_pooler(model, init)
        return _with_dropout_seeded(model, common.seed), ckpt
    # Evaluation / prediction only: a fine-tuned model of this task.
    source = init
    if source:
        ckpt = model_loading.load_checkpoint(source, common.bert_config_file)
        if isinstance(ckpt.model, task.model_class):
            return in_policy(ckpt.model), ckpt
        if not files.isfile(os.path.join(common.output_dir, files.TASK_MODEL_FILE)):
            raise FinetuneError(
                f"nothing to evaluate: --init_checkpoint {init} holds a "
                f"{type(ckpt.model).__name__}, not a fine-tuned {task.model_class.__name__}, "
                f"and --output_dir {common.output_dir} holds no {files.TASK_MODEL_FILE} (add "
                "--do_train to fine-tune it first)")
        # Google's README predicts so, with the pretrained checkpoint still named: said, as
        # the checkpoint is not what answers.
        logging.warning("--init_checkpoint %s is not used: it holds a %s, not a fine-tuned %s; "
                        "running --output_dir's %s (as Google's scripts run the model their "
                        "--output_dir holds)", init, type(ckpt.model).__name__,
                        task.model_class.__name__, files.TASK_MODEL_FILE)
    source = _trained_model_file(common, task.name)
    ckpt = model_loading.load_checkpoint(source)
    if not isinstance(ckpt.model, task.model_class):
        raise FinetuneError(f"{source} holds a {type(ckpt.model).__name__}, expected a "
                            f"{task.model_class.__name__}")
    return in_policy(ckpt.model), ckpt


def _with_dropout_seeded(model, seed: int):
    """`model` with every dropout layer's generator (`keras.random.SeedGenerator`) started
    from `seed` and its place in the model: each drew its start when its layer was built,
    from Keras' global generator, so the same model loaded from another checkpoint form
    (or trained further) dropped other units. A resumed run then restores the states its
    backup holds."""
    draws = random.Random(f"dropout {seed}")  # not the head initialiser's draws
    for variable in model.variables:
        if variable.path.endswith("seed_generator_state"):
            variable.assign(keras.ops.convert_to_tensor(
                [draws.randint(1, int(1e9)), 0], dtype=variable.dtype))
    return model


def _initialise_a_missing_pooler(model, init: str) -> None:
    """A checkpoint saved without a pooler (transformers' BertForMaskedLM, how most Korean
    and domain BERTs are published) loads with a zero one. A new head that reads it starts
    it from the encoder's initialiser instead, as transformers' from_pretrained starts
    weights a checkpoint lacks: from zero, the first steps give the classifier layer no
    gradient and move the pooler only along that layer's few columns."""
    pooler = model.encoder.pooler_layer
    if not reads_pooler(model) or keras.ops.any(pooler.kernel.value != 0):
        return
    initializer = keras.initializers.TruncatedNormal(stddev=model.encoder.initializer_range)
    pooler.kernel.assign(initializer(pooler.kernel.shape, pooler.kernel.dtype))
    pooler.bias.assign(keras.ops.zeros(pooler.bias.shape, pooler.bias.dtype))
    logging.info("%s has no pooler weights: the pooler starts from its initialiser "
                 "(truncated normal, stddev %g), like the new head", init,
                 model.encoder.initializer_range)


def _the_models_labels(labels: list[str], ckpt, given: bool) -> list[str]:
    """The labels to use with a fine-tuned model's own head (trained further, evaluated):
    its labels, in its head's order. The training data's labels (sorted) or a list given in
    another order are mapped onto them, by name; labels the model has no class for, or a
    given list of other labels, are refused. Before, the sorted or given order silently
    relabelled the head's classes (an NLI model's entailment scored as contradiction)."""
    extra = [label for label in labels if label not in ckpt.labels]
    if extra or (given and sorted(labels) != sorted(ckpt.labels)):
        what = "the label list given" if given else "the training data's labels"
        lacks = f" (it has no class for {extra})" if extra else ""
        raise FinetuneError(
            f"{what} {labels} are not the labels of the fine-tuned model {ckpt.path}, "
            f"{ckpt.labels}{lacks}; train it with its own labels, or train a new head on its "
            "encoder (convert_checkpoint --model=encoder)")
    logging.info("Labels: %s, as the head of %s orders them", ckpt.labels, ckpt.path)
    return list(ckpt.labels)


def _model_and_vocabulary(task: Task, common: FinetuneOptions, opts, labels,
                          labels_given: bool):
    """(model, labels, vocab_file, tokenizer settings): `_load_model`'s model, the labels
    given or saved with it, checked against its head, and the vocabulary to use with it
    (--vocab_file or the checkpoint's), checked against its embedding table.
    `labels_given`: `labels` came from the flags (`Task.given_labels`), not the data."""
    model, ckpt = _load_model(task, common, opts, labels)
    if common.mixed_precision != "float32":
        logging.info("Mixed precision: %s (float32 weights; --mixed_precision)",
                     common.mixed_precision)
    if not task.uses_labels:
        # A head without labels (regression, span QA): a classifier's labels.txt, when its
        # encoder is the starting point, are not this model's (written beside it, they made
        # a regressor that convert_checkpoint refused).
        labels = None
    elif labels is None and ckpt is not None:
        labels = ckpt.labels
    elif (ckpt is not None and isinstance(ckpt.model, task.model_class)
          and ckpt.labels is not None and labels != ckpt.labels
          and not placeholder_labels(ckpt.labels)):
        labels = _the_models_labels(labels, ckpt, given=labels_given)
    elif (ckpt is not None and isinstance(ckpt.model, task.model_class)
          and (ckpt.labels is None or placeholder_labels(ckpt.labels)) and not labels_given):
        # A head without label names (Google's run_classifier keeps them in its processor;
        # transformers' LABEL_i placeholders, which its run_glue.py ignores so): its
        # classes can only be taken in the order of the data's labels, sorted.
        logging.warning("%s records no label names%s: its classes are taken to be %s in that "
                        "order (the data's labels, sorted); give --task_name or --label_list "
                        "in the head's order if it was trained with another", ckpt.path,
                        "" if ckpt.labels is None else
                        f" (only transformers' placeholders {', '.join(ckpt.labels)})", labels)
    if task.uses_labels:
        if labels is None:
            raise FinetuneError(f"no label list: the model has no {files.LABELS_FILE} beside it; "
                                "pass --label_list_file (or --label_list, or --task_name), in "
                                "the order of its head's classes")
        if model.num_classes != len(labels):
            raise FinetuneError(f"the model has {model.num_classes} classes but the label list "
                                f"has {len(labels)}: {labels}")
    if ckpt is not None:
        vocab_file = ckpt.vocabulary(common.vocab_file)
    elif common.vocab_file:
        vocab_file = common.vocab_file
        model_loading.check_vocab_fits(model.encoder, vocab_file, common.bert_config_file)
    else:
        raise FinetuneError("no --vocab_file given and no checkpoint to take one from")
    saved = tokenizer_config.read_for_vocab(vocab_file) or (
        ckpt.saved_tokenizer if ckpt is not None else None)
    settings, source = tokenizer_config.resolve(vocab_file, common.tokenizer_overrides(), saved,
                                                warn=logging.warning)
    logging.info("Tokenizer: %s, settings %s (%s)", vocab_file, settings.describe(),
                 source or "defaults and flags")
    return model, labels, vocab_file, settings


def run(task: Task, values: dict) -> dict:
    """Train / eval / predict as `values` (flag names) say; returns {"train", "eval",
    "predict"} summaries, also written to the results files."""
    backends.check_backend()
    common_values, task_values = split_values(values, FinetuneOptions, task.options_class())
    common = _with_sequence_length(FinetuneOptions(**common_values), task.default_max_seq_length)
    opts = task.with_defaults(common, _with_recorded_options(
        task, common, _with_task_settings(task, task.options_class()(**task_values))))
    common.validate()
    task.validate(common, opts)
    for split, wanted in (("train", common.do_train), ("eval", common.do_eval),
                          ("predict", common.do_predict)):
        if wanted and not task.input_file(split, opts):
            raise FinetuneError(f"{task.input_flag(split)} is required with --do_{split}")
    keras.utils.set_random_seed(common.seed)
    # Joins the processes (JAX's multi_worker_mirrored) once the flags are accepted, before
    # anything touches a device; process 0 (the chief) writes the outputs.
    distribution = common.distribution()
    chief = distribution.is_chief
    logging.info("Distribution: %r", distribution)
    distribution.check_same_flags(values)
    # A backup to resume: its training flags cannot change, so the refusals say on what
    # device count to resume it (changing the flag was refused in turn, by `_backup_dir`).
    resuming = (common.output_dir if common.do_train and backup.holds_a_backup(
        backup.process_backup_dir(common.output_dir, distribution)) else None)
    refusal = common.do_train and (
        batch_refusal("train_batch_size", common.train_batch_size,
                      distribution.num_replicas_in_sync, resuming)
        or accumulation_refusal(common.gradient_accumulation_steps,
                                distribution.num_replicas_in_sync,
                                tf_distribute=distribution.strategy is not None,
                                resuming=resuming))
    if refusal:
        raise FinetuneError(refusal)
    # One run at a time in --output_dir: a second one started beside it trained for
    # nothing, shared its backup and left it orphaned (refused by every later run).
    with files.exclusively(common.output_dir, "--output_dir") if chief else \
            contextlib.nullcontext():
        return _run(task, common, opts, distribution)


def _run(task: Task, common: FinetuneOptions, opts, distribution) -> dict:
    """`run` once its flags are accepted and --output_dir is this run's."""
    chief = distribution.is_chief
    # Each process reads its own host's files (the inputs, the checkpoint, the vocabulary)
    # and converts the examples outside the distribution: what one process fails there
    # alone (a file missing or damaged on its host, an --output_dir of its own holding
    # results) stops every process. One that had stopped alone left the others waiting
    # for it to join, or at their first collective (each variable made under a JAX
    # distribution is one: device_put checks its value is the same on every process),
    # until JAX aborted them all, 5 minutes later.
    with distribution.stop_together():
        # Training this command finished before it was stopped (in evaluation or prediction)
        # is not redone: its model.keras is taken up where the trained run is this one.
        finished = _recorded_training(common, distribution)
        examples, same_as, read_info, labels, labels_given = _read_inputs(
            task, common, opts, finished is not None)
        model, labels, vocab_file, settings = _model_and_vocabulary(task, common, opts, labels,
                                                                    labels_given)
        tokenizer = load_tokenizer(vocab_file, settings)
        if common.max_seq_length > model.encoder.max_sequence_length:
            raise FinetuneError(f"--max_seq_length={common.max_seq_length} exceeds the model's "
                                f"position table ({model.encoder.max_sequence_length} positions)")
        if labels is not None:
            logging.info("%d labels: %s", len(labels), " ".join(labels[:50]))
        features = {split: task.convert(ex, tokenizer, labels, common, opts, split)
                    for split, ex in examples.items()}
        _check_segments_fit(task, features, model.encoder)
    distribution.check_same_inputs(
        lambda: _what_was_read(task, common, opts, model, vocab_file, settings, labels,
                               features))
    for split, earlier in same_as.items():
        examples[split], features[split] = examples[earlier], features[earlier]
    out = common.output_dir
    results: dict[str, dict] = {}
    if common.do_train and finished is not None:
        model = _the_finished_model(task, common, opts, model, labels, features["train"],
                                    distribution, settings, finished)
        results["train"] = files.fine_tuned_with(out)
    elif common.do_train:
        data = features["train"]
        identity = _training_identity(task, common, opts, model, labels, data, distribution,
                                      settings)
        with distribution.stop_together():  # one process's refusal stops them all
            backup_dir, resuming = _backup_dir(common, distribution, identity)
        logs_dir = os.path.join(out, LOGS_DIR)
        if chief and common.overwrite_output and files.isdir(logs_dir) and not resuming:
            # The replaced run's curves would mix with the new ones.
            files.rmtree(logs_dir) if files.is_remote(logs_dir) else shutil.rmtree(logs_dir)
        if getattr(opts, "skip_padding", False) and keras.backend.backend() != "tensorflow":
            logging.info("--skip_padding: padding-free rows are TensorFlow-only; training on "
                         "%s runs the padded computation (same loss and gradients)",
                         keras.backend.backend())
        # Under the distribution's scope: on JAX, fit shards each batch as it runs (each
        # process its share of the global batch: distribute.Distribution).
        with distribution.scope():
            # The model trained is a copy made under the distribution (weights, dropout seeds
            # and dtype policy alike: several devices or processes train as one does).
            if distribution.places_variables:
                model = copy_of(model)
            try:
                summary = loop.train(
                    model, _model_inputs(data), task.targets(data), common.train_batch_size,
                    common.num_train_epochs, common.learning_rate, common.warmup_proportion,
                    seed=common.seed, jit_compile=common.jit_compile,
                    num_train_steps=common.num_train_steps, lr_schedule=common.lr_schedule,
                    epsilon_placement=common.epsilon_placement, log_every=common.log_steps,
                    backup_dir=backup_dir, save_checkpoints_steps=common.save_checkpoints_steps,
                    epoch_size=task.epoch_size(examples["train"], data),
                    gradient_accumulation_steps=common.gradient_accumulation_steps,
                    gather=(distribution.gather_from_processes
                            if distribution.num_processes > 1 else None),
                    callbacks=([TensorBoard(logs_dir, log_steps=common.log_steps,
                                            accumulation=common.gradient_accumulation_steps)]
                               if chief else [])
                    + distribution.preemption_callbacks(
                        f"rerun the same command on every host {TO_RESUME}"))
            except BackupError as e:  # its message says what to remove to start over
                raise FinetuneError(str(e)) from None
            except backup.TrainingDiverged as e:
                kept = (f"; the backup in {backup_dir} is from before it: remove it to train "
                        "again with other flags" if backup.holds_a_backup(backup_dir) else "")
                raise FinetuneError(f"{e} (no model was saved{kept})") from None
        summary.update(task.train_summary(data, read_info))
        # What the task exports take as their defaults (export/task_export.py).
        summary["max_seq_length"] = common.max_seq_length
        summary.update(task.export_settings(opts))
        if labels is not None:
            summary["label_list"] = labels
        summary["tokenizer"] = settings.to_json_dict()
        summary[TRAINED_AS] = _what_was_trained(identity)
        if chief:
            if common.overwrite_output:
                # The replaced model's results (and Google's files, which record no model)
                # would read as this one's: removed before it is saved.
                for name in task.result_files(common, opts):
                    if files.isfile(os.path.join(out, name)):
                        files.remove(os.path.join(out, name))
            model_loading.save_task_dir(model, out, labels, vocab_file, settings,
                                        overwrite=common.overwrite_output,
                                        include_optimizer=common.save_optimizer_state,
                                        train_results=summary)
        backup.remove_backups(out, distribution)  # the model is saved: they have served
        results["train"] = summary
    # Evaluation and prediction: every process on its own copy of the model (no collectives),
    # so all of them end together; the chief writes.
    # (On JAX's distributions a copy made from the config: float32 until put back under
    # --mixed_precision.)
    model = with_dtype_policy(distribution.on_one_device(model), common.mixed_precision)
    # What each result is computed from, recorded with it: a run taking a finished model up
    # takes up the results this command already wrote, and refuses others. (Of the copy on
    # one device: a variable spread over processes is not readable from one.)
    splits = [split for split in ("eval", "predict") if split in features and chief]
    weights = _weights_described(model) if splits else None
    made_from = {split: _what_was_evaluated(task, common, opts, weights, labels,
                                            features[split], split, settings)
                 for split in splits}
    if finished is not None:
        results.update(_results_taken_up(task, common, opts, made_from))
    outputs_of: dict[int, tuple] = {}  # id(features) -> (outputs, timing)
    for split, writer in (("eval", task.evaluate), ("predict", task.write_predictions)):
        if split not in features or split in results:
            continue
        data = features[split]
        if id(data) not in outputs_of:
            outputs_of[id(data)] = loop.predict(model, _model_inputs(data), common.eval_batch_size)
        if not chief:
            continue
        outputs, timing = outputs_of[id(data)]
        summary = writer(examples[split], data, outputs, labels, tokenizer, common, opts)
        summary[f"{split}_seconds"] = timing["seconds"]
        summary[f"{split}_examples_per_second"] = timing["examples_per_second"]
        summary[MADE_FROM] = made_from[split]
        results[split] = summary
        files.write_json(os.path.join(out, f"{split}_results.json"), summary)
        if split == "eval":
            _log_eval_scalars(os.path.join(out, LOGS_DIR, "validation"), summary,
                              trained_steps(out, results))
    return results


TO_RESUME = "to resume (from the newest backup, where one was written)"
BACKUP_RUN_FILE = "run.json"  # in it: what the backed-up run trained (`_backup_identity`)
BACKUP_FORMAT = "bert-keras-finetune-backup/1"
# The common flags that change what training computes (a resumed run must keep them; the
# data, the vocabulary and the checkpoint's weights count by content). Backups at other
# steps cannot be resumed at an interval's end, hence save_checkpoints_steps.
TRAINING_FLAGS = ("max_seq_length", "train_batch_size", "gradient_accumulation_steps",
                  "learning_rate", "num_train_epochs", "num_train_steps", "warmup_proportion",
                  "lr_schedule", "epsilon_placement", "head_initializer", "seed",
                  "mixed_precision", "save_checkpoints_steps")
# Where and how the steps run: the same function, but other dropout masks (XLA's and each
# backend's random streams, one stream per replica). A resumed run may change them, with a
# warning that it will not end as an uninterrupted run would.
RUNS_ON = "runs on"
_NOT_FLAGS = ("KERAS_BACKEND", "replicas")  # RUNS_ON's settings that are no flag


def _tokenizer_flags(settings) -> dict:
    """The tokenizer's settings as it applies them, under their flag names: in a record's
    "flags", so a changed --do_lower_case is named where the features' CRC changes with it."""
    lower, strip, chinese = settings.effective()
    return {"do_lower_case": lower, "strip_accents": strip, "tokenize_chinese_chars": chinese}


def _backup_identity(task: Task, common: FinetuneOptions, opts, model, labels,
                     data: Features, distribution, settings) -> dict:
    """What a run trains, as a resumed run must share it: the training flags (the
    tokenizer's settings among them, `settings`), the labels,
    digests of the training features and of the encoder's initial weights (the checkpoint's:
    the head's seeded initialisation follows from the flags and the backend; without a
    checkpoint, the config they were drawn for, with --seed among the flags), and under
    `RUNS_ON` what a resumed run may change (`distribution` the training's)."""
    from bert_keras.distribute import digest

    flags = {name: getattr(common, name) for name in TRAINING_FLAGS}
    if common.num_train_steps is not None:  # it replaces the epochs
        flags["num_train_epochs"] = None
    flags.update({name: getattr(opts, name) for name in task.training_flags})
    flags.update(_tokenizer_flags(settings))
    arrays = [data.arrays[name] for name in sorted(data.arrays)]
    weights = model.encoder.weights
    if common.init_checkpoint:
        initial = f"{len(weights)} arrays, CRC {digest(*weights):08x}"
    else:
        # Drawn from --seed by the backend's generator (TensorFlow's and JAX's differ): the
        # config and the seed say what they are, so a run moves between backends as one
        # started from a checkpoint does (with RUNS_ON's warning). Before, their CRCs made
        # it "a run that trained otherwise".
        config = model.encoder.to_bert_config().to_dict()
        initial = f"random, config CRC {digest(json.dumps(config, sort_keys=True)):08x}"
    return {"format": BACKUP_FORMAT, "task": task.name, "flags": flags, "labels": labels,
            "training data": f"{len(arrays[0]) if arrays else 0} features, CRC "
                             f"{digest(*arrays):08x}",
            "initial weights": initial,
            "processes": distribution.num_processes,
            RUNS_ON: {"KERAS_BACKEND": keras.backend.backend(),
                      "jit_compile": common.jit_compile,
                      "distribution_strategy": common.distribution_strategy,
                      "replicas": distribution.num_replicas_in_sync}}


def _training_identity(task: Task, common: FinetuneOptions, opts, model, labels,
                       data: Features, distribution, settings) -> dict:
    """`_backup_identity` as its JSON record reads back (what the records compare)."""
    return json.loads(json.dumps(_backup_identity(task, common, opts, model, labels, data,
                                                  distribution, settings)))


# What a resumed run, or one taking a finished model up, may change: where it runs (with a
# warning); fewer processes resume from process 0's backup.
_WHERE_IT_RAN = (RUNS_ON, "processes")


def _what_was_trained(identity: dict) -> dict:
    """A `_training_identity` less `_WHERE_IT_RAN`."""
    return {k: v for k, v in identity.items() if k not in _WHERE_IT_RAN}


def _backup_dir(common: FinetuneOptions, distribution, identity: dict) -> tuple[str, bool]:
    """(the directory this process backs training up to, whether it holds a backup to
    resume from), with the run it belongs to (`identity`, `_training_identity`) recorded in
    it. A backup left by an
    interrupted run is resumed when it belongs to this run; one of another run is refused,
    naming what differs (resuming it would train the other run's model further under these
    flags).

    Raises:
      FinetuneError: a backup of another run, or files not written by this tool.
    """
    out = common.output_dir
    backup_dir = backup.process_backup_dir(out, distribution)
    record = os.path.join(backup_dir, BACKUP_RUN_FILE)
    if backup.holds_a_backup(backup_dir):
        try:
            previous = files.read_json(record)
            if not isinstance(previous, dict) or previous.get("format") != BACKUP_FORMAT:
                raise ValueError(f"not a {BACKUP_FORMAT} record")
        except (OSError, ValueError) as e:
            raise FinetuneError(
                f"{backup_dir} holds a backup without a readable {BACKUP_RUN_FILE} "
                f"({' '.join(str(e).split())[:120]}): not one this tool wrote; remove it, or "
                "choose another --output_dir") from None
        made_by = previous.get("processes", 1)
        if made_by < identity["processes"]:
            raise FinetuneError(
                f"--output_dir {out}: {backup_dir} holds the backup of a run of {made_by} "
                f"process(es), and a run of {identity['processes']} resumes from a backup in "
                f"every process; resume it with {made_by} process(es) (fewer take process 0's "
                f"backup), or remove {backup_dir} to train from step 0")
        changed = _differences(_what_was_trained(previous), _what_was_trained(identity))
        if changed:
            raise FinetuneError(
                f"--output_dir {out}: {backup_dir} holds the backup of an interrupted run "
                f"that trained otherwise ({'; '.join(changed)}); rerun that run's command to "
                f"resume it, or remove {backup_dir} to train from step 0")
        moved = _differences({RUNS_ON: previous.get(RUNS_ON, {})}, {RUNS_ON: identity[RUNS_ON]})
        if moved:
            logging.warning(
                "Resuming the backup in %s on other settings than it was trained on (%s): "
                "training continues from its weights, optimizer and data position, but draws "
                "other dropout masks, so it will not end as an uninterrupted run would",
                backup_dir, "; ".join(moved))
            files.write_json(record, identity)  # what the next backups are made on
        return backup_dir, True
    # A fresh start (also where a run stopped before its first backup).
    if files.exists(backup_dir) and not files.isdir(backup_dir):
        raise FinetuneError(f"--output_dir {out}: {backup_dir} is a file; expected the "
                            "directory of training backups")
    files.makedirs(backup_dir)
    files.write_json(record, identity)
    return backup_dir, False


TRAINED_AS = "trained_as"  # in train_results.json: the run's `_what_was_trained`


def _recorded_training(common: FinetuneOptions, distribution) -> dict | None:
    """The `_what_was_trained` recorded with the model.keras in --output_dir, where a
    --do_train run (one process) may take that model up instead of training, else None."""
    out = common.output_dir
    if (not common.do_train or common.overwrite_output or distribution.num_processes > 1
            or not files.isfile(os.path.join(out, files.TASK_MODEL_FILE))):
        return None
    recorded = files.fine_tuned_with(out).get(TRAINED_AS)
    return recorded if isinstance(recorded, dict) else None


def _the_finished_model(task: Task, common: FinetuneOptions, opts, model, labels,
                        data: Features, distribution, settings, recorded: dict):
    """The model.keras in --output_dir, trained by an earlier run of this command (stopped
    after saving it, in evaluation or prediction), for this run's evaluation and prediction.

    Raises:
      FinetuneError: the model there was trained otherwise (refused as existing output).
    """
    out = common.output_dir
    changed = _differences(recorded, _what_was_trained(
        _training_identity(task, common, opts, model, labels, data, distribution, settings)))
    if changed:
        raise FinetuneError(
            f"{os.path.join(out, files.TASK_MODEL_FILE)} exists, trained otherwise "
            f"({'; '.join(changed)}); refusing to overwrite (choose another --output_dir or "
            "pass --overwrite_output)")
    logging.info("%s was trained by an earlier run of this command: not trained again, "
                 "going on with %s", out,
                 " and ".join(s for s, on in (("evaluation", common.do_eval),
                                              ("prediction", common.do_predict)) if on)
                 or "nothing else (every result is there)")
    trained, _ = _load_model(task, dataclasses.replace(common, do_train=False,
                                                       init_checkpoint=None), opts, labels)
    return trained


MADE_FROM = "made_from"  # in eval_results.json and predict_results.json
# The common flags that change what evaluation and prediction write (the model, the data
# and the tokenizer count by the digests of the weights and of the features).
_RESULT_FLAGS = ("max_seq_length", "eval_batch_size", "mixed_precision")


def _weights_described(model) -> str:
    """A model's weights in `_what_was_evaluated`'s record: their count and CRC."""
    from bert_keras.distribute import digest

    return f"{len(model.weights)} arrays, CRC {digest(*model.weights):08x}"


def _what_was_evaluated(task: Task, common: FinetuneOptions, opts, weights: str, labels,
                        data: Features, split: str, settings) -> dict:
    """What a split's results are computed from, as their JSON record reads back: the
    model's weights (`_weights_described`), a digest of the split's features, the labels,
    and the flags (the task's, less the input files, which count by the features; the
    tokenizer's `settings`) that change the results."""
    from bert_keras.distribute import digest

    flags = {name: getattr(common, name) for name in _RESULT_FLAGS}
    flags.update({f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)
                  if not f.name.endswith("_file") and f.name != "data_dir"})
    flags.update(_tokenizer_flags(settings))
    arrays = [data.arrays[name] for name in sorted(data.arrays)]
    return json.loads(json.dumps({
        "model": weights,
        "labels": labels, "flags": flags,
        f"{split} data": f"{len(arrays[0]) if arrays else 0} features, CRC "
                         f"{digest(*arrays):08x}"}, default=str))


def _results_taken_up(task: Task, common: FinetuneOptions, opts, made_from: dict) -> dict:
    """For a run taking its finished model up (`_the_finished_model`): the results in
    --output_dir that this command computed before it was stopped, by split ({split:
    summary}); they are not computed again.

    Raises:
      FinetuneError: a split's results there were made otherwise (naming what differs).
      OutputExistsError: a file of a split still to compute exists, written by no run that
        recorded its results (refused as before).
    """
    out = common.output_dir
    hint = "refusing to overwrite (choose another --output_dir or pass --overwrite_output)"
    taken: dict[str, dict] = {}
    for split, record in made_from.items():
        path = os.path.join(out, f"{split}_results.json")
        if not files.exists(path):
            continue
        try:
            earlier = files.read_json(path)
        except (OSError, ValueError):
            earlier = None
        recorded = earlier.get(MADE_FROM) if isinstance(earlier, dict) else None
        changed = (["what made them is not recorded"] if not isinstance(recorded, dict)
                   else _differences(recorded, record))
        if changed:
            raise FinetuneError(f"{path} exists, made otherwise ({'; '.join(changed)}); {hint}")
        taken[split] = earlier
    if taken:
        logging.info("%s: %s taken up (this command's, computed before it was stopped)", out,
                     " and ".join(f"{split}_results.json" for split in taken))
    # A split to compute writes its files; one of them existing without the split's results
    # (that file written last) was left by no finished run of this command. A file both
    # splits write (run_squad's predictions) is the taken-up split's.
    def written_by(split):
        only = dataclasses.replace(common, do_train=False, do_eval=split == "eval",
                                   do_predict=split == "predict")
        return set(task.output_files(only, opts))

    kept = set().union(*(written_by(split) for split in taken))
    pending = set().union(*(written_by(split) for split in made_from if split not in taken))
    files.refuse_existing([os.path.join(out, n) for n in sorted(pending - kept)], hint)
    return taken


def _differences(previous: dict, current: dict) -> list[str]:
    """What differs between two `_backup_identity` (or `_what_was_evaluated`) records, in
    words. What `previous` does not hold (recorded by a version that did not record it, as
    the tokenizer's flags) is not compared: the digests of the features and weights still
    tell runs apart."""
    changed = []
    for key in sorted(set(previous) | set(current)):
        old, new = previous.get(key), current.get(key)
        if old == new or key not in previous:
            continue
        if isinstance(old, dict) and isinstance(new, dict):  # flags, or RUNS_ON's settings
            changed += [f"{name if name in _NOT_FLAGS else '--' + name}: "
                        f"{old.get(name)!r} -> {new.get(name)!r}"
                        for name in sorted(set(old) | set(new))
                        if name in old and old.get(name) != new.get(name)]
        elif key in ("training data", "initial weights", "model") or key.endswith(" data"):
            changed.append(f"{key}: {old} -> {new}")
        else:
            changed.append(f"{key}: {old!r} -> {new!r}")
    return changed


def _read_inputs(task: Task, common: FinetuneOptions, opts, trained: bool = False):
    """Checks --output_dir and reads every input before anything is loaded or trained;
    returns (examples by split, {split: the earlier split reading the same file}, what the
    train split's reader reported, the labels given or found in the training data, whether
    they were given). The label list is read here only: --label_list_file may be a pipe,
    which gives its lines to one read.
    `trained`: the model in --output_dir may be this run's (`_recorded_training`), so its
    files are not refused here (`_the_finished_model` compares the runs)."""
    out = common.output_dir
    blocked = files.file_in_the_way(out)
    if blocked:  # checked before training: the TensorBoard writer would fail after it
        where = "" if blocked == os.path.abspath(out) else f": {blocked}"
        raise FinetuneError(f"--output_dir {out}{where} is a file; expected a directory")
    names = task.output_files(common, opts)
    # An --output_dir this process cannot write into is refused before the inputs are read
    # and the model loaded: an evaluation-only run wrote its results after the evaluation.
    files.check_writable([os.path.join(out, n) for n in names])
    if trained:
        # They may be this run's, taken up: `_the_finished_model` and `_results_taken_up`
        # compare what made them.
        names = []
    elif common.do_train and not files.exists(os.path.join(out, files.TASK_MODEL_FILE)):
        # Without model.keras, which save_task_dir renames into place last, the files
        # beside it are what an interrupted save left: written again, not refused.
        names = [n for n in names if n not in (files.TASK_MODEL_FILE, files.LABELS_FILE,
                                               files.TRAIN_RESULTS_FILE)]
    if not common.overwrite_output:
        files.refuse_existing([os.path.join(out, n) for n in names],
                              "refusing to overwrite (choose another --output_dir or pass "
                              "--overwrite_output)")
    # A split reading the same file as an earlier one (eval and predict often do) shares
    # its examples and features.
    wanted = [split for split, on in (("train", common.do_train), ("eval", common.do_eval),
                                      ("predict", common.do_predict)) if on]
    same_as = {}
    for split in wanted:
        path = task.input_file(split, opts)
        earlier = next((s for s in wanted[:wanted.index(split)] if s != "train"
                        and split != "train" and task.input_file(s, opts) == path), None)
        if earlier is not None:
            same_as[split] = earlier
    examples = {split: task.read(task.input_file(split, opts), split, opts)
                for split in wanted if split not in same_as}
    read_info = None
    if "train" in examples and isinstance(examples["train"], tuple):
        examples["train"], read_info = examples["train"]
    for split, found in examples.items():
        if len(found) == 0:
            raise FinetuneError(f"{task.input_file(split, opts)}: no examples in it (expected "
                                f"{task.name} data for {task.input_flag(split)})")
    labels = task.given_labels(opts)
    labels_given = labels is not None
    if labels is None and common.do_train:
        labels = task.labels_from(examples["train"])
        if (task.uses_labels and labels is not None and len(labels) < 2
                and not getattr(opts, "allow_single_class", False)):
            raise FinetuneError(
                f"{task.input_file('train', opts)}: every example has the label "
                f"{labels[0] if labels else None!r}; expected at least 2 classes (pass "
                "--allow_single_class to train a one-class model anyway)")
    return examples, same_as, read_info, labels, labels_given


def _what_was_read(task: Task, common: FinetuneOptions, opts, model, vocab_file, settings,
                   labels, features) -> dict:
    """For `Distribution.check_same_inputs`: {what was read: (digest, description)} of the
    model's weights (its head's seeded initialisation included), the vocabulary and each
    split's features (the labels with the training split's)."""
    from bert_keras.distribute import digest, vocabulary_read, weights_read

    if common.init_checkpoint:
        model_source = "--init_checkpoint"
    else:
        model_source = "--bert_config_file" if common.do_train else "the model in --output_dir"
    read = {model_source: weights_read(model.weights),
            "--vocab_file" if common.vocab_file else "the checkpoint's vocabulary":
                vocabulary_read(vocab_file, settings.to_json_dict())}
    for split, data in features.items():
        arrays = [data.arrays[name] for name in sorted(data.arrays)]
        flag = task.input_flag(split).split(" ")[0]
        read[flag] = (digest(*arrays, labels if split == "train" else None),
                      f"{len(arrays[0]) if arrays else 0} features")
    return read


def trained_steps(out: str, results: dict | None = None) -> int:
    """Training steps of the model evaluated: this run's (`results`, or its
    train_results.json, written before evaluation), or the earlier run's results."""
    if results and "train" in results:
        return int(results["train"]["num_train_steps"])
    try:
        return int(files.fine_tuned_with(out).get("num_train_steps", 0))
    except (TypeError, ValueError):
        return 0


def _log_eval_scalars(log_dir: str, summary: dict, step: int) -> None:
    """The evaluation's numbers (accuracy, F1, loss, ...) as TensorBoard scalars
    `eval_<name>` at the training step reached, beside the training curves; the numbers of
    a group one level down as `eval_<group>_<name>` (the tagger's entity precision,
    recall and F1: `eval_entity_f1`)."""
    def number(name, value):
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and not name.endswith(("_seconds", "_per_second"))

    writer = tf.summary.create_file_writer(log_dir)
    with writer.as_default(step=step):
        for name, value in summary.items():
            if number(name, value):
                tf.summary.scalar(f"eval_{name}", float(value))
            elif isinstance(value, dict):
                for inner, v in value.items():
                    if number(inner, v):
                        tf.summary.scalar(f"eval_{name}_{inner}", float(v))
    writer.close()


def _model_inputs(features: Features) -> dict:
    from data_prep.schema import model_inputs

    return model_inputs(features.arrays)


def labels_from_flags(label_list: Sequence[str] | None, label_list_file: str | None):
    """--label_list or --label_list_file (one label a line), else None."""
    if label_list_file:
        return model_loading.read_labels(label_list_file)
    if not label_list:
        return None
    return model_loading.check_labels([label.strip() for label in label_list], "--label_list",
                                      "item")


def expected_errors() -> tuple:
    """The errors a fine-tuning tool reports in one line (bad flags, files, data, models)."""
    from bert_keras.checkpoints import WeightLoadError
    from data_prep.classification import DataError
    from data_prep.schema import VocabError

    return (FinetuneError, DataError, model_loading.CheckpointError, WeightLoadError,
            VocabError, tokenizer_config.TokenizerConfigError, files.OutputExistsError,
            FileNotFoundError)


# Google's TPU flags: its scripts read them only with --use_tpu, which the tools that run
# on one host's GPUs and CPUs refuse (`with_googles_flags`).
GOOGLE_TPU_FLAGS = ("tpu_name", "tpu_zone", "gcp_project", "master", "num_tpu_cores",
                    "iterations_per_loop")
# The flags a run without --do_train does not read (Google's README passes them to its
# prediction-only run_squad command).
_TRAINING_ONLY_FLAGS = ("train_file", "train_batch_size", "gradient_accumulation_steps",
                        "learning_rate", "num_train_epochs", "num_train_steps",
                        "warmup_proportion", "save_checkpoints_steps")
# Google's flags the other flags do not cover, as `define_googles_flags` declares them:
# name -> (type, help).
_GOOGLE_FLAGS = {
    "predict_batch_size": (int, "Google's flag: prediction's batch size, which here is "
                           "--eval_batch_size's (taken as it when --eval_batch_size is not "
                           "given)."),
    "use_tpu": (bool, "Google's flag: true is refused (this tool runs on GPUs and CPUs; "
                "run_pretraining trains on TPUs)."),
    **{name: (int if name in ("num_tpu_cores", "iterations_per_loop") else str,
              "Google's TPU flag: read only with --use_tpu, which this tool refuses; unused, "
              "with a warning.") for name in GOOGLE_TPU_FLAGS},
    "verbose_logging": (bool, "Google's run_squad flag: unused, with a warning (the log "
                        "counts the training answers not found)."),
    "use_one_hot_embeddings": (bool, "Google's extract_features flag: unused, with a warning "
                               "(a one-hot product and a gather give the same vectors)."),
}
FINETUNING_GOOGLE_FLAGS = ("predict_batch_size", "use_tpu", *GOOGLE_TPU_FLAGS)


def define_googles_flags(names=FINETUNING_GOOGLE_FLAGS) -> dict:
    """Declares, for the calling tool, Google's flags `names` (keys of `_GOOGLE_FLAGS`) that
    name no option here, so that commands written for Google's scripts run as written;
    returns name -> FlagHolder. `with_googles_flags` says what each becomes (before, each
    was refused as an unknown flag)."""
    from absl import flags

    from data_prep import cli

    same = {"allow_override": True, "module_name": cli.calling_module()}
    define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, str: flags.DEFINE_string}
    return {name: define[_GOOGLE_FLAGS[name][0]](
                name, False if _GOOGLE_FLAGS[name][0] is bool else None, _GOOGLE_FLAGS[name][1],
                **same)
            for name in names}


def with_googles_flags(values: dict, google: dict, holders: dict, tool: str) -> dict:
    """`values` (flag name -> value) with the Google flags of `google` (name -> FlagHolder,
    `define_googles_flags`) given on the command line turned into `tool`'s; what is not
    used is warned about.

    Raises:
      FinetuneError: --use_tpu (these tools do not run on TPUs).
    """
    given = {name: holder.value for name, holder in google.items() if holder.present}
    if given.get("use_tpu"):
        raise FinetuneError(f"--use_tpu: {tool} runs on GPUs and CPUs, not TPUs "
                            "(run_pretraining trains on them); drop it")
    values = dict(values)
    batch = given.get("predict_batch_size")
    if batch is not None and not holders["eval_batch_size"].present:
        values["eval_batch_size"] = batch  # one batch size evaluates and predicts here
        logging.info("--predict_batch_size=%d: evaluation and prediction run %d examples a "
                     "batch (--eval_batch_size)", batch, batch)
    elif batch is not None and batch != values["eval_batch_size"]:
        logging.warning("--predict_batch_size=%d is not used: prediction runs at "
                        "--eval_batch_size=%d, which serves both (a batch size changes no "
                        "result)", batch, values["eval_batch_size"])
    unused = [f"--{name}" for name in GOOGLE_TPU_FLAGS if name in given]
    if unused:
        logging.warning("%s: not used (Google's scripts read %s only with --use_tpu)",
                        ", ".join(unused), "it" if len(unused) == 1 else "them")
    if "verbose_logging" in given:
        logging.warning("--verbose_logging: not used (with it Google's run_squad logs the "
                        "answers it cannot align with their context; the log here counts the "
                        "training answers not found)")
    if "use_one_hot_embeddings" in given:
        logging.warning("--use_one_hot_embeddings: not used (Google's TPU way to look up "
                        "embeddings; a gather gives the same vectors)")
    return values


# transformers' example scripts' flags (run_glue.py, run_ner.py, run_qa.py and the
# TrainingArguments they parse) that a transformers user types out of habit, as
# `define_transformers_flags` declares them: name -> (type, help). Where one means exactly
# what one of ours means, the tool's alias table (`TRANSFORMERS_ALIASES`) names ours; the
# others are taken only at the value that changes nothing here (`with_transformers_flags`).
_TRANSFORMERS_FLAGS = {
    "model_name_or_path": (str, "transformers' name for --init_checkpoint (a local "
                           "save_pretrained directory, or any form it takes; nothing is "
                           "downloaded from the Hub)."),
    # Its flag per tool (run_squad scores its --predict_file): `define_transformers_flags`.
    "validation_file": (str, "transformers' name for --{target}, the file the tool scores."),
    "test_file": (str, "transformers' name for --predict_file."),
    "per_device_train_batch_size": (int, "transformers' name for --train_batch_size (on one "
                                    "device; refused with --distribution_strategy=mirrored, "
                                    "where --train_batch_size is the global batch)."),
    "per_device_eval_batch_size": (int, "transformers' name for --eval_batch_size (on one "
                                   "device, as --per_device_train_batch_size)."),
    "overwrite_output_dir": (bool, "transformers' name for --overwrite_output."),
    "warmup_ratio": (float, "transformers' name for --warmup_proportion."),
    "warmup_steps": (int, "transformers' flag: 0 (let the ratio decide, as transformers "
                     "does) is taken; another value is refused (give --warmup_proportion)."),
    "weight_decay": (float, "transformers' flag: 0.01, the AdamW decay these tools train "
                     "with (Google's), is taken; another value is refused."),
    "text_column_name": (str, "transformers' name for --text_a_column."),
    "label_column_name": (str, "transformers' name for --label_column."),
}
# transformers' flag -> ours, where it means exactly what ours means (the fine-tuning tools
# but run_squad; per tool: `define_transformers_flags`).
TRANSFORMERS_ALIASES = {
    "model_name_or_path": "init_checkpoint", "validation_file": "eval_file",
    "test_file": "predict_file", "per_device_train_batch_size": "train_batch_size",
    "per_device_eval_batch_size": "eval_batch_size", "overwrite_output_dir": "overwrite_output",
    "warmup_ratio": "warmup_proportion", "text_column_name": "text_a_column",
    "label_column_name": "label_column",
}
# run_tagger's: its files are CoNLL's or run_ner's JSON lines, whose keys are not columns.
TAGGER_TRANSFORMERS_ALIASES = {name: target for name, target in TRANSFORMERS_ALIASES.items()
                               if name not in ("text_column_name", "label_column_name")}
# run_squad's: it scores the --predict_file it predicts (run_qa's --do_eval reads
# --validation_file, its --do_predict --test_file).
SQUAD_TRANSFORMERS_ALIASES = {**TAGGER_TRANSFORMERS_ALIASES, "validation_file": "predict_file"}
# The ones that are no alias, and the one value of each that changes nothing here.
# (--gradient_accumulation_steps is a flag of ours, with transformers' name and meaning.)
_TRANSFORMERS_NO_OP = {"warmup_steps": 0, "weight_decay": 0.01}
# Why another value is refused, in the error line.
_TRANSFORMERS_REFUSALS = {
    "warmup_steps": "warmup is a fraction of the training steps here, whose number is known "
                    "once the data is read: give --warmup_proportion (N steps of M is N/M)",
    "weight_decay": "the tools train with AdamW's decay at 0.01, Google's (LayerNorm and biases "
                    "left out, as transformers leaves them out); no other rate is offered",
}


def define_transformers_flags(aliases: dict) -> dict:
    """Declares, for the calling tool, transformers' flags: `aliases` (transformers' name ->
    the tool's flag it is) and those of `_TRANSFORMERS_NO_OP`; returns name -> (FlagHolder,
    the tool's flag or None). `with_transformers_flags` says what each becomes (before,
    each was refused as an unknown flag)."""
    from absl import flags

    from data_prep import cli

    same = {"allow_override": True, "module_name": cli.calling_module()}
    define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, str: flags.DEFINE_string,
              float: flags.DEFINE_float}
    out = {}
    for name, target in {**aliases, **dict.fromkeys(_TRANSFORMERS_NO_OP)}.items():
        kind, help_text = _TRANSFORMERS_FLAGS[name]
        help_text = help_text.replace("{target}", target or "")
        out[name] = (define[kind](name, False if kind is bool else None, help_text, **same),
                     target)
    return out


def with_transformers_flags(values: dict, given_flags: dict, holders: dict) -> dict:
    """`values` (flag name -> value) with transformers' flags given on the command line
    (`define_transformers_flags`' holders) turned into the tool's.

    Raises:
      FinetuneError: one given with the flag it stands for (or two for one flag) at
        another value; a per-device batch size with several devices; a flag of
        `_TRANSFORMERS_NO_OP` at a value that would change training here.
    """
    values = dict(values)
    taken = {}  # our flag -> the transformers flag that gave it
    for name, (holder, target) in given_flags.items():
        if not holder.present:
            continue
        value = holder.value
        if target is None:
            if value != _TRANSFORMERS_NO_OP[name]:
                raise FinetuneError(f"--{name}={value}: not taken ({_TRANSFORMERS_REFUSALS[name]})")
            logging.info("--%s=%s: as here (nothing to change)", name, value)
            continue
        if name.startswith("per_device_") and values.get("distribution_strategy") != "default":
            raise FinetuneError(
                f"--{name}={value}: with --distribution_strategy="
                f"{values.get('distribution_strategy')} --{target} is the global batch, split "
                f"over the devices: give --{target} (per-device batch x devices)")
        if target in taken and values[target] != value:
            raise FinetuneError(f"--{name}={value} and --{taken[target]}={values[target]}: both "
                                f"are --{target} here; give one")
        if target in holders and holders[target].present and holders[target].value != value:
            raise FinetuneError(f"--{name}={value} and --{target}={holders[target].value}: "
                                f"--{name} is transformers' name for --{target}; give one")
        if name == "model_name_or_path" and value and not _a_local_model(value):
            raise FinetuneError(
                f"--model_name_or_path={value}: no such directory or checkpoint; nothing is "
                "downloaded from the Hugging Face Hub here: save the model with "
                "save_pretrained (or `hf download`) and pass its directory")
        values[target] = value
        taken[target] = name
        logging.info("--%s: transformers' name for --%s", name, target)
    unread = [f"--{name}" for name, (holder, target) in given_flags.items()
              if holder.present and target in _TRAINING_ONLY_FLAGS]
    if unread and not values.get("do_train"):  # as `_warn_of_training_flags` says of ours
        logging.warning("%s: not used without --do_train (nothing is trained)",
                        ", ".join(unread))
    return values


def _a_local_model(path: str) -> bool:
    """Whether `path` names something on disk (or in a bucket) that --init_checkpoint could
    read: a directory, a file, or a Google checkpoint prefix's files."""
    return files.exists(path) or bool(files.glob_files(glob.escape(path) + ".*"))


def _warn_of_training_flags(values: dict, holders: dict) -> None:
    """Training flags given to a run that trains nothing are not read: said, not silently
    dropped (Google's README passes them to its prediction-only run_squad command)."""
    if values.get("do_train"):
        return
    given = [f"--{name}" for name in _TRAINING_ONLY_FLAGS
             if name in holders and holders[name].present]
    if given:
        logging.warning("%s: not used without --do_train (nothing is trained)",
                        ", ".join(given))


def main(task: Task, argv, holders: dict, tokenizer_flags: dict,
         google_flags: dict | None = None, transformers_flags: dict | None = None) -> int:
    """The body of a fine-tuning tool's absl main: flags -> `run`, errors in one line.
    `google_flags`: `define_googles_flags`' holders (run_classifier, run_squad);
    `transformers_flags`: `define_transformers_flags`' (every fine-tuning tool)."""
    from absl import app

    from data_prep.cli import report_errors, values_from_flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = values_from_flags(holders)
    values.update(tokenizer_config.overrides_from_flags(tokenizer_flags))
    prog = os.path.basename(argv[0]).removesuffix(".py")

    def body() -> int:
        nonlocal values
        if google_flags:
            values = with_googles_flags(values, google_flags, holders, prog)
        if transformers_flags:
            values = with_transformers_flags(values, transformers_flags, holders)
        _warn_of_training_flags(values, holders)
        run(task, values)
        return 0

    return report_errors(body, expected_errors(), prog,
                         on_interrupt=f"rerun the same command {TO_RESUME}")
