"""A cheap syntactic screen for math answers, run before any sympy or math-verify parsing.

The policy is an adversary: `9**9**9`, `10^{10^{10}}!` or `\\binom{10^{10}}{5 \\cdot 10^9}` are
short strings whose eager evaluation never ends, and whatever a reward lets through, RL finds.
`screen_answer` reads the answer once (linear time, no evaluation) and names the reason when it
refuses one: longer than `MAX_ANSWER_CHARS`, groups nested deeper than `MAX_DEPTH`, or a power,
factorial or binomial whose numeric operands make a number of more than `MAX_DIGITS` digits or an
exponent / argument above `10**MAX_LOG_EXPONENT`. It estimates an upper bound of log10|value| of
the numeric parts (symbols are unknown and never refused for themselves). It is a first line
only: the grader's worker process and its time limit (`grader_pool`) bound what gets past it.
It reads both LaTeX (`2^{10}`, `\\frac{a}{b}`, `\\cdot`) and the text sympy parses (`2**10`).
"""

from __future__ import annotations

import math
import re

MAX_ANSWER_CHARS = 2048  # MATH-500's longest answer has 159 characters
MAX_DEPTH = 50  # nested groups; real answers nest a handful deep
MAX_DIGITS = 100_000  # sympy handles such integers in milliseconds; 2^{2023} has 610 digits
MAX_LOG_EXPONENT = 6  # exponents, factorial and function arguments up to 10^6

_DROP = re.compile(r"\\(?:left|right|displaystyle|quad|qquad)(?![A-Za-z])|\\[!,;: ]")
_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\?[A-Za-z]+|!!|\*\*|\S")
_OPEN, _CLOSE = "({[", ")}]"
_TIMES = {"\\cdot", "\\times", "\\ast"}
_FACTORIALS = {"factorial", "factorial2", "gamma", "subfactorial"}
_BINOMIALS = {"binom", "dbinom", "tbinom", "binomial", "ff", "rf", "choose"}
_NUMERIC = {"frac", "dfrac", "tfrac", "sqrt", "cbrt"}  # value bounded by the product of the arguments
_LOG2 = math.log10(2)


class _Refused(Exception):
    pass


def _number(tok: str) -> float:
    whole = tok.split(".")[0].lstrip("0")
    if len(whole) > 15:
        return float(len(whole))
    return math.log10(max(float(tok), 1.0))


def _pow(base: float | None, exp: float | None) -> float | None:
    if exp is not None and exp > MAX_LOG_EXPONENT:
        raise _Refused(f"an exponent of about 10^{exp:.0f}")
    if base is None or exp is None:
        return None
    digits = 10**exp * base
    if digits > MAX_DIGITS:
        raise _Refused(f"a power of about 10^{digits:.3g}")
    return digits


def _factorial(n: float | None) -> float | None:
    if n is None:
        return None
    if n > MAX_LOG_EXPONENT:
        raise _Refused(f"a factorial of about 10^{n:.0f}")
    value = 10**n
    digits = math.lgamma(value + 1) / math.log(10)
    if digits > MAX_DIGITS:
        raise _Refused(f"a factorial of {value:.3g} ({digits:.3g} digits)")
    return digits


def _mul(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if a + b > MAX_DIGITS:
        raise _Refused(f"a product of about 10^{a + b:.3g}")
    return a + b


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(a, b) + _LOG2


class _Estimator:
    """A forgiving recursive-descent reader: never refuses for syntax (the grader decides that),
    only for sizes. Every step consumes a token, so it ends in time linear in the tokens."""

    def __init__(self, tokens: list[str]):
        self.toks, self.i = tokens, 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def run(self) -> None:
        while self.peek() is not None:
            if self.peek() == ")":
                self.i += 1
                continue
            self.sequence()

    def sequence(self) -> list[float | None]:
        """Comma- (or otherwise) separated items up to a `)` or the end."""
        items: list[float | None] = []
        while (t := self.peek()) is not None and t != ")":
            if t == ",":
                self.i += 1
                continue
            start = self.i
            items.append(self.sum())
            if self.i == start:  # a stray operator or separator
                self.i += 1
        return items

    def sum(self) -> float | None:
        value = self.product()
        while self.peek() in ("+", "-"):
            self.i += 1
            value = _add(value, self.product())
        return value

    def product(self) -> float | None:
        value = self.unary()
        while (t := self.peek()) is not None:
            if t in ("*", "/"):
                self.i += 1
            elif not (t == "(" or t[0].isalnum() or t[0] == "." or (t[0] == "\\" and len(t) > 1)):
                break  # implicit multiplication continues only with an atom
            value = _mul(value, self.unary())
        return value

    def unary(self) -> float | None:
        while self.peek() in ("+", "-"):
            self.i += 1
        return self.power()

    def power(self) -> float | None:
        base = self.postfix()
        t = self.peek()
        if t == "^":
            self.i += 1
            return _pow(base, self.unary())  # right-associative: 9^9^9 = 9^(9^9)
        if t == "\\choose":  # {n \choose k} <= (n + k)^k
            self.i += 1
            k = self.unary()
            return _pow(None if base is None or k is None else max(base, k) + _LOG2, k)
        return base

    def postfix(self) -> float | None:
        value = self.atom()
        while self.peek() in ("!", "!!"):
            self.i += 1
            value = _factorial(value)
        return value

    def group(self) -> list[float | None]:
        self.i += 1  # "("
        items = self.sequence()
        if self.peek() == ")":
            self.i += 1
        return items

    def atom(self) -> float | None:
        t = self.peek()
        if t is None:
            return None
        if t == "(":
            items = self.group()
            return max(items) if items and None not in items else None
        if t[0].isdigit() or t[0] == ".":
            self.i += 1
            return _number(t)
        if t[0].isalpha() or (t[0] == "\\" and len(t) > 1):
            self.i += 1
            return self.call(t)
        return None  # an operator where an operand belongs: the caller moves on

    def call(self, name: str) -> float | None:
        command = name.startswith("\\")
        key = name.lstrip("\\").lower()
        if key == "exp" and self.peek() != "(":
            return None
        args: list[float | None] = []
        while self.peek() == "(":  # LaTeX: one brace group per argument; Python: one (a, b) group
            args += self.group()
            if not command:
                break
        if not args:
            return None  # a symbol
        known = None not in args
        if key in _FACTORIALS:
            return _factorial(max(args)) if known else None
        if key in _BINOMIALS and len(args) >= 2:
            n, k = args[0], args[1]
            return _pow(None if n is None or k is None else max(n, k) + _LOG2, k)
        if key == "exp":
            return _pow(0.44, args[0])
        if key in _NUMERIC:
            return sum(args) if known else None  # type: ignore[arg-type]
        if not command:  # a function sympy would call eagerly (fibonacci, eye, ...): bound its input
            big = max((a for a in args if a is not None), default=0.0)
            if big > MAX_LOG_EXPONENT:
                raise _Refused(f"{name}() of an argument of about 10^{big:.0f}")
        return None


def _tokens(text: str) -> list[str]:
    out = []
    for tok in _TOKEN.findall(_DROP.sub(" ", text)):
        if tok in _OPEN:
            tok = "("
        elif tok in _CLOSE:
            tok = ")"
        elif tok == "**":
            tok = "^"
        elif tok in _TIMES:
            tok = "*"
        elif tok == "\\div":
            tok = "/"
        elif tok not in ("+", "-", "*", "/", "^", "!", "!!") and not (
            tok[0].isalnum() or tok[0] == "." or (tok[0] == "\\" and len(tok) > 1)
        ):
            tok = ","  # =, <, |, _, &, a lone backslash, ...: separators
        out.append(tok)
    return out


def screen_answer(text: str) -> str | None:
    """Why `text` must not be parsed (a short reason), or None when it may be."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"answer of {len(text)} characters (more than {MAX_ANSWER_CHARS})"
    tokens = _tokens(text)
    depth = deepest = 0
    for tok in tokens:
        depth = depth + 1 if tok == "(" else max(depth - 1, 0) if tok == ")" else depth
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        return f"groups nested {deepest} deep (more than {MAX_DEPTH})"
    try:
        _Estimator(tokens).run()
    except _Refused as e:
        return f"{e} in the answer, never evaluated"
    except RecursionError:  # e.g. a tower of a thousand ^: no real answer
        return "an expression too deeply nested to read"
    return None
