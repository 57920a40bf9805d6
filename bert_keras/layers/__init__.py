"""Generic BERT building blocks. They take explicit arguments, never a BertConfig."""

from bert_keras.layers.attention import SelfAttention
from bert_keras.layers.dropout import Dropout
from bert_keras.layers.embeddings import BertEmbeddings
from bert_keras.layers.layer_norm import LayerNorm
from bert_keras.layers.masked_lm_head import MaskedLMHead
from bert_keras.layers.transformer_block import TransformerEncoderBlock

__all__ = ["BertEmbeddings", "Dropout", "LayerNorm", "MaskedLMHead", "SelfAttention", "TransformerEncoderBlock"]
