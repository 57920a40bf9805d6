"""Sentence (pair) classification data: TSV/CSV/JSONL files -> examples -> padded features.

File formats (the format follows the file extension, or is given explicitly):

  .tsv / .csv   a header row naming the columns, then one example per row (csv quoting rules,
                so a quoted field may span lines; a quote must end its field: csv's strict
                mode). Columns are picked by header name; a row or column of empty cells
                (Excel's) is blank.
  .jsonl        one JSON object per line; fields are picked by key. Blank lines are skipped.

Each example has a text (`text_a`), an optional second text (`text_b`, for pairs) and a
label (a string; missing for prediction files). Problems name the file and line:
a row with the wrong number of fields, a missing or empty field, a line that is not a JSON
object, or a label that is not in the label list all raise `DataError`.

Features (numpy, Google's names; `schema.model_inputs` renames them for the model):
  input_ids, input_mask, segment_ids: int32 [N, S]
  label_ids: int32 [N] (index into the label list; -1 when the example has no label)

Scoring lives with the task: `bert_keras.finetuning.classification.accuracy_and_f1`.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
from typing import Iterable, Sequence

import numpy as np

from data_prep import files
from data_prep.packing import pack, pad_features
from data_prep.schema import UNK


class DataError(ValueError):
    """An input file does not have the expected content; the message names file and line."""


def load_json(path: str):
    """A user's JSON file (SQuAD's, KLUE's), read whole.

    Raises:
      files.TextFileError: not UTF-8 text (file, line and byte named).
      DataError: not valid JSON (file:line and the parser's reason).
    """
    try:
        return files.read_json(path)
    except files.JsonFileError as e:
        raise DataError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class Example:
    """One classification example; `where` is "file:line" for messages, `id` the id column
    of a GLUE file (`data_prep.glue`), written beside its prediction."""

    where: str
    text_a: str
    text_b: str | None
    label: str | None
    id: str | None = None


_FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


def file_format(path: str, fmt: str | None = None) -> str:
    """Returns "tsv", "csv" or "jsonl" for `path` (from `fmt` if given, else the extension)."""
    if fmt:
        if fmt not in ("tsv", "csv", "jsonl"):
            raise ValueError(f"format must be tsv, csv or jsonl. Received: {fmt!r}")
        return fmt
    ext = os.path.splitext(path)[1].lower()
    if ext not in _FORMATS and files.is_pipe(path):  # <(...): /dev/fd/63
        raise DataError(f"{path} is a pipe, whose name has no extension to tell the format "
                        "by; pass the format explicitly (--input_format=tsv, csv or jsonl)")
    if ext not in _FORMATS:
        raise DataError(f"{path}: cannot tell the format from the extension {ext!r}; "
                        "expected .tsv, .csv or .jsonl (or pass the format explicitly)")
    return _FORMATS[ext]


def _field(record: dict, key: str | None, where: str, required: bool) -> str | None:
    if key is None:
        return None
    if key not in record or record[key] is None:
        if not required:
            return None
        if key in record:  # It is there: "missing ... (fields present: [key])" misled.
            raise DataError(f"{where}: field {key!r} is null")
        raise DataError(f"{where}: missing field {key!r} (fields present: {sorted(record)})")
    value = record[key]
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise DataError(f"{where}: field {key!r} must be a string or number, got {type(value).__name__}")
    value = str(value)
    if not value.strip():
        if not required:
            return None  # a blank optional field (a predict file's label) is absent
        raise DataError(f"{where}: field {key!r} is empty")
    return value


def _label(value: str | None, key: str, where: str) -> str | None:
    """A label as labels.txt keeps it (model_loading.read_labels): one line, without the
    spaces around it; a line break in it is refused."""
    if value is None:
        return None
    if "\n" in value or "\r" in value:
        raise DataError(f"{where}: field {key!r} holds a line break ({value!r}); a label is "
                        "one line of the model's labels.txt")
    return value.strip()


def read_examples(path: str, text_a: str = "text", text_b: str | None = None,
                  label: str | None = "label", fmt: str | None = None,
                  require_label: bool = True) -> list[Example]:
    """Reads classification examples from a TSV, CSV or JSONL file.

    Args:
      path: the file.
      text_a: column (header name) or JSON key of the first text.
      text_b: column/key of the second text for pair tasks, or None.
      label: column/key of the label, or None for unlabelled prediction files.
      fmt: "tsv", "csv" or "jsonl"; None = from the extension.
      require_label: a row without a label is an error (set False for prediction files).

    Returns:
      The examples in file order.

    Raises:
      DataError: malformed file content, naming file:line and what was expected.
    """
    fmt = file_format(path, fmt)
    # A pipe is read once, into a temporary copy (`files.rereadable`): the text check and
    # the line-end sniff would otherwise drain it and leave the read nothing.
    with files.rereadable(path) as source:
        files.check_text_file(source, name=path)
        records = (_read_jsonl(source, path) if fmt == "jsonl" else
                   _read_delimited(source, path, "\t" if fmt == "tsv" else ","))
        examples = []
        for where, record in records:
            a = _field(record, text_a, where, required=True)
            b = _field(record, text_b, where, required=True)
            y = _label(_field(record, label, where, required=require_label), label, where)
            examples.append(Example(where, a, b, y))
    return examples


def _read_jsonl(source: str, path: str) -> Iterable[tuple[str, dict]]:
    """(file:line, record) per JSON line of the file `source`, named `path`
    (`files.json_object_lines`; its errors as DataError)."""
    try:
        yield from files.json_object_lines(source, path)
    except files.JsonFileError as e:
        raise DataError(str(e)) from None


class _Lines:
    """A text file's lines as csv.reader takes them, noting whether the last one it took
    ended in a lone "\\r" (csv ends a row there, outside quotes, as at "\\n")."""

    def __init__(self, f):
        self._f = f
        self.lone_cr = False

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = next(self._f)
        self.lone_cr = line.endswith("\r")
        return line


# The longest field csv reads, over its default of 131,072 characters (a long document is
# a text like any other: it is truncated to max_seq_length when converted); 2**31 - 1 fits
# the C long csv keeps it in on every platform.
_FIELD_LIMIT = 2**31 - 1


def _next_row(reader, delimiter: str, path: str, start: int) -> list[str]:
    """The next row of `reader` (StopIteration at the end), with csv's field limit raised to
    `_FIELD_LIMIT` while it parses (csv's limit is process-wide: restored after each row);
    csv's errors as DataError naming `path`:`start`, the line the row starts on.

    A quote that does not end its field (csv's strict mode) is refused: Python's csv, as
    pandas', reads a field that begins with a quote up to the next quote, across delimiters
    and lines, and appends what follows that quote, so a text that begins with a quote in
    a file written without csv quoting ("\\t".join(...)) merged rows or lost its quotes
    without a word.
    """
    limit = csv.field_size_limit(_FIELD_LIMIT)
    try:
        return next(reader)
    except csv.Error as e:
        reason = str(e)
        if "expected after" in reason:
            end = reader.line_num
            at = f" (on line {end})" if end != start else ""
            what = f"its closing quote is followed by more text{at}"
        elif "unexpected end of data" in reason:
            what = "no quote closes it before the end of the file"
        else:
            raise DataError(f"{path}:{start}: {reason}") from None
        across = "tabs" if delimiter == "\t" else "commas"
        raise DataError(
            f"{path}:{start}: a field opens with a quote (\") and {what}; csv reads a quoted "
            f"field to its closing quote, across {across} and lines: quote a text that begins "
            "with \" and double the quotes in it, as csv writers do (or give the file as .jsonl)"
        ) from None
    finally:
        csv.field_size_limit(limit)


def _read_delimited(source: str, path: str, delimiter: str) -> Iterable[tuple[str, dict]]:
    """(file:line, record) per row of the TSV or CSV file `source`, named `path`."""
    # A row csv ended at a lone "\r" in a file whose lines end in "\n": a stray "\r" (a
    # cell edited on another system) split it, silently where the halves have the header's
    # field count. Refused unless nothing but blank lines follows (a last "\\r" ends no row).
    stray_cr = not files.ends_lines_in_lone_cr(source)
    split_at = None  # the line of a row that ended at a stray "\r"
    with files.open_input(source, newline="") as f:
        lines = _Lines(f)
        reader = csv.reader(lines, delimiter=delimiter, strict=True)
        try:
            header = _next_row(reader, delimiter, path, 1)
        except StopIteration:
            raise DataError(f"{path}: empty file; expected a header row") from None
        named = [name for name in header if name.strip()]
        if len(set(named)) != len(named):
            # Columns without a name (Excel's empty ones) can be picked by none: not refused.
            raise DataError(f"{path}:1: duplicate column names in header {header}")
        while True:
            start = reader.line_num + 1  # the line this record starts on
            try:
                row = _next_row(reader, delimiter, path, start)
            except StopIteration:
                return
            if all(not field.strip() for field in row):
                continue  # a blank line, or a row of empty cells (",," from Excel)
            if split_at is None and stray_cr and lines.lone_cr:
                split_at = start
            if split_at is not None and (split_at != start or len(row) != len(header)):
                raise DataError(f"{path}:{split_at}: a carriage return (\\r) inside the row, "
                                "which csv reads as its end; expected rows ending in \\n or "
                                "\\r\\n (quote the field that holds it, or remove it)")
            if len(row) != len(header):
                raise DataError(f"{path}:{start}: expected {len(header)} fields "
                                f"({delimiter!r}-separated, header {header}), got {len(row)}")
            yield f"{path}:{start}", dict(zip(header, row))


def label_list_from(examples: Sequence[Example]) -> list[str]:
    """The sorted set of labels seen in `examples` (the default label list for training):
    by value where every label is an integer ("2" before "10", as transformers' run_glue
    sorts an integer label column, so a head it trained on them keeps its ids here), else
    as strings."""
    labels = {e.label for e in examples if e.label is not None}
    integers = all(re.fullmatch(r"[+-]?[0-9]+", label) for label in labels)
    labels = sorted(labels, key=lambda label: (int(label), label) if integers else label)
    if not labels:
        raise DataError("no labelled examples: cannot derive a label list")
    return labels


@dataclasses.dataclass
class ConversionStats:
    """Counts a converter reports: examples, sentence pairs among them, truncated
    sequences, [UNK] tokens."""

    examples: int = 0
    pairs: int = 0
    truncated: int = 0
    unknown_tokens: int = 0

    def summary(self) -> str:
        return (f"{self.examples} examples, {self.truncated} truncated to max_seq_length, "
                f"{self.unknown_tokens} [UNK] tokens")


def convert_examples(examples: Sequence[Example], tokenizer, label_list: Sequence[str] | None,
                     max_seq_length: int) -> tuple[dict[str, np.ndarray], ConversionStats]:
    """Tokenizes, packs and pads examples.

    Args:
      examples: from `read_examples`.
      tokenizer: see `data_prep.packing` (tokenize, convert_tokens_to_ids).
      label_list: labels in id order; None for unlabelled data (label_ids are then -1).
      max_seq_length: S.

    Returns:
      (features, stats): features as in the module docstring; stats counts truncations.

    Raises:
      DataError: a label is not in `label_list` (file:line named).
    """
    label_map = {label: i for i, label in enumerate(label_list)} if label_list is not None else None
    stats = ConversionStats()
    ids, segments, label_ids = [], [], []
    all_a = tokenizer.tokenize([e.text_a for e in examples])
    pairs = [i for i, e in enumerate(examples) if e.text_b is not None]
    all_b = dict(zip(pairs, tokenizer.tokenize([examples[i].text_b for i in pairs])))
    for index, example in enumerate(examples):
        tokens_a, tokens_b = all_a[index], all_b.get(index)
        packed = pack(tokens_a, tokens_b, max_seq_length)
        stats.examples += 1
        stats.pairs += example.text_b is not None
        stats.truncated += packed.truncated
        stats.unknown_tokens += sum(t == UNK for t in packed.tokens)
        ids.append(tokenizer.convert_tokens_to_ids(packed.tokens))
        segments.append(packed.segment_ids)
        if example.label is None or label_map is None:
            label_ids.append(-1)
        elif example.label not in label_map:
            raise DataError(f"{example.where}: label {example.label!r} is not in the label list "
                            f"{list(label_list)}")
        else:
            label_ids.append(label_map[example.label])
    features = pad_features(ids, segments, max_seq_length)
    features["label_ids"] = np.asarray(label_ids, np.int32).reshape(len(examples))
    return features, stats
