"""Workaround: `model.fit` under MultiWorkerMirroredStrategy in Keras 3.15.1 (TF backend).

Keras 3.15.1's TensorFlow trainer fails twice with MultiWorkerMirroredStrategy (MWMS) in
multi-worker mode (reproduced here with 2 local workers; upstream reports:
https://github.com/keras-team/keras/issues/20329 and
https://github.com/keras-team/keras/issues/20585):

1. `TensorFlowTrainer._maybe_symbolic_build` takes the first distributed batch and calls
   `strategy.reduce("MEAN", batch, axis=None)` on the whole (dict) structure, only to learn
   shapes and dtypes for building metrics and the optimizer. MWMS's reduce does not accept a
   dict of PerReplica values (nor would a MEAN of int32 token ids make sense):
   "ValueError: Attempt to convert a value ({'input_word_ids': PerReplica:{...}}) with an
   unsupported type (<class 'dict'>) to a Tensor."
   Fix: build from the first local replica's values (same shapes and dtypes, no reduction).

2. After every step, `reduce_per_replica(..., reduction="auto")` reduces the step's logs
   with `strategy.reduce("MEAN", v, axis=0)` under MWMS. The logs are scalars, so this fails
   while tracing: "Invalid reduction dimension 0 for input with 0 dimensions".
   Fix: the step returns every scalar log as a [1] tensor; the MEAN over axis 0 of the
   replicas' [1] values is then the scalar Keras expects (metric values are identical on
   all replicas, so the mean changes nothing).

Both fixes are applied to one model *instance* (its `_maybe_symbolic_build`, `train_step`
and `test_step` attributes); Keras itself is not patched, so other models in the process
are unaffected. `apply` does nothing unless the model's strategy is MWMS in multi-worker
mode. Delete this module when Keras fixes the two call sites.
"""

import types

import keras
import tensorflow as tf


def needs_fix(strategy) -> bool:
    """True if `strategy` is a MultiWorkerMirroredStrategy spanning more than one worker."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode()  # What Keras' trainer itself checks.
    )


def _first_local_value(value):
    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[0]
    return value


def _symbolic_build_from_local_replica(model, iterator=None, data_batch=None):
    # Replaces TensorFlowTrainer._maybe_symbolic_build (fix 1).
    strategy = model.distribute_strategy
    if iterator is not None:
        for _, _, distributed_iterator in iterator:
            data_batch = tf.nest.map_structure(_first_local_value, next(distributed_iterator))
            break
    with strategy.scope():
        model._symbolic_build(data_batch=data_batch)


def _scalars_as_vectors(step_function):
    # Wraps train_step / test_step (fix 2): scalar logs [] -> [1].
    def step(data):
        logs = step_function(data)
        return tf.nest.map_structure(
            lambda x: tf.reshape(x, [1]) if x.shape.rank == 0 else x, logs
        )

    return step


def apply(model) -> bool:
    """Makes `model.fit` / `model.evaluate` work under multi-worker MWMS in Keras 3.15.1.

    Call after `model.compile(...)` and before the first `fit`/`evaluate`.

    Args:
      model: a compiled Keras model created under the strategy's scope.

    Returns:
      True if the workaround was applied, False if the model's strategy does not need it
      (other Keras backends have no tf.distribute strategy).
    """
    if keras.backend.backend() != "tensorflow" or not needs_fix(model.distribute_strategy):
        return False
    if getattr(model, "_bert_keras_multi_worker_fix", False):
        return True
    model._maybe_symbolic_build = types.MethodType(_symbolic_build_from_local_replica, model)
    model.train_step = _scalars_as_vectors(model.train_step)
    model.test_step = _scalars_as_vectors(model.test_step)
    # Functions traced before the fix would keep the broken reduction.
    model.train_function = None
    model.test_function = None
    model._bert_keras_multi_worker_fix = True
    return True
