"""What counting an answer's size (ENGRAM_MAX_ANSWER_BYTES, app/graphql/field_completion.py)
costs a request: in process, no database, a page of --records record-like objects (the fields
bench/memory_api.py lists: texts, IDs, timestamps, an enum, numbers, booleans, an empty JSON
`metadata`, a third with one label) executed through this checkout's ExecutionContext and, for
comparison, through another checkout's (--baseline, e.g. a `git worktree` of main before the
count), alternated round by round; process CPU per request, median and least of --rounds.
What a refused answer holds in the service (its peak RSS) is `request_limits.py --only answer`'s.

    python bench/answer_bytes.py --baseline /tmp/engram-main
    python bench/answer_bytes.py --baseline /tmp/engram-main --records 10   # a search's page
"""

import argparse
import asyncio
import enum
import importlib.util
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import strawberry  # noqa: E402
from strawberry.schema.config import StrawberryConfig  # noqa: E402

from app.graphql import field_completion  # noqa: E402
from app.graphql.scalars import SCALARS, Timestamp, Value  # noqa: E402


@strawberry.enum
class Kind(enum.Enum):
    FACT = "fact"
    EVENT = "event"


@strawberry.type
class Label:
    number: int
    value: str
    name: str


@strawberry.type
class Record:
    id: strawberry.ID
    memory_id: uuid.UUID
    created: Timestamp
    modified: Timestamp
    version: int
    summary: str
    status: str
    scope: str
    kind: Kind
    source: str
    pinned: bool
    labels: list[Label]
    replaces: uuid.UUID | None
    replaced_by: uuid.UUID | None
    preview: bool
    session_id: str | None
    modified_by: str
    metadata: Value


QUERY = """{ page { id memoryId created modified version summary status scope kind source
  pinned labels { number value name } replaces replacedBy preview sessionId modifiedBy
  metadata } }"""


def schema_of(context_class: type, records: list[Record]) -> strawberry.Schema:
    @strawberry.type
    class Query:
        @strawberry.field
        async def page(self) -> list[Record]:
            return records

    return strawberry.Schema(
        query=Query,
        config=StrawberryConfig(scalar_map=SCALARS),
        execution_context_class=context_class,
    )


def baseline_context(checkout: Path) -> type:
    graphql = checkout / "app" / "graphql"
    # field_completion.py was execution.py in checkouts before December 2026.
    path = next(
        p for p in (graphql / "field_completion.py", graphql / "execution.py") if p.exists()
    )
    spec = importlib.util.spec_from_file_location("baseline_completion", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ExecutionContext


async def run(args: argparse.Namespace) -> None:
    now = datetime.now(UTC)
    records = [
        Record(
            id=f"R{i}",
            memory_id=uuid.uuid4(),
            created=Timestamp(now),
            modified=Timestamp(now),
            version=1,
            summary="the customer asked for the invoice of March again " * 2,
            status="ACTIVE",
            scope="AGENT",
            kind=Kind.FACT,
            source="turn",
            pinned=False,
            labels=[Label(number=5, value="customer-17", name="customer_id")] if i % 3 == 0 else [],
            replaces=None,
            replaced_by=None,
            preview=False,
            session_id="s1",
            modified_by="agent",
            metadata=Value({}),
        )
        for i in range(args.records)
    ]
    schemas = {
        "baseline": schema_of(baseline_context(args.baseline), records),
        "this checkout": schema_of(field_completion.answer_budget(32 * 2**20), records),
    }
    answers = [(await s.execute(QUERY)) for s in schemas.values()]
    assert all(not a.errors for a in answers) and answers[0].data == answers[1].data
    times: dict[str, list[float]] = {name: [] for name in schemas}
    for round_ in range(args.rounds):
        order = list(schemas.items())
        for name, schema in order if round_ % 2 else reversed(order):
            started = time.process_time()
            for _ in range(args.repeat):
                await schema.execute(QUERY)
            times[name].append((time.process_time() - started) / args.repeat * 1000)
    leaves = args.records * 17 + (args.records + 2) // 3 * 3
    print(f"a page of {args.records} records (about {leaves:,} leaves), CPU per request:")
    for name, figures in times.items():
        print(
            f"  {name:<14} median {statistics.median(figures):.3f} ms, "
            f"least {min(figures):.3f} ms ({args.rounds} rounds of {args.repeat})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout to compare")
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=50)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
