"""Google TF1-format checkpoints: load, save, round trip, bad input.

The reference checkpoint is built here independently of bert_keras.checkpoints' name table:
TF1 variables named by docs/DESIGN.md section 5 (written out below), filled from a random
transformers BertForPreTraining, saved with tf.compat.v1.train.Saver.
"""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from bert_keras import BertConfig, BertEncoder, BertPretrainer
from bert_keras.checkpoints import (
    WeightLoadError,
    check_output_free,
    load_google_checkpoint,
    save_google_checkpoint,
)
from bert_keras.model_loading import load_checkpoint
from conftest import TINY, assert_models_equal, make_inputs

NUM_LAYERS = TINY["num_layers"]
V, H, I, P = TINY["vocab_size"], TINY["hidden_size"], TINY["intermediate_size"], 40

# docs/DESIGN.md section 5, spelled out (not derived from the code under test).
SECTION_5 = {
    "bert/embeddings/word_embeddings": (V, H),
    "bert/embeddings/token_type_embeddings": (2, H),
    "bert/embeddings/position_embeddings": (P, H),
    "bert/embeddings/LayerNorm/gamma": (H,),
    "bert/embeddings/LayerNorm/beta": (H,),
    **{
        f"bert/encoder/layer_{i}/{name}": shape
        for i in range(NUM_LAYERS)
        for name, shape in {
            "attention/self/query/kernel": (H, H), "attention/self/query/bias": (H,),
            "attention/self/key/kernel": (H, H), "attention/self/key/bias": (H,),
            "attention/self/value/kernel": (H, H), "attention/self/value/bias": (H,),
            "attention/output/dense/kernel": (H, H), "attention/output/dense/bias": (H,),
            "attention/output/LayerNorm/gamma": (H,), "attention/output/LayerNorm/beta": (H,),
            "intermediate/dense/kernel": (H, I), "intermediate/dense/bias": (I,),
            "output/dense/kernel": (I, H), "output/dense/bias": (H,),
            "output/LayerNorm/gamma": (H,), "output/LayerNorm/beta": (H,),
        }.items()
    },
    "bert/pooler/dense/kernel": (H, H),
    "bert/pooler/dense/bias": (H,),
}
SECTION_5_HEADS = {
    "cls/predictions/transform/dense/kernel": (H, H),
    "cls/predictions/transform/dense/bias": (H,),
    "cls/predictions/transform/LayerNorm/gamma": (H,),
    "cls/predictions/transform/LayerNorm/beta": (H,),
    "cls/predictions/output_bias": (V,),
    "cls/seq_relationship/output_weights": (2, H),  # [out, in]
    "cls/seq_relationship/output_bias": (2,),
}


def google_config(**overrides):
    """A bert_config.json dict as Google writes it (no layer_norm_eps key)."""
    config = dict(vocab_size=V, hidden_size=H, num_hidden_layers=NUM_LAYERS,
                  num_attention_heads=TINY["num_heads"], intermediate_size=I, hidden_act="gelu",
                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  max_position_embeddings=P, type_vocab_size=2, initializer_range=0.02)
    config.update(overrides)
    return config


def write_tf1_checkpoint(prefix, tensors, config=None):
    """Saves {name: array} with TF1 variables and Saver, as Google's run_pretraining.py did."""
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    with tf.Graph().as_default():
        variables = [tf.compat.v1.Variable(v, name=n) for n, v in tensors.items()]
        assert [v.op.name for v in variables] == list(tensors)
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, prefix)
    if config is not None:
        with open(os.path.join(os.path.dirname(prefix), "bert_config.json"), "w") as f:
            json.dump(config, f)
    return prefix


def hf_to_section_5(state):
    """transformers BertForPreTraining state dict -> docs/DESIGN.md section 5 names and layouts."""
    out = {}
    for key, value in state.items():
        if key.startswith("cls.predictions.decoder"):
            continue  # tied to the word embeddings / cls.predictions.bias
        value = value.detach().numpy()
        name = re.sub(r"^bert\.encoder\.layer\.(\d+)\.", r"bert/encoder/layer_\1/", key)
        name = name.replace(".", "/")
        name = re.sub(r"LayerNorm/weight$", "LayerNorm/gamma", name)
        name = re.sub(r"LayerNorm/bias$", "LayerNorm/beta", name)
        name = {"cls/predictions/bias": "cls/predictions/output_bias",
                "cls/seq_relationship/weight": "cls/seq_relationship/output_weights",
                "cls/seq_relationship/bias": "cls/seq_relationship/output_bias"}.get(name, name)
        if "embeddings/" in name and name.endswith("/weight"):
            name = name[: -len("/weight")]  # embedding tables: same [rows, H] layout
        elif name.endswith("/weight"):
            name = name[: -len("/weight")] + "/kernel"
            value = value.T  # nn.Linear [out, in] -> TF [in, out]
        out[name] = np.ascontiguousarray(value)
    return out


def randomize(model, seed=0):
    """Gives every weight (biases, LayerNorm and heads included) distinct random values."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.2, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def tiny_pretrainer(**overrides):
    return BertPretrainer(BertEncoder(**{**TINY, **overrides}))


# ------------------------------------------------------------------------------------------
# Against transformers, through an independently written TF1 checkpoint.


@pytest.fixture(scope="module")
def google_reference(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(11)
    hf = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=NUM_LAYERS,
        num_attention_heads=TINY["num_heads"], intermediate_size=I, max_position_embeddings=P,
        hidden_act="gelu", initializer_range=0.2)).eval()
    with torch.no_grad():  # Non-trivial biases and LayerNorms, so a swapped one shows.
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    tensors = hf_to_section_5(hf.state_dict())
    assert {n: t.shape for n, t in tensors.items()} == {**SECTION_5, **SECTION_5_HEADS}
    # A training checkpoint: optimizer slots and global_step, which must be skipped.
    tensors["global_step"] = np.int64(1000)
    for name in ("bert/embeddings/word_embeddings", "cls/seq_relationship/output_weights"):
        tensors[f"{name}/adam_m"] = np.ones_like(tensors[name])
        tensors[f"{name}/adam_v"] = np.ones_like(tensors[name])
    prefix = str(tmp_path_factory.mktemp("google") / "bert_model.ckpt")
    write_tf1_checkpoint(prefix, tensors, google_config())

    inputs = make_inputs(batch=4, seq=13, lengths=[13, 9, 5, 2], seed=7)
    positions = np.array([[1, 4, 12], [2, 3, 8], [1, 2, 4], [1, 0, 0]], np.int32)
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(inputs["input_word_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
                 token_type_ids=torch.tensor(inputs["input_type_ids"], dtype=torch.long),
                 output_hidden_states=True)
    expected = {
        "sequence_output": out.hidden_states[-1].numpy(),
        "pooled_output": hf.bert.pooler(out.hidden_states[-1]).detach().numpy(),
        "mlm_logits": np.take_along_axis(out.prediction_logits.numpy(),
                                         positions[:, :, None], axis=1),
        "nsp_logits": out.seq_relationship_logits.numpy(),
    }
    return prefix, dict(inputs, masked_lm_positions=positions), expected


def test_google_checkpoint_matches_transformers(google_reference):
    prefix, inputs, expected = google_reference
    model = load_checkpoint(prefix, fmt="google").model  # auto: the checkpoint has cls/* heads
    assert isinstance(model, BertPretrainer)
    out = model(inputs, training=False)
    np.testing.assert_allclose(out["mlm_logits"], expected["mlm_logits"], atol=1e-5)
    np.testing.assert_allclose(out["nsp_logits"], expected["nsp_logits"], atol=1e-5)
    enc = model.encoder({k: inputs[k] for k in model.encoder.input}, training=False)
    mask = inputs["input_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(enc["sequence_output"])[mask],
                               expected["sequence_output"][mask], atol=1e-5)
    np.testing.assert_allclose(enc["pooled_output"], expected["pooled_output"], atol=1e-5)
    diffs = {k: np.abs(np.asarray(v) - expected[k]).max() for k, v in
             [("mlm_logits", out["mlm_logits"]), ("nsp_logits", out["nsp_logits"]),
              ("pooled_output", enc["pooled_output"])]}
    print("Google checkpoint vs transformers, max abs diff:",
          {k: f"{v:.1e}" for k, v in diffs.items()})


def test_google_checkpoint_into_encoder_skips_heads(google_reference):
    prefix, inputs, expected = google_reference
    encoder = BertEncoder(**TINY)
    load_google_checkpoint(encoder, os.path.dirname(prefix))  # a directory works too
    out = encoder({k: inputs[k] for k in encoder.input})
    np.testing.assert_allclose(out["pooled_output"], expected["pooled_output"], atol=1e-5)


# ------------------------------------------------------------------------------------------
# Saving.


def test_round_trip_keras_google_keras_is_bit_exact(tmp_path):
    model = randomize(tiny_pretrainer())
    prefix = save_google_checkpoint(model, str(tmp_path / "out" / "bert_model.ckpt"))
    assert sorted(os.listdir(tmp_path / "out")) == [
        "bert_config.json", "bert_model.ckpt.data-00000-of-00001", "bert_model.ckpt.index"]
    assert BertConfig.from_json_file(tmp_path / "out" / "bert_config.json") == \
        model.encoder.to_bert_config()
    assert dict(tf.train.list_variables(prefix)) == {
        k: list(v) for k, v in {**SECTION_5, **SECTION_5_HEADS}.items()}
    loaded = load_checkpoint(prefix, fmt="google").model
    assert_models_equal(model, loaded)

    encoder = randomize(BertEncoder(**TINY), seed=1)
    prefix = save_google_checkpoint(encoder, str(tmp_path / "enc" / "model.ckpt"))
    assert dict(tf.train.list_variables(prefix)) == {k: list(v) for k, v in SECTION_5.items()}
    assert_models_equal(encoder, load_checkpoint(prefix, fmt="google").model)


def test_a_bert_config_file_of_another_model_is_named_in_the_error(tmp_path):
    """Google's tools take --bert_config_file with --init_checkpoint; one of another model
    than the checkpoint's own (a 2-layer config for a 3-layer checkpoint, a hidden size
    that differs) was told only as the tensor names or shapes that differ, never naming the
    config or the bert_config.json beside the checkpoint that fits it."""
    model = randomize(tiny_pretrainer())
    prefix = save_google_checkpoint(model, str(tmp_path / "run" / "model.ckpt-5"))
    beside = tmp_path / "run" / "bert_config.json"
    fewer = tmp_path / "fewer_layers.json"
    fewer.write_text(json.dumps(google_config(num_hidden_layers=NUM_LAYERS - 1)))
    with pytest.raises(WeightLoadError, match=(
            rf"(?s)unexpected 16: .*\(--bert_config_file {re.escape(str(fewer))} describes another "
            rf"model than {re.escape(str(beside))} beside the checkpoint: num_hidden_layers "
            rf"{NUM_LAYERS - 1} vs {NUM_LAYERS}; leave --bert_config_file out")):
        load_checkpoint(prefix, bert_config_file=str(fewer))
    wider = tmp_path / "wider.json"
    wider.write_text(json.dumps(google_config(hidden_size=2 * H)))
    with pytest.raises(WeightLoadError, match=rf"(?s)wrong shape .*hidden_size {2 * H} vs {H};"):
        load_checkpoint(prefix, bert_config_file=str(wider))
    # Its own config, given explicitly, loads; without one beside it, the error asks.
    assert_models_equal(model, load_checkpoint(prefix, bert_config_file=str(beside)).model)
    os.rename(beside, tmp_path / "own.json")
    with pytest.raises(WeightLoadError, match=r"(?s)\(the model was built from --bert_config_file "
                                              r".*fewer_layers\.json: is it this checkpoint's"):
        load_checkpoint(prefix, bert_config_file=str(fewer))


def test_a_masked_lm_without_nsp_round_trips_through_the_google_format(tmp_path):
    """An MLM-only pretrainer (RoBERTa's recipe, transformers' BertForMaskedLM) is written
    without cls/seq_relationship/*; it read back as a pretrainer with the NSP head, which
    then missed those two tensors, so such a file was no --init_checkpoint for anything."""
    model = randomize(BertPretrainer(BertEncoder(**TINY), next_sentence=False))
    prefix = save_google_checkpoint(model, str(tmp_path / "bert_model.ckpt"))
    names = dict(tf.train.list_variables(prefix))
    assert "cls/predictions/output_bias" in names
    assert not any(n.startswith("cls/seq_relationship/") for n in names)
    loaded = load_checkpoint(prefix, fmt="google").model
    assert isinstance(loaded, BertPretrainer) and not loaded.next_sentence
    assert_models_equal(model, loaded)


def test_a_copied_google_directory_reads_its_own_checkpoint(tmp_path):
    """A TF1 Saver (and an Estimator's model_dir) writes the `checkpoint` state file with
    absolute paths: a copy of the directory named the original's prefix, so the copy's
    weights, bert_config.json and vocabulary were read from the original."""
    import shutil

    from bert_keras.checkpoints import google_checkpoint_prefix

    model = randomize(tiny_pretrainer())
    ours = save_google_checkpoint(model, str(tmp_path / "ours" / "bert_model.ckpt"))
    reader = tf.train.load_checkpoint(ours)
    tensors = {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(ours)}
    config = json.loads((tmp_path / "ours" / "bert_config.json").read_text())
    original, copy = tmp_path / "original", tmp_path / "copy"
    write_tf1_checkpoint(str(original / "bert_model.ckpt"), tensors, config)
    assert f'"{original}' in (original / "checkpoint").read_text()  # an absolute path
    shutil.copytree(original, copy)
    # The original changes after the copy (trained on, or replaced).
    write_tf1_checkpoint(str(original / "bert_model.ckpt"),
                         {name: value + 1 for name, value in tensors.items()}, config)
    assert google_checkpoint_prefix(str(copy)) == str(copy / "bert_model.ckpt")
    assert_models_equal(model, load_checkpoint(str(copy), fmt="google").model)
    # A prefix inside the directory, named relatively or absolutely, is read as before.
    assert google_checkpoint_prefix(str(original)) == str(original / "bert_model.ckpt")
    # Moved (the original is gone), with an older checkpoint beside the one named: the named
    # one is read. tf.train.latest_checkpoint gives None there, and the directory of two
    # checkpoints was "not a recognised checkpoint".
    write_tf1_checkpoint(str(copy / "bert_model.ckpt-0"), tensors, config)
    (copy / "checkpoint").write_text(
        f'model_checkpoint_path: "{original / "bert_model.ckpt"}"\n'
        f'all_model_checkpoint_paths: "{original / "bert_model.ckpt"}"\n')
    shutil.rmtree(original)
    assert google_checkpoint_prefix(str(copy)) == str(copy / "bert_model.ckpt")
    assert_models_equal(model, load_checkpoint(str(copy), fmt="google").model)


@pytest.mark.parametrize("head", ["run_classifier", "run_squad"])
def test_a_fine_tuned_google_checkpoint_loads_with_its_head(tmp_path, head):
    """Google's run_classifier writes bert/* + output_weights [C, H] / output_bias, run_squad
    bert/* + cls/squad/*. The loader builds the fine-tuned model, head included (Google's
    init_from_checkpoint restores it too): before, it gave the encoder alone and dropped the
    head with an INFO line, so `--do_predict --init_checkpoint=<Google classifier>` failed
    with "nothing to evaluate" and `--do_train` trained a new head over the trained one.
    --model=encoder converts the encoder alone; a classifier, which records no label
    names, does not convert as one."""
    from bert_keras.tasks import BertClassifier, BertSpanQA

    encoder = randomize(BertEncoder(**TINY), seed=3)
    prefix = save_google_checkpoint(encoder, str(tmp_path / "enc" / "bert_model.ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(prefix)}
    rng = np.random.default_rng(0)
    scope, classes = ("", 3) if head == "run_classifier" else ("cls/squad/", 2)
    tensors[f"{scope}output_weights"] = rng.normal(size=(classes, H)).astype(np.float32)
    tensors[f"{scope}output_bias"] = rng.normal(size=classes).astype(np.float32)
    tensors[f"{scope}output_weights/adam_m"] = np.ones((classes, H), np.float32)
    tensors["global_step"] = np.int64(300)
    fine_tuned = write_tf1_checkpoint(str(tmp_path / "ft" / "model.ckpt-300"), tensors,
                                      google_config())
    from bert_keras.convert_checkpoint import convert

    loaded = load_checkpoint(fine_tuned, fmt="google")
    assert type(loaded.model) is (BertClassifier if head == "run_classifier" else BertSpanQA)
    assert loaded.labels is None
    assert_models_equal(encoder, loaded.encoder)
    kernel, bias = loaded.model.get_layer(
        "classifier" if head == "run_classifier" else "span_logits").get_weights()
    np.testing.assert_array_equal(kernel, tensors[f"{scope}output_weights"].T)
    np.testing.assert_array_equal(bias, tensors[f"{scope}output_bias"])

    with pytest.raises(WeightLoadError, match=r"cls/predictions"):  # pretraining heads: none
        convert("google", "hf", fine_tuned, str(tmp_path / "hf_pretrainer"), model="pretrainer")
    assert not os.path.exists(tmp_path / "hf_pretrainer")
    if head == "run_classifier":
        with pytest.raises(ValueError, match=r"no label names for its BertClassifier .*Google "
                                             r"run_classifier.*--model=encoder"):
            convert("google", "hf", fine_tuned, str(tmp_path / "hf_auto"))
        assert not os.path.exists(tmp_path / "hf_auto")
    else:
        convert("google", "hf", fine_tuned, str(tmp_path / "hf_auto"))
        back = load_checkpoint(str(tmp_path / "hf_auto"), fmt="hf").model
        assert isinstance(back, BertSpanQA)
        for x, y in zip(loaded.model.weights, back.weights):  # BertForQuestionAnswering
            if "pooler" not in x.path:                        # has no pooler
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=x.path)
    _, converted = convert("google", "hf", fine_tuned, str(tmp_path / "hf"), model="encoder")
    assert_models_equal(encoder, converted)
    assert_models_equal(encoder, load_checkpoint(fine_tuned, fmt="google", want="encoder").model)


def test_a_google_checkpoint_with_an_unknown_head_converts_only_as_an_encoder(tmp_path):
    """A head none of Google's scripts writes (another scope) is refused by convert_checkpoint
    unless --model=encoder asks for the encoder alone."""
    encoder = randomize(BertEncoder(**TINY), seed=3)
    prefix = save_google_checkpoint(encoder, str(tmp_path / "enc" / "bert_model.ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(prefix)}
    tensors["my_head/dense/kernel"] = np.zeros((H, 4), np.float32)
    custom = write_tf1_checkpoint(str(tmp_path / "ft" / "model.ckpt"), tensors, google_config())
    from bert_keras.convert_checkpoint import convert

    with pytest.raises(WeightLoadError, match=r"holds tensors of a head bert-keras does not "
                                              r"build from a Google checkpoint "
                                              r"\(my_head/dense/kernel; .*--model=encoder"):
        convert("google", "hf", custom, str(tmp_path / "hf_auto"))
    assert not os.path.exists(tmp_path / "hf_auto")
    _, converted = convert("google", "hf", custom, str(tmp_path / "hf"), model="encoder")
    assert_models_equal(encoder, converted)


def test_saved_checkpoint_restores_with_tf1_saver(tmp_path):
    """Google's own loading path: TF1 variables by section 5 name, Saver.restore."""
    model = randomize(tiny_pretrainer())
    prefix = save_google_checkpoint(model, str(tmp_path / "bert_model.ckpt"))
    names = {**SECTION_5, **SECTION_5_HEADS}
    with tf.Graph().as_default():
        variables = {n: tf.compat.v1.Variable(tf.zeros(s), name=n) for n, s in names.items()}
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver(list(variables.values())).restore(sess, prefix)
            values = sess.run(variables)
    ours = {v.path: np.asarray(v) for v in model.weights}
    np.testing.assert_array_equal(values["cls/seq_relationship/output_weights"],
                                  ours["nsp_dense/kernel"].T)
    np.testing.assert_array_equal(values["bert/encoder/layer_2/intermediate/dense/kernel"],
                                  ours["transformer_layer_2/intermediate/kernel"])
    np.testing.assert_array_equal(values["cls/predictions/output_bias"],
                                  ours["masked_lm/output_bias"])


def test_save_refuses_to_overwrite(tmp_path):
    model = tiny_pretrainer()
    prefix = str(tmp_path / "bert_model.ckpt")
    save_google_checkpoint(model, prefix)
    with pytest.raises(FileExistsError, match="bert_model.ckpt.index"):
        save_google_checkpoint(model, prefix)
    # A second checkpoint of the same model may share the directory (same bert_config.json) ...
    save_google_checkpoint(model, str(tmp_path / "step2.ckpt"))
    # ... one of a different model may not.
    other = BertEncoder(**{**TINY, "num_layers": 2})
    with pytest.raises(FileExistsError, match="bert_config.json"):
        save_google_checkpoint(other, str(tmp_path / "other.ckpt"))
    assert not any("tmp" in f for f in os.listdir(tmp_path))


def test_save_into_a_directory_and_beside_googles_own_config(tmp_path):
    """--output=dir/ (or an existing directory) writes dir/bert_model.ckpt, as Google names
    its checkpoints; before, `dir/` wrote dir.index and dir.data-* beside it and the
    directory stayed empty. A bert_config.json Google wrote for the same model (its key
    order, no layer_norm_eps) is kept; before, it was refused as "a different model"."""
    model = randomize(tiny_pretrainer())
    prefix = save_google_checkpoint(model, str(tmp_path / "new") + os.sep)
    assert prefix == str(tmp_path / "new" / "bert_model.ckpt")
    assert sorted(os.listdir(tmp_path)) == ["new"]
    (tmp_path / "existing").mkdir()
    save_google_checkpoint(model, str(tmp_path / "existing"))
    assert sorted(os.listdir(tmp_path / "existing")) == sorted(os.listdir(tmp_path / "new"))
    with pytest.raises(FileExistsError, match="bert_model.ckpt.index"):
        check_output_free("google", str(tmp_path / "existing"))
    config = google_config(num_hidden_layers=model.encoder.num_layers)
    assert BertConfig.from_dict(config) == model.encoder.to_bert_config()
    google = tmp_path / "google"
    google.mkdir()
    (google / "bert_config.json").write_text(json.dumps(dict(reversed(config.items())), indent=1))
    save_google_checkpoint(model, str(google / "bert_model.ckpt"))
    assert_models_equal(model, load_checkpoint(str(google / "bert_model.ckpt"), fmt="google").model)
    (google / "bert_config.json").write_text(json.dumps(dict(config, intermediate_size=I + 1)))
    with pytest.raises(FileExistsError, match="describes a different model"):
        save_google_checkpoint(model, str(google / "other.ckpt"))


def test_an_interrupted_google_save_leaves_no_data_file_and_blocks_no_rerun(tmp_path,
                                                                          monkeypatch):
    """Ctrl-C between its two renames left bert_model.ckpt.data-* without an index, and the
    rerun refused to overwrite it; a checkpoint exists once its index does."""
    model = randomize(tiny_pretrainer())
    prefix = str(tmp_path / "bert_model.ckpt")
    real = os.replace

    def interrupted(source, target):
        if target.endswith(".index"):
            raise KeyboardInterrupt
        return real(source, target)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_google_checkpoint(model, prefix)
    monkeypatch.setattr(os, "replace", real)
    assert sorted(os.listdir(tmp_path)) == ["bert_config.json"]
    (tmp_path / "bert_model.ckpt.data-00000-of-00001").write_bytes(b"left by a kill")
    save_google_checkpoint(model, prefix)
    assert_models_equal(model, load_checkpoint(prefix, fmt="google").model)


# ------------------------------------------------------------------------------------------
# Bad input: clear errors, and the model is never left half-loaded.


@pytest.fixture
def saved(tmp_path):
    """A valid checkpoint of a tiny pretrainer: (prefix, tensors by section 5 name)."""
    model = randomize(tiny_pretrainer(), seed=3)
    prefix = save_google_checkpoint(model, str(tmp_path / "src" / "bert_model.ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    return prefix, {n: reader.get_tensor(n) for n, _ in tf.train.list_variables(prefix)}


def assert_unchanged(model, before):
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_shape_mismatch_names_tensor_and_both_shapes(saved):
    prefix, _ = saved
    os.remove(os.path.join(os.path.dirname(prefix), "bert_config.json"))  # shapes only
    model = tiny_pretrainer(vocab_size=98)
    before = model.get_weights()
    with pytest.raises(WeightLoadError) as e:
        load_google_checkpoint(model, prefix)
    message = str(e.value)
    assert "bert/embeddings/word_embeddings: model (98, 32), file (99, 32)" in message
    assert "cls/predictions/output_bias: model (98,), file (99,)" in message
    assert_unchanged(model, before)


def test_transposed_shape_mismatch_is_reported_in_file_layout(tmp_path, saved):
    _, tensors = saved
    name = "cls/seq_relationship/output_weights"
    tensors[name] = tensors[name].T  # [H, 2]: the Keras layout, not Google's
    prefix = write_tf1_checkpoint(str(tmp_path / "t" / "model.ckpt"), tensors)
    with pytest.raises(WeightLoadError, match=r"output_weights: model \(2, 32\), file \(32, 2\)"):
        load_google_checkpoint(tiny_pretrainer(), prefix)


def test_missing_and_unexpected_tensors_are_listed(tmp_path, saved):
    _, tensors = saved
    del tensors["bert/encoder/layer_1/output/dense/bias"]
    del tensors["cls/predictions/transform/LayerNorm/gamma"]
    tensors["bert/encoder/layer_3/output/dense/bias"] = np.zeros(H, np.float32)
    tensors["output_weights"] = np.zeros((3, H), np.float32)  # a classifier head: skipped
    prefix = write_tf1_checkpoint(str(tmp_path / "m" / "model.ckpt"), tensors)
    model = tiny_pretrainer()
    before = model.get_weights()
    with pytest.raises(WeightLoadError) as e:
        load_google_checkpoint(model, prefix)
    message = str(e.value)
    assert "missing 2: bert/encoder/layer_1/output/dense/bias, " \
           "cls/predictions/transform/LayerNorm/gamma" in message
    assert "unexpected 1: bert/encoder/layer_3/output/dense/bias" in message
    assert "output_weights" not in message.split("unexpected")[1]
    assert_unchanged(model, before)


def test_pretrainer_from_encoder_checkpoint_says_so(tmp_path):
    prefix = save_google_checkpoint(BertEncoder(**TINY), str(tmp_path / "model.ckpt"))
    with pytest.raises(WeightLoadError, match=r"(?s)missing 7: cls/.*no pretraining heads"):
        load_google_checkpoint(tiny_pretrainer(), prefix)
    with pytest.raises(WeightLoadError, match="no pretraining heads"):
        load_checkpoint(prefix, want="pretrainer", fmt="google").model


@pytest.mark.parametrize("which", ["data-00000-of-00001", "index"])
def test_truncated_checkpoint_is_a_clear_error(saved, which):
    prefix, _ = saved
    path = f"{prefix}.{which}"
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    model = tiny_pretrainer()
    before = model.get_weights()
    with pytest.raises(WeightLoadError, match=re.escape(prefix)) as e:
        load_google_checkpoint(model, prefix)
    assert "truncated" in str(e.value) or "complete" in str(e.value)
    assert_unchanged(model, before)


def test_config_beside_checkpoint_is_checked(tmp_path, saved):
    _, tensors = saved
    prefix = write_tf1_checkpoint(str(tmp_path / "c" / "model.ckpt"), tensors,
                                  google_config(num_attention_heads=8))
    with pytest.raises(WeightLoadError, match="num_attention_heads: model has 4, weights were "
                                              "trained with 8"):
        load_google_checkpoint(tiny_pretrainer(), prefix)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothing\.ckpt\.index"):
        load_google_checkpoint(BertEncoder(**TINY), str(tmp_path / "nothing.ckpt"))
    with pytest.raises(FileNotFoundError, match="found 0"):
        load_google_checkpoint(BertEncoder(**TINY), str(tmp_path))


def test_a_google_checkpoint_says_what_googles_code_cannot_run(tmp_path, caplog):
    """hidden_act gelu_new (transformers' tanh GELU) and another LayerNorm epsilon are
    written to bert_config.json as they are, which bert-keras and transformers read, but
    Google's modeling.py raises "Unsupported activation" for the one and ignores the other."""
    model = BertEncoder(**{**TINY, "hidden_act": "gelu_new", "layer_norm_epsilon": 1e-5})
    with caplog.at_level("WARNING"):
        prefix = save_google_checkpoint(model, str(tmp_path / "g" / "bert_model.ckpt"))
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("hidden_act 'gelu_new', which Google's modeling.py refuses" in m for m in said)
    assert any("layer_norm_eps 1e-05, where Google's modeling.py always uses 1e-12" in m
               for m in said)
    assert_models_equal(model, load_checkpoint(prefix, fmt="google").model)
    caplog.clear()
    with caplog.at_level("WARNING"):
        save_google_checkpoint(BertEncoder(**TINY), str(tmp_path / "plain" / "bert_model.ckpt"))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_google_checkpoints_vocabulary_is_written_only_with_the_casing_given(tmp_path,
                                                                                caplog):
    """A Google checkpoint records no tokenizer casing. A run_squad model converted with the
    vocab.txt beside it was written with do_lower_case=true, whatever its vocabulary's case,
    without a word: a cased model lowercased from then on (transformers' AutoTokenizer on
    the --to=hf output, the fine-tuning tools on --to=keras). Now its casing is given with
    Google's --do_lower_case (or the conversion is refused, naming the flag); an encoder's
    vocabulary is left out without it, as before, saying why and what keeps it."""
    from bert_keras.convert_checkpoint import convert
    from test_export import write_vocab

    encoder = randomize(BertEncoder(**TINY), seed=5)
    prefix = save_google_checkpoint(encoder, str(tmp_path / "enc" / "bert_model.ckpt"))
    write_vocab(tmp_path / "enc" / "vocab.txt")
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(prefix)}
    tensors["cls/squad/output_weights"] = np.ones((2, H), np.float32)
    tensors["cls/squad/output_bias"] = np.zeros(2, np.float32)
    squad = write_tf1_checkpoint(str(tmp_path / "squad" / "model.ckpt-3"), tensors,
                                 google_config())
    write_vocab(tmp_path / "squad" / "vocab.txt")
    for to in ("keras", "hf"):
        with pytest.raises(ValueError, match=r"a Google checkpoint records no tokenizer casing, "
                                             r"and its BertSpanQA is written with .*vocab.txt: "
                                             r"pass --do_lower_case=true or --do_lower_case"):
            convert("google", to, squad, str(tmp_path / f"refused_{to}"))
        assert not os.path.exists(tmp_path / f"refused_{to}")
        out = tmp_path / f"cased_{to}"
        convert("google", to, squad, str(out), tokenizer_overrides={"do_lower_case": False})
        settings = json.loads((out / "tokenizer_config.json").read_text())
        assert settings["do_lower_case"] is False, settings
    # Given for an input that saved its settings, the flags override them, saying so.
    caplog.set_level("WARNING")
    caplog.clear()
    convert("keras", "hf", str(tmp_path / "cased_keras"), str(tmp_path / "lowered"),
            tokenizer_overrides={"do_lower_case": True})
    assert json.loads((tmp_path / "lowered" / "tokenizer_config.json").read_text())[
        "do_lower_case"] is True
    assert "--do_lower_case=true overrides the tokenizer settings saved in" in caplog.text
    caplog.clear()
    convert("google", "hf", prefix, str(tmp_path / "encoder_hf"))
    assert not (tmp_path / "encoder_hf" / "vocab.txt").exists()
    assert "vocab.txt is left out: a Google checkpoint records no tokenizer casing (pass " \
           "--do_lower_case=true or false" in caplog.text
    assert "No vocab.txt found" not in caplog.text
    convert("google", "hf", prefix, str(tmp_path / "encoder_cased"),
            tokenizer_overrides={"do_lower_case": False})
    assert (tmp_path / "encoder_cased" / "vocab.txt").exists()
    assert json.loads((tmp_path / "encoder_cased" / "tokenizer_config.json").read_text())[
        "do_lower_case"] is False


def test_a_directory_of_several_google_checkpoints_says_which_to_name(tmp_path):
    """Two TF1 checkpoints in a directory without a `checkpoint` file: the loader said the
    directory "is not a recognised checkpoint"; it names them and what to pass."""
    from bert_keras.model_loading import CheckpointError

    encoder = randomize(BertEncoder(**TINY), seed=6)
    for step in (1, 2):
        save_google_checkpoint(encoder, str(tmp_path / "run" / f"model.ckpt-{step}"))
    with pytest.raises(CheckpointError, match=r"run holds 2 TF checkpoints \(model.ckpt-1, "
                                              r"model.ckpt-2\) and no checkpoint file naming "
                                              r"one: pass the prefix of the one to read "
                                              r"\(.*run/model.ckpt-2\)"):
        load_checkpoint(str(tmp_path / "run"))


# Every column of the name table (checkpoints.WeightName): ours and each format's.
NAME_COLUMNS = ("ours", "google", "hf", "model_garden", "keras_hub")


@pytest.mark.parametrize("kind", ["encoder", "pretrainer", "masked_lm", "BertClassifier",
                                  "BertRegressor", "BertTagger", "BertSpanQA"])
def test_the_name_table_names_each_weight_once_in_every_format(kind):
    """Within one model's rows, no two weights share a name in any format ("" = none): a
    shared name would read one tensor into two variables, or write one over the other."""
    from bert_keras import checkpoints

    layers = 3
    if kind in ("encoder", "pretrainer", "masked_lm"):
        rows = (checkpoints.encoder_weight_names(layers) if kind == "encoder" else
                checkpoints.pretrainer_weight_names(layers, next_sentence=kind == "pretrainer"))
    else:
        model = next(m for m in checkpoints.TASK_MODELS if m.__name__ == kind)
        rows = checkpoints.encoder_weight_names(layers) + list(
            checkpoints.TASK_HEAD_WEIGHTS[model])
    for column in NAME_COLUMNS:
        names = [getattr(row, column) for row in rows if getattr(row, column)]
        repeated = sorted({n for n in names if names.count(n) > 1})
        assert not repeated, (kind, column, repeated)
        assert not any("{i}" in n for n in names), (kind, column)  # every layer filled in
