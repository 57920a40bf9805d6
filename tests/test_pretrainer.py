import math

import keras
import numpy as np
import pytest

from bert_keras import BertEncoder, BertPretrainer
from conftest import TINY, make_inputs


def tiny_pretrainer(**overrides):
    return BertPretrainer(BertEncoder(**dict(TINY, **overrides)))


def pretraining_inputs(batch=3, seq=11, predictions=4, seed=0):
    x = make_inputs(batch=batch, seq=seq, seed=seed)
    rng = np.random.default_rng(seed)
    x["masked_lm_positions"] = np.sort(
        rng.integers(1, 5, size=(batch, predictions)), axis=1
    ).astype(np.int32)
    return x


@pytest.mark.parametrize("preset, params", [("base", 110_106_428), ("large", 336_226_108)])
def test_parameter_counts(preset, params):
    assert BertPretrainer(BertEncoder.from_preset(preset)).count_params() == params


def test_outputs_match_numpy_reference():
    model = tiny_pretrainer()
    x = pretraining_inputs()
    out = model(x)
    assert out["mlm_logits"].shape == (3, 4, 99)
    assert out["nsp_logits"].shape == (3, 2)
    enc = model.encoder({k: x[k] for k in ("input_word_ids", "input_mask", "input_type_ids")})
    seq = np.asarray(enc["sequence_output"])
    gathered = np.take_along_axis(seq, x["masked_lm_positions"][:, :, None], axis=1)
    kernel, bias = model.masked_lm.transform_dense.get_weights()
    h = gathered @ kernel + bias
    h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))  # exact GELU
    gamma, beta = model.masked_lm.layer_norm.get_weights()
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mean) / np.sqrt(var + 1e-12) * gamma + beta
    table = model.encoder.get_embedding_table().numpy()
    logits = h @ table.T + model.masked_lm.output_bias.numpy()
    np.testing.assert_allclose(out["mlm_logits"], logits, atol=1e-4)
    k, b = model.nsp_dense.get_weights()
    np.testing.assert_allclose(out["nsp_logits"], np.asarray(enc["pooled_output"]) @ k + b, atol=1e-5)


def test_output_projection_is_tied_to_embeddings():
    model = tiny_pretrainer()
    table = model.encoder.get_embedding_table()
    # No second [V, H] matrix: the only vocabulary-sized new weight is the bias.
    vocab_sized = [v.path for v in model.weights if v.shape[0] == 99]
    assert sorted(vocab_sized) == ["embeddings/word_embeddings", "masked_lm/output_bias"]
    x = pretraining_inputs()
    before = np.asarray(model(x)["mlm_logits"])
    table.assign(table.numpy() * 2.0)
    assert np.abs(np.asarray(model(x)["mlm_logits"]) - before).max() > 1e-3


def test_save_load_round_trip(tmp_path):
    model = tiny_pretrainer(hidden_act="gelu_new")
    x = pretraining_inputs()
    path = str(tmp_path / "pretrainer.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, BertPretrainer) and isinstance(loaded.encoder, BertEncoder)
    for key in ("mlm_logits", "nsp_logits"):
        np.testing.assert_array_equal(model(x)[key], loaded(x)[key])
    # The loaded head is still tied to the loaded encoder's table.
    assert loaded.masked_lm.embedding_layer is loaded.encoder.embeddings_layer


def test_mixed_bfloat16_logits_are_float32():
    encoder = BertEncoder(**TINY, dtype="mixed_bfloat16")
    out = BertPretrainer(encoder)(pretraining_inputs())
    assert out["mlm_logits"].dtype == "float32" and out["nsp_logits"].dtype == "float32"


def test_rejects_non_encoder():
    with pytest.raises(ValueError, match="BertEncoder"):
        BertPretrainer(keras.layers.Dense(3))
