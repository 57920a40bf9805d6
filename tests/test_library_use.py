"""bert_keras as a library in a user's own Keras script: the seams between our models and
Keras' saving, loading and training (docs/checkpoints.md, "Saving and loading your own
models"). Each model piece has its own tests; these check what a user's script crosses."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import bert_keras
from bert_keras.optimization import create_optimizer
from bert_keras.tasks import BertClassifier, BertTagger, compile_args
from conftest import TINY, backend_env, make_inputs

# The one import a user's loading script makes.
_LOAD_IN_FRESH_PROCESS = """
import json, sys
import numpy as np
import keras
import bert_keras
from tests.conftest import make_inputs

results = {}
for path in sys.argv[1:]:
    model = keras.models.load_model(path)
    results[path] = {
        "logits": np.asarray(model.predict(make_inputs(), verbose=0)["logits"]).tolist(),
        "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
    }
registered = sorted(name for name in keras.saving.get_custom_objects()
                    if name.startswith("bert_keras>"))
print(json.dumps({"results": results, "registered": registered}))
"""


def _registered_by_the_package():
    """Every Keras-serializable name our modules register (imported here, as tests do)."""
    import bert_keras.losses  # noqa: F401
    import bert_keras.optimization  # noqa: F401
    import bert_keras.tasks  # noqa: F401
    return sorted(name for name in keras.saving.get_custom_objects()
                  if name.startswith("bert_keras>"))


@pytest.mark.integration  # ~28 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_compiled_task_models_load_where_only_bert_keras_was_imported(tmp_path):
    # A user saves a fine-tuned model (our optimizer, compile_args' loss and metrics) and
    # loads it in another script that imports bert_keras, nothing deeper. Before the fix
    # that script failed: "Could not locate class 'BertClassifier'" (bert_keras.tasks,
    # bert_keras.optimization and bert_keras.losses were not imported by the package).
    x = make_inputs()
    paths, expected = [], {}
    for model in (BertClassifier(bert_keras.BertEncoder(**TINY), num_classes=3),
                  BertTagger(bert_keras.BertEncoder(**TINY), num_classes=5)):
        model.compile(optimizer=create_optimizer(1e-3, 10, num_warmup_steps=2),
                      **compile_args(model))
        labels = (np.array([0, 2, 1], "int32") if isinstance(model, BertClassifier)
                  else np.where(x["input_mask"] == 1, 1, -1).astype("int32"))
        model.fit(x, {"logits": labels}, batch_size=3, epochs=2, verbose=0)
        path = str(tmp_path / f"{model.name}.keras")
        model.save(path)
        paths.append(path)
        expected[path] = np.asarray(model.predict(x, verbose=0)["logits"])

    result = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_FRESH_PROCESS, *paths], capture_output=True,
        text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)),
        env=backend_env(keras.backend.backend()))
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    for path in paths:
        np.testing.assert_allclose(loaded["results"][path]["logits"], expected[path],
                                   atol=1e-5)
        assert loaded["results"][path]["iterations"] == 2  # the optimizer state came back
    # Whatever the package registers, `import bert_keras` registers: a class added to a
    # module the package does not import would break loading again.
    assert loaded["registered"] == _registered_by_the_package()
