"""python -m data_prep.prepare_corpus: raw documents -> one sentence per line, blank line
between documents."""

import bz2
import gzip
import json
import os
import re

import pytest
from absl import flags
from absl.testing import flagsaver

from data_prep import prepare_corpus as pc


def run_cli(**flag_values):
    argv = ["prepare_corpus"] + [f"--{k}={v}" for k, v in flag_values.items()]
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(argv)
        return pc.main(argv[:1])


def documents_of(path):
    """The output as a list of documents, each a list of sentence lines."""
    text = open(path, encoding="utf-8").read()
    assert text.endswith("\n\n") and "\n\n\n" not in text
    return [block.split("\n") for block in text[:-2].split("\n\n")]


def test_text_files_one_document_each(tmp_path):
    raw = tmp_path / "raw"
    (raw / "sub").mkdir(parents=True)
    (raw / "b.txt").write_text("Mr. Smith went to Washington.  He arrived at 3 p.m.\n\n"
                               "A new paragraph starts here! Does it end?\n")
    (raw / "sub" / "c.txt").write_text("Only one sentence here")
    (raw / "a.txt").write_text("First file, first sentence. Second sentence\nwithout a stop\n")
    (raw / ".hidden.txt").write_text("Skipped.")
    out = tmp_path / "corpus.txt"
    assert run_cli(input=str(raw), output_file=str(out)) == 0
    assert documents_of(out) == [
        ["First file, first sentence.", "Second sentence", "without a stop"],
        ["Mr. Smith went to Washington.", "He arrived at 3 p.m.", "A new paragraph starts here!",
         "Does it end?"],
        ["Only one sentence here"],
    ]
    # --min_document_sentences drops documents that could only give NotNext instances.
    out2 = tmp_path / "corpus2.txt"
    assert run_cli(input=str(raw), output_file=str(out2), min_document_sentences=2) == 0
    assert len(documents_of(out2)) == 2


def test_jsonl_plain_and_gzip(tmp_path):
    rows = [{"id": 1, "body": "One doc. With two sentences."}, {"id": 2, "body": "Another one."}]
    plain = tmp_path / "docs.jsonl"
    plain.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    packed = tmp_path / "more.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write(json.dumps({"body": "Third doc here. It ends."}) + "\n")
    out = tmp_path / "corpus.txt"
    assert run_cli(input=f"{plain},{packed}", output_file=str(out), text_field="body") == 0
    assert documents_of(out) == [["One doc.", "With two sentences."], ["Another one."],
                                 ["Third doc here.", "It ends."]]


def test_jsonl_a_stray_cr_between_tokens_does_not_split_the_line(tmp_path):
    """A "\\r" between JSON tokens is whitespace and ends no line (universal newlines split
    the object and refused its halves as invalid JSON); gzip is read the same way."""
    plain = tmp_path / "docs.jsonl"
    plain.write_bytes(b'{"id": 1,\r"body": "One doc. Two."}\r\n{"body":\r"Third."}\n')
    packed = tmp_path / "more.jsonl.gz"
    with gzip.open(packed, "wb") as f:
        f.write(b'{"body": "Fourth here.",\r "id": 4}\n')
    out = tmp_path / "corpus.txt"
    assert run_cli(input=f"{plain},{packed}", output_file=str(out), text_field="body") == 0
    assert documents_of(out) == [["One doc.", "Two."], ["Third."], ["Fourth here."]]


# Characters str.splitlines ends a line at besides "\n"; Google's reader (tf.io.gfile) does not.
_PYTHON_LINE_BREAKS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def test_a_line_ends_where_googles_reader_ends_it(tmp_path):
    """A text document's lines end at "\\n" only, as tf.io.gfile's readline (Google's
    create_pretraining_data) ends them: str.splitlines cut "The cat sat\\ron the mat." into
    two sentences. The corpus tokenizes as Google's pipeline (tf.io.gfile's lines, then
    BasicTokenizer) tokenizes the raw file, and holds nothing any reader ends a line at."""
    tf = pytest.importorskip("tensorflow")
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    lines = [f"The cat sat{c}on the mat {i}." for i, c in enumerate(_PYTHON_LINE_BREAKS)]
    lines += ["A tab\there and a unit\x1fseparator.", "Windows ends this line.\r"]
    raw = tmp_path / "doc.txt"
    raw.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    out = tmp_path / "corpus.txt"
    assert run_cli(input=str(raw), output_file=str(out)) == 0
    assert documents_of(out) == [[
        "The cat saton the mat 0.", "The cat saton the mat 1.", "The cat saton the mat 2.",
        "The cat saton the mat 3.", "The cat saton the mat 4.", "The cat saton the mat 5.",
        "The cat saton the mat 6.", "The cat sat on the mat 7.", "The cat sat on the mat 8.",
        "A tab here and a unitseparator.", "Windows ends this line."]]
    basic = legacy.BasicTokenizer(do_lower_case=False)
    with tf.io.gfile.GFile(str(raw), "r") as f:
        google = [basic.tokenize(line) for line in f]
    with tf.io.gfile.GFile(str(out), "r") as f:
        ours = [basic.tokenize(line) for line in f if line.strip()]
    assert len(google) == len(lines) and ours == google
    text = out.read_text(encoding="utf-8")
    assert text.splitlines() == text.split("\n")[:-1]  # no line break but "\n" in it


def test_a_lone_cr_document_and_jsonl_text_follow_the_same_rule(tmp_path):
    """A file whose lines end in a lone "\\r" (classic Mac OS) is split at them, as every
    line reader splits it (files.newline_for); a JSONL document's text ends lines at "\\n"
    as a text file's do."""
    mac = tmp_path / "mac.txt"
    mac.write_bytes(b"First paragraph here\rand a second one.\r\rThird one.\r")
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "One line\r\nTwo lines\u2028here\u0085now\ncut."}) + "\n")
    out = tmp_path / "corpus.txt"
    assert run_cli(input=f"{mac},{docs}", output_file=str(out)) == 0
    assert documents_of(out) == [["First paragraph here", "and a second one.", "Third one."],
                                 ["One line", "Two lines herenow", "cut."]]

def test_jsonl_errors_name_the_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine."}\n{"text": broken\n')
    assert run_cli(input=str(path), output_file=str(tmp_path / "o.txt")) == 1
    assert f"{path}:2: not valid JSON" in capsys.readouterr().err
    path.write_text('{"body": "no text field."}\n')
    assert run_cli(input=str(path), output_file=str(tmp_path / "o.txt")) == 1
    err = capsys.readouterr().err
    assert "no string field 'text'" in err and "--text_field" in err
    # The field is there but holds no text: said so (before: "no string field 'text'
    # (fields: ['text']); set --text_field").
    for value, kind in (("5", "int"), ("null", "null")):
        path.write_text('{"text": "fine."}\n{"text": %s}\n' % value)
        assert run_cli(input=str(path), output_file=str(tmp_path / "o.txt")) == 1
        assert f"{path}:2: field 'text' holds {kind}, not text" in capsys.readouterr().err
    assert not (tmp_path / "o.txt").exists() and not (tmp_path / ".o.txt.incomplete").exists()


WIKI = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">
  <siteinfo><sitename>Wikipedia</sitename></siteinfo>
  <page>
    <title>Anarchism</title><ns>0</ns><id>12</id>
    <revision><id>1</id><text xml:space="preserve">{{Infobox|name=x}}
'''Anarchism''' is a [[political philosophy]] that rejects [[hierarchy|hierarchies]].&lt;ref&gt;{{cite web|url=x}}&lt;/ref&gt; It is usually placed on the left.
[[File:Flag.svg|thumb|A flag caption.]]
== History ==
{| class="wikitable"
|-
| cell one || cell two
|}
Early forms existed in [[Ancient Greece]]. See also &amp;amp; more.&lt;br&gt;Next line.
&lt;!-- a comment --&gt;
[[Category:Political philosophy]]
[[de:Anarchismus]]</text></revision>
  </page>
  <page>
    <title>AccessibleComputing</title><ns>0</ns><id>10</id><redirect title="Computer accessibility" />
    <revision><id>2</id><text xml:space="preserve">#REDIRECT [[Computer accessibility]]</text></revision>
  </page>
  <page>
    <title>Talk:Anarchism</title><ns>1</ns><id>13</id>
    <revision><id>3</id><text xml:space="preserve">Talk pages are not articles.</text></revision>
  </page>
  <page>
    <title>Albedo</title><ns>0</ns><id>39</id>
    <revision><id>4</id><text xml:space="preserve">'''Albedo''' is the measure of the diffuse reflection of sunlight. It is dimensionless.</text></revision>
  </page>
</mediawiki>
"""


def test_wikipedia_dump_streamed(tmp_path):
    dump = tmp_path / "enwiki-pages-articles.xml.bz2"
    dump.write_bytes(bz2.compress(WIKI.encode("utf-8")))
    out = tmp_path / "wiki.txt"
    assert run_cli(input=str(dump), output_file=str(out)) == 0
    docs = documents_of(out)
    assert docs == [
        ["Anarchism is a political philosophy that rejects hierarchies.",
         "It is usually placed on the left.",
         "Early forms existed in Ancient Greece.", "See also & more.", "Next line."],
        ["Albedo is the measure of the diffuse reflection of sunlight.", "It is dimensionless."],
    ]
    text = open(out).read()
    for debris in ("{{", "[[", "cell one", "caption", "History", "Category", "Anarchismus",
                   "comment", "Talk pages", "REDIRECT"):
        assert debris not in text


def test_not_a_wiki_dump(tmp_path, capsys):
    path = tmp_path / "x.xml"
    path.write_text("<html><body>hi</body></html>")
    assert run_cli(input=str(path), output_file=str(tmp_path / "o.txt")) == 1
    assert "expected a MediaWiki XML dump" in capsys.readouterr().err


def test_korean(tmp_path):
    path = tmp_path / "ko.txt"
    path.write_text("대한민국은 민주공화국이다. 대한민국의 주권은 국민에게 있고, 모든 권력은 "
                    "국민으로부터 나온다. 안녕하세요? 반갑습니다!", encoding="utf-8")
    out = tmp_path / "corpus.txt"
    assert run_cli(input=str(path), output_file=str(out), language="ko") == 0
    assert documents_of(out) == [["대한민국은 민주공화국이다.",
                                  "대한민국의 주권은 국민에게 있고, 모든 권력은 국민으로부터 나온다.",
                                  "안녕하세요?", "반갑습니다!"]]


@pytest.mark.parametrize("case", ["missing", "binary", "exists", "no_sentences", "language",
                                  "directory_output", "slash_output"])
def test_errors(tmp_path, capsys, case):
    out = tmp_path / "corpus.txt"
    path = tmp_path / "in.txt"
    if case == "missing":
        args, expected = {"input": str(tmp_path / "nope")}, "matches no file"
    elif case == "binary":
        path.write_bytes(b"abc\x00\x01\x02" * 100)
        args, expected = {"input": str(path)}, "looks binary"
    elif case == "exists":
        path.write_text("A sentence.")
        out.write_text("keep me")
        args, expected = {"input": str(path)}, "refusing to overwrite"
    elif case == "language":  # a name, not a code: sentencex split it as English
        path.write_text("좋다. 내일 봐요.")
        args, expected = ({"input": str(path), "language": "korean"},
                          "--language must be an ISO 639 code such as en or ko; received 'korean'")
    elif case == "directory_output":  # --overwrite deleted the directory (its own input)
        out = tmp_path / "raw"
        out.mkdir()
        (out / "doc.txt").write_text("A sentence. Another one.")
        args, expected = ({"input": str(out), "overwrite": True},
                          f"--output_file {out} is a directory; name the corpus file")
    elif case == "slash_output":  # "pc/", missing: written as a file named pc
        path.write_text("A sentence. Another one.")
        args, expected = ({"input": str(path)},
                          f"--output_file {tmp_path / 'pc'}/ is a directory; name the corpus "
                          f"file (e.g. {tmp_path / 'pc' / 'train.txt'})")
        out = f"{tmp_path / 'pc'}/"
    else:
        path.write_text(" . , ; \n\n ...")
        args, expected = {"input": str(path)}, "no document with at least 1 sentence"
    assert run_cli(output_file=str(out), **args) == 1
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    if case == "exists":
        assert out.read_text() == "keep me"
    elif case == "directory_output":
        assert (out / "doc.txt").read_text() == "A sentence. Another one."
    else:
        assert not os.path.exists(out)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".incomplete")]


@pytest.mark.parametrize("language, text, expected", [
    ("ko", "그는 “안녕하세요.”라고 말했다. 그리고 떠났다.",
     ["그는 “안녕하세요.”라고 말했다.", "그리고 떠났다."]),
    ("ko", '그는 "정말요?"라며 웃었다. 좋다.내일 비.',
     ['그는 "정말요?"라며 웃었다.', "좋다.", "내일 비."]),
    ("ko", "“정말요?” 그는 웃었다.", ["“정말요?”", "그는 웃었다."]),  # a space: a new sentence
    ("ja", "彼は「こんにちは。」と言った。それから帰った。",
     ["彼は「こんにちは。」と言った。", "それから帰った。"]),
    ("en", 'He said "Hello." Then he left.', ['He said "Hello."', "Then he left."]),
])
def test_a_quotation_followed_by_its_particle_stays_in_its_sentence(language, text, expected):
    """Korean and Japanese quote speech inside a sentence (`“...”라고 말했다`, `「...」と言った`);
    sentencex ended the sentence at the closing mark, so the particle began a "sentence"
    of its own and the quoted speech's sentence lost its verb."""
    assert pc.sentence_splitter(language)(text) == expected


def test_decomposed_korean_is_split_as_composed_korean_is():
    """macOS writes Hangul decomposed (NFD: conjoining jamo); the text is not normalised
    (Google's and transformers' tokenizers do not either), but its sentences are those of
    the composed text: the particle after a quotation began with a jamo, not a syllable, and
    became a sentence of its own ("라고 말했다.")."""
    import unicodedata

    text = "그는 “안녕하세요.”라고 말했다. 그리고 떠났다.\n좋다.내일 비.\n"
    split = pc.sentence_splitter("ko")
    composed = split(text)
    assert composed == ["그는 “안녕하세요.”라고 말했다.", "그리고 떠났다.", "좋다.", "내일 비."]
    decomposed = split(unicodedata.normalize("NFD", text))
    assert decomposed == [unicodedata.normalize("NFD", s) for s in composed]


def test_closing_quotes_stay_with_their_sentence_and_long_runs_are_split():
    split = pc.sentence_splitter("en", max_chars=200)
    text = ('They shall lay and collect taxes thereof." Such a provision would be wise. '
            "Then he left.")
    assert split(text) == ['They shall lay and collect taxes thereof."',
                           "Such a provision would be wise.", "Then he left."]
    # A run sentencex leaves joined (here: no space after the periods inside) is split again
    # at terminal punctuation + capital; a piece without any boundary at whitespace.
    run = " ".join(f"Clause {i} of the act applies to everyone;it is law.Part" for i in range(8))
    pieces = split(run + " " + "word " * 100)
    assert max(len(p) for p in pieces) <= 200
    nospace = lambda t: "".join(t.split())  # noqa: E731
    assert nospace("".join(pieces)) == nospace(run + "word " * 100)  # nothing lost


def test_sentences_joined_after_a_closing_quote_or_bracket_are_split():
    """Runs sentencex leaves joined in the State of the Union corpus (77 of 62,722 lines
    before this split); abbreviations without a closing quote stay whole."""
    split = pc.sentence_splitter("en")
    text = ('Its expenditures are referred to as "uncontrollable." And a large part goes to '
            "entitlements. [See the brackets.] I hope we agree. "
            "\u201cIt is done.\u201d 1912 was a year. Mr. Smith met Dr. Jones at 5 p.m. today.")
    assert split(text) == ['Its expenditures are referred to as "uncontrollable."',
                           "And a large part goes to entitlements.", "[See the brackets.]",
                           "I hope we agree.", "\u201cIt is done.\u201d", "1912 was a year.",
                           "Mr. Smith met Dr. Jones at 5 p.m. today."]


@pytest.mark.slow
def test_public_corpus_has_no_over_long_lines(tmp_path):
    """The State of the Union corpus the demo fetches: every line one bounded sentence, so
    create_pretraining_data's long-line warning (10,000 bytes) cannot fire."""
    from public_data.fetch import sotu_files

    out = tmp_path / "sotu.txt"
    docs = ((p.name, p.read_text(encoding="utf-8")) for p in sotu_files())
    stats = pc.write_corpus(docs, str(out), pc.sentence_splitter("en"))
    assert stats.documents_out > 200
    lines = out.read_text(encoding="utf-8").split("\n")
    assert max(len(line) for line in lines) <= pc.MAX_SENTENCE_CHARS
    # No `...word." Capital` left inside a line (77 were before the quoted-boundary split).
    joined = [line for line in lines if re.search(r"[a-z][.!?][\"\u201d')\]]+ +[A-Z]", line)]
    assert not joined, joined[:3]


def test_a_gz_corpus_passes_through_every_stage(tmp_path):
    """prepare_corpus --output_file=x.txt.gz writes gzip (before: plain text under that
    name, which create_pretraining_data refused as "Not a gzipped file"), and build_vocab
    reads .gz input as the other stages do (before: "not UTF-8 ... iconv")."""
    from data_prep import build_vocab

    raw = tmp_path / "raw.txt"
    raw.write_text("The whale swam. The sea was calm.\n\nA ship sailed. Its crew slept.\n")
    out = tmp_path / "corpus.txt.gz"
    assert run_cli(input=str(raw), output_file=str(out)) == 0
    with gzip.open(out, "rt", encoding="utf-8") as f:
        text = f.read()
    assert text == "The whale swam.\nThe sea was calm.\nA ship sailed.\nIts crew slept.\n\n"
    plain = tmp_path / "corpus.txt"
    plain.write_text(text)
    assert build_vocab.build_vocab([str(out)], 130, layout="compact", min_frequency=1) == \
        build_vocab.build_vocab([str(plain)], 130, layout="compact", min_frequency=1)
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(out.read_bytes()[:-12])
    with pytest.raises(build_vocab.BuildVocabError, match=r"^--input .*cut.txt.gz:\d+: cannot be "
                                                          r"read .*damaged or truncated$"):
        build_vocab.build_vocab([str(cut)], 130, layout="compact", min_frequency=1)


@pytest.mark.parametrize("case", ["cp949_late_jsonl", "cp949_text_gz", "utf16"])
def test_text_that_is_not_utf8_is_located_as_every_reader_locates_it(tmp_path, capsys, case):
    """The JSONL error gave an offset within the decoder's chunk (3434 for byte 28010), the
    text error no line, neither the way to convert the file, and UTF-16 read as a bad byte
    at offset 0; now file:line, the file's byte offset and the hint, as build_vocab says."""
    korean = "안녕하세요. 오늘은 날씨가 정말 좋네요."
    if case == "cp949_late_jsonl":
        path = tmp_path / "docs.jsonl"
        good = "".join(json.dumps({"text": f"Document {i} is fine."}) + "\n" for i in range(400))
        path.write_bytes(good.encode() + json.dumps({"text": korean}, ensure_ascii=False)
                         .encode("cp949") + b"\n")
        where = f"{path}:401: not UTF-8 (byte b'\\xbe' at byte offset {len(good) + 10})"
    elif case == "cp949_text_gz":
        path = tmp_path / "doc.txt.gz"
        good = "A first line.\nA second one.\n"
        path.write_bytes(gzip.compress(good.encode() + korean.encode("cp949")))
        where = f"{path}:3: not UTF-8 (byte b'\\xbe' at byte offset {len(good)})"
    else:
        path = tmp_path / "doc.txt"
        path.write_bytes(korean.encode("utf-16"))
        where = f"{path}:1: UTF-16 text (byte-order mark b'\\xff\\xfe')"
    assert run_cli(input=str(path), output_file=str(tmp_path / "corpus.txt")) == 1
    err = capsys.readouterr().err
    assert where in err and "iconv -f" in err, err
    assert not (tmp_path / "corpus.txt").exists()


def test_an_error_is_one_line_without_tensorflows_start_up_noise(tmp_path):
    """The error boundary imported TensorFlow to list its errors: a failing prepare_corpus,
    which never loads it, printed 10 lines of TensorFlow's start-up logs above its error."""
    import subprocess
    import sys

    path = tmp_path / "doc.txt"
    path.write_bytes("날씨가 좋네요.".encode("cp949"))
    result = subprocess.run([sys.executable, "-m", "data_prep.prepare_corpus",
                             f"--input={path}", f"--output_file={tmp_path / 'corpus.txt'}"],
                            capture_output=True, text=True, timeout=300,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if " prepare_corpus.py:" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:1: not UTF-8"), result.stderr


@pytest.mark.parametrize("ends", ["\n", "\r"])
def test_a_corpus_from_a_pipe_reads_as_the_same_file(tmp_path, ends):
    """--input=<(zcat corpus.gz): the line-end sniff drained the pipe, and the text and
    JSONL readers read nothing without an error (and --input refused the pipe as "matches
    no file"). Now the documents of the same bytes in a file, named after the pipe."""
    from conftest import piped
    from data_prep.files import TextFileError

    text = ends.join(["First sentence here.", "Second one.", "", "Another document.", ""])
    jsonl = ends.join(['{"text": "One doc."}', '{"text": "Two\\ndocs."}', ""])
    for data, kind in ((text, "text"), (jsonl, "jsonl")):
        regular = tmp_path / f"corpus.{kind}"
        regular.write_bytes(data.encode())
        expected = list(pc.iter_documents([str(regular)], kind, "text"))
        assert expected and all(doc for _, doc in expected)
        with piped(data.encode()) as path:
            assert pc.expand_inputs(path) == [path]
            got = list(pc.iter_documents([path], kind, "text"))
        assert [(name.replace(path, str(regular)), doc) for name, doc in got] == expected
    with piped(b"ok\n\x00\n") as path:
        with pytest.raises(TextFileError, match=rf"^{path}:2: NUL byte"):
            list(pc.read_text_documents([path]))


@pytest.mark.parametrize("line,error,message", [
    (b'["a list"]', "CorpusError", "corpus.jsonl:2: expected a JSON object per line, got list"),
    (b'{"text": "x"', "CorpusError", "corpus.jsonl:2: not valid JSON"),
    (b'{"text": "a\x00b"}', "TextFileError", "corpus.jsonl:2: NUL byte"),
])
def test_a_bad_jsonl_line_is_named_by_file_and_line(tmp_path, line, error, message):
    """The JSONL reader (`files.json_object_lines`, shared with the classification reader):
    a line that is not a JSON object, not JSON, or holds a NUL byte is refused naming its
    file and line, after the good line before it was read."""
    from data_prep.files import TextFileError

    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"text": "One doc."}\n' + line + b"\n")
    expected = {"CorpusError": pc.CorpusError, "TextFileError": TextFileError}[error]
    with pytest.raises(expected) as raised:
        list(pc.iter_documents([str(path)], "jsonl", "text"))
    assert type(raised.value) is expected
    assert str(raised.value).startswith(f"{tmp_path}/{message}"), str(raised.value)
