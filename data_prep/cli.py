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


def define_flags(options_cls, defaults: Mapping[str, Any] | None = None) -> dict:
    """Declares one absl flag per flag field of `options_cls`; returns name -> FlagHolder.

    The flags belong to the calling module (the tool), so its --help lists them.

    Args:
      options_cls: a dataclass whose fields use `option(...)`.
      defaults: per-tool defaults replacing the dataclass's (e.g. max_seq_length=384).
    """
    from absl import flags

    hints = typing.get_type_hints(options_cls)
    module = calling_module()
    holders = {}
    for f in flag_fields(options_cls):
        meta = f.metadata
        default = (defaults or {}).get(f.name, f.default if f.default is not dataclasses.MISSING
                                       else f.default_factory())
        kind = _base_type(hints[f.name])
        kwargs = {"allow_override": True, "module_name": module}
        if meta["enum"]:
            holder = flags.DEFINE_enum(f.name, default, list(meta["enum"]), meta["help"], **kwargs)
        elif kind is bool:
            holder = flags.DEFINE_boolean(f.name, default, meta["help"], **kwargs)
        elif kind is int:
            holder = flags.DEFINE_integer(f.name, default, meta["help"], **kwargs)
        elif kind is float:
            holder = flags.DEFINE_float(f.name, default, meta["help"], **kwargs)
        elif kind is list:
            holder = flags.DEFINE_list(f.name, default, meta["help"], **kwargs)
        else:
            holder = flags.DEFINE_string(f.name, default, meta["help"], **kwargs)
        holders[f.name] = holder
    return holders


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


def report_errors(fn, expected: tuple[type[BaseException], ...], prog: str) -> int:
    """Runs `fn()`; an expected error becomes one line on stderr and exit status 1.

    Expected errors are the project's own (bad flags, files, data); their messages name the
    flag or file and what was expected. Anything else keeps its traceback: it is a bug.
    Set BERT_KERAS_DEBUG=1 to see the traceback of expected errors too.
    """
    import os
    import sys

    try:
        result = fn()
    except expected as e:
        if os.environ.get("BERT_KERAS_DEBUG"):
            raise
        message = " ".join(str(e).split("\n")[0].split()) if str(e) else type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


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


def run(main) -> None:
    """`app.run(main)` for a tool's `if __name__ == "__main__":`, with `help_exits_zero`."""
    from absl import app

    with help_exits_zero():
        app.run(main)
