"""Slurm's compressed host lists and tasks-per-node lists, expanded.

``expand_hostlist("n[01-03],m1,x[1,5-6]")`` is ``['n01', 'n02', 'n03', 'm1', 'x1', 'x5', 'x6']``;
``expand_tasks_per_node("3(x2),2,1")`` is ``[3, 3, 2, 1]``. Order is kept and nothing is
deduplicated, so the two lists can be zipped host by host.
"""

from __future__ import annotations

import itertools
import re

__all__ = ["expand_hostlist", "expand_tasks_per_node"]

_NUMBER_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_outside_brackets(hostlist: str) -> list[str]:
    """Split at the commas that are not inside ``[...]``."""
    parts: list[str] = []
    current, depth = "", 0
    for char in hostlist:
        if char == "[":
            if depth:
                raise ValueError("nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError("']' without '['")
            depth = 0
        elif char == "," and not depth:
            parts.append(current)
            current = ""
            continue
        current += char
    if depth:
        raise ValueError("'[' without ']'")
    parts.append(current)
    return parts


def _expand_range(expression: str) -> list[str]:
    """``"01-03,7"`` → ``["01", "02", "03", "7"]``: each number as wide as its range's start."""
    values: list[str] = []
    for item in expression.split(","):
        m = _NUMBER_RANGE.match(item)
        if m is None:
            raise ValueError(f"bad range {item!r} (expected N or N-M with digits)")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {item!r} runs backwards")
        # Slurm pads to the width of the start: n[08-10] is n08..n10, n[8-10] is n8..n10.
        values.extend(str(i).zfill(len(low)) for i in range(int(low), int(high) + 1))
    return values


def _expand_part(part: str) -> list[str]:
    """One comma-free host expression; several bracket groups multiply (a[1-2]b[3-4])."""
    if not part:
        raise ValueError("empty host name")
    choices: list[list[str]] = []
    # re.split with a group alternates literal text (even positions) and bracket contents (odd).
    for position, piece in enumerate(re.split(r"\[([^\]]*)\]", part)):
        if position % 2:
            if not piece:
                raise ValueError("empty '[]'")
            choices.append(_expand_range(piece))
        elif piece:
            choices.append([piece])
    return ["".join(combination) for combination in itertools.product(*choices)]


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm host list such as ``SLURM_STEP_NODELIST``.

    Unlike TF's version, zero padding is kept (``n[01-02]`` → ``n01, n02``, the names Slurm
    means) and a part may hold several bracket groups or text after one (``r[1-2]-ib``).

    Args:
        hostlist: e.g. ``"n[1-2],m5,o[3-4,6,7-9]"``. An empty string gives ``[]``.

    Returns:
        The host names, in order, duplicates kept.

    Raises:
        ValueError: the string is malformed (the message quotes it).
    """
    if not isinstance(hostlist, str):
        raise TypeError(
            f"A host list must be a string, got {type(hostlist).__name__} {hostlist!r}."
        )
    if hostlist == "":
        return []
    try:
        return [host for part in _split_outside_brackets(hostlist) for host in _expand_part(part)]
    except ValueError as exc:
        raise ValueError(f'Invalid hostlist format "{hostlist}": {exc}') from None


def expand_tasks_per_node(tasks_per_node: str) -> list[int]:
    """Expand Slurm's tasks-per-node list (``SLURM_STEP_TASKS_PER_NODE``).

    Args:
        tasks_per_node: e.g. ``"3(x2),2,1"``.

    Returns:
        One task count per node, e.g. ``[3, 3, 2, 1]``.

    Raises:
        ValueError: the string is malformed (the message quotes it).
    """
    if not isinstance(tasks_per_node, str):
        raise TypeError(
            f"A tasks-per-node list (tasks_per_node) must be a string such as '3(x2),1', got "
            f"{type(tasks_per_node).__name__} {tasks_per_node!r}."
        )
    result: list[int] = []
    for part in tasks_per_node.split(","):
        m = _TASKS.match(part)
        if m is None:
            raise ValueError(
                f'Invalid tasks-per-node list format "{tasks_per_node}": bad part {part!r} '
                "(expected N or N(xM)); tasks_per_node is e.g. '3(x2),1'"
            )
        result.extend([int(m.group(1))] * int(m.group(2) or 1))
    return result
