r"""Pretraining throughput: ours vs keras-hub's BertMaskedLM vs transformers' BertForPreTraining.

    python bench/bench_pretraining.py --preset=mini --batch_size=32 --seq_length=128 \
      --predictions=20 --steps=5 --rounds=8

Every model gets the same BERT size, batch, sequence length and number of masked predictions,
AdamW (epsilon 1e-6, weight decay 0.01, global-norm clipping 1.0) and in-memory synthetic
batches (random ids, P distinct masked positions), so only the training step is timed. One run
measures, in this process:

  matmul peak   float32 [N,N]x[N,N] in TensorFlow and in torch (GFLOP/s): the ceiling
  ours          BertPretrainer, MLM + NSP, Keras fit (without and with XLA)
  ours MLM-only the same graph pruned to the masked-LM output (like keras-hub's task)
  keras-hub     BertMaskedLM (MLM only), Keras fit (without and with XLA), compiled as its
                users do: Keras' AdamW and SparseCategoricalCrossentropy; once more with
                bert_keras' AdamW, to separate the optimizer's share of the difference
  transformers  BertForPreTraining on torch CPU: as shipped (the vocabulary projection runs
                on all S positions) and with the MLM head gathered to the P masked positions

Throughput is sequences/s: all models are built and warmed up (compiled) first, then timed
in interleaved rounds, keeping each model's best round (the machine may be shared).
Model FLOPs are counted analytically for the *useful* computation (masked-LM head on the P
masked positions only; training = 3 x forward), so the "as shipped" transformers row does
more work than it is credited for, and ours, whose last layer runs only at [CLS] and the
masked positions, less (at S=128, P=20 it skips about 70% of one layer, 13% of the mini
model's FLOPs). MFU = achieved model FLOP/s / the framework's matmul peak. The table gives
each row's best round and its median round.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def encoder_forward_flops(layers, hidden, intermediate, seq):
    """Analytic FLOPs of the encoder layers' forward per sequence (2 per multiply-add):
    L x (8SH^2 + 4SHI + 4S^2H); embeddings, pooler and heads not included."""
    per_layer = (4 * 2 * seq * hidden * hidden          # Q, K, V and output projections
                 + 2 * 2 * seq * hidden * intermediate  # feed-forward in and out
                 + 2 * 2 * seq * seq * hidden)          # scores and weighted sum
    return layers * per_layer


def training_flops_per_sequence(layers, hidden, intermediate, vocab, seq, predictions,
                                nsp=True):
    """Analytic FLOPs of one training step per sequence (2 per multiply-add, 3 x forward)."""
    forward = encoder_forward_flops(layers, hidden, intermediate, seq)
    forward += 2 * predictions * hidden * hidden + 2 * predictions * hidden * vocab  # MLM head
    if nsp:
        forward += 2 * hidden * hidden + 2 * hidden * 2  # pooler + NSP
    return 3 * forward


def synthetic_batch(batch, seq, predictions, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, seq)).astype(np.int32)
    positions = np.sort(np.stack([rng.choice(np.arange(1, seq - 1), predictions, replace=False)
                                  for _ in range(batch)]), axis=1).astype(np.int32)
    labels = np.take_along_axis(ids, positions, axis=1)
    np.put_along_axis(ids, positions, 103, axis=1)  # [MASK]
    types = np.zeros((batch, seq), np.int32)
    types[:, seq // 2:] = 1
    return dict(ids=ids, mask=np.ones((batch, seq), np.int32), types=types, positions=positions,
                labels=labels, weights=np.ones((batch, predictions), np.float32),
                nsp=rng.integers(0, 2, size=batch).astype(np.int32))


# --------------------------------------------------------------------------------------
# Peaks


def tf_matmul_peak(n=1024, seconds=2.0):
    import tensorflow as tf

    a = tf.random.normal((n, n))
    b = tf.random.normal((n, n))

    @tf.function
    def ten(a, b):
        c = a
        for _ in range(10):
            c = tf.matmul(c, b) * 1e-3
        return c

    ten(a, b).numpy()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        ten(a, b).numpy()
        count += 10
    return 2 * n ** 3 * count / (time.perf_counter() - start) / 1e9


def torch_matmul_peak(n=1024, seconds=2.0):
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        count += 1
    return 2 * n ** 3 * count / (time.perf_counter() - start) / 1e9


# --------------------------------------------------------------------------------------
# Keras models (ours and keras-hub)


def keras_optimizer(stock=False, learning_rate=1e-4):
    """BERT's AdamW: ours (`create_optimizer`), or with stock=True Keras' own AdamW with the
    same settings and decay exclusions, as a keras-hub user's script would build it.
    `learning_rate` is the peak rate (1e-4: pretraining)."""
    import keras

    from bert_keras.optimization import NO_DECAY_PATTERN, WarmupLinearDecay, create_optimizer

    # A constant-ish schedule: no warmup, long decay (the schedule costs nothing measurable).
    if not stock:
        return create_optimizer(learning_rate, num_train_steps=10 ** 6, num_warmup_steps=0)
    optimizer = keras.optimizers.AdamW(
        learning_rate=WarmupLinearDecay(learning_rate, 10 ** 6, 0), weight_decay=0.01, beta_1=0.9,
        beta_2=0.999, epsilon=1e-6, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    return optimizer


def keras_runner(model, dataset, **fit_kwargs):
    """A function running `steps` training steps of a compiled Keras model; returns seconds.

    `fit_kwargs` go to `fit` beside `dataset` (for arrays: y, sample_weight, batch_size).

    The time is taken from Keras' `on_train_begin` to `on_train_end`, once the last step's
    results are on the host: the steps only. Each
    `fit` call also sets up and tears down its epoch iterator, and on this machine that
    sometimes took 3 s more (whatever the model), which a real run pays once, not per
    handful of steps.
    """
    import keras

    class StepsTimer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.start = time.perf_counter()

        def on_train_end(self, logs=None):
            # The last step's results on the host: a step that failed on the device (JAX's
            # RESOURCE_EXHAUSTED, BERT-base S512 on a CPU) raises here; without it fit
            # returned after dispatching, and the bench reported 3 ms steps that never ran.
            keras.ops.convert_to_numpy(self.model.optimizer.iterations)
            self.seconds = time.perf_counter() - self.start

    def run(steps):
        timer = StepsTimer()
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer],
                  **fit_kwargs)
        return timer.seconds

    return run


def ours_model(args, data, mlm_only, jit_compile, config=None):
    """Our BertPretrainer compiled for pretraining on the synthetic batch `data`.

    Returns (model, dataset): the compiled model and a dataset repeating the one batch as
    (features, labels, sample_weights). `config` (a BertConfig) replaces the one of
    `args.preset`, e.g. with other dropout rates. bench/ab_library_parts.py builds its
    variants with this function.
    """
    import keras
    import tensorflow as tf

    from bert_keras import BertConfig, BertPretrainer
    from bert_keras.losses import pretraining_losses_and_metrics

    config = config or BertConfig.from_preset(args.preset)
    pretrainer = BertPretrainer.from_bert_config(config)
    features = {"input_word_ids": data["ids"], "input_mask": data["mask"],
                "input_type_ids": data["types"], "masked_lm_positions": data["positions"]}
    if mlm_only:
        model = keras.Model(pretrainer.input, {"mlm_logits": pretrainer.output["mlm_logits"]})
        labels, weights = {"mlm_logits": data["labels"]}, {"mlm_logits": data["weights"]}
    else:
        model = pretrainer
        labels = {"mlm_logits": data["labels"], "nsp_logits": data["nsp"]}
        weights = {"mlm_logits": data["weights"],
                   "nsp_logits": np.ones_like(data["nsp"], np.float32)}
    model.compile(optimizer=keras_optimizer(), jit_compile=jit_compile,
                  **pretraining_losses_and_metrics(mlm_only=mlm_only))
    dataset = tf.data.Dataset.from_tensors((features, labels, weights)).repeat()
    return model, dataset


def ours(args, data, mlm_only, jit_compile):
    return keras_runner(*ours_model(args, data, mlm_only, jit_compile))


def keras_hub_masked_lm(args, data, jit_compile, our_optimizer=False):
    import keras
    import keras_hub
    import tensorflow as tf

    from bert_keras import BertConfig

    config = BertConfig.from_preset(args.preset)
    # Built from sizes: from_preset would try to download.
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size, max_sequence_length=512)
    model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    model.compile(optimizer=keras_optimizer(stock=not our_optimizer), jit_compile=jit_compile,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()])
    features = {"token_ids": data["ids"], "padding_mask": data["mask"].astype(bool),
                "segment_ids": data["types"], "mask_positions": data["positions"]}
    dataset = tf.data.Dataset.from_tensors((features, data["labels"], data["weights"])).repeat()
    return keras_runner(model, dataset)


# --------------------------------------------------------------------------------------
# transformers on torch


def transformers_pretraining(args, data, gathered):
    import torch
    import transformers

    from bert_keras import BertConfig

    config = BertConfig.from_preset(args.preset)
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_act="gelu"))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01)
    ids, mask, types = (torch.from_numpy(data[k]).long() for k in ("ids", "mask", "types"))
    positions = torch.from_numpy(data["positions"]).long()
    labels = torch.from_numpy(data["labels"]).long()
    weights = torch.from_numpy(data["weights"])
    nsp = torch.from_numpy(data["nsp"]).long()
    full_labels = torch.full_like(ids, -100).scatter(1, positions, labels)
    hidden = config.hidden_size

    def step():
        if gathered:
            out = model.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
            sequence = torch.gather(out.last_hidden_state, 1,
                                    positions[..., None].expand(-1, -1, hidden))
            mlm_logits = model.cls.predictions(sequence)                    # [B, P, V]
            nsp_logits = model.cls.seq_relationship(out.pooler_output)      # [B, 2]
            ce = torch.nn.functional.cross_entropy(mlm_logits.transpose(1, 2), labels,
                                                   reduction="none")
            loss = (ce * weights).sum() / (weights.sum() + 1e-5)
            loss = loss + torch.nn.functional.cross_entropy(nsp_logits, nsp)
        else:  # As shipped: prediction_logits over all S positions, loss from -100 labels.
            out = model(input_ids=ids, attention_mask=mask, token_type_ids=types,
                        labels=full_labels, next_sentence_label=nsp)
            loss = out.loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def run(steps):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return time.perf_counter() - start

    return run


RATIOS = [  # (numerator, denominator): the goals and what explains them
    ("ours MLM-only", "keras-hub BertMaskedLM (MLM-only)"),
    ("ours MLM-only", "keras-hub BertMaskedLM (MLM-only) with bert_keras AdamW"),
    ("ours MLM+NSP", "transformers BertForPreTraining, head gathered"),
    ("ours MLM-only XLA", "keras-hub BertMaskedLM (MLM-only) XLA"),
]


def ratios(seconds_a, seconds_b):
    """Speed of A over B from per-round times (same length, round i of A and B back to back).

    Returns (best, median, paired median): B's best time / A's best, B's median / A's
    median, and the median over rounds of B's time / A's time in that round (which cancels
    most drift of a shared machine). Above 1, A is faster.
    """
    best = min(seconds_b) / min(seconds_a)
    median = float(np.median(seconds_b) / np.median(seconds_a))
    paired = float(np.median([tb / ta for ta, tb in zip(seconds_a, seconds_b)]))
    return best, median, paired


def print_ratios(seconds):
    """Throughput ratios of row pairs: of best rounds, of medians, and the median of the
    per-round ratios (rows run back to back in each round, so that one cancels most drift)."""
    for a, b in RATIOS:
        if a in seconds and b in seconds:
            best, median, paired = ratios(seconds[a], seconds[b])
            print(f"# {a} / {b}: {best:.3f}x best, {median:.3f}x median, "
                  f"{paired:.3f}x paired median")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=8,
                        help="interleaved timing rounds; best and median reported (some machines drift by "
                             "25%% over minutes)")
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated row names to run")
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()

    from bert_keras import BertConfig

    config = BertConfig.from_preset(args.preset)
    data = synthetic_batch(args.batch_size, args.seq_length, args.predictions, config.vocab_size)
    flops = {nsp: training_flops_per_sequence(
        config.num_hidden_layers, config.hidden_size, config.intermediate_size,
        config.vocab_size, args.seq_length, args.predictions, nsp=nsp) for nsp in (True, False)}

    rows = [  # name, framework, MLM+NSP?, function
        ("ours MLM+NSP", "tf", True, lambda: ours(args, data, False, False)),
        ("ours MLM+NSP XLA", "tf", True, lambda: ours(args, data, False, True)),
        ("ours MLM-only", "tf", False, lambda: ours(args, data, True, False)),
        ("ours MLM-only XLA", "tf", False, lambda: ours(args, data, True, True)),
        ("keras-hub BertMaskedLM (MLM-only)", "tf", False,
         lambda: keras_hub_masked_lm(args, data, False)),
        ("keras-hub BertMaskedLM (MLM-only) XLA", "tf", False,
         lambda: keras_hub_masked_lm(args, data, True)),
        ("keras-hub BertMaskedLM (MLM-only) with bert_keras AdamW", "tf", False,
         lambda: keras_hub_masked_lm(args, data, False, our_optimizer=True)),
        ("transformers BertForPreTraining as shipped", "torch", True,
         lambda: transformers_pretraining(args, data, gathered=False)),
        ("transformers BertForPreTraining, head gathered", "torch", True,
         lambda: transformers_pretraining(args, data, gathered=True)),
    ]
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    rows = [row for row in rows if not only or any(o in row[0] for o in only)]
    print(f"# {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} "
          f"V={config.vocab_size}; batch {args.batch_size}, seq {args.seq_length}, "
          f"{args.predictions} predictions; best of {args.rounds} rounds of {args.steps} "
          f"steps after {args.warmup_steps} warm-up steps", flush=True)
    # Build and warm up (compile) everything first, then time the rows in interleaved
    # rounds and keep each row's best round: on a shared machine, load changes over minutes
    # and would otherwise favour whichever row ran in a quiet spell.
    runners = []
    for name, framework, nsp, build in rows:
        run = build()
        run(args.warmup_steps)
        runners.append((name, framework, nsp, run))
    seconds = {name: [] for name, *_ in runners}
    peaks = {"tf": 0.0, "torch": 0.0}
    for round_number in range(args.rounds):
        peaks = {"tf": max(peaks["tf"], tf_matmul_peak()),
                 "torch": max(peaks["torch"], torch_matmul_peak())}
        # Odd rounds run the rows in reverse, so no row always follows the same one.
        for name, _, _, run in runners[::-1] if round_number % 2 else runners:
            seconds[name].append(run(args.steps))
    print(f"# matmul peak (best of {args.rounds}): TF {peaks['tf']:.0f} GFLOP/s, "
          f"torch {peaks['torch']:.0f} GFLOP/s")
    print("| model | seq/s (best) | seq/s (median) | model GFLOP/s | MFU vs matmul peak |")
    print("| --- | ---: | ---: | ---: | ---: |")
    results = {"args": vars(args), "peaks_gflops": peaks, "rows": []}
    for name, framework, nsp, _ in runners:
        per_round = [args.steps * args.batch_size / s for s in seconds[name]]
        throughput = max(per_round)
        gflops = throughput * flops[nsp] / 1e9
        print(f"| {name} | {throughput:.1f} | {float(np.median(per_round)):.1f} | {gflops:.0f} "
              f"| {gflops / peaks[framework]:.0%} |")
        results["rows"].append(dict(name=name, seq_per_s=throughput, gflops=gflops,
                                    mfu=gflops / peaks[framework],
                                    seq_per_s_per_round=per_round))
    print_ratios(seconds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
