"""One line per problem: the messages ``lightning-fl`` prints for an error or a warning.

jsonargparse reports a bad config as nested exceptions whose keys and reasons are spread over the chain; this
module joins them back into one line that names the full key, the value and what was expected (STYLE.md R3).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["format_warning", "one_line", "with_suggestion"]


def format_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> str:
    """One line per warning, like the errors: ``lightning-fl: warning: <message>``."""
    return f"lightning-fl: warning: {' '.join(str(message).split())}\n"


_PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)'")
_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted")
_EXPECTED = re.compile(r"Expected a (.+?)\. Got value: (.*)$")
_UNION_ALTERNATIVE = re.compile(r"^\s*- Expected a (.+?)\.?\s*$", re.MULTILINE)
_UNION_REFUSAL = re.compile(r"^\s*- (?!Expected a )(.+?)\s*$", re.MULTILINE)
_UNKNOWN_KEY = re.compile(r"(?:does not accept option '([^']+)'|unrecognized arguments: --([^\s=]+))")
_CLASS_KEYS = ("class_path", "init_args", "dict_kwargs")
_MISSING_CLASS = re.compile(
    r"module '([\w.]+)' has no attribute '(\w+)'|Import path ([\w.]+)\.(\w+) does not correspond"
)
_NULL_GROUP = re.compile(r'Unable to load config "(null|None|~)?"')
_PACKAGE = Path(__file__).resolve().parent


def _raised_by_toolkit(err: BaseException) -> bool:
    """Whether ``err`` was raised in lightning_fl's own code (its messages name the key and the fix)."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)


def _type_name(annotation: str) -> str:
    """``<class 'int'>`` -> ``an integer``; ``typing.Literal['a', 'b']`` -> ``one of 'a', 'b'``."""
    if annotation.startswith("typing.Literal[") and annotation.endswith("]"):
        return f"one of {annotation[len('typing.Literal[') : -1]}"
    name = re.sub(r"<class '(?:[\w.]*\.)?(\w+)'>", r"\1", annotation).replace("NoneType", "null")
    return {"int": "an integer", "float": "a number", "bool": "true or false", "dict": "a mapping"}.get(name, name)


def _chain(err: BaseException) -> list[BaseException]:
    chain = [err]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    return chain


def one_line(err: BaseException, known_keys: Callable[[], Sequence[str]] | None = None, *, where: bool = False) -> str:
    """The most specific message of ``err`` on one line, with the full config key when jsonargparse knows it.

    jsonargparse nests its errors (``Parser key "model"`` wraps ``Parser key "optimizer"`` of the chosen class);
    the keys are joined back into ``model.init_args.optimizer`` and its ``Expected a <type>. Got value: v`` is
    turned into ``model.init_args.optimizer='v' is invalid: expected one of 'adam', 'sgd'.`` A library error that
    the toolkit wrapped in its own message (``raise ValueError(...) from err``) gives the toolkit's message, which
    names the key and the fix. An unknown key gets the nearest of ``known_keys()`` as a suggestion. With ``where``
    (a config rejected before training), an error from the user's own code that names no key says where it was
    raised (``my_project.Net.__init__ raised RuntimeError: ...``).
    """
    message = _most_specific(err, where=where)
    if known_keys is not None and _UNKNOWN_KEY.search(message):
        return with_suggestion(message, known_keys())
    return message


def with_suggestion(message: str, known_keys: Sequence[str]) -> str:
    """``message`` of an unknown key (a YAML key or a command-line argument) with the nearest of ``known_keys``.

    Example:
        >>> with_suggestion("unrecognized arguments: --loop.num_roundz 3", ["loop.num_rounds", "loop.workers"])
        'unrecognized arguments: --loop.num_roundz 3; did you mean --loop.num_rounds?'
    """
    unknown = _UNKNOWN_KEY.search(message)
    if not unknown:
        return message
    close = difflib.get_close_matches(unknown.group(1) or unknown.group(2), list(known_keys), n=1, cutoff=0.8)
    if not close:
        return message
    suggestion = f"{close[0]!r}" if unknown.group(1) else f"--{close[0]}"  # a YAML key, or an argument
    return f"{message.rstrip('.')}; did you mean {suggestion}?"


def _most_specific(err: BaseException, *, where: bool = False) -> str:
    chain = _chain(err)
    keys: list[str] = []
    for link in chain:
        match = _PARSER_KEY.match(str(link))
        if match and (not keys or keys[-1] != match.group(1)):
            keys.append(match.group(1))
    own = [link for link in chain if _raised_by_toolkit(link)]
    last = own[-1] if own else chain[-1]
    innermost = " ".join(str(last.args[0] if isinstance(last, KeyError) and last.args else last).split())
    expected = _EXPECTED.search(innermost)
    if keys and expected:
        key = ".init_args.".join(keys)
        value = expected.group(2)
        union = str(chain[-2]) if len(chain) > 1 else ""
        alternatives = [_type_name(t) for t in _UNION_ALTERNATIVE.findall(union)]
        if "Problem with given class_path" in union or not alternatives:
            alternatives = [_type_name(expected.group(1))]
        message = f"{key}={value!r} is invalid: expected {' or '.join(alternatives)}."
        if "a mapping" in alternatives and ":" in value:
            message += " On the command line write a YAML mapping with a space after each colon: '{accelerator: cpu}'."
        return message
    if keys:
        return _keyed(".init_args.".join(keys), innermost, chain)
    union = str(chain[-2]) if len(chain) > 1 and expected else ""
    refusal = next((line for line in _UNION_REFUSAL.findall(union) if not line.endswith(":")), None)
    if refusal:  # a class of the union refused its arguments: its message, not the other alternative's
        return refusal
    return (_raised_where(last) if where else "") + innermost.split(" failed: ", 1)[-1]


def _raised_where(err: BaseException) -> str:
    """``<module>.<function> raised <Type>: `` when ``err`` comes from the user's own code (neither the toolkit nor an
    installed library), whose message cannot name a config key: ``user init failed`` alone says nothing of where.

    Example:
        >>> _raised_where(ValueError("x"))  # never raised: no traceback
        ''
    """
    tb = err.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code, module = tb.tb_frame.f_code, tb.tb_frame.f_globals.get("__name__", "?")
    path = Path(code.co_filename).resolve()
    installed = any(part in ("site-packages", "dist-packages") for part in path.parts)
    if installed or path.is_relative_to(_PACKAGE) or path.is_relative_to(Path(sys.base_prefix).resolve()):
        return ""
    return f"{module}.{code.co_qualname} raised {type(err).__name__}: "


def _keyed(key: str, innermost: str, chain: list[BaseException]) -> str:
    """Name ``key`` in a jsonargparse message that lacks it (unknown init option, bad class_path, missing file)."""
    if _NULL_GROUP.search(innermost):  # ``loop: null``: jsonargparse reads null as a config file to load
        return f"{key}: null is not allowed; give {key} as a mapping of its settings, or leave the key out."
    class_path = next((m.group(1) for link in chain if (m := _CLASS_PATH.match(str(link)))), None)
    option = _NOT_ACCEPTED.search(innermost)
    if option and "." in option.group(1):  # a key beside class_path, not an option of the class
        head = option.group(1).split(".")[0]
        close = difflib.get_close_matches(head, _CLASS_KEYS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        return f"{key}.{head} is not a key of {key}: a class is given by class_path and init_args{hint}"
    if option and class_path:
        name = option.group(1)
        try:
            module, _, attr = class_path.rpartition(".")
            parameters = inspect.signature(getattr(importlib.import_module(module), attr)).parameters.values()
        except (ImportError, AttributeError, ValueError, TypeError):
            return f"{key}.init_args.{name} is not an option of {class_path}."
        known = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        close = difflib.get_close_matches(name, known, n=1)
        options = f"; its options: {', '.join(known)}." if known else "; it takes no options."
        hint = f"; did you mean {close[0]!r}?" if close else options
        return f"{key}.init_args.{name} is not an option of {class_path}{hint}"
    if re.search(rf"(?<![\w./]){re.escape(key)}(?![\w./])", innermost):  # the key itself, not in a path
        return innermost
    where = f" (class_path {class_path!r})" if class_path else ""
    return f"{key}{where}: {innermost}{_class_hint(innermost)}"


def _class_hint(message: str) -> str:
    """``; did you mean 'pkg.Name'?`` for a class path whose module exists but has no such class."""
    missing = _MISSING_CLASS.search(message)
    if not missing:
        return ""
    module, name = (missing.group(1), missing.group(2)) if missing.group(1) else (missing.group(3), missing.group(4))
    try:
        names = [n for n in dir(importlib.import_module(module)) if not n.startswith("_") and n != name]
    except ImportError:
        return ""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return f"; did you mean '{module}.{close[0]}'?" if close else ""
