"""Every tool's flags as the tool registers them, recorded in one fresh process (cached for
the test session): absl's flags of each tool in tests/cli_harness.py (those it declares
and adopts as key flags, with its help text and its default, as --help prints them), and
the argparse options of the other tools the docs name (scripts/quickstart.py, bench/*.py,
public_data.prepare, export.saved_model_cli, ...).

A fresh process, since tools imported into one process redefine shared flags
(allow_override) with their own defaults (run_squad's --learning_rate 3e-5), and absl then
forgets them for the earlier tool: so the registrations are recorded as they happen. An
argparse tool's parser is taken from its `main` (parse_args stopped before anything runs).
"""

import functools
import json
import os
import re
import subprocess
import sys

from cli_harness import TOOLS
from doc_pages import doc_texts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = """
import argparse, collections, importlib, importlib.util, inspect, json, os, sys
from absl import flags
absl_tools, argparse_tools = json.loads(sys.argv[1])
registered = collections.defaultdict(dict)
defaults = collections.defaultdict(dict)
for method in ("register_flag_by_module", "register_key_flag_for_module"):
    original = getattr(flags.FlagValues, method)
    def record(self, module_name, flag, original=original):
        registered[module_name][flag.name] = flag.help or ""
        defaults[module_name][flag.name] = flag.default
        return original(self, module_name, flag)
    setattr(flags.FlagValues, method, record)
docs = {tool: importlib.import_module(tool).__doc__ or "" for tool in absl_tools}
absl_own = sorted({f.name for module, found in flags.FLAGS.flags_by_module_dict().items()
                   if module.split(".")[0] == "absl" for f in found})

class Parsed(Exception):
    pass

def stop(self, *args, **kwargs):
    raise Parsed(self)

argparse.ArgumentParser.parse_args = stop
argparse.ArgumentParser.parse_known_args = stop

def options(parser, helps):
    found = {}
    helps[""] = helps.get("", "") + "\\n\\n" + "\\n\\n".join(
        text for text in (parser.description, parser.epilog) if text)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.update(options(sub, helps))
        for option in action.option_strings:
            if option.startswith("--"):
                found[option[2:]] = None if action.default is argparse.SUPPRESS else \\
                    action.default
                helps[option[2:]] = action.help or ""
    return found

parsed, parsed_help = {}, {}
for tool in argparse_tools:
    if tool.endswith(".py"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(tool)))
        name = "tool_" + str(len(parsed))
        spec = importlib.util.spec_from_file_location(name, tool)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(tool)
    sys.argv = [tool, "--help"]
    try:
        module.main(["--help"]) if inspect.signature(module.main).parameters else module.main()
    except Parsed as e:
        helps = {"": module.__doc__ or ""}
        parsed[tool] = options(e.args[0], helps)
        parsed_help[tool] = {"doc": helps.pop(""), "flags": helps}
    else:
        raise SystemExit(f"{tool}: main() parsed no arguments")
print(json.dumps({"tools": {tool: {"doc": docs[tool], "flags": registered[tool],
                                   "defaults": defaults[tool]} for tool in absl_tools},
                  "argparse": parsed, "argparse_help": parsed_help, "absl": absl_own},
                 default=repr))
"""

# `python -m MODULE` or a script's path (bench/x.py, scripts/x.py) in the docs.
_NAMED_TOOL = re.compile(r"python -m ([a-z_]+\.[a-z_.]+)|\b((?:bench|scripts)/[a-z_0-9]+\.py)\b")


def argparse_tools() -> list[str]:
    """The tools the docs name that parse their arguments with argparse (not absl's)."""
    named = set()
    for text in doc_texts().values():
        for module, script in _NAMED_TOOL.findall(text):
            named.add(module or script)
    found = []
    for tool in sorted(named - set(TOOLS.values())):
        path = os.path.join(REPO, tool if tool.endswith(".py") else
                            tool.replace(".", os.sep) + ".py")
        if os.path.isfile(path) and "parse_args(" in open(path, encoding="utf-8").read():
            found.append(tool)
    return found


@functools.cache
def registry() -> dict:
    """{"tools": {absl tool module: {"doc", "flags": {name: help}, "defaults": {name:
    default}}}, "argparse": {tool: {name: default}}, "argparse_help": {tool: {"doc": its
    docstring, description and epilog, "flags": {name: help}}}, "absl": absl's own flags
    (--help, ...)}.
    """
    env = dict(os.environ, PYTHONPATH=REPO)
    tools = [list(TOOLS.values()), argparse_tools()]
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(tools)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])
