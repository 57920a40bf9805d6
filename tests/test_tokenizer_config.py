"""Tokenizer settings files: Hugging Face's keys, saved beside the vocabulary, overrides."""

import json

import pytest

from data_prep import tokenizer_config
from data_prep.tokenizer_config import TokenizerConfig, TokenizerConfigError

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "한국", "##어", "cafe", "café"]


@pytest.fixture
def vocab(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    return str(path)


def test_round_trip_and_transformers_reads_it(vocab):
    korean = TokenizerConfig(do_lower_case=True, strip_accents=False)
    tokenizer_config.write_for_vocab(vocab, korean)
    config, source = tokenizer_config.read_for_vocab(vocab)
    assert config == korean and source.endswith("tokenizer_config.json")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(vocab).rsplit("/", 1)[0])
    assert hf.tokenize("한국어 Café") == ["한국", "##어", "café"]  # accents kept, lowercased


def test_absent_keys_take_hugging_face_defaults():
    assert TokenizerConfig.from_json_dict({}) == TokenizerConfig(True, None, True)
    assert TokenizerConfig(True, None).effective_strip_accents is True
    assert TokenizerConfig(False, None).effective_strip_accents is False


@pytest.mark.parametrize("values, message", [
    ({"do_lower_case": "yes"}, "do_lower_case must be true or false"),
    ({"strip_accents": 1}, "strip_accents must be true, false or null"),
    ({"unk_token": "<unk>"}, "unk_token is '<unk>'"),
])
def test_bad_settings_name_the_file(values, message):
    with pytest.raises(TokenizerConfigError, match=message) as e:
        TokenizerConfig.from_json_dict(values, "dir/tokenizer_config.json")
    assert "dir/tokenizer_config.json" in str(e.value)


def test_settings_of_another_vocabulary_are_ignored(vocab, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    tokenizer_config.write_for_vocab(str(other), TokenizerConfig(False))
    assert tokenizer_config.read_for_vocab(vocab) is None
    assert tokenizer_config.read_for_vocab(str(other))[0] == TokenizerConfig(False)


def test_a_renamed_vocabulary_keeps_its_settings(tmp_path):
    """build_vocab --output=ko.txt, then ko.txt renamed vocab.txt (the name transformers
    reads): the settings naming ko.txt, which is gone, are this vocabulary's. Before, they
    were ignored and the Korean vocabulary was read uncased with accents stripped."""
    ko = tmp_path / "ko.txt"
    ko.write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    korean = TokenizerConfig(do_lower_case=True, strip_accents=False)
    tokenizer_config.write_for_vocab(str(ko), korean)
    ko.rename(tmp_path / "vocab.txt")
    assert tokenizer_config.read_for_vocab(str(tmp_path / "vocab.txt"))[0] == korean


def test_overrides_change_settings_and_say_so_in_one_line():
    saved = TokenizerConfig(True, False)
    lines = []
    same = saved.with_overrides({"do_lower_case": True}, "enc/tokenizer_config.json", lines.append)
    assert same == saved and lines == []  # no change, nothing to report
    changed = saved.with_overrides({"strip_accents": None}, "enc/tokenizer_config.json",
                                   lines.append)
    assert changed.effective_strip_accents is True
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "--strip_accents=auto overrides" in lines[0] and "enc/tokenizer_config.json" in lines[0]
    # Defaults (nothing saved) are overridden silently.
    TokenizerConfig().with_overrides({"do_lower_case": False}, None, lines.append)
    assert len(lines) == 1


def test_resolve_prefers_saved_then_flags(vocab):
    assert tokenizer_config.resolve(vocab) == (TokenizerConfig(), None)
    tokenizer_config.write_for_vocab(vocab, TokenizerConfig(True, False))
    config, source = tokenizer_config.resolve(vocab, {"tokenize_chinese_chars": False})
    assert config == TokenizerConfig(True, False, False) and source is not None
    assert json.load(open(source))["strip_accents"] is False


def test_parse_strip_accents():
    assert [tokenizer_config.parse_strip_accents(v) for v in ("auto", "true", "false", None)] == \
        [None, True, False, None]
    with pytest.raises(TokenizerConfigError, match="auto, true or false"):
        tokenizer_config.parse_strip_accents("maybe")


def _said(vocab_file, overrides=None, saved=None) -> list[str]:
    said = []
    tokenizer_config.resolve(str(vocab_file), overrides or {}, saved, warn=said.append)
    return said


def test_a_vocabulary_made_with_other_settings_is_named_where_defaults_apply(tmp_path):
    """A vocabulary copied without its tokenizer_config.json is read with BERT's uncased
    defaults (Google's vocabularies rely on that). A cased or Korean one then loses every
    capitalised piece and every Hangul syllable to [UNK]: the tools say so, with the flag
    that fits, where the settings came from defaults and flags."""
    import tokenizer_refs as refs

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    google = tmp_path / "google" / "vocab.txt"
    google.parent.mkdir()
    google.write_bytes(open(refs.bert_base_uncased_vocab(), "rb").read())
    assert _said(google) == []  # Google's uncased vocabulary: every piece reachable
    lines = specials + [f"w{i}" for i in range(200)]
    cased, korean = tmp_path / "cased" / "vocab.txt", tmp_path / "ko" / "vocab.txt"
    for path, extra in [(cased, [f"Seoul{i}" for i in range(20)] + ["##Town"]),
                        (korean, [f"서울{i}" for i in range(20)] + ["##은", "café"])]:
        path.parent.mkdir()
        path.write_text("\n".join(lines + extra) + "\n", encoding="utf-8")
    [line] = _said(cased)
    assert line.startswith(f"{cased}: no tokenizer_config.json beside it, and 21 of its 226 "
                           "pieces (such as Seoul0, Seoul1, Seoul2, Seoul3) never come out of "
                           "the tokenizer with do_lower_case=True, strip_accents=True")
    assert "Pass --do_lower_case=false (a cased vocabulary), or save" in line
    [line] = _said(korean)
    assert "22 of its 227 pieces" in line and "Pass --strip_accents=false" in line
    assert _said(cased, {"do_lower_case": False}) == []
    assert _said(korean, {"strip_accents": False}) == []
    # Settings saved beside the vocabulary, or given with the model, are not second-guessed.
    assert _said(cased, saved=(TokenizerConfig(), "model/tokenizer_config.json")) == []
    tokenizer_config.write_for_vocab(str(korean), TokenizerConfig(do_lower_case=False))
    assert _said(korean) == []
    # Below the share that flags a vocabulary (a few stray pieces), nothing is said.
    few = tmp_path / "few" / "vocab.txt"
    few.parent.mkdir()
    few.write_text("\n".join(specials + [f"w{i}" for i in range(2000)] + ["Big"] * 1) + "\n")
    assert _said(few) == []
