"""No import cycles among the project's modules (service, export, benchmarks).

A cycle makes import order matter and the layers (export's sources → graphs → verify → publish,
service's queue below its API, the benchmark stages above their harness) unreadable. The graph
comes from grimp (the library import-linter is built on), which resolves relative imports,
``from package import submodule`` and imports inside functions, and counts the ones under
``TYPE_CHECKING`` too: a cycle hidden from the interpreter is still one for a reader. Its strongly
connected components are found here (Tarjan), so a failure names every module of each cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import grimp

PACKAGES = ("service", "export", "benchmarks")


def strongly_connected(nodes: Iterable[str], successors: Callable[[str], Iterable[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one node, iteratively (no recursion
    limit whatever the depth of the import chains)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(successors(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(successors(child)))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def project_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def cycles_of(graph: grimp.ImportGraph) -> list[set[str]]:
    return strongly_connected(graph.modules, graph.find_modules_directly_imported_by)


def one_cycle(graph: grimp.ImportGraph, component: set[str]) -> str:
    """A path through ``component`` back to where it starts, e.g. ``a → b → c → a``."""
    first, second = sorted(component)[:2]
    there = graph.find_shortest_chain(importer=first, imported=second) or (first, second)
    back = graph.find_shortest_chain(importer=second, imported=first) or (second, first)
    return " → ".join([*there, *back[1:]])


def test_the_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set()}
    assert strongly_connected(imports, imports.__getitem__) == [{"a", "b", "c"}]


def test_one_import_back_up_the_layers_is_caught() -> None:
    """The model (a source) importing the translation pipeline, which imports the model."""
    graph = project_graph()
    graph.add_import(importer="export.sources.ours.model", imported="export.translation")
    (cycle,) = cycles_of(graph)
    assert {"export.sources.ours.model", "export.translation"} <= cycle
    path = one_cycle(graph, cycle).split(" → ")
    assert path[0] == path[-1]
    assert "export.sources.ours.model → export.translation" in " → ".join(path)  # the one way round


def test_no_module_of_the_project_imports_itself_through_others() -> None:
    graph = project_graph()
    cycles = cycles_of(graph)
    assert not cycles, "import cycles:\n" + "\n".join(one_cycle(graph, c) for c in cycles)
