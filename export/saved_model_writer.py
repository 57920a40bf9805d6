"""Writing SavedModels for TF Serving: the one place every export goes through.

TF Serving watches `<export_dir>/<version>/` and loads a version as soon as its directory
appears, so a version is written under a temporary (hidden) name beside it and renamed
when complete (`data_prep.files.atomic_output`; a killed export's leftover is removed by
the next export there); an existing version is never overwritten. Warmup requests go to `<version>/assets.extra/tf_serving_warmup_requests`
as PredictionLog records (TF Serving replays them before it marks the model available,
so the first real request does not pay for graph optimisation).
"""

from __future__ import annotations

import os
import shutil
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


class ExportError(RuntimeError):
    """An export cannot be written; the message says what and where."""


class Untracked:
    """Holds a Keras model on an export's tf.Module without saving it as an object.

    A Keras 3 variable exports as a *copy* of the tf.Variable it wraps
    (`KerasVariable._export_to_saved_model_graph`), while the traced serving functions
    capture the wrapped tf.Variable itself. A SavedModel that tracks the Keras model
    therefore restores the copies, and TF1-style loaders (TF Serving's C++ SavedModelBundle,
    `saved_model_cli run`) then fail with "Could not find variable ...": nothing restores
    the variables the functions read. Exports hold the model through this wrapper and track
    the captured tf.Variables themselves (`write_saved_model`), as
    `keras.export.ExportArchive` does; each weight is then stored once.
    """

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def captured_variables(functions) -> list:
    """The distinct tf.Variables the given concrete functions capture, in first-use order."""
    seen, variables = set(), []
    for fn in functions:
        for variable in fn.variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                variables.append(variable)
    return variables


def version_dir(export_dir: str, version: int | None) -> str:
    """Returns `<export_dir>/<version>`, refusing an existing version.

    Args:
      export_dir: the model's base directory (what TF Serving's --model_base_path names).
      version: positive integer, or None for one more than the highest existing version.

    Raises:
      ExportError: the version exists, or is not a positive integer; export_dir is a
        file, or a SavedModel itself (a version directory, not a base directory).
      files.OutputWriteError: the version could not be written there
        (`files.check_writable`).
    """
    from data_prep import files  # gs://... too (TF Serving reads models from GCS)

    existing = []
    if files.exists(export_dir) and not files.isdir(export_dir):
        raise ExportError(f"--export_dir {export_dir} is a file; expected a directory (the "
                          "model's base directory, versions go inside it)")
    if files.exists(os.path.join(export_dir, "saved_model.pb")):
        # A version directory: a SavedModel written inside it is one TF Serving never
        # serves (it serves the outer one), and it changes a served version's files.
        parent = os.path.dirname(export_dir.rstrip("/") if files.is_remote(export_dir)
                                 else os.path.normpath(export_dir)) or "."
        raise ExportError(f"--export_dir {export_dir} holds a SavedModel (saved_model.pb): it "
                          "is a version directory; give the model's base directory "
                          f"({parent}), where versions go")
    if files.isdir(export_dir):
        existing = [int(d) for d in files.listdir(export_dir) if d.isdigit()]
    if version is None:
        version = max(existing, default=0) + 1
    if not isinstance(version, int) or isinstance(version, bool) or version <= 0:
        raise ExportError(f"--version must be a positive integer. Received: {version!r}")
    path = os.path.join(export_dir, str(version))
    if files.exists(path):
        raise ExportError(
            f"{path} exists: refusing to overwrite an export. Choose another --version "
            "or remove it."
        )
    # Before the model is loaded and traced (seconds to minutes), not when it is written.
    files.check_writable([path])
    return path


def served_version(path: str) -> str:
    """The SavedModel directory TF Serving would serve from `path`.

    `path` itself when it holds saved_model.pb (a version directory); else, for a model's
    base directory, its highest numbered version, as TF Serving's default version policy
    ("latest") picks it, complete or not; else `path` unchanged, for the caller's error.
    """
    # tf.io.gfile, not data_prep.files: this runs where the project's other packages must
    # not be imported (serving_probe); it reads a gs:// base directory too.
    gfile = tf.io.gfile
    if gfile.exists(os.path.join(path, "saved_model.pb")) or not gfile.isdir(path):
        return path
    versions = [int(d.rstrip("/")) for d in gfile.listdir(path)
                if d.rstrip("/").isdigit() and gfile.isdir(os.path.join(path, d.rstrip("/")))]
    return os.path.join(path, str(max(versions))) if versions else path


def define_flags(module_name: str | None = None) -> dict:
    """Defines --export_dir and --version, `version_dir`'s arguments; returns holders.

    Every export CLI declares them with this help. The flags belong to `module_name`, by
    default the calling tool, so its --help lists them.
    """
    from absl import flags

    from data_prep.cli import calling_module

    kwargs = {"allow_override": True, "module_name": module_name or calling_module()}
    return {
        "export_dir": flags.DEFINE_string(
            "export_dir", None, "Base directory; the SavedModel goes to <export_dir>/<version>.",
            **kwargs),
        "version": flags.DEFINE_integer(
            "version", None, "Version (positive); default: next free.", **kwargs),
    }


def warmup_record(signature_name: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """One serialized PredictionLog holding a PredictRequest for `signature_name`."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest(
        model_spec=model_pb2.ModelSpec(signature_name=signature_name)
    )
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    log = prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)
    )
    return log.SerializeToString()


def read_warmup_requests(path: str) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Parses a warmup file into (signature_name, inputs) pairs.

    Raises:
      ExportError: a record is not a PredictionLog with a predict request.
    """
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for i, record in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record)
        if not log.HasField("predict_log"):
            raise ExportError(f"{path}: record {i} is not a PredictLog")
        request = log.predict_log.request
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        requests.append((request.model_spec.signature_name or "serving_default", inputs))
    return requests


def write_saved_model(
    module: tf.Module,
    path: str,
    signatures: Mapping[str, tf.types.experimental.ConcreteFunction],
    warmup: Sequence[tuple[str, Mapping[str, np.ndarray]]] = (),
    extra_files: Mapping[str, str] = (),
    method_names: Mapping[str, str] = (),
    version_files: Mapping[str, str] = (),
    custom_gradients: bool = True,
) -> str:
    """Saves `module` to `path` atomically, with warmup requests and extra asset files.

    Args:
      module: the tf.Module to save (tracks the model's variables once).
      path: the final version directory (see `version_dir`); must not exist.
      signatures: signature name -> concrete function.
      warmup: (signature_name, inputs) pairs written as PredictionLog records.
      extra_files: name -> source path, copied into `<path>/assets.extra/` (e.g. the config).
      method_names: signature name -> SignatureDef method name. tf.saved_model.save writes
        every signature as "tensorflow/serving/predict"; TF Serving's Classify and Regress
        APIs accept only signatures marked "tensorflow/serving/classify" / "regress".
      version_files: name -> text, written into `path` itself (TF Serving reads
        batching_params.pbtxt there).
      custom_gradients: whether the layers' custom gradients are saved (what a loader
        differentiating the export, as TF Hub fine-tuning does, runs); an export that is only
        served leaves them out: a third of a text-in classifier's functions, and their
        tracing and loading.

    Returns:
      `path`.
    """
    # Imported here: serving_probe reads warmup records with this module in a process that
    # must not import the project's other packages (verify's "load" check fails otherwise).
    from data_prep import files, tf_logging

    if files.exists(path):
        raise ExportError(f"{path} exists: refusing to overwrite an export")
    files.remove_stale_temps(path, any_name=True)  # exports of killed runs, any version
    # The variables the serving functions read, tracked directly (see `Untracked`).
    module.serving_variables = captured_variables(signatures.values())
    # tf.saved_model.save's notes for TensorFlow's developers (a dozen INFO lines per
    # export: renamed input names, sharding callbacks, fingerprints, assets) stay hidden.
    with files.atomic_output(path, directory=True) as tmp, tf_logging.python_info_hidden():
        tf.saved_model.save(module, tmp, signatures=dict(signatures),
                            options=tf.saved_model.SaveOptions(
                                experimental_custom_gradients=custom_gradients))
        if method_names:
            _set_method_names(tmp, dict(method_names))
        extra_dir = os.path.join(tmp, "assets.extra")
        os.makedirs(extra_dir, exist_ok=True)
        for name, source in dict(extra_files).items():
            shutil.copyfile(source, os.path.join(extra_dir, name))
        for name, text in dict(version_files).items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(text)
        if warmup:
            with tf.io.TFRecordWriter(os.path.join(tmp, WARMUP_FILE)) as writer:
                for signature_name, inputs in warmup:
                    writer.write(warmup_record(signature_name, inputs))
    warn_if_unloadable_where_it_is(path)
    return path


def warn_if_unloadable_where_it_is(path: str) -> None:
    """Warns, in one line, where TensorFlow cannot load the SavedModel at `path` from that
    path: its loaders (tf.saved_model.load, TF Serving's, TF 2.12's too) find the variables
    by a glob, `<path>/variables/variables.index`, which a "[", "*" or "?" in the path
    turns into a pattern that misses the file ("Failed to find any matching files")."""
    import glob

    from absl import logging

    if glob.has_magic(os.path.abspath(path)):
        logging.warning(
            "%s: TensorFlow cannot load a SavedModel from a path holding '[', '*' or '?' "
            "(its loaders find the variables by a glob): export.verify and "
            "export.saved_model_cli load it through a link; in your own code or TF Serving, "
            "load it through a symlink or copy without them (in Docker, mount it at "
            "/models/NAME)", path)


def _set_method_names(path: str, method_names: dict[str, str]) -> None:
    """Rewrites SignatureDef method names in `path`/saved_model.pb."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb_path = os.path.join(path, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with open(pb_path, "rb") as f:
        saved_model.ParseFromString(f.read())
    for meta_graph in saved_model.meta_graphs:
        for name, method in method_names.items():
            if name not in meta_graph.signature_def:
                raise ExportError(f"no signature {name!r} to mark as {method}")
            meta_graph.signature_def[name].method_name = method
    with open(pb_path, "wb") as f:
        f.write(saved_model.SerializeToString())


def _meta_graph(path: str):
    """The (only) MetaGraphDef of the SavedModel at `path`."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return saved_model.meta_graphs[0]


def signature_method_names(path: str) -> dict[str, str]:
    """Signature name -> method name of the SavedModel at `path`."""
    return {k: v.method_name for k, v in _meta_graph(path).signature_def.items()}


def variable_shapes(path: str) -> dict[str, list[int]]:
    """Variable name (e.g. "embeddings/position_embeddings") -> shape, of every variable
    the SavedModel at `path` saves (its object graph records both)."""
    return {node.variable.name: [d.size for d in node.variable.shape.dim]
            for node in _meta_graph(path).object_graph_def.nodes
            if node.WhichOneof("kind") == "variable"}


def saved_model_size(path: str) -> int:
    """Bytes of `path`'s variables directory (what the parameters cost on disk)."""
    total = 0
    for root, _, files in os.walk(os.path.join(path, "variables")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total
