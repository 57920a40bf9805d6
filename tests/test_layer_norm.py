"""LayerNorm: Keras' LayerNormalization values, and gradients equal to its autodiff ones."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_keras.layers import LayerNorm


def _pair(shape, epsilon, seed=0, dtype=None):
    rng = np.random.default_rng(seed)
    ours = LayerNorm(epsilon=epsilon, dtype=dtype)
    ref = keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype)
    ours.build(shape)
    ref.build(shape)
    gamma = rng.normal(1.0, 0.3, shape[-1]).astype("float32")
    beta = rng.normal(0.0, 0.3, shape[-1]).astype("float32")
    for layer in (ours, ref):
        layer.set_weights([gamma, beta])
    # Rows with an offset and spread of their own, as a residual stream has.
    x = (rng.normal(size=shape) * rng.uniform(0.1, 5.0, shape[:-1] + (1,))
         + rng.normal(size=shape[:-1] + (1,)) * 3).astype("float32")
    return ours, ref, tf.constant(x)


def _values_and_grads(layer, x, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    grads = tape.gradient(loss, [x, *layer.trainable_variables])
    return y, grads


@pytest.mark.parametrize("shape", [(4, 7, 16), (5, 32), (2, 3, 4, 8)])
@pytest.mark.parametrize("epsilon", [1e-12, 1e-3])
def test_values_and_gradients_match_keras_autodiff(shape, epsilon):
    ours, ref, x = _pair(shape, epsilon)
    upstream = tf.constant(np.random.default_rng(1).normal(size=shape).astype("float32"))
    y, grads = _values_and_grads(ours, x, upstream)
    y_ref, grads_ref = _values_and_grads(ref, x, upstream)
    np.testing.assert_allclose(y.numpy(), y_ref.numpy(), rtol=1e-5, atol=1e-5)
    for g, g_ref, name in zip(grads, grads_ref, ("x", "gamma", "beta")):
        np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)


def test_gradient_matches_finite_differences():
    # Independent of Keras: central differences of the float64 formula.
    ours, _, x = _pair((3, 6), 1e-5, seed=2)
    upstream = np.random.default_rng(3).normal(size=(3, 6))
    _, (dx, _, _) = _values_and_grads(ours, x, tf.constant(upstream, tf.float32))
    gamma, beta = [w.astype("float64") for w in ours.get_weights()]

    def f(v):
        v = v.reshape(3, 6)
        mean = v.mean(-1, keepdims=True)
        y = (v - mean) / np.sqrt(((v - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta
        return float((y * upstream).sum())

    x64 = x.numpy().astype("float64").ravel()
    numeric = np.zeros_like(x64)
    for i in range(x64.size):
        step = np.zeros_like(x64)
        step[i] = 1e-6
        numeric[i] = (f(x64 + step) - f(x64 - step)) / 2e-6
    np.testing.assert_allclose(dx.numpy().ravel(), numeric, rtol=1e-3, atol=1e-3)


def test_mixed_precision_output_dtype_and_values():
    ours, ref, x = _pair((2, 5, 16), 1e-12, dtype="mixed_float16")
    y, y_ref = ours(tf.cast(x, tf.float16)), ref(tf.cast(x, tf.float16))
    assert y.dtype == tf.float16
    np.testing.assert_allclose(y.numpy(), y_ref.numpy(), atol=1e-2)


def test_other_settings_fall_back_to_keras_and_config_round_trips():
    x = tf.constant(np.random.default_rng(4).normal(size=(3, 4, 5)).astype("float32"))
    for kwargs in ({"axis": 1}, {"scale": False}, {"center": False}):
        ours, ref = LayerNorm(**kwargs), keras.layers.LayerNormalization(**kwargs)
        np.testing.assert_allclose(ours(x).numpy(), ref(x).numpy(), rtol=1e-6, atol=1e-6)
    layer = LayerNorm(epsilon=1e-12, name="ln")
    layer.build((None, 5))
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is LayerNorm and clone.epsilon == 1e-12
