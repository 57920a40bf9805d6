r"""BERT pretraining throughput on an accelerator: ours against keras-hub and transformers.

    python bench/bench_accelerator.py --sizes=base,large --out=/tmp/accelerator

Every side trains the same model on the same synthetic batches: BERT (post-LN, GELU,
dropout 0.1 on hidden states and attention probabilities), masked LM with P predictions
per sequence + next-sentence prediction, AdamW (lr 1e-4, betas 0.9/0.999, epsilon 1e-6,
weight decay 0.01 except LayerNorm and biases, global-norm clipping 1.0), bfloat16 mixed
precision (float32 weights). Sides, each in a process of its own (so no side inherits
another's memory, compilation caches or threads):

  ours            bert_keras.BertPretrainer compiled with its losses, metrics and optimizer
                  (`create_optimizer`), `model.fit`, XLA-compiled, on the Keras backend of
                  --keras_backend (jax by default: the accelerator route of Keras 3)
  keras_hub       keras_hub.models.BertBackbone + keras_hub.layers.MaskedLMHead (tied to the
                  backbone's token embedding) + a 2-way NSP Dense on the pooled output, as a
                  Keras user builds a pretrainer from keras-hub's parts; Keras' AdamW and
                  SparseCategoricalCrossentropy, the same metrics; same backend, same fit
  torch           transformers' BertForPreTraining, torch eager with SDPA attention,
                  torch.autocast bfloat16, torch's fused AdamW (decay groups as transformers'
                  Trainer makes them), clip_grad_norm_; the MLM head gathered to the P masked
                  positions (the same work as ours; as shipped it projects all S positions)
  torch_compile   the same step with the model's forward and loss under torch.compile

A side may carry options after "@" (for A/B rows of ours): `ours@attention_dropout=0`
(fused attention, `keras.ops.dot_product_attention`), `ours@dropout=0` (no dropout at
all), `ours@disable=dropout_16_bits` (a kernel of bert_keras.kernels off),
`ours@enable=gelu_16_bits` (a kernel not yet measured on, bert_keras.kernels.UNMEASURED);
several kernels joined by "+". In the inference mode, `ours@real_tokens=1024` runs
`BertEncoder.call_on_real_tokens`: the dense layers on each batch's real tokens, rounded up
to a multiple of 1024 rows (bench/accelerator_tasks.py).

Timing: after --warmup_steps (compilation included), --rounds rounds; each round runs
--steps steps and then 2 x --steps steps, each call timed from its first step's start to its
last step's completion (Keras: fit's on_train_begin to on_train_end, after which the results
are on the host; torch: CUDA synchronize). For the Keras sides the step time is the median
over rounds of (time of 2n steps - time of n steps) / n: what each further step costs,
without the fixed cost of a call; for the torch sides, whose call is a plain loop of steps
with no setup, the median of the 2n-step call's time / 2n. A Keras fit call has one (it builds its epoch iterator and syncs the
training state back into the variables: about 40 ms on an H200 at BERT-base, idle on the
device, BUILD_NOTES 8.10), which a training run pays once per epoch of thousands of steps;
divided over a round of 5 steps it added 8 ms to a 53.5 ms step. `step_seconds_per_call`
keeps the whole call's time / steps of the longer calls (what earlier versions of this
bench reported). Where the differential median is not above zero (the fixed cost varied
more than the extra steps cost: tiny sizes on a busy CPU) the step time is that per-call
figure, and `step_timing` in the results says which it is.

Model FLOPs per sequence (stated in the output): 3 x forward, forward = L x (8SH^2 +
4SHI + 4S^2H) + 2PH^2 + 2PHV + 2H^2 + 4H (bench_pretraining.training_flops_per_sequence;
multiply-adds count 2; the MLM head on the P masked positions only). Utilisation is that
rate over the device's dense bfloat16 peak: 989 TFLOP/s for an H100 or H200 (SXM), 312
for an A100; --peak_tflops overrides it; on a CPU the peak is torch's float32 matmul rate
measured in this run.

Sizes: base (L12 H768 A12 I3072, S128, batch 256), large (L24 H1024 A16 I4096, S128,
batch 128), both at vocabulary 30,522 and P = 20; base512 (BERT-base at S512, batch 64,
P = 80: the recipe's last 10% of steps, where attention is a larger share of the step);
tiny (L2 H64 A2 I128, S32, batch 8, P 5) is for a CPU (tests/test_bench_accelerator.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

SIZES = {
    # name: layers, hidden, heads, intermediate, vocab, seq, batch, predictions
    "tiny": dict(layers=2, hidden=64, heads=2, intermediate=128, vocab=30522, seq=32, batch=8,
                 predictions=5),
    "base": dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, seq=128,
                 batch=256, predictions=20),
    "large": dict(layers=24, hidden=1024, heads=16, intermediate=4096, vocab=30522, seq=128,
                  batch=128, predictions=20),
    # The recipe's last 10% of steps: S512 with P = 80 (Google's max_predictions_per_seq).
    "base512": dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, seq=512,
                    batch=64, predictions=80),
}
SIDES = ("ours", "keras_hub", "torch", "torch_compile")
# bf16 dense tensor-core peaks (TFLOP/s, SXM parts), by a substring of the device name.
BF16_PEAKS = (("H200", 989.0), ("H100", 989.0), ("A100", 312.0))
LEARNING_RATE, WEIGHT_DECAY, EPSILON, CLIPNORM = 1e-4, 0.01, 1e-6, 1.0


def sizes_of(mode):
    """The named sizes of a mode."""
    if mode == "pretraining":
        return SIZES
    import accelerator_tasks

    return accelerator_tasks.SIZES[mode]


def flops_per_example(mode, size_name):
    """Model FLOPs of one example of a mode's step at a named size."""
    if mode == "pretraining":
        return flops_per_sequence(SIZES[size_name])
    import accelerator_tasks

    return accelerator_tasks.flops_per_example(mode, accelerator_tasks.SIZES[mode][size_name])


def flops_per_sequence(size):
    from bench_pretraining import training_flops_per_sequence

    return training_flops_per_sequence(size["layers"], size["hidden"], size["intermediate"],
                                       size["vocab"], size["seq"], size["predictions"])


def synthetic_batches(size, count=4, seed=0):
    """`count` distinct batches as numpy arrays, stacked on axis 0 ([count * B, ...])."""
    import numpy as np

    from bench_pretraining import synthetic_batch

    parts = [synthetic_batch(size["batch"], size["seq"], size["predictions"], size["vocab"],
                             seed=seed + i) for i in range(count)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def parse_side(spec, mode="pretraining"):
    """"ours@attention_dropout=0,disable=x" -> ("ours", {"attention_dropout": "0", ...}).
    The fine-tuning mode takes `disable` and `enable` only; the inference mode also
    `real_tokens=M` (a positive int: BertEncoder.call_on_real_tokens, rows rounded up to M)."""
    name, _, options = spec.partition("@")
    if name not in SIDES:
        raise SystemExit(f"error: --sides: unknown side {name!r}; expected some of {SIDES}")
    # Options are separated by "," or by ";" (inside --order, whose runs "," separates).
    parsed = dict(o.split("=", 1) for o in options.replace(";", ",").split(",") if o)
    allowed = {"ours": {"pretraining": {"attention_dropout", "dropout", "disable", "enable"},
                        "inference": {"disable", "enable", "real_tokens"}}.get(
                            mode, {"disable", "enable"})}.get(name, set())
    if set(parsed) - allowed:
        raise SystemExit(f"error: --sides: {spec!r}: options {sorted(set(parsed) - allowed)} "
                         f"not understood; {name} takes {sorted(allowed) or 'none'}")
    if "real_tokens" in parsed and not (parsed["real_tokens"].isdigit()
                                        and int(parsed["real_tokens"]) > 0):
        raise SystemExit(f"error: --sides: {spec!r}: real_tokens must be a positive integer "
                         f"(the row multiple), got {parsed['real_tokens']!r}")
    return name, parsed


# --------------------------------------------------------------------------------------
# Keras sides (ours, keras_hub), run in a child process


def _keras_optimizer_stock():
    import keras

    from bert_keras.optimization import NO_DECAY_PATTERN

    optimizer = keras.optimizers.AdamW(learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY,
                                       beta_1=0.9, beta_2=0.999, epsilon=EPSILON,
                                       global_clipnorm=CLIPNORM)
    optimizer.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    return optimizer


def build_ours(size, options):
    from bert_keras import BertConfig, BertPretrainer
    from bert_keras.losses import pretraining_losses_and_metrics
    from bert_keras.optimization import create_optimizer

    dropout = float(options.get("dropout", 0.1))
    config = BertConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
        intermediate_size=size["intermediate"], hidden_act="gelu",
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=float(options.get("attention_dropout", dropout)),
        max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02)
    model = BertPretrainer.from_bert_config(config)
    # A constant rate in effect (no warmup, decay over 10^6 updates): the schedule's
    # arithmetic is a few scalar ops.
    optimizer = create_optimizer(LEARNING_RATE, num_train_steps=10 ** 6, num_warmup_steps=0,
                                 weight_decay=WEIGHT_DECAY, epsilon=EPSILON,
                                 global_clipnorm=CLIPNORM)
    model.compile(optimizer=optimizer, jit_compile=True, **pretraining_losses_and_metrics())

    def feed(data):
        features = {"input_word_ids": data["ids"], "input_mask": data["mask"],
                    "input_type_ids": data["types"], "masked_lm_positions": data["positions"]}
        labels = {"mlm_logits": data["labels"], "nsp_logits": data["nsp"]}
        weights = {"mlm_logits": data["weights"],
                   "nsp_logits": (data["nsp"] * 0 + 1).astype("float32")}
        return features, labels, weights

    return model, feed


def build_keras_hub(size, options):
    import keras
    import keras_hub

    # Built from sizes: from_preset would download.
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=size["vocab"], num_layers=size["layers"], num_heads=size["heads"],
        hidden_dim=size["hidden"], intermediate_dim=size["intermediate"], dropout=0.1,
        max_sequence_length=512, num_segments=2)
    mask_positions = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
    outputs = backbone(backbone.input)
    mlm = keras_hub.layers.MaskedLMHead(
        vocabulary_size=size["vocab"], token_embedding=backbone.token_embedding,
        intermediate_activation="gelu", kernel_initializer=keras.initializers.TruncatedNormal(
            stddev=0.02), name="mlm")(outputs["sequence_output"], mask_positions=mask_positions)
    nsp = keras.layers.Dense(2, name="nsp")(outputs["pooled_output"])
    model = keras.Model({**backbone.input, "mask_positions": mask_positions},
                        {"mlm": mlm, "nsp": nsp})
    model.compile(
        optimizer=_keras_optimizer_stock(), jit_compile=True,
        loss={"mlm": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              "nsp": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        weighted_metrics={"mlm": [keras.metrics.SparseCategoricalAccuracy()],
                          "nsp": [keras.metrics.SparseCategoricalAccuracy()]})

    def feed(data):
        features = {"token_ids": data["ids"], "padding_mask": data["mask"].astype(bool),
                    "segment_ids": data["types"], "mask_positions": data["positions"]}
        labels = {"mlm": data["labels"], "nsp": data["nsp"]}
        weights = {"mlm": data["weights"], "nsp": (data["nsp"] * 0 + 1).astype("float32")}
        return features, labels, weights

    return model, feed


def set_kernel_switches(options):
    """A side's `disable=a+b` / `enable=a+b` options as $BERT_KERAS_DISABLE_KERNELS /
    $BERT_KERAS_ENABLE_KERNELS for the models this process builds (bert_keras.kernels)."""
    from bert_keras import kernels

    for option, env in (("disable", kernels.DISABLE_ENV), ("enable", kernels.ENABLE_ENV)):
        if options.get(option):
            os.environ[env] = options[option].replace("+", ",")
    kernels.disabled_kernels(), kernels.enabled_kernels()  # unknown names: an error now


def run_keras_side(name, options, size, args):
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    set_kernel_switches(options)
    model, feed = (build_ours if name == "ours" else build_keras_hub)(size, options)
    # As many distinct batches as the longest fit call takes (a fit that runs out of data
    # ends its epoch early).
    count = max(2 * args.steps, args.warmup_steps, 2)
    features, labels, weights = feed(synthetic_batches(size, count=count))
    from bench_pretraining import keras_runner

    return keras_runner(model, features, y=labels, sample_weight=weights,
                        batch_size=size["batch"], shuffle=False)


def profile_keras(run, profile_path):
    """Two more steps under JAX's profiler; the .xplane.pb trace is copied to profile_path."""
    import glob
    import shutil
    import tempfile

    import jax

    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            run(2)
        traces = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
        if traces:
            shutil.copyfile(traces[0], profile_path)


def profile_breakdown(xplane_path, steps=2):
    """Kernel time per step by category (matmul, attention, transposes, reductions, other)
    from the trace `profile_keras` wrote (bench/profile_breakdown.py); an error string if
    the trace could not be read."""
    try:
        from profile_breakdown import kernel_time_by_category

        return kernel_time_by_category(xplane_path, steps)
    except Exception as error:  # the figures above stand without it
        return {"error": f"{type(error).__name__}: {error}"[:300]}


# The custom calls of fused attention in a compiled XLA module: cuDNN's flash attention
# (JAX's cuDNN binding) and bert_keras' Pallas kernels (Triton calls named after them).
CUDNN_ATTENTION_TARGET = "__cudnn$fmha"
PALLAS_ATTENTION_NAMES = ("bert_flash_attention_forward", "bert_flash_attention_dkdv",
                          "bert_flash_attention_dq")
FALLBACK_LOG = "Failed to apply"


# The jitted function whose compiled module holds a mode's step: Keras' train step, or the
# inference sides' jitted forward (accelerator_tasks.jitted_forward).
STEP_MODULE = {"pretraining": "train_step", "finetune": "train_step", "inference": "forward"}


def fused_attention_in_dump(dump_dir, step="train_step"):
    """What the compiled step holds, read from XLA's dump (`--xla_dump_to`): counts of cuDNN
    fused-attention custom calls and of bert_keras' Pallas attention kernels in the largest
    optimized module whose name has `step` (Keras' jitted train step by default)."""
    import glob

    modules = glob.glob(os.path.join(dump_dir, f"*{step}*after_optimizations.txt"))
    if not modules:
        return {"error": f"no optimized {step} module in {dump_dir}"}
    module = max(modules, key=os.path.getsize)
    with open(module) as f:
        text = f.read()
    instructions = [line for line in text.splitlines() if " = " in line]
    found = {"module": os.path.basename(module),
             "cudnn_fused_attention_calls": sum(1 for line in instructions
                                                if CUDNN_ATTENTION_TARGET in line),
             "pallas_attention_calls": sum(1 for line in instructions
                                           if "__gpu$xla.gpu.triton" in line
                                           and "bert_flash_attention" in line),
             "custom_call_targets": sorted(set(re.findall(r'custom_call_target="([^"]+)"',
                                                          text)))}
    found["fused"] = bool(found["cudnn_fused_attention_calls"] or found["pallas_attention_calls"])
    return found


# --------------------------------------------------------------------------------------
# transformers on torch, run in a child process


def run_torch_side(name, size, args):
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
        intermediate_size=size["intermediate"], hidden_act="gelu",
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        max_position_embeddings=512, type_vocab_size=2)
    config._attn_implementation = "sdpa"
    model = transformers.BertForPreTraining(config).to(device).train()
    no_decay = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=LEARNING_RATE, betas=(0.9, 0.999), eps=EPSILON, fused=device == "cuda")
    data = synthetic_batches(size)
    batch = size["batch"]
    tensors = {k: torch.from_numpy(v).to(device) for k, v in data.items()}
    tensors = {k: (v.long() if k != "weights" else v) for k, v in tensors.items()}
    hidden = size["hidden"]

    def loss_fn(ids, mask, types, positions, labels, weights, nsp):
        out = model.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
        sequence = torch.gather(out.last_hidden_state, 1,
                                positions[..., None].expand(-1, -1, hidden))
        mlm_logits = model.cls.predictions(sequence).float()              # [B, P, V]
        nsp_logits = model.cls.seq_relationship(out.pooler_output).float()  # [B, 2]
        ce = torch.nn.functional.cross_entropy(mlm_logits.transpose(1, 2), labels,
                                               reduction="none")
        loss = (ce * weights).sum() / (weights.sum() + 1e-5)
        return loss + torch.nn.functional.cross_entropy(nsp_logits, nsp)

    if name == "torch_compile":
        loss_fn = torch.compile(loss_fn)
    count = len(data["ids"]) // batch
    state = {"i": 0}

    def step():
        i = state["i"] % count
        state["i"] += 1
        part = {k: v[i * batch:(i + 1) * batch] for k, v in tensors.items()}
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = loss_fn(part["ids"], part["mask"], part["types"], part["positions"],
                           part["labels"], part["weights"], part["nsp"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIPNORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def run(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    return run


# --------------------------------------------------------------------------------------
# The child: one side, one size; prints one JSON line


def time_rounds(run, steps, rounds, differential):
    """Per-step seconds of `rounds` rounds: ([step time per round], [call time / steps of the
    longer call per round]). Each round calls run(steps) then run(2 * steps); with
    `differential` the step time is their difference / steps (a call's fixed cost cancels:
    the Keras sides), else the longer call's time / (2 * steps) (the torch sides)."""
    step_times, per_call = [], []
    for _ in range(rounds):
        short = run(steps)
        long = run(2 * steps)
        per_call.append(long / (2 * steps))
        step_times.append((long - short) / steps if differential else per_call[-1])
    return step_times, per_call


def step_time(step_times, per_call, differential):
    """(seconds a step, how it was timed) from time_rounds' lists: the median differential
    step time, or the median call time / steps where it is not differential or where that
    median is not above zero (the calls' fixed cost varied more than the extra steps cost:
    tiny sizes on a busy CPU), so no side reports a negative rate."""
    if differential and statistics.median(step_times) > 0:
        return statistics.median(step_times), "differential"
    return statistics.median(per_call), ("per_call" if not differential else
                                         "per_call (differential not above noise)")


def child(args):
    name, options = parse_side(args.side, args.mode)
    start = time.perf_counter()
    if args.mode != "pretraining":
        import accelerator_tasks

        set_kernel_switches(options)
        real_tokens = options.get("real_tokens")
        run = accelerator_tasks.build(args.mode, name, args.size,
                                      real_tokens=None if real_tokens is None
                                      else int(real_tokens))
        size = accelerator_tasks.SIZES[args.mode][args.size]
    elif name in ("ours", "keras_hub"):
        size = SIZES[args.size]
        run = run_keras_side(name, options, size, args)
    else:
        size = SIZES[args.size]
        run = run_torch_side(name, size, args)
    run(args.warmup_steps)
    warmup_seconds = time.perf_counter() - start
    differential = name in ("ours", "keras_hub")
    rounds, per_call = time_rounds(run, args.steps, args.rounds, differential)
    step_seconds, step_timing = step_time(rounds, per_call, differential)
    breakdown = None
    if args.profile_path and name in ("ours", "keras_hub"):
        import keras

        if keras.backend.backend() == "jax":
            profile_keras(run, args.profile_path)
            breakdown = profile_breakdown(args.profile_path)
    result = dict(side=args.side, size=args.size, step_seconds=step_seconds,
                  step_seconds_per_round=rounds,
                  step_seconds_per_call=statistics.median(per_call), step_timing=step_timing,
                  warmup_seconds=warmup_seconds,
                  examples_per_second=size["batch"] / step_seconds)
    if breakdown is not None:
        result["kernel_breakdown"] = breakdown
    if name in ("ours", "keras_hub"):
        import keras

        result["backend"] = keras.backend.backend()
        if keras.backend.backend() == "jax":
            import jax

            result["device"] = str(jax.devices()[0].device_kind)
    else:
        import torch

        result["backend"] = f"torch {torch.__version__}"
        result["device"] = (torch.cuda.get_device_name() if torch.cuda.is_available()
                            else "cpu")
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------
# The parent: every (size, side) in its own process, then the table


def device_peak(args):
    """(peak TFLOP/s, how it was found)."""
    if args.peak_tflops:
        return args.peak_tflops, "--peak_tflops"
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, peak in BF16_PEAKS:
            if key in name:
                return peak, f"{name}: dense bf16 peak"
    if torch is None:
        return None, "no peak known (no torch to measure a matmul)"
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    torch.mm(a, b)
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < 1.0:
        torch.mm(a, b)
        count += 1
    rate = 2 * 1024 ** 3 * count / (time.perf_counter() - start) / 1e12
    return rate, "measured torch float32 1024^3 matmul on this CPU"


def trace_name(side):
    """A side's name in file names: "ours@attention_dropout=0" -> "ours_attention_dropout_0"."""
    return "".join(c if c.isalnum() else "_" for c in side)


def keep_module(dump_dir, module, hlo_dir, name):
    """Copies a compiled module's text from XLA's dump to hlo_dir/name, gzipped."""
    import gzip
    import shutil

    os.makedirs(hlo_dir, exist_ok=True)
    with open(os.path.join(dump_dir, module), "rb") as source, \
            gzip.open(os.path.join(hlo_dir, name), "wb") as target:
        shutil.copyfileobj(source, target)


def run_child(size, side, args, timeout):
    import shutil
    import tempfile

    env = dict(os.environ)
    env["KERAS_BACKEND"] = args.keras_backend
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras_side = parse_side(side, args.mode)[0] in ("ours", "keras_hub")
    dump_dir = None
    if keras_side and args.keras_backend == "jax":
        # XLA's compiled modules, to read the train step's custom calls from.
        dump_dir = tempfile.mkdtemp(prefix="xla_dump_")
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), f"--xla_dump_to={dump_dir}",
                                     "--xla_dump_hlo_as_text",
                                     f"--xla_dump_hlo_module_re=.*{STEP_MODULE[args.mode]}.*"]
                                    ).strip()
    command = [sys.executable, os.path.abspath(__file__), f"--mode={args.mode}",
               f"--side={side}", f"--size={size}",
               f"--steps={args.steps}", f"--rounds={args.rounds}",
               f"--warmup_steps={args.warmup_steps}"]
    if args.profile_dir and keras_side and args.keras_backend == "jax":
        os.makedirs(args.profile_dir, exist_ok=True)
        trace = f"{trace_name(side)}_{size}.xplane.pb"
        command.append(f"--profile_path={os.path.join(args.profile_dir, trace)}")
    started = time.perf_counter()
    try:
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return dict(side=side, size=size, error=f"timed out after {timeout:.0f} s")
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
                result["process_seconds"] = time.perf_counter() - started
                if dump_dir:
                    result["fused_attention"] = fused_attention_in_dump(
                        dump_dir, STEP_MODULE[args.mode])
                    if args.hlo_dir and "module" in result["fused_attention"]:
                        keep_module(dump_dir, result["fused_attention"]["module"],
                                    args.hlo_dir, f"{trace_name(side)}_{size}.hlo.txt.gz")
                    result["fused_attention"]["fallback_logs"] = done.stderr.count(FALLBACK_LOG)
                return result
        tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
        return dict(side=side, size=size, error=f"exit {done.returncode}", log="\n".join(tail))
    finally:
        if dump_dir:
            shutil.rmtree(dump_dir, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", default="pretraining",
                        choices=("pretraining", "finetune", "inference"),
                        help="pretraining (BertPretrainer's step), finetune (run_classifier's "
                             "step, issue 48) or inference (the encoder's forward); the last "
                             "two: bench/accelerator_tasks.py")
    parser.add_argument("--sizes", default="base,large")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="comma-separated; run in this order for each size, sizes in turn "
                             "(see --order)")
    parser.add_argument("--order", default="",
                        help="explicit comma-separated size:side runs, in priority order "
                             "(instead of --sizes x --sides)")
    parser.add_argument("--keras_backend", default="jax", choices=("jax", "tensorflow"))
    parser.add_argument("--steps", type=int, default=6, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--peak_tflops", type=float, default=0.0)
    parser.add_argument("--deadline_s", type=float, default=0.0,
                        help="launch no run after this many seconds (0: no limit); each run "
                             "gets at most the time left")
    parser.add_argument("--out", default="", help="folder for results.json and results.md")
    parser.add_argument("--profile_dir", default="",
                        help="JAX only: trace two more steps of every Keras side into this "
                             "folder and print the kernel time by category")
    parser.add_argument("--hlo_dir", default="",
                        help="JAX only: keep each Keras side's compiled step (XLA's optimized "
                             "HLO text, gzipped) in this folder")
    # Child mode.
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--profile_path", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        return child(args)

    if args.order:
        runs = [tuple(r.split(":", 1)) for r in args.order.split(",") if r]
    else:
        runs = [(size, side) for size in args.sizes.split(",") if size
                for side in args.sides.split(",") if side]
    for size, side in runs:
        if size not in sizes_of(args.mode):
            raise SystemExit(f"error: unknown {args.mode} size {size!r}; expected one of "
                             f"{sorted(sizes_of(args.mode))}")
        parse_side(side, args.mode)
    peak, peak_source = device_peak(args)
    began = time.perf_counter()
    results = []
    for size, side in runs:
        left = args.deadline_s - (time.perf_counter() - began) if args.deadline_s else 3600.0
        if left < 30:
            results.append(dict(side=side, size=size, error="skipped: --deadline_s reached"))
            continue
        print(f"# running {side} at {size} ({left:.0f} s left)", flush=True)
        result = run_child(size, side, args, timeout=left)
        if "error" not in result:
            flops = flops_per_example(args.mode, size)
            result["model_tflops"] = result["examples_per_second"] * flops / 1e12
            result["utilisation"] = result["model_tflops"] / peak if peak else None
            result["flops_per_example"] = flops
        results.append(result)
        print("# " + json.dumps(result), flush=True)
    table = format_table(results, peak, peak_source, args)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(args=vars(args), peak_tflops=peak, peak_source=peak_source,
                           results=results), f, indent=2)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(table + "\n")
    return results


def describe_fused(found):
    """The table's cell for `fused_attention_in_dump`'s findings."""
    if not found:
        return "-"
    if "error" in found:
        return found["error"]
    parts = []
    if found["cudnn_fused_attention_calls"]:
        parts.append(f"cuDNN x{found['cudnn_fused_attention_calls']}")
    if found["pallas_attention_calls"]:
        parts.append(f"Pallas x{found['pallas_attention_calls']}")
    cell = ", ".join(parts) or "none (XLA)"
    if found.get("fallback_logs"):
        cell += f"; {found['fallback_logs']} '{FALLBACK_LOG}' logs"
    return cell


def describe_breakdown(breakdown):
    if "error" in breakdown:
        return breakdown["error"]
    try:
        from profile_breakdown import format_breakdown

        return format_breakdown(breakdown)
    except ImportError:
        return json.dumps(breakdown)


def format_table(results, peak, peak_source, args):
    lines = [f"# {args.mode}; Keras backend {args.keras_backend}; peak {peak or 0:.1f} TFLOP/s "
             f"({peak_source}); step time = median of {args.rounds} rounds of {args.steps} "
             f"steps after {args.warmup_steps} warm-up steps",
             "| size | side | examples/s | step ms | model TFLOP/s | utilisation | "
             "warm-up s | fused attention in the step | device |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    breakdowns = []
    for r in results:
        if "error" in r:
            lines.append(f"| {r['size']} | {r['side']} | {r['error']} | | | | | | |")
            continue
        utilisation = f"{r['utilisation']:.1%}" if r.get("utilisation") else "-"
        lines.append(f"| {r['size']} | {r['side']} | {r['examples_per_second']:,.0f} | "
                     f"{1000 * r['step_seconds']:.1f} | {r['model_tflops']:.1f} | "
                     f"{utilisation} | {r['warmup_seconds']:.0f} | "
                     f"{describe_fused(r.get('fused_attention'))} | {r.get('device', '')} |")
        if r.get("kernel_breakdown"):
            breakdowns.append(f"# {r['size']} {r['side']}: "
                              f"{describe_breakdown(r['kernel_breakdown'])}")
    lines.extend(breakdowns)
    for size in dict.fromkeys(r["size"] for r in results):
        rate = {r["side"]: r["examples_per_second"] for r in results
                if r["size"] == size and "error" not in r}
        if "ours" in rate:
            ratios = ", ".join(f"{rate['ours'] / v:.2f}x {side}" for side, v in rate.items()
                               if side != "ours")
            if ratios:
                lines.append(f"# {size}: ours = {ratios}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
