"""Rust's v0 symbol mangling (``_R...``) to readable paths, as rustc-demangle's alternate
form prints them (no crate hashes): ``<str>::trim_start_matches::<&str>``.

The grammar is rustc's documented v0 scheme: paths (crate root, nested, inherent and trait
impls, generic arguments), types, consts and back-references.  Punycode identifiers are
kept as written.  ``demangle_v0`` returns None for anything it cannot read, and the caller
shows the symbol as it is.
"""

from __future__ import annotations

__all__ = ["demangle_v0"]

_BASIC = {"a": "i8", "b": "bool", "c": "char", "d": "f64", "e": "str", "f": "f32", "h": "u8", "i": "isize",
          "j": "usize", "l": "i32", "m": "u32", "n": "i128", "o": "u128", "s": "i16", "t": "u16", "u": "()",
          "v": "...", "x": "i64", "y": "u64", "z": "!", "p": "_"}
_DEPTH = 200


class _Bad(Exception):
    pass


class _Parser:
    def __init__(self, s: str, start: int):
        self.s, self.i, self.base, self.depth = s, start, start, 0
        self.bound = 0  # lifetimes bound by the enclosing for<...> binders

    # -- lexemes ---------------------------------------------------------------------------
    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def eat(self, c: str) -> bool:
        if self.peek() == c:
            self.i += 1
            return True
        return False

    def next(self) -> str:
        if self.i >= len(self.s):
            raise _Bad
        self.i += 1
        return self.s[self.i - 1]

    def b62(self) -> int:
        if self.eat("_"):
            return 0
        n = 0
        while True:
            c = self.next()
            if c == "_":
                return n + 1
            if c.isdigit():
                d = ord(c) - 48
            elif "a" <= c <= "z":
                d = ord(c) - 87
            elif "A" <= c <= "Z":
                d = ord(c) - 29
            else:
                raise _Bad
            n = n * 62 + d

    def decimal(self) -> int:
        if self.eat("0"):  # "0" | [1-9][0-9]*: "00" is two numbers
            return 0
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        if start == self.i:
            raise _Bad
        return int(self.s[start:self.i])

    def opt_disambiguator(self) -> int:
        return self.b62() + 1 if self.eat("s") else 0

    def ident(self) -> str:
        self.opt_disambiguator()
        return self.undisambiguated()

    def undisambiguated(self) -> str:
        self.eat("u")  # punycode: kept as written
        n = self.decimal()
        self.eat("_")
        if self.i + n > len(self.s):
            raise _Bad
        self.i += n
        return self.s[self.i - n:self.i]

    def backref(self, fn):
        at = self.base + self.b62()
        if at >= self.i - 1:
            raise _Bad
        saved = self.i
        self.i = at
        try:
            return fn()
        finally:
            self.i = saved

    # -- grammar ---------------------------------------------------------------------------
    def path(self, value: bool = True) -> str:
        self.depth += 1
        if self.depth > _DEPTH:
            raise _Bad
        try:
            c = self.next()
            if c == "C":
                return self.ident()
            if c == "N":
                ns = self.next()
                inner = self.path(value)
                dis = self.opt_disambiguator()
                name = self.undisambiguated()
                if ns.isupper():  # {closure#0}, {shim:vtable#0}
                    tag = {"C": "closure", "S": "shim"}.get(ns, ns)
                    return f"{inner}::{{{tag}{':' + name if name else ''}#{dis}}}"
                return f"{inner}::{name}" if name else inner
            if c == "M":
                self.opt_disambiguator()
                self.path()
                return f"<{self.type()}>"
            if c == "X":
                self.opt_disambiguator()
                self.path()
                t = self.type()
                return f"<{t} as {self.path(False)}>"
            if c == "Y":
                t = self.type()
                return f"<{t} as {self.path(False)}>"
            if c == "I":
                inner = self.path(value)
                args = []
                while not self.eat("E"):
                    args.append(self.generic_arg())
                return f"{inner}{'::' if value else ''}<{', '.join(args)}>"
            if c == "B":
                return self.backref(lambda: self.path(value))
            raise _Bad
        finally:
            self.depth -= 1

    def lifetime(self, n: int) -> str:
        if n == 0:
            return "'_"
        k = self.bound - n
        if k < 0:
            raise _Bad
        return f"'{chr(97 + k)}" if k < 26 else f"'_{k}"

    def generic_arg(self) -> str:
        if self.eat("L"):
            return self.lifetime(self.b62())
        if self.eat("K"):
            return self.const()
        return self.type()

    def const(self) -> str:
        if self.eat("p"):
            return "_"
        if self.eat("B"):
            return self.backref(self.const)
        t = self.next()
        neg = t in "abilnsx" and self.eat("n")
        start = self.i
        while self.peek() and self.peek() in "0123456789abcdef":
            self.i += 1
        digits = self.s[start:self.i]
        if not self.eat("_"):
            raise _Bad
        if t == "b":
            return "true" if digits == "1" else "false"
        value = int(digits or "0", 16)
        if t == "c":
            return repr(chr(value)) if value < 0x110000 else str(value)
        return f"{'-' if neg else ''}{value}"

    def type(self) -> str:
        self.depth += 1
        if self.depth > _DEPTH:
            raise _Bad
        try:
            c = self.peek()
            if c in _BASIC:
                self.i += 1
                return _BASIC[c]
            self.i += 1
            if c == "A":
                t = self.type()
                return f"[{t}; {self.const()}]"
            if c == "S":
                return f"[{self.type()}]"
            if c == "T":
                items = []
                while not self.eat("E"):
                    items.append(self.type())
                return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
            if c in "RQ":
                lt = ""
                if self.eat("L"):
                    n = self.b62()
                    lt = f"{self.lifetime(n)} " if n else ""
                return ("&" if c == "R" else "&mut ") + lt + self.type()
            if c in "PO":
                return ("*const " if c == "P" else "*mut ") + self.type()
            if c == "F":
                return self.fn_sig()
            if c == "D":
                return self.dyn()
            if c == "B":
                return self.backref(self.type)
            self.i -= 1
            return self.path(False)
        finally:
            self.depth -= 1

    def binder(self) -> str:
        """``for<'a, ...> `` of a G binder ('' without one); the caller restores self.bound."""
        if not self.eat("G"):
            return ""
        n = self.b62() + 1
        names = [f"'{chr(97 + k)}" if k < 26 else f"'_{k}" for k in range(self.bound, self.bound + n)]
        self.bound += n
        return f"for<{', '.join(names)}> "

    def fn_sig(self) -> str:
        bound = self.bound
        try:
            return self.binder() + self._fn_sig()
        finally:
            self.bound = bound

    def _fn_sig(self) -> str:
        unsafe = "unsafe " if self.eat("U") else ""
        abi = ""
        if self.eat("K"):
            abi = 'extern "C" ' if self.eat("C") else f'extern "{self.undisambiguated().replace("_", "-")}" '
        args = []
        while not self.eat("E"):
            args.append(self.type())
        ret = self.type()
        return f"{unsafe}{abi}fn({', '.join(args)})" + ("" if ret == "()" else f" -> {ret}")

    def dyn(self) -> str:
        bound = self.bound
        try:
            return self._dyn()
        finally:
            self.bound = bound

    def _dyn(self) -> str:
        binder = self.binder()
        traits = []
        while not self.eat("E"):
            t = self.path(False)
            binds = []
            while self.eat("p"):
                name = self.undisambiguated()
                binds.append(f"{name} = {self.type()}")
            if binds:
                t = t[:-1] + ", " + ", ".join(binds) + ">" if t.endswith(">") else f"{t}<{', '.join(binds)}>"
            traits.append(t)
        lt = self.lifetime(self.b62()) if self.eat("L") else "'_"
        return f"dyn {binder}" + " + ".join(traits) + ("" if lt == "'_" else f" + {lt}")


def demangle_v0(name: str) -> str | None:
    """``_R...`` -> its path; None when it is not a v0 symbol this reader understands."""
    start = 2 if name.startswith("_R") else 3 if name.startswith("__R") else 0
    if not start:
        return None
    p = _Parser(name, start)
    try:
        if p.peek().isdigit():  # encoding version
            p.decimal()
        p.base = start  # back-references count from after "_R"
        out = p.path()
    except (_Bad, IndexError, ValueError, RecursionError):
        return None
    return out
