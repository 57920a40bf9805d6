"""In-graph BERT input packing for exports: core TensorFlow ops only.

Stock TF Serving links tensorflow-text 2.12.1, which lacks `TFText>RoundRobinTrim`
(what tensorflow_text.RoundRobinTrimmer and keras-hub's MultiSegmentPacker emit), so the
packing here is written with core ragged ops. It implements the same truncation as
Google's run_classifier.py `_truncate_seq_pair` (and `data_prep.packing.truncate_pair`):
pop from the end of the longer segment, B on ties, until the pair fits. Popping one at a
time ends in a closed form, which is what the graph computes for a whole batch at once:

    T = seq_length - 3,  a' = min(la, max(T - lb, ceil(T / 2))),  b' = min(lb, T - a')

Shapes: B = batch, S = seq_length, ragged rows are token ids.
"""

from __future__ import annotations

import tensorflow as tf

from data_prep import schema


def keep_first(ragged: tf.RaggedTensor, lengths: tf.Tensor) -> tf.RaggedTensor:
    """Keeps the first lengths[i] items of row i of a ragged-rank-1 `ragged`.

    A gather of each row's first items, not a mask: comparing a ragged tensor with a dense
    one (`tf.ragged.boolean_mask(ragged, positions < lengths[:, None])`) broadcasts through
    DynamicRaggedShape, which took 0.35 s to trace against 0.015 s here, and the exports
    trace this in every packing function (BUILD_NOTES 2, "Export and serving").
    """
    splits = ragged.row_splits
    kept = tf.minimum(tf.cast(lengths, splits.dtype), ragged.row_lengths())
    starts = ragged.row_starts()
    index = tf.ragged.range(starts, starts + kept, dtype=splits.dtype)
    return tf.RaggedTensor.from_row_splits(tf.gather(ragged.values, index.values),
                                           index.row_splits, validate=False)


def truncated_lengths(len_a: tf.Tensor, len_b: tf.Tensor | None, budget):
    """Lengths kept of A (and B) so that they fit `budget` tokens, fairly.

    Args:
      len_a: int64 [B], lengths of the first segments.
      len_b: int64 [B] or None for single segments.
      budget: tokens available for content (S - 2 or S - 3): a Python int or an int scalar.

    Returns:
      (kept_a, kept_b) int64 [B] each; kept_b is None for single segments.
    """
    budget = tf.cast(budget, tf.int64)
    if len_b is None:
        return tf.minimum(len_a, budget), None
    half_up = (budget + 1) // 2
    kept_a = tf.minimum(len_a, tf.maximum(budget - len_b, half_up))
    kept_b = tf.minimum(len_b, budget - kept_a)
    return kept_a, kept_b


def bert_pack_inputs(segments, seq_length, cls_id: int, sep_id: int, pad_id: int = 0):
    """Packs one or two batches of token ids as "[CLS] A [SEP] (B [SEP])", padded to S.

    Args:
      segments: a list of one or two int RaggedTensors [B, None] of token ids, or
        [B, (words), (pieces)] as `tokenize` returns them (words are merged); no specials.
      seq_length: S, the fixed output length (at least one token's room: 3 for one
        segment, 4 for two, where truncation leaves the second no token): a
        Python int (static output shape), or an int32 scalar Tensor (TF Hub's
        `bert_pack_inputs(segments, seq_length=...)`).
      cls_id, sep_id, pad_id: special-token ids from the vocabulary.

    Returns:
      dict of int32 Tensors [B, S]: input_word_ids, input_mask, input_type_ids.
    """
    if len(segments) not in (1, 2):
        raise ValueError(f"bert_pack_inputs takes 1 or 2 segments. Received: {len(segments)}")
    specials = len(segments) + 1
    if isinstance(seq_length, int):
        if seq_length < specials + 1:
            raise ValueError(f"seq_length={seq_length} leaves no room for text with "
                             f"{len(segments)} segment(s)")
        length = tf.constant(seq_length, tf.int64)
        checks = []
    else:
        length = tf.cast(seq_length, tf.int64)
        checks = [tf.debugging.assert_greater_equal(
            length, tf.constant(specials + 1, tf.int64),
            message=f"seq_length leaves no room for text with {len(segments)} segment(s)")]
    segments = [s.merge_dims(1, -1) if s.ragged_rank > 1 else s for s in segments]
    segments = [tf.cast(s, tf.int32) for s in segments]
    a = segments[0]
    b = segments[1] if len(segments) == 2 else None
    with tf.control_dependencies(checks):
        kept_a, kept_b = truncated_lengths(
            a.row_lengths(), None if b is None else b.row_lengths(), length - specials)
    # Placed on a dense [B, S] grid, not concatenated: `tf.concat` of ragged rows adds eight
    # asserts (sixteen cond branches in the SavedModel) per packing and runs them on every
    # request (BUILD_NOTES 2, "Export and serving"). Layout: [CLS] at 0, A at 1..ka, [SEP]
    # at ka+1, B at ka+2..ka+kb+1, [SEP] at ka+kb+2, padding after.
    batch = a.nrows()
    shape = tf.stack([batch, length])
    position = tf.range(length)[None, :]  # [1, S]

    def placed(tokens, kept, first):
        """Row i's first kept[i] tokens at positions first[i], first[i] + 1, ... ([B, S])."""
        dense = keep_first(tokens, kept).to_tensor(default_value=pad_id, shape=shape)
        index = tf.broadcast_to(tf.clip_by_value(position - first, 0, length - 1), shape)
        return tf.gather(dense, index, batch_dims=1)

    sep_a = kept_a[:, None] + 1  # [B, 1]
    ids = tf.where(position < sep_a, placed(a, kept_a, 1), sep_id)
    ids = tf.where(position == 0, cls_id, ids)
    last = sep_a
    type_ids = tf.zeros_like(ids)
    if b is not None:
        sep_b = sep_a + 1 + kept_b[:, None]
        in_b = position > sep_a
        ids = tf.where(in_b, tf.where(position < sep_b, placed(b, kept_b, sep_a + 1), sep_id), ids)
        type_ids = tf.cast(in_b & (position <= sep_b), tf.int32)
        last = sep_b
    mask = position <= last
    return {
        schema.INPUT_WORD_IDS: tf.where(mask, ids, pad_id),
        schema.MODEL_INPUT_MASK: tf.cast(mask, tf.int32),
        schema.INPUT_TYPE_IDS: type_ids,
    }
