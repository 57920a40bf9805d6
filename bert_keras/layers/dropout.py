"""Dropout: Keras' dropout layer with half the random bits per element (TensorFlow, JAX)."""

import keras

from bert_keras import kernels

# Each element is decided by 16 random bits: a 32-bit random word serves two elements.
_LEVELS = 1 << 16


@keras.saving.register_keras_serializable(package="bert_keras")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` that draws 16 random bits per element, not 32 (TensorFlow, JAX).

    On a CPU the random numbers are the largest cost of dropout: Keras' TensorFlow path
    draws one 32-bit Philox output per element (a float32 uniform). BERT drops out the
    attention probabilities [B, N, S, S] and two [B, S, H] activations in every layer, and
    at the mini preset the random numbers took about 4% of a pretraining step. This layer
    draws 32-bit words and uses each half for one element: an element is dropped when its
    16 bits, read as an integer, are below round(rate * 65536). So the rate is
    rate' = round(rate * 65536) / 65536 (0.1 becomes 0.10000610) and kept elements are
    scaled by 1 / (1 - rate'), which keeps the expected value exact. The backward pass is
    one multiplication by the saved mask.

    On JAX the bits come from `jax.random.bits(seed, shape, uint16)`: JAX's default
    generator (threefry) makes 32-bit words and splits them, so that is half the generator
    work of Keras' `jax.random.bernoulli`, which draws a 32-bit uniform per element. BERT
    draws about 1.2 billion dropout decisions per BERT-base step at batch 256 (the
    attention probabilities alone are [256, 12, 128, 128] per layer), which an accelerator
    computes with integer arithmetic.

    Everything else is Keras' Dropout: arguments, config, seeding (one `SeedGenerator`,
    advanced once per call). With `noise_shape`, a rate below 2^-17 or of 1, or another
    backend (torch, numpy), the layer runs Keras' own dropout unchanged.

    Args:
      rate: float in [0, 1], the fraction of elements to drop.
      noise_shape, seed, **kwargs: as for `keras.layers.Dropout`.
    """

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        threshold = round(self.rate * _LEVELS)
        if (
            self.noise_shape is not None
            or not 0 < threshold < _LEVELS
            or not kernels.applies("dropout_16_bits")
        ):
            return super().call(inputs, training=training)
        dropout = _SIXTEEN_BIT_DROPOUT[keras.backend.backend()]
        return dropout(inputs, threshold, self.seed_generator.next())


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


def _dropout_16_bits_jax(inputs, threshold, seed):
    """`_dropout_16_bits` on JAX: the same rule, bits from `jax.random.bits` (uint32[2] seed)."""
    import jax
    import jax.numpy as jnp

    halves = jax.random.bits(seed, inputs.shape, dtype=jnp.uint16)
    scale = jnp.asarray(_LEVELS / (_LEVELS - threshold), inputs.dtype)
    return jax.lax.select(halves >= threshold, inputs * scale, jnp.zeros_like(inputs))


# The 16-bit path of each backend that has one (kernels.KERNELS["dropout_16_bits"]).
_SIXTEEN_BIT_DROPOUT = {"tensorflow": _dropout_16_bits, "jax": _dropout_16_bits_jax}
