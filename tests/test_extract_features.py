"""extract_features: Google's JSONL layout and .npz, values equal to the encoder's layers."""

import json
import os

import numpy as np
import pytest

from bert_keras import BertEncoder, extract_features
from conftest import TESTDATA
from data_prep.classification import DataError

VOCAB = os.path.join(TESTDATA, "ft_vocab.txt")
VOCAB_SIZE = sum(1 for _ in open(VOCAB, encoding="utf-8"))
SMALL = dict(vocab_size=VOCAB_SIZE, num_layers=3, hidden_size=8, num_heads=2,
             intermediate_size=12, max_sequence_length=24)


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("enc") / "encoder.keras")
    BertEncoder(**SMALL).save(path)
    return path


def ids_of(*tokens):
    vocab = [line.rstrip("\n") for line in open(VOCAB, encoding="utf-8")]
    return [vocab.index(t) for t in tokens]


def reference_layers(encoder_file, ids, types):
    import keras

    encoder = keras.models.load_model(encoder_file)
    x = {"input_word_ids": np.array([ids], np.int32), "input_mask": np.ones((1, len(ids)), np.int32),
         "input_type_ids": np.array([types], np.int32)}
    return [np.asarray(layer)[0] for layer in encoder(x)["encoder_outputs"]]


def test_jsonl_and_npz_match_the_encoder(tmp_path, encoder_file):
    text = tmp_path / "input.txt"
    text.write_text("John Smith was born\nthe leader ||| unwanted running\n")
    out = str(tmp_path / "features.jsonl")
    result = extract_features.run(str(text), out, encoder_file, vocab_file=VOCAB, layers=["-1", "0"],
                                  max_seq_length=10)
    assert result == {"examples": 2, "truncated": 0, "layers": [-1, 0], "output_file": out}
    lines = [json.loads(line) for line in open(out)]
    assert [line["linex_index"] for line in lines] == [0, 1]
    tokens = [f["token"] for f in lines[1]["features"]]
    assert tokens == ["[CLS]", "the", "leader", "[SEP]", "un", "##want", "##ed", "runn", "##ing", "[SEP]"]
    reference = reference_layers(encoder_file, ids_of(*tokens), [0] * 4 + [1] * 6)
    for t, feature in enumerate(lines[1]["features"]):
        assert [layer["index"] for layer in feature["layers"]] == [-1, 0]
        np.testing.assert_allclose(feature["layers"][0]["values"], reference[-1][t], atol=2e-6)
        np.testing.assert_allclose(feature["layers"][1]["values"], reference[0][t], atol=2e-6)
    assert len(lines[0]["features"]) == 6  # [CLS] john smith was born [SEP]: no padding

    npz = str(tmp_path / "features.npz")
    extract_features.run(str(text), npz, encoder_file, vocab_file=VOCAB, layers=["-1", "-2"],
                         max_seq_length=10)
    with np.load(npz) as f:
        assert f["layer_-1"].shape == (2, 10, 8) and f["layer_-1"].dtype == np.float32
        assert list(f["tokens"][0]) == ["[CLS]", "john", "smith", "was", "born", "[SEP]"] + [""] * 4
        np.testing.assert_array_equal(f["input_mask"][0], [1] * 6 + [0] * 4)
        np.testing.assert_allclose(f["layer_-2"][1], reference[-2], atol=1e-5)
        np.testing.assert_allclose(f["layer_-1"][1][:, :3], np.array(
            [[v["layers"][0]["values"][:3] for v in lines[1]["features"]]])[0], atol=1e-6)


def test_truncation_counted_and_bad_layers(tmp_path, encoder_file):
    text = tmp_path / "input.txt"
    text.write_text("the the the the the the ||| the the\n")
    result = extract_features.run(str(text), str(tmp_path / "f.jsonl"), encoder_file,
                                  vocab_file=VOCAB, layers=["-1"], max_seq_length=7)
    assert result["truncated"] == 1
    tokens = [f["token"] for f in json.loads(open(tmp_path / "f.jsonl").read())["features"]]
    assert tokens == ["[CLS]", "the", "the", "[SEP]", "the", "the", "[SEP]"]
    with pytest.raises(ValueError, match=r"layers \[-4\] do not exist: the encoder has 3 layers"):
        extract_features.run(str(text), str(tmp_path / "g.jsonl"), encoder_file, vocab_file=VOCAB,
                             layers=["-1", "-4"], max_seq_length=7)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        extract_features.run(str(text), str(tmp_path / "f.jsonl"), encoder_file, vocab_file=VOCAB)


@pytest.mark.parametrize("content, message", [
    ("hello\n\nfriend\n", r"input.txt:2: empty text"),
    ("a ||| b ||| c\n", r"input.txt:1: expected 'text' or 'text_a \|\|\| text_b'"),
])
def test_bad_input_lines(tmp_path, content, message):
    text = tmp_path / "input.txt"
    text.write_text(content)
    with pytest.raises(DataError, match=message):
        extract_features.read_input(str(text))


def test_lines_as_googles_reader_splits_them(tmp_path):
    """As Google's extract_features.py reads its input (tf.io.gfile's readline, run here as
    the reference): lines end at "\\n" only (a lone "\\r" split a line in two before,
    shifting every later linex_index) and every "\\r" is dropped ("leader\\rrunning" was
    read as two words, Google's reader reads one), text_a runs to the last " ||| " (its
    pattern `^(.*) \\|\\|\\| (.*)$`), and CRLF endings are stripped."""
    import tensorflow as tf

    text = tmp_path / "input.txt"
    text.write_bytes(b"the leader\rrunning\nthe ||| ||| leader\r\nrunning\n")
    with tf.io.gfile.GFile(str(text), "r") as f:
        google = [line.strip() for line in iter(f.readline, "")]
    assert google == ["the leaderrunning", "the ||| ||| leader", "running"]
    assert extract_features.read_input(str(text)) == [
        ("the leaderrunning", None), ("the |||", "leader"), ("running", None)]


def test_lines_ending_in_a_lone_carriage_return_are_refused(tmp_path):
    """A file saved with classic Mac OS line ends is one line to Google's reader: it was one
    example of the whole file, without a word."""
    text = tmp_path / "input.txt"
    text.write_bytes(b"the leader\rrunning ||| the\rleader\r")
    with pytest.raises(DataError, match=r"input.txt: lines end in a carriage return alone"):
        extract_features.read_input(str(text))


def test_an_input_from_a_pipe_reads_as_the_same_file(tmp_path):
    """--input_file=<(...) or /dev/stdin: the text check drained the pipe, and the reader
    said "no examples". Now the examples of the same bytes in a file; the checks stand on
    the one read (a NUL byte, a lone-"\r" file), naming the pipe."""
    from conftest import piped
    from data_prep.files import TextFileError

    data = "\ufeffthe leader\r\nrunning ||| the\nKä\n".encode()
    text = tmp_path / "input.txt"
    text.write_bytes(data)
    expected = extract_features.read_input(str(text))
    assert expected == [("the leader", None), ("running", "the"), ("Kä", None)]
    with piped(data) as path:
        assert extract_features.read_input(path) == expected
    with piped(b"the\nlea\x00der\n") as path:
        with pytest.raises(TextFileError, match=rf"^{path}:2: NUL byte at byte offset 7"):
            extract_features.read_input(path)
    with piped(b"the\rleader\r") as path:
        with pytest.raises(DataError, match=rf"^{path}: lines end in a carriage return"):
            extract_features.read_input(path)


def test_a_second_text_without_wordpieces_makes_a_single_text(tmp_path, encoder_file):
    """"the ||| \\u200b": the zero-width space is no WordPiece, so there is no second text,
    and Google's `if tokens_b:` packs "[CLS] the [SEP]"; before, "[CLS] the [SEP] [SEP]"."""
    text = tmp_path / "input.txt"
    text.write_text("the ||| \u200b\nthe ||| leader\n", encoding="utf-8")
    out = tmp_path / "f.jsonl"
    extract_features.run(str(text), str(out), encoder_file, vocab_file=VOCAB, layers=["-1"],
                         max_seq_length=10)
    tokens = [[f["token"] for f in json.loads(line)["features"]] for line in open(out)]
    assert tokens == [["[CLS]", "the", "[SEP]"], ["[CLS]", "the", "[SEP]", "leader", "[SEP]"]]


def test_jsonl_is_written_a_chunk_at_a_time_with_the_same_bytes(tmp_path, encoder_file):
    """The JSONL output runs and writes `chunk` examples at a time, so memory does not grow
    with the input (before: every layer of every example, then the whole file as one
    string: ~3 bytes of RAM per output byte); the file is the same whatever the chunk."""
    import keras

    from data_prep.tokenization import load_tokenizer

    text = tmp_path / "input.txt"
    text.write_text("".join(f"the leader {'running ' * (i % 5)}||| the\n" if i % 3 else
                            f"unwanted {'the ' * (i % 7)}\n" for i in range(23)))
    examples = extract_features.read_input(str(text))
    encoder = keras.models.load_model(encoder_file)
    tokenizer = load_tokenizer(VOCAB)
    written = []
    for chunk in (2, 6, 1000):  # batches of 2 rows each time: the same arithmetic
        path = str(tmp_path / f"chunk{chunk}.jsonl")
        extract_features.extract_to_jsonl(path, encoder, tokenizer, examples, [-1, 0], 12, 2,
                                          chunk=chunk)
        written.append(open(path, "rb").read())
    assert written[0] == written[1] == written[2]
    lines = [json.loads(line) for line in written[0].decode().splitlines()]
    assert [line["linex_index"] for line in lines] == list(range(23))
    # The same values as the in-memory route the .npz output takes.
    tokens, arrays, _ = extract_features.extract(encoder, tokenizer, examples, [-1, 0], 12, 2)
    assert written[0].decode() == "".join(extract_features.jsonl_lines(tokens, arrays, [-1, 0]))


def test_an_empty_layer_list_and_a_directory_as_output_are_refused(tmp_path, encoder_file):
    text = tmp_path / "input.txt"
    text.write_text("the\n")
    with pytest.raises(ValueError, match=r"^--layers is empty: name at least one layer"):
        extract_features.run(str(text), str(tmp_path / "f.jsonl"), encoder_file,
                             vocab_file=VOCAB, layers=[])
    (tmp_path / "out.jsonl").mkdir()
    (tmp_path / "out.jsonl" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"out.jsonl is a directory; name a file in it$"):
        extract_features.run(str(text), str(tmp_path / "out.jsonl"), encoder_file,
                             vocab_file=VOCAB, overwrite_output=True)
    assert (tmp_path / "out.jsonl" / "keep.txt").read_text() == "mine"


def test_pairs_are_refused_for_a_model_with_one_segment_embedding(tmp_path):
    """Segment id 1 of a one-row table reads a zero row on both backends, silently: pairs
    are refused before anything is written (run_classifier refuses them too); single
    texts run."""
    path = str(tmp_path / "encoder.keras")
    BertEncoder(**SMALL, type_vocab_size=1).save(path)
    text = tmp_path / "input.txt"
    text.write_text("the man\nthe man ||| the store\n")
    out = tmp_path / "f.jsonl"
    with pytest.raises(ValueError, match=r"^--input_file: line 2 is a sentence pair .* "
                                         r"type_vocab_size=1"):
        extract_features.run(str(text), str(out), path, vocab_file=VOCAB, max_seq_length=16, layers=[-1])
    assert not out.exists()
    text.write_text("the man\nthe store\n")
    assert extract_features.run(str(text), str(out), path, vocab_file=VOCAB,
                                max_seq_length=16, layers=[-1])["examples"] == 2
