"""The export tools run Keras on TensorFlow, whatever KERAS_BACKEND says.

An export writes a TensorFlow SavedModel, so its process needs Keras on TensorFlow; a model
trained with KERAS_BACKEND=jax set in the shell (docs/backends.md) exports from the same
shell. Keras fixes its backend when it is first imported, so an export tool run as a
program calls `use_tensorflow()` at the top of its module, before TensorFlow (which imports
Keras) is imported, and says in one line which backend it used (`describe`):

    if __name__ == "__main__":  # before TensorFlow and Keras are imported
        _ENVIRONMENT_BACKEND = keras_backend.use_tensorflow()

Imported as a library into a process whose Keras already runs on another backend, the
tools refuse in one line instead (`bert_keras.backends.check_backend`).
"""

from __future__ import annotations

import os
import sys

ENV = "KERAS_BACKEND"


def use_tensorflow() -> str | None:
    """Sets KERAS_BACKEND=tensorflow in this process's environment (its child processes,
    export.verify's probes, inherit it) if Keras is not imported yet.

    Returns:
      What KERAS_BACKEND said before (None: unset, or Keras already imported).
    """
    if "keras" in sys.modules:
        return None  # too late: check_backend reports another backend in one line
    requested = os.environ.get(ENV)
    os.environ[ENV] = "tensorflow"
    return requested


def describe(requested: str | None) -> str:
    """One line: the backend Keras runs on, and the KERAS_BACKEND it replaced if another.

    Args:
      requested: `use_tensorflow()`'s result.
    """
    import keras

    used = keras.backend.backend()
    if requested and requested != used:
        from bert_keras.backends import TRAINING_BACKENDS

        # Another backend than the training tools run on is not "for training".
        role = "is for training" if requested in TRAINING_BACKENDS else "is not used"
        return (f"Keras backend: {used} (KERAS_BACKEND={requested} from the environment "
                f"{role}; exports write TensorFlow SavedModels)")
    return f"Keras backend: {used}"
