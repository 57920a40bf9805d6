"""The BERT WordPiece tokenizer, in-graph with tensorflow-text, identical to the reference.

Reference semantics (Google's `tokenization.py`; Hugging Face's `BertTokenizer`, which in
transformers 5 is the Rust `tokenizers` pipeline BertNormalizer -> BertPreTokenizer ->
WordPiece):

  1. clean: drop NUL, U+FFFD and "other" characters (Cc, Cf, Co; tab, newline and carriage
     return count as whitespace); every whitespace character becomes a space.
  2. put spaces around CJK ideographs (`tokenize_chinese_chars`).
  3. strip accents (NFD, then drop Mn) if `strip_accents`, which defaults to
     `do_lower_case`; then lowercase if `do_lower_case`.
  4. split on whitespace; every punctuation character (ASCII non-alphanumerics and
     Unicode P*) is a word of its own.
  5. greedy longest-match-first WordPiece with "##" continuation pieces; a word longer than
     100 characters, or one that cannot be covered by the vocabulary, is one [UNK].

Where Google's and transformers' differ we follow transformers' (the tokenizer the
checkpoints people fine-tune are published with): its word limit is 100 characters
(Google's WordpieceTokenizer splits words of 101-200 characters into pieces), and
private-use characters (Co) are dropped (Google's keep them, as [UNK]).

Design (how the graph stays fast and the ids stay identical): steps 1-3 and most of 4 are a
*per-code-point* mapping (each character maps to a fixed string, e.g. "A" -> "a",
"é" -> "e", "\u2011" -> " \u2011 ", U+200B -> ""). We compute that mapping once in Python
from `unicodedata`, compile it into the flatbuffer model that tensorflow-text's
`FastBertNormalize` op executes (a darts-clone trie from UTF-8 bytes to output strings), and
so get exact reference normalization at the speed of tensorflow-text's own (NFKC-casefold
based, hence slightly different) FastBertTokenizer. `FastWordpieceTokenizeWithOffsets` then
splits words (on whitespace, ASCII punctuation and CJK ideographs; our table already put
spaces around all other punctuation) and runs WordPiece. One last step on the id sequence
turns words of more than 100 characters into [UNK] (tensorflow-text counts bytes, not
characters). Every op in the graph is a core TF op or one of FastBertNormalize /
FastWordpieceTokenizeWithOffsets, which stock TF Serving's tensorflow-text 2.12 has.

Invalid UTF-8 (tf.string input or Python bytes) is decoded like Python's
`bytes.decode("utf-8", errors="replace")`: each ill-formed byte sequence becomes U+FFFD,
which step 1 drops. So ill-formed bytes vanish, never crash the tokenizer.

The reference is transformers' `BertTokenizer` (in transformers 5 the Rust pipeline). Known
differences, all on rare characters (BUILD_NOTES.md lists them per code point): Unicode data
versions (we use Python's `unicodedata`, 14.0 on Python 3.11; `tokenizers`' category tables
are Unicode 9, so e.g. U+061D or U+2E43 is punctuation for us only), 36 code points
unassigned in Unicode 14 that tensorflow-text's newer ICU data makes punctuation, and CJK
Extension E U+2B820..U+2B91F, which Google's list counts as CJK and `tokenizers` (a typo,
0x2B920) does not. Like the Rust pipeline and unlike Google's Python code, we keep
unassigned code points and lowercase per character (word-final "Σ" -> "σ", not "ς").
Stripping accents, the reference NFD-decomposes the whole text, which reorders combining
marks by class; our per-character table keeps them in place, so where a stripped mark
precedes one of the 25 kept marks of non-zero class (some viramas, U+302E/U+302F Hangul
tone marks, musical symbols U+1D165..U+1D172) pieces may come in another order (found by
fuzzing, 2026-12-03; no other sequence differs).

Korean: the default uncased setting decomposes Hangul syllables into jamo (NFD), like the
reference. Use `do_lower_case=True, strip_accents=False` for Korean corpora: Latin text is
still lowercased, Hangul stays composed.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import types
import unicodedata
from typing import Iterable, Sequence

import numpy as np
from data_prep import tf_logging

tf = tf_logging.import_tensorflow()  # without TensorFlow's C++ start-up notices
import tensorflow_text as tf_text  # noqa: E402

from data_prep import files
from data_prep.cli import reading
from data_prep.schema import (CLS, MASK, MAX_CHARS_PER_WORD, PAD, SEP, SPECIAL_TOKENS,  # noqa: F401
                              SUFFIX_INDICATOR, UNK, VocabError, load_vocab)
from data_prep.tokenizer_config import TokenizerConfig

_MAX_BYTES_PER_WORD = 4 * MAX_CHARS_PER_WORD  # a character has at most 4 UTF-8 bytes
_BATCH = 2048  # texts per graph call in the Python-facing methods
# Matches a text holding a run of more than MAX_CHARS_PER_WORD characters without whitespace.
_LONG_RUN_PATTERN = r"(?s).*[^\t\n\r\p{Z}]{%d}.*" % (MAX_CHARS_PER_WORD + 1)


# --------------------------------------------------------------------------------------
# The reference normalization as a per-code-point table (pure Python).
# --------------------------------------------------------------------------------------

# Google's list of CJK ideograph blocks (tokenization.py `_is_chinese_char`); tensorflow-text's
# FastWordpiece uses the same list when it splits words.
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


_CJK_LIMIT = max(hi for _, hi in _CJK_RANGES) + 1
_CJK_FLAGS = bytearray(_CJK_LIMIT)
for _lo, _hi in _CJK_RANGES:
    _CJK_FLAGS[_lo:_hi + 1] = b"\x01" * (_hi + 1 - _lo)


def is_cjk_ideograph(cp: int) -> bool:
    """True for code points in the CJK blocks that BERT isolates as single-character words."""
    return cp < _CJK_LIMIT and _CJK_FLAGS[cp] == 1


def _is_ascii_punct(cp: int) -> bool:
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126


def is_punctuation(ch: str) -> bool:
    """Reference punctuation: ASCII non-alphanumeric printable, or Unicode category P*."""
    return _is_ascii_punct(ord(ch)) or unicodedata.category(ch).startswith("P")


def _is_whitespace(ch: str) -> bool:
    # Unicode White_Space minus the C0/C1 controls that cleaning removes first: tab, newline,
    # carriage return and the Zs/Zl/Zp characters (Rust's char::is_whitespace; Google's code
    # maps Zs to a space and Python's str.split() splits on Zl/Zp, the same result).
    return ch in "\t\n\r" or unicodedata.category(ch) in ("Zs", "Zl", "Zp")


def _map_char(ch: str, lower: bool, strip: bool, cjk: bool, mark_all_splits: bool) -> str:
    """The reference normalization of one character, with split points marked by spaces.

    `mark_all_splits=False` leaves whitespace, ASCII punctuation and CJK ideographs as they
    are, because FastWordpiece splits on exactly those by itself (fewer bytes to rewrite);
    every other punctuation character gets spaces around it. `mark_all_splits=True` puts a
    space at every split point, so that splitting on " " gives the reference words.
    """
    cp = ord(ch)
    if cp == 0 or cp == 0xFFFD:
        return ""
    if ch in "\t\n\r":
        return " " if mark_all_splits else ch
    cat = unicodedata.category(ch)
    if cat in ("Cc", "Cf", "Co", "Cs"):  # unassigned (Cn) code points are kept, like tokenizers
        return ""
    if _is_whitespace(ch):
        return " " if mark_all_splits else ch
    spaced_cjk = cjk and is_cjk_ideograph(cp)
    s = ch
    if strip:
        s = "".join(c for c in unicodedata.normalize("NFD", s) if unicodedata.category(c) != "Mn")
    if lower:
        s = "".join(c.lower() for c in s)  # per character: no final-sigma context, like tokenizers
    if spaced_cjk:
        return f" {s} " if mark_all_splits else s
    out = []
    for c in s:
        if is_punctuation(c) and (mark_all_splits or not _is_ascii_punct(ord(c))):
            out.append(f" {c} ")
        else:
            out.append(c)
    return "".join(out)


def _ill_formed_utf8_chunks() -> list[bytes]:
    """Every ill-formed byte sequence that ICU's U8_FWD_1 (used by FastBertNormalize) steps
    over as one unit: a lone byte >= 0x80, or a valid lead byte with 1-2 valid trail bytes
    and no complete character. Each maps to "" (U+FFFD, then dropped by cleaning)."""
    chunks = [bytes([b]) for b in range(0x80, 0x100)]
    trail = range(0x80, 0xC0)
    first_trail_3 = {0xE0: range(0xA0, 0xC0), 0xED: range(0x80, 0xA0)}
    for lead in range(0xE0, 0xF0):
        for t1 in first_trail_3.get(lead, trail):
            chunks.append(bytes([lead, t1]))
    first_trail_4 = {0xF0: range(0x90, 0xC0), 0xF4: range(0x80, 0x90)}
    for lead in range(0xF0, 0xF5):
        for t1 in first_trail_4.get(lead, trail):
            chunks.append(bytes([lead, t1]))
            for t2 in trail:
                chunks.append(bytes([lead, t1, t2]))
    return chunks


@functools.lru_cache(maxsize=None)
def normalization_table(lower: bool, strip: bool, cjk: bool,
                        mark_all_splits: bool) -> dict[bytes, bytes]:
    """Returns {UTF-8 key: normalized UTF-8} for every key whose mapping is not the identity.

    Keys are all Unicode scalar values plus the ill-formed UTF-8 chunks (mapped to b"").
    """
    table: dict[bytes, bytes] = {}
    category = unicodedata.category
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        # Fast path: unassigned code points are kept as they are (CJK blocks aside).
        if category(ch) == "Cn" and not is_cjk_ideograph(cp):
            continue
        mapped = _map_char(ch, lower, strip, cjk, mark_all_splits)
        if mapped != ch:
            table[ch.encode("utf-8")] = mapped.encode("utf-8")
    for chunk in _ill_formed_utf8_chunks():
        table[chunk] = b""
    return table


# --------------------------------------------------------------------------------------
# The FastBertNormalize model: a darts-clone double-array trie in a flatbuffer.
# --------------------------------------------------------------------------------------
# Unit layout read by tensorflow-text's DartsCloneTrieWrapper (uint32):
#   bits 0-7 label, bit 8 has_leaf, bit 9 offset-shift flag, bits 10-31 offset;
#   a value unit has bit 31 set (so it never matches a label) and the value in bits 0-30.
# Children of the node at position p whose unit holds offset o sit at (p ^ o) ^ label; the
# value of a node with has_leaf sits at p ^ o. Value layout (FastBertNormalizer): bit 30 =
# "differs from the input", bits 6-29 = offset into the string pool, bits 0-5 = byte length.

_VALUE_DIFFERENT = 0x40000000
_LEN_BITS = 6


def _build_darts_trie(items: dict[bytes, int]) -> np.ndarray:
    """Builds a darts-clone double array for non-empty byte keys -> values in [0, 2**31).

    Identical subtrees are shared (a DAWG), which keeps large uniform ranges (private-use
    planes, ill-formed UTF-8) small. Returns a uint32 array.
    """
    # 1. A plain trie of nested dicts; key -1 holds a node's value.
    root: dict = {}
    for key, value in items.items():
        if not key or 0 in key:
            raise ValueError(f"trie keys must be non-empty and free of NUL bytes: {key!r}")
        node = root
        for b in key:
            node = node.setdefault(b, {})
        node[-1] = value
    # 2. Intern identical subtrees bottom-up: uid -> (value or None, ((label, child uid), ...)).
    uids: dict[tuple, int] = {}
    nodes: list[tuple] = []

    def intern(node: dict) -> int:
        children = tuple((b, intern(child)) for b, child in sorted(
            (k, v) for k, v in node.items() if k != -1))
        sig = (node.get(-1), children)
        uid = uids.get(sig)
        if uid is None:
            uid = uids[sig] = len(nodes)
            nodes.append(sig)
        return uid

    root_uid = intern(root)
    # 3. Choose a base (child block) for every unique node: nodes with several labels first,
    #    block by block (a block is 256 aligned slots; children of one node share a block),
    #    then single-label nodes (mostly leaves) into the remaining free slots.
    order, seen = [root_uid], {root_uid}
    for uid in order:  # grows while iterating: breadth-first over the DAG
        for _, child in nodes[uid][1]:
            if child not in seen:
                seen.add(child)
                order.append(child)

    def labels_of(uid: int) -> list[int]:
        value, children = nodes[uid]
        return ([0] if value is not None else []) + [b for b, _ in children]

    num_blocks = 1
    used = bytearray(256)
    used[0] = 1  # the root's own unit
    free_in_block = [255]
    failures = [0]
    used_bases: set[int] = set()
    base = [-1] * len(nodes)

    def take(uid: int, b: int, labels: list[int]) -> None:
        base[uid] = b
        used_bases.add(b)
        for l in labels:
            used[b ^ l] = 1
            free_in_block[(b ^ l) >> 8] -= 1

    def grow() -> None:
        nonlocal num_blocks
        used.extend(bytearray(256))
        free_in_block.append(256)
        failures.append(0)
        num_blocks += 1

    multi = [u for u in order if len(labels_of(u)) > 1]
    single = [u for u in order if len(labels_of(u)) == 1]
    first_open = 0
    for uid in multi:
        labels = labels_of(uid)
        k = first_open
        while True:
            if k == num_blocks:
                grow()
            if free_in_block[k] >= len(labels) and failures[k] < 8:
                start = k << 8
                found = -1
                for low in range(256):
                    b = start | low
                    if used[b ^ labels[0]] or b in used_bases:
                        continue
                    if all(not used[b ^ l] and (b ^ l) != 0 for l in labels):
                        found = b
                        break
                if found >= 0:
                    take(uid, found, labels)
                    break
                failures[k] += 1
            k += 1
        while first_open < num_blocks and (free_in_block[first_open] == 0 or failures[first_open] >= 8):
            first_open += 1
    p = 1
    for uid in single:
        label = labels_of(uid)[0]
        while True:
            if p >= len(used):
                grow()
            b = p ^ label
            if not used[p] and b not in used_bases and p != 0:
                break
            p += 1
        take(uid, b, [label])
    # 4. Write the units. Every occurrence of a shared child gets its own unit (its own
    #    label and offset) pointing at the child's single block.
    n = max(max(base[u] ^ l for u in order for l in labels_of(u)), 0) + 1
    units = np.zeros(n, dtype=np.uint32)

    def unit(label: int, has_leaf: bool, offset: int) -> int:
        if offset >= 1 << 21:
            raise ValueError("trie too large for darts-clone offsets")
        return (offset << 10) | (int(has_leaf) << 8) | label

    units[0] = unit(0, False, 0 ^ base[root_uid])
    for uid in order:
        value, children = nodes[uid]
        b = base[uid]
        if value is not None:
            if not 0 <= value < 1 << 31:
                raise ValueError(f"trie value out of range: {value}")
            units[b] = value | 0x80000000
        for label, child in children:
            pos = b ^ label
            child_has_leaf = nodes[child][0] is not None
            units[pos] = unit(label, child_has_leaf, pos ^ base[child] if base[child] >= 0 else 0)
    return units


def _darts_lookup(units: np.ndarray, key: bytes) -> int | None:
    """Python version of DartsCloneTrieWrapper lookup (for tests): value or None."""
    node, u = 0, int(units[0])
    for ch in key:
        node ^= ((u >> 10) << ((u & 0x200) >> 6)) ^ ch
        if node >= len(units):
            return None
        u = int(units[node])
        if (u & 0x800000FF) != ch:
            return None
    if not u & 0x100:
        return None
    return int(units[node ^ ((u >> 10) << ((u & 0x200) >> 6))]) & 0x7FFFFFFF


@functools.lru_cache(maxsize=None)
def normalizer_model(lower: bool, strip: bool, cjk: bool, mark_all_splits: bool) -> bytes:
    """`build_normalizer_model`, kept in an on-disk cache between processes.

    Building the model walks all of Unicode in Python (about 1.2 s); every tool and test
    process that makes a tokenizer would pay that at start-up. The cache key is the options
    plus everything the model depends on: this file's source (the table and the trie
    builder), Python's Unicode database version and the Python version. The file lives in
    $BERT_KERAS_CACHE (default ~/.cache/bert-keras)/normalizer/, is written under a temporary
    name and renamed, and a cache that cannot be read or written is simply bypassed.
    """
    import hashlib
    import sys

    key = hashlib.sha256()
    with open(__file__, "rb") as f:
        key.update(f.read())
    key.update(repr((lower, strip, cjk, mark_all_splits, unicodedata.unidata_version,
                     sys.version_info[:3])).encode())
    path = os.path.join(files.cache_root(), "normalizer", key.hexdigest()[:32] + ".fb")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        pass
    model = build_normalizer_model(lower, strip, cjk, mark_all_splits)
    try:
        with files.atomic_output(path, overwrite=True) as tmp, open(tmp, "wb") as f:
            f.write(model)
    except OSError:
        pass
    return model


def build_normalizer_model(lower: bool, strip: bool, cjk: bool, mark_all_splits: bool) -> bytes:
    """Returns a FastBertNormalize model flatbuffer (bytes) executing `normalization_table`.

    The flatbuffer is tensorflow-text's FastBertNormalizerModel: field 0 bool
    lower_case_nfd_strip_accents (informational), 1 trie_array [uint32],
    2 data_for_codepoint_zero int32, 3 normalized_string_pool [ubyte].
    """
    import flatbuffers  # a TensorFlow dependency

    table = normalization_table(lower, strip, cjk, mark_all_splits)
    pool = bytearray()
    pool_offset: dict[bytes, int] = {}
    trie_items: dict[bytes, int] = {}
    for key, mapped in table.items():
        if len(mapped) >= 1 << _LEN_BITS:
            raise ValueError(f"normalized form of {key!r} is too long ({len(mapped)} bytes)")
        data = _VALUE_DIFFERENT
        if mapped:
            off = pool_offset.get(mapped)
            if off is None:
                off = pool_offset[mapped] = len(pool)
                pool += mapped
            data |= (off << _LEN_BITS) | len(mapped)
        trie_items[key] = data
    data_for_nul = trie_items.pop(b"\x00")
    units = _build_darts_trie(trie_items)
    builder = flatbuffers.Builder(4 * len(units) + len(pool) + 1024)
    pool_vec = builder.CreateByteVector(bytes(pool) or b" ")
    trie_vec = builder.CreateNumpyVector(units.astype("<u4"))
    builder.StartObject(4)
    builder.PrependBoolSlot(0, lower and strip, False)
    builder.PrependUOffsetTRelativeSlot(1, trie_vec, 0)
    builder.PrependInt32Slot(2, data_for_nul, 0)
    builder.PrependUOffsetTRelativeSlot(3, pool_vec, 0)
    builder.Finish(builder.EndObject())
    return bytes(builder.Output())


# --------------------------------------------------------------------------------------
# The tokenizer.
# --------------------------------------------------------------------------------------

# Python-side word splitting of text normalized with mark_all_splits=False: whitespace, and
# ASCII punctuation and CJK ideographs as single-character words (what FastWordpiece does).
_SPLIT_RE = re.compile(
    "([!-/:-@\\[-`{-~" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _CJK_RANGES) + "])")


def _to_bytes(text: str | bytes) -> bytes:
    if isinstance(text, bytes):
        return text
    if isinstance(text, str):
        # Lone surrogates (possible in Python str) become ill-formed UTF-8, which the
        # normalizer drops like any other invalid byte sequence.
        return text.encode("utf-8", errors="surrogatepass")
    raise TypeError(f"expected str or bytes, got {type(text).__name__}: {text!r:.80}")


def _as_list(texts: Iterable[str | bytes] | str | bytes) -> list[bytes]:
    if isinstance(texts, (str, bytes)):
        raise TypeError("expected a list of texts, got a single str/bytes; wrap it in a list")
    return [_to_bytes(t) for t in texts]


class BertTokenizer(tf.Module):
    """BERT WordPiece tokenizer: eager, in tf.data and inside SavedModels, same ids.

    Attributes:
      vocab: list[str], tokens in id order.
      vocab_size: int.
      pad_id, unk_id, cls_id, sep_id, mask_id: int ids of the special tokens (looked up).
      do_lower_case: bool.
      strip_accents: bool (resolved: None at construction means "follow do_lower_case").
      tokenize_chinese_chars: bool.
      vocab_file: str, the file the vocabulary came from.

    Example:
      tok = BertTokenizer("vocab.txt")
      tok.tokenize(["Héllo, world!"])   # [['hello', ',', 'world', '!']]
      tok.encode(["Héllo, world!"])     # [[7592, 1010, 2088, 999]] (bert-base-uncased)
      ids = tok(tf.constant(["Héllo"]))  # tf.RaggedTensor int32 [1, None]
    """

    def __init__(self, vocab_file: str | os.PathLike, do_lower_case: bool = True,
                 strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 name: str | None = None):
        """Loads and validates the vocabulary and builds the in-graph models.

        Args:
          vocab_file: path of a vocab.txt (one token per line; see `load_vocab`).
          do_lower_case: lowercase the text.
          strip_accents: NFD + drop nonspacing marks; None follows `do_lower_case`. Use
            False with do_lower_case=True for Korean (keeps Hangul syllables composed).
          tokenize_chinese_chars: make every CJK ideograph a word of its own.

        Raises:
          VocabError: see `load_vocab`.
        """
        super().__init__(name=name)
        vocab = load_vocab(vocab_file)
        token_to_id = {t: i for i, t in enumerate(vocab)}
        self.vocab_file = os.fspath(vocab_file)
        self.vocab_size = len(vocab)
        self.pad_id = token_to_id[PAD]
        self.unk_id = token_to_id[UNK]
        self.cls_id = token_to_id[CLS]
        self.sep_id = token_to_id[SEP]
        self.mask_id = token_to_id[MASK]
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = self.do_lower_case if strip_accents is None else bool(strip_accents)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        # FastWordpiece splits CJK ideographs on its own, so with tokenize_chinese_chars=False
        # we mark every split point with a space and tokenize pre-split words instead.
        self._presplit = not self.tokenize_chinese_chars
        model = normalizer_model(self.do_lower_case, self.strip_accents,
                                 self.tokenize_chinese_chars, self._presplit)
        self._normalizer = tf_text.FastBertNormalizer(model_buffer=model)
        # tensorflow-text refuses some vocabularies that load_vocab accepts (e.g. one of
        # special tokens only: "No valid vocab tokens were found to build the trie").
        with reading(self.vocab_file, "a WordPiece vocabulary (tensorflow-text)"):
            self._wordpiece = tf_text.FastWordpieceTokenizer(
                vocab=vocab, suffix_indicator=SUFFIX_INDICATOR,
                max_bytes_per_word=_MAX_BYTES_PER_WORD, token_out_type=tf.int32,
                unknown_token=UNK, no_pretokenization=self._presplit)
        # Per-id tables for the >100-character rule: does the piece start a word, and how
        # many characters does it cover ([UNK] covers an unknown amount: count 0).
        starts = np.array([not t.startswith(SUFFIX_INDICATOR) or t == SUFFIX_INDICATOR
                           for t in vocab], dtype=np.int32)
        chars = np.array([len(t) - len(SUFFIX_INDICATOR) if not s else len(t)
                          for t, s in zip(vocab, starts)], dtype=np.int32)
        chars[self.unk_id] = 0
        self._piece_starts_word = tf.constant(starts)
        self._piece_chars = tf.constant(chars)
        self._vocab_tensor = tf.constant(vocab)
        # Python-side state in a plain namespace, which tf.Module / SavedModel do not track
        # (no list/dict wrappers, no extra functions in exported SavedModels).
        spec = [tf.TensorSpec([None], tf.string)]
        self._py = types.SimpleNamespace(
            vocab=vocab, token_to_id=token_to_id,
            encode=tf.function(self.__call__, input_signature=spec, autograph=False),
            offsets=tf.function(self.tokenize_with_offsets, input_signature=spec,
                                autograph=False),
            normalize=tf.function(self.normalize, input_signature=spec, autograph=False))

    @classmethod
    def from_config(cls, vocab_file: str | os.PathLike, config: TokenizerConfig,
                    name: str | None = None) -> "BertTokenizer":
        """A tokenizer for `vocab_file` with the settings of a `TokenizerConfig`."""
        return cls(vocab_file, do_lower_case=config.do_lower_case,
                   strip_accents=config.strip_accents,
                   tokenize_chinese_chars=config.tokenize_chinese_chars, name=name)

    @property
    def config(self) -> TokenizerConfig:
        """The settings this tokenizer applies (what `tokenizer_config.json` records)."""
        return TokenizerConfig(self.do_lower_case, self.strip_accents, self.tokenize_chinese_chars)

    @property
    def vocab(self) -> list[str]:
        """The tokens in id order (list[str]; do not modify)."""
        return self._py.vocab

    # ---- graph API (tf.Tensor in, tf.Tensor out; usable in tf.function / tf.data / export)

    def normalize(self, texts: tf.Tensor) -> tf.Tensor:
        """Reference normalization of UTF-8 strings.

        Args:
          texts: tf.string Tensor of shape [B].

        Returns:
          tf.string Tensor [B]: cleaned, accent-stripped/lowercased per the settings, with
          spaces around punctuation other than ASCII (and around everything that splits
          words when tokenize_chinese_chars=False). Splitting it like FastWordpiece does
          (see `split_words`) gives the reference words.
        """
        return self._normalizer.normalize(texts)

    def __call__(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Tokenizes UTF-8 strings to wordpiece ids, without special tokens.

        Args:
          texts: tf.string Tensor of shape [B].

        Returns:
          tf.RaggedTensor of int32 ids, shape [B, None].
        """
        return self._tokenize(texts, with_offsets=False)

    def tokenize_with_offsets(self, texts: tf.Tensor):
        """Tokenizes like `__call__` and says where in each text every piece came from.

        Args:
          texts: tf.string Tensor of shape [B].

        Returns:
          (ids, starts, ends): int32 ids and int64 byte offsets into `texts`, RaggedTensors
          [B, (T)] of the same shape. texts[b][starts[b, t]:ends[b, t]] is the text piece t
          was made of, as transformers' offset_mapping gives it (characters lowercased,
          stripped of accents or decomposed, as a Hangul syllable into jamo, are there
          whole; the pieces of one character share it; a word replaced by one [UNK] spans
          the word), and, as Google's run_squad maps answers back, with the combining
          marks after it that accent stripping dropped ("Re\u0301" is one piece "re").
          Where the reference reorders marks (see the module docstring), its offsets point
          at the dropped mark and ours at the character the piece is made of.
        """
        return self._tokenize(texts, with_offsets=True)

    def _tokenize(self, texts, with_offsets: bool):
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        if texts.shape.rank != 1:
            raise ValueError(f"BertTokenizer expects a tf.string Tensor of shape [batch_size], "
                             f"got shape {texts.shape}")
        if with_offsets:  # offsets[b, k]: the byte of texts[b] that normalized byte k came from
            normalized, offsets = self._normalizer.normalize_with_offsets(texts)  # [B], [B, (N+1)]
        else:
            normalized, offsets = self._normalizer.normalize(texts), None
        if self._presplit:
            pieces = self._presplit_pieces(normalized, with_offsets)
        else:
            pieces = (self._wordpiece.tokenize_with_offsets(normalized) if with_offsets
                      else (self._wordpiece.tokenize(normalized),))  # [B, (T)] each
            # Words longer than 100 characters are rare: look for a run of more than 100
            # non-space characters (a necessary condition; RE2 counts UTF-8 characters)
            # before paying for the exact per-word count.
            maybe_long = tf.reduce_any(tf.strings.regex_full_match(normalized, _LONG_RUN_PATTERN))
            pieces = tf.cond(maybe_long, lambda: self._unk_long_words(*pieces), lambda: pieces)
        if not with_offsets:
            return pieces[0]
        ids, starts, ends = pieces
        return (ids, *_source_offsets(texts, offsets, ids.value_rowids(), starts.flat_values,
                                      ends.flat_values, ids, self.strip_accents))

    def _presplit_pieces(self, normalized: tf.Tensor, with_offsets: bool):
        """Pieces of normalized text whose every split point is a space (tokenize_chinese_chars
        False): (ids,) or (ids, starts, ends) with byte offsets into `normalized`, [B, (T)]."""
        words = tf.strings.split(normalized, sep=" ")  # [B, (W)], "" between two spaces
        sizes = tf.cast(tf.strings.length(words.flat_values), tf.int64)  # [W] bytes
        # Byte offset of each word in its text: the sizes (and spaces) before it in its row.
        ahead = tf.cumsum(sizes + 1, exclusive=True)  # [W]
        word_starts = ahead - tf.gather(tf.gather(ahead, words.row_starts()), words.value_rowids())
        nonempty = sizes > 0
        words = tf.ragged.boolean_mask(words, words.with_flat_values(nonempty))  # [B, (W')]
        flat = words.flat_values
        word_starts, sizes = tf.boolean_mask(word_starts, nonempty), tf.boolean_mask(sizes, nonempty)
        ids, starts, ends = self._wordpiece.tokenize_with_offsets(flat)  # [W', (P)] each
        word = ids.value_rowids()  # [T]
        first = tf.equal(tf.range(tf.size(ids.values, out_type=tf.int64)),
                         tf.gather(ids.row_splits, word))  # [T]
        too_long = tf.strings.length(flat, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD  # [W']
        shift = tf.gather(word_starts, word)
        pieces = _collapse_to_unk(ids, tf.gather(too_long, word), first, self.unk_id,
                                  (starts.flat_values + shift, ends.flat_values + shift)
                                  if with_offsets else None)
        return tuple(words.with_flat_values(p).merge_dims(1, 2) for p in pieces)  # [B, (T)]

    def _unk_long_words(self, ids: tf.RaggedTensor, *offsets: tf.RaggedTensor):
        """Replaces every word of more than 100 characters by one [UNK].

        FastWordpiece limits words by bytes (we give it 400 = 100 characters of 4 bytes), the
        reference by characters. A word's pieces partition its characters, so its length is
        the sum of its pieces' lengths (per-id table).

        Args:
          ids: int32 RaggedTensor [B, (T)] of wordpiece ids; a word is a first piece followed
            by "##" pieces.
          *offsets: optionally the pieces' start and end offsets, ragged like `ids`.

        Returns:
          (ids,) or (ids, starts, ends), RaggedTensors [B, (T')].
        """
        flat = ids.flat_values  # [T]
        starts = tf.gather(self._piece_starts_word, flat)  # [T] 1 at the first piece of a word
        word = tf.cumsum(starts) - 1  # [T] word index of each piece (every row starts a word)
        word_chars = tf.math.unsorted_segment_sum(
            tf.gather(self._piece_chars, flat), word, tf.reduce_sum(starts))  # [W]
        piece_in_long_word = tf.gather(word_chars > MAX_CHARS_PER_WORD, word)  # [T]
        return _collapse_to_unk(ids, piece_in_long_word, starts > 0, self.unk_id,
                                tuple(o.flat_values for o in offsets) or None)

    def detokenize_tensor(self, ids: tf.RaggedTensor) -> tf.Tensor:
        """Joins wordpiece ids back into text (core ops only).

        Args:
          ids: int32/int64 RaggedTensor [B, (T)].

        Returns:
          tf.string Tensor [B]: words separated by one space, "##" pieces glued on.
        """
        tokens = tf.gather(self._vocab_tensor, ids)
        joined = tf.strings.reduce_join(tokens, axis=-1, separator=" ")
        return tf.strings.regex_replace(joined, " ##", "")

    # ---- Python API (lists in, lists out; runs the same graph)

    def _run(self, fn, texts: Sequence[bytes]) -> list[list[int]]:
        out: list[list[int]] = []
        for i in range(0, len(texts), _BATCH):
            ids = fn(tf.constant(texts[i:i + _BATCH], dtype=tf.string))
            values = ids.flat_values.numpy().tolist()  # faster than RaggedTensor.to_list()
            splits = ids.row_splits.numpy().tolist()
            out.extend(values[a:b] for a, b in zip(splits[:-1], splits[1:]))
        return out

    def encode(self, texts: Iterable[str | bytes]) -> list[list[int]]:
        """Tokenizes texts to ids (no [CLS]/[SEP] added).

        Args:
          texts: list of str (or UTF-8 bytes; ill-formed bytes are dropped, see module doc).

        Returns:
          list[list[int]], one id list per text.
        """
        return self._run(self._py.encode, _as_list(texts))

    def tokenize(self, texts: Iterable[str | bytes]) -> list[list[str]]:
        """Tokenizes texts to wordpieces ("##" marks a piece continuing a word).

        Args:
          texts: list of str (or UTF-8 bytes).

        Returns:
          list[list[str]], one wordpiece list per text.
        """
        return [self.convert_ids_to_tokens(ids) for ids in self.encode(texts)]

    def tokenize_with_char_offsets(self, texts: Iterable[str]) -> list[list[tuple[str, int, int]]]:
        """Tokenizes texts to wordpieces and says which characters each came from.

        Args:
          texts: list of str.

        Returns:
          One list per text of (piece, start, end): text[start:end] are the characters the
          piece was made of, `tokenize_with_offsets`' byte offsets as character indices (the
          pieces of one character share it; an [UNK] spans its whole word).
        """
        texts = list(texts)
        out: list[list[tuple[str, int, int]]] = []
        vocab = self._py.vocab
        for i in range(0, len(texts), _BATCH):
            chunk = texts[i:i + _BATCH]
            encoded = _as_list(chunk)
            ids, starts, ends = self._py.offsets(tf.constant(encoded, dtype=tf.string))
            splits = ids.row_splits.numpy().tolist()
            ids, starts, ends = (t.flat_values.numpy().tolist() for t in (ids, starts, ends))
            for text, raw, a, b in zip(chunk, encoded, splits[:-1], splits[1:]):
                # char_of[k]: the character byte k of the UTF-8 text belongs to (k = len: the end).
                lengths = [len(c.encode("utf-8", errors="surrogatepass")) for c in text]
                char_of = np.append(np.repeat(np.arange(len(text)), lengths), len(text)).tolist()
                if len(char_of) != len(raw) + 1:
                    raise TypeError("tokenize_with_char_offsets takes str texts, not bytes")
                out.append([(vocab[ids[k]], char_of[starts[k]], char_of[ends[k]])
                            for k in range(a, b)])
        return out

    def split_words(self, texts: Iterable[str | bytes]) -> list[list[str]]:
        """Normalizes texts and splits them into the words WordPiece sees (no vocab used).

        Args:
          texts: list of str (or UTF-8 bytes).

        Returns:
          list[list[str]]: the reference BasicTokenizer output for each text.
        """
        return split_words_with(self._py.normalize, self._presplit, _as_list(texts))

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Maps tokens to ids; tokens not in the vocabulary map to [UNK]'s id."""
        token_to_id = self._py.token_to_id
        return [token_to_id.get(t, self.unk_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Maps ids to tokens.

        Raises:
          IndexError: an id is outside [0, vocab_size).
        """
        vocab = self._py.vocab
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise IndexError(f"token id {i} is outside the vocabulary of {self.vocab_size} "
                                 f"tokens ({self.vocab_file})")
            out.append(vocab[i])
        return out

    def detokenize(self, ids: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        """Joins id lists back into text.

        Args:
          ids: list of id lists (e.g. from `encode`).
          skip_special_tokens: drop [PAD] [CLS] [SEP] [MASK] (not [UNK]).

        Returns:
          list[str]: words separated by one space, "##" pieces glued to the previous piece.
          For text whose words are all in the vocabulary this is the normalized text with
          single spaces between words (punctuation becomes separate words).
        """
        skip = {self.pad_id, self.cls_id, self.sep_id, self.mask_id} if skip_special_tokens else set()
        out = []
        for row in ids:
            words: list[str] = []
            for tok in self.convert_ids_to_tokens(i for i in row if int(i) not in skip):
                if tok.startswith(SUFFIX_INDICATOR) and tok != SUFFIX_INDICATOR and words:
                    words[-1] += tok[len(SUFFIX_INDICATOR):]
                else:
                    words.append(tok)
            out.append(" ".join(words))
        return out


def _collapse_to_unk(ids: tf.RaggedTensor, in_long_word: tf.Tensor, word_start: tf.Tensor,
                     unk_id: int, offsets=None):
    """Keeps one [UNK] per flagged word and drops the word's other pieces.

    Args:
      ids: int32 RaggedTensor [R, (T)].
      in_long_word: bool [T], the piece belongs to a word to replace.
      word_start: bool [T], the piece is the first piece of its word.
      unk_id: id of [UNK].
      offsets: None, or the pieces' (starts, ends) [T] each; an [UNK] spans its word.

    Returns:
      (ids,) or (ids, starts, ends): RaggedTensors [R, (T')].
    """
    keep = tf.logical_or(word_start, tf.logical_not(in_long_word))  # [T]
    values = [tf.where(in_long_word, tf.constant(unk_id, tf.int32), ids.flat_values)]
    if offsets is not None:
        starts, ends = offsets
        word = tf.cumsum(tf.cast(word_start, tf.int64)) - 1  # [T]
        word_end = tf.math.unsorted_segment_max(ends, word, tf.reduce_sum(
            tf.cast(word_start, tf.int64)))  # [W]
        values += [starts, tf.where(in_long_word, tf.gather(word_end, word), ends)]
    lengths = tf.math.unsorted_segment_sum(
        tf.cast(keep, ids.row_splits.dtype), ids.value_rowids(), ids.nrows())  # [R]
    return tuple(tf.RaggedTensor.from_row_lengths(tf.boolean_mask(v, keep), lengths,
                                                  validate=False) for v in values)


@functools.lru_cache(maxsize=None)
def _combining_mark_bounds() -> np.ndarray:
    """The code points of category M (combining marks) as sorted bounds [lo, hi + 1, ...]:
    a code point is a mark where searchsorted(bounds, cp, side="right") is odd."""
    marks = np.array([unicodedata.category(chr(cp)).startswith("M")
                      for cp in range(sys.maxunicode + 1)], dtype=np.int8)
    return np.flatnonzero(np.diff(np.concatenate([[0], marks, [0]]))).astype(np.int32)


# Byte offsets of a batch's texts as one sorted int64 key each, `row * ROW + offset` (a text
# is under 4 GiB): a sorted search for a key then stays in its row.
ROW = 1 << 32


def decode(texts: tf.Tensor):
    """(code points, their byte offsets), RaggedTensors [B, (C)] each: `texts` decoded as
    `bytes.decode("utf-8", "replace")` decodes (one character per ill-formed sequence, as
    the tokenizer reads them)."""
    return tf.strings.unicode_decode_with_offsets(texts, "UTF-8", errors="replace")


def character_stops(texts: tf.Tensor, skip_marks: bool = False, decoded=None) -> tf.Tensor:
    """Where the characters of a batch of texts start, and where each text ends.

    Args:
      texts: string [B], read as `decode` reads them.
      skip_marks: leave out the characters of category M (combining marks), so that the
        next stop after a character is past the marks that belong to it.
      decoded: `decode(texts)`, where the caller has it already.

    Returns:
      int64 [C + B], sorted: `row * ROW + byte offset` of each character start, then of
      the text's end, row by row.
    """
    codes, starts = decoded if decoded is not None else decode(texts)
    keys = codes.with_flat_values(codes.value_rowids() * ROW + starts.flat_values)  # [B, (C)]
    if skip_marks:
        bounds = tf.constant(_combining_mark_bounds())
        marks = tf.searchsorted(bounds, codes.flat_values, side="right") % 2 == 1
        keys = tf.ragged.boolean_mask(keys, codes.with_flat_values(tf.logical_not(marks)))
    ends = tf.range(codes.nrows()) * ROW + tf.cast(tf.strings.length(texts), tf.int64)
    # Each row's keys, then its end: stitched by position, as `tf.concat([keys, ends[:, None]],
    # axis=1)` orders them without that ragged concat's asserts (run on every request).
    at = [tf.range(tf.size(keys.flat_values, out_type=tf.int64)) + keys.value_rowids(),
          keys.row_splits[1:] + tf.range(keys.nrows())]
    return tf.dynamic_stitch([tf.cast(i, tf.int32) for i in at], [keys.flat_values, ends])


def next_stop(stops: tf.Tensor, keys: tf.Tensor, inclusive: bool) -> tf.Tensor:
    """The first of the sorted `stops` at (`inclusive`) or after each of `keys`, as keys."""
    side = "left" if inclusive else "right"
    return tf.gather(stops, tf.searchsorted(stops, keys, side=side, out_type=tf.int64))


def _source_offsets(texts: tf.Tensor, offsets: tf.RaggedTensor, rows: tf.Tensor,
                    starts: tf.Tensor, ends: tf.Tensor, like: tf.RaggedTensor,
                    skip_marks: bool):
    """Maps pieces' byte offsets in normalized text back to the text normalized.

    Args:
      texts: string [B], what was normalized.
      offsets: int64 RaggedTensor [B, (N+1)], FastBertNormalizer's map: the source byte of
        each normalized byte, then the source's length; non-decreasing along a row.
      rows: int64 [T], each piece's row; starts, ends: int64 [T], its normalized bytes.
      like: the RaggedTensor [B, (T)] whose row partition the results take.
      skip_marks: whether normalization strips accents (drops combining marks).

    Returns:
      (starts, ends) int64 RaggedTensors [B, (T)] into `texts`: from the source of a
      piece's first byte to the end of its last byte's source character and of the
      combining marks after it that normalization dropped (stripped accents); the next
      source character with output of its own ends it in any case.
    """
    flat = offsets.flat_values  # [N_all]
    base = tf.gather(offsets.row_starts(), rows)  # [T] where each piece's row begins
    source_start = tf.gather(flat, base + starts)
    keys = offsets.value_rowids() * ROW + flat  # [N_all] sorted: each row ends at its length
    last = tf.gather(keys, base + ends - 1)  # [T] the last byte's source
    next_output = next_stop(keys, last, inclusive=False)
    next_char = next_stop(character_stops(texts, skip_marks), last, inclusive=False)
    source_end = tf.minimum(next_output, next_char) - rows * ROW
    return like.with_flat_values(source_start), like.with_flat_values(source_end)


def split_words_with(normalize_fn, presplit: bool, texts: Sequence[bytes]) -> list[list[str]]:
    """Runs an in-graph normalizer and splits its output into words in Python."""
    out: list[list[str]] = []
    for i in range(0, len(texts), _BATCH):
        normalized = normalize_fn(tf.constant(texts[i:i + _BATCH], dtype=tf.string)).numpy()
        for t in normalized:
            s = t.decode("utf-8")
            if not presplit:
                s = _SPLIT_RE.sub(r" \1 ", s)
            out.append(s.split())
    return out


class BertPreTokenizer:
    """The vocabulary-free half of BertTokenizer: normalization and word splitting.

    Used by build_vocab, which needs the words before a vocabulary exists.
    """

    def __init__(self, do_lower_case: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True):
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = self.do_lower_case if strip_accents is None else bool(strip_accents)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self._presplit = not self.tokenize_chinese_chars
        model = normalizer_model(self.do_lower_case, self.strip_accents,
                                 self.tokenize_chinese_chars, self._presplit)
        normalizer = tf_text.FastBertNormalizer(model_buffer=model)
        self._normalize_fn = tf.function(
            normalizer.normalize, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)

    def split_words(self, texts: Iterable[str | bytes]) -> list[list[str]]:
        """Returns the reference words of each text (list[list[str]])."""
        return split_words_with(self._normalize_fn, self._presplit, _as_list(texts))


@functools.lru_cache(maxsize=None)
def pretokenizer(do_lower_case: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True) -> BertPreTokenizer:
    """A shared BertPreTokenizer per setting (building one compiles its normalizer)."""
    return BertPreTokenizer(do_lower_case, strip_accents, tokenize_chinese_chars)


def load_tokenizer(vocab_file: str | os.PathLike, config: TokenizerConfig | None = None
                   ) -> BertTokenizer:
    """A BertTokenizer for `vocab_file`, shared per (file, modification time, settings).

    Building one takes about a second (the WordPiece model is compiled from the vocabulary),
    so tools that tokenize several files reuse it.

    Args:
      vocab_file: path of a vocab.txt.
      config: the settings; default: those saved beside the vocabulary
        (`tokenizer_config.read_for_vocab`), else BERT's uncased defaults. Tools resolve
        saved settings and flags with `tokenizer_config.resolve` and pass the result.
    """
    from data_prep import tokenizer_config

    path = files.absolute(os.fspath(vocab_file))
    if config is None:
        config = tokenizer_config.resolve(path)[0]
    try:
        mtime = (tf.io.gfile.stat(path).mtime_nsec if files.is_remote(path)
                 else os.stat(path).st_mtime_ns)
    except (OSError, tf.errors.OpError):
        mtime = None  # load_vocab raises the error that names the file
    return _cached_tokenizer(path, mtime, config)


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(path: str, mtime, config: TokenizerConfig) -> BertTokenizer:
    del mtime  # part of the cache key only
    return BertTokenizer.from_config(path, config)


def normalize_char(ch: str, config: TokenizerConfig) -> str:
    """The reference normalization of one character, without whitespace.

    What the tokenizer makes of `ch` before WordPiece (cleaning, accent stripping and
    lowercasing as `config` says), with the spaces it puts around punctuation and CJK
    ideographs removed: "" for dropped characters and whitespace, possibly several
    characters (e.g. "ǆ" -> "dž"). SQuAD's answer alignment uses it, so that answers are
    mapped back with exactly the tokenizer's text changes.
    """
    mapped = _map_char(ch, config.do_lower_case, config.effective_strip_accents,
                       config.tokenize_chinese_chars, True)
    return "".join(mapped.split())
