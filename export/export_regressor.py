r"""Exports a fine-tuned regressor as an end-to-end SavedModel: text in, a number out.

    python -m export.export_regressor --model_dir=out/stsb \
        --export_dir=/models/stsb [--version=1] [--max_seq_length=128] [--pair] \
        [--length_buckets=...] [--serving_dtype=bfloat16]

--model_dir is what `python -m bert_keras.run_regressor --do_train` wrote (model.keras,
vocab.txt, tokenizer_config.json), or `convert_checkpoint --to=keras` made from
transformers' BertForSequenceClassification with num_labels=1 (STS-B's head).

Signatures:
  serving_default  text: string [batch] -> score float32 [batch]
  pair             text_a, text_b: string [batch] -> the same, for sentence pairs (STS-B)
  serve_examples   inputs: serialized tf.Example string [batch] (features "text" and, for
                   pair models, "text_b") -> outputs float32 [batch]; its method name is
                   tensorflow/serving/regress, so TF Serving's Regress API (gRPC Regress,
                   REST :regress) accepts it.

Tokenization, packing, length buckets and --serving_dtype are the classifier export's
(`export_classifier.PooledHeadModule`): one text path.
"""

from __future__ import annotations

import tempfile

from export import keras_backend

# Run as a program: Keras on TensorFlow whatever KERAS_BACKEND says (before TF imports it).
_ENVIRONMENT_BACKEND = keras_backend.use_tensorflow() if __name__ == "__main__" else None

from data_prep import tf_logging

tf = tf_logging.import_tensorflow()  # without TensorFlow's C++ start-up notices
from absl import logging

from data_prep import tokenizer_config
from export import saved_model_writer, task_export
from export.export_classifier import PooledHeadModule, write_pooled_head_export
from export.export_preprocessor import TextPacker

REGRESS_METHOD = "tensorflow/serving/regress"


class RegressorModule(PooledHeadModule):
    """Preprocessor + fine-tuned BertRegressor."""

    def _predict(self, inputs):
        return {"score": self.model(inputs, training=False)["score"]}  # [B]

    def _examples_outputs(self, out, batch):
        return {"outputs": out["score"]}  # TF Serving's Regress API reads `outputs`


def export_regressor(regressor, tokenizer, export_dir: str, seq_length: int = 128,
                     pair: bool = False, version: int | None = None, buckets=None,
                     serving_dtype: str = "float32", kernel_layout: str = "in_out") -> str:
    """Writes the end-to-end regressor to `<export_dir>/<version>`; returns that path.

    Args:
      regressor: a fine-tuned `bert_keras.tasks.BertRegressor`.
      tokenizer: the `data_prep.tokenization.BertTokenizer` it was fine-tuned with.
      seq_length, pair, version, buckets, serving_dtype, kernel_layout: as
        `export_classifier`'s.
    """
    from bert_keras import tasks

    if seq_length > regressor.encoder.max_sequence_length:
        raise saved_model_writer.ExportError(
            f"--max_seq_length={seq_length} exceeds the encoder's position table "
            f"({regressor.encoder.max_sequence_length} positions)")
    path = saved_model_writer.version_dir(export_dir, version)
    regressor = tasks.for_serving(regressor, serving_dtype, kernel_layout)
    with tempfile.TemporaryDirectory() as assets:
        pre = TextPacker(tokenizer, seq_length, assets, buckets, length_flag="--max_seq_length")
        write_pooled_head_export(RegressorModule(pre, regressor, pair), path, REGRESS_METHOD)
    logging.info("Wrote regressor export %s (tokenizer %s)", path, tokenizer.config.describe())
    return path


# --- Command line. ---

_FLAGS = task_export.define_flags(
    "A fine-tuned regressor: run_regressor's --output_dir (model.keras, vocab.txt, "
    "tokenizer_config.json).", 128, "Sequence length the regressor was fine-tuned with.")
_PAIR = task_export.define_pair_flag("scores")
_TOKENIZER_FLAGS = tokenizer_config.define_flags()


def main(argv):
    def export(model, tokenizer, labels, export_dir, seq_length, version, buckets,
               serving_dtype, kernel_layout, recorded):
        pair = task_export.given_or_recorded(_PAIR, recorded, "text_pair", "Sentence pairs")
        return export_regressor(model, tokenizer, export_dir, seq_length, pair=pair,
                                version=version, buckets=buckets, serving_dtype=serving_dtype,
                                kernel_layout=kernel_layout)

    return task_export.run(argv, _FLAGS, _TOKENIZER_FLAGS, "BertRegressor", "run_regressor",
                           export, "export_regressor", needs_labels=False,
                           environment_backend=_ENVIRONMENT_BACKEND, recorded_flags=(_PAIR,))


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["model_dir", "export_dir"])
    cli.run(main)
