"""The competing designs, one module each; every class follows `harness.Design`."""

from hongbao_bench.designs.base import DEFAULT_REDIS_URL, DesignBase
from hongbao_bench.designs.optimistic import OptimisticDesign
from hongbao_bench.designs.pessimistic import PessimisticDesign
from hongbao_bench.designs.prealloc_optimistic import PreallocOptimisticDesign
from hongbao_bench.designs.redis_list import RedisListDesign
from hongbao_bench.designs.redis_lock import RedisLockDesign
from hongbao_bench.designs.redis_queue_async import RedisQueueAsyncDesign

#: name -> class (for ``supported_backends``; build instances with `make_design`)
DESIGNS: dict[str, type[DesignBase]] = {
    "redis_lock": RedisLockDesign,
    "optimistic": OptimisticDesign,
    "pessimistic": PessimisticDesign,
    "prealloc_optimistic": PreallocOptimisticDesign,
    "redis_list": RedisListDesign,
    "redis_queue_async": RedisQueueAsyncDesign,
}


def make_design(
    name: str, database_url: str | None = None, redis_url: str = DEFAULT_REDIS_URL
) -> DesignBase:
    """Build a design by name with default options. Check
    ``DESIGNS[name].supported_backends`` first when filling a benchmark matrix."""
    if name == "redis_list":
        return RedisListDesign(redis_url)
    if name not in DESIGNS:
        raise ValueError(f"unknown design {name!r}; one of {sorted(DESIGNS)}")
    if database_url is None:
        raise ValueError(f"{name} needs a database URL")
    if name == "redis_lock":
        return RedisLockDesign(database_url, redis_url)
    if name == "redis_queue_async":
        return RedisQueueAsyncDesign(database_url, redis_url)
    if name == "optimistic":
        return OptimisticDesign(database_url)
    if name == "pessimistic":
        return PessimisticDesign(database_url)
    return PreallocOptimisticDesign(database_url)


__all__ = [
    "DESIGNS",
    "OptimisticDesign",
    "PessimisticDesign",
    "PreallocOptimisticDesign",
    "RedisListDesign",
    "RedisLockDesign",
    "RedisQueueAsyncDesign",
    "make_design",
]
