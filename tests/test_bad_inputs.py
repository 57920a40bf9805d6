"""Every command-line tool, driven with bad inputs and flags as a user would (issues 23, 30).

Each case asserts: a non-zero exit; exactly one stderr line starting "error:", naming the
flag or file at fault; no Python traceback; and the output location exactly as before the
run (nothing created, nothing removed, nothing overwritten). Cases run the tools' `main`
in-process (tests/cli_harness.py) on one small fixture set built once; a few run as real
subprocesses to prove the same end to end.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cli_harness import run_tool, tree
from conftest import TESTDATA

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(num_layers=2, hidden_size=16, num_heads=2, intermediate_size=24,
             max_sequence_length=48)


def _write(path, data, mode="w"):
    with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        f.write(data)
    return path


@pytest.fixture(scope="session")
def fx(tmp_path_factory):
    """The shared fixture directory (never written by a case)."""
    return build_fixtures(str(tmp_path_factory.mktemp("fixtures")))


def build_fixtures(d: str) -> str:
    """Writes the fixture set into directory `d` (a few seconds); returns `d`."""
    import keras

    from bert_keras import model_loading
    from bert_keras.encoder import BertEncoder
    from pretraining_data import make_instances, write_records

    p = lambda *names: os.path.join(d, *names)  # noqa: E731
    vocab = shutil.copy(os.path.join(TESTDATA, "ft_vocab.txt"), p("vocab.txt"))
    vocab_size = sum(1 for _ in open(vocab, encoding="utf-8"))
    keras.utils.set_random_seed(3)
    encoder = BertEncoder(vocab_size=vocab_size, **SMALL)
    model_loading.save_encoder_dir(encoder, p("encoder"), vocab)
    encoder.save(p("encoder.keras"))
    config = json.load(open(p("encoder", "bert_config.json")))
    _write(p("bert_config.json"), json.dumps(config))
    _write(p("config_no_heads.json"),
           json.dumps({k: v for k, v in config.items() if k != "num_attention_heads"}))
    _write(p("config_bad.json"), "{not json")
    # Text inputs.
    _write(p("text.txt"), "the man went to the store .\nhe bought milk .\n\njohn was born .\n"
           "the city is big .\n")
    _write(p("lines.txt"), "the man went to the store .\nhe bought milk ||| john was born .\n")
    _write(p("binary.bin"), bytes(range(256)) * 8, "wb")
    _write(p("latin1.txt"), "the store\ncaf\u00e9 th\u00e9\n".encode("latin-1"), "wb")
    _write(p("empty.txt"), "")
    _write(p("no_specials_vocab.txt"), "the\nman\nwent\n")
    # gzip inputs cut short: within the first 64 KB (the up-front sniff reads it) and after.
    import gzip

    small = gzip.compress(open(p("text.txt"), "rb").read() * 50)
    _write(p("cut_early.txt.gz"), small[: len(small) // 2], "wb")
    rng = np.random.default_rng(0)
    words = [" ".join(f"w{int(i)}" for i in rng.integers(0, 5000, 12)) for _ in range(20_000)]
    big = gzip.compress(("\n".join(words) + "\n").encode())
    _write(p("cut_late.txt.gz"), big[: int(len(big) * 0.7)], "wb")
    _write(p("garbage.keras"), b"not a zip file at all" * 10, "wb")
    _write(p("garbage.weights.h5"), b"\x89HDF\r\n garbage" * 10, "wb")
    # Classification.
    rows = [{"text": "the man went to the store", "label": "a"},
            {"text": "john was born in the city", "label": "b"}] * 4
    _write(p("cls.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    _write(p("rated.jsonl"), "".join(json.dumps({"text": r["text"], "label": i / 4})
                                     + "\n" for i, r in enumerate(rows)))
    _write(p("cls_one_class.jsonl"), "".join(json.dumps({"text": r["text"], "label": "a"}) + "\n"
                                             for r in rows))
    _write(p("cls_bad_json.jsonl"), json.dumps(rows[0]) + "\n{\"text\": \"the man\"\n")
    _write(p("cls_no_label.jsonl"), json.dumps({"text": "the man"}) + "\n")
    _write(p("cls_empty_text.jsonl"), json.dumps({"text": "", "label": "a"}) + "\n")
    _write(p("cls_latin1.jsonl"), (json.dumps(rows[0]) + "\n").encode() +
           b'{"text": "caf\xe9", "label": "b"}\n', "wb")
    _write(p("cls.tsv"), "")
    _write(p("cls_bad.tsv"), "text\tlabel\nthe man\ta\textra\n")
    # Tagging (CoNLL).
    _write(p("tags.txt"), "the O\nman B-PER\n\njohn B-PER\nwent O\n")
    # KLUE-NER's character format with a two-character "character" on line 3.
    _write(p("klue_bad.tsv"), "## g1\t<가나:PS>\n가\tB-PS\n나다\tI-PS\n\n")
    _write(p("tags_bad.txt"), "the O\nman\n")
    # SQuAD.
    squad = json.load(open(os.path.join(TESTDATA, "ft_squad_v1.json")))
    _write(p("squad.json"), json.dumps(squad))
    bad = json.loads(json.dumps(squad))
    bad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 10_000
    _write(p("squad_outside.json"), json.dumps(bad))
    _write(p("squad_not_squad.json"), json.dumps({"version": "1.1"}))
    _write(p("squad_truncated.json"), json.dumps(squad)[:100])
    # Pretraining shards.
    inst = make_instances(8, 16, 4, vocab_size, seed=1)
    meta = {"max_seq_length": 16, "max_predictions_per_seq": 4,
            "shard": {"index": 0, "num_shards": 1, "instances": 8}}
    write_records(p("train.tfrecord"), inst, meta)
    data = open(p("train.tfrecord"), "rb").read()
    _write(p("truncated.tfrecord"), data[: int(len(data) * 0.6)], "wb")
    import tensorflow as tf

    with tf.io.TFRecordWriter(p("other_schema.tfrecord")) as w:
        ex = tf.train.Example(features=tf.train.Features(feature={
            "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x"]))}))
        for _ in range(4):
            w.write(ex.SerializeToString())
    # A fine-tuned classifier (for export_classifier) and an encoder export (for verify).
    from bert_keras import run_classifier
    from export.export_encoder import export_encoder

    run_classifier.run(train_file=p("cls.jsonl"), output_dir=p("classifier"),
                       init_checkpoint=p("encoder"), vocab_file=vocab, do_train=True,
                       max_seq_length=16, train_batch_size=4, num_train_steps=1,
                       learning_rate=1e-3)
    export_encoder(encoder, p("exports"), vocab, version=1, warmup_seq_length=16)
    shutil.copytree(p("exports", "1"), p("corrupt_export"))
    _write(p("corrupt_export", "saved_model.pb"), b"\x08garbage protobuf" * 20, "wb")
    shutil.copytree(p("exports", "1"), p("export_bad_variables"))
    _write(p("export_bad_variables", "variables", "variables.index"), b"not an sstable" * 9, "wb")
    os.makedirs(p("empty_dir"))
    build_damaged_models(d)
    # Existing outputs that a run must not touch.
    os.makedirs(p("existing_out"))
    _write(p("existing_out", "model.keras"), "keep me")
    # Batching parameters of another export beside the versions (issue 47): never replaced.
    os.makedirs(p("other_batching"))
    _write(p("other_batching", "batching_parameters.txt"), "max_batch_size { value: 3 }\n")
    _write(p("existing.txt"), "keep me")
    return d


def tokenizer_json(tokens) -> str:
    """transformers 5's tokenizer.json (what read_hf_tokenizer reads: a WordPiece model)."""
    return json.dumps({"version": "1.0", "model": {
        "type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
        "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(tokens)}}})


def build_damaged_models(d: str) -> None:
    """Checkpoints with a damaged file or a vocabulary of another model (issue 42): a
    transformers directory (tokenizer.json only, as transformers 5 saves), an encoder
    directory, a fine-tuned classifier and a Google checkpoint, each copied with one file
    changed."""
    import keras

    from bert_keras import checkpoints, model_loading
    from bert_keras.convert_checkpoint import convert
    from bert_keras.encoder import BertEncoder

    p = lambda *names: os.path.join(d, *names)  # noqa: E731
    tokens = open(p("vocab.txt"), encoding="utf-8").read().splitlines()  # 79 = the model's rows
    five = "".join(f"{t}\n" for t in tokens[:5])  # [PAD] [UNK] [CLS] [SEP] [MASK]
    extra = "".join(f"{t}\n" for t in tokens + [f"extra{i}" for i in range(20)])
    convert("keras", "hf", p("classifier"), p("hf_with_vocab"))  # writes vocab.txt
    weights = open(p("hf_with_vocab", "model.safetensors"), "rb").read()
    variants = {  # name: {file: new content (None: removed)}
        "hf": {"vocab.txt": None, "tokenizer.json": tokenizer_json(tokens)},
        "hf_tok5": {"vocab.txt": None, "tokenizer.json": tokenizer_json(tokens[:5])},
        "hf_tok_big": {"vocab.txt": None, "tokenizer.json": tokenizer_json(
            tokens + [f"extra{i}" for i in range(12)])},
        "hf_tok_garbage": {"vocab.txt": None, "tokenizer.json": "{not json"},
        "hf_tok_bpe": {"vocab.txt": None, "tokenizer.json": json.dumps(
            {"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)}}})},
        "hf_st_garbage": {"model.safetensors": b"\xff" * 64 + b"not safetensors"},
        "hf_st_truncated": {"model.safetensors": weights[: len(weights) // 2]},
        "hf_config_garbage": {"config.json": "{not json"},
        "hf_vocab5": {"vocab.txt": five},
    }
    for name, changes in variants.items():
        shutil.copytree(p("hf_with_vocab"), p(name))
        for file, content in changes.items():
            if content is None:
                os.remove(p(name, file))
            else:
                _write(p(name, file), content, "wb" if isinstance(content, bytes) else "w")
    h5 = open(p("encoder", "encoder.weights.h5"), "rb").read()
    for name, file, content in (
            ("enc_h5_garbage", "encoder.weights.h5", b"\x89HDF\r\n\x1a\n" + b"\0" * 100),
            ("enc_h5_truncated", "encoder.weights.h5", h5[: len(h5) // 2]),
            ("enc_vocab5", "vocab.txt", five), ("enc_vocab_big", "vocab.txt", extra),
            ("enc_tokenizer_config_garbage", "tokenizer_config.json", "{not json")):
        shutil.copytree(p("encoder"), p(name))
        _write(p(name, file), content, "wb" if isinstance(content, bytes) else "w")
    model = open(p("classifier", "model.keras"), "rb").read()
    for name, file, content in (("cls_keras_truncated", "model.keras", model[: len(model) // 2]),
                                ("cls_vocab5", "vocab.txt", five),
                                ("cls_labels_bad", "labels.txt", "a\n\n")):
        shutil.copytree(p("classifier"), p(name))
        _write(p(name, file), content, "wb" if isinstance(content, bytes) else "w")
    checkpoints.save_model(model_loading.load_encoder(p("encoder")), "google",
                           p("google", "bert_model.ckpt"))
    shutil.copy(p("vocab.txt"), p("google", "vocab.txt"))
    data = open(p("google", "bert_model.ckpt.data-00000-of-00001"), "rb").read()
    for name, file, content in (
            ("google_index_garbage", "bert_model.ckpt.index", b"not an sstable" * 8),
            ("google_data_truncated", "bert_model.ckpt.data-00000-of-00001",
             data[: len(data) // 3]),
            ("google_vocab5", "vocab.txt", five)):
        shutil.copytree(p("google"), p(name))
        _write(p(name, file), content, "wb" if isinstance(content, bytes) else "w")
    keras.utils.set_random_seed(5)
    BertEncoder(vocab_size=200, **SMALL).save(p("encoder_200_rows.keras"))  # another model
    _write(p("vocab5.txt"), five)
    _write(p("vocab_big.txt"), extra)
    _write(p("vocab_72.txt"), "".join(f"{t}\n" for t in tokens[:72]))  # 91% of 79 rows: fits


# --- The cases: (id, tool, argv, what the error line must name). ---
# {F}: the fixture directory; {W}: this case's empty work directory (the output location).

FT = ("--vocab_file={F}/vocab.txt --init_checkpoint={F}/encoder --max_seq_length=16 "
      "--train_batch_size=4")
CLS = f"{FT} --output_dir={{W}}/out --do_train --train_file={{F}}/cls.jsonl"
TAG = f"{FT} --output_dir={{W}}/out --do_train --train_file={{F}}/tags.txt"
SQFT = f"{FT} --doc_stride=8 --max_query_length=8"
SQ = f"{SQFT} --output_dir={{W}}/out --do_train --train_file={{F}}/squad.json"
EXT = ("--input_file={F}/lines.txt --output_file={W}/features.jsonl --init_checkpoint={F}/encoder "
       "--max_seq_length=16 --layers=-1,-2")
PRE = ("--input_file={F}/train.tfrecord --output_dir={W}/run --bert_config_file={F}/bert_config.json "
       "--max_seq_length=16 --max_predictions_per_seq=4 --train_batch_size=4 --num_train_steps=2 "
       "--save_checkpoints_steps=2 --num_warmup_steps=0")
CONV = "--from=keras --to=hf --input={F}/encoder.keras --output={W}/hf"
VOC = "--input={F}/text.txt --output={W}/vocab/vocab.txt --vocab_size=60 --layout=compact"
CORP = "--input={F}/text.txt --output_file={W}/corpus.txt"
CPD = ("--input_file={F}/text.txt --output_file={W}/shard.tfrecord --vocab_file={F}/vocab.txt "
       "--max_seq_length=16 --max_predictions_per_seq=4 --dupe_factor=1")
EENC = "--init_checkpoint={F}/encoder --export_dir={W}/exp --seq_length=16"
ECLS = "--model_dir={F}/classifier --export_dir={W}/exp --max_seq_length=16"
EPRE = "--vocab_file={F}/vocab.txt --export_dir={W}/exp --seq_length=16"
VER = "--export_dir={F}/exports/1"


def _flag_cases(tool, base, flags_and_values):
    return [(f"{tool}-{flag}={value}", tool, f"{base} --{flag}={value}", f"--{flag}")
            for flag, value in flags_and_values]


def _damaged_cases(tool, base, path, damaged):
    """`tool` given each damaged fixture instead of `path` in `base`: (fixture, the file in
    it that the error line must name)."""
    return [(f"{tool}-{name}", tool, base.replace(path, "{F}/" + name), f"{name}/{file}")
            for name, file in damaged]


# A hub's handle or a web address names a download, which no tool makes: every one failed
# with TensorFlow's traceback (UnimplementedError: File system scheme 'kaggle' not
# implemented) wherever it was first read or written, in every format but keras_hub.
HUB_VALUES = ("kaggle://keras/bert/keras/bert_tiny_en_uncased",
              "hf://google-bert/bert-base-uncased",
              "https://tfhub.dev/tensorflow/bert_en_uncased_L-12_H-768_A-12/4",
              "https://example.com/bert/vocab.txt")


def _hub_cases(tool, base, flags, name=""):
    """`tool` with each of `flags` given a hub handle or web address instead (the values
    taken in turn), in `base` or added to it: one line naming the flag and the value."""
    cases = []
    for i, flag in enumerate(flags):
        value = HUB_VALUES[i % len(HUB_VALUES)]
        argv = [a for a in base.split() if not a.startswith(f"--{flag}=")] + [f"--{flag}={value}"]
        cases.append((f"{tool}{name}-hub-{flag}-{i}", tool, " ".join(argv),
                      f"--{flag}: {value}: "))
    return cases


CASES = [
    # run_classifier
    *_flag_cases("run_classifier", CLS, [
        ("learning_rate", -1), ("learning_rate", 0), ("train_batch_size", 0),
        ("eval_batch_size", 0), ("max_seq_length", 0), ("max_seq_length", 1000),
        ("num_train_epochs", 0), ("num_train_steps", 0), ("warmup_proportion", 1.5),
        ("classifier_dropout", 2), ("strip_accents", "maybe"), ("input_format", "xml"),
        ("mixed_precision", "bfloat16"), ("no_such_flag", 1), ("predict_batch_size", 0),
        ("use_tpu", "true"), ("gradient_accumulation_steps", 0),
        # numpy's seeding refused these with a traceback; 2 left no WordPiece (packing's).
        ("seed", -1), ("seed", 2 ** 32), ("max_seq_length", 2),
        # transformers' names: the line named --eval_batch_size
        ("per_device_eval_batch_size", 0), ("warmup_ratio", 2)]),
    ("run_classifier-pair-max_seq_length=3", "run_classifier",
     CLS + " --text_b_column=text --max_seq_length=3", "cls.jsonl:1 is a pair"),
    # A label list with a repeated or an empty label trained a model no later stage read.
    ("run_classifier-label_list-duplicate", "run_classifier",
     CLS + " --label_list=a,b,a", "--label_list: duplicate labels ['a']"),
    ("run_classifier-label_list-empty", "run_classifier",
     CLS + " --label_list=a,,b", "--label_list: item 2: empty label"),
    ("run_classifier-missing-train", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/missing.jsonl", "missing.jsonl"),
    ("run_classifier-binary-train", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/binary.bin --input_format=jsonl", "binary.bin"),
    ("run_classifier-latin1-train", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/cls_latin1.jsonl", "cls_latin1.jsonl"),
    ("run_classifier-empty-train", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/empty.txt --input_format=jsonl", "empty.txt"),
    ("run_classifier-bad-json", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/cls_bad_json.jsonl", "cls_bad_json.jsonl"),
    ("run_classifier-no-label", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/cls_no_label.jsonl", "cls_no_label.jsonl"),
    ("run_classifier-empty-text", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/cls_empty_text.jsonl", "cls_empty_text.jsonl"),
    ("run_classifier-one-class", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/cls_one_class.jsonl", "cls_one_class.jsonl"),
    ("run_classifier-empty-tsv", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/cls.tsv", "cls.tsv"),
    ("run_classifier-bad-tsv-row", "run_classifier", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/cls_bad.tsv", "cls_bad.tsv"),
    ("run_classifier-missing-init", "run_classifier",
     "--vocab_file={F}/vocab.txt --init_checkpoint={F}/nope --max_seq_length=16 "
     "--output_dir={W}/out --do_train --train_file={F}/cls.jsonl", "nope"),
    ("run_classifier-garbage-init", "run_classifier",
     "--vocab_file={F}/vocab.txt --init_checkpoint={F}/garbage.keras --max_seq_length=16 "
     "--output_dir={W}/out --do_train --train_file={F}/cls.jsonl", "garbage.keras"),
    ("run_classifier-missing-vocab", "run_classifier",
     "--vocab_file={F}/nope.txt --init_checkpoint={F}/encoder --max_seq_length=16 "
     "--output_dir={W}/out --do_train --train_file={F}/cls.jsonl", "nope.txt"),
    ("run_classifier-vocab-no-specials", "run_classifier",
     "--vocab_file={F}/no_specials_vocab.txt --init_checkpoint={F}/encoder --max_seq_length=16 "
     "--output_dir={W}/out --do_train --train_file={F}/cls.jsonl", "no_specials_vocab.txt"),
    ("run_classifier-output-is-file", "run_classifier",
     f"{FT} --output_dir={{F}}/existing.txt --do_train --train_file={{F}}/cls.jsonl",
     "existing.txt"),
    ("run_classifier-output-exists", "run_classifier",
     f"{FT} --output_dir={{F}}/existing_out --do_train --train_file={{F}}/cls.jsonl",
     "existing_out"),
    ("run_classifier-nothing-to-do", "run_classifier", f"{FT} --output_dir={{W}}/out",
     "--do_train"),
    ("run_classifier-eval-no-file", "run_classifier", f"{FT} --output_dir={{W}}/out --do_eval",
     "--eval_file"),
    ("run_classifier-positional", "run_classifier", f"{CLS} extra_arg", "extra_arg"),
    ("run_classifier-no-init-no-config", "run_classifier",
     "--vocab_file={F}/vocab.txt --max_seq_length=16 --output_dir={W}/out --do_train "
     "--train_file={F}/cls.jsonl", "--init_checkpoint"),
    ("run_classifier-config-no-heads", "run_classifier",
     "--vocab_file={F}/vocab.txt --bert_config_file={F}/config_no_heads.json --max_seq_length=16 "
     "--output_dir={W}/out --do_train --train_file={F}/cls.jsonl", "config_no_heads.json"),
    ("run_classifier-config-not-json", "run_classifier",
     "--vocab_file={F}/vocab.txt --bert_config_file={F}/config_bad.json --max_seq_length=16 "
     "--output_dir={W}/out --do_train --train_file={F}/cls.jsonl", "config_bad.json"),
    ("run_classifier-eval-only-no-model", "run_classifier",
     "--vocab_file={F}/vocab.txt --output_dir={W}/out --do_eval --eval_file={F}/cls.jsonl",
     "--output_dir"),
    # run_tagger
    *_flag_cases("run_tagger", TAG, [
        ("learning_rate", -0.5), ("train_batch_size", 0), ("max_seq_length", 100),
        ("tagger_dropout", -0.1), ("num_train_steps", -3), ("mixed_precision", "float16")]),
    ("run_tagger-missing-train", "run_tagger", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/missing.txt", "missing.txt"),
    ("run_tagger-binary", "run_tagger", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/binary.bin", "binary.bin"),
    ("run_tagger-latin1", "run_tagger", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/latin1.txt", "latin1.txt"),
    ("run_tagger-bad-row", "run_tagger", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/tags_bad.txt", "tags_bad.txt"),
    ("run_tagger-empty", "run_tagger", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/empty.txt", "empty.txt"),
    ("run_tagger-tag-column", "run_tagger", f"{TAG} --tag_column=5", "tags.txt"),
    # run_ner.py's JSON keys given for a CoNLL file were silently unused.
    ("run_tagger-json-key-on-conll", "run_tagger", f"{TAG} --label_column_name=tags",
     "--label_column_name: {F}/tags.txt is read as CoNLL columns"),
    # Word and tag read from one column trained a model of words tagged by themselves.
    ("run_tagger-token-column-is-tag-column", "run_tagger", f"{TAG} --token_column=1",
     "--token_column=1 and --tag_column=-1 are the same column of its 2"),
    ("run_tagger-output-is-file", "run_tagger",
     f"{FT} --output_dir={{F}}/existing.txt --do_train --train_file={{F}}/tags.txt",
     "existing.txt"),
    # --doc_stride: 0 truncates, 1 to --max_seq_length - 2 windows; refused before any output.
    ("run_tagger-doc_stride=-1", "run_tagger", f"{TAG} --doc_stride=-1",
     "--doc_stride=-1: expected a finite value >= 0"),
    ("run_tagger-doc_stride-past-a-window", "run_tagger", f"{TAG} --doc_stride=15",
     "--doc_stride=15 must not exceed --max_seq_length=16 - 2"),
    ("run_tagger-max_seq_length=2", "run_tagger", f"{TAG} --max_seq_length=2",
     "--max_seq_length=2 leaves no room for a word"),
    # KLUE-NER's character format (--task_name=klue-ner, --tag_format=klue).
    ("run_tagger-klue-bad-line", "run_tagger", f"{FT} --output_dir={{W}}/out --do_train "
     "--tag_format=klue --train_file={F}/klue_bad.tsv", "klue_bad.tsv:3: expected one character"),
    ("run_tagger-klue-conll-file", "run_tagger", f"{TAG} --tag_format=klue",
     "tags.txt:1: expected one character"),
    ("run_tagger-task_name-unknown", "run_tagger", f"{FT} --output_dir={{W}}/out --do_train "
     "--task_name=klue-dp --data_dir={F}", "unknown tagging task 'klue-dp'"),
    ("run_tagger-task_name-no-files", "run_tagger", f"{FT} --output_dir={{W}}/out --do_train "
     "--task_name=klue-ner --data_dir={F}", "no klue-ner-v1.1_train.tsv there"),
    ("run_tagger-task_name-and-train_file", "run_tagger", f"{TAG} --task_name=klue-ner "
     "--data_dir={F}", "drop --train_file"),
    # run_squad
    *_flag_cases("run_squad", SQ, [
        ("learning_rate", -1e-5), ("train_batch_size", 0), ("gradient_accumulation_steps", -2),
        ("doc_stride", 0),
        ("max_query_length", 0), ("n_best_size", 0), ("max_answer_length", 0),
        ("max_seq_length", 4096), ("warmup_proportion", -0.2), ("mixed_precision", "bf16"),
        ("null_score_diff_threshold", "nan"), ("null_score_diff_threshold", "inf"),
        ("predict_batch_size", -1), ("use_tpu", "true")]),
    ("run_squad-missing", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/missing.json", "missing.json"),
    ("run_squad-binary", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/binary.bin", "binary.bin"),
    ("run_squad-latin1", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/latin1.txt", "latin1.txt"),
    ("run_squad-truncated-json", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/squad_truncated.json", "squad_truncated.json"),
    ("run_squad-not-squad", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/squad_not_squad.json", "squad_not_squad.json"),
    ("run_squad-answer-outside", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/squad_outside.json", "squad_outside.json"),
    ("run_squad-predict-no-file", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_predict",
     "--predict_file"),
    ("run_squad-query-longer-than-seq", "run_squad", f"{FT} --output_dir={{W}}/out --do_train "
     "--train_file={F}/squad.json", "--max_query_length"),
    # A question without a gold answer is refused with the inputs, not after training and
    # writing predictions.json (which then blocked the rerun).
    ("run_squad-eval-question-without-answer", "run_squad",
     f"{SQ} --do_eval --predict_file={{TESTDATA}}/ft_squad_v2.json", "ft_squad_v2.json"),
    # A SQuAD 2.0 file trained on as v1.1 lost its unanswerable questions silently.
    ("run_squad-train-v2-file-without-flag", "run_squad", f"{SQFT} --output_dir={{W}}/out "
     "--do_train --train_file={TESTDATA}/ft_squad_v2.json", "--version_2_with_negative"),
    # KorQuAD and KLUE-MRC by --task_name.
    ("run_squad-task_name-unknown", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--task_name=korquad2 --data_dir={F}", "unknown span-QA task 'korquad2'"),
    ("run_squad-task_name-no-files", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--task_name=klue-mrc --data_dir={F}", "no klue-mrc-v1.1_train.json there"),
    ("run_squad-task_name-v1", "run_squad", f"{SQFT} --output_dir={{W}}/out --do_train "
     "--task_name=klue-mrc --data_dir={F} --noversion_2_with_negative",
     "--task_name=klue-mrc sets --version_2_with_negative=true; drop"),
    ("run_squad-eval_metric-unknown", "run_squad", f"{SQ} --eval_metric=rouge",
     "--eval_metric"),
    # extract_features
    *_flag_cases("extract_features", EXT, [("batch_size", 0), ("max_seq_length", 0),
                                           ("max_seq_length", 2), ("max_seq_length", 500),
                                           ("use_tpu", "true")]),
    # Checked before the checkpoint loads and the model runs over the input (it was after).
    ("extract_features-output-extension", "extract_features",
     EXT.replace("features.jsonl", "features.csv").replace("{F}/encoder", "{F}/nope"),
     "--output_file"),
    ("extract_features-layers-not-int", "extract_features", f"{EXT} --layers=a,b", "--layers"),
    ("extract_features-layer-out-of-range", "extract_features", f"{EXT} --layers=-9",
     "--layers"),
    ("extract_features-missing-input", "extract_features",
     "--input_file={F}/missing.txt --output_file={W}/f.jsonl --init_checkpoint={F}/encoder",
     "missing.txt"),
    ("extract_features-binary", "extract_features",
     "--input_file={F}/binary.bin --output_file={W}/f.jsonl --init_checkpoint={F}/encoder",
     "binary.bin"),
    ("extract_features-latin1", "extract_features",
     "--input_file={F}/latin1.txt --output_file={W}/f.jsonl --init_checkpoint={F}/encoder",
     "latin1.txt"),
    ("extract_features-empty-line", "extract_features",
     "--input_file={F}/text.txt --output_file={W}/f.jsonl --init_checkpoint={F}/encoder",
     "text.txt"),
    ("extract_features-missing-init", "extract_features",
     "--input_file={F}/lines.txt --output_file={W}/f.jsonl --init_checkpoint={F}/nope",
     "nope"),
    ("extract_features-output-exists", "extract_features",
     "--input_file={F}/lines.txt --output_file={F}/existing.txt --init_checkpoint={F}/encoder",
     "existing.txt"),
    ("extract_features-output-under-file", "extract_features",
     "--input_file={F}/lines.txt --output_file={F}/existing.txt/f.jsonl "
     "--init_checkpoint={F}/encoder --max_seq_length=16 --layers=-1", "existing.txt"),
    # run_pretraining
    *_flag_cases("run_pretraining", PRE, [
        ("learning_rate", -1e-4), ("train_batch_size", 0), ("num_train_steps", 0),
        ("save_checkpoints_steps", 0), ("num_warmup_steps", -1), ("eval_batch_size", 0),
        ("gradient_accumulation_steps", 0), ("weight_decay", -0.1),
        ("mixed_precision", "bf16"), ("seed", -1), ("weight_decay", "inf")]),
    ("run_pretraining-missing-input", "run_pretraining",
     PRE.replace("{F}/train.tfrecord", "{F}/missing.tfrecord"), "missing.tfrecord"),
    ("run_pretraining-truncated", "run_pretraining",
     PRE.replace("{F}/train.tfrecord", "{F}/truncated.tfrecord"), "truncated.tfrecord"),
    ("run_pretraining-other-schema", "run_pretraining",
     PRE.replace("{F}/train.tfrecord", "{F}/other_schema.tfrecord"), "other_schema.tfrecord"),
    ("run_pretraining-text-as-shard", "run_pretraining",
     PRE.replace("{F}/train.tfrecord", "{F}/text.txt"), "text.txt"),
    # TensorFlow's eager error in the line: "({{function_node __wrapped__IteratorGetNext...
    # device:CPU:0}} corrupted record at 0 (...) [Op:IteratorGetNext] name: )".
    ("run_pretraining-text-as-eval-shard", "run_pretraining",
     f"{PRE} --eval_input_file={{F}}/text.txt --do_eval",
     "{F}/text.txt is not a readable TFRecord file (corrupted record at 0 (Is this even a "
     "TFRecord file?))"),
    ("run_pretraining-missing-init", "run_pretraining", f"{PRE} --init_checkpoint={{F}}/nope",
     "nope"),
    ("run_pretraining-garbage-init", "run_pretraining",
     f"{PRE} --init_checkpoint={{F}}/garbage.weights.h5", "garbage.weights.h5"),
    ("run_pretraining-config-no-heads", "run_pretraining",
     PRE.replace("{F}/bert_config.json", "{F}/config_no_heads.json"), "config_no_heads.json"),
    ("run_pretraining-config-missing", "run_pretraining",
     PRE.replace("{F}/bert_config.json", "{F}/nope.json"), "--bert_config_file {F}/nope.json"),
    ("run_pretraining-seq-mismatch", "run_pretraining",
     PRE.replace("--max_seq_length=16", "--max_seq_length=32"), "max_seq_length"),
    ("run_pretraining-output-is-file", "run_pretraining",
     PRE.replace("{W}/run", "{F}/existing.txt"), "existing.txt"),
    # convert_checkpoint
    ("convert-missing-input", "convert_checkpoint", CONV.replace("encoder.keras", "nope.keras"),
     "nope.keras"),
    ("convert-garbage-input", "convert_checkpoint", CONV.replace("encoder.keras", "garbage.keras"),
     "garbage.keras"),
    ("convert-output-exists", "convert_checkpoint", CONV.replace("{W}/hf", "{F}/existing_out"),
     "existing_out"),
    ("convert-bad-format", "convert_checkpoint", CONV.replace("--to=hf", "--to=onnx"), "--to"),
    ("convert-config-hf", "convert_checkpoint",
     CONV.replace("--from=keras", "--from=hf") + " --bert_config_file={F}/bert_config.json",
     "--bert_config_file"),
    ("convert-google-missing", "convert_checkpoint",
     "--from=google --to=keras --input={F}/nope/bert_model.ckpt --output={W}/k.weights.h5",
     "nope"),
    # build_vocab
    *_flag_cases("build_vocab", VOC, [("vocab_size", 0), ("num_unused", -1),
                                      ("min_frequency", -3), ("max_alphabet", -5),
                                      ("max_unique_words", 0)]),
    ("build_vocab-missing", "build_vocab", VOC.replace("text.txt", "missing.txt"), "missing.txt"),
    ("build_vocab-binary", "build_vocab", VOC.replace("text.txt", "binary.bin"), "binary.bin"),
    ("build_vocab-latin1", "build_vocab", VOC.replace("text.txt", "latin1.txt"), "latin1.txt"),
    ("build_vocab-empty", "build_vocab", VOC.replace("text.txt", "empty.txt"), "empty.txt"),
    ("build_vocab-output-exists", "build_vocab", VOC.replace("{W}/vocab/vocab.txt",
                                                             "{F}/existing.txt"), "existing.txt"),
    ("build_vocab-dir-input", "build_vocab", VOC.replace("{F}/text.txt", "{F}/empty_dir"),
     "empty_dir"),
    # prepare_corpus
    *_flag_cases("prepare_corpus", CORP, [("min_document_sentences", 0)]),
    ("prepare_corpus-missing", "prepare_corpus", CORP.replace("text.txt", "missing.txt"),
     "missing.txt"),
    ("prepare_corpus-binary", "prepare_corpus", CORP.replace("text.txt", "binary.bin"),
     "binary.bin"),
    ("prepare_corpus-latin1", "prepare_corpus", CORP.replace("text.txt", "latin1.txt"),
     "latin1.txt"),
    ("prepare_corpus-output-exists", "prepare_corpus",
     CORP.replace("{W}/corpus.txt", "{F}/existing.txt"), "existing.txt"),
    # create_pretraining_data
    *_flag_cases("create_pretraining_data", CPD, [
        ("masked_lm_prob", 1.5), ("short_seq_prob", -0.1), ("dupe_factor", 0),
        ("max_seq_length", 0), ("num_workers", 0), ("max_predictions_per_seq", 0),
        ("num_output_shards", 0), ("masked_lm_prob", 0),
        # Named "pool_size" (the field behind the flag) before.
        ("random_doc_pool_size", 1)]),
    ("create_pretraining_data-missing", "create_pretraining_data",
     CPD.replace("text.txt", "missing.txt"), "missing.txt"),
    ("create_pretraining_data-binary", "create_pretraining_data",
     CPD.replace("text.txt", "binary.bin"), "binary.bin"),
    ("create_pretraining_data-empty", "create_pretraining_data",
     CPD.replace("text.txt", "empty.txt"), "empty.txt"),
    ("create_pretraining_data-missing-vocab", "create_pretraining_data",
     CPD.replace("{F}/vocab.txt", "{F}/nope.txt"), "nope.txt"),
    ("create_pretraining_data-vocab-no-specials", "create_pretraining_data",
     CPD.replace("{F}/vocab.txt", "{F}/no_specials_vocab.txt"), "no_specials_vocab.txt"),
    # An output that is the tool's input, with the overwrite flag: the input was replaced.
    ("prepare_corpus-output-is-input", "prepare_corpus",
     CORP.replace("{W}/corpus.txt", "{F}/text.txt") + " --overwrite",
     "--output_file {F}/text.txt is an input (--input {F}/text.txt)"),
    ("build_vocab-output-is-input", "build_vocab",
     VOC.replace("{W}/vocab/vocab.txt", "{F}/text.txt") + " --overwrite",
     "--output {F}/text.txt is an input"),
    ("create_pretraining_data-output-is-input", "create_pretraining_data",
     CPD.replace("{W}/shard.tfrecord", "{F}/text.txt") + " --overwrite",
     "--output_file {F}/text.txt is an input"),
    ("extract_features-output-is-input", "extract_features",
     EXT.replace("{F}/lines.txt", "{F}/cls.jsonl").replace("{W}/features.jsonl", "{F}/cls.jsonl")
     + " --overwrite_output", "--output_file {F}/cls.jsonl is an input"),
    # inf: "Out of range float values are not JSON compliant"; <= 0 was ignored locally.
    *_flag_cases("create_pretraining_data", CPD, [("beam_bucket_mb", "inf"),
                                                  ("beam_bucket_mb", 0)]),
    ("create_pretraining_data-output-exists", "create_pretraining_data",
     CPD.replace("{W}/shard.tfrecord", "{F}/existing.txt"), "existing.txt"),
    # export_encoder
    *_flag_cases("export_encoder", EENC, [("seq_length", 0), ("seq_length", 1),
                                          ("seq_length", 128), ("version", 0),
                                          ("length_buckets", "16,sixteen"),
                                          # a warmup request of 1 position: a traceback
                                          ("length_buckets", "1,16")]),
    ("export_encoder-missing-init", "export_encoder", EENC.replace("{F}/encoder", "{F}/nope"),
     "nope"),
    ("export_encoder-garbage-init", "export_encoder",
     EENC.replace("{F}/encoder", "{F}/garbage.keras"), "garbage.keras"),
    ("export_encoder-export-dir-is-file", "export_encoder",
     EENC.replace("{W}/exp", "{F}/existing.txt"), "existing.txt"),
    ("export_encoder-vocab-missing", "export_encoder", f"{EENC} --vocab_file={{F}}/nope.txt",
     "nope.txt"),
    ("export_encoder-vocab-too-big", "export_encoder",
     f"{EENC} --vocab_file={{TESTDATA}}/pretrain_vocab.txt", "pretrain_vocab.txt"),
    ("export_encoder-version-exists", "export_encoder",
     "--init_checkpoint={F}/encoder --export_dir={F}/exports --version=1 --seq_length=16",
     "exports"),
    # export_classifier
    *_flag_cases("export_classifier", ECLS, [("max_seq_length", 0), ("max_seq_length", 64),
                                             ("version", -1), ("length_buckets", "8,x"),
                                             ("length_buckets", "0"), ("length_buckets", -16)]),
    ("export_classifier-other-batching-parameters", "export_classifier",
     ECLS.replace("{W}/exp", "{F}/other_batching"), "other_batching/batching_parameters.txt"),
    ("export_classifier-missing-model", "export_classifier",
     ECLS.replace("{F}/classifier", "{F}/nope"), "nope"),
    ("export_classifier-not-classifier", "export_classifier",
     ECLS.replace("{F}/classifier", "{F}/encoder"), "--model_dir"),
    ("export_classifier-export-dir-is-file", "export_classifier",
     ECLS.replace("{W}/exp", "{F}/existing.txt"), "existing.txt"),
    # run_regressor: run_classifier's files with a number for the label.
    *_flag_cases("run_regressor", CLS.replace("cls.jsonl", "rated.jsonl"), [
        ("learning_rate", -1), ("classifier_dropout", 2), ("input_format", "xml"),
        ("seed", 2 ** 32), ("max_seq_length", 2)]),
    ("run_regressor-label-not-a-number", "run_regressor", CLS, "cls.jsonl:1: label"),
    ("run_regressor-missing-train", "run_regressor", CLS.replace("cls.jsonl", "missing.jsonl"),
     "missing.jsonl"),
    ("run_regressor-classification-task", "run_regressor",
     f"{FT} --output_dir={{W}}/out --do_train --task_name=mrpc --data_dir={{F}}",
     "--task_name=mrpc: a classification task; run bert_keras.run_classifier"),
    # export_regressor: the classifier export's checks, on a regressor's directory.
    *_flag_cases("export_regressor", ECLS, [("max_seq_length", 0), ("version", -1)]),
    ("export_regressor-given-a-classifier", "export_regressor", ECLS,
     "--model_dir {F}/classifier holds a BertClassifier, not a BertRegressor (expected "
     "run_regressor's output directory)"),
    # export_tagger (transformers' task heads, issue 31): the same checks as export_classifier
    *_flag_cases("export_tagger", ECLS, [("max_seq_length", 0), ("version", -1),
                                         ("length_buckets", "1.5"), ("doc_stride", -1),
                                         ("tag_format", "chars")]),
    ("export_tagger-missing-model", "export_tagger", ECLS.replace("{F}/classifier", "{F}/nope"),
     "--model_dir {F}/nope: no such directory (expected run_tagger's output directory"),
    ("export_tagger-given-a-classifier", "export_tagger", ECLS, "--model_dir"),
    ("export_tagger-given-an-encoder", "export_tagger", ECLS.replace("{F}/classifier", "{F}/encoder"),
     "--model_dir"),
    # An existing version is refused before the model (a classifier here) is even loaded.
    ("export_tagger-version-exists", "export_tagger",
     ECLS.replace("{W}/exp", "{F}/exports") + " --version=1", "exports"),
    # export_span_qa (transformers' task heads, issue 31): the same checks as export_classifier
    *_flag_cases("export_span_qa", ECLS, [("max_seq_length", 0), ("version", -1),
                                          ("length_buckets", "-1"), ("doc_stride", 0),
                                          ("max_answer_length", 0), ("max_query_length", 0),
                                          ("null_score_diff_threshold", "nan"), ("null_score_diff_threshold", "inf")]),
    ("export_span_qa-missing-model", "export_span_qa", ECLS.replace("{F}/classifier", "{F}/nope"), "nope"),
    ("export_span_qa-given-a-classifier", "export_span_qa", ECLS, "--model_dir"),
    ("export_span_qa-given-an-encoder", "export_span_qa", ECLS.replace("{F}/classifier", "{F}/encoder"),
     "--model_dir"),
    # An existing version is refused before the model (a classifier here) is even loaded.
    ("export_span_qa-version-exists", "export_span_qa",
     ECLS.replace("{W}/exp", "{F}/exports") + " --version=1", "exports"),
    # export_preprocessor
    *_flag_cases("export_preprocessor", EPRE, [("seq_length", 0), ("version", 0)]),
    ("export_preprocessor-vocab-missing", "export_preprocessor",
     EPRE.replace("vocab.txt", "nope.txt"), "nope.txt"),
    ("export_preprocessor-vocab-binary", "export_preprocessor",
     EPRE.replace("vocab.txt", "binary.bin"), "binary.bin"),
    ("export_preprocessor-vocab-no-specials", "export_preprocessor",
     EPRE.replace("vocab.txt", "no_specials_vocab.txt"), "no_specials_vocab.txt"),
    ("export_preprocessor-export-dir-is-file", "export_preprocessor",
     EPRE.replace("{W}/exp", "{F}/existing.txt"), "existing.txt"),
    # verify
    # inf passed every check; a config without the checkpoint it configures was ignored.
    *_flag_cases("verify", VER, [("rtol", 0), ("rtol", -1), ("rtol", "inf")]),
    ("verify-config-without-checkpoint", "verify",
     f"{VER} --bert_config_file={{F}}/bert_config.json",
     "--bert_config_file configures --init_checkpoint's model"),
    ("verify-missing", "verify", "--export_dir={F}/nope", "nope"),
    ("verify-empty-dir", "verify", "--export_dir={F}/empty_dir", "empty_dir"),
    ("verify-corrupt-pb", "verify", "--export_dir={F}/corrupt_export", "corrupt_export"),
    ("verify-missing-init", "verify", f"{VER} --init_checkpoint={{F}}/nope", "nope"),
    # Issue 42: damaged files inside checkpoints, vocabularies of another model, refusals
    # that used to leave a directory. The line names the file at fault.
    *_damaged_cases("convert_checkpoint", "--from=hf --to=keras --input={F}/x --output={W}/k",
                    "{F}/x", [("hf_tok5", "tokenizer.json"), ("hf_tok_big", "tokenizer.json"),
                              ("hf_tok_garbage", "tokenizer.json"),
                              ("hf_tok_bpe", "tokenizer.json"),
                              ("hf_st_garbage", "model.safetensors"),
                              ("hf_st_truncated", "model.safetensors"),
                              ("hf_config_garbage", "config.json"), ("hf_vocab5", "vocab.txt")]),
    *_damaged_cases("convert_checkpoint", "--from=google --to=hf "
                    "--input={F}/x/bert_model.ckpt --output={W}/h", "{F}/x",
                    [("google_vocab5", "vocab.txt"), ("google_index_garbage", "bert_model.ckpt")]),
    *_damaged_cases("convert_checkpoint", "--from=keras --to=hf --input={F}/x --output={W}/h",
                    "{F}/x", [("cls_keras_truncated", "model.keras")]),
    ("convert-hf-as-google", "convert_checkpoint", "--from=google --to=keras "
     "--input={F}/hf --output={W}/k.keras", "google format"),
    *_damaged_cases("run_classifier", CLS.replace("--vocab_file={F}/vocab.txt ", ""),
                    "{F}/encoder", [("hf_tok5", "tokenizer.json"),
                                    ("hf_st_garbage", "model.safetensors"),
                                    ("hf_config_garbage", "config.json"),
                                    ("enc_h5_truncated", "encoder.weights.h5"),
                                    ("enc_vocab_big", "vocab.txt"),
                                    ("google_data_truncated", "bert_model.ckpt")]),
    ("run_classifier-vocab5", "run_classifier", CLS.replace("{F}/vocab.txt", "{F}/vocab5.txt"),
     "vocab5.txt"),
    ("run_classifier-random-init-vocab-big", "run_classifier",
     "--vocab_file={F}/vocab_big.txt --bert_config_file={F}/bert_config.json "
     "--max_seq_length=16 --output_dir={W}/out --do_train --train_file={F}/cls.jsonl",
     "vocab_big.txt"),
    ("run_classifier-eval-truncated-model", "run_classifier",
     "--output_dir={F}/cls_keras_truncated --do_eval --eval_file={F}/cls.jsonl "
     "--max_seq_length=16", "cls_keras_truncated/model.keras"),
    ("run_classifier-eval-vocab5", "run_classifier", "--output_dir={F}/cls_vocab5 --do_eval "
     "--eval_file={F}/cls.jsonl --max_seq_length=16", "cls_vocab5/vocab.txt"),
    *_damaged_cases("run_tagger", TAG.replace("--vocab_file={F}/vocab.txt ", ""), "{F}/encoder",
                    [("hf_tok_big", "tokenizer.json")]),
    *_damaged_cases("run_squad", SQ.replace("--vocab_file={F}/vocab.txt ", ""), "{F}/encoder",
                    [("enc_vocab5", "vocab.txt")]),
    *_damaged_cases("extract_features", EXT, "{F}/encoder",
                    [("enc_h5_garbage", "encoder.weights.h5"), ("google_vocab5", "vocab.txt")]),
    ("extract_features-vocab-big", "extract_features", f"{EXT} --vocab_file={{F}}/vocab_big.txt",
     "vocab_big.txt"),
    *_damaged_cases("export_encoder", EENC, "{F}/encoder",
                    [("hf_tok5", "tokenizer.json"), ("hf_st_truncated", "model.safetensors"),
                     ("enc_tokenizer_config_garbage", "tokenizer_config.json"),
                     ("google_index_garbage", "bert_model.ckpt.index")]),
    *_damaged_cases("export_classifier", ECLS, "{F}/classifier",
                    [("cls_vocab5", "vocab.txt"), ("cls_keras_truncated", "model.keras"),
                     ("cls_labels_bad", "labels.txt")]),
    *_damaged_cases("export_tagger", ECLS, "{F}/classifier",
                    [("cls_keras_truncated", "model.keras")]),
    ("export_preprocessor-special-tokens-only", "export_preprocessor",
     EPRE.replace("vocab.txt", "vocab5.txt"), "vocab5.txt"),
    *_damaged_cases("run_pretraining", f"{PRE} --init_checkpoint={{F}}/x", "{F}/x",
                    [("hf_st_garbage", "model.safetensors"),
                     ("enc_h5_truncated", "encoder.weights.h5")]),
    ("create_pretraining_data-vocab-no-specials-nested-output", "create_pretraining_data",
     CPD.replace("{F}/vocab.txt", "{F}/no_specials_vocab.txt").replace(
         "{W}/shard.tfrecord", "{W}/out/deep/train"), "no_specials_vocab.txt"),
    ("create_pretraining_data-beam-vocab-no-specials-nested-output", "create_pretraining_data",
     CPD.replace("{F}/vocab.txt", "{F}/no_specials_vocab.txt").replace(
         "{W}/shard.tfrecord", "{W}/out/train") + " --runner=DirectRunner",
     "no_specials_vocab.txt"),
    *[(f"create_pretraining_data-{name}{runner}", "create_pretraining_data",
       CPD.replace("{F}/text.txt", "{F}/" + name) + runner, name)
      for name in ("cut_early.txt.gz", "cut_late.txt.gz")
      for runner in ("", " --runner=DirectRunner")],
    ("prepare_corpus-cut-gzip", "prepare_corpus", CORP.replace("text.txt", "cut_late.txt.gz"),
     "cut_late.txt.gz"),
    ("create_pretraining_data-vocab5-nested-output", "create_pretraining_data",
     CPD.replace("{F}/vocab.txt", "{F}/vocab5.txt").replace(
         "{W}/shard.tfrecord", "{W}/out/train"), "vocab5.txt"),
    ("verify-damaged-variables-index", "verify", "--export_dir={F}/export_bad_variables",
     "export_bad_variables/variables/variables.index"),
    ("verify-checkpoint-of-another-vocabulary", "verify",
     f"{VER} --init_checkpoint={{F}}/encoder_200_rows.keras", "exports/1/assets/vocab.txt"),
    ("export_encoder-vocab5-nested-export-dir", "export_encoder",
     EENC.replace("{W}/exp", "{W}/models/bert") + " --vocab_file={F}/vocab5.txt", "vocab5.txt"),
    # An output path under a file: one line naming it, before any work (the fine-tuning
    # tools used to train first and then fail in TensorBoard's writer with a traceback).
    *[(f"{tool}-output-under-a-file", tool, base.replace(out, "{F}/existing.txt/" + name),
       "existing.txt")
      for tool, base, out, name in (
          ("run_classifier", CLS, "{W}/out", "out"), ("run_tagger", TAG, "{W}/out", "out"),
          ("run_squad", SQ, "{W}/out", "out"), ("run_pretraining", PRE, "{W}/run", "run"),
          ("extract_features", EXT, "{W}/features.jsonl", "features.jsonl"),
          ("create_pretraining_data", CPD, "{W}/shard.tfrecord", "shard.tfrecord"),
          ("export_encoder", EENC, "{W}/exp", "exp"),
          ("convert_checkpoint", CONV, "{W}/hf", "hf"))],
    # Hub handles and web addresses given as paths (`files.unserved_scheme`).
    *_hub_cases("run_classifier", CLS, ["init_checkpoint", "vocab_file", "train_file",
                                        "output_dir", "label_list_file"]),
    *_hub_cases("run_regressor", CLS.replace("cls.jsonl", "rated.jsonl"), ["init_checkpoint"]),
    *_hub_cases("run_tagger", TAG, ["train_file", "init_checkpoint"]),
    *_hub_cases("run_squad", SQ, ["vocab_file", "train_file", "init_checkpoint"]),
    *_hub_cases("extract_features", EXT, ["input_file", "init_checkpoint", "output_file"]),
    *_hub_cases("run_pretraining", PRE, ["input_file", "bert_config_file", "init_checkpoint",
                                         "output_dir"]),
    *[case for fmt in ("google", "hf", "keras", "keras_hub", "model_garden", "tf_hub")
      for case in _hub_cases("convert_checkpoint", CONV.replace("--from=keras",
                                                                f"--from={fmt}"),
                             ["input"] * len(HUB_VALUES), f"-{fmt}")],
    *_hub_cases("convert_checkpoint", CONV, ["output", "bert_config_file"]),
    *_hub_cases("export_encoder", EENC, ["init_checkpoint", "vocab_file", "export_dir"]),
    *_hub_cases("export_classifier", ECLS, ["model_dir", "export_dir"]),
    *_hub_cases("export_regressor", ECLS, ["model_dir"]),
    *_hub_cases("export_tagger", ECLS, ["model_dir"]),
    *_hub_cases("export_span_qa", ECLS, ["model_dir"]),
    *_hub_cases("export_preprocessor", EPRE, ["vocab_file"]),
    *_hub_cases("verify", VER, ["export_dir", "init_checkpoint"]),
    *_hub_cases("build_vocab", VOC, ["input", "output"]),
    *_hub_cases("prepare_corpus", CORP, ["input", "output_file"]),
    *_hub_cases("create_pretraining_data", CPD, ["input_file", "vocab_file", "output_file"]),
    # One in a comma-separated list: a list flag (--input) and a string flag (--input_file).
    ("prepare_corpus-hub-in-a-list", "prepare_corpus",
     CORP.replace("{F}/text.txt", "{F}/text.txt,hf://google-bert/bert-base-uncased"),
     "--input: hf://google-bert/bert-base-uncased: "),
    ("create_pretraining_data-hub-in-a-list", "create_pretraining_data",
     CPD.replace("{F}/text.txt", "{F}/text.txt,https://example.com/corpus.txt"),
     "--input_file: https://example.com/corpus.txt: "),
]


def _argv(template, fixtures, work):
    return template.format(F=fixtures, W=work, TESTDATA=TESTDATA).split()


@pytest.mark.parametrize("case_id,tool,template,subject", CASES, ids=[c[0] for c in CASES])
def test_bad_input(fx, tmp_path, case_id, tool, template, subject):
    work = str(tmp_path / "work")
    os.makedirs(work)
    before_f, before_w = tree(fx), tree(work)
    result = run_tool(tool, _argv(template, fx, work))
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code != 0, (result.code, result.stderr, result.stdout)
    assert len(result.error_lines) == 1, result.stderr
    line = result.error_lines[0]
    assert subject.format(F=fx, W=work) in line, line
    assert tree(fx) == before_f, "the fixture directory changed"
    assert tree(work) == before_w, f"left behind: {sorted(set(tree(work)) - set(before_w))}"


def test_there_are_enough_cases():
    assert len(CASES) >= 190
    from cli_harness import TOOLS

    assert {c[1] for c in CASES} == set(TOOLS)  # every tool


@pytest.mark.parametrize("case_id", [
    "run_classifier-train_batch_size=0", "extract_features-binary", "run_pretraining-truncated"])
def test_subprocess_no_traceback(fx, tmp_path, case_id):
    """The same cases as separate processes: python -m <tool>, one line, no traceback."""
    from cli_harness import TOOLS

    _, tool, template, subject = next(c for c in CASES if c[0] == case_id)
    work = str(tmp_path / "work")
    os.makedirs(work)
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("BERT_KERAS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", TOOLS[tool], *_argv(template, fx, work)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and subject in errors[0], proc.stderr
    assert os.listdir(work) == []


@pytest.mark.parametrize("value", ["", "  "])
def test_a_required_flag_given_empty_is_refused_at_parsing(value):
    """absl's required flags take any value but None: `--export_dir=$OUT` with $OUT unset
    exported into the working directory (./1), convert_checkpoint `--output=` wrote
    model.safetensors there, build_vocab `--output=` blamed "/". `cli.mark_required`
    refuses the empty value as a flag error (status 2, before main)."""
    from absl import flags

    from data_prep import cli

    fv = flags.FlagValues()
    flags.DEFINE_string("export_dir", None, "a path", flag_values=fv)
    flags.DEFINE_list("input_file", None, "paths", flag_values=fv)
    flags.DEFINE_integer("vocab_size", None, "a number", flag_values=fv)
    cli.mark_required(["export_dir", "input_file", "vocab_size"], fv)
    fv(["tool", "--export_dir=e", "--input_file=a,b", "--vocab_size=0"])  # values: taken
    for empty, given in (("export_dir", [f"--export_dir={value}", "--input_file=a"]),
                         ("input_file", ["--export_dir=e", f"--input_file={value}"])):
        fv.unparse_flags()
        with pytest.raises(flags.IllegalFlagValueError) as e:
            fv(["tool", *given, "--vocab_size=3"])
        line = cli.flag_error_line(e.value)
        assert line.startswith(f"--{empty}="), line
        assert line.endswith("expected a value, got an empty one (an unset shell variable?)")


def test_an_empty_export_dir_writes_nothing_where_the_command_runs(fx, tmp_path):
    """`python -m export.export_encoder --export_dir=` exported into the working directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("BERT_KERAS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "export.export_encoder",
                           f"--init_checkpoint={fx}/encoder", "--export_dir=", "--seq_length=16"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=cwd)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == ("error: --export_dir=: expected a value, got an "
                                            "empty one (an unset shell variable?)"), proc.stderr
    assert os.listdir(cwd) == []


def test_accumulation_on_several_tensorflow_replicas_is_one_line(fx, tmp_path):
    """Keras 3.15.1 cannot accumulate gradients under tf.distribute with several replicas
    (run_pretraining's refusal, `distribute.accumulation_refusal`): refused before any
    input is read or output written. (A process of its own: the CPU is split into 2
    devices before TensorFlow starts.)"""
    from conftest import backend_env

    work = str(tmp_path / "work")
    os.makedirs(work)
    argv = _argv(f"{CLS} --distribution_strategy=mirrored --num_cpu_devices=2 "
                 "--gradient_accumulation_steps=2", fx, work)
    proc = subprocess.run([sys.executable, "-m", "bert_keras.run_classifier", *argv],
                          capture_output=True, text=True, env=backend_env("tensorflow"),
                          timeout=300, cwd=REPO)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1, proc.stderr
    assert "--gradient_accumulation_steps=2 works with one replica only on TensorFlow in " \
           "Keras 3.15.1 (here: 2)" in errors[0]
    assert os.listdir(work) == []


def test_debug_env_shows_the_traceback(fx, tmp_path):
    result = run_tool("extract_features", _argv(
        "--input_file={F}/missing.txt --output_file={W}/f.jsonl --init_checkpoint={F}/encoder",
        fx, str(tmp_path)), env={"BERT_KERAS_DEBUG": "1"})
    assert "Traceback" in result.stderr and result.code != 0


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    from data_prep import cli

    def bug():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        cli.report_errors(bug, ())


def test_ctrl_c_is_one_line_with_status_130_and_leaves_no_output(tmp_path):
    """Every tool printed a traceback of 30 to 130 lines on Ctrl-C (81 on a double one).
    prepare_corpus interrupted while it splits sentences: one line, status 130, no output."""
    import signal
    import time

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for k in range(80):  # about 4 s of sentence splitting on this machine
        (corpus / f"doc{k}.txt").write_text(" ".join(
            f"Sentence {i} of document {k} is here." for i in range(20_000)), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("BERT_KERAS_DEBUG", None)
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        # pytest-xdist's workers ignore SIGINT, and a child inherits that: Python then
        # installs no KeyboardInterrupt handler. A terminal's process has Python's own.
        start = ("import runpy, signal, sys; "
                 "signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "sys.argv[0] = 'prepare_corpus'; "
                 "runpy.run_module('data_prep.prepare_corpus', run_name='__main__')")
        proc = subprocess.Popen([sys.executable, "-c", start, f"--input={corpus}",
                                 f"--output_file={tmp_path / 'out' / 'c.txt'}"],
                                stderr=stderr, env=env, cwd=REPO)
        deadline = time.time() + 240
        while "reading 80 file(s)" not in log.read_text() and time.time() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    text = log.read_text()
    assert code == 130, text
    assert "Traceback" not in text and text.splitlines()[-1] == "error: interrupted (Ctrl-C)", text
    assert not (tmp_path / "out").exists()


def test_ctrl_c_reaches_the_debug_traceback(monkeypatch):
    from data_prep import cli

    def interrupted():
        raise KeyboardInterrupt

    assert cli.report_errors(interrupted) == 130
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(KeyboardInterrupt):
        cli.report_errors(interrupted)


# --- Valid edge cases that used to fail, and what a killed run leaves. ---


def test_squad_three_questions_with_batch_four_trains_and_predicts(fx, tmp_path):
    """Fewer training features than --train_batch_size: batches repeat examples (the data
    repeats before batching) instead of failing; prediction's last batch is partial."""
    from bert_keras import run_squad

    data = json.load(open(os.path.join(fx, "squad.json")))
    qas = [(p, q) for a in data["data"] for p in a["paragraphs"] for q in p["qas"]]
    keep = {id(q) for _, q in qas[:3]}
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            paragraph["qas"] = [q for q in paragraph["qas"] if id(q) in keep]
    path = _write(str(tmp_path / "three.json"), json.dumps(data))
    results = run_squad.run(train_file=path, predict_file=path, output_dir=str(tmp_path / "out"),
                            init_checkpoint=os.path.join(fx, "encoder"), do_train=True,
                            do_predict=True, max_seq_length=32, max_query_length=8,
                            doc_stride=16, train_batch_size=4, eval_batch_size=4,
                            num_train_steps=2, learning_rate=1e-3)
    assert results["train"]["num_train_steps"] == 2
    predictions = json.load(open(tmp_path / "out" / "predictions.json"))
    assert sorted(predictions) == sorted(str(q["id"]) for _, q in qas[:3])


def test_googles_fine_tuning_flags_are_taken_or_warned_about(fx, tmp_path, caplog):
    """Google's run_classifier / run_squad / extract_features flags that name no option here
    were refused as unknown. Its README's prediction command (a pretrained --init_checkpoint beside the
    fine-tuned model in --output_dir, training flags with --do_train=false) now runs:
    --predict_batch_size is the batch size, its TPU flags without --use_tpu are unused as in
    Google's scripts, and every flag not read is named in a warning."""
    def predict(out, flags):
        shutil.copytree(os.path.join(fx, "classifier"), out)
        result = run_tool("run_classifier", _argv(
            "--do_train=false --do_predict=true --predict_file={F}/cls.jsonl "
            "--vocab_file={F}/vocab.txt --bert_config_file={F}/bert_config.json "
            "--init_checkpoint={F}/encoder --max_seq_length=16 " + flags +
            f" --output_dir={out}", fx, str(tmp_path)))
        assert result.code == 0, result.stderr[-3000:]
        return json.load(open(out / "predict_results.json"))["made_from"]["flags"]

    with caplog.at_level("INFO"):
        used = predict(tmp_path / "out", "--train_batch_size=32 --learning_rate=2e-5 "
                       "--num_train_epochs=3.0 --predict_batch_size=3 --use_tpu=false "
                       "--tpu_name=grpc://t --iterations_per_loop=1000")
    assert used["eval_batch_size"] == 3
    assert "--tpu_name, --iterations_per_loop: not used" in caplog.text
    assert ("--train_batch_size, --learning_rate, --num_train_epochs: not used without "
            "--do_train") in caplog.text
    assert (f"--init_checkpoint {fx}/encoder is not used: it holds a BertEncoder, not a "
            "fine-tuned BertClassifier; running --output_dir's model.keras") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # Google's extract_features command with its TPU flags
        result = run_tool("extract_features", _argv(
            EXT + " --batch_size=8 --use_tpu=false --master=grpc://t --num_tpu_cores=8 "
            "--use_one_hot_embeddings=false", fx, str(tmp_path)))
    assert result.code == 0, result.stderr[-3000:]
    assert "--master, --num_tpu_cores: not used" in caplog.text
    assert "--use_one_hot_embeddings: not used" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # both batch sizes: --eval_batch_size serves both
        used = predict(tmp_path / "both", "--eval_batch_size=2 --predict_batch_size=3")
    assert used["eval_batch_size"] == 2
    assert "--predict_batch_size=3 is not used: prediction runs at --eval_batch_size=2" in \
        caplog.text


def test_googles_verbose_logging_is_named_unused(caplog):
    """run_squad's --verbose_logging (Google's: log each answer it cannot align) is taken
    and named in a warning, the other values left as they were."""
    from types import SimpleNamespace

    from bert_keras.finetuning import runner

    given = {"verbose_logging": SimpleNamespace(value=True, present=True)}
    holders = {"eval_batch_size": SimpleNamespace(value=8, present=False)}
    with caplog.at_level("WARNING"):
        values = runner.with_googles_flags({"eval_batch_size": 8}, given, holders, "run_squad")
    assert values == {"eval_batch_size": 8}
    assert "--verbose_logging: not used" in caplog.text


def test_one_class_is_accepted_with_its_flag(fx, tmp_path):
    result = run_tool("run_classifier", _argv(
        f"{CLS.replace('cls.jsonl', 'cls_one_class.jsonl')} --num_train_steps=1 "
        "--allow_single_class", fx, str(tmp_path)))
    assert result.code == 0, result.stderr
    assert open(tmp_path / "out" / "labels.txt").read() == "a\n"


GLUE = os.path.join(TESTDATA, "glue")


def _glue_test_rows(task: str, data_dir: str) -> list[list[str]]:
    """The rows of a task's test file, read here without the project's reader: every
    non-blank line after the header, split on tabs (XNLI: the Chinese rows, as Google's)."""
    name = {"mnli": "test_matched.tsv", "mnli-mm": "test_mismatched.tsv",
            "xnli": "xnli.test.tsv"}.get(task, "test.tsv")
    with open(os.path.join(data_dir, name), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()][1:]
    return [r for r in rows if r[0] == "zh"] if task == "xnli" else rows


# Two layouts in the default tier (pairs with 2 labels, 3 labels); the other layouts (a
# single sentence with CoLA's headerless train file, QQP's ids, XNLI's language filter) run
# with the integration tier (5-10 s each here).
@pytest.mark.parametrize("task,directory", [
    ("mrpc", "MRPC"), ("mnli-mm", "MNLI"),
    *[pytest.param(t, d, marks=pytest.mark.integration)
      for t, d in (("cola", "CoLA"), ("qqp", "QQP"), ("xnli", "XNLI"))]])
def test_glue_runs_write_googles_result_files(fx, tmp_path, task, directory):
    """--task_name with --do_eval --do_predict writes Google's eval_results.txt (key = value,
    keys sorted) and test_results.tsv (one row of class probabilities per test example, in
    input order) beside eval_results.json and predictions.jsonl."""
    data_dir, out = os.path.join(GLUE, directory), tmp_path / "out"
    result = run_tool("run_classifier", _argv(
        f"--task_name={task} --data_dir={data_dir} --init_checkpoint={{F}}/encoder "
        f"--max_seq_length=16 --train_batch_size=2 --num_train_steps=1 --do_train --do_eval "
        f"--do_predict --output_dir={out}", fx, str(tmp_path)))
    assert result.code == 0, result.stderr[-3000:]
    pairs = [line.split(" = ") for line in open(out / "eval_results.txt").read().splitlines()]
    assert [k for k, _ in pairs] == ["eval_accuracy", "eval_loss", "global_step", "loss"]
    google, ours = dict(pairs), json.load(open(out / "eval_results.json"))
    assert float(google["eval_accuracy"]) == pytest.approx(ours["accuracy"], abs=1e-7)
    assert float(google["eval_loss"]) == pytest.approx(ours["loss"], rel=1e-6)
    assert int(google["global_step"]) == 1 and np.isfinite(float(google["loss"]))
    labels = open(out / "labels.txt").read().splitlines()
    rows = [[float(v) for v in line.split("\t")]
            for line in open(out / "test_results.tsv").read().splitlines()]
    expected_rows = _glue_test_rows(task, data_dir)
    assert len(rows) == len(expected_rows) > 0
    assert all(len(r) == len(labels) and abs(sum(r) - 1) < 1e-5 for r in rows)
    predictions = [json.loads(line) for line in open(out / "predictions.jsonl")]
    for row, prediction in zip(rows, predictions):  # the same examples, in the same order
        assert row == pytest.approx([prediction["probabilities"][k] for k in labels], abs=1e-6)
    if task != "xnli":  # the test file's id column, row by row
        id_column = 0
        assert [p["id"] for p in predictions] == [r[id_column] for r in expected_rows]
    if task == "mrpc":  # evaluating that model again elsewhere: its steps, the same rows
        result = run_tool("run_classifier", _argv(
            f"--task_name={task} --data_dir={data_dir} --init_checkpoint={out} "
            f"--max_seq_length=16 --do_eval --do_predict --output_dir={tmp_path}/again", fx,
            str(tmp_path)))
        assert result.code == 0, result.stderr[-3000:]
        assert open(tmp_path / "again" / "eval_results.txt").read() == \
            open(out / "eval_results.txt").read()
        assert open(tmp_path / "again" / "test_results.tsv").read() == \
            open(out / "test_results.tsv").read()


def test_glue_eval_loss_is_the_mean_cross_entropy():
    from bert_keras.finetuning.classification import google_eval_text, mean_cross_entropy

    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]], np.float32)
    manual = [-np.log(np.exp(2) / (np.exp(2) + 1 + np.exp(-1))),
              -np.log(np.exp(0.5) / (2 * np.exp(0.5) + np.exp(3)))]
    assert mean_cross_entropy(logits, [0, 1]) == pytest.approx(np.mean(manual), rel=1e-12)
    assert google_eval_text({"loss": np.float32(1 / 3), "global_step": 7}) == \
        "global_step = 7\nloss = 0.33333334\n"  # Google's str() of a float32


def test_transformers_directory_with_tokenizer_json_only(fx, tmp_path):
    """transformers 5 saves tokenizer.json and no vocab.txt: --init_checkpoint=DIR takes
    the vocabulary from it (run_classifier, export_encoder), in id order."""
    tokens = sorted(json.load(open(os.path.join(fx, "hf", "tokenizer.json")))["model"]["vocab"]
                    .items(), key=lambda kv: kv[1])
    expected = "".join(f"{t}\n" for t, _ in tokens)
    assert not os.path.exists(os.path.join(fx, "hf", "vocab.txt"))
    result = run_tool("run_classifier", _argv(
        "--init_checkpoint={F}/hf --max_seq_length=16 --train_batch_size=4 --num_train_steps=1 "
        "--output_dir={W}/out --do_train --train_file={F}/cls.jsonl", fx, str(tmp_path)))
    assert result.code == 0, result.stderr[-3000:]
    assert open(tmp_path / "out" / "vocab.txt", encoding="utf-8").read() == expected
    result = run_tool("export_encoder", _argv(
        "--init_checkpoint={F}/hf --export_dir={W}/exp --seq_length=16", fx, str(tmp_path)))
    assert result.code == 0, result.stderr[-3000:]
    assets = tmp_path / "exp" / "1" / "assets"
    assert open(assets / "vocab.txt", encoding="utf-8").read() == expected


def test_vocabulary_mismatch_names_both_numbers_and_both_files(fx, tmp_path):
    """The issue's case: a transformers directory whose tokenizer.json holds 5 tokens for a
    79-row model converted without a word, and its export died in tensorflow-text."""
    for name, count in (("hf_tok5", 5), ("hf_tok_big", 91)):
        result = run_tool("convert_checkpoint", _argv(
            f"--from=hf --to=keras --input={{F}}/{name} --output={{W}}/k", fx, str(tmp_path)))
        (line,) = result.error_lines
        assert result.code == 1 and not os.path.exists(tmp_path / "k")
        assert os.path.join(fx, name, "tokenizer.json") in line
        model = f"model {os.path.join(fx, name)}"
        assert f"{model} " in line or f"{model};" in line, line
        assert f"{count} tokens" in line and "79 embedding rows" in line, line


def test_a_vocabulary_fits_from_90_percent_of_the_rows_to_all_of_them(fx, tmp_path):
    """A few embedding rows no token reaches are normal (tables padded for speed)."""
    from bert_keras import model_loading
    from bert_keras.encoder import BertEncoder

    tokens = open(os.path.join(fx, "vocab.txt"), encoding="utf-8").read().splitlines()
    encoder = BertEncoder(vocab_size=80, **SMALL)  # 90% of 80 rows = 72 tokens
    for count, fits in ((71, False), (72, True), (79, True), (80, True), (81, False)):
        path = _write(str(tmp_path / f"v{count}.txt"), "".join(
            f"{t}\n" for t in (tokens + ["extra1", "extra2"])[:count]))
        if fits:
            assert len(model_loading.check_vocab_fits(encoder, path)) == count
        else:
            with pytest.raises(model_loading.VocabMismatchError, match=f"{count} tokens"):
                model_loading.check_vocab_fits(encoder, path)
    result = run_tool("extract_features", _argv(
        f"{EXT} --vocab_file={{F}}/vocab_72.txt", fx, str(tmp_path)))  # 72 of 79 rows
    assert result.code == 0, result.stderr[-3000:]


def test_reading_names_the_file_a_library_could_not_read(tmp_path):
    from safetensors.numpy import load_file

    from data_prep import cli

    path = _write(str(tmp_path / "model.safetensors"), b"\xff" * 32, "wb")
    with pytest.raises(cli.DamagedFileError) as e:
        with cli.reading(path, "a safetensors file"):
            load_file(path)
    assert str(e.value).startswith(f"{path}: cannot be read as a safetensors file")
    assert "SafetensorError" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError):  # already names the path: unchanged
        with cli.reading(str(tmp_path / "nope"), "a safetensors file"):
            load_file(str(tmp_path / "nope"))
    with pytest.raises(cli.InputError, match="^--x: mine$"):  # the project's own: unchanged
        with cli.reading(path, "a file"):
            raise cli.InputError("--x", "mine")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_next_export_removes_a_killed_exports_temporary(tmp_path):
    """A killed export leaves `.incomplete-<pid>.<version>`; the next export (of any
    version) removes it once that process is gone, and keeps a live process's."""
    import tensorflow as tf

    from export import saved_model_writer

    base = tmp_path / "models"
    stale = base / f".incomplete-{_dead_pid()}.3"
    live = base / f".incomplete-{os.getppid()}.4"
    for d in (stale, live):
        os.makedirs(d / "variables")

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return {"y": x * 2.0}

    module = Module()
    path = saved_model_writer.version_dir(str(base), None)
    saved_model_writer.write_saved_model(module, path, {"serving_default":
                                                        module.serve.get_concrete_function()})
    assert sorted(os.listdir(base)) == [live.name, "1"]


def test_verify_checks_the_longest_input_against_the_position_table(tmp_path):
    from export.verify import Report, _check_lengths

    os.makedirs(tmp_path / "assets")
    _write(str(tmp_path / "assets" / "bert_config.json"), json.dumps(
        {"max_position_embeddings": 24}))
    for length, ok in ((24, True), (32, False)):
        report = Report(str(tmp_path))
        _check_lengths(report, str(tmp_path), [
            {"inputs": {"input_word_ids": [1, 8]}, "outputs": {}},
            {"inputs": {"input_word_ids": [2, length]}, "outputs": {}}])
        (check, passed, detail), = report.lines
        assert check == "lengths" and passed is ok, detail
        assert "24" in detail and str(length) in detail


def test_every_numeric_rule_names_its_flag():
    """Each parse-time check refuses a value just outside its range and accepts the edge;
    NaN is outside every range, infinity outside every range of a float flag."""
    from data_prep import cli

    for name, (test, expected) in cli.NUMERIC_FLAG_RULES.items():
        edge, outside = {"expected a finite value > 0": (1e-9, 0.0),
                         "expected an integer >= 1": (1, 0),
                         "expected a finite value >= 0": (0, -1),
                         "expected a value in [0, 1]": (1.0, 1.0001),
                         "expected a finite number": (-1e308, math.inf)}[expected]
        assert test(edge) and not test(outside), name
        assert not test(math.nan), name
        assert not test(math.inf) or expected == "expected an integer >= 1", name  # ints
