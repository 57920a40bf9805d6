r"""Per-token features from chosen encoder layers, like Google's extract_features.py.

    python -m bert_keras.extract_features \
      --input_file=input.txt --output_file=features.jsonl \
      --vocab_file=vocab.txt --init_checkpoint=/path/to/checkpoint \
      --layers=-1,-2,-3,-4 --max_seq_length=128 --batch_size=32

Input: one example per line, "text" or "text_a ||| text_b" (Google's format; lines end at
"\n" only, as Google reads them); a line that is empty after stripping is an error naming
the line. Each example is packed as
"[CLS] A [SEP] (B [SEP])"; pairs are truncated fairly (longer side first) and truncations
are counted.

Output, by the extension of --output_file:
  .jsonl  one line per example, Google's layout, written as the examples run (memory does
          not grow with the input; .json is written the same way):
          {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1,
          "values": [...H floats, rounded to 6 decimals]}, ...]}, ...]} for the real tokens.
  .npz    tokens: str [N, S] ("" on padding); input_word_ids, input_mask, input_type_ids:
          int32 [N, S]; layer_<i> (e.g. "layer_-1"): float32 [N, S, H] for every requested
          layer (held in memory until written: N x S x H x 4 bytes a layer).
Layer -1 is the last transformer layer, -L the first (the embeddings are not a layer).
The tokenizer settings come with the checkpoint (tokenizer_config.json beside its vocabulary);
--do_lower_case / --strip_accents / --tokenize_chinese_chars override them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os

import keras
import numpy as np
from absl import app, logging

from bert_keras import backends, model_loading
from bert_keras.finetuning import loop
from bert_keras.finetuning import runner
from bert_keras.finetuning.runner import FinetuneError, expected_errors
from data_prep import cli, files, schema, tokenizer_config
from data_prep.classification import DataError
from data_prep.packing import least_length, pack, pad_features
from data_prep.tokenization import load_tokenizer


@dataclasses.dataclass(frozen=True)
class ExtractOptions:
    input_file: str | None = cli.option(
        None, "Text, one example a line ('a ||| b' for pairs).", required=True)
    output_file: str | None = cli.option(None, "Features: .jsonl or .npz.", required=True)
    init_checkpoint: str | None = cli.option(
        None, "Encoder weights: any form run_classifier's --init_checkpoint accepts.",
        required=True)
    bert_config_file: str | None = cli.option(
        None, "bert_config.json if not beside the checkpoint.")
    vocab_file: str | None = cli.option(
        None, "WordPiece vocabulary (default: the one saved with the checkpoint).")
    layers: list = cli.option(["-1", "-2", "-3", "-4"],
                              "Encoder layers to output (negative: from the top).")
    max_seq_length: int = cli.option(128, "WordPieces per example, specials included.")
    batch_size: int = cli.option(32, "Examples per forward pass.")
    overwrite_output: bool = cli.option(False, "Replace an existing --output_file.")
    # Tokenizer settings: None = as saved with the checkpoint (flags: tokenizer_config).
    do_lower_case: bool | None = None
    strip_accents: object = None
    tokenize_chinese_chars: bool | None = None


_FLAGS = cli.define_flags(ExtractOptions)
_TOKENIZER_FLAGS = tokenizer_config.define_flags()
# Google's extract_features.py flags that name no option here (its commands run as written).
_GOOGLE_FLAGS = runner.define_googles_flags(("use_tpu", "master", "num_tpu_cores",
                                             "use_one_hot_embeddings"))


def read_input(path: str) -> list[tuple[str, str | None]]:
    """Lines "text" or "text_a ||| text_b" -> [(a, b or None)].

    Lines are read as Google's reader (tf.io.gfile's readline) reads them: they end at "\\n"
    only and every "\\r" is dropped ("\\r\\n" ends a line as "\\n" does; "a\\rb" is "ab", not a
    new example), so the i-th output record is the i-th input line. A file whose lines end
    in a lone "\\r" (one line to Google's reader) is refused. As Google's pattern
    `^(.*) \|\|\| (.*)$` splits it, text_a is what comes before the last " ||| "
    ("a ||| ||| b": "a |||" and "b").

    Raises:
      DataError: an unreadable or non-UTF-8 file, lines ending in a lone "\\r", an empty
        line, an empty side of "|||", or more than one separator (file:line named).
    """
    examples = []
    try:
        # Read once, then checked: a pipe (--input_file=<(...), /dev/stdin) gives its bytes
        # to one read only, and a check that read it first left "no examples".
        with files.open_input(path, "rb") as f:
            data = f.read()
        error = files.first_text_error(io.BytesIO(data), path)
        if error is not None:  # NUL, UTF-16, cp949: the line and how to convert it
            raise error
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    lone_cr = files.lone_cr_message(data, path)
    if lone_cr:
        raise DataError(lone_cr)
    lines = data.decode("utf-8-sig").replace("\r", "").split("\n")
    if lines[-1] == "":
        lines.pop()  # the last line's "\n"
    for number, line in enumerate(lines, 1):
        separators = line.count(" ||| ")
        if separators > 1:
            raise DataError(f"{path}:{number}: expected 'text' or 'text_a ||| text_b', "
                            f"found {separators} separators")
        parts = line.rsplit(" ||| ", 1) if separators else [line]
        if any(not p.strip() for p in parts):
            raise DataError(f"{path}:{number}: empty text")
        examples.append((parts[0].strip(), parts[1].strip() if len(parts) == 2 else None))
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def feature_model(encoder, layers: list[int]) -> keras.Model:
    """A functional model over the encoder's inputs returning {"layer_<i>": [B, S, H]}."""
    n = encoder.num_layers
    bad = [i for i in layers if not -n <= i < n]
    if bad:
        raise FinetuneError(f"--layers {bad} do not exist: the encoder has {n} layers "
                            f"(valid: {-n}..{n - 1})")
    outputs = encoder(encoder.input)["encoder_outputs"]
    return keras.Model(encoder.input, {f"layer_{i}": outputs[i] for i in layers})


# Examples run and written at a time in the JSONL output: its text is ~25 bytes a value,
# so the whole file in memory (4 layers of BERT-base at 128: ~4 MB an example) would not
# fit for a corpus; Google's tool writes each example as it is predicted.
JSONL_CHUNK = 256


def _pack_all(tokenizer, examples, max_seq_length):
    """Each example packed as "[CLS] A [SEP] (B [SEP])". A text_b with no WordPiece (a
    zero-width space, a control character) makes a single text, as Google's
    `if tokens_b:` does; before, it packed "[CLS] A [SEP] [SEP]"."""
    a = tokenizer.tokenize([e[0] for e in examples])
    pairs = [i for i, e in enumerate(examples) if e[1] is not None]
    b = dict(zip(pairs, tokenizer.tokenize([examples[i][1] for i in pairs])))
    return [pack(a[i], b.get(i) or None, max_seq_length) for i in range(len(examples))]


def _check_inputs(encoder, examples, max_seq_length) -> None:
    """Refuses a length the encoder or a pair cannot take, and pairs for a model with one
    segment embedding, before the model runs."""
    if max_seq_length > encoder.max_sequence_length:
        raise FinetuneError(f"--max_seq_length={max_seq_length} exceeds the encoder's position "
                            f"table ({encoder.max_sequence_length} positions)")
    pair = next((i for i, e in enumerate(examples) if e[1] is not None), None)
    refusal = pair is not None and encoder.pair_refusal(
        f"--input_file: line {pair + 1} is a sentence pair (' ||| ')")
    if refusal:
        raise FinetuneError(refusal)
    least = least_length(pair is not None)
    if max_seq_length < least:
        raise FinetuneError(f"--max_seq_length={max_seq_length} is too short: "
                            f"{'a pair' if least == 4 else 'a text'} needs at least {least} "
                            "positions ([CLS], [SEP] and a token of each text)")


def _run_packed(model, tokenizer, packed, max_seq_length, batch_size, pad_last_batch=None):
    """(tokens, the npz layout) of packed examples run through the feature model."""
    arrays = pad_features([tokenizer.convert_tokens_to_ids(p.tokens) for p in packed],
                          [p.segment_ids for p in packed], max_seq_length)
    x = schema.model_inputs(arrays)
    outputs, _ = loop.predict(model, x, batch_size, pad_last_batch)
    tokens = [p.tokens for p in packed]
    width = max(len(t) for p in tokens for t in p)
    token_array = np.full((len(packed), max_seq_length), "", dtype=f"<U{width}")
    for i, row in enumerate(tokens):
        token_array[i, : len(row)] = row
    result = {"tokens": token_array, **x}
    result.update({k: v.astype(np.float32) for k, v in outputs.items()})
    return tokens, result


def extract(encoder, tokenizer, examples, layers, max_seq_length, batch_size):
    """Runs the encoder over examples, all in memory (the .npz output).

    Returns:
      (tokens, arrays, num_truncated): tokens a list of N token lists (real tokens only);
      arrays the npz layout of the module docstring.
    """
    _check_inputs(encoder, examples, max_seq_length)
    model = feature_model(encoder, layers)
    packed = _pack_all(tokenizer, examples, max_seq_length)
    tokens, arrays = _run_packed(model, tokenizer, packed, max_seq_length, batch_size)
    return tokens, arrays, sum(p.truncated for p in packed)


def _check_output_name(path: str) -> None:
    if not path.endswith((".jsonl", ".json", ".npz")):
        raise FinetuneError(f"--output_file must end in .jsonl (or .json, written as JSON "
                            f"lines) or .npz; received {path}")
    if os.path.isdir(path):
        raise FinetuneError(f"--output_file {path} is a directory; name a file in it")


def jsonl_lines(tokens, arrays, layers, first_index: int = 0):
    """Google's JSONL layout, one line per example (numbered from `first_index`)."""
    for i, row in enumerate(tokens):
        features = [{"token": token,
                     "layers": [{"index": layer,
                                 "values": [round(float(v), 6) for v in arrays[f"layer_{layer}"][i, t]]}
                                for layer in layers]}
                    for t, token in enumerate(row)]
        yield json.dumps({"linex_index": first_index + i, "features": features}) + "\n"


def write_npz(path: str, arrays, overwrite: bool = False) -> str:
    """Writes the .npz layout under a temporary name; never overwrites silently."""
    with files.atomic_output(path, overwrite=overwrite,
                             hint="pass --overwrite_output to replace it") as tmp:
        with open(tmp, "wb") as f:  # a file object: np.savez adds no suffix
            np.savez(f, **arrays)
    return path


def extract_to_jsonl(path: str, encoder, tokenizer, examples, layers, max_seq_length,
                     batch_size, overwrite: bool = False, chunk: int = JSONL_CHUNK) -> int:
    """Runs and writes `chunk` examples at a time (memory bounded by the chunk, not the
    input), under a temporary name renamed when complete; returns the truncated count."""
    _check_inputs(encoder, examples, max_seq_length)
    model = feature_model(encoder, layers)
    packed = _pack_all(tokenizer, examples, max_seq_length)
    chunk = max(chunk, batch_size) // batch_size * batch_size  # whole batches
    # Every row in a batch of one shape, as `extract` computes them: the same values.
    pad = len(packed) > batch_size
    with files.atomic_output(path, overwrite=overwrite,
                             hint="pass --overwrite_output to replace it") as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for start in range(0, len(packed), chunk):
                tokens, arrays = _run_packed(model, tokenizer, packed[start:start + chunk],
                                             max_seq_length, batch_size, pad)
                f.writelines(jsonl_lines(tokens, arrays, layers, start))
                if len(packed) > chunk:
                    logging.info("features of %d of %d examples written",
                                 min(start + chunk, len(packed)), len(packed))
    return sum(p.truncated for p in packed)


def _parse_layers(layers) -> list[int]:
    try:
        parsed = [int(i) for i in layers]
    except ValueError:
        raise FinetuneError(f"--layers must be integers (e.g. -1,-2); received {list(layers)}") from None
    if not parsed:
        raise FinetuneError("--layers is empty: name at least one layer (e.g. -1,-2,-3,-4)")
    return parsed


def run(input_file, output_file, init_checkpoint=None, bert_config_file=None, vocab_file=None,
        layers=(-1, -2, -3, -4), max_seq_length=128, batch_size=32, overwrite_output=False,
        do_lower_case=None, strip_accents=None, tokenize_chinese_chars=None):
    """Reads, extracts and writes; returns {"examples", "truncated", "layers", "output_file"}."""
    backends.check_backend()
    layers = _parse_layers(layers)
    _check_output_name(output_file)  # before the model runs over the whole input
    if batch_size < 1:
        raise FinetuneError(f"--batch_size must be >= 1; received {batch_size}")
    if not overwrite_output:
        files.refuse_existing([output_file], "refusing to overwrite (pass --overwrite_output)")
    files.refuse_an_input(output_file, "--output_file", [input_file], "--input_file")
    files.check_writable([output_file])  # before the model runs, not when it is written
    examples = read_input(input_file)
    ckpt = model_loading.load_checkpoint(init_checkpoint, bert_config_file)  # any form
    encoder = ckpt.encoder
    vocab_file = ckpt.vocabulary(vocab_file)
    overrides = {k: v for k, v in (("do_lower_case", do_lower_case),
                                   ("strip_accents", tokenizer_config.parse_strip_accents(strip_accents)),
                                   ("tokenize_chinese_chars", tokenize_chinese_chars))
                 if v is not None}
    saved = tokenizer_config.read_for_vocab(vocab_file) or ckpt.saved_tokenizer
    settings, source = tokenizer_config.resolve(vocab_file, overrides, saved,
                                                warn=logging.warning)
    logging.info("Tokenizer settings: %s (%s)", settings.describe(), source or "defaults and flags")
    tokenizer = load_tokenizer(vocab_file, settings)
    if output_file.endswith(".npz"):
        _, arrays, truncated = extract(encoder, tokenizer, examples, layers, max_seq_length,
                                       batch_size)
        write_npz(output_file, arrays, overwrite_output)
    else:
        truncated = extract_to_jsonl(output_file, encoder, tokenizer, examples, layers,
                                     max_seq_length, batch_size, overwrite_output)
    if truncated:
        logging.warning("%d of %d examples were truncated to max_seq_length=%d", truncated,
                        len(examples), max_seq_length)
    logging.info("wrote features of %d examples (layers %s) to %s", len(examples), layers, output_file)
    return {"examples": len(examples), "truncated": truncated, "layers": layers,
            "output_file": output_file}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = cli.values_from_flags(_FLAGS)
    values.update(tokenizer_config.overrides_from_flags(_TOKENIZER_FLAGS))

    def body() -> int:
        run(**runner.with_googles_flags(values, _GOOGLE_FLAGS, _FLAGS, "extract_features"))
        return 0

    return cli.report_errors(body, expected_errors(), "extract_features")


if __name__ == "__main__":
    cli.mark_required(cli.required_flags(ExtractOptions))
    cli.run(main)
