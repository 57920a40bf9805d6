"""`python -m export.saved_model_cli`: saved_model_cli's mistakes in one line, its help, a run.

TensorFlow's own program prints a traceback for every mistake in its arguments (no
SavedModel at --dir, an unknown signature or input key, a literal that does not parse) and
a KeyError for an unknown command, and its `--help` prints nothing of its commands (absl
reads the flag first and exits 1). Each case runs in a fresh process: saved_model_cli
declares absl flags other tools declare too.
"""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # five fresh TensorFlow processes: about 25 s on 2 cores

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A SavedModel of y = 3 * x, x: float32 [None] (made in a fresh process, as the tool
    reads it)."""
    path = str(tmp_path_factory.mktemp("smc") / "m" / "1")
    code = ("import tensorflow as tf\n"
            "class M(tf.Module):\n"
            "    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name='x')])\n"
            "    def f(self, x):\n"
            "        return {'y': 3.0 * x}\n"
            "m = M()\n"
            f"tf.saved_model.save(m, {path!r}, signatures={{'serving_default': m.f}})\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300,
                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    return path


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("BERT_KERAS_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "export.saved_model_cli", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def _one_error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines and lines[-1].startswith("error: "), proc.stderr[-2000:]
    return lines[-1]


def test_a_dir_without_a_saved_model_is_one_line(tmp_path):
    missing = str(tmp_path / "models" / "nope")
    proc = _cli("show", "--dir", missing, "--all")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert missing in _one_error_line(proc)


def test_an_unknown_signature_and_a_bad_literal_are_one_line_each(saved_model):
    proc = _cli("show", "--dir", saved_model, "--tag_set", "serve", "--signature_def", "nope")
    assert proc.returncode == 1
    assert '"nope"' in _one_error_line(proc) and "serving_default" in _one_error_line(proc)
    proc = _cli("run", "--dir", saved_model, "--tag_set", "serve", "--signature_def",
                "serving_default", "--input_exprs", "x=[1.0")
    assert proc.returncode == 1
    assert "[1.0" in _one_error_line(proc)


def test_an_unknown_command_is_one_line_with_status_2(saved_model):
    proc = _cli("shwo", "--dir", saved_model)
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "'shwo'" in line and "show" in line and "run" in line


def test_help_lists_the_commands_and_exits_0():
    proc = _cli("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "{show,run,scan" in proc.stdout


def test_run_still_answers(saved_model):
    proc = _cli("run", "--dir", saved_model, "--tag_set", "serve", "--signature_def",
                "serving_default", "--input_exprs", "x=[1.0,2.5]")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[3.  7.5]" in proc.stdout, proc.stdout
