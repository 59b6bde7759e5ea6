"""Compose YAML into plain data in one streaming pass, refusing pathological input before it grows.

libyaml parses (fast, iterative; PyYAML's pure-Python parser where libyaml is missing); this module builds the
data from its events with an explicit stack, so no input can exhaust Python's recursion, and it counts as it
goes: nesting depth, key and scalar size, integer size, the values of the document and those that aliases and
``<<:`` merge keys bring in. Every limit is checked before the value it guards is built, so a billion-laughs or
merge-key bomb is refused in the time it takes to read it, in memory bounded by the file. Only plain data is
produced: mappings, sequences, strings, numbers, booleans and null; any other tag is refused. Every value's
location is recorded under its path.

This module owns the limits whichever layer notices them. The parser enforces two of its own, before any event
reaches the composer: libyaml 0.2.6+ refuses nesting deeper than its maximum (1000 by default; its scanner reads
up to 1024 characters ahead, so a line of brackets reaches it before our 64), and YAML limits a key written
without ``?`` to 1024 characters on one line. Such parser errors become the same RecipeError, with the same
message and place, as when the composer notices (see ``_parser_error``); the parser's own wording never reaches
the user, so a new parser release cannot change what a recipe error says.
"""

from __future__ import annotations

import functools
import gc
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from trtflow.errors import Location, RecipeError

Path_ = tuple[Any, ...]
Place = tuple[str, int, int]  # file, line, column (1-based): a Location that is cheap to make by the 100,000
KEY = "<key>"  # a path ending in KEY marks where the mapping key itself is written

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TAG = "tag:yaml.org,2002:"
_STR, _INT, _MAP, _SEQ, _MERGE_TAG = (_TAG + t for t in ("str", "int", "map", "seq", "merge"))
_SCALAR_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null")}
_IMPLICIT_AS_TEXT = {_TAG + "timestamp", _TAG + "value", _MERGE_TAG}  # plain words YAML 1.1 gives meanings


@dataclass(frozen=True)
class Limits:
    """What one recipe load may hold: far above any real recipe, low enough to bound time and memory."""

    max_depth: int = 64  # nested mappings and sequences, aliases expanded
    max_key_chars: int = 1024  # YAML's own limit for a key written without '?' (the parser's): every key
    max_scalar_chars: int = 1 << 20
    max_integer_chars: int = 100
    max_values: int = 1_000_000  # every value of the document, aliases and merges expanded
    max_alias_values: int = 100_000  # the values that aliases and `<<:` merges bring in


LIMITS = Limits()


class YamlSyntaxError(RecipeError):
    """The text is not valid YAML (as opposed to valid YAML that a recipe may not hold)."""


class Budget:
    """Values counted so far, shared by every file of one load (a recipe, its bases, its --set values)."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self.values = 0
        self.alias_values = 0


class _Merge:
    """The pseudo key of a ``<<:`` entry while its mapping is being composed."""

    def __repr__(self) -> str:
        return "'<<'"


MERGE = _Merge()
_NO_KEY = object()


@dataclass
class _Anchor:
    value: Any
    path: Path_
    entries: tuple[int, int]  # the range of the composer's `entries` that holds the node's marks
    size: int  # values, aliases expanded
    depth: int  # nesting levels of the node


class _Frame:
    """An open mapping or sequence."""

    __slots__ = ("anchor", "depth", "first_entry", "is_map", "key", "mark", "merge_start", "merges", "path", "size",
                 "value")

    def __init__(self, is_map: bool, path: Path_, mark: Any, anchor: str | None, first_entry: int) -> None:
        self.is_map = is_map
        self.value: Any = {} if is_map else []
        self.path = path
        self.mark = mark
        self.anchor = anchor
        self.size = 1
        self.depth = 1
        self.key: Any = _NO_KEY
        self.merges: list[tuple[list[dict], bool, int, int]] = []  # (sources, given as a list, marks' range)
        self.merge_start = 0  # where the marks of the `<<:` value begin in `entries`
        self.first_entry = first_entry


class _Composer:
    def __init__(self, file: str, budget: Budget, on_string: Callable[[str, Place], str] | None,
                 depth: int) -> None:
        self.file = file
        self.depth = depth  # levels above the document (a --set value's key path)
        self.budget = budget
        self.limits = budget.limits
        self.on_string = on_string
        self.entries: list[tuple[Path_, Place]] = []
        self.resolved: dict[str, str] = {}  # plain scalar -> its tag (names and numbers repeat a lot)
        self.anchors: dict[str, _Anchor] = {}
        self.open_anchors: set[str] = set()
        self.stack: list[_Frame] = []
        self.merged = False
        self.root: Any = None
        self.loader: Any = None

    def at(self, mark: Any) -> Place:
        return self.file, mark.line + 1, mark.column + 1

    def fail(self, message: str, mark: Any, hint: str | None = None) -> RecipeError:
        return RecipeError(message, Location(*self.at(mark)), hint=hint)

    # ------------------------------------------------------------------------------------------ limits
    def count(self, values: int, mark: Any, aliased: bool = False) -> None:
        budget, limits = self.budget, self.limits
        budget.values += values
        if aliased:
            budget.alias_values += values
            if budget.alias_values > limits.max_alias_values:
                raise self.fail(f"aliases and merge keys expand to more than {limits.max_alias_values} values "
                                "(an alias bomb?)", mark, hint="write the values out, or alias smaller anchors")
        if budget.values > limits.max_values:
            raise self.fail(f"the recipe holds more than {limits.max_values} values", mark,
                            hint="split it into several recipes")

    def check_depth(self, depth: int, mark: Any) -> None:
        if depth > self.limits.max_depth:
            raise too_deep(self.limits.max_depth, Location(*self.at(mark)))

    # ------------------------------------------------------------------------------------------ events
    def compose(self, loader: Any) -> Any:
        handlers = {yaml.ScalarEvent: self.scalar, yaml.MappingStartEvent: self.start,
                    yaml.SequenceStartEvent: self.start, yaml.MappingEndEvent: self.end,
                    yaml.SequenceEndEvent: self.end, yaml.AliasEvent: self.alias}
        self.loader = loader
        started = False
        while True:
            event = loader.get_event()
            handler = handlers.get(type(event))
            if handler is not None:
                handler(event)
            elif isinstance(event, yaml.DocumentStartEvent):
                if started:
                    raise self.fail("the file holds more than one YAML document", event.start_mark,
                                    hint="a recipe is one document: remove the second '---'")
                started = True
            elif event is None or isinstance(event, yaml.StreamEndEvent):
                return self.root

    def marks(self) -> dict[Path_, Place]:
        if self.merged:
            return {path: loc for path, loc in self.entries if MERGE not in path}
        return dict(self.entries)

    def place(self) -> tuple[Path_, bool]:
        """The path of the node that starts now, and whether it is a mapping key."""
        if not self.stack:
            return (), False
        top = self.stack[-1]
        if not top.is_map:
            return (*top.path, len(top.value)), False
        if top.key is _NO_KEY:
            return top.path, True
        return (*top.path, top.key), False

    def scalar(self, event: Any) -> None:
        mark = event.start_mark
        self.count(1, mark)
        text = event.value
        path, is_key = self.place()
        if is_key and len(text) > self.limits.max_key_chars:
            raise key_too_long(len(text), self.limits.max_key_chars, Location(*self.at(mark)))
        if len(text) > self.limits.max_scalar_chars:
            raise self.fail(f"a value of {len(text)} characters (a recipe value may have at most "
                            f"{self.limits.max_scalar_chars})", mark)
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolve(text, event.implicit)
            if tag == _MERGE_TAG and is_key and event.anchor is None:
                self.key(MERGE, mark)
                return
            if tag in _IMPLICIT_AS_TEXT:
                tag = _STR
        value = self.construct(tag, text, event)
        if isinstance(value, str) and self.on_string is not None:
            value = self.on_string(value, self.at(mark))
        if event.anchor is not None:
            self.define(event.anchor, mark)
        if not is_key:
            self.entries.append((path, self.at(mark)))
        if event.anchor is not None:
            end = len(self.entries)
            self.anchors[event.anchor] = _Anchor(value, path, (end - (not is_key), end), 1, 0)
        if is_key:
            self.key(value, mark)
        else:
            self.attach(value, 1, 0, mark)

    def resolve(self, text: str, implicit: tuple[bool, bool]) -> str:
        if not implicit[0]:  # quoted
            return _STR
        tag = self.resolved.get(text)
        if tag is None:
            tag = self.loader.resolve(yaml.ScalarNode, text, implicit)
            if len(text) <= 64 and len(self.resolved) < 10_000:
                self.resolved[text] = tag
        return tag

    def construct(self, tag: str, text: str, event: Any) -> Any:
        if tag == _STR:
            return text
        if tag not in _SCALAR_TAGS:
            raise self.refuse_tag(tag, event.start_mark)
        if tag == _INT and len(text) > self.limits.max_integer_chars:
            raise self.fail(f"an integer of {len(text)} digits (at most {self.limits.max_integer_chars})",
                            event.start_mark, hint="quote it if it is text")
        node = yaml.ScalarNode(tag, text, event.start_mark, event.end_mark, event.style)
        try:
            return self.loader.yaml_constructors[tag](self.loader, node)
        except (ValueError, IndexError, KeyError, TypeError, yaml.YAMLError):
            raise self.fail(f"{text!r} is not a valid {tag.removeprefix(_TAG)}", event.start_mark) from None

    def refuse_tag(self, tag: str, mark: Any) -> RecipeError:
        return self.fail(f"YAML tag {tag!r} is not allowed in a recipe; only plain data (maps, lists, strings, "
                         "numbers, booleans, null) is accepted", mark,
                         hint="remove the tag; recipes never construct objects")

    def key(self, key: Any, mark: Any) -> None:
        top = self.stack[-1]
        if key is MERGE:
            if top.merges:
                raise self.fail("duplicate key '<<'", mark, hint="merge several mappings with <<: [*a, *b]")
            top.merge_start = len(self.entries)
        elif key in top.value:
            raise self.fail(f"duplicate key {key!r}", mark, hint="each key may appear once in a mapping")
        else:
            self.entries.append(((*top.path, key, KEY), self.at(mark)))
        top.key = key

    def start(self, event: Any) -> None:
        mark = event.start_mark
        self.count(1, mark)
        is_map = isinstance(event, yaml.MappingStartEvent)
        tag = event.tag
        if tag is not None and tag != "!" and tag != (_MAP if is_map else _SEQ):
            raise self.refuse_tag(tag, mark)
        path, is_key = self.place()
        if is_key:
            raise self.fail("a mapping key must be a plain value", mark)
        self.check_depth(self.depth + len(self.stack) + 1, mark)
        if event.anchor is not None:
            self.define(event.anchor, mark)
            self.open_anchors.add(event.anchor)
        self.entries.append((path, self.at(mark)))
        self.stack.append(_Frame(is_map, path, mark, event.anchor, len(self.entries) - 1))

    def end(self, event: Any) -> None:
        frame = self.stack.pop()
        value = self.merge(frame) if frame.merges else frame.value
        if frame.anchor is not None:
            self.open_anchors.discard(frame.anchor)
            self.anchors[frame.anchor] = _Anchor(value, frame.path, (frame.first_entry, len(self.entries)),
                                                 frame.size, frame.depth)
        self.attach(value, frame.size, frame.depth, frame.mark)

    def alias(self, event: Any) -> None:
        mark, name = event.start_mark, event.anchor
        if name in self.open_anchors:
            raise self.fail(f"alias *{name} is used inside the node it names (a recursive structure)", mark)
        anchor = self.anchors.get(name)
        if anchor is None:
            raise self.fail(f"alias *{name} refers to no anchor &{name} defined before it", mark)
        self.count(anchor.size, mark, aliased=True)
        self.check_depth(self.depth + len(self.stack) + anchor.depth, mark)
        path, is_key = self.place()
        if is_key:
            if isinstance(anchor.value, (dict, list)):
                raise self.fail("a mapping key must be a plain value", mark)
            self.key(anchor.value, mark)
            return
        start, stop = anchor.entries
        cut = len(anchor.path)
        self.entries.append((path, self.at(mark)))  # the use itself; what is inside points into the anchor
        for i in range(start + 1, stop):
            inner, location = self.entries[i]
            self.entries.append(((*path, *inner[cut:]), location))
        value = _copy(anchor.value)
        self.attach(value, anchor.size, anchor.depth, mark)

    def define(self, name: str, mark: Any) -> None:
        if name in self.anchors or name in self.open_anchors:
            raise self.fail(f"anchor &{name} is defined twice", mark, hint="give each anchor its own name")

    def attach(self, value: Any, size: int, depth: int, mark: Any) -> None:
        if not self.stack:
            self.root = value
            return
        top = self.stack[-1]
        top.size += size
        top.depth = max(top.depth, depth + 1)
        if not top.is_map:
            top.value.append(value)
            return
        key, top.key = top.key, _NO_KEY
        if key is not MERGE:
            top.value[key] = value
            return
        sources = value if isinstance(value, list) else [value]
        if not sources or not all(isinstance(s, dict) for s in sources):
            raise self.fail("a merge key '<<' takes a mapping or a list of mappings (*anchor or [*a, *b])", mark)
        self.merged = True
        top.merges.append((sources, isinstance(value, list), top.merge_start, len(self.entries)))

    def merge(self, frame: _Frame) -> dict:
        """The mapping with its ``<<:`` sources merged in: its own keys win, then earlier sources."""
        own = frame.value
        (sources, listed, start, stop), = frame.merges
        provider: dict[Any, int] = {}
        for index, source in enumerate(sources):
            for key in source:
                if key not in own and key not in provider:
                    provider[key] = index
        merged = {key: sources[index][key] for key, index in provider.items()}
        merged.update(own)
        base = len(frame.path) + 1  # the marks of a merge value sit under (*path, MERGE, ...)
        for i in range(start, stop):
            inner, location = self.entries[i]
            rest, origin = inner[base:], 0
            if listed and rest:
                origin, rest = rest[0], rest[1:]
            if rest and provider.get(rest[0]) == origin and MERGE not in rest:
                self.entries.append(((*frame.path, *rest), location))
        return merged


def _copy(value: Any) -> Any:
    """A deep copy of plain data (mappings, lists, scalars), several times faster than copy.deepcopy."""
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy(v) for v in value]
    return value


def compose(text: str, file: str, budget: Budget | None = None,
            on_string: Callable[[str, Place], str] | None = None,
            depth: int = 0) -> tuple[Any, dict[Path_, Place]]:
    """Parse YAML ``text`` into plain data and the location of every value (keyed by path).

    ``on_string`` may rewrite each string value (environment interpolation); ``depth`` is how deep the
    document will sit in a larger one. Raises YamlSyntaxError for text that is not YAML, and RecipeError,
    naming the place, for a tag other than plain data or input over ``budget``'s limits.
    """
    composer = _Composer(file, budget or Budget(), on_string, depth)
    loader = None
    collecting = gc.isenabled()
    gc.disable()  # the data holds no reference cycles; collecting while it grows only costs time
    try:
        loader = _LOADER(text)  # the pure-Python reader checks the characters here
        data = composer.compose(loader)
    except UnicodeEncodeError as exc:  # libyaml's reader: a lone surrogate (bytes that were not UTF-8)
        raise RecipeError(f"not valid UTF-8 text: {exc.reason} at character {exc.start}",
                          Location(file, 0, 0)) from None
    except yaml.MarkedYAMLError as exc:
        raise _parser_error(exc, text, file, composer) from None
    except yaml.YAMLError as exc:
        raise _reader_error(exc, text, file) from None
    finally:
        if loader is not None:
            loader.dispose()
        if collecting:
            gc.enable()
    return data, composer.marks()


def too_deep(limit: int, where: Location | None) -> RecipeError:
    """Values nested deeper than ``limit``: the one message, whichever layer noticed."""
    return RecipeError(f"values nested more than {limit} levels deep", where,
                       hint="a recipe needs a few levels of nesting; check the brackets and indentation")


def key_too_long(chars: int, limit: int, where: Location | None) -> RecipeError:
    """A mapping key longer than ``limit`` characters: the one message, whichever layer noticed."""
    return RecipeError(f"a mapping key of {chars} characters (at most {limit})", where,
                       hint="a key is a name: shorten it")


def _parser_error(exc: yaml.MarkedYAMLError, text: str, file: str, composer: _Composer) -> RecipeError:
    """The RecipeError for an error the parser raised: one of our limits if the parser enforced it, else a
    YAML syntax error at the parser's mark."""
    mark = exc.problem_mark
    if mark is not None and _signature(exc) in _nesting_refusals(_LOADER).signatures:
        limit = min(composer.limits.max_depth, _nesting_refusals(_LOADER).levels)
        return too_deep(limit, Location(*composer.at(mark)))
    key = _implicit_key_before(text, mark) if mark is not None else None
    if key is not None and key[2] > composer.limits.max_key_chars:
        return key_too_long(key[2], composer.limits.max_key_chars, Location(file, key[0] + 1, key[1] + 1))
    return _syntax_error(exc, text, file)


def _signature(exc: yaml.MarkedYAMLError) -> tuple[type, str | None, str | None]:
    return type(exc), exc.context, exc.problem


@dataclass(frozen=True)
class _Refusals:
    signatures: frozenset[tuple[type, str | None, str | None]]  # how the parser says "too deep"
    levels: int  # the deepest nesting it accepts (a large number where it has no limit)


@functools.cache
def _nesting_refusals(loader_class: type) -> _Refusals:
    """How ``loader_class`` refuses nesting on its own, learned once by provoking it (libyaml 0.2.6+ refuses
    more than 1000 levels; older libyaml and the pure-Python parser have no limit). 1100 levels suffice: the
    parser runs at most one line of 1024 characters ahead of the composer, which refuses the 65th level, so
    a parser's limit above that never shows (and the line it shows on is the one the composer would name)."""
    signatures, levels = set(), _PROBE_LEVELS
    probes = (("[\n" * _PROBE_LEVELS + "]" * _PROBE_LEVELS, lambda mark: mark.line),  # flow, a level a line
              ("- " * _PROBE_LEVELS + "x", lambda mark: mark.column // 2))  # block, one line
    for text, level_at in probes:
        loader = loader_class(text)
        try:
            while loader.get_event() is not None:
                pass
        except yaml.MarkedYAMLError as exc:
            signatures.add(_signature(exc))
            if exc.problem_mark is not None:
                levels = min(levels, level_at(exc.problem_mark))
        finally:
            loader.dispose()
    return _Refusals(frozenset(signatures), levels)


_PROBE_LEVELS = 1100


_KEY_START = frozenset("{[,")  # in flow context a plain key starts after one of these


def _implicit_key_before(text: str, mark: Any) -> tuple[int, int, int] | None:
    """(line, column, characters) of the key written before the ':' at ``mark``, if that is where the parser
    stopped: YAML refuses a key of more than 1024 characters unless it starts with '?', and libyaml and the
    pure-Python parser both report that as a syntax error at the ':'. The key runs back to the line's
    indentation, a block indicator or a flow indicator (or its opening quote)."""
    lines = text.split("\n", mark.line + 1)
    if mark.line >= len(lines):
        return None
    line = lines[mark.line].removesuffix("\r")
    colon = mark.column
    if not 0 < colon < len(line) or line[colon] != ":":
        return None
    end = len(line[:colon].rstrip(" "))
    if end and line[end - 1] in "'\"":  # a quoted key: back to its opening quote
        start = line.rfind(line[end - 1], 0, end - 1)
        if start < 0:
            return None
    else:  # a plain key: back to a flow indicator or the line's start, then past indentation, "- " and "? "
        start = end
        while start > 0 and line[start - 1] not in _KEY_START:
            start -= 1
        while start < end and (line[start] == " " or (line[start] in "-?" and line[start + 1:start + 2] == " ")):
            start += 1
    return mark.line, start, end - start


def _syntax_error(exc: yaml.MarkedYAMLError, text: str, file: str) -> YamlSyntaxError:
    mark = exc.problem_mark or exc.context_mark
    if mark is None:
        return YamlSyntaxError(f"YAML syntax error: {exc.problem or exc.context or 'invalid YAML'}",
                               Location(file, 0, 0))
    line = text.split("\n", mark.line + 1)[mark.line] if mark.line <= text.count("\n") else ""
    tab = 0 <= mark.column < len(line) and line[mark.column] == "\t"
    return YamlSyntaxError(f"YAML syntax error: {exc.problem or exc.context or 'invalid YAML'}"
                           + (" (a tab)" if tab else ""), Location(file, mark.line + 1, mark.column + 1),
                           hint="YAML indents with spaces, never tabs" if tab else None)


def _reader_error(exc: yaml.YAMLError, text: str, file: str) -> RecipeError:
    """A character that YAML text may not hold (the readers of libyaml and of PyYAML differ only in wording)."""
    code = getattr(exc, "character", None)
    position = getattr(exc, "position", None)
    if not isinstance(code, int):
        return YamlSyntaxError(f"YAML error: {exc}", Location(file, 0, 0))
    if 0xD800 <= code <= 0xDFFF:
        return RecipeError(f"not valid UTF-8 text: a lone surrogate U+{code:04X}", Location(file, 0, 0))
    kind = " (a control character)" if unicodedata.category(chr(code)) in ("Cc", "Cs") else ""
    in_bytes = hasattr(yaml, "CSafeLoader") and issubclass(_LOADER, yaml.CSafeLoader)
    return YamlSyntaxError(f"YAML error: character #x{code:04X} is not allowed in YAML text{kind}",
                           _location_of_offset(text, position, file, in_bytes))


def _location_of_offset(text: str, offset: int | None, file: str, in_bytes: bool) -> Location:
    """The line and column of ``offset`` into ``text``: a byte offset into its UTF-8 (libyaml's reader), or a
    character offset (PyYAML's)."""
    if not in_bytes:
        if not isinstance(offset, int) or not 0 <= offset <= len(text):
            return Location(file, 0, 0)
        line_start = text.rfind("\n", 0, offset) + 1
        return Location(file, text.count("\n", 0, offset) + 1, offset - line_start + 1)
    data = text.encode("utf-8", "surrogatepass")
    if not isinstance(offset, int) or not 0 <= offset <= len(data):
        return Location(file, 0, 0)
    line_start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", "ignore"))
    return Location(file, data.count(b"\n", 0, offset) + 1, column + 1)
