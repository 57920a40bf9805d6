"""Classification converters: packing, pair truncation, file formats, label and row errors."""

import json
import os

import numpy as np
import pytest

from conftest import TESTDATA
from data_prep import classification
from data_prep.classification import DataError
from data_prep.packing import pack, pad_features, truncate_pair
from bert_keras.finetuning.classification import accuracy_and_f1
from data_prep.schema import model_inputs
from data_prep.tokenization import BertTokenizer

VOCAB = os.path.join(TESTDATA, "ft_vocab.txt")


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(VOCAB)


def ids_of(*tokens):
    vocab = [line.rstrip("\n") for line in open(VOCAB, encoding="utf-8")]
    return [vocab.index(t) for t in tokens]


def test_truncate_pair_trims_the_longer_side_from_its_end():
    # Google's _truncate_seq_pair: pop from the longer one, from b on a tie.
    assert truncate_pair([1, 2, 3, 4, 5], [6, 7], 5) == ([1, 2, 3], [6, 7])
    assert truncate_pair([1, 2, 3], [4, 5, 6], 4) == ([1, 2], [4, 5])
    assert truncate_pair([1, 2, 3], [4, 5, 6], 5) == ([1, 2, 3], [4, 5])
    assert truncate_pair([1], [2, 3, 4, 5, 6, 7], 3) == ([1], [2, 3])
    assert truncate_pair([1, 2], [3], 10) == ([1, 2], [3])


def test_pack_single_and_pair():
    p = pack(["a", "b", "c"], None, 4)
    assert p.tokens == ["[CLS]", "a", "b", "[SEP]"] and p.segment_ids == [0, 0, 0, 0]
    assert p.truncated and p.num_a == 2
    p = pack(["a", "b", "c"], ["x", "y"], 8)
    assert p.tokens == ["[CLS]", "a", "b", "c", "[SEP]", "x", "y", "[SEP]"]
    assert p.segment_ids == [0, 0, 0, 0, 0, 1, 1, 1] and not p.truncated
    p = pack(["a", "b", "c"], ["x", "y"], 7)  # 4 content slots: A (longer) loses "c"
    assert p.tokens == ["[CLS]", "a", "b", "[SEP]", "x", "y", "[SEP]"] and p.truncated
    p = pack(["a", "b", "c", "d"], ["x", "y", "z"], 7)  # 4 content slots: a b | x y
    assert p.tokens == ["[CLS]", "a", "b", "[SEP]", "x", "y", "[SEP]"] and p.truncated
    with pytest.raises(ValueError, match="too short"):
        pack(["a"], ["b"], 3)


def test_pad_features_and_model_names():
    f = pad_features([[2, 9, 3]], [[0, 0, 0]], 5)
    np.testing.assert_array_equal(f["input_ids"], [[2, 9, 3, 0, 0]])
    np.testing.assert_array_equal(f["input_mask"], [[1, 1, 1, 0, 0]])
    assert f["input_ids"].dtype == np.int32
    assert sorted(model_inputs(f)) == ["input_mask", "input_type_ids", "input_word_ids"]


def test_jsonl_pair_features_hand_checked(tmp_path, tokenizer):
    path = tmp_path / "pairs.jsonl"
    rows = [{"a": "John Smith was born", "b": "in Paris", "y": "yes"},
            {"a": "the leader", "b": "unwanted running", "y": "no"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    examples = classification.read_examples(str(path), "a", "b", "y")
    assert [e.where for e in examples] == [f"{path}:1", f"{path}:2"]
    features, stats = classification.convert_examples(examples, tokenizer, ["no", "yes"], 9)
    # Row 1: A = john smith was born (4), B = in paris (2): 6 + 3 specials = 9, fits.
    # Row 2: A = the leader (2), B = un ##want ##ed runn ##ing (5): 7 > 6 -> B loses 1.
    np.testing.assert_array_equal(features["input_ids"], [
        ids_of("[CLS]", "john", "smith", "was", "born", "[SEP]", "in", "paris", "[SEP]"),
        ids_of("[CLS]", "the", "leader", "[SEP]", "un", "##want", "##ed", "runn", "[SEP]"),
    ])
    np.testing.assert_array_equal(features["segment_ids"], [[0] * 6 + [1] * 3, [0] * 4 + [1] * 5])
    np.testing.assert_array_equal(features["input_mask"], np.ones((2, 9)))
    np.testing.assert_array_equal(features["label_ids"], [1, 0])
    assert stats.truncated == 1 and stats.examples == 2


def test_tsv_and_csv_with_quoted_multiline_field(tmp_path, tokenizer):
    tsv = tmp_path / "d.tsv"
    tsv.write_text("label\ttext\nspam\tfree money now\nham\tmeeting tomorrow\n")
    examples = classification.read_examples(str(tsv))
    assert [(e.text_a, e.label) for e in examples] == [("free money now", "spam"),
                                                      ("meeting tomorrow", "ham")]
    assert classification.label_list_from(examples) == ["ham", "spam"]
    # Integer labels sort by value, as run_glue sorts an integer column (a head transformers
    # trained on 0..10 keeps its ids); any other label makes them strings again.
    ints = [classification.Example("f:1", "t", None, label) for label in ("10", "2", "-1", "0")]
    assert classification.label_list_from(ints) == ["-1", "0", "2", "10"]
    mixed = ints + [classification.Example("f:2", "t", None, "x")]
    assert classification.label_list_from(mixed) == ["-1", "0", "10", "2", "x"]
    csv_path = tmp_path / "d.csv"
    csv_path.write_text('text,label\n"hello,\nfriend",ham\nclick here,spam\n')
    examples = classification.read_examples(str(csv_path))
    assert examples[0].text_a == "hello,\nfriend" and examples[1].where == f"{csv_path}:4"
    features, _ = classification.convert_examples(examples, tokenizer, ["ham", "spam"], 8)
    np.testing.assert_array_equal(features["input_ids"][0],
                                  ids_of("[CLS]", "hello", ",", "friend", "[SEP]", "[PAD]", "[PAD]", "[PAD]"))
    np.testing.assert_array_equal(features["input_mask"][0], [1] * 5 + [0] * 3)


def test_long_text_is_truncated_and_counted(tokenizer):
    examples = [classification.Example("x:1", "the " * 20, None, "ham")]
    features, stats = classification.convert_examples(examples, tokenizer, ["ham"], 6)
    np.testing.assert_array_equal(features["input_ids"][0], ids_of("[CLS]", *["the"] * 4, "[SEP]"))
    assert stats.truncated == 1


def test_label_not_in_label_list_names_file_and_line(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "hello", "label": "ham"}\n{"text": "free", "label": "eggs"}\n')
    examples = classification.read_examples(str(path))
    with pytest.raises(DataError, match=rf"{path}:2: label 'eggs' is not in the label list \['ham', 'spam'\]"):
        classification.convert_examples(examples, tokenizer, ["ham", "spam"], 8)


@pytest.mark.parametrize("name, content, message", [
    ("bad.tsv", "text\tlabel\nhello\tham\nonly one field\n", r"bad.tsv:3: expected 2 fields"),
    ("bad.jsonl", '{"text": "a", "label": "ham"}\n{"text": "b", "label": \n', r"bad.jsonl:2: not valid JSON"),
    ("list.jsonl", '["a", "ham"]\n', r"list.jsonl:1: expected a JSON object"),
    ("missing.jsonl", '{"text": "a"}\n', r"missing.jsonl:1: missing field 'label'"),
    ("null.jsonl", '{"text": "a", "label": null}\n', r"null.jsonl:1: field 'label' is null$"),
    ("empty.csv", 'text,label\n"",ham\n', r"empty.csv:2: field 'text' is empty"),
    ("nums.jsonl", '{"text": ["a"], "label": "x"}\n', r"nums.jsonl:1: field 'text' must be a string"),
    ("data.txt", "x\n", r"cannot tell the format"),
    ("break.jsonl", '{"text": "a", "label": "pos\\nitive"}\n',
     r"break.jsonl:1: field 'label' holds a line break \('pos\\nitive'\); a label is one line"),
    ("break.csv", 'text,label\na,"pos\r"\n', r"break.csv:2: field 'label' holds a line break"),
])
def test_malformed_rows_name_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        classification.read_examples(str(path))


@pytest.mark.parametrize("name, content", [
    ("texts.tsv", b"text\nhello\rworld\nsecond one\n"),  # one column: would become 3 rows
    ("pairs.tsv", b"text\tlabel\r\nhello\rworld\tham\r\n"),
    ("pairs.csv", b"text,label\nhello,ham\r\nwin\rcash,spam\n"),
])
def test_a_carriage_return_inside_an_unquoted_row_is_refused_naming_its_line(tmp_path, name,
                                                                            content):
    """csv (Python's, as pandas') ends a row at a lone "\\r" outside quotes: a stray one
    (a cell edited on another system) would split the row, silently where the halves have
    the header's field count. Lines ending "\\r\\n", or all in a lone "\\r", and a "\\r"
    inside a quoted field are read."""
    path = tmp_path / name
    path.write_bytes(content)
    line = 3 if name == "pairs.csv" else 2
    with pytest.raises(DataError, match=rf"^{path}:{line}: a carriage return \(\\r\) inside the "
                                        r"row, which csv reads as its end; expected"):
        classification.read_examples(str(path), label="label" if "pairs" in name else None)


@pytest.mark.parametrize("name", ["d.csv", "d.tsv"])
def test_what_a_csv_writer_writes_reads_back_field_for_field(tmp_path, name):
    """Rows as Python's csv writer (Excel's dialect, as pandas' to_csv and Excel's "CSV
    UTF-8" write them: BOM, "\\r\\n") quotes them, read back as csv.reader reads them: quotes,
    delimiters and line breaks inside fields, a text that begins with a quote, and a
    150,000-character document (over csv's default field limit of 131,072, which refused
    it)."""
    import csv
    import io

    delimiter = "\t" if name.endswith(".tsv") else ","
    rows = [["text", "label"], ['"Great" movie, he said', "pos"],
            ['5" screen\tand "more"', "neg"], ["two\nlines, \"quoted\"", "pos"],
            ["word " * 30000, "neg"]]
    buffer = io.StringIO()
    csv.writer(buffer, delimiter=delimiter).writerows(rows)
    path = tmp_path / name
    path.write_bytes(buffer.getvalue().encode("utf-8-sig"))
    limit = csv.field_size_limit(1 << 20)  # the reference needs it raised too
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reference = list(csv.reader(f, delimiter=delimiter, strict=True))[1:]
    finally:
        csv.field_size_limit(limit)
    assert reference == rows[1:]
    examples = classification.read_examples(str(path))
    assert [[e.text_a, e.label] for e in examples] == reference
    assert [e.where for e in examples] == [f"{path}:{n}" for n in (2, 3, 4, 6)]


@pytest.mark.parametrize("name, content, line, closing", [
    # A text that begins with a quote, written without csv quoting ("\t".join(...)): csv
    # read on to the next quote, merging two rows into one example labelled "neg".
    ("merged.tsv", 'text\tlabel\n"Best film\tpos\nok" fine\tneg\nthird\tpos\n', 2, 3),
    # ... or dropped its quotes: "Great movie, he said".
    ("dropped.tsv", 'text\tlabel\n"Great" movie, he said\tpos\nbad\tneg\n', 2, 2),
    ("space.csv", 'text,label\n"a" ,pos\n', 2, 2),
    ("unclosed.csv", 'text,label\nfine,pos\n"no end,neg\nsecond,pos\n', 3, None),
])
def test_a_quote_that_does_not_end_its_field_is_refused_naming_its_line(tmp_path, name,
                                                                       content, line,
                                                                       closing):
    """csv (Python's and pandas') reads a field that begins with a quote up to the next
    quote, across delimiters and lines, and keeps what follows that quote: rows merged or
    quotes dropped without a word (a known trap of TSV files written without quoting:
    pytorch/text#612). A quote must end its field (csv's strict mode); otherwise the file
    is refused, naming the line the field opens on (and where it closed)."""
    path = tmp_path / name
    path.write_text(content)
    where = f" \\(on line {closing}\\)" if closing not in (None, line) else ""
    message = ("its closing quote is followed by more text" + where if closing else
               "no quote closes it before the end of the file")
    with pytest.raises(DataError, match=rf"^{path}:{line}: a field opens with a quote \(\"\) "
                                        rf"and {message}; csv reads"):
        classification.read_examples(str(path))


def test_excels_empty_rows_and_columns_are_blank(tmp_path):
    """Excel's "CSV UTF-8" writes a row of empty cells (",,") for a row that is formatted
    but empty, and a column without a header for one that is: read as blank lines and
    columns, not refused as an empty text or duplicate column names."""
    path = tmp_path / "d.csv"
    path.write_bytes("text,label,,\r\nhello,pos,,\r\n,,,\r\nbye,neg,,\r\n,,,\r\n"
                     .encode("utf-8-sig"))
    examples = classification.read_examples(str(path))
    assert [(e.where, e.text_a, e.label) for e in examples] == [
        (f"{path}:2", "hello", "pos"), (f"{path}:4", "bye", "neg")]
    path.write_text("text,text,label\na,b,pos\n")
    with pytest.raises(DataError, match=r"d.csv:1: duplicate column names in header"):
        classification.read_examples(str(path))


@pytest.mark.parametrize("ends", [b"\n", b"\r\n", b"\r"])
def test_rows_end_in_lf_crlf_or_a_lone_cr_alike(tmp_path, ends):
    path = tmp_path / "d.csv"
    path.write_bytes(ends.join([b"text,label", b'"a\r\nb",ham', b'"c\rd",spam', b""]))
    examples = classification.read_examples(str(path))
    assert [(e.where, e.text_a, e.label) for e in examples] == [
        (f"{path}:2", "a\r\nb", "ham"), (f"{path}:4", "c\rd", "spam")]


@pytest.mark.parametrize("ends", [b"\n", b"\r\n", b"\r"])
def test_jsonl_lines_end_at_newline_and_a_stray_cr_is_json_whitespace(tmp_path, ends):
    """A "\\r" inside a JSON-lines line can only be whitespace between tokens (RFC 8259
    escapes it in strings): it does not end the line, as for tf.io.gfile's and pyarrow's
    (Hugging Face datasets') readers; universal newlines split the object in two. A file
    whose lines all end in a lone "\\r" is read line by line, as pyarrow reads it."""
    path = tmp_path / "d.jsonl"
    stray = b"" if ends == b"\r" else b"\r"
    path.write_bytes(ends.join([b'{"text": "a b",' + stray + b' "label": "ham"}', b"",
                                b'{"text": "c\\rd",' + stray + b'"label":"spam"}' + stray,
                                b""]))
    examples = classification.read_examples(str(path))
    assert [(e.where, e.text_a, e.label) for e in examples] == [
        (f"{path}:1", "a b", "ham"), (f"{path}:3", "c\rd", "spam")]


def test_jsonl_a_raw_cr_inside_a_string_is_refused_naming_its_line(tmp_path):
    """RFC 8259 has a "\\r" in a string escaped; a raw one is invalid JSON (Python's json
    and pyarrow both refuse it), named by file:line, not read as two halves."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a", "label": "ham"}\n{"text": "b\rc", "label": "spam"}\n')
    with pytest.raises(DataError, match=rf"^{path}:2: not valid JSON \(Invalid control "
                                        r"character at column 12\); expected one JSON object"):
        classification.read_examples(str(path))


def test_labels_are_read_as_labels_txt_keeps_them(tmp_path):
    """Spaces around a label are not part of it, as in the model's labels.txt
    (model_loading.read_labels): a run evaluates its own training file."""
    from bert_keras import model_loading

    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": "pos "}\n{"text": "b", "label": " neg"}\n'
                    '{"text": "c", "label": "pos"}\n')
    labels = classification.label_list_from(classification.read_examples(str(path)))
    assert labels == ["neg", "pos"]
    (tmp_path / "labels.txt").write_text("".join(f"{label}\n" for label in labels))
    assert model_loading.read_labels(str(tmp_path / "labels.txt")) == labels


def test_unlabelled_prediction_file(tmp_path, tokenizer):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "hello friend"}\n')
    examples = classification.read_examples(str(path), require_label=False)
    features, _ = classification.convert_examples(examples, tokenizer, ["ham", "spam"], 6)
    np.testing.assert_array_equal(features["label_ids"], [-1])


@pytest.mark.parametrize("name, content", [
    ("p.tsv", "text\tlabel\nhello friend\t\nwin cash\tspam\n"),
    ("p.jsonl", '{"text": "hello friend", "label": ""}\n{"text": "win cash", "label": "spam"}\n'),
])
def test_a_blank_label_in_a_prediction_file_is_no_label(tmp_path, tokenizer, name, content):
    """A predict file whose label column is blank where unknown: those rows are unlabelled
    (labels are optional there); a training file's blank label is still an error."""
    path = tmp_path / name
    path.write_text(content)
    examples = classification.read_examples(str(path), require_label=False)
    assert [e.label for e in examples] == [None, "spam"]
    features, _ = classification.convert_examples(examples, tokenizer, ["ham", "spam"], 6)
    np.testing.assert_array_equal(features["label_ids"], [-1, 1])
    with pytest.raises(DataError, match=f"{name}:[12]: field 'label' is empty"):
        classification.read_examples(str(path))


def test_accuracy_and_f1_hand_computed():
    gold = [0, 0, 1, 1, 1, 2]
    pred = [0, 1, 1, 1, 0, 0]
    m = accuracy_and_f1(gold, pred, ["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(3 / 6)
    # a: tp 1, fp 2, fn 1 -> p 1/3, r 1/2, f 0.4; b: tp 2, fp 1, fn 1 -> p r 2/3, f 2/3; c: 0.
    assert m["per_class"]["a"]["f1"] == pytest.approx(0.4)
    assert m["per_class"]["b"]["f1"] == pytest.approx(2 / 3)
    assert m["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert m["macro_f1"] == pytest.approx((0.4 + 2 / 3) / 3)
    # Matthews (Gorodkin): c = 3, s = 6, t = (2, 3, 1), p = (3, 3, 0):
    # (3 * 6 - (6 + 9 + 0)) / sqrt((36 - 18) * (36 - 14)) = 3 / sqrt(396).
    assert m["mcc"] == pytest.approx(3 / np.sqrt(396))


def test_matthews_correlation_binary_and_degenerate_cases():
    """CoLA's GLUE metric. Binary: (tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn))."""
    from bert_keras.finetuning.classification import matthews_correlation

    gold = np.array([1, 1, 1, 0, 0, 0, 0, 1])
    pred = np.array([1, 1, 0, 0, 0, 1, 0, 1])  # tp 3, tn 3, fp 1, fn 1
    assert matthews_correlation(gold, pred, 2) == pytest.approx((9 - 1) / np.sqrt(4 * 4 * 4 * 4))
    assert matthews_correlation(gold, gold, 2) == pytest.approx(1.0)
    assert matthews_correlation(gold, 1 - gold, 2) == pytest.approx(-1.0)
    assert matthews_correlation(gold, np.ones_like(gold), 2) == 0.0  # one predicted class


def test_email_text_keeps_subject_and_body_only():
    from public_data import datasets

    plain = (b"From: someone@example.com\nSubject: Free money\nX-Mailer: spam\n\n"
             b"Click  here\nnow!\n")
    assert datasets.email_text(plain) == "Free money Click here now!"
    html = (b"Subject: Hi\nMIME-Version: 1.0\nContent-Type: multipart/alternative; boundary=XX\n\n"
            b"--XX\nContent-Type: text/html; charset=utf-8\nContent-Transfer-Encoding: quoted-printable\n\n"
            b"<html><style>p {color: red}</style><p>Caf=C3=A9 &amp; tea</p></html>\n--XX--\n")
    assert datasets.email_text(html) == "Hi Café & tea"
    assert datasets.email_text(plain, max_chars=8) == "Free mon"


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_examples_from_a_pipe_read_as_the_same_file(tmp_path, fmt):
    """--train_file=<(zcat train.tsv.gz) --input_format=tsv: the text check and the
    line-end sniff drained the pipe, and the read found an empty file. Now the examples of
    the same bytes in a file (lone-"\\r" line ends: the sniff matters); a pipe's name has no
    extension, so without a format it is refused with one line naming the format flag."""
    from conftest import piped

    rows = [("free money now", "spam"), ("meeting at noon", "ham")]
    if fmt == "jsonl":
        data = "".join(json.dumps({"text": t, "label": y}) + "\r" for t, y in rows)
    else:
        sep = "\t" if fmt == "tsv" else ","
        data = "".join(f"{t}{sep}{y}\r" for t, y in [("text", "label")] + rows)
    regular = tmp_path / f"train.{fmt}"
    regular.write_text(data, newline="")
    expected = classification.read_examples(str(regular))
    assert [(e.text_a, e.label) for e in expected] == rows
    with piped(data.encode()) as path:
        got = classification.read_examples(path, fmt=fmt)
    assert [(e.where.replace(path, str(regular)), e.text_a, e.text_b, e.label)
            for e in got] == [(e.where, e.text_a, e.text_b, e.label) for e in expected]
    with piped(data.encode()) as path:
        with pytest.raises(DataError, match=rf"^{path} is a pipe, whose name has no extension "
                           r"to tell the format by; pass the format explicitly "
                           r"\(--input_format=tsv, csv or jsonl\)$"):
            classification.read_examples(path)
