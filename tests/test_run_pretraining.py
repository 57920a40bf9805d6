"""run_pretraining: overfitting, output layout, resumption, XLA, phase 2, clear errors."""

import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py
import keras
import numpy as np
import pytest
from conftest import event_scalars, tensorboard_points
from pretraining_data import write_dataset

from bert_keras import BertEncoder, BertPretrainer
from bert_keras import checkpoints, run_pretraining
from bert_keras.config import BertConfig
from data_prep import files
from bert_keras.run_pretraining import (PretrainingError, PretrainingOptions,
                                        load_initial_weights, train, apply_initial_weights)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S, P, VOCAB = 16, 4, 99
# Sizes that all differ; no dropout, so a few dozen instances are memorized quickly.
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=37, max_position_embeddings=40, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, hidden_act="gelu", type_vocab_size=2,
              initializer_range=0.02)
# For exact resumption: dropout's random state must survive a crash too.
DROPOUT_CONFIG = dict(CONFIG, num_hidden_layers=1, hidden_dropout_prob=0.1,
                      attention_probs_dropout_prob=0.1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pretraining_run")
    train_glob = write_dataset(directory, num_files=2, per_file=16, max_seq_length=S,
                               max_predictions_per_seq=P, vocab_size=VOCAB)
    eval_glob = write_dataset(directory, num_files=1, per_file=8, max_seq_length=S,
                              max_predictions_per_seq=P, vocab_size=VOCAB, seed=9, prefix="eval")
    config = directory / "bert_config.json"
    config.write_text(json.dumps(CONFIG))
    dropout_config = directory / "dropout_config.json"
    dropout_config.write_text(json.dumps(DROPOUT_CONFIG))
    vocab = directory / "vocab.txt"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # a BERT vocabulary has them
    vocab.write_text("".join(f"{t}\n" for t in specials + [f"tok{i}" for i in range(5, VOCAB)]))
    return dict(dir=directory, train=train_glob, eval=eval_glob, config=str(config),
                dropout_config=str(dropout_config), vocab=str(vocab))


def _options(data, output_dir, **overrides):
    values = dict(input_file=data["train"], output_dir=str(output_dir),
                  bert_config_file=data["config"], vocab_file=data["vocab"],
                  max_seq_length=S, max_predictions_per_seq=P, train_batch_size=8,
                  num_train_steps=300, num_warmup_steps=30, learning_rate=1e-2,
                  save_checkpoints_steps=100, autotune=False, verbose=0, seed=3)
    values.update(overrides)
    return PretrainingOptions(**values)


def _weights(path):
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return arrays


@pytest.fixture(scope="module")
def finished_run(data, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("run") / "out"
    # 2 micro-batches per update and per tf.function call: resumption must count updates.
    options = _options(data, output_dir, eval_input_file=data["eval"], eval_batch_size=4,
                       max_eval_steps=2, gradient_accumulation_steps=2, steps_per_execution=2)
    logs = train(options)
    return options, logs


def test_overfits_a_few_dozen_instances(finished_run):
    _, logs = finished_run
    # 32 instances, 300 updates of 2 x 8 examples.
    assert logs["mlm_logits_loss"] < 0.1, logs
    assert logs["nsp_logits_loss"] < 0.05, logs
    assert logs["mlm_logits_accuracy"] > 0.98 and logs["nsp_logits_accuracy"] == 1.0


def test_output_layout_for_fine_tuning_and_export(finished_run, data):
    options, _ = finished_run
    out = options.output_dir
    assert sorted(os.listdir(os.path.join(out, "encoder"))) == [
        "bert_config.json", "encoder.weights.h5", "tokenizer_config.json", "vocab.txt"]
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == [
        "ckpt-00000100.weights.h5", "ckpt-00000200.weights.h5", "ckpt-00000300.weights.h5"]
    assert not os.path.exists(os.path.join(out, "backup"))  # Removed once complete.
    assert os.listdir(os.path.join(out, "logs", "train"))
    # The vocabulary and its settings are written when the run starts too, so a checkpoint
    # of a run not finished (no encoder/ yet) carries them: convert_checkpoint --to=hf wrote
    # such a one without a vocabulary, and the fine-tuning tools asked for --vocab_file.
    for name in ("vocab.txt", "tokenizer_config.json"):
        assert open(os.path.join(out, name)).read() == \
            open(os.path.join(out, "encoder", name)).read()
    ckpt = load_initial_weights(os.path.join(out, "checkpoints", "ckpt-00000100.weights.h5"))
    assert ckpt.vocab_file == os.path.join(out, "vocab.txt")
    assert ckpt.saved_tokenizer is not None
    history = open(os.path.join(out, "history.csv")).read().splitlines()
    assert len(history) == 4 and "val_mlm_logits_accuracy" in history[0]
    results = json.load(open(os.path.join(out, "eval_results.json")))
    assert results["global_step"] == 300 and "mlm_logits_accuracy" in results
    # Google's eval_results.txt beside it, read as its users' scripts read it: `key = value`
    # lines, keys sorted, its metric names (its run_pretraining.py's metric_fn).
    assert _googles_eval_results(os.path.join(out, "eval_results.txt"), results) == 300

    # Fine-tuning's view: config + weights rebuild the trained encoder.
    config = BertConfig.from_json_file(os.path.join(out, "encoder", "bert_config.json"))
    assert config == BertConfig.from_json_file(data["config"])
    encoder = BertEncoder.from_bert_config(config)
    encoder.load_weights(os.path.join(out, "encoder", "encoder.weights.h5"))
    pretrainer = BertPretrainer(BertEncoder.from_bert_config(config))
    pretrainer.load_weights(os.path.join(out, "pretrainer.weights.h5"))
    for a, b in zip(encoder.get_weights(), pretrainer.encoder.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The final pretrainer file holds weights only, no optimizer state.
    assert not any(name.startswith("optimizer") for name in _weights(
        os.path.join(out, "pretrainer.weights.h5")))


def _googles_eval_results(path, results) -> int | None:
    """Checks Google's eval_results.txt at `path` against eval_results.json's `results`;
    returns its global_step (None where it has none)."""
    lines = open(path, encoding="ascii").read().splitlines()
    pairs = dict(line.split(" = ") for line in lines)
    assert list(pairs) == sorted(pairs) and len(pairs) == len(lines)
    ours = {"masked_lm_accuracy": "mlm_logits_accuracy", "masked_lm_loss": "mlm_logits_loss",
            "next_sentence_accuracy": "nsp_logits_accuracy",
            "next_sentence_loss": "nsp_logits_loss", "loss": "loss"}
    assert set(pairs) - {"global_step"} == set(ours)
    for google, name in ours.items():
        np.testing.assert_allclose(float(pairs[google]), results[name], rtol=1e-6, err_msg=google)
    return int(pairs["global_step"]) if "global_step" in pairs else None


@pytest.mark.integration  # ~12 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_tensorboard_keeps_every_interval(data, tmp_path):
    """Shaped like the demo's run (600 steps in intervals of 120, evaluated after each,
    --log_steps=100), scaled down: 60 steps in intervals of 12, a point every 10 steps.
    Keras' own callback (update_freq=10) kept the epoch scalars of the last interval only
    and one evaluation point (at step 60): it records under `step % 10 == 0` of the last
    batch."""
    options = _options(data, tmp_path / "out", num_train_steps=60, num_warmup_steps=6,
                       save_checkpoints_steps=12, log_steps=10, eval_input_file=data["eval"],
                       eval_batch_size=4, max_eval_steps=2)
    train(options)
    logs = os.path.join(options.output_dir, "logs")
    train_points = event_scalars(os.path.join(logs, "train"))
    validation = event_scalars(os.path.join(logs, "validation"))
    for tag in ("epoch_loss", "epoch_mlm_logits_accuracy", "epoch_learning_rate"):
        assert train_points[tag] == [0, 1, 2, 3, 4], (tag, train_points)
    for tag in ("batch_loss", "batch_nsp_logits_accuracy", "batch_learning_rate"):
        assert train_points[tag] == [10, 20, 30, 40, 50, 60], (tag, train_points)
    assert validation["epoch_loss"] == [0, 1, 2, 3, 4], validation
    assert validation["evaluation_loss_vs_iterations"] == [12, 24, 36, 48, 60], validation


@pytest.mark.integration  # ~24 s on 2 cores: make test's time (BUILD_NOTES 8.5)
@pytest.mark.parametrize("verbose", [1, 2])
def test_the_progress_bar_counts_the_steps_each_interval_runs(data, tmp_path, capsys, verbose):
    """7 steps in intervals of 3, 2 micro-batches a step: the last interval runs 1 step.
    Keras' bar showed the epoch's 6 batches as its total and divided the time by them."""
    train(_options(data, tmp_path / "out", num_train_steps=7, num_warmup_steps=1,
                   save_checkpoints_steps=3, gradient_accumulation_steps=2,
                   verbose=verbose))
    printed = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # Keras' colours
    assert re.findall(r"Epoch (\d+)/3", printed) == ["1", "2", "3"], printed[-2000:]
    last = printed[printed.index("Epoch 3/3"):]
    assert re.findall(r"(\d+)/(\d+) ", last)[-1] == ("2", "2"), last
    assert not re.search(r"\d+/6 ", last), last


def test_never_overwrites(finished_run, data, tmp_path):
    options, _ = finished_run
    with pytest.raises(PretrainingError, match="finished run"):
        train(options)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(PretrainingError, match="not a pretraining run"):
        train(_options(data, busy))
    assert (busy / "notes.txt").read_text() == "mine"


class _SimulatedCrash(Exception):
    pass


class _CrashAfterFirstBackup(keras.callbacks.Callback):
    """Raises at the end of epoch 1, after BackupAndRestore (an earlier callback) saved it."""

    def on_epoch_end(self, epoch, logs=None):
        raise _SimulatedCrash(f"crash after epoch {epoch}")


class _CountBatches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


@pytest.mark.integration  # ~27 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_resume_neither_repeats_nor_skips_steps(finished_run, tmp_path):
    reference, _ = finished_run
    # Without the evaluations of the reference run: evaluating must not change training.
    options = dataclasses.replace(reference, output_dir=str(tmp_path / "out"),
                                  eval_input_file=None)
    with pytest.raises(_SimulatedCrash):
        train(options, extra_callbacks=[_CrashAfterFirstBackup()])
    assert os.path.exists(tmp_path / "out" / "backup" / "latest.weights.h5")
    # Rerunning with other training flags is refused, naming the difference.
    with pytest.raises(PretrainingError, match="learning_rate: 0.01 -> 0.5"):
        train(dataclasses.replace(options, learning_rate=0.5))

    counter = _CountBatches()
    train(options, extra_callbacks=[counter])
    # Updates 101..300 only: 400 micro-batches in 200 executions of 2.
    assert counter.batches == 200
    # Same data order, same weights: the crashed-and-resumed run ends where the
    # uninterrupted one ended.
    got = _weights(tmp_path / "out" / "pretrainer.weights.h5")
    want = _weights(os.path.join(reference.output_dir, "pretrainer.weights.h5"))
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


# With dropout (whose random state Keras' own BackupAndRestore loses), deterministic ops
# and a last checkpoint interval shorter than the others (25 = 10 + 10 + 5).
def _dropout_options(data, output_dir, **overrides):
    values = dict(bert_config_file=data["dropout_config"], num_train_steps=25,
                  num_warmup_steps=3, learning_rate=1e-3, save_checkpoints_steps=10,
                  deterministic=True, seed=5)
    values.update(overrides)
    return _options(data, output_dir, **values)


@pytest.fixture(scope="module")
def dropout_run(data, tmp_path_factory):
    options = _dropout_options(data, tmp_path_factory.mktemp("dropout") / "out",
                               eval_input_file=data["eval"], eval_batch_size=4, max_eval_steps=2,
                               log_steps=3)
    train(options)
    return options


def test_a_shorter_last_interval_is_checkpointed_and_evaluated(dropout_run):
    out = dropout_run.output_dir
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == [
        "ckpt-00000010.weights.h5", "ckpt-00000020.weights.h5", "ckpt-00000025.weights.h5"]
    history = open(os.path.join(out, "history.csv")).read().splitlines()
    assert len(history) == 4 and "val_loss" in history[0]
    assert json.load(open(os.path.join(out, "eval_results.json")))["global_step"] == 25


class _CrashInInterval(keras.callbacks.Callback):
    """Raises after micro-batch `batch` of epoch (checkpoint interval) `epoch`."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise _SimulatedCrash(f"crash in epoch {self.epoch} after batch {batch}")


def _assert_bit_identical(output_dir, reference_dir):
    got = _weights(os.path.join(output_dir, "pretrainer.weights.h5"))
    want = _weights(os.path.join(reference_dir, "pretrainer.weights.h5"))
    assert got.keys() == want.keys()
    worst = max(float(np.abs(got[k] - want[k]).max()) for k in want)
    assert worst == 0.0, f"resumed run differs from the uninterrupted one: max |dw| = {worst}"


@pytest.mark.integration  # ~16 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_resume_with_dropout_is_bit_identical(dropout_run, data, tmp_path):
    """Killed in the middle of the second interval: the rerun restores weights, optimizer,
    dropout random state and data position, and ends exactly where the uninterrupted run
    ended (before the dropout state was backed up: max |dw| 6.8e-3 after 60 steps). Its
    history.csv, evaluations included, is the uninterrupted run's (before, the intervals'
    evaluations walked on through the held-out data and a resumed run restarted it), and
    TensorBoard shows each step once."""
    options = dataclasses.replace(dropout_run, output_dir=str(tmp_path / "out"))
    with pytest.raises(_SimulatedCrash):
        train(options, extra_callbacks=[_CrashInInterval(epoch=1, batch=4)])
    counter = _CountBatches()
    train(options, extra_callbacks=[counter])
    assert counter.batches == 15  # Updates 11..25.
    _assert_bit_identical(options.output_dir, dropout_run.output_dir)
    with open(os.path.join(options.output_dir, "history.csv")) as f:
        resumed = f.read()
    with open(os.path.join(dropout_run.output_dir, "history.csv")) as f:
        assert resumed == f.read()
    train_logs = os.path.join(options.output_dir, "logs", "train")
    # The files hold the killed run's points of steps 12 and 15 and the resumed run's.
    assert event_scalars(train_logs)["batch_loss"] == [3, 6, 9, 12, 12, 15, 15, 18, 21, 24]
    shown = tensorboard_points(train_logs)["batch_loss"]
    assert shown == tensorboard_points(
        os.path.join(dropout_run.output_dir, "logs", "train"))["batch_loss"]
    assert [step for step, _ in shown] == [3, 6, 9, 12, 15, 18, 21, 24]


@pytest.mark.integration  # ~28 s on 2 cores: make test's time (BUILD_NOTES 8.5)
@pytest.mark.parametrize("killed", ["before", "after"])
def test_a_kill_next_to_the_backup_leaves_one_history_row_an_interval(
        killed, dropout_run, monkeypatch, tmp_path):
    """Killed at the end of the second interval just before its backup is written (the
    interval is repeated: its row, written first, is replaced) or just after (the resumed
    run goes on: the row is there; before history.csv was written after the backup, this
    interval's row was missing). history.csv is the uninterrupted run's either way."""
    from bert_keras.backup import ExactBackupAndRestore

    save = ExactBackupAndRestore._save_model

    def save_then_crash(self):
        if self._current_epoch == 2 and killed == "before":  # Keras counts epochs done
            raise _SimulatedCrash("killed before the backup of epoch 1")
        save(self)
        if self._current_epoch == 2:
            raise _SimulatedCrash("killed after the backup of epoch 1")

    options = dataclasses.replace(dropout_run, output_dir=str(tmp_path / "out"))
    with monkeypatch.context() as patched:
        patched.setattr(ExactBackupAndRestore, "_save_model", save_then_crash)
        with pytest.raises(_SimulatedCrash):
            train(options)
    counter = _CountBatches()
    train(options, extra_callbacks=[counter])
    assert counter.batches == {"before": 15, "after": 5}[killed]
    with open(os.path.join(options.output_dir, "history.csv")) as f:
        resumed = f.read()
    with open(os.path.join(dropout_run.output_dir, "history.csv")) as f:
        assert resumed == f.read()


@pytest.mark.integration  # ~12 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_train_step_compiles_with_xla(data, tmp_path):
    """jit_compile=True: the whole train step is one XLA computation at static shapes."""
    config = tmp_path / "one_layer.json"
    config.write_text(json.dumps(dict(CONFIG, num_hidden_layers=1)))
    options = _options(data, tmp_path / "out", bert_config_file=str(config), num_train_steps=2,
                       save_checkpoints_steps=1, num_warmup_steps=1, jit_compile=True)
    compiled = []

    class _JitCompile(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            compiled.append(self.model.jit_compile)

    logs = train(options, extra_callbacks=[_JitCompile()])
    # Keras turns jit_compile off (with only a warning) when it declines XLA, e.g. while
    # op determinism is on; an earlier --deterministic run in this process must not leak it.
    assert compiled == [True]
    assert np.isfinite(logs["loss"])
    assert sorted(os.listdir(tmp_path / "out" / "checkpoints")) == [
        "ckpt-00000001.weights.h5", "ckpt-00000002.weights.h5"]


def test_deterministic_is_for_its_run_only_and_excludes_jit_compile(dropout_run, data, tmp_path):
    from tensorflow.python.framework import config as tf_config

    # dropout_run trained with --deterministic in this process.
    assert dropout_run.deterministic and not tf_config.is_op_determinism_enabled()
    options = _options(data, tmp_path / "out", deterministic=True, jit_compile=True)
    with pytest.raises(PretrainingError, match="--jit_compile cannot be combined with "
                                               "--deterministic"):
        train(options)


def test_phase_two_initializes_from_a_phase_one_run(finished_run, data):
    options, _ = finished_run
    trained = BertPretrainer(BertEncoder.from_bert_config(BertConfig(**CONFIG)))
    trained.load_weights(os.path.join(options.output_dir, "pretrainer.weights.h5"))
    for source in (options.output_dir, os.path.join(options.output_dir, "encoder"),
                   os.path.join(options.output_dir, "checkpoints", "ckpt-00000300.weights.h5")):
        fresh = BertPretrainer(BertEncoder.from_bert_config(BertConfig(**CONFIG)))
        apply_initial_weights(load_initial_weights(source), fresh, source)
        for a, b in zip(fresh.encoder.get_weights(), trained.encoder.get_weights()):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(PretrainingError, match="not a recognised checkpoint"):
        load_initial_weights(str(data["dir"]))


def test_phase_two_from_a_runs_encoder_dir_warns_that_the_heads_start_afresh(
        finished_run, caplog):
    """A phase 2 given phase 1's encoder/ (what fine-tuning reads) instead of its run
    directory trains its masked-LM and next-sentence heads from their initialisation, unlike
    Google's phase 2 (its init_checkpoint holds cls/*): the masked-LM head's transform and
    bias are phase 1's in the run directory only. Before, one info line said "(encoder only)".
    """
    options, _ = finished_run
    encoder_dir = os.path.join(options.output_dir, "encoder")
    trained = BertPretrainer(BertEncoder.from_bert_config(BertConfig(**CONFIG)))
    trained.load_weights(os.path.join(options.output_dir, "pretrainer.weights.h5"))
    fresh = BertPretrainer(BertEncoder.from_bert_config(BertConfig(**CONFIG)))
    with caplog.at_level("WARNING"):
        apply_initial_weights(load_initial_weights(encoder_dir), fresh, encoder_dir)
    assert (f"--init_checkpoint {encoder_dir} holds the encoder only: the masked-LM and "
            f"next-sentence heads start from their initialisation; "
            f"--init_checkpoint={options.output_dir} loads them too") in caplog.text
    # The heads are indeed not phase 1's (the warning is true), the encoder is.
    assert not np.array_equal(fresh.masked_lm.get_weights()[0],
                              trained.masked_lm.get_weights()[0])
    for a, b in zip(fresh.encoder.get_weights(), trained.encoder.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_phase_two_longer_than_the_checkpoints_position_table_is_refused_naming_it(
        finished_run, data, tmp_path):
    """Phase-2 data of length 48 from a phase 1 whose table has 40 positions (CONFIG): refused
    before anything is written, in one line naming the flag and the checkpoint the model
    comes from. Before, it said "the model's" without saying which."""
    options, _ = finished_run
    longer = write_dataset(tmp_path, num_files=1, per_file=4, max_seq_length=48,
                           max_predictions_per_seq=P, vocab_size=VOCAB, prefix="long")
    out = tmp_path / "phase2"
    with pytest.raises(PretrainingError) as refused:
        train(_options(data, out, input_file=longer, max_seq_length=48, bert_config_file=None,
                       init_checkpoint=options.output_dir))
    message = str(refused.value)
    assert message == (f"--max_seq_length=48 exceeds max_position_embeddings=40 of the model "
                       f"from --init_checkpoint {options.output_dir}: its position table has "
                       f"no rows past 40")
    assert not out.exists() or not os.listdir(out)


def test_evaluation_only_run_gives_the_training_runs_final_metrics(finished_run, data,
                                                                   tmp_path):
    """Google's --do_train=false --do_eval evaluates a trained model: here the finished run's
    pretrainer, as a run directory, as Google's bert_model.ckpt and as --output_dir itself.
    Its metrics equal those the training run's final evaluation wrote (same data, batches
    and steps); before, --do_train=false was refused."""
    from bert_keras import checkpoints

    options, _ = finished_run
    run = options.output_dir
    expected = json.load(open(os.path.join(run, "eval_results.json")))
    evaluation = dict(eval_input_file=data["eval"], eval_batch_size=4, max_eval_steps=2,
                      do_train=False, bert_config_file=None, vocab_file=None)
    trained = BertPretrainer(BertEncoder.from_bert_config(BertConfig(**CONFIG)))
    trained.load_weights(os.path.join(run, "pretrainer.weights.h5"))
    google = str(tmp_path / "google" / "bert_model.ckpt")
    checkpoints.save_model(trained, "google", google)
    for i, model in enumerate([run, google]):
        out = tmp_path / f"eval{i}"
        results = train(_options(data, out, **dict(
            evaluation, init_checkpoint=model, bert_config_file=data["config"] if i else None)))
        written = json.load(open(out / "eval_results.json"))
        assert sorted(os.listdir(out)) == ["eval_results.json", "eval_results.txt"]
        # Google's file; its global_step the run's, which Google's checkpoint does not hold.
        assert _googles_eval_results(out / "eval_results.txt", written) == (None if i else 300)
        assert written["init_checkpoint"] == model and written["eval_steps"] == 2
        for name in ("loss", "mlm_logits_accuracy", "mlm_logits_loss", "nsp_logits_accuracy",
                     "nsp_logits_loss"):
            assert results[name] == written[name]
            np.testing.assert_allclose(results[name], expected[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{model}: {name}")
    # The masked LM alone, from the same model.
    mlm = train(_options(data, tmp_path / "mlm", **dict(
        evaluation, init_checkpoint=run, next_sentence_prediction=False)))
    assert "nsp_logits_loss" not in mlm
    np.testing.assert_allclose(mlm["mlm_logits_accuracy"], expected["mlm_logits_accuracy"],
                               rtol=1e-5)
    # The run's own --output_dir is the model where --init_checkpoint is not given; its
    # eval_results.json is not overwritten.
    with pytest.raises(files.OutputExistsError, match=r"--output_dir .* already holds "
                                                      r"eval_results.json and eval_results.txt; "
                                                      r"choose another"):
        train(_options(data, run, **evaluation))
    assert json.load(open(os.path.join(run, "eval_results.json"))) == expected
    # A model without pretraining heads has nothing to evaluate; nothing is written.
    with pytest.raises(PretrainingError, match=r"--init_checkpoint .*encoder: holds a "
                                               r"BertEncoder, not a BertPretrainer"):
        train(_options(data, tmp_path / "enc", init_checkpoint=os.path.join(run, "encoder"),
                       **evaluation))
    with pytest.raises(PretrainingError, match=r"--do_train=false evaluates a trained model: "
                                               r"give it as --init_checkpoint"):
        train(_options(data, tmp_path / "none", **evaluation))
    assert not os.path.exists(tmp_path / "enc") and not os.path.exists(tmp_path / "none")


def test_continued_pretraining_from_a_google_checkpoint(finished_run, data, tmp_path):
    """Google's users start from bert_model.ckpt: the encoder *and* the MLM/NSP heads load."""
    from bert_keras import checkpoints

    options, _ = finished_run
    trained = BertPretrainer(BertEncoder.from_bert_config(BertConfig(**CONFIG)))
    trained.load_weights(os.path.join(options.output_dir, "pretrainer.weights.h5"))
    checkpoints.save_model(trained, "google", str(tmp_path / "bert_model.ckpt"))
    fresh = BertPretrainer(BertEncoder.from_bert_config(BertConfig(**CONFIG)))
    google = str(tmp_path / "bert_model.ckpt")
    assert "pretraining heads" in apply_initial_weights(load_initial_weights(google), fresh, google)
    for a, b in zip(fresh.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    # A checkpoint of another size is refused with a message naming what differs, not a
    # Keras shape error, and before the output directory is made.
    smaller = BertConfig(**dict(CONFIG, hidden_size=16, intermediate_size=20,
                                num_attention_heads=2))
    other = BertPretrainer(BertEncoder.from_bert_config(smaller))
    checkpoints.save_model(other, "google", str(tmp_path / "small" / "bert_model.ckpt"))
    small = str(tmp_path / "small" / "bert_model.ckpt")
    with pytest.raises(PretrainingError, match=r"bert_model.ckpt: its model does not match this "
                                               r"run's model from --preset=tiny \(hidden_size 16 "
                                               r"vs 128, intermediate_size 20 vs 512, "
                                               r"max_position_embeddings 40 vs 512\); leave "
                                               r"--preset out to train the checkpoint's own "
                                               r"model$"):
        train(_options(data, tmp_path / "out", init_checkpoint=small, bert_config_file=None,
                       preset="tiny"))
    assert not os.path.exists(tmp_path / "out")
    # With --bert_config_file, a Google checkpoint is read with it, as Google's tools do.
    with pytest.raises(PretrainingError, match=r"--init_checkpoint .*bert_model.ckpt"):
        train(_options(data, tmp_path / "out", init_checkpoint=small))
    assert not os.path.exists(tmp_path / "out")


def test_continued_pretraining_from_transformers_masked_lm(data, tmp_path):
    """Most Korean and domain BERTs are published as transformers' BertForMaskedLM (no pooler,
    no NSP head). Without a config flag the run trains that model, starting from its encoder
    and masked-LM head; the pooler and NSP head keep their initialisation. Refused before:
    the config flags were required and the NSP head's absence was a shape mismatch."""
    import torch
    import transformers
    from conftest import make_inputs

    from bert_keras import checkpoints

    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM(transformers.BertConfig(**CONFIG)).eval()
    with torch.no_grad():
        for parameter in mlm.parameters():  # off the initial values (zero biases, unit norms)
            parameter.add_(torch.randn_like(parameter) * 0.05)
    hf_dir = str(tmp_path / "hf")
    mlm.save_pretrained(hf_dir)
    shutil.copy(data["vocab"], os.path.join(hf_dir, "vocab.txt"))

    initial = load_initial_weights(hf_dir)
    fresh = BertPretrainer.from_bert_config(initial.config)  # the run's model has NSP
    nsp_side = [fresh.encoder.pooler_layer, fresh.nsp_dense]
    before = [w.copy() for layer in nsp_side for w in layer.get_weights()]
    assert "masked-LM head" in apply_initial_weights(initial, fresh, hf_dir)
    for a, b in zip(before, [w for layer in nsp_side for w in layer.get_weights()]):
        np.testing.assert_array_equal(a, b)
    inputs = make_inputs(batch=2, seq=9, vocab=VOCAB)
    positions = np.array([[1, 4], [2, 8]], np.int32)
    got = fresh({**inputs, "masked_lm_positions": positions}, training=False)["mlm_logits"]
    with torch.no_grad():
        logits = mlm(input_ids=torch.tensor(inputs["input_word_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
                     token_type_ids=torch.tensor(inputs["input_type_ids"], dtype=torch.long)
                     ).logits.numpy()
    np.testing.assert_allclose(got, np.take_along_axis(logits, positions[..., None], axis=1),
                               atol=1e-4)

    out = tmp_path / "run"
    train(_options(data, out, bert_config_file=None, vocab_file=None, init_checkpoint=hf_dir,
                   next_sentence_prediction=False, num_train_steps=2, num_warmup_steps=1,
                   save_checkpoints_steps=2))
    assert (BertConfig.from_json_file(str(out / "encoder" / "bert_config.json"))
            == checkpoints.read_hf_config(hf_dir))
    # Its vocabulary travels with the encoder, as --vocab_file's would.
    assert (out / "encoder" / "vocab.txt").read_text() == open(data["vocab"]).read()


@pytest.mark.integration  # ~18 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_run_stopped_before_its_first_backup_starts_again_from_init_checkpoint(
        finished_run, data, tmp_path):
    """Killed before its first backup, a run leaves run_config.json and no backup; its rerun
    started from random weights, ignoring --init_checkpoint."""
    from bert_keras.run_pretraining import prepare_output_dir

    phase_one, _ = finished_run
    common = dict(init_checkpoint=phase_one.output_dir, num_train_steps=2, num_warmup_steps=1,
                  save_checkpoints_steps=2, deterministic=True)
    train(_options(data, tmp_path / "whole", **common))
    stopped = _options(data, tmp_path / "stopped", **common)
    prepare_output_dir(stopped, chief=True)  # what the killed run left
    train(stopped)
    whole = _weights(str(tmp_path / "whole" / "pretrainer.weights.h5"))
    rerun = _weights(str(tmp_path / "stopped" / "pretrainer.weights.h5"))
    assert whole.keys() == rerun.keys()
    for name in whole:
        np.testing.assert_array_equal(whole[name], rerun[name], err_msg=name)


@pytest.mark.integration  # ~21 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_killed_phase_two_resumes_from_phase_one_and_data_moved_elsewhere(
        finished_run, data, tmp_path):
    """The run record holds flags, and --init_checkpoint, --vocab_file, --bert_config_file and
    --input_file are paths: a phase 2 killed after a backup, rerun once phase 1's directory and
    the data had moved (another disk, another host), was refused as "a run with other flags".
    Their contents decide: the same contents resume, and end as the uninterrupted run."""
    phase_one, _ = finished_run
    common = dict(num_train_steps=4, num_warmup_steps=1, save_checkpoints_steps=2,
                  deterministic=True)
    train(_options(data, tmp_path / "whole", init_checkpoint=phase_one.output_dir, **common))
    # The interrupted run reads phase 1, the data, config and vocabulary from one place...
    first = tmp_path / "first"
    shutil.copytree(phase_one.output_dir, first / "phase1")
    shutil.copytree(data["dir"], first / "data")
    placed = lambda root: dict(  # noqa: E731
        init_checkpoint=str(root / "phase1"),
        input_file=str(root / "data" / os.path.basename(data["train"])),
        bert_config_file=str(root / "data" / "bert_config.json"),
        vocab_file=str(root / "data" / "vocab.txt"))
    killed = _options(data, tmp_path / "out", **common, **placed(first))
    with pytest.raises(_SimulatedCrash):
        train(killed, extra_callbacks=[_CrashAfterFirstBackup()])
    # ... and its rerun from another, where the first has gone.
    os.rename(first, tmp_path / "second")
    moved = _options(data, tmp_path / "out", **common, **placed(tmp_path / "second"))
    with pytest.raises(PretrainingError, match=r"init_checkpoint: '.*first/phase1' -> "):
        # Other initial weights are another run.
        train(dataclasses.replace(moved, init_checkpoint=os.path.join(
            tmp_path / "second" / "phase1", "checkpoints", "ckpt-00000100.weights.h5")))
    counter = _CountBatches()
    train(moved, extra_callbacks=[counter])
    assert counter.batches == 2  # updates 3 and 4
    record = json.loads((tmp_path / "out" / "run_config.json").read_text())
    assert record["init_checkpoint"] == str(tmp_path / "second" / "phase1")  # now read there
    whole = _weights(str(tmp_path / "whole" / "pretrainer.weights.h5"))
    resumed = _weights(str(tmp_path / "out" / "pretrainer.weights.h5"))
    assert whole.keys() == resumed.keys()
    for name in whole:
        np.testing.assert_array_equal(whole[name], resumed[name], err_msg=name)


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # three runs and a kill: ~35 s on 2 cores (the default suite's time)
def test_a_killed_phase_two_resumes_after_phase_one_was_deleted(finished_run, data, tmp_path):
    """Phase 1 deleted while phase 2 ran (its backup supersedes phase 1's weights): the rerun
    stopped at "--init_checkpoint ...: not found". It resumes with the run's own config,
    vocabulary and settings, and ends as the uninterrupted run. Without a backup to resume
    from, phase 1 is still required. The run's directory holds a glob character class
    ("out [1]"): the run's own checkpoints were looked up by a glob of that path, which
    found none there, so the rerun stopped at the missing phase 1 all the same."""
    phase_one, _ = finished_run
    common = dict(num_train_steps=4, num_warmup_steps=1, save_checkpoints_steps=2,
                  deterministic=True, bert_config_file=None, vocab_file=None)
    train(_options(data, tmp_path / "whole", init_checkpoint=phase_one.output_dir, **common))
    copy = tmp_path / "phase1"
    shutil.copytree(phase_one.output_dir, copy)
    out = tmp_path / "out [1]"
    killed = _options(data, out, init_checkpoint=str(copy), **common)
    with pytest.raises(_SimulatedCrash):
        train(killed, extra_callbacks=[_CrashAfterFirstBackup()])
    shutil.rmtree(copy)
    counter = _CountBatches()
    train(killed, extra_callbacks=[counter])
    assert counter.batches == 2  # updates 3 and 4
    whole = _weights(str(tmp_path / "whole" / "pretrainer.weights.h5"))
    resumed = _weights(str(out / "pretrainer.weights.h5"))
    assert whole.keys() == resumed.keys()
    for name in whole:
        np.testing.assert_array_equal(whole[name], resumed[name], err_msg=name)
    for name in ("vocab.txt", "tokenizer_config.json", "bert_config.json"):
        assert (out / "encoder" / name).read_text() == \
            (tmp_path / "whole" / "encoder" / name).read_text()
    # Stopped before its first backup: nothing stands in for the initial weights.
    stopped = _options(data, tmp_path / "stopped", init_checkpoint=str(copy), **common)
    with pytest.raises(PretrainingError, match=r"--init_checkpoint .*phase1"):
        train(stopped)


def test_flag_errors_are_clear(data, tmp_path):
    # Any interval works, but a tf.function call of 4 micro-batches cannot end a 2-update
    # last interval (10 = 4 + 4 + 2).
    with pytest.raises(PretrainingError, match=r"--steps_per_execution=4 must divide the 2 "
                                               r"micro-batches .*--num_train_steps=10"):
        train(_options(data, tmp_path / "a", num_train_steps=10, num_warmup_steps=1,
                       save_checkpoints_steps=4, steps_per_execution=4))
    # Keras runs whole calls of steps_per_execution batches: evaluate(steps=3) with 2 a call
    # read 4 held-out batches, so a training run's evaluations (and its eval_results.json)
    # were not what --max_eval_steps asked for, nor what an evaluation-only run of the same
    # model gives.
    with pytest.raises(PretrainingError, match=r"--steps_per_execution=2 must divide "
                                               r"--max_eval_steps=3"):
        train(_options(data, tmp_path / "a", eval_input_file=data["eval"], max_eval_steps=3,
                       steps_per_execution=2))
    assert not os.path.exists(tmp_path / "a")
    with pytest.raises(PretrainingError, match="give only one of --bert_config_file and "
                                               "--preset"):
        train(_options(data, tmp_path / "b", preset="tiny"))
    with pytest.raises(PretrainingError, match=r"give --bert_config_file or --preset \(or "
                                               r"--init_checkpoint, whose model config"):
        train(_options(data, tmp_path / "b", bert_config_file=None))
    with pytest.raises(PretrainingError, match=r"train-0.tfrecord.*max_seq_length=32"):
        train(_options(data, tmp_path / "c", max_seq_length=32))
    # An impossible size: one line naming the field and the memory, not a
    # ResourceExhaustedError traceback from initialising the embedding.
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(dict(CONFIG, vocab_size=10**9)))
    with pytest.raises(PretrainingError, match=r"huge.json: vocab_size=1000000000 makes a model "
                                               r"of .* GiB .*available; reduce vocab_size"):
        train(_options(data, tmp_path / "d", bert_config_file=str(huge), vocab_file=None))
    no_heads = tmp_path / "no_heads.json"
    no_heads.write_text(json.dumps({k: v for k, v in CONFIG.items()
                                    if k != "num_attention_heads"}))
    with pytest.raises(PretrainingError, match=r"missing key\(s\) \['num_attention_heads'\]"):
        train(_options(data, tmp_path / "e", bert_config_file=str(no_heads)))
    # The check the fine-tuning tools share (bert_keras.precision), for Python callers.
    with pytest.raises(ValueError, match=r"--mixed_precision: expected one of float32, "
                                         r"mixed_bfloat16, mixed_float16; found 'bf16'"):
        train(_options(data, tmp_path / "f", mixed_precision="bf16"))
    # The data's flag is named (the eval flag too), as create_pretraining_data names it.
    with pytest.raises(PretrainingError, match=r"^--input_file: input pattern '.*nope-\*' "
                                               r"matches no data file$"):
        train(_options(data, tmp_path / "g", input_file=str(tmp_path / "nope-*")))
    with pytest.raises(PretrainingError, match=r"^--eval_input_file: input pattern "
                                               r"'.*nope.tfrecord' matches no data file$"):
        train(_options(data, tmp_path / "h", eval_input_file=str(tmp_path / "nope.tfrecord")))
    # One segment embedding for instances of two segments: B read a zero row, no error.
    one = tmp_path / "one_segment.json"
    one.write_text(json.dumps(dict(CONFIG, type_vocab_size=1)))
    with pytest.raises(PretrainingError, match=r"one_segment.json: type_vocab_size=1, but "
                                               r"pretraining instances hold two segments"):
        train(_options(data, tmp_path / "i", bert_config_file=str(one)))
    assert not any((tmp_path / name).exists() for name in "abcdefghi")


def test_data_of_a_larger_vocabulary_than_the_model_is_refused(data, tmp_path):
    """Data made with a vocabulary of more tokens than the model's vocab_size, no
    --vocab_file given: before, TensorFlow failed in its gather with a 127-line traceback
    after writing the run's files, and JAX trained to NaN weights and exit status 0. The
    sidecar records the vocabulary's size (older sidecars: its file and checksum)."""
    from data_prep import features, files

    for name in ("train-0.tfrecord", "eval-0.tfrecord"):
        shutil.copy(data["dir"] / name, tmp_path / name)
        meta = features.read_sidecar(str(data["dir"] / name))
        (tmp_path / (name + ".meta.json")).write_text(json.dumps(dict(meta, vocab_size=VOCAB + 4)
                                                                 if name.startswith("train")
                                                                 else meta))
    with pytest.raises(PretrainingError, match=(
            rf"^--input_file: the data was made with a vocabulary of {VOCAB + 4} tokens "
            rf"\(.*train-0.tfrecord.meta.json\), more than the model's vocab_size={VOCAB} "
            rf"\(.*bert_config.json\); give the model vocab_size={VOCAB + 4}, or remake")):
        train(_options(data, tmp_path / "a", input_file=str(tmp_path / "train-0.tfrecord"),
                       vocab_file=None))
    # A sidecar from before vocab_size was recorded: the vocab_file it names, if unchanged.
    larger = tmp_path / "vocab.txt"
    larger.write_text(open(data["vocab"]).read() + "".join(f"new{i}\n" for i in range(4)))
    meta = features.read_sidecar(str(data["dir"] / "eval-0.tfrecord"))
    (tmp_path / "eval-0.tfrecord.meta.json").write_text(json.dumps(dict(
        meta, vocab_file=str(larger), vocab_sha256=files.sha256_file(str(larger)))))
    with pytest.raises(PretrainingError, match=rf"^--eval_input_file: the data was made with a "
                                               rf"vocabulary of {VOCAB + 4} tokens"):
        train(_options(data, tmp_path / "b", vocab_file=None,
                       eval_input_file=str(tmp_path / "eval-0.tfrecord")))
    larger.write_text(open(data["vocab"]).read())  # changed since: says nothing
    train(_options(data, tmp_path / "c", vocab_file=None, num_train_steps=1, num_warmup_steps=0,
                   save_checkpoints_steps=1, eval_input_file=str(tmp_path / "eval-0.tfrecord")))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_damaged_shards_are_refused_or_skipped(data, tmp_path, caplog):
    """A shard cut to 60% (an interrupted copy) used to train silently to exit 0."""
    import shutil

    for name in ("train-0.tfrecord", "train-1.tfrecord", "eval-0.tfrecord"):
        shutil.copy(data["dir"] / name, tmp_path / name)
        shutil.copy(data["dir"] / (name + ".meta.json"), tmp_path / (name + ".meta.json"))
    cut = tmp_path / "train-1.tfrecord"
    with open(cut, "r+b") as f:
        f.truncate(int(cut.stat().st_size * 0.6))
    options = _options(data, tmp_path / "out", input_file=str(tmp_path / "train-*.tfrecord"),
                       num_train_steps=1, num_warmup_steps=0, save_checkpoints_steps=1)
    with pytest.raises(PretrainingError) as e:
        train(options)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"--input_file: {cut} is damaged")
    assert "expected 16 records (its sidecar), found 9" in message
    assert "create_pretraining_data" in message and "--skip_damaged_shards" in message
    assert not (tmp_path / "out").exists()  # Refused before anything was written.

    # The same for held-out data.
    with pytest.raises(PretrainingError, match=r"^--eval_input_file: .*train-1.tfrecord is dam"):
        train(dataclasses.replace(options, input_file=str(tmp_path / "train-0.tfrecord"),
                                  eval_input_file=str(cut)))

    # Going on without it, as asked: the skipped shard is logged.
    with caplog.at_level("WARNING"):
        train(dataclasses.replace(options, skip_damaged_shards=True))
    assert f"skipping damaged data: {cut} is damaged" in caplog.text
    assert (tmp_path / "out" / "encoder").is_dir()


def test_two_shard_sets_of_one_output_prefix_are_refused(data, tmp_path):
    """create_pretraining_data run again with another --num_output_shards left the old set
    beside the new one, and the documented glob train-*.tfrecord trained on the corpus twice
    without a word. Their sidecars record the shard counts: refused in one line, naming both
    sets, before anything is written; one set named by the pattern is read as before."""
    from data_prep import features

    def shard(source, name, num_shards):
        shutil.copy(data["dir"] / source, tmp_path / name)
        meta = features.read_sidecar(str(data["dir"] / source))
        meta["shard"] = dict(meta["shard"], num_shards=num_shards)
        (tmp_path / (name + ".meta.json")).write_text(json.dumps(meta))

    shard("train-0.tfrecord", "train-00000-of-00002.tfrecord", 2)
    shard("train-1.tfrecord", "train-00001-of-00002.tfrecord", 2)
    shard("train-0.tfrecord", "train-00000-of-00001.tfrecord", 1)
    prefix = tmp_path / "train"
    options = _options(data, tmp_path / "out", input_file=str(tmp_path / "train-*.tfrecord"),
                       num_train_steps=1, num_warmup_steps=0, save_checkpoints_steps=1)
    with pytest.raises(PretrainingError) as e:
        train(options)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        f"pretraining files hold two shard sets of the output prefix {prefix}, "
        f"{prefix}-*-of-00001.tfrecord (e.g. {prefix}-00000-of-00001.tfrecord) and "
        f"{prefix}-*-of-00002.tfrecord (e.g. {prefix}-00000-of-00002.tfrecord): the corpus "
        "written twice"), message
    assert "--overwrite" in message
    with pytest.raises(PretrainingError, match=r"^pretraining files hold two shard sets"):
        train(dataclasses.replace(options, input_file=data["train"],
                                  eval_input_file=str(tmp_path / "train-*.tfrecord")))
    assert not (tmp_path / "out").exists()  # Refused before anything was written.
    train(dataclasses.replace(options, input_file=str(tmp_path / "train-*-of-00002.tfrecord")))
    assert (tmp_path / "out" / "encoder").is_dir()


@pytest.mark.timeout(300)  # The regression is a hang: fail it in minutes (about 10 s).
def test_data_without_a_record_is_refused_not_waited_on(data, tmp_path):
    """Shards holding no record (a sidecar saying 0, or none): the repeated pipeline never
    yielded a batch, so fit spun at 100% CPU forever, deaf to Ctrl-C, after writing
    run_config.json and logs/. Refused in one line before anything is written; an empty
    shard beside others is read as before."""
    import shutil

    import tensorflow as tf

    empty = tmp_path / "empty-0.tfrecord"
    with tf.io.TFRecordWriter(str(empty)):
        pass
    bare = tmp_path / "bare" / "empty-1.tfrecord"
    bare.parent.mkdir()
    shutil.copy(empty, bare)
    meta = json.loads((data["dir"] / "train-0.tfrecord.meta.json").read_text())
    meta["shard"]["instances"] = 0
    (tmp_path / "empty-0.tfrecord.meta.json").write_text(json.dumps(meta))
    options = _options(data, tmp_path / "out", input_file=str(empty), num_train_steps=1,
                       num_warmup_steps=0, save_checkpoints_steps=1)
    for given in (str(empty), str(bare)):
        with pytest.raises(PretrainingError, match=rf"^--input_file: no record in {given}; "
                                                   r"expected pretraining instances$"):
            train(dataclasses.replace(options, input_file=given))
    with pytest.raises(PretrainingError, match=r"^--eval_input_file: no record in "):
        train(dataclasses.replace(options, eval_input_file=str(empty),
                                  input_file=str(data["dir"] / "train-0.tfrecord")))
    assert not (tmp_path / "out").exists()
    train(dataclasses.replace(options, input_file=f"{empty},{data['dir'] / 'train-0.tfrecord'}"))
    assert (tmp_path / "out" / "encoder").is_dir()


def test_a_record_missing_a_feature_further_in_is_one_line(data, tmp_path):
    """The checks before training read each file's first record (no sidecar here): a later
    record without next_sentence_labels stopped training, when it was reached, with
    TensorFlow's parse error and 40 lines of stack trace, naming no flag."""
    import tensorflow as tf

    path = tmp_path / "train.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, record in enumerate(tf.data.TFRecordDataset(str(data["dir"] / "train-0.tfrecord"))):
            example = tf.train.Example.FromString(record.numpy())
            if i == 9:
                del example.features.feature["next_sentence_labels"]
            writer.write(example.SerializeToString())
    options = _options(data, tmp_path / "out", input_file=str(path), num_train_steps=4,
                       num_warmup_steps=0, save_checkpoints_steps=4)
    with pytest.raises(PretrainingError, match=r"^--input_file/--eval_input_file: a record does "
                                               r"not parse \(Feature: next_sentence_labels "
                                               r".*required but could not be found.*\); every "
                                               r"record must hold the features"):
        train(options)


def _cli(args, **kwargs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "bert_keras.run_pretraining", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, **kwargs)


def test_cli_help():
    result = _cli(["--help"], timeout=120)
    assert result.returncode == 0, result.stderr  # absl's own --help exits 1; cli.run: 0
    assert "Pretrains BERT" in result.stdout
    for flag in ("--input_file", "--init_checkpoint", "--gradient_accumulation_steps",
                 "--distribution_strategy", "--mixed_precision", "--[no]jit_compile"):
        assert flag in result.stdout


@pytest.mark.integration  # The tool in a fresh process: about 15 s on 2 cores.
def test_googles_readme_command_runs_as_written(data, tmp_path):
    """Google's run_pretraining README command (--do_train=True --do_eval=True, no held-out
    file) stopped at `--do_train: unknown flag`. It trains and evaluates on --input_file,
    as Google's tool does, saying so."""
    out = tmp_path / "pretraining_output"
    result = _cli([f"--input_file={data['train']}", f"--output_dir={out}", "--do_train=True",
                   "--do_eval=True", f"--bert_config_file={data['config']}",
                   f"--vocab_file={data['vocab']}", "--train_batch_size=8",
                   f"--max_seq_length={S}", f"--max_predictions_per_seq={P}",
                   "--num_train_steps=2", "--num_warmup_steps=1", "--learning_rate=2e-5",
                   "--save_checkpoints_steps=2", "--max_eval_steps=2",
                   "--iterations_per_loop=1000"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--do_eval without --eval_input_file: evaluating on --input_file" in result.stderr
    trained = json.loads((out / "eval_results.json").read_text())
    assert trained["global_step"] == 2
    # Google's evaluation of a trained model: --do_train=false --do_eval on --input_file.
    evaluated = tmp_path / "evaluation"
    result = _cli([f"--input_file={data['train']}", f"--output_dir={evaluated}",
                   "--do_train=false", "--do_eval=true", f"--init_checkpoint={out}",
                   "--train_batch_size=8", f"--max_seq_length={S}",
                   f"--max_predictions_per_seq={P}", "--max_eval_steps=2"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    again = json.loads((evaluated / "eval_results.json").read_text())
    for name in ("mlm_logits_accuracy", "mlm_logits_loss", "nsp_logits_loss"):
        np.testing.assert_allclose(again[name], trained[name], rtol=1e-5, err_msg=name)


def test_googles_flags_become_these_or_are_refused_naming_the_way():
    """with_googles_flags: what each of Google's run_pretraining flags becomes."""
    from bert_keras.run_pretraining import with_googles_flags

    base = dict(input_file="train-*", eval_input_file=None, distribution_strategy="default",
                tpu="", steps_per_execution=1)
    assert with_googles_flags(base, {"do_train": True, "do_eval": False}) == base
    assert with_googles_flags(base, {"do_eval": True})["eval_input_file"] == "train-*"
    held_out = dict(base, eval_input_file="eval-*")
    assert with_googles_flags(held_out, {"do_eval": True}) == held_out
    tpu = with_googles_flags(base, {"use_tpu": True, "tpu_name": "grpc://10.0.0.2:8470",
                                    "iterations_per_loop": 100, "num_tpu_cores": 8})
    assert (tpu["distribution_strategy"], tpu["tpu"], tpu["steps_per_execution"]) == \
        ("tpu", "grpc://10.0.0.2:8470", 100)
    assert with_googles_flags(base, {"iterations_per_loop": 1000}) == base  # off TPUs
    assert with_googles_flags(base, {"do_train": False, "do_eval": True}) == \
        dict(base, do_train=False)
    for given, said in [({"do_train": False}, r"--do_train=false without --do_eval: nothing"),
                        ({"do_eval": False}, None),
                        ({"tpu_zone": "us-central1-b"}, r"--tpu_zone: bert-keras resolves no "
                                                        r"Cloud TPU by name; pass --tpu=grpc"),
                        ({"use_tpu": True, "iterations_per_loop": 5}, None)]:
        if said is None:
            with_googles_flags(base, given)
            continue
        with pytest.raises(PretrainingError, match=said):
            with_googles_flags(base, given)
    with pytest.raises(PretrainingError, match=r"--do_eval=false with --eval_input_file"):
        with_googles_flags(held_out, {"do_eval": False})
    with pytest.raises(PretrainingError, match=r"--use_tpu with --distribution_strategy=mirrored"):
        with_googles_flags(dict(base, distribution_strategy="mirrored"), {"use_tpu": True})
    with pytest.raises(PretrainingError, match=r"--iterations_per_loop and --steps_per_execution"):
        with_googles_flags(dict(base, steps_per_execution=4),
                           {"use_tpu": True, "iterations_per_loop": 8})


def _start(args, log, env=None):
    """run_pretraining with `args` in a fresh process (in `env`, else this one's), its stderr
    to the file `log` (what a failure shows if the run ends before a test can kill it)."""
    env = env or dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    with open(log, "w") as stderr:  # The child keeps its own descriptor.
        return subprocess.Popen([sys.executable, "-m", "bert_keras.run_pretraining", *args],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def _kill_when(process, condition, timeout):
    """Kills `process` with SIGKILL as soon as `condition()` holds; False if it ended first
    (or the timeout passed: the process is killed then too, so no test leaves it running).
    The tests' runs take tens of milliseconds a step: the poll must be as quick."""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and process.poll() is None:
            if condition():
                process.send_signal(signal.SIGKILL)
                process.wait(30)
                return True
            time.sleep(0.02)
        return False
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.integration  # Three runs in fresh processes: about 30 s on 2 cores.
def test_kill_9_and_rerun_resumes_to_the_same_weights(data, tmp_path):
    """kill -9 during a run, rerun the same command: it resumes and ends bit-identical to a
    clean run (with dropout)."""
    def args(out):
        return [f"--input_file={data['train']}", f"--output_dir={out}",
                f"--bert_config_file={data['dropout_config']}", f"--max_seq_length={S}",
                f"--max_predictions_per_seq={P}", "--train_batch_size=8",
                "--num_train_steps=60", "--num_warmup_steps=6", "--save_checkpoints_steps=10",
                "--learning_rate=1e-3", "--deterministic", "--seed=5"]

    clean = _cli(args(tmp_path / "clean"), timeout=600)
    assert clean.returncode == 0, clean.stderr[-3000:]

    out = tmp_path / "killed"
    metadata = out / "backup" / "training_metadata.json"

    def past_two_checkpoints():
        try:
            return json.loads(metadata.read_text())["epoch"] >= 2
        except (OSError, ValueError, KeyError):
            return False

    log = tmp_path / "killed.log"
    process = _start(args(out), log)
    killed = _kill_when(process, past_two_checkpoints, timeout=600)
    assert killed, "the run ended before it could be killed:\n" + log.read_text()[-3000:]
    assert not (out / "encoder").exists()

    resumed = _cli(args(out), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from" in resumed.stderr
    _assert_bit_identical(out, tmp_path / "clean")


def _crash_evaluating(model, eval_data, steps, verbose=0):
    """In place of run_pretraining._evaluation_results: the interval's held-out evaluation
    dies after its first batch (after the interval's steps, before its checkpoint and
    backup)."""
    model.evaluate(eval_data, steps=1, verbose=0)
    raise _SimulatedCrash("crash while evaluating")


class _BackupWriteFails(keras.callbacks.Callback):
    """At the end of epoch `epoch`, the backup's weights writer (checkpoints.save_weights)
    fails once, as `fail(real_writer, model, filepath)` does (after the previous backup was
    renamed aside: the moment a kill or a full disk hurts most); other files are written."""

    def __init__(self, epoch, fail):
        super().__init__()
        self.epoch, self.fail = epoch, fail
        self.real = checkpoints.save_weights

    def on_epoch_begin(self, epoch, logs=None):
        if epoch != self.epoch:
            return

        def failing(model, filepath):
            if "latest.weights.h5" not in os.path.basename(filepath):
                return self.real(model, filepath)
            checkpoints.save_weights = self.real  # once
            self.fail(self.real, model, filepath)

        checkpoints.save_weights = failing

    def on_train_end(self, logs=None):
        checkpoints.save_weights = self.real


def _torn_write(real, model, filepath):
    """Half a file written, then the process dies."""
    real(model, filepath)
    with open(filepath, "r+b") as f:
        f.truncate(os.path.getsize(filepath) // 2)
    raise _SimulatedCrash("crash while writing the backup")


def _disk_full(real, model, filepath):
    """Part of the file out, then ENOSPC, as a full disk makes checkpoints.save_weights fail
    (OSError, no file named)."""
    with open(filepath, "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + bytes(4096))
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.integration  # ~13 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_backup_that_cannot_be_written_stops_the_run_and_the_rerun_resumes(
        dropout_run, tmp_path):
    """The disk fills while the second backup is written: the run stops with the error
    naming the backup (the boundary prints it as one line), the half-written file is gone
    and the previous backup is kept; the rerun resumes from it and ends bit-identical to an
    uninterrupted run. (With a real full disk, a tmpfs of 800 KiB: the same, by hand.)"""
    options = dataclasses.replace(dropout_run, output_dir=str(tmp_path / "out"))
    backup = tmp_path / "out" / "backup"
    with pytest.raises(files.OutputWriteError) as caught:
        train(options, extra_callbacks=[_BackupWriteFails(epoch=1, fail=_disk_full)])
    assert caught.value.filename == str(backup / "latest.weights.h5")
    assert caught.value.strerror == ("cannot be written: no space left on its device; free "
                                     "some space, or write elsewhere")
    assert sorted(os.listdir(backup)) == ["previous.weights.h5", "training_metadata.json"]
    assert not (tmp_path / "out" / "encoder").exists()
    counter = _CountBatches()
    train(options, extra_callbacks=[counter])
    assert counter.batches == 15  # from the backup at step 10
    _assert_bit_identical(options.output_dir, dropout_run.output_dir)


@pytest.mark.integration  # Six interrupted runs: 20-30 s each on 2 cores.
@pytest.mark.parametrize("num_files", [  # CI's time (BUILD_NOTES 8.5): make test-all runs 2
    1, pytest.param(2, marks=pytest.mark.slow)])
def test_kills_at_every_point_resume_bit_identically(dropout_run, data, tmp_path, num_files,
                                                    monkeypatch):
    """One run killed five times: during a step, during an evaluation, while writing the
    backup, in the shorter last interval and then with its latest backup torn on disk.
    Each rerun resumes where the surviving backup says; the end is bit-identical."""
    reference = dropout_run
    if num_files == 1:
        reference = dataclasses.replace(
            dropout_run, input_file=data["train"].replace("*", "0"),
            output_dir=str(tmp_path / "reference"))
        train(reference)
    options = dataclasses.replace(reference, output_dir=str(tmp_path / "out"))
    backup = tmp_path / "out" / "backup"

    def step_of(path):
        with h5py.File(path) as f:
            return int(f["bert_keras_resume"].attrs["step"])

    # "evaluation": the run resumed from step 10 dies evaluating its first interval.
    for crash in (_CrashInInterval(epoch=1, batch=4), "evaluation",
                  _BackupWriteFails(epoch=1, fail=_torn_write), _CrashInInterval(epoch=2, batch=2)):
        with pytest.raises(_SimulatedCrash), monkeypatch.context() as patch:
            if crash == "evaluation":
                patch.setattr(run_pretraining, "_evaluation_results", _crash_evaluating)
            train(options, extra_callbacks=[] if crash == "evaluation" else [crash])
        latest = backup / "latest.weights.h5"
        surviving = latest if latest.exists() else backup / "previous.weights.h5"
        expected = 20 if isinstance(crash, _CrashInInterval) and crash.at[0] == 2 else 10
        assert step_of(surviving) == expected, type(crash).__name__
    # The last crash left latest = step 20, previous = step 10; tear the latest.
    latest = backup / "latest.weights.h5"
    with open(latest, "r+b") as f:
        f.truncate(int(latest.stat().st_size * 0.6))
    counter = _CountBatches()
    train(options, extra_callbacks=[counter])
    assert counter.batches == 15  # From the previous backup, step 10.
    _assert_bit_identical(options.output_dir, reference.output_dir)


@pytest.mark.integration  # Runs in fresh processes: about 30 s on 2 cores.
def test_kill_9_under_mirrored_strategy_resumes_bit_identically(data, tmp_path):
    """Two replicas (MirroredStrategy on 2 logical CPUs), killed after the first backup: the
    rerun ends bit-identical. Keras' fit under a strategy trains on a second iterator of the
    dataset, so this needs a pipeline whose every iterator yields the same stream."""
    def args(out):
        return [f"--input_file={data['train']}", f"--output_dir={out}",
                f"--bert_config_file={data['dropout_config']}", f"--max_seq_length={S}",
                f"--max_predictions_per_seq={P}", "--train_batch_size=8",
                "--num_train_steps=36", "--num_warmup_steps=2", "--save_checkpoints_steps=6",
                "--learning_rate=1e-3", "--deterministic", "--seed=5",
                "--distribution_strategy=mirrored", "--num_cpu_devices=2"]

    clean = _cli(args(tmp_path / "clean"), timeout=600)
    assert clean.returncode == 0, clean.stderr[-3000:]
    out = tmp_path / "killed"
    latest = out / "backup" / "latest.weights.h5"
    log = tmp_path / "killed.log"
    process = _start(args(out), log)
    killed = _kill_when(process, latest.exists, timeout=600)
    assert killed, "the run ended before it could be killed:\n" + log.read_text()[-3000:]
    resumed = _cli(args(out), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from" in resumed.stderr
    _assert_bit_identical(out, tmp_path / "clean")


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # Runs in fresh processes: about 40 s on 2 cores.
def test_a_run_started_on_two_replicas_resumes_on_one(data, tmp_path):
    """A job moved to other hardware: started under MirroredStrategy on 2 logical CPUs,
    killed after a backup, resumed with the default strategy on one device (the flags that
    say where steps run may change, with a warning; the others may not). It continues from
    the backup's step and ends near the uninterrupted two-replica run: without dropout the
    two differ by the order of the replicas' gradient sums, which Adam amplifies to about
    2e-4 over these 36 updates at lr 1e-3 (a restart from step 0 on one device does too, so
    the step the log names is what shows that it resumed). It says once that it will not end
    as an uninterrupted run would."""
    def args(out, *where):
        return [f"--input_file={data['train']}", f"--output_dir={out}",
                f"--bert_config_file={data['config']}", f"--max_seq_length={S}",
                f"--max_predictions_per_seq={P}", "--train_batch_size=8",
                "--num_train_steps=36", "--num_warmup_steps=2", "--save_checkpoints_steps=6",
                "--learning_rate=1e-3", "--seed=5", *where]

    two = ("--distribution_strategy=mirrored", "--num_cpu_devices=2")
    clean = _cli(args(tmp_path / "clean", *two), timeout=600)
    assert clean.returncode == 0, clean.stderr[-3000:]
    out = tmp_path / "moved"
    log = tmp_path / "moved.log"
    process = _start(args(out, *two), log)
    killed = _kill_when(process, (out / "backup" / "latest.weights.h5").exists, timeout=600)
    assert killed, "the run ended before it could be killed:\n" + log.read_text()[-3000:]
    refused = _cli(args(out, "--learning_rate=1e-2"), timeout=600)
    assert refused.returncode != 0
    assert "learning_rate: 0.001 -> 0.01" in refused.stderr
    assert "distribution_strategy" not in refused.stderr.splitlines()[-1]
    resumed = _cli(args(out), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    step = re.search(r"Resuming from \S+ at step (\d+) of 36", resumed.stderr)
    assert step and int(step.group(1)) in (6, 12, 18, 24, 30), resumed.stderr[-3000:]
    assert ("on other settings than it started on (distribution_strategy: 'mirrored' -> "
            "'default', num_cpu_devices: 2 -> 1)") in resumed.stderr
    # Nor does it then claim to be "bit-identical to an uninterrupted run" (it said both).
    assert "bit-identical" not in resumed.stderr, resumed.stderr[-3000:]
    got = _weights(out / "pretrainer.weights.h5")
    want = _weights(tmp_path / "clean" / "pretrainer.weights.h5")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=2e-3, err_msg=name)


def test_runs_recorded_before_the_schedule_flags_resume_with_their_old_arithmetic(tmp_path):
    """run_config.json written before --lr_schedule/--epsilon_placement existed: that run used
    Google's schedule and Keras' epsilon, so it resumes with those and not the new defaults."""
    from bert_keras.run_pretraining import prepare_output_dir

    out = tmp_path / "old_run"
    out.mkdir()
    old = PretrainingOptions(input_file="x", output_dir=str(out), preset="tiny",
                             lr_schedule="google", epsilon_placement="keras")
    record = {k: v for k, v in old.run_identity().items()
              if k not in ("lr_schedule", "epsilon_placement")}
    (out / "run_config.json").write_text(json.dumps(record))
    assert prepare_output_dir(old, chief=True) is True  # resumes
    new_defaults = dataclasses.replace(old, lr_schedule="linear", epsilon_placement="adam_paper")
    with pytest.raises(PretrainingError, match="lr_schedule: 'google' -> 'linear'"):
        prepare_output_dir(new_defaults, chief=True)


def test_a_run_stopped_before_its_first_backup_says_it_holds_nothing_trained(tmp_path):
    """A run killed before its first backup (out of memory at its first step, say) is rerun
    with a smaller batch: still refused (its run_config.json records the other flags), but
    the error said only "rerun it with its own flags", the ones that had failed, and not
    that the directory holds nothing trained to lose. Once a backup or a checkpoint exists,
    the message is the resuming one."""
    from bert_keras.run_pretraining import prepare_output_dir

    out = tmp_path / "run"
    first = PretrainingOptions(input_file="x", output_dir=str(out), preset="tiny",
                               train_batch_size=32)
    assert prepare_output_dir(first, chief=True) is False  # what the killed run left
    smaller = dataclasses.replace(first, train_batch_size=16)
    with pytest.raises(PretrainingError, match=(
            rf"holds a run with other flags \(train_batch_size: 32 -> 16\); it stopped before "
            rf"its first backup, so it holds nothing trained: remove {re.escape(str(out))} to "
            rf"start it with these flags, or choose a new output_dir$")):
        prepare_output_dir(smaller, chief=True)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "ckpt-00000010.weights.h5").write_bytes(b"")
    with pytest.raises(PretrainingError, match=r"\(train_batch_size: 32 -> 16\); rerun it with "
                                               r"its own flags or choose a new output_dir$"):
        prepare_output_dir(smaller, chief=True)
    os.remove(out / "checkpoints" / "ckpt-00000010.weights.h5")
    (out / "backup").mkdir()
    (out / "backup" / "previous.weights.h5").write_bytes(b"")
    with pytest.raises(PretrainingError, match=r"rerun it with its own flags"):
        prepare_output_dir(smaller, chief=True)


def _sidecars_recording(data, directory, vocab_file, do_lower_case, prefix="train"):
    """Copies the `prefix` shards into `directory` with sidecars that record a tokenizer
    and `vocab_file` (path and sha256), as create_pretraining_data writes them."""
    from data_prep import features, files

    for name in sorted(os.listdir(data["dir"])):
        if name.startswith(prefix) and name.endswith(".tfrecord"):
            shutil.copy(data["dir"] / name, directory / name)
            meta = features.read_sidecar(str(data["dir"] / name))
            meta = dict(meta, vocab_file=str(vocab_file),
                        vocab_sha256=files.sha256_file(str(vocab_file)),
                        tokenizer={"do_lower_case": do_lower_case, "strip_accents": None,
                                   "tokenize_chinese_chars": True})
            (directory / (name + ".meta.json")).write_text(json.dumps(meta))
    return str(directory / f"{prefix}-*.tfrecord")


@pytest.mark.integration  # ~13 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_run_resumed_on_data_remade_in_place_is_refused(data, tmp_path):
    """A killed run whose data was remade under the same names (other tokenizer settings,
    or other shards) resumed silently: its first checkpoints and encoder/ then disagreed
    on the tokenizer. The same paths must hold what the run started on."""
    directory = tmp_path / "data"
    directory.mkdir()
    pattern = _sidecars_recording(data, directory, data["vocab"], True)
    run = _options(data, tmp_path / "out", input_file=pattern, num_train_steps=4,
                   num_warmup_steps=1, save_checkpoints_steps=2, vocab_file=None)
    with pytest.raises(_SimulatedCrash):
        train(run, extra_callbacks=[_CrashAfterFirstBackup()])
    _sidecars_recording(data, directory, data["vocab"], False)  # remade: cased, same sizes
    with pytest.raises(PretrainingError, match=r"holds a run that read other contents than "
                                               r"these: --input_file's tokenizer settings or "
                                               r"vocabulary \(its sidecars\) changed since it "
                                               r"started \(remade in place\?\)"):
        train(run)
    # A shard remade with other records (here the held-out shard under its name).
    _sidecars_recording(data, directory, data["vocab"], True)
    _sidecars_recording(data, directory, data["vocab"], True, prefix="eval")
    first = sorted(directory.glob("train-*.tfrecord"))[0]
    os.replace(directory / "eval-0.tfrecord", first)
    os.replace(directory / "eval-0.tfrecord.meta.json", str(first) + ".meta.json")
    with pytest.raises(PretrainingError, match=r"--input_file .*train-\*.tfrecord changed "
                                               r"since it started"):
        train(run)
    _sidecars_recording(data, directory, data["vocab"], True)  # as it started: resumes
    counter = _CountBatches()
    train(run, extra_callbacks=[counter])
    assert counter.batches == 2  # updates 3 and 4


def test_a_second_job_into_an_output_dir_in_use_is_refused(data, tmp_path):
    """Two jobs into one --output_dir at once would share its backup and run record; the
    directory is locked while a run uses it."""
    out = tmp_path / "out"
    options = _options(data, out, num_train_steps=2, num_warmup_steps=0,
                       save_checkpoints_steps=2)
    with files.exclusively(str(out), "--output_dir"):
        with pytest.raises(files.DirectoryInUseError, match=r"^--output_dir .*out is in use"):
            train(options)
        assert os.listdir(out) == []
    train(options)
    assert (out / "encoder").is_dir()


def test_held_out_data_of_another_vocabulary_or_casing_is_refused(data, tmp_path):
    """Training shards of two tokenizers were refused, held-out shards were not checked:
    held-out data from a cased vocabulary beside uncased training data gave an MLM
    accuracy of 0.0 and exit status 0."""
    other = tmp_path / "cased_vocab.txt"
    other.write_text(open(data["vocab"]).read().replace("tok7\n", "Tok7\n"))
    train_glob = _sidecars_recording(data, tmp_path, data["vocab"], True)
    for vocab, lower in ((other, False), (other, True), (data["vocab"], False)):
        eval_dir = tmp_path / f"eval_{os.path.basename(vocab)}_{lower}"
        eval_dir.mkdir()
        eval_glob = _sidecars_recording(data, eval_dir, vocab, lower, prefix="eval")
        with pytest.raises(PretrainingError, match=r"^--eval_input_file: the held-out data was "
                           r"made with do_lower_case=.* \(.*eval-0.tfrecord.meta.json\), the "
                           r"training data with do_lower_case=True"):
            train(_options(data, tmp_path / "out", input_file=train_glob,
                           eval_input_file=eval_glob))
    assert not (tmp_path / "out").exists()


def test_the_checkpoints_own_model_and_vocabulary_are_not_replaced_by_flags(
        finished_run, data, tmp_path, caplog):
    """A Google user passes --bert_config_file and --vocab_file with every command. With
    a run directory as --init_checkpoint, a config of other heads (or activation) was used
    without a word, the saved weights then computing another function; one of another
    position table failed with Keras' "1 objects could not be loaded"; a vocabulary of
    other tokens trained the embeddings on other ids, exit status 0."""
    options, _ = finished_run
    heads = tmp_path / "two_heads.json"
    heads.write_text(json.dumps(dict(CONFIG, num_attention_heads=2)))
    positions = tmp_path / "positions.json"
    positions.write_text(json.dumps(dict(CONFIG, max_position_embeddings=64)))
    for config, differ in ((heads, "num_attention_heads 4 vs 2"),
                           (positions, "max_position_embeddings 40 vs 64")):
        with pytest.raises(PretrainingError, match=rf"^--init_checkpoint .*out: its model does "
                           rf"not match this run's model from .*\.json \({differ}\); leave "
                           rf"--bert_config_file out to train the checkpoint's own model$"):
            train(_options(data, tmp_path / "a", bert_config_file=str(config),
                           init_checkpoint=options.output_dir))
        assert f"is not used: {options.output_dir} carries its own config" in caplog.text
    tokens = open(data["vocab"]).read().splitlines()
    tokens[7], tokens[8] = tokens[8], tokens[7]
    swapped = tmp_path / "vocab.txt"
    swapped.write_text("".join(t + "\n" for t in tokens))
    with pytest.raises(PretrainingError, match=r"^--vocab_file .*vocab.txt: not the vocabulary "
                       r"saved with .*out \(.*encoder/vocab.txt\): line 8 is 'tok8' here and "
                       r"'tok7' there \(2 tokens differ\)"):
        train(_options(data, tmp_path / "b", vocab_file=str(swapped),
                       init_checkpoint=options.output_dir))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # The same config, with other dropout rates, is used as given.
    dropout = tmp_path / "dropout.json"
    dropout.write_text(json.dumps(dict(CONFIG, hidden_dropout_prob=0.2)))
    initial = load_initial_weights(options.output_dir, str(dropout))
    assert initial.config.hidden_dropout_prob == 0.2


@pytest.mark.integration  # ~14 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_without_vocab_file_the_encoder_gets_the_vocabulary_the_data_names(data, tmp_path):
    """Google's run_pretraining takes no --vocab_file: encoder/ then had no vocab.txt and
    no tokenizer settings, so a cased model was fine-tuned on lowercased text without a
    word. The sidecars name the vocabulary and its sha256: that file is used while it is
    the same, and a changed one is not."""
    vocab = tmp_path / "vocab.txt"
    shutil.copy(data["vocab"], vocab)
    train_glob = _sidecars_recording(data, tmp_path, vocab, False)
    train(_options(data, tmp_path / "a", input_file=train_glob, vocab_file=None,
                   num_train_steps=1, num_warmup_steps=0, save_checkpoints_steps=1))
    encoder = tmp_path / "a" / "encoder"
    assert (encoder / "vocab.txt").read_text() == vocab.read_text()
    assert json.loads((encoder / "tokenizer_config.json").read_text())["do_lower_case"] is False
    vocab.write_text(vocab.read_text() + "new\n")  # changed since: not the data's
    train(_options(data, tmp_path / "b", input_file=train_glob, vocab_file=None,
                   num_train_steps=1, num_warmup_steps=0, save_checkpoints_steps=1))
    assert not (tmp_path / "b" / "encoder" / "vocab.txt").exists()


@pytest.mark.integration  # ~13 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_phase_two_data_of_a_vocabulary_extending_the_checkpoints_is_taken(
        finished_run, data, tmp_path):
    """Phase-2 data made with the phase-1 model's vocabulary edited as Google's README
    allows (here a prefix of it: the checkpoint check accepts that and [unused] tokens
    replaced), phase 2 run as Google's run_pretraining runs it, without --vocab_file: it
    was refused ("the data was made with another vocabulary ... remake the data"), where
    the same run with --vocab_file=<that vocabulary> was accepted. The data's vocabulary
    is now taken as that flag would take it; one of other tokens is still refused."""
    options, _ = finished_run
    tokens = open(os.path.join(options.output_dir, "encoder", "vocab.txt")).read().splitlines()
    shorter = tmp_path / "shorter_vocab.txt"
    shorter.write_text("".join(t + "\n" for t in tokens[:-1]))
    (tmp_path / "data").mkdir()
    train_glob = _sidecars_recording(data, tmp_path / "data", shorter, True)
    phase2 = dict(input_file=train_glob, vocab_file=None, bert_config_file=None,
                  init_checkpoint=options.output_dir, num_train_steps=1, num_warmup_steps=0,
                  save_checkpoints_steps=1)
    train(_options(data, tmp_path / "a", **phase2))
    assert (tmp_path / "a" / "encoder" / "vocab.txt").read_text() == shorter.read_text()

    # Of other tokens, or of more than the embedding table has rows: refused, naming the
    # data (a vocabulary with tokens added was said to be taken, then blamed as
    # "--vocab_file ...: the vocabulary of another model?", a flag not given).
    swapped = tmp_path / "swapped_vocab.txt"
    swapped.write_text("".join(t + "\n" for t in tokens[:7] + [tokens[8], tokens[7]]
                               + tokens[9:]))
    longer = tmp_path / "longer_vocab.txt"
    longer.write_text("".join(t + "\n" for t in tokens + ["zebra"]))
    for other, message in (
            (swapped, r"^--input_file: the data was made with another vocabulary .*; remake "
                      r"the data with create_pretraining_data --vocab_file=.* \(or, for a "
                      r"vocabulary that is the model's with \[unused\] tokens replaced, pass "
                      r"it as --vocab_file\)$"),
            (longer, rf"^--input_file: the data was made with a vocabulary of {len(tokens) + 1} "
                     rf"tokens \(.*\), more than the model's vocab_size={len(tokens)}")):
        (tmp_path / other.stem).mkdir()
        other_glob = _sidecars_recording(data, tmp_path / other.stem, other, True)
        with pytest.raises(PretrainingError, match=message):
            train(_options(data, tmp_path / "b", **dict(phase2, input_file=other_glob)))
        assert not (tmp_path / "b").exists()


def test_a_diverging_run_stops_at_a_non_finite_loss_and_saves_no_model(data, tmp_path):
    """--learning_rate=1e8: the loss turns NaN within the first steps. Before, the run
    trained every step on NaN weights, checkpointed and saved them as its encoder/."""
    out = tmp_path / "out"
    with pytest.raises(PretrainingError, match=(
            r"^training diverged: the loss is (nan|inf) at step (\d+); lower --learning_rate "
            r"\(now 1e\+08\), or look for labels or inputs out of range \(the checkpoints and "
            rf"backup written before it are kept; remove {re.escape(str(out / 'backup'))} to "
            r"train again with other flags\)$")) as info:
        train(_options(data, out, learning_rate=1e8, num_train_steps=40, num_warmup_steps=0,
                       save_checkpoints_steps=20, log_steps=2))
    step = int(re.search(r"at step (\d+)", str(info.value)).group(1))
    assert step < 20 and step % 2 == 0  # checked every --log_steps, before the first backup
    assert not (out / "encoder").exists() and not (out / "checkpoints").exists()
