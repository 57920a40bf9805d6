"""The packages as `pip install` gives them: a wheel built from this tree, installed into a
fresh virtual environment and run from a directory that is not the clone.

The route users take without the Makefile (README, "Five things to do next": `pip install
.`). Inside the clone every file sits beside the code; a wheel holds only what
pyproject.toml lists, so a file a module reads beside itself (export/op_check.py's op lists)
went missing there and `export.verify` stopped on it. The new environment reuses this one's
dependencies through a .pth file (no download), which Python appends after the
environment's own site-packages, so the installed copy, not the clone or an editable
install of it, is what gets imported.
"""

import os
import posixpath
import re
import shutil
import site
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO, TESTDATA

pytestmark = pytest.mark.integration  # A wheel, a venv and three fresh processes: ~45 s.

# The installed packages (pyproject.toml's packages.find; DESIGN section 1).
PACKAGES = ("bert_keras", "data_prep", "export")
# What setuptools reads to build the wheel: the project table, the readme, the requirements.
BUILD_FILES = ("pyproject.toml", "README.md", "requirements.txt")


def _package_files():
    """Every file of the packages in the tree (caches left out), as "package/dir/name", the
    spelling of a wheel's entries."""
    for package in PACKAGES:
        for folder, dirs, names in os.walk(os.path.join(REPO, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                if not name.endswith(".pyc"):
                    yield os.path.relpath(os.path.join(folder, name), REPO).replace(os.sep, "/")


def _files_read_beside_modules():
    """The files the modules open beside themselves, `Path(__file__).with_name("x")`."""
    found = set()
    for path in (p for p in _package_files() if p.endswith(".py")):
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            for name in re.findall(r"with_name\(\s*[\"']([^\"']+)[\"']\s*\)", f.read()):
                found.add(posixpath.join(posixpath.dirname(path), name))
    return found


def _run(cmd, cwd, timeout=600):
    """Runs `cmd` as a user's shell would: no PYTHONPATH, so nothing reaches the clone."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}:\n{proc.stdout[-2000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, the new environment's python, a neutral working directory)."""
    tmp = tmp_path_factory.mktemp("installed")
    # Built from a copy: pip builds in the source tree, and setuptools' build/lib left there
    # by an earlier build would go into the wheel (and hide a file the configuration omits).
    source = tmp / "source"
    for package in PACKAGES:
        shutil.copytree(os.path.join(REPO, package), source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in BUILD_FILES:
        shutil.copy(os.path.join(REPO, name), source / name)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(dist), str(source)], cwd=tmp)
    (wheel,) = dist.glob("bert_keras-*.whl")

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   cwd=tmp).stdout.strip()
    # Plain directory lines: they are appended to sys.path, their own .pth files (an editable
    # install of the clone among them) are not run.
    shared = [d for d in site.getsitepackages() if os.path.isdir(d)]
    with open(os.path.join(purelib, "shared_dependencies.pth"), "w") as f:
        f.write("\n".join(shared) + "\n")
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
          "--disable-pip-version-check", str(wheel)], cwd=tmp)
    work = tmp / "elsewhere"
    work.mkdir()
    return wheel, python, purelib, work


def test_the_wheel_holds_every_file_the_packages_read(installed):
    """Before: the wheel held the .py files only; export/tf_text_2_12_ops.txt and
    tf_2_12_core_ops.txt (the op check's lists) stayed in the clone."""
    wheel = installed[0]
    tree = set(_package_files())
    read = _files_read_beside_modules()
    # The scan sees export/op_check.py's two lists, and each exists in the tree.
    assert {"export/tf_text_2_12_ops.txt", "export/tf_2_12_core_ops.txt"} <= read
    assert read <= tree, f"read but not in the tree: {sorted(read - tree)}"
    with zipfile.ZipFile(wheel) as z:
        missing = sorted(tree - set(z.namelist()))
    assert not missing, (f"{wheel.name} lacks {missing}: list them in pyproject.toml's "
                         "[tool.setuptools.package-data]")


def test_verify_runs_from_the_installed_copy(installed):
    """export_preprocessor and export.verify (its op check and its serving_probe child
    process) from site-packages, in a directory that is not the clone. Before, verify
    stopped with "error: .../site-packages/export/tf_text_2_12_ops.txt: No such file"."""
    _, python, purelib, work = installed
    where = _run([str(python), "-c", "import bert_keras, data_prep, export; print("
                  "bert_keras.__file__, data_prep.__file__, export.__file__)"], cwd=work)
    for path in where.stdout.split():
        assert os.path.realpath(path).startswith(os.path.realpath(purelib) + os.sep), path

    shutil.copy(os.path.join(TESTDATA, "pretrain_vocab.txt"), work / "vocab.txt")
    _run([str(python), "-m", "export.export_preprocessor", "--vocab_file=vocab.txt",
          "--seq_length=24", "--export_dir=models/preprocess", "--version=3"], cwd=work)
    proc = _run([str(python), "-m", "export.verify", "--export_dir=models/preprocess"],
                cwd=work)
    assert "result: PASS" in proc.stdout, proc.stdout[-2000:]
    assert "[ok] ops" in proc.stdout, proc.stdout[-2000:]


def test_the_documents_messages_cite_are_in_the_installed_copy(installed):
    """Messages and --help texts cited docs/<name>.md, which an installed copy has nowhere:
    they name `files.doc_path`'s file, shipped in the wheel as bert_keras/docs."""
    wheel, python, purelib, work = installed
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.startswith("bert_keras/docs/")}
    assert shipped == {f"bert_keras/docs/{name}" for name in os.listdir(os.path.join(REPO, "docs"))
                       if name.endswith(".md")}
    where = _run([str(python), "-c", "from data_prep import files; "
                  "print(files.doc_path('backends.md'))"], cwd=work).stdout.strip()
    assert where == os.path.join(os.path.realpath(purelib), "bert_keras", "docs", "backends.md")
    with open(where, encoding="utf-8") as f, \
            open(os.path.join(REPO, "docs", "backends.md"), encoding="utf-8") as g:
        assert f.read() == g.read()
    # A tool's --help (its docstring) names the documents where this copy has them.
    helped = _run([str(python), "-m", "bert_keras.run_tagger", "--help"], cwd=work).stdout
    cited = re.findall(r"(/\S+?\.md)\b", helped)
    assert cited and "docs/finetuning.md" not in helped.replace(
        os.path.join("bert_keras", "docs", "finetuning.md"), "")
    for path in cited:
        assert path.startswith(os.path.realpath(purelib)) and os.path.isfile(path), path
