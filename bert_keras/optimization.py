"""BERT's optimizers on Keras' own: AdamW and LAMB, warmup + linear decay (docs/DESIGN.md section 7).

    AdamW  keras.optimizers.AdamW (its Adam step fused into one TensorFlow kernel: `AdamW`
           below), epsilon 1e-6, weight decay 0.01, global-norm clip 1.0
    LAMB   keras.optimizers.Lamb (You et al. 2019, https://arxiv.org/abs/1904.00962), same
           decay, exclusions and clipping; the large-batch option
    both   no weight decay on LayerNorm gamma/beta and on any bias (`NO_DECAY_PATTERN`)

Differences from Google's `AdamWeightDecayOptimizer` worth knowing: Keras' Adam applies
bias correction (Google's does not), and Keras applies weight decay decoupled from the
gradient step (var -= lr * wd * var), for LAMB too (outside the trust ratio).
"""

import keras
import tensorflow as tf
from keras import ops

# Variables whose *path* has a segment `gamma`, `beta` or `...bias` get no weight decay
# (Google: ["LayerNorm", "layer_norm", "bias"]). Keras matches `var_names` patterns with
# re.search against the TensorFlow variable name, which here is the full path plus ":0"
# (e.g. "transformer_layer_0/attention_layer_norm/gamma:0"), and under MirroredStrategy
# also "/replica_1:0" for the copies. The segment boundaries (/ or : or end) keep a layer
# merely *named* like "beta_proj" from losing its decay. tests/test_optimization.py lists
# which variables decay.
NO_DECAY_PATTERN = r"(?:^|/)(?:gamma|beta|\w*bias)(?:/|:|$)"

OPTIMIZERS = ("adamw", "lamb")


@keras.saving.register_keras_serializable(package="bert_keras")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0, then linear decay to 0 at `num_train_steps` (Google's BERT).

    With s = optimizer updates done (0-based):
        s <  num_warmup_steps:  lr = peak * s / num_warmup_steps
        s >= num_warmup_steps:  lr = peak * max(0, 1 - s / num_train_steps)
    exactly as Google's `optimization.create_optimizer` (the decay line starts at step 0, so
    at the end of warmup it is already peak * (1 - warmup / total)).

    Keras calls a schedule with the optimizer's *micro-batch* counter; with gradient
    accumulation over k batches the update number is that counter // k, so steps here are
    always optimizer updates (what `num_train_steps` counts).

    Args:
      peak_learning_rate: Python float, the learning rate after warmup.
      num_train_steps: Python int, optimizer updates of the whole run.
      num_warmup_steps: Python int, updates of linear warmup (0 for none).
      gradient_accumulation_steps: Python int, micro-batches per update (1 for none).
    """

    def __init__(self, peak_learning_rate, num_train_steps, num_warmup_steps=0,
                 gradient_accumulation_steps=1):
        if num_train_steps <= 0:
            raise ValueError(f"num_train_steps must be > 0. Received: {num_train_steps}")
        if not 0 <= num_warmup_steps <= num_train_steps:
            raise ValueError(
                f"num_warmup_steps must be in [0, num_train_steps={num_train_steps}]. "
                f"Received: {num_warmup_steps}"
            )
        if gradient_accumulation_steps < 1:
            raise ValueError(
                "gradient_accumulation_steps must be >= 1. "
                f"Received: {gradient_accumulation_steps}"
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = int(num_warmup_steps)
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)

    def __call__(self, step):
        step = ops.floor_divide(ops.cast(step, "int64"), self.gradient_accumulation_steps)
        step = ops.cast(step, "float32")
        decayed = self.peak_learning_rate * ops.maximum(0.0, 1.0 - step / self.num_train_steps)
        if self.num_warmup_steps == 0:
            return decayed
        warmup = self.peak_learning_rate * step / self.num_warmup_steps
        return ops.where(step < self.num_warmup_steps, warmup, decayed)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "num_train_steps": self.num_train_steps,
            "num_warmup_steps": self.num_warmup_steps,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
        }


@keras.saving.register_keras_serializable(package="bert_keras")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` whose Adam step is TensorFlow's fused `ResourceApplyAdam`.

    Same arguments, variables (names and layout: checkpoints load either way), weight decay,
    clipping, gradient accumulation and EMA as Keras' AdamW; only `update_step` differs.
    Keras writes that step in `keras.ops`: a dozen elementwise ops per variable, each a full
    pass over it. TensorFlow's kernel computes the same arithmetic,

        m += (g - m) * (1 - beta_1);   v += (g^2 - v) * (1 - beta_2)
        var -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)

    in one multi-threaded pass. At the mini preset (11.3M parameters, 7.8M of them the
    word embeddings, whose gradient is dense because the MLM output projection is tied to
    them) that cuts the optimizer's part of a training step from about 41 to 24 ms on a
    2-core CPU (BUILD_NOTES.md, issue 5). Other backends and `amsgrad=True` use Keras'
    step unchanged. Under `tf.distribute` the kernel runs once per device inside Keras'
    `extended.update` on that device's copies (as `tf.keras`' own Adam did); it also
    compiles under XLA.
    """

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)
        var = variable.value if isinstance(variable, keras.Variable) else variable
        dtype = var.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle,
            m=self._momentums[index].value.handle,
            v=self._velocities[index].value.handle,
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            # A sparse gradient (IndexedSlices) updates all rows, as in Keras' AdamW.
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),
            use_locking=False,
        )


def create_optimizer(
    learning_rate,
    num_train_steps,
    num_warmup_steps=0,
    optimizer="adamw",
    weight_decay=0.01,
    epsilon=1e-6,
    beta_1=0.9,
    beta_2=0.999,
    global_clipnorm=1.0,
    gradient_accumulation_steps=1,
):
    """BERT's optimizer: AdamW or LAMB with warmup + linear decay and decay exclusions.

    Args:
      learning_rate: Python float, peak learning rate (1e-4 for BERT pretraining).
      num_train_steps: Python int, optimizer updates of the whole run.
      num_warmup_steps: Python int, warmup updates.
      optimizer: "adamw" or "lamb".
      weight_decay: decoupled weight decay rate; not applied to LayerNorm and biases.
      epsilon: Adam epsilon (1e-6 in BERT).
      beta_1, beta_2: Adam moment decay rates.
      global_clipnorm: clip all gradients together to this global norm (1.0 in BERT).
      gradient_accumulation_steps: micro-batches per update; 1 for none. Keras averages the
        accumulated gradients, so k micro-batches of size b train like one batch of k*b.

    Returns:
      `AdamW` (a `keras.optimizers.AdamW`) or a `keras.optimizers.Lamb`.

    Raises:
      ValueError: unknown optimizer name or invalid step counts.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}. Received: {optimizer!r}")
    schedule = WarmupLinearDecay(
        learning_rate, num_train_steps, num_warmup_steps, gradient_accumulation_steps
    )
    kwargs = dict(
        learning_rate=schedule,
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=epsilon,
        global_clipnorm=global_clipnorm,
        # Keras wants None (not 1) for "no accumulation".
        gradient_accumulation_steps=(
            gradient_accumulation_steps if gradient_accumulation_steps > 1 else None
        ),
    )
    if optimizer == "adamw":
        opt = AdamW(**kwargs)
    else:
        opt = keras.optimizers.Lamb(**kwargs)
    opt.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    return opt
