"""A transformers user's commands and files: the example scripts' flags (run_glue.py,
run_ner.py, run_qa.py and their TrainingArguments) where they mean one of ours, refused in
one line where they would mean something else; their data files.

The flag tests run each tool's real main (`cli_harness.run_tool`: absl parsing and the
error boundary) with `runner.run` replaced by a recorder, so they check what the command
line becomes without training: the same values as the command written with our flags.
"""

import json

import numpy as np
import pytest

from bert_keras.finetuning import runner
from bert_keras.finetuning.tagging import TaggerOptions
from cli_harness import run_tool
from data_prep import tagging
from data_prep.classification import DataError


@pytest.fixture
def recorded(monkeypatch):
    """The values each tool's main hands `runner.run` (nothing is trained)."""
    calls = []
    monkeypatch.setattr(runner, "run", lambda task, values: calls.append(dict(values)) or {})
    return calls


def values_of(recorded, tool, argv):
    recorded.clear()
    result = run_tool(tool, argv.split())
    assert result.code == 0 and not result.error_lines, result.stderr
    assert len(recorded) == 1
    return recorded[0]


BASE = "--output_dir=/tmp/never-written --do_train --do_eval --do_predict"


@pytest.mark.parametrize("tool,theirs,ours", [
    ("run_classifier",
     "--model_name_or_path={d} --train_file=t.csv --validation_file=v.csv --test_file=p.csv "
     "--per_device_train_batch_size=3 --per_device_eval_batch_size=5 --overwrite_output_dir "
     "--warmup_ratio=0.25 --text_column_name=sentence1 --label_column_name=gold "
     "--weight_decay=0.01 --gradient_accumulation_steps=4 --warmup_steps=0 --learning_rate=2e-5 "
     "--num_train_epochs=4 --max_seq_length=61 --seed=42",
     "--init_checkpoint={d} --train_file=t.csv --eval_file=v.csv --predict_file=p.csv "
     "--train_batch_size=3 --eval_batch_size=5 --overwrite_output --warmup_proportion=0.25 "
     "--text_a_column=sentence1 --label_column=gold --learning_rate=2e-5 --num_train_epochs=4 "
     "--max_seq_length=61 --seed=42 --gradient_accumulation_steps=4"),
    ("run_regressor",
     "--model_name_or_path={d} --train_file=t.json --validation_file=v.json "
     "--label_column_name=score --per_device_train_batch_size=7",
     "--init_checkpoint={d} --train_file=t.json --eval_file=v.json --label_column=score "
     "--train_batch_size=7"),
    ("run_tagger",
     "--model_name_or_path={d} --train_file=t.json --validation_file=v.json --test_file=p.json "
     "--per_device_train_batch_size=6 --warmup_ratio=0",
     "--init_checkpoint={d} --train_file=t.json --eval_file=v.json --predict_file=p.json "
     "--train_batch_size=6 --warmup_proportion=0"),
    # run_squad scores the --predict_file it predicts: run_qa's --validation_file.
    ("run_squad",
     "--model_name_or_path={d} --train_file=t.json --validation_file=v.json "
     "--per_device_train_batch_size=12 --per_device_eval_batch_size=9 "
     "--version_2_with_negative --max_answer_length=17 --n_best_size=11",
     "--init_checkpoint={d} --train_file=t.json --predict_file=v.json --train_batch_size=12 "
     "--eval_batch_size=9 --version_2_with_negative --max_answer_length=17 --n_best_size=11"),
])
def test_transformers_flags_give_the_values_of_ours(recorded, tmp_path, tool, theirs, ours):
    d = str(tmp_path)  # --model_name_or_path must name something on disk
    got = values_of(recorded, tool, f"{BASE} {theirs.format(d=d)}")
    want = values_of(recorded, tool, f"{BASE} {ours.format(d=d)}")
    assert got == want


@pytest.mark.parametrize("tool", ["run_classifier", "run_regressor", "run_tagger", "run_squad"])
def test_gradient_accumulation_steps_is_ours_with_transformers_meaning(recorded, tool):
    """transformers' --gradient_accumulation_steps is a flag of every fine-tuning tool (the
    micro-batches of --train_batch_size averaged into one update), not a refused alias."""
    got = values_of(recorded, tool, f"{BASE} --train_file=t.json --train_batch_size=5 "
                                    "--gradient_accumulation_steps=3")
    assert got["gradient_accumulation_steps"] == 3 and got["train_batch_size"] == 5
    assert values_of(recorded, tool, f"{BASE} --train_file=t.json")[
        "gradient_accumulation_steps"] == 1


@pytest.mark.parametrize("tool,flags,says", [
    # What would train otherwise than transformers trains: refused, the difference named.
    ("run_classifier", "--warmup_steps=100", "--warmup_steps=100: not taken (warmup is a "
     "fraction of the training steps here"),
    ("run_classifier", "--weight_decay=0.0", "--weight_decay=0.0: not taken (the tools train "
     "with AdamW's decay at 0.01"),
    ("run_squad", "--per_device_train_batch_size=8 --distribution_strategy=mirrored",
     "--per_device_train_batch_size=8: with --distribution_strategy=mirrored "
     "--train_batch_size is the global batch"),
    # One flag given twice under two names, at two values.
    ("run_classifier", "--per_device_train_batch_size=8 --train_batch_size=16",
     "--per_device_train_batch_size=8 and --train_batch_size=16: --per_device_train_batch_size "
     "is transformers' name for --train_batch_size; give one"),
    ("run_squad", "--validation_file=v.json --test_file=t.json",
     "both are --predict_file here; give one"),
    # A Hub name: nothing is downloaded.
    ("run_regressor", "--model_name_or_path=bert-base-uncased",
     "--model_name_or_path=bert-base-uncased: no such directory or checkpoint; nothing is "
     "downloaded from the Hugging Face Hub"),
])
def test_transformers_flags_that_would_mean_otherwise_are_refused(recorded, tool, flags, says):
    result = run_tool(tool, f"{BASE} --train_file=t.json {flags}".split())
    assert result.code == 1 and len(result.error_lines) == 1, result.stderr
    assert says in result.error_lines[0]
    assert not recorded  # refused before anything ran


# --- run_ner.py's data: JSON lines of words and tags, read by run_tagger. ---

TAGS = ["O", "B-PER", "I-PER"]  # a ClassLabel's names: ids 0, 1, 2


def ner_sentences(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.integers(2, 8)):
            if rng.random() < 0.3:
                words += ["John", "Smith"]
                tags += ["B-PER", "I-PER"]
            else:
                words.append(str(rng.choice(["went", "to", "the", "store", "running"])))
                tags.append("O")
        out.append((words, tags))
    return out


def write_ner_json(path, sentences, ids=False, keys=("tokens", "ner_tags"), tags=True):
    """As `datasets` writes a NER split to JSON: one object per line (ids: ClassLabel ids)."""
    with open(path, "w", encoding="utf-8") as f:
        for i, (words, names) in enumerate(sentences):
            record = {"id": str(i), keys[0]: words}
            if tags:
                record[keys[1]] = [TAGS.index(t) for t in names] if ids else names
            f.write(json.dumps(record) + "\n")
    return str(path)


def write_ner_conll(path, sentences):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join("".join(f"{w} {t}\n" for w, t in zip(*s)) + "\n" for s in sentences))
    return str(path)


def test_run_ner_json_lines_read_as_the_same_sentences_as_conll(tmp_path):
    """Before, a .json file was read as CoNLL: an unlabelled one silently became one
    sentence whose "words" were the JSON lines. Names, ClassLabel ids (named by the label
    list) and other keys read as the CoNLL file of the same sentences reads."""
    sentences = ner_sentences(5, 0)
    conll = tagging.read_conll(write_ner_conll(tmp_path / "a.conll", sentences))
    want = [(s.words, s.tags) for s in conll]
    for name, kwargs, read in [
            ("names.json", {}, {}),
            ("ids.jsonl", {"ids": True}, {"tag_names": TAGS}),
            ("keys.json", {"keys": ("words", "labels")}, {"words_key": "words",
                                                          "tags_key": "labels"})]:
        path = write_ner_json(tmp_path / name, sentences, **kwargs)
        got = tagging.read_json_lines(path, **read)
        assert [(s.words, s.tags) for s in got] == want
        assert got[2].where == f"{path}:3"
    unlabelled = tagging.read_json_lines(write_ner_json(tmp_path / "p.json", sentences,
                                                        tags=False), has_tags=False)
    assert [s.words for s in unlabelled] == [s.words for s in conll]


@pytest.mark.parametrize("line,kwargs,says", [
    ('{"tokens": ["John", "went"], "ner_tags": [1, 0]}', {},
     "holds tag ids (1, ...); name them with --label_list_file"),
    ('{"tokens": ["John", "went"], "ner_tags": [1, 3]}', {"tag_names": TAGS},
     "tag id 3 is not one of the 3 tags of --label_list_file"),
    ('{"tokens": ["John", "went"], "ner_tags": ["B-PER"]}', {},
     "2 'tokens' but 1 'ner_tags'; expected one tag per word"),
    ('{"words": ["John"], "ner_tags": ["O"]}', {}, "missing key 'tokens' (keys present: "
     "['ner_tags', 'words'])"),
    ('{"tokens": "John went", "ner_tags": ["O"]}', {}, "'tokens': expected a list of words"),
    ('{"tokens": ["John"], "ner_tags": ["O", 0]}', {}, "mixes tag names and ids"),
    ('{"tokens": [], "ner_tags": []}', {}, "'tokens' is an empty list"),
    ('["John", "O"]', {}, "expected a JSON object per line, got list"),
])
def test_run_ner_json_lines_that_do_not_fit_are_refused_naming_the_line(tmp_path, line,
                                                                          kwargs, says):
    path = tmp_path / "train.json"
    path.write_text('{"tokens": ["ok"], "ner_tags": ["O"]}\n' + line + "\n")
    with pytest.raises(DataError) as e:
        tagging.read_json_lines(str(path), **kwargs)
    assert str(e.value).startswith(f"{path}:2: ") and says in str(e.value)


def test_conll_column_flags_with_a_json_file_are_refused(tmp_path):
    """--tag_column names a CoNLL column: with run_ner's JSON it would be silently unused."""
    from bert_keras import run_tagger

    with pytest.raises(runner.FinetuneError, match=r"--tag_column: .*train\.json is read as "
                       r"transformers' run_ner\.py JSON lines"):
        run_tagger.TASK.validate(runner.FinetuneOptions(output_dir=str(tmp_path), do_train=True,
                                                        max_seq_length=16),
                                 run_tagger.TASK.with_defaults(
                                     runner.FinetuneOptions(max_seq_length=16),
                                     TaggerOptions(train_file=str(tmp_path / "train.json"),
                                                   tag_column=1)))


@pytest.mark.integration
def test_run_tagger_on_run_ner_json_files_trains_as_on_conll(tmp_path):
    """run_ner's files (ClassLabel ids with --label_list_file; an unlabelled test file)
    fine-tune, score and predict exactly as the CoNLL files of the same sentences."""
    from bert_keras import BertEncoder, run_tagger
    from conftest import TESTDATA

    vocab = f"{TESTDATA}/ft_vocab.txt"
    size = sum(1 for _ in open(vocab, encoding="utf-8"))
    encoder = str(tmp_path / "encoder.keras")
    BertEncoder(vocab_size=size, num_layers=2, hidden_size=16, num_heads=2,
                intermediate_size=24, max_sequence_length=48).save(encoder)
    train, test = ner_sentences(24, 1), ner_sentences(7, 2)
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"{t}\n" for t in TAGS))
    common = dict(vocab_file=vocab, init_checkpoint=encoder, do_train=True, do_eval=True,
                  do_predict=True, max_seq_length=16, train_batch_size=4, eval_batch_size=5,
                  learning_rate=1e-3, num_train_steps=6, seed=3, label_list_file=str(labels))
    run_tagger.run(output_dir=str(tmp_path / "conll"),
                   train_file=write_ner_conll(tmp_path / "train.conll", train),
                   eval_file=write_ner_conll(tmp_path / "test.conll", test),
                   predict_file=write_ner_conll(tmp_path / "test.conll", test), **common)
    run_tagger.run(output_dir=str(tmp_path / "json"),
                   train_file=write_ner_json(tmp_path / "train.json", train, ids=True),
                   eval_file=write_ner_json(tmp_path / "test.json", test),
                   predict_file=write_ner_json(tmp_path / "predict.json", test, tags=False),
                   **common)
    timing = ("eval_seconds", "eval_examples_per_second", "made_from")
    scores = [{k: v for k, v in json.load(open(tmp_path / d / "eval_results.json")).items()
               if k not in timing} for d in ("conll", "json")]
    assert scores[0] == scores[1] and scores[0]["num_words"] == sum(len(w) for w, _ in test)
    assert (tmp_path / "json" / "predictions.conll").read_text() == \
        (tmp_path / "conll" / "predictions.conll").read_text()


# --- run_qa.py's data: the `datasets` layout, one question per object. ---

QUESTIONS = [  # (id, title, context, question, answer texts, their offsets)
    ("q1", "Paris", "John Smith lives in Paris. He was born in Lyon.", "Where does John live?",
     ["Paris"], [20]),
    ("q2", "Paris", "John Smith lives in Paris. He was born in Lyon.", "Where was he born?",
     ["Lyon", "in Lyon"], [42, 39]),
    ("q3", "서울", "서울은 한국의 수도이다. 😀 인구는 천만 명이다.", "인구는?", ["천만 명"], [20]),  # after an emoji: code points
    ("q4", "none", "Nothing to see here.", "Who won?", [], []),
]


def squad_nested(questions, v2):
    """The same questions in SQuAD's own layout (a paragraph per context)."""
    data = {}
    for qid, title, context, question, texts, starts in questions:
        qas = data.setdefault(title, {}).setdefault(context, [])
        qa = {"id": qid, "question": question,
              "answers": [{"text": t, "answer_start": a} for t, a in zip(texts, starts)]}
        if v2:
            qa["is_impossible"] = not texts
        qas.append(qa)
    return {"version": "v2.0" if v2 else "1.1", "data": [
        {"title": t, "paragraphs": [{"context": c, "qas": q} for c, q in ps.items()]}
        for t, ps in data.items()]}


def run_qa_records(questions):
    return [{"id": qid, "title": title, "context": context, "question": question,
             "answers": {"text": texts, "answer_start": starts}}
            for qid, title, context, question, texts, starts in questions]


@pytest.mark.parametrize("layout", ["jsonl", "json_lines_named_json", "data_field", "one_line"])
@pytest.mark.parametrize("v2", [False, True])
def test_run_qa_files_read_as_the_same_squad_questions(tmp_path, layout, v2):
    """run_qa.py's files (JSON lines, or {"data": [...]} read with field="data") were refused
    ("expected an object with a 'data' field" / "... 'paragraphs' field"); they read as the
    SQuAD file of the same questions, for training and prediction, a question without
    answers unanswerable in SQuAD 2.0 (run_qa's reading of it)."""
    import dataclasses

    from data_prep import squad

    questions = QUESTIONS if v2 else QUESTIONS[:3]
    if layout == "one_line":
        questions = questions[2:3]
    reference = tmp_path / "squad.json"
    reference.write_text(json.dumps(squad_nested(questions, v2)), encoding="utf-8")
    records = run_qa_records(questions)
    path = tmp_path / ("train.jsonl" if layout == "jsonl" else "train.json")
    if layout == "data_field":
        path.write_text(json.dumps({"version": "0.1.0", "data": records}), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                        encoding="utf-8")
    for training in (True, False):
        want, want_stats = squad.read_squad(str(reference), training, v2)
        got, stats = squad.read_squad(str(path), training, v2)
        assert [dataclasses.asdict(e) for e in got] == [dataclasses.asdict(e) for e in want]
        assert stats == want_stats
        assert len(got) == len(questions)
    if v2:
        assert [e.is_impossible for e in got] == [not q[4] for q in questions]


@pytest.mark.parametrize("record,v2,says", [
    ({"answers": {"text": ["Paris"], "answer_start": []}}, False,
     "train.jsonl:2.answers: 1 texts but 0 answer_start offsets"),
    ({"answers": {"text": [], "answer_start": []}}, False,
     "train.jsonl:2: question 'q2' has no answer, and training without "
     "--version_2_with_negative needs an answer"),
    ({"answers": {"text": ["Paris"], "answer_start": [99]}}, False, "train.jsonl:2.answers[0]"),
    ({"question": None}, True, "train.jsonl:2: question: expected str"),
])
def test_run_qa_records_that_do_not_fit_are_refused_naming_the_line(tmp_path, record, v2, says):
    from data_prep import squad

    good = run_qa_records(QUESTIONS[:1])[0]
    bad = dict(good, id="q2", **record)
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError) as e:
        squad.read_squad(str(path), True, v2)
    assert says in str(e.value)


# --- run_glue.py's data: csv / json lines, a float label column is regression. ---


@pytest.mark.parametrize("labels,refused", [
    ([3.8, 1.25, 0.0, 4.5], True),     # STS-B's scores, as JSON numbers
    (["0.5", "2", "5.0"], True),       # a CSV's column that datasets types float
    ([1.0, 0.0, 1.0], True),           # datasets: float64, regression
    ([0, 1, 2, 1], False),             # ints: classes, as run_glue
    (["pos", "neg", "1.5"], False),    # names
])
def test_float_label_columns_are_refused_as_classes(tmp_path, labels, refused):
    """run_glue.py trains a float label column as regression; run_classifier made one class
    per distinct score without a word."""
    from bert_keras import run_classifier
    from data_prep import classification

    path = tmp_path / "train.json"
    path.write_text("".join(json.dumps({"sentence1": f"text {i}", "label": y}) + "\n"
                            for i, y in enumerate(labels)))
    examples = classification.read_examples(str(path), "sentence1")
    if refused:
        with pytest.raises(runner.FinetuneError, match=rf"^{path}: the labels are numbers with "
                           r"fractions .*run_regressor"):
            run_classifier.TASK.labels_from(examples)
    else:
        assert run_classifier.TASK.labels_from(examples) == sorted({str(y) for y in labels})


def test_training_flags_by_transformers_names_are_said_unused_without_do_train(recorded,
                                                                                 caplog):
    """As our own training flags are: a run that trains nothing names them in a warning."""
    run_tool("run_classifier", "--output_dir=/tmp/never-written --do_eval --eval_file=e.csv "
             "--per_device_train_batch_size=4 --warmup_ratio=0.2 "
             "--per_device_eval_batch_size=3".split())
    assert len(recorded) == 1 and recorded[0]["eval_batch_size"] == 3
    said = [r.getMessage() for r in caplog.records if "not used without" in r.getMessage()]
    assert said == ["--per_device_train_batch_size, --warmup_ratio: not used without "
                    "--do_train (nothing is trained)"]
