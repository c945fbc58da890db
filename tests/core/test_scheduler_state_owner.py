"""Only ``engine/core/scheduler.py`` writes the scheduler's state, checked on the AST of every file.

The scheduler owns its state: others change it through its methods (``add_request``,
``schedule``, ``update_from_output``, ``finish_requests``, the bulk path's
``take_finished_req_ids`` / ``finish_length_capped`` / ``end_bulk_run``…). Outside
``scheduler.py`` the check refuses, on anything that denotes a scheduler:

* assigning, augmenting or deleting an attribute (``sched.x = …``, ``self.scheduler.x += …``,
  ``del sched.x``), or an item of one (``sched.requests[k] = …``, ``del sched.requests[k]``);
* ``setattr`` / ``delattr`` / ``object.__setattr__`` on it, and writes through ``__dict__`` or
  ``vars()``;
* mutating one of its containers in place (``sched.running.append(r)``,
  ``sched.finished_req_ids.add(i)``, ``sched.waiting.pop_request()``), directly or through a
  local name bound to it (``running = sched.running; running.remove(r)``).

Reads are free (``len(sched.running)``, ``sched.waiting.peek_request()``, ``for r in
sched.running``), and so are the state changes of the objects the scheduler holds that own
their state themselves (the KV cache manager's methods). A scheduler is: a parameter or
variable annotated ``Scheduler``, a name bound to ``Scheduler(…)`` or to another scheduler
expression, a name spelt ``sched`` / ``scheduler`` / ``*_scheduler``, an attribute named
``scheduler`` / ``_scheduler`` / ``sched`` (``core.scheduler``), and ``self`` in a subclass of
``Scheduler``. The tests are not checked: they build hand-made states the way vLLM's own
scheduler tests do. The checker itself is tested on snippets.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "engine" / "core" / "scheduler.py"

SCHEDULER_NAME = re.compile(r"^(sched|scheduler|\w+_scheduler)$")
SCHEDULER_ATTRIBUTE = frozenset({"scheduler", "_scheduler", "sched"})
#: In-place methods of the scheduler's containers (lists, sets, dicts, deques, its request queue).
MUTATORS = frozenset({
    "append", "appendleft", "extend", "extendleft", "insert", "pop", "popleft", "remove",
    "clear", "add", "discard", "update", "setdefault", "popitem", "sort", "reverse",
    "difference_update", "intersection_update", "symmetric_difference_update", "rotate",
    "add_request", "pop_request", "prepend_request", "prepend_requests", "remove_request",
    "remove_requests", "__setitem__", "__delitem__", "__iadd__", "__ior__",
})
SETTERS = frozenset({"setattr", "delattr"})


def _names_scheduler(annotation: ast.expr | None) -> bool:
    """Does an annotation mention ``Scheduler`` (``Scheduler``, ``Scheduler | None``,
    ``"Scheduler"``, ``core.Scheduler``)?"""
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Scheduler":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Scheduler":
            return True
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.search(r"\bScheduler\b", node.value)
        ):
            return True
    return False


def _scopes(tree: ast.Module) -> Iterator[tuple[ast.AST, bool]]:
    """(scope, self is a scheduler): the module and every function, with its own body."""
    yield tree, False
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_scheduler_class = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                subclass = any(_names_scheduler(base) for base in child.bases)
                stack.append((child, subclass))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield child, in_scheduler_class
                stack.append((child, in_scheduler_class))
            else:
                stack.append((child, in_scheduler_class))


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a scope, not those of the functions and classes nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
        ):
            stack.extend(ast.iter_child_nodes(node))


class _Scope:
    """What denotes a scheduler, or one of its containers, inside one scope."""

    def __init__(self, scope: ast.AST, self_is_scheduler: bool) -> None:
        self.schedulers: set[str] = {"self"} if self_is_scheduler else set()
        self.containers: set[str] = set()  # local names bound to a scheduler's attribute
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = scope.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if _names_scheduler(arg.annotation):
                    self.schedulers.add(arg.arg)
        bindings: list[tuple[ast.expr, ast.expr | None, ast.expr | None]] = []
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assign):
                bindings.extend((t, node.value, None) for t in node.targets)
            elif isinstance(node, ast.AnnAssign):
                bindings.append((node.target, node.value, node.annotation))
            elif isinstance(node, ast.NamedExpr):
                bindings.append((node.target, node.value, None))
            elif isinstance(node, ast.With | ast.AsyncWith):
                bindings.extend(
                    (item.optional_vars, item.context_expr, None)
                    for item in node.items if item.optional_vars is not None
                )
        changed = True
        while changed:  # a name bound to a scheduler makes the names bound to it schedulers
            changed = False
            for target, value, annotation in bindings:
                if not isinstance(target, ast.Name):
                    continue
                if target.id not in self.schedulers and (
                    _names_scheduler(annotation)
                    or (value is not None and self.is_scheduler(value))
                ):
                    self.schedulers.add(target.id)
                    changed = True
                elif (
                    target.id not in self.containers
                    and isinstance(value, ast.Attribute)
                    and self.is_scheduler(value.value)
                ):
                    self.containers.add(target.id)
                    changed = True

    def is_scheduler(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.schedulers or bool(SCHEDULER_NAME.match(node.id))
        if isinstance(node, ast.Attribute):
            return node.attr in SCHEDULER_ATTRIBUTE
        if isinstance(node, ast.Call):
            return _names_scheduler(node.func)
        return False

    def is_state(self, node: ast.expr) -> bool:
        """Does ``node`` denote a scheduler's attribute or an item of one (``sched.x``,
        ``sched.x[k][j]``, a local container alias, ``sched.__dict__``, ``vars(sched)``)?"""
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute):
            return self.is_scheduler(node.value)
        if isinstance(node, ast.Name):
            return node.id in self.containers
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return node.func.id == "vars" and any(self.is_scheduler(a) for a in node.args)
        return False


def _targets(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _targets(element)
    elif isinstance(target, ast.Starred):
        yield from _targets(target.value)
    else:
        yield target


def _writes(scope: _Scope, node: ast.AST) -> Iterator[str]:
    """What ``node`` writes of a scheduler's state, described."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = [t for target in node.targets for t in _targets(target)]
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = list(_targets(node.target))
    elif isinstance(node, ast.Delete):
        targets = [t for target in node.targets for t in _targets(target)]
    for target in targets:
        if isinstance(target, ast.Name):
            if isinstance(node, ast.AugAssign) and target.id in scope.containers:
                yield f"augments {target.id} in place"
        elif scope.is_state(target):
            verb = "deletes" if isinstance(node, ast.Delete) else "assigns"
            yield f"{verb} {ast.unparse(target)}"
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in SETTERS and node.args:
            if scope.is_scheduler(node.args[0]):
                yield f"calls {func.id} on {ast.unparse(node.args[0])}"
        elif isinstance(func, ast.Attribute):
            if func.attr in ("__setattr__", "__delattr__") and (
                scope.is_scheduler(func.value)
                or (node.args and scope.is_scheduler(node.args[0]))
            ):
                yield f"calls {ast.unparse(func)}"
            elif func.attr in MUTATORS and scope.is_state(func.value):
                yield f"mutates {ast.unparse(func.value)} ({func.attr})"


def scheduler_state_writes(source: str) -> list[str]:
    """Every write of a scheduler's state in ``source`` ("line N: …")."""
    tree = ast.parse(source)
    found: list[str] = []
    for scope_node, self_is_scheduler in _scopes(tree):
        scope = _Scope(scope_node, self_is_scheduler)
        for node in _own_nodes(scope_node):
            found.extend(f"line {node.lineno}: {what}" for what in _writes(scope, node))
    return sorted(set(found), key=lambda s: int(s.split(":")[0].removeprefix("line ")))


def _checked_files() -> list[Path]:
    files = []
    for init in sorted(ROOT.glob("*/__init__.py")):
        if init.parent.name == "tests":
            continue
        files.extend(p for p in sorted(init.parent.rglob("*.py")) if p != OWNER)
    return files


def test_only_scheduler_py_writes_scheduler_state() -> None:
    files = _checked_files()
    assert ROOT / "engine" / "core" / "bulk" / "apply.py" in files
    problems = [
        f"{path.relative_to(ROOT)}: {p}"
        for path in files
        for p in scheduler_state_writes(path.read_text())
    ]
    assert not problems, "\n".join(problems)


def test_the_checker_sees_real_writes() -> None:
    """A check on real code: read as a subclass of ``Scheduler`` (``self`` is then a scheduler),
    the exempted scheduler.py writes the state in many places, and the checker finds them."""
    source = OWNER.read_text().replace("class Scheduler:", "class Scheduler(Scheduler):")
    assert len(scheduler_state_writes(source)) >= 10


# -- the checker itself --------------------------------------------------------------------------

@pytest.mark.parametrize(
    "source",
    [
        "sched.num_steps = 3",
        "scheduler.running = []",
        "self.scheduler.finished_req_ids = set()",
        "core.scheduler.num_steps += 1",
        "def f(s: Scheduler):\n    s.running = []",
        "def f(s: 'Scheduler | None'):\n    s.num_steps -= 1",
        "del sched.requests[req.req_id]",
        "del sched.requests",
        "sched.requests['x'] = r",
        "sched.requests['x'], y = r, 1",
        "a, *sched.running = xs",
        "sched.finished_req_ids.add('x')",
        "self.scheduler.running.append(r)",
        "sched.waiting.pop_request()",
        "s = self.scheduler\ns.prev_step_scheduled_req_ids = set()",
        "s = core.scheduler\nt = s\nt.num_steps = 0",
        "running = sched.running\nrunning.remove(r)",
        "running = core.scheduler.running\nrunning[0] = r",
        "running = core.scheduler.running\ndel running[0]",
        "running = core.scheduler.running\nrunning += [r]",
        "setattr(sched, 'num_steps', 0)",
        "delattr(self.scheduler, 'running')",
        "object.__setattr__(sched, 'running', [])",
        "sched.__setattr__('running', [])",
        "sched.__dict__['running'] = []",
        "vars(sched)['running'] = []",
        "s = Scheduler(config)\ns.running = []",
        "x: Scheduler = make()\nx.requests.clear()",
        "with make() as sched:\n    sched.running = []",
        "class Fast(Scheduler):\n    def go(self):\n        self.running = []",
        "def f():\n    if (s := core.scheduler):\n        s.num_steps = 1",
        "engine_scheduler.requests.update(d)",
    ],
)
def test_checker_flags(source: str) -> None:
    assert scheduler_state_writes(source)


@pytest.mark.parametrize(
    "source",
    [
        "n = len(sched.running)",
        "r = sched.running[-1]",
        "for r in core.scheduler.running:\n    r.num_computed_tokens = 0",
        "head = sched.waiting.peek_request()",
        "sched.add_request(r)\nsched.finish_length_capped(r)",
        "sched.end_bulk_run(1, [], set(), set())",
        "sched.kv_cache_manager.free(r)",
        "kv = sched.kv_cache_manager\nkv.block_pool.x = 1",
        "request = sched.requests['x']\nrequest.status = s",
        "running = list(sched.running)\nrunning.append(r)",
        "self.scheduler = Scheduler(config)",
        "self.running = []",
        "run.requests.append(r)",
        "def f(s: Scheduler):\n    pass\ns.running = []",  # another scope's s
        "class Other:\n    def go(self):\n        self.running = []",
        "finished = sched.take_finished_req_ids()\nfinished.add('x')",
        "sched_out.num_scheduled_tokens['x'] = 1",
    ],
)
def test_checker_accepts(source: str) -> None:
    assert scheduler_state_writes(source) == []
