"""python -m data_prep.create_pretraining_data: files, schema, statistics, determinism, errors.

Most tests call `main()` in this process (flags parsed by absl, restored by flagsaver);
exit codes, stderr and SIGKILL go through a real subprocess.
"""

import contextlib
import glob
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from absl.testing import flagsaver

from data_prep import create_pretraining_data as cpd
from data_prep import features, files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(ROOT, "tests", "testdata")
VOCAB = os.path.join(TESTDATA, "pretrain_vocab.txt")
CORPUS = os.path.join(TESTDATA, "pretrain_corpus.txt")


def google_reader(path, max_seq_length, max_predictions_per_seq, compression=""):
    """A reader written to Google's spec (run_pretraining.py input_fn), independent of ours."""
    name_to_features = {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    out = {k: [] for k in name_to_features}
    for record in tf.data.TFRecordDataset([path], compression_type=compression):
        example = tf.io.parse_single_example(record, name_to_features)
        for k, v in example.items():
            out[k].append(v.numpy())
    return {k: np.array(v) for k, v in out.items()}


def absl_messages(caplog, level):
    """The messages absl's logging recorded at `level` (logging.INFO, logging.WARNING)."""
    return [r.getMessage() for r in caplog.records if r.name == "absl" and r.levelno == level]


def run_cli(**flag_values):
    """Runs main() with --name=value flags, parsed as `python -m` parses them (the numeric
    rules included: a flag error is status 2); returns its exit code."""
    from data_prep import cli

    argv = ["create_pretraining_data"] + [f"--{k}={v}" for k, v in flag_values.items()]
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        try:
            cli.parse_flags(argv)
        except SystemExit as e:
            return e.code
        return cpd.main(argv[:1])


def write_generated_corpus(directory, num_docs=240, seed=0, sentences=(20, 40)):
    """A corpus whose every word names its document: d<doc>w<j>, or d<doc>p + "##a"/"##b".

    Returns (corpus path, vocab path, vocab list).
    """
    rng = np.random.default_rng(seed)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "##a", "##b"]
    for d in range(num_docs):
        vocab += [f"d{d}w{j}" for j in range(10)] + [f"d{d}p"]
    lines = []
    for d in range(num_docs):
        for _ in range(int(rng.integers(sentences[0], sentences[1] + 1))):
            words = []
            for _ in range(int(rng.integers(4, 12))):
                j = int(rng.integers(0, 12))
                words.append(f"d{d}w{j}" if j < 10 else f"d{d}p" + "ab"[j - 10])
            lines.append(" ".join(words) + " .")
        lines.append("")
    corpus = os.path.join(directory, "generated.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(lines) + "\n")
    vocab_path = os.path.join(directory, "generated_vocab.txt")
    with open(vocab_path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    return corpus, vocab_path, vocab


def final_outputs(directory):
    return sorted(p for p in os.listdir(directory) if not p.startswith("generated"))


def merge_shards(data):
    """One dict of arrays from google_reader's per-shard dicts, records in shard order."""
    return {k: np.concatenate([d[k] for d in data]) for k in data[0]}


def check_records(merged, vocab, max_predictions_per_seq):
    """Checks every record made from write_generated_corpus's corpus; returns its statistics.

    Per record: masked positions ascending, never [CLS] or a [SEP], unused slots 0;
    "[CLS] A [SEP] B [SEP]" then 0 padding, segment ids 0 up to the first [SEP] and 1 after;
    A from one document and B from one (every word names its document); NotNext B from
    another document, IsNext B from the same.

    Args:
      merged: google_reader's dict of arrays (merge_shards for several shards).
      vocab: the vocabulary list the ids index.
      max_predictions_per_seq: P, for Google's per-record masking budget.

    Returns:
      A dict: instances; masked (count) and masked_share (of the tokens that are not [CLS] or
      [SEP]); budget (the sum of Google's budgets min(P, max(1, round(0.15 * length))));
      kinds (shares of masked positions shown as [MASK], as themselves, as another token);
      not_next (share of NotNext records); mean_length; not_next_checked (NotNext records whose
      A and B documents were both seen and differ).
    """
    mask_id, cls_id, sep_id = vocab.index("[MASK]"), vocab.index("[CLS]"), vocab.index("[SEP]")
    n = len(merged["input_ids"])
    original = merged["input_ids"].copy()
    kinds = {"mask": 0, "same": 0, "random": 0}
    masked = other_doc = 0
    for i in range(n):
        length = int(merged["input_mask"][i].sum())
        k = int(merged["masked_lm_weights"][i].sum())
        pos = merged["masked_lm_positions"][i, :k]
        assert (np.diff(pos) > 0).all() and not merged["masked_lm_positions"][i, k:].any()
        shown = merged["input_ids"][i, pos]
        original[i, pos] = merged["masked_lm_ids"][i, :k]
        truth = original[i, pos]
        kinds["mask"] += int((shown == mask_id).sum())
        kinds["same"] += int((shown == truth).sum())
        kinds["random"] += int(((shown != mask_id) & (shown != truth)).sum())
        masked += k
        row = original[i, :length]
        seps = np.flatnonzero(row == sep_id)
        assert row[0] == cls_id and len(seps) == 2 and seps[1] == length - 1
        assert all(0 < q < length - 1 and q != seps[0] for q in pos)
        assert not merged["input_ids"][i, length:].any()
        assert (merged["segment_ids"][i, seps[0] + 1:length] == 1).all()
        assert not merged["segment_ids"][i, :seps[0] + 1].any()
        docs = []
        for segment in (row[1:seps[0]], row[seps[0] + 1:length - 1]):
            names = {vocab[t].split("w")[0].split("p")[0] for t in segment
                     if vocab[t].startswith("d")}
            assert len(names) <= 1
            docs.append(names)
        if docs[0] and docs[1]:
            if merged["next_sentence_labels"][i, 0] == 1:
                assert docs[0] != docs[1]
                other_doc += 1
            else:
                assert docs[0] == docs[1]
    real = int(merged["input_mask"].sum()) - 3 * n
    # Google's budget: min(P, max(1, round(0.15 * length))), length counting [CLS] and [SEP]s.
    lengths = merged["input_mask"].sum(axis=1)
    budget = np.minimum(np.minimum(max_predictions_per_seq, np.maximum(1, np.rint(lengths * 0.15))),
                        lengths - 3)
    return {"instances": n, "masked_share": masked / real, "masked": masked,
            "budget": int(budget.sum()),
            "kinds": {k: v / masked for k, v in kinds.items()},
            "not_next": float(merged["next_sentence_labels"][:, 0].mean()),
            "mean_length": float(merged["input_mask"].sum(axis=1).mean()),
            "not_next_checked": other_doc}


@pytest.mark.integration  # ~18 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_end_to_end_schema_statistics_and_sidecar(tmp_path):
    corpus, vocab_path, vocab = write_generated_corpus(str(tmp_path), num_docs=80,
                                                       sentences=(80, 120))
    out = str(tmp_path / "out" / "train")
    # Google's defaults (128, 20): the budget round(0.15 * len) counts [CLS] and two [SEP],
    # so the masked share of real tokens is 19 / 125 = 15.2% for full sequences.
    s, p = 128, 20
    assert run_cli(input_file=corpus, output_file=out, vocab_file=vocab_path, max_seq_length=s,
                   max_predictions_per_seq=p, dupe_factor=10, short_seq_prob=0.0,
                   num_output_shards=2, num_examples_to_print=2) == 0
    shards = sorted(glob.glob(out + "-*-of-00002.tfrecord"))
    assert len(shards) == 2
    names = [os.path.basename(x) for x in shards]
    assert sorted(os.listdir(tmp_path / "out")) == sorted(names + [x + ".meta.json" for x in names])
    data = [google_reader(x, s, p) for x in shards]
    meta = [features.read_sidecar(x) for x in shards]
    for d, m in zip(data, meta):
        assert m["shard"]["instances"] == len(d["input_ids"]) > 0
        assert m["max_seq_length"] == s and m["max_predictions_per_seq"] == p
        assert m["vocab_sha256"] and m["do_lower_case"] is True and m["strip_accents"] is True
        assert m["vocab_size"] == len(vocab)  # run_pretraining checks the model's table
        assert m["compression"] == "" and m["flags"]["dupe_factor"] == 10
        features.check_sidecar(m, s, p, "x")
    merged = merge_shards(data)
    n = len(merged["input_ids"])
    assert n >= 5000 and meta[0]["counts"]["instances"] == n

    stats = check_records(merged, vocab, p)
    assert abs(stats["masked_share"] - 0.15) <= 0.005
    for kind, share in (("mask", 0.8), ("same", 0.1), ("random", 0.1)):
        sd = math.sqrt(share * (1 - share) / stats["masked"])
        got = stats["kinds"][kind]
        assert abs(got - share) <= min(0.02, 4 * sd), (kind, got)
    # NotNext: the 50% coin, plus Google's rule that a one-sentence chunk (here mostly the
    # last sentence of a document pass) is always NotNext, which can only raise the share.
    nsp = stats["not_next"]
    assert 0.5 - min(0.02, 4 * math.sqrt(0.25 / n)) <= nsp <= 0.53, nsp

    # Our parser reads the same values under model names.
    parsed = features.parse_pretraining_example(
        tf.constant([r.numpy() for r in tf.data.TFRecordDataset(shards[:1]).take(3)]), s, p)
    np.testing.assert_array_equal(parsed["input_type_ids"].numpy(), data[0]["segment_ids"][:3])


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    args = dict(input_file=CORPUS, vocab_file=VOCAB, max_seq_length=32,
                max_predictions_per_seq=5, dupe_factor=3, num_examples_to_print=0)
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        out = str(tmp_path / f"{name}.tfrecord")
        assert run_cli(output_file=out, random_seed=seed, **args) == 0
    a, b, c = (open(tmp_path / f"{x}.tfrecord", "rb").read() for x in "abc")
    assert a == b and a != c and len(a) > 1000
    meta_a, meta_b = (json.load(open(tmp_path / f"{x}.tfrecord.meta.json")) for x in "ab")
    assert meta_a.pop("flags")["output_file"] != meta_b.pop("flags")["output_file"]
    assert meta_a == meta_b  # no time stamps: the sidecar is deterministic too


def test_gzip_output_whole_word_masking_and_korean_setting(tmp_path):
    for name in ("z", "y"):
        assert run_cli(input_file=CORPUS, vocab_file=VOCAB, output_file=str(tmp_path / name),
                       num_output_shards=1, gzip_compress=True, do_whole_word_mask=True,
                       strip_accents="false", max_seq_length=40, max_predictions_per_seq=6,
                       dupe_factor=2, num_examples_to_print=0) == 0
    (shard,) = glob.glob(str(tmp_path / "z-00000-of-00001.tfrecord.gz"))
    assert open(shard, "rb").read(2) == b"\x1f\x8b"
    assert open(shard, "rb").read() == open(shard.replace("/z-", "/y-"), "rb").read()
    assert features.compression_type(shard) == "GZIP"
    meta = features.read_sidecar(shard)
    assert meta["strip_accents"] is False and meta["do_lower_case"] is True
    # The sidecar's flags are the command line's: the tokenizer flags given, none other.
    assert meta["flags"]["strip_accents"] == "false" and "do_lower_case" not in meta["flags"]
    data = google_reader(shard, 40, 6, compression="GZIP")
    assert len(data["input_ids"]) > 0


def test_settings_from_the_vocabularys_tokenizer_config_are_not_recorded_as_flags(tmp_path):
    """With the casing read from tokenizer_config.json beside the vocabulary (no tokenizer
    flag), the sidecar's flags said do_lower_case true and strip_accents unset (the flags'
    defaults) while the data was made with strip_accents false: the top-level keys say
    what ran, and the flags section holds no tokenizer flag that was not given."""
    from data_prep import tokenizer_config

    vocab = tmp_path / "vocab" / "vocab.txt"
    vocab.parent.mkdir()
    vocab.write_text(open(VOCAB, encoding="utf-8").read(), encoding="utf-8")
    tokenizer_config.write_for_vocab(str(vocab), tokenizer_config.TokenizerConfig(
        do_lower_case=False, strip_accents=False))
    out = str(tmp_path / "x.tfrecord")
    assert run_cli(input_file=CORPUS, vocab_file=str(vocab), output_file=out,
                   max_seq_length=40, max_predictions_per_seq=6, dupe_factor=1,
                   num_examples_to_print=0) == 0
    meta = features.read_sidecar(out)
    assert meta["do_lower_case"] is False and meta["strip_accents"] is False
    assert not {"do_lower_case", "strip_accents", "tokenize_chinese_chars"} & set(meta["flags"])


@pytest.mark.parametrize("output_file,gzip_compress,first", [
    ("tf_examples.tfrecord", False, "tf_examples-00000-of-00002.tfrecord"),
    ("tf_examples.tfrecord.gz", True, "tf_examples-00000-of-00002.tfrecord.gz"),
    ("tf_examples.tfrecord", True, "tf_examples-00000-of-00002.tfrecord.gz"),
    ("train", False, "train-00000-of-00002.tfrecord"),
])
def test_shard_names_drop_the_suffix_of_the_output_file(output_file, gzip_compress, first):
    """Google's README names its output tf_examples.tfrecord; with --num_output_shards its
    shards were tf_examples.tfrecord-00000-of-00002.tfrecord (Beam's automatic count
    already dropped the suffix)."""
    names = cpd.output_files_from_flags(output_file, 2, gzip_compress)
    assert names[0] == first and names[1] == first.replace("00000-of", "00001-of")


def test_refuses_to_overwrite(tmp_path):
    out = str(tmp_path / "x.tfrecord")
    args = dict(input_file=CORPUS, vocab_file=VOCAB, output_file=out, max_seq_length=32,
                max_predictions_per_seq=5, dupe_factor=1, num_examples_to_print=0)
    assert run_cli(**args) == 0
    before = open(out, "rb").read()
    assert run_cli(random_seed=1, **args) == 1
    assert open(out, "rb").read() == before
    assert run_cli(random_seed=1, overwrite=True, **args) == 0
    assert open(out, "rb").read() != before


def _bad_input_case(tmp_path, name):
    """Writes the input of one bad-input case; returns (flag overrides, expected message)."""
    path = str(tmp_path / f"{name}.txt")
    if name == "missing":
        return {"input_file": str(tmp_path / "nope*.txt")}, "matches no data file"
    if name == "empty":
        open(path, "w").write("\n\n   \n\n")
        return {"input_file": path}, "no document"
    if name == "binary":
        open(path, "wb").write(bytes(range(256)) * 64)
        return {"input_file": path}, "looks binary"
    if name == "one_document":
        shutil.copy(CORPUS, path)
        text = open(path).read().replace("\n\n", "\n")
        open(path, "w").write(text)
        return {"input_file": path}, "single document"
    if name == "one_sentence_documents":
        open(path, "w").write("".join(f"the whale came up number {i} .\n\n" for i in range(30)))
        return {"input_file": path}, "single sentence"
    if name == "predictions_over_length":
        return {"input_file": CORPUS, "max_predictions_per_seq": 200}, "max_predictions_per_seq=200"
    if name == "missing_vocab":
        return {"input_file": CORPUS, "vocab_file": str(tmp_path / "no_vocab.txt")}, "vocab_file"
    if name == "vocab_directory":  # a model directory: "does not exist" before
        os.makedirs(tmp_path / "model")
        shutil.copy(VOCAB, tmp_path / "model" / "vocab.txt")
        return ({"input_file": CORPUS, "vocab_file": str(tmp_path / "model")},
                f"--vocab_file: vocabulary file '{tmp_path / 'model'}' is a directory; pass "
                f"{tmp_path / 'model' / 'vocab.txt'}")
    if name == "too_many_workers":
        return {"input_file": CORPUS, "num_workers": 3}, "num_workers=3"
    if name == "a_workers_share_of_one_document":  # the corpus has 3: enough for 1 worker
        documents = open(CORPUS).read().split("\n\n")[:3]
        open(path, "w").write("\n\n".join(documents))
        return ({"input_file": path, "num_workers": 2, "num_output_shards": 2},
                "error: worker 1 of 2: its share of the corpus (one document in 2) holds 1 "
                "document with text, and each worker needs at least 2")
    if name == "utf16":  # read as binary ("NUL byte at offset 13"), UTF-16 unnamed
        open(path, "wb").write(open(CORPUS, encoding="utf-8").read().encode("utf-16"))
        return {"input_file": path}, f"{path}:1: UTF-16 text"
    if name == "classic_mac_line_ends":  # one line to Google's reader: "single document"
        open(path, "wb").write(open(CORPUS, "rb").read().replace(b"\n", b"\r"))
        return {"input_file": path}, (f"{path}: lines end in a carriage return alone (\\r, "
                                      "classic Mac OS line ends)")
    if name == "classic_mac_long_first_line":  # judged on 64 KB without a line end: read
        # as one line by Google's reader, and refused only past 8 MB as not-a-sentence
        text = open(CORPUS, "rb").read().replace(b"\n", b" ")
        open(path, "wb").write(b" ".join([text] * (1 + 70_000 // len(text))) + b"\r" +
                               open(CORPUS, "rb").read().replace(b"\n", b"\r"))
        return {"input_file": path}, (f"{path}: lines end in a carriage return alone (\\r, "
                                      "classic Mac OS line ends)")
    if name == "cp949_after_64_kb":  # a cp949 file appended to a UTF-8 corpus: became junk
        good, lines = cp949_after_utf8(path)
        return ({"input_file": path, "num_workers": 2, "num_output_shards": 2},
                f"{path}: {lines - good} of its {lines:,} non-blank lines are not UTF-8 (the "
                f"first: line {good + good // 5 + 1}); expected UTF-8 text: convert it from the "
                "encoding it was saved in (e.g. iconv -f cp949")
    if name == "shards_in_a_slash":  # wrote out/-00000-of-00002.tfrecord
        os.makedirs(tmp_path / "out")
        return ({"input_file": CORPUS, "output_file": f"{tmp_path / 'out'}/",
                 "num_output_shards": 2},
                f"--output_file: {tmp_path / 'out'}/ ends in '/', a directory; name a file (or "
                "a prefix) in it")
    if name == "file_in_a_missing_slash":  # failed naming out/.incomplete-<pid>.
        return ({"input_file": CORPUS, "output_file": f"{tmp_path / 'out'}/"},
                f"--output_file: {tmp_path / 'out'}/ ends in '/'")
    if name == "output_is_a_directory":  # with --overwrite: refused after the whole job
        os.makedirs(tmp_path / "out" / "x.tfrecord")
        return ({"input_file": CORPUS, "overwrite": True},
                f"--output_file: {tmp_path / 'out' / 'x.tfrecord'} is a directory")
    raise ValueError(name)


@pytest.mark.parametrize("kind", ["empty.txt.gz", "blank.txt.bz2", "blank.txt", "three"])
def test_a_corpus_without_text_is_named(tmp_path, capsys, kind):
    """A compressed file of nothing (the up-front check sees its compressed bytes, not
    emptiness), or blank lines only: the line named no file ("the corpus holds no document
    with text"), where an empty plain file is named."""
    import bz2
    import gzip

    def write(name, text):
        path = tmp_path / name
        opener = gzip.open if name.endswith(".gz") else bz2.open if name.endswith(".bz2") \
            else open
        with opener(path, "wt") as f:
            f.write(text)
        return str(path)

    expected = "(expected one sentence per line, a blank line between documents)"
    if kind == "three":  # every file of the list: named up to three, then counted
        inputs = [write(f"part-{i}.txt.gz", "\n \n") for i in range(4)]
        line = (f"--input_file: its 4 files ({', '.join(inputs[:3])} and 1 more) hold no "
                f"document with text {expected}")
    else:
        inputs = [write(kind, "" if kind.startswith("empty") else "\n\n \t\n\n")]
        line = f"{inputs[0]}: no document with text in it {expected}"
    out = tmp_path / "out" / "x.tfrecord"
    assert run_cli(input_file=",".join(inputs), vocab_file=VOCAB, output_file=str(out),
                   max_seq_length=32, max_predictions_per_seq=5) == 1
    err = capsys.readouterr().err
    assert [l for l in err.splitlines() if l.startswith("error:")] == [f"error: {line}"], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("documents, workers", [(0, 2), (1, 1), (1, 2)])
def test_fewer_than_two_documents_is_one_line_naming_the_file_whatever_the_workers(
        tmp_path, capsys, documents, workers):
    """With several workers each one's share failed ("holds 0 documents ... use fewer
    --num_workers", no file named), advice that cannot help: the corpus itself is short. A
    single document (no blank line) named no file either. Google's tool would write no
    instance from an empty corpus, and for a single one draw its "random" NotNext segments
    from the document itself (10 tries at another, then it takes the same one)."""
    path = tmp_path / "corpus.txt"
    path.write_text("\n \n\n" if documents == 0 else
                    "the whale came up .\nit was large .\nthe ship sailed on .\n")
    expected = ("no document with text in it (expected one sentence per line, a blank line "
                "between documents)" if documents == 0 else
                "a single document (no blank line in it); NotNext segments come from another "
                "document, so at least 2 are needed (expected one sentence per line, a blank "
                "line between documents)")
    out = tmp_path / "out" / "x.tfrecord"
    assert run_cli(input_file=str(path), vocab_file=VOCAB, output_file=str(out),
                   max_seq_length=32, max_predictions_per_seq=5, num_workers=workers,
                   num_output_shards=2) == 1
    err = capsys.readouterr().err
    assert [l for l in err.splitlines() if l.startswith("error:")] == [
        f"error: {path}: {expected}"], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("place", ["under_a_file", "unwritable"])
def test_a_shard_that_cannot_be_opened_is_named_once_by_its_final_name(tmp_path, capsys,
                                                                         monkeypatch, place):
    """The checks before the work find an unwritable place; one that became unwritable
    after them (made so here by skipping them) fails where the worker opens its shard. Its
    line named the temporary twice ("cannot write <dir>/.incomplete-<pid>.x.tfrecord:
    <dir>/.incomplete-<pid>.x.tfrecord; Permission denied"); now the shard once, as every
    write failure names its output."""
    from read_only import unwritable_directory

    monkeypatch.setattr(cpd, "check_outputs", lambda spec: [])
    if place == "under_a_file":
        (tmp_path / "afile").write_text("keep")
        out = tmp_path / "afile" / "x.tfrecord"
        why = f"{tmp_path / 'afile'} is a file, not a directory"
        context = contextlib.nullcontext()
    else:
        (tmp_path / "ro").mkdir()
        out = tmp_path / "ro" / "x.tfrecord"
        why = "permission denied (its directory is not writable)"
        context = unwritable_directory(tmp_path / "ro")
    with context:
        code = run_cli(input_file=CORPUS, vocab_file=VOCAB, output_file=str(out),
                       max_seq_length=32, max_predictions_per_seq=5, num_examples_to_print=0)
    assert code == 1
    err = capsys.readouterr().err
    assert [l for l in err.splitlines() if l.startswith("error:")] == [
        f"error: {out}: cannot be written: {why}; write elsewhere"], err
    assert sorted(os.listdir(tmp_path)) == ["afile" if place == "under_a_file" else "ro"]


def test_a_shard_open_failure_in_a_writable_place_says_tensorflows_reason():
    """Where the place probes writable (a full disk; a race), the reason is TensorFlow's,
    the temporary's name dropped."""
    temp = os.path.join(ROOT, files.temp_path("x-00001-of-00002.tfrecord", pid=7))
    final = os.path.join(ROOT, "x-00001-of-00002.tfrecord")
    for error, why in (
            (tf.errors.ResourceExhaustedError(None, None, f"{temp}; No space left on device"),
             "no space left on its device; free some space, or write elsewhere"),
            (tf.errors.NotFoundError(None, None, f"{temp}; No such file or directory"),
             "no such file or directory; write elsewhere")):
        e = cpd._shard_open_failure(error, temp, final)
        assert (e.filename, e.strerror) == (final, f"cannot be written: {why}")


def _is_utf8(raw):
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def cp949_after_utf8(path, encoding="cp949"):
    """Writes documents of 5 sentences: English (UTF-8) past the first 64 KB the up-front
    check reads, then Korean in `encoding`; returns (English lines, all non-blank lines)."""
    english = "the whale came up from the deep water at {} and the ship turned ."
    korean = open(os.path.join(TESTDATA, "korean_sample.txt"), encoding="utf-8").read()
    korean = [line.encode(encoding, errors="ignore") for line in korean.splitlines()]
    good = 1500  # about 100 KB
    rows = [english.format(i).encode() for i in range(good)]
    rows += [line for line in korean if line.strip() and not _is_utf8(line)]
    with open(path, "wb") as f:
        f.write(b"".join(row + (b"\n\n" if i % 5 == 4 else b"\n") for i, row in enumerate(rows)))
    return good, len(rows)


@pytest.mark.parametrize("case", ["missing", "empty", "binary", "one_document",
                                  "one_sentence_documents", "predictions_over_length",
                                  "missing_vocab", "vocab_directory", "too_many_workers",
                                  "a_workers_share_of_one_document", "output_is_a_directory",
                                  "utf16", "classic_mac_line_ends", "classic_mac_long_first_line",
                                  "cp949_after_64_kb",
                                  "shards_in_a_slash",
                                  "file_in_a_missing_slash"])
def test_bad_input_gives_a_message_and_no_output(tmp_path, capsys, case):
    overrides, expected = _bad_input_case(tmp_path, case)
    out_dir = tmp_path / "out"
    args = dict(vocab_file=VOCAB, output_file=str(out_dir / "x.tfrecord"), max_seq_length=32,
                max_predictions_per_seq=5, dupe_factor=1, num_examples_to_print=0)
    args.update(overrides)
    assert run_cli(**args) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], err
    assert "Traceback" not in err
    # not even a temporary file
    assert not out_dir.exists() or os.listdir(out_dir) in ([], ["x.tfrecord"])


def test_long_lines_are_accepted_with_a_warning(tmp_path, caplog):
    path = str(tmp_path / "long.txt")
    text = open(CORPUS).read()
    long_line = " ".join(["the whale came up from the deep water ."] * 26_000)  # ~1 MB
    open(path, "w").write(text.replace("Call me Ishmael.", long_line))
    out = str(tmp_path / "x.tfrecord")
    caplog.set_level(logging.INFO)
    assert run_cli(input_file=path, vocab_file=VOCAB, output_file=out, max_seq_length=32,
                   max_predictions_per_seq=5, dupe_factor=1, num_examples_to_print=0) == 0
    logged = absl_messages(caplog, logging.WARNING)
    warning = [m for m in logged if "longer than" in m]
    assert warning and "long.txt:1 (" in warning[0], logged
    data = google_reader(out, 32, 5)
    assert len(data["input_ids"]) > 0 and data["input_mask"].sum(axis=1).max() <= 32


def stray_byte_corpus(tmp_path):
    """300 sentences in documents of 5, one byte that is not UTF-8 on line 9."""
    text = "".join(f"sentence {i} of the whale .\n" + ("\n" if i % 5 == 4 else "")
                   for i in range(300))
    path = tmp_path / "stray.txt"
    path.write_bytes(text.encode().replace(b"sentence 7 of", b"sentence 7 \xff of"))
    return path


def test_a_stray_byte_that_is_not_utf8_is_dropped_with_a_warning_naming_its_line(
        tmp_path, caplog):
    """As Google's reader drops it (decode with errors="ignore"); the warning named no file
    or line before. One bad line in 300 is under the share that refuses a file.

    The warning is logged at WARNING, the progress and summary at INFO: the warnings were
    INFO lines starting "warning: ", hidden by --verbosity=-1 / --stderrthreshold=warning
    and filed as INFO by log collectors."""
    path = stray_byte_corpus(tmp_path)
    caplog.set_level(logging.INFO)
    out = str(tmp_path / "x.tfrecord")
    # verbosity=0, as absl's app.run sets when no --verbosity is given (parsing FLAGS alone
    # leaves absl's logger at WARNING).
    assert run_cli(input_file=str(path), vocab_file=VOCAB, output_file=out, max_seq_length=32,
                   max_predictions_per_seq=5, dupe_factor=1, num_examples_to_print=0,
                   verbosity=0) == 0
    warnings = [m for m in absl_messages(caplog, logging.WARNING) if "not UTF-8" in m]
    assert warnings == ["1 line(s) had bytes that are not UTF-8, which were dropped "
                        f"(first at {path}:9)"], caplog.text
    info = absl_messages(caplog, logging.INFO)
    assert [m for m in info if m.startswith("wrote ")] and \
        [m for m in info if m.startswith("timing: ")], caplog.text
    assert not [m for m in info if "not UTF-8" in m or m.startswith("warning")], caplog.text
    assert features.read_sidecar(out)["counts"]["documents"] == 60


def _subprocess_env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    return env


@pytest.mark.integration  # The tool in fresh processes: about 18 s on 2 cores.
def test_command_line_exit_code_and_sigkill(tmp_path):
    cmd = [sys.executable, "-m", "data_prep.create_pretraining_data", f"--vocab_file={VOCAB}",
           "--max_seq_length=32", "--max_predictions_per_seq=5", "--num_examples_to_print=0"]
    # A clear message and exit code 1 for a missing input.
    proc = subprocess.run(cmd + [f"--input_file={tmp_path}/missing.txt",
                                 f"--output_file={tmp_path}/x.tfrecord"],
                          capture_output=True, text=True, env=_subprocess_env(), cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "matches no data file" in proc.stderr and "Traceback" not in proc.stderr

    # SIGKILL while writing: nothing under a final name; a trainer's glob skips the leftover.
    corpus, vocab_path, _ = write_generated_corpus(str(tmp_path), num_docs=600, seed=3)
    out = tmp_path / "killed" / "x.tfrecord"
    run = cmd[:3] + [f"--vocab_file={vocab_path}", "--max_seq_length=32",
                     "--max_predictions_per_seq=5", "--num_examples_to_print=0",
                     f"--input_file={corpus}", f"--output_file={out}", "--dupe_factor=200",
                     "--shuffle_buffer_size=10"]
    child = subprocess.Popen(run, env=_subprocess_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    temp = files.temp_path(str(out), pid=child.pid)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None:
            if os.path.exists(temp) and os.path.getsize(temp) > 100_000:
                break
            time.sleep(0.2)
        assert child.poll() is None, "the run ended before it could be killed"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert not out.exists() and not os.path.exists(features.sidecar_path(str(out)))
    assert os.path.getsize(temp) > 100_000  # the partial shard sits under its temporary name,
    with pytest.raises(ValueError, match="matches no data file"):
        features.expand_input_files(str(out.parent / "*"))
    # ... and the next run to the same output removes what the killed one left behind.
    rerun = [a for a in run if not a.startswith("--dupe_factor")] + ["--dupe_factor=1"]
    proc = subprocess.run(rerun, env=_subprocess_env(), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.exists() and not os.path.exists(temp)


@pytest.mark.integration  # The tool in a fresh process: about 8 s on 2 cores.
def test_warnings_show_with_only_warnings_asked_for(tmp_path):
    """absl's --verbosity=-1 --stderrthreshold=warning (what a user sets to see only
    problems) hid the tool's warnings, which were logged at INFO. Now the warning is a W
    line, which tf_logging.python_log_message (scripts/quickstart.py) shows as "warning:
    ...", and the progress lines (INFO) are what is hidden."""
    from data_prep.tf_logging import python_log_message

    path = stray_byte_corpus(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "data_prep.create_pretraining_data", f"--vocab_file={VOCAB}",
         f"--input_file={path}", f"--output_file={tmp_path / 'x.tfrecord'}",
         "--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=1",
         "--num_examples_to_print=0", "--verbosity=-1", "--stderrthreshold=warning"],
        capture_output=True, text=True, env=_subprocess_env(), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = [python_log_message(line, {"pretraining_job.py", "create_pretraining_data.py"})
             for line in proc.stderr.splitlines()]
    shown = [m for m in shown if m]
    assert ("warning: 1 line(s) had bytes that are not UTF-8, which were dropped "
            f"(first at {path}:9)") in shown, proc.stderr[-2000:]
    # The [UNK] share (the vocabulary lacks "sentence") is the other warning; no progress.
    assert all(m.startswith("warning: ") for m in shown), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_two_workers_are_deterministic(tmp_path):
    corpus, vocab_path, _ = write_generated_corpus(str(tmp_path), num_docs=60, seed=5)
    outs = []
    for name in ("a", "b"):
        out = str(tmp_path / name / "x")
        assert run_cli(input_file=corpus, vocab_file=vocab_path, output_file=out,
                       num_output_shards=4, num_workers=2, max_seq_length=32,
                       max_predictions_per_seq=5, dupe_factor=2, num_examples_to_print=1) == 0
        outs.append(sorted(glob.glob(out + "-*.tfrecord")))
    assert len(outs[0]) == 4
    for x, y in zip(*outs):
        assert open(x, "rb").read() == open(y, "rb").read()
    meta = features.read_sidecar(outs[0][0])
    assert meta["counts"]["documents"] == 60 and meta["flags"]["num_workers"] == 2
    assert sum(features.read_sidecar(x)["shard"]["instances"] for x in outs[0]) == \
        meta["counts"]["instances"]


def _tfmodels_python():
    """Python of an environment with tf-models-official (env BERT_KERAS_TFMODELS_PYTHON)."""
    path = os.environ.get("BERT_KERAS_TFMODELS_PYTHON")
    return path if path and os.path.exists(path) else None


@pytest.mark.slow
@pytest.mark.skipif(_tfmodels_python() is None,
                    reason="set BERT_KERAS_TFMODELS_PYTHON to a python with tf-models-official")
def test_model_garden_files_parse_with_our_reader(tmp_path):
    out = str(tmp_path / "mg.tfrecord")
    proc = subprocess.run(
        [_tfmodels_python(), "-m", "official.nlp.data.create_pretraining_data",
         f"--input_file={CORPUS}", f"--output_file={out}", f"--vocab_file={VOCAB}",
         "--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=2"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert features.read_sidecar(out) is None  # Model Garden writes no sidecar
    records = [r.numpy() for r in tf.data.TFRecordDataset([out])]
    parsed = features.parse_pretraining_example(tf.constant(records), 32, 5)
    reference = google_reader(out, 32, 5)
    assert len(records) > 0
    np.testing.assert_array_equal(parsed["input_word_ids"].numpy(), reference["input_ids"])
    np.testing.assert_array_equal(parsed["input_type_ids"].numpy(), reference["segment_ids"])
    np.testing.assert_array_equal(parsed["masked_lm_weights"].numpy(),
                                  reference["masked_lm_weights"])
    assert parsed["next_sentence_labels"].dtype == tf.int32


def test_shuffle_buffer_emits_every_record_once_in_bounded_memory():
    import random

    buffer = cpd.ShuffleBuffer(50, random.Random(0))
    records = [f"r{i}".encode() for i in range(1_000)]
    out = []
    for i in range(0, 1_000, 37):
        chunk = records[i:i + 37]
        out += buffer.push(chunk)
        assert len(out) == max(0, min(i + 37, 1_000) - 50)  # exactly `size` held back
    out += buffer.drain()
    assert sorted(out) == sorted(records) and out != records
    # No record comes out before it went in (at most size + one chunk places early).
    position = {r: k for k, r in enumerate(out)}
    assert min(position[r] - i for i, r in enumerate(records)) >= -(50 + 37)


def _one_instance_batch(dynamic):
    """One hand-made instance: [CLS] the cat sat [SEP] on a mat [SEP] + 2 padding, masks at
    positions 2 ([MASK], was "cat"), 5 (random "mat", was "on") and 6 (kept "a")."""
    from data_prep import pretraining_instances as pi

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat"]
    ids = [2, 5, 6, 7, 3, 8, 9, 10, 3, 0, 0]
    masked = [2, 5, 6]
    if not dynamic:
        ids[2], ids[5] = 4, 10  # [MASK], and a random "mat"
    p = 0 if dynamic else 4
    positions = np.zeros([1, p], np.int32)
    labels = np.zeros([1, p], np.int32)
    weights = np.zeros([1, p], np.float32)
    if not dynamic:
        positions[0, :3], labels[0, :3], weights[0, :3] = masked, [6, 8, 9], 1.0
    batch = pi.InstanceBatch(
        input_ids=np.array([ids], np.int32), input_mask=np.array([[1] * 9 + [0, 0]], np.int32),
        segment_ids=np.array([[0] * 5 + [1] * 4 + [0, 0]], np.int32),
        masked_lm_positions=positions, masked_lm_ids=labels, masked_lm_weights=weights,
        next_sentence_labels=np.array([1], np.int32), a_doc_ids=np.zeros(1, np.int64),
        b_doc_ids=np.ones(1, np.int64))
    return batch, vocab


def test_example_is_logged_compactly_with_its_masking_counts():
    batch, vocab = _one_instance_batch(dynamic=False)
    (text,) = cpd._decode_examples(batch, vocab, 5)
    first, tokens, hint = text.split("\n")
    assert first == ("example instance 1: 9 WordPieces (segment A 5, B 4; B is a random "
                     "segment); masks: 3 of 6 tokens (50%): 1 [MASK], 1 random, 1 unchanged")
    assert tokens == "  [CLS] the [MASK]>cat sat [SEP] mat>on a>a mat [SEP]"
    assert "--print_full_examples" in hint
    # Google's full layout behind the flag.
    (full,) = cpd._decode_examples(batch, vocab, 1, full=True)
    assert full.splitlines() == [
        "*** Example ***", "tokens: [CLS] the [MASK] sat [SEP] mat a mat [SEP]",
        "segment_ids: 0 0 0 0 0 1 1 1 1", "is_random_next: True",
        "masked_lm_positions: 2 5 6", "masked_lm_labels: cat on a"]


def test_example_without_masks_says_so_instead_of_empty_lines():
    batch, vocab = _one_instance_batch(dynamic=True)
    (text,) = cpd._decode_examples(batch, vocab, 1, dynamic=True)
    assert "masks: none in the data (--dynamic_masking" in text
    assert "  [CLS] the cat sat [SEP] on a mat [SEP]" in text
    (full,) = cpd._decode_examples(batch, vocab, 1, full=True, dynamic=True)
    assert "masked_lm_positions: none in the data" in full
    assert "masked_lm_labels: none in the data" in full


def test_a_line_of_unicode_spaces_ends_a_document_as_in_googles_reader(tmp_path):
    """Google's reader decodes each line and strips it (str.strip), so a line holding only
    U+00A0, U+3000 or U+001C is blank: a document boundary. Ours stripped the bytes (ASCII
    whitespace only): 20 documents read as 11, and the IsNext pairs spanned documents.
    Reference: the documents str.strip() finds, written out here."""
    from data_prep import pretraining_job as job

    spaces = ["", " \t", "\u00a0", "\u3000", "\u00a0\u3000 ", "\x1c", "\u2028", "\u205f"]
    text, expected = [], []
    for d in range(20):
        lines = [f"\u00a0document {d} line {k}\u3000" for k in range(2)]
        text += lines + [spaces[d % len(spaces)]]
        expected.append([line.strip() for line in lines])
    path = tmp_path / "corpus.txt"
    path.write_bytes("\n".join(text).encode("utf-8"))
    google = [[]]
    for line in path.read_bytes().decode("utf-8").split("\n"):  # Google's loop, in short
        line = line.strip()
        if not line:
            google.append([])
        else:
            google[-1].append(line)
    google = [d for d in google if d]
    assert google == expected
    read = [doc.lines for doc in job.read_documents([str(path)])]
    assert len(read) == 20
    # Only lines beginning with one of those characters' first bytes are decoded to check.
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert job._MAYBE_SPACE == {c.encode()[0] for c in spaces if c.encode().strip()}
    assert [[line.strip() for line in doc] for doc in read] == expected


def test_carriage_returns_are_read_as_googles_reader_reads_them(tmp_path):
    """Google's reader (tf.io.gfile's readline, run here as the reference) drops every "\\r":
    "\\r\\n" ends a line as "\\n" does and "whale\\rship" reads "whaleship". Ours kept a
    "\\r" inside a line, which the tokenizer splits words at ("whale ship"); a file saved on
    Windows gives the records of the same file with "\\n" (the probe in BUILD_NOTES)."""
    from data_prep import pretraining_job as job

    raw = b"the whale\rship came .\r\nit sank .\r\n\r\nthe \r end\r\n"
    path = tmp_path / "corpus.txt"
    path.write_bytes(raw)
    google = [[]]
    with tf.io.gfile.GFile(str(path), "r") as f:
        for line in iter(f.readline, ""):
            if not line.strip():
                google.append([])
            else:
                google[-1].append(line.strip())
    assert google == [["the whaleship came .", "it sank ."], ["the  end"]]
    assert [doc.lines for doc in job.read_documents([str(path)])] == google
    lf = tmp_path / "lf.txt"
    lf.write_bytes(raw.replace(b"\r", b""))
    assert [doc.lines for doc in job.read_documents([str(lf)])] == google


def test_a_corpus_mostly_unknown_to_the_vocabulary_is_warned_about(tmp_path, caplog):
    """Korean text with the vocabulary learnt from it but its casing flags wrong (strip
    accents decomposes Hangul into jamo): every Hangul word is [UNK], and the run said
    nothing. Now the share is counted (the sidecar's counts.unknown_tokens) and a warning
    above 5% names the vocabulary and the settings; with the right settings, none."""
    from data_prep import build_vocab

    lines = open(os.path.join(TESTDATA, "korean_sample.txt"), encoding="utf-8").read().splitlines()
    corpus = tmp_path / "ko.txt"  # documents of 5 sentences
    corpus.write_text("".join(line + ("\n\n" if i % 5 == 4 else "\n")
                              for i, line in enumerate(lines)), encoding="utf-8")
    vocab = build_vocab.build_vocab([str(corpus)], 500, layout="compact", do_lower_case=True,
                                    strip_accents=False, min_frequency=1)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    caplog.set_level(logging.INFO)
    counts = {}
    for strip in ("false", "true"):
        out = str(tmp_path / strip / "x.tfrecord")
        caplog.clear()
        assert run_cli(input_file=str(corpus), vocab_file=str(vocab_file), output_file=out,
                       do_lower_case="true", strip_accents=strip, max_seq_length=32,
                       max_predictions_per_seq=5, dupe_factor=1, num_examples_to_print=0) == 0
        counts[strip] = features.read_sidecar(out)["counts"]
        logged = absl_messages(caplog, logging.WARNING)
        warnings = [m for m in logged if "are [UNK]" in m]
        if strip == "true":
            share = counts[strip]["unknown_tokens"] / counts[strip]["tokens"]
            assert share > 0.5 and len(warnings) == 1, logged  # Hangul; not digits, punctuation
            assert f"{100 * share:.1f}% of the corpus's {counts[strip]['tokens']} WordPieces " \
                   f"are [UNK]: is {vocab_file} the vocabulary" in warnings[0]
            assert "strip_accents=True" in warnings[0]
        else:
            assert counts[strip]["unknown_tokens"] == 0 and not warnings, logged


def test_shards_not_a_multiple_of_the_workers_are_warned_about(tmp_path, monkeypatch, caplog):
    """3 shards for 2 workers: worker 0 splits its half of the documents over 2 shards,
    worker 1 writes its half into 1 (the probe's 160 / 322 / 160 instances)."""
    caplog.set_level(logging.INFO)

    def stop(*args, **kwargs):  # the workers themselves are not what is tested here
        raise cpd.InputError("stopped before the workers")

    monkeypatch.setattr(cpd, "_run_spawned", stop)
    warnings = {}
    for shards in (3, 4):
        caplog.clear()
        assert run_cli(input_file=CORPUS, vocab_file=VOCAB, output_file=str(tmp_path / "x"),
                       num_workers=2, num_output_shards=shards, max_seq_length=32,
                       max_predictions_per_seq=5) == 1
        warnings[shards] = [m for m in absl_messages(caplog, logging.WARNING)
                            if "differ in size" in m]
    assert warnings[4] == []
    assert warnings[3] == ["3 shards for 2 workers: worker 0 writes 2 of them and "
                           "worker 1 1, so their shards differ in size (about 2.0x); a multiple "
                           "of --num_workers gives shards of one size"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_interrupted_publish_leaves_a_complete_set_or_nothing(tmp_path, monkeypatch,
                                                                 overwrite):
    """Ctrl-C while the shards were renamed into place left the first ones (and a sidecar
    without its shard); the rerun refused, and run_pretraining trained on 1 of 4 shards
    without a word. With --overwrite, new shards beside old ones."""
    out = tmp_path / "out"
    args = dict(input_file=CORPUS, vocab_file=VOCAB, output_file=str(out / "x.tfrecord"),
                max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2,
                num_examples_to_print=0, num_output_shards=4)
    if overwrite:
        assert run_cli(**args) == 0
        assert len(os.listdir(out)) == 8
    real, calls = os.replace, []

    def interrupted(source, target):
        calls.append(target)
        if len(calls) == 3:  # shard 0 and its sidecar are in place, shard 1's sidecar next
            raise KeyboardInterrupt
        return real(source, target)

    monkeypatch.setattr(os, "replace", interrupted)
    assert run_cli(overwrite=overwrite, random_seed=7, **args) == 130  # "interrupted"
    monkeypatch.setattr(os, "replace", real)
    assert calls[-1].endswith("-00001-of-00004.tfrecord.meta.json")
    assert not out.exists() or os.listdir(out) == []
    assert run_cli(**args) == 0  # the rerun is not refused
    assert len(os.listdir(out)) == 8


def test_a_rerun_with_another_shard_count_is_refused_or_replaces_the_set(tmp_path,
                                                                         monkeypatch, capsys):
    """A rerun with --num_output_shards=3 after 2 (or with --gzip_compress toggled) left both
    sets side by side, with or without --overwrite, and run_pretraining's documented glob
    train-*.tfrecord trained on the corpus twice without a word. Now refused in one line;
    --overwrite replaces the prefix's shards, removing the old set only once the new one is
    in place (an interrupted publish leaves the old set whole)."""
    out = tmp_path / "out"
    args = dict(input_file=CORPUS, vocab_file=VOCAB, output_file=str(out / "train"),
                max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1,
                num_examples_to_print=0)

    def names(count, suffix=".tfrecord"):
        return sorted(f"train-{j:05d}-of-{count:05d}{suffix}{sidecar}"
                      for j in range(count) for sidecar in ("", ".meta.json"))

    assert run_cli(num_output_shards=2, **args) == 0
    old = {name: (out / name).read_bytes() for name in names(2)}
    assert sorted(os.listdir(out)) == names(2)
    capsys.readouterr()
    for extra in ({"num_output_shards": 3}, {"num_output_shards": 2, "gzip_compress": True}):
        assert run_cli(**extra, **args) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"error: --output_file: {out / 'train'} already has another shard "
                              f"set, {out / 'train'}-*-of-00002.tfrecord (4 files, sidecars "
                              "included), which a glob such as "), err
        assert ("pass --overwrite to replace the prefix's shards, or choose another "
                "--output_file") in err
        assert sorted(os.listdir(out)) == names(2)

    real, calls = os.replace, []

    def interrupted(source, target):
        calls.append(target)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(source, target)

    monkeypatch.setattr(os, "replace", interrupted)
    assert run_cli(num_output_shards=3, overwrite=True, **args) == 130
    monkeypatch.setattr(os, "replace", real)
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == old

    assert run_cli(num_output_shards=3, overwrite=True, **args) == 0
    assert sorted(os.listdir(out)) == names(3)
    assert run_cli(num_output_shards=3, gzip_compress=True, overwrite=True, **args) == 0
    assert sorted(os.listdir(out)) == names(3, ".tfrecord.gz")


@pytest.mark.parametrize("runner", ["local", "beam"])
def test_a_pipe_as_input_file_is_refused_before_any_work(tmp_path, capsys, runner):
    """--input_file=<(zcat corpus.gz): the sniff and each worker (spawned processes; Beam's
    read the file by name) each open the input, and a pipe gives its bytes to one of them.
    It said "matches no data file" of a path that exists; now one line naming the flag, the
    pipe and why, before anything is made (run_pretraining's --input_file too)."""
    from conftest import piped

    with open(CORPUS, "rb") as f:
        head = f.read(2000)  # within the pipe's buffer
    out = tmp_path / "out" / "x.tfrecord"
    with piped(head) as path:
        refusal = files.pipe_refusal(path)
        if runner == "beam":
            beam_pipeline = pytest.importorskip("data_prep.beam_pipeline")
            with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
                beam_pipeline.expand_input_files(f"{CORPUS},{path}")
        else:
            with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
                features.expand_input_files(f"{CORPUS},{path}")
            assert run_cli(input_file=path, vocab_file=VOCAB, output_file=str(out),
                           max_seq_length=32, max_predictions_per_seq=5) == 1
            err = capsys.readouterr().err
            assert f"--input_file: {refusal}\n" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
