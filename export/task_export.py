"""What the task export CLIs (export_classifier, export_regressor, export_tagger, export_span_qa)
share.

Their flags (--model_dir, --export_dir, --version, --max_seq_length, --length_buckets,
--serving_dtype, --kernel_layout), the loading of a fine-tuned model directory and the body
of their `main`.
This module defines no flags when imported, so a task export imports it without the other
exports' flags.
"""

from __future__ import annotations

import os
from typing import Callable

from absl import app, flags, logging

from data_prep import files, tokenizer_config
from export import batching_parameters, keras_backend, length_buckets, saved_model_writer



def define_flags(model_dir_help: str, max_seq_length: int, max_seq_length_help: str) -> dict:
    """Defines --model_dir, --export_dir, --version, --max_seq_length, --length_buckets,
    --serving_dtype and --kernel_layout; returns holders.

    The flags belong to the calling tool, so its --help lists them.

    Args:
      model_dir_help: --model_dir's help: which tool's output directory the export reads.
      max_seq_length: --max_seq_length's default (the tool's fine-tuning default).
      max_seq_length_help: --max_seq_length's help.

    Returns:
      name -> FlagHolder for the seven flags.
    """
    from bert_keras.tasks import KERNEL_LAYOUTS, SERVING_DTYPES
    from data_prep.cli import calling_module

    module = calling_module()
    kwargs = {"allow_override": True, "module_name": module}
    holders = {"model_dir": flags.DEFINE_string("model_dir", None, model_dir_help, **kwargs)}
    holders.update(saved_model_writer.define_flags(module))
    holders["max_seq_length"] = flags.DEFINE_integer(
        "max_seq_length", max_seq_length,
        f"{max_seq_length_help} Default: the length --model_dir records in "
        f"{files.TRAIN_RESULTS_FILE} (the fine-tuning tools write it), else {max_seq_length} "
        "or the model's position table where that is shorter.",
        **kwargs)
    holders["length_buckets"] = length_buckets.define_flag(module)
    holders["serving_dtype"] = flags.DEFINE_enum(
        "serving_dtype", "float32", list(SERVING_DTYPES),
        "What the exported model computes in. float32: the fine-tuned model's outputs up to "
        "float32 rounding. bfloat16: weights stored and matmuls run in bfloat16 (half the "
        "bytes per request; faster on CPUs with AMX, emulated and slower without AMX or "
        "AVX512-BF16), LayerNorm, softmax and logits in float32; outputs differ by bfloat16 "
        f"rounding ({files.doc_path('serving.md')}).", **kwargs)
    holders["kernel_layout"] = flags.DEFINE_enum(
        "kernel_layout", "in_out", list(KERNEL_LAYOUTS),
        "How the export stores its encoder's Dense kernels. in_out: [in, out], Keras' and "
        "Google's (the trained model's). out_in: [out, in], torch's nn.Linear's, whose "
        "products TensorFlow's oneDNN runs faster at about 16 WordPieces and slower from 32 "
        f"on. The same outputs up to float32 rounding ({files.doc_path('serving.md')}).",
        **kwargs)
    return holders


def define_pair_flag(scores: str):
    """Defines --pair of an export of a pooled-[CLS] head (`scores`: what the task does with
    a pair, e.g. "classifies"); the flag belongs to the calling tool. Read it with
    `given_or_recorded(holder, recorded, "text_pair", ...)`."""
    from data_prep.cli import calling_module

    return flags.DEFINE_boolean(
        "pair", False, f"The task {scores} sentence pairs (serve_examples reads text and "
        f"text_b). Default: whether --model_dir was fine-tuned on pairs "
        f"({files.TRAIN_RESULTS_FILE}), else false.", allow_override=True,
        module_name=calling_module())


def given_or_recorded(holder, recorded: dict, key: str, what: str):
    """A flag's value where the command line gives it, else what the fine-tuning recorded
    under `key`, else the flag's default; logs which, and warns where the given value
    differs from the recorded one (`what` names the setting)."""
    value = recorded.get(key)
    if holder.present:
        if value is not None and holder.value != value:
            logging.warning("--%s=%s, but the model was fine-tuned with %s=%s (%s)",
                            holder.name, holder.value, key, value, files.TRAIN_RESULTS_FILE)
        return holder.value
    if value is None:
        return holder.value
    logging.info("%s: %s, as fine-tuned (%s; --%s overrides)", what, value,
                 files.TRAIN_RESULTS_FILE, holder.name)
    return value


def unrecorded_seq_length(model_dir: str, holder, recorded: dict, seq_length: int) -> int:
    """`seq_length`, or the model's position table where it is shorter and neither the
    command line nor a fine-tuning record gave the length: a model converted from
    transformers records no train_results.json, and the tool's default (128, 384) can
    exceed its table (max_position_embeddings in the bert_config.json beside the model;
    read before the model is loaded, as the length decides what is refused then)."""
    from bert_keras.config import BertConfig

    path = os.path.join(model_dir, files.BERT_CONFIG_FILE)
    if recorded or holder.present or not files.isfile(path):
        return seq_length
    try:
        positions = BertConfig.from_json_file(path).max_position_embeddings
    except (OSError, ValueError):  # the model's loading names what is wrong with it
        return seq_length
    if positions >= seq_length:
        return seq_length
    logging.info("Sequence length: %d, the model's position table (max_position_embeddings "
                 "in %s; --%s overrides)", positions, path, holder.name)
    return positions


def warn_unrecorded_defaults(model_dir: str, recorded: dict, holders,
                             taken: dict | None = None) -> None:
    """Where --model_dir records no fine-tuning at all (no train_results.json: a model
    converted from transformers, whose config.json has no place for them), warns in one
    line naming the defaults taken for the settings the fine-tuning records (`holders`)
    that the command line does not give: a pair model exported without --pair serves
    single texts, and TF Serving's Classify / Regress APIs then drop text_b unread.
    `taken`: flag name -> the value taken where it is not the flag's default."""
    if recorded:
        return
    taken = taken or {}

    def shown(h):
        value = taken.get(h.name, h.value)
        return str(value).lower() if isinstance(value, bool) else value

    taken = [f"--{h.name}" + ("" if shown(h) is None else f"={shown(h)}")
             for h in holders if not h.present]
    if taken:
        logging.warning("--model_dir %s: the export takes %s, the default%s; give the values "
                        "the model was fine-tuned with", files.records_no_fine_tuning(model_dir),
                        ", ".join(taken), "" if len(taken) == 1 else "s")


def load_task_dir(model_dir: str, model_class, tool: str, tokenizer_flags: dict,
                  needs_labels: bool = True, export_dir: str | None = None,
                  version: int | None = None):
    """(model, labels, tokenizer) of a fine-tuned model directory, for the task exports.

    Args:
      model_dir: what `tool` (run_classifier, run_regressor, run_tagger, run_squad) writes, or
        `convert_checkpoint --to=keras` makes from a transformers BertFor* directory.
      model_class: the task model class expected there.
      tokenizer_flags: the tool's tokenizer flag holders (explicit overrides).
      needs_labels: whether labels.txt is required.
      export_dir, version: where the export will go; when given, an existing version is
        refused before the model is loaded (which takes seconds to minutes).

    Raises:
      saved_model_writer.ExportError: another model, no labels.txt / vocab.txt, or an
        existing version.
    """
    from bert_keras import model_loading
    from data_prep.tokenization import BertTokenizer

    if export_dir is not None:
        saved_model_writer.version_dir(export_dir, version)

    if not files.isdir(model_dir):  # the loader's message lists forms no export takes
        what = "not a directory" if files.exists(model_dir) else "no such directory"
        raise saved_model_writer.ExportError(
            f"--model_dir {model_dir}: {what} (expected {tool}'s output directory, with "
            f"{files.TASK_MODEL_FILE})")
    ckpt = model_loading.load_checkpoint(model_dir)
    if not isinstance(ckpt.model, model_class):
        raise saved_model_writer.ExportError(
            f"--model_dir {model_dir} holds a {type(ckpt.model).__name__}, not a "
            f"{model_class.__name__} (expected {tool}'s output directory)")
    if (needs_labels and ckpt.labels is None) or ckpt.vocab_file is None:
        raise saved_model_writer.ExportError(
            f"--model_dir {model_dir}: no {'labels.txt or ' if needs_labels else ''}vocab.txt "
            f"beside the model (expected {tool}'s output directory)")
    vocab_file = ckpt.vocabulary()
    settings, source = ckpt.tokenizer_settings(
        tokenizer_config.overrides_from_flags(tokenizer_flags), warn=logging.warning)
    logging.info("Tokenizer settings: %s (%s)", settings.describe(),
                 source or "defaults and flags")
    return ckpt.model, ckpt.labels, BertTokenizer.from_config(vocab_file, settings)


def write_text_in_export(module, path: str, signatures: dict, warmup: list, buckets,
                         method_names=(), split_requests: bool = True) -> str:
    """Writes a text-in export's version and TF Serving's batching parameters for it.

    `<version>/batching_params.pbtxt` goes into the version; `batching_parameters.txt`
    beside it unless an identical one is there (`export.batching_parameters`).

    Args:
      module, path, signatures, warmup, method_names: as `saved_model_writer.write_saved_model`.
      buckets: the export's length buckets (`PreprocessorModule.buckets`).
      split_requests: `batching_parameters.for_buckets`'.

    Returns:
      `path`.

    Raises:
      saved_model_writer.ExportError: batching_parameters.txt exists with other contents
        (checked before anything is written).
    """
    export_dir = os.path.dirname(path)
    text = batching_parameters.text_for(buckets, split_requests)
    batching_parameters.check_beside(export_dir, text)
    # Served, not differentiated: the layers' custom gradients are not saved.
    saved_model_writer.write_saved_model(
        module, path, signatures, warmup, method_names=method_names,
        version_files={batching_parameters.PER_MODEL_FILE: text}, custom_gradients=False)
    batching_parameters.write_beside(export_dir, text)
    return path


def task_dir_errors() -> tuple:
    """The errors a task export reports in one line."""
    from bert_keras import checkpoints, model_loading
    from data_prep.schema import VocabError

    return (saved_model_writer.ExportError, model_loading.CheckpointError,
            checkpoints.WeightLoadError, VocabError, tokenizer_config.TokenizerConfigError,
            FileNotFoundError)


def run(argv, task_flags: dict, tokenizer_flags: dict, model_class: str, tool: str,
        export: Callable, prog: str, needs_labels: bool = True,
        environment_backend: str | None = None, split_requests: bool = True,
        recorded_flags: tuple = ()) -> int:
    """The `main` of a task export: loads --model_dir, exports it, prints the version path.

    Args:
      argv: what absl left of the command line (only the program name is accepted).
      task_flags: `define_flags`' holders; tokenizer_flags: the tool's tokenizer holders.
      model_class: the name of the `bert_keras.tasks` class expected in --model_dir
        (imported here, after the command line is checked).
      tool: the fine-tuning tool whose output directory --model_dir is (for messages).
      export: `export(model, tokenizer, labels, export_dir, seq_length, version=...,
        buckets=..., serving_dtype=..., kernel_layout=..., recorded=...)` -> the written
        version's path;
        `recorded` is `files.fine_tuned_with(--model_dir)`.
      prog: the export tool's name.
      needs_labels: whether --model_dir must hold labels.txt.
      environment_backend: what KERAS_BACKEND said (`keras_backend.use_tensorflow()`),
        for the line saying which backend the export used.
      split_requests: as `write_text_in_export` takes it.
      recorded_flags: the tool's own flag holders that default to what the fine-tuning
        recorded (`given_or_recorded`), besides --max_seq_length.

    Returns:
      The exit status: 0, or 1 after one error line on stderr.
    """
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from bert_keras import backends, tasks
    from data_prep.cli import report_errors

    def body() -> int:
        backends.check_backend(backends.EXPORT_BACKENDS)
        logging.info(keras_backend.describe(environment_backend))
        export_dir, version = task_flags["export_dir"].value, task_flags["version"].value
        buckets = length_buckets.parse_flag(task_flags["length_buckets"].value)
        recorded = files.fine_tuned_with(task_flags["model_dir"].value)
        seq_length = unrecorded_seq_length(
            task_flags["model_dir"].value, task_flags["max_seq_length"], recorded,
            given_or_recorded(task_flags["max_seq_length"], recorded, "max_seq_length",
                              "Sequence length"))
        # Refused before the model is loaded, as an existing version is.
        batching_parameters.check_beside(export_dir, batching_parameters.text_for(
            length_buckets.resolve(buckets, seq_length), split_requests))
        model, labels, tokenizer = load_task_dir(
            task_flags["model_dir"].value, getattr(tasks, model_class), tool, tokenizer_flags,
            needs_labels=needs_labels, export_dir=export_dir, version=version)
        warn_unrecorded_defaults(task_flags["model_dir"].value, recorded,
                                 (task_flags["max_seq_length"], *recorded_flags),
                                 taken={"max_seq_length": seq_length})
        dtype = task_flags["serving_dtype"].value
        if dtype != "float32":
            logging.info("Serving dtype: %s (weights and matmuls; --serving_dtype)", dtype)
        print(export(model, tokenizer, labels, export_dir, seq_length, version=version,
                     buckets=buckets, serving_dtype=dtype,
                     kernel_layout=task_flags["kernel_layout"].value, recorded=recorded))
        return 0

    return report_errors(body, task_dir_errors(), prog)
