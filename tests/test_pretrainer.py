import math

import keras
import numpy as np
import pytest

from bert_keras import BertEncoder, BertPretrainer
from conftest import TINY, h5_keys, make_inputs


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


def full_encoder_reference(model):
    """The pretrainer's graph as it was before the sparse last layer: the whole encoder,
    then the heads gather the masked positions (the weights are `model`'s own)."""
    inputs = dict(model.input)
    encoder_outputs = model.encoder({k: inputs[k] for k in model.encoder.input})
    mlm = model.masked_lm(encoder_outputs["sequence_output"], inputs["masked_lm_positions"])
    nsp = model.nsp_dense(encoder_outputs["pooled_output"])
    return keras.Model(inputs, {"mlm_logits": mlm, "nsp_logits": nsp})


def test_sparse_last_layer_gradients_match_full_encoder():
    # The last layer runs only at [CLS] and the masked positions; losses and gradients must
    # be those of the full encoder. Positions include padding entries (0) and a repeat.
    import tensorflow as tf

    model = tiny_pretrainer()
    reference = full_encoder_reference(model)
    x = pretraining_inputs(batch=3, seq=11, predictions=5, seed=3)
    x["masked_lm_positions"][0] = [2, 2, 7, 0, 0]
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 99, size=(3, 5))
    nsp_labels = np.array([0, 1, 1])

    def loss_and_grads(m):
        with tf.GradientTape() as tape:
            out = m(x, training=False)
            loss = tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels, out["mlm_logits"])
            ) + tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(nsp_labels, out["nsp_logits"])
            )
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = loss_and_grads(model)
    ref_loss, ref_grads = loss_and_grads(reference)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for variable, g, r in zip(model.trainable_variables, grads, ref_grads):
        g, r = tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(r).numpy()
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4, err_msg=variable.path)
    # Every weight gets a gradient, the first layers' included.
    assert all(np.abs(tf.convert_to_tensor(g).numpy()).max() > 0 for g in grads)


def test_weight_file_layout_is_unchanged(tmp_path):
    # pretrainer.weights.h5 (run_pretraining's output and checkpoints) must keep the layout
    # of a pretrainer that calls its encoder whole, so files written before still load.
    model = tiny_pretrainer()
    reference = full_encoder_reference(model)
    ours, theirs = str(tmp_path / "ours.weights.h5"), str(tmp_path / "ref.weights.h5")
    model.save_weights(ours)
    reference.save_weights(theirs)

    assert h5_keys(ours) == h5_keys(theirs)
    assert any(k.startswith("layers/bert_encoder/layers/transformer_encoder_block")
               for k in h5_keys(ours))
    x = pretraining_inputs()
    fresh = tiny_pretrainer()
    fresh.load_weights(theirs)
    for key in ("mlm_logits", "nsp_logits"):
        np.testing.assert_allclose(fresh(x)[key], model(x)[key], atol=1e-5)
    heads = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    assert len(heads) == 3 and heads[0] is model.encoder
    assert {id(h) for h in heads[1:]} == {id(model.masked_lm), id(model.nsp_dense)}


def test_mlm_only_pretrainer_neither_trains_nor_decays_the_pooler():
    """Without the NSP head no loss reaches the pooler. Its weights must be out of both
    trainable lists: JAX's trainer differentiates `trainable_variables`, so a pooler listed
    there got optimizer slots and AdamW's weight decay shrank its kernel (by 1e-4 in three
    steps at these settings), where TensorFlow's trainer, reading `trainable_weights`, left
    it as it was. Run with KERAS_BACKEND=jax too."""
    from bert_keras.losses import pretraining_losses_and_metrics
    from bert_keras.optimization import create_optimizer

    model = BertPretrainer(BertEncoder(**TINY), next_sentence=False)
    pooler = {id(v) for v in model.encoder.pooler_layer.weights}
    assert pooler and pooler <= {id(v) for v in model.weights}
    assert [id(v) for v in model.trainable_variables] == [id(v) for v in model.trainable_weights]
    assert not pooler & {id(v) for v in model.trainable_variables}
    model.compile(optimizer=create_optimizer(1e-2, 10, weight_decay=0.1),
                  **pretraining_losses_and_metrics(mlm_only=True))
    x = pretraining_inputs(batch=3, seq=9, predictions=2)
    y = {"mlm_logits": np.random.default_rng(5).integers(5, 99, (3, 2)).astype("int32")}
    before = [keras.ops.convert_to_numpy(w) for w in model.encoder.pooler_layer.weights]
    model.fit(x, y, sample_weight={"mlm_logits": np.ones((3, 2), "float32")}, epochs=3,
              verbose=0)
    for old, new in zip(before, model.encoder.pooler_layer.weights):
        np.testing.assert_array_equal(old, keras.ops.convert_to_numpy(new))
    assert not any("pooler" in v.path for v in model.optimizer.variables)
