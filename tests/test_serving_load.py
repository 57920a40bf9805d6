"""Nothing lost under load (issue 47, item 4), at tiny size for a few seconds: the checks of
bench/bench_serving_latency.py's soak on a text-in classifier, with and without TF Serving's
batching parameters (TensorFlow's BatchFunction op), and the checks catching a lost request,
a wrong output and a growing resident set; the bench's transformers peers, and its tagger
mode end to end at the tiny preset (integration).
"""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TINY
from test_export import write_vocab

from bert_keras import BertEncoder
from bert_keras.tasks import BertClassifier

sys.path.insert(0, os.path.join(REPO, "bench"))
import bench_serving_latency as bench  # noqa: E402

S = 32


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny text-in classifier (the export's serving function, not saved) and texts of
    every length up to past S."""
    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import ClassifierModule
    from export.export_preprocessor import TextPacker

    tokenizer = BertTokenizer(write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt"))
    module = ClassifierModule(TextPacker(tokenizer, S, buckets=(8, 16)),
                              BertClassifier(BertEncoder(**TINY), num_classes=2), ["a", "b"],
                              pair=False)
    texts = [" ".join(f"w{(3 * i + j) % 90}" for j in range(i % 40)) for i in range(24)]
    return module, texts


def _row(serve):
    return bench.Row(prepare=lambda text: tf.constant([text]),
                     call=lambda x: bench._to_numpy(serve(x)),
                     logits=lambda out: out["logits"])


def _single(row, texts):
    return [np.asarray(row.logits(row.call(row.prepare(t)))) for t in texts]


@pytest.mark.parametrize("batching", [False, True])
def test_under_four_clients_every_request_is_answered_with_its_single_client_output(
        served, batching):
    from export import batching_parameters, length_buckets

    module, texts = served
    row = _row(module.serve)
    single = _single(row, texts)
    if batching:
        params = batching_parameters.for_buckets(length_buckets.resolve((8, 16), S))
        row = bench.batched_row(module.serve, params)
    inputs = [row.prepare(t) for t in texts]
    row.call(inputs[0])  # traced before the clock starts, as a server warms up
    result = bench.soak(row, inputs, single, clients=4, seconds=6, rtol=1e-4)
    assert result["ok"], result
    assert result["answered"] == result["sent"] > 24  # every text, several times
    assert result["rss_after_warmup_mb"] > 0


class _Flaky:
    """A row that fails every 7th request and returns other logits every 5th."""

    def __init__(self, row):
        self.row, self.count = row, 0
        self.prepare, self.logits = row.prepare, row.logits

    def call(self, x):
        self.count += 1
        if self.count % 7 == 0:
            raise RuntimeError("dropped")
        out = self.row.call(x)
        return {**out, "logits": out["logits"] + 0.1} if self.count % 5 == 0 else out


def test_the_checks_catch_lost_requests_and_wrong_outputs(served):
    module, texts = served
    row = _row(module.serve)
    single = _single(row, texts)
    flaky = _Flaky(row)
    result = bench.soak(flaky, [row.prepare(t) for t in texts], single, clients=2, seconds=5,
                        rtol=1e-4)
    assert not result["checks"]["answered"] and result["errors"][0] == "RuntimeError: dropped"
    assert result["answered"] < result["sent"]
    assert not result["checks"]["outputs_equal_single_client"]
    assert result["max_relative_difference"] > 1e-3


def test_the_checks_catch_a_growing_resident_set(served):
    import time

    module, texts = served
    row = _row(module.serve)
    kept, state = [], {}

    def leaking(x):  # 6 s after the first request (past the 5 s warm-up) keeps 2 MB
        start = state.setdefault("start", time.perf_counter())  # (touched: resident)
        if time.perf_counter() - start > 6 and len(kept) < 400:  # 800 MB at most
            kept.append(np.ones(1 << 19, np.float32))
        return row.call(x)

    leaky = bench.Row(prepare=row.prepare, call=leaking, logits=row.logits)
    single = _single(row, texts)
    result = bench.soak(leaky, [row.prepare(t) for t in texts], single, clients=2, seconds=9,
                        rtol=1e-4)
    assert not result["checks"]["rss_flat"], result
    assert result["checks"]["answered"] and result["checks"]["outputs_equal_single_client"]


def test_the_transformers_rows_read_the_vocabulary_and_run_run_squads_windows(tmp_path):
    """The bench's transformers peers tokenize with the vocabulary they are given (transformers
    5 ignores `vocab_file=`), and its span-QA peer runs as many windows as run_squad reads
    (`qa_windows`, which the bench also checks our export against)."""
    from bert_keras import BertConfig
    from data_prep.tokenization import BertTokenizer

    vocab = write_vocab(tmp_path / "vocab.txt")
    ours = BertTokenizer(vocab)
    theirs = bench.transformers_tokenizer(vocab)
    text = "w1 W22 w3, w4? w95 x"
    assert theirs(text, add_special_tokens=False)["input_ids"] == list(ours.encode([text])[0])
    row = bench.transformers_span_qa(BertConfig.from_preset("tiny", vocab_size=99), vocab,
                                     seq_length=24, doc_stride=5, max_query_length=6)
    seen = set()
    for words in (0, 1, 12, 13, 14, 15, 19, 20, 40, 77):
        for question in ("w1 w2 w3", " ".join(f"w{i}" for i in range(10))):  # cut to 6
            pair = {"question": question,
                    "context": " ".join(f"w{(7 * i) % 90}" for i in range(words))}
            _, windows = bench.qa_windows(ours, question, pair["context"], 24, 5, 6)
            out = row.call(pair)
            assert out["windows"] == windows, (words, question)
            assert out["answer"] in pair["context"]
            seen.add(windows)
    assert len(seen) >= 5


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration
def test_the_tagger_mode_tags_every_word_alike_and_times_every_row(tmp_path):
    """`--mode=tagger` at the tiny preset on a few real requests (a fresh process, about a
    minute on 2 cores: four exports, one for a --bucket_sets row): every row in the JSON with sane figures, and the
    checks it runs before timing passed (a tag per word on every row; ours in float32 gives
    transformers' tags on the same weights)."""
    import json
    import subprocess

    from public_data import fetch

    try:  # what the mode reads: the vocabulary and the real requests' sources
        fetch.bert_base_uncased_vocab(), fetch.sotu_files()
        from public_data import datasets
        datasets.fetch_allennlp_fixtures()
    except fetch.FetchError as e:
        pytest.skip(f"public data unavailable: {e}")
    out = tmp_path / "tagger.json"
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "bench_serving_latency.py"),
         "--mode=tagger", "--preset=tiny", "--seq_length=48", "--requests=20", "--rounds=2",
         "--warmup=2", "--threads=1", "--bucket_sets=16,40", f"--json={out}"],
        cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
        text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = ["ours tagger text-in", "ours tagger text-in, fixed length",
            "ours tagger text-in, bucket set 1",  # --bucket_sets: 16, 40 and 48
            "ours tagger text-in, bfloat16 (--serving_dtype)",
            "transformers end-to-end (text in)"]
    assert list(result["single"]) == rows
    requests = result["requests"]
    assert len(requests) + result["left_out"] == 20 and len(requests) >= 10
    assert {r["source"] for r in requests} == {"sentence", "question"}
    assert all(0 < r["words"] and r["length"] <= 48 for r in requests)
    for name in rows:
        s = result["single"][name]
        assert s["requests"] == len(requests) == len(result["latencies_ms"][name])
        assert 0 < s["min_ms"] <= s["p50_ms"] <= s["p99_ms"] < 10_000
        assert s["requests_per_s"] == pytest.approx(1e3 / s["mean_ms"])
    assert result["fastest_peer"]["p50_ms"] == rows[-1]
    checks = result["checks"]
    assert checks["tags_per_word"] and checks["weights_equal"]
    words = sum(r["words"] for r in requests)
    for name in rows[:3]:  # float32: transformers' tags on the same weights
        assert checks[name]["words"] == checks[name]["tags_equal"] == words
        assert checks[name]["max_probability_difference"] < 1e-3
    assert checks[rows[3]]["words"] == words  # bfloat16: reported, within its rounding
    assert checks[rows[3]]["max_probability_difference"] < 0.1


def test_bucket_sets_are_parsed_and_refused_where_no_bucket_is_exported():
    """--bucket_sets: ';'-separated --length_buckets values, one row each; a bad entry, or a
    mode whose exports have no buckets (full, batches), gets one `error:` line and exit 2
    before any model is built."""
    import subprocess

    assert bench.bucket_sets("16,32;8, 24 ;") == [(16, 32), (8, 24)]
    assert bench.bucket_sets("") == []
    for bad in ("16,x", "0,16", ";,;"):  # ",": an entry without a length
        with pytest.raises(ValueError, match=r"^--bucket_sets: expected ';'-separated lists"):
            bench.bucket_sets(bad)
    for args, expected in ((["--mode=full", "--bucket_sets=16,32"],
                            "--bucket_sets: only --mode=real, qa or tagger export with buckets. "
                            "Received: --mode=full"),
                           (["--mode=real", "--bucket_sets=16,x"],
                            "--bucket_sets: expected ';'-separated lists of positive integers "
                            "(e.g. 16,32,64;16,24,32,48,64). Received: '16,x'")):
        done = subprocess.run([sys.executable, os.path.join(REPO, "bench",
                                                            "bench_serving_latency.py"), *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines()[-1].endswith("error: " + expected), done.stderr


@pytest.mark.parametrize("args, received", [
    (["--seq_length=64"], "--max_query_length=64 --seq_length=64 --doc_stride=128"),
    (["--seq_length=40", "--max_query_length=37"],
     "--max_query_length=37 --seq_length=40 --doc_stride=128"),
    (["--max_query_length=0"], "--max_query_length=0 --seq_length=128 --doc_stride=128"),
    (["--doc_stride=0"], "--max_query_length=64 --seq_length=128 --doc_stride=0"),
])
def test_qa_mode_refuses_settings_that_leave_no_room_for_context(args, received):
    """--mode=qa with --max_query_length >= --seq_length - 3 (no room for context beside the
    question and [CLS], [SEP], [SEP]: run_squad and export_span_qa refuse it) or a stride
    below 1 is one `error:` line and exit 2 before anything loads; qa_windows would
    otherwise step by a room <= 0 forever on the first long question."""
    import subprocess

    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_serving_latency.py"),
                           "--mode=qa", "--preset=tiny", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "error: --mode=qa: need 1 <= --max_query_length < --seq_length - 3 ([CLS] and two "
        f"[SEP]) and --doc_stride >= 1. Received: {received}"), done.stderr


def test_the_layout_ab_row_exports_with_the_asked_layout_and_other_modes_refuse_it():
    """--kernel_layout_ab=L adds two rows, "<name>, kernels L" and "<name>, bfloat16, kernels
    L", built with that layout in float32 and bfloat16 under export names of their own (none
    without the flag); a mode without a task export (full,
    batches) gets one `error:` line and exit 2 before any model is built."""
    import subprocess
    from types import SimpleNamespace

    built = []
    rows = bench.layout_ab_rows(SimpleNamespace(kernel_layout_ab="out_in"), "ours tagger text-in",
                                lambda d, layout, name, dtype: built.append((d, layout, name,
                                                                             dtype)))
    assert [r[:2] for r in rows] == [("ours tagger text-in, kernels out_in", False),
                                     ("ours tagger text-in, bfloat16, kernels out_in", False)]
    for row in rows:
        row[2]("work")
    assert built == [("work", "out_in", "ours_kernels_out_in_float32", "float32"),
                     ("work", "out_in", "ours_kernels_out_in_bfloat16", "bfloat16")]
    assert bench.layout_ab_rows(SimpleNamespace(kernel_layout_ab=""), "x", None) == []
    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_serving_latency.py"),
                           "--mode=batches", "--kernel_layout_ab=in_out"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "error: --kernel_layout_ab: only --mode=real, qa or tagger. Received: --mode=batches")


def test_only_selects_a_row_by_its_exact_name_with_an_equals_sign():
    """--only: substrings of row names; '=name' keeps that row alone where its name begins
    others' (the default span-QA row and its variants)."""
    from types import SimpleNamespace

    specs = [("ours span-QA text-in", False, None), ("ours span-QA text-in, fixed length", False,
              None), ("ours span-QA text-in, kernels in_out", False, None),
             ("transformers end-to-end (text in)", True, None)]
    def names(only):
        return [s[0] for s in bench.select(specs, SimpleNamespace(only=only))]

    assert names("ours span-QA text-in") == [s[0] for s in specs[:3]]
    assert names("=ours span-QA text-in,kernels,transformers") == [
        specs[0][0], specs[2][0], specs[3][0]]
    with pytest.raises(SystemExit, match="matches no row"):
        names("=ours span-QA")


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_the_long_attention_bench_builds_equal_rows_in_either_kernel_layout(layout):
    """bench_long_attention.py --kernel_layout: every pair it checks before timing (ours
    against the same weights in torch, and the serving copy against the fused-op attention
    it replaced) computes the same values at a TINY size in both layouts; torch's weights
    are our kernels in nn.Linear's [out, in] whichever layout ours stores."""
    import bench_long_attention as long_bench

    from bert_keras import BertConfig

    # vocab over 1000: the bench draws ids from [1000, V).
    config = BertConfig(vocab_size=1200, hidden_size=TINY["hidden_size"],
                        num_hidden_layers=2, num_attention_heads=TINY["num_heads"],
                        intermediate_size=TINY["intermediate_size"],
                        max_position_embeddings=TINY["max_sequence_length"])
    rows, _, checks = long_bench.build_rows(config, 13, np.random.default_rng(3), layout)
    assert tuple(rows) == long_bench.ROWS and len(checks) >= 5
    for ours, theirs in checks:
        np.testing.assert_allclose(rows[ours](), rows[theirs](), rtol=1e-4, atol=2e-4,
                                   err_msg=f"{ours} against {theirs}")
