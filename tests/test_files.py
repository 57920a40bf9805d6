"""The one atomic writer: nothing appears until complete, leftovers of dead processes go."""

import bz2
import gzip
import json
import os
import re
import subprocess
import sys

import pytest

from data_prep import files
from data_prep.cli import ToolError


def test_nothing_appears_when_the_writer_fails(tmp_path):
    final = tmp_path / "out.txt"
    with pytest.raises(RuntimeError):
        with files.atomic_output(str(final)) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_a_failed_write_takes_back_the_directories_it_created(tmp_path):
    (tmp_path / "kept").mkdir()
    target = tmp_path / "kept" / "new" / "deeper" / "out.txt"
    with pytest.raises(RuntimeError):
        with files.atomic_output(str(target)) as tmp:
            open(tmp, "w").write("partial")
            raise RuntimeError("writer failed")
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []
    files.write_text(str(target), "done\n")  # a write that succeeds keeps them
    assert target.read_text() == "done\n"
    created = files.make_parent_dirs([str(tmp_path / "a" / "b" / "x"), str(tmp_path / "a" / "y")])
    assert created == [str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    (tmp_path / "a" / "b" / "someone_elses").write_text("")
    files.remove_created_dirs(created)  # a directory something else wrote into stays
    assert os.listdir(tmp_path / "a") == ["b"]


def test_refuses_existing_output_unless_asked(tmp_path):
    final = tmp_path / "out.txt"
    final.write_text("keep")
    with pytest.raises(files.OutputExistsError, match="out.txt exists; pass --x to replace it"):
        files.write_text(str(final), "new", overwrite=False, hint="pass --x to replace it")
    assert final.read_text() == "keep"
    files.write_text(str(final), "new")
    assert final.read_text() == "new" and os.listdir(tmp_path) == ["out.txt"]


def test_a_file_output_never_replaces_a_directory(tmp_path):
    """A file's path that is a directory (`--output=models/`): refused even when replacing
    was asked for, before the work and again before the rename; before, --overwrite
    renamed the directory aside and deleted it with everything in it."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(files.OutputExistsError, match=r"models is a directory, and the output "
                                                          r"is a file: name a file"):
            files.write_text(str(models), "new", overwrite=overwrite)
    # A directory made while the output was being written is refused at the rename.
    with pytest.raises(files.OutputExistsError, match="later is a directory"):
        with files.atomic_output(str(tmp_path / "later"), overwrite=True) as tmp:
            open(tmp, "w").write("new")
            (tmp_path / "later").mkdir()
    assert (models / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["later", "models"]


def test_directory_outputs_replace_atomically(tmp_path):
    final = tmp_path / "model"
    with files.atomic_output(str(final), directory=True) as tmp:
        open(os.path.join(tmp, "a"), "w").write("1")
    with files.atomic_output(str(final), overwrite=True, directory=True) as tmp:
        open(os.path.join(tmp, "b"), "w").write("2")
    assert os.listdir(final) == ["b"] and os.listdir(tmp_path) == ["model"]


def test_a_directory_output_named_with_a_trailing_slash(tmp_path):
    """convert_checkpoint --to=keras --output=new/ (a directory not there yet) created new/
    as the temporary's parent, refused it as existing, and left it behind."""
    with files.atomic_output(str(tmp_path / "new") + os.sep, directory=True) as tmp:
        open(os.path.join(tmp, "a"), "w").write("1")
    assert os.listdir(tmp_path) == ["new"] and os.listdir(tmp_path / "new") == ["a"]
    with pytest.raises(files.OutputExistsError):
        with files.atomic_output(str(tmp_path / "new") + os.sep, directory=True):
            pass


def test_leftovers_of_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    final = tmp_path / "out.txt"
    # A process that exits without cleaning up, like one killed with SIGKILL.
    code = ("import os, sys; from data_prep import files; "
            "open(files.temp_path(sys.argv[1]), 'w').write('half'); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(final)], check=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".incomplete-")]
    assert len(leftovers) == 1 and files.is_temp_name(leftovers[0])
    # A live process's temporary file is never touched.
    mine = files.temp_path(str(tmp_path / "other.txt"))
    open(mine, "w").write("in progress")
    files.write_text(str(final), "done")
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(mine), "out.txt"]


def test_outputs_respect_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        files.write_json(str(tmp_path / "a.json"), {"x": 1})
        with files.atomic_output(str(tmp_path / "d"), directory=True):
            pass
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o750


def _write_data(path, data: bytes) -> None:
    """`data` into `path`, compressed as its name says (.gz, .bz2)."""
    name = str(path)
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else
                     bz2.compress(data) if name.endswith(".bz2") else data)


def _readers(tmp_path):
    """(name, text of a small input, function reading it from a path) for every reader of
    user data; each input starts with the field, label or token a leading BOM would join."""
    from bert_keras import extract_features, model_loading
    from bert_keras.config import BertConfig
    from data_prep import (build_vocab, classification, glue, prepare_corpus, squad, tagging,
                           tokenizer_config)

    squad_json = ('{"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": '
                  '"Seoul is big.", "qas": [{"id": "q1", "question": "What is big?", '
                  '"answers": [{"text": "Seoul", "answer_start": 0}]}]}]}]}')

    def sst2(path):
        os.makedirs(tmp_path / "SST-2", exist_ok=True)
        os.replace(path, tmp_path / "SST-2" / "train.tsv")
        return [(e.text_a, e.label) for e in glue.get_processor("sst-2").train_examples(
            str(tmp_path / "SST-2"))]

    return [
        ("jsonl", '{"text": "좋아요", "label": "pos"}\n',
         lambda p: [(e.text_a, e.label) for e in classification.read_examples(p)]),
        ("csv", "text,label\n좋아요,pos\n",
         lambda p: [(e.text_a, e.label) for e in classification.read_examples(p)]),
        ("tsv", "text\tlabel\n좋아요\tpos\n",
         lambda p: [(e.text_a, e.label) for e in classification.read_examples(p)]),
        ("tsv", "sentence\tlabel\nfine film\t1\n", sst2),
        ("json", squad_json, lambda p: [(e.question, e.answer_text, e.start_word)
                                        for e in squad.read_squad(p, is_training=True)[0]]),
        ("conll", "Seoul B-LOC\nis O\n",
         lambda p: [(s.words, s.tags) for s in tagging.read_conll(p)]),
        ("txt", "neg\npos\n", model_loading.read_labels),
        ("txt", "Seoul is big. ||| It is.\n", extract_features.read_input),
        ("jsonl", '{"text": "Seoul is big."}\n',
         lambda p: list(prepare_corpus.read_jsonl_documents([p], "text"))[0][1]),
        # The JSON files next to a model or vocabulary, read by files.read_json.
        ("json", '{"do_lower_case": false, "strip_accents": false}\n',
         lambda p: tokenizer_config.read_file(p)[0]),
        ("json", json.dumps(BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=24).to_dict()),
         lambda p: BertConfig.from_json_file(p)),
        # Compressed corpora, decompressed by files.open_input for every reader of them.
        ("txt.gz", "Seoul is big.\n", lambda p: list(build_vocab.iter_lines([p]))),
        ("txt.bz2", "Seoul is big.\n\nIt is.\n",
         lambda p: list(prepare_corpus.read_text_documents([p]))[0][1]),
    ]


@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
def test_every_corpus_reader_reads_a_compressed_file_as_the_file_itself(tmp_path, suffix):
    """prepare_corpus read .bz2 (Wikimedia's dumps) but build_vocab and create_pretraining_data
    read it undecompressed ("not UTF-8 (byte b'\\x9c' ...)"); one opener for all of them."""
    from data_prep import build_vocab, pretraining_job

    text = "Seoul is big.\nIt is old.\n\n서울은 크다.\n"
    plain, packed = tmp_path / "c.txt", tmp_path / f"c.txt{suffix}"
    plain.write_text(text, encoding="utf-8")
    _write_data(packed, text.encode())
    lines = [list(build_vocab.iter_lines([str(p)])) for p in (plain, packed)]
    assert lines[0] == lines[1] == ["Seoul is big.\n", "It is old.\n", "\n", "서울은 크다.\n"]
    documents = [[d.lines for d in pretraining_job.read_documents([str(p)])]
                 for p in (plain, packed)]
    assert documents[0] == documents[1] == [["Seoul is big.", "It is old."], ["서울은 크다."]]


def test_a_byte_order_mark_is_not_part_of_the_data(tmp_path):
    """Excel's "CSV UTF-8" and Windows Notepad write a BOM first: each reader reads such a
    file as the same file without it. Before, a .csv's header read '\\ufefftext' ("missing
    field 'text'"), JSON failed to parse, and a first label or token carried the BOM."""
    for i, (ext, text, read) in enumerate(_readers(tmp_path)):
        plain, marked = tmp_path / f"plain{i}.{ext}", tmp_path / f"marked{i}.{ext}"
        _write_data(plain, text.encode("utf-8"))
        _write_data(marked, text.encode("utf-8-sig"))
        assert read(str(marked)) == read(str(plain)), (ext, text)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_text_is_named_as_such(tmp_path, encoding):
    """Excel's "Unicode text" (a TSV) and Notepad's "Unicode" save UTF-16 with a byte-order
    mark: the error says so and how to convert, not "NUL byte ... looks binary"."""
    from data_prep import classification
    from data_prep.files import TextFileError

    path = tmp_path / "train.tsv"
    text = "text\tlabel\n좋아요\tpos\n"
    path.write_bytes(("" if encoding == "utf-16" else "\ufeff").encode(encoding) +
                     text.encode(encoding))  # "utf-16" writes the mark itself
    for read in (files.check_text_file, classification.read_examples):
        with pytest.raises(TextFileError, match=r"train.tsv:1: UTF-16 text \(byte-order mark "
                           r".*\); expected UTF-8 text \(convert it: iconv -f utf-16 -t utf-8"):
            read(str(path))


@pytest.mark.parametrize("kind", ["utf-16", "nul", "cp949"])
def test_every_text_reader_refuses_text_that_is_not_utf8_naming_file_and_line(tmp_path, kind):
    """The same message from every reader (files.check_text_line). Before, a label list in
    UTF-16 or cp949 gave Python's codec message, and one with a NUL byte was read as the
    label 'ne\\x00g'."""
    from data_prep.files import TextFileError

    expected = {"utf-16": r":1: UTF-16 text", "nul": r":1: NUL byte at byte offset 1: the "
                "file looks binary", "cp949": r":1: not UTF-8 \(byte b'\\xc1' at byte offset 0"}
    for i, (ext, text, read) in enumerate(_readers(tmp_path)):
        path = tmp_path / f"bad{i}.{ext}"
        if kind == "utf-16":
            _write_data(path, text.encode("utf-16"))
        elif kind == "nul":
            _write_data(path, text[:1].encode() + b"\x00" + text[1:].encode())
        else:  # a first line in cp949: '좋' is b'\xc1\xc1'
            _write_data(path, "좋은\n".encode("cp949") + text.encode())
        with pytest.raises(Exception) as err:
            read(str(path))
        message = str(err.value)
        assert re.search(expected[kind], message), (ext, text, message)
        named = f"bad{i}.{ext}" if "SST-2" not in message else "SST-2/train.tsv"
        assert named in message and isinstance(err.value, (TextFileError, ToolError)), \
            (ext, text, message)


def test_every_json_reader_words_a_bad_file_alike(tmp_path):
    """tokenizer_config.json, bert_config.json, transformers' config.json, SQuAD's JSON and a
    shard's sidecar are read by one reader (files.read_json): the same damaged file gives
    the same words, naming its line and column. Before, four readers worded it four ways
    ("(Expecting value at line 2)", "(Expecting value: line 2 column 7 (char 15))",
    "sidecar ... is not valid JSON: ...", "...:2: not valid JSON (Expecting value)")."""
    from bert_keras import checkpoints
    from bert_keras.config import BertConfig
    from data_prep import classification, features, tokenizer_config

    readers = {
        "tokenizer_config.json": tokenizer_config.read_file,
        "bert_config.json": BertConfig.from_json_file,
        "config.json": checkpoints.read_hf_config,
        "squad.json": classification.load_json,
        "shard.tfrecord.meta.json": lambda p: features.read_sidecar(p[:-len(".meta.json")]),
    }
    for name, read in readers.items():
        path = tmp_path / name
        path.write_text('{"a": 1,\n  "b": }\n')
        with pytest.raises(ValueError) as err:
            read(str(path))
        assert f"{path}:2: not valid JSON (Expecting value at column 8)" in str(err.value), name
        path.write_text("\n \n")
        with pytest.raises(ValueError, match=f"{re.escape(str(path))}: empty file, no JSON in it"):
            read(str(path))


def test_line_ends_are_judged_past_a_long_first_line(tmp_path):
    """A file is judged lone-"\\r"-ended or not by its start read on to a line end
    (files.line_end_sample): its first 64 KiB held no line end when its first line was
    longer (a JSONL record of a long article), and such a file read as one line; a
    "\\r\\n" cut after its "\\r" by the 64 KiB counted as a lone "\\r"."""
    from data_prep import prepare_corpus

    long = "word " * 14_000  # 70,000 bytes: past the first 64 KiB
    cases = {  # name -> (bytes, whether its lines end in a lone "\r")
        "mac.jsonl": (f'{{"text": "{long}"}}\r{{"text": "Second."}}\r', True),
        "mac.txt.gz": (f"{long}\rSecond paragraph.\r", True),
        "unix.txt": (f"{long}\nSecond paragraph.\n", False),
        "cut_crlf.txt": ("x" * (64 * 1024 - 1) + "\r\ny\r\n", False),
        "one_line.txt": (long, False),
    }
    for name, (text, lone_cr) in cases.items():
        _write_data(tmp_path / name, text.encode())
        assert files.ends_lines_in_lone_cr(str(tmp_path / name)) is lone_cr, name
        assert files.newline_for(str(tmp_path / name)) == ("" if lone_cr else "\n")
    # pyarrow's JSON reader (Hugging Face datasets') reads the records as the JSONL reader now
    # does; before, "Extra data" at line 1.
    pa_json = pytest.importorskip("pyarrow.json")
    expected = pa_json.read_json(str(tmp_path / "mac.jsonl")).column("text").to_pylist()
    assert [text for _, text in prepare_corpus.read_jsonl_documents(
        [str(tmp_path / "mac.jsonl")], "text")] == expected == [long, "Second."]
    [(_, text)] = prepare_corpus.read_text_documents([str(tmp_path / "mac.txt.gz")])
    assert prepare_corpus.sentence_splitter("en")(text)[-1] == "Second paragraph."


def test_the_line_end_sample_is_bounded(tmp_path):
    """Read on in `sniff_bytes` steps to the first line end and one byte past a final
    "\\r", never past `limit`: a file without line ends is not read whole."""
    import io

    class Counting(io.BytesIO):
        def read(self, size=-1):
            data = super().read(size)
            self.taken = getattr(self, "taken", 0) + len(data)
            return data

    for data, sniff, limit, expected in [
            (b"a" * 50, 7, 23, b"a" * 23),  # no line end: stops at the limit
            (b"abcdefghij\rklm\n", 4, 100, b"abcdefghij\rk"),  # on to the \r, then 1 byte
            (b"abc\r\r\nxyz", 4, 100, b"abc\r\r\n"),  # "\r" after "\r": one more
            (b"ab\ncd\ref", 4, 100, b"ab\nc"),  # a line end at once: 4 bytes only
            (b"abcdefg", 3, 100, b"abcdefg"),  # the end of the file
    ]:
        f = Counting(data)
        assert files.line_end_sample(f, sniff, limit) == expected, data
        assert f.taken == len(expected) <= limit


def test_a_pipe_is_copied_once_for_readers_that_open_it_again(tmp_path):
    """bash's <(zcat corpus.gz) is a /dev/fd/<n> whose bytes come to one read: `rereadable`
    copies them once, so that a check, a sniff and the read each see them all; a file, a
    missing path and a remote path are left as they are (no stat there)."""
    from conftest import piped

    data = b"first line\rsecond line\r"
    with piped(data) as path:
        assert files.is_pipe(path)
        with files.rereadable(path) as source:
            assert source != path and not files.is_pipe(source)
            assert files.ends_lines_in_lone_cr(source)  # the sniff, then the read
            with open(source, "rb") as f:
                assert f.read() == data
            copy = source
        assert not os.path.exists(copy) and not os.path.exists(os.path.dirname(copy))
    regular = tmp_path / "a.txt"
    regular.write_bytes(data)
    for path in (str(regular), str(tmp_path / "missing.txt"), "ram://bucket/a.txt",
                 str(tmp_path)):
        assert not files.is_pipe(path)
        with files.rereadable(path) as source:
            assert source == path
    assert files.is_pipe("/dev/null")  # a device: read as the empty file it gives
    with files.rereadable("/dev/null") as source:
        assert os.path.getsize(source) == 0


def test_a_named_pipe_keeps_its_name_so_a_gz_one_is_decompressed(tmp_path):
    """mkfifo corpus.txt.gz: the copy keeps the base name, so `open_input` reads it
    decompressed as it reads a file of that name; a check names the pipe, not the copy."""
    from conftest import fifo

    with fifo(tmp_path / "corpus.txt.gz", gzip.compress(b"x\ny\n")) as path:
        with files.rereadable(str(path)) as source:
            assert os.path.basename(source) == "corpus.txt.gz"
            with files.open_input(source) as f:
                assert f.read() == "x\ny\n"
    binary = tmp_path / "copy.txt"
    binary.write_bytes(b"ok\nbad\x00\n")
    with pytest.raises(files.TextFileError, match=r"^/dev/fd/63:2: NUL byte at byte offset 6"):
        files.check_text_file(str(binary), name="/dev/fd/63")



def _copy_refusal():
    """(the pipe's name, the one line a tool prints) for `files.rereadable` refusing to copy
    a pipe of a few bytes (the copy's failure is patched in by the caller)."""
    from conftest import piped
    from data_prep import cli

    with piped(b"some text\n") as path:
        with pytest.raises(files.PipeCopyError) as raised:
            with files.rereadable(path):
                pass
    return path, cli.describe_error(raised.value)


def test_a_pipe_that_finds_no_room_for_its_copy_says_so_in_one_line(monkeypatch):
    """A full temporary directory: one line naming the pipe, the directory and what to do
    (not an output's "cannot be written"), and the partial copy is removed."""
    import errno
    import tempfile

    made = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    def full(source, target, length=0):
        target.write(source.read(3))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(files.shutil, "copyfileobj", full)
    path, message = _copy_refusal()
    assert message == (
        f"{path} is a pipe, read once into a copy in {made[0]}, which failed: no space left "
        "on device; set TMPDIR to a disk with room, or give a file")
    assert not os.path.exists(made[0])


def test_a_pipe_whose_copy_would_fill_the_disk_stops_with_one_line(tmp_path, monkeypatch):
    """A pipe has no size to check before its copy: `rereadable` copied an endless
    `<(zcat ...)` until the disk was full. Now it checks the free space as it writes and
    stops where the next MiB would leave less than its reserve free (here a fake disk of
    3 MB, 1 MB kept free), naming the pipe, the directory and the free space; the partial
    copy is removed."""
    import tempfile

    from conftest import fifo
    from data_prep import cli

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = b"0123456789abcdef\n" * (3 * (1 << 20) // 17)  # 3 MiB: more than one chunk
    spent = lambda d: sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))  # noqa
    with fifo(tmp_path / "corpus.txt", data) as path:
        with pytest.raises(files.PipeCopyError) as raised:
            with files.rereadable(str(path), reserve_bytes=1_000_000,
                                  free_bytes=lambda d: 3_000_000 - spent(d)):
                pass
    # 1 MiB copied (3.0 - 1.05 MB free = 1.95 MB), the next would leave 0.9 MB.
    stage = re.search(r"copy in (\S+),", str(raised.value)).group(1)
    assert os.path.dirname(stage) == str(tmp_path)
    assert cli.describe_error(raised.value) == (
        f"{path} is a pipe, read once into a copy in {stage}, "
        "which stopped after 1.0 MB: 2.0 MB free there, and the copy leaves 1.0 MB free; set "
        "TMPDIR to a disk with room, or give a file")
    assert not [d for d in os.listdir(tmp_path) if d.startswith("bert-keras-pipe-")]
    # Room enough: the whole pipe, with the default reserve.
    with fifo(tmp_path / "small.txt", data[:4096]) as path:
        with files.rereadable(str(path)) as source:
            with open(source, "rb") as f:
                assert f.read() == data[:4096]


def test_a_pipe_whose_temporary_directory_cannot_be_made_says_so_in_one_line(monkeypatch,
                                                                            tmp_path):
    """$TMPDIR naming no directory: one line naming the pipe, the directory and what to do,
    not mkdtemp's traceback."""
    import tempfile

    missing = str(tmp_path / "no-such-dir")
    monkeypatch.setattr(tempfile, "tempdir", missing)
    path, message = _copy_refusal()
    assert message == (
        f"{path} is a pipe, read once into a copy in the temporary directory {missing}, "
        "which cannot be made there: no such file or directory; set TMPDIR to a writable "
        "disk with room, or give a file")


# The one file that names a document as text on purpose: batching_parameters.txt's header is
# written beside an export and compared as text with another export's (`check_beside`), so it
# must not hold the writing machine's path.
_DOC_NAMED_AS_TEXT = {"export/batching_parameters.py"}


def _cited_docs():
    """(file:line, document name, how) of every document the packages' messages and --help
    texts cite: `files.doc_path("<name>")` calls, `docs/<name>.md` in a module docstring (a
    tool's --help, through `files.cite_docs`), and `docs/<name>.md` written in any other
    string (which a user of an installed copy could not open)."""
    import ast

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for package in ("bert_keras", "data_prep", "export"):
        for folder, dirs, names in os.walk(os.path.join(repo, package)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "docs")]
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, repo)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                              if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                   ast.AsyncFunctionDef))
                              and node.body and isinstance(node.body[0], ast.Expr)
                              and isinstance(node.body[0].value, ast.Constant)}
                module_doc = ast.get_docstring(tree, clean=False) or ""
                for doc in re.findall(r"\bdocs/([\w.-]+\.md)\b", module_doc):
                    found.append((f"{rel}:1", doc, "help"))
                for node in ast.walk(tree):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == "doc_path"):
                        (arg,) = node.args
                        found.append((f"{rel}:{node.lineno}", arg.value, "doc_path"))
                    elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                          and id(node) not in docstrings):
                        for doc in re.findall(r"\bdocs/([\w.-]+\.md)\b", node.value):
                            found.append((f"{rel}:{node.lineno}", doc,
                                          "text" if rel not in _DOC_NAMED_AS_TEXT else "file"))
    return found


def test_every_document_a_message_cites_exists_where_it_says():
    """Messages cited `docs/<name>.md`, which a `pip install .` copy has nowhere (the wheel
    holds bert_keras/docs, tests/test_installed_package.py): they cite `files.doc_path`, the
    path this copy holds, and a tool's --help its docstring's documents through
    `files.cite_docs`."""
    cited = _cited_docs()
    kinds = {how for _, _, how in cited}
    assert {"help", "doc_path"} <= kinds  # the scan sees both ways of citing
    written = [(where, doc) for where, doc, how in cited if how == "text"]
    assert not written, f"cite documents through files.doc_path: {written}"
    for where, doc, _ in cited:
        assert os.path.isfile(files.doc_path(doc)), f"{where} cites {doc}, which is missing"
    assert files.cite_docs("see docs/serving.md and docs/DESIGN.md section 6.") == (
        f"see {files.doc_path('serving.md')} and {files.doc_path('DESIGN.md')} section 6.")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert files.doc_path("serving.md") == os.path.realpath(
        os.path.join(repo, "docs", "serving.md"))


def test_a_scheme_is_refused_exactly_where_tensorflows_file_systems_do_not_serve_it(tmp_path):
    """`unserved_scheme` agrees with tf.io.gfile itself: what it refuses, gfile fails on
    with UnimplementedError (the traceback the tools gave); what it passes, gfile reads
    (gs:// only by its registration: no network here)."""
    import tensorflow as tf

    (tmp_path / "x.txt").write_text("x\n")
    refused = ["kaggle://keras/bert/keras/bert_tiny_en_uncased", "hf://google-bert/bert-base",
               "https://tfhub.dev/google/bert/4", "http://example.com/v.txt",
               "HF://a/b", "s3.x://b/k"]
    for path in refused:
        reason = files.unserved_scheme(path)
        assert reason is not None and "nothing here downloads at run time" in reason, path
        assert reason.startswith(path.split("://")[0] + ":// is not a file system"), reason
        with pytest.raises(tf.errors.UnimplementedError):
            tf.io.gfile.exists(path)
    assert "kagglehub" in files.unserved_scheme(refused[0])
    assert "huggingface-cli download" in files.unserved_scheme(refused[1])
    assert "TF Hub's models are on Kaggle" in files.unserved_scheme(refused[2])
    for path in ("ram://bucket/x", f"file://{tmp_path}/x.txt", str(tmp_path / "x.txt"),
                 "relative/x.txt"):
        assert files.unserved_scheme(path) is None, path
        tf.io.gfile.exists(path)  # no error
    assert "gs" in tf.io.gfile.get_registered_schemes()
    assert files.unserved_scheme("gs://bucket/model") is None
    assert tf.io.gfile.exists(f"file://{tmp_path}/x.txt")


def test_a_beam_pipelines_paths_may_be_on_beams_file_systems():
    """With a Beam --runner, create_pretraining_data's --input_file and --output_file are
    read and written by Beam's file systems (docs/beam.md: s3://, hdfs://), which TensorFlow's
    do not serve; its --vocab_file, read by the launcher, and a hub handle stay refused."""
    from absl import flags

    from data_prep import cli

    pytest.importorskip("apache_beam")

    def check(*argv):
        fv = flags.FlagValues()
        for name in ("input_file", "output_file", "vocab_file"):
            flags.DEFINE_string(name, None, "", flag_values=fv)
        flags.DEFINE_string("runner", "local", "", flag_values=fv)
        fv(["tool", *argv])
        cli.refuse_unserved_schemes(fv)

    check("--runner=DirectRunner", "--input_file=s3://b/corpus/*.txt,hdfs://h/c.txt",
          "--output_file=s3://b/data/train", "--vocab_file=gs://b/vocab.txt")
    for argv, subject in (
            (["--input_file=s3://b/corpus/*.txt"], "--input_file: s3://b/corpus/*.txt: "),
            (["--runner=DirectRunner", "--vocab_file=s3://b/vocab.txt"],
             "--vocab_file: s3://b/vocab.txt: s3:// is not a file system"),
            (["--runner=DirectRunner", "--input_file=kaggle://a/b"],
             "--input_file: kaggle://a/b: kaggle:// is not a file system")):
        with pytest.raises(cli.InputError) as raised:
            check(*argv)
        assert str(raised.value).startswith(subject), raised.value


def test_an_output_that_is_an_input_is_refused_by_any_name(tmp_path):
    """The same file through a link or another spelling of its path is the input; another
    file, or an output not there yet, is not."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a line\n")
    link = tmp_path / "link.txt"
    link.symlink_to(corpus)
    other = tmp_path / "other.txt"
    other.write_text("x\n")
    for output in (str(link), str(tmp_path / "." / "corpus.txt")):
        with pytest.raises(files.OutputExistsError, match=r"^--output .* is an input \(--input "
                           + re.escape(str(corpus)) + r"\): writing it would replace"):
            files.refuse_an_input(output, "--output", [str(other), str(corpus)], "--input")
    files.refuse_an_input(str(other), "--output", [str(corpus)], "--input")
    files.refuse_an_input(str(tmp_path / "new.txt"), "--output", [str(corpus)], "--input")
    assert corpus.read_text() == "a line\n"
