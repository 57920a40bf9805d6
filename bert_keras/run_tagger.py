"""Fine-tunes and runs a BertTagger on CoNLL-style token tagging data (NER, POS).

    python -m bert_keras.run_tagger \
      --train_file=train.conll --eval_file=test.conll --predict_file=test.conll \
      --vocab_file=vocab.txt --init_checkpoint=/path/to/checkpoint \
      --do_train --do_eval --do_predict --max_seq_length=128 --output_dir=out/

Input: one "word ... tag" line per token, blank line between sentences (see
`data_prep.tagging`). Each word's tag is learned and predicted on its first WordPiece.
Writes to --output_dir: model.keras, labels.txt, vocab.txt, bert_config.json (training),
train_results.json, eval_results.json (token accuracy and seqeval-style entity
precision/recall/F1), predictions.conll ("word predicted_tag" lines).
"""

from __future__ import annotations

import os

import keras
from absl import app, flags, logging

from bert_keras import finetune
from bert_keras.tasks import BertTagger
from data_prep import tagging
from data_prep.packing import model_inputs

_SHARED = finetune.SHARED_FLAG_ARGS  # see finetune.py: names shared with other tools

_COMMON = finetune.define_common_flags(max_seq_length=128, learning_rate=5e-5, num_train_epochs=3.0)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Directory the *_file flags are relative to.", **_SHARED)
_TRAIN_FILE = flags.DEFINE_string("train_file", None, "Training data (CoNLL format).", **_SHARED)
_EVAL_FILE = flags.DEFINE_string("eval_file", None, "Tagged evaluation data.", **_SHARED)
_PREDICT_FILE = flags.DEFINE_string("predict_file", None, "Data to tag (tag column optional).", **_SHARED)
_TOKEN_COLUMN = flags.DEFINE_integer("token_column", 0, "Column of the word.", **_SHARED)
_TAG_COLUMN = flags.DEFINE_integer("tag_column", -1, "Column of the tag (negative: from the end).", **_SHARED)
_LABEL_LIST_FILE = flags.DEFINE_string("label_list_file", None, "Tags in id order, one a line; "
                                       "default: the sorted tags of --train_file.", **_SHARED)
_DROPOUT = flags.DEFINE_float("tagger_dropout", 0.1, "Dropout on the sequence output.", **_SHARED)


def _join(data_dir, path):
    return os.path.join(data_dir, path) if data_dir and not os.path.isabs(path) else path


def run(train_file=None, eval_file=None, predict_file=None, data_dir=None, token_column=0,
        tag_column=-1, label_list=None, tagger_dropout=0.1, **common):
    """Train / eval / predict; returns {"train", "eval", "predict"} summaries.

    Args:
      label_list: tags in id order, or None (from the train file / the model's labels.txt).
      **common: the values of `finetune.define_common_flags`.
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
        (["eval_results.json"] if c["do_eval"] else []) + (["predictions.conll"] if c["do_predict"] else [])
    finetune.prepare_output_dir(c["output_dir"], outputs, c["overwrite_output"])
    keras.utils.set_random_seed(c["seed"])
    vocab_file = finetune.resolve_vocab(c["vocab_file"], c["init_checkpoint"], c["output_dir"], c["do_train"])
    tokenizer = finetune.make_tokenizer(vocab_file, c["do_lower_case"])
    results = {}

    def read(path, has_tags=True):
        return tagging.read_conll(_join(data_dir, path), token_column, tag_column, has_tags=has_tags)

    # Read and convert every input before training: a bad line fails in seconds.
    train_sentences = read(train_file) if c["do_train"] else None
    eval_sentences = read(eval_file) if c["do_eval"] else None
    predict_sentences = read(predict_file, has_tags=False) if c["do_predict"] else None
    if c["do_train"] and label_list is None:
        label_list = tagging.label_list_from(train_sentences)

    model, loaded_from = finetune.task_model(
        BertTagger, c["init_checkpoint"], c["bert_config_file"], c["output_dir"], c["do_train"],
        lambda encoder: BertTagger(encoder, len(label_list), dropout=tagger_dropout))
    if label_list is None:
        label_list = finetune.labels_beside(loaded_from)
    if model.num_classes != len(label_list):
        raise ValueError(f"the model has {model.num_classes} tags but the label list has "
                         f"{len(label_list)}")
    finetune.check_vocab(model.encoder, vocab_file)
    finetune.check_seq_length(model.encoder, c["max_seq_length"])
    logging.info("%d tags: %s", len(label_list), " ".join(label_list))

    def features(sentences, what, labels):
        if sentences is None:
            return None
        arrays, positions, stats = tagging.convert_sentences(sentences, tokenizer, labels,
                                                             c["max_seq_length"])
        logging.info("%s: %s", what, stats.summary())
        return arrays, positions, stats

    train_data = features(train_sentences, "train", label_list)
    eval_data = features(eval_sentences, "eval", label_list)
    predict_data = features(predict_sentences, "predict", None)

    if c["do_train"]:
        arrays, _, stats = train_data
        summary = finetune.train(model, model_inputs(arrays), {"logits": arrays["label_ids"]},
                                 c["train_batch_size"], c["num_train_epochs"], c["learning_rate"],
                                 c["warmup_proportion"], seed=c["seed"], jit_compile=c["jit_compile"])
        summary.update(truncated_sentences=stats.truncated_sentences,
                       truncated_words=stats.truncated_words, label_list=label_list)
        finetune.save_task_model(model, c["output_dir"], label_list, vocab_file, c["overwrite_output"])
        finetune.write_json(os.path.join(c["output_dir"], "train_results.json"), summary)
        results["train"] = summary

    def tag(data):
        arrays, positions, _ = data
        logits = finetune.predict(model, model_inputs(arrays), c["eval_batch_size"])["logits"]
        return tagging.predictions_to_tags(logits.argmax(-1), positions, label_list)

    if c["do_eval"]:
        predicted = tag(eval_data)
        stats = eval_data[2]
        gold = [list(s.tags) for s in eval_sentences]
        metrics = {"token_accuracy": tagging.token_accuracy(gold, predicted),
                   "num_sentences": len(eval_sentences), "num_words": stats.words,
                   "truncated_sentences": stats.truncated_sentences,
                   # Words cut off by max_seq_length count as wrong (tagged "O").
                   "truncated_words": stats.truncated_words}
        if any(t[:2] in ("B-", "I-", "E-", "S-") for s in gold for t in s):
            metrics["entity"] = tagging.entity_f1(gold, predicted)
        finetune.write_json(os.path.join(c["output_dir"], "eval_results.json"), metrics)
        logging.info("eval: token accuracy %.4f%s (%d words)", metrics["token_accuracy"],
                     f", entity F1 {metrics['entity']['f1']:.4f}" if "entity" in metrics else "",
                     stats.words)
        results["eval"] = metrics

    if c["do_predict"]:
        predicted = tag(predict_data)
        text = "\n".join("".join(f"{w} {t}\n" for w, t in zip(s.words, tags))
                         for s, tags in zip(predict_sentences, predicted))
        finetune.write_text(os.path.join(c["output_dir"], "predictions.conll"), text)
        results["predict"] = {"num_sentences": len(predict_sentences),
                              "truncated_words": predict_data[2].truncated_words}
    return results


def main(argv):
    del argv
    label_list = finetune.read_labels(_LABEL_LIST_FILE.value) if _LABEL_LIST_FILE.value else None
    run(train_file=_TRAIN_FILE.value, eval_file=_EVAL_FILE.value, predict_file=_PREDICT_FILE.value,
        data_dir=_DATA_DIR.value, token_column=_TOKEN_COLUMN.value, tag_column=_TAG_COLUMN.value,
        label_list=label_list, tagger_dropout=_DROPOUT.value, **finetune.common_values(_COMMON))


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(main)
