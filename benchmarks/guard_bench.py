"""What the HTTP guard costs per request, in process (CPU µs, so a busy machine barely moves it): a
typical gateway POST, a store span batch and a store GET, each through `Guard` and through the bare app.

    .venv/bin/python benchmarks/guard_bench.py
"""
import asyncio, json, time
from agentgrad.serving.guard import Guard

BODY = json.dumps({"model": "policy", "messages": [{"role": "system", "content": "You are a careful calculator. Answer with 'Answer: <number>'."}, {"role": "user", "content": "What is 37 + 45?"}], "temperature": 1.0, "max_tokens": 32}).encode()
SPANS = json.dumps({"spans": [{"name": f"s{i}", "attributes": {"a": [1, 2, 3], "b": {"c": "d"}}} for i in range(10)]}).encode()

async def app(scope, receive, send):
    m = await receive()

async def send(message): pass

def scope(method, path, body):
    headers = [(b"host", b"127.0.0.1:4780"), (b"accept", b"*/*"), (b"accept-encoding", b"gzip"), (b"connection", b"keep-alive"), (b"user-agent", b"OpenAI/Python 1.0"), (b"authorization", b"Bearer agentgrad"), (b"content-type", b"application/json")]
    if body: headers.append((b"content-length", str(len(body)).encode()))
    return {"type": "http", "method": method, "path": path, "headers": headers, "server": ("127.0.0.1", 4780)}

async def bench(target, sc, body, n=100_000):
    async def receive(): return {"type": "http.request", "body": body, "more_body": False}
    t = time.process_time()
    for _ in range(n):
        await target(sc, receive, send)
    return (time.process_time() - t) / n * 1e6

async def main():
    guard = Guard(app)
    for name, sc, body in [("gateway POST /v1/chat/completions (%d B)" % len(BODY), scope("POST", "/v1/chat/completions", BODY), BODY),
                           ("store POST /api/spans, 10 spans (%d B)" % len(SPANS), scope("POST", "/api/spans", SPANS), SPANS),
                           ("store GET /api/stats", scope("GET", "/api/stats", b""), b"")]:
        base = min([await bench(app, sc, body) for _ in range(3)])
        guarded = min([await bench(guard, sc, body) for _ in range(3)])
        print(f"{name}: {guarded - base:.2f} us per request added by the guard (app alone {base:.2f} us)")

asyncio.run(main())
