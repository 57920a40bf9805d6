"""Optimizers: warmup + linear decay, weight-decay exclusions, clipping, accumulation."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY

from bert_keras import BertEncoder, BertPretrainer
from bert_keras.optimization import NO_DECAY_PATTERN, AdamW, WarmupLinearDecay, create_optimizer


def test_schedule_is_googles_warmup_then_linear_decay():
    schedule = WarmupLinearDecay(1e-3, num_train_steps=100, num_warmup_steps=10)
    lr = {s: float(schedule(s)) for s in (0, 5, 9, 10, 50, 99, 100, 150)}
    np.testing.assert_allclose(lr[0], 0.0)
    np.testing.assert_allclose(lr[5], 1e-3 * 5 / 10, rtol=1e-6)
    np.testing.assert_allclose(lr[9], 1e-3 * 9 / 10, rtol=1e-6)
    np.testing.assert_allclose(lr[10], 1e-3 * (1 - 10 / 100), rtol=1e-6)
    np.testing.assert_allclose(lr[50], 1e-3 * 0.5, rtol=1e-6)
    np.testing.assert_allclose(lr[99], 1e-3 * 0.01, rtol=1e-5)
    assert lr[100] == 0.0 and lr[150] == 0.0


def test_schedule_counts_updates_under_gradient_accumulation():
    schedule = WarmupLinearDecay(1e-3, num_train_steps=100, num_warmup_steps=10,
                                 gradient_accumulation_steps=4)
    plain = WarmupLinearDecay(1e-3, num_train_steps=100, num_warmup_steps=10)
    # Micro-batches 20..23 belong to update 5.
    for micro in (20, 21, 23):
        np.testing.assert_allclose(float(schedule(micro)), float(plain(5)), rtol=1e-6)


def test_schedule_serializes():
    schedule = WarmupLinearDecay(2e-4, 1000, 100, 2)
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert isinstance(restored, WarmupLinearDecay)
    assert restored.get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="num_warmup_steps"):
        WarmupLinearDecay(1e-4, 10, 11)


def test_optimizer_settings():
    adamw = create_optimizer(1e-4, 100, 10)
    assert isinstance(adamw, keras.optimizers.AdamW)
    assert adamw.epsilon == 1e-6 and adamw.global_clipnorm == 1.0
    assert adamw.weight_decay == 0.01 and adamw.gradient_accumulation_steps is None
    lamb = create_optimizer(1e-4, 100, 10, optimizer="lamb", gradient_accumulation_steps=2)
    assert isinstance(lamb, keras.optimizers.Lamb) and lamb.gradient_accumulation_steps == 2
    with pytest.raises(ValueError, match="optimizer must be one of"):
        create_optimizer(1e-4, 100, optimizer="sgd")


def _decayed_variables(optimizer_name):
    """Paths of the pretrainer's variables that one update with zero gradients changes.

    With zero gradients Adam's and LAMB's steps are exactly zero, so the only change left is
    the decoupled weight decay: var *= 1 - lr * weight_decay.
    """
    model = BertPretrainer(BertEncoder(**TINY))
    # No warmup: the first update already uses the peak rate.
    optimizer = create_optimizer(0.1, num_train_steps=10, num_warmup_steps=0,
                                 optimizer=optimizer_name, weight_decay=0.5)
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    # Non-zero values everywhere, so decay is visible on biases and LN betas too.
    for v in model.trainable_variables:
        v.assign(np.full(v.shape, 0.5, np.float32))
    zeros = [np.zeros(v.shape, np.float32) for v in model.trainable_variables]
    optimizer.apply_gradients(zip(zeros, model.trainable_variables))
    decayed = set()
    for v in model.trainable_variables:
        value = v.numpy()
        if np.allclose(value, 0.5 * (1 - 0.1 * 0.5)):
            decayed.add(v.path)
        else:
            np.testing.assert_array_equal(value, 0.5, err_msg=v.path)
    return decayed, set(before)


@pytest.mark.parametrize("optimizer_name", ["adamw", "lamb"])
def test_weight_decay_skips_layer_norm_and_biases(optimizer_name):
    decayed, all_paths = _decayed_variables(optimizer_name)
    leaf = {path: path.rsplit("/", 1)[-1] for path in all_paths}
    expected = {p for p, name in leaf.items() if name in ("kernel", "word_embeddings",
                                                          "position_embeddings",
                                                          "token_type_embeddings")}
    assert decayed == expected
    # Spelled out, so a rename that silently changes the rule shows up here.
    excluded = all_paths - decayed
    assert {leaf[p] for p in excluded} == {"gamma", "beta", "bias", "output_bias"}
    assert "masked_lm/output_bias" in excluded
    assert "embeddings/layer_norm/gamma" in excluded and "embeddings/layer_norm/beta" in excluded
    assert "transformer_layer_0/attention_layer_norm/beta" in excluded
    assert "embeddings/word_embeddings" in decayed and "nsp_dense/kernel" in decayed
    assert "transformer_layer_2/self_attention/query/kernel" in decayed


def test_global_clipnorm_bounds_the_update_direction():
    """A gradient of norm 500 is clipped to global norm 1 before Adam's first moment."""
    var = keras.Variable(np.zeros((3,), np.float32), name="kernel")
    optimizer = create_optimizer(1.0, num_train_steps=10, weight_decay=0.0)
    optimizer.build([var])
    optimizer.apply_gradients([(np.array([300.0, 400.0, 0.0], np.float32), var)])
    (momentum,) = [v for v in optimizer.variables if "momentum" in v.path]
    m = momentum.numpy()
    # m = (1 - beta_1) * clipped gradient, and the clipped gradient is [0.6, 0.8, 0].
    np.testing.assert_allclose(m, 0.1 * np.array([0.6, 0.8, 0.0]), rtol=1e-5)


def test_gradient_accumulation_updates_every_k_micro_batches():
    var = keras.Variable(np.ones((2,), np.float32), name="kernel")
    optimizer = create_optimizer(0.1, num_train_steps=10, weight_decay=0.0,
                                 gradient_accumulation_steps=3)
    grad = np.array([0.1, -0.1], np.float32)
    values = []
    for _ in range(6):
        optimizer.apply_gradients([(grad, var)])
        values.append(var.numpy().copy())
    np.testing.assert_array_equal(values[0], 1.0)
    np.testing.assert_array_equal(values[1], 1.0)
    assert not np.allclose(values[2], 1.0)  # First update after 3 micro-batches.
    np.testing.assert_array_equal(values[3], values[2])
    assert int(optimizer.iterations) == 2


def _run_adamw(optimizer_class, jit_compile, steps=4, betas=(0.9, 0.999)):
    """Trains three variables `steps` times with fixed gradients; returns their values.

    The gradients are large enough to be clipped on the first steps and not later, one is
    IndexedSlices (an embedding lookup's), and the bias is excluded from weight decay.
    """
    rng = np.random.default_rng(0)
    variables = [keras.Variable(rng.normal(size=shape).astype(np.float32), name=name)
                 for shape, name in [((5, 3), "kernel"), ((3,), "bias"), ((6, 3), "table")]]
    optimizer = optimizer_class(
        learning_rate=WarmupLinearDecay(0.05, num_train_steps=10, num_warmup_steps=2),
        weight_decay=0.1, beta_1=betas[0], beta_2=betas[1], epsilon=1e-6, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    optimizer.build(variables)
    scales = [3.0, 1.0, 0.1, 0.01]

    @tf.function(jit_compile=jit_compile)
    def step(scale):
        grads = [tf.constant(rng_grad) * scale for rng_grad in dense_grads[:2]]
        grads.append(tf.IndexedSlices(tf.constant(dense_grads[2][:2]) * scale,
                                      tf.constant([4, 1]), tf.constant([6, 3])))
        optimizer.apply_gradients(zip(grads, variables))

    dense_grads = [rng.normal(size=v.shape).astype(np.float32) for v in variables]
    for i in range(steps):
        step(tf.constant(scales[i % len(scales)]))
    return [v.numpy() for v in variables] + [v.numpy() for v in optimizer.variables]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_fused_adamw_equals_keras_adamw(jit_compile):
    """bert_keras' AdamW (TensorFlow's fused Adam kernel) against keras.optimizers.AdamW.

    With betas exact in float32 (1 - 2^-3, 1 - 2^-10) the two agree to rounding. With
    BERT's 0.9 and 0.999 they differ by up to ~1e-4 relative after a few steps, and both
    are right: Keras forms 1 - beta_2 in double precision (0.001 exactly) while the kernel
    forms it from float32(0.999), 1.3e-5 away in relative terms, and that difference in
    the second moment's rate is what shows (tf.keras' Adam used the same kernel).
    """
    exact_betas = (0.875, 1 - 2 ** -10)
    ours = _run_adamw(AdamW, jit_compile, betas=exact_betas)
    keras_values = _run_adamw(keras.optimizers.AdamW, jit_compile=False, betas=exact_betas)
    assert len(ours) == len(keras_values)
    for a, b in zip(ours, keras_values):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
    # The variables did move: four updates of about lr each.
    start = _run_adamw(AdamW, jit_compile=False, steps=0)
    assert all(np.abs(a - b).max() > 1e-3 for a, b in zip(ours[:3], start[:3]))
    for a, b in zip(_run_adamw(AdamW, jit_compile), _run_adamw(keras.optimizers.AdamW, False)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


def test_create_optimizer_gives_the_fused_adamw_and_it_serializes():
    optimizer = create_optimizer(1e-4, 100, 10)
    assert type(optimizer) is AdamW
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is AdamW and restored.weight_decay == 0.01
