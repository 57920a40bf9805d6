"""The tools on Keras' backends: TensorFlow and JAX train; others are refused in one line.

Keras fixes its backend per process, so whatever runs on JAX here runs in a fresh process
(`conftest.backend_env`); this process is TensorFlow (exports are TensorFlow's by nature).
The fine-tuning arithmetic on JAX is pinned against torch by tests/test_training_parity.py
(`test_this_suite_holds_on_jax`, `test_two_replicas_equal_one[jax]`).
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile

import keras
import numpy as np
import pytest
from conftest import REPO, TESTDATA, backend_env, h5_keys

# Where the messages' documents are in this checkout (data_prep.files.doc_path).
BACKENDS_DOC = os.path.realpath(os.path.join(REPO, "docs", "backends.md"))
DISTRIBUTED_DOC = os.path.realpath(os.path.join(REPO, "docs", "distributed.md"))
from multiprocess import assert_preempted, describe, jax_process_flags, run_job
from test_run_finetune import SMALL, VOCAB, write_classification, write_conll

from bert_keras import (BertEncoder, backends, convert_checkpoint, distribute, extract_features,
                        run_classifier, run_squad, run_tagger)
from data_prep import cli

SQUAD = os.path.join(TESTDATA, "ft_squad_v2.json")
TOOLS = {"run_classifier": run_classifier.run, "run_tagger": run_tagger.run,
         "run_squad": run_squad.run,
         "extract_features": lambda **kw: extract_features.run("in.txt", "out.jsonl", **kw),
         # Under torch it loaded good checkpoints wrongly and wrote unloadable ones.
         "convert_checkpoint": lambda output_dir, **_: convert_checkpoint.convert(
             "hf", "keras", "missing", output_dir)}


def _pretend_backend(monkeypatch, name):
    monkeypatch.setattr(keras.backend, "backend", lambda: name)


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_unsupported_backend_is_one_line_naming_the_supported_ones(tool, backend, monkeypatch,
                                                                   capsys, tmp_path):
    _pretend_backend(monkeypatch, backend)
    values = (dict(output_dir=str(tmp_path / "out")) if tool == "convert_checkpoint" else
              {} if tool == "extract_features" else dict(
                  output_dir=str(tmp_path / "out"), do_train=True, train_file="missing.jsonl"))
    status = cli.report_errors(lambda: TOOLS[tool](**values))
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1, err
    assert err == (f"error: KERAS_BACKEND: expected tensorflow or jax, found {backend} (set "
                   f"KERAS_BACKEND=tensorflow; see {BACKENDS_DOC})\n")
    assert not (tmp_path / "out").exists()  # Refused before anything is read or written.


def test_supported_backends_pass_and_exports_want_tensorflow(monkeypatch):
    assert backends.check_backend() == "tensorflow"
    _pretend_backend(monkeypatch, "jax")
    assert backends.check_backend() == "jax"
    with pytest.raises(cli.InputError, match=r"^KERAS_BACKEND: expected tensorflow, found jax"):
        backends.check_backend(backends.EXPORT_BACKENDS)


def test_distribution_entry_point_on_tensorflow():
    import tensorflow as tf

    default = distribute.get_distribution("default")
    assert default.strategy is tf.distribute.get_strategy() and default.keras_distribution is None
    assert default.num_replicas_in_sync == 1 and default.is_chief
    assert repr(default) == "default (_DefaultDistributionStrategy) with 1 replica(s)"
    with default.scope():
        assert tf.distribute.get_strategy() is default.strategy
    ds = default.distribute_datasets_from_function(
        lambda context: tf.data.Dataset.range(8).batch(context.get_per_replica_batch_size(4)))
    assert [len(b) for b in ds] == [4, 4]
    with pytest.raises(distribute.StrategyError, match="no TPU"):
        distribute.get_distribution("tpu")


def test_tensorflow_strategies_on_jax_are_one_line(monkeypatch, capsys):
    _pretend_backend(monkeypatch, "jax")
    status = cli.report_errors(lambda: distribute.get_distribution("tpu"))
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1, err
    assert err == ("error: --distribution_strategy: expected default, mirrored or "
                   "multi_worker_mirrored on KERAS_BACKEND=jax (keras.distribution.DataParallel "
                   "over the local devices, or over several processes': a TPU VM's cores are "
                   "mirrored, a pod slice's multi_worker_mirrored), found tpu (a tf.distribute "
                   "strategy: run with KERAS_BACKEND=tensorflow)\n")


@pytest.mark.parametrize("name", ["multi_worker_mirrored", "tpu"])
def test_fine_tuning_strategies_on_tensorflow_are_one_line(name, capsys, tmp_path):
    """Fine-tuning trains on one host on TensorFlow (default, mirrored); across processes
    on JAX. Refused before any input is read."""
    values = dict(output_dir=str(tmp_path / "out"), do_train=True, train_file="missing.jsonl",
                  distribution_strategy=name)
    status = cli.report_errors(lambda: run_classifier.run(**values),
                               run_classifier.runner.expected_errors())
    err = capsys.readouterr().err
    assert status == 1 and err == (
        "error: --distribution_strategy: expected default or mirrored for fine-tuning on "
        f"KERAS_BACKEND=tensorflow, found {name} (across hosts: KERAS_BACKEND=jax with "
        f"multi_worker_mirrored; {DISTRIBUTED_DOC})\n")
    assert not (tmp_path / "out").exists()


# On JAX with 2 host devices: "mirrored" is keras.distribution.DataParallel over both, and
# the tf.data input comes as global batches (one pipeline, one replica in its context).
_JAX_DISTRIBUTION = textwrap.dedent("""
    import keras, numpy as np, tensorflow as tf
    from bert_keras import distribute
    distribute.configure_cpu_devices(2)
    assert keras.backend.backend() == "jax"
    d = distribute.get_distribution("mirrored")
    ds = d.distribute_datasets_from_function(
        lambda c: tf.data.Dataset.range(16).batch(c.get_per_replica_batch_size(8)))
    with d.scope():
        assert keras.distribution.distribution() is d.keras_distribution
        layer = keras.layers.Dense(3)
        layer.build((None, 5))
    assert keras.distribution.distribution() is None
    print("REPR", d)
    print("REPLICAS", d.num_replicas_in_sync, "CHIEF", d.is_chief,
          "BATCHES", [len(b) for b in ds],
          "KERNEL_DEVICES", len(layer.kernel.value.sharding.device_set),
          "DEFAULT", distribute.get_distribution("default").num_replicas_in_sync)
    try:
        distribute.configure_cpu_devices(3)
    except distribute.StrategyError as e:
        print("LATE", e)

    # Fine-tuning steps run through jax.jit whatever --jit_compile says, and the compile
    # config keeps the flag (so model.keras is TensorFlow's file); a model loaded with
    # jit_compile=False predicts compiled too.
    import sys
    from bert_keras import BertEncoder
    from bert_keras.finetuning import loop
    from bert_keras.tasks import BertClassifier
    x = {"input_word_ids": np.ones((4, 8), "int32"), "input_mask": np.ones((4, 8), "int32"),
         "input_type_ids": np.zeros((4, 8), "int32")}
    model = BertClassifier(BertEncoder(vocab_size=20, num_layers=1, hidden_size=8,
                                       num_heads=2, intermediate_size=8), 2)
    loop.train(model, x, {"logits": np.zeros(4, "int32")}, 2, 1.0, 1e-3, 0.0,
               jit_compile=False)
    model.save(sys.argv[1])
    loaded = keras.saving.load_model(sys.argv[1])
    before = loaded.jit_compile
    loop.predict(loaded, x, 2)
    print("JIT", model.jit_compile, model.get_compile_config()["jit_compile"], before,
          loaded.jit_compile)
""")


@pytest.mark.integration  # A JAX process: about 20 s on 2 cores.
def test_on_jax_mirrored_is_data_parallel_and_fine_tuning_steps_compile(tmp_path):
    result = subprocess.run([sys.executable, "-c", _JAX_DISTRIBUTION, str(tmp_path / "m.keras")],
                            cwd=REPO, env=backend_env("jax"), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines()
             if line.startswith(("REPLICAS", "LATE", "JIT", "REPR"))]
    assert lines[0] == "REPR mirrored (DataParallel) with 2 replica(s)"
    lines.pop(0)
    assert lines[0] == ("REPLICAS 2 CHIEF True BATCHES [8, 8] KERNEL_DEVICES 2 DEFAULT 1")
    assert lines[1] == ("LATE cannot split the CPU into 3 devices: JAX already initialized 2 "
                        "CPU device(s)")
    assert lines[2] == "JIT True False False True"


def _tool(module, args, backend):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          env=backend_env(backend), capture_output=True, text=True, timeout=900)


@pytest.mark.integration  # Two tool processes on other backends: about 30 s on 2 cores.
def test_unsupported_backend_from_the_command_line(tmp_path):
    for module, backend in (("bert_keras.run_classifier", "torch"),
                            ("bert_keras.extract_features", "numpy")):
        args = ([f"--output_dir={tmp_path / 'out'}", "--do_train", "--train_file=t.jsonl"]
                if module.endswith("classifier") else
                ["--input_file=in.txt", f"--output_file={tmp_path / 'f.jsonl'}",
                 "--init_checkpoint=x"])
        result = _tool(module, args, backend)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert result.stderr.strip().splitlines()[-1] == (
            f"error: KERAS_BACKEND: expected tensorflow or jax, found {backend} (set "
            f"KERAS_BACKEND=tensorflow; see {BACKENDS_DOC})")
    assert not (tmp_path / "out").exists()


@pytest.mark.integration  # Three JAX tool processes: about 2 min on 2 cores.
def test_run_classifier_in_two_jax_processes_trains_the_weights_of_one(tmp_path):
    """--distribution_strategy=multi_worker_mirrored: 2 JAX processes (1 CPU device each,
    joined on 127.0.0.1) fine-tune the weights one process does with the same global batch,
    over 20 updates, within float32 noise (the order of the gradient's sums: 1.2e-5 of one
    learning-rate step here, the bound 2e-3 steps); process 0 writes the directory,
    evaluates and predicts. With BERT's dropout (0.1): the processes drop what one process
    drops (the model they train is a copy made under the distribution, its dropout seeds
    the loaded model's; fresh seeds put them 6e-2 apart)."""
    encoder = tmp_path / "encoder.keras"
    BertEncoder(**SMALL, dropout=0.1, attention_dropout=0.1).save(encoder)
    write_classification(tmp_path / "train.jsonl", 56, 0)
    write_classification(tmp_path / "test.jsonl", 11, 1)
    lr, steps = 5e-3, 20
    values = dict(train_file=tmp_path / "train.jsonl", eval_file=tmp_path / "test.jsonl",
                  predict_file=tmp_path / "test.jsonl", init_checkpoint=encoder,
                  vocab_file=VOCAB, do_lower_case=True, do_train=True, do_eval=True,
                  do_predict=True, max_seq_length=16, train_batch_size=8, eval_batch_size=4,
                  num_train_steps=steps, learning_rate=lr, seed=3)
    one, two = tmp_path / "one", tmp_path / "two"
    result = _tool("bert_keras.run_classifier", _args({**values, "output_dir": one}), "jax")
    assert result.returncode == 0, result.stderr[-3000:]
    command = [sys.executable, "-m", "bert_keras.run_classifier",
               *_args({**values, "output_dir": two,
                       "distribution_strategy": "multi_worker_mirrored"})]
    codes, outputs = run_job([command + flags for flags in jax_process_flags(2)],
                             [backend_env("jax")] * 2, REPO, timeout=900)
    assert codes == [0, 0], describe(codes, outputs)
    assert all("multi_worker_mirrored (DataParallel) with 2 replica(s) over 2 processes" in out
               for out in outputs)
    assert sorted(os.listdir(two)) == sorted(os.listdir(one))  # Process 1 wrote nothing.
    trained = {d: keras.saving.load_model(d / "model.keras") for d in (one, two)}
    differences = [float(np.abs(a - b).max()) for a, b in zip(
        trained[one].get_weights(), trained[two].get_weights())]
    initial = keras.saving.load_model(encoder).get_weights()
    moved = max(float(np.abs(a - b).max()) for a, b in zip(
        trained[one].encoder.get_weights(), initial))
    print(json.dumps({"max_difference": max(differences), "moved": moved, "lr": lr}))  # pytest -s
    assert max(differences) <= 1e-4 * lr * steps, differences
    assert moved > 100 * 1e-4 * lr * steps, moved  # The bound tests something.
    predicted = {d: [json.loads(line) for line in open(d / "predictions.jsonl")]
                 for d in (one, two)}
    assert [p["label"] for p in predicted[two]] == [p["label"] for p in predicted[one]]
    assert max(abs(p["probabilities"][k] - q["probabilities"][k])
               for p, q in zip(predicted[one], predicted[two]) for k in p["probabilities"]) < 1e-5
    one_eval, two_eval = (json.loads((d / "eval_results.json").read_text()) for d in (one, two))
    assert two_eval["accuracy"] == one_eval["accuracy"]
    assert abs(two_eval["loss"] - one_eval["loss"]) < 1e-5


@pytest.mark.integration  # Two JAX processes that stop at once: about 15 s on 2 cores.
def test_fine_tuning_processes_started_with_other_flags_stop_before_writing(tmp_path):
    """The fine-tuning tools exchange their flags as run_pretraining does
    (tests/test_distribute.py): other --num_train_steps in process 1 stops both, in one
    line, before anything is written."""
    encoder = tmp_path / "encoder.keras"
    BertEncoder(**SMALL, dropout=0.0, attention_dropout=0.0).save(encoder)
    write_classification(tmp_path / "train.jsonl", 16, 0)
    values = dict(train_file=tmp_path / "train.jsonl", init_checkpoint=encoder,
                  vocab_file=VOCAB, do_lower_case=True, do_train=True, max_seq_length=16,
                  train_batch_size=8, num_train_steps=4, output_dir=tmp_path / "out",
                  distribution_strategy="multi_worker_mirrored")
    command = [sys.executable, "-m", "bert_keras.run_classifier", *_args(values)]
    commands = [command + flags for flags in jax_process_flags(2)]
    commands[1] = commands[1] + ["--num_train_steps=5"]
    codes, outputs = run_job(commands, [backend_env("jax")] * 2, REPO, timeout=240)
    assert codes == [1, 1], describe(codes, outputs)
    for output, value in zip(outputs, [4, 5]):
        last = output.strip().splitlines()[-1]
        assert last.startswith("error: the 2 processes of this job were started with different "
                               "values of --num_train_steps (here, process-"), last
        assert f"--num_train_steps={value}); start every process" in last, last
    assert not (tmp_path / "out").exists()


@pytest.mark.integration  # 2-process JAX jobs that stop at once: about 15 s each on 2 cores.
@pytest.mark.parametrize("host1", [
    "train file missing",
    # Not in CI (time); make test-all runs them.
    *[pytest.param(case, marks=pytest.mark.slow) for case in (
        "checkpoint missing", "checkpoint damaged", "other checkpoint", "other rows")]])
def test_what_one_host_holds_alone_stops_every_fine_tuning_process(host1, tmp_path):
    """The same command on two hosts (here: relative paths from two working directories),
    process 1's host holding a copy of its own. A missing or damaged file stopped process 1
    alone: process 0 then waited for it to join (the training file: the 290 s watchdog),
    or built the model, each variable a collective, until JAX aborted both 5 minutes later
    (the checkpoint: status -6). Other rows trained on, each process on its own (exit codes
    [0, 0]); other weights stopped both with a traceback and an array dump (jax.device_put
    checks that a value is the same on every process). Both now stop in seconds, each with
    one line, and nothing is written (each measured before the change)."""
    import shlex

    hosts = [tmp_path / "host0", tmp_path / "host1"]
    BertEncoder(**SMALL, dropout=0.0, attention_dropout=0.0).save(tmp_path / "encoder.keras")
    for host in hosts:
        host.mkdir()
        (host / "encoder.keras").write_bytes((tmp_path / "encoder.keras").read_bytes())
        write_classification(host / "train.jsonl", 16, 0)
    mine = hosts[1]
    if host1 == "checkpoint damaged":
        whole = (mine / "encoder.keras").read_bytes()
        (mine / "encoder.keras").write_bytes(whole[:len(whole) // 2])
    elif host1 == "checkpoint missing":
        (mine / "encoder.keras").unlink()
    elif host1 == "train file missing":
        (mine / "train.jsonl").unlink()
    elif host1 == "other checkpoint":
        keras.utils.set_random_seed(7)
        BertEncoder(**SMALL, dropout=0.0, attention_dropout=0.0).save(mine / "encoder.keras")
    else:
        write_classification(mine / "train.jsonl", 12, 1)
    values = dict(train_file="train.jsonl", init_checkpoint="encoder.keras",
                  vocab_file=VOCAB, do_lower_case=True, do_train=True, max_seq_length=16,
                  train_batch_size=8, num_train_steps=4, output_dir="out",
                  distribution_strategy="multi_worker_mirrored")
    command = [sys.executable, "-m", "bert_keras.run_classifier", *_args(values)]
    commands = [["bash", "-c", f"cd {shlex.quote(str(host))} && exec "
                 f"{shlex.join(command + flags)}"]
                for host, flags in zip(hosts, jax_process_flags(2))]
    codes, outputs = run_job(commands, [backend_env("jax")] * 2, REPO, timeout=240)
    assert codes == [1, 1], describe(codes, outputs)
    last = [output.strip().splitlines()[-1] for output in outputs]
    for host in hosts:
        assert not (host / "out").exists()
    if host1 in ("other checkpoint", "other rows"):
        flag, read = {"other checkpoint": ("--init_checkpoint", "weight arrays, CRC "),
                      "other rows": ("--train_file", "")}[host1]
        for index, line in enumerate(last):
            assert line.startswith(f"error: the 2 processes of this job read other contents "
                                   f"from {flag} on their hosts (here, process-{index}: "
                                   f"{flag}: "), line
            assert read in line and line.endswith("); give every host the same files"), line
        if host1 == "other rows":
            assert [line.split(f"{flag}: ")[-1].split(")")[0] for line in last] == [
                "16 features", "12 features"]
        return
    assert last[0] == ("error: another process of this job stopped on an error before "
                       "training (its output says which); this one (process-0) stops with it")
    assert last[1] == {
        "checkpoint missing": "error: encoder.keras: no such Keras model file",
        "checkpoint damaged": "error: encoder.keras: not a .keras file (a zip archive); "
                              "the file is truncated or of another format",
        "train file missing": "error: train.jsonl: No such file or directory"}[host1], last[1]


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # Two JAX processes stopped in training: about 40 s on 2 cores.
def test_a_sigterm_stops_every_fine_tuning_process_at_one_step(tmp_path):
    """SIGTERM (a scheduler's preemption or stop) to process 1 of a fine-tuning job: JAX's
    preemption service takes it over from Python, and the job trained on to its end. Both
    processes now stop at one step with the same line, nothing saved (no backup either:
    the first comes after --save_checkpoints_steps, 1000)."""
    import signal

    encoder = tmp_path / "encoder.keras"
    BertEncoder(**SMALL).save(encoder)
    write_classification(tmp_path / "train.jsonl", 16, 0)
    out = tmp_path / "out"
    values = dict(train_file=tmp_path / "train.jsonl", init_checkpoint=encoder,
                  vocab_file=VOCAB, do_lower_case=True, do_train=True, max_seq_length=16,
                  train_batch_size=8, num_train_steps=20000, output_dir=out,
                  distribution_strategy="multi_worker_mirrored")
    command = [sys.executable, "-m", "bert_keras.run_classifier", *_args(values)]
    codes, outputs = run_job([command + flags for flags in jax_process_flags(2)],
                             [backend_env("jax")] * 2, REPO, timeout=600,
                             signal_when=((out / "logs").exists, 1, signal.SIGTERM))
    assert_preempted(codes, outputs, "rerun the same command on every host to resume (from "
                     "the newest backup, where one was written)")
    assert not (out / "model.keras").exists()
    assert os.listdir(out / "backup") == ["run.json"]


# Weights whose true gradient is exactly zero for span QA: adding a constant to every
# position's start (or end) logit leaves the softmax over positions as it is, so the span
# head's bias and the last LayerNorm's beta (which shifts every position's vector alike)
# get only float32 noise, which Adam's g / (sqrt(v) + eps) turns into steps of up to
# ~1e-3 lr each, different in every summation order (8e-5 apart after 12 updates here).
_NO_TRUE_GRADIENT = {"run_squad": (
    "span_logits/bias", f"transformer_layer_{SMALL['num_layers'] - 1}/output_layer_norm/beta")}


# Three JAX tool processes per tool: about 1 min each on 2 cores. Not in CI (time): the
# classifier's test above is; make test-all runs these.
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("tool", ["run_tagger", "run_squad"])
def test_tagger_and_span_qa_in_two_jax_processes_train_the_weights_of_one(tool, tmp_path):
    """run_tagger and run_squad across 2 JAX processes, other sizes than the classifier's
    (S 24, batch 6 or 4, 12 updates): one process's weights within float32 noise (bound 2e-3
    learning-rate steps), except span QA's weights with no true gradient (above)."""
    encoder = tmp_path / "encoder.keras"
    BertEncoder(**SMALL, dropout=0.0, attention_dropout=0.0).save(encoder)
    lr, steps = 5e-3, 12
    values = dict(init_checkpoint=encoder, vocab_file=VOCAB, do_lower_case=True,
                  do_train=True, max_seq_length=24, train_batch_size=6,
                  num_train_steps=steps, learning_rate=lr, seed=3)
    if tool == "run_tagger":
        write_conll(tmp_path / "train.conll", 30, 0)
        values.update(train_file=tmp_path / "train.conll")
    else:
        values.update(train_file=SQUAD, version_2_with_negative=True, doc_stride=4,
                      max_query_length=8, max_answer_length=6, train_batch_size=4)
    one, two = tmp_path / "one", tmp_path / "two"
    result = _tool(f"bert_keras.{tool}", _args({**values, "output_dir": one}), "jax")
    assert result.returncode == 0, result.stderr[-3000:]
    command = [sys.executable, "-m", f"bert_keras.{tool}",
               *_args({**values, "output_dir": two,
                       "distribution_strategy": "multi_worker_mirrored"})]
    codes, outputs = run_job([command + flags for flags in jax_process_flags(2)],
                             [backend_env("jax")] * 2, REPO, timeout=900)
    assert codes == [0, 0], describe(codes, outputs)
    assert sorted(os.listdir(two)) == sorted(os.listdir(one))
    import bert_keras.tasks  # noqa: F401  (registers the task models for loading)

    trained = {d: keras.saving.load_model(d / "model.keras") for d in (one, two)}
    noise_only = _NO_TRUE_GRADIENT.get(tool, ())
    differences, skipped = {}, []
    for a, b in zip(trained[one].weights, trained[two].weights):
        if a.path.endswith(noise_only):
            skipped.append(a.path)
            continue
        differences[a.path] = float(np.abs(np.asarray(a) - np.asarray(b)).max())
    assert len(skipped) == len(noise_only), skipped
    initial = keras.saving.load_model(encoder).get_weights()
    moved = max(float(np.abs(a - b).max()) for a, b in zip(
        trained[one].encoder.get_weights(), initial))
    print(json.dumps({"tool": tool, "max_difference": max(differences.values()),
                      "moved": moved}))  # pytest -s
    assert max(differences.values()) <= 1e-4 * lr * steps, differences
    assert moved > 100 * 1e-4 * lr * steps, moved


@pytest.mark.slow  # The tools' own suites in a JAX process: 2-3 min on 2 cores.
def test_the_tools_suites_hold_on_jax():
    """run_classifier, run_tagger, run_squad, extract_features and the fine-tuning loop,
    their default-tier tests run on JAX (the same fixtures, files and numbers)."""
    from conftest import run_tests_on_backend

    result, counts = run_tests_on_backend(
        "jax", "tests/test_run_finetune.py", "tests/test_extract_features.py",
        "tests/test_finetune_loop.py", "-W", "ignore::UserWarning")
    assert result.returncode == 0 and not counts.get("failed"), result.stdout[-6000:]
    assert counts.get("passed", 0) >= 15, result.stdout[-3000:]


# --- A run trained on JAX: the same directory as TensorFlow's; exported and verified by a
# TensorFlow process.

# Non-default flags of every fine-tuning tool (the optimizer's schedule and epsilon, the
# head's initializer, the optimizer state in model.keras) on top of a small run's settings.
SETTINGS = dict(do_lower_case=True, max_seq_length=16, train_batch_size=8, eval_batch_size=16,
                learning_rate=1e-3, num_train_epochs=1.0, seed=7, log_steps=2,
                lr_schedule="google", epsilon_placement="keras",
                head_initializer="truncated_normal", save_optimizer_state=True)


def _args(values):
    return [f"--{k}" if v is True else f"--{k}={v}" for k, v in values.items()]


def _listing(out):
    """Files of a run directory (logs by subdirectory) and the model file's contents."""
    found = sorted(os.listdir(out)) + sorted(os.listdir(os.path.join(out, "logs")))
    with zipfile.ZipFile(os.path.join(out, "model.keras")) as z:
        members = sorted(z.namelist())
        config = json.loads(z.read("config.json"))
        # Keras numbers models and optimizers per process (bert_span_qa, bert_span_qa_1,
        # adam_w, adam_w_1, ...): this process may have built others before (make test-all
        # runs other tests' span-QA models in it first), a tool process builds one.
        config["compile_config"]["optimizer"]["config"].pop("name")
        config["config"]["name"] = re.sub(r"_\d+$", "", config["config"]["name"])
        weights = os.path.join(out, "weights.h5")
        with open(weights, "wb") as f:
            f.write(z.read("model.weights.h5"))
    keys = h5_keys(weights)
    os.remove(weights)
    return found, members, config, keys


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    """`{tool: run}` for run_classifier, run_tagger and run_squad, each trained (when first
    asked for) from the command line on JAX, and in this (TensorFlow) process with the same
    settings."""
    tmp = tmp_path_factory.mktemp("jax_runs")
    encoder = str(tmp / "encoder.keras")
    BertEncoder(**SMALL).save(encoder)
    write_classification(tmp / "train.jsonl", 24, 0)
    write_classification(tmp / "test.jsonl", 10, 1)
    write_conll(tmp / "train.conll", 24, 0)
    write_conll(tmp / "test.conll", 8, 1)
    data = {"run_classifier": ("train.jsonl", "test.jsonl"),
            "run_tagger": ("train.conll", "test.conll"), "run_squad": (SQUAD, SQUAD)}

    class Runs(dict):
        def __missing__(self, tool):
            self[tool] = _train_on_both_backends(tool, *data[tool], tmp, encoder)
            return self[tool]

    return Runs()


def _train_on_both_backends(tool, train, test, tmp, encoder):
    """`tool` trained on `train` from the command line on JAX and here with the same
    settings: {"jax": dir, "tensorflow": dir, "jax_log": its stderr, "test": file}."""
    values = dict(train_file=str(tmp / train), predict_file=str(tmp / test),
                  init_checkpoint=encoder, vocab_file=VOCAB, do_train=True,
                  do_predict=True, **SETTINGS)
    if tool == "run_squad":
        values.update(version_2_with_negative=True, doc_stride=4, max_query_length=8,
                      max_answer_length=6, train_batch_size=4)
    else:
        values.update(eval_file=str(tmp / test), do_eval=True)
    out = {backend: str(tmp / f"{tool}_{backend}") for backend in ("jax", "tensorflow")}
    result = _tool(f"bert_keras.{tool}", _args({**values, "output_dir": out["jax"]}), "jax")
    assert result.returncode == 0, result.stderr[-3000:]
    TOOLS[tool](**values, output_dir=out["tensorflow"])
    return {**out, "jax_log": result.stderr, "test": str(tmp / test)}


# Per tool: a JAX tool run, one here, an export and verify: about 1.5 min on 2 cores. The
# tagger's and span QA's: not in CI (time); make test-all runs them.
@pytest.mark.integration
@pytest.mark.parametrize("tool", ["run_classifier",
                                  *[pytest.param(t, marks=pytest.mark.slow)
                                    for t in ("run_tagger", "run_squad")]])
def test_jax_trained_runs_have_the_tensorflow_layout_and_export_and_verify(jax_runs, tool,
                                                                           tmp_path):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the text-in exports hold its ops)

    from export.verify import verify

    run = jax_runs[tool]
    jax_listing, tf_listing = _listing(run["jax"]), _listing(run["tensorflow"])
    assert jax_listing == tf_listing, tool  # Files, logs, model file, config, weights.
    skip_padding_note = "padding-free rows are TensorFlow-only" in run["jax_log"]
    assert skip_padding_note == (tool != "run_squad"), tool  # Span QA trains padded.
    results = json.load(open(os.path.join(run["jax"], "train_results.json")))
    assert np.isfinite([p["loss"] for p in results["loss_history"]]).all()
    # Exported by a TensorFlow process, from the JAX run's directory.
    module = {"run_classifier": "export_classifier", "run_tagger": "export_tagger",
              "run_squad": "export_span_qa"}[tool]
    export_dir = tmp_path / module
    result = _tool(f"export.{module}", [f"--model_dir={run['jax']}",
                                        f"--export_dir={export_dir}",
                                        "--max_seq_length=16"], "tensorflow")
    assert result.returncode == 0, result.stderr[-3000:]
    path = result.stdout.strip().splitlines()[-1]
    report = verify(path)
    assert report.ok, str(report)
    loaded = tf.saved_model.load(path)
    if tool == "run_classifier":
        # The export's probabilities are those the JAX process predicted.
        texts = [json.loads(line)["text"] for line in open(run["test"])]
        got = loaded.signatures["serving_default"](text=tf.constant(texts))["probabilities"]
        predicted = [json.loads(line) for line in open(
            os.path.join(run["jax"], "predictions.jsonl"))]
        labels = open(os.path.join(run["jax"], "labels.txt")).read().split()
        want = [[p["probabilities"][label] for label in labels] for p in predicted]
        np.testing.assert_allclose(got.numpy(), want, atol=2e-5)
    elif tool == "run_tagger":
        from data_prep import tagging

        sentences = tagging.read_conll(run["test"])
        predicted = tagging.read_conll(os.path.join(run["jax"], "predictions.conll"))
        got = loaded.signatures["serving_default"](
            text=tf.constant([" ".join(s.words) for s in sentences]))
        compared = 0
        for row, sentence in enumerate(predicted):
            tags = [t.decode() for t in got["tags"].numpy()[row][:len(sentence.words)]]
            for exported, written in zip(tags, sentence.tags):
                if exported:  # "": a word past max_seq_length, not tagged by the export
                    assert exported == written, (row, tags, sentence.tags)
                    compared += 1
        assert compared > 20


# One export tool process: about 1 min on 2 cores. Not in CI (time): test_length_buckets'
# test_export_tool_runs_on_tensorflow_whatever_keras_backend_says is; make test-all runs it.
@pytest.mark.integration
@pytest.mark.slow
def test_export_tools_run_on_tensorflow_in_a_jax_shell(jax_runs, tmp_path):
    """Issue 47: the shell that trained on JAX exports without changing KERAS_BACKEND; the
    tool says which backend it used."""
    result = _tool("export.export_classifier", [
        f"--model_dir={jax_runs['run_classifier']['jax']}", f"--export_dir={tmp_path / 'm'}",
        "--max_seq_length=16"], "jax")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(tmp_path / "m" / "1")
    said = [line for line in result.stderr.splitlines() if "Keras backend:" in line]
    assert len(said) == 1 and said[0].endswith(
        "Keras backend: tensorflow (KERAS_BACKEND=jax from the environment is for training; "
        "exports write TensorFlow SavedModels)"), result.stderr[-3000:]


@pytest.mark.integration  # One JAX tool process: about 15 s on 2 cores.
def test_extract_features_on_jax_equals_tensorflow(jax_runs, tmp_path):
    """extract_features from the command line on JAX, from the JAX-trained classifier's
    directory, against the same tool run here on TensorFlow."""
    text = tmp_path / "input.txt"
    text.write_text("free money now click here\nhello friend ||| meeting tomorrow city\n")
    values = dict(input_file=str(text), init_checkpoint=jax_runs["run_classifier"]["jax"],
                  layers="-1,-2", max_seq_length=12)
    result = _tool("bert_keras.extract_features",
                   _args({**values, "output_file": str(tmp_path / "jax.npz")}), "jax")
    assert result.returncode == 0, result.stderr[-3000:]
    extract_features.run(output_file=str(tmp_path / "tf.npz"),
                         **{**values, "layers": values["layers"].split(",")})
    with np.load(tmp_path / "jax.npz") as jax_features, np.load(tmp_path / "tf.npz") as tf_features:
        assert sorted(jax_features.files) == sorted(tf_features.files)
        np.testing.assert_array_equal(jax_features["tokens"], tf_features["tokens"])
        assert jax_features["input_mask"].sum() > 10
        for layer in ("layer_-1", "layer_-2"):
            assert jax_features[layer].shape == (2, 12, SMALL["hidden_size"])
            np.testing.assert_allclose(jax_features[layer], tf_features[layer], atol=2e-5)


def test_the_exports_say_what_another_keras_backend_is_for():
    """KERAS_BACKEND=jax is for the training tools; torch is for none of them (they refuse
    it), so the export tools' first line does not call it a training backend."""
    from export.keras_backend import describe

    used = keras.backend.backend()
    assert describe(None) == f"Keras backend: {used}"
    assert describe("jax" if used != "jax" else "tensorflow").endswith(
        "from the environment is for training; exports write TensorFlow SavedModels)")
    assert describe("torch") == (f"Keras backend: {used} (KERAS_BACKEND=torch from the "
                                 "environment is not used; exports write TensorFlow SavedModels)")
