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

from bert_keras import BertEncoder, model_loading, run_classifier, run_squad, run_tagger
from bert_keras.finetuning import loop
from bert_keras.optimization import create_optimizer
from bert_keras.tasks import IGNORE_LABEL, BertTagger, copy_of
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


@pytest.fixture(scope="module")
def tagger_file(tmp_path_factory):
    """23 sentences of 1 to 11 words, so micro-batches of 2 hold from 2 to 22 labelled
    tokens (the first WordPiece of each word; every test word is one WordPiece)."""
    rng = np.random.default_rng(8)
    path = tmp_path_factory.mktemp("tagger") / "train.conll"
    with open(path, "w", encoding="utf-8") as f:
        for length in rng.permutation([1, 1, 2, 11, 11, 10, 3, 1, 9, 2, 11, 1, 4, 10, 1, 8,
                                       11, 2, 1, 6, 11, 1, 5]):
            words = rng.choice(WORDS["spam"] + WORDS["ham"], size=length)
            f.write("".join(f"{w} {'SPAM' if w in WORDS['spam'] else 'HAM'}\n"
                            for w in words) + "\n")
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


@pytest.mark.integration  # ~19 s on 2 cores: make test's time (BUILD_NOTES 8.5)
@pytest.mark.parametrize("backend", [
    "tensorflow",  # jax: a fresh pytest; CI's time (BUILD_NOTES 8.5): make test-all runs it
    pytest.param("jax", marks=pytest.mark.slow)])
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


@pytest.mark.integration  # ~18 s on 2 cores: make test's time (BUILD_NOTES 8.5)
@pytest.mark.parametrize("backend", [
    "tensorflow",  # jax: a fresh pytest; CI's time (BUILD_NOTES 8.5): make test-all runs it
    pytest.param("jax", marks=pytest.mark.slow)])
def test_run_tagger_three_micro_batches_of_unequal_token_counts_train_as_one_batch_of_six(
        backend, tmp_path, encoder_file, tagger_file):
    """run_tagger's loss is the mean over the labelled tokens of a batch. Its micro-batches
    hold from 2 to 22 of them here, so the mean of their token means (what Keras'
    accumulation alone computes, and transformers' Trainer before 4.46) is not the update's
    token mean; the input pipeline weighs each token by k / N, N the update's labelled
    tokens. 23 sentences, 7 updates of 6: neither 2 nor 6 divides 23, so updates 4 and 8
    span two passes over the data (no short last update: the data repeats, as the big
    batch's does)."""
    if run_on_backend(backend, __file__, "test_run_tagger_three_micro_batches_of_unequal_"
                                         f"token_counts_train_as_one_batch_of_six[{backend}]"):
        return
    args = dict(train_file=tagger_file, tagger_dropout=0.0)
    accumulated = run_tagger.run(**args, **common(
        tmp_path / "k3", encoder_file, train_batch_size=2, gradient_accumulation_steps=3))
    big = run_tagger.run(**args, **common(tmp_path / "b6", encoder_file, train_batch_size=6))
    assert big["train"]["num_train_steps"] == 7  # int(23 / 6 * 2)
    # Each update's logged loss is its token mean: the big batch's loss (rel 1e-5).
    assert_same_training(accumulated["train"], big["train"], tmp_path / "k3",
                         tmp_path / "b6", 3, 2)
    initial = keras.saving.load_model(encoder_file).get_weights()
    trained = model_loading.load_checkpoint(str(tmp_path / "b6")).model.encoder.get_weights()
    assert max_difference(trained, initial) > 100 * ATOL


@pytest.mark.integration  # Two tool runs, about 11 s on 2 cores (the classifier's is the
# default tier's): run_squad adds its epochs' count of questions.
@pytest.mark.parametrize("backend", [  # jax: a fresh pytest
    "tensorflow", pytest.param("jax", marks=pytest.mark.slow)])  # CI's time: BUILD_NOTES 8.5
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


@pytest.mark.integration  # Two tool processes on JAX: about 40 s on 2 cores a tool.
@pytest.mark.parametrize("tool,data,dropout", [
    ("run_classifier", "train_file", "--classifier_dropout=0"),
    ("run_tagger", "tagger_file", "--tagger_dropout=0")])
def test_jax_mirrored_accumulates_the_weights_of_one_device(tmp_path, encoder_file, tool,
                                                             data, dropout, request):
    """On JAX, --distribution_strategy=mirrored (Keras' DataParallel) accumulates, where
    tf.distribute is refused: 2 micro-batches of 4, each split over 2 CPU devices, train
    the weights one device trains on batches of 8. The tagger's micro-batches hold unequal
    numbers of labelled tokens (each update's token mean is taken over both devices and
    both micro-batches)."""
    args = [f"--train_file={request.getfixturevalue(data)}",
            f"--init_checkpoint={encoder_file}", f"--vocab_file={VOCAB}", "--do_lower_case",
            "--do_train", "--max_seq_length=13", "--num_train_steps=6",
            f"--learning_rate={LEARNING_RATE}", dropout, "--seed=3"]
    weights = []
    for name, extra in (("one", ["--train_batch_size=8"]),
                        ("two", ["--train_batch_size=4", "--gradient_accumulation_steps=2",
                                 "--distribution_strategy=mirrored", "--num_cpu_devices=2"])):
        done = subprocess.run(
            [sys.executable, "-m", f"bert_keras.{tool}", *args, *extra,
             f"--output_dir={tmp_path / name}"], cwd=REPO, capture_output=True, text=True,
            timeout=900, env=backend_env("jax"))
        assert done.returncode == 0, done.stderr[-3000:]
        weights.append(trained_weights(tmp_path / name))
    assert "with 2 replica(s)" in done.stderr
    recorded = json.load(open(tmp_path / "two" / "train_results.json"))
    assert recorded["effective_batch_size"] == 8 and recorded["num_train_steps"] == 6
    difference = max_difference(*weights)
    assert difference <= ATOL, difference


def labelled_rows(counts, seq_length):
    """Label rows int32 [len(counts), seq_length]: row i labels its first counts[i] tokens
    after [CLS] (classes 0-2), the rest -1."""
    rng = np.random.default_rng(2)
    labels = np.full((len(counts), seq_length), IGNORE_LABEL, np.int32)
    for row, count in enumerate(counts):
        labels[row, 1:1 + count] = rng.integers(0, 3, count)
    return labels


def test_each_update_weighs_its_tokens_k_over_the_update_s_labelled_tokens():
    """Micro-batches of 2 rows, k = 3, 7 rows repeating: update 1 is rows 0-5, update 2
    rows 6, 0-4, update 3 rows 5, 6, 0-3 (the stream runs on across passes: no short last
    update). Every token of an update weighs 3 / its labelled tokens (counted here by
    hand), the labels and inputs pass unchanged, and an update with none weighs finitely."""
    counts = [1, 3, 0, 2, 4, 1, 2]
    labels = labelled_rows(counts, 6)
    x = {"input_word_ids": np.arange(7 * 6, dtype=np.int32).reshape(7, 6)}
    stream = loop.weigh_labelled_tokens(loop.make_dataset(
        x, {"logits": labels}, 2, repeat=True, drop_remainder=True), 3)
    rows = [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3]  # 9 micro-batches
    labelled = [11, 12, 9]  # 1+3+0+2+4+1, 2+1+3+0+2+4, 1+2+1+3+0+2
    for i, (got_x, got_y, weights) in enumerate(stream.take(9).as_numpy_iterator()):
        batch = rows[2 * i:2 * i + 2]
        np.testing.assert_array_equal(got_x["input_word_ids"], x["input_word_ids"][batch])
        np.testing.assert_array_equal(got_y["logits"], labels[batch])
        assert weights["logits"].shape == (2, 6) and weights["logits"].dtype == np.float32
        np.testing.assert_allclose(weights["logits"], 3 / labelled[i // 3], rtol=1e-7)
    unlabelled = loop.weigh_labelled_tokens(loop.make_dataset(
        x, {"logits": np.full((7, 6), IGNORE_LABEL, np.int32)}, 2, repeat=True,
        drop_remainder=True), 3)
    for _, _, weights in unlabelled.take(3).as_numpy_iterator():
        assert np.isfinite(weights["logits"]).all()


def test_without_accumulation_the_tagger_trains_on_keras_token_mean_bit_for_bit():
    """k = 1 is the tagger's training before accumulation was weighed: Keras' masked
    token mean of each batch, no sample weights. `loop.train` against a plain fit with
    that loss and the same optimizer and batches: the same weights to the last bit."""
    keras.utils.set_random_seed(4)
    model = BertTagger(BertEncoder(
        vocab_size=VOCAB_SIZE, num_layers=2, hidden_size=16, num_heads=2,
        intermediate_size=24, max_sequence_length=16, dropout=0.0, attention_dropout=0.0),
        3, dropout=0.0)
    reference = copy_of(model)
    initial = model.get_weights()
    counts = [1, 7, 2, 9, 3, 11, 1, 4, 12, 5, 2]
    rng = np.random.default_rng(6)
    mask = (np.arange(14) < np.array(counts)[:, None] + 2).astype(np.int32)
    x = {"input_word_ids": rng.integers(1, VOCAB_SIZE, (11, 14)).astype(np.int32) * mask,
         "input_mask": mask, "input_type_ids": np.zeros((11, 14), np.int32)}
    y = {"logits": labelled_rows(counts, 14)}
    summary = loop.train(model, x, y, batch_size=3, num_train_epochs=2.0,
                         learning_rate=LEARNING_RATE, warmup_proportion=0.2, seed=3)
    steps = summary["num_train_steps"]
    assert steps == 7  # int(11 / 3 * 2)
    reference.compile(optimizer=create_optimizer(LEARNING_RATE, steps, int(steps * 0.2)),
                      loss={"logits": keras.losses.SparseCategoricalCrossentropy(
                          from_logits=True, ignore_class=IGNORE_LABEL)})
    reference.fit(loop.make_dataset(x, y, 3, shuffle=True, seed=3, repeat=True,
                                    drop_remainder=True).take(steps),
                  epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert max_difference(model.get_weights(), initial) > 100 * ATOL  # it trained
