"""BertPretrainer: a BertEncoder with BERT's two pretraining heads (masked LM and NSP)."""

import keras

from bert_keras.encoder import (BertEncoder, ListsEncoderWhole, TrainsPoolerOnlyWhenRead,
                                check_functional_kwargs)
from bert_keras.layers.activations import clone_initializer
from bert_keras.layers.dense import Dense
from bert_keras.layers.masked_lm_head import MaskedLMHead


@keras.saving.register_keras_serializable(package="bert_keras")
class BertPretrainer(TrainsPoolerOnlyWhenRead, ListsEncoderWhole, keras.Model):
    """BERT pretraining model (Devlin et al. 2018, section 3.1).

    Inputs, a dict of int32 Tensors:
      input_word_ids, input_mask, input_type_ids: [B, S], as for `BertEncoder`.
      masked_lm_positions: [B, P], positions whose original token is predicted.

    Outputs, a dict of float32 Tensors:
      mlm_logits: [B, P, V], masked-LM logits (output projection tied to the encoder's
        word-embedding table).
      nsp_logits: [B, 2], next-sentence logits; label 0 = IsNext, 1 = NotNext.

    Layer names follow Google's scopes: `masked_lm` (cls/predictions) and `nsp_dense`
    (cls/seq_relationship).

    Both heads read the last layer at 1 + P of its S positions ([CLS] and the masked
    ones), so the last transformer layer computes only those rows (`output_positions`):
    every position still serves as a key and value, and the outputs are those of running
    the encoder in full and gathering, at a fraction of the last layer's cost (at S=128,
    P=20 it skips about 70% of that layer's FLOPs, about 10% of a training step at the
    mini preset).
    The pretrainer lists its layers as its inputs, `encoder`, `masked_lm` and `nsp_dense`,
    as when it called the encoder as a whole, so `.weights.h5` files keep that layout.

    Args:
      encoder: a `BertEncoder`; its weights are shared, not copied.
      next_sentence: whether to add the NSP head. Without it (RoBERTa-style MLM-only
        pretraining, transformers' BertForMaskedLM) the outputs are {"mlm_logits"} only,
        and the pooler is neither computed nor trained.
      masked_lm_activation, masked_lm_layer_norm_epsilon: the masked-LM transform's
        activation and LayerNorm epsilon; None (Google's and transformers' head) takes the
        encoder's hidden_act and layer_norm_eps. keras-hub's BertMaskedLM computes its
        head with the exact "gelu" and epsilon 1e-5 whatever its encoder's, so a model
        converted from it sets them (`bert_keras.keras_hub_presets`).
    """

    def __init__(self, encoder, next_sentence=True, masked_lm_activation=None,
                 masked_lm_layer_norm_epsilon=None, **kwargs):
        check_functional_kwargs(type(self), kwargs)
        if not isinstance(encoder, BertEncoder):
            raise ValueError(f"`encoder` must be a BertEncoder. Received: {type(encoder).__name__}")
        initializer = keras.initializers.TruncatedNormal(stddev=encoder.initializer_range)
        masked_lm = MaskedLMHead(
            encoder.embeddings_layer,
            activation=masked_lm_activation or encoder.hidden_act,
            layer_norm_epsilon=masked_lm_layer_norm_epsilon or encoder.layer_norm_epsilon,
            initializer=clone_initializer(initializer),
            dtype=encoder.layers_dtype_policy,
            name="masked_lm",
        )
        nsp_dense = Dense(
            2,
            kernel_initializer=clone_initializer(initializer),
            dtype=encoder.layers_dtype_policy,
            name="nsp_dense",
        ) if next_sentence else None

        inputs = dict(encoder.input)
        inputs["masked_lm_positions"] = keras.Input(
            shape=(None,), dtype="int32", name="masked_lm_positions"
        )
        masked_positions = inputs["masked_lm_positions"]
        # Row 0 is [CLS] (for the pooler), rows 1..P the masked positions.
        output_positions = keras.ops.concatenate(
            [keras.ops.zeros_like(masked_positions[:, :1]), masked_positions], axis=1
        )
        x = encoder.last_layer_at(inputs, output_positions)  # [B, 1 + P, H]
        outputs = {"mlm_logits": masked_lm(x[:, 1:, :])}  # already at the masked positions
        if next_sentence:
            pooled_output = encoder.pooler_layer(x[:, 0, :])
            outputs["nsp_logits"] = keras.ops.cast(nsp_dense(pooled_output), "float32")
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.encoder = encoder
        self.next_sentence = next_sentence
        self.masked_lm_activation = masked_lm_activation
        self.masked_lm_layer_norm_epsilon = masked_lm_layer_norm_epsilon
        self.masked_lm = masked_lm
        self.nsp_dense = nsp_dense

    @property
    def head_follows_encoder(self) -> bool:
        """Whether the masked-LM head computes with the encoder's activation and epsilon, as
        Google's and transformers' heads do (their formats have no place for others)."""
        encoder = self.encoder
        return (self.masked_lm.activation == encoder.hidden_act
                and self.masked_lm.layer_norm_epsilon == encoder.layer_norm_epsilon)

    @property
    def reads_pooler(self) -> bool:
        """Whether an output depends on the pooler (only through the NSP head)."""
        return self.next_sentence

    @classmethod
    def from_bert_config(cls, config, **kwargs):
        """A randomly initialised pretrainer for a `BertConfig`."""
        dtype = kwargs.pop("dtype", None)
        return cls(BertEncoder.from_bert_config(config, dtype=dtype), **kwargs)

    def get_config(self):
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "encoder": keras.layers.serialize(self.encoder),
        }
        if not self.next_sentence:  # Files of NSP pretrainers keep their old config.
            config["next_sentence"] = False
        if self.masked_lm_activation is not None:  # likewise: only where set
            config["masked_lm_activation"] = self.masked_lm_activation
        if self.masked_lm_layer_norm_epsilon is not None:
            config["masked_lm_layer_norm_epsilon"] = self.masked_lm_layer_norm_epsilon
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.layers.deserialize(config["encoder"])
        return cls(**config)
