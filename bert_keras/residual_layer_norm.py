"""LayerNorm(x + residual) as one Pallas kernel (JAX, GPU): BERT's residual sum and
LayerNorm in one pass over memory.

Every BERT layer ends its two sublayers with y = LayerNorm(x + sublayer(x)). Under XLA on an
H200 (BUILD_NOTES.md 8.10, the encoder's inference at B256 S128 bfloat16) the sum ran as a
kernel of its own (0.76 ms a batch: reads both, writes the sum) and the LayerNorm as a
reduction fusion at 25% occupancy (1.37 ms a batch, about 1.8 TB/s against the card's
4.8). This kernel reads x and the residual once, sums them, normalises in float32 and writes
y: 3 tensors' traffic instead of 6, with one row of H values per program (H padded to a
power of two for Triton, the padding masked).

    y = (h - mean(h)) / sqrt(var(h) + epsilon) * gamma + beta,   h = x + residual

over the last axis, with h summed in float32 (the unfused path sums in the compute dtype
first: the two differ by that rounding, which the fused one does not make). The backward
pass is XLA's: the closed form of bert_keras.layers.layer_norm recomputed from x and the
residual (no statistics are saved; `layer_norm.standardize` and
`layer_norm.closed_form_gradients`), so the gradients are those of the formula.

The kernel's output is laid out [rows, H] (a custom call fixes its operands' layouts): the
residual stream cannot be laid out batch-minor around it, as XLA chose for the training
step's LayerNorms (BUILD_NOTES.md 8.10: 7.8 ms of transposes a step).

`interpret=True` runs the kernel with Pallas' interpreter on any device (tests on CPUs);
bert_keras.layers.transformer_block calls it only where `kernels.applies(
"residual_layer_norm")`: JAX on a GPU, and not yet measured there (kernels.UNMEASURED).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from bert_keras.flash_attention import on_batch_rows, on_gpu
from bert_keras.layers.layer_norm import closed_form_gradients, standardize


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _forward_kernel(x_ref, r_ref, gamma_ref, beta_ref, y_ref, *, epsilon, block):
    from jax.experimental.pallas import triton as plgpu

    width = x_ref.shape[0]
    cols = jnp.arange(block)
    inside = cols < width
    h = (plgpu.load(x_ref.at[cols], mask=inside, other=0.0).astype(jnp.float32)
         + plgpu.load(r_ref.at[cols], mask=inside, other=0.0).astype(jnp.float32))
    mean = jnp.sum(h) / width
    centered = jnp.where(inside, h - mean, 0.0)
    inverse_std = jax.lax.rsqrt(jnp.sum(centered * centered) / width + epsilon)
    gamma = plgpu.load(gamma_ref.at[cols], mask=inside, other=0.0)
    beta = plgpu.load(beta_ref.at[cols], mask=inside, other=0.0)
    y = centered * inverse_std * gamma + beta
    plgpu.store(y_ref.at[cols], y.astype(y_ref.dtype), mask=inside)


def _forward(x, residual, gamma, beta, epsilon, interpret):
    """[N, H] x and residual -> [N, H] y in x's dtype."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    rows, width = x.shape
    block = _next_power_of_two(width)
    row = pl.BlockSpec((None, width), lambda i: (i, 0))
    vector = pl.BlockSpec((width,), lambda i: (0,))
    return pl.pallas_call(
        functools.partial(_forward_kernel, epsilon=epsilon, block=block),
        grid=(rows,),
        in_specs=[row, row, vector, vector],
        out_specs=row,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=min(max(block // 256, 1), 8),
                                             num_stages=1),
        interpret=interpret,
        name="bert_residual_layer_norm",
    )(x, residual, gamma, beta)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused(x, residual, gamma, beta, epsilon, interpret):
    return _forward(x, residual, gamma, beta, epsilon, interpret)


def _fused_fwd(x, residual, gamma, beta, epsilon, interpret):
    return _forward(x, residual, gamma, beta, epsilon, interpret), (x, residual, gamma)


def _fused_bwd(epsilon, interpret, saved, dy):
    x, residual, gamma = saved
    x_hat, inverse_std = standardize(x.astype(jnp.float32) + residual.astype(jnp.float32),
                                     epsilon)
    dh, d_gamma, d_beta = closed_form_gradients(dy.astype(jnp.float32), x_hat, inverse_std,
                                                gamma)
    return dh.astype(x.dtype), dh.astype(residual.dtype), d_gamma, d_beta


_fused.defvjp(_fused_fwd, _fused_bwd)


def residual_layer_norm(x, residual, gamma, beta, epsilon, interpret=None, mesh=None,
                        batch_axis=None):
    """LayerNorm(x + residual) over the last axis; differentiable.

    Args:
      x, residual: float Arrays [..., H] of one dtype (float32, bfloat16 or float16).
      gamma, beta: float32 Arrays [H].
      epsilon: Python float.
      interpret: run with Pallas' interpreter (any device: tests on CPUs); None: only where
        the default device is not a GPU.
      mesh, batch_axis: a jax.sharding.Mesh and the name of the axis the first dimension
        is split over (Keras' DataParallel): the kernel then runs on each device's rows
        (`jax.shard_map`; XLA cannot split its custom call). A first dimension the axis
        does not divide runs unsplit.

    Returns:
      Array like x.
    """
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(f"residual_layer_norm: x {x.shape} {x.dtype} and residual "
                         f"{residual.shape} {residual.dtype} must match")
    if interpret is None:
        interpret = not on_gpu()
    width = x.shape[-1]

    def local(x, residual, gamma, beta, first_row):
        y = _fused(x.reshape(-1, width), residual.reshape(-1, width),
                   gamma.astype(jnp.float32), beta.astype(jnp.float32), float(epsilon),
                   bool(interpret))
        return y.reshape(x.shape)

    return on_batch_rows(local, mesh if x.ndim > 1 else None, batch_axis, (x, residual),
                         (gamma, beta))
