"""export.verify on the tagger and span-QA exports: their signatures, checked name by name
with dtypes and shapes, and the lengths of every text-in export (its serving length against
the position table, and warmup requests at every length bucket)."""

import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY
from export import batching_parameters, saved_model_writer
from export.saved_model_writer import WARMUP_FILE, read_warmup_requests, warmup_record
from export.verify import (Report, _check_bucket_lengths, _check_signatures, _export_kinds,
                           _packed_lengths, _signature_problems, verify)
from test_export import write_vocab

CONFIG = dict(TINY, vocab_size=41, num_layers=2, max_sequence_length=23)
S = 19  # both exports' --max_seq_length
TAG_BUCKETS = (5, 11)  # the tagger's --length_buckets (19 is added)
# Span QA's: with --max_query_length=1 a question of half a bucket's WordPieces was cut to 1
# and every warmup request ran one bucket short: 15 was left unwarmed before the exporter's
# warmup questions kept within it.
QA_BUCKETS, QA_QUERY = (6, 9, 12, 15), 1


# --- Without exports. ---

def test_recorded_buckets_read_what_the_writer_wrote():
    for buckets in ((5, 11, 19), (384,), (16, 24, 32, 48, 64, 96, 128)):
        for split in (True, False):
            text = batching_parameters.text_for(buckets, split)
            assert batching_parameters.recorded_buckets(text) == buckets
    header = "# TF Serving batching parameters for length buckets "
    for first_line in ("", "max_batch_size { value: 32 }", header + "5,x,19 (written",
                       header + "11,5 (written", header + "0,5 (written", header + "5,5 (w"):
        assert batching_parameters.recorded_buckets(first_line + "\n") is None, first_line


def _spec(dtype, *shape):
    return {"dtype": dtype, "shape": list(shape)}


# What serving_probe listed for a tiny tagger export (3 tags) and a span-QA export at
# --max_seq_length=19 (export/export_tagger.py and export_span_qa.py document them).
TAGGER_OUTPUTS = {"tag_ids": _spec("int32", None, None), "num_words": _spec("int32", None),
                  "probabilities": _spec("float32", None, None, 3),
                  "tags": _spec("string", None, None), "words": _spec("string", None, None)}
TAGGER = {"serving_default": {"inputs": {"text": _spec("string", None)},
                              "outputs": TAGGER_OUTPUTS},
          "words": {"inputs": {"words": _spec("string", None, None)},
                    "outputs": TAGGER_OUTPUTS}}
SPAN_QA = {
    "serving_default": {
        "inputs": {"context": _spec("string", None), "question": _spec("string", None)},
        "outputs": {"answer_char_end": _spec("int32", None), "null_odds": _spec("float32", None),
                    "input_word_ids": _spec("int32", None, 19),
                    "answer_char_start": _spec("int32", None),
                    "start_logits": _spec("float32", None, 19),
                    "answer_end": _spec("int32", None), "windows": _spec("int32", None),
                    "input_type_ids": _spec("int32", None, 19),
                    "answer_start": _spec("int32", None), "window_start": _spec("int32", None),
                    "answer": _spec("string", None), "end_logits": _spec("float32", None, 19)}},
    "ids": {"inputs": {k: _spec("int32", None, None)
                       for k in ("input_mask", "input_type_ids", "input_word_ids")},
            "outputs": {"start_logits": _spec("float32", None, None),
                        "end_logits": _spec("float32", None, None)}}}


def _names(**signatures):
    """A listing with these signatures: name -> (input names, output names)."""
    return {name: {"inputs": {k: _spec("string", None) for k in ins},
                   "outputs": {k: _spec("float32", None) for k in outs}}
            for name, (ins, outs) in signatures.items()}


def test_the_kind_of_every_export_and_of_mixed_ones():
    ids = ("input_word_ids", "input_mask", "input_type_ids")
    classifier = _names(serving_default=(["text"], ["probabilities", "label", "label_id", "logits"]),
                        pair=(["text_a", "text_b"], ["probabilities", "label", "label_id", "logits"]),
                        serve_examples=(["inputs"], ["classes", "scores"]))
    regressor = _names(serving_default=(["text"], ["score"]),
                       serve_examples=(["inputs"], ["outputs"]))
    character_tagger = _names(serving_default=(["text"], [
        "units", "unit_starts", "unit_ends", "tags", "tag_ids", "probabilities", "num_units",
        "entities", "entity_types", "entity_starts", "entity_ends", "num_entities"]))
    listings = {
        "encoder": _names(serving_default=(ids, ["pooled_output", "sequence_output",
                                                 "encoder_outputs", "default"]),
                          encoder=(ids, ["pooled_output"]), mlm=(ids, ["mlm_logits"])),
        "preprocessor": _names(serving_default=(["text"], ids), pair=(["text_a", "text_b"], ids),
                               bucketed=(["text"], ids), tokenize=(["text"], ["token_ids"]),
                               special_tokens=([], ["cls_id"])),
        "classifier": classifier, "regressor": regressor, "tagger": TAGGER,
        "character tagger": character_tagger, "span QA": SPAN_QA,
    }
    kinds = {name: _export_kinds(listing) for name, listing in listings.items()}
    assert kinds == {"encoder": ["encoder"], "preprocessor": ["preprocessor"],
                     "classifier": ["classifier"], "regressor": ["regressor"],
                     "tagger": ["tagger"], "character tagger": ["tagger"],
                     "span QA": ["span_qa"]}
    # Damaged exports keep their kind: a tagger without its words signature or its tags, a
    # span QA export without ids or with its inputs renamed, a classifier without
    # probabilities (its probabilities are no tagger's mark).
    no_words = {"serving_default": TAGGER["serving_default"]}
    renamed = {k: {"inputs": v["inputs"], "outputs": {("tag" if o == "tags" else o): s
                                                      for o, s in v["outputs"].items()}}
               for k, v in TAGGER.items()}
    qa_inputs = {"serving_default": {"inputs": {"q": _spec("string", None)},
                                     "outputs": SPAN_QA["serving_default"]["outputs"]}}
    no_probabilities = {k: v for k, v in classifier.items()}
    no_probabilities["serving_default"] = {"inputs": {"text": _spec("string", None)},
                                           "outputs": {"label": _spec("string", None)}}
    assert [_export_kinds(x) for x in (no_words, renamed, qa_inputs, no_probabilities)] == [
        ["tagger"], ["tagger"], ["span_qa"], ["classifier"]]
    # A classifier or regressor that lost serve_examples is known by serving_default's outputs.
    assert [_export_kinds({k: v for k, v in x.items() if k != "serve_examples"})
            for x in (classifier, regressor)] == [["classifier"], ["regressor"]]
    # One made otherwise: no kind; one that mixes two: both, which verify refuses to guess.
    assert _export_kinds(_names(serving_default=(["x"], ["y"]))) == []
    assert _export_kinds({**TAGGER, "ids": SPAN_QA["ids"]}) == ["tagger", "span_qa"]


@pytest.mark.parametrize("kind,outputs,api", [
    ("classifier", ["probabilities", "label", "label_id", "logits"], "Classify"),
    ("regressor", ["score"], "Regress")])
def test_a_classifier_or_regressor_without_serve_examples_fails_naming_it(kind, outputs, api,
                                                                          monkeypatch):
    """Before, such an export had no kind: its signatures line passed, listing names."""
    from export import saved_model_writer as writer

    monkeypatch.setattr(writer, "signature_method_names", lambda path: {})
    listing = _names(serving_default=(["text"], outputs))
    for name, spec in listing["serving_default"]["outputs"].items():
        spec.update(_spec(*{"label": ("string", None), "label_id": ("int32", None),
                            "score": ("float32", None)}.get(name, ("float32", None, 2))))
    report = Report("export/1")
    assert _check_signatures(report, listing, "export/1") == (kind, {})
    assert report.lines == [("signatures", False, f"no serve_examples signature (TF Serving's "
                                                  f"{api} API reads it)")]


def test_signature_problems_name_each_difference():
    from export.verify import SPAN_QA_SIGNATURES, TAGGER_SIGNATURES

    assert _signature_problems(TAGGER, TAGGER_SIGNATURES) == ([], {"C": 3})
    assert _signature_problems(SPAN_QA, SPAN_QA_SIGNATURES) == ([], {"S": 19})
    damaged = {k: {"inputs": dict(v["inputs"]), "outputs": dict(v["outputs"])}
               for k, v in TAGGER.items()}
    damaged["serving_default"]["outputs"]["tag"] = damaged["serving_default"]["outputs"].pop("tags")
    damaged["words"]["outputs"]["probabilities"] = _spec("float32", None, None, 4)
    damaged["words"]["outputs"]["num_words"] = _spec("int64", None)
    damaged["words"]["inputs"]["words"] = _spec("string", None)
    damaged["extra"] = TAGGER["words"]
    assert _signature_problems(damaged, TAGGER_SIGNATURES) == ([
        "unexpected signature extra",
        "serving_default has no output tags",
        "serving_default has unexpected outputs tag",
        "words input words is string [?], expected string [?, ?]",
        "words output probabilities is float32 [?, ?, 4], expected float32 [?, ?, 3]",
        "words output num_words is int64 [?], expected int32 [?]",
    ], {"C": 3})
    qa = {k: {"inputs": dict(v["inputs"]), "outputs": dict(v["outputs"])}
          for k, v in SPAN_QA.items() if k != "ids"}
    qa["serving_default"]["outputs"]["start_logits"] = _spec("float32", None, None)
    qa["serving_default"]["outputs"]["input_word_ids"] = _spec("int32", 4, 19)
    del qa["serving_default"]["outputs"]["answer"]
    assert _signature_problems(qa, SPAN_QA_SIGNATURES) == ([
        "serving_default has no output answer",
        "serving_default output start_logits is float32 [?, ?], expected float32 [?, S]",
        "serving_default output input_word_ids is int32 [4, 19], expected int32 [?, 19]",
        "no ids signature",
    ], {"S": 19})


def test_packed_lengths_counted_by_hand(tmp_path):
    """Each row's packed length, by kind and signature, against WordPieces counted by hand:
    "unaffable" is un ##aff ##able, "cat," is cat and ",", "zzz" and "" one [UNK] as a
    tagger's word."""
    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import _example

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "the", "cat",
        ",", "sat"]), encoding="utf-8")
    tokenizer = BertTokenizer(str(vocab))

    def lengths(kind, name, seq_length=20, characters=False, **inputs):
        return _packed_lengths(kind, characters, name, {
            k: np.array(v, dtype=object) for k, v in inputs.items()}, {}, tokenizer, seq_length)

    texts = [b"unaffable cat, sat", b"", b"the\xe3\x80\x80zzz"]  # U+3000 separates words
    assert lengths("tagger", "serving_default", text=texts) == [3 + 2 + 1 + 2, 2, 2 + 2]
    assert lengths("tagger", "serving_default", seq_length=7, text=texts) == [7, 2, 4]
    # Rows padded with "" at the end; a "" inside is a word of one [UNK].
    assert lengths("tagger", "words", words=[[b"the", b"", b"cat", b"", b""],
                                             [b"unaffable", b"", b"", b"", b""]]) == [5, 5]
    # A character tagger tokenizes the whole text: "cat," is two pieces, zzz one [UNK].
    assert lengths("tagger", "serving_default", characters=True, text=texts) == [8, 2, 4]
    for kind in ("classifier", "regressor"):
        assert lengths(kind, "serving_default", text=texts) == [8, 2, 4]
        assert lengths(kind, "pair", text_a=texts, text_b=[b"the", b"", b"sat sat"]) == [
            3 + 6 + 1, 3, 3 + 2 + 2]
        assert lengths(kind, "pair", seq_length=9, text_a=texts[:1], text_b=[b"the"]) == [9]
        assert lengths(kind, "serve_examples", inputs=[
            _example("the cat"), _example("unaffable", "sat")]) == [4, 3 + 3 + 1]
    # Span QA's come from the outputs: a row's positions whose logits are not the padding
    # fill, and the whole --max_seq_length where a row took several windows.
    fill = -10000.0
    logits = np.array([[0.5, 1, 2, fill, fill, fill], [0, 0, 0, 0, 0, fill]], np.float32)
    one = {"windows": np.array([1, 1], np.int32), "start_logits": logits}
    several = {"windows": np.array([1, 3], np.int32), "start_logits": logits}
    assert _packed_lengths("span_qa", False, "serving_default", {}, one, None, 6) == [3, 5]
    assert _packed_lengths("span_qa", False, "serving_default", {}, several, None, 6) == [6]
    assert _packed_lengths("span_qa", False, "ids", {}, one, None, 6) is None


def test_lengths_need_the_recorded_buckets(tmp_path):
    """A text-in export whose batching_params.pbtxt is rewritten cannot show its buckets:
    the lengths line fails, naming the file. One without the file (TF Serving does not need
    it: an export from before length buckets, or made by hand) is not failed for it; the
    line says what was not checked."""
    params = tmp_path / batching_parameters.PER_MODEL_FILE

    def lines():
        report = Report(str(tmp_path))
        _check_bucket_lengths(report, str(tmp_path), "tagger", TAGGER, {"C": 3},
                              {"warmup": [], "warmup_outputs": []})
        return report.lines

    assert lines() == [("lengths", True, (
        f"not checked: no {params} (the export tools write it with the length buckets; "
        "export/batching_parameters.py), so the serving length and the warmup's coverage "
        "are unknown"))]
    params.write_text("max_batch_size { value: 8 }\n")
    assert lines() == [("lengths", False, (
        f"{params}: its first line does not name the export's length buckets "
        "(export/batching_parameters.py), so its serving length and the warmup's coverage "
        "cannot be checked"))]


# --- Real exports (integration tier: exports and verify's fresh processes). ---

@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A tagger and a span-QA export of tiny models: {"tagger"|"span_qa": (path, model)},
    and the tokenizer."""
    from bert_keras import BertEncoder
    from bert_keras.tasks import BertSpanQA, BertTagger
    from data_prep.tokenization import BertTokenizer
    from export.export_span_qa import export_span_qa
    from export.export_tagger import export_tagger

    tmp = tmp_path_factory.mktemp("task_exports")
    tokenizer = BertTokenizer(write_vocab(tmp / "vocab.txt", size=CONFIG["vocab_size"]))
    tagger = BertTagger(BertEncoder(**CONFIG), num_classes=3)
    span_qa = BertSpanQA(BertEncoder(**CONFIG))
    return {
        "tagger": (export_tagger(tagger, tokenizer, ["O", "B-X", "I-X"], str(tmp / "tagger"),
                                 seq_length=S, buckets=TAG_BUCKETS), tagger),
        "span_qa": (export_span_qa(span_qa, tokenizer, str(tmp / "qa"), seq_length=S,
                                   buckets=QA_BUCKETS, max_query_length=QA_QUERY), span_qa),
    }, tokenizer


def _assert_report(report, expected):
    """The whole report: its lines, each (check, ok, pattern its detail must match), then
    the result."""
    text = str(report)
    assert [(c, ok) for c, ok, _ in report.lines] == [(c, ok) for c, ok, _ in expected], text
    for (check, _, detail), (_, _, pattern) in zip(report.lines, expected):
        assert re.fullmatch(pattern, detail), (check, detail, pattern)
    assert text.splitlines()[0] == f"verify {report.export_dir}"
    assert text.splitlines()[-1] == "  result: " + (
        "PASS" if all(ok for _, ok, _ in expected) else "FAIL")


OPS = (r"\d+ op types, all servable \(tensorflow-text 2\.12 ops: FastBertNormalize, "
       r"FastWordpieceTokenizeWithOffsets\)")
LOAD = re.escape("loaded in a fresh process importing only ['tensorflow', 'tensorflow_text']")
POSITIONS = re.escape("23 positions (rows of embeddings/position_embeddings)")


def _session(requests):
    return (rf"TF1 session loader \(TF Serving's path\): {requests} requests, max \|session - "
            r"tf2\| = \S+ = \S+ x the scale of \S+ \(max \|x\| \S+; tolerance 0\.0001 x scale\)")


@pytest.mark.integration  # Two exports (module fixture, ~40 s) and verify's processes: ~1 min.
def test_verify_passes_on_a_tagger_and_a_span_qa_export(exports):
    paths, _ = exports
    _assert_report(verify(paths["tagger"][0]), [
        ("ops", True, OPS), ("load", True, LOAD),
        ("signatures", True, re.escape("tagger: text, and words -> words, tags, tag_ids, "
                                       "probabilities, num_words (3 tags)")),
        # 4 requests, then one per bucket (3) on each of the two signatures.
        ("warmup", True, "10 requests replayed"),
        ("lengths", True, "serving length 19 <= " + POSITIONS + re.escape(
            "; the warmup runs every length bucket (5,11,19) on serving_default, words")),
        ("session", True, _session(10)),
    ])
    _assert_report(verify(paths["span_qa"][0]), [
        ("ops", True, OPS), ("load", True, LOAD),
        ("signatures", True, re.escape(
            "span QA: question, context -> start/end logits [batch, 19], the answer and its "
            "spans; ids -> start/end logits")),
        ("warmup", True, "8 requests replayed"),  # 3, and one per bucket (5)
        ("lengths", True, "serving length 19 <= " + POSITIONS + re.escape(
            "; the warmup runs every length bucket (6,9,12,15,19) on serving_default")),
        ("session", True, _session(8)),
    ])


@pytest.mark.integration  # Shares the exports; runs their warmup requests in this process.
def test_counted_buckets_are_those_the_graph_runs(exports):
    """verify's count of each warmup request's bucket equals the length the export's own
    graph cuts the encoder inputs to, recorded at the model's call while the exporter's
    modules run the requests eagerly."""
    from export.export_preprocessor import TextPacker
    from export.export_span_qa import SpanQAModule
    from export.export_tagger import TaggerModule
    from export.verify import _run_probe

    paths, tokenizer = exports
    for kind, (path, model) in paths.items():
        buckets = TAG_BUCKETS if kind == "tagger" else QA_BUCKETS
        pre = TextPacker(tokenizer, S, buckets=buckets, pairs=kind == "span_qa")
        if kind == "tagger":
            from data_prep.tagging import default_doc_stride

            module = TaggerModule(pre, model, ["O", "B-X", "I-X"], default_doc_stride(S))
            functions = {"serving_default": TaggerModule.serve, "words": TaggerModule.serve_words}
            attribute = "tagger"
        else:
            module = SpanQAModule(pre, model, 30, QA_QUERY)
            functions = {"serving_default": SpanQAModule.serve}
            attribute = "model"
        ran = []

        def recording(inputs, training, model=model):
            ran.append(int(inputs["input_word_ids"].shape[1]))
            return model(inputs, training=training)

        setattr(module, attribute, saved_model_writer.Untracked(recording))
        requests = read_warmup_requests(os.path.join(path, WARMUP_FILE))
        # Span QA's are counted from the outputs of the export, loaded as verify loads it.
        outputs_of = (_run_probe(path, text=True)[0]["warmup_outputs"] if kind == "span_qa"
                      else [{}] * len(requests))
        compared = 0
        for (name, inputs), outputs in zip(requests, outputs_of):
            if name not in functions:
                continue
            ran.clear()
            functions[name].python_function(module, **{k: tf.constant(v)
                                                        for k, v in inputs.items()})
            rows = _packed_lengths(kind, False, name, inputs, outputs, tokenizer, S)
            counted = min(b for b in buckets + (S,) if b >= max(rows))
            assert ran == [counted], (kind, name, inputs, rows)
            compared += 1
        assert compared == {"tagger": 10, "span_qa": 7}[kind]


def _rewrite_warmup(path, keep):
    """Rewrites the version's warmup file with the requests `keep(index, name, inputs)`
    accepts."""
    file = os.path.join(path, WARMUP_FILE)
    requests = read_warmup_requests(file)
    with tf.io.TFRecordWriter(file) as writer:
        for i, (name, inputs) in enumerate(requests):
            if keep(i, name, inputs):
                writer.write(warmup_record(name, inputs))
    return requests


@pytest.mark.integration  # A copy of the tagger export and verify's processes: ~25 s.
def test_verify_fails_on_a_warmup_missing_a_bucket(exports, tmp_path):
    """The tagger's words request of bucket 11 (9 one-piece words) taken out of the warmup:
    the first such request would be served unwarmed."""
    paths, _ = exports
    path = str(tmp_path / "tagger" / "1")
    shutil.copytree(paths["tagger"][0], path)
    requests = _rewrite_warmup(path, lambda i, name, inputs: i != 7)
    name, inputs = requests[7]
    assert name == "words" and inputs["words"].shape == (1, 9)
    _assert_report(verify(path), [
        ("ops", True, OPS), ("load", True, LOAD), ("signatures", True, r"tagger: .*"),
        ("warmup", True, "9 requests replayed"),
        ("lengths", False, re.escape(
            "no words warmup request runs at length bucket 11 of 5,11,19: TF Serving serves "
            "the first request of that length unwarmed")),
        ("session", True, _session(9)),
    ])


class _Tagger(tf.Module):
    """A tagger's signatures with `tags` renamed `tag` (no model: core ops only)."""

    def _outputs(self, words):
        shape = tf.shape(words)
        return {"words": words, "tag": tf.fill(shape, "O"), "tag_ids": tf.zeros(shape, tf.int32),
                "probabilities": tf.one_hot(tf.zeros(shape, tf.int32), 3),  # [B, W, 3]
                "num_words": tf.reduce_sum(tf.cast(words != "", tf.int32), axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text):
        return self._outputs(tf.strings.split(text).to_tensor(""))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string, name="words")])
    def serve_words(self, words):
        return self._outputs(words)


class _SpanQA(tf.Module):
    """Span QA's signatures without `answer`, and start_logits of no fixed width."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question"),
                                  tf.TensorSpec([None], tf.string, name="context")])
    def serve(self, question, context):
        rows = tf.zeros_like(context, tf.float32)[:, None]  # [B, 1]
        wide = rows + tf.zeros([7])  # [B, 7]
        ints = tf.zeros_like(context, tf.int32)
        return {"start_logits": tf.zeros(tf.stack([tf.size(context), tf.size(question) + 6])),
                "end_logits": wide, "input_word_ids": tf.cast(wide, tf.int32),
                "input_type_ids": tf.cast(wide, tf.int32), "window_start": ints,
                "windows": ints + 1, "answer_start": ints, "answer_end": ints,
                "null_odds": rows[:, 0], "answer_char_start": ints, "answer_char_end": ints}

    @tf.function(input_signature=[{k: tf.TensorSpec([None, None], tf.int32, name=k)
                                   for k in ("input_word_ids", "input_mask", "input_type_ids")}])
    def serve_ids(self, inputs):
        logits = tf.cast(inputs["input_mask"], tf.float32)
        return {"start_logits": logits, "end_logits": logits}


@pytest.mark.integration  # Two small SavedModels and verify's processes: ~30 s.
def test_verify_fails_on_damaged_signatures(tmp_path):
    """SavedModels with a tagger's and a span-QA export's signatures, an output renamed,
    missing or of another shape: the signatures line names each; they record no length
    buckets either."""
    tagger = _Tagger()
    words = np.array([[b"a", b"b", b""]], dtype=object)
    path = saved_model_writer.write_saved_model(
        tagger, str(tmp_path / "tagger" / "1"),
        {"serving_default": tagger.serve.get_concrete_function(),
         "words": tagger.serve_words.get_concrete_function()},
        warmup=[("serving_default", {"text": np.array([b"a b"], dtype=object)}),
                ("words", {"words": words})])
    missing_buckets = ("not checked: no " + re.escape(os.path.join(
        path, batching_parameters.PER_MODEL_FILE)) + " .*")
    core = r"\d+ op types, all servable"
    _assert_report(verify(path), [
        ("ops", True, core),
        ("load", True, re.escape("loaded in a fresh process importing only ['tensorflow']")),
        ("signatures", False, re.escape(
            "serving_default has no output tags; serving_default has unexpected outputs tag; "
            "words has no output tags; words has unexpected outputs tag")),
        ("warmup", True, "2 requests replayed"),
        ("lengths", True, missing_buckets),
        ("session", True, _session(2)),
    ])

    qa = _SpanQA()
    texts = np.array([b"who", b"what"], dtype=object)
    ids = {k: np.ones((2, 7), np.int32) for k in ("input_word_ids", "input_mask",
                                                  "input_type_ids")}
    path = saved_model_writer.write_saved_model(
        qa, str(tmp_path / "qa" / "1"),
        {"serving_default": qa.serve.get_concrete_function(),
         "ids": qa.serve_ids.get_concrete_function()},
        warmup=[("serving_default", {"question": texts, "context": texts}), ("ids", ids)])
    missing_buckets = ("not checked: no " + re.escape(os.path.join(
        path, batching_parameters.PER_MODEL_FILE)) + " .*")
    _assert_report(verify(path), [
        ("ops", True, core),
        ("load", True, re.escape("loaded in a fresh process importing only ['tensorflow']")),
        ("signatures", False, re.escape(
            "serving_default has no output answer; serving_default output start_logits is "
            "float32 [?, ?], expected float32 [?, S]")),
        ("warmup", True, "2 requests replayed"),
        ("lengths", True, missing_buckets),
        ("session", True, _session(2)),
    ])
