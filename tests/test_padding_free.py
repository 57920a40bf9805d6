"""Padding-free training (bert_keras.layers.padding_free): the encoder's layers on real
tokens only give the padded computation's values at real positions and its gradients.

The reference is the same model with skip_padding=False (the padded computation, which
tests/test_training_parity.py checks against transformers step by step). Sizes all differ
(batch 5, sequence 11, hidden 32, intermediate 37, vocabulary 99) so a transposed or
misrouted row cannot pass.
"""

import numpy as np
import pytest

import bert_keras  # noqa: F401  (sets up TensorFlow before it is imported here)
import keras
import tensorflow as tf

from bert_keras.encoder import BertEncoder
from bert_keras.layers import TransformerEncoderBlock, padding_free
from bert_keras.tasks import BertClassifier, BertSpanQA, BertTagger, compile_args, with_skip_padding

B, S, V, H, I = 5, 11, 99, 32, 37


def _encoder(dropout=0.0):
    return BertEncoder(vocab_size=V, num_layers=2, hidden_size=H, num_heads=4,
                       intermediate_size=I, dropout=dropout, attention_dropout=dropout,
                       max_sequence_length=16)


def _inputs(mask):
    rng = np.random.default_rng(7)
    ids = rng.integers(1, V, mask.shape).astype(np.int32) * mask
    types = (rng.integers(0, 2, mask.shape) * mask).astype(np.int32)
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


TRAILING = (np.arange(S)[None] < np.array([11, 3, 7, 1, 9])[:, None]).astype(np.int32)
# Padding is not always at the end: zeros inside a row are skipped as well (row 0 keeps
# [CLS] at position 0, as every converter writes it).
HOLES = TRAILING.copy()
HOLES[0, [2, 5, 6]] = 0
HOLES[4, 1] = 0


def _pair(model_class, **kwargs):
    encoder = _encoder()
    fast = model_class(encoder, skip_padding=True, **kwargs)
    padded = model_class(encoder, skip_padding=False, **kwargs)  # the same encoder
    padded.set_weights(fast.get_weights())  # and the same head
    return fast, padded


def _loss_and_grads(model, x, mask):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)["logits"]
        if logits.shape.rank == 3:  # a tagger: real positions only, as label -1 does
            loss = tf.reduce_sum(tf.boolean_mask(logits, mask == 1) ** 2)
        else:
            loss = tf.reduce_sum(logits ** 2)
    return logits.numpy(), loss.numpy(), tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("mask", [TRAILING, HOLES], ids=["trailing", "holes"])
@pytest.mark.parametrize("model_class,kwargs", [(BertTagger, {"num_classes": 7, "dropout": 0.0}),
                                                (BertClassifier, {"num_classes": 3, "dropout": 0.0})],
                         ids=["tagger", "classifier"])
def test_training_equals_the_padded_computation(model_class, kwargs, mask):
    fast, padded = _pair(model_class, **kwargs)
    x = _inputs(mask)
    fast_logits, fast_loss, fast_grads = _loss_and_grads(fast, x, mask)
    ref_logits, ref_loss, ref_grads = _loss_and_grads(padded, x, mask)
    if fast_logits.ndim == 3:
        fast_logits, ref_logits = fast_logits[mask == 1], ref_logits[mask == 1]
    np.testing.assert_allclose(fast_logits, ref_logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast_loss, ref_loss, rtol=1e-5)
    assert len(fast_grads) == len(ref_grads) == len(padded.trainable_variables)
    dense = lambda g: tf.convert_to_tensor(g).numpy()  # noqa: E731
    # One scale for all: some gradients are zero up to rounding (the key bias moves every
    # score of a query by the same amount, which the softmax ignores).
    scale = max(np.abs(dense(g)).max() for g in ref_grads)
    for variable, got, want in zip(padded.trainable_variables, fast_grads, ref_grads):
        got, want = dense(got), dense(want)
        assert np.abs(got - want).max() <= 1e-5 * scale, variable.path
        assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max() + 1e-6 * scale, variable.path


def test_the_layers_skip_padded_rows_in_training_only():
    """Padded rows come out as zeros when skipped (the padded computation gives them values),
    so the fast path is the one that ran; inference is the padded computation, bit for bit."""
    encoder = _encoder()
    x = _inputs(TRAILING)
    np.testing.assert_array_equal(_sequence(encoder, x, skip_padding=True, training=False),
                                  _sequence(encoder, x, skip_padding=False, training=False))
    fast = _sequence(encoder, x, skip_padding=True, training=True)
    padded = _sequence(encoder, x, skip_padding=False, training=True)
    pad = TRAILING == 0
    assert np.all(fast[pad] == 0)
    assert np.all(np.abs(padded[pad]).max(axis=-1) > 0)
    np.testing.assert_allclose(fast[~pad], padded[~pad], rtol=1e-5, atol=1e-6)


def _sequence(encoder, x, skip_padding, training):
    return _sequence_tensor(encoder, x, skip_padding, training).numpy()


def test_xla_runs_the_padded_computation():
    """Under XLA (jit_compile, TPUs) shapes must be static: the block runs padded."""
    block = TransformerEncoderBlock(num_heads=4, intermediate_size=I, dropout=0.0,
                                    attention_dropout=0.0)
    x = tf.random.stateless_normal([B, S, H], seed=[1, 2])
    mask = tf.constant(TRAILING)
    padded = block(x, attention_mask=mask, training=True).numpy()
    xla = tf.function(lambda: block(x, attention_mask=mask, training=True, skip_padding=True),
                      jit_compile=True)().numpy()
    np.testing.assert_allclose(xla, padded, rtol=1e-4, atol=1e-5)  # pad rows included
    fast = tf.function(lambda: block(x, attention_mask=mask, training=True,
                                     skip_padding=True))().numpy()
    assert np.all(fast[TRAILING == 0] == 0)
    assert padding_free.padding_free_applies(True, mask)
    assert not padding_free.padding_free_applies(False, mask)
    assert not padding_free.padding_free_applies(True, None)


def test_fit_with_dropout_and_mixed_precision():
    """One fit step each way under mixed_bfloat16 with dropout on: finite, and the same loss
    within bfloat16's precision (dropout draws differ: fewer elements are dropped out)."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        encoder = BertEncoder(vocab_size=V, num_layers=2, hidden_size=H, num_heads=4,
                              intermediate_size=I, max_sequence_length=16, dtype="mixed_bfloat16")
        model = BertTagger(encoder, 7)
        x = _inputs(TRAILING)
        y = {"logits": np.where(TRAILING == 1, np.arange(S)[None] % 7, -1).astype(np.int32)}
        model.compile(optimizer=keras.optimizers.SGD(0.0), **compile_args(model))
        fast = model.fit(x, y, batch_size=B, epochs=1, verbose=0).history["loss"][0]
        inference = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)["loss"]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert np.isfinite(fast)
    # Dropout 0.1 moves the training loss a little from the inference loss of the same
    # weights (the learning rate is 0); a misrouted row would move it by the loss itself.
    assert abs(fast - inference) < 0.2 * inference


def test_config_and_with_skip_padding():
    encoder = _encoder()
    tagger = BertTagger(encoder, 7)
    assert tagger.skip_padding is True and tagger.get_config()["skip_padding"] is True
    restored = BertTagger.from_config(tagger.get_config())
    assert restored.skip_padding is True
    assert with_skip_padding(tagger, True) is tagger
    padded = with_skip_padding(tagger, False)
    assert isinstance(padded, BertTagger) and padded.skip_padding is False
    for a, b in zip(tagger.get_weights(), padded.get_weights()):
        np.testing.assert_array_equal(a, b)
    classifier = BertClassifier(encoder, 3, skip_padding=False)
    assert BertClassifier.from_config(classifier.get_config()).skip_padding is False
    with pytest.raises(ValueError, match="skip_padding"):
        BertTagger(encoder, 7, skip_padding="yes")
    # Span QA's softmax runs over padded positions too: it has no such option.
    assert "skip_padding" not in BertSpanQA(encoder).get_config()


def test_a_batch_without_padding_gives_the_padded_values():
    """Every masked training batch runs padding-free (a per-batch switch to the padded
    computation cost ~120 MB in a tf.cond, BUILD_NOTES 8.5); with no padding at all T = B * S
    and the values are the padded computation's, in a traced function as in fit."""
    encoder = _encoder()
    step = tf.function(lambda x: _sequence_tensor(encoder, x, skip_padding=True, training=True))
    full = np.ones((B, S), np.int32)
    x = _inputs(full)
    np.testing.assert_allclose(step(x).numpy(), _sequence(encoder, x, skip_padding=False,
                                                          training=True), rtol=1e-5, atol=1e-6)
    x = _inputs(TRAILING)  # the same traced function, now with padding
    got, pad = step(x).numpy(), TRAILING == 0
    assert np.all(got[pad] == 0)
    padded = _sequence(encoder, x, skip_padding=False, training=True)
    np.testing.assert_allclose(got[~pad], padded[~pad], rtol=1e-5, atol=1e-6)


def _sequence_tensor(encoder, x, skip_padding, training):
    mask = x["input_mask"]
    h = encoder.embeddings_layer(x["input_word_ids"], x["input_type_ids"], training=training)
    for block in encoder.transformer_layers:
        h = block(h, attention_mask=mask, training=training, skip_padding=skip_padding)
    return h
