"""Packing one or two token sequences into BERT's "[CLS] A [SEP] B [SEP]" input, for fine-tuning.

This is the one packer the fine-tuning converters share (classification, tagging and
extract_features; SQuAD builds its windows the same way with a fixed question length).
Truncation follows Google's run_classifier.py `_truncate_seq_pair`: while the pair is too
long, drop one token from the END of the currently longer sequence (B on ties), which keeps
both segments as fair as possible. (Pretraining data trims a random end instead; that rule
lives in `pretraining_instances.py` and is not this one.)

Features use the TFRecord names of docs/DESIGN.md section 2 (`input_ids`, `input_mask`,
`segment_ids`); `data_prep.schema.model_inputs` applies the project's one rename table to
get the model's input names.

The converters (classification, tagging, squad) take a `tokenizer` with the batch interface
of `data_prep.tokenization.BertTokenizer`:
  tokenize(texts: Sequence[str]) -> list[list[str]]   WordPieces of each text
  convert_tokens_to_ids(tokens: Sequence[str]) -> list[int]
and tokenize a whole file in a few large calls (the in-graph tokenizer is fast per batch,
slow per call). Words are tokenized as texts of their own where alignment matters.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence, TypeVar

import numpy as np

from data_prep.schema import CLS, INPUT_IDS, INPUT_MASK, SEGMENT_IDS, SEP

T = TypeVar("T")


class Packed(NamedTuple):
    """One packed, unpadded sequence.

    tokens: "[CLS]", A..., "[SEP]" (, B..., "[SEP]").
    segment_ids: 0 for "[CLS] A [SEP]", 1 for "B [SEP]"; same length as tokens.
    num_a, num_b: how many tokens of A and B were kept.
    truncated: True if any token of A or B was dropped.
    """

    tokens: list
    segment_ids: list
    num_a: int
    num_b: int
    truncated: bool


def truncate_pair(a: Sequence[T], b: Sequence[T], max_length: int) -> tuple[list[T], list[T]]:
    """Trims the longer of `a`, `b` one token at a time from its end until len(a)+len(b) <= max_length.

    On a tie `b` is trimmed (Google's `_truncate_seq_pair` pops from b when len(a) > len(b)
    is false). Returns new lists; the inputs are not modified.
    """
    if max_length < 0:
        raise ValueError(f"max_length must be >= 0. Received: max_length={max_length}")
    len_a, len_b = len(a), len(b)
    while len_a + len_b > max_length:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return list(a[:len_a]), list(b[:len_b])


def least_length(pair: bool) -> int:
    """The shortest max_seq_length `pack` takes: the special tokens ([CLS] and [SEP], a
    pair's second [SEP]) and a WordPiece of each text."""
    return 4 if pair else 3


def pack(tokens_a: Sequence[T], tokens_b: Sequence[T] | None, max_seq_length: int,
         cls_token=CLS, sep_token=SEP) -> Packed:
    """Packs A (and optionally B) as "[CLS] A [SEP]" or "[CLS] A [SEP] B [SEP]" within max_seq_length.

    Args:
      tokens_a: first segment (tokens or ids; the special tokens must be of the same kind).
      tokens_b: second segment, or None for a single text.
      max_seq_length: S; 2 (single) or 3 (pair) positions go to the special tokens.

    Returns:
      A `Packed` of length <= max_seq_length.

    Raises:
      ValueError: max_seq_length leaves no room for a single content token.
    """
    specials = 2 if tokens_b is None else 3
    if max_seq_length < least_length(tokens_b is not None):
        raise ValueError(f"max_seq_length={max_seq_length} is too short for "
                         f"{'a pair' if tokens_b is not None else 'one text'}: need >= "
                         f"{least_length(tokens_b is not None)}")
    budget = max_seq_length - specials
    if tokens_b is None:
        a, b = list(tokens_a[:budget]), []
    else:
        a, b = truncate_pair(tokens_a, tokens_b, budget)
    truncated = len(a) < len(tokens_a) or (tokens_b is not None and len(b) < len(tokens_b))
    tokens = [cls_token, *a, sep_token]
    segment_ids = [0] * len(tokens)
    if tokens_b is not None:
        tokens += [*b, sep_token]
        segment_ids += [1] * (len(b) + 1)
    return Packed(tokens, segment_ids, len(a), len(b), truncated)


def pad_features(ids: Sequence[Sequence[int]], segment_ids: Sequence[Sequence[int]],
                 max_seq_length: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Pads packed sequences into fixed-length int32 arrays.

    Args:
      ids: N sequences of token ids, each of length <= S.
      segment_ids: N matching segment-id sequences.
      max_seq_length: S.
      pad_id: id written into padding (Google's vocabularies: [PAD] = 0).

    Returns:
      {"input_ids": int32 [N, S], "input_mask": int32 [N, S] (1 real, 0 pad),
       "segment_ids": int32 [N, S] (0 on padding)}.
    """
    n = len(ids)
    out = {
        INPUT_IDS: np.full((n, max_seq_length), pad_id, np.int32),
        INPUT_MASK: np.zeros((n, max_seq_length), np.int32),
        SEGMENT_IDS: np.zeros((n, max_seq_length), np.int32),
    }
    for i, (row, seg) in enumerate(zip(ids, segment_ids)):
        if len(row) > max_seq_length or len(seg) != len(row):
            raise ValueError(f"sequence {i}: {len(row)} ids / {len(seg)} segment ids for "
                             f"max_seq_length={max_seq_length}")
        out[INPUT_IDS][i, : len(row)] = row
        out[INPUT_MASK][i, : len(row)] = 1
        out[SEGMENT_IDS][i, : len(row)] = seg
    return out
