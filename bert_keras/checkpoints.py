"""Weights in and out: one name table between our variables, Google's and Hugging Face's.

Every BERT weight has three names:
  ours    the Keras variable path, e.g. `transformer_layer_3/self_attention/query/kernel`
  google  the TF1 checkpoint name, e.g. `bert/encoder/layer_3/attention/self/query/kernel`
  hf      the transformers name, e.g. `encoder.layer.3.attention.self.query.weight`
and one layout rule per format, also in the table: Google stores Dense kernels as [in, out]
like Keras, except the NSP head's `output_weights` [2, H] ([out, in]); PyTorch's nn.Linear
stores [out, in], so every HF dense "weight" is transposed. Our attention projections keep
Google's [H, H] kernels, so nothing is reshaped. A transpose is its own inverse, so the same
row serves loading and saving; no code walks the model.

Three on-disk formats:
  google  a TF1 checkpoint (`<prefix>.index`, `<prefix>.data-00000-of-00001`) with names
          as in docs/DESIGN.md section 5, and `bert_config.json` beside it. Training checkpoints'
          `global_step` and `*/adam_m`, `*/adam_v` slots are skipped on import.
  hf      a transformers `save_pretrained` directory: `config.json` + `model.safetensors` (or its
          shards and `model.safetensors.index.json`).
          BertModel names for an encoder; BertForPreTraining / BertForMaskedLM names
          (encoder under `bert.`, heads under `cls.`) for a pretrainer; the task models'
          BertForSequenceClassification / BertForTokenClassification /
          BertForQuestionAnswering names (encoder under `bert.`, head `classifier.*` or
          `qa_outputs.*`, label names as `id2label` in config.json). `read_hf_model` builds
          what config.json's `architectures` names (HF_ARCHITECTURES).
  keras   a `.keras` file from `model.save` (architecture, config and weights in one file).
  keras_hub  a keras-hub preset directory: its reader and writer, and its name table, are in
          bert_keras/keras_hub_presets.py (`save_model(model, "keras_hub", ...)` calls it).

These are the format readers and writers beneath `bert_keras/model_loading.py`, the one
entry point, which decides what a path holds (`load_checkpoint`) and calls one reader:
`read_google_model`, `read_hf_model` or `load_keras_model`. Library errors on a damaged
file become errors naming it (`data_prep.cli.reading`, WeightLoadError).

Loading is all-or-nothing: every name and shape is checked and every tensor read before any
variable is assigned, so a model is never left half-loaded. A tensor the model does not use
(a head) is an error unless the caller asked for less (`model="encoder"`), so a head is
never dropped silently. Saving writes under a temporary
name and renames when complete, and never overwrites.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import os
import re
from typing import Callable

import numpy as np
from absl import logging

from bert_keras.config import BertConfig, ConfigError
from bert_keras.encoder import BertEncoder
from bert_keras.pretrainer import BertPretrainer
from bert_keras.tasks import BertClassifier, BertRegressor, BertSpanQA, BertTagger
from data_prep import files, tokenizer_config
from data_prep.cli import ToolError, reading

FORMATS = ("google", "hf", "keras", "keras_hub")  # read and written
# Read only (convert_checkpoint --from, the loader): TF Model Garden's TF2 checkpoints and
# TF Hub-format SavedModels.
READ_FORMATS = (*FORMATS, "model_garden", "tf_hub")


class WeightLoadError(ToolError):
    """A checkpoint's files do not fit the model or cannot be read as its format; the message
    names the file (and lists every offending tensor)."""


# The formats that split the attention's [H, H] kernels and [H] biases by head (Keras'
# EinsumDense layouts: TF Model Garden's BertEncoder and keras-hub's BertBackbone).
HEAD_SPLIT_FORMATS = ("model_garden", "keras_hub")


@dataclasses.dataclass(frozen=True)
class WeightName:
    """One row of the name table: one weight's name in every format ("" where a format has
    none). `{i}` in a name stands for the layer index."""

    ours: str
    google: str
    hf: str
    hf_transpose: bool = False  # True for nn.Linear weights ([out, in] in PyTorch).
    google_transpose: bool = False  # True where Google's TF1 code stored [out, in].
    # TF Model Garden's BertEncoder variable name (read only).
    model_garden: str = ""
    # keras-hub's weight path (BertBackbone, BertMaskedLM's and BertTextClassifier's heads).
    keras_hub: str = ""
    # How the HEAD_SPLIT_FORMATS split our attention weights by head (N heads of D = H/N):
    # "out" the last axis (query/key/value: kernel [H, N, D], bias [N, D]), "in" the first
    # (attention output: kernel [N, D, H]); "" not at all. A reshape: the bytes keep their
    # order.
    heads: str = ""

    def name(self, fmt: str) -> str:
        """This weight's name in `fmt` ("google", "hf", "model_garden", "keras_hub" or
        "ours")."""
        return getattr(self, fmt)

    def transposed(self, fmt: str) -> bool:
        """Whether `fmt` stores this weight transposed relative to our variable."""
        return getattr(self, f"{fmt}_transpose", False)

    def convert(self, fmt: str, value: np.ndarray) -> np.ndarray:
        """Converts `value` between our layout and `fmt`'s, in either direction."""
        return value.T if self.transposed(fmt) else value

    def file_shape(self, fmt: str, shape: tuple, num_heads: int) -> tuple:
        """The shape `fmt` stores our variable of `shape` in (`num_heads`: the model's)."""
        shape = tuple(shape)
        if self.transposed(fmt):
            return shape[::-1]
        split = self.heads if fmt in HEAD_SPLIT_FORMATS else ""
        if split == "out":
            return (*shape[:-1], num_heads, shape[-1] // num_heads)
        if split == "in":
            return (num_heads, shape[0] // num_heads, *shape[1:])
        return shape

    def to_ours(self, fmt: str, value: np.ndarray, shape: tuple) -> np.ndarray:
        """A tensor read from `fmt`, whose shape `file_shape` checked, in our layout of
        `shape`: transposed, or (split by head) reshaped: [H, N, D] -> [H, N*D] keeps head
        n's columns at n*D..n*D+D-1, as Google's [H, H] kernels hold them."""
        return np.reshape(self.convert(fmt, value), shape)

    def for_layer(self, i: int) -> "WeightName":
        return dataclasses.replace(
            self, ours=self.ours.format(i=i), google=self.google.format(i=i),
            hf=self.hf.format(i=i), model_garden=self.model_garden.format(i=i),
            keras_hub=self.keras_hub.format(i=i)
        )


def _dense(ours, google, hf, model_garden="", keras_hub="", heads=""):
    """A Dense layer's two rows. `heads`: how the HEAD_SPLIT_FORMATS split it by head
    ("out" splits the kernel's last axis and the bias, "in" the kernel's first;
    WeightName)."""
    return (
        WeightName(f"{ours}/kernel", f"{google}/kernel", f"{hf}.weight", hf_transpose=True,
                   model_garden=model_garden and f"{model_garden}/kernel",
                   keras_hub=keras_hub and f"{keras_hub}/kernel", heads=heads),
        WeightName(f"{ours}/bias", f"{google}/bias", f"{hf}.bias",
                   model_garden=model_garden and f"{model_garden}/bias",
                   keras_hub=keras_hub and f"{keras_hub}/bias",
                   heads="out" if heads == "out" else ""),
    )


def _layer_norm(ours, google, hf, model_garden="", keras_hub=""):
    return (
        WeightName(f"{ours}/gamma", f"{google}/gamma", f"{hf}.weight",
                   model_garden=model_garden and f"{model_garden}/gamma",
                   keras_hub=keras_hub and f"{keras_hub}/gamma"),
        WeightName(f"{ours}/beta", f"{google}/beta", f"{hf}.bias",
                   model_garden=model_garden and f"{model_garden}/beta",
                   keras_hub=keras_hub and f"{keras_hub}/beta"),
    )


# The embeddings: bert/embeddings/*.
EMBEDDING_WEIGHTS = (
    WeightName("embeddings/word_embeddings", "bert/embeddings/word_embeddings",
               "embeddings.word_embeddings.weight", model_garden="word_embeddings/embeddings",
               keras_hub="token_embedding/embeddings"),
    WeightName("embeddings/position_embeddings", "bert/embeddings/position_embeddings",
               "embeddings.position_embeddings.weight",
               model_garden="position_embedding/embeddings",
               keras_hub="position_embedding/embeddings"),
    WeightName("embeddings/token_type_embeddings", "bert/embeddings/token_type_embeddings",
               "embeddings.token_type_embeddings.weight",
               model_garden="type_embeddings/embeddings",
               keras_hub="segment_embedding/embeddings"),
    *_layer_norm("embeddings/layer_norm", "bert/embeddings/LayerNorm", "embeddings.LayerNorm",
                 "embeddings/layer_norm", "embeddings_layer_norm"),
)

_L_OURS = "transformer_layer_{i}"
_L_GOOGLE = "bert/encoder/layer_{i}"
_L_HF = "encoder.layer.{i}"
_L_MG = "transformer/layer_{i}"
_L_KH = "transformer_layer_{i}"

# One transformer block: bert/encoder/layer_{i}/*.
LAYER_WEIGHTS = (
    *_dense(f"{_L_OURS}/self_attention/query", f"{_L_GOOGLE}/attention/self/query",
            f"{_L_HF}.attention.self.query", f"{_L_MG}/self_attention/query",
            f"{_L_KH}/self_attention_layer/query", heads="out"),
    *_dense(f"{_L_OURS}/self_attention/key", f"{_L_GOOGLE}/attention/self/key",
            f"{_L_HF}.attention.self.key", f"{_L_MG}/self_attention/key",
            f"{_L_KH}/self_attention_layer/key", heads="out"),
    *_dense(f"{_L_OURS}/self_attention/value", f"{_L_GOOGLE}/attention/self/value",
            f"{_L_HF}.attention.self.value", f"{_L_MG}/self_attention/value",
            f"{_L_KH}/self_attention_layer/value", heads="out"),
    *_dense(f"{_L_OURS}/attention_output", f"{_L_GOOGLE}/attention/output/dense",
            f"{_L_HF}.attention.output.dense", f"{_L_MG}/self_attention/attention_output",
            f"{_L_KH}/self_attention_layer/attention_output", heads="in"),
    *_layer_norm(f"{_L_OURS}/attention_layer_norm", f"{_L_GOOGLE}/attention/output/LayerNorm",
                 f"{_L_HF}.attention.output.LayerNorm", f"{_L_MG}/self_attention_layer_norm",
                 f"{_L_KH}/self_attention_layer_norm"),
    *_dense(f"{_L_OURS}/intermediate", f"{_L_GOOGLE}/intermediate/dense",
            f"{_L_HF}.intermediate.dense", f"{_L_MG}/intermediate",
            f"{_L_KH}/feedforward_intermediate_dense"),
    *_dense(f"{_L_OURS}/output_dense", f"{_L_GOOGLE}/output/dense", f"{_L_HF}.output.dense",
            f"{_L_MG}/output", f"{_L_KH}/feedforward_output_dense"),
    *_layer_norm(f"{_L_OURS}/output_layer_norm", f"{_L_GOOGLE}/output/LayerNorm",
                 f"{_L_HF}.output.LayerNorm", f"{_L_MG}/output_layer_norm",
                 f"{_L_KH}/feedforward_layer_norm"),
)

# The [CLS] pooler: bert/pooler/dense.
POOLER_WEIGHTS = _dense("pooler_dense", "bert/pooler/dense", "pooler.dense", "pooler_transform",
                        "pooled_dense")

# BertPretrainer's heads. The masked-LM output projection is the word-embedding table (tied),
# so its only own vocabulary-sized weight is the output bias. Model Garden's
# BertPretrainerV2 names its MaskedLM head's variables after Google's (under bert/); it has
# no next-sentence head, and neither has keras-hub's BertMaskedLM (mlm_head/).
MASKED_LM_WEIGHTS = (
    *_dense("masked_lm/transform_dense", "cls/predictions/transform/dense",
            "cls.predictions.transform.dense", "bert/cls/predictions/transform/dense",
            "mlm_head/intermediate_dense"),
    *_layer_norm("masked_lm/layer_norm", "cls/predictions/transform/LayerNorm",
                 "cls.predictions.transform.LayerNorm",
                 "bert/cls/predictions/transform/LayerNorm", "mlm_head/intermediate_layer_norm"),
    WeightName("masked_lm/output_bias", "cls/predictions/output_bias", "cls.predictions.bias",
               model_garden="bert/cls/predictions/output_bias/bias",
               keras_hub="mlm_head/output_bias"),
)
NSP_WEIGHTS = (
    # Google's run_pretraining.py made this [2, H] by hand (tf.matmul(..., transpose_b=True)).
    WeightName("nsp_dense/kernel", "cls/seq_relationship/output_weights",
               "cls.seq_relationship.weight", hf_transpose=True, google_transpose=True),
    WeightName("nsp_dense/bias", "cls/seq_relationship/output_bias", "cls.seq_relationship.bias"),
)
HEAD_WEIGHTS = MASKED_LM_WEIGHTS + NSP_WEIGHTS

# Fine-tuning heads. transformers' BertFor* task classes keep the head at the top level
# (encoder under `bert.`); Google's run_classifier.py / run_squad.py stored theirs [C, H] by
# hand as output_weights (as the NSP head). BertTagger's head is transformers'
# BertForTokenClassification `classifier` (Google's repository has no tagger). keras-hub's
# BertTextClassifier is a classifier's (`logits`); it has no tagger or span-QA task.
CLASSIFIER_WEIGHTS = (
    WeightName("classifier/kernel", "output_weights", "classifier.weight", hf_transpose=True,
               google_transpose=True, keras_hub="logits/kernel"),
    WeightName("classifier/bias", "output_bias", "classifier.bias", keras_hub="logits/bias"),
)
TAGGER_WEIGHTS = (
    WeightName("tagger/kernel", "output_weights", "classifier.weight", hf_transpose=True,
               google_transpose=True),
    WeightName("tagger/bias", "output_bias", "classifier.bias"),
)
SPAN_QA_WEIGHTS = (
    WeightName("span_logits/kernel", "cls/squad/output_weights", "qa_outputs.weight",
               hf_transpose=True, google_transpose=True),
    WeightName("span_logits/bias", "cls/squad/output_bias", "qa_outputs.bias"),
)
TASK_HEAD_WEIGHTS = {BertClassifier: CLASSIFIER_WEIGHTS, BertRegressor: CLASSIFIER_WEIGHTS,
                     BertTagger: TAGGER_WEIGHTS, BertSpanQA: SPAN_QA_WEIGHTS}
TASK_MODELS = tuple(TASK_HEAD_WEIGHTS)
# Those with one output per label (labels.txt, transformers' id2label).
LABELLED_TASK_MODELS = (BertClassifier, BertTagger)

# transformers' `architectures` (config.json) -> what `read_hf_model(path, "auto")` builds.
HF_ARCHITECTURES = {
    "BertModel": "encoder",
    "BertForPreTraining": "pretrainer",
    "BertForMaskedLM": "masked_lm",  # a pretrainer without the NSP head
    "BertForSequenceClassification": BertClassifier,
    "BertForTokenClassification": BertTagger,
    "BertForQuestionAnswering": BertSpanQA,
}
# Our task models -> the transformers class that holds the same head (a regressor is
# BertForSequenceClassification with num_labels 1, problem_type "regression").
HF_TASK_ARCHITECTURE = {v: k for k, v in HF_ARCHITECTURES.items() if not isinstance(v, str)}
HF_TASK_ARCHITECTURE[BertRegressor] = "BertForSequenceClassification"

# Google: variables a training checkpoint holds besides the model (optimizer state).
GOOGLE_TRAINING_STATE = re.compile(r"^global_step$|/adam_[mv]$")
# Google: the scopes of the pretraining heads, and of everything our models read.
GOOGLE_PRETRAINING_SCOPES = ("cls/predictions/", "cls/seq_relationship/")
GOOGLE_MODEL_SCOPES = ("bert/", *GOOGLE_PRETRAINING_SCOPES)
# The prefix Google's released checkpoints use (uncased_L-12_H-768_A-12/bert_model.ckpt).
GOOGLE_CHECKPOINT_NAME = "bert_model.ckpt"
# Hugging Face: BertForPreTraining & co. nest the encoder under `bert.`; heads live under
# `cls.`. Our table holds BertModel's (un-nested) names.
HF_ENCODER_PREFIX = "bert."
HF_HEAD_PREFIX = "cls."
HF_NSP_PREFIX = "cls.seq_relationship."
# Buffers older transformers versions saved that are not weights (position_ids = arange).
HF_IGNORED = ("embeddings.position_ids",)
# LayerNorm names of files from pytorch-pretrained-bert's time (bert-base-uncased's own
# model.safetensors among them), which transformers renames on load.
HF_LEGACY_SUFFIXES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def _hf_current_name(key: str) -> str:
    for legacy, current in HF_LEGACY_SUFFIXES.items():
        if key.endswith(legacy):
            return key[:-len(legacy)] + current
    return key
# Tied copies some files carry (transformers >= 4.3x omits them on save): name -> the
# weight it must equal.
HF_TIED = {
    "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# Our activation names that transformers does not know -> its name for the same function.
HF_ACTIVATION = {"gelu_tanh": "gelu_new"}
# Activations that compute the same function under different names.
_SAME_ACTIVATION = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def encoder_weight_names(num_layers: int) -> list[WeightName]:
    """The table rows of an encoder with `num_layers` blocks, `{i}` filled in."""
    rows = list(EMBEDDING_WEIGHTS)
    for i in range(num_layers):
        rows += [w.for_layer(i) for w in LAYER_WEIGHTS]
    rows += POOLER_WEIGHTS
    return rows


def pretrainer_weight_names(num_layers: int, next_sentence: bool = True) -> list[WeightName]:
    """The table rows of a BertPretrainer: the encoder's plus the MLM (and NSP) heads."""
    return encoder_weight_names(num_layers) + list(
        HEAD_WEIGHTS if next_sentence else MASKED_LM_WEIGHTS)


def _encoder_of(model) -> BertEncoder:
    if isinstance(model, (BertPretrainer, *TASK_MODELS)):
        return model.encoder
    if isinstance(model, BertEncoder):
        return model
    raise TypeError("Expected a BertEncoder, BertPretrainer, BertClassifier, BertRegressor, "
                    f"BertTagger or BertSpanQA. Received: {type(model).__name__}")


def reads_pooler(model) -> bool:
    """Whether `model`'s outputs depend on the pooler. Models that do not read it (tagger,
    span QA, MLM-only pretrainer) are stored without pooler weights by transformers."""
    return getattr(model, "reads_pooler", True)


def model_weight_names(model) -> list[WeightName]:
    """The table rows for `model` (an encoder, a pretrainer or a task model).

    Raises:
      TypeError: `model` is none of these.
      ValueError: `model` is a serving copy (`tasks.for_serving`), whose kernels are stored
        [out, in]: the table's layouts are those of the [in, out] models training builds.
      WeightLoadError: the model has a variable the table does not name (or vice versa);
        such a variable would silently keep its random value on load and vanish on save.
    """
    encoder = _encoder_of(model)
    if encoder.kernel_layout != "in_out":
        raise ValueError(f"{type(model).__name__} stores its kernels {encoder.kernel_layout!r} "
                         "(a serving copy, bert_keras.tasks.for_serving): checkpoints are read "
                         "and written from the model it was made from.")
    num_layers = encoder.num_layers
    if isinstance(model, BertPretrainer):
        rows = pretrainer_weight_names(num_layers, model.next_sentence)
    elif isinstance(model, TASK_MODELS):
        rows = encoder_weight_names(num_layers) + list(TASK_HEAD_WEIGHTS[type(model)])
    else:
        rows = encoder_weight_names(num_layers)
    paths = {v.path for v in model.weights}
    named = {w.ours for w in rows}
    if paths != named:
        raise WeightLoadError(
            f"{type(model).__name__}'s variables and the checkpoint name table disagree: "
            f"not in the table {sorted(paths - named)}; not in the model {sorted(named - paths)}"
        )
    return rows


def _model_kind(model) -> str:
    if isinstance(model, BertPretrainer):
        return ("BERT pretrainer (encoder + MLM/NSP heads)" if model.next_sentence
                else "BERT masked LM (encoder + MLM head)")
    if isinstance(model, TASK_MODELS):
        return f"{type(model).__name__} (encoder + {HF_TASK_ARCHITECTURE[type(model)]} head)"
    return "BERT encoder"


# ------------------------------------------------------------------------------------------
# The one loader: names and shapes first, then read everything, then assign.


def _load_table(model, fmt: str, shapes: dict[str, tuple], read: Callable[[str], np.ndarray],
                source: str, skippable: Callable[[str], bool], hint: str = "",
                display: Callable[[str], str] = str, optional: frozenset = frozenset()
                ) -> list[str]:
    """Loads the tensors named in `shapes` into `model`, all or nothing.

    Args:
      model: BertEncoder or BertPretrainer.
      fmt: "google" or "hf": which column of the table names the file's tensors.
      shapes: file tensor name -> shape, for every tensor in the file (already filtered).
      read: reads one tensor by file name (may raise WeightLoadError).
      source: the file, for messages.
      skippable: whether an unknown file tensor may be ignored (e.g. heads when loading an
        encoder); other unknown tensors are errors.
      hint: appended to a missing/unexpected message.
      display: a table name -> the name as the file spells it, for messages.
      optional: file names the file may lack (their variables are left as they are).

    Returns:
      The optional names the file lacked.
    """
    rows = model_weight_names(model)
    expected = {w.name(fmt): w for w in rows}
    absent = sorted(optional & (set(expected) - set(shapes)))
    expected = {n: w for n, w in expected.items() if n not in absent}
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    unexpected = [n for n in extra if not skippable(n)]
    skipped = [n for n in extra if skippable(n)]
    num_layers = _encoder_of(model).num_layers
    if missing or unexpected:
        lines = []
        if missing:
            lines.append(f"missing {len(missing)}: " + ", ".join(map(display, missing)))
        if unexpected:
            lines.append(f"unexpected {len(unexpected)}: " + ", ".join(map(display, unexpected)))
        raise WeightLoadError(
            f"{source}: tensors do not match a {num_layers}-layer {_model_kind(model)}:\n  "
            + "\n  ".join(lines) + hint
        )
    if skipped:
        logging.info("%s: skipping %d tensors the model does not use (%s)", source,
                     len(skipped), ", ".join(skipped[:5]) + (", ..." if len(skipped) > 5 else ""))

    variables = {v.path: v for v in model.weights}
    num_heads = _encoder_of(model).num_heads
    mismatched = []
    for name, w in expected.items():
        ours = tuple(variables[w.ours].shape)
        want, note = w.file_shape(fmt, ours, num_heads), ""
        if w.transposed(fmt):
            note = f" (our {w.ours} {ours} transposed)"
        elif want != ours:
            note = f" (our {w.ours} {ours} split into {num_heads} heads)"
        if tuple(shapes[name]) != want:
            mismatched.append(f"{display(name)}: model {want}, file {tuple(shapes[name])}{note}")
    if mismatched:
        raise WeightLoadError(
            f"{source}: {len(mismatched)} tensor(s) have the wrong shape "
            "(does the config fit the weights?):\n  " + "\n  ".join(mismatched)
        )
    values = {w.ours: w.to_ours(fmt, np.asarray(read(name)), variables[w.ours].shape)
              for name, w in expected.items()}
    for ours, value in values.items():
        variables[ours].assign(value.astype(variables[ours].dtype))
    return absent


def _check_config_fits(model, config: BertConfig, source: str) -> None:
    """Catches differences that shapes cannot show (heads, activation, epsilon)."""
    ours = _encoder_of(model).to_bert_config()
    problems = []
    if ours.num_attention_heads != config.num_attention_heads:
        problems.append(
            f"num_attention_heads: model has {ours.num_attention_heads}, "
            f"weights were trained with {config.num_attention_heads}"
        )
    act = lambda a: _SAME_ACTIVATION.get(a, a)  # noqa: E731
    if act(ours.hidden_act) != act(config.hidden_act):
        problems.append(
            f"hidden_act: model has {ours.hidden_act!r}, weights use {config.hidden_act!r}"
        )
    if not np.isclose(ours.layer_norm_eps, config.layer_norm_eps, rtol=1e-6, atol=0):
        problems.append(
            f"layer_norm_eps: model has {ours.layer_norm_eps}, weights use {config.layer_norm_eps}"
        )
    if problems:
        raise WeightLoadError(
            f"{source}: config does not fit the model:\n  " + "\n  ".join(problems)
        )


def _variable_values(model) -> list[tuple[WeightName, np.ndarray]]:
    """(row, float32 value in our layout) for every weight of `model`, in table order."""
    import keras

    variables = {v.path: v for v in model.weights}
    return [
        (w, np.asarray(keras.ops.convert_to_numpy(variables[w.ours].value), dtype=np.float32))
        for w in model_weight_names(model)
    ]


def _refuse_existing(*paths: str) -> None:
    existing = [p for p in paths if os.path.lexists(p)]
    if existing:
        raise FileExistsError(f"refusing to overwrite existing output: {', '.join(existing)}")


def check_output_free(fmt: str, path: str) -> None:
    """Raises FileExistsError if saving in `fmt` to `path` would overwrite anything, and
    files.OutputWriteError if it could not be written there (`files.check_writable`:
    before a conversion loads its input, not after).

    google: `<path>.index` (a checkpoint exists once its index does: `.data-*` files
    without one are what an interrupted save left, and are replaced); hf: a non-empty
    directory; keras_hub: a non-empty directory; keras: the file. (A differing
    bert_config.json beside a Google checkpoint is caught when saving.)
    """
    if fmt == "google":
        path = google_output_prefix(path)
        _refuse_existing(path + ".index")
        files.check_writable([path + ".index"])
        return
    path = os.path.abspath(os.fspath(path))
    if fmt in ("hf", "keras_hub") and os.path.isdir(path) and not os.listdir(path):
        pass  # An empty directory is replaced.
    else:
        _refuse_existing(path)
    files.check_writable([path])


# ------------------------------------------------------------------------------------------
# Google TF1 checkpoints


def checkpoint_indexes(directory: str) -> list[str]:
    """The `<prefix>.index` files of the TF checkpoints in `directory`, sorted."""
    return sorted(glob.glob(os.path.join(glob.escape(directory), "*.index")))


def google_checkpoint_prefix(path: str) -> str | None:
    """The TF1 checkpoint prefix `path` names, or None if it names none.

    Accepts a prefix (`bert_model.ckpt`, with `.index` beside it), one of its files
    (`.index`, `.meta`, `.data-*`), or a directory holding one checkpoint (the one its
    `checkpoint` file names, else its only `*.index`).
    """
    import tensorflow as tf

    path = os.fspath(path)
    if os.path.isdir(path):
        # The `checkpoint` file's name, not tf.train.latest_checkpoint's, which is None
        # where that name no longer exists (a directory moved, copied or downloaded).
        state = tf.train.get_checkpoint_state(path)
        named = state.model_checkpoint_path if state is not None else ""
        if named and _is_inside(named, path) and os.path.exists(named + ".index"):
            return named
        if named:
            # It names a prefix elsewhere (an absolute path written before the directory
            # was copied or moved, or gs://...): read this directory's own copy.
            local = os.path.join(path, os.path.basename(named))
            if os.path.exists(local + ".index"):
                logging.warning("%s: its checkpoint file names %s, outside this directory; "
                                "reading %s", path, named, local)
                return local
        indexes = checkpoint_indexes(path)
        return indexes[0][: -len(".index")] if len(indexes) == 1 else None
    prefix = re.sub(r"\.(index|meta|data-\d{5}-of-\d{5})$", "", path)
    return prefix if os.path.exists(prefix + ".index") else None


# What Google's modeling.py builds: get_activation's names, and layer_norm's epsilon.
GOOGLE_ACTIVATIONS = ("gelu", "relu", "tanh", "linear")
GOOGLE_LAYER_NORM_EPS = 1e-12


def _warn_where_google_differs(config: BertConfig, config_file: str) -> None:
    """The settings a Google checkpoint holds that Google's own code cannot run (bert-keras
    and transformers read them)."""
    if config.hidden_act not in GOOGLE_ACTIVATIONS:
        same = (" (its \"gelu\" is this tanh approximation since 2019: name it so for "
                "Google's code)" if config.hidden_act == "gelu_new" else "")
        logging.warning("%s: hidden_act %r, which Google's modeling.py refuses (it knows %s)%s; "
                        "bert-keras and transformers read it", config_file, config.hidden_act,
                        ", ".join(GOOGLE_ACTIVATIONS), same)
    if config.layer_norm_eps != GOOGLE_LAYER_NORM_EPS:
        logging.warning("%s: layer_norm_eps %g, where Google's modeling.py always uses %g; "
                        "bert-keras and transformers read it", config_file,
                        config.layer_norm_eps, GOOGLE_LAYER_NORM_EPS)


def _is_inside(prefix: str, directory: str) -> bool:
    inside = os.path.realpath(directory)
    return os.path.realpath(prefix).startswith(inside.rstrip(os.sep) + os.sep)


def _checkpoint_prefix(path: str) -> str:
    """`google_checkpoint_prefix`, raising FileNotFoundError (naming what was expected)."""
    prefix = google_checkpoint_prefix(path)
    if prefix is not None:
        return prefix
    if os.path.isdir(path):
        indexes = checkpoint_indexes(path)
        raise FileNotFoundError(
            f"{path}: expected one TF checkpoint (<prefix>.index + <prefix>.data-*) in this "
            f"directory, found {len(indexes)}: {[os.path.basename(p) for p in indexes]}"
        )
    path = re.sub(r"\.(index|meta|data-\d{5}-of-\d{5})$", "", os.fspath(path))
    raise FileNotFoundError(
        f"Google checkpoint not found: expected {path}.index and {path}.data-00000-of-00001"
    )


def google_output_prefix(path: str) -> str:
    """The checkpoint prefix to write for `path`: `path` itself (`out/bert_model.ckpt`), or
    `<path>/bert_model.ckpt` for a directory (one that exists, or a path ending in a
    separator), as Google names its checkpoints. Before, `out/` wrote `out.index` and
    `out.data-*` beside the directory."""
    path = os.fspath(path)
    if os.path.isdir(path) or path.endswith((os.sep, "/")):
        return os.path.abspath(os.path.join(path, GOOGLE_CHECKPOINT_NAME))
    return os.path.abspath(path)


def _bert_config_beside(prefix: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(prefix)), files.BERT_CONFIG_FILE)


# The fields that make two configs other models (weights of other names or shapes, or
# other arithmetic); dropout and the initializer's range do not.
MODEL_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
                "layer_norm_eps")


def config_differences(given: BertConfig, other: BertConfig) -> list[str]:
    """["num_hidden_layers 2 vs 3", ...]: the `MODEL_FIELDS` in which `given` differs from
    `other`, for messages."""
    return [f"{name} {getattr(given, name)} vs {getattr(other, name)}"
            for name in MODEL_FIELDS if getattr(given, name) != getattr(other, name)]


def _config_file_hint(prefix: str, config_file: str) -> str:
    """Where a Google checkpoint's tensors do not fit the model of a --bert_config_file that
    is not the one beside it, what to do: before, a base model's config given for a large
    checkpoint (or the reverse) was told only the tensor names or shapes that differ."""
    beside = _bert_config_beside(prefix)
    if os.path.abspath(config_file) == beside:
        return ""
    if not os.path.exists(beside):
        return (f"\n  (the model was built from --bert_config_file {config_file}: is it "
                "this checkpoint's config?)")
    differs = config_differences(BertConfig.from_json_file(config_file),
                                 BertConfig.from_json_file(beside))
    if not differs:
        return ""
    return (f"\n  (--bert_config_file {config_file} describes another model than {beside} "
            f"beside the checkpoint: {', '.join(differs)}; leave --bert_config_file out to "
            "build the checkpoint's own)")


@contextlib.contextmanager
def _open_google_checkpoint(ckpt_prefix: str):
    """Yields (prefix, reader, {name: shape} without optimizer state) of a TF1 checkpoint;
    the reader reads while the block runs (through `files.glob_free`: TensorFlow's reader
    finds the index by a glob, which missed it under a directory such as "run [1]/").

    Raises:
      FileNotFoundError: no checkpoint there.
      WeightLoadError: the index cannot be read (truncated, or not a checkpoint).
    """
    import tensorflow as tf

    prefix = _checkpoint_prefix(ckpt_prefix)
    with files.glob_free(prefix) as readable:
        try:
            reader = tf.train.load_checkpoint(readable)
            shapes = reader.get_variable_to_shape_map()
        except Exception as e:  # The C++ reader raises DataLossError, IndexError, ...
            message = _first_line(getattr(e, "message", str(e))).replace(readable, prefix)
            raise WeightLoadError(
                f"{prefix}: cannot read TF checkpoint index {prefix}.index "
                f"({message}); is the file complete?"
            ) from None
        yield prefix, reader, {k: tuple(v) for k, v in shapes.items()
                               if not GOOGLE_TRAINING_STATE.search(k)}


def read_google_checkpoint_names(ckpt_prefix: str) -> dict[str, tuple]:
    """Returns {tensor name: shape} of a TF1 checkpoint, optimizer state removed."""
    with _open_google_checkpoint(ckpt_prefix) as (_, _, shapes):
        return shapes


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message


def load_google_checkpoint(model, ckpt_prefix: str, config_file: str | None = None) -> None:
    """Loads a Google TF1-format BERT checkpoint into a BertEncoder or BertPretrainer.

    All or nothing: names and shapes are checked and every tensor is read before any variable
    is assigned.

    Args:
      model: a built `BertEncoder` (reads `bert/*`; `cls/*` heads and any other scope, e.g. a
        fine-tuned classifier's `output_weights`, are skipped), `BertPretrainer` (reads
        `bert/*` and `cls/*`), or the task model of Google's run_classifier (BertClassifier:
        `output_weights`, `output_bias`) or run_squad (BertSpanQA: `cls/squad/*`). `global_step`
        and `*/adam_m`, `*/adam_v` are always skipped.
      ckpt_prefix: checkpoint prefix (e.g. `.../bert_model.ckpt`), one of its files, or a
        directory holding one checkpoint.
      config_file: a bert_config.json to check the model against (heads, activation,
        epsilon: what shapes cannot show). Default: `bert_config.json` beside the
        checkpoint, if there is one.

    Raises:
      FileNotFoundError: no checkpoint at `ckpt_prefix`.
      WeightLoadError: missing, unexpected or mis-shaped tensors (listed by Google name,
        with both shapes), an unreadable (e.g. truncated) file, or a config that disagrees.
    """
    prefix = _checkpoint_prefix(ckpt_prefix)
    config_file = config_file or _bert_config_beside(prefix)
    if os.path.exists(config_file):
        _check_config_fits(model, BertConfig.from_json_file(config_file), config_file)
    with _open_google_checkpoint(prefix) as (prefix, reader, shapes):
        _load_google_tensors(model, prefix, reader, shapes)


def _load_google_tensors(model, prefix: str, reader, shapes: dict) -> None:
    """`load_google_checkpoint`'s reading and assigning, while `reader` is open."""

    def read(name):
        try:
            return reader.get_tensor(name)
        except Exception as e:  # The C++ reader raises IndexError, DataLossError, ...
            raise WeightLoadError(
                f"{prefix}: cannot read tensor {name} from {prefix}.data-* "
                f"({_first_line(getattr(e, 'message', str(e)))}); is the checkpoint truncated?"
            ) from None

    scopes = ("bert/", "cls/") if isinstance(model, BertPretrainer) else ("bert/",)
    hint = ""
    if any(".ATTRIBUTES/" in n for n in shapes):
        hint = ("\n  (this is a TF2 object-based checkpoint, not Google's TF1 format: TF Model "
                "Garden's BertEncoder is read with --from=model_garden)")
    elif isinstance(model, BertPretrainer) and not any(n.startswith("cls/") for n in shapes):
        hint = ("\n  (the checkpoint has no pretraining heads cls/*; load it into "
                "pretrainer.encoder, or convert with --model=encoder)")
    _load_table(model, "google", shapes, read, prefix,
                skippable=lambda n: not n.startswith(scopes), hint=hint)


def save_google_checkpoint(model, ckpt_prefix: str) -> str:
    """Writes `model` as a Google TF1-format checkpoint, with bert_config.json beside it.

    Writes `<prefix>.index` and `<prefix>.data-00000-of-00001` (readable by
    `tf.train.load_checkpoint`, TF1's `Saver.restore` and `init_from_checkpoint`) under
    temporary names, verifies names and shapes, then renames them. `bert_config.json` is
    written into the prefix's directory; an existing one is kept if it describes the same
    model, else refused.

    Args:
      model: BertEncoder (writes `bert/*`) or BertPretrainer (also `cls/*`).
      ckpt_prefix: e.g. `out/bert_model.ckpt`, or a directory (`out/`: `out/bert_model.ckpt`);
        its directory is created if needed.

    Returns:
      The checkpoint prefix.

    Raises:
      FileExistsError: a checkpoint with that prefix exists, or a different bert_config.json.
    """
    import tensorflow as tf

    prefix = google_output_prefix(ckpt_prefix)
    config = _encoder_of(model).to_bert_config()
    config_file = _bert_config_beside(prefix)
    check_output_free("google", prefix)
    if os.path.exists(config_file):
        # The same model in other words (Google's own file: its key order and layout, no
        # layer_norm_eps) is kept; only other values are refused.
        try:
            same = BertConfig.from_json_file(config_file) == config
        except (OSError, ValueError, TypeError):
            same = False
        if not same:
            raise FileExistsError(
                f"refusing to overwrite existing output: {config_file} (describes a "
                "different model); write the checkpoint into another directory"
            )
    # Taken back if the save fails (a full disk): a rerun found the directory.
    created = files.make_parent_dirs([prefix])
    _warn_where_google_differs(config, config_file)

    values = _variable_values(model)
    names = [w.google for w, _ in values]
    tensors = [tf.constant(np.ascontiguousarray(w.convert("google", v))) for w, v in values]
    tmp = files.temp_path(prefix)
    tmp_files = [tmp + ".index", tmp + ".data-00000-of-00001"]
    try:
        tf.raw_ops.SaveV2(prefix=tmp, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=tensors)
        written = read_google_checkpoint_names(tmp)
        expected = {n: tuple(t.shape) for n, t in zip(names, tensors)}
        if written != expected:
            raise RuntimeError(f"{tmp}: checkpoint verification failed: wrote {written}")
        if not os.path.exists(config_file):
            config.to_json_file(config_file)
        # Data first, index last: a checkpoint is only visible once its index exists.
        os.replace(tmp_files[1], prefix + ".data-00000-of-00001")
        os.replace(tmp_files[0], prefix + ".index")
    finally:
        for path in tmp_files:
            if os.path.exists(path):
                os.remove(path)
        if not os.path.exists(prefix + ".index"):  # interrupted between the two renames
            for path in glob.glob(glob.escape(prefix) + ".data-*"):
                os.remove(path)
            files.remove_created_dirs(created)
    return prefix


# ------------------------------------------------------------------------------------------
# TF2 object-based checkpoints: TF Model Garden's BertEncoder and TF Hub's BERT SavedModels


# A TF2 checkpoint's object graph, which names every tensor's object path and, as the
# attribute's `full_name`, the variable's own name (what the tables hold: object paths such
# as encoder/layer_with_weights-4/... change with how the model was built and saved).
TF2_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
# Objects at a TF2 checkpoint's root that hold no model weight: a training checkpoint's
# optimizer (slots) and step counters, TF Hub's do_lower_case (read as the casing).
TF2_NOT_MODEL = ("optimizer", "save_counter", "global_step", "do_lower_case")
# Variables that are not weights: Keras 3's dropout seed states (our encoder exports) and
# the save counter of a tf.train.Checkpoint nested deeper (our export's `mlm` object).
TF2_NOT_WEIGHTS = re.compile(r"(^|/)seed_generator_state$|^save_counter$")
# Model Garden's get_activation("gelu") is the tanh approximation (bert_config.json's
# "gelu" builds tf_keras.activations.gelu(approximate=True)), our "gelu_tanh"; its BERT
# LayerNorms use epsilon 1e-12, as Google's.
MODEL_GARDEN_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu", "tanh": "tanh"}
# TF Hub's SavedModel layout, and our encoder export's own assets (export/export_encoder.py).
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
SAVED_MODEL_VARIABLES = os.path.join("variables", "variables")
SAVED_MODEL_ASSETS = "assets"


def is_tf2_checkpoint(prefix: str) -> bool:
    """Whether the checkpoint at `prefix` is TF2 object-based (it has an object graph)."""
    try:
        return TF2_OBJECT_GRAPH in read_google_checkpoint_names(prefix)
    except WeightLoadError:
        return False


def is_saved_model_dir(path: str) -> bool:
    """Whether `path` is a SavedModel directory with variables (TF Hub's layout)."""
    return (files.isdir(path)
            and any(files.isfile(os.path.join(path, n)) for n in SAVED_MODEL_FILES)
            and files.isfile(os.path.join(path, SAVED_MODEL_VARIABLES + ".index")))


@contextlib.contextmanager
def _open_tf2_checkpoint(prefix: str, source: str):
    """Yields (read, {full_name: shape}, {root object name: its tensor's key}, reader) of a
    TF2 object-based checkpoint: the variables reachable from its root, by their own names,
    outside TF2_NOT_MODEL's objects (each variable once, however many paths reach it);
    `read(full_name)` reads one, `reader` reads by key (a root object's).

    Raises:
      WeightLoadError: no object graph (a TF1 checkpoint), two variables of one name (two
        models in one checkpoint), an unreadable file.
    """
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    with _open_google_checkpoint(prefix) as (prefix, reader, shapes):
        if TF2_OBJECT_GRAPH not in shapes:
            raise WeightLoadError(f"{source}: not a TF2 object-based checkpoint (no object "
                                  "graph); a TF1 checkpoint of Google's BERT is read with "
                                  "--from=google")
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        try:
            graph.ParseFromString(reader.get_tensor(TF2_OBJECT_GRAPH))
        except Exception as e:  # noqa: BLE001 -- protobuf's DecodeError, the reader's
            raise WeightLoadError(f"{source}: cannot read its object graph "
                                  f"({_first_line(str(e))}); is the file complete?") from None
        root = graph.nodes[0]
        roots = {}
        for child in root.children:
            keys = [a.checkpoint_key for a in graph.nodes[child.node_id].attributes
                    if a.name == "VARIABLE_VALUE"]
            if keys:
                roots[child.local_name] = keys[0]
        # Those objects are left out wherever they are reached: TF Hub's `variables` list
        # holds do_lower_case too.
        seen = {0, *(c.node_id for c in root.children if c.local_name in TF2_NOT_MODEL)}
        keys, pending = {}, [c.node_id for c in root.children if c.node_id not in seen]
        while pending:
            node_id = pending.pop()
            if node_id in seen:
                continue
            seen.add(node_id)
            node = graph.nodes[node_id]
            pending += [c.node_id for c in node.children]
            for attribute in node.attributes:
                if (attribute.name != "VARIABLE_VALUE" or attribute.checkpoint_key not in shapes
                        or TF2_NOT_WEIGHTS.search(attribute.full_name)):
                    continue
                keys.setdefault(attribute.full_name, set()).add(attribute.checkpoint_key)
        repeated = sorted(name for name, found in keys.items() if len(found) > 1)
        if repeated:
            raise WeightLoadError(
                f"{source}: {len(repeated)} variable names occur more than once "
                f"({', '.join(repeated[:4])}{' ...' if len(repeated) > 4 else ''}): two "
                "models in one checkpoint? Save the one to convert on its own")
        keys = {name: found.pop() for name, found in keys.items()}

        def read(name):
            try:
                return reader.get_tensor(keys[name])
            except Exception as e:  # The C++ reader raises DataLossError, ...
                raise WeightLoadError(
                    f"{source}: cannot read tensor {name} ({keys[name]}) "
                    f"({_first_line(getattr(e, 'message', str(e)))}); is it truncated?"
                ) from None

        yield read, {name: shapes[key] for name, key in keys.items()}, roots, reader


def _model_garden_config(shapes: dict, source: str, config_file: str | None) -> BertConfig:
    """The config of Model Garden BertEncoder variables: `config_file` (its hidden_act in
    Model Garden's meaning, MODEL_GARDEN_ACTIVATIONS) where given, else read from the
    shapes (the heads from the query kernel's [H, N, D]) with Model Garden's BERT
    activation, "gelu" (tanh), and epsilon 1e-12, which no variable records."""
    if config_file:
        config = BertConfig.from_json_file(config_file)
        act = MODEL_GARDEN_ACTIVATIONS.get(config.hidden_act)
        if act is None:
            raise WeightLoadError(
                f"{config_file}: hidden_act {config.hidden_act!r}; Model Garden's BERT "
                f"activations are {', '.join(MODEL_GARDEN_ACTIVATIONS)}")
        return dataclasses.replace(config, hidden_act=act)
    word, positions, types = (w.model_garden for w in EMBEDDING_WEIGHTS[:3])
    query = LAYER_WEIGHTS[0].for_layer(0).model_garden
    intermediate = f"{_L_MG.format(i=0)}/intermediate/kernel"
    ranks = {word: 2, positions: 2, types: 2, query: 3, intermediate: 2}
    unfit = [f"{n} {tuple(shapes[n])}" if n in shapes else n for n, rank in ranks.items()
             if len(shapes.get(n, ())) != rank]
    if unfit:
        found = sorted(shapes)
        raise WeightLoadError(
            f"{source}: not a BERT encoder of TF Model Garden (missing or not of BertEncoder's "
            f"rank: {', '.join(unfit)}; it holds {len(found)} variables: "
            f"{', '.join(found[:5])}{' ...' if len(found) > 5 else ''})")
    layers = 0
    while f"{_L_MG.format(i=layers)}/self_attention/query/kernel" in shapes:
        layers += 1
    try:
        return BertConfig(
            vocab_size=int(shapes[word][0]), hidden_size=int(shapes[word][1]),
            num_hidden_layers=layers, num_attention_heads=int(shapes[query][1]),
            intermediate_size=int(shapes[intermediate][1]), hidden_act="gelu_tanh",
            max_position_embeddings=int(shapes[positions][0]),
            type_vocab_size=int(shapes[types][0]), layer_norm_eps=1e-12)
    except ConfigError as e:
        raise WeightLoadError(f"{source}: its variables make no BERT config ({e})") from None


def _load_tf2(model, fmt: str, shapes: dict, read, source: str, want: str) -> None:
    """`_load_table` for a TF2 checkpoint's variables (by full name, in `fmt`'s column:
    "model_garden", or "ours" for our own export): all or nothing; variables the model
    has none for are an error unless `want` is "encoder" (a head left out)."""
    hint = ""
    if want != "encoder":
        hint = ("\n  (the checkpoint holds more than a BERT encoder or its masked-LM head: "
                "convert its encoder with --model=encoder, which leaves the rest out)")
    _load_table(model, fmt, shapes, read, source, skippable=lambda n: want == "encoder",
                hint=hint)


def read_model_garden_model(path: str, want: str = "auto", config_file: str | None = None):
    """Builds the model a TF Model Garden TF2 checkpoint holds and loads it.

    The checkpoint is `tf.train.Checkpoint(encoder=BertEncoder)` (Model Garden's
    tf2_bert_encoder_checkpoint_converter, its BERT releases; `model=` as older ones), or
    BertPretrainerV2's `checkpoint_items` (the encoder and `masked_lm`). Variables are
    read by their names in the object graph, whatever object path holds them.

    Args:
      path: checkpoint prefix, one of its files, or a directory holding one.
      want: "auto": a pretrainer without NSP (our BertPretrainer(next_sentence=False)) if
        the masked-LM head is there, else an encoder; "encoder": the encoder alone
        (anything else left out); "pretrainer": the masked-LM head required.
      config_file: bert_config.json; default: the one beside the checkpoint, else the
        config read from the shapes (`_model_garden_config`).

    Raises:
      FileNotFoundError: no checkpoint; WeightLoadError: not a TF2 checkpoint of a BERT
        encoder, or tensors that do not fit (every one listed).
    """
    prefix = _checkpoint_prefix(path)
    beside = _bert_config_beside(prefix)
    config_file = config_file or (beside if os.path.exists(beside) else None)
    with _open_tf2_checkpoint(prefix, prefix) as (read, shapes, _, _):
        built = _model_garden_model(_model_garden_config(shapes, prefix, config_file), shapes,
                                    want, prefix)
        _load_tf2(built, "model_garden", shapes, read, prefix, want)
    return built


# Model Garden's masked-LM head (BertPretrainerV2's `masked_lm`, TF Hub's `mlm` sub-object).
MODEL_GARDEN_MLM_SCOPE = "bert/cls/predictions/"


def _model_garden_model(config: BertConfig, shapes: dict, want: str, source: str):
    """The model to build for Model Garden variables: with the masked-LM head, a
    BertPretrainer without NSP (Model Garden's pretrainer has none), unless `want` is
    "encoder"."""
    mlm = any(n.startswith(MODEL_GARDEN_MLM_SCOPE) for n in shapes)
    if want == "pretrainer" and not mlm:
        raise WeightLoadError(f"{source}: no masked-LM head ({MODEL_GARDEN_MLM_SCOPE}*), not a "
                              "pretrainer; convert with --model=encoder")
    built = BertEncoder.from_bert_config(config)
    return BertPretrainer(built, next_sentence=False) if mlm and want != "encoder" else built


def read_tf_hub_model(path: str, want: str = "auto", config_file: str | None = None):
    """Builds the BERT encoder a TF Hub-format SavedModel holds and loads its variables.

    Two layouts: TF Hub's BERT encoders (Model Garden's export_tfhub: BertEncoder variable
    names, config from their shapes as in `_model_garden_config`, `--bert_config_file`
    for another activation than Model Garden's "gelu"; with the `mlm` sub-object, a
    pretrainer without NSP, as `read_model_garden_model`), and our own encoder export
    (export/export_encoder.py: our variable names, assets/bert_config.json; with --mlm its
    pretraining heads).

    Args:
      path: the SavedModel directory (saved_model.pb, variables/, assets/).
      want: as `read_model_garden_model`.
      config_file: a bert_config.json for TF Hub's layout (Model Garden's meaning).

    Returns:
      (model, do_lower_case): the casing TF Hub's `do_lower_case` variable holds, or None.

    Raises:
      WeightLoadError: not a SavedModel of a BERT encoder, or tensors that do not fit.
    """
    if not is_saved_model_dir(path):
        raise WeightLoadError(f"{path}: not a SavedModel with variables (expected "
                              f"saved_model.pb and {SAVED_MODEL_VARIABLES}.index)")
    prefix = os.path.join(path, SAVED_MODEL_VARIABLES)
    own_config = os.path.join(path, SAVED_MODEL_ASSETS, files.BERT_CONFIG_FILE)
    with _open_tf2_checkpoint(prefix, path) as (read, shapes, roots, reader):
        ours = EMBEDDING_WEIGHTS[0].ours in shapes and files.isfile(own_config)
        if ours:  # our export: our names, and the config it was exported with
            config = BertConfig.from_json_file(own_config)
            fmt, heads = "ours", [n for n in shapes if n.startswith(("masked_lm/", "nsp_dense/"))]
            built = BertEncoder.from_bert_config(config)
            if want == "pretrainer" and not heads:
                raise WeightLoadError(f"{path}: exported without --mlm: no pretraining heads")
            if heads and want != "encoder":
                built = BertPretrainer(built, next_sentence=any(
                    n.startswith("nsp_dense/") for n in heads))
        else:
            fmt = "model_garden"
            built = _model_garden_model(_model_garden_config(shapes, path, config_file),
                                        shapes, want, path)
        _load_tf2(built, fmt, shapes, read, path, want)
        do_lower_case = None
        if "do_lower_case" in roots:
            do_lower_case = bool(reader.get_tensor(roots["do_lower_case"]))
    return built, do_lower_case


# ------------------------------------------------------------------------------------------
# Hugging Face


def _hf_files(path: str) -> tuple[list[str], str, str | None]:
    """Returns (safetensors files, the name to report them by, config.json or None) for a
    .safetensors file or a save_pretrained directory: model.safetensors, or the shards
    model.safetensors.index.json maps the tensors to (save_pretrained's max_shard_size)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        weights = os.path.join(path, files.HF_WEIGHTS_FILE)
        index = os.path.join(path, files.HF_WEIGHTS_INDEX_FILE)
        config = os.path.join(path, files.HF_CONFIG_FILE)
        config = config if os.path.exists(config) else None
        if os.path.exists(weights):
            return [weights], weights, config
        if os.path.exists(index):
            return _hf_shards(index), index, config
        found = sorted(os.listdir(path))
        raise FileNotFoundError(
            f"{path}: no model.safetensors or model.safetensors.index.json (found {found}). "
            "Save the model with transformers' save_pretrained(..., safe_serialization=True)."
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"Hugging Face weights not found: {path}")
    return [path], path, None


def _hf_shards(index: str) -> list[str]:
    """The shard files a model.safetensors.index.json maps tensors to (beside it)."""
    try:
        content = files.read_json(index)
    except files.TextFileError as e:
        raise WeightLoadError(str(e)) from None
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(v, str) and v and os.path.basename(v) == v for v in weight_map.values()):
        raise WeightLoadError(f"{index}: expected a \"weight_map\" of tensor names to shard "
                              "file names beside it (transformers' sharded save_pretrained)")
    shards = [os.path.join(os.path.dirname(index), name)
              for name in sorted(set(weight_map.values()))]
    missing = [os.path.basename(s) for s in shards if not os.path.isfile(s)]
    if missing:
        raise WeightLoadError(f"{index}: names shard files that are not beside it: "
                              f"{', '.join(missing)}")
    return shards


def _hf_keys(path: str) -> set[str]:
    """Every tensor name in a Hugging Face checkpoint (all its shards)."""
    from safetensors import safe_open

    weight_files, _, _ = _hf_files(path)
    keys = set()
    for weights_file in weight_files:
        with reading(weights_file, "a safetensors file"):
            with safe_open(weights_file, framework="numpy") as f:
                keys.update(_hf_current_name(k) for k in f.keys())
    return keys


def is_hf_dir(path: str) -> bool:
    """Whether `path` is a directory transformers' save_pretrained wrote weights to."""
    return any(os.path.isfile(os.path.join(path, name))
               for name in (files.HF_WEIGHTS_FILE, files.HF_WEIGHTS_INDEX_FILE))


def _read_hf_json(path: str) -> tuple[dict, str]:
    """transformers' config.json (file or save_pretrained dir) as a dict, and its path."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, files.HF_CONFIG_FILE)
    try:
        hf = files.read_json(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"Hugging Face config not found: {path}") from None
    except files.TextFileError as e:  # not UTF-8 text, or not JSON: the line named
        raise WeightLoadError(str(e)) from None
    if not isinstance(hf, dict):
        raise WeightLoadError(f"{path}: expected a JSON object")
    return hf, path


def read_hf_config(path: str) -> BertConfig:
    """Reads a transformers BERT `config.json` (file or save_pretrained dir) as a BertConfig."""
    hf, path = _read_hf_json(path)
    try:
        return BertConfig.from_transformers_dict(hf, source=path)
    except ConfigError as e:  # a checkpoint's file: reported as the checkpoint readers do
        raise WeightLoadError(str(e)) from None


def placeholder_labels(labels) -> bool:
    """Whether `labels` are transformers' placeholder names, LABEL_0 ... LABEL_{C-1}: what
    its config holds for a head never given names (`num_labels=2` alone; transformers 5
    then writes no id2label). transformers' run_glue.py reads them as no names."""
    return bool(labels) and list(labels) == [f"LABEL_{i}" for i in range(len(labels))]


def read_hf_labels(path: str) -> list[str] | None:
    """The label names of a transformers task checkpoint, in id order, from config.json's
    `id2label` (None for models without labels: encoders, pretrainers, span QA).

    Raises:
      ValueError: id2label's ids are not 0..C-1, or its names are empty or repeated.
    """
    hf, config_file = _read_hf_json(path)
    kind = hf_architecture(path)
    if kind not in LABELLED_TASK_MODELS:
        return None
    id2label = hf.get("id2label")
    if id2label is None:
        count = hf.get("num_labels", 2)
        return [f"LABEL_{i}" for i in range(count)]  # transformers' own default names
    if not isinstance(id2label, dict) or not id2label:
        raise WeightLoadError(f"{config_file}: id2label should be a non-empty object "
                         f"{{\"0\": name, ...}}; found {id2label!r}")
    try:
        by_id = {int(k): v for k, v in id2label.items()}
    except ValueError:
        raise WeightLoadError(f"{config_file}: id2label keys must be class ids 0..C-1; found "
                         f"{sorted(id2label)}") from None
    if sorted(by_id) != list(range(len(by_id))):
        raise WeightLoadError(f"{config_file}: id2label keys must be class ids "
                              f"0..{len(by_id) - 1}; "
                         f"found {sorted(by_id)}")
    labels = [by_id[i] for i in range(len(by_id))]
    bad = [label for label in labels
           if not isinstance(label, str) or not label.strip() or "\n" in label]
    if bad:
        raise WeightLoadError(f"{config_file}: id2label names must be non-empty one-line strings; "
                         f"found {bad}")
    if len(set(labels)) != len(labels):
        raise WeightLoadError(f"{config_file}: id2label names repeat ({labels}); labels.txt needs "
                         "distinct names")
    return labels


HF_TOKENIZER_FILE = tokenizer_config.HF_TOKENIZER_FILE  # transformers 5.x saves it, not vocab.txt


def read_hf_tokenizer(directory: str) -> tuple[list[str], dict | None] | None:
    """(the WordPiece vocabulary in id order, tokenizer.json's JSON object or None) of a
    transformers directory; None when it has neither vocab.txt nor tokenizer.json.

    The tokens come from vocab.txt when present, else from tokenizer.json's WordPiece model
    (transformers 5.x's `save_pretrained` writes only that). tokenizer.json is read once,
    here: its added tokens (`check_no_added_tokens`) and its normalizer
    (`tokenizer_config.normalizer_settings`) are taken from the object returned. Beside a
    vocab.txt a tokenizer.json that cannot be read is returned as None (it is not the
    vocabulary's source).

    Raises:
      WeightLoadError: without vocab.txt, a tokenizer.json that cannot be read, is not a
        WordPiece tokenizer, or whose ids are not 0..V-1.
    """
    vocab_txt = os.path.join(directory, files.VOCAB_FILE)
    path = os.path.join(directory, HF_TOKENIZER_FILE)
    if os.path.isfile(vocab_txt):
        from data_prep import schema

        tokens = schema.load_vocab(vocab_txt)
        try:
            values = files.read_json(path, "transformers' tokenizer.json") if os.path.isfile(
                path) else None
        except (files.TextFileError, OSError):
            values = None
        return tokens, values if isinstance(values, dict) else None
    if not os.path.isfile(path):
        return None
    try:
        values = files.read_json(path, "transformers' tokenizer.json")
    except files.TextFileError as e:
        raise WeightLoadError(str(e)) from None
    except OSError as e:
        raise WeightLoadError(f"{path}: cannot be read as a tokenizer.json ({e})") from None
    if not isinstance(values, dict):
        raise WeightLoadError(f"{path}: cannot be read as a tokenizer.json (a JSON "
                              f"{type(values).__name__}, not an object)")
    model = values.get("model") or {}
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(
            vocab, dict):
        kind = model.get("type") if isinstance(model, dict) else None
        raise WeightLoadError(f"{path}: a {kind!r} tokenizer; BERT needs a WordPiece "
                              "vocabulary")
    by_id = {i: token for token, i in vocab.items()}
    if sorted(by_id) != list(range(len(vocab))):
        raise WeightLoadError(f"{path}: WordPiece ids are not 0..{len(vocab) - 1}")
    return [by_id[i] for i in range(len(vocab))], values


HF_ADDED_TOKENS_FILE = "added_tokens.json"  # transformers 4's slow tokenizer: token -> id


def check_no_added_tokens(directory: str, vocab: list[str],
                          tokenizer_json: dict | None) -> None:
    """Refuses a transformers directory whose tokenizer has tokens beyond `vocab` (the
    WordPieces, in id order): `tokenizer.add_tokens([...])` (or added special tokens) then
    `resize_token_embeddings`. transformers matches such a token in the raw text before
    WordPiece, anywhere it occurs; bert-keras tokenizes with the WordPieces alone, so it
    would split the token into other ids (or [UNK]) without a word. The model's embedding
    rows cover them, so the vocabulary-size check does not catch it.

    Args:
      directory: the transformers directory (its added_tokens.json is read here).
      vocab: its WordPieces; tokenizer_json: its tokenizer.json as `read_hf_tokenizer`
        returned it (None: none, or one that cannot be read beside a vocab.txt).

    Raises:
      WeightLoadError: naming the file, the tokens and their ids.
    """
    added = {}  # id -> token
    path = os.path.join(directory, HF_TOKENIZER_FILE)
    entries = (tokenizer_json or {}).get("added_tokens")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("id"), int):
            added[entry["id"]] = (str(entry.get("content")), path)
    path = os.path.join(directory, HF_ADDED_TOKENS_FILE)
    if os.path.isfile(path):
        try:
            entries = files.read_json(path, "transformers' added_tokens.json")
        except (files.TextFileError, OSError) as e:
            raise WeightLoadError(str(e)) from None
        for token, i in entries.items() if isinstance(entries, dict) else ():
            if isinstance(i, int):
                added[i] = (str(token), path)
    beyond = sorted((i, token, where) for i, (token, where) in added.items()
                    if not 0 <= i < len(vocab) or vocab[i] != token)
    if beyond:
        names = ", ".join(f"{token!r} (id {i})" for i, token, _ in beyond[:5])
        more = f" and {len(beyond) - 5} more" if len(beyond) > 5 else ""
        raise WeightLoadError(
            f"{beyond[0][2]}: the tokenizer has {len(beyond)} token(s) added beyond its "
            f"{len(vocab)} WordPieces ({names}{more}; tokenizer.add_tokens); bert-keras "
            "tokenizes with the WordPieces alone and would split them into other ids: put "
            "each in vocab.txt in place of an [unusedN] token (Google's way) before "
            "fine-tuning, or use transformers' tokenizer")


def hf_architecture(path: str):
    """What a transformers checkpoint holds: "encoder", "pretrainer", "masked_lm" or a task
    model class, from config.json's `architectures` (HF_ARCHITECTURES).

    BertForMaskedLM with an NSP head in the file (bert-base-uncased, and other checkpoints
    of Google's pretraining) is a "pretrainer": transformers' BertForPreTraining loads all
    of it.

    Without `architectures` (older or hand-written configs) the tensor names decide:
    `qa_outputs.*` span QA, `cls.seq_relationship.*` pretraining, `cls.predictions.*`
    masked LM, no head an encoder; `classifier.*` is refused (sequence or token
    classification cannot be told apart by the weights).

    Raises:
      ValueError: an architecture bert-keras has no model for, one whose head it cannot
        represent (regression, multi-label), or an ambiguous checkpoint.
    """
    hf, config_file = _read_hf_json(path)
    names = hf.get("architectures")
    if names:
        if not isinstance(names, list) or len(set(names)) != 1:
            raise WeightLoadError(f"{config_file}: architectures should name one model class; "
                             f"found {names!r}")
        name = names[0]
        if name not in HF_ARCHITECTURES:
            raise WeightLoadError(
                f"{config_file}: architectures is [{name!r}]; bert-keras can load "
                f"{', '.join(HF_ARCHITECTURES)} (or the encoder alone of any BERT "
                "checkpoint: model='encoder', --model=encoder)")
        kind = HF_ARCHITECTURES[name]
        if kind == "masked_lm" and any(k.startswith(HF_NSP_PREFIX) for k in _hf_keys(path)):
            # bert-base-uncased and other checkpoints Google's pretraining made: config.json
            # names BertForMaskedLM, the file also holds the NSP head (as transformers'
            # BertForPreTraining loads it). The pretrainer with NSP keeps every tensor.
            kind = "pretrainer"
    else:
        keys = _hf_keys(path)
        if any(k.startswith("classifier.") for k in keys):
            raise WeightLoadError(
                f"{config_file}: no `architectures`, and a classifier.* head fits both "
                "BertForSequenceClassification and BertForTokenClassification; add "
                "\"architectures\": [\"BertFor...\"] to config.json")
        kind = (BertSpanQA if any(k.startswith("qa_outputs.") for k in keys)
                else "pretrainer" if any(k.startswith(HF_NSP_PREFIX) for k in keys)
                else "masked_lm" if any(k.startswith("cls.predictions.") for k in keys)
                else "encoder")
    if kind is BertClassifier:
        problem = hf.get("problem_type")
        count = len(hf["id2label"]) if hf.get("id2label") else hf.get("num_labels", 2)
        if problem is None and count == 1:
            problem = "regression"  # transformers' rule for num_labels == 1
        if problem == "regression" and count != 1:
            raise WeightLoadError(
                f"{config_file}: problem_type is 'regression' with {count} labels; "
                "BertRegressor predicts one score (num_labels 1); for its encoder alone: "
                f"{ENCODER_ALONE}")
        if problem == "regression":
            return BertRegressor
        if problem not in (None, "single_label_classification"):
            raise WeightLoadError(
                f"{config_file}: problem_type is {problem!r}; BertClassifier is a single-label "
                "softmax classifier (multi-label heads are not supported); "
                f"for its encoder alone: {ENCODER_ALONE}")
    return kind


# What an error about a head the caller cannot load says to do for the encoder alone.
ENCODER_ALONE = ("python -m bert_keras.convert_checkpoint --model=encoder --from=hf "
                 "--to=keras --input=DIR --output=ENCODER_DIR, then give ENCODER_DIR")


def _read_hf_tensors(path: str):
    """Reads a safetensors file with names normalised to BertModel's (prefix stripped).

    Returns:
      (tensors, names outside the encoder scope, whether the file nests the encoder under
      `bert.`, weights file, config file or None).
    """
    # Models saved in bfloat16: safetensors.numpy names the dtype "bfloat16", which numpy
    # knows once ml_dtypes is imported (Keras imports it too); our float32 variables hold
    # every such value exactly.
    import ml_dtypes  # noqa: F401
    from safetensors.numpy import load_file  # Reads safetensors without torch.

    weight_files, weights_file, config_file = _hf_files(path)
    raw = {}
    for shard in weight_files:
        try:
            raw.update(load_file(shard))
        except Exception as e:  # safetensors raises its own SafetensorError on bad files.
            raise WeightLoadError(
                f"{shard}: cannot read safetensors file ({e}); is the file complete?"
            ) from None
    nested = any(k.startswith(HF_ENCODER_PREFIX) for k in raw)
    tensors, outside = {}, set()
    for key, value in raw.items():
        key = _hf_current_name(key)
        if nested and key.startswith(HF_ENCODER_PREFIX):
            key = key[len(HF_ENCODER_PREFIX):]
        elif nested or key.startswith(HF_HEAD_PREFIX):
            outside.add(key)  # Heads (cls.*, classifier.*, ...): not part of the encoder.
        if key not in HF_IGNORED:
            tensors[key] = value
    return tensors, outside, nested, weights_file, config_file


def load_hf_weights(model, path: str, allow_unused: bool = False) -> list[str]:
    """Loads Hugging Face BERT weights into one of our models, all or nothing.

    Args:
      model: a built `BertEncoder` (BertModel names), `BertPretrainer` (BertForPreTraining
        names, or BertForMaskedLM's without the NSP head), or task model (BertClassifier:
        BertForSequenceClassification, BertTagger: BertForTokenClassification, BertSpanQA:
        BertForQuestionAnswering).
      path: a directory written by transformers' `save_pretrained` (model.safetensors and
        config.json), or a .safetensors file (no config check then). Names may carry the
        `bert.` prefix. Tied copies (`cls.predictions.decoder.*`) are accepted when equal to
        what they are tied to; `embeddings.position_ids` buffers are ignored.
      allow_unused: skip tensors the model has no variable for (a head the caller chose to
        leave out, e.g. loading a classifier's encoder); by default they are an error, so
        a head is never dropped without the caller asking.

    Pooler weights may be absent (transformers' `add_pooling_layer=False`: its tagging, QA
    and masked-LM classes, and encoders saved without one). The pooler is then set to zero:
    nothing changes for models that do not read it; an encoder's pooled_output is zeros
    (a warning says so).

    Returns:
      The table names the file lacked (the pooler's two, or none).

    Raises:
      FileNotFoundError: no weights at `path`.
      WeightLoadError: missing, unexpected or mis-shaped tensors (all listed by name, with
        both shapes), an unreadable file, or a config.json that disagrees with the model.
    """
    tensors, outside, nested, weights_file, config_file = _read_hf_tensors(path)
    if config_file is not None:
        _check_config_fits(model, read_hf_config(config_file), config_file)
    pretrainer = isinstance(model, BertPretrainer)
    if pretrainer:
        for alias, source in HF_TIED.items():
            if alias not in tensors:
                continue
            value = tensors.pop(alias)
            outside.discard(alias)
            if source not in tensors:
                tensors[source] = value
            elif not np.array_equal(value, tensors[source]):
                raise WeightLoadError(
                    f"{weights_file}: {alias} differs from {source}; BertPretrainer ties them, "
                    f"so untied weights cannot be loaded; for its encoder alone: {ENCODER_ALONE}"
                )
    else:
        for alias in HF_TIED:  # Copies of what is checked anyway: not a head of their own.
            if alias in tensors and HF_TIED[alias] in tensors:
                tensors.pop(alias)
    hint = ""
    if pretrainer and not any(k.startswith(HF_HEAD_PREFIX) for k in tensors):
        hint = ("\n  (the file has no pretraining heads cls.*; load it into pretrainer.encoder, "
                "or convert with --model=encoder)")
    elif not allow_unused and any(n not in {w.hf for w in model_weight_names(model)}
                                  for n in tensors):
        hint = ("\n  (the file holds more than this model: load it into the model that has "
                "those tensors (config.json's `architectures` names it for model='auto'), or "
                "with model='encoder' (--model=encoder) to leave the head out)")

    def display(name):  # The file's own spelling, which the user can look up.
        nest = nested and name not in outside and not name.startswith(HF_HEAD_PREFIX)
        return HF_ENCODER_PREFIX + name if nest else name

    absent = _load_table(model, "hf", {k: v.shape for k, v in tensors.items()},
                         tensors.__getitem__, weights_file, lambda name: allow_unused, hint,
                         display, optional=frozenset(w.hf for w in POOLER_WEIGHTS))
    if absent:
        for variable in _encoder_of(model).pooler_layer.weights:
            variable.assign(np.zeros(variable.shape, variable.dtype))
        if reads_pooler(model):
            logging.warning("%s: no pooler weights (saved with add_pooling_layer=False): the "
                            "pooler is set to zero, pooled_output is all zeros", weights_file)
    return absent


def hf_config_dict(model, labels: list[str] | None = None) -> dict:
    """transformers' config.json for `model`, with `id2label` / `label2id` for a
    classifier or tagger (default names LABEL_i, as transformers gives)."""
    config = _encoder_of(model).to_bert_config()
    if isinstance(model, BertPretrainer):
        architecture = "BertForPreTraining" if model.next_sentence else "BertForMaskedLM"
    elif isinstance(model, TASK_MODELS):
        architecture = HF_TASK_ARCHITECTURE[type(model)]
    else:
        architecture = "BertModel"
    values = config.to_dict()
    values.update(
        architectures=[architecture],
        model_type="bert",
        hidden_act=HF_ACTIVATION.get(config.hidden_act, config.hidden_act),
        pad_token_id=0,
        position_embedding_type="absolute",
        tie_word_embeddings=True,
        dtype="float32",
    )
    if isinstance(model, (BertClassifier, BertTagger)):
        labels = list(labels) if labels is not None else [
            f"LABEL_{i}" for i in range(model.num_classes)]
        if len(labels) != model.num_classes:
            raise ValueError(f"{len(labels)} labels for a {type(model).__name__} with "
                             f"{model.num_classes} classes")
        values.update(id2label={str(i): label for i, label in enumerate(labels)},
                      label2id={label: i for i, label in enumerate(labels)},
                      classifier_dropout=model.dropout)
        if isinstance(model, BertClassifier):
            values["problem_type"] = "single_label_classification"
    if isinstance(model, BertRegressor):
        if labels is not None:
            raise ValueError("a BertRegressor has no labels")
        values.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0},
                      classifier_dropout=model.dropout, problem_type="regression")
    return values


def save_hf_weights(model, directory: str, labels: list[str] | None = None,
                    vocab_file: str | None = None, settings=None) -> str:
    """Writes `model` as a transformers `save_pretrained` directory (no torch needed).

    An encoder is written with BertModel names, a pretrainer with BertForPreTraining (or,
    without NSP, BertForMaskedLM) names, a task model with its BertFor* class's names
    (encoder under `bert.`; heads under `cls.` or at the top level; the tied decoder weight
    omitted, as transformers itself does). Models that do not read the pooler are written
    without it, as transformers' classes for them have none, and so is an encoder's
    all-zero pooler (what weights without one load as), so that an encoder saved with
    `add_pooling_layer=False` converts back without one. The directory is built under a
    temporary name and renamed.

    Args:
      model: BertEncoder, BertPretrainer, BertClassifier, BertTagger or BertSpanQA.
      directory: output directory; must not exist (or be empty).
      labels: a classifier's or tagger's label names in id order (config.json's id2label).
      vocab_file: copied as vocab.txt, with `settings` (a TokenizerConfig) as
        tokenizer_config.json in transformers' keys, so AutoTokenizer reads the directory.

    Returns:
      The directory, holding config.json and model.safetensors.

    Raises:
      FileExistsError: `directory` exists and is not empty.
    """
    from safetensors.numpy import save_file

    from data_prep import tokenizer_config

    directory = os.path.abspath(os.fspath(directory))
    check_output_free("hf", directory)
    config = hf_config_dict(model, labels)
    nest = not isinstance(model, BertEncoder)
    encoder_rows = {w.ours for w in encoder_weight_names(_encoder_of(model).num_layers)}
    skip = set() if reads_pooler(model) else {w.ours for w in POOLER_WEIGHTS}
    pooler = _encoder_of(model).pooler_layer
    if isinstance(model, BertEncoder) and not any(np.any(w) for w in pooler.get_weights()):
        # All zeros is how a checkpoint without pooler weights loads (transformers'
        # add_pooling_layer=False): written without them, transformers initialises them
        # as it does for that file, not as zeros it would take for trained weights.
        logging.info("%s: the pooler is all zeros (loaded from weights without one): "
                     "written without it, as the file it came from", directory)
        skip = {w.ours for w in POOLER_WEIGHTS}
    tensors = {}
    for w, value in _variable_values(model):
        if w.ours in skip:
            continue
        key = HF_ENCODER_PREFIX + w.hf if nest and w.ours in encoder_rows else w.hf
        tensors[key] = np.ascontiguousarray(w.convert("hf", value))
    # An empty directory is replaced (check_output_free refused a non-empty one).
    with files.atomic_output(directory, overwrite=os.path.isdir(directory), directory=True) as tmp:
        files.write_json(os.path.join(tmp, files.HF_CONFIG_FILE), config)
        # transformers refuses safetensors files without format metadata.
        save_file(tensors, os.path.join(tmp, files.HF_WEIGHTS_FILE), metadata={"format": "pt"})
        if vocab_file:
            # model_max_length: transformers' tokenizer truncates to the position table
            # (without it, truncation=True lets a long text past the model's 512 positions),
            # or to the shorter limit the vocabulary's own settings give.
            limit = _encoder_of(model).max_sequence_length
            saved = tokenizer_config.saved_model_max_length(vocab_file)
            vocab = files.copy_file(vocab_file, os.path.join(tmp, files.VOCAB_FILE))
            tokenizer_config.write_for_vocab(
                vocab, settings or tokenizer_config.TokenizerConfig(),
                model_max_length=min(limit, saved or limit))
    return directory


def load_hf_encoder(path: str, **kwargs):
    """Builds a BertEncoder from a transformers save_pretrained directory and loads it.

    Heads in the file are left out (the caller asked for the encoder).

    Args:
      path: directory with config.json and model.safetensors.
      **kwargs: passed to `BertEncoder.from_bert_config` (e.g. dtype).
    """
    encoder = BertEncoder.from_bert_config(read_hf_config(path), **kwargs)
    load_hf_weights(encoder, path, allow_unused=True)
    return encoder


# ------------------------------------------------------------------------------------------
# Keras weights files (.weights.h5)


class _WritesUntilFailure(io.BytesIO):
    """The file object h5py writes a weights file through: every call goes to `file` until
    a write fails; from then on writes are dropped and the first failure is kept (`error`).

    HDF5 writing to a path that fails part-way (a full disk, the file-size limit) keeps the
    metadata it could not write and tries again on every close and every object released:
    run_pretraining's checkpoint printed 150 "Exception ignored" tracebacks of h5py and the
    process died of a segmentation fault (exit status 139). Writes dropped after the first
    failure let HDF5 close the file; the caller raises the failure and removes the file.
    (An io.BytesIO subclass because Keras' H5IOStore takes a path or a BytesIO; its buffer
    is never used.)
    """

    def __init__(self, file):
        super().__init__()
        self._file = file
        self.error: OSError | None = None

    def _guarded(self, call, *args, dropped=None):
        if self.error is None:
            try:
                return call(*args)
            except OSError as e:
                self.error = e
        return dropped

    def seek(self, offset, whence=0):
        return self._file.seek(offset, whence)

    def tell(self):
        return self._file.tell()

    def read(self, size=-1):
        return self._file.read(size)

    def readinto(self, buffer):
        return self._file.readinto(buffer)

    def write(self, data):
        return self._guarded(self._file.write, data, dropped=memoryview(data).nbytes)

    def truncate(self, size=None):
        return self._guarded(self._file.truncate, size, dropped=size)

    def flush(self):
        self._guarded(self._file.flush)

    def close(self):
        super().close()  # the file is the caller's to close


@contextlib.contextmanager
def h5_file_writing(path: str, mode: str = "w"):
    """Yields an h5py.File of `path` (opened with `mode`, "w" or "a") whose failed write is
    raised, when the block ends, as Python's OSError (`_WritesUntilFailure`), not as HDF5's
    crash; `files.atomic_output` names the output in it."""
    import h5py

    with open(path, "w+b" if mode == "w" else "r+b") as f:
        through = _WritesUntilFailure(f)
        with h5py.File(through, mode) as h5:
            yield h5
    if through.error is not None:
        raise through.error


def save_weights(model, path: str) -> None:
    """`model.save_weights(path)`: the same .weights.h5 file (weights and optimizer
    variables, read by `model.load_weights`), written through `_WritesUntilFailure`, so
    that a write failing part-way is an OSError, not a crash of the process.

    Args:
      model: a built Keras model.
      path: the file to write (in practice `files.atomic_output`'s temporary).

    Raises:
      OSError: a write failed (no space, the file-size limit, ...); `path` is incomplete.
    """
    # Keras' own save_weights_only, with the file object in place of the path (its
    # H5IOStore takes an io.BytesIO, as Keras does for the weights inside a .keras file).
    from keras.src.saving import saving_lib

    if not model.built:
        raise ValueError("save_weights: the model is not built")
    with open(path, "w+b") as f:
        through = _WritesUntilFailure(f)
        store = saving_lib.H5IOStore(through, mode="w")
        try:
            saving_lib._save_state(  # pylint: disable=protected-access
                model, weights_store=store, assets_store=None, inner_path="",
                visited_saveables=set())
        finally:
            store.close()
    if through.error is not None:
        raise through.error


# ------------------------------------------------------------------------------------------
# Keras (.keras files) and format-generic save (used by convert_checkpoint)


def save_keras_model(model, path: str) -> str:
    """`model.save(path)` under a temporary name, renamed when complete; never overwrites."""
    path = os.path.abspath(os.fspath(path))
    if not path.endswith(".keras"):
        raise ValueError(f"Keras model files must end in .keras. Received: {path}")
    check_output_free("keras", path)
    with files.atomic_output(path) as tmp:
        model.save(tmp)
    return path


def read_keras_file(path: str):
    """Loads any Keras model from a `.keras` file; errors name the file.

    `safe_mode` stays on: a file a user points at cannot run code of its own (no lambdas).
    """
    import keras

    import zipfile

    from bert_keras import optimization  # noqa: F401  (registers AdamW, Lamb, ...: a file
    # saved with --save_optimizer_state names them; without this, a process that never built
    # an optimizer, such as an export tool, cannot load it)

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Keras model file not found: {path}")
    if not zipfile.is_zipfile(path):
        raise WeightLoadError(f"{path}: not a .keras file (a zip archive); the file is "
                              "truncated or of another format")
    try:
        return keras.saving.load_model(path)
    except Exception as e:  # zipfile, h5py and Keras errors alike: name the file.
        raise WeightLoadError(f"{path}: cannot load Keras model ({_first_line(str(e))})") from None


def load_keras_model(path: str):
    """Loads a `.keras` file holding one of our models (encoder, pretrainer, task model)."""
    model = read_keras_file(path)
    if not isinstance(model, (BertEncoder, BertPretrainer, *TASK_MODELS)):
        raise WeightLoadError(
            f"{path}: holds a {type(model).__name__}, expected a BertEncoder, BertPretrainer, "
            "BertClassifier, BertRegressor, BertTagger or BertSpanQA"
        )
    return model


# Google's fine-tuning heads, by the model that holds each: run_classifier.py's
# output_weights [C, H] / output_bias, run_squad.py's cls/squad/output_weights [2, H] /
# output_bias (Google's repository has no tagger).
GOOGLE_TASK_HEADS = {BertClassifier: CLASSIFIER_WEIGHTS, BertSpanQA: SPAN_QA_WEIGHTS}


def google_heads_left_out(names) -> list[str]:
    """The tensors of a Google checkpoint (its variable names) that no model here reads,
    besides the optimizer state: a head other than pretraining's and the fine-tuning heads
    of Google's run_classifier and run_squad (`GOOGLE_TASK_HEADS`)."""
    task_heads = {w.google for weights in GOOGLE_TASK_HEADS.values() for w in weights}
    return sorted(n for n in names if not n.startswith(GOOGLE_MODEL_SCOPES)
                  and n not in task_heads and not GOOGLE_TRAINING_STATE.search(n))


def _google_task_model(encoder: BertEncoder, names: dict):
    """The fine-tuned model a Google checkpoint's names show, built on `encoder`: a
    BertClassifier of C classes for run_classifier's [C, H] output_weights, a BertSpanQA
    for run_squad's head; `encoder` itself without either."""
    for model_class, weights in GOOGLE_TASK_HEADS.items():
        kernel = weights[0].google
        if kernel in names:
            if model_class is BertClassifier:
                return BertClassifier(encoder, num_classes=int(names[kernel][0]))
            return model_class(encoder)
    return encoder


def read_google_model(path: str, want: str = "auto", config_file: str | None = None):
    """Builds the model a Google TF1 checkpoint holds and loads it.

    Args:
      path: checkpoint prefix, one of its files, or a directory holding one.
      want: "auto": a pretrainer if the file has pretraining heads (cls/predictions/*;
        without cls/seq_relationship/*, one without the NSP head, as an MLM-only pretrainer
        is written); the fine-tuned model of Google's run_classifier (output_weights: a
        BertClassifier, no label names) or run_squad (cls/squad/*: a BertSpanQA), head
        included, as Google's `init_from_checkpoint` restores it; else an encoder.
        "encoder": the encoder alone (a head is left out); "pretrainer": pretraining heads
        required.
      config_file: bert_config.json, if not beside the checkpoint.

    Raises:
      FileNotFoundError: no checkpoint or no bert_config.json; WeightLoadError: tensors or
        config that do not fit, or an unreadable file.
    """
    prefix = _checkpoint_prefix(path)
    config_file = config_file or _bert_config_beside(prefix)
    if not os.path.exists(config_file):
        raise FileNotFoundError(
            f"{config_file}: not found; a Google checkpoint ({prefix}) needs its "
            "bert_config.json beside it or passed explicitly (--bert_config_file)"
        )
    names = read_google_checkpoint_names(prefix)
    if TF2_OBJECT_GRAPH in names:
        raise WeightLoadError(f"{prefix}: a TF2 object-based checkpoint, not Google's TF1 "
                              "format: TF Model Garden's BertEncoder is read with "
                              "--from=model_garden")
    config = BertConfig.from_json_file(config_file)
    built = BertEncoder.from_bert_config(config)
    if want == "pretrainer" or (
            want == "auto" and any(n.startswith(GOOGLE_PRETRAINING_SCOPES) for n in names)):
        built = BertPretrainer(built, next_sentence=any(
            n.startswith("cls/seq_relationship/") for n in names))
    elif want == "auto":
        built = _google_task_model(built, names)
    try:
        load_google_checkpoint(built, prefix, config_file)
    except WeightLoadError as e:
        hint = _config_file_hint(prefix, config_file)
        if not hint:
            raise
        raise WeightLoadError(f"{e}{hint}") from None
    return built


def read_hf_model(path: str, want: str = "auto"):
    """Builds the model a transformers directory holds (config.json's `architectures`,
    HF_ARCHITECTURES) and loads it.

    Args:
      path: save_pretrained directory.
      want: "auto": the model config.json names (BertModel an encoder, its pooler may be
        absent; BertForPreTraining a pretrainer; BertForMaskedLM a pretrainer without NSP,
        or with it where the file holds the NSP head, as bert-base-uncased's does;
        BertForSequenceClassification / TokenClassification / QuestionAnswering a
        BertClassifier / BertTagger / BertSpanQA, labels from `read_hf_labels`);
        "encoder": only the encoder (heads in the file are left out); "pretrainer":
        pretraining heads required.

    Raises:
      WeightLoadError: an unknown architecture, tensors that do not fit (a head the model
        would drop included), a config that does not fit, an unreadable file.
    """
    config = read_hf_config(path)
    if want == "encoder":
        built = BertEncoder.from_bert_config(config)
        load_hf_weights(built, path, allow_unused=True)
        return built
    kind = hf_architecture(path)
    if want == "pretrainer" and kind not in ("pretrainer", "masked_lm"):
        name = kind if isinstance(kind, str) else HF_TASK_ARCHITECTURE[kind]
        raise WeightLoadError(f"{path}: holds a {name}, not a pretrainer (no pretraining heads "
                              "cls.*); use --model=encoder or --model=auto")
    encoder = BertEncoder.from_bert_config(config)
    if kind == "encoder":
        built = encoder
    elif kind in ("pretrainer", "masked_lm"):
        built = BertPretrainer(encoder, next_sentence=kind == "pretrainer")
    elif kind is BertSpanQA:
        built = BertSpanQA(encoder)
    elif kind is BertRegressor:
        hf, _ = _read_hf_json(path)
        dropout = hf.get("classifier_dropout")
        built = BertRegressor(encoder, dropout=config.hidden_dropout_prob if dropout is None
                              else dropout)
    else:
        labels = read_hf_labels(path)
        hf, _ = _read_hf_json(path)
        dropout = hf.get("classifier_dropout")
        if dropout is None:
            dropout = config.hidden_dropout_prob
        built = kind(encoder, len(labels), dropout=dropout)
    load_hf_weights(built, path)
    return built


def save_model(model, fmt: str, path: str, **kwargs) -> str:
    """Writes `model` in format `fmt` ("google", "hf", "keras", "keras_hub") to `path`; never
    overwrites.

    `kwargs` go to the hf and keras_hub writers (labels, vocab_file, settings:
    `save_hf_weights`, `keras_hub_presets.save_keras_hub_preset`).
    """
    from bert_keras import keras_hub_presets  # imports keras-hub only when writing one

    savers = {"google": save_google_checkpoint, "hf": save_hf_weights, "keras": save_keras_model,
              "keras_hub": keras_hub_presets.save_keras_hub_preset}
    if fmt not in savers:
        raise ValueError(f"Unknown format {fmt!r}; expected one of {FORMATS}")
    if fmt == "google" and not isinstance(model, (BertEncoder, BertPretrainer)):
        raise ValueError(f"the google format holds encoders and pretrainers; a "
                         f"{type(model).__name__} can be saved as hf or keras")
    if fmt in ("google", "hf") and isinstance(model, BertPretrainer) and (
            not model.head_follows_encoder):
        # Their heads take the encoder's hidden_act and layer_norm_eps: another head
        # (keras-hub's, converted) would be written as another function.
        raise ValueError(f"the masked-LM head computes with {model.masked_lm.activation!r} "
                         f"and LayerNorm epsilon {model.masked_lm.layer_norm_epsilon:g}, where "
                         f"the {fmt} format's head takes the encoder's ("
                         f"{model.encoder.hidden_act!r}, {model.encoder.layer_norm_epsilon:g}); "
                         "convert its encoder with --model=encoder, or save it as keras")
    if fmt not in ("hf", "keras_hub") and kwargs:
        raise ValueError(f"{sorted(kwargs)} apply to the hf and keras_hub formats only")
    return savers[fmt](model, path, **kwargs)
