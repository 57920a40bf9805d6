"""Activations: the exact GELU with its written-out derivative against Keras' autodiff."""

import keras
import numpy as np
import tensorflow as tf

from bert_keras.layers.activations import gelu, get_activation


def test_gelu_values_and_gradient_equal_keras_erf_gelu():
    rng = np.random.default_rng(0)
    x = tf.constant(np.concatenate([np.linspace(-12, 12, 2001), rng.normal(size=999) * 3])
                    .astype(np.float32))
    upstream = tf.constant(rng.normal(size=x.shape).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours = gelu(x)
        reference = keras.ops.gelu(x, approximate=False)
        ours_sum, reference_sum = (tf.reduce_sum(upstream * y) for y in (ours, reference))
    np.testing.assert_allclose(ours.numpy(), reference.numpy(), atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(ours_sum, x).numpy(),
                               tape.gradient(reference_sum, x).numpy(), atol=1e-6, rtol=1e-6)
    # Hand-computed points: GELU(0) = 0, GELU'(0) = 1/2, GELU(1) = Phi(1), GELU'(1) = Phi(1) + phi(1).
    at = tf.constant([0.0, 1.0])
    with tf.GradientTape() as tape:
        tape.watch(at)
        y = gelu(at)
    np.testing.assert_allclose(y.numpy(), [0.0, 0.8413447], rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(y, at).numpy(), [0.5, 0.8413447 + 0.2419707],
                               rtol=1e-6)
    assert get_activation("gelu") is gelu
