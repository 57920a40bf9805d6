r"""What one of BERT-base's feed-forward matmuls costs at serving's short lengths, on a CPU.

    .venv/bin/python bench/bench_small_matmul.py --rows=16 --threads=2
    .venv/bin/python bench/bench_small_matmul.py --rows=16,64,128,384 \
      --products=768x3072,3072x768 --only="torch,Dense in_out,Dense out_in"   # a crossover

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
                   layout (tensordot: reshape, MatMul, reshape); the layout training and
                   the task exports use by default
  Dense out_in     keras.ops.einsum("...k,nk->...n") with the kernel stored [3072, 768]
                   (torch's nn.Linear layout): what Dense runs with kernel_layout="out_in",
                   the task exports' `--kernel_layout=out_in`
  ... bfloat16     the two Dense rows on bfloat16 variables (--serving_dtype=bfloat16)
  copy bandwidth   numpy copying 64 MiB (read + write), for scale

--rows and --products take lists: every (rows, product, matmul) is timed in each round, in
that order, so that the machine's load reaches every figure alike (a crossover of the two
layouts over lengths, both feed-forward products). --only keeps the named matmuls.

BUILD_NOTES.md section 8.11 has the figures and what they decided.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

KERNELS = 24
MATMULS = ("torch", "tf", "tf 3d", "tf bfloat16", "Dense in_out", "Dense out_in",
           "Dense in_out bfloat16", "Dense out_in bfloat16")


def median_ms(fn, repeats: int, per: int = 1) -> float:
    fn()  # warm-up: primitives created, weights paged in
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times)) / per


def int_list(flag: str, text: str) -> list:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise SystemExit(f"{flag}={text!r}: expected positive integers separated by commas")
    return values


def parse_products(text: str) -> list:
    """"768x3072,3072x768" -> [(768, 3072), (3072, 768)]: [K, N] of each product."""
    products = []
    for item in text.split(","):
        try:
            k, n = (int(v) for v in item.split("x"))
        except ValueError:
            k = n = 0
        if k <= 0 or n <= 0:
            raise SystemExit(f"--products={text!r}: expected KxN pairs such as "
                             f"768x3072,3072x768")
        products.append((k, n))
    return products


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="16",
                        help="M, the request's bucket length; a comma-separated list")
    parser.add_argument("--products", default="768x3072",
                        help="KxN of each [M, K] x [K, N] product; a comma-separated list")
    parser.add_argument("--only", default="",
                        help="comma-separated matmul names to keep (default: all of "
                             + ", ".join(MATMULS) + ")")
    parser.add_argument("--threads", type=int, default=2,
                        help="TensorFlow intra-op threads and torch.set_num_threads")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved passes over the rows")
    args = parser.parse_args()
    all_rows = int_list("--rows", args.rows)
    products = parse_products(args.products)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(MATMULS)
    unknown = [n for n in names if n not in MATMULS]
    if unknown:
        raise SystemExit(f"--only: unknown matmul {unknown[0]!r}; expected some of "
                         + ", ".join(MATMULS))
    if "torch" not in names:
        names.insert(0, "torch")  # the ratio column's reference

    import tensorflow as tf
    import torch
    import keras  # the layer's ops (TensorFlow backend)

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    source = np.ones((64 << 20) // 4, np.float32)
    target = np.empty_like(source)
    copy_ms = median_ms(lambda: np.copyto(target, source), args.repeats)

    def product_rows(K, N):
        """M -> {name: a callable running KERNELS [M, K] x [K, N] products}: one set of
        kernels per product shape, shared by every M (a request reads the same weights at
        every length); only the input differs per M."""
        kernels = [rng.standard_normal((K, N), dtype=np.float32) * 0.02
                   for _ in range(KERNELS)]
        torch_kernels = [torch.from_numpy(w) for w in kernels]
        bf16 = any("bfloat16" in name for name in names)
        plain = {"float32": [tf.Variable(w) for w in kernels]}
        transposed = {"float32": [tf.Variable(w.T) for w in kernels]}
        if bf16:
            plain["bfloat16"] = [tf.Variable(tf.cast(w, tf.bfloat16)) for w in kernels]
            transposed["bfloat16"] = [tf.Variable(tf.cast(w.T, tf.bfloat16)) for w in kernels]

        @tf.function
        def tf_pass(h):
            return [tf.matmul(h, v) for v in plain["float32"]]

        @tf.function
        def tf_3d_pass(h):
            return [tf.matmul(h[None], v) for v in plain["float32"]]

        @tf.function
        def tf_bf16_pass(h):
            h = tf.cast(h, tf.bfloat16)
            return [tf.matmul(h, v) for v in plain["bfloat16"]]

        def dense_fn(layout, dtype):
            @tf.function
            def run(h):
                h = tf.cast(h, dtype)[None]  # [1, M, K], as a request of batch 1
                if layout == "in_out":
                    return [keras.ops.matmul(h, v) for v in plain[dtype]]
                return [keras.ops.einsum("...k,nk->...n", h, v) for v in transposed[dtype]]
            return run

        graphs = {"tf": tf_pass, "tf 3d": tf_3d_pass, "tf bfloat16": tf_bf16_pass}
        for dtype in ("float32", "bfloat16"):
            for layout in ("in_out", "out_in"):
                graphs[f"Dense {layout}" + (" bfloat16" if dtype == "bfloat16" else "")] = \
                    dense_fn(layout, dtype)

        def for_rows(M):
            x = rng.standard_normal((M, K), dtype=np.float32)
            torch_x, tf_x = torch.from_numpy(x), tf.constant(x)

            def torch_pass():
                with torch.inference_mode():
                    for w in torch_kernels:
                        torch_x @ w

            fns = {"torch": torch_pass}
            fns.update({name: (lambda g=g: g(tf_x)) for name, g in graphs.items()})
            return {name: fns[name] for name in names}
        return for_rows

    cases = {}
    for K, N in products:
        for_rows = product_rows(K, N)
        for M in all_rows:
            cases[(M, K, N)] = for_rows(M)
    results = {(case, name): [] for case, fns in cases.items() for name in fns}
    for _ in range(args.rounds):
        for case, fns in cases.items():
            for name, fn in fns.items():
                results[(case, name)].append(median_ms(fn, args.repeats, per=KERNELS))
    ms = {key: float(np.median(v)) for key, v in results.items()}
    # Per-round ratios to the Dense in_out row (the layout choice), median over rounds.
    print(f"# {args.threads} threads, {args.rounds} rounds x {args.repeats} repeats, "
          f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(default)')}; "
          f"copy bandwidth {2 * source.nbytes / copy_ms / 1e6:.1f} GB/s; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    print("| M | product | matmul | ms per product | float32 weight GB/s | / torch "
          "| / Dense in_out (median of rounds) |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for (M, K, N), fns in cases.items():
        megabytes = K * N * 4 / 1e6
        for name in fns:
            key = ((M, K, N), name)
            vs_in_out = "" if "Dense in_out" not in fns else "%.2f" % float(np.median(
                np.array(results[key]) / np.array(results[((M, K, N), "Dense in_out")])))
            print(f"| {M} | [{K}, {N}] | {name} | {ms[key]:.3f} | {megabytes / ms[key]:.1f} "
                  f"| {ms[key] / ms[((M, K, N), 'torch')]:.2f} | {vs_in_out} |")
    print(json.dumps({"threads": args.threads, "rounds": args.rounds,
                      "ms": {f"{M},{K}x{N},{name}": v for ((M, K, N), name), v in ms.items()},
                      "per_round_ms": {f"{M},{K}x{N},{name}": v
                                       for ((M, K, N), name), v in results.items()}}))


if __name__ == "__main__":
    main()
