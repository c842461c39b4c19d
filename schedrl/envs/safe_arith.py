"""A tiny, bounded parser for arithmetic over non-negative integers with + - * / and parentheses.

Grammar (left-associative, usual precedence, no unary minus)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

Evaluation uses ``fractions.Fraction`` so division is exact. Nothing is ever passed to
``eval``/``compile``; input length, nesting depth and literal length are capped so a
hostile completion fails fast with ``ValueError``.
"""

from __future__ import annotations

from fractions import Fraction

MAX_CHARS = 200
MAX_DEPTH = 32
MAX_LITERAL_DIGITS = 6

_DIGITS = frozenset("0123456789")
_OPERATORS = frozenset("+-*/()")
_SPACE = frozenset(" \t\n\r")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into ASCII integer literals and single-character operators."""
    if len(text) > MAX_CHARS:
        raise ValueError(f"expression longer than {MAX_CHARS} characters ({len(text)})")
    tokens: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c in _SPACE:
            i += 1
        elif c in _OPERATORS:
            tokens.append(c)
            i += 1
        elif c in _DIGITS:
            j = i
            while j < len(text) and text[j] in _DIGITS:
                j += 1
            if j - i > MAX_LITERAL_DIGITS:
                raise ValueError(f"integer literal longer than {MAX_LITERAL_DIGITS} digits at position {i}")
            tokens.append(text[i:j])
            i = j
        else:
            raise ValueError(f"unexpected character {c!r} at position {i}")
    return tokens


class _Parser:
    """Recursive descent over a token list; collects the integer literals it consumes."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.literals: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end of expression")
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.factor()
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise ValueError("division by zero")
            else:
                value = value / rhs
        return value

    def factor(self) -> Fraction:
        tok = self.take()
        if tok == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ValueError(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self.expr()
            if self.take() != ")":
                raise ValueError("expected ')'")
            self.depth -= 1
            return value
        if tok[0] in _DIGITS:
            self.literals.append(int(tok))
            return Fraction(int(tok))
        raise ValueError(f"expected a number or '(', got {tok!r}")


def parse(text: str) -> tuple[Fraction, list[int]]:
    """Evaluate ``text`` exactly; return the value and the integer literals used, in order.

    Raises ``ValueError`` for anything outside the grammar or limits, and for division by zero.
    """
    tokens = tokenize(text)
    if not tokens:
        raise ValueError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.peek() is not None:
        raise ValueError(f"unexpected token {parser.peek()!r} at token {parser.pos}")
    return value, parser.literals
