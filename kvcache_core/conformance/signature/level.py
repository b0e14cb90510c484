"""The runtime signature level: compare ``inspect.signature`` of a class's methods with the
contract Protocol's. Discovery runs exactly this at engine start-up (it is cheap: no instance
is built, nothing is called).

With ``body_checks`` (the checker turns them on, discovery leaves them off to stay fast) the
source of each method is read back with ``inspect.getsource`` and given the same body checks as
the source level: not-implemented, parameter-not-forwarded, writeloc-not-unwrapped.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import linecache
import os
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import CodeType
from typing import TYPE_CHECKING

from ...contracts.history import CONTRACT_VERSION
from ...contracts.signature import MethodSig
from ...plugin_loader import summarise_exception
from ..members.methods import (
    body_findings,
    body_may_find,
    contract_methods,
    method_findings,
    missing_method,
    outcome_for,
    protocol_by_name,
    split_by_protocol,
)
from ..members.signatures import sig_from_callable
from ..members.sources import module_name_for
from ..results.model import CheckResult, Finding, Location, Outcome
from ..targets.target import ClassTarget

if TYPE_CHECKING:
    from ..runner import LevelOptions

__all__ = ["LEVEL", "class_location", "import_target", "run", "run_level", "signature_findings"]

LEVEL = "signature"


def class_location(cls: type) -> Location | None:
    """Where ``cls`` is defined, when its source file can be found."""
    try:
        path = inspect.getsourcefile(cls)
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return None
    return Location(path, line) if path else None


def _defining_class(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in vars(k)), None)


FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
#: Parsed bodies by (file, code object): an inherited method is read once however many classes
#: share it. Equal code objects can come from different files (code equality ignores the file).
_PARSED: dict[tuple[str, CodeType], tuple[FunctionNode, str | None, int] | None] = {}


def _code_names(code: CodeType) -> set[str]:
    """Global and attribute names ``code`` and the code nested in it refer to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _code_names(const)
    return names


def _last_line(code: CodeType) -> int:
    """The last line any instruction of ``code`` (or code nested in it) starts on."""
    last = code.co_firstlineno
    for _, _, line in code.co_lines():
        if line is not None and line > last:
            last = line
    for const in code.co_consts:
        if isinstance(const, CodeType):
            last = max(last, _last_line(const))
    return last


def _own_lines(lines: list[str], code: CodeType) -> str:
    """The source lines of ``code``'s ``def``: up to the line its last statement starts on,
    then on while lines are blank or indented deeper than the ``def`` (that statement's tail)."""
    start = code.co_firstlineno
    first = lines[start - 1]
    indent = len(first) - len(first.lstrip())
    end = _last_line(code)
    while end < len(lines):
        following = lines[end]
        if following.strip() and len(following) - len(following.lstrip()) <= indent:
            break
        end += 1
    return "".join(lines[start - 1 : end])


def _parse_lines(
    text: str, name: str, path: str | None, first_line: int
) -> tuple[FunctionNode, str | None, int] | None:
    """The ``def`` named ``name`` that ``text`` (starting at file line ``first_line``) opens."""
    indented = text[:1].isspace()
    try:
        # ``if 1:`` keeps an indented method parseable without dedenting (which a multi-line
        # string at column 0 would defeat).
        tree = ast.parse("if 1:\n" + text if indented else text)
    except (SyntaxError, ValueError):
        return None
    body = tree.body
    if indented and body and isinstance(body[0], ast.If):
        body = body[0].body
    node = body[0] if body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name != name:
        return None
    return node, path, first_line - (2 if indented else 1)


def _function_ast(func: Callable[..., object]) -> tuple[FunctionNode, str | None, int] | None:
    """The ``def`` of a live function re-parsed from its source, with its file and offset.

    Only the function's own lines are parsed, found from its code object (the file is read once,
    through ``linecache``); ``inspect.getsourcelines`` is the fallback. Never raises.
    """
    code = getattr(func, "__code__", None)
    key = (code.co_filename, code) if isinstance(code, CodeType) else None
    if key is not None and key in _PARSED:
        return _PARSED[key]
    found = None
    if isinstance(code, CodeType):
        path = code.co_filename
        linecache.checkcache(path)
        lines = linecache.getlines(path)
        start = code.co_firstlineno
        if lines and 0 < start <= len(lines):
            found = _parse_lines(_own_lines(lines, code), code.co_name, path, start)
    if found is None:
        try:
            src, first = inspect.getsourcelines(func)
            source_file = inspect.getsourcefile(func)
        except (OSError, TypeError):
            pass
        else:
            found = _parse_lines("".join(src), getattr(func, "__name__", ""), source_file, first)
    if key is not None:
        _PARSED[key] = found
    return found


def signature_findings(
    cls: type,
    protocol: type,
    *,
    contract_version: int = CONTRACT_VERSION,
    methods: Collection[str] | None = None,
    body_checks: bool = False,
    unread: list[str] | None = None,
) -> list[Finding]:
    """Every signature finding of ``cls`` against ``protocol`` (methods only).

    Inherited methods are looked up along the MRO, and findings point at the class that really
    defines the method, which is where the fix has to go. ``methods`` restricts the check to
    some of the Protocol's methods. With ``body_checks``, a method whose body the rules need
    but whose source cannot be read or analysed is skipped and, when ``unread`` is given,
    appended to it as ``"Owner.method: why"``; analysing bodies never raises.
    """
    target = f"{cls.__module__}.{cls.__qualname__}"
    findings: list[Finding] = []
    for name, contract in contract_methods(protocol, contract_version).items():
        if methods is not None and name not in methods:
            continue
        owner = _defining_class(cls, name)
        if owner is None or owner is object:
            findings.append(
                missing_method(
                    contract,
                    protocol=protocol.__name__,
                    target=target,
                    class_name=cls.__qualname__,
                    where=class_location(cls),
                )
            )
            continue
        if getattr(owner, "_is_protocol", False):
            findings.append(
                missing_method(
                    contract,
                    protocol=protocol.__name__,
                    target=target,
                    class_name=cls.__qualname__,
                    where=class_location(cls),
                    why=f"only inherits the Protocol stub from {owner.__qualname__}",
                )
            )
            continue
        raw = inspect.getattr_static(cls, name)
        func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if not callable(func):
            findings.append(
                missing_method(
                    contract,
                    protocol=protocol.__name__,
                    target=target,
                    class_name=cls.__qualname__,
                    where=class_location(owner),
                    why=f"has `{name}` (on {owner.__qualname__}), but it is not a method",
                )
            )
            continue
        try:
            impl = sig_from_callable(name, func, bound=isinstance(raw, staticmethod))
        except (TypeError, ValueError) as exc:
            findings.append(
                Finding(
                    rule="load-error",
                    message=f"cannot read the signature of `{name}`: {exc}",
                    target=target,
                    method=name,
                    impl_location=class_location(owner),
                )
            )
            continue
        owner_name = None if owner is cls else owner.__qualname__
        findings += method_findings(
            contract,
            impl,
            None,
            protocol=protocol.__name__,
            target=target,
            owner=owner_name,
            contract_version=contract_version,
            path=None,
        )
        if body_checks:
            findings += _body_findings(
                contract, impl, func, protocol.__name__, target, owner_name, unread, owner
            )
    return findings


def _body_findings(
    contract: MethodSig,
    impl: MethodSig,
    func: Callable[..., object],
    protocol: str,
    target: str,
    owner_name: str | None,
    unread: list[str] | None,
    owner: type,
) -> list[Finding]:
    """The body rules on one live method; what cannot be analysed goes to ``unread``."""
    where = f"{owner.__qualname__}.{contract.name}"
    try:
        real = inspect.unwrap(func)
        code = getattr(real, "__code__", None)
        if isinstance(code, CodeType) and not body_may_find(contract, _code_names(code)):
            return []
        parsed = _function_ast(real)
        if parsed is None:
            if unread is not None:
                unread.append(f"{where}: its source cannot be read")
            return []
        return body_findings(
            contract,
            impl,
            parsed[0],
            protocol=protocol,
            target=target,
            owner=owner_name,
            path=parsed[1],
            line_offset=parsed[2],
        )
    except Exception as exc:  # an odd body must never take the signature check down with it
        if unread is not None:
            unread.append(f"{where}: analysing its source failed ({type(exc).__name__}: {exc})")
        return []


@contextmanager
def _import_root(path: str | None) -> Iterator[None]:
    """Put the import root of ``path`` first on ``sys.path`` while importing, then restore."""
    if not path:
        yield
        return
    root = module_name_for(path)[1]
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        yield
    finally:
        if added and root in sys.path:
            sys.path.remove(root)


def import_target(target: ClassTarget) -> type | str:
    """Import the class ``target`` names; on failure, a one-line reason."""
    module_name = target.module
    if module_name is None and target.path:
        module_name = module_name_for(target.path)[0]
    if module_name is None:
        return f"{target.name}: no module to import"
    try:
        with _import_root(target.path):
            module = importlib.import_module(module_name)
    except BaseException as exc:  # a plugin's import may raise anything, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        return f"importing {module_name} failed: {summarise_exception(exc)}"
    if target.path and getattr(module, "__file__", None):
        loaded = os.path.realpath(str(module.__file__))
        if loaded != os.path.realpath(target.path):
            return (
                f"importing {module_name} loaded {loaded}, not {target.path} "
                "(another module of that name comes first on sys.path)"
            )
    obj: object = module
    for part in target.class_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return f"module {module_name} has no class {target.class_name!r}"
    if not isinstance(obj, type):
        return f"{module_name}.{target.class_name} is a {type(obj).__name__}, not a class"
    return obj


def run(
    targets: Sequence[ClassTarget], *, contract_version: int = CONTRACT_VERSION
) -> list[CheckResult]:
    """One result per (target, Protocol); a target that cannot be imported is an ERROR."""
    results: list[CheckResult] = []
    for target in targets:
        started = time.perf_counter()
        cls = import_target(target)
        if isinstance(cls, str):
            finding = Finding(
                rule="load-error",
                message=cls,
                target=target.name,
                hint="make the module importable here (install its dependencies), or use "
                "`--level source`, which never imports",
                impl_location=Location(target.path) if target.path else None,
            )
            results.append(CheckResult(target.name, LEVEL, Outcome.ERROR, (finding,), detail=cls))
            continue
        for protocol, methods, _ in split_by_protocol(target.protocols):
            found = signature_findings(
                cls,
                protocol_by_name(protocol),
                contract_version=contract_version,
                methods=methods,
                body_checks=True,
            )
            # Targets are named by the runner; keep the name consistent across levels.
            findings = tuple(_renamed(f, target.name) for f in found)
            now = time.perf_counter()
            results.append(
                CheckResult(
                    target=target.name,
                    check=f"{LEVEL}:{protocol}",
                    outcome=outcome_for(findings),
                    findings=findings,
                    duration_s=now - started,
                )
            )
            started = now
    return results


def _renamed(finding: Finding, target: str) -> Finding:
    return finding if finding.target == target else replace(finding, target=target)


def run_level(targets: Sequence[ClassTarget], options: LevelOptions) -> list[CheckResult]:
    """The runner's entry: this level needs only the contract version."""
    return run(targets, contract_version=options.contract_version)
