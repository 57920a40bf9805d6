"""Command-line plumbing shared by every tool: flags declared once, from the options dataclass.

A tool's settings are one frozen dataclass whose fields carry their flag help
(`option(...)`); `define_flags` declares an absl flag per field and `values_from_flags`
reads them back, so each flag is written once (Google's flag names, absl's conventions,
FlagHolders read only in `main`). Fields without help are settings for Python callers only.

Several tools share flag names (vocab_file, max_seq_length, ...) and a test process imports
several tools, so flags are defined with allow_override: the same name keeps one type
everywhere, and a process runs one tool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import types
import typing
from typing import Any, Mapping, Sequence


def option(default: Any = None, help: str | None = None, *, enum: Sequence[str] | None = None,
           required: bool = False) -> Any:
    """A dataclass field that is also a command-line flag.

    Args:
      default: the default value (a list default is copied per instance).
      help: one sentence for --help; without it the field is not a flag.
      enum: allowed string values (an enum flag).
      required: the flag must be given (`required_flags`; absl checks it before main).
    """
    metadata = {"help": help, "enum": tuple(enum) if enum else None, "required": required}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _base_type(annotation) -> type:
    """int | None -> int; list[str] -> list."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0])
    return origin or annotation


def flag_fields(options_cls) -> list[dataclasses.Field]:
    """The fields of `options_cls` that are flags (they have help text)."""
    return [f for f in dataclasses.fields(options_cls) if f.metadata.get("help")]


def calling_module(depth: int = 2) -> str:
    """The name absl gives the module `depth` frames up (sys.argv[0] for __main__), so that
    flags declared by a helper are listed by the tool's --help as its own."""
    import sys

    name = sys._getframe(depth).f_globals.get("__name__", "")
    return sys.argv[0] if name == "__main__" else name


def define_flags(options_cls, defaults: Mapping[str, Any] | None = None,
                 only: Sequence[str] | None = None,
                 helps: Mapping[str, str] | None = None) -> dict:
    """Declares one absl flag per flag field of `options_cls`; returns name -> FlagHolder.

    The flags belong to the calling module (the tool), so its --help lists them.

    Args:
      options_cls: a dataclass whose fields use `option(...)`.
      defaults: per-tool defaults replacing the dataclass's (e.g. max_seq_length=384).
      only: the names of the fields to declare (another tool's few flags, with their
        type: convert_checkpoint's label flags are run_classifier's); None: all.
      helps: per-tool help texts replacing the dataclass's (another tool's flags, whose
        help would name flags this tool does not take).
    """
    from absl import flags

    hints = typing.get_type_hints(options_cls)
    module = calling_module()
    holders = {}
    for f in flag_fields(options_cls):
        if only is not None and f.name not in only:
            continue
        meta = f.metadata
        default = (defaults or {}).get(f.name, f.default if f.default is not dataclasses.MISSING
                                       else f.default_factory())
        help_text = (helps or {}).get(f.name, meta["help"])
        kind = _base_type(hints[f.name])
        kwargs = {"allow_override": True, "module_name": module}
        if meta["enum"]:
            holder = flags.DEFINE_enum(f.name, default, list(meta["enum"]), help_text, **kwargs)
        elif kind is bool:
            holder = flags.DEFINE_boolean(f.name, default, help_text, **kwargs)
        elif kind is int:
            holder = flags.DEFINE_integer(f.name, default, help_text, **kwargs)
        elif kind is float:
            holder = flags.DEFINE_float(f.name, default, help_text, **kwargs)
        elif kind is list:
            holder = flags.DEFINE_list(f.name, default, help_text, **kwargs)
        else:
            holder = flags.DEFINE_string(f.name, default, help_text, **kwargs)
        holders[f.name] = holder
    return holders


def mark_required(names: Sequence[str], flag_values=None) -> None:
    """absl's `mark_flags_as_required`, and an empty value refused too: absl takes any
    value but None, so `--output_dir=$OUT` with $OUT unset passed, and a tool wrote into
    the working directory (`--export_dir=`: a SavedModel as ./1) or named "/" in its error.
    Call it in a tool's `if __name__ == "__main__":` block."""
    from absl import flags

    flag_values = flags.FLAGS if flag_values is None else flag_values
    flags.mark_flags_as_required(names, flag_values=flag_values)
    for name in names:
        flags.register_validator(
            name, _more_than_blanks,
            message="expected a value, got an empty one (an unset shell variable?)",
            flag_values=flag_values)


def _more_than_blanks(value) -> bool:
    """Whether a flag's value holds more than blanks ("", "  ", [] or a list of blanks);
    any other kind of value (a number, a bool) does."""
    if not isinstance(value, (str, list)):
        return True
    return any(str(item).strip() for item in (value if isinstance(value, list) else [value]))


def required_flags(options_cls) -> list[str]:
    """Names of the flags marked required (mark them in `if __name__ == "__main__"`, so
    that importing a tool into another process marks nothing)."""
    return [f.name for f in flag_fields(options_cls) if f.metadata["required"]]


def values_from_flags(holders: Mapping) -> dict:
    """{name: value} of flag holders (call in main, after parsing)."""
    return {name: holder.value for name, holder in holders.items()}


def split_values(values: Mapping[str, Any], *options_classes) -> list[dict]:
    """Splits keyword values among dataclasses by field name; unknown names are an error."""
    parts, known = [], set()
    for cls in options_classes:
        names = {f.name for f in dataclasses.fields(cls)}
        parts.append({k: v for k, v in values.items() if k in names})
        known |= names
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"unknown options {unknown}")
    return parts


# --- The error boundary every tool's main runs behind. ---

DEBUG_ENV = "BERT_KERAS_DEBUG"  # set to 1 to see the traceback of expected errors too


class ToolError(ValueError):
    """A failure the user can fix (bad flag, file or data); its message names the flag or
    file and what was expected. Every tool's boundary prints it as one line. Modules define
    their error types as subclasses (config.ConfigError) or list them in `report_errors`."""


class InputError(ToolError):
    """A bad flag or input file: `subject` (the flag or file) and what was expected/found;
    the boundary prints `error: <subject>: <message>`."""

    def __init__(self, subject: str, message: str):
        super().__init__(f"{subject}: {message}")
        self.subject = subject


def check_seed(seed: int, flag: str = "--seed") -> None:
    """Raises InputError for a seed Keras' `set_random_seed` (numpy's generator) refuses
    with a traceback: it takes 0 to 2**32 - 1."""
    if not 0 <= seed < 2 ** 32:
        raise InputError(flag, f"expected 0 to 2**32 - 1 = {2 ** 32 - 1}, got {seed}")


class DamagedFileError(InputError):
    """A file the user named that a library could not read: truncated, corrupt or of another
    format (`reading` raises it from the library's own error, naming the file)."""


def library_errors() -> tuple[type[BaseException], ...]:
    """What the libraries that read users' files raise on a damaged one: safetensors'
    SafetensorError, h5py's OSError, protobuf's DecodeError, TensorFlow's OpError,
    tensorflow_text's RuntimeError, zip and JSON errors, and the ValueError, KeyError or
    EOFError of readers that meet bytes they do not expect."""
    import importlib
    import json
    import sys
    import zipfile

    found = [OSError, RuntimeError, ValueError, KeyError, IndexError, EOFError,
             zipfile.BadZipFile, json.JSONDecodeError]
    if "tensorflow" in sys.modules:  # no OpError can come from a process without TensorFlow
        found.append(sys.modules["tensorflow"].errors.OpError)
    for module, name in (("safetensors", "SafetensorError"),
                         ("google.protobuf.message", "DecodeError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # pragma: no cover - depends on the environment
            pass
    return tuple(found)


def _message(e: BaseException) -> str:
    """An error's text; TensorFlow's errors without the op context str() adds, and an eager
    op's `{{function_node ...}}` prefix and ` [Op:...] name: ...` suffix taken off its
    message ("corrupted record at 0 (Is this even a TFRecord file?)")."""
    if not type(e).__module__.startswith("tensorflow"):
        return str(e)
    message = str(getattr(e, "message", None) or e)
    message = re.sub(r"^\s*\{\{function_node [^}]*\}\}\s*", "", message)
    return re.sub(r"\s*\[Op:\w+\](?: name: \S*)?\s*$", "", message)


def first_line(e: BaseException) -> str:
    """The first line of a library's error (`_message`), for a one-line message."""
    lines = [line.strip() for line in _message(e).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


@contextlib.contextmanager
def reading(path: str, what: str):
    """Around a library's read of a file the user named (`path`, read as `what`, e.g. "a
    safetensors file"): the library's error (`library_errors`) becomes a DamagedFileError
    naming the file, which the boundary prints as one line. The project's own errors and a
    missing or unreadable path (FileNotFoundError, PermissionError, ...) pass unchanged:
    they already name what is wrong.

    Keep the block to the library call: an error of the project's code inside it would be
    reported as a damaged file.
    """
    try:
        yield
    except (ToolError, FileNotFoundError, PermissionError, IsADirectoryError,
            NotADirectoryError):
        raise
    except library_errors() as e:
        raise DamagedFileError(
            str(path), f"cannot be read as {what} ({type(e).__name__}: {first_line(e)}); "
            "expected a complete, undamaged file of that kind") from e


# Numeric flags checked when parsed, by name, on every tool that defines them (absl
# validators): (test, what was expected). None (an unset optional flag) is always accepted.
_AT_LEAST_1 = (lambda v: v >= 1, "expected an integer >= 1")
# Infinity too is refused: --rtol=inf passed every check of verify, --weight_decay=inf
# trained NaN weights.
_POSITIVE = (lambda v: math.isfinite(v) and v > 0, "expected a finite value > 0")
_NON_NEGATIVE = (lambda v: math.isfinite(v) and v >= 0, "expected a finite value >= 0")
_PROBABILITY = (lambda v: 0 <= v <= 1, "expected a value in [0, 1]")
# A threshold may be any finite number: NaN compares false with everything (run_squad
# would always answer, its export never), and train_results.json, which records it, is
# strict JSON.
_FINITE = (lambda v: math.isfinite(v), "expected a finite number")
NUMERIC_FLAG_RULES = {
    **{name: _POSITIVE for name in ("learning_rate", "num_train_epochs", "rtol",
                                    "beam_bucket_mb")},
    **{name: _AT_LEAST_1 for name in (
        "train_batch_size", "eval_batch_size", "predict_batch_size", "batch_size", "max_seq_length", "seq_length",
        "num_train_steps", "save_checkpoints_steps", "steps_per_execution",
        "gradient_accumulation_steps", "num_cpu_devices", "max_eval_steps",
        "max_query_length", "n_best_size", "max_answer_length", "dupe_factor", "num_workers",
        "num_output_shards", "shuffle_buffer_size", "vocab_size", "version",
        "min_document_sentences", "max_predictions_per_seq",
        # transformers' names of our batch sizes: a refusal names the flag given
        "per_device_train_batch_size", "per_device_eval_batch_size")},
    **{name: _NON_NEGATIVE for name in ("num_warmup_steps", "weight_decay", "num_unused",
                                        "num_examples_to_print", "random_doc_pool_size",
                                        "min_frequency", "max_alphabet")},
    "max_unique_words": _AT_LEAST_1,
    # run_tagger's 0 truncates long sentences instead of windowing them; run_squad and
    # export_span_qa, whose contexts are always windowed, refuse 0 in their own checks.
    "doc_stride": _NON_NEGATIVE,
    **{name: _PROBABILITY for name in ("warmup_proportion", "masked_lm_prob", "short_seq_prob",
                                       "classifier_dropout", "tagger_dropout", "warmup_ratio")},
    "null_score_diff_threshold": _FINITE,
}


def _install_validators(flag_values) -> None:
    """Registers `NUMERIC_FLAG_RULES` on the flags `flag_values` defines (once per flag
    object: tools sharing a process redefine shared flags)."""
    from absl import flags

    for name, (test, expected) in NUMERIC_FLAG_RULES.items():
        if name not in flag_values:
            continue
        flag = flag_values[name]
        if getattr(flag, "_bert_keras_checked", False):
            continue
        flags.register_validator(
            name, lambda v, test=test: v is None or (isinstance(v, (int, float)) and test(v)),
            message=expected, flag_values=flag_values)
        flag._bert_keras_checked = True


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def flag_error_line(e: Exception) -> str:
    """absl's flag errors as `--name: what` (absl says "flag --x=v: ..." or "Unknown ...")."""
    from absl import flags

    text = _one_line(e)
    if isinstance(e, flags.UnrecognizedFlagError):
        return f"--{e.flagname}: unknown flag (see --helpfull)"
    if text.startswith("flag --"):
        text = text[len("flag "):]
        name, _, rest = text.partition(": ")
        return f"{name}: {rest}" if rest else text
    return text


# Flags that name files or directories, besides every `*_file` and `*_dir`: a `~` that
# starts one of their paths is expanded (`expand_home_in_path_flags`).
PATH_FLAGS = ("input", "output", "init_checkpoint")


def is_path_flag(name: str) -> bool:
    """Whether flag `name` names files or directories (one path, or a comma-separated list)."""
    return name in PATH_FLAGS or name.endswith(("_file", "_dir"))


def expand_home_in_path_flags(flag_values) -> None:
    """Expands a leading `~` or `~user` of each path given on the command line to a path
    flag (each item of a comma-separated list), as a shell would have, so that every tool
    reads `--output_dir=~/runs/x` as the home directory's (absl, like tf.io.gfile, kept the
    `~`: a directory named "~" appeared in the working directory).

    Raises:
      InputError: naming the flag, where `~user` names no user.
    """
    from data_prep import files

    for name in list(flag_values):
        flag = flag_values[name]
        if not flag.present or not is_path_flag(name) or not flag.value:
            continue
        value = flag.value
        items = list(value) if isinstance(value, list) else str(value).split(",")
        if not any(item.strip().startswith("~") for item in items):
            continue
        try:
            items = [files.expand_home(item.strip()) if item.strip().startswith("~") else item
                     for item in items]
        except ValueError as e:
            raise InputError(f"--{name}", str(e)) from None
        setattr(flag_values, name, items if isinstance(value, list) else ",".join(items))


# The flags whose paths a Beam pipeline reads and writes through Beam's own file systems
# (create_pretraining_data with a Beam --runner: data_prep/beam_pipeline.py).
BEAM_PATH_FLAGS = ("input_file", "output_file")


def _beam_schemes() -> set[str]:
    """The schemes of Beam's file systems (none without Beam: the tool then says Beam is
    missing)."""
    try:
        from apache_beam.io import filesystems  # noqa: F401 -- registers them
        from apache_beam.io.filesystem import FileSystem
    except ImportError:  # pragma: no cover - depends on the environment
        return set()
    return {c.scheme() for c in FileSystem.get_all_subclasses()} - {None}


def refuse_unserved_schemes(flag_values) -> None:
    """Refuses a path given to a path flag (each item of a comma-separated list) whose
    scheme none of TensorFlow's file systems serves (`files.unserved_scheme`: a keras-hub or
    Hugging Face handle, `kaggle://`, `hf://`, a web address): every reader and writer
    reached it through tf.io.gfile, which failed with a traceback (UnimplementedError: File
    system scheme not implemented) wherever it first touched it. gs://, ram:// and file://
    pass, and with a Beam --runner the pipeline's own paths (`BEAM_PATH_FLAGS`) on Beam's
    file systems (s3://, hdfs://, azfs://).

    Raises:
      InputError: naming the flag and the value, and how to download it first.
    """
    from data_prep import files

    beam = ("runner" in flag_values and flag_values["runner"].value not in (None, "local"))
    for name in list(flag_values):
        flag = flag_values[name]
        if not flag.present or not is_path_flag(name) or not flag.value:
            continue
        value = flag.value
        items = list(value) if isinstance(value, list) else [str(value), *str(value).split(",")]
        for item in items:
            if "://" not in str(item):  # no TensorFlow import for local paths
                continue
            reason = files.unserved_scheme(
                str(item).strip(), _beam_schemes() if beam and name in BEAM_PATH_FLAGS else ())
            if reason is not None:
                raise InputError(f"--{name}", f"{str(item).strip()}: {reason}")


def join_comma_named_paths(flag_values) -> None:
    """Applies `files.split_patterns`' rule for a comma in a file name to the list path flags
    given on the command line (build_vocab's, prepare_corpus's and convert_checkpoint's
    --input): absl splits `--input=corpus,2024.txt` into "corpus" and "2024.txt"; a file
    named "corpus,2024.txt" that exists is that file. String path flags (--input_file) keep
    the value as typed, and their readers split it by the same rule.

    Raises:
      InputError: naming the flag, where the value is both a file and a list of files.
    """
    from data_prep import files

    for name in list(flag_values):
        flag = flag_values[name]
        if not flag.present or not is_path_flag(name) or not isinstance(flag.value, list):
            continue
        if len(flag.value) < 2:
            continue
        try:
            items = files.split_patterns(",".join(flag.value))
        except files.AmbiguousPathListError as e:
            raise InputError(f"--{name}", str(e)) from None
        if len(items) < len(flag.value):
            setattr(flag_values, name, items)


def parse_flags(argv: Sequence[str]) -> list[str]:
    """absl's flag parsing with numeric checks, `~` expanded in path flags
    (`expand_home_in_path_flags`), a list path flag's value that names one file with a
    comma in its name kept whole (`join_comma_named_paths`) and a path on no file system
    TensorFlow serves refused (`refuse_unserved_schemes`: kaggle://, hf://, https://); a bad
    flag is one line and exit status 2.

    Used as `app.run`'s flags_parser (`run`) and by `invoke`.
    """
    import sys

    from absl import flags

    _install_validators(flags.FLAGS)
    try:
        remaining = flags.FLAGS(list(argv))
    except flags.Error as e:
        print(f"error: {flag_error_line(e)}", file=sys.stderr)
        sys.exit(2)
    try:
        expand_home_in_path_flags(flags.FLAGS)
        join_comma_named_paths(flags.FLAGS)
        refuse_unserved_schemes(flags.FLAGS)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return remaining


def _common_expected() -> tuple:
    """Errors every tool reports in one line: bad usage, files the user named, damaged data."""
    from absl import app, flags

    found = [ToolError, app.UsageError, flags.Error, FileNotFoundError, FileExistsError,
             IsADirectoryError, NotADirectoryError, PermissionError, UnicodeDecodeError]
    try:
        from data_prep.files import OutputExistsError, OutputWriteError, TextFileError

        found += [OutputExistsError, OutputWriteError, TextFileError]
    except ImportError:  # pragma: no cover
        pass
    import sys

    if "tensorflow" in sys.modules:  # else none can come, and importing it would log
        # PermissionDenied: TensorFlow's writers and readers name the path ("<path>;
        # Permission denied"), as Python's PermissionError does.
        errors = sys.modules["tensorflow"].errors
        found += [errors.DataLossError, errors.PermissionDeniedError]
    try:
        from google.protobuf.message import DecodeError

        found.append(DecodeError)
    except ImportError:  # pragma: no cover
        pass
    try:  # a safetensors file read outside `reading` still gives one line
        from safetensors import SafetensorError

        found.append(SafetensorError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(found)


def _write_failure(e: BaseException):
    """`files.write_failure(e)`: (errno, path) of a write that failed for want of room."""
    from data_prep import files

    return files.write_failure(e)


def describe_error(e: BaseException) -> str:
    """One line for an expected error: its subject (flag or file) first where it has one."""
    failed = _write_failure(e)
    if failed is not None:
        # A write outside `atomic_output` (TensorFlow's shard, event and checkpoint writers,
        # a log): the file it names, under its final name, and what to do.
        from data_prep import files

        code, path = failed
        return (f"{files.final_name(path) + ': ' if path else ''}cannot be written: "
                f"{files.write_failure_cause(code)}")
    if isinstance(e, UnicodeDecodeError):
        return (f"{getattr(e, 'filename', 'input')}: not UTF-8 text (byte offset {e.start}: "
                f"{e.object[e.start:e.start + 1]!r}); expected UTF-8")
    if isinstance(e, FileExistsError) and getattr(e, "filename", None):
        return f"{e.filename}: already exists (expected a directory, or a path that is free)"
    if isinstance(e, OSError) and getattr(e, "filename", None) and e.strerror:
        return f"{e.filename}: {e.strerror}"
    text = _one_line(_message(e)) or type(e).__name__
    if type(e).__name__ == "DataLossError" and type(e).__module__.startswith("tensorflow"):
        return f"{text}; the file is damaged (truncated or not a TFRecord file)"
    if type(e).__name__ == "DecodeError":
        return f"{text} (not a valid protocol buffer: damaged or not a SavedModel)"
    if type(e).__name__ == "SafetensorError":
        return f"{text} (a damaged or truncated safetensors file)"
    return text


def expected_error_line(e: BaseException, expected: tuple[type[BaseException], ...] = ()
                        ) -> str | None:
    """`describe_error(e)` where `e` is expected (`report_errors`): the tool's `expected`
    types, the common ones, or a write that failed for want of room (a full disk, the
    file-size limit, a read-only file system: `files.write_failure`); None for a bug. For
    code that reports another process's error (create_pretraining_data's workers)."""
    if isinstance(e, tuple(expected) + _common_expected()) or _write_failure(e) is not None:
        return describe_error(e)
    return None


def report_errors(fn, expected: tuple[type[BaseException], ...] = (), prog: str | None = None,
                  on_interrupt: str | None = None) -> int:
    """Runs `fn()`; an expected error becomes one line on stderr and exit status 1.

    The line is `error: <flag or file>: <what was expected, what was found>`: expected errors
    are the project's own (bad flags, files, data; their messages name the flag or file),
    among them `DamagedFileError`, which `reading` makes of a library's error on a file the
    user named (safetensors, h5py, protobuf, tensorflow-text, ...), and those of
    `_common_expected` (usage, missing or existing files, undecodable text, damaged
    TFRecords, protocol buffers or safetensors files), and a write that failed for want of
    room or of a writable place (`files.write_failure`: no space, the file-size limit, a
    read-only file system; `files.atomic_output` names the output, `describe_error` the file
    TensorFlow's writers name). Ctrl-C is one line too, with status
    130 (outputs are written under temporary names, so an interruption leaves no partial
    one). Anything else keeps its traceback: it
    is a bug.
    Set BERT_KERAS_DEBUG=1 to see the traceback of expected errors too.

    Args:
      fn: the tool's body; its int result is the exit status (None: 0).
      expected: the tool's own error types, besides the common ones.
      prog: unused (kept for callers); the line starts with "error:" on every tool.
      on_interrupt: what to do after Ctrl-C, appended to its line (a trainer: how to
        resume).
    """
    import os
    import sys

    from data_prep import tf_logging

    try:
        # TensorFlow's own Python INFO notes (tf.distribute's reductions and devices, the
        # SavedModel writer's) stay out of the tool's log; TF_CPP_MIN_LOG_LEVEL=0 shows them.
        with tf_logging.python_info_hidden():
            result = fn()
    except Exception as e:  # pylint: disable=broad-except
        line = expected_error_line(e, expected)
        if line is None or os.environ.get(DEBUG_ENV):
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C: the tool's clean-up (temporary outputs removed, backups kept) has run on
        # the way here; its traceback is not the user's business. 130: as a shell reports it.
        if os.environ.get(DEBUG_ENV):
            raise
        print("error: interrupted (Ctrl-C)" + (f"; {on_interrupt}" if on_interrupt else ""),
              file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


def invoke(main, argv: Sequence[str], expected: tuple = ()) -> int:
    """Parses `argv` into absl's FLAGS and runs `main(argv)` behind the error boundary;
    returns the exit status (a bad flag: 2). `run` does this for `python -m`; tests call it
    in-process."""
    try:
        remaining = parse_flags(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return report_errors(lambda: main(remaining), expected)


# absl's help flags; -h, which absl does not know, is read as --help.
HELP_ARGS = ("--help", "-help", "--helpshort", "-helpshort", "--helpfull", "-helpfull", "-?")


@contextlib.contextmanager
def help_exits_zero(argv: list[str] | None = None):
    """Around `app.run`: --help, --helpshort and --helpfull exit with status 0 after the
    usage text, as every other command-line tool does (absl exits 1), and -h means --help.

    Only arguments before a "--" count; with a help flag absl exits while parsing, before
    main runs.
    """
    import sys

    argv = sys.argv if argv is None else argv
    end = argv.index("--") if "--" in argv else len(argv)
    for i in range(1, end):
        if argv[i] == "-h":
            argv[i] = "--help"
    wants_help = any(arg in HELP_ARGS for arg in argv[1:end])
    try:
        yield
    except SystemExit as e:
        if wants_help and e.code == 1:
            raise SystemExit(0) from None
        raise


def run(main, expected: tuple = ()) -> None:
    """`app.run(main)` with one-line flag errors, the error boundary and `help_exits_zero`
    (a tool's `if __name__ == "__main__":`)."""
    import sys

    from absl import app

    from data_prep import files

    tool = sys.modules.get("__main__")
    if tool is not None and tool.__doc__:
        # --help prints the tool's docstring: the documents it cites as this copy holds them
        # (an installed one has no docs/ beside the working directory).
        tool.__doc__ = files.cite_docs(tool.__doc__)
    with help_exits_zero():
        app.run(lambda argv: report_errors(lambda: main(argv), expected),
                flags_parser=parse_flags)
