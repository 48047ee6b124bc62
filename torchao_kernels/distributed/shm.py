"""Shared-memory collectives for the ranks of one machine.

A decode step of a tensor-parallel Llama issues two small collectives per
layer (a few KB each), so their latency, not their bytes, sets the speed.
gloo goes through TCP on loopback and wakes the peer through the kernel:
hundreds of microseconds per collective. Ranks on one machine can instead
exchange through one shared-memory file: each rank copies its tensor into
its own slot, publishes a sequence number, and spins on its peers' numbers
(each rank owns its core(s), so the spin costs nobody else); vLLM's CPU
backend does the same for the same reason.

Results are those of gloo for the same ranks: an all-reduce adds the ranks'
tensors in rank order on every rank (the same bits everywhere), an
all-gather concatenates them.

Ordering: a rank writes the data, then its sequence number; a peer reads the
number, then the data. x86's memory model (stores are seen in order, loads
are not reordered with each other) makes that safe without fences, which
Python cannot issue, so this is used on x86-64 only.
"""
from __future__ import annotations

import os
import platform
import time
import uuid
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["ShmComm", "shm_supported"]

_LINE = 64                 # one control word per cache line: no false sharing between ranks
_DEFAULT_SLOT = 1 << 22    # bytes per rank and buffer: 4 MB (a prefill's 128 x 576 floats is 295 KB)
_SPIN_S = 0.005            # pure spinning before yielding the core


def shm_supported() -> Optional[str]:
    """None if shared-memory collectives can run here, else why not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"shared-memory collectives rely on x86 memory ordering; this is {platform.machine()}"
    if not os.path.isdir("/dev/shm"):
        return "no /dev/shm"
    return None


class ShmComm:
    """All-reduce (sum) and all-gather among the ranks of `group`, all on this
    machine, through a shared file in /dev/shm. Collective: every rank of the
    group must create it, in the same order as other collectives."""

    def __init__(self, group, slot_bytes: int = _DEFAULT_SLOT, timeout: float = 300.0):
        why = shm_supported()
        if why:
            raise RuntimeError(why)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.slot = int(slot_bytes)
        self.timeout = timeout
        names = [f"/dev/shm/torchao_kernels_tp_{uuid.uuid4().hex}" if self.rank == 0 else None]
        dist.broadcast_object_list(names, src=dist.get_global_rank(group, 0), group=group)
        self.path = names[0]
        # control: per rank, [written seq, read seq], each on its own line
        self.ctrl_bytes = 2 * self.world * _LINE
        total = self.ctrl_bytes + 2 * self.world * self.slot   # two buffers: the next op can start writing
        if self.rank == 0:
            with open(self.path, "wb") as f:
                f.truncate(total)
        dist.barrier(group=group)
        self.mem = torch.from_file(self.path, shared=True, size=total, dtype=torch.uint8)
        self.ctrl = self.mem[: self.ctrl_bytes].numpy().view(np.int64)
        self.stride = _LINE // 8
        dist.barrier(group=group)
        if self.rank == 0:
            os.unlink(self.path)  # the mappings stay; nothing is left behind in /dev/shm
        self.seq = 0

    # control words
    def _w(self, r: int) -> int:
        return (2 * r) * self.stride

    def _r(self, r: int) -> int:
        return (2 * r + 1) * self.stride

    def _wait(self, idx: int, value: int, what: str) -> None:
        ctrl = self.ctrl
        if ctrl[idx] >= value:
            return
        spins = 0
        t0 = time.perf_counter()
        while ctrl[idx] < value:
            spins += 1
            if spins & 1023 == 0:
                waited = time.perf_counter() - t0
                # Spin, don't yield, for the first milliseconds: a peer is
                # normally microseconds away, and a yield on a core shared with
                # another process hands it a whole time slice (milliseconds),
                # which every other rank then waits for too. After that, let
                # the other process run, and give up on a peer that died.
                if waited > _SPIN_S:
                    os.sched_yield()
                    if waited > self.timeout:
                        raise RuntimeError(f"rank {self.rank}: no {what} from a peer within {self.timeout} s")

    def _slot(self, buf: int, r: int) -> torch.Tensor:
        off = self.ctrl_bytes + (buf * self.world + r) * self.slot
        return self.mem[off: off + self.slot]

    def _exchange(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Every rank's flat chunk x (same size and dtype on every rank, at most
        one slot) as views of shared memory, valid until _done()."""
        nbytes = x.numel() * x.element_size()
        self.seq += 1
        s, buf = self.seq, self.seq % 2
        # the buffer was last used by exchange s - 2: every rank must have read it
        for r in range(self.world):
            self._wait(self._r(r), s - 2, "read acknowledgement")
        self._slot(buf, self.rank)[:nbytes].view(x.dtype).copy_(x)
        self.ctrl[self._w(self.rank)] = s
        out = []
        for r in range(self.world):
            self._wait(self._w(r), s, "data")
            out.append(self._slot(buf, r)[:nbytes].view(x.dtype))
        return out

    def _done(self) -> None:
        self.ctrl[self._r(self.rank)] = self.seq

    def _spans(self, t: torch.Tensor):
        """(start, end) element ranges of at most one slot each: larger tensors
        (a prefill's logits) go through in several exchanges."""
        step = max(1, self.slot // t.element_size())
        n = t.numel()
        return [(a, min(n, a + step)) for a in range(0, n, step)] or [(0, 0)]

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """t <- sum of every rank's t, in rank order (in place; returns t)."""
        flat = t.contiguous().view(-1)
        for a, b in self._spans(flat):
            parts = self._exchange(flat[a:b])
            acc = parts[0].clone()
            for p in parts[1:]:
                acc.add_(p)
            self._done()
            flat[a:b].copy_(acc)
        if flat.data_ptr() != t.data_ptr():
            t.copy_(flat.view(t.shape))
        return t

    def all_gather(self, t: torch.Tensor) -> List[torch.Tensor]:
        """Copies of every rank's t (all the same shape)."""
        flat = t.contiguous().view(-1)
        outs = [torch.empty_like(flat) for _ in range(self.world)]
        for a, b in self._spans(flat):
            for o, p in zip(outs, self._exchange(flat[a:b])):
                o[a:b].copy_(p)
            self._done()
        return [o.view(t.shape) for o in outs]

    def all_gather_cat(self, t: torch.Tensor, sizes: Sequence[int], dim: int) -> torch.Tensor:
        """Every rank's t concatenated along dim; rank r's has sizes[r] there
        (uneven: padded to the largest for the exchange)."""
        width = max(sizes)
        x = t
        if x.shape[dim] != width:
            pad = list(x.shape)
            pad[dim] = width - x.shape[dim]
            x = torch.cat([x, x.new_zeros(pad)], dim)
        parts = self.all_gather(x)
        return torch.cat([p.narrow(dim, 0, s) for p, s in zip(parts, sizes)], dim)
