"""Dense: Keras' dense layer whose bias is added, and its gradient summed, in float32, and
whose kernel can be stored [out, in] for serving."""

import keras
from keras import ops

from bert_keras import kernels

# Where the kernel's two axes go. "in_out": [input_dim, units], Keras' and Google's
# checkpoints' layout (what training and every checkpoint format use). "out_in": [units,
# input_dim], torch's nn.Linear layout, for `--kernel_layout=out_in` exports
# (`bert_keras.tasks.for_serving`).
KERNEL_LAYOUTS = ("in_out", "out_in")


@keras.saving.register_keras_serializable(package="bert_keras")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` that adds its bias in float32 under a mixed-precision policy,
    with a choice of kernel layout.

    Keras' Dense adds a bias autocast to the compute dtype, so under `mixed_bfloat16` the
    bias gradient is a bfloat16 sum over every row of the batch (B * S = 32,768 of them at
    BERT-base's batch 256, sequence 128): an 8-bit mantissa accumulating that many terms.
    Here the bias variable is read as float32 (`autocast=False`), the bfloat16 product is
    widened, the bias added, and the sum cast back: the bias gradient is a float32 sum, and
    under XLA the casts fuse into the add. The kernel and its matmul stay in the compute
    dtype. Under a float32 policy (and with LoRA or quantization) this is Keras' call.

    `kernel_layout="out_in"` stores the kernel [units, input_dim] and multiplies by its
    transpose (`einsum("...k,nk->...n")`): the same function. On TensorFlow with oneDNN
    that product reads a short request's weights faster than the [in, out] one (a
    [16, 768] x [768, 3072] product 0.7x the time in float32, 0.8x in bfloat16 on a 2-core
    Xeon; `bench/bench_small_matmul.py`, BUILD_NOTES.md section 8.11) but is slower from
    32 rows on, so task exports store it only with `--kernel_layout=out_in`. LoRA and
    quantization are Keras' [in, out] code and refuse it.

    On JAX with a GPU, kernel "dense_bias_16_bits" (`bert_keras.kernels`; off until measured)
    adds the bias in the compute dtype instead, where XLA puts it in cuBLAS' epilogue, and
    keeps the float32 sum for its gradient (`_add_bias_in_compute_dtype`).

    Arguments (besides `kernel_layout`), variables (names, order, checkpoints) and config
    are Keras' Dense's.
    """

    def __init__(self, units, kernel_layout="in_out", **kwargs):
        if kernel_layout not in KERNEL_LAYOUTS:
            raise ValueError(f"`kernel_layout` must be one of {KERNEL_LAYOUTS}. "
                             f"Received: kernel_layout={kernel_layout!r}")
        if kernel_layout == "out_in" and kwargs.get("lora_rank"):
            raise ValueError("LoRA needs kernel_layout='in_out'.")
        super().__init__(units, **kwargs)
        self.kernel_layout = kernel_layout

    def build(self, input_shape):
        if self.kernel_layout == "in_out":
            return super().build(input_shape)
        if self.quantization_mode:
            raise ValueError("Quantization needs kernel_layout='in_out'.")
        input_dim = input_shape[-1]
        self._kernel = self.add_weight(
            name="kernel", shape=(self.units, input_dim), initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer, constraint=self.kernel_constraint)
        self.bias = self.add_weight(
            name="bias", shape=(self.units,), initializer=self.bias_initializer,
            regularizer=self.bias_regularizer, constraint=self.bias_constraint,
        ) if self.use_bias else None
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: input_dim})
        self.built = True

    def add_weight(self, *args, **kwargs):
        if kwargs.get("name") == "bias":
            kwargs["autocast"] = False  # read as float32 under any policy
        return super().add_weight(*args, **kwargs)

    def enable_lora(self, *args, **kwargs):
        if self.kernel_layout != "in_out":
            raise ValueError("LoRA needs kernel_layout='in_out'.")
        return super().enable_lora(*args, **kwargs)

    def quantize(self, *args, **kwargs):
        if self.kernel_layout != "in_out":
            raise ValueError("Quantization needs kernel_layout='in_out'.")
        return super().quantize(*args, **kwargs)

    def call(self, inputs, training=None):
        if self.kernel_layout == "in_out" and (
                not self.use_bias or self.compute_dtype == self.variable_dtype
                or self.lora_enabled or self.quantization_mode is not None):
            return super().call(inputs, training=training)
        if self.kernel_layout == "in_out":
            x = ops.matmul(inputs, self.kernel)  # [..., units] in the compute dtype
        else:
            x = ops.einsum("...k,nk->...n", inputs, self.kernel)
        if self.use_bias:
            if self.compute_dtype == self.variable_dtype:
                x = x + self.bias
            elif kernels.applies("dense_bias_16_bits"):
                x = _add_bias_in_compute_dtype(ops.cast(x, self.compute_dtype), self.bias)
            else:
                x = ops.cast(ops.cast(x, "float32") + self.bias, self.compute_dtype)
        if self.activation is not None:
            x = self.activation(x)
        return x

    def get_config(self):
        return {**super().get_config(), "kernel_layout": self.kernel_layout}


@ops.custom_gradient
def _add_bias_in_compute_dtype(x, bias):
    """x + bias rounded to x's dtype, with the bias gradient a float32 sum over the rows
    (kernel "dense_bias_16_bits").

    The value is Keras' Dense's under mixed precision (the bias rounded to x's dtype and
    added there: within one rounding of the float32 sum). The gradient is the upstream
    gradient for x and, for the float32 bias, its sum over every row in float32, as the
    float32 add's gradient is. Why: XLA's GPU compiler moves a bias add in the product's
    dtype into cuBLAS' epilogue, where the float32 add is an elementwise pass of its own
    over the [rows, units] product wherever no fusion takes it (the query, key and value
    projections feed attention's custom calls). BERT-base's pretraining step compiled for
    an H200 (bench/compile_for_gpu.py) moves 5.8 GB less outside the matrix products with
    it (BUILD_NOTES.md 8.10); its time is unmeasured.
    """

    def grad(*args, upstream=None):
        if upstream is None:  # TensorFlow and JAX pass it positionally, PyTorch by keyword.
            (upstream,) = args
        rows = tuple(range(len(upstream.shape) - 1))
        return upstream, ops.sum(ops.cast(upstream, "float32"), axis=rows)

    return x + ops.cast(bias, x.dtype), grad
