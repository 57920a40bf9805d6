"""Feed-forward activations by the names used in bert_config.json files."""

import keras
from keras import ops

from bert_keras import kernels


_SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327  # 1 / sqrt(2 pi), the standard normal density at 0
# Abramowitz and Stegun 7.1.26: erfc(z) = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2)
# + e(z), t = 1 / (1 + p z), z >= 0, |e(z)| < 1.5e-7.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_HALF_PRECISION = ("bfloat16", "float16")


def gelu(x):
    """Exact GELU, x * Phi(x) with the erf form (Google's 2018 BERT, Hugging Face "gelu").

    A bfloat16 or float16 `x` on a GPU with JAX takes `_gelu_16_bits`
    (`kernels.applies("gelu_16_bits")`); otherwise the closed-form gradient below
    (`kernels.applies("gelu_gradient")`), else `keras.ops.gelu(x, approximate=False)`.
    """
    if (kernels.applies("gelu_16_bits")
            and keras.backend.standardize_dtype(x.dtype) in _HALF_PRECISION):
        return _gelu_16_bits(x)
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


def _normal_cdf_and_density(x):
    """(Phi(x), phi(x)) of float32 x: Phi from Abramowitz and Stegun's erfc (7.1.26),
    Phi(x) = erfc(-x / sqrt(2)) / 2, exact to 1e-7 absolute; one exp serves both."""
    z = ops.abs(x) * _SQRT_HALF
    t = 1.0 / (1.0 + _AS_P * z)
    poly = _AS_A[-1]
    for a in reversed(_AS_A[:-1]):
        poly = a + t * poly
    gauss = ops.exp(-ops.square(z))  # exp(-x^2 / 2)
    tail = 0.5 * t * poly * gauss  # Phi(-|x|)
    return ops.where(x >= 0, 1.0 - tail, tail), gauss * _INV_SQRT_2PI


@ops.custom_gradient
def _gelu_16_bits(x):
    """Exact GELU of a bfloat16 or float16 x, computed in float32 (kernel "gelu_16_bits").

    x Phi(x) with Phi from one exp (`_normal_cdf_and_density`) rather than erf, rounded to
    x's dtype; the backward pass keeps only x and recomputes Phi(x) + x phi(x) from it.
    Against float64, the bfloat16 values and derivatives stay within 8e-3 relative for
    x >= -6 (up to 3.6e-3 from the approximation near x = -6, plus bfloat16's rounding of
    up to 2^-8) and below 1e-8 absolute under it. (`keras.ops.gelu` in bfloat16 rounds
    erf(x / sqrt(2)) + 1 to bfloat16 and loses every value below x = -3.)

    What XLA keeps (read from BERT-base's step compiled for an H200, bench/compile_for_gpu.py):
    - the recomputation's input passes an optimization barrier: without it XLA's
      common-subexpression elimination merged it with the forward pass's and kept float32
      Phi(x) for the backward, twice x's bytes;
    - the derivative multiplies the upstream gradient in x's dtype (one more rounding, up to
      2^-9): in float32 the product was written out as a float32 tensor before the bias
      gradient's reduction read it, rather than computed inside that reduction's kernel.
    Per layer at BERT-base S128 B256, the forward then reads the matrix product and writes
    the biased input and the output, and the backward reads x and the upstream gradient and
    writes the gradient: 6 [B, S, intermediate] bfloat16 passes, against 9 for Keras' GELU.
    """
    import jax  # kernel "gelu_16_bits" runs on JAX only

    def grad(*args, upstream=None):
        if upstream is None:  # TensorFlow and JAX pass it positionally, PyTorch by keyword.
            (upstream,) = args
        x32 = ops.cast(jax.lax.optimization_barrier(x), "float32")
        cdf, pdf = _normal_cdf_and_density(x32)
        return upstream * ops.cast(cdf + x32 * pdf, x.dtype)

    x32 = ops.cast(x, "float32")
    return ops.cast(x32 * _normal_cdf_and_density(x32)[0], x.dtype), grad


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
