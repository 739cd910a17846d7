"""The memory one task of a lazy inference holds, and working blocks that keep it in a budget.

A task of :func:`~xpatch.core.apply.lazy.apply_dask` holds, at its peak, its
group's input (the box its patches cover, all carried cells), the partial sums
of each output over the box on the output grid (with a plane of weights), and
one batch of patches with ``fn``'s results for it (the whole group when several
outputs or weights are blended). All three grow with the chunk's area, so a
large input chunk (2048² cells of 4 float32 bands: 64 MiB) makes large tasks:
measured, a write of 2048² chunks and 512² patches peaked at 0.8-0.9 GiB on 2
threads. :func:`working_plans` cuts the input's chunks into smaller working
blocks (halving the longest) until the largest task's estimate
(:func:`task_bytes`) fits the budget: the groups are then the patches of a
working block, and the output's blocks are the working blocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple

import dask
import numpy as np
from dask.utils import parse_bytes

from xpatch.core.apply.batches import InferenceSetup
from xpatch.core.errors import OptionError
from xpatch.core.plan import Plan, frozen_array
from xpatch.core.scale import scale_plan

#: The dask config key of the default budget (``dask.config.set({CONFIG_KEY: "1GiB"})``,
#: or the environment variable ``DASK_XPATCH__TASK_MEMORY``).
CONFIG_KEY = "xpatch.task-memory"

#: The budget when neither ``task_memory=`` nor the dask config sets one. Measured on a
#: 2-thread write of 2048² chunks (4 float32 bands) and 512² patches: the tasks of whole
#: chunks peaked at 752-866 MiB; 1024² working blocks (this budget) at 359-390 MiB in
#: 1.2-1.75x the time; 512 x 1024 ones (128 MiB) at 327 MiB in 2.4x (each chunk read
#: more often).
DEFAULT_TASK_MEMORY = "192MiB"


class TaskBytes(NamedTuple):
    """What the largest task of an inference holds, in bytes, by kind."""

    input: int
    partials: int
    batch: int

    @property
    def total(self) -> int:
        """All of it."""
        return self.input + self.partials + self.batch


def task_memory(value: int | str | None) -> int:
    """Return the budget of one task in bytes: ``value``, else the dask config's, else 192 MiB.

    Raises :class:`~xpatch.OptionError` naming the argument for anything but a
    positive number of bytes or a size such as ``"512MiB"``.

    Examples
    --------
    >>> task_memory("512MiB"), task_memory(10**6)
    (536870912, 1000000)
    >>> task_memory(None) == task_memory(DEFAULT_TASK_MEMORY)
    True
    """
    given = value
    source = f"task_memory={given!r}"
    if value is None:
        value = dask.config.get(CONFIG_KEY, DEFAULT_TASK_MEMORY)
        source = f"dask config {CONFIG_KEY!r} = {value!r}"
    try:
        if isinstance(value, bool):
            raise ValueError
        nbytes = parse_bytes(value) if isinstance(value, str) else int(value)
        if nbytes != value and not isinstance(value, str):
            raise ValueError  # 1.5 bytes, not a whole number
    except (TypeError, ValueError, OverflowError):
        nbytes = 0
    if nbytes < 1:
        raise OptionError(
            f"{source} is not a memory size: give a positive number of bytes or a size "
            "such as '256MiB' or '2GB' (the memory one task may hold; a write's peak is "
            "about the threads times it, plus the imports)."
        )
    return nbytes


def task_bytes(
    array_shape: Sequence[int],
    itemsize: int,
    plan: Plan,
    apply: InferenceSetup,
    out_plan: Plan,
    accs: Mapping[str | None, np.dtype],
) -> TaskBytes:
    """Estimate the bytes the largest task of :func:`apply_dask` holds at its peak.

    Per group: its box of input (``array_shape``'s carried cells times the box's
    cells, ``itemsize`` bytes each); per output, the partial sums over its box
    on the output grid in the reduction's working dtype, and a plane of weights;
    one batch of patches and ``fn``'s results (``min(batch_size, group)``
    patches; the whole group when several outputs or weights are blended, which
    holds every result until the group is done). The largest group's total.
    """
    k = plan.ndim
    carried = math.prod(array_shape[: len(array_shape) - k])
    if not plan.groups:
        return TaskBytes(0, 0, 0)
    in_cells = np.array([math.prod(shape) for _, shape in plan.boxes], dtype=np.int64)
    out_cells = np.array([math.prod(shape) for _, shape in out_plan.boxes], dtype=np.int64)
    members = np.array([stop - start for start, stop in plan.groups], dtype=np.int64)
    per_out_cell = 0
    per_patch = carried * math.prod(plan.size) * itemsize
    for name, (lead, dtype) in apply.outputs.items():
        sums = apply.reduce.working_dtype(accs[name], apply.window).itemsize
        per_out_cell += (math.prod(lead) + 1) * sums
        per_patch += math.prod(lead) * math.prod(out_plan.size) * np.dtype(dtype).itemsize
    batched = apply.single and apply.weight_key is None
    if not batched:
        held = members
    elif apply.pad_batch:
        held = np.full_like(members, apply.batch_size)
    else:
        held = np.minimum(members, apply.batch_size)
    input_bytes = carried * in_cells * itemsize
    partial_bytes = out_cells * per_out_cell
    batch_bytes = held * per_patch
    largest = int(np.argmax(input_bytes + partial_bytes + batch_bytes))
    return TaskBytes(
        int(input_bytes[largest]), int(partial_bytes[largest]), int(batch_bytes[largest])
    )


def refine(plan: Plan, parts: Sequence[int], multiples: Sequence[int] | None = None) -> Plan:
    """Return ``plan`` over its grid's chunks cut into ``parts``: the same patches, smaller groups.

    The user's order is the plan's (``keep_order``), so per-patch weights and
    indices still match; a group never holds more patches than the largest of
    ``plan``'s did. Blocks are multiples of ``multiples`` (:meth:`ChunkGrid.split`).
    """
    if all(p == 1 for p in parts):
        return plan
    largest = max((stop - start for start, stop in plan.groups), default=1)
    grid = plan.grid.split(parts, multiples)
    return Plan.compile(plan.anchors, grid, plan.size, keep_order=True, max_group=largest)


def working_plans(
    array_shape: Sequence[int],
    itemsize: int,
    plan: Plan,
    apply: InferenceSetup,
    out_plan: Plan,
    accs: Mapping[str | None, np.dtype],
    budget: int,
    inner: Plan | None = None,
) -> tuple[Plan, Plan]:
    """Return the plans (read and output grid) whose largest task fits ``budget`` bytes.

    Halves the working blocks along the axis where they are longest, while the
    largest task's :func:`task_bytes` pass ``budget`` and a block stays at least
    a patch long (smaller blocks would only add overhang). When nothing can be
    split further the smallest blocks are kept: the budget is a target, not a
    refusal. With a halo, ``plan`` reads the grown windows and ``inner`` holds
    the inner windows: the blocks split ``inner``'s grid, and the read plan
    follows them (:func:`grown_plan`).
    """
    base = plan if inner is None else inner
    factors = [Fraction(o, i) for o, i in zip(out_plan.size, base.size)]
    parts = [1] * base.ndim
    plans = (plan, out_plan)
    while task_bytes(array_shape, itemsize, plans[0], apply, plans[1], accs).total > budget:
        extents = [max(chunks) / n for chunks, n in zip(base.grid.chunks, parts)]
        splittable = [j for j, e in enumerate(extents) if e / 2 >= base.size[j]]
        if not splittable:
            break
        axis = max(splittable, key=lambda j: extents[j])
        parts[axis] *= 2
        # Blocks the output's scale makes whole: its chunks stay regular, as zarr needs.
        fine = refine(base, parts, [f.denominator for f in factors])
        plans = (fine if inner is None else grown_plan(fine, plan), scale_plan(fine, factors))
    return plans


def grown_plan(fine: Plan, grown: Plan) -> Plan:
    """Return ``grown`` (the windows grown by a halo) grouped as ``fine``.

    ``fine`` holds the windows' anchors with the inner size on a grid of
    working blocks; each read window starts a halo before its window, and
    the groups are ``fine``'s, so that each group cuts its own part of a chunk.

    Examples
    --------
    >>> from xpatch.core.plan import ChunkGrid
    >>> inner = Plan.compile(np.array([[0], [4]]), ChunkGrid.from_chunks([(4, 4)]), [4],
    ...                      keep_order=True)
    >>> read = Plan.compile(np.array([[-1], [3]]), ChunkGrid.from_chunks([(8,)]), [6],
    ...                     keep_order=True)
    >>> grown_plan(inner, read).anchors.tolist(), grown_plan(inner, read).groups
    ([[-1], [3]], ((0, 1), (1, 2)))
    """
    halo = np.asarray([(g - f) // 2 for g, f in zip(grown.size, fine.size)], dtype=np.int64)
    anchors = frozen_array(fine.anchors - halo)
    return Plan(fine.grid, grown.size, anchors, fine.order, fine.groups)
