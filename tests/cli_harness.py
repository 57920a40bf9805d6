"""Runs a command-line tool's `main` in this process, as `python -m <tool> <argv>` would.

Starting Python and TensorFlow costs seconds per run; the bad-input suite runs its cases
in-process instead: absl's FLAGS are reset (`unparse_flags`), the tool's per-tool flag
defaults applied, argv parsed and `main` run behind the error boundary (`data_prep.cli.invoke`,
the same code `python -m` runs), with stdout and stderr captured and SystemExit caught.
Without `cli.invoke` (older code) it imitates `absl.app.run`: flag errors as absl prints
them, exceptions as tracebacks, so a sweep can be measured before and after a change.

Tools share flag names in one process (each defines them with allow_override); the last
definition wins, so tools whose defaults differ (run_squad's `_DEFAULTS`) get them set here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import os
import traceback

TOOLS = {
    "run_classifier": "bert_keras.run_classifier",
    "run_regressor": "bert_keras.run_regressor",
    "run_tagger": "bert_keras.run_tagger",
    "run_squad": "bert_keras.run_squad",
    "extract_features": "bert_keras.extract_features",
    "run_pretraining": "bert_keras.run_pretraining",
    "convert_checkpoint": "bert_keras.convert_checkpoint",
    "export_encoder": "export.export_encoder",
    "export_classifier": "export.export_classifier",
    "export_regressor": "export.export_regressor",
    "export_tagger": "export.export_tagger",
    "export_span_qa": "export.export_span_qa",
    "export_preprocessor": "export.export_preprocessor",
    "verify": "export.verify",
    "build_vocab": "data_prep.build_vocab",
    "prepare_corpus": "data_prep.prepare_corpus",
    "create_pretraining_data": "data_prep.create_pretraining_data",
}


@dataclasses.dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def _emulate_app_run(main, argv) -> int:
    """What absl.app.run does with flag errors, UsageError and exceptions (old code)."""
    import sys

    from absl import app, flags

    try:
        remaining = flags.FLAGS(argv)
    except flags.Error as e:
        print(f"FATAL Flags parsing error: {e}", file=sys.stderr)
        print("Pass --helpshort or --helpfull to see help on flags.", file=sys.stderr)
        return 1
    try:
        result = main(remaining)
    except app.UsageError as e:
        print(f"FATAL Flags parsing error: {e}", file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 -- the traceback is what Python would print
        traceback.print_exc()
        return 1
    return result if isinstance(result, int) else 0


def tool_defaults(module) -> dict:
    """The flag defaults of a tool whose shared flags have tool-specific defaults (the
    fine-tuning tools' options dataclasses and their task's, run_pretraining's, run_squad's
    _DEFAULTS); the other tools' shared flags have one default everywhere."""
    from data_prep import cli

    classes = []
    if hasattr(module, "TASK"):
        from bert_keras.finetuning import runner

        # The task's own flags too: export_span_qa defines --max_query_length and
        # --version_2_with_negative with other defaults (None: "as fine-tuned").
        classes += [runner.FinetuneOptions, module.TASK.options_class()]
    if hasattr(module, "PretrainingOptions"):
        classes.append(module.PretrainingOptions)
    # Any other tool's own options (extract_features' ExtractOptions): a flag it shares
    # with a tool imported later in this process (--max_seq_length, whose fine-tuning
    # default is None) otherwise runs with that tool's default.
    classes += [obj for obj in vars(module).values()
                if isinstance(obj, type) and dataclasses.is_dataclass(obj)
                and obj.__module__ == module.__name__ and obj not in classes
                and cli.flag_fields(obj)]
    defaults = {}
    for cls in classes:
        for f in cli.flag_fields(cls):
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
    defaults.update(getattr(module, "_DEFAULTS", {}))
    return defaults


def run_tool(tool: str, argv: list[str], env: dict | None = None) -> Result:
    """Runs `tool` (a key of TOOLS) with command-line arguments `argv`; never raises for
    the tool's failures (an unexpected exception becomes a traceback on the captured stderr).
    """
    from absl import flags

    module = importlib.import_module(TOOLS[tool])
    from data_prep import cli

    fv = flags.FLAGS
    fv.unparse_flags()
    saved_defaults = {}
    for name, value in tool_defaults(module).items():
        if name in fv and fv[name].default != value:
            saved_defaults[name] = fv[name].default
            fv.set_default(name, value)
    old_env = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if hasattr(cli, "invoke"):
                    code = cli.invoke(module.main, [tool, *argv])
                else:
                    code = _emulate_app_run(module.main, [tool, *argv])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except Exception:  # noqa: BLE001 -- an uncaught error: a traceback, as Python
                traceback.print_exc()
                code = 1
    finally:
        fv.unparse_flags()  # before restoring defaults: set_default validates the value
        for name, value in saved_defaults.items():
            fv.set_default(name, value)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Result(code if code is not None else 0, out.getvalue(), err.getvalue())


def tree(path: str) -> dict[str, int]:
    """{relative path: size} of every file and directory under `path` (directories: -1)."""
    found = {}
    for root, dirs, names in os.walk(path):
        for d in dirs:
            found[os.path.relpath(os.path.join(root, d), path)] = -1
        for n in names:
            p = os.path.join(root, n)
            found[os.path.relpath(p, path)] = os.path.getsize(p) if os.path.exists(p) else -2
    return found
