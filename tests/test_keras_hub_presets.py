"""The keras_hub format: keras-hub's own BERT (from_preset / save_to_preset) is the reference.

Every model is built once per module at sizes that all differ (vocabulary 53, hidden 24, 3
heads, 2 layers, intermediate 40, 33 positions, 3 segments, 4 classes); inputs have padding.
"""

import json
import os
import shutil

import keras
import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

from bert_keras import BertEncoder, BertPretrainer, model_loading  # noqa: E402
from bert_keras.checkpoints import WeightLoadError  # noqa: E402
from bert_keras.config import BertConfig  # noqa: E402
from bert_keras.convert_checkpoint import convert  # noqa: E402
from bert_keras.tasks import BertClassifier, BertTagger  # noqa: E402
from cli_harness import run_tool  # noqa: E402
from conftest import assert_models_equal  # noqa: E402
from data_prep import tokenization  # noqa: E402
from data_prep.tokenizer_config import TokenizerConfig  # noqa: E402

SIZES = dict(vocabulary_size=53, num_layers=2, num_heads=3, hidden_dim=24, intermediate_dim=40,
             max_sequence_length=33, num_segments=3, dropout=0.15)
CONFIG = BertConfig(vocab_size=53, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                    intermediate_size=40, max_position_embeddings=33, type_vocab_size=3,
                    hidden_act="gelu_tanh")
CLASSES = 4


def _randomize(weights, seed):
    """Every weight random (LayerNorm gammas and biases too), so that a weight copied to
    the wrong place or transposed shows."""
    rng = np.random.default_rng(seed)
    for w in weights:
        w.assign(rng.normal(0, 0.3, tuple(w.shape)).astype("float32"))


def _inputs(seed=5):
    """(keras-hub's inputs, ours, mask positions): batch 3, sequence 7, rows 1 and 2 padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 53, (3, 7)).astype("int32")
    mask = np.ones((3, 7), "int32")
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    segments = rng.integers(0, 3, (3, 7)).astype("int32") * mask
    positions = np.array([[1, 4], [2, 3], [0, 2]], "int32")
    theirs = {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}
    ours = {"input_word_ids": ids, "input_mask": mask, "input_type_ids": segments}
    return theirs, ours, positions


def _close(a, b, what):
    """Within 1e-5; the largest difference is printed (`pytest -s`: BUILD_NOTES section 6)."""
    a, b = np.asarray(a), np.asarray(b)
    print(f"{what}: max |diff| {np.max(np.abs(a - b)):.1e}")
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=what)


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    """keras-hub presets of a random BertBackbone, BertMaskedLM and BertTextClassifier (one
    backbone each), with the models that wrote them."""
    root = tmp_path_factory.mktemp("keras_hub")
    made = {}
    backbone = keras_hub.models.BertBackbone(**SIZES)
    _randomize(backbone.weights, 1)
    backbone.save_to_preset(str(root / "backbone"))
    made["backbone"] = backbone
    masked_lm = keras_hub.models.BertMaskedLM(keras_hub.models.BertBackbone(**SIZES))
    theirs, _, positions = _inputs()
    masked_lm(dict(theirs, mask_positions=positions))  # builds the head
    _randomize(masked_lm.weights, 2)
    masked_lm.save_to_preset(str(root / "masked_lm"))
    made["masked_lm"] = masked_lm
    classifier = keras_hub.models.BertTextClassifier(
        keras_hub.models.BertBackbone(**SIZES), CLASSES, preprocessor=None, dropout=0.2)
    _randomize(classifier.weights, 3)
    classifier.save_to_preset(str(root / "classifier"))
    made["classifier"] = classifier
    return root, made


def test_backbone_to_ours_gives_keras_hubs_outputs(presets):
    root, made = presets
    ckpt = model_loading.load_checkpoint(str(root / "backbone"))  # found without fmt=
    assert ckpt.form == "keras_hub" and isinstance(ckpt.model, BertEncoder)
    config = ckpt.config
    assert (config.vocab_size, config.hidden_size, config.num_attention_heads,
            config.intermediate_size, config.max_position_embeddings, config.type_vocab_size,
            config.hidden_act, config.hidden_dropout_prob) == (
        53, 24, 3, 40, 33, 3, "gelu_tanh", 0.15)
    theirs, ours, _ = _inputs()
    expected, got = made["backbone"](theirs), ckpt.model(ours)
    for name in ("sequence_output", "pooled_output"):
        _close(got[name], expected[name], name)


def test_masked_lm_and_classifier_to_ours_give_keras_hubs_logits(presets):
    root, made = presets
    theirs, ours, positions = _inputs()
    pretrainer = model_loading.load_checkpoint(str(root / "masked_lm"), fmt="keras_hub").model
    assert isinstance(pretrainer, BertPretrainer) and not pretrainer.next_sentence
    _close(pretrainer(dict(ours, masked_lm_positions=positions))["mlm_logits"],
           made["masked_lm"](dict(theirs, mask_positions=positions)), "mlm_logits")
    ckpt = model_loading.load_checkpoint(str(root / "classifier"), fmt="keras_hub")
    assert isinstance(ckpt.model, BertClassifier) and ckpt.model.num_classes == CLASSES
    assert ckpt.model.dropout == 0.2 and ckpt.labels is None
    _close(ckpt.model(ours)["logits"], made["classifier"](theirs), "classifier logits")
    encoder = model_loading.load_checkpoint(str(root / "classifier"), want="encoder").model
    _close(encoder(ours)["pooled_output"], made["classifier"].backbone(theirs)["pooled_output"],
           "the classifier's backbone alone")


def _random(model, seed):
    _randomize(model.weights, seed)
    return model


def test_ours_to_keras_hub_and_back(tmp_path):
    """Ours -> preset -> keras-hub's from_preset computes what ours does; back is exact."""
    theirs, ours, positions = _inputs()
    encoder = _random(BertEncoder.from_bert_config(CONFIG), 11)
    pretrainer = _random(BertPretrainer(BertEncoder.from_bert_config(CONFIG), next_sentence=False,
                                        masked_lm_activation="gelu",
                                        masked_lm_layer_norm_epsilon=1e-5), 12)
    classifier = _random(BertClassifier(BertEncoder.from_bert_config(CONFIG), CLASSES,
                                        dropout=0.3), 13)
    for name, model, load, output in (
            ("encoder", encoder, keras_hub.models.BertBackbone, None),
            ("pretrainer", pretrainer, keras_hub.models.BertMaskedLM, "mlm_logits"),
            ("classifier", classifier, keras_hub.models.BertTextClassifier, "logits")):
        source = str(tmp_path / f"{name}.keras")
        model.save(source)
        convert("keras", "keras_hub", source, str(tmp_path / name))
        loaded = load.from_preset(str(tmp_path / name), **({} if output is None
                                                           else {"preprocessor": None}))
        if output is None:
            expected, got = model(ours), loaded(theirs)
            for key in ("sequence_output", "pooled_output"):
                _close(got[key], expected[key], f"{name} {key}")
        elif name == "pretrainer":
            _close(loaded(dict(theirs, mask_positions=positions)),
                   model(dict(ours, masked_lm_positions=positions))[output], name)
        else:
            assert loaded.num_classes == CLASSES and loaded.dropout == 0.3
            _close(loaded(theirs), model(ours)[output], name)
        assert_models_equal(model, model_loading.load_checkpoint(str(tmp_path / name)).model)


def test_pretrainer_with_nsp_and_exact_gelu_warn_what_keras_hub_computes(tmp_path, caplog):
    encoder = BertEncoder.from_bert_config(BertConfig(**{**CONFIG.to_dict(), "hidden_act": "gelu"}))
    model = _random(BertPretrainer(encoder), 21)
    model.save(str(tmp_path / "p.keras"))
    with caplog.at_level("WARNING"):
        convert("keras", "keras_hub", str(tmp_path / "p.keras"), str(tmp_path / "out"))
    said = caplog.text
    assert "next-sentence head (nsp_dense) is left out" in said
    assert "tanh approximation" in said and "exact GELU and LayerNorm epsilon 1e-05" in said
    back = model_loading.load_checkpoint(str(tmp_path / "out")).model
    assert not back.next_sentence
    for variable in back.weights:  # everything but the NSP head, exactly
        original = next(v for v in model.weights if v.path == variable.path)
        np.testing.assert_array_equal(np.asarray(variable), np.asarray(original), variable.path)


# Texts: accents, Hangul, CJK ideographs, punctuation, an unknown word.
TEXTS = ["Héllo, Wörld! naïve café.", "한국어 문장이다", "中文字符 日本語", "(don't) stop--here?",
         "ÉCOLE qwzx"]
_COMMON = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "!", ".", "(", ")", "'", "-",
           "?", "中", "文", "字", "符", "日", "本", "語", "한국어", "문장", "##이다", "ᄒ", "##ᅡ",
           "##ᆫ", "don", "t", "stop", "here", "na", "##ive", "##ïve", "caf", "##e", "##é"]
VOCABS = {
    "cased": _COMMON + ["Héllo", "Hello", "Wörld", "World", "ÉCOLE", "ECOLE", "café"],
    "uncased": _COMMON + ["hello", "world", "ecole", "cafe", "école", "hel", "##lo", "lo",
                          "ｈｅｌｌｏ"],
}


# (vocabulary, settings, texts): Google's uncased settings strip accents, and keras-hub's
# tokenizer then recomposes Hangul that BERT's leaves in jamo (see the test below).
CASES = {
    "cased": ("cased", TokenizerConfig(do_lower_case=False), TEXTS),
    "uncased": ("uncased", TokenizerConfig(), [t for t in TEXTS if "한" not in t]),
    "korean": ("uncased", TokenizerConfig(strip_accents=False), TEXTS),
}


def _tokenizers(tmp_path, vocab_name, settings):
    """(keras-hub's BertTokenizer of a converted preset, ours, the Checkpoint read back)."""
    tokens = VOCABS[vocab_name]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
    config = BertConfig(**{**CONFIG.to_dict(), "vocab_size": len(tokens)})
    model_loading.save_encoder_dir(BertEncoder.from_bert_config(config), str(tmp_path / "enc"),
                                   str(vocab), settings)
    convert("keras", "keras_hub", str(tmp_path / "enc"), str(tmp_path / "preset"))
    theirs = keras_hub.models.BertTokenizer.from_preset(str(tmp_path / "preset"))
    return (theirs, tokenization.load_tokenizer(str(vocab), settings),
            model_loading.load_checkpoint(str(tmp_path / "preset")))


def _ids(tokenizer, texts):
    got = tokenizer(np.array(texts)) if isinstance(tokenizer, tokenization.BertTokenizer) \
        else tokenizer(texts)  # eager keras-hub: lists of ids
    return [list(map(int, row)) for row in (got.to_list() if hasattr(got, "to_list") else got)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_tokenizer_gives_our_ids(tmp_path, case):
    vocab_name, settings, texts = CASES[case]
    theirs, ours, back = _tokenizers(tmp_path, vocab_name, settings)
    expected = _ids(ours, texts)
    assert _ids(theirs, texts) == expected
    assert sum(row.count(1) for row in expected) < sum(map(len, expected)) // 3  # few [UNK]
    assert back.saved_tokenizer[0].effective() == settings.effective()
    assert back.vocabulary() and open(back.vocab_file, encoding="utf-8").read().split("\n")[
        :len(VOCABS[vocab_name])] == VOCABS[vocab_name]


@pytest.mark.parametrize("lower,strip", [(True, None), (True, False), (False, True),
                                         (False, False)])
def test_where_keras_hubs_tokenizer_is_not_berts(tmp_path, caplog, lower, strip):
    """keras-hub lowercases by NFKC case folding after stripping accents, where BERT
    lowercases with str.lower() first: compatibility characters are folded (full-width
    letters) and, with accents stripped, Hangul is recomposed (BERT leaves it in jamo); and
    it splits at a zero-width space, which BERT deletes, whatever the settings. The
    conversion's warning names exactly the differences of its settings (docs/checkpoints.md)."""
    settings = TokenizerConfig(do_lower_case=lower, strip_accents=strip)
    with caplog.at_level("WARNING"):
        theirs, ours, _ = _tokenizers(tmp_path, "uncased", settings)
    differs = {text: _ids(theirs, [text]) != _ids(ours, [text])
               for text in ("\ud55c\uad6d\uc5b4", "\uff28\uff25\uff2c\uff2c\uff2f", "hel\u200blo")}
    assert differs == {"\ud55c\uad6d\uc5b4": lower and settings.effective_strip_accents,
                       "\uff28\uff25\uff2c\uff2c\uff2f": lower, "hel\u200blo": True}
    assert ("NFKC case folding" in caplog.text) == lower
    assert ("recomposes Hangul" in caplog.text) == (lower and settings.effective_strip_accents)
    assert "zero-width space" in caplog.text


def _cli(*args):
    result = run_tool("convert_checkpoint", list(args))
    assert result.code != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), result.stderr[-3000:]
    return last


def test_bad_presets_are_one_line_errors(presets, tmp_path):
    root, _ = presets
    gpt2 = keras_hub.models.GPT2Backbone(vocabulary_size=29, num_layers=1, num_heads=2,
                                         hidden_dim=8, intermediate_dim=12, max_sequence_length=9)
    gpt2.save_to_preset(str(tmp_path / "gpt2"))
    edited = {}
    for name, key, value in (("heads", "num_heads", "three"), ("relu", "activation", "relu")):
        edited[name] = tmp_path / name  # a hand-edited config.json
        shutil.copytree(root / "backbone", edited[name])
        config = json.loads((edited[name] / "config.json").read_text())
        config["config"][key] = value
        (edited[name] / "config.json").write_text(json.dumps(config))
    truncated = tmp_path / "truncated"
    shutil.copytree(root / "backbone", truncated)
    weights = (truncated / "model.weights.h5").read_bytes()
    (truncated / "model.weights.h5").write_bytes(weights[:len(weights) // 2])
    no_weights = tmp_path / "no_weights"
    shutil.copytree(root / "backbone", no_weights)
    (no_weights / "model.weights.h5").unlink()
    no_head = tmp_path / "no_head"
    shutil.copytree(root / "masked_lm", no_head)
    (no_head / "task.weights.h5").unlink()
    out = str(tmp_path / "out")
    for preset, message in (
            (tmp_path / "gpt2", "a GPT2Backbone preset; the keras_hub format reads BertBackbone"),
            (edited["heads"], "config.json: num_heads is 'three'; expected a positive integer"),
            (edited["relu"], "config.json: unknown BertBackbone setting(s) activation"),
            (truncated, "keras-hub cannot load its BertBackbone"),
            (no_weights, "no model.weights.h5; a keras-hub preset holds"),
            (no_head, "no task.weights.h5 (its head's weights)"),
            (tmp_path / "nothing", "does not exist in the keras_hub format"),
            # keras-hub's own handle: refused with every other path flag's hub handle
            # (`files.unserved_scheme`), before the loader's own check for a remote preset.
            ("kaggle://keras/bert/keras/bert_tiny_en_uncased",
             "kaggle:// is not a file system TensorFlow reads")):
        last = _cli("--from=keras_hub", "--to=keras", f"--input={preset}", f"--output={out}")
        assert message in last, last
        assert not os.path.exists(out)
    # A head our layouts cannot hold is refused, never dropped or changed.
    last = _cli("--from=keras_hub", "--to=keras", f"--input={root / 'masked_lm'}",
                f"--output={out}")
    assert "give a .keras file, which keeps them" in last, last
    last = _cli("--from=keras_hub", "--to=hf", f"--input={root / 'masked_lm'}", f"--output={out}")
    assert "the hf format's head takes the encoder's" in last, last
    last = _cli("--from=keras_hub", "--to=keras", f"--input={root / 'classifier'}",
                f"--output={out}")
    assert "no label names" in last and "a keras-hub preset records none" in last, last
    assert not os.path.exists(out)
    # An existing output, before anything is loaded.
    last = _cli("--from=keras_hub", "--to=keras_hub", f"--input={root / 'backbone'}",
                f"--output={root / 'masked_lm'}")
    assert "refusing to overwrite existing output" in last, last


def test_what_keras_hub_cannot_compute_is_refused(presets, tmp_path):
    relu = BertEncoder.from_bert_config(BertConfig(**{**CONFIG.to_dict(), "hidden_act": "relu"}))
    eps = BertEncoder.from_bert_config(BertConfig(**{**CONFIG.to_dict(), "layer_norm_eps": 1e-6}))
    tagger = BertTagger(BertEncoder.from_bert_config(CONFIG), 5)
    for name, model, message in (("relu", relu, "hidden_act 'relu'"),
                                 ("eps", eps, "layer_norm_eps 1e-06"),
                                 ("tagger", tagger, "a BertTagger has no keras-hub BERT task")):
        model.save(str(tmp_path / f"{name}.keras"))
        last = _cli("--from=keras", "--to=keras_hub", f"--input={tmp_path / name}.keras",
                    f"--output={tmp_path / 'out'}")
        assert message in last, last
        assert not os.path.exists(tmp_path / "out")
    with pytest.raises(WeightLoadError, match="holds a BertTextClassifier, not a BertMaskedLM"):
        model_loading.load_checkpoint(str(presets[0] / "classifier"), want="pretrainer")


def test_run_pretraining_says_when_it_changes_keras_hubs_head(presets, caplog):
    """A run builds its head from the encoder's settings: keras-hub's (exact GELU, epsilon
    1e-5) takes the copied weights with a warning, never without a word."""
    from bert_keras.run_pretraining import apply_initial_weights

    root, _ = presets
    initial = model_loading.load_checkpoint(str(root / "masked_lm"), want="pretrainer")
    run = BertPretrainer.from_bert_config(initial.config, next_sentence=False)
    with caplog.at_level("WARNING"):
        apply_initial_weights(initial, run, str(root / "masked_lm"))
    assert "its masked-LM head computes with 'gelu' and LayerNorm epsilon 1e-05" in caplog.text
    np.testing.assert_array_equal(np.asarray(run.masked_lm.output_bias),
                                  np.asarray(initial.model.masked_lm.output_bias))


def test_run_pretraining_names_the_classifier_head_it_leaves_out(presets, caplog):
    """A keras-hub BertTextClassifier as run_pretraining's --init_checkpoint: its encoder is
    used and the warning names the classifier whose head is left out. Before, it said the
    checkpoint "holds the encoder only"."""
    from bert_keras.run_pretraining import apply_initial_weights

    root, _ = presets
    initial = model_loading.load_checkpoint(str(root / "classifier"))
    run = BertPretrainer.from_bert_config(initial.config)
    with caplog.at_level("WARNING"):
        apply_initial_weights(initial, run, str(root / "classifier"))
    assert "holds a BertClassifier: its encoder is used (its task head is left out)" \
        in caplog.text, caplog.text
    assert "encoder only" not in caplog.text
    assert_models_equal(run.encoder, initial.encoder)


def test_export_encoder_mlm_refuses_keras_hubs_head(presets, tmp_path):
    """export_encoder --mlm of a keras-hub BertMaskedLM: the export's assets/bert_config.json
    records the encoder alone, so the export read back (--init_checkpoint, convert_checkpoint)
    built a head computing with the encoder's tanh GELU and epsilon 1e-12, not keras-hub's
    exact GELU and 1e-5, without a word. Refused in one line before anything is written, as
    convert_checkpoint's directory layout refuses it; without --mlm the encoder exports."""
    root, _ = presets
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{t}\n" for t in VOCABS["cased"] + [
        f"w{i}" for i in range(53 - len(VOCABS["cased"]))]), encoding="utf-8")
    result = run_tool("export_encoder", [f"--init_checkpoint={root / 'masked_lm'}",
                                         f"--vocab_file={vocab}", "--mlm", "--seq_length=8",
                                         f"--export_dir={tmp_path / 'models'}"])
    assert result.code == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    (line,) = result.error_lines
    assert "the masked-LM head computes with 'gelu' and LayerNorm epsilon 1e-05" in line, line
    assert "without --mlm" in line, line
    assert not os.path.exists(tmp_path / "models")


def test_a_task_preset_takes_raw_text_as_keras_hubs_do(tmp_path):
    """A classifier or masked LM with a vocabulary gets keras-hub's preprocessor (its
    tokenizer, packing to the position table), so from_preset(dir) takes raw text; the
    classifier's logits on text are ours on the ids our tokenizer gives."""
    tokens = VOCABS["cased"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
    settings = TokenizerConfig(do_lower_case=False)
    config = BertConfig(**{**CONFIG.to_dict(), "vocab_size": len(tokens)})
    model = _random(BertClassifier(BertEncoder.from_bert_config(config), CLASSES), 31)
    from bert_keras.checkpoints import save_model

    save_model(model, "keras_hub", str(tmp_path / "clf"), vocab_file=str(vocab),
               settings=settings, labels=["w", "x", "y", "z"])
    theirs = keras_hub.models.BertTextClassifier.from_preset(str(tmp_path / "clf"))
    assert theirs.preprocessor.sequence_length == 33
    texts = TEXTS[:3]
    ids = _ids(tokenization.load_tokenizer(str(vocab), settings), texts)
    length = max(map(len, ids)) + 2
    word_ids = np.zeros((len(texts), length), "int32")
    for row, pieces in enumerate(ids):  # [CLS] pieces [SEP], then padding
        word_ids[row, :len(pieces) + 2] = [tokens.index("[CLS]"), *pieces, tokens.index("[SEP]")]
    mask = (word_ids > 0).astype("int32")
    expected = model({"input_word_ids": word_ids, "input_mask": mask,
                      "input_type_ids": np.zeros_like(word_ids)})["logits"]
    _close(theirs.predict(texts, verbose=0), expected, "classifier on raw text")
    save_model(_random(BertPretrainer(BertEncoder.from_bert_config(config), next_sentence=False),
                       32), "keras_hub", str(tmp_path / "mlm"), vocab_file=str(vocab),
               settings=settings)
    masked_lm = keras_hub.models.BertMaskedLM.from_preset(str(tmp_path / "mlm"))
    assert type(masked_lm.preprocessor).__name__ == "BertMaskedLMPreprocessor"


@pytest.mark.integration  # ~16 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_converted_backbone_fine_tunes_in_keras_hub(tmp_path, caplog):
    """An encoder converted to keras-hub gets keras-hub's BertTextClassifierPreprocessor
    (preprocessor.json) packing to its position table, so keras-hub's own fine-tuning,
    `BertTextClassifier.from_preset(dir, num_classes=...)` then `fit` on raw text, runs.
    Before, only the tokenizer was saved and keras-hub packed to its default 512 tokens:
    the fit of a model of 33 positions failed inside the position embedding's gradient
    ("Paddings must be non-negative"). BertMaskedLM, whose preprocessor keras-hub then
    still makes at 512, is named in a warning with the way to pass it."""
    tokens = VOCABS["cased"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
    config = BertConfig(**{**CONFIG.to_dict(), "vocab_size": len(tokens)})
    model_loading.save_encoder_dir(_random(BertEncoder.from_bert_config(config), 41),
                                   str(tmp_path / "enc"), str(vocab),
                                   TokenizerConfig(do_lower_case=False))
    with caplog.at_level("WARNING"):
        convert("keras", "keras_hub", str(tmp_path / "enc"), str(tmp_path / "preset"))
    assert "BertMaskedLMPreprocessor.from_preset(" in caplog.text and \
        "sequence_length=33" in caplog.text, caplog.text
    classifier = keras_hub.models.BertTextClassifier.from_preset(str(tmp_path / "preset"),
                                                                 num_classes=3)
    assert classifier.preprocessor.sequence_length == 33
    assert classifier.preprocessor.tokenizer.lowercase is False
    classifier.compile(optimizer="adam",
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = classifier.fit(x=TEXTS[:4] * 2, y=np.arange(8) % 3, batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    # The preset still reads back as the encoder, with its tokenizer.
    back = model_loading.load_checkpoint(str(tmp_path / "preset"))
    assert isinstance(back.model, BertEncoder)
    assert back.saved_tokenizer[0].effective() == TokenizerConfig(do_lower_case=False).effective()


def test_the_name_table_lists_every_missing_and_mis_shaped_weight(presets):
    """All or nothing: a model of another depth or width is refused with every weight
    named, and nothing is assigned."""
    from bert_keras import keras_hub_presets

    _, made = presets
    theirs = list(made["backbone"].weights)
    deeper = BertEncoder.from_bert_config(BertConfig(**{**CONFIG.to_dict(),
                                                        "num_hidden_layers": 3}))
    before = [np.asarray(v).copy() for v in deeper.weights]
    with pytest.raises(WeightLoadError, match=r"missing 16: transformer_layer_2/self_attention_"
                                              r"layer/query/kernel, .*feedforward_layer_norm/beta"):
        keras_hub_presets._copy(deeper, theirs, 3, to_ours=True, source="preset")
    for variable, value in zip(deeper.weights, before):
        np.testing.assert_array_equal(np.asarray(variable), value)
    wider = BertEncoder.from_bert_config(BertConfig(**{**CONFIG.to_dict(),
                                                       "intermediate_size": 41}))
    with pytest.raises(WeightLoadError) as error:
        keras_hub_presets._copy(wider, theirs, 3, to_ours=True, source="preset")
    message = str(error.value)
    assert "6 weight(s) have the wrong shape" in message  # 3 a layer
    assert ("transformer_layer_1/feedforward_intermediate_dense/kernel: keras-hub (24, 40), "
            "ours (24, 41)") in message


def test_a_classifier_preset_converts_with_the_labels_given(presets, tmp_path):
    """A BertTextClassifier preset records no label names: convert_checkpoint takes them
    as run_classifier does (--label_list, --task_name). --to=hf writes them as id2label and
    transformers' AutoModelForSequenceClassification computes keras-hub's logits; --to=keras
    (a preset with its tokenizer) writes labels.txt; another number of labels is refused."""
    transformers = pytest.importorskip("transformers")
    import torch

    root, made = presets
    names = ["w", "x", "y", "z"]
    hf = str(tmp_path / "hf")
    result = run_tool("convert_checkpoint", ["--from=keras_hub", "--to=hf",
                                             f"--input={root / 'classifier'}", f"--output={hf}",
                                             f"--label_list={','.join(names)}"])
    assert result.code == 0, result.stderr[-3000:]
    clf = transformers.AutoModelForSequenceClassification.from_pretrained(hf).eval()
    assert clf.config.id2label == dict(enumerate(names))
    theirs, ours, _ = _inputs()
    with torch.no_grad():
        logits = clf(input_ids=torch.tensor(ours["input_word_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(ours["input_mask"], dtype=torch.long),
                     token_type_ids=torch.tensor(ours["input_type_ids"], dtype=torch.long)).logits
    _close(logits.numpy(), made["classifier"](theirs), "transformers' logits")

    out = str(tmp_path / "refused")
    last = _cli("--from=keras_hub", "--to=hf", f"--input={root / 'classifier'}",
                f"--output={out}", "--task_name=mnli")
    assert "--task_name=mnli: 3 labels" in last and "4 classes" in last, last
    assert not os.path.exists(out)

    # With keras-hub's own preprocessor (a cased vocabulary of the backbone's 53 rows): our
    # run_classifier layout, its vocabulary, settings and labels.
    tokens = VOCABS["cased"] + [f"extra{i}" for i in range(53 - len(VOCABS["cased"]))]
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=tokens, lowercase=False)
    classifier = keras_hub.models.BertTextClassifier(
        made["classifier"].backbone, CLASSES, dropout=0.2,
        preprocessor=keras_hub.models.BertTextClassifierPreprocessor(tokenizer,
                                                                     sequence_length=33))
    classifier.get_layer("logits").set_weights(
        made["classifier"].get_layer("logits").get_weights())
    classifier.save_to_preset(str(tmp_path / "with_tokenizer"))
    result = run_tool("convert_checkpoint", ["--from=keras_hub", "--to=keras",
                                             f"--input={tmp_path / 'with_tokenizer'}",
                                             f"--output={tmp_path / 'ours'}",
                                             f"--label_list={','.join(names)}"])
    assert result.code == 0, result.stderr[-3000:]
    back = model_loading.load_checkpoint(str(tmp_path / "ours"))
    assert back.labels == names and back.saved_tokenizer[0].do_lower_case is False
    assert (tmp_path / "ours" / "vocab.txt").read_text(encoding="utf-8").split() == tokens
    _close(back.model(ours)["logits"], made["classifier"](theirs), "our layout's logits")


@pytest.mark.integration  # a fine-tuning run and a text-in export: about 40 s on 2 cores
def test_a_keras_hub_classifier_preset_fine_tunes_and_serves_with_its_korean_casing(tmp_path):
    """The seam users cross: keras-hub's BertTextClassifier preset with a cased Korean
    vocabulary (build_vocab --do_lower_case=false) as run_classifier's --init_checkpoint,
    no tokenizer flag, then export_classifier. Checked: the preset's own logits (keras-hub's
    predict on raw text) are the run's before training, the run keeps the preset's casing
    (do_lower_case=false, strip_accents=false) and vocabulary, and the export serves the
    run's predictions."""
    import json

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    import tokenizer_refs as refs
    from bert_keras import run_classifier

    lines = [line for line in refs.read_lines(refs.KOREAN_FILE) if line.strip()]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocab = tmp_path / "vocab" / "vocab.txt"
    built = run_tool("build_vocab", [f"--input={corpus}", f"--output={vocab}",
                                     "--vocab_size=700", "--layout=compact",
                                     "--min_frequency=1", "--do_lower_case=false"])
    assert built.code == 0, built.stderr[-2000:]
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=str(vocab), lowercase=False,
                                               strip_accents=False)
    sizes = dict(SIZES, vocabulary_size=700, max_sequence_length=40, hidden_dim=16,
                 num_heads=2, intermediate_dim=28)
    theirs = keras_hub.models.BertTextClassifier(
        keras_hub.models.BertBackbone(**sizes), 3,
        preprocessor=keras_hub.models.BertTextClassifierPreprocessor(tokenizer,
                                                                     sequence_length=24))
    _randomize(theirs.weights, 51)
    theirs.save_to_preset(str(tmp_path / "preset"))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": "abc"[i % 3]}, ensure_ascii=False)
                            + "\n" for i, t in enumerate(lines)), encoding="utf-8")
    common = dict(init_checkpoint=str(tmp_path / "preset"), predict_file=str(data),
                  max_seq_length=24, seed=3)
    run_classifier.run(output_dir=str(tmp_path / "before"), do_predict=True,
                       label_list=["a", "b", "c"], **common)
    before = [json.loads(line) for line in open(tmp_path / "before" / "predictions.jsonl")]
    logits = np.asarray(theirs.predict(lines, verbose=0))
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    _close([[p["probabilities"][k] for k in "abc"] for p in before], expected,
           "keras-hub's predict on raw text against run_classifier's")
    out = tmp_path / "tuned"
    run_classifier.run(output_dir=str(out), train_file=str(data), do_train=True,
                       do_predict=True, train_batch_size=4, num_train_steps=2, **common)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert (saved["do_lower_case"], saved["strip_accents"]) == (False, False), saved
    assert (out / "vocab.txt").read_bytes() == vocab.read_bytes()
    exported = run_tool("export_classifier", [f"--model_dir={out}",
                                              f"--export_dir={tmp_path / 'models'}"])
    assert exported.code == 0, exported.stderr[-3000:]
    served = tf.saved_model.load(exported.stdout.strip().splitlines()[-1]).signatures[
        "serving_default"](text=tf.constant(lines))["probabilities"].numpy()
    predicted = [json.loads(line) for line in open(out / "predictions.jsonl")]
    _close(served, [[p["probabilities"][k] for k in "abc"] for p in predicted],
           "served against the run's predictions")


def test_every_keras_hub_weight_is_named_by_exactly_one_row_of_the_name_table(presets):
    """keras-hub's own models' weight lists (BertBackbone, BertMaskedLM, BertTextClassifier
    at this module's sizes) against the one name table (checkpoints.WeightName's keras_hub
    column): each weight named by exactly one row, in the shape that row expects."""
    from bert_keras import checkpoints

    _, made = presets
    rows = checkpoints.pretrainer_weight_names(SIZES["num_layers"]) + [
        row for head in (checkpoints.CLASSIFIER_WEIGHTS, checkpoints.TAGGER_WEIGHTS,
                         checkpoints.SPAN_QA_WEIGHTS) for row in head]
    ours = {"backbone": BertEncoder.from_bert_config(CONFIG)}
    ours["masked_lm"] = BertPretrainer(ours["backbone"], next_sentence=False)
    ours["classifier"] = BertClassifier(ours["backbone"], CLASSES)
    shapes = {v.path: tuple(v.shape) for model in ours.values() for v in model.weights}
    for kind, model in made.items():
        paths = [v.path for v in model.weights]
        assert len(paths) == len(set(paths)), kind
        for weight in model.weights:
            named = [row for row in rows if row.keras_hub == weight.path]
            assert len(named) == 1, (kind, weight.path, [row.ours for row in named])
            row = named[0]
            assert row.file_shape("keras_hub", shapes[row.ours], SIZES["num_heads"]) == \
                tuple(weight.shape), (kind, weight.path)
        # And our model of that kind has no variable the keras-hub model lacks (beyond
        # BertPretrainer's NSP head, which keras-hub has no place for).
        ours_rows = checkpoints.model_weight_names(ours[kind])
        assert {row.keras_hub for row in ours_rows} == set(paths), kind
