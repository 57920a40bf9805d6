"""bert_keras.convert_checkpoint: format conversion, round trips, and the command line."""

import json
import os
import subprocess
import shutil
import sys

import numpy as np
import pytest

from bert_keras import BertEncoder, BertPretrainer
from bert_keras.checkpoints import WeightLoadError, save_keras_model
from bert_keras import model_loading
from bert_keras.model_loading import load_checkpoint
from bert_keras.convert_checkpoint import convert
from conftest import TINY, assert_models_equal

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def random_pretrainer(seed=0):
    model = BertPretrainer(BertEncoder(**TINY))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.2, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    model = random_pretrainer()
    path = save_keras_model(model, str(tmp_path_factory.mktemp("k") / "model.keras"))
    return path, model


@pytest.mark.parametrize("via", ["google", "hf"])
def test_keras_round_trip_through_each_format_is_bit_exact(tmp_path, keras_file, via):
    path, model = keras_file
    middle = str(tmp_path / ("model.ckpt" if via == "google" else "hf"))
    convert("keras", via, path, middle)
    convert(via, "keras", middle, str(tmp_path / "back.keras"))
    assert_models_equal(model, load_checkpoint(str(tmp_path / "back.keras"), fmt="keras").model)


def test_google_to_hf_and_encoder_only(tmp_path, keras_file):
    path, model = keras_file
    convert("keras", "google", path, str(tmp_path / "g" / "model.ckpt"))
    _, hf = convert("google", "hf", str(tmp_path / "g" / "model.ckpt"), str(tmp_path / "hf"),
                    model="encoder")
    assert isinstance(hf, BertEncoder)
    assert_models_equal(model.encoder, load_checkpoint(str(tmp_path / "hf"), fmt="hf").model)
    with pytest.raises(WeightLoadError, match="no pretraining heads"):
        convert("hf", "keras", str(tmp_path / "hf"), str(tmp_path / "x.keras"), model="pretrainer")


def test_refuses_existing_output_before_loading(tmp_path, keras_file):
    path, _ = keras_file
    (tmp_path / "out.keras").write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="out.keras"):
        convert("google", "keras", str(tmp_path / "does-not-matter"), str(tmp_path / "out.keras"))
    assert (tmp_path / "out.keras").read_bytes() == b"precious"


def run_cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "bert_keras.convert_checkpoint", *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


@pytest.mark.integration  # ~14 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_cli_help_and_unknown_flag():
    result = run_cli("--help")  # absl prints the help and exits with status 1
    assert "--from=google --to=hf \\\n" in result.stdout
    for flag in ("--from: <google|hf|keras|keras_hub|model_garden|tf_hub>",
                 "--to: <google|hf|keras|keras_hub>", "--input", "--output", "--model",
                 "--bert_config_file", "--[no]do_lower_case", "--strip_accents"):
        assert flag in result.stdout
    result = run_cli("--from=hf", "--to=google", "--input=a", "--output=b", "--frobnicate=1")
    assert result.returncode != 0 and "error: --frobnicate: unknown flag" in result.stderr


@pytest.mark.integration  # The tool in fresh processes: about 14 s on 2 cores.
def test_cli_converts_and_reports_errors_without_traceback(tmp_path, keras_file):
    path, model = keras_file
    out = str(tmp_path / "model.ckpt")
    result = run_cli("--from=keras", "--to=google", f"--input={path}", f"--output={out}")
    assert result.returncode == 0, result.stderr
    assert "wrote BertPretrainer" in result.stdout
    assert_models_equal(model, load_checkpoint(out, fmt="google").model)
    # Same command again: refuses, names the file, no traceback.
    result = run_cli("--from=keras", "--to=google", f"--input={path}", f"--output={out}")
    assert result.returncode == 1
    assert "refusing to overwrite" in result.stderr and "model.ckpt.index" in result.stderr
    assert "Traceback" not in result.stderr
    # A .weights.h5 without bert_config.json beside it: the loader asks for
    # --bert_config_file, which the tool refused but for --from=google.
    weights = tmp_path / "alone" / "pretrainer.weights.h5"
    weights.parent.mkdir()
    model.save_weights(str(weights))
    args = ("--from=keras", "--to=hf", f"--input={weights}")
    result = run_cli(*args, f"--output={tmp_path / 'hf_refused'}")
    assert result.returncode == 1 and "pass --bert_config_file" in result.stderr, result.stderr
    config = tmp_path / "alone" / "config_elsewhere.json"
    model.encoder.to_bert_config().to_json_file(config)
    result = run_cli(*args, f"--output={tmp_path / 'hf'}", f"--bert_config_file={config}")
    assert result.returncode == 0, result.stderr
    assert_models_equal(model, load_checkpoint(str(tmp_path / "hf"), fmt="hf").model)
    # A Google checkpoint with its vocab.txt records no casing: the command line's casing
    # flags give it, as to Google's tools, and transformers' tokenizer_config.json says it.
    vocab = os.path.join(os.path.dirname(out), "vocab.txt")
    with open(vocab, "w") as f:
        f.write("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                        [f"Tok{i}" for i in range(5, model.encoder.vocab_size)]))
    for flags, lower in ((["--do_lower_case=false"], False),
                         (["--do_lower_case=true", "--strip_accents=false"], True)):
        hf = tmp_path / f"hf_lower_{lower}"
        result = run_cli("--from=google", "--to=hf", f"--input={out}", f"--output={hf}",
                         *flags)
        assert result.returncode == 0, result.stderr
        saved = json.loads((hf / "tokenizer_config.json").read_text())
        assert saved["do_lower_case"] is lower, saved
        assert (hf / "vocab.txt").read_text() == open(vocab).read()
        settings = load_checkpoint(str(hf), fmt="hf").saved_tokenizer[0]
        assert settings.do_lower_case is lower
        assert settings.strip_accents is (None if not lower else False)


def test_google_config_elsewhere(tmp_path, keras_file):
    path, model = keras_file
    convert("keras", "google", path, str(tmp_path / "g" / "model.ckpt"))
    os.rename(tmp_path / "g" / "bert_config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="bert_config.json beside it"):
        convert("google", "hf", str(tmp_path / "g" / "model.ckpt"), str(tmp_path / "hf"))
    convert("google", "hf", str(tmp_path / "g" / "model.ckpt"), str(tmp_path / "hf"),
            config_file=str(tmp_path / "config.json"))
    assert_models_equal(model, load_checkpoint(str(tmp_path / "hf"), fmt="hf").model)


def test_our_pretraining_output_converts_for_transformers(tmp_path):
    """A run_pretraining --output_dir (and its encoder/ directory, and a .weights.h5 file)
    is --from=keras input: before, every one of our pretraining outputs was refused there
    ("expected a .keras file or a fine-tuned model directory"). The transformers directory
    holds the vocabulary and the casing, so AutoTokenizer tokenizes as ours (a cased,
    accent-keeping vocabulary here) and BertForPreTraining gives our masked-LM logits."""
    import torch
    from transformers import AutoTokenizer, BertForPreTraining, BertModel

    from conftest import make_inputs
    from data_prep.tokenization import load_tokenizer
    from data_prep.tokenizer_config import TokenizerConfig

    pretrainer = random_pretrainer(seed=3)
    words = ["Seoul", "##은", "Café", "서울", "é", "##s", "big", "."]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    vocab += [f"w{i}" for i in range(TINY["vocab_size"] - len(vocab))]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    cased = TokenizerConfig(do_lower_case=False, strip_accents=False)
    run = tmp_path / "run"  # run_pretraining's layout: encoder/ and the heads beside it
    model_loading.save_encoder_dir(pretrainer.encoder, str(run / "encoder"),
                                   str(tmp_path / "vocab.txt"), cased)
    pretrainer.save_weights(str(run / "pretrainer.weights.h5"))
    pretrainer.encoder.to_bert_config().to_json_file(str(run / "bert_config.json"))

    _, model = convert("keras", "hf", str(run), str(tmp_path / "hf"))
    assert_models_equal(pretrainer, model)
    text = "Seoul은 big. Café"
    ours = load_tokenizer(str(run / "encoder" / "vocab.txt"))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert theirs.tokenize(text) == ours.tokenize([text])[0] == ["Seoul", "##은", "big", ".",
                                                                 "Café"]
    assert theirs.convert_tokens_to_ids(theirs.tokenize(text)) == ours.encode([text])[0]
    # transformers' tokenizer truncates to the position table (it had no limit: a long
    # text passed the model's positions).
    limit = pretrainer.encoder.max_sequence_length
    assert theirs.model_max_length == limit
    assert len(theirs("big " * (2 * limit), truncation=True)["input_ids"]) == limit
    inputs = make_inputs(batch=2, seq=9)
    positions = np.array([[1, 4], [2, 3]], np.int32)
    want = np.asarray(pretrainer(dict(inputs, masked_lm_positions=positions))["mlm_logits"])
    torch_model = BertForPreTraining.from_pretrained(str(tmp_path / "hf")).eval()
    with torch.no_grad():
        logits = torch_model(
            input_ids=torch.tensor(inputs["input_word_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["input_type_ids"], dtype=torch.long),
        ).prediction_logits.numpy()
    got = np.take_along_axis(logits, positions[..., None], axis=1)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)

    # Back to our layout, vocabulary and casing kept (before: a lone .keras file, and a
    # directory refused with Keras' own message), and on to transformers again.
    back = tmp_path / "back"
    _, again = convert("hf", "keras", str(tmp_path / "hf"), str(back))
    assert_models_equal(pretrainer, again)
    loaded = model_loading.load_checkpoint(str(back))
    assert type(loaded.model).__name__ == "BertPretrainer" and loaded.form == "run"
    assert loaded.saved_tokenizer[0] == cased
    assert load_tokenizer(loaded.vocab_file).tokenize([text]) == ours.tokenize([text])
    _, again = convert("keras", "hf", str(back), str(tmp_path / "hf_again"))
    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf_again")).tokenize(text) == \
        theirs.tokenize(text)
    with pytest.raises(ValueError, match=r"^--output .*p\.weights\.h5: --to=keras writes a "
                       r"\.keras file or a directory"):
        convert("hf", "keras", str(tmp_path / "hf"), str(tmp_path / "p.weights.h5"))
    convert("hf", "keras", str(tmp_path / "hf"), str(tmp_path / "enc"), model="encoder")
    loaded = model_loading.load_checkpoint(str(tmp_path / "enc"))
    assert loaded.form == "encoder_dir" and loaded.saved_tokenizer[0] == cased
    assert_models_equal(pretrainer.encoder, loaded.model)

    _, encoder = convert("keras", "hf", str(run / "encoder"), str(tmp_path / "hf_encoder"))
    assert_models_equal(pretrainer.encoder, encoder)
    assert isinstance(BertModel.from_pretrained(str(tmp_path / "hf_encoder")), BertModel)
    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf_encoder")).tokenize(text) == \
        theirs.tokenize(text)
    _, again = convert("keras", "keras", str(run / "pretrainer.weights.h5"),
                       str(tmp_path / "p.keras"))
    assert_models_equal(pretrainer, again)
    with pytest.raises(model_loading.CheckpointError, match="in the keras format: expected a "
                       "run_pretraining output directory"):
        convert("keras", "hf", str(tmp_path), str(tmp_path / "nothing"))


def test_a_transformers_vocabulary_without_settings_keeps_transformers_defaults(tmp_path):
    """A transformers directory with vocab.txt and no tokenizer_config.json (older saves)
    is tokenized with BertTokenizer's defaults (lowercase, accents stripped). Converted
    --to=hf, its vocabulary was left out; now it goes along with those
    defaults written down, so AutoTokenizer gives the same tokens on both sides."""
    transformers = pytest.importorskip("transformers")
    from bert_keras.checkpoints import save_model
    from data_prep import tokenizer_config

    words = ["hello", "world", "cafe", "##s", "the"]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    tokens += [f"w{i}" for i in range(TINY["vocab_size"] - len(tokens))]
    source = tmp_path / "source"
    save_model(random_pretrainer(), "hf", str(source))
    (source / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    assert not (source / "tokenizer_config.json").exists()
    text = "Hello Café worlds"
    expected = transformers.AutoTokenizer.from_pretrained(str(source)).tokenize(text)
    assert expected == ["hello", "cafe", "world", "##s"]
    convert("hf", "hf", str(source), str(tmp_path / "hf"))
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf")).tokenize(text) == \
        expected
    assert (tmp_path / "hf" / "vocab.txt").read_text(encoding="utf-8") == \
        (source / "vocab.txt").read_text(encoding="utf-8")
    assert tokenizer_config.read_for_vocab(str(tmp_path / "hf" / "vocab.txt"))[0] == \
        tokenizer_config.TokenizerConfig()


def test_a_masked_lm_without_nsp_converts_to_a_layout_that_loads(tmp_path):
    """A masked-LM-only pretrainer (transformers' BertForMaskedLM, a Google checkpoint
    without cls/seq_relationship/*) written as our directory layout: the loader rebuilt a
    pretrainer with the next-sentence head, which the weights file lacks, so the directory
    was no --init_checkpoint for any tool."""
    model = BertPretrainer(BertEncoder(**TINY), next_sentence=False)
    model.set_weights([np.random.default_rng(3).normal(0, 0.2, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    source = save_keras_model(model, str(tmp_path / "mlm.keras"))
    convert("keras", "google", source, str(tmp_path / "google" / "bert_model.ckpt"))
    convert("google", "keras", str(tmp_path / "google"), str(tmp_path / "run"))
    loaded = load_checkpoint(str(tmp_path / "run"))
    assert isinstance(loaded.model, BertPretrainer) and not loaded.model.next_sentence
    assert_models_equal(model, loaded.model)
    assert_models_equal(model.encoder, load_checkpoint(str(tmp_path / "run"),
                                                        want="encoder").model)
    _, again = convert("keras", "google", str(tmp_path / "run"), str(tmp_path / "g2" / "m.ckpt"))
    assert_models_equal(model, again)


def test_a_tokenizers_own_model_max_length_is_kept(tmp_path, keras_file):
    """A transformers directory whose tokenizer_config.json says model_max_length 32 (below
    the 40-position table) came out with 40 from every conversion, so transformers'
    tokenizer let longer texts through than the model was given. "No limit" (transformers'
    int(1e30)) and no value give the position table, as before."""
    import json

    from transformers import AutoTokenizer

    path, model = keras_file
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [f"w{i}" for i in range(TINY["vocab_size"] - len(vocab))]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    source = tmp_path / "source"
    model_loading.save_encoder_dir(model.encoder, str(source), str(tmp_path / "vocab.txt"))
    convert("keras", "hf", str(source), str(tmp_path / "hf"))
    settings = tmp_path / "hf" / "tokenizer_config.json"
    assert json.loads(settings.read_text())["model_max_length"] == TINY["max_sequence_length"]
    for limit, want in [(32, 32), (int(1e30), TINY["max_sequence_length"])]:
        settings.write_text(json.dumps({**json.loads(settings.read_text()),
                                        "model_max_length": limit}))
        out = tmp_path / f"out{want}"
        convert("hf", "hf", str(tmp_path / "hf"), str(out / "hf"))
        convert("hf", "keras", str(tmp_path / "hf"), str(out / "keras"), model="encoder")
        convert("keras", "hf", str(out / "keras"), str(out / "back"))
        for hf in (out / "hf", out / "back"):
            assert AutoTokenizer.from_pretrained(str(hf)).model_max_length == want, hf


def test_an_encoder_saved_without_a_pooler_converts_back_without_one(tmp_path):
    """transformers' BertModel(add_pooling_layer=False) saves no pooler; it loads as a zero
    pooler. Converted back (hf -> keras -> hf, hf -> google -> hf), the zeros were written
    as pooler weights, which transformers then took as trained ones (a zero pooled output,
    and a classifier fine-tuned from it started with no gradient for its layer) instead of
    initialising them as for the original file. Now the round trip gives the original's
    tensors, names and values."""
    from safetensors.numpy import load_file, save_file

    from bert_keras import checkpoints

    encoder = BertEncoder(**TINY)
    rng = np.random.default_rng(0)
    encoder.set_weights([rng.normal(0, 0.2, w.shape).astype(np.float32)
                         for w in encoder.get_weights()])
    original = tmp_path / "no_pooler"
    checkpoints.save_model(encoder, "hf", str(original))
    weights = original / "model.safetensors"
    tensors = {k: v for k, v in load_file(str(weights)).items() if not k.startswith("pooler.")}
    assert len(tensors) == len(load_file(str(weights))) - 2
    save_file(tensors, str(weights), metadata={"format": "pt"})

    convert("hf", "keras", str(original), str(tmp_path / "ours"))
    convert("keras", "hf", str(tmp_path / "ours"), str(tmp_path / "back"))
    convert("hf", "google", str(original), str(tmp_path / "google"))
    convert("google", "hf", str(tmp_path / "google"), str(tmp_path / "back_google"))
    for back in ("back", "back_google"):
        written = load_file(str(tmp_path / back / "model.safetensors"))
        assert sorted(written) == sorted(tensors), back
        for name, value in tensors.items():
            np.testing.assert_array_equal(written[name], value, err_msg=f"{back}: {name}")
    # A trained pooler is written as before (test_keras_round_trip_through_each_format_...).


def test_a_runs_checkpoint_file_converts_with_the_runs_vocabulary(tmp_path, caplog):
    """run_pretraining's checkpoints/ckpt-<step>.weights.h5 (what the tools' message for an
    unfinished run says to pass) took the run's bert_config.json but no vocabulary: --to=hf
    wrote config.json and the weights alone, without a word, and transformers' AutoTokenizer
    then made every word [UNK]; --to=keras lost the casing. The run's encoder/ vocabulary
    and settings now come with it; where there is none (a run not finished), a warning says
    the output holds no vocabulary."""
    from transformers import AutoTokenizer

    from data_prep import files
    from data_prep.tokenizer_config import TokenizerConfig

    pretrainer = random_pretrainer(seed=4)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Seoul", "##은", "big"]
    vocab += [f"w{i}" for i in range(TINY["vocab_size"] - len(vocab))]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / files.RUN_CONFIG_FILE).write_text("{}")
    pretrainer.encoder.to_bert_config().to_json_file(str(run / "bert_config.json"))
    checkpoint = str(run / "checkpoints" / "ckpt-00000020.weights.h5")
    pretrainer.save_weights(checkpoint)

    convert("keras", "hf", checkpoint, str(tmp_path / "unfinished"))
    assert "No vocab.txt found with --input" in caplog.text
    assert not (tmp_path / "unfinished" / "vocab.txt").exists()

    cased = TokenizerConfig(do_lower_case=False, strip_accents=False)
    model_loading.save_encoder_dir(pretrainer.encoder, str(run / "encoder"),
                                   str(tmp_path / "vocab.txt"), cased)
    caplog.clear()
    convert("keras", "hf", checkpoint, str(tmp_path / "hf"))
    assert "No vocab.txt" not in caplog.text
    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf")).tokenize("Seoul은 big") == \
        ["Seoul", "##은", "big"]
    convert("keras", "keras", checkpoint, str(tmp_path / "ours"))
    loaded = model_loading.load_checkpoint(str(tmp_path / "ours"))
    assert loaded.saved_tokenizer[0] == cased and loaded.vocab_file is not None


def test_to_google_writes_the_vocabulary_and_its_casing_beside_the_checkpoint(tmp_path,
                                                                              keras_file):
    """--to=google lays a model out as Google's releases do, vocab.txt beside
    bert_model.ckpt, with tokenizer_config.json: a Korean model (strip_accents=false) read
    back from the Google checkpoint alone keeps its tokenization. Before, the vocabulary
    was left out silently and the way back said "No vocab.txt found". An existing
    vocab.txt of another vocabulary is refused before anything is written."""
    from data_prep import tokenizer_config

    path, model = keras_file
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "서울", "##은"]
    vocab += [f"w{i}" for i in range(TINY["vocab_size"] - len(vocab))]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    korean = tokenizer_config.TokenizerConfig(strip_accents=False)
    source = tmp_path / "source"
    model_loading.save_encoder_dir(model.encoder, str(source), str(tmp_path / "vocab.txt"),
                                   korean)
    convert("keras", "google", str(source), str(tmp_path / "google" / "bert_model.ckpt"))
    beside = tmp_path / "google" / "vocab.txt"
    assert beside.read_text(encoding="utf-8") == (tmp_path / "vocab.txt").read_text(
        encoding="utf-8")
    assert tokenizer_config.read_for_vocab(str(beside))[0] == korean
    # Back from the Google checkpoint alone: the same vocabulary and casing.
    convert("google", "keras", str(tmp_path / "google" / "bert_model.ckpt"),
            str(tmp_path / "back"))
    loaded = load_checkpoint(str(tmp_path / "back"))
    assert loaded.vocab_file and open(loaded.vocab_file, encoding="utf-8").read() == \
        beside.read_text(encoding="utf-8")
    assert tokenizer_config.read_for_vocab(loaded.vocab_file)[0] == korean
    # Another vocabulary where the checkpoint would go: refused, nothing written.
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "vocab.txt").write_text("[PAD]\nother\n", encoding="utf-8")
    with pytest.raises(FileExistsError, match=r"taken/vocab.txt \(another vocabulary\)"):
        convert("keras", "google", str(source), str(tmp_path / "taken" / "bert_model.ckpt"))
    assert sorted(os.listdir(tmp_path / "taken")) == ["vocab.txt"]


@pytest.fixture(scope="module")
def google_classifier(tmp_path_factory):
    """A Google run_classifier checkpoint (model.ckpt-300: bert/*, output_weights [3, H],
    output_bias [3], an Adam slot, global_step) with bert_config.json and vocab.txt beside
    it; and the classifier it loads as."""
    import tensorflow as tf

    from bert_keras.checkpoints import save_google_checkpoint
    from test_checkpoints import google_config, randomize, write_tf1_checkpoint
    from test_export import write_vocab

    root = tmp_path_factory.mktemp("google_classifier")
    encoder = randomize(BertEncoder(**TINY), seed=7)
    prefix = save_google_checkpoint(encoder, str(root / "enc" / "bert_model.ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(prefix)}
    rng = np.random.default_rng(8)
    hidden = TINY["hidden_size"]
    tensors["output_weights"] = rng.normal(size=(3, hidden)).astype(np.float32)
    tensors["output_bias"] = rng.normal(size=3).astype(np.float32)
    tensors["output_weights/adam_m"] = np.ones((3, hidden), np.float32)
    tensors["global_step"] = np.int64(300)
    fine_tuned = write_tf1_checkpoint(str(root / "ft" / "model.ckpt-300"), tensors,
                                      google_config())
    write_vocab(root / "ft" / "vocab.txt")
    return fine_tuned, load_checkpoint(fine_tuned, fmt="google").model


def _convert_cli(*args):
    from cli_harness import run_tool

    return run_tool("convert_checkpoint", list(args))


def _one_line_error(result, *expected):
    assert result.code != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(result.error_lines) == 1, result.stderr[-3000:]
    for text in expected:
        assert text in result.error_lines[0], result.error_lines[0]


def test_a_google_classifier_converts_with_the_labels_given(tmp_path, google_classifier):
    """A run_classifier checkpoint records no label names: run_classifier's own flags give
    them. --to=hf writes id2label / label2id, and transformers' own
    AutoModelForSequenceClassification computes our logits; --to=keras writes labels.txt.
    The count must be the head's; an input with labels of its own takes only the same."""
    transformers = pytest.importorskip("transformers")
    import torch

    from conftest import make_inputs

    ckpt, ours = google_classifier
    names = ["neg", "neutral", "pos"]
    hf = str(tmp_path / "hf")
    result = _convert_cli("--from=google", "--to=hf", f"--input={ckpt}", f"--output={hf}",
                          f"--label_list={','.join(names)}", "--do_lower_case=true")
    assert result.code == 0, result.stderr[-3000:]
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(hf).eval()
    assert theirs.config.id2label == dict(enumerate(names))
    assert theirs.config.label2id == {name: i for i, name in enumerate(names)}
    inputs = make_inputs(batch=3, seq=7, vocab=TINY["vocab_size"], seed=4)
    with torch.no_grad():
        logits = theirs(input_ids=torch.tensor(inputs["input_word_ids"], dtype=torch.long),
                        attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
                        token_type_ids=torch.tensor(inputs["input_type_ids"],
                                                    dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(logits, np.asarray(ours(inputs)["logits"]), rtol=0, atol=1e-5)

    # --task_name: the task's labels in Google's order (MNLI's three).
    keras_dir = str(tmp_path / "keras")
    result = _convert_cli("--from=google", "--to=keras", f"--input={ckpt}",
                          f"--output={keras_dir}", "--task_name=mnli", "--do_lower_case=true")
    assert result.code == 0, result.stderr[-3000:]
    with open(os.path.join(keras_dir, "labels.txt")) as f:
        assert f.read().split("\n")[:3] == ["contradiction", "entailment", "neutral"]
    assert load_checkpoint(keras_dir).labels == ["contradiction", "entailment", "neutral"]

    # Refused before anything is written, in one line naming both numbers or both lists.
    out = str(tmp_path / "refused")
    for args, expected in (
            (["--label_list=a,b,c,d"], ["--label_list: 4 labels", "3 classes"]),
            (["--task_name=mrpc"], ["--task_name=mrpc: 2 labels", "3 classes"]),
            (["--task_name=mnli", "--label_list=a,b,c"], ["--task_name", "drop --label_list"]),
            (["--label_list=a,b,c", "--model=encoder"], ["a BertEncoder", "drop --label_list"]),
            (["--label_list=a,,c"], ["--label_list: item 2: empty label"])):
        _one_line_error(_convert_cli("--from=google", "--to=hf", f"--input={ckpt}",
                                     f"--output={out}", "--do_lower_case=true", *args),
                        *expected)
        assert not os.path.exists(out)
    _one_line_error(_convert_cli("--from=hf", "--to=keras", f"--input={hf}", f"--output={out}",
                                 "--label_list=neg,pos,neutral"),
                    "differ from the labels", "['neg', 'neutral', 'pos']")
    assert not os.path.exists(out)
    result = _convert_cli("--from=hf", "--to=keras", f"--input={hf}", f"--output={out}",
                          f"--label_list={','.join(names)}")
    assert result.code == 0, result.stderr[-3000:]
    assert load_checkpoint(out).labels == names

    # A head transformers saved without names (id2label LABEL_0 ... LABEL_2, as `num_labels=3`
    # alone writes) has none: the names given take the placeholders' place.
    unnamed = tmp_path / "hf_unnamed"
    shutil.copytree(hf, unnamed)
    with open(unnamed / "config.json") as f:
        config = json.load(f)
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(3)}
    config["label2id"] = {f"LABEL_{i}": i for i in range(3)}
    with open(unnamed / "config.json", "w") as f:
        json.dump(config, f)
    assert load_checkpoint(str(unnamed)).labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    renamed = str(tmp_path / "renamed")
    result = _convert_cli("--from=hf", "--to=keras", f"--input={unnamed}",
                          f"--output={renamed}", "--label_list=x,y,z")
    assert result.code == 0, result.stderr[-3000:]
    assert load_checkpoint(renamed).labels == ["x", "y", "z"]
