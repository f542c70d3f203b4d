"""A scripted OpenAI-compatible server on loopback: real HTTP, deterministic answers.

    with OpenAIServer() as server:
        server.fail_next(2, status=500)          # the next two calls answer 500
        ... OpenAIEmbedder(url=server.url, model=server.embedding_model) ...
        assert len(server.requests_to("/v1/embeddings")) == 3

Every request is recorded (method, path, headers, JSON body) before any scripted fault, so
tests can assert batching, retries and headers. Each route is a method named in `_routes`;
add more there (e.g. `/v1/chat/completions`), with their own scripting state.
"""

import asyncio
import hashlib
import json
import re
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def loopback_socket() -> socket.socket:
    """A TCP socket bound to a free loopback port, for uvicorn to serve on (`sockets=`).

    Made with its protocol named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on a
    connection whose socket says IPPROTO_TCP, and an accepted one takes its listener's, so a
    server on `socket.socket(AF_INET, SOCK_STREAM)` (protocol 0) kept Nagle on. uvicorn writes
    an answer's head and body apart, and the body then waited for the client's delayed ACK:
    44 ms on every request but a connection's first (a server uvicorn binds itself, as
    `engram serve` does, never had it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    return sock


_WORD = re.compile(r"\w+")


def hashed_embedding(text: str, dimensions: int) -> np.ndarray:
    """The test model: a hashed bag of words, deliberately not of unit length."""
    vector = np.zeros(dimensions, dtype=np.float32)
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        vector[int.from_bytes(digest[:4], "little") % dimensions] += 3.0 if digest[4] & 1 else -3.0
    if not vector.any():
        vector[0] = 1.0
    return vector


def word_count(text: str) -> int:
    """The test model's token count."""
    return len(_WORD.findall(text))


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Fault:
    """One scripted misbehaviour: wait `delay` seconds, then answer `status` (None: normally)."""

    status: int | None
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "scripted failure"
    # The message ends with the request's input, as a server that refuses a request quotes it.
    quoting: bool = False
    trickle: float = 0.0  # answer normally, but in pieces this many seconds apart (`trickled`)
    # Edits the answer (an embeddings answer, as a dict) before it is sent as JSON (`edit_next`).
    edit: Callable[[dict[str, Any]], Any] | None = None


CHAT = "/v1/chat/completions"
PURPOSE_HEADER = "x-engram-purpose"


def request_purpose(request: Recorded) -> str | None:
    return request.headers.get(PURPOSE_HEADER)


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped, so a scripted reply may hold a lone surrogate (\\ud800) as
    a model server can send it."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


@dataclass
class ChatReply:
    """One scripted assistant answer: text, tool calls (name and arguments: an object, or raw
    text to play a model that sends malformed JSON), or both, or an HTTP error.

    `when`: only for a request whose body contains this text (concurrent conversations each
    take their own answers). `after_requests`: answer once the server has received that many
    chat requests (to line up concurrent turns), then wait `delay` seconds. `purpose`: only
    for a request of that purpose (header X-Engram-Purpose: turn, memory, ...); None: any.
    `extra`: fields set in the answer's message as they are, to play a server that sends what
    it should not (a NaN, `tool_calls: 7`)."""

    content: str | None = None
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)
    delay: float = 0.0
    status: int | None = None  # answer this HTTP error instead
    when: str | None = None
    after_requests: int = 0
    purpose: str | None = "turn"
    error: str = "scripted failure"  # the message of an HTTP error's body
    extra: dict[str, Any] = field(default_factory=dict)
    # The whole body instead of a completion (to play a server that answers in another shape):
    # bytes as they are, anything else as JSON; answered with `status` when given (else 200)
    # and `headers`.
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    trickle: float = 0.0  # send the answer in pieces this many seconds apart (`trickled`)
    # Called (in the server's thread) once the request is in, before it is answered: to change
    # what the service reads between this call and its next (a key file rotated) at a point
    # no timing can miss.
    then: Callable[[], Any] | None = None


def trickled(raw: bytes, seconds: float, pieces: int = 10) -> Response:
    """`raw` sent in `pieces` parts, `seconds` apart: a server that keeps every read within a
    client's read timeout, but not the whole answer."""

    async def parts() -> Any:
        size = -(-len(raw) // pieces)
        for start in range(0, len(raw), size):
            await asyncio.sleep(seconds)
            yield raw[start : start + size]

    return StreamingResponse(parts(), media_type="application/json")


class OpenAIServer:
    def __init__(
        self,
        *,
        embedding_model: str = "test-embed",
        embedding_dimensions: int = 48,
        usage: str = "total_tokens",
        reverse_order: bool = True,
    ) -> None:
        self.embedding_model = embedding_model
        self.embedding_dimensions = embedding_dimensions
        # Which usage field embeddings report: total_tokens, prompt_tokens, or none (no usage).
        self.usage = usage
        self.reverse_order = reverse_order  # answer in reverse so clients must order by index
        self.requests: list[Recorded] = []
        self._faults: dict[str, deque[Fault]] = defaultdict(deque)
        self._chat_script: deque[ChatReply] = deque()
        self.chat_default = "done"  # the answer when nothing is scripted
        # The answer by purpose when nothing is scripted for it (else chat_default).
        self.chat_defaults: dict[str, ChatReply] = {}
        self.abandoned = 0  # delayed chat replies whose client went away while they waited
        # Scripted replies answered without the `after_requests` they waited for (a test's
        # count that was never reached: it lined nothing up, and cost 30 s).
        self.unmet: list[str] = []
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def _routes(self) -> list[Route]:
        return [
            Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            Route(CHAT, self._chat, methods=["POST"]),
        ]

    # Scripting

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def fail_next(
        self,
        times: int,
        *,
        status: int = 500,
        path: str = "/v1/embeddings",
        retry_after: float | None = None,
        message: str = "scripted failure",
        quoting: bool = False,
    ) -> None:
        """The next calls answer `status`, their error saying `message` (`quoting`: then the
        request's input, as a server quotes the request it refused)."""
        headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
        with self._lock:
            self._faults[path].extend(
                Fault(status, 0.0, headers, message, quoting) for _ in range(times)
            )

    def stall_next(self, times: int, seconds: float, *, path: str = "/v1/embeddings") -> None:
        """The next calls answer normally, but only after `seconds` (to trip client timeouts)."""
        with self._lock:
            self._faults[path].extend(Fault(None, seconds) for _ in range(times))

    def trickle_next(self, times: int, seconds: float, *, path: str = "/v1/embeddings") -> None:
        """The next calls answer normally, but trickled: in pieces `seconds` apart."""
        with self._lock:
            self._faults[path].extend(Fault(None, trickle=seconds) for _ in range(times))

    def garble_next(self, times: int, *, path: str = "/v1/embeddings") -> None:
        """The next calls answer normally, but under `Content-Encoding: gzip`, which the body
        (plain JSON) is not: what a broken proxy sends."""
        with self._lock:
            self._faults[path].extend(
                Fault(None, headers={"content-encoding": "gzip"}) for _ in range(times)
            )

    def edit_next(self, times: int, edit: Callable[[dict[str, Any]], Any]) -> None:
        """The next embeddings answers are made as usual, then changed by `edit` (it changes
        the dict in place, or returns what to send instead): NaN, wrong dimensions and the
        like, as json.dumps writes them."""
        with self._lock:
            self._faults["/v1/embeddings"].extend(Fault(None, edit=edit) for _ in range(times))

    def requests_to(self, path: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    # Plumbing shared by every route

    async def _wait(self, request: Request, seconds: float, *, counted: bool = True) -> None:
        """Waits `seconds`, or until the client has gone (a turn cut at its deadline, counted
        in `abandoned` when `counted`), so that a reply nobody waits for does not hold the
        server's shutdown."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if await request.is_disconnected():
                if counted:
                    with self._lock:
                        self.abandoned += 1
                return
            await asyncio.sleep(min(left, 0.05))

    async def _begin(self, request: Request) -> tuple[Any, Response | None]:
        """Records the request and plays the next scripted fault for its path, if any (a
        trickle is left to the route: `request.state.trickle`)."""
        request.state.trickle = 0.0
        request.state.edit = None
        request.state.headers = {}
        body = await request.json()
        with self._lock:
            self.requests.append(
                Recorded(request.method, request.url.path, dict(request.headers), body)
            )
            fault = (
                self._faults[request.url.path].popleft() if self._faults[request.url.path] else None
            )
        if fault is None:
            return body, None
        request.state.trickle = fault.trickle
        request.state.edit = fault.edit
        request.state.headers = fault.headers if fault.status is None else {}
        if fault.delay:
            # A stall (stall_next) ends early once its client has gone: cut by a timeout or a
            # deadline, it held the server's stop (the test's teardown) for the rest.
            await self._wait(request, fault.delay, counted=False)
        if fault.status is None:
            return body, None
        message = fault.message
        if fault.quoting:
            message += f": input={json.dumps(body.get('input'), ensure_ascii=False)}"
        error = {"error": {"message": message, "type": "scripted", "code": fault.status}}
        return body, JSONResponse(error, status_code=fault.status, headers=fault.headers)

    # Routes

    async def _embeddings(self, request: Request) -> Response:
        body, failure = await self._begin(request)
        if failure is not None:
            return failure
        texts = body["input"]
        if isinstance(texts, str):
            texts = [texts]
        if not texts or any(not isinstance(t, str) or not t for t in texts):
            error = {"error": {"message": "'input' must be non-empty strings", "type": "invalid"}}
            return JSONResponse(error, status_code=400)
        dimensions = body.get("dimensions") or self.embedding_dimensions
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": hashed_embedding(t, dimensions).tolist(),
            }
            for i, t in enumerate(texts)
        ]
        if self.reverse_order:
            data.reverse()
        tokens = sum(word_count(t) for t in texts)
        answer: dict[str, Any] = {"object": "list", "data": data, "model": body.get("model")}
        if self.usage != "none":
            answer["usage"] = {"prompt_tokens": tokens}
            if self.usage == "total_tokens":
                answer["usage"]["total_tokens"] = tokens
        if request.state.edit is not None:
            edited = request.state.edit(answer)
            answer = answer if edited is None else edited
            return Response(json.dumps(answer), media_type="application/json")
        if request.state.trickle:
            return trickled(json.dumps(answer).encode(), request.state.trickle)
        return JSONResponse(answer, headers=request.state.headers)

    # Chat completions: scripted answers, played in order; `chat_default` when none is left

    def say(self, text: str, *, delay: float = 0.0, **match: Any) -> None:
        """Queues a text answer; `match`: ChatReply's `when`, `after_requests`, `purpose`
        (by default the agent's own calls, "turn"; e.g. "context" or "memory"), `trickle` and
        `then`."""
        with self._lock:
            self._chat_script.append(ChatReply(text, [], delay, **match))

    def call_tools(
        self,
        *calls: tuple[str, Any],
        content: str | None = None,
        delay: float = 0.0,
        **match: Any,
    ) -> None:
        with self._lock:
            self._chat_script.append(ChatReply(content, list(calls), delay, **match))

    def chat_error(
        self,
        status: int = 500,
        *,
        times: int = 1,
        purpose: str | None = "turn",
        message: str = "scripted failure",
        delay: float = 0.0,
    ) -> None:
        """The next scripted answers are HTTP errors (queued in order with the replies), whose
        body says `message`, each after `delay` seconds."""
        with self._lock:
            self._chat_script.extend(
                ChatReply(status=status, purpose=purpose, error=message, delay=delay)
                for _ in range(times)
            )

    def answer_with(self, body: Any, **match: Any) -> None:
        """Queues a reply whose whole body is `body` (bytes as they are, else its JSON), in
        place of a completion; `match` as for `say`, and ChatReply's `status` and `headers`."""
        with self._lock:
            self._chat_script.append(ChatReply(body=body, **match))

    def chat_requests(self, purpose: str | None = None) -> list[Recorded]:
        """Chat requests, of one purpose when given."""
        return [r for r in self.requests_to(CHAT) if purpose in (None, request_purpose(r))]

    async def _chat(self, request: Request) -> Response:
        body, failure = await self._begin(request)
        if failure is not None:
            return failure
        text = json.dumps(body)
        purpose = request.headers.get(PURPOSE_HEADER)
        with self._lock:
            scripted = next(
                (
                    r
                    for r in self._chat_script
                    if (r.when is None or r.when in text) and r.purpose in (None, purpose)
                ),
                None,
            )
            if scripted is not None:
                self._chat_script.remove(scripted)
            default = self.chat_defaults.get(purpose or "") or ChatReply(self.chat_default)
            reply = scripted or default
            number = len(self.requests)
        deadline = time.monotonic() + 30  # a loaded machine can take a while to line them up
        while len(self.requests_to(CHAT)) < reply.after_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if len(self.requests_to(CHAT)) < reply.after_requests:
            self.unmet.append(
                f"{reply.when!r} answered at {len(self.requests_to(CHAT))} chat requests "
                f"of the {reply.after_requests} it waited for"
            )
        if reply.delay:
            await self._wait(request, reply.delay)
        if reply.then is not None:
            reply.then()
        if reply.body is not None:
            raw = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            return Response(
                raw,
                status_code=reply.status or 200,
                media_type="application/json",
                headers=reply.headers,
            )
        if reply.status is not None:
            error = {"error": {"message": reply.error, "type": "scripted"}}
            return JSONResponse(error, status_code=reply.status)
        answer = self._completion(body, reply, number)
        if reply.trickle:
            return trickled(answer.body, reply.trickle)
        return answer

    def _completion(self, body: Any, reply: ChatReply, number: int) -> Response:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{number}_{i}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments),
                    },
                }
                for i, (name, arguments) in enumerate(reply.tool_calls)
            ]
        message.update(reply.extra)
        prompt = sum(word_count(str(m.get("content") or "")) for m in body.get("messages", []))
        completion = word_count(reply.content or "") + 5 * len(reply.tool_calls)
        return AsciiJSONResponse(
            {
                "id": f"chatcmpl-{number}",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )

    # Lifecycle

    def start(self) -> "OpenAIServer":
        app = Starlette(routes=self._routes())
        sock = loopback_socket()
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted OpenAI server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None

    def __enter__(self) -> "OpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
