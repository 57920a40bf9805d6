"""Inference on the real tokens only, at a static number of rows
(`BertEncoder.call_on_real_tokens`, `padding_free.packed_rows` and `row_capacity`).

The reference is the encoder's own call on the padded batch (tests/test_hf_parity.py holds it
against transformers). Sizes all differ (batch 5, sequence 11, hidden 32, intermediate 37,
vocabulary 99) so that a misrouted row cannot pass; masks with trailing padding and with
holes, on both Keras backends: this process's, and JAX in one fresh process
(`test_this_module_holds_on_jax`) when this one runs TensorFlow.
"""

import numpy as np
import pytest

import bert_keras  # noqa: F401  (sets up TensorFlow before Keras is imported)
import keras
from keras import ops

from conftest import run_module_on_backend
from bert_keras.encoder import BertEncoder
from bert_keras.layers import padding_free

B, S, V, H, I = 5, 11, 99, 32, 37
TRAILING = (np.arange(S)[None] < np.array([11, 3, 7, 1, 9])[:, None]).astype(np.int32)
HOLES = TRAILING.copy()
HOLES[0, [2, 5, 6]] = 0
HOLES[4, 1] = 0


def _encoder():
    return BertEncoder(vocab_size=V, num_layers=2, hidden_size=H, num_heads=4,
                       intermediate_size=I, max_sequence_length=16)


def _inputs(mask):
    rng = np.random.default_rng(7)
    ids = rng.integers(1, V, mask.shape).astype(np.int32) * mask
    types = (rng.integers(0, 2, mask.shape) * mask).astype(np.int32)
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def test_row_capacity_rounds_the_real_tokens_up():
    assert TRAILING.sum() == 31
    assert padding_free.row_capacity(TRAILING) == 31
    assert padding_free.row_capacity(TRAILING, multiple=8) == 32
    assert padding_free.row_capacity(TRAILING, multiple=16) == 32
    assert padding_free.row_capacity(TRAILING, multiple=20) == 40
    assert padding_free.row_capacity(TRAILING, multiple=100) == B * S  # at most B * S
    assert padding_free.row_capacity(np.zeros((2, 3))) == 1  # a shape needs a row
    with pytest.raises(ValueError, match="multiple must be a positive int, got 0"):
        padding_free.row_capacity(TRAILING, multiple=0)
    with pytest.raises(ValueError, match=r"must be \[batch, seq_length\], got shape \(11,\)"):
        padding_free.row_capacity(TRAILING[0])


def test_packed_rows_by_hand():
    mask = np.array([[1, 1, 0, 0], [1, 0, 1, 0]], np.int32)  # real: flat 0, 1, 4, 6
    rows, slots, overflow = (ops.convert_to_numpy(t) for t in
                             padding_free.packed_rows(ops.convert_to_tensor(mask), 6))
    np.testing.assert_array_equal(rows, [0, 1, 4, 6, 0, 0])  # then spare rows: row 0
    np.testing.assert_array_equal(slots, [0, 1, 0, 0, 2, 0, 3, 0])  # padding: row 0
    assert not overflow
    rows, slots, overflow = (ops.convert_to_numpy(t) for t in
                             padding_free.packed_rows(ops.convert_to_tensor(mask), 3))
    np.testing.assert_array_equal(rows, [0, 1, 4])
    np.testing.assert_array_equal(slots, [0, 1, 0, 0, 2, 0, 2, 0])  # clipped to C - 1
    assert overflow
    with pytest.raises(ValueError, match=r"capacity must be an int in \[1, 8\]"):
        padding_free.packed_rows(ops.convert_to_tensor(mask), 9)


@pytest.mark.parametrize("mask_name", ["trailing", "holes"])
def test_real_tokens_equal_the_full_call(mask_name):
    mask = {"trailing": TRAILING, "holes": HOLES}[mask_name]
    keras.utils.set_random_seed(3)
    encoder = _encoder()
    x = _inputs(mask)
    full = {k: ops.convert_to_numpy(v) for k, v in encoder(x, training=False).items()
            if k != "encoder_outputs"}
    scale = np.abs(full["sequence_output"]).max()
    for capacity in (int(mask.sum()), int(mask.sum()) + 7, B * S):
        found = {k: ops.convert_to_numpy(v)
                 for k, v in encoder.call_on_real_tokens(x, capacity).items()}
        assert found["sequence_output"].shape == (B, S, H)
        # The same arithmetic row by row (float32: only a matmul's blocking may differ).
        np.testing.assert_allclose(found["sequence_output"][mask == 1],
                                   full["sequence_output"][mask == 1], atol=1e-5 * scale)
        assert np.all(found["sequence_output"][mask == 0] == 0)
        np.testing.assert_allclose(found["pooled_output"], full["pooled_output"], atol=1e-5)


def test_real_tokens_under_mixed_bfloat16():
    """An encoder built under mixed_bfloat16 (as run_pretraining --mixed_precision and the
    bench build it): bfloat16 outputs, equal to its full call at real positions within one
    bfloat16 rounding of the scale (bit for bit on this CPU with either backend: the same
    arithmetic row by row; another matmul blocking may round differently), zeros at padding."""
    keras.utils.set_random_seed(5)
    encoder = BertEncoder(vocab_size=V, num_layers=2, hidden_size=H, num_heads=4,
                          intermediate_size=I, max_sequence_length=16, dtype="mixed_bfloat16")
    x = _inputs(HOLES)
    full = encoder(x, training=False)
    found = encoder.call_on_real_tokens(x, padding_free.row_capacity(HOLES, multiple=8))
    for name in ("sequence_output", "pooled_output"):
        assert keras.backend.standardize_dtype(found[name].dtype) == \
            keras.backend.standardize_dtype(full[name].dtype) == "bfloat16"
    got = ops.convert_to_numpy(ops.cast(found["sequence_output"], "float32"))
    want = ops.convert_to_numpy(ops.cast(full["sequence_output"], "float32"))
    scale = np.abs(want).max()
    np.testing.assert_allclose(got[HOLES == 1], want[HOLES == 1], atol=2 ** -8 * scale)
    assert np.all(got[HOLES == 0] == 0)
    np.testing.assert_allclose(
        ops.convert_to_numpy(ops.cast(found["pooled_output"], "float32")),
        ops.convert_to_numpy(ops.cast(full["pooled_output"], "float32")), atol=2 ** -8)


def test_too_few_rows_poison_every_output():
    encoder = _encoder()
    found = encoder.call_on_real_tokens(_inputs(TRAILING), int(TRAILING.sum()) - 1)
    for value in found.values():
        assert np.all(np.isnan(ops.convert_to_numpy(value)))


def test_runs_under_xla_at_a_static_shape():
    """The point of a static capacity: a compiled function (here TensorFlow's XLA; every
    JAX computation is one) runs the C rows and gives the full call's values."""
    import tensorflow as tf

    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's jit_compile")
    encoder = _encoder()
    x = _inputs(HOLES)
    capacity = padding_free.row_capacity(HOLES, multiple=8)

    @tf.function(jit_compile=True)
    def forward(inputs):
        return encoder.call_on_real_tokens(inputs, capacity)

    found = forward({k: tf.constant(v) for k, v in x.items()})
    full = encoder(x, training=False)
    np.testing.assert_allclose(found["sequence_output"].numpy()[HOLES == 1],
                               full["sequence_output"].numpy()[HOLES == 1], atol=1e-5)
    np.testing.assert_allclose(found["pooled_output"].numpy(),
                               full["pooled_output"].numpy(), atol=1e-5)


def test_a_mask_of_unknown_shape_is_refused_in_one_line():
    """C rows are a static shape, so the batch's [B, S] must be static too: a traced mask
    of unknown shape gets a ValueError naming what was found, not an XLA shape error."""
    import tensorflow as tf

    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's unknown dimensions")

    @tf.function(input_signature=[tf.TensorSpec([None, S], tf.int32)])
    def rows(mask):
        return padding_free.packed_rows(mask, 8)

    with pytest.raises(ValueError, match=r"packed_rows needs a static \[batch, seq_length\] "
                                         r"mask, got \(None, 11\)"):
        rows.get_concrete_function()


@pytest.mark.integration  # ~51 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_this_module_holds_on_jax():
    """The tests above on Keras' JAX backend, in one fresh process: capacity, by hand, two
    masks, bfloat16, poison (the TensorFlow-only ones skip there)."""
    run_module_on_backend("jax", __file__, 6, "-k", "not holds_on_jax")
