"""run_squad's doc-stride windows in the graph, for the exports that read long inputs as
fine-tuning read them: span QA's contexts (`export_span_qa`) and the tagger's long sentences
(`export_tagger`, as run_tagger's `data_prep.tagging` windows them).
"""

from __future__ import annotations

from data_prep import tf_logging

tf = tf_logging.import_tensorflow()


def windows(pieces: tf.RaggedTensor, room, stride):
    """Doc-stride windows over each row's pieces (`squad.doc_spans`).

    Args:
      pieces: [B, (T)], each row's WordPieces.
      room: int64 [B] (or a scalar), the most pieces a row's window holds.
      stride: int64 scalar or [B] (or a Python int >= 1), pieces between window starts.

    Returns:
      (count, row, start, window): int64 [B] each row's windows, 1 + ceil(max(T - room, 0)
      / min(room, stride)) (one empty window for an empty row); int64 [W] each window's
      row; int64 [W] the piece it starts at; [W, (pieces)] its pieces. Windows row by row.
    """
    lengths = pieces.row_lengths()  # [B]
    room = tf.broadcast_to(tf.cast(room, tf.int64), tf.shape(lengths, out_type=tf.int64))
    step = tf.minimum(room, tf.cast(stride, tf.int64))  # all windows but the last: `room` long
    count = 1 + (tf.maximum(lengths - room, 0) + step - 1) // step  # [B]
    row = tf.repeat(tf.range(pieces.nrows()), count)  # [W]
    start = tf.ragged.range(count).flat_values * tf.gather(step, row)  # [W]
    length = tf.minimum(tf.gather(lengths, row) - start, tf.gather(room, row))  # [W]
    place = tf.ragged.range(length)  # [W, (pieces)]
    first = tf.gather(pieces.row_starts(), row) + start  # [W] in pieces.flat_values
    index = tf.gather(first, place.value_rowids()) + place.flat_values
    return count, row, start, place.with_flat_values(tf.gather(pieces.flat_values, index))


def max_context(window: tf.RaggedTensor, piece: tf.Tensor, pieces) -> tf.Tensor:
    """run_squad's token_is_max_context (`squad.is_max_context`): whether a window gives a
    piece its most context, min(left, right) + 0.01 * the window's length, the first such
    window on a tie.

    Args:
      window: [W, (pieces)], `windows`' windows.
      piece: int64 [P], each window piece's index in the batch's flat pieces.
      pieces: how many pieces the batch has.

    Returns:
      bool [P], in window order.
    """
    which = window.value_rowids()  # [P]
    size = tf.gather(window.row_lengths(), which)
    place = tf.ragged.range(window.row_lengths()).flat_values  # [P]
    score = 100 * tf.minimum(place, size - 1 - place) + size  # in hundredths: exact
    best = tf.math.unsorted_segment_max(score, piece, pieces)
    tied = tf.where(score == tf.gather(best, piece), which, tf.size(which, tf.int64))
    return tf.gather(tf.math.unsorted_segment_min(tied, piece, pieces), piece) == which
