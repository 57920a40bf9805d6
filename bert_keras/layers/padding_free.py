"""Padding-free training: the encoder's dense layers on real tokens only.

A batch of B sequences padded to S positions holds T <= B * S real tokens (input_mask 1).
Every projection, feed-forward layer, LayerNorm and dropout of a BERT layer works on each
token independently, so those can run on the T real rows alone; only attention mixes
positions, and it runs on the padded [B, N, S, S] layout as usual. Padded keys get zero
attention weight (the -10000 mask underflows to exactly 0 after the softmax), so real
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
"""

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
