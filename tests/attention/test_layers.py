"""The engine's place in the layers: encodings never import the attention engine (the engine
owns the piecewise kernel; encodings only declare segments)."""

from __future__ import annotations

import ast
from pathlib import Path

import relpos.encodings

ENCODINGS = Path(relpos.encodings.__file__).parent


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            depth = node.level
            if depth:  # resolve relative to relpos.encodings[.<family>]
                parts = ["relpos", *path.relative_to(ENCODINGS.parent).with_suffix("").parts]
                module = ".".join(parts[: len(parts) - depth] + ([module] if module else []))
            out.append(module)
        elif isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
    return out


def test_encodings_never_import_the_attention_engine():
    offenders = {
        str(path.relative_to(ENCODINGS)): module
        for path in ENCODINGS.rglob("*.py")
        for module in _imports(path)
        if module == "relpos.attention" or module.startswith("relpos.attention.")
    }
    assert not offenders, offenders


def test_no_fast_attention_hook():
    from relpos.encodings.base import Encoding

    assert not hasattr(Encoding, "fast_attention")
    for name in ("key_segments", "next_break", "positions_from_tokens"):
        assert callable(getattr(Encoding, name)), name


def test_the_engine_names_no_encoding():
    """The engine reads capabilities (flags and hooks), never a concrete encoding: no module of
    ``relpos.attention`` imports a module that defines a registered encoding."""
    import importlib

    import relpos

    engine = ENCODINGS.parent / "attention"
    registered = {relpos.registry.encoding_class(name) for name in relpos.available()}
    offenders = {}
    for path in engine.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            module = node.module
            if node.level:
                parts = ["relpos", *path.relative_to(ENCODINGS.parent).with_suffix("").parts]
                module = ".".join(parts[: len(parts) - node.level] + [module])
            if not module.startswith("relpos.encodings"):
                continue
            defined = {
                cls.__name__
                for cls in registered
                if cls.__module__ == importlib.import_module(module).__name__
            }
            if defined:
                offenders[str(path.relative_to(engine))] = (module, sorted(defined))
    assert offenders == {}
