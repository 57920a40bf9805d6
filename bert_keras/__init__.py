"""bert-keras: BERT in TensorFlow 2 / Keras 3."""

from data_prep import tf_logging

tf_logging.import_tensorflow()  # before Keras: without TensorFlow's C++ start-up notices

from bert_keras.config import BertConfig
from bert_keras.encoder import BertEncoder
from bert_keras.pretrainer import BertPretrainer

__all__ = ["BertConfig", "BertEncoder", "BertPretrainer"]
