"""SQuAD: reading, doc_stride windows, answer spans, postprocessing and official scoring."""

import json
import os

import numpy as np
import pytest

from conftest import TESTDATA
from bert_keras.finetuning import squad as sq
from data_prep import squad
from data_prep.tokenizer_config import TokenizerConfig
from data_prep.tokenization import BertTokenizer

VOCAB = os.path.join(TESTDATA, "ft_vocab.txt")
V1 = os.path.join(TESTDATA, "ft_squad_v1.json")
V2 = os.path.join(TESTDATA, "ft_squad_v2.json")


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(VOCAB)


def ids_of(*tokens):
    vocab = [line.rstrip("\n") for line in open(VOCAB, encoding="utf-8")]
    return [vocab.index(t) for t in tokens]


def test_read_counts_answers_not_found():
    examples, stats = squad.read_squad(V1, is_training=True)
    assert [e.qas_id for e in examples] == ["q1", "q2", "q3", "q4"]
    assert [q for q, _ in stats.answers_not_found] == ["q5"]  # "Japan" at offset 3 is "n Sm"
    assert "1 answers not found" in stats.summary() and "q5" in stats.summary()
    assert (examples[0].start_word, examples[0].end_word) == (8, 11)  # "a gallon of milk"
    assert (examples[2].start_word, examples[2].end_word) == (2, 2)  # the word "(1895-1943)"
    # Prediction reading keeps every question and every gold answer.
    examples, stats = squad.read_squad(V1, is_training=False)
    assert len(examples) == 5 and examples[3].answers == ["Paris", "Paris, France"]
    assert stats.answers_not_found == []


@pytest.mark.parametrize("file_line_ends", ["\n", "\r\n"])
def test_answer_offsets_count_the_carriage_returns_of_a_windows_context(tmp_path,
                                                                        file_line_ends):
    """A context pasted from Windows holds "\\r\\n" (and a stray "\\r"): answer_start counts
    them as characters, as Google's run_squad and transformers' processor (each character
    of the string, "\\r" whitespace) do; the JSON's own CRLF line ends are whitespace."""
    context = "First line.\r\nSecond\rline has Seoul in it.\r\n\r\nThird: Busan."
    answers = ["Seoul", "Busan", "Second"]
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": f"q{i}", "question": "Where?",
         "answers": [{"text": a, "answer_start": context.index(a)}]}
        for i, a in enumerate(answers)]}]}]}
    path = tmp_path / "train.json"
    path.write_bytes(json.dumps(data, indent=1).replace("\n", file_line_ends).encode())
    examples, _ = squad.read_squad(str(path), is_training=True)
    assert examples[0].doc_tokens == ["First", "line.", "Second", "line", "has", "Seoul", "in",
                                      "it.", "Third:", "Busan."]
    assert [(e.start_word, e.end_word) for e in examples] == [(5, 5), (9, 9), (2, 2)]


def test_training_without_v2_flag_refuses_unanswerable_questions(tmp_path):
    """A SQuAD 2.0 file trained on without --version_2_with_negative: its unanswerable
    questions were counted as answers not found and dropped, training a v1.1 model with
    exit status 0 (Google's script refuses them)."""
    with pytest.raises(squad.DataError, match=r"ft_squad_v2.json: data\[0\].paragraphs\[1\]"
                       r".qas\[3\]: question 'q6' is marked is_impossible.*pass "
                       r"--version_2_with_negative"):
        squad.read_squad(V2, is_training=True)
    # No answers and no is_impossible field: refused the same way.
    path = tmp_path / "unanswered.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Oslo is cold.", "qas": [
        {"id": "a", "question": "Where?", "answers": [{"text": "Oslo", "answer_start": 0}]},
        {"id": "b", "question": "Why?", "answers": []}]}]}]}))
    with pytest.raises(squad.DataError, match=r"unanswered.json: data\[0\].paragraphs\[0\]"
                       r".qas\[1\]: question 'b' has no answer.*--version_2_with_negative"):
        squad.read_squad(str(path), is_training=True)
    # With the flag, or outside training, the same files read.
    examples, stats = squad.read_squad(V2, is_training=True, version_2_with_negative=True)
    assert examples[-1].qas_id == "q6" and stats.impossible == 1
    assert len(squad.read_squad(V2, is_training=False)[0]) == 6
    assert len(squad.read_squad(str(path), is_training=False)[0]) == 2
    # With the flag, a question neither answered nor marked is_impossible is malformed
    # SQuAD 2.0 (dropped and counted before; Google's script refuses it).
    with pytest.raises(squad.DataError, match=r"qas\[1\]: question 'b' has no answer and is "
                                              r"not marked is_impossible"):
        squad.read_squad(str(path), is_training=True, version_2_with_negative=True)


def test_doc_spans_and_max_context_hand_checked():
    # 12 sub-tokens, windows of 5 every 3: [0-4] [3-7] [6-10] [9-11].
    spans = squad.doc_spans(12, 5, 3)
    assert spans == [(0, 5), (3, 5), (6, 5), (9, 3)]
    # Token 4 is in windows 0 (left 4, right 0) and 1 (left 1, right 3): window 1 wins.
    assert not squad.is_max_context(spans, 0, 4) and squad.is_max_context(spans, 1, 4)
    # Token 7: window 1 (left 4, right 0) vs window 2 (left 1, right 3): window 2.
    assert squad.is_max_context(spans, 2, 7) and not squad.is_max_context(spans, 1, 7)


def test_windows_across_doc_stride_boundaries(tokenizer):
    examples, _ = squad.read_squad(V1, is_training=True)
    arrays, features, stats = squad.convert_examples(examples[:2], tokenizer, max_seq_length=12,
                                                     doc_stride=3, max_query_length=8,
                                                     is_training=True)
    # Question "who bought milk ?" = 4 sub-tokens -> 12 - 4 - 3 = 5 context tokens a window.
    assert [f.doc_span_index for f in features] == [0, 1, 2, 3, 0, 1, 2, 3]
    np.testing.assert_array_equal(arrays["input_ids"][1], ids_of(
        "[CLS]", "who", "bought", "milk", "?", "[SEP]", "to", "the", "store", "and", "bought", "[SEP]"))
    np.testing.assert_array_equal(arrays["segment_ids"][1], [0] * 6 + [1] * 6)
    last = ids_of("[CLS]", "who", "bought", "milk", "?", "[SEP]", "gallon", "of", "milk", "[SEP]")
    np.testing.assert_array_equal(arrays["input_ids"][3], last + [0, 0])
    np.testing.assert_array_equal(arrays["input_mask"][3], [1] * 10 + [0, 0])
    assert features[1].token_to_orig_map == {6: 3, 7: 4, 8: 5, 9: 6, 10: 7}
    assert features[1].token_is_max_context == {6: False, 7: True, 8: True, 9: True, 10: False}
    # q1's answer "a gallon of milk" (tokens 8-11) lies across the boundary of windows 2 [6-10]
    # and 3 [9-11]: no window holds all of it, so every window is labelled [CLS].
    np.testing.assert_array_equal(arrays["start_positions"][:4], [0, 0, 0, 0])
    # q2's answer "bought a gallon" (tokens 7-9) is inside window 2 only, at 7-6+6 = 7 .. 9.
    np.testing.assert_array_equal(arrays["start_positions"][4:], [0, 0, 7, 0])
    np.testing.assert_array_equal(arrays["end_positions"][4:], [0, 0, 9, 0])
    assert stats.answer_outside_window == 7 and stats.multi_window_examples == 2


def test_answer_span_narrowed_to_sub_tokens(tokenizer):
    examples, _ = squad.read_squad(V1, is_training=True)
    arrays, features, _ = squad.convert_examples([examples[2]], tokenizer, 32, 16, 10, True)
    tokens = features[0].tokens
    # "when was john smith born ?" then "john smith ( 18 ##95 - 19 ##43 ) was born ...".
    assert tokens[:12] == ["[CLS]", "when", "was", "john", "smith", "born", "?", "[SEP]",
                           "john", "smith", "(", "18"]
    # The word is "(1895-1943)", but the answer "1895" is exactly the sub-tokens 18 ##95.
    assert (arrays["start_positions"][0], arrays["end_positions"][0]) == (11, 12)
    assert features[0].token_to_orig_map[11] == 2 and features[0].token_to_orig_map[12] == 2


def test_question_truncated_and_counted(tokenizer):
    examples, _ = squad.read_squad(V1, is_training=False)
    _, features, stats = squad.convert_examples(examples[2:3], tokenizer, 20, 8, 3, False)
    assert features[0].tokens[:5] == ["[CLS]", "when", "was", "john", "[SEP]"]
    assert stats.questions_truncated == 1
    with pytest.raises(ValueError, match="must be greater than max_query_length"):
        squad.convert_examples(examples, tokenizer, 10, 8, 7, False)


def _logits(features, picks, seq):
    """Start/end logits of 0 except +5 at picks {feature index: (start, end)}."""
    start, end = np.zeros((len(features), seq)), np.zeros((len(features), seq))
    for i, (s, e) in picks.items():
        start[i, s] += 5
        end[i, e] += 5
    return start, end


def test_postprocess_picks_max_context_window(tokenizer):
    examples, _ = squad.read_squad(V1, is_training=False)
    _, features, _ = squad.convert_examples(examples[1:2], tokenizer, 12, 3, 8, False)
    # The best scores point at "bought a gallon" in window 2 (positions 7-9), but window 1
    # has an even higher score on "bought" (position 10), where "bought" lacks context.
    start, end = _logits(features, {2: (7, 9), 1: (10, 10)}, 12)
    start[1, 10] += 1
    preds, nbest, _ = squad.postprocess(examples[1:2], features, start, end, n_best_size=5,
                                        max_answer_length=30)
    assert preds == {"q2": "bought a gallon"}
    assert nbest["q2"][0]["text"] == "bought a gallon"
    assert sum(n["probability"] for n in nbest["q2"]) == pytest.approx(1.0)
    # With max_answer_length 2 the 3-token span is not allowed.
    preds, _, _ = squad.postprocess(examples[1:2], features, start, end, 5, max_answer_length=2)
    assert preds["q2"] != "bought a gallon"


def test_postprocess_maps_sub_tokens_back_to_original_text(tokenizer):
    examples, _ = squad.read_squad(V1, is_training=False)
    _, features, _ = squad.convert_examples(examples[2:4], tokenizer, 32, 16, 10, False)
    # q3: "18 ##95" (positions 11-12) -> "1895", not the whole word "(1895-1943)".
    # q4: "paris ," -> "Paris," keeps case and punctuation of the original.
    q4_paris = features[1].tokens.index("paris")
    start, end = _logits(features, {0: (11, 12), 1: (q4_paris, q4_paris + 1)}, 32)
    preds, _, _ = squad.postprocess(examples[2:4], features, start, end)
    assert preds == {"q3": "1895", "q4": "Paris,"}


@pytest.mark.parametrize("pred, orig, lower, expected", [
    ("steve smith", "Steve Smith's", True, "Steve Smith"),
    ("cafe", "Café.", True, "Café"),
    ("1895", "(1895-1943).", True, "1895"),
    ("[UNK]", "☃x", True, "☃x"),  # cannot align: the original words
    ("new york", "NEW  York", True, "NEW  York"),
    ("New", "New York", False, "New"),
    # An accent stored as a combining mark (NFD) stays on its letter: uncased BERT strips it
    # from the tokens, and before, the answer lost it ("Rene": EM and F1 0).
    ("rene", "Rene\u0301", True, "Rene\u0301"),
    ("rene dit", "Rene\u0301 dit\u0301.", True, "Rene\u0301 dit\u0301"),
])
def test_final_text(pred, orig, lower, expected):
    assert squad.final_text(pred, orig, TokenizerConfig(do_lower_case=lower)) == expected


def test_v2_null_answer(tokenizer):
    examples, stats = squad.read_squad(V2, is_training=True, version_2_with_negative=True)
    assert stats.impossible == 1 and examples[-1].is_impossible
    arrays, features, _ = squad.convert_examples(examples, tokenizer, 32, 16, 10, True)
    assert (arrays["start_positions"][-1], arrays["end_positions"][-1]) == (0, 0)
    examples, _ = squad.read_squad(V2, is_training=False, version_2_with_negative=True)
    q6 = [e for e in examples if e.qas_id == "q6"]
    _, features, _ = squad.convert_examples(q6, tokenizer, 32, 16, 10, False)
    span = features[0].tokens.index("john")
    start, end = _logits(features, {0: (span, span + 1)}, 32)
    start[0, 0] = end[0, 0] = 5.5  # null score 11 vs span score 5 + 5: diff 1
    preds, nbest, odds = squad.postprocess(q6, features, start, end, version_2_with_negative=True)
    assert preds == {"q6": ""} and odds["q6"] == pytest.approx(1.0)
    assert {n["text"] for n in nbest["q6"]} >= {"", "John Smith"}
    preds, _, _ = squad.postprocess(q6, features, start, end, version_2_with_negative=True,
                                    null_score_diff_threshold=1.5)
    assert preds == {"q6": "John Smith"}


# ---- Official scoring, hand-computed.


@pytest.mark.parametrize("text, normalized", [
    ("The  Quick, brown fox!", "quick brown fox"),
    ("an apple a day", "apple day"),
    ("Another theory", "another theory"),  # articles only as whole words
    ("\tNew\nYork  ", "new york"),
    ("U.S.-based", "usbased"),
])
def test_normalize_answer(text, normalized):
    assert sq.normalize_answer(text) == normalized


def test_exact_match_and_f1_hand_computed():
    assert sq.exact_match("the Eiffel Tower", "Eiffel Tower.") == 1.0
    assert sq.exact_match("Eiffel", "Eiffel Tower") == 0.0
    # pred {eiffel, tower, in, paris} vs gold {eiffel, tower}: P 2/4, R 1 -> F1 2/3.
    assert sq.f1("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 / 3)
    # Repeated tokens count with multiplicity: pred "a a b" -> {b}; gold "b b c": common 1,
    # P 1/1, R 1/3 -> 0.5.
    assert sq.f1("a a b", "b b c") == pytest.approx(0.5)
    assert sq.f1("the", "a") == 0.0  # both normalise to nothing: v1.1 scores 0
    assert sq.f1("the", "a", version_2=True) == 1.0  # v2.0: empty == empty


def test_evaluate_hand_computed_with_multiple_gold_answers():
    gold = {"a": ["Denver Broncos", "The Denver Broncos"], "b": ["Paris, France", "Paris"],
            "c": ["1895"]}
    preds = {"a": "the denver broncos!", "b": "in Paris France", "c": "1943"}
    result = sq.evaluate(gold, preds)
    # a: EM 1, F1 1. b: EM 0; F1 max(vs "paris france": P 2/3 R 1 -> 0.8, vs "paris": P 1/3
    # R 1 -> 0.5) = 0.8. c: 0, 0.
    assert result["exact_match"] == pytest.approx(100 / 3)
    assert result["f1"] == pytest.approx(100 * 1.8 / 3)
    assert result["total"] == 3 and result["missing"] == 0
    result = sq.evaluate(gold, {"a": "Denver Broncos"})
    assert result["exact_match"] == pytest.approx(100 / 3) and result["missing"] == 2


def test_evaluate_v2_has_and_no_answer():
    gold = sq.gold_answers(V2, version_2_with_negative=True)
    assert gold["q6"] == [] and gold["q4"] == ["Paris", "Paris, France"]
    preds = {"q1": "a gallon of milk", "q2": "", "q3": "1895", "q4": "Paris France",
             "q5": "Japan", "q6": ""}
    result = sq.evaluate(gold, preds, version_2_with_negative=True)
    # Answerable: q1 1/1, q2 0/0, q3 1/1, q4 EM 1 ("paris france" == "paris france"), q5 1/1.
    assert result["HasAns_total"] == 5 and result["HasAns_exact"] == pytest.approx(80.0)
    assert result["NoAns_total"] == 1 and result["NoAns_exact"] == 100.0
    assert result["exact_match"] == pytest.approx(500 / 6)
    result = sq.evaluate(gold, dict(preds, q6="John Smith"), version_2_with_negative=True)
    assert result["NoAns_exact"] == 0.0 and result["NoAns_f1"] == 0.0


# ---- KorQuAD 1.0's and KLUE-MRC's scores, hand-computed.


@pytest.mark.parametrize("text, normalized", [
    ("《토지》", "토지"),  # its quotes and brackets become spaces
    ("‘한강’의 길이", "한강 의 길이"),
    ("(약) 494킬로미터.", "약 494킬로미터"),
    ("The  Tower", "the tower"),  # no article removal
    ("1,947미터", "1947미터"),
])
def test_normalize_korquad(text, normalized):
    assert sq.normalize_korquad(text) == normalized


def test_korquad_f1_is_over_characters():
    # A right answer with its particle: SQuAD's word F1 gives nothing, KorQuAD's 2 * (3/4 *
    # 1) / (3/4 + 1) = 6/7.
    assert sq.f1("서울시는", "서울시") == 0.0
    assert sq.korquad_f1("서울시는", "서울시") == pytest.approx(6 / 7)
    # Spaces do not count: pred {오, 전, 4, 시} vs gold {4, 시}: P 2/4, R 1 -> 2/3.
    assert sq.korquad_f1("오전 4시", "4시") == pytest.approx(2 / 3)
    # With multiplicity: pred {가, 가, 나} vs gold {가, 나, 나, 다}: common 2, P 2/3, R 2/4.
    assert sq.korquad_f1("가가나", "가나나다") == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
    assert sq.korquad_f1("", "") == 0.0  # KorQuAD 1.0's script: nothing in common
    assert sq.korquad_f1("《》", "", version_2=True) == 1.0  # both normalise to ""


@pytest.mark.parametrize("text, normalized", [
    ("《토지》", "《토지》"),  # KLUE's pattern never matches a lone bracket
    ("'토지'", "토지"),  # ASCII punctuation goes
    ("The  Tower!", "the tower"),
    ("\"()‘’", ""),  # the one run its pattern replaces... then the ASCII ones
])
def test_normalize_klue_mrc(text, normalized):
    assert sq.normalize_klue_mrc(text) == normalized


def _longest_common_run(a, b):
    """The longest common substring's length, by brute force (a reference for difflib's)."""
    return max((k for i in range(len(a)) for j in range(len(b))
                for k in range(1, min(len(a) - i, len(b) - j) + 1) if a[i:i + k] == b[j:j + k]),
               default=0)


def test_rouge_w_hand_computed_and_against_brute_force():
    # Longest common run "4시": P 2/5 (the space counts), R 1 -> 4/7.
    assert sq.rouge_w("오전 4시", "4시") == pytest.approx(4 / 7)
    assert sq.rouge_w("", "") == 1.0 and sq.rouge_w("4시", "") == 0.0
    assert sq.rouge_w("", "4시") == 0.0 and sq.rouge_w("가나", "다라") == 0.0
    rng = np.random.default_rng(0)
    for _ in range(300):
        a, b = ("".join(rng.choice(list("가나다 4"), size=rng.integers(1, 15)))
                for _ in range(2))
        run = _longest_common_run(a, b)
        expected = 2 * (run / len(a)) * (run / len(b)) / (run / len(a) + run / len(b)) \
            if run else 0.0
        assert sq.rouge_w(a, b) == pytest.approx(expected), (a, b)


def test_evaluate_korquad_hand_computed():
    gold = {"a": ["한라산"], "b": ["1,947미터"], "c": ["1446년", "1446년에"]}
    preds = {"a": "《한라산》", "b": "높이 1,947미터로", "c": "1446년에"}
    result = sq.evaluate(gold, preds, metric=sq.KORQUAD)
    # a: EM 1 (brackets become spaces), F1 1. b: pred {높, 이, 1, 9, 4, 7, 미, 터, 로} vs
    # gold {1, 9, 4, 7, 미, 터}: P 6/9, R 1 -> 0.8. c: EM 1 against the second answer.
    assert result == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(280 / 3),
                      "total": 3, "missing": 0}
    # SQuAD's script on the same: a keeps its brackets ("《한라산》"), b's words share
    # nothing; c alone scores.
    assert sq.evaluate(gold, preds)["f1"] == pytest.approx(100 / 3)


def test_evaluate_klue_mrc_hand_computed_with_types():
    gold = {"q1": ["《토지》"], "q2": ["하동군"], "q3": [], "q4": ["해운대 일대"]}
    preds = {"q1": "토지", "q2": "경상남도 하동군", "q3": "", "q4": "해운대"}
    types = {"q1": 1, "q2": 2, "q3": 3, "q4": 1}
    result = sq.evaluate(gold, preds, version_2_with_negative=True, metric=sq.KLUE_MRC,
                         question_types=types)
    # q1: EM 0 ("토지" vs "《토지》"), ROUGE-W: run 2, P 1, R 2/4 -> 2/3. q2: EM 0, run 3,
    # P 3/8, R 1 -> 6/11. q3: "" vs "": 1, 1. q4: EM 0, run 3, P 1, R 3/6 -> 2/3.
    rouge = [2 / 3, 6 / 11, 1.0, 2 / 3]
    assert result["exact_match"] == pytest.approx(25.0) and "f1" not in result
    assert result["rouge_w"] == pytest.approx(100 * sum(rouge) / 4)
    assert (result["type1_total"], result["type2_total"], result["type3_total"]) == (2, 1, 1)
    assert result["type1_rouge_w"] == pytest.approx(100 * (2 / 3 + 2 / 3) / 2)
    assert result["type3_exact_match"] == 100.0
    assert result["NoAns_total"] == 1 and result["HasAns_rouge_w"] == pytest.approx(
        100 * (2 / 3 + 6 / 11 + 2 / 3) / 3)
    # Without the flag, KLUE's metric still scores an unanswerable question against "".
    assert sq.evaluate(gold, preds, metric=sq.KLUE_MRC)["exact_match"] == pytest.approx(25.0)
    # A question without a type is type 1, as KLUE's reader defaults it: q1 and q4 here.
    untyped = sq.evaluate(gold, preds, metric=sq.KLUE_MRC, question_types={"q2": 2, "q3": 3})
    assert {k: untyped[k] for k in untyped if k.startswith("type")} == \
        {k: result[k] for k in result if k.startswith("type")}
    alone = sq.evaluate(gold, preds, metric=sq.KLUE_MRC)
    assert (alone["type1_total"], alone["type1_rouge_w"]) == (4, alone["rouge_w"])
    assert not any(k.startswith("type2") for k in alone)


def test_klue_mrc_question_types_are_read(tmp_path):
    path = os.path.join(TESTDATA, "glue", "klue_benchmark", "klue-mrc-v1.1",
                        "klue-mrc-v1.1_dev.json")
    examples, _ = squad.read_squad(path, is_training=False, version_2_with_negative=True)
    assert [e.question_type for e in examples] == [1, 2, 3, 1, 2]
    examples, _ = squad.read_squad(V2, is_training=False, version_2_with_negative=True)
    assert {e.question_type for e in examples} == {None}


def test_no_span_candidate_has_numeric_null_odds(tokenizer):
    """A question whose windows give no valid span (every candidate outside the context):
    "" with the null score as its odds, a number as Google's and transformers' (the v2.0
    script's --na-prob-file compares them; null broke it)."""
    examples, _ = squad.read_squad(V2, is_training=False, version_2_with_negative=True)
    q6 = [e for e in examples if e.qas_id == "q6"]
    _, features, _ = squad.convert_examples(q6, tokenizer, 32, 16, 10, False)
    start, end = _logits(features, {0: (1, 1)}, 32)  # position 1: a question token
    start[0, 0], end[0, 0] = 0.5, 0.25
    preds, nbest, odds = squad.postprocess(q6, features, start, end, n_best_size=1,
                                           version_2_with_negative=True)
    assert preds == {"q6": ""} and odds == {"q6": 0.75}
    assert json.loads(json.dumps(odds))["q6"] > -1  # what the v2.0 script does with it


def test_question_ids_used_twice_are_refused_outside_training(tmp_path):
    """predictions.json and the scores are keyed by id: a second question with the same id
    replaced the first (the v2.0 script scored both)."""
    path = tmp_path / "dup.json"
    qas = [{"id": "dup", "question": q, "answers": [{"text": "Oslo", "answer_start": 0}]}
           for q in ("Where?", "Which city?")]
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Oslo is cold.",
                                                          "qas": qas}]}]}))
    with pytest.raises(squad.DataError, match=r"dup.json: data\[0\].paragraphs\[0\].qas\[1\]"
                       r".id: question id 'dup' is used twice \(first at data\[0\]"
                       r".paragraphs\[0\].qas\[0\]\)"):
        squad.read_squad(str(path), is_training=False)
    assert len(squad.read_squad(str(path), is_training=True)[0]) == 2  # training reads both


def test_malformed_squad_names_the_element(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "x", "qas": [{"question": "q"}]}]}]}))
    with pytest.raises(squad.DataError, match=r"data\[0\].paragraphs\[0\].qas\[0\]: expected an object with an 'id'"):
        squad.read_squad(str(path), is_training=False)
    path.write_text(json.dumps({"data": {"paragraphs": []}}))
    with pytest.raises(squad.DataError, match=r"bad.json: data: expected list, got dict"):
        squad.read_squad(str(path), is_training=False)
    path.write_text("{\n  \"data\": [\n}")
    with pytest.raises(squad.DataError, match=r"bad.json:3: not valid JSON"):
        squad.read_squad(str(path), is_training=False)


def test_allennlp_squad_fixture_round_trip():
    """DATA.md's SQuAD-format fixture: windows + oracle logits + postprocessing + scoring."""
    from public_data import datasets, fetch

    try:
        path = str(datasets.fetch_allennlp_fixtures() / "squad.json")
        vocab = str(fetch.bert_base_uncased_vocab())
    except fetch.FetchError as e:
        pytest.skip(f"registry unreachable, cannot fetch the allennlp fixture: {e}")
    tokenizer = BertTokenizer(vocab)
    train, stats = squad.read_squad(path, is_training=True)
    assert len(train) == 5 and stats.answers_not_found == []
    arrays, features, fstats = squad.convert_examples(train, tokenizer, 96, 32, 24, True)
    assert fstats.multi_window_examples == 5  # 695- and 516-character contexts, 96-token windows
    # Oracle logits: every window that holds the answer points at it.
    start, end = _logits(features, {i: (s, e) for i, (s, e) in enumerate(
        zip(arrays["start_positions"], arrays["end_positions"])) if s > 0}, 96)
    preds, _, _ = squad.postprocess(train, features, start, end)
    result = sq.evaluate(sq.gold_answers(path), preds)
    # Every answer comes back exactly, "Father Julius Nieuwl" included: it ends inside the
    # word "Nieuwland", but the WordPieces "ni ##eu ##wl" spell it, so the span is narrowed
    # to them and the text is cut inside the original word.
    assert preds["5733b1da4776f4190066106b"] == "Father Julius Nieuwl"
    assert preds == {e.qas_id: e.answer_text for e in train}
    assert result == {"exact_match": 100.0, "f1": 100.0, "total": 5, "missing": 0}


def test_klue_mrc_questions_are_keyed_by_their_guid(tmp_path):
    """KLUE-MRC's files are SQuAD 2.0's layout with the question id named "guid" (no "id"):
    every question was refused ("expected an object with a 'id' field"). Hand-written
    rows in its layout (tests/testdata/glue/klue_benchmark/klue-mrc-v1.1/)."""
    path = os.path.join(TESTDATA, "glue", "klue_benchmark", "klue-mrc-v1.1",
                       "klue-mrc-v1.1_train.json")
    examples, stats = squad.read_squad(path, is_training=True, version_2_with_negative=True)
    assert [e.qas_id for e in examples] == ["klue-mrc-v1_train_00001", "klue-mrc-v1_train_00002",
                                            "klue-mrc-v1_train_00003"]
    assert [e.is_impossible for e in examples] == [False, True, False]
    assert examples[0].answer_text == "오전 4시" and examples[1].answer_text == ""
    assert stats.impossible == 1 and not stats.answers_not_found
    # "id" wins where a question has both.
    data = json.load(open(path, encoding="utf-8"))
    data["data"][0]["paragraphs"][0]["qas"][0]["id"] = "q1"
    both = tmp_path / "both.json"
    both.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    examples, _ = squad.read_squad(str(both), is_training=False, version_2_with_negative=True)
    assert examples[0].qas_id == "q1"
    # Neither: the error names both.
    del data["data"][0]["paragraphs"][0]["qas"][0]["id"]
    del data["data"][0]["paragraphs"][0]["qas"][0]["guid"]
    both.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(squad.DataError, match=r"both.json: data\[0\].paragraphs\[0\].qas\[0\]: "
                                        r"expected an object with an 'id' field \(or KLUE-MRC's "
                                        r"'guid'\)$"):
        squad.read_squad(str(both), is_training=False, version_2_with_negative=True)


def test_answers_across_unsplit_spaces_are_found_and_labelled(tmp_path):
    """KorQuAD-style contexts hold spaces that run_squad does not split words at (U+00A0,
    U+3000, U+2009, U+2028, U+0085, and U+00A0 as a word of its own between two spaces); the
    tokenizer does. An answer across one was dropped as "not found" (the answer's
    str.split() removed that space, the word kept it). Each is now found, labelled with exactly its own WordPieces, and the label maps back to the
    answer as it is in the context (hand-checked)."""
    contexts = ["서울은 대한민국의\xa0수도이다.", "부산은\u3000\u3000항구 도시이다.",
                "도시\u2009이름도\xa0나옵니다.", "조용히\u2028공부하는\x85학생들이",
                "세종대왕은 \xa0 1443년에 창제했다."]
    answers = ["대한민국의\xa0수도", "부산은\u3000\u3000항구", "이름도\xa0나옵니다",
               "조용히\u2028공부하는", "세종대왕은 \xa0 1443년에"]
    chars = sorted({c for text in contexts for c in text if not c.isspace()})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars,
                                *("##" + c for c in chars)]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(vocab), do_lower_case=True, strip_accents=False)
    path = tmp_path / "korquad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [
        {"context": c, "qas": [{"id": f"q{i}", "question": "무엇?",
                                "answers": [{"text": a, "answer_start": c.index(a)}]}]}
        for i, (c, a) in enumerate(zip(contexts, answers))]}]}, ensure_ascii=False),
        encoding="utf-8")
    examples, stats = squad.read_squad(str(path), is_training=True)
    assert stats.answers_not_found == []
    assert [(e.start_word, e.end_word) for e in examples] == [(1, 1), (0, 0), (0, 0), (0, 0),
                                                                (0, 2)]
    arrays, features, _ = squad.convert_examples(examples, tokenizer, 48, 16, 8, True)
    pieces = tokenizer.tokenize(answers)
    for feature, want in zip(features, pieces):
        assert feature.tokens[feature.start_position:feature.end_position + 1] == want
    # The labels, as logits, give back each answer (run_squad joins words with one space).
    seq = arrays["input_ids"].shape[1]
    start, end = _logits(features, {i: (f.start_position, f.end_position)
                                    for i, f in enumerate(features)}, seq)
    preds, _, _ = squad.postprocess(examples, features, start, end,
                                    tokenizer_config=tokenizer.config)
    assert preds == {"q0": "대한민국의\xa0수도", "q1": "부산은\u3000\u3000항구",
                     "q2": "이름도\xa0나옵니다", "q3": "조용히\u2028공부하는",
                     "q4": "세종대왕은 \xa0 1443년에"}


def _utf16_units(text: str) -> int:
    """len(text) as JavaScript counts it: UTF-16 code units, two for a character outside
    the BMP."""
    return len(text.encode("utf-16-le")) // 2


def test_answer_offsets_count_characters_and_a_javascript_files_utf16_ones_are_named(
        tmp_path):
    """SQuAD's answer_start counts characters (Python's code points: the dataset's
    definition, as Google's reader indexes the context). A file whose tool counts UTF-16
    code units (JavaScript's string indices) has every answer after an emoji or other
    character outside the BMP one unit further per such character: read as characters,
    some are still "found" in a longer word span, some are not, and one near the end fell
    outside the context with a message that said nothing of why. Each is now named."""
    context = "Fans 😀😀 love it 🎉 and John Smith won in 1895 🎉🎉 at the end"
    answers = ["love", "it", "John Smith", "1895"]

    def squad_file(name, offset, texts, context=context):
        path = tmp_path / name
        path.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": [
            {"id": f"q{i}", "question": "?",
             "answers": [{"text": t, "answer_start": offset(context, context.index(t))}]}
            for i, t in enumerate(texts)]}]}]}, ensure_ascii=False), encoding="utf-8")
        return str(path)

    def chars(context, i):
        return i

    def utf16(context, i):
        return _utf16_units(context[:i])

    # Offsets in characters: each answer is exactly its own words, and nothing is flagged.
    examples, stats = squad.read_squad(squad_file("chars.json", chars, answers), True)
    assert [" ".join(e.doc_tokens[e.start_word:e.end_word + 1]) for e in examples] == answers
    assert stats.utf16_offsets == [] and "UTF-16" not in stats.summary()
    # In UTF-16 units: found in longer word spans ("love it", ...), and named.
    examples, stats = squad.read_squad(squad_file("js.json", utf16, answers), True)
    assert len(examples) == 4 and stats.answers_not_found == []
    assert stats.utf16_offsets == ["q0", "q1", "q2", "q3"]
    assert ("the answer_start of 4 answers (first: q0) counts UTF-16 code units, as "
            "JavaScript's strings do") in stats.summary()
    # "a" after three emoji: units 7 are the space before "b", so the word span is "b".
    examples, stats = squad.read_squad(squad_file("short.json", utf16, ["a"], "😀😀😀 a b c"),
                                       True)
    assert examples == [] and stats.answers_not_found == [
        ("q0", "'a' not in 'b'; it counts UTF-16 code units, as JavaScript's strings do ('a' "
               "is at character 4): SQuAD's answer_start counts characters (code points), so "
               "convert the file's offsets")]
    # "the end" (character 51 of 58) at unit 56: past the context's end, refused saying why.
    with pytest.raises(squad.DataError, match=(
            r"qas\[0\].answers\[0\].answer_start: 56 \+ len 7 is outside the 58-character "
            r"context; it counts UTF-16 code units, as JavaScript's strings do \('the end' is "
            r"at character 51\): SQuAD's answer_start counts characters")):
        squad.read_squad(squad_file("end.json", utf16, ["the end"]), True)


@pytest.mark.parametrize("value", ["false", "true", 0, None])
def test_is_impossible_must_be_true_or_false(tmp_path, value):
    """bool("false") is True: a file whose is_impossible is a string (a CSV column turned
    into JSON) made every question unanswerable; each such value is refused, naming the
    element."""
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Oslo is cold.", "qas": [
        {"id": "q0", "question": "Where?", "is_impossible": value,
         "answers": [{"text": "Oslo", "answer_start": 0}]}]}]}]}))
    for training in (True, False):
        with pytest.raises(squad.DataError, match=(
                r"v2.json: data\[0\].paragraphs\[0\].qas\[0\].is_impossible: expected true or "
                rf"false, got {value!r}$")):
            squad.read_squad(str(path), training, version_2_with_negative=True)
