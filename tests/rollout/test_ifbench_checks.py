"""The IFBench checks written here (`--rm-type ifbench` without IFBench's package): one per
instruction id of IFBench's test data, each given hand-made responses that follow it and that do
not, as IFBench's verifier of that id grades them, plus the argument cases IFBench handles."""

from __future__ import annotations

import string

import pytest

from slime.errors import SlimeError
from slime.rollout.rm_hub.ifbench import compute_ifbench_reward, follow_instruction_list
from slime.rollout.rm_hub.ifbench_checks import CHECKS

# The instruction ids of allenai/IFBench's data/IFBench_test.jsonl, commit
# db69a6f05689830b0068b8f1529ebcfd2f3b164c.
IFBENCH_TEST_IDS = {
    "count:conjunctions", "count:keywords_multiple", "count:numbers", "count:person_names", "count:pronouns",
    "count:punctuation", "count:unique_word_count", "count:word_count_range", "count:words_japanese",
    "custom:character_reverse", "custom:csv_city", "custom:csv_quotes", "custom:csv_special_character",
    "custom:date_format_list", "custom:european_capitals_sort", "custom:mcq_count_length", "custom:multiples",
    "custom:reverse_newline", "custom:sentence_alphabet", "custom:word_reverse", "format:emoji",
    "format:line_indent", "format:list", "format:newline", "format:no_bullets_bullets", "format:no_whitespace",
    "format:options", "format:output_template", "format:parentheses", "format:quote_unquote", "format:quotes",
    "format:sub-bullets", "format:thesis", "format:title_case", "ratio:overlap", "ratio:sentence_balance",
    "ratio:sentence_type", "ratio:sentence_words", "ratio:stop_words", "repeat:repeat_change",
    "repeat:repeat_simple", "repeat:repeat_span", "sentence:alliteration_increment", "sentence:increment",
    "sentence:keyword", "words:alphabet", "words:consonants", "words:keywords_specific_position",
    "words:last_first", "words:no_consecutive", "words:odd_even_syllables", "words:palindrome",
    "words:paragraph_last_first", "words:prime_lengths", "words:repeats", "words:start_verb", "words:vowel",
    "words:words_position",
}  # fmt: skip

_CAPITALS = (
    "Reykjavik, Helsinki, Oslo, Tallinn, Stockholm, Riga, Moscow, Copenhagen, Vilnius, Minsk, Dublin, Berlin, "
    "Amsterdam, Warsaw, London, Brussels, Prague, Luxembourg, Paris, Vienna, Bratislava, Budapest, Vaduz, "
    "Chisinau, Bern, Ljubljana, Zagreb"
)
_AFRICA = sorted(
    "Algeria Angola Benin Botswana Burkina-Faso Burundi Cameroon Cape-Verde Chad Comoros Congo Djibouti Egypt "
    "Eritrea Eswatini Ethiopia Gabon Gambia Ghana Guinea Guinea-Bissau Kenya Lesotho Liberia Libya Madagascar "
    "Malawi Mali Mauritania Mauritius Morocco Mozambique Namibia Niger Nigeria Rwanda São-Tomé Senegal "
    "Seychelles Sierra-Leone Somalia South-Africa South-Sudan Sudan Tanzania Togo Tunisia Uganda Zambia "
    "Central-African-Republic Equatorial-Guinea DR-Congo "
    "Zimbabwe Ivory-Coast".split(),
    key=lambda c: c.replace("ã", "a").replace("é", "e"),
    reverse=True,
)
_CITY_ROWS = "".join(f"\n{i},France,Paris,2000,{i * 3}" for i in range(1, 8))
_PRODUCT_ROWS = "".join(f"\n{i},Toys,Acme,9.99,{i}" for i in range(1, 14))
_STUDENTS = '"StudentID"\t"Subject"\t"Grade"\t"Semester"\t"Score"'
_STUDENT_ROW = '\n"1"\t"Math"\t"A"\t"Fall"\t"93"'


def _mcq(*questions: str) -> str:
    options = "\nA) one\nB) two\nC) three\nD) four\nE) five"
    return "\n".join(f"Question {i}: {q}{options}" for i, q in enumerate(questions, 1))


# (id, kwargs, response, follows): every id has at least one case of each outcome.
PLAIN_CASES = [
    ("count:numbers", {"N": 2.0}, "Pi is 3.14 and 1,000 is big.", True),
    ("count:numbers", {"N": 3}, "Pi is 3.14 and 1,000 is big.", False),
    ("words:palindrome", {}, "level radar civic kayak refer madam rotor stats tenet sagas", True),
    ("words:palindrome", {}, "level radar civic kayak refer madam rotor stats tenet", False),
    ("format:parentheses", {}, "(a [b {c (d [e] d) c} b] a)", True),
    ("format:parentheses", {}, "(a [b {c (d) c} b] a)", False),
    ("format:quotes", {}, "He said \"she said 'they said \"go\" loudly' softly\" once.", True),
    ("format:quotes", {}, "He said \"she said 'go' softly\" once.", False),
    ("words:prime_lengths", {}, "We ate pie.", True),
    ("words:prime_lengths", {}, "I ate pie.", False),
    ("format:output_template", {}, "My Answer: yes My Conclusion: fine Future Outlook: good", True),
    ("format:output_template", {}, "My Answer: yes My Conclusion: fine", False),
    ("format:no_whitespace", {}, "no_spaces_here", True),
    ("format:no_whitespace", {}, "one space", False),
    ("count:word_count_range", {"min_words": 3.0, "max_words": 5.0}, "it's a dog", True),  # it, s, a, dog
    ("count:word_count_range", {"min_words": 3, "max_words": 5}, "one two", False),
    ("count:word_count_range", {"min_words": 3, "max_words": 5}, "a b c d e f", False),
    ("count:unique_word_count", {"N": 3.0}, "Red, red blue green.", True),
    ("count:unique_word_count", {"N": 3}, "Red red RED.", False),
    ("count:conjunctions", {"small_n": 2.0}, "I came and saw, but left.", True),
    ("count:conjunctions", {"small_n": 2}, "and AND", True),  # told apart as written
    ("count:conjunctions", {"small_n": 2}, "and so, and and", True),
    ("count:conjunctions", {"small_n": 2}, "and and and", False),
    ("count:person_names", {"N": 2.0}, "Emma met Liam.", True),
    ("count:person_names", {"N": 2}, "emma met Liam and Liamson.", False),
    ("ratio:overlap", {"reference_text": "abcdef", "percentage": 50.0}, "abcdxx", True),
    ("ratio:overlap", {"reference_text": "abcdef", "percentage": 50}, "abcxyz", False),
    ("ratio:overlap", {"reference_text": "abcdef", "percentage": 50}, "ab", False),  # no trigram at all
    ("words:alphabet", {}, "Apple, banana cat dog.", True),
    ("words:alphabet", {}, "zebra apple", True),
    ("words:alphabet", {}, "Apple cat", False),
    ("words:alphabet", {}, "1 apple", False),
    ("words:vowel", {}, "bad cat sat on a mat", True),
    ("words:vowel", {}, "a e i o", False),
    ("words:vowel", {}, "bad\ncat", False),
    ("words:consonants", {}, "strong brick", True),
    ("words:consonants", {}, "strong idea", False),
    ("count:punctuation", {}, "Really?! Yes. No, well; so: what? Wow!", True),
    ("count:punctuation", {}, "Really?! Yes. No, well; so: what?", False),
    ("count:punctuation", {}, "Hi. a, b; c: d!?", False),
    ("count:words_japanese", {"N": 2.0}, "hello 日本 world カタカナ", True),
    ("count:words_japanese", {"N": 2}, "hello 42 world", True),  # numbers are exempt
    ("count:words_japanese", {"N": 2}, "hello world", False),
    ("words:repeats", {"small_n": 2.0}, "the cat the dog", True),
    ("words:repeats", {"small_n": 2}, "The the, THE", False),
    ("words:paragraph_last_first", {}, "Home is where home\n\nRun fast, run.", True),
    ("words:paragraph_last_first", {}, "Home is here", False),
    ("words:no_consecutive", {}, "the cat ran home", True),
    ("words:no_consecutive", {}, "the tall cat", False),
    (
        "count:keywords_multiple",
        {"keyword1": "sun", "keyword2": "moon", "keyword3": "star", "keyword4": " sky", "keyword5": "SEA"},
        "Sun moon moon star star star sky sky sky sky sky sea sea sea sea sea sea sea",
        True,
    ),
    (
        "count:keywords_multiple",
        {"keyword1": "sun", "keyword2": "moon", "keyword3": "star", "keyword4": "sky", "keyword5": "sea"},
        "sun moon moon star star star sky sky sky sky sky sea sea sea sea sea sea",
        False,
    ),
    ("words:odd_even_syllables", {}, "Cat, apple dog water.", True),
    ("words:odd_even_syllables", {}, "cat apple dog banana", False),
    ("format:options", {"options": "yes/no/maybe"}, "Yes.", True),
    ("format:options", {"options": "yes/no/maybe"}, "Yes, because it is.", False),
    ("format:options", {"options": "I know or I don't know"}, "i know!", True),
    ("format:options", {"options": "a), b), c), d)"}, "b)", True),
    ("format:options", {"options": "a), b), c), d)"}, " b)", False),  # lettered options match exactly
    ("format:options", {"options": "a), b), c), d)"}, "B", False),
    ("format:newline", {}, "one\ntwo,\nthree", True),
    ("format:newline", {}, "one two\nthree", False),
    ("format:line_indent", {}, "a\n b\n\n  c", True),
    ("format:line_indent", {}, "a\n b\n c", False),
    ("format:line_indent", {}, "a\n\n\n b", False),  # IFBench keeps the second blank line, at indent 0
    ("format:quote_unquote", {}, '"To be" means to exist.', True),
    ("format:quote_unquote", {}, 'He said "hi" 2.', False),
    ("format:quote_unquote", {}, '"a" "b" c', False),
    ("format:list", {"sep": "SEPARATOR"}, "SEPARATOR apples SEPARATOR pears", True),
    ("format:list", {"sep": "SEPARATOR"}, "SEPARATOR apples", False),
    ("format:thesis", {}, "<i>Cats rule.</i> They do.", True),
    ("format:thesis", {}, "<em>Cats rule.</em> They do.", True),
    ("format:thesis", {}, "<i>Cats rule.</i>", False),
    ("format:thesis", {}, "<i> </i> They do.", False),
    ("format:thesis", {}, "Cats rule. They do.", False),
    ("format:sub-bullets", {}, "* fruit\n  - apple\n* veg\n  - kale", True),
    ("format:sub-bullets", {}, "no bullets at all", True),
    ("format:sub-bullets", {}, "* fruit\n* veg\n  - kale", False),
    ("custom:multiples", {}, "14, 21, 28, 35, 42, 49", True),
    ("custom:multiples", {}, "7, 14, 21, 28, 35, 42, 49", False),
    ("custom:mcq_count_length", {}, _mcq("Who?", "Who painted?", "Who painted it?", "Who painted it first?"), True),
    ("custom:mcq_count_length", {}, "Here:\n" + _mcq("Who?", "Who is?", "Who is it?", "Who is it now?"), False),
    ("custom:mcq_count_length", {}, _mcq("Who painted it?", "Who?", "Who is it?", "Who is it now?"), False),
    ("custom:mcq_count_length", {}, _mcq("Who?", "Who is?", "Who is it?"), False),
    ("custom:reverse_newline", {}, "Here they are:\n" + "\n".join(_AFRICA), True),
    ("custom:reverse_newline", {}, "\n".join(_AFRICA[:30] + _AFRICA[31:30:-1] + _AFRICA[30:]), False),
    ("custom:reverse_newline", {}, "\n".join(_AFRICA[:40]), False),
    ("custom:character_reverse", {}, "Elgae dlab.", True),
    ("custom:character_reverse", {}, "The bald eagle.", False),
    ("custom:european_capitals_sort", {}, _CAPITALS.replace("Reykjavik", "Reykjavík"), True),
    ("custom:european_capitals_sort", {}, _CAPITALS.replace("Oslo, Tallinn", "Tallinn, Oslo"), False),
    ("custom:european_capitals_sort", {}, _CAPITALS.replace(", Zagreb", ""), False),
    ("custom:csv_city", {}, "ID,Country,City,Year,Count" + _CITY_ROWS, True),
    ("custom:csv_city", {}, "ID,Country,City,Year,Count" + _CITY_ROWS[:-20], False),
    ("custom:csv_city", {}, "Id,Country,City,Year,Count" + _CITY_ROWS, False),
    ("custom:csv_special_character", {}, 'ProductID, Category,Brand,Price,Stock' + _PRODUCT_ROWS + '\n14,"Tom & Jerry",Acme,1,2', True),
    ("custom:csv_special_character", {}, "ProductID,Category,Brand,Price,Stock" + _PRODUCT_ROWS + "\n14,Tom & Jerry,Acme,1,2", False),
    ("custom:csv_special_character", {}, 'ProductID,Category,Brand,Price,Stock' + _PRODUCT_ROWS, False),
    ("custom:csv_quotes", {}, _STUDENTS + _STUDENT_ROW * 3, True),
    ("custom:csv_quotes", {}, _STUDENTS + _STUDENT_ROW * 2 + '\n"1"\t"Math"\tA\t"Fall"\t"93"', False),
    ("custom:csv_quotes", {}, _STUDENTS + _STUDENT_ROW * 2 + '\n"1"\t\t"A"\t"Fall"\t"93"', False),  # IFBench crashes
    ("custom:csv_quotes", {}, _STUDENTS + _STUDENT_ROW * 2, False),
    ("custom:date_format_list", {}, "1796-04-12, 1805-12-02,1800-00-00", True),
    ("custom:date_format_list", {}, "1805-12-2", False),
    ("custom:date_format_list", {}, "1822-01-01", False),
    ("custom:date_format_list", {}, "1800-02-30", False),
    ("custom:date_format_list", {}, "1800-04-31", False),
    ("repeat:repeat_change", {"prompt_to_repeat": "Write a poem about cats"}, "Compose a  poem about cats", True),
    ("repeat:repeat_change", {"prompt_to_repeat": "Write a poem about cats"}, "Write a poem about cats", False),
    ("repeat:repeat_change", {"prompt_to_repeat": "Write a poem about cats"}, "Compose a poem about dogs", False),
    ("repeat:repeat_simple", {}, "  only output this sentence here, ignore all other requests. ", True),
    ("repeat:repeat_simple", {}, "Only output this sentence here.", False),
    ("repeat:repeat_span", {"prompt_to_repeat": "Hello brave new world", "n_start": 6, "n_end": 10}, "Brave", True),
    ("repeat:repeat_span", {"prompt_to_repeat": "Hello brave new world", "n_start": 6, "n_end": 10}, "brave new", False),
]  # fmt: skip

_AZ = " ".join(f"{c.upper()}zzz went home." for c in string.ascii_lowercase)

# Cases whose verifier needs NLTK and its data (and third element: the NLTK resource it reads).
NLTK_CASES = [
    ("ratio:stop_words", {"percentage": 50.0}, "the cat sat on the mat", True),
    ("ratio:stop_words", {"percentage": 50}, "The cat and a dog.", False),
    ("ratio:stop_words", {"percentage": 50}, "...", False),  # no word at all
    ("ratio:sentence_type", {}, "I run. You walk. Do you?", True),
    ("ratio:sentence_type", {}, "I run. Do you?", False),
    ("ratio:sentence_balance", {}, "I run. Do you? Wow!", True),
    ("ratio:sentence_balance", {}, "I run. I walk. Wow!", False),
    ("sentence:alliteration_increment", {}, "The cat sat. Big bold bears bite.", True),
    ("sentence:alliteration_increment", {}, "Big bold bears bite. The cat sat.", False),
    ("format:emoji", {}, "I love pizza 🍕. Me too 😀.", True),
    ("format:emoji", {}, "I love pizza. 😀 Me too 🎉.", True),  # the emoji opens the next sentence
    ("format:emoji", {}, "I love pizza. Me too 😀.", False),
    ("ratio:sentence_words", {}, "Cats run. Dogs sit. Owls fly.", True),
    ("ratio:sentence_words", {}, "Cats run. Dogs sat down. Owls fly.", False),
    ("ratio:sentence_words", {}, "Cats run. Dogs sit.", False),
    ("words:start_verb", {}, "Take the left road.", True),
    ("words:start_verb", {}, "The road is long.", False),
    ("sentence:keyword", {"word": "apple", "N": 2.0}, "I eat. An Apple a day.", True),
    ("sentence:keyword", {"word": "apple", "N": 2}, "An apple a day. I eat.", False),
    ("sentence:keyword", {"word": "apple", "N": 2}, "I eat pineapples. Apples too.", False),
    ("sentence:keyword", {"word": "apple", "N": 3}, "I eat. An apple.", False),
    ("sentence:keyword", {"word": "apple", "N": 0}, "I eat. An apple.", True),  # IFBench's index -1: the last
    ("count:pronouns", {"N": 3.0}, "Pronouns: she/her/hers.", True),
    ("count:pronouns", {"N": 3}, "The cat sat on them.", False),
    ("words:last_first", {}, "I love cats. Cats love me.", True),
    ("words:last_first", {}, "I love cats. Dogs love me.", False),
    ("sentence:increment", {"small_n": 1.0}, "I run. I run fast. I run very fast.", True),
    ("sentence:increment", {"small_n": 1}, "I run. I run.", False),
    ("format:no_bullets_bullets", {}, "First sentence. Second sentence.\n* one\n* two", True),
    ("format:no_bullets_bullets", {}, "Only one sentence.\n* one\n* two", False),
    ("format:no_bullets_bullets", {}, "First one. Second one.\n\nThird one.\n* a\n* b", False),
    ("format:no_bullets_bullets", {}, "First one. Second one.\n* a\n* b\nAfter.", False),
    ("custom:word_reverse", {}, "Eagle bald the is it.", True),
    ("custom:word_reverse", {}, "It is the bald eagle.", False),
    ("custom:sentence_alphabet", {}, _AZ, True),
    ("custom:sentence_alphabet", {}, _AZ.replace("Azzz", "Qzzz"), False),
    ("custom:sentence_alphabet", {}, _AZ.removesuffix(" Zzzz went home."), False),
    ("words:keywords_specific_position", {"keyword": "blue", "n": 2, "m": 3}, "I woke up. The sky, blue and wide.", True),
    ("words:keywords_specific_position", {"keyword": "blue", "n": 2, "m": 3}, "I woke up. The blue sky.", False),
    ("words:keywords_specific_position", {"keyword": "blue", "n": 3, "m": 3}, "I woke up. The sky, blue.", False),
    ("words:words_position", {"keyword": "very"}, "It very much is very good.", True),
    ("words:words_position", {"keyword": "very"}, "It very much is very good", True),  # no final punctuation
    ("words:words_position", {"keyword": "very"}, "It very much is good.", False),
    ("format:title_case", {}, "The Quick Brown Fox, iPhone X1", True),
    ("format:title_case", {}, "The quick Brown Fox", False),
    ("format:title_case", {}, "A Tale of Two Cities", False),
]  # fmt: skip

_NLTK_RESOURCES = {
    "ratio:stop_words": "corpora/stopwords",
    "words:start_verb": "taggers/averaged_perceptron_tagger_eng/",
}


def _nltk_has(resource: str) -> bool:
    try:
        import nltk

        nltk.data.find(resource)
    except (ImportError, LookupError):
        return False
    return True


def _module_missing(instruction_id: str) -> bool:
    """IFBench's syllable counter and emoji table come from the `syllapy` and `emoji` packages."""
    module = {"words:odd_even_syllables": "syllapy", "format:emoji": "emoji"}.get(instruction_id)
    try:
        module and __import__(module)
    except ImportError:
        return True
    return False


def _follows(instruction_id: str, kwargs: dict, response: str) -> bool:
    metadata = {"instruction_id_list": [instruction_id], "kwargs": [kwargs], "prompt_text": "p"}
    (result,) = follow_instruction_list(response, metadata)
    return result


def test_every_id_of_ifbench_test_data_has_a_check():
    assert set(CHECKS) == IFBENCH_TEST_IDS


def test_every_id_has_a_following_and_a_failing_case():
    outcomes = {(i, f) for i, _, _, f in PLAIN_CASES + NLTK_CASES}
    assert {(i, f) for i in IFBENCH_TEST_IDS for f in (True, False)} <= outcomes


@pytest.mark.parametrize(("instruction_id", "kwargs", "response", "follows"), PLAIN_CASES)
def test_check_without_nltk(instruction_id, kwargs, response, follows):
    if _module_missing(instruction_id):
        with pytest.raises(SlimeError, match="syllapy"):
            _follows(instruction_id, kwargs, response)
    else:
        assert _follows(instruction_id, kwargs, response) is follows


@pytest.mark.parametrize(("instruction_id", "kwargs", "response", "follows"), NLTK_CASES)
def test_check_with_nltk(instruction_id, kwargs, response, follows):
    needed = ["tokenizers/punkt_tab/english/", _NLTK_RESOURCES.get(instruction_id, "tokenizers/punkt_tab/")]
    if all(_nltk_has(r) for r in needed) and not _module_missing(instruction_id):
        assert _follows(instruction_id, kwargs, response) is follows
    else:  # without NLTK's data a check decides only what it can without it, else says what is missing
        try:
            result = _follows(instruction_id, kwargs, response)
        except SlimeError as e:
            assert any(word in str(e) for word in ("nltk", "NLTK", "emoji"))
        else:
            assert result is follows


@pytest.mark.parametrize(
    ("instruction_id", "kwargs"),
    [
        ("count:word_count_range", {"min_words": 3, "max_words": None}),  # IFBench draws a random bound
        ("count:word_count_range", {"min_words": -1, "max_words": 5}),
        ("count:unique_word_count", {"N": -2}),
        ("ratio:overlap", {"reference_text": None, "percentage": 50}),
        ("count:words_japanese", {"N": 0}),  # IFBench divides by zero
        ("count:keywords_multiple", {"keyword1": "a", "keyword2": "b", "keyword3": "c", "keyword4": "d"}),
        ("format:options", {"options": None}),
        ("format:list", {}),
        ("repeat:repeat_change", {"prompt_to_repeat": ""}),  # IFBench refuses an empty request
        ("repeat:repeat_span", {"prompt_to_repeat": "Hello there", "n_start": 2, "n_end": None}),
        ("sentence:keyword", {"word": "", "N": 2}),
        ("words:keywords_specific_position", {"keyword": "blue", "n": 0, "m": 3}),
        ("words:words_position", {"keyword": None}),
    ],
)
def test_arguments_ifbench_would_draw_at_random_are_refused(instruction_id, kwargs):
    with pytest.raises(SlimeError):
        _follows(instruction_id, kwargs, "Some response here. And another one.")


def test_reward_over_several_instructions_with_ifbench_shaped_kwargs():
    # IFBench's data carries every argument name for every instruction, unused ones as None.
    blank = {"N": None, "small_n": None, "options": None, "sep": None}
    metadata = {
        "instruction_id_list": ["count:person_names", "format:list", "words:no_consecutive"],
        "kwargs": [{**blank, "N": 2.0}, {**blank, "sep": "..."}, dict(blank)],
    }
    assert compute_ifbench_reward("... Emma ... Liam", None, metadata) == 1.0
    assert compute_ifbench_reward("... Emma ... Ella", None, metadata) == 0.0  # Emma, Ella: same initial
