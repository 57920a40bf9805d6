"""Flash attention with BERT's attention-probability dropout inside the kernel (JAX, Pallas).

Shapes: B = batch, Q = query length, S = key length, N = heads, D = head size. Every tensor
stays in the projections' [B, S, N, D] layout: the kernels read one head's [S, D] rows with a
stride of N * D, so no [B, S, N, D] <-> [B, N, S, D] transpose exists in the step.

`attention(q, k, v, key_bias, seed, dropout_rate=...)` computes, for every batch row b,
head h and query i,

    p[i, :] = softmax(q[i] . k[:]^T * scale + key_bias[b, :])
    out[i]  = sum_j p[i, j] * keep[b, h, i, j] / (1 - rate') * v[j]

without writing the [B, N, Q, S] probabilities to memory (FlashAttention, Dao et al. 2022,
https://arxiv.org/abs/2205.14135: the keys are visited in blocks with a running maximum and
sum). `key_bias` is the additive padding mask BERT uses (0 for a real key, -10000 for
padding: bert_keras.layers.attention). The dropout decisions `keep` are a counter-based
hash of (step seed, b, h, i, j), so the forward pass draws them in registers and the
backward pass regenerates the same ones: nothing of size [B, N, Q, S] is kept for the
backward pass either (only the [B, N, Q] log-sum-exp of each row).

The hash is two rounds (one with config "hash_rounds": 1, half the integer work) of
Wellons' lowbias32 (https://nullprogram.com/blog/2018/07/31/), keyed per (seed, b, h): 24 of
its 32 bits decide, so the rate in effect is
rate' = round(rate * 2^24) / 2^24 and kept probabilities are scaled by 1 / (1 - rate'), which
keeps the expectation exact. A fresh seed per step (the layer's Keras SeedGenerator) gives a
fresh mask per step. `keep_mask` computes the same decisions outside a kernel for tests;
tests/test_flash_attention.py checks the kept fraction and the independence of decisions
across steps, heads and positions against binomial bounds, and the gradients against the
explicit softmax given that mask.

The kernels are written with Pallas for GPUs (Triton). `interpret=True` runs them with
Pallas' interpreter on any device (tests on CPU); bert_keras.layers.attention calls them
only on a GPU (bert_keras.kernels: "flash_attention").
"""

from __future__ import annotations

import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Bits of the hash that decide a dropout: 24 keep rate' within 6e-8 of the rate asked for.
_DECISION_BITS = 24
_LOWBIAS_1 = 0x7FEB352D
_LOWBIAS_2 = 0x846CA68B - (1 << 32)  # int32 two's complement: kernels compute in int32
_GOLDEN = 0x9E3779B9 - (1 << 32)
_SECOND_KEY = 0x68E31DA4
# The bias of keys added by padding: exp(score + _NO_KEY - row max) is 0 in float32 even
# where every real key has BERT's -10000, and finite, so no inf - inf arises.
_NO_KEY = -1e30


def on_gpu():
    """Whether JAX computes on a GPU (else the kernels run interpreted, cuDNN's function on
    XLA's implementation)."""
    return jax.default_backend() == "gpu"


def supports(query_length, key_length, head_size):
    """Whether `attention` takes these sizes: any lengths, head sizes up to 256. Triton's
    matrix products want block sides that are powers of two of at least 16, so `attention`
    pads the queries and keys up to a multiple of 16 and the head size up to a power of two
    (exactly: see `attention`)."""
    return 1 <= head_size <= 256 and key_length >= 1 and query_length >= 1


def cudnn_supports(head_size, dtype):
    """Whether cuDNN's flash attention takes this head size and dtype: a multiple of 8 up
    to 128 (256 on Hopper, not relied on), bfloat16 or float16 (float32 raises
    NotImplementedError; jax._src.cudnn.fused_attention_stablehlo)."""
    return (head_size % 8 == 0 and head_size <= 128
            and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)))


def _padded_length(length):
    """Queries and keys: up to a multiple of 16 (the smallest Triton block side)."""
    return max(16, -(-length // 16) * 16)


def _padded_head_size(head_size):
    """The head size up to a power of two of at least 16."""
    return max(16, 1 << (head_size - 1).bit_length())


def dropout_threshold(rate):
    """The integer threshold of the 24-bit decision: an element is dropped when its bits are
    below it. rate' = threshold / 2^24."""
    return int(round(float(rate) * (1 << _DECISION_BITS)))


# --------------------------------------------------------------------------------------
# The hash, in int32 arithmetic (wrapping products, logical shifts): the same code runs in
# the kernels and in XLA.


def _mix(x):
    """lowbias32: a bijection of 32-bit words with low avalanche bias."""
    x = x ^ lax.shift_right_logical(x, jnp.int32(16))
    x = x * jnp.int32(_LOWBIAS_1)
    x = x ^ lax.shift_right_logical(x, jnp.int32(15))
    x = x * jnp.int32(_LOWBIAS_2)
    return x ^ lax.shift_right_logical(x, jnp.int32(16))


def _row_keys(seed0, seed1, batch_head):
    """Two 32-bit keys for one (step seed, b * N + h): int32 scalars or arrays."""
    key1 = _mix(_mix(seed0 + batch_head * jnp.int32(_GOLDEN)) ^ seed1)
    return key1, _mix(key1 ^ jnp.int32(_SECOND_KEY))


def _keep(key1, key2, rows, cols, key_length, threshold, rounds=2):
    """Bool [..., rows, cols]: whether attention link (row, col) is kept. `key_length` is
    the true S (not the kernels' padded one), so the decisions of real links do not depend
    on padding. `rounds` of the hash per decision: 2 (the default), or 1 (half the integer
    work; it passes the same statistical tests)."""
    counter = rows * jnp.int32(key_length) + cols  # unique per (i, j) of a head for S < 2^16
    bits = _mix(counter ^ key1)
    if rounds == 2:
        bits = _mix(bits + key2)
    return lax.shift_right_logical(bits, jnp.int32(32 - _DECISION_BITS)) >= jnp.int32(threshold)


def _as_int32_seed(seed):
    """A Keras seed (uint32[2] on JAX) as int32[2], bit for bit."""
    seed = jnp.asarray(seed)
    if seed.dtype != jnp.int32:
        seed = lax.bitcast_convert_type(seed.astype(jnp.uint32), jnp.int32)
    return seed


def keep_mask(seed, batch_size, num_heads, query_length, key_length, dropout_rate,
              config=None):
    """The kernels' dropout decisions as a bool Tensor [B, N, Q, S] (for tests and references).

    Args:
      seed: int Tensor [2], the step's seed (as given to `attention`).
      batch_size, num_heads, query_length, key_length: B, N, Q, S (Python ints).
      dropout_rate: float in [0, 1).
      config: as for `attention` (its "hash_rounds").
    """
    seed = _as_int32_seed(seed)
    batch_head = jnp.arange(batch_size * num_heads, dtype=jnp.int32)
    key1, key2 = _row_keys(seed[0], seed[1], batch_head)
    rows = jnp.arange(query_length, dtype=jnp.int32)[:, None]
    cols = jnp.arange(key_length, dtype=jnp.int32)[None, :]
    keep = _keep(key1[:, None, None], key2[:, None, None], rows, cols, key_length,
                 dropout_threshold(dropout_rate), configured(config)["hash_rounds"])
    return keep.reshape(batch_size, num_heads, query_length, key_length)


def reference(q, k, v, key_bias, keep=None, dropout_rate=0.0, scale=None):
    """The explicit computation the kernels implement, in float32 ([B, Q, N, D] out).

    Args:
      q: float [B, Q, N, D]; k, v: float [B, S, N, D].
      key_bias: float [B, S], added to every head's and query's scores.
      keep: optional bool [B, N, Q, S], the dropout decisions (`keep_mask`).
      dropout_rate: the rate the decisions were drawn with (for the 1 / (1 - rate') scale).
      scale: score scale; 1 / sqrt(D) by default.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("bqnd,bknd->bnqk", q.astype(jnp.float32), k.astype(jnp.float32))
    scores = scores * scale + _shifted(key_bias)[:, None, None, :]
    probs = jax.nn.softmax(scores, axis=-1)
    if keep is not None:
        kept = 1.0 - dropout_threshold(dropout_rate) / (1 << _DECISION_BITS)
        probs = jnp.where(keep, probs / kept, 0.0)
    return jnp.einsum("bnqk,bknd->bqnd", probs, v.astype(jnp.float32))


# --------------------------------------------------------------------------------------
# Kernels. Grids run over (query or key block, b, h); refs are one head's rows.


def _block(length, largest):
    """The largest power of two <= `largest`, >= 16, dividing `length`; None if none does."""
    size = largest
    while size >= 16:
        if length % size == 0:
            return size
        size //= 2
    return None


def _dot(a, b, trans_b=False, trans_a=False):
    from jax.experimental.pallas import triton as plgpu

    a = a.T if trans_a else a
    b = b.T if trans_b else b
    # float32 operands: full float32 products (Triton would take tf32 otherwise).
    precise = a.dtype == jnp.float32 and b.dtype == jnp.float32
    return plgpu.dot(a, b, allow_tf32=False if precise else None)


def _forward_kernel(seed_ref, q_ref, k_ref, v_ref, bias_ref, o_ref, lse_ref, *, scale,
                    threshold, block_k, num_heads, hash_length, rounds):
    from jax.experimental import pallas as pl

    block_q, head_size = q_ref.shape
    key_length = k_ref.shape[0]
    start_q = pl.program_id(0)
    batch_head = (seed_ref[2] + pl.program_id(1)) * num_heads + pl.program_id(2)
    q = q_ref[...]
    if threshold:
        key1, key2 = _row_keys(seed_ref[0], seed_ref[1], batch_head)
        rows = start_q * block_q + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        cols = lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def body(j, carry):
        acc, row_max, row_sum = carry
        keys = pl.ds(j * block_k, block_k)
        scores = _dot(q, k_ref[keys, :], trans_b=True) * scale + bias_ref[keys][None, :]
        new_max = jnp.maximum(row_max, jnp.max(scores, axis=1))
        correction = jnp.exp(row_max - new_max)
        probs = jnp.exp(scores - new_max[:, None])
        row_sum = row_sum * correction + jnp.sum(probs, axis=1)
        if threshold:
            keep = _keep(key1, key2, rows, j * block_k + cols, hash_length, threshold,
                         rounds)
            probs = jnp.where(keep, probs, 0.0)
        v = v_ref[keys, :]
        acc = acc * correction[:, None] + _dot(probs.astype(v.dtype), v)
        return acc, new_max, row_sum

    acc = jnp.zeros((block_q, head_size), jnp.float32)
    row_max = jnp.full((block_q,), -jnp.inf, jnp.float32)
    row_sum = jnp.zeros((block_q,), jnp.float32)
    acc, row_max, row_sum = lax.fori_loop(0, key_length // block_k, body,
                                          (acc, row_max, row_sum))
    kept = 1.0 - threshold / (1 << _DECISION_BITS)
    o_ref[...] = (acc * (1.0 / (kept * row_sum))[:, None]).astype(o_ref.dtype)
    lse_ref[...] = row_max + jnp.log(row_sum)


def _probs_and_dprobs(q, k, v, do, bias, lse, delta, keep, scale, threshold):
    """The backward pass's recomputation for one [block_q, block_k] tile: (dropped
    probabilities for dV, score gradients for dQ and dK). Float32."""
    probs = jnp.exp(_dot(q, k, trans_b=True) * scale + bias[None, :] - lse[:, None])
    dprobs = _dot(do, v, trans_b=True)
    if threshold:
        inverse_kept = 1.0 / (1.0 - threshold / (1 << _DECISION_BITS))
        dropped = jnp.where(keep, probs * inverse_kept, 0.0)
        dprobs = jnp.where(keep, dprobs * inverse_kept, 0.0)
    else:
        dropped = probs
    return dropped, probs * (dprobs - delta[:, None])


def _dkdv_kernel(seed_ref, q_ref, k_ref, v_ref, bias_ref, do_ref, lse_ref, delta_ref,
                 dk_ref, dv_ref, *, scale, threshold, block_q, num_heads, hash_length, rounds):
    from jax.experimental import pallas as pl

    block_k, head_size = k_ref.shape
    query_length = q_ref.shape[0]
    start_k = pl.program_id(0)
    batch_head = (seed_ref[2] + pl.program_id(1)) * num_heads + pl.program_id(2)
    k, v, bias = k_ref[...], v_ref[...], bias_ref[...]
    if threshold:
        key1, key2 = _row_keys(seed_ref[0], seed_ref[1], batch_head)
        rows = lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        cols = start_k * block_k + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def body(i, carry):
        dk, dv = carry
        queries = pl.ds(i * block_q, block_q)
        q, do = q_ref[queries, :], do_ref[queries, :]
        keep = (_keep(key1, key2, i * block_q + rows, cols, hash_length, threshold, rounds)
                if threshold else None)
        dropped, dscores = _probs_and_dprobs(q, k, v, do, bias, lse_ref[queries],
                                             delta_ref[queries], keep, scale, threshold)
        dv = dv + _dot(dropped.astype(do.dtype), do, trans_a=True)
        dk = dk + _dot(dscores.astype(q.dtype), q, trans_a=True)
        return dk, dv

    zeros = jnp.zeros((block_k, head_size), jnp.float32)
    dk, dv = lax.fori_loop(0, query_length // block_q, body, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(seed_ref, q_ref, k_ref, v_ref, bias_ref, do_ref, lse_ref, delta_ref, dq_ref,
               *, scale, threshold, block_k, num_heads, hash_length, rounds):
    from jax.experimental import pallas as pl

    block_q, head_size = q_ref.shape
    key_length = k_ref.shape[0]
    start_q = pl.program_id(0)
    batch_head = (seed_ref[2] + pl.program_id(1)) * num_heads + pl.program_id(2)
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    if threshold:
        key1, key2 = _row_keys(seed_ref[0], seed_ref[1], batch_head)
        rows = start_q * block_q + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        cols = lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def body(j, dq):
        keys = pl.ds(j * block_k, block_k)
        k = k_ref[keys, :]
        keep = (_keep(key1, key2, rows, j * block_k + cols, hash_length, threshold, rounds)
                if threshold else None)
        _, dscores = _probs_and_dprobs(q, k, v_ref[keys, :], do, bias_ref[keys], lse, delta,
                                       keep, scale, threshold)
        return dq + _dot(dscores.astype(k.dtype), k)

    dq = lax.fori_loop(0, key_length // block_k, body,
                       jnp.zeros((block_q, head_size), jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


# --------------------------------------------------------------------------------------
# pallas_calls


def _compiler_params(num_warps, num_stages):
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _specs(batch_size, num_heads, head_size):
    """BlockSpec makers over grids (block index, b, h)."""
    from jax.experimental import pallas as pl

    def rows(block):  # one head's `block` rows of a [B, L, N, D] tensor
        return pl.BlockSpec((None, block, None, head_size), lambda i, b, h: (b, i, h, 0))

    def whole(length):  # one head's rows, all of them
        return pl.BlockSpec((None, length, None, head_size), lambda i, b, h: (b, 0, h, 0))

    def row_stats(block):  # [B, N, L] float32 per-row statistics
        return pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, i))

    def whole_stats(length):
        return pl.BlockSpec((None, None, length), lambda i, b, h: (b, h, 0))

    def bias(block, blocked):  # [B, S]
        if blocked:
            return pl.BlockSpec((None, block), lambda i, b, h: (b, i))
        return pl.BlockSpec((None, block), lambda i, b, h: (b, 0))

    seed = pl.BlockSpec((4,), lambda i, b, h: (0,))  # (seed, seed, batch offset, 0)
    return rows, whole, row_stats, whole_stats, bias, seed


def _forward(q, k, v, key_bias, seed, *, scale, threshold, hash_length, config, interpret):
    from jax.experimental import pallas as pl

    batch_size, query_length, num_heads, head_size = q.shape
    key_length = k.shape[1]
    block_q, block_k = (_block(query_length, config["block_q"]),
                        _block(key_length, config["block_k"]))
    rows, whole, row_stats, _, bias, seed_spec = _specs(batch_size, num_heads, head_size)
    kernel = functools.partial(_forward_kernel, scale=scale, threshold=threshold,
                               block_k=block_k, num_heads=num_heads, hash_length=hash_length,
                               rounds=config["hash_rounds"])
    return pl.pallas_call(
        kernel,
        grid=(query_length // block_q, batch_size, num_heads),
        in_specs=[seed_spec, rows(block_q), whole(key_length), whole(key_length),
                  bias(key_length, False)],
        out_specs=[rows(block_q), row_stats(block_q)],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((batch_size, num_heads, query_length), jnp.float32)],
        compiler_params=_compiler_params(config["num_warps"], config["num_stages"]),
        interpret=interpret,
        name="bert_flash_attention_forward",
    )(seed, q, k, v, key_bias)


def _backward(q, k, v, key_bias, seed, out, lse, dout, *, scale, threshold, hash_length,
              config, interpret):
    from jax.experimental import pallas as pl

    batch_size, query_length, num_heads, head_size = q.shape
    key_length = k.shape[1]
    block_q = _block(query_length, config["block_q_backward"])
    block_k = _block(key_length, config["block_k_backward"])
    rows, whole, row_stats, whole_stats, bias, seed_spec = _specs(batch_size, num_heads,
                                                                 head_size)
    # delta[b, h, i] = sum_d dout * out: the row term of the softmax's gradient, which
    # dropout leaves as it is (sum_j p_ij dP_ij with the dropped dP_ij).
    delta = jnp.einsum("bqnd,bqnd->bnq", dout.astype(jnp.float32), out.astype(jnp.float32))
    params = _compiler_params(config["num_warps_backward"], config["num_stages"])
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_kernel, scale=scale, threshold=threshold, block_q=block_q,
                          num_heads=num_heads, hash_length=hash_length,
                          rounds=config["hash_rounds"]),
        grid=(key_length // block_k, batch_size, num_heads),
        in_specs=[seed_spec, whole(query_length), rows(block_k), rows(block_k),
                  bias(block_k, True), whole(query_length), whole_stats(query_length),
                  whole_stats(query_length)],
        out_specs=[rows(block_k), rows(block_k)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=params, interpret=interpret, name="bert_flash_attention_dkdv",
    )(seed, q, k, v, key_bias, dout, lse, delta)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, threshold=threshold, block_k=block_k,
                          num_heads=num_heads, hash_length=hash_length,
                          rounds=config["hash_rounds"]),
        grid=(query_length // block_q, batch_size, num_heads),
        in_specs=[seed_spec, rows(block_q), whole(key_length), whole(key_length),
                  bias(key_length, False), rows(block_q), row_stats(block_q),
                  row_stats(block_q)],
        out_specs=rows(block_q),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=params, interpret=interpret, name="bert_flash_attention_dq",
    )(seed, q, k, v, key_bias, dout, lse, delta)
    return dq, dk, dv


# Tile sizes and Triton settings. At BERT's S = 128 one block covers the keys.
DEFAULT_CONFIG = dict(block_q=128, block_k=128, block_q_backward=64, block_k_backward=64,
                      num_warps=4, num_warps_backward=4, num_stages=2, hash_rounds=2)
# A JSON object overriding DEFAULT_CONFIG where `attention` gets no config (the A/B switch
# of bench/bench_accelerator.py; read when a computation is traced, like kernels.DISABLE_ENV).
CONFIG_ENV = "BERT_KERAS_FLASH_ATTENTION_CONFIG"


def configured(config=None):
    """DEFAULT_CONFIG updated by $BERT_KERAS_FLASH_ATTENTION_CONFIG and then by `config`."""
    merged = dict(DEFAULT_CONFIG)
    if os.environ.get(CONFIG_ENV):
        try:
            override = json.loads(os.environ[CONFIG_ENV])
        except json.JSONDecodeError as error:
            raise ValueError(f"{CONFIG_ENV}: expected a JSON object, got "
                             f"{os.environ[CONFIG_ENV]!r} ({error})") from None
        unknown = sorted(set(override) - set(DEFAULT_CONFIG)) if isinstance(override, dict) \
            else ["(not an object)"]
        if unknown:
            raise ValueError(f"{CONFIG_ENV}: unknown keys {unknown}; expected some of "
                             f"{sorted(DEFAULT_CONFIG)}")
        merged.update(override)
    merged.update(config or {})
    return merged


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _attention(q, k, v, key_bias, seed, scale, threshold, hash_length, config, interpret):
    out, _ = _forward(q, k, v, key_bias, seed, scale=scale, threshold=threshold,
                      hash_length=hash_length, config=dict(config), interpret=interpret)
    return out


def _attention_fwd(q, k, v, key_bias, seed, scale, threshold, hash_length, config,
                   interpret):
    out, lse = _forward(q, k, v, key_bias, seed, scale=scale, threshold=threshold,
                        hash_length=hash_length, config=dict(config), interpret=interpret)
    return out, (q, k, v, key_bias, seed, out, lse)


def _attention_bwd(scale, threshold, hash_length, config, interpret, residuals, dout):
    q, k, v, key_bias, seed, out, lse = residuals
    dq, dk, dv = _backward(q, k, v, key_bias, seed, out, lse, dout, scale=scale,
                           threshold=threshold, hash_length=hash_length,
                           config=dict(config), interpret=interpret)
    return dq, dk, dv, jnp.zeros_like(key_bias), np.zeros(seed.shape, jax.dtypes.float0)


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, key_bias, seed=None, *, dropout_rate=0.0, scale=None, config=None,
              interpret=None, mesh=None, batch_axis=None):
    """Fused scaled dot-product attention with in-kernel dropout; differentiable.

    Args:
      q: float Tensor [B, Q, N, D] (float32, bfloat16 or float16), queries.
      k, v: float Tensors [B, S, N, D] of q's dtype, keys and values.
      key_bias: float Tensor [B, S], added to the scores of every head and query (0 for a
        real key, a large negative number for padding).
      seed: int Tensor [2] (uint32 or int32), the step's dropout seed; required when
        dropout_rate > 0.
      dropout_rate: Python float in [0, 1), the fraction of attention links dropped.
      scale: Python float, the scores' scale; 1 / sqrt(D) by default.
      config: optional dict overriding DEFAULT_CONFIG (tile sizes, Triton warps/stages) and
        $BERT_KERAS_FLASH_ATTENTION_CONFIG.
      interpret: run with Pallas' interpreter (any device: tests on CPUs); None: only
        where the default device is not a GPU.
      mesh, batch_axis: a jax.sharding.Mesh and the name of its axis the batch is split
        over (Keras' DataParallel: its device mesh and batch_dim_name). The kernels then
        run on each device's rows (`jax.shard_map`): XLA cannot split a kernel's custom
        call, and would gather every device's q, k and v to each device and compute the
        whole batch there. Each device's kernels take its rows' global batch indices, so
        the dropout decisions are those of one device. A batch the axis does not divide
        runs unsplit.

    Returns:
      Tensor [B, Q, N, D] of q's dtype.

    Sizes the Triton kernels do not take directly are padded, exactly: queries and keys
    up to a multiple of 16 (padded keys get a bias no score survives, so each real row's
    softmax, a row with every real key masked included, is the one over its S keys), the
    head size up to a power of two (zeros, which change no score). The dropout decisions of
    real links are those of `keep_mask` at the true sizes.

    Raises:
      ValueError: if the sizes are ones the kernels do not take (`supports`).
    """
    batch_size, query_length, num_heads, head_size = q.shape
    key_length = k.shape[1]
    if not supports(query_length, key_length, head_size):
        raise ValueError(f"flash attention takes head sizes up to 256 and at least one "
                         f"query and key; got D={head_size}, Q={query_length}, "
                         f"S={key_length}")
    threshold = dropout_threshold(dropout_rate)
    if threshold and seed is None:
        raise ValueError("flash attention: dropout_rate > 0 needs a seed")
    seed = jnp.zeros((2,), jnp.int32) if seed is None else _as_int32_seed(seed)
    local = functools.partial(
        _padded_attention, scale=1.0 / math.sqrt(head_size) if scale is None else float(scale),
        threshold=threshold, config=tuple(sorted(configured(config).items())),
        interpret=not on_gpu() if interpret is None else interpret)
    return on_batch_rows(local, mesh, batch_axis, (q, k, v, key_bias), (seed,))


def on_batch_rows(function, mesh, batch_axis, split, whole=()):
    """function(*split, *whole, first_row) on each device's rows of `split` (arrays whose
    first axis is the batch) under `mesh`'s `batch_axis` (`jax.shard_map`), `first_row`
    being the index in the batch of that device's first row; `whole` reaches every device
    whole. This is how the GPU kernels run under Keras' DataParallel: XLA cannot split a
    kernel's custom call, and would gather the batch to every device and compute all of it
    there. Without a mesh, or where the axis does not divide the batch: function(*split,
    *whole, 0) on the whole batch."""
    devices = 1 if mesh is None else mesh.shape[batch_axis]
    if devices == 1 or split[0].shape[0] % devices:
        return function(*split, *whole, 0)
    from jax.sharding import PartitionSpec

    def on_each_device(*args):
        return function(*args, lax.axis_index(batch_axis) * args[0].shape[0])

    specs = (PartitionSpec(batch_axis),) * len(split) + (PartitionSpec(),) * len(whole)
    return jax.shard_map(on_each_device, mesh=mesh, in_specs=specs,
                         out_specs=PartitionSpec(batch_axis), check_vma=False)(*split, *whole)


def _shifted(key_bias):
    """`key_bias` in float32 less each row's largest bias: the same softmax, and a row with
    every key masked gets biases 0, not -10000. There the scores s - 10000 would round to
    float32's ulp at 10^4 (2^-10): the log-sum-exp the backward pass recomputes
    probabilities from was 2.6e-4 off, and so were that row's gradients (the forward pass,
    rounded alike, matched a float32 reference)."""
    key_bias = key_bias.astype(jnp.float32)
    return key_bias - jnp.max(key_bias, axis=1, keepdims=True)


def _padded_attention(q, k, v, key_bias, seed, batch_offset, *, scale, threshold, config,
                      interpret):
    """`attention` on one device's rows, the first of them row `batch_offset` of the batch
    (its dropout decisions are the whole batch's)."""
    query_length, head_size = q.shape[1], q.shape[3]
    key_length = k.shape[1]
    key_bias = _shifted(key_bias)
    # Queries padded (the pretrainer's last layer attends from [CLS] and the P masked
    # positions only): padded rows are computed and dropped.
    extra_queries = _padded_length(query_length) - query_length
    extra_keys = _padded_length(key_length) - key_length
    extra_dims = _padded_head_size(head_size) - head_size
    if extra_queries or extra_dims:
        q = jnp.pad(q, ((0, 0), (0, extra_queries), (0, 0), (0, extra_dims)))
    if extra_keys or extra_dims:
        k, v = (jnp.pad(t, ((0, 0), (0, extra_keys), (0, 0), (0, extra_dims))) for t in (k, v))
        key_bias = jnp.pad(key_bias, ((0, 0), (0, extra_keys)), constant_values=_NO_KEY)
    # The kernels' int32[4] operand: the step's seed, the first row's batch index, 0.
    kernel_seed = jnp.concatenate([seed, jnp.stack([jnp.asarray(batch_offset, jnp.int32),
                                                    jnp.int32(0)])])
    out = _attention(q, k, v, key_bias, kernel_seed, scale, threshold, key_length, config,
                     interpret)
    return out[:, :query_length, :, :head_size]


# --------------------------------------------------------------------------------------
# cuDNN's flash attention, where no probability is dropped


def is_right_padded(key_mask):
    """Bool scalar: whether every row of `key_mask` ([B, S], 1 for real tokens) is ones
    followed by zeros, i.e. equal to `arange(S) < length` (what every record of
    bert-keras' tools holds)."""
    mask = key_mask.astype(jnp.int32)
    lengths = jnp.sum(mask, axis=1, keepdims=True)
    return jnp.all(mask == (jnp.arange(mask.shape[1])[None, :] < lengths).astype(jnp.int32))


def cudnn_attention(q, k, v, key_mask, *, scale, key_lengths=True, implementation=None):
    """cuDNN's fused attention (jax.nn.dot_product_attention) with BERT's padding mask.

    cuDNN refuses the [B, 1, 1, S] key mask Keras passes it (it wants a mask as long as the
    queries), which made keras.ops.dot_product_attention fall back to XLA on GPUs. Here a
    right-padded mask reaches cuDNN as key lengths (no mask in memory); any other mask as a
    [B, 1, Q, S] mask. Which one a batch takes is decided on the device (`lax.cond` on
    `is_right_padded`), so every mask gives the exact result. With `key_lengths=False`
    every batch takes the mask (bert_keras.kernels "cudnn_key_lengths" off).

    A row with no real key attends to its first key (cuDNN's result for an empty row is
    not defined); the paths on CPUs attend uniformly there, as transformers does. Such rows
    are padding examples, whose outputs no loss counts.

    Args:
      q: float Tensor [B, Q, N, D]; k, v: float Tensors [B, S, N, D] (bfloat16/float16
        for cuDNN; D and the dtype as `cudnn_supports` says, any Q and S).
      key_mask: int or bool Tensor [B, S], 1 for real tokens.
      scale: Python float, the scores' scale.
      key_lengths: whether right-padded batches go as key lengths.
      implementation: "cudnn", or "xla" (the same function on any device: tests on
        CPUs); None: cuDNN where the default device is a GPU.

    Returns:
      Tensor [B, Q, N, D] of q's dtype.
    """
    batch_size, query_length = q.shape[0], q.shape[1]
    key_mask = key_mask.astype(jnp.int32)
    if implementation is None:
        implementation = "cudnn" if on_gpu() else "xla"

    def by_mask(q):
        # cuDNN's training kernels with a mask want an even Q and S: an odd one gets one
        # more query (dropped) or one more masked key.
        padded, keys, values, mask = q, k, v, key_mask.astype(bool)
        if query_length % 2:
            padded = jnp.pad(q, ((0, 0), (0, 1), (0, 0), (0, 0)))
        if k.shape[1] % 2:
            keys, values = (jnp.pad(t, ((0, 0), (0, 1), (0, 0), (0, 0))) for t in (k, v))
            mask = jnp.pad(mask, ((0, 0), (0, 1)))
        mask = jnp.broadcast_to(mask[:, None, None, :],
                                (batch_size, 1, padded.shape[1], mask.shape[1]))
        out = jax.nn.dot_product_attention(padded, keys, values, mask=mask, scale=scale,
                                           implementation=implementation)
        return out[:, :query_length]

    if not key_lengths:
        return by_mask(q)

    def by_lengths(q):
        lengths = jnp.maximum(jnp.sum(key_mask, axis=1), 1).astype(jnp.int32)
        return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                            scale=scale, implementation=implementation)

    return lax.cond(is_right_padded(key_mask), by_lengths, by_mask, q)


# --------------------------------------------------------------------------------------
# The same hash for element-wise dropout (bert_keras.layers.Dropout on JAX)

# Keys element-wise dropout with a "head" no attention row has, so that a dropout layer and
# an attention kernel given equal seeds still draw different decisions.
_ELEMENTWISE_STREAM = -1


def dropout_keep(seed, shape, dropout_rate, rounds=2):
    """Bool Tensor of `shape`: keep decisions for element-wise dropout at `dropout_rate`.

    The decision of element e (its index in the flattened tensor) is the hash of
    (seed, e), as in the attention kernel: pure integer arithmetic on an iota, which XLA
    fuses into whatever consumes the mask, with nothing random to generate or store (JAX's
    threefry bits took 5-10 ms of a BERT-base step on an H200: BUILD_NOTES 8.10). The rate
    in effect is round(rate * 2^24) / 2^24.

    Args:
      seed: int Tensor [2], the layer's seed for this call (a Keras SeedGenerator's next()).
      shape: Python tuple, the tensor's shape (at most 2^32 elements per distinct decision).
      dropout_rate: Python float in (0, 1).
      rounds: 2 or 1 rounds of the hash per decision.
    """
    seed = _as_int32_seed(seed)
    key1, key2 = _row_keys(seed[0], seed[1], jnp.int32(_ELEMENTWISE_STREAM))
    size = int(np.prod(shape))
    counter = lax.iota(jnp.int32, size).reshape(shape) if size else jnp.zeros(shape, jnp.int32)
    bits = _mix(counter ^ key1)
    if rounds == 2:
        bits = _mix(bits + key2)
    return (lax.shift_right_logical(bits, jnp.int32(32 - _DECISION_BITS))
            >= jnp.int32(dropout_threshold(dropout_rate)))


def dropout_scale(dropout_rate):
    """1 / (1 - rate'): the scale of kept elements that keeps the expectation exact."""
    return 1.0 / (1.0 - dropout_threshold(dropout_rate) / (1 << _DECISION_BITS))
