"""BertEmbeddings: token + segment + learned position embeddings, LayerNorm, dropout."""

import keras
from keras import ops

from bert_keras import kernels
from bert_keras.layers.activations import clone_initializer
from bert_keras.layers.dropout import Dropout
from bert_keras.layers.layer_norm import LayerNorm


def word_lookup(table, ids):
    """table[ids]: the rows of `table` [V, H] for `ids` (int32 [B, S]) -> [B, S, H].

    On TensorFlow the gradient reaches the optimizer with each id's rows already summed
    (`_tf_word_lookup`); other backends' gather gradients are dense.
    """
    if keras.backend.backend() != "tensorflow":
        return ops.take(table, ids, axis=0)
    return _tf_word_lookup(table, ids)


def _tf_word_lookup(table, ids):
    """`tf.gather(table, ids)` whose gradient holds each id once.

    TensorFlow's own gather gradient is a `tf.IndexedSlices` with one row per occurrence
    ([PAD] alone occurs in every padded batch many times). It is the right gradient, but
    Keras' TensorFlow ops keep IndexedSlices as they are, so an optimizer written in
    `keras.ops` sees the occurrences apart: Keras' Adam, AdamW, Lamb, ... square each
    before the duplicates are summed (the second moment gets sum(g_i^2), not (sum g_i)^2,
    and a row of a repeated id moves by up to sqrt(n) times the learning rate), and
    `clipnorm` / `global_clipnorm` take the norm of the occurrences (keras-team/keras
    issue 18985). A correctness fix, so not a kernel of `bert_keras.kernels`: it cannot be
    switched off.

    The gradient here is, per traced computation:
      - outside XLA, one replica: `tf.IndexedSlices` of the batch's unique ids, the rows
        of each summed (`tf.unique` + `unsorted_segment_sum` over the B * S rows; never a
        [V, H] table), so Keras' sparse update paths stay;
      - under XLA (`jit_compile`, TPUs: `tf.unique` has no static shape) or with several
        replicas in sync (tf.distribute all-gathers IndexedSlices, which would put an id
        back once per replica): the dense [V, H] gradient, the sum of TensorFlow's
        IndexedSlices; what our optimizers densified anyway (`optimization._dense`).
    """
    import tensorflow as tf

    @tf.custom_gradient
    def lookup(table, ids):
        flat_ids = tf.reshape(ids, [-1])  # [B * S]

        def gradient(upstream):  # upstream: [B, S, H]
            rows = tf.reshape(upstream, [-1, tf.shape(table)[1]])  # [B * S, H]
            vocab = tf.shape(table, out_type=flat_ids.dtype)[0]
            replicas = tf.distribute.get_replica_context()
            several = replicas is not None and replicas.num_replicas_in_sync > 1
            if kernels.in_tensorflow_xla() or several:
                summed = tf.math.unsorted_segment_sum(rows, flat_ids, vocab)  # [V, H]
            else:
                unique_ids, position = tf.unique(flat_ids)  # [U], [B * S]
                summed = tf.IndexedSlices(
                    tf.math.unsorted_segment_sum(rows, position, tf.size(unique_ids)),
                    unique_ids, tf.shape(table, out_type=flat_ids.dtype))  # U rows [U, H]
            return summed, None

        return tf.gather(table, ids), gradient

    # The variable read outside the custom gradient (inside, TensorFlow would want the
    # variable's gradient from it); the read passes the IndexedSlices on to the variable.
    return lookup(tf.convert_to_tensor(table), ids)


@keras.saving.register_keras_serializable(package="bert_keras")
class BertEmbeddings(keras.layers.Layer):
    """The input layer of BERT (Devlin et al. 2018, section 3, figure 2).

    output = Dropout(LayerNorm(word[input_word_ids] + position[0:S] + segment[input_type_ids]))

    Weights are named after Google's checkpoint scope `bert/embeddings/...`:
    `word_embeddings [V, H]`, `position_embeddings [P, H]`, `token_type_embeddings [T, H]`,
    and `layer_norm` (gamma, beta).

    Mixed precision: the tables stay float32 and are read as float32 (variables created
    with `autocast=False`; `keras.layers.Embedding` turns off its layer's autocasting
    instead, which a layer called outside a model's autocast scope does not honour); the
    three lookups are summed and normalized in float32 and only the output is in the
    compute dtype. Autocasting the tables instead would cast each whole [V, H] table to bfloat16 before the lookup, and
    under XLA (JAX, TensorFlow's `jit_compile`, TPUs) the gradient of that lookup is a
    bfloat16 scatter-add into a bfloat16 [V, H] buffer: slow on a GPU, and lossy (a
    frequent token's row sums thousands of contributions with an 8-bit mantissa). Here
    every embedding gradient is accumulated in float32 (tests/test_mixed_precision.py).

    Args:
      vocab_size: V, number of WordPiece ids.
      hidden_size: H, embedding width.
      max_sequence_length: P, rows of the position table; inputs may be shorter.
      type_vocab_size: T, number of segment ids.
      dropout: dropout rate applied after LayerNorm.
      layer_norm_epsilon: LayerNorm epsilon (1e-12 in BERT: variance of an embedding row is
        far larger than that, so it only guards against division by zero).
      initializer: initializer of the three tables (TruncatedNormal(0.02) in BERT).
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        max_sequence_length,
        type_vocab_size=2,
        dropout=0.1,
        layer_norm_epsilon=1e-12,
        initializer="truncated_normal",
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (
            ("vocab_size", vocab_size),
            ("hidden_size", hidden_size),
            ("max_sequence_length", max_sequence_length),
            ("type_vocab_size", type_vocab_size),
        ):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.max_sequence_length = max_sequence_length
        self.type_vocab_size = type_vocab_size
        self.dropout = dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer = keras.initializers.get(initializer)
        self.layer_norm = LayerNorm(
            epsilon=layer_norm_epsilon, name="layer_norm", dtype=self.dtype_policy
        )
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.word_embeddings = self.add_weight(
            name="word_embeddings",
            shape=(self.vocab_size, self.hidden_size),
            initializer=clone_initializer(self.initializer),
            autocast=False,  # read as float32 under any policy (class docstring)
        )
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_sequence_length, self.hidden_size),
            initializer=clone_initializer(self.initializer),
            autocast=False,  # read as float32 under any policy (class docstring)
        )
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings",
            shape=(self.type_vocab_size, self.hidden_size),
            initializer=clone_initializer(self.initializer),
            autocast=False,  # read as float32 under any policy (class docstring)
        )
        self.layer_norm.build((None, None, self.hidden_size))
        self.built = True

    def call(self, input_word_ids, input_type_ids, training=None):
        """Embeds a batch of token ids.

        Args:
          input_word_ids: int32 Tensor of shape [B, S].
          input_type_ids: int32 Tensor of shape [B, S], segment ids.
          training: Python bool, whether dropout is active.

        Returns:
          float Tensor of shape [B, S, H], in the compute dtype.
        """
        seq_length = ops.shape(input_word_ids)[1]
        if isinstance(seq_length, int) and seq_length > self.max_sequence_length:
            raise ValueError(
                f"Sequence length {seq_length} exceeds the position table "
                f"(max_sequence_length={self.max_sequence_length})."
            )
        # float32 lookups and sum: their gradients (a scatter-add into [V, H], a product
        # into [T, H], a sum over the batch into [S, H]) are float32 under any policy.
        # (Under a pure "bfloat16" policy, as a bfloat16 serving export builds, the tables
        # are bfloat16 variables: the rows are widened after the lookup; a no-op otherwise.)
        words = ops.cast(word_lookup(self.word_embeddings, input_word_ids), "float32")
        # The segment table has T = 2 rows: a one-hot matmul (Google's modeling.py does the
        # same, "always faster for a small vocabulary") gives its gradient as a dense
        # [B * S, T]^T x [B * S, H] product instead of a scatter-add of B * S rows into T,
        # which XLA on a CPU ran at seconds per step (BUILD_NOTES.md, issue 41).
        types = ops.matmul(
            ops.one_hot(input_type_ids, self.type_vocab_size, dtype="float32"),
            ops.cast(self.token_type_embeddings, "float32"),
        )  # [B, S, T] x [T, H] -> [B, S, H]
        positions = ops.cast(self.position_embeddings[:seq_length], "float32")  # [S, H]
        if training and kernels.applies("position_one_hot"):
            # The same rows from a one-hot product: the table's gradient is then a matmul
            # over the batch's rows, not a sum over the batch axis (kernel docstring). In
            # training only: without a gradient the broadcast sum is the cheaper one.
            ids = ops.broadcast_to(ops.arange(seq_length, dtype="int32")[None, :],
                                   ops.shape(input_word_ids))
            x = words + types + ops.matmul(
                ops.one_hot(ids, seq_length, dtype="float32"), positions)
        else:
            x = words + types + positions[None, :, :]  # float32 [B, S, H]
        x = self.layer_norm(x)  # float32 statistics, output in the compute dtype
        return self.dropout_layer(x, training=training)

    def get_embedding_table(self):
        """The word-embedding variable [V, H], for heads that tie their output to it."""
        return self.word_embeddings

    def compute_output_shape(self, input_word_ids_shape, input_type_ids_shape=None):
        return tuple(input_word_ids_shape) + (self.hidden_size,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "hidden_size": self.hidden_size,
                "max_sequence_length": self.max_sequence_length,
                "type_vocab_size": self.type_vocab_size,
                "dropout": self.dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
