"""Issue 14, item 6: a service call names what it acts on, as
`update_action(pool, admin, action_id=..., harness=...)`: every public function of a domain's
service modules that takes the caller takes all after it by keyword, and one that takes the pool
takes its IDs by keyword (two UUIDs passed in the wrong order would otherwise name another
record, or none). Helpers taking a connection follow the stores' positional style."""

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
SERVICES = sorted(APP.glob("*/service.py")) + [APP / "memory/operator.py", APP / "memory/search.py"]
# A DataLoader's batch function takes its keys positionally (app/graphql/context.py).
BATCH = {"keys"}


def positional_subjects(path: Path) -> list[str]:
    found = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name[0] == "_":
            continue
        names = [a.arg for a in node.args.posonlyargs + node.args.args]
        if "caller" in names:
            after = [n for n in names[names.index("caller") + 1 :] if n not in BATCH]
        elif names and names[0] == "pool":
            after = [n for n in names if n.endswith("_id")]
        else:
            continue
        if after:
            found.append(f"{path.relative_to(APP.parent)}:{node.lineno} {node.name}({after})")
    return found


def test_issue14_item6_service_functions_take_their_subjects_by_keyword() -> None:
    found = [f for path in SERVICES for f in positional_subjects(path)]
    how = "put `*,` before these (keyword-only), and call them with `name=`:\n"
    assert found == [], how + "\n".join(found)
