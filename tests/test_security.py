"""Nothing a user passes in can run code: no pickle, eval, exec, unsafe YAML, allow_pickle=True
or Keras safe_mode=False anywhere in the project's code.

Every tool reads files a user names (checkpoints, configs, data, exports, fetched archives);
each of these would turn such a file into a program. The scan reads the source with `ast`,
so a mention in a comment or a string does not count and a method that happens to be called
`eval` (torch's `model.eval()`) is not the builtin.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Everything that ships or runs on users' files; tests are left out (they build such files).
SCANNED = ("bert_keras", "data_prep", "export", "scripts", "public_data", "bench")

FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal",
                     "shelve", "yaml"}
FORBIDDEN_BUILTINS = {"eval", "exec"}
# keyword=value pairs that switch a safe loader to an unsafe one.
FORBIDDEN_KEYWORDS = {("allow_pickle", True), ("safe_mode", False), ("shell", True)}
FORBIDDEN_ATTRIBUTES = {"enable_unsafe_deserialization", "unsafe_load", "full_load"}


def _python_files():
    for top in SCANNED:
        for directory, _, names in os.walk(os.path.join(ROOT, top)):
            for name in sorted(names):
                if name.endswith(".py"):
                    yield os.path.join(directory, name)


def _problems(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    where = os.path.relpath(path, ROOT)
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    yield f"{line}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                yield f"{line}: from {node.module} import ..."
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_BUILTINS:
                yield f"{line}: {node.func.id}(...)"
            if isinstance(node.func, ast.Name) and node.func.id == "__import__":
                yield f"{line}: __import__(...)"
            for keyword in node.keywords:
                if (isinstance(keyword.value, ast.Constant)
                        and (keyword.arg, keyword.value.value) in FORBIDDEN_KEYWORDS):
                    yield f"{line}: {keyword.arg}={keyword.value.value!r}"
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            yield f"{line}: .{node.attr}"


def test_no_code_execution_from_user_files():
    files = list(_python_files())
    assert len(files) > 50  # The scan sees the project.
    problems = [p for path in files for p in _problems(path)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, found", [
    ("import pickle", "import pickle"),
    ("from yaml import load", "from yaml import ..."),
    ("x = eval(text)", "eval(...)"),
    ("np.load(path, allow_pickle=True)", "allow_pickle=True"),
    ("keras.saving.load_model(path, safe_mode=False)", "safe_mode=False"),
    ("keras.config.enable_unsafe_deserialization()", ".enable_unsafe_deserialization"),
    ("model.eval()", None),  # a method, not the builtin
    ("# eval(x) and pickle in a comment", None),
])
def test_the_scan_finds_what_it_should(tmp_path, source, found):
    path = tmp_path / "example.py"
    path.write_text(source + "\n")
    problems = list(_problems(str(path)))
    assert problems == ([] if found is None else [f"{os.path.relpath(path, ROOT)}:1: {found}"])


def test_a_keras_file_with_python_code_is_refused(tmp_path):
    """The loader behind every --init_checkpoint keeps Keras' safe mode: a .keras file whose
    Lambda layer carries Python bytecode is refused, not run."""
    import keras

    from bert_keras import checkpoints, model_loading

    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2)(inputs))
    path = str(tmp_path / "model.keras")
    model.save(path)
    with pytest.raises(checkpoints.WeightLoadError, match="safe_mode") as e:
        model_loading.load_checkpoint(path)
    assert path in str(e.value)
