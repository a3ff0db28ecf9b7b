"""Recursive-descent parser for RocketMQ's SQL92 selector grammar, with its semantic checks.

Grammar (loosest first), as in RocketMQ's ``SelectorParser.jj``::

    selector   := or EOF                      # plugmq: unused input is an error
    or         := and (OR and)*
    and        := equality (AND equality)*
    equality   := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
    comparison := unary ( ('>'|'>='|'<'|'<=') unary
                        | [NOT] (CONTAINS|STARTSWITH|ENDSWITH) string
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN '(' string (',' string)* ')' )*
    unary      := '+' unary | '-' unary | NOT unary | primary
    primary    := literal | identifier | '(' or ')'

So NOT binds tighter than every comparison (``NOT a = 'x'`` is ``(NOT a) = 'x'``).
"""

from __future__ import annotations

from plugmq.core.errors import FilterSyntaxError
from plugmq.plugins.filter_sql.javanum import INT_MAX, LONG_MAX, java_double_value_of
from plugmq.plugins.filter_sql.lexer import Kind, Token, TokenStream, string_value
from plugmq.plugins.filter_sql.nodes import (
    Between,
    Compare,
    Constant,
    In,
    IsNull,
    JType,
    Logic,
    Negate,
    Node,
    Not,
    Property,
    StringMatch,
    depth,
)
from plugmq.plugins.filter_sql.semantics import (
    as_boolean,
    check_between_bounds,
    check_equal_operands,
    check_in_operand,
    check_ordering_operand,
)

__all__ = ["MAX_DEPTH", "MAX_NESTING", "parse"]

#: Deepest nesting of parentheses and unary operators accepted (keeps the parser's recursion
#: far from Python's limit; real subscriptions nest a handful of levels).
MAX_NESTING = 48
#: Tallest parsed tree accepted (chains like ``a = b = c = ...`` grow it without nesting).
MAX_DEPTH = 96

_ORDERING = (">", ">=", "<", "<=")
_STRING_OPS = ("CONTAINS", "STARTSWITH", "ENDSWITH")
_NOT_FOLLOWERS = ("BETWEEN", "IN", *_STRING_OPS)
_VALUE_START = "a property, a literal, '(' , NOT, '+' or '-'"


def _hint(token: Token) -> str:
    if token.kind is Kind.ID and token.text.upper() == "LIKE":
        return " (LIKE is not supported: use CONTAINS, STARTSWITH or ENDSWITH)"
    if token.is_punct("+", "-"):
        return " (there is no arithmetic in selectors)"
    return ""


def parse(expression: str) -> Node:
    """Parse and check ``expression``; raise FilterSyntaxError with a position on any problem."""
    return _Parser(expression).selector()


class _Parser:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = TokenStream(expression)
        self.nesting = 0

    # ------------------------------------------------------------------ helpers

    def error(self, message: str, token: Token, expected: str | None = None) -> FilterSyntaxError:
        return FilterSyntaxError(message, expression=self.expression, position=token.pos, expected=expected)

    def unexpected(self, token: Token, expected: str) -> FilterSyntaxError:
        hint = _hint(token)
        if token.is_punct("=") and expected == _VALUE_START:
            hint = " ('==' is not an operator: use '=')"
        return self.error(f"unexpected {token.describe()} at position {token.pos}{hint}; expected {expected}",
                          token, expected)

    def expect_punct(self, symbol: str) -> Token:
        token = self.tokens.peek()
        if not token.is_punct(symbol):
            raise self.unexpected(token, repr(symbol))
        return self.tokens.next()

    def expect_keyword(self, word: str) -> Token:
        token = self.tokens.peek()
        if not token.is_keyword(word):
            raise self.unexpected(token, word)
        return self.tokens.next()

    def expect_string(self, after: str) -> str:
        token = self.tokens.peek()
        if token.kind is not Kind.STRING:
            raise self.unexpected(token, f"a string literal in single quotes after {after}")
        self.tokens.next()
        return string_value(token)

    def nest(self, token: Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"expression nested more than {MAX_NESTING} levels deep", token)

    # ------------------------------------------------------------------ grammar

    def selector(self) -> Node:
        node = self.or_expr()
        rest = self.tokens.peek()
        if rest.kind is not Kind.EOF:
            # RocketMQ silently ignores everything from here on; plugmq refuses it.
            raise self.error(
                f"unexpected {rest.describe()} at position {rest.pos}{_hint(rest)}: the expression ends "
                "before it (RocketMQ would silently ignore the rest)", rest, "AND, OR or end of input")
        node = as_boolean(self.expression, node, "as a whole expression")
        height = depth(node)
        if height > MAX_DEPTH:
            raise FilterSyntaxError(f"expression tree is {height} levels deep; at most {MAX_DEPTH} are accepted",
                                    expression=self.expression, position=0)
        return node

    def _logic(self, op: str) -> Node:
        parse_operand = self.and_expr if op == "OR" else self.equality
        left = parse_operand()
        operands: list[Node] = []
        while self.tokens.peek().is_keyword(op):
            self.tokens.next()
            right = parse_operand()
            if not operands:
                operands.append(as_boolean(self.expression, left, f"with {op}"))
            operands.append(as_boolean(self.expression, right, f"with {op}"))
        if not operands:
            return left
        flat: list[Node] = []
        for item in operands:  # a chain is one n-ary node: same short-circuit order, no deep tree
            flat.extend(item.operands if isinstance(item, Logic) and item.op == op else (item,))
        return Logic(left.pos, op, tuple(flat))

    def or_expr(self) -> Node:
        return self._logic("OR")

    def and_expr(self) -> Node:
        return self._logic("AND")

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            token = self.tokens.peek()
            if token.is_punct("=", "<>"):
                self.tokens.next()
                right = self.comparison()
                check_equal_operands(self.expression, left, right, token.text)
                left = Compare(left.pos, token.text, left, right)
            elif token.is_keyword("IS"):
                self.tokens.next()
                negated = self.tokens.peek().is_keyword("NOT")
                if negated:
                    self.tokens.next()
                after = self.tokens.peek()
                if not after.is_keyword("NULL"):
                    raise self.unexpected(after, "NULL" if negated else "NULL or NOT NULL")
                self.tokens.next()
                left = IsNull(left.pos, left, negated)
            else:
                return left

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            token = self.tokens.peek()
            negated = False
            if token.is_keyword("NOT") and self.tokens.peek(1).is_keyword(*_NOT_FOLLOWERS):
                self.tokens.next()
                negated = True
                token = self.tokens.peek()
            if not negated and token.is_punct(*_ORDERING):
                self.tokens.next()
                right = self.unary()
                check_ordering_operand(self.expression, left, token.text)
                check_ordering_operand(self.expression, right, token.text)
                left = Compare(left.pos, token.text, left, right)
            elif token.is_keyword(*_STRING_OPS):
                self.tokens.next()
                search = self.expect_string(token.value)
                left = StringMatch(left.pos, token.value, left, search, negated)
            elif token.is_keyword("BETWEEN"):
                self.tokens.next()
                low = self.unary()
                self.expect_keyword("AND")
                high = self.unary()
                if not negated:
                    check_between_bounds(self.expression, low, high)
                for operand in (left, low, left, high):
                    check_ordering_operand(self.expression, operand, "NOT BETWEEN" if negated else "BETWEEN")
                left = Between(left.pos, left, low, high, negated)
            elif token.is_keyword("IN"):
                self.tokens.next()
                self.expect_punct("(")
                values = [self.expect_string("IN (")]
                while self.tokens.peek().is_punct(","):
                    self.tokens.next()
                    values.append(self.expect_string("','"))
                self.expect_punct(")")
                word = "NOT IN" if negated else "IN"
                prop = check_in_operand(self.expression, left, word)
                left = In(left.pos, prop, tuple(values), negated)
            else:
                return left

    def unary(self) -> Node:
        token = self.tokens.peek()
        if token.is_punct("+", "-") or token.is_keyword("NOT"):
            self.tokens.next()
            self.nest(token)
            operand = self.unary()
            self.nesting -= 1
            if token.is_punct("+"):
                return operand  # RocketMQ's unary plus is the operand itself
            if token.is_punct("-"):
                return Negate(token.pos, operand)
            return Not(token.pos, as_boolean(self.expression, operand, "with NOT"))
        return self.primary()

    def primary(self) -> Node:
        token = self.tokens.peek()
        if token.is_punct("("):
            self.tokens.next()
            self.nest(token)
            inner = self.or_expr()
            self.nesting -= 1
            self.expect_punct(")")
            return inner
        if token.kind is Kind.ID:
            self.tokens.next()
            return Property(token.pos, token.text)
        if token.kind is Kind.STRING:
            self.tokens.next()
            return Constant(token.pos, string_value(token), JType.STRING)
        if token.kind is Kind.INTEGER:
            self.tokens.next()
            return self.integer(token)
        if token.kind is Kind.DECIMAL:
            self.tokens.next()
            return self.decimal(token)
        if token.is_keyword("TRUE", "FALSE"):
            self.tokens.next()
            return Constant(token.pos, token.value == "TRUE", JType.BOOLEAN)
        if token.is_keyword("NULL"):
            self.tokens.next()
            return Constant(token.pos, None, JType.NULL)
        raise self.unexpected(token, _VALUE_START)

    def integer(self, token: Token) -> Constant:
        digits = token.text.rstrip("lL")
        if len(digits) > 19 or int(digits) > LONG_MAX:
            raise self.error(
                f"integer literal {token.text} does not fit a 64-bit long (a negative number is the negation "
                "of a positive literal, so -9223372036854775808 cannot be written either)",
                token, "an integer within the 64-bit range")
        value = int(digits)
        return Constant(token.pos, value, JType.INT if value <= INT_MAX else JType.LONG)

    def decimal(self, token: Token) -> Constant:
        value = java_double_value_of(token.text)
        if value == float("inf"):
            raise self.error(f"decimal literal {token.text} is above the largest double", token,
                             "a decimal literal within the double range")
        if value == 0.0:
            raise self.error(f"decimal literal {token.text} is zero or below the smallest double 4.9E-324 "
                             "(RocketMQ refuses it; compare with the integer 0 instead)", token,
                             "a non-zero decimal literal")
        return Constant(token.pos, value, JType.DOUBLE)
