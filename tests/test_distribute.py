"""Strategies: TPU without a TPU, MirroredStrategy on 2 logical CPUs, 2 local MWMS workers;
on JAX, 2 processes joined by keras.distribution.initialize (multi_worker_mirrored).

Multi-device runs happen in subprocesses: logical CPU devices and TF_CONFIG must be set
before TensorFlow initializes, and this test process has long since initialized it; JAX's
processes must be joined before JAX computes anything (`tests/multiprocess.py` runs a job).
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import TINY, assert_same_weights, backend_env
from multiprocess import (KERAS_PROCESS_VARIABLES, assert_preempted, describe, free_ports,
                          jax_process_flags, kill_between_backups, run_job)
from pretraining_data import write_dataset

from bert_keras import BertEncoder, BertPretrainer, distribute, multi_worker_fix
from bert_keras.run_pretraining import PretrainingError, PretrainingOptions, check_replicas
from data_prep import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S, P = 16, 4
CONFIG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
              intermediate_size=37, max_position_embeddings=40, hidden_act="gelu",
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2,
              initializer_range=0.02)  # Every key of a bert_config.json is required.


def _env(**extra):
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO, **extra)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("distribute")
    train_glob = write_dataset(directory, num_files=2, per_file=16, max_seq_length=S,
                               max_predictions_per_seq=P)
    config = directory / "bert_config.json"
    config.write_text(json.dumps(CONFIG))
    return dict(train=train_glob, config=str(config))


def _args(data, output_dir, *extra):
    return [sys.executable, "-m", "bert_keras.run_pretraining", f"--input_file={data['train']}",
            f"--output_dir={output_dir}", f"--bert_config_file={data['config']}",
            f"--max_seq_length={S}", f"--max_predictions_per_seq={P}", "--train_batch_size=8",
            "--num_train_steps=4", "--num_warmup_steps=1", "--save_checkpoints_steps=2", *extra]


def _tf_worker_envs(count):
    """The environments of `count` TensorFlow workers of one job on 127.0.0.1 (a TF_CONFIG
    each: the same cluster, its own task)."""
    workers = [f"127.0.0.1:{port}" for port in free_ports(count)]
    return [backend_env("tensorflow", TF_CONFIG=json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
        for index in range(count)]


def test_tpu_without_tpu_is_a_one_line_error():
    with pytest.raises(distribute.StrategyError) as error:
        distribute.get_strategy("tpu")
    assert "no TPU" in str(error.value) and "\n" not in str(error.value)
    # A bare TPU name would need the cloud metadata server: refused without contacting it.
    with pytest.raises(distribute.StrategyError, match="grpc://"):
        distribute.get_strategy("tpu", tpu="my-tpu")
    with pytest.raises(distribute.StrategyError, match="unknown distribution_strategy"):
        distribute.get_strategy("parameter_server")


def test_cli_tpu_without_tpu_exits_with_one_line(data, tmp_path):
    result = subprocess.run(_args(data, tmp_path / "out", "--distribution_strategy=tpu"),
                            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: distribution_strategy=tpu but no TPU")


def test_default_strategy_needs_no_multi_worker_fix():
    strategy = distribute.get_strategy("default")
    assert distribute.is_chief(strategy)
    assert not multi_worker_fix.needs_fix(strategy)
    assert not multi_worker_fix.apply(BertPretrainer(BertEncoder(**TINY)))


# Weight decay under MirroredStrategy: the copies on the second device are named
# ".../replica_1:0"; the exclusion pattern must still see gamma/beta/bias.
_MIRRORED_DECAY = textwrap.dedent("""
    import numpy as np, tensorflow as tf
    from bert_keras import BertEncoder, BertPretrainer, distribute
    from bert_keras.optimization import create_optimizer
    distribute.configure_cpu_devices(2)
    strategy = distribute.get_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        model = BertPretrainer(BertEncoder(vocab_size=99, num_layers=1, hidden_size=32,
                                           num_heads=4, intermediate_size=37))
        optimizer = create_optimizer(0.1, 10, 0, weight_decay=0.5)
        optimizer.build(model.trainable_variables)
    for v in model.trainable_variables:
        v.assign(tf.fill(v.shape, 0.5))
    @tf.function
    def step():
        def replica_fn():
            optimizer.apply_gradients(
                [(tf.zeros(v.shape), v) for v in model.trainable_variables])
        strategy.run(replica_fn)
    step()
    decayed = sorted(v.path for v in model.trainable_variables if v.numpy().flat[0] != 0.5)
    kept = sorted(v.path.rsplit("/", 1)[-1] for v in model.trainable_variables
                  if v.numpy().flat[0] == 0.5)
    for v in model.trainable_variables:  # Both replicas hold the same values.
        a, b = [t.numpy() for t in v.value.values]
        np.testing.assert_array_equal(a, b)
    print("DECAYED", sorted({p.rsplit("/", 1)[-1] for p in decayed}))
    print("KEPT", sorted(set(kept)))
""")


def test_weight_decay_exclusions_hold_under_mirrored_strategy():
    result = subprocess.run([sys.executable, "-c", _MIRRORED_DECAY], cwd=REPO, env=_env(),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["DECAYED"] == str(["kernel", "position_embeddings", "token_type_embeddings",
                                    "word_embeddings"])
    assert lines["KEPT"] == str(["beta", "bias", "gamma", "output_bias"])


@pytest.mark.integration  # ~22 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_mirrored_strategy_on_two_logical_cpus_trains_and_checkpoints(data, tmp_path):
    """Also covers LAMB under a strategy."""
    out = tmp_path / "out"
    result = subprocess.run(
        _args(data, out, "--distribution_strategy=mirrored", "--num_cpu_devices=2",
              "--optimizer=lamb"),
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mirrored (MirroredStrategy) with 2 replica(s)" in result.stderr
    assert sorted(os.listdir(out / "checkpoints")) == ["ckpt-00000002.weights.h5",
                                                       "ckpt-00000004.weights.h5"]
    assert "Epoch 2/2" in result.stdout
    assert (out / "encoder" / "encoder.weights.h5").exists()


# Export straight from a model whose variables are MirroredVariables (issue 8: an export
# never depends on the strategy the model was trained with).
_MIRRORED_EXPORT = textwrap.dedent("""
    import os, sys
    import numpy as np
    from bert_keras import BertEncoder, BertPretrainer, distribute
    from bert_keras.losses import pretraining_losses_and_metrics
    from export.export_encoder import export_encoder
    from export.verify import verify
    distribute.configure_cpu_devices(2)
    strategy = distribute.get_strategy("mirrored")
    with strategy.scope():
        encoder = BertEncoder(vocab_size=99, num_layers=1, hidden_size=32, num_heads=4,
                              intermediate_size=37, max_sequence_length=40)
        pretrainer = BertPretrainer(encoder)
        pretrainer.compile(optimizer="adam", **pretraining_losses_and_metrics())
    rng = np.random.default_rng(0)
    x = {"input_word_ids": rng.integers(5, 99, (8, 16)).astype("int32"),
         "input_mask": np.ones((8, 16), "int32"), "input_type_ids": np.zeros((8, 16), "int32"),
         "masked_lm_positions": np.tile(np.arange(1, 5, dtype="int32"), (8, 1))}
    y = {"mlm_logits": rng.integers(5, 99, (8, 4)).astype("int32"),
         "nsp_logits": rng.integers(0, 2, (8,)).astype("int32")}
    before = encoder.get_weights()[0].copy()
    pretrainer.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert not np.array_equal(before, encoder.get_weights()[0]), "did not train"
    assert type(encoder.variables[0].value).__name__ == "MirroredVariable"
    out = sys.argv[1]
    vocab = os.path.join(out, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                          + [f"w{i}" for i in range(94)]) + "\\n")
    encoder.save_weights(os.path.join(out, "encoder.weights.h5"))
    encoder.to_bert_config().to_json_file(os.path.join(out, "bert_config.json"))
    path = export_encoder(encoder, os.path.join(out, "models"), vocab, pretrainer=pretrainer,
                          warmup_seq_length=16)
    report = verify(path, init_checkpoint=os.path.join(out, "encoder.weights.h5"))
    print(report)
    sys.exit(0 if report.ok else 1)
""")


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # Train, export and verify in fresh processes: about 40 s on 2 cores.
def test_export_of_a_model_trained_under_mirrored_strategy_verifies(tmp_path):
    result = subprocess.run([sys.executable, "-c", _MIRRORED_EXPORT, str(tmp_path)], cwd=REPO,
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "[ok] session" in result.stdout and "[ok] parity" in result.stdout


def test_settings_keras_cannot_distribute_fail_early():
    options = PretrainingOptions(input_file="x", output_dir="y", preset="tiny",
                                 train_batch_size=8, gradient_accumulation_steps=2)
    check_replicas(options, 1)
    with pytest.raises(PretrainingError, match="one replica only on TensorFlow"):
        check_replicas(options, 2)
    single = dataclasses.replace(options, gradient_accumulation_steps=1)
    with pytest.raises(PretrainingError, match="train_batch_size=8 is not divisible by the 3"):
        check_replicas(single, 3)
    with pytest.raises(PretrainingError, match="train_batch_size=8 is not divisible by the 3"):
        check_replicas(single, 3, tf_distribute=False)
    # The evaluation's batch only where there is held-out data to evaluate.
    unevaluated = dataclasses.replace(single, train_batch_size=12, eval_batch_size=8)
    check_replicas(unevaluated, 3)
    with pytest.raises(PretrainingError, match="eval_batch_size=8 is not divisible by the 3 "
                       "replicas; use a multiple of 3"):
        check_replicas(dataclasses.replace(unevaluated, eval_input_file="heldout"), 3)
    check_replicas(dataclasses.replace(single, steps_per_execution=4), 1)
    with pytest.raises(PretrainingError, match="keras-team/keras#19246"):
        check_replicas(dataclasses.replace(single, steps_per_execution=4), 2)
    check_replicas(dataclasses.replace(single, steps_per_execution=4,
                                       distribution_strategy="tpu"), 8)
    # Keras' DataParallel (JAX) has neither tf.distribute bug: both train there
    # (test_run_pretraining_jax.py's two-process test with both).
    check_replicas(dataclasses.replace(options, steps_per_execution=4), 2, tf_distribute=False)


def test_a_resumed_run_refused_on_other_replicas_is_told_where_to_resume_it():
    """A run killed on one device and resumed on two (a job moved to other hardware) whose
    batch does not split, or whose accumulation tf.distribute cannot run, was told to change
    the flag ("use a multiple of 2"): its rerun was then refused as a run with other flags.
    A resumed run keeps its training flags, so the refusal names the device counts it can
    resume on; a new run is still told which flag to change, and the evaluation's batch,
    which a resumed run may change, too."""
    options = PretrainingOptions(input_file="x", output_dir="y", preset="tiny",
                                 train_batch_size=5, eval_batch_size=3, eval_input_file="e")
    with pytest.raises(PretrainingError) as new_run:
        check_replicas(options, 2)
    assert str(new_run.value) == ("--train_batch_size=5 is not divisible by the 2 replicas; "
                                  "use a multiple of 2")
    with pytest.raises(PretrainingError) as resumed:
        check_replicas(options, 2, resuming="runs/phase1")
    assert str(resumed.value) == (
        "--train_batch_size=5 is not divisible by the 2 replicas; runs/phase1 holds an "
        "interrupted run with --train_batch_size=5, which a resumed run keeps: resume it on "
        "a number of replicas that divides 5 (--distribution_strategy=default: one device), "
        "or choose a new --output_dir")
    with pytest.raises(PretrainingError, match=r"eval_batch_size=3 is not divisible by the 2 "
                                               r"replicas; use a multiple of 2$"):
        check_replicas(dataclasses.replace(options, train_batch_size=4), 2, resuming="r")
    accumulated = dataclasses.replace(options, train_batch_size=4, eval_batch_size=4,
                                      gradient_accumulation_steps=2)
    with pytest.raises(PretrainingError, match=r"one replica only on TensorFlow .*; r holds an "
                       r"interrupted run with --gradient_accumulation_steps=2, which a resumed "
                       r"run keeps: resume it on one replica \(--distribution_strategy=default"
                       r"\) or on KERAS_BACKEND=jax"):
        check_replicas(accumulated, 2, resuming="r")
    check_replicas(accumulated, 2, tf_distribute=False, resuming="r")  # JAX accumulates
    multi_step = dataclasses.replace(accumulated, gradient_accumulation_steps=1,
                                     steps_per_execution=2)
    with pytest.raises(PretrainingError, match=r"#19246\); r holds an interrupted run with "
                       r"--steps_per_execution=2, which a resumed run keeps"):
        check_replicas(multi_step, 2, resuming="r")


@pytest.mark.integration  # Two tools in fresh processes on 2 logical CPUs: about 25 s.
@pytest.mark.parametrize("tool", ["run_pretraining", "run_classifier"])
def test_a_backup_resumed_on_two_replicas_it_cannot_split_says_where_to_resume(
        tool, data, tmp_path):
    """The tools find the interrupted run in --output_dir (run_pretraining: its
    run_config.json and a backup; fine-tuning: a backup) and say where to resume it, before
    anything trains; the backup itself is not read (a placeholder stands for it)."""
    out = tmp_path / "run"
    (out / "backup").mkdir(parents=True)
    (out / "backup" / "latest.weights.h5").write_bytes(b"")
    if tool == "run_pretraining":
        (out / "run_config.json").write_text("{}")
        flags = [f"--input_file={data['train']}", f"--bert_config_file={data['config']}",
                 f"--max_seq_length={S}", f"--max_predictions_per_seq={P}"]
    else:
        train = tmp_path / "train.jsonl"
        train.write_text("".join(json.dumps({"text": f"word{i} word", "label": str(i % 2)})
                                 + "\n" for i in range(10)))
        config = tmp_path / "bert_config.json"
        config.write_text(json.dumps(dict(vocab_size=30, hidden_size=8, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=8,
                                          max_position_embeddings=16, type_vocab_size=2)))
        vocab = tmp_path / "vocab.txt"
        vocab.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                      "[MASK]", "word"]))
        flags = [f"--train_file={train}", f"--bert_config_file={config}",
                 f"--vocab_file={vocab}", "--do_train", "--max_seq_length=16"]
    done = subprocess.run(
        [sys.executable, "-m", f"bert_keras.{tool}", *flags, f"--output_dir={out}",
         "--train_batch_size=5", "--distribution_strategy=mirrored", "--num_cpu_devices=2"],
        capture_output=True, text=True, cwd=REPO, env=backend_env("tensorflow"), timeout=600)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: --train_batch_size=5 is not divisible by the 2 replicas; {out} holds an "
        "interrupted run with --train_batch_size=5, which a resumed run keeps: resume it on a "
        "number of replicas that divides 5 (--distribution_strategy=default: one device), or "
        "choose a new --output_dir")


@pytest.mark.integration  # Two TensorFlow worker processes: about 15 s on 2 cores.
def test_multi_worker_mirrored_with_two_local_workers(data, tmp_path):
    out = tmp_path / "out"
    envs = _tf_worker_envs(2)
    command = _args(data, out, "--distribution_strategy=multi_worker_mirrored")
    codes, outputs = run_job([command, command], envs, REPO, timeout=420)
    assert codes == [0, 0], describe(codes, outputs)
    assert "multi_worker_mirrored (CollectiveAllReduceStrategy) with 2 replica(s)" in outputs[0]
    # The chief (worker 0) writes the shared outputs.
    assert sorted(os.listdir(out / "checkpoints")) == ["ckpt-00000002.weights.h5",
                                                       "ckpt-00000004.weights.h5"]
    assert (out / "encoder" / "encoder.weights.h5").exists()
    assert not (out / "workers").exists()  # Worker 1's own backup, removed at the end.


# Each process of a 2-process job hands gather_from_processes its own row: every process
# must get every process's row, in process (TensorFlow: replica) order.
_GATHER = textwrap.dedent("""
    import sys
    from bert_keras import distribute
    index = int(sys.argv[1])
    flags = dict(coordinator_address=sys.argv[2], num_processes=2, process_id=index) \
        if len(sys.argv) > 2 else {}
    distribution = distribute.get_distribution("multi_worker_mirrored", **flags)
    print("PROCESSES", distribution.num_processes)
    print("ROWS", distribution.gather_from_processes([index, 10 + index]))
""")


@pytest.mark.integration  # Two TensorFlow and two JAX processes: about 40 s on 2 cores.
def test_processes_exchange_rows_on_both_backends():
    """What the processes' backups agree on (bert_keras.backup) goes through this exchange:
    TensorFlow's multi-worker strategy and JAX's joined processes."""
    envs = _tf_worker_envs(2)
    codes, outputs = run_job([[sys.executable, "-c", _GATHER, str(i)] for i in range(2)],
                             envs, REPO, timeout=300)
    assert codes == [0, 0], describe(codes, outputs)
    (port,) = free_ports(1)
    jax_codes, jax_outputs = run_job(
        [[sys.executable, "-c", _GATHER, str(i), f"127.0.0.1:{port}"] for i in range(2)],
        [backend_env("jax")] * 2, REPO, timeout=300)
    assert jax_codes == [0, 0], describe(jax_codes, jax_outputs)
    for output in outputs + jax_outputs:
        assert "PROCESSES 2" in output and "ROWS [[0, 10], [1, 11]]" in output, output[-2000:]


def _row_of(flags, worker="process-1", inputs=False):
    """The row of hashes a process with `flags` (or, with `inputs`, that read `flags`:
    {name: (digest, description)}) hands the exchange."""
    rows = []

    class Capture(distribute.Distribution):
        num_processes, worker_name = 2, worker

        def gather_from_processes(self, row):
            rows.append(row)
            return [row, row]

    if inputs:
        Capture("multi_worker_mirrored").check_same_inputs(lambda: flags)
    else:
        Capture("multi_worker_mirrored").check_same_flags(flags)
    return rows[0]


class _FirstOfTwo(distribute.Distribution):
    """Process 0 of a simulated 2-process job whose process 1 has `other` flags."""
    num_processes, worker_name = 2, "process-0"

    def __init__(self, other):
        super().__init__("multi_worker_mirrored")
        self.other = other

    def gather_from_processes(self, row):
        return [row, _row_of(self.other)]


def test_processes_started_with_other_flags_stop_naming_them():
    """Commands that differ in more than the process flags and --output_dir: a process
    training with another --learning_rate would update its own copy of the weights
    otherwise, silently. Each process names the flags and its own values."""
    flags = dataclasses.asdict(PretrainingOptions(input_file="t", output_dir="/a"))
    flags.update(coordinator_address="10.0.0.1:8476", num_processes=2, process_id=0)
    same = dict(flags, output_dir="/b", process_id=1)
    _FirstOfTwo(same).check_same_flags(flags)  # Only what may differ differs.
    with pytest.raises(distribute.StrategyError) as caught:
        _FirstOfTwo(dict(same, learning_rate=5e-3, seed=6)).check_same_flags(flags)
    assert str(caught.value) == (
        "the 2 processes of this job were started with different values of --learning_rate, "
        "--seed (here, process-0: --learning_rate=0.0001, --seed=12345); start every process with "
        "the same flags, only the process flags (--process_id, or TF_CONFIG's task) and "
        "--output_dir may differ")
    assert _row_of(dict(flags, num_train_steps=10)) != _row_of(dict(flags, num_train_steps=11))
    # One process has nothing to exchange (a plain Distribution would fail to gather).
    distribute.Distribution("default").check_same_flags(flags)


class _InputsOfTwo(distribute.Distribution):
    """Process 1 of a simulated 2-process job whose process 0 read `other` ({name: (digest,
    description)})."""
    num_processes, worker_name = 2, "process-1"

    def __init__(self, other):
        super().__init__("multi_worker_mirrored")
        self.other = other

    def gather_from_processes(self, row):
        return [_row_of(self.other, "process-0", inputs=True), row]


def test_processes_that_read_other_contents_stop_naming_the_inputs():
    """The same flags on every host, another copy of a file on one of them: the processes
    would train on other data or weights (silently, or stalled when the shapes or step
    counts differ). Every process names the inputs that differ and what it read."""
    import numpy as np

    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(3, np.float32)]
    mine = {"--init_checkpoint": (distribute.digest(*weights), "2 weight arrays"),
            "--train_file": (distribute.digest(np.ones((4, 8), np.int32), ["a", "b"]),
                             "4 features")}
    _InputsOfTwo(mine).check_same_inputs(lambda: mine)
    other = dict(mine, **{"--train_file": (distribute.digest(np.ones((5, 8), np.int32),
                                                             ["a", "b"]), "5 features")})
    with pytest.raises(distribute.StrategyError) as caught:
        _InputsOfTwo(other).check_same_inputs(lambda: mine)
    assert str(caught.value) == (
        "the 2 processes of this job read other contents from --train_file on their hosts "
        "(here, process-1: --train_file: 4 features); give every host the same files")
    # One process reads nothing for the check (BERT-base's weights take 0.15-0.3 s).
    distribute.Distribution("default").check_same_inputs(lambda: 1 / 0)


def test_a_digest_changes_with_any_value_dtype_shape_or_order():
    import numpy as np

    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    one_off = base.copy()
    one_off[2, 3] = np.nextafter(one_off[2, 3], np.float32(99))
    codes = [distribute.digest(base), distribute.digest(one_off),
             distribute.digest(base.astype(np.float64)), distribute.digest(base.reshape(4, 3)),
             distribute.digest(base, "x"), distribute.digest("x", base),
             distribute.digest(["a", "b"]), distribute.digest(["b", "a"])]
    assert len(set(codes)) == len(codes), codes
    assert distribute.digest(base) == distribute.digest(base.copy())
    # A Keras variable counts as its value (a model's weights).
    import keras

    assert distribute.digest(keras.Variable(base)) == distribute.digest(base)


def test_what_was_read_is_described_for_the_message(tmp_path):
    import numpy as np

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n한국\n", encoding="utf-8")
    code, description = distribute.vocabulary_read(str(vocab))
    assert description == "3 tokens"
    assert code == distribute.digest("[PAD]\n[UNK]\n한국\n")
    assert distribute.vocabulary_read(str(vocab), {"lower_case": False})[0] != code
    weights = [np.ones((2, 2), np.float32), np.zeros(2, np.float32)]
    code = distribute.digest(*weights)
    assert distribute.weights_read(weights) == (code, f"2 weight arrays, CRC {code:08x}")


class _OneOfTwo(distribute.Distribution):
    """A process of a simulated 2-process job whose other process's block `other_failed`;
    `rows` keeps what this one handed the exchange."""
    num_processes, worker_name = 2, "process-1"

    def __init__(self, other_failed):
        super().__init__("multi_worker_mirrored")
        self.other_failed, self.rows = other_failed, []

    def gather_from_processes(self, row):
        self.rows.append(list(row))
        return [[int(self.other_failed)], list(row)]


def test_what_one_process_fails_alone_stops_every_process():
    """Every process reaches the exchange whether its block raised or not (else the others
    wait at their next collective until JAX aborts them); its own error comes out as it
    was, and a process whose block passed stops pointing at the other's output."""
    passed = _OneOfTwo(other_failed=False)
    with passed.stop_together():
        value = 3
    assert value == 3 and passed.rows == [[0]]
    failing = _OneOfTwo(other_failed=False)
    with pytest.raises(PretrainingError, match="^--output_dir /x exists"):
        with failing.stop_together():
            raise PretrainingError("--output_dir /x exists and is not a pretraining run")
    assert failing.rows == [[1]]
    waiting = _OneOfTwo(other_failed=True)
    with pytest.raises(distribute.StrategyError) as caught:
        with waiting.stop_together():
            pass
    assert str(caught.value) == (
        "another process of this job stopped on an error before training (its output says "
        "which); this one (process-1) stops with it")
    # One process: nothing to exchange (a plain Distribution would fail to gather).
    with pytest.raises(PretrainingError):
        with distribute.Distribution("default").stop_together():
            raise PretrainingError("alone")


@pytest.mark.integration  # Two 2-process jobs that stop at once: about 30 s on 2 cores.
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_an_output_dir_the_chief_refuses_stops_every_process(backend, data, tmp_path):
    """The chief alone checks --output_dir: its refusal left process 1 waiting at its first
    collective (on JAX until the coordination service aborted both 5 minutes later, status
    -6 and a stack dump each). Now both stop in seconds, and the user's file is untouched."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    command = _args(data, out, "--distribution_strategy=multi_worker_mirrored")
    if backend == "jax":
        commands, envs = [command + flags for flags in jax_process_flags(2)], [
            backend_env("jax")] * 2
    else:
        commands, envs = [command, command], _tf_worker_envs(2)
    codes, outputs = run_job(commands, envs, REPO, timeout=240)
    assert codes == [1, 1], describe(codes, outputs)
    last = [output.strip().splitlines()[-1] for output in outputs]
    assert last[0] == (f"error: --output_dir {out} exists and is not a pretraining run; "
                       "choose a new or empty output_dir")
    worker = "process-1" if backend == "jax" else "worker-1"
    assert last[1] == ("error: another process of this job stopped on an error before "
                       f"training (its output says which); this one ({worker}) stops with it")
    assert sorted(os.listdir(out)) == ["notes.txt"]


@pytest.mark.integration  # Four 2-process jobs that stop at once: about 1 min on 2 cores.
@pytest.mark.parametrize("host1", ["data missing", "other config"])
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_what_one_host_holds_alone_stops_every_pretraining_process(backend, host1, data,
                                                                    tmp_path):
    """The same command on two hosts (relative paths from two working directories), process
    1's host holding a copy of its own. Its data missing stopped it before it joined: JAX's
    process 0 waited for the 290 s watchdog, TensorFlow's worker 0 without limit. Another
    bert_config.json built another model in it: JAX aborted both (status -6), TensorFlow's
    workers crashed with tracebacks building the model, after the chief had made
    --output_dir. Both now stop in seconds, with one line each, and nothing is written
    (each measured before the change)."""
    import shlex

    hosts = [tmp_path / "host0", tmp_path / "host1"]
    for host in hosts:
        host.mkdir()
        (host / "data").symlink_to(os.path.dirname(data["train"]))
        (host / "bert_config.json").write_text(json.dumps(CONFIG))
    if host1 == "data missing":
        (hosts[1] / "data").unlink()
    else:
        (hosts[1] / "bert_config.json").write_text(json.dumps(dict(CONFIG, intermediate_size=41)))
    pattern = f"data/{os.path.basename(data['train'])}"
    command = _args(dict(train=pattern, config="bert_config.json"), "out",
                    "--distribution_strategy=multi_worker_mirrored")
    if backend == "jax":
        commands = [command + flags for flags in jax_process_flags(2)]
        envs, workers = [backend_env("jax")] * 2, ["process-0", "process-1"]
    else:
        commands, envs, workers = [command, command], _tf_worker_envs(2), ["worker-0", "worker-1"]
    commands = [["bash", "-c", f"cd {shlex.quote(str(host))} && exec {shlex.join(command)}"]
                for host, command in zip(hosts, commands)]
    codes, outputs = run_job(commands, envs, REPO, timeout=240)
    assert codes == [1, 1], describe(codes, outputs)
    last = [output.strip().splitlines()[-1] for output in outputs]
    for host in hosts:
        assert not (host / "out").exists()
    if host1 == "data missing":
        assert last[0] == ("error: another process of this job stopped on an error before "
                           f"training (its output says which); this one ({workers[0]}) stops "
                           "with it")
        assert last[1] == (f"error: --input_file: input pattern '{pattern}' matches no data "
                           "file"), last[1]
        return
    for worker, size, line in zip(workers, [37, 41], last):
        assert line.startswith("error: the 2 processes of this job read other contents from "
                               f"--bert_config_file on their hosts (here, {worker}: "
                               "--bert_config_file: {"), line
        assert f'"intermediate_size":{size},' in line, line
        assert line.endswith("}); give every host the same files"), line


@pytest.mark.integration  # Two 2-process jobs that stop at once: about 30 s on 2 cores.
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_processes_started_with_other_flags_stop_before_writing(backend, data, tmp_path):
    """The exchange on both backends, in the tool: every process stops with one line (the
    job stalled for 5 minutes and died in JAX's coordination service when one process's
    other flags made it fail, and trained on silently when they did not), and nothing is
    written."""
    out = tmp_path / "out"
    command = _args(data, out, "--distribution_strategy=multi_worker_mirrored")
    if backend == "jax":
        commands = [command + flags for flags in jax_process_flags(2)]
        envs = [backend_env("jax")] * 2
    else:
        commands, envs = [command, command], _tf_worker_envs(2)
    commands[1] = commands[1] + ["--learning_rate=5e-3"]
    codes, outputs = run_job(commands, envs, REPO, timeout=240)
    assert codes == [1, 1], describe(codes, outputs)
    for output, value in zip(outputs, ["0.0001", "0.005"]):
        assert "Traceback" not in output, output[-3000:]
        last = output.strip().splitlines()[-1]
        assert last.startswith("error: the 2 processes of this job were started with "
                               "different values of --learning_rate (here, "), last
        assert f": --learning_rate={value}); start every process" in last, last
    assert not out.exists()


@pytest.mark.integration  # Three 2-worker runs in fresh processes: about 1 min on 2 cores.
def test_workers_killed_between_their_backups_resume_together(data, tmp_path):
    """TensorFlow's multi-worker job killed (SIGKILL) after the chief wrote its backup of
    epoch 2 and before worker 1 did: rerun, both resume from epoch 1, the newest both hold
    (bert_keras.backup, agreed through the strategy's gather), and the run ends with the
    uninterrupted run's weights (with dropout, --deterministic)."""
    def job(out):
        envs = _tf_worker_envs(2)
        command = [*_args(data, out, "--distribution_strategy=multi_worker_mirrored",
                          "--deterministic", "--seed=3"),
                   "--num_train_steps=12", "--save_checkpoints_steps=3"]
        return [command, command], envs

    clean, killed = tmp_path / "clean", tmp_path / "killed"
    codes, outputs = run_job(*job(clean), REPO, timeout=420)
    assert codes == [0, 0], describe(codes, outputs)
    ahead = kill_between_backups(*job(killed), REPO,
                                 [killed / "backup", killed / "workers" / "worker-1" / "backup"])
    codes, outputs = run_job(*job(killed), REPO, timeout=420)
    assert codes == [0, 0], describe(codes, outputs)
    assert "the newest that every process holds" in outputs[ahead]
    assert_same_weights(killed / "pretrainer.weights.h5", clean / "pretrainer.weights.h5")


# Three 2-worker runs in fresh processes: about 1.5 min on 2 cores (3 on a loaded machine).
# Not in CI (time): the JAX fine-tuning and one-process pretraining SIGTERM tests are; make
# test-all runs it.
@pytest.mark.integration
@pytest.mark.slow
def test_a_sigterm_to_one_worker_stops_every_worker_and_the_rerun_resumes(data, tmp_path):
    """TensorFlow's coordination service catches SIGTERM (a scheduler's preemption or
    stop): a SIGTERM to worker 1 after its first backup, and the job trained on to its
    last step (exit codes [0, 0], measured). Both workers now stop at one agreed training
    call, each with the same line; the rerun resumes and ends with the uninterrupted run's
    weights (with dropout, --deterministic)."""
    import signal

    def job(out):
        command = [*_args(data, out, "--distribution_strategy=multi_worker_mirrored",
                          "--deterministic", "--seed=3"),
                   "--num_train_steps=300", "--save_checkpoints_steps=20"]
        return [command, command], _tf_worker_envs(2)

    clean, stopped = tmp_path / "clean", tmp_path / "stopped"
    codes, outputs = run_job(*job(clean), REPO, timeout=600)
    assert codes == [0, 0], describe(codes, outputs)
    backup = stopped / "workers" / "worker-1" / "backup" / "training_metadata.json"
    codes, outputs = run_job(*job(stopped), REPO, timeout=600,
                             signal_when=(backup.exists, 1, signal.SIGTERM))
    assert_preempted(codes, outputs, "rerun the same command on every host to resume "
                     "from the newest backup")
    assert not (stopped / "pretrainer.weights.h5").exists()
    codes, outputs = run_job(*job(stopped), REPO, timeout=600)
    assert codes == [0, 0], describe(codes, outputs)
    assert all("Resuming from" in output for output in outputs)
    assert_same_weights(stopped / "pretrainer.weights.h5", clean / "pretrainer.weights.h5")


# --- JAX across processes (multi_worker_mirrored: keras.distribution.initialize) ---


@pytest.mark.parametrize("flags,message", [
    (dict(num_processes=2, process_id=2),
     "--process_id=2: expected 0 to num_processes - 1 = 1 (each process of the job its own "
     "index; process 0 is the coordinator)"),
    (dict(process_id=-1), "--process_id=-1: expected 0 to num_processes - 1"),
    (dict(num_processes=0), "--num_processes must be >= 1, got 0"),
    (dict(coordinator_address="10.0.0.1"),
     "--coordinator_address='10.0.0.1': expected HOST:PORT of process 0 (e.g. 10.0.0.1:8476)"),
    (dict(coordinator_address="10.0.0.1:http"), "--coordinator_address='10.0.0.1:http'"),
    (dict(num_cpu_devices=0), "--num_cpu_devices must be >= 1, got 0")])
def test_bad_process_flags_are_one_line_before_anything_runs(flags, message, capsys):
    options = PretrainingOptions(input_file="x", output_dir="y", preset="tiny",
                                 distribution_strategy="multi_worker_mirrored", **flags)
    assert cli.report_errors(options.validate) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {message}"), err


@pytest.mark.parametrize("environment, message", [
    (dict(KERAS_DISTRIBUTION_JOB_ADDRESSES="localhost,10.0.0.2:8476"),
     "$KERAS_DISTRIBUTION_JOB_ADDRESSES='localhost': expected HOST:PORT of process 0 (e.g. "
     "10.0.0.1:8476)"),
    (dict(KERAS_DISTRIBUTION_NUM_PROCESSES="two"),
     "$KERAS_DISTRIBUTION_NUM_PROCESSES='two': expected an integer (the number of processes)"),
    (dict(KERAS_DISTRIBUTION_NUM_PROCESSES="0"),
     "$KERAS_DISTRIBUTION_NUM_PROCESSES must be >= 1, got 0"),
    (dict(KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID="5"),
     "$KERAS_DISTRIBUTION_PROCESS_ID=5: expected 0 to num_processes - 1 = 1 (each process of "
     "the job its own index; process 0 is the coordinator)")],
    ids=["address", "count", "no_process", "index"])
def test_bad_process_variables_are_one_line(environment, message, monkeypatch):
    """Keras' variables stand for the flags; JAX's error for an address without a port was
    an IndexError traceback."""
    for name in KERAS_PROCESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(distribute.StrategyError) as error:
        distribute._resolve_processes("", None, None)
    assert str(error.value) == message
    # A flag given takes the variable's place: nothing of it is checked then.
    assert distribute._resolve_processes("10.0.0.1:8476", 2, 1)[:3] == ("10.0.0.1:8476", 2, 1)


def test_process_flags_are_jaxs(monkeypatch):
    """TensorFlow reads its cluster from TF_CONFIG; on JAX the flags need multi_worker_mirrored
    (both refused before any process is joined)."""
    with pytest.raises(distribute.StrategyError, match=r"^--coordinator_address, "
                       r"--process_id: JAX's \(KERAS_BACKEND=jax with --distribution_strategy="
                       r"multi_worker_mirrored\); on TensorFlow multi_worker_mirrored reads the "
                       r"cluster from TF_CONFIG$"):
        distribute.get_distribution("multi_worker_mirrored", coordinator_address="h:1",
                                    process_id=0)
    monkeypatch.setattr(distribute.keras.backend, "backend", lambda: "jax")
    with pytest.raises(distribute.StrategyError, match=r"^--num_processes: for processes "
                       "joined by --distribution_strategy=multi_worker_mirrored, found "
                       "--distribution_strategy=mirrored$"):
        distribute.get_distribution("mirrored", num_processes=2)


# One process of a 2-process JAX job: joined through the tools' flags, it trains a model whose
# metrics count the rows of every global batch and sum their ids (0..23, each once), and lists
# the rows Keras' DataParallel leaves this process of the global batches.
_JAX_PROCESS = textwrap.dedent("""
    import sys
    import keras, numpy as np, tensorflow as tf
    from keras import ops
    from bert_keras import distribute
    options = distribute.DistributionOptions(
        distribution_strategy="multi_worker_mirrored", coordinator_address=sys.argv[1],
        num_processes=2, process_id=int(sys.argv[2]))
    d = options.distribution()
    print("REPR", d)
    print("CHIEF", d.is_chief, "WORKER", d.worker_name, "PROCESSES", d.num_processes)

    class Total(keras.metrics.Metric):  # Over the global batch the train step sees.
        def __init__(self, name, of):
            super().__init__(name=name)
            self.of = of
            self.total = self.add_variable((), initializer="zeros", name="total")
        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(ops.sum(self.of(ops.cast(y_true, "float32"))))
        def result(self):
            return ops.convert_to_tensor(self.total)

    ids = tf.data.Dataset.range(24).map(lambda i: (tf.cast([i], "float32"),
                                                    tf.cast([i], "float32")))
    global_batches = ids.batch(8, drop_remainder=True)
    shares = [[int(v) for v in x[:, 0]] for x, _ in
              d.keras_distribution.distribute_dataset(global_batches)]
    print("SHARES", shares)
    keras.utils.set_random_seed(1)
    with d.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=[
            Total("rows", ops.ones_like), Total("ids", lambda y: y)])
        history = model.fit(global_batches, epochs=1, steps_per_epoch=3, verbose=0)
    print("SEEN", int(history.history["rows"][-1]), int(history.history["ids"][-1]))
    local = d.on_one_device(model)
    print("LOCAL", len(local.weights[0].value.sharding.device_set),
          np.array_equal(local.get_weights()[0], model.get_weights()[0]))
""")


@pytest.mark.integration  # Two JAX processes: about 30 s on 2 cores.
def test_jax_processes_feed_their_share_of_each_global_batch():
    commands = [[sys.executable, "-c", _JAX_PROCESS, flags[0].split("=", 1)[1], str(index)]
                for index, flags in enumerate(jax_process_flags(2))]
    codes, outputs = run_job(commands, [backend_env("jax")] * 2, REPO, timeout=300)
    assert codes == [0, 0], describe(codes, outputs)
    lines = [dict(line.split(" ", 1) for line in out.splitlines()
                  if line.startswith(("REPR", "CHIEF", "SHARES", "SEEN", "LOCAL")))
             for out in outputs]
    for index, found in enumerate(lines):
        assert found["REPR"] == ("multi_worker_mirrored (DataParallel) with 2 replica(s) over 2 "
                                 "processes")
        assert found["CHIEF"] == f"{index == 0} WORKER process-{index} PROCESSES 2"
        # Process p: rows 4p..4p+3 of every global batch of 8 (Keras' rebatch and shard).
        assert found["SHARES"] == str([[8 * b + 4 * index + i for i in range(4)]
                                       for b in range(3)])
        # The train step saw the 3 global batches of 8 once each: 24 rows, ids 0..23 (276);
        # with every process feeding whole batches it would be 48 rows and 552.
        assert found["SEEN"] == "24 276"
        # Evaluation and prediction run on a copy on this process's own device.
        assert found["LOCAL"] == "1 True"


@pytest.mark.integration  # Two JAX processes: about 15 s on 2 cores.
def test_jax_processes_join_through_keras_variables_alone():
    """KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and _PROCESS_ID in place of the
    flags (what a launcher sets), process 0's port probed through them."""
    (port,) = free_ports(1)
    code = ("from bert_keras import distribute\n"
            "print('REPR', distribute.DistributionOptions("
            "distribution_strategy='multi_worker_mirrored').distribution())")
    envs = [dict(backend_env("jax"), KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                 KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(i))
            for i in range(2)]
    processes = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for env in envs]  # run_job would drop the variables this test is about.
    try:
        outputs = [p.communicate(timeout=300)[0] for p in processes]
    finally:
        for p in processes:
            p.kill()
    codes = [p.returncode for p in processes]
    assert codes == [0, 0], describe(codes, outputs)
    for output in outputs:
        assert ("REPR multi_worker_mirrored (DataParallel) with 2 replica(s) over 2 processes"
                in output), output[-2000:]


def test_jax_processes_without_a_coordinator_are_one_line(data, tmp_path):
    """No --coordinator_address, no $KERAS_DISTRIBUTION_JOB_ADDRESSES, no cluster JAX knows."""
    result = subprocess.run(
        _args(data, tmp_path / "out", "--distribution_strategy=multi_worker_mirrored",
              "--num_processes=2", "--process_id=1"), cwd=REPO, env={
            k: v for k, v in backend_env("jax").items() if k not in KERAS_PROCESS_VARIABLES},
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: --coordinator_address: expected HOST:PORT of process 0 for "
        "--distribution_strategy=multi_worker_mirrored on JAX (or "
        "$KERAS_DISTRIBUTION_JOB_ADDRESSES), found none, and JAX found no cluster")
    assert not (tmp_path / "out").exists()  # Refused before anything was written.


def test_a_coordinator_port_in_use_is_one_line():
    """On a port another program listens on, JAX's coordination service (process 0) died of
    a segmentation fault; the port is probed first."""
    import socket

    (port,) = free_ports(1)
    holder = socket.socket()
    holder.bind(("0.0.0.0", port))
    holder.listen()
    try:
        with pytest.raises(distribute.StrategyError, match=(
                rf"^--coordinator_address=127.0.0.1:{port}: process 0 serves the job on port "
                rf"{port} of this host, and cannot listen there \(Address already in use\)")):
            distribute._check_port_free(f"127.0.0.1:{port}")
    finally:
        holder.close()
    distribute._check_port_free(f"127.0.0.1:{port}")  # Free again.


_JOIN = textwrap.dedent("""
    import sys
    from bert_keras import distribute
    distribute._join_processes(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), timeout_s=5)
""")


@pytest.mark.integration  # Two JAX processes that wait 5 s each: about 30 s on 2 cores.
@pytest.mark.parametrize("process_id, num_processes, found", [
    (0, 2, "this is process 0, the coordinator, at 127.0.0.1:{port}; not every other process "
           "registered"),
    (1, 2, "this is process 1; nothing answers at 127.0.0.1:{port} (process 0 not started, "
           "another address, or a firewall)")], ids=["coordinator_alone", "no_coordinator"])
def test_processes_that_do_not_all_join_stop_in_one_line(process_id, num_processes, found):
    """A job whose processes never all join (a host not started, a wrong address or count)
    waited in jax.distributed.initialize for 300 s, and JAX then aborted from C++ with a
    stack trace; the join's watchdog ends the process first, with one line (at 5 s here,
    290 s in the tools)."""
    (port,) = free_ports(1)
    result = subprocess.run(
        [sys.executable, "-c", _JOIN, f"127.0.0.1:{port}", str(num_processes), str(process_id)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={
            k: v for k, v in backend_env("jax").items() if k not in KERAS_PROCESS_VARIABLES})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "stack trace" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --distribution_strategy=multi_worker_mirrored: the 2 processes of this job did "
        f"not all join within 5 s ({found.format(port=port)}); start every process with the "
        "same --coordinator_address (HOST:PORT of process 0, reachable from every host) and "
        "--num_processes, each with its own --process_id")


_CLUSTER = {"worker": ["10.0.0.1:12345", "10.0.0.2:12345"]}


@pytest.mark.parametrize("tf_config, message", [
    ("{bad", "TF_CONFIG: expected JSON {\"cluster\": {\"worker\": [\"HOST:PORT\", ...]}, "
             "\"task\": {\"type\": \"worker\", \"index\": I}} ("
             f"{os.path.realpath(os.path.join(REPO, 'docs', 'distributed.md'))}), found text "
             "that is not JSON (Expecting property name"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), 'found no "cluster"'),
    (json.dumps({"cluster": _CLUSTER}),
     'found no "task" with a type and an index (this process\'s place in the cluster): None'),
    (json.dumps({"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}),
     "found cluster 'worker': ['localhost'] (every address HOST:PORT)"),
    (json.dumps({"cluster": _CLUSTER, "task": {"type": "worker", "index": 2}}),
     "TF_CONFIG: task 'worker' index 2 is not in the cluster (worker: 2)"),
    (json.dumps({"cluster": _CLUSTER, "task": {"type": "chief", "index": 0}}),
     "TF_CONFIG: task 'chief' index 0 is not in the cluster (worker: 2)"),
], ids=["not_json", "no_cluster", "no_task", "no_port", "index_out_of_range", "no_such_type"])
def test_a_tf_config_tensorflow_cannot_use_is_one_line(tf_config, message, monkeypatch):
    """TensorFlow's own errors for these were tracebacks from inside the strategy (a JSON
    decoding error, "The `task_id` 2 exceeds the maximum id of worker", "Could not parse
    port for local server"); they are refused before the strategy is made."""
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(distribute.StrategyError) as error:
        distribute.get_strategy("multi_worker_mirrored")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_tf_config_names_this_task_and_the_cluster_size(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": dict(_CLUSTER, chief=["10.0.0.3:12345"]), "task": {"type": "worker",
                                                                       "index": "1"}}))
    assert distribute._tf_config_task() == ("worker", 1, 3)
    monkeypatch.setenv("TF_CONFIG", "")
    assert distribute._tf_config_task() is None  # One worker, as TensorFlow reads it.


@pytest.mark.integration  # One TensorFlow tool process: about 15 s on 2 cores.
def test_run_pretraining_with_a_bad_tf_config_is_one_line(data, tmp_path):
    env = backend_env("tensorflow", TF_CONFIG=json.dumps(
        {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 1}}))
    result = subprocess.run(_args(data, tmp_path / "out",
                                  "--distribution_strategy=multi_worker_mirrored"),
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: TF_CONFIG: task 'worker' index 1 is not in the cluster (worker: 1)")
    assert not (tmp_path / "out").exists()


@pytest.mark.integration  # One TensorFlow process: about 10 s on 2 cores.
def test_a_worker_tensorflow_cannot_start_is_one_line():
    """TF_CONFIG is sound but this worker's port is taken: TensorFlow's own error was a
    traceback (UnknownError from the gRPC server)."""
    import socket

    ports = free_ports(2)
    holder = socket.socket()
    holder.bind(("0.0.0.0", ports[0]))
    holder.listen()
    code = ("import sys\nfrom bert_keras import distribute\nfrom data_prep import cli\n"
            "sys.exit(cli.report_errors(lambda: distribute.get_strategy("
            "'multi_worker_mirrored'), (distribute.StrategyError,)))")
    env = backend_env("tensorflow", TF_CONFIG=json.dumps(
        {"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
         "task": {"type": "worker", "index": 0}}))
    try:
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)
    finally:
        holder.close()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: TF_CONFIG: TensorFlow could not start this worker of the cluster: Could not "
        "start gRPC server")
