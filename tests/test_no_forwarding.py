"""No forwarding layers (issue 39): no method in agentloop/ whose body only calls another
object's method with its own arguments and returns what that returns. Such a method is a
second place for one signature; the caller should call the part itself (``store.transcript``,
``store.tool_calls``...), or the class should take the verb by inheritance or generation.

Found by reading the source (AST): a method of a class whose body, docstring aside, is one
``return other.method(a, b, c=c)`` (or ``await`` of it, or the call alone), passing exactly
its own parameters, where ``other`` is an attribute or a name, not ``self``/``cls``, nor
``super()``, nor an object chosen by a call (``self.family(model).request(...)`` dispatches).
Properties (a read, not a verb) and dunder methods (hooks Python calls) are not verbs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "agentloop"

#: Forwards kept on purpose, each with why it can't go (an interface that must be answered
#: by an object that wraps another, say). Keep it short.
EXEMPT: dict[str, str] = {
    "AgentloopSettings.as_dict": "public: the merged settings as a plain dict (values is typed)",
    "StreamHub.leave": "set.discard on the hub's subscriptions, named for its subscribers",
    "AzureProvider.api_key": "the Provider interface: Azure's two API families share one key",
    "_CappedStream.close": "httpx.SyncByteStream's interface, answered by the capped stream",
    "_AsyncCappedStream.aclose": "httpx.AsyncByteStream's interface, likewise",
    "VertexAIProvider.credential_secrets": "HTTPProvider's hook, answered by its credentials",
    "EventStream.close": "a generator's close(), on the stream that also keeps its result",
    "AsyncEventStream.aclose": "an async generator's aclose(), likewise",
}


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _passes_its_own_arguments(
    function: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call
) -> bool:
    given = function.args
    positional = [a.arg for a in given.posonlyargs + given.args]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    names: list[str] = []
    star = double_star = False
    for argument in call.args:
        if isinstance(argument, ast.Name):
            names.append(argument.id)
        elif (
            isinstance(argument, ast.Starred)
            and isinstance(argument.value, ast.Name)
            and given.vararg is not None
            and argument.value.id == given.vararg.arg
        ):
            star = True
        else:
            return False  # a value made here: the method does something
    for keyword in call.keywords:
        if keyword.arg is None:
            if not (
                isinstance(keyword.value, ast.Name)
                and given.kwarg is not None
                and keyword.value.id == given.kwarg.arg
            ):
                return False
            double_star = True
        elif isinstance(keyword.value, ast.Name) and keyword.value.id == keyword.arg:
            names.append(keyword.arg)
        else:
            return False
    expected = positional + [a.arg for a in given.kwonlyargs]
    return (
        sorted(names) == sorted(expected)
        and star == (given.vararg is not None)
        and double_star == (given.kwarg is not None)
    )


def _forwards(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    if function.name.startswith("__") and function.name.endswith("__"):
        return False
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Name) and decorator.id in ("property", "cached_property"):
            return False
    body = [s for i, s in enumerate(function.body) if not (i == 0 and _is_docstring(s))]
    if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)):
        return False
    value = body[0].value
    if isinstance(value, ast.Await):
        value = value.value
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return False
    target = value.func.value
    if isinstance(target, ast.Name) and target.id in ("self", "cls"):
        return False  # another name for one of its own methods
    if isinstance(target, ast.Call):
        return False  # super(), or an object chosen per call: a dispatch, not a layer
    return _passes_its_own_arguments(function, value)


def forwarding_methods(root: Path = PACKAGE) -> list[str]:
    """``path:line Class.method`` of every forwarding method under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and _forwards(
                    member
                ):
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{member.lineno} {node.name}.{member.name}")
    return found


def test_no_method_only_forwards_to_another_object() -> None:
    found = [f for f in forwarding_methods() if f.split(" ", 1)[1] not in EXEMPT]
    assert found == [], "methods that only forward (call the part itself):\n" + "\n".join(found)


def test_the_exemptions_are_still_forwards() -> None:
    names = {f.split(" ", 1)[1] for f in forwarding_methods()}
    assert set(EXEMPT) <= names, f"no longer forwards, unlist: {set(EXEMPT) - names}"


def test_the_check_finds_a_forward_and_leaves_real_work(tmp_path: Path) -> None:
    (tmp_path / "agentloop").mkdir()
    (tmp_path / "agentloop" / "sample.py").write_text(
        "class Facade:\n"
        "    def save(self, call, message, *, release=None):\n"
        '        """Docstring."""\n'
        "        return self.part.save(call, message, release=release)\n"
        "    async def asave(self, *args, **kwargs):\n"
        "        await self.part.asave(*args, **kwargs)\n"
        "    def narrowed(self, call):\n"
        "        return self.part.save(call, None)\n"
        "    def own(self, call):\n"
        "        return self.other_name(call)\n"
        "    def more(self, call):\n"
        "        self.count += 1\n"
        "        return self.part.save(call)\n"
        "    def routed(self, request):\n"
        "        return self.family(request).save(request)\n"
        "    @property\n"
        "    def read(self):\n"
        "        return self.part.read()\n"
        "    def __len__(self):\n"
        "        return self.part.__len__()\n"
        "    def read_all(self):\n"
        "        return self.part.read()\n"
    )

    found = forwarding_methods(tmp_path / "agentloop")

    assert [f.split(" ", 1)[1] for f in found] == ["Facade.save", "Facade.asave", "Facade.read_all"]
