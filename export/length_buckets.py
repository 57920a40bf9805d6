"""Length buckets: text-in exports run the encoder on a batch's real length, rounded up.

A text-in export packs every request to its max_seq_length S (`bert_pack_inputs`), as
fine-tuning did. Most real requests are much shorter (a query, a sentence, a subject
line), and the encoder's cost grows with the length it runs on, so the serving functions
cut the packed inputs before the encoder:

    real   = max over the batch's rows of sum(input_mask)       (int32 scalar)
    length = the smallest bucket >= real (S when real exceeds every bucket)
    input_word_ids, input_mask, input_type_ids = x[:, :length]  (tf.StridedSlice)

Every position cut holds padding (input_mask 0), which no real position attends to, so the
real positions' outputs are those of the full-length run up to float32 rounding: the
classifier's [CLS] logits, the tagger's per-word logits, span QA's logits at real
positions. Rounding up to a few buckets, rather than running the exact length, keeps the
shapes a server sees to a handful (warmup requests cover each one) for runtimes that
compile per shape (XLA, GPUs).

The bucket set is fixed at export time (--length_buckets, default DEFAULT_BUCKETS): the
buckets below S, then S itself. `--length_buckets=` (empty) or `--length_buckets=S` gives
the fixed-length export.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import tensorflow as tf

from data_prep import schema
from export.saved_model_writer import ExportError

# The default buckets, capped by each export's max_seq_length: steps of at most 1.5x, so a
# request of 16 or more positions runs at most half again its length; seven shapes up to
# 128. On the 2-core CPU of BUILD_NOTES.md section 8.11 a base-size request at batch 1
# cost about half as much at 16-32 positions as at 128, and the p50 latency of a real-text
# mix (median 41 wordpieces) was 0.60x the fixed-length export's. Above 128, where a
# request costs more per position (attention), steps of at most 1.25x: with 192 -> 256 a
# span-QA request of 219 positions ran at 256 for 15% more time than at its length.
DEFAULT_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)

# Span QA's start/end logits at padding positions: what Google's BERT adds to the attention
# scores of masked positions, so a softmax over a row gives them no weight; finite, so a
# REST response stays valid JSON.
PADDING_LOGIT = -10000.0


def resolve(buckets: Iterable[int] | None, max_seq_length: int, least: int = 1,
            why: str = "") -> tuple[int, ...]:
    """The buckets an export uses: those below `max_seq_length`, ascending, then it.

    Args:
      buckets: the requested lengths (None: DEFAULT_BUCKETS); any order; lengths of
        max_seq_length or more are dropped (the cap).
      max_seq_length: S, the length requests are packed to.
      least: the least length, as for --max_seq_length (room for [CLS] and a piece of
        each text, each with its [SEP]); a shorter bucket is refused: a signature that
        packs pairs never runs at it, and verify would fail the export for that.
      why: why `least`, for the message.

    Raises:
      ExportError: a length that is not a positive integer, or one below `least`.
    """
    requested = DEFAULT_BUCKETS if buckets is None else _checked(tuple(buckets))
    short = sorted({b for b in requested if b < least})
    if short:
        raise ExportError(
            f"--length_buckets: lengths must be at least {least}{f' ({why})' if why else ''}"
            f". Received: {','.join(map(str, requested))}")
    return tuple(sorted({b for b in requested if b < max_seq_length})) + (max_seq_length,)


def _checked(buckets: tuple) -> tuple:
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
        raise ExportError(f"--length_buckets: expected comma-separated positive integers "
                          f"(e.g. 16,32,64,128). Received: {','.join(map(str, buckets))}")
    return buckets


def parse_flag(values: Sequence[str] | None) -> tuple[int, ...] | None:
    """--length_buckets' value (absl's list of strings) as integers; None when not given.

    Raises:
      ExportError: an entry that is not a positive integer.
    """
    if values is None:
        return None
    try:
        return _checked(tuple(int(v) for v in values if v.strip()))
    except ValueError:
        raise ExportError(f"--length_buckets: expected comma-separated positive integers "
                          f"(e.g. 16,32,64,128). Received: {','.join(values)}") from None


def define_flag(module_name: str | None = None, length_flag: str = "max_seq_length"):
    """Defines --length_buckets for the calling export tool; returns its holder.
    `length_flag`: the tool's flag of the length requests are packed to (export_encoder's
    and export_preprocessor's is --seq_length)."""
    from absl import flags

    from data_prep.cli import calling_module

    return flags.DEFINE_list(
        "length_buckets", None,
        "Lengths the text-in signatures round a batch's real length up to before the encoder "
        f"(comma-separated; those at or above --{length_flag} are dropped, --{length_flag} "
        "is always the last). Default: " + ",".join(map(str, DEFAULT_BUCKETS)) + ". An empty "
        f"value runs every request at --{length_flag}.",
        allow_override=True, module_name=module_name or calling_module())


def bucket_length(input_mask: tf.Tensor, buckets: Sequence[int]) -> tf.Tensor:
    """The length a batch runs at: the smallest bucket >= its longest row.

    Args:
      input_mask: int32 Tensor [B, S], 1 at real positions (left-aligned rows).
      buckets: ascending lengths (`resolve`).

    Returns:
      int32 scalar Tensor, at most S; the smallest bucket for an empty batch.
    """
    width = tf.shape(input_mask)[1]
    real = tf.reduce_max(tf.reduce_sum(input_mask, axis=1))  # int32 min for B = 0
    lengths = tf.constant(buckets, tf.int32)
    return tf.minimum(tf.reduce_min(tf.where(lengths >= real, lengths, width)), width)


def trim(inputs: dict, buckets: Sequence[int]) -> dict:
    """The encoder inputs cut to `bucket_length`.

    Args:
      inputs: dict of int32 Tensors [B, S]: input_word_ids, input_mask, input_type_ids.
      buckets: ascending lengths (`resolve`).

    Returns:
      The same dict with Tensors [B, length].
    """
    length = bucket_length(inputs[schema.MODEL_INPUT_MASK], buckets)
    return {name: value[:, :length] for name, value in inputs.items()}


def pad_positions(values: tf.Tensor, input_mask: tf.Tensor, fill) -> tf.Tensor:
    """Per-position outputs of a trimmed run, back at the packed width; `fill` at padding.

    Args:
      values: Tensor [B, L] (L <= S), computed on `trim`'s inputs.
      input_mask: int32 Tensor [B, S], the packed (untrimmed) mask.
      fill: the value of every padding position (input_mask 0), cut or not.

    Returns:
      Tensor [B, S] of values.dtype.
    """
    width = tf.shape(input_mask)[1]
    padded = tf.pad(values, [[0, 0], [0, width - tf.shape(values)[1]]],
                    constant_values=tf.cast(fill, values.dtype))
    return tf.where(input_mask > 0, padded, tf.cast(fill, values.dtype))


def one_piece_words(tokenizer, text: str) -> list[str]:
    """The words of `text` (letters only) that `tokenizer` turns into exactly one WordPiece."""
    words = ["".join(c for c in w if c.isalpha()) for w in text.split()]
    words = [w for w in words if w]
    return [w for w, ids in zip(words, tokenizer.encode(words)) if len(ids) == 1]


def warmup_texts(tokenizer, buckets: Sequence[int], segments: int, source: str,
                 first_at_most: int | None = None) -> list:
    """Per bucket, texts that pack to exactly that length: warmup requests for every bucket.

    Built from the words of `source` that are one WordPiece each (an out-of-vocabulary
    word is one [UNK]), so that "[CLS] a [SEP]" (or "[CLS] a [SEP] b [SEP]") fills the
    bucket; from the vocabulary's own whole words where `source` has none (a vocabulary
    that spells "deep" or "text" in several pieces, e.g. a small or non-English one).

    Args:
      tokenizer: the export's `data_prep.tokenization.BertTokenizer`.
      buckets: ascending lengths (`resolve`).
      segments: 1 (text) or 2 (pairs, question and context).
      source: text to take the words from.
      first_at_most: with 2 segments, the most WordPieces of the first (span QA's
        --max_query_length: a longer question is cut, and its request would run at a
        shorter bucket); the second takes the rest. None: half each.

    Returns:
      One list of `segments` strings per bucket.

    Raises:
      ExportError: neither `source` nor the vocabulary has such a word.
    """
    words = one_piece_words(tokenizer, source)
    if not words:
        whole = [t for t in tokenizer.vocab if t.isalpha() and not t.startswith("##")]
        words = one_piece_words(tokenizer, " ".join(whole[:1000]))
    if not words:
        raise ExportError("no word of the warmup text or of the vocabulary is a single "
                          "WordPiece of this vocabulary")

    def text(n, start=0):
        return " ".join(words[(start + i) % len(words)] for i in range(n))

    out = []
    for length in buckets:
        content = max(length - segments - 1, 0)
        first = content if segments == 1 else min(content // 2, first_at_most or content)
        out.append([text(first)] + ([text(content - first, first)] if segments == 2 else []))
    return out
