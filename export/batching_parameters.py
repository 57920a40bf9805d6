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

  max_execution_batch_size  (with enable_large_batch_splitting: true) the most rows one run
                       of the model takes: as many of the shortest bucket's requests as fill
                       one request at max_seq_length (S / shortest bucket, down to a power of
                       two, at most 32): where a batch pays for itself. At batch 1 on a CPU a
                       short request's cost is mostly reading the weights, which a batch
                       reads once for all its requests: on the 2-core CPU of BUILD_NOTES.md
                       section 8.11 a base-size batch of 8 requests of 16 positions cost
                       32.6 ms per request against 84.0 alone, one of 8 at 128 positions
                       163.9 against 162.2.
  max_batch_size       the most texts one request may send: QUEUED_ROWS. TF Serving refuses
                       a larger request (INVALID_ARGUMENT "Task size N is larger than
                       maximum input batch size"), and replays the export's warmup requests
                       (4 texts) through the batching layer when it loads the model: before
                       large batch splitting, max_batch_size was the execution batch too,
                       so a fixed-length export (1) failed to load and requests of more
                       than 8 texts were refused at the default S=128. A request larger
                       than the execution batch is split across batches, and its outputs
                       concatenated, which needs outputs of one width whatever the batch:
                       the classifier's and span QA's ([batch, labels], [batch, S]).
                       The tagger's are as wide as a batch's longest row of words, so its
                       requests are not split (`split_requests=False`): max_batch_size is
                       then the execution batch, LARGEST_BATCH rows, and a tagger request
                       takes at most that many texts.
  allowed_batch_sizes  none: batches run at the size they have. TF Serving would pad a batch
                       to an allowed size with copies of its first request (a long context
                       is many windows in span QA), and TensorFlow's graph runtime compiles
                       nothing per shape.
  batch_timeout_micros how long a batch waits for more requests when a thread is free:
                       BATCH_TIMEOUT_MICROS, small against a short request's latency
                       (under load the queue fills while a batch runs anyway).
  num_batch_threads    batches run at once: NUM_BATCH_THREADS (each uses the server's
                       intra-op threads; measured in section 8.11).
  max_enqueued_batches QUEUED_ROWS rows in batches of the execution size: beyond that the
                       server answers UNAVAILABLE at once instead of queueing without bound
                       (a request of QUEUED_ROWS texts fits an idle queue).
  pad_variable_length_inputs  false: the text inputs have no variable dimension. The
                       server pads a variable dimension with the tensor's *first element*
                       (tensorflow_serving/batching/batching_util.h), which for the
                       tagger's `words` or span QA's `ids` would add words or unmask
                       padding: batched requests to those signatures must have equal widths.

The fields are TF Serving 2.12's (enable_large_batch_splitting and max_execution_batch_size
are there since 2.4); its rule that the last allowed batch size equals max_batch_size does
not arise without allowed sizes.

An existing batching_parameters.txt beside the versions is kept when it says the same and
refused otherwise (`check_beside`), as an existing version is.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

from export.saved_model_writer import ExportError

FILE_NAME = "batching_parameters.txt"  # beside the versions (--batching_parameters_file)
PER_MODEL_FILE = "batching_params.pbtxt"  # in the version (TF Serving's fixed name)
BATCH_TIMEOUT_MICROS = 2000
NUM_BATCH_THREADS = 2
QUEUED_ROWS = 256  # the queue's bound in rows, and the largest request split into batches
LARGEST_BATCH = 32
# The first line of both files names the export's length buckets (the last one its
# max_seq_length): `to_text` writes it, `recorded_buckets` reads it back (export.verify).
_HEADER = "# TF Serving batching parameters for length buckets "


def for_buckets(buckets: Sequence[int], split_requests: bool = True) -> dict:
    """The parameters for an export with these length buckets (module docstring).

    Args:
      buckets: ascending lengths, the last one max_seq_length (`length_buckets.resolve`).
      split_requests: whether TF Serving may split a request across batches (its outputs
        have one width whatever the batch; not the tagger's).

    Returns:
      BatchingParameters field -> value (an int or a bool).
    """
    largest = 1
    while largest * 2 <= min(buckets[-1] // max(buckets[0], 1), LARGEST_BATCH):
        largest *= 2
    execution = largest if split_requests else LARGEST_BATCH
    params = {"max_batch_size": QUEUED_ROWS if split_requests else execution,
              "batch_timeout_micros": BATCH_TIMEOUT_MICROS,
              "max_enqueued_batches": QUEUED_ROWS // execution,
              "num_batch_threads": NUM_BATCH_THREADS}
    if split_requests:
        params.update(enable_large_batch_splitting=True, max_execution_batch_size=execution)
    params["pad_variable_length_inputs"] = False
    return params


def text_for(buckets: Sequence[int], split_requests: bool = True) -> str:
    """The file's contents for an export with these buckets: `for_buckets` as text."""
    return to_text(for_buckets(buckets, split_requests), buckets)


def to_text(params: dict, buckets: Sequence[int]) -> str:
    """`params` as a text-format BatchingParameters (wrapper fields as `{ value: N }`)."""
    lines = [f"{_HEADER}{','.join(map(str, buckets))} (written by the bert-keras export; "
             "docs/serving.md)"]
    for name, value in params.items():
        if name == "pad_variable_length_inputs":  # a plain bool; the others are wrappers
            lines.append(f"{name}: {'true' if value else 'false'}")
        elif isinstance(value, list):
            lines += [f"{name}: {v}" for v in value]
        else:
            shown = ("true" if value else "false") if isinstance(value, bool) else value
            lines.append(f"{name} {{ value: {shown} }}")
    return "\n".join(lines) + "\n"


def recorded_buckets(text: str) -> tuple[int, ...] | None:
    """The length buckets a file written by `to_text` names in its first line (ascending,
    the last one the export's max_seq_length); None when its first line is not that."""
    found = re.match(re.escape(_HEADER) + r"([0-9]+(?:,[0-9]+)*) ", text)
    if found is None:
        return None
    buckets = tuple(int(b) for b in found.group(1).split(","))
    ascending = list(buckets) == sorted(set(buckets)) and buckets[0] > 0
    return buckets if ascending else None


def check_beside(export_dir: str, text: str) -> bool:
    """Whether `<export_dir>/batching_parameters.txt` must be written (False: it says `text`).

    A local file and a remote one (`gs://`, read through tf.io.gfile) are compared the same
    way: their bytes decoded as UTF-8 (a bad byte compares unequal), "\\r\\n" and a lone
    "\\r" read as "\\n" (universal newlines). `write_beside` writes in text mode, which on
    Windows ends its lines in "\\r\\n", and TF Serving's text-format parser reads "\\r" as
    whitespace: such a file says the same parameters, wherever it is kept.

    Raises:
      ExportError: it exists with other contents (never overwritten).
    """
    from data_prep import files

    path = os.path.join(export_dir, FILE_NAME)
    if not files.exists(path):  # a dangling link too: written where it points
        return True
    found = files.read_bytes(path).decode("utf-8", errors="replace")
    if found.replace("\r\n", "\n").replace("\r", "\n") == text:
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
