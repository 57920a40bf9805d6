"""Texts that are not UTF-8: what every text-in signature reads (export/request_checks.py).

A tf.string request carries any bytes (TF Serving's gRPC passes them through; its REST API
takes {"b64": ...}). The reference is Python's `bytes.decode("utf-8", "replace")`, what a
client reading the text with replacement sees, and for the tags the Python route run_tagger
predicts with (`data_prep.tagging` on the decoded words, the Keras model).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY
from test_export import write_vocab

from bert_keras import BertEncoder
from bert_keras.tasks import BertTagger
from data_prep import schema, tagging

S = 12  # max_seq_length of the tagger below
TAGS = ["O", "B-X", "I-X"]
SEED = 3  # a seed whose random tagger opens entities on these texts
# Ill-formed UTF-8 of every kind (a lone continuation byte, an invalid lead byte, a cut
# sequence, an encoded surrogate, past U+10FFFF, an overlong form), beside controls that
# are valid UTF-8 and must come back as they are (NUL, C1).
ILL_FORMED = [b"w1 \xff\xfe w2", b"\x80", b"w3 caf\xc3", b"w4\xed\xa0\x80w5 w6",
              b"\xf4\x90\x80\x80 w7", b"\xc0\xaf w8", b"w9 \xe2\x82 w10", b"w11\x00w12 \xc2\x85 w13"]


@pytest.fixture(scope="module")
def tagger_module(tmp_path_factory):
    from data_prep.tokenization import BertTokenizer
    from export.export_preprocessor import TextPacker
    from export.export_tagger import TaggerModule

    tokenizer = BertTokenizer(write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt"))
    keras.utils.set_random_seed(SEED)
    tagger = BertTagger(BertEncoder(**TINY, initializer_range=0.5), len(TAGS))
    pre = TextPacker(tokenizer, S, pairs=False)
    return tokenizer, tagger, TaggerModule(pre, tagger, TAGS, doc_stride=5)


def test_request_texts_are_read_as_a_client_decoding_with_replacement():
    from export import request_checks

    got = request_checks.texts(tf.constant(ILL_FORMED)).numpy()
    assert [t.decode("utf-8") for t in got] == [t.decode("utf-8", "replace") for t in ILL_FORMED]
    rows = tf.constant([ILL_FORMED[:4], ILL_FORMED[4:]])
    got = request_checks.texts(rows, rank=2).numpy()
    assert [[t.decode("utf-8") for t in row] for row in got] == [
        [t.decode("utf-8", "replace") for t in row] for row in (ILL_FORMED[:4], ILL_FORMED[4:])]


def test_tagger_echoes_ill_formed_words_as_u_fffd_and_tags_them_as_run_tagger(tagger_module):
    """Before, the `words` output held the request's raw bytes: TF Serving's REST API writes
    them into the JSON response as they are, which a strict client then cannot decode at
    all (the answers of the request's other texts lost with it)."""
    tokenizer, tagger, module = tagger_module
    ordinary = "w20 w21 w22"
    batch = [ordinary, *ILL_FORMED, ordinary]
    decoded = [t if isinstance(t, str) else t.decode("utf-8", "replace") for t in batch]
    sentences = [tagging.TaggedSentence(f"r:{i}", tuple(t.split()), None)
                 for i, t in enumerate(decoded)]
    features, positions, _ = tagging.convert_sentences(sentences, tokenizer, None, S, 5)
    logits = np.asarray(tagger(schema.model_inputs(features), training=False)["logits"])
    expected = tagging.predictions_to_tags(logits.argmax(-1), positions, TAGS)
    probabilities = tf.nn.softmax(logits, axis=-1).numpy()
    # The words signature gets the same words, with their bytes as sent (split as str.split()
    # splits the text: surrogateescape keeps the ill-formed bytes apart from the words).
    rows = [[w.encode("utf-8", "surrogateescape") for w in
             (t if isinstance(t, str) else t.decode("utf-8", "surrogateescape")).split()]
            for t in batch]
    width = max(len(r) for r in rows)
    for out in (module.serve(tf.constant(batch)),
                module.serve_words(tf.constant([r + [b""] * (width - len(r)) for r in rows]))):
        for row, sentence in enumerate(sentences):
            n = len(sentence.words)
            assert int(out["num_words"][row]) == n
            words = [w.decode("utf-8") for w in out["words"].numpy()[row, :n]]  # strict
            assert words == list(sentence.words), row
            assert [t.decode() for t in out["tags"].numpy()[row, :n]] == expected[row], row
            np.testing.assert_allclose(
                out["probabilities"].numpy()[row, :n],
                np.reshape([probabilities[r, p] for r, p in positions[row]], (n, len(TAGS))),
                atol=1e-5)


def test_character_tagger_units_and_entities_are_the_decoded_texts_characters(tagger_module):
    """A character-tagged model's export (run_tagger --tag_format=klue) returns each unit
    and entity as the text's own characters with their offsets: on ill-formed bytes, the
    characters of the text as a client decodes it."""
    _, _, module = tagger_module
    out = {k: v.numpy() for k, v in module.serve_characters(tf.constant(ILL_FORMED)).items()}
    units = entities = 0
    for row, raw in enumerate(ILL_FORMED):
        text = raw.decode("utf-8", "replace")
        for kind, count in (("unit", "num_units"), ("entity", "num_entities")):
            plural = "units" if kind == "unit" else "entities"
            for i in range(out[count][row]):
                start, end = out[f"{kind}_starts"][row, i], out[f"{kind}_ends"][row, i]
                assert out[plural][row, i].decode("utf-8") == text[start:end], (row, kind, i)
        units += out["num_units"][row]
        entities += out["num_entities"][row]
    assert units >= 12 and entities >= 1  # the random tagger opens some entities
