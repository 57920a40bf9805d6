"""Checks that a graph only uses ops stock TensorFlow Serving can run.

Stock TF Serving links core TensorFlow plus tensorflow-text 2.12.1 (docs/DESIGN.md section 6). So
an export may use the ops core TensorFlow 2.12.1 registers (`tf_2_12_core_ops.txt`; the
TensorFlow exporting, 2.21, registers about 90 more, FFTND and SegmentMaxV2 among them,
which TF Serving refuses with "Op type not registered"), and from tensorflow-text only the
ops listed in `tf_text_2_12_ops.txt` (e.g. FastBertNormalize, FastWordpieceTokenizeWithOffsets;
not TFText>RoundRobinTrim, which keras-hub's packer uses).

    from export import op_check
    op_check.check_ops(saved_model_dir)            # raises OpCheckError naming bad ops
    op_check.check_ops(concrete_function)
    op_check.op_types(tf_function_with_signature)  # set of op type names, nested functions too

Command line: `python -m export.op_check SAVED_MODEL_DIR` prints the op types and exits 1 if
any is not servable.

`tf_2_12_core_ops.txt` is the output of `python -m export.op_check --print_core_ops` run
with tensorflow 2.12.1 (the interpreter of bench/tf_text_2_12_compat.py's step 2; the
integration test `test_the_core_op_list_is_tensorflow_2_12s` compares the two). "Core"
means registered in a fresh process that imported only tensorflow (a subprocess, so ops of
tensorflow_text or any other library loaded here do not count as core).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

ALLOWLIST_PATH = Path(__file__).with_name("tf_text_2_12_ops.txt")
CORE_OPS_PATH = Path(__file__).with_name("tf_2_12_core_ops.txt")


class OpCheckError(ValueError):
    """The graph uses ops that stock TF Serving cannot run; the message lists them."""


@functools.lru_cache(maxsize=None)
def load_allowlist(path: str | os.PathLike = ALLOWLIST_PATH) -> frozenset[str]:
    """Returns the op names of the allowlist file (one per line, '#' starts a comment)."""
    with open(path, encoding="utf-8") as f:
        names = frozenset(line.strip() for line in f if line.strip() and not line.startswith("#"))
    if not names:
        raise OpCheckError(f"op allowlist {path} is empty")
    return names


_LIST_CORE_OPS = r"""
import json, sys
import tensorflow  # noqa: F401  (registers the core ops, and nothing else)
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
ops = op_def_pb2.OpList()
ops.ParseFromString(c_api.TF_GetBuffer(c_api.TF_GetAllOpList()))
json.dump([tensorflow.__version__, sorted(op.name for op in ops.op)], sys.stdout)
"""


@functools.lru_cache(maxsize=None)
def core_ops() -> frozenset[str]:
    """Op types core TensorFlow 2.12.1 registers, stock TF Serving's (`CORE_OPS_PATH`)."""
    return load_allowlist(CORE_OPS_PATH)


@functools.lru_cache(maxsize=None)
def registered_core_ops() -> tuple[str, frozenset[str]]:
    """(version, op types) of the TensorFlow installed here, core only (a fresh `import
    tensorflow` process)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _LIST_CORE_OPS], capture_output=True,
                          text=True, env=env, check=False)
    if proc.returncode != 0:
        raise OpCheckError(f"could not list the core TensorFlow ops: {proc.stderr.strip()[-500:]}")
    version, names = json.loads(proc.stdout)
    return version, frozenset(names)


def _graph_def_op_types(graph_def) -> set[str]:
    """Op types of a GraphDef's nodes and of every function in its library."""
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types.update(node.op for node in function.node_def)
    return types


def op_types(obj: Any) -> set[str]:
    """Lists the op types of a graph, including ops inside nested functions.

    Args:
      obj: a SavedModel directory (str/Path; read without loading, so no op library needs
        to be imported), a ConcreteFunction, a tf.function with an input_signature, a
        tf.Graph, or a GraphDef.

    Returns:
      set[str] of op type names (e.g. {"Placeholder", "FastBertNormalize", ...}).

    Raises:
      OpCheckError: the directory holds no saved_model.pb.
      TypeError: an unsupported object, or a tf.function without input_signature.
    """
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    if isinstance(obj, (str, os.PathLike)):
        pb = Path(obj) / "saved_model.pb"
        if not pb.is_file():
            raise OpCheckError(f"{obj}: no saved_model.pb in this directory (not a SavedModel)")
        saved = saved_model_pb2.SavedModel()
        saved.ParseFromString(pb.read_bytes())
        types: set[str] = set()
        for meta_graph in saved.meta_graphs:
            types |= _graph_def_op_types(meta_graph.graph_def)
        return types
    if isinstance(obj, graph_pb2.GraphDef):
        return _graph_def_op_types(obj)
    if isinstance(obj, tf.Graph):
        return _graph_def_op_types(obj.as_graph_def())
    if hasattr(obj, "graph") and hasattr(obj, "structured_input_signature"):  # ConcreteFunction
        return _graph_def_op_types(obj.graph.as_graph_def())
    if hasattr(obj, "get_concrete_function"):  # tf.function
        if getattr(obj, "input_signature", None) is None:
            raise TypeError("op_types() needs a tf.function with an input_signature, or pass "
                            "fn.get_concrete_function(...) for the inputs you export")
        return op_types(obj.get_concrete_function())
    raise TypeError(f"op_types() expects a SavedModel directory, ConcreteFunction, tf.function, "
                    f"tf.Graph or GraphDef; got {type(obj).__name__}")


def disallowed_ops(types: Iterable[str], allowlist: Iterable[str] | None = None) -> dict[str, str]:
    """Returns {op type: reason} for every op stock TF Serving cannot run."""
    allowed = frozenset(load_allowlist() if allowlist is None else allowlist)
    core = core_ops()
    bad = {}
    for op in sorted(set(types)):
        if op in core or op in allowed:
            continue
        if op.startswith("TFText>") or _is_tf_text_op(op):
            bad[op] = "tensorflow-text op missing from tensorflow-text 2.12.1"
        elif op in registered_core_ops()[1]:
            bad[op] = (f"a core op of TensorFlow {registered_core_ops()[0]} that TensorFlow "
                       "2.12.1 lacks")
        else:
            bad[op] = "not a core TensorFlow op (custom op library?)"
    return bad


@functools.lru_cache(maxsize=None)
def _tf_text_ops() -> frozenset[str]:
    """Ops registered now but not by core TensorFlow (tensorflow_text when imported)."""
    try:
        import tensorflow_text  # noqa: F401
        from tensorflow.core.framework import op_def_pb2
        from tensorflow.python.client import pywrap_tf_session as c_api
    except ImportError:
        return frozenset()
    ops = op_def_pb2.OpList()
    ops.ParseFromString(c_api.TF_GetBuffer(c_api.TF_GetAllOpList()))
    return frozenset(op.name for op in ops.op) - registered_core_ops()[1]


def _is_tf_text_op(op: str) -> bool:
    return op in _tf_text_ops()


def check_ops(obj: Any, allowlist: Iterable[str] | None = None, what: str | None = None) -> set[str]:
    """Raises unless every op of `obj` is a core TF op or in the allowlist.

    Args:
      obj: see `op_types`.
      allowlist: op names allowed besides core ops; default `tf_text_2_12_ops.txt`.
      what: a name for `obj` in the error message.

    Returns:
      The set of op types (all allowed).

    Raises:
      OpCheckError: listing each offending op and why.
    """
    types = op_types(obj)
    bad = disallowed_ops(types, allowlist)
    if bad:
        name = what or (str(obj) if isinstance(obj, (str, os.PathLike)) else type(obj).__name__)
        listing = "\n".join(f"  {op}: {reason}" for op, reason in bad.items())
        raise OpCheckError(
            f"{name} uses {len(bad)} op type(s) that stock TF Serving (core TensorFlow + "
            f"tensorflow-text 2.12.1) cannot run:\n{listing}\nAllowed: the core ops of "
            f"TensorFlow 2.12.1 ({CORE_OPS_PATH}) and the ops listed in {ALLOWLIST_PATH}.")
    return types


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m export.op_check SAVED_MODEL_DIR [...]."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m export.op_check",
        description="Checks that SavedModels use only ops stock TF Serving can run: core "
                    "TensorFlow plus tensorflow-text 2.12.1 (listed in "
                    f"{ALLOWLIST_PATH}). Exit status 1 if any does not.")
    parser.add_argument("saved_model_dirs", nargs="*", metavar="SAVED_MODEL_DIR",
                        help="a SavedModel version directory (holding saved_model.pb), or a "
                        "model's base directory: its highest version, the one TF Serving serves")
    parser.add_argument("--print_core_ops", action="store_true",
                        help="print the core ops of the TensorFlow running this (with 2.12.1: "
                        f"{CORE_OPS_PATH.name}) and exit")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.print_core_ops:
        version, names = registered_core_ops()
        print(f"# Op types core TensorFlow {version} registers (`python -m export.op_check "
              f"--print_core_ops` with tensorflow=={version}).")
        print("\n".join(sorted(names)))
        return 0
    if not args.saved_model_dirs:
        parser.error("give at least one SAVED_MODEL_DIR (or --print_core_ops)")
    from data_prep import tf_logging

    tf_logging.import_tensorflow()  # without its C++ start-up notices, as every tool
    from export.saved_model_writer import served_version

    status = 0
    for path in map(served_version, args.saved_model_dirs):
        try:
            types = check_ops(path)
        except (OpCheckError, TypeError) as e:
            print(f"FAIL {e}", file=sys.stderr)
            status = 1
            continue
        non_core = sorted(t for t in types if t not in core_ops())
        print(f"OK {path}: {len(types)} op types; non-core: {', '.join(non_core) or 'none'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
