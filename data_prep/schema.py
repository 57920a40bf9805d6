"""The one schema every stage shares: feature names, model input names, special tokens and
the vocabulary file (docs/DESIGN.md section 2).

Files keep Google's names (`create_pretraining_data.py`, `run_classifier.py`), so that data
written by Google's tools, by TF Model Garden's and by ours is interchangeable; models and
serving signatures use TF Hub's names. `FILE_TO_MODEL_NAMES` is the one bridge between the
two: `data_prep.features.parse_pretraining_example` applies it to TFRecords and
`model_inputs` below to in-memory arrays. Nothing else spells the rename.

Special tokens are looked up in the vocabulary, never assumed at fixed ids (Google's English
vocabularies put [PAD] [UNK] [CLS] [SEP] [MASK] at 0, 100, 101, 102, 103; build_vocab's
compact layout at 0..4). `load_vocab` is the one reader of a vocab.txt and checks it.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

from data_prep import files
from data_prep.cli import ToolError

# --- TFRecord feature names (Google's). ---

INPUT_IDS = "input_ids"
INPUT_MASK = "input_mask"
SEGMENT_IDS = "segment_ids"
MASKED_LM_POSITIONS = "masked_lm_positions"
MASKED_LM_IDS = "masked_lm_ids"
MASKED_LM_WEIGHTS = "masked_lm_weights"
NEXT_SENTENCE_LABELS = "next_sentence_labels"

# Values of next_sentence_labels: 0 = IsNext (B follows A), 1 = NotNext (B from another doc).
IS_NEXT = 0
NOT_NEXT = 1

# --- Model input names (TF Hub's BERT signature). ---

INPUT_WORD_IDS = "input_word_ids"
MODEL_INPUT_MASK = "input_mask"
INPUT_TYPE_IDS = "input_type_ids"
MODEL_INPUT_NAMES = (INPUT_WORD_IDS, MODEL_INPUT_MASK, INPUT_TYPE_IDS)

# File name -> model name. Only three names differ; the others pass through unchanged.
FILE_TO_MODEL_NAMES = {
    INPUT_IDS: INPUT_WORD_IDS,
    INPUT_MASK: MODEL_INPUT_MASK,
    SEGMENT_IDS: INPUT_TYPE_IDS,
    MASKED_LM_POSITIONS: MASKED_LM_POSITIONS,
    MASKED_LM_IDS: MASKED_LM_IDS,
    MASKED_LM_WEIGHTS: MASKED_LM_WEIGHTS,
    NEXT_SENTENCE_LABELS: NEXT_SENTENCE_LABELS,
}

# Label id that fine-tuning losses and metrics ignore: in tagging, [CLS], [SEP], padding and
# every sub-token but a word's first.
IGNORE_LABEL = -1

# --- Special tokens and WordPiece conventions. ---

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
SUFFIX_INDICATOR = "##"  # marks a WordPiece that continues the previous one
MAX_CHARS_PER_WORD = 100  # reference tokenizers turn longer words into one [UNK]


def model_inputs(features: Mapping) -> dict:
    """Renames the three input features of fine-tuning arrays to the model's input names.

    Args:
      features: mapping with int32 arrays `input_ids`, `input_mask`, `segment_ids` [N, S]
        (other keys, e.g. labels, are left out).

    Returns:
      {"input_word_ids", "input_mask", "input_type_ids"}: the same arrays.
    """
    return {FILE_TO_MODEL_NAMES[k]: features[k] for k in (INPUT_IDS, INPUT_MASK, SEGMENT_IDS)}


class VocabError(ToolError):
    """The vocabulary file is missing or malformed; the message names the file."""


def _is_tokenizer_json(text: str) -> bool:
    if not text.lstrip().startswith("{"):
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and "model" in value


def load_vocab(path: str | os.PathLike) -> list[str]:
    """Reads a WordPiece vocabulary: one token per line, the line number is the id.

    Args:
      path: a UTF-8 text file.

    Returns:
      The tokens in id order (list[str]).

    Raises:
      VocabError: the file is missing, unreadable, not UTF-8 text (NUL bytes, UTF-16), begins
        with a byte-order mark, is empty, has an empty line, a "\\r" that does not end a line
        ("\\r\\n" line ends are read as "\\n"), lines ending in a lone "\\r", a token with
        spaces around it, duplicate tokens, or lacks one of [PAD] [UNK] [CLS] [SEP] [MASK].
        The message names the file and the offending lines.
    """
    path = os.fspath(path)
    try:
        # Local or remote (gs://); never decompressed: a vocabulary's name ending in .gz is
        # read as it is.
        data = files.read_bytes(path)
    except FileNotFoundError:
        raise VocabError(f"vocabulary file {path!r} does not exist") from None
    except IsADirectoryError:
        inside = os.path.join(path, "vocab.txt")
        hint = (f"pass {inside}" if files.isfile(inside) else "expected a vocab.txt file")
        raise VocabError(f"vocabulary file {path!r} is a directory; {hint}") from None
    except OSError as e:
        raise VocabError(f"vocabulary file {path!r} cannot be read: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
        if "\x00" in text or data.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise UnicodeError
    except UnicodeError:  # the line, the byte and how to convert it, as every reader says
        raise VocabError(f"vocabulary file {files.not_text_message(data, repr(path))}") from None
    if text.startswith("\ufeff"):
        first = text[1:].split("\n", 1)[0]
        raise VocabError(
            f"vocabulary file {path!r} starts with a byte-order mark (U+FEFF), which tokenizers "
            f"read as part of its first token ({first!r}); save it as UTF-8 without one")
    if _is_tokenizer_json(text):  # transformers 5 may save it alone: the WordPieces in JSON
        raise VocabError(
            f"vocabulary file {path!r} is transformers' tokenizer.json, not a vocab.txt (one "
            "token a line); write the vocab.txt beside it with tokenizers.Tokenizer.from_file("
            f"{path!r}).model.save({os.path.dirname(path) or '.'!r}) and pass that")
    lone_cr = files.lone_cr_message(data, repr(path))
    if lone_cr:
        raise VocabError(f"vocabulary file {lone_cr}")
    if text.endswith("\n"):
        text = text[:-1]
    tokens = text.split("\n") if text else []
    if not tokens:
        raise VocabError(f"vocabulary file {path!r} is empty; expected one token per line")
    # A vocabulary saved on Windows ends its lines in "\r\n": Google's load_vocab (whose
    # reader drops every "\r" and strips the line), transformers' (universal newlines) and
    # TensorFlow's text-file lookup tables (TF Hub's tokenizers, 2.12 and 2.21 alike) all read
    # it as the same file with "\n", so it is.
    tokens = [tok[:-1] if tok.endswith("\r") else tok for tok in tokens]
    bad: dict[str, list[int]] = {"empty": [], "cr": [], "spaces": []}
    for i, tok in enumerate(tokens):
        if tok == "":
            bad["empty"].append(i)
        elif "\r" in tok:
            bad["cr"].append(i)
        elif tok.strip(" \t") != tok:
            bad["spaces"].append(i)
    if any(bad.values()):
        # A "\r" inside a line: Google's reader drops it (joining the token), transformers'
        # ends a line there (a token more): refused, as the two would give other ids.
        what = {"empty": "empty",
                "cr": "a '\\r' inside the token (first {!r}), which readers split or drop",
                "spaces": "spaces around the token (first {!r}), which no word can match"}
        problems = [f"{_lines(found)}: {what[kind].format(tokens[found[0]])}"
                    for kind, found in bad.items() if found]
        raise VocabError(f"vocabulary file {path!r}: " + "; ".join(problems))
    first_line: dict[str, int] = {}
    dupes = []
    for i, tok in enumerate(tokens):
        if tok in first_line:
            dupes.append(f"{tok!r} on lines {first_line[tok] + 1} and {i + 1}")
        else:
            first_line[tok] = i
    if dupes:
        more = f" (and {len(dupes) - 5} more)" if len(dupes) > 5 else ""
        raise VocabError(f"vocabulary file {path!r} has duplicate tokens: {'; '.join(dupes[:5])}{more}")
    missing = [t for t in SPECIAL_TOKENS if t not in first_line]
    if missing:
        raise VocabError(f"vocabulary file {path!r} lacks the special tokens {missing}; "
                         f"a BERT vocabulary needs all of {list(SPECIAL_TOKENS)}")
    return tokens


def _lines(indices: list[int]) -> str:
    """'line 3' or 'lines 3, 8, 9, 12, 20 and 7 more' (1-based) for 0-based line indices."""
    shown = ", ".join(str(i + 1) for i in indices[:5])
    more = f" and {len(indices) - 5} more" if len(indices) > 5 else ""
    return f"line {shown}" if len(indices) == 1 else f"lines {shown}{more}"


def special_token_ids(vocab: list[str]) -> dict[str, int]:
    """{"[PAD]": id, "[UNK]": id, ...} for a vocabulary from `load_vocab`."""
    index = {t: i for i, t in enumerate(vocab)}
    return {t: index[t] for t in SPECIAL_TOKENS}
