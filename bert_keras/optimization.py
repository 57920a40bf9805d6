"""BERT's optimizers on Keras' own: AdamW and LAMB, warmup + linear decay (docs/DESIGN.md section 7).

    AdamW       keras.optimizers.AdamW (its Adam step fused into one TensorFlow kernel:
                `AdamW` below), epsilon 1e-6, weight decay 0.01, global-norm clip 1.0
    LAMB        `Lamb` below: LAMB as published (You et al. 2019,
                https://arxiv.org/abs/1904.00962; TF Model Garden's and TF-Addons' code):
                the weight decay is added to the Adam update *before* the trust ratio
                ||w|| / ||update||, and LayerNorm and biases get neither decay nor trust ratio
    keras_lamb  keras.optimizers.Lamb (decay decoupled outside the trust ratio, trust ratio
                on every variable), kept under its own name for comparison
    all         no weight decay on LayerNorm gamma/beta and on any bias (`NO_DECAY_PATTERN`);
                clipping to the global norm of the *true* gradient (`clip_by_true_global_norm`)

Clipping. Keras' `global_clipnorm` is applied to each replica's local gradient, before the
cross-replica sum, and it takes the norm of a sparse gradient (`tf.IndexedSlices`, from an
embedding lookup) over its unaggregated slices, so an id that occurs twice counts as two
rows. Both give a norm other than the gradient's (on one span-QA batch 4.10 instead of 4.97),
so the update differs from the documented arithmetic. Here the clip happens after the
cross-replica sum and after gradient accumulation (on the gradient the update uses; a
`LossScaleOptimizer` unscales before), and duplicates are summed before their norm is taken
(a segment sum over the batch's ids, never a vocabulary-sized table).

Where these differ from Google's `AdamWeightDecayOptimizer` (BERT's TF1 code), and why:

    | what            | Google's TF1 code | here                            | effect (*)        |
    | bias correction | none              | Adam's (m_hat, v_hat)           | loss 4.928 vs     |
    |                 |                   |                                 | 4.920 without     |
    | epsilon         | sqrt(v) + eps     | adam_paper: sqrt(v_hat) + eps   | none here; -1.1   |
    |                 |                   | (torch); or keras               | POS points (#29)  |
    | lr schedule     | decay from step 0 | linear: decay after warmup;     | +0.0007 loss;     |
    |                 |                   | or google (TF1's, to reproduce) | -2.6 POS (#29)    |

    (*) bench/optimizer_arithmetic.py: a tiny 300-update masked-LM run, 2 seeds, seed
    spread 0.08 in loss; "#29": issue 29's Brown POS fine-tuning run in transformers.

Bias correction is what Adam defines and what Keras, torch and transformers do; without it
the early updates are larger by (1 - beta_1^t) / sqrt(1 - beta_2^t): 3.2x at step 1, up to
6.5x near step 10, 1.26x at step 1000, which the warmup partly hides.
"""

import math

import keras
from keras import ops

from bert_keras import kernels

# Variables whose *path* has a segment `gamma`, `beta` or `...bias` get no weight decay
# (Google: ["LayerNorm", "layer_norm", "bias"]). Keras matches `var_names` patterns with
# re.search against the TensorFlow variable name, which here is the full path plus ":0"
# (e.g. "transformer_layer_0/attention_layer_norm/gamma:0"), and under MirroredStrategy
# also "/replica_1:0" for the copies. The segment boundaries (/ or : or end) keep a layer
# merely *named* like "beta_proj" from losing its decay. tests/test_optimization.py lists
# which variables decay. LAMB leaves the same variables out of its trust ratio.
NO_DECAY_PATTERN = r"(?:^|/)(?:gamma|beta|\w*bias)(?:/|:|$)"

OPTIMIZERS = ("adamw", "lamb", "keras_lamb")
LR_SCHEDULES = ("linear", "google")
EPSILON_PLACEMENTS = ("adam_paper", "keras")


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}. Received: {value!r}")


@keras.saving.register_keras_serializable(package="bert_keras")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to the peak, then linear decay to 0 at `num_train_steps`.

    With s = optimizer updates done (0-based), W = num_warmup_steps, T = num_train_steps:
        s <  W:  lr = peak * s / W
        s >= W:  decay="linear": lr = peak * (T - s) / (T - W)    (TF Model Garden,
                                 transformers' get_linear_schedule_with_warmup)
                 decay="google": lr = peak * max(0, 1 - s / T)    (Google's BERT: the decay
                                 line starts at step 0, so at the end of warmup the rate is
                                 already peak * (1 - W / T); for exact reproduction)
    The decay part is `keras.optimizers.schedules.PolynomialDecay` (power 1, to 0).

    Keras calls a schedule with the optimizer's *micro-batch* counter; with gradient
    accumulation over k batches the update number is that counter // k, so steps here are
    always optimizer updates (what `num_train_steps` counts).

    Args:
      peak_learning_rate: Python float, the learning rate after warmup.
      num_train_steps: Python int, optimizer updates of the whole run.
      num_warmup_steps: Python int, updates of linear warmup (0 for none).
      gradient_accumulation_steps: Python int, micro-batches per update (1 for none).
      decay: "linear" or "google" (above).
    """

    def __init__(self, peak_learning_rate, num_train_steps, num_warmup_steps=0,
                 gradient_accumulation_steps=1, decay="linear"):
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
        _check_choice("decay", decay, LR_SCHEDULES)
        self.peak_learning_rate = float(peak_learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = int(num_warmup_steps)
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)
        self.decay = decay
        # Linear: decay over the T - W updates after warmup (at least one, so T == W is a
        # schedule that ends at the peak). Google: over all T updates, from step 0.
        self._offset = self.num_warmup_steps if decay == "linear" else 0
        self._decay = keras.optimizers.schedules.PolynomialDecay(
            self.peak_learning_rate, max(1, self.num_train_steps - self._offset),
            end_learning_rate=0.0, power=1.0)

    def __call__(self, step):
        # int64 where the backend has it (JAX runs 32-bit unless jax_enable_x64 is set).
        wide = "int64" if keras.backend.backend() == "tensorflow" else "int32"
        step = ops.floor_divide(ops.cast(step, wide), self.gradient_accumulation_steps)
        step = ops.cast(step, "float32")
        decayed = self._decay(ops.maximum(0.0, step - self._offset))
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
            "decay": self.decay,
        }

    @classmethod
    def from_config(cls, config):
        # Saved before `decay` existed: that was Google's curve.
        return cls(**{"decay": "google", **config})


def _squared_norm(gradient):
    """Squared L2 norm of a gradient; an IndexedSlices' duplicate rows are summed first.

    The rows of `tf.IndexedSlices` for one id add up (that is the gradient); taking the
    norm of the slices as they come counts them as separate rows. The ids are sorted and
    the rows of each id summed into one of n segments (n = number of slices), which never
    builds a vocabulary-sized table (outside XLA; see `_dense_under_xla`).
    """
    import tensorflow as tf

    if isinstance(gradient, tf.IndexedSlices):
        indices = gradient.indices
        values = tf.cast(gradient.values, tf.float32)
        order = tf.argsort(indices, stable=True)
        ids = tf.gather(indices, order)
        n = tf.shape(ids)[0]
        first = tf.logical_or(tf.not_equal(ids, tf.roll(ids, 1, axis=0)),
                              tf.equal(tf.range(n), 0))
        segments = tf.cumsum(tf.cast(first, tf.int32)) - 1
        rows = tf.math.unsorted_segment_sum(tf.gather(values, order), segments, n)
        return 2.0 * tf.nn.l2_loss(rows)
    return 2.0 * tf.nn.l2_loss(tf.cast(gradient, tf.float32))


def _dense_under_xla(gradients):
    """The gradients, with IndexedSlices densified when XLA compiles the computation.

    Compiled by XLA, the sort and segment sum of `_squared_norm` took a fine-tuned
    classifier's step (its word table's gradient is an IndexedSlices) from 1.3 s to 5.1 s
    on a CPU; with the dense gradient, which the update needs anyway, it took 0.76-1.3 s
    (BUILD_NOTES 8.9). Densified once, the norm and the update share it.
    """
    if not kernels.in_tensorflow_xla():
        return gradients
    import tensorflow as tf

    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
            for g in gradients]


def true_global_norm(gradients):
    """Global L2 norm of the gradients as the dense tensors they stand for (float32)."""
    import tensorflow as tf

    return tf.sqrt(tf.add_n([_squared_norm(g) for g in _dense_under_xla(gradients)
                             if g is not None]))


def clip_by_true_global_norm(gradients, clip_norm):
    """Scales all gradients by min(1, clip_norm / true_global_norm); NaN if it is not finite.

    Same rule as `keras`' (and `tf.clip_by_global_norm`'s), with the norm of
    `true_global_norm`; IndexedSlices stay IndexedSlices (scaling is linear, so duplicates
    need no aggregation for that), except under XLA, where they come back dense.
    """
    import tensorflow as tf

    gradients = _dense_under_xla(gradients)
    norm = true_global_norm(gradients)
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
    scale = scale + (norm - norm)  # NaN for an inf/NaN norm, as Keras.

    def _scale(g):
        if g is None:
            return None
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices,
                                    g.dense_shape)
        return g * tf.cast(scale, g.dtype)

    return [_scale(g) for g in gradients]


class TrueGlobalNormClipping:
    """Mixin for a Keras optimizer: `global_clipnorm` on the true gradient (module doc).

    Keras clips in `_backend_apply_gradients`, before `_backend_update_step` sums the
    replicas' gradients; here the clip moves into `_backend_update_step`, after that sum.
    With gradient accumulation Keras calls it with the accumulated mean, and a
    LossScaleOptimizer hands the gradients over unscaled, so it clips what the update uses.
    `clipnorm` and `clipvalue` stay Keras' (per variable, per replica).
    """

    # The weight-decay exclusions by name (`exclude_from_weight_decay(var_names=...)`: BERT's
    # NO_DECAY_PATTERN) are part of the config, as Model Garden's AdamWeightDecay keeps its
    # `exclude_from_weight_decay`: Keras' optimizers keep them outside it, so an optimizer
    # reloaded from a .keras file (to train further) decayed LayerNorm and biases, and
    # LAMB adapted their trust ratio.
    def __init__(self, *args, exclude_from_weight_decay=None, **kwargs):
        super().__init__(*args, **kwargs)
        if exclude_from_weight_decay:
            self.exclude_from_weight_decay(var_names=list(exclude_from_weight_decay))

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        super().exclude_from_weight_decay(var_list=var_list, var_names=var_names)
        self._decay_exclusion_names = list(var_names or [])

    def get_config(self):
        config = super().get_config()
        names = getattr(self, "_decay_exclusion_names", None)
        if names:
            config["exclude_from_weight_decay"] = names
        return config

    def _clip_gradients(self, grads):
        if self.global_clipnorm and self.global_clipnorm > 0:
            return grads  # In _backend_update_step, after the cross-replica sum.
        return super()._clip_gradients(grads)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not (self.global_clipnorm and self.global_clipnorm > 0):
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        if keras.backend.backend() != "tensorflow":
            # No IndexedSlices and no tf.distribute: Keras' own norm is the true one.
            from keras.src.optimizers.base_optimizer import clip_by_global_norm
            return super()._backend_update_step(
                clip_by_global_norm(grads, self.global_clipnorm), trainable_variables,
                learning_rate)
        # As keras' TensorFlow optimizer, with the clip between the sum and the update.
        import tensorflow as tf

        trainable_variables = [v.value if isinstance(v, keras.Variable) else v
                               for v in trainable_variables]
        grads_and_vars = self._all_reduce_sum_gradients(list(zip(grads, trainable_variables)))
        clipped = clip_by_true_global_norm([g for g, _ in grads_and_vars], self.global_clipnorm)
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._distributed_tf_update_step, self._distribution_strategy,
            list(zip(clipped, trainable_variables)), learning_rate)


def _dense(gradient):
    """A gradient as a dense tensor; an IndexedSlices' duplicate rows summed.

    Keras' TensorFlow ops keep IndexedSlices as they are, so in Keras' own Adam and Lamb
    steps `ops.square(gradient)` squares each slice *before* duplicates are summed: the
    second moment gets sum(g_i^2) instead of (sum g_i)^2 for an id seen twice in a batch.
    Densifying first gives the true gradient's moments (what TensorFlow's fused Adam kernel,
    and torch, compute).
    """
    if keras.backend.backend() != "tensorflow":
        return gradient  # Other backends' embedding gradients are dense.
    import tensorflow as tf

    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient


def _bias_corrections(optimizer, dtype):
    """(1 - beta_1^t, 1 - beta_2^t) for the update being made (t counts from 1), each to
    float32's precision.

    Keras' Adam computes 1 - beta_2^t as `1 - ops.power(float32(beta_2), t)`. float32(0.999)
    is 0.999 + 1.3e-8, so that difference of two numbers near 1 is off by 1.3e-5 relative at
    every t up to a few hundred, while the moments are accumulated with 1 - beta_2 taken in
    float64 (0.001): v_hat = v / (1 - beta_2^t) then comes out 1.3e-5 too large for every
    element alike, so every early update is 6e-6 too short, all in the same direction. That
    shift is coherent, not noise, and it showed as per-step losses 1e-5 off the torch
    reference after 40 fine-tuning updates on JAX (and on TensorFlow under XLA), against
    1e-6 with TensorFlow's fused kernel (BUILD_NOTES.md 8.12). Here 1 - beta^t =
    -expm1(t * log(beta)), with log(beta) taken in float64: the same value as torch's and
    as the reference arithmetic, to a few float32 ulps.
    """
    step = ops.cast(optimizer.iterations + 1, dtype)
    return tuple(-ops.expm1(step * ops.cast(math.log(beta), dtype))
                 for beta in (optimizer.beta_1, optimizer.beta_2))


def _update_moments(optimizer, gradient, variable):
    """Adam's moment updates for `variable` (m += (g - m)(1 - beta_1), v likewise with g^2);
    returns (m, v, 1 - beta_1^t, 1 - beta_2^t) for the step of Adam or LAMB to take.

    Args:
      gradient: the variable's gradient (any dtype; an IndexedSlices is densified).
      variable: a model variable of `optimizer`, float32 or float16.
    """
    dtype = variable.dtype
    gradient = ops.cast(_dense(gradient), dtype)
    index = optimizer._get_variable_index(variable)
    m, v = optimizer._momentums[index], optimizer._velocities[index]
    optimizer.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - optimizer.beta_1))
    optimizer.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v),
                                         1 - optimizer.beta_2))
    return (m, v, *_bias_corrections(optimizer, dtype))


def _trust_ratio(variable, update):
    """LAMB's ||variable|| / ||update||, 1 where either norm is 0."""
    w_norm = ops.sqrt(ops.sum(ops.square(variable)))
    u_norm = ops.sqrt(ops.sum(ops.square(update)))
    return ops.where(ops.greater(w_norm, 0),
                     ops.where(ops.greater(u_norm, 0), w_norm / u_norm, 1.0), 1.0)


@keras.saving.register_keras_serializable(package="bert_keras")
class AdamW(TrueGlobalNormClipping, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` with true-gradient clipping, epsilon placement and a fused step.

    Same arguments, variables (names and layout: checkpoints load either way), weight decay,
    gradient accumulation and EMA as Keras' AdamW; `global_clipnorm` clips the true gradient
    (`TrueGlobalNormClipping`), and `epsilon_placement` says where epsilon goes:

        "keras":      var -= lr * m_hat / (sqrt(v_hat) + epsilon / sqrt(1 - beta_2^t))
                      (Keras' Adam: epsilon outside the bias correction, so early in
                      training it acts up to 1 / sqrt(1 - beta_2) = 32x larger)
        "adam_paper": var -= lr * m_hat / (sqrt(v_hat) + epsilon)
                      (Adam's algorithm 1, torch, transformers)

    with m_hat = m / (1 - beta_1^t), v_hat = v / (1 - beta_2^t). Keras writes its step in
    `keras.ops`: a dozen elementwise ops per variable, each a full pass over it. TensorFlow's
    `ResourceApplyAdam` kernel computes

        m += (g - m) * (1 - beta_1);   v += (g^2 - v) * (1 - beta_2)
        var -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + eps)

    in one multi-threaded pass; with eps = epsilon * sqrt(1 - beta_2^t) that is the
    "adam_paper" step. At the mini preset (11.3M parameters, 7.8M of them the word
    embeddings, whose gradient is dense because the MLM output projection is tied to them)
    the kernel cuts the optimizer's part of a training step from about 41 to 24 ms on a
    2-core CPU (BUILD_NOTES.md, issue 5). Other backends, XLA (`jit_compile`, TPUs: the
    kernel compiles there but does not win, `bert_keras.kernels`) and `amsgrad=True` use
    Keras' step (with "adam_paper", epsilon is rescaled the same way). Under
    `tf.distribute` the kernel runs once per device inside Keras' `extended.update` on that
    device's copies.
    """

    def __init__(self, *args, epsilon_placement="keras", **kwargs):
        _check_choice("epsilon_placement", epsilon_placement, EPSILON_PLACEMENTS)
        super().__init__(*args, **kwargs)
        self.epsilon_placement = epsilon_placement

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or not kernels.applies("adam_fused"):
            return self._adam_step(gradient, variable, learning_rate)
        import tensorflow as tf

        index = self._get_variable_index(variable)
        var = variable.value if isinstance(variable, keras.Variable) else variable
        dtype = var.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        beta2_power = tf.pow(beta_2, step)
        epsilon = tf.cast(self.epsilon, dtype)
        if self.epsilon_placement == "adam_paper":
            epsilon = epsilon * tf.sqrt(1 - beta2_power)
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle,
            m=self._momentums[index].value.handle,
            v=self._velocities[index].value.handle,
            beta1_power=tf.pow(beta_1, step),
            beta2_power=beta2_power,
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=epsilon,
            # A sparse gradient (IndexedSlices) updates all rows, as in Keras' AdamW.
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),
            use_locking=False,
        )

    def _adam_step(self, gradient, variable, learning_rate):
        """Keras' Adam step (`keras.optimizers.Adam.update_step`, amsgrad included) with
        the bias corrections of `_bias_corrections` and epsilon per placement."""
        dtype = variable.dtype
        m, v, correction_1, correction_2 = _update_moments(self, gradient, variable)
        alpha = ops.cast(learning_rate, dtype) * ops.sqrt(correction_2) / correction_1
        epsilon = ops.cast(self.epsilon, dtype)
        if self.epsilon_placement == "adam_paper":
            epsilon = epsilon * ops.sqrt(correction_2)
        if self.amsgrad:
            v_hat = self._velocity_hats[self._get_variable_index(variable)]
            self.assign(v_hat, ops.maximum(v_hat, v))
            v = v_hat
        self.assign_sub(variable, ops.divide(ops.multiply(m, alpha), ops.sqrt(v) + epsilon))

    def get_config(self):
        return {**super().get_config(), "epsilon_placement": self.epsilon_placement}

    def _apply_weight_decay(self, variables):
        """Decoupled weight decay as one multiplication: var *= 1 - lr * weight_decay.

        Keras' TensorFlow optimizer writes `var.assign_sub(var * wd * lr)`: two
        multiplications over the variable and an in-place subtraction, three passes over
        every decayed variable (all but LayerNorm and biases: nearly every parameter).
        `var.assign(var * (1 - lr * wd))` is one pass, and the assignment adopts the
        product's buffer instead of copying it. It is torch's form
        (`param.mul_(1 - lr * weight_decay)`) and equal to Keras' up to rounding.
        Other backends keep Keras' step.
        """
        if self.weight_decay is None or keras.backend.backend() != "tensorflow":
            return super()._apply_weight_decay(variables)
        import tensorflow as tf

        def decay(variable):
            if self._use_weight_decay(variable):
                rate = tf.cast(self.learning_rate, variable.dtype) * tf.cast(
                    self.weight_decay, variable.dtype)
                variable.assign(variable * (1 - rate))

        def apply(distribution, variables, **kwargs):
            # As Keras: each device's copy is decayed on that device.
            for variable in variables:
                if isinstance(variable, keras.Variable):
                    variable = variable.value
                distribution.extended.update(variable, decay, group=False)

        tf.__internal__.distribute.interim.maybe_merge_call(
            apply, self._distribution_strategy, variables)


@keras.saving.register_keras_serializable(package="bert_keras")
class Lamb(TrueGlobalNormClipping, keras.optimizers.Optimizer):
    """LAMB as published (You et al. 2019, algorithm 2; TF Model Garden, TF-Addons).

    For each variable w with gradient g (t counts updates from 1):

        m = beta_1 m + (1 - beta_1) g;   v = beta_2 v + (1 - beta_2) g^2
        r = m_hat / (sqrt(v_hat) + epsilon)       (epsilon_placement="adam_paper", default)
        if w decays:  r += weight_decay * w;  ratio = ||w|| / ||r||  (1 if either is 0)
        else:         ratio = 1
        w -= learning_rate * ratio * r

    Variables excluded from weight decay (`exclude_from_weight_decay`: LayerNorm and biases
    in BERT) are excluded from layer adaptation too, as in TF-Addons' default. Keras' own
    `keras.optimizers.Lamb` (`KerasLamb`, "keras_lamb") instead decays outside the trust
    ratio (w -= lr * wd * w first) and applies the ratio to every variable.
    `epsilon_placement="keras"` puts epsilon outside the bias correction as Keras' Adam does.
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 weight_decay=0.01, epsilon_placement="adam_paper", name="lamb", **kwargs):
        _check_choice("epsilon_placement", epsilon_placement, EPSILON_PLACEMENTS)
        super().__init__(learning_rate=learning_rate, name=name, weight_decay=weight_decay,
                         **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.epsilon_placement = epsilon_placement

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"])

    def _apply_weight_decay(self, variables):
        pass  # Inside the update, before the trust ratio (update_step).

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        m, v, correction_1, correction_2 = _update_moments(self, gradient, variable)
        epsilon = ops.cast(self.epsilon, dtype)
        if self.epsilon_placement == "keras":
            epsilon = epsilon / ops.sqrt(correction_2)
        update = ops.divide(ops.divide(m, correction_1),
                            ops.sqrt(ops.divide(v, correction_2)) + epsilon)
        if self._use_weight_decay(variable):
            if self.weight_decay:
                update = update + ops.cast(self.weight_decay, dtype) * variable
            update = _trust_ratio(variable, update) * update
        self.assign_sub(variable, lr * update)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2,
                "epsilon": self.epsilon, "epsilon_placement": self.epsilon_placement}


@keras.saving.register_keras_serializable(package="bert_keras")
class KerasLamb(TrueGlobalNormClipping, keras.optimizers.Lamb):
    """`keras.optimizers.Lamb` ("keras_lamb") on the true gradient; see `Lamb`.

    Its update rule is Keras', with 1 - beta^t to float32 precision (`_bias_corrections`:
    with Keras' own, a classifier's per-step losses on JAX were 6.4x float32 noise away
    from the torch reference, 1.2x with these; BUILD_NOTES 8.12); the gradient it sees is
    the true one: clipped by `TrueGlobalNormClipping` and, for IndexedSlices, densified
    first (`_dense`).
    """

    def update_step(self, gradient, variable, learning_rate):
        """`keras.optimizers.Lamb.update_step` with the bias corrections of
        `_bias_corrections` (Keras' are 1.3e-5 off: see there)."""
        m, v, correction_1, correction_2 = _update_moments(self, gradient, variable)
        update = ops.divide(ops.divide(m, correction_1),
                            ops.add(ops.sqrt(ops.divide(v, correction_2)), self.epsilon))
        lr = ops.cast(learning_rate, variable.dtype)
        self.assign_sub(variable, _trust_ratio(variable, update) * lr * update)


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
    lr_schedule="linear",
    epsilon_placement="adam_paper",
):
    """BERT's optimizer: AdamW or LAMB with warmup + linear decay and decay exclusions.

    Args:
      learning_rate: Python float, peak learning rate (1e-4 for BERT pretraining).
      num_train_steps: Python int, optimizer updates of the whole run.
      num_warmup_steps: Python int, warmup updates.
      optimizer: "adamw", "lamb" (as published) or "keras_lamb" (Keras' variant).
      weight_decay: decoupled weight decay rate; not applied to LayerNorm and biases.
      epsilon: Adam epsilon (1e-6 in BERT).
      beta_1, beta_2: Adam moment decay rates.
      global_clipnorm: clip all gradients together to this global norm of the true
        gradient (1.0 in BERT); None for no clipping.
      gradient_accumulation_steps: micro-batches per update; 1 for none. Keras averages the
        accumulated gradients, so k micro-batches of size b train like one batch of k*b.
      lr_schedule: "linear" (decay from the peak after warmup to 0) or "google" (Google's
        TF1 curve); see `WarmupLinearDecay`.
      epsilon_placement: "adam_paper" (sqrt(v_hat) + epsilon, as torch) or "keras"; see
        `AdamW`. Not used by "keras_lamb" (Keras' Lamb adds epsilon to sqrt(v_hat)).

    Returns:
      `AdamW` (a `keras.optimizers.AdamW`), `Lamb` or `KerasLamb`.

    Raises:
      ValueError: unknown optimizer, schedule or placement name, or invalid step counts.
    """
    _check_choice("optimizer", optimizer, OPTIMIZERS)
    _check_choice("lr_schedule", lr_schedule, LR_SCHEDULES)
    _check_choice("epsilon_placement", epsilon_placement, EPSILON_PLACEMENTS)
    schedule = WarmupLinearDecay(
        learning_rate, num_train_steps, num_warmup_steps, gradient_accumulation_steps,
        decay=lr_schedule,
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
        opt = AdamW(epsilon_placement=epsilon_placement, **kwargs)
    elif optimizer == "lamb":
        opt = Lamb(epsilon_placement=epsilon_placement, **kwargs)
    else:
        opt = KerasLamb(**kwargs)
    opt.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    return opt
