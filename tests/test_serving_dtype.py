"""Serving copies (`tasks.for_serving`) and bfloat16 exports (the task exports'
--serving_dtype).

The reference is the float32 model with the same weights: a bfloat16 copy must differ from
it by bfloat16 rounding only. bfloat16 keeps 8 significant bits (a relative rounding of at
most 2^-9 = 0.2% per value); TINY's two layers round the weights once and the activations a
few dozen times, which measured 0.3-3% of the outputs' scale; the bound is 5%, where a
wrong, transposed or missing weight moves the outputs by O(1) of their scale. And the copy
must not be float32 in disguise: its outputs differ from float32's by more than float32
noise.

A serving copy stores the encoder's Dense kernels as asked (`kernel_layout`: the training
layout [in, out] by default, or [out, in]) and attends through the explicit softmax: in
float32 it must give the model's outputs within float32 noise, which a kernel copied
untransposed (square attention kernels keep their shape) would not.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TINY
from test_length_buckets import LENGTHS, classifier_run, in_tf212, texts_of

from bert_keras import BertEncoder
from bert_keras.tasks import BertClassifier, BertSpanQA, BertTagger, for_serving

BOUND = 0.05  # of the outputs' scale (the module docstring)


def _inputs(seed=0, batch=3, length=12):
    rng = np.random.default_rng(seed)
    mask = (np.arange(length)[None, :] < rng.integers(3, length + 1, (batch, 1))).astype("int32")
    return {"input_word_ids": rng.integers(5, TINY["vocab_size"], (batch, length)) * mask,
            "input_mask": mask, "input_type_ids": np.zeros((batch, length), "int32")}


def _relative(got, expected):
    return float(np.abs(np.asarray(got) - np.asarray(expected)).max()
                 / np.abs(np.asarray(expected)).max())


@pytest.mark.parametrize("task", [BertClassifier, BertTagger, BertSpanQA])
def test_bfloat16_copy_stores_bfloat16_and_rounds_only(task):
    keras.utils.set_random_seed(3)
    kwargs = {} if task is BertSpanQA else {"num_classes": 3}
    model = task(BertEncoder(**TINY), **kwargs)
    copy = for_serving(model, "bfloat16", "out_in")
    assert copy is not model and type(copy) is task
    assert for_serving(copy, "bfloat16", "out_in") is copy
    assert {v.dtype for v in copy.weights} == {"bfloat16"}
    assert [v.path for v in copy.weights] == [v.path for v in model.weights]
    x = _inputs()
    expected, got = model(x, training=False), copy(x, training=False)
    for name in expected:
        assert got[name].dtype == "float32", name  # logits stay float32
        relative = _relative(got[name], expected[name])
        assert 1e-5 < relative <= BOUND, (name, relative)
    # The weights are the model's, rounded: back to float32 they give the model's outputs
    # up to the activations' rounding, and the original is untouched.
    for variable, original, rounded in zip(model.weights, model.get_weights(),
                                           copy.get_weights()):
        if _encoder_kernel(variable.path):
            rounded = rounded.T
        np.testing.assert_allclose(rounded.astype("float32"), original, rtol=2 ** -8, atol=0)


def _export_logits(path, texts, batch):
    """A text-in classifier export's logits for `texts`: in one batch, or one request each."""
    fn = tf.saved_model.load(path).signatures["serving_default"]
    if batch:
        return fn(text=tf.constant(texts))["logits"].numpy()
    return np.concatenate([fn(text=tf.constant([t]))["logits"].numpy() for t in texts])


def _encoder_kernel(path):
    """Whether a variable path names one of the encoder's Dense kernels (heads keep [in,
    out])."""
    return path.endswith("/kernel") and path.startswith(("transformer_layer_", "pooler_dense"))


@pytest.mark.parametrize("task,layout", [(BertClassifier, "out_in"), (BertTagger, "out_in"),
                                         (BertSpanQA, "out_in"), (BertClassifier, "in_out"),
                                         (BertSpanQA, "in_out")])
def test_float32_copy_stores_kernels_as_asked_and_gives_the_same_outputs(task, layout):
    from bert_keras.layers.attention import SelfAttention

    keras.utils.set_random_seed(6)
    kwargs = {} if task is BertSpanQA else {"num_classes": 3}
    model = task(BertEncoder(**TINY), **kwargs)
    rng = np.random.default_rng(6)  # non-zero biases and LayerNorm offsets, as trained
    model.set_weights([w + rng.normal(0, 0.05, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    copy = for_serving(model, "float32", layout)
    assert copy is not model  # the trained model attends through the fused op
    assert copy.encoder.kernel_layout == layout and model.encoder.kernel_layout == "in_out"
    attention = [layer for layer in copy._flatten_layers() if isinstance(layer, SelfAttention)]
    assert len(attention) == TINY["num_layers"]
    assert all(layer.explicit_softmax for layer in attention)
    assert copy.encoder.explicit_softmax and not model.encoder.explicit_softmax
    transposed = 0
    for variable, kept in zip(model.weights, copy.weights):
        if _encoder_kernel(variable.path) and layout == "out_in":
            np.testing.assert_array_equal(kept.numpy(), variable.numpy().T)
            transposed += 1
        else:
            np.testing.assert_array_equal(kept.numpy(), variable.numpy())
    # q, k, v, output, FFN x 2; pooler
    assert transposed == (6 * TINY["num_layers"] + 1 if layout == "out_in" else 0)
    x = _inputs(2)
    expected, got = model(x, training=False), copy(x, training=False)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)
    assert for_serving(copy, "float32", layout) is copy
    other = for_serving(copy, "float32", {"in_out": "out_in", "out_in": "in_out"}[layout])
    assert other is not copy
    for name in expected:
        np.testing.assert_allclose(other(x, training=False)[name], expected[name], rtol=1e-5,
                                   atol=1e-5)


def test_mixed_precision_comes_back_to_float32_and_a_bad_dtype_is_refused():
    keras.utils.set_random_seed(4)
    model = BertClassifier(BertEncoder(**TINY), num_classes=2)
    mixed = BertClassifier(BertEncoder(**TINY, dtype="mixed_bfloat16"), num_classes=2)
    mixed.set_weights(model.get_weights())
    back = for_serving(mixed, "float32")
    assert back.encoder.layers_dtype_policy.name == "float32"
    x = _inputs(1)
    np.testing.assert_allclose(back(x)["logits"], model(x)["logits"], rtol=1e-6, atol=1e-6)
    assert _relative(mixed(x)["logits"], model(x)["logits"]) > 1e-5  # mixed really was bf16
    with pytest.raises(ValueError, match=r"dtype 'float16': expected one of float32, bfloat16"):
        for_serving(model, "float16")
    with pytest.raises(ValueError, match=r"kernel_layout 'in': expected one of in_out, out_in"):
        for_serving(model, "float32", "in")


def test_a_serving_copy_is_refused_by_the_checkpoint_writers(tmp_path):
    from bert_keras import checkpoints

    copy = for_serving(BertClassifier(BertEncoder(**TINY), num_classes=2), "float32", "out_in")
    with pytest.raises(ValueError, match=r"stores its kernels 'out_in' \(a serving copy"):
        checkpoints.save_google_checkpoint(copy, str(tmp_path / "model.ckpt"))
    assert not os.listdir(tmp_path)


def test_serving_dtype_and_kernel_layout_flags_name_their_choices():
    from absl import flags

    import export.export_classifier  # noqa: F401  (defines the task exports' flags)

    try:
        with pytest.raises(flags.IllegalFlagValueError,
                           match=r"--serving_dtype=float16: value should be one of "
                                 r"<float32\|bfloat16>"):
            flags.FLAGS(["prog", "--serving_dtype=float16"])
        flags.FLAGS.unparse_flags()
        with pytest.raises(flags.IllegalFlagValueError,
                           match=r"--kernel_layout=in: value should be one of "
                                 r"<in_out\|out_in>"):
            flags.FLAGS(["prog", "--kernel_layout=in"])
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["prog", "--serving_dtype=bfloat16", "--kernel_layout=in_out"])
        assert flags.FLAGS.serving_dtype == "bfloat16"
        assert flags.FLAGS.kernel_layout == "in_out"
    finally:
        flags.FLAGS.unparse_flags()


# A run_classifier directory, the export tool twice, verify: ~2 min (7 on a loaded machine).
# Not in CI (time); make test-all runs it.
@pytest.mark.integration
@pytest.mark.slow
def test_export_classifier_serving_dtype_bfloat16(tmp_path):
    """--serving_dtype=bfloat16 from the command line: the export holds bfloat16 weights,
    verifies, says so in one line, answers within bfloat16 rounding of the float32 export
    on texts of every bucket, its buckets give its fixed-length run's outputs, and the TF
    2.12.1 + tensorflow-text 2.12.1 process (stock TF Serving's) runs it."""
    import tensorflow_text  # noqa: F401  (the exports hold text ops)

    from export.verify import verify

    keras.utils.set_random_seed(5)
    classifier_run(tmp_path, max_seq_length=32, steps=2)
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    paths, logs = {}, {}
    for dtype, buckets in (("float32", "8,16,24"), ("bfloat16", "8,16,24"),
                           ("bfloat16_fixed", "")):
        result = subprocess.run(
            [sys.executable, "-m", "export.export_classifier", f"--model_dir={tmp_path / 'run'}",
             f"--export_dir={tmp_path / dtype}", "--max_seq_length=32",
             f"--length_buckets={buckets}", f"--serving_dtype={dtype.split('_')[0]}"],
            capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
        paths[dtype], logs[dtype] = result.stdout.strip().splitlines()[-1], result.stderr
    assert [line.split("] ")[-1] for line in logs["bfloat16"].splitlines()
            if "Serving dtype" in line] == [
        "Serving dtype: bfloat16 (weights and matmuls; --serving_dtype)"]
    assert "Serving dtype" not in logs["float32"]

    def stored(path):  # the export's variables: name -> dtype
        reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
        return {name: dtype for name, dtype in reader.get_variable_to_dtype_map().items()
                if name.startswith("serving_variables/")}

    full, half = stored(paths["float32"]), stored(paths["bfloat16"])
    assert full.keys() == half.keys() and len(full) > 50
    assert set(full.values()) == {tf.float32} and set(half.values()) == {tf.bfloat16}

    report = verify(paths["bfloat16"])
    assert report.ok, str(report)
    texts = texts_of(LENGTHS)

    def logits(path, batch):
        return _export_logits(path, texts, batch)

    for batch in (False, True):
        full = logits(paths["float32"], batch)
        half = logits(paths["bfloat16"], batch)
        assert 1e-5 < _relative(half, full) <= BOUND
        # The buckets cut padding only: the fixed-length bfloat16 export's logits, up to
        # the matmuls' float32 accumulation over other shapes.
        fixed = logits(paths["bfloat16_fixed"], batch)
        assert _relative(half, fixed) <= 1e-2, _relative(half, fixed)

    there = in_tf212(tmp_path, paths["bfloat16"], texts, "logits")
    assert _relative(there["one"], logits(paths["bfloat16"], False)) <= 1e-2
    assert _relative(there["all"], logits(paths["bfloat16"], True)) <= 1e-2


# A run_classifier directory, two exports by the tool, verify, a TF 2.12.1 process: ~2 min.
@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration
def test_export_classifier_kernel_layout_out_in(tmp_path):
    """--kernel_layout=out_in from the command line: the export stores its feed-forward
    kernels [out, in] where the default stores them [in, out], verifies (the op allowlist),
    gives the default export's logits within float32 rounding on texts of every bucket,
    alone and batched, and the TF 2.12.1 + tensorflow-text 2.12.1 process runs it."""
    import tensorflow_text  # noqa: F401  (the exports hold text ops)

    from export.verify import verify

    keras.utils.set_random_seed(7)
    classifier_run(tmp_path, max_seq_length=32, steps=2)
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    paths = {}
    for layout in ("", "out_in"):
        result = subprocess.run(
            [sys.executable, "-m", "export.export_classifier", f"--model_dir={tmp_path / 'run'}",
             f"--export_dir={tmp_path / (layout or 'default')}", "--length_buckets=8,16,24",
             *([f"--kernel_layout={layout}"] if layout else [])],
            capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
        paths[layout or "in_out"] = result.stdout.strip().splitlines()[-1]
    # The feed-forward kernels ([H, I] and [I, H]) of one export are the other's transposed;
    # the square ones (Q, K, V, attention output, pooler) keep their shape, and the head's
    # kernel and the embedding tables are the same in both.
    def rectangular(path):
        reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
        return [reader.get_tensor(name) for name, shape in
                reader.get_variable_to_shape_map().items()
                if len(shape) == 2 and shape[0] != shape[1]]

    other, default = rectangular(paths["out_in"]), rectangular(paths["in_out"])
    transposed = [v for v in default if any(
        w.shape == v.T.shape and np.array_equal(w, v.T) for w in other)]
    same = [v for v in default if any(w.shape == v.shape and np.array_equal(w, v) for w in other)]
    assert len(transposed) == 2 * TINY["num_layers"] and len(same) == len(default) - len(
        transposed), (len(transposed), len(same), len(default))
    report = verify(paths["out_in"])
    assert report.ok, str(report)
    texts = texts_of(LENGTHS)

    def logits(path, batch):
        return _export_logits(path, texts, batch)

    for batch in (False, True):
        want = logits(paths["in_out"], batch)
        np.testing.assert_allclose(logits(paths["out_in"], batch), want, rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())
    there = in_tf212(tmp_path, paths["out_in"], texts, "logits")
    np.testing.assert_allclose(there["one"], logits(paths["out_in"], False), atol=1e-5)
    np.testing.assert_allclose(there["all"], logits(paths["out_in"], True), atol=1e-5)


# A run_classifier directory, two exports, an evaluation: ~2 min. A bench's figures: not in
# CI (time); make test-all runs it.
@pytest.mark.integration
@pytest.mark.slow
def test_serving_dtype_agreement_bench(tmp_path):
    """bench/serving_dtype_agreement.py (BUILD_NOTES 8.11's figures): its float32 accuracy is
    run_classifier's own evaluation of the same file (the Keras model, not an export; one
    near-tie may flip), its counts add up, the bfloat16 probabilities stay within rounding,
    and a label the run does not know is one line."""
    import json

    from bert_keras import run_classifier

    keras.utils.set_random_seed(5)
    run = classifier_run(tmp_path, max_seq_length=32, steps=4)
    eval_file = tmp_path / "eval.jsonl"
    texts = texts_of([n for n in LENGTHS if n] * 2, offset=11)  # run_classifier wants text
    with open(eval_file, "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"text": text, "label": "ab"[i % 2]}) + "\n")
    keras_eval = run_classifier.run(eval_file=str(eval_file), output_dir=str(tmp_path / "eval"),
                                    init_checkpoint=str(run / "model.keras"),
                                    vocab_file=str(run / "vocab.txt"), do_train=False,
                                    do_eval=True, max_seq_length=32)["eval"]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    command = [sys.executable, os.path.join(REPO, "bench", "serving_dtype_agreement.py"),
               f"--model_dir={run}", "--max_seq_length=32"]
    done = subprocess.run(command + [f"--eval_file={eval_file}"], capture_output=True,
                          text=True, env=env, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout[done.stdout.index("{"):])
    n = len(texts)
    assert found["examples"] == keras_eval["num_examples"] == n
    assert found["labels"] == ["a", "b"]
    assert abs(found["accuracy_float32"] - keras_eval["accuracy"]) <= 1 / n + 1e-9
    assert found["disagreements"] == round((1 - found["label_agreement"]) * n)
    assert abs(found["accuracy_bfloat16"] - found["accuracy_float32"]) <= (
        found["disagreements"] / n + 1e-9)
    assert 0 < found["median_abs_probability_difference"] <= found[
        "max_abs_probability_difference"] <= BOUND

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "x", "label": "c"}) + "\n")
    done = subprocess.run(command + [f"--eval_file={bad}"], capture_output=True, text=True,
                          env=env, timeout=900, cwd=REPO)
    assert done.returncode == 1 and done.stderr == (
        f"error: --eval_file={bad}: expected JSON lines with \"text\" and a \"label\" of "
        f"['a', 'b']; found labels ['c']\n")
