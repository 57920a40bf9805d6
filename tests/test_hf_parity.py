"""Numerical parity with Hugging Face transformers' BertModel.

Two ways: (1) against golden outputs committed in tests/testdata/hf_bert_*/golden.npz
(made by tests/testdata/make_hf_golden.py; runs without torch), and (2) live, against a
fresh random transformers model (runs when torch and transformers are installed).
"""

import json
import os
import shutil

import numpy as np
import pytest

from bert_keras import BertEncoder
from bert_keras.checkpoints import WeightLoadError, load_hf_encoder, load_hf_weights, read_hf_config
from conftest import TESTDATA, make_inputs

ACTIVATIONS = ("gelu", "gelu_new")
INPUT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


def assert_outputs_close(ours, expected, mask, atol=1e-5):
    mask = mask.astype(bool)
    # Padded positions are garbage in every implementation; compare real tokens only.
    np.testing.assert_allclose(
        np.asarray(ours["sequence_output"])[mask], expected["sequence_output"][mask], atol=atol
    )
    np.testing.assert_allclose(ours["pooled_output"], expected["pooled_output"], atol=atol)
    assert len(ours["encoder_outputs"]) == len(expected["encoder_outputs"])
    for i, (a, b) in enumerate(zip(ours["encoder_outputs"], expected["encoder_outputs"])):
        np.testing.assert_allclose(np.asarray(a)[mask], b[mask], atol=atol, err_msg=f"layer {i}")


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_golden_outputs(act):
    path = os.path.join(TESTDATA, f"hf_bert_{act}")
    golden = dict(np.load(os.path.join(path, "golden.npz")))
    encoder = load_hf_encoder(path)
    assert encoder.hidden_act == act
    ours = encoder({k: golden[k] for k in INPUT_KEYS}, training=False)
    assert_outputs_close(ours, golden, golden["input_mask"])


def test_golden_activations_differ():
    # The two golden models must not agree with each other's activation: proves the test
    # above can tell "gelu" from "gelu_new".
    path = os.path.join(TESTDATA, "hf_bert_gelu")
    golden = dict(np.load(os.path.join(path, "golden.npz")))
    config = read_hf_config(path)
    wrong = BertEncoder(
        vocab_size=config.vocab_size, num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_act="gelu_new",
        max_sequence_length=config.max_position_embeddings,
    )
    with pytest.raises(WeightLoadError, match="hidden_act"):
        load_hf_weights(wrong, path)
    # Loading the bare safetensors file skips the config check; the numbers must then differ.
    load_hf_weights(wrong, os.path.join(path, "model.safetensors"))
    ours = wrong({k: golden[k] for k in INPUT_KEYS})
    mask = golden["input_mask"].astype(bool)
    diff = np.abs(np.asarray(ours["sequence_output"])[mask] - golden["sequence_output"][mask])
    assert diff.max() > 1e-4


def _copy_model(tmp_path, act="gelu"):
    dst = tmp_path / f"hf_{act}"
    shutil.copytree(os.path.join(TESTDATA, f"hf_bert_{act}"), dst)
    return dst


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
    path = _copy_model(tmp_path)
    encoder = BertEncoder(vocab_size=98, num_layers=3, hidden_size=32, num_heads=4,
                          intermediate_size=37, max_sequence_length=40)
    before = [w.copy() for w in encoder.get_weights()]
    with pytest.raises(WeightLoadError) as e:
        load_hf_weights(encoder, str(path))
    message = str(e.value)
    assert "embeddings.word_embeddings.weight" in message
    assert "(98, 32)" in message and "(99, 32)" in message
    # Nothing was half-loaded.
    for a, b in zip(before, encoder.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_missing_and_unexpected_tensors_listed(tmp_path):
    from safetensors.numpy import load_file, save_file

    path = _copy_model(tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["encoder.layer.2.output.dense.bias"]
    tensors["encoder.layer.2.extra.weight"] = np.zeros((2,), np.float32)
    save_file(tensors, str(path / "model.safetensors"))
    encoder = BertEncoder(vocab_size=99, num_layers=3, hidden_size=32, num_heads=4,
                          intermediate_size=37, max_sequence_length=40)
    with pytest.raises(WeightLoadError) as e:
        load_hf_weights(encoder, str(path))
    assert "encoder.layer.2.output.dense.bias" in str(e.value)
    assert "encoder.layer.2.extra.weight" in str(e.value)


def test_fewer_layers_in_model_than_file(tmp_path):
    encoder = BertEncoder(vocab_size=99, num_layers=2, hidden_size=32, num_heads=4,
                          intermediate_size=37, max_sequence_length=40)
    with pytest.raises(WeightLoadError, match="encoder.layer.2"):
        load_hf_weights(encoder, os.path.join(TESTDATA, "hf_bert_gelu", "model.safetensors"))


def test_heads_mismatch_is_caught_by_config(tmp_path):
    # Heads don't change any shape; only config.json can reveal the mismatch.
    encoder = BertEncoder(vocab_size=99, num_layers=3, hidden_size=32, num_heads=8,
                          intermediate_size=37, max_sequence_length=40)
    with pytest.raises(WeightLoadError, match="num_attention_heads"):
        load_hf_weights(encoder, os.path.join(TESTDATA, "hf_bert_gelu"))


def test_bad_files(tmp_path):
    encoder = BertEncoder(vocab_size=99, num_layers=3, hidden_size=32, num_heads=4,
                          intermediate_size=37, max_sequence_length=40)
    with pytest.raises(FileNotFoundError, match=r"no model.safetensors or "
                                                r"model.safetensors.index.json \(found \[\]\)"):
        load_hf_weights(encoder, str(tmp_path))
    path = _copy_model(tmp_path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightLoadError, match="model.safetensors"):
        load_hf_weights(encoder, str(path))
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "roberta"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="roberta"):
        read_hf_config(str(path))


# ------------------------------------------------------------------------------------------
# Live parity against transformers (CI installs torch and transformers).


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_live_parity_with_transformers(act, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, TESTDATA)
    import make_hf_golden

    model = make_hf_golden.make_model(act, seed=42)
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    inputs = make_inputs(batch=4, seq=13, lengths=[13, 9, 4, 1], seed=3)
    expected = make_hf_golden.run_hf(model, inputs)
    encoder = load_hf_encoder(str(tmp_path))
    assert_outputs_close(encoder(inputs, training=False), expected, inputs["input_mask"])


@pytest.mark.parametrize("backend", ["tensorflow",
                                     pytest.param("jax", marks=pytest.mark.integration)])
def test_live_parity_for_any_mask(backend, tmp_path):
    """Masks no tool writes (left padding, holes, a sequence with no real token, one with a
    single real token mid-sequence), in inference (the fused path) and in training with
    every dropout rate at 0 (the explicit softmax), at every position, against
    transformers' eager attention. Its SDPA default
    gives a sequence with no real token zeros (torch's kernel) where eager attends
    uniformly: every other row agrees with both."""
    from conftest import run_on_backend

    if run_on_backend(backend, __file__, f"test_live_parity_for_any_mask[{backend}]"):
        return
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    from bert_keras.layers import Dropout

    sys.path.insert(0, TESTDATA)
    import make_hf_golden

    inputs = make_inputs(batch=6, seq=11, lengths=[11, 7, 11, 11, 11, 11], seed=4)
    mask = inputs["input_mask"]
    mask[2, :3] = 0
    mask[3, [2, 5, 8]] = 0
    mask[4, :] = 0
    mask[5, :] = 0
    mask[5, 6] = 1  # one real token, mid-sequence
    model = make_hf_golden.make_model("gelu", seed=7)
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    expected = {}
    for implementation in ("eager", "sdpa"):
        model.config._attn_implementation = implementation
        expected[implementation] = make_hf_golden.run_hf(model, inputs)
    encoder = load_hf_encoder(str(tmp_path))
    fused = encoder(inputs, training=False)
    for layer in encoder._flatten_layers():
        if isinstance(layer, Dropout):
            layer.rate = 0.0
    explicit = encoder(inputs, training=True)
    some = mask.any(axis=1)
    for ours in (fused, explicit):
        for key in ("sequence_output", "pooled_output", "encoder_outputs"):
            got = np.asarray(ours[key])
            np.testing.assert_allclose(got, expected["eager"][key], atol=1e-5, err_msg=key)
            rows = (slice(None), some) if key == "encoder_outputs" else some
            np.testing.assert_allclose(got[rows], expected["sdpa"][key][rows], atol=1e-5,
                                       err_msg=key)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_live_parity_with_a_model_saved_in_16_bits(dtype, tmp_path):
    """`model.to(torch.bfloat16).save_pretrained(...)` (many published checkpoints): the
    file was refused as "data type 'bfloat16' not understood; is the file complete?". Its
    values are exact in our float32 variables: the outputs are the float32 model's with
    the same (rounded) weights."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, TESTDATA)
    import make_hf_golden

    model = make_hf_golden.make_model("gelu", seed=5)
    model.to(getattr(torch, dtype)).save_pretrained(str(tmp_path), safe_serialization=True)
    model.to(torch.float32)  # the rounded weights, computed in float32
    inputs = make_inputs(batch=3, seq=9, lengths=[9, 5, 2], seed=6)
    expected = make_hf_golden.run_hf(model, inputs)
    encoder = load_hf_encoder(str(tmp_path))
    assert_outputs_close(encoder(inputs, training=False), expected, inputs["input_mask"])
    assert all(w.dtype == "float32" for w in encoder.weights)


def test_a_model_saved_in_shards_loads_like_one_file(tmp_path):
    """save_pretrained(max_shard_size=...) writes model.safetensors.index.json and shards:
    it was refused as "not a recognised checkpoint in the hf format". Every reader takes it
    (the encoder, the model config.json names, convert_checkpoint), with the one file's
    weights; a broken index is one line naming it."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from cli_harness import run_tool

    from bert_keras import model_loading

    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37,
                                     max_position_embeddings=40, num_labels=3,
                                     architectures=["BertForSequenceClassification"])
    model = transformers.BertForSequenceClassification(config).eval()
    whole, shards = tmp_path / "whole", tmp_path / "shards"
    model.save_pretrained(str(whole))
    model.save_pretrained(str(shards), max_shard_size="20KB")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)]
    (shards / "vocab.txt").write_text("".join(f"{token}\n" for token in vocab))
    names = sorted(os.listdir(shards))
    assert "model.safetensors.index.json" in names and "model.safetensors" not in names
    assert sum(name.endswith(".safetensors") for name in names) > 2, names
    one = model_loading.load_checkpoint(str(whole)).model
    sharded = model_loading.load_checkpoint(str(shards)).model
    assert type(sharded).__name__ == "BertClassifier"
    for a, b in zip(sharded.weights, one.weights, strict=True):
        assert a.path == b.path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    encoder = load_hf_encoder(str(shards))
    for a, b in zip(encoder.weights, one.encoder.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    result = run_tool("convert_checkpoint", [f"--input={shards}", "--from=hf", "--to=keras",
                                             f"--output={tmp_path / 'out'}"])
    assert result.code == 0, result.stderr[-3000:]

    index = shards / "model.safetensors.index.json"
    first = sorted(n for n in names if n.endswith(".safetensors"))[0]
    for broken, message in (
            (lambda: (shards / first).rename(tmp_path / first),
             f"names shard files that are not beside it: {first}"),
            (lambda: index.write_text("[1, 2]"), 'expected a "weight_map"'),
            (lambda: index.write_text("{"), "not valid JSON")):
        broken()
        result = run_tool("convert_checkpoint", [f"--input={shards}", "--from=hf",
                                                 "--to=keras", f"--output={tmp_path / 'b'}"])
        assert result.code != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and str(index) in last and message in last, last
        assert not (tmp_path / "b").exists()


def test_live_parity_with_bert_for_pretraining_prefix(tmp_path):
    """Weights nested under `bert.` with `cls.*` heads (BertForPreTraining) load too."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, TESTDATA)
    import make_hf_golden

    torch.manual_seed(7)
    model = transformers.BertForPreTraining(
        transformers.BertConfig(hidden_act="gelu", **make_hf_golden.SIZES)
    ).eval()
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    inputs = make_inputs(batch=2, seq=10, lengths=[10, 6], seed=5)
    expected = make_hf_golden.run_hf(model.bert, inputs)
    encoder = load_hf_encoder(str(tmp_path))
    assert_outputs_close(encoder(inputs), expected, inputs["input_mask"])


# ------------------------------------------------------------------------------------------
# BertForPreTraining heads, saving in HF format, round trips.


def _tiny_pretrainer(seed=0, **overrides):
    from bert_keras import BertPretrainer
    from conftest import TINY

    model = BertPretrainer(BertEncoder(**{**TINY, **overrides}))
    rng = np.random.default_rng(seed)  # every weight random, biases and heads included
    model.set_weights([rng.normal(0, 0.2, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def _hf_pretraining_outputs(model, inputs, positions):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor(inputs["input_word_ids"], dtype=torch.long),
                    attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
                    token_type_ids=torch.tensor(inputs["input_type_ids"], dtype=torch.long))
    return {"mlm_logits": np.take_along_axis(out.prediction_logits.numpy(),
                                             positions[:, :, None], axis=1),
            "nsp_logits": out.seq_relationship_logits.numpy()}


POSITIONS = np.array([[1, 5, 9], [2, 3, 0]], np.int32)


def _random_hf_pretrainer(seed):
    """transformers' BertForPreTraining at the golden files' sizes, with biases and
    LayerNorms moved off their initial values so that a swapped one shows."""
    import torch
    import transformers

    sys_path_testdata()
    import make_hf_golden

    torch.manual_seed(seed)
    hf = transformers.BertForPreTraining(transformers.BertConfig(
        hidden_act="gelu", initializer_range=0.2, **make_hf_golden.SIZES)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return hf


def test_live_pretraining_heads_match_transformers(tmp_path):
    """BertForPreTraining -> BertPretrainer: MLM and NSP logits agree."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bert_keras import BertPretrainer
    from bert_keras.model_loading import load_checkpoint

    hf = _random_hf_pretrainer(seed=8)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    inputs = make_inputs(batch=2, seq=10, lengths=[10, 6], seed=5)
    expected = _hf_pretraining_outputs(hf, inputs, POSITIONS)
    model = load_checkpoint(str(tmp_path / "hf"), fmt="hf").model
    assert isinstance(model, BertPretrainer)
    out = model(dict(inputs, masked_lm_positions=POSITIONS))
    np.testing.assert_allclose(out["mlm_logits"], expected["mlm_logits"], atol=1e-5)
    np.testing.assert_allclose(out["nsp_logits"], expected["nsp_logits"], atol=1e-5)


def test_bert_base_uncased_layout_loads_whole(tmp_path):
    """bert-base-uncased's own model.safetensors: LayerNorm weights named `gamma`/`beta`
    (pytorch-pretrained-bert's names, which transformers renames on load), and config.json
    naming BertForMaskedLM while the file also holds the NSP head and the pooler. Loaded
    with model='auto' and 'pretrainer' it is a pretrainer with NSP whose logits equal
    transformers' BertForPreTraining's; as an encoder, its outputs. Before, every --model
    failed ("missing ...LayerNorm.weight", "unexpected cls.seq_relationship.*")."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file, save_file

    from bert_keras import BertPretrainer
    from bert_keras.convert_checkpoint import convert
    from bert_keras.model_loading import load_checkpoint

    sys_path_testdata()
    import make_hf_golden

    hf = _random_hf_pretrainer(seed=9)
    path = tmp_path / "bert-base-uncased"
    hf.save_pretrained(str(path), safe_serialization=True)
    tensors = load_file(str(path / "model.safetensors"))
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma")
              .replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in tensors.items()}
    # embeddings, two per layer, the MLM transform
    layers = hf.config.num_hidden_layers
    assert sum(k.endswith("LayerNorm.gamma") for k in legacy) == 1 + 2 * layers + 1
    save_file(legacy, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, architectures=["BertForMaskedLM"])))
    reloaded = transformers.BertForPreTraining.from_pretrained(str(path)).eval()  # the reference
    inputs = make_inputs(batch=2, seq=10, lengths=[10, 6], seed=5)
    expected = _hf_pretraining_outputs(reloaded, inputs, POSITIONS)
    for want in ("auto", "pretrainer"):
        model = load_checkpoint(str(path), fmt="hf", want=want).model
        assert isinstance(model, BertPretrainer) and model.next_sentence
        out = model(dict(inputs, masked_lm_positions=POSITIONS))
        np.testing.assert_allclose(out["mlm_logits"], expected["mlm_logits"], atol=1e-5)
        np.testing.assert_allclose(out["nsp_logits"], expected["nsp_logits"], atol=1e-5)
    encoder = load_checkpoint(str(path), fmt="hf", want="encoder").model
    assert_outputs_close(encoder(inputs), make_hf_golden.run_hf(reloaded.bert, inputs),
                         inputs["input_mask"])
    _, converted = convert("hf", "google", str(path), str(tmp_path / "google" / "bert_model.ckpt"))
    assert isinstance(converted, BertPretrainer) and converted.next_sentence


def sys_path_testdata():
    import sys

    if TESTDATA not in sys.path:
        sys.path.insert(0, TESTDATA)


@pytest.mark.parametrize("heads", [False, True])
def test_round_trip_keras_hf_keras_is_bit_exact(tmp_path, heads):
    from bert_keras.checkpoints import save_hf_weights
    from bert_keras.model_loading import load_checkpoint
    from safetensors.numpy import load_file

    model = _tiny_pretrainer(seed=4)
    model = model if heads else model.encoder
    save_hf_weights(model, str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors"]
    keys = set(load_file(str(tmp_path / "out" / "model.safetensors")))
    if heads:
        assert "bert.encoder.layer.2.output.dense.weight" in keys
        assert "cls.seq_relationship.weight" in keys
        assert not any(k.startswith("cls.predictions.decoder") for k in keys)  # tied
    else:
        assert "encoder.layer.2.output.dense.weight" in keys and not any("cls" in k for k in keys)
    loaded = load_checkpoint(str(tmp_path / "out"), fmt="hf").model
    assert type(loaded) is type(model)
    assert loaded.count_params() == model.count_params()
    for a, b in zip(model.weights, loaded.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        save_hf_weights(model, str(tmp_path / "out"))


@pytest.mark.parametrize("heads", [False, True])
def test_saved_hf_loads_in_transformers(tmp_path, heads):
    """Our HF save loads in transformers with no missing/unexpected keys, same outputs."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert_keras.checkpoints import save_hf_weights

    sys_path_testdata()
    import make_hf_golden

    model = _tiny_pretrainer(seed=6, hidden_act="gelu_tanh")  # saved as HF's "gelu_new"
    inputs = make_inputs(batch=2, seq=10, lengths=[10, 6], seed=5)
    if heads:
        save_hf_weights(model, str(tmp_path / "out"))
        hf, info = transformers.BertForPreTraining.from_pretrained(
            str(tmp_path / "out"), output_loading_info=True)
    else:
        save_hf_weights(model.encoder, str(tmp_path / "out"))
        hf, info = transformers.BertModel.from_pretrained(
            str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    hf.eval()
    if heads:
        assert hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight
        expected = _hf_pretraining_outputs(hf, inputs, POSITIONS)
        out = model(dict(inputs, masked_lm_positions=POSITIONS))
        for key in ("mlm_logits", "nsp_logits"):
            np.testing.assert_allclose(out[key], expected[key], atol=1e-5, err_msg=key)
    else:
        expected = make_hf_golden.run_hf(hf, inputs)
        assert_outputs_close(model.encoder(inputs), expected, inputs["input_mask"])


def test_hf_tied_copies_and_position_ids(tmp_path):
    """Older files carry cls.predictions.decoder.* copies and an embeddings.position_ids
    buffer: accepted when consistent, rejected when the decoder is untied."""
    from bert_keras.checkpoints import load_hf_weights, save_hf_weights
    from safetensors.numpy import load_file, save_file

    model = _tiny_pretrainer(seed=2)
    save_hf_weights(model, str(tmp_path / "out"))
    path = tmp_path / "out" / "model.safetensors"
    tensors = load_file(str(path))
    tensors["bert.embeddings.position_ids"] = np.arange(40, dtype=np.int64)[None]
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    fresh = _tiny_pretrainer(seed=9)
    load_hf_weights(fresh, str(tmp_path / "out"))
    for a, b in zip(model.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)
    tensors["cls.predictions.decoder.weight"] = tensors["cls.predictions.decoder.weight"] + 1
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(WeightLoadError, match="cls.predictions.decoder.weight differs"):
        load_hf_weights(_tiny_pretrainer(), str(tmp_path / "out"))
    # An encoder leaves the heads out, consistent or not, only when asked to.
    with pytest.raises(WeightLoadError, match="unexpected 7: cls.predictions.bias"):
        load_hf_weights(fresh.encoder, str(tmp_path / "out"))
    load_hf_weights(fresh.encoder, str(tmp_path / "out"), allow_unused=True)


def test_pretrainer_from_bert_model_file_lists_missing_heads():
    model = _tiny_pretrainer()
    before = model.get_weights()
    with pytest.raises(WeightLoadError) as e:
        load_hf_weights(model, os.path.join(TESTDATA, "hf_bert_gelu"))
    message = str(e.value)
    assert "missing 7: cls.predictions.bias" in message and "cls.seq_relationship.weight" in message
    assert "no pretraining heads" in message
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_pretrainer_head_shape_mismatch_names_hf_tensor(tmp_path):
    from bert_keras.checkpoints import save_hf_weights

    save_hf_weights(_tiny_pretrainer(), str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    model = _tiny_pretrainer(intermediate_size=36)
    assert config["intermediate_size"] == 37
    with pytest.raises(WeightLoadError) as e:
        load_hf_weights(model, str(tmp_path / "out"))
    # Named as the (BertForPreTraining) file spells it, with both shapes in the file's layout.
    assert "bert.encoder.layer.0.intermediate.dense.weight: model (36, 32), file (37, 32) " \
           "(our transformer_layer_0/intermediate/kernel (32, 36) transposed)" in str(e.value)
