"""Documents -> masked sentence-pair instances (Google's algorithm, docs/DESIGN.md section 4).

Pure functions: no flags, no files, no TensorFlow. Every random choice comes from a
`random.Random` passed in (batch-level numpy draws are seeded from it), so a fixed seed gives
fixed output.

Shape legend: N = instances in a batch, S = max_seq_length, P = max_predictions_per_seq.

The algorithm, per document and per `dupe_factor` pass (as Google's create_pretraining_data):
  * a target length: S - 3, or with probability `short_seq_prob` a random length in [2, S-3];
  * sentences accumulate into a chunk until it reaches the target (or the document ends);
    A = the chunk's first k sentences (k random), B = the rest (IsNext), or with
    probability 0.5, and always for a one-sentence chunk, B = consecutive sentences from a
    random *other* document (NotNext) and the unused sentences go back to the document;
  * `truncate_seq_pairs` trims the longer side, one token at a time, from a random end;
  * masking picks min(P, max(1, round(len(tokens) * masked_lm_prob))) positions among the
    non-special tokens ([CLS]/[SEP] never); each becomes [MASK] (80%), a random vocabulary
    entry (10%, any entry) or stays (10%). Whole-word masking picks words (a piece plus its
    following "##" pieces) instead of pieces, never exceeding the budget.
    With `dynamic_masking` this step is left out: instances keep their tokens and the
    trainer masks anew on every pass (bert_keras/masking.py).

What differs from Google's tool, and why (memory must not grow with the corpus):
  * Documents stream through. The NotNext segment comes from `OtherDocumentPool`, a bounded
    first-in first-out pool of the most recent documents. A document of at most
    `pool_window_tokens` tokens is kept whole; a longer one as four windows, each the
    sentences from a uniformly drawn one on until any B is complete, so B starts where
    Google's would and ends at its target or at the document's end, as Google's does (only
    a sentence crossing 2 * pool_window_tokens / 4 tokens from the window's start is cut
    there). A document is never drawn for itself (the pool excludes its id), and fewer than
    two documents is an error.
  * The `dupe_factor` passes over a document run back to back instead of as whole-corpus
    passes; the writer's shuffle buffer spreads them out (Google shuffles all instances in
    memory).
  * A file end also ends a document (Google's tool runs the last document of one file into
    the first of the next when there is no blank line between them).
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from data_prep import schema


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """What masking needs to know about the vocabulary.

    Attributes:
      cls_id, sep_id, mask_id: ids of [CLS], [SEP], [MASK].
      vocab_size: V; random replacements are drawn uniformly from [0, V).
      is_continuation: bool array [V], True for "##" pieces (whole-word masking), or None.
    """

    cls_id: int
    sep_id: int
    mask_id: int
    vocab_size: int
    is_continuation: np.ndarray | None = None
    unk_id: int | None = None  # [UNK], counted in InstanceStats.unknown_tokens

    @classmethod
    def from_vocab(cls, vocab: Sequence[str]) -> "SpecialTokens":
        """Looks the special tokens up in a vocabulary list (index = id).

        Raises:
          ValueError: a special token is missing (names it).
        """
        index = {}
        for i, token in enumerate(vocab):
            index.setdefault(token, i)
        missing = [t for t in (schema.CLS, schema.SEP, schema.MASK) if t not in index]
        if missing:
            raise ValueError(f"vocabulary of {len(vocab)} entries lacks {', '.join(missing)}")
        return cls(cls_id=index[schema.CLS], sep_id=index[schema.SEP], mask_id=index[schema.MASK],
                   vocab_size=len(vocab),
                   is_continuation=np.array([t.startswith(schema.SUFFIX_INDICATOR) for t in vocab],
                                            bool),
                   unk_id=index.get(schema.UNK))


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    """Settings of instance creation (Google's flag names and defaults).

    Attributes:
      max_seq_length: S, including [CLS] and two [SEP].
      max_predictions_per_seq: P, the masked-LM budget cap.
      masked_lm_prob: share of tokens to mask before the cap.
      short_seq_prob: probability of a random shorter target length for a document pass.
      dupe_factor: passes over each document (each with new random choices).
      do_whole_word_mask: mask whole words rather than word pieces.
      pool_size: documents kept for NotNext segments (see OtherDocumentPool).
      pool_window_tokens: tokens kept per pooled document; None = 4 * max_seq_length.
      warmup_documents: documents that wait (whole) until the pool holds them all, so that
        the first documents draw NotNext segments from more than a handful of others.
      warmup_max_tokens: ...or until the waiting documents hold this many tokens (bounds
        memory for corpora of very long documents).
      batch_size: instances packed and masked per numpy batch.
      dynamic_masking: leave instances unmasked (the trainer masks them on every pass);
        masked_lm_prob, max_predictions_per_seq and do_whole_word_mask are then unused.
    """

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    do_whole_word_mask: bool = False
    pool_size: int = 10_000
    pool_window_tokens: int | None = None
    warmup_documents: int = 256
    warmup_max_tokens: int = 4 * 1024 * 1024
    batch_size: int = 1024
    dynamic_masking: bool = False

    def __post_init__(self):
        s, p = self.max_seq_length, self.max_predictions_per_seq
        checks = [
            (s >= 5, f"max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP]); received {s}"),
            (p >= 1, f"max_predictions_per_seq must be >= 1; received {p}"),
            (p <= s, f"max_predictions_per_seq must be <= max_seq_length; received "
                     f"max_predictions_per_seq={p}, max_seq_length={s}"),
            (0.0 < self.masked_lm_prob <= 1.0,
             f"masked_lm_prob must be in (0, 1]; received {self.masked_lm_prob}"),
            (0.0 <= self.short_seq_prob <= 1.0,
             f"short_seq_prob must be in [0, 1]; received {self.short_seq_prob}"),
            (self.dupe_factor >= 1, f"dupe_factor must be >= 1; received {self.dupe_factor}"),
            (self.pool_size >= 2, f"pool_size must be >= 2; received {self.pool_size}"),
            (self.pool_window_tokens is None or self.pool_window_tokens >= 1,
             f"pool_window_tokens must be >= 1; received {self.pool_window_tokens}"),
            (self.batch_size >= 1, f"batch_size must be >= 1; received {self.batch_size}"),
            (self.warmup_documents >= 2,
             f"warmup_documents must be >= 2; received {self.warmup_documents}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def window_tokens(self) -> int:
        return self.pool_window_tokens or 4 * self.max_seq_length


@dataclasses.dataclass(frozen=True)
class Document:
    """A tokenized document: its sentences are consecutive runs of one flat id array.

    Attributes:
      doc_id: unique id in the stream (never reused; NotNext excludes it).
      tokens: int32 array [T], all sentences concatenated; every sentence non-empty.
      splits: sentence boundaries, a list of n+1 ints, 0 = splits[0] < ... < splits[n] = T.
      windows: None for a document; for `OtherDocumentPool`'s windows of one, their first
        sentences (ascending, the first 0): each window runs to the next one's start, and a
        NotNext B starts at a window's first sentence and stays in that window.
    """

    doc_id: int
    tokens: np.ndarray
    splits: list[int]
    windows: tuple[int, ...] | None = None

    @classmethod
    def from_sentences(cls, doc_id: int, sentences: Iterable[Sequence[int]]) -> "Document":
        """Builds a Document from token-id lists, dropping empty sentences."""
        sentences = [list(s) for s in sentences if len(s)]
        splits = [0]
        for s in sentences:
            splits.append(splits[-1] + len(s))
        tokens = np.array([t for s in sentences for t in s], np.int32)
        return cls(doc_id, tokens, splits)

    @property
    def num_sentences(self) -> int:
        return len(self.splits) - 1

    @property
    def num_tokens(self) -> int:
        return self.splits[-1]

    def sentence(self, i: int) -> np.ndarray:
        return self.tokens[self.splits[i]:self.splits[i + 1]]


class SegmentPair(NamedTuple):
    """One instance before packing: A = a_doc.tokens[a_lo:a_hi], B likewise."""

    a_tokens: np.ndarray
    a_lo: int
    a_hi: int
    b_tokens: np.ndarray
    b_lo: int
    b_hi: int
    is_random_next: bool
    a_doc_id: int
    b_doc_id: int


def _below(rng: random.Random, n: int) -> int:
    """A uniform int in [0, n): like rng.randrange(n) but 5x faster (bias < n / 2**53)."""
    return int(rng.random() * n)


class OtherDocumentPool:
    """A bounded first-in first-out pool of recent documents for NotNext segments.

    Why a bounded pool is enough: a NotNext B only has to come from a *different* document,
    which the pool guarantees by excluding the current document's id. Each document stays
    for the next `capacity` insertions and receives 1/capacity of the draws meanwhile, so the
    number of times a document serves as a B source has the same expectation as with
    Google's draw over the whole corpus; only *when* it is drawn changes. With 10,000 slots
    any two NotNext draws share a source with probability 1e-4. Memory is at most
    capacity * 2 * window_tokens * 4 bytes (10,000 * 1,024 * 4 = 41 MB at S = 128), about
    half that in practice (a window ends one sentence past S tokens).

    Args:
      capacity: documents kept (>= 2).
      window_tokens: a document of at most this many tokens is kept whole; a longer one as
        `WINDOWS` windows, each the whole sentences from a uniformly drawn one until
        window_tokens / WINDOWS tokens (S at the default 4 * S: a B needs at most S - 4),
        the sentence crossing that cut where the window reaches twice as many. A B drawn
        from such a document starts at a window's first sentence, so it starts and ends
        where Google's B would: one random window of the document with B starting anywhere
        in it cut Bs short at the window's end (NotNext rows were padded 4 times as often as
        Google's, so sequence length told NSP labels apart).
    """

    WINDOWS = 4

    def __init__(self, capacity: int, window_tokens: int):
        if capacity < 2 or window_tokens < 1:
            raise ValueError(f"OtherDocumentPool needs capacity >= 2 and window_tokens >= 1; "
                             f"received capacity={capacity}, window_tokens={window_tokens}")
        self.capacity = capacity
        self.window_tokens = window_tokens
        self._docs: list[Document] = []  # a ring buffer once full; _oldest is the next to go
        self._oldest = 0
        self._ids: dict[int, int] = {}  # doc_id -> times present (0 or 1 in normal use)

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, doc: Document, rng: random.Random) -> None:
        """Adds a document (windowed), evicting the oldest when full."""
        entry = self._window(doc, rng)
        if len(self._docs) < self.capacity:
            self._docs.append(entry)
        else:
            old = self._docs[self._oldest]
            self._ids[old.doc_id] -= 1
            if not self._ids[old.doc_id]:
                del self._ids[old.doc_id]
            self._docs[self._oldest] = entry
            self._oldest = (self._oldest + 1) % self.capacity
        self._ids[doc.doc_id] = self._ids.get(doc.doc_id, 0) + 1

    def _window(self, doc: Document, rng: random.Random) -> Document:
        """`doc`, or its `WINDOWS` windows in one Document (see the class docstring)."""
        if doc.num_tokens <= self.window_tokens or doc.windows is not None:
            return doc  # short enough, or windowed already (Beam windows before pooling)
        need = max(1, self.window_tokens // self.WINDOWS)
        pieces, splits, windows = [], [0], []
        for _ in range(self.WINDOWS):
            first = _below(rng, doc.num_sentences)
            lo = doc.splits[first]
            # Up to the first sentence end at or past `need` tokens (or the document's end).
            last = min(bisect.bisect_left(doc.splits, lo + need, first + 1), doc.num_sentences)
            bounds = [b - lo for b in doc.splits[first + 1:last + 1]]
            bounds[-1] = min(bounds[-1], 2 * need)  # a sentence longer than that is cut
            windows.append(len(splits) - 1)
            base = splits[-1]
            splits.extend(base + b for b in bounds)
            pieces.append(doc.tokens[lo:lo + bounds[-1]])
        tokens = np.concatenate(pieces).astype(np.int32, copy=False)  # a copy, not a view
        return Document(doc.doc_id, tokens, splits, tuple(windows))

    def sample(self, exclude_doc_id: int, rng: random.Random) -> Document:
        """Returns a uniformly chosen pooled document whose id is not `exclude_doc_id`.

        Raises:
          ValueError: the pool holds no other document.
        """
        n = len(self._docs)
        excluded = self._ids.get(exclude_doc_id, 0)
        if n - excluded <= 0:
            raise ValueError(
                f"no other document to draw a NotNext segment from (pool holds {n} document(s), "
                f"{excluded} of them the current one); the corpus needs at least 2 documents")
        if not excluded:
            return self._docs[_below(rng, n)]
        while True:  # rejection: at most one slot matches, so this ends quickly
            doc = self._docs[_below(rng, n)]
            if doc.doc_id != exclude_doc_id:
                return doc


def truncate_seq_pairs(len_a: np.ndarray, len_b: np.ndarray, max_num_tokens: int,
                       np_rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Google's truncate_seq_pair, for a batch of pairs at once.

    Google's loop: while len(A) + len(B) > max_num_tokens, the longer side (B on a tie)
    loses one token, from the front or the back with probability 1/2 each. Which side
    loses how many is fixed by the lengths: the longer side is cut down to a tie (B to one
    below A), then the cuts alternate. Only front-vs-back is random, one fair coin per cut,
    so the front count of a side is Binomial(cuts, 1/2): the same distribution as the loop's,
    with no Python work per token (a 1 MB sentence costs what a short one does).

    Args:
      len_a, len_b: int arrays [N], lengths of A and B (>= 1 each).
      max_num_tokens: budget for len(A) + len(B) (>= 2).
      np_rng: random source.

    Returns:
      (a_front, a_back, b_front, b_back): int64 arrays [N], tokens to drop from each end.
    """
    len_a = np.asarray(len_a, np.int64)
    len_b = np.asarray(len_b, np.int64)
    excess = np.maximum(len_a + len_b - max_num_tokens, 0)
    a_longer = len_a > len_b
    # First run: the longer side down to a tie (A longer) or to one below A (B longer or tie).
    first = np.where(a_longer, np.minimum(excess, len_a - len_b),
                     np.minimum(excess, len_b - len_a + 1))
    rest = excess - first
    # Then the cuts alternate, starting with B if A was longer (tie -> B), else with A.
    cut_a = np.where(a_longer, first + rest // 2, (rest + 1) // 2)
    cut_b = np.where(a_longer, (rest + 1) // 2, first + rest // 2)
    a_front = np_rng.binomial(cut_a, 0.5)
    b_front = np_rng.binomial(cut_b, 0.5)
    return a_front, cut_a - a_front, b_front, cut_b - b_front


def create_pairs_from_document(doc: Document, pool: OtherDocumentPool, max_seq_length: int,
                               short_seq_prob: float, rng: random.Random) -> list[SegmentPair]:
    """One pass of Google's create_instances_from_document, before masking.

    Args:
      doc: the document (at least one non-empty sentence).
      pool: other documents for NotNext segments; `doc` itself is never drawn.
      max_seq_length: S; pairs hold at most S - 3 tokens.
      short_seq_prob: probability of a random target length in [2, S - 3].
      rng: random source.

    Returns:
      list of SegmentPair, not yet truncated (`finish_instances` truncates them).
    """
    max_num_tokens = max_seq_length - 3
    uniform = rng.random
    target = max_num_tokens
    if uniform() < short_seq_prob:
        target = 2 + int(uniform() * (max_num_tokens - 1))
    splits, tokens, n, doc_id = doc.splits, doc.tokens, len(doc.splits) - 1, doc.doc_id
    pairs = []
    chunk_start = 0
    current_length = 0
    i = 0
    while i < n:
        current_length += splits[i + 1] - splits[i]
        if i == n - 1 or current_length >= target:
            chunk_len = i - chunk_start + 1
            a_end = 1 + int(uniform() * (chunk_len - 1)) if chunk_len >= 2 else 1
            a_lo, a_hi = splits[chunk_start], splits[chunk_start + a_end]
            if chunk_len == 1 or uniform() < 0.5:
                other = pool.sample(doc_id, rng)
                o_splits = other.splits
                o_n = len(o_splits) - 1
                if other.windows is None:  # a whole document: B starts at any sentence
                    start, stop = int(uniform() * o_n), o_n
                else:  # at a window's first sentence, and stays in that window
                    w = int(uniform() * len(other.windows))
                    start = other.windows[w]
                    stop = other.windows[w + 1] if w + 1 < len(other.windows) else o_n
                b_lo = o_splits[start]
                # Consecutive sentences from `start` until B reaches the target (at least one).
                end = bisect.bisect_left(o_splits, b_lo + target - (a_hi - a_lo), start + 1,
                                         stop)
                b_hi = o_splits[end]
                pairs.append(SegmentPair(tokens, a_lo, a_hi, other.tokens, b_lo, b_hi, True,
                                         doc_id, other.doc_id))
                i -= chunk_len - a_end  # the unused sentences go back
            else:
                pairs.append(SegmentPair(tokens, a_lo, a_hi, tokens, a_hi, splits[i + 1], False,
                                         doc_id, doc_id))
            chunk_start = i + 1
            current_length = 0
        i += 1
    return pairs


class InstanceBatch(NamedTuple):
    """N finished instances in the schema's layout (numpy, unpadded batch dimension N).

    input_ids, input_mask, segment_ids: int32 [N, S] (input_ids after masking)
    masked_lm_positions, masked_lm_ids: int32 [N, P] (ascending positions; original ids)
    masked_lm_weights: float32 [N, P]
      (all three [N, 0] with dynamic masking, and input_ids unmasked)
    next_sentence_labels: int32 [N] (0 IsNext, 1 NotNext)
    a_doc_ids, b_doc_ids: int64 [N], source documents (not written; for checks and tests)
    """

    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    masked_lm_weights: np.ndarray
    next_sentence_labels: np.ndarray
    a_doc_ids: np.ndarray
    b_doc_ids: np.ndarray


def pack_pairs(pairs: Sequence[SegmentPair], max_seq_length: int, special: SpecialTokens,
               np_rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Truncates pairs (truncate_seq_pairs) and lays them out as `[CLS] A [SEP] B [SEP]` rows.

    Args:
      pairs: N untruncated pairs (both segments non-empty).
      max_seq_length: S.
      special: [CLS] / [SEP] ids.
      np_rng: random source for truncation.

    Returns:
      (input_ids int32 [N, S] 0-padded, input_mask int32 [N, S], segment_ids int32 [N, S],
       len_a int64 [N] (so the middle [SEP] sits at len_a + 1)).
    """
    n, s = len(pairs), max_seq_length
    ids = np.zeros((n, s), np.int32)
    if n == 0:
        return ids, ids.copy(), ids.copy(), np.zeros(0, np.int64)
    a_tok, a_lo, a_hi, b_tok, b_lo, b_hi = list(zip(*pairs))[:6]
    a_lo, a_hi, b_lo, b_hi = (np.array(v, np.int64) for v in (a_lo, a_hi, b_lo, b_hi))
    if (a_hi - a_lo).min() < 1 or (b_hi - b_lo).min() < 1:
        raise ValueError("pack_pairs: every pair needs non-empty A and B segments")
    a_front, a_back, b_front, b_back = truncate_seq_pairs(a_hi - a_lo, b_hi - b_lo, s - 3, np_rng)
    a_lo, a_hi, b_lo, b_hi = a_lo + a_front, a_hi - a_back, b_lo + b_front, b_hi - b_back
    len_a, len_b = a_hi - a_lo, b_hi - b_lo
    pieces = []
    for ta, alo, ahi, tb, blo, bhi in zip(a_tok, a_lo.tolist(), a_hi.tolist(), b_tok,
                                         b_lo.tolist(), b_hi.tolist()):
        pieces.append(ta[alo:ahi])
        pieces.append(tb[blo:bhi])
    flat = np.concatenate(pieces)
    lengths = np.stack([len_a, len_b], axis=1).reshape(-1)               # [2N]
    rows = np.arange(n, dtype=np.int64)
    start_cols = np.stack([np.ones(n, np.int64), len_a + 2], axis=1).reshape(-1)
    piece_starts = np.repeat(np.repeat(rows, 2) * s + start_cols, lengths)
    within = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ids.reshape(-1)[piece_starts + within] = flat
    total = len_a + len_b + 3
    ids[:, 0] = special.cls_id
    ids[rows, len_a + 1] = special.sep_id
    ids[rows, total - 1] = special.sep_id
    cols = np.arange(s)[None, :]
    mask = (cols < total[:, None]).astype(np.int32)
    segments = ((cols >= (len_a + 2)[:, None]) & (cols < total[:, None])).astype(np.int32)
    return ids, mask, segments, len_a


def mask_tokens(input_ids: np.ndarray, input_mask: np.ndarray, len_a: np.ndarray,
                masked_lm_prob: float, max_predictions_per_seq: int, special: SpecialTokens,
                np_rng: np.random.Generator, do_whole_word_mask: bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Chooses and applies masked-LM predictions for a packed batch.

    Args:
      input_ids: int32 [N, S] from pack_pairs (not modified).
      input_mask: int32 [N, S].
      len_a: int [N], length of A (so [SEP] sits at len_a + 1).
      masked_lm_prob, max_predictions_per_seq: the budget is
        min(P, max(1, round(len(tokens) * masked_lm_prob))), len(tokens) counting specials.
      special: special ids, vocab size, and "##" flags (needed for whole-word masking).
      np_rng: random source.
      do_whole_word_mask: mask whole words (a piece and its following "##" pieces).

    Returns:
      (masked input_ids int32 [N, S], masked_lm_positions int32 [N, P] ascending 0-padded,
       masked_lm_ids int32 [N, P] original ids 0-padded, masked_lm_weights float32 [N, P]).
    """
    n, s = input_ids.shape
    p = max_predictions_per_seq
    total = input_mask.sum(axis=1).astype(np.int64)
    cols = np.arange(s)[None, :]
    middle_sep = (np.asarray(len_a) + 1)[:, None]
    candidate = (cols >= 1) & (cols < (total - 1)[:, None]) & (cols != middle_sep)
    budget = np.minimum(p, np.maximum(1, np.rint(total * masked_lm_prob).astype(np.int64)))
    budget = np.minimum(budget, candidate.sum(axis=1))

    if do_whole_word_mask:
        if special.is_continuation is None:
            raise ValueError("whole-word masking needs SpecialTokens.is_continuation")
        chosen = _choose_whole_words(input_ids, candidate, budget, special.is_continuation,
                                     np_rng, p)
    else:
        # Random keys, non-candidates last: the P smallest keys are a uniform random sample.
        keys = np_rng.random((n, s))
        keys[~candidate] = 2.0
        if s > p:
            first = np.argpartition(keys, p - 1, axis=1)[:, :p]
        else:
            first = np.broadcast_to(np.arange(s), (n, s)).copy()
        order = np.argsort(np.take_along_axis(keys, first, axis=1), axis=1)
        chosen = np.take_along_axis(first, order, axis=1)       # [N, P] in random order
        chosen = np.where(np.arange(p)[None, :] < budget[:, None], chosen, s)

    positions = np.sort(chosen, axis=1)                          # unused slots (= S) sort last
    valid = positions < s
    positions = np.where(valid, positions, 0).astype(np.int32)
    rows = np.arange(n)[:, None]
    labels = np.where(valid, input_ids[rows, positions], 0).astype(np.int32)
    weights = valid.astype(np.float32)

    # 80% [MASK], 10% unchanged, 10% a random vocabulary entry (any, specials included).
    coin = np_rng.random((n, p))
    random_ids = np_rng.integers(0, special.vocab_size, (n, p), dtype=np.int64)
    replacement = np.where(coin < 0.8, special.mask_id,
                           np.where(coin < 0.9, labels, random_ids)).astype(np.int32)
    masked = input_ids.copy()
    r, c = np.nonzero(valid)
    masked[r, positions[r, c]] = replacement[r, c]
    return masked, positions, labels, weights


def _choose_whole_words(input_ids: np.ndarray, candidate: np.ndarray, budget: np.ndarray,
                        is_continuation: np.ndarray, np_rng: np.random.Generator,
                        p: int) -> np.ndarray:
    """Whole-word choice: positions [N, P] in random order, unused slots = S.

    A word is a candidate token that is not a "##" piece (or the first candidate after a
    special token: a segment truncated in mid-word) plus the "##" candidates right after it.
    Words are visited in random order and taken while they fit the budget; as in Google's
    code a word that would overflow is skipped and later, shorter ones are still tried.
    """
    n, s = input_ids.shape
    cont = is_continuation[np.clip(input_ids, 0, len(is_continuation) - 1)] & candidate
    prev_candidate = np.zeros_like(candidate)
    prev_candidate[:, 1:] = candidate[:, :-1]
    starts = candidate & ~(cont & prev_candidate)
    keys = np_rng.random((n, s))
    out = np.full((n, p), s, np.int64)
    for row in range(n):
        cand_pos = np.flatnonzero(candidate[row])
        word_of = np.cumsum(starts[row, cand_pos]) - 1               # word index per candidate
        word_start = cand_pos[starts[row, cand_pos]]
        word_len = np.bincount(word_of, minlength=len(word_start))
        order = np.argsort(keys[row, word_start], kind="stable")
        lens = word_len[order]
        room = int(budget[row])
        fits = np.cumsum(lens) <= room                                 # the prefix that fits
        k = int(np.argmin(fits)) if not fits.all() else len(fits)
        taken = [order[:k]]
        room -= int(lens[:k].sum())
        if k < len(order) and room > 0:                                # skip-and-continue tail
            rest = []
            for j, width in zip(order[k + 1:].tolist(), lens[k + 1:].tolist()):
                if width <= room:
                    rest.append(j)
                    room -= width
                    if room == 0:
                        break
            taken.append(np.array(rest, np.int64))
        words = np.concatenate(taken).astype(np.int64)
        if words.size:
            positions = np.concatenate([np.arange(word_start[w], word_start[w] + word_len[w])
                                        for w in words.tolist()])
            out[row, :positions.size] = positions
    return out


@dataclasses.dataclass
class InstanceStats:
    """Counters over a stream (all ints)."""

    documents: int = 0
    one_sentence_documents: int = 0
    sentences: int = 0
    tokens: int = 0
    instances: int = 0
    not_next: int = 0
    masked: int = 0
    real_tokens: int = 0  # non-special, non-padding tokens in instances
    unknown_tokens: int = 0  # [UNK] among `tokens` (the corpus's WordPieces)

    def merge(self, other: "InstanceStats") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def generate_instances(documents: Iterable[Document], config: InstanceConfig,
                       special: SpecialTokens, rng: random.Random,
                       stats: InstanceStats | None = None) -> Iterator[InstanceBatch]:
    """Streams documents into batches of finished instances in bounded memory.

    The first `config.warmup_documents` documents (fewer if they hold
    `config.warmup_max_tokens` tokens) wait until the pool holds them all, so that early
    documents draw NotNext segments from many others; afterwards each document is turned
    into instances on arrival and then joins the pool (which keeps growing to
    `config.pool_size`). Memory: the waiting documents, the pool, one document's pairs.

    Args:
      documents: Document stream; doc_ids must be unique; empty documents are skipped.
      config: InstanceConfig.
      special: SpecialTokens.
      rng: random source.
      stats: optional counters, updated in place.

    Yields:
      InstanceBatch of at most config.batch_size instances (the last may be smaller).

    Raises:
      ValueError: the stream has no document, or only one (NotNext needs another).
    """
    stats = stats if stats is not None else InstanceStats()
    pool = OtherDocumentPool(config.pool_size, config.window_tokens)
    pairs: list[SegmentPair] = []
    waiting: list[Document] = []
    waiting_tokens = 0
    warming = True

    def make_pairs(doc: Document) -> None:
        for _ in range(config.dupe_factor):
            pairs.extend(create_pairs_from_document(doc, pool, config.max_seq_length,
                                                    config.short_seq_prob, rng))

    def drain(final: bool) -> Iterator[InstanceBatch]:
        while len(pairs) >= config.batch_size or (final and pairs):
            batch = pairs[:config.batch_size]
            del pairs[:config.batch_size]
            yield finish_instances(batch, config, special, rng, stats)

    for doc in documents:
        if doc.num_sentences == 0:
            continue
        stats.documents += 1
        stats.one_sentence_documents += doc.num_sentences == 1
        stats.sentences += doc.num_sentences
        stats.tokens += doc.num_tokens
        if special.unk_id is not None:
            stats.unknown_tokens += int(np.count_nonzero(doc.tokens == special.unk_id))
        if warming:
            waiting.append(doc)
            waiting_tokens += doc.num_tokens
            pool.add(doc, rng)
            if len(waiting) >= min(config.pool_size, config.warmup_documents) or (
                    waiting_tokens >= config.warmup_max_tokens and len(waiting) >= 2):
                warming = False
                for d in waiting:
                    make_pairs(d)
                    yield from drain(final=False)
                waiting = []
        else:
            make_pairs(doc)
            pool.add(doc, rng)
            yield from drain(final=False)
    if warming:
        if len(waiting) == 0:
            raise TooFewDocumentsError(
                "the corpus holds no document with text (expected one sentence per line, a "
                "blank line between documents)", 0)
        if len(waiting) == 1:
            raise TooFewDocumentsError(
                "the corpus holds a single document; NotNext segments must come from another "
                "document, so at least 2 are needed (put a blank line between documents)", 1)
        for d in waiting:
            make_pairs(d)
            yield from drain(final=False)
    yield from drain(final=True)


class TooFewDocumentsError(ValueError):
    """Fewer than 2 documents with text reached `generate_instances` (`count` of them)."""

    def __init__(self, message: str, count: int):
        super().__init__(message)
        self.count = count


def finish_instances(pairs: Sequence[SegmentPair], config: InstanceConfig,
                     special: SpecialTokens, rng: random.Random,
                     stats: InstanceStats | None = None) -> InstanceBatch:
    """Truncates, packs and masks a batch of pairs.

    Args:
      pairs: N SegmentPairs from create_pairs_from_document.
      config, special: settings and special ids.
      rng: random source (a numpy generator for the batch is seeded from it).
      stats: optional counters, updated in place.

    Returns:
      InstanceBatch of N instances.
    """
    np_rng = np.random.default_rng(rng.getrandbits(64))
    ids, mask, segments, len_a = pack_pairs(pairs, config.max_seq_length, special, np_rng)
    if config.dynamic_masking:
        n = len(pairs)
        masked, positions = ids, np.zeros((n, 0), np.int32)
        labels, weights = positions, np.zeros((n, 0), np.float32)
    else:
        masked, positions, labels, weights = mask_tokens(
            ids, mask, len_a, config.masked_lm_prob, config.max_predictions_per_seq, special,
            np_rng, config.do_whole_word_mask)
    nsp = np.fromiter((p.is_random_next for p in pairs), np.int32, len(pairs))
    if stats is not None:
        stats.instances += len(pairs)
        stats.not_next += int(nsp.sum())
        stats.masked += int(weights.sum())
        stats.real_tokens += int(mask.sum()) - 3 * len(pairs)
    return InstanceBatch(
        input_ids=masked, input_mask=mask, segment_ids=segments, masked_lm_positions=positions,
        masked_lm_ids=labels, masked_lm_weights=weights, next_sentence_labels=nsp,
        a_doc_ids=np.fromiter((p.a_doc_id for p in pairs), np.int64, len(pairs)),
        b_doc_ids=np.fromiter((p.b_doc_id for p in pairs), np.int64, len(pairs)))
