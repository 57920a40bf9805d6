r"""Exports the BERT text preprocessor: strings in, the encoder's three int32 inputs out.

    python -m export.export_preprocessor --vocab_file=runs/phase1/encoder/vocab.txt \
        --seq_length=128 --export_dir=/models/bert_preprocess [--version=1] \
        [--length_buckets=16,24,32,48,64,96,128,160,192,224,256,320,384,448,512]

The tokenizer settings are those saved beside the vocabulary (tokenizer_config.json, written
by build_vocab, run_pretraining and the fine-tuning tools); --do_lower_case,
--strip_accents and --tokenize_chinese_chars override them. The export carries them as
assets/vocab.txt and assets/tokenizer_config.json.

Signatures:
  serving_default   text: string [batch] -> input_word_ids, input_mask, input_type_ids
                    int32 [batch, seq_length] ("[CLS] text [SEP]", truncated to fit)
  pair              text_a, text_b: string [batch] -> the same, "[CLS] a [SEP] b [SEP]",
                    truncated fairly (the longer segment loses tokens first)
  bucketed          text: string [batch] -> the same three inputs cut to the batch's length
                    bucket, int32 [batch, L] (L: the smallest of --length_buckets holding
                    the longest row; `export.length_buckets`): what to feed the encoder
                    export in one graph, which takes any length
  bucketed_pair     text_a, text_b: string [batch] -> the pair inputs cut the same way
  tokenize          text: string [batch] -> token_ids int32 [batch, max_tokens] (0-padded)
                    and num_tokens int32 [batch]
  special_tokens    no input -> cls_id, sep_id, pad_id, mask_id, unk_id, vocab_size
TF Hub's preprocessor API on the loaded object (tensorflow.org/hub/common_saved_model_apis/text):
  obj(strings)                      -> the three inputs at the exported seq_length
  obj.tokenize(strings)             -> int32 RaggedTensor [batch, (words), (wordpieces)]
  obj.tokenize.get_special_tokens_dict() -> start_of_sequence_id, end_of_segment_id, ...
  obj.bert_pack_inputs([tok_a(, tok_b)], seq_length=S) -> the three inputs at length S

Only core TF ops and tensorflow-text's FastBertNormalize / FastWordpieceTokenizeWithOffsets
(both in stock TF Serving's tensorflow-text 2.12) are used; a loader must
`import tensorflow_text` before `tf.saved_model.load` (docs/DESIGN.md section 6).
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

from data_prep import files, tokenizer_config
from data_prep.tokenization import BertTokenizer
from export import length_buckets, request_checks, saved_model_writer
from export.text_preprocessing import bert_pack_inputs

_TEXT = tf.TensorSpec([None], tf.string, name="text")

# Warmup texts: empty, short, long, mixed scripts (what real traffic looks like).
WARMUP_TEXTS = [
    "",
    "Hello world!",
    "BERT pretrains deep bidirectional representations from unlabeled text. " * 20,
    "Mixed scripts: naïve café, 東京, 서울, Москва, 🙂.",
]


class HubTokenize(tf.Module):
    """`preprocessor.tokenize`, as TF Hub's BERT preprocessors have it.

    Called on a string batch it returns WordPiece ids grouped by word: int32 RaggedTensor
    [B, (words), (pieces)] (a word is a first piece and the "##" pieces after it);
    `get_special_tokens_dict()` gives the ids a packer needs.
    """

    def __init__(self, tokenizer: BertTokenizer):
        super().__init__()
        self.tokenizer = tokenizer
        self.special = {"vocab_size": tokenizer.vocab_size, "start_of_sequence_id": tokenizer.cls_id,
                        "end_of_segment_id": tokenizer.sep_id, "padding_id": tokenizer.pad_id,
                        "mask_id": tokenizer.mask_id}

    @tf.function(input_signature=[_TEXT])
    def __call__(self, text):
        pieces = tf.cast(self.tokenizer(request_checks.texts(text)), tf.int32)  # [B, (T)]
        flat = pieces.flat_values
        starts = tf.gather(self.tokenizer._piece_starts_word, flat) > 0  # [T]
        words = tf.RaggedTensor.from_row_starts(
            flat, tf.where(starts)[:, 0], validate=False)  # [W, (P)]
        per_row = tf.math.unsorted_segment_sum(tf.cast(starts, tf.int64), pieces.value_rowids(),
                                               pieces.nrows())  # [B]
        return tf.RaggedTensor.from_row_lengths(words, per_row, validate=False)  # [B, (W), (P)]

    @tf.function(input_signature=[])
    def get_special_tokens_dict(self):
        return {k: tf.constant(v, tf.int32) for k, v in self.special.items()}


class HubPackInputs(tf.Module):
    """`preprocessor.bert_pack_inputs(segments, seq_length=...)`, as TF Hub's have it.

    `segments` is a list of one or two int32 RaggedTensors, of ragged rank 1 ([B, (pieces)])
    or 2 (`tokenize`'s [B, (words), (pieces)]); `seq_length` (an int32 scalar) defaults to
    the exported one. A function is traced for each of the four input structures.
    """

    def __init__(self, cls_id: int, sep_id: int, pad_id: int, default_seq_length: int,
                 max_segments: int = 2):
        super().__init__()

        @tf.function(autograph=False)
        def pack(segments, seq_length=default_seq_length):
            segments = list(segments)
            # Two batches of other sizes failed deep inside ("Dimensions must be equal"
            # from a RaggedRange node): said here instead.
            checks = [tf.debugging.assert_equal(
                segment.nrows(), segments[0].nrows(),
                message="bert_pack_inputs: every segment must hold as many rows (texts) as "
                        "the first") for segment in segments[1:]]
            with tf.control_dependencies(checks):
                return bert_pack_inputs(segments, seq_length, cls_id, sep_id, pad_id)

        self.__call__ = pack
        for ragged_rank in (1, 2):
            spec = tf.RaggedTensorSpec([None] * (ragged_rank + 1), tf.int32)
            for count in range(1, max_segments + 1):
                pack.get_concrete_function([spec] * count)
                pack.get_concrete_function([spec] * count, tf.TensorSpec([], tf.int32))


class TextPacker(tf.Module):
    """Strings to the encoder's inputs, as every text-in export runs them: the tokenizer (its
    tables tracked, its vocabulary and settings saved as the export's assets) and the
    packing, with no serving function of its own. The task exports hold one; the
    preprocessor export's root (`PreprocessorModule`) is one with its signatures and TF Hub's
    API added. (A task export holding the whole preprocessor saved its functions, which no
    one called, and took 4-5x as long to write and 3-4x to load; BUILD_NOTES 4.5.)"""

    def __init__(self, tokenizer: BertTokenizer, seq_length: int, assets_dir: str | None = None,
                 buckets=None, pairs: bool = True, length_flag: str = "--seq_length"):
        """Args:
          tokenizer: the BertTokenizer (vocabulary and settings) to serve.
          seq_length: output length of the packed inputs.
          assets_dir: a directory that exists until the module is saved; the vocabulary and
            tokenizer_config.json are written there and saved as the export's assets.
          buckets: the lengths `encoder_inputs` rounds a batch up to
            (`length_buckets.resolve`; None: the default set).
          pairs: whether two texts are packed (a tagger packs one).
          length_flag: the flag that set `seq_length` (for the error message).
        """
        super().__init__()
        least = 5 if pairs else 3  # [CLS] and a piece of each text, each with its [SEP]
        room = "a pair" if pairs else "one text"
        if seq_length < least:
            raise saved_model_writer.ExportError(
                f"{length_flag} must be at least {least} (room for {room}). "
                f"Received: {seq_length}")
        self.tokenizer = tokenizer  # a tf.Module: its assets and tables are tracked
        self.seq_length = seq_length
        self.buckets = length_buckets.resolve(
            buckets, seq_length, least,
            f"as {length_flag}: room for {room}")
        self.cls_id, self.sep_id, self.pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
        self.mask_id, self.unk_id = tokenizer.mask_id, tokenizer.unk_id
        self.vocab_size = tokenizer.vocab_size
        if assets_dir is not None:
            # assets/vocab.txt and assets/tokenizer_config.json: what the export tokenizes with.
            vocab = files.copy_file(tokenizer.vocab_file, os.path.join(assets_dir, files.VOCAB_FILE))
            self.vocab_file = tf.saved_model.Asset(vocab)
            self.tokenizer_config_file = tf.saved_model.Asset(
                tokenizer_config.write_for_vocab(vocab, tokenizer.config))

    def _pack(self, segments):
        return bert_pack_inputs(list(segments), self.seq_length, self.cls_id, self.sep_id,
                                self.pad_id)

    def _tokenize(self, text):
        """A request's string batch (checked: `request_checks.texts`) -> int32 [B, (pieces)]."""
        return tf.cast(self.tokenizer(request_checks.texts(text)), tf.int32)

    def encoder_inputs(self, segments):
        """Text to what the encoder runs on, for the end-to-end exports.

        Args:
          segments: one or two int32 RaggedTensors [B, (pieces)] (`_tokenize`'s output).

        Returns:
          (packed, trimmed): the three int32 inputs [B, seq_length], and the same cut to
          the batch's bucket length [B, L] (`length_buckets.trim`).
        """
        packed = self._pack(segments)
        return packed, length_buckets.trim(packed, self.buckets)

    def warmup_texts(self, segments: int, first_at_most: int | None = None) -> list:
        """One request's texts per bucket (`length_buckets.warmup_texts`)."""
        return length_buckets.warmup_texts(self.tokenizer, self.buckets, segments,
                                           WARMUP_TEXTS[2], first_at_most)


class PreprocessorModule(TextPacker):
    """The preprocessor SavedModel's root object, callable TF Hub-style on a string batch."""

    def __init__(self, tokenizer: BertTokenizer, seq_length: int, assets_dir: str | None = None,
                 buckets=None, pairs: bool = True, length_flag: str = "--seq_length"):
        """Args: as `TextPacker`'s."""
        super().__init__(tokenizer, seq_length, assets_dir, buckets, pairs, length_flag)
        # TF Hub's preprocessor API: obj(texts), obj.tokenize(texts),
        # obj.bert_pack_inputs(segments, seq_length=...). The signatures below call the
        # packing code directly: a tf.function taking a list of RaggedTensors, called from
        # inside another trace, can receive a decomposed placeholder.
        self.tokenize = HubTokenize(tokenizer)
        self.bert_pack_inputs = HubPackInputs(self.cls_id, self.sep_id, self.pad_id, seq_length,
                                              2 if pairs else 1)
        if not pairs:  # nothing that packs two texts is traced or saved
            self.serve_pair = self.serve_bucketed_pair = None

    @tf.function(input_signature=[_TEXT])
    def __call__(self, text):
        """string [B] -> the encoder inputs at the exported seq_length (TF Hub's root call)."""
        return self._pack([self._tokenize(text)])

    @tf.function(input_signature=[_TEXT])
    def serve(self, text):
        return self._pack([self._tokenize(text)])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text_a"),
                                  tf.TensorSpec([None], tf.string, name="text_b")])
    def serve_pair(self, text_a, text_b):
        text_a, text_b = request_checks.text_pair(text_a, text_b, ("text_a", "text_b"))
        return self._pack([self._tokenize(text_a), self._tokenize(text_b)])

    @tf.function(input_signature=[_TEXT])
    def serve_bucketed(self, text):
        return self.encoder_inputs([self._tokenize(text)])[1]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text_a"),
                                  tf.TensorSpec([None], tf.string, name="text_b")])
    def serve_bucketed_pair(self, text_a, text_b):
        text_a, text_b = request_checks.text_pair(text_a, text_b, ("text_a", "text_b"))
        return self.encoder_inputs([self._tokenize(text_a), self._tokenize(text_b)])[1]

    @tf.function(input_signature=[_TEXT])
    def serve_tokenize(self, text):
        ids = self._tokenize(text)
        return {"token_ids": ids.to_tensor(default_value=self.pad_id),
                "num_tokens": tf.cast(ids.row_lengths(), tf.int32)}

    @tf.function(input_signature=[])
    def serve_special_tokens(self):
        ids = dict(cls_id=self.cls_id, sep_id=self.sep_id, pad_id=self.pad_id,
                   mask_id=self.mask_id, unk_id=self.unk_id, vocab_size=self.vocab_size)
        return {k: tf.constant(v, tf.int32) for k, v in ids.items()}


def preprocessor_signatures(module: PreprocessorModule) -> dict:
    """The signatures above, as concrete functions (shared with the end-to-end exports)."""
    return {
        "serving_default": module.serve.get_concrete_function(),
        "pair": module.serve_pair.get_concrete_function(),
        "bucketed": module.serve_bucketed.get_concrete_function(),
        "bucketed_pair": module.serve_bucketed_pair.get_concrete_function(),
        "tokenize": module.serve_tokenize.get_concrete_function(),
        "special_tokens": module.serve_special_tokens.get_concrete_function(),
    }


def export_preprocessor(tokenizer: BertTokenizer, export_dir: str, seq_length: int = 128,
                        version: int | None = None, buckets=None) -> str:
    """Writes the preprocessor SavedModel to `<export_dir>/<version>` and returns that path.

    `buckets`: the lengths of the bucketed signatures (`length_buckets.resolve`; None: the
    default set).
    """
    path = saved_model_writer.version_dir(export_dir, version)
    with tempfile.TemporaryDirectory() as assets:
        module = PreprocessorModule(tokenizer, seq_length, assets, buckets)
        signatures = preprocessor_signatures(module)
        texts = np.array(WARMUP_TEXTS, dtype=object)
        warmup = [
            ("serving_default", {"text": texts}),
            ("pair", {"text_a": texts, "text_b": texts[::-1].copy()}),
            ("tokenize", {"text": texts}),
        ]
        for (text,), (text_a, text_b) in zip(module.warmup_texts(1), module.warmup_texts(2)):
            warmup += [("bucketed", {"text": np.array([text], dtype=object)}),
                       ("bucketed_pair", {"text_a": np.array([text_a], dtype=object),
                                          "text_b": np.array([text_b], dtype=object)})]
        saved_model_writer.write_saved_model(module, path, signatures, warmup)
    logging.info("Wrote preprocessor export %s (tokenizer %s)", path, tokenizer.config.describe())
    return path


# --- Command line. ---

_VOCAB_FILE = flags.DEFINE_string(
    "vocab_file", None, "WordPiece vocab.txt; its tokenizer_config.json (beside it) gives the "
    "tokenizer settings.", allow_override=True)
_SEQ_LENGTH = flags.DEFINE_integer("seq_length", 128, "Output sequence length.",
                                   allow_override=True)
_DESTINATION = saved_model_writer.define_flags()  # --export_dir, --version
_LENGTH_BUCKETS = length_buckets.define_flag(length_flag="seq_length")
_TOKENIZER_FLAGS = tokenizer_config.define_flags()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from data_prep.cli import report_errors
    from data_prep.schema import VocabError

    def body() -> int:
        logging.info(keras_backend.describe(_ENVIRONMENT_BACKEND))
        buckets = length_buckets.parse_flag(_LENGTH_BUCKETS.value)
        settings, source = tokenizer_config.resolve(
            _VOCAB_FILE.value, tokenizer_config.overrides_from_flags(_TOKENIZER_FLAGS),
            warn=logging.warning)
        logging.info("Tokenizer settings: %s (%s)", settings.describe(),
                     source or "defaults and flags")
        tokenizer = BertTokenizer.from_config(_VOCAB_FILE.value, settings)
        print(export_preprocessor(tokenizer, _DESTINATION["export_dir"].value, _SEQ_LENGTH.value,
                                  _DESTINATION["version"].value, buckets))
        return 0

    return report_errors(body, (saved_model_writer.ExportError, VocabError,
                                tokenizer_config.TokenizerConfigError, FileNotFoundError),
                         "export_preprocessor")


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["vocab_file", "export_dir"])
    cli.run(main)
