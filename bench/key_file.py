"""What reading an action's model key from its file costs each model call.

An action's `model.apiKeyEnv` TEAM_MODEL_KEY may be given as the file TEAM_MODEL_KEY_FILE names
(`app.config.variable_or_file`), read again at every model call (`resolve_endpoint`) so that a
key rotated in its file is sent from the next call on. Times, in microseconds, the best of
--repeat rounds of --number calls each: the key read alone and `resolve_endpoint` whole, with
the key in the variable and in a file (on tmpfs, where Docker and Kubernetes mount secrets,
when /dev/shm is one, and in the temporary directory); and `os.stat` of the file, the least a
cache checked by modification time would still pay each call.

    python bench/key_file.py [--number 20000] [--repeat 5]
"""

import argparse
import os
import shlex
import sys
import tempfile
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.actions.model import ModelConfig  # noqa: E402
from app.config import Settings, variable_or_file  # noqa: E402
from app.runtime.model import resolve_endpoint  # noqa: E402

NAME = "BENCH_MODEL_KEY"
KEY = "sk-" + "x" * 48


def best_us(call: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(("python bench/key_file.py " + shlex.join(sys.argv[1:])).rstrip())

    settings = Settings(model_allowed_key_envs=[NAME])
    config = ModelConfig(api_key_env=NAME)
    account = uuid.uuid4()

    def resolve() -> object:
        return resolve_endpoint(config, settings, account)

    def read() -> object:
        return variable_or_file(NAME)

    def row(where: str, stat: str | None = None) -> None:
        figures = [
            best_us(read, args.number, args.repeat),
            best_us(resolve, args.number, args.repeat),
        ]
        cells = [f"{f:.1f}" for f in figures]
        if stat is not None:
            cells.append(f"{best_us(lambda: os.stat(stat), args.number, args.repeat):.1f}")
        print(f"| {where} | " + " | ".join(cells + [""] * (3 - len(cells))) + " |")

    print("| key in | read (us) | resolve_endpoint (us) | os.stat (us) |")
    print("| --- | --- | --- | --- |")
    os.environ[NAME] = KEY
    row(f"the variable {NAME}")
    del os.environ[NAME]
    places = [Path(tempfile.gettempdir())]
    if Path("/dev/shm").is_dir():
        places.insert(0, Path("/dev/shm"))
    for place in places:
        with tempfile.NamedTemporaryFile("w", dir=place, suffix=".key") as file:
            file.write(KEY + "\n")
            file.flush()
            os.environ[NAME + "_FILE"] = file.name
            row(f"a file in {place}", file.name)
    del os.environ[NAME + "_FILE"]


if __name__ == "__main__":
    main()
