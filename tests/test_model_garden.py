"""TF Model Garden TF2 checkpoints and TF Hub BERT SavedModels, read through the one loader.

The reference is tests/testdata/model_garden, made by tf-models-official 2.20.0 itself
(make_fixtures.py says how): a tiny BertEncoder (vocabulary 41, hidden 24, 3 heads, 2
layers, intermediate 40, 29 positions, 3 token types) with random weights, saved as
`tf.train.Checkpoint(encoder=...)`, as BertPretrainerV2's checkpoint (with the masked-LM
head), and exported by export_tfhub_lib as a TF Hub encoder (do_lower_case=False), with its
outputs on padded inputs. Model Garden is not needed here.
"""

import json
import os
import shutil
import tarfile

import numpy as np
import pytest
import tensorflow as tf

from bert_keras import BertEncoder, BertPretrainer
from bert_keras import model_loading
from bert_keras.config import BertConfig
from bert_keras.convert_checkpoint import convert
from cli_harness import run_tool
from data_prep import schema, tokenizer_config
from data_prep.tokenizer_config import TokenizerConfig

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "model_garden")
ENCODER_CKPT = os.path.join(FIXTURES, "encoder_ckpt")
PRETRAINER_CKPT = os.path.join(FIXTURES, "pretrainer_ckpt")
REFERENCE = dict(np.load(os.path.join(FIXTURES, "outputs.npz")))
INPUTS = {k: REFERENCE[k] for k in ("input_word_ids", "input_mask", "input_type_ids")}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory):
    """The TF Hub export, unpacked (its saved_model.pb is 880 KB; the fixture holds it
    packed)."""
    root = tmp_path_factory.mktemp("hub")
    with tarfile.open(os.path.join(FIXTURES, "hub_encoder.tar.xz")) as tar:
        tar.extractall(root, filter="data")
    return str(root / "hub_encoder")


def assert_outputs_match(encoder, sequence="sequence_output", pooled="pooled_output"):
    out = encoder(INPUTS, training=False)
    np.testing.assert_allclose(np.asarray(out["sequence_output"]), REFERENCE[sequence],
                               atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(np.asarray(out["pooled_output"]), REFERENCE[pooled],
                               atol=TOLERANCE, rtol=0)
    return out


@pytest.mark.parametrize("path", [ENCODER_CKPT, os.path.join(ENCODER_CKPT, "bert_model.ckpt-1"),
                                  os.path.join(ENCODER_CKPT, "bert_model.ckpt-1.index")])
def test_model_garden_encoder_checkpoint_computes_model_gardens_outputs(path):
    ckpt = model_loading.load_checkpoint(path)  # found without --from: a TF2 checkpoint
    assert ckpt.form == "model_garden" and isinstance(ckpt.model, BertEncoder)
    # Model Garden's "gelu" is the tanh approximation; the exact one misses by 1.2e-3 here.
    assert ckpt.config.hidden_act == "gelu_tanh"
    assert (ckpt.config.num_attention_heads, ckpt.config.max_position_embeddings,
            ckpt.config.type_vocab_size) == (3, 29, 3)
    out = assert_outputs_match(ckpt.model)
    for ours, theirs in zip(out["encoder_outputs"], REFERENCE["encoder_outputs"]):
        np.testing.assert_allclose(np.asarray(ours), theirs, atol=TOLERANCE, rtol=0)
    assert ckpt.vocab_file is None and ckpt.saved_tokenizer is None


def test_model_garden_config_without_bert_config_json_is_read_from_the_shapes(tmp_path):
    for name in os.listdir(ENCODER_CKPT):
        if name != "bert_config.json":
            shutil.copy(os.path.join(ENCODER_CKPT, name), tmp_path)
    ckpt = model_loading.load_checkpoint(str(tmp_path), fmt="model_garden")
    with open(os.path.join(ENCODER_CKPT, "bert_config.json")) as f:
        written = json.load(f)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size"):
        assert getattr(ckpt.config, key) == written[key], key
    assert_outputs_match(ckpt.model)


def test_model_garden_pretrainer_checkpoint_keeps_its_masked_lm_head():
    ckpt = model_loading.load_checkpoint(PRETRAINER_CKPT)
    assert isinstance(ckpt.model, BertPretrainer) and not ckpt.model.next_sentence
    assert_outputs_match(ckpt.encoder)
    logits = ckpt.model(dict(INPUTS, masked_lm_positions=REFERENCE["masked_lm_positions"]),
                        training=False)["mlm_logits"]
    np.testing.assert_allclose(np.asarray(logits), REFERENCE["mlm_logits"], atol=TOLERANCE,
                               rtol=0)
    encoder = model_loading.load_checkpoint(PRETRAINER_CKPT, want="encoder").model
    assert isinstance(encoder, BertEncoder)


def test_tf_hub_saved_model_computes_its_outputs_with_its_vocabulary_and_casing(hub_dir):
    ckpt = model_loading.load_checkpoint(hub_dir)
    assert ckpt.form == "tf_hub" and isinstance(ckpt.model, BertEncoder)
    assert_outputs_match(ckpt.model, "hub_sequence_output", "hub_pooled_output")
    assert_outputs_match(ckpt.model)  # the Keras model it was exported from
    assert ckpt.vocab_file == os.path.join(hub_dir, "assets", "vocab.txt")
    settings, source = ckpt.tokenizer_settings()
    assert settings == TokenizerConfig(do_lower_case=False) and "do_lower_case" in source


def test_tf_hub_converts_with_its_vocabulary_and_casing(hub_dir, tmp_path):
    out = str(tmp_path / "keras")
    result = run_tool("convert_checkpoint", ["--from=tf_hub", "--to=keras",
                                             f"--input={hub_dir}", f"--output={out}"])
    assert result.code == 0, result.stderr
    saved = tokenizer_config.read_for_vocab(os.path.join(out, "vocab.txt"))
    assert saved[0] == TokenizerConfig(do_lower_case=False)
    assert schema.load_vocab(os.path.join(out, "vocab.txt")) == schema.load_vocab(
        os.path.join(hub_dir, "assets", "vocab.txt"))
    assert_outputs_match(model_loading.load_checkpoint(out).model)


def test_model_garden_checkpoint_converts_with_the_casing_flags(tmp_path):
    # As Google's releases: vocab.txt beside the checkpoint, the casing given by flag.
    ckpt_dir = tmp_path / "mg"
    shutil.copytree(ENCODER_CKPT, ckpt_dir)
    with tarfile.open(os.path.join(FIXTURES, "hub_encoder.tar.xz")) as tar:
        vocab = tar.extractfile("hub_encoder/assets/vocab.txt").read()
    (ckpt_dir / "vocab.txt").write_bytes(vocab)
    out = str(tmp_path / "hf")
    result = run_tool("convert_checkpoint", ["--from=model_garden", "--to=hf",
                                             f"--input={ckpt_dir}", f"--output={out}",
                                             "--do_lower_case=false"])
    assert result.code == 0, result.stderr
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["hidden_act"] == "gelu_new"  # transformers' tanh GELU
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        assert json.load(f)["do_lower_case"] is False
    assert_outputs_match(model_loading.load_checkpoint(out).model)


def test_to_google_says_when_the_vocabulary_beside_the_checkpoint_is_left_out(tmp_path,
                                                                               caplog):
    """--to=google writes vocab.txt beside bert_model.ckpt where the casing is known; a
    Model Garden checkpoint's vocab.txt without the casing flags is left out, and (as for
    --to=hf and --to=keras) a warning says so. Before, --to=google left it out silently."""
    ckpt_dir = tmp_path / "mg"
    shutil.copytree(ENCODER_CKPT, ckpt_dir)
    with tarfile.open(os.path.join(FIXTURES, "hub_encoder.tar.xz")) as tar:
        (ckpt_dir / "vocab.txt").write_bytes(
            tar.extractfile("hub_encoder/assets/vocab.txt").read())
    caplog.set_level("WARNING")
    convert("model_garden", "google", str(ckpt_dir), str(tmp_path / "google") + os.sep)
    assert not (tmp_path / "google" / "vocab.txt").exists()
    assert "vocab.txt is left out: a TF Model Garden checkpoint records no tokenizer casing" \
        in caplog.text, caplog.text
    caplog.clear()
    convert("model_garden", "google", str(ckpt_dir), str(tmp_path / "cased") + os.sep,
            tokenizer_overrides={"do_lower_case": False})
    assert tokenizer_config.read_for_vocab(str(tmp_path / "cased" / "vocab.txt"))[0] == \
        TokenizerConfig(do_lower_case=False)
    assert "left out" not in caplog.text


@pytest.mark.integration  # the export traces its functions: about 10 s on 2 cores
def test_our_encoder_export_reads_back_with_its_settings(tmp_path):
    from export.export_encoder import export_encoder

    config = BertConfig(vocab_size=37, hidden_size=20, num_hidden_layers=2,
                        num_attention_heads=5, intermediate_size=28,
                        max_position_embeddings=19, type_vocab_size=4)
    encoder = BertEncoder.from_bert_config(config)
    pretrainer = BertPretrainer(encoder)
    rng = np.random.default_rng(3)
    pretrainer.set_weights([rng.normal(0, 0.3, w.shape).astype(np.float32)
                            for w in pretrainer.get_weights()])
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                             + [f"w{i}" for i in range(32)]))
    korean = TokenizerConfig(do_lower_case=True, strip_accents=False)
    path = export_encoder(encoder, str(tmp_path / "models"), str(vocab), pretrainer=pretrainer,
                          warmup_seq_length=8, settings=korean)
    ckpt = model_loading.load_checkpoint(path, fmt="tf_hub")
    assert isinstance(ckpt.model, BertPretrainer) and ckpt.model.next_sentence
    assert ckpt.config == config
    assert ckpt.tokenizer_settings()[0] == korean
    inputs = dict(INPUTS, input_word_ids=INPUTS["input_word_ids"] % 37)
    for ours, theirs in zip(ckpt.model.weights, pretrainer.weights):
        assert ours.path == theirs.path
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs), err_msg=ours.path)
    np.testing.assert_array_equal(np.asarray(ckpt.encoder(inputs)["pooled_output"]),
                                  np.asarray(encoder(inputs)["pooled_output"]))


# --- Bad inputs: one line each, through the command line. ---


def model_garden_checkpoint(directory, drop=(), reshape=None):
    """A TF2 checkpoint of the fixture's variables, saved as Model Garden saves (each
    tf.Variable named as BertEncoder names it), less `drop`, with `reshape` {name: shape}:
    another network's checkpoint."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    prefix = os.path.join(ENCODER_CKPT, "bert_model.ckpt-1")
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    module = tf.Module()
    module.weights = []
    for node in graph.nodes:
        for attribute in node.attributes:
            name = attribute.full_name
            if name == "save_counter" or name in drop:
                continue
            value = reader.get_tensor(attribute.checkpoint_key)
            if reshape and name in reshape:
                value = value.reshape(reshape[name])
            module.weights.append(tf.Variable(value, name=name))
    os.makedirs(directory)
    shutil.copy(os.path.join(ENCODER_CKPT, "bert_config.json"), directory)
    return tf.train.Checkpoint(encoder=module).save(os.path.join(directory, "bert_model.ckpt"))


def convert_error(tmp_path, *args):
    result = run_tool("convert_checkpoint", [*args, f"--output={tmp_path / 'out'}"])
    assert result.code == 1 and not os.path.exists(tmp_path / "out"), result.stderr
    (line,) = result.error_lines
    assert "Traceback" not in result.stderr
    return line


def test_a_checkpoint_missing_a_layer_lists_every_missing_tensor(tmp_path):
    layer_1 = [n for n in _fixture_names() if n.startswith("transformer/layer_1/")]
    assert len(layer_1) == 16
    model_garden_checkpoint(str(tmp_path / "ckpt"), drop=layer_1)
    line = convert_error(tmp_path, "--from=model_garden", "--to=keras",
                         f"--input={tmp_path / 'ckpt'}")
    assert "missing 16:" in line and all(n in line for n in layer_1), line
    assert "2-layer" in line


def test_an_unsplit_attention_kernel_is_named_with_both_shapes(tmp_path):
    name = "transformer/layer_0/self_attention/key/kernel"
    model_garden_checkpoint(str(tmp_path / "ckpt"), reshape={name: (24, 24)})
    line = convert_error(tmp_path, "--from=model_garden", "--to=keras",
                         f"--input={tmp_path / 'ckpt'}")
    assert f"{name}: model (24, 3, 8), file (24, 24)" in line, line


def test_a_saved_model_that_is_not_a_bert_encoder_is_refused(tmp_path):
    module = tf.Module()
    module.kernel = tf.Variable(np.ones((5, 6), np.float32), name="dense/kernel")
    module.call = tf.function(lambda x: tf.matmul(x, module.kernel),
                              input_signature=[tf.TensorSpec([None, 5], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    line = convert_error(tmp_path, "--from=tf_hub", "--to=keras", f"--input={tmp_path / 'sm'}")
    assert "not a BERT encoder" in line and "dense/kernel" in line, line


def test_the_wrong_format_and_existing_output_are_refused(tmp_path, hub_dir):
    line = convert_error(tmp_path, "--from=google", "--to=keras", f"--input={ENCODER_CKPT}")
    assert "--from=model_garden" in line, line
    line = convert_error(tmp_path, "--from=tf_hub", "--to=keras", f"--input={ENCODER_CKPT}")
    assert "tf_hub format" in line, line
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("precious")
    result = run_tool("convert_checkpoint", ["--from=tf_hub", "--to=keras",
                                             f"--input={hub_dir}",
                                             f"--output={tmp_path / 'out'}"])
    (line,) = result.error_lines
    assert result.code == 1 and "refusing to overwrite existing output" in line, line
    assert (tmp_path / "out" / "keep").read_text() == "precious"


def test_an_incomplete_copy_of_a_saved_model_or_preset_is_named(tmp_path, hub_dir):
    """A SavedModel without variables/ and a keras-hub preset without model.weights.h5 (a
    copy cut short) are named as such, in one line, through a tool. Before, the tools said
    the directory "is not a recognised checkpoint" and listed every form."""
    shutil.copytree(hub_dir, tmp_path / "hub")
    shutil.rmtree(tmp_path / "hub" / "variables")
    (tmp_path / "preset").mkdir()
    (tmp_path / "preset" / "config.json").write_text(json.dumps(
        {"module": "keras_hub.src.models.bert.bert_backbone", "class_name": "BertBackbone",
         "config": {}, "registered_name": "keras_hub>BertBackbone"}))
    (tmp_path / "text.txt").write_text("The cat sat .\n")
    for name, expected in (("hub", "a SavedModel (saved_model.pb) without "
                                   "variables/variables.index"),
                           ("preset", "keras-hub's config.json (a BertBackbone) without "
                                      "model.weights.h5")):
        result = run_tool("extract_features", [
            f"--input_file={tmp_path / 'text.txt'}", f"--output_file={tmp_path / 'o.jsonl'}",
            f"--init_checkpoint={tmp_path / name}", "--layers=-1"])
        assert result.code == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
        (line,) = result.error_lines
        assert expected in line and "copy" in line, line
        assert not os.path.exists(tmp_path / "o.jsonl")


def _fixture_names():
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(os.path.join(ENCODER_CKPT, "bert_model.ckpt-1"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return [a.full_name for n in graph.nodes for a in n.attributes]


def test_a_remote_saved_model_is_read_from_a_copy_of_its_tree(hub_dir, tmp_path):
    """A gs:// SavedModel (probed through TensorFlow's ram://): its variables/ and assets/
    are subdirectories, which convert_checkpoint copies too."""
    remote = "ram://model_garden_bucket/hub_encoder"
    for root, _, names in os.walk(hub_dir):
        relative = os.path.relpath(root, hub_dir)
        target = remote if relative == "." else f"{remote}/{relative}"
        tf.io.gfile.makedirs(target)
        for name in names:
            tf.io.gfile.copy(os.path.join(root, name), f"{target}/{name}", overwrite=True)
    written, model = convert("tf_hub", "keras", remote, str(tmp_path / "k"))
    assert written == str(tmp_path / "k")
    assert os.path.isfile(tmp_path / "k" / "vocab.txt")
    assert_outputs_match(model, "hub_sequence_output", "hub_pooled_output")
