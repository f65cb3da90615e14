"""Where the calibration activations live: in memory, or in files on disk.

The pipeline keeps one [tokens, width] tensor per sample at every stage of a layer (its inputs, the
attention output, the MLP's wide gated activations, the layer's outputs). For a large model, or many long
samples, those outgrow RAM long before one layer's weights do: Llama-3-8B at 128 x 2048 tokens holds
15 GB of gated activations in float32. `OnDisk` writes each sequence to a file as it is made and reads a
sample back only when it is indexed, so the resident part is the samples in use; the OS page cache
keeps the files while RAM allows and drops them first when it does not.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import torch

from quantkit.errors import QuantkitError
from quantkit.memory import available_memory


class ActivationStore(Protocol):
    offloaded: bool

    def keep(self, tensors: Iterable[torch.Tensor]) -> Sequence[torch.Tensor]:
        """Consume the tensors one at a time and return them as an indexable sequence."""


# What Slabs packs tensors into: above glibc's largest adaptive mmap threshold (32 MiB on 64-bit), so
# every slab is a mapping of its own that goes back to the OS whole when it is dropped.
SLAB_BYTES = 64 * 2**20
ALIGN_BYTES = 64  # what torch's CPU allocator aligns tensors to: the same BLAS code paths, the same results


class SlabPool:
    """Slabs of SLAB_BYTES whose views are all gone, handed out again instead of mapping fresh memory.

    A fresh mapping costs a page fault per 4 KiB page when it is first written: copying a stage's
    samples into fresh slabs ran at a third of the speed of copying into slabs already touched (1 thread,
    64 MiB slabs, 33-43 ms against 11-17 ms), and GPTQ at 128 x 512 tokens writes ~40 GB of slabs.
    The pool holds at most as many slabs as were ever in use at once; ``clear`` gives them back."""

    def __init__(self):
        self._slabs: list[tuple[torch.Tensor, int]] = []  # (slab, its storage's use count with no views)

    def take(self) -> torch.Tensor:
        """A slab of SLAB_BYTES bytes that no tensor views (the caller must view it before the next take)."""
        for slab, unused in self._slabs:
            if unused >= 0 and _storage_use_count(slab) == unused:
                return slab
        slab = torch.empty(SLAB_BYTES, dtype=torch.uint8)
        self._slabs.append((slab, _storage_use_count(slab)))
        return slab

    def clear(self) -> None:
        self._slabs.clear()


def _storage_use_count(tensor: torch.Tensor) -> int:
    """How many tensors (views included) share this tensor's memory; -1 where torch does not say (a private
    function of torch's: without it no slab is reused)."""
    counter = getattr(torch._C, "_storage_Use_Count", None)
    return -1 if counter is None else counter(tensor.untyped_storage()._cdata)


SLAB_POOL = SlabPool()


class Slabs:
    """Copies of tensors packed into slabs of SLAB_BYTES (from SLAB_POOL), as views aligned to ALIGN_BYTES.

    For tensors of a few MB that live long among freed temporaries (a stage's samples): one of its own would
    come from glibc's heap once its mmap threshold has adapted, and the heap fragments and grows layer by
    layer (GPTQ on a random Llama at 128 x 512 tokens peaked at 2.4 / 2.8 / 3.2 GB for 2 / 4 / 8 layers).
    A slab is a mapping of its own, reused once no view of it is left (see SlabPool)."""

    def __init__(self, pool: SlabPool | None = None):
        self._pool = pool or SLAB_POOL
        self._slab: torch.Tensor | None = None  # a view of the slab being filled, in the tensors' dtype
        self._used = 0

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        size, step = tensor.numel(), ALIGN_BYTES // tensor.element_size()
        if self._slab is None or self._slab.dtype != tensor.dtype or self._used + size > self._slab.numel():
            self._slab, self._used = self._new_slab(size, tensor.dtype), 0
        view = self._slab[self._used:self._used + size].view(tensor.shape).copy_(tensor)
        self._used += -(-size // step) * step
        return view

    def _new_slab(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        if size * dtype.itemsize > SLAB_BYTES:  # a tensor larger than a slab gets a mapping of its own
            return torch.empty(size, dtype=dtype)
        return self._pool.take().view(dtype)


class InMemory:
    """Each kept sequence lives in slabs of its own (see Slabs), its samples as views into them."""
    offloaded = False

    def keep(self, tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        slabs = Slabs()
        return [slabs.copy(tensor) for tensor in tensors]


class OnDisk:
    """Each kept sequence becomes one file in ``directory``, deleted when the sequence is dropped."""
    offloaded = True

    def __init__(self, directory: Path):
        self.directory = directory
        self._files = 0

    def keep(self, tensors: Iterable[torch.Tensor]) -> FileTensors:
        self._files += 1
        return FileTensors.write(self.directory / f"activations-{self._files:06d}.bin", tensors)


class FileTensors(Sequence[torch.Tensor]):
    """Tensors stored back to back in one file; indexing reads one of them back into a fresh tensor."""

    def __init__(self, path: Path, entries: list[tuple[int, tuple[int, ...], torch.dtype]]):
        self.path, self._entries = path, entries  # (byte offset, shape, dtype) per tensor
        weakref.finalize(self, path.unlink, missing_ok=True)

    @classmethod
    def write(cls, path: Path, tensors: Iterable[torch.Tensor]) -> FileTensors:
        entries = []
        with open(path, "wb") as file:
            for tensor in tensors:
                tensor = tensor.detach().contiguous()
                entries.append((file.tell(), tuple(tensor.shape), tensor.dtype))
                file.write(_bytes_of(tensor))
        return cls(path, entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        offset, shape, dtype = self._entries[index]
        tensor = torch.empty(shape, dtype=dtype)
        with open(self.path, "rb") as file:
            file.seek(offset)
            read = file.readinto(_bytes_of(tensor))
        if read != math.prod(shape) * dtype.itemsize:
            raise QuantkitError(f"offloaded activations in {self.path} were cut short (read {read} bytes)")
        return tensor

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self[i] for i in range(len(self)))


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The tensor's memory as writable bytes (any dtype, bfloat16 included: numpy has no bfloat16)."""
    return memoryview(tensor.view(-1).view(torch.uint8).numpy())


def check_offload_dir(offload_dir: Path | None) -> None:
    """Refuse a folder that cannot take the files, before any work."""
    if offload_dir is None:
        return
    if not offload_dir.is_dir():
        raise QuantkitError(f"--offload-activations: {offload_dir} is not a directory")
    if not os.access(offload_dir, os.W_OK | os.X_OK):
        raise QuantkitError(f"--offload-activations: {offload_dir} is not writable")


@contextmanager
def activation_store(offload_dir: Path | None) -> Iterator[ActivationStore]:
    """In memory, or with ``offload_dir`` in a fresh folder inside it that is removed afterwards, whatever happens."""
    if offload_dir is None:
        try:
            yield InMemory()
        finally:
            SLAB_POOL.clear()
        return
    check_offload_dir(offload_dir)
    directory = Path(tempfile.mkdtemp(prefix="quantkit-activations-", dir=offload_dir))
    try:
        yield OnDisk(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def activation_bytes(hidden_size: int, intermediate_size: int, tokens: int, reference_tokens: int = 0) -> int:
    """About the most a layer's stages hold at once, in float32: the layer's inputs, the stream after
    attention, the layer's outputs being made (each hidden wide) and the MLP's gated activations, for
    the calibration tokens and for those of a full-precision stream beside them (GPTQ fp_targets)."""
    return (3 * hidden_size + intermediate_size) * (tokens + reference_tokens) * 4


def warn_if_activations_outgrow_memory(needed: int, offloaded: bool) -> None:
    """Say so before the work starts, rather than after an out-of-memory kill an hour in."""
    available = available_memory()
    if offloaded or available is None or needed <= 0.8 * available:
        return
    warnings.warn(f"the calibration activations need about {needed / 2**30:.1f} GiB at their peak and "
                  f"{available / 2**30:.1f} GiB of memory is available; pass --offload-activations DIR "
                  "to keep them on disk, or fewer/shorter samples")

