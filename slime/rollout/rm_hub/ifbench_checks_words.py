"""IFBench word and count instructions that need neither NLTK data nor anything downloaded, each
decided by the rule of IFBench's verifier of that id (allenai/IFBench, `ifbench/instructions.py`).
Where IFBench would draw a random argument (None or negative), `need_*` raises instead: a guessed
argument would grade a different instruction from the one the prompt asked for."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from slime.errors import SlimeError

PUNCT = string.punctuation
NO_PUNCTUATION = str.maketrans("", "", PUNCT)
EDGE = PUNCT + " "  # what IFBench strips from the ends of a word
_CONSONANTS = frozenset("bcdfghjklmnpqrstvwxyz")
_CONJUNCTIONS = frozenset({"and", "but", "for", "nor", "or", "so", "yet"})
_JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
_PERSON_NAMES = (
    "Emma Liam Sophia Jackson Olivia Noah Ava Lucas Isabella Mason Mia Ethan Charlotte Alexander Amelia "
    "Benjamin Harper Leo Zoe Daniel Chloe Samuel Lily Matthew Grace Owen Abigail Gabriel Ella Jacob Scarlett "
    "Nathan Victoria Elijah Layla Nicholas Audrey David Hannah Christopher Penelope Thomas Nora Andrew Aria "
    "Joseph Claire Ryan Stella Jonathan"
).split()


def need_count(name: str, value: Any) -> Any:
    """A count argument IFBench takes as given: present and not negative (it draws one otherwise)."""
    if value is None or value < 0:
        raise SlimeError(f"ifbench: argument {name}={value!r} would make IFBench draw a random value")
    return value


def need_text(name: str, value: Any) -> str:
    """A string argument IFBench takes as given: one it would replace by a random draw is refused."""
    if not isinstance(value, str):
        raise SlimeError(f"ifbench: argument {name}={value!r} must be a string")
    return value


def word_count_range(response: str, min_words: float, max_words: float) -> bool:
    """count:word_count_range: between min_words and max_words runs of word characters, inclusive."""
    lo, hi = need_count("min_words", min_words), need_count("max_words", max_words)
    return lo <= len(re.findall(r"\w+", response)) <= hi


def unique_word_count(response: str, N: float) -> bool:
    """count:unique_word_count: at least N distinct lowercased whitespace-separated words, their end
    punctuation stripped (a word of punctuation only counts as the empty word)."""
    return len({w.strip(EDGE) for w in response.lower().split()}) >= need_count("N", N)


def conjunctions(response: str, small_n: float) -> bool:
    """count:conjunctions: at least small_n different coordinating conjunctions. IFBench tells them
    apart by the word as written, so "and", "And" and "and," are three."""
    found = {w for w in response.split() if w.strip(EDGE).lower() in _CONJUNCTIONS}
    return len(found) >= need_count("small_n", small_n)


def person_names(response: str, N: float) -> bool:
    """count:person_names: at least N of IFBench's 50 first names, matched as whole words, case kept."""
    found = [n for n in _PERSON_NAMES if re.search(rf"\b{re.escape(n)}\b", response)]
    return len(found) >= need_count("N", N)


def _char_trigrams(text: str) -> set[tuple[str, str, str]]:
    return set(zip(text, text[1:], text[2:], strict=False))


def trigram_overlap(response: str, reference_text: str, percentage: float) -> bool:
    """ratio:overlap: the share of the response's distinct character trigrams that also occur in
    reference_text is within 2 points of `percentage`."""
    target = need_count("percentage", percentage)
    ours, theirs = _char_trigrams(response), _char_trigrams(need_text("reference_text", reference_text))
    if not ours:
        return False
    overlap = len(ours & theirs) / len(ours)
    return target - 2 <= overlap * 100 <= target + 2


def alphabet_loop(response: str) -> bool:
    """words:alphabet: successive words (punctuation removed) start with successive letters, z
    wrapping to a; the first word must start with an ASCII letter."""
    words = response.translate(NO_PUNCTUATION).split()
    if not words or words[0][0].lower() not in string.ascii_lowercase:
        return False
    letter = string.ascii_lowercase.index(words[0][0].lower())
    for word in words[1:]:
        letter = (letter + 1) % 26
        if word.lower()[0] != string.ascii_lowercase[letter]:
            return False
    return True


def three_vowels(response: str) -> bool:
    """words:vowel: one line (after trimming) using at most three of the vowels a, e, i, o, u."""
    lines = response.strip().split("\n")
    return len(lines) == 1 and len(set(lines[0].lower()) & set("aeiou")) <= 3


def consonant_clusters(response: str) -> bool:
    """words:consonants: every whitespace-separated word has two consonant letters side by side."""
    return all(
        any(a in _CONSONANTS and b in _CONSONANTS for a, b in zip(w, w[1:], strict=False))
        for w in response.lower().split()
    )


def punctuation_cover(response: str) -> bool:
    """count:punctuation: an interrobang (?!, !? or ‽), and . , ! ? ; : all present once one ?! (or,
    failing that, one !?) is taken out."""
    if not ("!?" in response or "?!" in response or "‽" in response):
        return False
    rest = response.replace("?!", "", 1)
    if len(rest) == len(response):
        rest = response.replace("!?", "", 1)
    return set(".,!?;:") <= set(rest)


def japanese_every_nth(response: str, N: float) -> bool:
    """count:words_japanese: each Nth whitespace-separated word (ends stripped of punctuation; empty
    and all-digit words exempt) holds a hiragana, katakana or CJK character."""
    n = need_count("N", N)
    if n == 0:
        raise SlimeError("ifbench: count:words_japanese with N=0 has no Nth word (IFBench divides by N)")
    for i, raw in enumerate(response.split(), start=1):
        word = raw.strip(EDGE)
        if i % n == 0 and word and not word.isdigit() and not _JAPANESE.search(word):
            return False
    return True


def limited_repeats(response: str, small_n: float) -> bool:
    """words:repeats: no lowercased word (punctuation removed) occurs more than small_n times."""
    limit = need_count("small_n", small_n)
    counts = Counter(response.lower().translate(NO_PUNCTUATION).split())
    return all(c <= limit for c in counts.values())


def paragraph_ends_match(response: str) -> bool:
    """words:paragraph_last_first: each non-blank line starts and ends with the same word (lowercased,
    the line's end punctuation stripped)."""
    for line in response.split("\n"):
        words = line.strip().lower().strip(EDGE).split()
        if words and words[0] != words[-1]:
            return False
    return True


def no_consecutive_initials(response: str) -> bool:
    """words:no_consecutive: no two neighbouring words (lowercased, punctuation removed) share a first letter."""
    words = response.lower().translate(NO_PUNCTUATION).split()
    return all(a[0] != b[0] for a, b in zip(words, words[1:], strict=False))


def keywords_multiple(response: str, keyword1: str, keyword2: str, keyword3: str, keyword4: str, keyword5: str) -> bool:
    """count:keywords_multiple: keyword1..5 occur 1, 2, 3, 5 and 7 times, counted as case-blind
    substrings (non-overlapping), each keyword trimmed first."""
    text = response.lower()
    wanted = zip((keyword1, keyword2, keyword3, keyword4, keyword5), (1, 2, 3, 5, 7), strict=True)
    return all(text.count(need_text(f"keyword{i}", k).strip().lower()) == n for i, (k, n) in enumerate(wanted, 1))


def odd_even_syllables(response: str) -> bool:
    """words:odd_even_syllables: syllable counts (syllapy's, as IFBench uses) alternate odd and even
    from word to word, punctuation removed."""
    try:
        import syllapy  # IFBench's syllable counter; its own dictionary ships in the package
    except ImportError as e:
        raise SlimeError("ifbench: words:odd_even_syllables needs the `syllapy` package") from e
    parities = [syllapy.count(w) % 2 for w in response.translate(NO_PUNCTUATION).lower().split()]
    return all(a != b for a, b in zip(parities, parities[1:], strict=False))


def one_of_options(response: str, options: str) -> bool:
    """format:options: the response is one of `options`. Options are split on "/", else on the
    substring "or", else on ","; a lettered list (a, b, c...) must match exactly, any other option
    case-blind with end punctuation and spaces ignored."""
    options = need_text("options", options)
    strict = re.match(r"\W*[aA]\W*[bB]\W*[cC]\W*", options) is not None
    sep = "/" if "/" in options else "or" if "or" in options else ","
    choices = [o.strip() for o in options.split(sep)]
    if strict:
        return response in choices
    answer = response.strip(EDGE).lower()
    return any(o.strip(EDGE).lower() == answer for o in choices)


def word_per_line(response: str) -> bool:
    """format:newline: with punctuation removed, as many non-empty lines as words."""
    text = response.translate(NO_PUNCTUATION).strip()
    return len([line for line in text.split("\n") if line != ""]) == len(text.split())
