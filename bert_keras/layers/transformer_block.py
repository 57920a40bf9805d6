"""TransformerEncoderBlock: one post-LayerNorm BERT layer."""

import keras
from keras import ops

from bert_keras.layers import padding_free
from bert_keras.layers.activations import clone_initializer, get_activation
from bert_keras.layers.attention import SelfAttention, check_attention_mask
from bert_keras.layers.dense import Dense
from bert_keras.layers.dropout import Dropout
from bert_keras.layers.layer_norm import LayerNorm


@keras.saving.register_keras_serializable(package="bert_keras")
class TransformerEncoderBlock(keras.layers.Layer):
    """One BERT encoder layer (post-LN, as in Devlin et al. 2018 and Vaswani et al. 2017).

        a = LayerNorm(x + Dropout(Dense_H(SelfAttention(x, mask))))
        y = LayerNorm(a + Dropout(Dense_H(act(Dense_I(a)))))

    Sublayers are named after Google's checkpoint scopes under `bert/encoder/layer_i/`:
    `self_attention` (attention/self), `attention_output` (attention/output/dense),
    `attention_layer_norm` (attention/output/LayerNorm), `intermediate` (intermediate/dense),
    `output_dense` (output/dense), `output_layer_norm` (output/LayerNorm).

    Args:
      num_heads: attention heads N.
      intermediate_size: I, width of the feed-forward layer.
      activation: feed-forward activation name ("gelu", "gelu_new", ...) or callable.
      dropout: dropout on each sublayer's output before the residual sum.
      attention_dropout: dropout on attention probabilities.
      layer_norm_epsilon: LayerNorm epsilon (1e-12 in BERT).
      initializer: kernel initializer (TruncatedNormal(0.02) in BERT).
      kernel_layout: the Dense kernels' layout (`bert_keras.layers.dense.Dense`): "in_out"
        (Google's checkpoints, training, exports by default) or "out_in" (`--kernel_layout=
        out_in` exports).
      explicit_softmax: the attention's (`bert_keras.layers.attention.SelfAttention`):
        the softmax written out where nothing is dropped (serving copies).
    """

    def __init__(
        self,
        num_heads,
        intermediate_size,
        activation="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        layer_norm_epsilon=1e-12,
        initializer="truncated_normal",
        kernel_layout="in_out",
        explicit_softmax=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(intermediate_size, int) or intermediate_size <= 0:
            raise ValueError(
                f"`intermediate_size` must be a positive integer. Received: {intermediate_size!r}"
            )
        self.num_heads = num_heads
        self.intermediate_size = intermediate_size
        self.activation = activation
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer = keras.initializers.get(initializer)
        self.kernel_layout = kernel_layout
        self.explicit_softmax = explicit_softmax
        self._activation_fn = get_activation(activation)
        self.self_attention = SelfAttention(
            num_heads,
            dropout=attention_dropout,
            initializer=clone_initializer(self.initializer),
            kernel_layout=kernel_layout,
            explicit_softmax=explicit_softmax,
            name="self_attention",
            dtype=self.dtype_policy,
        )
        self.attention_dropout_layer = Dropout(dropout, dtype=self.dtype_policy)
        self.output_dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        hidden_size = input_shape[-1]

        def dense(units, name):
            return Dense(
                units,
                kernel_initializer=clone_initializer(self.initializer),
                kernel_layout=self.kernel_layout,
                name=name,
                dtype=self.dtype_policy,
            )

        def layer_norm(name):
            return LayerNorm(
                epsilon=self.layer_norm_epsilon, name=name, dtype=self.dtype_policy
            )

        self.self_attention.build(input_shape)
        self.attention_output = dense(hidden_size, "attention_output")
        self.attention_output.build(input_shape)
        self.attention_layer_norm = layer_norm("attention_layer_norm")
        self.attention_layer_norm.build(input_shape)
        self.intermediate = dense(self.intermediate_size, "intermediate")
        self.intermediate.build(input_shape)
        self.output_dense = dense(hidden_size, "output_dense")
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_size,))
        self.output_layer_norm = layer_norm("output_layer_norm")
        self.output_layer_norm.build(input_shape)
        self.built = True

    def call(self, x, attention_mask=None, training=None, output_positions=None,
             skip_padding=False):
        """Runs the layer.

        Args:
          x: float Tensor of shape [B, S, H].
          attention_mask: Tensor of shape [B, S], 1 for real tokens, 0 for padding.
          training: Python bool, whether dropout is active.
          output_positions: optional int Tensor [B, Q] of indices into S: compute the
            output only at these positions (all S positions still serve as keys and
            values). Pretraining reads the last layer only at [CLS] and the masked
            positions, so its last layer needs Q = 1 + P of the S rows.
          skip_padding: Python bool. In training (TensorFlow, outside XLA; see
            `padding_free`), run the projections, feed-forward, LayerNorms and dropout on
            the real tokens only. Real tokens get the same outputs; padded rows come out
            as zeros. Ignored with `output_positions`.

        Returns:
          float Tensor of shape [B, S, H], or [B, Q, H] with `output_positions`: row j is
          row `output_positions[:, j]` of the full output.
        """
        check_attention_mask(attention_mask, tuple(x.shape), "TransformerEncoderBlock")
        if (skip_padding and output_positions is None
                and padding_free.padding_free_applies(training, attention_mask)):
            rows = padding_free.real_rows(attention_mask)  # [T]
            return self._call_on_rows(x, attention_mask, training, rows)
        if output_positions is None:
            attended = self.self_attention(x, attention_mask=attention_mask, training=training)
        else:
            positions = ops.cast(output_positions, "int32")[:, :, None]  # [B, Q, 1]
            residual = ops.take_along_axis(x, positions, axis=1)  # [B, Q, H]
            attended = self.self_attention(
                x, attention_mask=attention_mask, training=training, query=residual
            )
            x = residual
        return self._after_attention(x, attended, training)

    def _call_on_rows(self, x, attention_mask, training, rows):
        """The layer on the real-token rows `rows` of x (padding_free.real_rows)."""
        batch_size, seq_length = ops.shape(x)[0], ops.shape(x)[1]
        num_rows = batch_size * seq_length
        x_rows = padding_free.gather_rows(ops.reshape(x, (num_rows, -1)), rows)  # [T, H]
        y_rows = self.call_on_rows(x_rows, attention_mask, rows, None, training)  # [T, H]
        y = padding_free.scatter_rows(y_rows, rows, num_rows)  # [B * S, H]
        return ops.reshape(y, ops.shape(x))

    def call_on_rows(self, x_rows, attention_mask, rows, slots, training=False):
        """The layer on the rows `rows` of the flattened batch: [C, H] -> [C, H].

        Every row on its own except attention, which reads the padded layout through
        `slots` (a batch packed by `padding_free.packed_rows`,
        `BertEncoder.call_on_real_tokens`) or, with slots None, scatters the rows back
        (`padding_free.real_rows`, training). Call it after the block is built (the
        encoder's functional graph builds it).
        """
        attended = self.self_attention(x_rows, attention_mask=attention_mask,
                                       training=training, rows=rows, slots=slots)
        return self._after_attention(x_rows, attended, training)

    def _after_attention(self, x, attended, training):
        """Output projection, feed-forward, residuals and LayerNorms; every row on its own
        ([..., H] in and out)."""
        attended = self.attention_dropout_layer(self.attention_output(attended), training=training)
        x = self.attention_layer_norm.call_with_residual(x, attended)

        hidden = self._activation_fn(self.intermediate(x))  # [B, S or Q, I] or [T, I]
        hidden = self.output_dropout_layer(self.output_dense(hidden), training=training)
        return self.output_layer_norm.call_with_residual(x, hidden)

    def compute_output_shape(
        self, x_shape, attention_mask_shape=None, output_positions_shape=None
    ):
        if output_positions_shape is None:
            return tuple(x_shape)
        return tuple(output_positions_shape) + (x_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_size": self.intermediate_size,
                "activation": self.activation,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer": keras.initializers.serialize(self.initializer),
                "kernel_layout": self.kernel_layout,
                "explicit_softmax": self.explicit_softmax,
            }
        )
        return config
