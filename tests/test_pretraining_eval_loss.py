"""run_pretraining's evaluations report Google's masked_lm_loss: the weighted mean of the
per-prediction cross-entropy over every real prediction evaluated (google-research/bert
run_pretraining.py: `tf.metrics.mean(masked_lm_example_loss, weights=masked_lm_weights)`),
recomputed here in NumPy from the model's own MLM logits. Before, eval_results.json held
Keras' mean of the batches' losses (and the MLM-only pretrainer no masked-LM loss at all).

The held-out set tells the two apart: its first batch holds 1 real prediction a row, the
others P. A model initialised at a large `initializer_range` gives cross-entropies spread
over several nats, so the two means differ by far more than float32 rounding.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import backend_env, event_values
from multiprocess import describe, free_ports, jax_process_flags, run_job
from pretraining_data import make_instances, write_dataset, write_records

from bert_keras import BertEncoder, BertPretrainer
from bert_keras.config import BertConfig
from bert_keras.run_pretraining import PretrainingOptions, train
from data_prep import features

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Sizes that all differ: sequence 16, predictions 4, vocabulary 99, eval batch 4 of 16 rows.
S, P, VOCAB, EVAL_BATCH, EVAL_ROWS = 16, 4, 99, 4, 16
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=37, max_position_embeddings=40, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, hidden_act="gelu", type_vocab_size=2,
              initializer_range=0.5)
# float32 sums over 52 predictions against float64: well within this.
RTOL = 2e-5


def _skewed_instances():
    """16 held-out rows: the first EVAL_BATCH with 1 real prediction each, the rest with P."""
    instances = make_instances(EVAL_ROWS, S, P, VOCAB, seed=21)
    rng = np.random.default_rng(22)
    ids, mask = instances[features.INPUT_IDS], instances[features.INPUT_MASK]
    positions, labels = instances[features.MASKED_LM_POSITIONS], instances[features.MASKED_LM_IDS]
    weights = instances[features.MASKED_LM_WEIGHTS]
    for i in range(EVAL_ROWS):
        real = weights[i] > 0
        ids[i, positions[i, real]] = labels[i, real]  # unmasked: the original tokens back
        length = int(mask[i].sum())
        candidates = [j for j in range(1, length - 1) if ids[i, j] != 2]  # not [CLS]/[SEP]
        count = 1 if i < EVAL_BATCH else P
        chosen = np.sort(rng.choice(candidates, size=count, replace=False))
        positions[i], labels[i], weights[i] = 0, 0, 0.0
        positions[i, :count], labels[i, :count], weights[i, :count] = chosen, ids[i, chosen], 1.0
        ids[i, chosen] = 3  # The "[MASK]" id of these tests.
    return instances


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("eval_loss")
    train_glob = write_dataset(directory, num_files=1, per_file=16, max_seq_length=S,
                               max_predictions_per_seq=P, vocab_size=VOCAB)
    instances = _skewed_instances()
    meta = {"max_seq_length": S, "max_predictions_per_seq": P,
            "shard": {"index": 0, "num_shards": 1, "instances": EVAL_ROWS}}
    eval_file = write_records(directory / "eval-0.tfrecord", instances, meta)
    config = directory / "bert_config.json"
    config.write_text(json.dumps(CONFIG))
    vocab = directory / "vocab.txt"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab.write_text("".join(f"{t}\n" for t in specials + [f"tok{i}" for i in range(5, VOCAB)]))
    return dict(train=train_glob, eval=eval_file, config=str(config), vocab=str(vocab),
                instances=instances)


def _flags(data, output_dir, **overrides):
    """A 2-step run on `data` evaluated on the skewed set: all of it, once, in 4 batches."""
    values = dict(input_file=data["train"], eval_input_file=data["eval"],
                  output_dir=str(output_dir), bert_config_file=data["config"],
                  vocab_file=data["vocab"], max_seq_length=S, max_predictions_per_seq=P,
                  train_batch_size=8, eval_batch_size=EVAL_BATCH,
                  max_eval_steps=EVAL_ROWS // EVAL_BATCH, num_train_steps=2,
                  num_warmup_steps=1, save_checkpoints_steps=2, learning_rate=1e-3, seed=3)
    values.update(overrides)
    return values


def _train(flags):
    """run_pretraining in this process, quietly."""
    return train(PretrainingOptions(**flags, autotune=False, verbose=0))


def _evaluation_only(data, model_dir, output_dir, **overrides):
    return _flags(data, output_dir, do_train=False, init_checkpoint=str(model_dir),
                  bert_config_file=None, vocab_file=None, **overrides)


def _google_and_batch_means(data, model_dir, weights_file="pretrainer.weights.h5",
                            batches=EVAL_ROWS // EVAL_BATCH):
    """(Google's masked_lm_loss, Keras' mean of the batches' losses) of the first `batches`
    batches of the skewed set, in NumPy (float64) from the MLM logits of the pretrainer
    weights `model_dir`/`weights_file`."""
    pretrainer = BertPretrainer(BertEncoder.from_bert_config(BertConfig(**CONFIG)))
    pretrainer.load_weights(os.path.join(model_dir, weights_file))
    rows = batches * EVAL_BATCH
    instances = {k: v[:rows] for k, v in data["instances"].items()}
    inputs = {"input_word_ids": instances[features.INPUT_IDS],
              "input_mask": instances[features.INPUT_MASK],
              "input_type_ids": instances[features.SEGMENT_IDS],
              "masked_lm_positions": instances[features.MASKED_LM_POSITIONS]}
    inputs = {k: v.astype(np.int32) for k, v in inputs.items()}
    logits = pretrainer.predict(inputs, batch_size=rows, verbose=0)["mlm_logits"]
    logits = logits.astype(np.float64)  # [N, P, V]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    labels = instances[features.MASKED_LM_IDS]
    cross_entropy = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # [N, P]
    weights = instances[features.MASKED_LM_WEIGHTS].astype(np.float64)
    google = (weights * cross_entropy).sum() / weights.sum()
    batch_mean = np.mean([(weights[b] * cross_entropy[b]).sum() / (weights[b].sum() + 1e-5)
                          for b in (slice(i, i + EVAL_BATCH) for i in range(0, rows, EVAL_BATCH))])
    # The data must tell the two apart, or this file could not fail on Keras' mean.
    assert abs(batch_mean - google) > 100 * RTOL * google, (google, batch_mean)
    return google, batch_mean


def _check_intervals(data, run, steps, batches=EVAL_ROWS // EVAL_BATCH):
    """Every interval's evaluation (history.csv's val_ columns, TensorBoard's evaluation
    points) is Google's masked_lm_loss of that interval's checkpoint on the first `batches`
    held-out batches, and the last one is eval_results.json's."""
    with open(run / "history.csv") as f:
        history = list(csv.DictReader(f))
    assert [int(row["epoch"]) for row in history] == list(range(len(steps)))
    for row, step in zip(history, steps):
        google, _ = _google_and_batch_means(data, run, f"checkpoints/ckpt-{step:08d}.weights.h5",
                                            batches)
        np.testing.assert_allclose(float(row["val_mlm_logits_loss"]), google, rtol=RTOL,
                                   err_msg=f"interval evaluation at step {step}")
    written = json.load(open(run / "eval_results.json"))
    assert float(history[-1]["val_mlm_logits_loss"]) == written["mlm_logits_loss"]
    assert float(history[-1]["val_nsp_logits_accuracy"]) == written["nsp_logits_accuracy"]
    points = event_values(run / "logs" / "validation")["evaluation_mlm_logits_loss_vs_iterations"]
    assert [step for step, _ in points] == list(steps)
    np.testing.assert_allclose([value for _, value in points],
                               [float(row["val_mlm_logits_loss"]) for row in history], rtol=1e-6)


def _check(results, google, what):
    np.testing.assert_allclose(results["mlm_logits_loss"], google, rtol=RTOL, err_msg=what)


@pytest.mark.integration  # ~27 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_final_and_evaluation_only_results_are_googles_masked_lm_loss(data, tmp_path):
    """TensorFlow, one replica: the final evaluation of a run (2 batches a call), of an
    MLM-only run, and evaluation-only runs of the first (with and without the NSP head)."""
    run = tmp_path / "run"
    logs = _train(_flags(data, run, steps_per_execution=2))
    google, _ = _google_and_batch_means(data, run)
    written = json.load(open(run / "eval_results.json"))
    _check(written, google, "final evaluation")
    assert logs["final_val_mlm_logits_loss"] == written["mlm_logits_loss"]
    assert sorted(written) == ["global_step", "loss", "mlm_logits_accuracy", "mlm_logits_loss",
                               "nsp_logits_accuracy", "nsp_logits_loss"]
    for name, nsp in (("evaluated", True), ("evaluated_mlm", False)):
        results = _train(_evaluation_only(data, run, tmp_path / name,
                                          next_sentence_prediction=nsp))
        _check(results, google, name)
        assert json.load(open(tmp_path / name / "eval_results.json"))["mlm_logits_loss"] == \
            results["mlm_logits_loss"]
        assert ("nsp_logits_loss" in results) == nsp

    mlm_only = tmp_path / "mlm_only"
    _train(_flags(data, mlm_only, steps_per_execution=2, next_sentence_prediction=False))
    written = json.load(open(mlm_only / "eval_results.json"))
    _check(written, _google_and_batch_means(data, mlm_only)[0], "MLM-only final evaluation")
    assert sorted(written) == ["global_step", "loss", "mlm_logits_accuracy", "mlm_logits_loss"]


@pytest.mark.integration  # ~11 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_every_interval_evaluation_is_googles_masked_lm_loss(data, tmp_path):
    """Each checkpoint interval's evaluation (history.csv, TensorBoard) is the final
    evaluation's: Google's masked_lm_loss of the first --max_eval_steps held-out batches.
    Before, fit's validation logged Keras' mean of the batches' losses, and it walked on
    through the repeated held-out data: 3 batches of 4 rows, then rows 12-15 and 0-7."""
    run = tmp_path / "run"
    _train(_flags(data, run, num_train_steps=4, max_eval_steps=3))
    _check_intervals(data, run, steps=[2, 4], batches=3)


def _cli(flags, backend, *extra):
    command = [sys.executable, "-m", "bert_keras.run_pretraining",
               *[f"--{k}={v}" for k, v in flags.items() if v is not None], *extra]
    result = subprocess.run(command, cwd=REPO, env=backend_env(backend), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # 2 fresh processes, about 40 s on 2 cores
def test_mirrored_on_two_cpus_reports_googles_masked_lm_loss(data, tmp_path):
    """TensorFlow's MirroredStrategy on 2 logical CPUs: each replica sums its share of the
    predictions and the two sums add up over the replicas, in the final evaluation and in
    an evaluation-only run (MLM only)."""
    mirrored = ("--distribution_strategy=mirrored", "--num_cpu_devices=2")
    run = tmp_path / "run"
    result = _cli(_flags(data, run, num_train_steps=4), "tensorflow", *mirrored)
    assert "with 2 replica(s)" in result.stderr
    assert "Final evaluation: " in result.stderr  # the eval log beside eval_results.json
    google, _ = _google_and_batch_means(data, run)
    _check(json.load(open(run / "eval_results.json")), google, "mirrored final evaluation")
    _check_intervals(data, run, steps=[2, 4])
    evaluated = tmp_path / "evaluated"
    _cli(_evaluation_only(data, run, evaluated, next_sentence_prediction=False), "tensorflow",
         "--do_eval", *mirrored)
    _check(json.load(open(evaluated / "eval_results.json")), google, "mirrored evaluation")


def _two_process_job(backend, flags, *extra):
    """run_pretraining with `flags` (and the arguments `extra`) as a multi_worker_mirrored job of 2 processes on
    loopback (TensorFlow's workers, JAX's processes); fails with their output unless both
    end well."""
    command = [sys.executable, "-m", "bert_keras.run_pretraining",
               *[f"--{k}={v}" for k, v in flags.items() if v is not None],
               "--distribution_strategy=multi_worker_mirrored", *extra]
    if backend == "tensorflow":
        workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
        envs = [backend_env(backend, TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
            for index in range(2)]
        commands = [command, command]
    else:
        envs = [backend_env(backend)] * 2
        commands = [command + flags for flags in jax_process_flags(2)]
    codes, outputs = run_job(commands, envs, REPO, timeout=420)
    assert codes == [0, 0], describe(codes, outputs)


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # 2 jobs of 2 processes: about 80 s on 2 cores
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_two_processes_report_googles_masked_lm_loss(backend, data, tmp_path):
    """multi_worker_mirrored across 2 processes (TensorFlow's workers, JAX's processes):
    each reads half the held-out records, and the evaluations' two sums add up over both
    (on TensorFlow the evaluation model gets bert_keras.multi_worker_fix too): every
    interval's, the final one, and an evaluation-only job's (MLM only)."""
    run = tmp_path / "run"
    _two_process_job(backend, _flags(data, run, num_train_steps=4))
    google, _ = _google_and_batch_means(data, run)
    _check(json.load(open(run / "eval_results.json")), google, f"2 {backend} processes")
    _check_intervals(data, run, steps=[2, 4])
    evaluated = tmp_path / "evaluated"
    _two_process_job(backend, _evaluation_only(data, run, evaluated,
                                               next_sentence_prediction=False), "--do_eval")
    _check(json.load(open(evaluated / "eval_results.json")), google,
           f"2 {backend} processes evaluating")


@pytest.mark.integration  # 2 fresh processes on JAX, about 60 s on 2 cores
def test_jax_reports_googles_masked_lm_loss(data, tmp_path):
    """KERAS_BACKEND=jax: a run on 2 CPU devices (keras.distribution's DataParallel) with 2
    batches a call, then an evaluation-only run of it (MLM only) on one."""
    run = tmp_path / "run"
    _cli(_flags(data, run, steps_per_execution=2, num_train_steps=4), "jax",
         "--distribution_strategy=mirrored", "--num_cpu_devices=2")
    google, _ = _google_and_batch_means(data, run)
    _check(json.load(open(run / "eval_results.json")), google, "JAX final evaluation")
    _check_intervals(data, run, steps=[2, 4])
    evaluated = tmp_path / "evaluated"
    _cli(_evaluation_only(data, run, evaluated, next_sentence_prediction=False), "jax",
         "--do_eval")
    _check(json.load(open(evaluated / "eval_results.json")), google, "JAX evaluation")
