"""Evaluation data: parsers for the published file formats and loaders for the same datasets on the Hub.

Every dataset reaches the tasks in one of three shapes, whatever its source:

- language-modelling tasks (WikiText, PTB, LAMBADA passages): a list of documents (`str`), each scored as a whole;
- LAMBADA last-word accuracy: a list of passages whose last space-separated word is the target;
- the Children's Book Test: a list of `ClozeExample`.

Local formats (the files as their authors publish them):

- WikiText raw (`wiki.test.raw`): one paragraph a line; articles start at a top-level heading line ` = Title = `.
  A document is one article. Blank lines are read as empty lines (the Hub copy stores them as empty strings).
- PTB (`ptb.test.txt`, Mikolov's preprocessing): one sentence a line, `<unk>` for rare words. The whole split is
  one document, the sentences joined by newlines, as the corpus is a running text.
- LAMBADA (`lambada_test.jsonl`): one JSON object `{"text": ...}` a line.
- CBT (`cbtest_CN_test_2500ex.txt`, `cbtest_NE_test_2500ex.txt`): 21-line blocks separated by blank lines; lines
  1-20 are `N sentence`, line 21 is `21 question<TAB>answer<TAB><TAB>cand1|cand2|...|cand10` with `XXXXX` marking
  the blank in the question.

A file that does not follow its format raises `DataFormatError` naming the file and the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import RunError, UsageError

CLOZE_BLANK = "XXXXX"
CBT_CONTEXT_LINES = 20

# A top-level WikiText heading: " = Title = " (section headings are " = = Title = = ").
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


class EvaluationError(UsageError):
    """A user error at the boundary of the evaluation suite (unknown task, missing data, bad settings): exit code 2
    under the error contract of `aot_transformers.errors` (a `UsageError`, hence a `ValueError`)."""


class EvaluationFailed(RunError):
    """A task crashed while scoring (the model raised, ran out of memory, …); names the task and those finished. A
    `RunError`: exit code 1.

    The original exception is chained as `__cause__`. Nothing has been written when it is raised: results files and
    model cards are only written once every task has finished.
    """

    def __init__(self, task: str, finished: list[str], error: BaseException):
        self.task, self.finished = task, finished
        done = ", ".join(finished) if finished else "none"
        super().__init__(
            f"task {task!r} failed with {type(error).__name__}: {error} (tasks finished before it: {done}). Nothing "
            "was written: earlier results files and the model card are unchanged."
        )


class DataFormatError(EvaluationError):
    """A data file that does not follow its format; the message names the file and the line."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        self.path = str(path)
        self.line = line
        where = f"{self.path}, line {line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class ClozeExample:
    """One Children's Book Test question: a story, a question with a blank, and the candidates for the blank.

    Args:
        sentences: The context: the 20 story sentences before the question.
        question: The 21st sentence, with `XXXXX` where a word was removed.
        answer: The removed word.
        candidates: The words to choose from (10 in CBT); `answer` is one of them.
    """

    sentences: tuple[str, ...]
    question: str
    answer: str
    candidates: tuple[str, ...]

    @property
    def label(self) -> int:
        """Index of the answer among the candidates."""
        return self.candidates.index(self.answer)

    @property
    def context(self) -> str:
        """The story as one text: the sentences joined by single spaces."""
        return " ".join(self.sentences)

    def scoring_pair(self, candidate: str) -> tuple[str, str]:
        """The (context, continuation) whose continuation log-likelihood scores `candidate`.

        The context is the story and the question up to the blank; the continuation is the candidate followed by
        the rest of the question. Whitespace that ends the context moves to the continuation, so that the word
        boundary is tokenised as in running text (lm-evaluation-harness does the same).
        """
        before, after = self.question.split(CLOZE_BLANK, 1)
        context = f"{self.context} {before}"
        stripped = context.rstrip()
        return stripped, context[len(stripped) :] + candidate + after


# --- Documents from lines (shared by the local parsers and the Hub loaders, so both give identical documents).


def wikitext_documents(lines: Iterable[str], source: str | Path = "<wikitext>") -> list[str]:
    """Group the lines of a raw WikiText split (with or without their newline) into articles: one string per article,
    from its title line to the line before the next title, blank lines at its end removed. `DataFormatError` (naming
    `source`) when text appears before the first article title (not a raw WikiText split)."""
    articles: list[list[str]] = []
    for number, line in enumerate(lines, start=1):
        text = line.rstrip("\n")
        if not text.strip():
            if articles:
                articles[-1].append("\n")
            continue
        if _WIKITEXT_TITLE.match(text):
            articles.append([])
        elif not articles:
            raise DataFormatError(
                source, number, f"expected a WikiText article title ' = Title = ' before any text, got {text[:60]!r}"
            )
        articles[-1].append(text + "\n")
    if not articles:
        raise DataFormatError(source, None, "no WikiText article found (titles look like ' = Title = ')")
    return ["".join(article).rstrip("\n") + "\n" for article in articles]


def ptb_documents(sentences: Iterable[str], source: str | Path = "<ptb>") -> list[str]:
    """The Penn Treebank split as a one-element list: the sentences (stripped, as in the Hub copy) joined by newlines,
    with a final newline. `DataFormatError` (naming `source`) on a blank line, a line that looks like JSON, or no
    sentence at all."""
    kept = []
    for number, sentence in enumerate(sentences, start=1):
        text = sentence.strip()
        if not text:
            raise DataFormatError(source, number, "blank line; PTB has one sentence a line")
        if text.startswith("{") and text.endswith("}"):
            raise DataFormatError(source, number, "a JSON object; PTB is plain text, one sentence a line")
        kept.append(text)
    if not kept:
        raise DataFormatError(source, None, "no sentence found")
    return ["\n".join(kept) + "\n"]


def lambada_passages(texts: Iterable[str], source: str | Path = "<lambada>", first_line: int = 1) -> list[str]:
    """The LAMBADA passages, checked: each needs a context and a last word to predict. `DataFormatError` (naming
    `source` and the line, counted from `first_line`) for a passage with fewer than two space-separated words."""
    passages = []
    for number, text in enumerate(texts, start=first_line):
        if not isinstance(text, str) or len(text.split(" ")) < 2 or not text.split(" ")[-1]:
            raise DataFormatError(
                source, number, f"a LAMBADA passage needs a context and a last word after a space, got {text!r:.80}"
            )
        passages.append(text)
    if not passages:
        raise DataFormatError(source, None, "no passage found")
    return passages


def cloze_example(
    sentences: Sequence[str],
    question: str,
    answer: str,
    candidates: Sequence[str],
    source: str | Path,
    line: int | None,
) -> ClozeExample:
    """Build a `ClozeExample`, checking what the scoring rule relies on.

    Raises:
        DataFormatError: No blank in the question, fewer than two candidates, or an answer outside the candidates.
    """
    if question.count(CLOZE_BLANK) != 1:
        raise DataFormatError(source, line, f"the question must contain {CLOZE_BLANK} once, got {question!r:.100}")
    candidates = tuple(candidates)
    if len(candidates) < 2 or any(not c for c in candidates):
        raise DataFormatError(source, line, f"expected '|'-separated candidates, got {list(candidates)}")
    if answer not in candidates:
        raise DataFormatError(source, line, f"the answer {answer!r} is not among the candidates {list(candidates)}")
    return ClozeExample(tuple(sentences), question, answer, candidates)


# --- Local files.


def _read_lines(path: str | Path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise EvaluationError(f"data file not found: {path}")
    try:
        # Iterating the file splits on newlines only (as the Hub loaders did), not on every Unicode line break.
        with path.open(encoding="utf-8") as stream:
            return list(stream)
    except UnicodeDecodeError:
        raw = path.read_bytes()  # decode it whole to locate the bad byte (the streaming decoder's offset is local)
        try:
            raw.decode("utf-8")
            line = None
        except UnicodeDecodeError as error:
            line = raw[: error.start].count(b"\n") + 1
        raise DataFormatError(path, line, "not UTF-8 text") from None


def read_wikitext(path: str | Path) -> list[str]:
    """Articles of a raw WikiText file (`wiki.test.raw`); see `wikitext_documents`."""
    return wikitext_documents(_read_lines(path), source=path)


def read_ptb(path: str | Path) -> list[str]:
    """The PTB file (`ptb.test.txt`) as one document; see `ptb_documents`."""
    return ptb_documents(_read_lines(path), source=path)


def read_lambada(path: str | Path) -> list[str]:
    """Passages of a LAMBADA jsonl file, one `{"text": ...}` object a line (blank lines are skipped)."""
    texts = {}  # line number -> passage
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(path, number, f'not JSON ({error.msg}); LAMBADA expects {{"text": ...}}') from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataFormatError(path, number, 'expected a JSON object with a string field "text"')
        texts[number] = record["text"]
    for number, text in texts.items():  # every line is JSON: now each passage is checked
        lambada_passages([text], source=path, first_line=number)
    return lambada_passages(list(texts.values()), source=path)  # "no passage found" for a file without one


def read_cbt(path: str | Path) -> list[ClozeExample]:
    """Questions of a Children's Book Test file in the published 21-line format.

    Raises:
        DataFormatError: Naming the line that breaks the format (numbering, tabs, blank, answer).
    """
    lines = _read_lines(path)
    examples: list[ClozeExample] = []
    sentences: list[str] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip():
            if sentences:
                raise DataFormatError(path, number, f"blank line inside a block after {len(sentences)} of 21 lines")
            continue
        index, _, text = line.partition(" ")
        expected = len(sentences) + 1
        if not index.isdigit() or int(index) != expected:
            raise DataFormatError(
                path, number, f"expected a line starting with {expected} (CBT 21-line blocks), got {line[:60]!r}"
            )
        if expected <= CBT_CONTEXT_LINES:
            if "\t" in text:
                raise DataFormatError(path, number, "a context line contains a tab; only line 21 has tab fields")
            sentences.append(text)
            continue
        fields = [field for field in text.split("\t") if field]
        if len(fields) != 3:
            raise DataFormatError(
                path,
                number,
                "line 21 must be 'question<TAB>answer<TAB><TAB>cand1|...|cand10', "
                f"got {len(fields)} tab-separated fields",
            )
        question, answer, candidates = fields
        examples.append(cloze_example(sentences, question, answer, candidates.split("|"), path, number))
        sentences = []
    if sentences:
        raise DataFormatError(path, len(lines), f"the file ends inside a block ({len(sentences)} of 21 lines)")
    if not examples:
        raise DataFormatError(path, None, "no CBT question found")
    return examples
