"""Tagging converters: CoNLL reading, first-sub-token labels, windows of long sentences
(max context) and truncation, merging windows back to words; entity F1."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import TESTDATA
from bert_keras.finetuning.tagging import entity_f1, get_entities, token_accuracy
from data_prep import tagging
from data_prep.classification import DataError
from data_prep.tagging import TaggedSentence
from data_prep.tokenization import BertTokenizer

VOCAB = os.path.join(TESTDATA, "ft_vocab.txt")
LABELS = ["B-PER", "I-PER", "O"]


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(VOCAB)


def ids_of(*tokens):
    vocab = [line.rstrip("\n") for line in open(VOCAB, encoding="utf-8")]
    return [vocab.index(t) for t in tokens]


def test_reading_conll_does_not_import_tensorflow():
    """data_prep.tagging (read_conll) loads without TensorFlow: the transformers side of
    bench/bench_finetune_vs_transformers.py reads its POS files with it, and its memory
    figures included TensorFlow's (338 MB of mapped pages) when data_prep.squad imported
    the tokenizer module at the top."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; from data_prep.tagging import read_conll; "
            "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("ends", ["\n", "\r\n", "\r"])
def test_conll_line_ends_and_a_stray_carriage_return_keep_the_sentences(tmp_path, ends):
    """LF, CRLF or lone-CR line ends, the last sentence without a blank line after it or a
    final line end, read alike. A stray "\\r" before a line's end ("B-ORG\\r\\r\\n", a line
    edited on another system) is whitespace in a line, as the columns' split reads it;
    universal newlines made it a blank line, splitting the sentence silently."""
    expected = [(("EU", "rejects"), ("B-ORG", "O")), (("Peter", "Blackburn"), ("B-PER", "I-PER"))]
    path = tmp_path / "train.conll"
    path.write_bytes(ends.join(["EU B-ORG", "rejects O", "", "Peter B-PER", "Blackburn I-PER"])
                     .encode())
    assert [(s.words, s.tags) for s in tagging.read_conll(str(path))] == expected
    if ends != "\r":
        path.write_bytes(ends.join(["EU B-ORG\r", "rejects O", "", "Peter\rB-PER",
                                    "Blackburn I-PER", ""]).encode())
        sentences = tagging.read_conll(str(path))
        assert [(s.words, s.tags) for s in sentences] == expected
        assert [s.where for s in sentences] == [f"{path}:1", f"{path}:4"]


def test_label_goes_on_the_first_sub_token_only(tokenizer):
    s = TaggedSentence("x:1", ("John", "Smith", "unwanted", "running", "."),
                       ("B-PER", "I-PER", "O", "O", "O"))
    features, positions, stats = tagging.convert_sentences([s], tokenizer, LABELS, 12)
    # [CLS] john smith un ##want ##ed runn ##ing . [SEP] [PAD] [PAD]
    np.testing.assert_array_equal(features["input_ids"][0], ids_of(
        "[CLS]", "john", "smith", "un", "##want", "##ed", "runn", "##ing", ".", "[SEP]", "[PAD]", "[PAD]"))
    np.testing.assert_array_equal(features["label_ids"][0], [-1, 0, 1, 2, -1, -1, 2, -1, 2, -1, -1, -1])
    np.testing.assert_array_equal(features["input_mask"][0], [1] * 10 + [0] * 2)
    assert positions == [[(0, 1), (0, 2), (0, 3), (0, 6), (0, 8)]]
    assert stats.truncated_sentences == 0 and stats.words == 5 and stats.windows == 1


def test_doc_stride_0_truncates_whole_tail_words_and_counts_them(tokenizer):
    s = TaggedSentence("x:1", ("John", "Smith", "unwanted", "running", "."),
                       ("B-PER", "I-PER", "O", "O", "O"))
    features, positions, stats = tagging.convert_sentences([s], tokenizer, LABELS, 6, doc_stride=0)
    # Room for 4 sub-tokens: john smith un ##want; "unwanted" keeps its first piece.
    np.testing.assert_array_equal(features["input_ids"],
                                  [ids_of("[CLS]", "john", "smith", "un", "##want", "[SEP]")])
    np.testing.assert_array_equal(features["label_ids"], [[-1, 0, 1, 2, -1, -1]])
    assert positions == [[(0, 1), (0, 2), (0, 3), (-1, -1), (-1, -1)]]
    assert (stats.truncated_sentences, stats.truncated_words, stats.windows) == (1, 2, 1)
    assert "1 sentences truncated to max_seq_length (2 words lost; doc_stride 0)" in stats.summary()
    predicted = np.array([[2, 0, 1, 2, 2, 2]])
    assert tagging.predictions_to_tags(predicted, positions, LABELS) == [["B-PER", "I-PER", "O", "O", "O"]]


# A sentence of 14 sub-tokens, windowed at max_seq_length 8 (6 sub-tokens a window), stride 3:
#   sub-tokens  john smith un ##want ##ed runn ##ing . john smith went to the store
#   index       0    1     2  3      4    5    6     7 8    9     10   11 12  13
# windows start at 0, 3, 6 and 9 (the last, 5 long, reaches the end): 1 + ceil((14 - 6) / 3).
LONG = TaggedSentence("x:1", ("John", "Smith", "unwanted", "running", ".", "John", "Smith",
                              "went", "to", "the", "store"),
                      ("B-PER", "I-PER", "O", "O", "O", "B-PER", "I-PER", "O", "O", "O", "O"))
# Each word's window and position there (hand-computed max context: min(left, right) +
# 0.01 * window length). "running" (5): window 0 gives min(5, 0), window 1 min(2, 3): 1.
# "." (7): windows 1 and 2 both give min(.., ..) = 1 and are 6 long: the first, 1. "went"
# (10): window 2 gives min(4, 1) + 0.06, window 3 (5 long) min(1, 3) + 0.05: window 2.
LONG_PLACES = [(0, 1), (0, 2), (0, 3), (1, 3), (1, 5), (2, 3), (2, 4), (2, 5), (3, 3), (3, 4),
               (3, 5)]


def test_a_long_sentence_is_split_into_windows_each_word_labelled_in_one(tokenizer):
    features, positions, stats = tagging.convert_sentences([LONG], tokenizer, LABELS, 8,
                                                           doc_stride=3)
    np.testing.assert_array_equal(features["input_ids"], [
        ids_of("[CLS]", "john", "smith", "un", "##want", "##ed", "runn", "[SEP]"),
        ids_of("[CLS]", "##want", "##ed", "runn", "##ing", ".", "john", "[SEP]"),
        ids_of("[CLS]", "##ing", ".", "john", "smith", "went", "to", "[SEP]"),
        ids_of("[CLS]", "smith", "went", "to", "the", "store", "[SEP]", "[PAD]")])
    np.testing.assert_array_equal(features["input_mask"][3], [1] * 7 + [0])
    # Each word's tag (B-PER 0, I-PER 1, O 2) in its max-context window only; -1 elsewhere
    # ("runn" is in window 0 too, "." and "john" in windows 1 and 2, ...).
    np.testing.assert_array_equal(features["label_ids"], [
        [-1, 0, 1, 2, -1, -1, -1, -1],
        [-1, -1, -1, 2, -1, 2, -1, -1],
        [-1, -1, -1, 0, 1, 2, -1, -1],
        [-1, -1, -1, 2, 2, 2, -1, -1]])
    assert positions == [LONG_PLACES]
    labelled = [(row, pos) for row, pos in zip(*np.nonzero(features["label_ids"] >= 0))]
    assert sorted(labelled) == LONG_PLACES  # every word once, where it is read back
    assert [features["label_ids"][row, pos] for row, pos in LONG_PLACES] == [
        LABELS.index(t) for t in LONG.tags]
    assert (stats.windows, stats.split_sentences, stats.split_windows) == (4, 1, 4)
    assert (stats.truncated_sentences, stats.truncated_words) == (0, 0)
    assert stats.summary() == (
        "1 sentences, 11 words in 4 windows; 1 sentences longer than max_seq_length split "
        "into 4 windows (doc_stride 3), no word lost; 0 words with no sub-token ([UNK] used)")


@pytest.mark.parametrize("max_seq_length, doc_stride", [(5, 1), (5, 3), (8, 2), (8, 6), (12, 5)])
def test_window_count_is_googles_formula(tokenizer, max_seq_length, doc_stride):
    """1 + ceil((T - room) / doc_stride) windows for T > room sub-tokens, else one; every
    word of every sentence tagged from exactly one window."""
    room = max_seq_length - 2
    sentences = [TaggedSentence(f"x:{n}", ("the",) * n, ("O",) * n) for n in range(1, 30)]
    features, positions, stats = tagging.convert_sentences(sentences, tokenizer, LABELS,
                                                           max_seq_length, doc_stride)
    counts = [1 + max(0, -(-(n - room) // doc_stride)) for n in range(1, 30)]
    assert stats.windows == len(features["input_ids"]) == sum(counts)
    assert stats.split_sentences == sum(c > 1 for c in counts)
    assert int((features["label_ids"] >= 0).sum()) == stats.words == sum(range(1, 30))
    rows = np.cumsum([0] + counts)
    for n, places in enumerate(positions):
        assert len(places) == n + 1 and len(set(places)) == n + 1
        assert all(rows[n] <= row < rows[n + 1] for row, _ in places)
        assert all(features["label_ids"][row, pos] == 2 for row, pos in places)


def test_max_context_windows_is_googles_rule():
    """The window each position is read from is the one `squad.is_max_context` (Google's
    _check_is_max_context) picks, for windows of every length and stride."""
    from data_prep.squad import doc_spans, is_max_context

    for num_tokens in range(0, 40):
        for room in (1, 2, 3, 6, 10):
            for stride in range(1, room + 1):
                spans = doc_spans(num_tokens, room, stride) or [(0, 0)]
                got = tagging.max_context_windows(spans, range(num_tokens))
                want = [next(i for i in range(len(spans)) if is_max_context(spans, i, p))
                        for p in range(num_tokens)]
                assert got == want, (num_tokens, room, stride)
    assert tagging.max_context_windows([(0, 4)], [3, 4, 9]) == [0, -1, -1]  # past the window


def test_window_predictions_merge_back_to_one_tag_per_word_from_its_window(tokenizer):
    """Fake logits whose argmax names the window and position they come from: each word
    gets exactly one tag, read in its max-context window, through the task's merging."""
    from bert_keras.finetuning.runner import Features
    from bert_keras.finetuning.tagging import TaggingTask

    short = TaggedSentence("x:20", ("John", "went"), ("B-PER", "O"))
    features, positions, stats = tagging.convert_sentences([short, LONG, short], tokenizer,
                                                           LABELS, 8, doc_stride=3)
    rows, width = features["input_ids"].shape
    assert rows == 6
    names = [f"w{row}p{pos}" for row in range(rows) for pos in range(width)]
    logits = np.zeros((rows, width, len(names)), np.float32)
    for row in range(rows):
        for pos in range(width):
            logits[row, pos, row * width + pos] = 1.0
    tags = TaggingTask()._tags(Features(features, positions, stats), {"logits": logits}, names)
    assert tags == [["w0p1", "w0p2"],
                    [f"w{row + 1}p{pos}" for row, pos in LONG_PLACES],
                    ["w5p1", "w5p2"]]


def test_a_sentence_that_fits_is_one_window_whatever_the_stride(tokenizer):
    """Windowing changes only sentences longer than max_seq_length - 2 sub-tokens."""
    s = TaggedSentence("x:1", ("John", "Smith", "unwanted", "running", "."),
                       ("B-PER", "I-PER", "O", "O", "O"))
    converted = [tagging.convert_sentences([s, LONG], tokenizer, LABELS, 16, stride)
                 for stride in (0, 1, 7, 14, None)]
    for features, positions, stats in converted[1:]:
        for name, array in converted[0][0].items():
            np.testing.assert_array_equal(features[name], array)
        assert positions == converted[0][1] and stats.windows == 2


def test_doc_stride_out_of_range_is_refused(tokenizer):
    for max_seq_length, doc_stride in ((8, 7), (8, -1), (2, 0)):
        with pytest.raises(ValueError, match=r"need max_seq_length >= 3 and 0 <= doc_stride"):
            tagging.convert_sentences([LONG], tokenizer, LABELS, max_seq_length, doc_stride)
    assert tagging.default_doc_stride(128) == 63 and tagging.default_doc_stride(3) == 1


def test_word_without_sub_tokens_becomes_unk(tokenizer):
    s = TaggedSentence("x:1", ("John", "\x01"), ("B-PER", "O"))
    features, positions, stats = tagging.convert_sentences([s], tokenizer, LABELS, 5)
    np.testing.assert_array_equal(features["input_ids"][0], ids_of("[CLS]", "john", "[UNK]", "[SEP]", "[PAD]"))
    assert positions == [[(0, 1), (0, 2)]] and stats.empty_words == 1


def test_unknown_tag_names_its_line(tokenizer):
    s = TaggedSentence("f.conll:7", ("John", "Smith"), ("O", "B-XYZ"))
    with pytest.raises(DataError, match=r"f.conll:8: tag 'B-XYZ' \(word 2, 'Smith'\) is not in "
                       r"the label list"):
        tagging.convert_sentences([s], tokenizer, LABELS, 8)


CONLL = ("-DOCSTART- -X- -X- O\n\nJohn NNP B-NP B-PER\nSmith NNP I-NP I-PER\n\n\n"
         "runs VBZ B-VP O\n\n-DOCSTART- -X- -X- O\n\nParis NNP B-NP B-LOC\n\n")


def test_read_conll(tmp_path):
    path = tmp_path / "d.conll"
    path.write_text(CONLL)
    sentences = tagging.read_conll(str(path))
    assert sentences == [
        TaggedSentence(f"{path}:3", ("John", "Smith"), ("B-PER", "I-PER"),
                       ("-DOCSTART- -X- -X- O", "")),
        TaggedSentence(f"{path}:7", ("runs",), ("O",), ("", "")),
        TaggedSentence(f"{path}:11", ("Paris",), ("B-LOC",), ("", "-DOCSTART- -X- -X- O", ""),
                       following=("",))]
    assert tagging.label_list_from(sentences) == ["B-LOC", "B-PER", "I-PER", "O"]
    pos = tagging.read_conll(str(path), tag_column=1)
    assert pos[0].tags == ("NNP", "NNP")


def test_predictions_line_up_with_the_input_file(tmp_path):
    """The predictions file has the input's lines: -DOCSTART- and blank lines where they
    were (CoNLL-2003 users `paste` the two files for conlleval)."""
    # CONLL ends with a blank line; also a file without one, and a file with a document
    # marker after its last sentence.
    for name, text, extra in (("d", CONLL, 0), ("bare", CONLL.rstrip("\n") + "\n", 1),
                              ("tail", CONLL + "-DOCSTART- -X- -X- O\n\n", 0)):
        path = tmp_path / f"{name}.conll"
        path.write_text(text)
        sentences = tagging.read_conll(str(path), has_tags=False)
        tags = [["T"] * len(s.words) for s in sentences]
        lines = tagging.predictions_text(sentences, tags).splitlines()
        given = text.splitlines()
        assert len(lines) == len(given) + extra, name  # a blank line after the last sentence
        for written, read in zip(lines, given):
            assert written == (f"{read.split()[0]} T" if read and read[0] != "-" else read)


def test_read_conll_malformed_line(tmp_path):
    path = tmp_path / "d.conll"
    path.write_text("John B-PER\nSmith\n")
    with pytest.raises(DataError, match=rf"{path}:2: expected at least 2"):
        tagging.read_conll(str(path))


@pytest.mark.parametrize("text, line", [
    # A tab-separated file whose word has a space: "New York" would give the tag "York".
    ("He\tPRP\tO\nvisited\tVBD\tO\nNew York\tNNP\tB-LOC\n", 3),
    # A missing column: "O" would become the POS tag of "visited".
    ("He PRP O\nvisited O\nBerlin NNP B-LOC\n", 2),
    # CoNLL-U: comment lines are not tokens.
    ("1 John John PROPN\n# text = John went\n", 2),
])
def test_read_conll_refuses_lines_with_other_columns(tmp_path, text, line):
    path = tmp_path / "d.conll"
    path.write_text(text)
    with pytest.raises(DataError, match=rf"{path}:{line}: \d whitespace-separated columns, but "
                       r"line 1 has \d: every token line needs the same columns"):
        tagging.read_conll(str(path), tag_column=1)


def test_words_cut_off_have_a_tag_outside_the_predictions():
    """A word past max_seq_length (doc_stride 0) has no prediction: "O" where the tag set
    has it, else "_" (never a tag the model did not predict, for POS sets without "O")."""
    predicted, positions = np.array([[0, 1, 0]]), [[(0, 1), (-1, -1)]]
    assert tagging.predictions_to_tags(predicted, positions, ["B-PER", "O"]) == [["O", "O"]]
    assert tagging.predictions_to_tags(predicted, positions, ["NN", "VB"]) == [["VB", "_"]]


def test_the_export_splits_text_into_words_as_str_split():
    """The tagger export's text signature splits on what Python's str.split() does (the
    CoNLL reader's words): no-break and ideographic spaces too, not zero-width ones."""
    import tensorflow as tf

    from export.export_tagger import WHITESPACE

    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    text = "a" + "b".join(spaces) + "c\u200bd Seoul\u3000went"
    words = tf.strings.split(tf.strings.regex_replace([text], WHITESPACE, " ")).to_list()[0]
    assert [w.decode() for w in words] == text.split()


@pytest.mark.parametrize("separator", ["\t", " "])
def test_columns_are_split_at_ascii_whitespace_so_words_keep_their_no_break_spaces(
        tmp_path, separator):
    """A CoNLL word may hold a no-break or ideographic space (French "10\u00a0000", a
    Japanese "東京\u3000都" from a tokenizer that keeps it): CoNLL-2003 separates its
    columns with a space and CoNLL-U with a tab, as Hugging Face's conll2003 loader
    (line.split(" ")) and CoNLL-U readers (line.split("\\t")) split them. str.split() split
    such a word too, and the file was refused as having lines of other column counts."""
    rows = [("Prix", "O"), ("10\u00a0000", "B-NUM"), ("東京\u3000都", "B-LOC"),
            ("\u2009x\u2009", "O")]
    path = tmp_path / "d.conll"
    path.write_text("".join(f"{w}{separator}{t}\r\n" for w, t in rows) + "\r\n",
                    encoding="utf-8")
    reference = [tuple(line.split(separator)) for line in
                 open(path, encoding="utf-8", newline="").read().split("\r\n") if line]
    (sentence,) = tagging.read_conll(str(path))
    assert list(zip(sentence.words, sentence.tags)) == reference == rows
    lines = tagging.predictions_text([sentence], [list(sentence.tags)]).splitlines()
    assert lines[:4] == [f"{w} {t}" for w, t in rows]  # the words as the file has them


def test_conll2003_format_fixture():
    sentences = tagging.read_conll(os.path.join(TESTDATA, "ft_conll2003.txt"))
    assert len(sentences) == 2
    assert sentences[0].words[:3] == ("U.N.", "official", "Ekeus")
    assert sentences[0].tags[:3] == ("I-ORG", "O", "I-PER")


@pytest.mark.parametrize("tags, entities", [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    (["I-PER", "I-PER", "O", "I-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),  # IOB1
    (["B-PER", "I-PER", "B-PER"], [("PER", 0, 1), ("PER", 2, 2)]),
    (["B-PER", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 1)]),
    (["S-PER", "B-LOC", "E-LOC", "O"], [("PER", 0, 0), ("LOC", 1, 2)]),  # IOBES
    (["O", "O"], []),
])
def test_get_entities(tags, entities):
    assert get_entities(tags) == entities


def test_underscore_separated_tags_are_entities_too():
    """"B_PER"-style tag sets get entity scores, as seqeval gives them."""
    from bert_keras.finetuning.tagging import is_chunk_tag

    assert get_entities(["B_PER", "I_PER", "O", "S_LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert [is_chunk_tag(t) for t in ("B_PER", "I-LOC", "E_X", "O", "NN", "B", "IN")] == [
        True, True, True, False, False, False, False]


def test_entity_f1_hand_computed():
    # seqeval's README example: one of two entities right in each list -> P = R = F1 = 0.5.
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    m = entity_f1(gold, pred)
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 0.5, 0.5)
    assert m["per_type"]["PER"]["f1"] == 1.0 and m["per_type"]["MISC"]["f1"] == 0.0
    # 3 gold, 2 predicted, 2 correct: P = 1, R = 2/3, F1 = 0.8.
    m = entity_f1([["B-PER", "O", "B-LOC", "B-ORG"]], [["B-PER", "O", "B-LOC", "O"]])
    assert m["precision"] == 1.0 and m["recall"] == pytest.approx(2 / 3) and m["f1"] == pytest.approx(0.8)
    assert token_accuracy(gold, pred) == pytest.approx(8 / 10)  # words 3 and 4 differ


def test_brown_reader_and_tag_simplification(tmp_path):
    from public_data import datasets

    assert [datasets.brown_tag(t) for t in ["np-tl", "FW-IN-TL", "nn$-hl", "ppss+md", "bedz*", "nn-tl-hl"]] == \
        ["np", "in", "nn$", "ppss+md", "bedz*", "nn"]
    path = tmp_path / "ca99"
    path.write_text("\n\n\tThe/at Fulton/np-tl jury/nn said/vbd 1/2/cd ./.\n\n\n\tIt/pps is/bez ./.\n")
    sentences = datasets.read_brown_file(path)
    assert sentences[0] == TaggedSentence(f"{path}:3", ("The", "Fulton", "jury", "said", "1/2", "."),
                                          ("at", "np", "nn", "vbd", "cd", "."))
    assert sentences[1].where == f"{path}:6" and len(sentences) == 2
    path.write_text("The/at jury\n")
    with pytest.raises(ValueError, match=rf"{path}:1: expected word/tag, got 'jury'"):
        datasets.read_brown_file(path)


def test_a_label_list_typed_with_spaces_around_a_label(tmp_path):
    """A hand-typed label list: "O " is the tag "O" (before, the training file's "O" was
    refused as not in the list ['O ', ...])."""
    from bert_keras import model_loading

    path = tmp_path / "labels.txt"
    path.write_text("O \nB-PER\t\n I-PER\n")
    assert model_loading.read_labels(str(path)) == ["O", "B-PER", "I-PER"]


def test_a_label_list_from_a_pipe_is_read_once():
    """--label_list_file=<(printf 'O\\nB-PER\\n'), a pipe at /dev/fd/<n> that gives its
    bytes to one read: the text check read them, and the reader then found "no labels".
    Its checks stand on the one read: a NUL byte, a lone-CR file."""
    from bert_keras import model_loading
    from bert_keras.finetuning.runner import labels_from_flags
    from data_prep.files import TextFileError
    from conftest import piped

    with piped(b"O\nB-PER\nI-PER\n") as path:
        assert labels_from_flags(None, path) == ["O", "B-PER", "I-PER"]
    with piped("\ufeffO \r\nB-LOC\r\n".encode()) as path:  # Notepad: BOM, CRLF
        assert model_loading.read_labels(path) == ["O", "B-LOC"]
    with piped(b"O\rB-LOC\rI-LOC\r") as path:  # classic Mac OS line ends
        assert model_loading.read_labels(path) == ["O", "B-LOC", "I-LOC"]
    with piped(b"O\nB-\x00PER\n") as path:
        with pytest.raises(TextFileError, match=rf"^{path}:2: NUL byte at byte offset 4"):
            model_loading.read_labels(path)


@pytest.mark.parametrize("ends", [b"\n", b"\r\n", b"\r"])
def test_a_label_list_with_a_stray_carriage_return(tmp_path, ends):
    """LF, CRLF or lone-CR line ends read alike; a stray "\\r" before a line's end is
    whitespace around the label (universal newlines made it an empty line: "labels.txt:2:
    empty label" for a file without one). A "\\r" inside a label (which no label holds:
    the readers refuse a line break in one) is refused naming its line, not read as two
    labels that change the model's label count."""
    from bert_keras import model_loading
    from bert_keras.model_loading import CheckpointError

    path = tmp_path / "labels.txt"
    stray = b"" if ends == b"\r" else b"\r"
    path.write_bytes(ends.join([b"O" + stray, b"B-PER", b"I-PER" + stray + stray, b""]))
    assert model_loading.read_labels(str(path)) == ["O", "B-PER", "I-PER"]
    if ends != b"\r":
        path.write_bytes(ends.join([b"O", b"B-PER\rI-PER", b""]))
        with pytest.raises(CheckpointError, match=rf"^{path}:2: a carriage return \(\\r\) "
                                                  r"inside the label 'B-PER\\rI-PER'"):
            model_loading.read_labels(str(path))


@pytest.mark.parametrize("ends", ["\n", "\r"])
def test_a_conll_file_from_a_pipe_reads_as_the_same_file(tmp_path, ends):
    """--train_file=<(zcat train.conll.gz): the text check and the line-end sniff drained
    the pipe, and read_conll returned no sentences without an error. Now read as the same
    bytes in a file are, sentences named after the pipe; its errors name it too."""
    from conftest import piped

    data = ends.join(["EU B-ORG", "rejects O", "", "German B-MISC", "call O", ""]).encode()
    regular = tmp_path / "train.conll"
    regular.write_bytes(data)
    expected = tagging.read_conll(str(regular))
    assert len(expected) == 2
    with piped(data) as path:
        got = tagging.read_conll(path)
    assert [(s.words, s.tags, s.where.replace(path, str(regular))) for s in got] == [
        (s.words, s.tags, s.where) for s in expected]
    with piped(b"EU B-ORG\nrejects\n") as path:
        with pytest.raises(DataError, match=rf"^{path}:2: expected at least 2 "):
            tagging.read_conll(path)
