import numpy as np
import keras
import pytest
import tensorflow as tf

from bert_keras import BertEncoder, BertPretrainer
from bert_keras.tasks import BertClassifier, BertSpanQA, BertTagger
from conftest import TINY, make_inputs


def tiny_encoder(**overrides):
    return BertEncoder(**dict(TINY, **overrides))


@pytest.mark.parametrize(
    "preset, params", [("base", 109_482_240), ("large", 335_141_888)]
)
def test_parameter_counts(preset, params):
    assert BertEncoder.from_preset(preset).count_params() == params


def test_parameter_count_by_hand():
    # V*H + P*H + T*H + 2H (embeddings) + L * (4(H*H+H) + 2*2H + H*I+I + I*H+H) + H*H+H.
    V, P, T, H, I, L = 99, 40, 2, 32, 37, 3
    expected = V * H + P * H + T * H + 2 * H
    expected += L * (4 * (H * H + H) + 4 * H + H * I + I + I * H + H)
    expected += H * H + H
    assert tiny_encoder().count_params() == expected


def test_output_structure_and_shapes():
    encoder = tiny_encoder()
    out = encoder(make_inputs(batch=3, seq=11))
    assert set(out) == {"sequence_output", "pooled_output", "encoder_outputs"}
    assert out["sequence_output"].shape == (3, 11, 32)
    assert out["pooled_output"].shape == (3, 32)
    assert len(out["encoder_outputs"]) == 3
    np.testing.assert_array_equal(out["encoder_outputs"][-1], out["sequence_output"])
    # The pooler is tanh(dense([CLS])) by definition.
    kernel, bias = encoder.pooler_layer.get_weights()
    expected = np.tanh(np.asarray(out["sequence_output"])[:, 0] @ kernel + bias)
    np.testing.assert_allclose(out["pooled_output"], expected, atol=1e-6)


@pytest.mark.parametrize("seq", [1, 5, 40])
def test_any_sequence_length_up_to_max(seq):
    out = tiny_encoder()(make_inputs(batch=2, seq=seq, lengths=[seq, max(1, seq // 2)]))
    assert out["sequence_output"].shape == (2, seq, 32)


def test_too_long_sequence_is_a_clear_error():
    encoder = tiny_encoder()
    with pytest.raises(Exception, match="40"):
        encoder(make_inputs(batch=1, seq=41, lengths=[41]))


def test_embedding_table_is_the_variable():
    encoder = tiny_encoder()
    table = encoder.get_embedding_table()
    assert tuple(table.shape) == (99, 32)
    assert table is encoder.embeddings_layer.word_embeddings


def test_dropout_only_when_training():
    encoder = tiny_encoder(dropout=0.3, attention_dropout=0.3)
    x = make_inputs()
    a = encoder(x, training=False)["sequence_output"]
    b = encoder(x, training=False)["sequence_output"]
    np.testing.assert_array_equal(a, b)
    c = encoder(x, training=True)["sequence_output"]
    d = encoder(x, training=True)["sequence_output"]
    assert np.abs(np.asarray(c) - np.asarray(d)).max() > 1e-3
    assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3


def test_padding_does_not_change_real_positions():
    encoder = tiny_encoder()
    x = make_inputs(batch=3, seq=9, lengths=[9, 6, 3])
    longer = {k: np.pad(v, ((0, 0), (0, 13))) for k, v in x.items()}
    # Junk ids and segment ids under the padding must not matter either.
    longer["input_word_ids"][:, 9:] = 17
    longer["input_type_ids"][:, 9:] = 1
    a = encoder(x)
    b = encoder(longer)
    mask = x["input_mask"].astype(bool)
    for i, (ea, eb) in enumerate(zip(a["encoder_outputs"], b["encoder_outputs"])):
        np.testing.assert_allclose(
            np.asarray(ea)[mask], np.asarray(eb)[:, :9][mask], atol=1e-6, err_msg=f"layer {i}"
        )
    np.testing.assert_allclose(a["pooled_output"], b["pooled_output"], atol=1e-6)


def test_config_round_trip_and_bert_config():
    encoder = tiny_encoder(hidden_act="gelu_new", dropout=0.2)
    clone = BertEncoder.from_config(encoder.get_config())
    assert clone.get_config() == encoder.get_config()
    assert clone.count_params() == encoder.count_params()
    config = encoder.to_bert_config()
    assert config.hidden_act == "gelu_new" and config.hidden_dropout_prob == 0.2
    rebuilt = BertEncoder.from_bert_config(config, name=encoder.name)
    assert rebuilt.get_config() == encoder.get_config()


def test_keras_save_load_same_outputs(tmp_path):
    encoder = tiny_encoder()
    x = make_inputs()
    path = str(tmp_path / "encoder.keras")
    encoder.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, BertEncoder)
    a, b = encoder(x), loaded(x)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_array_equal(a[key], b[key])


def test_jit_compile_forward_matches_eager():
    encoder = tiny_encoder()
    x = make_inputs()
    compiled = tf.function(lambda inputs: encoder(inputs, training=False), jit_compile=True)
    a = encoder(x)["sequence_output"]
    b = compiled(x)["sequence_output"]
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_mixed_bfloat16_keeps_layernorm_and_softmax_float32():
    policy = keras.mixed_precision.DTypePolicy("mixed_bfloat16")
    encoder = tiny_encoder(dtype=policy)
    reference = tiny_encoder()
    reference.set_weights(encoder.get_weights())
    # Variables stay float32; activations are bfloat16.
    assert all(v.dtype == "float32" for v in encoder.weights)
    x = make_inputs()
    out = encoder(x)
    assert out["sequence_output"].dtype == "bfloat16"
    # Softmax in float32: a bfloat16 softmax over -10000-masked scores would be visibly off;
    # the whole network stays within bfloat16 rounding of the float32 reference.
    ref = np.asarray(reference(x)["sequence_output"])
    got = np.asarray(tf.cast(out["sequence_output"], tf.float32))
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() < 0.1
    # The LayerNorm layers compute in float32 (Keras' layer_normalization upcasts) and the
    # attention scores are cast to float32 before softmax: check the latter directly.
    attention = encoder.transformer_layers[0].self_attention
    assert attention.compute_dtype == "bfloat16"
    inner = tf.function(lambda h, m: attention(h, attention_mask=m))
    graph = inner.get_concrete_function(
        tf.TensorSpec([2, 5, 32], tf.bfloat16), tf.TensorSpec([2, 5], tf.int32)
    ).graph
    softmax_dtypes = {op.outputs[0].dtype for op in graph.get_operations() if op.type == "Softmax"}
    assert softmax_dtypes == {tf.float32}


def test_fit_one_step():
    encoder = tiny_encoder()
    inputs = encoder.input
    head = keras.layers.Dense(2)(encoder(inputs)["pooled_output"])
    model = keras.Model(inputs, head)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = make_inputs(batch=4, seq=8)
    before = [np.array(w) for w in encoder.get_weights()]
    history = model.fit(x, np.array([0, 1, 0, 1]), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = encoder.get_weights()
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, after))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(hidden_size=30, num_heads=4), "num_attention_heads"),
        (dict(num_layers=-1), "num_hidden_layers"),
        (dict(hidden_act="swish"), "hidden_act"),
    ],
)
def test_bad_constructor_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        tiny_encoder(**kwargs)


def test_block_output_positions_are_rows_of_the_full_output():
    # TransformerEncoderBlock(output_positions=...) computes only some rows; each must equal
    # that row of the full layer (keys and values still cover every unmasked position).
    from bert_keras.layers import TransformerEncoderBlock

    block = TransformerEncoderBlock(num_heads=4, intermediate_size=37)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 9, 32)).astype(np.float32)
    mask = (np.arange(9)[None, :] < np.array([[9], [6], [3]])).astype(np.int32)
    positions = np.array([[0, 4, 4, 8], [0, 1, 5, 0], [0, 2, 1, 7]], np.int32)
    full = np.asarray(block(x, attention_mask=mask))
    rows = np.asarray(block(x, attention_mask=mask, output_positions=positions))
    assert rows.shape == (3, 4, 32)
    np.testing.assert_allclose(rows, np.take_along_axis(full, positions[:, :, None], axis=1),
                               atol=1e-5)
    assert block.compute_output_shape((3, 9, 32), (3, 9), (3, 4)) == (3, 4, 32)


@pytest.mark.parametrize("build", [
    lambda **kw: BertEncoder(**TINY, **kw),
    lambda **kw: BertPretrainer(BertEncoder(**TINY), **kw),
    lambda **kw: BertClassifier(BertEncoder(**TINY), 2, **kw),
    lambda **kw: BertTagger(BertEncoder(**TINY), 2, **kw),
    lambda **kw: BertSpanQA(BertEncoder(**TINY), **kw),
], ids=["encoder", "pretrainer", "classifier", "tagger", "span_qa"])
def test_a_misspelt_argument_is_refused_not_dropped(build):
    """keras.Model's functional constructor ignores keyword arguments it does not read:
    BertEncoder(layer_norm_eps=1e-5) built a model with LayerNorm epsilon 1e-12."""
    with pytest.raises(TypeError, match=r"\(\) got unexpected keyword argument\(s\) "
                                        r"'layer_norm_eps'"):
        build(layer_norm_eps=1e-5)
    model = build(name="mine", trainable=False)  # what the constructor does read
    assert model.name == "mine" and not model.trainable
