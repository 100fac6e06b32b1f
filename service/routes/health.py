"""GET /healthz."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(request: Request) -> dict:
    """Liveness: the process answers; says which index version is served."""
    engine = getattr(request.app.state, "engine", None)
    if engine is None:
        return {"status": "ok", "index_version": None, "images": None, "backbone": None}
    snap = engine.snapshot
    return {
        "status": "ok", "index_version": snap.version, "images": len(snap), "backbone": snap.manifest.encoder.backbone,
    }
