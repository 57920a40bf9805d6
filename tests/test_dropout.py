"""bert_keras.layers.Dropout: 16 random bits per element, checked against statistical bounds."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_keras.layers import Dropout

N = 1 << 20  # elements per draw: the binomial standard deviation of the drop rate is ~3e-4


def _draw(layer, shape=(N,), dtype="float32"):
    return layer(tf.ones(shape, dtype), training=True).numpy()


def test_drop_rate_and_scale_match_the_16_bit_rate():
    layer = Dropout(0.1, seed=3)
    effective = round(0.1 * 65536) / 65536  # 6554 / 65536 = 0.10000610
    y = _draw(layer)
    dropped = y == 0
    sigma = np.sqrt(effective * (1 - effective) / N)
    assert abs(dropped.mean() - effective) < 5 * sigma
    # Kept values are scaled so that the mean is exactly preserved in expectation.
    np.testing.assert_allclose(y[~dropped], 1 / (1 - effective), rtol=1e-7)
    assert abs(y.mean() - 1.0) < 5 * sigma / (1 - effective)


def test_the_two_halves_of_each_random_word_are_independent():
    """Elements 2i and 2i+1 share one 32-bit word: both dropped must be about rate^2 likely."""
    rate = 0.5  # pairs: 25% both dropped, 25% neither; a bug reusing one half gives 50%.
    y = _draw(Dropout(rate, seed=5)).reshape(-1, 2) == 0
    both = (y[:, 0] & y[:, 1]).mean()
    sigma = np.sqrt(0.25 * 0.75 / len(y))
    assert abs(both - 0.25) < 5 * sigma
    # Neighbouring words are independent too (pairs straddling two words).
    straddling = y.reshape(-1)[1:-1].reshape(-1, 2)
    assert abs((straddling[:, 0] & straddling[:, 1]).mean() - 0.25) < 5 * sigma


@pytest.mark.parametrize("rate", [0.03, 0.25, 0.9])
def test_other_rates(rate):
    effective = round(rate * 65536) / 65536
    y = _draw(Dropout(rate, seed=11))
    sigma = np.sqrt(effective * (1 - effective) / N)
    assert abs((y == 0).mean() - effective) < 5 * sigma


def test_seeding_inference_and_odd_shapes():
    x = tf.ones((3, 5, 7))  # an odd number of elements: the last word is half used
    a, b = Dropout(0.3, seed=1), Dropout(0.3, seed=1)
    first = a(x, training=True).numpy()
    np.testing.assert_array_equal(first, b(x, training=True).numpy())  # same seed, same mask
    assert not np.array_equal(first, a(x, training=True).numpy())  # the seed advances
    np.testing.assert_array_equal(a(x, training=False).numpy(), x.numpy())
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True).numpy(), x.numpy())
    assert (Dropout(1.0)(x, training=True).numpy() == 0).all()


def test_gradient_is_the_mask():
    layer = Dropout(0.2, seed=7)
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 33)).astype(np.float32))
    upstream = tf.constant(np.random.default_rng(1).normal(size=(4, 33)).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        total = tf.reduce_sum(upstream * y)
    mask = y.numpy() / x.numpy()  # 0 or the scale
    assert set(np.round(np.unique(mask), 5)) <= {0.0, round(65536 / (65536 - 13107), 5)}
    np.testing.assert_allclose(tape.gradient(total, x).numpy(), upstream.numpy() * mask,
                               rtol=1e-6)


def test_compiles_with_xla_and_runs_in_bfloat16():
    layer = Dropout(0.1, seed=2)
    compiled = tf.function(lambda x: layer(x, training=True), jit_compile=True)
    y = compiled(tf.ones((64, 129))).numpy()
    assert 0.03 < (y == 0).mean() < 0.2
    y16 = Dropout(0.1, dtype="mixed_bfloat16")(tf.ones((64, 128)), training=True)
    assert y16.dtype == tf.bfloat16 and 0.03 < float(tf.reduce_mean(tf.cast(y16 == 0, tf.float32))) < 0.2


def test_serializes_as_bert_keras_dropout():
    restored = keras.layers.deserialize(keras.layers.serialize(Dropout(0.1, seed=4)))
    assert type(restored) is Dropout and restored.rate == 0.1 and restored.seed == 4
