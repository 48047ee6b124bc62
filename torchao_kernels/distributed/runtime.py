"""Process setup for tensor parallelism on CPUs: the process group, the mesh,
threads and cores per rank, and a local launcher for tests and examples."""
from __future__ import annotations

import os
import socket
import traceback
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = ["init_tp", "rank_cores", "free_port", "launch", "explain_shards"]


def _env_int(name: str, default: Optional[int]) -> Optional[int]:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an int, got {v!r}") from None


def rank_cores(local_rank: int, local_world_size: int, cores: Optional[Sequence[int]] = None) -> List[int]:
    """This rank's share of `cores` (default: the cores this process may run on),
    in contiguous blocks: on a multi-socket machine whose cores are numbered
    socket by socket, rank r of one rank per socket gets socket r's cores."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank={local_rank} is not in [0, local_world_size={local_world_size})")
    if len(cores) < local_world_size:
        raise ValueError(f"{local_world_size} ranks on this machine but only {len(cores)} cores: {cores}")
    per, extra = divmod(len(cores), local_world_size)
    start = local_rank * per + min(local_rank, extra)
    return cores[start:start + per + (1 if local_rank < extra else 0)]


def init_tp(tp_size: Optional[int] = None, *, threads: Optional[int] = None, pin: bool = False,
            backend: str = "gloo", comm: str = "auto") -> DeviceMesh:
    """Joins (or creates) the default process group from the torchrun-style
    environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK and
    LOCAL_WORLD_SIZE, or else the ranks with this machine's host name) and
    returns a 1-D CPU mesh of tp_size ranks (default: all of them).

    threads: intra-op threads of this rank (torch.set_num_threads); default
      this machine's cores divided by the ranks on it, not torch's default of
      every core (two ranks with every core each would oversubscribe them).
    pin: restrict this rank to its own contiguous block of cores
      (rank_cores), e.g. one socket per rank.
    comm: the quantized styles' collectives: "shm" through shared memory (all
      ranks of the mesh on this machine, x86-64; tens of microseconds instead
      of gloo's hundreds), "gloo" through the process group, "auto" (default)
      shm where possible.
    """
    if comm not in ("auto", "shm", "gloo"):
        raise ValueError(f"comm must be 'auto', 'shm' or 'gloo', got {comm!r}")
    # what can be checked without the process group comes before joining it
    # (an error after joining leaves it joined)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    if tp_size is not None and (isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1):
        raise ValueError(f"tp_size must be a positive int, got {tp_size!r}")
    if not dist.is_initialized():
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise RuntimeError(f"{var} is not set: start the ranks with torchrun, or set RANK, WORLD_SIZE, "
                                   "MASTER_ADDR and MASTER_PORT (docs/distributed.md)")
        dist.init_process_group(backend=backend, rank=_env_int("RANK", 0), world_size=_env_int("WORLD_SIZE", 1))
    world = dist.get_world_size()
    tp = world if tp_size is None else tp_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or world % tp:
        raise ValueError(f"tp_size must be a positive divisor of the world size {world}, got {tp_size!r}")
    local_world = _env_int("LOCAL_WORLD_SIZE", None)
    local_rank = _env_int("LOCAL_RANK", None)
    if local_world is None or local_rank is None:
        # not from torchrun: the ranks on this machine are those with its host name
        hosts = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        mine_host = [r for r, h in enumerate(hosts) if h == hosts[dist.get_rank()]]
        local_world, local_rank = len(mine_host), mine_host.index(dist.get_rank())
    # A core share is needed only to pin or to choose the thread count: with
    # threads given and no pinning, more ranks than cores may share them.
    if pin or threads is None:
        mine = rank_cores(local_rank, local_world)
        if pin:
            os.sched_setaffinity(0, mine)
        if threads is None:
            threads = len(mine)
    torch.set_num_threads(threads)
    if tp == world:
        mesh = init_device_mesh("cpu", (tp,))
    else:
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))["tp"]
    if comm != "gloo" and tp > 1:
        _setup_shm(mesh, required=(comm == "shm"))
    return mesh


def _setup_shm(mesh: DeviceMesh, required: bool) -> None:
    from .shm import ShmComm, shm_supported
    from .styles import register_shm

    group = mesh.get_group()
    hosts = [None] * mesh.size()
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    why = shm_supported()
    if why is None and len(set(hosts)) > 1:
        why = f"the ranks are on several machines ({sorted(set(hosts))})"
    whys = [None] * mesh.size()
    dist.all_gather_object(whys, why, group=group)  # every rank decides the same way
    why = next((w for w in whys if w), None)
    if why:
        if required:
            raise RuntimeError(f"comm='shm' is not possible: {why}")
        return
    register_shm(group, ShmComm(group))


def explain_shards(model: torch.nn.Module, m: int = 1) -> dict:
    """{fqn: (n, k, kernel)} for every QuantizedLinear of this rank's model: the
    kernel selection picks for its shard at m rows with this rank's threads."""
    from ..nn import QuantizedLinear
    from ..selection import explain

    out = {}
    for fqn, mod in model.named_modules():
        if isinstance(mod, QuantizedLinear):
            out[fqn] = (mod.out_features, mod.in_features, explain(mod.packed_weights, m=m).winner)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on host right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable, args: tuple, queue, threads: Optional[int],
            pin: bool, comm: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})
    try:
        mesh = init_tp(threads=threads, pin=pin, comm=comm)
        result = fn(mesh, *args)
        queue.put((rank, "ok", result))
    except BaseException as e:  # report to the parent instead of leaving it waiting
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(fn: Callable[..., Any], world_size: int, *args, threads: Optional[int] = None, pin: bool = False,
           comm: str = "auto", timeout: float = 600.0) -> List[Any]:
    """Runs fn(mesh, *args) in world_size new processes on this machine (gloo
    over 127.0.0.1, a free port) and returns their results, by rank. fn must
    be importable (a module-level function) and its result picklable. An
    error in any rank is raised here with that rank's traceback."""
    import multiprocessing as mp

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue, threads, pin, comm),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict = {}
    errors = []
    try:
        for _ in procs:
            try:
                rank, status, value = queue.get(timeout=timeout)
            except Exception:
                raise TimeoutError(f"no result from the ranks within {timeout} s "
                                   f"(got {sorted(results)}; errors: {errors})") from None
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"rank {rank}: {value}")
                break  # the other ranks may be stuck in a collective with it
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 1)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    if errors:
        raise RuntimeError("a tensor-parallel rank failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]
