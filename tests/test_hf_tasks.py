"""transformers' fine-tuned BERT models in and out: task heads, labels, the fine-tuning layout.

The reference is transformers itself: its BertFor* classes, randomly initialised from small
configs whose sizes all differ (vocab 79, hidden 32, 4 heads, 2 layers, intermediate 37,
3 labels), every parameter moved off its initial value (nonzero biases, LayerNorm away from
1/0) so a transposed, swapped or missing tensor cannot pass, saved with save_pretrained.
Logits must agree within 1e-4 and label names be equal, both ways.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import TESTDATA, make_inputs, tf212_python

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_keras import checkpoints, model_loading  # noqa: E402
from bert_keras.checkpoints import WeightLoadError  # noqa: E402
from bert_keras.convert_checkpoint import convert  # noqa: E402
from bert_keras.encoder import BertEncoder  # noqa: E402
from bert_keras.pretrainer import BertPretrainer  # noqa: E402
from bert_keras.tasks import BertClassifier, BertRegressor, BertSpanQA, BertTagger  # noqa: E402

VOCAB = os.path.join(TESTDATA, "ft_vocab.txt")
V = 79  # lines of ft_vocab.txt
LABELS = ["negative", "neutral", "positive"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC"]  # 4 != 3 labels: a swapped count cannot pass
CONFIG = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=37, max_position_embeddings=40)
# transformers class -> (our model class, label names or None)
ARCHITECTURES = {
    "BertForSequenceClassification": (BertClassifier, LABELS),
    "BertForTokenClassification": (BertTagger, TAGS),
    "BertForQuestionAnswering": (BertSpanQA, None),
}


def hf_model(name, seed=0, labels=None, **config):
    """A transformers model with every parameter moved off its initial value."""
    kwargs = dict(CONFIG, **config)
    if labels is not None:
        kwargs["id2label"] = dict(enumerate(labels))
    torch.manual_seed(seed)
    model = getattr(transformers, name)(transformers.BertConfig(**kwargs)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def save_hf(model, directory, do_lower_case=True):
    model.save_pretrained(directory)
    tokenizer = transformers.BertTokenizer(vocab=VOCAB, do_lower_case=do_lower_case)
    assert len(tokenizer.vocab) == V  # transformers 5.x ignores `vocab_file=` silently
    tokenizer.save_pretrained(directory)
    return str(directory)


def torch_inputs(inputs):
    names = {"input_word_ids": "input_ids", "input_mask": "attention_mask",
             "input_type_ids": "token_type_ids"}
    return {names[k]: torch.tensor(v, dtype=torch.long) for k, v in inputs.items()}


def reference(model, inputs):
    """transformers' outputs in our output names."""
    with torch.no_grad():
        out = model(**torch_inputs(inputs))
    if hasattr(out, "start_logits"):
        return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}
    return {"logits": out.logits.numpy()}


def assert_close(ours, want, tol=1e-4):
    assert set(want) <= set(ours)
    for key, value in want.items():
        diff = np.abs(np.asarray(ours[key]) - value).max()
        assert diff < tol, f"{key}: max |ours - transformers| = {diff:.2e}"


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Each task architecture saved by transformers: name -> (directory, torch model)."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for i, (name, (_, labels)) in enumerate(ARCHITECTURES.items()):
        model = hf_model(name, seed=i, labels=labels)
        out[name] = (save_hf(model, root / name, do_lower_case=i != 0), model)
    return out


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_auto_loads_the_head_transformers_saved(hf_dirs, name):
    path, hf = hf_dirs[name]
    cls, labels = ARCHITECTURES[name]
    model = model_loading.load_checkpoint(path, fmt="hf").model
    assert type(model) is cls
    assert checkpoints.read_hf_labels(path) == labels
    inputs = make_inputs(batch=3, seq=13, vocab=V)
    assert_close(model(inputs, training=False), reference(hf, inputs))
    # The one loader gives the same model with its labels.
    ckpt = model_loading.load_checkpoint(path)
    assert type(ckpt.model) is cls and ckpt.labels == labels and ckpt.form == "hf"


def test_a_head_is_never_dropped_silently(hf_dirs):
    path, hf = hf_dirs["BertForSequenceClassification"]
    encoder = BertEncoder.from_bert_config(checkpoints.read_hf_config(path))
    before = encoder.get_weights()
    with pytest.raises(WeightLoadError) as e:
        checkpoints.load_hf_weights(encoder, path)
    assert "unexpected 2: classifier.bias, classifier.weight" in str(e.value)
    assert "model='encoder'" in str(e.value)
    for a, b in zip(before, encoder.get_weights()):
        np.testing.assert_array_equal(a, b)  # all or nothing
    # Asking for less is explicit: the encoder alone, equal to transformers' BertModel.
    encoder = model_loading.load_checkpoint(path, want="encoder", fmt="hf").model
    assert type(encoder) is BertEncoder
    inputs = make_inputs(batch=2, seq=9, vocab=V)
    with torch.no_grad():
        want = hf.bert(**torch_inputs(inputs))
    got = encoder(inputs, training=False)
    np.testing.assert_allclose(got["pooled_output"], want.pooler_output.numpy(), atol=1e-4)
    assert model_loading.load_checkpoint(path, want="encoder").labels is None


def test_encoder_without_pooler_and_masked_lm(tmp_path):
    # BertModel(add_pooling_layer=False): refused before ("missing 2: pooler.dense...").
    torch.manual_seed(3)
    bare = transformers.BertModel(transformers.BertConfig(**CONFIG), add_pooling_layer=False)
    path = save_hf(bare.eval(), tmp_path / "bare")
    encoder = model_loading.load_checkpoint(path, fmt="hf").model
    assert type(encoder) is BertEncoder
    inputs = make_inputs(batch=2, seq=9, vocab=V)
    with torch.no_grad():
        want = bare(**torch_inputs(inputs)).last_hidden_state.numpy()
    got = encoder(inputs, training=False)
    np.testing.assert_allclose(got["sequence_output"], want, atol=1e-4)
    np.testing.assert_array_equal(got["pooled_output"], 0.0)  # no pooler: zeros, not random

    mlm = hf_model("BertForMaskedLM", seed=4)
    path = save_hf(mlm, tmp_path / "mlm")
    model = model_loading.load_checkpoint(path, fmt="hf").model
    assert isinstance(model, BertPretrainer) and not model.next_sentence
    positions = np.array([[1, 4], [2, 8]], np.int32)
    got = model({**inputs, "masked_lm_positions": positions}, training=False)
    assert set(got) == {"mlm_logits"}
    with torch.no_grad():
        logits = mlm(**torch_inputs(inputs)).logits.numpy()
    want = np.take_along_axis(logits, positions[..., None].astype(np.int64), axis=1)
    np.testing.assert_allclose(got["mlm_logits"], want, atol=1e-4)
    # And back: transformers reads our MLM-only pretrainer as BertForMaskedLM.
    checkpoints.save_model(model, "hf", str(tmp_path / "mlm_back"))
    back = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "mlm_back")).eval()
    with torch.no_grad():
        np.testing.assert_allclose(back(**torch_inputs(inputs)).logits.numpy(), logits,
                                   atol=1e-4)


def _edit_config(path, **changes):
    config_file = os.path.join(path, "config.json")
    with open(config_file) as f:
        config = json.load(f)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    with open(config_file, "w") as f:
        json.dump(config, f)


@pytest.mark.parametrize("changes, message", [
    ({"architectures": ["BertForMultipleChoice"]}, "architectures is ['BertForMultipleChoice']"),
    ({"problem_type": "multi_label_classification"}, "problem_type is 'multi_label_classif"),
    ({"architectures": None}, "no `architectures`, and a classifier.* head fits both"),
    ({"id2label": {"0": "a", "2": "b", "3": "c"}}, "id2label keys must be class ids 0..2"),
])
def test_unknown_or_unrepresentable_heads_are_clear_errors(hf_dirs, tmp_path, changes, message):
    import shutil

    path = str(tmp_path / "copy")
    shutil.copytree(hf_dirs["BertForSequenceClassification"][0], path)
    _edit_config(path, **changes)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace("*", r"\*")):
        model_loading.load_checkpoint(path, fmt="hf").model


def test_a_head_that_cannot_be_loaded_names_how_to_take_the_encoder_alone(hf_dirs, tmp_path):
    """A regression head over 3 outputs (and an untied decoder) is refused, and the error
    gives the command that keeps the encoder; that command works."""
    import shutil

    from cli_harness import run_tool

    path = str(tmp_path / "regression")
    shutil.copytree(hf_dirs["BertForSequenceClassification"][0], path)
    _edit_config(path, problem_type="regression")
    with pytest.raises(ValueError) as refused:
        model_loading.load_checkpoint(path, fmt="hf").model
    command = str(refused.value).split("for its encoder alone: ")[1].split(", then")[0]
    args = [a.replace("=DIR", f"={path}").replace("=ENCODER_DIR", f"={tmp_path / 'enc'}")
            for a in command.split()[3:]]
    assert command.split()[:3] == ["python", "-m", "bert_keras.convert_checkpoint"], command
    result = run_tool("convert_checkpoint", args)
    assert result.code == 0, result.stderr[-2000:]
    encoder = model_loading.load_encoder(str(tmp_path / "enc"))
    want = hf_dirs["BertForSequenceClassification"][1].bert
    inputs = {"input_word_ids": np.array([[2, 7, 9, 3]]), "input_mask": np.ones((1, 4), int),
              "input_type_ids": np.zeros((1, 4), int)}
    with torch.no_grad():
        ref = want(**torch_inputs(inputs)).last_hidden_state.numpy()
    np.testing.assert_allclose(encoder(inputs)["sequence_output"], ref, atol=1e-4)


@pytest.mark.parametrize("problem_type", [None, "regression"])
def test_a_transformers_regression_model_loads_as_a_regressor_and_goes_back(tmp_path,
                                                                           problem_type):
    """BertForSequenceClassification with num_labels=1 (STS-B's head; problem_type
    "regression", or none, which transformers reads as regression) was refused. It loads
    as a BertRegressor whose score is transformers' logits[:, 0], and is written back as
    a regression model transformers loads with nothing missing."""
    hf = hf_model("BertForSequenceClassification", seed=4, num_labels=1,
                  **({"problem_type": problem_type} if problem_type else {}))
    path = save_hf(hf, tmp_path / "hf")
    ckpt = model_loading.load_checkpoint(path)
    assert type(ckpt.model) is BertRegressor and ckpt.labels is None
    assert ckpt.model.dropout == hf.config.hidden_dropout_prob
    inputs = make_inputs(batch=3, seq=13, vocab=V)
    want = reference(hf, inputs)["logits"][:, 0]
    assert_close(ckpt.model(inputs, training=False), {"score": want})
    back = str(tmp_path / "back")
    checkpoints.save_model(ckpt.model, "hf", back, vocab_file=VOCAB)
    again, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        back, output_loading_info=True)
    assert not any(info.values()), info
    assert again.config.num_labels == 1 and again.config.problem_type == "regression"
    assert_close({"logits": reference(again.eval(), inputs)["logits"][:, 0]}, {"logits": want})
    # transformers' regression loss is MSE on the squeezed logits: so is ours.
    import keras

    from bert_keras.tasks import compile_args

    targets = np.array([0.5, 3.0, 4.8], np.float32)
    with torch.no_grad():
        theirs = hf(**torch_inputs(inputs), labels=torch.tensor(targets)).loss.item()
    ours = compile_args(ckpt.model)["loss"]["score"](
        targets, ckpt.model(inputs, training=False)["score"])
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(ours)), theirs, rtol=1e-5)
    # convert_checkpoint into the fine-tuning layout (what run_regressor writes) and back.
    convert("hf", "keras", path, str(tmp_path / "ours"))
    task_dir = model_loading.load_checkpoint(str(tmp_path / "ours"))
    assert task_dir.form == "task_dir" and type(task_dir.model) is BertRegressor
    assert task_dir.labels is None and task_dir.vocab_file is not None
    assert_close(task_dir.model(inputs, training=False), {"score": want})
    # Google's checkpoints hold no regression head: refused by name, not written wrongly.
    with pytest.raises(ValueError, match="BertRegressor can be saved as hf or keras"):
        checkpoints.save_model(ckpt.model, "google", str(tmp_path / "g" / "model.ckpt"))


@pytest.mark.parametrize("cls", [BertClassifier, BertTagger, BertSpanQA])
def test_our_task_models_load_in_transformers_auto_classes(tmp_path, cls):
    """The way back: our models (not transformers-made) through AutoModelFor..."""
    import keras

    keras.utils.set_random_seed(7)
    encoder = BertEncoder(vocab_size=V, num_layers=2, hidden_size=32, num_heads=4,
                          intermediate_size=37, max_sequence_length=40)
    labels = {BertClassifier: LABELS, BertTagger: TAGS, BertSpanQA: None}[cls]
    model = cls(encoder) if labels is None else cls(encoder, len(labels))
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.05, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    out = str(tmp_path / "hf")
    checkpoints.save_model(model, "hf", out, labels=labels, vocab_file=VOCAB)
    auto = {BertClassifier: transformers.AutoModelForSequenceClassification,
            BertTagger: transformers.AutoModelForTokenClassification,
            BertSpanQA: transformers.AutoModelForQuestionAnswering}[cls]
    hf, info = auto.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    if labels is not None:
        assert [hf.config.id2label[i] for i in range(len(labels))] == labels
    inputs = make_inputs(batch=3, seq=12, vocab=V)
    assert_close(model(inputs, training=False), reference(hf.eval(), inputs))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert len(tokenizer.vocab) == V
    # And in again: the same model.
    again = model_loading.load_checkpoint(out, fmt="hf").model
    for a, b in zip(model.weights, again.weights):
        assert a.path == b.path
        if a.path.startswith("pooler_dense/") and cls is not BertClassifier:
            np.testing.assert_array_equal(b, 0.0)  # transformers' class has no pooler
        else:
            np.testing.assert_array_equal(a, b)


def test_convert_hf_classifier_to_the_fine_tuning_layout_and_back(hf_dirs, tmp_path):
    path, hf = hf_dirs["BertForSequenceClassification"]
    written, model = convert("hf", "keras", path, str(tmp_path / "keras"))
    assert sorted(os.listdir(written)) == ["bert_config.json", "labels.txt", "model.keras",
                                           "tokenizer_config.json", "vocab.txt"]
    # transformers 5.x saved tokenizer.json only: the vocabulary comes from it, in id order.
    assert "vocab.txt" not in os.listdir(path)
    with open(VOCAB) as a, open(os.path.join(written, "vocab.txt")) as b:
        assert a.read() == b.read()
    ckpt = model_loading.load_checkpoint(written)
    assert ckpt.form == "task_dir" and type(ckpt.model) is BertClassifier
    assert ckpt.labels == LABELS
    assert ckpt.saved_tokenizer[0].do_lower_case is False  # from transformers' tokenizer_config
    inputs = make_inputs(batch=3, seq=13, vocab=V)
    want = reference(hf, inputs)
    assert_close(ckpt.model(inputs, training=False), want)
    # A rerun never overwrites; a task model is no single .keras file.
    with pytest.raises(FileExistsError):
        convert("hf", "keras", path, written)
    with pytest.raises(ValueError, match="converts to a directory"):
        convert("hf", "keras", path, str(tmp_path / "x.keras"))
    # And back to transformers from the fine-tuning layout.
    back, _ = convert("keras", "hf", written, str(tmp_path / "back"))
    again = transformers.AutoModelForSequenceClassification.from_pretrained(back).eval()
    assert again.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert_close(reference(again, inputs), want)
    assert transformers.AutoTokenizer.from_pretrained(back).do_lower_case is False


def test_convert_cli_reports_errors_in_one_line(hf_dirs, tmp_path):
    import shutil

    path = str(tmp_path / "copy")
    shutil.copytree(hf_dirs["BertForTokenClassification"][0], path)
    _edit_config(path, architectures=["BertForNextSentencePrediction"])
    env = dict(os.environ, PYTHONPATH=os.path.dirname(TESTDATA) + "/.."
               + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-m", "bert_keras.convert_checkpoint", "--from=hf", "--to=keras",
         f"--input={path}", f"--output={tmp_path / 'out'}"],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1
    assert "BertForNextSentencePrediction" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "out")


# --- Serving what transformers fine-tuned: convert, export, verify, compare. ---

SEQ = 24
TEXTS = ["John Smith moved to Paris, France.", "click here for free money now!", "",
         "hello friend, the meeting is tomorrow?", "what year was the man born? 1895",
         "naïve café 東京 unwanted running " * 4]


def hf_softmax(hf, path, texts, seq_length=SEQ):
    """transformers' own pipeline: its tokenizer from the directory, its model, softmax."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=seq_length,
                        return_tensors="pt")
    with torch.no_grad():
        return torch.softmax(hf(**encoded).logits, -1).numpy(), encoded


def run_tool(*args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(TESTDATA))
               + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def served_classifier(hf_dirs, tmp_path_factory):
    """convert_checkpoint --from=hf --to=keras, then export_classifier's main path
    (load_task_dir + export_classifier), in this process."""
    from export.export_classifier import export_classifier
    from export.task_export import load_task_dir

    tmp = tmp_path_factory.mktemp("served")
    path, hf = hf_dirs["BertForSequenceClassification"]
    convert("hf", "keras", path, str(tmp / "keras"))
    model, labels, tokenizer = load_task_dir(str(tmp / "keras"), BertClassifier,
                                             "run_classifier", {})
    export = export_classifier(model, tokenizer, labels, str(tmp / "export"), SEQ)
    return path, hf, export


@pytest.mark.slow  # export + verify's fresh process: ~100 s on the 2-core box
def test_transformers_classifier_is_served_with_its_outputs(served_classifier):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    from export.verify import verify

    path, hf, export = served_classifier
    report = verify(export)
    assert report.ok, str(report)
    want, _ = hf_softmax(hf, path, TEXTS)
    out = tf.saved_model.load(export).signatures["serving_default"](text=tf.constant(TEXTS))
    diff = np.abs(out["probabilities"].numpy() - want).max()
    assert diff < 1e-4, f"max |export - transformers softmax| = {diff:.2e}"
    assert [x.decode() for x in out["label"].numpy()] == [
        hf.config.id2label[i] for i in want.argmax(-1)]


@pytest.mark.slow
def test_transformers_classifier_in_stock_servings_tf_2_12(served_classifier, tmp_path):
    """The export in a TF 2.12.1 + tensorflow-text 2.12.1 process (what stock TF Serving
    links), no project code: probabilities equal transformers' softmax."""
    python = tf212_python()
    if python is None:
        pytest.skip("no tensorflow 2.12.1 interpreter (set BERT_KERAS_TF212_PYTHON)")
    path, hf, _ = served_classifier
    # The two commands of the README, as a user runs them.
    run_tool("bert_keras.convert_checkpoint", "--from=hf", "--to=keras", f"--input={path}",
             f"--output={tmp_path / 'keras'}")
    export = run_tool("export.export_classifier", f"--model_dir={tmp_path / 'keras'}",
                      f"--export_dir={tmp_path / 'export'}", f"--max_seq_length={SEQ}")
    script = (
        "import json, sys\n"
        "import tensorflow as tf, tensorflow_text\n"
        "fn = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
        "out = fn(text=tf.constant(json.loads(sys.argv[2])))\n"
        "print(json.dumps({'versions': [tf.__version__, tensorflow_text.__version__],\n"
        "  'probabilities': out['probabilities'].numpy().tolist(),\n"
        "  'label': [x.decode() for x in out['label'].numpy()]}))\n")
    result = subprocess.run([python, "-c", script, export, json.dumps(TEXTS)],
                            capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["versions"] == ["2.12.1", "2.12.1"]
    want, _ = hf_softmax(hf, path, TEXTS)
    diff = np.abs(np.array(got["probabilities"]) - want).max()
    print(f"TF 2.12.1 export vs transformers softmax: max abs diff {diff:.2e}")
    assert diff < 1e-4
    assert got["label"] == [hf.config.id2label[i] for i in want.argmax(-1)]


def _converted(hf_dirs, name, tmp_path):
    path, hf = hf_dirs[name]
    written, _ = convert("hf", "keras", path, str(tmp_path / "keras"))
    ckpt = model_loading.load_checkpoint(written)
    from data_prep.tokenization import BertTokenizer

    tokenizer = BertTokenizer.from_config(ckpt.vocab_file, ckpt.tokenizer_settings()[0])
    return path, hf, ckpt, tokenizer


@pytest.mark.slow
def test_transformers_tagger_is_served_one_tag_per_word(hf_dirs, tmp_path):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from export.export_tagger import export_tagger
    from export.verify import verify

    path, hf, ckpt, tokenizer = _converted(hf_dirs, "BertForTokenClassification", tmp_path)
    # Truncating (--doc_stride=0), as transformers' truncation=True reads a long sentence.
    export = export_tagger(ckpt.model, tokenizer, ckpt.labels, str(tmp_path / "export"),
                           seq_length=SEQ, doc_stride=0)
    report = verify(export)
    assert report.ok, str(report)
    sentences = [t.split() for t in TEXTS]
    # transformers: words pre-split, the tag read at each word's first sub-token.
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    encoded = hf_tokenizer(sentences, is_split_into_words=True, padding="max_length",
                           truncation=True, max_length=SEQ, return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(hf(**encoded).logits, -1).numpy()
    loaded = tf.saved_model.load(export)
    out = loaded.signatures["serving_default"](text=tf.constant(TEXTS))
    width = max(map(len, sentences))
    words = np.array([s + [""] * (width - len(s)) for s in sentences], dtype=object)
    by_words = loaded.signatures["words"](words=tf.constant(words))
    for key in ("tags", "tag_ids", "probabilities"):
        np.testing.assert_array_equal(out[key].numpy(), by_words[key].numpy())
    compared = 0
    for row, sentence in enumerate(sentences):
        first = {}
        for position, word in enumerate(encoded.word_ids(row)):
            if word is not None and word not in first:
                first[word] = position
        for w, word in enumerate(sentence):
            assert out["words"].numpy()[row, w].decode() == word
            if w not in first:  # truncated away in both
                assert out["tag_ids"].numpy()[row, w] == -1
                continue
            want = probs[row, first[w]]
            np.testing.assert_allclose(out["probabilities"].numpy()[row, w], want, atol=1e-4)
            assert out["tags"].numpy()[row, w].decode() == hf.config.id2label[want.argmax()]
            compared += 1
    assert compared >= 20 and (out["tag_ids"].numpy() == -1).any()


@pytest.mark.slow
def test_transformers_span_qa_is_served_with_its_logits(hf_dirs, tmp_path):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from export.export_span_qa import export_span_qa
    from export.verify import verify

    path, hf, ckpt, tokenizer = _converted(hf_dirs, "BertForQuestionAnswering", tmp_path)
    export = export_span_qa(ckpt.model, tokenizer, str(tmp_path / "export"), seq_length=SEQ,
                            max_answer_length=4)
    report = verify(export)
    assert report.ok, str(report)
    questions = ["who moved to paris?", "what year was john born?", "", "what is free?"]
    contexts = ["john smith moved to paris, france.", "john was born in 1895 in new york city",
                "hello", TEXTS[5]]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    encoded = hf_tokenizer(questions, contexts, padding="max_length", truncation="only_second",
                           max_length=SEQ, return_tensors="pt")
    with torch.no_grad():
        want = hf(**encoded)
    loaded = tf.saved_model.load(export)
    out = loaded.signatures["serving_default"](question=tf.constant(questions),
                                                context=tf.constant(contexts))
    np.testing.assert_array_equal(out["input_word_ids"].numpy(), encoded["input_ids"].numpy())
    real = encoded["attention_mask"].numpy() == 1
    for key in ("start_logits", "end_logits"):
        # Real positions: transformers' logits; padding: -10000 (the text signature runs
        # the encoder at the batch's bucket length, export/length_buckets.py).
        np.testing.assert_allclose(out[key].numpy()[real], getattr(want, key).numpy()[real],
                                   atol=1e-4)
        assert (out[key].numpy()[~real] == -10000.0).all()
    ids = {"input_word_ids": encoded["input_ids"].numpy().astype(np.int32),
           "input_mask": encoded["attention_mask"].numpy().astype(np.int32),
           "input_type_ids": encoded["token_type_ids"].numpy().astype(np.int32)}
    by_ids = loaded.signatures["ids"](**{k: tf.constant(v) for k, v in ids.items()})
    np.testing.assert_allclose(by_ids["start_logits"].numpy(), want.start_logits.numpy(),
                               atol=1e-4)
    # The best span, by brute force over transformers' logits.
    types, mask = ids["input_type_ids"], ids["input_mask"]
    for row in range(len(questions)):
        context = [i for i in range(SEQ) if types[row, i] == 1 and mask[row, i] == 1
                   and ids["input_word_ids"][row, i] != tokenizer.sep_id]
        spans = [(want.start_logits[row, i] + want.end_logits[row, j], i, j)
                 for i in context for j in context if 0 <= j - i < 4]
        _, start, end = max(spans)
        assert (out["answer_start"].numpy()[row], out["answer_end"].numpy()[row]) == (start, end)
        # The answer: the context's text under the span, at transformers' offsets.
        spans = hf_tokenizer(questions[row], contexts[row], return_offsets_mapping=True,
                             truncation="only_second", max_length=SEQ)["offset_mapping"]
        begin, finish = spans[start][0], spans[end][1]
        assert out["answer"].numpy()[row].decode() == contexts[row][begin:finish]
        assert (out["answer_char_start"].numpy()[row], out["answer_char_end"].numpy()[row]) == (
            begin, finish)


def test_a_glue_task_on_a_model_whose_head_orders_the_labels_otherwise(tmp_path):
    """MNLI's labels in Google's order are contradiction, entailment, neutral; transformers'
    NLI models often order them otherwise in id2label. Evaluated with --task_name, the
    task's order relabelled the head's classes (entailment scored as contradiction); now the
    labels keep their head's classes, and Google's test_results.tsv keeps the task's column
    order, which GLUE's scripts read by position. Reference: transformers on the same pairs."""
    from bert_keras import run_classifier
    from data_prep import glue

    head_order = ["entailment", "neutral", "contradiction"]
    model = hf_model("BertForSequenceClassification", seed=6, labels=head_order)
    path = save_hf(model, tmp_path / "hf")
    out = tmp_path / "out"
    mnli = os.path.join(TESTDATA, "glue", "MNLI")
    run_classifier.run(task_name="MNLI", data_dir=mnli, init_checkpoint=path,
                       output_dir=str(out), do_train=False, do_eval=True, do_predict=True,
                       max_seq_length=40, eval_batch_size=4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    processor = glue.get_processor("mnli")

    def reference(examples):
        pairs = tokenizer([e.text_a for e in examples], [e.text_b for e in examples],
                          padding=True, return_tensors="pt")
        with torch.no_grad():
            return torch.softmax(model(**pairs).logits, -1).numpy()

    dev = processor.dev_examples(mnli)
    want = reference(dev)
    accuracy = np.mean([head_order[int(p.argmax())] == e.label for p, e in zip(want, dev)])
    results = json.load(open(out / "eval_results.json"))
    assert results["accuracy"] == pytest.approx(accuracy)
    test = processor.load(mnli, "test").examples
    want = reference(test)
    rows = [json.loads(line) for line in open(out / "predictions.jsonl")]
    assert len(rows) == len(test)
    for row, p in zip(rows, want):
        np.testing.assert_allclose([row["probabilities"][name] for name in head_order], p,
                                   atol=1e-5)
        assert row["label"] == head_order[int(p.argmax())]
    google = np.loadtxt(out / "test_results.tsv", ndmin=2)
    columns = [head_order.index(name) for name in processor.labels()]
    np.testing.assert_allclose(google, want[:, columns], atol=1e-5)


@pytest.mark.integration  # ~15 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_classifier_from_a_checkpoint_without_a_pooler_starts_it_from_the_initialiser(
        tmp_path):
    """transformers' BertForMaskedLM is saved without a pooler (how most Korean and domain
    BERTs are published); it loaded as a zero pooler, and run_classifier trained its new
    head from there: no gradient for the classifier layer at the first step. As
    transformers' from_pretrained does with weights a checkpoint lacks, the pooler now
    starts from the encoder's initialiser (truncated normal, stddev 0.02: sample std
    0.0176); a checkpoint's own pooler is kept."""
    from bert_keras import run_classifier

    mnli = os.path.join(TESTDATA, "glue", "MNLI")
    common = dict(task_name="MNLI", data_dir=mnli, do_train=True, max_seq_length=40,
                  train_batch_size=4, num_train_epochs=1, learning_rate=1e-7)
    mlm = save_hf(hf_model("BertForMaskedLM", seed=8), tmp_path / "mlm")
    run_classifier.run(init_checkpoint=mlm, output_dir=str(tmp_path / "from_mlm"), **common)
    pooler = model_loading.load_checkpoint(str(tmp_path / "from_mlm")).model.encoder.pooler_layer
    kernel, bias = np.asarray(pooler.kernel), np.asarray(pooler.bias)
    # 1024 draws: the sample std is within 3 standard errors (2.2% each) of 0.0176.
    assert 0.0176 * 0.93 < kernel.std() < 0.0176 * 1.07 and abs(kernel.mean()) < 0.002
    assert np.abs(kernel).max() <= 0.04 + 1e-5 and np.abs(bias).max() < 1e-5

    bert = hf_model("BertModel", seed=9)
    path = save_hf(bert, tmp_path / "bert")
    run_classifier.run(init_checkpoint=path, output_dir=str(tmp_path / "from_bert"), **common)
    kept = model_loading.load_checkpoint(str(tmp_path / "from_bert")).model.encoder.pooler_layer
    np.testing.assert_allclose(np.asarray(kept.kernel), bert.pooler.dense.weight.detach().numpy().T,
                               atol=1e-5)


@pytest.mark.parametrize("normalizer", ["bert_cased", "sequence_uncased"])
def test_a_tokenizers_casing_is_read_from_its_normalizer(tmp_path, normalizer):
    """transformers 5 saves a tokenizer built with the `tokenizers` library as tokenizer.json
    (its normalizer holds the casing) beside a tokenizer_config.json without casing keys. A
    cased one read as uncased: every capitalised word split or [UNK]. The casing comes from
    the normalizer, for the model directory and for a vocab.txt beside it, and our
    tokenizer splits as transformers' does."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from data_prep import tokenizer_config
    from data_prep.tokenization import BertTokenizer

    words = "Apple NASA Seoul Group Market people time world The Café résumé".split()
    rng = np.random.default_rng(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(rng.choice(words, 8)) + "\n" for _ in range(300)))
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = (normalizers.BertNormalizer(lowercase=False, strip_accents=False)
                      if normalizer == "bert_cased" else normalizers.Sequence(
                          [normalizers.NFD(), normalizers.Lowercase(),
                           normalizers.StripAccents()]))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train([str(corpus)], trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]")
    hf_dir = tmp_path / "hf"
    fast.save_pretrained(hf_dir)
    saved = json.loads((hf_dir / "tokenizer_config.json").read_text())
    assert "do_lower_case" not in saved  # what transformers writes for such a tokenizer
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=37, max_position_embeddings=40)
    ).save_pretrained(hf_dir)
    text = "Apple NASA Seoul Café résumé"
    want = transformers.AutoTokenizer.from_pretrained(hf_dir).tokenize(text)
    cased = normalizer == "bert_cased"
    ckpt = model_loading.load_checkpoint(str(hf_dir))
    settings = ckpt.saved_tokenizer[0]
    assert settings.effective()[:2] == ((False, False) if cased else (True, True))
    ours = BertTokenizer.from_config(ckpt.vocab_file, settings)
    assert ours.tokenize([text])[0] == want
    # A vocab.txt beside them (written from tokenizer.json, as the tools advise) too.
    tok.model.save(str(hf_dir))
    found = tokenizer_config.read_for_vocab(str(hf_dir / "vocab.txt"))
    assert found[0].effective()[:2] == settings.effective()[:2]
    # Without tokenizer_config.json, tokenizer.json alone gives it.
    os.remove(hf_dir / "tokenizer_config.json")
    os.remove(hf_dir / "vocab.txt")
    again = model_loading.load_checkpoint(str(hf_dir)).saved_tokenizer
    assert again[1].endswith("tokenizer.json") and again[0].effective()[:2] == \
        settings.effective()[:2]


@pytest.mark.parametrize("settings", ["tokenizer_config_without_casing", "tokenizer_json_alone",
                                      "vocab_txt_and_tokenizer_config_without_casing"])
def test_a_transformers_directorys_tokenizer_json_is_read_once(tmp_path, monkeypatch, settings):
    """transformers 5's layout (tokenizer.json, no vocab.txt): the vocabulary, the added
    tokens and the casing (its normalizer, where tokenizer_config.json gives none) all come
    from one read of the file; it was opened four times (an mBERT tokenizer.json is 2.9 MB).
    transformers 4's (vocab.txt beside it): the added tokens and the casing come from one
    read; it was opened twice (the casing read it again). Counted at builtins.open,
    whoever opens it."""
    import builtins
    import shutil

    directory = tmp_path / "hf"
    hf_model("BertModel", seed=6).save_pretrained(directory)
    transformers.BertTokenizer(vocab=VOCAB, do_lower_case=False).save_pretrained(directory)
    assert not (directory / "vocab.txt").exists()
    if settings.startswith("vocab_txt"):  # transformers 4 wrote vocab.txt as well
        shutil.copy(VOCAB, directory / "vocab.txt")
    config_file = directory / "tokenizer_config.json"
    if settings == "tokenizer_json_alone":
        os.remove(config_file)
    else:  # as transformers writes it for a tokenizer built with the tokenizers library
        values = json.loads(config_file.read_text())
        config_file.write_text(json.dumps({k: v for k, v in values.items()
                                           if k not in ("do_lower_case", "strip_accents")}))
    opened = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and \
                os.path.basename(os.fspath(file)) == "tokenizer.json":
            opened.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    ckpt = model_loading.load_checkpoint(str(directory))
    monkeypatch.undo()
    assert len(opened) == 1, opened
    # What the one read gave: transformers' ids and its (cased) normalizer.
    with open(ckpt.vocab_file, encoding="utf-8") as f, open(VOCAB, encoding="utf-8") as want:
        assert f.read().split("\n") == want.read().split("\n")
    assert ckpt.saved_tokenizer[0].effective()[0] is False
    assert ckpt.saved_tokenizer[1].endswith("tokenizer.json") == (
        settings == "tokenizer_json_alone")


@pytest.mark.parametrize("content,says", [
    ('["WordPiece"]', r"cannot be read as a tokenizer\.json \(a JSON list, not an object\)"),
    ('{"model": ["WordPiece"]}', r"a None tokenizer; BERT needs a WordPiece vocabulary"),
    ('{"model": {"type": "BPE", "vocab": {}}}', r"a 'BPE' tokenizer; BERT needs a WordPiece"),
])
def test_a_tokenizer_json_that_is_not_wordpiece_is_named_in_one_line(tmp_path, content, says):
    """Without vocab.txt, tokenizer.json is the vocabulary: one of another shape is a
    WeightLoadError naming the file (a "model" that was not an object raised
    AttributeError, a traceback from every tool)."""
    directory = tmp_path / "hf"
    hf_model("BertModel", seed=7).save_pretrained(directory)
    (directory / "tokenizer.json").write_text(content)
    with pytest.raises(WeightLoadError, match=r"tokenizer\.json: " + says):
        model_loading.load_checkpoint(str(directory))


@pytest.mark.integration
@pytest.mark.parametrize("name,tool,defaults", [
    ("BertForTokenClassification", "export_tagger", ["--doc_stride", "--tag_format"]),
    ("BertForQuestionAnswering", "export_span_qa",
     ["--max_answer_length", "--max_query_length", "--doc_stride",
      "--version_2_with_negative=false", "--null_score_diff_threshold"]),
])
def test_exports_of_converted_task_models_name_the_defaults_they_take(
        hf_dirs, tmp_path, caplog, name, tool, defaults):
    """transformers' config.json records none of run_tagger's or run_squad's windowing flags,
    so a converted model's export takes its defaults: the export names each one in a single
    warning (tests/test_regression.py checks the regressor's --pair the same way)."""
    from cli_harness import run_tool

    _converted(hf_dirs, name, tmp_path)  # writes tmp_path / "keras"
    model_dir = tmp_path / "keras"
    with caplog.at_level("WARNING"):
        result = run_tool(tool, [f"--model_dir={model_dir}", f"--export_dir={tmp_path / 'out'}",
                                 f"--max_seq_length={SEQ}"])
    assert result.code == 0, result.stderr[-2000:]
    warnings = [r.getMessage() for r in caplog.records if "records no fine-tuning" in r.getMessage()]
    assert len(warnings) == 1, warnings
    taken = warnings[0].split("the export takes ")[1].split(", the default")[0]
    assert taken.split(", ") == defaults, warnings[0]


@pytest.mark.integration  # A conversion and an export by the tool, in this process: ~30 s.
def test_a_converted_models_export_fits_its_position_table_without_max_seq_length(
        hf_dirs, tmp_path, caplog):
    """A converted model records no fine-tuning length, and export_tagger's default (128)
    exceeds a 40-position table: given no --max_seq_length, the export takes the table's
    length (max_position_embeddings in the converted directory's bert_config.json) and
    names that length, not the default, among the values it took; given one, the flag
    still decides (and is refused beyond the table)."""
    from cli_harness import run_tool

    _converted(hf_dirs, "BertForTokenClassification", tmp_path)  # writes tmp_path / "keras"
    model_dir = tmp_path / "keras"
    positions = CONFIG["max_position_embeddings"]
    with caplog.at_level("WARNING"):
        result = run_tool("export_tagger", [f"--model_dir={model_dir}",
                                            f"--export_dir={tmp_path / 'out'}"])
    assert result.code == 0, result.stderr[-2000:]
    warning = next(r.getMessage() for r in caplog.records
                   if "records no fine-tuning" in r.getMessage())
    assert f"the export takes --max_seq_length={positions}, " in warning, warning
    from export import batching_parameters, length_buckets

    # The export's lengths end at the table's (written beside the export).
    written = (tmp_path / "out" / "batching_parameters.txt").read_text()
    assert batching_parameters.recorded_buckets(written) == length_buckets.resolve(None,
                                                                                  positions)
    assert length_buckets.resolve(None, positions)[-1] == positions
    result = run_tool("export_tagger", [f"--model_dir={model_dir}",
                                        f"--export_dir={tmp_path / 'out2'}",
                                        f"--max_seq_length={positions + 1}"])
    assert result.code == 1 and result.error_lines == [
        f"error: --max_seq_length={positions + 1} exceeds the encoder's position table "
        f"({positions} positions)"], result.stderr[-2000:]


@pytest.mark.parametrize("layout", ["tokenizer_json", "vocab_txt_and_added_tokens_json"])
def test_tokens_added_to_a_transformers_tokenizer_are_refused_not_split(tmp_path, layout):
    """`tokenizer.add_tokens([...])` + `resize_token_embeddings`: transformers gives an added
    token its own id past the WordPieces; our tokenizer, reading the WordPieces alone, gave
    it [UNK] without a word (the embedding rows cover it, so the size check passed).
    Refused in one line naming the token and its id, in transformers 5's layout
    (tokenizer.json's added_tokens) and transformers 4's (vocab.txt + added_tokens.json)."""
    tokenizer = transformers.BertTokenizer(vocab=VOCAB)
    assert tokenizer.add_tokens(["zorblax"]) == 1
    model = hf_model("BertModel", seed=5)
    model.resize_token_embeddings(len(tokenizer))
    directory = tmp_path / "hf"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    # The reference: transformers reads the word as the one added id, V.
    again = transformers.AutoTokenizer.from_pretrained(directory)
    assert again("a zorblax")["input_ids"][2] == V
    if layout != "tokenizer_json":
        os.remove(directory / "tokenizer.json")
        with open(VOCAB, encoding="utf-8") as f:
            (directory / "vocab.txt").write_text(f.read(), encoding="utf-8")
        (directory / "added_tokens.json").write_text(json.dumps({"zorblax": V}))
    with pytest.raises(WeightLoadError, match=r"(tokenizer|added_tokens)\.json: the tokenizer "
                       r"has 1 token\(s\) added beyond its 79 WordPieces \('zorblax' \(id 79\)"):
        model_loading.load_checkpoint(str(directory))
    # Without the added token, the same directory loads (the specials' entries are fine).
    for name in ("tokenizer.json", "added_tokens.json"):
        if (directory / name).exists():
            os.remove(directory / name)
    if layout == "tokenizer_json":
        transformers.BertTokenizer(vocab=VOCAB).save_pretrained(directory)
    model_loading.load_checkpoint(str(directory), want="encoder")


def test_transformers_placeholder_labels_take_the_datas_labels_as_run_glue_does(tmp_path):
    """A head saved without label names (`num_labels=2` alone: transformers 5 writes no
    id2label, and reads LABEL_0, LABEL_1) was refused for data labelled 0/1 ("no class for
    ['0', '1']"); transformers' run_glue.py ignores such placeholders and gives the data's
    labels, sorted, the head's ids in order. Evaluated so, the probabilities are
    transformers' softmax on the same texts, class i under the i-th sorted label."""
    from bert_keras import run_classifier

    torch.manual_seed(8)
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(num_labels=2, **CONFIG)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = save_hf(model, tmp_path / "hf")
    assert "LABEL_1" in str(checkpoints.read_hf_labels(path))  # the placeholders it reads
    texts = ["john went to the store", "the store went running", "smith to john"]
    data = tmp_path / "dev.csv"
    data.write_text("sentence,label\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(texts)))
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        want = torch.softmax(model(**tokenizer(texts, padding=True, return_tensors="pt")).logits,
                             -1).numpy()
    # Evaluated with the labels given (--label_list), and trained (a step too small to move
    # the weights past 1e-5) on the data's labels: the head's classes are 0 and 1 in order.
    runs = {"given": dict(label_list=["0", "1"]),
            "trained": dict(do_train=True, train_file=str(data), num_train_steps=1,
                            learning_rate=1e-9, train_batch_size=3)}
    for name, flags in runs.items():
        out = tmp_path / name
        run_classifier.run(init_checkpoint=path, eval_file=str(data), predict_file=str(data),
                           text_a_column="sentence", output_dir=str(out), do_eval=True,
                           do_predict=True, max_seq_length=16, eval_batch_size=2, **flags)
        rows = [json.loads(line) for line in open(out / "predictions.jsonl")]
        for row, p in zip(rows, want, strict=True):
            np.testing.assert_allclose([row["probabilities"]["0"], row["probabilities"]["1"]],
                                       p, atol=1e-5)
        results = json.load(open(out / "eval_results.json"))
        assert results["accuracy"] == pytest.approx(np.mean(want.argmax(-1) == [0, 1, 0]))
