"""What every serving signature checks in a request before computing with it.

TF Serving feeds a request's tensors to a signature without comparing their shapes with
the signature's, and the kernels behind BERT trust their inputs: a scalar string where a
batch of texts belongs crashed the whole server process inside tensorflow-text's
normalizer (SIGSEGV, every model on the server with it); a negative token id read a row
from the end of the embedding table (Keras' `take` wraps it) and a type id past the
segment table added no segment embedding, both without an error; an `input_mask` of batch
1 was applied to every row of a larger batch; and a sequence longer than the position
table failed with "Incompatible shapes: [1,40,16] vs. [1,32,16]" from deep inside the
graph. Each check here turns such a request into an InvalidArgumentError whose message
names the input and what it must be, before anything else runs on it. (Messages have no
quotes: the assertion's message reaches clients with them escaped.)

The checks are runtime ops that Grappler cannot fold away: `EnsureShape` for ranks (a
`Rank` op compared with 1 is folded to true from the signature's declared shape, so the
scalar would pass), and asserts on `tf.shape` and on the values; the checked ids leave
through `PlaceholderWithDefault` of shape [None, None], so that no shape inferred for a
call fails before the asserts run. All are core TensorFlow, present in the TF 2.12 that
stock TF Serving links.
"""

from __future__ import annotations

import tensorflow as tf

from data_prep import schema


def batch(values: tf.Tensor, rank: int = 1) -> tf.Tensor:
    """`values` (a signature's input), required to be a batch: a tensor of `rank`
    dimensions, of any sizes ([batch] texts or serialized tf.Examples, [batch, W] words)."""
    return tf.ensure_shape(values, [None] * rank)


def texts(text: tf.Tensor, rank: int = 1) -> tf.Tensor:
    """`text` (a signature's string input) checked as a batch (`batch`) and read as UTF-8:
    each ill-formed byte sequence becomes U+FFFD, as Python's
    `bytes.decode("utf-8", "replace")` reads it (string [batch] or [batch, W], valid UTF-8).

    A tf.string request carries any bytes (gRPC passes them through, REST takes {"b64": ...}).
    The tokenizer reads ill-formed bytes as U+FFFD and drops them, so the ids are the same
    either way; but an output that echoes the request's text (the tagger's words and units,
    span QA's answer) held the raw bytes, and TF Serving's REST API writes a string output
    into the JSON response as it is: the response was not UTF-8 and a strict client's JSON
    decoder refused it whole, the answers of the request's other texts with it.
    """
    return tf.strings.unicode_transcode(batch(text, rank), "UTF-8", "UTF-8", errors="replace")


def text_pair(first: tf.Tensor, second: tf.Tensor, names: tuple[str, str]):
    """Two string batches that pair row by row: both 1-D and of one batch size."""
    first, second = texts(first), texts(second)
    check = tf.debugging.assert_equal(
        tf.shape(first)[0], tf.shape(second)[0],
        message=f"{names[0]} and {names[1]} must have the same number of texts")
    with tf.control_dependencies([check]):
        return tf.identity(first), tf.identity(second)


def encoder_inputs(inputs: dict, max_positions: int, vocab_size: int,
                   type_vocab_size: int) -> dict:
    """The three encoder inputs, checked: int [batch, seq] each, of one shape, seq from 1
    to the position table, word ids in [0, vocab_size), type ids in [0, type_vocab_size).

    Other keys of `inputs` are returned as they are.
    """
    ids = tf.ensure_shape(inputs[schema.INPUT_WORD_IDS], [None, None])
    shape = tf.shape(ids)
    checks = [
        tf.debugging.assert_less_equal(
            shape[1], max_positions,
            message=f"{schema.INPUT_WORD_IDS}: at most {max_positions} positions (the size "
                    "of the position table)"),
        tf.debugging.assert_positive(
            shape[1], message=f"{schema.INPUT_WORD_IDS}: at least 1 position ([CLS])"),
        tf.debugging.assert_non_negative(
            ids, message=f"{schema.INPUT_WORD_IDS}: ids must be in [0, {vocab_size})"),
        tf.debugging.assert_less(
            ids, vocab_size, message=f"{schema.INPUT_WORD_IDS}: ids must be in [0, {vocab_size})"),
    ]
    out = dict(inputs)
    for name in (schema.MODEL_INPUT_MASK, schema.INPUT_TYPE_IDS):
        out[name] = tf.ensure_shape(inputs[name], [None, None])
        checks.append(tf.debugging.assert_equal(
            tf.shape(out[name]), shape,
            message=f"{name} must have the shape of {schema.INPUT_WORD_IDS}"))
    types = out[schema.INPUT_TYPE_IDS]
    checks += [
        tf.debugging.assert_non_negative(
            types, message=f"{schema.INPUT_TYPE_IDS}: ids must be in [0, {type_vocab_size})"),
        tf.debugging.assert_less(
            types, type_vocab_size,
            message=f"{schema.INPUT_TYPE_IDS}: ids must be in [0, {type_vocab_size})"),
    ]
    with tf.control_dependencies(checks):
        for name in schema.MODEL_INPUT_NAMES:
            checked = tf.identity(out[name] if name != schema.INPUT_WORD_IDS else ids)
            # Of a shape no graph can know in advance: a function restored from the export
            # and called with a sequence longer than the position table (a TF Hub user's
            # `obj(inputs)`) had its body's shapes inferred for that call, and failed there
            # ("Dimensions must be equal, but are 200 and 128") before the check ran.
            out[name] = tf.raw_ops.PlaceholderWithDefault(input=checked, shape=[None, None])
    return out


def positions(values: tf.Tensor, ids: tf.Tensor, name: str) -> tf.Tensor:
    """`values`, positions into the rows of `ids` ([batch, P] int), checked: one row per
    row of `ids`, each in [0, seq)."""
    values = tf.ensure_shape(values, [None, None])
    shape = tf.shape(ids)
    checks = [
        tf.debugging.assert_equal(tf.shape(values)[0], shape[0],
                                  message=f"{name} must have a row for each row of "
                                          f"{schema.INPUT_WORD_IDS}"),
        tf.debugging.assert_non_negative(
            values, message=f"{name}: positions must be in [0, sequence length)"),
        tf.debugging.assert_less(
            values, shape[1], message=f"{name}: positions must be in [0, sequence length)"),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(values)
