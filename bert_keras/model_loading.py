"""The one way in: what is at a path, and the model, vocabulary and settings it holds.

`load_checkpoint(path)` resolves a path once and returns what it holds: the model, its
BertConfig, its vocabulary and its saved tokenizer settings (docs/DESIGN.md section 5).
Every entry point (pretraining, fine-tuning, feature extraction, exports, verify,
convert_checkpoint) uses it, so a path means the same thing everywhere. This module decides
what a path is; the format readers beneath it, in bert_keras/checkpoints.py, read one format
each (`read_google_model`, `read_hf_model`, `load_keras_model`; keras-hub presets:
bert_keras/keras_hub_presets.py). Accepted forms, tried in
this order:

  run directory     run_pretraining's --output_dir: encoder/ (weights, bert_config.json,
                    vocab.txt, tokenizer_config.json) and pretrainer.weights.h5 (heads)
  encoder directory encoder.weights.h5 + bert_config.json (+ vocab.txt, tokenizer_config.json)
  task directory    a fine-tuned model: model.keras + labels.txt + vocab.txt (+ settings),
                    what run_classifier / run_tagger / run_squad write
  .keras file       any of our models saved with model.save
  .weights.h5 file  pretrainer or encoder weights; bert_config.json beside it (or in the
                    run directory of a checkpoints/ckpt-<step>.weights.h5, whose vocabulary
                    and settings are the run's encoder/ ones) or given
  Hugging Face dir  config.json + model.safetensors or its shards (+ vocab.txt, or transformers 5's
                    tokenizer.json, + tokenizer_config.json): the model config.json's
                    `architectures` names (a BertFor* task model with its id2label as labels)
  TF Hub SavedModel  saved_model.pb + variables/ + assets/vocab.txt: TF Hub's BERT encoders
                    (TF Model Garden's export; casing from its do_lower_case variable), or
                    our own encoder export (export/export_encoder.py; its assets'
                    bert_config.json and tokenizer_config.json)
  keras-hub preset  config.json + model.weights.h5 (+ task.json, task.weights.h5, tokenizer.json,
                    assets/tokenizer/vocabulary.txt), what keras-hub's save_to_preset writes:
                    a BertBackbone an encoder, a BertMaskedLM a pretrainer without NSP, a
                    BertTextClassifier a classifier without label names
                    (bert_keras/keras_hub_presets.py)
  Google checkpoint a TF1 checkpoint prefix (bert_model.ckpt), one of its files, or a
                    directory holding one; bert_config.json beside it or given; casing
                    from the flags, as in Google's tools; a run_classifier or run_squad
                    model.ckpt-N with its head (a task model without label names)
  Model Garden      the same forms of a TF2 object-based checkpoint of TF Model Garden's
                    BertEncoder (or BertPretrainerV2); bert_config.json beside it, given,
                    or read from the shapes; casing from the flags, as for Google's

`fmt="google" | "hf" | "keras" | "keras_hub" | "model_garden" | "tf_hub"`
(convert_checkpoint's --from) names the format instead of guessing it; "keras" is every one
of our own forms (run, encoder and task directories, .keras and .weights.h5 files). The
vocabulary found with the weights is `Checkpoint.vocab_file`: vocab.txt, a keras-hub preset's
assets/tokenizer/vocabulary.txt, a TF Hub SavedModel's assets/vocab.txt, or
a vocab.txt written from a transformers directory's tokenizer.json (`vocab_source` names
the file it came from). `check_vocab_fits` is the one check of a vocabulary against a model's
embedding rows, made wherever the two meet (fine-tuning, extract_features, exports,
convert_checkpoint).

`save_encoder_dir` and `save_task_dir` write our two layouts; both put the vocabulary and
its tokenizer_config.json beside the weights, so the settings travel with the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import os
import re
import tempfile
import warnings
from typing import Callable

import keras
from absl import logging

from bert_keras import checkpoints, keras_hub_presets
from bert_keras.config import BertConfig
from bert_keras.encoder import BertEncoder
from bert_keras.pretrainer import BertPretrainer
from data_prep import files, schema, tokenizer_config
from data_prep.cli import InputError, ToolError
from data_prep.tokenizer_config import TokenizerConfig

WANTS = ("auto", "encoder", "pretrainer")
FORMATS = checkpoints.READ_FORMATS
# Forms that record no tokenizer casing with their vocabulary: it comes from the casing
# flags, as in Google's tools (a TF Hub SavedModel records it unless it lacks do_lower_case).
FORMS_WITHOUT_CASING = ("google", "model_garden", "tf_hub")

# A vocabulary may have fewer tokens than the model has embedding rows (tables padded to a
# multiple of 8 or 128 leave a few rows no token reaches); fewer than this share of the rows
# is the vocabulary of another model.
MIN_VOCAB_SHARE = 0.9


# Google's vocabularies reserve rows for words a user adds ("[unused12]" -> "covid").
_UNUSED_TOKEN = re.compile(r"\[unused\d+\]")


class CheckpointError(ToolError):
    """Nothing usable at a checkpoint path; the message names the path and the forms."""


class VocabMismatchError(InputError):
    """A vocabulary that does not fit a model's embedding table; names both files."""


@dataclasses.dataclass
class Checkpoint:
    """What a checkpoint path holds.

    Attributes:
      model: a BertEncoder, a BertPretrainer, or a fine-tuned task model (BertClassifier,
        BertTagger, BertSpanQA).
      config: the encoder's BertConfig.
      path: the path as given; `form`: which of the module docstring's forms it is.
      vocab_file: the vocabulary found with the weights (a vocab.txt path), or None.
      saved_tokenizer: (settings, the file they came from) found with the weights, or None.
      labels: label names in id order for a task directory, else None.
      vocab_source: the file the vocabulary was read from (vocab.txt, or a transformers
        directory's tokenizer.json when `vocab_file` was written from it), or None.
    """

    model: keras.Model
    config: BertConfig
    path: str
    form: str
    vocab_file: str | None = None
    saved_tokenizer: tuple[TokenizerConfig, str] | None = None
    labels: list[str] | None = None
    vocab_source: str | None = None

    @property
    def encoder(self) -> BertEncoder:
        return self.model if isinstance(self.model, BertEncoder) else self.model.encoder

    def tokenizer_settings(self, overrides=None, warn: Callable[[str], None] | None = None
                           ) -> tuple[TokenizerConfig, str | None]:
        """(settings, their source): the saved ones with explicit `overrides` applied."""
        return tokenizer_config.resolve(self.vocab_file, overrides, self.saved_tokenizer, warn)

    def vocabulary(self, vocab_file: str | None = None, flag: str = "--vocab_file") -> str:
        """The vocabulary to use with this model: `vocab_file` (a flag's value) or the one
        found with the weights, checked against the embedding table (`check_vocab_fits`).

        Raises:
          CheckpointError: neither; VocabMismatchError, schema.VocabError: it does not fit.
        """
        chosen = vocab_file or self.vocab_file
        if not chosen:
            raise CheckpointError(f"{self.path}: no {files.VOCAB_FILE} (or tokenizer.json) "
                                  f"saved with the weights; pass {flag}")
        source = None if vocab_file else self.vocab_source
        check_vocab_fits(self.encoder, chosen, self.path, source)
        if vocab_file:
            self.check_same_vocabulary(vocab_file, flag)
        return chosen

    def check_same_vocabulary(self, vocab_file: str, flag: str = "--vocab_file") -> None:
        """Refuses `vocab_file` when it is not the vocabulary saved with the weights: the
        embeddings were trained on that one's ids. Its [unused*] tokens may be replaced
        (Google's way of adding words) and either may be longer (`check_vocab_fits` holds
        the length to the table).

        Raises:
          VocabMismatchError: a token differs, naming the first and how many.
        """
        if not self.vocab_file or files.absolute(vocab_file) == files.absolute(
                self.vocab_file):
            return
        saved, given = schema.load_vocab(self.vocab_file), schema.load_vocab(vocab_file)
        differ = [i for i, (a, b) in enumerate(zip(saved, given))
                  if a != b and not _UNUSED_TOKEN.fullmatch(a)]
        if differ:
            i = differ[0]
            raise VocabMismatchError(
                f"{flag} {vocab_file}",
                f"not the vocabulary saved with {self.path} ({self.vocab_source or self.vocab_file}"
                f"): line {i + 1} is {given[i]!r} here and {saved[i]!r} there ({len(differ):,} "
                f"token{'s differ' if len(differ) > 1 else ' differs'}), and the model's "
                "embeddings were trained on that one's ids; "
                f"leave {flag} out, or pass a copy of that one (its [unused] tokens may be "
                "replaced)")


def _first_existing(*paths: str) -> str | None:
    return next((p for p in paths if p and files.isfile(p)), None)


_SCRATCH: list[tempfile.TemporaryDirectory] = []  # vocab.txt files made from tokenizer.json


def _scratch_vocab(directory: str, tokens: list[str]) -> str:
    """A vocab.txt (in a directory removed when the process ends) holding `tokens`, the
    WordPiece vocabulary of a transformers directory's tokenizer.json."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.TemporaryDirectory(prefix="bert-keras-vocab-"))
    key = hashlib.sha256(files.absolute(directory).encode()).hexdigest()[:16]
    path = os.path.join(_SCRATCH[0].name, key, files.VOCAB_FILE)
    files.write_text(path, "".join(f"{t}\n" for t in tokens))
    return path


def _vocab_and_settings(directory: str, hf: bool = False):
    """(vocab.txt path, the file it came from, saved settings) found in `directory`. A
    transformers directory's tokenizer.json is read once (`checkpoints.read_hf_tokenizer`):
    its vocabulary, added tokens and normalizer come from that read."""
    found = checkpoints.read_hf_tokenizer(directory) if hf else None
    if found is not None:  # and tokens added beyond them (tokenizer.json, added_tokens.json)?
        checkpoints.check_no_added_tokens(directory, *found)
    tokens, tokenizer_json = found or (None, None)
    vocab = _first_existing(os.path.join(directory, files.VOCAB_FILE))
    if vocab:  # transformers 4 (vocab.txt and tokenizer.json), or ours
        return vocab, vocab, tokenizer_config.read_for_vocab(vocab, tokenizer_json)
    if not hf:
        return None, None, None
    # transformers 5: tokenizer.json only
    vocab = _scratch_vocab(directory, tokens) if tokens is not None else None
    settings_file = os.path.join(directory, files.TOKENIZER_CONFIG_FILE)
    source = os.path.join(directory, checkpoints.HF_TOKENIZER_FILE) if vocab else None
    saved = None
    if files.isfile(settings_file):  # its normalizer where this file gives no casing
        saved = tokenizer_config.read_file(settings_file, tokenizer_json)[0], settings_file
    elif source:
        normalizer = tokenizer_config.normalizer_settings(source, tokenizer_json)
        if normalizer:
            saved = TokenizerConfig.from_json_dict(normalizer, source), source
    return vocab, source, saved


def _recorded_settings(directory: str) -> tuple[TokenizerConfig, str] | None:
    """The tokenizer settings a fine-tuning run recorded in its train_results.json, for a
    model directory whose tokenizer_config.json is gone (the uncased defaults would flip a
    cased model's predictions)."""
    values = files.fine_tuned_with(directory).get("tokenizer")
    if values is None:
        return None
    path = os.path.join(directory, files.TRAIN_RESULTS_FILE)
    try:
        return TokenizerConfig.from_json_dict(values, path), path
    except tokenizer_config.TokenizerConfigError:
        return None


# Forms whose model carries its config (config.json, model.keras), where --bert_config_file
# is not used.
_FORMS_WITH_THEIR_OWN_CONFIG = ("hf", "keras", "task_dir", "keras_hub")


def _warn_if_config_differs(bert_config_file: str, config: BertConfig, path: str) -> bool:
    """A --bert_config_file the checkpoint does not use (it carries its own config) that
    describes another model: said, rather than ignored without a word. Returns whether it
    differs."""
    differs = checkpoints.config_differences(BertConfig.from_json_file(bert_config_file),
                                             config)
    if differs:
        logging.warning("--bert_config_file %s is not used: %s carries its own config, which "
                        "differs (%s)", bert_config_file, path, ", ".join(differs))
    return bool(differs)


def _vocabulary_directory_of_weights(directory: str) -> str:
    """Where the vocabulary of a .weights.h5 in `directory` is: beside it, else, for a run's
    checkpoints/ckpt-<step>.weights.h5, the run directory (run_pretraining writes the
    vocabulary and its settings there when it starts), else the run's encoder/ (written
    when it finishes; runs before the first kept only that one)."""
    parent = os.path.dirname(files.absolute(directory))
    if (not files.isfile(os.path.join(directory, files.VOCAB_FILE))
            and files.isfile(os.path.join(parent, files.RUN_CONFIG_FILE))):
        if files.isfile(os.path.join(parent, files.VOCAB_FILE)):
            return parent
        return os.path.join(parent, files.ENCODER_DIR)
    return directory


def _config_from(path: str, bert_config_file: str | None, directory: str) -> tuple[BertConfig, str]:
    """The config of the weights at `path`: the bert_config.json saved with them (beside
    them, or the run's for its checkpoints/ckpt-<step>.weights.h5), else
    `bert_config_file`. A `bert_config_file` of the same model is used (it may set other
    dropout rates); one of another model is not, and a warning says how it differs:
    building the saved weights into it made another function (other heads or activation)
    without a word, or failed on shapes with Keras' message."""
    own = os.path.join(directory, files.BERT_CONFIG_FILE)
    parent = os.path.dirname(files.absolute(directory))
    if not files.isfile(own) and files.isfile(os.path.join(parent, files.RUN_CONFIG_FILE)):
        own = os.path.join(parent, files.BERT_CONFIG_FILE)  # a run's checkpoints/ckpt-*
    if files.isfile(own):
        config = BertConfig.from_json_file(own)
        if bert_config_file and not _warn_if_config_differs(bert_config_file, config, path):
            return BertConfig.from_json_file(bert_config_file), bert_config_file
        return config, own
    if not bert_config_file:
        raise CheckpointError(f"{path}: no {files.BERT_CONFIG_FILE} beside the weights; pass "
                              "--bert_config_file")
    return BertConfig.from_json_file(bert_config_file), bert_config_file


def _load_weights_file(path: str, config: BertConfig, want: str) -> keras.Model:
    """A pretrainer or an encoder with a `.weights.h5` file, whichever layout it has."""
    if not files.isfile(path):
        raise CheckpointError(f"{path}: no such weights file")
    if files.is_remote(path):  # h5py reads local files only: a gs:// file from a copy
        with files.local_copy(path) as local:
            try:
                return _load_weights_file(local, config, want)
            except CheckpointError as e:  # name the file the user gave, not the copy
                raise CheckpointError(str(e).replace(local, path)) from None
    # A pretrainer with the next-sentence head (run_pretraining's files), or without it
    # (a masked-LM-only model converted from transformers or Google).
    targets = [
        BertPretrainer.from_bert_config(config),
        BertPretrainer.from_bert_config(config, next_sentence=False)]
    if want != "pretrainer":  # an encoder's file, or (want="encoder") a pretrainer's encoder
        targets.insert(0 if want == "encoder" else 2, BertEncoder.from_bert_config(config))
    errors = []
    for model in targets:
        try:
            # An attempt that fails leaves Keras' warnings behind ("Skipping nested
            # container ... will retain their freshly-initialized weights") about a model
            # that is not used: they are shown only for the model returned.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model.load_weights(path)
            for warning in caught:
                warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                       warning.lineno)
            return model
        except ValueError as e:  # Keras: the file's layers do not fit this model
            unfit, what = _weights_mismatch(str(e))
            errors.append((unfit, f"{type(model).__name__}: {what}"))
        except OSError as e:  # h5py: not an HDF5 file, truncated, ...
            raise CheckpointError(f"{path}: cannot read the weights file ({e})") from None
    # The model the file is closest to (fewest layers that do not fit) says what differs.
    raise CheckpointError(f"{path}: the weights fit no model of its bert_config.json "
                          f"({min(errors, key=lambda error: error[0])[1]})")


def _weights_mismatch(message: str) -> tuple[int, str]:
    """(how many layers do not fit, what differs in one line) of Keras' load_weights
    error: the first variable whose shape the file does not have (its path, both shapes),
    else the error's first line with the one after it (the first alone ends at "Example
    error message for object <...>:"). The count is huge where Keras gives none."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    first = lines[0] if lines else message
    count = re.match(r"A total of (\d+) objects could not be loaded", first)
    unfit = int(count.group(1)) if count else 1 << 30
    shapes = re.search(r"variable\.shape=(\([^)]*\)), Received: value\.shape=(\([^)]*\))\. "
                       r"Target variable: <Variable path=([^,>]+)", message)
    if shapes is not None:
        more = f" ({count.group(1)} layers do not fit)" if count else ""
        return unfit, (f"{shapes.group(3)} is {shapes.group(1)} in the model, "
                       f"{shapes.group(2)} in the file{more}")
    if first.endswith(":") and len(lines) > 1:
        first = f"{first} {lines[1][:200]}"
    return unfit, first


def _from_keras_file(path: str) -> keras.Model:
    if files.is_remote(path):  # read from a local copy, as h5py and zipfile need
        if not files.isfile(path):
            raise CheckpointError(f"{path}: no such Keras model file")
        with files.local_copy(path) as local:
            try:
                return _from_keras_file(local)
            except CheckpointError as e:  # name the file the user gave, not the copy
                raise CheckpointError(str(e).replace(local, path)) from None
    try:
        return checkpoints.load_keras_model(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such Keras model file") from None


def _narrow(model: keras.Model, want: str, path: str) -> keras.Model:
    if want == "encoder":
        return model if isinstance(model, BertEncoder) else model.encoder
    if want == "pretrainer" and not isinstance(model, BertPretrainer):
        raise CheckpointError(f"{path}: holds a {type(model).__name__}, not a BertPretrainer "
                              "(no pretraining heads)")
    return model


def _labels_beside(model, directory: str) -> list[str] | None:
    """The labels.txt beside a classifier's or tagger's model.keras, if any; one beside a
    model without labels (a regressor that run_regressor trained from a classifier's output
    before 2026-12-05 was saved with that classifier's) is ignored, with a warning."""
    from bert_keras.tasks import BertClassifier, BertTagger

    path = os.path.join(directory, files.LABELS_FILE)
    if not files.isfile(path):
        return None
    if not isinstance(model, (BertClassifier, BertTagger)):
        logging.warning("%s: ignored; a %s has no labels (remove the file)", path,
                        type(model).__name__)
        return None
    return read_labels(path)


# transformers' other weight files, which no reader here takes: (name, what to do).
_OTHER_HF_WEIGHTS = (
    ("pytorch_model.bin", "a pickle, which bert-keras does not read (it can run code)"),
    ("pytorch_model.bin.index.json", "pickles, which bert-keras does not read (they can run "
                                     "code)"),
    ("tf_model.h5", "transformers' TensorFlow layout, which bert-keras does not read"),
)


def _incomplete_copy(path: str, fmt: str | None) -> str | None:
    """What a directory that is part of a SavedModel or of a keras-hub preset lacks (a copy
    cut short), or None: named, rather than every form listed."""
    if not files.isdir(path):
        return None

    def has(name):
        return files.isfile(os.path.join(path, name))

    if fmt in (None, "tf_hub") and any(has(n) for n in checkpoints.SAVED_MODEL_FILES) \
            and not has(checkpoints.SAVED_MODEL_VARIABLES + ".index"):
        return (f"{path} holds a SavedModel (saved_model.pb) without "
                f"{checkpoints.SAVED_MODEL_VARIABLES}.index, its weights: an incomplete copy? "
                "Copy its whole directory (variables/ and assets/ too)")
    config = os.path.join(path, keras_hub_presets.CONFIG_FILE)
    if fmt in (None, "keras_hub") and has(keras_hub_presets.CONFIG_FILE) \
            and not has(keras_hub_presets.WEIGHTS_FILE):
        try:
            registered = files.read_json(config).get("registered_name", "")
        except (files.TextFileError, AttributeError):
            return None
        if isinstance(registered, str) and registered.startswith("keras_hub>"):
            return (f"{path} holds keras-hub's {keras_hub_presets.CONFIG_FILE} (a "
                    f"{registered.split('>')[-1]}) without {keras_hub_presets.WEIGHTS_FILE}, "
                    "its weights: an incomplete copy? Copy the whole preset directory")
    return None


def _expected_forms(path: str, fmt: str | None) -> str:
    if fmt in (None, "google") and files.isdir(path):
        indexes = checkpoints.checkpoint_indexes(path)
        if len(indexes) > 1:  # (google_checkpoint_prefix reads the one named, or the only)
            names = [os.path.basename(p)[: -len(".index")] for p in indexes]
            return (f"{path} holds {len(names)} TF checkpoints ({', '.join(names[:4])}"
                    f"{' ...' if len(names) > 4 else ''}) and no checkpoint file naming one: "
                    f"pass the prefix of the one to read ({os.path.join(path, names[-1])})")
    incomplete = _incomplete_copy(path, fmt)
    if incomplete:
        return incomplete
    if fmt in (None, "hf") and files.isdir(path):
        for name, why in _OTHER_HF_WEIGHTS:
            if files.isfile(os.path.join(path, name)):
                return (f"{path} holds transformers' {name}, {why}; save the model as "
                        "safetensors with transformers first (from_pretrained(path), then "
                        "save_pretrained(new_path)) and pass that directory")
    what = "does not exist" if not files.exists(path) else "is not a recognised checkpoint"
    if fmt == "hf":
        return (f"{path} {what} in the hf format: expected a transformers save_pretrained "
                f"directory ({files.HF_WEIGHTS_FILE} or its shards + {files.HF_CONFIG_FILE})")
    if fmt == "keras_hub":
        return (f"{path} {what} in the keras_hub format: expected a keras-hub preset directory "
                f"({keras_hub_presets.CONFIG_FILE} + {keras_hub_presets.WEIGHTS_FILE}, written "
                "by save_to_preset)")
    if fmt == "google":
        return (f"{path} {what} in the google format: expected a TF1 checkpoint prefix "
                "(bert_model.ckpt with bert_model.ckpt.index beside it), or a directory "
                "holding one")
    if fmt == "model_garden":
        return (f"{path} {what} in the model_garden format: expected a TF2 checkpoint prefix "
                "of TF Model Garden's BertEncoder (bert_model.ckpt-1 with its .index beside "
                "it), or a directory holding one")
    if fmt == "tf_hub":
        return (f"{path} {what} in the tf_hub format: expected a SavedModel directory "
                "(saved_model.pb, variables/, assets/vocab.txt) of a BERT encoder")
    if fmt == "keras":
        return (f"{path} {what} in the keras format: expected a run_pretraining output "
                f"directory, a directory with {files.ENCODER_WEIGHTS_FILE} + "
                f"{files.BERT_CONFIG_FILE}, a fine-tuned model directory "
                f"({files.TASK_MODEL_FILE}, {files.LABELS_FILE}, ...), or a .keras or "
                ".weights.h5 file")
    return (f"{path} {what}. Expected a run_pretraining output directory, a directory with "
            f"{files.ENCODER_WEIGHTS_FILE} + {files.BERT_CONFIG_FILE}, a fine-tuned model "
            f"directory ({files.TASK_MODEL_FILE}), a .keras or .weights.h5 file, a Hugging "
            f"Face directory ({files.HF_WEIGHTS_FILE} or its shards + {files.HF_CONFIG_FILE}), "
            f"a keras-hub preset ({keras_hub_presets.CONFIG_FILE} + "
            f"{keras_hub_presets.WEIGHTS_FILE}), "
            "a TF Hub SavedModel directory, or a Google checkpoint prefix (bert_model.ckpt "
            "with bert_model.ckpt.index beside it; TF1, or TF Model Garden's TF2)")


def load_checkpoint(path: str, bert_config_file: str | None = None, want: str = "auto",
                    fmt: str | None = None) -> Checkpoint:
    """Resolves `path` (any form of the module docstring) and loads what it holds.

    Args:
      path: the checkpoint.
      bert_config_file: bert_config.json for forms that need one and have none beside them.
      want: "auto" (the model the path holds), "encoder" (its encoder) or "pretrainer"
        (pretraining heads required).
      fmt: None (what the path is decides), or "google", "hf", "keras", "keras_hub",
        "model_garden", "tf_hub": only that format's forms are accepted (convert_checkpoint's
        --from).

    Returns:
      A Checkpoint.

    Raises:
      CheckpointError: nothing usable at `path`; checkpoints.WeightLoadError: weights that
        do not fit their config (every offending tensor named), or a damaged file.
    """
    if want not in WANTS:
        raise ValueError(f"want must be one of {WANTS}; received {want!r}")
    if fmt not in (None, *FORMATS):
        raise ValueError(f"fmt must be None or one of {FORMATS}; received {fmt!r}")
    if not path:
        raise CheckpointError("no checkpoint given (--init_checkpoint is empty)")
    path = os.fspath(path)
    if fmt == "keras_hub" and files.is_remote(path):
        # A gs:// preset (or a kaggle:// or hf:// handle from Python; the tools' flags refuse
        # those first, cli.refuse_unserved_schemes): keras-hub's from_preset reads local
        # directories here, and nothing is downloaded.
        raise CheckpointError(f"{path}: keras-hub presets are read from a local directory; "
                              "copy or download it there first (gsutil cp -r, or keras-hub's "
                              "from_preset then save_to_preset)")
    directory = path if files.isdir(path) else os.path.dirname(files.absolute(path))
    ours = fmt in (None, "keras")  # our own layouts: run, encoder and task directories, files

    def result(model, form, config=None, vocab_dir=directory, labels=None):
        if form == "keras_hub":  # assets/tokenizer/vocabulary.txt + tokenizer.json
            found = keras_hub_presets.read_keras_hub_tokenizer(vocab_dir)
            vocab, source, saved = (found[0], found[0], found[1:]) if found else (None,) * 3
        else:
            vocab, source, saved = _vocab_and_settings(vocab_dir, hf=form == "hf")
        if saved is None and form == "task_dir":
            saved = _recorded_settings(vocab_dir)
        model = _narrow(model, want, path)
        encoder = model if isinstance(model, BertEncoder) else model.encoder
        if bert_config_file and form in _FORMS_WITH_THEIR_OWN_CONFIG:
            _warn_if_config_differs(bert_config_file, encoder.to_bert_config(), path)
        return Checkpoint(model, config or encoder.to_bert_config(), path, form, vocab, saved,
                          labels, source)

    if files.isdir(path):
        encoder_dir = os.path.join(path, files.ENCODER_DIR)
        if ours and files.isfile(os.path.join(encoder_dir, files.ENCODER_WEIGHTS_FILE)):
            config, _ = _config_from(path, bert_config_file, encoder_dir)
            heads = os.path.join(path, files.PRETRAINER_WEIGHTS_FILE)
            if want != "encoder" and files.isfile(heads):
                model = _load_weights_file(heads, config, "pretrainer")
            else:
                model = _load_weights_file(os.path.join(encoder_dir, files.ENCODER_WEIGHTS_FILE),
                                           config, "encoder")
            return result(model, "run", config, vocab_dir=encoder_dir)
        if ours and files.isfile(os.path.join(path, files.ENCODER_WEIGHTS_FILE)):
            config, _ = _config_from(path, bert_config_file, path)
            model = _load_weights_file(os.path.join(path, files.ENCODER_WEIGHTS_FILE), config,
                                       "encoder")
            return result(model, "encoder_dir", config)
        if ours and files.isfile(os.path.join(path, files.TASK_MODEL_FILE)):
            model = _from_keras_file(os.path.join(path, files.TASK_MODEL_FILE))
            return result(model, "task_dir", labels=_labels_beside(model, path))
        if fmt in (None, "hf") and checkpoints.is_hf_dir(path):
            # want="encoder" asks for less: a head in the file is then left out.
            model = checkpoints.read_hf_model(path, want)
            labels = checkpoints.read_hf_labels(path) if want == "auto" else None
            return result(model, "hf", labels=labels)
        if fmt in (None, "tf_hub") and checkpoints.is_saved_model_dir(path):
            model, do_lower_case = checkpoints.read_tf_hub_model(path, want, bert_config_file)
            loaded = result(model, "tf_hub", vocab_dir=os.path.join(
                path, checkpoints.SAVED_MODEL_ASSETS))
            if loaded.saved_tokenizer is None and loaded.vocab_file and do_lower_case is not None:
                # TF Hub's BERT tokenizes with text.BertTokenizer(vocab, lower_case=...):
                # accents stripped exactly when lowercasing, CJK ideographs split.
                loaded.saved_tokenizer = (TokenizerConfig(do_lower_case=do_lower_case),
                                          f"{path}'s do_lower_case variable")
            return loaded
        if fmt in (None, "keras_hub") and (fmt == "keras_hub" or
                                           keras_hub_presets.is_keras_hub_preset(path)):
            # want="encoder": the backbone alone (a task head is left out).
            return result(keras_hub_presets.read_keras_hub_model(path, want), "keras_hub")
        if ours and files.isfile(os.path.join(path, files.RUN_CONFIG_FILE)):
            raise CheckpointError(
                f"{path}: a pretraining run that has not finished (no {files.ENCODER_DIR}/ yet); "
                f"rerun its command to complete it, or pass one of its "
                f"checkpoints/ckpt-*.weights.h5 files")
    if ours and path.endswith(".keras"):
        model = _from_keras_file(path)
        return result(model, "keras", labels=_labels_beside(model, directory))
    if ours and path.endswith(".weights.h5"):
        config, _ = _config_from(path, bert_config_file, directory)
        return result(_load_weights_file(path, config, want), "weights_h5", config,
                      vocab_dir=_vocabulary_directory_of_weights(directory))
    prefix = (checkpoints.google_checkpoint_prefix(path)
              if fmt in (None, "google", "model_garden") else None)
    if prefix is not None and (fmt == "model_garden" or (
            fmt is None and checkpoints.is_tf2_checkpoint(prefix))):
        model = checkpoints.read_model_garden_model(prefix, want, bert_config_file)
        return result(model, "model_garden", vocab_dir=os.path.dirname(files.absolute(prefix)))
    if prefix is not None:
        model = checkpoints.read_google_model(prefix, want, bert_config_file)
        return result(model, "google", vocab_dir=os.path.dirname(files.absolute(prefix)))
    raise CheckpointError(_expected_forms(path, fmt))


def load_encoder(path: str, bert_config_file: str | None = None) -> BertEncoder:
    """The BertEncoder inside whatever `path` holds (any form of the module docstring)."""
    return load_checkpoint(path, bert_config_file, want="encoder").model


def check_vocab_fits(encoder: BertEncoder, vocab_file: str, model_path: str | None = None,
                     vocab_source: str | None = None) -> list[str]:
    """Loads `vocab_file` and checks it against the encoder's embedding table; returns the
    tokens.

    A vocabulary fits when it has at most as many tokens as the table has rows, and at
    least MIN_VOCAB_SHARE (90%) of them: a few rows no token reaches are normal (tables
    padded for speed), a 5-token vocabulary for a 30,522-row model is not.

    Args:
      encoder: the model's encoder.
      vocab_file: the vocab.txt to use.
      model_path: the checkpoint the encoder came from (named in the error).
      vocab_source: the file the vocabulary was read from, when `vocab_file` was made from
        it (a transformers tokenizer.json); named in the error instead of `vocab_file`.

    Raises:
      schema.VocabError: a malformed file; VocabMismatchError: too many or too few tokens,
        naming both numbers and both files.
    """
    vocab = schema.load_vocab(vocab_file)
    rows, count = encoder.vocab_size, len(vocab)
    shown = vocab_source or vocab_file
    model = f"the model {model_path}" if model_path else "the model"
    if count > rows:
        raise VocabMismatchError(
            shown, f"{count:,} tokens, but {model} has {rows:,} embedding rows (vocab_size); "
            f"expected at most {rows:,}: ids past the table cannot be looked up (the "
            "vocabulary of another model?)")
    least = math.ceil(MIN_VOCAB_SHARE * rows)
    if count < least:
        raise VocabMismatchError(
            shown, f"{count:,} tokens for the {rows:,} embedding rows (vocab_size) of {model}; "
            f"expected at least {least:,} ({MIN_VOCAB_SHARE:.0%} of the rows): the vocabulary "
            "of another model?")
    return vocab


# --- Our two layouts. ---


def read_labels(path: str) -> list[str]:
    """labels.txt: one label per line, in id order (no empty or duplicate labels); spaces
    around a label are not part of it (a label list typed by hand: "O " is "O").

    Lines end at "\\n" (`files.newline_for`): a stray "\\r" before a line's end is such a
    space, where universal newlines made it an empty line; one inside a label is refused
    (no label holds a line break), not read as two labels.
    """
    try:
        # Read once, then checked and split: a pipe (--label_list_file=<(printf 'a\nb\n'),
        # /dev/fd/N) gives its bytes to one read only, and a check that read it first left
        # the reader "no labels".
        with files.open_input(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e})") from None
    error = files.first_text_error(io.BytesIO(data), path)
    if error is not None:  # NUL, UTF-16, cp949: the line and how to convert it
        raise error
    # `files.newline_for`, judged on the bytes read.
    lone_cr = files.lone_cr_message(files.line_end_sample(io.BytesIO(data)), path)
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig",
                          newline="" if lone_cr else "\n") as f:
        labels = [line.strip() for line in f]
    for number, label in enumerate(labels, 1):
        if "\r" in label:
            raise CheckpointError(f"{path}:{number}: a carriage return (\\r) inside the label "
                                  f"{label!r}; expected one label a line, lines ending in \\n "
                                  "or \\r\\n")
    return check_labels(labels, path, "line")


def check_labels(labels: list[str], source: str, unit: str) -> list[str]:
    """`labels` (from `source`: a file, whose `unit` is a line, or a flag's list, whose unit
    is an item), refused where one is empty or repeated, or where there are none."""
    for number, label in enumerate(labels, 1):
        if not label.strip():
            where = f"{source}:{number}" if unit == "line" else f"{source}: {unit} {number}"
            raise CheckpointError(f"{where}: empty label")
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise CheckpointError(f"{source}: duplicate labels {repeated}")
    if not labels:
        raise CheckpointError(f"{source}: no labels")
    return labels


def write_vocab_and_settings(directory: str, vocab_file: str | None,
                             settings: TokenizerConfig | None) -> None:
    """Copies `vocab_file` into `directory` as vocab.txt, with `settings` as its
    tokenizer_config.json beside it (nothing without a vocabulary)."""
    if vocab_file:
        target = os.path.join(directory, files.VOCAB_FILE)
        saved = tokenizer_config.saved_model_max_length(vocab_file)  # kept for transformers
        files.copy_file(vocab_file, target)
        tokenizer_config.write_for_vocab(target, settings or TokenizerConfig(),
                                         model_max_length=saved)


def save_encoder_dir(encoder: BertEncoder, directory: str, vocab_file: str | None = None,
                     settings: TokenizerConfig | None = None, overwrite: bool = False) -> str:
    """Writes encoder.weights.h5, bert_config.json, vocab.txt and tokenizer_config.json.

    The directory is assembled under a temporary name and renamed when complete.
    """
    with files.atomic_output(directory, overwrite=overwrite, directory=True,
                             hint="choose another directory") as tmp:
        checkpoints.save_weights(encoder, os.path.join(tmp, files.ENCODER_WEIGHTS_FILE))
        encoder.to_bert_config().to_json_file(os.path.join(tmp, files.BERT_CONFIG_FILE))
        write_vocab_and_settings(tmp, vocab_file, settings)
    return directory


def _save_uncompiled(model: keras.Model, path: str) -> None:
    """`model.save` as if the model had never been compiled: architecture and weights, no
    optimizer state or compile settings (what Keras 3 has instead of include_optimizer).

    Keras saves an optimizer it finds on the model and a compile config when `compiled`;
    both are hidden for the call and restored after. (A copy built from the config would do
    the same at the cost of a second set of weights in memory while saving.)
    """
    state = {"optimizer": getattr(model, "optimizer", None), "compiled": model.compiled}
    if state["optimizer"] is None and not state["compiled"]:
        model.save(path)
        return
    try:
        model.optimizer, model.compiled = None, False
        model.save(path)
    finally:
        model.optimizer, model.compiled = state["optimizer"], state["compiled"]


def save_task_dir(model: keras.Model, directory: str, labels: list[str] | None,
                  vocab_file: str, settings: TokenizerConfig, overwrite: bool = False,
                  include_optimizer: bool = False, train_results: dict | None = None) -> str:
    """Writes a fine-tuned model's directory: model.keras, labels.txt, bert_config.json,
    vocab.txt, tokenizer_config.json and train_results.json (what the loader's "task
    directory" form and the task exports read).

    model.keras, which makes the directory a model, comes last: it is written under a
    temporary name, the files beside it are written, and it is renamed into place; with
    `overwrite` the model it replaces is removed before them. So an interrupted save
    leaves no model, never a model beside another's labels, casing or length (which the
    exports would then have used without a word, or the defaults where they were missing).

    Args:
      model: the task model.
      directory: created if needed; existing files of the layout are replaced only with
        `overwrite`.
      labels: label names in id order (None for span QA).
      vocab_file: the vocabulary the model was fine-tuned with.
      settings: the tokenizer settings it was fine-tuned with.
      include_optimizer: keep the optimizer state in model.keras (to resume training);
        without it the file holds the weights only (3x smaller with Adam's slots).
      train_results: written as train_results.json (the fine-tuning's settings), if given.

    Raises:
      ValueError: `model` is not one of our task models (a model of the user's own).
    """
    if not isinstance(model, checkpoints.TASK_MODELS):
        names = ", ".join(cls.__name__ for cls in checkpoints.TASK_MODELS)
        raise ValueError(
            f"save_task_dir: a {type(model).__name__} is not a task model ({names}), the "
            "only models this layout and the task exports hold; keep a model of your own "
            "with model.save(path.keras), and its encoder with save_encoder_dir")
    files.makedirs(directory)
    model_path = os.path.join(directory, files.TASK_MODEL_FILE)
    with files.atomic_output(model_path, overwrite=overwrite,
                             hint="pass --overwrite_output to replace it") as tmp:
        if include_optimizer:
            model.save(tmp)
        else:
            _save_uncompiled(model, tmp)
        if (files.exists(model_path) if files.is_remote(model_path)
                else os.path.lexists(model_path)):  # overwrite: the old model goes first
            files.remove(model_path)
        if labels is not None:
            files.write_text(os.path.join(directory, files.LABELS_FILE),
                             "".join(f"{label}\n" for label in labels))
        encoder = model.encoder if not isinstance(model, BertEncoder) else model
        files.write_text(os.path.join(directory, files.BERT_CONFIG_FILE),
                         encoder.to_bert_config().to_json_string().rstrip("\n") + "\n")
        write_vocab_and_settings(directory, vocab_file, settings)
        if train_results is not None:
            files.write_json(os.path.join(directory, files.TRAIN_RESULTS_FILE), train_results)
    return directory
