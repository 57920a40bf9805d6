"""Length-adaptive text-in exports (export/length_buckets.py), TF Serving's batching
parameters (export/batching_parameters.py) and exports whatever KERAS_BACKEND says.

The reference for "the same outputs" is the fixed-length run: the same modules with
buckets=() (every request at max_seq_length, what the exports did before buckets), and for
the classifier the Keras model on ids packed by the Python tokenizer and
data_prep.packing (tests/test_export.py's `_keras_probabilities`).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TINY, tf212_python
from test_export import _keras_probabilities, write_vocab

from bert_keras import BertEncoder
from bert_keras.tasks import BertClassifier, BertSpanQA, BertTagger
from data_prep import schema
from export import batching_parameters, length_buckets
from export.saved_model_writer import ExportError

S = 32  # max_seq_length of these exports; TINY's position table has 40 rows
BUCKETS = (8, 16, 24)  # resolve() appends S


def texts_of(lengths, offset=0):
    """One text per length, of that many words w<i> (each one WordPiece of write_vocab's)."""
    return [" ".join(f"w{(offset + 7 * i + j) % 90}" for j in range(n))
            for i, n in enumerate(lengths)]


# Word counts around every bucket edge (packed length = words + 2), past S, and empty.
LENGTHS = [0, 1, 5, 6, 7, 13, 14, 15, 21, 22, 23, 29, 30, 31, 45]


def test_resolve_caps_sorts_and_ends_with_max_seq_length():
    assert length_buckets.resolve(None, 128) == (16, 24, 32, 48, 64, 96, 128)
    assert length_buckets.resolve(None, 384)[-4:] == (224, 256, 320, 384)
    assert length_buckets.resolve((64, 16, 500, 16), 100) == (16, 64, 100)
    assert length_buckets.resolve((), 128) == (128,)  # fixed length
    assert length_buckets.resolve((128,), 128) == (128,)


@pytest.mark.integration  # Two exports and verify's fresh processes: about 1 min.
def test_a_bucket_below_the_least_length_is_refused_before_anything_is_written(modules,
                                                                              tmp_path):
    """A bucket shorter than the least --max_seq_length (5 where pairs are packed, 3 for one
    text) was taken: the pair signature never ran at it, so the export's own verify failed
    it ("no pair warmup request runs at length bucket 2"; seam probe, 2026-12-07). Now
    refused in one line before anything is written; the least buckets themselves verify."""
    from export.export_classifier import export_classifier
    from export.export_tagger import export_tagger
    from export.verify import verify

    assert length_buckets.resolve((5, 8), 16, least=5) == (5, 8, 16)
    with pytest.raises(ExportError, match=r"^--length_buckets: lengths must be at least 5 "
                                          r"\(why\)\. Received: 8,4$"):
        length_buckets.resolve((8, 4), 16, least=5, why="why")
    tokenizer, tags = modules["tokenizer"], ["O", "B-X", "I-X"]
    classifier = BertClassifier(modules["encoder"], num_classes=2)
    tagger = BertTagger(modules["encoder"], len(tags))
    refusals = [
        (lambda: export_classifier(classifier, tokenizer, ["a", "b"], str(tmp_path / "pair"),
                                   seq_length=8, pair=True, buckets=(2, 4, 6)),
         r"at least 5 \(as --max_seq_length: room for a pair\)\. Received: 2,4,6$"),
        (lambda: export_tagger(tagger, tokenizer, tags, str(tmp_path / "tagger"), seq_length=8,
                               buckets=(1, 4)),
         r"at least 3 \(as --max_seq_length: room for one text\)\. Received: 1,4$")]
    for export, message in refusals:
        with pytest.raises(ExportError, match=r"^--length_buckets: lengths must be " + message):
            export()
    assert sorted(os.listdir(tmp_path)) == []
    for path in (export_classifier(classifier, tokenizer, ["a", "b"], str(tmp_path / "pair"),
                                   seq_length=8, pair=True, buckets=(5, 6)),
                 export_tagger(tagger, tokenizer, tags, str(tmp_path / "tagger"),
                               seq_length=8, buckets=(3, 4))):
        report = verify(path)
        assert report.ok, str(report)


@pytest.mark.parametrize("values", [["x"], ["16", "0"], ["-8"], ["1.5"]])
def test_bad_bucket_flags_are_one_line_errors(values):
    with pytest.raises(ExportError, match=r"^--length_buckets: expected comma-separated "
                       r"positive integers"):
        length_buckets.parse_flag(values)


def test_parse_flag():
    assert length_buckets.parse_flag(None) is None  # not given: the default
    assert length_buckets.parse_flag([]) == ()  # --length_buckets= : fixed length
    assert length_buckets.parse_flag(["16", " 32"]) == (16, 32)


@pytest.mark.parametrize("lengths,width,buckets,expected", [
    ([3, 17], 32, (16, 24, 32), 24),
    ([16, 2], 32, (16, 24, 32), 16),
    ([17], 32, (16, 24, 32), 24),
    ([33, 1], 40, (16, 24, 32, 40), 40),
    ([5], 40, (40,), 40),
    ([], 32, (16, 24, 32), 16),  # an empty batch
])
def test_bucket_length_is_the_smallest_bucket_holding_the_longest_row(lengths, width, buckets,
                                                                       expected):
    mask = (np.arange(width)[None, :] < np.array(lengths, np.int32)[:, None]).astype(np.int32)
    mask = mask.reshape(len(lengths), width)
    assert int(length_buckets.bucket_length(tf.constant(mask), buckets)) == expected


def test_pad_positions_fills_every_padding_position():
    mask = tf.constant([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    values = tf.constant([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])  # run at L = 4
    got = length_buckets.pad_positions(values, mask, -9.0).numpy()
    np.testing.assert_array_equal(got, [[1, 2, 3, -9, -9, -9], [5, 6, -9, -9, -9, -9]])


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """Bucketed and fixed-length preprocessors sharing one tokenizer, and a TINY encoder."""
    from data_prep.tokenization import BertTokenizer
    from export.export_preprocessor import PreprocessorModule

    tokenizer = BertTokenizer(write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt"))
    return {"tokenizer": tokenizer, "encoder": BertEncoder(**TINY),
            "bucketed": PreprocessorModule(tokenizer, S, buckets=BUCKETS),
            "fixed": PreprocessorModule(tokenizer, S, buckets=())}


def _batches(texts):
    """Each text alone (one bucket each), all together, and a short-only batch."""
    return [[t] for t in texts] + [texts, texts[:4]]


def test_encoder_runs_on_the_bucket_length(modules):
    pre, tokenizer = modules["bucketed"], modules["tokenizer"]
    assert pre.buckets == BUCKETS + (S,)
    for words in LENGTHS:
        packed, trimmed = pre.encoder_inputs([pre._tokenize(tf.constant(texts_of([words])))])
        real = min(words + 2, S)
        expected = min(b for b in pre.buckets if b >= real)
        assert trimmed[schema.INPUT_WORD_IDS].shape == (1, expected), words
        assert packed[schema.INPUT_WORD_IDS].shape == (1, S)
        for name in schema.MODEL_INPUT_NAMES:  # a cut of the packed inputs, all padding
            np.testing.assert_array_equal(trimmed[name], packed[name][:, :expected])
            assert not packed[schema.MODEL_INPUT_MASK][:, expected:].numpy().any()
    # The batch runs at its longest row's bucket.
    _, trimmed = pre.encoder_inputs([pre._tokenize(tf.constant(texts_of([3, 15, 1])))])
    assert trimmed[schema.MODEL_INPUT_MASK].shape == (3, 24)
    assert tokenizer.cls_id == int(trimmed[schema.INPUT_WORD_IDS][0, 0])


def test_preprocessor_bucketed_signatures_feed_the_encoder_at_the_bucket_length(modules):
    """The preprocessor export's `bucketed` signatures: its inputs cut to the bucket, which
    the encoder (any length) turns into the full-length run's outputs."""
    pre, encoder = modules["bucketed"], modules["encoder"]
    for words in ([3], [3, 15, 1], [40, 2]):
        texts = tf.constant(texts_of(words))
        full, cut = pre.serve(texts), pre.serve_bucketed(texts)
        width = min(b for b in pre.buckets if b >= min(max(words) + 2, S))
        assert cut[schema.INPUT_WORD_IDS].shape == (len(words), width)
        for name in schema.MODEL_INPUT_NAMES:
            np.testing.assert_array_equal(cut[name], full[name][:, :width])
        np.testing.assert_allclose(encoder(cut)["pooled_output"],
                                   encoder(full)["pooled_output"], atol=1e-5)
    pair = pre.serve_bucketed_pair(tf.constant(texts_of([4])), tf.constant(texts_of([9])))
    assert pair[schema.INPUT_TYPE_IDS].shape == (1, 16)  # 4 + 9 + 3 = 16


def test_warmup_texts_fill_every_bucket(modules):
    from data_prep.packing import pack

    pre, tokenizer = modules["bucketed"], modules["tokenizer"]
    for segments in (1, 2):
        texts = pre.warmup_texts(segments)
        assert len(texts) == len(pre.buckets)
        for bucket, request in zip(pre.buckets, texts):
            ids = tokenizer.encode(request)
            packed = pack(ids[0], ids[1] if segments == 2 else None, S, tokenizer.cls_id,
                          tokenizer.sep_id)
            assert len(packed.tokens) == bucket, (segments, bucket, request)


def test_warmup_texts_of_a_vocabulary_without_the_warmup_words(tmp_path):
    """A vocabulary that spells every word of the warmup text in several pieces (letters and
    a few words: a small or non-English one) takes whole words of its own; the export was
    refused before ("no word of the warmup text is a single WordPiece")."""
    import string

    from data_prep.packing import pack
    from data_prep.tokenization import BertTokenizer
    from export.export_preprocessor import WARMUP_TEXTS

    letters = list(string.ascii_lowercase)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters,
                                *[f"##{c}" for c in letters], "cat", "dog"]) + "\n")
    tokenizer = BertTokenizer(str(vocab))
    assert length_buckets.one_piece_words(tokenizer, WARMUP_TEXTS[2]) == []
    for segments in (1, 2):
        texts = length_buckets.warmup_texts(tokenizer, (8, 16), segments, WARMUP_TEXTS[2])
        for bucket, request in zip((8, 16), texts):
            ids = tokenizer.encode(request)
            packed = pack(ids[0], ids[1] if segments == 2 else None, 16, tokenizer.cls_id,
                          tokenizer.sep_id)
            assert len(packed.tokens) == bucket, (segments, bucket, request)


def test_warmup_questions_keep_within_the_query_length(tmp_path):
    """Span QA's warmup: the question at most --max_query_length WordPieces (the export cuts
    a longer one, and the request ran a bucket short), the context the rest of the bucket."""
    from data_prep.tokenization import BertTokenizer
    from export.export_preprocessor import WARMUP_TEXTS

    tokenizer = BertTokenizer(write_vocab(tmp_path / "vocab.txt"))
    texts = length_buckets.warmup_texts(tokenizer, (8, 16, 24), 2, WARMUP_TEXTS[2],
                                        first_at_most=3)
    # [CLS] q [SEP] c [SEP]: 8 = 3 + 2 + 3 (half of 5, rounded down, is within 3), then
    # 16 = 3 + 3 + 10 and 24 = 3 + 3 + 18.
    assert [[len(ids) for ids in tokenizer.encode(request)] for request in texts] == [
        [2, 3], [3, 10], [3, 18]]


def test_classifier_equals_the_fixed_length_export_and_keras(modules):
    from export.export_classifier import ClassifierModule

    classifier = BertClassifier(modules["encoder"], num_classes=3)
    labels = ["neg", "neu", "pos"]
    bucketed = ClassifierModule(modules["bucketed"], classifier, labels, pair=False)
    fixed = ClassifierModule(modules["fixed"], classifier, labels, pair=False)
    texts = texts_of(LENGTHS)
    for batch in _batches(texts):
        got = bucketed.serve(tf.constant(batch))
        want = fixed.serve(tf.constant(batch))
        np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-5)
        np.testing.assert_array_equal(got["label"], want["label"])
        np.testing.assert_allclose(got["probabilities"], _keras_probabilities(
            classifier, modules["tokenizer"], batch, seq_length=S), atol=1e-5)
    pair_a, pair_b = texts_of(LENGTHS), texts_of(LENGTHS[::-1], offset=3)
    got = bucketed.serve_pair(tf.constant(pair_a), tf.constant(pair_b))
    np.testing.assert_allclose(got["probabilities"], _keras_probabilities(
        classifier, modules["tokenizer"], pair_a, pair_b, seq_length=S), atol=1e-5)


@pytest.mark.integration  # Two more task modules traced: about 30 s on 2 cores.
def test_tagger_and_span_qa_equal_the_fixed_length_export(modules):
    from export.export_span_qa import SpanQAModule
    from export.export_tagger import TaggerModule

    tagger = BertTagger(modules["encoder"], 4)
    tags = ["O", "B", "I", "X"]
    bucketed, fixed = (TaggerModule(modules[k], tagger, tags) for k in ("bucketed", "fixed"))
    texts = texts_of(LENGTHS)
    for batch in _batches(texts):
        got, want = bucketed.serve(tf.constant(batch)), fixed.serve(tf.constant(batch))
        np.testing.assert_array_equal(got["tag_ids"], want["tag_ids"])
        np.testing.assert_array_equal(got["tags"], want["tags"])
        np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-5)
    qa = BertSpanQA(modules["encoder"])
    bucketed, fixed = (SpanQAModule(modules[k], qa, 5) for k in ("bucketed", "fixed"))
    questions = texts_of(LENGTHS[::-1], offset=11)
    for batch in _batches(list(zip(questions, texts))):
        question, context = (tf.constant([pair[i] for pair in batch]) for i in (0, 1))
        got, want = bucketed.serve(question, context), fixed.serve(question, context)
        assert got["start_logits"].shape == (len(batch), S)  # the documented shape
        for name in got:
            if got[name].dtype.is_floating:
                np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)
            else:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        # At real positions, the Keras model's logits on the packed ids.
        packed = {schema.INPUT_WORD_IDS: got["input_word_ids"].numpy(),
                  schema.INPUT_TYPE_IDS: got["input_type_ids"].numpy(),
                  schema.MODEL_INPUT_MASK: (got["input_word_ids"].numpy() != 0).astype(np.int32)}
        keras_out = qa(packed, training=False)
        real = packed[schema.MODEL_INPUT_MASK] == 1
        np.testing.assert_allclose(got["start_logits"].numpy()[real],
                                   np.asarray(keras_out["start_logits"])[real], atol=1e-5)
        assert (got["end_logits"].numpy()[~real] == length_buckets.PADDING_LOGIT).all()


def test_tagger_export_windows_long_requests_as_run_tagger_does(modules):
    """A request longer than S - 2 WordPieces is tagged as run_tagger tags the sentence
    (`data_prep.tagging.convert_sentences` + `predictions_to_tags`): every word from its
    max-context window, so a long Korean sentence is answered as predictions.conll is.
    Before, the export truncated it: the words past the first window got "" / -1."""
    from data_prep import tagging
    from export.export_tagger import TaggerModule

    tags = ["O", "B", "I", "X"]
    tagger = BertTagger(modules["encoder"], 4)
    texts = texts_of([45, 70, 3, 0, 31], offset=5)  # two and four windows at S = 32
    sentences = [tagging.TaggedSentence(f"x:{i}", tuple(t.split()), None)
                 for i, t in enumerate(texts)]
    for stride in (7, 15, 30):
        features, positions, stats = tagging.convert_sentences(
            sentences, modules["tokenizer"], None, S, doc_stride=stride)
        assert stats.split_sentences == 3 and stats.truncated_words == 0
        logits = np.asarray(tagger(schema.model_inputs(features), training=False)["logits"])
        want = tf.nn.softmax(logits, axis=-1).numpy()
        module = TaggerModule(modules["bucketed"], tagger, tags, doc_stride=stride)
        got = module.serve(tf.constant(texts))
        assert (got["tag_ids"].numpy() >= 0).sum() == sum(len(t.split()) for t in texts)
        expected = tagging.predictions_to_tags(logits.argmax(-1), positions, tags)
        for row, places in enumerate(positions):
            np.testing.assert_allclose(got["probabilities"].numpy()[row, :len(places)],
                                       np.reshape([want[r, p] for r, p in places], (-1, 4)),
                                       atol=1e-5)
            assert [t.decode() for t in got["tags"].numpy()[row, :len(places)]] == \
                expected[row], (stride, row)
        words = module.serve_words(tf.constant(
            [t.split() + [""] * (70 - len(t.split())) for t in texts]))
        np.testing.assert_array_equal(words["tag_ids"], got["tag_ids"])
    truncating = TaggerModule(modules["fixed"], tagger, tags)  # doc_stride=0: as before
    assert (truncating.serve(tf.constant(texts[:1]))["tag_ids"].numpy()[0, S - 2:] == -1).all()
    with pytest.raises(ExportError, match=r"^--doc_stride=31 must be 0 \(truncate\) to "
                                          r"--max_seq_length - 2 \(30\)"):
        TaggerModule(modules["fixed"], tagger, tags, doc_stride=31)


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # an export replaying every warmup request: ~40 s on 2 cores (the default suite's time)
def test_tagger_export_warms_both_signatures_in_every_bucket(modules, tmp_path):
    """The tagger's warmup requests reach every bucket through `serving_default` and
    `words` (docs/serving.md: every bucket of every text signature); a tagger fine-tuned at
    a length too short for a pair (run_tagger takes 3) exports and answers."""
    from data_prep.packing import pack
    from export.export_tagger import export_tagger
    from export.saved_model_writer import WARMUP_FILE, read_warmup_requests

    tokenizer = modules["tokenizer"]
    tags = ["O", "B", "I", "X"]
    path = export_tagger(BertTagger(modules["encoder"], 4), tokenizer, tags,
                         str(tmp_path / "tagger"), seq_length=S, buckets=BUCKETS)
    covered = {}
    for name, inputs in read_warmup_requests(os.path.join(path, WARMUP_FILE)):
        rows = ([[t.decode()] for t in inputs["text"]] if name == "serving_default" else
                [[w.decode() for w in row if w] for row in inputs["words"]])
        for row in rows:
            ids = [i for piece in tokenizer.encode(row or [""]) for i in piece]
            real = len(pack(ids, None, S, tokenizer.cls_id, tokenizer.sep_id).tokens)
            covered.setdefault(name, set()).add(min(b for b in BUCKETS + (S,) if b >= real))
    assert covered == {"serving_default": set(BUCKETS + (S,)), "words": set(BUCKETS + (S,))}
    short = export_tagger(BertTagger(modules["encoder"], 4), tokenizer, tags,
                          str(tmp_path / "short"), seq_length=3)
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    got = tf.saved_model.load(short).signatures["serving_default"](text=tf.constant(["w1 w2"]))
    assert got["tags"].numpy()[0][0].decode() in tags
    with pytest.raises(ExportError, match=r"^--max_seq_length must be at least 3 \(room for one"):
        export_tagger(BertTagger(modules["encoder"], 4), tokenizer, tags,
                      str(tmp_path / "shorter"), seq_length=2)


def test_span_qa_question_length_must_leave_room_for_context(modules):
    """--max_query_length as run_squad checks it: below max_seq_length - 3; by default 64,
    or what a short window leaves (S - 4)."""
    from export.export_span_qa import SpanQAModule

    qa = BertSpanQA(modules["encoder"])
    with pytest.raises(ExportError, match=rf"--max_query_length={S - 3} must be >= 1 and leave "
                       rf"room for context in --max_seq_length={S}"):
        SpanQAModule(modules["fixed"], qa, 5, max_query_length=S - 3)
    assert SpanQAModule(modules["fixed"], qa, 5).max_query_length == S - 4
    with pytest.raises(ExportError, match=r"--doc_stride must be >= 1. Received: 0"):
        SpanQAModule(modules["fixed"], qa, 5, doc_stride=0)


@pytest.mark.integration  # Two span-QA modules traced: about 45 s on 2 cores.
def test_span_qa_packs_run_squads_windows_and_says_no_answer_for_squad_2(modules, tmp_path):
    """The text signature packs what run_squad's converter makes of the same question and
    context (the question cut to max_query_length, the context in windows doc_stride apart)
    and answers from one of those windows; null_odds is the smallest [CLS] score over the
    windows minus the best span's (by brute force over every window's logits and
    run_squad's max-context flags), and a SQuAD 2.0 export answers "" where it exceeds the
    threshold, as run_squad predicts."""
    import json

    from data_prep import squad
    from export.export_span_qa import SpanQAModule

    tokenizer, qa = modules["tokenizer"], BertSpanQA(modules["encoder"])
    questions = texts_of([2, 6, 11, 20], offset=11)
    contexts = texts_of([40, 3, 20, 1])
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [
        {"context": c, "qas": [{"id": f"q{i}", "question": q, "answers": []}]}
        for i, (q, c) in enumerate(zip(questions, contexts))]}]}))
    examples, _ = squad.read_squad(str(path), is_training=False)
    arrays, windows, _ = squad.convert_examples(examples, tokenizer, S, 8, 6, False)
    logits = qa(schema.model_inputs(arrays), training=False)
    start, end = np.asarray(logits["start_logits"]), np.asarray(logits["end_logits"])
    v1 = SpanQAModule(modules["fixed"], qa, 5, max_query_length=6, doc_stride=8)
    out = {k: v.numpy() for k, v in v1.serve(tf.constant(questions),
                                             tf.constant(contexts)).items()}
    odds = []
    for row in range(len(questions)):
        mine = [i for i, w in enumerate(windows) if w.example_index == row]
        assert out["windows"][row] == len(mine)
        same = [i for i in mine if (arrays["input_ids"][i] == out["input_word_ids"][row]).all()]
        assert len(same) == 1 and (arrays["segment_ids"][same[0]] == out["input_type_ids"][row]).all()
        best = max(start[w, i] + end[w, j] for w in mine
                   for i, first in windows[w].token_is_max_context.items() if first
                   for j in windows[w].token_to_orig_map if 0 <= j - i < 5)
        odds.append(min(start[w, 0] + end[w, 0] for w in mine) - best)
    assert max(out["windows"]) > 1
    np.testing.assert_allclose(out["null_odds"], odds, atol=1e-5)
    threshold = float(np.median(odds))
    v2 = SpanQAModule(modules["fixed"], qa, 5, max_query_length=6, version_2_with_negative=True,
                      null_score_diff_threshold=threshold, doc_stride=8)
    got = v2.serve(tf.constant(questions), tf.constant(contexts))
    none = np.asarray(odds) > threshold
    assert 0 < none.sum() < len(questions)
    assert list(got["answer"].numpy()[none]) == [b""] * none.sum()
    assert (got["answer_start"].numpy()[none] == -1).all()
    np.testing.assert_array_equal(got["answer_start"].numpy()[~none],
                                  out["answer_start"][~none])
    assert all(got["answer"].numpy()[~none])


# --- TF Serving's batching parameters. ---

def batching_parameters_message():
    """tensorflow.serving.BatchingParameters.

    tensorflow-serving-api (2.21) ships the API and config protos (apis/, config/) but not
    tensorflow_serving/servables/tensorflow/session_bundle_config.proto, where TF Serving
    defines BatchingParameters, and none of the shipped messages has its fields. So unless a
    later package ships it, the message is built here from that file's definition (fields,
    numbers and types as in TF Serving's repository), with the google.protobuf wrappers the
    protobuf package ships, and text_format parses strictly: an unknown field, a wrong type
    or a malformed line is an error, as in TF Serving's ParseProtoTextFile.
    """
    try:
        from tensorflow_serving.servables.tensorflow import session_bundle_config_pb2
        return session_bundle_config_pb2.BatchingParameters
    except ImportError:
        pass
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="session_bundle_config_batching.proto", package="tensorflow.serving",
        syntax="proto3", dependency=["google/protobuf/wrappers.proto"])
    message = proto.message_type.add(name="BatchingParameters")
    for name, number, wrapper in [("max_batch_size", 1, "Int64Value"),
                                  ("batch_timeout_micros", 2, "Int64Value"),
                                  ("max_enqueued_batches", 3, "Int64Value"),
                                  ("num_batch_threads", 4, "Int64Value"),
                                  ("thread_pool_name", 5, "StringValue"),
                                  ("enable_large_batch_splitting", 8, "BoolValue"),
                                  ("max_execution_batch_size", 9, "Int64Value")]:
        message.field.add(name=name, number=number, type=field.TYPE_MESSAGE,
                          label=field.LABEL_OPTIONAL, type_name=f".google.protobuf.{wrapper}")
    message.field.add(name="allowed_batch_sizes", number=6, type=field.TYPE_INT64,
                      label=field.LABEL_REPEATED)
    message.field.add(name="pad_variable_length_inputs", number=7, type=field.TYPE_BOOL,
                      label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(proto.SerializeToString())
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


def parse_batching_parameters(text):
    from google.protobuf import text_format

    return text_format.Parse(text, batching_parameters_message()())


@pytest.mark.parametrize("buckets,largest", [
    ((16, 24, 32, 48, 64, 96, 128), 8),  # 128 / 16
    ((16, 24, 32, 48, 64, 96, 128, 192, 256, 384), 16),  # 384 / 16 = 24, down to 16
    ((16, 512), 32),
    ((8, 4096), 32),  # at most LARGEST_BATCH
    ((128,), 1),  # fixed length: a batch buys nothing over the long requests
])
def test_batching_parameters_parse_with_tf_servings_schema(buckets, largest):
    """TF Serving 2.12's BatchingParameters (session_bundle_config.proto at tag 2.12.1):
    batches of at most `largest` rows, requests of up to QUEUED_ROWS texts split across
    them, and no allowed sizes (TF Serving's rule that the last equals max_batch_size would
    make every request at most one batch)."""
    params = parse_batching_parameters(batching_parameters.text_for(buckets))
    assert params.max_execution_batch_size.value == largest
    assert params.enable_large_batch_splitting.value is True
    assert params.max_batch_size.value == batching_parameters.QUEUED_ROWS == 256
    assert list(params.allowed_batch_sizes) == []
    assert params.max_enqueued_batches.value * largest == batching_parameters.QUEUED_ROWS
    assert params.batch_timeout_micros.value == batching_parameters.BATCH_TIMEOUT_MICROS
    assert params.num_batch_threads.value == batching_parameters.NUM_BATCH_THREADS
    assert params.pad_variable_length_inputs is False


def test_unsplit_requests_are_at_most_one_batch_of_the_largest_size():
    """The tagger's outputs are as wide as a batch's longest row, so TF Serving could not
    concatenate a request's pieces: its requests are not split, and a batch (so a request)
    takes up to LARGEST_BATCH texts."""
    for buckets in ((16, 24, 32, 48, 64, 96, 128), (128,)):
        params = parse_batching_parameters(batching_parameters.text_for(buckets, False))
        assert not params.HasField("enable_large_batch_splitting")
        assert not params.HasField("max_execution_batch_size")
        assert params.max_batch_size.value == batching_parameters.LARGEST_BATCH == 32
        assert params.max_enqueued_batches.value * 32 == batching_parameters.QUEUED_ROWS
        assert list(params.allowed_batch_sizes) == []


def test_the_schema_is_strict():
    from google.protobuf import text_format

    with pytest.raises(text_format.ParseError):
        parse_batching_parameters("max_batch_size { value: 8 }\nmax_batch_sise { value: 8 }\n")
    with pytest.raises(text_format.ParseError):
        parse_batching_parameters("max_batch_size: 8\n")  # a wrapper, not a bare int


def test_batching_file_beside_the_versions_is_never_overwritten(tmp_path):
    text = batching_parameters.text_for((16, 128))
    path = batching_parameters.write_beside(str(tmp_path / "m"), text)
    assert path == str(tmp_path / "m" / "batching_parameters.txt")
    assert open(path).read() == text
    mtime = os.stat(path).st_mtime_ns
    assert batching_parameters.write_beside(str(tmp_path / "m"), text) == path  # same: kept
    assert os.stat(path).st_mtime_ns == mtime
    other = batching_parameters.text_for((16, 384))
    with pytest.raises(ExportError, match="exists with other batching parameters: refusing "
                       "to overwrite"):
        batching_parameters.write_beside(str(tmp_path / "m"), other)
    assert open(path).read() == text
    assert sorted(os.listdir(tmp_path / "m")) == ["batching_parameters.txt"]



def test_batching_file_beside_is_judged_alike_local_and_remote(tmp_path):
    """The same bytes get the same verdict in a local directory and on a remote file system
    (ram://, read through tf.io.gfile as gs:// is): kept when they say the parameters with
    any line ends (write_beside on Windows writes "\\r\\n"), refused otherwise."""
    text = batching_parameters.text_for((16, 128))
    other = batching_parameters.text_for((16, 384))
    cases = {  # bytes -> whether check_beside keeps them (False: nothing to write)
        text.encode(): "same",
        text.replace("\n", "\r\n").encode(): "same",
        text.replace("\n", "\r").encode(): "same",
        other.encode(): "refused",
        text.replace("\n", "\r\n").encode()[:-2]: "refused",  # no final line end
        b"\xef\xbb\xbf" + text.encode(): "refused",  # a byte-order mark is a change
        text.encode().replace(b"16", b"\xff\xfe"): "refused",  # not UTF-8
    }
    for i, (data, expected) in enumerate(cases.items()):
        verdicts = []
        for directory in (str(tmp_path / f"local{i}"), f"ram://batching{i}"):
            tf.io.gfile.makedirs(directory)
            with tf.io.gfile.GFile(f"{directory}/{batching_parameters.FILE_NAME}", "wb") as f:
                f.write(data)
            try:
                verdicts.append("write" if batching_parameters.check_beside(directory, text)
                                else "same")
            except ExportError as e:
                assert "exists with other batching parameters" in str(e)
                verdicts.append("refused")
        assert verdicts == [expected, expected], (data, verdicts)
    assert batching_parameters.check_beside("ram://batching-none", text)  # nothing there
    assert batching_parameters.check_beside(str(tmp_path / "none"), text)

# --- Whole exports: files, warmup, verify, the TF 2.12 process, KERAS_BACKEND=jax. ---

def in_tf212(tmp_path, path, texts, output):
    """The text-in export at `path` run in the TF 2.12.1 + tensorflow-text 2.12.1 process
    (stock TF Serving's versions; no project code): {"versions", "one": `output` of each
    text alone, "all": of all of them as one batch}. Skips the test without that process."""
    python = tf212_python()
    if python is None:
        pytest.skip("no tensorflow 2.12.1 interpreter (set BERT_KERAS_TF212_PYTHON; "
                    "bench/tf_text_2_12_compat.py shows how to make one)")
    script = ("import json, sys\n"
              "import tensorflow as tf, tensorflow_text\n"
              "fn = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
              "texts, output = json.loads(sys.argv[2]), sys.argv[3]\n"
              "print(json.dumps({'versions': [tf.__version__, tensorflow_text.__version__],\n"
              "  'one': [fn(text=tf.constant([t]))[output].numpy()[0].tolist()\n"
              "          for t in texts],\n"
              "  'all': fn(text=tf.constant(texts))[output].numpy().tolist()}))\n")
    result = subprocess.run([python, "-c", script, path, json.dumps(texts), output],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["versions"] == ["2.12.1", "2.12.1"]
    return got


@pytest.mark.integration  # Three classifier exports, verify and a TF 2.12 process: ~3 min.
def test_classifier_export_files_warmup_verify_and_stock_serving(modules, tmp_path):
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    from export.export_classifier import export_classifier
    from export.saved_model_writer import WARMUP_FILE, read_warmup_requests
    from export.verify import verify

    tokenizer = modules["tokenizer"]
    classifier = BertClassifier(modules["encoder"], num_classes=2)
    export_dir = str(tmp_path / "clf")
    path = export_classifier(classifier, tokenizer, ["ham", "spam"], export_dir, seq_length=S,
                             buckets=BUCKETS)
    beside = open(os.path.join(export_dir, "batching_parameters.txt")).read()
    assert open(os.path.join(path, "batching_params.pbtxt")).read() == beside
    assert parse_batching_parameters(beside).max_execution_batch_size.value == 4  # 32 / 8
    # The same settings again: a new version, the file beside it kept.
    export_classifier(classifier, tokenizer, ["ham", "spam"], export_dir, seq_length=S,
                      buckets=BUCKETS)
    # Other buckets: refused before anything is written.
    with pytest.raises(ExportError, match="batching_parameters.txt exists"):
        export_classifier(classifier, tokenizer, ["ham", "spam"], export_dir, seq_length=S,
                          buckets=(16,))
    assert sorted(os.listdir(export_dir)) == ["1", "2", "batching_parameters.txt"]

    # Warmup requests land in every bucket, in every text signature.
    from data_prep.packing import pack

    covered = {}
    for name, inputs in read_warmup_requests(os.path.join(path, WARMUP_FILE)):
        if name == "serve_examples":
            continue
        segments = [inputs[k] for k in ("text", "text_a", "text_b") if k in inputs]
        for row in zip(*segments):
            ids = tokenizer.encode([t.decode() for t in row])
            real = len(pack(ids[0], ids[1] if len(ids) == 2 else None, S, tokenizer.cls_id,
                            tokenizer.sep_id).tokens)
            covered.setdefault(name, set()).add(min(b for b in BUCKETS + (S,) if b >= real))
    assert covered == {"serving_default": set(BUCKETS + (S,)), "pair": set(BUCKETS + (S,))}

    report = verify(path)
    assert report.ok, str(report)

    texts = texts_of(LENGTHS)
    loaded = tf.saved_model.load(path).signatures["serving_default"]
    here = [loaded(text=tf.constant([t]))["probabilities"].numpy()[0] for t in texts]
    np.testing.assert_allclose(here, _keras_probabilities(classifier, tokenizer, texts,
                                                          seq_length=S), atol=1e-5)
    got = in_tf212(tmp_path, path, texts, "probabilities")
    np.testing.assert_allclose(got["one"], here, atol=1e-5)
    np.testing.assert_allclose(got["all"], here, atol=1e-5)


def classifier_run(tmp_path, max_seq_length, steps, pair=False):
    """tmp_path/run: a TINY classifier directory as run_classifier writes it (two labels,
    eight texts of write_vocab's words; with `pair`, a second text each)."""
    from bert_keras import run_classifier

    vocab = write_vocab(tmp_path / "vocab.txt")
    encoder = str(tmp_path / "encoder.keras")
    BertEncoder(**TINY).save(encoder)
    with open(tmp_path / "train.jsonl", "w") as f:
        for i in range(8):
            second = {"text_b": texts_of([2 + i % 3])[0]} if pair else {}
            f.write(json.dumps({"text": texts_of([3 + i])[0], **second,
                                "label": "ab"[i % 2]}) + "\n")
    run_classifier.run(train_file=str(tmp_path / "train.jsonl"),
                       output_dir=str(tmp_path / "run"), init_checkpoint=encoder,
                       vocab_file=vocab, do_train=True, max_seq_length=max_seq_length,
                       train_batch_size=4, num_train_steps=steps,
                       text_b_column="text_b" if pair else None)
    return tmp_path / "run"


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # A tool process on a KERAS_BACKEND=jax environment: about 1 min.
def test_export_tool_runs_on_tensorflow_whatever_keras_backend_says(modules, tmp_path):
    """A classifier directory as run_classifier writes it, exported from a shell where
    KERAS_BACKEND=jax (a user who trained on JAX): the export runs on TensorFlow and says so
    in one line. Given no --max_seq_length or --pair, it takes those the classifier was
    fine-tuned with (a pair task at 16)."""
    classifier_run(tmp_path, max_seq_length=16, steps=1, pair=True)
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-m", "export.export_classifier", f"--model_dir={tmp_path / 'run'}",
         f"--export_dir={tmp_path / 'models'}", "--length_buckets=8"],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(tmp_path / "models" / "1")
    said = [line for line in result.stderr.splitlines() if "Keras backend:" in line]
    assert len(said) == 1 and said[0].endswith(
        "Keras backend: tensorflow (KERAS_BACKEND=jax from the environment is for training; "
        "exports write TensorFlow SavedModels)"), result.stderr[-3000:]
    params = parse_batching_parameters(
        open(tmp_path / "models" / "batching_parameters.txt").read())
    assert params.max_execution_batch_size.value == 2  # 16 / 8: as fine-tuned
    assert "Sequence length: 16, as fine-tuned (train_results.json" in result.stderr
    assert "Sentence pairs: True, as fine-tuned" in result.stderr
    # serve_examples (TF Serving's Classify API) reads text_b: the pair signature's scores.
    import tensorflow_text  # noqa: F401  (the export holds its ops)

    from export.export_classifier import _example

    loaded = tf.saved_model.load(str(tmp_path / "models" / "1"))
    first, second = texts_of([5, 9]), texts_of([7, 3])
    pair = loaded.signatures["pair"](text_a=tf.constant(first), text_b=tf.constant(second))
    examples = tf.constant([_example(a, b) for a, b in zip(first, second)])
    scores = loaded.signatures["serve_examples"](inputs=examples)["scores"]
    np.testing.assert_allclose(scores, pair["probabilities"], rtol=0, atol=1e-7)
    # (A tiny model after one step: the second text moves the probabilities by about 1e-5.)
    single = loaded.signatures["serving_default"](text=tf.constant(first))["probabilities"]
    assert np.abs(single.numpy() - pair["probabilities"].numpy()).max() > 2e-6
