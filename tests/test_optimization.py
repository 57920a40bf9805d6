"""Optimizers: warmup + linear decay, weight-decay exclusions, clipping, accumulation."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY

from bert_keras import BertEncoder, BertPretrainer
from bert_keras.optimization import (NO_DECAY_PATTERN, AdamW, KerasLamb, Lamb, WarmupLinearDecay,
                                     clip_by_true_global_norm, create_optimizer,
                                     true_global_norm)


def test_schedule_google_is_googles_warmup_then_linear_decay_from_step_0():
    schedule = WarmupLinearDecay(1e-3, num_train_steps=100, num_warmup_steps=10,
                                 decay="google")
    lr = {s: float(schedule(s)) for s in (0, 5, 9, 10, 50, 99, 100, 150)}
    np.testing.assert_allclose(lr[0], 0.0)
    np.testing.assert_allclose(lr[5], 1e-3 * 5 / 10, rtol=1e-6)
    np.testing.assert_allclose(lr[9], 1e-3 * 9 / 10, rtol=1e-6)
    np.testing.assert_allclose(lr[10], 1e-3 * (1 - 10 / 100), rtol=1e-6)
    np.testing.assert_allclose(lr[50], 1e-3 * 0.5, rtol=1e-6)
    np.testing.assert_allclose(lr[99], 1e-3 * 0.01, rtol=1e-5)
    assert lr[100] == 0.0 and lr[150] == 0.0


def test_schedule_linear_is_warmup_to_the_peak_then_linear_decay_to_0():
    """The default: transformers' get_linear_schedule_with_warmup, written out by hand."""
    schedule = WarmupLinearDecay(1e-3, num_train_steps=100, num_warmup_steps=10)
    assert schedule.decay == "linear"
    for s in (0, 5, 9, 10, 11, 50, 99, 100, 150):
        expected = 1e-3 * (s / 10 if s < 10 else max(0.0, (100 - s) / (100 - 10)))
        np.testing.assert_allclose(float(schedule(s)), expected, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(float(schedule(10)), 1e-3, rtol=1e-6)  # The peak is reached.
    no_warmup = WarmupLinearDecay(2e-3, num_train_steps=8)
    np.testing.assert_allclose([float(no_warmup(s)) for s in range(9)],
                               [2e-3 * (8 - s) / 8 for s in range(9)], rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match="decay must be one of"):
        WarmupLinearDecay(1e-3, 10, decay="cosine")


def test_schedule_counts_updates_under_gradient_accumulation():
    for decay in ("linear", "google"):
        schedule = WarmupLinearDecay(1e-3, num_train_steps=100, num_warmup_steps=10,
                                     gradient_accumulation_steps=4, decay=decay)
        plain = WarmupLinearDecay(1e-3, num_train_steps=100, num_warmup_steps=10, decay=decay)
        # Micro-batches 20..23 belong to update 5, 60..63 to update 15.
        for micro, update in ((20, 5), (21, 5), (23, 5), (60, 15), (63, 15)):
            np.testing.assert_allclose(float(schedule(micro)), float(plain(update)), rtol=1e-6)


def test_schedule_serializes():
    for decay in ("linear", "google"):
        schedule = WarmupLinearDecay(2e-4, 1000, 100, 2, decay=decay)
        restored = keras.optimizers.schedules.deserialize(
            keras.optimizers.schedules.serialize(schedule))
        assert isinstance(restored, WarmupLinearDecay)
        assert restored.get_config() == schedule.get_config()
    # Saved before the option existed: Google's curve, as it was then.
    old = {"peak_learning_rate": 1e-4, "num_train_steps": 10, "num_warmup_steps": 2,
           "gradient_accumulation_steps": 1}
    assert WarmupLinearDecay.from_config(old).decay == "google"
    with pytest.raises(ValueError, match="num_warmup_steps"):
        WarmupLinearDecay(1e-4, 10, 11)


def test_optimizer_settings():
    adamw = create_optimizer(1e-4, 100, 10)
    assert isinstance(adamw, keras.optimizers.AdamW)
    assert adamw.epsilon == 1e-6 and adamw.global_clipnorm == 1.0
    assert adamw.weight_decay == 0.01 and adamw.gradient_accumulation_steps is None
    assert adamw.epsilon_placement == "adam_paper"
    assert adamw._learning_rate.decay == "linear"
    google = create_optimizer(1e-4, 100, 10, lr_schedule="google", epsilon_placement="keras")
    assert google._learning_rate.decay == "google" and google.epsilon_placement == "keras"
    lamb = create_optimizer(1e-4, 100, 10, optimizer="lamb", gradient_accumulation_steps=2)
    assert type(lamb) is Lamb and lamb.gradient_accumulation_steps == 2
    assert lamb.global_clipnorm == 1.0 and lamb.epsilon == 1e-6
    keras_lamb = create_optimizer(1e-4, 100, 10, optimizer="keras_lamb")
    assert type(keras_lamb) is KerasLamb and isinstance(keras_lamb, keras.optimizers.Lamb)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        create_optimizer(1e-4, 100, optimizer="sgd")
    with pytest.raises(ValueError, match="epsilon_placement must be one of"):
        create_optimizer(1e-4, 100, epsilon_placement="torch")
    for optimizer in (lamb, keras_lamb, google):
        restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        assert type(restored) is type(optimizer)
        assert restored.get_config() == optimizer.get_config()


def _decayed_variables(optimizer_name, reloaded=False):
    """Paths of the pretrainer's variables that one update with zero gradients changes.

    With zero gradients Adam's steps are exactly zero, so the only change left is the weight
    decay: var *= 1 - lr * weight_decay (AdamW, Keras' LAMB). In published LAMB the update
    is then weight_decay * var alone, which the trust ratio ||var|| / ||update|| scales to
    var: var *= 1 - lr.
    """
    model = BertPretrainer(BertEncoder(**TINY))
    # No warmup: the first update already uses the peak rate.
    optimizer = create_optimizer(0.1, num_train_steps=10, num_warmup_steps=0,
                                 optimizer=optimizer_name, weight_decay=0.5)
    if reloaded:  # as keras.models.load_model rebuilds a saved model's optimizer
        optimizer = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    # Non-zero values everywhere, so decay is visible on biases and LN betas too.
    for v in model.trainable_variables:
        v.assign(np.full(v.shape, 0.5, np.float32))
    zeros = [np.zeros(v.shape, np.float32) for v in model.trainable_variables]
    optimizer.apply_gradients(zip(zeros, model.trainable_variables))
    decayed = set()
    factor = 1 - 0.1 if optimizer_name == "lamb" else 1 - 0.1 * 0.5
    for v in model.trainable_variables:
        value = v.numpy()
        if np.allclose(value, 0.5 * factor, rtol=1e-6):
            decayed.add(v.path)
        else:
            np.testing.assert_array_equal(value, 0.5, err_msg=v.path)
    return decayed, set(before)


@pytest.mark.parametrize("reloaded", [False, True])
@pytest.mark.parametrize("optimizer_name", ["adamw", "lamb", "keras_lamb"])
def test_weight_decay_skips_layer_norm_and_biases(optimizer_name, reloaded):
    """Also for an optimizer rebuilt from its config, as a model saved with its optimizer
    reloads to train further: before, the exclusions were not in the config, and the
    reloaded optimizer decayed LayerNorm and biases (LAMB adapted their trust ratio)."""
    decayed, all_paths = _decayed_variables(optimizer_name, reloaded)
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


def test_true_global_norm_sums_duplicate_slices_first():
    """An embedding lookup's gradient: id 3 twice. Its norm is the dense gradient's."""
    rng = np.random.default_rng(1)
    # Positive rows, so the duplicates add up (as a token's gradients mostly do).
    values = np.abs(rng.normal(size=(5, 4))).astype(np.float32)
    indices = np.array([3, 0, 3, 6, 0], np.int32)
    dense = np.zeros((7, 4), np.float32)
    np.add.at(dense, indices, values)
    other = rng.normal(size=(2, 3)).astype(np.float32)
    expected = np.sqrt((dense.astype(np.float64) ** 2).sum() + (other ** 2).sum())
    slices = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([7, 4]))

    @tf.function(jit_compile=True)
    def xla_norm(v, i):
        return true_global_norm([tf.IndexedSlices(v, i, tf.constant([7, 4])), other])

    np.testing.assert_allclose(float(true_global_norm([slices, other])), expected, rtol=1e-6)
    np.testing.assert_allclose(float(xla_norm(values, indices)), expected, rtol=1e-6)
    # The slices as they come (Keras' global_clipnorm, tf.linalg.global_norm) differ.
    unaggregated = np.sqrt((values.astype(np.float64) ** 2).sum() + (other ** 2).sum())
    assert abs(unaggregated - expected) > 0.05 * expected
    empty = tf.IndexedSlices(tf.zeros((0, 4)), tf.zeros((0,), tf.int32), tf.constant([7, 4]))
    np.testing.assert_allclose(float(true_global_norm([empty, other])),
                               np.sqrt((other ** 2).sum()), rtol=1e-6)
    clipped_slices, clipped_other = clip_by_true_global_norm([slices, other], 1.0)
    assert isinstance(clipped_slices, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(clipped_slices).numpy(), dense / expected,
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(clipped_other.numpy(), other / expected, rtol=1e-5)
    # Below the clip norm nothing changes.
    same = clip_by_true_global_norm([other], 100.0)[0]
    np.testing.assert_array_equal(same.numpy(), other)


def _reference_steps(optimizer_name, placement, w0, grads, lrs, wd, decays, eps=1e-3,
                     betas=(0.9, 0.999)):
    """AdamW (decay before the step) or published LAMB in float64 numpy, for one variable."""
    w = w0.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        c1, c2 = 1 - betas[0] ** t, 1 - betas[1] ** t
        e = eps if placement == "adam_paper" else eps / np.sqrt(c2)
        r = (m / c1) / (np.sqrt(v / c2) + e)
        if optimizer_name == "adamw":
            if decays:
                w = w - lr * wd * w
            w = w - lr * r
        else:
            if decays:
                r = r + wd * w
                r = r * np.linalg.norm(w) / np.linalg.norm(r)
            w = w - lr * r
    return w


@pytest.mark.parametrize("optimizer_name", ["adamw", "lamb"])
@pytest.mark.parametrize("placement", ["adam_paper", "keras"])
def test_update_rules_match_a_float64_reference(optimizer_name, placement):
    """Three updates of a kernel (decays, trust ratio) and a bias (neither), by hand.

    Gradients are small (1e-3) so that epsilon (1e-3 here) matters, and the two placements
    give visibly different results.
    """
    rng = np.random.default_rng(2)
    w0 = {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=(3,))}
    grads = {k: [1e-3 * rng.normal(size=w.shape) for _ in range(3)] for k, w in w0.items()}
    variables = [keras.Variable(w0[k].astype(np.float32), name=k) for k in ("kernel", "bias")]
    optimizer = create_optimizer(0.01, num_train_steps=100, optimizer=optimizer_name,
                                 weight_decay=0.1, epsilon=1e-3, global_clipnorm=None,
                                 epsilon_placement=placement)
    for t in range(3):
        optimizer.apply_gradients(
            [(grads[k][t].astype(np.float32), var) for k, var in zip(("kernel", "bias"),
                                                                      variables)])
    lrs = [0.01 * (100 - s) / 100 for s in range(3)]  # The default schedule, no warmup.
    other_placement = "keras" if placement == "adam_paper" else "adam_paper"
    for var, name in zip(variables, ("kernel", "bias")):
        expected = _reference_steps(optimizer_name, placement, w0[name], grads[name], lrs,
                                    0.1, decays=name == "kernel")
        np.testing.assert_allclose(var.numpy(), expected, rtol=2e-6, atol=2e-7, err_msg=name)
        other = _reference_steps(optimizer_name, other_placement, w0[name], grads[name], lrs,
                                 0.1, decays=name == "kernel")
        assert np.abs(other - expected).max() > 1e-4  # The placement matters here.


def _steps_under_a_constant_gradient(optimizer, steps=40):
    """Adam's step lr * m_hat / (sqrt(v_hat) + eps) under a constant gradient g is lr * sign(g)
    exactly (m_hat = g, v_hat = g^2, eps negligible): the relative error of the mean step
    over `steps` updates of lr = 1 from 0 (the positions 0, -1, ..., -40 are exact in
    float32)."""
    variable = keras.Variable(np.zeros(3, np.float32), name="bias")  # no decay, no ratio
    gradient = np.array([0.5, 2.0, 0.125], np.float32)
    for _ in range(steps):
        optimizer.apply_gradients([(gradient, variable)])
    return float(np.abs(keras.ops.convert_to_numpy(variable) / -steps - 1).max())


@pytest.mark.parametrize("optimizer_name,kernel", [
    ("adamw", "fused"), ("adamw", "keras_ops"), ("lamb", "keras_ops")])
def test_bias_corrections_are_exact_to_float32(optimizer_name, kernel, monkeypatch):
    """Off TensorFlow's fused kernel (JAX, XLA: `keras.ops`), 1 - beta^t to float32 precision.

    Keras' Adam accumulates the second moment with 1 - beta_2 taken in float64 (0.001) and
    divides it by 1 - float32(0.999)^t, 1.3e-5 (relative) smaller: its steps are 6e-6 too
    short, all of them, which is what made fine-tuning on JAX drift 1e-5 from the torch
    reference (BUILD_NOTES 8.12). The fused kernel forms both from float32(beta_2), so they
    cancel. Ours, either way: the float32 error of 40 updates, 1e-7.
    """
    if kernel == "keras_ops":
        monkeypatch.setenv("BERT_KERAS_DISABLE_KERNELS", "adam_fused")
    optimizer = {"adamw": AdamW, "lamb": Lamb}[optimizer_name](
        learning_rate=1.0, weight_decay=0.0, epsilon=1e-12, epsilon_placement="adam_paper")
    optimizer.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])  # LAMB: no trust ratio
    assert _steps_under_a_constant_gradient(optimizer) < 3e-7
    stock = keras.optimizers.Adam(learning_rate=1.0, epsilon=1e-12)
    assert _steps_under_a_constant_gradient(stock) > 5e-6  # Keras' own: the test can fail.


def test_loss_scale_optimizer_clips_the_unscaled_gradient():
    """mixed_float16: Keras wraps the optimizer in a LossScaleOptimizer, which unscales and
    then calls ours, so the clip sees the true gradient (here norm 5, clipped to 1)."""
    def run(wrap):
        var = keras.Variable(np.ones((2,), np.float32), name="kernel")
        optimizer = create_optimizer(0.5, num_train_steps=10, weight_decay=0.0)
        if wrap:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=1024.0)
        grad = np.array([3.0, 4.0], np.float32) * (1024.0 if wrap else 1.0)
        optimizer.apply_gradients([(grad, var)])
        inner = optimizer.inner_optimizer if wrap else optimizer
        (momentum,) = [v for v in inner.variables if "momentum" in v.path]
        return momentum.numpy(), var.numpy()

    plain, scaled = run(False), run(True)
    np.testing.assert_allclose(plain[0], 0.1 * np.array([0.6, 0.8]), rtol=1e-6)
    for a, b in zip(plain, scaled):
        np.testing.assert_allclose(a, b, rtol=1e-6)
