"""One resolver for --init_checkpoint: every accepted form gives the same weights."""

import dataclasses
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
    # A pretrainer's .weights.h5 (run_pretraining's pretrainer.weights.h5 and checkpoints/
    # ckpt-*): its encoder was refused as "the weights fit no model of its bert_config.json".
    (tmp / "pre").mkdir()
    pretrainer.save_weights(str(tmp / "pre" / files.PRETRAINER_WEIGHTS_FILE))
    encoder.to_bert_config().to_json_file(str(tmp / "pre" / files.BERT_CONFIG_FILE))
    paths["pretrainer_weights_file"] = str(tmp / "pre" / files.PRETRAINER_WEIGHTS_FILE)
    return encoder, paths


@pytest.mark.parametrize(
    "form", ["keras_pretrainer", "keras_encoder", "hf", "google", "weights_file", "weights_dir",
             "run_dir", "pretrainer_weights_file"]
)
def test_every_form_gives_the_same_encoder(saved, form):
    encoder, paths = saved
    loaded = model_loading.load_encoder(paths[form])
    assert isinstance(loaded, BertEncoder)
    x = make_inputs()
    np.testing.assert_array_equal(loaded(x)["pooled_output"], encoder(x)["pooled_output"])


def test_an_encoders_weights_file_loads_without_warnings_of_a_model_not_used(saved):
    """A .weights.h5 is tried as a pretrainer first; that attempt's Keras warnings ("Skipping
    nested container ... will retain their freshly-initialized weights") were shown though
    the encoder it then loaded had every weight."""
    import warnings

    _, paths = saved
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = model_loading.load_checkpoint(paths["weights_file"])
    assert isinstance(ckpt.model, BertEncoder)
    assert not [str(w.message) for w in caught if "weights" in str(w.message)]


def test_pretrainer_forms_keep_heads(saved):
    _, paths = saved
    for form in ("keras_pretrainer", "hf", "google"):
        assert isinstance(model_loading.load_checkpoint(paths[form]).model, BertPretrainer), form
    google_dir = os.path.dirname(paths["google"])
    assert checkpoints.google_checkpoint_prefix(google_dir) == paths["google"]


def test_a_bert_config_file_a_checkpoint_does_not_use_is_said_to_differ(saved, tmp_path):
    """Hugging Face and .keras checkpoints carry their config; a --bert_config_file that
    describes another model was ignored without a word (extract_features ran the 64-wide
    model while the flag said 32)."""
    from unittest import mock

    encoder, paths = saved
    config = encoder.to_bert_config()
    same, other = tmp_path / "same.json", tmp_path / "other.json"
    config.to_json_file(str(same))
    dataclasses.replace(config, hidden_size=config.hidden_size * 2,
                        intermediate_size=config.intermediate_size + 1).to_json_file(str(other))
    # Our layouts with a bert_config.json beside the weights too: the other model's file
    # was used (the weights built into other heads or failing on shapes); the saved one is.
    for form in ("hf", "keras_encoder", "weights_file", "weights_dir", "run_dir"):
        with mock.patch.object(model_loading.logging, "warning") as warning:
            model_loading.load_checkpoint(paths[form], str(same))
            assert not warning.called
            model_loading.load_checkpoint(paths[form], str(other))
        message = warning.call_args.args[0] % warning.call_args.args[1:]
        assert message == (
            f"--bert_config_file {other} is not used: {paths[form]} carries its own config, "
            f"which differs (hidden_size {config.hidden_size * 2} vs {config.hidden_size}, "
            f"intermediate_size {config.intermediate_size + 1} vs {config.intermediate_size})")
        assert model_loading.load_checkpoint(paths[form], str(other)).config.hidden_size == \
            config.hidden_size


def test_a_vocabulary_other_than_the_checkpoints_is_refused_but_unused_slots_may_be_filled(
        saved, tmp_path):
    """run_classifier --vocab_file=<another vocabulary of the same size> fine-tuned the
    embeddings on other ids without a word. Google's README adds words by replacing
    [unusedN] tokens: that stays allowed."""
    _, paths = saved
    run_vocab = os.path.join(paths["run_dir"], "encoder", files.VOCAB_FILE)
    tokens = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused1]"]
    tokens += [f"w{i}" for i in range(TINY["vocab_size"] - len(tokens))]
    with open(run_vocab, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in tokens))
    try:
        ckpt = model_loading.load_checkpoint(paths["run_dir"])
        added = tmp_path / "added.txt"
        added.write_text("".join(t + "\n" for t in ["covid" if t == "[unused1]" else t
                                                     for t in tokens]))
        assert ckpt.vocabulary(str(added)) == str(added)
        other = tmp_path / "other.txt"
        other.write_text("".join(t + "\n" for t in tokens[:9] + ["x"] + tokens[10:]))
        with pytest.raises(model_loading.VocabMismatchError, match=(
                rf"^--vocab_file {other}: not the vocabulary saved with {paths['run_dir']} "
                rf"\({run_vocab}\): line 10 is 'x' here and 'w2' there \(1 token differs\)")):
            ckpt.vocabulary(str(other))
    finally:
        os.remove(run_vocab)


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


@pytest.mark.parametrize("name", ["pytorch_model.bin", "pytorch_model.bin.index.json",
                                  "tf_model.h5"])
def test_transformers_other_weight_files_are_named_with_the_way_out(name, tmp_path):
    """A hub directory with only transformers' pickled or TensorFlow weights (older
    uploads) got "not a recognised checkpoint" and the list of every form."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / name).write_bytes(b"\x80\x02")  # never read
    for fmt in (None, "hf"):
        with pytest.raises(model_loading.CheckpointError) as e:
            model_loading.load_checkpoint(str(tmp_path), fmt=fmt)
        assert str(e.value).startswith(f"{tmp_path} holds transformers' {name}, "), e.value
        assert str(e.value).endswith("save the model as safetensors with transformers first "
                                     "(from_pretrained(path), then save_pretrained(new_path)) "
                                     "and pass that directory")
    # Beside model.safetensors they are left alone (save_pretrained of older versions wrote
    # both): the safetensors file is read.
    checkpoints.save_hf_weights(BertEncoder(**TINY), str(tmp_path / "both"))
    (tmp_path / "both" / name).write_bytes(b"\x80\x02")
    assert isinstance(model_loading.load_checkpoint(str(tmp_path / "both")).model, BertEncoder)


@pytest.mark.integration  # ~15 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_save_task_dir_leaves_out_the_optimizer_and_keeps_training(tmp_path):
    """The default save holds no optimizer state yet leaves the trained model compiled:
    training continues with the same optimizer, and the file loads with the same outputs."""
    import keras

    from conftest import h5_keys
    from bert_keras.tasks import BertTagger, compile_args
    from data_prep.tokenizer_config import TokenizerConfig

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(TINY["vocab_size"])))
    model = BertTagger(BertEncoder(**TINY), num_classes=5)
    x = make_inputs(batch=3, seq=6)
    y = {"logits": np.ones_like(x["input_mask"])}
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), **compile_args(model))
    model.train_on_batch(x, y)
    optimizer = model.optimizer
    model_loading.save_task_dir(model, str(tmp_path / "out"), ["a", "b", "c", "d", "e"],
                                str(vocab), TokenizerConfig())
    assert model.optimizer is optimizer and model.compiled
    expected = np.asarray(model(x)["logits"])
    model.train_on_batch(x, y)
    assert int(optimizer.iterations.numpy()) == 2
    import zipfile

    with zipfile.ZipFile(tmp_path / "out" / files.TASK_MODEL_FILE) as z:
        z.extract("model.weights.h5", tmp_path)
        config = z.read("config.json").decode()
    assert not any(k.startswith("optimizer") for k in h5_keys(str(tmp_path / "model.weights.h5")))
    import json

    assert not json.loads(config).get("compile_config")  # nothing to compile on load
    loaded = model_loading.load_checkpoint(str(tmp_path / "out"))
    assert getattr(loaded.model, "optimizer", None) is None and loaded.labels == list("abcde")
    np.testing.assert_allclose(np.asarray(loaded.model(x)["logits"]), expected, atol=1e-6)


def test_save_task_dir_of_an_uncompiled_model(tmp_path):
    from bert_keras.tasks import BertSpanQA
    from data_prep.tokenizer_config import TokenizerConfig

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(TINY["vocab_size"])))
    model = BertSpanQA(BertEncoder(**TINY))
    model_loading.save_task_dir(model, str(tmp_path / "out"), None, str(vocab), TokenizerConfig())
    assert not model.compiled and getattr(model, "optimizer", None) is None
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".")]  # no leftovers
    loaded = model_loading.load_checkpoint(str(tmp_path / "out")).model
    x = make_inputs(batch=2, seq=5)
    np.testing.assert_allclose(np.asarray(loaded(x)["start_logits"]),
                               np.asarray(model(x)["start_logits"]), atol=1e-6)


def test_a_task_directory_without_tokenizer_config_uses_the_recorded_settings(tmp_path):
    """A fine-tuned directory whose tokenizer_config.json was lost (copied without it) was
    read with the uncased defaults, and its export of a cased model flipped predictions;
    the fine-tuning recorded its settings in train_results.json, which is read instead."""
    import os

    from bert_keras.tasks import BertClassifier
    from data_prep.tokenizer_config import TokenizerConfig

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(TINY["vocab_size"])))
    cased = TokenizerConfig(do_lower_case=False, strip_accents=False)
    out = tmp_path / "out"
    model_loading.save_task_dir(BertClassifier(BertEncoder(**TINY), 2), str(out), ["a", "b"],
                                str(vocab), cased,
                                train_results={"tokenizer": cased.to_json_dict()})
    assert model_loading.load_checkpoint(str(out)).saved_tokenizer == (
        cased, str(out / files.TOKENIZER_CONFIG_FILE))
    os.remove(out / files.TOKENIZER_CONFIG_FILE)
    loaded = model_loading.load_checkpoint(str(out))
    assert loaded.saved_tokenizer == (cased, str(out / files.TRAIN_RESULTS_FILE))
    assert loaded.tokenizer_settings()[0] == cased
    # Without either, the defaults, as before.
    os.remove(out / files.TRAIN_RESULTS_FILE)
    assert model_loading.load_checkpoint(str(out)).saved_tokenizer is None


def test_weights_that_do_not_fit_their_config_name_the_variable_and_both_shapes(tmp_path):
    """An encoder.weights.h5 beside a bert_config.json of another width. Keras' error's
    first line ends at "Example error message for object <BertEmbeddings ...>:", which is
    all the message used to keep; the shapes are on its next lines."""
    BertEncoder(**TINY).save_weights(str(tmp_path / "encoder.weights.h5"))
    wider = BertEncoder(**dict(TINY, hidden_size=2 * TINY["hidden_size"]))
    wider.to_bert_config().to_json_file(str(tmp_path / "bert_config.json"))
    width, vocab = TINY["hidden_size"], TINY["vocab_size"]
    with pytest.raises(model_loading.CheckpointError, match=(
            rf"the weights fit no model of its bert_config.json \(BertEncoder: "
            rf"embeddings/word_embeddings is \({vocab}, {2 * width}\) in the model, "
            rf"\({vocab}, {width}\) in the file \(\d+ layers do not fit\)\)$")):
        model_loading.load_encoder(str(tmp_path))


def test_save_task_dir_refuses_a_model_of_the_users_own_naming_what_it_takes(tmp_path):
    # A user's functional model with our encoder inside: the layout (and the exports that
    # read it) holds one of our task models only. Before, an AttributeError ('Functional'
    # object has no attribute 'encoder') came from inside the function, after model.keras
    # had been written.
    import keras

    from data_prep.tokenizer_config import TokenizerConfig

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(TINY["vocab_size"])))
    encoder = BertEncoder(**TINY)
    inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in encoder.input}
    model = keras.Model(inputs, keras.layers.Dense(3)(encoder(inputs)["pooled_output"]))
    with pytest.raises(ValueError) as error:
        model_loading.save_task_dir(model, str(tmp_path / "out"), ["a", "b", "c"], str(vocab),
                                    TokenizerConfig())
    message = str(error.value)
    assert "\n" not in message and "Functional" in message and "BertClassifier" in message
    assert "model.save" in message  # the way to keep a model of one's own
    assert not (tmp_path / "out").exists()
