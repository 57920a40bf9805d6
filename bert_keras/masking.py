"""Dynamic masking: masked-LM predictions chosen in the input pipeline, anew on every pass.

RoBERTa (Liu et al. 2019, section 4.1) showed that masking each sequence afresh whenever it
is read works as well as or better than Google's static masks written `dupe_factor` times
into the data, at a tenth of the disk; later recipes (MosaicBERT, Cramming, Wettig et al.
2023, "Should You Mask 15% in Masked Language Modeling?") also raise the masking rate,
which static data fixes at creation time. Data written by `create_pretraining_data
--dynamic_masking` holds unmasked instances; `bert_keras.inputs.pretraining_dataset` calls
`mask_batch` on every batch of it.

Shapes: B = batch, S = max_seq_length, P = max_predictions_per_seq, W = words in a row.

The masking is tensorflow-text's: `text.mask_language_model` with a `RandomItemSelector`
(unselectable ids [CLS], [SEP], [PAD]; at most P selections per row; selection rate
masked_lm_prob) and a `MaskValuesChooser(vocab_size, mask_id, 0.8, 0.1)` (80% [MASK], 10% a
random id in [0, V), 10% unchanged). Two of their parts are replaced, in subclasses that
keep their contracts:

- **Random source.** Both draw from TensorFlow's stateful random ops, so masks would depend
  on how many batches this iterator made before (a resumed run, which skips the batches
  already trained on, or Keras' second iterator under a strategy would see other masks).
  Here every draw is stateless, seeded by (seed, pipeline, batch index): masks are a pure
  function of the run's --seed and the batch's place in the stream, which makes resumption
  exact and gives new masks on every pass (a sequence comes back in another batch).
- **Budget.** `RandomItemSelector` selects ceil(n * rate) items per row, capped at P. With
  whole-word masking an item is a word of several pieces, and P words could need more than
  the P prediction slots. The budget here counts pieces: ceil(n * rate) of the row's n
  selectable pieces, at most P, filled with items in random order while they fit (the
  first word that does not fit ends the row's selection; Google's tool skips it and tries
  shorter ones, a difference only when a long word comes up near the end of the budget).
  For single pieces this is exactly RandomItemSelector's count.

Whole-word masking (Google's `--do_whole_word_mask`) groups pieces into words with the
vocabulary's "##" prefix, looked up in a table of continuation ids at training time (the
data needs no extra feature): a word is a piece that does not start with "##" (or the first
piece after a special token: a segment truncated in mid-word) and the "##" pieces after it.
The words form a RaggedTensor [B, (W), (pieces)] and tensorflow-text masks them whole.

The output is padded to the static schema (masked_lm_* of length P), so the model and the
loss see what statically masked files give them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import tensorflow as tf
import tensorflow_text as text

from data_prep import schema

# Google's split of the chosen positions: [MASK], a random id, unchanged.
MASK_TOKEN_RATE = 0.8
RANDOM_TOKEN_RATE = 0.1
# float64 rounding of n * rate (0.3 * 10 = 3.0000000000000004) must not add a prediction.
_CEIL_SLACK = 1e-9


def budget(num_tokens: int, masked_lm_prob: float, max_predictions_per_seq: int) -> int:
    """Predictions for a row of `num_tokens` selectable pieces: min(P, ceil(n * rate))."""
    return min(max_predictions_per_seq, max(0, math.ceil(num_tokens * masked_lm_prob - _CEIL_SLACK)))


def derived_max_predictions(max_seq_length: int, masked_lm_prob: float) -> int:
    """P that never caps the budget: ceil(S * masked_lm_prob) (20 for BERT's 128 and 0.15)."""
    return max(1, min(max_seq_length, math.ceil(max_seq_length * masked_lm_prob - _CEIL_SLACK)))


@dataclasses.dataclass(frozen=True)
class DynamicMasking:
    """What masking needs: the vocabulary's special ids and the recipe.

    Attributes:
      vocab_size: V; random replacements are drawn uniformly from [0, V).
      mask_id: id of [MASK].
      unselectable_ids: ids never chosen: [CLS], [SEP], [PAD].
      masked_lm_prob: share of a row's selectable pieces to predict (before the cap P).
      max_predictions_per_seq: P, prediction slots per row.
      whole_word: mask whole words (a piece and its following "##" pieces).
      continuation_ids: ids of the "##" pieces (used with whole_word).
    """

    vocab_size: int
    mask_id: int
    unselectable_ids: tuple[int, ...]
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word: bool = False
    continuation_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1]; received {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq must be >= 1; received "
                             f"{self.max_predictions_per_seq}")

    @classmethod
    def from_vocab(cls, vocab: Sequence[str], masked_lm_prob: float = 0.15,
                   max_predictions_per_seq: int = 20, whole_word: bool = False
                   ) -> "DynamicMasking":
        """Looks the special and "##" ids up in a vocabulary (from `schema.load_vocab`)."""
        ids = schema.special_token_ids(list(vocab))
        return cls(
            vocab_size=len(vocab), mask_id=ids[schema.MASK],
            unselectable_ids=(ids[schema.CLS], ids[schema.SEP], ids[schema.PAD]),
            masked_lm_prob=float(masked_lm_prob),
            max_predictions_per_seq=int(max_predictions_per_seq), whole_word=bool(whole_word),
            continuation_ids=tuple(i for i, t in enumerate(vocab)
                                   if t.startswith(schema.SUFFIX_INDICATOR)))


class StatelessRandomItemSelector(text.RandomItemSelector):
    """tensorflow-text's RandomItemSelector drawing from a stateless seed, budget in pieces.

    Args:
      max_selections_per_batch: P, the most pieces selected in a row.
      selection_rate: share of a row's selectable pieces to select (rounded up).
      unselectable_ids: ids never selected (a word holding one is never selected).
      seed: int Tensor [2], the stateless seed of this batch.
    """

    def __init__(self, max_selections_per_batch, selection_rate, unselectable_ids, seed):
        super().__init__(max_selections_per_batch, selection_rate, list(unselectable_ids))
        self._seed = seed

    def get_selection_mask(self, input_ids, axis=1):
        """Boolean RaggedTensor [B, (items)]: the items selected in each row.

        Args:
          input_ids: RaggedTensor [B, (pieces)], or [B, (words), (pieces)] for whole words.
          axis: 1 (items are the entries of dimension 1).
        """
        if axis != 1:
            raise ValueError(f"StatelessRandomItemSelector selects along axis 1; received {axis}")
        selectable = self.get_selectable(input_ids, axis)  # bool [B, (items)]
        if input_ids.ragged_rank > 1:
            sizes = input_ids.row_lengths(axis=2)  # pieces per word, int64 [B, (W)]
        else:
            sizes = selectable.with_flat_values(tf.ones_like(selectable.flat_values, tf.int64))
        sizes = sizes.with_flat_values(
            tf.where(selectable.flat_values, sizes.flat_values, tf.zeros_like(sizes.flat_values)))
        pieces = tf.cast(tf.reduce_sum(sizes, axis=1), tf.float64)  # [B]
        row_budget = tf.math.ceil(pieces * self.selection_rate - _CEIL_SLACK)
        row_budget = tf.minimum(tf.cast(row_budget, tf.int64), self.max_selections_per_batch)
        # A uniform key per item; unselectable items sort after all others, padding last.
        keys = tf.random.stateless_uniform(tf.shape(selectable.flat_values), self._seed)
        keys = selectable.with_flat_values(tf.where(selectable.flat_values, keys, 2.0))
        dense_keys = keys.to_tensor(default_value=3.0)  # [B, W]
        dense_sizes = sizes.to_tensor(default_value=0)  # [B, W]
        order = tf.argsort(dense_keys, axis=1, stable=True)  # items in random order
        sorted_sizes = tf.gather(dense_sizes, order, batch_dims=1)
        take_sorted = _fill(sorted_sizes, row_budget, self.max_selections_per_batch)
        take = tf.gather(take_sorted, tf.argsort(order, axis=1), batch_dims=1)  # back in place
        return tf.RaggedTensor.from_tensor(take, lengths=selectable.row_lengths())


def _fill(sizes: tf.Tensor, budget: tf.Tensor, max_steps: int) -> tf.Tensor:
    """bool [B, W]: each row's items, in order, taken while they fit its budget; an item
    that would overflow it is skipped and later ones are still tried (Google's
    create_masked_lm_predictions, and data_prep's static whole-word masking).

    Args:
      sizes: int64 [B, W], pieces per item in the order they are tried (0: never taken).
      budget: int64 [B], the most pieces taken in a row (<= max_steps).
      max_steps: a bound on the items any row takes (each has at least one piece).
    """
    # The leading run that fits at once (every item, for single pieces), then one item per
    # step: the first untaken one that still fits. An item skipped before it was larger
    # than the room then, which only shrinks, so it never fits later.
    taken = (tf.cumsum(sizes, axis=1) <= budget[:, None]) & (sizes > 0)
    room = budget - tf.reduce_sum(tf.where(taken, sizes, tf.zeros_like(sizes)), axis=1)

    def fitting(taken, room):
        return (sizes > 0) & (sizes <= room[:, None]) & ~taken

    def step(taken, room, fits):
        pick = tf.one_hot(tf.argmax(tf.cast(fits, tf.int32), axis=1), tf.shape(sizes)[1],
                          on_value=True, off_value=False) & tf.reduce_any(fits, axis=1)[:, None]
        taken = taken | pick
        room = room - tf.reduce_sum(tf.where(pick, sizes, tf.zeros_like(sizes)), axis=1)
        return taken, room, fitting(taken, room)

    taken, _, _ = tf.while_loop(lambda taken, room, fits: tf.reduce_any(fits), step,
                                (taken, room, fitting(taken, room)),
                                maximum_iterations=max_steps)
    return taken


class StatelessMaskValuesChooser(text.MaskValuesChooser):
    """tensorflow-text's MaskValuesChooser drawing from a stateless seed.

    Each selected piece independently becomes [MASK] with probability mask_token_rate, a
    uniformly random id in [0, vocab_size) with probability random_token_rate, and stays
    itself otherwise (tensorflow-text's rule).

    Args:
      vocab_size, mask_token, mask_token_rate, random_token_rate: as MaskValuesChooser.
      seed: int Tensor [2], the stateless seed of this batch.
    """

    def __init__(self, vocab_size, mask_token, mask_token_rate, random_token_rate, seed):
        super().__init__(vocab_size, mask_token, mask_token_rate, random_token_rate)
        if mask_token_rate + random_token_rate > 1:
            raise ValueError("mask_token_rate + random_token_rate must be <= 1")
        self._seed = seed

    def get_mask_values(self, masked_lm_ids):
        """RaggedTensor like `masked_lm_ids` ([B, (n)]) with the values to write."""
        flat = masked_lm_ids.flat_values
        coin_seed, id_seed = tf.unstack(tf.random.experimental.stateless_split(self._seed, 2))
        coin = tf.random.stateless_uniform(tf.shape(flat), coin_seed)
        random_ids = tf.random.stateless_uniform(tf.shape(flat), id_seed, minval=0,
                                                 maxval=self.vocab_size, dtype=tf.int64)
        values = tf.where(
            coin < self._mask_token_rate, tf.cast(self.mask_token, flat.dtype),
            tf.where(coin < self._mask_token_rate + self.random_token_rate,
                     tf.cast(random_ids, flat.dtype), flat))
        return masked_lm_ids.with_flat_values(values)


def _continuation_table(masking: DynamicMasking) -> tf.Tensor:
    """bool [V]: True for "##" pieces."""
    table = [False] * masking.vocab_size
    for i in masking.continuation_ids:
        table[i] = True
    return tf.constant(table, tf.bool)


def words(ids: tf.RaggedTensor, masking: DynamicMasking) -> tf.RaggedTensor:
    """Groups the pieces of each row into words: RaggedTensor [B, (W), (pieces)].

    A word starts at a piece that is not a "##" continuation, at a special token (which is a
    word of its own), after a special token, and at the start of a row.

    Args:
      ids: int RaggedTensor [B, (pieces)].
      masking: gives the continuation ids and the special ids.
    """
    flat = ids.flat_values
    vocab_size = masking.vocab_size
    continuation = tf.gather(_continuation_table(masking),
                             tf.clip_by_value(tf.cast(flat, tf.int64), 0, vocab_size - 1))
    specials = tf.constant(masking.unselectable_ids, flat.dtype)
    special = tf.reduce_any(tf.equal(flat[:, None], specials[None, :]), axis=1)
    after_special = tf.concat([[False], special[:-1]], axis=0)
    row_start = tf.equal(tf.ragged.range(ids.row_lengths()).flat_values, 0)
    start = ~continuation | special | after_special | row_start  # [total pieces]
    pieces_of_words = tf.RaggedTensor.from_row_starts(
        flat, tf.cast(tf.where(start)[:, 0], tf.int64))
    words_per_row = tf.reduce_sum(ids.with_flat_values(tf.cast(start, tf.int64)), axis=1)
    return tf.RaggedTensor.from_row_lengths(pieces_of_words, words_per_row)


def mask_batch(input_ids: tf.Tensor, input_mask: tf.Tensor, masking: DynamicMasking,
               seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """Chooses and applies masked-LM predictions for a batch of unmasked sequences.

    Args:
      input_ids: int32 Tensor [B, S], unmasked token ids, 0-padded.
      input_mask: int32 Tensor [B, S], 1 for real tokens (a prefix of each row), 0 for padding.
      masking: the vocabulary's ids and the recipe.
      seed: int64 Tensor [2]; equal seeds give equal masks.

    Returns:
      dict with the schema's model names:
        input_word_ids: int32 [B, S], input_ids after masking (padding unchanged)
        masked_lm_positions: int32 [B, P], ascending, 0-padded
        masked_lm_ids: int32 [B, P], the original ids, 0-padded
        masked_lm_weights: float32 [B, P], 1.0 real, 0.0 padding
    """
    p = masking.max_predictions_per_seq
    input_ids = tf.convert_to_tensor(input_ids)
    seq_length = input_ids.shape[1]
    lengths = tf.reduce_sum(tf.cast(input_mask, tf.int64), axis=1)
    ids = tf.RaggedTensor.from_tensor(input_ids, lengths=lengths)  # [B, (S_i)]
    select_seed, value_seed = tf.unstack(
        tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 2))
    items = words(ids, masking) if masking.whole_word else ids
    selector = StatelessRandomItemSelector(p, masking.masked_lm_prob, masking.unselectable_ids,
                                           select_seed)
    chooser = StatelessMaskValuesChooser(masking.vocab_size, masking.mask_id, MASK_TOKEN_RATE,
                                         RANDOM_TOKEN_RATE, value_seed)
    masked, positions, labels = text.mask_language_model(items, selector, chooser, axis=1)
    masked_ids = masked.to_tensor(default_value=0, shape=[None, seq_length])
    weights = positions.with_flat_values(tf.ones_like(positions.flat_values, tf.float32))
    out = {
        schema.INPUT_WORD_IDS: tf.cast(masked_ids, tf.int32),
        schema.MASKED_LM_POSITIONS: tf.cast(positions.to_tensor(0, shape=[None, p]), tf.int32),
        schema.MASKED_LM_IDS: tf.cast(labels.to_tensor(0, shape=[None, p]), tf.int32),
        schema.MASKED_LM_WEIGHTS: weights.to_tensor(0.0, shape=[None, p]),
    }
    static_batch = input_ids.shape[0]
    out[schema.INPUT_WORD_IDS].set_shape([static_batch, input_ids.shape[1]])
    for name in (schema.MASKED_LM_POSITIONS, schema.MASKED_LM_IDS, schema.MASKED_LM_WEIGHTS):
        out[name].set_shape([static_batch, p])
    return out
