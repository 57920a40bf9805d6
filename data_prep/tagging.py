"""Token tagging data (CoNLL-style files) -> features, and predictions back to words.

File format (CoNLL 2003 and friends): one token per line, columns separated by ASCII
whitespace (spaces or tabs; a word keeps a no-break or ideographic space), the
word in `token_column` and its tag in `tag_column` (default: first and last); a blank line ends
a sentence; `-DOCSTART-` lines end one too and are kept with the blank lines around them
(`TaggedSentence.preceding`), so the predictions file has the input's lines. Every token
line has the same number of columns: a line with too few, or with another number than the
file's first token line (a word with a space in a tab-separated file, a missing column, a
CoNLL-U comment), raises `DataError` naming file and line.

Sub-token alignment (Devlin et al. 2018, section 5.3): each word is WordPiece-tokenized on its
own; its tag goes on its FIRST sub-token and every other position ([CLS], [SEP], later
sub-tokens, padding) gets label -1, which the loss and the metrics ignore. A word that the
tokenizer turns into nothing (e.g. only control characters) is represented by one [UNK] so
that every word keeps a position (counted in the stats).

A sentence may come with its words' pieces already made (`TaggedSentence.pieces`):
character-tagged data (`data_prep.klue_ner`) tokenizes each sentence whole and gives each
piece as a word of its own; those are not tokenized again.

Long sentences (more than max_seq_length - 2 sub-tokens) are split into windows, as Google's
run_squad.py splits a long document (`squad.doc_spans`): windows of max_seq_length - 2
sub-tokens, "[CLS] window [SEP]", starting every `doc_stride` sub-tokens until one reaches
the sentence's end, so a sentence of T sub-tokens gives 1 + ceil((T - (max_seq_length - 2)) /
doc_stride) windows (one if it fits). Windows cut at sub-tokens, not at words; a word is
tagged from its first sub-token, in the one window where that sub-token has the most context
(Google's `_check_is_max_context`: the largest min(left context, right context) + 0.01 *
window length, the first such window on a tie; `max_context_windows`). Only there does the
word carry its tag: in every other window its position is -1, so training counts each word
once, and evaluation and prediction read each word's tag from that window
(`predictions_to_tags`). A sentence that fits is one window, as before windows existed.
`doc_stride` 0 truncates instead: one window per sentence, the words whose first sub-token
is cut off have no position ((-1, -1) in `word_positions`) and are counted as lost.

Features (numpy, Google's names; `schema.model_inputs` renames them for the model), one row
per window (the windows of a sentence in consecutive rows):
  input_ids, input_mask, segment_ids: int32 [N, S]
  label_ids: int32 [N, S], tag index on the first sub-token of each word in its max-context
    window, -1 elsewhere
plus `word_positions`: for each sentence, each word's (row, position): the window it is
tagged from and where its first sub-token is in it ((-1, -1) if truncated away).

Scoring lives with the task: `bert_keras.finetuning.tagging` (token accuracy, entity F1)
and `klue_ner` (KLUE's scores); both score their entities with `entity_scores`.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import re
from typing import Sequence

import numpy as np

from data_prep.classification import DataError
from data_prep import files
from data_prep.packing import pack, pad_features
from data_prep.schema import IGNORE_LABEL, UNK
from data_prep.squad import doc_spans


@dataclasses.dataclass(frozen=True)
class TaggedSentence:
    """Words and their tags (tags None for unlabelled input); `where` is "file:line" of its
    first word (word i is on the i-th line after it); `preceding`: the file's lines between
    the previous sentence and this one (blank and -DOCSTART- lines), as read; `following`,
    of the last sentence only: the lines after it. `pieces`: each word's WordPieces where
    the tokenizer has already run (character-tagged data, `data_prep.klue_ner`, whose units
    are pieces of the whole text); None: each word is tokenized on its own."""

    where: str
    words: tuple
    tags: tuple | None
    preceding: tuple = ()
    following: tuple = ()
    pieces: tuple | None = None
    one_line: bool = False  # all its words on the line `where` names (JSON lines)

    def word_line(self, index: int) -> str:
        """"file:line" of word `index`."""
        if self.one_line:
            return self.where
        path, _, line = self.where.rpartition(":")
        return f"{path}:{int(line) + index}"


# A column: a run of anything but ASCII whitespace. CoNLL-2003 separates its columns with a
# space and CoNLL-U with a tab; a word may hold a no-break or ideographic space ("10\u00a0000"),
# which str.split() would split it at.
_COLUMN = re.compile(r"[^ \t\n\r\f\v]+")


def read_conll(path: str, token_column: int = 0, tag_column: int = -1,
               has_tags: bool = True) -> list[TaggedSentence]:
    """Reads a CoNLL-style file: one "word ... tag" line per token, blank line between sentences.

    Args:
      path: the file (UTF-8).
      token_column, tag_column: column indices (negative counts from the end).
      has_tags: False for unlabelled files (only the word column is read).

    Returns:
      The sentences in file order.

    Raises:
      DataError: a line has too few columns, or another number than the first token line
        (file:line named).
    """
    # A pipe (<(zcat train.conll.gz)) is read once, into a temporary copy: the text check
    # and the line-end sniff below would otherwise drain it and leave the read nothing.
    with files.rereadable(path) as source:
        return _read_conll(source, path, token_column, tag_column, has_tags)


def _read_conll(source: str, path: str, token_column: int, tag_column: int,
                has_tags: bool) -> list[TaggedSentence]:
    """`read_conll` of the file `source`, named `path` in sentences and messages."""
    sentences: list[TaggedSentence] = []
    words, tags, start, between = [], [], None, []
    needed = max(token_column if token_column >= 0 else -token_column - 1,
                 (tag_column if tag_column >= 0 else -tag_column - 1) if has_tags else 0,
                 1 if has_tags else 0) + 1  # a word and, with tags, a separate tag column
    columns = first = None  # the first token line's column count, and its line number

    def flush():
        if words:
            sentences.append(TaggedSentence(f"{path}:{start}", tuple(words),
                                            tuple(tags) if has_tags else None,
                                            tuple(between)))
            between.clear()
        words.clear()
        tags.clear()

    files.check_text_file(source, name=path)
    # Lines end at "\n" ("\r\n" included: the split below drops the "\r"), or at a lone
    # "\r" in a file whose lines all end so; a stray "\r" elsewhere is whitespace between
    # columns, where universal newlines would make it a line end, or a blank line that
    # splits the sentence.
    with files.open_input(source, newline=files.newline_for(source)) as f:
        for number, line in enumerate(f, 1):
            fields = _COLUMN.findall(line)
            if not fields or fields[0] == "-DOCSTART-":
                flush()
                between.append(line.strip())
                continue
            if len(fields) < needed:
                raise DataError(f"{path}:{number}: expected at least {needed} "
                                f"whitespace-separated columns (word ... tag), got "
                                f"{len(fields)}: {line.rstrip()!r}")
            if columns is None:
                columns, first = len(fields), number
                if has_tags and token_column % columns == tag_column % columns:
                    raise DataError(
                        f"{path}:{number}: --token_column={token_column} and --tag_column="
                        f"{tag_column} are the same column of its {columns}: the word would "
                        "be its own tag; name the word's and the tag's columns")
            elif len(fields) != columns:
                raise DataError(
                    f"{path}:{number}: {len(fields)} whitespace-separated columns, but line "
                    f"{first} has {columns}: every token line needs the same columns (a word "
                    f"with a space in it, a missing column, or a CoNLL-U comment or "
                    f"multiword line?): {line.rstrip()!r}")
            if not words:
                start = number
            words.append(fields[token_column])
            if has_tags:
                tags.append(fields[tag_column])
    flush()
    if sentences and between:
        sentences[-1] = dataclasses.replace(sentences[-1], following=tuple(between))
    return sentences


JSON_EXTENSIONS = (".json", ".jsonl")  # run_ner.py's --train_file / --validation_file


def is_json_lines(path: str) -> bool:
    """Whether `path` is read as run_ner.py's JSON lines (its extension), not as CoNLL."""
    return os.path.splitext(path)[1].lower() in JSON_EXTENSIONS


def read_json_lines(path: str, words_key: str = "tokens", tags_key: str = "ner_tags",
                    has_tags: bool = True, tag_names: Sequence[str] | None = None
                    ) -> list[TaggedSentence]:
    """Reads transformers' run_ner.py data: one JSON object per line, holding the words
    (`words_key`, a list of strings) and their tags (`tags_key`, a list as long: tag names,
    or tag ids, as a `datasets` ClassLabel stores them, named by `tag_names` in id order).

    Args:
      path: the file (UTF-8).
      words_key, tags_key: the keys (run_ner's --text_column_name / --label_column_name).
      has_tags: False for unlabelled files (the tags are not read).
      tag_names: the names of tag ids 0, 1, ...; needed where the tags are ids.

    Returns:
      The sentences in file order (`where` "file:line"; `preceding` a blank line but
      before the first, so predictions.conll separates them as CoNLL does).

    Raises:
      DataError: a line without the keys, or holding something else than expected there
        (file:line named); tag ids without `tag_names`, or outside them.
    """
    sentences = []
    with files.rereadable(path) as source:
        files.check_text_file(source, name=path)
        try:
            for where, record in files.json_object_lines(source, path):
                words = _json_list(record, words_key, where, "words")
                if not words:
                    raise DataError(f"{where}: {words_key!r} is an empty list; expected a "
                                    "sentence's words")
                tags = None
                if has_tags:
                    tags = _json_list(record, tags_key, where, "tags", allow_ids=True)
                    if len(tags) != len(words):
                        raise DataError(f"{where}: {len(words)} {words_key!r} but {len(tags)} "
                                        f"{tags_key!r}; expected one tag per word")
                    tags = tuple(_tag_name(t, tag_names, tags_key, where) for t in tags)
                # predictions.conll: a blank line between sentences, as CoNLL has them.
                sentences.append(TaggedSentence(where, tuple(words), tags,
                                                preceding=("",) if sentences else (),
                                                one_line=True))
        except files.JsonFileError as e:
            raise DataError(str(e)) from None
    return sentences


def _json_list(record: dict, key: str, where: str, what: str, allow_ids: bool = False) -> list:
    """`record[key]`, a list of strings (or, `allow_ids`, of ints: tag ids)."""
    if key not in record:
        raise DataError(f"{where}: missing key {key!r} (keys present: {sorted(record)}); "
                        f"expected the {what} under it (--text_column_name / "
                        "--label_column_name name the keys)")
    value = record[key]
    kinds = (str, int) if allow_ids else (str,)
    if not isinstance(value, list) or not all(
            isinstance(v, kinds) and not isinstance(v, bool) for v in value):
        raise DataError(f"{where}: {key!r}: expected a list of {what} (strings"
                        f"{' or tag ids' if allow_ids else ''}), got {json.dumps(value)[:80]}")
    if allow_ids and len({type(v) for v in value}) > 1:
        raise DataError(f"{where}: {key!r} mixes tag names and ids: {json.dumps(value)[:80]}")
    return value


def _tag_name(tag, names: Sequence[str] | None, key: str, where: str) -> str:
    """A tag as a name: ids (a `datasets` ClassLabel's) are named by `names`."""
    if isinstance(tag, str):
        return tag
    if not names:
        raise DataError(f"{where}: {key!r} holds tag ids ({tag}, ...); name them with "
                        "--label_list_file (one tag a line, in id order: the dataset's "
                        "ClassLabel names)")
    if not 0 <= tag < len(names):
        raise DataError(f"{where}: {key!r}: tag id {tag} is not one of the {len(names)} tags "
                        "of --label_list_file (ids 0 to {})".format(len(names) - 1))
    return names[tag]


def label_list_from(sentences: Sequence[TaggedSentence]) -> list[str]:
    """The sorted set of tags in `sentences` (the default label list for training; of
    `klue_ner.CharSentence`s too: the characters' tags)."""
    labels = sorted({t for s in sentences if s.tags for t in s.tags})
    if not labels:
        raise DataError("no tagged sentences: cannot derive a label list")
    return labels


def entity_scores(gold: set, predicted: set) -> dict:
    """Micro-averaged precision, recall and F1 of predicted entities against gold ones, and
    the same per entity type.

    Args:
      gold, predicted: sets of (sentence index, type, first, last) tuples; a predicted
        entity is correct only where all four match a gold one.

    Returns:
      {"precision", "recall", "f1", "num_gold", "num_predicted", "num_correct",
       "per_type": {type: {"precision", "recall", "f1", "support"}}}, types sorted; a
      precision or recall without entities to count, and an F1 of two zeros, are 0.
    """

    def prf(g, p):
        correct = len(g & p)
        precision = correct / len(p) if p else 0.0
        recall = correct / len(g) if g else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return precision, recall, f1, correct

    precision, recall, f1, correct = prf(gold, predicted)
    per_type = {}
    for type_ in sorted({e[1] for e in gold | predicted}):
        g = {e for e in gold if e[1] == type_}
        p = {e for e in predicted if e[1] == type_}
        tp, tr, tf, _ = prf(g, p)
        per_type[type_] = {"precision": tp, "recall": tr, "f1": tf, "support": len(g)}
    return {"precision": precision, "recall": recall, "f1": f1, "num_gold": len(gold),
            "num_predicted": len(predicted), "num_correct": correct, "per_type": per_type}


@dataclasses.dataclass
class TaggingStats:
    """Counts reported by `convert_sentences`."""

    sentences: int = 0
    words: int = 0
    windows: int = 0  # feature rows: one per sentence, more for a sentence split into windows
    doc_stride: int = 0  # as converted; 0: long sentences truncated
    split_sentences: int = 0  # sentences longer than max_seq_length - 2 sub-tokens, windowed
    split_windows: int = 0  # the windows of those
    truncated_sentences: int = 0  # doc_stride 0 only
    truncated_words: int = 0  # doc_stride 0 only: words whose first sub-token was cut off
    empty_words: int = 0  # words the tokenizer mapped to no sub-token ([UNK] used)

    def summary(self) -> str:
        if self.doc_stride:
            long = (f"{self.split_sentences} sentences longer than max_seq_length split into "
                    f"{self.split_windows} windows (doc_stride {self.doc_stride}), no word lost")
        else:
            long = (f"{self.truncated_sentences} sentences truncated to max_seq_length "
                    f"({self.truncated_words} words lost; doc_stride 0)")
        return (f"{self.sentences} sentences, {self.words} words in {self.windows} windows; "
                f"{long}; {self.empty_words} words with no sub-token ([UNK] used)")


def default_doc_stride(max_seq_length: int) -> int:
    """The windows' stride when none is given: half a window, (max_seq_length - 2) // 2
    sub-tokens (at least 1), so every word but a long sentence's first and last quarter
    window is tagged with at least a quarter window of context on each side."""
    return max(1, (max_seq_length - 2) // 2)


def max_context_windows(spans: Sequence[tuple[int, int]], positions: Sequence[int]) -> list[int]:
    """For each sub-token position, the index of the window of `spans` ((start, length),
    starts and ends ascending, as `squad.doc_spans` makes them) that gives it the most
    context: Google's score, min(left, right) + 0.01 * window length, the first window on a
    tie (`squad.is_max_context`); -1 for a position in no window."""
    starts = [start for start, _ in spans]
    ends = [start + length for start, length in spans]
    out = []
    for position in positions:
        best, best_score = -1, None
        # The windows holding `position`: from the first ending after it to the last
        # starting at or before it.
        for index in range(bisect.bisect_right(ends, position),
                           bisect.bisect_right(starts, position)):
            start, length = spans[index]
            score = min(position - start, start + length - 1 - position) + 0.01 * length
            if best_score is None or score > best_score:
                best, best_score = index, score
        out.append(best)
    return out


def convert_sentences(sentences: Sequence[TaggedSentence], tokenizer,
                      label_list: Sequence[str] | None, max_seq_length: int,
                      doc_stride: int | None = None):
    """Tokenizes words, windows long sentences, puts each tag on the word's first sub-token
    in its max-context window, packs and pads.

    Args:
      sentences: from `read_conll` (or any source of TaggedSentence).
      tokenizer: see `data_prep.packing` (tokenize, convert_tokens_to_ids).
      label_list: tags in id order; None for unlabelled data (all label_ids are -1).
      max_seq_length: S (at least 3).
      doc_stride: sub-tokens from one window's start to the next (1 to S - 2) for sentences
        longer than S - 2 sub-tokens; None: `default_doc_stride(S)`; 0: truncate them.

    Returns:
      (features, word_positions, stats): features as in the module docstring, one row per
      window; word_positions a list (one per sentence) of (row, position) pairs, one per
      word ((-1, -1) for a word truncated away); stats a `TaggingStats`.

    Raises:
      DataError: a tag is not in `label_list` (file:line of the sentence named).
      ValueError: max_seq_length or doc_stride out of range.
    """
    room = max_seq_length - 2  # sub-tokens of a window, besides [CLS] and [SEP]
    if doc_stride is None:
        doc_stride = default_doc_stride(max_seq_length)
    if room < 1 or not 0 <= doc_stride <= room:
        raise ValueError(f"need max_seq_length >= 3 and 0 <= doc_stride <= max_seq_length - 2, "
                         f"got {max_seq_length}, {doc_stride}")
    label_map = {t: i for i, t in enumerate(label_list)} if label_list is not None else None
    stats = TaggingStats(doc_stride=doc_stride)
    all_ids, all_segments, all_labels, all_positions = [], [], [], []
    # One batch call for every word of every sentence whose pieces are not given: each word
    # is tokenized on its own.
    flat = tokenizer.tokenize([w for s in sentences if s.pieces is None for w in s.words])
    offset = 0
    for sentence in sentences:
        tokens, token_labels, first_index = [], [], []
        if sentence.pieces is not None:
            word_pieces = sentence.pieces
        else:
            word_pieces = flat[offset:offset + len(sentence.words)]
            offset += len(sentence.words)
        for w, word in enumerate(sentence.words):
            pieces = list(word_pieces[w])
            if not pieces:
                pieces = [UNK]
                stats.empty_words += 1
            first_index.append(len(tokens))
            tokens += pieces
            if sentence.tags is None or label_map is None:
                tag_id = IGNORE_LABEL
            else:
                tag = sentence.tags[w]
                if tag not in label_map:
                    raise DataError(f"{sentence.word_line(w)}: tag {tag!r} (word {w + 1}, "
                                    f"{word!r}) is not in the label list {list(label_list)}")
                tag_id = label_map[tag]
            token_labels += [tag_id] + [IGNORE_LABEL] * (len(pieces) - 1)
        if doc_stride:
            spans = doc_spans(len(tokens), room, doc_stride) or [(0, 0)]
        else:
            spans = [(0, min(len(tokens), room))]
        homes = max_context_windows(spans, first_index)
        home_of = dict(zip(first_index, homes))  # first sub-token -> the window it is read in
        row = len(all_ids)
        for index, (start, length) in enumerate(spans):
            packed = pack(tokens[start:start + length], None, max_seq_length)
            # Position 0 is [CLS]; sub-token start + k of the sentence sits at position k + 1.
            labels = [token_labels[i] if home_of.get(i) == index else IGNORE_LABEL
                      for i in range(start, start + length)]
            all_ids.append(tokenizer.convert_tokens_to_ids(packed.tokens))
            all_segments.append(packed.segment_ids)
            all_labels.append([IGNORE_LABEL] + labels + [IGNORE_LABEL])
        all_positions.append([(row + home, first - spans[home][0] + 1) if home >= 0
                              else (-1, -1) for first, home in zip(first_index, homes)])
        lost = sum(home < 0 for home in homes)
        stats.sentences += 1
        stats.words += len(sentence.words)
        stats.windows += len(spans)
        if len(spans) > 1:
            stats.split_sentences += 1
            stats.split_windows += len(spans)
        stats.truncated_sentences += len(tokens) > spans[-1][0] + spans[-1][1]
        stats.truncated_words += lost
    features = pad_features(all_ids, all_segments, max_seq_length)
    label_ids = np.full((len(all_ids), max_seq_length), IGNORE_LABEL, np.int32)
    for i, labels in enumerate(all_labels):
        label_ids[i, : len(labels)] = labels
    features["label_ids"] = label_ids
    return features, all_positions, stats


def predictions_text(sentences: Sequence[TaggedSentence], tags: Sequence[Sequence[str]]) -> str:
    """The predictions file: "word tag" lines with the input's blank and -DOCSTART- lines
    where they were, those after the last sentence included (at least a blank line, so
    that it lines up with an input file that ends in one: `paste input predictions`,
    conlleval)."""
    tail = (sentences[-1].following if sentences else ()) or ("",)
    return "".join("".join(f"{line}\n" for line in s.preceding) +
                   "".join(f"{w} {t}\n" for w, t in zip(s.words, sentence_tags, strict=True))
                   for s, sentence_tags in zip(sentences, tags, strict=True)) + \
        "".join(f"{line}\n" for line in tail)


def missing_tag(label_list: Sequence[str]) -> str:
    """The tag written for a word cut off by max_seq_length (doc_stride 0: it has no
    prediction): "O" where the tag set has it (outside any entity), else "_" (CoNLL-U's
    "no value")."""
    return "O" if "O" in label_list else "_"


def predictions_to_tags(predicted_ids: np.ndarray,
                        word_positions: Sequence[Sequence[tuple[int, int]]],
                        label_list: Sequence[str], missing: str | None = None) -> list[list[str]]:
    """Merges per-window predictions back into one tag per word: each word's tag is read in
    the window `convert_sentences` chose for it (its max-context window).

    Args:
      predicted_ids: int [N, S], argmax of the tagger's logits, one row per window.
      word_positions: from `convert_sentences`.
      label_list: tags in id order.
      missing: tag given to words truncated away (doc_stride 0: they have no prediction);
        None: `missing_tag(label_list)`.

    Returns:
      One list of tags per sentence, one tag per word.
    """
    if missing is None:
        missing = missing_tag(label_list)
    return [[label_list[int(predicted_ids[row, position])] if position >= 0 else missing
             for row, position in places] for places in word_positions]
