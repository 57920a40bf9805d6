"""Shared test setup: quiet TensorFlow, deterministic seeds, tiny model sizes, and runs on
another Keras backend.

Keras fixes its backend when it is first imported, so this process runs every test on one
(KERAS_BACKEND, TensorFlow by default; `KERAS_BACKEND=jax pytest ...` runs them on JAX). A
test that compares backends runs the other one in a fresh process: `backend_env`,
`run_tests_on_backend`, `run_on_backend` (one test) and `run_module_on_backend` (a module's
tests in one process) below.
"""

import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")

# The files whose selected tests take longest (CI's logs, 2 cores), started first: `make
# test` gives a file at a time to each of its processes (pytest-xdist's loadfile), in
# collection order (--no-loadscope-reorder), so a long file started last would leave the
# other process idle.
_LONGEST_FIRST = ("test_quickstart.py", "test_export.py", "test_backends.py",
                  "test_distribute.py", "test_run_pretraining_jax.py", "test_training_parity.py",
                  "test_length_buckets.py", "test_flash_attention.py", "test_run_pretraining.py",
                  "test_finetune_resume.py", "test_run_finetune.py", "test_request_checks.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    # A stable sort: the other files, and the tests within each file, keep their order.
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def tf212_python():
    """A python with tensorflow 2.12.1 + tensorflow-text 2.12.1 (stock TF Serving's
    versions), from $BERT_KERAS_TF212_PYTHON or /tmp/tf212 (bench/tf_text_2_12_compat.py
    shows how to make one); None if there is none."""
    for candidate in (os.environ.get("BERT_KERAS_TF212_PYTHON"), "/tmp/tf212/bin/python"):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None


def backend_env(backend, **extra):
    """The environment of a fresh process on Keras backend `backend`, importing this tree."""
    return dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO,
                **extra)


def run_tests_on_backend(backend, *pytest_args, timeout=1500, env=None):
    """Runs pytest with `pytest_args` in a fresh process on `backend` (`env`: more
    environment variables).

    Returns:
      (CompletedProcess, {"passed": n, "failed": n, "xfailed": n, ...}) from pytest's
      summary line, so a caller can also check that tests did run (not all skipped).
    """
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
        cwd=REPO, env=backend_env(backend, **(env or {})), capture_output=True, text=True,
        timeout=timeout)
    lines = result.stdout.strip().splitlines()
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", lines[-1] if lines else "")}
    return result, counts


# Sizes that all differ (Google's modeling_test.py habit), so a transposed weight fails.
TINY = dict(
    vocab_size=99,
    num_layers=3,
    hidden_size=32,
    num_heads=4,
    intermediate_size=37,
    max_sequence_length=40,
)


@contextlib.contextmanager
def piped(data: bytes):
    """A path, /dev/fd/<n>, that reads `data` once from a pipe, as bash's process
    substitution gives one (--label_list_file=<(printf 'a\\nb\\n')): a second open of
    it reads nothing. `data` is small enough for the pipe's buffer, so no writer thread."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    try:
        yield f"/dev/fd/{read_end}"
    finally:
        os.close(read_end)


@contextlib.contextmanager
def fifo(path, data: bytes):
    """`path` made a FIFO (mkfifo) that a thread feeds `data` once, when a reader opens it
    (as `zcat x.gz > fifo` would); yields `path`. The thread is a daemon: a reader that
    never opens the FIFO leaves it blocked, not the test run; a reader that stops early
    ends the writer as a shell's writer ends (zcat's SIGPIPE), without an error."""
    import threading

    os.mkfifo(path)

    def write():
        with contextlib.suppress(BrokenPipeError):
            with open(path, "wb") as f:  # blocks until the reader opens it
                f.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield path
    finally:
        writer.join(timeout=10)


def make_inputs(batch=3, seq=11, lengths=None, vocab=99, seed=0):
    """A padded int32 input dict: ids in [1, vocab), mask 1 up to each length, pairs typed."""
    rng = np.random.default_rng(seed)
    lengths = lengths or [seq - i * (seq // (batch + 1)) for i in range(batch)]
    ids = rng.integers(1, vocab, size=(batch, seq)).astype(np.int32)
    mask = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    types = np.zeros((batch, seq), np.int32)
    for row, length in enumerate(lengths):
        types[row, length // 2 : length] = 1
    return {"input_word_ids": ids * mask, "input_mask": mask, "input_type_ids": types}


def h5_keys(path):
    """Every group and dataset name in an HDF5 file (a Keras .weights.h5 layout)."""
    import h5py

    found = set()
    with h5py.File(path) as f:
        f.visit(found.add)
    return found


def h5_arrays(path):
    """Every dataset of an HDF5 file (a Keras .weights.h5) by name, as numpy arrays."""
    import h5py

    arrays = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return arrays


def assert_same_weights(ours, theirs):
    """Two runs' weights files (.weights.h5) hold the same arrays bit for bit."""
    ours, theirs = h5_arrays(ours), h5_arrays(theirs)
    assert ours.keys() == theirs.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def assert_models_equal(a, b):
    """Two Keras models of one class hold the same variables (paths, in order) with the
    same values, bit for bit."""
    assert type(a) is type(b)
    assert [v.path for v in a.weights] == [v.path for v in b.weights]
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=x.path)


@pytest.fixture(autouse=True)
def _seed():
    import keras

    keras.utils.set_random_seed(1234)
    yield


def event_values(log_dir):
    """{tag: [(step, value)] sorted by step} of the scalars in every event file under
    `log_dir`."""
    import tensorflow as tf

    points = {}
    for name in sorted(os.listdir(log_dir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                scalar = (float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                          else value.simple_value)
                points.setdefault(value.tag, []).append((event.step, scalar))
    return {tag: sorted(p, key=lambda point: point[0]) for tag, p in points.items()}


def event_scalars(log_dir):
    """{tag: sorted steps} of the scalars in every event file under `log_dir`."""
    return {tag: [step for step, _ in p] for tag, p in event_values(log_dir).items()}


def tensorboard_points(log_dir):
    """{tag: [(step, value)]} as TensorBoard shows the scalars of `log_dir`: loaded by its
    own accumulator, which drops a killed run's points that a resumed run wrote again
    (`--purge_orphaned_data`, on by default)."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import plugin_event_accumulator

    accumulator = plugin_event_accumulator.EventAccumulator(str(log_dir), size_guidance={
        plugin_event_accumulator.TENSORS: 0})  # 0: keep every point
    accumulator.Reload()
    return {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto)))
                  for e in accumulator.Tensors(tag)]
            for tag in accumulator.Tags()["tensors"]}


def run_on_backend(backend, test_file, test_id):
    """Runs a test on a Keras backend: here if this process has it, else in a subprocess.

    Keras fixes its backend per process. A test parametrized over backends starts with
    `if run_on_backend(backend, __file__, "<test name>[<backend>]"): return`: on this
    process's backend it returns False and the test body runs; on the other it runs that
    test id with KERAS_BACKEND set in a fresh pytest (which then returns False), fails
    with its output if that run failed, and returns True.
    """
    import keras

    if keras.backend.backend() == backend:
        return False
    done, counts = run_tests_on_backend(backend, "-x", "-m", "", f"{test_file}::{test_id}")
    assert done.returncode == 0, (f"{test_id} on {backend}:\n" + done.stdout[-4000:]
                                  + done.stderr[-2000:])
    # Passed, not skipped or deselected.
    assert counts.get("passed") == 1 and not counts.keys() - {"passed", "warning", "warnings"}, \
        done.stdout[-2000:]
    return True


def run_module_on_backend(backend, test_file, passed, *pytest_args, env=None):
    """Runs a module's tests on a Keras backend in one fresh process (for modules whose tests
    need that backend: one start-up instead of one per test, as `run_on_backend` pays).

    Called by one test of the module; `pytest_args` select the tests (`-k ...`); `env`
    adds environment variables (XLA_FLAGS for host devices). Skips that test when this
    process already runs `backend` (the tests ran here); else asserts that none failed and
    exactly `passed` passed.
    """
    import keras

    if keras.backend.backend() == backend:
        pytest.skip(f"this process runs {backend}: the tests ran here")
    done, counts = run_tests_on_backend(backend, "-m", "", test_file, *pytest_args, env=env)
    assert done.returncode == 0 and not counts.get("failed"), (done.stdout[-4000:]
                                                               + done.stderr[-2000:])
    assert counts.get("passed") == passed, done.stdout[-2000:]


# Imported by a fresh process whose PYTHONPATH starts with its folder: TensorFlow (and
# tensorflow-text) cannot be found, as on a machine without them (the GPU machines the
# accelerator bench runs on); importlib.util.find_spec says None, an import fails.
_HIDE_TENSORFLOW = '''\
import importlib.machinery
import sys


class _WithoutTensorFlow(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras"):
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [_WithoutTensorFlow if f is importlib.machinery.PathFinder else f
                    for f in sys.meta_path]
'''


def without_tensorflow_env(backend, folder, **extra):
    """`backend_env` for a fresh process in which TensorFlow cannot be imported (a
    sitecustomize.py written into `folder` hides it)."""
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(_HIDE_TENSORFLOW)
    env = backend_env(backend, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), REPO])
    return env
