"""The Korean recipe through every stage: tokenizer settings travel with the vocabulary.

As a Korean user runs it (README): `--strip_accents=false` is given to build_vocab and
create_pretraining_data only; run_pretraining, run_classifier, run_tagger, run_squad,
extract_features, export_preprocessor and export_classifier get no tokenizer flag at all.
Every text any of them tokenizes must give the ids of the independent reference,
transformers' `BertTokenizer(vocab, do_lower_case=True, strip_accents=False)`; with the
uncased default instead, Hangul is decomposed into jamo and every Korean word becomes [UNK]
(checked too, so the comparison can fail). The exports are checked in a fresh process that
imports only TensorFlow and tensorflow-text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tokenizer_refs as refs
from bert_keras import (extract_features, model_loading, run_classifier, run_regressor, run_squad,
                        run_tagger)
from conftest import TESTDATA
from bert_keras.run_pretraining import PretrainingOptions, train
from data_prep.tokenization import BertTokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S = 32  # sequence length of every stage
EXTRA = ["Café au lait, naïve résumé.", "Busan and Seoul are port and capital."]


def _korean_lines():
    return [line for line in refs.read_lines(refs.KOREAN_FILE) if line.strip()]


def _cli(module, *args, cwd=REPO):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{module}: {proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """build_vocab -> create_pretraining_data -> run_pretraining, as the README says."""
    tmp = tmp_path_factory.mktemp("korean")
    lines = _korean_lines()
    corpus = tmp / "corpus.txt"
    docs = [lines[i:i + 5] for i in range(0, len(lines), 5)] + [EXTRA]
    corpus.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    vocab = tmp / "vocab" / "vocab.txt"
    _cli("data_prep.build_vocab", f"--input={corpus}", f"--output={vocab}", "--vocab_size=600",
         "--layout=compact", "--min_frequency=1", "--strip_accents=false")
    data = tmp / "data" / "train"
    _cli("data_prep.create_pretraining_data", f"--input_file={corpus}", f"--vocab_file={vocab}",
         f"--output_file={data}", "--num_output_shards=1", f"--max_seq_length={S}",
         "--max_predictions_per_seq=5", "--dupe_factor=2", "--num_examples_to_print=0",
         "--strip_accents=false")
    run = tmp / "run"
    train(PretrainingOptions(
        input_file=f"{data}-*.tfrecord", output_dir=str(run), preset="tiny",
        vocab_file=str(vocab), max_seq_length=S, max_predictions_per_seq=5,
        train_batch_size=4, num_train_steps=4, num_warmup_steps=0, save_checkpoints_steps=4,
        log_steps=2, verbose=0, autotune=False))
    return {"tmp": tmp, "vocab": str(vocab), "run": str(run), "lines": lines}


@pytest.fixture(scope="module")
def reference(pipeline):
    return refs.hf_tokenizer(pipeline["vocab"], do_lower_case=True, strip_accents=False)


@pytest.fixture
def spy(monkeypatch):
    """Records every (texts, wordpieces) the tools' tokenizer produces."""
    calls = []
    original = BertTokenizer.tokenize

    def tokenize(self, texts):
        texts = list(texts)
        pieces = original(self, texts)
        calls.append((texts, pieces))
        return pieces

    def with_offsets(self, texts):
        texts = list(texts)
        units = original_offsets(self, texts)
        calls.append((texts, [[piece for piece, _, _ in pieces] for pieces in units]))
        return units

    original_offsets = BertTokenizer.tokenize_with_char_offsets
    monkeypatch.setattr(BertTokenizer, "tokenize", tokenize)
    monkeypatch.setattr(BertTokenizer, "tokenize_with_char_offsets", with_offsets)
    return calls


def _assert_matches_reference(calls, reference):
    assert calls, "the tool tokenized nothing"
    checked = 0
    for texts, pieces in calls:
        for text, ours in zip(texts, pieces):
            assert ours == reference.tokenize(text), text
            checked += 1
    return checked


def test_settings_travel_to_the_encoder_directory(pipeline):
    saved = json.load(open(os.path.join(pipeline["run"], "encoder", "tokenizer_config.json")))
    assert saved["do_lower_case"] is True and saved["strip_accents"] is False
    # The same file is what transformers reads from a directory.
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(os.path.join(pipeline["run"], "encoder"))
    line = pipeline["lines"][0]
    assert hf.tokenize(line) == refs.hf_tokenizer(
        pipeline["vocab"], do_lower_case=True, strip_accents=False).tokenize(line)


def test_the_default_would_break_korean(pipeline, reference):
    """Why the settings must travel: the uncased default turns Korean words into [UNK]."""
    default = BertTokenizer(pipeline["vocab"])  # do_lower_case=True, strip_accents=None
    line = pipeline["lines"][0]
    assert default.tokenize([line])[0] != reference.tokenize(line)
    assert "[UNK]" in default.tokenize([line])[0] and "[UNK]" not in reference.tokenize(line)


@pytest.mark.integration  # ~16 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_continued_pretraining_keeps_the_models_tokenization(pipeline):
    """Continuing the Korean model needs no config, vocabulary or tokenizer flag; data made
    with the uncased default (its vocab.txt copied without tokenizer_config.json: jamo, not
    syllables) is refused before anything is written, naming both settings. Before, it
    trained the Korean model on that data and saved the default's settings with it."""
    from bert_keras.run_pretraining import PretrainingError

    tmp = pipeline["tmp"]
    bare = tmp / "bare" / "vocab.txt"
    bare.parent.mkdir()
    bare.write_bytes(open(pipeline["vocab"], "rb").read())
    default = tmp / "default_data" / "train"
    _cli("data_prep.create_pretraining_data", f"--input_file={tmp / 'corpus.txt'}",
         f"--vocab_file={bare}", f"--output_file={default}", "--num_output_shards=1",
         f"--max_seq_length={S}", "--max_predictions_per_seq=5", "--num_examples_to_print=0")

    def options(data, name):
        return PretrainingOptions(
            input_file=f"{data}-*.tfrecord", output_dir=str(tmp / name),
            init_checkpoint=pipeline["run"], max_seq_length=S, max_predictions_per_seq=5,
            train_batch_size=4, num_train_steps=2, num_warmup_steps=0,
            save_checkpoints_steps=2, verbose=0, autotune=False)

    with pytest.raises(PretrainingError, match=r"the data was tokenized with do_lower_case=True, "
                                               r"strip_accents=True, .* but --init_checkpoint "
                                               r".*'s model with do_lower_case=True, "
                                               r"strip_accents=False"):
        train(options(default, "refused"))
    assert not os.path.exists(tmp / "refused")
    train(options(tmp / "data" / "train", "continued"))
    encoder = tmp / "continued" / "encoder"
    saved = json.load(open(encoder / "tokenizer_config.json"))
    assert saved["do_lower_case"] is True and saved["strip_accents"] is False
    assert (encoder / "vocab.txt").read_bytes() == open(pipeline["vocab"], "rb").read()


def _common(output_dir, init_checkpoint, **overrides):
    values = dict(init_checkpoint=init_checkpoint, output_dir=str(output_dir), do_train=True,
                  do_eval=True, do_predict=True, max_seq_length=S, train_batch_size=4,
                  eval_batch_size=8, learning_rate=1e-3, num_train_epochs=1.0, seed=3)
    values.update(overrides)
    return values


@pytest.mark.integration  # ~23 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_kornli_and_korsts_fine_tune_the_korean_model_by_task_name(pipeline, reference, spy):
    """Kakao Brain's KorNLI and KorSTS by --task_name, from the KorNLUDatasets repository's
    own layout (tests/testdata/glue/KorNLUDatasets), and NSMC, on the Korean model: every
    text is tokenized as the reference tokenizes it, and both labelled test sets of
    KorNLU are scored."""
    import csv

    root = os.path.join(TESTDATA, "glue", "KorNLUDatasets")
    tmp = pipeline["tmp"]
    nli = run_classifier.run(task_name="KorNLI", data_dir=root,
                             **_common(tmp / "kornli", pipeline["run"]))
    assert nli["train"]["num_examples"] == 5  # MNLI's 3 rows + SNLI's 2 with a gold label
    assert nli["eval"]["num_examples"] == 2 and nli["predict"]["num_examples"] == 2
    assert "accuracy" in nli["predict"]  # XNLI's Korean test set is labelled
    predicted = [json.loads(line) for line in open(tmp / "kornli" / "predictions.jsonl")]
    assert [p["where"].rsplit(os.sep, 1)[-1] for p in predicted] == [
        "xnli.test.ko.tsv:2", "xnli.test.ko.tsv:3"]
    sts = run_regressor.run(task_name="korsts", data_dir=root,
                            **_common(tmp / "korsts", pipeline["run"]))
    assert sts["train"]["num_examples"] == 3 and sts["eval"]["num_examples"] == 2
    assert set(sts["predict"]) >= {"pearson", "spearman", "mse"}
    gold = [float(row["score"]) for row in csv.DictReader(
        open(os.path.join(root, "KorSTS", "sts-test.tsv"), encoding="utf-8"), delimiter="\t",
        quoting=csv.QUOTE_NONE)]
    scores = [json.loads(line)["score"] for line in open(tmp / "korsts" / "predictions.jsonl")]
    assert sts["predict"]["mse"] == pytest.approx(np.mean((np.subtract(scores, gold)) ** 2),
                                                  rel=1e-4)
    nsmc = run_classifier.run(task_name="nsmc", data_dir=os.path.join(TESTDATA, "glue", "nsmc"),
                              **_common(tmp / "nsmc", pipeline["run"]))
    assert nsmc["train"]["num_examples"] == 4 and nsmc["eval"]["num_examples"] == 2
    assert _assert_matches_reference(spy, reference) >= 2 * (7 + 6) + 4 + 2
    for name in ("kornli", "korsts"):
        saved = json.load(open(tmp / name / "tokenizer_config.json"))
        assert saved["strip_accents"] is False, name


@pytest.mark.integration  # three tasks fine-tuned: ~30 s on 2 cores (the default suite's time)
def test_klue_tasks_fine_tune_the_korean_model(pipeline, reference, spy):
    """KLUE's NLI, STS, YNAT and NER by --task_name from klue_benchmark/'s layout, and
    KLUE-MRC through run_squad (its question ids are "guid"s), on the Korean model:
    tokenized as the reference, predictions keyed by KLUE's guids, KLUE-STS scored with its
    F1, KLUE-NER with its entity and character macro F1, KLUE-MRC with its EM and
    ROUGE-W."""
    from bert_keras.finetuning.regression import KLUE_STS_THRESHOLD, f1_at

    klue = os.path.join(TESTDATA, "glue", "klue_benchmark")
    tmp = pipeline["tmp"]
    for task, tool in (("klue-nli", run_classifier), ("ynat", run_classifier),
                       ("klue-re", run_classifier), ("klue-sts", run_regressor)):
        results = tool.run(task_name=task, data_dir=klue, **_common(tmp / task, pipeline["run"]))
        dev = json.load(open(os.path.join(klue, _KLUE_DIRS[task], f"{_KLUE_DIRS[task]}_dev.json"),
                             encoding="utf-8"))
        predicted = [json.loads(line) for line in open(tmp / task / "predictions.jsonl")]
        assert [p["id"] for p in predicted] == [row["guid"] for row in dev], task
        assert results["predict"]["num_examples"] == results["eval"]["num_examples"] == len(dev)
        if task == "klue-re":  # KLUE's two scores, from the predictions' probabilities
            from bert_keras.finetuning.classification import (average_precision_area,
                                                              relation_micro_f1)
            from data_prep.glue import KLUE_RE_LABELS

            gold = [KLUE_RE_LABELS.index(row["label"]) for row in dev]
            probabilities = np.array([[p["probabilities"][label] for label in KLUE_RE_LABELS]
                                      for p in predicted])
            labels = [KLUE_RE_LABELS.index(p["label"]) for p in predicted]
            assert results["eval"]["relation_micro_f1"] == relation_micro_f1(gold, labels, 0)
            # The file's probabilities have 6 digits: rounding ties some of the 4 scores.
            assert results["eval"]["auprc"] == pytest.approx(
                average_precision_area(gold, probabilities), abs=0.02)
    gold = [row["labels"]["real-label"] for row in dev]
    assert results["eval"]["f1"] == f1_at(gold, [p["score"] for p in predicted],
                                          KLUE_STS_THRESHOLD)
    results = run_tagger.run(task_name="klue-ner", data_dir=klue,
                             **_common(tmp / "klue-ner", pipeline["run"]))
    ner_dev = [line.split("\t")[0].split()[1] for line in open(
        os.path.join(klue, "klue-ner-v1.1", "klue-ner-v1.1_dev.tsv"), encoding="utf-8")
        if line.startswith("## ")]
    assert [line.split("\t")[0].split()[1] for line in open(
        tmp / "klue-ner" / "predictions.tsv", encoding="utf-8") if line.startswith("## ")] == ner_dev
    assert {"entity_macro_f1", "char_macro_f1"} <= set(results["eval"])
    results = run_squad.run(task_name="klue-mrc", data_dir=klue, doc_stride=8,
                            max_query_length=8, **_common(tmp / "klue-mrc", pipeline["run"]))
    mrc_dev = json.load(open(os.path.join(klue, "klue-mrc-v1.1", "klue-mrc-v1.1_dev.json"),
                             encoding="utf-8"))
    guids = [qa["guid"] for article in mrc_dev["data"] for paragraph in article["paragraphs"]
             for qa in paragraph["qas"]]
    answers = json.load(open(tmp / "klue-mrc" / "predictions.json", encoding="utf-8"))
    assert sorted(answers) == guids and os.path.isfile(tmp / "klue-mrc" / "null_odds.json")
    assert results["train"]["num_examples"] >= 3
    # Scored by KLUE's metric (EM and ROUGE-W, by question type), not SQuAD's.
    assert "f1" not in results["eval"] and results["eval"]["total"] == 5
    assert [results["eval"][f"type{t}_total"] for t in (1, 2, 3)] == [2, 2, 1]
    # KLUE-NER's sentences (12 + 5) are tokenized whole.
    assert _assert_matches_reference(spy, reference) >= 2 * (4 + 5 + 3 + 8) + 12 + 5 + 2 * 3


_KLUE_DIRS = {"klue-nli": "klue-nli-v1.1", "ynat": "ynat-v1.1", "klue-sts": "klue-sts-v1.1",
              "klue-re": "klue-re-v1.1"}


# With the next test, which exports its classifier: both in the integration run.
@pytest.mark.integration
def test_fine_tuning_tools_tokenize_like_the_reference(pipeline, reference, spy):
    tmp, lines = pipeline["tmp"], pipeline["lines"]
    # Classification: Korean sentences, labelled by whether they mention a city.
    rows = [{"text": t, "label": "city" if "도시" in t or "서울" in t else "other"}
            for t in lines + EXTRA]
    cls_file = tmp / "cls.jsonl"
    cls_file.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                        encoding="utf-8")
    classifier_dir = tmp / "classifier"
    run_classifier.run(train_file=str(cls_file), eval_file=str(cls_file),
                       predict_file=str(cls_file), **_common(classifier_dir, pipeline["run"]))
    # Tagging: one word a line, place names tagged.
    conll = tmp / "tags.conll"
    conll.write_text("\n".join("".join(f"{w} {'B-LOC' if w[:2] in ('서울', '부산') else 'O'}\n"
                                       for w in t.split()) for t in lines[:20]),
                     encoding="utf-8")
    run_tagger.run(train_file=str(conll), eval_file=str(conll), predict_file=str(conll),
                   **_common(tmp / "tagger", pipeline["run"]))
    # Span QA: the answer is a word of the context.
    squad = {"version": "1.1", "data": [{"title": "ko", "paragraphs": [
        {"context": t, "qas": [{"id": f"q{i}", "question": "무엇입니까?",
                                "answers": [{"text": t.split()[1], "answer_start": t.index(t.split()[1])}]}]}
        for i, t in enumerate(lines[:12])]}]}
    squad_file = tmp / "squad.json"
    squad_file.write_text(json.dumps(squad, ensure_ascii=False), encoding="utf-8")
    run_squad.run(train_file=str(squad_file), predict_file=str(squad_file), doc_stride=8,
                  max_query_length=8, **_common(tmp / "squad", pipeline["run"]))
    # Features of the pretrained encoder.
    text = tmp / "features.txt"
    text.write_text("\n".join(lines[:6] + [f"{lines[0]} ||| {lines[1]}"]) + "\n", encoding="utf-8")
    extract_features.run(str(text), str(tmp / "features.jsonl"), pipeline["run"], layers=["-1"],
                         max_seq_length=S)
    assert _assert_matches_reference(spy, reference) > 200
    # The fine-tuned model directories carry the settings on.
    for name in ("classifier", "tagger", "squad"):
        saved = json.load(open(tmp / name / "tokenizer_config.json"))
        assert saved["strip_accents"] is False, name
    pipeline["classifier"] = str(classifier_dir)


_PROBE = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the text ops; stock TF Serving links them)
pre = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
cls = tf.saved_model.load(sys.argv[2]).signatures["serving_default"]
texts = tf.constant(json.loads(sys.argv[3]))
ids = pre(text=texts)
out = cls(text=texts)
assert not [m for m in sys.modules if m.split(".")[0] in ("bert_keras", "data_prep", "export")]
json.dump({"input_word_ids": ids["input_word_ids"].numpy().tolist(),
           "input_mask": ids["input_mask"].numpy().tolist(),
           "logits": out["logits"].numpy().tolist()}, sys.stdout)
"""


@pytest.mark.integration  # Three exports and a fresh process: about 2 min on 2 cores.
def test_exports_tokenize_like_the_reference_in_a_fresh_process(pipeline, reference):
    if "classifier" not in pipeline:
        pytest.skip("needs the fine-tuned classifier of the previous test")
    tmp, lines = pipeline["tmp"], pipeline["lines"]
    encoder_dir = os.path.join(pipeline["run"], "encoder")
    pre = _cli("export.export_preprocessor", f"--vocab_file={encoder_dir}/vocab.txt",
               f"--seq_length={S}", f"--export_dir={tmp / 'models' / 'preprocess'}").stdout.split()[-1]
    cls = _cli("export.export_classifier", f"--model_dir={pipeline['classifier']}",
               f"--max_seq_length={S}", f"--export_dir={tmp / 'models' / 'classifier'}"
               ).stdout.split()[-1]
    texts = lines[:8] + EXTRA
    probe = tmp / "probe.py"
    probe.write_text(_PROBE)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, str(probe), pre, cls, json.dumps(texts)], cwd=tmp,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = json.loads(proc.stdout)
    # The reference's ids, packed as "[CLS] text [SEP]" and padded.
    vocab = reference.get_vocab()
    expected = np.zeros((len(texts), S), np.int32)
    for row, text in enumerate(texts):
        ids = [vocab["[CLS]"], *reference.convert_tokens_to_ids(reference.tokenize(text))[:S - 2],
               vocab["[SEP]"]]
        expected[row, :len(ids)] = ids
    np.testing.assert_array_equal(served["input_word_ids"], expected)
    # The classifier export: its logits equal the Keras classifier's on the reference's ids.
    model = model_loading.load_checkpoint(pipeline["classifier"]).model
    mask = (expected != 0).astype(np.int32)
    keras_logits = model({"input_word_ids": expected, "input_mask": mask,
                          "input_type_ids": np.zeros_like(expected)})["logits"]
    np.testing.assert_allclose(served["logits"], np.asarray(keras_logits), atol=1e-4, rtol=1e-4)
