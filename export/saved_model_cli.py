"""TensorFlow's `saved_model_cli`, quiet, with the text ops our exports use registered.

    python -m export.saved_model_cli show --all --dir out/quickstart/models/spam_classifier/1
    python -m export.saved_model_cli run --dir out/quickstart/models/spam_classifier/1 \
        --tag_set serve --signature_def serving_default \
        --input_exprs 'text=["Win a FREE cruise!"]'

Every argument is saved_model_cli's own (`--help` lists them). Three things differ from the
`saved_model_cli` program TensorFlow installs:
  - TensorFlow is imported through `data_prep.tf_logging`, so its C++ start-up notices
    (oneDNN, CUDA probing, absl's pre-initialisation banner: about ten lines), the oneDNN
    int64 notice and TensorFlow's deprecation warnings for the TF1 loader it uses are not
    printed; `TF_CPP_MIN_LOG_LEVEL=0` brings them back. The plain program prints the
    start-up lines before any environment variable can hide them.
  - `tensorflow_text` is imported first: `run` on a preprocessor or classifier export needs
    its FastBertNormalize / FastWordpieceTokenizeWithOffsets ops registered in the process.
  - A `--dir` whose path holds "[", "*" or "?" (".../run [1]/...") loads: TensorFlow finds
    the variables by a glob, so it is read through a link without them.
  - A mistake (a --dir that holds no SavedModel, an unknown tag-set, signature or input
    key, an input that does not parse or fit) is one line, `error: ...`, and exit status 1,
    where the plain program prints a traceback (BERT_KERAS_DEBUG=1 shows it); an unknown
    command is one line and status 2, and `--help` (also after a command) prints
    saved_model_cli's own usage and exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import sys


def _help_or_usage_error(args: list[str]) -> int | None:
    """The exit status for a call that asks for help or names no known command (after the
    usage text or the one line is printed), else None: the call runs."""
    from tensorflow.python.tools import saved_model_cli

    from data_prep import cli

    end = args.index("--") if "--" in args else len(args)
    if any(arg in (*cli.HELP_ARGS, "-h") for arg in args[:end]):
        # absl would print this module's docstring and exit 1; saved_model_cli's own parser
        # lists its commands (and a command's usage examples after the command).
        sys.argv = ["python -m export.saved_model_cli"]
        try:
            saved_model_cli.create_parser().parse_args(args[:end])
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 0
        return 0
    commands = list(saved_model_cli.command_required_flags)
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command not in commands:
        found = f"unknown command {command!r}" if command else "no command"
        print(f"error: saved_model_cli: {found}; expected one of {', '.join(commands)} "
              f"(--help lists them)", file=sys.stderr)
        return 2
    return None


def main(argv: list[str] | None = None) -> None:
    """Runs saved_model_cli with `argv` (default: this process's arguments); exits with its
    status."""
    from data_prep import tf_logging

    tf = tf_logging.import_tensorflow()
    import tensorflow_text  # noqa: F401  (registers the text ops the exports use)
    if tf_logging.log_level() > 0:
        # saved_model_cli loads with TF1's loader, whose deprecation warnings (printed twice,
        # through TensorFlow's handler and absl's) are not for the user of an export. A
        # filter, since saved_model_cli sets the logger's level to INFO itself.
        tf.get_logger().addFilter(lambda record: record.levelno >= logging.ERROR)
    from tensorflow.python.tools import saved_model_cli

    from data_prep import cli, files

    args = list(sys.argv[1:] if argv is None else argv)
    status = _help_or_usage_error(args)
    if status is not None:
        sys.exit(status)
    with contextlib.ExitStack() as stack:
        # TensorFlow's loader finds the variables by a glob: a --dir under "run [1]/" is
        # read through an alias (files.glob_free).
        for i, arg in enumerate(args):
            if arg == "--dir" and i + 1 < len(args):
                args[i + 1] = stack.enter_context(files.glob_free(args[i + 1]))
            elif arg.startswith("--dir="):
                args[i] = "--dir=" + stack.enter_context(files.glob_free(arg[len("--dir="):]))
        sys.argv = ["saved_model_cli", *args]
        # saved_model_cli reports every mistake in its arguments as an exception from its
        # command (OSError: no SavedModel at --dir; RuntimeError: tag-set or literal;
        # ValueError: signature, input key or shape; AttributeError: no inputs given;
        # tf.errors.OpError: an --inputs file or a run). Its app.run exits with the
        # command's status itself, so only those come back here.
        status = cli.report_errors(saved_model_cli.main, expected=(
            OSError, RuntimeError, ValueError, AttributeError, tf.errors.OpError))
    sys.exit(status)


if __name__ == "__main__":
    main()
