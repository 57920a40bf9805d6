"""GLUE / XNLI processors on hand-written fixtures in the official layouts (tests/testdata/glue)."""

import dataclasses
import json
import logging
import os
import re
import shutil

import numpy as np
import pytest

from conftest import TESTDATA
from data_prep import classification, files, glue
from data_prep.classification import DataError, Example
from data_prep.tokenization import BertTokenizer

GLUE = os.path.join(TESTDATA, "glue")


def task_dir(name):
    return os.path.join(GLUE, name)


def where(task, file, line):
    return f"{os.path.join(GLUE, task, file)}:{line}"


# --- registry -------------------------------------------------------------------------------

def test_task_names_are_case_insensitive_with_google_and_glue_spellings():
    assert glue.TASKS == ("cola", "klue-nli", "klue-re", "klue-sts", "klue-ynat", "kornli",
                          "korsts", "mnli", "mnli-mm", "mrpc", "nsmc", "qnli", "qqp", "rte",
                          "sst-2", "sts-b", "wnli", "xnli")
    for given, name in [("CoLA", "cola"), ("MNLI", "mnli"), ("mnli-MM", "mnli-mm"),
                        ("STS-B", "sts-b"), ("stsb", "sts-b"),
                        ("MRPC", "mrpc"), ("SST-2", "sst-2"), ("sst2", "sst-2"),
                        ("QQP", "qqp"), ("QNLI", "qnli"), ("RTE", "rte"), ("WNLI", "wnli"),
                        ("XNLI", "xnli"), (" cola ", "cola"), ("KorNLI", "kornli"),
                        ("KorSTS", "korsts")]:
        assert glue.get_processor(given).name == name


def test_label_lists_in_googles_order():
    expected = {
        "cola": ["0", "1"], "sst-2": ["0", "1"], "mrpc": ["0", "1"], "qqp": ["0", "1"],
        "wnli": ["0", "1"], "nsmc": ["0", "1"],
        "mnli": ["contradiction", "entailment", "neutral"],
        "mnli-mm": ["contradiction", "entailment", "neutral"],
        "xnli": ["contradiction", "entailment", "neutral"],
        "qnli": ["entailment", "not_entailment"], "rte": ["entailment", "not_entailment"],
        "sts-b": None, "korsts": None, "klue-sts": None,
        "klue-nli": ["entailment", "neutral", "contradiction"],
        "klue-ynat": ["IT과학", "경제", "사회", "생활문화", "세계", "스포츠", "정치"],
        "kornli": ["contradiction", "entailment", "neutral"],
        "klue-re": list(glue.KLUE_RE_LABELS),
    }
    assert {name: glue.get_processor(name).labels() for name in glue.TASKS} == expected


def test_pair_tasks():
    assert {n for n in glue.TASKS if glue.get_processor(n).is_pair()} == {
        "klue-nli", "klue-sts", "kornli", "korsts", "mnli", "mnli-mm", "mrpc", "qnli", "qqp",
        "rte", "sts-b", "wnli", "xnli"}


@pytest.mark.parametrize("name", ["sts-b", "STS-B", "stsb"])
def test_sts_b_is_read_as_transformers_reads_it_with_numeric_labels(name, tmp_path):
    """GLUE's STS-B layout (transformers' StsbProcessor: sentence1, sentence2, score in
    columns 7, 8, 9; the test file without the score); a score that is not a number is
    refused naming file:line."""
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    rows = ["0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off."
            "\tAn air plane is taking off.\t5.000",
            "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man is playing a flute."
            "\tA man is playing a bamboo flute.\t3.800"]
    (tmp_path / "train.tsv").write_text(header + "\tscore\n" + "\n".join(rows) + "\n")
    (tmp_path / "test.tsv").write_text(header + "\n" + "\n".join(r.rsplit("\t", 1)[0]
                                                              for r in rows) + "\n")
    processor = glue.get_processor(name)
    assert processor.is_regression() and processor.is_pair() and processor.labels() is None
    train = processor.load(str(tmp_path), "train")
    assert [(e.text_a, e.text_b, e.label) for e in train.examples] == [
        ("A plane is taking off.", "An air plane is taking off.", "5.000"),
        ("A man is playing a flute.", "A man is playing a bamboo flute.", "3.800")]
    assert train.ids == ["0", "1"]
    test = processor.load(str(tmp_path), "test")
    assert [e.label for e in test.examples] == [None, None] and test.ids == ["0", "1"]
    (tmp_path / "dev.tsv").write_text(header + "\tscore\n" + rows[0][:-5] + "high\n")
    with pytest.raises(DataError, match=r"dev.tsv:2: label 'high' \(column 9\) is not a "
                                        r"number \(sts-b is a regression task\)"):
        processor.load(str(tmp_path), "dev")


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(glue.TaskError, match=r"unknown task 'squad'.*cola, klue-nli, klue-re, "
                                             r"klue-sts, klue-ynat, kornli"):
        glue.get_processor("squad")


def test_googles_flags_map_to_splits_and_files():
    assert glue.SPLIT_FOR_FLAG == {"do_train": "train", "do_eval": "dev", "do_predict": "test"}
    files = {name: [glue.get_processor(name).file(s) for s in glue.SPLITS] for name in glue.TASKS}
    assert files["cola"] == ["train.tsv", "dev.tsv", "test.tsv"]
    assert files["mnli"] == ["train.tsv", "dev_matched.tsv", "test_matched.tsv"]
    assert files["mnli-mm"] == ["train.tsv", "dev_mismatched.tsv", "test_mismatched.tsv"]
    assert files["xnli"] == ["multinli/multinli.train.zh.tsv", "xnli.dev.tsv", "xnli.test.tsv"]
    assert glue.get_processor("xnli", language="de").file("train") == \
        "multinli/multinli.train.de.tsv"
    with pytest.raises(ValueError, match="split must be one of"):
        glue.get_processor("cola").file("validation")


# --- the tasks, one by one ------------------------------------------------------------------

def test_cola_train_has_no_header_and_the_sentence_in_column_3():
    examples = glue.get_processor("cola").train_examples(task_dir("CoLA"))
    assert examples == [
        Example(where("CoLA", "train.tsv", 1), "The cat sat on the mat.", None, "1"),
        Example(where("CoLA", "train.tsv", 2), "Cat the on mat sat.", None, "0"),
        # quoting is off: the quotes are text, as in Google's reader
        Example(where("CoLA", "train.tsv", 3), '"Stop," she said.', None, "1"),
    ]
    dev = glue.get_processor("cola").load(task_dir("CoLA"), "dev")
    assert [(e.where, e.text_a, e.label) for e in dev.examples] == [
        (where("CoLA", "dev.tsv", 1), "Birds fly south in winter.", "1"),
        (where("CoLA", "dev.tsv", 2), "South birds the fly.", "0"),
    ]
    assert dev.ids == ["0", "1"] and dev.skipped == []


def test_cola_test_has_a_header_ids_and_no_labels():
    test = glue.get_processor("cola").load(task_dir("CoLA"), "test")
    assert test.examples == [
        Example(where("CoLA", "test.tsv", 2), "The dog barked at the moon.", None, None),
        Example(where("CoLA", "test.tsv", 3), "Barked dog the.", None, None),
    ]
    assert test.ids == ["0", "1"]


def test_sst2_bare_quote_does_not_swallow_the_next_rows():
    examples = glue.get_processor("sst2").train_examples(task_dir("SST-2"))
    assert [(e.where, e.text_a, e.text_b, e.label) for e in examples] == [
        (where("SST-2", "train.tsv", 2), "a gentle , funny little film ", None, "1"),
        (where("SST-2", "train.tsv", 3), '" dull from start to finish ', None, "0"),
        (where("SST-2", "train.tsv", 4), "the actors look bored ", None, "0"),
    ]
    test = glue.get_processor("sst-2").load(task_dir("SST-2"), "test")
    assert [e.text_a for e in test.examples] == ["an uneven but rewarding movie .",
                                                 "the plot goes nowhere ."]
    assert test.ids == ["0", "1"] and {e.label for e in test.examples} == {None}


def test_mrpc_columns_3_and_4_label_first_header_skipped():
    examples = glue.get_processor("mrpc").train_examples(task_dir("MRPC"))
    assert examples[0] == Example(where("MRPC", "train.tsv", 2), "The company posted a profit.",
                                  "The firm reported a profit.", "1")
    assert [e.label for e in examples] == ["1", "0"]
    assert glue.get_processor("mrpc").dev_examples(task_dir("MRPC"))[0].text_b == \
        "He departed ahead of time."
    test = glue.get_processor("mrpc").load(task_dir("MRPC"), "test")
    assert [(e.text_a, e.text_b, e.label) for e in test.examples] == [
        ("Prices rose.", "Prices went up.", None), ("The vote failed.", "Lunch was late.", None)]
    assert test.ids == ["0", "1"]


def test_qqp_skips_rows_with_missing_fields_and_reports_each(caplog):
    processor = glue.get_processor("qqp")
    train = processor.load(task_dir("QQP"), "train")
    assert [(e.where, e.text_a, e.text_b, e.label) for e in train.examples] == [
        (where("QQP", "train.tsv", 2), "How do I learn Python?",
         "What is the best way to learn Python?", "1"),
        (where("QQP", "train.tsv", 3), "Why is the sky blue?", "How tall is Everest?", "0"),
        (where("QQP", "train.tsv", 6), "Is tea healthy?", "Is green tea good for you?", "1"),
    ]
    assert train.ids == ["10", "11", "13"]
    assert train.skipped == [
        f"{where('QQP', 'train.tsv', 4)}: found 4 fields, expected 6",
        f"{where('QQP', 'train.tsv', 5)}: found 3 fields, expected 6",
    ]
    assert "3 examples" in train.summary() and "2 rows skipped" in train.summary()
    with caplog.at_level(logging.WARNING):
        assert len(processor.train_examples(task_dir("QQP"))) == 3
    assert "2 rows skipped" in caplog.text and "train.tsv:4: found 4 fields" in caplog.text

    dev = processor.load(task_dir("QQP"), "dev")
    assert dev.examples[0].text_a == '"Free" trials: are they really free?'
    assert dev.skipped == []
    test = processor.load(task_dir("QQP"), "test")
    assert [(e.text_a, e.text_b, e.label) for e in test.examples] == [
        ("Can dogs eat grapes?", "Are grapes safe for dogs?", None),
        ("Who wrote Hamlet?", "When was Hamlet written?", None)]
    assert test.ids == ["0", "1"]


def test_mnli_columns_8_and_9_and_the_label_is_the_last_column():
    train = glue.get_processor("mnli").load(task_dir("MNLI"), "train")
    assert train.examples[1] == Example(where("MNLI", "train.tsv", 3), "You know the rules.",
                                        "You are aware of the rules.", "entailment")  # not label1
    assert [e.label for e in train.examples] == ["contradiction", "entailment", "neutral"]
    assert train.examples[2].text_a == '"Wait here," he said.'
    assert train.ids == ["0", "1", "2"]
    # mnli-mm trains on the same file
    assert glue.get_processor("mnli-mm").train_examples(task_dir("MNLI")) == train.examples


def test_mnli_matched_and_mismatched_dev_and_test():
    matched, mismatched = glue.get_processor("mnli"), glue.get_processor("MNLI-MM")
    dev_m = matched.load(task_dir("MNLI"), "dev")
    dev_mm = mismatched.load(task_dir("MNLI"), "dev")
    assert dev_m.path.endswith("dev_matched.tsv") and dev_mm.path.endswith("dev_mismatched.tsv")
    assert [(e.text_a, e.label) for e in dev_m.examples] == [
        ("The hotel is by the sea.", "contradiction"), ("Critics liked the play.", "entailment")]
    assert [e.label for e in dev_mm.examples] == ["entailment", "neutral", "contradiction"]
    assert dev_mm.examples[0].where == where("MNLI", "dev_mismatched.tsv", 2)
    test_m = matched.load(task_dir("MNLI"), "test")
    test_mm = mismatched.load(task_dir("MNLI"), "test")
    assert [(e.text_a, e.label) for e in test_m.examples] == [("The museum opens at nine.", None)]
    assert [e.text_b for e in test_mm.examples] == ["Your support is appreciated.",
                                                    "Nobody read the report."]
    assert test_mm.ids == ["0", "1"]


@pytest.mark.parametrize("task,labels", [("QNLI", ["entailment", "not_entailment"]),
                                         ("RTE", ["entailment", "not_entailment"]),
                                         ("WNLI", ["1", "0"])])
def test_index_a_b_label_tasks(task, labels):
    processor = glue.get_processor(task)
    train = processor.load(task_dir(task), "train")
    assert [e.label for e in train.examples] == labels
    assert train.ids == ["0", "1"] and train.examples[0].where == where(task, "train.tsv", 2)
    assert all(e.text_a and e.text_b for e in train.examples)
    assert len(processor.dev_examples(task_dir(task))) == 1
    test = processor.load(task_dir(task), "test")
    assert len(test.examples) == 1 and test.examples[0].label is None and test.ids == ["0"]
    assert test.examples[0].text_b


def test_qnli_question_then_sentence():
    example = glue.get_processor("qnli").train_examples(task_dir("QNLI"))[0]
    assert (example.text_a, example.text_b) == ("Where is the Eiffel Tower?",
                                                "The Eiffel Tower stands in Paris.")


def test_xnli_defaults_to_chinese_as_google_does():
    processor = glue.get_processor("xnli")
    assert processor.language == "zh"
    train = processor.train_examples(task_dir("XNLI"))
    file = "multinli/multinli.train.zh.tsv"
    assert train == [
        Example(where("XNLI", file, 2), "他去了商店。", "他待在家里。", "contradiction"),  # "contradictory"
        Example(where("XNLI", file, 3), "天气很好。", "今天是晴天。", "entailment"),
        Example(where("XNLI", file, 4), "她在读书。", "她喜欢小说。", "neutral"),
    ]
    dev = processor.load(task_dir("XNLI"), "dev")  # only the zh rows of xnli.dev.tsv
    assert [(e.where, e.text_a, e.text_b, e.label) for e in dev.examples] == [
        (where("XNLI", "xnli.dev.tsv", 3), "他回来得很晚。", "他累了。", "neutral"),
        (where("XNLI", "xnli.dev.tsv", 5), "门开着。", "门关着。", "contradiction"),
    ]
    assert dev.ids == ["1-1", "2-2"]


def test_xnli_other_language_and_labelled_test():
    processor = glue.get_processor("XNLI", language="de")
    assert [e.label for e in processor.train_examples(task_dir("XNLI"))] == [
        "contradiction", "entailment"]
    assert [e.text_a for e in processor.dev_examples(task_dir("XNLI"))] == [
        "Er kam spät zurück.", "Die Tür ist offen."]
    test = processor.load(task_dir("XNLI"), "test")
    assert [(e.text_a, e.label) for e in test.examples] == [
        ("Wir haben zu Abend gegessen.", "entailment")]
    assert test.ids == ["7-7"]


def test_xnli_downloads_unpacked_side_by_side_are_read(tmp_path):
    """XNLI-MT-1.0.zip and XNLI-1.0.zip unpacked into --data_dir as they come (the layout
    transformers' XnliProcessor reads) were refused: only Google's README layout, the two
    merged into one directory, was read. Both are, with the same examples."""
    google = task_dir("XNLI")
    shutil.copytree(os.path.join(google, "multinli"), tmp_path / "XNLI-MT-1.0" / "multinli")
    (tmp_path / "XNLI-1.0").mkdir()
    for name in ("xnli.dev.tsv", "xnli.test.tsv"):
        shutil.copy(os.path.join(google, name), tmp_path / "XNLI-1.0" / name)
    for language in ("zh", "de"):
        processor = glue.get_processor("xnli", language=language)
        for split in ("train", "dev", "test"):
            got, want = processor.load(str(tmp_path), split), processor.load(google, split)
            assert [dataclasses.replace(e, where="") for e in got.examples] == \
                [dataclasses.replace(e, where="") for e in want.examples]
            assert got.ids == want.ids and got.examples
        assert processor.path(str(tmp_path), "dev") == str(tmp_path / "XNLI-1.0" / "xnli.dev.tsv")


def test_xnli_downloads_unpacked_without_the_file_are_named_with_both_layouts(tmp_path):
    """The error listed multinli/, which does not exist there ("holds nothing: it does not
    exist"), not the directory the user gave, and neither layout read."""
    (tmp_path / "XNLI-1.0").mkdir()
    (tmp_path / "XNLI-MT-1.0" / "multinli").mkdir(parents=True)
    with pytest.raises(DataError, match=(
            r"no multinli/multinli.train.zh.tsv there for the xnli train set \(expected .* or "
            r".*XNLI-MT-1.0/multinli/multinli.train.zh.tsv; "
            rf"{re.escape(str(tmp_path))} holds XNLI-1.0, XNLI-MT-1.0\) \(XNLI as Google's "
            r"README lays it out: XNLI-1.0's xnli.dev.tsv and xnli.test.tsv beside "
            r"XNLI-MT-1.0's multinli/, in one directory; or the two archives unpacked there "
            r"side by side\)$")):
        glue.get_processor("xnli").train_examples(str(tmp_path))


def test_xnli_language_without_data():
    processor = glue.get_processor("xnli", language="fr")
    with pytest.raises(DataError) as info:
        processor.train_examples(task_dir("XNLI"))
    message = str(info.value)
    assert message.startswith(task_dir("XNLI") + ": no multinli/multinli.train.fr.tsv there")
    assert message.endswith(f"{os.path.join(task_dir('XNLI'), 'multinli')} holds "
                            "multinli.train.de.tsv, multinli.train.zh.tsv)")
    with pytest.raises(DataError, match=r"xnli.dev.tsv: no rows for language 'fr' \(column 0; "
                                        r"languages there: \['de', 'en', 'zh'\]\)"):
        processor.dev_examples(task_dir("XNLI"))
    with pytest.raises(glue.TaskError, match="language code"):
        glue.get_processor("xnli", language="../zh")


# --- errors ---------------------------------------------------------------------------------

def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def test_missing_directory_and_missing_file_are_named(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"nowhere: --data_dir is not a directory \(task mnli "
                                        r"reads train.tsv there"):
        glue.get_processor("mnli").train_examples(missing)
    write(str(tmp_path / "dev.tsv"), "x\n")
    with pytest.raises(DataError) as info:
        glue.get_processor("mnli").dev_examples(str(tmp_path))
    assert str(info.value) == (
        f"{tmp_path}: no dev_matched.tsv there for the mnli dev set (expected "
        f"{tmp_path / 'dev_matched.tsv'}; {tmp_path} holds dev.tsv)")


def test_wrong_field_count_names_file_line_found_and_expected(tmp_path):
    # SST-2's layout given as CoLA: CoLA's train.tsv has 4 fields and no header
    with pytest.raises(DataError) as info:
        glue.get_processor("cola").train_examples(task_dir("SST-2"))
    assert str(info.value) == (f"{where('SST-2', 'train.tsv', 1)}: found 2 fields, expected 4 "
                               "(tab-separated; row of the cola train file train.tsv, which has "
                               "no header)")
    write(str(tmp_path / "dev.tsv"), "index\tsentence1\tsentence2\tlabel\n"
                                     "0\ta\tb\tentailment\n"
                                     "1\ta b\tentailment\n")
    with pytest.raises(DataError, match=r"dev.tsv:3: found 3 fields, expected 4 \(tab-separated; "
                                        r"row of the rte dev file dev.tsv\)$"):
        glue.get_processor("rte").dev_examples(str(tmp_path))
    # a header with the wrong count is an error even for QQP, which skips malformed rows
    write(str(tmp_path / "test.tsv"), "id\tquestion1\n0\ta\tb\n")
    with pytest.raises(DataError, match=r"test.tsv:1: found 2 fields, expected 3 "
                                        r"\(tab-separated; header of the qqp test file"):
        glue.get_processor("qqp").test_examples(str(tmp_path))


def test_label_outside_the_label_list(tmp_path):
    write(str(tmp_path / "train.tsv"), "src\t1\t\tGood.\nsrc\t2\t\tBad.\n")
    with pytest.raises(DataError, match=r"train.tsv:2: label '2' \(column 1\) is not one of "
                                        r"\['0', '1'\]"):
        glue.get_processor("cola").train_examples(str(tmp_path))
    write(str(tmp_path / "train.tsv"), "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                                       "1\t1\t2\ta?\tb?\tyes\n")
    with pytest.raises(DataError, match=r"train.tsv:2: label 'yes' \(column 5\)"):
        glue.get_processor("qqp").train_examples(str(tmp_path))


def test_empty_files_blank_lines_and_bad_utf8(tmp_path):
    write(str(tmp_path / "train.tsv"), "")
    with pytest.raises(DataError, match=r"train.tsv: no examples for the sst-2 train set$"):
        glue.get_processor("sst-2").train_examples(str(tmp_path))
    write(str(tmp_path / "train.tsv"), "sentence\tlabel\n")
    with pytest.raises(DataError, match="no examples for the sst-2 train set"):
        glue.get_processor("sst-2").train_examples(str(tmp_path))
    # blank lines are skipped; line numbers stay those of the file
    write(str(tmp_path / "train.tsv"), "\nsentence\tlabel\n\nfine .\t1\n")
    examples = glue.get_processor("sst-2").train_examples(str(tmp_path))
    assert examples == [Example(f"{tmp_path / 'train.tsv'}:4", "fine .", None, "1")]
    # QQP with nothing but malformed rows
    write(str(tmp_path / "test.tsv"), "id\tquestion1\tquestion2\n0\tonly one\n")
    with pytest.raises(DataError, match=r"no examples for the qqp test set \(1 row skipped"):
        glue.get_processor("qqp").test_examples(str(tmp_path))
    with open(tmp_path / "dev.tsv", "wb") as f:
        f.write(b"sentence\tlabel\nok .\t1\nbad \xff .\t0\n")
    with pytest.raises(files.TextFileError, match=r"dev.tsv:3: not UTF-8 \(byte b'\\xff' at "
                       r"byte offset 26\); expected UTF-8 text \(convert it"):
        glue.get_processor("sst-2").dev_examples(str(tmp_path))


def _googles_rows(path):
    """Google's run_classifier DataProcessor._read_tsv, verbatim but for TF 2's name for
    tf.gfile.Open: csv.reader over a GFile, whose line iteration drops every "\\r"."""
    import csv

    import tensorflow as tf
    with tf.io.gfile.GFile(path, "r") as f:
        return list(csv.reader(f, delimiter="\t", quotechar=None))


def test_carriage_returns_inside_rows_are_read_as_googles_reader_reads_them(tmp_path):
    # A CRLF file, a cell edited into "...\r" before its tab, a lone "\r" inside a question:
    # Google's reader drops every "\r" (rows stay whole); Python's universal newlines would
    # split the row there, and QQP, which skips malformed rows, would lose it.
    path = tmp_path / "train.tsv"
    path.write_bytes(b"id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\r\n"
                     b"7\t1\t2\tHow do I\rlearn Python?\tWhat is Python?\t1\r\n"
                     b"8\t3\t4\tWhy is the sky blue?\r\tHow tall is Everest?\t0\n"
                     b"9\t5\t6\tIs tea healthy?\tIs tea good?\t1\r\n")
    train = glue.get_processor("qqp").load(str(tmp_path), "train")
    google = _googles_rows(str(path))[1:]
    assert train.skipped == []
    assert [(e.text_a, e.text_b, e.label) for e in train.examples] == [
        (row[3], row[4], row[5]) for row in google]
    assert train.examples[0].text_a == "How do Ilearn Python?"  # Google's reading, kept
    assert [e.where for e in train.examples] == [f"{path}:{n}" for n in (2, 3, 4)]
    # a file whose lines all end in a lone "\r" (one line to Google's reader) is split there
    path.write_bytes(b"id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\r"
                     b"7\t1\t2\tHow do I learn Python?\tWhat is Python?\t1\r")
    assert [e.text_a for e in glue.get_processor("qqp").train_examples(str(tmp_path))] == [
        "How do I learn Python?"]


# --- into features --------------------------------------------------------------------------

def test_examples_convert_with_the_task_label_list():
    tokenizer = BertTokenizer(os.path.join(TESTDATA, "ft_vocab.txt"))
    processor = glue.get_processor("mnli-mm")
    features, stats = classification.convert_examples(
        processor.dev_examples(task_dir("MNLI")), tokenizer, processor.labels(), 16)
    assert features["label_ids"].tolist() == [1, 2, 0]
    assert features["segment_ids"].max() == 1 and stats.examples == 3
    features, _ = classification.convert_examples(
        processor.test_examples(task_dir("MNLI")), tokenizer, processor.labels(), 16)
    assert features["label_ids"].tolist() == [-1, -1]


# --- KorNLI and KorSTS (tests/testdata/glue/KorNLUDatasets: hand-written rows in the layout
# of github.com/kakaobrain/KorNLUDatasets, KorNLI/ and KorSTS/) -------------------------------

KORNLU = os.path.join(GLUE, "KorNLUDatasets")


def kornlu(task, file, line):
    return f"{os.path.join(KORNLU, task, file)}:{line}"


def test_kornli_trains_on_mnli_then_snli_and_skips_rows_without_a_gold_label(caplog):
    """KorNLI's training set is its two translated files together (the paper's 942,854
    pairs = MNLI's 392,702 + SNLI's 550,152); SNLI's "-" (no gold label) is skipped and
    reported, not refused; quotes are ordinary characters."""
    processor = glue.get_processor("KorNLI")
    assert processor.files("train") == ("multinli.train.ko.tsv", "snli_1.0_train.ko.tsv")
    train = processor.load(os.path.join(KORNLU, "KorNLI"), "train")
    assert [(e.where, e.text_a, e.text_b, e.label) for e in train.examples] == [
        (kornlu("KorNLI", "multinli.train.ko.tsv", 2), "저는, 그냥 알아내려고 거기 있었어요.",
         "이해하려고 노력하고 있었어요.", "entailment"),
        (kornlu("KorNLI", "multinli.train.ko.tsv", 3), '"여기서 기다려," 그가 말했다.',
         "그는 아무 말도 하지 않았다.", "contradiction"),
        (kornlu("KorNLI", "multinli.train.ko.tsv", 4), "회의는 오후 세 시에 시작한다.",
         "회의는 길어질 것이다.", "neutral"),
        (kornlu("KorNLI", "snli_1.0_train.ko.tsv", 2), "한 남자가 폭포 근처에 서 있다.",
         "남자가 밖에 있다.", "entailment"),
        (kornlu("KorNLI", "snli_1.0_train.ko.tsv", 4), "여자가 기타를 연주하고 있다.",
         "여자가 악기를 연주한다.", "entailment")]
    assert train.ids == ["0", "1", "2", "3", "4"]
    assert train.skipped == [
        f"{kornlu('KorNLI', 'snli_1.0_train.ko.tsv', 3)}: label '-', no gold label"]
    assert train.path == os.path.join(KORNLU, "KorNLI", "multinli.train.ko.tsv")
    assert (f"kornli train: 5 examples from {train.path} + "
            f"{os.path.join(KORNLU, 'KorNLI', 'snli_1.0_train.ko.tsv')}; 1 row skipped")\
        in train.summary()
    with caplog.at_level(logging.WARNING):
        assert len(processor.train_examples(os.path.join(KORNLU, "KorNLI"))) == 5
    assert "1 row skipped" in caplog.text
    dev = processor.load(os.path.join(KORNLU, "KorNLI"), "dev")
    assert [(e.text_a, e.label) for e in dev.examples] == [
        ("그는 엄마에게 전화했다.", "contradiction"), ('나는 "괜찮아"라고 말했다.', "entailment")]
    test = processor.load(os.path.join(KORNLU, "KorNLI"), "test")
    assert [e.label for e in test.examples] == ["neutral", "entailment"]  # labelled


def test_korsts_reads_score_and_sentences_from_its_seven_columns():
    processor = glue.get_processor("korsts")
    assert processor.is_regression() and processor.is_pair() and processor.labels() is None
    assert [processor.file(s) for s in glue.SPLITS] == ["sts-train.tsv", "sts-dev.tsv",
                                                         "sts-test.tsv"]
    train = processor.load(os.path.join(KORNLU, "KorSTS"), "train")
    assert [(e.where, e.text_a, e.text_b, e.label) for e in train.examples] == [
        (kornlu("KorSTS", "sts-train.tsv", 2), "한 남자가 폭포 근처에 물속에 서 있다.",
         "한 남자가 물속으로 걸어 들어간다.", "3.400"),
        (kornlu("KorSTS", "sts-train.tsv", 3), "고양이가 TV를 보고 있다.",
         "남자가 휴가를 가고 있다.", "0.000"),
        (kornlu("KorSTS", "sts-train.tsv", 4), '"평화" 회담이 재개되었다.',
         '"평화" 회담이 다시 시작되었다.', "5.000")]
    assert train.ids == ["0", "1", "2"]
    test = processor.load(os.path.join(KORNLU, "KorSTS"), "test")
    assert [e.label for e in test.examples] == ["4.600", "0.500"]  # labelled


@pytest.mark.parametrize("task,below", [("kornli", "KorNLI"), ("korsts", "KorSTS")])
def test_the_repository_root_is_read_as_its_task_directory(task, below):
    processor = glue.get_processor(task)
    for split in glue.SPLITS:
        got = processor.load(KORNLU, split)
        want = processor.load(os.path.join(KORNLU, below), split)
        assert got.examples == want.examples and got.paths == want.paths
        assert processor.path(KORNLU, split) == os.path.join(KORNLU, below,
                                                            processor.file(split))


def test_kornli_missing_second_training_file_and_bad_rows_are_named(tmp_path):
    shutil.copy(os.path.join(KORNLU, "KorNLI", "multinli.train.ko.tsv"), tmp_path)
    with pytest.raises(DataError) as info:
        glue.get_processor("kornli").train_examples(str(tmp_path))
    assert str(info.value) == (
        f"{tmp_path}: no snli_1.0_train.ko.tsv there for the kornli train set (expected "
        f"{tmp_path / 'snli_1.0_train.ko.tsv'} or "
        f"{tmp_path / 'KorNLI' / 'snli_1.0_train.ko.tsv'}; {tmp_path} holds "
        "multinli.train.ko.tsv)")
    write(str(tmp_path / "snli_1.0_train.ko.tsv"), "sentence1\tsentence2\tgold_label\n"
                                                   "가\t나\tentailment\n가\t나\t중립\n")
    with pytest.raises(DataError, match=r"snli_1.0_train.ko.tsv:3: label '중립' \(column 2\) is "
                                        r"not one of \['contradiction', 'entailment', "
                                        r"'neutral'\]$"):
        glue.get_processor("kornli").train_examples(str(tmp_path))
    # "-" only in the training set: a dev row without a gold label is an error.
    write(str(tmp_path / "xnli.dev.ko.tsv"), "sentence1\tsentence2\tgold_label\n가\t나\t-\n")
    with pytest.raises(DataError, match=r"xnli.dev.ko.tsv:2: label '-' \(column 2\) is not one"):
        glue.get_processor("kornli").dev_examples(str(tmp_path))
    # A second file with nothing but unlabelled rows is named as empty.
    write(str(tmp_path / "snli_1.0_train.ko.tsv"), "sentence1\tsentence2\tgold_label\n"
                                                   "가\t나\t-\n")
    with pytest.raises(DataError, match=r"snli_1.0_train.ko.tsv: no examples for the kornli "
                                        r"train set \(1 row skipped\)$"):
        glue.get_processor("kornli").train_examples(str(tmp_path))
    write(str(tmp_path / "sts-dev.tsv"), "genre\tfilename\tyear\tid\tscore\tsentence1\n")
    with pytest.raises(DataError, match=r"sts-dev.tsv:1: found 6 fields, expected 7 "
                                        r"\(tab-separated; header of the korsts dev file"):
        glue.get_processor("korsts").dev_examples(str(tmp_path))


# --- KLUE (tests/testdata/glue/klue_benchmark: hand-written examples in the layout of
# github.com/KLUE-benchmark/KLUE's klue_benchmark/, v1.1 files) ------------------------------

KLUE = os.path.join(GLUE, "klue_benchmark")


@pytest.mark.parametrize("name,directory", [("klue-nli", "klue-nli-v1.1"),
                                            ("klue-sts", "klue-sts-v1.1"),
                                            ("klue-ynat", "ynat-v1.1")])
def test_klue_reads_its_json_with_guids_and_predicts_on_the_dev_set(name, directory):
    processor = glue.get_processor(name)
    train = processor.load(KLUE, "train")  # klue_benchmark/ itself, or the task's directory
    assert train.examples == processor.load(os.path.join(KLUE, directory), "train").examples
    rows = json.load(open(os.path.join(KLUE, directory, f"{directory}_train.json"),
                          encoding="utf-8"))
    assert train.ids == [row["guid"] for row in rows]
    assert train.examples[0].where == os.path.join(KLUE, directory,
                                                   f"{directory}_train.json") + "[0]"
    dev, test = processor.load(KLUE, "dev"), processor.load(KLUE, "test")
    assert test.path == dev.path and test.examples == dev.examples  # no public test set
    if name == "klue-nli":
        assert [(e.text_a, e.text_b, e.label) for e in train.examples[1:3]] == [
            ("그 식당은 매주 월요일에 문을 닫는다.", "그 식당은 월요일에도 영업한다.", "contradiction"),
            ('"새 도서관"이 내년에 개관한다.', "도서관에는 책이 많을 것이다.", "neutral")]
        assert processor.labels() == ["entailment", "neutral", "contradiction"]
    elif name == "klue-sts":
        # The annotators' mean, which KLUE's baseline trains on; "label" is it rounded.
        assert [float(e.label) for e in train.examples] == [
            row["labels"]["real-label"] for row in rows]
        assert train.examples[0].label == "3.7142857142857144"
        assert processor.is_regression() and processor.is_pair()
    else:
        assert [(e.text_a, e.text_b, e.label) for e in dev.examples] == [
            ("기준금리 동결…대출 이자 부담 여전", None, "경제"),
            ("새 스마트폰 배터리 수명 두 배로 늘어", None, "IT과학")]
        assert glue.get_processor("YNAT").name == glue.get_processor("klue-tc").name == name
        assert len(processor.labels()) == 7


def test_klue_files_that_are_not_its_layout_are_named(tmp_path):
    path = tmp_path / "klue-nli-v1.1_train.json"

    def refused(text, pattern):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataError, match=pattern):
            glue.get_processor("klue-nli").train_examples(str(tmp_path))

    row = {"guid": "g0", "premise": "가", "hypothesis": "나", "gold_label": "neutral"}
    refused("[{", r"klue-nli-v1.1_train.json:1: not valid JSON")
    refused(json.dumps({"data": [row]}), r"_train.json: expected a JSON list of examples "
                                         r"\(the klue-nli train file\), got a JSON dict$")
    refused(json.dumps([row, {**row, "hypothesis": None}]),
            r"_train.json\[1\].hypothesis: expected a string \(NoneType\)$")
    refused(json.dumps([{k: v for k, v in row.items() if k != "premise"}]),
            r"_train.json\[0\].premise: expected a string \(no such field\)$")
    refused(json.dumps([{**row, "gold_label": "중립"}]),
            r"_train.json\[0\].gold_label: label '중립' is not one of \['entailment', "
            r"'neutral', 'contradiction'\]$")
    refused("[]", r"_train.json: no examples for the klue-nli train set$")
    sts = {"guid": "g0", "sentence1": "가", "sentence2": "나", "labels": {"label": 3.1}}
    (tmp_path / "klue-sts-v1.1_train.json").write_text(json.dumps([sts]), encoding="utf-8")
    with pytest.raises(DataError, match=r"_train.json\[0\].labels.real-label: expected a field "
                                        r"here \(the label\)$"):
        glue.get_processor("klue-sts").train_examples(str(tmp_path))
    sts["labels"]["real-label"] = "high"
    (tmp_path / "klue-sts-v1.1_train.json").write_text(json.dumps([sts]), encoding="utf-8")
    with pytest.raises(DataError, match=r"labels.real-label: label 'high' is not a number "
                                        r"\(klue-sts is a regression task\)$"):
        glue.get_processor("klue-sts").train_examples(str(tmp_path))


def test_klue_re_marks_its_entities_and_keeps_its_relations():
    """KLUE-RE (hand-written rows in its layout, klue_benchmark/klue-re-v1.1/): the text is
    the sentence with the subject and the object marked by typed punctuation, in either
    order; the labels are KLUE's 30, no_relation first."""
    processor = glue.get_processor("KLUE-RE")
    assert not processor.is_pair() and len(processor.labels()) == 30
    assert processor.labels()[0] == "no_relation" and processor.labels()[-1] == "per:title"
    dev = processor.load(KLUE, "dev")
    assert dev.ids[0] == "klue-re-v1_dev_00000" and dev.path.endswith("klue-re-v1.1_dev.json")
    assert [(e.text_a, e.label) for e in dev.examples[:2]] == [
        ("@*PER*유관순@은 #^DAT^1902년# 천안에서 태어났다.", "per:date_of_birth"),
        ("@*PER*유관순@은 1902년 #^LOC^천안#에서 태어났다.", "per:place_of_birth")]
    # The object first; nested entities (the outer one opens first and closes last).
    assert dev.examples[3].text_a == "손흥민과 @*PER*이강인@은 #^ORG^대표팀# 동료이다."
    sentence = "서울시청 앞"
    assert glue.mark_relation_entities(sentence, (0, 3, "ORG"), (0, 1, "LOC")) == \
        "@*ORG*#^LOC^서울#시청@ 앞"
    assert glue.mark_relation_entities(sentence, (0, 1, "LOC"), (0, 3, "ORG")) == \
        "#^ORG^@*LOC*서울@시청# 앞"
    assert glue.mark_relation_entities(sentence, (5, 5, "LOC"), (0, 3, "ORG")) == \
        "#^ORG^서울시청# @*LOC*앞@"
    # One span for both: nested too (the subject outside). Before, the object's markers
    # came first at both ends ("#^ORG^@*ORG*서울시청#@"), crossing.
    assert glue.mark_relation_entities(sentence, (0, 3, "ORG"), (0, 3, "ORG")) == \
        "@*ORG*#^ORG^서울시청#@ 앞"


def test_klue_re_markers_a_vocabulary_lacks_are_warned_about(tmp_path, caplog):
    """A vocabulary learned from a Korean corpus with only its characters (another tool's,
    or build_vocab --noascii_alphabet) may have no "*", "#" or "^": KLUE-RE's markers become [UNK]
    in every example. run_classifier says so, naming them, per split; before, they were
    only counted among the split's [UNK] tokens."""
    from bert_keras.finetuning.classification import ClassificationTask, ClassifierOptions
    from bert_keras.finetuning.runner import FinetuneOptions

    korean = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "@", ".", "은", "##에", "##서",
              "유", "##관", "##순", "1902", "##년", "천", "##안", "태", "##어", "##났", "##다",
              "p", "##er", "d", "##at", "l", "##oc"]
    dev = glue.get_processor("klue-re").load(KLUE, "dev").examples
    vocabularies = {"korean": korean, "punctuation": korean + ["*", "#", "^"]}
    task = ClassificationTask()
    opts = ClassifierOptions(task_name="klue-re", data_dir=KLUE)
    common = FinetuneOptions(output_dir=str(tmp_path / "out"), max_seq_length=32)
    found = {}
    for name, tokens in vocabularies.items():
        (tmp_path / name).mkdir()
        vocab = tmp_path / name / "vocab.txt"
        vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
        tokenizer = BertTokenizer(str(vocab), do_lower_case=True, strip_accents=False)
        # The reference: the marked sentence's pieces, one [UNK] per missing character.
        pieces = tokenizer.tokenize([dev[0].text_a])[0]
        found[name] = glue.relation_markers_not_in_vocabulary(tokenizer)
        assert pieces.count("[UNK]") == sum(dev[0].text_a.count(c) for c in found[name])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            task.convert(dev, tokenizer, list(glue.KLUE_RE_LABELS), common, opts, "eval")
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if found[name]:
            assert len(warned) == 1 and warned[0].startswith(
                "eval: the vocabulary has no token for '#', '*', '^' of KLUE-RE's entity "
                "markers"), warned
        else:
            assert not warned, warned
    assert found == {"korean": ["#", "*", "^"], "punctuation": []}
    # Another task's texts are not checked.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        task.convert(dev, tokenizer, list(glue.KLUE_RE_LABELS), common,
                     ClassifierOptions(), "eval")
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_klue_re_entities_that_do_not_fit_are_named(tmp_path):
    path = tmp_path / "klue-re-v1.1_train.json"
    row = {"guid": "g0", "sentence": "이순신은 아산 출신이다.",
           "subject_entity": {"word": "이순신", "start_idx": 0, "end_idx": 2, "type": "PER"},
           "object_entity": {"word": "아산", "start_idx": 5, "end_idx": 6, "type": "LOC"},
           "label": "per:origin"}

    def refused(changes, pattern):
        bad = json.loads(json.dumps(row))
        for key, value in changes.items():
            if value is None:
                del bad[key[0]][key[1]]
            else:
                bad[key[0]][key[1]] = value
        path.write_text(json.dumps([row, bad], ensure_ascii=False), encoding="utf-8")
        with pytest.raises(DataError, match=pattern):
            glue.get_processor("klue-re").train_examples(str(tmp_path))

    refused({("object_entity", "end_idx"): 13}, r"_train.json\[1\].object_entity: characters "
            r"5-13 are not in the 13-character sentence \(end_idx is inclusive\)$")
    refused({("subject_entity", "start_idx"): "0"}, r"\[1\].subject_entity.start_idx: expected "
            r"an integer, got '0'$")
    refused({("subject_entity", "type"): None}, r"\[1\].subject_entity.type: expected the "
            r"entity type")
    path.write_text(json.dumps([{**row, "label": "per:hometown"}]), encoding="utf-8")
    with pytest.raises(DataError, match=r"\[0\].label: label 'per:hometown' is not one of "):
        glue.get_processor("klue-re").train_examples(str(tmp_path))


def test_klue_re_words_unlike_their_characters_are_warned_about(tmp_path, caplog):
    """An entity whose "word" is not the sentence's characters start_idx..end_idx (an
    off-by-one file) is marked by the indices, as KLUE's baseline marks it, and counted in
    one warning per file naming the first; a file whose words agree warns nothing."""
    row = {"guid": "g0", "sentence": "이순신은 아산 출신이다.",
           "subject_entity": {"word": "이순신", "start_idx": 0, "end_idx": 2, "type": "PER"},
           "object_entity": {"word": "아산", "start_idx": 5, "end_idx": 6, "type": "LOC"},
           "label": "per:origin"}
    shifted = json.loads(json.dumps(row))
    shifted["object_entity"].update(start_idx=4, end_idx=5)  # " 아"
    path = tmp_path / "klue-re-v1.1_train.json"
    for rows, warned in (([row, row], []), ([row, shifted, shifted], ["2 entities"])):
        path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            examples = glue.get_processor("klue-re").train_examples(str(tmp_path))
        messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert [m for m in messages if "differs from the sentence" in m] == [
            m for m in messages if any(w in m for w in warned)] and len(messages) == len(warned)
        if warned:
            assert "[1].object_entity: '아산' vs ' 아'" in messages[0]
            assert examples[1].text_a == "@*PER*이순신@은#^LOC^ 아#산 출신이다."


def test_klue_re_scores_are_scikit_learns():
    """KLUE's baseline scores KLUE-RE with scikit-learn: f1_score(average="micro", labels=
    every relation but no_relation) and, per class, auc(precision_recall_curve), averaged.
    Random labels and logits (rounded, so scores tie), a class absent now and then."""
    import warnings

    from sklearn.metrics import auc, f1_score, precision_recall_curve

    from bert_keras.finetuning.classification import (average_precision_area,
                                                      relation_micro_f1, softmax)

    rng = np.random.default_rng(0)
    for trial in range(100):
        n, classes = int(rng.integers(2, 40)), int(rng.integers(2, 7))
        gold = rng.integers(0, classes, size=n)
        if trial % 4 == 0:
            gold[gold == classes - 1] = 0
        probabilities = softmax(np.round(rng.normal(size=(n, classes)), 1))
        with warnings.catch_warnings():  # an absent class: "No positive class found"
            warnings.simplefilter("ignore")
            areas = [auc(*precision_recall_curve(gold == c, probabilities[:, c])[1::-1])
                     for c in range(classes)]
        assert average_precision_area(gold, probabilities) == pytest.approx(np.mean(areas),
                                                                            abs=1e-12)
        predicted = probabilities.argmax(-1)
        assert relation_micro_f1(gold, predicted, 0) == pytest.approx(f1_score(
            gold, predicted, average="micro", labels=list(range(1, classes)),
            zero_division=0), abs=1e-12)


def test_nsmc_reads_reviews_with_quotes_and_empty_ones_and_evaluates_on_its_test_set():
    """NSMC (hand-written rows in its layout, tests/testdata/glue/nsmc): quotes are
    characters, an empty review is kept, the test file serves dev and test."""
    processor = glue.get_processor("NSMC")
    train = processor.load(task_dir("nsmc"), "train")
    assert [(e.text_a, e.text_b, e.label) for e in train.examples] == [
        ("시간 가는 줄 모르고 봤어요", None, "1"),
        ('"최고" 라는 말은 이 영화에 어울리지 않는다', None, "0"),
        ("", None, "0"),
        ("배우들 연기가 정말 좋았다 ㅎㅎ", None, "1")]
    assert train.ids == ["1001", "1002", "1003", "1004"]
    dev, test = processor.load(task_dir("nsmc"), "dev"), processor.load(task_dir("nsmc"), "test")
    assert dev.path == test.path == os.path.join(task_dir("nsmc"), "ratings_test.txt")
    assert [e.label for e in test.examples] == ["0", "1"] and processor.labels() == ["0", "1"]
    tokenizer = BertTokenizer(os.path.join(TESTDATA, "ft_vocab.txt"))
    features, _ = classification.convert_examples(train.examples, tokenizer,
                                                  processor.labels(), 8)
    assert features["input_mask"][2].sum() == 2  # the empty review: [CLS] [SEP]


def test_a_task_file_that_is_a_named_pipe_reads_as_the_same_file(tmp_path):
    """A data_dir whose train.tsv is a FIFO (mkfifo, fed by zcat): the text check and the
    line-end sniff drained it, and the task loaded no examples. Now those of the same bytes
    in a file (lone-"\\r" line ends: the sniff decides the split)."""
    from conftest import fifo

    data = "sentence\tlabel\rgood film\t1\rdull plot\t0\r".encode()
    (tmp_path / "file").mkdir()
    (tmp_path / "file" / "train.tsv").write_bytes(data)
    processor = glue.get_processor("sst-2")
    expected = processor.load(str(tmp_path / "file"), "train")
    assert [(e.text_a, e.label) for e in expected.examples] == [("good film", "1"),
                                                                ("dull plot", "0")]
    (tmp_path / "fifo").mkdir()
    with fifo(tmp_path / "fifo" / "train.tsv", data):
        got = processor.load(str(tmp_path / "fifo"), "train")
    assert [(e.where.replace("fifo", "file"), e.text_a, e.text_b, e.label)
            for e in got.examples] == [(e.where, e.text_a, e.text_b, e.label)
                                       for e in expected.examples]
