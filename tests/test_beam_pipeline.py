"""create_pretraining_data --runner=DirectRunner: the Beam path (data_prep/beam_pipeline.py).

Records are read with a reader written to Google's spec (test_create_pretraining_data's), run
through run_pretraining's input pipeline, and compared with the local tool on the same corpus:
statistics within sampling bounds, NotNext segments from another document (every word of the
generated corpus names its document), byte-identical shards for 1 and 2 workers, nothing that
looks complete after a failed job, one clear line for bad settings.
"""

import glob
import logging
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

beam = pytest.importorskip(
    "apache_beam", reason="apache-beam is not installed (requirements.txt installs it; the Beam "
    "path of create_pretraining_data needs it, the local path does not)")

from test_create_pretraining_data import (  # noqa: E402  pylint: disable=wrong-import-position
    CORPUS, ROOT, VOCAB, absl_messages, check_records, cp949_after_utf8, google_reader,
    merge_shards, run_cli, stray_byte_corpus, write_generated_corpus)

from bert_keras.inputs import pretraining_dataset  # noqa: E402
from data_prep import beam_pipeline, features  # noqa: E402

S, P, DUPE = 64, 10, 4
MULTI = "direct_num_workers=2,direct_running_mode=multi_processing"


def _flags(corpus, vocab, out, **extra):
    flags = dict(input_file=corpus, vocab_file=vocab, output_file=out, num_output_shards=3,
                 max_seq_length=S, max_predictions_per_seq=P, dupe_factor=DUPE,
                 num_examples_to_print=0, beam_bucket_mb=0.03)
    flags.update(extra)
    return flags


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("beam_corpus")
    return write_generated_corpus(str(directory), num_docs=50, seed=11, sentences=(30, 60))


@pytest.fixture(scope="module")
def beam_run(corpus, tmp_path_factory):
    """One in-memory DirectRunner run: 50 documents in 3 buckets, 3 shards."""
    path, vocab_path, vocab = corpus
    out_dir = tmp_path_factory.mktemp("beam_out")
    out = str(out_dir / "train")
    assert run_cli(runner="DirectRunner", **_flags(path, vocab_path, out)) == 0
    shards = sorted(glob.glob(out + "-*-of-00003.tfrecord"))
    return {"dir": out_dir, "out": out, "shards": shards, "vocab": vocab,
            "data": [google_reader(x, S, P) for x in shards],
            "meta": [features.read_sidecar(x) for x in shards]}


def _a_documents(data, vocab):
    """The documents (names like "d12") that the A segments of a shard's records come from."""
    sep_id = vocab.index("[SEP]")
    found = set()
    for row, k, pos, labels in zip(data["input_ids"], data["masked_lm_weights"].sum(axis=1),
                                   data["masked_lm_positions"], data["masked_lm_ids"]):
        row = row.copy()
        row[pos[:int(k)]] = labels[:int(k)]
        first_sep = int(np.flatnonzero(row == sep_id)[0])
        found |= {vocab[t].split("w")[0].split("p")[0] for t in row[1:first_sep]
                  if vocab[t].startswith("d")}
    return found


def test_schema_sidecars_and_statistics_match_the_local_tool(beam_run, corpus, tmp_path):
    shards, data, meta = beam_run["shards"], beam_run["data"], beam_run["meta"]
    assert len(shards) == 3
    names = [os.path.basename(x) for x in shards]
    assert os.listdir(beam_run["dir"]) and sorted(os.listdir(beam_run["dir"])) == sorted(
        names + [x + ".meta.json" for x in names])  # no temporary file left behind
    for j, (d, m) in enumerate(zip(data, meta)):
        assert m["shard"] == {"index": j, "num_shards": 3, "instances": len(d["input_ids"])}
        assert len(d["input_ids"]) > 100  # records of every bucket spread over every shard
        assert m["beam"]["runner"] == "DirectRunner" and m["flags"]["dupe_factor"] == DUPE
        assert m["max_seq_length"] == S and m["max_predictions_per_seq"] == P
        features.check_sidecar(m, S, P, shards[j])
        features.check_shard(shards[j], m)
    # A global shuffle: every document's records land in every shard.
    per_shard = [_a_documents(d, beam_run["vocab"]) for d in data]
    assert len(set.intersection(*per_shard)) >= 45, [len(x) for x in per_shard]
    got = check_records(merge_shards(data), beam_run["vocab"], P)
    assert meta[0]["counts"]["instances"] == got["instances"]
    assert meta[0]["counts"]["documents"] == 50

    path, vocab_path, vocab = corpus
    local_out = str(tmp_path / "local")
    assert run_cli(**_flags(path, vocab_path, local_out)) == 0
    local = check_records(merge_shards([google_reader(x, S, P) for x in
                                        sorted(glob.glob(local_out + "-*.tfrecord"))]), vocab, P)
    n = got["instances"]
    # Same algorithm, other random draws: instance counts and lengths agree within noise
    # (on this corpus, seeds 1-4 and 12345 give 2130-2277 instances locally, 2161-2300 on Beam).
    assert abs(n - local["instances"]) <= 0.08 * local["instances"], (n, local["instances"])
    assert abs(got["mean_length"] - local["mean_length"]) <= 0.03 * local["mean_length"]
    assert abs(got["masked_share"] - local["masked_share"]) <= 0.005
    assert got["masked"] == got["budget"]  # ~15% (16.4% here: 10 of 61 at full length)
    for kind, share in (("mask", 0.8), ("same", 0.1), ("random", 0.1)):
        sd = math.sqrt(share * (1 - share) / got["masked"])
        assert abs(got["kinds"][kind] - share) <= max(0.02, 4 * sd), (kind, got["kinds"])
    # NotNext: the 50% coin, raised a little by Google's rule (a one-sentence chunk is always
    # NotNext) exactly as in the local tool.
    tolerance = 4 * math.sqrt(0.25 / n)
    assert 0.5 - tolerance <= got["not_next"] <= 0.55, got["not_next"]
    assert abs(got["not_next"] - local["not_next"]) <= 2 * tolerance
    assert got["not_next_checked"] > 0.3 * n


def test_records_feed_run_pretrainings_input_pipeline(beam_run):
    dataset = pretraining_dataset(beam_run["out"] + "-*", 8, S, P, seed=1, autotune=False)
    vocab_size = len(beam_run["vocab"])
    for x, y, w in dataset.take(3):
        assert tuple(x["input_word_ids"].shape) == (8, S)
        assert tuple(y["mlm_logits"].shape) == (8, P)
        assert (x["input_word_ids"].numpy() < vocab_size).all()
        assert w["mlm_logits"].numpy().sum() >= 8  # at least one prediction per instance
        assert set(np.unique(y["nsp_logits"].numpy())) <= {0, 1}


@pytest.mark.integration  # ~22 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_dynamic_masking_on_beam_writes_unmasked_instances_the_trainer_masks(corpus, tmp_path):
    """--dynamic_masking under a Beam runner: the local tool's four features and sidecar."""
    from bert_keras.masking import DynamicMasking
    import tensorflow as tf

    path, vocab_path, vocab = corpus
    out = str(tmp_path / "dyn" / "train")
    flags = _flags(path, vocab_path, out, dynamic_masking=True)
    del flags["max_predictions_per_seq"], flags["dupe_factor"]  # refused / 1 with dynamic
    assert run_cli(runner="DirectRunner", **flags) == 0
    shards = sorted(glob.glob(out + "-*-of-00003.tfrecord"))
    assert len(shards) == 3
    metas = [features.read_sidecar(x) for x in shards]
    assert all(m["masking"] == features.DYNAMIC_MASKING for m in metas)
    assert sum(m["shard"]["instances"] for m in metas) == metas[0]["counts"]["instances"] > 0
    keys = set()
    for raw in tf.data.TFRecordDataset(shards).take(5):
        example = tf.train.Example.FromString(raw.numpy())
        keys |= set(example.features.feature.keys())
    assert keys == {"input_ids", "input_mask", "segment_ids", "next_sentence_labels"}
    masking = DynamicMasking.from_vocab(vocab, max_predictions_per_seq=P)
    dataset = pretraining_dataset(out + "-*", 8, S, P, seed=1, autotune=False, masking=masking)
    for x, y, w in dataset.take(2):
        assert tuple(y["mlm_logits"].shape) == (8, P)
        assert w["mlm_logits"].numpy().sum() >= 8  # the trainer chose masks


@pytest.mark.integration  # ~14 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_two_workers_and_a_rerun_give_the_same_bytes(beam_run, corpus, tmp_path, capfd):
    path, vocab_path, _ = corpus
    out = str(tmp_path / "two" / "train")
    assert run_cli(runner="DirectRunner", beam_pipeline_options=MULTI,
                   **_flags(path, vocab_path, out)) == 0
    # The worker processes' INFO log (about 45 lines for 2 workers: channels, harness start
    # and exit) is not shown; only what each logs before it reads its level remains.
    err = capfd.readouterr().err
    assert "INFO:apache_beam" not in err and "harness starting" not in err, err[-2000:]
    two = sorted(glob.glob(out + "-*-of-00003.tfrecord"))
    assert [os.path.basename(x) for x in two] == [os.path.basename(x) for x in beam_run["shards"]]
    for x, y in zip(beam_run["shards"], two):
        assert open(x, "rb").read() == open(y, "rb").read()
    # Another seed: other records.
    out = str(tmp_path / "seed" / "train")
    assert run_cli(runner="DirectRunner", random_seed=7, **_flags(path, vocab_path, out)) == 0
    assert open(out + "-00000-of-00003.tfrecord", "rb").read() != open(
        beam_run["shards"][0], "rb").read()


@pytest.mark.integration  # A fresh process with 2 worker processes: about 15 s on 2 cores.
def test_two_worker_command_logs_only_the_tools_lines(corpus, tmp_path):
    """docs/beam.md's DirectRunner command, as a user runs it: Beam's INFO notes (BigQuery
    clients, type hints converted to Any) and its workers' harness log (about 45 lines for 2
    workers) are not shown; the tool's own lines are."""
    path, vocab_path, _ = corpus
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "BERT_KERAS_DEBUG")}
    env["PYTHONPATH"] = ROOT
    proc = subprocess.run(
        [sys.executable, "-m", "data_prep.create_pretraining_data", "--runner=DirectRunner",
         f"--beam_pipeline_options={MULTI}", f"--input_file={path}", f"--vocab_file={vocab_path}",
         f"--output_file={tmp_path / 'train'}", "--num_output_shards=2", f"--max_seq_length={S}",
         f"--max_predictions_per_seq={P}", "--dupe_factor=1"],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    # Each worker's first line comes before it reads its log level: it stays.
    beam_info = [line for line in lines if ("INFO:" in line and "handler created" not in line)
                 or "native_type_compatibility" in line or "bigquery.py" in line]
    assert not beam_info, beam_info[:5]
    assert any("wrote " in line and "instances" in line for line in lines), proc.stderr[-2000:]
    assert len(lines) < 25, proc.stderr


def test_without_num_output_shards_each_worker_gets_a_shard(beam_run, corpus, tmp_path):
    """One --output_file and no --num_output_shards: not one file (readers could not split
    it) but a shard per worker of the runner, named as --num_output_shards names them; the
    bytes are those of a run given that count."""
    path, vocab_path, _ = corpus
    flags = _flags(path, vocab_path, str(tmp_path / "out" / "train.tfrecord"),
                   beam_pipeline_options="direct_num_workers=3")
    del flags["num_output_shards"]
    assert run_cli(runner="DirectRunner", **flags) == 0
    shards = sorted(glob.glob(str(tmp_path / "out" / "train-*-of-*.tfrecord")))
    assert [os.path.basename(x) for x in shards] == [
        f"train-{j:05d}-of-00003.tfrecord" for j in range(3)]
    for mine, given in zip(shards, beam_run["shards"]):  # --num_output_shards=3, 1 worker
        assert open(mine, "rb").read() == open(given, "rb").read()
        assert features.read_sidecar(mine)["shard"] == features.read_sidecar(given)["shard"]


def test_another_shard_count_beside_a_set_is_refused_or_replaces_it(beam_run, corpus,
                                                                     tmp_path, capsys):
    """A rerun without --num_output_shards (1 worker: 1 shard) beside a 3-shard set wrote
    train-00000-of-00001 next to it, even without --overwrite: run_pretraining's glob
    train-*.tfrecord then read the corpus twice. Refused before the job; --overwrite
    replaces the prefix's shards once the new set is in place."""
    path, vocab_path, _ = corpus
    out = tmp_path / "out"
    out.mkdir()
    for shard in beam_run["shards"]:
        for name in (shard, features.sidecar_path(shard)):
            shutil.copy(name, out)
    old = sorted(os.listdir(out))
    flags = _flags(path, vocab_path, str(out / "train"))
    del flags["num_output_shards"]
    capsys.readouterr()
    assert run_cli(runner="DirectRunner", **flags) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"error: --output_file: {out / 'train'} already has another shard set, "
        f"{out / 'train'}-*-of-00003.tfrecord (6 files, sidecars included)"), err
    assert "pass --overwrite to replace the prefix's shards" in err
    assert sorted(os.listdir(out)) == old
    assert run_cli(runner="DirectRunner", overwrite=True, **flags) == 0
    assert sorted(os.listdir(out)) == ["train-00000-of-00001.tfrecord",
                                       "train-00000-of-00001.tfrecord.meta.json"]


def test_default_shard_count_follows_workers_and_size(corpus, monkeypatch):
    from apache_beam.options.pipeline_options import PipelineOptions

    path, _, _ = corpus
    size = os.path.getsize(path)
    one = PipelineOptions(["--runner=DirectRunner"])
    assert beam_pipeline.default_num_shards(one, [path], 4) == 1
    assert beam_pipeline.default_num_shards(
        PipelineOptions(["--runner=DirectRunner", "--direct_num_workers=5"]), [path], 4) == 5
    assert beam_pipeline.default_num_shards(
        PipelineOptions(["--runner=DataflowRunner", "--max_num_workers=7"]), [path], 1) == 7
    monkeypatch.setattr(beam_pipeline, "DEFAULT_SHARD_BYTES", size)  # a shard per input x 1
    assert beam_pipeline.default_num_shards(one, [path], 4) == 4
    monkeypatch.setattr(beam_pipeline, "DEFAULT_SHARD_BYTES", size * 4 + 1)
    assert beam_pipeline.default_num_shards(one, [path], 4) == 1


def test_gzip_cased_vocab_keeps_korean(tmp_path):
    lines = [line.strip() for line in open(os.path.join(os.path.dirname(CORPUS),
                                                        "korean_sample.txt"), encoding="utf-8")]
    lines = [line for line in lines if line]
    text = "\n\n".join("\n".join(lines[i:i + 4]) for i in range(0, len(lines), 4)) + "\n"
    corpus = tmp_path / "ko.txt"
    corpus.write_text(text + "\nCafé Naïve Résumé.\nThe café is open.\n", encoding="utf-8")
    chars = sorted({c for c in corpus.read_text(encoding="utf-8") if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + ["##" + c for c in chars]
    vocab_path = tmp_path / "vocab.txt"
    vocab_path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    out = str(tmp_path / "out" / "ko")
    assert run_cli(runner="DirectRunner", gzip_compress=True, do_lower_case=False,
                   strip_accents="false", do_whole_word_mask=True,
                   **_flags(str(corpus), str(vocab_path), out, num_output_shards=2,
                            max_seq_length=48, max_predictions_per_seq=6, dupe_factor=2)) == 0
    shards = sorted(glob.glob(out + "-*-of-00002.tfrecord.gz"))
    assert len(shards) == 2 and all(open(x, "rb").read(2) == b"\x1f\x8b" for x in shards)
    data = merge_shards([google_reader(x, 48, 6, compression="GZIP") for x in shards])
    meta = features.read_sidecar(shards[0])
    assert meta["compression"] == "GZIP" and meta["strip_accents"] is False
    assert meta["do_lower_case"] is False
    original = data["input_ids"].copy()
    for i in range(len(original)):
        k = int(data["masked_lm_weights"][i].sum())
        original[i, data["masked_lm_positions"][i, :k]] = data["masked_lm_ids"][i, :k]
    tokens = [vocab[t].lstrip("#") for t in original[data["input_mask"] == 1].tolist()]
    hangul = sum("\uac00" <= t <= "\ud7a3" for t in tokens)
    assert hangul > 0.5 * len(tokens)  # composed syllables survive (no NFD, no [UNK])
    assert tokens.count("[UNK]") == 0 and "é" in tokens and "C" in tokens  # cased, accents kept


def test_a_failed_job_leaves_nothing_that_looks_complete(corpus, tmp_path, monkeypatch, capsys):
    path, vocab_path, _ = corpus
    real_write = beam_pipeline.write_tfrecords

    def failing_write(temp, records, gzip_compress):
        if "-00001-of-" in temp:
            raise OSError("disk full (injected)")
        real_write(temp, records, gzip_compress)

    monkeypatch.setattr(beam_pipeline, "write_tfrecords", failing_write)
    out_dir = tmp_path / "out"
    assert run_cli(runner="DirectRunner", **_flags(path, vocab_path, str(out_dir / "x"))) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "disk full (injected)" in err, err
    assert "Traceback" not in err
    # No shard or sidecar under a final name, no temporary, and not the directory the run
    # created for them.
    assert not out_dir.exists()


def test_a_bad_document_fails_the_job_with_its_file_and_line(tmp_path, capsys, caplog):
    # The NUL byte sits after the first 64 KB (the up-front sniff), in a later document.
    corpus = tmp_path / "bad.txt"
    good = open(CORPUS, encoding="utf-8").read()
    corpus.write_bytes((good * 80).encode() + b"\n\nbroken \x00 line .\nmore .\n")
    out_dir = tmp_path / "out"
    assert run_cli(runner="DirectRunner", **_flags(str(corpus), VOCAB, str(out_dir / "x"),
                                                   max_seq_length=32, max_predictions_per_seq=5,
                                                   dupe_factor=1)) == 1
    err = capsys.readouterr().err
    assert "NUL byte" in err and "bad.txt:" in err and "Traceback" not in err, err
    assert "while running" not in err  # the runner's step name is not the user's business
    assert not out_dir.exists() or os.listdir(out_dir) == []
    # Nor the runner's own log of the failure, with its traceback (absl prints it to the
    # terminal's stderr, which capsys does not see).
    beam = [r for r in caplog.records if r.name.startswith("apache_beam")]
    assert not any(r.levelno >= 40 or r.exc_info for r in beam), [r.getMessage() for r in beam]


def _bad_case(tmp_path, name):
    if name == "unknown_runner":
        return {"runner": "MapReduceRunner"}, "MapReduceRunner"
    if name == "bad_option":
        return {"beam_pipeline_options": "direct_num_worker=2"}, "direct_num_worker"
    if name == "malformed_option":
        return {"beam_pipeline_options": "=2"}, "not key=value"
    if name == "options_without_runner":
        return {"runner": "local", "beam_pipeline_options": MULTI}, "needs a Beam --runner"
    if name == "local_workers":
        return {"num_workers": 2}, "num_workers=2"
    if name == "local_printing":  # accepted and dropped before
        return {"num_examples_to_print": 3}, "--num_examples_to_print is for --runner=local"
    if name == "local_shuffle":
        return {"shuffle_buffer_size": 10}, "--shuffle_buffer_size is for --runner=local"
    if name == "vocab_without_mask":
        path = tmp_path / "vocab.txt"
        path.write_text("".join(t + "\n" for t in open(VOCAB).read().splitlines()
                                if t != "[MASK]"))
        return {"vocab_file": str(path)}, "[MASK]"
    if name == "empty_corpus":
        path = tmp_path / "empty.txt"
        path.write_text("")
        return {"input_file": str(path)}, "empty"
    if name == "blank_corpus":  # not empty, but no text: found by the job, still no output
        path = tmp_path / "blank.txt"
        path.write_text("\n\n  \n\n")
        return {"input_file": str(path)}, f"{path}: no document with text in it"
    if name == "single_document":  # no blank line: as the local tool says it, naming it
        path = tmp_path / "one.txt"
        path.write_text("the whale came up .\nit was large .\nthe ship sailed on .\n")
        return {"input_file": str(path)}, f"error: {path}: a single document (no blank line"
    if name == "missing_input":
        return {"input_file": str(tmp_path / "nope-*.txt")}, "matches no data file"
    if name == "small_buckets":
        return {"beam_bucket_mb": 0}, "beam_bucket_mb"
    if name == "cp949_after_64_kb":  # counted per file across the workers, as locally
        path = str(tmp_path / "mixed.txt")
        good, lines = cp949_after_utf8(path)
        return ({"input_file": path, "beam_pipeline_options": MULTI},
                f"{path}: {lines - good} of its {lines:,} non-blank lines are not UTF-8 (the "
                f"first: line {good + good // 5 + 1})")
    raise ValueError(name)


@pytest.mark.parametrize("case", ["unknown_runner", "bad_option", "malformed_option",
                                  "options_without_runner", "local_workers",
                                  "local_printing", "local_shuffle",
                                  "vocab_without_mask", "empty_corpus", "blank_corpus",
                                  "single_document", "missing_input", "small_buckets",
                                  "cp949_after_64_kb"])
def test_bad_settings_fail_with_one_line_and_no_output(tmp_path, capsys, case):
    overrides, expected = _bad_case(tmp_path, case)
    out_dir = tmp_path / "out"
    args = dict(runner="DirectRunner", **_flags(CORPUS, VOCAB, str(out_dir / "x"),
                                                max_seq_length=32, max_predictions_per_seq=5,
                                                dupe_factor=1))
    args.update(overrides)
    # A flag out of its numeric range is refused at parsing (status 2), as every such flag.
    assert run_cli(**args) == (2 if case == "small_buckets" else 1)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], err
    assert "Traceback" not in err
    assert not out_dir.exists()


def test_pipeline_options_parse_like_tfds():
    assert beam_pipeline.parse_pipeline_options(
        "project=p, region=us-central1,temp_location=gs://b/t,save_main_session") == [
            "--project=p", "--region=us-central1", "--temp_location=gs://b/t",
            "--save_main_session"]
    options = beam_pipeline.pipeline_options("DirectRunner", MULTI).get_all_options()
    assert options["direct_num_workers"] == 2 and options["runner"] == "DirectRunner"
    # The workers' INFO log stays out of the terminal unless asked for.
    assert options["default_sdk_harness_log_level"] == "WARNING"
    options = beam_pipeline.pipeline_options(
        "DirectRunner", MULTI + ",default_sdk_harness_log_level=INFO").get_all_options()
    assert options["default_sdk_harness_log_level"] == "INFO"


def test_a_runner_that_loses_documents_publishes_nothing(corpus, tmp_path, monkeypatch, capsys):
    path, vocab_path, _ = corpus
    real = beam_pipeline.job.tokenize_documents

    def lossy(raws, tokenize):  # drops one document of each batch, as a faulty runner would
        for k, item in enumerate(real(raws, tokenize)):
            if k:
                yield item

    monkeypatch.setattr(beam_pipeline.job, "tokenize_documents", lossy)
    out_dir = tmp_path / "out"
    assert run_cli(runner="DirectRunner", **_flags(path, vocab_path, str(out_dir / "x"))) == 1
    err = capsys.readouterr().err
    assert "read 50 documents" in err and "lost data" in err, err
    assert not out_dir.exists()


@pytest.mark.parametrize("text,reason", [
    ("direct_num_workers=abc", "argument --direct_num_workers: invalid int value: 'abc'"),
    ("direct_running_mode=bogus", "argument --direct_running_mode: invalid choice: 'bogus'"),
    ("direct_num_workers", "argument --direct_num_workers: expected one argument")])
def test_a_bad_option_value_is_one_line(text, reason, capsys):
    """Beam's argparse printed its whole usage (150 lines) and exited with status 2."""
    from data_prep.cli import ToolError

    with pytest.raises(ToolError) as info:
        beam_pipeline.pipeline_options("DirectRunner", text)
    assert str(info.value).startswith(f"--beam_pipeline_options: {reason}")
    assert "\n" not in str(info.value) and "usage:" not in capsys.readouterr().err


def test_an_output_that_is_a_directory_is_refused_before_the_job(tmp_path):
    """Even with --overwrite: before, the whole job ran, then failed naming a temporary."""
    import types

    from data_prep.cli import ToolError

    (tmp_path / "x.tfrecord").mkdir()
    spec = types.SimpleNamespace(output_files=(str(tmp_path / "x.tfrecord"),), overwrite=True)
    with pytest.raises(ToolError, match=r"^--output_file: .*x.tfrecord is a directory; name a "
                                        r"file \(or a prefix\) in it$"):
        beam_pipeline.check_outputs(spec)


def test_beam_logs_the_corpus_warnings_at_warning_level(tmp_path, caplog):
    """The Beam route's check of the job's counters warns as the local tool does: at WARNING
    (they were INFO lines starting "warning: ", hidden by --stderrthreshold=warning), the
    summary at INFO."""
    path = stray_byte_corpus(tmp_path)
    caplog.set_level(logging.INFO)
    assert run_cli(runner="DirectRunner", verbosity=0, **_flags(
        str(path), VOCAB, str(tmp_path / "x"), num_output_shards=2, max_seq_length=32,
        max_predictions_per_seq=5, dupe_factor=1)) == 0
    warnings = [m for m in absl_messages(caplog, logging.WARNING) if "not UTF-8" in m]
    assert warnings == ["1 line(s) had bytes that are not UTF-8, which were dropped "
                        f"(first at {path}:9)"], caplog.text
    info = absl_messages(caplog, logging.INFO)
    assert [m for m in info if m.startswith("wrote ")], caplog.text
    assert not [m for m in info if "not UTF-8" in m], caplog.text


@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
def test_beam_reads_a_compressed_corpus_as_the_local_tool_does(tmp_path, suffix):
    """The Beam reader decompresses what files.open_input decompresses: a .bz2 corpus was
    read as its compressed bytes ("not UTF-8") on Beam, as it was by the local tool."""
    import bz2
    import gzip

    from data_prep import pretraining_job as job

    data = open(CORPUS, "rb").read()
    path = tmp_path / f"corpus.txt{suffix}"
    path.write_bytes(gzip.compress(data) if suffix == ".gz" else bz2.compress(data))
    with beam_pipeline.open_any(str(path)) as f:
        assert f.read() == data
    local = [d.lines for d in job.read_documents([CORPUS])]
    assert [d.lines for d in job.read_documents([str(path)], open_file=beam_pipeline.open_any)
            ] == local
    assert len(local) > 2
