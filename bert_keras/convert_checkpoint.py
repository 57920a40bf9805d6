r"""Converts BERT weights between Google TF1 checkpoints, Hugging Face and Keras files.

Formats (see bert_keras/checkpoints.py):
  google  TF1 checkpoint prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt, with
          bert_config.json beside it (or --bert_config_file).
  hf      transformers save_pretrained directory (config.json + model.safetensors).
  keras   a .keras file (model.save: architecture, config and weights in one file).

    python -m bert_keras.convert_checkpoint --from=google --to=hf \
        --input=uncased_L-12_H-768_A-12/bert_model.ckpt --output=/tmp/bert_hf

--model=auto keeps the pretraining heads (MLM + NSP) when the input has them; --model=encoder
drops them; --model=pretrainer requires them. Existing output is never overwritten.
"""

import sys

from absl import app, flags

from bert_keras import checkpoints

# Google-style flag names (input, output, bert_config_file) recur across our tools;
# allow_override lets tests import several entry points into one process.
_SHARED = {"allow_override": True}

_FROM = flags.DEFINE_enum("from", None, checkpoints.FORMATS, "Format of --input.", **_SHARED)
_TO = flags.DEFINE_enum("to", None, checkpoints.FORMATS, "Format of --output.", **_SHARED)
_INPUT = flags.DEFINE_string(
    "input", None, "google: checkpoint prefix; hf: save_pretrained directory; keras: .keras file.",
    **_SHARED,
)
_OUTPUT = flags.DEFINE_string(
    "output", None, "Same forms as --input, in the --to format; must not exist.", **_SHARED
)
_MODEL = flags.DEFINE_enum(
    "model", "auto", checkpoints.MODEL_KINDS,
    "encoder: drop pretraining heads; pretrainer: require them; auto: keep them if present.",
    **_SHARED,
)
_BERT_CONFIG_FILE = flags.DEFINE_string(
    "bert_config_file", None,
    "--from=google only: bert_config.json, if it is not beside the checkpoint.",
    **_SHARED,
)


def convert(from_format: str, to_format: str, input_path: str, output_path: str,
            model: str = "auto", config_file: str | None = None):
    """Loads weights in one format and writes them in another.

    Args:
      from_format, to_format: "google", "hf" or "keras".
      input_path, output_path: see the module docstring.
      model: "auto", "encoder" or "pretrainer".
      config_file: bert_config.json for a Google input not beside its checkpoint.

    Returns:
      (written path, the loaded BertEncoder or BertPretrainer).

    Raises:
      FileExistsError: the output exists (checked before anything is loaded).
      FileNotFoundError, checkpoints.WeightLoadError, ValueError: bad input.
    """
    checkpoints.check_output_free(to_format, output_path)
    loaded = checkpoints.load_model(from_format, input_path, model=model, config_file=config_file)
    return checkpoints.save_model(loaded, to_format, output_path), loaded


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    if _BERT_CONFIG_FILE.value and _FROM.value != "google":
        raise app.UsageError("--bert_config_file applies only to --from=google")
    try:
        written, model = convert(_FROM.value, _TO.value, _INPUT.value, _OUTPUT.value,
                                 _MODEL.value, _BERT_CONFIG_FILE.value)
    except (FileNotFoundError, FileExistsError, ValueError, TypeError) as e:
        # WeightLoadError is a ValueError; its message names the file and the tensors.
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {type(model).__name__} ({len(model.weights)} weights, "
          f"{model.count_params():,} parameters) as {_TO.value}: {written}")
    return 0


if __name__ == "__main__":
    flags.mark_flags_as_required(["from", "to", "input", "output"])
    from data_prep import cli

    cli.run(main)
