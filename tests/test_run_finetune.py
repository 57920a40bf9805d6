"""End-to-end fine-tuning entry points on generated data: train a few steps, eval, predict."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from bert_keras import BertEncoder, checkpoints, model_loading, run_classifier, run_squad, run_tagger
from bert_keras.finetuning import squad as sq
from bert_keras.finetuning.runner import FinetuneError
from bert_keras.finetuning.tagging import get_entities
from conftest import TESTDATA, event_scalars, make_inputs, piped
from data_prep import files, squad, tagging
from data_prep.classification import DataError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(TESTDATA, "ft_vocab.txt")
VOCAB_SIZE = sum(1 for _ in open(VOCAB, encoding="utf-8"))
SMALL = dict(vocab_size=VOCAB_SIZE, num_layers=2, hidden_size=16, num_heads=2,
             intermediate_size=24, max_sequence_length=48)


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("enc") / "encoder.keras")
    BertEncoder(**SMALL).save(path)
    return path


def common(output_dir, init_checkpoint, **overrides):
    values = dict(vocab_file=VOCAB, do_lower_case=True, bert_config_file=None,
                  init_checkpoint=init_checkpoint, output_dir=str(output_dir), do_train=True,
                  do_eval=True, do_predict=True, max_seq_length=16, train_batch_size=8,
                  eval_batch_size=16, learning_rate=1e-3, num_train_epochs=2.0,
                  warmup_proportion=0.1, seed=7, jit_compile=False, overwrite_output=False)
    values.update(overrides)
    return values


SPAM_WORDS = ["free", "money", "now", "click", "here"]
HAM_WORDS = ["meeting", "tomorrow", "hello", "friend", "city"]


def write_classification(path, n, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            label = "spam" if rng.random() < 0.5 else "ham"
            words = rng.choice(SPAM_WORDS if label == "spam" else HAM_WORDS, size=rng.integers(2, 20))
            f.write(json.dumps({"text": " ".join(words), "label": label}) + "\n")


@pytest.mark.integration  # ~21 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_fine_tuned_model_keeps_its_labels_when_trained_further(tmp_path, encoder_file):
    """A classifier trained with a label list in its own order ("spam", "ham"), trained
    further on data whose labels come out sorted ("ham", "spam"): the head's classes kept
    their names. Before, the sorted order relabelled them (every prediction swapped)."""

    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_classification(train, 48, 0)
    write_classification(test, 20, 1)
    order = tmp_path / "labels.txt"
    order.write_text("spam\nham\n")
    first, further = tmp_path / "first", tmp_path / "further"
    run_classifier.run(train_file=str(train), predict_file=str(test),
                       **common(first, encoder_file, do_eval=False, learning_rate=1e-2,
                                label_list_file=str(order)))
    run_classifier.run(train_file=str(train), predict_file=str(test),
                       **common(further, str(first), do_eval=False, learning_rate=1e-12,
                                num_train_epochs=1.0))
    assert open(further / "labels.txt").read() == "spam\nham\n"

    def spam(directory):
        return np.array([json.loads(line)["probabilities"]["spam"]
                         for line in open(directory / "predictions.jsonl")])

    assert np.abs(spam(first) - 0.5).max() > 1e-2  # a swap would show
    np.testing.assert_allclose(spam(further), spam(first), atol=1e-5)

    # Labels the model has no class for, or a list of other labels, are refused.
    extra = tmp_path / "extra.jsonl"
    extra.write_text(train.read_text() + json.dumps({"text": "hello", "label": "eggs"}) + "\n")
    with pytest.raises(FinetuneError, match=r"the training data's labels \['eggs', 'ham', "
                                            r"'spam'\] are not the labels of the fine-tuned "
                                            r"model .*first, \['spam', 'ham'\] \(it has no "
                                            r"class for \['eggs'\]\)"):
        run_classifier.run(train_file=str(extra), **common(tmp_path / "x", str(first),
                                                           do_eval=False, do_predict=False))
    other = tmp_path / "other.txt"
    other.write_text("ham\nspam\neggs\n")
    with pytest.raises(FinetuneError, match=r"the label list given \['ham', 'spam', 'eggs'\]"):
        run_classifier.run(train_file=str(train), label_list_file=str(other),
                           **common(tmp_path / "y", str(first), do_eval=False,
                                    do_predict=False))
    # The same list from a pipe (--label_list_file=<(printf ...)), which gives its lines to
    # one read: the runner read the list again to compare it with the model's ("no labels").
    with piped(b"ham\nspam\neggs\n") as path:
        with pytest.raises(FinetuneError, match=r"the label list given \['ham', 'spam', "
                                                r"'eggs'\]"):
            run_classifier.run(train_file=str(train), label_list_file=path,
                               **common(tmp_path / "z", str(first), do_eval=False,
                                        do_predict=False))
    assert not any((tmp_path / name).exists() for name in "xyz")


def test_run_classifier_train_eval_predict(tmp_path, encoder_file):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_classification(train, 48, 0)
    write_classification(test, 20, 1)
    out = tmp_path / "out"
    results = run_classifier.run(train_file=str(train), eval_file=str(test), predict_file=str(test),
                                 **common(out, encoder_file, log_steps=5))
    assert results["train"]["num_train_steps"] == 12  # int(48 / 8 * 2)
    assert results["train"]["truncated"] > 0  # texts of up to 19 words, 16 positions
    assert sorted(os.listdir(out)) == ["bert_config.json", "eval_results.json", "labels.txt",
                                       "logs", "model.keras", "predict_results.json",
                                       "predictions.jsonl", "tokenizer_config.json",
                                       "train_results.json", "vocab.txt"]
    assert open(out / "labels.txt").read() == "ham\nspam\n"
    # The eval accuracy agrees with the written predictions, checked independently.
    gold = [json.loads(line)["label"] for line in open(test)]
    predicted = [json.loads(line)["label"] for line in open(out / "predictions.jsonl")]
    metrics = json.load(open(out / "eval_results.json"))
    assert metrics["accuracy"] == pytest.approx(np.mean([g == p for g, p in zip(gold, predicted)]))
    assert metrics["num_examples"] == 20
    # Eval and predict timing land in the results files.
    assert metrics["eval_seconds"] > 0 and metrics["eval_examples_per_second"] > 0
    predict = json.load(open(out / "predict_results.json"))
    assert predict["num_examples"] == 20 and predict["predict_seconds"] > 0
    assert predict["predict_examples_per_second"] == pytest.approx(
        20 / predict["predict_seconds"], rel=0.05)
    # TensorBoard: loss and learning rate every 5 steps, the epoch, the evaluation at step 12.
    train_points = event_scalars(out / "logs" / "train")
    assert train_points["batch_loss"] == train_points["batch_learning_rate"] == [5, 10]
    assert train_points["epoch_loss"] == [0]
    validation = event_scalars(out / "logs" / "validation")
    assert validation["eval_accuracy"] == validation["eval_macro_f1"] == [12]

    # A rerun never overwrites silently: the same command takes its results up, computing
    # and writing nothing; with other data it is refused.
    written = {name: os.stat(out / name).st_mtime_ns for name in os.listdir(out)}
    rerun = run_classifier.run(train_file=str(train), eval_file=str(test),
                               **common(out, encoder_file, do_predict=False))
    assert rerun["eval"]["accuracy"] == metrics["accuracy"]
    assert {name: os.stat(out / name).st_mtime_ns for name in os.listdir(out)} == written
    with pytest.raises(FinetuneError, match=r"eval_results.json exists, made otherwise \(eval "
                                            r"data: 20 features, CRC \w+ -> 48 features, .*"
                                            r"refusing to overwrite"):
        run_classifier.run(train_file=str(train), eval_file=str(train),
                           **common(out, encoder_file, do_predict=False))
    # Eval only from the fine-tuned model (labels.txt beside it) gives the same numbers.
    again = run_classifier.run(eval_file=str(test), **common(
        tmp_path / "again", str(out / "model.keras"), do_train=False, do_predict=False))
    assert again["eval"]["accuracy"] == metrics["accuracy"]


def test_run_classifier_bad_label_names_file_and_line(tmp_path, encoder_file):
    train = tmp_path / "train.jsonl"
    write_classification(train, 16, 0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hello", "label": "ham"}\n{"text": "free", "label": "eggs"}\n')
    with pytest.raises(DataError, match=rf"{bad}:2: label 'eggs' is not in the label list"):
        run_classifier.run(train_file=str(train), eval_file=str(bad),
                           **common(tmp_path / "o", encoder_file, do_predict=False, num_train_epochs=0.5))


def _spy_on_the_loop(monkeypatch):
    """{"model": the model loop.train trained, "x", "outputs": loop.predict's last inputs
    and outputs}, filled as a tool runs."""
    from bert_keras.finetuning import loop

    seen = {}
    train, predict = loop.train, loop.predict

    def spy_train(model, *args, **kwargs):
        seen["model"] = model
        return train(model, *args, **kwargs)

    def spy_predict(model, x, *args, **kwargs):
        seen["x"], (seen["outputs"], timing) = x, predict(model, x, *args, **kwargs)
        return seen["outputs"], timing

    monkeypatch.setattr(loop, "train", spy_train)
    monkeypatch.setattr(loop, "predict", spy_predict)
    return seen


def _softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_run_classifier_mixed_bfloat16(tmp_path, encoder_file, monkeypatch):
    """--mixed_precision=mixed_bfloat16: the encoder's and the head's layers compute in
    bfloat16, the variables and the logits are float32, the loss finite; Keras' global
    policy is left alone. model.keras loads, as the exports load it, into a float32
    classifier with the trained weights, whose probabilities are the bfloat16 model's
    within bfloat16 rounding."""
    import keras

    from bert_keras.layers.dense import Dense
    from bert_keras.tasks import BertClassifier
    from export import task_export

    seen = _spy_on_the_loop(monkeypatch)
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_classification(train, 48, 0)
    write_classification(test, 20, 1)
    out = tmp_path / "out"
    results = run_classifier.run(train_file=str(train), predict_file=str(test), **common(
        out, encoder_file, do_eval=False, log_steps=4, mixed_precision="mixed_bfloat16"))
    model = seen["model"]
    encoder = model.encoder
    layers = [encoder.embeddings_layer, *encoder.transformer_layers, encoder.pooler_layer,
              model.classifier]
    dense = [layer for layer in encoder.transformer_layers[0]._flatten_layers()
             if isinstance(layer, Dense)]
    assert len(dense) >= 4  # query/key/value or fused, attention output, feed-forward
    for layer in layers + dense:
        assert layer.dtype_policy.name == "mixed_bfloat16", layer.name
        assert layer.compute_dtype == "bfloat16" and layer.variable_dtype == "float32"
    assert {v.dtype for v in model.weights} == {"float32"}
    assert keras.mixed_precision.global_policy().name == "float32"
    losses = [point["loss"] for point in results["train"]["loss_history"]]
    assert len(losses) == 3 and np.isfinite(losses).all(), losses
    logits16 = seen["outputs"]["logits"]
    assert logits16.dtype == np.float32
    written = [[row["probabilities"][label] for label in ("ham", "spam")]
               for row in map(json.loads, open(out / "predictions.jsonl"))]
    assert np.asarray(written).shape == (20, 2)

    loaded, labels, _ = task_export.load_task_dir(str(out), BertClassifier, "run_classifier", {})
    assert labels == ["ham", "spam"]
    assert loaded.encoder.layers_dtype_policy.name == "float32"
    assert loaded.classifier.compute_dtype == "float32"
    for a, b in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    logits32 = np.asarray(loaded.predict_on_batch(seen["x"])["logits"])
    assert np.abs(logits32 - logits16).max() > 1e-6  # the run's predictions were bfloat16's
    np.testing.assert_allclose(_softmax(logits16), _softmax(logits32), atol=5e-2)
    np.testing.assert_allclose(written, _softmax(logits32), atol=5e-2)


@pytest.mark.integration  # A fine-tuning run and a text-in export: about 40 s on 2 cores.
def test_export_classifier_of_a_mixed_bfloat16_run(tmp_path, encoder_file):
    """export_classifier takes a --mixed_precision=mixed_bfloat16 run's directory as any
    other: the export (float32, its default --serving_dtype) gives the probabilities of the
    float32 model with the trained weights, and the run's bfloat16 predictions within
    bfloat16 rounding."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    from cli_harness import run_tool
    from data_prep import classification
    from data_prep.schema import model_inputs
    from data_prep.tokenization import load_tokenizer

    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_classification(train, 24, 0)
    write_classification(test, 12, 1)
    out = tmp_path / "out"
    run_classifier.run(train_file=str(train), predict_file=str(test), **common(
        out, encoder_file, do_eval=False, num_train_steps=3, mixed_precision="mixed_bfloat16"))
    result = run_tool("export_classifier", [
        f"--model_dir={out}", f"--export_dir={tmp_path / 'models'}", "--max_seq_length=16",
        "--length_buckets=16"])
    assert result.code == 0, result.stderr[-3000:]
    served = tf.saved_model.load(result.stdout.strip().splitlines()[-1])
    texts = [json.loads(line)["text"] for line in open(test)]
    probabilities = served.signatures["serving_default"](text=tf.constant(texts))["probabilities"]
    ckpt = model_loading.load_checkpoint(str(out))
    model = ckpt.model
    assert model.encoder.layers_dtype_policy.name == "float32"
    tokenizer = load_tokenizer(ckpt.vocab_file, ckpt.tokenizer_settings()[0])
    x, _ = classification.convert_examples(classification.read_examples(str(test)), tokenizer,
                                           ["ham", "spam"], 16)
    expected = _softmax(np.asarray(model.predict_on_batch(model_inputs(x))["logits"]))
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    written = [[row["probabilities"][label] for label in ("ham", "spam")]
               for row in map(json.loads, open(out / "predictions.jsonl"))]
    np.testing.assert_allclose(probabilities, written, atol=5e-2)


def test_run_tagger_mixed_float16_scales_the_loss(tmp_path, encoder_file, monkeypatch):
    """--mixed_precision=mixed_float16 (run_tagger, through the same runner): float16
    compute, float32 variables, and the optimizer scales the loss (Keras' own wrapper),
    as Keras does for a model under a global mixed_float16 policy."""
    import keras

    seen = _spy_on_the_loop(monkeypatch)
    train = tmp_path / "train.conll"
    write_conll(train, 16, 0)
    results = run_tagger.run(train_file=str(train), **common(
        tmp_path / "out", encoder_file, do_eval=False, do_predict=False, num_train_steps=2,
        log_steps=1, mixed_precision="mixed_float16"))
    model = seen["model"]
    assert model.encoder.transformer_layers[0].compute_dtype == "float16"
    assert model.tagger.compute_dtype == "float16"
    assert {v.dtype for v in model.trainable_weights} == {"float32"}
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert np.isfinite([p["loss"] for p in results["train"]["loss_history"]]).all()
    assert keras.mixed_precision.global_policy().name == "float32"


def test_mixed_precision_bad_value_is_one_line_before_any_output(tmp_path, encoder_file):
    """A policy other than run_pretraining's is refused naming the flag and the accepted
    values: from Python (FinetuneOptions.validate) and on the command line (absl's enum, one
    line, exit status 2); nothing is created in either case."""
    from bert_keras import precision
    from cli_harness import run_tool

    assert precision.MIXED_PRECISION_POLICIES == ("float32", "mixed_bfloat16", "mixed_float16")
    train = tmp_path / "train.jsonl"
    write_classification(train, 8, 0)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"^--mixed_precision: expected one of float32, "
                       r"mixed_bfloat16, mixed_float16; found 'bf16'$"):
        run_classifier.run(train_file=str(train), **common(out, encoder_file,
                                                           mixed_precision="bf16"))
    assert not os.path.exists(out)
    result = run_tool("run_classifier", [
        f"--train_file={train}", f"--init_checkpoint={encoder_file}", f"--vocab_file={VOCAB}",
        "--do_train", f"--output_dir={out}", "--mixed_precision=bfloat16"])
    assert result.code == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.error_lines == [result.stderr.strip()], result.stderr
    line = result.error_lines[0]
    assert line.startswith("error: --mixed_precision=bfloat16: ") and all(
        name in line for name in precision.MIXED_PRECISION_POLICIES), line
    assert not os.path.exists(out)


def write_conll(path, n, seed):
    rng = np.random.default_rng(seed)
    sentences = []
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            words, tags = [], []
            for _ in range(rng.integers(2, 9)):
                if rng.random() < 0.3:
                    words += ["John", "Smith"]
                    tags += ["B-PER", "I-PER"]
                else:
                    words.append(str(rng.choice(["went", "to", "the", "store", "unwanted", "running"])))
                    tags.append("O")
            sentences.append((words, tags))
            f.write("".join(f"{w} X {t}\n" for w, t in zip(words, tags)) + "\n")
    return sentences


def test_run_tagger_train_eval_predict(tmp_path, encoder_file):
    train, test = tmp_path / "train.conll", tmp_path / "test.conll"
    write_conll(train, 40, 0)
    gold = write_conll(test, 12, 1)
    out = tmp_path / "out"
    results = run_tagger.run(train_file=str(train), eval_file=str(test), predict_file=str(test),
                             **common(out, encoder_file))
    assert open(out / "labels.txt").read() == "B-PER\nI-PER\nO\n"
    predicted = tagging.read_conll(str(out / "predictions.conll"))
    assert [s.words for s in predicted] == [tuple(w) for w, _ in gold]
    gold_tags = [t for _, t in gold]
    pred_tags = [list(s.tags) for s in predicted]
    metrics = json.load(open(out / "eval_results.json"))
    words = sum(len(t) for t in gold_tags)
    # Independent token accuracy from the written predictions (truncated words count as "O").
    assert metrics["token_accuracy"] == pytest.approx(
        sum(a == b for g, p in zip(gold_tags, pred_tags) for a, b in zip(g, p)) / words)
    assert metrics["num_words"] == words
    assert metrics["entity"]["num_gold"] == sum(len(get_entities(t)) for t in gold_tags)
    assert results["eval"]["token_accuracy"] == metrics["token_accuracy"]
    # TensorBoard gets the entity scores too, at the last training step.
    validation = event_scalars(out / "logs" / "validation")
    steps = validation["eval_token_accuracy"]
    assert validation["eval_entity_f1"] == validation["eval_entity_precision"] == \
        validation["eval_entity_recall"] == steps and len(steps) == 1


# POS-style tags (no "O"): a word past --max_seq_length without a prediction would read "_".
POS = {"John": "NNP", "Smith": "NNP", "went": "VBD", "to": "TO", "the": "DT", "store": "NN",
       "unwanted": "JJ", "running": "VBG", "man": "NN", ".": "."}


def write_pos_conll(path, lengths, seed):
    """Sentences of the given word counts ("unwanted" and "running" are 3 and 2
    WordPieces); returns [(words, tags)]."""
    rng = np.random.default_rng(seed)
    sentences = [[str(w) for w in rng.choice(sorted(POS), size=n)] for n in lengths]
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join("".join(f"{w} {POS[w]}\n" for w in words) + "\n" for words in sentences))
    return [(words, [POS[w] for w in words]) for words in sentences]


def test_run_tagger_tags_every_word_of_sentences_longer_than_max_seq_length(tmp_path,
                                                                           encoder_file):
    """By default a sentence longer than --max_seq_length - 2 WordPieces is tagged in
    windows: predictions.conll has the input's lines, a predicted tag for every word (no "_"
    fill for words past the length), and the evaluation scores every word once. Sentences
    that fit are evaluated as with --doc_stride=0 (truncation), by the same model."""
    train, test, short = (tmp_path / f"{n}.conll" for n in ("train", "test", "short"))
    write_pos_conll(train, [3, 20, 5, 30, 8, 12, 25, 4] * 2, 0)
    gold = write_pos_conll(test, [22, 4, 35, 9, 40, 6], 1)
    write_pos_conll(short, [3, 6, 5, 7, 4, 6], 2)  # at most 7 words: at most 14 WordPieces
    out = tmp_path / "out"
    results = run_tagger.run(train_file=str(train), eval_file=str(test), predict_file=str(test),
                             **common(out, encoder_file, max_seq_length=16))
    from data_prep.tokenization import BertTokenizer

    tokenizer = BertTokenizer(VOCAB)
    pieces = [sum(map(len, tokenizer.tokenize(words))) for words, _ in gold]
    assert max(pieces) > 3 * 14  # several windows each
    windows = sum(1 + max(0, -(-(n - 14) // 7)) for n in pieces)  # default stride (16-2)//2
    # The predictions file lines up with the input, line for line, with a tag per word.
    given = open(test, encoding="utf-8").read().splitlines()
    written = open(out / "predictions.conll", encoding="utf-8").read().splitlines()
    assert len(written) == len(given)
    assert [line.split()[0] for line in written if line] == [line.split()[0] for line in given
                                                            if line]
    assert all(line.split()[1] in set(POS.values()) for line in written if line)  # no "_"
    predicted = [list(s.tags) for s in tagging.read_conll(str(out / "predictions.conll"))]
    gold_tags = [tags for _, tags in gold]
    words = sum(map(len, gold_tags))
    metrics = json.load(open(out / "eval_results.json"))
    assert metrics["num_words"] == words and metrics["truncated_words"] == 0
    assert (metrics["num_windows"], metrics["doc_stride"]) == (windows, 7)
    assert metrics["token_accuracy"] == pytest.approx(
        sum(a == b for g, p in zip(gold_tags, predicted) for a, b in zip(g, p)) / words)
    assert results["predict"]["num_windows"] == windows
    assert results["train"]["num_windows"] == results["train"]["num_examples"] > 16
    # The same model: --doc_stride=0 truncates the long sentences (their tails read "_")...
    alone = dict(common(None, str(out), do_train=False, max_seq_length=None),
                 eval_file=str(test), predict_file=str(test))
    cut = run_tagger.run(**dict(alone, output_dir=str(tmp_path / "cut"), doc_stride=0))
    assert cut["eval"]["truncated_words"] > 0 and cut["eval"]["num_windows"] == len(gold)
    assert "_" in [line.split()[1] for line in open(tmp_path / "cut" / "predictions.conll")
                   if line.strip()]
    # ... and evaluates sentences that fit as the windowed default does.
    alone.update(eval_file=str(short), predict_file=str(short))
    by_stride = {stride: run_tagger.run(**dict(alone, output_dir=str(tmp_path / f"s{stride}"),
                                               doc_stride=stride))
                 for stride in (0, None)}
    evals = [{k: v for k, v in r["eval"].items() if not k.startswith("eval_")
              and k not in ("made_from", "doc_stride")} for r in by_stride.values()]
    assert evals[0] == evals[1] and evals[0]["num_windows"] == 6
    assert (open(tmp_path / "s0" / "predictions.conll").read() ==
            open(tmp_path / "sNone" / "predictions.conll").read())


def _h5_in_keras_file(path, tmp_path):
    import zipfile

    from conftest import h5_keys

    with zipfile.ZipFile(path) as z:
        z.extract("model.weights.h5", tmp_path)
    return h5_keys(str(tmp_path / "model.weights.h5"))


@pytest.mark.integration  # Three tool runs: about 25 s on 2 cores.
def test_num_train_steps_and_optimizer_state(tmp_path, encoder_file):
    """--num_train_steps replaces the epoch count; model.keras holds no optimizer state
    unless --save_optimizer_state, and both forms load for eval and further training."""
    train, test = tmp_path / "train.conll", tmp_path / "test.conll"
    write_conll(train, 40, 0)
    write_conll(test, 12, 1)
    runs = {}
    for keep in (False, True):
        out = tmp_path / f"out_{keep}"
        runs[keep] = run_tagger.run(train_file=str(train), eval_file=str(test),
                                    **common(out, encoder_file, num_train_steps=7,
                                             num_train_epochs=50.0, do_predict=False,
                                             save_optimizer_state=keep))
        train_results = json.load(open(out / "train_results.json"))
        assert train_results["num_train_steps"] == 7  # not int(40 / 8 * 50)
        assert train_results["num_warmup_steps"] == 0  # int(7 * 0.1)
        assert [h["step"] for h in train_results["loss_history"]] == [7]
    lean, full = (tmp_path / f"out_{k}" / "model.keras" for k in (False, True))
    lean_keys = _h5_in_keras_file(lean, tmp_path / "lean")
    full_keys = _h5_in_keras_file(full, tmp_path / "full")
    assert not any(k.startswith("optimizer") for k in lean_keys)
    assert any(k.startswith("optimizer") for k in full_keys)
    assert {k for k in full_keys if not k.startswith("optimizer")} == lean_keys
    assert os.path.getsize(lean) < os.path.getsize(full)
    # Same seed, same data: the same fine-tuned weights either way.
    import warnings

    with warnings.catch_warnings():  # the saved slots must match the optimizer Keras builds
        warnings.filterwarnings("error", message="Skipping variable loading")
        a, b = (model_loading.load_checkpoint(str(tmp_path / f"out_{k}")) for k in (False, True))
    for x, y in zip(a.model.weights, b.model.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert getattr(a.model, "optimizer", None) is None
    assert int(b.model.optimizer.iterations.numpy()) == 7
    # The lean directory evaluates as the training run did.
    again = run_tagger.run(eval_file=str(test), **common(
        tmp_path / "again", str(tmp_path / "out_False"), do_train=False, do_predict=False))
    assert again["eval"]["token_accuracy"] == runs[False]["eval"]["token_accuracy"]


def test_run_squad_epochs_count_questions_as_googles_run_squad(tmp_path, encoder_file):
    """Google's run_squad trains int(len(train_examples) / train_batch_size *
    num_train_epochs) steps, its examples the questions kept for training, on their windows.
    Here 5 questions (q5's answer is not in its context: dropped) in 10 windows of 20
    positions: int(5 / 4 * 2) = 2 steps; counting the windows trained int(10 / 4 * 2) = 5."""
    v2 = os.path.join(TESTDATA, "ft_squad_v2.json")
    results = run_squad.run(train_file=v2, doc_stride=4, max_query_length=8,
                            version_2_with_negative=True,
                            **common(tmp_path / "out", encoder_file, max_seq_length=20,
                                     train_batch_size=4, do_eval=False, do_predict=False))
    assert results["train"]["num_examples"] == 10  # the windows trained on
    assert results["train"]["num_train_steps"] == 2


def test_run_squad_writes_its_json_files_as_googles_run_squad(tmp_path, encoder_file):
    """predictions.json, nbest_predictions.json and null_odds.json as Google's run_squad
    writes them, `json.dumps(obj, indent=4)`: the questions in the predict file's order,
    each n-best entry's keys text, probability, start_logit, end_logit, and non-ASCII
    escaped, so the official evaluate scripts' `open(path)` reads them in any locale.
    Before: ids sorted, entry keys sorted, raw UTF-8 (an ASCII locale's reader failed, and
    Windows' cp1252 read the id "meteo" with accents as another: a missing prediction)."""
    ids = ["z-9", "m\u00e9t\u00e9o", "a-1", "10", "9"]
    context = "the caf\u00e9 man went to the store and bought a gallon of milk"
    answer = {"text": "a gallon of milk", "answer_start": context.index("a gallon of milk")}
    qas = [{"id": i, "question": f"who bought milk at the caf\u00e9 {n}?",
            "answers": [] if n == 3 else [answer], "is_impossible": n == 3}
           for n, i in enumerate(ids)]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [
        {"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}), encoding="utf-8")
    out = tmp_path / "out"
    run_squad.run(train_file=str(path), predict_file=str(path), version_2_with_negative=True,
                  doc_stride=8, max_query_length=8, num_train_steps=1,
                  **common(out, encoder_file, max_seq_length=24, train_batch_size=4,
                           do_eval=False))
    for name in ("predictions.json", "nbest_predictions.json", "null_odds.json"):
        text = (out / name).read_bytes().decode("ascii")  # an ASCII locale's open()
        written = json.loads(text)
        assert list(written) == ids, name  # the predict file's order
        assert text == json.dumps(written, indent=4) + "\n", name  # Google's json.dumps
    assert "m\\u00e9t\\u00e9o" in (out / "predictions.json").read_text(encoding="ascii")
    nbest = json.loads((out / "nbest_predictions.json").read_text(encoding="ascii"))
    assert all(list(entry) == ["text", "probability", "start_logit", "end_logit"]
               for entries in nbest.values() for entry in entries)


@pytest.mark.integration  # train, predict and evaluate: ~45 s on 2 cores (the default suite's time)
def test_run_squad_train_predict_eval(tmp_path, encoder_file):
    v2 = os.path.join(TESTDATA, "ft_squad_v2.json")
    out = tmp_path / "out"
    results = run_squad.run(train_file=v2, predict_file=v2, doc_stride=4, max_query_length=8,
                            n_best_size=5, max_answer_length=6, version_2_with_negative=True,
                            **common(out, encoder_file, max_seq_length=20, train_batch_size=4))
    assert results["train"]["answers_not_found"][0][0] == "q5"
    predictions = json.load(open(out / "predictions.json"))
    assert sorted(predictions) == ["q1", "q2", "q3", "q4", "q5", "q6"]
    nbest = json.load(open(out / "nbest_predictions.json"))
    assert all(len(v) <= 6 for v in nbest.values())
    odds = json.load(open(out / "null_odds.json"))
    assert sorted(odds) == sorted(predictions)
    metrics = json.load(open(out / "eval_results.json"))
    assert metrics.pop("eval_seconds") > 0 and metrics.pop("eval_examples_per_second") > 0
    assert metrics.pop("made_from")["eval data"].startswith("12 features, CRC ")
    assert metrics == sq.evaluate(sq.gold_answers(v2, True), predictions, True)
    predict = json.load(open(out / "predict_results.json"))
    assert predict["questions"] == 6 and predict["predict_examples_per_second"] > 0
    assert metrics["total"] == 6 and metrics["NoAns_total"] == 1
    assert all(isinstance(v, float) for v in odds.values())  # numbers for the v2.0 script
    # What export_span_qa takes as its defaults.
    recorded = json.load(open(out / "train_results.json"))
    assert (recorded["max_seq_length"], recorded["max_query_length"], recorded["doc_stride"],
            recorded["max_answer_length"], recorded["version_2_with_negative"],
            recorded["null_score_diff_threshold"]) == (20, 8, 4, 6, True, 0.0)
    # The same command with another stride: its model is refused, naming the flag (not only
    # the training features' CRC it changes).
    with pytest.raises(FinetuneError, match=r"trained otherwise \(--doc_stride: 4 -> 3; "
                                            r"training data: 10 features, CRC \w+ -> 11"):
        run_squad.run(train_file=v2, predict_file=v2, doc_stride=3, max_query_length=8,
                      n_best_size=5, max_answer_length=6, version_2_with_negative=True,
                      **common(out, encoder_file, max_seq_length=20, train_batch_size=4))
    # The same training (the threshold only sorts answers) with a threshold that turns some
    # answers of the first run into "" or back: the widest gap between two null_odds whose
    # side of it differs from their side of 0.
    ranked = sorted(odds.values())
    at_zero = sum(o > 0 for o in ranked)
    gaps = [(b - a, (a + b) / 2) for a, b in zip(ranked, ranked[1:])
            if sum(o > (a + b) / 2 for o in ranked) != at_zero]
    threshold = max(gaps)[1]
    tuned = tmp_path / "tuned"
    run_squad.run(train_file=v2, predict_file=v2, doc_stride=4, max_query_length=8,
                  n_best_size=5, max_answer_length=6, version_2_with_negative=True,
                  null_score_diff_threshold=threshold,
                  **common(tuned, encoder_file, max_seq_length=20, train_batch_size=4,
                           do_eval=False))
    tuned_odds = json.load(open(tuned / "null_odds.json"))
    np.testing.assert_allclose([tuned_odds[k] for k in sorted(odds)],
                               [odds[k] for k in sorted(odds)], atol=1e-5)
    tuned_answers = json.load(open(tuned / "predictions.json"))
    assert json.load(open(tuned / "train_results.json"))["null_score_diff_threshold"] == threshold
    # Predicting alone, without --max_seq_length, --max_query_length, --doc_stride,
    # --max_answer_length, --version_2_with_negative or --null_score_diff_threshold: the
    # recorded 20, 8, 4, 6, true and threshold, not run_squad's 384 (which exceeds the
    # 48-position table), 64 (which leaves no room in 20), 128, 30, false and 0; the same
    # answers as the training run's, "" exactly where null_odds exceed the threshold.
    alone = run_squad.run(predict_file=v2, n_best_size=5,
                          **common(tmp_path / "alone", str(tuned), max_seq_length=None,
                                   do_train=False, do_eval=False))
    assert alone["predict"]["questions"] == 6
    assert json.load(open(tmp_path / "alone" / "predictions.json")) == tuned_answers
    # "" where the null score wins by more than the threshold, and where no span of the
    # n-best is an answer (data_prep.squad.postprocess: only "no answer" is left; the odds
    # are then the null score's). Which questions those are depends on the weights of the
    # module's encoder, drawn after whatever ran before in this process.
    tuned_nbest = json.load(open(tuned / "nbest_predictions.json"))
    no_span = {k for k, entries in tuned_nbest.items() if not any(e["text"] for e in entries)}
    assert {k for k, v in tuned_answers.items() if v == ""} == \
        {k for k, v in tuned_odds.items() if v > threshold} | no_span
    # The export of this run, from its recorded settings (doc_stride 4 and max_seq_length 20
    # make several windows of a context), answers as run_squad predicts where run_squad
    # scores every span (n_best_size >= S).
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    from cli_harness import run_tool

    every = run_squad.run(predict_file=v2, n_best_size=20,
                          **common(tmp_path / "every", str(tuned), max_seq_length=None,
                                   do_train=False, do_eval=False))
    assert every["predict"]["questions"] == 6
    exported = run_tool("export_span_qa", [f"--model_dir={tuned}",
                                           f"--export_dir={tmp_path / 'export'}"])
    assert exported.code == 0, exported.stderr[-3000:]
    served = tf.saved_model.load(exported.stdout.strip().splitlines()[-1])
    paragraphs = json.load(open(v2))["data"][0]["paragraphs"]
    asked = [(qa["id"], qa["question"], p["context"]) for p in paragraphs for qa in p["qas"]]
    got = served.signatures["serving_default"](
        question=tf.constant([q for _, q, _ in asked]),
        context=tf.constant([c for _, _, c in asked]))
    want = json.load(open(tmp_path / "every" / "predictions.json"))
    every_odds = json.load(open(tmp_path / "every" / "null_odds.json"))
    assert [a.decode() for a in got["answer"].numpy()] == [want[i] for i, _, _ in asked]
    np.testing.assert_allclose(got["null_odds"], [every_odds[i] for i, _, _ in asked], atol=1e-4)
    assert max(got["windows"].numpy()) == 3


def _scores(results):
    return {k: v for k, v in results.items() if k not in (
        "eval_seconds", "eval_examples_per_second", "made_from")}


@pytest.mark.integration  # ~21 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_run_squad_korquad_and_klue_mrc_by_task_name(tmp_path, encoder_file):
    """--task_name reads KorQuAD's or KLUE-MRC's files from --data_dir (their own names and
    layout) and scores the dev file with the benchmark's metric; an evaluation alone scores
    as the model's run did; what the task fixes cannot be given otherwise."""
    korquad = os.path.join(TESTDATA, "korquad")
    out = tmp_path / "korquad"
    settings = dict(doc_stride=8, max_query_length=8)
    results = run_squad.run(task_name="KorQuAD", data_dir=korquad, **settings,
                            **common(out, encoder_file, max_seq_length=32, train_batch_size=4))
    dev = os.path.join(korquad, "KorQuAD_v1.0_dev.json")
    predictions = json.load(open(out / "predictions.json", encoding="utf-8"))
    assert sorted(predictions) == ["6548850-0-0", "6548850-0-1", "6566495-1-0"]
    assert results["train"]["num_examples"] >= 4 and not os.path.exists(out / "null_odds.json")
    assert _scores(results["eval"]) == sq.evaluate(sq.gold_answers(dev), predictions,
                                                   metric="korquad")
    recorded = json.load(open(out / "train_results.json"))
    assert (recorded["eval_metric"], recorded["version_2_with_negative"]) == ("korquad", False)
    # Evaluating the model alone on the file by path: KorQuAD's metric, as recorded; SQuAD's
    # when asked for.
    alone = dict(do_train=False, do_predict=False, max_seq_length=None)  # as recorded
    again = run_squad.run(predict_file="KorQuAD_v1.0_dev.json", data_dir=korquad,  # relative
                          **common(tmp_path / "again", str(out), **alone))
    assert _scores(again["eval"]) == _scores(results["eval"])
    words = run_squad.run(predict_file=dev, eval_metric="squad",
                          **common(tmp_path / "words", str(out), **alone))
    assert _scores(words["eval"]) == sq.evaluate(sq.gold_answers(dev), predictions)

    klue = os.path.join(TESTDATA, "glue", "klue_benchmark")  # klue-mrc-v1.1/ below it
    out = tmp_path / "klue"
    results = run_squad.run(task_name="klue-mrc", data_dir=klue, **settings,
                            **common(out, encoder_file, max_seq_length=32, train_batch_size=4))
    dev = os.path.join(klue, "klue-mrc-v1.1", "klue-mrc-v1.1_dev.json")
    predictions = json.load(open(out / "predictions.json", encoding="utf-8"))
    examples, _ = squad.read_squad(dev, False, True)
    assert _scores(results["eval"]) == sq.evaluate(
        sq.gold_answers(dev, True), predictions, True, "klue-mrc",
        {e.qas_id: e.question_type for e in examples})
    assert os.path.exists(out / "null_odds.json")  # SQuAD 2.0: questions may have no answer
    assert {"rouge_w", "type3_total", "NoAns_rouge_w"} <= set(results["eval"])
    # What the task fixes, given otherwise; files by flag beside it; a task not known; a
    # directory without the files.
    for values, message in (
            (dict(task_name="klue-mrc", version_2_with_negative=False),
             "--task_name=klue-mrc sets --version_2_with_negative=true; drop"),
            (dict(task_name="korquad", eval_metric="squad"),
             "--task_name=korquad sets --eval_metric=korquad; drop --eval_metric"),
            (dict(task_name="korquad", train_file=dev), "drop --train_file / --predict_file"),
            (dict(task_name="korquad2"), "unknown span-QA task 'korquad2'; known: korquad, "),
            (dict(task_name="klue-mrc", data_dir=korquad), "no klue-mrc-v1.1_train.json there"),
            (dict(task_name="korquad", data_dir=None), "--task_name=korquad needs --data_dir")):
        values = {"data_dir": klue, **values}
        with pytest.raises(FinetuneError, match=re.escape(message)):
            run_squad.run(**values, **settings,
                          **common(tmp_path / "refused", encoder_file, max_seq_length=32))
        assert not os.path.exists(tmp_path / "refused")


def test_init_checkpoint_forms_load_the_same_encoder(tmp_path):
    """Ours (.keras, encoder dir), Hugging Face and Google checkpoints give one encoder."""
    encoder = BertEncoder(**SMALL)
    x = make_inputs(batch=2, seq=7, vocab=VOCAB_SIZE)
    expected = np.asarray(encoder(x)["sequence_output"])
    keras_file = str(tmp_path / "enc.keras")
    encoder.save(keras_file)
    ours = tmp_path / "encoder"
    ours.mkdir()
    encoder.save_weights(str(ours / "encoder.weights.h5"))
    encoder.to_bert_config().to_json_file(str(ours / "bert_config.json"))
    hf = checkpoints.save_hf_weights(encoder, str(tmp_path / "hf"))
    google_dir = tmp_path / "google"
    google_dir.mkdir()
    google = checkpoints.save_google_checkpoint(encoder, str(google_dir / "bert_model.ckpt"))
    for path in (keras_file, str(ours), hf, google):
        loaded = model_loading.load_encoder(path)
        assert isinstance(loaded, BertEncoder), path
        np.testing.assert_allclose(loaded(x)["sequence_output"], expected, atol=1e-6, err_msg=path)
    # No checkpoint: random initialisation needs a config, and the error names both flags.
    train = tmp_path / "train.jsonl"
    write_classification(train, 8, 0)
    with pytest.raises(ValueError, match="--init_checkpoint, or --bert_config_file"):
        run_classifier.run(train_file=str(train), **common(tmp_path / "out", None,
                                                           do_eval=False, do_predict=False))
    assert not os.path.exists(tmp_path / "out")  # nothing written for a refused run


@pytest.mark.integration  # ~32 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_fine_tuning_is_the_same_from_every_form_of_a_checkpoint(tmp_path):
    """One pretrained model as a pretrainer (.keras; loading builds its MLM and NSP heads
    too), an encoder file, Hugging Face's and Google's layouts: the new head and every
    dropout layer draw from --seed alone, so the fine-tuned weights are the same. Before,
    they drew from Keras' generators after as many draws as the form's loading made, and
    each form fine-tuned to other weights."""
    from bert_keras import BertPretrainer

    keras_utils = __import__("keras").utils
    keras_utils.set_random_seed(11)
    pretrainer = BertPretrainer(BertEncoder(**SMALL))
    pretrainer_file = str(tmp_path / "pretrainer.keras")
    pretrainer.save(pretrainer_file)
    encoder_file = str(tmp_path / "encoder.keras")
    pretrainer.encoder.save(encoder_file)
    hf = checkpoints.save_hf_weights(pretrainer.encoder, str(tmp_path / "hf"))
    (tmp_path / "google").mkdir()
    google = checkpoints.save_google_checkpoint(pretrainer.encoder,
                                                str(tmp_path / "google" / "bert_model.ckpt"))
    train = tmp_path / "train.jsonl"
    write_classification(train, 24, 0)
    weights = {}
    for name, path in (("pretrainer", pretrainer_file), ("encoder", encoder_file),
                       ("hf", hf), ("google", google)):
        out = tmp_path / name
        run_classifier.run(train_file=str(train), num_train_steps=3, **common(
            out, path, do_eval=False, do_predict=False))
        weights[name] = [np.asarray(w) for w in
                         model_loading.load_checkpoint(str(out)).model.weights]
    for name in ("encoder", "hf", "google"):
        assert len(weights[name]) == len(weights["pretrainer"])
        for a, b in zip(weights[name], weights["pretrainer"]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=name)


def _cli(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=900)


def test_absl_entry_points_reject_bad_flags(tmp_path):
    proc = _cli("bert_keras.run_tagger", "--do_train", f"--output_dir={tmp_path}")
    assert proc.returncode != 0 and ("--train_file (or --task_name with --data_dir) is required "
                                     "with --do_train") in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("module", ["bert_keras.run_classifier", "bert_keras.run_tagger"])
def test_absl_entry_point_trains(tmp_path, encoder_file, module):
    if module.endswith("classifier"):
        data = tmp_path / "train.jsonl"
        write_classification(data, 16, 0)
    else:
        data = tmp_path / "train.conll"
        write_conll(data, 16, 0)
    out = tmp_path / "cli"
    proc = _cli(module, f"--train_file={data}", f"--eval_file={data}", f"--vocab_file={VOCAB}",
                f"--init_checkpoint={encoder_file}", "--do_train", "--do_eval",
                "--max_seq_length=12", "--train_batch_size=8", "--num_train_epochs=1",
                f"--output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.path.exists(out / "model.keras") and os.path.exists(out / "eval_results.json")


def test_a_google_run_classifier_checkpoint_predicts_with_its_head(tmp_path, caplog):
    """Google's way to predict with a model its run_classifier fine-tuned:
    `--do_predict --init_checkpoint=<its model.ckpt-N>` with the task's labels. Before, the
    loader gave the encoder alone (the head's output_weights / output_bias dropped with an
    INFO line) and the run failed with "nothing to evaluate"; --do_train trained a new head
    over the trained one. The reference is the same classifier saved in our layout."""
    import tensorflow as tf

    from bert_keras.finetuning.runner import FinetuneError
    from bert_keras.tasks import BertClassifier
    from data_prep import tokenizer_config
    from test_checkpoints import write_tf1_checkpoint

    rng = np.random.default_rng(5)
    classifier = BertClassifier(BertEncoder(**SMALL), num_classes=2)
    classifier.set_weights([rng.normal(0, 0.3, w.shape).astype(np.float32)
                            for w in classifier.get_weights()])
    prefix = checkpoints.save_google_checkpoint(classifier.encoder,
                                                str(tmp_path / "enc" / "bert_model.ckpt"))
    tensors = {name: tf.train.load_checkpoint(prefix).get_tensor(name)
               for name, _ in tf.train.list_variables(prefix)}
    kernel, bias = classifier.get_layer("classifier").get_weights()
    tensors.update({"output_weights": kernel.T.copy(), "output_bias": bias,
                    "global_step": np.int64(40)})
    config = json.load(open(tmp_path / "enc" / "bert_config.json"))
    google = write_tf1_checkpoint(str(tmp_path / "mrpc_output" / "model.ckpt-40"), tensors, config)
    ours = model_loading.save_task_dir(classifier, str(tmp_path / "ours"), ["ham", "spam"], VOCAB,
                                       tokenizer_config.TokenizerConfig())
    test = tmp_path / "test.jsonl"
    write_classification(test, 12, 3)

    def probabilities(directory):
        return np.array([[p["probabilities"][k] for k in ("ham", "spam")]
                         for p in map(json.loads, open(directory / "predictions.jsonl"))])

    predict = dict(do_train=False, do_eval=False, predict_file=str(test))
    run_classifier.run(**common(tmp_path / "from_ours", ours, **predict))
    run_classifier.run(label_list=["ham", "spam"],
                       **common(tmp_path / "from_google", google, **predict))
    assert np.abs(probabilities(tmp_path / "from_ours") - 0.5).max() > 1e-2
    np.testing.assert_allclose(probabilities(tmp_path / "from_google"),
                               probabilities(tmp_path / "from_ours"), atol=1e-6)
    with pytest.raises(FinetuneError, match=r"^no label list: .* --label_list"):
        run_classifier.run(**common(tmp_path / "no_labels", google, **predict))
    # Trained further (learning rate ~0): its head is kept, its classes named after the
    # data's sorted labels, with a warning that says so.
    train = tmp_path / "train.jsonl"
    write_classification(train, 16, 4)
    run_classifier.run(train_file=str(train), **common(
        tmp_path / "further", google, do_eval=False, predict_file=str(test),
        learning_rate=1e-12, num_train_epochs=1.0))
    assert "records no label names: its classes are taken to be ['ham', 'spam']" in caplog.text
    np.testing.assert_allclose(probabilities(tmp_path / "further"),
                               probabilities(tmp_path / "from_ours"), atol=1e-5)


def test_xnli_test_accuracy_and_the_language_flag(tmp_path, encoder_file):
    """XNLI is scored on its labelled test set, per language: --do_predict on it gave
    probabilities alone (--do_eval reads the dev set and --eval_file is refused with
    --task_name), though glue.py keeps the test labels for that. Labelled predict data now
    gets the eval scores in predict_results.json. --xnli_language with another task, or
    without one, was ignored without a word (English MNLI scores for a German run)."""
    from bert_keras.finetuning.runner import FinetuneError
    from data_prep import glue

    data_dir = os.path.join(TESTDATA, "glue", "XNLI")
    out = tmp_path / "xnli"
    results = run_classifier.run(task_name="xnli", data_dir=data_dir,
                                 **common(out, encoder_file, train_batch_size=2,
                                          do_eval=False))
    test = glue.get_processor("xnli").load(data_dir, "test").examples
    predicted = [json.loads(line)["label"] for line in open(out / "predictions.jsonl")]
    gold = [e.label for e in test]
    assert results["predict"]["num_examples"] == len(test)
    assert results["predict"]["accuracy"] == pytest.approx(
        np.mean([p == g for p, g in zip(predicted, gold)]))
    assert json.load(open(out / "predict_results.json"))["accuracy"] == \
        results["predict"]["accuracy"]
    for flags in (dict(task_name="mrpc", data_dir=os.path.join(TESTDATA, "glue", "MRPC")),
                  dict(train_file=str(tmp_path / "t.jsonl"))):
        with pytest.raises(FinetuneError, match=r"^--xnli_language=de is for "
                                                r"--task_name=xnli; drop it"):
            run_classifier.run(xnli_language="de", **flags,
                               **common(tmp_path / "x", encoder_file))
    assert not (tmp_path / "x").exists()


def test_run_classifier_task_name_reads_google_layout(tmp_path, encoder_file):
    """--task_name=mrpc --data_dir: Google's files per split, label list and test ids."""
    data_dir = os.path.join(TESTDATA, "glue", "MRPC")
    out = tmp_path / "mrpc"
    results = run_classifier.run(task_name="MRPC", data_dir=data_dir,
                                 **common(out, encoder_file, train_batch_size=2))
    assert results["train"]["label_list"] == ["0", "1"]  # Google's MrpcProcessor order
    # What the exports take as defaults: the length, and that the task classifies pairs.
    recorded = json.load(open(out / "train_results.json"))
    assert (recorded["max_seq_length"], recorded["text_pair"]) == (
        common(out, encoder_file)["max_seq_length"], True)
    assert open(out / "labels.txt").read() == "0\n1\n"
    predictions = [json.loads(line) for line in open(out / "predictions.jsonl")]
    from data_prep import glue

    test = glue.get_processor("mrpc").load(data_dir, "test")
    assert [p["id"] for p in predictions] == test.ids
    assert results["eval"]["num_examples"] == len(glue.get_processor("mrpc").load(data_dir, "dev").examples)
    with pytest.raises(ValueError, match="regression"):
        run_classifier.run(task_name="sts-b", data_dir=data_dir, **common(tmp_path / "x", encoder_file))
    with pytest.raises(ValueError, match="drop --train_file"):
        run_classifier.run(task_name="mrpc", data_dir=data_dir, train_file="t.tsv",
                           **common(tmp_path / "y", encoder_file))
    # Flags of the file route that the task fixes itself are refused, not silently ignored.
    with pytest.raises(ValueError, match=r"--task_name reads its columns and labels .*; drop "
                       r"--text_a_column / --label_list$"):
        run_classifier.run(task_name="mrpc", data_dir=data_dir, label_list=["1", "0"],
                           text_a_column="foo", **common(tmp_path / "z", encoder_file))
    assert not os.path.exists(tmp_path / "z")


def test_task_exports_default_to_what_the_fine_tuning_recorded(tmp_path, caplog):
    """--max_seq_length and --pair: the command line's value where given (a warning where it
    differs from the recorded one), else train_results.json's, else the flag's default."""
    from absl import flags

    from export import task_export

    def holders(*argv):
        values = flags.FlagValues()
        length = flags.DEFINE_integer("max_seq_length", 128, "", flag_values=values)
        pair = flags.DEFINE_boolean("pair", False, "", flag_values=values)
        values(["export", *argv])
        return length, pair

    (tmp_path / "train_results.json").write_text(json.dumps(
        {"num_train_steps": 3, "max_seq_length": 32, "text_pair": True}))
    recorded = files.fine_tuned_with(str(tmp_path))
    length, pair = holders()
    assert task_export.given_or_recorded(length, recorded, "max_seq_length", "Length") == 32
    assert task_export.given_or_recorded(pair, recorded, "text_pair", "Pairs") is True
    length, pair = holders("--max_seq_length=64", "--nopair")
    with caplog.at_level("WARNING"):
        assert task_export.given_or_recorded(length, recorded, "max_seq_length", "L") == 64
        assert task_export.given_or_recorded(pair, recorded, "text_pair", "P") is False
    assert "--max_seq_length=64, but the model was fine-tuned with max_seq_length=32" in caplog.text
    assert "--pair=False, but the model was fine-tuned with text_pair=True" in caplog.text
    # A converted model, a run from before these were recorded, a damaged file: defaults.
    length, pair = holders()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "train_results.json").write_text('{"num_train_steps": 3}')
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train_results.json").write_text('{"max_seq_len')
    for directory in ("converted", "old", "bad"):
        recorded = files.fine_tuned_with(str(tmp_path / directory))
        assert task_export.given_or_recorded(length, recorded, "max_seq_length", "L") == 128
        assert task_export.given_or_recorded(pair, recorded, "text_pair", "P") is False


@pytest.mark.integration  # ~11 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_evaluating_alone_takes_the_length_the_model_was_fine_tuned_at(tmp_path, encoder_file,
                                                                      caplog):
    """--do_eval / --do_predict without --do_train and without --max_seq_length: the length
    train_results.json records for the model evaluated (in --output_dir, or in
    --init_checkpoint's directory), not 128. Before, 128 exceeded this model's 48-position
    table and the run failed; a model with a larger table would have been scored on other
    inputs than it was trained on. Another length given is used, with a warning naming both
    (as the exports warn), where before it ran without a word."""
    train = tmp_path / "train.jsonl"
    write_classification(train, 24, 0)  # up to 20 words: some cut at 12
    out = tmp_path / "clf"
    run_classifier.run(train_file=str(train), **common(out, encoder_file, max_seq_length=12,
                                                       do_eval=False, do_predict=False))
    evaluate = dict(common(out, None, max_seq_length=None, do_train=False, do_predict=False),
                    eval_file=str(train))
    recorded = run_classifier.run(**evaluate)["eval"]
    assert recorded["truncated"] > 0
    with caplog.at_level("WARNING"):
        given = run_classifier.run(**dict(evaluate, max_seq_length=12,
                                          overwrite_output=True))["eval"]
    assert "fine-tuned with max_seq_length" not in caplog.text  # the same length: no warning
    assert (recorded["truncated"], recorded["accuracy"], recorded["loss"]) == (
        given["truncated"], given["accuracy"], given["loss"])
    with caplog.at_level("WARNING"):
        longer = run_classifier.run(**dict(evaluate, max_seq_length=48,
                                           overwrite_output=True))["eval"]
    assert longer["truncated"] == 0
    warned = [r.getMessage() for r in caplog.records if "fine-tuned with max_seq_length" in
              r.getMessage()]
    assert warned == [f"--max_seq_length=48, but {out} was fine-tuned with max_seq_length=12 "
                      "(train_results.json)"], warned
    # The model in --init_checkpoint's directory, evaluated into another --output_dir.
    elsewhere = run_classifier.run(**dict(evaluate, init_checkpoint=str(out),
                                          output_dir=str(tmp_path / "elsewhere")))["eval"]
    assert (elsewhere["truncated"], elsewhere["loss"]) == (recorded["truncated"], recorded["loss"])
    # Training still defaults to Google's 128 (here refused by the 48-position table).
    from bert_keras.finetuning.runner import FinetuneError

    with pytest.raises(FinetuneError, match="--max_seq_length=128 exceeds the model's position"):
        run_classifier.run(train_file=str(train), **common(
            tmp_path / "again", encoder_file, max_seq_length=None, do_eval=False,
            do_predict=False))


@pytest.mark.integration  # ~13 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_evaluating_a_pair_model_alone_needs_its_second_text(tmp_path, encoder_file):
    """A classifier fine-tuned on pairs (--text_b_column), evaluated or predicting alone
    without --text_b_column: refused, naming the flag. Before, the files' second texts were
    left out without a word, so predictions.jsonl and the scores were a single-text model's
    (unlike the training run's, and unlike the export, which reads text_pair from
    train_results.json)."""
    from bert_keras.finetuning.runner import FinetuneError

    pairs = tmp_path / "pairs.jsonl"
    rng = np.random.default_rng(0)
    pairs.write_text("".join(json.dumps({
        "text": " ".join(rng.choice(SPAM_WORDS if label == "spam" else HAM_WORDS, 4)),
        "text_b": " ".join(rng.choice(HAM_WORDS, 3)), "label": label}) + "\n"
        for label in ["spam", "ham"] * 6))
    out = tmp_path / "clf"
    run_classifier.run(train_file=str(pairs), text_b_column="text_b", **common(
        out, encoder_file, do_eval=False, do_predict=False))
    alone = dict(common(tmp_path / "elsewhere", str(out), do_train=False, do_eval=False),
                 predict_file=str(pairs))
    with pytest.raises(FinetuneError, match=r"^--text_b_column: .*clf was fine-tuned on "
                                            r"sentence pairs"):
        run_classifier.run(**alone)
    assert not (tmp_path / "elsewhere").exists()
    given = run_classifier.run(**dict(alone, text_b_column="text_b"))["predict"]
    assert given["num_examples"] == 12


def test_sentence_pairs_for_a_model_with_one_segment_embedding_are_refused(tmp_path):
    """A model with type_vocab_size 1 given sentence pairs: the second text's segment id 1
    read a zero row of the segment table, without an error, on both backends."""
    from bert_keras.finetuning.runner import FinetuneError

    encoder_file = str(tmp_path / "one_segment.keras")
    BertEncoder(**SMALL, type_vocab_size=1).save(encoder_file)
    train = tmp_path / "pairs.jsonl"
    train.write_text("".join(json.dumps({"text": "free money", "text_b": "click here",
                                         "label": label}) + "\n" for label in ("spam", "ham")))
    with pytest.raises(FinetuneError, match=r"^--train_file: its examples are sentence pairs, "
                                            r"but the model has type_vocab_size=1 "):
        run_classifier.run(train_file=str(train), text_b_column="text_b",
                           **common(tmp_path / "out", encoder_file, do_eval=False,
                                    do_predict=False))
    assert not (tmp_path / "out").exists()


def test_schedule_and_epsilon_flags_reach_the_optimizer(monkeypatch):
    """--lr_schedule / --epsilon_placement / --gradient_accumulation_steps: flags of every
    fine-tuning tool (shared options), defaults linear / adam_paper / 1, passed through
    loop.train to create_optimizer."""
    from bert_keras.finetuning import loop
    from bert_keras.finetuning.runner import FinetuneOptions
    from data_prep import cli

    fields = {f.name: f for f in cli.flag_fields(FinetuneOptions)}
    assert fields["lr_schedule"].default == "linear"
    assert fields["lr_schedule"].metadata["enum"] == ("linear", "google")
    assert fields["epsilon_placement"].default == "adam_paper"
    assert fields["epsilon_placement"].metadata["enum"] == ("adam_paper", "keras")
    assert fields["gradient_accumulation_steps"].default == 1
    seen = {}

    class _Stop(Exception):
        pass

    def fake_create_optimizer(*args, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(loop, "create_optimizer", fake_create_optimizer)
    x = {"input_word_ids": np.zeros((4, 8), np.int32)}
    with pytest.raises(_Stop):
        loop.train(None, x, {}, 2, 1.0, 1e-4, 0.1, lr_schedule="google",
                   epsilon_placement="keras", gradient_accumulation_steps=3)
    # The schedule divides Keras' micro-batch counter by the accumulation.
    assert seen == {"lr_schedule": "google", "epsilon_placement": "keras",
                    "gradient_accumulation_steps": 3}


@pytest.mark.integration  # Two tool runs: about 40 s on 2 cores.
def test_head_initializer_flag_reaches_the_head(tmp_path, encoder_file):
    """--head_initializer: a flag of every fine-tuning tool, default normal (transformers'),
    truncated_normal (Google's) on request; the trained model records which."""
    from bert_keras.finetuning.runner import FinetuneOptions
    from data_prep import cli

    field = {f.name: f for f in cli.flag_fields(FinetuneOptions)}["head_initializer"]
    assert field.default == "normal"
    assert field.metadata["enum"] == ("normal", "truncated_normal")
    train = tmp_path / "train.conll"
    write_conll(train, 8, 0)
    for choice in (None, "truncated_normal"):
        out = tmp_path / str(choice)
        flags = {} if choice is None else {"head_initializer": choice}
        run_tagger.run(train_file=str(train), **common(out, encoder_file, do_eval=False,
                                                       do_predict=False, num_train_steps=1,
                                                       **flags))
        model = model_loading.load_checkpoint(str(out)).model
        assert model.head_initializer == (choice or "normal")


@pytest.mark.integration  # Three tool runs per case: about 35 s each on 2 cores.
# The tagger's: not in CI (time); make test-all runs it.
@pytest.mark.parametrize("module_name", [pytest.param("run_tagger", marks=pytest.mark.slow),
                                         "run_classifier"])
def test_skip_padding_flag_reaches_the_model(tmp_path, encoder_file, module_name):
    """--skip_padding (default on) builds the tagger / classifier padding-free;
    --noskip_padding the padded one; a model trained further takes this run's setting."""
    from bert_keras.finetuning.classification import ClassifierOptions
    from bert_keras.finetuning.tagging import TaggerOptions
    from data_prep import cli

    options = TaggerOptions if module_name == "run_tagger" else ClassifierOptions
    assert {f.name: f for f in cli.flag_fields(options)}["skip_padding"].default is True
    module = run_tagger if module_name == "run_tagger" else run_classifier
    if module_name == "run_tagger":
        train = tmp_path / "train.conll"
        write_conll(train, 8, 0)
    else:
        train = tmp_path / "train.jsonl"
        write_classification(train, 8, 0)
    trained = {}
    for skip in (None, False):
        out = tmp_path / str(skip)
        flags = {} if skip is None else {"skip_padding": skip}
        module.run(train_file=str(train), **common(out, encoder_file, do_eval=False,
                                                   do_predict=False, num_train_steps=1,
                                                   **flags))
        trained[skip] = model_loading.load_checkpoint(str(out)).model
        assert trained[skip].skip_padding is (skip is None)
    # Further training of the padding-free model with --noskip_padding: a padded copy.
    out = tmp_path / "further"
    module.run(train_file=str(train), **common(out, str(tmp_path / "None"), do_eval=False,
                                               do_predict=False, num_train_steps=1,
                                               skip_padding=False))
    assert model_loading.load_checkpoint(str(out)).model.skip_padding is False


@pytest.mark.integration  # Two tool processes: about 40 s on 2 cores.
def test_mirrored_on_two_cpu_devices_trains_the_weights_of_one(tmp_path):
    """--distribution_strategy=mirrored --num_cpu_devices=2 (MirroredStrategy on TensorFlow,
    keras.distribution.DataParallel on JAX) fine-tunes the weights one device does, over 20
    updates, within float32 noise (the order of the gradient's sums); the data order is the
    same however many iterators Keras makes (finetuning.loop.make_dataset)."""
    import keras

    from conftest import backend_env

    encoder = tmp_path / "encoder.keras"
    BertEncoder(**SMALL, dropout=0.0, attention_dropout=0.0).save(encoder)
    write_classification(tmp_path / "train.jsonl", 56, 0)
    lr, steps = 5e-3, 20
    args = [f"--train_file={tmp_path / 'train.jsonl'}", f"--init_checkpoint={encoder}",
            f"--vocab_file={VOCAB}", "--do_lower_case", "--do_train", "--max_seq_length=16",
            "--train_batch_size=8", f"--num_train_steps={steps}", f"--learning_rate={lr}",
            "--classifier_dropout=0", "--seed=3"]
    weights = []
    for name, extra in (("one", []), ("two", ["--distribution_strategy=mirrored",
                                              "--num_cpu_devices=2"])):
        done = subprocess.run(
            [sys.executable, "-m", "bert_keras.run_classifier", *args, *extra,
             f"--output_dir={tmp_path / name}"], cwd=REPO, capture_output=True, text=True,
            timeout=900, env=backend_env(keras.backend.backend()))
        assert done.returncode == 0, done.stderr[-3000:]
        weights.append(keras.saving.load_model(tmp_path / name / "model.keras").get_weights())
    assert "mirrored (" in done.stderr and "with 2 replica(s)" in done.stderr
    difference = max(float(np.abs(a - b).max()) for a, b in zip(*weights))
    assert difference <= 1e-4 * lr * steps, difference
    initial = keras.saving.load_model(encoder).get_weights()
    trained = model_loading.load_checkpoint(str(tmp_path / "one")).model.encoder.get_weights()
    assert max(float(np.abs(a - b).max()) for a, b in zip(trained, initial)) > 1e-2 * lr * steps


@pytest.mark.integration  # ~21 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_an_interrupted_save_leaves_no_model_beside_another_runs_settings(
        tmp_path, encoder_file, monkeypatch):
    """Ctrl-C while run_classifier saved: model.keras was written first and the files the
    exports read beside it after, so an interruption left a model without its casing,
    sentence pairs and length (export_classifier then used the defaults without a word),
    or, with --overwrite_output, the new model beside the old run's settings. model.keras
    now comes last (the old one removed first), and a rerun is not refused over what an
    interrupted save left."""
    from bert_keras import model_loading
    from data_prep import files

    train = tmp_path / "train.jsonl"
    write_classification(train, 16, 0)
    out = tmp_path / "out"
    args = dict(train_file=str(train), **common(out, encoder_file, do_eval=False,
                                                do_predict=False, num_train_epochs=1.0))
    real = files.write_json

    def interrupted(path, *a, **k):
        if path.endswith(files.TRAIN_RESULTS_FILE):
            raise KeyboardInterrupt
        return real(path, *a, **k)

    monkeypatch.setattr(files, "write_json", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_classifier.run(**args)
    assert not (out / "model.keras").exists() and not any(
        files.is_temp_name(name) for name in os.listdir(out))
    with pytest.raises(model_loading.CheckpointError):
        model_loading.load_checkpoint(str(out))
    monkeypatch.setattr(files, "write_json", real)
    run_classifier.run(**args)  # not refused over the leftovers
    assert json.load(open(out / "train_results.json"))["max_seq_length"] == 16
    # Overwriting at another length, interrupted: no model, not the old one beside the
    # new length or the new one beside the old.
    monkeypatch.setattr(files, "write_json", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_classifier.run(**dict(args, max_seq_length=12, overwrite_output=True))
    assert not (out / "model.keras").exists()


@pytest.mark.integration  # ~13 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_overwrite_output_takes_the_replaced_models_results_away(tmp_path, encoder_file):
    """--overwrite_output --do_train replaced model.keras and kept the old model's
    eval_results.json, predictions and Google's eval_results.txt / test_results.tsv (which
    record no model): read as the new model's, and refused by the next --do_eval."""
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_classification(train, 24, 0)
    write_classification(test, 8, 1)
    out = tmp_path / "out"
    run_classifier.run(train_file=str(train), eval_file=str(test), predict_file=str(test),
                       **common(out, encoder_file))
    for google in ("eval_results.txt", "test_results.tsv"):  # as a --task_name run leaves
        (out / google).write_text("old\n")
    before = os.stat(out / "model.keras").st_mtime_ns
    run_classifier.run(train_file=str(train), **common(out, encoder_file, do_eval=False,
                                                        do_predict=False, learning_rate=1e-4,
                                                        overwrite_output=True))
    assert os.stat(out / "model.keras").st_mtime_ns != before
    left = {"eval_results.json", "predict_results.json", "predictions.jsonl",
            "eval_results.txt", "test_results.tsv"} & set(os.listdir(out))
    assert not left, left
    # The new model is evaluated without --overwrite_output: nothing of the old one is in
    # the way.
    results = run_classifier.run(eval_file=str(test), **common(out, encoder_file,
                                                                do_train=False,
                                                                do_predict=False))
    assert results["eval"]["num_examples"] == 8


def test_a_second_run_into_an_output_dir_in_use_is_refused(tmp_path, encoder_file):
    """Two runs into one --output_dir at once both trained, shared one backup, and the
    loser left it orphaned (refused by every later run as "not one this tool wrote"). The
    directory is locked while a run uses it: another is refused in one line."""
    train = tmp_path / "train.jsonl"
    write_classification(train, 16, 0)
    out = tmp_path / "out"
    with files.exclusively(str(out), "--output_dir"):  # a run holding it
        with pytest.raises(files.DirectoryInUseError, match=r"^--output_dir .*out is in use "
                                                            r"by another run of this tool"):
            run_classifier.run(train_file=str(train), **common(out, encoder_file,
                                                                do_eval=False,
                                                                do_predict=False))
        assert os.listdir(out) == []
    assert not out.exists()  # the lock's directory, left empty, is not left behind
    run_classifier.run(train_file=str(train), **common(out, encoder_file, do_eval=False,
                                                        do_predict=False))
    assert (out / "model.keras").is_file()


def test_a_diverging_run_stops_at_the_first_non_finite_loss_and_saves_nothing(
        tmp_path, encoder_file):
    """--learning_rate=1e8 makes the loss NaN at step 4 (seeded). Before, training ran on to
    its last step on NaN weights and the run then died with a traceback writing the NaN loss
    to train_results.json (Keras' TerminateOnNaN would have saved the NaN model instead)."""
    train = tmp_path / "train.jsonl"
    write_classification(str(train), 64, 1)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=(
            r"^training diverged: the loss is nan at step 4; lower --learning_rate \(now "
            r"1e\+08\), or look for labels or inputs out of range \(no model was saved; the "
            rf"backup in {re.escape(str(out / 'backup'))} is from before it: remove it to "
            r"train again with other flags\)$")):
        run_classifier.run(train_file=str(train), **common(
            out, encoder_file, learning_rate=1e8, do_eval=False, do_predict=False,
            num_train_epochs=3.0, save_checkpoints_steps=2))
    assert not (out / "model.keras").exists() and not (out / "train_results.json").exists()


def test_evaluating_a_checkpoint_that_is_not_fine_tuned_names_what_it_holds(
        tmp_path, encoder_file):
    """--do_eval alone with --init_checkpoint=<an encoder>: before, the error named only
    the empty --output_dir ("no model.keras in --output_dir"), as if no checkpoint had
    been given."""
    data = tmp_path / "data.jsonl"
    write_classification(str(data), 8, 0)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=(
            rf"^nothing to evaluate: --init_checkpoint {re.escape(encoder_file)} holds a "
            r"BertEncoder, not a fine-tuned BertClassifier, and --output_dir "
            rf"{re.escape(str(out))} holds no model.keras \(add --do_train to fine-tune it "
            r"first\)$")):
        run_classifier.run(eval_file=str(data), **common(out, encoder_file, do_train=False,
                                                         do_predict=False))
    assert not out.exists()


def test_a_task_file_that_is_a_named_pipe_is_found(tmp_path):
    """A --task_name's file as a FIFO (mkfifo klue-ner-v1.1_train.tsv, fed by zcat): its
    reader reads it once (`files.rereadable`), but the lookup took it for missing ("no ...
    there"); a directory of that name is still missing. Finding it opens nothing."""
    from bert_keras.finetuning.runner import benchmark_file

    below = tmp_path / "klue-ner-v1.1"
    below.mkdir()
    os.mkfifo(below / "train.tsv")
    assert benchmark_file(str(tmp_path), "train.tsv", "klue-ner-v1.1", "klue-ner",
                          "train") == str(below / "train.tsv")
    os.mkfifo(tmp_path / "dev.tsv")
    assert benchmark_file(str(tmp_path), "dev.tsv", "", "klue-ner", "dev") == str(
        tmp_path / "dev.tsv")
    (tmp_path / "test.tsv").mkdir()
    with pytest.raises(FinetuneError, match=r"no test.tsv there for the klue-ner test set"):
        benchmark_file(str(tmp_path), "test.tsv", "", "klue-ner", "test")
