"""BertEncoder: the BERT network as a functional Keras model, dict in and dict out."""

import keras
from keras import ops

from bert_keras.config import BertConfig
from bert_keras.layers import BertEmbeddings, TransformerEncoderBlock
from bert_keras.layers.activations import clone_initializer
from bert_keras.layers.dense import Dense
from data_prep import schema


@keras.saving.register_keras_serializable(package="bert_keras")
class BertEncoder(keras.Model):
    """BERT's encoder (Devlin et al. 2018, https://arxiv.org/abs/1810.04805).

    Shapes: B = batch, S = sequence length (any S <= max_sequence_length), H = hidden size.

    Inputs (TF Hub BERT names), a dict of int32 Tensors of shape [B, S]:
      input_word_ids: WordPiece ids.
      input_mask: 1 for real tokens, 0 for padding.
      input_type_ids: segment ids, 0 for sentence A, 1 for sentence B.

    Outputs, a dict:
      sequence_output: float [B, S, H], the last layer.
      pooled_output: float [B, H], Dense(H, tanh) of the last layer's [CLS] vector.
      encoder_outputs: list of num_layers float [B, S, H], every layer's output.

    Layer names follow Google's checkpoint scopes (`embeddings`, `transformer_layer_{i}`,
    `pooler_dense`), so the converters in `bert_keras.checkpoints` are tables of name pairs.

    Args:
      vocab_size: V.
      num_layers: L.
      hidden_size: H.
      num_heads: A; H must be divisible by it.
      intermediate_size: feed-forward width (4H in BERT).
      hidden_act: feed-forward activation name ("gelu" = exact erf, "gelu_new" = tanh).
      dropout: dropout on embeddings and sublayer outputs.
      attention_dropout: dropout on attention probabilities.
      max_sequence_length: rows of the position table.
      type_vocab_size: number of segment ids.
      initializer_range: stddev of the TruncatedNormal initializer.
      layer_norm_epsilon: LayerNorm epsilon.
      dtype: dtype policy, e.g. "mixed_bfloat16" (LayerNorm and softmax stay float32).
      kernel_layout: the Dense kernels' layout (`bert_keras.layers.dense.Dense`): "in_out",
        Google's checkpoints' and training's, or "out_in", for `--kernel_layout=out_in`
        exports (`bert_keras.tasks.for_serving`); checkpoints are read and written in
        "in_out".
      explicit_softmax: attention's softmax written out where nothing is dropped, rather
        than `keras.ops.dot_product_attention` (`bert_keras.layers.attention.SelfAttention`;
        serving copies, faster on TensorFlow without XLA at long requests).
    """

    def __init__(
        self,
        vocab_size,
        num_layers=12,
        hidden_size=768,
        num_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        max_sequence_length=512,
        type_vocab_size=2,
        initializer_range=0.02,
        layer_norm_epsilon=1e-12,
        dtype=None,
        kernel_layout="in_out",
        explicit_softmax=False,
        **kwargs,
    ):
        check_functional_kwargs(type(self), kwargs)
        # Validate through BertConfig so a bad size fails here, naming the field, and not
        # deep inside a layer's build.
        BertConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            intermediate_size=intermediate_size,
            hidden_act=hidden_act,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=attention_dropout,
            max_position_embeddings=max_sequence_length,
            type_vocab_size=type_vocab_size,
            initializer_range=initializer_range,
            layer_norm_eps=layer_norm_epsilon,
        )
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)

        # === Layers ===
        embeddings = BertEmbeddings(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            max_sequence_length=max_sequence_length,
            type_vocab_size=type_vocab_size,
            dropout=dropout,
            layer_norm_epsilon=layer_norm_epsilon,
            initializer=clone_initializer(initializer),
            dtype=dtype,
            name="embeddings",
        )
        blocks = [
            TransformerEncoderBlock(
                num_heads=num_heads,
                intermediate_size=intermediate_size,
                activation=hidden_act,
                dropout=dropout,
                attention_dropout=attention_dropout,
                layer_norm_epsilon=layer_norm_epsilon,
                initializer=clone_initializer(initializer),
                kernel_layout=kernel_layout,
                explicit_softmax=explicit_softmax,
                dtype=dtype,
                name=f"transformer_layer_{i}",
            )
            for i in range(num_layers)
        ]
        pooler = Dense(
            hidden_size,
            activation="tanh",
            kernel_initializer=clone_initializer(initializer),
            kernel_layout=kernel_layout,
            dtype=dtype,
            name="pooler_dense",
        )

        # === Functional model ===
        # TF Hub's input names, from the one schema (docs/DESIGN.md section 2).
        input_word_ids = keras.Input(shape=(None,), dtype="int32", name=schema.INPUT_WORD_IDS)
        input_mask = keras.Input(shape=(None,), dtype="int32", name=schema.MODEL_INPUT_MASK)
        input_type_ids = keras.Input(shape=(None,), dtype="int32", name=schema.INPUT_TYPE_IDS)

        x = embeddings(input_word_ids, input_type_ids)  # [B, S, H]
        encoder_outputs = []
        for block in blocks:
            x = block(x, attention_mask=input_mask)  # [B, S, H]
            encoder_outputs.append(x)
        cls_vector = x[:, 0, :]  # [B, H]: the [CLS] token summarises the sequence.
        pooled_output = pooler(cls_vector)

        super().__init__(
            inputs={
                schema.INPUT_WORD_IDS: input_word_ids,
                schema.MODEL_INPUT_MASK: input_mask,
                schema.INPUT_TYPE_IDS: input_type_ids,
            },
            outputs={
                "sequence_output": x,
                "pooled_output": pooled_output,
                "encoder_outputs": encoder_outputs,
            },
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocab_size = vocab_size
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.max_sequence_length = max_sequence_length
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_layout = kernel_layout
        self.explicit_softmax = explicit_softmax
        self.embeddings_layer = embeddings
        self.transformer_layers = blocks
        self.pooler_layer = pooler

    def pair_refusal(self, what: str) -> str | None:
        """The one-line error for handing this encoder a second text, or None where it
        reads one.

        A second text is segment 1, and a model with one segment embedding
        (type_vocab_size 1) looks it up as a zero row of a one-row table, silently, on
        every backend: run_classifier, run_squad, extract_features and the exports refuse
        it in these words. `what` names the input that holds the pair (a flag, a file
        line).
        """
        if self.type_vocab_size >= 2:
            return None
        return (f"{what}, but the model has type_vocab_size={self.type_vocab_size} (one "
                "segment embedding) and would read the second text as zeros: use a model "
                "with a segment embedding per text, or single texts")

    @property
    def layers_dtype_policy(self):
        """The dtype policy the encoder's layers compute in: its `dtype` argument, else the
        global policy when it was built. Keras' functional models keep their own policy at
        the global one whatever `dtype` says, so heads built on an encoder take this one."""
        return self.pooler_layer.dtype_policy

    @classmethod
    def from_bert_config(cls, config: BertConfig, **kwargs):
        """Builds an encoder from a `BertConfig` (Google's bert_config.json keys)."""
        return cls(
            vocab_size=config.vocab_size,
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            intermediate_size=config.intermediate_size,
            hidden_act=config.hidden_act,
            dropout=config.hidden_dropout_prob,
            attention_dropout=config.attention_probs_dropout_prob,
            max_sequence_length=config.max_position_embeddings,
            type_vocab_size=config.type_vocab_size,
            initializer_range=config.initializer_range,
            layer_norm_epsilon=config.layer_norm_eps,
            **kwargs,
        )

    @classmethod
    def from_preset(cls, name: str, **kwargs):
        """Builds a randomly initialised encoder of a preset size ("tiny" ... "large")."""
        return cls.from_bert_config(BertConfig.from_preset(name), **kwargs)

    def to_bert_config(self) -> BertConfig:
        """The `BertConfig` this encoder was built with (for bert_config.json beside weights)."""
        return BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act,
            hidden_dropout_prob=self.dropout,
            attention_probs_dropout_prob=self.attention_dropout,
            max_position_embeddings=self.max_sequence_length,
            type_vocab_size=self.type_vocab_size,
            initializer_range=self.initializer_range,
            layer_norm_eps=self.layer_norm_epsilon,
        )

    def last_layer_at(self, inputs, positions, skip_padding=False):
        """The last layer's output at `positions` only: [B, Q, H].

        Runs the embeddings and every layer but the last in full, and the last layer only
        at the Q given positions of each sequence (it still attends to all of them). Row j
        equals `sequence_output[b, positions[b, j]]` of a full call, for heads that read few
        positions: pretraining reads [CLS] and the masked positions, classification only
        [CLS], so the last layer's queries, output projection and feed-forward shrink from
        S rows to Q. Call it on Keras inputs inside a functional model (as `BertPretrainer`
        and `BertClassifier` do) or eagerly.

        Args:
          inputs: dict with input_word_ids, input_mask, input_type_ids ([B, S]).
          positions: int Tensor [B, Q] of indices into S.
          skip_padding: in training, run every layer but the last on real tokens only
            (`TransformerEncoderBlock`'s `skip_padding`): the same values at real
            positions; padded rows are zeros, which the last layer's keys never read
            (they are masked). Positions must be real tokens.
        """
        mask = inputs[schema.MODEL_INPUT_MASK]
        x = self.embeddings_layer(inputs[schema.INPUT_WORD_IDS], inputs[schema.INPUT_TYPE_IDS])
        for block in self.transformer_layers[:-1]:
            x = block(x, attention_mask=mask, skip_padding=skip_padding)
        return self.transformer_layers[-1](x, attention_mask=mask, output_positions=positions)

    def sequence_output_only(self, inputs, skip_padding=False):
        """The last layer's output [B, S, H], without computing the pooler.

        For heads that read every token (tagging, span QA). Like `last_layer_at`, call it
        on Keras inputs inside a functional model (with `ListsEncoderWhole`) or eagerly.

        Args:
          inputs: dict with input_word_ids, input_mask, input_type_ids ([B, S]).
          skip_padding: in training, run the layers on real tokens only
            (`TransformerEncoderBlock`'s `skip_padding`): the same values at real
            positions, zeros at padded ones. For heads whose loss ignores padding.
        """
        mask = inputs[schema.MODEL_INPUT_MASK]
        x = self.embeddings_layer(inputs[schema.INPUT_WORD_IDS], inputs[schema.INPUT_TYPE_IDS])
        for block in self.transformer_layers:
            x = block(x, attention_mask=mask, skip_padding=skip_padding)
        return x

    def call_on_real_tokens(self, inputs, capacity):
        """Inference on the real tokens only, at a static number of rows.

        Every projection, feed-forward layer and LayerNorm runs on `capacity` rows holding
        the batch's T real tokens (`padding_free.packed_rows`) instead of B * S; attention
        runs on the padded layout. Where real lengths vary, that is the padding's share of
        the work saved, at static shapes (JAX and XLA: one compilation per distinct
        capacity). Outputs at real positions are the full call's (same arithmetic, row by
        row); padded positions of `sequence_output` are zeros, so a row whose position 0
        is padding (left-padded input) has the pooler of zeros as its `pooled_output`, where
        the full call pools the padded position's vector. Inference only (no dropout).

        Args:
          inputs: dict with input_word_ids, input_mask, input_type_ids ([B, S], B and S
            static).
          capacity: Python int C, T <= C <= B * S: `padding_free.row_capacity(input_mask,
            multiple)` on the host. If the batch holds more real tokens than C, every
            output is NaN (a traced computation cannot raise).

        Returns:
          {"sequence_output": [B, S, H], "pooled_output": [B, H]}.
        """
        from bert_keras.layers import padding_free

        mask = inputs[schema.MODEL_INPUT_MASK]
        rows, slots, overflow = padding_free.packed_rows(mask, capacity)
        x = self.embeddings_layer(inputs[schema.INPUT_WORD_IDS], inputs[schema.INPUT_TYPE_IDS])
        batch_size, seq_length, hidden = x.shape
        x_rows = ops.take(ops.reshape(x, (-1, hidden)), rows, axis=0)  # [C, H]
        for block in self.transformer_layers:
            x_rows = block.call_on_rows(x_rows, mask, rows, slots)
        sequence = ops.reshape(ops.take(x_rows, slots, axis=0), (batch_size, seq_length, hidden))
        real = ops.not_equal(mask, 0)[:, :, None]
        sequence = ops.where(overflow, ops.cast(float("nan"), sequence.dtype),
                             ops.where(real, sequence, ops.zeros_like(sequence)))
        return {"sequence_output": sequence,
                "pooled_output": self.pooler_layer(sequence[:, 0, :])}

    def get_embedding_table(self):
        """The word-embedding variable [V, H]; the masked-LM head ties its output to it."""
        return self.embeddings_layer.get_embedding_table()

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "max_sequence_length": self.max_sequence_length,
            "type_vocab_size": self.type_vocab_size,
            "initializer_range": self.initializer_range,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "kernel_layout": self.kernel_layout,
            "explicit_softmax": self.explicit_softmax,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "dtype" in config and isinstance(config["dtype"], dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


# What keras.Model's functional constructor reads of its keyword arguments. It drops any
# other without a word, so a misspelt argument (`layer_norm_eps=` for
# `layer_norm_epsilon=`) built a model with the default instead.
FUNCTIONAL_KWARGS = ("name", "trainable")


def check_functional_kwargs(model_class: type, kwargs: dict) -> None:
    """Refuses keyword arguments a functional model would silently drop, as Python does."""
    unknown = sorted(set(kwargs) - set(FUNCTIONAL_KWARGS))
    if unknown:
        raise TypeError(f"{model_class.__name__}() got unexpected keyword argument(s) "
                        f"{', '.join(map(repr, unknown))}")


class ListsEncoderWhole:
    """Mixin for functional models whose graph calls `encoder.last_layer_at` (or
    `sequence_output_only`).

    Such a graph holds the encoder's layers one by one. Keras saves a functional model's
    weights by its `layers`, so this lists them instead as the one `self.encoder` (as a
    graph that called the encoder whole would), inputs first: `.weights.h5` files keep
    their usual layout, and files from either graph load into the other.
    """

    @property
    def layers(self):
        graph_layers = super().layers
        if "encoder" not in self.__dict__:  # Functional.__init__, before `encoder` is set
            return graph_layers
        encoder = self.encoder
        inner = {id(layer) for layer in encoder.layers
                 if not isinstance(layer, keras.layers.InputLayer)}
        inner.add(id(encoder))
        # Inputs first: saving visits each layer once, so an input visited inside the
        # encoder would be filed under it.
        listed = [layer for layer in graph_layers if isinstance(layer, keras.layers.InputLayer)]
        placed = False
        for layer in graph_layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            if id(layer) not in inner:
                listed.append(layer)
            elif not placed:
                listed.append(encoder)
                placed = True
        return listed


class TrainsPoolerOnlyWhenRead:
    """Mixin for models on a `BertEncoder` (stored as `self.encoder`) whose outputs may not
    depend on its pooler: a tagger, a span-QA model, a pretrainer without the NSP head.

    Such a model neither computes the pooler nor trains it: its weights stay in the model
    (files keep their layout) but not among the trainable weights, so the optimizer holds
    no state for them, Keras does not warn about missing gradients, and on JAX (whose
    trainer differentiates `trainable_variables`) weight decay does not shrink a kernel no
    loss reaches. A subclass sets `reads_pooler` (a class attribute or a property).
    """

    reads_pooler = True

    @property
    def trainable_weights(self):
        weights = super().trainable_weights
        # Before `encoder` is set (inside Functional.__init__) there is nothing to leave out.
        if "encoder" not in self.__dict__ or self.reads_pooler:
            return weights
        pooler = {id(v) for v in self.encoder.pooler_layer.weights}
        return [w for w in weights if id(w) not in pooler]

    @property
    def trainable_variables(self):
        # Keras builds the optimizer from this list when it loads a compiled model (and in
        # `_symbolic_build`), and JAX's trainer takes gradients of it; it must match the one
        # training used, or the saved slots of a model kept with its optimizer state are
        # skipped on load.
        return self.trainable_weights
