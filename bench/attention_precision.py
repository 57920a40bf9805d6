r"""How far each attention path is from exact attention in 16 bits, against transformers'.

    KERAS_BACKEND=tensorflow .venv/bin/python bench/attention_precision.py
    KERAS_BACKEND=jax .venv/bin/python bench/attention_precision.py --sizes=2x128x768x12
    .venv/bin/python bench/attention_precision.py --sizes=1x9x32x4 --dtypes=bfloat16  # smoke

For each size BxSxHxN and dtype (a `mixed_<dtype>` policy), one SelfAttention layer
(random weights, seed --seed) projects the same float32 inputs to q, k and v in that dtype;
the reference is float64 attention over those rounded q, k and v (padded keys masked: the
second sequence's second half is padding). Each row is max |path - reference| over real
tokens, relative to the reference's largest value:

  ours, inference          the layer called as a model calls it (`training=False`)
  ours, explicit softmax   the layer in training with its attention dropout at rate 0 (the
                           path training takes with attention dropout)
  ours, serving copy       `explicit_softmax=True`, what the exports run
  keras.ops.dot_product_attention    Keras' own op on the same q, k, v and key mask
  transformers eager       transformers' BERT `eager_attention_forward` in torch, in that
                           dtype (its default attention in float32 is SDPA; its eager path
                           is the one a 16-bit fine-tuning run compares against)
  torch sdpa               torch.nn.functional.scaled_dot_product_attention in that dtype

On TensorFlow's CPUs 16-bit products lose precision inside their sums, so there the layer
takes float32 operands (`attention._sixteen_bits_on_tensorflow_cpu`); serving copies keep
16-bit products. BUILD_NOTES.md section 8.10 has the figures.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def _sizes(text: str) -> list[tuple[int, int, int, int]]:
    try:
        sizes = [tuple(int(n) for n in item.split("x")) for item in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(len(s) != 4 or min(s) < 1 or s[2] % s[3] for s in sizes):
        raise argparse.ArgumentTypeError(
            f"expected BxSxHxN items separated by commas, H divisible by N; got {text!r}")
    return sizes


def _dtypes(text: str) -> list[str]:
    dtypes = text.split(",")
    if not all(d in ("bfloat16", "float16", "float32") for d in dtypes):
        raise argparse.ArgumentTypeError(
            f"expected bfloat16, float16 or float32, separated by commas; got {text!r}")
    return dtypes


def errors(batch, length, hidden, heads, dtype, seed=0):
    """{row name: relative error} for one size and dtype."""
    import keras
    import torch
    from transformers.models.bert.modeling_bert import eager_attention_forward

    from bert_keras.layers import SelfAttention

    d = hidden // heads
    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    x = rng.normal(size=(batch, length, hidden)).astype("float32")
    mask = np.ones((batch, length), "int32")
    if batch > 1:
        mask[1, max(1, length // 2):] = 0
    real = mask.astype(bool)
    policy = dtype if dtype == "float32" else "mixed_" + dtype
    layer = SelfAttention(heads, dropout=0.1, dtype=policy)
    layer.build((None, None, hidden))
    serving = SelfAttention(heads, dropout=0.1, dtype=policy, explicit_softmax=True)
    serving.build((None, None, hidden))
    serving.set_weights(layer.get_weights())

    q, k, v = (np.asarray(dense(x), "float32").reshape(batch, length, heads, d)
               for dense in (layer.query, layer.key, layer.value))  # rounded to `dtype`
    q64, k64, v64 = (t.astype("float64").transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = (q64 @ k64.transpose(0, 1, 3, 2) / np.sqrt(d)
              + np.finfo("float64").min * (1 - mask[:, None, None, :]))
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = (probs @ v64).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
    scale = np.abs(want[real]).max()

    def error(got):
        got = np.asarray(got, "float32").reshape(batch, length, hidden)
        return float(np.abs(got[real] - want[real]).max() / scale)

    rate = layer.dropout_layer.rate
    layer.dropout_layer.rate = 0.0
    try:
        explicit = layer(x, attention_mask=mask, training=True)
    finally:
        layer.dropout_layer.rate = rate
    compute = layer.compute_dtype
    keras_op = keras.ops.dot_product_attention(
        *(keras.ops.cast(t, compute) for t in (q, k, v)),
        mask=keras.ops.cast(mask, "bool")[:, None, None, :], scale=d ** -0.5)

    typed = getattr(torch, dtype)
    tq, tk, tv = (torch.tensor(t).to(typed).transpose(1, 2) for t in (q, k, v))
    bias = torch.tensor((1 - mask[:, None, None, :]) * torch.finfo(typed).min).to(typed)
    eager, _ = eager_attention_forward(torch.nn.Module().eval(), tq, tk, tv, bias,
                                       scaling=d ** -0.5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=torch.tensor(real[:, None, None, :])).transpose(1, 2)
    return {
        "ours, inference": error(layer(x, attention_mask=mask)),
        "ours, explicit softmax": error(explicit),
        "ours, serving copy": error(serving(x, attention_mask=mask)),
        "keras.ops.dot_product_attention": error(keras.ops.cast(keras_op, "float32")),
        "transformers eager": error(eager.float().numpy()),
        "torch sdpa": error(sdpa.float().numpy()),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=_sizes, default=_sizes("2x128x768x12,3x129x72x3"),
                        help="BxSxHxN items (default 2x128x768x12,3x129x72x3: BERT-base's "
                             "heads, and head size 24 at an odd length)")
    parser.add_argument("--dtypes", type=_dtypes, default=["bfloat16", "float16"],
                        help="bfloat16, float16, float32 (default bfloat16,float16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import keras

    from bert_keras import kernels

    print(f"backend {keras.backend.backend()} ({kernels.platform()}); max |path - float64| "
          f"over real tokens / max |float64|")
    for size in args.sizes:
        for dtype in args.dtypes:
            print(f"\nB{size[0]} S{size[1]} H{size[2]} N{size[3]} (head size "
                  f"{size[2] // size[3]}), {dtype}")
            for name, value in errors(*size, dtype, seed=args.seed).items():
                print(f"  {name:34s} {value:.2e}")


if __name__ == "__main__":
    main()
