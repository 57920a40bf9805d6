"""SQuAD v1.1 / v2.0: JSON -> windowed features, and logits -> text answers.

Follows Google's run_squad.py (Devlin et al. 2018, section 4.2-4.3):

Reading. A context is split on whitespace into words, remembering which word every
character belongs to, so an answer's `answer_start` (a character offset) maps to a word span.
For training, an answer whose text cannot be found in that word span (bad offsets, unusual
Unicode) is dropped; such answers are counted and their ids reported, never silently lost.
Offsets count characters (code points); answers whose offsets count UTF-16 code units (a
JavaScript tool's, one more per character outside the BMP) are named as such, found or not.
`is_impossible` is true or false (JSON's), or absent.
SQuAD v2.0 questions with `is_impossible: true` are answered by [CLS] (position 0). A
question's id is its "id", or "guid" where it has none (KLUE-MRC's files, which are SQuAD
2.0's layout otherwise: its unanswerable questions' "plausible_answers" are not read).

Features. The question is WordPiece-tokenized and cut to `max_query_length`; each context
word is tokenized on its own (so every sub-token knows its word). A context longer than
`max_seq_length - len(question) - 3` is covered by overlapping windows that start every
`doc_stride` sub-tokens: "[CLS] question [SEP] window [SEP]". A training window that does
not contain the whole answer is labelled (0, 0), i.e. [CLS]. A sub-token seen in several
windows is scored only in the window where it has the most context on both sides.

Postprocessing. For each question, the `n_best_size` best start and end logits of each
window give candidate spans (end >= start, at most `max_answer_length` sub-tokens, inside
the context, start in its max-context window); the best-scoring span is mapped back to the
original text. With SQuAD v2.0 the question is unanswerable ("") when the [CLS] score beats
the best span by more than `null_score_diff_threshold`.

Scoring (the official EM/F1) lives with the task: `bert_keras.finetuning.squad`.

Features (numpy, Google's names; `schema.model_inputs` renames them for the model):
  input_ids, input_mask, segment_ids: int32 [N, S]
  start_positions, end_positions: int32 [N] (training targets; 0 = [CLS])
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import unicodedata
from typing import Sequence

import numpy as np

from data_prep import files
from data_prep.classification import DataError, load_json
from data_prep.packing import pad_features
from data_prep.schema import CLS, SEP
from data_prep.tokenizer_config import TokenizerConfig


# Google's run_squad.py splits contexts on these (U+202F, narrow no-break space, included).
WHITESPACE = " \t\r\n\u202f"


def _is_whitespace(c: str) -> bool:
    return c in WHITESPACE


@dataclasses.dataclass
class SquadExample:
    """One question over one context.

    qas_id: the question id.
    question: question text.
    doc_tokens: the context split on whitespace ("words").
    answers: every gold answer text (for scoring; [] for unanswerable questions).
    start_word, end_word: word span of the training answer (-1 if impossible, None when
      the example is read for prediction only).
    answer_text: the training answer text ("" if impossible).
    is_impossible: SQuAD v2.0's flag.
    question_type: KLUE-MRC's "question_type" (1 paraphrase, 2 multi-sentence reasoning,
      3 unanswerable), for its scores by type; None where the file has none.
    """

    qas_id: str
    question: str
    doc_tokens: list
    answers: list
    start_word: int | None = None
    end_word: int | None = None
    answer_text: str | None = None
    is_impossible: bool = False
    question_type: int | None = None


@dataclasses.dataclass
class ReadStats:
    """What `read_squad` saw: question counts and the answers it could not place."""

    questions: int = 0
    impossible: int = 0
    multiple_answers: int = 0  # training questions with more than one answer (first used)
    answers_not_found: list = dataclasses.field(default_factory=list)  # (qas_id, reason)
    # Training answers found where answer_start is read as UTF-16 code units, not at it
    # (`_utf16_offset`): the file was made by a tool that counts so (JavaScript's strings).
    utf16_offsets: list = dataclasses.field(default_factory=list)  # qas_id

    def summary(self) -> str:
        text = (f"{self.questions} questions ({self.impossible} unanswerable), "
                f"{len(self.answers_not_found)} answers not found in their context")
        if self.answers_not_found:
            text += ": " + ", ".join(f"{q} ({why})" for q, why in self.answers_not_found[:5])
            if len(self.answers_not_found) > 5:
                text += f", ... ({len(self.answers_not_found) - 5} more)"
        if self.utf16_offsets:
            text += (f"; the answer_start of {len(self.utf16_offsets)} answers (first: "
                     f"{self.utf16_offsets[0]}) counts UTF-16 code units, as JavaScript's "
                     "strings do, not characters (code points) as SQuAD's: convert the "
                     "file's offsets")
        return text


def _split_context(context: str) -> tuple[list[str], list[int]]:
    """Words of `context` and, for every character, the index of its word."""
    doc_tokens, char_to_word = [], []
    prev_is_whitespace = True
    for c in context:
        if _is_whitespace(c):
            prev_is_whitespace = True
        else:
            if prev_is_whitespace:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_is_whitespace = False
        char_to_word.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word


def _require(obj, key, kind, where):
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(f"{where}: expected an object with a {key!r} field")
    value = obj[key]
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # "file: data[0].paragraphs" below the top level; "file: data" at it (not "file.data").
        element = f"{where}.{key}" if ": " in where else f"{where}: {key}"
        raise DataError(f"{element}: expected {' or '.join(k.__name__ for k in kinds)}, "
                        f"got {type(value).__name__}")
    return value


def _questions(path: str, version_2_with_negative: bool):
    """(where, element, context, qa) per question of a SQuAD file, in file order: `where`
    names it in messages ("file: data[i].paragraphs[j].qas[k]", "file:line"), `element`
    in a repeated id's message; `qa` a SQuAD question object (id, question, answers as a
    list of {text, answer_start}, is_impossible).

    Reads SQuAD's layout and transformers' run_qa.py data (the `datasets` layout): one
    question per object, {"id", "title", "context", "question", "answers": {"text": [...],
    "answer_start": [...]}}, as JSON lines or under {"data": [...]}. That layout marks no
    question unanswerable: one without answers is, with `version_2_with_negative` (as
    run_qa reads it).
    """
    lines = path.lower().endswith(".jsonl")
    if not lines:
        try:
            dataset = load_json(path)
        except DataError:
            lines = _first_line_is_a_question(path)
            if not lines:
                raise
    if lines:
        try:
            with files.rereadable(path) as source:
                for where, record in files.json_object_lines(source, path):
                    yield _flat_question(record, where, version_2_with_negative)
        except files.JsonFileError as e:
            raise DataError(str(e)) from None
        return
    if isinstance(dataset, dict) and "context" in dataset and "question" in dataset:
        yield _flat_question(dataset, f"{path}:1", version_2_with_negative)  # one line
        return
    for i, article in enumerate(_require(dataset, "data", list, path)):
        if isinstance(article, dict) and "paragraphs" not in article and "context" in article:
            yield _flat_question(article, f"{path}: data[{i}]", version_2_with_negative)
            continue
        for j, paragraph in enumerate(_require(article, "paragraphs", list, f"{path}: data[{i}]")):
            pwhere = f"{path}: data[{i}].paragraphs[{j}]"
            context = _require(paragraph, "context", str, pwhere)
            for k, qa in enumerate(_require(paragraph, "qas", list, pwhere)):
                yield f"{pwhere}.qas[{k}]", f"data[{i}].paragraphs[{j}].qas[{k}]", context, qa


def _first_line_is_a_question(path: str) -> bool:
    """Whether a file that is not one JSON value starts with a run_qa question object (a
    JSON-lines file named .json, as `datasets` writes it)."""
    try:
        with files.open_input(path) as f:
            first = next((line for line in f if line.strip()), "")
        record = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict) and "question" in record and "context" in record


def _flat_question(record, where: str, version_2_with_negative: bool):
    """(where, element, context, qa) of a run_qa question object (`_questions`)."""
    context = _require(record, "context", str, where)
    qa = {key: record[key] for key in ("id", "guid", "question", "is_impossible",
                                       "question_type") if key in record}
    answers = record.get("answers")
    if isinstance(answers, dict):  # datasets' layout: {"text": [...], "answer_start": [...]}
        texts = _require(answers, "text", list, f"{where}.answers")
        starts = _require(answers, "answer_start", list, f"{where}.answers")
        if len(texts) != len(starts):
            raise DataError(f"{where}.answers: {len(texts)} texts but {len(starts)} "
                            "answer_start offsets; expected one offset per text")
        qa["answers"] = [{"text": t, "answer_start": a} for t, a in zip(texts, starts)]
        if not texts and "is_impossible" not in qa and version_2_with_negative:
            qa["is_impossible"] = True  # run_qa's SQuAD 2.0: no answer, unanswerable
    elif answers is not None:
        qa["answers"] = answers  # a SQuAD answers list; _require checks it as SQuAD's
    element = where.split(": ", 1)[1] if ": " in where else where.rsplit(":", 1)[-1]
    return where, element if ": " in where else f"line {element}", context, qa


def read_squad(path: str, is_training: bool, version_2_with_negative: bool = False
               ) -> tuple[list[SquadExample], ReadStats]:
    """Reads a SQuAD-format JSON file.

    Args:
      path: {"data": [{"paragraphs": [{"context", "qas": [{"id", "question", "answers":
        [{"text", "answer_start"}], "is_impossible"?}]}]}]}.
      is_training: locate the (first) answer as a word span; drop answers that cannot be
        found (counted in the stats).
      version_2_with_negative: honour `is_impossible` (SQuAD v2.0). Without it, training
        refuses a question marked `is_impossible` or without answers (a v2.0 file read as
        v1.1 would otherwise lose every unanswerable question).

    Returns:
      (examples, stats).

    Raises:
      DataError: the JSON does not have SQuAD's structure (the failing element is named as
        file: data[i].paragraphs[j].qas[k]), or, outside training, two questions share an
        id (predictions and scores are keyed by it: one would silently replace the other),
        or, in training without version_2_with_negative, a question is unanswerable.
    """
    stats = ReadStats()
    examples = []
    first_seen: dict[str, str] = {}  # question id -> the element it first appeared in
    split = None  # (context, its words, char -> word) of the last context
    for where, element, context, qa in _questions(path, version_2_with_negative):
        if split is None or split[0] is not context:
            split = (context, *_split_context(context))
        _, doc_tokens, char_to_word = split
        # KLUE-MRC names the question id "guid".
        id_key = "guid" if isinstance(qa, dict) and "id" not in qa and "guid" in qa \
            else "id"
        if isinstance(qa, dict) and id_key not in qa:
            raise DataError(f"{where}: expected an object with an 'id' field (or "
                            "KLUE-MRC's 'guid')")
        qas_id = str(_require(qa, id_key, (str, int), where))
        if not is_training and qas_id in first_seen:
            raise DataError(f"{where}.id: question id {qas_id!r} is used twice (first "
                            f"at {first_seen[qas_id]}); predictions are keyed by id, "
                            "so every question needs its own")
        first_seen.setdefault(qas_id, element)
        question = _require(qa, "question", str, where)
        answers = _require(qa, "answers", list, where) if (is_training or "answers" in qa) else []
        for a, answer in enumerate(answers):
            _require(answer, "text", str, f"{where}.answers[{a}]")
        marked_impossible = qa.get("is_impossible", False)
        if not isinstance(marked_impossible, bool):
            # bool("false") is True: a string (a CSV's column turned into JSON) would
            # make every question unanswerable.
            raise DataError(f"{where}.is_impossible: expected true or false, got "
                            f"{marked_impossible!r}")
        if is_training and not version_2_with_negative and (marked_impossible or not answers):
            # A SQuAD 2.0 file read as v1.1: dropping these (as unfound answers) would
            # silently train a v1.1 model. Google's script refuses them too.
            raise DataError(
                f"{where}: question {qas_id!r} "
                f"{'is marked is_impossible' if marked_impossible else 'has no answer'}, "
                "and training without --version_2_with_negative needs an answer to "
                "every question (a SQuAD 2.0 file? pass --version_2_with_negative)")
        if is_training and version_2_with_negative and not (marked_impossible or
                                                            answers):
            # Dropped and counted before; Google's script refuses it too.
            raise DataError(
                f"{where}: question {qas_id!r} has no answer and is not marked "
                "is_impossible; a SQuAD 2.0 training question needs an answer, or "
                "\"is_impossible\": true")
        is_impossible = marked_impossible and version_2_with_negative
        stats.questions += 1
        stats.impossible += is_impossible
        kind = qa.get("question_type")
        example = SquadExample(qas_id, question, doc_tokens,
                               [] if is_impossible else [a["text"] for a in answers],
                               is_impossible=is_impossible,
                               question_type=kind if isinstance(kind, int) and
                               not isinstance(kind, bool) else None)
        if is_training:
            if is_impossible:
                example.start_word = example.end_word = -1
                example.answer_text = ""
            else:  # answered: refused above otherwise
                stats.multiple_answers += len(answers) > 1
                span, utf16 = _locate_answer(answers[0], context, doc_tokens,
                                             char_to_word, f"{where}.answers[0]")
                if utf16 is not None:
                    # Found or not: the span read at it is not the answer's.
                    stats.utf16_offsets.append(qas_id)
                if isinstance(span, str):
                    stats.answers_not_found.append((qas_id, span))
                    continue
                example.start_word, example.end_word = span
                example.answer_text = answers[0]["text"]
        examples.append(example)
    return examples, stats


def _locate_answer(answer, context, doc_tokens, char_to_word, where):
    """((start_word, end_word), or a short reason string when the answer cannot be placed;
    the character offset at which answer_start read as UTF-16 code units finds the answer
    (`_utf16_offset`), or None)."""
    text = answer["text"]
    start = answer.get("answer_start")
    if isinstance(start, bool) or not isinstance(start, int):
        raise DataError(f"{where}.answer_start: expected an integer, got {start!r}")
    if not text.strip():
        return "empty answer text", None
    end = start + len(text) - 1
    # SQuAD's answer_start counts characters (Python's code points); a file made by a
    # JavaScript or Java tool counts UTF-16 code units, one more for each character outside
    # the BMP (an emoji, a rare Hanja) before the answer. Named where that explains a
    # misplaced answer: the whole file is then so.
    utf16 = _utf16_offset(context, start, text)
    in_utf16 = (f"; it counts UTF-16 code units, as JavaScript's strings do ({text!r} is at "
                f"character {utf16}): SQuAD's answer_start counts characters (code points), so "
                "convert the file's offsets") if utf16 is not None else ""
    if start < 0 or end >= len(context):
        # Not a misaligned offset (those are dropped and counted, as Google's script does)
        # but an answer that cannot be in this context: the file is wrong.
        raise DataError(f"{where}.answer_start: {start} + len {len(text)} is outside the "
                        f"{len(context)}-character context"
                        + (in_utf16 or "; expected an offset into it"))
    start_word, end_word = char_to_word[start], char_to_word[end]
    if start_word < 0:  # starts in whitespace before the first word
        start_word = 0
    # Only keep answers whose text is recoverable from the words (Google's rule): a wrong
    # offset or unusual Unicode would otherwise teach the model a wrong span. Both sides with
    # every whitespace run as one space: the words keep the spaces the context is not split
    # at (U+00A0, U+3000, U+2009, ... inside a word; common in KorQuAD), which the answer's
    # str.split() removes, so such an answer was dropped as not found.
    actual = " ".join(" ".join(doc_tokens[start_word:end_word + 1]).split())
    cleaned = " ".join(text.split())
    if actual.find(cleaned) == -1:
        return f"{cleaned!r} not in {actual!r}" + in_utf16, utf16
    return (start_word, end_word), utf16


def _utf16_offset(context: str, start: int, text: str) -> int | None:
    """The character offset of `text` in `context` where it is not at character `start`
    but is at `start` counted in UTF-16 code units, else None."""
    if context[start:start + len(text)] == text:
        return None
    units = context.encode("utf-16-le")
    begin = 2 * start
    end = begin + len(text.encode("utf-16-le"))
    if start < 0 or end > len(units):
        return None
    try:
        if units[begin:end].decode("utf-16-le") != text:
            return None
        return len(units[:begin].decode("utf-16-le"))
    except UnicodeDecodeError:  # `start` splits a surrogate pair: not a character's offset
        return None


# ------------------------------------------------------------------------------------------
# Features


@dataclasses.dataclass
class SquadFeature:
    """One window of one example (what postprocessing needs besides the logits).

    tokens: the window's WordPieces, "[CLS] question [SEP] context... [SEP]".
    token_to_orig_map: window position -> word index in the example's doc_tokens.
    token_is_max_context: window position -> True if this window is the one that gives the
      sub-token the most context (only those positions may start an answer).
    """

    example_index: int
    doc_span_index: int
    tokens: list
    token_to_orig_map: dict
    token_is_max_context: dict
    start_position: int = 0
    end_position: int = 0


@dataclasses.dataclass
class FeatureStats:
    """What `convert_examples` produced."""

    examples: int = 0
    features: int = 0
    questions_truncated: int = 0  # question longer than max_query_length (cut)
    multi_window_examples: int = 0  # context split into more than one window
    answer_outside_window: int = 0  # training windows labelled [CLS] because the answer is elsewhere
    training: bool = False  # made for training (windows have answers to miss)

    def summary(self) -> str:
        return (f"{self.examples} examples -> {self.features} windows; "
                f"{self.multi_window_examples} contexts needed several windows; "
                f"{self.questions_truncated} questions truncated to max_query_length"
                + (f"; {self.answer_outside_window} training windows without the answer"
                   if self.training else ""))


def _improve_answer_span(doc_tokens, start, end, answer_pieces):
    """Narrows a word-level span to the sub-tokens that spell the answer, when possible.

    "(1895-1943)." is one word but "( 1895 - 1943 ) ." as sub-tokens; for the answer "1895"
    the sub-token span is better than the whole word.
    """
    tok_answer = " ".join(answer_pieces)
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start:new_end + 1]) == tok_answer:
                return new_start, new_end
    return start, end


def doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """Windows (start, length) over `num_tokens` sub-tokens: at most `max_tokens` long,
    starting every `doc_stride` tokens until one reaches the end."""
    if max_tokens < 1 or doc_stride < 1:
        raise ValueError(f"need max_tokens >= 1 and doc_stride >= 1, got {max_tokens}, {doc_stride}")
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def is_max_context(spans: Sequence[tuple[int, int]], span_index: int, position: int) -> bool:
    """True if window `span_index` gives sub-token `position` the most context: the best
    min(left, right) context, ties broken by 0.01 * window length (Google's score)."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return span_index == best_index


def convert_examples(examples: Sequence[SquadExample], tokenizer, max_seq_length: int,
                     doc_stride: int, max_query_length: int, is_training: bool):
    """Turns examples into fixed-length windows.

    Args:
      examples: from `read_squad` (read with the same `is_training`).
      tokenizer: see `data_prep.packing` (tokenize, convert_tokens_to_ids).
      max_seq_length: S.
      doc_stride: how far consecutive windows start apart, in sub-tokens.
      max_query_length: the question is cut to this many sub-tokens.
      is_training: compute start/end positions.

    Returns:
      (arrays, features, stats): arrays as in the module docstring; `features` a list of
      `SquadFeature` (one per window, same order); stats a `FeatureStats`.

    Raises:
      ValueError: max_seq_length <= max_query_length + 3 (no room for any context).
    """
    if max_seq_length <= max_query_length + 3:
        raise ValueError(f"max_seq_length ({max_seq_length}) must be greater than "
                         f"max_query_length ({max_query_length}) + 3")
    stats = FeatureStats(training=is_training)
    features: list[SquadFeature] = []
    ids, segments = [], []
    queries = tokenizer.tokenize([e.question for e in examples])
    answers = tokenizer.tokenize([e.answer_text or "" for e in examples]) if is_training else None
    # Examples of one paragraph share its doc_tokens list: tokenize each context once.
    contexts = {}
    for example in examples:
        contexts.setdefault(id(example.doc_tokens), example.doc_tokens)
    context_ids = list(contexts)
    flat = tokenizer.tokenize([w for c in context_ids for w in contexts[c]])
    context_pieces, offset = {}, 0
    for c in context_ids:
        context_pieces[c] = flat[offset:offset + len(contexts[c])]
        offset += len(contexts[c])

    for example_index, example in enumerate(examples):
        query = list(queries[example_index])
        if len(query) > max_query_length:
            query = query[:max_query_length]
            stats.questions_truncated += 1

        tok_to_orig, orig_to_tok, all_doc_tokens = [], [], []
        for i, pieces in enumerate(context_pieces[id(example.doc_tokens)]):
            orig_to_tok.append(len(all_doc_tokens))
            for sub in pieces:
                tok_to_orig.append(i)
                all_doc_tokens.append(sub)

        tok_start = tok_end = None
        if is_training and not example.is_impossible:
            tok_start = orig_to_tok[example.start_word]
            if example.end_word < len(example.doc_tokens) - 1:
                tok_end = orig_to_tok[example.end_word + 1] - 1
            else:
                tok_end = len(all_doc_tokens) - 1
            tok_start, tok_end = _improve_answer_span(all_doc_tokens, tok_start, tok_end,
                                                      answers[example_index])

        max_tokens_for_doc = max_seq_length - len(query) - 3  # [CLS], [SEP], [SEP]
        spans = doc_spans(len(all_doc_tokens), max_tokens_for_doc, doc_stride) or [(0, 0)]
        stats.examples += 1
        stats.multi_window_examples += len(spans) > 1
        for span_index, (span_start, span_length) in enumerate(spans):
            tokens = [CLS, *query, SEP]
            segment_ids = [0] * len(tokens)
            token_to_orig, max_context = {}, {}
            for i in range(span_length):
                split_index = span_start + i
                token_to_orig[len(tokens)] = tok_to_orig[split_index]
                max_context[len(tokens)] = is_max_context(spans, span_index, split_index)
                tokens.append(all_doc_tokens[split_index])
                segment_ids.append(1)
            tokens.append(SEP)
            segment_ids.append(1)

            start_position = end_position = 0
            if is_training and not example.is_impossible:
                doc_end = span_start + span_length - 1
                if tok_start >= span_start and tok_end <= doc_end:
                    offset = len(query) + 2  # [CLS] question [SEP]
                    start_position = tok_start - span_start + offset
                    end_position = tok_end - span_start + offset
                else:
                    stats.answer_outside_window += 1
            features.append(SquadFeature(example_index, span_index, tokens, token_to_orig,
                                         max_context, start_position, end_position))
            ids.append(tokenizer.convert_tokens_to_ids(tokens))
            segments.append(segment_ids)
    stats.features = len(features)
    arrays = pad_features(ids, segments, max_seq_length)
    arrays["start_positions"] = np.asarray([f.start_position for f in features], np.int32).reshape(-1)
    arrays["end_positions"] = np.asarray([f.end_position for f in features], np.int32).reshape(-1)
    return arrays, features, stats


# ------------------------------------------------------------------------------------------
# Postprocessing: logits -> text


def _normalize_chars(text: str, config: TokenizerConfig) -> tuple[str, list[int]]:
    """`text` as the tokenizer sees it, without whitespace, and each char's index in `text`.

    Uses the tokenizer's own per-character normalization (`tokenization.normalize_char`:
    cleaning, accent stripping and lowercasing as `config` says), so that an answer maps
    back exactly as it was tokenized, Korean settings included. One input character may
    become several (or none); each output character remembers its source.
    """
    # Imported here: data_prep.tokenization imports TensorFlow, and data_prep.tagging (which
    # imports this module) is read by processes that must not load it (the transformers
    # side of bench/bench_finetune_vs_transformers.py, whose memory would include it).
    from data_prep.tokenization import normalize_char

    out, source = [], []
    for i, c in enumerate(text):
        for ch in normalize_char(c, config):
            out.append(ch)
            source.append(i)
    return "".join(out), source


def final_text(pred_text: str, orig_text: str, config: TokenizerConfig) -> str:
    """Projects a detokenized prediction back onto the original words.

    `orig_text` is the original words the predicted sub-tokens came from ("Steve Smith's");
    `pred_text` is the sub-tokens joined ("steve smith"). Returns the shortest slice of
    `orig_text` that the tokenizer would turn into `pred_text` ("Steve Smith"), keeping the
    original casing, accents and punctuation; falls back to `orig_text` when the two cannot
    be aligned (e.g. the prediction contains [UNK]). Same contract as Google's
    get_final_text, aligned character by character instead of by equal lengths.
    """
    pred_ns, _ = _normalize_chars(pred_text, config)
    orig_ns, source = _normalize_chars(orig_text, config)
    if not pred_ns:
        return orig_text
    start = orig_ns.find(pred_ns)
    if start == -1:
        return orig_text
    end = source[start + len(pred_ns) - 1] + 1
    # Combining marks that follow the last character belong to it ("Rene" + U+0301 is
    # "René"), though accent stripping normalizes them to nothing.
    while end < len(orig_text) and unicodedata.category(orig_text[end]).startswith("M"):
        end += 1
    return orig_text[source[start]:end]


def _best_indexes(logits: np.ndarray, n_best_size: int) -> list[int]:
    # Stable sort, highest first: ties keep the lower index, as Python's sorted() does.
    return [int(i) for i in np.argsort(-np.asarray(logits), kind="stable")[:n_best_size]]


def _softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def postprocess(examples: Sequence[SquadExample], features: Sequence[SquadFeature],
                start_logits: np.ndarray, end_logits: np.ndarray, n_best_size: int = 20,
                max_answer_length: int = 30, tokenizer_config: TokenizerConfig | None = None,
                version_2_with_negative: bool = False, null_score_diff_threshold: float = 0.0):
    """Turns window logits into text answers (Google's write_predictions).

    Args:
      examples, features: from `read_squad` / `convert_examples`.
      start_logits, end_logits: float [N, S], one row per feature.
      n_best_size: candidates kept per window for start and end, and answers per question.
      max_answer_length: longest answer, in sub-tokens.
      tokenizer_config: the tokenizer's settings (for mapping answers back to the original
        text); default: BERT's uncased settings.
      version_2_with_negative: allow "" (no answer) when [CLS] scores best.
      null_score_diff_threshold: predict "" if null score - best span score > threshold.

    Returns:
      (predictions, nbest, null_odds): {qas_id: text}, {qas_id: [{"text", "probability",
      "start_logit", "end_logit"}]}, and {qas_id: null score - best span score} (v2 only).
    """
    tokenizer_config = tokenizer_config or TokenizerConfig()
    start_logits = np.asarray(start_logits, np.float64)
    end_logits = np.asarray(end_logits, np.float64)
    if start_logits.shape[0] != len(features) or end_logits.shape != start_logits.shape:
        raise ValueError(f"{len(features)} features but logits of shape {start_logits.shape} "
                         f"and {end_logits.shape}")
    by_example = collections.defaultdict(list)
    for index, feature in enumerate(features):
        by_example[feature.example_index].append(index)

    predictions, nbest_out, null_odds = {}, {}, {}
    for example_index, example in enumerate(examples):
        candidates = []  # (score, start_logit, end_logit, feature index, start, end)
        score_null, null_start, null_end = math.inf, 0.0, 0.0
        for fi in by_example.get(example_index, []):
            feature = features[fi]
            s_logits, e_logits = start_logits[fi], end_logits[fi]
            if version_2_with_negative:
                score = s_logits[0] + e_logits[0]
                if score < score_null:  # the smallest null score over windows
                    score_null, null_start, null_end = score, s_logits[0], e_logits[0]
            num_tokens = len(feature.tokens)  # padding can never be an answer: skip it
            for s in _best_indexes(s_logits[:num_tokens], n_best_size):
                for e in _best_indexes(e_logits[:num_tokens], n_best_size):
                    if s not in feature.token_to_orig_map or e not in feature.token_to_orig_map:
                        continue
                    if not feature.token_is_max_context.get(s, False):
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    candidates.append((s_logits[s] + e_logits[e], s_logits[s], e_logits[e], fi, s, e))
        if version_2_with_negative and math.isfinite(score_null):
            candidates.append((score_null, null_start, null_end, None, 0, 0))
        candidates.sort(key=lambda c: c[0], reverse=True)

        nbest, seen = [], set()
        for _, s_logit, e_logit, fi, s, e in candidates:
            if len(nbest) >= n_best_size:
                break
            if fi is not None:
                feature = features[fi]
                tok_text = " ".join(feature.tokens[s:e + 1]).replace(" ##", "").replace("##", "")
                tok_text = " ".join(tok_text.split())
                words = example.doc_tokens[feature.token_to_orig_map[s]:feature.token_to_orig_map[e] + 1]
                text = final_text(tok_text, " ".join(words), tokenizer_config)
            else:
                text = ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append({"text": text, "start_logit": float(s_logit), "end_logit": float(e_logit)})
        if version_2_with_negative and "" not in seen and math.isfinite(score_null):
            nbest.append({"text": "", "start_logit": float(null_start), "end_logit": float(null_end)})
        if not nbest:  # no valid span at all (e.g. empty context)
            nbest.append({"text": "", "start_logit": 0.0, "end_logit": 0.0})
        probs = _softmax([n["start_logit"] + n["end_logit"] for n in nbest])
        # Each entry's keys in Google's order (nbest_predictions.json keeps it).
        nbest = [{"text": n["text"], "probability": p, "start_logit": n["start_logit"],
                  "end_logit": n["end_logit"]} for n, p in zip(nbest, probs)]
        nbest_out[example.qas_id] = nbest

        best_non_null = next((n for n in nbest if n["text"]), None)
        if not version_2_with_negative:
            predictions[example.qas_id] = nbest[0]["text"]
        elif best_non_null is None:  # no span candidate at all: only "no answer" is left
            # Google's and transformers' odds there: the null score against an "empty"
            # entry of logits 0 (a number: the v2.0 script's --na-prob-file compares them).
            predictions[example.qas_id] = ""
            null_odds[example.qas_id] = float(score_null) if math.isfinite(score_null) else 0.0
        else:
            diff = float(score_null - best_non_null["start_logit"] - best_non_null["end_logit"])
            null_odds[example.qas_id] = diff
            predictions[example.qas_id] = "" if diff > null_score_diff_threshold else best_non_null["text"]
    return predictions, nbest_out, null_odds
