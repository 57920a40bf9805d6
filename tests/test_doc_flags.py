"""The docs' prose names only flags that exist, of the tool it ties them to, with the
defaults they have. tests/test_readme_commands.py runs the commands in the code blocks;
this reads every `--name` in README.md and docs/*.md, prose and code blocks alike:

- each is a flag of one of our tools (tests/flag_registry.py: absl's flags of the tools in
  tests/cli_harness.py, the argparse options of the scripts the docs name), or an outside
  program's flag listed in OUTSIDE with its owner;
- one tied to a tool (written right after its name, "run_squad's `--doc_stride`",
  "`python -m bert_keras.run_squad --do_train`", as tests/test_help_texts.py decides; in a
  code block's comment above a command, that command's; under a heading naming one tool,
  that tool's) is a flag of that tool;
- a default stated in the patterns the docs use (DEFAULT_PATTERNS) is absl's (argparse's)
  default of that flag in each tool it is stated for: the one it is tied to, else the ones
  named earlier in its sentence, else the ones its section's commands run, else every tool
  declaring it; where absl's default is None (derived from other settings, or "not given"
  told apart), the one the flag's help states. A default under a condition ("With
  `--language=ko`, `--strip_accents` defaults to `false`") is not absl's and not checked.

The independent side is the flags as the tools register them, recorded in a fresh process.
"""

import math
import re

import pytest

from cli_harness import TOOLS
from doc_pages import doc_texts
from flag_registry import argparse_tools, registry as recorded_registry
from test_help_texts import flag_spans, tool_word

# Flags of programs other than ours that the docs name: name -> the program.
OUTSIDE = {
    "no-deps": "pip wheel",
    "logdir": "tensorboard",
    "purge_orphaned_data": "tensorboard",
    "rm": "docker run",
    "mount": "docker run",
    "zone": "gcloud compute tpus tpu-vm ssh",
    "worker": "gcloud compute tpus tpu-vm ssh",
    "command": "gcloud compute tpus tpu-vm ssh",
    "model_base_path": "tensorflow_model_server",
    "model_name": "tensorflow_model_server",
    "model_config_file": "tensorflow_model_server",
    "enable_batching": "tensorflow_model_server",
    "batching_parameters_file": "tensorflow_model_server",
    "enable_per_model_batching_parameters": "tensorflow_model_server",
    "xla_force_host_platform_device_count": "XLA (XLA_FLAGS)",
    "xla_gpu_deterministic_ops": "XLA (XLA_FLAGS)",
    "na-prob-file": "SQuAD 2.0's evaluate-v2.0.py",
    "allow_unsafe_triggers": "Apache Beam's pipeline options",
}

_FLAG = r"`--(?P<flag>[a-z][a-z0-9_]*)(?:=(?P<eq>[^`\s]+))?`"
# A stated value: anything in backticks, else a number or true/false.
_VALUE = (r"(?:`(?P<quoted>[^`]+)`|(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)"
          r"(?![\w.])|(?P<word>true|false)\b)")
# How the docs state a default (text with its whitespace and code comments' `#` collapsed).
DEFAULT_PATTERNS = [
    # "`--language` ... (default `en`)", "(`--beam_bucket_mb`, default 4 MB"
    re.compile(_FLAG + r"[^`()]{0,60}?\)?,?\s*\(?default:?\s+" + _VALUE),
    # "`--learning_rate` defaults to 1e-4", "`--strip_accents` defaults to `false`"
    re.compile(_FLAG + r"\s+defaults?\s+to\s+" + _VALUE),
    # "`--optimizer=adamw` (default)"
    re.compile(_FLAG + r"\s+\(default\)"),
    # "`--skip_padding`, on by default"; "`--do_train=true` is what the tool does by default"
    re.compile(_FLAG + r",?\s+(?P<onoff>on|off)\s+by\s+default"),
    re.compile(r"`--(?P<flag>[a-z][a-z0-9_]*)=(?P<eq>[^`\s]+)`\s+"
               r"(?:is\s+what\s+the\s+tool\s+does\s+)?by\s+default"),
    # "`--eval_batch_size` (64; Google's 8)", "`--warmup_proportion` 0.1 (transformers 0)"
    re.compile(_FLAG + r"\s+\(?" + _VALUE + r"[;,]?\s+\(?(?:Google's|transformers)\b"),
]
# A table row's "| `adam_paper` (default): ..." after the row's `--epsilon_placement`.
_ROW_DEFAULT = re.compile(r"`(?P<quoted>[^`]+)`\s+\(default\)")

_SCRIPT = re.compile(r"^(?:[A-Z_]+=\S+\s+)*python\s+(?:-m\s+)?(\S+)")


def _tool_names() -> dict[str, str]:
    """{a word naming a tool: the tool's key in the registry}: our absl tools by name and
    module, the argparse tools by module or path (and a script's file name)."""
    names = {}
    for tool, module in TOOLS.items():
        names[tool] = names[module] = module
    for tool in argparse_tools():
        names[tool] = tool
        if tool.endswith(".py"):
            names[tool.split("/")[-1]] = tool
    return names


NAMES = _tool_names()


def owner_of(word: str) -> str | None:
    return NAMES.get(tool_word(word))


def units(text: str):
    """(text, the tool it is about or None, the tools the section's commands run) for each
    prose paragraph and code block line group of a page: a code block's comment lines above
    a command are about that command's tool; prose under a heading naming one tool is about
    that tool."""
    sections = re.split(r"^(?=#+ )", text, flags=re.M)  # a code block's "# " lines too:
    for section in _join_code_blocks(sections):  # rejoined where a code block was cut
        commands = {NAMES.get(m.group(1)) for m in re.finditer(
            r"^(?:[A-Z_]+=\S+\s+)*python\s+(?:-m\s+)?(\S+)", section, re.M)} - {None}
        for unit, context in _section_units(section):
            yield unit, context, commands


def _join_code_blocks(sections: list[str]):
    """`sections` with the pieces of a code block cut at its `# ` comment lines rejoined."""
    joined = ""
    for section in sections:
        joined += section
        if len(re.findall(r"^```", joined, re.M)) % 2 == 0:
            yield joined
            joined = ""
    if joined:
        yield joined


def _section_units(section: str):
    heading_tool = None
    for block in re.split(r"^(```[a-z]*\n.*?^```)$", section, flags=re.S | re.M):
        if block.startswith("```"):
            comments = []
            for line in block.replace("\\\n", " ").splitlines()[1:-1]:
                if line.lstrip().startswith("#"):
                    comments.append(line.lstrip().lstrip("#"))
                    continue
                command = _SCRIPT.match(line.strip())
                tool = NAMES.get(command.group(1)) if command else None
                if comments:
                    yield "\n".join(comments), tool
                    comments = []
                if line.strip():
                    yield line, None
            if comments:
                yield "\n".join(comments), None
            continue
        for paragraph in re.split(r"\n\s*\n", block):
            heading = re.match(r"#+ (.*)", paragraph)
            if heading:
                named = {owner_of(w) for w in heading.group(1).split()} - {None}
                heading_tool = named.pop() if len(named) == 1 else None
                paragraph = paragraph[heading.end():]
            if paragraph.strip():
                yield paragraph, heading_tool


def references():
    """(page, flag, owner or None, its sentence) for every `--name` of the docs."""
    for page, text in doc_texts().items():
        for unit, context, _ in units(text):
            for owner, name, at in flag_spans(unit, owner_of):
                # An outside program's flag in a comment above our command is its own.
                context = None if name in OUTSIDE else context
                yield page, name, owner or context, _around(unit, at)


def _around(text: str, at: int) -> str:
    return " ".join(text[max(0, at - 60):at + 60].split())


def stated_defaults():
    """(page, flag, the tools it is stated for, the stated value, its sentence) for each
    default the docs state in DEFAULT_PATTERNS' words. The tools: the one it is tied to
    (as `references`), else those named earlier in its sentence, else the ones the
    section's commands run; empty: every tool."""
    for page, text in doc_texts().items():
        for unit, context, commands in units(text):
            owners = {at: owner for owner, _, at in flag_spans(unit, owner_of)}
            found = []
            for pattern in DEFAULT_PATTERNS:
                for m in pattern.finditer(unit):
                    groups = m.groupdict()
                    value = (groups.get("quoted") or groups.get("number") or groups.get("word")
                             or {"on": "true", "off": "false"}.get(groups.get("onoff"))
                             or groups["eq"])
                    found.append((m.group("flag"), m.start("flag") - 2, value, m.start()))
            for m in _ROW_DEFAULT.finditer(unit):
                before = [at for at in sorted(owners) if at < m.start()]
                if before and not re.search(r"`--[a-z_]+=[^`]*`\s+\(default\)",
                                            unit[m.start() - 2:m.end()]):
                    name = re.match(r"--([a-z0-9_]+)", unit[before[-1]:]).group(1)
                    found.append((name, before[-1], m.group("quoted"), m.start()))
            for name, at, value, start in found:
                sentence = max([0] + [m.end() for m in re.finditer(r"[.!?]\s+|\n- ",
                                                                     unit[:at])])
                if re.search(r"\b[Ww]ith\s+`--[a-z0-9_]+=", unit[sentence:at]):
                    continue  # "With `--language=ko`, `--strip_accents` defaults to": not absl's
                named = [owner_of(w) for w in unit[sentence:at].split()]
                tools = ({owners.get(at) or context} - {None} or set(named) - {None}
                         or commands)
                yield page, name, tools, value, _around(unit, start)


@pytest.fixture(scope="module")
def flags_of():
    """{tool: {flag: default}} of every tool (absl's own flags and --help with each absl
    tool)."""
    from data_prep import cli

    found = recorded_registry()
    absl_own = dict.fromkeys(found["absl"] + [a.lstrip("-") for a in cli.HELP_ARGS])
    tools = {module: {**absl_own, **entry["defaults"]}
             for module, entry in found["tools"].items()}
    tools.update(found["argparse"])
    return tools


@pytest.fixture(scope="module")
def helps():
    """{absl tool: {flag: its help text}}."""
    return {module: entry["flags"] for module, entry in recorded_registry()["tools"].items()}


def _takes(flags: dict, name: str) -> bool:
    return name in flags or (name.startswith("no") and name[2:] in flags)


def test_every_flag_the_docs_name_exists_in_the_tool_they_tie_it_to(flags_of):
    stale = []
    for page, name, owner, sentence in references():
        if owner is not None:
            if not _takes(flags_of[owner], name):
                stale.append(f"{page}: --{name} is no flag of {owner}: ...{sentence}...")
        elif not any(_takes(flags, name) for flags in flags_of.values()) and \
                name not in OUTSIDE:
            stale.append(f"{page}: --{name} is no flag of any tool: ...{sentence}...")
    assert not stale, "\n".join(stale)


def _equal(stated: str, default, help_text: str) -> bool:
    """Whether `stated` is `default`; a None default (the value is derived, or "not given"
    is told apart) is the one the flag's help states ("(default 0.15)")."""
    if default is None:
        return bool(re.search(r"\bdefaults?:?(?: to)? " + re.escape(stated) + r"(?![\w.])",
                              help_text or ""))
    if isinstance(default, bool):
        return stated.lower() in (("true", "on") if default else ("false", "off"))
    if isinstance(default, (int, float)):
        try:
            return math.isclose(float(stated), default, rel_tol=1e-9)
        except ValueError:
            return False
    if isinstance(default, list):
        return stated == ",".join(map(str, default))
    return stated == str(default)


def test_defaults_the_docs_state_are_the_tools_defaults(flags_of, helps):
    found, wrong = [], []
    absl_tools = set(TOOLS.values())
    for page, name, tools, value, sentence in stated_defaults():
        if name in OUTSIDE:
            continue
        found.append(name)
        tools = [t for t in tools if name in flags_of[t]] or [
            t for t in flags_of if t in absl_tools and name in flags_of[t]] or [
            t for t in flags_of if name in flags_of[t]]
        defaults = {t: flags_of[t][name] for t in tools}
        if not tools or not all(_equal(value, d, helps.get(t, {}).get(name))
                                for t, d in defaults.items()):
            wrong.append(f"{page}: --{name} default {value!r}, but {defaults}: ...{sentence}...")
    assert len(found) >= 15, found  # the patterns still find the docs' statements
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("text,want", [
    ("`--language` names their language for sentence splitting (default `en`), and",
     [("language", "en")]),
    ("`--a` or `--b` (default 3)", [("b", "3")]),
    ("(`--beam_bucket_mb`, default\n4 MB of text)", [("beam_bucket_mb", "4")]),
    ("`--learning_rate` defaults to 1e-4 (Google's 5e-5", [("learning_rate", "1e-4")]),
    ("`--doc_stride` defaults to half a window", []),
    ("`--optimizer=adamw` (default) or `lamb`", [("optimizer", "adamw")]),
    ("(`--skip_padding`, on by default):", [("skip_padding", "true")]),
    ("`--do_train=true`\nis what the tool does by default", [("do_train", "true")]),
    ("`--eval_batch_size`\n(64; Google's 8)", [("eval_batch_size", "64")]),
    ("`--warmup_proportion` 0.1 (transformers 0), batch 32 (8)", [("warmup_proportion", "0.1")]),
    ("| x (`--lr_schedule`) | y | `linear` (default): z", [("lr_schedule", "linear")]),
    ("With `--language=ko` or `ja`, `--strip_accents` defaults to `false`: x", []),
])
def test_default_patterns_read_the_docs_phrasings(monkeypatch, text, want):
    import doc_pages

    monkeypatch.setattr(doc_pages, "doc_texts", lambda: {"page": text})
    monkeypatch.setitem(globals(), "doc_texts", lambda: {"page": text})
    assert [(name, value) for _, name, _, value, _ in stated_defaults()] == want


def test_units_tie_a_comment_to_the_command_below_and_prose_to_a_heading():
    text = ("## run_squad's windows\n\nthe `--doc_stride`\n\n```\n# its --pair\n"
            "python -m export.export_classifier \\\n  --model_dir=m\n# an --x\n\nls\n```\n")
    assert [unit[:2] for unit in units(text)] == [
        ("the `--doc_stride`", "bert_keras.run_squad"),
        (" its --pair", "export.export_classifier"),
        ("python -m export.export_classifier    --model_dir=m", None),
        (" an --x", None), ("ls", None)]
    assert {tuple(unit[2]) for unit in units(text)} == {("export.export_classifier",)}
