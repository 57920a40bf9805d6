"""A transformers user's commands and files: the example scripts' flags (run_glue.py,
run_ner.py, run_qa.py and their TrainingArguments) where they mean one of ours, refused in
one line where they would mean something else; their data files.

The flag tests run each tool's real main (`cli_harness.run_tool`: absl parsing and the
error boundary) with `runner.run` replaced by a recorder, so they check what the command
line becomes without training: the same values as the command written with our flags.
"""

import pytest

from cli_harness import run_tool

from bert_keras.finetuning import runner  # noqa: E402


@pytest.fixture
def recorded(monkeypatch):
    """The values each tool's main hands `runner.run` (nothing is trained)."""
    calls = []
    monkeypatch.setattr(runner, "run", lambda task, values: calls.append(dict(values)) or {})
    return calls


def values_of(recorded, tool, argv):
    recorded.clear()
    result = run_tool(tool, argv.split())
    assert result.code == 0 and not result.error_lines, result.stderr
    assert len(recorded) == 1
    return recorded[0]


BASE = "--output_dir=/tmp/never-written --do_train --do_eval --do_predict"


@pytest.mark.parametrize("tool,theirs,ours", [
    ("run_classifier",
     "--model_name_or_path={d} --train_file=t.csv --validation_file=v.csv --test_file=p.csv "
     "--per_device_train_batch_size=3 --per_device_eval_batch_size=5 --overwrite_output_dir "
     "--warmup_ratio=0.25 --text_column_name=sentence1 --label_column_name=gold "
     "--weight_decay=0.01 --gradient_accumulation_steps=1 --warmup_steps=0 --learning_rate=2e-5 "
     "--num_train_epochs=4 --max_seq_length=61 --seed=42",
     "--init_checkpoint={d} --train_file=t.csv --eval_file=v.csv --predict_file=p.csv "
     "--train_batch_size=3 --eval_batch_size=5 --overwrite_output --warmup_proportion=0.25 "
     "--text_a_column=sentence1 --label_column=gold --learning_rate=2e-5 --num_train_epochs=4 "
     "--max_seq_length=61 --seed=42"),
    ("run_regressor",
     "--model_name_or_path={d} --train_file=t.json --validation_file=v.json "
     "--label_column_name=score --per_device_train_batch_size=7",
     "--init_checkpoint={d} --train_file=t.json --eval_file=v.json --label_column=score "
     "--train_batch_size=7"),
    ("run_tagger",
     "--model_name_or_path={d} --train_file=t.json --validation_file=v.json --test_file=p.json "
     "--per_device_train_batch_size=6 --warmup_ratio=0",
     "--init_checkpoint={d} --train_file=t.json --eval_file=v.json --predict_file=p.json "
     "--train_batch_size=6 --warmup_proportion=0"),
    # run_squad scores the --predict_file it predicts: run_qa's --validation_file.
    ("run_squad",
     "--model_name_or_path={d} --train_file=t.json --validation_file=v.json "
     "--per_device_train_batch_size=12 --per_device_eval_batch_size=9 "
     "--version_2_with_negative --max_answer_length=17 --n_best_size=11",
     "--init_checkpoint={d} --train_file=t.json --predict_file=v.json --train_batch_size=12 "
     "--eval_batch_size=9 --version_2_with_negative --max_answer_length=17 --n_best_size=11"),
])
def test_transformers_flags_give_the_values_of_ours(recorded, tmp_path, tool, theirs, ours):
    d = str(tmp_path)  # --model_name_or_path must name something on disk
    got = values_of(recorded, tool, f"{BASE} {theirs.format(d=d)}")
    want = values_of(recorded, tool, f"{BASE} {ours.format(d=d)}")
    assert got == want


@pytest.mark.parametrize("tool,flags,says", [
    # What would train otherwise than transformers trains: refused, the difference named.
    ("run_classifier", "--warmup_steps=100", "--warmup_steps=100: not taken (warmup is a "
     "fraction of the training steps here"),
    ("run_classifier", "--weight_decay=0.0", "--weight_decay=0.0: not taken (the tools train "
     "with AdamW's decay at 0.01"),
    ("run_tagger", "--gradient_accumulation_steps=4", "--gradient_accumulation_steps=4: not "
     "taken (a step here trains one batch: give --train_batch_size the accumulated batch"),
    ("run_squad", "--per_device_train_batch_size=8 --distribution_strategy=mirrored",
     "--per_device_train_batch_size=8: with --distribution_strategy=mirrored "
     "--train_batch_size is the global batch"),
    # One flag given twice under two names, at two values.
    ("run_classifier", "--per_device_train_batch_size=8 --train_batch_size=16",
     "--per_device_train_batch_size=8 and --train_batch_size=16: --per_device_train_batch_size "
     "is transformers' name for --train_batch_size; give one"),
    ("run_squad", "--validation_file=v.json --test_file=t.json",
     "both are --predict_file here; give one"),
    # A Hub name: nothing is downloaded.
    ("run_regressor", "--model_name_or_path=bert-base-uncased",
     "--model_name_or_path=bert-base-uncased: no such directory or checkpoint; nothing is "
     "downloaded from the Hugging Face Hub"),
])
def test_transformers_flags_that_would_mean_otherwise_are_refused(recorded, tool, flags, says):
    result = run_tool(tool, f"{BASE} --train_file=t.json {flags}".split())
    assert result.code == 1 and len(result.error_lines) == 1, result.stderr
    assert says in result.error_lines[0]
    assert not recorded  # refused before anything ran
