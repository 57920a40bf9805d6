"""Per-token features from chosen encoder layers, like Google's extract_features.py.

    python -m bert_keras.extract_features \
      --input_file=input.txt --output_file=features.jsonl \
      --vocab_file=vocab.txt --init_checkpoint=/path/to/checkpoint \
      --layers=-1,-2,-3,-4 --max_seq_length=128 --batch_size=32

Input: one example per line, "text" or "text_a ||| text_b" (Google's format); a line that is
empty after stripping is an error naming the line. Each example is packed as
"[CLS] A [SEP] (B [SEP])"; pairs are truncated fairly (longer side first) and truncations
are counted.

Output, by the extension of --output_file:
  .jsonl  one line per example, Google's layout:
          {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1,
          "values": [...H floats, rounded to 6 decimals]}, ...]}, ...]} for the real tokens.
  .npz    tokens: str [N, S] ("" on padding); input_ids, input_mask, input_type_ids: int32
          [N, S]; layer_<i> (e.g. "layer_-1"): float32 [N, S, H] for every requested layer.
Layer -1 is the last transformer layer, -L the first (the embeddings are not a layer).
"""

from __future__ import annotations

import json
import os

import keras
import numpy as np
from absl import app, flags, logging

from bert_keras import finetune
from data_prep.classification import DataError
from data_prep.packing import pack, pad_features

_SHARED = finetune.SHARED_FLAG_ARGS  # see finetune.py: names shared with other tools

_INPUT_FILE = flags.DEFINE_string("input_file", None, "Text, one example a line ('a ||| b' for pairs).", **_SHARED)
_OUTPUT_FILE = flags.DEFINE_string("output_file", None, "Features: .jsonl or .npz.", **_SHARED)
_VOCAB_FILE = flags.DEFINE_string("vocab_file", None, "WordPiece vocabulary (default: beside the checkpoint).", **_SHARED)
_DO_LOWER_CASE = flags.DEFINE_boolean("do_lower_case", True, "Lower-case input (uncased models).", **_SHARED)
_BERT_CONFIG_FILE = flags.DEFINE_string("bert_config_file", None, "bert_config.json if not beside the checkpoint.", **_SHARED)
_INIT_CHECKPOINT = flags.DEFINE_string("init_checkpoint", None, "Encoder weights (any form finetune accepts).", **_SHARED)
_LAYERS = flags.DEFINE_list("layers", ["-1", "-2", "-3", "-4"], "Encoder layers to output (negative: from the top).", **_SHARED)
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128, "WordPieces per example, specials included.", **_SHARED)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.", **_SHARED)
_OVERWRITE = flags.DEFINE_boolean("overwrite_output", False, "Replace an existing --output_file.", **_SHARED)


def read_input(path: str) -> list[tuple[str, str | None]]:
    """Lines "text" or "text_a ||| text_b" -> [(a, b or None)].

    Raises:
      DataError: an empty line or an empty side of "|||" (file:line named).
    """
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            parts = line.split(" ||| ") if " ||| " in line else [line]
            if len(parts) > 2:
                raise DataError(f"{path}:{number}: expected 'text' or 'text_a ||| text_b', "
                                f"found {len(parts) - 1} separators")
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
        raise ValueError(f"layers {bad} do not exist: the encoder has {n} layers "
                         f"(valid: {-n}..{n - 1})")
    outputs = encoder(encoder.input)["encoder_outputs"]
    return keras.Model(encoder.input, {f"layer_{i}": outputs[i] for i in layers})


def extract(encoder, tokenizer, examples, layers, max_seq_length, batch_size):
    """Runs the encoder over examples.

    Returns:
      (tokens, arrays, num_truncated): tokens a list of N token lists (real tokens only);
      arrays the npz layout of the module docstring.
    """
    finetune.check_seq_length(encoder, max_seq_length)
    a = tokenizer.tokenize([e[0] for e in examples])
    pairs = [i for i, e in enumerate(examples) if e[1] is not None]
    b = dict(zip(pairs, tokenizer.tokenize([examples[i][1] for i in pairs])))
    packed = [pack(a[i], b.get(i), max_seq_length) for i in range(len(examples))]
    arrays = pad_features([tokenizer.convert_tokens_to_ids(p.tokens) for p in packed],
                          [p.segment_ids for p in packed], max_seq_length)
    x = {"input_word_ids": arrays["input_ids"], "input_mask": arrays["input_mask"],
         "input_type_ids": arrays["segment_ids"]}
    outputs = finetune.predict(feature_model(encoder, layers), x, batch_size)
    tokens = [p.tokens for p in packed]
    token_array = np.full((len(examples), max_seq_length), "", dtype=f"<U{max(len(t) for p in tokens for t in p)}")
    for i, row in enumerate(tokens):
        token_array[i, : len(row)] = row
    result = {"tokens": token_array, **x}
    result.update({k: v.astype(np.float32) for k, v in outputs.items()})
    return tokens, result, sum(p.truncated for p in packed)


def write_features(path: str, tokens, arrays, layers, overwrite: bool = False) -> str:
    """Writes JSONL (Google's layout) or .npz, under a temporary name; never overwrites silently."""
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(f"{path} exists; refusing to overwrite (pass --overwrite_output)")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".npz"):
        tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp-{os.getpid()}.npz")
        try:
            np.savez(tmp, **arrays)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return path
    if not path.endswith((".jsonl", ".json")):
        raise ValueError(f"--output_file must end in .jsonl or .npz. Received: {path}")
    lines = []
    for i, row in enumerate(tokens):
        features = [{"token": token,
                     "layers": [{"index": layer,
                                 "values": [round(float(v), 6) for v in arrays[f"layer_{layer}"][i, t]]}
                                for layer in layers]}
                    for t, token in enumerate(row)]
        lines.append(json.dumps({"linex_index": i, "features": features}) + "\n")
    return finetune.write_text(path, "".join(lines))


def run(input_file, output_file, init_checkpoint=None, bert_config_file=None, vocab_file=None,
        do_lower_case=True, layers=(-1, -2, -3, -4), max_seq_length=128, batch_size=32,
        overwrite_output=False):
    """Reads, extracts and writes; returns {"examples", "truncated", "layers", "output_file"}."""
    layers = [int(i) for i in layers]
    if os.path.lexists(output_file) and not overwrite_output:
        raise FileExistsError(f"{output_file} exists; refusing to overwrite (pass --overwrite_output)")
    encoder = finetune.load_encoder_or_task(init_checkpoint, bert_config_file)  # task models: their encoder
    vocab_file = finetune.resolve_vocab(vocab_file, init_checkpoint, "", True)
    finetune.check_vocab(encoder, vocab_file)
    tokenizer = finetune.make_tokenizer(vocab_file, do_lower_case)
    examples = read_input(input_file)
    tokens, arrays, truncated = extract(encoder, tokenizer, examples, layers, max_seq_length, batch_size)
    if truncated:
        logging.warning("%d of %d examples were truncated to max_seq_length=%d", truncated,
                        len(examples), max_seq_length)
    write_features(output_file, tokens, arrays, layers, overwrite_output)
    logging.info("wrote features of %d examples (layers %s) to %s", len(examples), layers, output_file)
    return {"examples": len(examples), "truncated": truncated, "layers": layers, "output_file": output_file}


def main(argv):
    del argv
    run(_INPUT_FILE.value, _OUTPUT_FILE.value, _INIT_CHECKPOINT.value, _BERT_CONFIG_FILE.value,
        _VOCAB_FILE.value, _DO_LOWER_CASE.value, _LAYERS.value, _MAX_SEQ_LENGTH.value,
        _BATCH_SIZE.value, _OVERWRITE.value)


if __name__ == "__main__":
    flags.mark_flags_as_required(['input_file', 'output_file'])
    app.run(main)
