"""Plumbing shared by the fine-tuning entry points (run_classifier, run_tagger, run_squad,
extract_features): where the encoder comes from, the tokenizer, tf.data, training with BERT's
optimizer, prediction, and output files that are never silently overwritten.

`--init_checkpoint` (one meaning in every entry point) may be:
  - empty: a randomly initialised encoder of `--bert_config_file`;
  - a Google TF1 checkpoint prefix (`<prefix>.index` exists) or a directory holding one
    (bert_config.json beside it, or `--bert_config_file`);
  - a Hugging Face save_pretrained directory (model.safetensors + config.json);
  - one of ours: a `.keras` file (BertEncoder, BertPretrainer, or a fine-tuned task model of
    the right kind), a `.weights.h5` file, a directory with encoder.weights.h5 +
    bert_config.json (see `bert_keras.model_loading`), or a run_pretraining --output_dir
    (its encoder/ is used).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from bert_keras import checkpoints, model_loading
from bert_keras.config import BertConfig
from bert_keras.encoder import BertEncoder
from bert_keras.optimization import create_optimizer
from bert_keras.pretrainer import BertPretrainer
from bert_keras.tasks import BertClassifier, BertSpanQA, BertTagger, compile_args

TASK_MODEL_FILE = "model.keras"
LABELS_FILE = "labels.txt"


# ------------------------------------------------------------------------------------------
# Tokenizer


def make_tokenizer(vocab_file: str, do_lower_case: bool = True):
    """Our BertTokenizer (batch `tokenize` + `convert_tokens_to_ids`, what the converters use).

    Cached per (file, modification time, casing): building one takes seconds.
    """
    path = os.path.abspath(vocab_file)
    return _tokenizer(path, os.stat(path).st_mtime_ns, bool(do_lower_case))


@functools.lru_cache(maxsize=4)
def _tokenizer(path, mtime, do_lower_case):
    del mtime  # part of the cache key only
    from data_prep.tokenization import BertTokenizer

    return BertTokenizer(path, do_lower_case=do_lower_case)


def vocab_size(vocab_file: str) -> int:
    with open(vocab_file, encoding="utf-8") as f:
        return sum(1 for _ in f)


# ------------------------------------------------------------------------------------------
# Encoder / model


def _is_google_checkpoint(path: str) -> bool:
    if os.path.exists(path + ".index") or path.endswith(".index"):
        return True
    return os.path.isdir(path) and bool(glob.glob(os.path.join(path, "*.index"))) and not (
        os.path.exists(os.path.join(path, "model.safetensors"))
        or os.path.exists(os.path.join(path, model_loading.ENCODER_WEIGHTS))
    )


def load_encoder_or_task(init_checkpoint: str | None, bert_config_file: str | None,
                         task_class=None):
    """Returns a BertEncoder, or a fine-tuned task model of `task_class` if that is what
    `init_checkpoint` holds (see the module docstring for the accepted forms).

    Raises:
      ValueError / FileNotFoundError: nothing usable at the path, naming what was expected.
    """
    if not init_checkpoint:
        if not bert_config_file:
            raise ValueError("give --init_checkpoint, or --bert_config_file for a randomly "
                             "initialised encoder")
        logging.info("Random initialisation from %s", bert_config_file)
        return BertEncoder.from_bert_config(BertConfig.from_json_file(bert_config_file))
    path = os.fspath(init_checkpoint)
    if path.endswith(".keras"):
        model = _load_keras_file(path)
        if task_class is not None and isinstance(model, task_class):
            return model
        if isinstance(model, BertPretrainer):
            return model.encoder
        if isinstance(model, BertEncoder):
            return model
        if isinstance(model, (BertClassifier, BertTagger, BertSpanQA)):
            logging.info("%s holds a %s: using its encoder", path, type(model).__name__)
            return model.encoder
        raise ValueError(f"{path} holds a {type(model).__name__}; expected a BertEncoder, "
                         "BertPretrainer or a bert_keras task model")
    if _is_google_checkpoint(path):
        return checkpoints.load_model("google", path, model="encoder", config_file=bert_config_file)
    run_encoder = os.path.join(path, "encoder")  # a run_pretraining output_dir: its encoder/
    if os.path.exists(os.path.join(run_encoder, model_loading.ENCODER_WEIGHTS)):
        path = run_encoder
    return model_loading.load_encoder(path, bert_config_file)


def _load_keras_file(path: str) -> keras.Model:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Keras model file not found: {path}")
    try:
        return keras.saving.load_model(path)
    except Exception as e:  # zipfile, h5py and Keras errors alike: name the file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: cannot load Keras model ({first})") from None


def check_seq_length(encoder: BertEncoder, max_seq_length: int) -> None:
    if max_seq_length > encoder.max_sequence_length:
        raise ValueError(f"max_seq_length={max_seq_length} exceeds the encoder's position table "
                         f"({encoder.max_sequence_length} positions)")


def check_vocab(encoder: BertEncoder, vocab_file: str) -> None:
    size = vocab_size(vocab_file)
    if size != encoder.vocab_size:
        raise ValueError(f"{vocab_file} has {size} tokens but the encoder's vocab_size is "
                         f"{encoder.vocab_size}: wrong vocabulary for this checkpoint")


# ------------------------------------------------------------------------------------------
# Data and training


def make_dataset(x: dict, y: dict | None, batch_size: int, shuffle: bool = False,
                 seed: int = 0, repeat: bool = False, drop_remainder: bool = False) -> tf.data.Dataset:
    """tf.data over in-memory arrays (all int32 [N, ...]); deterministic for a seed.

    Autotune is off and prefetch fixed: with autotune, `fit` can wait seconds for a
    background thread after its last step (DESIGN.md section 9).
    """
    data = (x, y) if y is not None else x
    ds = tf.data.Dataset.from_tensor_slices(data)
    n = len(next(iter(x.values())))
    if shuffle:
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(2)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.deterministic = True
    return ds.with_options(options)


class StepLogger(keras.callbacks.Callback):
    """Logs loss, learning rate and speed every `every` steps (fit's bar is useless in logs)."""

    def __init__(self, total_steps: int, every: int = 50):
        super().__init__()
        self.total_steps, self.every = total_steps, max(1, every)
        self.history = []

    def on_train_begin(self, logs=None):
        self._start = time.time()

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if step % self.every == 0 or step == self.total_steps:
            lr = self.model.optimizer.learning_rate
            lr = float(lr.numpy() if hasattr(lr, "numpy") else lr)
            loss = float((logs or {}).get("loss", float("nan")))
            elapsed = time.time() - self._start
            self.history.append({"step": step, "loss": loss, "learning_rate": lr, "seconds": elapsed})
            logging.info("step %d/%d  loss %.4f  lr %.3g  %.2f s/step", step, self.total_steps,
                         loss, lr, elapsed / step)


def train(model: keras.Model, x: dict, y: dict, batch_size: int, num_train_epochs: float,
          learning_rate: float, warmup_proportion: float, seed: int = 0,
          log_every: int = 50, jit_compile: bool = False) -> dict:
    """Fine-tunes `model` with AdamW + warmup/linear decay (BERT's optimizer), plain fit.

    Google's step count: num_train_steps = int(N / batch_size * num_train_epochs) updates on
    full batches (drop_remainder, static shapes), warmup = int(steps * warmup_proportion).

    XLA (`jit_compile`) is 5-20% faster per step here but costs seconds of compilation per
    model (DESIGN.md section 9): worth it for real runs, not for tiny ones.

    Returns:
      {"num_examples", "num_train_steps", "num_warmup_steps", "seconds", "loss_history"}.
    """
    n = len(next(iter(x.values())))
    if n < batch_size:
        raise ValueError(f"{n} training examples is fewer than train_batch_size={batch_size}")
    num_train_steps = max(1, int(n / batch_size * num_train_epochs))
    num_warmup_steps = int(num_train_steps * warmup_proportion)
    optimizer = create_optimizer(learning_rate, num_train_steps, num_warmup_steps)
    model.compile(optimizer=optimizer, jit_compile=jit_compile, **compile_args(model))
    ds = make_dataset(x, y, batch_size, shuffle=True, seed=seed, repeat=True,
                      drop_remainder=True).take(num_train_steps)
    logger = StepLogger(num_train_steps, log_every)
    logging.info("Training: %d examples, batch %d, %d steps (%d warmup), peak lr %g", n,
                 batch_size, num_train_steps, num_warmup_steps, learning_rate)
    start = time.time()
    model.fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=[logger])  # tf.data shuffles
    return {"num_examples": n, "num_train_steps": num_train_steps,
            "num_warmup_steps": num_warmup_steps, "seconds": round(time.time() - start, 1),
            "loss_history": logger.history}


def predict(model: keras.Model, x: dict, batch_size: int) -> dict[str, np.ndarray]:
    """Runs the model in inference mode over arrays; returns its dict outputs as numpy."""
    n = len(next(iter(x.values())))
    outputs = {}
    for start in range(0, n, batch_size):
        batch = {k: v[start:start + batch_size] for k, v in x.items()}
        for key, value in model.predict_on_batch(batch).items():
            outputs.setdefault(key, []).append(np.asarray(value))
    return {k: np.concatenate(v) for k, v in outputs.items()}


# ------------------------------------------------------------------------------------------
# Output files


def prepare_output_dir(output_dir: str, names: list[str], overwrite: bool = False) -> None:
    """Creates `output_dir`; refuses (FileExistsError) if any of `names` already exists there."""
    os.makedirs(output_dir, exist_ok=True)
    existing = [n for n in names if os.path.lexists(os.path.join(output_dir, n))]
    if existing and not overwrite:
        raise FileExistsError(f"{output_dir} already holds {existing}; refusing to overwrite "
                              "(choose another --output_dir or pass --overwrite_output)")


def _atomic_write(path: str, write) -> str:
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def write_text(path: str, text: str) -> str:
    """Writes text under a temporary name, then renames it into place."""
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return _atomic_write(path, write)


def write_json(path: str, obj) -> str:
    return write_text(path, json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n")


def write_jsonl(path: str, records) -> str:
    return write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def save_task_model(model: keras.Model, output_dir: str, labels: list[str] | None,
                    vocab_file: str, overwrite: bool = False) -> None:
    """Writes model.keras, labels.txt (if any), vocab.txt and bert_config.json to output_dir."""
    path = os.path.join(output_dir, TASK_MODEL_FILE)
    if overwrite and os.path.exists(path):
        os.remove(path)
    checkpoints.save_keras_model(model, path)
    if labels is not None:
        write_text(os.path.join(output_dir, LABELS_FILE), "".join(f"{label}\n" for label in labels))
    vocab_out = os.path.join(output_dir, model_loading.VOCAB_FILE)
    if os.path.abspath(vocab_file) != os.path.abspath(vocab_out):
        _atomic_write(vocab_out, lambda tmp: shutil.copyfile(vocab_file, tmp))
    config_text = model.encoder.to_bert_config().to_json_string()
    write_text(os.path.join(output_dir, model_loading.CONFIG_FILE),
               config_text if config_text.endswith("\n") else config_text + "\n")


def read_labels(path: str) -> list[str]:
    """One label per line (blank lines not allowed: a label may not be empty)."""
    with open(path, encoding="utf-8") as f:
        labels = [line.rstrip("\n") for line in f]
    for number, label in enumerate(labels, 1):
        if not label.strip():
            raise ValueError(f"{path}:{number}: empty label")
    if len(set(labels)) != len(labels):
        raise ValueError(f"{path}: duplicate labels")
    return labels


def labels_beside(model_path: str) -> list[str]:
    """The labels.txt saved next to a fine-tuned model.keras."""
    path = os.path.join(os.path.dirname(os.path.abspath(model_path)), LABELS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {LABELS_FILE} beside {model_path}; pass --label_list_file")
    return read_labels(path)



# ------------------------------------------------------------------------------------------
# Flags shared by run_classifier, run_tagger and run_squad (Google's names)


# Flag names are Google's and shared with other tools (vocab_file, init_checkpoint, ...);
# allow_override lets several entry points be imported into one process (a test session)
# without absl's DuplicateFlagError, as in data_prep/create_pretraining_data.py.
SHARED_FLAG_ARGS = {"allow_override": True}


class CommonFlags:
    """FlagHolders every fine-tuning entry point defines (call `define_common_flags` once at
    module top; read `.value` only in main)."""


def define_common_flags(max_seq_length=128, learning_rate=5e-5, num_train_epochs=3.0,
                        train_batch_size=32):
    """Defines the flags Google's run_classifier.py / run_squad.py share; returns holders."""
    from absl import flags

    shared = SHARED_FLAG_ARGS
    f = CommonFlags()
    f.vocab_file = flags.DEFINE_string(
        "vocab_file", None, "WordPiece vocabulary the model was trained with (default: "
        "vocab.txt beside --init_checkpoint, or in --output_dir when not training).", **shared)
    f.do_lower_case = flags.DEFINE_boolean("do_lower_case", True, "Lower-case input (uncased models).", **shared)
    f.bert_config_file = flags.DEFINE_string(
        "bert_config_file", None, "bert_config.json: for random initialisation, or for a checkpoint "
        "without one beside it.", **shared)
    f.init_checkpoint = flags.DEFINE_string(
        "init_checkpoint", None, "Initial weights: a Hugging Face directory, a Google checkpoint "
        "prefix, or ours (.keras, .weights.h5, encoder directory). Empty: random initialisation.", **shared)
    f.output_dir = flags.DEFINE_string("output_dir", None, "Where the model and results go (required).", **shared)
    f.do_train = flags.DEFINE_boolean("do_train", False, "Fine-tune on --train_file.", **shared)
    f.do_eval = flags.DEFINE_boolean("do_eval", False, "Score the model on --eval_file.", **shared)
    f.do_predict = flags.DEFINE_boolean("do_predict", False, "Write predictions for --predict_file.", **shared)
    f.max_seq_length = flags.DEFINE_integer(
        "max_seq_length", max_seq_length, "WordPieces per sequence, [CLS]/[SEP] included; longer "
        "input is truncated (and counted).", **shared)
    f.train_batch_size = flags.DEFINE_integer("train_batch_size", train_batch_size, "Training batch size.", **shared)
    f.eval_batch_size = flags.DEFINE_integer("eval_batch_size", 64, "Batch size for eval and predict.", **shared)
    f.learning_rate = flags.DEFINE_float("learning_rate", learning_rate, "Peak learning rate of AdamW.", **shared)
    f.num_train_epochs = flags.DEFINE_float("num_train_epochs", num_train_epochs, "Training epochs.", **shared)
    f.warmup_proportion = flags.DEFINE_float(
        "warmup_proportion", 0.1, "Fraction of training steps with linear learning-rate warmup.", **shared)
    f.seed = flags.DEFINE_integer("seed", 12345, "Seed for initialisation, dropout and shuffling.", **shared)
    f.jit_compile = flags.DEFINE_boolean(
        "jit_compile", False, "Compile the training step with XLA (faster steps, slower start).", **shared)
    f.overwrite_output = flags.DEFINE_boolean(
        "overwrite_output", False, "Replace results already in --output_dir instead of refusing.", **shared)
    return f


def common_values(f: CommonFlags) -> dict:
    """The common flags' values as plain keyword arguments for a runner's `run`."""
    return {name: holder.value for name, holder in vars(f).items()}


def resolve_vocab(vocab_file: str | None, init_checkpoint: str | None, output_dir: str,
                  do_train: bool) -> str:
    """--vocab_file, else vocab.txt beside the checkpoint (or in output_dir when not training)."""
    if vocab_file:
        if not os.path.exists(vocab_file):
            raise FileNotFoundError(f"vocabulary not found: {vocab_file}")
        return vocab_file
    candidates = []
    if init_checkpoint:
        base = init_checkpoint if os.path.isdir(init_checkpoint) else os.path.dirname(
            os.path.abspath(init_checkpoint))
        candidates += [os.path.join(base, model_loading.VOCAB_FILE),
                       os.path.join(base, "encoder", model_loading.VOCAB_FILE)]
    if not do_train:
        candidates.append(os.path.join(output_dir, model_loading.VOCAB_FILE))
    for path in candidates:
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no --vocab_file given and none found at {candidates}")


def task_model(task_class, init_checkpoint, bert_config_file, output_dir, do_train, build):
    """The model to train or run.

    Training: a fine-tuned `task_class` .keras at --init_checkpoint is trained further; any
    other checkpoint gives an encoder and `build(encoder)` adds a new head. Not training:
    --init_checkpoint if it is a fine-tuned `task_class` .keras, else output_dir/model.keras.

    Returns:
      (model, path it was loaded from or None).
    """
    if do_train:
        loaded = load_encoder_or_task(init_checkpoint, bert_config_file, task_class)
        if isinstance(loaded, task_class):
            return loaded, init_checkpoint
        return build(loaded), None
    path = init_checkpoint if (init_checkpoint or "").endswith(".keras") else os.path.join(
        output_dir, TASK_MODEL_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"nothing to evaluate: {path} does not exist (train with "
                                "--do_train, or point --init_checkpoint at a fine-tuned model.keras)")
    model = _load_keras_file(path)
    if not isinstance(model, task_class):
        raise ValueError(f"{path} holds a {type(model).__name__}, expected a {task_class.__name__}")
    return model, path
