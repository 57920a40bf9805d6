"""Dropout: Keras' dropout layer with cheaper random decisions (TensorFlow, JAX)."""

import keras

from bert_keras import kernels

# Each element is decided by 16 random bits: a 32-bit random word serves two elements.
_LEVELS = 1 << 16


@keras.saving.register_keras_serializable(package="bert_keras")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with cheaper random decisions on TensorFlow and JAX.

    On a CPU the random numbers are the largest cost of dropout: Keras' TensorFlow path
    draws one 32-bit Philox output per element (a float32 uniform). BERT drops out the
    attention probabilities [B, N, S, S] and two [B, S, H] activations in every layer, and
    at the mini preset the random numbers took about 4% of a pretraining step. This layer
    draws 32-bit words and uses each half for one element: an element is dropped when its
    16 bits, read as an integer, are below round(rate * 65536). So the rate is
    rate' = round(rate * 65536) / 65536 (0.1 becomes 0.10000610) and kept elements are
    scaled by 1 / (1 - rate'), which keeps the expected value exact. The backward pass is
    one multiplication by the saved mask.

    On JAX each decision is a counter-based hash of (seed, element index), the one the
    fused attention kernel draws its decisions with (`bert_keras.flash_attention.
    dropout_keep`; kernel "dropout_hash"): integer arithmetic on an iota that XLA fuses
    into the mask's consumer. JAX's own bits (threefry) cost 5-10 ms of a BERT-base step
    on an H200, and 16-bit words from them were interleaved by a transpose (BUILD_NOTES
    8.10). There the rate in effect is round(rate * 2^24) / 2^24.

    Everything else is Keras' Dropout: arguments, config, seeding (one `SeedGenerator`,
    advanced once per call). With `noise_shape`, a rate below 2^-17 or of 1, another
    backend (torch, numpy), or the kernel turned off, the layer runs Keras' own dropout.

    Args:
      rate: float in [0, 1], the fraction of elements to drop.
      noise_shape, seed, **kwargs: as for `keras.layers.Dropout`.
    """

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        threshold = round(self.rate * _LEVELS)
        if self.noise_shape is not None or not 0 < threshold < _LEVELS:
            return super().call(inputs, training=training)
        if kernels.applies("dropout_hash"):
            return _dropout_hash(inputs, self.rate, self.seed_generator.next())
        if kernels.applies("dropout_16_bits"):
            return _dropout_16_bits(inputs, threshold, self.seed_generator.next())
        return super().call(inputs, training=training)


def _dropout_16_bits(inputs, threshold, seed):
    """Drops elements of `inputs` whose 16 random bits are < `threshold` (TensorFlow only).

    Args:
      inputs: float Tensor of any shape.
      threshold: Python int in (0, 65536).
      seed: int Tensor [2], from the layer's `SeedGenerator`.

    Returns:
      Tensor like `inputs`: zeros, or the input times 65536 / (65536 - threshold).
    """
    import tensorflow as tf

    # Keras keeps seed state in int64 variables; stateless ops want int32 (what Keras' own
    # TensorFlow random functions do).
    seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
    size = tf.size(inputs)
    words = tf.random.stateless_uniform(
        [(size + 1) // 2], seed=seed, dtype=tf.uint32, minval=None, maxval=None
    )
    halves = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size]  # [2 * words] -> [size]
    keep = tf.reshape(halves, tf.shape(inputs)) >= tf.constant(threshold, tf.uint16)
    scale = tf.constant(_LEVELS / (_LEVELS - threshold), inputs.dtype)
    mask = tf.where(keep, scale, tf.zeros([], inputs.dtype))
    return inputs * tf.stop_gradient(mask)


def _dropout_hash(inputs, rate, seed):
    """Drops elements of `inputs` by the hash's decisions (JAX only).

    Args:
      inputs: float Tensor of any shape.
      rate: Python float in (0, 1).
      seed: uint32 Tensor [2], from the layer's `SeedGenerator`.

    Returns:
      Tensor like `inputs`: zeros, or the input times 1 / (1 - rate').
    """
    import jax.numpy as jnp

    from bert_keras import flash_attention

    keep = flash_attention.dropout_keep(seed, inputs.shape, rate)
    scale = jnp.asarray(flash_attention.dropout_scale(rate), inputs.dtype)
    return jnp.where(keep, inputs * scale, jnp.zeros((), inputs.dtype))
