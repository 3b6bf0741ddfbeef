"""Command-line options derived from the settings dataclasses: a field becomes one option (``--max-steps``
for ``max_steps``) whose type, default, choices and help (the attribute docstring under the field, as litgpt
reads them) are the field's, so the command line and the Python API cannot drift apart.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import typing

from .checks import FIELD_CHECKS


def parse_head_dim(text):
    """``--head-dim`` as the config takes it: None, an int (``64``), or one entry per layer (``64,64,128,128``;
    ``none`` = the standard d/h for that layer); argparse.ArgumentTypeError for any other entry."""
    if text is None or isinstance(text, (int, list)):
        return text
    values = []
    for t in str(text).split(","):
        t = t.strip()
        if t.lower() == "none":
            values.append(None)
            continue
        try:
            values.append(int(t))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid int value: {t!r} (--head-dim takes an int, or one per layer: 64,64,128,128; none = d/h)"
            ) from None
    return values if "," in str(text) else values[0]


# ---------------------------------------------------------------------- options from dataclasses
@functools.cache
def field_docs(cls) -> dict[str, str]:
    """``{field: its attribute docstring on one line}`` of a dataclass and the dataclasses it derives from."""
    inherited = {k: v for base in cls.__bases__ if dataclasses.is_dataclass(base) for k, v in field_docs(base).items()}
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return inherited | {
        a.target.id: " ".join(b.value.value.split())
        for a, b in zip(body, body[1:], strict=False)
        if isinstance(a, ast.AnnAssign)
        and isinstance(b, ast.Expr)
        and isinstance(b.value, ast.Constant)
        and isinstance(b.value.value, str)
    }


#: argparse types the annotation does not say, and second names kept for options
_TYPES = {"head_dim": parse_head_dim}
_ALIASES = {"gradient_checkpointing": ("--activation-checkpointing",), "steps": ("--max-steps",)}


def add_options(parser, cls, skip=(), title: str | None = None, more_help: dict[str, str] | None = None):
    """One option per field of the dataclass ``cls``: its type from the annotation (``X | None`` takes an X,
    ``list[str]`` any number of words, a bool is ``--name`` or ``--no-name`` when it defaults to True), help from
    the attribute docstring with the default and ``more_help[field]``; ``metadata`` may give ``choices``,
    ``positional`` and ``metavar``. A field with no default is required.

    An option left out is absent from the namespace (``argparse.SUPPRESS``), so the dataclass's own default
    applies (:func:`given`) and a command can tell what was given.
    """
    group = parser.add_argument_group(title or cls.__name__)
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    own = cls.__dict__.get("__annotations__", {})  # a class's own fields first, then those it derives
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):
        if f.name in skip:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else f.default_factory() if f.default is dataclasses.MISSING else f.default
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        text = help_words(docs.get(f.name, "")) + _check_words(f)
        if not (shown is None or shown == "" or isinstance(shown, bool)):
            text += f" (default: {shown})"
        text = (text + (more_help or {}).get(f.name, "")).replace("%", "%%")
        hint = hints[f.name]
        if f.metadata.get("positional"):  # a required argument, named by its metavar
            nargs = {"nargs": "+"} if typing.get_origin(hint) is list else {}
            group.add_argument(f.name, metavar=f.metadata.get("metavar", f.name.upper()), help=text, **nargs)
            continue
        flag = f"--{f.name.replace('_', '-')}"
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=text, required=required or None)
        if hint is bool:
            kw["action"] = "store_false" if default else "store_true"
            if default:
                flag, kw["help"] = f"--no-{flag[2:]}", f"turn off (on by default): {kw['help']}"
        else:
            inner = [a for a in typing.get_args(hint) if a not in (type(None), Ellipsis)]  # X of X | None, list[X]
            if typing.get_origin(hint) in (list, tuple):
                fixed = typing.get_origin(hint) is tuple and Ellipsis not in typing.get_args(hint)
                kw["nargs"] = len(inner) if fixed else "*"
                if not fixed and inner and inner[0] in (int, float):  # "1e-3 2e-3" or "1e-3,2e-3"
                    kw["action"], kw["type"] = _Words, _words(inner[0])
            kw.setdefault("type", _TYPES.get(f.name) or (inner[0] if inner else hint))
            kw["metavar"] = f.metadata.get("metavar") or _metavar(f.name, inner[0] if inner else kw["type"])
            if "choices" in f.metadata:
                kw["choices"], kw["metavar"] = f.metadata["choices"], None
        group.add_argument(flag, *_ALIASES.get(f.name, ()), **{k: v for k, v in kw.items() if v is not None})
    return group


#: option names whose value is a file or folder (a corpus, a run, a text to score)
_PATH_OPTIONS = {"corpus", "text", "tokenizer", "model", "checkpoints", "init_from"}


def _metavar(name: str, kind) -> str | None:
    """What ``--help`` calls an option's value when its field does not say: N, X, PATH, FIELD or NAME."""
    if kind in (int, float):
        return {int: "N", float: "X"}[kind]
    if kind is not str:
        return None
    if name in _PATH_OPTIONS or name.endswith(("_dir", "_path", "_file")):
        return "PATH"
    return "FIELD" if name.endswith("_field") else "NAME"


def help_words(text: str) -> str:
    """A field's attribute docstring as ``--help`` shows it: a module constant it names (``COMPARE_PRESETS``)
    dropped, since the choices are listed beside the option, and ``None: the preset's`` as ``default: ...``."""
    text = re.sub(r" ?\([A-Z][A-Z0-9]*_[A-Z0-9_]+\)", "", text)
    text = re.sub(r"\([A-Z][A-Z0-9]*_[A-Z0-9_]+: ", "(", text)
    return re.sub(r"\bNone: ", "default: ", text)


def _check_words(f) -> str:
    """What the field's metadata checks, for its help: ``; each a positive int, distinct``."""
    words = [FIELD_CHECKS[f.metadata["check"]][1]] if "check" in f.metadata else []
    words += [w for w in ("nonempty", "distinct") if f.metadata.get(w)]
    return f"; {', '.join(words)}" if words else ""


def _words(convert):
    """An argparse type: one word of numbers, comma-separated (``1e-3,2e-3``), to a list."""

    def parse(text):
        try:
            return [convert(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {convert.__name__} value: {text!r}") from None

    parse.__name__ = convert.__name__  # argparse names the type in its message
    return parse


class _Words(argparse.Action):
    """A list option whose words may each hold several comma-separated values: the values in order."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [v for word in values for v in word])


def given(args, cls) -> dict:
    """``{field: value}`` of the options of ``cls`` given on the command line (a tuple field's as a tuple)."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: tuple(getattr(args, f.name)) if typing.get_origin(hints[f.name]) is tuple else getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if hasattr(args, f.name)
    }


def nested(cls) -> dict[str, type]:
    """``{field: dataclass}`` of the fields of ``cls`` that are dataclasses themselves (a study's recipe)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


def add_nested_options(parser, cls, title: str):
    """:func:`add_options` for ``cls`` and, in their own groups, the fields of its nested dataclasses
    (``--steps`` for ``recipe.steps``); ValueError for two fields of one name."""
    inner = nested(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name not in inner]
    names += [f.name for sub in inner.values() for f in dataclasses.fields(sub)]
    if len(set(names)) != len(names):
        raise ValueError(f"{cls.__name__}: options of one name in two dataclasses: {sorted(names)}")
    add_options(parser, cls, skip=tuple(inner), title=title)
    for name, sub in inner.items():
        add_options(parser, sub, title=f"{title}: {name} ({sub.__name__})")


def in_option_words(message: str, parser) -> str:
    """A user error of the command ``parser`` parsed, in the command line's words: the dataclasses, configs and
    checks that raise it name fields (``max_steps must be ...``, ``head_dim=None``), which the command line spells
    as options (``--max-steps must be ...``, ``no --head-dim``).

    * ``field=value`` anywhere: the option and its value as typed (``qk_head_dim=8`` → ``--qk-head-dim 8``,
      ``parametrization='mup'`` → ``--parametrization mup``; ``=None``: ``no --option``);
    * a field name with an underscore anywhere (an identifier, never an English word): the option;
    * a one-word field name where it opens a statement before ``must``, ``=``, ``needs`` or ``:``;
    * a tuple or list of values after an option, ``got``, ``=``, ``:`` or ``→``: its values as words
      (``(0.001,)`` → ``0.001``).

    A name inside a path or quotes (a file's key) is left alone; ``or None`` reads ``or left out``.
    """
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    flags = {name: a.option_strings[0] for name, a in actions.items()}
    if flags:
        names = "|".join(map(re.escape, sorted(flags, key=len)[::-1]))
        free = r"(?<![\w/.'\"-])"  # not inside a path, a quoted key or an option already

        def typed(m):  # --head-dim takes one word, its layers' sizes joined by commas (none: d/h)
            if actions[m[1]].type is parse_head_dim and re.fullmatch(_SEQUENCE, m[2]):
                return f"{flags[m[1]]} {_as_words(m[2], ',').replace('None', 'none')}"
            value = _as_words(m[2]).strip("'\"")
            return f"no {flags[m[1]]}" if value == "None" else f"{flags[m[1]]} {value}"

        message = re.sub(free + rf"({names})=({_SEQUENCE}|'[^']*'|[^\s,;:)]+)", typed, message)
        underscored = "|".join(re.escape(n) for n in sorted(flags, key=len)[::-1] if "_" in n)
        if underscored:
            message = re.sub(free + rf"({underscored})(?![\w/'\"(-]|\.\w)", lambda m: flags[m[1]], message)
        opening = r"(?:^|(?<=; )|(?<=: )|(?<=, ))(" + names + r")\b(?= must| =| needs|:)"
        message = re.sub(opening, lambda m: flags[m.group(1)], message)
    message = re.sub(r"\bor None\b", "or left out", message)  # an option's None is an option not given
    message = re.sub(r"(--[a-z][a-z-]* )(" + _SEQUENCE + ")", lambda m: m[1] + _as_words(m[2]), message)
    return re.sub(r"(?:(?<=got )|(?<==)|(?<=: )|(?<=→ ))(" + _SEQUENCE + ")", lambda m: _as_words(m[1]), message)


#: a Python tuple or list of numbers, None or quoted words, as ``repr`` writes it: ``(0.001,)``, ``[64, 64]``
_ITEM = r"(?:-?[\d.]+(?:e[-+]?\d+)?|None|'[^',]*')"
_SEQUENCE = rf"\((?:{_ITEM}, )+{_ITEM}\)|\({_ITEM},\)|\[(?:(?:{_ITEM}, )*{_ITEM})?\]"


def _as_words(value: str, sep: str = " ") -> str:
    """``(0.001, 0.002)`` or ``['a']`` as the command line takes them (``0.001 0.002``, ``a``); else ``value``."""
    if not re.fullmatch(_SEQUENCE, value):
        return value
    return sep.join(v.strip().strip("'") for v in value[1:-1].split(",") if v.strip()) or "none"


def options_from(args, base):
    """``base`` (a dataclass) with every option given on the command line replaced, nested ones too."""
    inner = nested(type(base))
    changes = {k: v for k, v in given(args, type(base)).items() if k not in inner}
    for name, sub in inner.items():
        if sub_given := given(args, sub):
            changes[name] = dataclasses.replace(getattr(base, name), **sub_given)
    return dataclasses.replace(base, **changes) if changes else base
