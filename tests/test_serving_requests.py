"""The documentation's REST request bodies (README.md, docs/), mapped to tensors as TF
Serving maps them, run on exports.

No TF Serving binary can be installed here, so this test plays the server's JSON layer
(tensorflow_serving/util/json_tensor.cc, documented in TF Serving's REST API guide):
  - predict, row format: {"instances": [...]}: one object per example whose named values
    are stacked per input (a bare value per example when the signature has one input);
  - predict, columnar: {"inputs": {name: batch}} (or the batch alone for one input);
  - classify and regress: {"examples": [{feature: value}]}: each object becomes a
    tf.train.Example (strings -> bytes_list, ints -> int64_list, floats -> float_list),
    serialized into the classify (regress) signature's `inputs`;
JSON numbers take the dtype of the signature's input; `signature_name` defaults to
serving_default. Every curl command in README.md and the docs/ pages must be runnable
this way.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from bert_keras import BertEncoder
from bert_keras.tasks import BertClassifier, BertRegressor, BertSpanQA, BertTagger
from data_prep.klue_ner import KLUE_NER_LABELS
from doc_pages import doc_texts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURL = re.compile(r"curl -d '(?P<body>\{.*?\})' \\\n\s+"
                  r"http://localhost:8501/v1/models/(?P<model>\w+):(?P<verb>predict|classify|regress)")


def readme_requests():
    """(model, verb, body) of every curl command in README.md and the docs/ pages."""
    found = []
    for page, text in doc_texts().items():
        requests = [(m["model"], m["verb"], json.loads(m["body"])) for m in CURL.finditer(text)]
        assert len(requests) == text.count("curl -d '"), f"a curl command in {page} is not parsed"
        found += requests
    return found


def test_readme_has_the_request_bodies():
    kinds = {(model, verb, body.get("signature_name", "serving_default"))
             for model, verb, body in readme_requests()}
    assert {("spam", "predict", "serving_default"), ("spam", "predict", "pair"),
            ("spam", "classify", "serve_examples"), ("bert_preprocess", "predict",
            "serving_default"), ("bert_encoder", "predict", "serving_default"),
            ("clf", "predict", "serving_default"), ("ner", "predict", "serving_default"),
            ("ner", "predict", "words"), ("klue_ner", "predict", "serving_default"),
            ("squad", "predict", "serving_default"),
            ("stsb", "predict", "pair"), ("stsb", "regress", "serve_examples")} <= kinds


def _feature(value):
    values = value if isinstance(value, list) else [value]
    if all(isinstance(v, str) for v in values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode() for v in values]))
    if all(isinstance(v, int) for v in values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def as_tensors(body: dict, verb: str, specs: dict) -> dict:
    """The signature's input tensors for a REST body (TF Serving's JSON mapping)."""
    if verb in ("classify", "regress"):
        examples = [tf.train.Example(features=tf.train.Features(
            feature={k: _feature(v) for k, v in ex.items()})).SerializeToString()
            for ex in body["examples"]]
        columns = {"inputs": examples}
    elif "instances" in body:
        instances = body["instances"]
        if len(specs) == 1 and not all(isinstance(i, dict) for i in instances):
            columns = {next(iter(specs)): instances}
        else:
            missing = [(i, n) for i, inst in enumerate(instances) for n in specs if n not in inst]
            assert not missing, f"instances lack named inputs {missing}"
            columns = {name: [inst[name] for inst in instances] for name in specs}
    else:
        inputs = body["inputs"]
        columns = inputs if isinstance(inputs, dict) else {next(iter(specs)): inputs}
    assert set(columns) == set(specs), (sorted(columns), sorted(specs))
    return {name: tf.constant(value, dtype=specs[name].dtype) for name, value in columns.items()}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Every export kind under the documentation's model names, loaded as a server would."""
    import tensorflow_text  # noqa: F401  (the text ops, which TF Serving links)

    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import export_classifier
    from export.export_encoder import export_encoder
    from export.export_preprocessor import export_preprocessor
    from export.export_regressor import export_regressor
    from export.export_span_qa import export_span_qa
    from export.export_tagger import export_tagger

    tmp = tmp_path_factory.mktemp("serving")
    # The encoder request uses bert-base-uncased ids (101, 7592, 2088, 102).
    words = ["win", "a", "free", "cruise", "lunch", "at", "noon", "hello", "world", "yes"]
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += words + [f"w{i}" for i in range(7700 - len(vocab) - len(words))]
    vocab_file = tmp / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(vocab_file))
    encoder = BertEncoder(vocab_size=len(vocab), num_layers=2, hidden_size=16, num_heads=2,
                          intermediate_size=24, max_sequence_length=32)
    builders = {
        "spam": lambda: export_classifier(BertClassifier(encoder, 2), tokenizer, ["ham", "spam"],
                                  str(tmp / "spam"), seq_length=16),
        "bert_preprocess": lambda: export_preprocessor(tokenizer, str(tmp / "bert_preprocess"),
                                               seq_length=16),
        "bert_encoder": lambda: export_encoder(encoder, str(tmp / "bert_encoder"), str(vocab_file),
                                       warmup_seq_length=16),
        "clf": lambda: export_classifier(BertClassifier(encoder, 2), tokenizer, ["NEGATIVE", "POSITIVE"],
                                 str(tmp / "clf"), seq_length=16),
        "ner": lambda: export_tagger(BertTagger(encoder, 3), tokenizer, ["O", "B-PER", "I-PER"],
                             str(tmp / "ner"), seq_length=16),
        "klue_ner": lambda: export_tagger(BertTagger(encoder, len(KLUE_NER_LABELS)), tokenizer,
                                  KLUE_NER_LABELS, str(tmp / "klue_ner"), seq_length=16,
                                  characters=True),
        "squad": lambda: export_span_qa(BertSpanQA(encoder), tokenizer, str(tmp / "squad"),
                                seq_length=16),
        "stsb": lambda: export_regressor(BertRegressor(encoder), tokenizer, str(tmp / "stsb"),
                                         seq_length=16, pair=True),
    }
    return _LazyExports(builders)


class _LazyExports(dict):
    """Each export is written and loaded on first use: a run that deselects the slow cases
    (the tagger and span-QA exports) does not pay for them."""

    def __init__(self, builders):
        super().__init__()
        self._builders = builders

    def __missing__(self, name):
        self[name] = tf.saved_model.load(self._builders[name]())
        return self[name]


def _request_cases():
    """The documentation's requests; the tagger and span-QA ones (their exports take a minute to write
    on 2 cores) run with the slow tests, the others with the integration tests (each
    export takes about a minute here too)."""
    cases = []
    for index, (model, verb, _) in enumerate(readme_requests()):
        marks = [pytest.mark.slow if model in ("ner", "klue_ner", "squad")
                 else pytest.mark.integration]
        cases.append(pytest.param(index, marks=marks, id=f"{index}-{model}-{verb}"))
    return cases


@pytest.mark.parametrize("index", _request_cases())
def test_readme_request_runs_on_the_export(served, index):
    requests = readme_requests()
    assert len(requests) == 14, "update the parametrization to the documentation's request count"
    model, verb, body = requests[index]
    signature = served[model].signatures[body.get("signature_name", "serving_default")]
    specs = signature.structured_input_signature[1]
    inputs = as_tensors(body, verb, specs)
    outputs = {k: v.numpy() for k, v in signature(**inputs).items()}
    batch = len(body.get("examples") or body.get("instances") or next(iter(
        body["inputs"].values())))
    for name, value in outputs.items():
        assert value.shape[0] == batch, name
        if value.dtype.kind == "f":
            assert np.isfinite(value).all(), name
    if model == "spam" and verb == "predict":
        np.testing.assert_allclose(outputs["probabilities"].sum(-1), 1.0, rtol=1e-5)
        assert set(outputs["label"].astype(str)) <= {"ham", "spam"}
    if verb == "regress":  # TF Serving's Regress API reads `outputs`, float [batch]
        assert list(outputs) == ["outputs"] and outputs["outputs"].shape == (batch,)
    if model == "stsb" and verb == "predict":
        assert list(outputs) == ["score"] and outputs["score"].shape == (batch,)
    if verb == "classify":
        assert outputs["classes"].astype(str).tolist() == [["ham", "spam"]] * batch
        np.testing.assert_allclose(outputs["scores"].sum(-1), 1.0, rtol=1e-5)
    if model == "bert_preprocess":
        ids = outputs["input_word_ids"]
        assert ids.shape == (batch, 16) and (ids[:, 0] == 101).all()  # [CLS] first
    if model == "ner":  # one tag per word
        words = [len((i.get("words") or i["text"].split())) for i in body["instances"]]
        assert outputs["tags"].shape == (batch, max(words))
        assert set(outputs["tags"].astype(str).ravel()) <= {"O", "B-PER", "I-PER"}
    if model == "klue_ner":  # a tag per WordPiece unit, entities with character offsets
        assert outputs["tags"].shape == outputs["unit_starts"].shape
        assert set(outputs["tags"].astype(str).ravel()) <= set(KLUE_NER_LABELS) | {""}
        assert outputs["entities"].shape == outputs["entity_starts"].shape
    if model == "squad":
        assert outputs["start_logits"].shape == outputs["end_logits"].shape == (batch, 16)
        assert (outputs["answer_end"] >= outputs["answer_start"]).all()
    if model == "bert_encoder":
        assert outputs["sequence_output"].shape[:2] == (batch, 4)
        assert outputs["encoder_outputs"].shape[:2] == (batch, 2)  # [B, L, S, H]


def test_mapping_rejects_what_tf_serving_rejects():
    specs = {"text_a": tf.TensorSpec([None], tf.string), "text_b": tf.TensorSpec([None], tf.string)}
    with pytest.raises(AssertionError, match="lack named inputs"):
        as_tensors({"instances": [{"text_a": "x"}]}, "predict", specs)
    with pytest.raises(AssertionError):
        as_tensors({"inputs": {"text": ["x"]}}, "predict", specs)
