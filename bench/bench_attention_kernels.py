r"""BERT's attention alone, forward + backward, on JAX: every path SelfAttention can take.

    python bench/bench_attention_kernels.py --size=base --out=/tmp/attention

The A/B of bert_keras.flash_attention against the library's attention (bert_keras.kernels
decides which runs; BUILD_NOTES.md has the figures). One layer's attention at the size's
shapes (base: B256 S128 N12 D64, bfloat16), a quarter of the rows right-padded to lengths
drawn between S/2 and S, timed as jax.jit(value_and_grad) of sum(out * w) with respect to
q, k and v (the projections' [B, S, N, D] layout in and out):

  explicit       the softmax written out, 16-bit dropout on the [B, N, S, S] probabilities
                 (what SelfAttention ran with attention dropout before: Google's computation)
  xla_fused      jax.nn.dot_product_attention(implementation="xla") with the [B, 1, 1, S]
                 mask keras.ops.dot_product_attention passes (rate 0)
  cudnn_lengths  cuDNN's flash attention, the mask as key lengths (rate 0)
  cudnn_mask     cuDNN's flash attention with a [B, 1, S, S] mask (rate 0)
  cudnn_cond     bert_keras.flash_attention.cudnn_attention: lengths or mask, decided on the
                 device per batch (what SelfAttention runs at rate 0 on a GPU)
  flash          the Pallas kernel at rate 0 and at BERT's 0.1, with tile variants

Then a stack of 12 such attentions (the layers of BERT-base, output feeding the next
queries) for cudnn_cond against cudnn_lengths and cudnn_mask: `lax.cond` in every layer
must not cost more than the mask it saves. Before timing, every path is checked against
`flash_attention.reference` in float32 (the Pallas kernel with dropout against the
reference given its own decisions). Needs a GPU for the cuDNN and Pallas rows (on a CPU
they are skipped, the Pallas kernel runs interpreted at --size=tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = {
    # batch, sequence, heads, head size
    "tiny": (4, 32, 2, 16),
    "base": (256, 128, 12, 64),
    "large": (128, 128, 16, 64),
    "base512": (32, 512, 12, 64),
}
FLASH_CONFIGS = {
    "flash": {},
    "flash[bwd128,w8]": dict(block_q_backward=128, block_k_backward=128, num_warps_backward=8),
    "flash[bwd32]": dict(block_q_backward=32, block_k_backward=32),
    "flash[fwd64]": dict(block_q=64),
    "flash[1 round]": dict(hash_rounds=1),
}


def make_inputs(size, seed=0):
    import jax.numpy as jnp
    import numpy as np

    batch, length, heads, head_size = SIZES[size]
    rng = np.random.default_rng(seed)
    lengths = np.full(batch, length)
    padded = rng.random(batch) < 0.25
    lengths[padded] = rng.integers(length // 2, length, size=padded.sum())
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)

    def draw():
        return jnp.asarray(rng.normal(size=(batch, length, heads, head_size)), jnp.bfloat16)

    return draw(), draw(), draw(), jnp.asarray(mask), draw()


def paths(rate):
    """name -> f(q, k, v, mask, seed) -> [B, S, N, D]."""
    import jax
    import jax.numpy as jnp

    from bert_keras import flash_attention as fa

    def explicit(q, k, v, mask, seed):
        scale = 1.0 / q.shape[-1] ** 0.5
        qt, kt, vt = (jnp.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))
        scores = jnp.matmul(qt, jnp.swapaxes(kt, 2, 3)).astype(jnp.float32) * scale
        scores = scores + (1.0 - mask[:, None, None, :].astype(jnp.float32)) * -10000.0
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        bits = jax.random.bits(jax.random.key_data(jax.random.key(0)) + seed, probs.shape,
                               jnp.uint16)
        threshold = round(rate * 65536)
        probs = jnp.where(bits >= threshold, probs * (65536 / (65536 - threshold)), 0)
        return jnp.transpose(jnp.matmul(probs, vt), (0, 2, 1, 3))

    def xla_fused(q, k, v, mask, seed):
        return jax.nn.dot_product_attention(q, k, v, mask=mask.astype(bool)[:, None, None, :],
                                            implementation="xla")

    def cudnn(key_lengths, cond=True):
        def run(q, k, v, mask, seed):
            scale = 1.0 / q.shape[-1] ** 0.5
            if cond:
                return fa.cudnn_attention(q, k, v, mask, scale=scale, key_lengths=key_lengths)
            lengths = jnp.sum(mask, axis=1).astype(jnp.int32)
            return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                                scale=scale, implementation="cudnn")
        return run

    def flash(config, flash_rate):
        def run(q, k, v, mask, seed):
            bias = (1.0 - mask.astype(jnp.float32)) * -10000.0
            return fa.attention(q, k, v, bias, seed, dropout_rate=flash_rate, config=config)
        return run

    table = {"explicit": explicit}
    if rate == 0:
        table.update(xla_fused=xla_fused, cudnn_lengths=cudnn(True, cond=False),
                     cudnn_mask=cudnn(False), cudnn_cond=cudnn(True))
    for name, config in FLASH_CONFIGS.items():
        table[name] = flash(config, rate)
    return table


def time_function(fn, args, repeats, warmup=3, inner=10):
    """Median over `repeats` rounds of the time per call, each round `inner` calls queued
    back to back and waited for once (one call of ~1 ms timed alone measured the host's
    dispatch as much as the device: on the H200, identical computations differed by 40%)."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def check(name, fn, q, k, v, mask, seed, rate):
    """Max relative error against the float32 reference (given the kernel's decisions)."""
    import jax.numpy as jnp
    import numpy as np

    from bert_keras import flash_attention as fa

    bias = (1.0 - mask.astype(jnp.float32)) * -10000.0
    keep = None
    if name.startswith("flash") and rate:
        keep = fa.keep_mask(seed, q.shape[0], q.shape[2], q.shape[1], k.shape[1], rate,
                            FLASH_CONFIGS[name])
    elif rate:
        return None  # the explicit path's decisions are its own
    want = np.asarray(fa.reference(q, k, v, bias, keep, rate), np.float64)
    got = np.asarray(fn(q, k, v, mask, seed).astype(jnp.float32), np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="base", choices=sorted(SIZES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--stack", type=int, default=12, help="layers in the stacked test")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    gpu = jax.default_backend() == "gpu"
    q, k, v, mask, weights = make_inputs(args.size)
    seed = jnp.array([17, 0], jnp.uint32)
    rows = []
    for rate in (0.0, 0.1):
        for name, fn in paths(rate).items():
            if not gpu and name.startswith("cudnn"):
                continue
            if not gpu and name.startswith("flash") and args.size != "tiny":
                continue
            row = dict(path=name, rate=rate)
            try:
                row["max_relative_error"] = check(name, fn, q, k, v, mask, seed, rate)

                def loss(q, k, v, fn=fn):
                    return jnp.sum(fn(q, k, v, mask, seed).astype(jnp.float32) * weights)

                step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
                row["ms"] = 1000 * time_function(step, (q, k, v), args.repeats)
            except Exception as error:  # a path this device or JAX does not take
                row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            rows.append(row)
            print("# " + json.dumps(row), flush=True)

    stack_rows = []
    if gpu:
        for name in ("cudnn_cond", "cudnn_lengths", "cudnn_mask"):
            fn = paths(0.0)[name]

            def stacked(q, k, v, fn=fn):
                x = q
                for _ in range(args.stack):
                    x = fn(x, k, v, mask, seed) + q
                return jnp.sum(x.astype(jnp.float32) * weights)

            step = jax.jit(jax.value_and_grad(stacked, argnums=(0, 1, 2)))
            try:
                ms = 1000 * time_function(step, (q, k, v), args.repeats)
                stack_rows.append(dict(path=name, layers=args.stack, ms=ms))
            except Exception as error:
                stack_rows.append(dict(path=name, layers=args.stack,
                                       error=f"{type(error).__name__}: {error}"[:200]))
            print("# " + json.dumps(stack_rows[-1]), flush=True)

    device = jax.devices()[0].device_kind
    lines = [f"# attention forward + backward, {args.size} {SIZES[args.size]} bf16, {device}, "
             f"median of {args.repeats}",
             "| path | rate | ms | max rel. error vs float32 reference |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        err = r.get("max_relative_error")
        lines.append(f"| {r['path']} | {r['rate']} | "
                     f"{r.get('ms', float('nan')):.3f} | "
                     f"{'-' if err is None else f'{err:.1e}'} | {r.get('error', '')}")
    for r in stack_rows:
        lines.append(f"| {r['path']} x{r['layers']} stacked | 0 | {r.get('ms', float('nan')):.3f}"
                     f" | | {r.get('error', '')}")
    table = "\n".join(lines)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"attention_{args.size}.json"), "w") as f:
            json.dump(dict(device=device, size=args.size, rows=rows, stack=stack_rows), f,
                      indent=2)
    return rows


if __name__ == "__main__":
    main()
