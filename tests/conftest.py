"""Shared test setup: quiet TensorFlow, deterministic seeds, tiny model sizes."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")

# Sizes that all differ (Google's modeling_test.py habit), so a transposed weight fails.
TINY = dict(
    vocab_size=99,
    num_layers=3,
    hidden_size=32,
    num_heads=4,
    intermediate_size=37,
    max_sequence_length=40,
)


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


@pytest.fixture(autouse=True)
def _seed():
    import keras

    keras.utils.set_random_seed(1234)
    yield


def event_scalars(log_dir):
    """{tag: sorted steps} of the scalars in every event file under `log_dir`."""
    import tensorflow as tf

    steps = {}
    for name in sorted(os.listdir(log_dir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return {tag: sorted(s) for tag, s in steps.items()}


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
    env = dict(os.environ, KERAS_BACKEND=backend)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
               "-m", "", f"{test_file}::{test_id}"]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, (f"{test_id} on {backend}:\n" + done.stdout[-4000:]
                                  + done.stderr[-2000:])
    # Passed, not skipped or deselected.
    assert re.search(r"^1 passed", done.stdout, re.M), done.stdout[-2000:]
    return True
