"""Tests for data_prep.build_vocab: exact size, layouts, coverage, determinism, safety."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from absl import app, flags
from absl.testing import flagsaver

from data_prep import build_vocab as bv
from data_prep import tokenization
from data_prep.tokenization import BertTokenizer
import tokenizer_refs as refs

ROOT = Path(__file__).resolve().parents[1]
# The tokenizer fixture less its NUL bytes (the tokenizer tests keep them): build_vocab
# refuses a NUL as binary, as prepare_corpus and create_pretraining_data do, and the
# tokenizer drops it as a control character, so the words are the same.
MIXED = refs.without_nul(refs.MIXED_FILE)


@pytest.fixture(scope="module")
def google_vocab() -> list[str]:
    return bv.build_vocab([MIXED], 2600, layout="google", min_frequency=1)


def test_google_layout_exact_size_and_ids(google_vocab):
    v = google_vocab
    assert len(v) == 2600 and len(set(v)) == 2600
    assert v[0] == "[PAD]" and v[1] == "[unused0]" and v[99] == "[unused98]"
    assert v[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert v[104] == "[unused99]" and v[998] == "[unused993]" and not v[999].startswith("[unused")
    assert sum(t.startswith("[unused") for t in v) == bv.GOOGLE_NUM_UNUSED


def test_compact_layout_and_unused_tokens(tmp_path):
    v = bv.build_vocab([MIXED], 1234, layout="compact", num_unused=3, min_frequency=1)
    assert len(v) == 1234
    assert v[:8] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]", "[unused2]"]
    path = tmp_path / "v.txt"
    bv.write_vocab(v, str(path))
    tok = BertTokenizer(str(path))
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)


@pytest.mark.parametrize("lower,strip", [(True, None), (False, None), (True, False)])
def test_retokenizing_the_corpus_gives_unk_only_for_long_words(tmp_path, lower, strip):
    lines = refs.read_lines(refs.MIXED_FILE) + refs.read_lines(refs.KOREAN_FILE)
    v = bv.build_vocab([MIXED, str(refs.KOREAN_FILE)], 2200, layout="compact",
                       do_lower_case=lower, strip_accents=strip, min_frequency=1)
    path = tmp_path / "v.txt"
    bv.write_vocab(v, str(path))
    tok = BertTokenizer(str(path), do_lower_case=lower, strip_accents=strip)
    long_words = 0
    for words, pieces in zip(tok.split_words(lines), tok.tokenize(lines)):
        n_long = sum(len(w) > tokenization.MAX_CHARS_PER_WORD for w in words)
        assert pieces.count("[UNK]") == n_long, (words, pieces)
        long_words += n_long
    assert long_words >= 10  # the fixture has over-long words, so the check is not vacuous


def test_same_input_same_output_across_processes(tmp_path, google_vocab):
    out = tmp_path / "cli.txt"
    cmd = [sys.executable, "-m", "data_prep.build_vocab", f"--input={MIXED}", f"--output={out}",
           "--vocab_size=2600", "--layout=google", "--min_frequency=1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "counting words in 1 file(s)" in proc.stderr and "wrote 2600 tokens" in proc.stderr
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == google_vocab
    assert bv.build_vocab([MIXED], 2600, layout="google", min_frequency=1) == google_vocab
    # No temporary files left; the tokenizer settings sit beside the vocabulary.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.txt", "tokenizer_config.json"]
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert settings["do_lower_case"] is True and settings["strip_accents"] is None
    assert settings["bert_keras"]["vocab_file"] == "cli.txt"


def test_main_refuses_to_overwrite_before_any_work(tmp_path):
    out = tmp_path / "vocab.txt"
    out.write_text("keep\n")
    with flagsaver.flagsaver():
        flags.FLAGS([
            "build_vocab", f"--input={MIXED}", f"--output={out}", "--vocab_size=2600"])
        with pytest.raises(app.UsageError, match="already exists; pass --overwrite"):
            bv.main(["build_vocab"])
        flags.FLAGS(["build_vocab", f"--input={tmp_path}/none*.txt", f"--output={tmp_path}/v2.txt",
                     "--vocab_size=2600"])
        with pytest.raises(app.UsageError, match="matches no file"):
            bv.main(["build_vocab"])
    assert out.read_text() == "keep\n"


def test_a_vocabulary_not_named_vocab_txt_is_warned_about(tmp_path):
    """transformers' AutoTokenizer finds only vocab.txt: on a directory holding ko.txt it
    builds a tokenizer of the 5 special tokens, every word [UNK], without an error."""
    for name, warned in (("ko.txt", True), ("vocab.txt", False)):
        with flagsaver.flagsaver(), mock.patch.object(bv.logging, "warning") as warning:
            flags.FLAGS(["build_vocab", f"--input={MIXED}",
                         f"--output={tmp_path / name.split('.')[0] / name}",
                         "--vocab_size=2600", "--min_frequency=1"])
            bv.main(["build_vocab"])
        messages = [c.args[0] % c.args[1:] for c in warning.call_args_list]
        assert any(m.startswith("transformers' AutoTokenizer reads a directory's vocab.txt, "
                                "not ko.txt: rename it") for m in messages) is warned, messages


def test_write_vocab_refuses_to_overwrite(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("keep me\n")
    with pytest.raises(bv.BuildVocabError, match="already exists; pass --overwrite"):
        bv.write_vocab(["[PAD]"], str(path))
    assert path.read_text() == "keep me\n"
    bv.write_vocab(["[PAD]", "x"], str(path), overwrite=True)
    assert path.read_text() == "[PAD]\nx\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer_config.json", "vocab.txt"]
    # Another vocabulary in the same directory would take over its tokenizer settings.
    with pytest.raises(bv.BuildVocabError, match="tokenizer settings of another vocabulary"):
        bv.write_vocab(["[PAD]"], str(tmp_path / "other.txt"))
    assert not (tmp_path / "other.txt").exists()


def test_an_interrupted_write_never_pairs_a_vocabulary_with_other_settings(tmp_path,
                                                                          monkeypatch):
    """Ctrl-C between vocab.txt and tokenizer_config.json left a vocabulary without its
    settings (a cased one then read as uncased, without a word) and a rerun refused; with
    --overwrite, the new vocabulary beside the old settings. The vocabulary now comes last,
    the one it replaces removed first."""
    from data_prep import tokenizer_config
    from data_prep.tokenizer_config import TokenizerConfig

    path = tmp_path / "vocab.txt"
    real = tokenizer_config.write_for_vocab

    def interrupted(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    bv.write_vocab(["[PAD]", "Cased"], str(path), config=TokenizerConfig(do_lower_case=False))
    monkeypatch.setattr(tokenizer_config, "write_for_vocab", interrupted)
    with pytest.raises(KeyboardInterrupt):  # overwriting the cased one with an uncased one
        bv.write_vocab(["[PAD]", "x"], str(path), overwrite=True, config=TokenizerConfig())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer_config.json"]
    monkeypatch.setattr(tokenizer_config, "write_for_vocab", real)
    bv.write_vocab(["[PAD]", "x"], str(path))  # the rerun: not refused over the leftover
    assert path.read_text() == "[PAD]\nx\n"
    assert tokenizer_config.read_for_vocab(str(path))[0] == TokenizerConfig()


def test_outputs_respect_the_umask(tmp_path):
    """A vocabulary written by one account must be readable by the serving account."""
    old = os.umask(0o022)
    try:
        bv.write_vocab(["[PAD]", "x"], str(tmp_path / "vocab.txt"))
    finally:
        os.umask(old)
    for name in ("vocab.txt", "tokenizer_config.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name


@pytest.mark.parametrize("kwargs,match", [
    (dict(vocab_size=100000), r"--vocab_size=100000 is too large for the corpus: .* use "
                              r"--vocab_size=\d+ or less, about [\d.]+ MB of such text"),
    (dict(vocab_size=300, layout="compact"), "more than the .* tokens that fit"),
    (dict(vocab_size=900), "leaves no room after the 999 reserved tokens"),
    (dict(vocab_size=2000, num_unused=50), "needs --num_unused >= 99"),
    (dict(vocab_size=2000, layout="sentencepiece"), "--layout must be one of"),
])
def test_clear_errors(kwargs, match):
    with pytest.raises(bv.BuildVocabError, match=match):
        bv.build_vocab([MIXED], **kwargs)


def test_too_large_a_vocabulary_names_the_size_that_fits(tmp_path):
    """The largest --vocab_size the error names is one the corpus gives."""
    with pytest.raises(bv.CorpusTooSmallError) as info:
        bv.build_vocab([MIXED], 100000)
    fits = int(str(info.value).split("use --vocab_size=")[1].split()[0])
    assert len(bv.build_vocab([MIXED], fits)) == fits
    # Corpus size needed, Heaps' law with exponent 0.4: (requested / available) ** 2.5.
    assert bv.corpus_bytes_needed(1_000_000, 1000, 2000) == int(1e6 * 2 ** 2.5)
    # The sizes are named with two significant digits: no small corpus reads "0 MB".
    assert [bv.megabytes(n) for n in (0, 12_345, 3_449_999, 9_960_000, 150_400_000)] == [
        "0 MB", "0.012 MB", "3.4 MB", "10 MB", "150 MB"]
    assert " 0 MB" not in str(info.value)


def _repeated_words_corpus(path, copies=1):
    """11 words in 700 lines of 6 (`copies` times over): a few words repeated, so the
    trainer learns every one of them whole."""
    words = ["whale", "sea", "ship", "captain", "deep", "water", "harpoon", "sail", "wind",
             "storm", "night"]
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(6)) + "\n"
             for i in range(700)]
    path.write_text("".join(lines) * copies, encoding="utf-8")
    return str(path)


def test_a_corpus_of_few_words_asks_for_more_distinct_words_not_more_text(tmp_path):
    """The probe's 0.028 MB corpus of 13 words was told "about 0.029 MB of such text" would
    give a vocabulary one token larger: once every distinct word is one token, neither more of the
    same text nor a lower --min_frequency gives any. Each claim of the message is checked."""
    path = _repeated_words_corpus(tmp_path / "few.txt")
    with pytest.raises(bv.CorpusTooSmallError) as info:
        bv.build_vocab([path], 400, layout="compact")
    message, available = str(info.value), info.value.available
    assert info.value.unmerged == 0 and info.value.words == 11
    fits = available + 5  # the compact layout's reserved tokens
    assert message == (
        f"--vocab_size=400 is too large for the corpus: its {bv.megabytes(os.path.getsize(path))} "
        f"give {available} WordPiece tokens besides the 5 reserved ones, not 395, and each of "
        "its 11 distinct words is already one of them: more of the same words, or a lower "
        f"--min_frequency, gives no more; use --vocab_size={fits} or less, or text with more "
        "distinct words (natural text gives about one token per distinct word)")
    assert "such text" not in message and "\n" not in message
    tokens = bv.build_vocab([path], fits, layout="compact")
    assert len(tokens) == fits and {"whale", "harpoon", "captain"} <= set(tokens)
    tripled = _repeated_words_corpus(tmp_path / "tripled.txt", copies=3)
    for paths, min_frequency in (([path], 1), ([tripled], 2)):
        with pytest.raises(bv.CorpusTooSmallError) as same:
            bv.build_vocab(paths, fits + 1, layout="compact", min_frequency=min_frequency)
        assert same.value.available == available, (paths, min_frequency)
    # New words do give more tokens.
    more = tmp_path / "more.txt"
    more.write_text(open(path).read() + "".join(f"ocean{c} sailor{c} mast{c}\n"
                                                  for c in "bcdfghjkmn") * 2)
    assert len(bv.build_vocab([str(more)], fits + 1, layout="compact")) == fits + 1


def test_a_corpus_one_token_short_is_told_a_little_more_text_or_a_lower_min_frequency():
    """Words not yet whole: more such text or a lower --min_frequency helps (checked), and a
    size the corpus misses by one token is not told "about 0.0014 MB of such text" for its
    0.0014 MB."""
    with pytest.raises(bv.CorpusTooSmallError) as info:
        bv.build_vocab([MIXED], 100000, layout="compact")
    fits = info.value.available + 5
    assert info.value.unmerged > 0
    with pytest.raises(bv.CorpusTooSmallError) as info:
        bv.build_vocab([MIXED], fits + 1, layout="compact")
    message = str(info.value)
    assert f"use --vocab_size={fits} or less, a little more such text for {fits + 1}, or a " \
           "lower --min_frequency (now 2)" in message, message
    assert len(bv.build_vocab([MIXED], fits + 1, layout="compact", min_frequency=1)) == fits + 1


def test_a_max_alphabet_that_leaves_no_word_is_named(tmp_path):
    """--max_alphabet=2 keeps none of the 11 words (each has a third letter): the error said
    "use --vocab_size=5 or less", a size that leaves no room after the reserved tokens."""
    path = _repeated_words_corpus(tmp_path / "few.txt")
    with pytest.raises(bv.BuildVocabError, match=r"^--max_alphabet=2 leaves no word to learn "
                       r"from: .* raise --max_alphabet \(0 keeps every character\)$"):
        bv.build_vocab([path], 300, layout="compact", max_alphabet=2, keep_ascii=False)
    # 10 characters keep some words: the message names what --max_alphabet left.
    with pytest.raises(bv.CorpusTooSmallError, match=r"each of the \d+ of its 11 distinct "
                       r"words that --max_alphabet=10 keeps .* a higher --max_alphabet, or "):
        bv.build_vocab([path], 300, layout="compact", max_alphabet=10, keep_ascii=False)


def test_a_vocabulary_smaller_than_the_trainers_alphabet_keeps_its_exact_size():
    """The trainer also makes every character that only continues words a word-initial
    token, and returns that whole alphabet when it exceeds the size asked for (Korean
    syllables in a small vocabulary: 315 tokens for 301 before). The most frequent of those
    characters fill the room left after the characters and "##" pieces a word needs."""
    import collections

    counts = collections.Counter({"abc": 5, "abd": 3, "abe": 1})
    with mock.patch.object(bv.logging, "warning") as warning:
        tokens = bv.train_wordpiece(counts, 8, min_frequency=1)
    assert warning.call_args.args[0] % warning.call_args.args[1:] == (
        "the corpus has 4 characters that begin no word; 2 of them fit as word-initial tokens "
        "(the most frequent); raise --vocab_size by 2 to keep them all")
    # b: 9 times, c: 5, d: 3
    assert tokens == ["a", "##a", "##b", "##c", "##d", "##e", "b", "c"]
    assert bv.train_wordpiece(counts, 10, min_frequency=1)[6:] == ["b", "c", "d", "e"]


def test_every_character_of_a_word_is_also_a_continuation_piece(tmp_path):
    """A character the corpus has only at word starts still continues words in new text:
    "##한" exists though every "한" of the corpus begins a word, so "국한" is not [UNK]
    (with the trainer's own alphabet it was, whole). Characters only ever alone
    (punctuation, which the tokenizer always splits off) get no "##" piece."""
    import collections

    counts = collections.Counter({"한국": 4, "한글": 3, "국어": 2, "어": 1, ",": 5, "!": 1})
    tokens = bv.train_wordpiece(counts, 13, min_frequency=1)
    assert sorted(t for t in tokens if t.startswith("##")) == ["##국", "##글", "##어", "##한"]
    assert "##," not in tokens and "," in tokens
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in bv.reserved_tokens("compact") + tokens),
                    encoding="utf-8")
    tok = BertTokenizer(str(path), do_lower_case=False, strip_accents=False)
    assert tok.tokenize(["국한 어한, 한국!"])[0] == ["국", "##한", "어", "##한", ",", "한국", "!"]


def test_max_alphabet_limits_characters(tmp_path):
    v = bv.build_vocab([MIXED], 700, layout="compact", max_alphabet=60, keep_ascii=False)
    singles = [t for t in v[5:] if len(t) == 1]
    assert 0 < len(singles) <= 60
    # The printable ASCII characters are kept beyond the 60 (lowercased: 94 - 26 = 68).
    kept = bv.build_vocab([MIXED], 700, layout="compact", max_alphabet=60)
    assert set(bv.ascii_alphabet(True)) <= {t for t in kept[5:] if len(t) == 1}
    assert len(bv.ascii_alphabet(True)) == 68
    assert 68 <= len([t for t in kept[5:] if len(t) == 1]) <= 60 + 68


# Text a Korean corpus's vocabulary meets later: KLUE-RE's entity markers, markup, code,
# English words and numbers.
LATER_TEXT = "<e1>ab</e1> @ ^ # * ~ {x|y} `q` \\z [qzv]? xylophone 2026-12-05 $3.50 & 100%"


def _korean_without_ascii_letters(tmp_path):
    """The Korean fixture's lines without ASCII letters, digits or markup characters."""
    korean = tmp_path / "ko.txt"
    korean.write_text("".join(line + "\n" for line in refs.read_lines(refs.KOREAN_FILE)
                              if not any(ord(c) < 128 and c.isalnum() or c in "<^~{|}`$&"
                                         for c in line)),
                      encoding="utf-8")
    return korean


@pytest.mark.parametrize("lower", [True, False])
def test_every_printable_ascii_character_is_kept_whatever_the_corpus(tmp_path, lower):
    """A vocabulary learned from Korean text alone: before, every ASCII character the corpus
    lacked ("<", "^", "q", ...) made each word holding it [UNK] in later text. Now every
    printable ASCII character is a word-initial token (lowercased with do_lower_case), letters
    and digits also "##" pieces; punctuation, always split off, is not. --noascii_alphabet
    keeps only the corpus's characters (the former behaviour)."""
    korean = _korean_without_ascii_letters(tmp_path)
    settings = dict(layout="compact", do_lower_case=lower, strip_accents=False,
                    min_frequency=1)
    v = bv.build_vocab([str(korean)], 500, **settings)
    assert len(v) == 500 and len(set(v)) == 500
    printable = [chr(c) for c in range(0x21, 0x7F)]
    expected = {c.lower() if lower else c for c in printable}
    assert expected <= set(v)
    assert ("A" in v) is (not lower)
    continuing = {t[2:] for t in v if t.startswith("##") and len(t) == 3}
    assert {c for c in expected if c.isalnum()} <= continuing
    assert not {c for c in expected if not c.isalnum()} & continuing

    def unknowns(vocab):
        path = tmp_path / "vocab.txt"
        bv.write_vocab(vocab, str(path), overwrite=True)
        tok = BertTokenizer(str(path), do_lower_case=lower, strip_accents=False)
        return tok.tokenize([LATER_TEXT])[0].count("[UNK]")

    assert unknowns(v) == 0
    assert unknowns(bv.build_vocab([str(korean)], 500, keep_ascii=False, **settings)) > 5


def test_the_ascii_alphabet_flag(tmp_path):
    """--noascii_alphabet reaches the learner: the vocabulary lacks what the corpus lacks."""
    corpus = _korean_without_ascii_letters(tmp_path)
    got = {}
    for flag in ("--ascii_alphabet", "--noascii_alphabet"):
        with flagsaver.flagsaver():
            out = tmp_path / flag.strip("-") / "vocab.txt"
            flags.FLAGS(["build_vocab", f"--input={corpus}", f"--output={out}",
                         "--vocab_size=500", "--layout=compact", "--min_frequency=1", flag])
            bv.main(["build_vocab"])
        got[flag] = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert "z" in got["--ascii_alphabet"] and "<" in got["--ascii_alphabet"]
    assert "z" not in got["--noascii_alphabet"] and "<" not in got["--noascii_alphabet"]


@pytest.mark.parametrize("made", [True, False])
def test_an_output_naming_a_directory_is_refused_before_training(tmp_path, made):
    """--output=vc/ with vc/ missing wrote the vocabulary as a file named vc (and its
    settings beside it naming vocab_file ""); with vc/ there it failed after training."""
    out = tmp_path / "vc"
    if made:
        out.mkdir()
    with flagsaver.flagsaver():
        flags.FLAGS(["build_vocab", f"--input={MIXED}", f"--output={out}/", "--vocab_size=200"])
        with pytest.raises(app.UsageError, match=rf"^--output {re.escape(str(out))}/ is a "
                                                 r"directory; name the vocabulary file \(e.g. "):
            bv.main(["prog"])
    assert os.listdir(tmp_path) == (["vc"] if made else [])
    assert not made or os.listdir(out) == []


def test_inputs(tmp_path):
    with pytest.raises(bv.BuildVocabError, match="matches no file"):
        bv.resolve_inputs([str(tmp_path / "*.txt")])
    with pytest.raises(bv.BuildVocabError, match="is a directory"):
        bv.resolve_inputs([str(tmp_path)])
    (tmp_path / "b.txt").write_text("b")
    (tmp_path / "a.txt").write_text("a")
    assert bv.resolve_inputs([str(tmp_path / "*.txt"), str(tmp_path / "a.txt")]) == [
        str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]


@pytest.mark.parametrize("ends", [b"\n", b"\r", b"\r\n"])
def test_a_corpus_from_a_pipe_reads_as_the_same_file(tmp_path, ends):
    """--input=<(zcat corpus.gz): the line-end sniff drained the pipe, and its lines came
    back empty without an error ("no words in it"). Now the lines of the same bytes in a
    file, "\r" kept or dropped as there; a bad byte names the pipe."""
    from conftest import piped
    from data_prep.files import TextFileError

    data = ends.join(["\ufeffthe cat sat".encode(), b"on a\rmat", "der Kä".encode(), b""])
    regular = tmp_path / "corpus.txt"
    regular.write_bytes(data)
    expected = list(bv.iter_lines([str(regular)]))
    # Lines end at "\n" as create_pretraining_data reads them; a lone-"\r" file keeps its "\r"s.
    assert expected == (["the cat sat\ron a\rmat\rder Kä\r"] if ends == b"\r" else
                        ["the cat sat\n", "on amat\n", "der Kä\n"])
    with piped(data) as path:
        assert bv.resolve_inputs([path]) == [path]
        assert list(bv.iter_lines([path])) == expected
    with piped(b"ok\nthe th\xe9\n") as path:
        with pytest.raises(TextFileError, match=rf"^{path}:2: not UTF-8"):
            list(bv.iter_lines([path]))


def test_invalid_utf8_in_the_corpus_is_refused(tmp_path):
    """As prepare_corpus and create_pretraining_data refuse it: a latin-1 'thé' would lose
    its 'é' (or random bytes become a vocabulary of garbage). The file, line and byte offset
    of the first bad byte are named."""
    from data_prep.files import TextFileError

    path = tmp_path / "bad.txt"
    path.write_bytes("caf\u00e9 au lait\n".encode() + b"the th\xe9\n")
    with pytest.raises(TextFileError, match=r"bad.txt:2: not UTF-8 \(byte b'\\xe9' at byte "
                       r"offset 20\)"):
        list(bv.iter_lines([str(path)]))
    path.write_bytes(bytes(range(1, 256)))  # binary: fails at its first byte >= 0x80
    with pytest.raises(TextFileError, match=r"bad.txt:2: not UTF-8 \(byte b'\\x80' at byte "
                       r"offset 127\)"):
        list(bv.iter_lines([str(path)]))
    # A NUL was dropped ("정말\x00좋네요" learnt as one word) where prepare_corpus and
    # create_pretraining_data refuse the same file as binary.
    path.write_bytes("좋은 날\n정말\x00좋네요\n".encode())
    with pytest.raises(TextFileError, match=r"bad.txt:2: NUL byte at byte offset 17"):
        list(bv.iter_lines([str(path)]))


def test_corpus_lines_are_read_as_create_pretraining_data_reads_them(tmp_path):
    """Google's reader (tf.io.gfile, create_pretraining_data's) ends lines at "\\n" and
    drops every "\\r": "cat\\rdog" is the word "catdog" in the pretraining data, so the
    vocabulary is learned from that word, not from "cat" and "dog" (the tokenizer reads a
    "\\r" as a space). A file whose lines all end in a lone "\\r" keeps them as spaces
    between words (Google's reader would read it as one word-joined line)."""
    import tensorflow as tf

    path = tmp_path / "corpus.txt"
    path.write_bytes(b"the cat\rdog sat\r\n\r\nlay\r\r\non mats\n")
    with tf.io.gfile.GFile(str(path)) as f:
        google = [line.strip() for line in f]
    assert [line.strip() for line in bv.iter_lines([str(path)])] == google
    pretokenizer = tokenization.BertPreTokenizer(do_lower_case=True)
    counts = bv.count_words(bv.iter_lines([str(path)]), pretokenizer)
    assert counts == {"the": 1, "catdog": 1, "sat": 1, "lay": 1, "on": 1, "mats": 1}
    path.write_bytes(b"the cat\rdog sat\r")
    counts = bv.count_words(bv.iter_lines([str(path)]), pretokenizer)
    assert counts == {"the": 1, "cat": 1, "dog": 1, "sat": 1}


def test_word_table_stays_bounded():
    lines = refs.read_lines(refs.MIXED_FILE) * 3
    full = bv.count_words(lines, tokenization.pretokenizer())
    sizes = []
    small = bv.count_words(lines, tokenization.pretokenizer(), max_unique_words=200,
                           batch_size=16, progress=lambda n, c, w: sizes.append(w))
    assert len(full) > 600 and max(sizes) <= 200
    for word, count in full.most_common(5):  # words frequent throughout keep exact counts
        assert small[word] == count
    assert all(len(w) <= 100 for w in full)


def test_reserved_tokens():
    assert bv.reserved_tokens("compact") == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    g = bv.reserved_tokens("google", 100)
    assert g[100] == "[UNK]" and g[-1] == "[unused99]" and len(g) == 105


def test_progress_from_a_pipe_gives_no_size_it_does_not_know(tmp_path, caplog):
    """A pipe's size is 0 to os.path.getsize: the progress said "files: 0.0 MB" and a corpus
    too small for --vocab_size "its 0 MB". Now the files' size and the pipes are counted
    apart, and the corpus's size in the refusal is the bytes read from the pipe."""
    import logging

    from conftest import piped

    words = " ".join(f"w{i % 37}x{i % 11}" for i in range(400))
    data = f"{words}\n".encode() * 4
    regular = tmp_path / "a.txt"
    regular.write_bytes(data)
    caplog.set_level(logging.INFO, logger="absl")  # whatever verbosity a test left absl at
    with piped(data) as path:
        with pytest.raises(bv.CorpusTooSmallError) as raised:
            bv.build_vocab([str(regular), path], vocab_size=5000, layout="compact",
                           log_every_s=0)
    said = [r.getMessage() for r in caplog.records]
    assert f"counting words in 2 file(s), {len(data) / 1e6:.1f} MB and 1 pipe of unknown size" \
        in said
    progress = [m for m in said if m.startswith("read ")]
    assert progress and all("(files: 0.0 MB and 1 pipe of unknown size)" in m for m in progress)
    # Both inputs' bytes: the file's size and what was read of the pipe.
    assert f"its {bv.megabytes(2 * len(data))} " in str(raised.value)
