"""MaskedLMHead: BERT's masked-LM output, tied to the word-embedding table."""

import keras
from keras import ops

from bert_keras.layers.activations import clone_initializer, get_activation
from bert_keras.layers.dense import Dense
from bert_keras.layers.layer_norm import LayerNorm


@keras.saving.register_keras_serializable(package="bert_keras")
class MaskedLMHead(keras.layers.Layer):
    """Predicts the original token at masked positions (Google's `cls/predictions` scope).

        x = LayerNorm(act(Dense_H(gather(sequence_output, masked_positions))))
        logits = x @ word_embeddings^T + output_bias

    Only the P masked positions are projected onto the vocabulary: projecting all S
    positions costs S/P times more in the largest matmul of pretraining.

    Shapes: B = batch, S = sequence length, P = predictions per sequence, H = hidden size,
    V = vocabulary size.

    Args:
      embedding_layer: the encoder's `BertEmbeddings` (anything with `get_embedding_table()`
        returning a [V, H] variable). The head's output projection *is* that table: the only
        new vocabulary-sized weight is `output_bias` [V].
      activation: activation of the transform ("gelu" in BERT: the config's hidden_act).
      layer_norm_epsilon: LayerNorm epsilon (1e-12).
      initializer: kernel initializer of the transform dense layer.
    """

    def __init__(
        self,
        embedding_layer,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        initializer="truncated_normal",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.embedding_layer = embedding_layer
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer = keras.initializers.get(initializer)
        self._activation_fn = get_activation(activation)

    def build(self, sequence_output_shape, masked_positions_shape=None):
        hidden_size = sequence_output_shape[-1]
        vocab_size = self.embedding_layer.get_embedding_table().shape[0]
        self.transform_dense = Dense(
            hidden_size,
            kernel_initializer=clone_initializer(self.initializer),
            name="transform_dense",
            dtype=self.dtype_policy,
        )
        self.transform_dense.build((None, None, hidden_size))
        self.layer_norm = LayerNorm(
            epsilon=self.layer_norm_epsilon, name="layer_norm", dtype=self.dtype_policy
        )
        self.layer_norm.build((None, None, hidden_size))
        self.output_bias = self.add_weight(
            name="output_bias", shape=(vocab_size,), initializer="zeros"
        )
        self.built = True

    def call(self, sequence_output, masked_positions=None):
        """Computes vocabulary logits at the masked positions.

        Args:
          sequence_output: float Tensor [B, S, H], the encoder's last layer; or, with
            `masked_positions=None`, [B, P, H]: the last layer already taken at the P
            masked positions.
          masked_positions: int32 Tensor [B, P], indices into S (padding entries may be 0;
            their predictions get weight 0 in the loss), or None (see above).

        Returns:
          float32 Tensor [B, P, V] of logits (float32 even under mixed precision, for a
          stable softmax cross-entropy).
        """
        if masked_positions is None:
            x = sequence_output  # [B, P, H]
        else:
            positions = ops.cast(masked_positions, "int32")[:, :, None]  # [B, P, 1]
            x = ops.take_along_axis(sequence_output, positions, axis=1)  # [B, P, H]
        x = self._activation_fn(self.transform_dense(x))
        x = self.layer_norm(x)
        table = ops.cast(self.embedding_layer.get_embedding_table(), self.compute_dtype)
        logits = ops.matmul(x, ops.transpose(table))  # [B, P, H] x [H, V] -> [B, P, V]
        return ops.cast(logits, "float32") + ops.cast(self.output_bias, "float32")

    def compute_output_shape(self, sequence_output_shape, masked_positions_shape=None):
        vocab_size = self.embedding_layer.get_embedding_table().shape[0]
        if masked_positions_shape is None:
            return tuple(sequence_output_shape[:-1]) + (vocab_size,)
        return tuple(masked_positions_shape) + (vocab_size,)

    def get_config(self):
        # The embedding layer is not serialized here: the model that owns both (BertPretrainer)
        # rebuilds the head around its own encoder's embeddings.
        config = super().get_config()
        config.update(
            {
                "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
