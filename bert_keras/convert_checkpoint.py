r"""Converts BERT weights between Google TF1 checkpoints, Hugging Face, Keras files and keras-hub
presets, and imports TF Model Garden TF2 checkpoints and TF Hub BERT SavedModels.

Formats (see bert_keras/checkpoints.py):
  google  TF1 checkpoint prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt, with
          bert_config.json beside it (or --bert_config_file).
  hf      transformers save_pretrained directory (config.json + model.safetensors, or its
          shards with model.safetensors.index.json).
  keras   our own layouts: a run_pretraining --output_dir, an encoder/ directory
          (encoder.weights.h5 + bert_config.json), a fine-tuned model directory, a .keras
          file (model.save) or a .weights.h5 file with bert_config.json beside it.
  keras_hub  a keras-hub preset directory (save_to_preset: config.json + model.weights.h5,
          tokenizer.json + assets/tokenizer/vocabulary.txt, task.json + task.weights.h5):
          BertBackbone <-> encoder, BertMaskedLM <-> pretrainer (keras-hub has no NSP
          head), BertTextClassifier <-> BertClassifier (bert_keras/keras_hub_presets.py).
Read only (--from):
  model_garden  TF Model Garden's TF2 checkpoint of a BertEncoder (tf.train.Checkpoint(
          encoder=...), its BERT releases; or BertPretrainerV2's, with the masked-LM head),
          e.g. bert_model.ckpt-1, with bert_config.json beside it (or --bert_config_file,
          else the config is read from the shapes).
  tf_hub  a TF Hub BERT encoder SavedModel directory (saved_model.pb, variables/,
          assets/vocab.txt, do_lower_case), or our own export.export_encoder's.

    python -m bert_keras.convert_checkpoint --from=tf_hub --to=keras \
        --input=bert_en_cased_L-12_H-768_A-12_4 --output=/tmp/bert_cased   # vocab + casing

    python -m bert_keras.convert_checkpoint --from=google --to=hf \
        --input=uncased_L-12_H-768_A-12/bert_model.ckpt --output=/tmp/bert_hf
    python -m bert_keras.convert_checkpoint --from=keras --to=hf \
        --input=runs/phase2 --output=/tmp/my_bert_hf   # your pretrained BERT, for transformers
    python -m bert_keras.convert_checkpoint --from=keras_hub --to=keras \
        --input=my_keras_hub_preset --output=/tmp/my_bert   # keras-hub's BERT, for our tools

A pretrained model's vocab.txt and tokenizer settings go into --to=hf's directory with it,
so transformers' AutoTokenizer reads it (from our layouts and transformers'; a Google
checkpoint records no casing, so its vocab.txt is left for you to copy), and into a
--to=keras directory: an encoder's layout (encoder.weights.h5, bert_config.json, vocab.txt,
tokenizer_config.json) or, for a pretrainer, run_pretraining's (pretrainer.weights.h5 and
that encoder/), which the fine-tuning tools and the exports read; a .keras file holds the
weights alone.

--model=auto converts the model the input holds: for hf, what config.json's `architectures`
names (BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
BertForTokenClassification, BertForQuestionAnswering; BertForMaskedLM with the NSP head in
its file, as bert-base-uncased's, is a pretrainer with it); for google, the pretraining
heads when present, or run_classifier's or run_squad's head. --model=encoder asks for the
encoder alone (heads are left out); --model=pretrainer
requires pretraining heads. A head is never dropped otherwise: a tensor the model would not
use is an error. --to=google writes the prefix given (out/bert_model.ckpt), or
<dir>/bert_model.ckpt for a directory (out/), with bert_config.json beside it and, as
Google's releases have it, vocab.txt where the input has a vocabulary (with its
tokenizer_config.json: the casing, Google's layout has no place for it). Existing output is
never overwritten.

Fine-tuned task models (classifier, tagger, span QA) move between transformers and the
layout run_classifier / run_tagger / run_squad write, so the exports work on it unchanged:

    python -m bert_keras.convert_checkpoint --from=hf --to=keras \
        --input=my_transformers_classifier --output=runs/imported
    python -m export.export_classifier --model_dir=runs/imported --export_dir=/models/clf

--to=keras then writes a directory (model.keras, labels.txt from id2label, vocab.txt,
tokenizer_config.json with the input's tokenizer settings, bert_config.json); --from=keras
takes such a directory, and --to=hf writes transformers' BertFor* layout with id2label,
vocab.txt and tokenizer_config.json (AutoModelFor... and AutoTokenizer read it).

A Google run_classifier checkpoint (model.ckpt-N with output_weights) and a keras-hub
BertTextClassifier record no label names: give them in the head's order as to
run_classifier (--label_list, --label_list_file or --task_name), one per class, and
--to=keras / --to=hf write them (labels.txt; id2label and label2id):

    python -m bert_keras.convert_checkpoint --from=google --to=hf --task_name=mrpc \
        --do_lower_case=true --input=mrpc_output/model.ckpt-343 --output=/tmp/mrpc_hf

An input with its own labels (labels.txt, id2label) takes only the same.

--input, --output and --bert_config_file may be remote (gs://): a Google or transformers
input is read from a local copy of its directory's files, an output written locally and
uploaded when complete (a Google checkpoint's index last), as the other tools write to GCS.
"""

import contextlib
import os
import re
import shutil
import tempfile

from absl import app, flags, logging

from bert_keras import backends, checkpoints, model_loading
from bert_keras.encoder import BertEncoder
from bert_keras.finetuning.classification import (LABEL_FLAGS, ClassifierOptions,
                                                  labels_from_label_flags)
from bert_keras.pretrainer import BertPretrainer
from data_prep import cli, files, glue, tokenizer_config

# Google-style flag names (input, output, bert_config_file) recur across our tools;
# allow_override lets tests import several entry points into one process.
_SHARED = {"allow_override": True}

_FROM = flags.DEFINE_enum("from", None, checkpoints.READ_FORMATS, "Format of --input.",
                          **_SHARED)
_TO = flags.DEFINE_enum("to", None, checkpoints.FORMATS, "Format of --output.", **_SHARED)
# A list flag like build_vocab's and prepare_corpus's --input (one name, one type in a
# process); it takes exactly one path here.
_INPUT = flags.DEFINE_list(
    "input", None, "google, model_garden: checkpoint prefix; hf: save_pretrained directory; "
    "tf_hub: SavedModel directory; keras: a run_pretraining or run_classifier --output_dir, "
    "an encoder/ directory, a .keras or a .weights.h5 file; keras_hub: a save_to_preset "
    "directory.",
    **_SHARED,
)
_OUTPUT = flags.DEFINE_string(
    "output", None, "google: checkpoint prefix; hf: a directory; keras: a directory (with "
    "the vocabulary and tokenizer settings: an encoder's layout, run_pretraining's for a "
    "pretrainer, run_classifier's for a task model) or a .keras file (weights only); "
    "keras_hub: a preset directory; must not exist.", **_SHARED
)
_MODEL = flags.DEFINE_enum(
    "model", "auto", model_loading.WANTS,
    "auto: the model the input holds, heads included; encoder: the encoder alone (heads "
    "left out); pretrainer: require pretraining heads.",
    **_SHARED,
)
_BERT_CONFIG_FILE = flags.DEFINE_string(
    "bert_config_file", None,
    "--from=google, model_garden or keras: bert_config.json, if it is not beside the "
    "checkpoint (or the .weights.h5); --from=tf_hub: the encoder's activation, where it is "
    "not Model Garden's gelu.",
    **_SHARED,
)
# A Google checkpoint records no casing: as with Google's tools, these flags give it (the
# vocabulary is written only with them). Given for another input, they override the
# settings saved with it.
_TOKENIZER_FLAGS = tokenizer_config.define_flags()
# A Google run_classifier checkpoint and a keras-hub BertTextClassifier record no label
# names: run_classifier's own flags give them (--task_name, --label_list, --label_list_file),
# read as it reads them; their help here names no flag of run_classifier's data (this tool
# reads none).
_LABEL_FLAGS = cli.define_flags(ClassifierOptions, only=LABEL_FLAGS, helps={
    "task_name": "The input classifier's labels are this run_classifier task's, in the order "
                 "run_classifier gives them: " + ", ".join(
                     t for t in glue.TASKS if not glue.get_processor(t).is_regression()) + ".",
    "label_list": "The input classifier's labels in id order, for an input that records none "
                  "(a Google run_classifier checkpoint, a keras-hub BertTextClassifier).",
    "label_list_file": "--label_list's labels from a file, one a line.",
})


# What a message calls each form without casing (model_loading.FORMS_WITHOUT_CASING).
_FORM_NAMES = {"google": "Google checkpoint", "model_garden": "TF Model Garden checkpoint",
               "tf_hub": "SavedModel without a do_lower_case variable"}


def _load(from_format: str, input_path: str, model: str, config_file: str | None,
          tokenizer_overrides: dict | None = None):
    """(model, labels, vocab file, tokenizer settings, why a vocabulary found is left out)
    of the input; None where it has none.

    The one loader reads it (`model_loading.load_checkpoint` with the format named); a
    vocabulary found with the weights (vocab.txt, or transformers 5's tokenizer.json) must
    fit the model's embedding table. `tokenizer_overrides` (`overrides_from_flags`): the
    casing flags given, the settings of a Google checkpoint's vocabulary.

    Raises:
      ValueError: a Google task model with a vocabulary and no casing flag (before, it was
        written with do_lower_case=true, whatever its vocabulary's case).
    """
    prefix = checkpoints.google_checkpoint_prefix(input_path) if from_format == "google" else None
    names = checkpoints.read_google_checkpoint_names(prefix) if prefix is not None else {}
    # A TF2 checkpoint's names are object paths, not heads: the loader refuses it, naming
    # --from=model_garden.
    if model != "encoder" and checkpoints.TF2_OBJECT_GRAPH not in names:
        others = checkpoints.google_heads_left_out(names)
        if others:
            raise checkpoints.WeightLoadError(
                f"{prefix}: holds tensors of a head bert-keras does not build from a Google "
                f"checkpoint ({', '.join(others[:4])}{' ...' if len(others) > 4 else ''}; it "
                "builds run_classifier's and run_squad's); convert its encoder with "
                "--model=encoder, which leaves the head out")
    ckpt = model_loading.load_checkpoint(input_path, config_file, want=model, fmt=from_format)
    if ckpt.vocab_file:
        ckpt.vocabulary()
    settings = ckpt.saved_tokenizer[0] if ckpt.saved_tokenizer else None
    overrides = tokenizer_overrides or {}
    if settings is not None and overrides:
        settings = settings.with_overrides(overrides, ckpt.saved_tokenizer[1],
                                           warn=logging.warning)
    elif settings is None and ckpt.vocab_file and overrides:
        settings = tokenizer_config.TokenizerConfig().with_overrides(overrides, None)
    if (settings is None and ckpt.form in model_loading.FORMS_WITHOUT_CASING
            and ckpt.vocab_file and isinstance(ckpt.model, checkpoints.TASK_MODELS)):
        raise ValueError(
            f"--input {input_path}: a Google checkpoint records no tokenizer casing, and its "
            f"{type(ckpt.model).__name__} is written with {ckpt.vocab_file}: pass "
            "--do_lower_case=true or --do_lower_case=false, as to the tool that trained it")
    if settings is None and ckpt.form == "hf" and ckpt.vocab_file:
        # A transformers directory with vocab.txt and no tokenizer_config.json: transformers
        # tokenizes it with BertTokenizer's defaults, which go with its vocabulary (before,
        # --to=hf and --to=keras left the vocabulary out).
        settings = tokenizer_config.TokenizerConfig()
    if not isinstance(ckpt.model, checkpoints.TASK_MODELS):
        # An encoder or pretrainer carries its vocabulary where its tokenizer settings were
        # saved with it (our layouts, transformers'), or the casing flags give: a Google
        # checkpoint records no casing.
        if settings is None and ckpt.form in model_loading.FORMS_WITHOUT_CASING \
                and ckpt.vocab_file:
            return ckpt.model, None, None, None, (
                f"{ckpt.vocab_file} is left out: a {_FORM_NAMES[ckpt.form]} records no "
                "tokenizer casing (pass --do_lower_case=true or false, as to the tool that "
                "trained it, to write the vocabulary with its settings)")
        return ckpt.model, None, ckpt.vocab_file if settings else None, settings, None
    return ckpt.model, ckpt.labels, ckpt.vocab_file, settings, None


def convert(from_format: str, to_format: str, input_path: str, output_path: str,
            model: str = "auto", config_file: str | None = None,
            tokenizer_overrides: dict | None = None, labels: list[str] | None = None,
            labels_flag: str = "labels"):
    """Loads weights in one format and writes them in another.

    Args:
      from_format: "google", "hf", "keras", "keras_hub", "model_garden" or "tf_hub".
      to_format: "google", "hf", "keras" or "keras_hub".
      input_path, output_path: see the module docstring; either may be remote (gs://).
      model: "auto", "encoder" or "pretrainer".
      config_file: bert_config.json for a Google input not beside its checkpoint (or a
        .weights.h5 without one beside it); local or remote.
      tokenizer_overrides: the tokenizer settings given (`overrides_from_flags`): a Google
        checkpoint's vocabulary is written only with them.
      labels: a classifier's or tagger's label names in its head's id order, for an input
        that records none (a Google run_classifier checkpoint, a keras-hub
        BertTextClassifier): one per class; an input with its own (labels.txt, id2label)
        must hold the same. `labels_flag` names where they came from in messages
        (--label_list, --task_name=mrpc).

    Returns:
      (written path, the loaded model).

    Raises:
      data_prep.cli.InputError: Keras runs on another backend than TensorFlow or JAX.
      FileExistsError: the output exists (checked before anything is loaded).
      data_prep.files.OutputWriteError: the output's place cannot be written (checked then
        too, `files.check_writable`).
      FileNotFoundError, checkpoints.WeightLoadError, ValueError: bad input.
    """
    backends.check_backend()  # TensorFlow or JAX: other backends load these files wrongly
    # A remote (gs://) output is written to a local stage and uploaded when complete, a
    # remote Google or transformers input read from a local copy: transformers' and
    # safetensors' files, TensorFlow's checkpoint glob and the Google writer's renames are
    # local only. Errors name the paths given, not the local copies.
    with _staged_output(to_format, output_path) as (local_output, output_named), \
            _local_input(from_format, input_path) as (local_input, input_named), \
            _local_file(config_file) as (local_config, config_named):
        try:
            checkpoints.check_output_free(to_format, local_output)
            loaded, found, *tokenizer = _load(from_format, local_input, model, local_config,
                                              tokenizer_overrides)
            found = _given_labels(loaded, found, labels, labels_flag, input_path)
            written, loaded = _convert(from_format, to_format, input_path, local_output,
                                       loaded, found, *tokenizer)
        except (OSError, ValueError, TypeError) as e:
            _raise_as_given(e, output_named | input_named | config_named)
            raise
    for local, given in output_named.items():  # the staged prefix first, then its directory
        written = written.replace(local, given)
    return written, loaded


def _given_labels(model, found: list[str] | None, given: list[str] | None, flag: str,
                  input_path: str) -> list[str] | None:
    """The label names to write with `model`: `found` with the input, or `given` (from
    `flag`) where it has none; refused where `given` does not fit the head (another number
    of classes, no labelled head) or differs from `found`. transformers' placeholder names
    (LABEL_0 ... LABEL_{C-1}, a head saved without names) are no names: `given` takes their
    place, as run_classifier's data labels do."""
    if given is None:
        return found
    if found is not None and checkpoints.placeholder_labels(found):
        found = None
    if not isinstance(model, checkpoints.LABELLED_TASK_MODELS):
        raise ValueError(f"{flag}: names a classifier's labels; --input {input_path} gives a "
                         f"{type(model).__name__}, which has none: drop {flag} (it would be "
                         "ignored)")
    if len(given) != model.num_classes:
        raise ValueError(f"{flag}: {len(given)} labels for the {type(model).__name__} of "
                         f"--input {input_path}, whose head has {model.num_classes} classes; "
                         "give one label per class, in the head's order")
    if found is not None and list(found) != list(given):
        raise ValueError(f"{flag}: {list(given)} differ from the labels --input {input_path} "
                         f"holds ({list(found)}); drop {flag}, or give the same labels in the "
                         "same order")
    return list(given)


def _raise_as_given(error: Exception, named: dict) -> None:
    """Raises `error` again with the local copies' paths in its message replaced by the
    paths given (`named`: {local: given}); returns if it names none."""
    message = str(error)
    if not any(local in message for local in named):
        return
    for local, given in named.items():
        message = message.replace(local, given)
    try:
        renamed = type(error)(message)
    except Exception:  # noqa: BLE001 -- an error type taking other arguments: as it is
        return
    raise renamed from None


@contextlib.contextmanager
def _local_file(path: str | None):
    """(path, {}) for a local or no `path`; for a remote file, (a local copy, {copy:
    path}) while the block runs."""
    if not path or not files.is_remote(path):
        yield path, {}
        return
    if not files.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    with files.local_copy(path) as local:
        yield local, {local: path}


# A Google checkpoint's files: another checkpoint's in the same directory are not copied.
_CHECKPOINT_FILE = re.compile(r"\.(index|meta|data-\d{5}-of-\d{5})$")


@contextlib.contextmanager
def _local_input(from_format: str, path: str):
    """(input path, {local directory: remote directory}) to read `path` from: itself where it
    is local, or a --from=keras input (model_loading reads our layouts on gs:// itself); for
    a remote Google, Model Garden or transformers input, the same name in a local copy of
    its directory's files (not its subdirectories, such as a transformers Trainer's
    checkpoint-*/; of a checkpoint prefix's directory, that checkpoint's files and the
    others beside it, not other checkpoints'); for a SavedModel (tf_hub), a copy of its
    whole tree (variables/, assets/); removed when the block ends."""
    if not files.is_remote(path) or from_format in ("keras", "keras_hub"):
        yield path, {}  # keras_hub: model_loading refuses a remote preset in one line
        return
    import tensorflow as tf

    path = path.rstrip("/")
    # A Google prefix first: ram:// takes "x/bert_model.ckpt" for a directory, as it is a
    # prefix of "x/bert_model.ckpt.index".
    named_prefix = from_format in ("google", "model_garden") and files.exists(
        _CHECKPOINT_FILE.sub("", path) + ".index")
    if not named_prefix and not files.exists(path):
        yield path, {}  # the loader says what it expected there, as for a local path
        return
    is_dir = not named_prefix and files.isdir(path)
    directory = path if is_dir else os.path.dirname(path)
    prefix = None if is_dir else _CHECKPOINT_FILE.sub("", os.path.basename(path))
    stage = tempfile.mkdtemp(prefix="bert-keras-download-")
    try:
        local = os.path.join(stage, os.path.basename(directory))
        os.makedirs(local)
        if from_format == "tf_hub" and is_dir:
            os.rmdir(local)
            _copy_tree(directory, local)
        for name in [] if from_format == "tf_hub" else files.listdir(directory):
            source = f"{directory}/{name}"
            if files.isdir(source) or (prefix is not None and _CHECKPOINT_FILE.search(name)
                                       and not name.startswith(prefix + ".")):
                continue
            tf.io.gfile.copy(source, os.path.join(local, name))
        yield (local if is_dir else os.path.join(local, os.path.basename(path))), {
            local: directory}
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _copy_tree(source: str, target: str) -> None:
    """Copies the remote directory `source` (a SavedModel: its variables/ and assets/) into
    the new local directory `target`."""
    import tensorflow as tf

    os.makedirs(target)
    for name in files.listdir(source):
        name = name.rstrip("/")
        if files.isdir(f"{source}/{name}"):
            _copy_tree(f"{source}/{name}", os.path.join(target, name))
        else:
            tf.io.gfile.copy(f"{source}/{name}", os.path.join(target, name))


@contextlib.contextmanager
def _staged_output(to_format: str, path: str):
    """(output path, {local stage: remote path}) to write the conversion to: `path` where it
    is local; for a remote one, a local stage, uploaded when the block completes (nothing
    on an error). An existing output is refused first, as locally.

    --to=hf and --to=keras: `files.atomic_output` stages the directory (or .keras file)
    and uploads it. --to=google writes into a directory that may hold other files: the
    stage gets copies of those the writers compare with (bert_config.json, vocab.txt,
    tokenizer_config.json: kept where the same, else refused), and only the new files are
    uploaded, the checkpoint's index last (it exists once its index does)."""
    if not files.is_remote(path):
        yield path, {}
        return
    path = path.rstrip("/") + ("/" if path.endswith("/") else "")
    if to_format == "google":
        with _staged_google_output(path) as staged:
            yield staged
        return
    final = path.rstrip("/")
    is_dir = not (to_format == "keras" and final.endswith(".keras"))
    empty_dir = to_format == "hf" and files.isdir(final) and not files.listdir(final)
    if files.exists(final) and not empty_dir:
        raise FileExistsError(f"refusing to overwrite existing output: {final}")
    with files.atomic_output(final, overwrite=empty_dir, directory=is_dir) as tmp:
        if is_dir and to_format == "keras":
            os.rmdir(tmp)  # our layouts' writers refuse an existing directory, even empty
        yield tmp, {tmp: final}


@contextlib.contextmanager
def _staged_google_output(path: str):
    """`_staged_output` for --to=google."""
    import tensorflow as tf

    # A directory (out/, or one that exists) gets bert_model.ckpt in it, as locally; an
    # existing prefix is checked first (ram:// takes "x.ckpt" for a directory once
    # "x.ckpt.index" exists).
    is_dir = path.endswith("/") or (not files.exists(path + ".index") and files.isdir(path))
    prefix = path.rstrip("/") + "/" + checkpoints.GOOGLE_CHECKPOINT_NAME if is_dir else path
    directory = os.path.dirname(prefix)
    if files.exists(prefix + ".index"):
        raise FileExistsError(f"refusing to overwrite existing output: {prefix}.index")
    stage = tempfile.mkdtemp(prefix="bert-keras-upload-")
    try:
        beside = (files.BERT_CONFIG_FILE, files.VOCAB_FILE, files.TOKENIZER_CONFIG_FILE)
        there = {name for name in beside if files.isfile(f"{directory}/{name}")}
        for name in there:
            tf.io.gfile.copy(f"{directory}/{name}", os.path.join(stage, name))
        yield os.path.join(stage, os.path.basename(prefix)), {
            os.path.join(stage, os.path.basename(prefix)): prefix, stage: directory}
        new = sorted(set(os.listdir(stage)) - there, key=lambda n: (n.endswith(".index"), n))
        for name in new:
            files.copy_file(os.path.join(stage, name), f"{directory}/{name}", overwrite=False)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _save_keras_layout(model, output_path: str, vocab_file, settings) -> str:
    """An encoder or pretrainer --to=keras: a .keras file (the weights alone), or a
    directory in our layout with the vocabulary and tokenizer settings: an encoder's
    (encoder.weights.h5, bert_config.json, vocab.txt, tokenizer_config.json), or
    run_pretraining's (pretrainer.weights.h5, bert_config.json and that encoder/)."""
    if output_path.endswith(".keras"):
        if vocab_file:
            logging.warning("--output %s holds the weights only; the vocabulary and tokenizer "
                            "settings (%s) stay out of a .keras file: give a directory to "
                            "keep them with the weights", output_path, settings.describe())
        return checkpoints.save_model(model, "keras", output_path)
    if output_path.endswith(".h5"):
        raise ValueError(f"--output {output_path}: --to=keras writes a .keras file or a "
                         "directory (an encoder's layout, or run_pretraining's for a "
                         "pretrainer, with vocab.txt and tokenizer_config.json)")
    if isinstance(model, BertPretrainer) and not model.head_follows_encoder:
        raise ValueError(f"--output {output_path}: the masked-LM head computes with "
                         f"{model.masked_lm.activation!r} and LayerNorm epsilon "
                         f"{model.masked_lm.layer_norm_epsilon:g} (keras-hub's), which "
                         "run_pretraining's layout (bert_config.json) cannot record: give a "
                         ".keras file, which keeps them, or --model=encoder for a directory")
    checkpoints.check_output_free("keras", output_path)
    if isinstance(model, BertEncoder):
        return model_loading.save_encoder_dir(model, output_path, vocab_file, settings)
    with files.atomic_output(output_path, directory=True) as tmp:
        model_loading.save_encoder_dir(model.encoder, os.path.join(tmp, files.ENCODER_DIR),
                                       vocab_file, settings)
        checkpoints.save_weights(model, os.path.join(tmp, files.PRETRAINER_WEIGHTS_FILE))
        model.encoder.to_bert_config().to_json_file(os.path.join(tmp, files.BERT_CONFIG_FILE))
    return output_path


def _save_google(model, output_path: str, vocab_file, settings) -> str:
    """A Google checkpoint as Google's releases lay it out: bert_model.ckpt.* and
    bert_config.json, and vocab.txt beside them where the input has a vocabulary, with its
    tokenizer_config.json (Google's layout has none; the casing otherwise lives only in the
    directory's name, and a Korean model's strip_accents=false would be lost). A vocab.txt
    or tokenizer_config.json already there is kept where it is the same, else refused before
    anything is written."""
    prefix = checkpoints.google_output_prefix(output_path)
    if vocab_file:
        vocab = os.path.join(os.path.dirname(prefix), files.VOCAB_FILE)
        config = tokenizer_config.path_for_vocab(vocab)
        settings = settings or tokenizer_config.TokenizerConfig()
        if os.path.exists(vocab) and files.read_bytes(vocab) != files.read_bytes(vocab_file):
            raise FileExistsError(f"refusing to overwrite existing output: {vocab} (another "
                                  "vocabulary); write the checkpoint into another directory")
        if os.path.exists(config) and (tokenizer_config.read_for_vocab(vocab) or
                                       (None,))[0] != settings:
            raise FileExistsError(f"refusing to overwrite existing output: {config} (other "
                                  "tokenizer settings); write the checkpoint into another "
                                  "directory")
    written = checkpoints.save_model(model, "google", output_path)
    if vocab_file:
        if not os.path.exists(vocab):
            files.copy_file(vocab_file, vocab, overwrite=False)
        if not os.path.exists(config):
            tokenizer_config.write_for_vocab(vocab, settings, overwrite=False)
    return written


def _warn_without_vocabulary(input_path, output_path, vocab_file, left_out=None) -> None:
    """Before writing a transformers directory or our directory layout (a .keras file holds
    no vocabulary) from an input with none, or any output but a .keras file from an input
    whose vocabulary is left out (`left_out` says why)."""
    if vocab_file is None and not output_path.endswith(".keras") and left_out:
        logging.warning("%s: %s will hold the weights without a vocabulary", left_out,
                        output_path)
    elif vocab_file is None and not output_path.endswith(".keras"):
        logging.warning("No vocab.txt found with --input %s: %s will hold the weights without "
                        "a vocabulary (transformers' AutoTokenizer and the fine-tuning tools "
                        "need one: copy the vocab.txt the model was trained with, and its "
                        "tokenizer_config.json, beside them)", input_path, output_path)


def _convert(from_format, to_format, input_path, output_path, loaded, labels, vocab_file,
             settings, left_out):
    if not isinstance(loaded, checkpoints.TASK_MODELS):
        # A Google checkpoint may go without a vocabulary (none was found: no warning), but
        # one found and left out for want of its casing is said for every output.
        if to_format != "google" or left_out:
            _warn_without_vocabulary(input_path, output_path, vocab_file, left_out)
        if to_format == "keras":
            return _save_keras_layout(loaded, output_path, vocab_file, settings), loaded
        if to_format == "google":
            return _save_google(loaded, output_path, vocab_file, settings), loaded
        tokenizer = dict(vocab_file=vocab_file, settings=settings) if vocab_file else {}
        return checkpoints.save_model(loaded, to_format, output_path, **tokenizer), loaded
    if to_format == "keras_hub":  # no label names there: a warning says so
        return checkpoints.save_model(loaded, "keras_hub", output_path, labels=labels,
                                      vocab_file=vocab_file, settings=settings), loaded
    if to_format == "google":
        raise ValueError(f"--to=google holds encoders and pretrainers; a "
                         f"{type(loaded).__name__} converts --to=keras or --to=hf (or pass "
                         "--model=encoder)")
    if labels is None and isinstance(loaded, checkpoints.LABELLED_TASK_MODELS):
        google = {"google": " (a Google run_classifier checkpoint keeps them in its processor, "
                            "not in the checkpoint)",
                  "keras_hub": " (a keras-hub preset records none)"}.get(from_format, "")
        raise ValueError(f"--input {input_path}: no label names for its "
                         f"{type(loaded).__name__} ({files.LABELS_FILE} or id2label){google}; "
                         "give them in its head's order (--label_list, --label_list_file or "
                         "--task_name, as to run_classifier), or convert its encoder with "
                         "--model=encoder, which leaves the head out")
    if to_format == "hf":
        _warn_without_vocabulary(input_path, output_path, vocab_file)
        return checkpoints.save_model(loaded, "hf", output_path, labels=labels,
                                      vocab_file=vocab_file, settings=settings), loaded
    if output_path.endswith(".keras"):
        raise ValueError(f"--output {output_path}: a {type(loaded).__name__} converts to a "
                         f"directory ({files.TASK_MODEL_FILE}, {files.LABELS_FILE}, "
                         f"{files.VOCAB_FILE}, ...), as run_classifier writes; give a directory")
    if vocab_file is None:
        raise ValueError(f"--input {input_path}: no {files.VOCAB_FILE} beside the model; the "
                         "fine-tuned model layout needs the vocabulary (save the tokenizer "
                         "there too: tokenizer.save_pretrained(dir))")
    # The whole directory under a temporary name: a save that fails part-way (a full disk)
    # left the directory, which the rerun then refused as an existing output.
    with files.atomic_output(output_path, directory=True, hint="choose another directory") as tmp:
        model_loading.save_task_dir(loaded, tmp, labels, vocab_file,
                                    settings or tokenizer_config.TokenizerConfig())
    return output_path, loaded


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    if _BERT_CONFIG_FILE.value and _FROM.value in ("hf", "keras_hub"):
        raise app.UsageError("--bert_config_file applies to --from=google and --from=keras "
                             "(a .weights.h5 without bert_config.json beside it); a "
                             "transformers directory or keras-hub preset holds its config.json")
    if len(_INPUT.value or []) != 1:
        raise app.UsageError(f"--input: expected one path; received {_INPUT.value}")
    label_values = cli.values_from_flags(_LABEL_FLAGS)
    labels_flag = (f"--task_name={label_values['task_name']}" if label_values["task_name"]
                   else "--label_list_file" if label_values["label_list_file"]
                   else "--label_list")

    def body() -> int:
        written, model = convert(_FROM.value, _TO.value, _INPUT.value[0], _OUTPUT.value,
                                 _MODEL.value, _BERT_CONFIG_FILE.value,
                                 tokenizer_config.overrides_from_flags(_TOKENIZER_FLAGS),
                                 labels_from_label_flags(label_values), labels_flag)
        labels = f", {model.num_classes} labels" if hasattr(model, "num_classes") else ""
        print(f"wrote {type(model).__name__} ({len(model.weights)} weights, "
              f"{model.count_params():,} parameters{labels}) as {_TO.value}: {written}")
        return 0

    # WeightLoadError and the label flags' FinetuneError are ValueErrors; their messages
    # name the file or flag.
    return cli.report_errors(body, (FileNotFoundError, FileExistsError, ValueError, TypeError))


if __name__ == "__main__":
    cli.mark_required(["from", "to", "input", "output"])
    cli.run(main)
