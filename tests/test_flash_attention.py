"""bert_keras.flash_attention: the GPU attention kernels, checked on a CPU.

The Pallas kernels run here with Pallas' interpreter (the same kernel code, executed op by
op); cuDNN's wrapper runs with jax.nn.dot_product_attention's XLA implementation, which
computes the function cuDNN computes. References: `flash_attention.reference` (the softmax
written out, in float32) and a float64 numpy computation. The dropout decisions are checked
against binomial bounds: the kept fraction, and the independence of decisions across
steps, heads, batch rows and neighbouring positions. The last tests check that the kernels
lower to Triton for CUDA (no GPU needed) and what SelfAttention runs when the platform is a
GPU (on the JAX backend).
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bert_keras  # noqa: F401  (sets up TensorFlow before Keras is imported)
import keras
from conftest import run_module_on_backend

from bert_keras import flash_attention as fa

RATE = 0.1
# The tests of SelfAttention and Dropout run on Keras' JAX backend: in this process if it
# runs JAX, else together in one fresh JAX process (`test_keras_layers_hold_on_jax`).
ON_KERAS_JAX = pytest.mark.skipif(keras.backend.backend() != "jax",
                                  reason="Keras layers on the JAX backend")
# Tests of the kernels under a batch-sharded mesh need two JAX devices: the JAX process
# gets two host devices (XLA_FLAGS); elsewhere they skip.
TWO_DEVICES = pytest.mark.skipif(len(jax.devices()) < 2, reason="two JAX devices "
                                 "(XLA_FLAGS=--xla_force_host_platform_device_count=2)")
KERAS_JAX_TESTS = ("test_self_attention_on_a_gpu_platform_runs_the_fused_kernels",
                   "test_self_attention_on_a_gpu_platform_at_other_sizes",
                   "test_under_a_batch_mesh_each_device_runs_the_kernels_on_its_rows",
                   "test_self_attention_under_data_parallel_runs_the_kernels_per_device",
                   "test_pretraining_under_data_parallel_equals_one_device",
                   "test_dropout_layer_on_jax_drops_by_the_hash",
                   "test_self_attention_for_cuda_has_no_layout_transposes")


def _qkv(batch, query_length, key_length, heads, head_size, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)

    def draw(length):
        return jnp.asarray(rng.normal(size=(batch, length, heads, head_size)), dtype)

    return draw(query_length), draw(key_length), draw(key_length)


def _masks(batch, key_length, seed=0):
    """A right-padded mask (lengths from 1 to S) and an arbitrary one (holes, left padding),
    each row with at least one real token."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, key_length + 1, size=batch)
    lengths[0] = key_length
    right = (np.arange(key_length)[None, :] < lengths[:, None]).astype(np.int32)
    arbitrary = (rng.random((batch, key_length)) > 0.4).astype(np.int32)
    arbitrary[:, rng.integers(key_length)] = 1
    arbitrary[-1, : key_length // 2] = 0  # a left-padded row
    arbitrary[-1, key_length // 2:] = 1
    return right, arbitrary


def _bias(mask):
    return jnp.asarray((1.0 - mask) * -10000.0, jnp.float32)


def _float64_reference(q, k, v, mask):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    scores = np.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores - 10000.0 * (1 - mask[:, None, None, :])
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnqk,bknd->bqnd", probs, v)


def _relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / np.abs(b).max()


# Sizes that all differ; S = 48 with 16-row key blocks makes the online softmax visit three
# blocks; Q = 21 is padded to 32 inside (the pretrainer's last layer attends from P + 1 rows).
SMALL_BLOCKS = dict(block_q=16, block_k=16, block_q_backward=16, block_k_backward=16)


@pytest.mark.parametrize("query_length,config", [(48, SMALL_BLOCKS), (21, None)])
def test_without_dropout_the_kernel_is_the_softmax_for_any_mask(query_length, config):
    batch, key_length, heads, head_size = 3, 48, 2, 16
    q, k, v = _qkv(batch, query_length, key_length, heads, head_size)
    for mask in _masks(batch, key_length):
        want = _float64_reference(q, k, v, mask)
        got = fa.attention(q, k, v, _bias(mask), config=config)
        assert got.shape == q.shape and got.dtype == q.dtype
        assert _relative(got, want) < 1e-5
        # bfloat16 operands, float32 softmax and accumulation.
        q16, k16, v16 = (t.astype(jnp.bfloat16) for t in (q, k, v))
        got16 = fa.attention(q16, k16, v16, _bias(mask), config=config)
        assert got16.dtype == jnp.bfloat16 and _relative(got16, want) < 2e-2


def _assert_equals_the_softmax_with_keep_mask(attend, q, k, v, bias, seed):
    """attend(q, k, v) (the kernels with dropout at RATE and `seed`) against the explicit
    softmax given keep_mask's decisions for the whole batch: the forward pass, and the
    gradients of q, k and v (both backward kernels), within 1e-5. Returns the reference
    function."""
    batch, query_length, heads, _ = q.shape
    keep = fa.keep_mask(seed, batch, heads, query_length, k.shape[1], RATE)
    weights = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)

    def reference(q, k, v):
        return fa.reference(q, k, v, bias, keep, RATE)

    assert _relative(attend(q, k, v), reference(q, k, v)) < 1e-5
    got = jax.grad(lambda *t: jnp.sum(attend(*t) * weights), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda *t: jnp.sum(reference(*t) * weights), argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want):
        assert g.shape == w.shape and _relative(g, w) < 1e-5, name
    return reference


def test_with_dropout_forward_and_gradients_equal_the_softmax_with_the_kernels_mask():
    batch, query_length, key_length, heads, head_size = 2, 32, 48, 3, 16
    q, k, v = _qkv(batch, query_length, key_length, heads, head_size, seed=1)
    _, mask = _masks(batch, key_length, seed=1)
    bias = _bias(mask)
    seed = jnp.array([1234, 7], jnp.uint32)
    reference = _assert_equals_the_softmax_with_keep_mask(
        lambda q, k, v: fa.attention(q, k, v, bias, seed, dropout_rate=RATE,
                                     config=SMALL_BLOCKS), q, k, v, bias, seed)
    # Another seed: another mask, so the forward pass differs from this reference.
    other = fa.attention(q, k, v, bias, seed + 1, dropout_rate=RATE, config=SMALL_BLOCKS)
    assert _relative(other, reference(q, k, v)) > 1e-2


# Sizes Triton's blocks do not take (S and Q not multiples of 16, head sizes not powers of
# two: TinyBERT's 312 / 12 = 26, a max_seq_length of 100, a 3-token batch).
@pytest.mark.parametrize("query_length,key_length,head_size", [(100, 100, 26), (21, 37, 48),
                                                               (5, 3, 8)])
def test_sizes_the_blocks_do_not_take_are_padded_exactly(query_length, key_length, head_size):
    batch, heads = 2, 3
    q, k, v = _qkv(batch, query_length, key_length, heads, head_size, seed=5)
    right, arbitrary = _masks(batch, key_length, seed=5)
    for mask in (right, arbitrary):
        got = fa.attention(q, k, v, _bias(mask))
        assert got.shape == q.shape
        assert _relative(got, _float64_reference(q, k, v, mask)) < 1e-5
    # A row whose every key is masked (a padding example): the softmax over its S keys,
    # as the explicit path computes it, not over the padded ones.
    masked = right.copy()
    masked[1] = 0
    assert _relative(fa.attention(q, k, v, _bias(masked)),
                     fa.reference(q, k, v, _bias(masked))) < 1e-5
    q16, k16, v16 = (t.astype(jnp.bfloat16) for t in (q, k, v))
    assert _relative(fa.attention(q16, k16, v16, _bias(arbitrary)),
                     _float64_reference(q, k, v, arbitrary)) < 2e-2
    # With dropout: the real links' decisions are keep_mask's at the true sizes, in the
    # forward pass and in both backward kernels.
    bias = _bias(arbitrary)
    seed = jnp.array([3, 9], jnp.uint32)
    _assert_equals_the_softmax_with_keep_mask(
        lambda q, k, v: fa.attention(q, k, v, bias, seed, dropout_rate=RATE), q, k, v, bias,
        seed)


def _float64_gradients(q, k, v, bias, keep, rate, cotangent):
    """numpy float64: the gradients of sum(cotangent * attention) for q, k and v, the
    softmax's backward pass written out (dropout given by `keep` and `rate`)."""
    q, k, v, bias, cotangent = (np.asarray(t, np.float64) for t in (q, k, v, bias, cotangent))
    scale = 1 / math.sqrt(q.shape[-1])
    scores = np.einsum("bqnd,bknd->bnqk", q, k) * scale + bias[:, None, None, :]
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    kept = np.ones(probs.shape) if keep is None else np.asarray(keep) / (
        1 - fa.dropout_threshold(rate) / 2 ** 24)
    dv = np.einsum("bnqk,bqnd->bknd", probs * kept, cotangent)
    dprobs = np.einsum("bqnd,bknd->bnqk", cotangent, v) * kept
    dscores = probs * (dprobs - np.sum(probs * dprobs, -1, keepdims=True))
    dq = np.einsum("bnqk,bknd->bqnd", dscores, k) * scale
    dk = np.einsum("bnqk,bqnd->bknd", dscores, q) * scale
    return dq, dk, dv


@pytest.mark.parametrize("length,head_size", [(2, 8), (21, 16)])
def test_a_row_with_every_key_masked_has_exact_gradients(length, head_size):
    """A padding example (every key masked) attends by its raw scores. With Google's -10000
    on every key its scores rounded to float32's ulp at 10^4 (2^-10), and the backward
    pass, recomputing probabilities from the row's log-sum-exp, gave its gradients 2.6e-4
    off the float64 softmax's; now they are exact like every other row's (forward and
    gradients within 1e-5, with and without dropout)."""
    batch, heads = 3, 2
    q, k, v = _qkv(batch, length, length, heads, head_size, seed=11)
    mask = np.ones((batch, length), np.int32)
    mask[0] = 0  # the padding example
    mask[1, 1:] = 0  # one real key
    bias = _bias(mask)
    cotangent = jnp.asarray(np.random.default_rng(12).normal(size=q.shape), jnp.float32)
    seed = jnp.array([5, 6], jnp.uint32)
    for rate in (0.0, RATE):
        keep = fa.keep_mask(seed, batch, heads, length, length, rate) if rate else None

        def attend(q, k, v):
            return fa.attention(q, k, v, bias, seed if rate else None, dropout_rate=rate)

        want = np.einsum("bnqk,bknd->bqnd", _float64_probs(q, k, mask, keep, rate),
                         np.asarray(v, np.float64))
        assert _relative(attend(q, k, v), want) < 1e-5, rate
        got = jax.grad(lambda *t: jnp.sum(attend(*t) * cotangent), argnums=(0, 1, 2))(q, k, v)
        wanted = _float64_gradients(q, k, v, (1.0 - mask) * -10000.0, keep, rate, cotangent)
        scale = max(np.abs(w).max() for w in wanted)
        for name, g, w in zip("qkv", got, wanted):
            assert np.abs(np.asarray(g, np.float64) - w).max() < 1e-5 * scale, (rate, name)


def _float64_probs(q, k, mask, keep, rate):
    """numpy float64: the kernels' (dropped and rescaled) probabilities, [B, N, Q, S]."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    scores = (np.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(q.shape[-1])
              - 10000.0 * (1 - mask[:, None, None, :]))
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if keep is not None:
        probs = probs * np.asarray(keep) / (1 - fa.dropout_threshold(rate) / 2 ** 24)
    return probs


def test_sizes_over_256_are_refused_with_the_reason():
    q, k, v = _qkv(1, 16, 16, 1, 272)
    assert not fa.supports(16, 16, 272) and fa.supports(16, 16, 256)
    with pytest.raises(ValueError, match="head sizes up to 256.*D=272"):
        fa.attention(q, k, v, jnp.zeros((1, 16)))


# (B, N, S): block-sized; and one batch row, an odd number of heads and a length the kernel
# pads (37 keys to 48, head size 37 to 64), whose real links must keep keep_mask's decisions.
@pytest.mark.parametrize("rounds,batch,heads,length", [(2, 2, 3, 32), (1, 2, 3, 32),
                                                       (2, 1, 5, 37)])
def test_the_kernel_drops_exactly_the_decisions_keep_mask_describes(rounds, batch, heads,
                                                                    length):
    # Uniform probabilities (q = 0), no padding, v = identity over the keys (D = S): each
    # output row is keep[b, h, i, :] / (S (1 - rate')), the kernel's own decisions.
    q = jnp.zeros((batch, length, heads, length), jnp.float32)
    k = jnp.asarray(np.random.default_rng(0).normal(size=q.shape), jnp.float32)
    v = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], q.shape)
    seed = jnp.array([99, 3], jnp.uint32)
    config = {"hash_rounds": rounds}
    out = fa.attention(q, k, v, jnp.zeros((batch, length)), seed, dropout_rate=0.5,
                       config=config)
    kept = 1.0 - fa.dropout_threshold(0.5) / 2 ** 24
    decisions = np.asarray(out).transpose(0, 2, 1, 3) * length * kept  # [B, N, Q, S]
    want = np.asarray(fa.keep_mask(seed, batch, heads, length, length, 0.5, config),
                      np.float64)
    np.testing.assert_allclose(decisions, want, atol=1e-5)


def _binomial_ok(count, trials, probability, sigmas=5.0):
    return abs(count - trials * probability) < sigmas * math.sqrt(
        trials * probability * (1 - probability))


# (B, N, S, rate): BERT-base's heads at S 128; and one batch row, an odd number of heads, a
# length no block size divides and rate 0.5.
@pytest.mark.parametrize("rounds,batch,heads,length,asked", [
    (2, 8, 12, 128, RATE), (1, 8, 12, 128, RATE), (2, 1, 5, 37, 0.5)])
def test_dropout_decisions_are_independent_bernoulli_draws(rounds, batch, heads, length,
                                                           asked):
    config = {"hash_rounds": rounds}
    rate = fa.dropout_threshold(asked) / 2 ** 24
    assert abs(rate - asked) < 2 ** -24
    dropped = ~np.asarray(fa.keep_mask(jnp.array([5, 0], jnp.uint32), batch, heads, length,
                                       length, asked, config))
    n = dropped.size
    assert _binomial_ok(dropped.sum(), n, rate)
    # Pairs that must be independent: the next step (the seed's counter), another run (the
    # seed's first word), the next head, batch row, query and key.
    pairs = {
        "next step": ~np.asarray(fa.keep_mask(jnp.array([5, 1], jnp.uint32), batch, heads,
                                              length, length, asked, config)),
        "another run": ~np.asarray(fa.keep_mask(jnp.array([6, 0], jnp.uint32), batch, heads,
                                                length, length, asked, config)),
    }
    for name, other in pairs.items():
        assert _binomial_ok((dropped & other).sum(), n, rate * rate), name
        assert (dropped != other).any(), name
    for axis, name in ((1, "head"), (0, "batch row"), (2, "query"), (3, "key")):
        a = np.moveaxis(dropped, axis, 0)
        if len(a) < 2:
            continue  # one batch row
        both = (a[1:] & a[:-1]).sum()
        assert _binomial_ok(both, a[1:].size, rate * rate), name
    # Within a row, the number dropped is binomial: its variance too (a test of
    # dependence that a mean cannot see), within 4 standard errors of the sample variance
    # of m rows, (mu_4 - sigma^4) / m with a binomial's mu_4 = sigma^2 (1 + 3 (S - 2) p q)
    # (5% of the variance at S 128, B 8, N 12).
    per_row = dropped.sum(-1).ravel()
    variance = length * rate * (1 - rate)
    fourth = variance * (1 + 3 * (length - 2) * rate * (1 - rate))
    assert abs(per_row.var() - variance) < 4 * math.sqrt((fourth - variance ** 2) / per_row.size)


@pytest.mark.parametrize("length", [24, 23])
def test_cudnn_wrapper_equals_the_softmax_for_right_padded_and_arbitrary_masks(monkeypatch,
                                                                              length):
    batch, heads, head_size = 4, 2, 8
    q, k, v = _qkv(batch, length, length, heads, head_size, seed=3)
    right, arbitrary = _masks(batch, length, seed=3)
    assert bool(fa.is_right_padded(jnp.asarray(right)))
    assert not bool(fa.is_right_padded(jnp.asarray(arbitrary)))
    # What reaches jax.nn.dot_product_attention on each branch (both are traced; the
    # device picks one per batch).
    calls = []
    original = jax.nn.dot_product_attention

    def recording(*args, **kwargs):
        calls.append({k: getattr(v, "shape", v) for k, v in kwargs.items()})
        return original(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
    for mask in (right, arbitrary):
        for key_lengths in (True, False):
            got = fa.cudnn_attention(q, k, v, jnp.asarray(mask), scale=1 / math.sqrt(head_size),
                                     key_lengths=key_lengths, implementation="xla")
            assert _relative(got, _float64_reference(q, k, v, mask)) < 1e-5
    by_lengths = [c for c in calls if "key_value_seq_lengths" in c]
    by_mask = [c for c in calls if "mask" in c]
    assert by_lengths and all(c["key_value_seq_lengths"] == (batch,) for c in by_lengths)
    # cuDNN's training kernels with a mask want even lengths: an odd one is padded.
    even = length + length % 2
    assert by_mask and all(c["mask"] == (batch, 1, even, even) for c in by_mask)
    assert len(by_lengths) == 2 and len(by_mask) == 4  # key_lengths=False: the mask only
    # Gradients through the (padded) mask branch: the padded key's slice is dropped.
    bias = _bias(arbitrary)
    got = jax.grad(lambda *t: jnp.sum(fa.cudnn_attention(
        *t, jnp.asarray(arbitrary), scale=1 / math.sqrt(head_size), key_lengths=False,
        implementation="xla") ** 2), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda *t: jnp.sum(fa.reference(*t, bias) ** 2), argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want):
        assert g.shape == w.shape and _relative(g, w) < 1e-5, name


@pytest.mark.parametrize("length,head_size", [(128, 64), (100, 26)])
def test_kernels_lower_to_triton_for_cuda(length, head_size):
    """The Pallas kernels go through Pallas' Triton lowering for CUDA (what a GPU compiles):
    forward, and both backward kernels, at BERT-base's head and sequence sizes and at sizes
    that are padded."""
    from jax import export

    sds = jax.ShapeDtypeStruct
    qkv = sds((2, length, 12, head_size), jnp.bfloat16)

    def step(q, k, v, bias, seed):
        out, vjp = jax.vjp(
            lambda q, k, v: fa.attention(q, k, v, bias, seed, dropout_rate=RATE,
                                         interpret=False), q, k, v)
        return out, vjp(out)

    exported = export.export(
        jax.jit(step), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(
        qkv, qkv, qkv, sds((2, length), jnp.float32), sds((2,), jnp.uint32))
    text = exported.mlir_module()
    for name in ("bert_flash_attention_forward", "bert_flash_attention_dkdv",
                 "bert_flash_attention_dq"):
        assert f'name = "{name}"' in text, name
    assert text.count("__gpu$xla.gpu.triton") == 3
    # No [B, N, S, S] tensor and no transpose outside the kernels.
    assert f"tensor<2x12x{length}x{length}" not in text
    assert "stablehlo.transpose" not in text


def _recording(monkeypatch, used):
    """fa's two entry points, recording which one the layer calls."""
    for name in ("cudnn_attention", "attention"):
        original = getattr(fa, name)
        monkeypatch.setattr(fa, name, lambda *a, _f=original, _n=name, **kw: (
            used.append(_n), _f(*a, **kw))[1])


@ON_KERAS_JAX
def test_self_attention_on_a_gpu_platform_runs_the_fused_kernels(monkeypatch):
    """SelfAttention with the platform taken for a GPU: cuDNN's wrapper where nothing is
    dropped and the layer computes in 16 bits, the Pallas kernel in training with attention
    dropout and in float32 (which cuDNN refuses), each equal to the explicit path (the
    TensorFlow and CPU computation) given the kernel's mask."""
    from bert_keras import kernels
    from bert_keras.layers import SelfAttention

    batch, length, hidden, heads = 3, 32, 48, 3
    rng = np.random.default_rng(4)
    x = rng.normal(size=(batch, length, hidden)).astype("float32")
    _, mask = _masks(batch, length, seed=4)
    layer = SelfAttention(heads, dropout=RATE)
    layer.build((None, None, hidden))
    explicit = np.asarray(layer(x, attention_mask=mask), "float32")  # XLA's fused, on CPU
    half = SelfAttention(heads, dropout=RATE, dtype="mixed_bfloat16")
    half.build((None, None, hidden))
    half.set_weights(layer.get_weights())
    explicit_half = np.asarray(half(x, attention_mask=mask), "float32")

    used = []
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    _recording(monkeypatch, used)
    inference = np.asarray(half(x, attention_mask=mask), "float32")
    assert used == ["cudnn_attention"]
    assert _relative(inference, explicit_half) < 1e-5
    assert _relative(inference, explicit) < 2e-2
    inference = np.asarray(layer(x, attention_mask=mask), "float32")
    assert used == ["cudnn_attention", "attention"]
    assert _relative(inference, explicit) < 1e-5
    # A subset of the queries (the pretrainer's last layer) takes the Pallas kernel.
    rows = np.asarray(x[:, [0, 5, 9]])
    subset = np.asarray(half(x, attention_mask=mask, query=rows), "float32")
    assert used == ["cudnn_attention", "attention", "attention"]
    assert _relative(subset, explicit_half[:, [0, 5, 9]]) < 2e-2
    used.clear()

    seed = np.asarray(layer.dropout_layer.seed_generator.state.value)
    training = np.asarray(layer(x, attention_mask=mask, training=True), "float32")
    assert used == ["attention"]
    q, k, v = (np.asarray(dense(x)).reshape(batch, length, heads, hidden // heads)
               for dense in (layer.query, layer.key, layer.value))
    keep = fa.keep_mask(seed, batch, heads, length, length, RATE)
    want = fa.reference(q, k, v, _bias(mask), keep, RATE).reshape(batch, length, hidden)
    assert _relative(training, want) < 1e-5
    assert keras.backend.backend() == "jax"


@ON_KERAS_JAX
def test_self_attention_on_a_gpu_platform_at_other_sizes(monkeypatch):
    """max_seq_length 100 and TinyBERT's head size 26 (312 / 12) still run fused on a GPU
    (bfloat16, as trained there): cuDNN where it takes the head size, the (padded) Pallas
    kernel otherwise; a head size no kernel takes goes to XLA's attention directly, not
    through Keras' cuDNN attempt (which logs "Failed to apply")."""
    from bert_keras import kernels
    from bert_keras.layers import SelfAttention

    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    used = []
    _recording(monkeypatch, used)
    original_ops = keras.ops.dot_product_attention
    monkeypatch.setattr(keras.ops, "dot_product_attention", lambda *a, **kw: (
        used.append(("ops", kw.get("flash_attention"))), original_ops(*a, **kw))[1])
    batch, length = 2, 100
    _, mask = _masks(batch, length, seed=7)
    for hidden, heads, inference_path in ((96, 3, "cudnn_attention"), (78, 3, "attention"),
                                          (272, 1, ("ops", False))):
        x = np.random.default_rng(hidden).normal(size=(batch, length, hidden)).astype("float32")
        layer = SelfAttention(heads, dropout=RATE, dtype="mixed_bfloat16")
        layer.build((None, None, hidden))
        q, k, v = (np.asarray(dense(x)).reshape(batch, length, heads, hidden // heads)
                   for dense in (layer.query, layer.key, layer.value))  # bfloat16
        used.clear()
        inference = np.asarray(layer(x, attention_mask=mask), "float32")
        assert used == [inference_path], hidden
        want = fa.reference(q, k, v, _bias(mask)).reshape(batch, length, hidden)
        assert _relative(inference, want) < 1e-2, hidden
        if hidden == 272:
            continue
        used.clear()
        seed = np.asarray(layer.dropout_layer.seed_generator.state.value)
        training = np.asarray(layer(x, attention_mask=mask, training=True), "float32")
        assert used == ["attention"], hidden
        keep = fa.keep_mask(seed, batch, heads, length, length, RATE)
        want = fa.reference(q, k, v, _bias(mask), keep, RATE).reshape(batch, length, hidden)
        assert _relative(training, want) < 1e-2, hidden
        # Another step's decisions differ by more than the bfloat16 tolerance.
        other = fa.keep_mask(seed + 1, batch, heads, length, length, RATE)
        assert _relative(training, fa.reference(q, k, v, _bias(mask), other, RATE).reshape(
            batch, length, hidden)) > 5e-2, hidden


def test_the_config_switch_overrides_tiles_and_refuses_unknown_keys(monkeypatch):
    monkeypatch.setenv(fa.CONFIG_ENV, '{"block_q_backward": 32}')
    assert fa.configured()["block_q_backward"] == 32
    assert fa.configured({"block_q_backward": 16})["block_q_backward"] == 16
    assert fa.configured()["block_k"] == fa.DEFAULT_CONFIG["block_k"]
    monkeypatch.setenv(fa.CONFIG_ENV, '{"block_x": 32}')
    with pytest.raises(ValueError, match=r"unknown keys \['block_x'\]"):
        fa.configured()
    monkeypatch.setenv(fa.CONFIG_ENV, "[32]")
    with pytest.raises(ValueError, match="not an object"):
        fa.configured()


def test_elementwise_dropout_decisions_are_independent_bernoulli_draws():
    shape = (64, 128, 96)
    dropped = ~np.asarray(fa.dropout_keep(jnp.array([3, 0], jnp.uint32), shape, RATE))
    rate = fa.dropout_threshold(RATE) / 2 ** 24
    assert _binomial_ok(dropped.sum(), dropped.size, rate)
    flat = dropped.reshape(-1)
    assert _binomial_ok((flat[1:] & flat[:-1]).sum(), flat.size - 1, rate * rate)
    for axis in range(3):
        a = np.moveaxis(dropped, axis, 0)
        assert _binomial_ok((a[1:] & a[:-1]).sum(), a[1:].size, rate * rate), axis
    following = ~np.asarray(fa.dropout_keep(jnp.array([3, 1], jnp.uint32), shape, RATE))
    assert _binomial_ok((dropped & following).sum(), dropped.size, rate * rate)
    # Not the attention kernel's stream for the same seed (B=64 rows of N=1 head, S=128).
    attention = ~np.asarray(fa.keep_mask(jnp.array([3, 0], jnp.uint32), 64, 1, 128, 96, RATE))
    assert _binomial_ok((dropped & attention[:, 0]).sum(), dropped.size, rate * rate)
    assert fa.dropout_scale(RATE) == pytest.approx(1 / (1 - rate), rel=1e-12)


@ON_KERAS_JAX
def test_dropout_layer_on_jax_drops_by_the_hash():
    from bert_keras.layers import Dropout

    layer = Dropout(0.25, seed=9)
    x = np.random.default_rng(0).normal(size=(32, 48, 40)).astype("float32")
    seed = np.asarray(layer.seed_generator.state.value)
    y = np.asarray(layer(x, training=True))
    keep = np.asarray(fa.dropout_keep(seed, x.shape, 0.25))
    np.testing.assert_allclose(y, np.where(keep, x * fa.dropout_scale(0.25), 0), rtol=1e-6)
    assert not np.array_equal(y, np.asarray(layer(x, training=True)))  # the seed advances
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)
    # The gradient is the mask, and bfloat16 stays bfloat16.
    import jax

    grad = jax.grad(lambda v: (layer(v, training=True) * x).sum())(x)
    ratio = np.asarray(grad, np.float64) / x
    assert np.all(np.isclose(ratio, 0.0, atol=1e-6)
                  | np.isclose(ratio, fa.dropout_scale(0.25), rtol=1e-5))
    y16 = Dropout(0.1, dtype="mixed_bfloat16")(x, training=True)
    assert keras.backend.standardize_dtype(y16.dtype) == "bfloat16"


@ON_KERAS_JAX
def test_self_attention_for_cuda_has_no_layout_transposes(monkeypatch):
    """SelfAttention's training step (forward and gradients) as a GPU compiles it, exported
    for CUDA from this CPU: the fused kernels read the projections' [B, S, N, D] layout, so
    no 4-D tensor is transposed and no [B, N, S, S] tensor exists."""

    from jax import export

    from bert_keras import kernels
    from bert_keras.layers import SelfAttention

    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setattr(fa, "on_gpu", lambda: True)
    batch, length, hidden, heads = 3, 48, 64, 4
    layer = SelfAttention(heads, dropout=RATE)
    layer.build((None, None, hidden))
    trainable = [v.value for v in layer.trainable_variables]
    others = [v.value for v in layer.non_trainable_variables]

    def step(trainable, x, mask, rows):
        def loss(trainable):
            full, _ = layer.stateless_call(trainable, others, x, attention_mask=mask,
                                           training=True)
            subset, _ = layer.stateless_call(trainable, others, x, attention_mask=mask,
                                             query=rows)
            return jnp.sum(full.astype(jnp.float32)) + jnp.sum(subset.astype(jnp.float32))
        return jax.grad(loss)(trainable)

    sds = jax.ShapeDtypeStruct
    exported = export.export(
        jax.jit(step), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(
        [sds(t.shape, t.dtype) for t in trainable], sds((batch, length, hidden), jnp.float32),
        sds((batch, length), jnp.int32), sds((batch, 5, hidden), jnp.float32))
    text = exported.mlir_module()
    assert text.count("__gpu$xla.gpu.triton") == 6  # training and query-subset paths
    transposes = re.findall(r"stablehlo.transpose.*", text)
    assert not [t for t in transposes if re.search(r"tensor<\d+x\d+x\d+x\d+x", t)], transposes
    assert f"tensor<{batch}x{heads}x{length}x{length}x" not in text


def _batch_mesh():
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:2]), ("batch",))


@TWO_DEVICES
def test_under_a_batch_mesh_each_device_runs_the_kernels_on_its_rows():
    """Under a batch-sharded mesh (Keras' DataParallel) the kernels run on each device's
    rows (`jax.shard_map`): the Triton calls a GPU compiles take the local batch, where XLA,
    which cannot split a custom call, would gather the batch to every device. The dropout
    decisions stay the whole batch's (each device's kernels take its rows' global indices),
    in the forward pass and both backward kernels."""
    from jax import export
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = _batch_mesh()
    rows = NamedSharding(mesh, PartitionSpec("batch"))
    batch, query_length, key_length, heads, head_size = 4, 20, 37, 3, 16
    q, k, v = (jax.device_put(t, rows) for t in _qkv(batch, query_length, key_length, heads,
                                                      head_size, seed=8))
    _, mask = _masks(batch, key_length, seed=8)
    bias = jax.device_put(_bias(mask), rows)
    seed = jnp.array([5, 6], jnp.uint32)
    kernel = jax.jit(lambda q, k, v: fa.attention(q, k, v, bias, seed, dropout_rate=RATE,
                                                  mesh=mesh, batch_axis="batch"))
    out = kernel(q, k, v)
    assert out.sharding.is_equivalent_to(rows, out.ndim)
    reference = _assert_equals_the_softmax_with_keep_mask(kernel, q, k, v, bias, seed)
    # A batch the mesh does not divide runs unsplit, with the same decisions.
    odd = fa.attention(q[:3], k[:3], v[:3], bias[:3], seed, dropout_rate=RATE, mesh=mesh,
                       batch_axis="batch")
    assert _relative(odd, reference(q, k, v)[:3]) < 1e-5

    sds = jax.ShapeDtypeStruct
    qkv = sds((4, 128, 12, 64), jnp.bfloat16, sharding=rows)

    def triton_operands(mesh):
        def step(q, k, v, bias, seed):
            out, vjp = jax.vjp(lambda q, k, v: fa.attention(
                q, k, v, bias, seed, dropout_rate=RATE, interpret=False, mesh=mesh,
                batch_axis="batch"), q, k, v)
            return out, vjp(out)

        text = export.export(jax.jit(step), platforms=["cuda"], disabled_checks=[
            export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(
            qkv, qkv, qkv, sds((4, 128), jnp.float32, sharding=rows),
            sds((2,), jnp.uint32)).mlir_module()
        calls = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
        return {shape for line in calls for shape in
                re.findall(r"tensor<(\d+)x128x12x64xbf16>", line)}, len(calls)

    assert triton_operands(mesh) == ({"2"}, 3)  # each device's 2 rows
    assert triton_operands(None) == ({"4"}, 3)  # the whole batch, which XLA would gather


@ON_KERAS_JAX
@TWO_DEVICES
def test_self_attention_under_data_parallel_runs_the_kernels_per_device(monkeypatch):
    """SelfAttention under keras.distribution.DataParallel (what --distribution_strategy=
    mirrored and multi_worker_mirrored are on JAX) hands the kernels the distribution's
    mesh and batch axis; training equals the explicit softmax with the whole batch's
    dropout decisions."""
    from bert_keras import kernels
    from bert_keras.layers import SelfAttention

    batch, length, hidden, heads = 4, 32, 48, 3
    x = np.random.default_rng(10).normal(size=(batch, length, hidden)).astype("float32")
    _, mask = _masks(batch, length, seed=10)
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    meshes = []
    original = fa.attention
    monkeypatch.setattr(fa, "attention", lambda *a, **kw: (
        meshes.append((kw.get("mesh"), kw.get("batch_axis"))), original(*a, **kw))[1])
    distribution = keras.distribution.DataParallel(devices=jax.devices()[:2])
    with distribution.scope():
        layer = SelfAttention(heads, dropout=RATE)
        layer.build((None, None, hidden))
        seed = np.asarray(layer.dropout_layer.seed_generator.state.value)
        training = np.asarray(layer(x, attention_mask=mask, training=True), "float32")
    [(mesh, axis)] = meshes
    assert axis == distribution.batch_dim_name and mesh.shape[axis] == 2
    q, k, v = (np.asarray(dense(x)).reshape(batch, length, heads, hidden // heads)
               for dense in (layer.query, layer.key, layer.value))
    keep = fa.keep_mask(seed, batch, heads, length, length, RATE)
    want = fa.reference(q, k, v, _bias(mask), keep, RATE).reshape(batch, length, hidden)
    assert _relative(training, want) < 1e-5


@ON_KERAS_JAX
@TWO_DEVICES
def test_pretraining_under_data_parallel_equals_one_device(monkeypatch):
    """The accelerator bench's pretrainer (BERT's recipe: attention dropout in the Pallas
    kernel, hidden dropout by the hash), fit under Keras' DataParallel over two devices with
    the platform taken for a GPU, has the losses of one device, step for step: the kernels
    run per device inside Keras' train step and draw the whole batch's decisions."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    import bench_accelerator

    from bert_keras import kernels

    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    calls = []
    original = fa.attention
    monkeypatch.setattr(fa, "attention", lambda *a, **kw: (
        calls.append(kw["mesh"].shape["batch"]), original(*a, **kw))[1])
    size = dict(bench_accelerator.SIZES["tiny"], vocab=2000, batch=8)
    histories, trained = {}, {}
    for devices in (1, 2):
        keras.utils.set_random_seed(0)
        with keras.distribution.DataParallel(devices=jax.devices()[:devices]).scope():
            model, feed = bench_accelerator.build_ours(size, {})
            features, labels, weights = feed(bench_accelerator.synthetic_batches(size, count=2))
            histories[devices] = model.fit(features, labels, sample_weight=weights,
                                           batch_size=8, epochs=2, shuffle=False,
                                           verbose=0).history
        trained[devices] = [np.asarray(w) for w in model.get_weights()]
    assert set(calls) == {1, 2}  # the kernels ran under both meshes
    for name, values in histories[1].items():
        np.testing.assert_allclose(histories[2][name], values, rtol=1e-5, err_msg=name)
    # The weights after two AdamW updates (lr 1e-4): within float32 noise of one device's
    # (other dropout decisions on one device's rows move them by up to a step, 1e-4).
    difference = max(float(np.abs(a - b).max()) for a, b in zip(trained[1], trained[2]))
    assert difference < 1e-6, difference


@pytest.mark.integration  # this module in a fresh JAX process: ~70 s on 2 cores (the default suite's time)
def test_keras_layers_hold_on_jax():
    """The Keras-layer tests above on Keras' JAX backend, in one fresh process with two host
    devices (the tests under a mesh need them; the others use the first)."""
    run_module_on_backend("jax", __file__, len(KERAS_JAX_TESTS), "-k",
                          " or ".join(KERAS_JAX_TESTS),
                          env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
