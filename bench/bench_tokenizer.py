"""Tokenizer throughput, one thread, on the State of the Union corpus with bert-base-uncased.

    python bench/bench_tokenizer.py [--batch_size 1024] [--repeats 3] [--max_lines 0]

Compares our BertTokenizer (graph call, with and without the pieces' offsets in the text, and
the Python `encode` API) with Hugging Face `tokenizers` (transformers' BertTokenizerFast,
with and without return_offsets_mapping, and the raw `tokenizers.Tokenizer`) and with
tensorflow-text's FastBertTokenizer / BertTokenizer. Everything runs on one thread
(TF intra/inter-op threads = 1, RAYON_NUM_THREADS=1). Throughput is the best of --repeats
full passes, by wall clock and by CPU time of this process (the latter is less sensitive to
other jobs on a shared machine); MB are bytes of UTF-8 input; tokens are wordpieces without
[CLS]/[SEP]. The last column counts lines whose ids differ from Hugging Face's.

Text: the 233 addresses split into sentences at [.!?] followed by whitespace.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import tensorflow_text as tf_text  # noqa: E402

from public_data import fetch  # noqa: E402
from data_prep.tokenization import BertTokenizer  # noqa: E402


def sotu_sentences() -> list[str]:
    return [s for f in fetch.sotu_files()
            for s in re.split(r"(?<=[.!?])\s+", f.read_text(encoding="utf-8")) if s.strip()]


def best_of(repeats: int, run) -> tuple[float, float, list]:
    """Best wall-clock and best CPU seconds (this process) over `repeats` runs."""
    best_wall = best_cpu = float("inf")
    out = None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        out = run()
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return best_wall, best_cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max_lines", type=int, default=0, help="0 = all sentences")
    args = parser.parse_args()

    vocab_path = str(fetch.bert_base_uncased_vocab())
    lines = sotu_sentences()
    if args.max_lines:
        lines = lines[:args.max_lines]
    n_bytes = sum(len(s.encode("utf-8")) for s in lines)
    B = args.batch_size
    batches = [lines[i:i + B] for i in range(0, len(lines), B)]
    tensors = [tf.constant(b) for b in batches]
    print(f"{len(lines)} sentences, {n_bytes / 1e6:.2f} MB, batch {B}, best of {args.repeats}, "
          f"1 thread, TF {tf.__version__}, tensorflow-text {tf_text.__version__}")

    import transformers

    hf = transformers.BertTokenizer(vocab=vocab_path) if int(transformers.__version__[0]) >= 5 \
        else transformers.BertTokenizerFast(vocab_file=vocab_path)
    raw = hf.backend_tokenizer if hasattr(hf, "backend_tokenizer") else hf._tokenizer
    ours = BertTokenizer(vocab_path)
    vocab = ours.vocab
    fast_bert = tf_text.FastBertTokenizer(vocab, lower_case_nfd_strip_accents=True,
                                          token_out_type=tf.int32)
    lookup = tf.lookup.StaticVocabularyTable(
        tf.lookup.KeyValueTensorInitializer(vocab, tf.range(len(vocab), dtype=tf.int64)), 1)
    bert_tf = tf_text.BertTokenizer(lookup, lower_case=True, token_out_type=tf.int64)
    spec = [tf.TensorSpec([None], tf.string)]
    graph_fns = {
        "ours (graph)": tf.function(ours.__call__, input_signature=spec),
        "ours with offsets (graph)": tf.function(ours.tokenize_with_offsets,
                                                 input_signature=spec),
        "tf-text FastBertTokenizer": tf.function(fast_bert.tokenize, input_signature=spec),
        "tf-text BertTokenizer": tf.function(
            lambda x: bert_tf.tokenize(x).merge_dims(-2, -1), input_signature=spec),
    }

    def run_graph(fn):
        return lambda: [fn(t) for t in tensors]

    def to_lists(outs):
        return [row for o in outs for row in o.to_list()]

    contenders = [
        ("HF transformers BertTokenizerFast", lambda: [
            row for b in batches for row in hf(b, add_special_tokens=False)["input_ids"]], None),
        ("HF tokenizers Tokenizer.encode_batch", lambda: [
            e.ids for b in batches for e in raw.encode_batch(b, add_special_tokens=False)], None),
        ("HF BertTokenizerFast, return_offsets_mapping", lambda: [
            row for b in batches for row in hf(b, add_special_tokens=False,
                                              return_offsets_mapping=True)["input_ids"]], None),
        ("ours (graph)", run_graph(graph_fns["ours (graph)"]), to_lists),
        ("ours with offsets (graph)", run_graph(graph_fns["ours with offsets (graph)"]),
         lambda outs: to_lists([ids for ids, _, _ in outs])),
        ("ours (Python encode -> lists)", lambda: ours.encode(lines), None),
        ("tf-text FastBertTokenizer", run_graph(graph_fns["tf-text FastBertTokenizer"]), to_lists),
        ("tf-text BertTokenizer", run_graph(graph_fns["tf-text BertTokenizer"]), to_lists),
    ]
    for _, fn in graph_fns.items():  # trace once
        fn(tensors[0])

    results = []
    reference = None
    for name, run, convert in contenders:
        seconds, cpu_seconds, out = best_of(args.repeats, run)
        ids = convert(out) if convert else out
        if reference is None:
            reference = ids
        ids = [list(map(int, row)) for row in ids]
        n_tokens = sum(len(r) for r in ids)
        differ = sum(a != b for a, b in zip(ids, reference))
        results.append((name, n_bytes / seconds / 1e6, n_tokens / seconds / 1e6,
                        n_bytes / cpu_seconds / 1e6, differ))
        print(f"  {name}: {seconds:.2f} s wall, {cpu_seconds:.2f} s CPU", flush=True)
    hf_wall, hf_cpu = results[0][1], results[0][3]
    print("\n| tokenizer (1 thread) | MB/s | M tokens/s | x HF | MB per CPU-second | x HF (CPU) "
          "| lines != HF |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, mbs, mtok, cpu_mbs, differ in results:
        print(f"| {name} | {mbs:.1f} | {mtok:.2f} | {mbs / hf_wall:.1f} | {cpu_mbs:.1f} | "
              f"{cpu_mbs / hf_cpu:.1f} | {differ} |")


if __name__ == "__main__":
    main()
