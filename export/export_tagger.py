r"""Exports a fine-tuned token tagger as an end-to-end SavedModel: words in, one tag per word out.

    python -m export.export_tagger --model_dir=runs/ner \
        --export_dir=/models/ner [--version=1] [--max_seq_length=128] \
        [--length_buckets=16,24,32,48,64,96,128,160,192,224,256,320,384,448,512] \
        [--serving_dtype=bfloat16] [--doc_stride=63] [--tag_format=klue]

--model_dir is what `python -m bert_keras.run_tagger --do_train` wrote (or
`convert_checkpoint --from=hf --to=keras` made from a transformers
BertForTokenClassification): model.keras, labels.txt, vocab.txt, tokenizer_config.json.

A word is what the tagging data calls one (`data_prep.tagging`): a whitespace-separated
token, WordPiece-tokenized on its own (a word that gives no piece counts as one [UNK]); its
tag is read at its first sub-token, as in training. A request longer than max_seq_length - 2
sub-tokens is read as run_tagger reads a long sentence: in windows of max_seq_length - 2
sub-tokens --doc_stride apart (default: the fine-tuning's, train_results.json, else half a
window), every window of the batch in one encoder call, each word tagged from the window
where its first sub-token has the most context (`export.doc_windows`), so the tags are
predictions.conll's. --doc_stride=0 truncates instead: the words past max_seq_length - 2
sub-tokens get the tag "" (tag_id -1). The encoder runs on the batch's real length rounded
up to one of --length_buckets (`export.length_buckets`); the tags are those of the full
--max_seq_length run.

Signatures (W = the most words of a row in the batch; shorter rows are padded with "",
tag "" and tag_id -1, probabilities 0):
  serving_default  text: string [batch] (split on whitespace, as Python's str.split(); ill-
                   formed UTF-8 read as U+FFFD, `request_checks.texts`)
                   -> words string [batch, W], tags string [batch, W], tag_ids int32
                   [batch, W], probabilities float32 [batch, W, C], num_words int32 [batch]
  words            words: string [batch, W'] (pad rows at the end with "") -> the same

A tagger fine-tuned on character-tagged data (run_tagger --task_name=klue-ner or
--tag_format=klue; train_results.json says tag_format "klue"; --tag_format=klue for a
model converted from transformers) is served as it was trained (`data_prep.klue_ner`): the text is tokenized whole and every WordPiece unit tagged
(pieces of one character are one unit), in the same windows; the entities are read from
the units' tags by seqeval's strict IOB2 rule and returned as the text's own characters,
the characters between two units of one entity (a space) included, so they are the
entities of run_tagger's predictions.tsv. One signature (U = the most units of a row, E =
the most entities; offsets count Unicode characters of the text, end exclusive; padding
"", -1 and 0):
  serving_default  text: string [batch] -> units string [batch, U] (each unit's
                   characters), unit_starts, unit_ends int32 [batch, U], tags string
                   [batch, U], tag_ids int32 [batch, U], probabilities float32 [batch, U, C],
                   num_units int32 [batch], entities string [batch, E], entity_types string
                   [batch, E] ("PS", ...), entity_starts, entity_ends int32 [batch, E],
                   num_entities int32 [batch]
"""

from __future__ import annotations

import tempfile

from export import keras_backend

# Run as a program: Keras on TensorFlow whatever KERAS_BACKEND says (before TF imports it).
_ENVIRONMENT_BACKEND = keras_backend.use_tensorflow() if __name__ == "__main__" else None

import numpy as np

from data_prep import tf_logging

tf = tf_logging.import_tensorflow()  # without TensorFlow's C++ start-up notices
from absl import flags, logging

from data_prep import tokenizer_config, tokenization
from data_prep import files
from data_prep.tagging import default_doc_stride
from export import doc_windows, request_checks, saved_model_writer, task_export
from export.export_preprocessor import WARMUP_TEXTS, TextPacker


# The characters Python's str.isspace() accepts (Unicode White_Space and the four ASCII
# separators \x1c-\x1f), as an RE2 class: the words of the text signature are str.split()'s.
WHITESPACE = (r"[\t\n\x0b\x0c\r\x1c-\x1f \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}"
              r"\x{2029}\x{202f}\x{205f}\x{3000}]+")


def _repeats(rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """bool [n]: whether element i has the row and the value of element i - 1."""
    same = tf.concat([[False], (rows[1:] == rows[:-1]) & (values[1:] == values[:-1])], axis=0)
    return same[:tf.size(rows)]  # [False] alone for n = 0 would be one too many


class TaggerModule(tf.Module):
    """Root object: preprocessor + fine-tuned BertTagger + tag names."""

    def __init__(self, preprocessor: TextPacker, tagger, labels, doc_stride: int = 0):
        super().__init__()
        if len(labels) != tagger.num_classes:
            raise saved_model_writer.ExportError(
                f"{len(labels)} labels for a tagger with {tagger.num_classes} tags")
        room = preprocessor.seq_length - 2
        if not 0 <= doc_stride <= room:
            raise saved_model_writer.ExportError(
                f"--doc_stride={doc_stride} must be 0 (truncate) to --max_seq_length - 2 "
                f"({room}), as run_tagger's")
        self.doc_stride = doc_stride
        self.preprocessor = preprocessor
        self.tagger = saved_model_writer.Untracked(tagger)
        self.labels = tf.constant(list(labels), tf.string)
        # Entities of character-tagged models, by seqeval's strict IOB2 rule: each tag's
        # entity type (an index into `types`, -1 for "O" and other tags) and B/I prefix.
        types = sorted({t[2:] for t in labels if t.startswith(("B-", "I-"))})
        self.types = tf.constant(types or [""], tf.string)
        self.kind = tf.constant([types.index(t[2:]) if t.startswith(("B-", "I-")) else -1
                                 for t in labels], tf.int32)
        self.begins = tf.constant([t.startswith("B-") for t in labels], tf.bool)

    def _tag(self, words: tf.RaggedTensor):
        """words: string RaggedTensor [B, (W)] -> the output dict."""
        pre = self.preprocessor
        flat = words.flat_values  # [N]
        pieces = pre._tokenize(flat)  # [N, (P)], each word on its own
        # A word that tokenizes to nothing is one [UNK]: [N, (P >= 1)] (placed by position,
        # not a ragged concat, whose asserts would run on every request).
        lengths = pieces.row_lengths()
        index = tf.ragged.range(pieces.row_starts(), pieces.row_starts() + tf.maximum(lengths, 1))
        unk = tf.constant(pre.unk_id, tf.int32)
        pieces = index.with_flat_values(tf.where(
            tf.gather(tf.equal(lengths, 0), index.value_rowids()), unk,
            tf.gather(tf.concat([pieces.flat_values, [0]], 0), index.flat_values)))
        tokens = words.with_flat_values(pieces).merge_dims(1, 2)  # [B, (T)]
        _, tag_ids, tags, probabilities = self._tags_at(
            tokens, tf.cumsum(pieces.row_lengths(), exclusive=True))  # each word's first piece

        def dense(values, default):
            return words.with_flat_values(values).to_tensor(default_value=default)

        return {
            "words": words.to_tensor(default_value=""),
            "tags": dense(tags, ""),
            "tag_ids": dense(tag_ids, -1),
            "probabilities": dense(probabilities, 0.0),  # [B, W, C]
            "num_words": tf.cast(words.row_lengths(), tf.int32),
        }

    def _tags_at(self, tokens: tf.RaggedTensor, first: tf.Tensor):
        """The tags read at some pieces of `tokens` [B, (T)] (`first`: int64 [N], their
        indices in tokens.flat_values; a word's or unit's first piece): (kept bool [N],
        tag_ids int32 [N], tags string [N], probabilities float32 [N, C]). In windows where
        --doc_stride is set (`_windowed_logits`); else the rows are truncated, and a piece
        past max_seq_length - 2 is not kept: tag "", tag_id -1, probabilities 0."""
        pre = self.preprocessor
        if self.doc_stride:
            logits = self._windowed_logits(tokens, first)
            kept = tf.ones_like(first, tf.bool)
        else:
            _, inputs = pre.encoder_inputs([tokens])  # [B, L] each, L <= S the bucket length
            row_logits = self.tagger(inputs, training=False)["logits"]  # [B, L, C]
            row = tf.gather(tokens.value_rowids(), first)  # [N]
            position = first - tf.gather(tokens.row_starts(), row)  # [N] within its row
            kept = position < pre.seq_length - 2  # the piece survived truncation
            logits = tf.gather_nd(row_logits, tf.stack(
                [row, tf.where(kept, position + 1, 0)], axis=1))  # [N, C]; +1 for [CLS]
        probabilities = tf.where(kept[:, None], tf.nn.softmax(logits, axis=-1), 0.0)
        tag_ids = tf.where(kept, tf.argmax(logits, axis=-1, output_type=tf.int32), -1)
        tags = tf.where(kept, tf.gather(self.labels, tf.maximum(tag_ids, 0)), "")
        return kept, tag_ids, tags, probabilities

    def _windowed_logits(self, tokens: tf.RaggedTensor, first: tf.Tensor):
        """run_tagger's windows (`data_prep.tagging`): tokens [B, (T)] -> the logits [N, C]
        of each word's first piece (`first`: int64 [N], its index in tokens.flat_values),
        from the window where that piece has the most context."""
        pre = self.preprocessor
        _, row, start, window = doc_windows.windows(tokens, pre.seq_length - 2,
                                                    self.doc_stride)
        _, inputs = pre.encoder_inputs([window])  # [W, L] each, L <= S the bucket length
        logits = self.tagger(inputs, training=False)["logits"]  # [W, L, C]
        # Each window piece's index in tokens.flat_values (a window is a run of its row's).
        place = tf.ragged.range(window.row_lengths())  # [W, (pieces)]
        which = place.value_rowids()  # [P]
        piece = (tf.gather(tf.gather(tokens.row_starts(), row) + start, which)
                 + place.flat_values)  # [P]
        size = tf.size(tokens.flat_values, out_type=tf.int64)
        best = doc_windows.max_context(window, piece, size)  # [P], one True per piece
        at = tf.stack([which, place.flat_values + 1], axis=1)  # +1 for [CLS]
        piece_logits = tf.scatter_nd(
            tf.boolean_mask(piece, best)[:, None], tf.boolean_mask(tf.gather_nd(logits, at), best),
            tf.stack([size, tf.shape(logits, out_type=tf.int64)[2]]))  # [T_all, C]
        return tf.gather(piece_logits, first)

    def _tag_characters(self, text: tf.Tensor):
        """A character-tagged model's request (`data_prep.klue_ner`): text [B] -> each
        WordPiece unit's tag and characters, and the entities."""
        pre = self.preprocessor
        pieces, starts, ends = pre.tokenizer.tokenize_with_offsets(text)  # [B, (T)], bytes
        rows = pieces.value_rowids()  # [T]
        flat_starts = starts.flat_values
        # A unit: a piece whose first character no earlier piece of its row began at (the
        # pieces of one character, as "İ" lowercased, are one unit, read at its first).
        shared = _repeats(rows, flat_starts)
        first = tf.boolean_mask(tf.range(tf.size(rows, out_type=tf.int64)), ~shared)  # [N]
        unit_rows = tf.gather(rows, first)  # [N]
        kept, tag_ids, tags, probabilities = self._tags_at(pieces, first)
        begin, end = tf.gather(flat_starts, first), tf.gather(ends.flat_values, first)  # bytes
        # Entities, strict IOB2 over the units (the characters between two units of one
        # entity, a space in "2018년 3월", belong to it): a B-X starts one, the I-X units
        # after it continue it; an I-X with no B-X before it in its run of X units, none.
        kind = tf.where(kept, tf.gather(self.kind, tf.maximum(tag_ids, 0)), -1)  # [N]
        opens = kept & tf.gather(self.begins, tf.maximum(tag_ids, 0))  # [N]
        same_run = _repeats(unit_rows, kind) & (kind >= 0)
        run = tf.cumsum(tf.cast(~same_run, tf.int64)) - 1  # [N]
        opened = tf.cumsum(tf.cast(opens, tf.int64))  # [N] entities begun up to here
        before_run = tf.gather(tf.boolean_mask(opened - tf.cast(opens, tf.int64), ~same_run),
                               run)  # [N] entities begun before the unit's run
        inside = (kind >= 0) & (opened > before_run)
        count = tf.reduce_sum(tf.cast(opens, tf.int64))
        entity_rows = tf.boolean_mask(unit_rows, opens)  # [E]
        entity_begin = tf.boolean_mask(begin, opens)
        entity_end = tf.math.unsorted_segment_max(
            tf.boolean_mask(end, inside), tf.boolean_mask(opened - 1, inside), count)

        def source(at, until, at_rows):  # the text's own characters (`request_checks.texts`
            # made it UTF-8; the offsets are characters' starts)
            return tf.strings.substr(tf.gather(text, at_rows), at, until - at)

        # Offsets in characters of the text as a client decodes it (invalid UTF-8 replaced).
        stops = tokenization.character_stops(text)

        def chars(at, at_rows):
            offset = at_rows * tokenization.ROW
            return tf.cast(tf.searchsorted(stops, offset + at, out_type=tf.int64)
                           - tf.searchsorted(stops, offset, out_type=tf.int64), tf.int32)

        nrows = pieces.nrows()

        def per_row(values, value_rows, default):  # [B, the most of a row], padded
            return tf.RaggedTensor.from_value_rowids(
                values, value_rows, nrows, validate=False).to_tensor(default_value=default)

        def per_unit(values, default):
            return per_row(values, unit_rows, default)

        def per_entity(values, default):
            return per_row(values, entity_rows, default)

        def row_counts(value_rows):  # int32 [B]
            return tf.math.bincount(tf.cast(value_rows, tf.int32),
                                    minlength=tf.cast(nrows, tf.int32), dtype=tf.int32)

        return {
            "units": per_unit(source(begin, end, unit_rows), ""),
            "unit_starts": per_unit(chars(begin, unit_rows), -1),
            "unit_ends": per_unit(chars(end, unit_rows), -1),
            "tags": per_unit(tags, ""),
            "tag_ids": per_unit(tag_ids, -1),
            "probabilities": per_unit(probabilities, 0.0),  # [B, U, C]
            "num_units": row_counts(unit_rows),
            "entities": per_entity(source(entity_begin, entity_end, entity_rows), ""),
            "entity_types": per_entity(tf.gather(self.types, tf.boolean_mask(kind, opens)), ""),
            "entity_starts": per_entity(chars(entity_begin, entity_rows), -1),
            "entity_ends": per_entity(chars(entity_end, entity_rows), -1),
            "num_entities": row_counts(entity_rows),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve_characters(self, text):
        return self._tag_characters(request_checks.texts(text))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text):
        # Words as Python's str.split() makes them (the CoNLL reader's): tf.strings.split
        # alone splits on ASCII whitespace, leaving "Seoul\u3000went" one word.
        text = request_checks.texts(text)
        return self._tag(tf.strings.split(tf.strings.regex_replace(text, WHITESPACE, " ")))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string, name="words")])
    def serve_words(self, words):
        words = request_checks.texts(words, rank=2)  # a batch of word rows
        return self._tag(tf.RaggedTensor.from_tensor(words, padding=""))


def export_tagger(tagger, tokenizer, labels, export_dir: str, seq_length: int = 128,
                  version: int | None = None, buckets=None,
                  serving_dtype: str = "float32", doc_stride: int | None = None,
                  characters: bool = False, kernel_layout: str = "in_out") -> str:
    """Writes the end-to-end tagger to `<export_dir>/<version>`; returns that path.

    Args:
      tagger: a fine-tuned `bert_keras.tasks.BertTagger`.
      tokenizer: the `data_prep.tokenization.BertTokenizer` it was fine-tuned with.
      labels: tag names, index i = class i.
      seq_length: the fine-tuning max_seq_length.
      buckets: the encoder's lengths (`length_buckets.resolve`; None: the default set).
      serving_dtype: what the export computes in (`bert_keras.tasks.SERVING_DTYPES`); the
        exported model is `bert_keras.tasks.for_serving(model, serving_dtype,
        kernel_layout)`.
      kernel_layout: how the export stores its encoder's Dense kernels
        (`tasks.KERNEL_LAYOUTS`, `bert_keras.tasks.for_serving`).
      doc_stride: run_tagger's --doc_stride, 1 to seq_length - 2: a request longer than one
        window is tagged in windows this many sub-tokens apart; 0 truncates it; None: half a
        window (`data_prep.tagging.default_doc_stride`), run_tagger's default.
      characters: the tagger was fine-tuned on character-tagged data (run_tagger
        --task_name=klue-ner or --tag_format=klue): the export tags the text's WordPieces
        and returns its entities with character offsets (module docstring).
    """
    from bert_keras import tasks

    if seq_length > tagger.encoder.max_sequence_length:
        raise saved_model_writer.ExportError(
            f"--max_seq_length={seq_length} exceeds the encoder's position table "
            f"({tagger.encoder.max_sequence_length} positions)")
    path = saved_model_writer.version_dir(export_dir, version)
    tagger = tasks.for_serving(tagger, serving_dtype, kernel_layout)
    with tempfile.TemporaryDirectory() as assets:
        pre = TextPacker(tokenizer, seq_length, assets, buckets, pairs=False,
                         length_flag="--max_seq_length")
        if doc_stride is None:
            doc_stride = default_doc_stride(seq_length)
        module = TaggerModule(pre, tagger, labels, doc_stride)
        texts = np.array(WARMUP_TEXTS, dtype=object)
        # Longer than one window: the windowed path (or the truncation) runs too.
        long = np.array([" ".join(["hello"] * seq_length)] * 2, dtype=object)
        if characters:
            signatures = {"serving_default": module.serve_characters.get_concrete_function()}
            warmup = [("serving_default", {"text": texts[:1]}),
                      ("serving_default", {"text": texts}),
                      ("serving_default", {"text": long})]
            warmup += [("serving_default", {"text": np.array([text], dtype=object)})
                       for (text,) in pre.warmup_texts(1)]  # every bucket
        else:
            signatures = {
                "serving_default": module.serve.get_concrete_function(),
                "words": module.serve_words.get_concrete_function(),
            }
            words = np.array([["Hello", "world", "!"], ["naïve", "", ""]], dtype=object)
            warmup = [
                ("serving_default", {"text": texts[:1]}),
                ("serving_default", {"text": texts}),
                ("words", {"words": words}),
                ("serving_default", {"text": long}),
            ]
            for (text,) in pre.warmup_texts(1):  # every bucket, on both signatures
                warmup += [("serving_default", {"text": np.array([text], dtype=object)}),
                           ("words", {"words": np.array([text.split() or [""]], dtype=object)})]
        # Its outputs are as wide as a batch's longest row: TF Serving could not concatenate
        # the pieces of a request split across batches (`batching_parameters`).
        task_export.write_text_in_export(module, path, signatures, warmup, pre.buckets,
                                         split_requests=False)
    logging.info("Wrote tagger export %s (tokenizer %s)", path, tokenizer.config.describe())
    return path


# --- Command line. ---

_FLAGS = task_export.define_flags(
    "A fine-tuned tagger: run_tagger's --output_dir (model.keras, labels.txt, vocab.txt, "
    "tokenizer_config.json).", 128, "Sequence length the tagger was fine-tuned with.")
_DOC_STRIDE = flags.DEFINE_integer(
    "doc_stride", None, "A request longer than --max_seq_length - 2 WordPieces is tagged in "
    "windows this many WordPieces apart, as run_tagger tags a long sentence; 0 truncates it "
    f"(the words past it get the tag \"\"). Default: --model_dir's ({files.TRAIN_RESULTS_FILE}), "
    "else half a window.", allow_override=True)
_TAG_FORMAT = flags.DEFINE_enum(
    "tag_format", None, ["conll", "klue"], "How the tagger was fine-tuned: conll, a tag per "
    "whitespace-separated word (text or words in, a tag per word out); klue, KLUE-NER's "
    "character tags (text in, WordPiece units' tags and entities with character offsets "
    f"out). Default: --model_dir's ({files.TRAIN_RESULTS_FILE}), else conll (a model "
    "converted from transformers records none).", allow_override=True)
_TOKENIZER_FLAGS = tokenizer_config.define_flags()


def main(argv):
    def export(model, tokenizer, labels, export_dir, seq_length, version, buckets,
               serving_dtype, kernel_layout, recorded):
        doc_stride = task_export.given_or_recorded(_DOC_STRIDE, recorded, "doc_stride",
                                                   "Window stride")
        characters = task_export.given_or_recorded(_TAG_FORMAT, recorded, "tag_format",
                                                   "Tag format") == "klue"
        if characters:
            logging.info("Character-tagged model: the export tags the text's WordPieces and "
                         "returns entities with character offsets")
        return export_tagger(model, tokenizer, labels, export_dir, seq_length, version=version,
                             buckets=buckets, serving_dtype=serving_dtype, doc_stride=doc_stride,
                             characters=characters, kernel_layout=kernel_layout)

    return task_export.run(argv, _FLAGS, _TOKENIZER_FLAGS, "BertTagger", "run_tagger",
                           export, "export_tagger", environment_backend=_ENVIRONMENT_BACKEND,
                           split_requests=False, recorded_flags=(_DOC_STRIDE, _TAG_FORMAT))


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["model_dir", "export_dir"])
    cli.run(main)
