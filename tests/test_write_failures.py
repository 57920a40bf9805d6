"""Writes that fail part-way (a full disk, the file-size limit, a read-only place), an
unwritable place refused before the work, and outputs named by a symbolic link.

A full disk (ENOSPC) cannot be made without root; the file-size limit (RLIMIT_FSIZE, which
makes a write past it fail with EFBIG, as Python ignores SIGXFSZ) takes the same paths
through Python's, h5py's, zipfile's and TensorFlow's writers. Each tool runs as users run
it, in a fresh process whose limit its output crosses part-way, and must end with exit
status 1 and one line `error: <output>: cannot be written: <why>` (no traceback), leave
nothing under the output's name and no temporary, and succeed when run again without the
limit. Before, every tool printed a traceback (OSError or TensorFlow's OutOfRangeError),
the ones that printed a line named no file ("error: [Errno 27] File too large"), and
run_pretraining's checkpoint died of a segmentation fault inside HDF5.
"""

import contextlib
import errno
import io
import json
import os
import resource
import subprocess
import sys

import numpy as np
import pytest
from cli_harness import run_tool
from read_only import unwritable_directory

from data_prep import cli, features, files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(REPO, "tests", "testdata")
LIMIT = 24 * 1024  # bytes a file may have in the limited processes


def _limited(limit, argv):
    """`argv` run with its files limited to `limit` bytes (a multiple of 1024): bash's
    `ulimit -f` (1024-byte blocks) then exec, not a `preexec_fn`, which runs Python
    between fork and exec in a test process that may hold JAX's or TensorFlow's threads
    (a deadlock risk; Python warns of it)."""
    assert limit % 1024 == 0, limit
    return ["bash", "-c", f'ulimit -f {limit // 1024} && exec "$@"', "bash", *map(str, argv)]


def _run(module, *args, limit=None, timeout=300):
    """`python -m module args` in a fresh process, its files limited to `limit` bytes."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop(cli.DEBUG_ENV, None)
    argv = [sys.executable, "-m", module, *map(str, args)]
    return subprocess.run(_limited(limit, argv) if limit else argv, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _leftovers(directory):
    return sorted(os.path.relpath(os.path.join(d, n), directory)
                  for d, dirs, names in os.walk(directory) for n in names + dirs
                  if n.startswith(files.TEMP_PREFIX))


def _assert_one_line_naming(proc, output, limit=LIMIT):
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, \
        proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (f"error: {output}: cannot be written: file too large: over this "
                    f"process's file-size limit of {limit:,} bytes (ulimit -f); raise the "
                    "limit, or write elsewhere"), proc.stderr[-3000:]


def _word_corpus(path, documents, seed=0):
    """Documents of 5 sentences of 10 random lowercase words (no two alike)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            for _ in range(5):
                f.write(" ".join("".join(rng.choice(letters, rng.integers(3, 10)))
                                 for _ in range(10)) + " .\n")
            f.write("\n")
    return str(path)


# --- The boundary: one line for every writer's way of saying it. ---


def _line(e):
    def fail():
        raise e

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.report_errors(fail)
    return code, err.getvalue()


def test_every_writers_failure_for_want_of_room_is_one_line_naming_the_file():
    import safetensors
    import tensorflow as tf

    temp = os.path.join("/data/run [1]", ".incomplete-123.x-00001-of-00003.tfrecord")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    too_large = ("file too large: over this process's file-size limit of "
                 f"{limit:,} bytes (ulimit -f); raise the limit, or write elsewhere"
                 if limit != resource.RLIM_INFINITY else
                 "file too large for its file system; write elsewhere")
    no_space = "no space left on its device; free some space, or write elsewhere"
    cases = [
        # TensorFlow's TFRecordWriter (the shard's temporary name: the line gives the final)
        (tf.errors.OutOfRangeError(None, None, f"{temp}; File too large"),
         f"error: /data/run [1]/x-00001-of-00003.tfrecord: cannot be written: {too_large}"),
        # SaveV2, with its op context and its own temporary suffix
        (tf.errors.ResourceExhaustedError(None, None, (
            "{{function_node __wrapped__SaveV2_dtypes_39_device_/job:localhost/replica:0/"
            "task:0/device:CPU:0}} /out/.incomplete-7.g.data-00000-of-00001.tempstate5392; "
            "No space left on device [Op:SaveV2]")),
         f"error: /out/g.data-00000-of-00001: cannot be written: {no_space}"),
        # Beam's runner, quoting its worker's
        (RuntimeError("Traceback (most recent call last):\n  ...\ntensorflow.python.framework."
                      "errors_impl.OutOfRangeError: /b/.incomplete-5.x-00001-of-00002.tfrecord; "
                      "File too large [while running 'WriteShards']"),
         f"error: /b/x-00001-of-00002.tfrecord: cannot be written: {too_large}"),
        # The TensorBoard writer's flush
        (tf.errors.ResourceExhaustedError(None, None, (
            "{{function_node __wrapped__WriteSummary_device_/job:localhost/replica:0/task:0/"
            "device:CPU:0}} /run/logs/train/events.out.tfevents.1.vm.2.0.v2; No space left on "
            "device\n\tFailed to flush ")),
         f"error: /run/logs/train/events.out.tfevents.1.vm.2.0.v2: cannot be written: "
         f"{no_space}"),
        # Python's and h5py's: no file named
        (OSError(errno.EFBIG, "File too large"), f"error: cannot be written: {too_large}"),
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/x.json"),
         "error: /mnt/ro/x.json: cannot be written: the file system is read-only; write "
         "elsewhere"),
        # safetensors' (Rust's io::Error)
        (safetensors.SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"),
         f"error: cannot be written: {no_space}"),
    ]
    for e, expected in cases:
        code, err = _line(e)
        assert (code, err) == (1, expected + "\n"), (e, err)
    # Reading: not a write failure; Python's PermissionError still names its file.
    code, err = _line(PermissionError(errno.EACCES, "Permission denied", "/in/a.txt"))
    assert (code, err) == (1, "error: /in/a.txt: Permission denied\n")
    # A bug keeps its traceback.
    with pytest.raises(OSError):
        cli.report_errors(lambda: (_ for _ in ()).throw(OSError(errno.EBADF, "Bad fd")))


_ATOMIC_SCRIPT = """
import json, os, sys
from data_prep import files
out = sys.argv[1]


def _directory(path):
    with files.atomic_output(path, directory=True) as tmp:
        files.write_text(os.path.join(tmp, "small.txt"), "ok")
        with open(os.path.join(tmp, "big.bin"), "wb") as f:
            f.write(b"0" * 40000)


results = {}
for name, write in (
        ("file", lambda: files.write_text(os.path.join(out, "a", "big.txt"), "x" * 40000)),
        ("directory", lambda: _directory(os.path.join(out, "b", "export")))):
    try:
        write()
        results[name] = None
    except files.OutputWriteError as e:
        results[name] = [e.errno, e.filename, e.strerror]
print(json.dumps(results))
"""


def test_atomic_output_names_the_output_and_leaves_nothing(tmp_path):
    """Python's EFBIG names no file; the writer's error names the output's final name (not
    its temporary), and takes back the temporary and the directories it created."""
    proc = subprocess.run(_limited(LIMIT, [sys.executable, "-c", _ATOMIC_SCRIPT, tmp_path]),
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    why = (f"cannot be written: file too large: over this process's file-size limit of "
           f"{LIMIT:,} bytes (ulimit -f); raise the limit, or write elsewhere")
    assert results == {"file": [errno.EFBIG, str(tmp_path / "a" / "big.txt"), why],
                       "directory": [errno.EFBIG, str(tmp_path / "b" / "export"), why]}
    assert os.listdir(tmp_path) == []


def test_a_temporary_in_a_read_only_directory_is_named_by_the_output(tmp_path, monkeypatch):
    """A permission error on the temporary names the output (before: the temporary,
    `.incomplete-<pid>.<name>`, which the user never named). `check_writable` finds such a
    place before the block; one that became read-only after it (here: the check skipped)
    fails on the temporary."""
    monkeypatch.setattr(files, "check_writable", lambda paths: None)
    ro = tmp_path / "ro"
    ro.mkdir()
    with unwritable_directory(ro), pytest.raises(files.OutputWriteError) as caught:
        files.write_text(str(ro / "vocab.txt"), "x\n")
    assert caught.value.filename == str(ro / "vocab.txt")
    assert caught.value.strerror == ("cannot be written: permission denied (its directory is "
                                     "not writable); write elsewhere")
    assert os.listdir(ro) == []


def test_an_output_whose_parent_is_a_file_is_one_line_and_leaves_nothing(tmp_path):
    (tmp_path / "afile").write_text("keep")
    result = run_tool("prepare_corpus", [f"--input={os.path.join(TESTDATA, 'pretrain_corpus.txt')}",
                                         f"--output_file={tmp_path / 'afile' / 'corpus.txt'}"])
    assert result.code == 1 and len(result.error_lines) == 1, result.stderr
    assert str(tmp_path / "afile") in result.error_lines[0]
    assert "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["afile"]
    assert (tmp_path / "afile").read_text() == "keep"


# --- An unwritable place, found before the work. ---


def _unwritable_line(output, place=None):
    """The line of an output whose place refuses files: its own directory, or `place`, the
    nearest existing ancestor where its directory would be made."""
    where = f"{place} is not writable" if place else "its directory is not writable"
    return f"error: {output}: cannot be written: permission denied ({where}); write elsewhere"


def test_check_writable_names_the_output_and_what_refuses_it(tmp_path):
    """A file where a directory would be made, a directory this process cannot create a
    file in (also as root: read_only.py), or an unwritable ancestor of missing directories:
    one OutputWriteError naming the output; nothing is created, and a place that can be
    written passes (no probe left behind)."""
    (tmp_path / "afile").write_text("keep")
    ro = tmp_path / "ro"
    ro.mkdir()
    with pytest.raises(files.OutputWriteError) as caught:
        files.check_writable([str(tmp_path / "afile" / "sub" / "vocab.txt")])
    assert (caught.value.errno, caught.value.filename, caught.value.strerror) == (
        errno.ENOTDIR, str(tmp_path / "afile" / "sub" / "vocab.txt"),
        f"cannot be written: {tmp_path / 'afile'} is a file, not a directory; write elsewhere")
    with unwritable_directory(ro):
        for output, place in ((ro / "vocab.txt", None), (ro / "a" / "b" / "vocab.txt", ro)):
            code, err = _line(_raised(files.check_writable, [str(output)]))
            assert (code, err) == (1, _unwritable_line(output, place) + "\n")
        # A link is checked where it points (as atomic_output writes through it).
        link = tmp_path / "link.txt"
        link.symlink_to(ro / "vocab.txt")
        with pytest.raises(files.OutputWriteError) as caught:
            files.check_writable([str(link)])
        assert caught.value.filename == str(ro / "vocab.txt")
        files.check_writable([str(tmp_path / "new" / "vocab.txt"), "gs://bucket/vocab.txt"])
    assert sorted(os.listdir(tmp_path)) == ["afile", "link.txt", "ro"]
    assert os.listdir(ro) == []


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 -- the error is what is returned
        return e
    raise AssertionError(f"{fn.__name__}{args} raised nothing")


def test_atomic_output_refuses_an_unwritable_place_before_its_block(tmp_path):
    """The line a tool that checked first gives, not "<dir>: Permission denied" (the
    directory that could not be made) nor "<file>: already exists"."""
    (tmp_path / "afile").write_text("keep")
    ran = []
    with pytest.raises(files.OutputWriteError) as caught:
        with files.atomic_output(str(tmp_path / "afile" / "out" / "x.txt")):
            ran.append(True)
    assert caught.value.errno == errno.ENOTDIR and ran == []
    ro = tmp_path / "ro"
    ro.mkdir()
    with unwritable_directory(ro):
        e = _raised(files.write_text, str(ro / "sub" / "x.txt"), "x")
    assert _line(e) == (1, _unwritable_line(ro / "sub" / "x.txt", ro) + "\n")
    assert sorted(os.listdir(tmp_path)) == ["afile", "ro"] and os.listdir(ro) == []


class _Reached(Exception):
    """The tool reached its expensive step: it found its unwritable output too late."""


def _not_reached(*args, **kwargs):
    raise _Reached("the work began before the output's place was checked")


def _classification_rows(path, rated=False):
    rows = [{"text": "the man went to the store", "label": 0.25 if rated else "a"},
            {"text": "john was born in the city", "label": 0.75 if rated else "b"}] * 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# Tool -> (its arguments, with {W} the work directory and {O} the unwritable one; the
# output its line names; the module attribute that starts its work, which must not run).
_BEFORE_THE_WORK = {
    "build_vocab": (
        "--input={T}/pretrain_corpus.txt --output={O}/vocab.txt --vocab_size=300 "
        "--layout=compact", "{O}/vocab.txt", ("data_prep.build_vocab", "build_vocab")),
    "create_pretraining_data": (
        "--input_file={T}/pretrain_corpus.txt --vocab_file={T}/pretrain_vocab.txt "
        "--output_file={O}/train.tfrecord --max_seq_length=32 --max_predictions_per_seq=5",
        "{O}/train.tfrecord", ("data_prep.create_pretraining_data", "run_worker")),
    # Evaluation-only fine-tuning: results were written after the evaluation.
    "run_classifier": (
        "--vocab_file={T}/ft_vocab.txt --init_checkpoint={W}/model --do_eval "
        "--eval_file={W}/cls.jsonl --output_dir={O}", "{O}/eval_results.json",
        ("bert_keras.finetuning.runner", "_model_and_vocabulary")),
    "run_regressor": (
        "--vocab_file={T}/ft_vocab.txt --init_checkpoint={W}/model --do_eval "
        "--eval_file={W}/rated.jsonl --output_dir={O}", "{O}/eval_results.json",
        ("bert_keras.finetuning.runner", "_model_and_vocabulary")),
    "run_tagger": (
        "--vocab_file={T}/ft_vocab.txt --init_checkpoint={W}/model --do_predict "
        "--predict_file={T}/ft_conll2003.txt --output_dir={O}", "{O}/predictions.conll",
        ("bert_keras.finetuning.runner", "_model_and_vocabulary")),
    "run_squad": (
        "--vocab_file={T}/ft_vocab.txt --init_checkpoint={W}/model --do_predict "
        "--predict_file={T}/ft_squad_v1.json --output_dir={O}", "{O}/predictions.json",
        ("bert_keras.finetuning.runner", "_model_and_vocabulary")),
    "run_pretraining": (  # Google's evaluation-only run
        "--do_train=false --do_eval --input_file={W}/data.tfrecord --init_checkpoint={W}/model "
        "--output_dir={O} --max_seq_length=16 --max_predictions_per_seq=4",
        "{O}/eval_results.json", ("bert_keras.run_pretraining", "load_initial_weights")),
    "extract_features": (
        "--input_file={W}/lines.txt --output_file={O}/features.npz --init_checkpoint={W}/model",
        "{O}/features.npz", ("bert_keras.model_loading", "load_checkpoint")),
    "convert_checkpoint": (
        "--from=hf --to=keras --input={W}/model --output={O}/encoder",
        "{O}/encoder", ("bert_keras.convert_checkpoint", "_load")),
    "export_encoder": (
        "--init_checkpoint={W}/model --export_dir={O} --version=3", "{O}/3",
        ("bert_keras.model_loading", "load_checkpoint")),
    "export_classifier": (
        "--model_dir={W}/model --export_dir={O}", "{O}/1",
        ("bert_keras.model_loading", "load_checkpoint")),
}


@pytest.mark.parametrize("tool", sorted(_BEFORE_THE_WORK))
def test_an_unwritable_output_is_refused_before_the_work(tmp_path, monkeypatch, tool):
    """Every tool whose first write came after its work (training a vocabulary, an
    evaluation, loading and tracing a model) refused an unwritable output only then, minutes
    to hours later; now in the line the write would have ended with, before the work."""
    import importlib

    args, output, (module, name) = _BEFORE_THE_WORK[tool]
    work, ro = tmp_path / "work", tmp_path / "ro"
    work.mkdir()
    ro.mkdir()
    _classification_rows(work / "cls.jsonl")
    _classification_rows(work / "rated.jsonl", rated=True)
    (work / "lines.txt").write_text("the man went to the store ||| he bought milk\n")
    (work / "data.tfrecord").write_bytes(b"")
    (work / "model").mkdir()  # what the work would load (it never gets that far)
    monkeypatch.setattr(importlib.import_module(module), name, _not_reached)
    fill = dict(T=TESTDATA, W=work, O=ro)
    with unwritable_directory(ro):
        result = run_tool(tool, args.format(**fill).split())
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (result.code, result.error_lines) == (
        1, [_unwritable_line(output.format(**fill))]), result.stderr[-3000:]
    assert os.listdir(ro) == [] and sorted(os.listdir(work)) == [
        "cls.jsonl", "data.tfrecord", "lines.txt", "model", "rated.jsonl"]


def test_public_data_prepare_refuses_an_unwritable_place_before_fetching(tmp_path, monkeypatch,
                                                                         capsys):
    from public_data import prepare

    monkeypatch.setattr(prepare, "spam_split", _not_reached)
    (tmp_path / "afile").write_text("keep")
    out = tmp_path / "afile" / "spam"
    assert prepare.main(["spam", f"--output_dir={out}", "--train_size=20",
                         "--test_size=10"]) == 1
    assert capsys.readouterr().err == (
        f"public_data.prepare: error: {out / 'summary.json'}: cannot be written: "
        f"{tmp_path / 'afile'} is a file, not a directory; write elsewhere\n")


# --- Weights files: HDF5 must not be left to fail. ---


_WEIGHTS_SCRIPT = """
import os, sys
import keras
from bert_keras import checkpoints
model = keras.Sequential([keras.Input((16,))] + [keras.layers.Dense(40) for _ in range(12)])
path = sys.argv[1]
try:
    checkpoints.save_weights(model, path)
    print("written")
except OSError as e:
    print("OSError", e.errno, e.filename)
"""


def test_a_weights_file_past_the_limit_is_an_oserror_not_a_crash(tmp_path):
    """Keras' own save_weights, failing part-way, left HDF5 retrying its metadata on every
    close: h5py printed "Exception ignored" tracebacks by the hundred and the process died
    of a segmentation fault (run_pretraining's checkpoint, exit status 139)."""
    path = tmp_path / "x.weights.h5"
    proc = subprocess.run(_limited(LIMIT, [sys.executable, "-c", _WEIGHTS_SCRIPT, path]),
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["OSError", str(errno.EFBIG), "None"], proc.stdout
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


def test_save_weights_writes_what_keras_writes_and_reads(tmp_path):
    import h5py
    import keras

    from bert_keras import checkpoints

    def model():
        m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7), keras.layers.Dense(3)])
        m.compile(optimizer="adam", loss="mse")
        return m

    ours = model()
    ours.fit(np.arange(15.0).reshape(3, 5), np.ones((3, 3)), verbose=0)
    checkpoints.save_weights(ours, str(tmp_path / "ours.weights.h5"))
    ours.save_weights(str(tmp_path / "keras.weights.h5"))

    def datasets(path):
        found = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj: found.__setitem__(name, obj[()])
                         if isinstance(obj, h5py.Dataset) else None)
        return found

    a, b = datasets(tmp_path / "ours.weights.h5"), datasets(tmp_path / "keras.weights.h5")
    assert sorted(a) == sorted(b) and len(a) > 4
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    loaded = model()
    loaded.optimizer.build(loaded.trainable_variables)
    loaded.load_weights(str(tmp_path / "ours.weights.h5"))
    for got, want in zip(loaded.get_weights() + [v.numpy() for v in loaded.optimizer.variables],
                         ours.get_weights() + [v.numpy() for v in ours.optimizer.variables],
                         strict=True):
        np.testing.assert_array_equal(got, want)


# --- The tools, as users run them, past the limit. ---


def test_prepare_corpus_past_the_limit(tmp_path):
    corpus = _word_corpus(tmp_path / "raw.txt", 200)
    out = tmp_path / "out" / "corpus.txt"
    _assert_one_line_naming(_run("data_prep.prepare_corpus", f"--input={corpus}",
                                 f"--output_file={out}", limit=LIMIT), out)
    assert not (tmp_path / "out").exists()
    assert _run("data_prep.prepare_corpus", f"--input={corpus}",
                f"--output_file={out}").returncode == 0
    assert os.path.getsize(out) > LIMIT


@pytest.mark.integration  # ~14 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_build_vocab_past_the_limit(tmp_path):
    corpus = _word_corpus(tmp_path / "raw.txt", 200)
    out = tmp_path / "vocab" / "vocab.txt"
    args = [f"--input={corpus}", f"--output={out}", "--vocab_size=2000", "--layout=compact"]
    limit = 8 * 1024
    _assert_one_line_naming(_run("data_prep.build_vocab", *args, limit=limit), out, limit)
    assert not (tmp_path / "vocab").exists()
    assert _run("data_prep.build_vocab", *args).returncode == 0
    assert os.path.getsize(out) > limit and (tmp_path / "vocab" / "tokenizer_config.json").exists()


def _cpd_args(tmp_path, *extra):
    corpus = _word_corpus(tmp_path / "raw.txt", 120)
    vocab = tmp_path / "vocab.txt"
    words = sorted({w for line in open(corpus) for w in line.split()})
    vocab.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                             + words))
    return [f"--input_file={corpus}", f"--vocab_file={vocab}", "--max_seq_length=24",
            "--max_predictions_per_seq=4", "--dupe_factor=2", *extra]


@pytest.mark.integration  # ~14 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_create_pretraining_data_past_the_limit(tmp_path):
    out = tmp_path / "data"
    args = _cpd_args(tmp_path, f"--output_file={out / 'train.tfrecord'}")
    _assert_one_line_naming(_run("data_prep.create_pretraining_data", *args, limit=LIMIT),
                            out / "train.tfrecord")
    assert not out.exists()
    assert _run("data_prep.create_pretraining_data", *args).returncode == 0
    assert sorted(os.listdir(out)) == ["train.tfrecord", "train.tfrecord.meta.json"]


@pytest.mark.integration  # two spawned workers importing TensorFlow: ~15 s on 2 cores
def test_create_pretraining_data_workers_and_gzip_shards_past_the_limit(tmp_path):
    """A worker's failed shard was its traceback squeezed into the error line."""
    out = tmp_path / "data"
    args = _cpd_args(tmp_path, f"--output_file={out / 'train'}", "--num_output_shards=2",
                     "--num_workers=2", "--gzip_compress")
    proc = _run("data_prep.create_pretraining_data", *args, limit=8 * 1024)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: worker ") and (
        f"{out / 'train'}-0000" in last and "-of-00002.tfrecord.gz: cannot be written: file "
        "too large" in last), last
    assert not out.exists()
    assert _run("data_prep.create_pretraining_data", *args).returncode == 0
    assert len(os.listdir(out)) == 4


@pytest.mark.integration  # fresh TensorFlow processes that train: ~40 s on 2 cores
def test_run_pretraining_checkpoint_past_the_limit_then_the_rerun(tmp_path):
    """The first checkpoint crosses the limit: one line naming it (before: 150 h5py
    tracebacks and a segmentation fault), nothing under its name; the rerun completes."""
    from pretraining_data import write_dataset

    train = write_dataset(tmp_path, num_files=1, per_file=8, max_seq_length=16,
                          max_predictions_per_seq=4, vocab_size=50)
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(dict(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=32, hidden_act="gelu",
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2,
        initializer_range=0.02)))
    out = tmp_path / "run"
    args = [f"--input_file={train}", f"--output_dir={out}", f"--bert_config_file={config}",
            "--max_seq_length=16", "--max_predictions_per_seq=4", "--train_batch_size=4",
            "--num_train_steps=4", "--save_checkpoints_steps=2", "--num_warmup_steps=0"]
    limit = 64 * 1024
    proc = _run("bert_keras.run_pretraining", *args, limit=limit)
    _assert_one_line_naming(proc, out / "checkpoints" / "ckpt-00000002.weights.h5", limit)
    assert os.listdir(out / "checkpoints") == [] and _leftovers(tmp_path) == []
    assert not (out / "encoder").exists()
    proc = _run("bert_keras.run_pretraining", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out / "checkpoints")) == ["ckpt-00000002.weights.h5",
                                                       "ckpt-00000004.weights.h5"]
    assert (out / "encoder" / files.ENCODER_WEIGHTS_FILE).exists()


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    from test_bad_inputs import build_fixtures

    return build_fixtures(str(tmp_path_factory.mktemp("fixtures")))


@pytest.mark.integration  # six fresh TensorFlow processes: ~60 s on 2 cores
@pytest.mark.parametrize("tool,args,output", [
    ("bert_keras.run_classifier",
     "--vocab_file={F}/vocab.txt --init_checkpoint={F}/encoder --max_seq_length=16 "
     "--train_batch_size=4 --num_train_steps=1 --do_train --train_file={F}/cls.jsonl "
     "--output_dir={W}/out", "{W}/out/model.keras"),
    ("bert_keras.extract_features",
     "--input_file={W}/lines.txt --output_file={W}/f.jsonl --init_checkpoint={F}/encoder "
     "--max_seq_length=16 --layers=-1,-2", "{W}/f.jsonl"),
    ("export.export_encoder", "--init_checkpoint={F}/encoder --export_dir={W}/exp "
     "--seq_length=16", "{W}/exp/1"),
    ("bert_keras.convert_checkpoint",
     "--from=hf --to=keras --input={F}/hf --output={W}/enc", "{W}/enc/model.keras"),
    ("bert_keras.convert_checkpoint",
     "--from=keras --to=hf --input={F}/encoder.keras --output={W}/hf", "{W}/hf"),
    ("bert_keras.convert_checkpoint",
     "--from=hf --to=google --model=encoder --input={F}/hf --output={W}/g/bert_model.ckpt",
     "{W}/g/bert_model.ckpt.data-00000-of-00001"),
], ids=["run_classifier", "extract_features", "export_encoder", "convert_to_keras_dir",
        "convert_to_hf", "convert_to_google"])
def test_model_tools_past_the_limit(fx, tmp_path, tool, args, output):
    work = tmp_path / "work"
    work.mkdir()
    (work / "lines.txt").write_text("the man went to the store ||| he bought milk\n" * 300)
    argv = args.format(F=fx, W=work).split()
    limit = 16 * 1024
    _assert_one_line_naming(_run(tool, *argv, limit=limit), output.format(W=work), limit)
    assert sorted(os.listdir(work)) == ["lines.txt"] + (
        ["out"] if tool.endswith("run_classifier") else [])
    if tool.endswith("run_classifier"):  # what a rerun resumes from, and the logs
        assert not (work / "out" / files.TASK_MODEL_FILE).exists()
    assert _leftovers(work) == []
    proc = _run(tool, *argv)
    assert proc.returncode == 0, proc.stderr[-3000:]


# --- Outputs named by a symbolic link. ---


def test_a_file_output_that_is_a_link_is_written_where_it_points(tmp_path):
    """A shell's `>` writes through a link; the atomic rename replaced the link itself with
    a regular file, leaving the file it pointed to as it was."""
    target = tmp_path / "shared" / "vocab.txt"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "run" / "vocab.txt"
    link.parent.mkdir()
    link.symlink_to(target)
    with pytest.raises(files.OutputExistsError, match=str(target)):
        files.write_text(str(link), "new\n", overwrite=False)
    with files.atomic_output(str(link), overwrite=True) as tmp:
        assert os.path.dirname(tmp) == str(target.parent)  # renamed on the target's disk
        with open(tmp, "w") as f:
            f.write("new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    assert sorted(os.listdir(target.parent)) == ["vocab.txt"]
    # A link to nothing yet: the file is made where it points.
    dangling = tmp_path / "run" / "corpus.txt"
    dangling.symlink_to(tmp_path / "shared" / "corpus.txt")
    files.write_text(str(dangling), "text\n", overwrite=False)
    assert dangling.is_symlink() and (tmp_path / "shared" / "corpus.txt").read_text() == "text\n"


def test_prepare_corpus_writes_through_a_link(tmp_path):
    target = tmp_path / "big_disk" / "corpus.txt"
    target.parent.mkdir()
    link = tmp_path / "corpus.txt"
    link.symlink_to(target)
    result = run_tool("prepare_corpus", [
        f"--input={os.path.join(TESTDATA, 'pretrain_corpus.txt')}", f"--output_file={link}"])
    assert result.code == 0, result.stderr
    assert link.is_symlink() and target.stat().st_size > 0


def test_pretraining_data_written_through_a_link_is_read_through_it(tmp_path):
    """The shard goes where the link points, its sidecar beside it; read through the link,
    the shard finds its sidecar there."""
    target = tmp_path / "big_disk" / "train.tfrecord"
    target.parent.mkdir()
    link = tmp_path / "train.tfrecord"
    link.symlink_to(target)
    result = run_tool("create_pretraining_data", _cpd_args(tmp_path, f"--output_file={link}"))
    assert result.code == 0, result.stderr
    assert link.is_symlink()
    assert sorted(os.listdir(target.parent)) == ["train.tfrecord", "train.tfrecord.meta.json"]
    meta = features.read_sidecar(str(link))
    assert meta["max_seq_length"] == 24 and meta["shard"]["num_shards"] == 1


# --- One prefix, one output: a single file and shards never side by side. ---


def test_a_single_file_and_a_shard_set_of_one_prefix_are_never_side_by_side(tmp_path):
    """`--output_file=x.tfrecord` beside `x-0000N-of-0000M.tfrecord` (or the reverse) was
    accepted: a glob `x*` read both, the corpus twice. Refused, as another shard set of
    the prefix is; --overwrite replaces the prefix's other output once the new one is in."""
    out = tmp_path / "data"
    shards = _cpd_args(tmp_path, f"--output_file={out / 'train'}", "--num_output_shards=2")
    single = [a for a in shards if not a.startswith(("--output_file", "--num_output"))] + [
        f"--output_file={out / 'train.tfrecord'}"]
    assert run_tool("create_pretraining_data", shards).code == 0
    before = sorted(os.listdir(out))
    result = run_tool("create_pretraining_data", single)
    assert result.code == 1 and result.error_lines == [
        f"error: --output_file: {out / 'train'} already has another output, "
        f"{out / 'train'}-*-of-00002.tfrecord (4 files, sidecars included), which a glob such "
        f"as {out / 'train'}* would read beside this run's {out / 'train.tfrecord'} (the corpus "
        "twice); pass --overwrite to replace the prefix's outputs, or choose another "
        "--output_file"], result.stderr
    assert sorted(os.listdir(out)) == before
    assert run_tool("create_pretraining_data", single + ["--overwrite"]).code == 0
    assert sorted(os.listdir(out)) == ["train.tfrecord", "train.tfrecord.meta.json"]
    # The reverse: shards beside the single file.
    result = run_tool("create_pretraining_data", shards)
    assert result.code == 1 and result.error_lines[0].startswith(
        f"error: --output_file: {out / 'train'} already has another output, "
        f"{out / 'train.tfrecord'} (2 files, sidecar included)"), result.stderr
    assert run_tool("create_pretraining_data", shards + ["--overwrite"]).code == 0
    assert sorted(os.listdir(out)) == sorted(
        f"train-0000{i}-of-00002.tfrecord{s}" for i in range(2) for s in ("", ".meta.json"))
