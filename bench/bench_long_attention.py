r"""Our serving encoder against torch's at long requests, and where the time goes, on a CPU.

    .venv/bin/python bench/bench_long_attention.py                  # S = 64,128,192,256,384
    .venv/bin/python bench/bench_long_attention.py --lengths=128,384 --rounds=7
    .venv/bin/python bench/bench_long_attention.py --lengths=16,32 --rounds=9 \
        --only="ours encoder;ours encoder, before"   # the A/B of the whole encoders alone
    .venv/bin/python bench/bench_long_attention.py --preset=tiny --lengths=24,40 --rounds=2 \
        --calls=2   # smoke test

At batch 1 and 2 threads, in one process, for each length S this times (random weights,
float32, every row in the same rounds, the order rotated each round):

  full rows (ids [1, S] in, no padding):
    ours encoder       what a span-QA export runs: `tasks.for_serving(BertSpanQA, "float32",
                       L)` (L = --kernel_layout; the explicit softmax in attention) called in a
                       tf.function with the export's input signature (int32 [None, None]
                       ids, mask and type ids)
    ours encoder, before    the same with attention through `keras.ops.dot_product_attention`
                       (`explicit_softmax=False`), what serving copies ran before
    torch BertModel    transformers' BertModel (SDPA attention, its default), eager, under
                       torch.inference_mode
  one layer's parts at [1, S, H] (H = 768 and N = 12 heads at the base preset):
    ours attention     `SelfAttention(kernel_layout=L, explicit_softmax=True)` (Q, K, V
                       projections and the attention; the mask all ones, as an export
                       passes a request with no padding) in a tf.function with a
                       [None, None, H] signature; ", before": the same weights through
                       `keras.ops.dot_product_attention`
    torch attention sdpa / eager    transformers' BertSelfAttention with the same weights,
                       SDPA or the eager softmax; the mask None, which is what BertModel
                       passes it for a request with no padding
    ours core          the attention without its projections: [1, S, N, D] queries, keys and
                       values -> [1, S, N, D] (`SelfAttention._attend`, all-ones mask);
                       ", unmasked": with no mask (what skipping the mask of a request with
                       no padding would buy); ", before": `keras.ops.dot_product_attention`
    torch core sdpa    torch.nn.functional.scaled_dot_product_attention on the same layout
                       change ([1, S, N, D] -> [1, N, S, D] and back)
    ours feed-forward  Dense(I, L) + exact GELU + Dense(H, L)
    torch feed-forward Linear + GELU + Linear
    tf.function call, identity    what calling a tf.function from Python costs by itself
                       (in every "ours" row; TF Serving calls from C++)

Each row's figure is the median, over rounds, of the median of --calls calls in that round
(ms); the last column is the median over rounds of each round's ratio of the pair's
first row to its second (below 1: the first is faster). Before timing, every pair but those
with torch's BertModel (its own random weights) is checked to compute the same values
(float32 rounding).
BUILD_NOTES.md section 8.11 has the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

SEED = 1234
# Every row, in build order (`build_rows`); --only picks among them.
ROWS = ("ours encoder", "ours encoder, before", "torch BertModel", "ours attention",
        "ours attention, before", "torch attention sdpa", "torch attention eager",
        "ours core", "ours core, unmasked", "ours core, before", "torch core sdpa",
        "ours feed-forward", "torch feed-forward", "tf.function call, identity")


def timed_ms(fn, calls: int) -> float:
    """Median wall time of `calls` calls of fn, in ms."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def with_fused_op_attention(model):
    """A copy of `model` (a task model or a SelfAttention) with the same weights whose
    attention runs through `keras.ops.dot_product_attention` (`explicit_softmax=False`),
    as serving copies did before they moved to the explicit softmax."""
    from bert_keras.layers.attention import SelfAttention

    config = model.get_config()
    if isinstance(model, SelfAttention):
        copy = SelfAttention.from_config({**config, "explicit_softmax": False})
        copy.build((None, None, model.query.kernel.shape[0]))
    else:
        encoder = dict(config["encoder"], config={**config["encoder"]["config"],
                                                  "explicit_softmax": False})
        copy = type(model).from_config({**config, "encoder": encoder})
    copy.set_weights(model.get_weights())
    return copy


def out_in(dense) -> np.ndarray:
    """A Dense layer's kernel as torch's nn.Linear stores it: [out, in]."""
    kernel = np.asarray(dense.kernel)
    return kernel if dense.kernel_layout == "out_in" else np.ascontiguousarray(kernel.T)


def build_rows(config, seq_length: int, rng, kernel_layout: str) -> tuple[dict, list]:
    """name -> zero-argument callable for one length, and the (ours, theirs) pairs to check
    and to divide."""
    import keras
    import tensorflow as tf
    import torch
    import transformers

    from bert_keras import BertEncoder, tasks
    from bert_keras.layers.activations import gelu
    from bert_keras.layers.attention import SelfAttention
    from bert_keras.layers.dense import Dense
    from data_prep import schema

    hidden, heads = config.hidden_size, config.num_attention_heads
    head_size, inner = hidden // heads, config.intermediate_size
    rows, checks = {}, []

    # --- full models, the same random ids ---
    signature = {name: tf.TensorSpec([None, None], tf.int32, name=name)
                 for name in schema.MODEL_INPUT_NAMES}
    ids = rng.integers(1000, config.vocab_size, size=(1, seq_length)).astype(np.int32)
    tf_ids = {schema.INPUT_WORD_IDS: tf.constant(ids),
              schema.MODEL_INPUT_MASK: tf.ones_like(tf.constant(ids)),
              schema.INPUT_TYPE_IDS: tf.zeros_like(tf.constant(ids))}
    keras.utils.set_random_seed(SEED)
    trained = tasks.BertSpanQA(BertEncoder.from_bert_config(config))
    serving = tasks.for_serving(trained, "float32", kernel_layout)
    for name, model in (("ours encoder", serving),
                        ("ours encoder, before", with_fused_op_attention(serving))):
        serve = tf.function(lambda inputs, model=model: model(inputs, training=False),
                            input_signature=[signature], autograph=False)
        rows[name] = lambda serve=serve: serve(tf_ids)["start_logits"].numpy()
    torch.manual_seed(SEED)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=hidden,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=heads,
        intermediate_size=inner, hidden_act="gelu",
        max_position_embeddings=config.max_position_embeddings,
        attn_implementation="sdpa")).eval()
    torch_ids = {"input_ids": torch.from_numpy(ids).long(),
                 "attention_mask": torch.ones(1, seq_length, dtype=torch.long),
                 "token_type_ids": torch.zeros(1, seq_length, dtype=torch.long)}

    def torch_bert():
        with torch.inference_mode():
            return bert(**torch_ids).last_hidden_state.numpy()

    rows["torch BertModel"] = torch_bert

    # --- one layer's attention, the same weights on both sides ---
    x = rng.standard_normal((1, seq_length, hidden)).astype(np.float32)
    attention = SelfAttention(heads, dropout=0.1, kernel_layout=kernel_layout,
                              explicit_softmax=True)
    attention.build((None, None, hidden))
    before = with_fused_op_attention(attention)
    layer_spec = [tf.TensorSpec([None, None, hidden], tf.float32),
                  tf.TensorSpec([None, None], tf.int32)]
    tf_x, tf_mask = tf.constant(x), tf.ones((1, seq_length), tf.int32)
    for name, layer in (("ours attention", attention), ("ours attention, before", before)):
        attend = tf.function(
            lambda h, m, layer=layer: layer(h, attention_mask=m, training=False),
            input_signature=layer_spec, autograph=False)
        rows[name] = lambda attend=attend: attend(tf_x, tf_mask).numpy()

    def torch_attention(implementation):
        torch_config = transformers.BertConfig(hidden_size=hidden, num_attention_heads=heads,
                                               attn_implementation=implementation)
        layer = transformers.models.bert.modeling_bert.BertSelfAttention(torch_config).eval()
        with torch.no_grad():
            for name in ("query", "key", "value"):
                dense = getattr(attention, name)
                getattr(layer, name).weight.copy_(torch.from_numpy(out_in(dense)))
                getattr(layer, name).bias.copy_(torch.from_numpy(np.asarray(dense.bias)))
        torch_x = torch.from_numpy(x)

        def run():
            with torch.inference_mode():
                return layer(torch_x, attention_mask=None)[0].numpy()

        return run

    rows["torch attention sdpa"] = torch_attention("sdpa")
    rows["torch attention eager"] = torch_attention("eager")

    # --- the attention without its projections ---
    q, k, v = (rng.standard_normal((1, seq_length, heads, head_size)).astype(np.float32)
               for _ in range(3))
    tf_q, tf_k, tf_v = tf.constant(q), tf.constant(k), tf.constant(v)
    core_spec = [tf.TensorSpec([None, None, heads, head_size], tf.float32)] * 3
    for name, layer, mask in (("ours core", attention, tf_mask),
                              ("ours core, unmasked", attention, None),
                              ("ours core, before", before, tf_mask)):
        spec = core_spec + (layer_spec[1:] if mask is not None else [])
        core = tf.function(lambda *t, layer=layer: layer._attend(*t[:3], t[3] if len(t) > 3
                                                                 else None, False),
                           input_signature=spec, autograph=False)
        args_ = (tf_q, tf_k, tf_v) + ((mask,) if mask is not None else ())
        rows[name] = lambda core=core, args_=args_: core(*args_).numpy()
    scale = 1.0 / np.sqrt(head_size)
    torch_q, torch_k, torch_v = (torch.from_numpy(t) for t in (q, k, v))

    def torch_core():
        with torch.inference_mode():
            out = torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in (torch_q, torch_k, torch_v)), scale=scale)
            return out.transpose(1, 2).contiguous().numpy()

    rows["torch core sdpa"] = torch_core

    # --- the feed-forward ---
    up = Dense(inner, kernel_layout=kernel_layout, activation=gelu)
    down = Dense(hidden, kernel_layout=kernel_layout)
    up.build((None, None, hidden))
    down.build((None, None, inner))
    feed_forward = tf.function(lambda h: down(up(h)), input_signature=layer_spec[:1],
                               autograph=False)
    rows["ours feed-forward"] = lambda: feed_forward(tf_x).numpy()
    torch_up, torch_down = torch.nn.Linear(hidden, inner), torch.nn.Linear(inner, hidden)
    with torch.no_grad():
        for dense, linear in ((up, torch_up), (down, torch_down)):
            linear.weight.copy_(torch.from_numpy(out_in(dense)))
            linear.bias.copy_(torch.from_numpy(np.asarray(dense.bias)))
    torch_gelu, torch_x = torch.nn.GELU(), torch.from_numpy(x)

    def torch_feed_forward():
        with torch.inference_mode():
            return torch_down(torch_gelu(torch_up(torch_x))).numpy()

    rows["torch feed-forward"] = torch_feed_forward
    # What calling a tf.function from Python costs by itself (TF Serving calls from C++).
    identity = tf.function(tf.identity, input_signature=layer_spec[:1], autograph=False)
    rows["tf.function call, identity"] = lambda: identity(tf_x).numpy()

    pairs = [("ours encoder", "torch BertModel"),
             ("ours encoder, before", "torch BertModel"),
             ("ours encoder", "ours encoder, before"),
             ("ours attention", "torch attention sdpa"),
             ("ours attention", "torch attention eager"),
             ("ours attention", "ours attention, before"),
             ("ours core", "torch core sdpa"),
             ("ours core, before", "torch core sdpa"),
             ("ours core", "ours core, before"),
             ("ours core, unmasked", "ours core"),
             ("ours feed-forward", "torch feed-forward")]
    # The torch models have their own random weights: the whole models are compared
    # among ours only (the same weights, float32 rounding).
    checks = [pair for pair in pairs if pair[1] != "torch BertModel"]
    return rows, pairs, checks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--lengths", default="64,128,192,256,384")
    parser.add_argument("--kernel_layout", default="in_out", choices=("in_out", "out_in"),
                        help="how ours stores its Dense kernels (the exports' --kernel_layout)")
    parser.add_argument("--threads", type=int, default=2,
                        help="TensorFlow intra-op threads and torch.set_num_threads")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3,
                        help="calls per row per round for the full models (parts: 4x)")
    parser.add_argument("--only", default="",
                        help="semicolon-separated row names to time (default: every row); "
                             "a pair is printed where both its rows are timed")
    args = parser.parse_args()
    only = set(args.only.split(";")) if args.only else set(ROWS)
    if only - set(ROWS):
        parser.error(f"--only: no rows {sorted(only - set(ROWS))}; rows: {'; '.join(ROWS)}")
    lengths = [int(s) for s in args.lengths.split(",")]

    # Before TensorFlow creates its thread pools (the first op) and before any torch op.
    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    torch.set_num_threads(args.threads)

    from bert_keras import BertConfig

    config = BertConfig.from_preset(args.preset)
    rng = np.random.default_rng(SEED)
    print(f"# {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} "
          f"N={config.num_attention_heads}; threads={args.threads} rounds={args.rounds} "
          f"calls={args.calls}; load average {os.getloadavg()[0]:.2f}")
    for seq_length in lengths:
        rows, pairs, checks = build_rows(config, seq_length, rng, args.kernel_layout)
        assert tuple(rows) == ROWS, "ROWS lists build_rows' rows in order"
        rows = {name: fn for name, fn in rows.items() if name in only}
        pairs = [pair for pair in pairs if set(pair) <= only]
        checks = [pair for pair in checks if set(pair) <= only]
        outputs = {name: fn() for name, fn in rows.items()}  # also warms every row up
        for ours, theirs in checks:
            np.testing.assert_allclose(outputs[ours], outputs[theirs], rtol=1e-4, atol=2e-4,
                                       err_msg=f"{ours} against {theirs} at S={seq_length}")
        for fn in rows.values():
            fn()
        names = list(rows)
        per_round = {name: [] for name in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            if r % 2:
                order = order[::-1]
            for name in order:
                full = name.startswith("ours encoder") or name == "torch BertModel"
                calls = args.calls if full else 4 * args.calls
                per_round[name].append(timed_ms(rows[name], calls))
        print(f"\nS={seq_length} (load average {os.getloadavg()[0]:.2f})")
        print("| row | ms | against | ms | ratio (median of rounds' ratios) |")
        print("| --- | ---: | --- | ---: | ---: |")
        if "tf.function call, identity" in rows:
            print(f"| tf.function call, identity | "
                  f"{np.median(per_round['tf.function call, identity']):.2f} | | | |")
        for ours, theirs in pairs:
            ratio = np.median(np.array(per_round[ours]) / np.array(per_round[theirs]))
            print(f"| {ours} | {np.median(per_round[ours]):.2f} | {theirs} | "
                  f"{np.median(per_round[theirs]):.2f} | {ratio:.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
