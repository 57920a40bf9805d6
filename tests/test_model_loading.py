"""One resolver for --init_checkpoint: every accepted form gives the same weights."""

import os

import numpy as np
import pytest

from bert_keras import BertEncoder, BertPretrainer, checkpoints, model_loading
from data_prep import files
from conftest import TINY, make_inputs


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpts")
    pretrainer = BertPretrainer(BertEncoder(**TINY))
    encoder = pretrainer.encoder
    paths = {}
    paths["keras_pretrainer"] = checkpoints.save_model(pretrainer, "keras", str(tmp / "p.keras"))
    paths["keras_encoder"] = checkpoints.save_model(encoder, "keras", str(tmp / "e.keras"))
    paths["hf"] = checkpoints.save_model(pretrainer, "hf", str(tmp / "hf"))
    paths["google"] = checkpoints.save_model(pretrainer, "google", str(tmp / "google" / "bert_model.ckpt"))
    ours = tmp / "run" / "encoder"
    ours.mkdir(parents=True)
    encoder.save_weights(str(ours / files.ENCODER_WEIGHTS_FILE))
    encoder.to_bert_config().to_json_file(str(ours / files.BERT_CONFIG_FILE))
    paths["weights_file"] = str(ours / files.ENCODER_WEIGHTS_FILE)
    paths["weights_dir"] = str(ours)
    paths["run_dir"] = str(tmp / "run")
    return encoder, paths


@pytest.mark.parametrize(
    "form", ["keras_pretrainer", "keras_encoder", "hf", "google", "weights_file", "weights_dir", "run_dir"]
)
def test_every_form_gives_the_same_encoder(saved, form):
    encoder, paths = saved
    loaded = model_loading.load_encoder(paths[form])
    assert isinstance(loaded, BertEncoder)
    x = make_inputs()
    np.testing.assert_array_equal(loaded(x)["pooled_output"], encoder(x)["pooled_output"])


def test_pretrainer_forms_keep_heads(saved):
    _, paths = saved
    for form in ("keras_pretrainer", "hf", "google"):
        assert isinstance(model_loading.load_checkpoint(paths[form]).model, BertPretrainer), form
    google_dir = os.path.dirname(paths["google"])
    assert checkpoints.google_checkpoint_prefix(google_dir) == paths["google"]


def test_unrecognised_path_names_the_forms(tmp_path):
    with pytest.raises(model_loading.CheckpointError, match="not a recognised checkpoint") as e:
        model_loading.load_encoder(str(tmp_path))
    assert "Google checkpoint prefix" in str(e.value)
    with pytest.raises(model_loading.CheckpointError, match="does not exist"):
        model_loading.load_encoder(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="init_checkpoint"):
        model_loading.load_encoder("")
    with pytest.raises(model_loading.CheckpointError, match="bert_config.json"):
        BertEncoder(**TINY).save_weights(str(tmp_path / "x.weights.h5"))
        model_loading.load_encoder(str(tmp_path / "x.weights.h5"))
