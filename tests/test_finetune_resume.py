"""Fine-tuning backs up every --save_checkpoints_steps and an interrupted run, rerun with
the same command, ends with the model an uninterrupted run gives (Google's Estimator-based
run_classifier resumed from its output_dir the same way)."""

import json
import os

import h5py
import keras
import numpy as np
import pytest

from bert_keras import BertEncoder, model_loading, run_classifier
from bert_keras.backup import RESUME_GROUP
from bert_keras.finetuning import loop, runner
from conftest import TESTDATA, event_scalars, run_on_backend, tensorboard_points
from data_prep import files
from data_prep.tokenizer_config import TokenizerConfig

VOCAB = os.path.join(TESTDATA, "ft_vocab.txt")
VOCAB_SIZE = sum(1 for _ in open(VOCAB, encoding="utf-8"))
WORDS = {"spam": ["free", "money", "now", "click", "here"],
         "ham": ["meeting", "tomorrow", "hello", "friend", "city"]}


class Interrupted(Exception):
    """Stands for a kill: raised from inside fit, after some steps."""


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("enc") / "encoder.keras")
    # Dropout on (BERT's 0.1): the resumed run must also continue the dropout masks.
    BertEncoder(vocab_size=VOCAB_SIZE, num_layers=2, hidden_size=16, num_heads=2,
                intermediate_size=24, max_sequence_length=32).save(path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(40):
            label = "spam" if rng.random() < 0.5 else "ham"
            words = rng.choice(WORDS[label], size=rng.integers(2, 12))
            f.write(json.dumps({"text": " ".join(words), "label": label}) + "\n")
    return str(path)


def flags(out, encoder_file, train_file, **overrides):
    values = dict(vocab_file=VOCAB, init_checkpoint=encoder_file, output_dir=str(out),
                  train_file=train_file, predict_file=train_file, do_train=True,
                  do_predict=True, max_seq_length=16, train_batch_size=4, eval_batch_size=40,
                  learning_rate=2e-2, num_train_steps=11, save_checkpoints_steps=4,
                  warmup_proportion=0.2, seed=3, log_steps=3)
    values.update(overrides)
    return values


def probabilities(out):
    return np.array([json.loads(line)["probabilities"]["spam"]
                     for line in open(os.path.join(out, "predictions.jsonl"))])


def weights(out):
    return model_loading.load_checkpoint(str(out)).model.get_weights()


def interrupt_at(monkeypatch, step):
    """Makes the next run stop with `Interrupted` after `step` training steps."""
    original = loop.StepLogger.on_train_batch_end

    def on_train_batch_end(self, batch, logs=None):
        original(self, batch, logs)
        if self._step == step:
            raise Interrupted(f"step {step}")

    monkeypatch.setattr(loop.StepLogger, "on_train_batch_end", on_train_batch_end)


@pytest.mark.integration  # ~19 s on 2 cores: make test's time (BUILD_NOTES 8.5)
@pytest.mark.parametrize("backend", [
    "tensorflow",  # jax: a fresh pytest; CI's time (BUILD_NOTES 8.5): make test-all runs it
    pytest.param("jax", marks=pytest.mark.slow)])
def test_an_interrupted_fine_tuning_resumes_to_the_uninterrupted_model(
        backend, tmp_path, monkeypatch, encoder_file, data):
    if run_on_backend(backend, __file__, "test_an_interrupted_fine_tuning_resumes_to_the_"
                                         f"uninterrupted_model[{backend}]"):
        return
    whole = tmp_path / "whole"
    uninterrupted = run_classifier.run(**flags(whole, encoder_file, data))["train"]
    assert "resumed_from_step" not in uninterrupted
    assert not (whole / "backup").exists()  # removed once the model is saved

    out = tmp_path / "resumed"
    with monkeypatch.context() as patch:
        interrupt_at(patch, 7)  # after the backup at step 4, before the one at step 8
        with pytest.raises(Interrupted):
            run_classifier.run(**flags(out, encoder_file, data))
    assert not (out / "model.keras").exists()
    with h5py.File(out / "backup" / "latest.weights.h5", "r") as f:
        assert f[RESUME_GROUP].attrs["step"] == 4
    resumed = run_classifier.run(**flags(out, encoder_file, data))["train"]

    assert resumed["resumed_from_step"] == 4
    # Steps 5-11 were trained again; the loss log continues at the steps the whole run had,
    # after the interval logged before the backup (kept in it: train_results.json had only
    # the resumed part), and the interval losses equal the uninterrupted run's (same
    # weights, dropout, data): 1-3 restored, 4-6 with step 4's loss kept in the backup
    # (it averaged steps 5-6 only before), 7-9, 10-11.
    assert [h["step"] for h in resumed["loss_history"]] == [3, 6, 9, 11]
    assert [h["step"] for h in uninterrupted["loss_history"]] == [3, 6, 9, 11]
    for got, want in zip(resumed["loss_history"], uninterrupted["loss_history"]):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), got["step"]
    for got, want in zip(weights(out), weights(whole)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(probabilities(out), probabilities(whole), rtol=0, atol=1e-6)
    # The bound tests something: each step moves the weights by about the learning rate
    # (Adam), thousands of times the tolerance.
    trained = model_loading.load_checkpoint(str(whole)).model.encoder.get_weights()
    initial = keras.saving.load_model(encoder_file).get_weights()
    assert max(np.abs(a - b).max() for a, b in zip(trained, initial)) > 1e-2
    assert not (out / "backup").exists()
    # TensorBoard's curve continues on the same axis: the interrupted run's points and the
    # resumed run's. Step 6, written by both, is shown once, the resumed run's (the resumed
    # run's SessionLog.START at step 5 drops the killed run's points from there on).
    assert event_scalars(out / "logs" / "train")["batch_loss"] == [3, 6, 6, 9]  # in the files
    shown = tensorboard_points(out / "logs" / "train")["batch_loss"]
    assert [step for step, _ in shown] == [3, 6, 9]
    whole_shown = dict(tensorboard_points(whole / "logs" / "train")["batch_loss"])
    assert shown[1][1] == pytest.approx(whole_shown[6], rel=1e-6)


def interrupt_within_update(monkeypatch, step):
    """Makes the next run stop with `Interrupted` in the middle of update `step` + 1: after
    its first micro-batch, the accumulated gradients not yet applied."""
    original = loop.StepLogger.on_train_batch_end

    def on_train_batch_end(self, batch, logs=None):
        original(self, batch, logs)
        if self._step == step and (batch + 1) % self.accumulation == 1:
            raise Interrupted(f"within step {step + 1}")

    monkeypatch.setattr(loop.StepLogger, "on_train_batch_end", on_train_batch_end)


@pytest.mark.integration  # Three tool runs: about 20 s on 2 cores.
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])  # jax: a fresh pytest
def test_a_run_interrupted_within_an_accumulated_update_resumes_to_the_uninterrupted_model(
        backend, tmp_path, monkeypatch, encoder_file, data):
    """--gradient_accumulation_steps=2: backups fall at update ends (every 4 updates, 8
    micro-batches), and a run killed between two micro-batches of an update resumes from
    the last backup to the uninterrupted run's weights, dropout masks included."""
    if run_on_backend(backend, __file__, "test_a_run_interrupted_within_an_accumulated_"
                                         f"update_resumes_to_the_uninterrupted_model[{backend}]"):
        return
    accumulated = dict(train_batch_size=2, gradient_accumulation_steps=2)
    whole = tmp_path / "whole"
    uninterrupted = run_classifier.run(**flags(whole, encoder_file, data, **accumulated))["train"]
    out = tmp_path / "resumed"
    with monkeypatch.context() as patch:
        interrupt_within_update(patch, 6)  # after the backup at update 4
        with pytest.raises(Interrupted):
            run_classifier.run(**flags(out, encoder_file, data, **accumulated))
    with h5py.File(out / "backup" / "latest.weights.h5", "r") as f:
        assert f[RESUME_GROUP].attrs["step"] == 4  # updates, not micro-batches
    resumed = run_classifier.run(**flags(out, encoder_file, data, **accumulated))["train"]

    assert resumed["resumed_from_step"] == 4
    assert resumed["num_train_steps"] == uninterrupted["num_train_steps"] == 11
    assert resumed["effective_batch_size"] == 4
    assert [h["step"] for h in resumed["loss_history"]] == [3, 6, 9, 11]
    for got, want in zip(resumed["loss_history"], uninterrupted["loss_history"]):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), got["step"]
        assert got["learning_rate"] == pytest.approx(want["learning_rate"], rel=1e-6)
    for got, want in zip(weights(out), weights(whole)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    trained = model_loading.load_checkpoint(str(whole)).model.encoder.get_weights()
    initial = keras.saving.load_model(encoder_file).get_weights()
    assert max(np.abs(a - b).max() for a, b in zip(trained, initial)) > 1e-2
    # TensorBoard's axis counts updates too (--log_steps=3): the killed run's points at 3
    # and 6, the resumed run's from 5 on.
    assert event_scalars(out / "logs" / "train")["batch_loss"] == [3, 6, 6, 9]
    assert [step for step, _ in tensorboard_points(out / "logs" / "train")["batch_loss"]] == \
        [3, 6, 9]


@pytest.mark.integration  # ~27 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_backup_of_other_settings_is_refused_not_resumed(tmp_path, monkeypatch,
                                                           encoder_file, data):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        interrupt_at(patch, 5)
        with pytest.raises(Interrupted):
            run_classifier.run(**flags(out, encoder_file, data))
    backup = out / "backup" / "latest.weights.h5"
    before = backup.read_bytes()
    with pytest.raises(runner.FinetuneError,
                       match=r"backup holds the backup of an interrupted run that trained "
                             r"otherwise \(--learning_rate: 0.02 -> 0.001\); rerun that run's "
                             r"command to resume it, or remove .*backup to train from step 0"):
        run_classifier.run(**flags(out, encoder_file, data, learning_rate=1e-3))
    other_data = tmp_path / "other.jsonl"
    other_data.write_text(open(data).read().replace("free", "hello", 1))
    with pytest.raises(runner.FinetuneError, match=r"training data: 40 features, CRC \w+ -> "
                                                   r"40 features, CRC \w+"):
        run_classifier.run(**flags(out, encoder_file, str(other_data)))
    # Named: the sequence length (not only the features' CRC it changes), and the epochs
    # only where no --num_train_steps replaces them.
    with pytest.raises(runner.FinetuneError, match=r"otherwise \(--max_seq_length: 16 -> 20; "
                                                   r"training data: 40 features"):
        run_classifier.run(**flags(out, encoder_file, data, max_seq_length=20))
    # Named: the tokenizer's settings as they apply (--strip_accents follows the casing), not
    # only the features' CRC they change.
    with pytest.raises(runner.FinetuneError, match=r"otherwise \(--do_lower_case: True -> "
                                                   r"False; --strip_accents: True -> False"):
        run_classifier.run(**flags(out, encoder_file, data, do_lower_case=False))
    # --overwrite_output replaces results, never a backup: refused the same way.
    with pytest.raises(runner.FinetuneError, match=r"--seed: 3 -> 4"):
        run_classifier.run(**flags(out, encoder_file, data, seed=4, overwrite_output=True))
    assert backup.read_bytes() == before
    # A backup recorded by a version that did not record the tokenizer's flags resumes.
    record = out / "backup" / runner.BACKUP_RUN_FILE
    older = json.loads(record.read_text())
    for name in ("do_lower_case", "strip_accents", "tokenize_chinese_chars"):
        del older["flags"][name]
    record.write_text(json.dumps(older))
    # The data moved to another path is the same data, and --num_train_epochs does nothing
    # beside --num_train_steps: resumed. XLA draws other dropout masks: resumed, with a
    # warning that the run will not end as an uninterrupted one.
    moved = tmp_path / "moved.jsonl"
    moved.write_text(open(data).read())
    warnings = []
    monkeypatch.setattr(runner.logging, "warning", lambda *a: warnings.append(a[0] % a[1:]))
    assert run_classifier.run(**flags(out, encoder_file, str(moved), num_train_epochs=9.0,
                                      jit_compile=True))["train"]["resumed_from_step"] == 4
    assert any("on other settings than it was trained on (--jit_compile: False -> True)" in w
               and "will not end as an uninterrupted run would" in w for w in warnings), warnings


@pytest.mark.integration  # Three tool runs: about 20 s on 2 cores.
def test_a_tagger_interrupted_within_an_accumulated_update_resumes_to_the_uninterrupted_model(
        tmp_path, monkeypatch, encoder_file):
    """run_tagger's accumulated updates weigh their tokens by the update's labelled-token
    count (`loop.weigh_labelled_tokens`): a run killed between two micro-batches resumes at
    the backup's update end with the uninterrupted run's weights, so also its counts."""
    from bert_keras import run_tagger

    train = tmp_path / "train.conll"
    rng = np.random.default_rng(1)
    with open(train, "w", encoding="utf-8") as f:
        for _ in range(19):  # 1 to 12 words a sentence: unequal micro-batches
            words = rng.choice(WORDS["spam"] + WORDS["ham"], size=rng.integers(1, 13))
            f.write("".join(f"{w} {'B-SPAM' if w in WORDS['spam'] else 'O'}\n" for w in words)
                    + "\n")
    accumulated = dict(train_batch_size=2, gradient_accumulation_steps=2)
    whole = tmp_path / "whole"
    uninterrupted = run_tagger.run(**flags(whole, encoder_file, str(train),
                                           **accumulated))["train"]
    out = tmp_path / "resumed"
    with monkeypatch.context() as patch:
        interrupt_within_update(patch, 6)  # after the backup at update 4
        with pytest.raises(Interrupted):
            run_tagger.run(**flags(out, encoder_file, str(train), **accumulated))
    resumed = run_tagger.run(**flags(out, encoder_file, str(train), **accumulated))["train"]
    assert resumed["resumed_from_step"] == 4
    for got, want in zip(resumed["loss_history"], uninterrupted["loss_history"], strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), got["step"]
    for got, want in zip(weights(out), weights(whole)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    trained = model_loading.load_checkpoint(str(whole)).model.encoder.get_weights()
    initial = keras.saving.load_model(encoder_file).get_weights()
    assert max(np.abs(a - b).max() for a, b in zip(trained, initial)) > 1e-2


@pytest.mark.integration  # ~12 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_tagger_backup_of_another_doc_stride_is_refused(tmp_path, monkeypatch, encoder_file):
    """run_tagger's --doc_stride is part of what a run trains: a backup made with another is
    refused, named, even where no training sentence is long enough for the stride to change
    the features (their CRC alike); the default (half a window: 7 at --max_seq_length=16) is
    recorded as the value it stands for, so a rerun giving that value resumes."""
    from bert_keras import run_tagger

    train = tmp_path / "train.conll"
    rng = np.random.default_rng(0)
    with open(train, "w", encoding="utf-8") as f:
        for _ in range(20):
            words = ["John", "Smith"] + [str(w) for w in rng.choice(["went", "to", "the"],
                                                                    size=rng.integers(1, 5))]
            f.write("".join(f"{w} {t}\n" for w, t in zip(words, ["B-PER", "I-PER"] + ["O"] * 4))
                    + "\n")
    out = tmp_path / "out"
    values = dict(vocab_file=VOCAB, init_checkpoint=encoder_file, output_dir=str(out),
                  train_file=str(train), do_train=True, max_seq_length=16, train_batch_size=4,
                  learning_rate=2e-2, num_train_steps=11, save_checkpoints_steps=4, seed=3)
    with monkeypatch.context() as patch:
        interrupt_at(patch, 5)
        with pytest.raises(Interrupted):
            run_tagger.run(**values)
    backup = out / "backup" / "latest.weights.h5"
    before = backup.read_bytes()
    for stride in (3, 0):
        with pytest.raises(runner.FinetuneError,
                           match=rf"backup of an interrupted run that trained otherwise "
                                 rf"\(--doc_stride: 7 -> {stride}\); rerun that run's command"):
            run_tagger.run(**values, doc_stride=stride)
    assert backup.read_bytes() == before
    assert run_tagger.run(**values, doc_stride=7)["train"]["resumed_from_step"] == 4


@pytest.mark.integration  # ~14 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_tagger_evaluated_alone_windows_at_its_fine_tuning_stride(tmp_path, encoder_file):
    """--do_eval / --do_predict without --do_train and without --doc_stride read long
    sentences at the stride the model was fine-tuned with (train_results.json), as
    --max_seq_length is taken and export_tagger takes it: the rerun's predictions are the
    run's own. Before, such a rerun windowed at half a window whatever the run used."""
    from bert_keras import run_tagger

    data = tmp_path / "long.conll"
    rng = np.random.default_rng(1)
    with open(data, "w", encoding="utf-8") as f:
        for _ in range(6):  # 14 to 30 words of one WordPiece each: 1 to 5 windows at S=16
            words = ["John", "Smith"] + [str(w) for w in rng.choice(
                ["went", "to", "the", "city", "hello"], size=rng.integers(12, 28))]
            f.write("".join(f"{w} {'B-PER' if w == 'John' else 'O'}\n" for w in words) + "\n")
    trained = tmp_path / "trained"
    values = dict(vocab_file=VOCAB, eval_file=str(data), predict_file=str(data),
                  max_seq_length=16, learning_rate=2e-2, seed=3)
    first = run_tagger.run(**values, init_checkpoint=encoder_file, output_dir=str(trained),
                           train_file=str(data), do_train=True, do_eval=True, do_predict=True,
                           train_batch_size=4, num_train_steps=6, doc_stride=3)
    assert first["eval"]["doc_stride"] == 3 and first["eval"]["split_sentences"] >= 4
    for rerun in (dict(output_dir=str(trained), overwrite_output=True),
                  dict(init_checkpoint=str(trained), output_dir=str(tmp_path / "again"))):
        again = run_tagger.run(**values, **rerun, do_eval=True, do_predict=True)
        assert again["eval"]["doc_stride"] == again["predict"]["doc_stride"] == 3
        assert again["eval"]["num_windows"] == first["eval"]["num_windows"]
        assert again["eval"]["token_accuracy"] == first["eval"]["token_accuracy"]
    assert (tmp_path / "again" / "predictions.conll").read_bytes() == \
        (trained / "predictions.conll").read_bytes()
    # A stride given on the command line still wins.
    given = run_tagger.run(**values, init_checkpoint=str(trained), do_eval=True,
                           output_dir=str(tmp_path / "given"), doc_stride=7)
    assert given["eval"]["doc_stride"] == 7


@pytest.mark.integration  # ~16 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_run_stopped_after_saving_its_model_goes_on_with_prediction(
        tmp_path, monkeypatch, encoder_file, data):
    """Killed in prediction, after model.keras was saved (and the backups removed), the same
    command was refused ("model.keras exists ... refusing to overwrite"), though Ctrl-C's
    message says to rerun it, and --overwrite_output trained again from step 0. The model is
    this command's (its recorded training equals the run's): it predicts with it."""
    whole = tmp_path / "whole"
    run_classifier.run(**flags(whole, encoder_file, data))
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        def killed(*args, **kwargs):
            raise Interrupted("in prediction")

        patch.setattr(loop, "predict", killed)
        with pytest.raises(Interrupted):
            run_classifier.run(**flags(out, encoder_file, data))
    assert (out / "model.keras").exists() and not (out / "backup").exists()
    assert not (out / "predictions.jsonl").exists()
    trained = []
    monkeypatch.setattr(loop, "train", lambda *a, **k: trained.append(1))
    # Another run's flags: still refused, naming what differs.
    with pytest.raises(runner.FinetuneError, match=r"model.keras exists, trained otherwise "
                                                   r"\(--learning_rate: 0.02 -> 0.001\); "
                                                   r"refusing to overwrite"):
        run_classifier.run(**flags(out, encoder_file, data, learning_rate=1e-3))
    result = run_classifier.run(**flags(out, encoder_file, data))
    assert not trained
    assert result["train"]["num_train_steps"] == 11
    np.testing.assert_array_equal(probabilities(out), probabilities(whole))
    # Once every result is there, the same command takes them all up and computes nothing.
    monkeypatch.setattr(loop, "predict", killed)
    again = run_classifier.run(**flags(out, encoder_file, data))
    assert again["predict"] == result["predict"] and not trained


@pytest.mark.integration  # ~17 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_run_stopped_between_evaluation_and_prediction_takes_its_evaluation_up(
        tmp_path, monkeypatch, encoder_file, data):
    """Killed after eval_results.json was written, before the predictions, the same command
    was refused ("eval_results.json exists ... refusing to overwrite"). The evaluation is
    this command's (what made it, recorded with it, is the run's): it is taken up, and the
    predictions are written as an uninterrupted run writes them."""
    with_eval = dict(do_eval=True, eval_file=data)
    whole = tmp_path / "whole"
    run_classifier.run(**flags(whole, encoder_file, data, **with_eval))
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        def killed(*args, **kwargs):
            raise Interrupted("in prediction")

        patch.setattr(run_classifier.TASK, "write_predictions", killed)
        with pytest.raises(Interrupted):
            run_classifier.run(**flags(out, encoder_file, data, **with_eval))
    evaluated = json.loads((out / "eval_results.json").read_text())
    assert evaluated["made_from"]["eval data"].startswith("40 features, CRC ")
    assert not (out / "predictions.jsonl").exists()
    # Results made with other flags are refused, naming what differs.
    with pytest.raises(runner.FinetuneError, match=r"eval_results.json exists, made otherwise "
                                                   r"\(--eval_batch_size: 40 -> 20\); "
                                                   r"refusing to overwrite"):
        run_classifier.run(**flags(out, encoder_file, data, eval_batch_size=20, **with_eval))
    monkeypatch.setattr(loop, "train", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(run_classifier.TASK, "evaluate",
                        lambda *a, **k: pytest.fail("evaluated again"))
    result = run_classifier.run(**flags(out, encoder_file, data, **with_eval))
    assert result["eval"] == evaluated
    np.testing.assert_array_equal(probabilities(out), probabilities(whole))
    # A predictions file no finished prediction of this command wrote is refused.
    (out / "predict_results.json").unlink()
    with pytest.raises(files.OutputExistsError, match=r"predictions.jsonl exists; refusing"):
        run_classifier.run(**flags(out, encoder_file, data, **with_eval))


@pytest.mark.integration  # ~17 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_run_no_longer_than_save_checkpoints_steps_writes_no_backup(
        tmp_path, monkeypatch, encoder_file, data):
    """No backup at the last step (the model is saved right after): a run of at most
    --save_checkpoints_steps steps, interrupted, trains again from step 0."""
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        interrupt_at(patch, 9)
        with pytest.raises(Interrupted):
            run_classifier.run(**flags(out, encoder_file, data, save_checkpoints_steps=11))
    assert os.listdir(out / "backup") == ["run.json"]
    result = run_classifier.run(**flags(out, encoder_file, data, save_checkpoints_steps=11))
    assert "resumed_from_step" not in result["train"]
    assert not (out / "backup").exists()
    with pytest.raises(runner.FinetuneError, match="--save_checkpoints_steps must be >= 1"):
        run_classifier.run(**flags(tmp_path / "x", encoder_file, data,
                                   save_checkpoints_steps=0))


@pytest.mark.integration  # ~16 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_fewer_processes_resume_from_process_0s_backup_more_are_refused(
        tmp_path, monkeypatch, encoder_file, data):
    """A job resumed on fewer processes takes process 0's backup (warned: other replicas),
    and the model saved, removes the backups of the processes that did not come back
    (workers/, 1.3 GB each at base size). More processes than made the backup are refused
    before training: a process without a backup of its own has nothing to resume from."""
    from types import SimpleNamespace

    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        interrupt_at(patch, 6)
        with pytest.raises(Interrupted):
            run_classifier.run(**flags(out, encoder_file, data))
    stale = out / "workers" / "process-1" / "backup"
    stale.mkdir(parents=True)
    (stale / "latest.weights.h5").write_bytes(b"a backup of process 1")
    # Process 0's record as a 2-process job would have written it.
    record = out / "backup" / "run.json"
    written = json.loads(record.read_text())
    two = dict(written, processes=2)
    two["runs on"] = dict(written["runs on"], distribution_strategy="multi_worker_mirrored",
                          replicas=2)
    record.write_text(json.dumps(two))
    warnings = []
    monkeypatch.setattr(runner.logging, "warning", lambda *a: warnings.append(a[0] % a[1:]))
    assert run_classifier.run(**flags(out, encoder_file, data))["train"][
        "resumed_from_step"] == 4
    assert any("(--distribution_strategy: 'multi_worker_mirrored' -> 'default'; replicas: "
               "2 -> 1)" in w for w in warnings), warnings
    assert not (out / "workers").exists() and not (out / "backup").exists()

    # The other way: a 1-process backup, and process 0 of a 2-process job.
    with monkeypatch.context() as patch:
        interrupt_at(patch, 6)
        with pytest.raises(Interrupted):
            run_classifier.run(**flags(tmp_path / "one", encoder_file, data))
    values = flags(tmp_path / "one", encoder_file, data)
    task = run_classifier.TASK

    def options(cls):
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})

    job = SimpleNamespace(is_chief=True, worker_name="process-0", num_processes=2,
                          num_replicas_in_sync=2)
    model = SimpleNamespace(encoder=model_loading.load_checkpoint(encoder_file).model)
    with pytest.raises(runner.FinetuneError, match=r"holds the backup of a run of 1 process"
                                                   r"\(es\), and a run of 2 resumes from a "
                                                   r"backup in every process; resume it with 1"):
        common = options(runner.FinetuneOptions)
        runner._backup_dir(common, job, runner._training_identity(
            task, common, options(task.options_class()), model, ["ham", "spam"],
            runner.Features(arrays={"x": np.zeros((3, 2), np.int32)}), job, TokenizerConfig()))


@pytest.mark.parametrize("tool", ["run_classifier", "run_pretraining"])
def test_ctrl_c_says_how_to_resume(tool, tmp_path, monkeypatch):
    """The trainers' Ctrl-C line says the rerun resumes (the other tools' says only
    "interrupted": they leave no partial output and have nothing to resume)."""
    from cli_harness import run_tool

    from bert_keras import run_pretraining

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.delenv("BERT_KERAS_DEBUG", raising=False)
    monkeypatch.setattr(runner, "run", interrupted)
    monkeypatch.setattr(run_pretraining, "train", interrupted)
    argv = {"run_classifier": ["--do_train", "--train_file=t.jsonl"],
            "run_pretraining": ["--input_file=x.tfrecord"]}[tool]
    result = run_tool(tool, [*argv, f"--output_dir={tmp_path / 'out'}"])
    assert result.code == 130, result.stderr
    assert result.error_lines == [{
        "run_classifier": "error: interrupted (Ctrl-C); rerun the same command to resume "
                          "(from the newest backup, where one was written)",
        "run_pretraining": "error: interrupted (Ctrl-C); rerun the same command to resume "
                           "from the newest backup"}[tool]], result.stderr


def test_a_backup_directory_this_tool_did_not_write_is_refused(tmp_path, encoder_file, data):
    """A backup beside an unreadable record, or a file where the backup directory goes:
    one line each, before training, and nothing touched."""
    out = tmp_path / "out"
    (out / "backup").mkdir(parents=True)
    (out / "backup" / "latest.weights.h5").write_bytes(b"weights of unknown origin")
    (out / "backup" / "run.json").write_text("{not json")
    with pytest.raises(runner.FinetuneError, match=r"backup holds a backup without a readable "
                                                   r"run.json \(.*\): not one this tool wrote"):
        run_classifier.run(**flags(out, encoder_file, data))
    assert (out / "backup" / "run.json").read_text() == "{not json"
    other = tmp_path / "other"
    other.mkdir()
    (other / "backup").write_text("a file")
    with pytest.raises(runner.FinetuneError, match=r"backup is a file; expected the directory "
                                                   r"of training backups"):
        run_classifier.run(**flags(other, encoder_file, data))


def test_loop_refuses_a_backup_between_interval_ends(tmp_path, monkeypatch):
    """finetuning.loop.train used as a library: a backup at step 4 resumed with intervals of
    3 cannot resume at an interval's end (the tools refuse the changed flag before)."""
    from bert_keras.backup import BackupError

    from test_finetune_loop import plain_model

    model, x, y = plain_model(monkeypatch)
    backup_dir = str(tmp_path / "backup")
    with monkeypatch.context() as patch:
        interrupt_at(patch, 6)
        with pytest.raises(Interrupted):
            loop.train(model, x, y, 4, 1.0, 1e-3, 0.0, num_train_steps=10,
                       backup_dir=backup_dir, save_checkpoints_steps=4)
    with pytest.raises(BackupError, match=r"backup is at step 4, not at the end of an interval "
                                          r"of 3 of this run's 10 steps; remove .*backup to "
                                          r"train from step 0"):
        loop.train(model, x, y, 4, 1.0, 1e-3, 0.0, num_train_steps=10, backup_dir=backup_dir,
                   save_checkpoints_steps=3)


@pytest.mark.integration  # Two runs in fresh processes, one per backend: about 40 s.
def test_a_randomly_initialised_run_is_taken_up_on_the_other_backend(data, tmp_path):
    """A run from random weights (--bert_config_file, no checkpoint), rerun with the same
    command on the other Keras backend, was refused as "trained otherwise": its identity
    held the CRC of the initial weights, which each backend draws with its own generator.
    The config and --seed say what they are: the finished model is taken up (nothing is
    rewritten), as for a run started from a checkpoint."""
    import subprocess
    import sys

    from conftest import REPO, backend_env

    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(dict(
        vocab_size=VOCAB_SIZE, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=32, type_vocab_size=2,
        hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        initializer_range=0.02)))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bert_keras.run_classifier", f"--vocab_file={VOCAB}",
               f"--bert_config_file={config}", f"--train_file={data}", "--do_train",
               f"--output_dir={out}", "--max_seq_length=16", "--train_batch_size=4",
               "--num_train_steps=4", "--save_checkpoints_steps=2"]
    stamps = None
    for backend in ("tensorflow", "jax"):
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600,
                              env=backend_env(backend))
        assert done.returncode == 0, f"{backend}: {done.stderr[-3000:]}"
        if stamps is None:
            stamps = {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)
                      if os.path.isfile(out / n)}
    assert {n: os.stat(out / n).st_mtime_ns for n in stamps} == stamps
