"""Feed-forward activations by the names used in bert_config.json files."""

import keras
from keras import ops


def gelu(x):
    """Exact GELU, x * Phi(x) with the erf form (Google's 2018 BERT, Hugging Face "gelu")."""
    return ops.gelu(x, approximate=False)


def gelu_tanh(x):
    """Tanh approximation of GELU (Hugging Face "gelu_new", keras-hub's BERT)."""
    return ops.gelu(x, approximate=True)


_ACTIVATIONS = {
    "gelu": gelu,
    "gelu_new": gelu_tanh,
    "gelu_tanh": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": ops.relu,
    "tanh": ops.tanh,
}


def get_activation(name):
    """Returns the activation function for a bert_config.json `hidden_act` name.

    Raises:
      ValueError: `name` is not a known activation.
    """
    if name not in _ACTIVATIONS:
        raise ValueError(
            f"Unknown hidden_act {name!r}. Expected one of {sorted(_ACTIVATIONS)}."
        )
    return _ACTIVATIONS[name]


def clone_initializer(initializer):
    """A fresh copy of `initializer`, so sublayers don't share one seeded instance."""
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
