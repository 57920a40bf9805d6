"""Character-tagged NER data (KLUE-NER's format) for run_tagger: sentences to WordPiece
units, predictions back to characters, and KLUE's two scores.

File format (KLUE benchmark v1.1, klue-ner-v1.1_{train,dev}.tsv; also korean-named-entity's
konec, which keeps it with other tags):

    ## klue-ner-v1_train_00025_nsmc<TAB><이동욱:PS>님 재치도 넘치시고 너무좋았어요
    이<TAB>B-PS
    동<TAB>I-PS
    욱<TAB>I-PS
    님<TAB>O
     <TAB>O
    ...
    (a blank line)

A sentence is a "## <guid>" line, then one line per character of its text (the character, a
tab, its tag; a space is " \\tO"), then a blank line. The character lines are the annotation:
the header's inline tags are for display (they disagree with the characters where the text
itself holds angle brackets, as NSMC reviews do), so only its guid is read. "##" marks a
comment ("## 주석 : ##", the official files' own first lines say): KLUE's files begin with
five such lines describing the format, right before the first sentence's, so of the "##"
lines before a sentence's characters the last is its header and the others are comments,
as KLUE's baseline reads them (kept in `comments`, written back into the predictions). A
line of another shape is refused naming file:line (`DataError`).

Alignment (as KLUE's baseline aligns it): the sentence's text is WordPiece-tokenized whole by
the model's tokenizer (`BertTokenizer.tokenize_with_char_offsets`), so a particle after a
name stays the "##" piece it is in pretraining ("문막휴게소에서" -> ... "##에서"). Each
piece is a unit tagged with the tag of its first character; pieces that share a first
character (rare: "İ" lowercases to two pieces) are one unit, tagged on its first piece, as a
word's later pieces are in CoNLL data. The units are `tagging.TaggedSentence`s with their
pieces given, so windows, packing and the label ids are `tagging.convert_sentences`'.
An entity that begins or ends inside a piece ("서울시는" as "서", "##울시는" for the
entity "서울시") cannot be tagged at its boundary: the piece carries its first character's
tag, so the predicted entity begins or ends with the piece. Such entities are counted
(`AlignmentStats.cut_entities`, in the logs and results); a vocabulary whose pieces end at
particles (KLUE's own tokenizer segments morphemes first) has few of them.

Back to characters (`char_tags`): a unit's first character takes its predicted tag, its
other characters the inside tag ("B-PS" or "I-PS" -> "I-PS"; "O" stays "O"); a character in
no piece (a space; a control character the tokenizer drops) continues the entity around it
when the character before is in an entity of type X and the next unit's tag is "I-X" (a
space inside "<2018년 3월:DT>"), else is "O".

Scores (`scores`), over each sentence's characters other than " " (KLUE's baseline skips
exactly those lines; a no-break or ideographic space is a character it scores), as KLUE's
baseline scores them (its klue_ner_entity_macro_f1 and klue_ner_char_macro_f1): entity-level F1 by seqeval's
strict IOB2 rule (an entity is a B-X and the I-X after it; an I-X without its B-X is no
entity), macro-averaged over the entity types found in the gold or predicted tags, and
micro-averaged beside it; character-level macro F1 over every tag of the label list, "O"
included, a tag absent from both gold and predictions counting 1 (scikit-learn's
zero_division=True).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from data_prep import files
from data_prep.classification import DataError
from data_prep.tagging import TaggedSentence, entity_scores

# KLUE-NER's tags in the order of KLUE's release on the Hugging Face hub (klue/ner): types
# in alphabetical order, B before I, "O" last. DT date, LC location, OG organization,
# PS person, QT quantity, TI time.
KLUE_NER_LABELS = ("B-DT", "I-DT", "B-LC", "I-LC", "B-OG", "I-OG", "B-PS", "I-PS",
                   "B-QT", "I-QT", "B-TI", "I-TI", "O")
DIRECTORY = "klue-ner-v1.1"  # under KLUE's klue_benchmark/
FILES = {"train": "klue-ner-v1.1_train.tsv", "dev": "klue-ner-v1.1_dev.tsv"}
HEADER = "## "  # a sentence's "## <guid><TAB><sentence>" line, as written
COMMENT = "##"  # any line starting so: the last before a sentence's characters is its header
OUTSIDE = "O"


@dataclasses.dataclass(frozen=True)
class CharSentence:
    """A sentence's text and one tag per character (tags None for unlabelled input); `where`
    is "file:line" of its "## <guid>" line (character i is on the (i+1)-th line after it)."""

    where: str
    guid: str
    text: str
    tags: tuple | None
    comments: tuple = ()  # the "##" comment lines right before its header, as read

    def char_line(self, index: int) -> str:
        """"file:line" of character `index`."""
        path, _, line = self.where.rpartition(":")
        return f"{path}:{int(line) + 1 + index}"


def read_klue_ner(path: str, has_tags: bool = True) -> list[CharSentence]:
    """Reads a file in KLUE-NER's format (module docstring).

    Args:
      path: the file (UTF-8).
      has_tags: False to read the characters only (the tags are still required by the
        format, and ignored).

    Raises:
      DataError: a line that is neither a "## <guid>" header, a "character<TAB>tag" line nor
        blank; a character line outside a sentence; a sentence without characters
        (file:line named).
    """
    # A pipe is read once, into a temporary copy (`files.rereadable`): the text check and
    # the line-end sniff below would otherwise drain it and leave the read nothing.
    with files.rereadable(path) as source:
        return _read_klue_ner(source, path, has_tags)


def _read_klue_ner(source: str, path: str, has_tags: bool) -> list[CharSentence]:
    """`read_klue_ner` of the file `source`, named `path` in sentences and messages."""
    sentences: list[CharSentence] = []
    header = None  # (line number, line) of the open sentence's "##" line
    comments: list[str] = []  # "##" lines before the open sentence's header
    chars: list[str] = []
    tags: list[str] = []

    def guid_of(header) -> str:
        number, line = header
        guid = line[len(COMMENT):].split("\t", 1)[0].strip()
        if not guid:
            raise DataError(f"{path}:{number}: expected \"## <guid><TAB><sentence>\", "
                            f"got no guid: {line!r}")
        return guid

    def flush(number):
        nonlocal header
        if header is None:
            return
        start, guid = header[0], guid_of(header)
        if not chars:
            raise DataError(f"{path}:{start}: sentence {guid!r} has no character lines "
                            "(expected one \"character<TAB>tag\" line per character after "
                            "its \"## <guid>\" line)")
        sentences.append(CharSentence(f"{path}:{start}", guid, "".join(chars),
                                      tuple(tags) if has_tags else None, tuple(comments)))
        header = None
        comments.clear()
        chars.clear()
        tags.clear()

    files.check_text_file(source, name=path)
    # Lines end at "\n" (or at a lone "\r" in a file whose lines all end so): a stray "\r"
    # before a line's end ("가\tB-PS\r\r\n", a line edited on another system) goes with
    # the "\r\n", as tagging.read_conll reads it, where universal newlines made it a blank
    # line that ended the sentence and put every later line number one too high.
    with files.open_input(source, newline=files.newline_for(source)) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            # A blank line ends a sentence (also "\t" alone, as some copies have it); a
            # line starting " \t" is a space's and needs its tag.
            if not line.strip(" \t") and not line.startswith(" \t"):
                flush(number)
                continue
            if line.startswith(COMMENT):
                if header is not None and not chars:
                    # A "##" line right before another, with no characters between: a
                    # comment (the five that begin KLUE's files), not an empty sentence.
                    comments.append(header[1])
                    header = None
                flush(number)
                header = (number, line)
                continue
            char, tab, tag = line.rpartition("\t")
            if not tab or len(char) != 1 or not tag or tag != tag.strip():
                raise DataError(f"{path}:{number}: expected one character, a tab and its tag "
                                f"(KLUE-NER's format: \"## <guid>\" lines, then "
                                f"\"character<TAB>tag\" lines, a blank line after each "
                                f"sentence), got {line!r}")
            if header is None:
                raise DataError(f"{path}:{number}: a character line outside a sentence (no "
                                f"\"## <guid>\" line since the last blank line): {line!r}")
            if not chars:
                guid_of(header)  # named at its own line, before its characters are read
            chars.append(char)
            tags.append(tag)
    flush(None)
    return sentences


@dataclasses.dataclass
class AlignmentStats:
    """Counts reported by `to_units`."""

    characters: int = 0
    units: int = 0  # pieces, those sharing a first character counted once
    cut_entities: int = 0  # gold entities beginning or ending inside a piece
    # Scored characters (all but " ") in no piece: dropped by the tokenizer (a no-break
    # space, a control character), their tags inferred (`char_tags`).
    unpieced: int = 0

    def summary(self) -> str:
        return (f"{self.characters} characters in {self.units} WordPiece units; "
                f"{self.cut_entities} entities begin or end inside a WordPiece (tagged by "
                f"the piece's first character, their predicted boundary is the piece's); "
                f"{self.unpieced} scored characters (not \" \") in no WordPiece, their "
                "tags inferred from the pieces around them")


def _type(tag: str) -> str | None:
    """"PS" for "B-PS" or "I-PS"; None for "O" or a tag without a B-/I- prefix."""
    return tag[2:] if tag.startswith(("B-", "I-")) else None


def _inside(tag: str) -> str:
    """The tag of a unit's later characters: "I-X" for "B-X" or "I-X", else the tag."""
    kind = _type(tag)
    return f"I-{kind}" if kind is not None else tag


def missing_inside_tags(label_list: Sequence[str]) -> list[str]:
    """The "I-X" tags a label list lacks for its "B-X" ones: `char_tags` gives them to a
    unit's later characters and to the spaces inside an entity, so a list without them
    would write tags the model cannot have (a training file whose type X only ever spans
    one character derives such a list)."""
    known = set(label_list)
    return sorted({f"I-{_type(t)}" for t in label_list if t.startswith("B-")} - known)


def to_units(sentences: Sequence[CharSentence], tokenizer,
             label_list: Sequence[str] | None):
    """Tokenizes each sentence's text and makes its WordPiece units (module docstring).

    Args:
      sentences: from `read_klue_ner`.
      tokenizer: a `data_prep.tokenization.BertTokenizer`.
      label_list: the tags in id order (every character's tag is checked against it); None
        for unlabelled data.

    Returns:
      (units, spans, stats): a `tagging.TaggedSentence` per sentence, its words the units'
      text and its pieces given; per sentence the (start, end) characters of each unit;
      an `AlignmentStats`.

    Raises:
      DataError: a tag not in `label_list` (file:line of the character named).
    """
    known = set(label_list) if label_list is not None else None
    stats = AlignmentStats()
    units, all_spans = [], []
    pieces_of = tokenizer.tokenize_with_char_offsets([s.text for s in sentences])
    for sentence, pieces in zip(sentences, pieces_of, strict=True):
        tags = sentence.tags if label_list is not None else None
        if tags is not None:
            for i, tag in enumerate(tags):
                if tag not in known:
                    raise DataError(f"{sentence.char_line(i)}: tag {tag!r} (character "
                                    f"{i + 1} of sentence {sentence.guid}) is not in the label "
                                    f"list {list(label_list)}")
        groups: list[list[str]] = []
        spans: list[list[int]] = []
        for piece, start, end in pieces:
            if spans and start == spans[-1][0]:
                groups[-1].append(piece)
                spans[-1][1] = max(spans[-1][1], end)
            else:
                groups.append([piece])
                spans.append([start, end])
        spans = [tuple(span) for span in spans]
        starts = {start for start, _ in spans}
        ends = {end for _, end in spans}
        covered = [False] * len(sentence.text)
        for start, end in spans:
            covered[start:end] = [True] * (end - start)
        stats.unpieced += sum(not c and ch != " "
                              for c, ch in zip(covered, sentence.text))
        if tags is not None:
            stats.cut_entities += sum(first not in starts or last + 1 not in ends
                                      for _, first, last in strict_entities(tags))
        units.append(TaggedSentence(
            sentence.where, tuple(sentence.text[a:b] for a, b in spans),
            tuple(tags[a] for a, _ in spans) if tags is not None else None,
            pieces=tuple(tuple(g) for g in groups)))
        all_spans.append(spans)
        stats.characters += len(sentence.text)
        stats.units += len(spans)
    return units, all_spans, stats


def char_tags(text: str, spans: Sequence[tuple[int, int]], unit_tags: Sequence[str]) -> list[str]:
    """One tag per character of `text` from its units' tags (module docstring)."""
    tags: list[str | None] = [None] * len(text)
    for (start, end), tag in zip(spans, unit_tags, strict=True):
        tags[start] = tag
        for k in range(start + 1, end):
            tags[k] = _inside(tag)
    # The first unit starting at or after each character, for the uncovered ones.
    next_unit = [None] * (len(text) + 1)
    following = None
    unit_at = {start: tag for (start, _), tag in zip(spans, unit_tags)}
    for k in range(len(text), -1, -1):
        if k in unit_at:
            following = unit_at[k]
        next_unit[k] = following
    for k, tag in enumerate(tags):
        if tag is None:
            before = tags[k - 1] if k else None
            kind = _type(before) if before is not None else None
            tags[k] = (f"I-{kind}" if kind is not None and next_unit[k] == f"I-{kind}"
                       else OUTSIDE)
    return tags


def strict_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, first, last) of each entity by seqeval's strict IOB2 rule: a "B-X" and the
    "I-X" right after it; an "I-X" that does not continue a B-X or I-X of its type starts
    none."""
    entities = []
    current = None  # [type, first, last]
    for i, tag in enumerate(tags):
        kind = _type(tag)
        if current is not None and tag != f"I-{current[0]}":
            entities.append(tuple(current))
            current = None
        if kind is not None and tag.startswith("B-"):
            current = [kind, i, i]
        elif current is not None:
            current[2] = i
    if current is not None:
        entities.append(tuple(current))
    return entities


def scores(texts: Sequence[str], gold: Sequence[Sequence[str]],
           predicted: Sequence[Sequence[str]], label_list: Sequence[str]) -> dict:
    """KLUE-NER's scores over the characters other than " " of each sentence (module
    docstring).

    Returns:
      {"entity_macro_f1", "char_macro_f1", "char_accuracy", "num_scored_characters",
       "entity": {"precision", "recall", "f1", "num_gold", "num_predicted", "num_correct",
                  "per_type": {type: {"precision", "recall", "f1", "support"}}},
       "per_tag_char_f1": {tag: f1}}, the F1s as fractions (KLUE reports them x100).
    """
    gold_set, pred_set = set(), set()
    counts = {tag: [0, 0, 0] for tag in label_list}  # tag: [true positive, gold, predicted]
    total = right = 0
    for i, (text, g, p) in enumerate(zip(texts, gold, predicted, strict=True)):
        if not len(text) == len(g) == len(p):
            raise ValueError(f"sentence {i}: {len(text)} characters, {len(g)} gold tags and "
                             f"{len(p)} predicted")
        keep = [k for k, ch in enumerate(text) if ch != " "]  # KLUE's `if token == " "`
        g = [g[k] for k in keep]
        p = [p[k] for k in keep]
        gold_set |= {(i, *e) for e in strict_entities(g)}
        pred_set |= {(i, *e) for e in strict_entities(p)}
        for a, b in zip(g, p):
            total += 1
            right += a == b
            counts.setdefault(a, [0, 0, 0])[1] += 1
            counts.setdefault(b, [0, 0, 0])[2] += 1
            if a == b:
                counts[a][0] += 1
    entity = entity_scores(gold_set, pred_set)
    per_type = entity["per_type"]
    per_tag = {}
    for tag in label_list:
        tp, n_gold, n_pred = counts[tag]
        per_tag[tag] = 2 * tp / (n_gold + n_pred) if n_gold + n_pred else 1.0
    return {
        "entity_macro_f1": (sum(t["f1"] for t in per_type.values()) / len(per_type)
                            if per_type else 0.0),
        "char_macro_f1": sum(per_tag.values()) / len(per_tag),
        "char_accuracy": right / total if total else 0.0,
        "num_scored_characters": total,
        "entity": entity,
        "per_tag_char_f1": per_tag,
    }


def _inline(text: str, tags: Sequence[str]) -> str:
    """The sentence with its entities marked as KLUE's headers mark them: "<이동욱:PS>님"."""
    out, last = [], 0
    for kind, first, end in strict_entities(tags):
        out += [text[last:first], f"<{text[first:end + 1]}:{kind}>"]
        last = end + 1
    return "".join(out) + text[last:]


def predictions_text(sentences: Sequence[CharSentence], tags: Sequence[Sequence[str]]) -> str:
    """The predictions in KLUE-NER's format: per sentence its comment lines as read (the
    five that begin KLUE's files), its "## <guid><TAB><sentence with the predicted entities
    inline>" line, a "character<TAB>predicted tag" line per character and a blank line (so
    `read_klue_ner` reads it back)."""
    return "".join(
        "".join(f"{c}\n" for c in s.comments) + f"{HEADER}{s.guid}\t{_inline(s.text, t)}\n" +
        "".join(f"{ch}\t{tag}\n" for ch, tag in zip(s.text, t, strict=True)) + "\n"
        for s, t in zip(sentences, tags, strict=True))
