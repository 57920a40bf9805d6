"""LayerNorm: Keras' LayerNormalization over the last axis, with its gradient written out."""

import keras
from keras import ops

from bert_keras import kernels


@keras.saving.register_keras_serializable(package="bert_keras")
class LayerNorm(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` whose backward pass is the closed form.

    Keras computes layer normalization from `moments` in a handful of elementwise ops, and
    automatic differentiation of those keeps several [..., H] intermediates alive until the
    backward pass and spends about as many passes again on the gradient. Over the last axis
    this layer computes the same function,

        x_hat = (x - mean(x)) / sqrt(var(x) + epsilon),   y = x_hat * gamma + beta,

    and differentiates it in closed form (what torch's fused kernel does), keeping only
    x_hat and 1 / sqrt(var + epsilon) for the backward pass:

        d_gamma = sum(dy * x_hat),   d_beta = sum(dy)   (over every axis but the last)
        g = dy * gamma
        dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(var + epsilon)

    Statistics and arithmetic are float32 under a mixed-precision policy, as Keras'.
    Variables, arguments and config are Keras' (checkpoints load either way); another axis,
    `rms_scaling`, or `center`/`scale` off run Keras' own call.
    """

    def _plain_last_axis(self, rank):
        """Whether this is the plain LayerNorm over the last axis (centre and scale)."""
        axis = self.axis if isinstance(self.axis, (list, tuple)) else [self.axis]
        return (not self.rms_scaling and self.center and self.scale
                and [a % rank for a in axis] == [rank - 1])

    def call_with_residual(self, inputs, residual):
        """self(inputs + residual), BERT's residual sum and LayerNorm.

        Where `kernels.applies("residual_layer_norm")` (JAX on a GPU), one Pallas kernel
        (bert_keras.residual_layer_norm): the sum in float32 and the normalisation in one
        pass. Call it from the `call` of the layer that owns this one.
        """
        if (self._plain_last_axis(len(inputs.shape)) and inputs.dtype == residual.dtype
                and kernels.applies("residual_layer_norm")):
            from bert_keras.residual_layer_norm import residual_layer_norm

            mesh, batch_axis = kernels.batch_mesh()  # DataParallel: each device's rows
            return residual_layer_norm(inputs, residual, ops.cast(self.gamma, "float32"),
                                       ops.cast(self.beta, "float32"), self.epsilon,
                                       mesh=mesh, batch_axis=batch_axis)
        return self(inputs + residual)

    def call(self, inputs):
        if (not self._plain_last_axis(len(inputs.shape))
                or not kernels.applies("layer_norm_gradient")):
            return super().call(inputs)
        x = ops.cast(inputs, "float32")
        gamma = ops.cast(self.gamma, "float32")
        beta = ops.cast(self.beta, "float32")
        return ops.cast(_layer_norm(x, gamma, beta, self.epsilon), self.compute_dtype)


def standardize(x, epsilon):
    """(x_hat, 1 / sqrt(var + epsilon)) of float32 x over its last axis, x_hat = (x - mean)
    / sqrt(var + epsilon): LayerNorm before gamma and beta."""
    centered = x - ops.mean(x, axis=-1, keepdims=True)
    inv_std = ops.rsqrt(ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon)
    return centered * inv_std, inv_std


def closed_form_gradients(upstream, x_hat, inv_std, gamma):
    """(dx, d_gamma, d_beta) of y = x_hat * gamma + beta, float32, in closed form:

        d_gamma = sum(dy * x_hat),   d_beta = sum(dy)   (over every axis but the last)
        dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(var + epsilon),   g = dy * gamma
    """
    reduce_axes = tuple(range(len(x_hat.shape) - 1))
    d_gamma = ops.sum(upstream * x_hat, axis=reduce_axes)
    d_beta = ops.sum(upstream, axis=reduce_axes)
    g = upstream * gamma
    dx = inv_std * (g - ops.mean(g, axis=-1, keepdims=True)
                    - x_hat * ops.mean(g * x_hat, axis=-1, keepdims=True))
    return dx, d_gamma, d_beta


def _layer_norm(x, gamma, beta, epsilon):
    """y = (x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis of float32 x."""

    @ops.custom_gradient
    def forward(x, gamma, beta):
        x_hat, inv_std = standardize(x, epsilon)

        def grad(*args, upstream=None):
            if upstream is None:  # TensorFlow and JAX pass it positionally, PyTorch by keyword.
                (upstream,) = args
            return closed_form_gradients(upstream, x_hat, inv_std, gamma)

        return x_hat * gamma + beta, grad

    return forward(x, gamma, beta)
