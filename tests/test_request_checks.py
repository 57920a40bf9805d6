"""Requests a TF Serving client can send that the exports must refuse in one clear message
(export/request_checks.py): TF Serving feeds tensors to a signature without comparing
their shapes with it, and BERT's kernels trust their inputs."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from bert_keras import BertEncoder, BertPretrainer
from conftest import TINY, make_inputs
from data_prep import schema
from test_export import write_vocab

# Integration tier: the module's fixture writes every export kind (about 2 minutes of the
# default suite's 18 on 2026-12-05, its largest single cost; BUILD_NOTES 8.5).
pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB_SIZE = 40


CONFIG = dict(TINY, vocab_size=VOCAB_SIZE, max_sequence_length=12)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Every export kind of one tiny model: {kind: SavedModel path}, and the encoder."""
    from bert_keras.tasks import BertClassifier, BertSpanQA, BertTagger
    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import export_classifier
    from export.export_encoder import export_encoder
    from export.export_preprocessor import export_preprocessor
    from export.export_span_qa import export_span_qa
    from export.export_tagger import export_tagger

    tmp = tmp_path_factory.mktemp("exports")
    vocab = write_vocab(tmp / "vocab.txt", size=VOCAB_SIZE)
    tokenizer = BertTokenizer(vocab)
    encoder = BertEncoder(**CONFIG)
    paths = {
        "encoder": export_encoder(encoder, str(tmp / "encoder"), vocab,
                                  pretrainer=BertPretrainer(encoder), warmup_seq_length=12),
        "preprocessor": export_preprocessor(tokenizer, str(tmp / "pre"), seq_length=12),
        "classifier": export_classifier(BertClassifier(BertEncoder(**CONFIG), num_classes=2),
                                        tokenizer, ["a", "b"], str(tmp / "cls"), seq_length=12,
                                        pair=True),
        "tagger": export_tagger(BertTagger(BertEncoder(**CONFIG), num_classes=2), tokenizer,
                                ["O", "X"], str(tmp / "tag"), seq_length=12),
        "span_qa": export_span_qa(BertSpanQA(BertEncoder(**CONFIG)), tokenizer,
                                  str(tmp / "qa"), seq_length=12),
    }
    return paths, encoder


# Every text signature called with a scalar string (what a gRPC client's
# make_tensor_proto("hello") and the REST body {"inputs": {"text": "hello"}} send), in a
# child process: before the checks, tensorflow-text's normalizer crashed the process.
_SCALARS = textwrap.dedent("""
    import json, sys
    import tensorflow as tf, tensorflow_text  # noqa: F401
    paths = json.loads(sys.argv[1])
    s, v = tf.constant("w1 w2"), tf.constant(["w1 w2"])
    calls = [
        ("preprocessor", "serving_default", {"text": s}),
        ("preprocessor", "tokenize", {"text": s}),
        ("preprocessor", "bucketed", {"text": s}),
        ("preprocessor", "pair", {"text_a": v, "text_b": s}),
        ("classifier", "serving_default", {"text": s}),
        ("classifier", "pair", {"text_a": s, "text_b": v}),
        ("classifier", "serve_examples", {"inputs": tf.constant(b"")}),
        ("tagger", "serving_default", {"text": s}),
        ("tagger", "words", {"words": v}),
        ("span_qa", "serving_default", {"question": v, "context": s}),
    ]
    loaded = {kind: tf.saved_model.load(path) for kind, path in paths.items()
              if kind != "encoder"}
    for kind, name, args in calls:
        try:
            loaded[kind].signatures[name](**args)
            print(kind, name, "ACCEPTED", flush=True)
        except tf.errors.InvalidArgumentError as e:
            found = [line for line in e.message.splitlines() if "is not compatible" in line]
            print(kind, name, (found or [" ".join(e.message.split())[:300]])[0].strip(),
                  flush=True)
    try:
        loaded["preprocessor"].tokenize(s)
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
        print("preprocessor tokenize() refused", type(e).__name__, flush=True)
""")


@pytest.mark.parametrize("tensorflow", [
    "this one", pytest.param("2.12.1", marks=pytest.mark.integration)])
def test_a_scalar_where_a_batch_of_texts_belongs_is_refused_not_a_crash(exports, tensorflow):
    """In this TensorFlow and in stock TF Serving's (TF and tensorflow-text 2.12.1, where a
    process with them exists: conftest.tf212_python)."""
    import json

    from conftest import tf212_python

    paths, _ = exports
    python = sys.executable if tensorflow == "this one" else tf212_python()
    if python is None:
        pytest.skip("no tensorflow 2.12.1 interpreter (set BERT_KERAS_TF212_PYTHON)")
    result = subprocess.run([python, "-c", _SCALARS, json.dumps(paths)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-2000:])
    lines = result.stdout.strip().splitlines()
    expected = {
        "preprocessor serving_default": "text", "preprocessor tokenize": "text",
        "preprocessor bucketed": "text", "preprocessor pair": "text_b",
        "classifier serving_default": "text", "classifier pair": "text_a",
        "classifier serve_examples": "inputs",
        "tagger serving_default": "text", "span_qa serving_default": "context"}
    got = {" ".join(line.split()[:2]): line for line in lines}
    for call, name in expected.items():
        assert got[call].endswith(f"Shape of tensor {name} [] is not compatible with "
                                  "expected shape [?]."), got[call]
    assert "[?,?]" in got["tagger words"]  # a 1-D batch of words: not rows of words
    assert lines[-1].startswith("preprocessor tokenize() refused")


def test_tf_servings_batching_takes_the_warmup_and_requests_larger_than_a_batch(exports):
    """TF Serving under --enable_batching replays an export's warmup requests through its
    batching layer when it loads the model, and refuses a request of more texts than
    max_batch_size. That was the execution batch: 1 for these fixed-length exports, whose
    warmup sends 4 texts (the model would not load), 8 at the default S=128 (a request of
    9 texts refused). Now the classifier's and span QA's requests are split across batches
    (their outputs have one width), the tagger's not (outputs as wide as a batch's longest
    row): every warmup request fits, and the classifier behind TensorFlow's BatchFunction
    op run with its parameters (as TF Serving's scheduler) answers a 9-text request, split
    into batches of 1, as it answers unbatched."""
    from bench.bench_serving_latency import batched_row
    from export import batching_parameters
    from export.saved_model_writer import WARMUP_FILE, read_warmup_requests
    from test_length_buckets import parse_batching_parameters

    paths, _ = exports
    for kind, split in [("classifier", True), ("tagger", False), ("span_qa", True)]:
        base = os.path.dirname(paths[kind])
        text = open(os.path.join(base, batching_parameters.FILE_NAME)).read()
        assert open(os.path.join(paths[kind], batching_parameters.PER_MODEL_FILE)).read() == text
        params = parse_batching_parameters(text)
        assert params.enable_large_batch_splitting.value is split, kind
        warmup = read_warmup_requests(os.path.join(paths[kind], WARMUP_FILE))
        largest = max(len(next(iter(inputs.values()))) for _, inputs in warmup)
        assert largest == 4 and largest <= params.max_batch_size.value, kind
    params = batching_parameters.for_buckets((12,))
    assert params["max_execution_batch_size"] == 1
    loaded = tf.saved_model.load(paths["classifier"])
    serve = loaded.signatures["serving_default"]
    texts = tf.constant([f"w{i} w{i + 1}" for i in range(9)])
    row = batched_row(serve, params, keep=loaded)
    np.testing.assert_allclose(row.call(texts)["logits"], serve(text=texts)["logits"].numpy(),
                               rtol=0, atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger than maximum input"):
        row.call(tf.constant(["w1"] * (batching_parameters.QUEUED_ROWS + 1)))


_CALLS = {"PartitionedCall", "StatefulPartitionedCall"}


def _readers(library: dict, function, arg: str) -> list[str]:
    """The ops that read `function`'s argument `arg`, followed into the functions it is
    passed to."""
    found = []
    for node in function.node_def:
        for index, name in enumerate(node.input):
            if name != arg and not name.startswith(arg + ":"):
                continue
            if node.op in _CALLS:
                callee = library[node.attr["f"].func.name]
                found += _readers(library, callee, callee.signature.input_arg[index].name)
            else:
                found.append(node.op)
    return found


def test_nothing_reads_a_request_before_its_check(exports):
    """A request's tensors reach the model only through request_checks' EnsureShape: an op
    reading the raw input runs beside the check, not after it, and where it fails first
    (TF 2.12's executor let `tf.shape(inputs)[0]` in serve_examples win the race) the client
    gets a strided_slice error instead of the message naming the input. Read from each
    export's saved_model.pb, so the order cannot depend on a race."""
    from tensorflow.core.protobuf import saved_model_pb2

    paths, _ = exports
    seen = 0
    for kind, path in paths.items():
        saved = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            saved.ParseFromString(f.read())
        graph = saved.meta_graphs[0]
        library = {f.signature.name: f for f in graph.graph_def.library.function}
        for signature_name, signature in graph.signature_def.items():
            placeholders = {t.name.split(":")[0]: name for name, t in signature.inputs.items()}
            for node in graph.graph_def.node:
                for index, name in enumerate(node.input):
                    request = placeholders.get(name.split(":")[0])
                    if request is None:
                        continue
                    assert node.op in _CALLS, (kind, signature_name, node.op)
                    function = library[node.attr["f"].func.name]
                    readers = _readers(library, function,
                                       function.signature.input_arg[index].name)
                    assert readers == ["EnsureShape"], (kind, signature_name, request, readers)
                    seen += 1
    assert seen >= 25  # every input of every signature of the five kinds


def _call(signature, **inputs):
    return signature(**{k: tf.constant(v) for k, v in inputs.items()})


def _message(signature, **inputs) -> str:
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        _call(signature, **inputs)
    return info.value.message


def test_encoder_requests_outside_the_models_tables_are_refused_by_name(exports):
    paths, encoder = exports
    loaded = tf.saved_model.load(paths["encoder"])
    serve, mlm = loaded.signatures["serving_default"], loaded.signatures["mlm"]
    good = make_inputs(batch=2, seq=6, vocab=VOCAB_SIZE)
    np.testing.assert_allclose(_call(serve, **good)["sequence_output"],
                               encoder(good)["sequence_output"], atol=1e-5)

    def with_(name, value):
        return {**good, name: np.asarray(value, np.int32)}

    ids, mask, types = (good[n] for n in schema.MODEL_INPUT_NAMES)
    too_long = make_inputs(batch=1, seq=13, vocab=VOCAB_SIZE)
    cases = [
        (too_long, "input_word_ids: at most 12 positions (the size of the position table)"),
        (with_("input_word_ids", np.where(ids == ids[0, 1], -1, ids)),
         f"input_word_ids: ids must be in [0, {VOCAB_SIZE})"),
        (with_("input_word_ids", np.where(ids == ids[0, 1], VOCAB_SIZE, ids)),
         f"input_word_ids: ids must be in [0, {VOCAB_SIZE})"),
        (with_("input_type_ids", types + 2), "input_type_ids: ids must be in [0, 2)"),
        (with_("input_type_ids", types - 1), "input_type_ids: ids must be in [0, 2)"),
        (with_("input_mask", mask[:1]), "input_mask must have the shape of input_word_ids"),
        (with_("input_type_ids", types[:, :4]),
         "input_type_ids must have the shape of input_word_ids"),
        ({n: good[n][:, :0] for n in good}, "input_word_ids: at least 1 position ([CLS])"),
    ]
    for inputs, message in cases:
        assert message in _message(serve, **inputs)
    assert "is not compatible with expected shape [?,?]" in _message(
        serve, **{n: v[0] for n, v in good.items()})
    positions = np.array([[1, 2], [3, 4]], np.int32)
    assert "masked_lm_positions: positions must be in [0, sequence length)" in _message(
        mlm, **good, masked_lm_positions=positions * 3)
    assert "masked_lm_positions: positions must be in [0, sequence length)" in _message(
        mlm, **good, masked_lm_positions=-positions)
    assert "masked_lm_positions must have a row for each row of input_word_ids" in _message(
        mlm, **good, masked_lm_positions=positions[:1])
    # What the checks accept is computed as before.
    got = _call(mlm, **good, masked_lm_positions=positions)["mlm_logits"]
    assert got.shape == (2, 2, VOCAB_SIZE)


def test_text_pairs_of_other_batch_sizes_are_refused_by_name(exports):
    paths, _ = exports
    import tensorflow_text  # noqa: F401  (the exports hold text ops)

    a, b = np.array(["w1 w2", "w3"]), np.array(["w4"])
    pre = tf.saved_model.load(paths["preprocessor"]).signatures
    for name in ("pair", "bucketed_pair"):
        assert "text_a and text_b must have the same number of texts" in _message(
            pre[name], text_a=a, text_b=b)
    cls = tf.saved_model.load(paths["classifier"]).signatures["pair"]
    assert "text_a and text_b must have the same number of texts" in _message(
        cls, text_a=a, text_b=b)
    qa = tf.saved_model.load(paths["span_qa"]).signatures
    assert "question and context must have the same number of texts" in _message(
        qa["serving_default"], question=a, context=b)
    ids = make_inputs(batch=1, seq=13, vocab=VOCAB_SIZE)
    assert "input_word_ids: at most 12 positions" in _message(qa["ids"], **ids)
    # Pairs of one batch size are answered.
    assert _call(cls, text_a=a, text_b=a)["label"].shape == (2,)
