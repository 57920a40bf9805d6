"""The documentation's commands run as written: every `python -m TOOL ...` and `python
scripts/...` command in the code blocks of README.md and the docs/ pages names a tool that
exists and flags that tool's --help lists and parses; `--help` exits 0 with no TensorFlow
log lines."""

import argparse
import importlib
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from absl import flags

from doc_pages import doc_texts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = re.compile(r"^python (-m [\w.]+|scripts/\w+\.py)\b")


def readme_commands():
    """(tool, args) for each command in the ``` blocks of README.md and the docs/ pages;
    `\\` continues a line, `[--flag]` is an optional flag, `a|b` alternatives (the first
    is taken)."""
    commands = []
    blocks = [block for text in doc_texts().values()
              for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)]
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            match = COMMAND.match(line)
            if not match:
                continue
            words = shlex.split(line)
            tool = words[2] if words[1] == "-m" else words[1]
            args = []
            for word in words[(3 if words[1] == "-m" else 2):]:
                word = word.strip("[]")
                if word.startswith("--") and "=" in word:
                    name, value = word.split("=", 1)
                    word = f"{name}={value.split('|')[0]}"
                args.append(word)
            commands.append((tool, args))
    return commands


COMMANDS = readme_commands()
ABSL_TOOLS = sorted({tool for tool, _ in COMMANDS if not tool.endswith(".py")} - {
    "export.op_check", "export.saved_model_cli", "public_data.fetch", "public_data.prepare"})


def test_readme_names_every_tool():
    tools = {tool for tool, _ in COMMANDS}
    assert len(COMMANDS) >= 20, COMMANDS
    for tool in ("bert_keras.run_pretraining", "bert_keras.run_classifier", "bert_keras.run_squad",
                 "data_prep.create_pretraining_data", "export.export_classifier",
                 "scripts/quickstart.py"):
        assert tool in tools


# Each tool's --help lists the key flags of its module. In one process a tool imported
# later (or as another tool's dependency) redefines the shared flags (allow_override), and
# absl then forgets them for the earlier one; so the registrations are recorded as they
# happen, in a fresh process.
_KEY_FLAGS = """
import collections, importlib, json, sys
from absl import flags
names = collections.defaultdict(set)
for method in ("register_flag_by_module", "register_key_flag_for_module"):
    original = getattr(flags.FlagValues, method)
    def record(self, module_name, flag, original=original):
        names[module_name].add(flag.name)
        return original(self, module_name, flag)
    setattr(flags.FlagValues, method, record)
for tool in sys.argv[1:]:
    importlib.import_module(tool)
print(json.dumps({tool: sorted(names[tool]) for tool in sys.argv[1:]}))
"""


@pytest.fixture(scope="module")
def key_flags():
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", _KEY_FLAGS, *ABSL_TOOLS], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return {tool: set(names) for tool, names in json.loads(out.splitlines()[-1]).items()}


@pytest.mark.parametrize("tool,args", [c for c in COMMANDS if c[0] in ABSL_TOOLS],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_absl_command_flags_are_listed_by_help_and_parse(tool, args, key_flags):
    listed = key_flags[tool]
    args = [a for a in args if a not in ("--help", "-h", "--helpfull")]
    for arg in args:
        assert arg.startswith("--"), (tool, arg)
        name = arg[2:].split("=")[0]
        if name not in listed and name.startswith("no"):
            name = name[2:]
        assert name in listed, f"{tool}: README's --{name} is not in its --help"
    importlib.import_module(tool)
    try:
        flags.FLAGS(["prog", *args])  # values parse (types, enums, lists)
    finally:
        flags.FLAGS.unparse_flags()


class _Parsed(Exception):
    pass


# saved_model_cli declares absl flags (--overwrite, ...) that other tools declare too: its
# commands are parsed by its own parser in a process of their own.
_SAVED_MODEL_CLI = """
import json, sys
from tensorflow.python.tools import saved_model_cli
parser = saved_model_cli.create_parser()
print(json.dumps([parser.parse_args(args).func.__name__ for args in json.loads(sys.argv[1])]))
"""


def test_saved_model_cli_commands_parse():
    commands = [args for tool, args in COMMANDS if tool == "export.saved_model_cli"]
    assert {args[0] for args in commands} >= {"show", "run"}, commands
    proc = subprocess.run([sys.executable, "-c", _SAVED_MODEL_CLI, json.dumps(commands)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [
        {"show": "show", "run": "run"}[args[0]] for args in commands]


@pytest.mark.parametrize("tool,args", [c for c in COMMANDS if c[0] not in ABSL_TOOLS
                                       and c[0] != "export.saved_model_cli"],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_argparse_command_parses(tool, args, monkeypatch):
    """The tool's own parser accepts README's arguments (and then stops: nothing runs)."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, argv=None, namespace=None):
        raise _Parsed(original(self, argv, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    if tool.endswith(".py"):
        monkeypatch.syspath_prepend(os.path.join(REPO, os.path.dirname(tool)))
        tool = os.path.basename(tool)[:-3]
    module = importlib.import_module(tool)
    with pytest.raises(_Parsed):
        module.main(args)


@pytest.mark.integration  # ~25 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_help_exits_zero_without_tensorflow_log_lines():
    """One tool per package, run as a user runs it (in parallel: each imports TensorFlow);
    TF_CPP_MIN_LOG_LEVEL unset, as in a user's shell."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = REPO
    expected = {"bert_keras.run_classifier": ["--do_train", "--init_checkpoint",
                                              "--max_seq_length", "--learning_rate",
                                              "--output_dir", "--task_name"],
                "data_prep.create_pretraining_data": ["--input_file", "--vocab_file"],
                "export.export_classifier": ["--model_dir", "--export_dir"]}
    procs = {tool: subprocess.Popen([sys.executable, "-m", tool, "-h" if i else "--help"],
                                    cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for i, tool in enumerate(expected)}
    for tool, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, (tool, err)
        assert err == "", (tool, err)
        for flag in expected[tool]:
            assert flag in out, (tool, flag)
