"""The text of a sharding spec, read back: ``[S(tp), R] P(sum:dp)`` into its parts, and a malformed
one refused with the column of the first character that does not fit and what was expected there.

Grammar (spaces allowed between tokens)::

    spec := "[" [dim ("," dim)*] "]" [P]      dim  := "R" | "S(" name ("," name)* ")"
    P    := "P(" op [":" name ("," name)*] ")"  name := [A-Za-z_][A-Za-z0-9_]*

:mod:`virtualpar.sharding.spec` builds ``DimSharding`` and ``TensorSharding`` from what this reads.
"""

from __future__ import annotations

from ..errors import ShardingError

__all__ = ["PARTIAL_OPS", "read_dim", "read_tensor"]

PARTIAL_OPS = frozenset({"sum", "prod", "max", "min", "avg"})  # the reduce ops a collective runs


def _NAME_CHAR(c: str) -> bool:
    """A character of a mesh axis name or reduce op: an ASCII letter, digit or underscore."""
    return c.isascii() and (c.isalnum() or c == "_")


class _Reader:
    """A cursor over the text of a spec; ``fail`` names the column and what was expected there."""

    def __init__(self, text: str, what: str) -> None:
        if not isinstance(text, str):
            raise ShardingError(f"a {what} is text like '[S(tp), R]', got {type(text).__name__} {text!r}")
        self.text, self.what, self.i = text, what, 0

    def fail(self, problem: str) -> ShardingError:
        shown = self.text[self.i] if self.i < len(self.text) else "the end"
        near = f"{shown!r}" if self.i < len(self.text) else shown
        return ShardingError(f"bad {self.what} {self.text!r} at column {self.i}: {problem} (found {near}), "
                             f"so it cannot parse\n"
                             f"    {self.text}\n    {' ' * self.i}^", text=self.text, column=self.i)

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.i] if self.i < len(self.text) else ""

    def take(self, token: str, problem: str) -> None:
        self.skip()
        if not self.text.startswith(token, self.i):
            raise self.fail(problem)
        self.i += len(token)

    def name(self, problem: str) -> str:
        self.skip()
        j = self.i
        if j < len(self.text) and _NAME_CHAR(self.text[j]) and not self.text[j].isdigit():
            j += 1
            while j < len(self.text) and _NAME_CHAR(self.text[j]):
                j += 1
        if j == self.i:
            raise self.fail(problem)
        out, self.i = self.text[self.i:j], j
        return out

    def names(self, what: str) -> tuple[str, ...]:
        out = [self.name(f"expected {what}")]
        while self.peek() == ",":
            self.take(",", "expected ','")
            empty = self.peek() in ",)"
            problem = f"empty entry, expected {what}" if empty else f"expected {what} after ','"
            out.append(self.name(problem))
        return tuple(out)

    def dim(self) -> tuple[str, ...]:
        c = self.peek()
        if c == "R" and not self._word_continues():
            self.i += 1
            return ()
        if c == "S" and self.text.startswith("S(", self.i):
            self.i += 2
            axes = self.names("a mesh axis name")
            self.take(")", "expected ',' or ')' after a mesh axis name")
            return axes
        if c in (",", "]"):
            raise self.fail("empty entry, expected R or S(axis,...)")
        raise self.fail("expected R or S(axis,...)")

    def _word_continues(self) -> bool:
        j = self.i + 1
        return j < len(self.text) and (self.text[j].isalnum() or self.text[j] == "_")

    def end(self) -> None:
        self.skip()
        if self.i != len(self.text):
            raise self.fail("expected the end of the spec")


def read_dim(text: str) -> tuple[str, ...]:
    """The mesh axes of ``"R"`` (none) or ``"S(a,b)"`` (see :meth:`DimSharding.parse`)."""
    r = _Reader(text, "dim sharding")
    out = r.dim()
    r.end()
    return out


def read_tensor(text: str) -> tuple[tuple[tuple[str, ...], ...], str | None, tuple[str, ...]]:
    """Per dim its mesh axes, the pending reduction and the axes it runs over, of
    ``"[dim, dim, ...] P(op:axes)"`` (see :meth:`TensorSharding.parse`); ``"[]"`` is a 0-d tensor."""
    r = _Reader(text, "spec")
    r.take("[", "expected '[' (a spec is e.g. '[S(tp), R]' or '[R] P(sum)')")
    dims: list[tuple[str, ...]] = []
    if r.peek() != "]":
        dims.append(r.dim())
        while r.peek() != "]":
            if r.peek() != ",":
                raise r.fail("expected ',' between entries or ']'" if r.peek() else "expected ']'")
            r.take(",", "expected ','")
            dims.append(r.dim())
    r.take("]", "expected ']'")
    partial, over = None, ()
    if r.peek():
        r.take("P(", "expected the end of the spec or a pending reduction P(op)")
        op_at = r.i
        partial = r.name(f"expected a reduce op, one of {sorted(PARTIAL_OPS)}")
        if partial not in PARTIAL_OPS:
            r.i = op_at
            raise r.fail(f"unknown reduce op {partial!r}: expected one of {sorted(PARTIAL_OPS)}")
        if r.peek() == ":":
            r.take(":", "expected ':'")
            over = r.names("a mesh axis name")
        r.take(")", "expected ')' (or ':axis,...' naming the axes the reduction runs over)")
    r.end()
    return tuple(dims), partial, over
