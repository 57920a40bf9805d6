"""SelfAttention: the fused path (keras.ops.dot_product_attention) and BERT's explicit one.

Where no attention probability is dropped, SelfAttention runs the fused kernel; in training
with attention dropout it runs the explicit softmax. Both must compute the same function:
here both are compared with a numpy reference and with each other (the explicit path run in
training with its dropout layer's rate at 0), in float32 and under mixed_bfloat16,
with padding, and for a subset of query rows. Each test runs on TensorFlow and JAX
(conftest.run_on_backend).
"""

import re

import numpy as np
import pytest
from conftest import run_on_backend

from bert_keras.layers import SelfAttention

B, S, H, N, Q = 3, 7, 32, 4, 2
BACKENDS = ["tensorflow", pytest.param("jax", marks=pytest.mark.integration)]


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, S, H)).astype("float32")
    mask = np.ones((B, S), "int32")
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    query_rows = np.array([[0, 3], [1, 4], [0, 1]], "int32")
    return x, mask, query_rows


def _reference(layer, x, mask, query):
    """numpy float64: softmax(q k^T / sqrt(D) - 10000 (1 - mask)) v, heads concatenated."""
    def project(dense, inputs):
        return (inputs.astype("float64") @ np.asarray(dense.kernel, "float64")
                + np.asarray(dense.bias, "float64"))

    d = H // N
    q = project(layer.query, query).reshape(B, -1, N, d).transpose(0, 2, 1, 3)
    k = project(layer.key, x).reshape(B, S, N, d).transpose(0, 2, 1, 3)
    v = project(layer.value, x).reshape(B, S, N, d).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) - 10000.0 * (1 - mask[:, None, None, :])
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return (probs @ v).transpose(0, 2, 1, 3).reshape(B, -1, H)


def _explicit(layer, x, mask, query=None):
    """The explicit path: training with attention dropout (layer.dropout > 0), its dropout
    layer's rate set to 0 for the call so that nothing is dropped."""
    rate = layer.dropout_layer.rate
    layer.dropout_layer.rate = 0.0
    try:
        return np.asarray(layer(x, attention_mask=mask, training=True, query=query), "float32")
    finally:
        layer.dropout_layer.rate = rate


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_and_explicit_attention_compute_the_same_function(backend):
    if run_on_backend(backend, __file__, "test_fused_and_explicit_attention_compute_the_same_"
                                         f"function[{backend}]"):
        return
    x, mask, rows = _inputs()
    layer = SelfAttention(N, dropout=0.1)
    layer.build((None, None, H))
    queries = np.take_along_axis(x, rows[:, :, None], axis=1)
    for query in (None, queries):
        want = _reference(layer, x, mask, x if query is None else queries)
        fused = np.asarray(layer(x, attention_mask=mask, query=query), "float32")  # inference
        explicit = _explicit(layer, x, mask, query)
        scale = np.abs(want).max()
        assert np.abs(fused - want).max() < 1e-5 * scale
        assert np.abs(explicit - want).max() < 1e-5 * scale
    # Training without attention dropout takes the fused kernel too: the same values.
    no_dropout = SelfAttention(N, dropout=0.0)
    no_dropout.build((None, None, H))
    for a, b in zip(no_dropout.weights, layer.weights):
        a.assign(b)
    trained = np.asarray(no_dropout(x, attention_mask=mask, training=True), "float32")
    np.testing.assert_allclose(trained, _explicit(layer, x, mask), atol=1e-5 * scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_attention_under_mixed_bfloat16(backend):
    if run_on_backend(backend, __file__,
                      f"test_fused_attention_under_mixed_bfloat16[{backend}]"):
        return
    x, mask, _ = _inputs(seed=1)
    layer = SelfAttention(N, dropout=0.1, dtype="mixed_bfloat16")
    layer.build((None, None, H))
    want = _reference(layer, x, mask, x)
    fused = np.asarray(layer(x, attention_mask=mask), "float32")
    explicit = _explicit(layer, x, mask)
    scale = np.abs(want).max()
    # bfloat16 operands (8-bit mantissa) in the projections and both matrix products.
    assert np.abs(fused - want).max() < 3e-2 * scale
    assert np.abs(explicit - want).max() < 3e-2 * scale
    assert np.abs(fused - explicit).max() < 3e-2 * scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_under_mixed_float16(backend):
    """mixed_float16 (`--mixed_precision=mixed_float16`) at inference: on JAX's CPU backend
    keras.ops.dot_product_attention does not compile in float16 ("The precision
    'F16_F16_F32' is not supported by dot_general on CPU"), so a fine-tuning run trained
    there and then stopped with a stack trace in its evaluation; the layer computes it
    with the explicit softmax instead, the same function."""
    if run_on_backend(backend, __file__,
                      f"test_attention_under_mixed_float16[{backend}]"):
        return
    import keras

    x, mask, rows = _inputs(seed=2)
    layer = SelfAttention(N, dropout=0.1, dtype="mixed_float16")
    layer.build((None, None, H))
    if keras.backend.backend() == "jax":
        # Compiled, as the tools run every step on JAX: eagerly, op by op, it compiled.
        import jax

        @jax.jit
        def compiled(values, x, mask, query):
            with keras.StatelessScope(state_mapping=list(zip(layer.variables, values))):
                return layer(x, attention_mask=mask, query=query)

        def serve(x, attention_mask, query):
            return compiled([v.value for v in layer.variables], x, attention_mask, query)
    else:
        serve = layer
    queries = np.take_along_axis(x, rows[:, :, None], axis=1)
    for query in (None, queries):
        want = _reference(layer, x, mask, x if query is None else queries)
        served = np.asarray(serve(x, attention_mask=mask, query=query), "float32")
        explicit = _explicit(layer, x, mask, query)
        scale = np.abs(want).max()
        # float16 operands (11-bit mantissa) in the projections and both matrix products.
        assert np.abs(served - want).max() < 1e-2 * scale
        assert np.abs(explicit - want).max() < 1e-2 * scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_16_bit_attention_at_bert_base_heads_is_as_close_as_transformers(backend):
    """Under mixed_bfloat16 and mixed_float16, at BERT-base's heads (S128, N12, D64), every
    path's output is as close to float64 attention over the same rounded q, k and v as
    transformers' own eager attention in that dtype (its eager_attention_forward in torch)
    is. On TensorFlow's CPU kernels, 16-bit products lose precision inside their sums:
    keras.ops.dot_product_attention's einsums were 5.3e-2 off in bfloat16 (transformers
    1.0e-2, JAX 3.8e-3) and 8.4e-3 in float16 (transformers 7.7e-4; BUILD_NOTES.md 8.10);
    there the layer now takes the explicit softmax with float32 operands."""
    if run_on_backend(backend, __file__, "test_16_bit_attention_at_bert_base_heads_is_as_"
                                         f"close_as_transformers[{backend}]"):
        return
    torch = pytest.importorskip("torch")
    from transformers.models.bert.modeling_bert import eager_attention_forward

    batch, length, hidden, heads = 2, 128, 768, 12
    d = hidden // heads
    rng = np.random.default_rng(3)
    x = rng.normal(size=(batch, length, hidden)).astype("float32")
    mask = np.ones((batch, length), "int32")
    mask[1, 70:] = 0
    real = mask.astype(bool)
    for dtype in ("bfloat16", "float16"):
        layer = SelfAttention(heads, dropout=0.1, dtype="mixed_" + dtype)
        layer.build((None, None, hidden))
        # q, k and v as the layer computes them (rounded to `dtype`), [B, N, S, D].
        q, k, v = (np.asarray(dense(x), "float32").reshape(batch, length, heads, d)
                   .transpose(0, 2, 1, 3) for dense in (layer.query, layer.key, layer.value))
        scores = (q.astype("float64") @ k.astype("float64").transpose(0, 1, 3, 2) / np.sqrt(d)
                  + np.finfo("float64").min * (1 - mask[:, None, None, :]))
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        want = (probs @ v.astype("float64")).transpose(0, 2, 1, 3).reshape(
            batch, length, hidden)
        scale = np.abs(want[real]).max()

        typed = getattr(torch, dtype)
        bias = torch.tensor((1 - mask[:, None, None, :]) * torch.finfo(typed).min).to(typed)
        module = torch.nn.Module().eval()
        theirs, _ = eager_attention_forward(
            module, *(torch.tensor(t).to(typed) for t in (q, k, v)), bias, scaling=d ** -0.5)
        theirs = theirs.float().numpy().reshape(batch, length, hidden)
        bound = np.abs(theirs[real] - want[real]).max() / scale
        assert 0 < bound < 2e-2, bound  # a 16-bit computation: not exact, not far off

        no_dropout = SelfAttention(heads, dropout=0.0, dtype="mixed_" + dtype)
        no_dropout.build((None, None, hidden))
        for a, b in zip(no_dropout.weights, layer.weights):
            a.assign(b)
        for name, got in (("inference", layer(x, attention_mask=mask)),
                          ("training, dropout 0", no_dropout(x, attention_mask=mask,
                                                             training=True)),
                          ("explicit softmax", _explicit(layer, x, mask))):
            error = np.abs(np.asarray(got, "float32")[real] - want[real]).max() / scale
            assert error <= 1.5 * bound, (dtype, name, error, bound)


def _any_masks(batch=5, length=S):
    """Row r gets pattern r % 6: every token real, right padding, left padding, holes, no
    real token, one real token (mid-sequence). With the defaults: the first five."""
    mask = np.ones((batch, length), "int32")
    for row in range(batch):
        pattern = row % 6
        if pattern == 1:
            mask[row, max(1, length - 3):] = 0
        elif pattern == 2:
            mask[row, :min(3, length - 1)] = 0
        elif pattern == 3:
            mask[row, 1:length - 1:2] = 0
        elif pattern == 4:
            mask[row] = 0
        elif pattern == 5:
            mask[row] = 0
            mask[row, length // 2] = 1
    return mask


def _uniform_reference(layer, x, mask):
    """numpy float64 with transformers' eager masking: finfo.min added to padded keys'
    scores, so a row with no real key has equal scores and attends uniformly."""
    def project(dense):
        return (x.astype("float64") @ np.asarray(dense.kernel, "float64")
                + np.asarray(dense.bias, "float64"))

    batch, length, hidden = x.shape
    heads = layer.num_heads
    d = hidden // heads
    q, k, v = (project(dense).reshape(batch, length, heads, d).transpose(0, 2, 1, 3)
               for dense in (layer.query, layer.key, layer.value))
    scores = (q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
              + np.finfo("float64").min * (1 - mask[:, None, None, :]))
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)


# (B, S, H, N): this module's sizes; head size 24 (not a power of two) with a sequence
# length no block size divides and every mask pattern (a one-token row included); a batch
# of single tokens, one of them padding. Masks as int, float and bool.
ANY_MASK_SIZES = [(5, S, H, N), (6, 17, 72, 3), (5, 1, 40, 5)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sizes", ANY_MASK_SIZES, ids=lambda s: "B{}_S{}_H{}_N{}".format(*s))
def test_every_path_computes_one_function_for_any_mask(backend, sizes):
    """The fused path (a select in Keras' attention) and the explicit softmax agree with
    transformers' eager masking for any mask, on both backends, in float32 and bfloat16. A
    sequence with no real key attends uniformly on both: the explicit path used Google's
    -10000, which let that row attend by its raw scores (0.07 from the fused path)."""
    test_id = "B{}_S{}_H{}_N{}".format(*sizes)
    if run_on_backend(backend, __file__,
                      f"test_every_path_computes_one_function_for_any_mask[{test_id}-{backend}]"):
        return
    batch, length, hidden, heads = sizes
    mask = _any_masks(batch, length)
    empty = ~mask.any(axis=1)
    assert empty.any()
    x = np.random.default_rng(2).normal(size=(batch, length, hidden)).astype("float32") * 3
    for dtype, tolerance in (("float32", 1e-5), ("mixed_bfloat16", 3e-2)):
        layer = SelfAttention(heads, dropout=0.1, dtype=dtype)
        layer.build((None, None, hidden))
        want = _uniform_reference(layer, x, mask)
        scale = np.abs(want).max()
        for typed in (mask, mask.astype("float32"), mask.astype(bool)):
            fused = np.asarray(layer(x, attention_mask=typed), "float32")
            explicit = _explicit(layer, x, typed)
            for name, got in (("fused", fused), ("explicit", explicit)):
                error = np.abs(got - want).max(axis=(1, 2)) / scale
                assert (error < tolerance).all(), (dtype, typed.dtype, name, error)
            assert np.abs(fused - explicit).max() < tolerance * scale
        # A row with no real token is the mean of its values, on both paths.
        values = np.asarray(layer.value(x[empty]), "float32")  # [E, S, H]
        np.testing.assert_allclose(explicit[empty], np.broadcast_to(
            values.mean(1, keepdims=True), values.shape), atol=tolerance * scale)


@pytest.mark.parametrize("shape", [(B, S, S), (B, 1, S), (B, 1, 1, S), (S,), (B, S + 1),
                                   (B + 1, S)])
def test_a_mask_of_another_shape_is_a_one_line_error_naming_the_expected_one(shape):
    """Every path masks keys with one [B, S] mask. A [B, S, S] mask (Google's
    create_attention_mask_from_input_mask), a [B, 1, 1, S] bias-shaped one or a mask of
    another batch or length failed deep inside (TensorFlow: "Expected input 0 to have rank
    4 but got: 5 [Op:Einsum]"; JAX: "too many values to unpack (expected 4)"), and in the
    padding-free path would have picked rows by a mask of the wrong size."""
    from bert_keras.layers import TransformerEncoderBlock

    x, _, _ = _inputs()
    mask = np.ones(shape, "int32")
    layer = SelfAttention(N, dropout=0.1)
    block = TransformerEncoderBlock(N, 37, dropout=0.1, attention_dropout=0.1)
    want = (r"attention_mask must be \[B, S\] = \(3, 7\), 1 for real tokens and 0 for "
            rf"padding .*; got shape {re.escape(str(shape))}")
    for training in (False, True):
        with pytest.raises(ValueError, match="SelfAttention: " + want):
            layer(x, attention_mask=mask, training=training)
        with pytest.raises(ValueError, match="TransformerEncoderBlock: " + want):
            block(x, attention_mask=mask, training=training, skip_padding=True)
    if len(shape) == 3 and shape[1] == S:
        with pytest.raises(ValueError, match="is that input_mask broadcast: pass the "
                                             "input_mask"):
            layer(x, attention_mask=mask)
    # The [B, S] mask, as int, float or bool, is taken.
    for right in (np.ones((B, S), "int32"), np.ones((B, S), "float32"), np.ones((B, S), bool)):
        assert tuple(layer(x, attention_mask=right).shape) == (B, S, H)
        assert tuple(block(x, attention_mask=right).shape) == (B, S, H)


@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_explicit_softmax_never_calls_the_fused_op_and_computes_the_same(monkeypatch, layout):
    """explicit_softmax=True (serving copies, `tasks.for_serving`, in either kernel layout)
    takes the explicit softmax at inference, where TensorFlow runs it faster at long
    requests than keras.ops.dot_product_attention (bench/bench_long_attention.py): the same
    function as the fused path of the training layer, a row with no real key included
    (both attend uniformly there), and the numpy reference elsewhere."""
    import keras

    x, mask, rows = _inputs(seed=3)
    mask[0, :] = 0  # no real key: uniform attention on every path
    layer = SelfAttention(N, dropout=0.1)
    layer.build((None, None, H))
    serving = SelfAttention(N, dropout=0.1, kernel_layout=layout, explicit_softmax=True)
    serving.build((None, None, H))
    serving.set_weights([w.T if w.ndim == 2 and layout == "out_in" else w
                         for w in layer.get_weights()])
    assert SelfAttention.from_config(serving.get_config()).explicit_softmax
    queries = np.take_along_axis(x, rows[:, :, None], axis=1)
    fused = [np.asarray(layer(x, attention_mask=mask, query=q), "float32")
             for q in (None, queries)]

    def refused(*args, **kwargs):
        raise AssertionError("explicit_softmax=True called keras.ops.dot_product_attention")

    monkeypatch.setattr(keras.ops, "dot_product_attention", refused)
    for query, want_fused in zip((None, queries), fused):
        served = np.asarray(serving(x, attention_mask=mask, query=query), "float32")
        want = _reference(layer, x, mask, x if query is None else queries)
        scale = np.abs(want).max()
        np.testing.assert_allclose(served, want_fused, atol=1e-5 * scale)
        assert np.abs(served[1:] - want[1:]).max() < 1e-5 * scale
    # The training layout without the switch takes the fused op (refused here).
    with pytest.raises(AssertionError, match="called keras.ops.dot_product_attention"):
        layer(x, attention_mask=mask)


def test_explicit_softmax_must_be_a_bool():
    with pytest.raises(ValueError, match=r"`explicit_softmax` must be True or False. "
                                         r"Received: 'yes'"):
        SelfAttention(N, explicit_softmax="yes")