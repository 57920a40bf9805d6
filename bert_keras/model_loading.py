"""Builds an encoder (or pretrainer) from whatever checkpoint a user points at.

One resolver for every entry point (export, fine-tuning, verify), so that
`--init_checkpoint` means the same thing everywhere. Accepted forms:

  a .keras file             a saved BertEncoder or BertPretrainer (model.save)
  a .weights.h5 file        encoder weights; bert_config.json beside it or given
  a directory with model.safetensors + config.json   Hugging Face save_pretrained
  a directory with encoder.weights.h5 + bert_config.json   our weights directory
                            (run_pretraining's output_dir/encoder/)
  a run_pretraining output directory (its encoder/ subdirectory is used)
  a Google TF1 checkpoint prefix (bert_model.ckpt, with .index beside it)

The vocabulary is looked for beside the checkpoint (vocab.txt) unless given.
"""

from __future__ import annotations

import dataclasses
import glob
import os

import keras

from bert_keras import checkpoints
from bert_keras.config import BertConfig
from bert_keras.encoder import BertEncoder
from bert_keras.pretrainer import BertPretrainer

ENCODER_WEIGHTS = "encoder.weights.h5"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"


@dataclasses.dataclass
class LoadedModel:
    encoder: BertEncoder
    pretrainer: BertPretrainer | None
    vocab_file: str | None


def _config_beside(path, bert_config_file):
    if bert_config_file:
        return BertConfig.from_json_file(bert_config_file)
    candidate = os.path.join(os.path.dirname(os.path.abspath(path)), CONFIG_FILE)
    if os.path.isdir(path):
        candidate = os.path.join(path, CONFIG_FILE)
    if not os.path.exists(candidate):
        raise FileNotFoundError(
            f"{path}: no {CONFIG_FILE} beside the weights; pass --bert_config_file"
        )
    return BertConfig.from_json_file(candidate)


def google_checkpoint_prefix(path: str) -> str | None:
    """The TF1 checkpoint prefix `path` names (prefix, .index file, or a directory holding
    exactly one checkpoint), or None if it names none."""
    if path.endswith(".index") and os.path.exists(path):
        return path[: -len(".index")]
    if os.path.exists(path + ".index"):
        return path
    if os.path.isdir(path):
        indexes = glob.glob(os.path.join(path, "*.index"))
        if len(indexes) == 1:
            return indexes[0][: -len(".index")]
    return None


def load_model(path: str, bert_config_file: str | None = None) -> keras.Model:
    """Returns a BertEncoder or BertPretrainer with the weights at `path` (see module doc)."""
    if not path:
        raise ValueError("no checkpoint given (--init_checkpoint is empty)")
    path = os.fspath(path)
    run_encoder = os.path.join(path, "encoder")
    if os.path.isdir(run_encoder) and os.path.exists(os.path.join(run_encoder, ENCODER_WEIGHTS)):
        path = run_encoder  # a run_pretraining output directory
    if path.endswith(".keras"):
        if not os.path.exists(path):
            raise FileNotFoundError(f"Keras model file not found: {path}")
        model = keras.models.load_model(path)
        if not isinstance(model, (BertEncoder, BertPretrainer)):
            raise ValueError(f"{path} holds a {type(model).__name__}, not a BERT encoder")
        return model
    if path.endswith(".weights.h5") or (
        os.path.isdir(path) and os.path.exists(os.path.join(path, ENCODER_WEIGHTS))
    ):
        weights = path if path.endswith(".weights.h5") else os.path.join(path, ENCODER_WEIGHTS)
        if not os.path.exists(weights):
            raise FileNotFoundError(f"weights file not found: {weights}")
        encoder = BertEncoder.from_bert_config(_config_beside(path, bert_config_file))
        try:
            encoder.load_weights(weights)
        except ValueError as e:
            raise ValueError(f"{weights}: does not fit the config: {e}") from None
        return encoder
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "model.safetensors")):
        return checkpoints.load_model("hf", path, model="auto")
    prefix = google_checkpoint_prefix(path)
    if prefix is not None:
        return checkpoints.load_model("google", prefix, model="auto", config_file=bert_config_file)
    raise FileNotFoundError(
        f"{path}: not a recognised checkpoint. Expected a .keras file, a .weights.h5 file, "
        f"a directory with {ENCODER_WEIGHTS} + {CONFIG_FILE}, a run_pretraining output "
        "directory, a Hugging Face directory with model.safetensors + config.json, or a "
        "Google checkpoint prefix (bert_model.ckpt with bert_model.ckpt.index beside it)."
    )


def load_encoder(path: str, bert_config_file: str | None = None) -> BertEncoder:
    """The encoder inside whatever `load_model` finds at `path`."""
    model = load_model(path, bert_config_file)
    return model.encoder if isinstance(model, BertPretrainer) else model


def load_for_export(path, bert_config_file=None, vocab_file=None, with_mlm=False) -> LoadedModel:
    """Encoder, optional pretrainer and vocabulary for an export."""
    model = load_model(path, bert_config_file)
    pretrainer = model if isinstance(model, BertPretrainer) else None
    if with_mlm and pretrainer is None:
        raise ValueError(f"{path}: --mlm needs a pretraining checkpoint (a saved BertPretrainer)")
    if vocab_file is None:
        base = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        vocab_file = os.path.join(base, VOCAB_FILE)
        if not os.path.exists(vocab_file):
            raise FileNotFoundError(f"no {VOCAB_FILE} beside {path}; pass --vocab_file")
    encoder = pretrainer.encoder if pretrainer is not None else model
    return LoadedModel(encoder, pretrainer if with_mlm else None, vocab_file)
