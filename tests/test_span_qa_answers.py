"""The span-QA export answers with the context's own text (export/export_span_qa.py).

References: transformers' `return_offsets_mapping` under the same tokenizer settings (where
in the context each WordPiece came from), and run_squad's own predictions
(`data_prep.squad.postprocess`, Google's write_predictions) on the export's logits. The
model is a TINY random BertSpanQA: its best spans fall anywhere, which is what these tests
need (every kind of text under some span).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import unicodedata

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY, tf212_python

import tokenizer_refs as refs
from bert_keras import BertEncoder
from bert_keras.tasks import BertSpanQA
from data_prep import schema, squad
from data_prep.tokenization import BertTokenizer

S = 40  # TINY's position table
MAX_ANSWER = 6
QUESTIONS = ["who?", "Where is 서울?", "", "what's 東京 like", "naïve question " * 12]


@pytest.fixture(scope="module")
def vocab() -> str:
    return refs.bert_base_uncased_vocab()


@pytest.fixture(scope="module")
def span_qa(vocab):
    keras.utils.set_random_seed(5)
    return BertSpanQA(BertEncoder(**{**TINY, "vocab_size": 30522}))


def _contexts() -> list[str]:
    lines = refs.read_lines(refs.MIXED_FILE) + refs.read_lines(refs.KOREAN_FILE)
    # Whitespace runs run_squad writes as one space (two-word contexts: a span of two
    # pieces holds one), and an empty context.
    pairs = [f"{a}{space}{b}" for a, b in zip("abcdefgh", "ijklmnop")
             for space in ["\n\n", "\t ", "\u202f", "\r\n"]]
    # Scripts whose vowel signs are WordPieces of their own (combining marks that accent
    # stripping keeps), and ill-formed UTF-8, which a client decodes with replacement.
    indic = ["हिन्दी भाषा बोलते हैं", "বাংলা ভাষা সুন্দর", "தமிழ் மொழி பேசுகிறார்கள்", "ภาษาไทย ง่าย",
             "किताबें मेज़ पर हैं"] * 3
    invalid = [b"\x80\x80 Paris is big and the store", b"Paris \xff\xfe is \xed\xa0\x80 big",
               b"caf\xc3 au lait \xf0\x9f\x98 here \xe2\x82\xac\x80 euro"] * 3
    return lines + pairs + indic + invalid + ["New\n\nYork  is\tbig", ""]


def _text(context) -> str:
    """The context as a client reads it: bytes decoded with replacement."""
    return context.decode("utf-8", "replace") if isinstance(context, bytes) else context


def _serve(vocab, span_qa, tmp_path, contexts=None, doc_stride=128, **settings):
    from export.export_preprocessor import TextPacker
    from export.export_span_qa import SpanQAModule

    tokenizer = BertTokenizer(vocab, **settings)
    module = SpanQAModule(TextPacker(tokenizer, S, str(tmp_path)), span_qa, MAX_ANSWER,
                          doc_stride=doc_stride)
    contexts = _contexts() if contexts is None else contexts
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(len(contexts))]
    out = module.serve(tf.constant(questions), tf.constant(contexts))
    return tokenizer, module, questions, contexts, {k: v.numpy() for k, v in out.items()}


def _squad_words(text: str) -> str:
    return re.sub("[ \t\r\n\u202f]+", " ", text)


SETTINGS = [dict(), dict(do_lower_case=True, strip_accents=False), dict(do_lower_case=False),
            dict(tokenize_chinese_chars=False)]


@pytest.mark.parametrize("settings", SETTINGS[:2] + [
    pytest.param(s, marks=pytest.mark.integration) for s in SETTINGS[2:]])
def test_answers_are_the_context_at_transformers_offsets(vocab, span_qa, tmp_path, settings):
    tokenizer, module, questions, contexts, out = _serve(vocab, span_qa, tmp_path, **settings)
    hf = refs.hf_tokenizer(vocab, settings.get("do_lower_case", True),
                           settings.get("strip_accents"),
                           settings.get("tokenize_chinese_chars", True))
    kinds = set()
    for row, (question, context) in enumerate(zip(questions, map(_text, contexts))):
        start, end = out["answer_start"][row], out["answer_end"][row]
        got = (out["answer"][row].decode(), out["answer_char_start"][row],
               out["answer_char_end"][row])
        if start < 0:
            assert not hf(context, add_special_tokens=False)["input_ids"], context
            assert got == ("", -1, -1)
            continue
        asked = min(len(hf(question, add_special_tokens=False)["input_ids"]),
                    module.max_query_length)
        offsets = hf(context, add_special_tokens=False,
                     return_offsets_mapping=True)["offset_mapping"]
        first = asked + 2 - out["window_start"][row]  # context piece i is at i + first
        begin, finish = offsets[start - first][0], offsets[end - first][1]
        while finish < len(context) and unicodedata.category(context[finish]).startswith("M"):
            finish += 1  # the combining marks after a span belong to it, as in run_squad
        assert got == (_squad_words(context[begin:finish]), begin, finish), (row, context)
        pieces = hf.convert_ids_to_tokens(out["input_word_ids"][row, start:end + 1])
        kinds |= {"[UNK]" * ("[UNK]" in pieces), "hangul" * bool(re.search("[가-힣]", got[0])),
                  "cased" * (got[0] != got[0].lower()),
                  "space" * bool(re.search("[\t\n\u202f]", context[begin:finish])),
                  "mark" * (finish > offsets[end - first][1]), "replaced" * ("\ufffd" in got[0]),
                  "later window" * bool(out["window_start"][row] > 0)}
    # Every kind was answered (vowel signs are pieces of their own where accents are
    # stripped; kept, this vocabulary makes those words [UNK]).
    wanted = {"[UNK]", "hangul", "cased", "space", "replaced", "later window"} | ({"mark"} if tokenizer.strip_accents else set())
    assert kinds >= wanted, kinds


def _squad_file(tmp_path, questions, contexts) -> str:
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [
        {"context": _text(c), "qas": [{"id": f"q{i}", "question": q, "answers": []}]}
        for i, (q, c) in enumerate(zip(questions, contexts))]}]}))
    return str(path)


def test_answers_are_run_squads_predictions(vocab, span_qa, tmp_path):
    """run_squad --do_predict's text for the same spans, where run_squad can map the span
    back: its final_text falls back to the span's whole words where the prediction holds
    [UNK] (and finds a prediction's first occurrence in its words, Google's get_final_text's
    rule, which these contexts avoid). run_squad is given the export's logits for the window
    the export answered from (some contexts here take several)."""
    settings = dict(do_lower_case=True, strip_accents=False)
    tokenizer, module, questions, contexts, out = _serve(vocab, span_qa, tmp_path, **settings)
    examples, _ = squad.read_squad(_squad_file(tmp_path, questions, contexts), is_training=False)
    arrays, windows, _ = squad.convert_examples(examples, tokenizer, S, module.doc_stride,
                                                module.max_query_length, False)
    first = [next(i for i, w in enumerate(windows) if w.example_index == row and (
        arrays[schema.INPUT_IDS][i] == out["input_word_ids"][row]).all())
        for row in range(len(contexts))]
    assert max(out["windows"]) > 1
    predictions, _, _ = squad.postprocess(
        examples, [windows[i] for i in first], out["start_logits"], out["end_logits"],
        n_best_size=S, max_answer_length=MAX_ANSWER, tokenizer_config=tokenizer.config)
    compared = sum(_same_answer(tokenizer, out, row, predictions[f"q{row}"], contexts[row])
                   for row in range(len(contexts)))
    assert compared > 0.6 * len(contexts)  # the others hold [UNK] (accents kept, uncased vocabulary)


def _same_answer(tokenizer, out, row: int, want: str, context) -> bool:
    """The export's answer of `row` is run_squad's `want`: equal, or inside it where the
    span holds [UNK] (run_squad answers the whole words). Whether it was compared equal."""
    got = out["answer"][row].decode()
    start, end = out["answer_start"][row], out["answer_end"][row]
    pieces = tokenizer.convert_ids_to_tokens(out["input_word_ids"][row, start:end + 1])
    if start >= 0 and "[UNK]" in pieces:
        assert got in want, row
        return False
    assert got == want, (row, context)
    return True


@pytest.mark.parametrize("doc_stride", [5, 64])
def test_long_contexts_are_answered_over_run_squads_windows(vocab, span_qa, tmp_path,
                                                            doc_stride):
    """A context longer than one window: run_squad's windows (`squad.convert_examples`,
    overlapping at doc_stride 5, apart at 64, past a window's room), its max-context rule
    for where a span may start, its best span over all windows and its null score (the
    smallest over the windows), from run_squad's own postprocess on the same model's logits
    for its own windows."""
    settings = dict(do_lower_case=True, strip_accents=False)
    lines = refs.read_lines(refs.MIXED_FILE) + refs.read_lines(refs.KOREAN_FILE)
    contexts = [" ".join(lines[i:i + 2 + i % 5]) for i in range(0, len(lines), 3)]
    contexts += ["", "a b", "New\n\nYork  is\tbig " * 12]
    tokenizer, module, questions, contexts, out = _serve(
        vocab, span_qa, tmp_path, contexts=contexts, doc_stride=doc_stride, **settings)
    examples, _ = squad.read_squad(_squad_file(tmp_path, questions, contexts), is_training=False)
    arrays, windows, _ = squad.convert_examples(examples, tokenizer, S, doc_stride,
                                                module.max_query_length, False)
    logits = span_qa(schema.model_inputs(arrays), training=False)
    # Every span scored (n_best_size S), and the best non-null span's text whatever the
    # null score (SQuAD 2.0's odds with an infinite threshold).
    predictions, _, null_odds = squad.postprocess(
        examples, windows, logits["start_logits"], logits["end_logits"], n_best_size=S,
        max_answer_length=MAX_ANSWER, tokenizer_config=tokenizer.config,
        version_2_with_negative=True, null_score_diff_threshold=np.inf)
    compared = 0
    for row in range(len(contexts)):
        mine = [i for i, w in enumerate(windows) if w.example_index == row]
        assert out["windows"][row] == len(mine), row
        # The returned window is run_squad's window that starts at window_start.
        pieces = sum(map(len, tokenizer.tokenize(examples[row].doc_tokens))) \
            if examples[row].doc_tokens else 0
        room = S - 3 - (windows[mine[0]].tokens.index("[SEP]") - 1)
        starts = [start for start, _ in squad.doc_spans(pieces, room, doc_stride) or [(0, 0)]]
        assert out["window_start"][row] in starts, row
        window = mine[starts.index(out["window_start"][row])]
        np.testing.assert_array_equal(out["input_word_ids"][row],
                                      arrays[schema.INPUT_IDS][window])
        np.testing.assert_allclose(out["null_odds"][row], null_odds[f"q{row}"], atol=1e-4)
        compared += _same_answer(tokenizer, out, row, predictions[f"q{row}"], contexts[row])
    assert sum(out["windows"] > 1) > 0.7 * len(contexts) and max(out["windows"]) >= 4
    assert compared > 0.6 * len(contexts)


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # Two exports: about a minute.
def test_the_default_export_keeps_the_training_layout_and_answers_as_out_in(vocab, span_qa,
                                                                           tmp_path):
    """export_span_qa stores its Dense kernels [in, out] by default, the trained model's
    layout, and --kernel_layout=out_in [out, in]: every kernel the task reads is in the
    default export as it is, and in the out_in export transposed where it is an encoder
    kernel; both answer alike."""
    import tensorflow_text  # noqa: F401  (the exports hold text ops)

    from export.export_span_qa import export_span_qa

    tokenizer = BertTokenizer(vocab, do_lower_case=True, strip_accents=False)
    paths = {layout: export_span_qa(span_qa, tokenizer, str(tmp_path / layout), seq_length=S,
                                    max_answer_length=MAX_ANSWER,
                                    **({"kernel_layout": layout} if layout == "out_in" else {}))
             for layout in ("in_out", "out_in")}

    def stored(path):  # the export's 2-D variables, as arrays
        reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
        return [reader.get_tensor(name) for name, shape in
                reader.get_variable_to_shape_map().items() if len(shape) == 2]

    def held(kernel, arrays):
        return any(a.shape == kernel.shape and np.array_equal(a, kernel) for a in arrays)

    kernels = [(v.path, v.numpy()) for v in span_qa.weights  # span QA reads no pooler
               if v.path.endswith("/kernel") and not v.path.startswith("pooler")]
    default, other = stored(paths["in_out"]), stored(paths["out_in"])
    assert all(held(kernel, default) for _, kernel in kernels)
    encoder = [k for path, k in kernels if path.startswith("transformer_layer_")]
    assert len(encoder) == 6 * TINY["num_layers"]
    assert all(held(k.T, other) for k in encoder)
    assert not any(held(k, other) for k in encoder if k.shape[0] != k.shape[1])
    contexts = _contexts()[::5]
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(len(contexts))]
    outs = [{k: v.numpy() for k, v in tf.saved_model.load(p).signatures["serving_default"](
        question=tf.constant(questions), context=tf.constant(contexts)).items()}
        for p in paths.values()]
    for name in outs[0]:
        if outs[0][name].dtype.kind == "f":
            np.testing.assert_allclose(outs[0][name], outs[1][name], atol=1e-4)
        else:
            np.testing.assert_array_equal(outs[0][name], outs[1][name])


@pytest.mark.integration  # An export, and a TF 2.12.1 process: about a minute.
def test_answers_in_stock_servings_tf_2_12(vocab, span_qa, tmp_path):
    """The export's answers and character spans in a TF 2.12.1 + tensorflow-text 2.12.1
    process (stock TF Serving's; no project code) equal this process's."""
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    from export.export_span_qa import export_span_qa

    python = tf212_python()
    if python is None:
        pytest.skip("no tensorflow 2.12.1 interpreter (set BERT_KERAS_TF212_PYTHON)")
    tokenizer = BertTokenizer(vocab, do_lower_case=True, strip_accents=False)
    path = export_span_qa(span_qa, tokenizer, str(tmp_path / "export"), seq_length=S,
                          max_answer_length=MAX_ANSWER)
    contexts = [c if isinstance(c, bytes) else c.encode() for c in _contexts()[::7]]
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(len(contexts))]
    names = ["answer", "answer_char_start", "answer_char_end"]
    here = tf.saved_model.load(path).signatures["serving_default"](
        question=tf.constant(questions), context=tf.constant(contexts))
    script = ("import json, sys\n"
              "import tensorflow as tf, tensorflow_text\n"
              "fn = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
              "questions, contexts, names = json.loads(sys.argv[2])\n"
              "contexts = [c.encode('latin-1') for c in contexts]  # the bytes, as sent\n"
              "out = fn(question=tf.constant(questions), context=tf.constant(contexts))\n"
              "print(json.dumps({'versions': [tf.__version__, tensorflow_text.__version__],\n"
              "  'answer': [a.decode() for a in out['answer'].numpy()],\n"
              "  **{k: out[k].numpy().tolist() for k in names[1:]}}))\n")
    sent = [c.decode("latin-1") for c in contexts]  # any bytes through JSON
    result = subprocess.run([python, "-c", script, path, json.dumps([questions, sent, names])],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-2000:]
    there = json.loads(result.stdout.strip().splitlines()[-1])
    assert there.pop("versions") == ["2.12.1", "2.12.1"]
    assert there == {"answer": [a.decode() for a in here["answer"].numpy()],
                     **{k: here[k].numpy().tolist() for k in names[1:]}}
    assert any(re.search("[가-힣]", a) for a in there["answer"])
    assert max(here["windows"].numpy()) > 1  # a context read in several windows
    assert any(isinstance(c, bytes) and c.decode("utf-8", "replace") != c.decode("utf-8", "ignore")
               for c in _contexts()[::7])  # ill-formed UTF-8 was sent
