"""``Dataset.cache``: the elements of the first complete pass, kept for the passes after it.

In memory (``filename=""``) the elements of a pass are kept only when the pass reaches the
end; a pass that stops early (a ``take``, a ``break``) keeps nothing, so a later pass never
reads part of the data as if it were all of it (TF discards a partial cache in the same way).

With a filename, the first complete pass writes ``<filename>.npcache``: the elements' arrays
one after another (``np.save``, no pickles) after a header holding the element spec, then an
end record with the count. The pass writes to a temporary file in the same directory and
renames it over the name when, and only when, it reaches the end: a pass that stops early, or
a crash, never leaves a file that reads as complete. Every later pass, in this pipeline or in
another built with the same filename, reads the file instead of the input; a file whose spec
differs from the pipeline's is an error naming both. Where auto-sharding gives this worker a
shard of the source, the shard is part of the name (each worker caches its own elements).
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Iterator
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from mpidist.core import durable, nest
from mpidist.data.dataset import Dataset, IterationContext, specs_match
from mpidist.data.ops.registry import register
from mpidist.data.saved_format import spec_from_json, spec_to_json
from mpidist.errors import DataLossError, InvalidArgumentError

if TYPE_CHECKING:
    from mpidist.data.element import Element

__all__ = ["CacheDataset", "CACHE_SUFFIX"]

CACHE_SUFFIX = ".npcache"
_FORMAT = "mpidist-cache-1"


class CacheDataset(Dataset):
    def __init__(self, input_dataset: Dataset, filename: str) -> None:
        super().__init__((input_dataset,))
        self._filename = filename
        self._memory: dict[Hashable, list[Element]] = {}
        self._header = ""
        if filename:
            try:
                spec_json = spec_to_json(input_dataset.element_spec)
            except InvalidArgumentError as e:
                raise InvalidArgumentError(
                    f"cache(filename={filename!r}): the elements cannot be written to a file: "
                    f"{str(e).removeprefix('Dataset.save: ')} Or cache in memory: cache().") from None
            self._header = json.dumps({"format": _FORMAT, "spec": spec_json})

    def _cardinality(self) -> int:
        return self._inputs[0]._cardinality()

    def _iterate(self, ctx: IterationContext) -> Iterator[Element]:
        shard = _shard_key(ctx)
        if not self._filename:
            return self._from_memory(ctx, shard)
        path = self._filename + ("" if shard is None else
                                 f".shard-{shard[1]}-of-{shard[0]}") + CACHE_SUFFIX
        if os.path.exists(path):
            return self._read(path)
        return self._write(ctx, path)

    def _from_memory(self, ctx: IterationContext, key: Hashable) -> Iterator[Element]:
        if key in self._memory:
            yield from self._memory[key]
            return
        elements = []
        for element in self._inputs[0]._iterate(ctx):
            elements.append(element)
            yield element
        self._memory.setdefault(key, elements)  # reached only at the end of the pass

    def _write(self, ctx: IterationContext, path: str) -> Iterator[Element]:
        # mpidist's one commit primitive: published whole at the end of the pass, or not at
        # all (a pass that stops early closes this generator, which discards the file).
        with durable.staged_write(path, f"cache(filename={self._filename!r})") as f:
            np.save(f, np.array(self._header), allow_pickle=False)
            count = 0
            for element in self._inputs[0]._iterate(ctx):
                np.save(f, np.bool_(True), allow_pickle=False)
                for leaf in nest.flatten(element):
                    np.save(f, np.asarray(leaf), allow_pickle=False)
                count += 1
                yield element
            np.save(f, np.bool_(False), allow_pickle=False)
            np.save(f, np.int64(count), allow_pickle=False)

    def _read(self, path: str) -> Iterator[Element]:
        spec = self.element_spec
        leaves = len(nest.flatten(spec))
        with open(path, "rb") as f:
            header = json.loads(str(_load(f, path)))
            if header.get("format") != _FORMAT:
                raise DataLossError(f"cache: {path} is not an mpidist cache file.")
            saved = spec_from_json(header["spec"])
            if not specs_match(saved, spec):
                raise InvalidArgumentError(
                    f"cache: {path} holds elements {saved}, but this pipeline's are {spec}. "
                    "Use another filename for this pipeline, or delete the file.")
            count = 0
            while bool(_load(f, path)):
                flat = [_scalar(_load(f, path)) for _ in range(leaves)]
                count += 1
                yield flat[0] if not nest.is_nested(spec) else nest.pack_sequence_as(spec, flat)
            if int(_load(f, path)) != count:
                raise DataLossError(f"cache: {path} is damaged: its end record does not match "
                                    f"the {count} element(s) read. Delete it to rebuild it.")


def _load(f: IO[bytes], path: str) -> Any:
    try:
        return np.load(f, allow_pickle=False)
    except (ValueError, EOFError, OSError) as e:
        raise DataLossError(f"cache: {path} is damaged ({e}). Delete it to rebuild it.") from None


def _scalar(a: np.ndarray) -> Any:
    return a[()] if a.ndim == 0 else a


def _shard_key(ctx: IterationContext) -> tuple[int, int] | None:
    """The shard of the input this pass reads, where auto-sharding gives it one."""
    if ctx.source_shard is not None:
        return ctx.source_shard
    if ctx.file_shard is not None:
        return ctx.file_shard[0], ctx.file_shard[1]
    if ctx.shard_hint != (1, 0):
        return ctx.shard_hint
    return None


register("cache", CacheDataset)
