"""IFBench's instruction checks written here, one per instruction id of IFBench's test data: each
`check(response, **kwargs) -> bool` decides the instruction as IFBench's verifier of that id does
(allenai/IFBench, `ifbench/instructions.py`), rule for rule, so the grade is the same. This module
holds the simplest ones and the registry `CHECKS`; the rest live in `ifbench_checks_words`,
`ifbench_checks_format` and `ifbench_checks_nltk` (the ones that need NLTK and its data).
`--rm-type ifbench` uses IFBench's own verifiers when the `ifbench` package is installed and these
otherwise (slime/rollout/rm_hub/ifbench.py)."""

from __future__ import annotations

import re
import string
from collections.abc import Callable

from slime.rollout.rm_hub import ifbench_checks_format as fmt
from slime.rollout.rm_hub import ifbench_checks_nltk as nl
from slime.rollout.rm_hub import ifbench_checks_words as wd

_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)
_PRIMES = frozenset(p for p in range(2, 98) if all(p % d for d in range(2, p)))  # IFBench's list: < 100


def numbers_count(response: str, N: int) -> bool:
    """count:numbers: exactly N numbers; punctuation is removed first, so 3.14 and 1,000 are one each."""
    return len(re.findall(r"\d+", response.translate(_NO_PUNCTUATION))) == N


def palindromes(response: str) -> bool:
    """words:palindrome: at least 10 words (punctuation removed, case ignored) of 5+ letters that
    read the same backwards; a repeated word counts each time."""
    words = response.translate(_NO_PUNCTUATION).lower().split()
    return sum(1 for w in words if len(w) >= 5 and w == w[::-1]) >= 10


def nested_brackets(response: str) -> bool:
    """format:parentheses: a group of (), [] or {} nested 5 deep, closed. Scanned as IFBench does:
    a closer that does not match the innermost opener starts the count over; success is decided
    when a closer closes a group after the depth reached 5."""
    pairs = {")": "(", "]": "[", "}": "{"}
    open_, deepest = [], 0
    for ch in response:
        if ch in "([{":
            open_.append(ch)
            deepest = max(deepest, len(open_))
        elif ch in pairs:
            if open_ and open_[-1] == pairs[ch]:
                open_.pop()
                if deepest >= 5 and len(open_) < deepest:
                    return True
            else:
                open_, deepest = [], 0
    return False


def nested_quotes(response: str) -> bool:
    """format:quotes: quotes inside quotes inside quotes, 3 levels, alternating " and '. As in
    IFBench, a quote character closes the innermost open quote when it is the same character and
    opens a new level otherwise; success once 3 levels have been closed from the deepest reached."""
    open_: list[str] = []
    deepest = depth = 0
    for ch in response:
        if open_ and ch == open_[-1]:
            open_.pop()
            depth -= 1
            if deepest - depth >= 3:
                return True
        elif ch in "\"'":
            open_.append(ch)
            depth += 1
            deepest = max(deepest, depth)
    return False


def prime_lengths(response: str) -> bool:
    """words:prime_lengths: every word (punctuation removed) has a prime number of characters."""
    return all(len(w) in _PRIMES for w in response.translate(_NO_PUNCTUATION).split())


def output_template(response: str) -> bool:
    """format:output_template: the three headings "My Answer:", "My Conclusion:", "Future Outlook:"
    all appear (IFBench checks presence, not order)."""
    return all(h in response for h in ("My Answer:", "My Conclusion:", "Future Outlook:"))


def no_whitespace(response: str) -> bool:
    """format:no_whitespace: no whitespace character at all."""
    return not any(ch.isspace() for ch in response)


# instruction id -> (check, the kwargs it takes from the data)
CHECKS: dict[str, tuple[Callable[..., bool], tuple[str, ...]]] = {
    "count:numbers": (numbers_count, ("N",)),
    "words:palindrome": (palindromes, ()),
    "format:parentheses": (nested_brackets, ()),
    "format:quotes": (nested_quotes, ()),
    "words:prime_lengths": (prime_lengths, ()),
    "format:output_template": (output_template, ()),
    "format:no_whitespace": (no_whitespace, ()),
    "count:word_count_range": (wd.word_count_range, ("min_words", "max_words")),
    "count:unique_word_count": (wd.unique_word_count, ("N",)),
    "count:conjunctions": (wd.conjunctions, ("small_n",)),
    "count:person_names": (wd.person_names, ("N",)),
    "ratio:overlap": (wd.trigram_overlap, ("reference_text", "percentage")),
    "words:alphabet": (wd.alphabet_loop, ()),
    "words:vowel": (wd.three_vowels, ()),
    "words:consonants": (wd.consonant_clusters, ()),
    "count:punctuation": (wd.punctuation_cover, ()),
    "count:words_japanese": (wd.japanese_every_nth, ("N",)),
    "words:repeats": (wd.limited_repeats, ("small_n",)),
    "words:paragraph_last_first": (wd.paragraph_ends_match, ()),
    "words:no_consecutive": (wd.no_consecutive_initials, ()),
    "count:keywords_multiple": (
        wd.keywords_multiple,
        ("keyword1", "keyword2", "keyword3", "keyword4", "keyword5"),
    ),
    "words:odd_even_syllables": (wd.odd_even_syllables, ()),
    "format:options": (wd.one_of_options, ("options",)),
    "format:newline": (wd.word_per_line, ()),
    "format:line_indent": (fmt.indent_stairs, ()),
    "format:quote_unquote": (fmt.quote_then_explanation, ()),
    "format:list": (fmt.special_bullets, ("sep",)),
    "format:thesis": (fmt.italic_thesis, ()),
    "format:sub-bullets": (fmt.sub_bullets, ()),
    "custom:multiples": (fmt.multiples_of_7, ()),
    "custom:mcq_count_length": (fmt.mcq_count_length, ()),
    "custom:reverse_newline": (fmt.reverse_newline, ()),
    "custom:character_reverse": (fmt.character_reverse, ()),
    "custom:european_capitals_sort": (fmt.european_capitals, ()),
    "custom:csv_city": (fmt.csv_city, ()),
    "custom:csv_special_character": (fmt.csv_special_character, ()),
    "custom:csv_quotes": (fmt.csv_quotes, ()),
    "custom:date_format_list": (fmt.date_format_list, ()),
    "repeat:repeat_change": (fmt.repeat_change, ("prompt_to_repeat",)),
    "repeat:repeat_simple": (fmt.repeat_simple, ()),
    "repeat:repeat_span": (fmt.repeat_span, ("prompt_to_repeat", "n_start", "n_end")),
    # these split sentences or words with NLTK and need its data at run time
    "ratio:stop_words": (nl.stop_words, ("percentage",)),
    "ratio:sentence_type": (nl.sentence_type_ratio, ()),
    "ratio:sentence_balance": (nl.sentence_balance, ()),
    "sentence:alliteration_increment": (nl.alliteration_increment, ()),
    "format:emoji": (nl.emoji_sentences, ()),
    "ratio:sentence_words": (nl.same_length_sentences, ()),
    "words:start_verb": (nl.start_with_verb, ()),
    "sentence:keyword": (nl.keyword_in_sentence, ("word", "N")),
    "count:pronouns": (nl.pronoun_count, ("N",)),
    "words:last_first": (nl.last_word_first_next, ()),
    "sentence:increment": (nl.increment_words, ("small_n",)),
    "format:no_bullets_bullets": (nl.sentences_then_bullets, ()),
    "custom:word_reverse": (nl.word_reverse, ()),
    "custom:sentence_alphabet": (nl.sentence_alphabet, ()),
    "words:keywords_specific_position": (nl.keyword_at_position, ("keyword", "n", "m")),
    "words:words_position": (nl.words_position, ("keyword",)),
    "format:title_case": (nl.title_case, ()),
}
