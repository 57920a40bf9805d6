"""Paths users really have: spaces, Hangul, glob characters ("run [1]"), braces, "%", "~"
in a flag and symbolic links, through the shared path handling (data_prep/files.py,
data_prep/cli.py) and the readers that used to miss such paths.

The end-to-end run of every stage at such a path is `test_the_pipeline_runs_where_users_keep_it`
(integration: the quickstart's fixture run, about 2.5 min on 2 cores).
"""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_harness import run_tool
from conftest import REPO, TINY

from data_prep import cli, files

# A directory as users name them: spaces, Hangul, a "[1]" (a glob character class), braces
# and a percent sign.
ODD = os.path.join("작업 공간", "run [1] {v2} 100%")
# Glob's other characters: "*" and "?" in a directory's name, beside "[2]".
STARRED = os.path.join("a*b", "q?x run [2]")


def _touch(path, text="x\n"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


@pytest.fixture
def odd(tmp_path):
    """tmp_path/작업 공간/run [1] {v2} 100%/ with a.txt, b.txt and c.md, beside "run 1 {v2}
    100%"/x.txt, the directory that "[1]" read as a character class names."""
    root = tmp_path / ODD
    for name in ("a.txt", "b.txt", "c.md"):
        _touch(root / name, f"{name} one.\n\n{name} two.\n")
    _touch(tmp_path / "작업 공간" / "run 1 {v2} 100%" / "x.txt")
    return root


def test_a_path_that_exists_is_read_as_written_and_only_the_rest_globs(odd, tmp_path):
    """Python's glob read "run [1]" as "run 1": the file named as it is matched nothing, and
    "run [1]/*.txt" listed the other directory's x.txt."""
    as_written = lambda p: sorted(glob.glob(files.glob_as_written(str(p))))  # noqa: E731
    assert as_written(odd / "a.txt") == [str(odd / "a.txt")]
    assert as_written(odd / "*.txt") == [str(odd / "a.txt"), str(odd / "b.txt")]
    assert as_written(odd / "[ab].*") == [str(odd / "a.txt"), str(odd / "b.txt")]
    # No leading part exists as written: the whole pattern still globs.
    other = tmp_path / "작업 공간" / "run [12] {v2} 100%" / "*.txt"
    assert as_written(other) == [str(tmp_path / "작업 공간" / "run 1 {v2} 100%" / "x.txt")]
    assert files.glob_as_written("plain/path.txt") == "plain/path.txt"
    # Another file system's existence test decides there (gs://, through its own call).
    seen = []
    exists = lambda p: seen.append(p) or p == "gs://b/run [1]"  # noqa: E731
    assert files.glob_as_written("gs://b/run [1]/x-*.tfrecord", exists) == \
        "gs://b/run [[]1]/x-*.tfrecord"
    assert seen == ["gs://b/run [1]/x-*.tfrecord", "gs://b/run [1]"]


def test_every_input_expander_reads_a_directory_with_glob_characters(odd):
    from data_prep import build_vocab, features, prepare_corpus

    a, b = str(odd / "a.txt"), str(odd / "b.txt")
    listed = f"{a}, {b}"
    assert features.expand_input_files(listed) == [a, b]
    assert features.expand_input_files(str(odd / "*.txt")) == [a, b]
    assert prepare_corpus.expand_inputs(listed) == [a, b]
    assert prepare_corpus.expand_inputs(str(odd / "?.txt")) == [a, b]
    assert build_vocab.resolve_inputs([a, str(odd / "*.txt")]) == [a, b]
    with pytest.raises(ValueError, match=r"run \[1\] \{v2\} 100%/nothing\*' matches no data"):
        features.expand_input_files(str(odd / "nothing*"))


def test_beam_expands_counts_and_deletes_in_a_directory_with_glob_characters(odd, tmp_path):
    """Beam's match and delete read "[1]" as a character class: the inputs were not found,
    their bytes counted 0, and a finished job's temporary summary stayed behind. Its local
    match does not follow a linked directory below the escaped part ("run [1]/shared ->
    /data/corpus"), which Python's glob, as the local tool, does."""
    pytest.importorskip("apache_beam")
    from data_prep import beam_pipeline

    a, b = str(odd / "a.txt"), str(odd / "b.txt")
    assert beam_pipeline.expand_input_files(f"{a},{odd / '*.txt'}") == [a, b]
    assert beam_pipeline._input_bytes([a, b]) == os.path.getsize(a) + os.path.getsize(b) > 0
    shared = _touch(tmp_path / "data" / "corpus.txt", "Shared text.\n\nMore.\n")
    (odd / "shared").symlink_to(tmp_path / "data")
    assert beam_pipeline.expand_input_files(str(odd / "shared" / "*.txt")) == [
        str(odd / "shared" / "corpus.txt")]
    assert beam_pipeline._input_bytes([str(odd / "shared" / "corpus.txt")]) == \
        os.path.getsize(shared)
    temp = _touch(odd / ".incomplete-1.out.summary.json")
    beam_pipeline._delete_quietly([temp])
    assert not os.path.exists(temp) and os.path.exists(a)


def test_a_star_and_a_question_mark_in_a_directory_are_read_as_written(tmp_path):
    """"a*b/q?x" beside "aXb/qYx": the expanders read the directory named as it is (a star
    matched every sibling, a question mark any one character)."""
    from data_prep import build_vocab, features, prepare_corpus

    starred = tmp_path / STARRED
    a = _touch(starred / "a.txt", "One.\n\nTwo.\n")
    _touch(tmp_path / "aXb" / "q?x run [2]" / "a.txt")
    _touch(tmp_path / "a*b" / "qYx run [2]" / "a.txt")
    for pattern in (a, str(starred / "*.txt"), str(starred / "?.txt")):
        assert features.expand_input_files(pattern) == [a]
        assert prepare_corpus.expand_inputs(pattern) == [a]
        assert build_vocab.resolve_inputs([pattern]) == [a]


@pytest.mark.parametrize("where", [ODD, STARRED], ids=["brackets", "star_and_question_mark"])
def test_tensorflow_reads_a_checkpoint_under_glob_characters_only_through_an_alias(tmp_path,
                                                                                  where):
    """TensorFlow finds `<prefix>.index` by a glob: under "run [1]" it found nothing (and so
    tf.saved_model.load and TF Serving fail there). `files.glob_free` gives a link without
    glob characters, gone when the block ends."""
    import tensorflow as tf

    directory = tmp_path / where
    directory.mkdir(parents=True)
    prefix = str(directory / "ckpt")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["w"], shape_and_slices=[""],
                      tensors=[tf.constant([1.5, -2.0, 3.25])])
    with pytest.raises(Exception, match="Failed to find any matching files"):
        tf.train.load_checkpoint(prefix)
    with files.glob_free(prefix) as readable:
        assert not glob.has_magic(readable) and readable != prefix
        np.testing.assert_array_equal(tf.train.load_checkpoint(readable).get_tensor("w"),
                                      [1.5, -2.0, 3.25])
        alias_dir = os.path.dirname(os.path.dirname(readable))
    assert not os.path.exists(alias_dir)
    with files.glob_free(str(tmp_path / "plain")) as same:  # nothing to alias
        assert same == str(tmp_path / "plain")


def test_an_export_where_tensorflow_cannot_load_it_says_so(tmp_path, caplog):
    from export.saved_model_writer import warn_if_unloadable_where_it_is

    warn_if_unloadable_where_it_is(str(tmp_path / "models" / "spam" / "1"))
    assert not caplog.records
    warn_if_unloadable_where_it_is(str(tmp_path / ODD / "spam" / "1"))
    [record] = caplog.records
    assert record.levelname == "WARNING" and record.getMessage().startswith(
        f"{tmp_path / ODD / 'spam' / '1'}: TensorFlow cannot load a SavedModel from a path "
        "holding '[', '*' or '?'")


@pytest.mark.parametrize("where", [ODD, STARRED], ids=["brackets", "star_and_question_mark"])
def test_a_google_checkpoint_round_trips_under_glob_characters(tmp_path, where):
    """save_google_checkpoint reads its checkpoint back to verify it: under "run [1]" that
    read failed ("cannot read TF checkpoint index"), and no Google checkpoint there loaded."""
    from bert_keras import BertEncoder
    from bert_keras.checkpoints import save_google_checkpoint
    from bert_keras.model_loading import load_checkpoint

    encoder = BertEncoder(**TINY)
    rng = np.random.default_rng(3)
    encoder.set_weights([rng.normal(0, 0.2, w.shape).astype(np.float32)
                         for w in encoder.get_weights()])
    prefix = save_google_checkpoint(encoder, str(tmp_path / where) + "/")
    assert prefix == str(tmp_path / where / "bert_model.ckpt")
    loaded = load_checkpoint(prefix, fmt="google").model
    for x, y in zip(encoder.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=x.path)


def test_a_directory_output_that_is_a_link_is_written_where_it_points(tmp_path):
    """`--output=models/hf` with models/hf a link to a directory on another disk: the
    rename replaced the link with a new directory, and the linked one stayed empty."""
    target = tmp_path / "big disk" / "hf [1]"
    target.mkdir(parents=True)
    link = tmp_path / "hf link"
    link.symlink_to(target)
    with files.atomic_output(str(link), overwrite=True, directory=True) as tmp:
        _touch(os.path.join(tmp, "config.json"), "{}\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert sorted(os.listdir(target)) == ["config.json"]
    assert sorted(os.listdir(tmp_path)) == ["big disk", "hf link"]  # no temporary left


def test_a_tilde_in_a_path_flag_is_the_home_directory(tmp_path, monkeypatch):
    """absl keeps `--output_file=~/x` as typed (so did Google's tools, through tf.io.gfile):
    the tool wrote into a directory named "~" in the working directory. Every tool now
    expands it, as a shell does, and refuses an unknown ~user in one line."""
    home, cwd = tmp_path / "home 집", tmp_path / "cwd"
    cwd.mkdir()
    _touch(home / "corpus [1]" / "doc.txt", "One sentence here. Another one there.\n")
    monkeypatch.chdir(cwd)
    result = run_tool("prepare_corpus", ["--input=~/corpus [1]/doc.txt",
                                         "--output_file=~/out/train.txt"],
                      env={"HOME": str(home)})
    assert result.code == 0, result.stderr
    assert (home / "out" / "train.txt").read_text(encoding="utf-8").count("\n") >= 2
    assert os.listdir(cwd) == []
    refused = run_tool("prepare_corpus", [f"--input={home}/corpus [1]/doc.txt",
                                          "--output_file=~no_such_user_9x/train.txt"])
    assert refused.code == 2 and refused.error_lines == [
        "error: --output_file: ~no_such_user_9x/train.txt: cannot expand ~no_such_user_9x "
        "(no such user or no home directory); write the path in full"]
    assert os.listdir(cwd) == []


def test_only_path_flags_given_on_the_command_line_are_expanded(monkeypatch):
    from absl import flags

    monkeypatch.setenv("HOME", "/home/사용자")
    fv = flags.FlagValues()
    flags.DEFINE_list("input", None, "", flag_values=fv)
    flags.DEFINE_string("input_file", None, "", flag_values=fv)
    flags.DEFINE_string("text_field", "text", "", flag_values=fv)
    flags.DEFINE_string("vocab_file", "~/default.txt", "", flag_values=fv)
    fv(["tool", "--input=~/a.txt,b.txt", "--input_file=~/x-*.tfrecord, ~/y.tfrecord",
        "--text_field=~/kept"])
    cli.expand_home_in_path_flags(fv)
    assert fv.input == ["/home/사용자/a.txt", "b.txt"]
    assert fv.input_file == "/home/사용자/x-*.tfrecord,/home/사용자/y.tfrecord"
    assert fv.text_field == "~/kept"  # not a path flag
    assert fv.vocab_file == "~/default.txt"  # not given: a default is the tool's own


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # the quickstart's fixture run: ~2.5 min on 2 cores, per place
@pytest.mark.parametrize("where", [ODD, STARRED], ids=["brackets", "star_and_question_mark"])
def test_the_pipeline_runs_where_users_keep_it(tmp_path, where):
    """Every stage of the demo (prepare_corpus, build_vocab, create_pretraining_data,
    run_pretraining, run_classifier, the three exports, export.verify and the served
    classifier) with every input and output under "작업 공간/run [1] {v2} 100%/" (or
    "a*b/q?x run [2]/"), the workdir given with a trailing slash. Before, prepare_corpus
    found none of the files named as they are, and export.verify could not load the
    exports."""
    from test_quickstart import FIXTURE_CORPUS, _write_labeled

    root = tmp_path / where
    corpus = root / "corpus [src]"
    corpus.mkdir(parents=True)
    for name in sorted(os.listdir(FIXTURE_CORPUS)):
        with open(os.path.join(FIXTURE_CORPUS, name), encoding="utf-8") as f:
            _touch(corpus / name, f.read())
    _write_labeled(root / "train {a}.jsonl", 32, seed=1)
    _write_labeled(root / "test {b}.jsonl", 8, seed=2)
    work = root / "quick start"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "quickstart.py"), f"--workdir={work}/",
         f"--corpus_dir={corpus}", f"--labeled_train={root / 'train {a}.jsonl'}",
         f"--labeled_test={root / 'test {b}.jsonl'}", "--preset=tiny", "--vocab_size=1200",
         "--max_seq_length=32", "--batch_size=8", "--pretrain_steps=4", "--finetune_epochs=1"],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("result: PASS") == 3
    assert "predictions match the gold label" in proc.stdout
    # The echoed commands are quoted as a shell needs them.
    assert f"'--output_dir={work}/pretrain'" in proc.stdout
    record = json.loads((work / "pretrain" / "eval_results.json").read_text())
    assert record["global_step"] == 4
    for model in ("bert_encoder", "bert_preprocess", "classifier"):
        assert (work / "models" / model / "1" / "saved_model.pb").exists()
    assert not any(name.startswith(".incomplete-") for _, _, names in os.walk(root)
                   for name in names)
    # Stock TF Serving's TensorFlow (2.12) answers as this one, each loading the export
    # through `files.glob_free` (TensorFlow cannot load it from "run [1]/" itself).
    from conftest import tf212_python

    python = tf212_python()
    if python is None:
        pytest.skip("no tensorflow 2.12.1 interpreter (set BERT_KERAS_TF212_PYTHON)")
    code = ("import json, sys\n"
            "import tensorflow as tf, tensorflow_text\n"
            "out = tf.saved_model.load(sys.argv[1]).signatures['serving_default'](\n"
            "    text=tf.constant(json.loads(sys.argv[2])))\n"
            "print(json.dumps(out['probabilities'].numpy().tolist()))\n")
    texts = ["Win a FREE bridge now!!!", "Lunch on Friday? Tell me about the garden plan."]
    with files.glob_free(str(work / "models" / "classifier" / "1")) as loadable:
        old = subprocess.run([python, "-c", code, loadable, json.dumps(texts)],
                             capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert old.returncode == 0, old.stderr[-2000:]
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the text ops)

        here = tf.saved_model.load(loadable).signatures["serving_default"](
            text=tf.constant(texts))["probabilities"].numpy()
    np.testing.assert_allclose(json.loads(old.stdout.splitlines()[-1]), here, atol=1e-5)


def test_a_comma_in_a_file_name_is_that_file_unless_its_parts_exist_too(tmp_path, monkeypatch):
    """`files.split_patterns`' one rule: "corpus,2024.txt" that exists is that file; its
    parts, when they exist too, make it ambiguous; a value naming no path is a list."""
    monkeypatch.chdir(tmp_path)  # "<dir>/corpus,2024.txt" is "<dir>/corpus" and "2024.txt"
    whole = _touch(tmp_path / "corpus,2024.txt")
    a, b = str(tmp_path / "corpus"), "2024.txt"
    assert files.split_patterns(whole) == [whole]
    # Only a whole value is one path: beside another item it is split as a list.
    assert files.split_patterns([f"{whole},x*.txt"]) == [str(tmp_path / "corpus"), "2024.txt",
                                                         "x*.txt"]
    _touch(a)
    assert files.split_patterns(whole) == [whole]  # 2024.txt does not exist: the file
    _touch(tmp_path / b)
    with pytest.raises(files.AmbiguousPathListError,
                       match=r"corpus,2024.txt' is an existing file and also a list of "
                             r"existing files .*rename one of them"):
        files.split_patterns(whole)
    os.remove(whole)
    assert files.split_patterns(whole) == [a, b]


def test_every_list_flag_reads_a_file_with_a_comma_in_its_name(tmp_path, monkeypatch):
    """absl's list flags (build_vocab's and prepare_corpus's --input) split at the comma and
    the string ones (create_pretraining_data's --input_file) were split by the readers: the
    file "corpus,2024.txt" was "matches no file"."""
    from conftest import TESTDATA

    text = ("The man went to the store.\nHe bought milk there.\n\n"
            "John was born in the city.\nThe city is big.\n")
    corpus = _touch(tmp_path / "in" / "corpus,2024.txt", text)
    vocab = os.path.join(TESTDATA, "ft_vocab.txt")
    out = tmp_path / "out"
    runs = [("prepare_corpus", [f"--input={corpus}", f"--output_file={out}/corpus.txt"]),
            ("build_vocab", [f"--input={corpus}", f"--output={out}/vocab/vocab.txt",
                             "--vocab_size=110", "--layout=compact"]),
            ("create_pretraining_data", [f"--input_file={corpus}", f"--vocab_file={vocab}",
                                         f"--output_file={out}/shard.tfrecord",
                                         "--max_seq_length=16", "--max_predictions_per_seq=4",
                                         "--dupe_factor=1"])]
    for tool, argv in runs:
        result = run_tool(tool, argv)
        assert result.code == 0, (tool, result.stderr[-2000:])
    assert "John was born in the city." in (out / "corpus.txt").read_text(encoding="utf-8")
    assert (out / "shard.tfrecord").stat().st_size > 0
    # Both readings exist (the second part is relative: here, in the working directory):
    # one line naming the flag, nothing written.
    monkeypatch.chdir(tmp_path / "in")
    _touch(tmp_path / "in" / "corpus", text)
    _touch(tmp_path / "in" / "2024.txt", text)
    for tool, flag in (("prepare_corpus", "--input"), ("create_pretraining_data",
                                                       "--input_file")):
        argv = [a.replace(str(out), str(tmp_path / "refused")) for a in dict(runs)[tool]]
        result = run_tool(tool, argv)
        assert result.code != 0 and len(result.error_lines) == 1, result.stderr[-2000:]
        assert result.error_lines[0].startswith(f"error: {flag}: '{corpus}' is an existing "
                                                "file and also a list of existing files")
        assert not (tmp_path / "refused").exists()
