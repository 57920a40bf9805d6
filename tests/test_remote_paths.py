"""Remote file systems (gs:// on a Cloud TPU), probed through TensorFlow's in-process ram://.

ram:// is reached only through tf.io.gfile, as gs:// is, and holds its files in this
process: whatever went through open(), os or shutil instead failed, or wrote a local
directory literally named "ram:" (as it wrote "gs:" for a TPU user). Each test checks the
outputs on ram:// and that no such local directory appeared. Not run against GCS itself.

ram:// quirks the tests keep clear of: its exists/isdir match by name prefix, so a file
copied in after another whose name extends it ("x.tfrecord" after "x.tfrecord.meta.json")
is dropped silently (inputs are copied in sorted order), and tf.io.gfile.walk lists
"assets.extra/..." under "assets" as ".extra" (exports are checked by exact paths).
"""

import itertools
import json
import os
import random

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from cli_harness import run_tool
from conftest import TESTDATA
from pretraining_data import write_dataset

from bert_keras.run_pretraining import PretrainingOptions, train
from data_prep import files

S, P, VOCAB = 16, 4, 99
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_bucket = itertools.count()


@pytest.fixture
def ram(tmp_path, monkeypatch):
    """A fresh ram:// directory; the working directory is an empty local one, checked to
    stay empty (no "ram:" directory written through os or open)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    root = f"ram://bucket{next(_bucket)}"
    tf.io.gfile.makedirs(root)
    yield root
    assert os.listdir(cwd) == [], "a local directory was written for a ram:// path"


def _walk(root):
    return sorted(os.path.join(d, f)[len(root) + 1:] for d, _, names in tf.io.gfile.walk(root)
                  for f in names)


def _upload_dir(local, remote):
    for name in sorted(os.listdir(local)):
        tf.io.gfile.copy(os.path.join(local, name), f"{remote}/{name}", overwrite=True)


def _weights(path):
    with files.local_copy(path) as local, h5py.File(local, "r") as f:
        arrays = {}
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return arrays


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("remote_data")
    write_dataset(directory, num_files=2, per_file=8, max_seq_length=S,
                  max_predictions_per_seq=P, vocab_size=VOCAB)
    (directory / "vocab.txt").write_text(
        "".join(f"{t}\n" for t in SPECIALS + [f"tok{i}" for i in range(5, VOCAB)]))
    return directory


def _options(root, **overrides):
    values = dict(input_file=f"{root}/data/*.tfrecord", output_dir=f"{root}/run",
                  preset="tiny", vocab_file=f"{root}/data/vocab.txt", max_seq_length=S,
                  max_predictions_per_seq=P, train_batch_size=4, num_train_steps=6,
                  num_warmup_steps=0, save_checkpoints_steps=2, verbose=0, autotune=False,
                  seed=3)
    values.update(overrides)
    return PretrainingOptions(**values)


class _CrashAfterSecondInterval(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("simulated crash")


def test_open_input_and_atomic_output_on_a_remote_path(ram):
    """The helpers every tool writes and reads through: a remote output is staged locally
    and appears whole under its final name; an existing one is refused; a failed block
    leaves nothing; a text read goes through gfile (a BOM dropped, as locally)."""
    path = f"{ram}/out/notes.txt"
    files.write_text(path, "\ufeffalpha\nbeta\n")
    with files.open_input(path) as f:
        assert f.read() == "alpha\nbeta\n"
    with pytest.raises(files.OutputExistsError, match="notes.txt exists"):
        files.write_text(path, "other", overwrite=False)
    with pytest.raises(RuntimeError), files.atomic_output(f"{ram}/out/failed.txt") as tmp:
        open(tmp, "w").write("partial")
        raise RuntimeError("the writer failed")
    with files.atomic_output(f"{ram}/out/model", directory=True) as tmp:
        os.makedirs(os.path.join(tmp, "variables"))
        open(os.path.join(tmp, "variables", "v.data"), "w").write("1")
        open(os.path.join(tmp, "saved_model.pb"), "w").write("2")
    assert _walk(ram) == ["out/model/saved_model.pb", "out/model/variables/v.data",
                          "out/notes.txt"]
    assert files.isfile(path) and not files.isdir(path) and files.isdir(f"{ram}/out")


def test_create_pretraining_data_reads_and_writes_remote_paths(ram):
    """Corpus, vocabulary and output on ram://: the shards and sidecars appear there.
    Before: the vocabulary read as 'does not exist' (open())."""
    words = "the cat sat on a mat dog ran far away and then came back home to eat".split()
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 11))) + " ."
                      for _ in range(5)) for _ in range(4)]
    with tf.io.gfile.GFile(f"{ram}/in/corpus.txt", "w") as f:
        f.write("\n\n".join(docs) + "\n")
    with tf.io.gfile.GFile(f"{ram}/in/vocab.txt", "w") as f:
        f.write("\n".join(SPECIALS + sorted(set(words)) + ["."]) + "\n")
    result = run_tool("create_pretraining_data", [
        f"--input_file={ram}/in/corpus.txt", f"--vocab_file={ram}/in/vocab.txt",
        f"--output_file={ram}/data/train", "--num_output_shards=2", f"--max_seq_length={S}",
        "--max_predictions_per_seq=3", "--dupe_factor=2", "--num_examples_to_print=0"])
    assert result.code == 0, result.stderr[-2000:]
    assert _walk(f"{ram}/data") == [
        "train-00000-of-00002.tfrecord", "train-00000-of-00002.tfrecord.meta.json",
        "train-00001-of-00002.tfrecord", "train-00001-of-00002.tfrecord.meta.json"]
    sidecar = files.read_json(f"{ram}/data/train-00000-of-00002.tfrecord.meta.json")
    assert sidecar["vocab_file"] == f"{ram}/in/vocab.txt"
    records = sum(1 for _ in tf.data.TFRecordDataset(tf.io.gfile.glob(f"{ram}/data/*.tfrecord")))
    assert records == sum(files.read_json(f"{ram}/data/train-0000{i}-of-00002.tfrecord.meta.json")
                          ["shard"]["instances"] for i in range(2)) > 0
    again = run_tool("create_pretraining_data", [
        f"--input_file={ram}/in/corpus.txt", f"--vocab_file={ram}/in/vocab.txt",
        f"--output_file={ram}/data/train", "--num_output_shards=2", f"--max_seq_length={S}",
        "--max_predictions_per_seq=3", "--num_examples_to_print=0"])
    assert again.code == 1 and "pass --overwrite" in again.stderr


@pytest.mark.integration  # three short runs: about 25 s on 2 cores
def test_run_pretraining_on_remote_paths_resumes_and_phase_two_starts_from_it(
        ram, shards, tmp_path):
    """Input, vocabulary and output_dir on ram://: a run that crashes after its second
    interval resumes from its ram:// backup to the weights an uninterrupted local run
    ends with; a phase 2 takes the ram:// run as --init_checkpoint. Before: the outputs went
    to a local 'ram:' directory and Keras' CSVLogger failed at the end of every run."""
    _upload_dir(shards, f"{ram}/data")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(_options(ram), extra_callbacks=[_CrashAfterSecondInterval()])
    assert {"backup/latest.weights.h5", "checkpoints/ckpt-00000004.weights.h5"} <= set(
        _walk(f"{ram}/run"))
    train(_options(ram))
    listing = _walk(f"{ram}/run")
    assert "encoder/encoder.weights.h5" in listing and not any(
        name.startswith("backup/") for name in listing)
    assert len(tf.io.gfile.GFile(f"{ram}/run/history.csv").read().splitlines()) == 4
    train(_options(ram, input_file=f"{shards}/*.tfrecord", vocab_file=f"{shards}/vocab.txt",
                   output_dir=str(tmp_path / "reference")))
    resumed = _weights(f"{ram}/run/encoder/encoder.weights.h5")
    reference = _weights(str(tmp_path / "reference" / "encoder" / "encoder.weights.h5"))
    assert resumed.keys() == reference.keys()
    for name in reference:
        np.testing.assert_array_equal(resumed[name], reference[name], err_msg=name)
    result = run_tool("run_pretraining", [
        f"--input_file={ram}/data/*.tfrecord", f"--output_dir={ram}/phase2",
        f"--init_checkpoint={ram}/run", f"--max_seq_length={S}",
        f"--max_predictions_per_seq={P}", "--train_batch_size=4", "--num_train_steps=2",
        "--num_warmup_steps=0", "--save_checkpoints_steps=2"])
    assert result.code == 0, result.stderr[-2000:]
    assert "encoder/encoder.weights.h5" in _walk(f"{ram}/phase2")


@pytest.mark.integration  # pretraining, fine-tuning, two exports, verify: about 60 s
def test_fine_tuning_and_exports_read_and_write_remote_paths(ram, shards):
    """run_classifier with --init_checkpoint, data and --output_dir on ram://, then
    export_classifier from that ram:// model to a ram:// base directory, twice (the second
    is version 2), and verify of that base directory. Before: model.keras went to a local
    'ram:' directory, and export_classifier read that local copy."""
    _upload_dir(shards, f"{ram}/data")
    train(_options(ram, num_train_steps=2))
    with tf.io.gfile.GFile(f"{ram}/ft/train.jsonl", "w") as f:
        for i in range(21):
            f.write(f'{{"text": "tok{5 + i % 7} tok{9 + i % 5}", "label": "{"ab"[i % 2]}"}}\n')
    result = run_tool("run_classifier", [
        f"--train_file={ram}/ft/train.jsonl", f"--eval_file={ram}/ft/train.jsonl",
        f"--init_checkpoint={ram}/run", "--do_train", "--do_eval", f"--output_dir={ram}/cls",
        "--max_seq_length=12", "--train_batch_size=7", "--num_train_epochs=1"])
    assert result.code == 0, result.stderr[-2000:]
    listing = _walk(f"{ram}/cls")
    assert {"model.keras", "labels.txt", "vocab.txt", "eval_results.json"} <= set(listing)
    assert files.read_json(f"{ram}/cls/eval_results.json")["num_examples"] == 21
    for version in (1, 2):
        result = run_tool("export_classifier", [
            f"--model_dir={ram}/cls", f"--export_dir={ram}/models/cls", "--max_seq_length=12",
            "--length_buckets=12"])
        assert result.code == 0, result.stderr[-2000:]
        assert tf.io.gfile.exists(f"{ram}/models/cls/{version}/saved_model.pb")
        assert tf.io.gfile.exists(
            f"{ram}/models/cls/{version}/assets.extra/tf_serving_warmup_requests")
    with tf.io.gfile.GFile(f"{ram}/ft/lines.txt", "w") as f:
        f.write("tok5 tok9\ntok7 ||| tok8\n")
    result = run_tool("extract_features", [
        f"--input_file={ram}/ft/lines.txt", f"--init_checkpoint={ram}/run",
        f"--output_file={ram}/features.jsonl", "--max_seq_length=12", "--layers=-1"])
    assert result.code == 0, result.stderr[-2000:]
    with files.open_input(f"{ram}/features.jsonl") as f:
        lines = f.read().splitlines()
    assert len(lines) == 2 and '"token": "tok8"' in lines[1]
    # TensorFlow loads the export from where it was written (as TF Serving reads gs://).
    served = tf.saved_model.load(f"{ram}/models/cls/2")
    probabilities = served.signatures["serving_default"](text=tf.constant(["tok5 tok9"]))
    assert np.allclose(np.sum(probabilities["probabilities"].numpy(), axis=-1), 1.0, atol=1e-5)
    # verify loads the served version (2) in another process, from a local copy, and names
    # it as given. Before: "no such directory".
    result = run_tool("verify", [f"--export_dir={ram}/models/cls"])
    assert result.code == 0, result.stdout + result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == f"verify {ram}/models/cls/2" and lines[-1] == "  result: PASS", lines
    assert {line.split()[1] for line in lines[1:-1]} == {
        "ops", "load", "signatures", "warmup", "lengths", "session"}, lines


@pytest.fixture(scope="module")
def task_inputs(tmp_path_factory):
    """Local inputs of the fine-tuning tools' tests: test_run_finetune's small encoder
    (encoder.keras), its vocabulary, a CoNLL file and the SQuAD 2.0 test file."""
    from test_run_finetune import SMALL, VOCAB, write_conll

    from bert_keras import BertEncoder

    directory = tmp_path_factory.mktemp("remote_tasks")
    BertEncoder(**SMALL).save(str(directory / "encoder.keras"))
    write_conll(directory / "train.conll", 11, 0)
    for source in (VOCAB, os.path.join(TESTDATA, "ft_squad_v2.json")):
        tf.io.gfile.copy(source, str(directory / os.path.basename(source)))
    return directory


def _finetune_args(root, data, output_dir):
    return [f"--train_file={root}/{data}", f"--predict_file={root}/{data}",
            f"--init_checkpoint={root}/encoder.keras", f"--vocab_file={root}/ft_vocab.txt",
            "--do_train", "--do_predict", f"--output_dir={output_dir}", "--num_train_epochs=1"]


def _read_text(path):
    with files.open_input(path) as f:
        return f.read()


def _scores(output_dir):
    """eval_results.json without its timings."""
    return {k: v for k, v in files.read_json(f"{output_dir}/eval_results.json").items()
            if k not in ("eval_seconds", "eval_examples_per_second")}


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # two run_tagger runs and an export: about 30 s on 2 cores
def test_run_tagger_and_export_tagger_on_remote_paths(ram, task_inputs, tmp_path):
    """run_tagger with its data, --init_checkpoint, --vocab_file and --output_dir on
    ram:// predicts and evaluates as the same run on local files; export_tagger exports that
    ram:// model to a ram:// base directory, and the export tags as predictions.conll says."""
    from data_prep import tagging

    _upload_dir(task_inputs, f"{ram}/in")
    flags = ["--eval_file={}/train.conll", "--do_eval", "--max_seq_length=16",
             "--train_batch_size=5"]
    for root, out in ((f"{ram}/in", f"{ram}/tag"), (str(task_inputs), str(tmp_path / "tag"))):
        result = run_tool("run_tagger", _finetune_args(root, "train.conll", out)
                          + [flag.format(root) for flag in flags])
        assert result.code == 0, result.stderr[-2000:]
    assert {"model.keras", "labels.txt", "vocab.txt", "tokenizer_config.json",
            "predictions.conll", "eval_results.json", "predict_results.json"} <= set(
        _walk(f"{ram}/tag"))
    predicted = _read_text(f"{ram}/tag/predictions.conll")
    assert predicted == (tmp_path / "tag" / "predictions.conll").read_text()
    assert _scores(f"{ram}/tag") == _scores(str(tmp_path / "tag"))
    result = run_tool("export_tagger", [f"--model_dir={ram}/tag",
                                        f"--export_dir={ram}/models/tag", "--max_seq_length=16"])
    assert result.code == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == f"{ram}/models/tag/1"
    import tensorflow_text  # noqa: F401  (the export holds its ops)

    served = tf.saved_model.load(f"{ram}/models/tag/1")
    with files.local_copy(f"{ram}/tag/predictions.conll") as local:
        sentences = tagging.read_conll(local)
    got = served.signatures["serving_default"](
        text=tf.constant([" ".join(s.words) for s in sentences]))["tags"].numpy()
    compared = 0
    for row, sentence in enumerate(sentences):
        for exported, written in zip(got[row], sentence.tags):
            if exported:  # "": a word past --max_seq_length, which the export leaves untagged
                assert exported.decode() == written, (row, sentence)
                compared += 1
    assert compared > 20


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # two run_squad runs, a prediction and an export: about 40 s
def test_run_squad_and_export_span_qa_on_remote_paths(ram, task_inputs, tmp_path):
    """run_squad (SQuAD 2.0) with its data, --init_checkpoint and --output_dir on ram://
    writes the predictions, n-best, null odds and evaluation the same run writes locally;
    export_span_qa exports that ram:// model to ram://, and answers as run_squad predicts
    from it where every span is scored (n_best_size >= max_seq_length)."""
    _upload_dir(task_inputs, f"{ram}/in")
    data = "ft_squad_v2.json"
    flags = ["--do_eval", "--version_2_with_negative", "--max_seq_length=20", "--doc_stride=4",
             "--max_query_length=8", "--max_answer_length=6", "--train_batch_size=4"]
    for root, out in ((f"{ram}/in", f"{ram}/sq"), (str(task_inputs), str(tmp_path / "sq"))):
        result = run_tool("run_squad", _finetune_args(root, data, out) + flags)
        assert result.code == 0, result.stderr[-2000:]
    for name in ("predictions.json", "nbest_predictions.json", "null_odds.json"):
        assert files.read_json(f"{ram}/sq/{name}") == files.read_json(
            str(tmp_path / "sq" / name)), name
    assert _scores(f"{ram}/sq") == _scores(str(tmp_path / "sq"))
    result = run_tool("run_squad", [f"--predict_file={ram}/in/{data}",
                                    f"--init_checkpoint={ram}/sq", "--do_predict",
                                    f"--output_dir={ram}/every", "--n_best_size=20"])
    assert result.code == 0, result.stderr[-2000:]
    result = run_tool("export_span_qa", [f"--model_dir={ram}/sq",
                                         f"--export_dir={ram}/models/sq"])
    assert result.code == 0, result.stderr[-2000:]
    import tensorflow_text  # noqa: F401  (the export holds its ops)

    served = tf.saved_model.load(result.stdout.strip().splitlines()[-1])
    paragraphs = files.read_json(f"{ram}/in/{data}")["data"][0]["paragraphs"]
    asked = [(qa["id"], qa["question"], p["context"]) for p in paragraphs for qa in p["qas"]]
    got = served.signatures["serving_default"](
        question=tf.constant([q for _, q, _ in asked]),
        context=tf.constant([c for _, _, c in asked]))
    want = files.read_json(f"{ram}/every/predictions.json")
    assert [a.decode() for a in got["answer"].numpy()] == [want[i] for i, _, _ in asked]


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # two run_regressor runs and an export: about 40 s on 2 cores
def test_run_regressor_and_export_regressor_on_remote_paths(ram, task_inputs, tmp_path):
    """run_regressor with its data, --init_checkpoint, --vocab_file and --output_dir on
    ram:// predicts and evaluates as the same run on local files; export_regressor exports
    that ram:// model to a ram:// base directory, and the export scores the texts as
    predictions.jsonl says."""
    import shutil

    from test_regression import write_rated

    local = tmp_path / "in"
    shutil.copytree(task_inputs, local)
    write_rated(local / "rated.jsonl", 13, 3)
    _upload_dir(local, f"{ram}/in")
    flags = ["--eval_file={}/rated.jsonl", "--do_eval", "--label_column=score",
             "--max_seq_length=14", "--train_batch_size=5"]
    for root, out in ((f"{ram}/in", f"{ram}/reg"), (str(local), str(tmp_path / "reg"))):
        result = run_tool("run_regressor", _finetune_args(root, "rated.jsonl", out)
                          + [flag.format(root) for flag in flags])
        assert result.code == 0, result.stderr[-2000:]
    assert {"model.keras", "vocab.txt", "tokenizer_config.json", "predictions.jsonl",
            "eval_results.json", "predict_results.json"} <= set(_walk(f"{ram}/reg"))

    def predicted(output_dir):  # the scores, without "where" (which names the input file)
        return [json.loads(line)["score"]
                for line in _read_text(f"{output_dir}/predictions.jsonl").splitlines()]

    scores = predicted(f"{ram}/reg")
    assert len(scores) == 13 and len(set(scores)) > 1
    assert scores == predicted(str(tmp_path / "reg"))
    assert _scores(f"{ram}/reg") == _scores(str(tmp_path / "reg"))
    result = run_tool("export_regressor", [f"--model_dir={ram}/reg",
                                           f"--export_dir={ram}/models/reg",
                                           "--max_seq_length=14"])
    assert result.code == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == f"{ram}/models/reg/1"
    import tensorflow_text  # noqa: F401  (the export holds its ops)

    served = tf.saved_model.load(f"{ram}/models/reg/1")
    texts = [json.loads(line)["text"] for line in _read_text(f"{ram}/in/rated.jsonl").splitlines()]
    got = served.signatures["serving_default"](text=tf.constant(texts))["score"].numpy()
    np.testing.assert_allclose(got, scores, atol=2e-6)  # predictions.jsonl: 6 decimals


@pytest.mark.integration  # an export and verify's fresh processes: about 10 s on 2 cores
def test_verify_compares_an_encoder_export_with_a_remote_checkpoint(ram, task_inputs):
    """export_encoder from a ram:// checkpoint to a ram:// base directory, then verify with
    --init_checkpoint on ram:// too: the parity check loads the remote checkpoint (verify
    itself runs on a local copy of the export) and passes."""
    _upload_dir(task_inputs, f"{ram}/in")
    result = run_tool("export_encoder", [f"--init_checkpoint={ram}/in/encoder.keras",
                                         f"--vocab_file={ram}/in/ft_vocab.txt",
                                         f"--export_dir={ram}/models/enc", "--seq_length=11"])
    assert result.code == 0, result.stderr[-2000:]
    result = run_tool("verify", [f"--export_dir={ram}/models/enc",
                                 f"--init_checkpoint={ram}/in/encoder.keras"])
    assert result.code == 0, result.stdout + result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == f"verify {ram}/models/enc/1" and lines[-1] == "  result: PASS", lines
    assert [line.split()[1] for line in lines[1:-1]][-1] == "parity", lines


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # one export: about 25 s on 2 cores
def test_export_preprocessor_reads_a_remote_vocabulary_and_writes_a_remote_export(
        ram, task_inputs):
    """export_preprocessor with --vocab_file (and its tokenizer_config.json, cased) and
    --export_dir on ram://: the export tokenizes as the tokenizer built from the same local
    files (cased: "John" is [UNK] in this uncased vocabulary, "john" is not)."""
    import tensorflow_text  # noqa: F401  (the export holds its ops)

    from data_prep import tokenizer_config
    from data_prep.tokenization import BertTokenizer

    cased = tokenizer_config.TokenizerConfig(do_lower_case=False)
    tf.io.gfile.makedirs(f"{ram}/vocab")
    tf.io.gfile.copy(str(task_inputs / "ft_vocab.txt"), f"{ram}/vocab/vocab.txt")
    tokenizer_config.write_for_vocab(f"{ram}/vocab/vocab.txt", cased)
    result = run_tool("export_preprocessor", [f"--vocab_file={ram}/vocab/vocab.txt",
                                              f"--export_dir={ram}/models/pre",
                                              "--seq_length=9"])
    assert result.code == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == f"{ram}/models/pre/1"
    assert files.read_json(f"{ram}/models/pre/1/assets/tokenizer_config.json")[
        "do_lower_case"] is False
    texts = ["John went to the store", "john bought milk"]
    served = tf.saved_model.load(f"{ram}/models/pre/1")
    ids = served.signatures["serving_default"](text=tf.constant(texts))["input_word_ids"]
    reference = BertTokenizer.from_config(str(task_inputs / "ft_vocab.txt"), cased)
    want = [[2, *row, 3] + [0] * (9 - 2 - len(row)) for row in reference.encode(texts)]
    assert ids.numpy().tolist() == want
    assert want[0][1] == 1 and want[1][1] != 1  # cased: "John" is [UNK]


def _files_under(root):
    """{relative path: bytes} of every file under `root`, local or remote."""
    return {os.path.join(d, f)[len(root) + 1:]: files.read_bytes(os.path.join(d, f))
            for d, _, names in tf.io.gfile.walk(root) for f in names}


def test_convert_checkpoint_round_trips_on_remote_paths_as_locally(ram, shards, tmp_path):
    """keras -> google -> keras and keras -> hf -> keras with every --input, --output and
    --bert_config_file on ram://: the same files as the same conversions on local paths
    (the checkpoint, configs, vocabulary and its casing), the weights back bit-exact; an
    existing remote output is refused in one line. Before: each was refused in one line."""
    from conftest import assert_models_equal
    from test_convert_checkpoint import random_pretrainer

    from bert_keras import model_loading
    from data_prep import tokenizer_config

    encoder = random_pretrainer(seed=5).encoder
    model_loading.save_encoder_dir(encoder, str(tmp_path / "enc"), str(shards / "vocab.txt"),
                                   tokenizer_config.TokenizerConfig(do_lower_case=False))
    _upload_dir(tmp_path / "enc", f"{ram}/enc")
    steps = [("keras", "google", "enc", "g/", []),
             ("google", "keras", "g/bert_model.ckpt", "back_g", []),
             ("keras", "hf", "enc", "hf", []),
             ("hf", "keras", "hf", "back_hf", [])]
    for root in (ram, str(tmp_path)):
        for source, target, given, output, extra in steps:
            result = run_tool("convert_checkpoint", [
                f"--from={source}", f"--to={target}", f"--input={root}/{given}",
                f"--output={root}/{output}", *extra])
            assert result.code == 0, result.stderr[-2000:]
    # A Google checkpoint read with its bert_config.json elsewhere on ram://.
    tf.io.gfile.makedirs(f"{ram}/bare")
    for name in ("bert_model.ckpt.data-00000-of-00001", "bert_model.ckpt.index"):
        tf.io.gfile.copy(f"{ram}/g/{name}", f"{ram}/bare/{name}")
    tf.io.gfile.copy(f"{ram}/g/bert_config.json", f"{ram}/config/bert.json")
    result = run_tool("convert_checkpoint", [
        "--from=google", "--to=keras", f"--input={ram}/bare/bert_model.ckpt",
        f"--bert_config_file={ram}/config/bert.json", f"--output={ram}/bare.keras"])
    assert result.code == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith(f"as keras: {ram}/bare.keras")
    for output in ("g", "back_g", "hf", "back_hf"):
        remote, local = _files_under(f"{ram}/{output}"), _files_under(str(tmp_path / output))
        assert remote.keys() == local.keys(), output
        for name in remote:
            if not name.endswith(".h5"):  # h5py's files record their own creation
                assert remote[name] == local[name], (output, name)
    assert files.read_json(f"{ram}/back_hf/tokenizer_config.json")["do_lower_case"] is False
    for output in ("back_g", "back_hf", "bare.keras"):
        assert_models_equal(encoder, model_loading.load_checkpoint(
            f"{ram}/{output}", fmt="keras").model)
    again = run_tool("convert_checkpoint", ["--from=keras", "--to=google", f"--input={ram}/enc",
                                            f"--output={ram}/g/"])
    assert again.code == 1 and again.error_lines == [
        f"error: refusing to overwrite existing output: {ram}/g/bert_model.ckpt.index"], \
        again.stderr


def test_multi_worker_backups_are_cleaned_up_on_remote_paths(ram):
    """remove_backups at the end of a multi-worker run with --output_dir on ram://: each
    non-chief process removes its own workers/<name>/, and the last one workers/ itself;
    another worker's backups stay until it ends. Before: the empty directories stayed
    (os.rmdir of a remote path)."""
    import types

    from bert_keras import backup

    run = f"{ram}/run"
    workers = {name: types.SimpleNamespace(is_chief=False, worker_name=name)
               for name in ("worker-1", "worker-2")}
    for distribution in workers.values():
        files.write_text(os.path.join(backup.process_backup_dir(run, distribution),
                                      "latest.weights.h5"), "weights")
    files.write_text(f"{run}/history.csv", "epoch\n")
    backup.remove_backups(run, workers["worker-1"])
    assert _walk(run) == ["history.csv", "workers/worker-2/backup/latest.weights.h5"]
    assert files.listdir(f"{run}/workers") == ["worker-2"]
    backup.remove_backups(run, workers["worker-2"])
    assert files.listdir(run) == ["history.csv"]


def test_a_damaged_remote_weights_file_is_named_as_given(ram):
    """A remote .weights.h5 is read from a local copy; the error names the gs:// file the
    user gave, not the copy's temporary path. Before: 'no such weights file'."""
    import json

    from bert_keras import model_loading

    config = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=24, max_position_embeddings=S, hidden_act="gelu",
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, type_vocab_size=2,
                  initializer_range=0.02)
    with tf.io.gfile.GFile(f"{ram}/enc/bert_config.json", "w") as f:
        f.write(json.dumps(config))
    with tf.io.gfile.GFile(f"{ram}/enc/encoder.weights.h5", "wb") as f:
        f.write(b"not HDF5 at all")
    with pytest.raises(model_loading.CheckpointError) as caught:
        model_loading.load_checkpoint(f"{ram}/enc/encoder.weights.h5")
    assert str(caught.value).startswith(
        f"{ram}/enc/encoder.weights.h5: cannot read the weights file"), str(caught.value)
    assert "bert-keras-download-" not in str(caught.value)
