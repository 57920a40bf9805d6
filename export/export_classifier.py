r"""Exports a fine-tuned classifier as an end-to-end SavedModel: text in, labels out.

    python -m export.export_classifier --model_dir=runs/spam \
        --export_dir=/models/spam [--version=1] [--max_seq_length=128] [--pair] \
        [--length_buckets=16,24,32,48,64,96,128,160,192,224,256,320,384,448,512] \
        [--serving_dtype=bfloat16]

--model_dir is what `python -m bert_keras.run_classifier --do_train` wrote: model.keras,
labels.txt, vocab.txt and tokenizer_config.json (the tokenizer settings the classifier was
fine-tuned with; --do_lower_case / --strip_accents / --tokenize_chinese_chars override).

Signatures:
  serving_default  text: string [batch] -> probabilities float32 [batch, C],
                   label string [batch], label_id int32 [batch], logits float32 [batch, C]
  pair             text_a, text_b: string [batch] -> the same, for sentence-pair tasks
                   (not for a model with one segment embedding, type_vocab_size 1)
  serve_examples   inputs: serialized tf.Example string [batch] (features "text" and, for
                   pair models, "text_b") -> classes string [batch, C], scores float32
                   [batch, C]; its method name is tensorflow/serving/classify, so TF
                   Serving's Classify API (gRPC Classify, REST :classify) accepts it.

Tokenization and packing run inside the graph with the same code as the preprocessor
export (`export_preprocessor.TextPacker`), so there is one text path. The encoder
runs on the batch's real length rounded up to one of --length_buckets
(`export.length_buckets`); the outputs are those of the full --max_seq_length run.
--serving_dtype=bfloat16 stores the weights and runs the matmuls in bfloat16
(docs/serving.md: faster on CPUs with AMX, outputs within bfloat16 rounding).
"""

from __future__ import annotations

import tempfile

from export import keras_backend

# Run as a program: Keras on TensorFlow whatever KERAS_BACKEND says (before TF imports it).
_ENVIRONMENT_BACKEND = keras_backend.use_tensorflow() if __name__ == "__main__" else None

import numpy as np

from data_prep import tf_logging

tf = tf_logging.import_tensorflow()  # without TensorFlow's C++ start-up notices
from absl import logging

from data_prep import tokenizer_config
from export import request_checks, saved_model_writer, task_export
from export.export_preprocessor import WARMUP_TEXTS, TextPacker

CLASSIFY_METHOD = "tensorflow/serving/classify"


class PooledHeadModule(tf.Module):
    """Root object of a text-in export of a model with a head on the pooled [CLS] vector:
    preprocessor + fine-tuned model; the signatures below, `_predict` (the model's outputs
    -> the serving outputs) and `_examples_outputs` (those -> serve_examples') by task."""

    def __init__(self, preprocessor: TextPacker, model, pair: bool):
        super().__init__()
        refusal = model.encoder.pair_refusal("--pair")
        self.reads_pairs = refusal is None
        if pair and refusal:
            raise saved_model_writer.ExportError(refusal)
        if not self.reads_pairs:  # nothing that reads two texts is traced or saved
            self.serve_pair = None
        self.preprocessor = preprocessor
        self.model = saved_model_writer.Untracked(model)
        self.pair = pair

    def _predict(self, inputs):
        raise NotImplementedError

    def _examples_outputs(self, out, batch):
        raise NotImplementedError

    def _run(self, texts):
        """texts: one or two string [B] tensors -> the prediction dict."""
        pre = self.preprocessor
        _, inputs = pre.encoder_inputs([pre._tokenize(t) for t in texts])
        return self._predict(inputs)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text):
        return self._run([text])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text_a"),
                                  tf.TensorSpec([None], tf.string, name="text_b")])
    def serve_pair(self, text_a, text_b):
        return self._run(request_checks.text_pair(text_a, text_b, ("text_a", "text_b")))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def serve_examples(self, inputs):
        spec = {"text": tf.io.FixedLenFeature([], tf.string)}
        if self.pair:
            spec["text_b"] = tf.io.FixedLenFeature([], tf.string)
        inputs = request_checks.batch(inputs)  # everything below reads the checked batch
        features = tf.io.parse_example(inputs, spec)
        texts = [request_checks.texts(features[name])
                 for name in (("text", "text_b") if self.pair else ("text",))]
        return self._examples_outputs(self._run(texts), tf.shape(inputs)[0])


class ClassifierModule(PooledHeadModule):
    """Preprocessor + fine-tuned BertClassifier + label names."""

    def __init__(self, preprocessor: TextPacker, classifier, labels, pair: bool):
        if len(labels) != classifier.num_classes:
            raise saved_model_writer.ExportError(
                f"{len(labels)} labels for a classifier with {classifier.num_classes} classes")
        super().__init__(preprocessor, classifier, pair)
        self.labels = tf.constant(list(labels), tf.string)

    def _predict(self, inputs):
        logits = self.model(inputs, training=False)["logits"]  # [B, C]
        probabilities = tf.nn.softmax(logits, axis=-1)
        label_id = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {
            "probabilities": probabilities,
            "label": tf.gather(self.labels, label_id),
            "label_id": label_id,
            "logits": logits,
        }

    def _examples_outputs(self, out, batch):
        return {
            "classes": tf.tile(self.labels[None, :], [batch, 1]),
            "scores": out["probabilities"],
        }


def _example(text, text_b=None) -> bytes:
    feature = {"text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))}
    if text_b is not None:
        feature["text_b"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[text_b.encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def export_classifier(classifier, tokenizer, labels, export_dir: str, seq_length: int = 128,
                      pair: bool = False, version: int | None = None,
                      buckets=None, serving_dtype: str = "float32",
                      kernel_layout: str = "in_out") -> str:
    """Writes the end-to-end classifier to `<export_dir>/<version>`; returns that path.

    Args:
      classifier: a fine-tuned `bert_keras.tasks.BertClassifier`.
      tokenizer: the `data_prep.tokenization.BertTokenizer` it was fine-tuned with.
      labels: label names, index i = class i.
      seq_length: the fine-tuning max_seq_length.
      pair: whether the task classifies sentence pairs (decides what serve_examples parses).
      buckets: the encoder's lengths (`length_buckets.resolve`; None: the default set).
      serving_dtype: what the export computes in (`bert_keras.tasks.SERVING_DTYPES`); the
        exported model is `bert_keras.tasks.for_serving(model, serving_dtype,
        kernel_layout)`.
      kernel_layout: how the export stores its encoder's Dense kernels
        (`tasks.KERNEL_LAYOUTS`, `bert_keras.tasks.for_serving`).
    """
    from bert_keras import tasks

    if seq_length > classifier.encoder.max_sequence_length:
        raise saved_model_writer.ExportError(
            f"--max_seq_length={seq_length} exceeds the encoder's position table "
            f"({classifier.encoder.max_sequence_length} positions)")
    path = saved_model_writer.version_dir(export_dir, version)
    classifier = tasks.for_serving(classifier, serving_dtype, kernel_layout)
    with tempfile.TemporaryDirectory() as assets:
        pre = TextPacker(tokenizer, seq_length, assets, buckets, length_flag="--max_seq_length")
        write_pooled_head_export(ClassifierModule(pre, classifier, labels, pair), path,
                                 CLASSIFY_METHOD)
    logging.info("Wrote classifier export %s (tokenizer %s)", path, tokenizer.config.describe())
    return path


def write_pooled_head_export(module: PooledHeadModule, path: str, method: str) -> str:
    """Writes `module`'s signatures (serving_default, serve_examples under `method`, pair
    where the model reads pairs) with their warmup requests into the version `path`."""
    pre, pair, pairs = module.preprocessor, module.pair, module.reads_pairs
    signatures = {
        "serving_default": module.serve.get_concrete_function(),
        "serve_examples": module.serve_examples.get_concrete_function(),
    }
    if pairs:  # no "pair" signature for a model that cannot read pairs
        signatures["pair"] = module.serve_pair.get_concrete_function()
    texts = np.array(WARMUP_TEXTS, dtype=object)
    examples = [_example(t, t if pair else None) for t in WARMUP_TEXTS]
    warmup = [
        ("serving_default", {"text": texts[:1]}),
        ("serving_default", {"text": texts}),
        ("serve_examples", {"inputs": np.array(examples, dtype=object)}),
    ] + ([("pair", {"text_a": texts, "text_b": texts[::-1].copy()})] if pairs else [])
    for (text,), (text_a, text_b) in zip(pre.warmup_texts(1), pre.warmup_texts(2)):
        warmup += [
            ("serving_default", {"text": np.array([text], dtype=object)}),
            ("serve_examples", {"inputs": np.array(
                [_example(text_a, text_b) if pair else _example(text)], dtype=object)}),
        ] + ([("pair", {"text_a": np.array([text_a], dtype=object),
                        "text_b": np.array([text_b], dtype=object)})] if pairs else [])
    return task_export.write_text_in_export(module, path, signatures, warmup, pre.buckets,
                                            method_names={"serve_examples": method})


# --- Command line. ---

_FLAGS = task_export.define_flags(
    "A fine-tuned classifier: run_classifier's --output_dir (model.keras, labels.txt, "
    "vocab.txt, tokenizer_config.json).", 128,
    "Sequence length the classifier was fine-tuned with.")
_PAIR = task_export.define_pair_flag("classifies")
_TOKENIZER_FLAGS = tokenizer_config.define_flags()


def main(argv):
    def export(model, tokenizer, labels, export_dir, seq_length, version, buckets,
               serving_dtype, kernel_layout, recorded):
        pair = task_export.given_or_recorded(_PAIR, recorded, "text_pair", "Sentence pairs")
        return export_classifier(model, tokenizer, labels, export_dir, seq_length,
                                 pair=pair, version=version, buckets=buckets,
                                 serving_dtype=serving_dtype, kernel_layout=kernel_layout)

    return task_export.run(argv, _FLAGS, _TOKENIZER_FLAGS, "BertClassifier", "run_classifier",
                           export, "export_classifier", environment_backend=_ENVIRONMENT_BACKEND,
                           recorded_flags=(_PAIR,))


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["model_dir", "export_dir"])
    cli.run(main)
