"""Which Keras backends the tools run on, checked in one place (docs/backends.md).

    TRAINING_BACKENDS  run_pretraining, run_classifier, run_tagger, run_squad,
                       extract_features, convert_checkpoint: TensorFlow or JAX (data
                       through tf.data either way)
    EXPORT_BACKENDS    the export tools: TensorFlow (they write TensorFlow SavedModels; a
                       model trained on JAX is exported by a TensorFlow process)

Keras fixes its backend when it is first imported (KERAS_BACKEND, else ~/.keras/keras.json),
so a tool cannot switch; it can only refuse early, in one line, through the tools' error
boundary (`data_prep.cli.report_errors`): `check_backend` raises a `cli.InputError`.
A name Keras itself does not know (KERAS_BACKEND=bogus) fails inside `import keras`, before
any tool code runs.
"""

from __future__ import annotations

from data_prep import files
from data_prep.cli import InputError

TRAINING_BACKENDS = ("tensorflow", "jax")
EXPORT_BACKENDS = ("tensorflow",)


def check_backend(supported: tuple[str, ...] = TRAINING_BACKENDS) -> str:
    """Returns Keras' backend name if it is one of `supported`.

    Raises:
      data_prep.cli.InputError: "KERAS_BACKEND: expected tensorflow or jax, found torch ...";
        the error boundary prints it as `error: KERAS_BACKEND: ...`.
    """
    import keras

    name = keras.backend.backend()
    if name not in supported:
        choices = " or ".join(supported)
        raise InputError("KERAS_BACKEND", f"expected {choices}, found {name} (set "
                         f"KERAS_BACKEND={supported[0]}; see {files.doc_path('backends.md')})")
    return name


def compile_steps_on_jax(model) -> None:
    """On JAX, runs `model`'s train, test and predict steps through jax.jit whatever its
    `jit_compile` says (every training tool calls it after `model.compile`).

    Keras skips jax.jit when jit_compile is False, so each step would run op by op,
    uncompiled (and, across processes with several devices each, an eager op on a global
    array stalled the job); XLA is JAX's only compiler, and --jit_compile is TensorFlow's
    switch. The compile config keeps the flag's value, so model.keras is the same file on
    both backends (a model saved with jit_compile=False and loaded on JAX is covered too).
    """
    import keras

    if keras.backend.backend() == "jax" and not model.jit_compile:
        model.jit_compile = True
        model.train_function = model.test_function = model.predict_function = None
