"""The user documentation whose commands and requests the tests run: README.md and the
reference pages under docs/ it links to (DESIGN.md included: a command added there is
checked too)."""

import glob
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doc_files() -> list[str]:
    """README.md first, then docs/*.md in name order (absolute paths)."""
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def doc_texts() -> dict[str, str]:
    """{path relative to the repository: text} of every documentation page."""
    return {os.path.relpath(path, REPO): open(path, encoding="utf-8").read()
            for path in doc_files()}
