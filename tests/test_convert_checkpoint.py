"""bert_keras.convert_checkpoint: format conversion, round trips, and the command line."""

import os
import subprocess
import sys

import numpy as np
import pytest

from bert_keras import BertEncoder, BertPretrainer
from bert_keras.checkpoints import WeightLoadError, save_keras_model
from bert_keras.model_loading import load_checkpoint
from bert_keras.convert_checkpoint import convert
from conftest import TINY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def random_pretrainer(seed=0):
    model = BertPretrainer(BertEncoder(**TINY))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.2, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def assert_weights_equal(a, b):
    assert type(a) is type(b)
    assert [v.path for v in a.weights] == [v.path for v in b.weights]
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=x.path)


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    model = random_pretrainer()
    path = save_keras_model(model, str(tmp_path_factory.mktemp("k") / "model.keras"))
    return path, model


@pytest.mark.parametrize("via", ["google", "hf"])
def test_keras_round_trip_through_each_format_is_bit_exact(tmp_path, keras_file, via):
    path, model = keras_file
    middle = str(tmp_path / ("model.ckpt" if via == "google" else "hf"))
    convert("keras", via, path, middle)
    convert(via, "keras", middle, str(tmp_path / "back.keras"))
    assert_weights_equal(model, load_checkpoint(str(tmp_path / "back.keras"), fmt="keras").model)


def test_google_to_hf_and_encoder_only(tmp_path, keras_file):
    path, model = keras_file
    convert("keras", "google", path, str(tmp_path / "g" / "model.ckpt"))
    _, hf = convert("google", "hf", str(tmp_path / "g" / "model.ckpt"), str(tmp_path / "hf"),
                    model="encoder")
    assert isinstance(hf, BertEncoder)
    assert_weights_equal(model.encoder, load_checkpoint(str(tmp_path / "hf"), fmt="hf").model)
    with pytest.raises(WeightLoadError, match="no pretraining heads"):
        convert("hf", "keras", str(tmp_path / "hf"), str(tmp_path / "x.keras"), model="pretrainer")


def test_refuses_existing_output_before_loading(tmp_path, keras_file):
    path, _ = keras_file
    (tmp_path / "out.keras").write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="out.keras"):
        convert("google", "keras", str(tmp_path / "does-not-matter"), str(tmp_path / "out.keras"))
    assert (tmp_path / "out.keras").read_bytes() == b"precious"


def run_cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "bert_keras.convert_checkpoint", *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def test_cli_help_and_unknown_flag():
    result = run_cli("--help")  # absl prints the help and exits with status 1
    assert "--from=google --to=hf \\\n" in result.stdout
    for flag in ("--from: <google|hf|keras>", "--to", "--input", "--output", "--model",
                 "--bert_config_file"):
        assert flag in result.stdout
    result = run_cli("--from=hf", "--to=google", "--input=a", "--output=b", "--frobnicate=1")
    assert result.returncode != 0 and "error: --frobnicate: unknown flag" in result.stderr


@pytest.mark.integration  # The tool in fresh processes: about 14 s on 2 cores.
def test_cli_converts_and_reports_errors_without_traceback(tmp_path, keras_file):
    path, model = keras_file
    out = str(tmp_path / "model.ckpt")
    result = run_cli("--from=keras", "--to=google", f"--input={path}", f"--output={out}")
    assert result.returncode == 0, result.stderr
    assert "wrote BertPretrainer" in result.stdout
    assert_weights_equal(model, load_checkpoint(out, fmt="google").model)
    # Same command again: refuses, names the file, no traceback.
    result = run_cli("--from=keras", "--to=google", f"--input={path}", f"--output={out}")
    assert result.returncode == 1
    assert "refusing to overwrite" in result.stderr and "model.ckpt.index" in result.stderr
    assert "Traceback" not in result.stderr


def test_google_config_elsewhere(tmp_path, keras_file):
    path, model = keras_file
    convert("keras", "google", path, str(tmp_path / "g" / "model.ckpt"))
    os.rename(tmp_path / "g" / "bert_config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="bert_config.json beside it"):
        convert("google", "hf", str(tmp_path / "g" / "model.ckpt"), str(tmp_path / "hf"))
    convert("google", "hf", str(tmp_path / "g" / "model.ckpt"), str(tmp_path / "hf"),
            config_file=str(tmp_path / "config.json"))
    assert_weights_equal(model, load_checkpoint(str(tmp_path / "hf"), fmt="hf").model)
