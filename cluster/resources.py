"""CPU requests of the Ray deployments, sized from the cluster's resources so that everything is scheduled.

Ray schedules a replica only where its logical CPU request fits. ``regis serve --ray`` deploys an encoder, one
deployment per shard (times its replicas) and the ingress; with fixed requests (1 + 0.5 per shard replica +
0.25) two shards do not fit on 2 CPUs, and the ingress then waits for a CPU forever. So the requests the user has
not set (``REGIS_RAY_ENCODER_NUM_CPUS``, ``..._SHARD_NUM_CPUS``, ``..._INGRESS_NUM_CPUS`` unset) are sized here:
the full shares below (1, 0.5, 0.25 CPU) where they fit, else all scaled down by one factor until every replica
fits the nodes (first-fit-decreasing over each node's CPUs, within the CPUs the cluster has free). The requests
are Ray's bookkeeping, not limits: a replica uses what CPU it finds.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.settings import RaySettings

# A replica's share of a CPU when the cluster has room for every replica at these (the defaults of issue 11).
# The writer (``cluster.writes``, with --enable-jobs) idles between writes: a small share.
FULL_SHARE = {"encoder": 1.0, "shard": 0.5, "ingress": 0.25, "writer": 0.1}
SETTING = {"encoder": "REGIS_RAY_ENCODER_NUM_CPUS", "shard": "REGIS_RAY_SHARD_NUM_CPUS",
           "ingress": "REGIS_RAY_INGRESS_NUM_CPUS", "writer": "REGIS_RAY_WRITER_NUM_CPUS"}
_GRAIN = 0.001  # requests are rounded down to this (Ray's own resource grain is 0.0001)


@dataclass(frozen=True)
class Sizing:
    """CPU per replica of each role ("encoder", "shard", "ingress", "writer"), and whether each was sized here
    (not set by the user); ``fits``: every replica fits the nodes' CPUs."""

    cpus: dict[str, float]
    sized: dict[str, bool]
    fits: bool

    def describe(self) -> str:
        """E.g. "encoder 0.8, shard 0.4 x 4, ingress 0.2 CPU" (one line)."""
        return ", ".join(f"{role} {cpus:g}" for role, cpus in self.cpus.items()) + " CPU per replica"


def fits(requests: list[float], nodes: list[float]) -> bool:
    """Whether every request (CPUs) fits some node's CPUs, placed largest first onto the first node with room
    (first-fit decreasing: a sufficient test, which is what a deployment needs)."""
    free = sorted(nodes, reverse=True)
    for r in sorted(requests, reverse=True):
        for i, f in enumerate(free):
            if r <= f + 1e-9:
                free[i] = f - r
                break
        else:
            return False
    return True


def _replicas(settings: RaySettings, num_shards: int, writer: bool) -> dict[str, int]:
    return {"encoder": 0 if settings.encoder_in_ingress() else settings.encoder_replicas,
            "shard": num_shards * settings.shard_replicas, "ingress": settings.ingress_replicas,
            "writer": int(writer)}


def full_shares(settings: RaySettings) -> dict[str, float]:
    """Each role's CPU share where everything fits (``FULL_SHARE``; the ingress encodes queries too when the
    encoder runs in it: the encoder's share)."""
    return {**FULL_SHARE, **({"ingress": FULL_SHARE["encoder"]} if settings.encoder_in_ingress() else {})}


def size_requests(settings: RaySettings, num_shards: int, nodes: list[float], free: float | None = None,
                  writer: bool = False) -> Sizing:
    """The CPU request of each role's replicas.

    Args:
        settings: the explicit requests (``encoder_num_cpus`` ...; None: sized here) and the replica counts.
        num_shards: the collection's shards (one deployment each).
        nodes: each alive node's CPUs (``ray.nodes()``).
        free: CPUs the cluster has free (``ray.available_resources()``; default: all of ``nodes``).
        writer: the application has a ``Writer`` deployment (one replica).

    Returns:
        The sizing; ``fits`` is False when the explicit requests alone leave no room (the deployment then waits
        for resources: ``cluster.serve.wait_until_running`` names the setting after 60 s).
    """
    counts = _replicas(settings, num_shards, writer)
    explicit = {"encoder": settings.encoder_num_cpus, "shard": settings.shard_num_cpus,
                "ingress": settings.ingress_num_cpus, "writer": settings.writer_num_cpus}
    roles = [role for role in FULL_SHARE if counts[role]]
    shares = full_shares(settings)
    sized = {role: explicit[role] is None for role in roles}
    budget = sum(nodes) if free is None else min(free, sum(nodes))

    def requests(factor: float) -> tuple[dict[str, float], list[float]]:
        cpus = {role: (explicit[role] if not sized[role]
                       else max(int(shares[role] * factor / _GRAIN) * _GRAIN, _GRAIN))
                for role in roles}
        return cpus, [cpus[role] for role in roles for _ in range(counts[role])]

    factor = 1.0
    while True:
        cpus, reqs = requests(factor)
        ok = fits(reqs, nodes) and sum(reqs) <= budget + 1e-9
        if ok or not any(sized.values()) or factor < 1e-3:
            return Sizing({k: round(v, 4) for k, v in cpus.items()}, sized, ok)
        factor *= 0.9


def sized_settings(settings: RaySettings, sizing: Sizing) -> RaySettings:
    """``settings`` with the CPU request of every role the sizing has set (the sizing's)."""
    return settings.model_copy(update={f"{role}_num_cpus": cpus for role, cpus in sizing.cpus.items()})


def cluster_cpus() -> tuple[list[float], float]:
    """(each alive node's CPUs, the CPUs free in the cluster now) of the Ray cluster this process is connected to."""
    import ray

    nodes = [float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]
    return nodes, float(ray.available_resources().get("CPU", 0.0))


def build_cpus(settings: RaySettings, nodes: list[float]) -> tuple[float, float]:
    """(CPUs per encoder actor, CPUs per decode task) of ``regis index build --ray``: the settings' where given,
    else 1 each, or half the biggest node's CPUs each when it has fewer than 2 (the actors hold their CPUs for
    the whole build, and the decode tasks must still find one)."""
    half = max((max(nodes) if nodes else 1.0) / 2, _GRAIN)
    encoder = settings.encoder_num_cpus if settings.encoder_num_cpus is not None else min(1.0, half)
    decode = settings.build_decode_cpus if settings.build_decode_cpus is not None else min(1.0, half)
    return encoder, decode
