"""Padding-free training: the encoder's dense layers on real tokens only.

A batch of B sequences padded to S positions holds T <= B * S real tokens (input_mask 1).
Every projection, feed-forward layer, LayerNorm and dropout of a BERT layer works on each
token independently, so those can run on the T real rows alone; only attention mixes
positions, and it runs on the padded [B, N, S, S] layout as usual. Padded keys get zero
attention weight (the mask's addend underflows to exactly 0 after the softmax), so real
tokens never read a padded row: their outputs, the loss and every gradient are those of
the padded computation. Rows of padding come out as zeros instead of the values the
padded computation gives them, which nothing downstream reads when the loss ignores
padding (tagging: label -1; classification: [CLS] only).

With S = 64 and sentences of 25 tokens on average (Brown POS), the matrix products of a
training step shrink to about 40% (BUILD_NOTES.md section 8.5). A batch with no padding
pays the gathers and scatters for nothing (about 4% of a MiniLM step); choosing per batch
with a `tf.cond` cost more than that on Brown POS: ~120 MB of memory, 15% slower steps.
NVIDIA's FasterTransformer ("remove padding") and Graphcore's packed BERT do the same for
inference and pretraining.

TensorFlow only, and not under XLA (TPUs, `jit_compile=True`), which wants static shapes:
there `padding_free_applies` says no and the layers run padded.

Shapes: B = batch, S = sequence length, H = hidden size, T = real tokens in the batch.

Inference at a fixed capacity (any backend; `BertEncoder.call_on_real_tokens`): where
shapes must be static (JAX, XLA), the caller states how many rows C >= T to run, a Python
int it reads off the mask on the host (`row_capacity`; a few distinct values keep the
compilations few). `packed_rows` then lays the batch out as C rows, with gathers only:
`rows` picks each real token's row of the flattened batch (the C - T spare rows repeat row
0 and are never read back), and `slots` maps each of the B * S positions to its row in the
packed layout (padding reads row 0: a masked key, whatever it holds). Attention reads the
padded layout through `slots` and returns through `rows`.
"""

import math

from keras import ops

from bert_keras import kernels


def padding_free_applies(training, attention_mask) -> bool:
    """Whether a layer called with these arguments should run padding-free.

    True in training, on the TensorFlow backend, with a mask, and outside XLA (the trace
    of a `jit_compile` function or a TPU step, whose shapes must be static).
    """
    if not training or attention_mask is None:
        return False
    return kernels.applies("padding_free")


def real_rows(attention_mask):
    """Indices of the real tokens in the flattened batch.

    Args:
      attention_mask: int or float Tensor [B, S], nonzero for real tokens.

    Returns:
      int32 Tensor [T], ascending indices into B * S.
    """
    import tensorflow as tf

    flat = tf.reshape(attention_mask, [-1])
    return tf.cast(tf.where(tf.not_equal(flat, tf.zeros([], flat.dtype)))[:, 0], tf.int32)


def gather_rows(x, rows):
    """Rows `rows` of x: [N, H] -> [T, H]; the gradient scatters back (dense, not slices)."""
    import tensorflow as tf

    @tf.custom_gradient
    def gather(x):
        def grad(upstream):
            return _scatter(upstream, rows, tf.shape(x, out_type=tf.int32)[0])

        return tf.gather(x, rows), grad

    return gather(x)


def scatter_rows(values, rows, num_rows):
    """[T, H] -> [N, H] with values[i] at row rows[i] and zeros elsewhere (inverse of
    `gather_rows`; the gradient gathers)."""
    import tensorflow as tf

    @tf.custom_gradient
    def scatter(values):
        def grad(upstream):
            return tf.gather(upstream, rows)

        return _scatter(values, rows, num_rows), grad

    return scatter(values)


def _scatter(values, rows, num_rows):
    import tensorflow as tf

    shape = tf.concat([[num_rows], tf.shape(values, out_type=tf.int32)[1:]], axis=0)
    return tf.scatter_nd(rows[:, None], values, shape)


def row_capacity(input_mask, multiple=1):
    """The rows C to run a batch at: its real tokens rounded up to `multiple`, at most B * S.

    Host side (numpy or anything `numpy.asarray` takes), before the computation is traced:
    C is a static shape. A larger `multiple` gives fewer distinct C (fewer compilations)
    and more spare rows.

    Args:
      input_mask: [B, S], nonzero for real tokens.
      multiple: positive int.

    Returns:
      Python int C, T <= C <= B * S (C >= 1).
    """
    import numpy as np

    if not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"row_capacity: multiple must be a positive int, got {multiple!r}")
    mask = np.asarray(input_mask)
    if mask.ndim != 2:
        raise ValueError(f"row_capacity: input_mask must be [batch, seq_length], got shape "
                         f"{mask.shape}")
    real = int(np.count_nonzero(mask))
    return max(1, min(mask.size, multiple * math.ceil(real / multiple)))


def packed_rows(attention_mask, capacity):
    """The real tokens of a batch as `capacity` rows (inference at a static shape).

    Args:
      attention_mask: int Tensor [B, S] with static B and S, nonzero for real tokens.
      capacity: Python int C, 1 <= C <= B * S (`row_capacity`).

    Returns:
      (rows, slots, overflow):
        rows: int32 [C], the flattened-batch index of each real token, ascending, then 0
          for the C - T spare rows;
        slots: int32 [B * S], each position's row among the C (0 at padding);
        overflow: bool scalar, T > C (the rows beyond C are lost: callers poison their
          outputs with it, as a traced computation cannot raise).
    """
    batch_size, seq_length = attention_mask.shape
    if batch_size is None or seq_length is None:
        raise ValueError(f"packed_rows needs a static [batch, seq_length] mask, got "
                         f"{tuple(attention_mask.shape)}")
    num_rows = batch_size * seq_length
    if not isinstance(capacity, int) or not 1 <= capacity <= num_rows:
        raise ValueError(f"capacity must be an int in [1, {num_rows}] (batch x seq_length), "
                         f"got {capacity!r}")
    real = ops.cast(ops.not_equal(ops.reshape(attention_mask, (-1,)), 0), "int32")  # [N]
    index = ops.arange(num_rows, dtype="int32")
    # Real tokens first (ascending), then padding: sort keys i or N + i.
    order = ops.sort(ops.where(real > 0, index, index + num_rows))[:capacity]
    rows = ops.where(order < num_rows, order, ops.zeros_like(order))
    # Clipped to C - 1: on overflow, positions past the C rows read the last one (poisoned).
    slots = ops.minimum(ops.where(real > 0, ops.cumsum(real) - 1, ops.zeros_like(real)),
                        capacity - 1)
    overflow = ops.sum(real) > capacity
    return rows, slots, overflow
