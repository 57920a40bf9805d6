"""run_pretraining on Keras' JAX backend, as users run it: the command line with
KERAS_BACKEND=jax on Google-schema (statically masked) records and on records for dynamic
masking, through tf.data as on TensorFlow; the run directory is TensorFlow's; the encoder
it leaves exports from a TensorFlow process and passes export.verify.
"""

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO, assert_same_weights, backend_env, h5_arrays
from multiprocess import (assert_preempted, describe, jax_process_flags, kill_between_backups,
                          run_job)
from test_dynamic_pretraining import CONFIG as DYNAMIC_CONFIG
from test_dynamic_pretraining import S as DYNAMIC_S
from test_dynamic_pretraining import VOCAB as DYNAMIC_VOCAB
from test_dynamic_pretraining import run_cli as create_pretraining_data
from test_run_pretraining import CONFIG, P, S
from test_run_pretraining import data  # noqa: F401 (its module fixture, used below)

from data_prep import files

pytestmark = pytest.mark.integration  # fresh processes, ~1 min each on 2 cores


def _tool(module, flags, backend="tensorflow", **env):
    command = [sys.executable, "-m", module] + [f"--{k}={v}" for k, v in flags.items()]
    return subprocess.run(command, capture_output=True, text=True,
                          env=backend_env(backend, **env), cwd=REPO, timeout=900)


def _layout(directory):
    """Relative paths of a run directory's files; event files by their folder only."""
    found = set()
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.relpath(os.path.join(root, name), directory)
            found.add(os.path.dirname(path) + "/<events>" if "tfevents" in name else path)
    return found


def _weight_names(path):
    names = set()
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: names.add(name) if isinstance(obj, h5py.Dataset)
                     else None)
    return names


@pytest.fixture(scope="module")
def static_data(data):
    """test_run_pretraining's records, vocabulary and model (with dropout) as flags."""
    return dict(input_file=data["train"], eval_input_file=data["eval"],
                bert_config_file=data["dropout_config"], vocab_file=data["vocab"],
                max_seq_length=S, max_predictions_per_seq=P)


def _pretrain(data, output_dir, backend, **extra):
    flags = dict(data, output_dir=output_dir, train_batch_size=8, eval_batch_size=4,
                 max_eval_steps=2, num_train_steps=6, num_warmup_steps=2,
                 save_checkpoints_steps=3, learning_rate=1e-3, seed=5, **extra)
    return _tool("bert_keras.run_pretraining", flags, backend)


@pytest.mark.slow  # Not in CI (time); make test-all runs it.
def test_static_records_on_jax_give_tensorflows_run_directory_and_export(static_data,
                                                                          tmp_path):
    jax_run, tf_run = str(tmp_path / "jax"), str(tmp_path / "tf")
    # Gradient accumulation and LAMB: the recipe options train on JAX too.
    extra = dict(gradient_accumulation_steps=2, optimizer="lamb")
    done = _pretrain(static_data, jax_run, "jax", **extra)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    # Without --jit_compile (TensorFlow's switch): Keras skips jax.jit when a model's
    # jit_compile is False, and the step ran op by op (7x slower at this size).
    assert "Train step: compiled with XLA" in done.stderr
    done = _pretrain(static_data, tf_run, "tensorflow", **extra)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Train step: a TensorFlow graph without XLA" in done.stderr
    assert _layout(jax_run) == _layout(tf_run)
    for name in ("pretrainer.weights.h5", "encoder/encoder.weights.h5"):
        assert _weight_names(os.path.join(jax_run, name)) == _weight_names(
            os.path.join(tf_run, name))
    results = json.loads(open(os.path.join(jax_run, "eval_results.json")).read())
    assert results["global_step"] == 6 and results["loss"] > 0
    # The encoder a JAX run leaves, exported and verified in TensorFlow processes.
    export_dir = str(tmp_path / "export")
    done = _tool("export.export_encoder", dict(
        init_checkpoint=os.path.join(jax_run, files.ENCODER_DIR), export_dir=export_dir,
        seq_length=S))
    assert done.returncode == 0, done.stderr[-3000:]
    done = _tool("export.verify", dict(export_dir=os.path.join(export_dir, "1")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
def test_dynamic_masking_on_jax(tmp_path):
    train = str(tmp_path / "train")
    assert create_pretraining_data(
        input_file=os.path.join(REPO, "tests", "testdata", "pretrain_corpus.txt"),
        vocab_file=DYNAMIC_VOCAB, output_file=train, num_output_shards=1,
        max_seq_length=DYNAMIC_S, dynamic_masking=True, random_seed=1,
        num_examples_to_print=0) == 0
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(DYNAMIC_CONFIG))
    data = dict(input_file=train + "-00000-of-00001.tfrecord", bert_config_file=str(config),
                vocab_file=DYNAMIC_VOCAB, max_seq_length=DYNAMIC_S)
    output_dir = str(tmp_path / "run")
    done = _tool("bert_keras.run_pretraining", dict(
        data, output_dir=output_dir, train_batch_size=4, num_train_steps=4,
        num_warmup_steps=1, save_checkpoints_steps=2, learning_rate=1e-3, seed=3,
        do_whole_word_mask=True, next_sentence_prediction=False), "jax")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Dynamic masking" in done.stderr
    assert os.path.isfile(os.path.join(output_dir, files.ENCODER_DIR, files.ENCODER_WEIGHTS_FILE))
    history = open(os.path.join(output_dir, "history.csv")).read().splitlines()
    assert history[0].split(",")[0] == "epoch" and len(history) == 3  # two intervals


@pytest.mark.slow  # Not in CI (time); make test-all runs it.
def test_data_parallel_on_two_host_devices_equals_one(static_data, tmp_path):
    """--distribution_strategy=mirrored on JAX is keras.distribution.DataParallel: two host
    devices (XLA_FLAGS) train the same weights as one (no dropout, so no random state).

    The bound is float32's, in learning-rate steps as in the two-process test below: the runs
    differ only in the order of the gradient's sums, which Adam's m / sqrt(v) turns into a
    relative error of the update, not of the weight (a bias that starts at 0 is a few steps
    large; 1.7e-8 = 1.7e-5 of a step was seen on CI's CPU). Training each device on its half
    of the batch alone would be off by about one step (lr) per update."""
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(CONFIG))
    data = dict(static_data, bert_config_file=str(config))
    weights = {}
    lr, steps = 1e-3, 4
    for name, devices in (("one", 1), ("two", 2)):
        flags = dict(data, output_dir=str(tmp_path / name), train_batch_size=8,
                     num_train_steps=steps, num_warmup_steps=1, save_checkpoints_steps=2,
                     learning_rate=lr, seed=5, distribution_strategy="mirrored")
        done = _tool("bert_keras.run_pretraining", flags, "jax",
                     XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"with {devices} replica(s)" in done.stderr
        weights[name] = h5_arrays(tmp_path / name / "pretrainer.weights.h5")
    assert weights["one"].keys() == weights["two"].keys()
    differences = {k: float(abs(weights["two"][k] - v).max()) for k, v in weights["one"].items()}
    assert max(differences.values()) <= 1e-4 * lr * steps, differences


@pytest.mark.parametrize("extra,devices", [
    # Not in CI (time: BUILD_NOTES 8.5; test_two_processes_start_from_a_checkpoint_and_evaluate_one
    # runs two processes there); make test-all runs them.
    pytest.param({}, 1, marks=pytest.mark.slow),
    pytest.param(dict(gradient_accumulation_steps=2, steps_per_execution=2), 1,
                 marks=pytest.mark.slow),
    pytest.param({}, 2, marks=pytest.mark.slow)],
    ids=["plain", "accumulation_and_multi_step_calls", "two_devices_each"])
def test_two_processes_train_the_weights_of_one(static_data, tmp_path, extra, devices):
    """--distribution_strategy=multi_worker_mirrored on JAX: 2 processes (1 CPU device each,
    or 2 as on GPU hosts, joined on 127.0.0.1 by keras.distribution.initialize) train the
    weights one process trains with the same global batch, over 20 updates; process 0
    writes the run directory. Also with gradient accumulation and several steps per call,
    which tf.distribute cannot run on several replicas (check_replicas) and Keras'
    DataParallel can: a TPU pod slice's usual settings. With 2 devices each the job stalled
    in its first step while run_pretraining left Keras' step uncompiled on JAX (an eager
    op on a global array at a time).

    The bound is float32's: the two runs differ only in the order of the gradient's sums
    (the 2-device single-process run, --distribution_strategy=mirrored, gives the same
    weights as the 2 processes bit for bit): 3.5e-4 of one learning-rate step at most here,
    the bound 2e-3 steps; a process training on its half of the batch alone, or on another
    half, would be off by about one step (lr) per update.
    """
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(CONFIG))
    lr, steps = 1e-3, 20
    flags = dict(static_data, bert_config_file=str(config), eval_input_file="",
                 train_batch_size=8, num_train_steps=steps, num_warmup_steps=2,
                 save_checkpoints_steps=10, learning_rate=lr, seed=5, **extra)
    one, two = tmp_path / "one", tmp_path / "two"
    done = _tool("bert_keras.run_pretraining", dict(flags, output_dir=one), "jax")
    assert done.returncode == 0, done.stderr[-3000:]
    command = [sys.executable, "-m", "bert_keras.run_pretraining",
               *[f"--{k}={v}" for k, v in dict(flags, output_dir=two).items()],
               "--distribution_strategy=multi_worker_mirrored"]
    env = backend_env("jax", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    codes, outputs = run_job([command + process for process in jax_process_flags(2)],
                             [env] * 2, REPO, timeout=600)
    assert codes == [0, 0], describe(codes, outputs)
    for output in outputs:
        assert (f"multi_worker_mirrored (DataParallel) with {2 * devices} replica(s) over 2 "
                "processes") in output
    # Process 0's run directory, as one process leaves it (process 1's backup removed).
    assert _layout(two) == _layout(one)
    recorded = json.loads((two / files.RUN_CONFIG_FILE).read_text())
    assert recorded["distribution_strategy"] == "multi_worker_mirrored"
    assert not {"coordinator_address", "num_processes", "process_id"} & set(recorded)
    ours, theirs = (h5_arrays(d / files.PRETRAINER_WEIGHTS_FILE) for d in (two, one))
    assert ours.keys() == theirs.keys()
    differences = {k: float(abs(ours[k] - theirs[k]).max()) for k in ours}
    # The weights moved (about one step per update) far more than the bound: it tests.
    halfway = h5_arrays(one / "checkpoints" / "ckpt-00000010.weights.h5")
    moved = max(float(abs(theirs[k] - halfway[k]).max()) for k in theirs if k in halfway)
    largest = max(differences.values())
    print(json.dumps({"max_difference": largest, "moved": moved, "lr": lr}))  # pytest -s
    assert largest <= 1e-4 * lr * steps, differences
    assert moved > 100 * 1e-4 * lr * steps, moved


def _uninterrupted_two_process_run(flags, out):
    """Runs run_pretraining with `flags` in 2 JAX processes (multi_worker_mirrored) into
    `out`; returns `commands(output_dir)`: the same job's commands for another run."""
    def commands(output_dir):
        command = [sys.executable, "-m", "bert_keras.run_pretraining",
                   *[f"--{k}={v}" for k, v in dict(flags, output_dir=output_dir).items()],
                   "--distribution_strategy=multi_worker_mirrored"]
        return [command + process for process in jax_process_flags(2)]

    codes, outputs = run_job(commands(out), [backend_env("jax")] * 2, REPO, timeout=900)
    assert codes == [0, 0], describe(codes, outputs)
    return commands


@pytest.mark.slow  # Not in CI (time); make test-all runs it.
def test_two_processes_killed_between_their_backups_resume_together(static_data, tmp_path):
    """A preempted pod slice: both processes killed with SIGKILL after process 0 wrote its
    backup of epoch 2 and, as if the kill came a moment earlier there, before process 1 did
    (its latest file removed: the state right after the backup renamed its previous file
    aside). A rerun of both resumes from epoch 1, the newest both hold, and ends with the
    weights of the uninterrupted 2-process run bit for bit (with dropout). Each process
    restoring its own newest backup made them train different steps: the job aborted in
    JAX's coordination service after its timeouts."""
    flags = dict(static_data, eval_input_file="", train_batch_size=8, num_train_steps=20,
                 num_warmup_steps=2, save_checkpoints_steps=5, learning_rate=1e-3, seed=5)

    clean, killed = tmp_path / "clean", tmp_path / "killed"
    commands = _uninterrupted_two_process_run(flags, clean)

    ahead = kill_between_backups(
        commands(killed), [backend_env("jax")] * 2, REPO,
        [killed / "backup", killed / "workers" / "process-1" / "backup"])
    codes, outputs = run_job(commands(killed), [backend_env("jax")] * 2, REPO, timeout=900)
    assert codes == [0, 0], describe(codes, outputs)
    assert "the newest that every process holds" in outputs[ahead]
    assert all("Resuming from" in output for output in outputs)
    assert all("position; results are bit-identical to an uninterrupted run\n" in output
               for output in outputs)
    assert_same_weights(*(run / files.PRETRAINER_WEIGHTS_FILE for run in (killed, clean)))


@pytest.mark.slow  # Not in CI (time); make test-all runs it.
def test_a_sigterm_to_one_process_stops_every_process_and_the_rerun_resumes(static_data,
                                                                          tmp_path):
    """A scheduler preempting or stopping a job sends SIGTERM. JAX's preemption service
    (started by jax.distributed.initialize) takes SIGTERM over from Python, and the job
    trained on to its last step (exit codes [0, 0], measured). Now a SIGTERM to process 1
    after the first backup stops both processes at one step, each with the same line, the
    run unfinished; the same command resumes from the backup and ends with the weights of
    the uninterrupted 2-process run bit for bit (with dropout)."""
    import signal

    flags = dict(static_data, eval_input_file="", train_batch_size=8, num_train_steps=300,
                 num_warmup_steps=2, save_checkpoints_steps=20, learning_rate=1e-3, seed=5)

    clean, stopped = tmp_path / "clean", tmp_path / "stopped"
    commands = _uninterrupted_two_process_run(flags, clean)

    backup = stopped / "workers" / "process-1" / "backup" / "training_metadata.json"
    codes, outputs = run_job(commands(stopped), [backend_env("jax")] * 2, REPO, timeout=900,
                             signal_when=(backup.exists, 1, signal.SIGTERM))
    assert_preempted(codes, outputs, "rerun the same command on every host to resume "
                     "from the newest backup")
    assert not (stopped / files.PRETRAINER_WEIGHTS_FILE).exists()

    codes, outputs = run_job(commands(stopped), [backend_env("jax")] * 2, REPO, timeout=900)
    assert codes == [0, 0], describe(codes, outputs)
    assert all("Resuming from" in output for output in outputs)
    assert_same_weights(*(run / files.PRETRAINER_WEIGHTS_FILE for run in (stopped, clean)))


def test_a_sigterm_stops_a_one_process_job_too(static_data, tmp_path):
    """multi_worker_mirrored as one process (a single-host slice) joins through
    jax.distributed.initialize as well, whose preemption service takes SIGTERM over: the
    run stops with the same line (the callback goes wherever the processes were joined,
    not only where there are several)."""
    import signal

    flags = dict(static_data, eval_input_file="", train_batch_size=8, num_train_steps=3000,
                 num_warmup_steps=2, save_checkpoints_steps=20, learning_rate=1e-3, seed=5,
                 output_dir=tmp_path / "out")
    command = [sys.executable, "-m", "bert_keras.run_pretraining",
               *[f"--{k}={v}" for k, v in flags.items()],
               "--distribution_strategy=multi_worker_mirrored", *jax_process_flags(1)[0]]
    backup = tmp_path / "out" / "backup" / "training_metadata.json"
    codes, outputs = run_job([command], [backend_env("jax")], REPO, timeout=600,
                             signal_when=(backup.exists, 0, signal.SIGTERM))
    assert_preempted(codes, outputs, "rerun the same command on every host to resume "
                     "from the newest backup")


def test_a_run_started_on_tensorflow_resumes_on_jax(data, tmp_path):
    """A pretraining job moved between backends mid-run (a TPU job continued on GPUs):
    killed on TensorFlow after a backup, the same command on JAX resumes it and says its
    dropout masks will differ. The step computes the same function on both backends, so
    without dropout the run ends at the uninterrupted TensorFlow run's weights within
    float32 rounding (3.6e-7 measured; runs started on the two backends with one seed, whose
    initial weights differ, end 0.12 apart)."""
    from test_run_pretraining import _kill_when, _start

    flags = dict(input_file=data["train"], bert_config_file=data["config"],
                 max_seq_length=S, max_predictions_per_seq=P, train_batch_size=8,
                 num_train_steps=60, num_warmup_steps=6, save_checkpoints_steps=10,
                 learning_rate=1e-3, seed=5)
    clean, moved = tmp_path / "clean", tmp_path / "moved"
    done = _tool("bert_keras.run_pretraining", dict(flags, output_dir=clean))
    assert done.returncode == 0, done.stderr[-3000:]

    def backed_up():
        try:
            return json.loads((moved / "backup" / "training_metadata.json").read_text()
                              )["epoch"] >= 1
        except (OSError, ValueError, KeyError):
            return False

    log = tmp_path / "killed.log"
    process = _start([f"--{k}={v}" for k, v in dict(flags, output_dir=moved).items()], log,
                     backend_env("tensorflow"))
    killed = _kill_when(process, backed_up, timeout=600)
    assert killed, "ended before the kill:\n" + log.read_text()[-3000:]
    done = _tool("bert_keras.run_pretraining", dict(flags, output_dir=moved), "jax")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming from" in done.stderr
    assert "written on Keras' tensorflow backend and this run is on jax" in done.stderr
    ours, theirs = (h5_arrays(d / files.PRETRAINER_WEIGHTS_FILE) for d in (moved, clean))
    assert ours.keys() == theirs.keys()
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=0, atol=1e-5, err_msg=key)


def test_korean_recipe_through_a_jax_pretraining_run(tmp_path):
    """build_vocab and create_pretraining_data with --strip_accents=false (Korean-safe), then
    run_pretraining on JAX: the settings reach the encoder directory, and the encoder exports
    and verifies in TensorFlow processes."""
    from test_korean_pipeline import S as KOREAN_S
    from test_korean_pipeline import _korean_lines

    lines = _korean_lines()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(lines[i:i + 5]) for i in range(0, len(lines), 5))
                      + "\n", encoding="utf-8")
    vocab = tmp_path / "vocab" / "vocab.txt"
    data, run = tmp_path / "data" / "train", tmp_path / "run"
    for module, flags in (
            ("data_prep.build_vocab", dict(input=corpus, output=vocab, vocab_size=600,
                                           layout="compact", min_frequency=1,
                                           strip_accents="false")),
            ("data_prep.create_pretraining_data", dict(
                input_file=corpus, vocab_file=vocab, output_file=data, num_output_shards=1,
                max_seq_length=KOREAN_S, max_predictions_per_seq=5, dupe_factor=2,
                num_examples_to_print=0, strip_accents="false"))):
        done = _tool(module, flags)
        assert done.returncode == 0, done.stderr[-3000:]
    done = _tool("bert_keras.run_pretraining", dict(
        input_file=f"{data}-*.tfrecord", output_dir=run, preset="tiny", vocab_file=vocab,
        max_seq_length=KOREAN_S, max_predictions_per_seq=5, train_batch_size=4,
        num_train_steps=4, num_warmup_steps=0, save_checkpoints_steps=4), "jax")
    assert done.returncode == 0, done.stderr[-3000:]
    encoder_dir = run / files.ENCODER_DIR
    saved = json.loads((encoder_dir / files.TOKENIZER_CONFIG_FILE).read_text())
    assert saved["do_lower_case"] is True and saved["strip_accents"] is False
    export_dir = tmp_path / "export"
    done = _tool("export.export_encoder", dict(init_checkpoint=encoder_dir,
                                               export_dir=export_dir, seq_length=KOREAN_S))
    assert done.returncode == 0, done.stderr[-3000:]
    done = _tool("export.verify", dict(export_dir=export_dir / "1"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_two_processes_start_from_a_checkpoint_and_evaluate_one(static_data, tmp_path):
    """Across 2 JAX processes (multi_worker_mirrored), a phase 2 starts from --init_checkpoint
    (each process loads and digests it, and they check they read the same), and Google's
    evaluation-only run (--do_train=false --do_eval) of the finished model gives the
    metrics one process gives: the held-out batches are split between the processes and
    the metrics summed over both."""
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(CONFIG))
    common = dict(static_data, bert_config_file=str(config), train_batch_size=8,
                  eval_batch_size=4, max_eval_steps=3, learning_rate=1e-3, seed=5)
    flags = dict(common, num_train_steps=2, num_warmup_steps=1, save_checkpoints_steps=2,
                 eval_input_file="")
    phase_one = tmp_path / "phase1"
    done = _tool("bert_keras.run_pretraining", dict(flags, output_dir=phase_one), "jax")
    assert done.returncode == 0, done.stderr[-3000:]

    def two_processes(output_dir, **more):
        command = [sys.executable, "-m", "bert_keras.run_pretraining",
                   *[f"--{k}={v}" for k, v in dict(more, output_dir=output_dir).items()],
                   "--distribution_strategy=multi_worker_mirrored"]
        codes, outputs = run_job([command + process for process in jax_process_flags(2)],
                                 [backend_env("jax")] * 2, REPO, timeout=600)
        assert codes == [0, 0], describe(codes, outputs)

    two_processes(tmp_path / "phase2", **flags, init_checkpoint=phase_one)
    assert (tmp_path / "phase2" / files.ENCODER_DIR).is_dir()
    evaluation = dict(common, do_train="false", do_eval="true", init_checkpoint=phase_one)
    done = _tool("bert_keras.run_pretraining", dict(evaluation, output_dir=tmp_path / "one"),
                 "jax")
    assert done.returncode == 0, done.stderr[-3000:]
    two_processes(tmp_path / "two", **evaluation)
    one, two = (json.loads((tmp_path / name / "eval_results.json").read_text())
                for name in ("one", "two"))
    # The chief alone writes, and only the results (eval_results.txt: Google's names).
    assert sorted(os.listdir(tmp_path / "two")) == ["eval_results.json", "eval_results.txt"]
    for name in ("mlm_logits_accuracy", "mlm_logits_loss", "nsp_logits_accuracy",
                 "nsp_logits_loss"):
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, err_msg=name)
    google = [dict(line.split(" = ") for line in (tmp_path / name / "eval_results.txt")
                   .read_text().splitlines()) for name in ("one", "two")]
    assert google[0].keys() == google[1].keys() >= {"masked_lm_accuracy", "next_sentence_loss"}
    for name in google[0]:
        np.testing.assert_allclose(float(google[1][name]), float(google[0][name]), rtol=1e-5,
                                   err_msg=name)
