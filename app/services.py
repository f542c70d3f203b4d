"""Starts and stops the providers the layers need (embeddings, model clients)."""

from app.embeddings.setup import ensure_model, open_embedder
from app.state import AppState


async def start_services(state: AppState) -> None:
    if state.embedder is None:
        state.embedder = await open_embedder(state.settings)
    await ensure_model(state.pool, state.embedder)


async def stop_services(state: AppState) -> None:
    for service in [*reversed(list(state.services.values())), state.embedder]:
        close = getattr(service, "aclose", None)
        if close is not None:
            await close()
