"""Every notebook is a lesson with a path (issue 36, point 1): it opens with what it teaches
and what it assumes, tells its story in at most about 1,800 words of prose, in short
paragraphs, and ends its lesson with a short recap, right before the exercises."""

from __future__ import annotations

import importlib.util
import re

import pytest
from notebook_cells import BOOKS, NOTEBOOKS, cell_source, read_cells

# what a word is: tools/prose_words.py's, so the count it prints is the one held here
_TOOL = importlib.util.spec_from_file_location(
    "prose_words", NOTEBOOKS.parent / "tools" / "prose_words.py"
)
prose_words = importlib.util.module_from_spec(_TOOL)
_TOOL.loader.exec_module(prose_words)

MOST_WORDS = 1850  # "at most about 1,800 words of prose"
LONGEST_PARAGRAPH = 90  # words: a paragraph a learner reads in one breath, not a page


def _items(text: str) -> list[str]:
    return re.findall(r"^(?:[*-]|\d+\.) ", text, flags=re.M)


def _prose(book: str) -> list[str]:
    return [cell_source(c) for c in read_cells(book) if c["cell_type"] == "markdown"]


def _words(text: str) -> int:
    return len(prose_words.WORD.findall(text))


@pytest.mark.parametrize("book", BOOKS)
def test_opens_with_what_it_teaches_and_assumes(book: str) -> None:
    first = _prose(book)[0]
    assert first.startswith("# "), f"{book}: the first cell is not the title"
    learn = first.split("**What you will learn**", 1)[-1].split("**What it assumes**", 1)
    assert len(learn) == 2, f"{book}: no 'What you will learn' before 'What it assumes'"
    assert 3 <= len(_items(learn[0])) <= 5, f"{book}: want 3-5 things it teaches"
    assert _items(learn[1]), f"{book}: 'What it assumes' lists nothing"


@pytest.mark.parametrize("book", BOOKS)
def test_a_recap_ends_the_lesson(book: str) -> None:
    md = _prose(book)
    ends = [i for i, s in enumerate(md) if s.startswith("## Exercises")] or [len(md)]
    recap = md[ends[0] - 1]
    assert recap.startswith("## Recap"), f"{book}: the lesson's last cell is no recap"
    assert 3 <= len(_items(recap)) <= 5, f"{book}: want a 3-5 point recap"


@pytest.mark.parametrize("book", BOOKS)
def test_the_story_is_short(book: str) -> None:
    words = sum(_words(text) for text in _prose(book))
    assert words <= MOST_WORDS, f"{book}: {words} words of prose, at most {MOST_WORDS}"
    paragraphs = [p for text in _prose(book) for p in re.split(r"\n\s*\n", text)]
    long = [p[:60] for p in paragraphs if _words(p) > LONGEST_PARAGRAPH and not _items(p)]
    assert not long, f"{book}: paragraphs over {LONGEST_PARAGRAPH} words: {long}"
