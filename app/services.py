"""Starts and stops the providers the layers need (embeddings, model clients)."""

import logging

from app.embeddings.setup import ensure_model, open_embedder
from app.memory.maintenance import SEARCH_MAINTENANCE, SearchMaintenance
from app.memory.vectors import VECTOR_COLUMNS
from app.runtime.liveness import TURN_LIVENESS, TurnLiveness
from app.runtime.model import unset_keys
from app.state import AppState

log = logging.getLogger(__name__)


async def start_services(state: AppState) -> None:
    for unset in await unset_keys(state.settings):
        log.warning(
            "a model key ENGRAM_MODEL_ALLOWED_KEY_ENVS allows cannot be read: %s (the turns of "
            "agents whose model.apiKeyEnv names it fail until it can)",
            unset,
        )
    if state.embedder is None:
        state.embedder = await open_embedder(state.settings)
    await ensure_model(state.pool, state.embedder, VECTOR_COLUMNS)
    maintenance = state.services[SEARCH_MAINTENANCE] = SearchMaintenance(
        state.pool,
        interval=state.settings.search_maintenance_seconds,
        min_records=state.settings.agent_index_min_records,
        build_memory=state.settings.agent_index_build_memory,
        max_agents=state.settings.agent_index_max_agents,
        min_parts=state.settings.history_index_min_parts,
        max_sessions=state.settings.history_index_max_sessions,
    )
    await maintenance.start()
    liveness = state.services[TURN_LIVENESS] = TurnLiveness(state.pool, state.settings)
    await liveness.start()


async def stop_services(state: AppState) -> None:
    for service in [*reversed(state.services.values()), state.embedder]:
        close = getattr(service, "aclose", None)
        if close is not None:
            await close()
