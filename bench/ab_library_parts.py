r"""A/B of bert_keras' hand-written replacements of library parts, in pretraining steps.

bert_keras replaced five library parts with its own code for speed (issue 5, session 8):
`bert_keras.layers.LayerNorm` (closed-form gradient) for `keras.layers.LayerNormalization`;
`bert_keras.layers.Dropout` (16 random bits per element) for `keras.layers.Dropout`; `gelu`
with a written-out derivative for autodiff of `keras.ops.gelu(x, approximate=False)`;
`bert_keras.optimization.AdamW` (TensorFlow's fused ResourceApplyAdam) for
`keras.optimizers.AdamW`; and `MaskedLMLoss`'s softmax cross-entropy for
`keras.losses.sparse_categorical_crossentropy` (TensorFlow's fused kernel). This script times
training steps of one model (bench_pretraining's "ours MLM-only" by default: the mini preset,
batch 32, sequence 128, 20 masked predictions, synthetic batch, Keras fit) built with all of
ours and with one library part swapped back in, for each part, plus all five library parts
at once. Everything else is identical and all variants live in one process. The library
parts are swapped in by patching inside this script while a variant is built (product code
is untouched), and before timing a check builds every variant without dropout from the
same weights and requires the same loss, gradients and AdamW update on the same batch as
ours. Then every variant is warmed up, and each round times ours and the variant back to
back for every part, the order reversed on odd rounds. Each row gives ms per step of both
and the speed of ours over the library part (library time / ours time; above 1, ours is
faster) from the best rounds, the medians, and the median of per-round ratios. Run:

    python bench/ab_library_parts.py                    # defaults: mini, 8 rounds of 5 steps
    python bench/ab_library_parts.py --jit_compile      # the same under XLA
    python bench/ab_library_parts.py --jit_compile --kernels_under_xla  # every kernel on
    python bench/ab_library_parts.py --preset=tiny --steps=3 --rounds=2   # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import warnings
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

# Keras' fit warns on every call that a tf.data dataset is not shuffled.
warnings.filterwarnings("ignore", message="`shuffle=True` was passed")

from bench_pretraining import keras_runner, ours_model, ratios, synthetic_batch  # noqa: E402

PARTS = ("dropout", "gelu", "adamw", "loss", "layer_norm")

# What each part is, ours and the library's (the code before the commit that replaced it).
PART_NAMES = {
    "dropout": ("bert_keras.layers.Dropout", "keras.layers.Dropout"),
    "gelu": ("activations.gelu (custom gradient)", "keras.ops.gelu(approximate=False)"),
    "adamw": ("optimization.AdamW (ResourceApplyAdam)", "keras.optimizers.AdamW"),
    "loss": ("MaskedLMLoss (softmax + XLA gradient)",
             "keras.losses.sparse_categorical_crossentropy"),
    "layer_norm": ("layers.LayerNorm (closed-form gradient)",
                   "keras.layers.LayerNormalization"),
}


# --------------------------------------------------------------------------------------
# The library parts, and how a variant gets them. Product code is not changed: while a
# variant is *built* (layers created, model compiled), the names through which bert_keras
# creates these parts are patched to the library's, and restored afterwards. The layers,
# optimizer and loss keep the objects they were built with, so the patches need not be
# active when the training step is traced or run. `_describe` then checks, on the built
# model, which implementation each part really got.


def library_gelu(x):
    """Exact GELU by autodiff of the erf formula: bert_keras' `gelu` before commit 96a9841."""
    import keras

    return keras.ops.gelu(x, approximate=False)


@functools.cache  # One class, so that _describe recognises what library_parts installed.
def _library_masked_lm_loss_class():
    """MaskedLMLoss whose cross-entropy is Keras' (TensorFlow's fused kernel): the code
    before commit 7d5a5e6. The reduction (weights, +1e-5, replicas) is inherited."""
    import keras
    from keras import ops

    from bert_keras.losses import MaskedLMLoss

    class LibraryMaskedLMLoss(MaskedLMLoss):
        def call(self, y_true, y_pred):
            return keras.losses.sparse_categorical_crossentropy(
                ops.cast(y_true, "int32"), ops.cast(y_pred, "float32"), from_logits=True
            )

    return LibraryMaskedLMLoss


@functools.cache  # One class, so that _describe recognises what library_parts installed.
def _library_adamw_class():
    """keras.optimizers.AdamW taking create_optimizer's `epsilon_placement`: Keras' update
    step, with epsilon rescaled per step for "adam_paper" as bert_keras does on backends
    without the fused kernel (one scalar op), so the check compares like for like."""
    import keras

    from bert_keras.optimization import _bias_corrections

    class LibraryAdamW(keras.optimizers.AdamW):
        def __init__(self, *args, epsilon_placement="keras", **kwargs):
            super().__init__(*args, **kwargs)
            self.epsilon_placement = epsilon_placement

        def update_step(self, gradient, variable, learning_rate):
            if self.epsilon_placement == "keras":
                return super().update_step(gradient, variable, learning_rate)
            epsilon = self.epsilon
            self.epsilon = epsilon * keras.ops.sqrt(_bias_corrections(self, variable.dtype)[1])
            try:
                return super().update_step(gradient, variable, learning_rate)
            finally:
                self.epsilon = epsilon

    return LibraryAdamW


@functools.cache  # One class, so that _describe recognises what library_parts installed.
def _library_layer_norm_class():
    """keras.layers.LayerNormalization with the entry point the encoder block calls,
    `call_with_residual(x, residual)`, as the block did before it had one: the residual sum,
    then Keras' layer (never the fused kernel of bert_keras.residual_layer_norm)."""
    import keras

    class LibraryLayerNormalization(keras.layers.LayerNormalization):
        def call_with_residual(self, inputs, residual):
            return self(inputs + residual)

    return LibraryLayerNormalization


def _ours_and_library():
    """{part: (our object, the library's object)} for the names that get patched."""
    import keras

    from bert_keras import losses, optimization
    from bert_keras.layers import activations, dropout, layer_norm

    return {
        "layer_norm": (layer_norm.LayerNorm, _library_layer_norm_class()),
        "dropout": (dropout.Dropout, keras.layers.Dropout),
        "gelu": (activations.gelu, library_gelu),
        "adamw": (optimization.AdamW, _library_adamw_class()),
        "loss": (losses.MaskedLMLoss, _library_masked_lm_loss_class()),
    }


@contextlib.contextmanager
def library_parts(parts):
    """Within this block, bert_keras builds the library version of each part in `parts`.

    Every attribute of every loaded bert_keras module that *is* our object (e.g. the
    `Dropout` imported by attention.py, embeddings.py and transformer_block.py, `AdamW`
    used by `create_optimizer`, `MaskedLMLoss` used by `pretraining_losses_and_metrics`)
    is replaced by the library's, and so is the "gelu" entry of the activation table that
    `get_activation` reads.
    """
    from bert_keras.layers import activations

    swaps = _ours_and_library()
    with contextlib.ExitStack() as stack:
        for part in parts:
            ours, library = swaps[part]
            for module in [m for name, m in sys.modules.items()
                           if m is not None and name.split(".")[0] == "bert_keras"]:
                for attribute, value in list(vars(module).items()):
                    if value is ours:
                        stack.enter_context(mock.patch.object(module, attribute, library))
            if part == "gelu":
                stack.enter_context(mock.patch.dict(activations._ACTIVATIONS,
                                                    {"gelu": library}))
        yield


def _describe(model):
    """{part: (how many uses of ours, how many of the library's)} in a compiled model."""
    swaps = _ours_and_library()
    layers = list(model._flatten_layers(include_self=False))
    counts = {}
    ours, library = swaps["dropout"]
    counts["dropout"] = (sum(type(layer) is ours for layer in layers),
                         sum(type(layer) is library for layer in layers))
    ours, library = swaps["layer_norm"]
    counts["layer_norm"] = (sum(type(layer) is ours for layer in layers),
                            sum(type(layer) is library for layer in layers))
    ours, library = swaps["gelu"]
    functions = [layer._activation_fn for layer in layers if hasattr(layer, "_activation_fn")]
    counts["gelu"] = (sum(f is ours for f in functions), sum(f is library for f in functions))
    ours, library = swaps["adamw"]
    counts["adamw"] = (int(type(model.optimizer) is ours), int(type(model.optimizer) is library))
    ours, library = swaps["loss"]
    loss = model.loss["mlm_logits"]
    counts["loss"] = (int(type(loss) is ours), int(type(loss) is library))
    return counts


def _assert_variant(model, name, parts):
    """Fails unless `model` uses the library version of exactly the parts in `parts`."""
    for part, (n_ours, n_library) in _describe(model).items():
        expected_library = part in parts
        if (n_library if expected_library else n_ours) == 0 or (
                n_ours if expected_library else n_library) != 0:
            raise RuntimeError(
                f"variant {name!r}: {part} has {n_ours} uses of ours and {n_library} of the "
                f"library's; expected only the {'library' if expected_library else 'our'} "
                "version. Has the product code changed where it creates this part? Update "
                "library_parts() / _describe() in this script.")


def build(args, data, name, parts, config=None):
    """A compiled variant (same seed, so same initial weights as the others)."""
    import keras

    keras.utils.set_random_seed(args.seed)
    with library_parts(parts):
        model, dataset = ours_model(args, data, not args.nsp, args.jit_compile, config=config)
    _assert_variant(model, name, parts)
    return model, dataset


def variants(parts):
    """[(name, library parts)]: ours, one per part, and all of `parts` together."""
    rows = [("ours", ())] + [(part, (part,)) for part in parts]
    if len(parts) > 1:
        rows.append(("all " + "+".join(parts), tuple(parts)))
    return rows


# --------------------------------------------------------------------------------------
# Check: like for like before timing


def _relative_difference(a, b):
    """The largest ||x - y|| / ||x|| over pairs of arrays (x, y) in lists a, b.

    Per array, not over all together: the word embeddings' gradient (tied to the MLM
    output) dominates a global norm and would hide a difference in, say, the feed-forward
    kernels, where GELU's gradient goes. ||x|| is taken as at least 1e-4 of the largest
    ||x||: the attention key biases have a gradient of exactly 0 in exact arithmetic
    (softmax ignores a constant added to all scores of a query) and of rounding noise,
    about 1e-11, in float32.
    """
    norms = [float(np.linalg.norm(np.asarray(x, np.float64))) for x in a]
    floor = 1e-4 * max(norms, default=0.0)
    worst = 0.0
    for x, y, norm in zip(a, b, norms):
        difference = float(np.linalg.norm(np.asarray(x, np.float64) - np.asarray(y, np.float64)))
        worst = max(worst, difference / max(norm, floor) if difference else 0.0)
    return worst


def _loss_gradients_update(model, batch):
    """Loss, gradients and the first optimizer update of `model` on `batch`, and the loss
    after that update: (loss, [gradient], [update], loss after)."""
    import tensorflow as tf

    features, labels, sample_weight = batch
    with tf.GradientTape() as tape:
        y_pred = model(features, training=True)
        loss = model.compute_loss(x=features, y=labels, y_pred=y_pred,
                                  sample_weight=sample_weight, training=True)
    gradients = [tf.convert_to_tensor(g).numpy()
                 for g in tape.gradient(loss, model.trainable_variables)]
    before = [v.numpy() for v in model.trainable_variables]
    model.train_on_batch(features, labels, sample_weight=sample_weight)
    update = [v.numpy() - w for v, w in zip(model.trainable_variables, before)]
    after = model.train_on_batch(features, labels, sample_weight=sample_weight,
                                 return_dict=True)["loss"]
    return float(loss), gradients, update, float(after)


def check(args, data, rows):
    """Builds every variant without dropout from ours' initial weights and compares loss,
    gradients, AdamW update and loss after it with ours' on the same batch. Returns the
    table rows; raises SystemExit if a variant is out of tolerance."""
    import keras

    from bert_keras import BertConfig

    config = dataclasses.replace(BertConfig.from_preset(args.preset), hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
    results, reference, weights, failed = [], None, None, []
    for name, parts in rows:
        model, dataset = build(args, data, name, parts, config=config)
        if weights is None:
            weights = model.get_weights()
        else:
            model.set_weights(weights)
        batch = next(iter(dataset))
        loss, gradients, update, after = _loss_gradients_update(model, batch)
        if reference is None:
            reference = (loss, gradients, update, after)
            continue
        ref_loss, ref_gradients, ref_update, ref_after = reference
        row = dict(variant=name, loss_ours=ref_loss, loss=loss,
                   loss_rel=abs(loss - ref_loss) / abs(ref_loss),
                   gradient_rel=_relative_difference(ref_gradients, gradients),
                   update_rel=_relative_difference(ref_update, update),
                   loss_after_rel=abs(after - ref_after) / abs(ref_after))
        # Dropout is the identity at rate 0 in both layers: the graphs then compute the
        # same thing, so the dropout variant must match exactly.
        exact = parts == ("dropout",)
        row["ok"] = (all(row[k] == 0.0 for k in ("loss_rel", "gradient_rel", "update_rel",
                                                 "loss_after_rel")) if exact else
                     row["loss_rel"] <= args.loss_rtol and row["loss_after_rel"] <= args.loss_rtol
                     and row["gradient_rel"] <= args.gradient_rtol
                     and row["update_rel"] <= args.update_rtol)
        if not row["ok"]:
            failed.append(name)
        results.append(row)
    print(f"# check: no dropout, ours' initial weights, the same batch; tolerances (relative): "
          f"loss {args.loss_rtol:g}, gradients {args.gradient_rtol:g}, update "
          f"{args.update_rtol:g}; dropout variant exact")
    print("| variant vs ours | loss (ours) | loss | loss rel. diff | gradients rel. diff "
          "| AdamW update rel. diff | loss after update rel. diff | ok |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        print(f"| {r['variant']} | {r['loss_ours']:.6f} | {r['loss']:.6f} | {r['loss_rel']:.1e} "
              f"| {r['gradient_rel']:.1e} | {r['update_rel']:.1e} | {r['loss_after_rel']:.1e} "
              f"| {'yes' if r['ok'] else 'NO'} |", flush=True)
    keras.backend.clear_session()
    if failed:
        raise SystemExit(f"check failed for {failed}: the variants do not compute the same "
                         "training step; timings would not compare like for like.")
    return results


# --------------------------------------------------------------------------------------
# Timing


def time_pairs(args, runners, rows):
    """Rounds of back-to-back (ours, variant) runs for every variant; the order of the
    pairs and within each pair is reversed on odd rounds. Returns {variant: (ours' seconds,
    variant's seconds)}, one entry per round each."""
    seconds = {name: ([], []) for name, _ in rows[1:]}
    pairs = [name for name, _ in rows[1:]]
    for round_number in range(args.rounds):
        odd = round_number % 2
        for name in pairs[::-1] if odd else pairs:
            order = [(name, 1), ("ours", 0)] if odd else [("ours", 0), (name, 1)]
            for runner, slot in order:
                seconds[name][slot].append(runners[runner](args.steps))
        print(f"# round {round_number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Columns: ms/step of ours (A) and of the library part (B), best and median "
               "round; speed-up of ours = B time / A time, of best rounds, of medians, and "
               "the median of per-round ratios (A and B run back to back).")
    parser.add_argument("--preset", default="mini", help="BERT size (BertConfig preset)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20,
                        help="masked positions per sequence")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=8,
                        help="timing rounds; each runs ours and every variant back to back")
    parser.add_argument("--warmup_steps", type=int, default=2,
                        help="untimed steps per variant first (tracing, compiling)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to A/B, of {','.join(PARTS)}; with "
                             "two or more, a row with all of them together is added")
    parser.add_argument("--jit_compile", action="store_true",
                        help="compile the training step with XLA (all variants)")
    parser.add_argument("--kernels_under_xla", action="store_true",
                        help="with --jit_compile: ours runs every kernel of "
                             "bert_keras.kernels under XLA too (the product runs there only "
                             "those measured to win; this measures them)")
    parser.add_argument("--nsp", action="store_true",
                        help="time the whole BertPretrainer (MLM + NSP), not MLM-only")
    parser.add_argument("--seed", type=int, default=0,
                        help="Keras random seed, set before building each variant")
    parser.add_argument("--skip_check", action="store_true",
                        help="time without first checking that the variants compute the "
                             "same training step")
    parser.add_argument("--check_only", action="store_true", help="check, then stop")
    parser.add_argument("--loss_rtol", type=float, default=1e-5,
                        help="check: largest relative loss difference")
    parser.add_argument("--gradient_rtol", type=float, default=1e-5,
                        help="check: largest ||g - g_ours|| / ||g_ours|| of any variable's "
                             "gradient (the tanh GELU in place of the erf one gives 8e-5 at "
                             "the tiny preset, the library's erf GELU 6e-7)")
    parser.add_argument("--update_rtol", type=float, default=1e-3,
                        help="check: the same for the first AdamW update of any variable "
                             "(Keras' AdamW differs from ours by up to 1.3e-4: it forms "
                             "1 - beta_2 in float64)")
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args(argv)
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        parser.error(f"--parts: unknown {unknown}; choose from {','.join(PARTS)}")

    from bert_keras import BertConfig, kernels

    if args.kernels_under_xla:  # For this process; padding-free needs static shapes' absence.
        for name, (backends, _) in list(kernels.KERNELS.items()):
            if name != "padding_free":
                kernels.KERNELS[name] = (backends, True)
    config = BertConfig.from_preset(args.preset)
    data = synthetic_batch(args.batch_size, args.seq_length, args.predictions, config.vocab_size)
    rows = variants(parts)
    print(f"# {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} "
          f"V={config.vocab_size}; batch {args.batch_size}, seq {args.seq_length}, "
          f"{args.predictions} predictions; {'MLM+NSP' if args.nsp else 'MLM-only'}; "
          f"XLA {'on' if args.jit_compile else 'off'}; dropout "
          f"{config.hidden_dropout_prob:g}/{config.attention_probs_dropout_prob:g}; "
          f"{args.rounds} rounds of {args.steps} steps after {args.warmup_steps} warm-up "
          "steps", flush=True)
    results = {"args": vars(args), "check": None, "rows": []}
    if not args.skip_check:
        results["check"] = check(args, data, rows)
    if args.check_only:
        return
    runners = {}
    for name, variant_parts in rows:
        model, dataset = build(args, data, name, variant_parts)
        runners[name] = keras_runner(model, dataset)
        runners[name](args.warmup_steps)
    seconds = time_pairs(args, runners, rows)
    print("| part | ours (A) | library (B) | A ms/step best | A median | B ms/step best "
          "| B median | speed-up of ours: best | median | paired median |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, variant_parts in rows[1:]:
        a, b = seconds[name]
        best, median, paired = ratios(a, b)
        ms = [1000 * s / args.steps for s in (min(a), float(np.median(a)), min(b),
                                               float(np.median(b)))]
        if len(variant_parts) == 1:
            ours_name, library_name = PART_NAMES[name]
        else:
            ours_name, library_name = "all ours", "all library"
        print(f"| {name} | {ours_name} | {library_name} | {ms[0]:.1f} | {ms[1]:.1f} "
              f"| {ms[2]:.1f} | {ms[3]:.1f} | {best:.3f}x | {median:.3f}x | {paired:.3f}x |")
        results["rows"].append(dict(part=name, library_parts=list(variant_parts),
                                    seconds_ours=a, seconds_library=b, best=best,
                                    median=median, paired_median=paired))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
