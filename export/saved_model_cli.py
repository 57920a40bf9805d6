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
"""

from __future__ import annotations

import contextlib
import logging
import sys


def main(argv: list[str] | None = None) -> None:
    """Runs saved_model_cli with `argv` (default: this process's arguments)."""
    from data_prep import tf_logging

    tf = tf_logging.import_tensorflow()
    import tensorflow_text  # noqa: F401  (registers the text ops the exports use)
    if tf_logging.log_level() > 0:
        # saved_model_cli loads with TF1's loader, whose deprecation warnings (printed twice,
        # through TensorFlow's handler and absl's) are not for the user of an export. A
        # filter, since saved_model_cli sets the logger's level to INFO itself.
        tf.get_logger().addFilter(lambda record: record.levelno >= logging.ERROR)
    from tensorflow.python.tools import saved_model_cli

    from data_prep import files

    args = list(sys.argv[1:] if argv is None else argv)
    with contextlib.ExitStack() as stack:
        # TensorFlow's loader finds the variables by a glob: a --dir under "run [1]/" is
        # read through an alias (files.glob_free).
        for i, arg in enumerate(args):
            if arg == "--dir" and i + 1 < len(args):
                args[i + 1] = stack.enter_context(files.glob_free(args[i + 1]))
            elif arg.startswith("--dir="):
                args[i] = "--dir=" + stack.enter_context(files.glob_free(arg[len("--dir="):]))
        sys.argv = ["saved_model_cli", *args]
        saved_model_cli.main()


if __name__ == "__main__":
    main()
