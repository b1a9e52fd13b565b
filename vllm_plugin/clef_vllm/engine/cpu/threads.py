"""Which CPUs each rank of an engine runs its threads on, when a CPU engine has several (`--tp`, `--dp`).

vLLM binds every rank's OpenMP threads itself (`VLLM_CPU_OMP_THREADS_BIND=auto`,
vllm/utils/ompmultiprocessing.py): one NUMA node per rank. With fewer NUMA nodes than tensor parallel ranks it
stops at start ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"), and data parallel engines
on one node all bind to the same cores, so a second engine adds no compute. On a machine of one NUMA node the
physical cores are split evenly between the ranks here instead, one logical CPU per core as vLLM's own binding
picks on x86; when there are more cores than ranks, one is left to the server and the engine cores (vLLM keeps
cores for them too). Fewer cores than ranks is refused (the ranks would share cores and slow each other down),
and so is a machine of several NUMA nodes but fewer than ranks, where the split is the user's to choose. A
binding the user set (`VLLM_CPU_OMP_THREADS_BIND`) is kept, checked for one CPU list per rank, each one vLLM
can parse, naming CPUs this process may use (vLLM reads it only in the engine's workers, after the server listens).

A data parallel engine may get fewer threads than a lone engine. A long prompt's bits follow the thread count: a
3,442-token prompt of the tiny checkpoint moved by up to 5e-3 between 1 and 2 threads, while 12 of the 14 eval
fixture records of `build-data --per-task 2` (the two longest moved) kept theirs. So an engine whose worker runs in
the calling process borrows the count its worker would get in a process of its own (`match_lone_engine_threads`),
and answers as a server does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from clef_vllm.errors import SettingsError

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
_VLLM_AUTO = "auto"
_NO_BINDING = "nobind"
_ID_OR_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", re.ASCII)


class LogicalCpu(NamedTuple):
    id: int
    core: int  # the physical core it belongs to
    node: int  # its NUMA node


def parallel_ranks(engine_args: Mapping[str, Any]) -> int:
    """How many model ranks the engine arguments ask for: tensor x pipeline parallel, per data parallel engine."""
    return (
        int(engine_args.get("tensor_parallel_size") or 1)
        * int(engine_args.get("pipeline_parallel_size") or 1)
        * int(engine_args.get("data_parallel_size") or 1)
    )


def omp_binding(ranks: int, cpus: Sequence[LogicalCpu], nodes: Sequence[int], current: str | None) -> str | None:
    """The `VLLM_CPU_OMP_THREADS_BIND` value to set for `ranks` ranks on these allowed CPUs and NUMA nodes, or
    None to leave it as it is (one rank, a binding of the user's, or a NUMA node per rank for vLLM's own)."""
    if ranks <= 1 or current == _NO_BINDING:
        return None
    if current and current != _VLLM_AUTO:
        lists = current.split("|")
        if len(lists) != ranks:
            raise SettingsError(
                f"{BIND_ENV}={current!r} gives {len(lists)} CPU list(s) and {_ranks_text(ranks)} need one each, "
                "separated by '|'"
            )
        allowed = {cpu.id for cpu in cpus}
        for text in lists:
            _check_cpu_list(current, text, allowed)
        return None
    if len(nodes) >= ranks:
        return None
    if len(nodes) > 1:  # a split of ours could leave a rank's threads on two nodes, far from its memory
        raise SettingsError(
            f"{_ranks_text(ranks)} need a NUMA node each for vLLM's CPU thread binding and this machine allows "
            f"{len(nodes)}: set {BIND_ENV} to one CPU list per rank, separated by '|'"
        )
    one_per_core: dict[int, LogicalCpu] = {}
    for cpu in sorted(cpus, key=lambda cpu: (cpu.node, cpu.core, cpu.id)):
        one_per_core[cpu.core] = cpu  # the last sibling of each core, as vLLM picks on x86
    cores = sorted(one_per_core.values(), key=lambda cpu: (cpu.node, cpu.id))
    if len(cores) < ranks:
        raise SettingsError(
            f"{_ranks_text(ranks)} need a CPU core each and this machine allows {len(cores)}: vLLM's CPU backend "
            f"runs every rank's threads on cores of its own (or set {BIND_ENV})"
        )
    per_rank = (len(cores) - (1 if len(cores) > ranks else 0)) // ranks
    groups = [cores[rank * per_rank : (rank + 1) * per_rank] for rank in range(ranks)]
    return "|".join(",".join(str(cpu.id) for cpu in group) for group in groups)


def cpu_list_ids(text: str) -> list[int] | None:
    """The CPU ids of one rank's list as vLLM reads it (`0-3,8`: ids and inclusive ranges), or None where vLLM's
    parser would fail (vllm/utils/cpu_resource_utils.py `parse_id_list`, called in the engine's own process)."""
    ids: list[int] = []
    for part in text.split(","):
        found = _ID_OR_RANGE.fullmatch(part)
        if found is None:
            return None
        first, last = found.group(1), found.group(2) or found.group(1)
        ids.extend(range(int(first), int(last) + 1))
    return ids


def _check_cpu_list(binding: str, text: str, allowed: set[int]) -> None:
    """Refuse a rank's list that vLLM could not parse, that names no CPU, or that names CPUs this process may not
    use: the engine would stop in its worker only after the server started listening."""
    ids = cpu_list_ids(text)
    where = f"{BIND_ENV}={binding!r}: {text!r}"
    if ids is None:
        raise SettingsError(f"{where} is not a CPU list (ids and ranges such as 0-3,8; one list per rank, '|' between)")
    if not ids:
        raise SettingsError(f"{where} names no CPU (a range such as 3-1 is empty)")
    foreign = sorted(set(ids) - allowed) if allowed else []
    if foreign:
        raise SettingsError(
            f"{where} names CPU {', '.join(map(str, foreign[:4]))}, which this process may not use (it may use "
            f"{len(allowed)}: {_id_ranges(sorted(allowed))})"
        )


def _id_ranges(ids: list[int]) -> str:
    """`0-3,8` for [0, 1, 2, 3, 8]."""
    runs: list[list[int]] = []
    for cpu in ids:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _ranks_text(ranks: int) -> str:
    return f"{ranks} engine ranks (tensor x data parallel size)"


def machine_binding(ranks: int) -> str | None:
    """`omp_binding` for this machine and process: the CPUs and NUMA nodes it may use, as vLLM reads them."""
    if ranks <= 1:
        return None
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_visible_memory_node

    cpus = [LogicalCpu(cpu.id, cpu.physical_core, cpu.numa_node) for cpu in get_allowed_cpu_list()]
    return omp_binding(ranks, cpus, get_visible_memory_node(), os.environ.get(BIND_ENV))


def bind_rank_threads(ranks: int) -> None:
    """Set the binding `machine_binding` chooses for the engine about to start (its processes inherit it)."""
    binding = machine_binding(ranks)
    if binding is not None:
        os.environ[BIND_ENV] = binding


# The process's own thread count while in-process engines borrow another one (empty when none does).
_THREADS_BEFORE: list[int] = []


def lone_engine_threads() -> int | None:
    """The threads vLLM's worker computes with in a one-rank CPU engine whose core has a process of its own (how
    vLLM starts one unless told otherwise), as its automatic binding picks them (vllm/utils/ompmultiprocessing.py):
    the first allowed NUMA node's cores (one logical CPU per core on x86), less one kept for the engine core when
    there are several. A user's CPU list gives its length; `nobind` gives None (OpenMP's own count)."""
    current = os.environ.get(BIND_ENV, _VLLM_AUTO)
    if current == _NO_BINDING:
        return None
    if current != _VLLM_AUTO:
        ids = cpu_list_ids(current.split("|")[0])
        return len(ids) if ids else None
    from vllm.platforms import CpuArchEnum, current_platform
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_visible_memory_node

    node = get_visible_memory_node()[0]
    cpus = [cpu for cpu in get_allowed_cpu_list() if cpu.numa_node == node]
    smt_siblings_share = current_platform.get_cpu_architecture() in (CpuArchEnum.X86, CpuArchEnum.S390X)
    count = len({cpu.physical_core for cpu in cpus}) if smt_siblings_share else len(cpus)
    return count - 1 if count > 1 else count


def match_lone_engine_threads() -> None:
    """Give an engine whose core and worker run in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) the threads
    its worker gets in a process of its own. A long prompt's bits depend on the thread count on a CPU: a 3,442-token
    prompt of the tiny model moved by up to 5e-3 between 2 threads (an in-process engine's default on two cores) and
    the 1 thread a server's worker gets there, and matched to the last bit with 1."""
    import torch

    threads = lone_engine_threads()
    if threads is None or torch.get_num_threads() == threads:
        return
    if not _THREADS_BEFORE:
        _THREADS_BEFORE.append(torch.get_num_threads())
    torch._C.set_num_threads(threads)  # vLLM's in-process worker turns torch.set_num_threads into a no-op


def restore_process_threads() -> None:
    """Give the process back the thread count it had before its in-process engines (the last one has closed), so
    what runs after them (a transformers reference) computes as it would have without them."""
    import torch

    if _THREADS_BEFORE:
        torch._C.set_num_threads(_THREADS_BEFORE.pop())
