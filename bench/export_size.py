"""Export size against parameter bytes, BERT-base shape (issue 8 goal: at most 1.05x).

    .venv/bin/python bench/export_size.py [--preset=base]

Exports a randomly initialised encoder with export_encoder, without and with the mlm
endpoint, and prints the SavedModel's variables/ bytes over float32 parameter bytes.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_keras import BertEncoder, BertPretrainer  # noqa: E402
from export.export_encoder import export_encoder  # noqa: E402
from export.saved_model_writer import saved_model_size  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base", help="BertConfig preset (tiny, ..., base)")
    args = parser.parse_args()
    encoder = BertEncoder.from_preset(args.preset)
    pretrainer = BertPretrainer(encoder)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab.txt")
        with open(vocab, "w") as f:
            f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                              [f"w{i}" for i in range(encoder.vocab_size - 5)]) + "\n")
        for name, model, kwargs in (("encoder", encoder, {}),
                                    ("encoder+mlm", pretrainer, {"pretrainer": pretrainer})):
            path = export_encoder(encoder, os.path.join(tmp, name), vocab, **kwargs)
            size = saved_model_size(path)
            params = model.count_params() * 4
            print(f"{args.preset} {name:<12} params {params / 1e6:8.1f} MB  variables/ "
                  f"{size / 1e6:8.1f} MB  ratio {size / params:.4f}")


if __name__ == "__main__":
    main()
