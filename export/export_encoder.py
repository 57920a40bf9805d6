r"""Exports a BertEncoder as a SavedModel for TF Serving and TF Hub-style reuse.

    python -m export.export_encoder --init_checkpoint=runs/phase1 \
        --export_dir=/models/bert_encoder [--version=1] [--seq_length=128] [--mlm] \
        [--length_buckets=16,24,32,48,64,96,128,160,192,224,256,320,384,448,512]

Signatures (`serving_default` and `encoder`, the same function):
  inputs   input_word_ids, input_mask, input_type_ids: int32 [batch, seq], any seq up to
           the position table (max_position_embeddings); the encoder runs the length given
  outputs  pooled_output [batch, H], sequence_output [batch, seq, H],
           encoder_outputs [batch, L, seq, H] (every layer; stacked so that a REST row
           request keeps batch as the first dimension), default = pooled_output.
With --mlm and a pretraining checkpoint, an `mlm` signature adds masked_lm_positions
[batch, P] -> mlm_logits [batch, P, V], and `obj.mlm` is TF Hub's reusable sub-object for
masked-LM fine-tuning (`MlmModule`).

The saved object is also a TF Hub reusable SavedModel, fine-tunable as TF Hub's BERT
encoders are: `obj(inputs_dict, training=False)` returns the dict with `encoder_outputs` as a
list, and with `training=True` applies BERT's dropout (a fresh mask each call);
`obj.trainable_variables`, `obj.variables` and `obj.regularization_losses` (empty) are what
`hub.KerasLayer(path, trainable=True)` trains; its inputs are checked as the signatures'
are (a bad id is an InvalidArgumentError, not a silent wrong answer); `obj.call_training(inputs_dict)` is the
training call as the standalone endpoint Keras 3's `keras.layers.TFSMLayer(path,
call_endpoint="__call__", call_training_endpoint="call_training")` takes. `assets/vocab.txt`,
`assets/tokenizer_config.json` and `assets/bert_config.json` travel with it
(docs/DESIGN.md section 6).
"""

from __future__ import annotations

import os
import tempfile

from export import keras_backend

# Run as a program: Keras on TensorFlow whatever KERAS_BACKEND says (before TF imports it).
_ENVIRONMENT_BACKEND = keras_backend.use_tensorflow() if __name__ == "__main__" else None

import numpy as np

from data_prep import tf_logging

tf = tf_logging.import_tensorflow()  # without TensorFlow's C++ start-up notices
from absl import app, flags, logging

from data_prep import files, schema, tokenizer_config
from data_prep.tokenizer_config import TokenizerConfig
from export import length_buckets, request_checks, saved_model_writer

INPUT_NAMES = schema.MODEL_INPUT_NAMES


def _input_signature(seq_length=None):
    return {name: tf.TensorSpec([None, seq_length], tf.int32, name=name) for name in INPUT_NAMES}


class EncoderModule(tf.train.Checkpoint):
    """What the encoder SavedModel holds: the encoder, its vocab and config as assets, and
    TF Hub's reusable-SavedModel attributes (a `tf.train.Checkpoint` rather than a
    `tf.Module`, whose `variables` and `trainable_variables` are read-only properties that
    are not saved)."""

    def __init__(self, encoder, vocab_file, config_file, pretrainer=None,
                 tokenizer_config_file=None):
        super().__init__()
        self.encoder = saved_model_writer.Untracked(encoder)
        # What a request's ids must fit (request_checks.encoder_inputs).
        self.limits = dict(max_positions=int(encoder.max_sequence_length),
                           vocab_size=int(encoder.vocab_size),
                           type_vocab_size=int(encoder.type_vocab_size))
        self.pretrainer = saved_model_writer.Untracked(pretrainer) if pretrainer else None
        self.vocab_file = tf.saved_model.Asset(vocab_file)
        self.bert_config_file = tf.saved_model.Asset(config_file)
        if tokenizer_config_file is not None:
            self.tokenizer_config_file = tf.saved_model.Asset(tokenizer_config_file)
            # Google's and TF Hub's BERT tutorials build their tokenizer from
            # `vocab_file.asset_path` and `do_lower_case.numpy()`.
            settings, _ = tokenizer_config.read_file(tokenizer_config_file)
            self.do_lower_case = tf.Variable(settings.do_lower_case, trainable=False,
                                             name="do_lower_case")
            if settings.effective() != (settings.do_lower_case, settings.do_lower_case, True):
                # tensorflow_text.BertTokenizer(vocab, lower_case=do_lower_case) strips
                # accents exactly when it lowercases, and splits CJK ideographs.
                logging.warning(
                    "The tokenizer settings (%s) are not what a tokenizer built from the "
                    "export's vocab_file and do_lower_case alone applies, as TF Hub's BERT "
                    "tutorials build one (tensorflow_text.BertTokenizer(vocab, "
                    "lower_case=do_lower_case)); tokenize with the text preprocessor export "
                    "(export.export_preprocessor) or by assets/tokenizer_config.json",
                    settings.describe())
        if pretrainer is not None:
            # Only with a pretrainer: a function with an input signature is traced at save.
            self.serve_mlm = tf.function(self._serve_mlm, input_signature=[_mlm_signature()])
            self.mlm = MlmModule(encoder, pretrainer, self.limits)

    @tf.function(input_signature=[_input_signature()])
    def serve(self, inputs):
        """The serving signature: a flat dict of tensors."""
        inputs = request_checks.encoder_inputs(inputs, **self.limits)
        out = self.encoder(inputs, training=False)
        return {
            "pooled_output": out["pooled_output"],
            "default": out["pooled_output"],
            "sequence_output": out["sequence_output"],
            # [L, B, S, H] -> [B, L, S, H]
            "encoder_outputs": tf.stack(out["encoder_outputs"], axis=1),
        }

    @tf.function
    def __call__(self, inputs, training=False):
        """TF Hub reusable-SavedModel call: dict in, dict (with a list) out, `default` being
        the pooled output as in TF Hub's text-embedding API. `training` (a Python bool;
        both are traced by `trace_reusable_api`) applies the encoder's dropout, drawn from
        the dropout layers' seed states, which are saved among `variables`. The inputs are
        checked as the signatures check them (`request_checks.encoder_inputs`; XLA, which
        has no assertions, compiles the checks away)."""
        out = self.encoder(request_checks.encoder_inputs(inputs, **self.limits),
                           training=training)
        return {**out, "default": out["pooled_output"]}

    @tf.function
    def call_training(self, inputs):
        """`__call__(inputs, training=True)` as an endpoint of its own (Keras' TFSMLayer
        takes a training call by name, without arguments)."""
        return self.__call__(inputs, training=True)

    def trace_reusable_api(self):
        """Traces `__call__` in both modes and `call_training`, and sets TF Hub's reusable
        SavedModel attributes from the variables they read: `variables` (the weights and
        the dropout seed states), `trainable_variables` (the weights) and
        `regularization_losses` (none: BERT uses weight decay in the optimizer)."""
        functions = [self.__call__.get_concrete_function(_input_signature(), training=mode)
                     for mode in (False, True)]
        functions.append(self.call_training.get_concrete_function(_input_signature()))
        _set_reusable_attributes(self, functions, self.encoder.model)
        if self.pretrainer is not None:
            self.mlm.trace_reusable_api()

    def _serve_mlm(self, inputs):
        """The `mlm` signature: the pretrainer, which runs its last layer at the masked
        positions only."""
        inputs = _checked_mlm_inputs(inputs, self.limits)
        return {"mlm_logits": self.pretrainer(inputs, training=False)["mlm_logits"]}


def _mlm_signature():
    return dict(_input_signature(), masked_lm_positions=tf.TensorSpec(
        [None, None], tf.int32, name="masked_lm_positions"))


def _checked_mlm_inputs(inputs: dict, limits: dict) -> dict:
    inputs = request_checks.encoder_inputs(inputs, **limits)
    inputs["masked_lm_positions"] = request_checks.positions(
        inputs["masked_lm_positions"], inputs[schema.INPUT_WORD_IDS], "masked_lm_positions")
    return inputs


def _set_reusable_attributes(module, functions, model) -> None:
    """TF Hub's reusable-SavedModel attributes of `module`, from the variables `functions`
    read: `variables` (the weights and the dropout seed states), `trainable_variables` (the
    weights) and `regularization_losses` (none: BERT uses weight decay in the optimizer)."""
    variables = saved_model_writer.captured_variables(functions)
    # The model's own weight order (tracing order varies between exports): weights saved
    # from one export's variables load into another's.
    rank = {id(w.value): i for i, w in enumerate(model.weights)}
    variables.sort(key=lambda v: rank.get(id(v), len(rank)))
    module.variables = variables
    module.trainable_variables = [v for v in variables if v.trainable]
    module.regularization_losses = []


class MlmModule(tf.train.Checkpoint):
    """The encoder export's `mlm` sub-object, as TF Hub's BERT encoders have it (TF Model
    Garden's export_tfhub_lib, `with_mlm`): `obj.mlm(inputs, training=False)` takes the
    encoder's inputs and `masked_lm_positions` [batch, P] and returns the encoder's outputs
    (`encoder_outputs` a list) with `mlm_logits` [batch, P, V]; `training=True` applies
    BERT's dropout; `variables`, `trainable_variables` (the encoder's and the masked-LM
    head's) and `regularization_losses` are what `hub.KerasLayer(obj.mlm, trainable=True)`
    trains, for masked-LM fine-tuning (domain adaptation)."""

    def __init__(self, encoder, pretrainer, limits: dict):
        super().__init__()
        self.encoder = saved_model_writer.Untracked(encoder)
        self.pretrainer = saved_model_writer.Untracked(pretrainer)
        self.limits = dict(limits)

    @tf.function
    def __call__(self, inputs, training=False):
        inputs = _checked_mlm_inputs(inputs, self.limits)
        out = self.encoder({name: inputs[name] for name in INPUT_NAMES}, training=training)
        # The masked-LM head on the sequence output at the positions: the pretrainer's
        # mlm_logits (which it computes from its last layer at those rows only).
        at_positions = tf.gather(out["sequence_output"], inputs["masked_lm_positions"],
                                 batch_dims=1)
        logits = self.pretrainer.model.masked_lm(at_positions, training=training)
        return {**out, "default": out["pooled_output"], "mlm_logits": logits}

    def trace_reusable_api(self):
        functions = [self.__call__.get_concrete_function(_mlm_signature(), training=mode)
                     for mode in (False, True)]
        _set_reusable_attributes(self, functions, self.pretrainer.model)


def warmup_lengths(buckets, seq_length: int) -> tuple[int, ...]:
    """The warmup requests' lengths (`length_buckets.resolve`): each holds [CLS] and [SEP]."""
    return length_buckets.resolve(buckets, seq_length, 2, "a request's [CLS] and [SEP]")


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
    return dict(zip(schema.MODEL_INPUT_NAMES, (ids, mask, np.zeros_like(ids))))


def special_ids(vocab_file):
    """([CLS] id, [SEP] id, vocabulary size) of a vocab.txt (checked by schema.load_vocab)."""
    vocab = schema.load_vocab(vocab_file)
    ids = schema.special_token_ids(vocab)
    return ids[schema.CLS], ids[schema.SEP], len(vocab)


def export_encoder(
    encoder,
    export_dir: str,
    vocab_file: str,
    version: int | None = None,
    pretrainer=None,
    warmup_seq_length: int = 128,
    settings: TokenizerConfig | None = None,
    buckets=None,
) -> str:
    """Writes `encoder` (and optionally an `mlm` endpoint) as `<export_dir>/<version>`.

    Args:
      encoder: a BertEncoder.
      export_dir: base directory; the version is a subdirectory.
      vocab_file: the vocabulary the encoder was trained with (copied as an asset).
      version: positive int, or None for the next free version.
      pretrainer: a BertPretrainer sharing `encoder`, to add the `mlm` signature.
      warmup_seq_length: sequence length of the warmup requests (use the serving length);
        at most the encoder's max_sequence_length.
      settings: the tokenizer settings of the vocabulary (saved as
        assets/tokenizer_config.json); default: those saved beside `vocab_file`.
      buckets: more warmup lengths, capped by warmup_seq_length (`length_buckets.resolve`;
        None: the default set): the lengths clients that trim their ids send.

    Returns:
      The written version directory.
    """
    path = saved_model_writer.version_dir(export_dir, version)
    if pretrainer is not None and pretrainer.encoder is not encoder:
        raise saved_model_writer.ExportError("pretrainer must wrap the exported encoder")
    if pretrainer is not None and not pretrainer.head_follows_encoder:
        # assets/bert_config.json records the encoder's settings alone: read back (the
        # loader's tf_hub form), the head would compute with those, another function.
        raise saved_model_writer.ExportError(
            f"--mlm: the masked-LM head computes with {pretrainer.masked_lm.activation!r} and "
            f"LayerNorm epsilon {pretrainer.masked_lm.layer_norm_epsilon:g} (keras-hub's), "
            "which the export's assets/bert_config.json cannot record (read back, it would "
            f"compute with the encoder's {encoder.hidden_act!r}, {encoder.layer_norm_epsilon:g}"
            "); export the encoder without --mlm")
    from bert_keras.model_loading import check_vocab_fits

    check_vocab_fits(encoder, vocab_file)  # the CLI checked it already, naming the checkpoint
    cls_id, sep_id, vocab_size = special_ids(vocab_file)
    if warmup_seq_length > encoder.max_sequence_length:
        raise saved_model_writer.ExportError(
            f"--seq_length={warmup_seq_length} exceeds the encoder's position table "
            f"({encoder.max_sequence_length} positions): requests that long would fail")
    if warmup_seq_length < 2:
        raise saved_model_writer.ExportError(
            f"--seq_length={warmup_seq_length}: the warmup requests need at least 2 positions "
            "([CLS] and [SEP])")
    seq_length = warmup_seq_length
    lengths = warmup_lengths(buckets, seq_length)
    if settings is None:
        settings = tokenizer_config.resolve(vocab_file)[0]
    with tempfile.TemporaryDirectory() as tmp:
        config_file = os.path.join(tmp, files.BERT_CONFIG_FILE)
        encoder.to_bert_config().to_json_file(config_file)
        vocab_copy = files.copy_file(vocab_file, os.path.join(tmp, files.VOCAB_FILE))
        settings_file = tokenizer_config.write_for_vocab(vocab_copy, settings)
        module = EncoderModule(encoder, vocab_copy, config_file, pretrainer, settings_file)
        module.trace_reusable_api()
        serve = module.serve.get_concrete_function()
        signatures = {"serving_default": serve, "encoder": serve}
        warmup = []
        for batch in (1, 8):
            inputs = example_inputs(batch, seq_length, cls_id, sep_id, vocab_size)
            warmup.append(("serving_default", inputs))
        for length in lengths[:-1]:
            inputs = example_inputs(1, length, cls_id, sep_id, vocab_size)
            warmup.append(("serving_default", inputs))
        if pretrainer is not None:
            signatures["mlm"] = module.serve_mlm.get_concrete_function()
            inputs = example_inputs(2, seq_length, cls_id, sep_id, vocab_size)
            inputs["masked_lm_positions"] = np.tile(np.arange(1, 3, dtype=np.int32), (2, 1))
            warmup.append(("mlm", inputs))
        saved_model_writer.write_saved_model(module, path, signatures, warmup)
    logging.info("Wrote encoder export %s", path)
    return path


# --- Command line. ---

_INIT_CHECKPOINT = flags.DEFINE_string(
    "init_checkpoint", None,
    "Encoder weights: any form model_loading accepts (a run_pretraining output directory, an "
    "encoder directory, a Hugging Face save_pretrained directory, a Google checkpoint prefix, "
    "a .keras or .weights.h5 file).", allow_override=True)
_BERT_CONFIG_FILE = flags.DEFINE_string(
    "bert_config_file", None, "bert_config.json, when the checkpoint does not carry its own.",
    allow_override=True)
_VOCAB_FILE = flags.DEFINE_string(
    "vocab_file", None, "vocab.txt; defaults to the one saved with the checkpoint.",
    allow_override=True)
_DESTINATION = saved_model_writer.define_flags()  # --export_dir, --version
_MLM = flags.DEFINE_boolean(
    "mlm", False, "Also export an `mlm` signature (needs a pretraining checkpoint).",
    allow_override=True)
_SEQ_LENGTH = flags.DEFINE_integer(
    "seq_length", 128, "Sequence length of the warmup requests (your serving length).",
    allow_override=True)
_LENGTH_BUCKETS = length_buckets.define_flag(length_flag="seq_length")
_TOKENIZER_FLAGS = tokenizer_config.define_flags()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from bert_keras import backends, checkpoints, model_loading
    from bert_keras.pretrainer import BertPretrainer
    from data_prep.cli import report_errors

    def body() -> int:
        backends.check_backend(backends.EXPORT_BACKENDS)
        logging.info(keras_backend.describe(_ENVIRONMENT_BACKEND))
        # An existing version is refused before the model is loaded (seconds to minutes).
        export_dir, version = _DESTINATION["export_dir"].value, _DESTINATION["version"].value
        buckets = length_buckets.parse_flag(_LENGTH_BUCKETS.value)
        warmup_lengths(buckets, _SEQ_LENGTH.value)
        saved_model_writer.version_dir(export_dir, version)
        ckpt = model_loading.load_checkpoint(_INIT_CHECKPOINT.value, _BERT_CONFIG_FILE.value,
                                             want="pretrainer" if _MLM.value else "auto")
        vocab_file = ckpt.vocabulary(_VOCAB_FILE.value)
        saved = tokenizer_config.read_for_vocab(vocab_file) or ckpt.saved_tokenizer
        settings, source = tokenizer_config.resolve(
            vocab_file, tokenizer_config.overrides_from_flags(_TOKENIZER_FLAGS), saved,
            warn=logging.warning)
        pretrainer = ckpt.model if isinstance(ckpt.model, BertPretrainer) and _MLM.value else None
        print(export_encoder(ckpt.encoder, export_dir, vocab_file, version=version,
                             pretrainer=pretrainer, warmup_seq_length=_SEQ_LENGTH.value,
                             settings=settings, buckets=buckets))
        return 0

    return report_errors(body, (saved_model_writer.ExportError, model_loading.CheckpointError,
                                checkpoints.WeightLoadError, schema.VocabError,
                                tokenizer_config.TokenizerConfigError, FileNotFoundError),
                         "export_encoder")


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["init_checkpoint", "export_dir"])
    cli.run(main)
