"""Every tool's --help names only flags that exist: each `--name` in a tool's docstring and
flag help texts is a flag absl registered for that tool, or for the tool named right
before it ("run_classifier's --output_dir", "`python -m export.export_classifier
--model_dir=...`"). convert_checkpoint declares run_classifier's label flags, whose help
spoke of run_classifier's --train_file and --do_train, which it does not take.

The independent side is absl's flag registry: the flags each tool module registers (and
adopts as key flags), recorded as they are registered in a fresh process, since tools
imported into one process redefine shared flags (allow_override).
"""

import re

import pytest

from cli_harness import TOOLS
from flag_registry import registry as recorded_registry


@pytest.fixture(scope="module")
def registry():
    """Each tool's docstring and its flags' help as registered for it (tests/flag_registry.py:
    one fresh process per test session)."""
    return recorded_registry()


_FLAG = re.compile(r"^--([a-z][a-z0-9_]*(?:-[a-z0-9_]+)*)")  # and pip's --no-deps
_PUNCTUATION = "`'\"()[],;:.!?"


def tool_word(word: str) -> str:
    """`word` without the punctuation and possessive around a name ("`run_squad's" ->
    "run_squad")."""
    word = word.strip(_PUNCTUATION)
    return word[:-2] if word.endswith("'s") else word


def _owner(word: str) -> str | None:
    """The tool `word` names (run_classifier, run_classifier's, bert_keras.run_classifier),
    or None."""
    word = tool_word(word)
    for tool, module in TOOLS.items():
        if word in (tool, module):
            return tool
    return None


def flag_spans(text: str, owner_of=_owner):
    """(the tool named right before, or None; flag name; offset of its `--` in `text`) for
    each `--name` in `text`. A tool's name is followed by its flags ("run_tagger
    --task_name=klue-ner", "`python -m bert_keras.run_squad --do_train`", on lines continued
    by a backslash); any other word, or a blank line, ends them. `owner_of`: the tool a
    word names, or None."""
    for paragraph in re.finditer(r"(?:(?!\n\s*\n).)+", text, re.S):
        owner = None
        for found in re.finditer(r"\S+", paragraph.group()):
            word = found.group()
            named = owner_of(word)
            if named is not None:
                owner = named
                continue
            stripped = word.lstrip(_PUNCTUATION)
            match = _FLAG.match(stripped)
            if match:
                yield owner, match.group(1), (paragraph.start() + found.start()
                                              + len(word) - len(stripped))
            elif word not in ("\\", "-m"):
                owner = None


def flag_references(text: str, owner_of=_owner):
    """(the tool named right before, or None; flag name) for each `--name` in `text`
    (`flag_spans`)."""
    for owner, name, _ in flag_spans(text, owner_of):
        yield owner, name


def test_flag_references_attribute_flags_to_the_tool_named_before_them():
    text = ("a run_pretraining or run_classifier --output_dir, an encoder/ directory; "
            "`python -m export.export_classifier --model_dir=runs/a \\\n --export_dir=/m` "
            "then --label_list (run_classifier's --label_list_file or --task_name); "
            "Google's run_classifier.py --do_lower_case\n\n    python -m bert_keras."
            "run_squad --do_train\n\n--to=hf")
    assert list(flag_references(text)) == [
        ("run_classifier", "output_dir"), ("export_classifier", "model_dir"),
        ("export_classifier", "export_dir"), (None, "label_list"),
        ("run_classifier", "label_list_file"), (None, "task_name"), (None, "do_lower_case"),
        ("run_squad", "do_train"), (None, "to")]


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_help_names_only_flags_the_tool_takes(registry, tool):
    """Each `--name` in the tool's docstring and flag help texts (what --help prints) is one
    of its flags, or of the tool named right before it."""
    tools = registry["tools"]
    module = TOOLS[tool]
    texts = {"the docstring": tools[module]["doc"]}
    texts.update({f"--{name}'s help": text for name, text in tools[module]["flags"].items()})
    stale = []
    for where, text in texts.items():
        for owner, name in flag_references(text):
            taken = set(tools[TOOLS[owner or tool]]["flags"]) | set(registry["absl"])
            if name not in taken and not (name.startswith("no") and name[2:] in taken):
                stale.append(f"{where}: --{name} (not a flag of {owner or tool})")
    assert not stale, "\n".join(stale)


# The argparse tools a user runs (flag_registry.argparse_tools: those the docs name), less
# bench/'s measurement scripts (their texts speak of the tools' flags they measure, "the
# same export with --serving_dtype=bfloat16") and export.saved_model_cli, whose help is
# TensorFlow's own. A `--name` after `pip` or `npm` on its line is theirs.
_USER_ARGPARSE = ("export.", "public_data.", "scripts/")
_FOREIGN = re.compile(r"\b(?:pip|npm)\b[^\n]*$")


def _user_argparse_tools():
    from flag_registry import argparse_tools

    return [tool for tool in argparse_tools() if tool.startswith(_USER_ARGPARSE)
            and tool != "export.saved_model_cli"]


@pytest.mark.parametrize("tool", _user_argparse_tools())
def test_argparse_help_names_only_flags_the_tool_takes(registry, tool):
    """As for the absl tools: each `--name` in an argparse tool's docstring, description,
    epilog and option help (what --help prints) is one of its options, or a flag of the
    tool named right before it."""
    found = registry["argparse"]

    def owner_of(word):
        return _owner(word) or next((other for other in found if tool_word(word) in (
            other, other.rsplit("/", 1)[-1])), None)

    helps = registry["argparse_help"][tool]
    texts = {"the docstring": helps["doc"]}
    texts.update({f"--{name}'s help": text for name, text in helps["flags"].items()})
    stale = []
    for where, text in texts.items():
        for owner, name, offset in flag_spans(text, owner_of):
            owner = owner or tool
            if _FOREIGN.search(text, 0, offset):
                continue
            taken = (set(registry["tools"][TOOLS[owner]]["flags"]) | set(registry["absl"])
                     if owner in TOOLS else set(found[owner]))
            if name not in taken:
                stale.append(f"{where}: --{name} (not a flag of {owner})")
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize("args,says", [
    (["--task_name=sts-b"], "error: --task_name=sts-b: a regression task (a number per "
                            "example, not a class), which names no labels; drop --task_name"),
    (["--task_name=mrpc", "--label_list=a,b"], "error: --task_name reads its columns and "
                                               "labels as the task's GLUE processor does; drop "
                                               "--label_list"),
    (["--task_name=nosuch"], "error: --task_name: unknown task 'nosuch'"),
])
def test_convert_checkpoints_label_flag_errors_name_only_its_flags(registry, tmp_path, args,
                                                                   says):
    """convert_checkpoint reads its label flags as run_classifier does, but its messages
    name only what it takes: a regression task said "run bert_keras.run_regressor with the
    same flags" (its --from, --to, --input and --output are no flags of run_regressor)."""
    from cli_harness import run_tool

    result = run_tool("convert_checkpoint", ["--from=hf", "--to=keras", f"--input={tmp_path}",
                                             f"--output={tmp_path / 'out'}", *args])
    assert result.code == 1 and len(result.error_lines) == 1, result.stderr[-2000:]
    assert result.error_lines[0].startswith(says), result.error_lines
    flags_ = set(registry["tools"][TOOLS["convert_checkpoint"]]["flags"])
    assert {name for _, name in flag_references(result.error_lines[0])} <= flags_
    assert "run_regressor" not in result.stderr
