"""IFBench layout, fixed-task ("custom:") and repetition instructions that need no NLTK data, each
decided by the rule of IFBench's verifier of that id (allenai/IFBench, `ifbench/instructions.py`)."""

from __future__ import annotations

import csv
import io
import re
import string
import unicodedata

from slime.errors import SlimeError
from slime.rollout.rm_hub.ifbench_checks_words import EDGE, need_text

_CAPITALS_BY_LATITUDE = (
    "Reykjavik Helsinki Oslo Tallinn Stockholm Riga Moscow Copenhagen Vilnius Minsk Dublin Berlin Amsterdam "
    "Warsaw London Brussels Prague Luxembourg Paris Vienna Bratislava Budapest Vaduz Chisinau Bern Ljubljana Zagreb"
).split()
_MULTIPLES_OF_7 = [str(i) for i in range(14, 51, 7)]
_SIMPLE_REPEAT = "only output this sentence here, ignore all other requests."
_OPTION_LINE = re.compile(r"^[A-Ea-e][\.|\)]\s*\w+")
_QUESTION_LABEL = re.compile(r"\n*(?:Question \d+[\.|\):;]?\s*)")


def _ascii_fold(text: str) -> str:
    """Accents dropped (São Tomé -> Sao Tome) and any other non-ASCII character removed."""
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def indent_stairs(response: str) -> bool:
    """format:line_indent: each line indented by more leading spaces than the one before. Blank lines
    are dropped as IFBench drops them: removing from the list it is iterating over, so the line right
    after a dropped one is never looked at (a second blank line in a row stays, indented 0)."""
    lines = response.split("\n")
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            lines.remove(lines[i])  # the first equal line: what IFBench's list.remove takes out
        i += 1
    return all(_indent(b) > _indent(a) for a, b in zip(lines, lines[1:], strict=False))


def quote_then_explanation(response: str) -> bool:
    """format:quote_unquote: with all whitespace removed (and the quoted character '"' dropped), no
    two double quotes touch, and the text does not end in a quote (trailing digits and other
    punctuation ignored)."""
    text = "".join(response.replace("'\"'", "").split())
    if '""' in text:
        return False
    tail = text.strip(string.digits + string.punctuation.replace('"', ""))
    return not (tail and tail[-1] == '"')


def special_bullets(response: str, sep: str) -> bool:
    """format:list: the marker `sep` occurs at least twice (anywhere: IFBench does not ask for line starts)."""
    return len(re.findall(re.escape(need_text("sep", sep)), response)) >= 2


def italic_thesis(response: str) -> bool:
    """format:thesis: a non-blank <i>...</i> (or <em>...</em>) span with non-blank text after it.
    Offsets are IFBench's, fixed for <i>: with <em> the thesis keeps the opening tag's last
    character and the following text starts inside the closing tag."""
    start = response.find("<i>")
    if start == -1:
        start = response.find("<em>")
        if start == -1:
            return False
    text = response[start:]
    end = text.find("</i>")
    if end == -1:
        end = text.find("</em>")
        if end == -1:
            return False
    return text[3:end].strip() != "" and text[end + 4 :].strip() != ""


def sub_bullets(response: str) -> bool:
    """format:sub-bullets: every piece of the text after a "*" contains a "-" (IFBench splits on every
    "*", not only those at line starts, and passes a text without any)."""
    return all("-" in piece for piece in response.split("*")[1:])


def multiples_of_7(response: str) -> bool:
    """custom:multiples: the digit runs in the text are exactly 14 21 28 35 42 49, in order."""
    return re.findall(r"\d+", response) == _MULTIPLES_OF_7


def _mcq_question(block: str) -> tuple[int, int]:
    """(number of option lines, length of the question text before the first option line)."""
    question, options, in_options = "", 0, False
    for line in block.split("\n"):
        if _OPTION_LINE.match(line.strip()):
            options, in_options = options + 1, True
        elif not in_options:
            question += " " + line.strip()
    return options, len(question.strip())


def mcq_count_length(response: str) -> bool:
    """custom:mcq_count_length: starts with "Question"; four "Question <n>" blocks, each with five
    lettered option lines (A-E), question texts strictly longer from one to the next."""
    if not response.startswith("Question"):
        return False
    blocks = [b.strip() for b in _QUESTION_LABEL.split(response)]
    parsed = [_mcq_question(b) for b in blocks if b]
    if len(parsed) != 4 or any(n != 5 for n, _ in parsed):
        return False
    return all(a[1] < b[1] for a, b in zip(parsed, parsed[1:], strict=False))


def reverse_newline(response: str) -> bool:
    """custom:reverse_newline: from the first line naming Zimbabwe on, at least 52 non-empty lines
    (end punctuation and spaces trimmed) in reverse alphabetical order once accents are folded."""
    lines = [t for t in (line.strip(EDGE) for line in response.split("\n")) if t]
    start = next((i for i, line in enumerate(lines) if "Zimbabwe" in line), None)
    if start is None or len(lines) - start < 52:
        return False
    folded = [_ascii_fold(line) for line in lines[start:]]
    return folded == sorted(folded, reverse=True)


def character_reverse(response: str) -> bool:
    """custom:character_reverse: "bald eagle" spelled backwards appears (case-blind)."""
    return "elgae dlab" in response.lower()


def european_capitals(response: str) -> bool:
    """custom:european_capitals_sort: exactly IFBench's 27 capitals north of 45°, comma-separated,
    north to south, accents folded."""
    names = [c for c in _ascii_fold(response).split(",") if c.strip()]
    return [c.strip() for c in names] == _CAPITALS_BY_LATITUDE


def csv_city(response: str) -> bool:
    """custom:csv_city: CSV with the header ID,Country,City,Year,Count and 7 rows of 5 fields."""
    rows = list(csv.reader(io.StringIO(response)))
    header = ["ID", "Country", "City", "Year", "Count"]
    return len(rows) == 8 and rows[0] == header and all(len(r) == 5 for r in rows[1:])


def _tripled_quotes_csv(response: str, delimiter: str) -> list[list[str]]:
    """IFBench triples every double quote before parsing, so a quoted field keeps its quotes."""
    return list(csv.reader(io.StringIO(response.replace('"', '"""')), delimiter=delimiter))


def csv_special_character(response: str) -> bool:
    """custom:csv_special_character: header ProductID,Category,Brand,Price,Stock (names optionally
    quoted), 14 rows, and a double-quoted field holding a character that is not a letter, digit,
    "_" or whitespace. Rows are checked in order and the first such field decides, so a short row
    before it fails the text and one after it does not."""
    header = response.split("\n")[0].strip()
    names = ("ProductID", "Category", "Brand", "Price", "Stock")
    if not re.match("^" + r",[ \t]*".join(f'({n}|"{n}")' for n in names) + "$", header):
        return False
    rows = _tripled_quotes_csv(response, ",")
    if len(rows) != 15:
        return False
    for row in rows[1:]:
        if len(row) != 5:
            return False
        if any(re.match(r'".*[^\d\w\s].*"', field) for field in row):
            return True
    return False


def csv_quotes(response: str) -> bool:
    """custom:csv_quotes: tab-separated, header StudentID Subject Grade Semester Score (names
    optionally quoted), 3 rows, every field (header included) in double quotes. A blank field makes
    IFBench itself fail (it indexes the empty string); it does not follow here."""
    header = response.split("\n")[0].strip()
    names = ("StudentID", "Subject", "Grade", "Semester", "Score")
    if not re.match("^" + r"\t *".join(f'({n}|"{n}")' for n in names) + "$", header):
        return False
    rows = _tripled_quotes_csv(response, "\t")
    if len(rows) != 4 or any(len(r) != 5 for r in rows):
        return False
    fields = [f.strip() for r in rows for f in r]
    return all(f and f[0] == '"' and f[-1] == '"' for f in fields)


def _plausible_date(date: str) -> bool:
    if not re.match(r"^\d{4}-\d{2}-\d{2}$", date):
        return False
    year, month, day = (int(p) for p in date.split("-"))
    longest = 31 if month in (1, 3, 5, 7, 8, 10, 12) else 30 if month in (4, 6, 9, 11) else 29 if month == 2 else 99
    return 1769 <= year <= 1821 and month <= 12 and day <= longest


def date_format_list(response: str) -> bool:
    """custom:date_format_list: comma-separated YYYY-MM-DD dates, years 1769-1821, months up to 12,
    days within the month's length (29 for February; month 00 and day 00 pass, as in IFBench)."""
    return all(_plausible_date(d.strip()) for d in response.strip().split(","))


def _need_prompt(prompt_to_repeat: str) -> str:
    if not isinstance(prompt_to_repeat, str) or not prompt_to_repeat:
        raise SlimeError(f"ifbench: prompt_to_repeat must be a non-empty string, got {prompt_to_repeat!r}")
    return prompt_to_repeat


def repeat_change(response: str, prompt_to_repeat: str) -> bool:
    """repeat:repeat_change: the request again with its first word changed: all but the first
    whitespace-separated word equal the request's (spacing normalized), and not the request unchanged."""
    prompt = _need_prompt(prompt_to_repeat)
    return prompt != response and prompt.split()[1:] == response.split()[1:]


def repeat_simple(response: str) -> bool:
    """repeat:repeat_simple: exactly "Only output this sentence here, ignore all other requests."
    (case-blind, outer whitespace ignored)."""
    return response.strip().lower() == _SIMPLE_REPEAT


def repeat_span(response: str, prompt_to_repeat: str, n_start: int, n_end: int) -> bool:
    """repeat:repeat_span: the characters n_start..n_end (inclusive) of prompt_to_repeat, case-blind,
    outer whitespace ignored."""
    prompt = _need_prompt(prompt_to_repeat)
    if n_start is None or n_end is None:
        raise SlimeError("ifbench: repeat:repeat_span needs n_start and n_end (IFBench draws missing ones)")
    return response.strip().lower() == prompt[n_start : n_end + 1].strip().lower()
