"""The files every stage reads and writes: their names, and one safe way to write them.

Every output is written under a temporary name beside its final path and renamed when
complete (a rename within one directory is atomic), so a crash or kill never leaves a file
that looks finished (docs/DESIGN.md section 8). Temporary names are
`.incomplete-<pid>.<final name>` (hidden, and keeping the extension that Keras, h5py and
numpy go by): readers skip them (`is_temp_name`), and the next write to the same path
removes those whose process is gone (`remove_stale_temps`). Files are created
with the ordinary open() modes, so they respect the umask (a vocabulary written by one
account is readable by the serving account), unlike `tempfile.mkstemp`'s 0600.

The file names below are the project's layout contract; modules import them instead of
spelling the strings.
"""

from __future__ import annotations

import contextlib
import errno
import json
import io
import os
import re
import shutil
import stat
from typing import Any, Callable, Iterable, Iterator

# --- Names of the files a stage leaves for the next one. ---

VOCAB_FILE = "vocab.txt"  # WordPiece vocabulary, one token a line (schema.load_vocab)
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # beside every vocab.txt (tokenizer_config.py)
BERT_CONFIG_FILE = "bert_config.json"  # Google's model config (bert_keras.config)
ENCODER_DIR = "encoder"  # run_pretraining's output for fine-tuning and export
ENCODER_WEIGHTS_FILE = "encoder.weights.h5"
PRETRAINER_WEIGHTS_FILE = "pretrainer.weights.h5"  # encoder + MLM/NSP heads
RUN_CONFIG_FILE = "run_config.json"  # the flags that define a pretraining run
TASK_MODEL_FILE = "model.keras"  # a fine-tuned task model (run_classifier, ...)
LABELS_FILE = "labels.txt"  # its label names, one a line, in id order
# What its fine-tuning recorded: max_seq_length, a classifier's text_pair, ... (the task
# exports and an evaluation-only run take their defaults from it).
TRAIN_RESULTS_FILE = "train_results.json"
SIDECAR_SUFFIX = ".meta.json"  # pretraining shard x -> x.meta.json
HF_WEIGHTS_FILE = "model.safetensors"  # transformers' save_pretrained
HF_WEIGHTS_INDEX_FILE = "model.safetensors.index.json"  # the same, in shards
HF_CONFIG_FILE = "config.json"

CACHE_ENV = "BERT_KERAS_CACHE"  # where fetched data and compiled tokenizer models are cached

# Pretraining shards of one --output_file prefix: <prefix>-00003-of-00008.tfrecord[.gz].
_SHARD_RE = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})"
                       r"(?P<suffix>\.tfrecord(?:\.gz)?)$")

TEMP_PREFIX = ".incomplete-"
_TEMP_RE = re.compile(r"^\.incomplete-(?P<pid>\d+)\.(?P<name>.+)$")


class OutputExistsError(FileExistsError):
    """An output exists and the caller did not ask to replace it; the message says how."""


class OutputWriteError(OSError):
    """Writing an output failed part-way (`atomic_output`): its file system is full, the file
    grew past the file-size limit, or the place is read-only. `filename` is the output's
    final name (nothing was left under it, and its temporary was removed), `strerror` says
    why and what to do; the error boundary prints `<filename>: <strerror>`."""


# A write that fails for want of room (or of a writable place), by errno: what the error
# boundary says of it. Only errors a write can raise: an input that cannot be read says so
# itself. TensorFlow's C++ writers report these as "<path>; <os.strerror>" in an OpError
# (OutOfRange for EFBIG, ResourceExhausted for ENOSPC), h5py and Python as OSError.
_NO_ROOM = {
    errno.ENOSPC: "no space left on its device; free some space, or write elsewhere",
    errno.EDQUOT: "the disk quota is used up; free some space, or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
}
# Within `atomic_output`, also these (the temporary's directory is not writable).
_NOT_WRITABLE = {
    errno.EACCES: "permission denied (its directory is not writable); write elsewhere",
    errno.EPERM: "operation not permitted; write elsewhere",
}


def _file_too_large() -> str:
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        return (f"file too large: over this process's file-size limit of {limit:,} bytes "
                "(ulimit -f); raise the limit, or write elsewhere")
    return "file too large for its file system; write elsewhere"


def write_failure(e: BaseException, within: str | None = None) -> tuple[int, str | None] | None:
    """(errno, path or None) where `e` says a write failed for want of room: no space, no
    quota, over the file-size limit (EFBIG), a read-only file system; else None.

    Args:
      e: an OSError (Python's writes, h5py, zipfile); TensorFlow's OpError from its C++
        writers (TFRecord shards, checkpoints, SavedModels, event files), whose message is
        "<path>; <os.strerror>", or an error quoting one (a Beam runner's); Rust's io::Error
        as safetensors words it ("... (os error 28)").
      within: a temporary output (`atomic_output`'s): permission errors on it or in it count
        too, and an error naming another path does not.
    """
    codes = {**_NO_ROOM, errno.EFBIG: None}
    if within is not None:
        codes.update(_NOT_WRITABLE)
    if isinstance(e, OutputWriteError):
        return None  # already names its output
    if isinstance(e, OSError):
        if e.errno not in codes:
            return None
        path = e.filename if isinstance(e.filename, str) else None
        if within is not None and path is not None and not _is_within(path, within):
            return None
        return e.errno, path
    message = str(getattr(e, "message", "") or e)
    # A runner's error quoting a worker's (Beam's RuntimeError): "...errors_impl.
    # OutOfRangeError: <path>; File too large [while running 'WriteShards']".
    quoted = re.search(r"tensorflow\.python\.framework\.errors_impl\.\w+: ([^\n]*)", message)
    if type(e).__module__.startswith("tensorflow") or quoted:
        # "{{function_node ...}} <path>; File too large [Op:SaveV2]", or without the op.
        message = re.sub(r"^\{\{.*?\}\}\s*", "", quoted.group(1) if quoted else message)
        for code in codes:
            found = re.match(r"([^;]*); " + re.escape(os.strerror(code)), message)
            if found:
                path = found.group(1).strip() or None
                if within is not None and path is not None and not _is_within(path, within):
                    return None
                return code, path
    # Rust's io::Error, as safetensors and tokenizers report it: "... (os error 27)".
    found = re.search(r"\(os error (\d+)\)", message)
    if found and int(found.group(1)) in codes:
        return int(found.group(1)), None
    return None


def write_failure_cause(code: int) -> str:
    """What the error boundary says of a write that failed with `code` (`write_failure`)."""
    if code == errno.EFBIG:
        return _file_too_large()
    return {**_NO_ROOM, **_NOT_WRITABLE}.get(code, os.strerror(code))


def output_write_error(e: BaseException, within: str, output: str) -> OutputWriteError | None:
    """`e` as the error of a write to the temporary `within` that failed for want of room
    (`write_failure`), naming the final `output` and what to do; None for any other error."""
    failed = write_failure(e, within=within)
    if failed is None:
        return None
    return OutputWriteError(failed[0], "cannot be written: " + write_failure_cause(failed[0]),
                            output)


def _is_within(path: str, tmp: str) -> bool:
    """`path` is `tmp`, in it, or a file named after it (TensorFlow writes a checkpoint
    prefix's `<tmp>.data-*` and its own `<name>.tmp<hex>` temporaries beside)."""
    return os.path.abspath(path).startswith(os.path.abspath(tmp))


def final_name(path: str) -> str:
    """`path` with each temporary name in it (`.incomplete-<pid>.<name>`) as the output's
    final name, and without TensorFlow's own temporary suffix (a checkpoint's
    `.tempstate<n>`, a SavedModel file's `.tmp<hex>`): what a message names."""
    parts = os.fspath(path).split(os.sep)
    path = os.sep.join(m.group("name") if (m := _TEMP_RE.match(part)) else part
                       for part in parts)
    return re.sub(r"\.(?:tempstate\d+|tmp[0-9a-f]{32})$", "", path)


def output_path(path: str) -> str:
    """Where an output named `path` is written: where `path` points when it is a symbolic
    link (as a shell's `>` writes through one: "out.txt -> /big/disk/out.txt"), else `path`."""
    path = os.fspath(path)
    return os.path.realpath(path) if os.path.islink(path.rstrip(os.sep) or os.sep) else path


def shard_path(prefix: str, index: int, count: int, gzip_compress: bool = False) -> str:
    """Shard `index` of `count` of an output prefix: `<prefix>-00003-of-00008.tfrecord[.gz]`."""
    suffix = ".tfrecord.gz" if gzip_compress else ".tfrecord"
    return f"{prefix}-{index:05d}-of-{count:05d}{suffix}"


def shard_set_of(path: str) -> tuple[str, int, str] | None:
    """(prefix, shard count, suffix) of a shard named by `shard_path`, with or without its
    sidecar suffix; None for any other name."""
    path = os.fspath(path)
    if path.endswith(SIDECAR_SUFFIX):
        path = path[:-len(SIDECAR_SUFFIX)]
    m = _SHARD_RE.match(path)
    return (m.group("prefix"), int(m.group("count")), m.group("suffix")) if m else None


def output_prefix(path: str) -> str:
    """The prefix a glob reads a pretraining output by: a shard's (`shard_set_of`), else the
    path without `.tfrecord` or `.tfrecord.gz` (Google's README names its output
    tf_examples.tfrecord: its shards are tf_examples-00000-of-00004.tfrecord)."""
    found = shard_set_of(path)
    return found[0] if found else re.sub(r"\.tfrecord(\.gz)?$", "", os.fspath(path))


# The names of an output of one prefix written without --num_output_shards.
SINGLE_OUTPUT_SUFFIXES = ("", ".tfrecord", ".tfrecord.gz")


def shard_set_glob(prefix: str) -> str:
    """A glob (Python's, fnmatch's, Beam's) for every shard set of `prefix` and sidecars;
    filter its matches with `shard_set_of`."""
    import glob

    return glob.escape(prefix) + "-?????-of-?????.tfrecord*"


class AmbiguousPathListError(ValueError):
    """A comma-separated value that names an existing file as a whole and a list of existing
    files as its parts (`split_patterns`): one line naming both readings."""


def _exists_as_written(path: str) -> bool:
    return exists(path) if is_remote(path) else os.path.lexists(path)


def split_patterns(patterns: str | Iterable[str],
                   exists: Callable[[str], bool] | None = None) -> list[str]:
    """The items of a comma-separated file list (or of a list of such strings), stripped,
    empty ones dropped: "a.txt, b*.txt" -> ["a.txt", "b*.txt"].

    The one rule of every tool's list flags (--input, --input_file, ...) for a comma in a
    file name: a value that names an existing path as a whole ("corpus,2024.txt") is that
    path, not a list. Where its comma-separated parts all exist too ("a", "b" beside "a,b"),
    the value is ambiguous and refused; a value that names no existing path is a list, as
    in Google's tools.

    Args:
      patterns: a comma-separated string, or a list of them.
      exists: whether a path exists, as written (default: os.path.lexists, or
        tf.io.gfile.exists for a remote path; Beam passes its FileSystems.exists).

    Raises:
      AmbiguousPathListError: both readings of a value name existing files.
    """
    exists = exists or _exists_as_written
    if isinstance(patterns, str):
        patterns = [patterns]
    found: list[str] = []
    for item in patterns:
        item = str(item)
        parts = [p.strip() for p in item.split(",") if p.strip()]
        whole = item.strip()
        if len(parts) > 1 and exists(whole):
            if all(exists(p) for p in parts):
                raise AmbiguousPathListError(
                    f"{whole!r} is an existing file and also a list of existing files "
                    f"({', '.join(parts)}): a comma separates files here; rename one of them")
            found.append(whole)
        else:
            found.extend(parts)
    return found


def glob_as_written(pattern: str, exists: Callable[[str], bool] = os.path.lexists) -> str:
    """The glob that reads a path or pattern a user typed as written: its longest leading
    part that exists as a path is escaped, the rest still globs.

    Users' directories hold glob characters ("run [1]/", "data[2024]/"); Python's glob,
    tf.io.gfile.glob and Beam read `[1]` as a character class, so "run [1]/a.txt" matched
    nothing although it exists, and "run [1]/*.txt" read "run 1/". A file that exists is
    itself; in "run [1]/*.txt", with "run [1]" a directory, only "*.txt" globs; a pattern
    no leading part of which exists ("shard-[0-4].txt") globs as before. Works for every
    file system whose glob takes `[[]` for a literal "[" (Python's, fnmatch's, TensorFlow's,
    Beam's).

    Args:
      pattern: a path or glob ("/" separated; local, or gs://... with `exists` to match).
      exists: whether a path exists on its file system (tf.io.gfile.exists, Beam's
        FileSystems.exists, ...).

    Returns:
      A glob pattern; `pattern` itself when it holds no glob character.
    """
    import glob

    if not glob.has_magic(pattern):
        return pattern
    parts = pattern.split("/")
    for end in range(len(parts), 0, -1):
        head = "/".join(parts[:end])
        if not glob.has_magic(head):
            break  # no shorter head holds a glob character to take literally
        if exists(head):
            return "/".join([glob.escape(head)] + parts[end:])
    return pattern


@contextlib.contextmanager
def glob_free(path: str) -> Iterator[str]:
    """`path`, or, while the block runs, an alias of it whose name holds no glob character,
    for TensorFlow's checkpoint readers.

    TensorFlow finds a checkpoint's index by a glob (`<prefix>.index`, in
    tf.train.load_checkpoint and the RestoreV2 op, so in tf.saved_model.load and TF
    Serving), so under "run [1]/" it found none and reported "Failed to find any matching
    files". The alias is a symbolic link in a fresh temporary directory to `path` (a file or
    directory) or, for a checkpoint prefix that is no file, to its directory; it is removed
    when the block ends. A local `path` without "[", "*" or "?" (or a system where no alias
    can be made) is yielded as it is.
    """
    import glob
    import tempfile

    path = os.fspath(path)
    absolute = os.path.abspath(path)
    if "://" in path or not glob.has_magic(absolute):
        yield path
        return
    try:
        tmp = tempfile.mkdtemp(prefix="bert-keras-path-")
    except OSError:
        yield path
        return
    link = os.path.join(tmp, "p")
    try:
        if os.path.lexists(absolute):
            target, alias = absolute, link
        else:  # a prefix: <prefix>.index and the data files are in its directory
            target = os.path.dirname(absolute)
            alias = os.path.join(link, os.path.basename(absolute))
        try:
            os.symlink(target, link)
        except OSError:
            alias = path
        yield path if glob.has_magic(alias) else alias
    finally:
        if os.path.islink(link):
            os.unlink(link)
        with contextlib.suppress(OSError):
            os.rmdir(tmp)


# The project's documents (docs/*.md) ship in the bert_keras package: bert_keras/docs is a
# link to docs/ in a checkout and package data in a wheel (pyproject.toml), so that a message
# names a file that exists in either (a `pip install .` copy has no docs/ of its own).
_DOCS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "bert_keras", "docs")
_DOC_RE = re.compile(r"\bdocs/([\w.-]+\.md)\b")


def doc_path(name: str) -> str:
    """Where this copy of the project holds its document `name` ("serving.md"): docs/ of a
    checkout, or bert_keras/docs/ of an installed one; what messages cite."""
    return os.path.realpath(os.path.join(_DOCS_DIR, name))


def cite_docs(text: str) -> str:
    """`text` with each `docs/<name>.md` it cites as `doc_path(name)` (a tool's --help: its
    module docstring)."""
    return _DOC_RE.sub(lambda m: doc_path(m.group(1)), text)


def expand_home(path: str) -> str:
    """`~` or `~user` at the start of a path replaced by the home directory, as a shell does
    for a path typed as a word of its own (it leaves `--flag=~/x` alone, and so did absl, so
    a directory named "~" was created in the working directory).

    Raises:
      ValueError: `~user` names no user (or no home directory is known), in one line.
    """
    path = os.fspath(path)
    if not path.startswith("~"):
        return path
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        raise ValueError(f"{path}: cannot expand {path.split('/')[0]} (no such user or no "
                         "home directory); write the path in full")
    return expanded


def describe_shard_set(prefix: str, count: int, suffix: str) -> str:
    """`<prefix>-*-of-00008.tfrecord`: a set in messages."""
    return f"{prefix}-*-of-{count:05d}{suffix}"


# --- Other file systems (gs://, and TensorFlow's in-process ram:// the tests use). ---
# A path holding "://" is on a file system tf.io.gfile reaches (as Keras' file_utils.
# is_remote_path judges): Cloud TPU workers read and write only such paths. Python's open,
# os and shutil would take "gs://b/x" for a relative path and write a local directory named
# "gs:". Each helper below keeps its local branch exactly as the os call it replaces.


def is_remote(path) -> bool:
    """Whether `path` is on another file system (`gs://...`, `ram://...`), read through
    tf.io.gfile, rather than a local path."""
    return "://" in os.fspath(path)


def _gfile():
    import tensorflow as tf  # only for remote paths: local tools start without it

    return tf.io.gfile


# A URI's scheme as TensorFlow's file systems parse it (tensorflow/core/platform/path.cc's
# ParseURI: a letter, then letters, digits or dots, before "://").
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9.]*)://")
# What to do with a hub's handle or a web address, which name a download, not a file.
_DOWNLOAD_HINTS = {
    "kaggle": "download it first with kagglehub (kagglehub.model_download(handle) returns "
              "the local directory)",
    "hf": "download it first with huggingface-cli download <repo> --local-dir <dir>",
    "tfhub.dev": "TF Hub's models are on Kaggle now: download it there first "
                 "(kagglehub.model_download(handle), or the page's .tar.gz, unpacked)",
    "http": "download it first (curl -LO, wget; an archive unpacked)",
}


def unserved_scheme(path, also_served: Iterable[str] = ()) -> str | None:
    """Why `path` cannot be read or written here, or None where it can: a scheme
    (`kaggle://`, `hf://`, `https://`) that none of TensorFlow's file systems serves
    (`tf.io.gfile.get_registered_schemes()`: local paths, file://, gs://, ram:// and any a
    loaded plugin adds) nor `also_served` (a Beam pipeline's paths: Beam's file systems). A
    hub's handle or a web address names a download, and nothing here downloads at run
    time: the reason says how to download it first, with the hub's tool. TensorFlow is
    imported only for a path with a scheme."""
    match = _SCHEME.match(os.fspath(path))
    if match is None:
        return None
    scheme = match.group(1)
    served = {*_gfile().get_registered_schemes(), *also_served}
    if scheme in served:
        return None
    host = os.fspath(path)[match.end():].split("/", 1)[0].lower()
    hint = _DOWNLOAD_HINTS.get(
        "tfhub.dev" if host in ("tfhub.dev", "www.tfhub.dev") else
        "http" if scheme.lower() in ("http", "https") else scheme.lower(),
        "copy it to a local path (or gs://) first")
    shown = ", ".join(f"{s}://" for s in sorted(s for s in served if s and s != "file"))
    return (f"{scheme}:// is not a file system TensorFlow reads (it reads local paths, "
            f"file://{', ' + shown if shown else ''}); {hint}, and give the local path: "
            "nothing here downloads at run time")


def absolute(path: str) -> str:
    """os.path.abspath, or a remote path as it is (abspath would make "gs://b/x" a local
    path under the working directory)."""
    return os.fspath(path) if is_remote(path) else os.path.abspath(path)


def exists(path: str) -> bool:
    """os.path.exists, or tf.io.gfile.exists for a remote path."""
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    """os.path.isdir, or tf.io.gfile.isdir for a remote path."""
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
    """os.path.isfile, or (remote) a path that exists and is no directory."""
    if is_remote(path):
        return _gfile().exists(path) and not _gfile().isdir(path)
    return os.path.isfile(path)


def listdir(path: str) -> list[str]:
    """os.listdir, or tf.io.gfile.listdir (names without a trailing "/") for a remote path.

    Raises:
      FileNotFoundError: the directory does not exist.
    """
    if not is_remote(path):
        return os.listdir(path)
    if not _gfile().isdir(path):
        raise FileNotFoundError(errno.ENOENT, "no such directory", path)
    return [name.rstrip("/") for name in _gfile().listdir(path)]


def makedirs(path: str) -> None:
    """os.makedirs(exist_ok=True), or tf.io.gfile.makedirs for a remote path."""
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
    """os.remove, or tf.io.gfile.remove for a remote path (FileNotFoundError if missing)."""
    if not is_remote(path):
        os.remove(path)
    elif not _gfile().exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    else:
        _gfile().remove(path)


def rmdir(path: str) -> None:
    """os.rmdir, or for a remote path the removal of a directory that holds nothing (on GCS
    the marker object tf.io.gfile.makedirs wrote).

    Raises:
      FileNotFoundError: no such directory.
      OSError: ENOTEMPTY, the directory holds something.
    """
    if not is_remote(path):
        os.rmdir(path)
    elif not _gfile().isdir(path):
        raise FileNotFoundError(errno.ENOENT, "no such directory", path)
    elif _gfile().listdir(path):
        raise OSError(errno.ENOTEMPTY, "directory not empty", path)
    else:
        _gfile().rmtree(path)


def rmtree(path: str) -> None:
    """shutil.rmtree(ignore_errors=True), or tf.io.gfile.rmtree of a remote directory that
    exists."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
    elif _gfile().isdir(path):
        with contextlib.suppress(Exception):  # as ignore_errors: a vanished file
            _gfile().rmtree(path)


def replace(source: str, target: str) -> None:
    """os.replace, or tf.io.gfile.rename(overwrite=True) of a remote file (GCS copies and
    deletes: not atomic there)."""
    if is_remote(source) or is_remote(target):
        _gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def read_bytes(path: str) -> bytes:
    """The bytes of the file `path` as stored (nothing decompressed), local or remote.

    Raises:
      FileNotFoundError: no such file (remote too: GFile would say so only when read).
      IsADirectoryError: `path` is a directory.
    """
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    if _gfile().isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    if not _gfile().exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    with _gfile().GFile(path, "rb") as f:
        return f.read()


def glob_files(pattern: str) -> list[str]:
    """glob.glob, or tf.io.gfile.glob for a remote pattern (both take `[[]` for "[")."""
    if is_remote(pattern):
        return _gfile().glob(pattern)
    import glob

    return glob.glob(pattern)


@contextlib.contextmanager
def local_copy(path: str, directory: bool = False) -> Iterator[str]:
    """`path`, or for a remote file a copy of it in a fresh local temporary directory,
    removed when the block ends: for readers that take only a local file (h5py, Keras'
    load_weights of a .weights.h5, as Keras itself does for a remote path). With
    `directory`, `path` is a directory, copied with everything in it (for a reader in
    another process, which cannot see ram://).

    Raises:
      FileNotFoundError: a remote `path` that does not exist.
    """
    if not is_remote(path):
        yield path
        return
    import tempfile

    if not _gfile().exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    stage = tempfile.mkdtemp(prefix="bert-keras-download-")
    try:
        local = os.path.join(stage, os.path.basename(path.rstrip("/")))
        if directory:
            _download_tree(path.rstrip("/"), local)
        else:
            _gfile().copy(path, local, overwrite=True)
        yield local
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _download_tree(remote: str, local: str) -> None:
    """Copies the remote directory `remote` to the new local directory `local`, file by
    file (listdir, not walk: ram://'s walk lists "a.extra/" under "a/")."""
    os.makedirs(local)
    for name in listdir(remote):
        source = f"{remote}/{name}"
        if _gfile().isdir(source):
            _download_tree(source, os.path.join(local, name))
        elif _gfile().exists(source):  # not a name listed and gone since (nor ram://'s
            # "a/.extra" for "a.extra/")
            _gfile().copy(source, os.path.join(local, name))


def _upload(local: str, remote: str) -> None:
    """Copies the local file `local` to `remote` under its temporary name, then renames it:
    a reader never sees a partial file (on GCS the rename is a server-side copy)."""
    tmp = temp_path(remote)
    try:
        _gfile().copy(local, tmp, overwrite=True)
        _gfile().rename(tmp, remote, overwrite=True)
    finally:
        if _gfile().exists(tmp):
            _gfile().remove(tmp)


def _upload_tree(local: str, remote: str) -> None:
    """Copies the local directory `local` to `remote`, file by file (`_upload`): the files
    of subdirectories first, its top-level files last, so that a SavedModel's
    saved_model.pb (and a run's last marker) appears only once the rest is there. Object
    stores and ram:// have no directory rename, so the directory is not atomic."""
    top, nested = [], []
    for root, _, names in os.walk(local):
        for name in names:
            (top if root == local else nested).append(os.path.join(root, name))
    _gfile().makedirs(remote)
    for path in nested + sorted(top):
        target = remote + "/" + os.path.relpath(path, local).replace(os.sep, "/")
        _gfile().makedirs(os.path.dirname(target))
        _upload(path, target)


class DirectoryInUseError(OutputExistsError):
    """Another process holds a tool's output directory (`exclusively`)."""


@contextlib.contextmanager
def exclusively(directory: str, flag: str) -> Iterator[None]:
    """Holds an exclusive lock on `directory` (flock on the directory itself; no file is
    written in it) while the block runs; creates it if missing, and removes it again if the
    block leaves it empty.

    Raises:
      DirectoryInUseError: another process holds it: one line naming `flag` and the
        directory. A file system without locks (some network mounts) is not guarded.
    """
    import fcntl

    if is_remote(directory):
        # No locks on an object store: unguarded, as on a local file system without them
        # (and os.makedirs would create a local directory named "gs:").
        yield
        return
    created = not os.path.exists(directory)
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # a file in the way: the tool's own checks name it
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryInUseError(
                f"{flag} {directory} is in use by another run of this tool (it holds the "
                f"directory's lock); wait for it to end, or choose another {flag}") from None
        except OSError:
            pass  # no locks on this file system: unguarded, as before
        yield
    finally:
        os.close(fd)
        if created and os.path.isdir(directory) and not os.listdir(directory):
            os.rmdir(directory)


def cache_root() -> str:
    """The cache directory: $BERT_KERAS_CACHE, else ~/.cache/bert-keras."""
    override = os.environ.get(CACHE_ENV)
    return os.path.expanduser(override) if override else os.path.join(
        os.path.expanduser("~"), ".cache", "bert-keras")


def fine_tuned_with(model_dir: str) -> dict:
    """What the fine-tuning of the model in `model_dir` recorded in train_results.json, or
    {} for a directory without it (a converted transformers model, a run from before these
    were recorded, an unreadable file)."""
    try:
        results = read_json(os.path.join(model_dir, TRAIN_RESULTS_FILE))
    except (OSError, ValueError):
        return {}
    return results if isinstance(results, dict) else {}


def records_no_fine_tuning(model_dir: str) -> str:
    """The words of every warning about a `model_dir` where `fine_tuned_with` finds nothing."""
    return (f"{model_dir} records no fine-tuning settings (no {TRAIN_RESULTS_FILE}: a model "
            "converted from transformers, or a run from before they were recorded)")


def sha256_file(path: str) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    import hashlib

    digest = hashlib.sha256()
    with _gfile().GFile(path, "rb") if is_remote(path) else open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class TextFileError(ValueError):
    """A user's file that should be UTF-8 text is binary or not UTF-8 (or, `JsonFileError`,
    not JSON); the message names the file and, where known, the line and byte offset."""


class JsonFileError(TextFileError):
    """A user's JSON file (a config, SQuAD's data, a sidecar) does not parse; the message
    names the file and line (`parse_json`)."""


class _GFileReader(io.RawIOBase):
    """A tf.io.gfile.GFile opened "rb" as a raw stream, so that io.BufferedReader gives it
    what Python's files have and GFile lacks (readline(size), readinto, peek)."""

    def __init__(self, gfile_file):
        super().__init__()
        self._file = gfile_file

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._file.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


def open_input(path: str, mode: str = "r", newline: str | None = None):
    """Opens a file a user gave for reading, the one way every reader opens one.

    A name ending in `.gz` or `.bz2` is read decompressed (prepare_corpus, build_vocab and
    create_pretraining_data all read compressed corpora). Text (`mode="r"`) is UTF-8
    without the byte-order mark some editors write first (Excel's "CSV UTF-8", Windows
    Notepad): read as text it would begin the first field name, JSON line or label.
    Decoding is strict; check the file first (`check_text_file`) for a message naming the
    line and byte, or catch UnicodeDecodeError and ask `first_text_error`.

    Args:
      path: a local path, or a remote one (`is_remote`, read through tf.io.gfile).
      mode: "r" (text) or "rb" (bytes, for readers that decode line by line).
      newline: as open()'s: None translates "\\r\\n" and "\\r" to "\\n" (universal
        newlines), "" keeps them (csv, and readers that split lines themselves).

    Returns:
      A file object (text or binary), to be closed by the caller.
    """
    import bz2
    import gzip

    path = os.fspath(path)
    if mode not in ("r", "rb"):
        raise ValueError(f"open_input reads: mode 'r' or 'rb', not {mode!r}")
    if is_remote(path):
        # GFile opens lazily: a missing file would fail at the first read, as NotFoundError.
        if _gfile().isdir(path):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if not _gfile().exists(path):
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        raw = io.BufferedReader(_GFileReader(_gfile().GFile(path, "rb")), 1 << 20)
        stream = (gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else
                  bz2.BZ2File(raw) if path.endswith(".bz2") else raw)
        if mode == "rb":
            return stream
        return io.TextIOWrapper(stream, encoding="utf-8-sig", errors="strict", newline=newline)
    opener = gzip.open if path.endswith(".gz") else bz2.open if path.endswith(".bz2") else open
    if mode == "rb":
        return opener(path, "rb")
    return opener(path, "rt", encoding="utf-8-sig", errors="strict", newline=newline)


def is_pipe(path: str) -> bool:
    """Whether the local `path` is a pipe or a device rather than a file: bash's process
    substitution (`<(zcat corpus.gz)`, a /dev/fd/<n>), /dev/stdin, a FIFO (mkfifo). Its
    bytes come once: a second open reads nothing (or waits for another writer), and it
    cannot be seeked. False for a regular file, a directory, a path that does not exist
    (its reader says so) and a remote path (`is_remote`: no stat there)."""
    path = os.fspath(path)
    if is_remote(path):
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def pipe_refusal(path: str) -> str:
    """The one line every tool that must read its input more than once (in several
    processes, or in several passes) refuses a pipe (`is_pipe`) with, before any work;
    the caller puts its flag first ("--input_file: ...")."""
    return (f"{path} is a pipe (e.g. <(...), /dev/stdin, a FIFO), whose bytes can be read "
            "only once; give a file: this tool reads its input more than once")


class PipeCopyError(OSError):
    """`rereadable` could not copy a pipe (no room in the temporary directory): one line
    naming the pipe, the directory and what to do. Without an errno, so that it is not
    taken for the failure of an output's write (`write_failure`)."""


# What a pipe's copy leaves free on its disk (`rereadable`): 256 MiB, or a tenth of a smaller
# file system (a 100 MB tmpfs keeps 10 MB), so that the copy of an unbounded stream stops
# before the disk is full for every other process on it.
PIPE_COPY_RESERVE_BYTES = 256 * 1024 * 1024


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


class _RoomKeepingWriter:
    """A binary file's `write` that refuses a chunk which would leave less than `reserve`
    bytes free on its disk (`rereadable`'s copy of a pipe): a pipe has no size to check
    beforehand."""

    def __init__(self, f, directory: str, reserve: int | None,
                 free_bytes: Callable[[str], int]):
        self._f, self._directory, self._free_bytes = f, directory, free_bytes
        if reserve is None:
            reserve = min(PIPE_COPY_RESERVE_BYTES, shutil.disk_usage(directory).total // 10)
        self.reserve, self.written, self.free = reserve, 0, None

    def write(self, data) -> int:
        self.free = self._free_bytes(self._directory)
        if self.free - len(data) < self.reserve:
            raise _NoRoomForCopy()
        n = self._f.write(data)
        self.written += len(data)
        return n


class _NoRoomForCopy(Exception):
    pass


@contextlib.contextmanager
def rereadable(path: str, reserve_bytes: int | None = None,
               free_bytes: Callable[[str], int] | None = None) -> Iterator[str]:
    """`path`, or for a pipe (`is_pipe`) a temporary copy of its bytes, removed when the
    block ends: for the readers that open their input more than once (`check_text_file`,
    the line-end sniff of `newline_for` / `ends_lines_in_lone_cr`, then the read). Read
    twice, a pipe gave the read nothing: a corpus, CoNLL file or examples file came back
    empty without an error.

    The copy is a spool in the temporary directory (tempfile.gettempdir(), $TMPDIR), as
    large as the pipe's data as it comes (still compressed where the name says .gz/.bz2:
    it keeps the pipe's base name, so `open_input` decompresses it the same way). A pipe's
    size is not known before it ends, so the copy checks the free space as it writes and
    stops, removed, where it would leave less than `reserve_bytes` free. Messages should
    name `path`, not the yielded name (`check_text_file`'s `name`).

    Args:
      path: the input a user named.
      reserve_bytes: bytes the copy leaves free on its disk (default: 256 MiB, or a tenth
        of a smaller file system: `PIPE_COPY_RESERVE_BYTES`).
      free_bytes: the bytes free on the file system of a directory (default:
        shutil.disk_usage(directory).free).

    Raises:
      PipeCopyError: the copy could not be made, would have filled its disk, or failed for
        want of room (a full temporary directory, a quota).
    """
    path = os.fspath(path)
    if not is_pipe(path):
        yield path
        return
    import tempfile

    try:
        stage = tempfile.mkdtemp(prefix="bert-keras-pipe-")
    except OSError as e:  # no such directory, no permission, no room
        raise PipeCopyError(
            f"{path} is a pipe, read once into a copy in the temporary directory "
            f"{tempfile.gettempdir()}, which cannot be made there: "
            f"{(e.strerror or str(e)).lower()}; set TMPDIR to a writable disk with room, or "
            "give a file") from None
    try:
        spool = os.path.join(stage, os.path.basename(path) or "input")
        try:
            with open(path, "rb") as source, open(spool, "wb") as copy:
                guarded = _RoomKeepingWriter(
                    copy, stage, reserve_bytes,
                    free_bytes or (lambda d: shutil.disk_usage(d).free))
                shutil.copyfileobj(source, guarded, 1 << 20)
        except _NoRoomForCopy:
            raise PipeCopyError(
                f"{path} is a pipe, read once into a copy in {stage}, which stopped after "
                f"{_mb(guarded.written)}: {_mb(guarded.free)} free there, and the copy leaves "
                f"{_mb(guarded.reserve)} free; set TMPDIR to a disk with room, or give a file"
            ) from None
        except OSError as e:
            if e.errno not in _NO_ROOM and e.errno != errno.EFBIG:
                raise
            raise PipeCopyError(
                f"{path} is a pipe, read once into a copy in {stage}, which failed: "
                f"{os.strerror(e.errno).lower()}; set TMPDIR to a disk with room, or give "
                "a file") from None
        yield spool
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def check_text_file(path: str, name: str | None = None) -> None:
    """Refuses a binary or non-UTF-8 file, naming the line and byte offset of the first bad
    byte (one pass over the file, decompressed as `open_input` reads it, in binary; readers
    then decode it without surprises).

    Args:
      path: the file to read.
      name: the file the message names, when `path` is a copy of it (`rereadable`).

    Raises:
      TextFileError: a NUL byte (a binary file) or a byte sequence that is not UTF-8.
      FileNotFoundError, IsADirectoryError, PermissionError: as open() raises them.
    """
    with open_input(path, "rb") as f:
        error = first_text_error(f, path if name is None else name)
    if error is not None:
        raise error


def lone_cr_message(data: bytes, path: str) -> str | None:
    """Whether `data` (a file, or its start) ends its lines with a carriage return alone
    (classic Mac OS, some exports from old tools), as a message naming `path`, or None.

    Google's readers (tf.io.gfile's readline: create_pretraining_data, extract_features, a
    vocabulary) end lines at "\\n" only and drop every "\\r", so such a file read as one
    line: one document, one example, one token. The CSV, JSONL, CoNLL, KLUE-NER, GLUE
    TSV and label readers split it (`newline_for`); readers of Google's formats refuse it.
    A stray "\\r" inside lines that end in "\\n" is not this.
    """
    lone = data.count(b"\r") - data.count(b"\r\n")
    if lone <= data.count(b"\n"):  # more lines end in "\n": stray "\r"s, if any
        return None
    return (f"{path}: lines end in a carriage return alone (\\r, classic Mac OS line ends), "
            "which this format reads as one line; expected \\n or \\r\\n line ends "
            "(convert it: tr '\\r' '\\n' < old > new)")


# How far `line_end_sample` reads past its first bytes for a line end: the longest line
# create_pretraining_data reads (pretraining_job.MAX_LINE_BYTES). Only a file's first line
# is read twice, and only when it is longer than the sample.
LINE_END_SAMPLE_LIMIT = 8 * 1024 * 1024


def line_end_sample(f, sniff_bytes: int = 64 * 1024,
                    limit: int = LINE_END_SAMPLE_LIMIT) -> bytes:
    """The start of a binary file on which `lone_cr_message` judges its line ends.

    The first `sniff_bytes`, read on while they hold no line end of either kind ("\\n" or
    "\\r") or end in a "\\r" (whose "\\n" may come next), up to `limit` bytes: a file whose
    first line is longer than `sniff_bytes` (a JSONL record of a long article) is judged by
    its first line end, not taken for "\\n"-ended for want of one, and a "\\r\\n" cut after
    its "\\r" is not counted as a lone "\\r".

    Args:
      f: a binary file object at its start (`open_input(path, "rb")`, decompressed).
      sniff_bytes: bytes read first, and on each further read.
      limit: bytes read at most.

    Returns:
      bytes, at most `limit` of them.
    """
    chunks = [f.read(min(sniff_bytes, limit))]
    size, last = len(chunks[0]), chunks[0]
    has_line_end = b"\n" in last or b"\r" in last
    while size < limit and last and (not has_line_end or last.endswith(b"\r")):
        # After a final "\r", one byte tells "\r\n" from a lone "\r".
        last = f.read(1 if has_line_end else min(sniff_bytes, limit - size))
        chunks.append(last)
        size += len(last)
        has_line_end = has_line_end or b"\n" in last or b"\r" in last
    return b"".join(chunks)


def ends_lines_in_lone_cr(path: str, sniff_bytes: int = 64 * 1024) -> bool:
    """Whether the file's lines end in a carriage return alone (`lone_cr_message`), from
    its start (`line_end_sample`: the first `sniff_bytes`, decompressed, read on to a line
    end), for readers that tell such line ends from a stray "\\r" inside a line
    (`newline_for`, the csv reader, prepare_corpus's text documents, build_vocab)."""
    with open_input(path, "rb") as f:
        return lone_cr_message(line_end_sample(f, sniff_bytes), path) is not None


def parse_json(data: bytes, path: str, expected: str | None = None) -> Any:
    """The JSON value in `data`, the bytes of the file `path` (read by any file system),
    with the messages every JSON reader gives.

    UTF-8 with or without a byte-order mark (Notepad writes one; Python's json and
    transformers refuse it); "\\r\\n" line ends are JSON whitespace.

    Args:
      data: the file's bytes.
      path: the file, for messages.
      expected: what the file should hold ("a SQuAD JSON file"), ending the message.

    Raises:
      TextFileError: not UTF-8 text (UTF-16, NUL bytes, cp949: line and byte named).
      JsonFileError: empty, or not valid JSON ("<path>:<line>: not valid JSON (<reason> at
        column <n>)").
    """
    tail = f"; expected {expected}" if expected else ""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        raise TextFileError(not_text_message(data, path))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TextFileError(not_text_message(data, path)) from None
    if not text.strip():
        raise JsonFileError(f"{path}: empty file, no JSON in it{tail}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonFileError(f"{path}:{e.lineno}: not valid JSON ({_json_reason(e)} at column "
                            f"{e.colno}){tail}") from None


def parse_json_line(line: str, where: str) -> Any:
    """The JSON value on one line of a JSON-lines file (`where`: "<file>:<line>").

    Raises:
      JsonFileError: "<file>:<line>: not valid JSON (<reason> at column <n>); expected one
        JSON object per line", as `parse_json` words it.
    """
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise JsonFileError(f"{where}: not valid JSON ({_json_reason(e)} at column {e.colno}); "
                            "expected one JSON object per line") from None


def json_object_lines(source: str, name: str) -> Iterator[tuple[str, dict]]:
    """("<name>:<line>", object) per non-blank line of the JSON-lines file `source`, named
    `name` in messages (the file `source` is a copy of: `rereadable`); lines end as
    `newline_for` says.

    Raises:
      JsonFileError: a line that is not valid JSON (`parse_json_line`), or JSON other than
        an object.
      TextFileError: a line holding a NUL byte (a binary file), worded as
        `first_text_error` words the file's first bad line.
      UnicodeDecodeError: bytes that are not UTF-8 (readers that checked the file first,
        `check_text_file`, see none).
    """
    with open_input(source, newline=newline_for(source)) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if "\x00" in line:
                with open_input(source, "rb") as raw:
                    raise first_text_error(raw, name) or TextFileError(
                        f"{name}: not UTF-8 text; expected UTF-8 text")
            where = f"{name}:{number}"
            record = parse_json_line(line, where)
            if not isinstance(record, dict):
                raise JsonFileError(f"{where}: expected a JSON object per line, got "
                                    f"{type(record).__name__}")
            yield where, record


def _json_reason(e: json.JSONDecodeError) -> str:
    # Python's json words one reason "Invalid control character at" (a raw tab, "\r" or
    # "\n" inside a string): the messages add " at column <n>" themselves.
    return e.msg.removesuffix(" at")


def newline_for(path: str) -> str:
    """open()'s `newline` for reading `path` line by line as Google's readers (tf.io.gfile)
    end lines: "\\n" ("\\r\\n" included), so that a stray "\\r" stays inside its line
    for the reader to take as whitespace (JSON between tokens, CoNLL and KLUE-NER columns)
    or drop (GLUE TSV), where universal newlines would end a line there (splitting a JSON
    object, ending a sentence); "" (line ends as written) for a file whose lines all end in
    a lone "\\r" (`ends_lines_in_lone_cr`, classic Mac OS), split at them, as pyarrow's
    (Hugging Face datasets') JSON reader splits it."""
    return "" if ends_lines_in_lone_cr(path) else "\n"


def read_json(path: str, expected: str | None = None) -> Any:
    """Reads a JSON file (`.gz`/`.bz2` decompressed, as `open_input`): `parse_json` of its
    bytes.

    Raises:
      TextFileError, JsonFileError: as `parse_json`.
      OSError: as open() raises it (FileNotFoundError, IsADirectoryError, ...).
    """
    with open_input(path, "rb") as f:
        data = f.read()
    return parse_json(data, os.fspath(path), expected)


def first_text_error(raw_lines: Iterable[bytes], path: str) -> "TextFileError | None":
    """The error `check_text_line` raises for the first of `raw_lines` (a binary file, or
    io.BytesIO(data), read line by line) that is not UTF-8 text, or None."""
    offset = 0
    for number, raw in enumerate(raw_lines, 1):
        try:
            check_text_line(raw, path, number, offset)
        except TextFileError as e:
            return e
        offset += len(raw)
    return None


def not_text_message(data: bytes, path: str) -> str:
    """`first_text_error`'s message for the first line of `data` (the start of a file,
    already read) that is not UTF-8 text: `path`:line, byte offset and how to convert the
    file (or UTF-16, a NUL byte); `path` is written as given (a caller may quote it)."""
    error = first_text_error(io.BytesIO(data), path)
    return str(error) if error is not None else f"{path}: not UTF-8 text"


def check_text_line(raw: bytes, path: str, number: int, offset: int) -> str:
    """Decodes line `number` of `path` (starting at byte `offset`) as UTF-8, or raises
    TextFileError naming the file, line and byte offset (a NUL byte: a binary file; UTF-16
    by its byte-order mark on line 1)."""
    if number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        # Excel's "Unicode text" and Notepad's "Unicode" save UTF-16 (with this mark): its
        # NUL bytes would read as a binary file.
        raise TextFileError(f"{path}:1: UTF-16 text (byte-order mark {raw[:2]!r}); expected "
                            "UTF-8 text (convert it: iconv -f utf-16 -t utf-8, or save it as "
                            "\"CSV UTF-8\" / UTF-8)")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise TextFileError(f"{path}:{number}: NUL byte at byte offset {offset + nul}: the file "
                            "looks binary; expected UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextFileError(
            f"{path}:{number}: not UTF-8 (byte {raw[e.start:e.start + 1]!r} at byte offset "
            f"{offset + e.start}); expected UTF-8 text (convert it from the encoding it was "
            "saved in, e.g. iconv -f cp949 -t utf-8 for Korean Windows text, -f latin1 for "
            "Western)"
        ) from None


def temp_path(final_path: str, pid: int | None = None) -> str:
    """The temporary name `final_path` is written under: `<dir>/.incomplete-<pid>.<name>`.

    Args:
      final_path: the path the output will have.
      pid: the writing process (default: this one). Several processes writing parts of one
        output (create_pretraining_data's workers) pass the coordinating process's pid.
    """
    head, tail = os.path.split(os.fspath(final_path))
    return os.path.join(head, f"{TEMP_PREFIX}{os.getpid() if pid is None else pid}.{tail}")


def is_temp_name(name: str) -> bool:
    """Whether a base name is an unfinished output (or any hidden file) that readers skip."""
    return name.startswith(".")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another account's live process
        return True
    return True


def remove_stale_temps(final_path: str, any_name: bool = False) -> list[str]:
    """Removes temporaries of `final_path` left by processes that no longer run.

    Args:
      final_path: the output whose temporaries to remove.
      any_name: remove those of every output in `final_path`'s directory (an export base
        directory: a killed export of version 3 left `.incomplete-<pid>.3`, and the next
        export may choose another version).

    Returns:
      The removed paths.
    """
    if is_remote(final_path):
        return []  # the writer's pid is another host's: no way to tell that it is gone
    head, tail = os.path.split(os.path.abspath(os.fspath(final_path)))
    removed = []
    try:
        names = os.listdir(head)
    except OSError:
        return removed
    for name in names:
        m = _TEMP_RE.match(name)
        if not m or (m.group("name") != tail and not any_name):
            continue
        if _pid_alive(int(m.group("pid"))):
            continue
        path = os.path.join(head, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
        removed.append(path)
    return removed


def refuse_existing(paths: Iterable[str], hint: str) -> None:
    """Raises OutputExistsError naming the existing ones among `paths`, with `hint`."""
    existing = [p for p in paths if (exists(p) if is_remote(p) else os.path.lexists(p))]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise OutputExistsError(f"{existing[0]} exists{more}; {hint}")


def refuse_an_input(output: str, output_flag: str, inputs: Iterable[str],
                    input_flag: str) -> None:
    """Raises OutputExistsError where the output is one of the tool's inputs (the same
    file through any name or link; the same name on a remote file system): writing it would
    replace what the tool reads, and an overwrite flag replaces earlier outputs, not the
    input (prepare_corpus, build_vocab, create_pretraining_data and extract_features
    replaced their input with `--overwrite`)."""
    for path in inputs:
        if is_remote(output) or is_remote(path):
            same = absolute(path) == absolute(output)
        else:
            same = (os.path.exists(output) and os.path.exists(path)
                    and os.path.samefile(path, output))
        if same:
            raise OutputExistsError(
                f"{output_flag} {output} is an input ({input_flag} {path}): writing it would "
                "replace what is read; name another output")


def _nearest_existing(path: str) -> str:
    """`path` (absolute) or its nearest ancestor that exists."""
    path = os.path.abspath(os.fspath(path))
    while not os.path.lexists(path):
        up = os.path.dirname(path)
        if up == path:
            break
        path = up
    return path


def file_in_the_way(path: str) -> str | None:
    """`path` or its nearest existing ancestor when that is not a directory (a directory
    cannot be made there), else None."""
    path = _nearest_existing(path)
    return None if not os.path.lexists(path) or os.path.isdir(path) else path


def check_writable(paths: Iterable[str]) -> None:
    """Refuses, before any work, an output that could not be written: where the nearest
    existing ancestor of its directory is a file, or a directory this process cannot create
    a file in (read-only, another account's, a read-only file system). Creates nothing: the
    output's missing directories are made when it is written (`atomic_output`).

    Tools call it where they check their flags, so that an unwritable place is refused
    before the vocabulary is trained or the evaluation run, not after. The directory is
    probed by creating and removing a temporary file in it (`.incomplete-<pid>.*`, which
    readers skip): the permission bits say nothing under root, which writes anywhere save
    on a read-only file system, nor of ACLs and network file systems. A full disk is found
    when the output is written, as before. Paths on other file systems (`gs://...`) are
    not checked.

    Args:
      paths: outputs (files or directories), not yet created or to be replaced; a symbolic
        link is checked where it points (`output_path`).

    Raises:
      OutputWriteError: `<output>: cannot be written: <why>`, the line its write would
        have ended with (the error boundary prints it).
    """
    import tempfile

    probed: set[str] = set()
    for path in paths:
        path = os.fspath(path)
        if "://" in path:
            continue
        final = output_path(path.rstrip(os.sep) or os.sep)
        parent = os.path.dirname(os.path.abspath(final))
        place = _nearest_existing(parent)
        if place in probed:
            continue
        if not os.path.isdir(place):
            raise OutputWriteError(errno.ENOTDIR, f"cannot be written: {place} is a file, not a "
                                   "directory; write elsewhere", final)
        try:
            fd, probe = tempfile.mkstemp(dir=place, prefix=f"{TEMP_PREFIX}{os.getpid()}.",
                                         suffix=".probe")
        except OSError as e:
            code = e.errno if e.errno is not None else errno.EACCES
            if code in (errno.EACCES, errno.EPERM) and place != parent:
                # Not the output's own directory (it does not exist yet): name the one that
                # refused.
                why = f"{os.strerror(code).lower()} ({place} is not writable); write elsewhere"
            elif code in _NO_ROOM or code in _NOT_WRITABLE:
                why = write_failure_cause(code)
            else:
                why = f"{(e.strerror or os.strerror(code)).lower()} ({place}); write elsewhere"
            raise OutputWriteError(code, f"cannot be written: {why}", final) from None
        os.close(fd)
        os.remove(probe)
        probed.add(place)


def make_parent_dirs(paths: Iterable[str]) -> list[str]:
    """Creates the missing parent directories of `paths`; returns the ones it created,
    outermost first, so that a run that fails can take them back (`remove_created_dirs`):
    a refused or failed run leaves no directory behind (docs/DESIGN.md section 8)."""
    created: list[str] = []
    for path in paths:
        missing = []
        parent = os.path.dirname(os.path.abspath(os.fspath(path)))
        while parent and not os.path.isdir(parent) and parent not in created:
            missing.append(parent)
            up = os.path.dirname(parent)
            if up == parent:
                break
            parent = up
        for d in reversed(missing):
            os.makedirs(d, exist_ok=True)
            created.append(d)
    return created


def remove_created_dirs(created: Iterable[str]) -> None:
    """Removes the directories `make_parent_dirs` created that are still empty, innermost
    first (a directory something else wrote into meanwhile stays)."""
    for d in reversed(list(created)):
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        with contextlib.suppress(OSError):
            os.remove(path)


def names_a_directory(path: str) -> bool:
    """`path` ends in a path separator ("out/", "gs://bucket/out/"): where a flag names an
    output file or a prefix, that is a mistake to refuse before any work (a file named
    "out" was written, or shards named "out/-00000-of-00002.tfrecord")."""
    return os.fspath(path).endswith(("/", os.sep))


def _refuse_a_directory(final_path: str) -> None:
    if os.path.isdir(final_path):
        raise OutputExistsError(f"{final_path} is a directory, and the output is a file: name "
                                "a file (in it, or elsewhere); the directory is left as it is")


@contextlib.contextmanager
def atomic_output(final_path: str, overwrite: bool = False, directory: bool = False,
                  hint: str = "pass the overwrite flag to replace it") -> Iterator[str]:
    """Yields a temporary path; renames it to `final_path` when the block completes.

    On an exception (or a kill) nothing appears under `final_path`; the temporary is removed
    (a killed process's is removed by the next write to the same path), and so are the
    parent directories this call created.

    Args:
      final_path: where the output goes; its directory is created if needed. A path that
        is a symbolic link is written where the link points (`output_path`). A remote path
        (`is_remote`) is written locally and uploaded when the block completes
        (`_remote_output`).
      overwrite: replace an existing `final_path`; otherwise it is an error.
      directory: the output is a directory (created empty, to be filled by the block).
      hint: the end of the error message when `final_path` exists.

    Yields:
      The temporary path (a file path to create, or an existing empty directory).

    Raises:
      OutputWriteError: the block's writes failed for want of room or of a writable place
        (`write_failure`), or the place was found unwritable before the block ran
        (`check_writable`), naming `final_path`.
      OutputExistsError: `final_path` exists and `overwrite` is False, or a file's
        `final_path` is a directory, which is never replaced (checked before the block runs
        and again before the rename). Before, overwriting replaced such a directory and
        everything in it: `build_vocab --output=models/ --overwrite` deleted models/.
    """
    if is_remote(final_path):
        with _remote_output(os.fspath(final_path).rstrip("/"), overwrite, directory,
                            hint) as tmp:
            yield tmp
        return
    # "out/" names the directory out: its temporary is a sibling, not a child (which
    # created out itself, then refused it as existing, and left it behind).
    # A link ("out -> /big/disk/out", "vocab.txt -> /shared/vocab.txt") says where the
    # output goes, as a shell's `>` writes through one: it is written beside the link's
    # target and renamed onto it. Before, the rename replaced the link itself with a file or
    # directory on the link's disk, leaving the target as it was.
    final_path = output_path(os.fspath(final_path).rstrip(os.sep) or os.sep)
    if not directory:
        _refuse_a_directory(final_path)
    if not overwrite:
        refuse_existing([final_path], hint)
    # The one line a tool that checked its outputs before its work gave: not a directory
    # that could not be made ("<dir>: Permission denied"), nor a file in the way.
    check_writable([final_path])
    created = make_parent_dirs([final_path])
    remove_stale_temps(final_path)
    tmp = temp_path(final_path)
    done = False
    try:
        try:
            _remove(tmp)
            if directory:
                os.makedirs(tmp)
            yield tmp
        except Exception as e:
            # A write that failed part-way (a full disk, the file-size limit, a read-only
            # place) names the output, not its temporary, nor nothing (Python's and h5py's
            # EFBIG name no file); its cause says what to do.
            error = output_write_error(e, tmp, final_name(final_path))
            if error is None:
                raise
            raise error from e
        if not os.path.lexists(tmp):
            raise FileNotFoundError(f"{tmp}: nothing was written for {final_path}")
        if os.path.lexists(final_path):
            if not directory:
                _refuse_a_directory(final_path)
            if not overwrite:
                refuse_existing([final_path], hint)
            if directory:
                old = temp_path(final_path + ".old")
                os.rename(final_path, old)
                os.rename(tmp, final_path)
                _remove(old)
                done = True
                return
        os.replace(tmp, final_path)
        done = True
    finally:
        _remove(tmp)
        if not done:
            remove_created_dirs(created)


@contextlib.contextmanager
def _remote_output(final_path: str, overwrite: bool, directory: bool,
                   hint: str) -> Iterator[str]:
    """`atomic_output` for a remote `final_path`: the block writes a local temporary (as
    Keras saves a remote .weights.h5: h5py, numpy, zipfile and TensorFlow's writers all
    write it), uploaded when the block completes (`_upload`, `_upload_tree`). A failed block
    uploads nothing."""
    import tempfile

    gfile = _gfile()
    if not directory and gfile.isdir(final_path):
        raise OutputExistsError(f"{final_path} is a directory, and the output is a file: name "
                                "a file (in it, or elsewhere); the directory is left as it is")
    if not overwrite:
        refuse_existing([final_path], hint)
    stage = tempfile.mkdtemp(prefix="bert-keras-upload-")
    try:
        # The final name (and so its extension, which Keras and h5py go by) in the stage.
        tmp = os.path.join(stage, os.path.basename(final_path) or "output")
        try:
            if directory:
                os.makedirs(tmp)
            yield tmp
        except Exception as e:
            error = output_write_error(e, tmp, final_path)
            if error is None:
                raise
            raise error from e
        if not os.path.lexists(tmp):
            raise FileNotFoundError(f"{tmp}: nothing was written for {final_path}")
        if not overwrite:
            refuse_existing([final_path], hint)
        if directory:
            if gfile.exists(final_path):
                gfile.rmtree(final_path)
            _upload_tree(tmp, final_path)
        else:
            gfile.makedirs(os.path.dirname(final_path))
            _upload(tmp, final_path)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_text(path: str, text: str, overwrite: bool = True,
               hint: str = "pass the overwrite flag to replace it") -> str:
    """Writes UTF-8 text atomically; returns `path` (`hint` ends the error if it exists)."""
    with atomic_output(path, overwrite=overwrite, hint=hint) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return path


def write_json(path: str, obj: Any, overwrite: bool = True, indent: int = 2,
               sort_keys: bool = True, ensure_ascii: bool = False) -> str:
    """Writes `obj` as JSON (no NaN) atomically; returns `path`. By default keys sorted and
    non-ASCII characters as they are; Google's files (run_squad's predictions) keep their
    keys' order and escape non-ASCII characters (`GOOGLE_JSON`)."""
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False,
                                       ensure_ascii=ensure_ascii) + "\n", overwrite)


# How Google's tools write JSON (`json.dumps(obj, indent=4)`): keys in the order written,
# non-ASCII characters escaped, so a script that opens the file in the platform's encoding
# (the official SQuAD evaluate scripts: `open(path)`; cp1252 on Windows) reads it right.
GOOGLE_JSON = {"indent": 4, "sort_keys": False, "ensure_ascii": True}


def write_jsonl(path: str, records: Iterable[Any], overwrite: bool = True) -> str:
    """Writes one JSON object per line atomically; returns `path`."""
    return write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                      overwrite)


def copy_file(source: str, path: str, overwrite: bool = True) -> str:
    """Copies `source` to `path` atomically (no-op when they are the same file)."""
    if is_remote(source) or is_remote(path):
        if os.fspath(source) == os.fspath(path):
            return path
        with atomic_output(path, overwrite=overwrite) as tmp:
            if is_remote(source):
                _gfile().copy(source, tmp, overwrite=True)
            else:
                shutil.copyfile(source, tmp)
        return path
    if os.path.exists(path) and os.path.samefile(source, path):
        return path
    with atomic_output(path, overwrite=overwrite) as tmp:
        shutil.copyfile(source, tmp)
    return path
