r"""Turns raw documents into the input of create_pretraining_data (Google's text format).

Output: one sentence per line, a blank line after every document, UTF-8 (gzip-compressed
when --output_file ends in .gz).

Inputs (`--input`: comma-separated files, directories or globs; `--corpus_format`):
  text   one document per file (a directory means every file in it, recursively, sorted);
         blank lines or single newlines separate paragraphs, which never share a sentence.
  jsonl  one JSON object per line, the document in `--text_field` (default "text").
  wiki   a MediaWiki XML dump (`.xml` or `.xml.bz2`), streamed page by page: articles only
         (namespace 0, no redirects); wiki markup is removed with mwparserfromhell
         (templates, references, tables, files, categories and headings dropped, link text
         kept).
  auto   (default) by file name: `.jsonl[.gz]` -> jsonl, `.xml[.bz2]` -> wiki, else text.
`.gz` and `.bz2` inputs are read decompressed.

Sentences are split by sentencex (Wikimedia's rule-based segmenter for ~300 languages)
with `--language` (an ISO 639 code). For Korean use `--language=ko`: sentences end at
".", "?", "!" and their full-width forms, including the common "...다." endings, and a
quotation followed by its particle (“...”라고 말했다) stays in its sentence; then learn
the vocabulary with `build_vocab --strip_accents=false`, which keeps Hangul composed and
writes that setting beside vocab.txt, where create_pretraining_data and every later stage
read it (docs/data_prep.md).

Example:

  python -m data_prep.prepare_corpus --input=raw/ --output_file=corpus/train.txt
  python -m data_prep.prepare_corpus --input=enwiki-pages-articles.xml.bz2 \
      --output_file=corpus/wiki.txt --min_document_sentences=2

The output is written under a temporary name (data_prep/files.py) and renamed when done;
an existing output is never replaced unless --overwrite is given.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import os
import re
import time
import xml.etree.ElementTree as ElementTree
from typing import Callable, Iterator, Sequence

from absl import app
from absl import flags
from absl import logging

from data_prep import files

# allow_override: names like output_file are shared with other tools; see
# create_pretraining_data.py.
_SHARED = {"allow_override": True}

# A list flag, like build_vocab's --input, so the two tools can share one process.
_INPUT = flags.DEFINE_list(
    "input", None, "Raw documents: comma-separated files, directories or globs.", **_SHARED)
_CORPUS_FORMAT = flags.DEFINE_enum(
    "corpus_format", "auto", ["auto", "text", "jsonl", "wiki"],
    "text: one document per file; jsonl: one JSON object per line; wiki: MediaWiki XML dump.",
    **_SHARED)
_TEXT_FIELD = flags.DEFINE_string(
    "text_field", "text", "JSONL field holding the document text.", **_SHARED)
_OUTPUT_FILE = flags.DEFINE_string(
    "output_file", None, "Output text file (Google's format).", **_SHARED)
_LANGUAGE = flags.DEFINE_string(
    "language", "en", "Language code for sentence splitting (sentencex), e.g. en, de, ko.",
    **_SHARED)
_MIN_DOCUMENT_SENTENCES = flags.DEFINE_integer(
    "min_document_sentences", 1, "Drop documents with fewer sentences (2 avoids documents "
    "whose instances can only be NotNext).", **_SHARED)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing output file.", **_SHARED)

_PROGRESS_SECONDS = 10.0
# Namespaces of links that are not running text (images, categories, interwiki).
_DROP_LINK_PREFIXES = ("file:", "image:", "category:", "media:", "wikipedia:", "wp:",
                       "template:", "help:", "portal:", "special:", "talk:", "user:")
_DROP_TAGS = {"ref", "references", "table", "gallery", "math", "chem", "code", "pre", "score",
              "timeline", "syntaxhighlight", "source", "imagemap", "graph", "hiero", "noinclude",
              "includeonly", "templatedata", "mapframe", "maplink"}


class CorpusError(ValueError):
    """Bad input; the message names the file (and line) and what was expected."""


# --- Sentence splitting. ---


# A sentence longer than this is re-split (sentencex leaves some runs of sentences joined,
# e.g. after a closing quote); create_pretraining_data warns about lines over 10,000 bytes.
MAX_SENTENCE_CHARS = 1000
# Where a second pass may end a sentence: terminal punctuation, optional closing quotes or
# brackets, whitespace, then an opening quote/bracket, capital letter or digit.
_FALLBACK_BOUNDARY = re.compile(r"""(?<=[.!?])["'\u201d\u2019)\]]*\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")
_CLOSING = "\"'\u201d\u2019)]"
# Where every sentence is split again: terminal punctuation *with* closing quotes or
# brackets after it, whitespace, then a capital or digit (`...thereof." Such a provision`,
# `...uncontrollable." And`, `...brackets.] I hope`), which sentencex leaves joined; an
# abbreviation is not followed by a closing quote, so `Mr. Smith` stays whole.
_QUOTED_BOUNDARY = re.compile(r"""(?<=[.!?])["'\u201d\u2019)\]]+\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")


# A quotation's closing mark followed, with no space, by a Hangul syllable or hiragana is a
# quotative particle (Korean 라고, 라며, 이라는; Japanese と, って) inside one sentence:
# `그는 “안녕하세요.”라고 말했다.`, `彼は「こんにちは。」と言った。`. sentencex ends a sentence
# at the mark; Korean and Japanese news and fiction quote this way in most sentences with
# speech. (A new sentence after a quotation begins after a space in Korean; in Japanese
# with kanji or a bracket more often than with a particle.)
_QUOTATION_ENDS = "\"'\u201d\u2019\u300d\u300f"


def _continues_a_quotation(piece: str) -> bool:
    first = piece[:1]
    # A Hangul syllable, composed (U+AC00..U+D7A3) or, as macOS writes it (NFD), its leading
    # conjoining consonant (U+1100..U+115F); hiragana.
    return bool(first) and ("\uac00" <= first <= "\ud7a3" or "\u1100" <= first <= "\u115f"
                            or "\u3041" <= first <= "\u309f")


def _rejoin_quotations(pieces) -> list[str]:
    """sentencex's pieces of a line (their spaces kept), a quotation's end joined to the
    particle that continues its sentence."""
    out: list[str] = []
    for piece in pieces:
        if out and out[-1][-1:] in _QUOTATION_ENDS and _continues_a_quotation(piece):
            out[-1] += piece
        else:
            out.append(piece)
    return out


def _split_at(sentence: str, boundary: re.Pattern) -> list[str]:
    """Splits at the matches of `boundary`, closing quotes staying with the sentence."""
    pieces, start = [], 0
    for m in boundary.finditer(sentence):
        end = m.start() + len(m.group(0).rstrip())
        pieces.append(sentence[start:end].strip())
        start = m.end()
    pieces.append(sentence[start:].strip())
    return pieces


def _resplit_long(sentence: str, limit: int) -> list[str]:
    """Splits an over-long "sentence" at the fallback boundaries, then, if a piece is still
    over `limit` characters (a table or list without punctuation), at whitespace."""
    pieces = _split_at(sentence, _FALLBACK_BOUNDARY)
    out = []
    for piece in pieces:
        while len(piece) > limit:
            cut = piece.rfind(" ", 0, limit)
            cut = cut if cut > 0 else limit
            out.append(piece[:cut].strip())
            piece = piece[cut:].strip()
        if piece:
            out.append(piece)
    return out


# Characters Python's str.splitlines ends a line at, and str.split splits at, that Google's
# pipeline keeps inside a line and joins the words around: tf.io.gfile's readline (which
# create_pretraining_data and build_vocab follow) drops every "\r", and the tokenizer
# (Google's BasicTokenizer._clean_text, data_prep.tokenization) drops control characters
# (category Cc): \x0b, \x0c, \x1c-\x1f and U+0085. Dropped here before a line is split, so
# "The cat sat\ron the mat." is one sentence, tokenized as the raw line would be. U+2028
# and U+2029 (Zl, Zp) are whitespace to that tokenizer: they become a space with the rest.
_DROPPED_INSIDE_A_LINE = str.maketrans(dict.fromkeys("\r\x0b\x0c\x1c\x1d\x1e\x1f\x85"))


def sentence_splitter(language: str, max_chars: int = MAX_SENTENCE_CHARS) -> Callable[[str], list[str]]:
    """Returns text -> sentences for an ISO 639 language code.

    Lines end at "\n" only, as create_pretraining_data's reader (tf.io.gfile's readline)
    ends them, and a line end always ends a sentence (each line is split on its own); inside
    a line, "\r" and the control characters Python counts as line breaks are dropped and
    U+2028/U+2029 become a space, as Google's reader and tokenizer treat them
    (`_DROPPED_INSIDE_A_LINE`); whitespace runs become one space; a "sentence" without any
    letter or digit is dropped. sentencex's output is
    mended in three ways: a closing quote it put at the start of the next sentence goes back
    to the end of the previous one, a sentence is split where terminal punctuation and a
    closing quote or bracket are followed by a capital, and a sentence over `max_chars`
    characters is split again at terminal punctuation followed by a capital, and as a last
    resort at whitespace,
    so that every output line is one sentence of bounded length.

    Raises:
      CorpusError: sentencex is not installed or the code is not a language name.
    """
    try:
        import sentencex  # pylint: disable=g-import-not-at-top
    except ImportError:
        raise CorpusError("sentence splitting needs the sentencex package "
                          "(pip install sentencex)") from None
    # sentencex takes any string, falling back to its default rules for names it does not
    # know: "korean" would silently split as English. An ISO 639 code has 2 or 3 letters.
    if not re.fullmatch(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]+)*", language or ""):
        raise CorpusError(f"--language must be an ISO 639 code such as en or ko; received "
                          f"{language!r}")

    def split(text: str) -> list[str]:
        out = []
        for line in text.split("\n"):
            # Collapse whitespace runs (tabs, U+2028, ...); the output holds no character
            # that any reader of it could take for a line end.
            line = " ".join(line.translate(_DROPPED_INSIDE_A_LINE).split())
            if not line:
                continue
            for sentence in _rejoin_quotations(sentencex.segment(language, line)):
                sentence = sentence.strip()
                # sentencex ends a sentence before its closing quote: `thereof.` / `" Such`.
                lead = len(sentence) - len(sentence.lstrip(_CLOSING))
                if lead and out and sentence[lead:lead + 1] in (" ", ""):
                    out[-1] += sentence[:lead]
                    sentence = sentence[lead:].strip()
                for piece in _split_at(sentence, _QUOTED_BOUNDARY):
                    if not any(c.isalnum() for c in piece):  # stray "." or markup debris
                        continue
                    if len(piece) > max_chars:
                        out.extend(p for p in _resplit_long(piece, max_chars)
                                   if any(c.isalnum() for c in p))
                    else:
                        out.append(piece)
        return out

    return split


# --- Readers: each yields (name, text) per document. ---


def _not_text(source: str, path: str) -> files.TextFileError:
    """The error for the first line of the file `source` (decompressed) that is not UTF-8
    text, naming `path` (the file `source` is a copy of: `files.rereadable`), as every
    reader words it (`files.first_text_error`)."""
    with files.open_input(source, "rb") as f:
        error = files.first_text_error(f, path)
    return error or files.TextFileError(f"{path}: not UTF-8 text; expected UTF-8 text")


def _read_all(path: str) -> str:
    """The text of a file with its line ends as "\n": the file's "\n" (a "\r" before it or
    inside a line is kept for the splitter to drop, as Google's reader drops it), or, where
    the lines end in a lone "\r" (`files.ends_lines_in_lone_cr`, classic Mac OS), every
    "\r", as the line readers of `files.newline_for` split such a file."""
    try:
        # A pipe (<(zcat corpus.gz)) is read once, into a temporary copy
        # (`files.rereadable`): the sniff would otherwise drain it, leaving an empty text.
        with files.rereadable(path) as source:
            try:
                # newline=None translates "\r" and "\r\n" to "\n"; "" keeps every "\r".
                newline = None if files.ends_lines_in_lone_cr(source) else ""
                with files.open_input(source, newline=newline) as f:
                    text = f.read()
            except UnicodeDecodeError:
                raise _not_text(source, path) from None
            if "\x00" in text:
                raise _not_text(source, path)
    except files.PipeCopyError as e:
        raise CorpusError(str(e)) from None
    except (OSError, EOFError) as e:
        raise CorpusError(f"cannot read {path}: {e}") from None
    return text


def read_text_documents(paths: Sequence[str]) -> Iterator[tuple[str, str]]:
    """One document per file."""
    for path in paths:
        yield path, _read_all(path)


def read_jsonl_documents(paths: Sequence[str], text_field: str) -> Iterator[tuple[str, str]]:
    """One document per JSON line, text in `text_field` (empty lines are skipped).

    Raises:
      CorpusError: a line is not a JSON object or lacks a string `text_field` (names file:line).
    """
    for path in paths:
        # A pipe is read once, into a temporary copy (`files.rereadable`): the sniff of
        # `newline_for` would otherwise drain it, leaving no documents.
        try:
            with files.rereadable(path) as source:
                yield from _jsonl_documents(source, path, text_field)
        except files.PipeCopyError as e:  # `_jsonl_documents` names the errors of the read
            raise CorpusError(str(e)) from None


def _jsonl_documents(source: str, path: str, text_field: str) -> Iterator[tuple[str, str]]:
    """`read_jsonl_documents` of the file `source`, named `path` in names and messages."""
    try:
        for where, record in files.json_object_lines(source, path):
            text = record.get(text_field)
            if text_field in record and not isinstance(text, str):
                raise CorpusError(
                    f"{where}: field {text_field!r} holds "
                    f"{'null' if text is None else type(text).__name__}, not text")
            if not isinstance(text, str):
                raise CorpusError(
                    f"{where}: no string field {text_field!r} (fields: "
                    f"{sorted(record)[:10]}); set --text_field")
            yield where, text
    except files.JsonFileError as e:
        raise CorpusError(str(e)) from None
    except UnicodeDecodeError:
        raise _not_text(source, path) from None
    except (OSError, EOFError) as e:
        raise CorpusError(f"cannot read {path}: {e}") from None


def _drop_tables(wikitext: str) -> str:
    """Removes wiki tables ("{|" ... "|}" blocks, nested ones included), line by line."""
    out, depth = [], 0
    for line in wikitext.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("{|"):
            depth += 1
        if depth == 0:
            out.append(line)
        if stripped.startswith("|}") and depth > 0:
            depth -= 1
    return "\n".join(out)


def _render(code) -> str:
    """Running text of parsed wikicode (see wikitext_to_text); linear in its size."""
    import mwparserfromhell.nodes as nodes  # pylint: disable=g-import-not-at-top

    out = []
    for node in code.nodes:
        if isinstance(node, nodes.Text):
            out.append(node.value)
        elif isinstance(node, nodes.Wikilink):
            title = str(node.title).strip()
            low = title.lower()
            if low.startswith(_DROP_LINK_PREFIXES) or (
                    ":" in low and len(low.split(":", 1)[0]) <= 3):  # interwiki such as de:...
                continue
            out.append(_render(node.text) if node.text is not None else _render(node.title))
        elif isinstance(node, nodes.ExternalLink):
            if node.title is not None:
                out.append(_render(node.title))
        elif isinstance(node, nodes.Tag):
            tag = str(node.tag).strip().lower()
            if tag in _DROP_TAGS:
                continue
            if tag in ("br", "hr", "li", "dt", "dd", "p", "div"):
                out.append("\n")
            if node.contents is not None:
                out.append(_render(node.contents))
        elif isinstance(node, nodes.HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, nodes.Heading):
            out.append("\n")  # headings are not sentences; they still end a paragraph
        # Templates, comments, arguments: dropped.
    return "".join(out)


def wikitext_to_text(wikitext: str) -> str:
    """Plain running text of a wiki page: markup removed, one paragraph per line.

    Templates, references, tables, galleries, math, file/category/interwiki links and
    headings are dropped; a link keeps its shown text; bold/italic quotes are removed.
    """
    import mwparserfromhell  # pylint: disable=g-import-not-at-top

    return _render(mwparserfromhell.parse(_drop_tables(wikitext)))


def read_wiki_documents(paths: Sequence[str]) -> Iterator[tuple[str, str]]:
    """Articles of MediaWiki XML dumps, streamed (memory holds one page at a time).

    Raises:
      CorpusError: the file is not a MediaWiki XML dump (names the file).
    """
    for path in paths:
        try:
            f = files.open_input(path, "rb")  # .xml.bz2 (Wikimedia's dumps) or .xml.gz
        except OSError as e:
            raise CorpusError(f"cannot read {path}: {e}") from None
        pages = 0
        with f:
            try:
                context = ElementTree.iterparse(f, events=("start", "end"))
                _, root = next(context)
                if not root.tag.endswith("mediawiki"):
                    raise CorpusError(f"{path}: root element is <{root.tag}>; expected a "
                                      "MediaWiki XML dump (<mediawiki>)")
                for event, elem in context:
                    if event != "end" or not elem.tag.endswith("}page") and elem.tag != "page":
                        continue
                    pages += 1
                    ns = _child_text(elem, "ns")
                    redirect = any(c.tag.endswith("redirect") for c in elem)
                    title = _child_text(elem, "title")
                    text = ""
                    for child in elem:
                        if child.tag.endswith("revision"):
                            text = _child_text(child, "text")
                    root.clear()  # drop the finished page
                    if ns not in ("0", "") or redirect or not text:
                        continue
                    yield f"{path}#{title}", wikitext_to_text(text)
            except ElementTree.ParseError as e:
                raise CorpusError(f"{path}: not well-formed XML ({e}); expected a MediaWiki "
                                  "XML dump") from None
            except (OSError, EOFError) as e:
                raise CorpusError(f"cannot read {path}: {e}") from None
        if pages == 0:
            raise CorpusError(f"{path}: no <page> element; expected a MediaWiki XML dump")


def _child_text(elem, name: str) -> str:
    for child in elem:
        if child.tag == name or child.tag.endswith("}" + name):
            return child.text or ""
    return ""


# --- Input expansion and the run. ---


def expand_inputs(patterns: str | Sequence[str]) -> list[str]:
    """Files, directories (recursive) or globs, comma-separated or as a list -> file list.

    Each pattern's matches are sorted; patterns keep their order. A path that exists as
    written is read as written (`files.glob_as_written`: "run [1]/").

    Raises:
      CorpusError: naming a pattern that matches no file.
    """
    out: list[str] = []
    for pattern in files.split_patterns(patterns):
        matches = []
        for match in sorted(glob.glob(files.glob_as_written(pattern))):
            if os.path.isdir(match):
                for root, dirs, names in os.walk(match):
                    dirs.sort()
                    matches.extend(os.path.join(root, name) for name in sorted(names)
                                   if not name.startswith("."))
            elif os.path.isfile(match) or files.is_pipe(match):  # <(zcat corpus.gz) too
                matches.append(match)
        if not matches:
            raise CorpusError(f"--input: {pattern!r} matches no file")
        out.extend(matches)
    if not out:
        raise CorpusError("--input names no file")
    return out


def input_kind(path: str, input_format: str) -> str:
    """The reader for one file: the flag, or by name when it is "auto"."""
    if input_format != "auto":
        return input_format
    name = path.lower()
    for suffix in (".gz", ".bz2"):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".xml"):
        return "wiki"
    return "text"


@dataclasses.dataclass
class CorpusStats:
    """Counters of a run."""

    documents_in: int = 0
    documents_out: int = 0
    sentences: int = 0
    bytes_out: int = 0


def iter_documents(paths: Sequence[str], input_format: str,
                   text_field: str) -> Iterator[tuple[str, str]]:
    """(name, raw text) of every document, in input order."""
    for path in paths:
        kind = input_kind(path, input_format)
        if kind == "jsonl":
            yield from read_jsonl_documents([path], text_field)
        elif kind == "wiki":
            yield from read_wiki_documents([path])
        else:
            yield from read_text_documents([path])


def write_corpus(documents: Iterator[tuple[str, str]], output_file: str,
                 split: Callable[[str], list[str]], min_document_sentences: int = 1,
                 overwrite: bool = False, log: Callable[..., None] = logging.info) -> CorpusStats:
    """Writes documents in Google's format: a sentence per line, a blank line after each.

    Args:
      documents: (name, text) pairs.
      output_file: final path (written under a temporary name, renamed when complete).
      split: text -> sentences.
      min_document_sentences: documents with fewer sentences are dropped.
      overwrite: replace an existing output.
      log: printf-style logger.

    Returns:
      CorpusStats.

    Raises:
      CorpusError: the output exists (without overwrite), or no document has a sentence.
    """
    if os.path.exists(output_file) and not overwrite:
        raise CorpusError(f"refusing to overwrite {output_file}; pass --overwrite to replace it")
    stats = CorpusStats()
    start = last = time.monotonic()
    with files.atomic_output(output_file, overwrite=overwrite,
                             hint="pass --overwrite to replace it") as temp:
        # A .gz name is written gzip-compressed, as every later stage reads it; before, plain
        # text under that name failed create_pretraining_data with "Not a gzipped file".
        opener = gzip.open if output_file.endswith(".gz") else open
        with opener(temp, "wt", encoding="utf-8", newline="\n") as out:
            for _, text in documents:
                stats.documents_in += 1
                sentences = split(text)
                if len(sentences) < max(1, min_document_sentences):
                    continue
                block = "\n".join(sentences) + "\n\n"
                out.write(block)
                stats.documents_out += 1
                stats.sentences += len(sentences)
                stats.bytes_out += len(block.encode("utf-8"))
                now = time.monotonic()
                if now - last >= _PROGRESS_SECONDS:
                    last = now
                    log("documents %s read, %s written, %s sentences, %.1f MB",
                        f"{stats.documents_in:,}", f"{stats.documents_out:,}",
                        f"{stats.sentences:,}", stats.bytes_out / 1e6)
        if stats.documents_out == 0:
            raise CorpusError(f"no document with at least {max(1, min_document_sentences)} "
                              f"sentence(s) among {stats.documents_in} input document(s)")
    log("wrote %s documents (%s sentences, %.1f MB) of %s read to %s in %.1f s",
        f"{stats.documents_out:,}", f"{stats.sentences:,}", stats.bytes_out / 1e6,
        f"{stats.documents_in:,}", output_file, time.monotonic() - start)
    return stats


def main(argv: Sequence[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from data_prep import cli

    def body() -> int:
        if _MIN_DOCUMENT_SENTENCES.value < 1:
            raise CorpusError(f"--min_document_sentences must be >= 1; received "
                              f"{_MIN_DOCUMENT_SENTENCES.value}")
        output = _OUTPUT_FILE.value
        if files.names_a_directory(output) or os.path.isdir(output):
            raise CorpusError(f"--output_file {output} is a directory; name the corpus file "
                              f"(e.g. {os.path.join(output, 'train.txt')})")
        paths = expand_inputs(_INPUT.value)
        files.refuse_an_input(output, "--output_file", paths, "--input")
        split = sentence_splitter(_LANGUAGE.value)
        logging.info("reading %d file(s), e.g. %s", len(paths), paths[0])
        write_corpus(iter_documents(paths, _CORPUS_FORMAT.value, _TEXT_FIELD.value),
                     _OUTPUT_FILE.value, split, _MIN_DOCUMENT_SENTENCES.value, _OVERWRITE.value)
        return 0

    return cli.report_errors(body, (CorpusError, OSError))


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["input", "output_file"])
    cli.run(main)
