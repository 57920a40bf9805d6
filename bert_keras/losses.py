"""BERT's pretraining losses and metrics, and the one call that compiles a pretrainer.

Shapes: B = batch, P = max_predictions_per_seq, V = vocabulary size.

    masked-LM loss = sum(w * CE) / (sum(w) + 1e-5)   over the B*P predictions (docs/DESIGN.md section 3)
    NSP loss       = mean CE                          over the B pairs
    total          = masked-LM loss + NSP loss

An evaluation reports Google's masked_lm_loss instead, sum(w * CE) / sum(w) over every
prediction it saw (`MaskedLMLossMean`, compiled only into a model that evaluates).

Keras' stock reductions cannot express the masked-LM loss: "sum_over_batch_size" divides by
B*P (so padded predictions would dilute it) and "mean_with_sample_weight" divides by sum(w)
without Google's +1e-5. `MaskedLMLoss` therefore reduces by itself.

A dataset from `bert_keras.inputs.pretraining_dataset` yields
`(features, labels, sample_weights)` with labels and weights keyed by output name, so a
training script is:

    model = BertPretrainer(encoder)
    model.compile(optimizer=create_optimizer(...), **pretraining_losses_and_metrics())
    model.fit(pretraining_dataset(...), steps_per_epoch=..., epochs=...)
"""

import functools

import keras
from keras import ops

from bert_keras import kernels

# Google's run_pretraining.py: denominator = sum(label_weights) + 1e-5, so a batch with no
# real prediction gives loss 0 instead of NaN.
MLM_DENOMINATOR_EPSILON = 1e-5


def _scale_for_replicas(loss):
    # Under tf.distribute every replica computes its own loss and Keras all-reduces the
    # gradients with SUM; dividing by the replica count makes that sum a mean, which is
    # what Keras' own "sum_over_batch_size" reduction does. (Google's TPU code averages the
    # per-core losses the same way.) On JAX, keras.distribution shards one global
    # computation: the loss is already the global batch's.
    if keras.backend.backend() != "tensorflow":
        return loss
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1:
        loss = loss * (1.0 / replicas)
    return loss


# Where the label's probability is at least this, -log(p[label]) is exact to float32
# rounding; below it (a logit gap of about 69 or more) the loss is taken the long way.
_SMALLEST_TRUSTED_PROBABILITY = 1e-30


@functools.cache
def _tf_softmax_cross_entropy():
    """`_tf_softmax_cross_entropy_body` with its gradient (TensorFlow's custom_gradient)."""
    import tensorflow as tf

    return tf.custom_gradient(_tf_softmax_cross_entropy_body)


def _tf_softmax_cross_entropy_body(logits, labels):
    """Cross-entropy of float32 logits [N, V] against int32 labels [N]: float32 [N].

    TensorFlow's kernel for the masked-LM loss (the `cross_entropy` entry of
    `bert_keras.kernels`); `_cross_entropy` is the backend-neutral form.

    The same values and gradient (softmax - one_hot) as
    `tf.nn.sparse_softmax_cross_entropy_with_logits`, computed from `tf.nn.softmax`, which
    oneDNN runs about 7x faster per element than TensorFlow's fused cross-entropy kernel on
    CPU. On vocabulary-sized logits (mini preset, 640 x 30,522) that kernel takes 48 ms
    forward and backward, of a 750 ms training step; this takes 14 ms (BUILD_NOTES.md,
    issue 5).

    The loss is -log(p[label]). If any label's probability is below
    `_SMALLEST_TRUSTED_PROBABILITY` (it could underflow to 0 and give inf), the batch
    instead uses log-sum-exp - logit[label] with log-sum-exp = max(logits) - log(max(p)):
    max(p) >= 1/V never underflows, so that form is exact for any logits.
    """
    import tensorflow as tf

    probs = tf.nn.softmax(logits)  # [N, V]
    label_probs = tf.gather(probs, labels[:, None], batch_dims=1)[:, 0]  # [N]

    def from_maxima():
        label_logits = tf.gather(logits, labels[:, None], batch_dims=1)[:, 0]
        log_sum_exp = tf.reduce_max(logits, axis=-1) - tf.math.log(tf.reduce_max(probs, axis=-1))
        return log_sum_exp - label_logits

    loss = tf.cond(
        tf.reduce_all(label_probs >= _SMALLEST_TRUSTED_PROBABILITY),
        lambda: -tf.math.log(label_probs),
        from_maxima,
    )

    def grad(upstream):  # upstream: [N]
        return _tf_cross_entropy_gradient()(probs, labels, upstream), None

    return loss, grad


@functools.cache
def _tf_cross_entropy_gradient():
    """upstream[:, None] * (probs - one_hot(labels)), float32 [N, V], as a function.

    Compiled with XLA (inside a graph that is not), which fuses it into one pass over
    [N, V]; unfused TensorFlow takes three (or two plus a full copy with a scatter).
    """
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def gradient(probs, labels, upstream):
        one_hot = tf.one_hot(labels, tf.shape(probs)[-1], dtype=probs.dtype)
        return (probs - one_hot) * upstream[:, None]

    return gradient


@keras.saving.register_keras_serializable(package="bert_keras")
class MaskedLMLoss(keras.losses.Loss):
    """Masked-LM loss: sum(w * CE) / (sum(w) + 1e-5) (Google's `get_masked_lm_output`).

    Call with:
      y_true: int Tensor [B, P], the original token ids (`masked_lm_ids`).
      y_pred: float Tensor [B, P, V] of logits (`mlm_logits`).
      sample_weight: float Tensor [B, P], 1.0 for real predictions and 0.0 for padding
        (`masked_lm_weights`); None means all 1.

    Returns a float32 scalar. Predictions with weight 0 change neither the value nor the
    gradient.
    """

    def __init__(self, name="masked_lm_loss", dtype=None):
        super().__init__(name=name, reduction="sum", dtype=dtype)

    def call(self, y_true, y_pred):
        """Per-prediction cross-entropy, float32 [B, P]."""
        return masked_lm_cross_entropy(y_true, y_pred)

    def __call__(self, y_true, y_pred, sample_weight=None):
        with keras.name_scope(self.name):
            cross_entropy = self.call(y_true, y_pred)  # [B, P]
            if sample_weight is None:
                weights = ops.ones_like(cross_entropy)
            else:
                weights = ops.reshape(
                    ops.cast(sample_weight, "float32"), ops.shape(cross_entropy)
                )
            numerator = ops.sum(weights * cross_entropy)
            denominator = ops.sum(weights) + MLM_DENOMINATOR_EPSILON
            return _scale_for_replicas(numerator / denominator)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


def masked_lm_cross_entropy(y_true, y_pred):
    """Cross-entropy of each masked-LM prediction: float32 [B, P].

    Args:
      y_true: int Tensor [B, P], the original token ids (`masked_lm_ids`).
      y_pred: float Tensor [B, P, V] of logits (`mlm_logits`).

    TensorFlow's softmax kernel where `bert_keras.kernels` applies it, else `_cross_entropy`.
    """
    if not kernels.applies("cross_entropy"):
        return _cross_entropy(y_true, y_pred)
    import tensorflow as tf

    logits = tf.cast(y_pred, tf.float32)
    vocab_size = tf.shape(logits)[-1]
    labels = tf.reshape(tf.cast(y_true, tf.int32), tf.shape(logits)[:-1])
    # Labels outside [0, V) would otherwise fail deep inside a gather or scatter.
    message = "masked_lm_ids (the MLM labels) must be in [0, vocabulary size)"
    tf.debugging.assert_non_negative(labels, message=message)
    tf.debugging.assert_less(labels, vocab_size, message=message)
    cross_entropy = _tf_softmax_cross_entropy()(
        tf.reshape(logits, [-1, vocab_size]), tf.reshape(labels, [-1])
    )
    return tf.reshape(cross_entropy, tf.shape(labels))


def _cross_entropy(y_true, y_pred):
    """Cross-entropy of logits [B, P, V] against int labels [B, P] in keras.ops: float32 [B, P].

    log-sum-exp(logits) - logit[label]: exact for any logits (the maximum is subtracted
    inside `logsumexp`), and one fused pass over [B, P, V] under XLA. Labels outside
    [0, V) are not checked here (XLA programs cannot raise); the input pipelines read ids
    from the vocabulary the model was built for.
    """
    logits = ops.cast(y_pred, "float32")
    labels = ops.reshape(ops.cast(y_true, "int32"), ops.shape(logits)[:-1])
    label_logits = ops.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return ops.logsumexp(logits, axis=-1) - label_logits


def _correct_predictions(y_true, y_pred):
    """1.0 where the highest logit is the label's, else 0.0: float [B, P]."""
    if not kernels.applies("argmax"):  # MaskedLMAccuracy's docstring
        predicted = ops.argmax(y_pred, axis=-1)
        labels = ops.reshape(ops.cast(y_true, "int32"), ops.shape(predicted))
        return ops.cast(ops.equal(ops.cast(predicted, "int32"), labels), "float32")
    import tensorflow as tf

    predicted = tf.math.argmax(y_pred, axis=-1, output_type=tf.int32)
    labels = tf.reshape(tf.cast(y_true, tf.int32), tf.shape(predicted))
    return tf.cast(tf.equal(predicted, labels), "float32")


@keras.saving.register_keras_serializable(package="bert_keras")
class MaskedLMAccuracy(keras.metrics.MeanMetricWrapper):
    """Weighted accuracy of vocabulary-sized logits: Keras' SparseCategoricalAccuracy, faster.

    `keras.ops.argmax` of float logits first rewrites -0.0 entries (a guard against
    flush-to-zero on JAX, jax-ml/jax#24280): five extra passes over the [B, P, V] logits,
    about 5% of a training step at the mini preset. This metric takes TensorFlow's argmax
    directly. Both pick the first maximal logit, so the two agree except where the maximum
    is 0.0 tied with -0.0.

    Call with y_true int [B, P] (`masked_lm_ids`), y_pred float [B, P, V], and the
    `masked_lm_weights` as sample weights (as `weighted_metrics`).
    """

    def __init__(self, name="accuracy", dtype=None):
        super().__init__(fn=_correct_predictions, name=name, dtype=dtype)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


@keras.saving.register_keras_serializable(package="bert_keras")
class MaskedLMLossMean(keras.metrics.MeanMetricWrapper):
    """Google's evaluation `masked_lm_loss`: the weighted mean of the per-prediction
    cross-entropy over every prediction seen, all batches and replicas together.

    Google's run_pretraining evaluates `tf.metrics.mean(masked_lm_example_loss,
    weights=masked_lm_weights)`: sum(w * CE) / sum(w) over the whole evaluation (0 where
    no weight was seen). Keras' loss tracker instead averages each batch's `MaskedLMLoss`,
    which differs where batches hold different numbers of real predictions. Keras' `Mean`
    keeps the two sums (per row, mean(w * CE) and mean(w) over the P slots, so their
    ratio is the flat one) and adds them across replicas.

    Call with y_true int [B, P] (`masked_lm_ids`), y_pred float [B, P, V], and the
    `masked_lm_weights` as sample weights (as `weighted_metrics`). Each update computes
    the cross-entropy again, so `pretraining_losses_and_metrics` adds it for evaluation
    only.
    """

    def __init__(self, name="masked_lm_loss", dtype=None):
        super().__init__(fn=masked_lm_cross_entropy, name=name, dtype=dtype)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


def nsp_loss():
    """NSP loss: mean cross-entropy over the pairs (labels int [B] or [B, 1], logits [B, 2])."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="nsp_loss")


def pretraining_losses_and_metrics(mlm_only=False, evaluation=False):
    """Keyword arguments for `BertPretrainer.compile`: losses and metrics of BERT pretraining.

    Use as `model.compile(optimizer=..., **pretraining_losses_and_metrics())` with a dataset
    from `bert_keras.inputs.pretraining_dataset`. Keras then logs `loss` (the total),
    `mlm_logits_loss`, `nsp_logits_loss`, `mlm_logits_accuracy` (accuracy over the real
    masked predictions: weighted by masked_lm_weights) and `nsp_logits_accuracy`; fit's
    validation adds the same names with a `val_` prefix. Keras' `mlm_logits_loss` is the
    mean over batches of each batch's masked-LM loss; see `evaluation` for Google's.

    Args:
      mlm_only: Python bool; if True, only the masked-LM loss and accuracy (RoBERTa-style
        pretraining without NSP, and like-for-like benchmarks against MLM-only models).
      evaluation: Python bool; if True, also `MaskedLMLossMean` (logged as
        `mlm_logits_masked_lm_loss`; `evaluation_results` names it `mlm_logits_loss`), for a
        model that only evaluates: Keras updates compiled metrics in every training step
        too, and this one computes a second [B, P, V] cross-entropy.

    Returns:
      dict with `loss` and `weighted_metrics`, keyed by the pretrainer's output names.
    """
    loss = {"mlm_logits": MaskedLMLoss()}
    # weighted_metrics receive the sample weights: the MLM accuracy then counts only real
    # predictions (w = 1), exactly like Google's tf.metrics.accuracy(weights=...).
    metrics = {"mlm_logits": [MaskedLMAccuracy(name="accuracy")]}
    if evaluation:
        metrics["mlm_logits"].append(MaskedLMLossMean())
    if not mlm_only:
        loss["nsp_logits"] = nsp_loss()
        metrics["nsp_logits"] = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    return {"loss": loss, "weighted_metrics": metrics}


# The key of MaskedLMLossMean in the logs of a model compiled with evaluation=True.
_EXACT_MLM_LOSS = "mlm_logits_masked_lm_loss"


def evaluation_results(logs):
    """The logs of `evaluate` on a model compiled with `pretraining_losses_and_metrics(...,
    evaluation=True)`, with `mlm_logits_loss` Google's masked_lm_loss (`MaskedLMLossMean`)
    in place of Keras' mean of the batches' losses; the other keys as Keras logs them.

    Args:
      logs: dict of metric name to scalar, from `evaluate(..., return_dict=True)`.

    Returns:
      A new dict of metric name to Python float.

    Raises:
      ValueError: `logs` has no `mlm_logits_masked_lm_loss` (the model was compiled
        without evaluation=True).
    """
    if _EXACT_MLM_LOSS not in logs:
        raise ValueError(f"evaluation_results needs the logs of a model compiled with "
                         f"pretraining_losses_and_metrics(evaluation=True); received the "
                         f"keys {sorted(logs)}")
    return {k: float(v) for k, v in _with_googles_loss(logs).items()}


def _with_googles_loss(logs):
    """`logs` with `mlm_logits_loss` replaced by Google's masked_lm_loss where the logs hold
    it (a model compiled with evaluation=True), unchanged otherwise."""
    if not logs or _EXACT_MLM_LOSS not in logs:
        return logs
    renamed = {k: v for k, v in logs.items() if k != _EXACT_MLM_LOSS}
    renamed["mlm_logits_loss"] = logs[_EXACT_MLM_LOSS]
    return renamed


class EvaluationProgbarLogger(keras.callbacks.ProgbarLogger):
    """Keras' progress bar for `evaluate` of a model compiled with
    `pretraining_losses_and_metrics(evaluation=True)`, showing the names of
    `evaluation_results`: one `mlm_logits_loss`, Google's masked_lm_loss, where Keras' own
    bar shows its mean of the batches' losses beside `mlm_logits_masked_lm_loss`. Pass it
    in evaluate's `callbacks` (Keras then adds no bar of its own)."""

    def on_test_batch_end(self, batch, logs=None):
        super().on_test_batch_end(batch, _with_googles_loss(logs))

    def on_test_end(self, logs=None):
        super().on_test_end(_with_googles_loss(logs))
