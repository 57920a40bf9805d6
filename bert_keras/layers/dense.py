"""Dense: Keras' dense layer whose bias is added, and its gradient summed, in float32."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bert_keras")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` that adds its bias in float32 under a mixed-precision policy.

    Keras' Dense adds a bias autocast to the compute dtype, so under `mixed_bfloat16` the
    bias gradient is a bfloat16 sum over every row of the batch (B * S = 32,768 of them at
    BERT-base's batch 256, sequence 128): an 8-bit mantissa accumulating that many terms.
    Here the bias variable is read as float32 (`autocast=False`), the bfloat16 product is
    widened, the bias added, and the sum cast back: the bias gradient is a float32 sum, and
    under XLA the casts fuse into the add. The kernel and its matmul stay in the compute
    dtype. Under a float32 policy (and with LoRA or quantization) this is Keras' call.
    Arguments, variables (names, order, checkpoints) and config are Keras' Dense's.
    """

    def add_weight(self, *args, **kwargs):
        if kwargs.get("name") == "bias":
            kwargs["autocast"] = False  # read as float32 under any policy
        return super().add_weight(*args, **kwargs)

    def call(self, inputs, training=None):
        if (not self.use_bias or self.compute_dtype == self.variable_dtype
                or self.lora_enabled or self.quantization_mode is not None):
            return super().call(inputs, training=training)
        x = ops.matmul(inputs, self.kernel)  # [..., units] in the compute dtype
        x = ops.cast(ops.cast(x, "float32") + self.bias, self.compute_dtype)
        if self.activation is not None:
            x = self.activation(x)
        return x
