"""Weights in and out: one name table between our variables, Google's and Hugging Face's.

Every BERT weight has three names:
  ours    the Keras variable path, e.g. `transformer_layer_3/self_attention/query/kernel`
  google  the TF1 checkpoint name, e.g. `bert/encoder/layer_3/attention/self/query/kernel`
  hf      the transformers name, e.g. `encoder.layer.3.attention.self.query.weight`
and a layout rule: Google stores Dense kernels as [in, out] like Keras; PyTorch's nn.Linear
stores [out, in], so HF "weight"s of dense layers are transposed. Nothing else is reshaped,
because our attention projections keep Google's [H, H] kernels.

Loading is all-or-nothing: every tensor is read, matched and shape-checked before any
variable is assigned, so a model is never left half-loaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import numpy as np
from absl import logging

from bert_keras.config import HIDDEN_ACTIVATIONS, BertConfig


@dataclasses.dataclass(frozen=True)
class WeightName:
    """One row of the name table. `{i}` in a name stands for the layer index."""

    ours: str
    google: str
    hf: str
    hf_transpose: bool = False  # True for nn.Linear weights ([out, in] in PyTorch).


# The embeddings: bert/embeddings/*.
EMBEDDING_WEIGHTS = (
    WeightName("embeddings/word_embeddings", "bert/embeddings/word_embeddings",
               "embeddings.word_embeddings.weight"),
    WeightName("embeddings/position_embeddings", "bert/embeddings/position_embeddings",
               "embeddings.position_embeddings.weight"),
    WeightName("embeddings/token_type_embeddings", "bert/embeddings/token_type_embeddings",
               "embeddings.token_type_embeddings.weight"),
    WeightName("embeddings/layer_norm/gamma", "bert/embeddings/LayerNorm/gamma",
               "embeddings.LayerNorm.weight"),
    WeightName("embeddings/layer_norm/beta", "bert/embeddings/LayerNorm/beta",
               "embeddings.LayerNorm.bias"),
)


def _dense(ours, google, hf):
    return (
        WeightName(f"{ours}/kernel", f"{google}/kernel", f"{hf}.weight", hf_transpose=True),
        WeightName(f"{ours}/bias", f"{google}/bias", f"{hf}.bias"),
    )


def _layer_norm(ours, google, hf):
    return (
        WeightName(f"{ours}/gamma", f"{google}/gamma", f"{hf}.weight"),
        WeightName(f"{ours}/beta", f"{google}/beta", f"{hf}.bias"),
    )


_L_OURS = "transformer_layer_{i}"
_L_GOOGLE = "bert/encoder/layer_{i}"
_L_HF = "encoder.layer.{i}"

# One transformer block: bert/encoder/layer_{i}/*.
LAYER_WEIGHTS = (
    *_dense(f"{_L_OURS}/self_attention/query", f"{_L_GOOGLE}/attention/self/query",
            f"{_L_HF}.attention.self.query"),
    *_dense(f"{_L_OURS}/self_attention/key", f"{_L_GOOGLE}/attention/self/key",
            f"{_L_HF}.attention.self.key"),
    *_dense(f"{_L_OURS}/self_attention/value", f"{_L_GOOGLE}/attention/self/value",
            f"{_L_HF}.attention.self.value"),
    *_dense(f"{_L_OURS}/attention_output", f"{_L_GOOGLE}/attention/output/dense",
            f"{_L_HF}.attention.output.dense"),
    *_layer_norm(f"{_L_OURS}/attention_layer_norm", f"{_L_GOOGLE}/attention/output/LayerNorm",
                 f"{_L_HF}.attention.output.LayerNorm"),
    *_dense(f"{_L_OURS}/intermediate", f"{_L_GOOGLE}/intermediate/dense",
            f"{_L_HF}.intermediate.dense"),
    *_dense(f"{_L_OURS}/output_dense", f"{_L_GOOGLE}/output/dense", f"{_L_HF}.output.dense"),
    *_layer_norm(f"{_L_OURS}/output_layer_norm", f"{_L_GOOGLE}/output/LayerNorm",
                 f"{_L_HF}.output.LayerNorm"),
)

# The [CLS] pooler: bert/pooler/dense.
POOLER_WEIGHTS = _dense("pooler_dense", "bert/pooler/dense", "pooler.dense")


def encoder_weight_names(num_layers: int) -> list[WeightName]:
    """The table rows of an encoder with `num_layers` blocks, `{i}` filled in."""
    rows = list(EMBEDDING_WEIGHTS)
    for i in range(num_layers):
        rows += [
            WeightName(w.ours.format(i=i), w.google.format(i=i), w.hf.format(i=i), w.hf_transpose)
            for w in LAYER_WEIGHTS
        ]
    rows += POOLER_WEIGHTS
    return rows


# ------------------------------------------------------------------------------------------
# Hugging Face


class WeightLoadError(ValueError):
    """Weights on disk do not fit the model; the message lists every offending tensor."""


_HF_PREFIX = "bert."  # BertForPreTraining & co. nest the encoder under `bert.`.
_HF_HEAD_PREFIXES = ("cls.",)  # Pretraining heads: not part of an encoder.

# Activations that compute the same function under different names.
_SAME_ACTIVATION = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def _hf_files(path: str) -> tuple[str, str | None]:
    """Returns (safetensors file, config.json or None) for a file or save_pretrained dir."""
    path = os.fspath(path)
    if os.path.isdir(path):
        weights = os.path.join(path, "model.safetensors")
        config = os.path.join(path, "config.json")
        if not os.path.exists(weights):
            found = sorted(os.listdir(path))
            raise FileNotFoundError(
                f"{path}: no model.safetensors (found {found}). Save the model with "
                "transformers' save_pretrained(..., safe_serialization=True)."
            )
        return weights, config if os.path.exists(config) else None
    if not os.path.exists(path):
        raise FileNotFoundError(f"Hugging Face weights not found: {path}")
    return path, None


def read_hf_config(path: str) -> BertConfig:
    """Reads a transformers BERT `config.json` (file or save_pretrained dir) as a BertConfig."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"Hugging Face config not found: {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    model_type = hf.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"{path}: model_type is {model_type!r}, expected 'bert'")
    fields = {f.name for f in dataclasses.fields(BertConfig)}
    # transformers' configs carry many generic keys (architectures, torch_dtype, ...); only
    # the BERT ones matter here, so this reader picks them instead of rejecting the rest.
    values = {k: hf[k] for k in fields if k in hf}
    if values.get("hidden_act") not in HIDDEN_ACTIVATIONS:
        raise ValueError(
            f"{path}: hidden_act={values.get('hidden_act')!r} is not supported; "
            f"expected one of {HIDDEN_ACTIVATIONS}"
        )
    return BertConfig.from_dict(values, source=path)


def _check_hf_config_fits(model, config: BertConfig, source: str) -> None:
    """Catches differences that shapes cannot show (heads, activation, epsilon)."""
    ours = model.to_bert_config()
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
        raise WeightLoadError(f"{source}: config does not fit the model:\n  " + "\n  ".join(problems))


def _assign_all(model, arrays: dict[str, np.ndarray], source: str) -> None:
    """Assigns `arrays` (ours-name -> value) to the model, checking everything first."""
    variables = {v.path: v for v in model.weights}
    missing_vars = sorted(set(arrays) - set(variables))
    if missing_vars:
        raise WeightLoadError(
            f"{source}: the model has no variable(s) {missing_vars}; is it a BertEncoder?"
        )
    mismatched = [
        f"{name}: model {tuple(variables[name].shape)}, file {tuple(value.shape)}"
        for name, value in arrays.items()
        if tuple(variables[name].shape) != tuple(value.shape)
    ]
    if mismatched:
        raise WeightLoadError(
            f"{source}: {len(mismatched)} tensor(s) have the wrong shape "
            "(does the config fit the weights?):\n  " + "\n  ".join(mismatched)
        )
    for name, value in arrays.items():
        variables[name].assign(value.astype(variables[name].dtype))


def load_hf_weights(model, path: str) -> None:
    """Loads Hugging Face BERT weights into a BertEncoder, all or nothing.

    Args:
      model: a built `BertEncoder`.
      path: a directory written by transformers' `save_pretrained` (model.safetensors and
        config.json), or a .safetensors file. Names may carry the `bert.` prefix of
        BertForPreTraining and friends; pretraining heads (`cls.*`) are skipped.

    Raises:
      FileNotFoundError: no weights at `path`.
      WeightLoadError: missing, unexpected or mis-shaped tensors (all listed by name, with
        both shapes), or a config.json that disagrees with the model.
    """
    from safetensors.numpy import load_file  # Reads safetensors without torch.

    weights_file, config_file = _hf_files(path)
    if config_file is not None:
        _check_hf_config_fits(model, read_hf_config(config_file), config_file)
    try:
        tensors = load_file(weights_file)
    except Exception as e:  # safetensors raises its own SafetensorError on bad files.
        raise WeightLoadError(f"{weights_file}: cannot read safetensors file ({e})") from None

    if tensors and all(k.startswith(_HF_PREFIX) for k in tensors if not k.startswith(_HF_HEAD_PREFIXES)):
        tensors = {k[len(_HF_PREFIX):] if k.startswith(_HF_PREFIX) else k: v for k, v in tensors.items()}
    skipped = sorted(k for k in tensors if k.startswith(_HF_HEAD_PREFIXES))
    if skipped:
        logging.info("%s: skipping %d pretraining-head tensors (%s...)", weights_file,
                     len(skipped), skipped[0])

    table = encoder_weight_names(model.num_layers)
    expected = {w.hf for w in table}
    missing = sorted(expected - set(tensors))
    unexpected = sorted(set(tensors) - expected - set(skipped))
    if missing or unexpected:
        lines = []
        if missing:
            lines.append(f"missing {len(missing)}: " + ", ".join(missing))
        if unexpected:
            lines.append(f"unexpected {len(unexpected)}: " + ", ".join(unexpected))
        raise WeightLoadError(
            f"{weights_file}: tensors do not match a {model.num_layers}-layer BERT encoder:\n  "
            + "\n  ".join(lines)
        )
    arrays = {}
    for w in table:
        value = tensors[w.hf]
        arrays[w.ours] = value.T if w.hf_transpose else value
    try:
        _assign_all(model, arrays, weights_file)
    except WeightLoadError as e:
        # Name the tensors by the file's own (HF) names, which the user can look up.
        hf_name = {w.ours: w.hf for w in table}
        message = str(e)
        for ours, hf in hf_name.items():
            message = message.replace(f"  {ours}:", f"  {hf}:")
        raise WeightLoadError(message) from None


def load_hf_encoder(path: str, **kwargs):
    """Builds a BertEncoder from a transformers save_pretrained directory and loads it.

    Args:
      path: directory with config.json and model.safetensors.
      **kwargs: passed to `BertEncoder.from_bert_config` (e.g. dtype).
    """
    from bert_keras.encoder import BertEncoder

    encoder = BertEncoder.from_bert_config(read_hf_config(path), **kwargs)
    load_hf_weights(encoder, path)
    return encoder

