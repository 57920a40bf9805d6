"""Feed-forward activations by the names used in bert_config.json files."""

import keras
from keras import ops

from bert_keras import kernels


_SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327  # 1 / sqrt(2 pi), the standard normal density at 0


def gelu(x):
    """Exact GELU, x * Phi(x) with the erf form (Google's 2018 BERT, Hugging Face "gelu").

    With the derivative recomputed from x in the backward pass
    (`kernels.applies("gelu_recompute")`: JAX on a GPU), or with the closed-form gradient
    below (`kernels.applies("gelu_gradient")`), else `keras.ops.gelu(x, approximate=False)`.
    """
    if kernels.applies("gelu_recompute"):
        return _gelu_recomputed(x)
    if kernels.applies("gelu_gradient"):
        return _gelu_closed_form(x)
    return ops.gelu(x, approximate=False)


@ops.custom_gradient
def _gelu_closed_form(x):
    """Exact GELU with its derivative written out.

    The values of `keras.ops.gelu(x, approximate=False)`, with the derivative written out,
    Phi(x) + x * phi(x), reusing Phi(x) from the forward pass. Automatic differentiation of
    the erf formula takes about eight elementwise passes over the [B, S, intermediate]
    activations; this takes five, and a pretraining step at the mini preset gets 2% faster
    (BUILD_NOTES.md, issue 5).

    Args:
      x: float Tensor of any shape.

    Returns:
      Tensor like `x`.
    """
    cdf = 0.5 * (1.0 + ops.erf(x * _SQRT_HALF))  # Phi(x)

    def grad(*args, upstream=None):
        if upstream is None:  # TensorFlow and JAX pass it positionally, PyTorch by keyword.
            (upstream,) = args
        pdf = ops.exp(-0.5 * ops.square(x)) * _INV_SQRT_2PI  # phi(x)
        return upstream * (cdf + x * pdf)

    return x * cdf, grad


@ops.custom_gradient
def _gelu_recomputed(x):
    """Exact GELU whose backward pass keeps only x and recomputes Phi(x) + x * phi(x) from
    it, in float32 (autodiff of the erf formula keeps several [B, S, I] intermediates).
    The values are `keras.ops.gelu(x, approximate=False)`'s; the gradient has x's dtype."""

    def grad(*args, upstream=None):
        if upstream is None:  # TensorFlow and JAX pass it positionally, PyTorch by keyword.
            (upstream,) = args
        x32 = ops.cast(x, "float32")
        cdf = 0.5 * (1.0 + ops.erf(x32 * _SQRT_HALF))
        pdf = ops.exp(-0.5 * ops.square(x32)) * _INV_SQRT_2PI
        return ops.cast(ops.cast(upstream, "float32") * (cdf + x32 * pdf), x.dtype)

    return ops.gelu(x, approximate=False), grad


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
