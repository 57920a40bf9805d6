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
from bert_keras.tasks import BertClassifier, BertRegressor, BertSpanQA, BertTagger  # noqa: E402

# Every Keras-serializable class the package defines is registered when it is imported
# (`keras.saving.register_keras_serializable`), and `keras.models.load_model` finds a
# class only if it was: a model saved with `model.save` (compiled with
# `optimization.create_optimizer`, `tasks.compile_args` or the pretraining losses) loads
# in a script that imports `bert_keras` and nothing deeper.
from bert_keras import losses, optimization  # noqa: E402, F401

__all__ = ["BertConfig", "BertEncoder", "BertPretrainer", "BertClassifier", "BertRegressor",
           "BertTagger", "BertSpanQA"]
