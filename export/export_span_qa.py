r"""Exports a fine-tuned span-QA model (SQuAD) as a SavedModel: question and context in, spans out.

    python -m export.export_span_qa --model_dir=runs/squad \
        --export_dir=/models/squad [--version=1] [--max_seq_length=384] \
        [--max_query_length=64] [--doc_stride=128] [--max_answer_length=30] \
        [--version_2_with_negative] \
        [--null_score_diff_threshold=0.0] \
        [--length_buckets=16,24,32,48,64,96,128,160,192,224,256,320,384,448,512] \
        [--serving_dtype=bfloat16]

--model_dir is what `python -m bert_keras.run_squad --do_train` wrote (or
`convert_checkpoint --from=hf --to=keras` made from a transformers
BertForQuestionAnswering): model.keras, vocab.txt, tokenizer_config.json.

Signatures (S = max_seq_length):
  serving_default  question, context: string [batch] -> "[CLS] question [SEP] context [SEP]"
                   in run_squad's windows: the question cut to --max_query_length, the
                   context in windows of the rest of S, --doc_stride WordPieces apart, every
                   window run ->
                   start_logits, end_logits float32 [batch, S] (the window of the best span,
                   also where a SQuAD 2.0 model answers none; the first window where the
                   context has no span at all; -10000 at padding positions,
                   input_mask 0), input_word_ids, input_type_ids int32 [batch, S] (what the
                   logits index), window_start int32 [batch] (the context WordPiece that
                   window starts at), windows int32 [batch] (how many the context took),
                   answer_start, answer_end int32 [batch] (token positions in that window of
                   the best span over all windows: highest start + end logit, both in the
                   context, starting where the window gives the most context (run_squad's
                   token_is_max_context), end >= start, at most max_answer_length tokens;
                   -1 when the context has no WordPiece (empty, whitespace, or only
                   characters the tokenizer drops: "\u200b"), and for a SQuAD 2.0 model where
                   null_odds > --null_score_diff_threshold),
                   null_odds float32 [batch] (the smallest [CLS] score over the windows minus
                   the best span's, run_squad's null_odds.json),
                   answer string [batch] (the context's own text under the span: from the first WordPiece's source to the last one's end and the
                   combining marks after it, casing, accents and scripts as sent, whitespace
                   runs as one space as run_squad's predictions.json writes them, ill-formed
                   UTF-8 as U+FFFD; "" for no answer),
                   answer_char_start, answer_char_end int32 [batch] (the span in characters
                   of the context, end exclusive: context[start:end] in Python, with a
                   context sent as bytes read as bytes.decode("utf-8", "replace"); -1 for no
                   answer)
  ids              input_word_ids, input_mask, input_type_ids: int32 [batch, seq]
                   (packed as run_squad packs) -> start_logits, end_logits [batch, seq]

The text signature runs the encoder on every window of the batch at once, at the windows'
real length rounded up to one of --length_buckets (`export.length_buckets`), and pads the
logits back to S: at real positions they are those of the full-length run; the ids
signature runs the length it is given. A context costs one encoder row per window: at
S=384 and the default stride, 1 + ceil((T - 317) / 128) windows for T > 317 WordPieces (a
64-piece question leaves 384 - 3 - 64 = 317).
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

from data_prep import files, schema, squad, tokenization, tokenizer_config
from export import doc_windows, length_buckets, request_checks, saved_model_writer, task_export
from export.text_preprocessing import keep_first
from export.export_preprocessor import WARMUP_TEXTS, TextPacker

MAX_ANSWER_LENGTH = 30  # Google's run_squad.py --max_answer_length
MAX_QUERY_LENGTH = 64  # and its --max_query_length
DOC_STRIDE = 128  # and its --doc_stride
# What run_squad splits a context into words at, as an RE2 class.
SQUAD_WHITESPACE = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in squad.WHITESPACE) + "]+"


def _ids_signature():
    return {name: tf.TensorSpec([None, None], tf.int32, name=name)
            for name in schema.MODEL_INPUT_NAMES}


class SpanQAModule(tf.Module):
    """Root object: preprocessor + fine-tuned BertSpanQA."""

    def __init__(self, preprocessor: TextPacker, model, max_answer_length: int,
                 max_query_length: int | None = None,
                 version_2_with_negative: bool = False, null_score_diff_threshold: float = 0.0,
                 doc_stride: int = DOC_STRIDE):
        super().__init__()
        if max_query_length is None:  # Google's 64, or what a short window leaves
            max_query_length = min(MAX_QUERY_LENGTH, preprocessor.seq_length - 4)
        if max_answer_length < 1:
            raise saved_model_writer.ExportError(
                f"--max_answer_length must be >= 1. Received: {max_answer_length}")
        if doc_stride < 1:
            raise saved_model_writer.ExportError(
                f"--doc_stride must be >= 1. Received: {doc_stride}")
        refusal = model.encoder.pair_refusal("span QA reads the context as a second text")
        if refusal:
            raise saved_model_writer.ExportError(refusal)
        if not 1 <= max_query_length < preprocessor.seq_length - 3:
            raise saved_model_writer.ExportError(
                f"--max_query_length={max_query_length} must be >= 1 and leave room for "
                f"context in --max_seq_length={preprocessor.seq_length} ([CLS] and two [SEP])")
        self.preprocessor = preprocessor
        self.model = saved_model_writer.Untracked(model)
        self.limits = dict(max_positions=int(model.encoder.max_sequence_length),
                           vocab_size=int(model.encoder.vocab_size),
                           type_vocab_size=int(model.encoder.type_vocab_size))
        self.max_answer_length = max_answer_length
        self.max_query_length = max_query_length
        self.doc_stride = doc_stride
        self.version_2_with_negative = version_2_with_negative
        self.null_score_diff_threshold = float(null_score_diff_threshold)

    def _logits(self, inputs):
        out = self.model(inputs, training=False)
        return {"start_logits": out["start_logits"], "end_logits": out["end_logits"]}

    @tf.function(input_signature=[_ids_signature()])
    def serve_ids(self, inputs):
        return self._logits(request_checks.encoder_inputs(inputs, **self.limits))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question"),
                                  tf.TensorSpec([None], tf.string, name="context")])
    def serve(self, question, context):
        pre = self.preprocessor
        question, context = request_checks.text_pair(question, context, ("question", "context"))
        # run_squad's features: the question cut to max_query_length, the context in
        # windows of what is left of S ([CLS] and two [SEP]), doc_stride pieces apart.
        asked = pre._tokenize(question)
        asked = keep_first(asked, tf.fill([asked.nrows()], tf.constant(self.max_query_length,
                                                                         tf.int64)))
        pieces, starts, ends = pre.tokenizer.tokenize_with_offsets(context)  # [B, (T)] each
        count, row, window_start, window = doc_windows.windows(
            pieces, pre.seq_length - 3 - asked.row_lengths(), self.doc_stride)
        questions = tf.gather(asked, row)  # [W, (Q)]
        packed, inputs = pre.encoder_inputs([questions, window])  # [W, S], [W, L]
        out = self._logits(inputs)  # [W, L] each, L <= S the bucket length
        seq = tf.shape(inputs[schema.INPUT_WORD_IDS])[1]
        row32 = tf.cast(row, tf.int32)
        first = tf.cast(questions.row_lengths(), tf.int32) + 2  # [W] [CLS] question [SEP]
        # Where an answer may start: a context piece this window gives the most context
        # (run_squad's rule), and end: any context piece. [W, L] each.
        piece = (tf.gather(pieces.row_starts(), tf.gather(row, window.value_rowids()))
                 + tf.gather(window_start, window.value_rowids())
                 + tf.ragged.range(window.row_lengths()).flat_values)  # [P]
        max_context = doc_windows.max_context(window, piece,
                                              tf.size(pieces.flat_values, tf.int64))

        def in_context(flags):  # bool [W, (pieces)] -> at the pieces' positions, [W, L]
            before = tf.ragged.range(tf.cast(first, tf.int64)) < 0  # [CLS] question [SEP]
            both = tf.concat([before, flags], axis=1)
            return both.to_tensor(False, shape=tf.stack([both.nrows(out_type=tf.int32), seq]))

        can_start = in_context(window.with_flat_values(max_context))
        can_end = in_context(window.with_flat_values(tf.ones_like(max_context)))
        # Spans (start, start + k), k < max_answer_length = A: [W, L, A], not every (start,
        # end) pair ([W, L, L]: 13x the memory at S=384, 1.8 MB a window).
        longest = self.max_answer_length
        span_ends = tf.range(seq)[:, None] + tf.range(longest)[None, :]  # [L, A]
        after = [[0, 0], [0, longest - 1]]  # ends past the window: not context, not spans

        def at_ends(values):  # [W, L] -> [W, L, A]: the value at each span's end
            return tf.gather(tf.pad(values, after), span_ends, axis=1)

        valid = can_start[:, :, None] & at_ends(can_end)  # [W, L, A]
        scores = out["start_logits"][:, :, None] + at_ends(out["end_logits"])  # [W, L, A]
        spans = tf.reshape(tf.where(valid, scores, -np.inf), [-1, seq * longest])  # [W, L * A]
        best = tf.argmax(spans, axis=-1, output_type=tf.int32)  # [W] start-major, then end
        best_score = tf.reduce_max(spans, axis=-1)  # [W]
        has_span = tf.reduce_any(tf.reshape(valid, [-1, seq * longest]), axis=-1)  # [W]
        # A request's answer: its best span over its windows, the first window on a tie
        # (run_squad's stable sort of the candidates, window by window).
        rows = tf.size(context)
        top = tf.math.unsorted_segment_max(best_score, row32, rows)  # [B]
        windows = tf.size(row32)
        winner = tf.where(has_span & (best_score == tf.gather(top, row32)),
                          tf.range(windows), windows)
        chosen = tf.math.unsorted_segment_min(winner, row32, rows)  # [B]; W: no span
        found = chosen < windows
        first_window = tf.cast(tf.math.cumsum(count, exclusive=True), tf.int32)  # [B]
        chosen = tf.where(found, chosen, first_window)  # no span: the first window's outputs
        # SQuAD 2.0's odds: the smallest [CLS] ("no answer") score over the windows minus
        # the best span's.
        null_score = tf.math.unsorted_segment_min(
            out["start_logits"][:, 0] + out["end_logits"][:, 0], row32, rows)  # [B]
        null_odds = tf.where(found, null_score - top, null_score)
        if self.version_2_with_negative:  # run_squad's rule: "" above the threshold
            found &= null_odds <= self.null_score_diff_threshold
        span = tf.gather(best, chosen)
        answer_start = tf.where(found, span // longest, -1)
        answer_end = tf.where(found, span // longest + span % longest, -1)
        # The answer is the context's own text: from where its first piece came from to
        # where its last one ended (`BertTokenizer.tokenize_with_offsets`), in bytes.
        shift = tf.cast(tf.gather(window_start, chosen), tf.int32) - tf.gather(first, chosen)

        def source(offsets, position):  # [B] int64: the offset of context piece `position`
            index = offsets.row_starts() + tf.cast(position + shift, tf.int64)
            flat = tf.concat([offsets.flat_values, [0]], 0)  # a row without an answer reads 0
            return tf.gather(flat, tf.where(found, index, tf.size(flat, tf.int64) - 1))

        begin, finish = source(starts, answer_start), source(ends, answer_end)
        # The answer ends past the combining marks after its last piece (a vowel sign, or an
        # accent that is a WordPiece of its own), where run_squad's final_text ends it.
        offset = tf.range(tf.size(context, out_type=tf.int64)) * tokenization.ROW  # [B]
        decoded = tokenization.decode(context)  # once, for both kinds of stops
        marks_skipped = tokenization.character_stops(context, skip_marks=True, decoded=decoded)
        finish = tf.where(found, tokenization.next_stop(marks_skipped, offset + finish,
                                                        inclusive=True) - offset, 0)
        # In characters of the context as a client decodes it (invalid UTF-8 replaced).
        stops = tokenization.character_stops(context, decoded=decoded)
        before = lambda key: tf.searchsorted(stops, key, out_type=tf.int64)  # noqa: E731
        chars = lambda at: tf.cast(before(offset + at) - before(offset), tf.int32)  # noqa: E731
        # UTF-8: `request_checks.texts` replaced the request's ill-formed bytes.
        answer = tf.strings.substr(context, begin, finish - begin)
        mask = tf.gather(packed[schema.MODEL_INPUT_MASK], chosen)  # [B, S]
        return {
            **{name: length_buckets.pad_positions(tf.gather(logits, chosen), mask,
                                                  length_buckets.PADDING_LOGIT)
               for name, logits in out.items()},  # [B, S]
            "input_word_ids": tf.gather(packed[schema.INPUT_WORD_IDS], chosen),
            "input_type_ids": tf.gather(packed[schema.INPUT_TYPE_IDS], chosen),
            "window_start": tf.cast(tf.gather(window_start, chosen), tf.int32),
            "windows": tf.cast(count, tf.int32),
            "answer_start": answer_start,
            "answer_end": answer_end,
            "null_odds": null_odds,
            # run_squad's predictions.json joins an answer's words with one space.
            "answer": tf.strings.regex_replace(answer, SQUAD_WHITESPACE, " "),
            "answer_char_start": tf.where(found, chars(begin), -1),
            "answer_char_end": tf.where(found, chars(finish), -1),
        }


def export_span_qa(model, tokenizer, export_dir: str, seq_length: int = 384,
                   version: int | None = None,
                   max_answer_length: int = MAX_ANSWER_LENGTH, buckets=None,
                   serving_dtype: str = "float32", max_query_length: int | None = None,
                   version_2_with_negative: bool = False,
                   null_score_diff_threshold: float = 0.0, doc_stride: int = DOC_STRIDE,
                   kernel_layout: str = "in_out") -> str:
    """Writes the span-QA SavedModel to `<export_dir>/<version>`; returns that path.

    Args:
      model: a fine-tuned `bert_keras.tasks.BertSpanQA`.
      tokenizer: the `data_prep.tokenization.BertTokenizer` it was fine-tuned with.
      seq_length: the fine-tuning max_seq_length (length of the text signature's windows).
      max_answer_length: the longest answer span, in tokens.
      max_query_length: the question is cut to this many tokens, as run_squad cuts it
        (None: 64, or seq_length - 4 where that is less).
      doc_stride: a long context's windows start this many WordPieces apart (run_squad's
        --doc_stride).
      version_2_with_negative: a SQuAD 2.0 model: the answer is "" (answer_start -1) where
        null_odds > null_score_diff_threshold, as run_squad predicts.
      buckets: the encoder's lengths (`length_buckets.resolve`; None: the default set).
      serving_dtype: what the export computes in (`bert_keras.tasks.SERVING_DTYPES`); the
        exported model is `bert_keras.tasks.for_serving(model, serving_dtype,
        kernel_layout)`.
      kernel_layout: how the export stores its encoder's Dense kernels
        (`tasks.KERNEL_LAYOUTS`, `bert_keras.tasks.for_serving`).
    """
    from bert_keras import tasks

    if seq_length > model.encoder.max_sequence_length:
        raise saved_model_writer.ExportError(
            f"--max_seq_length={seq_length} exceeds the encoder's position table "
            f"({model.encoder.max_sequence_length} positions)")
    path = saved_model_writer.version_dir(export_dir, version)
    model = tasks.for_serving(model, serving_dtype, kernel_layout)
    with tempfile.TemporaryDirectory() as assets:
        pre = TextPacker(tokenizer, seq_length, assets, buckets, length_flag="--max_seq_length")
        module = SpanQAModule(pre, model, max_answer_length, max_query_length,
                              version_2_with_negative, null_score_diff_threshold, doc_stride)
        signatures = {
            "serving_default": module.serve.get_concrete_function(),
            "ids": module.serve_ids.get_concrete_function(),
        }
        texts = np.array(WARMUP_TEXTS, dtype=object)
        packed = pre._pack([pre._tokenize(tf.constant(t)) for t in (texts[::-1].copy(), texts)])
        warmup = [
            ("serving_default", {"question": texts[1:2], "context": texts[2:3]}),
            ("serving_default", {"question": texts[::-1].copy(), "context": texts}),
            ("ids", {k: v.numpy() for k, v in packed.items()}),
        ]
        # Every bucket: the question within --max_query_length, or the export would cut it
        # and run the request at a shorter bucket (at --max_seq_length=512 the default
        # buckets' 448 went unwarmed).
        warmup += [("serving_default", {"question": np.array([question], dtype=object),
                                        "context": np.array([context], dtype=object)})
                   for question, context in pre.warmup_texts(2, module.max_query_length)]
        task_export.write_text_in_export(module, path, signatures, warmup, pre.buckets)
    logging.info("Wrote span-QA export %s (tokenizer %s)", path, tokenizer.config.describe())
    return path


# --- Command line. ---

_FLAGS = task_export.define_flags(
    "A fine-tuned span-QA model: run_squad's --output_dir (model.keras, vocab.txt, "
    "tokenizer_config.json).", 384, "Sequence length the model was fine-tuned with.")
_MAX_ANSWER_LENGTH = flags.DEFINE_integer(
    "max_answer_length", None, "Longest answer span, in tokens. Default: --model_dir's "
    f"({files.TRAIN_RESULTS_FILE}), else {MAX_ANSWER_LENGTH}.", allow_override=True)
_MAX_QUERY_LENGTH = flags.DEFINE_integer(
    "max_query_length", None, "The question is cut to this many tokens, as run_squad cuts "
    f"it. Default: --model_dir's ({files.TRAIN_RESULTS_FILE}), else "
    f"{MAX_QUERY_LENGTH} (or --max_seq_length - 4 where that is less).", allow_override=True)
_DOC_STRIDE = flags.DEFINE_integer(
    "doc_stride", None, "A context longer than one window is read in windows this many "
    f"WordPieces apart, as run_squad reads it. Default: --model_dir's "
    f"({files.TRAIN_RESULTS_FILE}), else {DOC_STRIDE}.", allow_override=True)
_VERSION_2 = flags.DEFINE_boolean(
    "version_2_with_negative", False, "A SQuAD 2.0 model: answer \"\" where null_odds > "
    "--null_score_diff_threshold. Default: whether --model_dir was trained so "
    f"({files.TRAIN_RESULTS_FILE}), else false.", allow_override=True)
_NULL_THRESHOLD = flags.DEFINE_float(
    "null_score_diff_threshold", None, "With --version_2_with_negative: answer \"\" where the "
    "null score minus the best span's exceeds this (run_squad's flag). Default: --model_dir's "
    f"({files.TRAIN_RESULTS_FILE}), else 0.", allow_override=True)
_TOKENIZER_FLAGS = tokenizer_config.define_flags()


def main(argv):
    if _DOC_STRIDE.value is not None and _DOC_STRIDE.value < 1:
        # Parsed as >= 0 (run_tagger's 0 truncates); refused before the model is loaded.
        raise flags.IllegalFlagValueError(f"--doc_stride={_DOC_STRIDE.value}: expected an "
                                          "integer >= 1")

    def export(model, tokenizer, _, export_dir, seq_length, version, buckets, serving_dtype,
               kernel_layout, recorded):
        def setting(holder, key, what, default=None):
            value = task_export.given_or_recorded(holder, recorded, key, what)
            return default if value is None else value

        return export_span_qa(
            model, tokenizer, export_dir, seq_length, version=version,
            max_answer_length=setting(_MAX_ANSWER_LENGTH, "max_answer_length", "Answer length",
                                      MAX_ANSWER_LENGTH),
            buckets=buckets, serving_dtype=serving_dtype, kernel_layout=kernel_layout,
            max_query_length=setting(_MAX_QUERY_LENGTH, "max_query_length", "Question length"),
            version_2_with_negative=setting(_VERSION_2, "version_2_with_negative", "SQuAD 2.0"),
            null_score_diff_threshold=setting(_NULL_THRESHOLD, "null_score_diff_threshold",
                                              "No-answer threshold", 0.0),
            doc_stride=setting(_DOC_STRIDE, "doc_stride", "Window stride", DOC_STRIDE))

    return task_export.run(argv, _FLAGS, _TOKENIZER_FLAGS, "BertSpanQA", "run_squad", export,
                           "export_span_qa", needs_labels=False,
                           environment_backend=_ENVIRONMENT_BACKEND,
                           recorded_flags=(_MAX_ANSWER_LENGTH, _MAX_QUERY_LENGTH, _DOC_STRIDE,
                                           _VERSION_2, _NULL_THRESHOLD))


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["model_dir", "export_dir"])
    cli.run(main)
