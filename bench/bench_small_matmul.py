r"""What one of BERT-base's feed-forward matmuls costs at serving's short lengths, on a CPU.

    .venv/bin/python bench/bench_small_matmul.py --rows=16 --threads=2

A request of a few wordpieces multiplies [M, 768] activations (M = its bucket length) by
every [768, 3072] and [3072, 768] kernel: 340 MB of float32 weights per base-size request,
read once, for about 2 * M * 85 M flops. At M = 16 the cost is the read, so what decides a
short request's latency is how close a library's small-M matmul gets to the memory
bandwidth, and how many bytes it reads. This times, per [M, 768] x [768, 3072] product
(24 distinct kernels, 226 MB, so none stays in cache; the median of --repeats passes):

  torch            torch.matmul (what transformers' Linear runs; MKL / oneDNN)
  tf               tf.matmul on a float32 variable (oneDNN's _MklMatMul; Eigen with
                   TF_ENABLE_ONEDNN_OPTS=0): what a float32 export runs
  tf 3d            the same with a [1, M, 768] input (BatchMatMulV2, as a batch of 1)
  tf bfloat16      tf.matmul on bfloat16 variables and a bfloat16 cast of the input (AMX
                   / AVX512-BF16 through oneDNN where the CPU has them)
  Dense in_out     keras.ops.matmul of a [1, M, 768] input and a [768, 3072] variable: what
                   `bert_keras.layers.dense.Dense` runs with Keras' and Google's kernel
                   layout (tensordot: reshape, MatMul, reshape); the layout training uses
  Dense out_in     keras.ops.einsum("...k,nk->...n") with the kernel stored [3072, 768]
                   (torch's nn.Linear layout): what Dense runs with kernel_layout="out_in",
                   the layout of every task export (`bert_keras.tasks.for_serving`)
  ... bfloat16     the two Dense rows on bfloat16 variables (--serving_dtype=bfloat16)
  copy bandwidth   numpy copying 64 MiB (read + write), for scale

BUILD_NOTES.md section 8.11 has the figures and what they decided.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

K, N, KERNELS = 768, 3072, 24


def median_ms(fn, repeats: int, per: int = 1) -> float:
    fn()  # warm-up: primitives created, weights paged in
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times)) / per


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16, help="M: the request's bucket length")
    parser.add_argument("--threads", type=int, default=2,
                        help="TensorFlow intra-op threads and torch.set_num_threads")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved passes over the rows")
    args = parser.parse_args()

    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    kernels = [rng.standard_normal((K, N), dtype=np.float32) * 0.02 for _ in range(KERNELS)]
    x = rng.standard_normal((args.rows, K), dtype=np.float32)

    torch_kernels, torch_x = [torch.from_numpy(w) for w in kernels], torch.from_numpy(x)
    variables = [tf.Variable(w) for w in kernels]
    bf16_variables = [tf.Variable(tf.cast(w, tf.bfloat16)) for w in kernels]
    tf_x = tf.constant(x)

    def torch_pass():
        with torch.inference_mode():
            for w in torch_kernels:
                torch_x @ w

    @tf.function
    def tf_pass(h):
        return [tf.matmul(h, v) for v in variables]

    @tf.function
    def tf_3d_pass(h):
        return [tf.matmul(h[None], v) for v in variables]

    @tf.function
    def tf_bf16_pass(h):
        h = tf.cast(h, tf.bfloat16)
        return [tf.matmul(h, v) for v in bf16_variables]

    import keras  # the layer's ops (TensorFlow backend)

    transposed = {"float32": [tf.Variable(w.T) for w in kernels],
                  "bfloat16": [tf.Variable(tf.cast(w.T, tf.bfloat16)) for w in kernels]}
    plain = {"float32": variables, "bfloat16": bf16_variables}

    def dense_pass(layout, dtype):
        @tf.function
        def run(h):
            h = tf.cast(h, dtype)[None]  # [1, M, K], as a request of batch 1
            if layout == "in_out":
                return [keras.ops.matmul(h, v) for v in plain[dtype]]
            return [keras.ops.einsum("...k,nk->...n", h, v) for v in transposed[dtype]]
        return lambda: run(tf_x)

    rows = {"torch": torch_pass, "tf": lambda: tf_pass(tf_x), "tf 3d": lambda: tf_3d_pass(tf_x),
            "tf bfloat16": lambda: tf_bf16_pass(tf_x)}
    for dtype in ("float32", "bfloat16"):
        for layout in ("in_out", "out_in"):
            rows[f"Dense {layout}" + (" bfloat16" if dtype == "bfloat16" else "")] = \
                dense_pass(layout, dtype)
    source = np.ones((64 << 20) // 4, np.float32)
    target = np.empty_like(source)
    copy_ms = median_ms(lambda: np.copyto(target, source), args.repeats)
    results = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            results[name].append(median_ms(fn, args.repeats, per=KERNELS))
    per_kernel = {name: float(np.median(v)) for name, v in results.items()}
    megabytes = kernels[0].nbytes / 1e6
    print(f"# [{args.rows}, {K}] x [{K}, {N}], {args.threads} threads, "
          f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(default)')}; "
          f"copy bandwidth {2 * source.nbytes / copy_ms / 1e6:.1f} GB/s; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| matmul | ms per product | float32 weight GB/s | / torch |")
    print("| --- | ---: | ---: | ---: |")
    for name, ms in per_kernel.items():
        print(f"| {name} | {ms:.3f} | {megabytes / ms:.1f} | {ms / per_kernel['torch']:.2f} |")
    print(json.dumps({"rows": args.rows, "threads": args.threads, "ms": per_kernel}))


if __name__ == "__main__":
    main()
