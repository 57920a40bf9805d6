import json
import os

import pytest

from bert_keras import BertConfig
from bert_keras.config import PRESETS

# A bert_config.json exactly as Google released it for BERT-Base, Uncased.
GOOGLE_BASE = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "type_vocab_size": 2,
    "vocab_size": 30522,
}


def test_google_file_round_trip(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(GOOGLE_BASE))
    config = BertConfig.from_json_file(path)
    assert config == BertConfig.from_preset("base")
    assert config.layer_norm_eps == 1e-12  # Google's files omit it.
    out = tmp_path / "out.json"
    config.to_json_file(out)
    written = json.loads(out.read_text())
    assert {k: written[k] for k in GOOGLE_BASE} == GOOGLE_BASE
    assert BertConfig.from_json_file(out) == config


def test_to_json_file_refuses_to_overwrite(tmp_path):
    out = tmp_path / "bert_config.json"
    BertConfig().to_json_file(out)
    with pytest.raises(FileExistsError, match="bert_config.json"):
        BertConfig().to_json_file(out)
    BertConfig(vocab_size=7).to_json_file(out, overwrite=True)
    assert BertConfig.from_json_file(out).vocab_size == 7


def test_multilingual_pooler_keys_accepted(tmp_path):
    values = dict(GOOGLE_BASE, directionality="bidi", pooler_type="first_token_transform",
                  pooler_fc_size=768, pooler_num_attention_heads=12, pooler_num_fc_layers=3,
                  pooler_size_per_head=128, vocab_size=119547)
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(values))
    assert BertConfig.from_json_file(path).vocab_size == 119547


@pytest.mark.parametrize(
    "presets, expected",
    [
        ("tiny", (2, 128, 2)),
        ("mini", (4, 256, 4)),
        ("small", (4, 512, 8)),
        ("medium", (8, 512, 8)),
        ("base", (12, 768, 12)),
        ("large", (24, 1024, 16)),
    ],
)
def test_presets(presets, expected):
    c = BertConfig.from_preset(presets)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == expected
    assert c.intermediate_size == 4 * c.hidden_size
    assert (c.vocab_size, c.max_position_embeddings, c.type_vocab_size) == (30522, 512, 2)


def test_preset_overrides_and_unknown_preset():
    assert BertConfig.from_preset("tiny", vocab_size=1000).vocab_size == 1000
    with pytest.raises(ValueError, match="huge"):
        BertConfig.from_preset("huge")
    assert set(PRESETS) == {"tiny", "mini", "small", "medium", "base", "large"}


def test_unknown_key_named(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(dict(GOOGLE_BASE, hiden_size=768)))
    with pytest.raises(ValueError, match=r"hiden_size") as e:
        BertConfig.from_json_file(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("hidden_size", -768),
        ("num_hidden_layers", 0),
        ("vocab_size", 1.5),
        ("intermediate_size", True),
        ("hidden_dropout_prob", 1.0),
        ("attention_probs_dropout_prob", -0.1),
        ("layer_norm_eps", 0),
        ("hidden_act", "swish"),
    ],
)
def test_invalid_values_named(field, value):
    with pytest.raises(ValueError, match=field):
        BertConfig.from_dict(dict(GOOGLE_BASE, **{field: value}))


def test_heads_must_divide_hidden():
    with pytest.raises(ValueError, match="num_attention_heads") as e:
        BertConfig(hidden_size=100, num_attention_heads=12)
    assert "hidden_size=100" in str(e.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        BertConfig.from_json_file(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        BertConfig.from_json_file(bad)


@pytest.mark.parametrize("key", ["num_attention_heads", "hidden_act", "initializer_range"])
def test_a_file_missing_a_key_is_an_error_naming_it(tmp_path, key):
    """Never a silent default: without num_attention_heads a file used to take 12 heads,
    and the error then blamed hidden_size for not dividing by 12."""
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({k: v for k, v in dict(GOOGLE_BASE, hidden_size=256).items()
                                if k != key}))
    with pytest.raises(ValueError) as e:
        BertConfig.from_json_file(path)
    message = str(e.value)
    assert f"missing key(s) ['{key}']" in message and str(path) in message
    assert "\n" not in message and "divisible" not in message


def test_layer_norm_eps_and_preset_fields_may_be_left_out():
    assert BertConfig.from_dict(GOOGLE_BASE, require_all=True).layer_norm_eps == 1e-12
    assert BertConfig.from_dict({"hidden_size": 64, "num_attention_heads": 2}).num_hidden_layers == 12


def test_parameter_counts_equal_the_models():
    from bert_keras import BertEncoder, BertPretrainer

    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=40, type_vocab_size=3)
    encoder = BertEncoder.from_bert_config(config)
    assert sum(config.parameter_counts().values()) == encoder.count_params()
    pretrainer = BertPretrainer(encoder)
    assert sum(config.parameter_counts(pretraining_heads=True).values()) == \
        pretrainer.count_params()
    base = BertConfig.from_preset("base")  # docs/DESIGN.md section 3, without building it
    assert sum(base.parameter_counts().values()) == 109_482_240
    assert sum(base.parameter_counts(pretraining_heads=True).values()) == 110_106_428


def test_a_model_that_cannot_fit_memory_is_refused_naming_the_field():
    huge = BertConfig.from_preset("tiny", vocab_size=10**9)
    with pytest.raises(ValueError) as e:
        huge.check_fits_memory(available_bytes=64 * 2**30, source="bert_config.json")
    message = str(e.value)
    assert message.startswith("bert_config.json: vocab_size=1000000000 makes a model of")
    assert "1,922.3 GiB" in message and "64.0 GiB" in message and "\n" not in message
    # The threshold: 16 bytes per parameter, compared with what is available.
    base = BertConfig.from_preset("base")
    needed = 16 * 110_106_428
    assert base.check_fits_memory(available_bytes=needed) == needed
    with pytest.raises(ValueError, match="reduce num_hidden_layers"):
        base.check_fits_memory(available_bytes=needed - 1)
    from bert_keras.config import available_memory_bytes

    assert available_memory_bytes() is None or available_memory_bytes() > 0


def test_transformers_config_json_reads_as_the_model_transformers_builds(tmp_path):
    """--bert_config_file may name transformers' config.json: its BERT keys are Google's,
    its generic ones (architectures, dtype, ...) are dropped. Refused before, as unknown
    keys."""
    import transformers

    values = dict(vocab_size=1234, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=100, hidden_act="gelu_new", hidden_dropout_prob=0.2,
                  attention_probs_dropout_prob=0.05, max_position_embeddings=77,
                  type_vocab_size=3, initializer_range=0.03, layer_norm_eps=1e-7)
    transformers.BertConfig(architectures=["BertForMaskedLM"], **values).save_pretrained(
        tmp_path)
    path = tmp_path / "config.json"
    assert BertConfig.from_json_file(path) == BertConfig(**values)
    other = dict(json.loads(path.read_text()), model_type="roberta")
    path.write_text(json.dumps(other))
    with pytest.raises(ValueError, match=r"config.json: model_type is 'roberta', expected "
                                         r"'bert'$"):
        BertConfig.from_json_file(path)


@pytest.mark.parametrize("setting", [dict(is_decoder=True), dict(add_cross_attention=True),
                                     dict(position_embedding_type="relative_key")])
def test_a_transformers_config_of_another_model_than_berts_encoder_is_refused(tmp_path, setting):
    """is_decoder (causal attention), add_cross_attention, relative position embeddings:
    the weights compute something else than BERT's encoder. Before, those keys were dropped
    and a causal BertModel converted to a bidirectional encoder (outputs 0.14 apart)."""
    import transformers

    transformers.BertConfig(hidden_size=64, num_attention_heads=4).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    plain = json.loads(path.read_text())
    assert BertConfig.from_json_file(path).hidden_size == 64
    path.write_text(json.dumps(dict(plain, **setting)))
    (key, value), = setting.items()
    with pytest.raises(ValueError, match=rf"config.json: {key}={value!r}; bert-keras builds "
                                         r"BERT's bidirectional encoder"):
        BertConfig.from_json_file(path)
