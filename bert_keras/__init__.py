"""bert-keras: BERT in TensorFlow 2 / Keras 3."""

import importlib.util

from data_prep import tf_logging

# Before Keras: TensorFlow without its C++ start-up notices. A machine without TensorFlow
# (an accelerator with JAX only) can still build and train the models; the tools, which
# read their data through tf.data, need it.
if importlib.util.find_spec("tensorflow") is not None:
    tf_logging.import_tensorflow()

from bert_keras.config import BertConfig  # noqa: E402
from bert_keras.encoder import BertEncoder  # noqa: E402
from bert_keras.pretrainer import BertPretrainer  # noqa: E402

__all__ = ["BertConfig", "BertEncoder", "BertPretrainer"]
