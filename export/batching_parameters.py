"""TF Serving's batching parameters for a text-in export, chosen for its length buckets.

TF Serving can merge concurrent requests to one model into one batch before running it
(`--enable_batching`). It reads the parameters as a text-format
`tensorflow.serving.BatchingParameters` protocol buffer
(tensorflow_serving/servables/tensorflow/session_bundle_config.proto), from one of two
places; the text-in exports (classifier, tagger, span QA) write both:

  <export_dir>/batching_parameters.txt   the whole server's, with
      --enable_batching --batching_parameters_file=<export_dir>/batching_parameters.txt
  <export_dir>/<version>/batching_params.pbtxt   this model's, with
      --enable_batching --enable_per_model_batching_parameters
      (a server of several models batches only those whose version has the file; the
      thread count still comes from the server's --batching_parameters_file)

The requests of a text-in signature are strings [batch]: the server concatenates them, and
the export's graph then packs the merged batch and runs the encoder at its bucket length
(`export.length_buckets`). The values:

  max_batch_size       as many of the shortest bucket's requests as fill one request at
                       max_seq_length (S / shortest bucket, down to a power of two, at
                       most 32): where a batch pays for itself. At batch 1 on a CPU a
                       short request's cost is mostly reading the weights, which a batch
                       reads once for all its requests: on the 2-core CPU of BUILD_NOTES.md
                       section 8.11 a base-size batch of 8 requests of 16 positions cost
                       32.6 ms per request against 84.0 alone, one of 8 at 128 positions
                       163.9 against 162.2.
  allowed_batch_sizes  powers of two up to max_batch_size: few shapes, at most half a
                       batch of padding (the server repeats a request's first row).
                       Not for span QA (`padded_batches=False`): a request there is as
                       many encoder rows as its context takes windows, so a repeated
                       first request could be a long context run up to 8 times more
                       (a 50 KB context is 77 windows at S=384); the encoder's batch is
                       the windows' count anyway, whatever the requests'.
  batch_timeout_micros how long a batch waits for more requests when a thread is free:
                       BATCH_TIMEOUT_MICROS, small against a short request's latency
                       (under load the queue fills while a batch runs anyway).
  num_batch_threads    batches run at once: NUM_BATCH_THREADS (each uses the server's
                       intra-op threads; measured in section 8.11).
  max_enqueued_batches MAX_ENQUEUED_BATCHES: beyond that many waiting batches the server
                       answers UNAVAILABLE at once instead of queueing without bound.
  pad_variable_length_inputs  false: the text inputs have no variable dimension. The
                       server pads a variable dimension with the tensor's *first element*
                       (tensorflow_serving/batching/batching_util.h), which for the
                       tagger's `words` or span QA's `ids` would add words or unmask
                       padding: batched requests to those signatures must have equal widths.

An existing batching_parameters.txt beside the versions is kept when it says the same and
refused otherwise (`check_beside`), as an existing version is.
"""

from __future__ import annotations

import os
from typing import Sequence

from export.saved_model_writer import ExportError

FILE_NAME = "batching_parameters.txt"  # beside the versions (--batching_parameters_file)
PER_MODEL_FILE = "batching_params.pbtxt"  # in the version (TF Serving's fixed name)
BATCH_TIMEOUT_MICROS = 2000
NUM_BATCH_THREADS = 2
MAX_ENQUEUED_BATCHES = 32
LARGEST_BATCH = 32


def for_buckets(buckets: Sequence[int], padded_batches: bool = True) -> dict:
    """The parameters for an export with these length buckets (module docstring).

    Args:
      buckets: ascending lengths, the last one max_seq_length (`length_buckets.resolve`).
      padded_batches: whether batches are padded to `allowed_batch_sizes` (not where a
        request can be many encoder rows: span QA's windows).

    Returns:
      BatchingParameters field -> value (an int, a list of ints, or a bool).
    """
    largest = 1
    while largest * 2 <= min(buckets[-1] // max(buckets[0], 1), LARGEST_BATCH):
        largest *= 2
    allowed, size = [], 1
    while size <= largest:
        allowed.append(size)
        size *= 2
    params = {
        "max_batch_size": largest,
        "batch_timeout_micros": BATCH_TIMEOUT_MICROS,
        "max_enqueued_batches": MAX_ENQUEUED_BATCHES,
        "num_batch_threads": NUM_BATCH_THREADS,
        "allowed_batch_sizes": allowed,
        "pad_variable_length_inputs": False,
    }
    if not padded_batches:
        del params["allowed_batch_sizes"]
    return params


def text_for(buckets: Sequence[int], padded_batches: bool = True) -> str:
    """The file's contents for an export with these buckets: `for_buckets` as text."""
    return to_text(for_buckets(buckets, padded_batches), buckets)


def to_text(params: dict, buckets: Sequence[int]) -> str:
    """`params` as a text-format BatchingParameters (wrapper fields as `{ value: N }`)."""
    lines = [f"# TF Serving batching parameters for length buckets "
             f"{','.join(map(str, buckets))} (written by the bert-keras export; "
             "docs/serving.md)"]
    for name, value in params.items():
        if isinstance(value, bool):
            lines.append(f"{name}: {'true' if value else 'false'}")
        elif isinstance(value, list):
            lines += [f"{name}: {v}" for v in value]
        else:
            lines.append(f"{name} {{ value: {value} }}")
    return "\n".join(lines) + "\n"


def check_beside(export_dir: str, text: str) -> bool:
    """Whether `<export_dir>/batching_parameters.txt` must be written (False: it says `text`).

    Raises:
      ExportError: it exists with other contents (never overwritten).
    """
    path = os.path.join(export_dir, FILE_NAME)
    if not os.path.lexists(path):
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        if f.read() == text:
            return False
    raise ExportError(f"{path} exists with other batching parameters: refusing to overwrite "
                      "it. Remove it, or export with the --max_seq_length and "
                      "--length_buckets it was written for.")


def write_beside(export_dir: str, text: str) -> str:
    """Writes `<export_dir>/batching_parameters.txt` atomically unless it says `text`
    already; returns its path (`check_beside` raises on other contents)."""
    from data_prep import files

    path = os.path.join(export_dir, FILE_NAME)
    if check_beside(export_dir, text):
        with files.atomic_output(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
    return path
