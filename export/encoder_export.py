"""Exports a BertEncoder as a SavedModel for TF Serving and TF Hub-style reuse (library;
the command line is export/export_encoder.py).

    python -m export.export_encoder --init_checkpoint=DIR_OR_FILE --vocab_file=vocab.txt \
        --export_dir=/models/bert_encoder [--version=1] [--seq_length=128]

Signatures (`serving_default` and `encoder`, the same function):
  inputs   input_word_ids, input_mask, input_type_ids: int32 [batch, seq]
  outputs  pooled_output [batch, H], sequence_output [batch, seq, H],
           encoder_outputs [batch, L, seq, H] (every layer; stacked so that a REST row
           request keeps batch as the first dimension), default = pooled_output.
With --mlm and a pretraining checkpoint, an `mlm` signature adds masked_lm_positions
[batch, P] -> mlm_logits [batch, P, V].

The saved object is also callable TF Hub-style: `obj(inputs_dict)` returns the dict with
`encoder_outputs` as a list (inference only). `assets/vocab.txt` and
`assets/bert_config.json` travel with it.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import tensorflow as tf
from absl import logging

from export import saved_model_writer

INPUT_NAMES = ("input_word_ids", "input_mask", "input_type_ids")


def _input_signature(seq_length=None):
    return {name: tf.TensorSpec([None, seq_length], tf.int32, name=name) for name in INPUT_NAMES}


class EncoderModule(tf.Module):
    """What the encoder SavedModel holds: the encoder, its vocab and config as assets."""

    def __init__(self, encoder, vocab_file, config_file, pretrainer=None):
        super().__init__()
        self.encoder = saved_model_writer.Untracked(encoder)
        self.pretrainer = saved_model_writer.Untracked(pretrainer) if pretrainer else None
        self.vocab_file = tf.saved_model.Asset(vocab_file)
        self.bert_config_file = tf.saved_model.Asset(config_file)
        if pretrainer is not None:
            # Only with a pretrainer: a function with an input signature is traced at save.
            self.mlm = tf.function(self._mlm, input_signature=[dict(
                _input_signature(),
                masked_lm_positions=tf.TensorSpec([None, None], tf.int32, name="masked_lm_positions"),
            )])

    @tf.function(input_signature=[_input_signature()])
    def serve(self, inputs):
        """The serving signature: a flat dict of tensors."""
        out = self.encoder(inputs, training=False)
        return {
            "pooled_output": out["pooled_output"],
            "default": out["pooled_output"],
            "sequence_output": out["sequence_output"],
            # [L, B, S, H] -> [B, L, S, H]
            "encoder_outputs": tf.stack(out["encoder_outputs"], axis=1),
        }

    @tf.function(input_signature=[_input_signature()])
    def __call__(self, inputs):
        """TF Hub reusable-SavedModel call, inference only: dict in, dict (with a list) out.

        Training mode is not exported: Keras' dropout keeps its random state outside the
        trackable object graph, and fine-tuning belongs in Keras (load the checkpoint).
        """
        return self.encoder(inputs, training=False)

    def _mlm(self, inputs):
        return {"mlm_logits": self.pretrainer(inputs, training=False)["mlm_logits"]}


def example_inputs(batch_size: int, seq_length: int, cls_id: int, sep_id: int, vocab_size: int):
    """A padded batch ([CLS] w ... [SEP] 0 ...) of varying lengths, for warmup and checks."""
    rng = np.random.default_rng(0)
    ids = np.zeros((batch_size, seq_length), np.int32)
    mask = np.zeros((batch_size, seq_length), np.int32)
    for row in range(batch_size):
        length = max(2, seq_length - row * max(1, seq_length // (batch_size + 1)))
        ids[row, :length] = rng.integers(1, vocab_size, size=length)
        ids[row, 0], ids[row, length - 1] = cls_id, sep_id
        mask[row, :length] = 1
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": np.zeros_like(ids)}


def special_ids(vocab_file):
    """([CLS] id, [SEP] id, vocabulary size) of a vocab.txt."""
    with open(vocab_file, encoding="utf-8") as f:
        vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
    missing = [t for t in ("[CLS]", "[SEP]") if t not in vocab]
    if missing:
        raise saved_model_writer.ExportError(f"{vocab_file}: no {missing} entry in the vocabulary")
    return vocab["[CLS]"], vocab["[SEP]"], len(vocab)


def export_encoder(
    encoder,
    export_dir: str,
    vocab_file: str,
    version: int | None = None,
    pretrainer=None,
    warmup_seq_length: int = 128,
) -> str:
    """Writes `encoder` (and optionally an `mlm` endpoint) as `<export_dir>/<version>`.

    Args:
      encoder: a BertEncoder.
      export_dir: base directory; the version is a subdirectory.
      vocab_file: the vocabulary the encoder was trained with (copied as an asset).
      version: positive int, or None for the next free version.
      pretrainer: a BertPretrainer sharing `encoder`, to add the `mlm` signature.
      warmup_seq_length: sequence length of the warmup requests (use the serving length).

    Returns:
      The written version directory.
    """
    path = saved_model_writer.version_dir(export_dir, version)
    if pretrainer is not None and pretrainer.encoder is not encoder:
        raise saved_model_writer.ExportError("pretrainer must wrap the exported encoder")
    cls_id, sep_id, vocab_size = special_ids(vocab_file)
    if vocab_size != encoder.vocab_size:
        raise saved_model_writer.ExportError(
            f"{vocab_file} has {vocab_size} entries but the encoder's vocab_size is "
            f"{encoder.vocab_size}: wrong vocabulary for this checkpoint?"
        )
    seq_length = min(warmup_seq_length, encoder.max_sequence_length)
    with tempfile.TemporaryDirectory() as tmp:
        config_file = os.path.join(tmp, "bert_config.json")
        encoder.to_bert_config().to_json_file(config_file)
        module = EncoderModule(encoder, vocab_file, config_file, pretrainer)
        serve = module.serve.get_concrete_function()
        signatures = {"serving_default": serve, "encoder": serve}
        warmup = []
        for batch in (1, 8):
            inputs = example_inputs(batch, seq_length, cls_id, sep_id, vocab_size)
            warmup.append(("serving_default", inputs))
        if pretrainer is not None:
            signatures["mlm"] = module.mlm.get_concrete_function()
            inputs = example_inputs(2, seq_length, cls_id, sep_id, vocab_size)
            inputs["masked_lm_positions"] = np.tile(np.arange(1, 3, dtype=np.int32), (2, 1))
            warmup.append(("mlm", inputs))
        saved_model_writer.write_saved_model(module, path, signatures, warmup)
    logging.info("Wrote encoder export %s", path)
    return path
