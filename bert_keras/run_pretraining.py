r"""Pretrains BERT (masked LM + next sentence) with Keras `fit`: TensorFlow (any tf.distribute
strategy) or JAX (`KERAS_BACKEND=jax`, keras.distribution, across processes too;
docs/backends.md, docs/distributed.md).

    python -m bert_keras.run_pretraining \
      --input_file='data/train-*.tfrecord' --eval_input_file=data/heldout.tfrecord \
      --preset=mini --vocab_file=vocab.txt --output_dir=runs/phase1 \
      --max_seq_length=128 --max_predictions_per_seq=20 --train_batch_size=32 \
      --num_train_steps=10000 --num_warmup_steps=1000 --learning_rate=1e-4 \
      --save_checkpoints_steps=1000

Flag names follow Google's run_pretraining.py. Data from `create_pretraining_data
--dynamic_masking` holds no masks: this trainer masks it anew on every pass
(bert_keras/masking.py) at --masked_lm_prob (default 0.15; e.g. 0.3 as in MosaicBERT and
Wettig et al.), with --do_whole_word_mask for whole words; --max_predictions_per_seq then
defaults to ceil(max_seq_length * masked_lm_prob). --next_sentence_prediction=false trains
the masked LM alone (RoBERTa): no NSP loss or metric (the NSP head stays in the saved
weights, untrained). Phase 2 (sequence length 512) is a new run
with `--init_checkpoint=runs/phase1` (its weights, not its optimizer state) and the phase-2
data's lengths. Without --bert_config_file and --preset the model is --init_checkpoint's
(continued pretraining from Google's or transformers' checkpoints, BertForMaskedLM included:
its pooler and NSP head, which it lacks, start from their initialisation).

Layout of --output_dir:
    run_config.json           the flags that define the run and digests of the files they
                              name; a rerun must match them (the files may have moved)
    bert_config.json          the model config
    vocab.txt, tokenizer_config.json  the vocabulary and its settings, as encoder/ gets
                              them (written at the start: the checkpoints' vocabulary)
    logs/                     TensorBoard (train/ and validation/)
    history.csv               train and held-out metrics after every checkpoint interval
    backup/                   resumption state (bert_keras.backup): weights, optimizer,
                              dropout random state and step, every save_checkpoints_steps,
                              plus the previous one (removed when the run completes)
    checkpoints/              ckpt-<step>.weights.h5: periodic checkpoints (weights + optimizer),
                              the last --keep_checkpoint_max of them
    pretrainer.weights.h5     final pretrainer weights (encoder + heads, no optimizer state)
    encoder/                  what fine-tuning and export load:
        encoder.weights.h5    BertEncoder weights
        bert_config.json      its config
        vocab.txt             copied from --vocab_file (if given, else from
                              --init_checkpoint's vocab.txt, if it has one)
        tokenizer_config.json the tokenizer settings: from the data's sidecars (what
                              create_pretraining_data used), else beside --vocab_file,
                              else the flags
    eval_results.json         final held-out metrics (if --eval_input_file)
    eval_results.txt          the same as Google's run_pretraining writes them (its metric
                              names, `key = value` lines)

--do_train=false --do_eval (Google's evaluation-only run) evaluates --init_checkpoint's
model (else --output_dir's finished run) on --eval_input_file, else --input_file, and
writes only output_dir/eval_results.json and eval_results.txt (docs/pretraining.md).

Resumption: rerunning the same command after a crash (even kill -9, at any moment: during
a step, an evaluation or a backup write) resumes from the last backup. Epochs are checkpoint
intervals (`save_checkpoints_steps` optimizer steps; the last one is shorter when it does
not divide num_train_steps), so the backup is always at an epoch boundary; the number of
finished steps is read from the restored optimizer, and the input pipeline (deterministic
for a given --seed) skips exactly the batches those steps consumed. The backup also holds
the dropout random state, so nothing is repeated or skipped and, with --deterministic, the
final weights are bit-identical to an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import sys

from absl import app, flags, logging


from bert_keras.distribute import (DistributionOptions, StrategyError, accumulation_refusal,
                                   batch_refusal, kept_by_a_resume)
from bert_keras.precision import check_mixed_precision, mixed_precision_option
from data_prep import cli, files, tokenizer_config

# TensorFlow is imported lazily in `train`, so that --help and flag errors are instant.


class PretrainingError(ValueError):
    """A problem with the flags, the data or output_dir; the message is meant for users."""


opt = cli.option

# What a run_config.json written before these flags existed ran with.
_RECORDED_BEFORE_FLAG = {"lr_schedule": "google", "epsilon_placement": "keras"}


@dataclasses.dataclass(frozen=True)
class PretrainingOptions(DistributionOptions):
    """Everything a pretraining run needs; each field with help text is a flag (Google's names;
    where to train: `DistributionOptions`)."""

    input_file: str = opt(None, "Training TFRecords: comma-separated files or globs.",
                          required=True)
    output_dir: str = opt(None, "Where checkpoints, logs and the final weights go.",
                          required=True)
    bert_config_file: str | None = opt(None, "bert_config.json of the model (or use --preset; "
                                       "with neither, --init_checkpoint's model is trained).")
    preset: str | None = opt(None, "Model size instead of --bert_config_file: tiny, mini, small, "
                             "medium, base, large (vocab_size from --vocab_file if given).")
    vocab_file: str | None = opt(None, "WordPiece vocab the data was made with; saved into "
                                 "output_dir/encoder/ with its tokenizer settings (default: "
                                 "the vocab.txt found with --init_checkpoint, else the one "
                                 "the data's sidecars name while its sha256 matches).")
    init_checkpoint: str | None = opt(
        None, "Initial weights: a run's output_dir, an encoder/ dir, a .weights.h5 file "
        "(pretrainer or encoder), a .keras file, a Hugging Face BERT dir or a Google checkpoint "
        "(bert_model.ckpt; its MLM/NSP heads are used too). Its model config is the run's "
        "unless --bert_config_file or --preset is given. A resumed run continues from its "
        "backup instead.")
    eval_input_file: str | None = opt(
        None, "Held-out TFRecords evaluated after every checkpoint interval.")
    max_seq_length: int = opt(128, "Sequence length the data was written with.")
    max_predictions_per_seq: int | None = opt(
        None, "Masked positions per sequence: what masked data was written with (default "
        "20); for data without masks the prediction slots, default ceil(max_seq_length * "
        "masked_lm_prob).")
    masked_lm_prob: float | None = opt(
        None, "For data without masks (create_pretraining_data --dynamic_masking): share of "
        "tokens predicted, chosen anew on every pass (default 0.15). Masked data fixed it "
        "when it was written.")
    do_whole_word_mask: bool = opt(
        False, "For data without masks: mask whole words (a piece and its '##' pieces).")
    next_sentence_prediction: bool = opt(
        True, "Train the next-sentence head (BERT); false: masked LM only (RoBERTa), no NSP "
        "loss or metric.")
    train_batch_size: int = opt(32, "Global batch size of one micro-batch (all replicas "
                                "together).")
    eval_batch_size: int = opt(8, "Global evaluation batch size.")
    num_train_steps: int = opt(100000, "Optimizer updates in total.")
    num_warmup_steps: int = opt(10000, "Updates of linear learning-rate warmup.")
    learning_rate: float = opt(1e-4, "Peak learning rate.")
    optimizer: str = opt("adamw", "Optimizer: adamw, lamb (as published: decay inside the "
                         "trust ratio, none on LayerNorm/biases) or keras_lamb (Keras' variant).",
                         enum=["adamw", "lamb", "keras_lamb"])
    lr_schedule: str = opt("linear", "Learning-rate curve: linear = warmup to the peak, then "
                           "linear decay to 0 (Model Garden, transformers); google = Google's "
                           "TF1 curve (decay from step 0; for exact reproduction).",
                           enum=["linear", "google"])
    epsilon_placement: str = opt("adam_paper", "Where Adam's epsilon goes: adam_paper = "
                                 "sqrt(v_hat) + eps (torch, Adam's algorithm 1); keras = "
                                 "outside the bias correction (Keras' Adam).",
                                 enum=["adam_paper", "keras"])
    weight_decay: float = opt(0.01, "Decoupled weight decay (not on LayerNorm and biases).")
    save_checkpoints_steps: int = opt(1000, "Updates between checkpoints (and evaluations); "
                                      "the last interval is shorter if it does not divide "
                                      "num_train_steps.")
    keep_checkpoint_max: int = opt(3, "Periodic checkpoints kept in output_dir/checkpoints.")
    steps_per_execution: int = opt(1, "Micro-batches run per compiled call (tf.function "
                                   "or jax.jit; fewer host round trips); must divide the "
                                   "checkpoint intervals and --max_eval_steps.")
    gradient_accumulation_steps: int = opt(1, "Micro-batches averaged into one update.")
    mixed_precision: str = mixed_precision_option("Keras dtype policy.")
    jit_compile: bool = opt(False, "Compile the train step with XLA.")
    max_eval_steps: int = opt(100, "Evaluation batches per evaluation (the eval files are "
                              "cycled).")
    skip_damaged_shards: bool = opt(
        False, "Leave out input or eval shards that are cut short or corrupt, or hold other "
        "records than their sidecar says (each is logged), instead of refusing to start.")
    seed: int = opt(12345, "Seed for initialization, dropout and data order.")
    deterministic: bool = opt(False, "Enable TF op determinism (bit-reproducible runs; slower).")
    log_steps: int = opt(100, "Micro-batches between TensorBoard points.")
    # Tokenizer settings for output_dir/encoder/: None = as the data's sidecars (or the
    # vocabulary's tokenizer_config.json) say; the flags come from tokenizer_config.
    do_lower_case: bool | None = None
    strip_accents: bool | None = None
    tokenize_chinese_chars: bool | None = None
    verbose: int | str = "auto"  # Keras progress: "auto" = bar on a terminal, lines otherwise.
    # False: evaluate a trained model only (Google's --do_train=false; `evaluate`).
    do_train: bool = True
    autotune: bool = True  # tf.data autotuning (tests turn it off; docs/DESIGN.md section 9).

    # Fields that may differ between the first run and a resumed one.
    _RESUMABLE_CHANGES = ("verbose", "autotune", "log_steps", "keep_checkpoint_max",
                          "max_eval_steps", "eval_batch_size", "eval_input_file",
                          # Where the processes run (a resumed job may use other hosts).
                          "coordinator_address", "num_processes", "process_id")

    def tokenizer_overrides(self) -> dict:
        return {name: getattr(self, name) for name in tokenizer_config.SETTINGS
                if getattr(self, name) is not None}

    # Where and how the steps run: the same function with other dropout masks (each
    # backend's, XLA's and each replica's random streams). A resumed run may change them,
    # with a warning (as the fine-tuning tools and a change of KERAS_BACKEND).
    RUNS_ON = ("distribution_strategy", "tpu", "num_cpu_devices", "jit_compile")

    def run_identity(self) -> dict:
        """The fields a resumed run must share with the interrupted one."""
        values = dataclasses.asdict(self)
        return {k: v for k, v in values.items() if k not in self._RESUMABLE_CHANGES}

    def validate(self) -> None:
        """Raises PretrainingError for inconsistent values (before anything is built)."""
        for name in ("input_file", "output_dir"):
            if not getattr(self, name):
                raise PretrainingError(f"--{name} is required")
        cli.check_seed(self.seed)
        if self.bert_config_file is not None and self.preset is not None:
            raise PretrainingError("give only one of --bert_config_file and --preset")
        if (self.bert_config_file is None and self.preset is None and not self.init_checkpoint
                and self.do_train):  # an evaluation may read --output_dir's model
            raise PretrainingError("give --bert_config_file or --preset (or --init_checkpoint, "
                                   "whose model config is then used)")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise PretrainingError(f"--max_predictions_per_seq must be >= 1, got "
                                   f"{self.max_predictions_per_seq}")
        if self.masked_lm_prob is not None and not 0 < self.masked_lm_prob <= 1:
            raise PretrainingError(f"--masked_lm_prob must be in (0, 1], got "
                                   f"{self.masked_lm_prob}")
        positive = ("max_seq_length", "train_batch_size",
                    "eval_batch_size", "num_train_steps", "save_checkpoints_steps",
                    "steps_per_execution", "gradient_accumulation_steps", "keep_checkpoint_max",
                    "max_eval_steps", "log_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise PretrainingError(f"--{name} must be >= 1, got {getattr(self, name)}")
        self.check_distribution()
        check_mixed_precision(self.mixed_precision)
        if not self.learning_rate > 0:
            raise PretrainingError(f"--learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.weight_decay < 1:
            raise PretrainingError(f"--weight_decay must be in [0, 1), got {self.weight_decay}")
        if self.deterministic and self.jit_compile:
            # Keras compiles nothing with XLA while op determinism is on (not every XLA op
            # is deterministic); it would only warn and run the graph.
            raise PretrainingError(
                "--jit_compile cannot be combined with --deterministic: Keras does not "
                "compile with XLA while TensorFlow's op determinism is on. Drop one of them")
        if not 0 <= self.num_warmup_steps <= self.num_train_steps:
            raise PretrainingError(
                f"--num_warmup_steps={self.num_warmup_steps} must be in [0, "
                f"num_train_steps={self.num_train_steps}]")
        # Any --num_train_steps with any --save_checkpoints_steps: the last interval is
        # shorter when they do not divide. A tf.function call runs steps_per_execution
        # micro-batches, so it must fit every interval, the last one included.
        accumulation = self.gradient_accumulation_steps
        intervals = {self.save_checkpoints_steps * accumulation}
        if self.num_train_steps % self.save_checkpoints_steps:
            intervals.add(self.num_train_steps % self.save_checkpoints_steps * accumulation)
        for micro_batches in sorted(intervals, reverse=True):
            if micro_batches % self.steps_per_execution:
                raise PretrainingError(
                    f"--steps_per_execution={self.steps_per_execution} must divide the "
                    f"{micro_batches} micro-batches of a checkpoint interval "
                    f"(--save_checkpoints_steps={self.save_checkpoints_steps}, last interval "
                    f"of --num_train_steps={self.num_train_steps}, times "
                    f"--gradient_accumulation_steps={accumulation})")
        if (self.do_train and self.eval_input_file
                and self.max_eval_steps % self.steps_per_execution):
            # Keras evaluates in whole calls: steps=3 at 2 a call reads 4 batches.
            raise PretrainingError(
                f"--steps_per_execution={self.steps_per_execution} must divide "
                f"--max_eval_steps={self.max_eval_steps}: Keras evaluates whole calls of "
                f"{self.steps_per_execution} batches, so the evaluations would read "
                f"{-(-self.max_eval_steps // self.steps_per_execution) * self.steps_per_execution}")
        if (self.max_predictions_per_seq or 0) > self.max_seq_length:
            raise PretrainingError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} exceeds "
                f"--max_seq_length={self.max_seq_length}")


# Google's defaults, for statically masked data and for data masked here.
DEFAULT_MAX_PREDICTIONS_PER_SEQ = 20
DEFAULT_MASKED_LM_PROB = 0.15


def resolve_masking(options: PretrainingOptions, kind: str, source: str):
    """Fills in the masking flags for the data's kind; returns (options, DynamicMasking or None).

    Statically masked data ("static") fixed its masks when it was written: --masked_lm_prob
    and --do_whole_word_mask are refused, --max_predictions_per_seq defaults to 20. Data
    without masks ("dynamic") is masked here: it needs --vocab_file (for [MASK], [CLS],
    [SEP], [PAD] and the "##" pieces), --masked_lm_prob defaults to 0.15 and
    --max_predictions_per_seq to ceil(max_seq_length * masked_lm_prob); a smaller value that
    would cap the masking rate is refused.

    Args:
      options: the run's settings.
      kind: "static" or "dynamic" (`inputs.input_masking` of the training files).
      source: a training file, named in errors.

    Raises:
      PretrainingError: one line naming the flag and why it does not fit the data.
    """
    from bert_keras import masking
    from data_prep import features

    if kind != features.DYNAMIC_MASKING:
        for flag, given in (("masked_lm_prob", options.masked_lm_prob is not None),
                            ("do_whole_word_mask", options.do_whole_word_mask)):
            if given:
                raise PretrainingError(
                    f"--{flag} applies to data without masks (create_pretraining_data "
                    f"--dynamic_masking); {source} was masked when it was written")
        if options.max_predictions_per_seq is None:
            options = dataclasses.replace(
                options, max_predictions_per_seq=DEFAULT_MAX_PREDICTIONS_PER_SEQ)
        return options, None
    if not options.vocab_file:
        raise PretrainingError(f"{source} has no masks (create_pretraining_data "
                               "--dynamic_masking): pass --vocab_file, masking needs its "
                               "[MASK] and '##' ids")
    prob = options.masked_lm_prob or DEFAULT_MASKED_LM_PROB
    needed = masking.budget(options.max_seq_length - 3, prob, options.max_seq_length)
    predictions = options.max_predictions_per_seq
    if predictions is None:
        predictions = masking.derived_max_predictions(options.max_seq_length, prob)
    elif predictions < needed:
        raise PretrainingError(
            f"--max_predictions_per_seq={predictions} would cap --masked_lm_prob={prob} at "
            f"--max_seq_length={options.max_seq_length} (a full sequence needs {needed}); "
            "leave it out to derive it or raise it")
    options = dataclasses.replace(options, masked_lm_prob=prob,
                                  max_predictions_per_seq=predictions)
    try:
        dynamic = masking.DynamicMasking.from_vocab(
            _load_vocab(options.vocab_file), prob, predictions, options.do_whole_word_mask)
    except ValueError as e:
        raise PretrainingError(str(e)) from None
    return options, dynamic


def check_replicas(options: PretrainingOptions, num_replicas: int,
                   tf_distribute: bool = True, resuming: str | None = None) -> None:
    """Raises PretrainingError for settings Keras 3.15.1 cannot run on `num_replicas`.

    The batch sizes must divide on either backend; the evaluation's only when there is
    held-out data (its default of 8 refused runs on 3 or 6 replicas that never evaluate).
    The other two limits are bugs of Keras under tf.distribute (`tf_distribute`: the
    replicas are a TensorFlow strategy's), seen here with MirroredStrategy on 2 logical
    CPUs; TPUs are not checked (no TPU to test on).
    Keras' DataParallel on JAX has neither: accumulation and multi-step calls train there
    the weights of one device (tests/test_run_pretraining_jax.py, 2 processes).
    `resuming`: the --output_dir of an interrupted run this one resumes, whose training
    flags cannot change: the refusal says on what to resume it (`distribute.kept_by_a_resume`).
    """
    batches = ["train_batch_size"] + (["eval_batch_size"] if options.eval_input_file else [])
    for name in batches:
        refusal = batch_refusal(name, getattr(options, name), num_replicas, resuming,
                                resumable=name in options._RESUMABLE_CHANGES)
        if refusal:
            raise PretrainingError(refusal)
    if num_replicas == 1 or not tf_distribute:
        return
    refusal = accumulation_refusal(options.gradient_accumulation_steps, num_replicas,
                                   tf_distribute, resuming)
    if refusal:
        raise PretrainingError(refusal)
    if options.steps_per_execution > 1 and options.distribution_strategy != "tpu":
        # The multi-step loop (tf.while_loop + tf.cond over get_next_as_optional) fails with
        # "You must feed a value for placeholder tensor" under MirroredStrategy:
        # https://github.com/keras-team/keras/issues/19246
        raise PretrainingError(
            f"--steps_per_execution={options.steps_per_execution} fails with "
            f"{num_replicas} replicas on TensorFlow in Keras 3.15.1 (keras-team/keras#19246); "
            + kept_by_a_resume(resuming, f"--steps_per_execution={options.steps_per_execution}",
                               "one replica (--distribution_strategy=default) or on "
                               "KERAS_BACKEND=jax", "use 1"))


# ---------------------------------------------------------------------------------------
# Model, weights and output directory


def config_source(options: PretrainingOptions) -> str:
    """Where the run's model config comes from, as error messages name it."""
    if options.bert_config_file:
        return options.bert_config_file
    if options.preset:
        return f"--preset={options.preset}"
    return f"--init_checkpoint {options.init_checkpoint}"


def load_bert_config(options: PretrainingOptions, initial=None):
    """The BertConfig from --bert_config_file, or from --preset (+ vocab size of --vocab_file),
    or else that of --init_checkpoint (`initial`, from `load_initial_weights`)."""
    from bert_keras.config import BertConfig

    if options.bert_config_file:
        try:
            return BertConfig.from_json_file(options.bert_config_file)
        except FileNotFoundError:  # config.py's message names the file, not the flag
            raise PretrainingError(f"--bert_config_file {options.bert_config_file}: no such "
                                   "file; expected a bert_config.json") from None
    if not options.preset:
        return initial.config
    overrides = {}
    if options.vocab_file:
        overrides["vocab_size"] = len(_load_vocab(options.vocab_file))
    return BertConfig.from_preset(options.preset, **overrides)


def _load_vocab(path: str) -> list[str]:
    from data_prep.schema import VocabError, load_vocab

    try:
        return load_vocab(path)
    except VocabError as e:
        raise PretrainingError(f"--vocab_file: {e}") from None


def _check_vocab_fits(options, config, initial=None) -> None:
    from bert_keras import model_loading
    from data_prep.schema import VocabError

    if options.vocab_file and not (options.bert_config_file or options.preset):
        try:  # the model's table may have a few rows more than the vocabulary has tokens
            model_loading.check_vocab_fits(initial.encoder, options.vocab_file,
                                           options.init_checkpoint)
        except (VocabError, model_loading.VocabMismatchError) as e:
            raise PretrainingError(f"--vocab_file: {e}") from None
    if options.vocab_file and initial is not None:  # embeddings trained on other ids
        try:
            initial.check_same_vocabulary(options.vocab_file)
        except (VocabError, model_loading.VocabMismatchError) as e:
            raise PretrainingError(str(e)) from None
    if options.vocab_file and options.bert_config_file:
        size = len(_load_vocab(options.vocab_file))
        if size != config.vocab_size:
            raise PretrainingError(
                f"--vocab_file {options.vocab_file} has {size} tokens but "
                f"{options.bert_config_file} says vocab_size={config.vocab_size}")
    if options.max_seq_length > config.max_position_embeddings:
        raise PretrainingError(  # a phase 2 at 512 from a phase 1 made with a shorter table
            f"--max_seq_length={options.max_seq_length} exceeds max_position_embeddings="
            f"{config.max_position_embeddings} of the model from {config_source(options)}: "
            f"its position table has no rows past {config.max_position_embeddings}")


def _sound_files(flag: str, paths: list[str], skip_damaged: bool) -> list[str]:
    """The shards of --`flag` whose framing and record counts are whole (inputs.check_integrity).

    Raises:
      PretrainingError: a damaged shard (without --skip_damaged_shards), naming the file, the
        records expected and found, and both ways on; or shards holding no record at all.
    """
    from bert_keras.inputs import NoRecordsError, check_integrity
    from data_prep.features import DamagedDataError

    try:
        return check_integrity(paths, skip_damaged=skip_damaged, warn=logging.warning)
    except NoRecordsError as e:  # Before, fit waited for a first batch forever.
        raise PretrainingError(f"--{flag}: {e}") from None
    except DamagedDataError as e:
        how = ("rewrite it (rerun create_pretraining_data with the same flags) or pass "
               "--skip_damaged_shards to train without it" if not skip_damaged else
               "rewrite the data (rerun create_pretraining_data)")
        raise PretrainingError(f"--{flag}: {e}. {how.capitalize()}") from None


def tokenizer_settings(options: PretrainingOptions, input_files: list[str], initial=None):
    """The tokenizer settings to save with the encoder, and where they came from.

    From the data's sidecars when it has them (create_pretraining_data records them), else
    from the tokenizer_config.json beside --vocab_file, else those saved with
    --init_checkpoint (`initial`), else BERT's defaults (Google's files carry none);
    explicit flags override. The data's vocabulary checksum must match --vocab_file: a
    model trained on ids of one vocabulary is useless with another. Data tokenized otherwise
    than --init_checkpoint's model was (a cased Korean model fed lowercased, accent-stripped
    text: jamo instead of syllables) is refused unless the tokenizer flags are given.
    """
    from data_prep import features

    try:
        recorded = features.data_tokenizer_settings(input_files)
    except ValueError as e:
        raise PretrainingError(f"--input_file: {e}") from None
    saved = None
    if recorded is not None:
        config, source, vocab_sha = recorded
        saved = (config, source)
        if options.vocab_file and vocab_sha and files.sha256_file(options.vocab_file) != vocab_sha:
            if initial is not None and options.vocab_file == initial.vocab_file:
                raise PretrainingError(  # the vocabulary came with --init_checkpoint
                    f"--input_file: the data was made with another vocabulary (sha256 "
                    f"{vocab_sha[:12]}..., {source}) than --init_checkpoint "
                    f"{options.init_checkpoint}'s model ({options.vocab_file}), whose "
                    "embeddings were trained on that one's ids; remake the data with "
                    f"create_pretraining_data --vocab_file={options.vocab_file} (or, for a "
                    "vocabulary that is the model's with [unused] tokens replaced, pass it "
                    "as --vocab_file)")
            raise PretrainingError(
                f"--vocab_file {options.vocab_file} is not the vocabulary the data was made "
                f"with (its sha256 differs from the one recorded in {source}); pass the "
                "vocab_file given to create_pretraining_data")
        model = initial.saved_tokenizer if initial is not None else None
        if (model is not None and not options.tokenizer_overrides()
                and not config.same_tokenization(model[0])):
            raise PretrainingError(
                f"--input_file: the data was tokenized with {config.describe()} ({source}), "
                f"but --init_checkpoint {options.init_checkpoint}'s model with "
                f"{model[0].describe()} ({model[1]}); rerun create_pretraining_data with the "
                "model's settings, or give run_pretraining the tokenizer flags to train it "
                "on this data anyway")
    elif options.vocab_file:
        saved = tokenizer_config.read_for_vocab(options.vocab_file)
    if saved is None and initial is not None:
        saved = initial.saved_tokenizer
    return tokenizer_config.resolve(options.vocab_file, options.tokenizer_overrides(), saved,
                                    warn=logging.warning)


def load_initial_weights(path: str, bert_config_file: str | None = None, want: str = "auto",
                         flag: str = "--init_checkpoint"):
    """Loads --init_checkpoint (any form `model_loading` accepts) as a
    `model_loading.Checkpoint`: its model is a pretrainer when the checkpoint has pretraining
    heads (a run's output_dir, a pretrainer's .weights.h5 or .keras file, Google's and
    Hugging Face's pretraining checkpoints, BertForMaskedLM's masked LM alone), else an
    encoder (or a fine-tuned model, whose encoder is used); want="pretrainer" requires the
    heads. Errors name `flag`."""
    from bert_keras import checkpoints, model_loading

    try:
        return model_loading.load_checkpoint(path, bert_config_file, want=want)
    except (model_loading.CheckpointError, checkpoints.WeightLoadError, FileNotFoundError) as e:
        raise PretrainingError(f"{flag} {e}") from None


# What makes a model of one config compute another function or hold other shapes.
_MODEL_DEFINING = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size", "hidden_act", "max_position_embeddings",
                   "type_vocab_size")


def check_initial_fits(initial, config, options: PretrainingOptions) -> None:
    """Refuses --init_checkpoint when its model is not the run's (before anything is
    written), naming every field that differs."""
    theirs = initial.config
    differ = [f"{name} {getattr(theirs, name)!r} vs {getattr(config, name)!r}"
              for name in _MODEL_DEFINING if getattr(theirs, name) != getattr(config, name)]
    if differ:
        flag = "--preset" if options.preset else "--bert_config_file"
        hint = (f"; leave {flag} out to train the checkpoint's own model"
                if options.bert_config_file or options.preset else "")
        raise PretrainingError(
            f"--init_checkpoint {options.init_checkpoint}: its model does not match this "
            f"run's model from {config_source(options)} ({', '.join(differ)}){hint}")


def apply_initial_weights(initial, pretrainer, path: str) -> str:
    """Copies the weights of `load_initial_weights`'s checkpoint into `pretrainer` (weights
    only: the optimizer starts afresh); returns a description for the log.

    A masked LM without the next-sentence head (transformers' BertForMaskedLM, an MLM-only
    pretrainer) gives the encoder and the masked-LM head; the pooler, which only the NSP
    head reads (such models are saved without one, or with one no loss trained), and the
    NSP head keep the run's initialisation."""
    from bert_keras.encoder import BertEncoder
    from bert_keras.pretrainer import BertPretrainer

    loaded = initial.model
    if isinstance(loaded, BertPretrainer) and not loaded.head_follows_encoder:
        # keras-hub's BertMaskedLM head (exact GELU, epsilon 1e-5): a run's layout records
        # the encoder's settings alone, and its head computes with those.
        logging.warning("--init_checkpoint %s: its masked-LM head computes with %r and "
                        "LayerNorm epsilon %g (keras-hub's); this run's head takes its weights "
                        "and computes with the encoder's (%r, %g), so its first logits differ "
                        "slightly", path, loaded.masked_lm.activation,
                        loaded.masked_lm.layer_norm_epsilon, pretrainer.masked_lm.activation,
                        pretrainer.masked_lm.layer_norm_epsilon)
    if isinstance(loaded, BertPretrainer) and loaded.next_sentence:
        _copy_weights(loaded.weights, pretrainer.weights, path)
        return f"{path} (encoder and pretraining heads)"
    if isinstance(loaded, BertPretrainer):
        _copy_weights(_weights_except(loaded, [loaded.encoder.pooler_layer]),
                      _weights_except(pretrainer, [pretrainer.encoder.pooler_layer,
                                                   pretrainer.nsp_dense]), path)
        return (f"{path} (encoder and masked-LM head; the pooler and the next-sentence head "
                "start from their initialisation)")
    _copy_weights(initial.encoder.weights, pretrainer.encoder.weights, path)
    if not isinstance(loaded, BertEncoder):  # a fine-tuned model: its task head stays out
        logging.warning("--init_checkpoint %s holds a %s: its encoder is used (its task head "
                        "is left out); the masked-LM and next-sentence heads start from their "
                        "initialisation", path, type(loaded).__name__)
        return f"{path} (the encoder of a {type(loaded).__name__})"
    # Google's phase 2 loads cls/* with the encoder; a run's encoder/ (what fine-tuning
    # reads) lacks them, while the run directory above it has them.
    # normpath would make "gs://b/run/encoder" "gs:/b/run/encoder", a local path.
    run_dir = os.path.dirname(path.rstrip("/") if files.is_remote(path)
                              else os.path.normpath(path))
    with_heads = files.isfile(os.path.join(run_dir, files.PRETRAINER_WEIGHTS_FILE))
    logging.warning("--init_checkpoint %s holds the encoder only: the masked-LM and "
                    "next-sentence heads start from their initialisation%s", path,
                    f"; --init_checkpoint={run_dir} loads them too" if with_heads else "")
    return f"{path} (encoder only)"


def _weights_except(model, layers) -> list:
    skip = {id(v) for layer in layers if layer is not None for v in layer.weights}
    return [w for w in model.weights if id(w) not in skip]


def _copy_weights(source: list, target: list, path: str) -> None:
    want = [tuple(w.shape) for w in target]
    got = [tuple(w.shape) for w in source]
    if want != got:  # check_initial_fits compares the configs before this
        raise PretrainingError(
            f"--init_checkpoint {path}: its weights do not match this run's model "
            f"({len(got)} vs {len(want)} weights)")
    for variable, value in zip(target, source):
        variable.assign(value.numpy())


# Flags naming files a resumed run must read the same contents from, not from the same
# place: phase 1's directory moved, the data copied to another disk, a job resumed on other
# hosts. Their digests (`contents_read`) are recorded with the flags.
_MOVABLE_FILES = ("init_checkpoint", "vocab_file", "bert_config_file", "input_file")
_CONTENTS_KEY = "contents"  # in run_config.json, beside the flags (no flag has this name)
_TOKENIZATION_KEY = "input_tokenization"  # a digest in "contents", beside the flags' own


def contents_read(options: PretrainingOptions, config, input_files, initial_read) -> dict:
    """{flag: digest} of what the `_MOVABLE_FILES` flags name: the initial weights
    (`initial_read`: `distribute.weights_read` of them, or None), the vocabulary, the config,
    and the training shards (names and sizes, in order: the data position of a backup counts
    batches through them)."""
    import tensorflow as tf

    from bert_keras.distribute import digest, vocabulary_read
    from data_prep import features

    contents = {"input_file": digest([(os.path.basename(path), tf.io.gfile.stat(path).length)
                                      for path in input_files])}
    made_with = features.data_tokenizer_settings(input_files)  # checked by _read_inputs
    if made_with is not None:
        # What the data's ids mean: its tokenizer settings and vocabulary (the sidecars').
        contents[_TOKENIZATION_KEY] = digest(made_with[0].to_json_dict(), made_with[2])
    if options.bert_config_file:
        contents["bert_config_file"] = digest(config.to_dict())
    if options.vocab_file:
        contents["vocab_file"] = vocabulary_read(options.vocab_file)[0]
    if initial_read is not None:
        contents["init_checkpoint"] = initial_read[0]
    return contents


def _resumed_run(options: PretrainingOptions, distribution) -> str | None:
    """--output_dir where it holds a backup of an interrupted run that this run resumes
    (`prepare_output_dir` then requires its training flags), else None."""
    from bert_keras.backup import holds_a_backup, process_backup_dir

    out = options.output_dir
    if files.isfile(os.path.join(out, files.RUN_CONFIG_FILE)) and holds_a_backup(
            process_backup_dir(out, distribution)):
        return out
    return None


def _runs_on_other_settings(options: PretrainingOptions) -> bool:
    """Whether --output_dir records a run started on other `RUNS_ON` settings (strategy,
    device count, XLA) than these, which its resumption may change with a warning: such a
    resumed run is not bit-identical to the uninterrupted one, and says nothing of the kind."""
    record = os.path.join(options.output_dir, files.RUN_CONFIG_FILE)
    if not files.isfile(record):
        return False
    previous, default = files.read_json(record), PretrainingOptions(input_file="", output_dir="")
    return any(previous.get(k, getattr(default, k)) != getattr(options, k)
               for k in options.RUNS_ON)


def prepare_output_dir(options: PretrainingOptions, chief: bool,
                       contents: dict | None = None) -> bool:
    """Checks --output_dir and records the run; returns True if resuming.

    A new run needs an empty or missing directory. A directory holding `run_config.json`
    is a previous run of the same command (resumed) and must have matching flags; the
    files they name may have moved where `contents` (`contents_read`) equals what was
    recorded. A finished run (encoder/ present) is never touched again.

    Raises:
      PretrainingError: output_dir holds a finished run, another run, or unrelated files.
    """
    out = options.output_dir
    record = os.path.join(out, files.RUN_CONFIG_FILE)
    if files.isdir(os.path.join(out, files.ENCODER_DIR)):
        raise PretrainingError(f"--output_dir {out} holds a finished run (encoder/ exists); "
                               "choose a new output_dir")
    if files.isfile(record):
        previous = files.read_json(record)
        # Runs recorded before a flag existed ran with what is now its non-default value.
        previous = {**_RECORDED_BEFORE_FLAG, **previous}
        recorded_contents = previous.pop(_CONTENTS_KEY, None) or {}
        current = json.loads(json.dumps(options.run_identity()))
        defaults = json.loads(json.dumps(dataclasses.asdict(PretrainingOptions(
            input_file="", output_dir=""))))
        # A run recorded before a flag existed ran with its default.
        if previous.get("vocab_file") is None:
            # Recorded before a vocabulary was found for it (--init_checkpoint's, the data's
            # sidecars'): the same inputs give the same one.
            current.pop("vocab_file", None)
        changed = sorted(k for k in set(previous) | set(current)
                         if previous.get(k, defaults.get(k)) != current.get(k))
        describe = lambda names: ", ".join(  # noqa: E731
            f"{k}: {previous.get(k, defaults.get(k))!r} -> {current.get(k)!r}" for k in names)
        moved = [k for k in changed if k in options.RUNS_ON]
        relocated = [k for k in changed if k in _MOVABLE_FILES and previous.get(k)
                     and current.get(k) and k in recorded_contents
                     and recorded_contents[k] == (contents or {}).get(k)]
        changed = [k for k in changed if k not in options.RUNS_ON and k not in relocated]
        # The same paths must still hold what the run started on (data remade in place with
        # other settings resumed silently: checkpoints and encoder/ then disagreed).
        remade = [k for k in (*_MOVABLE_FILES, _TOKENIZATION_KEY)
                  if k not in changed and k not in relocated and k in recorded_contents
                  and k in (contents or {}) and recorded_contents[k] != contents[k]]
        if remade:
            what = ", ".join("--input_file's tokenizer settings or vocabulary (its sidecars)"
                             if k == _TOKENIZATION_KEY else f"--{k} {current.get(k)}"
                             for k in remade)
            raise PretrainingError(
                f"--output_dir {out} holds a run that read other contents than these: {what} "
                "changed since it started (remade in place?); resume it on what it started "
                "on, or choose a new output_dir")
        if changed:
            from bert_keras.backup import BACKUP_DIR, holds_a_backup

            # A run killed before its first backup (out of memory at its first step, say)
            # kept nothing trained: its rerun with a smaller batch was told only to rerun
            # the flags that had failed.
            unsaved = not holds_a_backup(os.path.join(out, BACKUP_DIR)) and not files.glob_files(
                os.path.join(glob.escape(out), "checkpoints", "ckpt-*.weights.h5"))
            raise PretrainingError(
                f"--output_dir {out} holds a run with other flags ({describe(changed)}); "
                + (f"it stopped before its first backup, so it holds nothing trained: remove "
                   f"{out} to start it with these flags, or choose a new output_dir"
                   if unsaved else
                   "rerun it with its own flags or choose a new output_dir"))
        if relocated:
            logging.info("Resuming the run in %s with its files read from a new place, the "
                         "same contents (%s)", out, describe(relocated))
        if moved:
            logging.warning(
                "Resuming the run in %s on other settings than it started on (%s): it "
                "continues from the backup's weights, optimizer and data position, but draws "
                "other dropout masks, so it will not end as an uninterrupted run would",
                out, describe(moved))
        if (moved or relocated) and chief:
            # What it now runs on and reads from (an older record gains the digests).
            files.write_json(record, _run_record(options, {**recorded_contents,
                                                            **(contents or {})}))
        return True
    if not chief:
        return False  # The chief checks and writes; workers only read.
    if files.isdir(out) and files.listdir(out):
        raise PretrainingError(f"--output_dir {out} exists and is not a pretraining run; "
                               "choose a new or empty output_dir")
    files.write_json(record, _run_record(options, contents or {}))
    return False


def _run_record(options: PretrainingOptions, contents: dict) -> dict:
    return {**options.run_identity(), _CONTENTS_KEY: contents}


def save_final_outputs(pretrainer, options: PretrainingOptions, settings) -> str:
    """Writes pretrainer.weights.h5 and encoder/ (weights, bert_config.json, vocab.txt,
    tokenizer_config.json), each under a temporary name renamed when complete."""
    from bert_keras import checkpoints, model_loading

    out = options.output_dir
    # A fresh, uncompiled copy holds no optimizer state: the final file is weights only.
    clean = type(pretrainer).from_config(pretrainer.get_config())
    clean.set_weights(pretrainer.get_weights())
    with files.atomic_output(os.path.join(out, files.PRETRAINER_WEIGHTS_FILE), overwrite=True) as tmp:
        checkpoints.save_weights(clean, tmp)
    return model_loading.save_encoder_dir(clean.encoder, os.path.join(out, files.ENCODER_DIR),
                                          options.vocab_file, settings)


# ---------------------------------------------------------------------------------------
# Callbacks


def _epoch_of(row: str, sep: str) -> int:
    """The epoch a history.csv row starts with; -1 for a line that is no row."""
    field = row.split(sep, 1)[0]
    return int(field) if field.isdigit() else -1


def _callbacks(options, chief, backup_dir, num_train_steps, gather=None):
    import keras

    from bert_keras import checkpoints
    from bert_keras.backup import (ExactBackupAndRestore, IntervalProgbarLogger, StopAtStep,
                                   updates_done)

    class PeriodicCheckpoint(keras.callbacks.Callback):
        """Saves checkpoints/ckpt-<step>.weights.h5 every epoch (= save_checkpoints_steps),
        keeping the newest `keep`. (ModelCheckpoint names files by epoch and keeps all.)"""

        def __init__(self, directory, keep):
            super().__init__()
            self.directory, self.keep = directory, keep

        def on_epoch_end(self, epoch, logs=None):
            files.makedirs(self.directory)
            step = updates_done(self.model)
            path = os.path.join(self.directory, f"ckpt-{step:08d}.weights.h5")
            with files.atomic_output(path, overwrite=True) as tmp:
                checkpoints.save_weights(self.model, tmp)
            kept = sorted(n for n in files.listdir(self.directory) if n.startswith("ckpt-"))
            for name in kept[: -self.keep]:
                files.remove(os.path.join(self.directory, name))

    class _CSVLogger(keras.callbacks.CSVLogger):
        """Keras' CSVLogger, appending to the rows of the intervals a resumed run does not
        repeat, and closing a remote file right.

        It runs before the backup: a kill between its row of interval e and the backup of e
        resumes at e, and the first interval the run trains drops that row (and any later
        one) before writing its own, so every interval has one row, the one of the run that
        went on from it. (Written after the backup, the row of e was lost.) Keras' own opens
        a remote (gs://) path with tf.io.gfile's GFile but then asks the file for `closed`,
        an attribute GFile lacks (AttributeError at the end of every run on a remote
        --output_dir, Keras 3.15)."""

        def on_train_begin(self, logs=None):
            self._trimmed = False
            super().on_train_begin(logs)

        def on_epoch_begin(self, epoch, logs=None):
            if self._trimmed:
                return
            self._trimmed = True
            if not files.exists(self.filename):  # GFile creates a remote file at its first write
                return
            # The header, then a row an interval starting with its epoch (Keras' "\r\n"
            # line ends kept); a line that is no such row is kept as it is.
            lines = files.read_bytes(self.filename).decode("utf-8").splitlines(keepends=True)
            epochs = [_epoch_of(line, self.sep) for line in lines[1:]]
            repeated = [e for e in epochs if e >= epoch]
            if not repeated:
                return
            logging.info("%s: replacing the rows of intervals %s, which this run repeats",
                         self.filename, ", ".join(map(str, repeated)))
            self._close()
            files.write_text(self.filename, "".join(
                lines[:1] + [line for line, e in zip(lines[1:], epochs) if e < epoch]))
            keras.callbacks.CSVLogger.on_train_begin(self)  # reopened to append, as before

        def _close(self):
            if self.csv_file is not None and not getattr(self.csv_file, "closed", False):
                self.csv_file.close()
            self.csv_file = None

        def on_train_end(self, logs=None):
            self._close()  # GFile has no `closed`: the base class must not ask it
            self.writer = None

    # gather: several processes (JAX's, TensorFlow workers) agree on the epoch to resume from.
    backup = ExactBackupAndRestore(backup_dir, double_checkpoint=True, delete_checkpoint=False,
                                   gather=gather)
    callbacks = [StopAtStep(num_train_steps),
                 IntervalProgbarLogger(num_train_steps, options.save_checkpoints_steps,
                                       options.gradient_accumulation_steps)]
    if chief:
        # Before the backup, the interval's checkpoint, TensorBoard points and history.csv
        # row: a kill between them and the backup repeats the interval, which rewrites the
        # same checkpoint, adds points TensorBoard shows once and replaces the row (written
        # after it, they were lost).
        from bert_keras.tensorboard import TensorBoard

        callbacks.append(PeriodicCheckpoint(os.path.join(options.output_dir, "checkpoints"),
                                            options.keep_checkpoint_max))
        # Ours, not Keras': Keras' drops the epoch and evaluation points of most intervals.
        callbacks.append(TensorBoard(os.path.join(options.output_dir, "logs"),
                                     log_steps=options.log_steps))
        # One row per checkpoint interval (epoch e ends at update (e + 1) * save_steps, or
        # at num_train_steps); appended to on resumption.
        callbacks.append(_CSVLogger(
            os.path.join(options.output_dir, "history.csv"), append=True))
    callbacks.append(backup)
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
      PretrainingError (a ValueError), distribute.StrategyError or cli.InputError
        (--mixed_precision): bad flags, data or output_dir, with a one-line explanation.
    """
    from bert_keras import backends

    backends.check_backend()  # TensorFlow or JAX, else one line naming them
    options.validate()
    with _op_determinism(options.deterministic), contextlib.ExitStack() as held:
        if not options.do_train:
            return _evaluate(options)
        return _train(options, extra_callbacks, held)


def compiled_pretrainer(config, options: PretrainingOptions):
    """A randomly initialised `BertPretrainer` for `config` (a `BertConfig`), compiled as
    `train` trains it: the optimizer, losses and metrics that `options` name. Call it under
    the distribution's scope.

    With --next_sentence_prediction=false the model keeps its NSP head (every file keeps the
    pretrainer's layout) but no loss reads that head or the pooler, so both are frozen. Left
    trainable, TensorFlow's trainer skipped them (their gradients are None) while JAX's,
    which differentiates every trainable variable, got zeros for them and AdamW's weight
    decay shrank their kernels (tests/test_backend_training.py).
    """
    from bert_keras import backends, multi_worker_fix
    from bert_keras.losses import pretraining_losses_and_metrics
    from bert_keras.optimization import create_optimizer
    from bert_keras.pretrainer import BertPretrainer

    pretrainer = BertPretrainer.from_bert_config(config)
    if not options.next_sentence_prediction:
        pretrainer.encoder.pooler_layer.trainable = False
        pretrainer.nsp_dense.trainable = False
    pretrainer.compile(
        optimizer=create_optimizer(
            options.learning_rate, options.num_train_steps, options.num_warmup_steps,
            optimizer=options.optimizer, weight_decay=options.weight_decay,
            gradient_accumulation_steps=options.gradient_accumulation_steps,
            lr_schedule=options.lr_schedule, epsilon_placement=options.epsilon_placement),
        steps_per_execution=options.steps_per_execution,
        jit_compile=options.jit_compile,
        **pretraining_losses_and_metrics(mlm_only=not options.next_sentence_prediction),
    )
    multi_worker_fix.apply(pretrainer)
    backends.compile_steps_on_jax(pretrainer)
    return pretrainer


@contextlib.contextmanager
def _op_determinism(enable: bool):
    """TensorFlow op determinism for one run, as the process had it afterwards.

    The setting is process-wide: left on, a later run in the same process (a notebook, a
    test) would inherit it, and Keras would silently drop its --jit_compile.
    """
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config  # No public disable.

    # TensorFlow's op determinism (on JAX it covers the tf.data input pipeline only; XLA's
    # own switch is _jax_determinism's).
    turn_on = enable and not tf_config.is_op_determinism_enabled()
    if turn_on:
        tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        if turn_on:
            tf_config.disable_op_determinism()


def _jax_determinism() -> str:
    """Whether a resumed JAX run ends bit-identical to an uninterrupted one, in words.

    XLA's CPU programs are deterministic for a given input: a resumed run on a CPU ends bit
    for bit as the uninterrupted one (tests/test_run_pretraining_jax.py). On GPUs XLA sums
    scatter-adds (the embedding gradients) with atomics, in any order, unless its flag asks
    for deterministic ops. Elsewhere it is not measured.
    """
    import jax

    platform, flag = jax.default_backend(), "--xla_gpu_deterministic_ops=true"
    if platform == "cpu":
        return "results are bit-identical to an uninterrupted run"
    if platform == "gpu" and flag not in os.environ.get("XLA_FLAGS", ""):
        return (f"results are bit-identical to an uninterrupted run only with "
                f"XLA_FLAGS={flag} on GPUs (XLA's scatter-adds, the embedding gradients "
                f"among them, otherwise sum in any order)")
    return (f"results are bit-identical to an uninterrupted run where XLA's {platform} "
            f"programs are deterministic (measured on CPUs only)")


def _expand_flag(flag: str, patterns: str) -> list[str]:
    """The data files `--flag`'s patterns name; the error names the flag."""
    from data_prep import features

    try:
        return features.expand_input_files(patterns)
    except ValueError as e:
        raise PretrainingError(f"--{flag}: {e}") from None


def _read_inputs(options: PretrainingOptions, initial=None):
    """Reads and checks what this host holds for the run (the config, the vocabulary, the
    data, the tokenizer settings; `initial` is --init_checkpoint's, loaded), before anything
    is written, so a corrected rerun is not refused as "a run with other flags". Returns
    (config, the options with the masking flags the data implies, (input_files, eval_files,
    masking, eval_masking, eval_predictions, tokenizer settings, their source))."""
    from bert_keras.inputs import check_input_files, input_masking
    from data_prep import features

    try:
        config = load_bert_config(options, initial)
        # Weights, gradients, Adam's slots (and the accumulated gradients): refuse a model
        # that cannot fit before TensorFlow fails allocating it.
        # An evaluation holds the weights alone.
        config.check_fits_memory(
            bytes_per_parameter=(16 + (4 if options.gradient_accumulation_steps > 1 else 0)
                                 if options.do_train else 4),
            source=config_source(options))
    except ValueError as e:  # BertConfig names the file and the field.
        raise PretrainingError(str(e)) from None
    _check_vocab_fits(options, config, initial)
    if config.type_vocab_size < 2:
        # Every instance holds two segments (next sentence prediction); a second segment
        # embedding the model lacks reads as a zero row, without an error.
        raise PretrainingError(
            f"{config_source(options)}: type_vocab_size={config.type_vocab_size}, but "
            "pretraining instances hold two segments (A and B); BERT's is 2")
    if initial is not None:
        check_initial_fits(initial, config, options)
    eval_files = None
    eval_masking = None
    eval_predictions = None
    input_files = _expand_flag("input_file", options.input_file)
    try:
        kind = input_masking(input_files)
        options, masking = resolve_masking(options, kind, input_files[0])
        check_input_files(input_files, options.max_seq_length,
                          options.max_predictions_per_seq if masking is None else None)
        eval_predictions = options.max_predictions_per_seq
        if options.eval_input_file:
            eval_files = _expand_flag("eval_input_file", options.eval_input_file)
            if input_masking(eval_files) == features.DYNAMIC_MASKING:
                # Held-out data without masks is masked like the training data (fixed seed).
                eval_masking = masking or resolve_masking(
                    dataclasses.replace(options, max_predictions_per_seq=None,
                                        masked_lm_prob=None),
                    features.DYNAMIC_MASKING, eval_files[0])[1]
                eval_predictions = eval_masking.max_predictions_per_seq
            elif masking is not None:
                # Masked held-out data beside training data without masks (e.g. the same
                # 15% held-out masks for every recipe): its own P, from its sidecar.
                meta = features.read_sidecar(eval_files[0]) or {}
                eval_predictions = int(meta.get("max_predictions_per_seq") or eval_predictions)
            check_input_files(eval_files, options.max_seq_length,
                              None if eval_masking else eval_predictions)
    except ValueError as e:  # data_prep.features and inputs name the file and the lengths.
        raise PretrainingError(str(e)) from None
    for flag, paths in (("input_file", input_files), ("eval_input_file", eval_files or [])):
        recorded = features.data_vocab_size(paths)
        if recorded is not None and recorded[0] > config.vocab_size:
            # Ids past the embedding table: an error deep in TensorFlow's gather, NaN weights
            # on JAX (whose gathers fill out-of-range rows).
            raise PretrainingError(
                f"--{flag}: the data was made with a vocabulary of {recorded[0]} tokens "
                f"({recorded[1]}), more than the model's vocab_size={config.vocab_size} "
                f"({config_source(options)}); give the model vocab_size={recorded[0]}, or "
                "remake the data with the model's vocabulary")
    input_files = _sound_files("input_file", input_files, options.skip_damaged_shards)
    if eval_files:
        eval_files = _sound_files("eval_input_file", eval_files, options.skip_damaged_shards)
    settings, settings_source = tokenizer_settings(options, input_files, initial)
    if eval_files:
        _check_held_out_tokenization(input_files, eval_files)
    return config, options, (input_files, eval_files, masking, eval_masking, eval_predictions,
                             settings, settings_source)


def _run_config_of(path: str) -> dict | None:
    """The run_config.json of the pretraining run a checkpoint path belongs to (the run's
    directory, its encoder/, or one of its checkpoints/ckpt-*.weights.h5), else None."""
    directory = path if files.isdir(path) else os.path.dirname(files.absolute(path))
    for candidate in (directory, os.path.dirname(files.absolute(directory))):
        record = os.path.join(candidate, files.RUN_CONFIG_FILE)
        if files.isfile(record):
            try:
                recorded = files.read_json(record)
            except (OSError, ValueError):
                return None
            return recorded if isinstance(recorded, dict) else None
    return None


def _warn_if_masked_otherwise(options: PretrainingOptions, prob_given: bool) -> None:
    """A phase 2 on data without masks from a phase 1 that masked otherwise (its
    run_config.json): the masking flags are this run's, as every training flag is, so a
    phase 1 at --masked_lm_prob=0.3 or with --do_whole_word_mask continued at 0.15 of
    single WordPieces without a word. Warns, naming the flags that continue its recipe."""
    trained = _run_config_of(options.init_checkpoint)
    if not trained:
        return
    prob = trained.get("masked_lm_prob")
    differ = []
    if (not prob_given and isinstance(prob, (int, float)) and not isinstance(prob, bool)
            and prob != options.masked_lm_prob):
        differ.append((f"--masked_lm_prob={prob}",
                       f"--masked_lm_prob={options.masked_lm_prob} (the default)"))
    if trained.get("do_whole_word_mask") is True and not options.do_whole_word_mask:
        differ.append(("--do_whole_word_mask", "single WordPieces"))
    if differ:
        logging.warning("--init_checkpoint %s was trained with %s (its %s); this run masks "
                        "with %s: pass %s to continue its recipe", options.init_checkpoint,
                        " and ".join(a for a, _ in differ), files.RUN_CONFIG_FILE,
                        " and ".join(b for _, b in differ),
                        " ".join(a for a, _ in differ))


def _initial_weights(options: PretrainingOptions, distribution):
    """(--init_checkpoint loaded, or None; whether it is a stand-in).

    Loaded when resuming too: it may give the config, vocabulary and tokenizer settings, and
    a run stopped before its first backup starts again from it. Where it has gone (phase 1
    deleted while phase 2 ran) and this process holds a backup, which supersedes its
    weights, the run's newest checkpoints/ckpt-*.weights.h5 stands in: the run's own config,
    vocabulary and settings (recorded when it started). Before, such a run could not resume.
    """
    import tensorflow as tf

    from bert_keras.backup import holds_a_backup, process_backup_dir

    path = options.init_checkpoint
    if not path:
        return None, False
    # Escaped: a "[1]" in a directory's name is no character class.
    directory = glob.escape(os.path.join(options.output_dir, "checkpoints"))
    kept = sorted(tf.io.gfile.glob(os.path.join(directory, "ckpt-*.weights.h5")))
    # Gone: neither the path nor a TF1 checkpoint prefix's files (bert_model.ckpt.index).
    if (tf.io.gfile.exists(path) or tf.io.gfile.glob(glob.escape(path.rstrip("/")) + ".*")
            or not kept
            or not files.isfile(os.path.join(options.output_dir, files.RUN_CONFIG_FILE))
            or not holds_a_backup(process_backup_dir(options.output_dir, distribution))):
        return load_initial_weights(path, options.bert_config_file), False
    logging.warning("--init_checkpoint %s is gone: resuming from this run's backup, which "
                    "supersedes its weights, with the config, vocabulary and tokenizer "
                    "settings of the run's own %s", path, kept[-1])
    return load_initial_weights(kept[-1], options.bert_config_file), True


def _with_vocabulary(options: PretrainingOptions, initial) -> PretrainingOptions:
    """`options` with --vocab_file, where it is not given, found: --init_checkpoint's
    vocab.txt (`initial`), or the data's where that one extends it (checked against the
    data's like --vocab_file), else the one the data's sidecars name."""
    if (initial is not None and not options.vocab_file and initial.vocab_file
            and initial.vocab_file == initial.vocab_source):
        options = dataclasses.replace(
            options, vocab_file=_vocabulary_with_the_checkpoint(options, initial))
    if not options.vocab_file:
        _, options = _vocabulary_of_the_data(options, say_missing=initial is None or
                                             options.do_train)
    return options


def _vocabulary_with_the_checkpoint(options: PretrainingOptions, initial) -> str:
    """Without --vocab_file: --init_checkpoint's vocab.txt, or the one the data's sidecars
    name where the data was made with that one edited as --vocab_file may edit it ([unused]
    tokens replaced, Google's way of adding words; or cut short) and it fits the model's
    embedding table. Before, the second run was refused for its vocabulary unless
    --vocab_file named the data's."""
    from bert_keras import model_loading
    from data_prep import features
    from data_prep.schema import VocabError

    data_vocab = features.data_vocab_file(_expand_flag("input_file", options.input_file))
    if data_vocab and files.sha256_file(data_vocab) != files.sha256_file(initial.vocab_file):
        try:
            initial.check_same_vocabulary(data_vocab, "the data's vocabulary")
            model_loading.check_vocab_fits(initial.encoder, data_vocab)
        except (VocabError, model_loading.VocabMismatchError):
            pass  # refused with the data's sidecars (tokenizer_settings)
        else:
            logging.info("Vocabulary: %s, named by the data's sidecars: --init_checkpoint's "
                         "(%s) with [unused] tokens replaced, or cut short", data_vocab,
                         initial.vocab_file)
            return data_vocab
    logging.info("Vocabulary: %s, found with --init_checkpoint", initial.vocab_file)
    return initial.vocab_file


def _vocabulary_of_the_data(options: PretrainingOptions, say_missing: bool = True):
    """Without --vocab_file (Google's run_pretraining has none) nor one found with
    --init_checkpoint: the vocab.txt the data's sidecars name, where it is still the file
    the data was made with, so that encoder/ holds the vocabulary and its tokenizer
    settings the fine-tuning tools and exports read. Returns (the file or None, options);
    `say_missing`: warn when there is none."""
    from data_prep import features

    found = features.data_vocab_file(_expand_flag("input_file", options.input_file))
    if found:
        logging.info("Vocabulary: %s, named by the data's sidecars (its sha256 matches)", found)
        return found, dataclasses.replace(options, vocab_file=found)
    if not say_missing:
        return None, options
    logging.warning("No vocabulary: without --vocab_file (the one given to "
                    "create_pretraining_data), %s/ gets no vocab.txt nor tokenizer settings, "
                    "and the fine-tuning tools and exports will need --vocab_file and the "
                    "tokenizer flags", os.path.join(options.output_dir, files.ENCODER_DIR))
    return None, options


def _check_held_out_tokenization(input_files: list[str], eval_files: list[str]) -> None:
    """Refuses held-out data made with another vocabulary or tokenizer settings than the
    training data (both recorded in the sidecars): its metrics would mean nothing."""
    from data_prep import features

    try:
        held = features.data_tokenizer_settings(eval_files)
    except ValueError as e:
        raise PretrainingError(f"--eval_input_file: {e}") from None
    train = features.data_tokenizer_settings(input_files)  # checked by tokenizer_settings
    if train is None or held is None:
        return
    if not train[0].same_tokenization(held[0]) or (train[2] and held[2] and train[2] != held[2]):
        raise PretrainingError(
            f"--eval_input_file: the held-out data was made with {held[0].describe()} and the "
            f"vocabulary of sha256 {str(held[2])[:12]}... ({held[1]}), the training data with "
            f"{train[0].describe()} and {str(train[2])[:12]}... ({train[1]}): its metrics "
            "would mean nothing; make both with create_pretraining_data's same --vocab_file "
            "and tokenizer flags")


def _what_was_read(options: PretrainingOptions, config, data, initial_read) -> dict:
    """For `Distribution.check_same_inputs`: {what was read: (digest, description)} of what
    the processes must share (the model's shape, the data's masking and batch shapes, the
    tokenizer settings, the initial weights: `initial_read`, `distribute.weights_read` of
    them, or None). The records themselves may differ: each process reads its own share of
    its host's files."""
    from bert_keras.distribute import digest, vocabulary_read

    input_files, eval_files, masking, eval_masking, eval_predictions, settings, _ = data
    source = ("--bert_config_file" if options.bert_config_file else
              f"--preset={options.preset}" if options.preset else "--init_checkpoint's config")
    read = {source: (digest(config.to_dict()),
                            json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":"))),
            "--input_file": (digest(repr(masking), options.max_predictions_per_seq,
                                    settings.to_json_dict()),
                             f"{'dynamic' if masking else 'static'} masks, at most "
                             f"{options.max_predictions_per_seq} predictions a sequence, "
                             f"tokenizer {settings.describe()}")}
    if options.vocab_file:
        read["--vocab_file"] = vocabulary_read(options.vocab_file)
    if eval_files:
        read["--eval_input_file"] = (digest(repr(eval_masking), eval_predictions),
                                     f"{'dynamic' if eval_masking else 'static'} masks, at "
                                     f"most {eval_predictions} predictions a sequence")
    if initial_read is not None:
        read["--init_checkpoint"] = initial_read
    return read


def _train(options: PretrainingOptions, extra_callbacks, held: contextlib.ExitStack) -> dict:
    import keras

    from bert_keras.backup import (BackupError, StopOnNonFiniteLoss, TrainingDiverged,
                                   process_backup_dir, remove_backups, updates_done)
    from bert_keras.distribute import weights_read
    from bert_keras.inputs import pretraining_dataset

    # tf.distribute on TensorFlow, keras.distribution on JAX (distribute.get_distribution),
    # once the flags are accepted and before anything touches a device (loading initial
    # weights does): JAX's processes are joined before JAX computes anything.
    distribution = options.distribution()
    chief = distribution.is_chief
    logging.info("Distribution: %r", distribution)
    distribution.check_same_flags(dataclasses.asdict(options))
    # What one process can fail alone (each reads its own host's files: the config, the
    # vocabulary, the data, --init_checkpoint; the chief checks --output_dir) stops them
    # all. One that had stopped alone left the others waiting for it to join (TensorFlow's
    # workers without limit), or at their first collective.
    with distribution.stop_together():
        initial, stand_in = _initial_weights(options, distribution)
        options = _with_vocabulary(options, initial)
        prob_given = options.masked_lm_prob is not None
        config, options, data = _read_inputs(options, initial)
        (input_files, eval_files, masking, eval_masking, eval_predictions, settings,
         settings_source) = data
    if masking is not None and initial is not None and not stand_in:
        _warn_if_masked_otherwise(options, prob_given)
    # Digested once (BERT-large's 1.3 GB take seconds), for the record and the processes.
    initial_read = weights_read(initial.model.weights) if initial is not None else None
    distribution.check_same_inputs(lambda: _what_was_read(options, config, data, initial_read))
    if masking is not None:
        logging.info("Dynamic masking: %.3g of the tokens, at most %d a sequence%s, anew on "
                     "every pass", masking.masked_lm_prob, masking.max_predictions_per_seq,
                     ", whole words" if masking.whole_word else "")
    logging.info("Tokenizer settings: %s (%s)", settings.describe(),
                 settings_source or "defaults and flags")
    with distribution.stop_together():
        keras.utils.set_random_seed(options.seed)
        keras.mixed_precision.set_global_policy(options.mixed_precision)
        check_replicas(options, distribution.num_replicas_in_sync,
                       tf_distribute=distribution.strategy is not None,
                       resuming=_resumed_run(options, distribution))
        if chief:  # one job at a time in --output_dir (held until the run ends: `held`)
            held.enter_context(files.exclusively(options.output_dir, "--output_dir"))
        # Read before prepare_output_dir records the new settings.
        elsewhere = _runs_on_other_settings(options)
        resuming = prepare_output_dir(options, chief,
                                      contents_read(options, config, input_files,
                                                    None if stand_in else initial_read))
    if chief:
        path = os.path.join(options.output_dir, files.BERT_CONFIG_FILE)
        if not files.exists(path):
            config.to_json_file(path)
        if not files.exists(os.path.join(options.output_dir, files.VOCAB_FILE)):
            # So that checkpoints/ckpt-*.weights.h5 carry the vocabulary and its settings
            # before encoder/ is written (model_loading: convert_checkpoint, fine-tuning).
            from bert_keras import model_loading

            model_loading.write_vocab_and_settings(options.output_dir, options.vocab_file,
                                                   settings)
    backup_dir = process_backup_dir(options.output_dir, distribution)

    accumulation = options.gradient_accumulation_steps
    steps_per_epoch = options.save_checkpoints_steps * accumulation  # micro-batches
    # Epochs are checkpoint intervals; the last one is cut short by StopAtStep when
    # save_checkpoints_steps does not divide num_train_steps.
    epochs = -(-options.num_train_steps // options.save_checkpoints_steps)

    with distribution.scope():
        pretrainer = compiled_pretrainer(config, options)
        if options.jit_compile and not pretrainer.jit_compile:
            logging.warning("--jit_compile: Keras declined XLA for this model in this process "
                            "(op determinism on?); training runs without XLA")
        logging.info("Train step: %s", "compiled with XLA" if pretrainer.jit_compile
                     else "a TensorFlow graph without XLA (--jit_compile to compile it)")
        backup, callbacks = _callbacks(
            options, chief, backup_dir, options.num_train_steps,
            gather=distribution.gather_from_processes if distribution.num_processes > 1
            else None)
        callbacks += distribution.preemption_callbacks(
            "rerun the same command on every host to resume from the newest backup")
        # Restore now (fit would do it too, later) to know how many steps are done before
        # the input pipeline is built. The optimizer's step counter is saved in the same
        # file as the weights and the dropout random state, so it is the source of truth.
        backup.set_model(pretrainer)
        try:
            backup.on_train_begin()
        except BackupError as e:
            raise PretrainingError(str(e)) from None
    done_steps = updates_done(pretrainer)
    if backup.restored_from:
        logging.info("Resuming from %s at step %d of %d", backup.restored_from, done_steps,
                     options.num_train_steps)
        if backup.written_on:
            logging.warning(
                "%s was written on Keras' %s backend and this run is on %s: it continues "
                "from the backup's weights, optimizer and data position, but the dropout "
                "masks come from this backend's random generator, so it will not be "
                "bit-identical to an uninterrupted run on either backend",
                backup.restored_from, backup.written_on, keras.backend.backend())
        elif elsewhere:
            pass  # prepare_output_dir warned: other settings draw other dropout masks
        elif not backup.exact:
            logging.warning(
                "%s was written without the dropout random state (by an older version): "
                "the resumed run continues from its weights and data position but will not "
                "be bit-identical to an uninterrupted run", backup.restored_from)
        elif keras.backend.backend() == "jax":
            logging.info("Resumed with the exact weights, optimizer, dropout state and data "
                         "position; %s", _jax_determinism())
        elif not options.deterministic:
            logging.info(
                "Resumed with the exact weights, optimizer, dropout state and data position; "
                "results are bit-identical to an uninterrupted run only with --deterministic "
                "(TensorFlow's parallel kernels otherwise differ run to run)")
    elif initial is not None:
        logging.info("Initialized from %s%s", apply_initial_weights(
            initial, pretrainer, options.init_checkpoint),
            " (no backup yet: starting from step 0)" if resuming else "")
    elif resuming:
        logging.info("No backup in %s yet: starting from step 0", backup_dir)
    initial = None  # copied (or superseded by the backup): free its weights
    if done_steps % options.save_checkpoints_steps and done_steps != options.num_train_steps:
        raise PretrainingError(f"backup in {backup_dir} is at step {done_steps}, not at a "
                               f"multiple of --save_checkpoints_steps="
                               f"{options.save_checkpoints_steps}")

    def train_input(context):
        per_replica = context.get_per_replica_batch_size(options.train_batch_size)
        # Batches per step from each pipeline (JAX's context has one replica: global batches).
        replicas_per_pipeline = context.num_replicas_in_sync // context.num_input_pipelines
        return pretraining_dataset(
            input_files, per_replica, options.max_seq_length,
            options.max_predictions_per_seq, is_training=True, seed=options.seed,
            input_context=context, autotune=options.autotune,
            skip_batches=done_steps * accumulation * replicas_per_pipeline, masking=masking)

    eval_input = _eval_input(options, eval_files, eval_predictions, eval_masking)

    # Building the pipelines checks the data (sidecars, shapes) before anything slow runs.
    try:
        train_data = distribution.distribute_datasets_from_function(train_input)
        eval_data = None
        if eval_files:
            eval_data = distribution.distribute_datasets_from_function(eval_input)
    except ValueError as e:  # data_prep.features and inputs name the file and the lengths.
        raise PretrainingError(str(e)) from None

    initial_epoch = done_steps // options.save_checkpoints_steps
    # Under the distribution's scope: on JAX, fit and evaluate shard each batch as they run.
    # First: a step whose loss is not finite stops the run before anything of it is saved.
    guard = StopOnNonFiniteLoss(options.learning_rate, check_every=options.log_steps)
    with distribution.scope(), _records_that_do_not_parse():
        # Second: the interval's evaluation is in its logs before they are saved or shown.
        evaluation = (_held_out_evaluation(pretrainer, options, eval_data)
                      if eval_data is not None else None)
        try:
            logs = _fit_and_evaluate(pretrainer, options, train_data, evaluation, done_steps,
                                     initial_epoch, epochs, steps_per_epoch,
                                     [guard] + ([evaluation] if evaluation else [])
                                     + callbacks + list(extra_callbacks), chief)
        except TrainingDiverged as e:
            raise PretrainingError(
                f"{e} (the checkpoints and backup written before it are kept; remove "
                f"{backup_dir} to train again with other flags)") from None
    if chief:
        final = save_final_outputs(pretrainer, options, settings)
        logging.info("Encoder for fine-tuning and export: %s", final)
    remove_backups(options.output_dir, distribution)
    return logs


def _eval_input(options: PretrainingOptions, eval_files, eval_predictions, eval_masking):
    """The held-out input function for `distribute_datasets_from_function`."""
    from bert_keras.inputs import pretraining_dataset

    def eval_input(context):
        per_replica = context.get_per_replica_batch_size(options.eval_batch_size)
        # Repeated, so every worker runs exactly max_eval_steps (uneven shards would hang
        # the collectives of a multi-worker evaluation).
        return pretraining_dataset(
            eval_files, per_replica, options.max_seq_length,
            eval_predictions, is_training=False, repeat=True,
            input_context=context, autotune=options.autotune, masking=eval_masking)

    return eval_input


EVAL_RESULTS_FILE = "eval_results.json"
# Google's run_pretraining.py writes its evaluation here; its users' scripts read it.
GOOGLE_EVAL_RESULTS_FILE = "eval_results.txt"
# eval_results.json's keys under Google's names (its metric_fn's, Estimator's loss and step).
GOOGLE_METRIC_NAMES = {"mlm_logits_accuracy": "masked_lm_accuracy",
                       "mlm_logits_loss": "masked_lm_loss",
                       "nsp_logits_accuracy": "next_sentence_accuracy",
                       "nsp_logits_loss": "next_sentence_loss",
                       "loss": "loss", "global_step": "global_step"}


def _write_googles_eval_results(output_dir: str, results: dict, overwrite: bool) -> None:
    """Google's eval_results.txt of `results` (eval_results.json's metrics): its metric
    names, one `key = value` line each, keys sorted, values as its str() of float32 writes
    them (classification.google_eval_text, run_classifier's file). Before, only
    eval_results.json was written, under Keras' names: scripts reading Google's file found
    none."""
    import numpy as np

    from bert_keras.finetuning.classification import google_eval_text

    google = {GOOGLE_METRIC_NAMES[k]: v if k == "global_step" else np.float32(v)
              for k, v in results.items() if k in GOOGLE_METRIC_NAMES}
    files.write_text(os.path.join(output_dir, GOOGLE_EVAL_RESULTS_FILE),
                     google_eval_text(google), overwrite=overwrite,
                     hint="choose another --output_dir")


def _steps_trained(model_path: str) -> int | None:
    """The optimizer steps a pretraining run's model was trained for, where its path says:
    a checkpoint of a run (checkpoints/ckpt-<step>.weights.h5), or a finished run (its
    directory, encoder/ or pretrainer.weights.h5: run_config.json's num_train_steps); else
    None (Google's and transformers' checkpoints record none)."""
    name = os.path.basename(os.path.normpath(model_path))
    if name.startswith("ckpt-") and name.endswith(".weights.h5"):
        step = name[len("ckpt-"):-len(".weights.h5")]
        return int(step) if step.isdigit() else None
    recorded = _run_config_of(model_path)
    directory = model_path if files.isdir(model_path) else os.path.dirname(
        files.absolute(model_path))
    finished = any(files.isdir(os.path.join(d, files.ENCODER_DIR))
                   for d in (directory, os.path.dirname(files.absolute(directory))))
    steps = (recorded or {}).get("num_train_steps")
    return steps if finished and isinstance(steps, int) else None


def _evaluate(options: PretrainingOptions) -> dict:
    """Google's --do_train=false --do_eval: evaluates a trained model (--init_checkpoint, else
    --output_dir's finished run) on --eval_input_file, else --input_file, for
    --max_eval_steps batches; writes output_dir/eval_results.json (never over one) and
    returns the metrics. Nothing else is written."""
    import keras

    from bert_keras.distribute import weights_read
    from bert_keras.pretrainer import BertPretrainer

    distribution = options.distribution()
    chief = distribution.is_chief
    distribution.check_same_flags(dataclasses.asdict(options))
    out = options.output_dir
    target = os.path.join(out, EVAL_RESULTS_FILE)
    model_path = options.init_checkpoint or out
    with distribution.stop_together():
        google_target = os.path.join(out, GOOGLE_EVAL_RESULTS_FILE)
        held = [os.path.basename(p) for p in (target, google_target) if chief and files.exists(p)]
        if held:
            raise files.OutputExistsError(
                f"--output_dir {out} already holds {' and '.join(held)}; choose another "
                "--output_dir for this evaluation (the model is read from --init_checkpoint)")
        if chief:  # writable, before the model is loaded and evaluated (not after)
            files.check_writable([target, google_target])
        if chief and files.isfile(os.path.join(out, files.RUN_CONFIG_FILE)) and \
                not files.isdir(os.path.join(out, files.ENCODER_DIR)):
            raise PretrainingError(
                f"--output_dir {out} holds a pretraining run that has not finished; rerun its "
                "command to complete it, or choose another --output_dir for this evaluation")
        if not options.init_checkpoint and not files.isdir(
                os.path.join(out, files.ENCODER_DIR)):
            raise PretrainingError(
                "--do_train=false evaluates a trained model: give it as --init_checkpoint (a "
                "run's output_dir, a pretrainer's .weights.h5, Google's bert_model.ckpt, a "
                "transformers BertForPreTraining directory), or an --output_dir holding a "
                "finished run")
        initial = load_initial_weights(
            model_path, options.bert_config_file, want="pretrainer",
            flag="--init_checkpoint" if options.init_checkpoint else "--output_dir")
        next_sentence = bool(initial.model.next_sentence)
        nsp = next_sentence and options.next_sentence_prediction
        # The evaluated data is --eval_input_file, else --input_file (Google's eval-only run).
        options = dataclasses.replace(
            options, input_file=options.eval_input_file or options.input_file,
            eval_input_file=None, next_sentence_prediction=nsp,
            init_checkpoint=model_path)
        options = _masking_as_trained(options, model_path)
        options = _with_vocabulary(options, initial)
        config, options, data = _read_inputs(options, initial)
        eval_files, _, masking, _, predictions, _, _ = data
    distribution.check_same_inputs(lambda: _what_was_read(
        options, config, data, weights_read(initial.model.weights)))
    logging.info("Evaluating %s (%s) on %s: %d batches of %d", model_path,
                 "masked LM and next sentence" if nsp else "masked LM",
                 options.input_file, options.max_eval_steps, options.eval_batch_size)
    keras.utils.set_random_seed(options.seed)
    keras.mixed_precision.set_global_policy(options.mixed_precision)
    with distribution.scope():
        # The loaded model's heads (an NSP head not evaluated with
        # --next_sentence_prediction=false, as a training run keeps it).
        pretrainer = BertPretrainer.from_bert_config(config, next_sentence=next_sentence)
        _compile_for_evaluation(pretrainer, options, nsp, steps_per_execution=1)
        logging.info("Model: %s", apply_initial_weights(initial, pretrainer, model_path))
    initial = None
    try:
        eval_data = distribution.distribute_datasets_from_function(
            _eval_input(options, eval_files, predictions, masking))
    except ValueError as e:
        raise PretrainingError(str(e)) from None
    with distribution.scope(), _records_that_do_not_parse():
        results = _evaluation_results(pretrainer, eval_data, options.max_eval_steps,
                                      verbose=options.verbose if options.verbose != "auto"
                                      else (1 if sys.stdout.isatty() else 2))
    if chief:
        record = {**results, "init_checkpoint": model_path, "input_file": options.input_file,
                  "eval_steps": options.max_eval_steps,
                  "eval_batch_size": options.eval_batch_size}
        files.write_json(target, record, overwrite=False)
        steps = _steps_trained(model_path)
        # Google's global_step is the evaluated checkpoint's step: given where it is known.
        _write_googles_eval_results(out, {**results, **({"global_step": steps}
                                                        if steps is not None else {})},
                                    overwrite=False)
        logging.info("Evaluation: %s -> %s", "  ".join(
            f"{k} {v:.4f}" for k, v in sorted(results.items())), target)
    return results


def _compile_for_evaluation(model, options: PretrainingOptions, nsp: bool,
                            steps_per_execution: int) -> None:
    """Compiles `model` (a pretrainer's graph) to evaluate only: its losses and metrics plus
    Google's masked_lm_loss (`losses.MaskedLMLossMean`), which a training compile leaves
    out (Keras would compute it in every training step too)."""
    from bert_keras import backends, multi_worker_fix
    from bert_keras.losses import pretraining_losses_and_metrics

    model.compile(steps_per_execution=steps_per_execution, jit_compile=options.jit_compile,
                  **pretraining_losses_and_metrics(mlm_only=not nsp, evaluation=True))
    multi_worker_fix.apply(model)
    backends.compile_steps_on_jax(model)


def _evaluation_results(model, eval_data, steps: int, verbose=0) -> dict:
    """`model.evaluate` of a `_compile_for_evaluation` model, as eval_results.json holds it:
    Python floats, `mlm_logits_loss` Google's masked_lm_loss (the weighted mean over every
    prediction evaluated), the other keys as Keras logs them."""
    from bert_keras.losses import EvaluationProgbarLogger, evaluation_results

    return evaluation_results(model.evaluate(eval_data, steps=steps, return_dict=True,
                                             verbose=verbose,
                                             callbacks=[EvaluationProgbarLogger()]))


def _masking_as_trained(options: PretrainingOptions, model_path: str) -> PretrainingOptions:
    """Evaluating a run's model alone on data without masks: --masked_lm_prob and
    --max_predictions_per_seq as the run trained (its run_config.json) where the flags
    leave them open, so the evaluation reads what the run's own final evaluation read;
    a run trained with --do_whole_word_mask, evaluated without it, is warned about (a
    boolean flag not given cannot be told from false). Before, such an evaluation masked at
    0.15 whatever the run trained at, and its numbers silently differed."""
    from bert_keras.inputs import input_masking
    from data_prep import features

    trained = _run_config_of(model_path)
    if trained is None:
        return options
    try:
        dynamic = input_masking(_expand_flag("input_file", options.input_file)) == \
            features.DYNAMIC_MASKING
    except (OSError, ValueError, PretrainingError):
        return options  # _read_inputs says what is wrong with the data
    prob = trained.get("masked_lm_prob")
    if not dynamic or isinstance(prob, bool) or not isinstance(prob, (int, float)):
        return options  # statically masked data, or a run trained on it
    fill = {"masked_lm_prob": prob, "max_predictions_per_seq": trained.get(
        "max_predictions_per_seq")}
    fill = {k: v for k, v in fill.items() if getattr(options, k) is None and
            isinstance(v, (int, float)) and not isinstance(v, bool)}
    if fill:
        logging.info("Masking as %s was trained (%s): %s (the flags override)", model_path,
                     files.RUN_CONFIG_FILE, ", ".join(f"--{k}={v}" for k, v in fill.items()))
    if trained.get("do_whole_word_mask") is True and not options.do_whole_word_mask:
        logging.warning("%s was trained with --do_whole_word_mask; this evaluation masks "
                        "single WordPieces: pass --do_whole_word_mask to evaluate as it "
                        "trained", model_path)
    return dataclasses.replace(options, **fill)


@contextlib.contextmanager
def _records_that_do_not_parse():
    """A record the checks before training cannot see (they read sidecars, each file's first
    record and the record counts) that lacks a feature of Google's schema, or holds one at
    another length, as one line: before, TensorFlow's parse error with its stack trace,
    whenever training reached the record."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.InvalidArgumentError as e:
        text = getattr(e, "message", str(e))
        said = [line for line in text.splitlines() if "Feature: " in line]
        if not said:
            raise
        raise PretrainingError(
            f"--input_file/--eval_input_file: a record does not parse "
            f"({said[0].split('Name: <unknown>, ')[-1].strip()}); every record must hold "
            "the features of Google's schema at the data's lengths (rewrite the data with "
            "create_pretraining_data)") from None


def _held_out_evaluation(pretrainer, options: PretrainingOptions, eval_data):
    """A callback evaluating `pretrainer` on `eval_data` after every checkpoint interval into
    the interval's `val_` logs (history.csv, TensorBoard, the progress bar), exactly as the
    final evaluation and an evaluation-only run do: Google's masked_lm_loss, the first
    --max_eval_steps batches of the held-out data every time.

    fit's own validation would report Keras' mean of the batches' masked-LM losses, and walk
    on through the (repeated) held-out data, a different stretch of it at every interval
    (resumed runs restarting it). The evaluation runs the trained graph compiled apart (the
    same layers and weights), so the training compile keeps its metrics and Google's loss
    costs no training step anything. Build it under the distribution's scope."""
    import keras

    from bert_keras.backup import updates_done

    evaluator = keras.Model(pretrainer.input, pretrainer.output, name="evaluation")
    _compile_for_evaluation(evaluator, options, options.next_sentence_prediction,
                            steps_per_execution=options.steps_per_execution)

    class HeldOutEvaluation(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.results, self.step = None, None  # of the latest evaluation

        def evaluate(self) -> dict:
            # Every process evaluates: the evaluation's collectives need them all.
            self.results = _evaluation_results(evaluator, eval_data, options.max_eval_steps)
            self.step = updates_done(pretrainer)
            return self.results

        def on_epoch_end(self, epoch, logs=None):
            results = self.evaluate()
            if logs is not None:  # Keras' History and our loggers come after this callback
                logs.update({f"val_{k}": v for k, v in results.items()})

    return HeldOutEvaluation()


def _fit_and_evaluate(pretrainer, options, train_data, evaluation, done_steps, initial_epoch,
                      epochs, steps_per_epoch, callbacks, chief) -> dict:
    """Trains the remaining steps (evaluated after each interval by `evaluation`, a
    `_held_out_evaluation` callback in `callbacks`, or None) and evaluates the final model;
    returns the last logs."""
    from bert_keras.backup import updates_done

    logs = {}
    if done_steps < options.num_train_steps:
        history = pretrainer.fit(
            train_data,
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            shuffle=False,  # The pipeline shuffles (deterministically, for resumption).
            callbacks=callbacks,
            verbose=options.verbose if options.verbose != "auto" else (
                1 if sys.stdout.isatty() else 2),
        )
        logs = {k: v[-1] for k, v in history.history.items()}
    if updates_done(pretrainer) != options.num_train_steps:
        raise RuntimeError(f"training ended at step {updates_done(pretrainer)}, "
                           f"expected {options.num_train_steps}")
    if evaluation is None:
        return logs
    # The last interval's evaluation is of the final model; a run resumed after its last
    # interval (killed before its final outputs) evaluates now.
    results = dict(evaluation.results if evaluation.step == options.num_train_steps
                   else evaluation.evaluate())
    if chief:
        target = os.path.join(options.output_dir, EVAL_RESULTS_FILE)
        logging.info("Final evaluation: %s -> %s", "  ".join(
            f"{k} {v:.4f}" for k, v in sorted(results.items())), target)
        results["global_step"] = options.num_train_steps
        _write_googles_eval_results(options.output_dir, results, overwrite=True)
        files.write_json(target, results)
        logs.update({f"final_val_{k}": v for k, v in results.items()})
    return logs


_FLAGS = cli.define_flags(PretrainingOptions)
_TOKENIZER_FLAGS = tokenizer_config.define_flags()
# Google's run_pretraining.py flags that name no option here: its README's command runs as
# written (`with_googles_flags` says what each becomes).
_SAME_NAMES = {"allow_override": True, "module_name": cli.calling_module(1)}  # as define_flags
_GOOGLE_FLAGS = {
    "do_train": flags.DEFINE_bool(
        "do_train", True, "Google's flag: train. false (with --do_eval): evaluate "
        "--init_checkpoint's model (else --output_dir's finished run) on --eval_input_file, "
        "else --input_file, for --max_eval_steps batches into output_dir/eval_results.json.",
        **_SAME_NAMES),
    "do_eval": flags.DEFINE_bool("do_eval", False, "Google's flag: evaluate; without "
                                 "--eval_input_file on --input_file, as Google's tool does.",
                                 **_SAME_NAMES),
    "iterations_per_loop": flags.DEFINE_integer(
        "iterations_per_loop", None, "Google's flag: on TPUs --steps_per_execution; unused "
        "elsewhere, as by Google's estimator.", **_SAME_NAMES),
    "use_tpu": flags.DEFINE_bool("use_tpu", False, "Google's flag: "
                                 "--distribution_strategy=tpu.", **_SAME_NAMES),
    "tpu_name": flags.DEFINE_string("tpu_name", None, "Google's flag: --tpu.", **_SAME_NAMES),
    "num_tpu_cores": flags.DEFINE_integer("num_tpu_cores", None, "Google's flag: unused (the "
                                          "TPU's cores are found).", **_SAME_NAMES),
    **{name: flags.DEFINE_string(name, None, "Google's flag: refused (pass --tpu=grpc://... "
                                 "or run on the TPU VM).", **_SAME_NAMES)
       for name in ("tpu_zone", "gcp_project", "master")},
}


def with_googles_flags(values: dict, given: dict) -> dict:
    """`values` (flag name -> value) with Google's run_pretraining flags `given` (those on
    the command line) turned into this tool's.

    Raises:
      PretrainingError: a flag asking for what this tool does otherwise, naming the way.
    """
    values = dict(values)
    if given.get("do_train") is False:
        if not given.get("do_eval"):
            raise PretrainingError("--do_train=false without --do_eval: nothing to do (give "
                                   "--do_eval to evaluate --init_checkpoint's model)")
        values["do_train"] = False  # `_evaluate`: --eval_input_file, else --input_file
        return _with_tpu_flags(values, given)
    if given.get("do_eval") is False and values.get("eval_input_file"):
        raise PretrainingError("--do_eval=false with --eval_input_file: drop one (evaluation "
                               "runs where --eval_input_file is given)")
    if given.get("do_eval") and not values.get("eval_input_file"):
        logging.warning("--do_eval without --eval_input_file: evaluating on --input_file, the "
                        "training data, as Google's run_pretraining does; held-out data as "
                        "--eval_input_file measures more")
        values["eval_input_file"] = values["input_file"]
    return _with_tpu_flags(values, given)


def _with_tpu_flags(values: dict, given: dict) -> dict:
    """`with_googles_flags` for Google's TPU flags."""
    refused = [name for name in ("tpu_zone", "gcp_project", "master") if given.get(name)]
    if refused:
        raise PretrainingError(f"--{refused[0]}: bert-keras resolves no Cloud TPU by name; pass "
                               "--tpu=grpc://HOST:PORT, or run on the TPU VM (--tpu=local)")
    strategy = values.get("distribution_strategy") or "default"
    if given.get("use_tpu"):
        if strategy not in ("default", "tpu"):
            raise PretrainingError(f"--use_tpu with --distribution_strategy={strategy}: drop "
                                   "one (--use_tpu is --distribution_strategy=tpu)")
        values["distribution_strategy"] = strategy = "tpu"
    if given.get("tpu_name"):
        if values.get("tpu") and values["tpu"] != given["tpu_name"]:
            raise PretrainingError("--tpu_name and --tpu differ: drop one (--tpu_name is --tpu)")
        values["tpu"] = given["tpu_name"]
    loop = given.get("iterations_per_loop")
    if loop is not None and strategy == "tpu":
        if values.get("steps_per_execution", 1) not in (1, loop):
            raise PretrainingError("--iterations_per_loop and --steps_per_execution differ: "
                                   "drop one (--iterations_per_loop is --steps_per_execution "
                                   "on TPUs)")
        values["steps_per_execution"] = loop
    elif loop is not None:
        logging.info("--iterations_per_loop=%d: TPUs' host loop, not used with "
                     "--distribution_strategy=%s (nor by Google's estimator off TPUs)", loop,
                     strategy)
    return values


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = cli.values_from_flags(_FLAGS)
    values.update(tokenizer_config.overrides_from_flags(_TOKENIZER_FLAGS))
    given = {name: holder.value for name, holder in _GOOGLE_FLAGS.items() if holder.present}

    def body() -> int:
        train(PretrainingOptions(**with_googles_flags(values, given)))
        return 0

    # One line naming the file or flag, not a TensorFlow traceback.
    return cli.report_errors(body, (PretrainingError, StrategyError, FileNotFoundError,
                                    files.OutputExistsError), "run_pretraining",
                             on_interrupt="rerun the same command to resume from the newest "
                                          "backup" if given.get("do_train") is not False
                             else None)


if __name__ == "__main__":
    cli.mark_required(cli.required_flags(PretrainingOptions))
    cli.run(main)
