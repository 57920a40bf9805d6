"""--gradient_accumulation_steps in the fine-tuning tools: k micro-batches of
--train_batch_size make one update, which trains the weights one batch of k x
--train_batch_size does (tests/test_training_parity.py proves the optimizer's arithmetic
against torch; here the tools' own counting: epochs, warmup, schedule, backups, logs).

The models have dropout 0 (encoder and head), so a micro-batch and the big batch it is part
of compute the same function; the two runs then differ by float32 rounding only (the
gradient summed in another order). Accumulation ignored, or its steps counted as updates,
changes the step count, the schedule or the weights by about the learning rate, hundreds of
times the bound.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from bert_keras import BertEncoder, model_loading, run_classifier, run_squad
from conftest import REPO, TESTDATA, backend_env, run_on_backend

VOCAB = os.path.join(TESTDATA, "ft_vocab.txt")
VOCAB_SIZE = sum(1 for _ in open(VOCAB, encoding="utf-8"))
WORDS = {"spam": ["free", "money", "now", "click", "here"],
         "ham": ["meeting", "tomorrow", "hello", "friend", "city"]}
LEARNING_RATE = 5e-3
# Float32 noise on the weights after 5-10 updates of Adam: measured 3e-7 (run_classifier)
# and 8e-6 (run_squad, an element of small gradient that Adam's normalisation amplifies) on
# TensorFlow. An update moves a weight by about the learning rate, so accumulation ignored
# (3x the updates, or micro-batch gradients) misses by about 100x the bound.
ATOL = 1e-2 * LEARNING_RATE


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("enc") / "encoder.keras")
    keras.utils.set_random_seed(11)
    BertEncoder(vocab_size=VOCAB_SIZE, num_layers=2, hidden_size=16, num_heads=2,
                intermediate_size=24, max_sequence_length=32, dropout=0.0,
                attention_dropout=0.0).save(path)
    return path


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(31):  # int(31 / 6 * 2) = 10 updates
            label = "spam" if rng.random() < 0.5 else "ham"
            words = rng.choice(WORDS[label], size=rng.integers(2, 12))
            f.write(json.dumps({"text": " ".join(words), "label": label}) + "\n")
    return str(path)


def common(out, encoder_file, **overrides):
    values = dict(vocab_file=VOCAB, do_lower_case=True, init_checkpoint=encoder_file,
                  output_dir=str(out), do_train=True, max_seq_length=13,
                  learning_rate=LEARNING_RATE, num_train_epochs=2.0, warmup_proportion=0.2,
                  seed=3, log_steps=1)
    values.update(overrides)
    return values


def trained_weights(out):
    return model_loading.load_checkpoint(str(out)).model.get_weights()


def max_difference(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def assert_same_training(accumulated, big, out_accumulated, out_big, k, batch):
    """The accumulated run counted, scheduled and trained as the big batch's."""
    for key in ("num_train_steps", "num_warmup_steps", "effective_batch_size"):
        assert accumulated[key] == big[key], key
    assert accumulated["gradient_accumulation_steps"] == k
    assert accumulated["train_batch_size"] == batch
    assert accumulated["effective_batch_size"] == k * batch
    assert big["gradient_accumulation_steps"] == 1
    # One point a step (--log_steps=1): the same updates, learning rates and losses.
    assert [h["step"] for h in accumulated["loss_history"]] == \
        [h["step"] for h in big["loss_history"]] == list(range(1, big["num_train_steps"] + 1))
    for got, want in zip(accumulated["loss_history"], big["loss_history"]):
        assert got["learning_rate"] == pytest.approx(want["learning_rate"], rel=1e-6)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6), got["step"]
    # train_results.json records them.
    for out in (out_accumulated, out_big):
        recorded = json.load(open(os.path.join(out, "train_results.json")))
        assert recorded["effective_batch_size"] == k * batch
    difference = max_difference(trained_weights(out_accumulated), trained_weights(out_big))
    assert difference <= ATOL, difference


@pytest.mark.parametrize("backend", [
    "tensorflow", pytest.param("jax", marks=pytest.mark.integration)])  # jax: a fresh pytest
def test_run_classifier_three_micro_batches_of_two_train_as_one_batch_of_six(
        backend, tmp_path, encoder_file, train_file):
    if run_on_backend(backend, __file__, "test_run_classifier_three_micro_batches_of_two_"
                                         f"train_as_one_batch_of_six[{backend}]"):
        return
    args = dict(train_file=train_file, classifier_dropout=0.0)
    accumulated = run_classifier.run(**args, **common(
        tmp_path / "k3", encoder_file, train_batch_size=2, gradient_accumulation_steps=3))
    big = run_classifier.run(**args, **common(tmp_path / "b6", encoder_file,
                                              train_batch_size=6))
    assert big["train"]["num_train_steps"] == 10  # int(31 / 6 * 2), not int(31 / 2 * 2)
    assert big["train"]["num_warmup_steps"] == 2
    assert_same_training(accumulated["train"], big["train"], tmp_path / "k3",
                         tmp_path / "b6", 3, 2)
    # The bound tests something: the weights moved by about the learning rate a step.
    initial = keras.saving.load_model(encoder_file).get_weights()
    trained = model_loading.load_checkpoint(str(tmp_path / "b6")).model.encoder.get_weights()
    assert max_difference(trained, initial) > 100 * ATOL


@pytest.mark.integration  # Two tool runs, about 11 s on 2 cores (the classifier's is the
# default tier's): run_squad adds its epochs' count of questions.
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])  # jax: a fresh pytest
def test_run_squad_two_micro_batches_of_two_train_as_one_batch_of_four(
        backend, tmp_path, encoder_file):
    """run_squad's epochs count questions (Google's): 5 questions, in 10 windows of 20
    positions, give int(5 / 4 * 4) = 5 updates of 4 windows, as 2 micro-batches of 2."""
    if run_on_backend(backend, __file__, "test_run_squad_two_micro_batches_of_two_train_as_"
                                         f"one_batch_of_four[{backend}]"):
        return
    v2 = os.path.join(TESTDATA, "ft_squad_v2.json")
    args = dict(train_file=v2, doc_stride=4, max_query_length=8, version_2_with_negative=True)
    settings = dict(max_seq_length=20, num_train_epochs=4.0)
    accumulated = run_squad.run(**args, **common(
        tmp_path / "k2", encoder_file, train_batch_size=2, gradient_accumulation_steps=2,
        **settings))
    big = run_squad.run(**args, **common(tmp_path / "b4", encoder_file, train_batch_size=4,
                                         **settings))
    assert big["train"]["num_train_steps"] == 5 and big["train"]["num_examples"] == 10
    assert_same_training(accumulated["train"], big["train"], tmp_path / "k2",
                         tmp_path / "b4", 2, 2)


@pytest.mark.integration  # Two tool processes on JAX: about 40 s on 2 cores.
def test_jax_mirrored_accumulates_the_weights_of_one_device(tmp_path, encoder_file,
                                                             train_file):
    """On JAX, --distribution_strategy=mirrored (Keras' DataParallel) accumulates, where
    tf.distribute is refused: 2 micro-batches of 4, each split over 2 CPU devices, train
    the weights one device trains on batches of 8."""
    args = [f"--train_file={train_file}", f"--init_checkpoint={encoder_file}",
            f"--vocab_file={VOCAB}", "--do_lower_case", "--do_train", "--max_seq_length=13",
            "--num_train_steps=6", f"--learning_rate={LEARNING_RATE}",
            "--classifier_dropout=0", "--seed=3"]
    weights = []
    for name, extra in (("one", ["--train_batch_size=8"]),
                        ("two", ["--train_batch_size=4", "--gradient_accumulation_steps=2",
                                 "--distribution_strategy=mirrored", "--num_cpu_devices=2"])):
        done = subprocess.run(
            [sys.executable, "-m", "bert_keras.run_classifier", *args, *extra,
             f"--output_dir={tmp_path / name}"], cwd=REPO, capture_output=True, text=True,
            timeout=900, env=backend_env("jax"))
        assert done.returncode == 0, done.stderr[-3000:]
        weights.append(trained_weights(tmp_path / name))
    assert "with 2 replica(s)" in done.stderr
    recorded = json.load(open(tmp_path / "two" / "train_results.json"))
    assert recorded["effective_batch_size"] == 8 and recorded["num_train_steps"] == 6
    difference = max_difference(*weights)
    assert difference <= ATOL, difference
