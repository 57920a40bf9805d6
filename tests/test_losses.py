"""Pretraining losses: the masked-LM formula, weight-0 predictions, NSP, and compile()."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY, make_inputs

from bert_keras import BertEncoder, BertPretrainer
from bert_keras.losses import (EvaluationProgbarLogger, MaskedLMAccuracy, MaskedLMLoss,
                               MaskedLMLossMean, evaluation_results, nsp_loss,
                               pretraining_losses_and_metrics)

# Sizes that all differ: batch 3, predictions 5, vocabulary 7.
B, P, V = 3, 5, 7


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _fixed_case(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(B, P, V)).astype(np.float32) * 3
    labels = rng.integers(0, V, size=(B, P)).astype(np.int32)
    weights = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    return logits, labels, weights


def test_mlm_loss_matches_numpy_formula():
    logits, labels, weights = _fixed_case()
    cross_entropy = -np.take_along_axis(_log_softmax(logits.astype(np.float64)),
                                        labels[..., None], axis=-1)[..., 0]
    expected = (weights * cross_entropy).sum() / (weights.sum() + 1e-5)
    got = float(MaskedLMLoss()(labels, logits, sample_weight=weights))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # Without weights every prediction counts.
    got_unweighted = float(MaskedLMLoss()(labels, logits))
    np.testing.assert_allclose(got_unweighted, cross_entropy.sum() / (B * P + 1e-5), rtol=1e-6)


def test_mlm_loss_of_all_zero_weights_is_zero_not_nan():
    logits, labels, _ = _fixed_case()
    assert float(MaskedLMLoss()(labels, logits, sample_weight=np.zeros((B, P), np.float32))) == 0


def test_weight_zero_predictions_change_nothing():
    logits, labels, weights = _fixed_case()
    rng = np.random.default_rng(1)
    pad = weights == 0
    other_logits = np.where(pad[..., None], rng.normal(size=logits.shape) * 50, logits)
    other_labels = np.where(pad, rng.integers(0, V, size=labels.shape), labels)

    def loss_and_grad(lg, lb):
        lg = tf.constant(lg, tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(lg)
            loss = MaskedLMLoss()(lb, lg, sample_weight=weights)
        return float(loss), tape.gradient(loss, lg).numpy()

    loss_a, grad_a = loss_and_grad(logits, labels)
    loss_b, grad_b = loss_and_grad(other_logits.astype(np.float32), other_labels)
    assert loss_a == loss_b
    np.testing.assert_array_equal(grad_a, grad_b)
    assert not grad_a[pad].any()  # Padded predictions get no gradient at all.


def test_nsp_loss_is_mean_cross_entropy():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(B, 2)).astype(np.float32)
    labels = np.array([0, 1, 1], np.int32)
    expected = -_log_softmax(logits.astype(np.float64))[np.arange(B), labels].mean()
    np.testing.assert_allclose(float(nsp_loss()(labels, logits)), expected, rtol=1e-6)
    # Labels as Google stores them, [B, 1], give the same value.
    np.testing.assert_allclose(float(nsp_loss()(labels[:, None], logits)), expected, rtol=1e-6)


def test_compiled_pretrainer_reports_the_formula():
    """Keras' compile/evaluate with the dict of losses gives exactly MLM + NSP as defined."""
    model = BertPretrainer(BertEncoder(**TINY))
    model.compile(optimizer="sgd", **pretraining_losses_and_metrics())
    x = make_inputs(batch=B, seq=11)
    rng = np.random.default_rng(3)
    x["masked_lm_positions"] = rng.integers(0, 11, size=(B, P)).astype(np.int32)
    mlm_ids = rng.integers(0, TINY["vocab_size"], size=(B, P)).astype(np.int32)
    nsp = np.array([1, 0, 1], np.int32)
    _, _, weights = _fixed_case()
    y = {"mlm_logits": mlm_ids, "nsp_logits": nsp}
    w = {"mlm_logits": weights, "nsp_logits": np.ones(B, np.float32)}

    outputs = model.predict_on_batch(x)
    ce = -np.take_along_axis(_log_softmax(outputs["mlm_logits"].astype(np.float64)),
                             mlm_ids[..., None], axis=-1)[..., 0]
    mlm = (weights * ce).sum() / (weights.sum() + 1e-5)
    nsp_value = -_log_softmax(outputs["nsp_logits"].astype(np.float64))[np.arange(B), nsp].mean()
    correct = outputs["mlm_logits"].argmax(-1) == mlm_ids
    logs = model.test_on_batch(x, y, w, return_dict=True)

    np.testing.assert_allclose(logs["mlm_logits_loss"], mlm, rtol=1e-5)
    np.testing.assert_allclose(logs["nsp_logits_loss"], nsp_value, rtol=1e-5)
    np.testing.assert_allclose(logs["loss"], mlm + nsp_value, rtol=1e-5)
    # MLM accuracy counts only real predictions.
    np.testing.assert_allclose(logs["mlm_logits_accuracy"],
                               (correct * weights).sum() / weights.sum(), rtol=1e-6)


def test_mlm_only_variant_and_serialization():
    kwargs = pretraining_losses_and_metrics(mlm_only=True)
    assert set(kwargs["loss"]) == {"mlm_logits"}
    assert set(kwargs["weighted_metrics"]) == {"mlm_logits"}
    restored = keras.losses.deserialize(keras.losses.serialize(MaskedLMLoss()))
    assert isinstance(restored, MaskedLMLoss) and restored.name == "masked_lm_loss"


def test_masked_lm_accuracy_matches_keras_and_numpy():
    # Logits where about half the labels are the argmax, exact ties (first index wins in
    # numpy, Keras and ours), and weights with zeros.
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(4, 6, 50)).astype(np.float32)
    labels = rng.integers(0, 50, size=(4, 6)).astype(np.int32)
    hit = rng.random((4, 6)) < 0.5
    np.put_along_axis(logits, labels[..., None], np.where(hit, 9.0, -9.0)[..., None], axis=-1)
    logits[0, 0, :] = 1.0  # all tied: the prediction is index 0
    labels[0, 0] = 0
    logits[0, 1, :] = 1.0
    labels[0, 1] = 5  # tied with index 0, which comes first: wrong
    weights = (rng.random((4, 6)) < 0.7).astype(np.float32)
    weights[0, :2] = 1.0

    ours = MaskedLMAccuracy()
    ours.update_state(labels, logits, sample_weight=weights)
    keras_metric = keras.metrics.SparseCategoricalAccuracy()
    keras_metric.update_state(labels, logits, sample_weight=weights)
    correct = logits.argmax(-1) == labels
    expected = (correct * weights).sum() / weights.sum()
    assert 0.2 < expected < 0.8
    np.testing.assert_allclose(float(ours.result()), expected, rtol=1e-6)
    np.testing.assert_allclose(float(ours.result()), float(keras_metric.result()), rtol=1e-6)
    restored = keras.metrics.deserialize(keras.metrics.serialize(ours))
    assert isinstance(restored, MaskedLMAccuracy) and restored.name == "accuracy"


def test_masked_lm_loss_mean_is_googles_weighted_mean_over_every_prediction():
    """Over batches with 1, 5 and 3 real predictions a row: sum(w * CE) / sum(w) over all
    of them (Google's tf.metrics.mean(values, weights)), not the mean of the batches'
    MaskedLMLoss (what Keras' loss tracker reports)."""
    rng = np.random.default_rng(11)
    metric = MaskedLMLossMean()
    batch_losses, sums, counts = [], 0.0, 0.0
    for count in (1, 5, 3):
        logits = (rng.normal(size=(B, P, V)) * 4).astype(np.float32)
        labels = rng.integers(0, V, size=(B, P)).astype(np.int32)
        weights = np.repeat((np.arange(P) < count)[None], B, axis=0).astype(np.float32)
        metric.update_state(labels, logits, sample_weight=weights)
        cross_entropy = -np.take_along_axis(_log_softmax(logits.astype(np.float64)),
                                            labels[..., None], axis=-1)[..., 0]
        sums, counts = sums + (weights * cross_entropy).sum(), counts + weights.sum()
        batch_losses.append(float(MaskedLMLoss()(labels, logits, sample_weight=weights)))
    expected = sums / counts
    assert abs(np.mean(batch_losses) - expected) > 0.05 * expected  # the two differ here
    np.testing.assert_allclose(float(metric.result()), expected, rtol=1e-6)
    metric.reset_state()
    metric.update_state(labels, logits, sample_weight=np.zeros((B, P), np.float32))
    assert float(metric.result()) == 0.0  # no real prediction: 0, as Google's, not NaN
    restored = keras.metrics.deserialize(keras.metrics.serialize(metric))
    assert isinstance(restored, MaskedLMLossMean) and restored.name == "masked_lm_loss"


def test_only_an_evaluation_compile_adds_the_weighted_mean():
    """Keras updates compiled metrics in training steps too: the training compile must not
    hold MaskedLMLossMean (a second [B, P, V] cross-entropy a step)."""
    for mlm_only in (False, True):
        training = pretraining_losses_and_metrics(mlm_only=mlm_only)
        evaluation = pretraining_losses_and_metrics(mlm_only=mlm_only, evaluation=True)
        assert not any(isinstance(m, MaskedLMLossMean)
                       for m in training["weighted_metrics"]["mlm_logits"])
        assert [type(m) for m in evaluation["weighted_metrics"]["mlm_logits"]] == \
            [MaskedLMAccuracy, MaskedLMLossMean]
    model = BertPretrainer(BertEncoder(**TINY))
    model.compile(**pretraining_losses_and_metrics(evaluation=True))
    x = make_inputs(batch=B, seq=11)
    rng = np.random.default_rng(4)
    x["masked_lm_positions"] = rng.integers(0, 11, size=(B, P)).astype(np.int32)
    y = {"mlm_logits": rng.integers(0, TINY["vocab_size"], size=(B, P)).astype(np.int32),
         "nsp_logits": np.array([1, 0, 1], np.int32)}
    _, _, weights = _fixed_case()
    w = {"mlm_logits": weights, "nsp_logits": np.ones(B, np.float32)}
    logs = model.test_on_batch(x, y, w, return_dict=True)
    results = evaluation_results(logs)
    assert results["mlm_logits_loss"] == pytest.approx(logs["mlm_logits_masked_lm_loss"])
    assert set(results) == {"loss", "mlm_logits_loss", "mlm_logits_accuracy", "nsp_logits_loss",
                            "nsp_logits_accuracy"}
    with pytest.raises(ValueError, match=r"compiled with pretraining_losses_and_metrics\("
                                         r"evaluation=True\); received the keys \['loss'"):
        evaluation_results({"loss": 1.0, "mlm_logits_loss": 2.0})


def _evaluation_batches(rng, counts):
    """Pretraining batches (features, labels, sample weights) of `count` real predictions a
    row each, batch B, sequence 11."""
    batches = []
    for count in counts:
        x = make_inputs(batch=B, seq=11, seed=int(rng.integers(1000)))
        x["masked_lm_positions"] = rng.integers(0, 11, size=(B, P)).astype(np.int32)
        y = {"mlm_logits": rng.integers(0, TINY["vocab_size"], size=(B, P)).astype(np.int32),
             "nsp_logits": rng.integers(0, 2, size=B).astype(np.int32)}
        w = {"mlm_logits": np.repeat((np.arange(P) < count)[None], B, 0).astype(np.float32),
             "nsp_logits": np.ones(B, np.float32)}
        batches.append((x, y, w))
    return batches


@pytest.mark.parametrize("verbose", [1, 2])
def test_the_evaluation_progress_bar_shows_googles_loss_under_its_one_name(verbose, capsys):
    """An evaluation-only run's bar showed Keras' mean of the batches' losses as
    mlm_logits_loss beside mlm_logits_masked_lm_loss, Google's, which eval_results.json
    names mlm_logits_loss. The bar shows the one eval_results.json holds, under that name,
    at every verbosity; at verbose 0 it prints nothing."""
    model = BertPretrainer(BertEncoder(**TINY))
    model.compile(**pretraining_losses_and_metrics(evaluation=True))
    data = tf.data.Dataset.from_generator(
        lambda: iter(_evaluation_batches(np.random.default_rng(5), (1, 5, 3))),
        output_signature=tf.nest.map_structure(
            lambda a: tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)),
            _evaluation_batches(np.random.default_rng(5), (1,))[0]))
    capsys.readouterr()
    logs = model.evaluate(data, steps=3, return_dict=True, verbose=verbose,
                          callbacks=[EvaluationProgbarLogger()])
    shown = capsys.readouterr().out
    assert "masked_lm_loss" not in shown
    # Keras' batch mean differs from Google's here (1, 5 and 3 predictions a row).
    assert abs(float(logs["mlm_logits_loss"]) - float(logs["mlm_logits_masked_lm_loss"])) > 1e-3
    values = [float(v) for v in re.findall(r"mlm_logits_loss: ([0-9.]+)", shown)]
    assert values and values[-1] == pytest.approx(
        evaluation_results(logs)["mlm_logits_loss"], abs=1e-4)
    assert "nsp_logits_accuracy" in shown
    model.evaluate(data, steps=3, verbose=0, callbacks=[EvaluationProgbarLogger()])
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("scale", [0.01, 3.0, 60.0, 400.0])
def test_mlm_cross_entropy_equals_tensorflows_kernel(scale):
    """The softmax-based cross-entropy against TensorFlow's fused kernel and float64 NumPy.

    At scales 60 and 400 some labels' probabilities underflow float32, which takes the
    log-sum-exp path; at 0.01 and 3 every batch takes -log(p[label]).
    """
    rng = np.random.default_rng(int(scale * 100))
    logits = (rng.normal(size=(B, P, 50)) * scale).astype(np.float32)
    labels = rng.integers(0, 50, size=(B, P)).astype(np.int32)
    logits_t = tf.constant(logits)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits_t)
        ours = MaskedLMLoss().call(labels, logits_t)
        reference = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits_t)
        # A per-prediction upstream gradient, as the weighted sum gives.
        upstream = tf.constant(rng.random((B, P)).astype(np.float32))
        ours_sum, reference_sum = (tf.reduce_sum(upstream * x) for x in (ours, reference))
    numpy_value = -np.take_along_axis(_log_softmax(logits.astype(np.float64)),
                                      labels[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(ours.numpy(), numpy_value, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(ours.numpy(), reference.numpy(), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(tape.gradient(ours_sum, logits_t).numpy(),
                               tape.gradient(reference_sum, logits_t).numpy(), atol=1e-6)
    assert np.isfinite(ours.numpy()).all()


def test_mlm_labels_outside_the_vocabulary_are_a_clear_error():
    logits = np.zeros((1, 2, 7), np.float32)
    for bad in (7, -1):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"masked_lm_ids .* \[0, voc"):
            MaskedLMLoss()(np.array([[1, bad]], np.int32), logits)
