r"""Serving latency at batch 1: our end-to-end SavedModel vs keras-hub's export vs transformers.

    .venv/bin/python bench/bench_serving_latency.py --preset=base --seq_length=128 \
      --requests=200 --rounds=10 --warmup=10 --json=serving_latency_base.json

Issue 8, item 7: p50/p99 latency of one request (batch 1, seq_length tokens) on this CPU.
Goal: our end-to-end export, tokenization included, no slower than the fastest peer, which
is given token ids. Every model has the same BERT size (--preset), the bert-base-uncased
vocabulary (30,522 entries, from the local cache of `public_data.fetch`), 2 classes and
seeded random weights; nothing is downloaded from a model hub. The text is the shortest
prefix of a fixed English passage that fills seq_length wordpieces, and the ids rows get
exactly the ids it tokenizes to, so every model runs the full sequence on the same tokens.

What one timed request includes (time.perf_counter around the call and the conversion of
every output to numpy; inputs are built once, outside the timing):

  ours end-to-end (text in)   `signatures["serving_default"](text=[1] string)` of the
                              export/export_classifier.py SavedModel: in-graph lowercasing,
                              WordPiece tokenization, packing to [CLS] .. [SEP] + padding,
                              the encoder, the classification dense, softmax, argmax and
                              the label-name lookup (outputs probabilities, label, label_id,
                              logits).
  ours encoder (ids in)       `signatures["serving_default"]` of the export/export_encoder.py
                              SavedModel on int32 [1, S] ids: the encoder only (no 2-class
                              dense), returning pooled_output, sequence_output and all
                              layers' outputs stacked [1, L, S, H]: a little more output
                              than a classifier needs.
  keras-hub (ids in)          `serve(...)` of `BertTextClassifier(preprocessor=None)
                              .export(format="tf_saved_model")` on int32 [1, S] token_ids,
                              segment_ids, padding_mask -> logits [1, 2].
  transformers eager (ids in) `BertForSequenceClassification(...)(input_ids, attention_mask,
                              token_type_ids)` under torch.inference_mode() in eval mode,
                              attention as shipped (sdpa) -> logits [1, 2].

All rows run in this process with the same thread count (--threads: TensorFlow intra-op
threads and torch.set_num_threads). All models are built, exported and loaded first, and
only then warmed up (--warmup requests each): loading a SavedModel makes the next call of
every function loaded before it slow once (0.4-0.6 s at the tiny preset), which a
server loading its models at start-up never shows. The rows are then timed in interleaved
rounds (the starting row rotates each round) and each row's latencies are pooled over all
rounds, so load from other jobs on a shared machine spreads over all rows instead of
landing on whichever row ran during it. Each row's turn in a round starts with one untimed
request, so the cost of switching models (cold caches, the other framework's threads) is
not charged to the row: the figures are a server's steady state.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

LABELS = ["ham", "spam"]
SEED = 0

# Repeated as needed, then cut to the fewest words that fill the sequence.
PASSAGE = (
    "We introduce a new language representation model called BERT, which stands for "
    "Bidirectional Encoder Representations from Transformers. Unlike recent language "
    "representation models, BERT is designed to pre-train deep bidirectional representations "
    "from unlabeled text by jointly conditioning on both left and right context in all "
    "layers. As a result, the pre-trained BERT model can be fine-tuned with just one "
    "additional output layer to create state-of-the-art models for a wide range of tasks, "
    "such as question answering and language inference, without substantial task-specific "
    "architecture modifications."
)


# --------------------------------------------------------------------------------------
# Shared inputs


def filling_text(tokenizer, seq_length: int) -> tuple[str, dict[str, np.ndarray]]:
    """The shortest prefix of PASSAGE (repeated) that fills `seq_length` after packing.

    Args:
      tokenizer: a `data_prep.tokenization.BertTokenizer`.
      seq_length: S, the exported sequence length.

    Returns:
      (text, ids): ids holds int32 [1, S] "input_word_ids" ([CLS] first S-2 wordpieces
      [SEP], no padding), "input_mask" (all ones) and "input_type_ids" (all zeros), i.e.
      what the end-to-end export packs the text into.
    """
    needed = seq_length - 2  # room for [CLS] and [SEP]
    words = PASSAGE.split()
    # BERT's basic tokenizer splits on whitespace first, so the count of a prefix is the
    # sum of its words' counts.
    counts = [len(ids) for ids in tokenizer.encode(words)]
    repeats = -(-needed // sum(counts))  # ceil
    words, counts = words * repeats, counts * repeats
    used = int(np.searchsorted(np.cumsum(counts), needed)) + 1
    text = " ".join(words[:used])
    pieces = tokenizer.encode([text])[0]
    if len(pieces) < needed:
        raise AssertionError(f"the text has {len(pieces)} wordpieces, expected >= {needed}")
    word_ids = np.array([[tokenizer.cls_id, *pieces[:needed], tokenizer.sep_id]], np.int32)
    return text, {"input_word_ids": word_ids, "input_mask": np.ones_like(word_ids),
                  "input_type_ids": np.zeros_like(word_ids)}


def _to_numpy(outputs) -> dict:
    """Materialises every output on the host, as a client receiving them would."""
    return {name: value.numpy() for name, value in outputs.items()}


# --------------------------------------------------------------------------------------
# Rows: each builder returns a function making one timed request.


def ours_end_to_end(config, vocab_file, text, ids, seq_length, work_dir):
    """Our classifier export, text in; checks it against the Keras model on `ids`."""
    import keras
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops the export uses)

    from bert_keras import BertEncoder
    from bert_keras.tasks import BertClassifier
    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import export_classifier

    keras.utils.set_random_seed(SEED)
    classifier = BertClassifier(BertEncoder.from_bert_config(config), num_classes=len(LABELS))
    path = export_classifier(classifier, BertTokenizer(vocab_file), LABELS,
                             os.path.join(work_dir, "ours_classifier"), seq_length=seq_length)
    loaded = tf.saved_model.load(path)
    request_text = tf.constant([text])
    # Same logits from text as the Keras model from the ids the other rows get: the export
    # packs the text to the full sequence.
    np.testing.assert_allclose(
        loaded.signatures["serving_default"](text=request_text)["logits"].numpy(),
        classifier(ids, training=False)["logits"].numpy(), rtol=1e-4, atol=1e-4)
    # The request references `loaded`, not just its function: a restored function whose
    # object was garbage-collected fails ("referencing variables which have been deleted").
    return lambda: _to_numpy(loaded.signatures["serving_default"](text=request_text))


def ours_encoder(config, vocab_file, ids, seq_length, work_dir):
    """Our encoder export, ids in."""
    import keras
    import tensorflow as tf

    from bert_keras import BertEncoder
    from export.export_encoder import export_encoder

    keras.utils.set_random_seed(SEED)
    encoder = BertEncoder.from_bert_config(config)
    path = export_encoder(encoder, os.path.join(work_dir, "ours_encoder"), str(vocab_file),
                          warmup_seq_length=seq_length)
    loaded = tf.saved_model.load(path)
    inputs = {name: tf.constant(value) for name, value in ids.items()}
    return lambda: _to_numpy(loaded.signatures["serving_default"](**inputs))


def keras_hub_classifier(config, ids, work_dir):
    """keras-hub's BertTextClassifier exported with Keras' own SavedModel export, ids in."""
    import keras
    import keras_hub
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    # Built from sizes: from_preset would download.
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        max_sequence_length=config.max_position_embeddings)
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=len(LABELS),
                                                preprocessor=None)
    path = os.path.join(work_dir, "keras_hub_classifier")
    model.export(path, format="tf_saved_model", verbose=False)
    loaded = tf.saved_model.load(path)
    inputs = {"token_ids": tf.constant(ids["input_word_ids"]),
              "segment_ids": tf.constant(ids["input_type_ids"]),
              "padding_mask": tf.constant(ids["input_mask"])}
    return lambda: loaded.serve(inputs).numpy()


def transformers_eager(config, ids):
    """transformers' BertForSequenceClassification on torch CPU, eager, ids in."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_act="gelu",
        max_position_embeddings=config.max_position_embeddings,
        num_labels=len(LABELS))).eval()
    inputs = {"input_ids": torch.from_numpy(ids["input_word_ids"]).long(),
              "attention_mask": torch.from_numpy(ids["input_mask"]).long(),
              "token_type_ids": torch.from_numpy(ids["input_type_ids"]).long()}

    def request():
        with torch.inference_mode():
            return model(**inputs).logits.numpy()

    return request


# --------------------------------------------------------------------------------------
# Timing


def time_requests(request, count: int) -> list[float]:
    """Latency in seconds of each of `count` consecutive requests."""
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        request()
        latencies.append(time.perf_counter() - start)
    return latencies


def interleaved_latencies(requests: dict, total: int, rounds: int) -> dict[str, list[float]]:
    """Times `total` requests per row, split over `rounds` rounds that visit every row.

    The first row of a round rotates, so no row always follows the same neighbour. Each
    row's turn starts with one untimed request (the switch from the previous row).
    """
    names = list(requests)
    latencies = {name: [] for name in names}
    for r in range(rounds):
        count = total // rounds + (r < total % rounds)
        for name in names[r % len(names):] + names[:r % len(names)]:
            gc.collect()  # outside the timing: a collection would land on one row
            requests[name]()
            latencies[name] += time_requests(requests[name], count)
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ms = np.array(latencies) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "min_ms": float(ms.min()), "requests": len(ms)}


def versions() -> dict[str, str]:
    from importlib import metadata

    return {p: metadata.version(p) for p in
            ("tensorflow", "tensorflow-text", "keras", "keras-hub", "torch", "transformers")}


def measure(rows, args) -> dict[str, list[float]]:
    """Builds every row, warms them all up, then times them; returns seconds per request."""
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
        work = contextlib.nullcontext(tempfile.mkdtemp(prefix="serving_latency_",
                                                       dir=args.work_dir))
    else:
        work = tempfile.TemporaryDirectory(prefix="serving_latency_")
    with work as work_dir:
        requests = {}
        for name, _, build in rows:
            start = time.perf_counter()
            requests[name] = build(work_dir)
            print(f"# {name}: ready in {time.perf_counter() - start:.0f} s", flush=True)
        for request in requests.values():  # after the last load: see the module docstring
            time_requests(request, args.warmup)
        latencies = interleaved_latencies(requests, args.requests, args.rounds)
    if args.work_dir:
        print(f"# exports kept in {work_dir}")
    return latencies


def report(rows, latencies, args, text):
    """Prints the markdown table (and writes --json): ratios are to the fastest peer's
    p50 and p99, each taken over the peer rows separately."""
    stats = {name: summary(latencies[name]) for name, _, _ in rows}
    peers = [name for name, peer, _ in rows if peer]
    best = {q: min(peers, key=lambda n: stats[n][q]) for q in ("p50_ms", "p99_ms")} if peers else {}
    if best:
        print(f"# fastest peer: p50 {best['p50_ms']}, p99 {best['p99_ms']}")
        print("| row | p50 ms | p99 ms | mean ms | p50 / fastest peer's | p99 / fastest peer's |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
    else:
        print("| row | p50 ms | p99 ms | mean ms |")
        print("| --- | ---: | ---: | ---: |")
    for name, s in stats.items():
        ratios = "".join(f" {s[q] / stats[peer][q]:.2f} |" for q, peer in best.items())
        print(f"| {name} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | {s['mean_ms']:.1f} |{ratios}")
    if args.json:
        results = {"args": vars(args), "versions": versions(), "text": text,
                   "fastest_peer": {q[:3]: peer for q, peer in best.items()},
                   "rows": [dict(name=name, peer=peer, **stats[name],
                                 latencies_ms=[t * 1e3 for t in latencies[name]])
                            for name, peer, _ in rows]}
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base", help="BertConfig preset: tiny ... large")
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--requests", type=int, default=200, help="timed requests per row")
    parser.add_argument("--rounds", type=int, default=10,
                        help="interleaved rounds the requests are split over")
    parser.add_argument("--warmup", type=int, default=10, help="untimed requests per row")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="TensorFlow intra-op threads and torch.set_num_threads")
    parser.add_argument("--only", default="", help="comma-separated substrings of row names")
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument("--work_dir", default="",
                        help="keep the exports in a new directory under this one "
                             "(default: a temporary directory, removed at exit)")
    args = parser.parse_args()
    if args.requests < args.rounds or args.rounds < 1:
        parser.error(f"need --requests >= --rounds >= 1. Received: --requests={args.requests} "
                     f"--rounds={args.rounds}")

    # Before TensorFlow creates its thread pools (the first op) and before any torch op.
    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    torch.set_num_threads(args.threads)

    from bert_keras import BertConfig
    from public_data import fetch
    from data_prep.tokenization import BertTokenizer

    config = BertConfig.from_preset(args.preset)
    if args.seq_length > config.max_position_embeddings:
        parser.error(f"--seq_length={args.seq_length} exceeds the preset's "
                     f"{config.max_position_embeddings} positions")
    vocab_file = fetch.bert_base_uncased_vocab()
    text, ids = filling_text(BertTokenizer(vocab_file), args.seq_length)

    rows = [  # name, peer?, builder(work_dir) -> request()
        ("ours end-to-end (text in)", False,
         lambda d: ours_end_to_end(config, vocab_file, text, ids, args.seq_length, d)),
        ("ours encoder (ids in)", False,
         lambda d: ours_encoder(config, vocab_file, ids, args.seq_length, d)),
        ("keras-hub BertTextClassifier export (ids in)", True,
         lambda d: keras_hub_classifier(config, ids, d)),
        ("transformers BertForSequenceClassification eager (ids in)", True,
         lambda d: transformers_eager(config, ids)),
    ]
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    rows = [row for row in rows if not only or any(o in row[0] for o in only)]
    if not rows:
        parser.error(f"--only={args.only!r} matches no row")

    print(f"# {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} "
          f"V={config.vocab_size}, 2 classes; batch 1, seq {args.seq_length} "
          f"({len(text.split())}-word text); threads={args.threads}; {args.requests} requests "
          f"per row over {args.rounds} interleaved rounds after {args.warmup} warm-up requests",
          flush=True)
    report(rows, measure(rows, args), args, text)


if __name__ == "__main__":
    main()
