"""Fine-tunes and runs a BertClassifier on sentence or sentence-pair classification data.

    python -m bert_keras.run_classifier \
      --train_file=train.jsonl --eval_file=test.jsonl --predict_file=test.jsonl \
      --vocab_file=vocab.txt --init_checkpoint=/path/to/hf_dir_or_ckpt \
      --do_train --do_eval --do_predict --max_seq_length=128 --output_dir=out/

Input files are TSV/CSV (with a header row) or JSONL; see `data_prep.classification`.
Writes to --output_dir: model.keras, labels.txt, vocab.txt, bert_config.json (training),
train_results.json, eval_results.json (accuracy, macro F1, per-class P/R/F1),
predictions.jsonl (one {"where", "label", "probabilities"} per input row).
"""

from __future__ import annotations

import os

import keras
import numpy as np
from absl import app, flags, logging

from bert_keras import finetune
from bert_keras.tasks import BertClassifier
from data_prep import classification
from data_prep.packing import model_inputs

_SHARED = finetune.SHARED_FLAG_ARGS  # see finetune.py: names shared with other tools

_COMMON = finetune.define_common_flags(max_seq_length=128, learning_rate=5e-5, num_train_epochs=3.0)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Directory the *_file flags are relative to.", **_SHARED)
_TRAIN_FILE = flags.DEFINE_string("train_file", None, "Training data (.tsv/.csv/.jsonl).", **_SHARED)
_EVAL_FILE = flags.DEFINE_string("eval_file", None, "Labelled evaluation data.", **_SHARED)
_PREDICT_FILE = flags.DEFINE_string("predict_file", None, "Data to predict (labels optional).", **_SHARED)
_TEXT_A = flags.DEFINE_string("text_a_column", "text", "Column / JSON key of the (first) text.", **_SHARED)
_TEXT_B = flags.DEFINE_string("text_b_column", None, "Column / JSON key of the second text (pairs).", **_SHARED)
_LABEL = flags.DEFINE_string("label_column", "label", "Column / JSON key of the label.", **_SHARED)
_FORMAT = flags.DEFINE_enum("input_format", None, ["tsv", "csv", "jsonl"],
                            "File format; default: from the file extension.", **_SHARED)
_LABEL_LIST = flags.DEFINE_list("label_list", None, "Labels in id order; default: the sorted "
                                "labels of --train_file (or labels.txt of the model).", **_SHARED)
_LABEL_LIST_FILE = flags.DEFINE_string("label_list_file", None, "Labels in id order, one a line.", **_SHARED)
_DROPOUT = flags.DEFINE_float("classifier_dropout", 0.1, "Dropout on the pooled output.", **_SHARED)


def run(train_file=None, eval_file=None, predict_file=None, data_dir=None,
        columns=("text", None, "label", None), label_list=None, classifier_dropout=0.1,
        **common):
    """Train / eval / predict as the flags say; returns {"train", "eval", "predict"} summaries.

    Args:
      columns: (text_a, text_b, label, input_format) for `classification.read_examples`.
      label_list: labels in id order, or None (from the train file / the model's labels.txt).
      **common: the values of `finetune.define_common_flags` (vocab_file, init_checkpoint, ...).
    """
    c = common
    if not (c["do_train"] or c["do_eval"] or c["do_predict"]):
        raise ValueError("nothing to do: set at least one of --do_train, --do_eval, --do_predict")
    for wanted, name, value in ((c["do_train"], "train_file", train_file),
                                (c["do_eval"], "eval_file", eval_file),
                                (c["do_predict"], "predict_file", predict_file)):
        if wanted and not value:
            raise ValueError(f"--{name} is required with --do_{name.split('_')[0]}")
    outputs = (["model.keras", "labels.txt", "train_results.json"] if c["do_train"] else []) + \
        (["eval_results.json"] if c["do_eval"] else []) + (["predictions.jsonl"] if c["do_predict"] else [])
    finetune.prepare_output_dir(c["output_dir"], outputs, c["overwrite_output"])
    keras.utils.set_random_seed(c["seed"])
    vocab_file = finetune.resolve_vocab(c["vocab_file"], c["init_checkpoint"], c["output_dir"], c["do_train"])
    tokenizer = finetune.make_tokenizer(vocab_file, c["do_lower_case"])
    results = {}

    def read(path, require_label):
        return classification.read_examples(_join(data_dir, path), *columns[:3], fmt=columns[3],
                                            require_label=require_label)

    # Read every input before loading or training anything: a bad row in the eval file
    # should fail in seconds, not after training.
    train_examples = read(train_file, True) if c["do_train"] else None
    eval_examples = read(eval_file, True) if c["do_eval"] else None
    predict_examples = read(predict_file, False) if c["do_predict"] else None
    if c["do_train"] and label_list is None:
        label_list = classification.label_list_from(train_examples)

    model, loaded_from = finetune.task_model(
        BertClassifier, c["init_checkpoint"], c["bert_config_file"], c["output_dir"], c["do_train"],
        lambda encoder: BertClassifier(encoder, len(label_list), dropout=classifier_dropout))
    if label_list is None:
        label_list = finetune.labels_beside(loaded_from)
    if model.num_classes != len(label_list):
        raise ValueError(f"the model has {model.num_classes} classes but the label list has "
                         f"{len(label_list)}: {label_list}")
    finetune.check_vocab(model.encoder, vocab_file)
    finetune.check_seq_length(model.encoder, c["max_seq_length"])
    logging.info("Labels: %s", label_list)

    def features(examples, what):
        if examples is None:
            return None, None
        arrays, stats = classification.convert_examples(examples, tokenizer, label_list, c["max_seq_length"])
        logging.info("%s: %s", what, stats.summary())
        return arrays, stats

    train_data, eval_data, predict_data = (features(train_examples, "train"), features(eval_examples, "eval"),
                                           features(predict_examples, "predict"))

    if c["do_train"]:
        arrays, stats = train_data
        summary = finetune.train(model, model_inputs(arrays), {"logits": arrays["label_ids"]},
                                 c["train_batch_size"], c["num_train_epochs"], c["learning_rate"],
                                 c["warmup_proportion"], seed=c["seed"], jit_compile=c["jit_compile"])
        summary.update(truncated=stats.truncated, label_list=label_list)
        finetune.save_task_model(model, c["output_dir"], label_list, vocab_file, c["overwrite_output"])
        finetune.write_json(os.path.join(c["output_dir"], "train_results.json"), summary)
        results["train"] = summary

    if c["do_eval"]:
        arrays, stats = eval_data
        logits = finetune.predict(model, model_inputs(arrays), c["eval_batch_size"])["logits"]
        metrics = classification.accuracy_and_f1(arrays["label_ids"], logits.argmax(-1), label_list)
        metrics["truncated"] = stats.truncated
        finetune.write_json(os.path.join(c["output_dir"], "eval_results.json"), metrics)
        logging.info("eval: accuracy %.4f  macro F1 %.4f  (%d examples)", metrics["accuracy"],
                     metrics["macro_f1"], metrics["num_examples"])
        results["eval"] = metrics

    if c["do_predict"]:
        arrays, stats = predict_data
        logits = finetune.predict(model, model_inputs(arrays), c["eval_batch_size"])["logits"]
        probs = _softmax(logits)
        records = [{"where": e.where, "label": label_list[int(p.argmax())],
                    "probabilities": {label: round(float(q), 6) for label, q in zip(label_list, p)}}
                   for e, p in zip(predict_examples, probs)]
        finetune.write_jsonl(os.path.join(c["output_dir"], "predictions.jsonl"), records)
        results["predict"] = {"num_examples": len(records), "truncated": stats.truncated}
    return results


def _join(data_dir, path):
    return os.path.join(data_dir, path) if data_dir and not os.path.isabs(path) else path


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def main(argv):
    del argv
    label_list = _LABEL_LIST.value
    if _LABEL_LIST_FILE.value:
        label_list = finetune.read_labels(_LABEL_LIST_FILE.value)
    run(train_file=_TRAIN_FILE.value, eval_file=_EVAL_FILE.value, predict_file=_PREDICT_FILE.value,
        data_dir=_DATA_DIR.value,
        columns=(_TEXT_A.value, _TEXT_B.value, _LABEL.value, _FORMAT.value),
        label_list=label_list, classifier_dropout=_DROPOUT.value,
        **finetune.common_values(_COMMON))


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(main)
