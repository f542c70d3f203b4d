"""What reading an action's model key from its file costs each model call.

An action's `model.apiKeyEnv` TEAM_MODEL_KEY may be given as the file TEAM_MODEL_KEY_FILE names
(`app.config.variable_or_file`), read again at every model call (`resolve_endpoint`) so that a
key rotated in its file is sent from the next call on; the file is read in a thread
(`app.runtime.model.KeyFiles`), so that one on a file system that does not answer holds no
request but its own. Times, in microseconds, the best of --repeat rounds of --number calls
each, on one event loop: the key read on the loop itself (`variable_or_file`, as it was read
before), read by `KeyFiles` (a thread's round trip for a file, none for the variable), and
`resolve_endpoint` whole, with the key in the variable and in a file (on tmpfs, where Docker
and Kubernetes mount secrets, when /dev/shm is one, and in the temporary directory); and, for a
cache checked by modification time, `os.stat` of the file on the loop (which would wait for a
hung file system as a read does) and a thread's round trip for nothing (what a stat off the
loop would pay at least).

    python bench/key_file.py [--number 5000] [--repeat 5]
"""

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.actions.model import ModelConfig  # noqa: E402
from app.config import Settings, variable_or_file  # noqa: E402
from app.runtime.model import KeyFiles, resolve_endpoint  # noqa: E402

NAME = "BENCH_MODEL_KEY"
KEY = "sk-" + "x" * 48


async def best_us(call: Callable[[], Awaitable[object]], number: int, repeat: int) -> float:
    rounds = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            await call()
        rounds.append(time.perf_counter() - started)
    return min(rounds) / number * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(("python bench/key_file.py " + shlex.join(sys.argv[1:])).rstrip())

    settings = Settings(model_allowed_key_envs=[NAME])
    config = ModelConfig(api_key_env=NAME)
    account = uuid.uuid4()
    keys = KeyFiles()
    loop = asyncio.get_running_loop()

    async def on_loop() -> object:
        return variable_or_file(NAME)

    async def resolve() -> object:
        return await resolve_endpoint(config, settings, account, keys=keys)

    async def stat(path: str) -> object:
        return os.stat(path)

    async def hop() -> object:
        return await loop.run_in_executor(keys._threads, int)

    async def row(where: str, path: str | None = None) -> None:
        calls = [on_loop, lambda: keys.read(NAME), resolve]
        if path is not None:
            calls += [lambda: stat(path), hop]
        cells = [f"{await best_us(call, args.number, args.repeat):.1f}" for call in calls]
        print(f"| {where} | " + " | ".join(cells + [""] * (5 - len(cells))) + " |")

    print(
        "| key in | read on the loop (us) | `KeyFiles.read` (us) | resolve_endpoint (us) "
        "| os.stat (us) | a thread's round trip (us) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    os.environ[NAME] = KEY
    await row(f"the variable {NAME}")
    del os.environ[NAME]
    places = [Path(tempfile.gettempdir())]
    if Path("/dev/shm").is_dir():
        places.insert(0, Path("/dev/shm"))
    for place in places:
        with tempfile.NamedTemporaryFile("w", dir=place, suffix=".key") as file:
            file.write(KEY + "\n")
            file.flush()
            os.environ[NAME + "_FILE"] = file.name
            await row(f"a file in {place}", file.name)
    del os.environ[NAME + "_FILE"]
    keys.close()


if __name__ == "__main__":
    asyncio.run(main())
