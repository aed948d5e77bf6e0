"""IFBench instructions whose verifiers split sentences or words with NLTK, or read its stop-word
list or part-of-speech tagger, each decided by the rule of IFBench's verifier of that id
(allenai/IFBench, `ifbench/instructions.py`). NLTK's own tokenizers are used, not an imitation: a
look-alike splits some texts differently and so grades differently. They need the `nltk` package
and its data (`punkt_tab`, `stopwords`, `averaged_perceptron_tagger_eng`) on NLTK's search path
(e.g. NLTK_DATA); without them a check raises, naming what is missing, rather than downloading."""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable
from typing import Any

from slime.errors import SlimeError
from slime.rollout.rm_hub.ifbench_checks_words import EDGE, NO_PUNCTUATION, need_count, need_text

_PRONOUNS = frozenset(
    "i me we us you he him she her it they them my mine our ours your yours his hers its their theirs "
    "myself ourselves yourself yourselves himself herself itself themselves this that these those "
    "who whom whose which what whoever whomever whatever whichever anybody anyone anything everybody "
    "everyone everything nobody nothing somebody someone something each either neither both all some any none".split()
)


def _nltk() -> Any:
    try:
        import nltk
    except ImportError as e:
        raise SlimeError("ifbench: this IFBench instruction needs the `nltk` package and its data") from e
    return nltk


def _with_data(resource: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except LookupError as e:
        raise SlimeError(
            f"ifbench: NLTK data {resource!r} is not installed (put it on NLTK_DATA; nothing is downloaded here)"
        ) from e


def sentences(text: str) -> list[str]:
    """IFBench's sentence split: NLTK's English Punkt (`nltk.sent_tokenize`)."""
    nltk = _nltk()
    return _with_data("punkt_tab", lambda: nltk.sent_tokenize(text))


def word_tokens(text: str) -> list[str]:
    """IFBench's word split: `nltk.word_tokenize` (Treebank rules inside Punkt sentences)."""
    nltk = _nltk()
    return _with_data("punkt_tab", lambda: nltk.word_tokenize(text))


@functools.lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    nltk = _nltk()
    return frozenset(_with_data("stopwords", lambda: nltk.corpus.stopwords.words("english")))


def stop_words(response: str, percentage: float) -> bool:
    """ratio:stop_words: NLTK's English stop words (case-blind) are at most `percentage`% of the runs
    of word characters; a text without any word fails."""
    limit = need_count("percentage", percentage)
    words = re.findall(r"\w+", response)
    if not words:
        return False
    stops = _stopwords()
    return sum(1 for w in words if w.lower() in stops) / len(words) * 100 <= limit


def _endings(response: str) -> tuple[int, int, int]:
    found = sentences(response)
    return tuple(sum(1 for s in found if s.endswith(end)) for end in ".?!")  # type: ignore[return-value]


def sentence_type_ratio(response: str) -> bool:
    """ratio:sentence_type: twice as many sentences ending in "." as ending in "?"."""
    statements, questions, _ = _endings(response)
    return statements == 2 * questions


def sentence_balance(response: str) -> bool:
    """ratio:sentence_balance: as many sentences ending in "." as in "?" as in "!"."""
    statements, questions, exclamations = _endings(response)
    return statements == questions == exclamations


def _alliteration_score(sentence: str) -> int:
    """Words in runs of a shared first letter: a run of k words scores k (leading punctuation ignored)."""
    words = [w for w in (raw.lstrip(EDGE) for raw in sentence.lower().split()) if w]
    score, in_run = 0, False
    for a, b in zip(words, words[1:], strict=False):
        if a[0] == b[0]:
            score += 1 if in_run else 2
        in_run = a[0] == b[0]
    return score


def alliteration_increment(response: str) -> bool:
    """sentence:alliteration_increment: each sentence's alliteration score is above the one before's
    (the first one's need only be 0 or more)."""
    scores = [-1] + [_alliteration_score(s) for s in sentences(response)]
    return all(b > a for a, b in zip(scores, scores[1:], strict=False))


def emoji_sentences(response: str) -> bool:
    """format:emoji: every sentence (punctuation removed, trimmed) ends in an emoji in its last or
    second-to-last character, or, for any but the last sentence, the next sentence starts with one
    (an emoji after the full stop is split off into the next sentence)."""
    try:
        import emoji
    except ImportError as e:
        raise SlimeError("ifbench: format:emoji needs the `emoji` package") from e
    found = [s.translate(NO_PUNCTUATION).strip() for s in sentences(response)]
    for i, text in enumerate(found):
        if not text:
            return False
        if emoji.is_emoji(text[-1]) or emoji.is_emoji(text[-2] if len(text) > 1 else text[-1]):
            continue
        if i == len(found) - 1 or not found[i + 1] or not emoji.is_emoji(found[i + 1][0]):
            return False
    return True


def same_length_sentences(response: str) -> bool:
    """ratio:sentence_words: exactly three sentences, equally many characters each once trimmed
    (IFBench does not check that the words differ)."""
    found = sentences(response)
    return len(found) == 3 and len({len(s.strip()) for s in found}) == 1


def start_with_verb(response: str) -> bool:
    """words:start_verb: NLTK's perceptron tagger tags the first token a verb (VB, VBD, VBG, ...)."""
    nltk = _nltk()
    tokens = word_tokens(response)
    if not tokens:
        return False
    tags = _with_data("averaged_perceptron_tagger_eng", lambda: nltk.pos_tag(tokens))
    return bool(tags) and "VB" in tags[0][1]


def keyword_in_sentence(response: str, word: str, N: float) -> bool:
    """sentence:keyword: `word` (whole word, case-blind) is in sentence N. N=0 looks at the last
    sentence, as IFBench's index N-1 does."""
    if not word:
        raise SlimeError(f"ifbench: sentence:keyword needs a word, got {word!r} (IFBench would draw one)")
    n = need_count("N", N)
    found = sentences(response)
    if len(found) < n:
        return False
    return re.search(rf"\b{re.escape(word)}\b", found[int(n - 1)], re.IGNORECASE) is not None


def pronoun_count(response: str, N: float) -> bool:
    """count:pronouns: at least N of IFBench's pronouns among the lowercased NLTK word tokens, "/"
    read as a space (she/her/hers counts three)."""
    tokens = word_tokens(response.replace("/", " ").lower())
    return sum(1 for t in tokens if t in _PRONOUNS) >= need_count("N", N)


def last_word_first_next(response: str) -> bool:
    """words:last_first: each sentence's last word (trailing punctuation trimmed) is the next one's
    first word (leading punctuation trimmed), case-blind."""
    found = sentences(response)
    for a, b in zip(found, found[1:], strict=False):
        last, first = a.rstrip(EDGE).split(), b.lstrip(EDGE).split()
        if not last or not first or last[-1].lower() != first[0].lower():
            return False
    return True


def increment_words(response: str, small_n: float) -> bool:
    """sentence:increment: each sentence has exactly small_n more words (punctuation removed) than
    the one before."""
    step = need_count("small_n", small_n)
    counts = [len(s.translate(NO_PUNCTUATION).split()) for s in sentences(response)]
    return all(b == a + step for a, b in zip(counts, counts[1:], strict=False))


def sentences_then_bullets(response: str) -> bool:
    """format:no_bullets_bullets: lines of prose holding at least two sentences, then at least two
    lines starting with "*", and nothing else after the first bullet. As in IFBench, a prose line
    with no sentence (a blank one) ends the prose: any later line must be a bullet."""
    in_prose, prose_sentences, bullets = True, 0, 0
    for line in response.split("\n"):
        if line.strip().startswith("*"):
            if prose_sentences < 2:
                return False
            in_prose, bullets = False, bullets + 1
        elif in_prose:
            found = sentences(line.strip())
            prose_sentences += len(found)
            in_prose = bool(found)
        else:
            return False
    return bullets >= 2


def word_reverse(response: str) -> bool:
    """custom:word_reverse: read back to front word by word (lowercased, punctuation removed), the
    text contains "bald eagle" and NLTK keeps it one sentence."""
    text = " ".join(response.lower().strip().translate(NO_PUNCTUATION).split()[::-1])
    return "bald eagle" in text and text in sentences(text)


def sentence_alphabet(response: str) -> bool:
    """custom:sentence_alphabet: exactly 26 sentences, the nth one's first word starting with the
    nth letter (case-blind)."""
    found = sentences(response)
    if len(found) != 26:
        return False
    firsts = [s.split()[0].lower()[0] if s.split() else "" for s in found]
    return firsts == list(string.ascii_lowercase)


def keyword_at_position(response: str, keyword: str, n: int, m: int) -> bool:
    """words:keywords_specific_position: word m of sentence n is `keyword` (case-blind), counting
    NLTK tokens with a letter or digit in them."""
    if not keyword or not n or not m:
        raise SlimeError(f"ifbench: keyword={keyword!r}, n={n!r}, m={m!r}: IFBench draws an empty one at random")
    found = sentences(response)
    if len(found) < n:
        return False
    words = [t for t in word_tokens(found[n - 1]) if any(ch.isalnum() for ch in t)]
    return len(words) >= m and words[m - 1].lower() == keyword.strip().lower()


def words_position(response: str, keyword: str) -> bool:
    """words:words_position: the second NLTK token and the second-to-last one (not counting a final
    punctuation token) are both `keyword`, case-blind."""
    target = need_text("keyword", keyword).strip().lower()
    tokens = word_tokens(response)
    if len(tokens) < 2:
        return False
    if tokens[-1] in string.punctuation:  # a substring test, as IFBench's: "" and ".," count too
        return len(tokens) >= 3 and tokens[1].lower() == tokens[-3].lower() == target
    return tokens[1].lower() == tokens[-2].lower() == target


def title_case(response: str) -> bool:
    """format:title_case: no NLTK token that starts with a letter starts lowercase while the rest
    of it is all one case (so "a", "the" and "eBAY" fail, "iPhone" and "x1" pass)."""
    for token in word_tokens(response):
        if not token or not token[0].isalpha() or not token[0].islower():
            continue
        rest = token[1:]
        if not rest or rest.isupper() or rest.islower():
            return False
    return True
