"""The TFRecord layout of BERT pretraining data: lengths, dtypes, writers, the parser, sidecars.

Files keep the feature names of Google's `create_pretraining_data.py` (docs/DESIGN.md
section 4) so that files written by Google's tool, by TF Model Garden's and by ours are
interchangeable. Models see the TF Hub names; `parse_pretraining_example` renames with the
one table in `data_prep.schema`.

Schema, per serialized `tf.train.Example` (S = max_seq_length, P = max_predictions_per_seq):

| feature              | dtype   | length | content                                        |
| -------------------- | ------- | ------ | ---------------------------------------------- |
| input_ids            | int64   | S      | token ids, 0-padded                            |
| input_mask           | int64   | S      | 1 real, 0 pad                                  |
| segment_ids          | int64   | S      | 0 for `[CLS] A [SEP]`, 1 for `B [SEP]`, 0 pad  |
| masked_lm_positions  | int64   | P      | ascending, 0-padded                            |
| masked_lm_ids        | int64   | P      | original ids, 0-padded                         |
| masked_lm_weights    | float32 | P      | 1.0 real, 0.0 pad                              |
| next_sentence_labels | int64   | 1      | 0 = IsNext, 1 = NotNext                        |

Data for dynamic masking (`create_pretraining_data --dynamic_masking`) keeps only the four
features that do not depend on the mask: input_ids (unmasked), input_mask, segment_ids and
next_sentence_labels; the trainer masks anew on every pass (bert_keras/masking.py). Its
sidecar says `"masking": "dynamic"` and `"max_predictions_per_seq": null`; everywhere below
P = None means such data.

Two writers produce identical parses: `to_example` builds a `tf.train.Example` (clear, slow:
about 58 us per instance here) and `serialize_examples` encodes a whole batch with numpy
straight into the protobuf wire format (a few us per instance), which is what the
pretraining-data tool uses.

Every shard `x` has a JSON sidecar `x.meta.json` (max_seq_length, max_predictions_per_seq,
vocab checksum, casing, counts, flags). Trainers call `read_sidecar` + `check_sidecar`
because a length mismatch between data and trainer is the most common BERT data error, and
`expand_input_files` to find shards (it skips sidecars and unfinished temporary files).

The sidecar also records the tokenizer settings the data was made with (`tokenizer`, in
tokenizer_config.json's keys) and the vocabulary's sha256, so the trainer tokenizes later
stages the same way and refuses a --vocab_file the data was not made with.
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import os
import struct
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from data_prep import tf_logging

tf = tf_logging.import_tensorflow()  # without TensorFlow's C++ start-up notices
from data_prep import files, schema  # noqa: E402
from data_prep.schema import (FILE_TO_MODEL_NAMES, INPUT_IDS, INPUT_MASK, MASKED_LM_IDS,
                              MASKED_LM_POSITIONS, MASKED_LM_WEIGHTS, NEXT_SENTENCE_LABELS,
                              SEGMENT_IDS)

SIDECAR_FORMAT = "bert-keras-pretraining-data/1"

# Sidecar key "masking": masks written into the data (Google's layout) or left to the trainer.
STATIC_MASKING = "static"
DYNAMIC_MASKING = "dynamic"
# The features that only statically masked data has.
MASK_FEATURES = (MASKED_LM_POSITIONS, MASKED_LM_IDS, MASKED_LM_WEIGHTS)


def feature_spec(max_seq_length: int,
                 max_predictions_per_seq: int | None) -> dict[str, tf.io.FixedLenFeature]:
    """Returns the FixedLenFeature spec of one example, keyed by the names in files.

    Args:
      max_seq_length: S, length of input_ids / input_mask / segment_ids.
      max_predictions_per_seq: P, length of the masked_lm_* features; None for data without
        masks (dynamic masking), whose spec leaves the masked_lm_* features out.

    Returns:
      dict name -> tf.io.FixedLenFeature (int64, except masked_lm_weights float32).
    """
    _check_lengths(max_seq_length, max_predictions_per_seq)
    s = int(max_seq_length)
    spec = {
        INPUT_IDS: tf.io.FixedLenFeature([s], tf.int64),
        INPUT_MASK: tf.io.FixedLenFeature([s], tf.int64),
        SEGMENT_IDS: tf.io.FixedLenFeature([s], tf.int64),
    }
    if max_predictions_per_seq is not None:
        p = int(max_predictions_per_seq)
        spec[MASKED_LM_POSITIONS] = tf.io.FixedLenFeature([p], tf.int64)
        spec[MASKED_LM_IDS] = tf.io.FixedLenFeature([p], tf.int64)
        spec[MASKED_LM_WEIGHTS] = tf.io.FixedLenFeature([p], tf.float32)
    spec[NEXT_SENTENCE_LABELS] = tf.io.FixedLenFeature([1], tf.int64)
    return spec


def _check_lengths(max_seq_length: int, max_predictions_per_seq: int | None) -> None:
    if int(max_seq_length) < 1 or (max_predictions_per_seq is not None
                                   and int(max_predictions_per_seq) < 1):
        raise ValueError(
            f"max_seq_length and max_predictions_per_seq must be >= 1; received "
            f"max_seq_length={max_seq_length}, max_predictions_per_seq={max_predictions_per_seq}")


def parse_pretraining_example(serialized: tf.Tensor, max_seq_length: int,
                              max_predictions_per_seq: int | None) -> dict[str, tf.Tensor]:
    """Parses serialized examples into model inputs and labels (the one name bridge).

    Works on one record (a scalar string) or a batch (a [B] string vector, parsed with
    tf.io.parse_example, so a trainer can batch before parsing). Leading shapes below are
    [] for a scalar and [B] for a vector.

    Args:
      serialized: tf.string Tensor of shape [] or [B].
      max_seq_length: S the data was written with (check the sidecar first).
      max_predictions_per_seq: P the data was written with; None for data without masks
        (dynamic masking).

    Returns:
      dict with model names:
        input_word_ids, input_mask, input_type_ids: int32 [..., S]
        masked_lm_positions, masked_lm_ids: int32 [..., P] (not for P = None)
        masked_lm_weights: float32 [..., P] (not for P = None)
        next_sentence_labels: int32 [..., 1] (0 = IsNext, 1 = NotNext; Google's shape)

    Raises:
      ValueError: if `serialized` has rank other than 0 or 1.
    """
    serialized = tf.convert_to_tensor(serialized, dtype=tf.string)
    spec = feature_spec(max_seq_length, max_predictions_per_seq)
    rank = serialized.shape.rank
    if rank == 0:
        parsed = tf.io.parse_single_example(serialized, spec)
    elif rank == 1:
        parsed = tf.io.parse_example(serialized, spec)
    else:
        raise ValueError(
            f"parse_pretraining_example expects a scalar or a [batch] vector of serialized "
            f"examples; received shape {serialized.shape}")
    out = {}
    for file_name, model_name in FILE_TO_MODEL_NAMES.items():
        if file_name not in parsed:
            continue  # masked_lm_* of data without masks
        value = parsed[file_name]
        # TPUs want int32; weights stay float32.
        out[model_name] = value if value.dtype == tf.float32 else tf.cast(value, tf.int32)
    return out


def to_example(input_ids: Sequence[int], input_mask: Sequence[int], segment_ids: Sequence[int],
               masked_lm_positions: Sequence[int], masked_lm_ids: Sequence[int],
               masked_lm_weights: Sequence[float], next_sentence_label: int) -> tf.train.Example:
    """Builds one `tf.train.Example` in the schema (the readable reference writer).

    All sequences must already be padded: the first three to S, the masked_lm_* to P.
    `serialize_examples` is the fast path and produces records that parse identically.

    Returns:
      tf.train.Example with the seven features of the module docstring.
    """
    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    feature = {
        INPUT_IDS: ints(input_ids),
        INPUT_MASK: ints(input_mask),
        SEGMENT_IDS: ints(segment_ids),
        MASKED_LM_POSITIONS: ints(masked_lm_positions),
        MASKED_LM_IDS: ints(masked_lm_ids),
        MASKED_LM_WEIGHTS: tf.train.Feature(
            float_list=tf.train.FloatList(value=[float(v) for v in masked_lm_weights])),
        NEXT_SENTENCE_LABELS: ints([next_sentence_label]),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature))


# --- Fast batch serialization straight into the protobuf wire format. ---
#
# Example   { Features features = 1; }
# Features  { map<string, Feature> feature = 1; }   a map entry is { key = 1; value = 2; }
# Feature   { oneof: FloatList float_list = 2; Int64List int64_list = 3; }
# Int64List { repeated int64 value = 1 [packed]; }  FloatList { repeated float value = 1 [packed]; }
#
# A batch of records is built as one uint8 matrix [B, W] plus a boolean "keep" matrix of the
# same shape: constant bytes (tags, keys) are kept everywhere, a varint value owns up to w
# columns of which it keeps its first 1..w, a float owns 4. `matrix[keep]` then flattens all
# records, in order, into one buffer with a single numpy call; no per-value Python work.

_TAG_LEN1 = 0x0A  # field 1, wire type 2 (length-delimited)
_TAG_LEN2 = 0x12  # field 2, wire type 2
_TAG_LEN3 = 0x1A  # field 3, wire type 2


def _varint_size(values: np.ndarray) -> np.ndarray:
    """Bytes needed to encode each non-negative value (< 2**35) as a protobuf varint."""
    v = np.asarray(values)
    size = np.ones(v.shape, np.int64)
    for shift in (7, 14, 21, 28):
        size += v >= (1 << shift)
    return size


def _varint_cells(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Encodes an int array [B, n] as varints: (bytes uint8 [B, n*w], keep bool [B, n*w])."""
    v = np.asarray(values)
    b, n = v.shape
    width = int(_varint_size(v.max())) if v.size else 1
    if width == 1:  # every value < 128 is its own single byte
        return v.astype(np.uint8), np.ones((b, n), bool)
    v = v.astype(np.int64 if width == 5 else np.int32, copy=False)
    more = [v >= (1 << (7 * k)) for k in range(1, width)]  # byte k+1 follows byte k
    planes = []
    for k in range(width):
        plane = (v >> (7 * k)).astype(np.uint8) & np.uint8(0x7F)
        if k < width - 1:
            plane |= more[k].view(np.uint8) << np.uint8(7)
        planes.append(plane)
    out = np.stack(planes, axis=-1).reshape(b, n * width)
    keep = np.stack([np.ones((b, n), bool)] + more, axis=-1).reshape(b, n * width)
    return out, keep


def serialize_examples(input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray,
                       masked_lm_positions: np.ndarray | None, masked_lm_ids: np.ndarray | None,
                       masked_lm_weights: np.ndarray | None,
                       next_sentence_labels: np.ndarray) -> list[bytes]:
    """Serializes a batch of examples in the schema; fast (vectorized) writer.

    Args:
      input_ids, input_mask, segment_ids: integer arrays [B, S], values in [0, 2**31).
      masked_lm_positions, masked_lm_ids: integer arrays [B, P], values in [0, 2**31).
      masked_lm_weights: float array [B, P]. All three None: records without masks (for
        dynamic masking), which parse with `feature_spec(S, None)`.
      next_sentence_labels: integer array [B] (or [B, 1]).

    Returns:
      list of B serialized tf.train.Example records (bytes); each parses exactly like the
      record `to_example` builds from the same row.

    Raises:
      ValueError: on inconsistent shapes or negative / too large integer values.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"serialize_examples: input_ids must be [B, S]; received {ids.shape}")
    b, s = ids.shape
    unmasked = masked_lm_weights is None
    if unmasked != (masked_lm_positions is None) or unmasked != (masked_lm_ids is None):
        raise ValueError("serialize_examples: give all three masked_lm_* arrays, or none of "
                         "them (data for dynamic masking)")
    weights = np.zeros((b, 1), "<f4") if unmasked else np.asarray(masked_lm_weights, "<f4")
    p = weights.shape[1] if weights.ndim == 2 else -1
    if weights.shape != (b, p) or p < 1:
        raise ValueError(f"serialize_examples: masked_lm_weights has shape {weights.shape}; "
                         f"expected ({b}, P) with P >= 1")
    nsp = np.asarray(next_sentence_labels)
    if nsp.size != b:
        raise ValueError(f"serialize_examples: next_sentence_labels has shape {nsp.shape}; "
                         f"expected ({b},)")
    int_features = {
        INPUT_IDS: (np.asarray(input_ids), s),
        INPUT_MASK: (np.asarray(input_mask), s),
        SEGMENT_IDS: (np.asarray(segment_ids), s),
    }
    if not unmasked:
        int_features[MASKED_LM_POSITIONS] = (np.asarray(masked_lm_positions), p)
        int_features[MASKED_LM_IDS] = (np.asarray(masked_lm_ids), p)
    int_features[NEXT_SENTENCE_LABELS] = (nsp.reshape(b, 1), 1)
    for name, (arr, length) in int_features.items():
        if arr.shape != (b, length):
            raise ValueError(f"serialize_examples: {name} has shape {arr.shape}; expected "
                             f"({b}, {length}) given input_ids {ids.shape} and P={p}")
        if arr.size and (arr.min() < 0 or arr.max() >= 2**31):
            raise ValueError(f"serialize_examples: {name} has values outside [0, 2**31): "
                             f"min {arr.min()}, max {arr.max()}")
    if b == 0:
        return []

    # Payloads in the order of `to_example` (the order is not part of the format).
    payloads = []  # (key, list tag, bytes [B, w], keep [B, w], payload length [B])
    for name in (INPUT_IDS, INPUT_MASK, SEGMENT_IDS, MASKED_LM_POSITIONS, MASKED_LM_IDS):
        if name not in int_features:
            continue
        cells, keep = _varint_cells(int_features[name][0])
        payloads.append((name, _TAG_LEN3, cells, keep, keep.sum(axis=1)))
    if not unmasked:
        float_bytes = weights.view(np.uint8).reshape(b, 4 * p)
        payloads.append((MASKED_LM_WEIGHTS, _TAG_LEN2, float_bytes,
                         np.ones_like(float_bytes, bool), np.full(b, 4 * p, np.int64)))
    cells, keep = _varint_cells(int_features[NEXT_SENTENCE_LABELS][0])
    payloads.append((NEXT_SENTENCE_LABELS, _TAG_LEN3, cells, keep, keep.sum(axis=1)))

    pieces: list[tuple[np.ndarray, np.ndarray]] = []

    def const(*byte_values: int) -> None:
        row = np.array(byte_values, np.uint8)[None, :]
        pieces.append((np.broadcast_to(row, (b, row.shape[1])),
                       np.ones((b, row.shape[1]), bool)))

    def varint(values: np.ndarray) -> None:
        pieces.append(_varint_cells(values[:, None]))

    body = []  # per entry, lengths computed bottom-up: list -> Feature -> map entry
    features_len = np.zeros(b, np.int64)
    for name, list_tag, cells, keep, payload_len in payloads:
        key = name.encode()
        list_len = 1 + _varint_size(payload_len) + payload_len
        feature_len = 1 + _varint_size(list_len) + list_len
        entry_len = 2 + len(key) + 1 + _varint_size(feature_len) + feature_len
        features_len += 1 + _varint_size(entry_len) + entry_len
        body.append((key, list_tag, cells, keep, payload_len, list_len, feature_len, entry_len))

    const(_TAG_LEN1)
    varint(features_len)
    for key, list_tag, cells, keep, payload_len, list_len, feature_len, entry_len in body:
        const(_TAG_LEN1)
        varint(entry_len)
        const(_TAG_LEN1, len(key), *key, _TAG_LEN2)
        varint(feature_len)
        const(list_tag)
        varint(list_len)
        const(_TAG_LEN1)
        varint(payload_len)
        pieces.append((cells, keep))

    matrix = np.concatenate([piece[0] for piece in pieces], axis=1)
    keep_all = np.concatenate([piece[1] for piece in pieces], axis=1)
    buffer = matrix[keep_all].tobytes()
    ends = np.cumsum(keep_all.sum(axis=1)).tolist()
    out, begin = [], 0
    for end in ends:
        out.append(buffer[begin:end])
        begin = end
    return out


# --- Sidecars and input expansion. ---


def sidecar_path(tfrecord_path: str) -> str:
    """Returns the sidecar path of a shard: `<shard path>.meta.json`."""
    return str(tfrecord_path) + files.SIDECAR_SUFFIX


def write_sidecar(tfrecord_path: str, meta: Mapping[str, Any]) -> str:
    """Writes `meta` as JSON to `<tfrecord_path>.meta.json` (atomically: temp name + rename).

    Args:
      tfrecord_path: the shard the sidecar describes.
      meta: JSON-serializable dict; should hold max_seq_length and max_predictions_per_seq.

    Returns:
      The sidecar path.
    """
    return files.write_json(sidecar_path(tfrecord_path), dict(meta))


def read_sidecar(tfrecord_path: str) -> dict | None:
    """Reads the sidecar of a shard.

    Args:
      tfrecord_path: a shard path (files from Google's or Model Garden's tool have no sidecar).

    Returns:
      The sidecar dict, or None if `<tfrecord_path>.meta.json` does not exist (nor, for a
      shard path that is a symbolic link, beside the file it points to).

    Raises:
      ValueError: the sidecar exists but is not a JSON object (names the file).
    """
    path = sidecar_path(tfrecord_path)
    if (not tf.io.gfile.exists(path) and "://" not in str(tfrecord_path)
            and os.path.islink(tfrecord_path)):
        # An --output_file that was a link was written where it points, its sidecar beside
        # it (files.output_path): read through the link, the shard finds it there.
        path = sidecar_path(os.path.realpath(tfrecord_path))
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:  # gs://... too
        data = f.read()
    try:
        meta = files.parse_json(data, path, "a shard sidecar (a JSON object)")
    except files.TextFileError as e:
        raise ValueError(f"sidecar {e}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"sidecar {path} holds {type(meta).__name__}; expected a JSON object")
    return meta


def sidecar_masking(meta: Mapping[str, Any] | None) -> str | None:
    """"static" or "dynamic" as a sidecar says (sidecars before dynamic masking: static);
    None without a sidecar."""
    if meta is None:
        return None
    return str(meta.get("masking", STATIC_MASKING))


def check_sidecar(meta: Mapping[str, Any] | None, max_seq_length: int,
                  max_predictions_per_seq: int | None, source: str) -> None:
    """Checks that data described by `meta` fits a trainer's lengths.

    Args:
      meta: a sidecar dict (from read_sidecar), or None (no sidecar: nothing to check).
      max_seq_length, max_predictions_per_seq: what the trainer will parse with. Data
        without masks (sidecar `"masking": "dynamic"`) has no P: only S is checked.
      source: the shard path, named in the error.

    Raises:
      ValueError: naming `source`, the sidecar's value and the trainer's value, for each
        length that differs or is missing.
    """
    if meta is None:
        return
    problems = []
    lengths = [("max_seq_length", max_seq_length)]
    if sidecar_masking(meta) != DYNAMIC_MASKING:
        lengths.append(("max_predictions_per_seq", max_predictions_per_seq))
    for key, wanted in lengths:
        if key not in meta:
            problems.append(f"its sidecar has no {key} (the trainer uses --{key}={wanted})")
        elif int(meta[key]) != int(wanted):
            problems.append(f"it was written with {key}={meta[key]} but the trainer uses "
                            f"--{key}={wanted}")
    if problems:
        raise ValueError(
            f"pretraining data {source} does not match the trainer: " + "; ".join(problems) +
            ". Regenerate the data with matching flags or change the trainer's flags.")


def compression_type(tfrecord_path: str) -> str:
    """Returns "GZIP" or "" for a shard: from its sidecar, else from the gzip magic bytes."""
    meta = read_sidecar(tfrecord_path)
    if meta is not None and "compression" in meta:
        return str(meta["compression"] or "")
    with tf.io.gfile.GFile(tfrecord_path, "rb") as f:
        head = f.read(2)
    return "GZIP" if head == b"\x1f\x8b" else ""


# --- Integrity: the record framing of a TFRecord file, checked to its end. ---
#
# A TFRecord file is a sequence of [uint64 length][uint32 masked crc32c of the length]
# [length bytes of data][uint32 masked crc32c of the data], little-endian. TensorFlow's
# reader stops silently at a record cut short (a copy interrupted midway leaves one), so a
# truncated shard would be trained on, cycled, without a word. Walking the length headers
# (seeking over the data) finds a cut or a corrupt header at about the cost of reading the
# file; the data checksums are left to TensorFlow's reader, which checks them as it reads.


def _crc32c_tables() -> list[list[int]]:
    """Slicing-by-8 tables of CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    first = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        first.append(c)
    tables = [first]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(prev[n] >> 8) ^ first[prev[n] & 0xFF] for n in range(256)])
    return tables


_CRC_TABLES = _crc32c_tables()


def masked_crc32c_of_uint64(value: int) -> int:
    """TFRecord's masked CRC-32C of an 8-byte little-endian value (a record's length)."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _CRC_TABLES
    one = (value & 0xFFFFFFFF) ^ 0xFFFFFFFF
    two = value >> 32
    crc = (t7[one & 0xFF] ^ t6[(one >> 8) & 0xFF] ^ t5[(one >> 16) & 0xFF] ^ t4[one >> 24]
           ^ t3[two & 0xFF] ^ t2[(two >> 8) & 0xFF] ^ t1[(two >> 16) & 0xFF] ^ t0[two >> 24])
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class RecordScan:
    """What walking a TFRecord file's framing found.

    Attributes:
      path: the file.
      records: complete records before the end of the file (or before the damage).
      problem: None when the framing ends exactly at the end of the file; else what is wrong,
        in words (where the file ends inside a record, a corrupt length header, a cut
        compressed stream).
    """

    path: str
    records: int
    problem: str | None = None


class DamagedDataError(ValueError):
    """A data file is cut short or corrupt, or holds other records than its sidecar says."""


_HEADER = struct.Struct("<QI")  # length, masked crc32c of the length


def _walk_buffer(buffer, offset: int, records: int, crcs: dict):
    """Walks the complete records of `buffer` from `offset`.

    Returns (records, offset of the first incomplete record, problem or None); `crcs`
    caches the header checksum of each length seen (records have few distinct lengths).
    """
    size = len(buffer)
    unpack = _HEADER.unpack_from
    while offset + 12 <= size:
        length, crc = unpack(buffer, offset)
        want = crcs.get(length)
        if want is None:
            want = masked_crc32c_of_uint64(length)
            if len(crcs) < 1 << 16:
                crcs[length] = want
        if want != crc:
            return records, offset, (f"the length header of record {records + 1} is corrupt "
                                     f"(byte {offset})")
        end = offset + length + 16
        if end > size:
            break
        records += 1
        offset = end
    return records, offset, None


def _end_problem(records: int, left: int, buffer, offset: int) -> str | None:
    """What `left` bytes after the last complete record mean at the end of the data."""
    if left == 0:
        return None
    if left < 12:
        return (f"the file ends inside the header of record {records + 1} ({left} of its 12 "
                "bytes are there)")
    length = _HEADER.unpack_from(buffer, offset)[0]
    return (f"the file ends inside record {records + 1}, {length + 16 - left} bytes short of "
            f"its {length + 16}")


def scan_tfrecord(path: str, compression: str = "") -> RecordScan:
    """Walks the record framing of a TFRecord file to its end, without parsing records.

    A local uncompressed file is memory-mapped and walked from length header to length
    header (about 1.4 s per GB with the file in the page cache: 1.1 us per 830-byte record
    here). Other files are read as a stream in 4 MiB chunks: GZIP files are decompressed
    (which also checks the gzip trailer's CRC-32 and length), remote ones (gs://) read
    through tf.io.gfile.

    Args:
      path: the file (local, or any tf.io.gfile path).
      compression: "" or "GZIP" (`compression_type`).

    Returns:
      RecordScan (records found, and the problem if the framing does not end cleanly).
    """
    import mmap
    import zlib

    path = str(path)
    crcs: dict = {}
    remote = "://" in path
    if not remote and compression != "GZIP":
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return RecordScan(path, 0)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                records, offset, problem = _walk_buffer(buffer, 0, 0, crcs)
                if problem is None:
                    problem = _end_problem(records, len(buffer) - offset, buffer, offset)
                return RecordScan(path, records, problem)

    with (tf.io.gfile.GFile(path, "rb") if remote else open(path, "rb")) as raw:
        decompressor = zlib.decompressobj(31) if compression == "GZIP" else None
        pending, records, broken = b"", 0, None
        while True:
            chunk = raw.read(1 << 22)
            if decompressor is not None:
                try:
                    data = decompressor.decompress(chunk) if chunk else decompressor.flush()
                    while decompressor.eof and decompressor.unused_data:  # Another gzip member.
                        rest = decompressor.unused_data
                        decompressor = zlib.decompressobj(31)
                        data += decompressor.decompress(rest)
                except zlib.error as e:
                    broken = f"its compressed (GZIP) stream is corrupt ({e})"
                    data = b""
                if not chunk and not decompressor.eof and broken is None and (
                        pending or records or data):
                    broken = "its compressed (GZIP) stream is cut short"
            else:
                data = chunk
            buffer = pending + data if pending else data
            records, offset, problem = _walk_buffer(buffer, 0, records, crcs)
            if problem is not None:
                return RecordScan(path, records, problem)
            pending = buffer[offset:]
            if broken is not None:
                return RecordScan(path, records, f"{broken} after {records} complete records")
            if not chunk:
                return RecordScan(path, records,
                                  _end_problem(records, len(pending), pending, 0))


def expected_records(meta: Mapping[str, Any] | None) -> int | None:
    """The record count a sidecar promises (create_pretraining_data's `shard.instances`)."""
    if not meta:
        return None
    shard = meta.get("shard")
    if isinstance(shard, Mapping) and isinstance(shard.get("instances"), int):
        return int(shard["instances"])
    return None


def check_shard(path: str, meta: Mapping[str, Any] | None = None,
                compression: str | None = None) -> RecordScan:
    """Checks a shard's framing to its end, and its record count against its sidecar.

    Args:
      path: the shard.
      meta: its sidecar (`read_sidecar`), or None: the framing alone is checked.
      compression: "" or "GZIP"; None reads it from the sidecar or the file's first bytes.

    Returns:
      The RecordScan of a sound shard.

    Raises:
      DamagedDataError: one line naming the file, what is wrong, and the records expected
        (from the sidecar) and found.
    """
    if compression is None:
        compression = compression_type(path)
    scan = scan_tfrecord(path, compression)
    expected = expected_records(meta)
    if scan.problem is None and (expected is None or expected == scan.records):
        return scan
    counts = (f"expected {expected} records (its sidecar), found {scan.records}"
              if expected is not None else f"found {scan.records} complete records")
    what = scan.problem or "it holds other records than its sidecar describes"
    raise DamagedDataError(f"{path} is damaged: {what}; {counts}")


def _is_data_file(path: str) -> bool:
    base = os.path.basename(path)
    return not (base.endswith(files.SIDECAR_SUFFIX) or files.is_temp_name(base))


def expand_input_files(patterns: str | Iterable[str]) -> list[str]:
    """Expands comma-separated lists and globs into a sorted list of data files.

    Sidecars (`*.meta.json`) and unfinished temporary files (`.incomplete-<pid>.<name>`) are
    skipped. Local paths use Python's glob; other file systems (gs://...) use tf.io.gfile.
    A path that exists as written is read as written (`files.glob_as_written`: "run [1]/").

    Args:
      patterns: "a,b*,c" or a list of such strings.

    Returns:
      Sorted, de-duplicated list of paths.

    Raises:
      ValueError: naming the first pattern that matches no data file (or if none is given).
    """
    parts = files.split_patterns(patterns)
    if not parts:
        raise ValueError("no input file pattern given (expected a comma-separated list of "
                         "files or globs)")
    found: set[str] = set()
    for pattern in parts:
        if "://" in pattern:
            matches = tf.io.gfile.glob(files.glob_as_written(pattern, tf.io.gfile.exists))
        else:
            found_files = _glob.glob(files.glob_as_written(pattern))
            # A pipe (<(zcat corpus.gz)) gives its bytes once; every reader of this list
            # opens each file several times (a sniff, then the read; each epoch) or in
            # several processes: refused, where skipped it said "matches no data file".
            pipe = next((m for m in found_files if files.is_pipe(m)), None)
            if pipe is not None:
                raise ValueError(files.pipe_refusal(pipe))
            matches = [m for m in found_files if os.path.isfile(m)]
        matches = [m for m in matches if _is_data_file(m)]
        if not matches:
            raise ValueError(f"input pattern {pattern!r} matches no data file")
        found.update(matches)
    return sorted(found)


def check_shard_sets(paths: Sequence[str]) -> None:
    """Refuses data holding two outputs of one create_pretraining_data output prefix.

    A prefix (`files.output_prefix`) is written as shards
    `<prefix>-NNNNN-of-MMMMM.tfrecord[.gz]` or as one file `<prefix>[.tfrecord[.gz]]`.
    Shards of one prefix whose sidecars record other `shard.num_shards` (without a sidecar:
    whose names give another count) or another compression, or the single file beside
    shards or beside another single file, are the corpus written twice: a rerun with another
    --num_output_shards, worker count or --gzip_compress left the old output beside the new
    one (the tool now refuses that), and the documented glob `<prefix>-*.tfrecord` (two
    shard sets) or a glob `<prefix>*` (the single file too) reads both.

    Raises:
      ValueError: naming both outputs (a shard set by one of its shards) and what to do.
    """
    seen: dict[str, dict[tuple, str]] = {}  # prefix -> output (its key) -> its description
    for path in paths:
        found = files.shard_set_of(path)
        if found:
            prefix, count, suffix = found
            shard = (read_sidecar(path) or {}).get("shard")
            if isinstance(shard, Mapping) and isinstance(shard.get("num_shards"), int):
                count = shard["num_shards"]
            key: tuple = (count, suffix)
            name = f"{files.describe_shard_set(prefix, count, suffix)} (e.g. {path})"
        else:
            prefix = files.output_prefix(path)
            key, name = (path,), path
        sets = seen.setdefault(prefix if "://" in prefix else os.path.abspath(prefix), {})
        sets.setdefault(key, name)
        if len(sets) > 1:
            first, second = list(sets.values())[:2]
            shard_sets = all(len(k) == 2 for k in sets)
            raise ValueError(
                f"pretraining files hold two {'shard sets' if shard_sets else 'outputs'} of "
                f"the output prefix {prefix}, {first} and {second}: the corpus written twice "
                "(create_pretraining_data run again with another shard count or compression); "
                "name one " + ("set" if shard_sets else "output") + " in the file pattern, or "
                "delete the other (a rerun of create_pretraining_data with --overwrite "
                f"replaces the prefix's {'shards' if shard_sets else 'outputs'})")


def data_vocab_size(paths: Sequence[str]) -> tuple[int, str] | None:
    """(tokens of the largest vocabulary the data was made with, the sidecar recording it),
    or None where no sidecar says. Sidecars from before `vocab_size` was recorded name
    their vocab_file and its sha256: that file counts where it is still the same."""
    found = None
    counted: dict[tuple, int | None] = {}  # (vocab_file, sha256) -> its size (shards share one)
    for path in paths:
        meta = read_sidecar(path)
        if meta is None:
            continue
        size = meta.get("vocab_size")
        key = (meta.get("vocab_file"), meta.get("vocab_sha256"))
        if size is None and isinstance(key[0], str) and os.path.isfile(key[0]):
            if key not in counted:
                try:
                    counted[key] = (len(schema.load_vocab(key[0]))
                                    if files.sha256_file(key[0]) == key[1] else None)
                except schema.VocabError:
                    counted[key] = None
            size = counted[key]
        if isinstance(size, int) and (found is None or size > found[0]):
            found = (size, sidecar_path(path))
    return found


def data_vocab_file(paths: Sequence[str]) -> str | None:
    """The vocab.txt the data's sidecars name (create_pretraining_data's --vocab_file), where
    that file is still the one the data was made with (its sha256 matches), else None."""
    for path in paths:
        meta = read_sidecar(path)
        if meta is None:
            continue
        name, sha = meta.get("vocab_file"), meta.get("vocab_sha256")
        if isinstance(name, str) and sha and os.path.isfile(name) and \
                files.sha256_file(name) == sha:
            return name
        return None  # the shards of one run name one file (data_tokenizer_settings checks)
    return None


def data_tokenizer_settings(paths: Sequence[str]):
    """The tokenizer settings and vocabulary checksum the data was made with.

    Reads the sidecars of `paths` (create_pretraining_data records both); shards without a
    sidecar (Google's or Model Garden's files) say nothing.

    Returns:
      (TokenizerConfig, the sidecar it came from, vocab sha256 or None), or None when no
      shard has a sidecar.

    Raises:
      ValueError: two shards were made with different settings or vocabularies (naming
        both), which would mix incompatible ids in one run.
    """
    from data_prep.tokenizer_config import TokenizerConfig, TokenizerConfigError

    found = None
    for path in paths:
        meta = read_sidecar(path)
        if meta is None:
            continue
        source = sidecar_path(path)
        try:
            if isinstance(meta.get("tokenizer"), Mapping):
                config = TokenizerConfig.from_json_dict(meta["tokenizer"], source)
            elif "do_lower_case" in meta:
                config = TokenizerConfig(bool(meta["do_lower_case"]), meta.get("strip_accents"),
                                         bool(meta.get("tokenize_chinese_chars", True)))
            else:
                continue
        except TokenizerConfigError as e:
            raise ValueError(str(e)) from None
        current = (config, source, meta.get("vocab_sha256"))
        if found is None:
            found = current
        elif not (found[0].same_tokenization(config) and found[2] == current[2]):
            raise ValueError(
                f"pretraining data was made with different tokenizers: {found[1]} "
                f"({found[0].describe()}, vocab {str(found[2])[:12]}) and {source} "
                f"({config.describe()}, vocab {str(current[2])[:12]}); use shards of one run "
                "of create_pretraining_data")
    return found
