"""What trains, per backend: every model the tools train, 2 updates on TensorFlow and on JAX.

Why this exists: Keras' two trainers differentiate different lists. TensorFlow's train step
takes the gradient of `trainable_weights` and skips a variable whose gradient is None; JAX's
takes it of `trainable_variables` (the list Keras also builds the optimizer from), where a
variable no loss reads gets a gradient of zeros, and AdamW's weight decay still shrinks it.
An MLM-only `BertPretrainer(next_sentence=False)` left its pooler out of the first list only,
so on JAX its kernel shrank while TensorFlow left it as it was (fixed by 2247f11,
`encoder.TrainsPoolerOnlyWhenRead`; tests/test_training_parity.py's MLM-only case). The
tool's own path was another: `run_pretraining --next_sentence_prediction=false` keeps the
NSP head and compiles the masked-LM loss alone, and on JAX AdamW shrank the pooler's and the
NSP head's kernels, by 1.5e-5 of their scale in the 2 updates here, while TensorFlow skipped
them with a warning the tool silenced (fixed: `run_pretraining.compiled_pretrainer` freezes
both). No test compared the backends with each other; the parity suite holds each to torch,
for models it builds itself.

Here every model the tools train is built and compiled by the tools' own code
(`run_pretraining.compiled_pretrainer`; the fine-tuning tasks' `build` and
`finetuning.loop.train`, with the tools' default flags but the learning rate), set to the
same weights, and trained 2 updates with dropout 0, once in a process on each backend. The
two runs must agree on
  (a) the optimizer's variables, by path (less the optimizer's own name) and shape, and
      hold slots for exactly the weights a loss reads;
  (b) which weights changed and which did not, and these must be what the losses read: only
      a pooler (and an NSP head) no loss reaches stays unchanged;
  (c) the weights, within float32 noise: per tensor, max |TF - JAX| <= RTOL * max |TF|.
Weights whose exact gradient is 0 (`_exact_gradient_is_zero`) move by rounding noise alone,
differently on each backend; they are held to moving far less than an update instead.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, backend_env

pytestmark = pytest.mark.integration  # two fresh processes side by side: about 80 s on 2 cores

# Sizes that all differ; dropout 0 everywhere, so both runs are deterministic.
V, H, LAYERS, HEADS, INTERMEDIATE, POSITIONS = 41, 16, 2, 4, 23, 13
N, B, S, P, CLASSES, TAGS = 8, 3, 7, 5, 6, 9
STEPS = 2
LEARNING_RATE = 1e-3  # Peak; the tools' other optimizer flags are their defaults.

# (c)'s bound: float32 noise. The backends round the forward and backward passes
# differently, and Adam's first steps normalise each gradient element (a step is about
# lr * g / (|g| + epsilon)), so an element whose gradient is a near-cancellation carries its
# rounding into its step. Measured (lr 1e-3, tensors of scale 0.2-1): at most 2.7e-6 of a
# tensor's scale (the classifier on padded pairs, an attention value kernel), most tensors
# 2e-7 to 5e-7, so 1e-5 leaves about 4x. An update taken or missed on one backend differs by
# about lr (1e-3 of the scale); the pooler bug's decay by 1.5e-5, which (b) catches exactly.
RTOL = 1e-5

MODELS = ("pretraining", "pretraining_mlm_only", "classifier_padded",
          "classifier_padding_free", "classifier_pairs_padded", "classifier_pairs_padding_free",
          "regressor", "tagger_padded", "tagger_padding_free", "span_qa")


# ------------------------------------------------------------------------------------------
# The child: runs on the backend KERAS_BACKEND names.


def _inputs(rng, pairs):
    lengths = rng.integers(3, S + 1, size=N)
    mask = (np.arange(S)[None, :] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(1, V, size=(N, S)).astype(np.int32) * mask  # [PAD] = 0 after the end
    types = ((np.arange(S)[None, :] >= (lengths[:, None] + 1) // 2) * mask).astype(np.int32)
    return {"input_word_ids": ids, "input_mask": mask,
            "input_type_ids": types if pairs else np.zeros_like(types)}, lengths


def _pretraining_data(rng):
    """(x, y, sample weights) as `inputs.pretraining_dataset` yields them: NSP labels too,
    with or without the NSP loss."""
    x, lengths = _inputs(rng, pairs=True)
    positions = np.zeros((N, P), np.int32)
    weights = np.zeros((N, P), np.float32)
    for row, length in enumerate(lengths):
        k = rng.integers(1, min(P, length - 1) + 1)  # some rows with padded predictions
        positions[row, :k] = np.sort(rng.choice(np.arange(1, length), k, replace=False))
        weights[row, :k] = 1.0
    x["masked_lm_positions"] = positions
    y = {"mlm_logits": (rng.integers(1, V, size=(N, P)) * weights).astype(np.int32),
         "nsp_logits": rng.integers(0, 2, size=N).astype(np.int32)}
    return x, y, {"mlm_logits": weights, "nsp_logits": np.ones(N, np.float32)}


def _fine_tuning_data(name, rng):
    x, lengths = _inputs(rng, pairs="pairs" in name or name in ("regressor", "span_qa"))
    if name.startswith("classifier"):
        return x, {"logits": rng.integers(0, CLASSES, size=N).astype(np.int32)}
    if name == "regressor":
        return x, {"score": rng.uniform(0, 5, size=N).astype(np.float32)}
    if name.startswith("tagger"):
        tags = rng.integers(0, TAGS, size=(N, S)).astype(np.int32)
        tags[rng.random((N, S)) < 0.3] = -1  # sub-tokens after a word's first: ignored
        tags[x["input_mask"] == 0] = -1
        tags[:, 0] = -1  # [CLS]
        return x, {"logits": tags}
    start = rng.integers(0, lengths).astype(np.int32)
    end = np.minimum(start + rng.integers(0, 3, size=N), lengths - 1).astype(np.int32)
    return x, {"start_logits": start, "end_logits": end}


def _set_weights(model, rng):
    """The same weights on either backend, drawn here (Keras' initializers draw from the
    backend's own generator). Biases and betas too, so that every tensor has a scale."""
    values = []
    for w in model.weights:
        value = 0.2 * rng.standard_normal(tuple(w.shape))
        values.append((1.0 + value if w.path.endswith("gamma") else value).astype(np.float32))
    model.set_weights(values)


def _config():
    from bert_keras.config import BertConfig

    return BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
                      max_position_embeddings=POSITIONS, type_vocab_size=2,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _train_pretrainer(name, rng):
    """As `run_pretraining.train` builds, compiles and fits it."""
    import tensorflow as tf

    from bert_keras.run_pretraining import PretrainingOptions, compiled_pretrainer

    options = PretrainingOptions(input_file="unused", output_dir="unused",
                                 learning_rate=LEARNING_RATE, num_train_steps=STEPS,
                                 num_warmup_steps=0,
                                 next_sentence_prediction=name == "pretraining")
    model = compiled_pretrainer(_config(), options)
    _set_weights(model, rng)
    before = [np.array(w) for w in model.get_weights()]
    data = tf.data.Dataset.from_tensor_slices(_pretraining_data(rng)).batch(B, drop_remainder=True)
    model.fit(data, epochs=1, steps_per_epoch=STEPS, shuffle=False, verbose=0)
    return model, before


def _train_task_model(name, rng):
    """As the fine-tuning runner builds a task model on a fresh encoder and trains it
    (`finetuning.runner`: the task's `build`, then `loop.train`)."""
    from bert_keras.encoder import BertEncoder
    from bert_keras.finetuning import loop
    from bert_keras.finetuning.classification import ClassificationTask, ClassifierOptions
    from bert_keras.finetuning.regression import RegressionTask, RegressorOptions
    from bert_keras.finetuning.runner import FinetuneOptions
    from bert_keras.finetuning.squad import SquadOptions, SquadTask
    from bert_keras.finetuning.tagging import TaggerOptions, TaggingTask

    common = FinetuneOptions(output_dir="unused", learning_rate=LEARNING_RATE,
                             num_train_steps=STEPS)
    skip_padding = "padding_free" in name
    if name.startswith("classifier"):
        task, opts = ClassificationTask(), ClassifierOptions(classifier_dropout=0.0,
                                                             skip_padding=skip_padding)
        labels = [str(i) for i in range(CLASSES)]
    elif name == "regressor":  # the tool's default: padding-free
        task, opts, labels = RegressionTask(), RegressorOptions(classifier_dropout=0.0), None
    elif name.startswith("tagger"):
        task, opts = TaggingTask(), TaggerOptions(tagger_dropout=0.0, skip_padding=skip_padding)
        labels = [str(i) for i in range(TAGS)]
    else:
        task, opts, labels = SquadTask(), SquadOptions(), None
    encoder = BertEncoder.from_bert_config(_config())
    model = task.build(encoder, labels, opts, common.head_initializer)
    _set_weights(model, rng)
    before = [np.array(w) for w in model.get_weights()]
    x, y = _fine_tuning_data(name, rng)
    loop.train(model, x, y, B, common.num_train_epochs, common.learning_rate,
               common.warmup_proportion, seed=common.seed, num_train_steps=common.num_train_steps,
               lr_schedule=common.lr_schedule, epsilon_placement=common.epsilon_placement,
               log_every=common.log_steps)
    return model, before


def train_every_model(out):
    """Writes `out`.npz (each model's weights before and after) and `out`.json (per model:
    weight paths, optimizer variables (path, shape), updates done and Keras' warnings of
    trainable variables without a gradient)."""
    import warnings

    import keras

    arrays, listing = {}, {"backend": keras.backend.backend()}
    for i, name in enumerate(MODELS):
        rng = np.random.default_rng(i)
        train = _train_pretrainer if name.startswith("pretraining") else _train_task_model
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, before = train(name, rng)
        paths = [w.path for w in model.weights]
        assert len(set(paths)) == len(paths), name
        for path, old, new in zip(paths, before, model.get_weights()):
            arrays[f"{name}|before|{path}"] = old
            arrays[f"{name}|after|{path}"] = new
        optimizer = model.optimizer
        listing[name] = {
            "weights": paths,
            "optimizer": sorted([v.path.split("/", 1)[1], list(v.shape)]
                                for v in optimizer.variables),
            "iterations": int(keras.ops.convert_to_numpy(optimizer.iterations)),
            # Keras' warning for a trainable variable without a gradient (TensorFlow's).
            "no_gradient": [str(w.message) for w in caught
                            if "Gradients do not exist" in str(w.message)],
        }
    np.savez(out + ".npz", **arrays)
    with open(out + ".json", "w") as f:
        json.dump(listing, f)


# ------------------------------------------------------------------------------------------
# The test.

_CHILD = ("import sys; sys.path.insert(0, 'tests'); import test_backend_training as t; "
          "t.train_every_model(sys.argv[1])")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{backend: (listing, arrays)}; the two processes run side by side."""
    out = tmp_path_factory.mktemp("backends")
    children = {backend: subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(out / backend)], cwd=REPO,
        env=backend_env(backend), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for backend in ("tensorflow", "jax")}
    results = {}
    for backend, child in children.items():
        _, stderr = child.communicate(timeout=900)
        assert child.returncode == 0, f"{backend}: {stderr[-4000:]}"
        with open(out / f"{backend}.json") as f:
            listing = json.load(f)
        assert listing["backend"] == backend
        results[backend] = (listing, dict(np.load(out / f"{backend}.npz")))
    return results


def _frozen_by_design(name, path):
    """Weights no loss of `name` reads: the pooler where no head reads it, and the NSP head
    trained without its loss."""
    if name in ("pretraining_mlm_only", "tagger_padded", "tagger_padding_free", "span_qa"):
        if path.startswith("pooler_dense/"):
            return True
    return name == "pretraining_mlm_only" and path.startswith("nsp_dense/")


def _exact_gradient_is_zero(name, path):
    """Weights whose gradient is 0 in exact arithmetic, so that float32 rounding alone
    moves them (Adam normalises a gradient of rounding noise into a step): the attention key
    biases (a query's softmax over keys is unchanged by adding q . b_k to all its scores),
    and in span QA the output bias and the last LayerNorm's beta (each shifts every
    position's start or end logit alike, and the softmax over positions ignores a shift).
    (tests/test_training_parity.py finds the same set from a float64 reference.)"""
    if path.endswith("self_attention/key/bias"):
        return True
    return name == "span_qa" and (path == "span_logits/bias" or path ==
                                  f"transformer_layer_{LAYERS - 1}/output_layer_norm/beta")


@pytest.mark.parametrize("name", MODELS)
def test_both_backends_train_the_same_variables_alike(runs, name):
    (tf_listing, tf_arrays), (jax_listing, jax_arrays) = runs["tensorflow"], runs["jax"]
    tf_model, jax_model = tf_listing[name], jax_listing[name]
    assert tf_model["weights"] == jax_model["weights"]
    assert tf_model["iterations"] == jax_model["iterations"] == STEPS
    # (a) The optimizer's variables.
    assert tf_model["optimizer"] == jax_model["optimizer"]
    slots = {path for path, _ in tf_model["optimizer"]}
    changed, far, noise_moved_far, wrong_slots = {}, {}, {}, set()
    for path in tf_model["weights"]:
        before = tf_arrays[f"{name}|before|{path}"]
        np.testing.assert_array_equal(before, jax_arrays[f"{name}|before|{path}"])
        after = {"tensorflow": tf_arrays[f"{name}|after|{path}"],
                 "jax": jax_arrays[f"{name}|after|{path}"]}
        # Slots for a weight, not for one no loss reads.
        if any(s.startswith(path.replace("/", "_") + "_") for s in slots) == (
                _frozen_by_design(name, path)):
            wrong_slots.add(path)
        if _exact_gradient_is_zero(name, path):
            # Rounding noise, different on each backend: each must have moved it far less
            # than an update moves a trained weight (about the learning rate a step).
            moved = max(float(np.max(np.abs(a - before))) for a in after.values())
            if moved > 0.1 * LEARNING_RATE:
                noise_moved_far[path] = moved
            continue
        changed[path] = {b: bool(np.any(a != before)) for b, a in after.items()}
        scale = float(np.max(np.abs(after["tensorflow"])))
        difference = float(np.max(np.abs(after["tensorflow"] - after["jax"])))
        if difference > RTOL * scale:
            far[path] = difference / scale
    # (b) Which weights changed: the same on both backends, and all but those no loss reads.
    assert {p: c["tensorflow"] for p, c in changed.items()} == {
        p: c["jax"] for p, c in changed.items()}
    assert {p for p, c in changed.items() if not c["tensorflow"]} == {
        p for p in changed if _frozen_by_design(name, p)}
    # (c) The weights, within float32 noise.
    assert not far, far
    assert not noise_moved_far, noise_moved_far
    # (a) again: what the optimizer holds slots for; and no Keras warning of a trainable
    # variable without a gradient (TensorFlow's sign of the same mistake).
    assert not wrong_slots, wrong_slots
    assert not tf_model["no_gradient"] and not jax_model["no_gradient"]
