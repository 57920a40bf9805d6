"""run_regressor end to end on generated data, and its scores against scipy."""

import json
import os
import re

import numpy as np
import pytest

from bert_keras import model_loading, run_classifier, run_regressor
from bert_keras.finetuning.regression import (KLUE_STS_THRESHOLD, average_ranks, f1_at, pearson,
                                              regression_scores, spearman)
from bert_keras.tasks import BertRegressor
from test_run_finetune import HAM_WORDS, SPAM_WORDS, common, encoder_file  # noqa: F401

from data_prep.classification import DataError


def test_scores_equal_scipys_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 6, 50).astype(float)  # many ties, as STS-B's 0-5 scores
    predicted = gold + rng.normal(0, 1.5, 50)
    predicted[:10] = np.round(predicted[:10])  # ties among the predictions too
    np.testing.assert_allclose(average_ranks(gold), stats.rankdata(gold))
    np.testing.assert_allclose(pearson(gold, predicted), stats.pearsonr(gold, predicted)[0],
                               rtol=1e-12)
    np.testing.assert_allclose(spearman(gold, predicted),
                               stats.spearmanr(gold, predicted).correlation, rtol=1e-12)
    scores = regression_scores(gold, predicted)
    assert scores["num_examples"] == 50
    np.testing.assert_allclose(scores["mse"], np.mean((gold - predicted) ** 2))
    np.testing.assert_allclose(scores["corr"], (scores["pearson"] + scores["spearman"]) / 2)
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # a constant side correlates with nothing


def test_klue_sts_f1_hand_computed():
    """KLUE-STS's F1: "similar" is a score of 3.0 or more, gold (its binary-label) and
    predicted alike. Gold similar at 0, 2, 4; predicted at 0, 1, 4 (3.0 itself counts):
    TP 2, FP 1, FN 1, so precision = recall = F1 = 2/3."""
    gold = [3.5, 1.0, 4.0, 2.9, 3.0]
    predicted = [3.1, 3.2, 2.0, 1.0, 3.0]
    assert KLUE_STS_THRESHOLD == 3.0
    assert f1_at(gold, predicted, KLUE_STS_THRESHOLD) == pytest.approx(2 / 3, abs=1e-12)
    assert f1_at(gold, [0.0] * 5, 3.0) == 0.0  # nothing predicted similar
    assert f1_at(gold, gold, 3.0) == 1.0


def write_rated(path, n, seed):
    """Texts of spam and ham words rated 0-5 by their share of spam words: a number a small
    encoder learns within a few epochs."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            count = int(rng.integers(4, 12))
            spam = int(rng.integers(0, count + 1))
            words = list(rng.choice(SPAM_WORDS, spam)) + list(rng.choice(HAM_WORDS, count - spam))
            rng.shuffle(words)
            f.write(json.dumps({"text": " ".join(words),
                                "score": round(5 * spam / count, 3)}) + "\n")


@pytest.mark.integration  # ~14 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_regressor_learns_a_rating_and_its_files_say_what_the_model_says(tmp_path,
                                                                          encoder_file):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_rated(train, 160, 0)
    write_rated(test, 40, 1)
    out = tmp_path / "out"
    results = run_regressor.run(train_file=str(train), eval_file=str(test),
                                predict_file=str(test), label_column="score",
                                **common(out, encoder_file, learning_rate=3e-3,
                                         num_train_epochs=12.0))
    # A statistical bound: the rating is a function of the words; chance is 0. At 12 epochs
    # (240 steps) Pearson was 0.925-0.981 over seeds 1-5 and 7 of this run's recipe; at 6 it
    # ranged 0.45-0.98 with the random draws.
    print(json.dumps(results["eval"]))  # pytest -s
    assert results["eval"]["pearson"] > 0.85, results["eval"]
    assert results["eval"]["spearman"] > 0.85, results["eval"]
    assert sorted(os.listdir(out)) == sorted([
        "bert_config.json", "eval_results.json", "logs", "model.keras", "predict_results.json",
        "predictions.jsonl", "tokenizer_config.json", "train_results.json", "vocab.txt"])
    ckpt = model_loading.load_checkpoint(str(out))
    assert type(ckpt.model) is BertRegressor and ckpt.labels is None
    # The predictions are the saved model's scores of the texts.
    from data_prep import classification
    from data_prep.tokenization import BertTokenizer

    examples = classification.read_examples(str(test), label="score")
    tokenizer = BertTokenizer(ckpt.vocab_file, do_lower_case=True)
    arrays, _ = classification.convert_examples(examples, tokenizer, None, 16)
    want = ckpt.model.predict({"input_word_ids": arrays["input_ids"],
                               "input_mask": arrays["input_mask"],
                               "input_type_ids": arrays["segment_ids"]}, verbose=0)["score"]
    written = [json.loads(line) for line in open(out / "predictions.jsonl")]
    assert [w["where"] for w in written] == [e.where for e in examples]
    np.testing.assert_allclose([w["score"] for w in written], want, atol=2e-6)
    gold = [float(e.label) for e in examples]
    np.testing.assert_allclose(results["eval"]["pearson"], pearson(gold, want), atol=1e-5)
    # Evaluating the saved model alone gives the same scores.
    again = run_regressor.run(eval_file=str(test), label_column="score",
                              **common(tmp_path / "again", str(out), do_train=False,
                                       do_predict=False))
    np.testing.assert_allclose(again["eval"]["pearson"], results["eval"]["pearson"], atol=1e-6)


STSB_HEADER = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
               "sentence2")


def write_stsb(data_dir, n_train=24, n_dev=8, n_test=6):
    rng = np.random.default_rng(3)

    def rows(n, labelled):
        out = []
        for i in range(n):
            a = " ".join(rng.choice(SPAM_WORDS + HAM_WORDS, 5))
            b = " ".join(rng.choice(SPAM_WORDS + HAM_WORDS, 5))
            score = f"\t{rng.uniform(0, 5):.3f}" if labelled else ""
            out.append(f"{i}\tmain-news\tx\t2012\t{i:04d}\tnone\tnone\t{a}\t{b}{score}")
        return out

    os.makedirs(data_dir, exist_ok=True)
    for name, n, labelled in (("train", n_train, True), ("dev", n_dev, True),
                              ("test", n_test, False)):
        with open(os.path.join(data_dir, f"{name}.tsv"), "w") as f:
            f.write(STSB_HEADER + ("\tscore" if labelled else "") + "\n")
            f.write("\n".join(rows(n, labelled)) + "\n")


@pytest.fixture(scope="module")
def stsb_run(tmp_path_factory, encoder_file):  # noqa: F811 (the imported fixture)
    tmp = tmp_path_factory.mktemp("stsb")
    data_dir = str(tmp / "STS-B")
    write_stsb(data_dir)
    out = tmp / "stsb"
    results = run_regressor.run(task_name="STS-B", data_dir=data_dir,
                                **common(out, encoder_file))
    return data_dir, out, results


def test_glue_sts_b_runs_with_googles_flags_and_run_classifier_points_here(stsb_run, tmp_path,
                                                                            encoder_file):
    data_dir, out, results = stsb_run
    assert results["eval"]["num_examples"] == 8
    predictions = [json.loads(line) for line in open(out / "predictions.jsonl")]
    assert [p["id"] for p in predictions] == [str(i) for i in range(6)]
    assert json.load(open(out / "train_results.json"))["text_pair"] is True
    with pytest.raises(ValueError, match=r"--task_name=sts-b: a regression task .* run "
                                         r"bert_keras.run_regressor with the same flags"):
        run_classifier.run(task_name="sts-b", data_dir=data_dir,
                           **common(tmp_path / "x", encoder_file))
    with pytest.raises(ValueError, match=r"--task_name=mrpc: a classification task; run "
                                         r"bert_keras.run_classifier"):
        run_regressor.run(task_name="mrpc", data_dir=data_dir,
                          **common(tmp_path / "y", encoder_file))
    assert not os.path.exists(tmp_path / "x") and not os.path.exists(tmp_path / "y")


def test_a_label_that_is_not_a_number_is_refused_naming_its_line(tmp_path, encoder_file):
    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "free money", "score": 1.5}\n'
                     '{"text": "hello friend", "score": "high"}\n')
    with pytest.raises(DataError, match=r"train.jsonl:2: label 'high' is not a number"):
        run_regressor.run(train_file=str(train), label_column="score",
                          **common(tmp_path / "out", encoder_file, do_eval=False,
                                   do_predict=False))
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("label", ["1e39", "-3e19"])
def test_a_label_float32s_squared_error_cannot_hold_is_refused_before_training(
        tmp_path, encoder_file, label):
    """1e39 is finite in Python but inf in the float32 targets; -3e19's square is inf in
    float32. Before, both trained to an inf loss and NaN weights, then stopped with a
    traceback writing train_results.json, leaving a partial --output_dir."""
    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "free money", "score": 1.5}\n'
                     f'{{"text": "hello friend", "score": {label}}}\n'
                     '{"text": "free free", "score": 1e17}\n')  # the largest taken
    shown = re.escape(str(float(label)))  # the JSON number as read: 1e+39
    with pytest.raises(DataError, match=rf"train.jsonl:2: label '{shown}' is too large for "
                                        r"the float32 mean squared error \(at most 1e\+17 in "
                                        r"magnitude\); rescale the labels"):
        run_regressor.run(train_file=str(train), label_column="score",
                          **common(tmp_path / "out", encoder_file, do_eval=False,
                                   do_predict=False))
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.integration  # ~17 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_a_regressor_trained_from_a_classifiers_output_takes_none_of_its_labels(
        tmp_path, encoder_file):
    """--init_checkpoint=<run_classifier's output>: the regressor starts from its encoder and
    has no labels. Before, the classifier's labels were taken as the run's: labels.txt and
    label_list written beside the regressor, which then loaded with two labels and which
    convert_checkpoint --to=hf refused ("a BertRegressor has no labels")."""
    from bert_keras import convert_checkpoint
    from test_run_finetune import write_classification

    classified, rated = tmp_path / "cls.jsonl", tmp_path / "rated.jsonl"
    write_classification(classified, 16, 0)
    write_rated(rated, 16, 0)
    classifier = tmp_path / "classifier"
    run_classifier.run(train_file=str(classified),
                       **common(classifier, encoder_file, do_eval=False, do_predict=False,
                                num_train_epochs=1.0))
    assert model_loading.load_checkpoint(str(classifier)).labels == ["ham", "spam"]
    out = tmp_path / "regressor"
    run_regressor.run(train_file=str(rated), eval_file=str(rated), label_column="score",
                      **common(out, str(classifier), do_predict=False, num_train_epochs=1.0))
    assert not (out / "labels.txt").exists()
    assert "label_list" not in json.load(open(out / "train_results.json"))
    ckpt = model_loading.load_checkpoint(str(out))
    assert type(ckpt.model) is BertRegressor and ckpt.labels is None
    convert_checkpoint.convert("keras", "hf", str(out), str(tmp_path / "hf"))
    config = json.load(open(tmp_path / "hf" / "config.json"))
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "LABEL_0"}
    # A regressor saved that way before the fix: its stray labels.txt is ignored, with a
    # warning naming it (convert_checkpoint refused it, without naming the file).
    (out / "labels.txt").write_text("ham\nspam\n")
    assert model_loading.load_checkpoint(str(out)).labels is None
    convert_checkpoint.convert("keras", "hf", str(out), str(tmp_path / "hf2"))


def test_the_export_scores_pairs_as_the_tool_predicted_them(stsb_run, tmp_path):
    """run_regressor's STS-B model exported (the pair default from train_results.json, as
    export_regressor's command line takes it): the pair signature and TF Serving's Regress
    signature give the scores predictions.jsonl holds for the test file's pairs."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    from data_prep import glue
    from export.export_regressor import export_regressor
    from export.saved_model_writer import signature_method_names
    from export.task_export import load_task_dir

    data_dir, out, _ = stsb_run
    model, labels, tokenizer = load_task_dir(str(out), BertRegressor, "run_regressor", {},
                                             needs_labels=False)
    assert labels is None
    path = export_regressor(model, tokenizer, str(tmp_path / "export"), 16, pair=True)
    test = glue.get_processor("sts-b").load(data_dir, "test").examples
    a = tf.constant([e.text_a for e in test])
    b = tf.constant([e.text_b for e in test])
    want = [json.loads(line)["score"] for line in open(out / "predictions.jsonl")]
    loaded = tf.saved_model.load(path)
    got = loaded.signatures["pair"](text_a=a, text_b=b)["score"].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[e.text_a.encode()])),
        "text_b": tf.train.Feature(bytes_list=tf.train.BytesList(value=[e.text_b.encode()])),
    })).SerializeToString() for e in test]
    regress = loaded.signatures["serve_examples"](inputs=tf.constant(examples))
    np.testing.assert_allclose(regress["outputs"].numpy(), want, atol=1e-5)
    assert signature_method_names(path)["serve_examples"] == "tensorflow/serving/regress"


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # Three tools, verify's probe and TF 2.12.1 in fresh processes: ~2 min.
def test_a_transformers_sts_b_model_is_served_by_stock_tf_serving_with_its_scores(tmp_path):
    """transformers' STS-B head (BertForSequenceClassification, num_labels=1) as its users
    take it to TF Serving: convert_checkpoint, export_regressor, export.verify, then the
    export in a TF 2.12.1 + tensorflow-text 2.12.1 process (stock TF Serving's), no project
    code: the pair signature's scores equal transformers' logits on the same pairs."""
    from conftest import tf212_python
    from test_hf_tasks import V, VOCAB, hf_model, save_hf

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from cli_harness import run_tool

    hf = hf_model("BertForSequenceClassification", seed=5, num_labels=1)
    path = save_hf(hf, tmp_path / "hf")
    pairs = [("free money now", "click here for free money"), ("hello friend", "meeting"),
             ("John moved to Paris.", "Paris is a city in France.")]
    tokenizer = transformers.BertTokenizer(vocab=VOCAB, do_lower_case=True)
    assert len(tokenizer.vocab) == V
    batch = tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        want = hf(**batch).logits[:, 0].numpy()
    for tool, args in (("convert_checkpoint", ["--from=hf", "--to=keras", f"--input={path}",
                                               f"--output={tmp_path / 'keras'}"]),
                       ("export_regressor", [f"--model_dir={tmp_path / 'keras'}",
                                             f"--export_dir={tmp_path / 'export'}",
                                             "--max_seq_length=32", "--pair"]),
                       ("verify", [f"--export_dir={tmp_path / 'export'}"])):
        result = run_tool(tool, args)
        assert result.code == 0, result.stderr[-3000:]
    assert "regressor: text -> score; serve_examples for Regress" in result.stdout
    python = tf212_python()
    if python is None:
        pytest.skip("no tensorflow 2.12.1 interpreter (set BERT_KERAS_TF212_PYTHON)")
    script = (
        "import json, sys\n"
        "import tensorflow as tf, tensorflow_text\n"
        "pairs = json.loads(sys.argv[2])\n"
        "fn = tf.saved_model.load(sys.argv[1]).signatures['pair']\n"
        "out = fn(text_a=tf.constant([a for a, _ in pairs]),\n"
        "         text_b=tf.constant([b for _, b in pairs]))\n"
        "print(json.dumps({'versions': [tf.__version__, tensorflow_text.__version__],\n"
        "                  'score': out['score'].numpy().tolist()}))\n")
    import subprocess

    done = subprocess.run([python, "-c", script, str(tmp_path / "export" / "1"),
                           json.dumps(pairs)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["versions"] == ["2.12.1", "2.12.1"]
    np.testing.assert_allclose(got["score"], want, atol=1e-4)


def test_an_export_of_a_model_that_records_nothing_names_the_defaults_it_takes(
        stsb_run, tmp_path, caplog):
    """The STS-B regressor (fine-tuned on pairs, at --max_seq_length=16) through transformers'
    format and back records neither setting (config.json has no place for them), and
    export_regressor without --pair serves single texts: TF Serving's Regress API then drops
    each example's text_b without a word (the export's serve_examples scored text alone, a
    score 3.5e-3 from the pair's on the probe's model). Before, the export said nothing of the
    defaults it took; now one warning names each one not given, and none a flag given."""
    from bert_keras import convert_checkpoint
    from cli_harness import run_tool

    _, out, _ = stsb_run
    convert_checkpoint.convert("keras", "hf", str(out), str(tmp_path / "hf"))
    convert_checkpoint.convert("hf", "keras", str(tmp_path / "hf"), str(tmp_path / "back"))
    assert not (tmp_path / "back" / "train_results.json").exists()
    with caplog.at_level("WARNING"):
        result = run_tool("export_regressor", [f"--model_dir={tmp_path / 'back'}",
                                               f"--export_dir={tmp_path / 'export'}",
                                               "--max_seq_length=16"])
    assert result.code == 0, result.stderr[-2000:]
    warnings = [r.getMessage() for r in caplog.records if "records no fine-tuning" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].endswith(
        f"--model_dir {tmp_path / 'back'} records no fine-tuning settings (no "
        "train_results.json: a model converted from transformers, or a run from before they "
        "were recorded): the export takes --pair=false, the default; give the values the model "
        "was fine-tuned with"), warnings[0]
    caplog.clear()
    from absl import flags

    from export.task_export import warn_unrecorded_defaults

    values = flags.FlagValues()  # everything given: nothing to warn about
    given = [flags.DEFINE_integer("max_seq_length", 128, "", flag_values=values),
             flags.DEFINE_boolean("pair", False, "", flag_values=values)]
    values(["export", "--max_seq_length=16", "--pair"])
    with caplog.at_level("WARNING"):
        warn_unrecorded_defaults(str(tmp_path / "back"), {}, given)
    assert not caplog.records


def test_predicting_with_a_model_that_records_nothing_warns_that_texts_are_single(
        stsb_run, tmp_path, caplog):
    """The same converted STS-B regressor predicted alone from a file of pairs without
    --text_b_column: a model that records its pairs is refused (the test above it), one that
    records nothing scored the first texts alone without a word. Now a warning names the
    flag; with --text_b_column, none."""
    from bert_keras import convert_checkpoint

    data_dir, out, _ = stsb_run
    convert_checkpoint.convert("keras", "hf", str(out), str(tmp_path / "hf"))
    convert_checkpoint.convert("hf", "keras", str(tmp_path / "hf"), str(tmp_path / "back"))
    rated = tmp_path / "rated.jsonl"
    rated.write_text('{"text": "free money", "text_b": "hello friend", "score": 1.5}\n'
                     '{"text": "click here", "text_b": "meeting", "score": 0.5}\n')
    values = dict(predict_file=str(rated), label_column="score", max_seq_length=16,
                  do_train=False, do_eval=False, do_predict=True)
    with caplog.at_level("WARNING"):
        run_regressor.run(init_checkpoint=str(tmp_path / "back"),
                          output_dir=str(tmp_path / "single"), **values)
    warnings = [r.getMessage() for r in caplog.records if "records no fine-tuning" in r.getMessage()]
    assert warnings == [
        f"{tmp_path / 'back'} records no fine-tuning settings (no train_results.json: a model "
        "converted from transformers, or a run from before they were recorded): its inputs are "
        "read as single texts; give --text_b_column if it was fine-tuned on sentence pairs"]
    caplog.clear()
    with caplog.at_level("WARNING"):
        run_regressor.run(init_checkpoint=str(tmp_path / "back"), text_b_column="text_b",
                          output_dir=str(tmp_path / "pairs"), **values)
    assert not [r for r in caplog.records if "records no fine-tuning" in r.getMessage()]
