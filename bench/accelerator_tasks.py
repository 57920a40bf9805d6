r"""Fine-tuning and inference on an accelerator: the sides of bench_accelerator's task modes.

    from accelerator_tasks import SIZES, build, flops_per_example
    run = build("finetune", "ours", "base")      # in a process of its own
    run(3)                                       # warm-up (compilation)
    seconds = run(6)                             # 6 steps, results on the device done
    examples_per_second = 6 * SIZES["finetune"]["base"]["batch"] / seconds

Two modes (issue 48), each timed like bench_accelerator's pretraining sides: `build(mode,
side, size)` makes everything (model, optimizer, synthetic batches: on the device, except
that Keras' fit feeds each step's batch from host arrays, as in bench_accelerator) and
returns run(steps) -> wall seconds of that many steps, measured from the first step's start
to the last step's results being complete (Keras fit: on_train_begin to on_train_end; JAX:
block_until_ready; torch: torch.cuda.synchronize on a GPU). Compilation happens in the
first call: time the calls after a warm-up call.

finetune   BERT-base S128 batch 32, bfloat16 mixed precision (float32 weights), 2 labels,
           dropout 0.1 (hidden, attention probabilities, classifier), AdamW: peak lr 2e-5,
           betas 0.9/0.999, epsilon 1e-6, weight decay 0.01 except LayerNorm and biases,
           global-norm clipping 1.0, linear decay from the peak (no warmup: the schedule
           is a few scalar ops, and the rate stays useful however many steps run)
  ours           run_classifier's model, loss and optimizer: `BertClassifier` with the tool's
                 defaults (head dropout 0.1, "normal" head initializer, skip_padding, which
                 on Keras' JAX backend runs the padded computation), `tasks.compile_args`
                 (sparse softmax cross-entropy on the float32 logits, accuracy), the tool's
                 `create_optimizer` (linear schedule, Adam epsilon as in the paper); built
                 as `run_classifier --mixed_precision=mixed_bfloat16` builds it (the encoder
                 copied into the policy by `tasks.with_dtype_policy`, the head following
                 it); model.compile(jit_compile=True), model.fit.
                 Its last layer runs at [CLS] only (the classifier reads nothing else): the
                 FLOPs below count the whole layer, as for every side
  keras_hub      keras_hub.models.BertTextClassifier(BertBackbone(...), num_classes=2,
                 preprocessor=None) built from sizes (a preset would download), fitted as a
                 keras.Model over its graph (the Task's fit needs grain or tf.data); Keras' AdamW
                 with the same settings and decay exclusions, SparseCategoricalCrossentropy
                 (from_logits), accuracy; mixed_bfloat16, jit_compile=True, model.fit
  torch          transformers' BertForSequenceClassification, eager, SDPA attention, float32
                 weights under torch.autocast(bfloat16), its own loss (labels=...), torch's
                 AdamW (fused on CUDA) with decay groups as transformers' Trainer makes them,
                 get_linear_schedule_with_warmup, clip_grad_norm_
  torch_compile  the same step with the model's forward and loss under torch.compile

inference  the encoder's forward, batch 256 S128, outputs sequence_output [B, S, H] and
           pooled_output [B, H], left on the device; weights in bfloat16 on every side
           (what a server on a GPU loads: half the memory, no per-call weight casts; our
           LayerNorm statistics and attention softmax stay float32 inside, by design)
  ours           bert_keras.BertEncoder built under the "bfloat16" policy, its stateless call
                 under jax.jit (training=False), only the two outputs returned (predict_on_batch
                 would copy them to the host: 50 MB a batch at base, which the torch sides
                 do not pay); Keras' JAX backend only.
                 ours@real_tokens=M: `BertEncoder.call_on_real_tokens` instead, each batch's
                 dense layers on its real tokens rounded up to a multiple of M rows (the
                 capacity, computed on the host and compiled before timing); the FLOPs
                 below still count the padded computation
  keras_hub      keras_hub.models.BertBackbone under the "bfloat16" policy, the same jitted
                 call
  torch          transformers' BertModel (SDPA) .to(bfloat16), eval(), under
                 torch.inference_mode
  torch_compile  the same model under torch.compile

Inputs (both modes, the same arrays on every side, numpy default_rng(0)): word ids in
[103, V) after [CLS] (101) with [SEP] (102) last, real lengths uniform in [S/2, S],
right-padded with id 0 and mask 0, segment 1 on the second half of the real tokens; labels
uniform in {0, 1}. Four distinct batches, cycled.

Model FLOPs per example (2 per multiply-add; the padded computation is counted, as every
side runs it): forward = L x (8SH^2 + 4SHI + 4S^2H) (bench_pretraining.encoder_forward_flops)
+ 2H^2 (pooler); fine-tuning = 3 x (forward + 2HC), C labels; inference = forward.

Sizes: base (L12 H768 A12 I3072), large (L24 H1024 A16 I4096), both vocabulary 30,522, S128,
batch 32 (fine-tuning) or 256 (inference); tiny (L2 H48 A3 I96, V1000, S24) is for a CPU
(tests/test_accelerator_tasks.py); mini (L4 H256 A4 I1024, S128, batch 32; inference only)
is for A/B rows on a CPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
if os.path.dirname(HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(HERE))

MODES = ("finetune", "inference")
SIDES = ("ours", "keras_hub", "torch", "torch_compile")
_BASE = dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, seq=128,
             min_length=64)
_LARGE = dict(_BASE, layers=24, hidden=1024, heads=16, intermediate=4096)
# A CPU's A/B size for the inference mode (BERT-mini: L4 H256 A4 I1024, S128).
_MINI = dict(_BASE, layers=4, hidden=256, heads=4, intermediate=1024)
_TINY = dict(layers=2, hidden=48, heads=3, intermediate=96, vocab=1000, seq=24, min_length=12)
SIZES = {
    # min_length: real lengths are uniform in [min_length, seq], padding after them.
    "finetune": {"tiny": dict(_TINY, batch=8, labels=2), "base": dict(_BASE, batch=32, labels=2),
                 "large": dict(_LARGE, batch=32, labels=2)},
    "inference": {"tiny": dict(_TINY, batch=10), "base": dict(_BASE, batch=256),
                  "large": dict(_LARGE, batch=256), "mini": dict(_MINI, batch=32)},
}
LEARNING_RATE, WEIGHT_DECAY, EPSILON, CLIPNORM, DROPOUT = 2e-5, 0.01, 1e-6, 1.0, 0.1
FINETUNE_POLICY, INFERENCE_POLICY = "mixed_bfloat16", "bfloat16"
INFERENCE_OUTPUTS = ("sequence_output", "pooled_output")
POOL_BATCHES, SEED = 4, 0
CLS_ID, SEP_ID = 101, 102


def flops_per_example(mode: str, size: dict) -> float:
    """Model FLOPs of one example (see the module docstring); `size` is a SIZES entry."""
    from bench_pretraining import encoder_forward_flops

    hidden = size["hidden"]
    forward = encoder_forward_flops(size["layers"], hidden, size["intermediate"],
                                    size["seq"]) + 2 * hidden * hidden  # + pooler
    if mode == "inference":
        return forward
    return 3 * (forward + 2 * hidden * size["labels"])  # + classifier, x 3 for training


def synthetic_examples(size: dict, count: int = POOL_BATCHES, seed: int = SEED) -> dict:
    """`count` batches of padded examples as numpy arrays of count * B rows.

    Returns:
      {"ids", "mask", "types": int32 [N, S]; "labels": int32 [N] in [0, labels) (when
       `size` has labels)}, N = count * size["batch"].
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    rows, seq = count * size["batch"], size["seq"]
    lengths = rng.integers(size["min_length"], seq + 1, size=rows)
    positions = np.arange(seq)[None, :]
    mask = (positions < lengths[:, None]).astype(np.int32)
    ids = rng.integers(SEP_ID + 1, size["vocab"], size=(rows, seq)).astype(np.int32)
    ids[:, 0] = CLS_ID
    ids[np.arange(rows), lengths - 1] = SEP_ID
    ids *= mask
    types = ((positions >= (lengths // 2)[:, None]) & (mask == 1)).astype(np.int32)
    data = dict(ids=ids, mask=mask, types=types)
    if "labels" in size:
        data["labels"] = rng.integers(0, size["labels"], size=rows).astype(np.int32)
    return data


def build(mode: str, side: str, size: str, real_tokens: int | None = None):
    """run(steps) -> seconds for one side of a mode at a named size (see the docstring).

    Builds the model, optimizer and the synthetic batches (on the device); call it in the
    process that times it. The Keras sides use the backend Keras was imported with
    (KERAS_BACKEND); the inference mode's Keras sides need JAX. `real_tokens` (inference,
    ours): run `BertEncoder.call_on_real_tokens`, each batch at its real tokens rounded
    up to this multiple (see the docstring).

    Raises:
      ValueError: an unknown mode, side or size, or `real_tokens` elsewhere than ours'
        inference (one line naming the choices).
    """
    if real_tokens is not None and (mode, side) != ("inference", "ours"):
        raise ValueError(f"real_tokens is an option of the inference mode's ours side, not "
                         f"of {mode} {side}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if side not in SIDES:
        raise ValueError(f"unknown side {side!r}; expected one of {SIDES}")
    if size not in SIZES[mode]:
        raise ValueError(f"unknown {mode} size {size!r}; expected one of {sorted(SIZES[mode])}")
    dims = SIZES[mode][size]
    data = synthetic_examples(dims)
    torch_side = side.startswith("torch")
    if mode == "finetune":
        return (torch_finetune(side, dims, data) if torch_side
                else keras_finetune(side, dims, data))
    if torch_side:
        return torch_inference(side, dims, data)
    return keras_inference(side, dims, data, real_tokens)


# --------------------------------------------------------------------------------------
# Keras sides


@contextlib.contextmanager
def dtype_policy(name: str):
    """Keras' global dtype policy set to `name` while models are built (as a mixed-precision
    user sets it; a layer keeps the policy it was built with), then put back."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def ours_encoder(size: dict):
    """bert_keras.BertEncoder of `size` (GELU, dropout 0.1 on hidden states and attention
    probabilities, 512 positions, 2 segments), in Keras' current dtype policy."""
    from bert_keras import BertEncoder

    return BertEncoder(
        vocab_size=size["vocab"], num_layers=size["layers"], hidden_size=size["hidden"],
        num_heads=size["heads"], intermediate_size=size["intermediate"], hidden_act="gelu",
        dropout=DROPOUT, attention_dropout=DROPOUT, max_sequence_length=512,
        type_vocab_size=2)


def keras_hub_backbone(size: dict):
    """keras_hub.models.BertBackbone of `size`, built from sizes (a preset would download):
    dropout 0.1, 512 positions, 2 segments, in Keras' current dtype policy."""
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=size["vocab"], num_layers=size["layers"], num_heads=size["heads"],
        hidden_dim=size["hidden"], intermediate_dim=size["intermediate"], dropout=DROPOUT,
        max_sequence_length=512, num_segments=2)


def keras_features(side: str, data: dict) -> dict:
    """`synthetic_examples` as the inputs of side "ours" (TF Hub names, int32 mask) or
    "keras_hub" (its names, boolean padding mask)."""
    if side == "ours":
        return {"input_word_ids": data["ids"], "input_mask": data["mask"],
                "input_type_ids": data["types"]}
    return {"token_ids": data["ids"], "padding_mask": data["mask"].astype(bool),
            "segment_ids": data["types"]}


def ours_classifier(encoder, num_labels: int):
    """run_classifier's model on `encoder`: BertClassifier with the tool's defaults
    (ClassifierOptions: classifier_dropout 0.1, skip_padding; FinetuneOptions:
    head_initializer "normal"); tests/test_accelerator_tasks.py checks it against the
    tool's `ClassificationTask.build`."""
    from bert_keras.tasks import BertClassifier

    return BertClassifier(encoder, num_labels, dropout=DROPOUT, head_initializer="normal",
                          skip_padding=True)


def keras_finetune_model(side: str, size: dict, learning_rate: float = LEARNING_RATE):
    """(compiled model, feed) for the finetune mode's Keras side `side` ("ours" or
    "keras_hub"); feed(data) -> (x, y) maps `synthetic_examples` to the model's inputs."""
    import keras

    from bench_pretraining import keras_optimizer

    keras.utils.set_random_seed(SEED)
    if side == "ours":
        from bert_keras.tasks import compile_args, with_dtype_policy

        # As run_classifier --mixed_precision=mixed_bfloat16 builds it (runner._load_model):
        # the encoder copied into the policy, the head following it; no global policy.
        model = ours_classifier(with_dtype_policy(ours_encoder(size), FINETUNE_POLICY),
                                size["labels"])
        # The tool's optimizer: create_optimizer with its defaults (loop.train).
        model.compile(optimizer=keras_optimizer(learning_rate=learning_rate),
                      jit_compile=True, **compile_args(model))
        return model, lambda data: (keras_features(side, data), {"logits": data["labels"]})
    import keras_hub

    with dtype_policy(FINETUNE_POLICY):
        classifier = keras_hub.models.BertTextClassifier(
            keras_hub_backbone(size), num_classes=size["labels"], preprocessor=None,
            dropout=DROPOUT)
        # The same graph and weights as a plain keras.Model: a keras-hub Task's own fit
        # wraps arrays in a grain or tf.data pipeline (neither is on the GPU machine, and
        # ours is fed by core Keras' array adapter); this one is fed as ours is.
        model = keras.Model(classifier.input, classifier.output)
    model.compile(optimizer=keras_optimizer(stock=True, learning_rate=learning_rate),
                  jit_compile=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()])
    return model, lambda data: (keras_features(side, data), data["labels"])


def keras_finetune(side: str, size: dict, data: dict):
    """run(steps) -> seconds: `steps` steps of model.fit over the batches of `data`, cycled."""
    import numpy as np

    from bench_pretraining import keras_runner

    model, feed = keras_finetune_model(side, size)
    x, y = feed(data)
    batch, rows = size["batch"], len(data["ids"])

    def run(steps):
        # Exactly `steps` batches (a fit that runs out of data ends its epoch early); the
        # arrays are made before fit starts its clock.
        take = np.arange(steps * batch) % rows

        def pick(tree):
            return tree[take] if isinstance(tree, np.ndarray) else {k: v[take] for k, v in
                                                                      tree.items()}

        return keras_runner(model, pick(x), y=pick(y), batch_size=batch, shuffle=False)(steps)

    return run


def keras_inference_model(side: str, size: dict):
    """(model, feed) for the inference mode's Keras side: our BertEncoder or keras-hub's
    BertBackbone in the "bfloat16" policy; feed(data) -> the model's input dict."""
    import keras

    keras.utils.set_random_seed(SEED)
    with dtype_policy(INFERENCE_POLICY):
        model = ours_encoder(size) if side == "ours" else keras_hub_backbone(size)
    return model, lambda data: keras_features(side, data)


def jitted_forward(model):
    """forward(inputs) -> {"sequence_output", "pooled_output"}: `model`'s stateless call in
    inference mode under jax.jit, with its current weights (Keras' JAX backend)."""
    forward, weights = forward_and_weights(model)
    return lambda inputs: forward(*weights, inputs)


def forward_and_weights(model):
    """(jitted forward, weights): forward(*weights, inputs) is `jitted_forward`'s call (what
    bench/compile_for_gpu.py compiles)."""
    import jax
    import keras

    if keras.backend.backend() != "jax":
        raise ValueError(f"the inference mode's Keras sides run on KERAS_BACKEND=jax (jax.jit "
                         f"of the model's stateless call); this process has "
                         f"{keras.backend.backend()}")
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    @jax.jit
    def forward(trainable, non_trainable, inputs):
        outputs, _ = model.stateless_call(trainable, non_trainable, inputs, training=False)
        return {k: outputs[k] for k in INFERENCE_OUTPUTS}

    return forward, (trainable, non_trainable)


def real_tokens_forward(model):
    """forward(inputs, capacity) -> {"sequence_output", "pooled_output"}: our encoder's
    `call_on_real_tokens` under jax.jit (capacity static: one compilation per value), in a
    StatelessScope holding the model's current weights."""
    forward, values = real_tokens_forward_and_weights(model)
    return lambda inputs, capacity: forward(values, inputs, capacity)


def real_tokens_forward_and_weights(model):
    """(jitted forward, weight values): forward(values, inputs, capacity) is
    `real_tokens_forward`'s call (what bench/compile_for_gpu.py compiles)."""
    import functools

    import jax
    import keras

    variables = model.trainable_variables + model.non_trainable_variables
    values = [v.value for v in variables]

    @functools.partial(jax.jit, static_argnums=2)
    def forward(values, inputs, capacity):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            outputs = model.call_on_real_tokens(inputs, capacity)
        return {k: outputs[k] for k in INFERENCE_OUTPUTS}

    return forward, values


def keras_inference(side: str, size: dict, data: dict, real_tokens: int | None = None):
    """run(steps) -> seconds: `steps` jitted forwards over the batches of `data`, cycled.
    With `real_tokens` (ours), each batch runs at `padding_free.row_capacity(mask,
    real_tokens)` rows, computed on the host before timing; every capacity is compiled
    here, so the timed calls compile nothing."""
    import jax

    model, feed = keras_inference_model(side, size)
    inputs = feed(data)
    batch = size["batch"]
    host = [{k: v[i * batch:(i + 1) * batch] for k, v in inputs.items()}
            for i in range(len(data["ids"]) // batch)]
    batches = [jax.device_put(b) for b in host]
    if real_tokens is None:
        return cycling_runner(jitted_forward(model), batches, jax.block_until_ready)
    from bert_keras.layers import padding_free

    forward = real_tokens_forward(model)
    capacities = [padding_free.row_capacity(b["input_mask"], real_tokens) for b in host]
    for b, capacity in zip(batches, capacities):
        jax.block_until_ready(forward(b, capacity))
    return cycling_runner(lambda item: forward(*item), list(zip(batches, capacities)),
                          jax.block_until_ready)


def cycling_runner(step, batches, wait, context=contextlib.nullcontext):
    """run(steps) -> seconds: step(batch) over `batches` in turn, then wait(last result).

    A device runs one program's launches in order, so the last result complete means all
    are."""
    state = {"i": 0}

    def run(steps):
        wait(None)
        start = time.perf_counter()
        result = None
        with context():
            for _ in range(steps):
                result = step(batches[state["i"] % len(batches)])
                state["i"] += 1
            wait(result)
        return time.perf_counter() - start

    return run


# --------------------------------------------------------------------------------------
# transformers on torch


def transformers_config(size: dict, **overrides):
    """transformers.BertConfig of `size` (GELU, dropout 0.1, 512 positions, 2 segments, SDPA
    attention)."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
        intermediate_size=size["intermediate"], hidden_act="gelu",
        hidden_dropout_prob=DROPOUT, attention_probs_dropout_prob=DROPOUT,
        max_position_embeddings=512, type_vocab_size=2, **overrides)
    config._attn_implementation = "sdpa"
    return config


def torch_adamw(model, learning_rate: float, fused: bool):
    """torch's AdamW with transformers' Trainer decay groups: weight decay on every
    parameter but biases and LayerNorm weights."""
    import torch

    no_decay = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate, betas=(0.9, 0.999), eps=EPSILON, fused=fused)


def _torch_device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_batches(data: dict, size: dict, device: str, names: dict) -> list[dict]:
    """The batches of `data` as int64 tensors on `device`, keys renamed by `names`."""
    import torch

    batch = size["batch"]
    return [{names[k]: torch.from_numpy(v[i * batch:(i + 1) * batch]).long().to(device)
             for k, v in data.items() if k in names}
            for i in range(len(data["ids"]) // batch)]


def torch_wait(device):
    """wait(result) for `cycling_runner`: torch.cuda.synchronize on a GPU (CPU ops are
    synchronous)."""
    import torch

    return (lambda _: torch.cuda.synchronize()) if device == "cuda" else (lambda _: None)


def torch_finetune(side: str, size: dict, data: dict):
    """run(steps) -> seconds of BertForSequenceClassification training steps (eager, or
    with the forward and loss under torch.compile for side "torch_compile")."""
    import torch
    import transformers

    device = _torch_device()
    torch.manual_seed(SEED)
    config = transformers_config(size, num_labels=size["labels"],
                                 problem_type="single_label_classification")
    model = transformers.BertForSequenceClassification(config).to(device).train()
    optimizer = torch_adamw(model, LEARNING_RATE, fused=device == "cuda")
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, 0, 10 ** 6)
    batches = _torch_batches(data, size, device, {
        "ids": "input_ids", "mask": "attention_mask", "types": "token_type_ids",
        "labels": "labels"})

    def loss_fn(input_ids, attention_mask, token_type_ids, labels):
        return model(input_ids=input_ids, attention_mask=attention_mask,
                     token_type_ids=token_type_ids, labels=labels).loss

    if side == "torch_compile":
        loss_fn = torch.compile(loss_fn)

    def step(batch):
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = loss_fn(**batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIPNORM)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return cycling_runner(step, batches, torch_wait(device))


def torch_inference(side: str, size: dict, data: dict):
    """run(steps) -> seconds of BertModel forwards in bfloat16 under inference_mode (eager,
    or the model under torch.compile for side "torch_compile")."""
    import torch
    import transformers

    device = _torch_device()
    torch.manual_seed(SEED)
    model = transformers.BertModel(transformers_config(size), add_pooling_layer=True)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    forward = torch.compile(model) if side == "torch_compile" else model
    batches = _torch_batches(data, size, device, {
        "ids": "input_ids", "mask": "attention_mask", "types": "token_type_ids"})

    def step(batch):
        out = forward(**batch)
        return out.last_hidden_state, out.pooler_output

    return cycling_runner(step, batches, torch_wait(device), context=torch.inference_mode)
