"""KLUE-NER: its character format read, sentences made WordPiece units, predictions put back
on characters, KLUE's scores, and run_tagger end to end (`data_prep.klue_ner`).

The fixture (tests/testdata/glue/klue_benchmark/klue-ner-v1.1/) is hand-written in the layout
of KLUE v1.1's klue-ner-v1.1_{train,dev}.tsv: each sentence written with KLUE's inline tags
("<서울시:OG>는 ..."), its header that line and its character lines the tags the markup
gives (B- on an entity's first character, I- on the rest, O elsewhere); one sentence keeps
angle brackets of its own ("영화 <세라핀> ... ><"), as NSMC's reviews do. The scores are
checked against KLUE's baseline definitions run on seqeval (strict IOB2, macro) and
scikit-learn (character macro F1, zero_division=True).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys

import pytest
from seqeval.metrics import f1_score as seqeval_f1
from seqeval.scheme import IOB2
from sklearn.metrics import f1_score as sklearn_f1

from bert_keras import run_tagger
from bert_keras.encoder import BertEncoder
from bert_keras.finetuning.runner import FinetuneError
from conftest import TESTDATA, run_module_on_backend
from data_prep import klue_ner
from data_prep.classification import DataError
from data_prep.tokenization import BertTokenizer

KLUE = os.path.join(TESTDATA, "glue", "klue_benchmark")
NER = os.path.join(KLUE, klue_ner.DIRECTORY)
TRAIN = os.path.join(NER, klue_ner.FILES["train"])
DEV = os.path.join(NER, klue_ner.FILES["dev"])
INLINE = re.compile(r"<([^<>]*?):([A-Z]{2})>")
LABELS = list(klue_ner.KLUE_NER_LABELS)


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def _vocab(tmp_path, pieces):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    return _write(tmp_path / "vocab.txt", "\n".join(specials + pieces) + "\n")


# --- reading ----------------------------------------------------------------------------

# The five lines KLUE's klue-ner-v1.1_{train,dev}.tsv begin with (the dev file's sha256
# 0f4d5e81...0a54), right before the first sentence's "## <guid>" line.
KLUE_COMMENTS = ("## 토큰, 레이블 구분자 : \\t", "## 토큰 구분자 : \\n", "## 문장 구분자 : \\n\\n",
                 "## 주석 : ##", "## 컬럼명 : CHAR\tNE_TAG")


def _klue_baseline_reading(path):
    """(guid, text, tags) per sentence as KLUE's baseline reads the file
    (klue_baseline/data/klue_ner.py, KlueNERProcessor._create_examples): blocks between
    blank lines, every "##" line skipped, the guid from the last."""
    raw = open(path, encoding="utf-8").read().strip()
    out = []
    for block in re.split(r"\n\t?\n", raw):
        guid, chars, tags = None, [], []
        for line in block.split("\n"):
            if line[:2] == "##":
                guid = line.split("\t")[0].replace("##", "").strip()
                continue
            char, tag = line.split("\t")
            chars.append(char)
            tags.append(tag)
        out.append((guid, "".join(chars), tuple(tags)))
    return out


def test_reads_the_fixture_as_klue_lays_it_out():
    """The fixture begins as KLUE's files do, with five "##" comment lines right before the
    first sentence's header: read as comments (the first was refused as a sentence without
    characters, so --task_name=klue-ner could not read KLUE's own files), and every
    sentence as KLUE's baseline reads it."""
    train, dev = klue_ner.read_klue_ner(TRAIN), klue_ner.read_klue_ner(DEV)
    assert (len(train), len(dev)) == (12, 5)
    for path, sentences in ((TRAIN, train), (DEV, dev)):
        assert open(path, encoding="utf-8").read().splitlines()[:5] == list(KLUE_COMMENTS)
        assert [(s.guid, s.text, s.tags) for s in sentences] == _klue_baseline_reading(path)
        assert sentences[0].comments == KLUE_COMMENTS
        assert all(not s.comments for s in sentences[1:])
    assert train[0].guid == "klue-ner-v1_train_00000_wikitree"
    assert train[0].where == f"{TRAIN}:6" and train[0].char_line(3) == f"{TRAIN}:10"
    headers = [line.split("\t", 1)[1] for line in open(TRAIN, encoding="utf-8").read()
               .splitlines()[5:] if line.startswith("## ")]
    for sentence, header in zip(train, headers, strict=True):
        # The characters are the header's text without its markup ...
        assert sentence.text == INLINE.sub(r"\1", header)
        # ... and their tags its entities, the one with brackets of its own included.
        assert [(sentence.text[a:b + 1], kind) for kind, a, b in
                klue_ner.strict_entities(sentence.tags)] == INLINE.findall(header)
    assert "<세라핀>" in train[5].text and not klue_ner.strict_entities(train[5].tags)
    assert train[2].tags[train[2].text.index("2018년 3월") + 5] == "I-DT"  # the space
    assert klue_ner.read_klue_ner(DEV, has_tags=False)[0].tags is None


@pytest.mark.parametrize("lines, line, message", [
    (["## g1\tab", "ab\tO", ""], 2, "expected one character, a tab and its tag"),
    (["## g1\tab", "a O", ""], 2, "expected one character, a tab and its tag"),
    (["## g1\tab", "a\t", ""], 2, "expected one character, a tab and its tag"),
    (["## g1\ta b", "a\tO", " \t", "b\tO", ""], 3, "expected one character, a tab and its tag"),
    (["a\tO", ""], 1, "a character line outside a sentence"),
    (["## g1\ta", "a\tO", "", "b\tO"], 4, "a character line outside a sentence"),
    (["## g1\tab", "", "## g2\ta", "a\tO"], 1, "sentence 'g1' has no character lines"),
    (["## note", "## g1\tab", ""], 2, "sentence 'g1' has no character lines"),
    (["## \tab", "a\tO"], 1, "got no guid"),
])
def test_a_malformed_line_is_refused_naming_file_and_line(tmp_path, lines, line, message):
    path = _write(tmp_path / "bad.tsv", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{path}:{line}: ") + ".*" + re.escape(message)):
        klue_ner.read_klue_ner(path)


def test_a_header_ends_an_open_sentence_and_crlf_lines_read(tmp_path):
    path = tmp_path / "crlf.tsv"
    path.write_bytes("## g1\t<가:PS>\r\n가\tB-PS\r\n## g2\t나 \r\n나\tO\r\n \tO\r\n".encode())
    g1, g2 = klue_ner.read_klue_ner(str(path))
    assert (g1.guid, g1.text, g1.tags) == ("g1", "가", ("B-PS",))
    assert (g2.text, g2.tags, g2.where) == ("나 ", ("O", "O"), f"{path}:3")
    # A separator line holding a tab alone is blank too.
    path = _write(tmp_path / "tab.tsv", "## g1\t가\n가\tB-PS\n\t\n## g2\t나\n나\tO\n")
    assert [s.text for s in klue_ner.read_klue_ner(path)] == ["가", "나"]


@pytest.mark.parametrize("ends", ["\n", "\r\n", "\r"])
def test_a_stray_carriage_return_keeps_the_sentence_and_the_line_numbers(tmp_path, ends):
    """LF, CRLF or lone-CR line ends read alike. A stray "\\r" before a line's end
    ("가\\tB-PS\\r\\r\\n", a line edited on another system) ends no sentence: universal
    newlines read it as a blank line, so the next character line was refused as outside a
    sentence, its line number one too high; a later error names its own line."""
    stray = {"\n": "\r\r", "\r\n": "\r", "\r": ""}[ends]
    path = tmp_path / "ner.tsv"
    lines = ["## g1\t<가나:PS>", "가\tB-PS" + stray, "나\tI-PS", "", "## g2\t다 ",
             "다\tO" + stray, " \tO", ""]
    path.write_bytes(ends.join(lines).encode())
    g1, g2 = klue_ner.read_klue_ner(str(path))
    assert (g1.text, g1.tags, g1.where) == ("가나", ("B-PS", "I-PS"), f"{path}:1")
    assert (g2.text, g2.tags, g2.where) == ("다 ", ("O", "O"), f"{path}:5")
    path.write_bytes(ends.join(lines[:-1] + ["라 B-PS", ""]).encode())
    with pytest.raises(DataError, match=re.escape(f"{path}:8: expected one character, a tab")):
        klue_ner.read_klue_ner(str(path))


# --- units ------------------------------------------------------------------------------

def test_units_are_the_pieces_of_the_whole_text_tagged_by_their_first_character(tmp_path):
    """Hand-computed: "특히 문막휴게소에서 특히서울" with the vocabulary below is
    특히 | 문막 ##휴게소 ##에서 | 특히서 ##울; "서울" (LC) begins inside "특히서"."""
    tokenizer = BertTokenizer(_vocab(tmp_path, ["특히", "문막", "##휴게소", "##에서", "특히서",
                                                "##울", "i", "##\u0307"]), strip_accents=False)
    text = "특히 문막휴게소에서 특히서울 İ"
    tags = (["O", "O", "O", "B-LC"] + ["I-LC"] * 4 + ["O"] * 3 + ["O", "O", "B-LC", "I-LC"]
            + ["O", "B-PS"])
    sentence = klue_ner.CharSentence("f:1", "g", text, tuple(tags))
    units, spans, stats = klue_ner.to_units([sentence], tokenizer, LABELS)
    assert spans == [[(0, 2), (3, 5), (5, 8), (8, 10), (11, 14), (14, 15), (16, 17)]]
    assert units[0].words == ("특히", "문막", "휴게소", "에서", "특히서", "울", "İ")
    assert units[0].tags == ("O", "B-LC", "I-LC", "O", "O", "I-LC", "B-PS")
    # "İ" lowercases to two pieces of one character: one unit, tagged on its first piece.
    assert units[0].pieces == (("특히",), ("문막",), ("##휴게소",), ("##에서",), ("특히서",),
                               ("##울",), ("i", "##\u0307"))
    assert (stats.units, stats.characters, stats.cut_entities, stats.unpieced) == (7, 17, 1, 0)
    # A no-break space is a scored character the tokenizer drops: counted as in no piece.
    spaced = klue_ner.CharSentence("f:2", "h", "특히\xa0문막", ("O",) * 5)
    assert klue_ner.to_units([spaced], tokenizer, LABELS)[2].unpieced == 1
    # Back on characters from the units' tags: "서울" begins where its piece begins.
    back = klue_ner.char_tags(text, spans[0], units[0].tags)
    assert back[11:15] == ["O", "O", "O", "I-LC"] and back[3:10] == tags[3:10]


def test_a_tag_outside_the_label_list_names_its_characters_line(tmp_path):
    tokenizer = BertTokenizer(_vocab(tmp_path, ["가"]), strip_accents=False)
    sentence = klue_ner.CharSentence("f.tsv:7", "g", "가가", ("O", "B-XX"))
    with pytest.raises(DataError, match=r"f.tsv:9: tag 'B-XX' \(character 2 of sentence g\)"):
        klue_ner.to_units([sentence], tokenizer, LABELS)


@pytest.mark.parametrize("spans, unit_tags, expected", [
    # A space inside "2018년 3월" (DT) continues it; one before a B- does not.
    ([(0, 4), (4, 5), (6, 7), (7, 8), (9, 10)], ["B-DT", "I-DT", "I-DT", "I-DT", "B-DT"],
     ["B-DT"] + ["I-DT"] * 7 + ["O", "B-DT"]),
    # A unit's later characters: I- of its type, O for O; a space after O stays O.
    ([(0, 3), (4, 6), (6, 8), (9, 10)], ["B-PS", "O", "I-PS", "O"],
     ["B-PS", "I-PS", "I-PS", "O", "O", "O", "I-PS", "I-PS", "O", "O"]),
])
def test_char_tags_hand_computed(spans, unit_tags, expected):
    assert klue_ner.char_tags("2018년 3월 9", spans, unit_tags) == expected


# --- scores -----------------------------------------------------------------------------

def test_strict_entities_hand_computed():
    tags = ["B-PS", "I-PS", "I-LC", "I-LC", "B-LC", "B-LC", "I-LC", "O", "I-PS", "B-DT"]
    assert klue_ner.strict_entities(tags) == [("PS", 0, 1), ("LC", 4, 4), ("LC", 5, 6),
                                              ("DT", 9, 9)]


def _klue_baseline(texts, gold, predicted):
    """KLUE's baseline scoring: seqeval strict IOB2 macro F1 and scikit-learn's character
    macro F1 over every label, on the characters other than " " (its reader skips the
    lines whose character is " "), sentences apart."""
    flat_gold, flat_pred, ids_gold, ids_pred = [], [], [], []
    for text, g, p in zip(texts, gold, predicted):
        keep = [k for k, ch in enumerate(text) if ch != " "]
        flat_gold += ["O"] + [g[k] for k in keep] + ["O"]  # as [CLS] and [SEP] part them
        flat_pred += ["O"] + [p[k] for k in keep] + ["O"]
        ids_gold += [LABELS.index(g[k]) for k in keep]
        ids_pred += [LABELS.index(p[k]) for k in keep]
    entity = seqeval_f1([flat_gold], [flat_pred], average="macro", mode="strict", scheme=IOB2)
    micro = seqeval_f1([flat_gold], [flat_pred], average="micro", mode="strict", scheme=IOB2)
    char = sklearn_f1(ids_gold, ids_pred, labels=list(range(len(LABELS))), average="macro",
                      zero_division=True)
    return entity, micro, char


def test_scores_are_klues_on_random_tags():
    rng = random.Random(0)
    for _ in range(100):
        texts, gold, predicted = [], [], []
        for _ in range(rng.randint(1, 5)):
            n = rng.randint(2, 25)
            texts.append("".join(rng.choice("가나 다A\u3000\xa0") for _ in range(n)) + "가")
            gold.append([rng.choice(LABELS[:4] + ["O", "O", "I-DT"]) for _ in range(n)]
                        + ["B-DT"])
            predicted.append([rng.choice(LABELS[:4] + ["O", "O", "I-LC"]) for _ in range(n)]
                             + ["B-LC"])
        ours = klue_ner.scores(texts, gold, predicted, LABELS)
        entity, micro, char = _klue_baseline(texts, gold, predicted)
        assert ours["entity_macro_f1"] == pytest.approx(entity, abs=1e-12)
        assert ours["entity"]["f1"] == pytest.approx(micro, abs=1e-12)
        assert ours["char_macro_f1"] == pytest.approx(char, abs=1e-12)


def test_predictions_text_reads_back_with_its_entities_inline(tmp_path):
    sentences = klue_ner.read_klue_ner(DEV)
    tags = [["O"] * len(s.text) for s in sentences]
    tags[0][:3] = ["B-PS", "I-PS", "I-PS"]
    written = klue_ner.predictions_text(sentences, tags)
    # KLUE's comment lines first, as in the file predicted on.
    assert tuple(written.splitlines()[:5]) == KLUE_COMMENTS
    assert written.splitlines()[5] == (f"## {sentences[0].guid}\t<이순신:PS> 장군 동상은 "
                                       "광화문에 있다.")
    again = klue_ner.read_klue_ner(_write(tmp_path / "p.tsv", written))
    assert [(s.guid, s.text, list(s.tags), s.comments) for s in again] == \
        [(s.guid, s.text, t, s.comments) for s, t in zip(sentences, tags)]


# --- run_tagger ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A vocabulary learned on the fixture's text (real WordPieces, "##" continuations, some
    pieces running past an entity's end) and a small random encoder of its size."""
    tmp = tmp_path_factory.mktemp("klue_ner")
    text = tmp / "text.txt"
    text.write_text("\n".join(s.text for path in (TRAIN, DEV)
                              for s in klue_ner.read_klue_ner(path)) + "\n", encoding="utf-8")
    vocab = tmp / "vocab" / "vocab.txt"
    subprocess.run([sys.executable, "-m", "data_prep.build_vocab", f"--input={text}",
                    f"--output={vocab}", "--vocab_size=520", "--layout=compact",
                    "--min_frequency=1", "--strip_accents=false"], check=True,
                   capture_output=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    size = sum(1 for _ in open(vocab, encoding="utf-8"))
    encoder = tmp / "encoder.keras"
    BertEncoder(vocab_size=size, num_layers=2, hidden_size=32, num_heads=2,
                intermediate_size=64, max_sequence_length=64).save(str(encoder))
    return {"vocab": str(vocab), "encoder": str(encoder)}


def _common(model, output_dir, **overrides):
    values = dict(vocab_file=model["vocab"], init_checkpoint=model["encoder"],
                  bert_config_file=None, output_dir=str(output_dir), do_train=True,
                  do_eval=True, do_predict=True, max_seq_length=32, train_batch_size=4,
                  eval_batch_size=8, learning_rate=3e-3, num_train_epochs=40.0, seed=1,
                  jit_compile=False)
    values.update(overrides)
    return values


@pytest.fixture(scope="module")
def klue_run(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("klue_run") / "ner"
    return out, run_tagger.run(task_name="KLUE-NER", data_dir=KLUE, **_common(model, out))


def test_run_tagger_trains_scores_and_predicts_klue_ner_by_task_name(klue_run):
    out, results = klue_run
    assert open(out / "labels.txt", encoding="utf-8").read().split() == LABELS
    assert sorted(os.listdir(out)) == sorted([
        "bert_config.json", "eval_results.json", "labels.txt", "logs", "model.keras",
        "predict_results.json", "predictions.tsv", "tokenizer_config.json",
        "train_results.json", "vocab.txt"])
    assert results["train"]["tag_format"] == "klue"
    assert results["train"]["num_characters"] == sum(
        len(s.text) for s in klue_ner.read_klue_ner(TRAIN))
    # The predictions file is KLUE's format over the dev set's own sentences ...
    dev = klue_ner.read_klue_ner(DEV)
    predicted = klue_ner.read_klue_ner(str(out / "predictions.tsv"))
    assert [(p.guid, p.text) for p in predicted] == [(s.guid, s.text) for s in dev]
    # ... and the scores are KLUE's baseline's on it.
    entity, micro, char = _klue_baseline([s.text for s in dev], [s.tags for s in dev],
                                         [p.tags for p in predicted])
    metrics = json.load(open(out / "eval_results.json"))
    assert metrics["entity_macro_f1"] == pytest.approx(entity, abs=1e-12)
    assert metrics["entity"]["f1"] == pytest.approx(micro, abs=1e-12)
    assert metrics["char_macro_f1"] == pytest.approx(char, abs=1e-12)
    assert metrics["num_scored_characters"] == sum(ch != " " for s in dev for ch in s.text)
    assert metrics["num_characters"] == sum(len(s.text) for s in dev)


def test_run_tagger_learns_a_klue_format_training_file(tmp_path, model):
    """The *_file route with --tag_format=klue: after training, the model tags its own
    training sentences far above chance (a model tagging everything "O" scores a character
    macro F1 of about 1/13), and an evaluation-only rerun without --tag_format reads the file
    as the model was fine-tuned and gets the same scores."""
    out = tmp_path / "own"
    results = run_tagger.run(tag_format="klue", train_file=TRAIN, eval_file=TRAIN,
                             **_common(model, out, do_predict=False))
    assert results["eval"]["char_macro_f1"] > 0.8
    assert results["eval"]["entity_macro_f1"] > 0.4
    assert results["eval"]["entities_cut_by_pieces"] >= 1  # "서울시는" as "서", "##울시는"
    # Evaluating alone, the model's format is taken from its train_results.json.
    again = run_tagger.run(eval_file=TRAIN, **_common(
        model, tmp_path / "again", init_checkpoint=str(out), do_train=False, do_predict=False,
        max_seq_length=None))
    assert again["eval"]["char_macro_f1"] == pytest.approx(results["eval"]["char_macro_f1"])


def test_a_type_only_one_character_long_gets_its_inside_tag(tmp_path, model):
    """A training file whose entities of a type are each one character derives a label list
    with B-X but no I-X; a prediction spanning two characters (a unit of two, a space
    inside it) then wrote an I-X outside the label list into predictions.tsv. The list now
    gets the I-X (the head has an output for it, as for any tag)."""
    train = tmp_path / "train.tsv"
    _write(train, "## t1\t<김:PS> 씨와 <박:PS>\n김\tB-PS\n \tO\n씨\tO\n와\tO\n \tO\n박\tB-PS\n\n"
                  "## t2\t<서울:LC>에서\n서\tB-LC\n울\tI-LC\n에\tO\n서\tO\n\n")
    out = tmp_path / "out"
    run_tagger.run(tag_format="klue", train_file=str(train), eval_file=str(train),
                   predict_file=str(train), **_common(model, out))
    labels = [line.strip() for line in open(out / "labels.txt", encoding="utf-8")]
    assert labels == ["B-LC", "B-PS", "I-LC", "I-PS", "O"]
    assert klue_ner.missing_inside_tags(["B-X", "I-Y", "O", "B-Y", "B-Z"]) == ["I-X", "I-Z"]
    assert klue_ner.missing_inside_tags(LABELS) == []


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # one fresh process on Keras' JAX backend: about 1.5 min
def test_the_klue_ner_runs_on_jax():
    """The character route trains, scores (as KLUE's baseline) and reruns on JAX too."""
    run_module_on_backend("jax", __file__, 2, "-k",
                          "trains_scores_and_predicts or learns_a_klue_format")


@pytest.mark.parametrize("flags, message", [
    (dict(task_name="klue-ner", data_dir=KLUE, train_file=TRAIN),
     "--task_name reads its files from --data_dir; drop --train_file"),
    (dict(task_name="klue-ner", data_dir=KLUE, token_column=1),
     "--task_name=klue-ner reads KLUE's format and tags; drop --token_column"),
    (dict(task_name="klue-ner", data_dir=KLUE, tag_format="conll"),
     "--task_name=klue-ner reads KLUE's format and tags; drop --tag_format"),
    (dict(task_name="klue-re", data_dir=KLUE), "unknown tagging task 'klue-re'"),
    (dict(task_name="klue-ner"), "--task_name=klue-ner needs --data_dir"),
    (dict(task_name="klue-ner", data_dir=TESTDATA), "no klue-ner-v1.1_train.tsv there"),
    (dict(tag_format="klue", train_file=TRAIN, tag_column=1),
     "--tag_format=klue has no columns to choose"),
    (dict(tag_format="klue", train_file=TRAIN, label_list_file="{tmp}/labels.txt"),
     "labels.txt: no I-DT, I-PS; character tags continue an entity of type X with I-X"),
])
def test_bad_klue_flags_are_refused_in_one_line(tmp_path, model, flags, message):
    _write(tmp_path / "labels.txt", "B-DT\nB-LC\nB-PS\nI-LC\nO\n")
    flags = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in flags.items()}
    with pytest.raises(FinetuneError, match=re.escape(message)):
        run_tagger.run(**_common(model, tmp_path / "out", do_eval=False, do_predict=False),
                       **flags)
    assert not os.path.exists(tmp_path / "out" / "model.keras")


def _entities(sentence, tags):
    return [(sentence.text[a:b + 1], kind, a, b + 1) for kind, a, b in
            klue_ner.strict_entities(tags)]


def _served(outputs, row):
    n = int(outputs["num_entities"][row])
    return [(outputs["entities"][row, j].numpy().decode(),
             outputs["entity_types"][row, j].numpy().decode(),
             int(outputs["entity_starts"][row, j]), int(outputs["entity_ends"][row, j]))
            for j in range(n)]


@pytest.mark.parametrize("seq_length, stride", [
    # The run's own settings (one window a sentence) also run through the CLI export below.
    pytest.param(32, 15, marks=pytest.mark.integration), (12, 3), (12, 0)])
def test_the_tagger_export_answers_as_run_tagger_predicts(klue_run, model, tmp_path,
                                                          seq_length, stride):
    """A character-tagged model's export (`TaggerModule.serve_characters`): on the dev
    sentences, its units are `to_units`' (the same characters), each unit's tag is the one
    run_tagger wrote on the unit's first character, and its entities are those of
    predictions.tsv, in windows (S = 12: every sentence split) and truncated (stride 0)."""
    import tempfile

    import tensorflow as tf

    from bert_keras.tasks import BertTagger
    from export import task_export
    from export.export_preprocessor import TextPacker
    from export.export_tagger import TaggerModule

    out, _ = klue_run
    predicted = tmp_path / "predicted"
    run_tagger.run(tag_format="klue", predict_file=DEV, **_common(
        model, predicted, init_checkpoint=str(out), do_train=False, do_eval=False,
        max_seq_length=seq_length, doc_stride=stride))
    written = klue_ner.read_klue_ner(str(predicted / "predictions.tsv"))
    tagger, labels, tokenizer = task_export.load_task_dir(str(out), BertTagger, "run_tagger", {})
    dev = klue_ner.read_klue_ner(DEV)
    _, spans, _ = klue_ner.to_units(dev, tokenizer, None)
    with tempfile.TemporaryDirectory() as assets:
        pre = TextPacker(tokenizer, seq_length, assets, None, pairs=False,
                                 length_flag="--max_seq_length")
        module = TaggerModule(pre, tagger, labels, doc_stride=stride)
        got = module.serve_characters(tf.constant([s.text for s in dev]))
    for row, (sentence, predicted_sentence) in enumerate(zip(dev, written)):
        n = int(got["num_units"][row])
        assert n == len(spans[row])
        assert list(zip(got["unit_starts"][row, :n].numpy(), got["unit_ends"][row, :n].numpy())) \
            == spans[row]
        tags = [t.decode() or "O" for t in got["tags"][row, :n].numpy()]  # "": truncated
        assert tags == [predicted_sentence.tags[a] for a, _ in spans[row]], row
        assert _served(got, row) == _entities(sentence, predicted_sentence.tags), row
    if stride == 0:
        assert any(t == b"" for t in got["tags"].numpy().ravel())


@pytest.mark.integration  # the export CLI, verify and the TF 2.12 process: ~1.5 min
def test_export_tagger_serves_a_klue_model_by_itself(klue_run, tmp_path):
    """export_tagger takes the character route from the run's train_results.json: one
    signature, text in, entities out as predictions.tsv has them; it verifies, and stock
    TF Serving's TensorFlow 2.12.1 + tensorflow-text 2.12.1 give the same units and
    entities."""
    import tensorflow as tf

    from export.verify import verify
    from test_length_buckets import in_tf212

    out, _ = klue_run
    proc = subprocess.run([sys.executable, "-m", "export.export_tagger", f"--model_dir={out}",
                           f"--export_dir={tmp_path / 'export'}"], capture_output=True,
                          text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = tf.saved_model.load(str(tmp_path / "export" / "1"))
    assert list(loaded.signatures) == ["serving_default"]
    dev = klue_ner.read_klue_ner(DEV)
    written = klue_ner.read_klue_ner(str(out / "predictions.tsv"))
    got = loaded.signatures["serving_default"](text=tf.constant([s.text for s in dev]))
    expected = [_entities(s, p.tags) for s, p in zip(dev, written)]
    assert [_served(got, row) for row in range(len(dev))] == expected
    assert sum(map(len, expected)) >= 5  # the comparison has entities to compare
    path = str(tmp_path / "export" / "1")
    assert verify(path).ok
    texts = [s.text for s in dev]
    for output in ("tag_ids", "entity_starts", "entity_ends"):
        stock = in_tf212(tmp_path, path, texts, output)
        assert stock["all"] == got[output].numpy().tolist(), output


def test_a_file_from_a_pipe_reads_as_the_same_file(tmp_path):
    """A KLUE-NER file given as <(...): the text check and the line-end sniff drained the
    pipe, and the reader returned no sentences without an error. Now the sentences of the
    same bytes in a file (lone-"\\r" line ends, where the sniff decides the split)."""
    from conftest import piped

    data = "\r".join(["## g-1\t<김:PS> 씨", "김\tB-PS", " \tO", "씨\tO", "",
                      "## g-2\t말", "말\tO", ""]).encode()
    regular = tmp_path / "ner.tsv"
    regular.write_bytes(data)
    expected = klue_ner.read_klue_ner(str(regular))
    assert [(s.guid, s.text, s.tags) for s in expected] == [
        ("g-1", "김 씨", ("B-PS", "O", "O")), ("g-2", "말", ("O",))]
    with piped(data) as path:
        got = klue_ner.read_klue_ner(path)
    assert [(s.where.replace(path, str(regular)), s.guid, s.text, s.tags) for s in got] == [
        (s.where, s.guid, s.text, s.tags) for s in expected]
