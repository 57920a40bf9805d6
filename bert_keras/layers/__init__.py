"""Generic BERT building blocks. They take explicit arguments, never a BertConfig."""

from bert_keras.layers.attention import SelfAttention
from bert_keras.layers.embeddings import BertEmbeddings
from bert_keras.layers.transformer_block import TransformerEncoderBlock

__all__ = ["BertEmbeddings", "SelfAttention", "TransformerEncoderBlock"]
