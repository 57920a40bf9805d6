"""Every tool leaves the temporary directory ($TMPDIR) as it found it, after a successful run
and after a refusal, in-process and as a subprocess.

Before, `create_pretraining_data --runner=DirectRunner` left Beam's `beam-temp*`, `tmp*` and
`beam-requirements-cache` directories there on every run (Beam 2.77's DirectRunner first
tried Prism, whose start failed offline half-way: docs/beam.md). The cheap tools run here
in-process; the full set, each as `python -m`, is the integration test (about 100 s on
2 cores).
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from cli_harness import run_tool
from conftest import REPO, TESTDATA

TEXT = ("the man went to the store .\nhe bought milk .\n\njohn was born .\n"
        "the city is big .\n")
CPD = ("--input_file={F}/text.txt --output_file={W}/shard.tfrecord --vocab_file={F}/vocab.txt "
       "--max_seq_length=16 --max_predictions_per_seq=4 --dupe_factor=1")
VOC = "--input={F}/text.txt --output={W}/vocab/vocab.txt --vocab_size=110 --layout=compact"


@pytest.fixture
def fresh_tmpdir(tmp_path, monkeypatch):
    """An empty directory that is $TMPDIR and Python's tempfile directory for the test
    (tempfile reads $TMPDIR once per process, so it is set there too)."""
    directory = tmp_path / "TMPDIR"
    directory.mkdir()
    monkeypatch.setenv("TMPDIR", str(directory))
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def _inputs(directory):
    os.makedirs(directory, exist_ok=True)
    shutil.copy(os.path.join(TESTDATA, "ft_vocab.txt"), os.path.join(directory, "vocab.txt"))
    with open(os.path.join(directory, "text.txt"), "w", encoding="utf-8") as f:
        f.write(TEXT)
    with open(os.path.join(directory, "binary.bin"), "wb") as f:
        f.write(bytes(range(256)) * 4)
    return str(directory)


def _argv(template, fixtures, work):
    return template.format(F=fixtures, W=work).split()


def _cases(beam: bool):
    """(tool, flags, succeeds) pairs: a run and a refusal of each."""
    cases = [("build_vocab", VOC, True),
             ("build_vocab", VOC.replace("text.txt", "binary.bin"), False),
             ("create_pretraining_data", CPD, True),
             ("create_pretraining_data", CPD.replace("text.txt", "binary.bin"), False)]
    if beam:
        cases += [("create_pretraining_data", CPD + " --runner=DirectRunner", True),
                  ("create_pretraining_data",
                   CPD.replace("text.txt", "binary.bin") + " --runner=DirectRunner", False)]
    return cases


def test_data_tools_leave_tmpdir_empty_in_process(tmp_path, fresh_tmpdir):
    beam = True
    try:
        import apache_beam  # noqa: F401
    except ImportError:
        beam = False
    fixtures = _inputs(tmp_path / "inputs")
    for i, (tool, template, succeeds) in enumerate(_cases(beam)):
        work = tmp_path / f"w{i}"
        work.mkdir()
        result = run_tool(tool, _argv(template, fixtures, work))
        assert (result.code == 0) == succeeds, (tool, template, result.stderr[-2000:])
        assert sorted(os.listdir(fresh_tmpdir)) == [], (tool, template)


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # each tool as `python -m` (start-up of TensorFlow each): ~100 s
def test_every_tool_leaves_tmpdir_empty_as_a_subprocess(tmp_path, fresh_tmpdir):
    pytest.importorskip("apache_beam")
    from test_bad_inputs import CLS, CONV, ECLS, VER, build_fixtures

    (tmp_path / "fixtures").mkdir()
    fixtures = build_fixtures(str(tmp_path / "fixtures"))
    # build_fixtures ran TensorFlow in this process: its files (autograph's, removed when
    # this process exits) are not the tools'.
    shutil.rmtree(fresh_tmpdir)
    fresh_tmpdir.mkdir()
    cases = _cases(beam=True) + [
        ("run_classifier", CLS + " --num_train_steps=1", True),
        ("run_classifier", CLS.replace("cls.jsonl", "binary.bin"), False),
        ("export_classifier", ECLS, True),
        ("export_classifier", ECLS.replace("classifier", "nope"), False),
        ("verify", VER, True),
        ("verify", VER.replace("exports/1", "corrupt_export"), False),
        ("convert_checkpoint", CONV, True),
        ("convert_checkpoint", CONV.replace("encoder.keras", "garbage.keras"), False),
    ]
    from cli_harness import TOOLS

    env = dict(os.environ, TMPDIR=str(fresh_tmpdir), TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO)
    for i, (tool, template, succeeds) in enumerate(cases):
        work = tmp_path / f"w{i}"
        work.mkdir()
        proc = subprocess.run([sys.executable, "-m", TOOLS[tool],
                               *_argv(template.replace("{TESTDATA}", TESTDATA), fixtures, work)],
                              capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
        assert (proc.returncode == 0) == succeeds, (tool, template, proc.stderr[-2000:])
        assert sorted(os.listdir(fresh_tmpdir)) == [], (tool, template)
