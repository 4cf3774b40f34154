"""What every remedy is: the `Build` it changes, the `Remedy` hooks over the steps of
`qlint.loading.quantize`, and the hooks of several remedies applied in order.

A remedy is optional hooks over those steps: the model and its input batches before export
(`on_build`, `on_inputs`), the exported float graph before `prepare_pt2e` (`on_graph`), the
quantizer (`on_quantizer`) and the quantized program (`on_program`). Every remedy changes
numerics, which makes it an *unsafe* fix in ruff's sense: it runs only with `--unsafe-fixes` or
when the config lists it, and `qlint.remedies.search` keeps it only when it helps and the
accuracy stays within the guard. This module imports no torch: the patch writer reads it in
runs that never load the stack.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from qlint.records.results import ProgramIO
from qlint.records.source import module_name
from qlint.settings.config import RemedyName


@dataclass(frozen=True)
class Build:
    """What a target is exported from: the model, its example inputs and its calibration batches."""

    model: Any
    example: tuple[Any, ...]
    calibration: tuple[tuple[Any, ...], ...]


class Remedy:
    """One change to how a target is built; the defaults change nothing."""

    name: ClassVar[RemedyName]
    user_change: ClassVar[tuple[str, ...]]  # the lines a user adds to their own export script
    for_npu: ClassVar[bool] = False  # a remedy for an Ethos-U target's build (else for the Cortex-M CPU's)
    edits_factory: ClassVar[bool] = False  # it changes what the factory returns: `--write patch:` can write it there

    def not_applicable(self, graph: Any) -> str | None:
        """Why this remedy cannot change the exported float `graph`, or None when it can."""
        raise NotImplementedError

    def sites(self, graph: Any) -> list[str]:
        """The places this remedy changes in the exported float `graph`, named as the user's model names
        them, when it changes each independently (empty otherwise): a refused remedy is then measured
        at each alone, so the report says which one costs the accuracy, and kept without it."""
        return []

    def leaving(self, sites: frozenset[str]) -> Remedy:
        """This remedy with `sites` (some of `sites(graph)`) left as they are."""
        raise NotImplementedError

    def alternative(self) -> Remedy | None:
        """The same remedy built another way, which the search tries when this one is over the guard,
        before it leaves any site out; None when there is none."""
        return None

    def variant(self) -> str:
        """How this build differs from the remedy's plain one, for the report ("" when it is the plain one)."""
        return ""

    def user_lines(self) -> tuple[str, ...]:
        """What the user adds to their export script for this remedy as configured."""
        return self.user_change

    def on_inputs(self, batch: tuple[Any, ...]) -> tuple[Any, ...]:
        return batch

    def on_build(self, build: Build) -> Build:
        return build

    def on_graph(self, graph: Any) -> Any:
        return graph

    def on_quantizer(self, quantizer: Any) -> Any:
        return quantizer

    def on_program(self, program: Any) -> ProgramIO | None:
        """Change the quantized ExportedProgram in place; say how its inputs and outputs changed."""
        return None

    def edit_factory(self, source: str, function: str) -> list[str] | str:
        """`source`, the factory's file, with this remedy written into `function`: its lines, or why
        that is not mechanical. Only a remedy that `edits_factory` has one; the others belong in the
        user's export script, which qlint does not know."""
        raise NotImplementedError


class SitedRemedy(Remedy):
    """A remedy whose rewrite acts at each site on its own (each LayerNorm, each broadcast), so it
    can leave some in float: its public rewrite (`public`, a function of its module) takes `skip=`,
    which the export line then names. A subclass says where it acts (`nodes`), why a node cannot be
    changed (`why_not`) and what to say when the graph has none (`none_found`)."""

    public: ClassVar[str]  # the rewrite's name in the remedy's module, for the export line
    none_found: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.user_change = (f"from {cls.__module__} import {cls.public}",
                           f"graph = {cls.public}(torch.export.export(model, example_inputs).module())"
                           "  # before prepare_pt2e")

    def __init__(self, skip: frozenset[str] = frozenset()) -> None:
        self.skip = skip  # sites (`site_name`) left as they are

    def nodes(self, graph: Any) -> list[Any]:
        """The nodes the rewrite would change, in graph order."""
        raise NotImplementedError

    def why_not(self, graph: Any, node: Any) -> str | None:
        """Why `node` cannot be changed, or None when it can."""
        return None

    def sites(self, graph: Any) -> list[str]:
        return list(dict.fromkeys(site_name(n) for n in self.nodes(graph) if self.why_not(graph, n) is None))

    def not_applicable(self, graph: Any) -> str | None:
        found = self.nodes(graph)
        if not found:
            return self.none_found
        reasons = [why for node in found if (why := self.why_not(graph, node)) is not None]
        return "; ".join(reasons) if len(reasons) == len(found) else None

    def leaving(self, sites: frozenset[str]) -> Remedy:
        return type(self)(skip=self.skip | sites)

    def user_lines(self) -> tuple[str, ...]:
        if not self.skip:
            return self.user_change
        skipped = ", ".join(repr(site) for site in sorted(self.skip))
        return (self.user_change[0], self.user_change[1].replace(".module())", f".module(), skip={{{skipped}}})"))


def call_nodes(graph: Any, target: Any) -> list[Any]:
    """The graph's calls of the op `target`, in order: where a remedy would act."""
    return [n for n in graph.graph.nodes if n.op == "call_function" and n.target == target]


def site_name(node: Any) -> str:
    """The user's name for where a remedy acts: the path of the module that called the op
    (`encoder.layers.0.norm1`), else the graph node's name (a functional call at the top level)."""
    return module_name(node) or node.name


def rewrite_each(graph: Any, nodes: Sequence[Any], why_not: Callable[[Any], str | None],
                 rewrite: Callable[[Any, int], None], *, skip_unsupported: bool, skip: Collection[str],
                 verb: str) -> Any:
    """`rewrite(node, index)` at each of `nodes` (a sited remedy's public rewrite), leaving those that
    `skip` names. One that cannot be rewritten (`why_not` says why) raises ValueError `cannot <verb>
    <reason>`, unless `skip_unsupported`, which leaves it as it is."""
    for index, node in enumerate(nodes):
        if site_name(node) in skip:
            continue
        reason = why_not(node)
        if reason is not None:
            if skip_unsupported:
                continue
            raise ValueError(f"cannot {verb} {reason}")
        rewrite(node, index)
    graph.graph.lint()
    graph.recompile()
    return graph


def node_for(graph: Any, origin: Any, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    """A node calling `target` (`"get_attr"`: reading the graph's attribute `args[0]`) at the graph's
    insertion point, with the fake value export would have recorded for it and the source of `origin`,
    the node it replaces, so what a rewrite creates is reported at the user's line and module."""
    import torch

    fake_mode = origin.meta["val"].fake_mode
    if target == "get_attr":
        created = graph.graph.get_attr(args[0])
        # static: export's mode has a shape environment, which would give the new constant symbolic
        # sizes, and every shape computed from them (a convolution's output length) symbols too
        created.meta["val"] = fake_mode.from_tensor(getattr(graph, args[0]), static_shapes=True)
    else:
        created = graph.graph.call_function(target, args, kwargs or {})
        with fake_mode:
            created.meta["val"] = target(*torch.fx.node.map_arg(args, lambda n: n.meta["val"]), **(kwargs or {}))
    for key in ("stack_trace", "nn_module_stack"):
        if key in origin.meta:
            created.meta[key] = origin.meta[key]
    return created


def apply_to_build(build: Build, remedies: list[Remedy]) -> Build:
    for remedy in remedies:
        build = remedy.on_build(build)
    return build


def apply_to_inputs(batch: tuple[Any, ...], remedies: list[Remedy]) -> tuple[Any, ...]:
    for remedy in remedies:
        batch = remedy.on_inputs(batch)
    return batch


def apply_to_graph(graph: Any, remedies: list[Remedy]) -> Any:
    for remedy in remedies:
        graph = remedy.on_graph(graph)
    return graph


def apply_to_quantizer(quantizer: Any, remedies: list[Remedy]) -> Any:
    for remedy in remedies:
        quantizer = remedy.on_quantizer(quantizer)
    return quantizer


def apply_to_program(program: Any, remedies: list[Remedy]) -> ProgramIO | None:
    io = None
    for remedy in remedies:
        io = remedy.on_program(program) or io
    return io

